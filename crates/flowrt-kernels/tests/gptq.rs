//! Error-feedback quantisation (`flowrt_kernels::gptq`, what `flowrt pack --gptq` writes):
//! on inputs with correlated columns its output error `Σ_rows eᵀ H e` is well below the
//! importance-weighted search's, the factor it spreads errors with is `H + λI`'s Cholesky factor, the
//! blocks it writes decode to values on their own grids, the asymmetric target (`--asymmetric`)
//! is the least-squares matrix for the source's outputs from the pack's inputs, and bad shapes
//! are errors.

mod common;

use common::{normal, rng, TestRng};
use flowrt_dtype::GgmlType;
use flowrt_kernels::gptq::{cross_moment, quantize_matrix, Correction, Factor, GptqError};
use flowrt_kernels::{row_size, Kernels};

const TYPES: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
];

/// `tokens` inputs of `n` columns mixed from `k` latent factors (so columns correlate, as
/// a model's activations do), with a few columns much larger than the rest; and their
/// Gram matrix `Σ x xᵀ`.
fn inputs(rng: &mut TestRng, n: usize, tokens: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let mix: Vec<f32> = (0..k * n).map(|_| normal(rng)).collect();
    let scale: Vec<f32> = (0..n)
        .map(|j| if j % 37 == 5 { 8.0 } else { 1.0 })
        .collect();
    let mut x = vec![0f32; tokens * n];
    for t in 0..tokens {
        let z: Vec<f32> = (0..k).map(|_| normal(rng)).collect();
        for j in 0..n {
            let mut v = 0.3 * normal(rng);
            for (i, zi) in z.iter().enumerate() {
                v += zi * mix[i * n + j];
            }
            x[t * n + j] = v * scale[j];
        }
    }
    let mut g = vec![0f32; n * n];
    for t in 0..tokens {
        let row = &x[t * n..(t + 1) * n];
        for i in 0..n {
            for j in 0..n {
                g[i * n + j] += row[i] * row[j];
            }
        }
    }
    (x, g)
}

/// `Σ_t ‖(W − Q) x_t‖²` for the dequantised `q` of `w`.
fn output_error(ty: GgmlType, w: &[f32], q: &[u8], x: &[f32], n: usize) -> f64 {
    let k = Kernels::scalar();
    let rows = w.len() / n;
    let rs = row_size(ty, n);
    let mut total = 0f64;
    let mut deq = vec![0f32; n];
    for r in 0..rows {
        k.dequantize_row(ty, &q[r * rs..(r + 1) * rs], &mut deq);
        let e: Vec<f64> = (0..n).map(|j| (w[r * n + j] - deq[j]) as f64).collect();
        for xt in x.chunks(n) {
            let d: f64 = e.iter().zip(xt).map(|(a, &b)| a * b as f64).sum();
            total += d * d;
        }
    }
    total
}

#[test]
fn error_feedback_beats_the_weighted_search_on_correlated_inputs() {
    let mut rng = rng(7);
    let (n, rows, tokens) = (128, 24, 400);
    let (x, g) = inputs(&mut rng, n, tokens, 12);
    let w: Vec<f32> = (0..rows * n).map(|_| 0.05 * normal(&mut rng)).collect();
    let diag: Vec<f32> = (0..n).map(|j| g[j * n + j] / tokens as f32).collect();
    let f = Factor::new(&g, n, 2).unwrap();
    for ty in TYPES {
        let rs = row_size(ty, n);
        let mut searched = vec![0u8; rows * rs];
        for r in 0..rows {
            Kernels::scalar().quantize_row_weighted(
                ty,
                &w[r * n..(r + 1) * n],
                Some(&diag),
                &mut searched[r * rs..(r + 1) * rs],
            );
        }
        let mut fed = vec![0u8; rows * rs];
        let mut work = w.clone();
        quantize_matrix(ty, &mut work, &f, &mut fed, 3).unwrap();
        let (a, b) = (
            output_error(ty, &w, &searched, &x, n),
            output_error(ty, &w, &fed, &x, n),
        );
        eprintln!(
            "{ty}: weighted search {a:.4e}, error feedback {b:.4e} ({:.3})",
            b / a
        );
        assert!(b < 0.5 * a, "{ty}: {b:.4e} against {a:.4e}");
        // The same bytes on any thread count.
        let mut one = vec![0u8; rows * rs];
        let mut work = w.clone();
        quantize_matrix(ty, &mut work, &f, &mut one, 1).unwrap();
        assert_eq!(one, fed, "{ty}: threads");
    }
}

