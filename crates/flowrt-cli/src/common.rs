//! What the commands share: model resolution and engine options.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use flowrt_dispatch::DispatchOptions;
use flowrt_dtype::GgmlType;
use flowrt_engine::{BackendKind, EngineOptions, KvPrecision, LoadOptions, LoadedModel, Session};
use flowrt_store::FetchPolicy;

/// Options of the engine, shared by every command that runs a model.
///
/// Options marked [cpu] are the CPU backend's own settings: they reach the backend as
/// `name=value` options, and another backend refuses them with an error naming the setting.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Backend that runs the model: cpu, vulkan or auto (auto picks Vulkan when the machine
    /// has a real GPU, discrete or integrated, else the CPU; see `flowrt devices`). The
    /// default is cpu for now.
    #[arg(long, default_value = "cpu")]
    pub backend: BackendKind,
    /// Which device of the backend to use, as `flowrt devices` numbers them (default: the
    /// backend's choice; the CPU is device 0).
    #[arg(long)]
    pub device: Option<usize>,
    /// Threads to use (default: the backend's; for the CPU, physical cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context length in tokens (default: the model's).
    #[arg(long = "ctx-len", short = 'c')]
    pub ctx_len: Option<usize>,
    /// KV cache element type: f16 or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvPrecision,
    /// Most tokens per prefill batch.
    #[arg(long = "batch-size", short = 'b', default_value_t = 256)]
    pub batch_size: usize,
    /// [cpu] Kernels to use: scalar, avx2, avx512, avx512vnni, neon (default: best available;
    /// also FLOWRT_KERNELS). The CPU backend's `kernels` setting.
    #[arg(long)]
    pub kernels: Option<String>,
    /// [cpu] Activation quantisation for quantised weights: q16 (the default; matches f32
    /// reference math to rounding noise), q8x (8-bit activations on the repacked Q4_0, Q4_1,
    /// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4 weights, Q16 for the rest: faster prefill at
    /// about llama.cpp's precision, x86 only (elsewhere q16); batches run 512-bit kernels where the CPU has
    /// AVX-512, single tokens the AVX2 ones) or q8 (ggml's 8-bit activation types on the
    /// file's row layout, for comparisons). The CPU backend's `act-quant` setting.
    #[arg(long = "act-quant")]
    pub act_quant: Option<String>,
    /// [cpu] Keep weights in the file's row layout instead of repacking them at load into the
    /// kernels' interleaved x8 layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; for A/B
    /// comparisons). The CPU backend's `repack=false`.
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// [cpu] Keep attention to one task per (token, KV head) instead of splitting long key
    /// ranges over threads when there are too few of them (for A/B comparisons). The CPU
    /// backend's `attn-split=off`.
    #[arg(long = "no-attn-split")]
    pub no_attn_split: bool,
    /// Quantise a Hugging Face checkpoint's float weights on load: q4_0, q4_1 or q8_0
    /// (GGUF files run with the types they hold).
    #[arg(long, value_parser = parse_quant)]
    pub quant: Option<GgmlType>,
    /// Most decoder layers per runlist submitted to the device (default: the backend's; the
    /// CPU takes the whole model at once).
    #[arg(long = "max-runlist-layers")]
    pub max_runlist_layers: Option<usize>,
    /// Deadline of every runlist in milliseconds (default: derived from its cost).
    #[arg(long = "runlist-deadline-ms")]
    pub runlist_deadline_ms: Option<u64>,
    /// Do not retry a failed step at smaller runlist depth.
    #[arg(long = "no-runlist-retry")]
    pub no_runlist_retry: bool,
    /// Write a Chrome trace (Perfetto) of every runlist and op to this JSON file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Never fetch a catalog model that is not in the store.
    #[arg(long = "no-fetch")]
    pub no_fetch: bool,
}

