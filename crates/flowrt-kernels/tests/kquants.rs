//! Q5_0, Q5_1, the k-quants and Q8_K: quantise -> dequantise error bounds (per sub-block, from
//! the stored scales and from the data), and Q8_K's own invariants. Format correctness is
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

    /// Q4_K/Q5_K: half a step of the stored sub-block scale `d sc_j`, and that step is at most
    /// the sub-block's range (from min(0, lo) to hi, widened by one `dmin` step) over 15 (31),
    /// plus one `d` step: the 6-bit factors are rounded up, never clamping a value.
    #[test]
    fn k_minmax_round_trip_error_is_bounded(seed: u64, nsb in 1..=6usize, five in any::<bool>()) {
        let mut rng = rng(seed);
        let (ty, levels) = if five { (GgmlType::Q5K, 31.0) } else { (GgmlType::Q4K, 15.0) };
        let x = random_f32s(&mut rng, 256 * nsb);
        let size = ty.type_size() as usize;
        for kern in tables() {
            let (row, y) = round_trip(kern, ty, &x);
            for (s, blk) in row.chunks_exact(size).enumerate() {
                let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                prop_assert!(d >= 0.0 && dmin >= 0.0, "{} {ty}: d {d} dmin {dmin}", kern.name());
                for j in 0..8 {
                    let xb = &x[256 * s + 32 * j..256 * s + 32 * j + 32];
                    let (lo, hi) = range(xb);
                    let step = d * k4_scale_min(&blk[4..16], j).0;
                    let bound = (hi - lo.min(0.0) + dmin) / levels + d;
                    prop_assert!(step <= bound * (1.0 + 1e-6) + 1e-30,
                        "{} {ty} sub-block {j}: step {step} > {bound}", kern.name());
                }
            }
            check(ty, kern, &x, &y, |i| {
                let blk = &row[i / 256 * size..];
                let step = f16_at(blk, 0) * k4_scale_min(&blk[4..16], i % 256 / 32).0;
                0.5 * step * (1.0 + 1e-6)
            })?;
        }
    }

    /// Q6_K: half a step of `d sc_j` (16-value sub-blocks), the step at most `amax_j / 31`
    /// plus one `d` step.
    #[test]
    fn q6_k_round_trip_error_is_bounded(seed: u64, nsb in 1..=6usize) {
        let mut rng = rng(seed);
        let ty = GgmlType::Q6K;
        let x = random_f32s(&mut rng, 256 * nsb);
        for kern in tables() {
            let (row, y) = round_trip(kern, ty, &x);
            let step = |i: usize| {
                let blk = &row[i / 256 * 210..];
                (f16_at(blk, 208), f16_at(blk, 208) * blk[192 + i % 256 / 16] as i8 as f64)
            };
            for j in 0..16 * nsb {
                let (d, s) = step(16 * j);
                let amax = x[16 * j..16 * j + 16].iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
                prop_assert!(s >= 0.0 && s <= (amax / 31.0 + d) * (1.0 + 1e-6),
                    "{} sub-block {j}: step {s}, amax {amax}, d {d}", kern.name());
            }
            check(ty, kern, &x, &y, |i| 0.5 * step(i).1 * (1.0 + 1e-6))?;
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
