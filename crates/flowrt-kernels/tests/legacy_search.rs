//! The weight quantisers' scale search for Q4_0, Q4_1, Q5_0 and Q5_1
//! (`Kernels::quantize_row_weights`, `src/scalar/legacy_search.rs`) against ggml's reference
//! rule (`Kernels::quantize_row`): never a block with more squared error, a stated margin less
//! on Gaussian rows, and bytes the standard ggml formula decodes (read here from the bytes,
//! independently of the crate's decoders).

mod common;

use common::*;
use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Kernels};
use proptest::prelude::*;
use rand::Rng;

const TYPES: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
];

/// Reference bytes and searched bytes of `x`.
fn both(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let k = Kernels::scalar();
    let mut plain = vec![0u8; row_size(ty, x.len())];
    let mut searched = plain.clone();
    k.quantize_row(ty, x, &mut plain);
    k.quantize_row_weights(ty, x, &mut searched);
    (plain, searched)
}

/// Squared error of each block of `row` (decoded with ggml's formula, in f64) against `x`.
fn block_errors(ty: GgmlType, x: &[f32], row: &[u8]) -> Vec<f64> {
    let y = decode_f64(ty, row);
    assert_eq!(y.len(), x.len());
    x.chunks(32)
        .zip(y.chunks(32))
        .map(|(xb, yb)| {
            xb.iter()
                .zip(yb)
                .map(|(&a, &b)| (a as f64 - b).powi(2))
                .sum()
        })
        .collect()
}

/// Every block's searched error is at most the reference's (up to the f32 rounding of the
/// decoder's `d * q + m`, which the f64 decode here does not have).
fn assert_never_worse(ty: GgmlType, x: &[f32], what: &str) {
    let (plain, searched) = both(ty, x);
    let (ep, es) = (block_errors(ty, x, &plain), block_errors(ty, x, &searched));
    for (b, (p, s)) in ep.iter().zip(&es).enumerate() {
        let scale: f64 = x[32 * b..32 * b + 32]
            .iter()
            .map(|&v| (v as f64).powi(2))
            .sum();
        assert!(
            s <= &(p + 1e-12 * scale),
            "{ty} {what} block {b}: searched error {s:e} above the reference's {p:e} ({:?})",
            &x[32 * b..32 * b + 32]
        );
        if p.is_finite() {
            assert!(s.is_finite(), "{ty} {what} block {b}: non-finite output");
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Random blocks (exact zeros, duplicates, magnitudes from tiny to near f16's largest):
    /// never more error than the reference.
    #[test]
    fn searched_error_never_above_reference(seed in any::<u64>(), nb in 1usize..6) {
        let mut rng = rng(seed);
        let x = match rng.random_range(0..3) {
            0 => random_f32s(&mut rng, 32 * nb),
            1 => {
                let s = random_scale(&mut rng);
                (0..32 * nb).map(|_| s * normal(&mut rng)).collect()
            }
            _ => {
                // Heavy tails: a few large values among small ones.
                (0..32 * nb)
                    .map(|_| {
                        let z = normal(&mut rng);
                        if rng.random_bool(0.05) { 20.0 * z } else { z }
                    })
                    .collect()
            }
        };
        for ty in TYPES {
            assert_never_worse(ty, &x, "random");
        }
    }
}

/// All-zero, constant, one-outlier and other odd blocks: never worse than the reference,
/// finite, zeros back as zeros.
#[test]
fn odd_blocks_never_worse() {
    let mut rng = rng(7);
    let gauss: Vec<f32> = (0..32).map(|_| normal(&mut rng)).collect();
    let mut cases: Vec<(&str, Vec<f32>)> = vec![
        ("all zero", vec![0.0; 32]),
        ("constant", vec![0.37; 32]),
        ("negative constant", vec![-1234.5; 32]),
        (
            "two values",
            (0..32)
                .map(|i| if i % 2 == 0 { 1.0 } else { -0.25 })
                .collect(),
        ),
        ("tiny", gauss.iter().map(|v| v * 1e-9).collect()),
        (
            "f16 subnormal range",
            gauss.iter().map(|v| v * 1e-6).collect(),
        ),
        (
            "near f16's largest scale",
            gauss.iter().map(|v| v * 1.2e5).collect(),
        ),
        ("ramp", (0..32).map(|i| i as f32 / 31.0).collect()),
    ];
    let mut outlier = vec![0.0f32; 32];
    outlier[13] = -3.0;
    cases.push(("one outlier among zeros", outlier));
    let mut g = gauss.clone();
    g[5] = 40.0;
    cases.push(("gaussian with one outlier", g));
    let mut g = gauss.clone();
    g[31] = -40.0;
    cases.push(("gaussian with one negative outlier", g));
    cases.push(("gaussian", gauss));
    for ty in TYPES {
        for (what, x) in &cases {
            assert_never_worse(ty, x, what);
        }
        let (_, s) = both(ty, &[0.0; 32]);
        assert!(decode_f64(ty, &s).iter().all(|&v| v == 0.0), "{ty}: zeros");
    }
}

/// Non-finite input keeps the reference bytes (no panic, no other substitute).
#[test]
fn non_finite_blocks_keep_the_reference_bytes() {
    for ty in TYPES {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
            x[40] = bad;
            let (p, s) = both(ty, &x);
            let bs = row_size(ty, 32);
            assert_eq!(p[bs..], s[bs..], "{ty} {bad}: the non-finite block");
        }
    }
}

/// The searched bytes decode with ggml's formula (`d (q - 8)`, `d q + m`, `d (q - 16)`,
/// `d q + m` from the bytes, in f64) to what the crate's dequantiser gives, in every table.
#[test]
fn searched_bytes_decode_with_the_ggml_formula() {
    let mut rng = rng(11);
    let x: Vec<f32> = (0..32 * 64).map(|_| normal(&mut rng)).collect();
    for ty in TYPES {
        let (_, s) = both(ty, &x);
        let want = decode_f64(ty, &s);
        for k in tables() {
            let mut again = vec![0u8; s.len()];
            k.quantize_row_weights(ty, &x, &mut again);
            assert_eq!(
                again,
                s,
                "{ty} {:?}: the same bytes in every table",
                k.isa()
            );
            let mut got = vec![0f32; x.len()];
            k.dequantize_row(ty, &s, &mut got);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - w).abs() <= 1e-6 * w.abs().max(1e-3),
                    "{ty} {:?} value {i}: {g} against {w}",
                    k.isa()
                );
            }
        }
    }
}

