//! `flowrt pack`: write a model as a GGUF file of a chosen type, then gate it against its
//! source (teacher-forced KL and top-1 on a built-in prompt set).
//!
//! The file is written by [`flowrt_gguf::write::StreamWriter`] one tensor at a time (each
//! source row dequantised to f32 and requantised), as `OUT.partial`, renamed to OUT when
//! complete; on any error, or when the gate refuses, nothing is left at OUT.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use flowrt_dtype::GgmlType;
use flowrt_engine::{EngineOptions, InputStatKind, KvPrecision, LoadedModel, ProcMemory, Session};
use flowrt_gguf::write::{partial_path, StreamWriter, TensorSpec};
use flowrt_gguf::{GgufFile, Value};
use flowrt_kernels::{gptq, Kernels};
use flowrt_model::plan::MatRole;

#[path = "pack_hf.rs"]
mod hf;

const MIX_HELP: &str = "\
Per-tensor mix: 1-D tensors (norms, biases) stay F32. F32, F16, BF16, Q8_0: every matrix in \
TYPE. Q4_0, Q4_1: token_embd and output Q8_0, the rest TYPE. Q4_K (Q4_K_M-like): token_embd, \
output, attn_v and ffn_down Q6_K, the rest Q4_K. Q5_K (Q5_K_M-like): the same in Q6_K, the \
rest Q5_K. Q6_K: every matrix Q6_K. MXFP4_MOE (llama-quantize's name): the experts \
(ffn_{gate,up,down}_exps) MXFP4, every other matrix Q8_0. In every type the MoE routers \
(ffn_gate_inp), expert bias tables and LFM2's convolution taps stay F32, as llama.cpp's \
converter and llama-quantize keep them; experts are 3-D tensors, quantised row by row, one \
matrix per expert. A matrix whose row length is not a multiple of its \
type's block (32, or 256 for K types) falls back to Q8_0 (rows a multiple of 32) or F16, \
and the report lists it.

Quantisers: Q4_K, Q5_K and Q6_K blocks are chosen by an error-minimising search over their \
scales (weighted least squares; no importance matrix), with less RMS error than llama.cpp's \
llama-quantize on the weights measured in docs/quantisation.md. Q4_0 and Q4_1 blocks search \
their scale (and offset) for the least squared error, each value weighted by the mean square \
of the activation column it multiplies (an importance matrix: pack first runs the source \
over the gate's prompts, and --prompts adds to them), and keep ggml's reference bytes where \
those do better; the token embedding, the experts and anything else without measured \
activations get the unweighted search; --no-importance skips the run and weighs every value \
the same. --gptq (Q4_0, Q4_1) also measures each input's second-moment matrix and quantises \
each row a column at a time, spreading its rounding errors over the columns still to come \
(error feedback, the GPTQ method): closer to the source on text like the calibration \
prompts, slower, 4 n^2 bytes held per distinct input of n columns (docs/quantisation.md); \
its gate runs on built-in held-out prompts instead of the calibration ones, and it needs at \
least as many calibration tokens as the widest matrix input has columns (add text with \
--prompts FILE) and refuses when those bytes exceed 80 % of the available memory. \
--gptq --sequential takes each matrix's second moments through the matrices already \
quantised instead, layer by layer (GPTQ's sequential calibration): one layer's second \
moments held at a time instead of every layer's, about three times the calibration runs \
(docs/quantisation.md). --asymmetric [ALPHA] (with --gptq --sequential) also runs the \
source's own path beside the pack's and quantises each matrix towards the source's outputs \
from the pack's inputs (GPTAQ's asymmetric target, moved ALPHA of the way, 0.25 when not \
given), which corrects part of the error the layers before it made (docs/quantisation.md). \
Q8_0 rounds as ggml's reference does. MXFP4 \
per 32 values: the shared E8M0 exponent floor(log2(amax)) - 2 + 127, each value the nearest \
E2M1 code (ggml's and gguf-py's rule).

Gate defaults (mean KL(source ‖ pack) at most / top-1 agreement at least): \
F32 1e-6/0.99, F16 1e-3/0.95, BF16 1e-2/0.90, Q8_0 1e-2/0.90, Q6_K 2e-2/0.85, \
Q5_K 5e-2/0.80, Q4_K 0.1/0.75, Q4_1 0.2/0.70, Q4_0 0.2/0.70, MXFP4_MOE 0.2/0.70.

Sources: a GGUF file (requantised; metadata, tokenizer and chat template copied), or a \
Hugging Face checkpoint directory of any family flowrt runs (llama, mistral, qwen2, qwen3, \
gemma3, minicpm, granite, smollm3, phi3, qwen3moe, lfm2, gpt-oss; f32, f16 or bf16 \
safetensors, or gpt-oss's experts in OpenAI's MXFP4 blocks and scales, which MXFP4_MOE copies \
bit-exactly and the other types dequantise; byte-level BPE tokenizer.json), written as llama.cpp's converter writes the \
family: GGUF arch llama (also for Mistral), qwen2, qwen3, gemma3, minicpm, granite, smollm3, \
phi3, qwen3moe (expert_count, expert_used_count, expert_feed_forward_length, \
expert_weights_norm; HF's dense layers as flowrt's mlp_only_layers), lfm2 (per-layer \
attention.head_count_kv, shortconv.l_cache, shortconv.* tensors) or gpt-oss (attn_sinks, \
biases, HF's fused gate_up experts split into ffn_gate_exps and ffn_up_exps); its \
hyperparameter keys and tensor names; attn_q / attn_k rows permuted \
per head for llama and minicpm; Gemma norms stored as 1 + w; Llama 3 RoPE as \
rope_freqs.weight, LongRoPE as rope_factors_long/short.weight; gpt2 tokenizer metadata and \
chat template. Values llama.cpp's converter drops are written under llama.cpp's key names \
(a Mistral window as llama.attention.sliding_window, Gemma 3's layer pattern as \
attention.sliding_window_pattern, query_pre_attn_scalar as attention.scale; flowrt's own \
mlp_only_layers, swiglu_alpha / swiglu_limit and rope.scaling.yarn_truncate where llama.cpp \
has no key), so flowrt runs the file as the same model; where llama.cpp's loader would not \
honour one (it has no window for llama; its gemma3 fixes every 6th layer global, the local \
RoPE base at 10000, the scale at 1/sqrt(head_dim) (1/sqrt(hidden/heads) at 62 layers, the \
27B) and drops soft-capping with a window; its gemma2 fixes every other layer sliding and \
the scale the same way (at 46 layers); it \
picks LongRoPE factors by its context size; its qwen3moe wants experts in every layer; its \
gpt-oss fixes SwiGLU's alpha and limit and always truncates YaRN) the report says so in a `llama.cpp:` line. The gate runs the source as stored \
(an HF directory at its own precision).";

