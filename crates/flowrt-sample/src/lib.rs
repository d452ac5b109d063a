//! Token sampling and stop-string matching for flowrt.
//!
//! - [`Sampler`] turns one step's logits into a token id: repetition / presence /
//!   frequency penalties from its own history, then greedy argmax (temperature 0) or
//!   top-k → temperature → softmax → top-p → min-p → a draw from a seeded ChaCha RNG.
//!   It allocates its buffers once, in [`Sampler::new`]; [`Sampler::sample`] and
//!   [`Sampler::accept`] do not touch the heap.
//! - [`StopMatcher`] watches streamed text for stop strings and holds back any tail that
//!   could still turn into one, so a partial stop string is never printed.

mod config;
mod sampler;
mod stop;

pub use config::{SampleError, SamplerConfig};
pub use sampler::Sampler;
pub use stop::{StopMatcher, StopResult};
