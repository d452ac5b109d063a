//! Quantisation and dequantisation: every table against the scalar reference (same bytes),
//! the scalar reference against independent decoding, and round-trip error bounds.

mod common;

use common::*;
use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Kernels};
use proptest::prelude::*;
use rand::Rng;

/// The first 7 are checked for round-trip error here; the rest (Q5_0, Q5_1, k-quants, Q8_K)
/// in `kquants.rs`.
const ALL_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
];

fn quantize(k: &Kernels, ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; row_size(ty, x.len())];
    k.quantize_row(ty, x, &mut out);
    out
}

fn dequantize(k: &Kernels, ty: GgmlType, row: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    k.dequantize_row(ty, row, &mut out);
    out
}

fn scale_of(ty: GgmlType, row: &[u8], block: usize) -> f64 {
    let size = ty.type_size() as usize;
    let b = &row[block * size..];
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64()
}

proptest! {
    #![proptest_config(config(128))]

    /// SIMD quantisers write exactly the scalar reference's bytes.
    #[test]
    fn quantize_matches_scalar_bytes(seed: u64, nblocks in 1..=40usize, ti in 0..13usize) {
        let mut rng = rng(seed);
        let ty = ALL_TYPES[ti];
        let n = nblocks * ty.block_size() as usize * if ty.block_size() == 1 { 7 } else { 1 };
        let x = random_f32s(&mut rng, n);
        let want = quantize(Kernels::scalar(), ty, &x);
        for k in tables() {
            prop_assert_eq!(&quantize(k, ty, &x), &want, "{} {}", k.name(), ty);
        }
    }

    /// Every table decodes like an independent decoder working from the bytes.
    #[test]
    fn dequantize_matches_independent_decoder(seed: u64, nblocks in 1..=20usize, ti in 0..13usize) {
        let mut rng = rng(seed);
        let ty = ALL_TYPES[ti];
        let n = nblocks * ty.block_size() as usize;
        let row = match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => random_weight_row(&mut rng, ty, n),
            _ => random_quant_row(&mut rng, ty, n),
        };
        let want = decode_f64(ty, &row);
        for k in tables() {
            let got = dequantize(k, ty, &row, n);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                // d * q (+ m) rounds once in f32 (twice with m).
                let tol = 4.0 * EPS * w.abs().max(1e-30) + if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    4.0 * EPS * (scale_of(ty, &row, i / 32).abs() * 31.0 + w.abs())
                } else { 0.0 };
                prop_assert!((g as f64 - w).abs() <= tol, "{} {ty}[{i}]: {g} vs {w}", k.name());
            }
        }
    }

    /// quantize then dequantize stays within the format's rounding error.
    #[test]
    fn round_trip_error_is_bounded(seed: u64, nblocks in 1..=20usize, ti in 0..7usize) {
        let mut rng = rng(seed);
        let ty = ALL_TYPES[ti];
        let n = nblocks * ty.block_size() as usize;
        let x = random_f32s(&mut rng, n);
        for k in tables() {
            let row = quantize(k, ty, &x);
            let y = dequantize(k, ty, &row, n);
            for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                let (a, b) = (a as f64, b as f64);
                let blk = i / 32;
                let amax = x[blk * 32..(blk * 32 + 32).min(n)]
                    .iter().fold(0f64, |m, v| m.max(v.abs() as f64));
                let blk_x = &x[blk * 32..(blk * 32 + 32).min(n)];
                let (lo, hi) = blk_x
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v as f64), h.max(v as f64)));
                // The stored (f16) scale and offset differ from the exact ones by their rounding.
                let stored = |off: usize| {
                    let b = &row[blk * ty.type_size() as usize + off..];
                    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64()
                };
                let tol = match ty {
                    GgmlType::F32 => 0.0,
                    GgmlType::F16 => a.abs() * 2f64.powi(-11) + 6e-8,
                    GgmlType::BF16 => a.abs() * 2f64.powi(-8),
                    // d = amax/127: half a step, plus q times the scale's rounding.
                    GgmlType::Q8_0 | GgmlType::Q8_1 => {
                        let d = amax / 127.0;
                        0.51 * d + 128.0 * (d - stored(0)).abs()
                    }
                    // |d| = amax/8: one step at the clamped end.
                    GgmlType::Q4_0 => {
                        let d = amax / 8.0;
                        1.01 * d + 16.0 * (d - stored(0).abs()).abs()
                    }
                    // d = (max - min)/15, m = min: half a step plus the f16 rounding of d and m.
                    _ => {
                        let d = (hi - lo) / 15.0;
                        0.51 * d + 15.0 * (d - stored(0)).abs() + (lo - stored(2)).abs()
                    }
                };
                prop_assert!((a - b).abs() <= tol + 1e-30, "{} {ty}[{i}]: {a} -> {b} (tol {tol})", k.name());
            }
        }
    }
}