#[derive(Args, Debug)]
#[command(after_long_help = MIX_HELP)]
pub struct PackArgs {
    /// The source: a GGUF file to requantise, or a Hugging Face checkpoint directory.
    pub source: PathBuf,
    /// The GGUF file to write.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Output type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, MXFP4_MOE (see the mix below,
    /// `--help`).
    #[arg(long)]
    pub quant: String,
    /// Refuse the pack when the mean KL(source ‖ pack) exceeds this (default: per type).
    #[arg(long = "max-mean-kl")]
    pub max_mean_kl: Option<f64>,
    /// Refuse the pack when top-1 agreement (0..1) is below this (default: per type).
    #[arg(long = "min-top1")]
    pub min_top1: Option<f64>,
    /// Skip the gate (the report says so).
    #[arg(long = "no-gate")]
    pub no_gate: bool,
    /// More gate prompts: a text file, one prompt per line.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Gate against this model instead of SRC: the checkpoint a modified (shimmed, relabelled,
    /// merged) source was made from, so the gate answers "is the pack the model I started
    /// from". It must have the same tokenizer.
    #[arg(long, value_name = "MODEL")]
    pub against: Option<PathBuf>,
    /// `tokenizer.ggml.pre` to write for an HF source (default: recognised from
    /// tokenizer.json's pre-tokenizer: gpt-2 or smollm).
    #[arg(long)]
    pub pre: Option<String>,
    /// Threads for the gate's two models (default: physical cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Q4_0 and Q4_1: search each block's scale for the plain squared error instead of
    /// weighing each value by the mean square of the activation column it multiplies (measured
    /// by running the source over the gate's prompts first).
    #[arg(long = "no-importance")]
    pub no_importance: bool,
    /// Q4_0 and Q4_1: quantise each dense matrix with error feedback (the GPTQ method): the
    /// source run also measures each matrix input's second-moment matrix, and each row is
    /// quantised a column at a time, its rounding errors spread over the columns not yet
    /// quantised so that the matrix's output moves least. Costs memory for those matrices
    /// (4·n² bytes per distinct input of n columns, every layer's, held until the pack is
    /// written) and time (about n²/2 multiply-adds per row). Same file format.
    #[arg(long, conflicts_with = "no_importance")]
    pub gptq: bool,
    /// With --gptq: take each matrix's second moments through the matrices already
    /// quantised (GPTQ's sequential calibration): the calibration runs layer by layer, each
    /// block over the residual stream the quantised layers before it made, Q/K/V before the
    /// attention output and gate/up before down. Holds one layer's second moments at a time
    /// and the residual stream of every calibration position (4·hidden bytes each).
    #[arg(long, requires = "gptq")]
    pub sequential: bool,
    /// With --gptq --sequential: quantise each matrix towards what the source computes
    /// rather than towards its own weights on the quantised path's inputs (the asymmetric
    /// target of GPTAQ): the least-squares matrix for the source's outputs from the pack's
    /// inputs, moved ALPHA (0 < ALPHA ≤ 1) of the way from the source's. The calibration
    /// also runs the source's own path and keeps both paths' inputs of one layer
    /// (4·n bytes a position and input each). ALPHA defaults to 0.25.
    #[arg(
        long,
        requires = "sequential",
        value_name = "ALPHA",
        num_args = 0..=1,
        default_missing_value = "0.25"
    )]
    pub asymmetric: Option<f32>,
}

/// The types `--quant` takes, with the gate's default (max mean KL, min top-1).
const QUANTS: [(&str, GgmlType, f64, f64); 10] = [
    ("F32", GgmlType::F32, 1e-6, 0.99),
    ("F16", GgmlType::F16, 1e-3, 0.95),
    ("BF16", GgmlType::BF16, 1e-2, 0.90),
    ("Q8_0", GgmlType::Q8_0, 1e-2, 0.90),
    ("Q6_K", GgmlType::Q6K, 2e-2, 0.85),
    ("Q5_K", GgmlType::Q5K, 5e-2, 0.80),
    ("Q4_K", GgmlType::Q4K, 0.1, 0.75),
    ("Q4_1", GgmlType::Q4_1, 0.2, 0.70),
    ("Q4_0", GgmlType::Q4_0, 0.2, 0.70),
    ("MXFP4_MOE", GgmlType::Mxfp4, 0.2, 0.70),
];

fn parse_quant(s: &str) -> Result<(GgmlType, f64, f64)> {
    let up = s.to_ascii_uppercase();
    let up = up.strip_suffix("_M").unwrap_or(&up);
    QUANTS
        .iter()
        .find(|q| q.0 == up)
        .map(|q| (q.1, q.2, q.3))
        .with_context(|| {
            let names: Vec<_> = QUANTS.iter().map(|q| q.0).collect();
            format!("--quant {s}: not a type pack writes ({})", names.join(", "))
        })
}

/// The type `quant`'s mix gives tensor `name` of shape `dims`, and whether it is a fallback
/// (the row length does not fit the chosen type's block).
pub fn target_type(quant: GgmlType, name: &str, dims: &[u64]) -> (GgmlType, bool) {
    use GgmlType::*;
    // Vectors and tables of biases, the routers (kept F32 as llama.cpp's converter and
    // llama-quantize keep `ffn_gate_inp`) and the convolution taps (f32 in llama.cpp's lfm2).
    if dims.len() <= 1
        || name.ends_with(".bias")
        || name.ends_with("ffn_gate_inp.weight")
        || name.ends_with("shortconv.conv.weight")
    {
        return (F32, false);
    }
    let base = name.rsplit('.').nth(1).unwrap_or("");
    let embd_or_out = matches!(name, "token_embd.weight" | "output.weight");
    let wanted = match quant {
        // MXFP4_MOE: the experts MXFP4, every other matrix Q8_0.
        Mxfp4 if base.ends_with("_exps") => Mxfp4,
        Mxfp4 => Q8_0,
        Q4_0 | Q4_1 if embd_or_out => Q8_0,
        Q4K | Q5K if embd_or_out || base == "attn_v" || base == "ffn_down" => Q6K,
        q => q,
    };
    if dims[0].is_multiple_of(wanted.block_size()) {
        (wanted, false)
    } else if dims[0].is_multiple_of(32) && wanted != Q8_0 {
        (Q8_0, true)
    } else {
        (F16, true)
    }
}

