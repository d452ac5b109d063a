//! MXFP4 (ggml type 39): the format against gguf-py, the scalar reference against f64 math on
//! values decoded here from the format's description, and every table's kernels (x8 SIMD, row
//! and ggml paths) against the scalar reference on odd shapes and tails.

mod common;

use common::{config, rng, tables, TestRng};
use flowrt_dtype::GgmlType;
use flowrt_kernels::q16::{q16_row_size, quantize_row_ref};
use flowrt_kernels::{row_size, x8, Kernels};
use proptest::prelude::*;
use rand::Rng;

const TY: GgmlType = GgmlType::Mxfp4;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/gguf/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The E2M1 value of a 4-bit code (OCP MX spec: sign, 2 exponent bits, 1 mantissa bit), in f64.
fn e2m1(code: u8) -> f64 {
    let sign = if code & 8 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((code >> 1) & 3, code & 1);
    let mag = if e == 0 {
        0.5 * m as f64
    } else {
        2f64.powi(e as i32 - 1) * (1.0 + 0.5 * m as f64)
    };
    sign * mag
}

/// A row decoded straight from its bytes: block scale `2^(e - 127)` (ggml's reading of
/// `e = 255` as `2^128`, see `blocks::mxfp4_half_scale`), value `j` in nibble `j % 16` of byte
/// `1 + j % 16`, low nibbles first.
fn decode_f64(row: &[u8]) -> Vec<f64> {
    let mut out = Vec::new();
    for b in row.chunks_exact(17) {
        let scale = 2f64.powi(b[0] as i32 - 127);
        out.extend((0..32).map(|j| {
            let byte = b[1 + j % 16];
            let code = if j < 16 { byte & 15 } else { byte >> 4 };
            scale * e2m1(code)
        }));
    }
    out
}

/// Random rows: random codes, exponents in `lo..=hi`.
fn weights(rng: &mut TestRng, k: usize, rows: usize, lo: u8, hi: u8) -> Vec<u8> {
    let mut w: Vec<u8> = (0..row_size(TY, k) * rows).map(|_| rng.random()).collect();
    for blk in w.chunks_exact_mut(17) {
        blk[0] = rng.random_range(lo..=hi);
    }
    w
}

/// Activations in -1..1 with a few outliers, times `mag`.
fn acts(rng: &mut TestRng, n: usize, mag: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v: f32 = rng.random_range(-1.0..1.0);
            mag * if i % 97 == 0 { 40.0 * v } else { v }
        })
        .collect()
}

fn q16(x: &[f32], k: usize) -> Vec<u8> {
    let mut a = vec![0u8; q16_row_size(x.len())];
    for (xr, ar) in x.chunks_exact(k).zip(a.chunks_exact_mut(q16_row_size(k))) {
        quantize_row_ref(xr, ar);
    }
    a
}

fn pack(k: usize, w: &[u8], nrows: usize) -> Vec<u8> {
    let mut p = vec![0u8; x8::packed_size(TY, nrows, k)];
    x8::pack(TY, nrows, k, w, &mut p);
    p
}

/// `sum |w_j x_j|` of one row in f64: every term a kernel adds is bounded by it.
fn abs_terms(wrow: &[u8], x: &[f32]) -> f64 {
    decode_f64(wrow)
        .iter()
        .zip(x)
        .map(|(w, &v)| (w * v as f64).abs())
        .sum()
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let data = fixture("mxfp4.dequant.bin");
    let nblocks = data.len() / (17 + 4 * 32);
    assert_eq!(data.len(), nblocks * (17 + 128), "fixture size");
    let n = nblocks * 32;
    let (row, want) = data.split_at(row_size(TY, n));
    let want = f32s(want);
    // The fixture covers the exponent bytes 0, 1, 2, 127, 254 and 255.
    for e in [0u8, 1, 2, 127, 254, 255] {
        assert!(
            row.chunks_exact(17).any(|b| b[0] == e),
            "fixture lacks e={e}"
        );
    }
    for kern in tables() {
        let mut got = vec![f32::NAN; n];
        kern.dequantize_row(TY, row, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{} value {i}: {g} vs gguf-py {w}",
                kern.name()
            );
        }
    }
    // And the independent decoder here agrees with both.
    for (g, w) in decode_f64(row).iter().zip(&want) {
        assert_eq!(*g as f32, *w);
    }
}

