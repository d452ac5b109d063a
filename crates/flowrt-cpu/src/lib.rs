//! The CPU backend: executes the decoder's command groups ([`flowrt_model::Plan`]) with the
//! run-time-selected kernels of `flowrt-kernels`, on a persistent thread pool.

mod act;
mod exec;
mod kv;
mod moe;
mod ops;
mod packed;
mod pool;
mod rope;

pub use exec::{
    ActQuant, AttnSplit, BackendError, Batch, CpuBackend, CpuOptions, LogitsWanted, SeqSpan,
    CPU_OPTIONS,
};
pub use kv::{KvCache, KvType};
pub use pool::ThreadPool;

/// Physical cores of this machine (the default thread count).
pub fn physical_cores() -> usize {
    num_cpus::get_physical().max(1)
}

/// The CPU's model name (`/proc/cpuinfo`'s `model name` on Linux), else the architecture.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