pub fn pack(args: PackArgs) -> Result<ExitCode> {
    let (quant, default_kl, default_top1) = parse_quant(&args.quant)?;
    let max_kl = args.max_mean_kl.unwrap_or(default_kl);
    let min_top1 = args.min_top1.unwrap_or(default_top1);
    anyhow::ensure!(
        max_kl.is_finite() && max_kl >= 0.0,
        "--max-mean-kl must be a non-negative number"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&min_top1),
        "--min-top1 is a fraction between 0 and 1"
    );
    let extra: Vec<String> = match &args.prompts {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read --prompts {}", p.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        None => Vec::new(),
    };
    anyhow::ensure!(
        args.output != args.source,
        "the output must not be the source"
    );
    anyhow::ensure!(
        !args.gptq || uses_importance(quant),
        "--gptq applies to Q4_0 and Q4_1 (not {quant})"
    );
    let done = Arc::new(AtomicBool::new(false));
    remove_on_interrupt(
        vec![partial_path(&args.output), args.output.clone()],
        done.clone(),
    );
    let t0 = Instant::now();
    let threads = match args.threads {
        Some(t) if t > 0 => t,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut calibration: Box<dyn Calibration> = if args.sequential {
        let seq = Sequential::new(&args, &extra, threads)?;
        println!(
            "calibration: layer by layer over {} tokens of the gate's prompts through the \
             matrices as quantised (--gptq --sequential)",
            seq.driver.tokens()
        );
        Box::new(seq)
    } else if uses_importance(quant) && !args.no_importance {
        let imp = importance(&args, &extra)?;
        let grams: HashSet<*const Vec<f32>> = imp
            .values()
            .filter_map(|v| v.gram.as_ref().map(Arc::as_ptr))
            .collect();
        println!(
            "importance: {} matrices, from {} tokens of the gate's prompts through the source{} ({:.1}s)",
            imp.len(),
            imp.values().map(|v| v.rows).max().unwrap_or(0),
            if args.gptq {
                format!(", with the second moments of {} inputs (--gptq)", grams.len())
            } else {
                String::new()
            },
            t0.elapsed().as_secs_f64()
        );
        if args.gptq {
            let tokens = imp.values().map(|v| v.rows).max().unwrap_or(0);
            let widest = imp
                .values()
                .filter_map(|v| v.gram.as_ref())
                .map(|g| g.len().isqrt())
                .max()
                .unwrap_or(0);
            check_gptq_tokens(tokens, widest)?;
        }
        Box::new(imp)
    } else {
        Box::new(Importance::default())
    };
    // What llama.cpp would run differently from the model written (HF sources).
    let mut llama_cpp_caveats = Vec::new();
    let fallbacks = if args.source.is_dir() {
        let hf = hf::HfSource::open(&args.source, args.pre.as_deref())?;
        let (meta, tensors) = hf.plan()?;
        llama_cpp_caveats = hf.llama_cpp_caveats();
        write_pack(
            &tensors,
            meta,
            quant,
            &args.output,
            calibration.as_mut(),
            threads,
            &|t: &SrcTensor<'_>| t.slices().into_iter().for_each(|s| hf.release(s)),
        )?
    } else {
        anyhow::ensure!(
            args.source.exists(),
            "cannot open source {}: no such file or directory",
            args.source.display()
        );
        let src = GgufFile::open(&args.source)
            .with_context(|| format!("cannot open source {}", args.source.display()))?;
        let tensors: Vec<SrcTensor<'_>> = src
            .tensors()
            .iter()
            .map(|t| SrcTensor {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: Ok(t.ggml_type),
                data: src.tensor_data(t),
                permute_heads: None,
                file_offset: (src.data_offset() + t.offset) as usize,
                layout: Layout::Rows,
            })
            .collect();
        let meta = src.metadata().to_vec();
        write_pack(
            &tensors,
            meta,
            quant,
            &args.output,
            calibration.as_mut(),
            threads,
            &|t: &SrcTensor<'_>| src.release(t.file_offset, t.data.len()),
        )?
    };
    let secs = t0.elapsed().as_secs_f64();
    let size = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "packed:    {} -> {} ({}, {:.1} MiB, {:.1}s)",
        args.source.display(),
        args.output.display(),
        quant,
        size as f64 / (1 << 20) as f64,
        secs
    );
    for (name, ty) in &fallbacks {
        println!("fallback:  {name}: row length does not fit the block, written as {ty}");
    }
    for c in &llama_cpp_caveats {
        println!("llama.cpp: would not run this model as written: {c}");
    }
    if let Some(peak) = ProcMemory::now().peak_rss_bytes {
        println!("peak RSS:  {:.1} MiB", peak as f64 / (1 << 20) as f64);
    }
    if args.no_gate {
        done.store(true, Ordering::SeqCst);
        println!("gate:      skipped (--no-gate)");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(a) = &args.against {
        println!(
            "gate:      against {} (--against), not the source",
            a.display()
        );
    }
    if args.gptq {
        println!(
            "gate:      on {} held-out prompts, not the ones --gptq calibrated on",
            heldout_prompts().count()
        );
    }
    let result = gate(&args, &extra);
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&args.output);
            return Err(e.context("the gate could not run; the output was removed"));
        }
    };
    println!(
        "gate:      {} positions, top-1 {:.2}%, mean KL {:.3e}, max KL {:.3e} (bounds: mean KL <= {:.1e}, top-1 >= {:.2}%)",
        report.positions,
        report.top1_agreement * 100.0,
        report.mean_kl,
        report.max_kl,
        max_kl,
        min_top1 * 100.0
    );
    let mut failures = Vec::new();
    if report.mean_kl.is_nan() || report.mean_kl > max_kl {
        failures.push(format!(
            "mean KL {:.3e} exceeds {max_kl:.3e}",
            report.mean_kl
        ));
    }
    if report.top1_agreement.is_nan() || report.top1_agreement < min_top1 {
        failures.push(format!(
            "top-1 agreement {:.4} is below {min_top1:.4}",
            report.top1_agreement
        ));
    }
    if failures.is_empty() {
        done.store(true, Ordering::SeqCst);
        println!("gate:      passed");
        Ok(ExitCode::SUCCESS)
    } else {
        let _ = std::fs::remove_file(&args.output);
        for f in &failures {
            eprintln!("pack refused: {f}");
        }
        eprintln!("pack refused: {} removed", args.output.display());
        Ok(ExitCode::from(1))
    }
}

/// On Ctrl-C before the pack is done (written and gated), removes `paths` (the partial file,
/// the output) and exits with 130.
fn remove_on_interrupt(paths: Vec<PathBuf>, done: Arc<AtomicBool>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            let _ = tx.send(());
            return;
        };
        // The exit status of a shell's process killed by the signal: 128 + SIGINT or SIGTERM.
        let code = rt.block_on(async {
            let signal = tokio::signal::ctrl_c();
            tokio::pin!(signal);
            // SIGTERM too (what `kill`, service managers and container stops send).
            let term = async {
                #[cfg(unix)]
                {
                    use tokio::signal::unix::{signal, SignalKind};
                    if let Ok(mut s) = signal(SignalKind::terminate()) {
                        s.recv().await;
                        return;
                    }
                }
                std::future::pending::<()>().await
            };
            tokio::pin!(term);
            // Poll once so the handlers are installed before pack starts writing.
            tokio::select! {
                biased;
                _ = &mut signal => 130,
                _ = &mut term => 143,
                _ = async {
                    let _ = tx.send(());
                    std::future::pending::<()>().await
                } => 1,
            }
        });
        if !done.load(Ordering::SeqCst) {
            for p in &paths {
                let _ = std::fs::remove_file(p);
            }
            eprintln!("interrupted: nothing was written");
        }
        std::process::exit(code);
    });
    let _ = rx.recv();
}

/// One source tensor, in GGUF terms.
pub(crate) struct SrcTensor<'a> {
    /// GGUF name.
    pub name: String,
    /// GGUF dims (`dims[0]` contiguous).
    pub dims: Vec<u64>,
    /// Stored type, or the name of one pack cannot read.
    pub ty: Result<GgmlType, String>,
    /// Stored bytes.
    pub data: &'a [u8],
    /// `Some(n_head)`: permute rows per head from HF's rotate-half order to GGUF llama's
    /// adjacent pairs, as llama.cpp's converter does for attn_q / attn_k.
    pub permute_heads: Option<usize>,
    /// Where `data` starts in its file (for releasing pages once written).
    pub file_offset: usize,
    /// How the GGUF tensor's rows are found in the source.
    pub layout: Layout<'a>,
}

/// Where a GGUF tensor's rows come from.
pub(crate) enum Layout<'a> {
    /// `data`, row after row (with `permute_heads`).
    Rows,
    /// Equal parts one after the other (HF's one tensor per expert, stacked into one 3-D GGUF
    /// tensor): `data` is unused.
    Stacked(Vec<&'a [u8]>),
    /// `data` holds `experts` matrices of `k` rows of `w` values each (HF's fused, transposed
    /// experts); GGUF row `i` of expert `e` is column `step * i + offset` of expert `e`'s
    /// matrix. One expert at a time is held in f32 while its rows are written.
    Columns {
        experts: usize,
        k: usize,
        w: usize,
        step: usize,
        offset: usize,
    },
    /// OpenAI's MXFP4 experts: `data` holds the `*_blocks` (16 bytes a block) and `scales` the
    /// `*_scales` (a byte a block) of `experts` matrices of `rows` rows of `groups` blocks
    /// each; GGUF row `i` of expert `e` is row `step * i + offset` of expert `e`'s matrix. An
    /// MXFP4 target gets the same codes and exponents repacked into ggml's blocks (bit-exact);
    /// any other is quantised from their values.
    Mxfp4 {
        scales: &'a [u8],
        experts: usize,
        rows: usize,
        groups: usize,
        step: usize,
        offset: usize,
    },
}

