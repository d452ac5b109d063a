//! Element-wise and per-row ops of encoder families (BERT) that the kernel tables do not
//! have: LayerNorm with a bias, and the exact (erf) GELU. Plain Rust written so that the
//! compiler vectorises the inner loops (eight independent accumulators, branch-free erf);
//! each is checked against an f64 reference in the tests below.

/// Sum of `x` in eight lanes (a vectorisable reduction), then across the lanes.
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// Sum of `(x - m)²` in eight lanes.
fn sum_sq_dev(x: &[f32], m: f32) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            let d = v - m;
            *a += d * d;
        }
    }
    acc.iter().sum::<f32>() + tail.iter().map(|v| (v - m) * (v - m)).sum::<f32>()
}

/// `x = (x - mean(x)) / √(var(x) + eps) · w + b` in place (the biased variance, as
/// `torch.nn.LayerNorm`). `w`, `b` and `x` have one length.
pub fn layer_norm_in_place(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    debug_assert!(x.len() == w.len() && x.len() == b.len());
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let var = sum_sq_dev(x, mean) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, &wi), &bi) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * wi + bi;
    }
}

/// `erf(x)` by Abramowitz & Stegun 7.1.28, `1 - 1 / (1 + a1 x + ... + a6 x⁶)¹⁶` for
/// `x >= 0` (odd for negative `x`): absolute error at most 3e-7, no branches and no `exp`, so
/// it vectorises. Evaluated in f64: in f32 the sixteenth power and `1 - 1/p` lose up to
/// 1.4e-6 near 0.
#[inline]
pub fn erf(x: f32) -> f32 {
    const A: [f64; 6] = [
        0.070_523_078_4,
        0.042_282_012_3,
        0.009_270_527_2,
        0.000_152_014_3,
        0.000_276_567_2,
        0.000_043_063_8,
    ];
    let t = (x as f64).abs();
    let p = 1.0 + t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * (A[4] + t * A[5])))));
    let p2 = p * p;
    let p4 = p2 * p2;
    let p8 = p4 * p4;
    let p16 = p8 * p8;
    ((1.0 - 1.0 / p16) as f32).copysign(x)
}

/// `gelu(x) = 0.5 x (1 + erf(x / √2))`.
#[inline]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `x = gelu(x)` in place.
pub fn gelu_in_place(x: &mut [f32]) {
    for v in x {
        *v = gelu(*v);
    }
}

/// `gate = gelu(gate) · up`.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu(*g) * u;
    }
}

/// gpt-oss's clamped SwiGLU: `gate = g · sigmoid(alpha · g) · (u + 1)` with `g = min(gate,
/// limit)` and `u = clamp(up, -limit, limit)`.
pub fn clamped_swiglu_mul(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let u = u.clamp(-limit, limit);
        *g = x / (1.0 + (-alpha * x).exp()) * (u + 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 by its Taylor series (|x| <= 3) or the asymptotic continued fraction: an
    /// independent reference for the approximation.
    fn erf64(x: f64) -> f64 {
        let t = x.abs();
        let r = if t < 3.0 {
            let (mut term, mut s, mut n) = (t, t, 0.0f64);
            while term.abs() > 1e-17 * s.abs() {
                n += 1.0;
                term *= -t * t / n;
                s += term / (2.0 * n + 1.0);
            }
            s * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(t) = exp(-t²)/√π · 1/(t + 1/2/(t + 1/(t + 3/2/(t + ...)))).
            let mut f = t;
            for k in (1..60).rev() {
                f = t + (k as f64 / 2.0) / f;
            }
            1.0 - (-t * t).exp() / std::f64::consts::PI.sqrt() / f
        };
        r.copysign(x)
    }

    #[test]
    fn erf_is_within_3e_7_of_the_series() {
        let mut worst = 0f64;
        for i in -6000..=6000 {
            let x = i as f64 / 1000.0;
            let e = (erf(x as f32) as f64 - erf64(x)).abs();
            worst = worst.max(e);
        }
        // A&S's bound is 3e-7 (plus the f32 result's rounding).
        eprintln!("worst erf error {worst:e}");
        assert!(worst < 3.2e-7, "worst erf error {worst:e}");
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(50.0), 1.0);
        assert_eq!(erf(-50.0), -1.0);
        assert!(erf(f32::NAN).is_nan());
    }

    #[test]
    fn gelu_matches_its_definition() {
        for i in -800..=800 {
            let x = i as f64 / 100.0;
            let want = 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
            let got = gelu(x as f32) as f64;
            assert!(
                (got - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "gelu({x}) = {got}, want {want}"
            );
        }
        let mut g = [1.0f32, -2.0, 0.5];
        gelu_mul(&mut g, &[2.0, 3.0, -1.0]);
        assert!((g[0] - 2.0 * gelu(1.0)).abs() < 1e-7);
        assert!((g[1] - 3.0 * gelu(-2.0)).abs() < 1e-7);
        assert!((g[2] + gelu(0.5)).abs() < 1e-7);
    }

    #[test]
    fn layer_norm_matches_f64_on_odd_lengths() {
        for n in [1usize, 2, 3, 5, 7, 8, 9, 15, 17, 33, 384, 385] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 97) as f32 - 40.0) * 0.37 + 3.0)
                .collect();
            let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 3) as f32 * 0.1 - 0.1).collect();
            let eps = 1e-12f32;
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let mut got = x.clone();
            layer_norm_in_place(&mut got, &w, &b, eps);
            for i in 0..n {
                let want =
                    (x[i] as f64 - mean) / (var + eps as f64).sqrt() * w[i] as f64 + b[i] as f64;
                assert!(
                    (got[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                    "n {n} i {i}: {} vs {want}",
                    got[i]
                );
            }
        }
    }
}