/// The other types are quantised as `quantize_row` does.
#[test]
fn other_types_are_unchanged() {
    let mut rng = rng(3);
    let x: Vec<f32> = (0..512).map(|_| normal(&mut rng)).collect();
    let k = Kernels::scalar();
    for ty in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16] {
        let mut a = vec![0u8; row_size(ty, x.len())];
        let mut b = a.clone();
        k.quantize_row(ty, &x, &mut a);
        k.quantize_row_weights(ty, &x, &mut b);
        assert_eq!(a, b, "{ty}");
    }
}

/// On a Gaussian matrix the relative RMS error falls by at least the stated margin (measured
/// ratios searched / reference: Q4_0 0.9417, Q4_1 0.8899, Q5_0 0.9372, Q5_1 0.8870; the
/// bounds leave about 1.3 points): fails if the search is bypassed or loses most of its effect.
#[test]
fn gaussian_error_falls_by_a_margin() {
    let mut rng = rng(2024);
    let x: Vec<f32> = (0..64 * 4096).map(|_| normal(&mut rng) * 0.02).collect();
    let norm: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
    for (ty, bound) in [
        (GgmlType::Q4_0, 0.955),
        (GgmlType::Q4_1, 0.905),
        (GgmlType::Q5_0, 0.95),
        (GgmlType::Q5_1, 0.90),
    ] {
        let (p, s) = both(ty, &x);
        let rel = |r: &[u8]| (block_errors(ty, &x, r).iter().sum::<f64>() / norm).sqrt();
        let (rp, rs) = (rel(&p), rel(&s));
        println!(
            "{ty}: relative RMS error {rp:.6} -> {rs:.6}, ratio {:.4}",
            rs / rp
        );
        assert!(
            rs / rp <= bound,
            "{ty}: searched/reference error ratio {:.4} above {bound}",
            rs / rp
        );
    }
}

/// Squared error of each block of `row` against `x`, each value's weighted by `w`.
fn weighted_block_errors(ty: GgmlType, x: &[f32], w: &[f32], row: &[u8]) -> Vec<f64> {
    let y = decode_f64(ty, row);
    x.chunks(32)
        .zip(y.chunks(32))
        .zip(w.chunks(32))
        .map(|((xb, yb), wb)| {
            xb.iter()
                .zip(yb)
                .zip(wb)
                .map(|((&a, &b), &w)| w as f64 * (a as f64 - b).powi(2))
                .sum()
        })
        .collect()
}