impl<'a> SrcTensor<'a> {
    /// The stored byte ranges (for checking sizes and releasing pages).
    pub(crate) fn slices(&self) -> Vec<&'a [u8]> {
        match &self.layout {
            Layout::Stacked(parts) => parts.clone(),
            Layout::Mxfp4 { scales, .. } => vec![self.data, scales],
            _ => vec![self.data],
        }
    }
}

/// Produces a tensor's f32 rows in GGUF order.
struct RowReader<'t, 'a> {
    t: &'t SrcTensor<'a>,
    ty: GgmlType,
    /// GGUF row length.
    n: usize,
    rows: usize,
    /// `Columns`: the expert held in f32, and its values.
    held: Option<(usize, Vec<f32>)>,
}

impl<'t, 'a> RowReader<'t, 'a> {
    /// Checks the stored sizes against the shape.
    fn new(t: &'t SrcTensor<'a>, ty: GgmlType) -> Result<Self> {
        let n = t.dims.first().copied().unwrap_or(1) as usize;
        let elements: u64 = t.dims.iter().product();
        let rows = elements as usize / n.max(1);
        let stored: usize = t.slices().iter().map(|s| s.len()).sum();
        let needed = match t.layout {
            Layout::Columns {
                experts,
                k,
                w,
                step,
                offset,
            } => {
                anyhow::ensure!(
                    (w as u64).is_multiple_of(ty.block_size()),
                    "tensor `{}`: row of {w} values does not fit {ty}",
                    t.name
                );
                anyhow::ensure!(
                    k == n
                        && experts > 0
                        && rows.is_multiple_of(experts)
                        && step * (rows / experts - 1) + offset < w,
                    "tensor `{}`: shape {:?} does not fit {experts} experts of {k} x {w}",
                    t.name,
                    t.dims
                );
                experts * k * flowrt_kernels::row_size(ty, w)
            }
            Layout::Mxfp4 {
                scales,
                experts,
                rows: src_rows,
                groups,
                step,
                offset,
            } => {
                anyhow::ensure!(
                    ty == GgmlType::Mxfp4
                        && n == 32 * groups
                        && experts > 0
                        && rows.is_multiple_of(experts)
                        && step * (rows / experts - 1) + offset < src_rows
                        && scales.len() == experts * src_rows * groups,
                    "tensor `{}`: shape {:?} does not fit {experts} MXFP4 experts of {src_rows} rows of {groups} blocks",
                    t.name,
                    t.dims
                );
                // Blocks and scales together.
                experts * src_rows * groups * 17
            }
            _ => rows * flowrt_kernels::row_size(ty, n),
        };
        if let Layout::Stacked(parts) = &t.layout {
            anyhow::ensure!(
                !parts.is_empty() && parts.iter().all(|p| p.len() == stored / parts.len()),
                "tensor `{}`: its {} parts differ in size",
                t.name,
                parts.len()
            );
        }
        anyhow::ensure!(
            stored == needed,
            "tensor `{}`: {stored} bytes stored, its shape needs {needed}",
            t.name
        );
        Ok(RowReader {
            t,
            ty,
            n,
            rows,
            held: None,
        })
    }

    /// GGUF row `r` in ggml's MXFP4 blocks, appended to `out`, for an [`Layout::Mxfp4`]
    /// tensor (`false` for the others).
    fn mxfp4_row(&self, r: usize, out: &mut Vec<u8>) -> bool {
        let Layout::Mxfp4 {
            scales,
            experts,
            rows,
            groups,
            step,
            offset,
        } = self.t.layout
        else {
            return false;
        };
        let per = self.rows / experts;
        let at = ((r / per) * rows + step * (r % per) + offset) * groups;
        flowrt_model::weights::mxfp4_row_to_ggml(
            &self.t.data[at * 16..(at + groups) * 16],
            &scales[at..at + groups],
            out,
        );
        true
    }

    /// GGUF row `r` into `f` (`n` values).
    fn row(&mut self, k: &Kernels, r: usize, f: &mut [f32]) {
        let (t, ty, n) = (self.t, self.ty, self.n);
        match &t.layout {
            Layout::Rows => {
                let in_row = flowrt_kernels::row_size(ty, n);
                let sr = match t.permute_heads {
                    Some(h) => permuted_row(r, self.rows, h),
                    None => r,
                };
                k.dequantize_row(ty, &t.data[sr * in_row..(sr + 1) * in_row], f);
            }
            Layout::Stacked(parts) => {
                let in_row = flowrt_kernels::row_size(ty, n);
                let per = parts[0].len() / in_row;
                let p = parts[r / per];
                let sr = r % per;
                k.dequantize_row(ty, &p[sr * in_row..(sr + 1) * in_row], f);
            }
            &Layout::Columns {
                experts,
                k: kk,
                w,
                step,
                offset,
            } => {
                let per = self.rows / experts;
                let (e, i) = (r / per, r % per);
                if self.held.as_ref().map(|h| h.0) != Some(e) {
                    let in_row = flowrt_kernels::row_size(ty, w);
                    let base = e * kk * in_row;
                    let mut v = vec![0f32; kk * w];
                    for (j, out) in v.chunks_exact_mut(w).enumerate() {
                        let s = base + j * in_row;
                        k.dequantize_row(ty, &t.data[s..s + in_row], out);
                    }
                    self.held = Some((e, v));
                }
                let v = &self.held.as_ref().expect("held above").1;
                for (j, x) in f.iter_mut().enumerate() {
                    *x = v[j * w + step * i + offset];
                }
            }
            Layout::Mxfp4 { .. } => {
                let mut ggml = Vec::with_capacity(flowrt_kernels::row_size(ty, n));
                self.mxfp4_row(r, &mut ggml);
                k.dequantize_row(ty, &ggml, f);
            }
        }
    }
}

/// The source row that lands at row `r` after the per-head rotate-half -> pairs permutation.
pub(crate) fn permuted_row(r: usize, rows: usize, n_head: usize) -> usize {
    let hd = rows / n_head;
    let (h, within) = (r / hd, r % hd);
    let (i, j) = (within / 2, within % 2);
    h * hd + j * (hd / 2) + i
}

