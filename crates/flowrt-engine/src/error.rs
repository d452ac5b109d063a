use std::path::PathBuf;

/// What can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] flowrt_gguf::GgufError),
    #[error(transparent)]
    Model(#[from] flowrt_model::ModelError),
    #[error(transparent)]
    Backend(#[from] flowrt_backends::OpenError),
    #[error(transparent)]
    Text(#[from] flowrt_text::TextError),
    #[error(transparent)]
    Dispatch(#[from] Box<flowrt_dispatch::DispatchError>),
    #[error(transparent)]
    Constraint(#[from] crate::constraint::ConstraintError),
    #[error(transparent)]
    Sample(#[from] flowrt_sample::SampleError),
    #[error("the prompt has {prompt_tokens} tokens, which with {reserve} to generate does not fit the context of {n_ctx} tokens (use a shorter prompt or a larger --ctx-len, at most the model's {model_ctx})")]
    PromptTooLong {
        prompt_tokens: usize,
        reserve: usize,
        n_ctx: usize,
        model_ctx: usize,
    },
    #[error(
        "context length {requested} is invalid: it must be between 1 and the model's {model_ctx}"
    )]
    BadContextLength { requested: usize, model_ctx: usize },
    #[error("{0}: the model has no chat template (tokenizer.chat_template); use --raw for plain completion")]
    NoChatTemplate(PathBuf),
    #[error("reference file {path}: {reason}")]
    Reference { path: PathBuf, reason: String },
    #[error("{0}: the model only embeds (its family has no output projection); use `flowrt embed` or the server's embedding routes")]
    EmbeddingOnly(PathBuf),
    #[error("{0}: the model declares no pooling (no sentence-transformers modules.json, no GGUF pooling_type), so flowrt will not guess how to embed with it; name one (`--pooling mean|cls|last`)")]
    NoPooling(PathBuf),
    #[error("input {index}: {reason}")]
    BadInput { index: usize, reason: String },
    #[error("input {index} has {tokens} tokens, more than the {max} the model embeds (shorten it, or truncate explicitly)")]
    InputTooLong {
        index: usize,
        tokens: usize,
        max: usize,
    },
    #[error("{0}")]
    Invalid(String),
}