#[test]
fn quantiser_matches_gguf_py_bytes() {
    let data = fixture("mxfp4.quant.bin");
    let n = 8 * 32;
    let (x, want) = data.split_at(4 * n);
    assert_eq!(want.len(), row_size(TY, n), "fixture size");
    let x = f32s(x);
    for kern in tables() {
        let mut got = vec![0u8; want.len()];
        kern.quantize_row(TY, &x, &mut got);
        for (b, (g, w)) in got.chunks_exact(17).zip(want.chunks_exact(17)).enumerate() {
            assert_eq!(g, w, "{} block {b}", kern.name());
        }
    }
}

#[test]
fn quantise_then_dequantise_is_the_nearest_representable_value() {
    let mut r = rng(7);
    let x = acts(&mut r, 32 * 40, 3.0);
    let mut q = vec![0u8; row_size(TY, x.len())];
    Kernels::scalar().quantize_row(TY, &x, &mut q);
    let mut y = vec![0f32; x.len()];
    Kernels::scalar().dequantize_row(TY, &q, &mut y);
    for (b, (xb, yb)) in x.chunks_exact(32).zip(y.chunks_exact(32)).enumerate() {
        let scale = 2f64.powi(q[17 * b] as i32 - 127);
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        assert!(
            (4.0..8.0).contains(&(amax / scale)),
            "block {b}: amax/scale"
        );
        for (&v, &got) in xb.iter().zip(yb) {
            // The nearest of all 16 values (ties aside) at this scale.
            let best = (0..16u8)
                .map(|c| (scale * e2m1(c) - v as f64).abs())
                .fold(f64::INFINITY, f64::min);
            assert!(
                ((got as f64) - v as f64).abs() <= best * (1.0 + 1e-12),
                "block {b}: {v} -> {got}"
            );
        }
    }
}