/// Writes `tensors` converted to `quant`'s mix at `out`, with `meta` (its file type and
/// quantisation version replaced). Returns the tensors that fell back.
fn write_pack(
    tensors: &[SrcTensor<'_>],
    meta: Vec<(String, Value)>,
    quant: GgmlType,
    out: &Path,
    calibration: &mut dyn Calibration,
    threads: usize,
    release: &dyn Fn(&SrcTensor<'_>),
) -> Result<Vec<(String, GgmlType)>> {
    // Sequential calibration takes the matrices in the order the forward pass reads them.
    let mut order: Vec<&SrcTensor<'_>> = tensors.iter().collect();
    if calibration.forward_order() {
        order.sort_by_key(|t| forward_rank(&t.name));
    }
    let tensors = order;
    let mut specs = Vec::new();
    let mut fallbacks = Vec::new();
    for &t in &tensors {
        let ty = match &t.ty {
            Ok(ty) if Kernels::supports_conversion(*ty) => *ty,
            Ok(ty) => bail!("tensor `{}`: pack cannot read type {ty}", t.name),
            Err(name) => bail!("tensor `{}`: pack cannot read dtype {name}", t.name),
        };
        let n = match t.layout {
            Layout::Columns { w, .. } => w as u64,
            _ => t.dims.first().copied().unwrap_or(1),
        };
        anyhow::ensure!(
            n.is_multiple_of(ty.block_size()),
            "tensor `{}`: row of {n} values does not fit {ty}",
            t.name
        );
        let (target, fell_back) = target_type(quant, &t.name, &t.dims);
        if fell_back {
            fallbacks.push((t.name.clone(), target));
        }
        specs.push(TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: target,
        });
    }
    let mut meta: Vec<(String, Value)> = meta
        .into_iter()
        .filter(|(k, _)| k != "general.file_type" && k != "general.quantization_version")
        .collect();
    meta.push(("general.file_type".into(), Value::U32(file_type(quant))));
    meta.push(("general.quantization_version".into(), Value::U32(2)));
    let partial = partial_path(out);
    let mut w = StreamWriter::create(out, &meta, &specs)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let bar = indicatif::ProgressBar::new(specs.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} tensors {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let k = Kernels::detect();
    // Error-feedback factors of the last few inputs (Q, K and V share one, gate and up one).
    let mut factors: Vec<(Arc<Vec<f32>>, Arc<gptq::Factor>)> = Vec::new();
    // `--asymmetric`'s correction of the last input (by its cross moments).
    let mut correction: Option<(Arc<Vec<f32>>, Arc<gptq::Correction>)> = None;
    for (&t, spec) in tensors.iter().zip(&specs) {
        bar.set_message(t.name.clone());
        let src_ty = *t.ty.as_ref().expect("checked above");
        let mut reader = RowReader::new(t, src_ty)?;
        let (n, rows) = (reader.n, reader.rows);
        let out_row = flowrt_kernels::row_size(spec.ty, n);
        let mut buf = vec![0u8; rows * out_row];
        let mut f = vec![0f32; n];
        let mut ggml = Vec::with_capacity(out_row);
        // Only a row of the length the statistics were taken for (a fused or split matrix
        // whose input differs falls back to the plain search), and only for the types whose
        // search weighs by them (the Q8_0 head of a Q4 mix needs no run of the head over
        // every calibration position).
        let stat = match matrix_key(&t.name) {
            Some(key) if gptq::supports(spec.ty) => calibration.stat(key)?,
            _ => None,
        };
        let stat = stat.as_ref();
        let imp = stat.map(|v| &v.mean_sq[..]).filter(|w| w.len() == n);
        let gram = stat
            .and_then(|v| v.gram.as_ref())
            .filter(|g| g.len() == n * n && gptq::supports(spec.ty));
        if let Some(g) = gram {
            let cached = factors.iter().find(|(p, _)| Arc::ptr_eq(p, g));
            let factor = match cached {
                Some((_, f)) => Ok(f.clone()),
                None => gptq::Factor::new(g, n, threads).map(|f| {
                    let f = Arc::new(f);
                    factors.push((g.clone(), f.clone()));
                    if factors.len() > 4 {
                        factors.remove(0);
                    }
                    f
                }),
            };
            match factor {
                Ok(factor) => {
                    let mut m = vec![0f32; rows * n];
                    for (r, row) in m.chunks_mut(n.max(1)).enumerate() {
                        reader.row(k, r, row);
                    }
                    if let Some((cross, alpha)) = stat.and_then(|v| v.target.as_ref()) {
                        let c = match &correction {
                            Some((p, c)) if Arc::ptr_eq(p, cross) => c.clone(),
                            _ => {
                                let c = Arc::new(
                                    gptq::Correction::new(cross, &factor, threads).with_context(
                                        || format!("tensor `{}`: asymmetric target", t.name),
                                    )?,
                                );
                                correction = Some((cross.clone(), c.clone()));
                                c
                            }
                        };
                        c.apply(&mut m, *alpha, threads)
                            .with_context(|| format!("tensor `{}`: asymmetric target", t.name))?;
                    }
                    gptq::quantize_matrix(spec.ty, &mut m, &factor, &mut buf, threads)
                        .with_context(|| format!("tensor `{}`: error feedback", t.name))?;
                    w.write_tensor(&t.name, &buf)
                        .with_context(|| format!("cannot write {}", partial.display()))?;
                    calibration.written(t, spec.ty, &buf)?;
                    release(t);
                    bar.inc(1);
                    continue;
                }
                Err(e) => bar.println(format!(
                    "gptq:      `{}`: {e}; quantised with the weighted search instead",
                    t.name
                )),
            }
        }
        for r in 0..rows {
            let dst = &mut buf[r * out_row..(r + 1) * out_row];
            ggml.clear();
            // MXFP4 to MXFP4: the source's blocks as they are (no requantising).
            if spec.ty == GgmlType::Mxfp4 && reader.mxfp4_row(r, &mut ggml) {
                dst.copy_from_slice(&ggml);
                continue;
            }
            reader.row(k, r, &mut f);
            k.quantize_row_weighted(spec.ty, &f, imp, dst);
        }
        w.write_tensor(&t.name, &buf)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        calibration.written(t, spec.ty, &buf)?;
        release(t);
        bar.inc(1);
    }
    bar.finish_and_clear();
    w.finish().with_context(|| {
        format!(
            "cannot finish writing {} and rename it to {}",
            partial.display(),
            out.display()
        )
    })?;
    Ok(fallbacks)
}

/// `general.file_type` as llama.cpp numbers it (`LLAMA_FTYPE_*`).
fn file_type(quant: GgmlType) -> u32 {
    use GgmlType::*;
    match quant {
        F32 => 0,
        F16 => 1,
        Q4_0 => 2,
        Q4_1 => 3,
        Q8_0 => 7,
        Q4K => 15, // Q4_K_M
        Q5K => 17, // Q5_K_M
        Q6K => 18,
        BF16 => 32,
        Mxfp4 => 38, // MXFP4_MOE
        _ => 0,
    }
}

/// Loads the reference (`--against`, else the source as stored) and the pack and compares
/// them teacher-forced.
/// Whether `quant`'s mix has types whose search takes importance weights (Q4_0, Q4_1).
fn uses_importance(quant: GgmlType) -> bool {
    matches!(quant, GgmlType::Q4_0 | GgmlType::Q4_1)
}

/// The (layer, role) of the matrix a GGUF tensor name holds, for the ones whose input
/// statistics the source run gives (`None` for others: embeddings, experts, norms).
fn matrix_key(name: &str) -> Option<(Option<usize>, MatRole)> {
    if name == "output.weight" {
        return Some((None, MatRole::Output));
    }
    let rest = name.strip_prefix("blk.")?.strip_suffix(".weight")?;
    let (layer, base) = rest.split_once('.')?;
    let role = match base {
        // Fused Q/K/V and gate/up take the same input as their parts.
        "attn_q" | "attn_qkv" => MatRole::Q,
        "attn_k" => MatRole::K,
        "attn_v" => MatRole::V,
        "attn_output" => MatRole::O,
        "ffn_gate" => MatRole::Gate,
        "ffn_up" => MatRole::Up,
        "ffn_down" => MatRole::Down,
        "shortconv.in_proj" => MatRole::ConvIn,
        "shortconv.out_proj" => MatRole::ConvOut,
        _ => return None,
    };
    Some((Some(layer.parse().ok()?), role))
}

/// A matrix input's statistics: the mean square of each input column over the calibration
/// prompts, the tokens it was taken over, and (`--gptq`) the input's second-moment matrix.
/// Rows of matrix inputs, shared by the matrices that read them.
type Shared = Arc<Vec<f32>>;

/// What is known of a matrix's input.
#[derive(Clone)]
struct Stat {
    /// Each input column's mean square.
    mean_sq: Vec<f32>,
    /// Positions measured.
    rows: u64,
    /// The second moments `Σ x̃ x̃ᵀ` (`--gptq`).
    gram: Option<Shared>,
    /// `--asymmetric`: the cross moments `Σ (x − x̃) x̃ᵀ` of the source's inputs `x` and the
    /// pack's `x̃`, and the fraction of the correction to its target to take.
    target: Option<(Shared, f32)>,
}

/// Per matrix, its input's [`Stat`] through the source.
type Importance = HashMap<(Option<usize>, MatRole), Stat>;

fn to_stat(s: &flowrt_engine::InputStat) -> Stat {
    let n = s.rows as f64;
    let mean = s.sum_sq.iter().map(|&v| (v / n) as f32).collect();
    Stat {
        mean_sq: mean,
        rows: s.rows,
        gram: s.gram.clone(),
        target: None,
    }
}

/// Where [`write_pack`] gets each matrix's input statistics.
trait Calibration {
    /// The statistics of the input of the matrix `key` names, if measured.
    fn stat(&mut self, key: (Option<usize>, MatRole)) -> Result<Option<Stat>>;
    /// Tensor `t` as written: `bytes`, rows of `ty` in GGUF order.
    fn written(&mut self, _t: &SrcTensor<'_>, _ty: GgmlType, _bytes: &[u8]) -> Result<()> {
        Ok(())
    }
    /// Whether the tensors must come in the order the forward pass reads them.
    fn forward_order(&self) -> bool {
        false
    }
}

/// Statistics taken once, through the source.
impl Calibration for Importance {
    fn stat(&mut self, key: (Option<usize>, MatRole)) -> Result<Option<Stat>> {
        Ok(self.get(&key).cloned())
    }
}

/// Statistics taken layer by layer through the matrices as written (`--sequential`).
struct Sequential {
    driver: flowrt_engine::LayerByLayer,
    source: Arc<flowrt_model::Model>,
    /// `--asymmetric`'s fraction, and the cross moments of the last input (by its rows).
    asymmetric: Option<f32>,
    cross: Option<(Shared, Shared)>,
    threads: usize,
}

impl Sequential {
    /// Prepares the calibration (`pack` has checked that `--gptq` applies to the type).
    fn new(args: &PackArgs, extra: &[String], threads: usize) -> Result<Sequential> {
        let source = load_source(args)?;
        let opts = gate_options(args, &source);
        let prompts =
            flowrt_engine::builtin_prompts(&source.tokenizer, source.template.as_ref(), extra)?;
        if let Some(a) = args.asymmetric {
            anyhow::ensure!(
                a > 0.0 && a <= 1.0,
                "--asymmetric takes a fraction in (0, 1], not {a}"
            );
        }
        let kind = match args.asymmetric {
            Some(_) => InputStatKind::Inputs,
            None => InputStatKind::Gram,
        };
        let driver = flowrt_engine::LayerByLayer::new(&source, &prompts, &opts, kind)?;
        check_gptq_tokens(driver.tokens(), widest_input(&source.model))?;
        // One layer's second moments, and three residual streams of every position (before
        // a block, after it, and the next); with --asymmetric three more (the source's), and
        // both paths' inputs of one layer.
        let tokens = driver.tokens();
        let mut streams = 3 * 4 * tokens * source.model.config.hidden_size as u64;
        if args.asymmetric.is_some() {
            streams = 2 * streams + 2 * 4 * tokens * layer_input_width(&source.model);
        }
        if let Some(avail) = flowrt_engine::available_memory_bytes() {
            check_gram_memory(
                layer_gram_bytes(&source.model) + streams,
                avail,
                "without --gptq",
            )?;
        }
        Ok(Sequential {
            driver,
            source: source.model.clone(),
            asymmetric: args.asymmetric,
            cross: None,
            threads,
        })
    }
}

impl Calibration for Sequential {
    fn stat(&mut self, (layer, role): (Option<usize>, MatRole)) -> Result<Option<Stat>> {
        let (mut stat, inputs) = match self.driver.stat(layer, role)?.filter(|s| s.rows > 0) {
            Some(s) => (to_stat(s), s.inputs.clone()),
            None => return Ok(None),
        };
        let (Some(alpha), Some(pack)) = (self.asymmetric, inputs) else {
            return Ok(Some(stat));
        };
        let cross = match &self.cross {
            Some((rows, c)) if Arc::ptr_eq(rows, &pack) => c.clone(),
            _ => {
                let Some(src) = self.driver.reference(layer, role)? else {
                    return Ok(Some(stat));
                };
                let n = stat.mean_sq.len();
                anyhow::ensure!(
                    src.len() == pack.len() && pack.len() == n * stat.rows as usize,
                    "the source's and the pack's inputs of {role:?} in layer {layer:?} differ \
                     in size ({} and {} values for {} positions of {n})",
                    src.len(),
                    pack.len(),
                    stat.rows
                );
                let delta: Vec<f32> = src.iter().zip(pack.iter()).map(|(x, y)| x - y).collect();
                let c = Arc::new(gptq::cross_moment(&delta, n, &pack, n, self.threads));
                self.cross = Some((pack, c.clone()));
                c
            }
        };
        stat.target = Some((cross, alpha));
        Ok(Some(stat))
    }

    fn written(&mut self, t: &SrcTensor<'_>, ty: GgmlType, bytes: &[u8]) -> Result<()> {
        if !matches!(t.layout, Layout::Rows) {
            return Ok(());
        }
        // The model's own row order (HF's rotate-half Q/K rows where the GGUF pairs them).
        let n = t.dims.first().copied().unwrap_or(1) as usize;
        let row = flowrt_kernels::row_size(ty, n);
        let rows = bytes.len() / row.max(1);
        let rows_of = |bytes: &[u8]| match t.permute_heads {
            Some(h) => unpermute_rows(bytes, row, h),
            None => bytes.to_vec(),
        };
        if t.name == "token_embd.weight" {
            self.driver.replace_embedding(ty, rows_of(bytes))?;
        } else if let Some((layer, role)) = matrix_key(&t.name) {
            // A fused tensor (Q/K/V, gate/up in one) stays as the source in the calibration.
            let same = self
                .source
                .matrix(layer, role)
                .is_some_and(|m| (m.rows, m.cols) == (rows, n));
            if same {
                self.driver.replace(layer, role, ty, rows_of(bytes))?;
            }
        }
        Ok(())
    }

    fn forward_order(&self) -> bool {
        true
    }
}

/// GGUF rows (of `row` bytes) permuted per head into llama's adjacent pairs, back in the
/// source's rotate-half order: the inverse of [`permuted_row`].
fn unpermute_rows(bytes: &[u8], row: usize, n_head: usize) -> Vec<u8> {
    let rows = bytes.len() / row.max(1);
    let mut out = vec![0u8; bytes.len()];
    for (r, src) in bytes.chunks_exact(row).enumerate() {
        let s = permuted_row(r, rows, n_head);
        out[s * row..(s + 1) * row].copy_from_slice(src);
    }
    out
}

/// Where a GGUF tensor comes in the forward pass: the embeddings, then each layer's blocks
/// (Q/K/V before the attention output, gate/up before down), then the output.
fn forward_rank(name: &str) -> (u8, usize, u8) {
    if let Some(rest) = name.strip_prefix("blk.") {
        let (layer, base) = rest.split_once('.').unwrap_or((rest, ""));
        let rank = match base.trim_end_matches(".weight").trim_end_matches(".bias") {
            "attn_q" | "attn_k" | "attn_v" | "attn_qkv" | "shortconv.in_proj" => 1,
            "attn_output" | "shortconv.out_proj" => 2,
            b if b.starts_with("ffn_gate") || b.starts_with("ffn_up") => 3,
            b if b.starts_with("ffn_down") => 4,
            _ => 0,
        };
        return (1, layer.parse().unwrap_or(usize::MAX), rank);
    }
    if name.starts_with("output") {
        return (2, 0, 0);
    }
    (0, 0, 0)
}

/// Runs the source (at its stored precision) over the gate's prompts and returns each dense
/// matrix's column importances.
fn importance(args: &PackArgs, extra: &[String]) -> Result<Importance> {
    let source = load_source(args)?;
    if args.gptq {
        let need = gram_bytes(&source.model);
        if let Some(avail) = flowrt_engine::available_memory_bytes() {
            let instead = format!(
                "with --sequential (one layer's at a time, {:.1} GiB) or without --gptq",
                layer_gram_bytes(&source.model) as f64 / (1u64 << 30) as f64
            );
            check_gram_memory(need, avail, &instead)?;
        }
    }
    let opts = gate_options(args, &source);
    let prompts =
        flowrt_engine::builtin_prompts(&source.tokenizer, source.template.as_ref(), extra)?;
    let kind = if args.gptq {
        InputStatKind::Gram
    } else {
        InputStatKind::SumSquares
    };
    let stats = flowrt_engine::input_stats(&source, &prompts, &opts, kind)?;
    Ok(stats
        .iter()
        .filter(|s| s.rows > 0)
        .map(|s| ((s.layer, s.role), to_stat(s)))
        .collect())
}

/// The source, loaded to run (the calibration).
fn load_source(args: &PackArgs) -> Result<LoadedModel> {
    LoadedModel::load(&args.source).with_context(|| {
        format!(
            "cannot load source {} to measure its activations (--no-importance skips this)",
            args.source.display()
        )
    })
}

/// The distinct dense-matmul inputs of a layer (Q/K/V share one, gate/up one).
const DISTINCT_INPUTS: [MatRole; 6] = [
    MatRole::Q,
    MatRole::O,
    MatRole::Gate,
    MatRole::Down,
    MatRole::ConvIn,
    MatRole::ConvOut,
];

/// The widths (columns) of `layer`'s distinct matrix inputs (`None`: the output
/// projection's).
fn input_widths(
    model: &flowrt_model::Model,
    layer: Option<usize>,
) -> impl Iterator<Item = u64> + '_ {
    let roles: &'static [MatRole] = match layer {
        Some(_) => &DISTINCT_INPUTS,
        None => &[MatRole::Output],
    };
    roles
        .iter()
        .filter_map(move |&r| model.matrix(layer, r))
        .map(|m| m.cols as u64)
}

