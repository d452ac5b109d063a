//! Scale search for the 32-value block types Q4_0, Q4_1, Q5_0 and Q5_1, used for weights
//! ([`crate::Kernels::quantize_row_weights`], what `flowrt pack` writes); activations and
//! quantisation on load keep ggml's reference rounding ([`crate::Kernels::quantize_row`]).
//!
//! The reference rule spans the block's range exactly (Q4_0/Q5_0: the value of largest
//! magnitude maps to the lowest level; Q4_1/Q5_1: min and max map to the end levels), which
//! spends the end levels on one or two extreme values. Here each block
//!
//! 1. rounds with a grid of candidate scales around the range-spanning one (for the symmetric
//!    types both signs: the extreme value at the lowest or at the highest level);
//! 2. for each candidate's integer assignment fits the scale (and offset) by least squares
//!    (closed form from a few sums) and keeps the assignment whose fit has the least squared
//!    error;
//! 3. rounds the fitted scale (and offset) to the f16 the block stores, rounds every value to
//!    its nearest level with those, refits once more, and measures the squared error of the
//!    values the standard decoder gives;
//! 4. keeps the result only if that error is below the reference rule's on the same block, so
//!    no block is ever worse than ggml's reference bytes (ties keep the reference bytes).
//!
//! The error is the plain squared error (no importance weighting), summed in f64 over the
//! values decoded exactly as the dequantiser does (f32 operations in ggml's order). Blocks
//! with a non-finite value keep the reference bytes.

use crate::blocks::{f16_to_f32, f32_to_f16, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, QK};

use super::kquants::pack_q5;

/// Candidate offsets `r` of the level count (see [`search_sym`], [`search_asym`]).
const R_STEPS: usize = 16;
const R_FIRST: f32 = -1.0;
const R_STEP: f32 = 0.2;

/// One block's result: stored scale and offset (f16 bits) and levels (stored, unsigned).
struct Fit {
    d: [u8; 2],
    m: [u8; 2],
    q: [u8; QK],
    err: f64,
}

/// Squared error of a symmetric block `d * (q - off)` against `x`, each value's weighted by
/// `w`, as the decoder computes it.
fn err_sym(x: &[f32], w: &[f32], d: f32, q: &[u8; QK], off: i32) -> f64 {
    x.iter()
        .zip(q)
        .zip(w)
        .map(|((&v, &l), &w)| {
            let e = (v - (l as i32 - off) as f32 * d) as f64;
            w as f64 * e * e
        })
        .sum()
}

/// Squared error of an offset block `d * q + m` against `x`, each value's weighted by `w`, as
/// the decoder computes it.
fn err_asym(x: &[f32], w: &[f32], d: f32, m: f32, q: &[u8; QK]) -> f64 {
    x.iter()
        .zip(q)
        .zip(w)
        .map(|((&v, &l), &w)| {
            let e = (v - (d * l as f32 + m)) as f64;
            w as f64 * e * e
        })
        .sum()
}