/// With uncorrelated inputs (`H` diagonal) nothing is fed back: every value takes the level
/// nearest to it on its block's grid, so the squared error is never above the reference
/// rounding's on the same grid, and the output error is close to the weighted search's.
#[test]
fn a_diagonal_second_moment_feeds_nothing_back() {
    let mut rng = rng(3);
    let (n, rows) = (64, 16);
    let mut g = vec![0f32; n * n];
    for j in 0..n {
        g[j * n + j] = 1.0 + (j % 5) as f32;
    }
    let w: Vec<f32> = (0..rows * n).map(|_| normal(&mut rng)).collect();
    let f = Factor::new(&g, n, 1).unwrap();
    for ty in TYPES {
        let rs = row_size(ty, n);
        let mut fed = vec![0u8; rows * rs];
        let mut work = w.clone();
        quantize_matrix(ty, &mut work, &f, &mut fed, 2).unwrap();
        // No feedback: the working values are the input's, rounded in place.
        let mut deq = vec![0f32; n];
        for r in 0..rows {
            Kernels::scalar().dequantize_row(ty, &fed[r * rs..(r + 1) * rs], &mut deq);
            assert_eq!(&work[r * n..(r + 1) * n], &deq[..], "{ty} row {r}");
            let mut searched = vec![0u8; rs];
            // The searches' weights: the diagonal scaled to a unit mean, plus the damping.
            let mean = (0..n).map(|j| g[j * n + j] as f64).sum::<f64>() / n as f64;
            let d: Vec<f32> = (0..n)
                .map(|j| (g[j * n + j] as f64 / mean + 0.01) as f32)
                .collect();
            Kernels::scalar().quantize_row_weighted(
                ty,
                &w[r * n..(r + 1) * n],
                Some(&d),
                &mut searched,
            );
            let mut sq = vec![0f32; n];
            Kernels::scalar().dequantize_row(ty, &searched, &mut sq);
            let err = |v: &[f32]| -> f64 {
                (0..n)
                    .map(|j| d[j] as f64 * ((w[r * n + j] - v[j]) as f64).powi(2))
                    .sum()
            };
            assert!(err(&deq) <= err(&sq) * 1.000001, "{ty} row {r}");
        }
    }
}

#[test]
fn the_factor_is_the_damped_second_moments_cholesky_factor() {
    let mut rng = rng(11);
    // Sizes around the factorisation's 64-column panels and 4 × 8 tiles.
    for n in [40, 64, 65, 131, 200] {
        let (_, g) = inputs(&mut rng, n, 60 + n / 2, 6);
        let f = Factor::new(&g, n, 3).unwrap();
        assert_eq!(f.n(), n);
        // H + λI scaled to a unit mean diagonal, λ a hundredth of that mean.
        let mean = (0..n).map(|i| g[i * n + i] as f64).sum::<f64>() / n as f64;
        let h: Vec<f64> = (0..n * n)
            .map(|k| g[k] as f64 / mean + if k % (n + 1) == 0 { 0.01 } else { 0.0 })
            .collect();
        let v = f.upper();
        for i in 0..n {
            assert!(v[i * n + i] > 0.0);
            for j in 0..i {
                assert_eq!(v[i * n + j], 0.0, "n {n}: below the diagonal at {i},{j}");
            }
        }
        // V Vᵀ = H + λI.
        let mut worst = 0f64;
        for i in 0..n {
            for j in 0..n {
                let vvt: f64 = (0..n)
                    .map(|m| v[i * n + m] as f64 * v[j * n + m] as f64)
                    .sum();
                worst = worst.max((vvt - h[i * n + j]).abs());
            }
        }
        assert!(worst < 1e-5, "n {n}: V Vᵀ differs from H + λI by {worst:e}");
        // The same factor on one thread.
        assert_eq!(Factor::new(&g, n, 1).unwrap().upper(), v, "n {n}");
    }
}

