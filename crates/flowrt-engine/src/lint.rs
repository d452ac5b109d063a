//! Checks for what goes wrong in model ports (issue 15): each [`Finding`] says what is wrong
//! and what it costs, measured where it can be.
//!
//! - `constant-norm` / `injected-qk-norm`: norm weights that are one constant (QK-norm
//!   especially: RMSNorm with γ = 1 still normalises Q and K, so an injected "identity" norm
//!   changes the output). The KL it causes is measured by running the model teacher-forced on
//!   built-in prompts with and without its QK-norm (the family's `qk_norm` switched off in a
//!   copy of its [`flowrt_model::ArchSpec`]).
//! - `replicated-kv-heads`: contiguous groups of K/V heads (head_dim rows of the K and V
//!   projections) identical in every layer: the true KV-head count and the KV cache wasted.
//! - `arch-label`: a family label the tensors contradict (QK-norm all ones without biases: a
//!   Llama stored as Qwen3; Q/K/V biases all zero); `rope-mismatch` and `config-mismatch`
//!   against `--source`; `duplicated-tied-embeddings`.
//! - `tokenizer-mismatch`, `chat-template`, `special-tokens` against `--source`.
//! - `non-finite` tensors (norms, float and quantised matrices) and `denormal-heavy` ones
//!   (norms and float matrices).
//! - `damaged-blocks`: quantised blocks out of line with both their row and their column (a
//!   corrupted scale, a zeroed block), no source needed ([`blocks`]).
//! - `quant-error` against `--source`: quantised matrices much further from the source's than
//!   their type's quantisation explains ([`quant`]).

mod blocks;
mod quant;
mod source;

use std::path::Path;
use std::sync::Arc;

use flowrt_dtype::GgmlType;
use flowrt_model::arch::ARCHS;
use flowrt_model::{ArchSpec, Model, Plan, WeightMatrix};
use half::{bf16, f16};
use serde::Serialize;

use crate::error::EngineError;
use crate::load::{EngineOptions, LoadedModel};
use crate::session::Session;

pub use blocks::{BlockOutliers, OutlierBlock, BLOCK_OUTLIER_RATIO};
pub use quant::{
    BlockError, QuantErrorSummary, TensorQuantError, BLOCK_ERROR_FLOOR, BLOCK_ERROR_RATIO,
    QUANT_ERROR_FLOOR, QUANT_ERROR_RATIO,
};

/// One problem found.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// Which check found it (`injected-qk-norm`, `replicated-kv-heads`, ...).
    pub check: String,
    /// What is wrong.
    pub message: String,
    /// What it costs (memory, accuracy), measured where it can be.
    pub cost: String,
    /// Measured figures, when there are any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<serde_json::Value>,
}

/// Everything `lint` found.
#[derive(Clone, Debug, Serialize)]
pub struct LintReport {
    pub model: String,
    pub arch: String,
    pub source: Option<String>,
    pub findings: Vec<Finding>,
    /// What was checked, for the record.
    pub checks: Vec<String>,
    /// With a source: what the quantisation-error check compared, and its worst tensor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quant_error: Option<QuantErrorSummary>,
    /// The `damaged-blocks` check over every quantised matrix: how close the matrices came to
    /// its bound (flagged or not).
    pub block_outliers: BlockOutlierSummary,
}

/// What the `damaged-blocks` check looked at, and its closest calls.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BlockOutlierSummary {
    pub tensors: usize,
    pub blocks: usize,
    /// The bound: [`BLOCK_OUTLIER_RATIO`].
    pub ratio_bound: f32,
    /// The largest blown-up and shrunk ratios seen, and their tensors.
    pub max_up_ratio: f32,
    pub max_up_tensor: Option<String>,
    pub max_down_ratio: f32,
    pub max_down_tensor: Option<String>,
}

/// Teacher-forced agreement of two runs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Agreement {
    pub positions: usize,
    pub mean_kl: f64,
    pub max_kl: f64,
    pub top1_agreement: f64,
}

/// Text the tokenizers are compared on (with `--source`).
pub const TOKENIZER_CORPUS: &[&str] = &[
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "    indented code: fn main() { println!(\"hi\"); }",
    "Numbers 1234567890 and 3.14159, dates 2026-12-01.",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂👍",
    "  multiple   spaces\tand\ttabs\nnew lines\n\n",
    "<|im_start|>user\nspecial-looking text<|im_end|>",
];