/// `v` rounded to the nearest integer (ties to even) for `|v| <= 2^22`: adding and removing
/// 1.5 * 2^23 leaves no fraction bits (no library call, unlike `f32::round` on baseline x86).
#[inline(always)]
fn rnd(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// Nearest levels `0..=top` of `x` for `x ≈ d * (q - off)` (all `off` when `d` is 0).
fn round_sym(x: &[f32], d: f32, off: i32, top: i32) -> [u8; QK] {
    let mut q = [off as u8; QK];
    if d != 0.0 {
        let (lo, hi) = (-off as f32, (top - off) as f32);
        for (l, &v) in q.iter_mut().zip(x) {
            *l = (rnd((v / d).clamp(lo, hi)) as i32 + off) as u8;
        }
    }
    q
}

/// Nearest levels `0..=top` of `x` for `x ≈ d * q + m` (all 0 when `d` is 0).
fn round_asym(x: &[f32], d: f32, m: f32, top: i32) -> [u8; QK] {
    let mut q = [0u8; QK];
    if d != 0.0 {
        for (l, &v) in q.iter_mut().zip(x) {
            *l = rnd(((v - m) / d).clamp(0.0, top as f32)) as u8;
        }
    }
    q
}

/// Candidate rounding of a symmetric block with inverse scale `id`: `(Σ w x q, Σ w q²)` of the
/// signed levels (no array: the search only ranks candidates by these sums).
#[inline(always)]
fn sums_sym(x: &[f32], w: &[f32], id: f32, lo: f32, hi: f32) -> (f32, f32) {
    let (mut sxq, mut sqq) = (0f32, 0f32);
    for (&v, &w) in x.iter().zip(w) {
        let q = rnd((v * id).clamp(lo, hi));
        sxq += w * v * q;
        sqq += w * q * q;
    }
    (sxq, sqq)
}

/// Candidate rounding of an offset block (`q = round((x - min) id)` in `0..=top`):
/// `(Σ w q, Σ w q², Σ w (x - min) q)`.
#[inline(always)]
fn sums_asym(x: &[f32], w: &[f32], min: f32, id: f32, top: f32) -> (f32, f32, f32) {
    let (mut sq, mut sqq, mut sxq) = (0f32, 0f32, 0f32);
    for (&v, &w) in x.iter().zip(w) {
        let y = v - min;
        let q = rnd((y * id).clamp(0.0, top));
        sq += w * q;
        sqq += w * q * q;
        sxq += w * y * q;
    }
    (sq, sqq, sxq)
}

/// Weighted least-squares scale for fixed signed levels `q - off`: `Σ w x q / Σ w q²` and its
/// error `Σwx² − (Σwxq)² / Σwq²` (`None` when every weighted level is 0).
fn fit_sym(x: &[f32], w: &[f32], q: &[u8; QK], off: i32, sxx: f64) -> Option<(f64, f64)> {
    let (mut sxq, mut sqq) = (0f64, 0f64);
    for ((&v, &l), &w) in x.iter().zip(q).zip(w) {
        let s = (l as i32 - off) as f64;
        sxq += w as f64 * v as f64 * s;
        sqq += w as f64 * s * s;
    }
    (sqq > 0.0).then(|| (sxq / sqq, sxx - sxq * sxq / sqq))
}

/// Weighted least-squares scale and offset for fixed levels `q`, and their error (`None` when
/// every level is the same). `n`, `sx`, `sxx`: `Σw`, `Σwx`, `Σwx²`.
fn fit_asym(
    x: &[f32],
    w: &[f32],
    q: &[u8; QK],
    n: f64,
    sx: f64,
    sxx: f64,
) -> Option<(f64, f64, f64)> {
    let (mut sq, mut sqq, mut sxq) = (0f64, 0f64, 0f64);
    for ((&v, &l), &w) in x.iter().zip(q).zip(w) {
        let (s, w) = (l as f64, w as f64);
        sq += w * s;
        sqq += w * s * s;
        sxq += w * v as f64 * s;
    }
    let det = n * sqq - sq * sq;
    if det <= 0.0 {
        return None;
    }
    let d = (n * sxq - sq * sx) / det;
    let m = (sqq * sx - sq * sxq) / det;
    Some((d, m, sxx - d * sxq - m * sx))
}

/// Q4_0 (`half` 8) / Q5_0 (`half` 16): `x ≈ d * (q - half)`, q in `0..2 half`.
fn search_sym(x: &[f32], w: &[f32], half: i32, reference: Fit) -> Fit {
    let top = 2 * half - 1;
    let mx = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if mx == 0.0 || !reference.err.is_finite() {
        return reference;
    }
    let sxx: f64 = x
        .iter()
        .zip(w)
        .map(|(&v, &w)| w as f64 * v as f64 * v as f64)
        .sum();
    // The candidate rounding whose least-squares scale `Σxq / Σq²` leaves the least error
    // (`Σx² − (Σxq)² / Σq²`, so the largest `(Σxq)² / Σq²`).
    let (lo, hi) = (-half as f32, (half - 1) as f32);
    let mut best: Option<(f32, f32)> = None;
    for i in 0..R_STEPS {
        let r = R_FIRST + R_STEP * i as f32;
        // The extreme value at the lowest level (as the reference) or at the highest.
        for levels in [-(half as f32) - r, (half - 1) as f32 + r] {
            let (sxq, sqq) = sums_sym(x, w, levels / mx, lo, hi);
            if sqq > 0.0 {
                let gain = sxq * sxq / sqq;
                if best.is_none_or(|(_, g)| gain > g) {
                    best = Some((sxq / sqq, gain));
                }
            }
        }
    }
    let mut out = reference;
    let Some((d, _)) = best else {
        return out;
    };
    let mut d = d as f64;
    for _ in 0..2 {
        let dh = f32_to_f16(d as f32);
        let df = f16_to_f32(dh);
        let q = round_sym(x, df, half, top);
        let err = err_sym(x, w, df, &q, half);
        if err < out.err {
            out = Fit {
                d: dh,
                m: [0; 2],
                q,
                err,
            };
        }
        match fit_sym(x, w, &q, half, sxx) {
            Some((d2, _)) => d = d2,
            None => break,
        }
    }
    out
}

/// Q4_1 (`top` 15) / Q5_1 (`top` 31): `x ≈ d * q + m`, q in `0..=top`.
fn search_asym(x: &[f32], w: &[f32], top: i32, reference: Fit) -> Fit {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let range = max - min;
    if range <= 0.0 || !range.is_finite() || !reference.err.is_finite() {
        return reference;
    }
    let sw: f64 = w.iter().map(|&w| w as f64).sum();
    let sx: f64 = x.iter().zip(w).map(|(&v, &w)| w as f64 * v as f64).sum();
    let sxx: f64 = x
        .iter()
        .zip(w)
        .map(|(&v, &w)| w as f64 * v as f64 * v as f64)
        .sum();
    // Candidates are fitted on `y = x - min` (fewer cancelling digits than on `x`).
    let sy: f32 = x.iter().zip(w).map(|(&v, &w)| w * (v - min)).sum();
    let syy: f32 = x
        .iter()
        .zip(w)
        .map(|(&v, &w)| w * (v - min) * (v - min))
        .sum();
    let n = w.iter().sum::<f32>();
    let mut best: Option<(f64, f64, f32)> = None;
    for i in 0..R_STEPS {
        let r = R_FIRST + R_STEP * i as f32;
        let (sq, sqq, syq) = sums_asym(x, w, min, (top as f32 + r) / range, top as f32);
        let det = n * sqq - sq * sq;
        if det > 0.0 {
            let d = (n * syq - sq * sy) / det;
            let my = (sqq * sy - sq * syq) / det;
            let e = syy - d * syq - my * sy;
            if best.is_none_or(|b| e < b.2) {
                best = Some((d as f64, (my + min) as f64, e));
            }
        }
    }
    let mut out = reference;
    let Some((mut d, mut m, _)) = best else {
        return out;
    };
    for _ in 0..2 {
        let (dh, mh) = (f32_to_f16(d as f32), f32_to_f16(m as f32));
        let (df, mf) = (f16_to_f32(dh), f16_to_f32(mh));
        let q = round_asym(x, df, mf, top);
        let err = err_asym(x, w, df, mf, &q);
        if err < out.err {
            out = Fit {
                d: dh,
                m: mh,
                q,
                err,
            };
        }
        match fit_asym(x, w, &q, sw, sx, sxx) {
            Some((d2, m2, _)) => (d, m) = (d2, m2),
            None => break,
        }
    }
    out
}

fn finite(x: &[f32]) -> bool {
    x.iter().all(|v| v.is_finite())
}

/// Packs 32 levels (0..=15) as ggml stores them: value j in the low nibble of byte j, j + 16
/// in the high one.
fn pack_nibbles(q: &[u8; QK]) -> [u8; QK / 2] {
    std::array::from_fn(|j| q[j] | (q[j + QK / 2] << 4))
}

/// Weights of one block when none are given: every value counts the same (multiplying by
/// 1.0 is exact, so the unweighted search is bit-for-bit the plain squared error's).
const ONES: [f32; QK] = [1.0; QK];

/// A block's values and weights, and its reference bytes: the reference's [`Fit`].
type ReadFn<'a> = &'a dyn Fn(&[f32], &[f32], &[u8]) -> Fit;
/// A block's values and weights, and the reference's [`Fit`]: the fit to store.
type SearchFn<'a> = &'a dyn Fn(&[f32], &[f32], Fit) -> Fit;

/// The row driver of every type here: each block quantised by `reference` (ggml's rule),
/// then, when all its values are finite, `read` gives the reference block's [`Fit`] (its
/// levels and their error under the block's weights), `search` the fit to store (the
/// reference's unless better), and `write` stores it. `weights`: one per value of the row
/// (an importance per column), or `None` for plain squared error.
#[allow(clippy::too_many_arguments)]
fn search_rows(
    x: &[f32],
    weights: Option<&[f32]>,
    out: &mut [u8],
    size: usize,
    reference: fn(&[f32], &mut [u8]),
    read: ReadFn<'_>,
    search: SearchFn<'_>,
    write: &dyn Fn(&Fit, &mut [u8]),
) {
    for (b, (xb, ob)) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(size))
        .enumerate()
    {
        reference(xb, ob);
        let wb = weights.map_or(&ONES[..], |w| &w[b * QK..(b + 1) * QK]);
        if finite(xb) {
            let f = search(xb, wb, read(xb, wb, ob));
            write(&f, ob);
        }
    }
}

