//! Shared test helpers: random rows in every format, and independent f64 references that
//! decode blocks straight from their bytes (not through the crate's own decoders).
#![allow(dead_code)]

use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Kernels};
use half::f16;
use rand::{Rng, SeedableRng};

pub type TestRng = rand::rngs::StdRng;

/// Proptest settings: `cases` cases (or `PROPTEST_CASES`), no regression files.
pub fn config(cases: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..Default::default()
    }
}

pub fn rng(seed: u64) -> TestRng {
    TestRng::seed_from_u64(seed)
}

/// f32 unit roundoff.
pub const EPS: f64 = f32::EPSILON as f64 / 2.0;

/// A random block scale spanning tiny (f16 subnormal) to huge (near f16 max), either sign.
pub fn random_scale(rng: &mut TestRng) -> f32 {
    let mag = match rng.random_range(0..8) {
        0 => rng.random_range(1e-7f32..1e-5),
        1 => rng.random_range(1e2f32..6e4),
        2 => 0.0,
        _ => rng.random_range(1e-4f32..1.0),
    };
    if rng.random_bool(0.3) {
        -mag
    } else {
        mag
    }
}

fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// A random weight row of `k` values of quantised type `ty` (random scales and contents).
pub fn random_quant_row(rng: &mut TestRng, ty: GgmlType, k: usize) -> Vec<u8> {
    let nb = k / 32;
    let mut out = Vec::with_capacity(row_size(ty, k));
    for _ in 0..nb {
        match ty {
            GgmlType::Q4_0 => {
                out.extend(f16_bytes(random_scale(rng)));
                out.extend((0..16).map(|_| rng.random::<u8>()));
            }
            GgmlType::Q4_1 => {
                out.extend(f16_bytes(random_scale(rng)));
                out.extend(f16_bytes(random_scale(rng)));
                out.extend((0..16).map(|_| rng.random::<u8>()));
            }
            GgmlType::Q8_0 => {
                out.extend(f16_bytes(random_scale(rng)));
                out.extend((0..32).map(|_| rng.random::<u8>()));
            }
            GgmlType::Q8_1 => {
                // Activation block: values in -127..=127, s from d and the values (d small
                // enough that s fits f16, as for any activation quantised from real data).
                let d = random_scale(rng).clamp(-15.0, 15.0);
                let qs: Vec<i8> = (0..32).map(|_| rng.random_range(-127i8..=127)).collect();
                let sum: i32 = qs.iter().map(|&q| q as i32).sum();
                out.extend(f16_bytes(d));
                out.extend(f16_bytes(d * sum as f32));
                out.extend(qs.iter().map(|&q| q as u8));
            }
            other => panic!("not a block type: {other}"),
        }
    }
    out
}

/// Random f32 values with a random overall magnitude, some exact zeros and duplicates.
pub fn random_f32s(rng: &mut TestRng, n: usize) -> Vec<f32> {
    let mag = match rng.random_range(0..4) {
        0 => 1e-3f32,
        1 => 1e3,
        _ => 1.0,
    };
    (0..n)
        .map(|_| match rng.random_range(0..16) {
            0 => 0.0,
            1 => mag,
            _ => rng.random_range(-mag..mag),
        })
        .collect()
}

/// An activation row of type `ty` for `k` values: usually quantised from random floats with
/// the crate's scalar reference, sometimes raw random blocks (values in -127..=127).
pub fn random_act_row(rng: &mut TestRng, ty: GgmlType, k: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => random_f32s(rng, k)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        GgmlType::Q8_0 | GgmlType::Q8_1 if rng.random_bool(0.3) => {
            let mut row = random_quant_row(rng, GgmlType::Q8_1, k);
            if ty == GgmlType::Q8_0 {
                // Drop the s field of each block.
                row = row
                    .chunks_exact(36)
                    .flat_map(|b| [&b[..2], &b[4..]].concat())
                    .collect();
            }
            row
        }
        _ => {
            let x = random_f32s(rng, k);
            let mut out = vec![0u8; row_size(ty, k)];
            Kernels::scalar().quantize_row(ty, &x, &mut out);
            out
        }
    }
}