/// Most tokens of one measured prompt.
const MAX_PROMPT_TOKENS: usize = 64;

fn finding(check: &str, message: String, cost: String) -> Finding {
    Finding {
        check: check.into(),
        message,
        cost,
        measured: None,
    }
}

/// Run every check on `model` (and against `source` when given; `source_dir` is where its
/// `generation_config.json` is looked for).
pub fn lint(
    model: &LoadedModel,
    source: Option<&LoadedModel>,
    source_dir: Option<&Path>,
) -> Result<LintReport, EngineError> {
    let m = &model.model;
    let c = &m.config;
    let mut findings = Vec::new();
    let mut checks = vec![
        "norms".to_string(),
        "kv-heads".into(),
        "arch-label".into(),
        "tied-embeddings".into(),
        "non-finite".into(),
        "damaged-blocks".into(),
    ];

    // 1. Constant norms.
    let qk_constant = c.arch.qk_norm
        && !m.layers.is_empty()
        && m.layers.iter().all(|l| {
            [&l.q_norm, &l.k_norm]
                .iter()
                .all(|n| n.as_deref().is_some_and(|v| constant(v).is_some()))
        });
    let qk_ones = qk_constant
        && m.layers.iter().all(|l| {
            [&l.q_norm, &l.k_norm]
                .iter()
                .all(|n| n.as_deref().and_then(constant) == Some(1.0))
        });
    if qk_constant {
        let value = m.layers[0]
            .q_norm
            .as_deref()
            .and_then(constant)
            .unwrap_or(0.0);
        let mut f = finding(
            "injected-qk-norm",
            format!(
                "every q_norm/k_norm weight of all {} layers is the constant {value}: QK-norm that was never trained (injected). RMSNorm with a constant γ still normalises each Q and K head, so it is not an identity{}",
                m.layers.len(),
                match source {
                    Some(s) if !s.model.config.arch.qk_norm => format!(
                        "; the source's family `{}` has no QK-norm, so this is an injected-norm shim",
                        s.model.config.arch.name
                    ),
                    _ => String::new(),
                }
            ),
            String::new(),
        );
        let without = without_qk_norm(model)?;
        let a = agreement(&without, model)?;
        let mut measured = serde_json::json!({ "with_vs_without_qk_norm": a });
        f.cost = format!(
            "changes the output: mean KL {:.4e} (max {:.4e}), top-1 agreement {:.1}% over {} positions, with vs without the QK-norm",
            a.mean_kl,
            a.max_kl,
            a.top1_agreement * 100.0,
            a.positions
        );
        if let Some(s) = source.filter(|s| same_vocab(model, s)) {
            let a = agreement(s, model)?;
            f.cost += &format!(
                "; against the source: mean KL {:.4e}, top-1 {:.1}%",
                a.mean_kl,
                a.top1_agreement * 100.0
            );
            measured["source_vs_model"] = serde_json::to_value(a).unwrap_or_default();
        }
        f.measured = Some(measured);
        findings.push(f);
    }
    let mut constant_norms = Vec::new();
    let mut norm = |name: String, w: &[f32]| {
        if w.len() > 1 {
            if let Some(v) = constant(w) {
                constant_norms.push(format!("{name} = {v}"));
            }
        }
    };
    if let Some(w) = &m.output_norm {
        norm("output_norm".into(), w);
    }
    for (i, l) in m.layers.iter().enumerate() {
        norm(format!("layer {i} attn_norm"), &l.attn_norm);
        norm(format!("layer {i} ffn_norm"), &l.ffn_norm);
        for (n, w) in [
            ("attn_post_norm", &l.attn_post_norm),
            ("ffn_post_norm", &l.ffn_post_norm),
        ] {
            if let Some(w) = w {
                norm(format!("layer {i} {n}"), w);
            }
        }
        if !qk_constant {
            for (n, w) in [("q_norm", &l.q_norm), ("k_norm", &l.k_norm)] {
                if let Some(w) = w {
                    norm(format!("layer {i} {n}"), w);
                }
            }
        }
    }
    if !constant_norms.is_empty() {
        findings.push(finding(
            "constant-norm",
            format!(
                "{} norm weight vector(s) hold one constant (untrained or injected): {}",
                constant_norms.len(),
                abbreviate(&constant_norms)
            ),
            "a trained model's norms are never constant; the weights were likely replaced or never converted".into(),
        ));
    }

    // 2. Replicated KV heads.
    if let Some(r) = kv_replication(m) {
        let true_kv = c.num_key_value_heads / r;
        let per_head_token = 2 * c.head_dim * c.num_hidden_layers * 2; // K and V, f16
        let wasted = (c.num_key_value_heads - true_kv) as u64
            * per_head_token as u64
            * c.max_position_embeddings as u64;
        let total =
            c.num_key_value_heads as u64 * per_head_token as u64 * c.max_position_embeddings as u64;
        let mut f = finding(
            "replicated-kv-heads",
            format!(
                "the K and V projections hold {} KV heads, but each run of {r} adjacent heads is identical in every layer: the model has {true_kv} true KV heads ({} query heads per KV head, not {})",
                c.num_key_value_heads,
                c.num_attention_heads / true_kv,
                c.num_attention_heads / c.num_key_value_heads
            ),
            format!(
                "KV cache {} per sequence at the context length {} (f16) where {} would do: {} wasted ({:.0}%); K/V projection work ×{r}",
                human(total),
                c.max_position_embeddings,
                human(total - wasted),
                human(wasted),
                wasted as f64 * 100.0 / total as f64
            ),
        );
        f.measured = Some(serde_json::json!({
            "stored_kv_heads": c.num_key_value_heads,
            "true_kv_heads": true_kv,
            "kv_cache_bytes": total,
            "wasted_kv_cache_bytes": wasted,
            "context_length": c.max_position_embeddings,
        }));
        findings.push(f);
    }

    // 3. Architecture label vs tensors.
    if qk_ones && !c.arch.qkv_bias {
        findings.push(finding(
            "arch-label",
            format!(
                "labelled `{}`, but its QK-norm is all ones and it has no Q/K/V biases: a Llama-style model relabelled (the label routes it to a family whose forward pass differs)",
                c.arch.name
            ),
            "the label's forward pass (QK-norm) runs on weights trained without it; see injected-qk-norm for the measured cost".into(),
        ));
    }
    if c.arch.qkv_bias
        && !m.layers.is_empty()
        && m.layers.iter().all(|l| {
            [&l.bq, &l.bk, &l.bv]
                .iter()
                .all(|b| b.as_deref().is_none_or(|v| v.iter().all(|&x| x == 0.0)))
        })
    {
        findings.push(finding(
            "arch-label",
            format!(
                "labelled `{}`, whose family has Q/K/V biases, but every bias is zero: likely a model without biases relabelled",
                c.arch.name
            ),
            "no numeric change (zero biases), but the label misstates the model".into(),
        ));
    }
    if let Some(output) = m.output.as_ref().filter(|o| {
        !m.tied_embeddings
            && o.dtype == m.token_embd.dtype
            && o.rows == m.token_embd.rows
            && o.bytes() == m.token_embd.bytes()
    }) {
        let bytes = output.bytes().len() as u64;
        findings.push(finding(
            "duplicated-tied-embeddings",
            format!(
                "the output projection `{}` is byte-identical to the token embeddings `{}`: tied embeddings stored twice",
                output.name, m.token_embd.name
            ),
            format!("{} of weights stored (and read per token) twice", human(bytes)),
        ));
    }

    // 5. Non-finite and denormal-heavy tensors.
    let mut bad = Vec::new();
    let mut outliers = BlockOutlierSummary {
        ratio_bound: BLOCK_OUTLIER_RATIO,
        ..Default::default()
    };
    let mut damaged: Vec<(String, BlockOutliers)> = Vec::new();
    let mut scan = |name: &str, s: Scan| {
        if let Some(g) = &s.grid {
            let o = blocks::check(g);
            outliers.tensors += 1;
            outliers.blocks += o.blocks;
            if o.max_up_ratio > outliers.max_up_ratio {
                outliers.max_up_ratio = o.max_up_ratio;
                outliers.max_up_tensor = Some(name.to_string());
            }
            if o.max_down_ratio > outliers.max_down_ratio {
                outliers.max_down_ratio = o.max_down_ratio;
                outliers.max_down_tensor = Some(name.to_string());
            }
            if o.flagged() > 0 {
                damaged.push((name.to_string(), o));
            }
        }
        if s.non_finite > 0 {
            bad.push((
                "non-finite",
                format!("{name}: {} NaN/Inf of {}", s.non_finite, s.n),
            ));
        } else if s.n > 0 && s.subnormal as f64 > 0.01 * s.n as f64 {
            bad.push((
                "denormal-heavy",
                format!(
                    "{name}: {:.1}% subnormal values",
                    s.subnormal as f64 * 100.0 / s.n as f64
                ),
            ));
        }
    };
    if let Some(w) = &m.output_norm {
        scan("output_norm", scan_f32(w));
    }
    for (i, l) in m.layers.iter().enumerate() {
        let norms = [
            ("attn_norm", Some(&l.attn_norm)),
            ("ffn_norm", Some(&l.ffn_norm)),
            ("q_norm", l.q_norm.as_ref()),
            ("k_norm", l.k_norm.as_ref()),
            ("attn_post_norm", l.attn_post_norm.as_ref()),
            ("ffn_post_norm", l.ffn_post_norm.as_ref()),
            ("bq", l.bq.as_ref()),
            ("bk", l.bk.as_ref()),
            ("bv", l.bv.as_ref()),
        ];
        for (n, w) in norms {
            if let Some(w) = w {
                scan(&format!("layer {i} {n}"), scan_f32(w));
            }
        }
        for w in l.matrices() {
            if let Some(s) = scan_matrix(w) {
                scan(&w.name, s);
            }
        }
    }
    for w in std::iter::once(&m.token_embd).chain(&m.output) {
        if let Some(s) = scan_matrix(w) {
            scan(&w.name, s);
        }
    }
    for kind in ["non-finite", "denormal-heavy"] {
        let list: Vec<String> = bad
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, s)| s.clone())
            .collect();
        if !list.is_empty() {
            findings.push(finding(
                kind,
                format!("{} tensor(s): {}", list.len(), abbreviate(&list)),
                if kind == "non-finite" {
                    "NaN/Inf weights poison every activation they touch: outputs become NaN".into()
                } else {
                    "subnormal arithmetic is slow on many CPUs and suggests broken scaling".into()
                },
            ));
        }
    }

    if !damaged.is_empty() {
        let list: Vec<String> = damaged
            .iter()
            .map(|(name, o)| {
                let mut s = format!(
                    "{name}: {} of {} blocks out of line ({} blown up, {} shrunk)",
                    o.flagged(),
                    o.blocks,
                    o.blown_up,
                    o.shrunk
                );
                if let Some(b) = &o.worst {
                    s += &format!(
                        ", worst row {} block {}: largest |value| {:.3e} against medians {:.3e} (row) and {:.3e} (column)",
                        b.row, b.block, b.absmax, b.row_median, b.column_median
                    );
                }
                s
            })
            .collect();
        let mut f = finding(
            "damaged-blocks",
            format!(
                "{} quantised tensor(s) with blocks over {}x above or below both their row's and their column's median magnitude: {}",
                damaged.len(),
                BLOCK_OUTLIER_RATIO,
                abbreviate(&list)
            ),
            "a corrupted block scale or a zeroed block changes every output that reads it; run `lint --source` or `flowrt diff` against the source to measure what it costs".into(),
        );
        f.measured = Some(serde_json::json!({
            "tensors": damaged
                .iter()
                .map(|(name, o)| serde_json::json!({ "tensor": name, "outliers": o }))
                .collect::<Vec<_>>(),
        }));
        findings.push(f);
    }
    // 3 and 4 against the source.
    let mut quant_error = None;
    if let Some(s) = source {
        checks.extend(
            [
                "rope",
                "config",
                "tokenizer",
                "chat-template",
                "special-tokens",
                "quant-error",
            ]
            .map(String::from),
        );
        findings.extend(source::against_source(model, s, source_dir)?);
        let (summary, finding) = quant::check(&model.model, &s.model);
        findings.extend(finding);
        quant_error = Some(summary);
    }

    Ok(LintReport {
        model: model.path.display().to_string(),
        arch: c.arch.name.to_string(),
        source: source.map(|s| s.path.display().to_string()),
        findings,
        checks,
        quant_error,
        block_outliers: outliers,
    })
}