/// The scalar references (Q16 activations; Q8_0 activations, ggml's pairing) against the f64
/// dot of the independently decoded weights with the unquantised activations.
#[test]
fn scalar_references_are_close_to_exact_math() {
    let mut r = rng(11);
    for k in [32usize, 96, 576, 2880] {
        let w = weights(&mut r, k, 4, 118, 130);
        let x = acts(&mut r, k, 1.0);
        let a16 = q16(&x, k);
        let mut a8 = vec![0u8; row_size(GgmlType::Q8_0, k)];
        Kernels::scalar().quantize_row(GgmlType::Q8_0, &x, &mut a8);
        let rb = row_size(TY, k);
        for row in 0..4 {
            let wr = &w[row * rb..(row + 1) * rb];
            let wv = decode_f64(wr);
            let exact: f64 = wv.iter().zip(&x).map(|(a, &b)| a * b as f64).sum();
            // Rounding an activation moves it by at most half its block's step (amax / 32767
            // or amax / 127), Q8_0's f16 scale by 2^-11 relative; f32 sums add a little more.
            let bound = |levels: f64, rel: f64| -> f64 {
                wv.chunks_exact(32)
                    .zip(x.chunks_exact(32))
                    .map(|(wb, xb)| {
                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                        wb.iter().map(|w| w.abs()).sum::<f64>() * amax / levels / 2.0
                    })
                    .sum::<f64>()
                    * 1.01
                    + rel * abs_terms(wr, &x)
            };
            let mut out = [f32::NAN];
            Kernels::scalar().matmul_q16(TY, k, wr, 1, &a16, 1, &mut out, 1);
            let (e16, b16) = ((out[0] as f64 - exact).abs(), bound(32767.0, 1e-6));
            assert!(
                e16 <= b16,
                "Q16 k={k} row {row}: {} vs {exact} (error {e16:e} > {b16:e})",
                out[0]
            );
            let g8 = Kernels::scalar().vec_dot(TY, k, wr, &a8);
            let (e8, b8) = ((g8 as f64 - exact).abs(), bound(127.0, 1e-3));
            assert!(
                e8 <= b8,
                "Q8_0 k={k} row {row}: {g8} vs {exact} (error {e8:e} > {b8:e})"
            );
        }
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// Packing keeps every byte (any exponent, any code), and packed rows dequantise as the
    /// original rows do.
    #[test]
    fn x8_packing_round_trips(nb in 1usize..=12, groups in 1usize..=3, seed in any::<u64>()) {
        let mut r = rng(seed);
        let (k, nrows) = (32 * nb, 8 * groups);
        let w = weights(&mut r, k, nrows, 0, 255);
        let p = pack(k, &w, nrows);
        let rb = row_size(TY, k);
        let (mut want, mut got) = (vec![0f32; k], vec![f32::NAN; k]);
        let mut blk = [0u8; 17];
        for row in 0..nrows {
            Kernels::scalar().dequantize_row(TY, &w[row * rb..(row + 1) * rb], &mut want);
            x8::dequantize_row(TY, &p, row, &mut got);
            prop_assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "row {}", row);
            for b in 0..nb {
                let o = ((row / 8) * nb + b) * 136;
                x8::unpack_block(TY, &p[o..o + 136], row % 8, &mut blk);
                prop_assert_eq!(&blk[..], &w[row * rb + 17 * b..row * rb + 17 * (b + 1)]);
            }
        }
    }

    /// x8 matmuls of every table against the unpacked scalar reference: 1..48 blocks, 1..3
    /// groups (the AVX2 kernel's two-group tiles and an odd last group), 1..9 tokens (its
    /// 4-token tiles and every remainder). The scalar x8 path equals the reference bit for bit.
    #[test]
    fn x8_matmuls_match_the_scalar_reference(
        nb in 1usize..=48, groups in 1usize..=3, ntok in 1usize..=9, seed in any::<u64>()
    ) {
        let mut r = rng(seed);
        let (k, nrows) = (32 * nb, 8 * groups);
        let w = weights(&mut r, k, nrows, 115, 135);
        let p = pack(k, &w, nrows);
        let x = acts(&mut r, k * ntok, 1.0);
        let a = q16(&x, k);
        let mut want = vec![f32::NAN; ntok * nrows];
        Kernels::scalar().matmul_q16(TY, k, &w, nrows, &a, ntok, &mut want, nrows);
        let rb = row_size(TY, k);
        for kern in tables() {
            // A wider output than the rows: the kernels must keep to their columns.
            let stride = nrows + 3;
            let mut got = vec![f32::NAN; ntok * stride];
            kern.matmul_q16_x8(TY, k, &p, nrows, &a, ntok, &mut got, stride);
            for t in 0..ntok {
                let pad = &got[t * stride + nrows..(t * stride + stride).min(got.len())];
                prop_assert!(pad.iter().all(|v| v.is_nan()), "{} wrote outside its columns", kern.name());
                for row in 0..nrows {
                    let (g, want) = (got[t * stride + row], want[t * nrows + row]);
                    if kern.name() == "scalar" {
                        prop_assert_eq!(g.to_bits(), want.to_bits(), "scalar k={} t={} row={}", k, t, row);
                    }
                    let abs = abs_terms(&w[row * rb..(row + 1) * rb], &x[t * k..(t + 1) * k]);
                    let tol = 1e-6 * abs * (k as f64).sqrt() + 1e-30;
                    prop_assert!(((g - want).abs() as f64) <= tol,
                        "{} k={} t={} row={}: {} vs {} (tol {:e})", kern.name(), k, t, row, g, want, tol);
                }
            }
        }
    }

    /// Row-layout Q16 matmuls and ggml-path (Q8_0 activations) matmuls of every table against
    /// the scalar reference, any row count.
    #[test]
    fn row_matmuls_match_the_scalar_reference(
        nb in 1usize..=48, nrows in 1usize..=9, ntok in 1usize..=5, seed in any::<u64>()
    ) {
        let mut r = rng(seed);
        let k = 32 * nb;
        let w = weights(&mut r, k, nrows, 115, 135);
        let x = acts(&mut r, k * ntok, 1.0);
        let a = q16(&x, k);
        let a8: Vec<u8> = x.chunks_exact(k).flat_map(|xr| {
            let mut o = vec![0u8; row_size(GgmlType::Q8_0, k)];
            Kernels::scalar().quantize_row(GgmlType::Q8_0, xr, &mut o);
            o
        }).collect();
        let mut want16 = vec![f32::NAN; ntok * nrows];
        Kernels::scalar().matmul_q16(TY, k, &w, nrows, &a, ntok, &mut want16, nrows);
        let mut want8 = vec![f32::NAN; ntok * nrows];
        Kernels::scalar().matmul(TY, k, &w, nrows, &a8, ntok, &mut want8, nrows);
        let rb = row_size(TY, k);
        for kern in tables() {
            let mut g16 = vec![f32::NAN; ntok * nrows];
            kern.matmul_q16(TY, k, &w, nrows, &a, ntok, &mut g16, nrows);
            let mut g8 = vec![f32::NAN; ntok * nrows];
            kern.matmul(TY, k, &w, nrows, &a8, ntok, &mut g8, nrows);
            for i in 0..ntok * nrows {
                let (t, row) = (i / nrows, i % nrows);
                let abs = abs_terms(&w[row * rb..(row + 1) * rb], &x[t * k..(t + 1) * k]);
                let tol = 1e-6 * abs * (k as f64).sqrt() + 1e-30;
                prop_assert!(((g16[i] - want16[i]).abs() as f64) <= tol, "{} q16 [{}]", kern.name(), i);
                prop_assert!(((g8[i] - want8[i]).abs() as f64) <= tol, "{} q8_0 [{}]", kern.name(), i);
            }
        }
    }
}