/// The [`Fit`] of a symmetric block's stored scale `d` and levels `q` (offset `off`).
fn sym_fit(xb: &[f32], wb: &[f32], d: [u8; 2], q: [u8; QK], off: i32) -> Fit {
    let err = err_sym(xb, wb, f16_to_f32(d), &q, off);
    Fit {
        d,
        m: [0; 2],
        q,
        err,
    }
}

/// The [`Fit`] of an offset block's stored scale `d`, minimum `m` and levels `q`.
fn asym_fit(xb: &[f32], wb: &[f32], d: [u8; 2], m: [u8; 2], q: [u8; QK]) -> Fit {
    let err = err_asym(xb, wb, f16_to_f32(d), f16_to_f32(m), &q);
    Fit { d, m, q, err }
}

pub(crate) fn quantize_row_q4_0(x: &[f32], w: Option<&[f32]>, out: &mut [u8]) {
    search_rows(
        x,
        w,
        out,
        BlockQ4_0::SIZE,
        super::quant::quantize_row_q4_0,
        &|xb, wb, ob| {
            let r = BlockQ4_0::read(ob);
            sym_fit(xb, wb, r.d, std::array::from_fn(|j| r.q(j)), 8)
        },
        &|xb, wb, f| search_sym(xb, wb, 8, f),
        &|f, ob| {
            BlockQ4_0 {
                d: f.d,
                qs: pack_nibbles(&f.q),
            }
            .write(ob)
        },
    );
}