/// The value every element holds, if they are all equal.
fn constant(v: &[f32]) -> Option<f32> {
    let first = *v.first()?;
    v.iter().all(|&x| x == first).then_some(first)
}

/// The largest `r > 1` dividing the KV-head count such that every run of `r` adjacent KV
/// heads has identical K and V rows (and biases) in every layer.
fn kv_replication(m: &Model) -> Option<usize> {
    let c = &m.config;
    let n = c.num_key_value_heads;
    let hd = c.head_dim;
    let same = |r: usize| {
        m.layers.iter().all(|l| {
            (0..n).all(|h| {
                let base = h - h % r;
                if base == h {
                    return true;
                }
                // A short convolution layer has no K or V.
                let rows = |w: &Option<WeightMatrix>| {
                    w.as_ref().is_none_or(|w| {
                        w.rows_bytes(h * hd, (h + 1) * hd)
                            == w.rows_bytes(base * hd, (base + 1) * hd)
                    })
                };
                let bias = |b: &Option<Vec<f32>>| {
                    b.as_ref()
                        .is_none_or(|b| b[h * hd..(h + 1) * hd] == b[base * hd..(base + 1) * hd])
                };
                rows(&l.wk) && rows(&l.wv) && bias(&l.bk) && bias(&l.bv)
            })
        })
    };
    let attends = m.layers.iter().find_map(|l| l.wk.as_ref());
    if attends.is_none_or(|wk| wk.rows != n * hd) {
        return None;
    }
    (2..=n)
        .rev()
        .filter(|r| n.is_multiple_of(*r))
        .find(|&r| same(r))
}