/// Every exponent byte, 0 (subnormal half-scale) to 255, through every table's x8 kernel and
/// its row-layout Q16 kernel: the activations are scaled so that each product is a normal
/// float, and the results must equal the scalar reference to f32 rounding (a wrong scale is off
/// by a factor of 2 or more).
#[test]
fn x8_and_row_kernels_take_every_exponent() {
    let mut r = rng(3);
    let (k, nrows, ntok) = (96usize, 16usize, 3usize);
    for e0 in (0..=255u8).step_by(8) {
        let mut w = weights(&mut r, k, nrows, 0, 0);
        for (i, blk) in w.chunks_exact_mut(17).enumerate() {
            blk[0] = e0.saturating_add((i % 8) as u8);
        }
        let mag = 2f32.powi((120 - e0 as i32).clamp(-100, 100));
        let x = acts(&mut r, k * ntok, mag);
        let a = q16(&x, k);
        let p = pack(k, &w, nrows);
        let mut want = vec![f32::NAN; ntok * nrows];
        Kernels::scalar().matmul_q16(TY, k, &w, nrows, &a, ntok, &mut want, nrows);
        let rb = row_size(TY, k);
        for (kern, layout) in tables()
            .into_iter()
            .flat_map(|kern| [(kern, "x8"), (kern, "row")])
        {
            let mut got = vec![f32::NAN; ntok * nrows];
            match layout {
                "x8" => kern.matmul_q16_x8(TY, k, &p, nrows, &a, ntok, &mut got, nrows),
                _ => kern.matmul_q16(TY, k, &w, nrows, &a, ntok, &mut got, nrows),
            }
            for i in 0..ntok * nrows {
                let (t, row) = (i / nrows, i % nrows);
                let abs = abs_terms(&w[row * rb..(row + 1) * rb], &x[t * k..(t + 1) * k]);
                assert!(abs.is_finite() && abs > 0.0, "e0={e0}: terms {abs}");
                let tol = 1e-5 * abs;
                assert!(
                    ((got[i] - want[i]).abs() as f64) <= tol,
                    "{} {layout} e0={e0} [{i}]: {} vs {} (tol {tol:e})",
                    kern.name(),
                    got[i],
                    want[i]
                );
            }
        }
    }
}

/// The AVX-512 tables' MXFP4 kernels compute the AVX2 kernel's arithmetic lane for lane: equal
/// bit for bit, on group counts around their pairs and tokens around their 4-token tiles.
#[test]
fn x8_avx512_tables_equal_avx2_bit_for_bit() {
    let Ok(avx2) = Kernels::select(Some("avx2")) else {
        println!("NOT RUN kernels: mxfp4 x8 avx512 vs avx2 (no avx2 table on this host)");
        return;
    };
    let mut r = rng(5);
    for name in ["avx512", "avx512vnni"] {
        let kern = match Kernels::select(Some(name)) {
            Ok(k) => k,
            Err(e) => {
                println!("NOT RUN kernels: mxfp4 x8 {name} vs avx2 ({e})");
                continue;
            }
        };
        for (groups, ntok, nb) in [
            (1, 2, 3),
            (2, 5, 1),
            (3, 9, 7),
            (4, 4, 2),
            (5, 7, 9),
            (7, 1, 4),
        ] {
            let (k, nrows) = (32 * nb, 8 * groups);
            let w = weights(&mut r, k, nrows, 0, 254);
            let p = pack(k, &w, nrows);
            let a = q16(&acts(&mut r, k * ntok, 1.0), k);
            let run = |kern: &Kernels| {
                let mut out = vec![f32::NAN; ntok * nrows];
                kern.matmul_q16_x8(TY, k, &p, nrows, &a, ntok, &mut out, nrows);
                out
            };
            let (want, got) = (run(avx2), run(kern));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{name} groups={groups} ntok={ntok} k={k} [{i}]: {g} vs {w}"
                );
            }
        }
    }
}