#[test]
fn bad_inputs_are_errors() {
    assert_eq!(
        Factor::new(&[0.0; 4], 2, 1).unwrap_err(),
        GptqError::NoActivations
    );
    assert_eq!(
        Factor::new(&[1.0, f32::NAN, f32::NAN, 1.0], 2, 1).unwrap_err(),
        GptqError::NotFinite
    );
    assert!(matches!(
        Factor::new(&[1.0; 3], 2, 1),
        Err(GptqError::Shape(_))
    ));
    // Not positive semi-definite beyond what the damping covers.
    assert!(matches!(
        Factor::new(&[1.0, 5.0, 5.0, 1.0], 2, 1),
        Err(GptqError::NotPositiveDefinite(_))
    ));
    let f = Factor::new(&identity(32), 32, 1).unwrap();
    let mut w = vec![0.5f32; 64];
    let mut out = vec![0u8; 2 * row_size(GgmlType::Q4_0, 32)];
    assert_eq!(
        quantize_matrix(GgmlType::Q8_0, &mut w, &f, &mut out, 1).unwrap_err(),
        GptqError::Unsupported(GgmlType::Q8_0)
    );
    assert!(matches!(
        quantize_matrix(GgmlType::Q4_0, &mut w[..40], &f, &mut out, 1),
        Err(GptqError::Shape(_))
    ));
    assert!(matches!(
        quantize_matrix(GgmlType::Q4_0, &mut w, &f, &mut out[..10], 1),
        Err(GptqError::Shape(_))
    ));
}

/// The `n × n` identity (the second moments of inputs that do not correlate).
fn identity(n: usize) -> Vec<f32> {
    (0..n * n)
        .map(|k| if k % (n + 1) == 0 { 1.0 } else { 0.0 })
        .collect()
}

/// `Σ_t a_t b_tᵀ` in f64.
fn cross_f64(a: &[f32], p: usize, b: &[f32], q: usize) -> Vec<f64> {
    let t = a.len() / p.max(1);
    let mut out = vec![0f64; p * q];
    for m in 0..t {
        for i in 0..p {
            for j in 0..q {
                out[i * q + j] += a[m * p + i] as f64 * b[m * q + j] as f64;
            }
        }
    }
    out
}

#[test]
fn cross_moments_are_the_sums_of_outer_products() {
    let mut rng = rng(21);
    // Widths on and off the 4 × 16 tiles, row counts on and off the 64-row panels.
    for (p, q) in [(1, 1), (3, 17), (4, 16), (17, 33), (40, 5)] {
        for t in [0, 1, 63, 64, 65, 130] {
            let a: Vec<f32> = (0..t * p).map(|_| normal(&mut rng)).collect();
            let b: Vec<f32> = (0..t * q).map(|_| normal(&mut rng)).collect();
            let want = cross_f64(&a, p, &b, q);
            for threads in 1..=3 {
                let got = cross_moment(&a, p, &b, q, threads);
                assert_eq!(got.len(), p * q);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "p {p} q {q} t {t} threads {threads} at {i}: {g} against {w}"
                    );
                }
            }
        }
    }
}

/// `a⁻¹` of a symmetric positive definite `n × n` matrix, by Gauss-Jordan in f64.
fn inverse(a: &[f64], n: usize) -> Vec<f64> {
    let mut m = a.to_vec();
    let mut inv: Vec<f64> = (0..n * n)
        .map(|k| if k % (n + 1) == 0 { 1.0 } else { 0.0 })
        .collect();
    for c in 0..n {
        let p = m[c * n + c];
        for j in 0..n {
            m[c * n + j] /= p;
            inv[c * n + j] /= p;
        }
        for r in 0..n {
            if r != c {
                let f = m[r * n + c];
                for j in 0..n {
                    m[r * n + j] -= f * m[c * n + j];
                    inv[r * n + j] -= f * inv[c * n + j];
                }
            }
        }
    }
    inv
}

