//! flowrt's fuzz targets, shared by two fuzzers:
//!
//! - the libFuzzer binaries in `fuzz/` (nightly, cargo-fuzz, coverage-guided; `scripts/fuzz`),
//!   each of whose `fuzz_target!` calls one function here;
//! - [`fuzzer`], a small coverage-blind mutation fuzzer on stable that CI runs for a few
//!   seconds per target (`tests/ci_fuzz.rs`; see docs/fuzzing.md, "In CI").
//!
//! Also here: the input splitting ([`split_parts`], [`join_parts`], [`SEP`]: one input carries
//! several files) and the seed corpora made from the repository's fixtures ([`seeds`], which
//! `fuzz/seedgen` writes to files). With the default feature `targets` off, the crate is only
//! those two (no model, text or server crates), which is all `fuzz/seedgen` needs.

mod parts;
pub mod seeds;

pub use parts::{join_parts, split_parts, SEP};

#[cfg(feature = "targets")]
pub mod fuzzer;
#[cfg(feature = "targets")]
mod scratch;
#[cfg(feature = "targets")]
mod targets;

#[cfg(feature = "targets")]
pub use scratch::{clear_dir, scratch_dir};
#[cfg(feature = "targets")]
pub use targets::{chat_template, gguf_model, hf_dir, http_body, tokenizer};
