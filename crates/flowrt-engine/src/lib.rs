//! Running models: load a model file, hold a session (KV cache and position), prefill and
//! decode, step many sequences through one batched pass ([`BatchStepper`], the batching
//! policy the server and `bench --parallel` share), generate text with sampling and stops
//! (optionally constrained to a JSON Schema), verify logits against a reference, and
//! benchmark.

mod bandwidth;
mod bench;
mod calibrate;
mod compare;
mod constraint;
mod diff;
mod embed;
mod error;
mod generate;
mod generation;
pub mod lint;
mod load;
mod proc_mem;
mod session;
mod step;
pub mod tools;
mod verify;

pub use bandwidth::{measure_read_bandwidth, BandwidthOptions, BandwidthReport};
pub use bench::{
    bench, bench_parallel, weight_bytes, BackendReport, BenchOptions, BenchReport, ParallelReport,
    Roofline, Stat,
};
pub use calibrate::{input_stats, LayerByLayer};
pub use compare::{builtin_prompts, compare_models, BUILTIN_CHAT, BUILTIN_TEXTS};
pub use constraint::{Constraint, ConstraintError, ConstraintSpec, Guide};
pub use diff::{diff, DiffOptions, DiffPrompt, DiffReport, LayerDiff, DEFAULT_DIFF_THRESHOLD};
pub use embed::{l2_normalize, EmbedOptions, Embedder, Embeddings};
pub use error::EngineError;
pub use flowrt_backends::{BackendKind, OpenError};
pub use flowrt_dispatch::{InputStat, InputStatKind, KvPrecision};
pub use flowrt_model::{EmbeddingSpec, Pooling};
pub use flowrt_model::{LoadOptions, LOAD_QUANT_TYPES};
pub use generate::{generate, FinishReason, GenerateOptions, GenerationStats};
pub use generation::{Generation, GenerationSettings, Step};
pub use load::{EngineOptions, LoadedModel};
pub use proc_mem::{available_memory_bytes, parse_proc_status, ProcMemory};
pub use session::{BatchSession, Session};
pub use step::{BatchStepper, Fed, OnFed, SlotWork, StepEngine};
pub use tools::{
    check_tools, tool_call_constraint, tool_call_constraint_with, ToolChoice, ToolDef,
    ToolGrammarError, ToolMarkers,
};
pub use verify::{verify, PromptReport, VerifyReport};
