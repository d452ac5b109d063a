//! Q5_0, Q5_1, the k-quants and Q8_K: quantise -> dequantise error bounds (from the stored
//! scales and from the data), and Q8_K's own invariants. Format correctness is
//! `gguf_golden.rs`; SIMD vs scalar and exact-math checks are in `dot.rs`, `quant.rs` and
//! `q16.rs`.

mod common;

use common::*;
use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Kernels};
use proptest::prelude::*;

fn round_trip(kern: &Kernels, ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut row = vec![0u8; row_size(ty, x.len())];
    kern.quantize_row(ty, x, &mut row);
    let mut y = vec![0f32; x.len()];
    kern.dequantize_row(ty, &row, &mut y);
    (row, y)
}

fn f16_at(b: &[u8], off: usize) -> f64 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f64()
}

fn range(x: &[f32]) -> (f64, f64) {
    x.iter().fold((f64::MAX, f64::MIN), |(l, h), &v| {
        (l.min(v as f64), h.max(v as f64))
    })
}

/// Checks `|x - y| <= tol(i)` for every value.
fn check(
    ty: GgmlType,
    kern: &Kernels,
    x: &[f32],
    y: &[f32],
    tol: impl Fn(usize) -> f64,
) -> Result<(), TestCaseError> {
    for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
        let t = tol(i) + 4.0 * EPS * (a as f64).abs() + 1e-30;
        prop_assert!(
            ((a - b) as f64).abs() <= t,
            "{} {ty}[{i}]: {a} -> {b} (tol {t:e})",
            kern.name()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(96))]

    /// Q5_0: one step at the clamped end (`|d| = amax / 16`), plus the f16 rounding of `d`.
    /// Q5_1: half a step (`d = (max - min) / 31`) plus the f16 rounding of `d` and `m`.
    #[test]
    fn q5_round_trip_error_is_bounded(seed: u64, nblocks in 1..=20usize, one in any::<bool>()) {
        let mut rng = rng(seed);
        let ty = if one { GgmlType::Q5_1 } else { GgmlType::Q5_0 };
        let x = random_f32s(&mut rng, 32 * nblocks);
        let size = ty.type_size() as usize;
        for kern in tables() {
            let (row, y) = round_trip(kern, ty, &x);
            check(ty, kern, &x, &y, |i| {
                let (b, xb) = (i / 32, &x[i / 32 * 32..i / 32 * 32 + 32]);
                let (lo, hi) = range(xb);
                let blk = &row[b * size..];
                if one {
                    let d = (hi - lo) / 31.0;
                    0.51 * d + 31.0 * (d - f16_at(blk, 0)).abs() + (lo - f16_at(blk, 2)).abs()
                } else {
                    let d = lo.abs().max(hi.abs()) / 16.0;
                    1.01 * d + 32.0 * (d - f16_at(blk, 0).abs()).abs()
                }
            })?;
        }
    }

    /// Q4_K/Q5_K/Q6_K (error-minimising quantisers, `search_quant.rs` for their error): the
    /// stored super-block scales are non-negative for Q4_K/Q5_K, and every value comes back as
    /// the level of its sub-block nearest to it, `d sc_j q - dmin m_j` over `q` in 0..=15 (31),
    /// `d sc_j q` over `q` in -32..=31 for Q6_K, computed in f64 from the stored bytes: the
    /// search may clamp extreme values to the end level, but never rounds a value to a level
    /// farther than another.
    #[test]
    fn k_quants_round_to_the_nearest_level(seed: u64, nsb in 1..=6usize, ti in 0..3usize) {
        let mut rng = rng(seed);
        let ty = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K][ti];
        let x = random_f32s(&mut rng, 256 * nsb);
        let size = ty.type_size() as usize;
        for kern in tables() {
            let (row, y) = round_trip(kern, ty, &x);
            for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                let blk = &row[i / 256 * size..];
                let levels: Vec<f64> = match ty {
                    GgmlType::Q6K => {
                        let step = f16_at(blk, 208) * blk[192 + i % 256 / 16] as i8 as f64;
                        (-32..32).map(|q| step * q as f64).collect()
                    }
                    _ => {
                        let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                        prop_assert!(d >= 0.0 && dmin >= 0.0, "{} {ty}: d {d} dmin {dmin}", kern.name());
                        let (sc, m) = k4_scale_min(&blk[4..16], i % 256 / 32);
                        let qmax = if ty == GgmlType::Q5K { 31 } else { 15 };
                        (0..=qmax).map(|q| d * sc * q as f64 - dmin * m).collect()
                    }
                };
                let (a, b) = (a as f64, b as f64);
                let nearest = levels.iter().fold(f64::INFINITY, |m, &l| m.min((a - l).abs()));
                let t = nearest * (1.0 + 1e-6) + 4.0 * EPS * levels.iter().fold(a.abs(), |m, &l| m.max(l.abs()));
                prop_assert!((a - b).abs() <= t, "{} {ty}[{i}]: {a} -> {b}, a level is {nearest} away", kern.name());
            }
        }
    }

    /// Q8_K: half a step of `amax / 127`, values in -127..=127, `bsums` exact.
    #[test]
    fn q8_k_round_trip_and_sums(seed: u64, nsb in 1..=6usize) {
        let mut rng = rng(seed);
        let ty = GgmlType::Q8K;
        let x = random_f32s(&mut rng, 256 * nsb);
        for kern in tables() {
            let (row, y) = round_trip(kern, ty, &x);
            for (s, blk) in row.chunks_exact(292).enumerate() {
                let qs: Vec<i32> = blk[4..260].iter().map(|&q| q as i8 as i32).collect();
                prop_assert!(qs.iter().all(|q| q.abs() <= 127));
                for g in 0..16 {
                    let sum = i16::from_le_bytes([blk[260 + 2 * g], blk[261 + 2 * g]]) as i32;
                    prop_assert_eq!(sum, qs[16 * g..16 * g + 16].iter().sum::<i32>(), "block {}", s);
                }
            }
            check(ty, kern, &x, &y, |i| {
                let xb = &x[i / 256 * 256..i / 256 * 256 + 256];
                0.51 * xb.iter().fold(0f64, |m, &v| m.max((v as f64).abs())) / 127.0
            })?;
        }
    }
}

