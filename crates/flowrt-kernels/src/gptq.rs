//! Error-feedback quantisation of weight matrices (the GPTQ method: Frantar et al., 2022)
//! for the 32-value block types Q4_0, Q4_1, Q5_0 and Q5_1, what `flowrt pack --gptq` writes.
//!
//! A matrix `W` (rows of `n` input columns) multiplies inputs `x` whose second moments
//! `H = E[x xᵀ]` were measured on calibration text. Rounding each value to its nearest level
//! minimises `‖W − Q‖²`; what matters is the output error `E‖(W − Q) x‖² = Σ_rows eᵀ H e`.
//! Each row is therefore quantised one column at a time, and the rounding error of column
//! `j` is spread over the columns not yet quantised so as to cancel its effect on the
//! output as far as `H` allows: with `U` the upper Cholesky factor of `H⁻¹` (`Uᵀ U = H⁻¹`),
//! `e = (w_j − q_j) / U_jj` and `w_k −= e · U_jk` for `k > j`. Rows are independent. `U` is
//! `V⁻¹` for the upper triangular `V` with `V Vᵀ = H`, and the same updates can be written
//! with `V` itself (see [`tile`]), so no inverse is taken: `V` is the Cholesky factor of `H`
//! with its rows and columns reversed, factored by panels whose updates are 4 × 8 tiles of
//! [`crate::Kernels::panel_dots_f64`].
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

/// The factor [`quantize_matrix`] spreads errors with: the upper triangular `V` (row-major,
/// `n × n`) with `V Vᵀ = H + λI` (`V⁻¹` is the `U` above, so `V` needs no inverse: see
/// [`quantize_matrix`]), and the damped diagonal of `H` (the block searches' importances).
#[derive(Clone, Debug)]
pub struct Factor {
    n: usize,
    v: Vec<f32>,
    /// `1 / V_kk`.
    inv_diag: Vec<f32>,
    diag: Vec<f32>,
    /// What `H + λI` was multiplied by before factoring (`1 /` its mean diagonal).
    scale: f64,
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
        // Scale to a unit mean diagonal (the factor's scale cancels in `Σ d_i V_ik / V_kk`).
        let s = 1.0 / mean;
        let mut h: Vec<f64> = gram.iter().map(|&v| v as f64 * s).collect();
        for i in 0..n {
            h[i * n + i] += damp * s;
        }
        let diag: Vec<f32> = (0..n).map(|i| h[i * n + i] as f32).collect();
        // `V` taken from the last column backwards is the lower Cholesky factor of `H` with
        // rows and columns reversed: reversing a row-major matrix's values reverses both.
        h.reverse();
        lower_cholesky(&mut h, n, threads.max(1))
            .map_err(|j| GptqError::NotPositiveDefinite(n - 1 - j))?;
        h.reverse();
        let inv_diag = (0..n).map(|k| (1.0 / h[k * n + k]) as f32).collect();
        let v = h.iter().map(|&x| x as f32).collect();
        Ok(Self {
            n,
            v,
            inv_diag,
            diag,
            scale: s,
        })
    }

    /// The row length (input columns) this factor is for.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `V` (`n × n`, row-major, upper triangular, positive diagonal) with `V Vᵀ = H + λI`, for
    /// `H` scaled to a unit mean diagonal.
    pub fn upper(&self) -> &[f32] {
        &self.v
    }
}

/// Rows of the panels [`cross_moment`] sums at a time (a panel of a few hundred KiB).
const CROSS_ROWS: usize = 64;

/// Rows [`Correction::new`] solves together.
const SOLVE_ROWS: usize = 16;