/// Importance weights of one row: spread over four orders of magnitude, some exactly 0.
fn random_weights(rng: &mut TestRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            if rng.random_bool(0.05) {
                0.0
            } else {
                10f32.powf(rng.random_range(-2.0..2.0))
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(config(128))]

    /// With importance weights, no block's weighted error is above the reference bytes'; with
    /// every weight 1 the bytes are exactly the unweighted search's.
    #[test]
    fn weighted_search_never_above_reference(seed in any::<u64>(), nb in 1usize..5) {
        let mut rng = rng(seed);
        let s = random_scale(&mut rng);
        let x: Vec<f32> = (0..32 * nb).map(|_| s * normal(&mut rng)).collect();
        let w = random_weights(&mut rng, x.len());
        let k = Kernels::scalar();
        for ty in TYPES {
            let (plain, searched) = both(ty, &x);
            let mut weighted = vec![0u8; row_size(ty, x.len())];
            k.quantize_row_weighted(ty, &x, Some(&w), &mut weighted);
            let ep = weighted_block_errors(ty, &x, &w, &plain);
            let ew = weighted_block_errors(ty, &x, &w, &weighted);
            for (b, (p, e)) in ep.iter().zip(&ew).enumerate() {
                let scale: f64 = x[32 * b..32 * b + 32]
                    .iter()
                    .zip(&w[32 * b..32 * b + 32])
                    .map(|(&v, &w)| w as f64 * (v as f64).powi(2))
                    .sum();
                // (A block whose reference decodes to a non-finite value, an f16 overflow of
                // its scale, has no error to compare with.)
                if p.is_finite() {
                    prop_assert!(e <= &(p + 1e-12 * scale), "{} block {}: {:e} > {:e}", ty, b, e, p);
                }
            }
            let ones = vec![1f32; x.len()];
            let mut unit = vec![0u8; row_size(ty, x.len())];
            k.quantize_row_weighted(ty, &x, Some(&ones), &mut unit);
            prop_assert_eq!(&unit, &searched, "{} with unit weights", ty);
        }
    }
}

/// On a Gaussian matrix whose columns have importances spread over four orders of magnitude
/// (as activation columns have), the weighted search's total weighted error is well below the
/// unweighted search's (measured ratios in the test's output; the bound fails if the weights
/// are ignored).
#[test]
fn weights_lower_the_weighted_error() {
    let mut rng = rng(7);
    let (rows, cols) = (64, 2048);
    let x: Vec<f32> = (0..rows * cols).map(|_| normal(&mut rng) * 0.02).collect();
    let w = random_weights(&mut rng, cols);
    let k = Kernels::scalar();
    for ty in TYPES {
        let (mut unweighted, mut weighted) = (0f64, 0f64);
        for r in x.chunks(cols) {
            let (_, searched) = both(ty, r);
            let mut q = vec![0u8; row_size(ty, cols)];
            k.quantize_row_weighted(ty, r, Some(&w), &mut q);
            unweighted += weighted_block_errors(ty, r, &w, &searched)
                .iter()
                .sum::<f64>();
            weighted += weighted_block_errors(ty, r, &w, &q).iter().sum::<f64>();
        }
        let ratio = weighted / unweighted;
        println!("{ty}: weighted error, weighted / unweighted search {ratio:.4}");
        assert!(ratio <= 0.8, "{ty}: ratio {ratio:.4}");
    }
}

/// Every x86 and NEON table quantises weighted rows to the same bytes as the scalar one.
#[test]
fn weighted_bytes_are_the_same_in_every_table() {
    let mut rng = rng(11);
    let x: Vec<f32> = (0..32 * 64).map(|_| normal(&mut rng)).collect();
    let w = random_weights(&mut rng, x.len());
    for ty in TYPES {
        let mut want = vec![0u8; row_size(ty, x.len())];
        Kernels::scalar().quantize_row_weighted(ty, &x, Some(&w), &mut want);
        let mut got = vec![0u8; want.len()];
        Kernels::detect().quantize_row_weighted(ty, &x, Some(&w), &mut got);
        assert_eq!(got, want, "{ty}");
    }
}
