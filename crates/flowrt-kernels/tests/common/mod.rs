//! Shared test helpers: random rows in every format, and independent f64 references that
//! decode blocks straight from their bytes (not through the crate's own decoders).
#![allow(dead_code)]

use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Isa, KernelError, Kernels};
use flowrt_testkit::coverage;
use half::f16;
use rand::{Rng, SeedableRng};

pub type TestRng = rand::rngs::StdRng;

/// Every kernel table this host can run, scalar first: what tests iterate instead of
/// [`Kernels::available`], which silently leaves out the tables the host lacks. The first call
/// in a test binary reports every [`Isa::ALL`] entry as `RAN kernels: table <name>` or
/// `NOT RUN kernels: table <name> (<why>)`, the reason taken from [`Kernels::select`]'s error.
pub fn tables() -> Vec<&'static Kernels> {
    static REPORT: std::sync::Once = std::sync::Once::new();
    let available = Kernels::available();
    REPORT.call_once(|| {
        for isa in Isa::ALL {
            let what = format!("table {}", isa.name());
            match Kernels::select(Some(isa.name())) {
                Ok(k) => {
                    assert!(
                        available.iter().any(|a| std::ptr::eq(*a, k)),
                        "{what} selects but is not in Kernels::available()"
                    );
                    coverage::ran("kernels", &what);
                }
                Err(e) => {
                    assert!(
                        available.iter().all(|a| a.isa() != isa),
                        "{what} is available but does not select: {e}"
                    );
                    coverage::not_run("kernels", &what, &why_not(&e));
                }
            }
        }
    });
    available
}

/// Why a table cannot run here, in a few words: `not built for x86_64`, or the CPU features
/// the host lacks.
fn why_not(e: &KernelError) -> String {
    match e {
        KernelError::Unsupported { missing, .. } if missing.starts_with("not built") => {
            missing.clone()
        }
        KernelError::Unsupported { missing, .. } => format!("host lacks {missing}"),
        other => other.to_string(),
    }
}

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