#[test]
fn all_zero_blocks_quantise_to_zero() {
    for kern in tables() {
        for ty in [
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::Q8K,
        ] {
            let n = ty.block_size() as usize;
            let (_, y) = round_trip(kern, ty, &vec![0.0; n]);
            assert!(y.iter().all(|&v| v == 0.0), "{} {ty}", kern.name());
        }
    }
}

/// A k-quant matmul through the ggml path (Q8_K activations) and the Q16 path agree with the
/// f64 dot of the dequantised weights and the unquantised activations, to the precision of
/// their activation types (8-bit: 2e-2 of the terms' magnitude; 16-bit: 2e-4).
#[test]
fn both_activation_paths_approximate_exact_math() {
    let mut rng = rng(5);
    let kern = Kernels::detect();
    for ty in [
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        let k = 2304;
        let x = random_f32s(&mut rng, k);
        let w: Vec<f32> = random_f32s(&mut rng, k);
        let mut wrow = vec![0u8; row_size(ty, k)];
        kern.quantize_row(ty, &w, &mut wrow);
        let mut wd = vec![0f32; k];
        kern.dequantize_row(ty, &wrow, &mut wd);
        let exact: f64 = wd.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let scale: f64 = decode_parts_f64(ty, &wrow)
            .iter()
            .zip(&x)
            .map(|((p, o), &b)| (p.abs() + o.abs()) * (b as f64).abs())
            .sum();
        let at = Kernels::vec_dot_type(ty);
        let mut a8 = vec![0u8; row_size(at, k)];
        kern.quantize_row(at, &x, &mut a8);
        let got8 = kern.vec_dot(ty, k, &wrow, &a8) as f64;
        let mut a16 = vec![0u8; flowrt_kernels::q16::q16_row_size(k)];
        kern.quantize_row_q16(&x, &mut a16);
        let mut out = [0f32];
        kern.matmul_q16(ty, k, &wrow, 1, &a16, 1, &mut out, 1);
        let got16 = out[0] as f64;
        assert!(
            (got8 - exact).abs() <= 2e-2 * scale,
            "{ty} q8: {got8} vs {exact}"
        );
        assert!(
            (got16 - exact).abs() <= 2e-4 * scale,
            "{ty} q16: {got16} vs {exact}"
        );
    }
}
