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
    #[error("{0}")]
    Invalid(String),
}