pub(crate) fn quantize_row_q5_0(x: &[f32], w: Option<&[f32]>, out: &mut [u8]) {
    search_rows(
        x,
        w,
        out,
        BlockQ5_0::SIZE,
        super::kquants::quantize_row_q5_0,
        &|xb, wb, ob| {
            let r = BlockQ5_0::read(ob);
            sym_fit(xb, wb, r.d, std::array::from_fn(|j| r.q(j)), 16)
        },
        &|xb, wb, f| search_sym(xb, wb, 16, f),
        &|f, ob| {
            let (qh, qs) = pack_q5(&f.q);
            BlockQ5_0 { d: f.d, qh, qs }.write(ob)
        },
    );
}

pub(crate) fn quantize_row_q4_1(x: &[f32], w: Option<&[f32]>, out: &mut [u8]) {
    search_rows(
        x,
        w,
        out,
        BlockQ4_1::SIZE,
        super::quant::quantize_row_q4_1,
        &|xb, wb, ob| {
            let r = BlockQ4_1::read(ob);
            asym_fit(xb, wb, r.d, r.m, std::array::from_fn(|j| r.q(j)))
        },
        &|xb, wb, f| search_asym(xb, wb, 15, f),
        &|f, ob| {
            BlockQ4_1 {
                d: f.d,
                m: f.m,
                qs: pack_nibbles(&f.q),
            }
            .write(ob)
        },
    );
}

