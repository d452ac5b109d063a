//! Q16-activation matmuls: every table the host can run against the scalar reference, and the
//! scalar reference against plain f64 math on dequantised values.

mod common;

use common::decode_parts_f64;
use flowrt_dtype::GgmlType;
use flowrt_kernels::q16::{q16_row_size, quantize_row_ref, Q16_BLOCK_BYTES};
use flowrt_kernels::{row_size, x8, Kernels};
use proptest::prelude::*;

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Offsets of the f16 scale fields in a block of `ty`, and the largest integer factor (sub-block
/// scale) that multiplies them.
fn scale_fields(ty: GgmlType) -> (&'static [usize], f32) {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => (&[0, 2], 1.0),
        GgmlType::Q4K | GgmlType::Q5K => (&[0, 2], 63.0),
        GgmlType::Q6K => (&[208], 127.0),
        _ => (&[0], 1.0),
    }
}

/// Row length for a type from a block count in 1..=48 (k-quants: 1..=9 super-blocks).
fn k_for(ty: GgmlType, nb: usize) -> usize {
    if ty.block_size() == 256 {
        256 * (1 + nb % 9)
    } else {
        32 * nb
    }
}

/// The sum of `(|scaled part| + |offset part|) * |x|` over a row: every term a kernel adds is
/// bounded by it, so f32 rounding differences are a small multiple of it.
fn abs_terms(ty: GgmlType, wrow: &[u8], x: &[f32]) -> f64 {
    decode_parts_f64(ty, wrow)
        .iter()
        .zip(x)
        .map(|((p, o), &v)| (p.abs() + o.abs()) * (v as f64).abs())
        .sum()
}

/// Random weight rows of type `ty`: sane f16 scales, random payload bytes.
fn weights(ty: GgmlType, k: usize, rows: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let bs = ty.type_size() as usize;
    let mut out = vec![0u8; row_size(ty, k) * rows];
    for blk in out.chunks_exact_mut(bs) {
        for b in blk.iter_mut() {
            *b = next() as u8;
        }
        let (fields, factor) = scale_fields(ty);
        let scale = |r: u64| {
            half::f16::from_f32(((r % 2000) as f32 / 1000.0 - 1.0) * 0.05 / factor).to_le_bytes()
        };
        for &o in fields {
            blk[o..o + 2].copy_from_slice(&scale(next()));
        }
    }
    out
}

fn acts(k: usize, ntok: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..k * ntok)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state % 20001) as f32 / 10000.0 - 1.0;
            // A few outliers, as real activations have.
            if i % 97 == 0 {
                v * 40.0
            } else {
                v
            }
        })
        .collect()
}

fn quantize(x: &[f32], k: usize) -> Vec<u8> {
    let mut a = vec![0u8; q16_row_size(x.len())];
    for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(q16_row_size(k))) {
        quantize_row_ref(xr, ar);
    }
    a
}

fn matmul(
    kern: &Kernels,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    nrows: usize,
    a: &[u8],
    ntok: usize,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; ntok * nrows];
    kern.matmul_q16(ty, k, w, nrows, a, ntok, &mut out, nrows);
    out
}

