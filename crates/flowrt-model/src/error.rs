use std::path::PathBuf;

/// Why a model could not be understood or bound.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] flowrt_gguf::GgufError),

    #[error("{file}: unknown architecture `{arch}` (flowrt knows: {known}); refusing to run it under another family's rules")]
    UnknownArchitecture {
        file: PathBuf,
        arch: String,
        known: String,
    },

    #[error("{path}: {reason}")]
    BadCheckpoint { path: PathBuf, reason: String },

    #[error("{file}: missing metadata key `{key}`")]
    MissingKey { file: PathBuf, key: String },

    #[error("{file}: inconsistent config: {reason}")]
    BadConfig { file: PathBuf, reason: String },

    #[error("{file}: {} tensor problem(s):\n  {}", problems.len(), problems.join("\n  "))]
    Tensors {
        file: PathBuf,
        problems: Vec<String>,
    },

    #[error("{file}: tensor `{tensor}` has type {ty}, which flowrt cannot compute with yet")]
    UnsupportedType {
        file: PathBuf,
        tensor: String,
        ty: flowrt_dtype::GgmlType,
    },
}
