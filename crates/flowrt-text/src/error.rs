//! The one error type of this crate.

/// Everything that can go wrong building a tokenizer, encoding, decoding or rendering a chat.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// `tokenizer.ggml.model` names a tokenizer kind this crate does not build.
    #[error("unsupported tokenizer model {model:?} (tokenizer.ggml.model); supported: \"gpt2\", \"llama\", \"bert\"")]
    UnsupportedModel { model: String },

    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know. No default is
    /// substituted: a wrong split silently changes every token id.
    #[error(
        "unsupported pre-tokenizer {pre:?} (tokenizer.ggml.pre) for a gpt2 vocab; supported: {supported}"
    )]
    UnsupportedPreTokenizer { pre: String, supported: String },

    /// A metadata key the tokenizer needs is absent.
    #[error("GGUF metadata key {key} is missing: {why}")]
    MissingKey {
        key: &'static str,
        why: &'static str,
    },

    /// A metadata array has the wrong length.
    #[error("GGUF metadata {key} has {len} entries, expected {expected} (one per token)")]
    LengthMismatch {
        key: &'static str,
        len: usize,
        expected: usize,
    },

    /// A special-token id points outside the vocabulary.
    #[error("{key} = {id} is outside the vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },

    /// The GGUF reader refused a metadata value (wrong type, negative id, ...).
    #[error(transparent)]
    Gguf(#[from] flowrt_gguf::GgufError),

    /// A GGUF metadata value has the wrong type or cannot be read.
    #[error("GGUF metadata {key}: {message}")]
    Metadata { key: String, message: String },

    /// A merge rule is malformed (`"left right"` expected).
    #[error("tokenizer.ggml.merges[{index}] = {merge:?} is not two tokens separated by one space")]
    BadMerge { index: usize, merge: String },

    /// The `tokenizers` library refused the vocabulary or failed to encode.
    #[error("tokenizer {context}: {message}")]
    Tokenizers {
        context: &'static str,
        message: String,
    },

    /// A token id outside the vocabulary was given to decode.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },

    /// A file a Hugging Face tokenizer directory needs is not there.
    #[error("{} is missing: {why}", path.display())]
    HfMissingFile {
        path: std::path::PathBuf,
        why: &'static str,
    },

    /// A file of a Hugging Face tokenizer directory cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    HfRead {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A Hugging Face tokenizer file is not the JSON it should be, or `tokenizers` refused it.
    #[error("{file}: {message}")]
    HfJson { file: String, message: String },

    /// A field of a Hugging Face tokenizer file has a wrong value (wrong type, a token that is
    /// not in the vocabulary, ...).
    #[error("{file}: {field}: {message}")]
    HfField {
        file: String,
        field: String,
        message: String,
    },

    /// A `tokenizer.json` uses a feature this crate does not implement.
    #[error("{file}: {what} is not supported")]
    HfUnsupported { file: String, what: String },

    /// The model has no `tokenizer.chat_template`, and chat was requested.
    #[error("the model has no chat template (tokenizer.chat_template); pass one explicitly")]
    NoChatTemplate,

    /// The chat template does not compile.
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(minijinja::Error),

    /// Thinking was requested from a model whose template and vocabulary have no reasoning
    /// block.
    #[error("this model does not support thinking: its chat template and vocabulary have no <think> reasoning block")]
    ThinkingUnsupported,

    /// A message, tool list or template variable cannot be given to a template.
    #[error("chat template input: {what}: {message}")]
    TemplateInput { what: &'static str, message: String },

    /// Rendering failed; this includes `raise_exception(...)` called by the template and
    /// running out of fuel.
    #[error("chat template failed: {0}")]
    TemplateRender(minijinja::Error),

    /// The template wrote more than [`crate::MAX_RENDERED_BYTES`] (a runaway loop, or a
    /// conversation far larger than any context).
    #[error("chat template output is larger than {limit} bytes; rendering was stopped")]
    TemplateTooLong { limit: usize },

    /// Rendering ran longer than [`crate::RENDER_TIME_LIMIT`].
    #[error("chat template ran longer than {limit:?}; rendering was stopped")]
    TemplateTimeout { limit: std::time::Duration },

    /// The template did not compile or failed in a render worker ([`crate::sandbox`]); the
    /// message is minijinja's, as [`Self::TemplateSyntax`] and [`Self::TemplateRender`] show
    /// it in-process.
    #[error("chat template {what}: {message}")]
    TemplateFailed { what: &'static str, message: String },

    /// The template's values grew past [`crate::sandbox::MAX_RENDER_MEMORY`] in a render
    /// worker, which was stopped.
    #[error("chat template used more than {} MiB of memory; rendering was stopped", limit >> 20)]
    TemplateMemory { limit: u64 },

    /// A render worker could not be started or failed in a way that is not the template's.
    #[error("chat template renderer: {message}")]
    TemplateWorker { message: String },
}

impl TextError {
    pub(crate) fn tokenizers(context: &'static str, err: impl std::fmt::Display) -> Self {
        Self::Tokenizers {
            context,
            message: err.to_string(),
        }
    }
}