/// The bytes of `layer`'s second moments (`None`: the output projection's): `4 n²` for each
/// distinct input of `n` columns.
fn gram_bytes_of(model: &flowrt_model::Model, layer: Option<usize>) -> u64 {
    input_widths(model, layer).map(|n| 4 * n * n).sum()
}

/// Each layer's second-moment bytes, then the output projection's.
fn layer_grams(model: &flowrt_model::Model) -> impl Iterator<Item = u64> + '_ {
    (0..model.config.num_hidden_layers)
        .map(Some)
        .chain([None])
        .map(|l| gram_bytes_of(model, l))
}

/// The bytes `--gptq`'s second moments take: every layer's and the output projection's,
/// held until the pack is written.
fn gram_bytes(model: &flowrt_model::Model) -> u64 {
    layer_grams(model).sum()
}

/// The most bytes `--gptq --sequential`'s second moments take at once: one layer's.
fn layer_gram_bytes(model: &flowrt_model::Model) -> u64 {
    layer_grams(model).max().unwrap_or(0)
}

/// The most columns one layer's distinct matrix inputs have together (the output
/// projection counting as a layer): what `--asymmetric` keeps of each position per path.
fn layer_input_width(model: &flowrt_model::Model) -> u64 {
    (0..model.config.num_hidden_layers)
        .map(Some)
        .chain([None])
        .map(|l| input_widths(model, l).sum())
        .max()
        .unwrap_or(0)
}

