//! A8 activations (8-bit, `act-quant=q8x`) on x8-packed weights: the quantiser of every table
//! against the scalar reference's bytes, the reference against f64 math on the decoded
//! weights and activations, and every table's kernel against the reference over the tile
//! boundaries.

mod common;

use common::{config, decode_f64, random_quant_row, rng, tables, TestRng};
use flowrt_dtype::GgmlType;
use flowrt_kernels::a8::{self, a8_row_size, A8_BLOCK_BYTES};
use flowrt_kernels::{row_size, x8, Kernels};
use proptest::prelude::*;
use rand::Rng;

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Mxfp4,
];

/// Row length for a type from a block count (k-quants: whole 256-value super-blocks).
fn k_for(ty: GgmlType, nb: usize) -> usize {
    if ty.block_size() == 256 {
        256 * (1 + nb % 5)
    } else {
        32 * nb
    }
}

/// `rows` random weight rows of `ty` (MXFP4: random codes, exponents 118..=130).
fn weights(r: &mut TestRng, ty: GgmlType, k: usize, rows: usize) -> Vec<u8> {
    if ty == GgmlType::Mxfp4 {
        let mut w: Vec<u8> = (0..row_size(ty, k) * rows).map(|_| r.random()).collect();
        for blk in w.chunks_exact_mut(17) {
            blk[0] = r.random_range(118..=130);
        }
        return w;
    }
    (0..rows).flat_map(|_| random_quant_row(r, ty, k)).collect()
}

/// A row decoded in f64 straight from its bytes (MXFP4 here, the rest by `common`).
fn decode(ty: GgmlType, row: &[u8]) -> Vec<f64> {
    if ty != GgmlType::Mxfp4 {
        return decode_f64(ty, row);
    }
    const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let mut out = Vec::new();
    for b in row.chunks_exact(17) {
        let scale = 2f64.powi(b[0] as i32 - 127);
        let code = |j: usize| {
            if j < 16 {
                b[1 + j] & 15
            } else {
                b[1 + j - 16] >> 4
            }
        };
        out.extend((0..32).map(|j| {
            let c = code(j);
            let v = E2M1[(c & 7) as usize] * scale;
            if c & 8 != 0 {
                -v
            } else {
                v
            }
        }));
    }
    out
}

/// Activations in -1..1 with a few outliers.
fn acts(r: &mut TestRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = r.random_range(-1.0f32..1.0);
            if i % 97 == 0 {
                v * 40.0
            } else {
                v
            }
        })
        .collect()
}

fn quantize(kern: &Kernels, x: &[f32], k: usize) -> Vec<u8> {
    let mut a = vec![0u8; a8_row_size(x.len())];
    for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(a8_row_size(k))) {
        kern.quantize_row_a8(xr, ar);
    }
    a
}

fn pack(ty: GgmlType, k: usize, w: &[u8], nrows: usize) -> Vec<u8> {
    let mut p = vec![0u8; x8::packed_size(ty, nrows, k)];
    x8::pack(ty, nrows, k, w, &mut p);
    p
}

/// `sum |w_j| |x_j|` over a row: bounds the terms a kernel adds, so f32 rounding differences
/// are a small multiple of it. Offsets (Q4_0's `-8 d`, MXFP4's A8 bias) are at most 16 times
/// a value's scale, so 16 times the decoded magnitude plus the scales bounds them too.
fn abs_terms(w: &[f64], x: &[f32]) -> f64 {
    w.iter()
        .zip(x)
        .map(|(w, &v)| (w.abs() + 1e-2) * 17.0 * (v as f64).abs())
        .sum()
}

proptest! {
    #![proptest_config(config(64))]

    /// Every table's quantiser writes the reference's bytes, and the reference is what its
    /// layout says: `d = amax / 127`, `q = round(x / d)` (ties away), `sum(q)`, each
    /// run of 8 values in `a8::PERM`'s order.
    #[test]
    fn a8_quantisation_is_exact(nb in 1usize..=16, scale_exp in -40i32..=20, seed in any::<u64>()) {
        let mut r = rng(seed);
        let scale = 2f32.powi(scale_exp);
        let mut x: Vec<f32> = acts(&mut r, 32 * nb).iter().map(|v| v * scale).collect();
        // An all-zero block and a block of one value.
        if nb > 2 {
            x[..32].fill(0.0);
            x[32..64].fill(-0.75 * scale);
        }
        let mut want = vec![0u8; a8_row_size(x.len())];
        a8::quantize_row_ref(&x, &mut want);
        for (b, blk) in want.chunks_exact(A8_BLOCK_BYTES).enumerate() {
            let xb = &x[32 * b..32 * (b + 1)];
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = f32::from_le_bytes(blk[0..4].try_into().unwrap());
            prop_assert_eq!(d, amax / 127.0);
            let q = a8::block_values(&want, b);
            let sum: i32 = q.iter().map(|&v| v as i32).sum();
            prop_assert_eq!(a8::block_scale_sum(&want, b), (d, sum));
            for j in 0..32 {
                let exact = if d == 0.0 { 0.0 } else { xb[j] as f64 / d as f64 };
                prop_assert!((q[j] as f64 - exact).abs() <= 0.5 + 1e-4, "block {b} value {j}: {} for {exact}", q[j]);
                prop_assert_eq!(blk[8 + a8::position(j)] as i8, q[j]);
            }
        }
        for kern in tables() {
            prop_assert!(quantize(kern, &x, x.len()) == want, "{} quantiser bytes differ", kern.name());
        }
    }

    /// The reference is f64 math on the decoded weights and activations, up to f32 rounding.
    #[test]
    fn a8_reference_is_exact_math(ty_i in 0usize..8, nb in 1usize..=12, ntok in 1usize..=3, seed in any::<u64>()) {
        let ty = TYPES[ty_i];
        let mut r = rng(seed);
        let (k, nrows) = (k_for(ty, nb), 8);
        let w = weights(&mut r, ty, k, nrows);
        let p = pack(ty, k, &w, nrows);
        let x = acts(&mut r, k * ntok);
        let a = quantize(Kernels::scalar(), &x, k);
        let mut got = vec![f32::NAN; ntok * nrows];
        Kernels::matmul_a8_x8_ref(ty, k, &p, nrows, &a, ntok, &mut got, nrows);
        let rb = row_size(ty, k);
        let arow = a8_row_size(k);
        for t in 0..ntok {
            let at = &a[t * arow..(t + 1) * arow];
            let xa: Vec<f64> = (0..k)
                .map(|j| {
                    let d = f32::from_le_bytes(at[(j / 32) * A8_BLOCK_BYTES..][..4].try_into().unwrap());
                    a8::block_values(at, j / 32)[j % 32] as f64 * d as f64
                })
                .collect();
            for row in 0..nrows {
                let wv = decode(ty, &w[row * rb..(row + 1) * rb]);
                let exact: f64 = wv.iter().zip(&xa).map(|(w, x)| w * x).sum();
                let g = got[t * nrows + row] as f64;
                let tol = 2e-6 * (1.0 + abs_terms(&wv, &x[t * k..(t + 1) * k])) * (k as f64).sqrt();
                prop_assert!((g - exact).abs() <= tol, "{ty} k={k} t={t} row={row}: {g} vs {exact} (tol {tol:e})");
            }
        }
    }
}