/// `Σ_t a_t b_tᵀ` (`p × q`, row-major) over the rows `t` of `a` (`T × p`, row-major) and `b`
/// (`T × q`), on up to `threads` threads: the rows are copied [`CROSS_ROWS`] at a time into
/// one zero-padded panel `[a_t | b_t]` whose columns [`crate::Kernels::panel_dots_f32`] takes
/// 4 × 16 at a time, rows of tiles dealt round-robin to the threads.
///
/// # Panics
/// When `a` and `b` are not the same number of whole rows of `p` and `q` values.
pub fn cross_moment(a: &[f32], p: usize, b: &[f32], q: usize, threads: usize) -> Vec<f32> {
    let t = a.len().checked_div(p).unwrap_or(0);
    assert!(
        a.len() == t * p && b.len() == t * q,
        "cross_moment: {} and {} values are not {t} rows of {p} and {q}",
        a.len(),
        b.len()
    );
    let mut out = vec![0f32; p * q];
    if t == 0 || q == 0 {
        return out;
    }
    let kern = crate::Kernels::detect();
    let pa = p.div_ceil(4) * 4;
    let stride = pa + q.div_ceil(16) * 16;
    let mut panel = vec![0f32; CROSS_ROWS * stride];
    let threads = threads.clamp(1, pa / 4);
    for t0 in (0..t).step_by(CROSS_ROWS) {
        let m = (t - t0).min(CROSS_ROWS);
        let panel = &mut panel[..m * stride];
        for (i, row) in panel.chunks_exact_mut(stride).enumerate() {
            row[..p].copy_from_slice(&a[(t0 + i) * p..(t0 + i + 1) * p]);
            row[pa..pa + q].copy_from_slice(&b[(t0 + i) * q..(t0 + i + 1) * q]);
        }
        let panel = &*panel;
        let mut parts: Vec<Vec<(usize, &mut [f32])>> = (0..threads).map(|_| Vec::new()).collect();
        for (ti, rows) in out.chunks_mut(4 * q).enumerate() {
            parts[ti % threads].push((4 * ti, rows));
        }
        std::thread::scope(|s| {
            for part in parts {
                s.spawn(move || {
                    let mut tile = [[0f32; 16]; 4];
                    for (i0, rows) in part {
                        for c0 in (0..q).step_by(16) {
                            kern.panel_dots_f32(panel, stride, i0, pa + c0, &mut tile);
                            let w = (q - c0).min(16);
                            for (r, row) in rows.chunks_mut(q).enumerate() {
                                for (o, v) in row[c0..c0 + w].iter_mut().zip(&tile[r][..w]) {
                                    *o += v;
                                }
                            }
                        }
                    }
                });
            }
        });
    }
    out
}

/// The asymmetric target of error-feedback quantisation (GPTAQ: Li et al., 2025): a matrix
/// `W` that the source multiplies by inputs `X` is to be quantised for inputs `X̃` (the same
/// positions through the already quantised matrices before it). Its output error
/// `‖W X − Q X̃‖²` is least for `Q` near `W* = W X X̃ᵀ (X̃ X̃ᵀ)⁻¹ = W (I + K)` with
/// `K = (X − X̃) X̃ᵀ (X̃ X̃ᵀ + λI)⁻¹`, which error feedback through `X̃ X̃ᵀ` then quantises. `K`
/// is shared by the matrices that read the same input.
#[derive(Clone, Debug)]
pub struct Correction {
    n: usize,
    /// `K` (`n × n`, row-major).
    k: Vec<f32>,
}