/// The widest dense-matmul input (columns).
fn widest_input(model: &flowrt_model::Model) -> usize {
    (0..model.config.num_hidden_layers)
        .map(Some)
        .chain([None])
        .flat_map(|l| input_widths(model, l))
        .max()
        .unwrap_or(0) as usize
}

/// Refuses `--gptq` with fewer calibration tokens than the widest input has columns.
fn check_gptq_tokens(tokens: u64, widest: usize) -> Result<()> {
    anyhow::ensure!(
        tokens >= widest as u64,
        "--gptq: the calibration has {tokens} tokens, fewer than the widest matrix \
         input ({widest} columns), so its second moments are rank-deficient and error \
         feedback would fit those prompts rather than the model (measured worse than \
         the weighted search, docs/quantisation.md); add calibration text with \
         --prompts FILE"
    );
    Ok(())
}

/// Refuses `--gptq` when its second moments (`need` bytes) would take more than 80 % of the
/// memory the system has available, saying how to pack `instead`.
fn check_gram_memory(need: u64, available: u64, instead: &str) -> Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    anyhow::ensure!(
        need <= available / 5 * 4,
        "--gptq: the second moments of this model's matrix inputs need {:.1} GiB, and {:.1} GiB \
         of memory is available (at most 80 % of it is used); pack {instead}",
        gib(need),
        gib(available)
    );
    Ok(())
}

/// How the gate (and the importance run) run a model: `--threads`, an f32 KV cache, at most
/// 512 positions.
fn gate_options(args: &PackArgs, model: &LoadedModel) -> EngineOptions {
    EngineOptions {
        threads: args.threads.unwrap_or(0),
        kv: KvPrecision::F32,
        n_ctx: Some(model.model_ctx().min(512)),
        ..Default::default()
    }
}

/// The gate's prompts under `--gptq`, which calibrates on the built-in ones (and
/// `--prompts`): eight paragraphs of prose and code that nothing calibrates on.
const HELDOUT: &str = include_str!("../../../tests/fixtures/heldout-prompts.txt");

/// The non-empty lines of [`HELDOUT`], one prompt each.
fn heldout_prompts() -> impl Iterator<Item = &'static str> {
    HELDOUT.lines().filter(|l| !l.trim().is_empty())
}

