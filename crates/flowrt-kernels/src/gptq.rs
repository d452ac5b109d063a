//! Error-feedback quantisation of weight matrices (the GPTQ method: Frantar et al., 2022)
//! for the 32-value block types Q4_0, Q4_1, Q5_0 and Q5_1, what `flowrt pack --gptq` writes.
//!
//! A matrix `W` (rows of `n` input columns) multiplies inputs `x` whose second moments
//! `H = E[x xᵀ]` were measured on calibration text. Rounding each value to its nearest level
//! minimises `‖W − Q‖²`; what matters is the output error `E‖(W − Q) x‖² = Σ_rows eᵀ H e`.
//! Each row is therefore quantised one column at a time, and the rounding error of column
//! `j` is spread over the columns not yet quantised so as to cancel its effect on the
//! output as far as `H` allows: with `U` the upper Cholesky factor of `H⁻¹` (`Uᵀ U = H⁻¹`),
//! `e = (w_j − q_j) / U_jj` and `w_k −= e · U_jk` for `k > j`. Rows are independent.
//!
//! Block formats stay the same (llama.cpp reads the files unchanged): when a row reaches a
//! block's first column, the block's scale (and offset) are chosen by the importance-
//! weighted search of [`crate::Kernels::quantize_row_weighted`] on the values as they are
//! then (already moved by the errors of the earlier blocks), weighted by `diag H`; each value
//! then takes the level of that grid nearest to it.
//!
//! `H` is damped by a hundredth of its mean diagonal (as the method's authors do), which
//! keeps the factorisation defined when columns are correlated or never active.

use flowrt_dtype::GgmlType;

use crate::blocks::QK;
use crate::row_size;
use crate::scalar::legacy_search::Grid;

/// Why a matrix cannot be quantised with error feedback.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GptqError {
    #[error("the input second moments are not finite")]
    NotFinite,
    #[error("every input second moment is zero (no calibration activations)")]
    NoActivations,
    #[error("the damped second-moment matrix is not positive definite at column {0}")]
    NotPositiveDefinite(usize),
    #[error("{0} has no error-feedback quantiser (Q4_0, Q4_1, Q5_0, Q5_1 have)")]
    Unsupported(GgmlType),
    #[error("shape: {0}")]
    Shape(String),
}

/// The factor [`quantize_matrix`] spreads errors with: the upper triangular `U` (row-major,
/// `n × n`) with `Uᵀ U = (H + λ I)⁻¹`, and the damped diagonal of `H` (the block searches'
/// importances).
#[derive(Clone, Debug)]
pub struct Factor {
    n: usize,
    u: Vec<f32>,
    diag: Vec<f32>,
}

/// Fraction of the mean diagonal added to the diagonal of `H`.
pub const DAMP: f64 = 0.01;

impl Factor {
    /// Factors `gram` (`n × n`, row-major, symmetric: the sum or mean of `x xᵀ` over the
    /// calibration inputs; only the scale-free shape matters) on up to `threads` threads.
    pub fn new(gram: &[f32], n: usize, threads: usize) -> Result<Self, GptqError> {
        if gram.len() != n * n || n == 0 {
            return Err(GptqError::Shape(format!(
                "{} values for a {n} x {n} matrix",
                gram.len()
            )));
        }
        if !gram.iter().all(|v| v.is_finite()) {
            return Err(GptqError::NotFinite);
        }
        let mean = (0..n).map(|i| gram[i * n + i] as f64).sum::<f64>() / n as f64;
        if mean <= 0.0 {
            return Err(GptqError::NoActivations);
        }
        let damp = DAMP * mean;
        // Scale to a unit mean diagonal (the factor's scale cancels in `e · U_jk / U_jj`).
        let s = 1.0 / mean;
        let mut h: Vec<f64> = gram.iter().map(|&v| v as f64 * s).collect();
        for i in 0..n {
            h[i * n + i] += damp * s;
        }
        let diag: Vec<f32> = (0..n).map(|i| h[i * n + i] as f32).collect();
        let v = upper_cholesky(&h, n)?;
        let u = invert_upper(&v, n, threads.max(1));
        Ok(Self { n, u, diag })
    }

    /// The row length (input columns) this factor is for.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `U` (`n × n`, row-major, upper triangular) for `H` scaled to a unit mean diagonal.
    pub fn upper(&self) -> &[f32] {
        &self.u
    }
}

/// The upper triangular `V` with `V Vᵀ = h` (a Cholesky factorisation taken from the last
/// column backwards), row-major, in f64.
fn upper_cholesky(h: &[f64], n: usize) -> Result<Vec<f64>, GptqError> {
    let mut v = vec![0f64; n * n];
    for j in (0..n).rev() {
        let s: f64 = v[j * n + j + 1..(j + 1) * n].iter().map(|x| x * x).sum();
        let d = h[j * n + j] - s;
        if d <= 0.0 || !d.is_finite() {
            return Err(GptqError::NotPositiveDefinite(j));
        }
        let d = d.sqrt();
        v[j * n + j] = d;
        for i in 0..j {
            let dot: f64 = v[i * n + j + 1..(i + 1) * n]
                .iter()
                .zip(&v[j * n + j + 1..(j + 1) * n])
                .map(|(a, b)| a * b)
                .sum();
            v[i * n + j] = (h[i * n + j] - dot) / d;
        }
    }
    Ok(v)
}