/// A random weight row of any supported weight type.
pub fn random_weight_row(rng: &mut TestRng, ty: GgmlType, k: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => random_f32s(rng, k)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        GgmlType::F16 => random_f32s(rng, k)
            .iter()
            .flat_map(|&v| f16_bytes(v))
            .collect(),
        GgmlType::BF16 => random_f32s(rng, k)
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        _ => random_quant_row(rng, ty, k),
    }
}

fn h(b: &[u8], off: usize) -> f64 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f64()
}

/// Decodes a row straight from its bytes into f64 values (independent of the crate).
pub fn decode_f64(ty: GgmlType, row: &[u8]) -> Vec<f64> {
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => out.extend(
            row.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64),
        ),
        GgmlType::F16 => out.extend(row.chunks_exact(2).map(|c| h(c, 0))),
        GgmlType::BF16 => out.extend(
            row.chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64),
        ),
        GgmlType::Q4_0 => {
            for b in row.chunks_exact(18) {
                let d = h(b, 0);
                out.extend((0..16).map(|j| d * ((b[2 + j] & 15) as f64 - 8.0)));
                out.extend((0..16).map(|j| d * ((b[2 + j] >> 4) as f64 - 8.0)));
            }
        }
        GgmlType::Q4_1 => {
            for b in row.chunks_exact(20) {
                let (d, m) = (h(b, 0), h(b, 2));
                out.extend((0..16).map(|j| d * (b[4 + j] & 15) as f64 + m));
                out.extend((0..16).map(|j| d * (b[4 + j] >> 4) as f64 + m));
            }
        }
        GgmlType::Q8_0 => {
            for b in row.chunks_exact(34) {
                let d = h(b, 0);
                out.extend(b[2..].iter().map(|&q| d * (q as i8) as f64));
            }
        }
        GgmlType::Q8_1 => {
            for b in row.chunks_exact(36) {
                let d = h(b, 0);
                out.extend(b[4..].iter().map(|&q| d * (q as i8) as f64));
            }
        }
        other => panic!("no decoder for {other}"),
    }
    out
}

/// The exact dot of a weight row with an activation row, in f64, from dequantised values,
/// and the sum of absolute terms (for error bounds).
///
/// For Q4_1 the kernels use Q8_1's stored `s` (ggml's `d * sum(q)` with `d` before rounding)
/// instead of `d_f16 * sum(q)`; the expected value follows that definition:
/// `dequant(w) . dequant(a) + sum_b m_b (s_b - d_b sum(q_b))`.
pub fn dot_f64(w: GgmlType, wrow: &[u8], arow: &[u8]) -> (f64, f64) {
    let at = Kernels::vec_dot_type(w);
    let wv = decode_f64(w, wrow);
    let av = decode_f64(at, arow);
    assert_eq!(wv.len(), av.len());
    let mut dot: f64 = wv.iter().zip(&av).map(|(x, y)| x * y).sum();
    let mut abs: f64 = wv.iter().zip(&av).map(|(x, y)| (x * y).abs()).sum();
    if w == GgmlType::Q4_1 {
        for (wb, ab) in wrow.chunks_exact(20).zip(arow.chunks_exact(36)) {
            let (m, d, s) = (h(wb, 2), h(ab, 0), h(ab, 2));
            let sum: f64 = ab[4..].iter().map(|&q| (q as i8) as f64).sum();
            dot += m * (s - d * sum);
            abs += (m * s).abs() + (m * d * sum).abs();
        }
    }
    (dot, abs)
}

/// Tolerance for an f32 kernel result of a sum of `n` terms whose absolute values add to
/// `abs`: a generous multiple of the worst-case rounding of a sequential f32 sum.
pub fn dot_tol(n: usize, abs: f64) -> f64 {
    (n as f64 + 16.0) * 2.0 * EPS * abs + 1e-30
}

pub const QUANT_TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];
pub const FLOAT_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
pub const QUANT_KS: [usize; 6] = [32, 64, 96, 160, 576, 1536];
pub const FLOAT_KS: [usize; 10] = [1, 2, 3, 5, 7, 15, 17, 31, 33, 100];

/// The "number of terms" of a dot for error bounds: blocks for quantised types.
pub fn terms(w: GgmlType, k: usize) -> usize {
    if w.block_size() == 32 {
        k / 32 + 32
    } else {
        k
    }
}
