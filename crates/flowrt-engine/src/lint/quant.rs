//! `quant-error` (with `--source`): quantised matrices much further from the source's than
//! their type's quantisation explains.
//!
//! Every quantised matrix of the model (token embeddings, output projection, each layer's
//! attention, feed-forward and convolution projections, routers and experts) is compared with the source's matrix of the same role, both dequantised, rows in
//! one order: GGUF files of families that store Q/K permuted for adjacent-pair RoPE (llama)
//! are read back in HF's half-split order first. Its relative RMS error
//! `‖model − source‖ / ‖source‖` is set against the error the type normally gives: the source's
//! own values requantised to the model's type with flowrt's quantisers and dequantised again.
//! A tensor is flagged when its error is more than [`QUANT_ERROR_RATIO`] times that and above
//! [`QUANT_ERROR_FLOOR`]: quantisation alone does not explain it (corrupted scales, a wrong
//! conversion, weights from another checkpoint).
//!
//! Each quantisation block is also compared on its own, since a few damaged blocks hide in a
//! large tensor's average: a block is flagged when its relative error is above
//! [`BLOCK_ERROR_FLOOR`] and more than [`BLOCK_ERROR_RATIO`] times what the type gives on it.
//!
//! A file quantised more carefully than flowrt's quantiser does (a search over scales, an
//! importance matrix) has a ratio below 1, not above: it is never flagged for that. Norm vectors are not compared
//! (they are stored in f32 and the loader has already applied the Gemma `1 + w` offset of HF
//! checkpoints); matrices whose shapes differ (replicated KV heads) or whose types flowrt
//! cannot convert are left out and counted.

use flowrt_dtype::GgmlType;
use flowrt_kernels::Kernels;
use flowrt_model::{MatRole, Model, ModelFormat, RopePairing, WeightMatrix};
use serde::Serialize;

use super::{abbreviate, finding, Finding};

/// A tensor is flagged when its relative RMS error exceeds this multiple of its type's.
pub const QUANT_ERROR_RATIO: f64 = 3.0;
/// Nor is a relative RMS error below this ever flagged (a typical error of 0: the source
/// re-stored losslessly, or already in the model's type).
pub const QUANT_ERROR_FLOOR: f64 = 1e-3;

/// One quantised matrix against the source's.
#[derive(Clone, Debug, Serialize)]
pub struct TensorQuantError {
    pub tensor: String,
    pub dtype: String,
    /// `‖model − source‖ / ‖source‖` over the whole tensor (both dequantised).
    pub rel_rms_err: f64,
    /// The same for the source requantised to `dtype` by flowrt's quantiser: what the type
    /// normally costs on these values.
    pub typical: f64,
    /// `rel_rms_err / typical` (infinite when `typical` is 0).
    pub ratio: f64,
    /// Quantisation blocks compared, and those far from the source on their own (a few
    /// damaged blocks hide in a large tensor's average): relative error above
    /// [`BLOCK_ERROR_FLOOR`] and more than [`BLOCK_ERROR_RATIO`] times the type's on the block.
    pub blocks: usize,
    pub bad_blocks: usize,
    /// The bad block with the highest relative error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_block: Option<BlockError>,
}

impl TensorQuantError {
    fn flagged(&self) -> bool {
        self.bad_blocks > 0 || self.tensor_flagged()
    }

    /// Flagged for the whole tensor's error.
    fn tensor_flagged(&self) -> bool {
        self.rel_rms_err > QUANT_ERROR_FLOOR && self.rel_rms_err > QUANT_ERROR_RATIO * self.typical
    }
}

fn is_float(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Stored row holding half-split (HF-order) row `s` of `m`'s matrix of `role`.
fn stored_row(m: &Model, role: Option<MatRole>, s: usize) -> usize {
    let c = &m.config;
    let permuted = m.format == ModelFormat::Gguf
        && c.arch.gguf_rope_pairing == RopePairing::Adjacent
        && matches!(role, Some(MatRole::Q | MatRole::K));
    if !permuted || c.head_dim < 2 {
        return s;
    }
    // llama's converter stores HF row h*hd + j*hd/2 + i at row h*hd + 2i + j.
    let hd = c.head_dim;
    let (h, within) = (s / hd, s % hd);
    let (j, i) = (within / (hd / 2), within % (hd / 2));
    h * hd + 2 * i + j
}

/// One quantisation block far from the source (see [`Measured::bad_blocks`]).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct BlockError {
    /// The block's row (HF order) and first column.
    pub row: usize,
    pub col: usize,
    /// `‖model − source‖ / ‖source‖` over the block.
    pub rel_err: f64,
    /// The same for the source's block requantised by flowrt.
    pub typical: f64,
}

