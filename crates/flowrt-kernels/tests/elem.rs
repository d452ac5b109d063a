//! Element-wise kernels and attention helpers: every table against naive f64 math.

mod common;

use common::*;
use flowrt_kernels::Kernels;
use half::f16;
use proptest::prelude::*;
use rand::Rng;

const LENS: [usize; 14] = [0, 1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 100, 577];

fn len(rng: &mut TestRng, li: usize) -> usize {
    LENS.get(li)
        .copied()
        .unwrap_or_else(|| rng.random_range(0..300))
}

/// Values spanning the interesting range of the activation functions.
fn wide(rng: &mut TestRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.random_range(0..8) {
            0 => rng.random_range(-100.0f32..100.0),
            1 => rng.random_range(-1e-3f32..1e-3),
            2 => 0.0,
            _ => rng.random_range(-8.0f32..8.0),
        })
        .collect()
}

fn close(got: f32, want: f64, rel: f64, abs: f64) -> bool {
    (got as f64 - want).abs() <= rel * want.abs() + abs
}

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// gelu_tanh in f64: the tanh form where it is well conditioned; for very negative inner
/// values `1 + tanh(y)` cancels, so use the identity `(1 + tanh y) / 2 = 1 / (1 + exp(-2y))`.
fn gelu64(x: f64) -> f64 {
    let y = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    if y > -3.0 {
        0.5 * x * (1.0 + y.tanh())
    } else {
        x / (1.0 + (-2.0 * y).exp())
    }
}