impl Correction {
    /// `K` from `cross = Σ_t (x_t − x̃_t) x̃_tᵀ` (`n × n`, row-major) and the factor of the
    /// same inputs' `Σ x̃ x̃ᵀ`, on up to `threads` threads. Each row `c` of `cross` is solved
    /// as `c (H + λI)⁻¹ = s c V⁻ᵀ V⁻¹`: back substitution with `V`'s rows for `y Vᵀ = c`,
    /// then `z V = y` as axpys of `V`'s rows.
    pub fn new(cross: &[f32], factor: &Factor, threads: usize) -> Result<Self, GptqError> {
        let n = factor.n;
        if cross.len() != n * n {
            return Err(GptqError::Shape(format!(
                "{} cross moments for inputs of {n}",
                cross.len()
            )));
        }
        if !cross.iter().all(|v| v.is_finite()) {
            return Err(GptqError::NotFinite);
        }
        let kern = crate::Kernels::detect();
        let v = &factor.v;
        let scale = factor.scale as f32;
        let mut k = cross.to_vec();
        let per = n.div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            for part in k.chunks_mut(per * n) {
                s.spawn(move || {
                    // [`SOLVE_ROWS`] rows at a time, so that each row of `V` is read once for
                    // all of them (`V` is 4 n² bytes: 151 MB at n = 6144, far over the caches).
                    let mut y = vec![0f32; SOLVE_ROWS * n];
                    for rows in part.chunks_mut(SOLVE_ROWS * n) {
                        let nr = rows.len() / n;
                        let y = &mut y[..nr * n];
                        for j in (0..n).rev() {
                            let vj = &v[j * n + j + 1..(j + 1) * n];
                            for (row, yr) in rows.chunks(n).zip(y.chunks_mut(n)) {
                                let dot = kern.dot_f32(vj, &yr[j + 1..]);
                                yr[j] = (row[j] - dot) * factor.inv_diag[j];
                            }
                        }
                        for i in 0..n {
                            let vi = &v[i * n + i + 1..(i + 1) * n];
                            for (row, yr) in rows.chunks_mut(n).zip(y.chunks_mut(n)) {
                                let z = yr[i] * factor.inv_diag[i];
                                row[i] = scale * z;
                                kern.axpy_f32(&mut yr[i + 1..], -z, vi);
                            }
                        }
                    }
                });
            }
        });
        Ok(Self { n, k })
    }

    /// Moves `w` (rows of `n` values, row-major) a fraction `alpha` of the way to its
    /// target: `w += alpha · w K`, on up to `threads` threads.
    pub fn apply(&self, w: &mut [f32], alpha: f32, threads: usize) -> Result<(), GptqError> {
        let n = self.n;
        if n == 0 || !w.len().is_multiple_of(n) {
            return Err(GptqError::Shape(format!(
                "{} values in rows of {n}",
                w.len()
            )));
        }
        let rows = w.len() / n;
        let mut wt = vec![0f32; w.len()];
        for (r, row) in w.chunks_exact(n).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                wt[c * rows + r] = x;
            }
        }
        let d = cross_moment(&wt, rows, &self.k, n, threads);
        for (x, dx) in w.iter_mut().zip(&d) {
            *x += alpha * dx;
        }
        Ok(())
    }
}

fn dot(x: &[f64], y: &[f64]) -> f64 {
    x.iter().zip(y).map(|(p, q)| p * q).sum()
}

/// Forward substitution of a row's panel values `l` (in place, its first `cols`) against the
/// factored rows of `block` (`w × w`, lower, row-major): `l_j = (l_j − Σ_{m<j} l_m b_jm) / b_jj`.
fn substitute(l: &mut [f64], block: &[f64], w: usize, cols: usize) {
    for j in 0..cols {
        let bj = &block[j * w..j * w + j + 1];
        l[j] = (l[j] - dot(&l[..j], &bj[..j])) / bj[j];
    }
}

/// Columns factored per panel of [`lower_cholesky`].
const PANEL: usize = 64;