fn gate(args: &PackArgs, extra: &[String]) -> Result<flowrt_engine::VerifyReport> {
    let (what, path) = match &args.against {
        Some(p) => ("--against model", p),
        None => ("source", &args.source),
    };
    let reference = LoadedModel::load(path)
        .with_context(|| format!("cannot load {what} {}", path.display()))?;
    let packed = LoadedModel::load(&args.output)
        .with_context(|| format!("cannot load pack {}", args.output.display()))?;
    let opts = gate_options(args, &reference);
    let prompts_of = |m: &LoadedModel| -> Result<Vec<Vec<u32>>> {
        if args.gptq {
            // Error feedback fits the calibration prompts closely: gate on text it never saw.
            let mut out = Vec::new();
            for line in heldout_prompts() {
                out.push(m.tokenizer.encode(line, true, false)?);
            }
            Ok(out)
        } else {
            Ok(flowrt_engine::builtin_prompts(
                &m.tokenizer,
                m.template.as_ref(),
                extra,
            )?)
        }
    };
    let prompts = prompts_of(&reference)?;
    if args.against.is_some() {
        let mine = prompts_of(&packed)?;
        if let Some(i) = (0..prompts.len()).find(|&i| mine.get(i) != prompts.get(i)) {
            bail!(
                "the --against model tokenises gate prompt {i} differently from the pack \
                 (different tokenizer or chat template): the models cannot be compared"
            );
        }
    }
    let mut rs = Session::new(&reference, &opts)?;
    let mut ps = Session::new(&packed, &opts)?;
    Ok(flowrt_engine::compare_models(&mut rs, &mut ps, &prompts)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gptq_memory_is_what_the_second_moments_take_and_is_checked() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/families/llama-untied");
        let m = LoadedModel::load(&dir).unwrap();
        let prompts = vec![m.tokenizer.encode("Second moments.", true, false).unwrap()];
        let opts = EngineOptions {
            threads: 1,
            ..Default::default()
        };
        let stats = flowrt_engine::input_stats(&m, &prompts, &opts, InputStatKind::Gram).unwrap();
        // The distinct matrices the statistics hold, in bytes.
        let mut seen: Vec<&Arc<Vec<f32>>> = Vec::new();
        for g in stats.iter().filter_map(|s| s.gram.as_ref()) {
            if !seen.iter().any(|s| Arc::ptr_eq(s, g)) {
                seen.push(g);
            }
        }
        let held: u64 = seen.iter().map(|g| 4 * g.len() as u64).sum();
        assert_eq!(gram_bytes(&m.model), held);
        // --sequential holds one layer's (or the output projection's) at a time.
        let per = |l: Option<usize>| -> u64 {
            let mut seen: Vec<&Arc<Vec<f32>>> = Vec::new();
            for g in stats
                .iter()
                .filter(|s| s.layer == l)
                .filter_map(|s| s.gram.as_ref())
            {
                if !seen.iter().any(|s| Arc::ptr_eq(s, g)) {
                    seen.push(g);
                }
            }
            seen.iter().map(|g| 4 * g.len() as u64).sum()
        };
        let layers = m.model.config.num_hidden_layers;
        let most = (0..layers).map(Some).chain([None]).map(per).max().unwrap();
        assert_eq!(layer_gram_bytes(&m.model), most);
        assert!(most < held);
        assert!(check_gram_memory(held, 2 * held, "so").is_ok());
        let e = check_gram_memory(1 << 31, 1 << 31, "with --sequential")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("need 2.0 GiB")
                && e.contains("2.0 GiB of memory")
                && e.ends_with("pack with --sequential"),
            "{e}"
        );
    }

    /// `--sequential` on an f32 source with every matrix handed back unchanged (as f32 rows
    /// in GGUF order, Q/K permuted): each statistic is the one-pass run's, so the rows went
    /// back to the source's order and into the right matrices.
    #[test]
    fn sequential_statistics_are_the_sources_when_nothing_is_quantised() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/families/llama-untied");
        let hf = hf::HfSource::open(&dir, None).unwrap();
        let (_, tensors) = hf.plan().unwrap();
        let m = LoadedModel::load(&dir).unwrap();
        let prompts = vec![m
            .tokenizer
            .encode("Rows go back in their own order.", true, false)
            .unwrap()];
        let opts = EngineOptions {
            threads: 1,
            kv: KvPrecision::F32,
            ..Default::default()
        };
        let kind = InputStatKind::SumSquares;
        let once = flowrt_engine::input_stats(&m, &prompts, &opts, kind).unwrap();
        let mut seq = Sequential {
            driver: flowrt_engine::LayerByLayer::new(&m, &prompts, &opts, kind).unwrap(),
            source: m.model.clone(),
            asymmetric: None,
            cross: None,
            threads: 1,
        };
        let k = Kernels::detect();
        let mut order: Vec<&SrcTensor<'_>> = tensors.iter().collect();
        order.sort_by_key(|t| forward_rank(&t.name));
        let (mut compared, mut permuted) = (0, 0);
        for t in order {
            if let Some(key) = matrix_key(&t.name).filter(|k| k.1 != MatRole::Output) {
                let got = seq.stat(key).unwrap().expect("statistics");
                let want = once.iter().find(|s| (s.layer, s.role) == key).unwrap();
                for (g, w) in got.mean_sq.iter().zip(to_stat(want).mean_sq) {
                    assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-3), "{}", t.name);
                }
                compared += 1;
            }
            let ty = *t.ty.as_ref().unwrap();
            assert_eq!(ty, GgmlType::F32);
            let mut reader = RowReader::new(t, ty).unwrap();
            let mut f = vec![0f32; reader.n];
            let mut bytes = Vec::new();
            for r in 0..reader.rows {
                reader.row(k, r, &mut f);
                bytes.extend(f.iter().flat_map(|v| v.to_le_bytes()));
            }
            permuted += usize::from(t.permute_heads.is_some());
            seq.written(t, GgmlType::F32, &bytes).unwrap();
        }
        assert!(compared >= 7 * m.model.config.num_hidden_layers && permuted > 0);
    }

    #[test]
    fn unpermuting_gives_the_source_rows_back() {
        // 2 heads of 8 rows, 3 bytes a row, every row different.
        let (rows, row, heads) = (16, 3, 2);
        let src: Vec<u8> = (0..rows * row).map(|i| i as u8).collect();
        let mut gguf = vec![0u8; src.len()];
        for r in 0..rows {
            let s = permuted_row(r, rows, heads);
            gguf[r * row..(r + 1) * row].copy_from_slice(&src[s * row..(s + 1) * row]);
        }
        assert_ne!(gguf, src);
        assert_eq!(unpermute_rows(&gguf, row, heads), src);
    }

    #[test]
    fn forward_order_puts_each_matrix_after_what_feeds_it() {
        let mut names = vec![
            "output.weight",
            "blk.1.attn_q.weight",
            "blk.0.ffn_down.weight",
            "blk.0.attn_output.weight",
            "blk.0.ffn_up.weight",
            "blk.0.attn_norm.weight",
            "blk.0.attn_k.weight",
            "blk.10.attn_q.weight",
            "token_embd.weight",
            "output_norm.weight",
        ];
        names.sort_by_key(|n| forward_rank(n));
        assert_eq!(
            names,
            [
                "token_embd.weight",
                "blk.0.attn_norm.weight",
                "blk.0.attn_k.weight",
                "blk.0.attn_output.weight",
                "blk.0.ffn_up.weight",
                "blk.0.ffn_down.weight",
                "blk.1.attn_q.weight",
                "blk.10.attn_q.weight",
                "output.weight",
                "output_norm.weight",
            ]
        );
    }

    #[test]
    fn qk_permutation_matches_llama_cpp() {
        // numpy: w.reshape(n_head, 2, hd / 2).swapaxes(1, 2).reshape(rows)
        let got: Vec<usize> = (0..8).map(|r| permuted_row(r, 8, 2)).collect();
        assert_eq!(got, [0, 2, 1, 3, 4, 6, 5, 7]);
        let got: Vec<usize> = (0..8).map(|r| permuted_row(r, 8, 1)).collect();
        assert_eq!(got, [0, 4, 1, 5, 2, 6, 3, 7]);
    }

    #[test]
    fn the_mix_and_its_fallbacks() {
        use GgmlType::*;
        let m = |q, name, dims: &[u64]| target_type(q, name, dims);
        assert_eq!(m(Q4K, "blk.0.attn_norm.weight", &[512]), (F32, false));
        assert_eq!(m(Q4K, "blk.0.attn_v.weight", &[512, 64]), (Q6K, false));
        assert_eq!(m(Q4K, "blk.0.ffn_down.weight", &[512, 64]), (Q6K, false));
        assert_eq!(m(Q4K, "blk.0.attn_q.weight", &[512, 512]), (Q4K, false));
        assert_eq!(m(Q4K, "output.weight", &[512, 9]), (Q6K, false));
        assert_eq!(m(Q5K, "blk.3.ffn_up.weight", &[512, 64]), (Q5K, false));
        assert_eq!(m(Q4_0, "token_embd.weight", &[64, 9]), (Q8_0, false));
        assert_eq!(m(Q4_1, "blk.0.ffn_up.weight", &[64, 9]), (Q4_1, false));
        // 576 is no multiple of 256 (SmolLM2's width): Q8_0; 40 is no multiple of 32: F16.
        assert_eq!(m(Q4K, "blk.0.attn_q.weight", &[576, 576]), (Q8_0, true));
        assert_eq!(m(Q4_0, "blk.0.attn_q.weight", &[40, 40]), (F16, true));
        assert_eq!(m(F16, "blk.0.attn_q.weight", &[40, 40]), (F16, false));
    }
}
