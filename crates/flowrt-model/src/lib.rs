//! What a model *is*, independent of where it runs.
//!
//! - [`arch`]: architecture families as rows of data ([`ArchSpec`]); the decoder branches on
//!   fields, never on a family's name.
//! - [`config`]: hyperparameters read from a GGUF file or an HF `config.json` ([`ModelConfig`]).
//! - [`rope`]: RoPE frequencies and scalings.
//! - [`safetensors_dir`]: the tensors of an HF checkpoint directory.
//! - [`names`]: tensor roles and their names in each format.
//! - [`weights`]: the model's tensors bound to roles, checked against the config.
//! - [`plan`]: the forward pass as a sequence of per-layer command groups that a backend executes.
//! - [`pooling`]: how an embedding model pools a sequence, as its files declare it.

pub mod arch;
pub mod config;
pub mod error;
pub mod names;
pub mod plan;
pub mod pooling;
pub mod rope;
pub mod safetensors_dir;
pub mod weights;

pub use arch::{Activation, ArchSpec, HfExperts, RopePairing, Router, RouterScoring};
pub use config::{LayerType, ModelConfig, MoeConfig, ShortConvConfig};
pub use error::ModelError;
pub use names::TensorRole;
pub use plan::{Buf, CommandGroup, GroupKind, MatRole, NormWeight, Op, Plan};
pub use pooling::{EmbeddingSpec, Pooling};
pub use rope::{RopeConfig, RopeFreqs, RopeScaling};
pub use weights::{
    LayerWeights, LoadOptions, Model, ModelFormat, MoeWeights, Mxfp4Rows, ShortConvWeights,
    WeightData, WeightMatrix, LOAD_QUANT_TYPES,
};