/// A panel-dots tile `got(r, c)` (4 rows, `width` columns at `(i0, j0)` of the rows of
/// `stride` in `p`) against the sums in f64: equal where `exact` (small integers), else
/// within `tol` of the sum of the terms' magnitudes.
#[allow(clippy::too_many_arguments)]
fn check_panel(
    p: &[f32],
    stride: usize,
    i0: usize,
    j0: usize,
    width: usize,
    got: impl Fn(usize, usize) -> f64,
    exact: bool,
    tol: impl Fn(f64) -> f64,
) -> Result<(), String> {
    let depth = p.len() / stride;
    for r in 0..4 {
        for c in 0..width {
            let terms =
                (0..depth).map(|m| p[m * stride + i0 + r] as f64 * p[m * stride + j0 + c] as f64);
            let want: f64 = terms.clone().sum();
            let abs: f64 = terms.map(f64::abs).sum();
            let g = got(r, c);
            let ok = if exact {
                g == want
            } else {
                (g - want).abs() <= tol(abs)
            };
            if !ok {
                return Err(format!("[{r},{c}] {g} vs {want}"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(128))]

    /// `cap · tanh(x / cap)` within a few ulps of `cap` (the vector form subtracts from
    /// `cap`), for caps from 0.05 to 50 and values far past them; ±inf give ±cap, NaN stays.
    #[test]
    fn softcap_matches_f64(seed: u64, li in 0..16usize) {
        let mut rng = rng(seed);
        let n = len(&mut rng, li);
        let mut x = wide(&mut rng, n);
        if n > 3 {
            x[0] = f32::INFINITY;
            x[1] = f32::NEG_INFINITY;
            x[n - 1] = f32::NAN;
        }
        let cap = [0.05f32, 1.0, 8.0, 30.0, 50.0][rng.random_range(0..5)];
        for k in tables() {
            let mut got = x.clone();
            k.softcap(&mut got, cap);
            for i in 0..n {
                let v = x[i] as f64;
                if v.is_nan() {
                    prop_assert!(got[i].is_nan(), "{} softcap(NaN) = {}", k.name(), got[i]);
                    continue;
                }
                let c = cap as f64;
                let want = if v.is_infinite() { c * v.signum() } else { c * (v / c).tanh() };
                prop_assert!(
                    close(got[i], want, 1e-6, 4e-7 * c),
                    "{} softcap({v}, {cap}) = {} (want {want})", k.name(), got[i]
                );
            }
        }
    }

    #[test]
    fn activations_match_f64(seed: u64, li in 0..16usize) {
        let mut rng = rng(seed);
        let n = len(&mut rng, li);
        let g = wide(&mut rng, n);
        let u = random_f32s(&mut rng, n);
        for k in tables() {
            let mut s = g.clone();
            k.silu_mul(&mut s, &u);
            let mut e = g.clone();
            k.gelu_tanh_mul(&mut e, &u);
            for i in 0..n {
                let (x, y) = (g[i] as f64, u[i] as f64);
                // The logistic's condition number grows with its argument (x, or 2 * inner).
                let inner = 0.7978845608 * (x + 0.044715 * x * x * x);
                let (rs, rg) = (1e-6 * (2.0 + x.abs()), 1e-6 * (2.0 + 2.0 * inner.abs()));
                prop_assert!(close(s[i], silu64(x) * y, rs, 1e-30), "{} silu({x})*{y} = {}", k.name(), s[i]);
                prop_assert!(close(e[i], gelu64(x) * y, rg, 1e-30), "{} gelu({x})*{y} = {}", k.name(), e[i]);
            }
        }
    }

    #[test]
    fn softmax_matches_f64(seed: u64, li in 1..16usize) {
        let mut rng = rng(seed);
        let n = len(&mut rng, li).max(1);
        let x = wide(&mut rng, n);
        let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
        for k in tables() {
            let mut y = x.clone();
            k.softmax(&mut y);
            for i in 0..n {
                let want = (x[i] as f64 - max).exp() / sum;
                prop_assert!(close(y[i], want, 1e-5, 1e-30), "{} softmax[{i}] {} vs {want}", k.name(), y[i]);
            }
        }
    }

    /// Odd lengths included (0 gives `(-inf, 0)`): `x = exp(x - max)`, the exact max, and
    /// the sum; `softmax` is this divided by the sum.
    #[test]
    fn softmax_unscaled_matches_f64(seed: u64, li in 0..16usize) {
        let mut rng = rng(seed);
        let n = len(&mut rng, li);
        let x = wide(&mut rng, n);
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = x.iter().map(|&v| (v as f64 - max as f64).exp()).sum();
        for k in tables() {
            let mut y = x.clone();
            let (m, s) = k.softmax_unscaled(&mut y);
            prop_assert_eq!(m, max, "{} max", k.name());
            prop_assert!(close(s, sum, 1e-5, 0.0), "{} sum {s} vs {sum}", k.name());
            for i in 0..n {
                let want = (x[i] as f64 - max as f64).exp();
                prop_assert!(close(y[i], want, 1e-5, 1e-30), "{} [{i}] {} vs {want}", k.name(), y[i]);
            }
        }
    }

    #[test]
    fn rms_norm_matches_f64(seed: u64, li in 1..16usize) {
        let mut rng = rng(seed);
        let n = len(&mut rng, li).max(1);
        let x = random_f32s(&mut rng, n);
        let w = random_f32s(&mut rng, n);
        let eps = 1e-6f32;
        let ms: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for k in tables() {
            let mut out = vec![0f32; n];
            k.rms_norm(&x, &w, eps, &mut out);
            for i in 0..n {
                let want = x[i] as f64 * inv * w[i] as f64;
                prop_assert!(close(out[i], want, (n as f64 + 8.0) * 2.0 * EPS, 1e-30), "{} rms_norm[{i}]", k.name());
            }
        }
    }

    #[test]
    fn dots_and_axpy_match_f64(seed: u64, li in 0..16usize, alpha in -4.0f32..4.0) {
        let mut rng = rng(seed);
        let n = len(&mut rng, li);
        let a = random_f32s(&mut rng, n);
        let b = random_f32s(&mut rng, n);
        let bh: Vec<f16> = b.iter().map(|&v| f16::from_f32(v)).collect();
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let abs: f64 = a.iter().zip(&b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
        let exact_h: f64 = a.iter().zip(&bh).map(|(&x, y)| x as f64 * y.to_f64()).sum();
        let abs_h: f64 = a.iter().zip(&bh).map(|(&x, y)| (x as f64 * y.to_f64()).abs()).sum();
        for k in tables() {
            let d = k.dot_f32(&a, &b) as f64;
            prop_assert!((d - exact).abs() <= dot_tol(n, abs), "{} dot_f32 {d} vs {exact}", k.name());
            let d = k.dot_f32_f16(&a, &bh) as f64;
            prop_assert!((d - exact_h).abs() <= dot_tol(n, abs_h), "{} dot_f32_f16 {d} vs {exact_h}", k.name());

            let mut out = b.clone();
            k.axpy_f32(&mut out, alpha, &a);
            for i in 0..n {
                let want = b[i] as f64 + alpha as f64 * a[i] as f64;
                let tol = 2.0 * EPS * (b[i].abs() as f64 + (alpha * a[i]).abs() as f64) + 1e-30;
                prop_assert!((out[i] as f64 - want).abs() <= tol, "{} axpy_f32[{i}]", k.name());
            }
            let mut out = a.clone();
            k.axpy_f16(&mut out, alpha, &bh);
            for i in 0..n {
                let want = a[i] as f64 + alpha as f64 * bh[i].to_f64();
                let tol = 2.0 * EPS * (a[i].abs() as f64 + (alpha as f64 * bh[i].to_f64()).abs()) + 1e-30;
                prop_assert!((out[i] as f64 - want).abs() <= tol, "{} axpy_f16[{i}]", k.name());
            }

            let mut out = a.clone();
            k.add(&mut out, &b);
            for i in 0..n {
                prop_assert_eq!(out[i], a[i] + b[i]);
            }
            let mut out = a.clone();
            k.scale(&mut out, alpha);
            for i in 0..n {
                prop_assert_eq!(out[i], a[i] * alpha);
            }
        }
    }

    #[test]
    fn attention_helpers_match_f64(
        seed: u64, group in 1usize..=9, hdi in 0usize..5,
        // Long ranges too: the AVX2 values kernel works in blocks of keys (64 at hd 128).
        len in prop_oneof![1usize..=40, 60usize..=300], scale in 0.01f32..1.0
    ) {
        let hd = [8usize, 12, 16, 64, 128][hdi];
        let mut rng = rng(seed);
        let q = random_f32s(&mut rng, group * hd);
        let half = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<f16>>();
        let k = half(random_f32s(&mut rng, len * hd));
        let v = half(random_f32s(&mut rng, len * hd));
        let p: Vec<f32> = (0..group * len).map(|_| rng.random_range(0.0f32..1.0)).collect();
        for kern in tables() {
            let mut scores = vec![f32::NAN; group * len];
            kern.attn_scores_f16(&q, hd, &k, scale, &mut scores);
            let mut out = vec![f32::NAN; group * hd];
            kern.attn_values_f16(&p, hd, &v, &mut out);
            for h in 0..group {
                for j in 0..len {
                    let (qh, kj) = (&q[h * hd..(h + 1) * hd], &k[j * hd..(j + 1) * hd]);
                    let exact: f64 = qh.iter().zip(kj).map(|(&a, b)| a as f64 * b.to_f64()).sum::<f64>() * scale as f64;
                    let abs: f64 = qh.iter().zip(kj).map(|(&a, b)| (a as f64 * b.to_f64()).abs()).sum::<f64>() * scale as f64;
                    let got = scores[h * len + j] as f64;
                    prop_assert!((got - exact).abs() <= dot_tol(hd, abs) + 1e-30, "{} scores[{h},{j}] {got} vs {exact}", kern.name());
                }
                for c in 0..hd {
                    let terms = (0..len).map(|j| p[h * len + j] as f64 * v[j * hd + c].to_f64());
                    let exact: f64 = terms.clone().sum();
                    let abs: f64 = terms.map(f64::abs).sum();
                    let got = out[h * hd + c] as f64;
                    prop_assert!((got - exact).abs() <= dot_tol(len, abs) + 1e-30, "{} out[{h},{c}] {got} vs {exact}", kern.name());
                }
            }
        }
    }

    #[test]
    fn panel_dots_match_f64(
        seed: u64, depth in 0usize..=70, extra in 0usize..=13, ti in 0usize..4, tj in 0usize..4,
        integers: bool,
    ) {
        // Tiles anywhere in a row of any width that holds them (odd widths and depths
        // included). Small integers make every product and sum exact: each table gives the
        // same bits. The values are f32s, so both kernels take them exactly.
        let mut rng = rng(seed);
        let mut values = |stride: usize| -> Vec<f32> {
            (0..depth * stride)
                .map(|_| if integers { rng.random_range(-9i32..=9) as f32 } else { rng.random_range(-2.0f32..2.0) })
                .collect()
        };
        let (s64, s32) = (8 + extra, 16 + extra);
        let (p64, p32) = (values(s64), values(s32));
        let p64w: Vec<f64> = p64.iter().map(|&v| v as f64).collect();
        for k in tables() {
            let mut out64 = [[f64::NAN; 8]; 4];
            let (i0, j0) = (ti.min(s64 - 4), tj.min(s64 - 8));
            k.panel_dots_f64(&p64w, s64, i0, j0, &mut out64);
            let got = |r: usize, c: usize| out64[r][c];
            check_panel(&p64, s64, i0, j0, 8, got, integers, |abs| 1e-14 * abs + 1e-300)
                .map_err(|e| TestCaseError::fail(format!("{} f64 {e}", k.name())))?;
            let mut out32 = [[f32::NAN; 16]; 4];
            let (i0, j0) = (ti.min(s32 - 4), tj.min(s32 - 16));
            k.panel_dots_f32(&p32, s32, i0, j0, &mut out32);
            let got = |r: usize, c: usize| out32[r][c] as f64;
            check_panel(&p32, s32, i0, j0, 16, got, integers, |abs| dot_tol(depth, abs) + 1e-30)
                .map_err(|e| TestCaseError::fail(format!("{} f32 {e}", k.name())))?;
        }
    }

    #[test]
    fn f32_to_f16_rounds_like_half(seed: u64, li in 0..16usize) {
        let mut rng = rng(seed);
        let n = len(&mut rng, li);
        let mut x = wide(&mut rng, n);
        for v in x.iter_mut().step_by(5) {
            // Include overflow, subnormals and exact ties.
            *v = match rng.random_range(0..4) {
                0 => 70000.0,
                1 => 1e-6,
                2 => 1.0 + 2f32.powi(-11),
                _ => -65520.0,
            };
        }
        for k in tables() {
            let mut out = vec![f16::ZERO; n];
            k.f32_to_f16(&x, &mut out);
            for i in 0..n {
                prop_assert_eq!(out[i].to_bits(), f16::from_f32(x[i]).to_bits(), "{} {}", k.name(), x[i]);
            }
        }
    }
}

#[test]
fn softmax_handles_extremes() {
    for k in tables() {
        let mut x = vec![
            -1e30f32,
            0.0,
            1e30,
            -f32::INFINITY,
            5.0,
            1e30,
            -3.0,
            2.0,
            1.0,
        ];
        k.softmax(&mut x);
        let sum: f32 = x.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6, "{} {x:?}", k.name());
        assert!(
            (x[2] - 0.5).abs() < 1e-6 && (x[5] - 0.5).abs() < 1e-6,
            "{} {x:?}",
            k.name()
        );
        let mut empty: [f32; 0] = [];
        k.softmax(&mut empty);
    }
}

#[test]
#[should_panic(expected = "length mismatch")]
fn elementwise_rejects_mismatched_lengths() {
    Kernels::detect().add(&mut [0.0; 3], &[0.0; 4]);
}

/// Every f16 bit pattern (normal, subnormal, zero, infinity, NaN) reaches the f32 side of the
/// f16 kernels exactly: `out += 1 * x` on zeros gives `x` itself.
#[test]
fn f16_kernels_convert_every_half_exactly() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for k in tables() {
        let mut out = vec![0.0f32; all.len()];
        k.axpy_f16(&mut out, 1.0, &all);
        for (i, (&got, h)) in out.iter().zip(&all).enumerate() {
            let want = h.to_f32();
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{} axpy_f16 of {i:#06x}: {got:e} vs {want:e}",
                k.name()
            );
        }
        // The dot product's conversion: one value at a time against a one-hot row of 8.
        for i in (0..all.len()).step_by(7) {
            let mut b = [f16::ZERO; 8];
            b[i % 8] = all[i];
            let mut a = [0.0f32; 8];
            a[i % 8] = 1.0;
            let got = k.dot_f32_f16(&a, &b);
            let want = all[i].to_f32();
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{} dot_f32_f16 of {i:#06x}: {got:e} vs {want:e}",
                k.name()
            );
        }
    }
}