/// What [`measure`] sums over a matrix.
#[derive(Clone, Copy, Debug, Default)]
struct Measured {
    /// ‖model − source‖², ‖source‖², ‖requantised source − source‖².
    err: f64,
    norm: f64,
    typ: f64,
    blocks: usize,
    /// Blocks whose relative error is above [`BLOCK_ERROR_FLOOR`] and more than
    /// [`BLOCK_ERROR_RATIO`] times what the type gives on that block.
    bad_blocks: usize,
    /// The bad block with the highest relative error.
    worst: Option<BlockError>,
}

impl Measured {
    fn merge(mut self, o: Measured) -> Measured {
        self.err += o.err;
        self.norm += o.norm;
        self.typ += o.typ;
        self.blocks += o.blocks;
        self.bad_blocks += o.bad_blocks;
        if o.worst
            .is_some_and(|w| self.worst.is_none_or(|s| w.rel_err > s.rel_err))
        {
            self.worst = o.worst;
        }
        self
    }
}

/// A block is flagged when its relative error exceeds this multiple of the type's on it...
pub const BLOCK_ERROR_RATIO: f64 = 4.0;
/// ... and this: half the block's own size. No honest 4-bit block comes near (their relative
/// errors are around 0.1); a zeroed, rescaled or overwritten block goes past it.
pub const BLOCK_ERROR_FLOOR: f64 = 0.5;