impl EngineArgs {
    pub fn options(&self) -> Result<EngineOptions> {
        if self.threads == Some(0) {
            anyhow::bail!("--threads must be at least 1");
        }
        if self.max_runlist_layers == Some(0) {
            anyhow::bail!("--max-runlist-layers must be at least 1");
        }
        if self.runlist_deadline_ms == Some(0) {
            anyhow::bail!("--runlist-deadline-ms must be at least 1");
        }
        if self.batch_size == 0 {
            anyhow::bail!("--batch-size must be at least 1");
        }
        Ok(EngineOptions {
            threads: self.threads.unwrap_or(0),
            n_ctx: self.ctx_len,
            kv: self.kv_type,
            max_batch: self.batch_size,
            backend: self.backend,
            device: self.device,
            backend_options: self.backend_options(),
            dispatch: DispatchOptions {
                max_runlist_layers: self.max_runlist_layers,
                deadline: self.runlist_deadline_ms.map(Duration::from_millis),
                retry: !self.no_runlist_retry,
                ..DispatchOptions::default()
            },
            trace: self.trace.is_some(),
        })
    }

    /// The backend-specific flags given, as the backend's `name=value` settings (a flag not
    /// given adds nothing, so the backend's default holds and another backend is not handed
    /// a setting nobody asked for).
    pub fn backend_options(&self) -> Vec<(String, String)> {
        let mut o = Vec::new();
        let mut set = |name: &str, value: &str| o.push((name.to_string(), value.to_string()));
        if let Some(k) = &self.kernels {
            set("kernels", k);
        }
        if let Some(a) = &self.act_quant {
            set("act-quant", a);
        }
        if self.no_repack {
            set("repack", "false");
        }
        if self.no_attn_split {
            set("attn-split", "off");
        }
        o
    }

    /// Write the session's trace to `--trace FILE`, if asked for.
    pub fn write_trace(&self, session: &Session) -> Result<()> {
        self.write_trace_of(session.trace())
    }

    /// Write `trace` to `--trace FILE`, if asked for.
    pub fn write_trace_of(&self, trace: Option<&flowrt_dispatch::Trace>) -> Result<()> {
        if let (Some(path), Some(trace)) = (&self.trace, trace) {
            trace
                .write(path)
                .with_context(|| format!("writing trace {}", path.display()))?;
            eprintln!(
                "trace: {} events to {}{}",
                trace.len(),
                path.display(),
                match trace.dropped() {
                    0 => String::new(),
                    d => format!(" ({d} dropped past the cap)"),
                }
            );
        }
        Ok(())
    }
}

fn parse_quant(s: &str) -> Result<GgmlType, String> {
    flowrt_engine::LOAD_QUANT_TYPES
        .iter()
        .copied()
        .find(|t| t.name() == s)
        .ok_or_else(|| format!("cannot quantise to `{s}` on load (use q4_0, q4_1 or q8_0)"))
}

/// What identifies a model's bytes, and their size: see [`flowrt_store::model_fingerprint`].
pub fn model_fingerprint(path: &std::path::Path) -> Result<(String, u64)> {
    Ok(flowrt_store::model_fingerprint(path)?)
}

/// Resolve MODEL (a path or a catalog tag) to a file, fetching a catalog model when allowed.
pub fn resolve_model(arg: &str, no_fetch: bool) -> Result<PathBuf> {
    let policy = if no_fetch {
        FetchPolicy::Never
    } else {
        FetchPolicy::IfMissing
    };
    let path = flowrt_store::resolve(arg, policy, &mut |msg: &str| eprintln!("{msg}"))?;
    Ok(path)
}

/// Load MODEL for running.
pub fn load_model(arg: &str, engine: &EngineArgs) -> Result<(LoadedModel, EngineOptions)> {
    let opts = engine.options()?;
    let path = resolve_model(arg, engine.no_fetch)?;
    let load = LoadOptions {
        quant: engine.quant,
    };
    let model = LoadedModel::load_with(&path, &load)
        .with_context(|| format!("loading {}", path.display()))?;
    Ok((model, opts))
}

/// A closed stdout (e.g. `flowrt run ... | head`) ends the program quietly.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