/// Every table's A8 x8 matmul against the scalar reference, over 1 to 5 groups of 8 rows and
/// 1 to 13 tokens (tiles of 4 tokens and a tail; two groups per tile, then one), with an output
/// stride wider than the rows.
#[test]
fn a8_tile_boundaries_match_the_reference() {
    let mut r = rng(0xA8);
    for ty in TYPES {
        for nb in [1usize, 3, 8] {
            let k = k_for(ty, nb);
            let w = weights(&mut r, ty, k, 40);
            let x = acts(&mut r, k * 13);
            let a = quantize(Kernels::scalar(), &x, k);
            let rb = row_size(ty, k);
            for groups in 1..=5 {
                let nrows = 8 * groups;
                let p = pack(ty, k, &w[..nrows * rb], nrows);
                for ntok in 1..=13 {
                    let at = &a[..ntok * a8_row_size(k)];
                    let mut want = vec![f32::NAN; ntok * nrows];
                    Kernels::matmul_a8_x8_ref(ty, k, &p, nrows, at, ntok, &mut want, nrows);
                    for kern in tables() {
                        let stride = nrows + 3;
                        let mut got = vec![f32::NAN; ntok * stride];
                        kern.matmul_a8_x8(ty, k, &p, nrows, at, ntok, &mut got, stride);
                        for t in 0..ntok {
                            for row in 0..nrows {
                                let (g, e) = (got[t * stride + row], want[t * nrows + row]);
                                let wv = decode(ty, &w[row * rb..(row + 1) * rb]);
                                let tol = 1e-6
                                    * (1.0 + abs_terms(&wv, &x[t * k..(t + 1) * k]))
                                    * (k as f64).sqrt();
                                assert!(
                                    ((g - e).abs() as f64) <= tol,
                                    "{} {ty} k={k} rows={nrows} ntok={ntok} t={t} row={row}: {g} vs {e} (tol {tol:e})",
                                    kern.name()
                                );
                            }
                            if t + 1 < ntok {
                                assert!(
                                    got[t * stride + nrows..(t + 1) * stride]
                                        .iter()
                                        .all(|v| v.is_nan()),
                                    "{} wrote outside its columns",
                                    kern.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    for kern in tables() {
        for ty in TYPES {
            if kern.has_a8_x8(ty) {
                println!("RAN kernels: a8 x8 {ty} on {}", kern.name());
            }
        }
    }
}

/// The AVX-512 tables' A8 x8 matmuls (two groups per 512-bit vector; `vpdpbusd` with VNNI)
/// against the AVX2 table's, bit for bit: their integer block sums are exact and their f32
/// epilogue is the AVX2 tile's, in its order. 1 to 7 groups (pairs of pairs, a pair, an odd
/// group) and 1 to 9 tokens (one token runs the AVX2 kernel in every table).
#[test]
fn a8_avx512_tables_equal_avx2_bit_for_bit() {
    let Some((avx2, wide)) = common::avx2_and_avx512_tables("a8 x8") else {
        return;
    };
    let mut r = rng(0xA8512);
    for ty in TYPES {
        for nb in [1usize, 4] {
            let k = k_for(ty, nb);
            let w = weights(&mut r, ty, k, 56);
            let x = acts(&mut r, k * 9);
            let a = quantize(avx2, &x, k);
            let rb = row_size(ty, k);
            for groups in 1..=7 {
                let nrows = 8 * groups;
                let p = pack(ty, k, &w[..nrows * rb], nrows);
                for ntok in 1..=9 {
                    let at = &a[..ntok * a8_row_size(k)];
                    let run = |kern: &Kernels| {
                        let stride = nrows + 3;
                        let mut got = vec![f32::NAN; ntok * stride];
                        kern.matmul_a8_x8(ty, k, &p, nrows, at, ntok, &mut got, stride);
                        got
                    };
                    let want = run(avx2);
                    for kern in &wide {
                        let what = format!("{} {ty} k={k} {nrows}x{ntok}", kern.name());
                        common::assert_same_bits(&run(kern), &want, &what);
                    }
                }
            }
        }
    }
    for kern in wide {
        println!("RAN kernels: a8 x8 {} equals avx2 bit for bit", kern.name());
    }
}