/// `V⁻¹` of an upper triangular `V` (upper triangular too), row-major, in f32. Row `i` of the
/// inverse solves `U V = I` left to right, so each row is independent: rows are split over
/// `threads`.
fn invert_upper(v: &[f64], n: usize, threads: usize) -> Vec<f32> {
    let mut u = vec![0f32; n * n];
    let row = |i: usize, out: &mut [f32]| {
        // acc[j] = Σ_{k < j} U_ik V_kj for the columns j not yet solved.
        let mut acc = vec![0f64; n];
        for k in i..n {
            let target = if k == i { 1.0 } else { 0.0 };
            let uk = (target - acc[k]) / v[k * n + k];
            out[k] = uk as f32;
            if uk != 0.0 {
                for (a, &vk) in acc[k + 1..].iter_mut().zip(&v[k * n + k + 1..(k + 1) * n]) {
                    *a += uk * vk;
                }
            }
        }
    };
    let chunk = n.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (c, rows) in u.chunks_mut(chunk * n).enumerate() {
            s.spawn(move || {
                for (r, out) in rows.chunks_mut(n).enumerate() {
                    row(c * chunk + r, out);
                }
            });
        }
    });
    u
}

/// Whether [`quantize_matrix`] takes `ty` (Q4_0, Q4_1, Q5_0, Q5_1).
pub fn supports(ty: GgmlType) -> bool {
    Grid::supports(ty)
}

/// Rows quantised together: a row of `U` is read once for all of them.
const TILE: usize = 8;

/// Quantises `w` (`rows × n` f32 values, row-major; overwritten with the error-adjusted
/// values) to `ty` with error feedback through `factor`, writing `rows` rows of `ty` blocks
/// to `out`, on up to `threads` threads. Rows with a non-finite value are quantised without
/// error feedback (the plain weighted search).
pub fn quantize_matrix(
    ty: GgmlType,
    w: &mut [f32],
    factor: &Factor,
    out: &mut [u8],
    threads: usize,
) -> Result<(), GptqError> {
    let n = factor.n;
    if !Grid::supports(ty) {
        return Err(GptqError::Unsupported(ty));
    }
    if !n.is_multiple_of(QK) || !w.len().is_multiple_of(n) {
        return Err(GptqError::Shape(format!(
            "{} values in rows of {n} for {ty}",
            w.len()
        )));
    }
    let rows = w.len() / n;
    let out_row = row_size(ty, n);
    if out.len() != rows * out_row {
        return Err(GptqError::Shape(format!(
            "{} output bytes for {rows} rows of {out_row}",
            out.len()
        )));
    }
    let per = rows.div_ceil(threads.max(1)).div_ceil(TILE).max(1) * TILE;
    std::thread::scope(|s| {
        for (wc, oc) in w.chunks_mut(per * n).zip(out.chunks_mut(per * out_row)) {
            s.spawn(move || {
                for (wt, ot) in wc.chunks_mut(TILE * n).zip(oc.chunks_mut(TILE * out_row)) {
                    tile(ty, wt, factor, ot);
                }
            });
        }
    });
    Ok(())
}

/// Up to [`TILE`] rows, column by column.
fn tile(ty: GgmlType, w: &mut [f32], f: &Factor, out: &mut [u8]) {
    let n = f.n;
    let size = row_size(ty, QK);
    let out_row = row_size(ty, n);
    let mut rows: Vec<&mut [f32]> = w.chunks_mut(n).collect();
    let mut outs: Vec<&mut [u8]> = out.chunks_mut(out_row).collect();
    // Rows that are not finite take the plain weighted search and no feedback.
    let mut live = Vec::with_capacity(rows.len());
    for (r, o) in rows.iter().zip(outs.iter_mut()) {
        let ok = r.iter().all(|v| v.is_finite());
        if !ok {
            crate::Kernels::scalar().quantize_row_weighted(ty, r, Some(&f.diag), o);
        }
        live.push(ok);
    }
    let mut grids = Vec::with_capacity(rows.len());
    let mut levels = vec![[0u8; QK]; rows.len()];
    let mut err = vec![0f32; rows.len()];
    for b in 0..n / QK {
        let c0 = b * QK;
        grids.clear();
        for r in rows.iter() {
            grids.push(Grid::search(ty, &r[c0..c0 + QK], &f.diag[c0..c0 + QK]));
        }
        for j in c0..c0 + QK {
            let ujj = f.u[j * n + j];
            for (r, row) in rows.iter_mut().enumerate() {
                let (l, q) = grids[r].level(row[j]);
                levels[r][j - c0] = l;
                err[r] = if live[r] { (row[j] - q) / ujj } else { 0.0 };
                row[j] = q;
            }
            let uj = &f.u[j * n + j + 1..(j + 1) * n];
            for (r, row) in rows.iter_mut().enumerate() {
                let e = err[r];
                if e != 0.0 {
                    for (x, &u) in row[j + 1..].iter_mut().zip(uj) {
                        *x -= e * u;
                    }
                }
            }
        }
        for (r, o) in outs.iter_mut().enumerate() {
            if live[r] {
                grids[r].write(&levels[r], &mut o[b * size..(b + 1) * size]);
            }
        }
    }
}