/// Overwrites the lower triangle of the symmetric `a` (row-major `n × n`, f64) with its
/// Cholesky factor `L` (`L Lᵀ = a`) and zeroes the upper triangle, or returns the column
/// where `a` is not positive definite. Right-looking by panels of [`PANEL`] columns: each
/// panel is factored, then subtracted from the rows below it as 4 × 8 tiles of
/// [`crate::Kernels::panel_dots_f64`], rows dealt to `threads` threads.
fn lower_cholesky(a: &mut [f64], n: usize, threads: usize) -> Result<(), usize> {
    let kern = crate::Kernels::detect();
    let mut panel = Vec::new();
    for k0 in (0..n).step_by(PANEL) {
        let k1 = (k0 + PANEL).min(n);
        // The diagonal block row by row, each row solved against the block's rows above it
        // (kept in `block`, `w × w` row-major), then the rows below it against the whole
        // block.
        let w = k1 - k0;
        let mut block = vec![0f64; w * w];
        for r in 0..w {
            let i = k0 + r;
            let li = &mut a[i * n + k0..i * n + k1];
            substitute(li, &block, w, r);
            let d = li[r] - dot(&li[..r], &li[..r]);
            if d <= 0.0 || !d.is_finite() {
                return Err(i);
            }
            li[r] = d.sqrt();
            block[r * w..r * w + r + 1].copy_from_slice(&li[..=r]);
        }
        if k1 == n {
            break;
        }
        let rows_per = (n - k1).div_ceil(threads);
        std::thread::scope(|s| {
            for rows in a[k1 * n..].chunks_mut(rows_per * n) {
                let block = &block;
                s.spawn(move || {
                    for ri in rows.chunks_mut(n) {
                        substitute(&mut ri[k0..k1], block, w, w);
                    }
                });
            }
        });
        // The rows below, transposed into `panel` (`w` rows of `stride` columns,
        // zero-padded to whole tiles), then `a[i][j] -= Σ_m L[i][m] L[j][m]` for
        // `k1 <= j <= i`.
        let below = n - k1;
        let stride = below.div_ceil(8) * 8;
        panel.clear();
        panel.resize(w * stride, 0.0);
        for r in 0..below {
            for m in k0..k1 {
                panel[(m - k0) * stride + r] = a[(k1 + r) * n + m];
            }
        }
        let panel = &panel[..];
        let mut parts: Vec<Vec<(usize, &mut [f64])>> = (0..threads).map(|_| Vec::new()).collect();
        for (t, rows) in a[k1 * n..].chunks_mut(4 * n).enumerate() {
            parts[t % threads].push((t * 4, rows));
        }
        std::thread::scope(|s| {
            for part in parts {
                s.spawn(move || {
                    let mut out = [[0f64; 8]; 4];
                    for (r0, rows) in part {
                        let live = rows.len() / n;
                        // The last tile's rows past `below` read the padding's zeros.
                        for j0 in (0..r0 + live).step_by(8) {
                            kern.panel_dots_f64(panel, stride, r0, j0, &mut out);
                            for (r, row) in rows.chunks_mut(n).enumerate() {
                                let i = r0 + r;
                                for (c, v) in out[r].iter().enumerate() {
                                    let j = j0 + c;
                                    if j <= i {
                                        row[k1 + j] -= v;
                                    }
                                }
                            }
                        }
                    }
                });
            }
        });
    }
    for i in 0..n {
        a[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
    Ok(())
}

/// Whether [`quantize_matrix`] takes `ty` (Q4_0, Q4_1, Q5_0, Q5_1).
pub fn supports(ty: GgmlType) -> bool {
    Grid::supports(ty)
}

/// Rows quantised together: a row of `V` is read once for all of them.
const TILE: usize = 8;

/// Quantises `w` (`rows × n` f32 values, row-major; overwritten with the values its blocks
/// decode to) to `ty` with error feedback through `factor`, writing `rows` rows of `ty` blocks
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

/// Up to [`TILE`] rows, column by column. With `d_i = w_i − q_i` (the original value less
/// its rounding), GPTQ's running value of column `k` is `w_k + Σ_{i<k} d_i V_ik / V_kk`
/// (from `w − q = e U` and `e = (w − q) V`): each rounded column adds `d_j` times its row of
/// `V` to the later columns' sums.
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
    let mut sums = vec![vec![0f32; n]; rows.len()];
    let mut grids = Vec::with_capacity(rows.len());
    let mut levels = vec![[0u8; QK]; rows.len()];
    let mut d = vec![0f32; rows.len()];
    let mut now = [0f32; QK];
    for b in 0..n / QK {
        let c0 = b * QK;
        grids.clear();
        for (row, sum) in rows.iter().zip(&sums) {
            for (k, x) in now.iter_mut().enumerate() {
                *x = row[c0 + k] + sum[c0 + k] * f.inv_diag[c0 + k];
            }
            grids.push(Grid::search(ty, &now, &f.diag[c0..c0 + QK]));
        }
        for j in c0..c0 + QK {
            for (r, row) in rows.iter_mut().enumerate() {
                if !live[r] {
                    continue;
                }
                let (l, q) = grids[r].level(row[j] + sums[r][j] * f.inv_diag[j]);
                levels[r][j - c0] = l;
                d[r] = row[j] - q;
                row[j] = q;
            }
            let vj = &f.v[j * n + j + 1..(j + 1) * n];
            for (r, sum) in sums.iter_mut().enumerate() {
                let dr = d[r];
                if live[r] && dr != 0.0 {
                    for (x, &v) in sum[j + 1..].iter_mut().zip(vj) {
                        *x += dr * v;
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
