//! The CPU backend: executes the decoder's command groups ([`flowrt_model::Plan`]) with the
//! run-time-selected kernels of `flowrt-kernels`, on a persistent thread pool.

mod exec;
mod kv;
mod packed;
mod pool;
mod rope;

pub use exec::{
    ActQuant, AttnSplit, BackendError, Batch, CpuBackend, CpuOptions, LogitsWanted, SeqSpan,
};
pub use kv::{KvCache, KvType};
pub use pool::ThreadPool;

/// Physical cores of this machine (the default thread count).
pub fn physical_cores() -> usize {
    num_cpus::get_physical().max(1)
}