/// The types with an x8 layout.
const X8_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Packs `w` (`nrows x k` of type `ty`) into the x8 layout.
fn pack_x8(ty: GgmlType, k: usize, w: &[u8], nrows: usize) -> Vec<u8> {
    let mut p = vec![0u8; x8::packed_size(ty, nrows, k)];
    x8::pack(ty, nrows, k, w, &mut p);
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn x8_packing_round_trips(ty_i in 0usize..8, nb in 1usize..=12, groups in 1usize..=3, seed in any::<u64>()) {
        let ty = X8_TYPES[ty_i];
        let k = k_for(ty, nb);
        let nb = k / ty.block_size() as usize;
        let nrows = 8 * groups;
        let w = weights(ty, k, nrows, seed);
        let p = pack_x8(ty, k, &w, nrows);
        prop_assert_ne!(&p, &w, "packing must move bytes");
        let bb = ty.type_size() as usize;
        let ub = x8::unit_bytes(ty);
        let mut blk = vec![0u8; bb];
        let (mut want, mut got) = (vec![0f32; k], vec![f32::NAN; k]);
        for r in 0..nrows {
            Kernels::scalar().dequantize_row(ty, &w[r * nb * bb..(r + 1) * nb * bb], &mut want);
            x8::dequantize_row(ty, &p, r, &mut got);
            prop_assert_eq!(&got, &want, "dequantised row {}", r);
        }
        for r in 0..nrows {
            for b in 0..nb {
                let o = ((r / 8) * nb + b) * ub;
                x8::unpack_block(ty, &p[o..o + ub], r % 8, &mut blk);
                prop_assert_eq!(&blk[..], &w[(r * nb + b) * bb..(r * nb + b + 1) * bb], "row {} block {}", r, b);
            }
        }
    }

    #[test]
    fn x8_matmuls_match_the_unpacked_reference(
        ty_i in 0usize..8, nb in 1usize..=48, groups in 1usize..=3, ntok in 1usize..=9, seed in any::<u64>()
    ) {
        let ty = X8_TYPES[ty_i];
        let (k, nrows) = (k_for(ty, nb), 8 * groups);
        let w = weights(ty, k, nrows, seed);
        let p = pack_x8(ty, k, &w, nrows);
        let x = acts(k, ntok, seed);
        let a = quantize(&x, k);
        let want = matmul(Kernels::scalar(), ty, k, &w, nrows, &a, ntok);
        let rb = row_size(ty, k);
        for kern in Kernels::available() {
            // A wider output than the rows: the kernels must keep to their columns.
            let stride = nrows + 3;
            let mut got = vec![f32::NAN; ntok * stride];
            kern.matmul_q16_x8(ty, k, &p, nrows, &a, ntok, &mut got, stride);
            for t in 0..ntok {
                prop_assert!(got[t * stride + nrows..][..3.min(got.len() - t * stride - nrows)].iter().all(|v| v.is_nan()));
                for row in 0..nrows {
                    let (g, r) = (got[t * stride + row], want[t * nrows + row]);
                    if kern.name() == "scalar" {
                        prop_assert_eq!(g.to_bits(), r.to_bits(), "scalar {} k={} t={} row={}", ty, k, t, row);
                    }
                    let abs = abs_terms(ty, &w[row * rb..(row + 1) * rb], &x[t * k..(t + 1) * k]);
                    let tol = 1e-6 * (1.0 + abs) * (k as f64).sqrt();
                    prop_assert!(((g - r).abs() as f64) <= tol, "{} {ty} k={k} t={t} row={row}: {g} vs {r} (tol {tol:e})", kern.name());
                }
            }
        }
    }

    #[test]
    fn every_table_matches_the_scalar_reference(
        ty_i in 0usize..8, nb in 1usize..=48, nrows in 1usize..=9, ntok in 1usize..=9, seed in any::<u64>()
    ) {
        let ty = TYPES[ty_i];
        let k = k_for(ty, nb);
        let w = weights(ty, k, nrows, seed);
        let x = acts(k, ntok, seed);
        let a = quantize(&x, k);
        let want = matmul(Kernels::scalar(), ty, k, &w, nrows, &a, ntok);
        let rb = row_size(ty, k);
        for kern in Kernels::available() {
            let got = matmul(kern, ty, k, &w, nrows, &a, ntok);
            for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                let (t, row) = (i / nrows, i % nrows);
                let abs = abs_terms(ty, &w[row * rb..(row + 1) * rb], &x[t * k..(t + 1) * k]);
                let tol = 1e-6 * (1.0 + abs) * (k as f64).sqrt();
                prop_assert!(((g - r).abs() as f64) <= tol, "{} {ty} k={k} [{i}]: {g} vs {r} (tol {tol:e})", kern.name());
            }
        }
    }

    #[test]
    fn simd_quantisation_matches_the_reference(nb in 1usize..=20, seed in any::<u64>()) {
        let k = nb * 32;
        let x = acts(k, 1, seed);
        let want = quantize(&x, k);
        for kern in Kernels::available() {
            let mut got = vec![0u8; q16_row_size(k)];
            kern.quantize_row_q16(&x, &mut got);
            for (gb, wb) in got.chunks_exact(Q16_BLOCK_BYTES).zip(want.chunks_exact(Q16_BLOCK_BYTES)) {
                prop_assert_eq!(&gb[0..4], &wb[0..4], "{}: scale", kern.name());
                for (g, w) in gb[8..].chunks_exact(2).zip(wb[8..].chunks_exact(2)) {
                    let (g, w) = (i16::from_le_bytes([g[0], g[1]]), i16::from_le_bytes([w[0], w[1]]));
                    prop_assert!((g as i32 - w as i32).abs() <= 1, "{}: {g} vs {w}", kern.name());
                }
            }
        }
    }
}

/// The reference itself: Q16 activations give the f64 dot of dequantised weights with the
/// unquantised activations to about 1e-4 relative (8-bit activations: about 1e-2).
#[test]
fn scalar_reference_is_close_to_exact_math() {
    for ty in TYPES {
        for (k, nrows, seed) in [(32usize, 3, 1u64), (576, 5, 2), (1536, 4, 3)] {
            let k = if ty.block_size() == 256 {
                k.div_ceil(256) * 256
            } else {
                k
            };
            let w = weights(ty, k, nrows, seed);
            let x = acts(k, 1, seed + 10);
            let a = quantize(&x, k);
            let got = matmul(Kernels::scalar(), ty, k, &w, nrows, &a, 1);
            let mut wf = vec![0f32; k];
            for r in 0..nrows {
                let rb = row_size(ty, k);
                Kernels::scalar().dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wf);
                let exact: f64 = wf.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale = abs_terms(ty, &w[r * rb..(r + 1) * rb], &x);
                let err = (got[r] as f64 - exact).abs() / scale.max(1e-30);
                assert!(
                    err < 2e-4,
                    "{ty} k={k} row {r}: {} vs {exact} (relative {err:e})",
                    got[r]
                );
            }
        }
    }
}

#[test]
fn zero_rows_quantise_to_zero() {
    let mut out = vec![0xFFu8; Q16_BLOCK_BYTES];
    quantize_row_ref(&[0.0; 32], &mut out);
    assert!(out.iter().all(|&b| b == 0));
}