/// Q8_1's `s` is `d * sum(q)` with `d` before its rounding to f16 (ggml's definition).
#[test]
fn q8_1_sum_field() {
    let mut rng = rng(3);
    let x = random_f32s(&mut rng, 64);
    for k in tables() {
        let row = quantize(k, GgmlType::Q8_1, &x);
        for (b, blk) in row.chunks_exact(36).enumerate() {
            let xb = &x[b * 32..b * 32 + 32];
            let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let sum: i32 = blk[4..].iter().map(|&q| q as i8 as i32).sum();
            let s = half::f16::from_bits(u16::from_le_bytes([blk[2], blk[3]]));
            assert_eq!(s, half::f16::from_f32(d * sum as f32), "{}", k.name());
        }
    }
}

/// Exact ties round away from zero (C `roundf`), in every table.
#[test]
fn q8_rounding_ties_go_away_from_zero() {
    // amax = 127 gives d = 1 and 1/d = 1, so x * (1/d) = x exactly.
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    let ties = [
        0.5f32, -0.5, 1.5, -1.5, 2.5, -2.5, 100.5, -100.5, 126.5, -126.5,
    ];
    x[1..1 + ties.len()].copy_from_slice(&ties);
    x[20] = 2.4999998;
    x[21] = -2.5000002;
    for k in tables() {
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
            let row = quantize(k, ty, &x);
            let off = if ty == GgmlType::Q8_0 { 2 } else { 4 };
            let q: Vec<i8> = row[off..off + 32].iter().map(|&b| b as i8).collect();
            assert_eq!(q[0], 127);
            assert_eq!(
                &q[1..11],
                &[1, -1, 2, -2, 3, -3, 101, -101, 127, -127],
                "{}",
                k.name()
            );
            assert_eq!((q[20], q[21]), (2, -3), "{}", k.name());
        }
    }
}

#[test]
fn all_zero_block_quantises_to_zero() {
    for k in tables() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q8_1,
        ] {
            let row = quantize(k, ty, &[0.0; 32]);
            assert!(
                dequantize(k, ty, &row, 32).iter().all(|&v| v == 0.0),
                "{} {ty}",
                k.name()
            );
        }
    }
}

/// The Q4 quantisers follow ggml's rules on a hand-checked block.
#[test]
fn q4_reference_values() {
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect(); // -16..=15
    let row = quantize(Kernels::scalar(), GgmlType::Q4_0, &x);
    // max |x| is -16 => d = -16 / -8 = 2; q = trunc(x / 2 + 8.5) clamped to 15.
    assert_eq!(
        half::f16::from_bits(u16::from_le_bytes([row[0], row[1]])).to_f32(),
        2.0
    );
    let q = |j: usize| {
        if j < 16 {
            row[2 + j] & 15
        } else {
            row[2 + j - 16] >> 4
        }
    };
    for (j, &v) in x.iter().enumerate() {
        let want = ((v / 2.0 + 8.5) as i32).min(15) as u8;
        assert_eq!(q(j), want, "value {j}");
    }
    let row = quantize(Kernels::scalar(), GgmlType::Q4_1, &x);
    // min -16, max 15 => d = 31/15, m = -16.
    let d = half::f16::from_bits(u16::from_le_bytes([row[0], row[1]])).to_f32();
    let m = half::f16::from_bits(u16::from_le_bytes([row[2], row[3]])).to_f32();
    assert_eq!(m, -16.0);
    assert_eq!(d, half::f16::from_f32(31.0 / 15.0).to_f32());
    assert_eq!(row[4] & 15, 0);
    assert_eq!(row[4 + 15] >> 4, 15);
}

#[test]
fn random_multiples_of_32_quantise_consistently() {
    let mut rng = rng(11);
    for _ in 0..20 {
        let n = 32 * rng.random_range(1..=50);
        let x = random_f32s(&mut rng, n);
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
            let want = quantize(Kernels::scalar(), ty, &x);
            for k in tables() {
                assert_eq!(quantize(k, ty, &x), want, "{} {ty} n={n}", k.name());
            }
        }
    }
}

#[test]
#[should_panic(expected = "output length")]
fn quantize_rejects_wrong_output_length() {
    Kernels::detect().quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut [0u8; 33]);
}

#[test]
#[should_panic(expected = "not a multiple")]
fn quantize_rejects_partial_block() {
    Kernels::detect().quantize_row(GgmlType::Q8_0, &[0.0; 31], &mut [0u8; 34]);
}