/// A standard normal value (Box-Muller).
pub fn normal(rng: &mut TestRng) -> f32 {
    use rand::Rng;
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    let v: f64 = rng.random_range(0.0..1.0);
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
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
    if ty.block_size() == 256 {
        return random_k_row(rng, ty, k);
    }
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
            GgmlType::Q5_0 => {
                out.extend(f16_bytes(random_scale(rng)));
                out.extend((0..20).map(|_| rng.random::<u8>()));
            }
            GgmlType::Q5_1 => {
                out.extend(f16_bytes(random_scale(rng)));
                out.extend(f16_bytes(random_scale(rng)));
                out.extend((0..20).map(|_| rng.random::<u8>()));
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

/// A random k-quant row: random bytes, with random (sane) f16 super-block scales.
pub fn random_k_row(rng: &mut TestRng, ty: GgmlType, k: usize) -> Vec<u8> {
    let size = ty.type_size() as usize;
    if ty == GgmlType::Q8K {
        // Activation block: f32 d, values in -127..=127, exact 16-value sums.
        let mut out = Vec::with_capacity(k / 256 * size);
        for _ in 0..k / 256 {
            let qs: Vec<i8> = (0..256).map(|_| rng.random_range(-127i8..=127)).collect();
            out.extend(random_scale(rng).to_le_bytes());
            out.extend(qs.iter().map(|&q| q as u8));
            for c in qs.chunks_exact(16) {
                out.extend(c.iter().map(|&q| q as i16).sum::<i16>().to_le_bytes());
            }
        }
        return out;
    }
    let mut out: Vec<u8> = (0..k / 256 * size).map(|_| rng.random::<u8>()).collect();
    let f16_fields: &[usize] = match ty {
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        other => panic!("not a k-quant weight type: {other}"),
    };
    for blk in out.chunks_exact_mut(size) {
        for &o in f16_fields {
            // Sub-block scales multiply d by up to 63 (127 for Q6_K): keep the product finite.
            blk[o..o + 2].copy_from_slice(&f16_bytes(random_scale(rng) / 128.0));
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
        _ => out.extend(decode_parts_f64(ty, row).iter().map(|(p, o)| p + o)),
    }
    out
}

/// 6-bit scale and min `j` of a Q4_K/Q5_K block's 12 packed bytes (written from the format's
/// description, independently of the crate's decoder).
pub fn k4_scale_min(s: &[u8], j: usize) -> (f64, f64) {
    let (sc, m) = if j < 4 {
        (s[j] & 0x3F, s[j + 4] & 0x3F)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    (sc as f64, m as f64)
}

/// Each value of a row of a quantised weight type as `(scaled part, offset part)`, the value
/// being their sum: `(d q, -8 d)` for Q4_0, `(d q, m)` for Q4_1, `(d sc q, -dmin m)` for Q4_K,
/// and so on. The sum of `(|part| + |offset|) |x|` bounds the terms any kernel adds.
pub fn decode_parts_f64(ty: GgmlType, row: &[u8]) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let nib = |qs: &[u8], j: usize| if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
    let bit =
        |qh: &[u8], j: usize| ((u32::from_le_bytes(qh[..4].try_into().unwrap()) >> j) & 1) as u8;
    match ty {
        GgmlType::Q4_0 => {
            for b in row.chunks_exact(18) {
                let d = h(b, 0);
                out.extend((0..32).map(|j| (d * nib(&b[2..], j) as f64, -8.0 * d)));
            }
        }
        GgmlType::Q4_1 => {
            for b in row.chunks_exact(20) {
                let (d, m) = (h(b, 0), h(b, 2));
                out.extend((0..32).map(|j| (d * nib(&b[4..], j) as f64, m)));
            }
        }
        GgmlType::Q5_0 => {
            for b in row.chunks_exact(22) {
                let d = h(b, 0);
                out.extend((0..32).map(|j| {
                    let q = nib(&b[6..], j) | (bit(&b[2..], j) << 4);
                    (d * q as f64, -16.0 * d)
                }));
            }
        }
        GgmlType::Q5_1 => {
            for b in row.chunks_exact(24) {
                let (d, m) = (h(b, 0), h(b, 2));
                out.extend((0..32).map(|j| {
                    let q = nib(&b[8..], j) | (bit(&b[4..], j) << 4);
                    (d * q as f64, m)
                }));
            }
        }
        GgmlType::Q8_0 => {
            for b in row.chunks_exact(34) {
                let d = h(b, 0);
                out.extend(b[2..].iter().map(|&q| (d * (q as i8) as f64, 0.0)));
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let size = ty.type_size() as usize;
            for b in row.chunks_exact(size) {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let (qh, qs) = if ty == GgmlType::Q5K {
                    (Some(&b[16..48]), &b[48..176])
                } else {
                    (None, &b[16..144])
                };
                for i in 0..256 {
                    let (j, l) = (i / 32, i % 32);
                    let (sc, m) = k4_scale_min(&b[4..16], j);
                    let mut q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
                    if let Some(qh) = qh {
                        q |= ((qh[l] >> j) & 1) << 4;
                    }
                    out.push((d * sc * q as f64, -dmin * m));
                }
            }
        }
        GgmlType::Q6K => {
            for b in row.chunks_exact(210) {
                let d = h(b, 208);
                for i in 0..256 {
                    let (half, s, l) = (i / 128, (i % 128) / 32, i % 32);
                    let lo = (b[64 * half + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                    let hi = (b[128 + 32 * half + l] >> (2 * s)) & 3;
                    let q = (lo | (hi << 4)) as i32 - 32;
                    let sc = b[192 + i / 16] as i8 as f64;
                    out.push((d * sc * q as f64, 0.0));
                }
            }
        }
        GgmlType::Q8K => {
            for b in row.chunks_exact(292) {
                let d = f32::from_le_bytes(b[0..4].try_into().unwrap()) as f64;
                out.extend(b[4..260].iter().map(|&q| (d * (q as i8) as f64, 0.0)));
            }
        }
        other => panic!("no decoder for {other}"),
    }
    out
}

/// The exact dot of a weight row with an activation row, in f64, from dequantised values,
/// and the sum of absolute terms (for error bounds).
///
/// For Q4_1 and Q5_1 the kernels use Q8_1's stored `s` (ggml's `d * sum(q)` with `d` before rounding)
/// instead of `d_f16 * sum(q)`; the expected value follows that definition:
/// `dequant(w) . dequant(a) + sum_b m_b (s_b - d_b sum(q_b))`.
pub fn dot_f64(w: GgmlType, wrow: &[u8], arow: &[u8]) -> (f64, f64) {
    let at = Kernels::vec_dot_type(w);
    let wv = decode_f64(w, wrow);
    let av = decode_f64(at, arow);
    assert_eq!(wv.len(), av.len());
    let mut dot: f64 = wv.iter().zip(&av).map(|(x, y)| x * y).sum();
    let mut abs: f64 = wv.iter().zip(&av).map(|(x, y)| (x * y).abs()).sum();
    if matches!(w, GgmlType::Q4K | GgmlType::Q5K) {
        // The kernels add the scaled and offset parts separately.
        abs = decode_parts_f64(w, wrow)
            .iter()
            .zip(&av)
            .map(|((p, o), y)| (p * y).abs() + (o * y).abs())
            .sum();
    }
    if matches!(w, GgmlType::Q4_1 | GgmlType::Q5_1) {
        let wsize = w.type_size() as usize;
        for (wb, ab) in wrow.chunks_exact(wsize).zip(arow.chunks_exact(36)) {
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

pub const QUANT_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];
/// Row lengths for the 256-value k-quants.
pub const K_KS: [usize; 5] = [256, 512, 768, 1280, 2304];
pub const FLOAT_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
pub const QUANT_KS: [usize; 6] = [32, 64, 96, 160, 576, 1536];
pub const FLOAT_KS: [usize; 10] = [1, 2, 3, 5, 7, 15, 17, 31, 33, 100];

/// The "number of terms" of a dot for error bounds: blocks for quantised types.
pub fn terms(w: GgmlType, k: usize) -> usize {
    if w.block_size() >= 32 {
        k / 32 + 32
    } else {
        k
    }
}

/// The AVX2 table and the AVX-512 tables this host can run, for tests that compare their
/// outputs bit for bit; prints `NOT RUN kernels: <what> <table> vs avx2 (<why>)` for each
/// table it lacks, and gives `None` where there is nothing to compare.
pub fn avx2_and_avx512_tables(what: &str) -> Option<(&'static Kernels, Vec<&'static Kernels>)> {
    let Ok(avx2) = Kernels::select(Some("avx2")) else {
        println!("NOT RUN kernels: {what} avx512 vs avx2 (no avx2 table on this host)");
        return None;
    };
    let wide: Vec<&Kernels> = ["avx512", "avx512vnni"]
        .into_iter()
        .filter_map(|n| match Kernels::select(Some(n)) {
            Ok(k) => Some(k),
            Err(e) => {
                println!("NOT RUN kernels: {what} {n} vs avx2 ({e})");
                None
            }
        })
        .collect();
    (!wide.is_empty()).then_some((avx2, wide))
}

/// Asserts that `got` equals the AVX2 table's `want` bit for bit (`what` names the case).
pub fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: output length");
    for (n, (g, e)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == e.to_bits(),
            "{what}: output {n}: {g} vs avx2 {e}"
        );
    }
}