/// Counts of non-finite and subnormal values.
#[derive(Default)]
struct Scan {
    n: usize,
    non_finite: usize,
    subnormal: usize,
    /// Quantised matrices: each block's largest |value|.
    grid: Option<blocks::BlockGrid>,
}

impl Scan {
    fn add(&mut self, x: f32) {
        self.n += 1;
        self.non_finite += usize::from(!x.is_finite());
        self.subnormal += usize::from(x.is_subnormal());
    }
}

fn scan_f32(v: &[f32]) -> Scan {
    let mut s = Scan::default();
    v.iter().for_each(|&x| s.add(x));
    s
}

/// Float matrices value by value; quantised ones dequantised row by row (on every core), for
/// non-finite values only: a NaN or infinite block scale makes its whole block non-finite,
/// and a subnormal product of a small scale is no sign of broken scaling. `None` for a type
/// flowrt cannot dequantise.
fn scan_matrix(w: &WeightMatrix) -> Option<Scan> {
    let b = w.bytes();
    let mut s = Scan::default();
    match w.dtype {
        t if !matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => {
            if !flowrt_kernels::Kernels::supports_conversion(t) {
                return None;
            }
            let k = flowrt_kernels::Kernels::detect();
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let per = w.rows.div_ceil(threads).max(1);
            let bs = (t.block_size() as usize).max(1);
            let per_row = w.cols / bs;
            let parts = std::thread::scope(|scope| {
                let parts: Vec<_> = (0..w.rows)
                    .step_by(per)
                    .map(|r0| {
                        scope.spawn(move || {
                            let mut row = vec![0f32; w.cols];
                            let mut bad = 0usize;
                            let mut absmax = Vec::with_capacity(per * per_row);
                            for r in r0..(r0 + per).min(w.rows) {
                                k.dequantize_row(t, w.rows_bytes(r, r + 1), &mut row);
                                bad += row.iter().filter(|x| !x.is_finite()).count();
                                absmax.extend(row.chunks_exact(bs).map(|b| {
                                    if b.iter().all(|x| x.is_finite()) {
                                        b.iter().fold(0f32, |m, x| m.max(x.abs()))
                                    } else {
                                        f32::NAN
                                    }
                                }));
                            }
                            (bad, absmax)
                        })
                    })
                    .collect();
                parts
                    .into_iter()
                    .map(|h| h.join().unwrap_or((usize::MAX, Vec::new())))
                    .collect::<Vec<_>>()
            });
            let counts = parts.iter().fold(0usize, |a, p| a.saturating_add(p.0));
            let absmax: Vec<f32> = parts.into_iter().flat_map(|p| p.1).collect();
            s.grid = Some(blocks::BlockGrid {
                rows: w.rows,
                per_row,
                absmax,
            });
            s.n = w.rows * w.cols;
            s.non_finite = counts;
        }
        GgmlType::F32 => b
            .chunks_exact(4)
            .for_each(|c| s.add(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        // A subnormal f16 becomes a normal f32: count it as the subnormal it was.
        GgmlType::F16 => b.chunks_exact(2).for_each(|c| {
            let h = f16::from_le_bytes([c[0], c[1]]);
            let bits = h.to_bits();
            s.add(if bits & 0x7c00 == 0 && bits & 0x03ff != 0 {
                f32::MIN_POSITIVE / 2.0
            } else {
                h.to_f32()
            })
        }),
        GgmlType::BF16 => b
            .chunks_exact(2)
            .for_each(|c| s.add(bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        _ => return None,
    }
    Some(s)
}

fn same_vocab(a: &LoadedModel, b: &LoadedModel) -> bool {
    a.model.config.vocab_size == b.model.config.vocab_size
        && a.tokenizer.vocab_size() == b.tokenizer.vocab_size()
}

/// Every family of [`ARCHS`] with its QK-norm switched off, in the same order: a model's
/// config holds a `&'static ArchSpec`, and these are what [`without_qk_norm`] points it at.
static WITHOUT_QK_NORM: [ArchSpec; ARCHS.len()] = {
    let mut out = [flowrt_model::arch::LLAMA; ARCHS.len()];
    let mut i = 0;
    while i < ARCHS.len() {
        out[i] = ArchSpec {
            qk_norm: false,
            ..*ARCHS[i]
        };
        i += 1;
    }
    out
};

/// A copy of `model` with its family's QK-norm switched off.
fn without_qk_norm(model: &LoadedModel) -> Result<LoadedModel, EngineError> {
    let mut m: Model = (*model.model).clone();
    let Some(i) = ARCHS.iter().position(|a| *a == m.config.arch) else {
        return Err(EngineError::Invalid(format!(
            "cannot measure the QK-norm of family `{}`: not one of flowrt's families",
            m.config.arch.name
        )));
    };
    m.config.arch = &WITHOUT_QK_NORM[i];
    for l in &mut m.layers {
        l.q_norm = None;
        l.k_norm = None;
    }
    let mut copy = LoadedModel::load(&model.path)?;
    copy.plan = Arc::new(Plan::new(&m.config));
    copy.model = Arc::new(m);
    Ok(copy)
}

/// The built-in prompts (the set `pack`'s gate and `diff` use) as `model`'s token ids.
fn prompt_ids(model: &LoadedModel) -> Result<Vec<Vec<u32>>, EngineError> {
    let mut out = crate::compare::builtin_prompts(&model.tokenizer, model.template.as_ref(), &[])?;
    for ids in &mut out {
        ids.truncate(MAX_PROMPT_TOKENS.min(model.model_ctx()));
    }
    out.retain(|ids| ids.len() >= 2);
    Ok(out)
}

/// KL(reference ‖ other) and top-1 agreement, teacher-forced on the built-in prompts
/// (tokenized by `reference`, at most [`MAX_PROMPT_TOKENS`] each), measured by
/// [`crate::compare_models`] as `pack`'s gate does.
pub fn agreement(reference: &LoadedModel, other: &LoadedModel) -> Result<Agreement, EngineError> {
    let prompts = prompt_ids(reference)?;
    let opts = EngineOptions {
        n_ctx: Some(
            MAX_PROMPT_TOKENS
                .min(reference.model_ctx())
                .min(other.model_ctx()),
        ),
        ..EngineOptions::default()
    };
    let mut sa = Session::new(reference, &opts)?;
    let mut sb = Session::new(other, &opts)?;
    let r = crate::compare::compare_models(&mut sa, &mut sb, &prompts)?;
    Ok(Agreement {
        positions: r.positions,
        mean_kl: r.mean_kl,
        max_kl: r.max_kl,
        top1_agreement: r.top1_agreement,
    })
}

fn abbreviate(items: &[String]) -> String {
    const SHOWN: usize = 4;
    let mut s = items[..items.len().min(SHOWN)].join(", ");
    if items.len() > SHOWN {
        s += &format!(", ... ({} more)", items.len() - SHOWN);
    }
    s
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_detects_only_constant_vectors() {
        assert_eq!(constant(&[1.0, 1.0, 1.0]), Some(1.0));
        assert_eq!(constant(&[1.0, 1.0, 0.5]), None);
        assert_eq!(constant(&[]), None);
    }

    #[test]
    fn scan_counts_non_finite_and_subnormal() {
        let s = scan_f32(&[1.0, f32::NAN, f32::INFINITY, 1e-40, 0.0]);
        assert_eq!((s.n, s.non_finite, s.subnormal), (5, 2, 1));
    }
}