/// Sums over rows and per-block errors (see [`Measured`]). A block's norm is taken as at
/// least a tenth of its row's RMS, so near-zero source blocks do not turn rounding into a
/// large relative error.
fn measure(
    k: &Kernels,
    (model, m): (&Model, &WeightMatrix),
    (source, s): (&Model, &WeightMatrix),
    role: Option<MatRole>,
) -> Measured {
    let bs = (m.dtype.block_size() as usize).max(1);
    let cols = m.cols;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = m.rows.div_ceil(threads).max(1);
    let q_row = flowrt_kernels::row_size(m.dtype, cols);
    std::thread::scope(|scope| {
        let parts: Vec<_> = (0..m.rows)
            .step_by(per)
            .map(|r0| {
                scope.spawn(move || {
                    let (mut fm, mut fs, mut fq) =
                        (vec![0f32; cols], vec![0f32; cols], vec![0f32; cols]);
                    let mut q = vec![0u8; q_row];
                    let mut t = Measured::default();
                    for r in r0..(r0 + per).min(m.rows) {
                        let mr = stored_row(model, role, r);
                        let sr = stored_row(source, role, r);
                        k.dequantize_row(m.dtype, m.rows_bytes(mr, mr + 1), &mut fm);
                        k.dequantize_row(s.dtype, s.rows_bytes(sr, sr + 1), &mut fs);
                        k.quantize_row_weights(m.dtype, &fs, &mut q);
                        k.dequantize_row(m.dtype, &q, &mut fq);
                        let row_norm: f64 = fs.iter().map(|&b| b as f64 * b as f64).sum();
                        let floor = 0.01 * row_norm / cols as f64;
                        for (c0, ((a, b), c)) in fm
                            .chunks(bs)
                            .zip(fs.chunks(bs))
                            .zip(fq.chunks(bs))
                            .enumerate()
                        {
                            let (mut e, mut n, mut y) = (0f64, 0f64, 0f64);
                            for ((&a, &b), &c) in a.iter().zip(b).zip(c) {
                                let (a, b, c) = (a as f64, b as f64, c as f64);
                                e += (a - b) * (a - b);
                                n += b * b;
                                y += (c - b) * (c - b);
                            }
                            t.err += e;
                            t.norm += n;
                            t.typ += y;
                            t.blocks += 1;
                            let d = n.max(floor * b.len() as f64);
                            let (rel, typical) = match (d > 0.0, e > 0.0) {
                                (true, _) => ((e / d).sqrt(), (y / d).sqrt()),
                                (false, true) => (f64::INFINITY, 0.0),
                                (false, false) => (0.0, 0.0),
                            };
                            // NaN (a non-finite block) counts as bad.
                            let bad = rel.is_nan()
                                || (rel > BLOCK_ERROR_FLOOR && rel > BLOCK_ERROR_RATIO * typical);
                            if bad {
                                t.bad_blocks += 1;
                                let blk = BlockError {
                                    row: r,
                                    col: c0 * bs,
                                    rel_err: rel,
                                    typical,
                                };
                                if t.worst.is_none_or(|w| rel.is_nan() || rel > w.rel_err) {
                                    t.worst = Some(blk);
                                }
                            }
                        }
                    }
                    t
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|h| h.join().expect("quant-error worker panicked"))
            .fold(Measured::default(), Measured::merge)
    })
}

/// Every comparable quantised matrix of `model` against `source`'s, and how many were left
/// out (shape or type).
pub(super) fn compare(model: &Model, source: &Model) -> (Vec<TensorQuantError>, usize) {
    let k = Kernels::detect();
    let mut pairs: Vec<(Option<MatRole>, &WeightMatrix, &WeightMatrix)> =
        vec![(None, &model.token_embd, &source.token_embd)];
    if let (false, Some(a), Some(b)) = (model.tied_embeddings, &model.output, &source.output) {
        pairs.push((Some(MatRole::Output), a, b));
    }
    let mut skipped = 0;
    use MatRole::*;
    for l in 0..model.layers.len().min(source.layers.len()) {
        for role in [Q, K, V, O, Gate, Up, Down, ConvIn, ConvOut] {
            if let (Some(a), Some(b)) = (model.matrix(Some(l), role), source.matrix(Some(l), role))
            {
                pairs.push((Some(role), a, b));
            }
        }
        // Experts (and their router) matrix by matrix, in the same order.
        if let (Some(a), Some(b)) = (&model.layers[l].moe, &source.layers[l].moe) {
            if a.gate.len() == b.gate.len() {
                pairs.push((None, &a.router, &b.router));
                pairs.extend(a.experts().zip(b.experts()).map(|(x, y)| (None, x, y)));
            } else {
                skipped += 1;
            }
        }
    }
    let mut out = Vec::new();
    for (role, m, s) in pairs {
        if is_float(m.dtype) {
            continue;
        }
        let convertible =
            Kernels::supports_conversion(m.dtype) && Kernels::supports_conversion(s.dtype);
        if (m.rows, m.cols) != (s.rows, s.cols) || !convertible {
            skipped += 1;
            continue;
        }
        let Measured {
            err,
            norm,
            typ,
            blocks,
            bad_blocks,
            worst,
        } = measure(k, (model, m), (source, s), role);
        let rel = |x: f64| {
            if x == 0.0 {
                0.0
            } else if norm == 0.0 {
                f64::INFINITY
            } else {
                (x / norm).sqrt()
            }
        };
        let (rel_rms_err, typical) = (rel(err), rel(typ));
        out.push(TensorQuantError {
            tensor: m.name.clone(),
            dtype: m.dtype.to_string(),
            rel_rms_err,
            typical,
            ratio: if rel_rms_err == 0.0 {
                0.0
            } else {
                rel_rms_err / typical
            },
            blocks,
            bad_blocks,
            worst_block: worst,
        });
    }
    (out, skipped)
}

/// What the check compared, flagged or not: for the record (and to show how far from the
/// bound the worst tensor is).
#[derive(Clone, Debug, Serialize)]
pub struct QuantErrorSummary {
    pub tensors_compared: usize,
    /// Left out: shapes that differ from the source's, or types flowrt cannot convert.
    pub tensors_skipped: usize,
    /// The tensor with the highest ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<TensorQuantError>,
}

/// The summary, and the `quant-error` finding if any tensor is flagged.
pub(super) fn check(model: &Model, source: &Model) -> (QuantErrorSummary, Option<Finding>) {
    let (all, skipped) = compare(model, source);
    let summary = QuantErrorSummary {
        tensors_compared: all.len(),
        tensors_skipped: skipped,
        worst: all
            .iter()
            .filter(|t| t.rel_rms_err > 0.0)
            .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
            .cloned(),
    };
    let flagged: Vec<&TensorQuantError> = all.iter().filter(|t| t.flagged()).collect();
    if flagged.is_empty() {
        return (summary, None);
    }
    let list: Vec<String> = flagged
        .iter()
        .map(|t| {
            let mut s = format!(
                "{} ({}): relative RMS error {:.3e} where requantising the source to {} gives {:.3e} ({:.1}x)",
                t.tensor, t.dtype, t.rel_rms_err, t.dtype, t.typical, t.ratio
            );
            if let (n, Some(b)) = (t.bad_blocks, t.worst_block) {
                s += &format!(
                    "; {n} of {} blocks far from the source on their own (worst: row {}, columns {}.., relative error {:.3} where the type gives {:.3})",
                    t.blocks, b.row, b.col, b.rel_err, b.typical
                );
            }
            s
        })
        .collect();
    let mut f = finding(
        "quant-error",
        format!(
            "{} of {} quantised tensor(s) are much further from the source than their type's quantisation explains (more than {QUANT_ERROR_RATIO}x over the tensor, or blocks more than {BLOCK_ERROR_RATIO}x and above {BLOCK_ERROR_FLOOR} relative error): {}",
            flagged.len(),
            all.len(),
            abbreviate(&list)
        ),
        "these weights are damaged or are not the source's (corrupted scales, a wrong conversion), not merely quantised: the layers using them compute something else".into(),
    );
    f.measured = Some(serde_json::json!({
        "flagged": flagged,
        "tensors_compared": all.len(),
        "tensors_skipped": skipped,
        "ratio_threshold": QUANT_ERROR_RATIO,
        "block_ratio_threshold": BLOCK_ERROR_RATIO,
        "block_error_floor": BLOCK_ERROR_FLOOR,
    }));
    (summary, Some(f))
}