/// With the pack's inputs `x̃` and the source's `x` (the same positions, moved by what the
/// layers before quantised), `W + alpha · W K` is `W` moved `alpha` of the way to the
/// least-squares `W*` for `W x` from `x̃` under the damping, computed here in f64; `W*` makes
/// less output error on `x̃` than `W` does.
#[test]
fn the_correction_is_the_least_squares_target() {
    let mut rng = rng(23);
    for n in [32, 64, 96] {
        let tokens = 3 * n;
        let (xq, g) = inputs(&mut rng, n, tokens, 6);
        // The source's inputs: the pack's plus an error correlated with them.
        let mix: Vec<f32> = (0..n * n).map(|_| 0.05 * normal(&mut rng)).collect();
        let mut x = xq.clone();
        for t in 0..tokens {
            for j in 0..n {
                let e: f32 = (0..n).map(|i| xq[t * n + i] * mix[i * n + j]).sum();
                x[t * n + j] += e + 0.05 * normal(&mut rng);
            }
        }
        let delta: Vec<f32> = x.iter().zip(&xq).map(|(a, b)| a - b).collect();
        let rows = 5;
        let w: Vec<f32> = (0..rows * n).map(|_| normal(&mut rng)).collect();
        let factor = Factor::new(&g, n, 2).unwrap();
        let cross = cross_moment(&delta, n, &xq, n, 2);
        let corr = Correction::new(&cross, &factor, 3).unwrap();
        // W* = W (C + λI)(H + λI)⁻¹ with C = Σ x x̃ᵀ, H = Σ x̃ x̃ᵀ, λ a hundredth of H's mean
        // diagonal: W + W (C − H)(H + λI)⁻¹.
        let mean = (0..n).map(|i| g[i * n + i] as f64).sum::<f64>() / n as f64;
        let d: Vec<f64> = (0..n * n)
            .map(|k| g[k] as f64 + if k % (n + 1) == 0 { 0.01 * mean } else { 0.0 })
            .collect();
        let dinv = inverse(&d, n);
        let c = cross_f64(&delta, n, &xq, n);
        let mut k = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                k[i * n + j] = (0..n).map(|m| c[i * n + m] * dinv[m * n + j]).sum();
            }
        }
        for alpha in [1.0f32, 0.25] {
            let mut got = w.clone();
            corr.apply(&mut got, alpha, 2).unwrap();
            let mut worst = 0f64;
            let mut size = 0f64;
            for r in 0..rows {
                for j in 0..n {
                    let wk: f64 = (0..n).map(|m| w[r * n + m] as f64 * k[m * n + j]).sum();
                    let want = w[r * n + j] as f64 + alpha as f64 * wk;
                    worst = worst.max((got[r * n + j] as f64 - want).abs());
                    size = size.max(wk.abs());
                }
            }
            assert!(
                size > 1e-2,
                "n {n}: the correction is too small to test ({size:e})"
            );
            assert!(
                worst < 1e-3 * (1.0 + size),
                "n {n} alpha {alpha}: off the target by {worst:e} (correction up to {size:e})"
            );
        }
        // ‖W x − W' x̃‖² over the positions: less with the target than with W.
        let err = |m: &[f32]| -> f64 {
            let mut e = 0f64;
            for t in 0..tokens {
                for r in 0..rows {
                    let want: f64 = (0..n)
                        .map(|j| w[r * n + j] as f64 * x[t * n + j] as f64)
                        .sum();
                    let got: f64 = (0..n)
                        .map(|j| m[r * n + j] as f64 * xq[t * n + j] as f64)
                        .sum();
                    e += (want - got).powi(2);
                }
            }
            e
        };
        let mut target = w.clone();
        corr.apply(&mut target, 1.0, 1).unwrap();
        let (before, after) = (err(&w), err(&target));
        assert!(
            after < 0.5 * before,
            "n {n}: output error {after:e} with the target against {before:e} without"
        );
    }
}

#[test]
fn bad_corrections_are_errors() {
    let f = Factor::new(&identity(32), 32, 1).unwrap();
    assert!(matches!(
        Correction::new(&[0.0; 31 * 32], &f, 1),
        Err(GptqError::Shape(_))
    ));
    let mut bad = vec![0f32; 32 * 32];
    bad[7] = f32::INFINITY;
    assert_eq!(
        Correction::new(&bad, &f, 1).unwrap_err(),
        GptqError::NotFinite
    );
    let c = Correction::new(&vec![0f32; 32 * 32], &f, 1).unwrap();
    assert!(matches!(
        c.apply(&mut [0f32; 40], 1.0, 1),
        Err(GptqError::Shape(_))
    ));
    // No difference between the paths: no correction.
    let mut w: Vec<f32> = (0..64).map(|i| i as f32).collect();
    c.apply(&mut w, 1.0, 2).unwrap();
    assert!(w.iter().enumerate().all(|(i, &v)| v == i as f32));
}