pub(crate) fn quantize_row_q5_1(x: &[f32], w: Option<&[f32]>, out: &mut [u8]) {
    search_rows(
        x,
        w,
        out,
        BlockQ5_1::SIZE,
        super::kquants::quantize_row_q5_1,
        &|xb, wb, ob| {
            let r = BlockQ5_1::read(ob);
            asym_fit(xb, wb, r.d, r.m, std::array::from_fn(|j| r.q(j)))
        },
        &|xb, wb, f| search_asym(xb, wb, 31, f),
        &|f, ob| {
            let (qh, qs) = pack_q5(&f.q);
            BlockQ5_1 {
                d: f.d,
                m: f.m,
                qh,
                qs,
            }
            .write(ob)
        },
    );
}

/// A block's stored scale (and offset) as chosen by the search, for quantising its values
/// one at a time with error feedback ([`crate::gptq`]): each value then takes the level
/// nearest to it on this grid, and the block is written with those levels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    ty: flowrt_dtype::GgmlType,
    d: [u8; 2],
    m: [u8; 2],
    df: f32,
    mf: f32,
}

impl Grid {
    /// Whether `ty` has a grid here (Q4_0, Q4_1, Q5_0, Q5_1).
    pub(crate) fn supports(ty: flowrt_dtype::GgmlType) -> bool {
        use flowrt_dtype::GgmlType::*;
        matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1)
    }

    /// The grid the weighted search gives the 32 values `xb` with weights `wb`.
    pub(crate) fn search(ty: flowrt_dtype::GgmlType, xb: &[f32], wb: &[f32]) -> Self {
        use flowrt_dtype::GgmlType::*;
        let mut bytes = [0u8; BlockQ5_1::SIZE];
        let (d, m) = match ty {
            Q4_0 => {
                quantize_row_q4_0(xb, Some(wb), &mut bytes[..BlockQ4_0::SIZE]);
                (BlockQ4_0::read(&bytes).d, [0; 2])
            }
            Q4_1 => {
                quantize_row_q4_1(xb, Some(wb), &mut bytes[..BlockQ4_1::SIZE]);
                let b = BlockQ4_1::read(&bytes);
                (b.d, b.m)
            }
            Q5_0 => {
                quantize_row_q5_0(xb, Some(wb), &mut bytes[..BlockQ5_0::SIZE]);
                (BlockQ5_0::read(&bytes).d, [0; 2])
            }
            Q5_1 => {
                quantize_row_q5_1(xb, Some(wb), &mut bytes);
                let b = BlockQ5_1::read(&bytes);
                (b.d, b.m)
            }
            _ => panic!("no block grid for {ty}"),
        };
        Self {
            ty,
            d,
            m,
            df: f16_to_f32(d),
            mf: f16_to_f32(m),
        }
    }

    /// The level nearest to `v` and the value the decoder gives it.
    #[inline]
    pub(crate) fn level(&self, v: f32) -> (u8, f32) {
        use flowrt_dtype::GgmlType::*;
        let (sym, top) = match self.ty {
            Q4_0 => (true, 15),
            Q5_0 => (true, 31),
            Q4_1 => (false, 15),
            _ => (false, 31),
        };
        if sym {
            let off = (top + 1) / 2;
            let l = round_sym(&[v], self.df, off, top)[0];
            (l, (l as i32 - off) as f32 * self.df)
        } else {
            let l = round_asym(&[v], self.df, self.mf, top)[0];
            (l, self.df * l as f32 + self.mf)
        }
    }

    /// Writes the block with levels `q` (from [`Grid::level`]) into `out` (the type's block
    /// size).
    pub(crate) fn write(&self, q: &[u8; QK], out: &mut [u8]) {
        use flowrt_dtype::GgmlType::*;
        match self.ty {
            Q4_0 => BlockQ4_0 {
                d: self.d,
                qs: pack_nibbles(q),
            }
            .write(out),
            Q4_1 => BlockQ4_1 {
                d: self.d,
                m: self.m,
                qs: pack_nibbles(q),
            }
            .write(out),
            Q5_0 => {
                let (qh, qs) = pack_q5(q);
                BlockQ5_0 { d: self.d, qh, qs }.write(out)
            }
            _ => {
                let (qh, qs) = pack_q5(q);
                BlockQ5_1 {
                    d: self.d,
                    m: self.m,
                    qh,
                    qs,
                }
                .write(out)
            }
        }
    }
}
