//! Scalar reference for Q5_0, Q5_1 and the k-quants (Q4_K, Q5_K, Q6_K, activation type Q8_K):
//! dequantisation, dots with the ggml activation types, and the Q5_0, Q5_1 and Q8_K quantisers.
//!
//! Dequantisation computes exactly what ggml (and the `gguf` Python package) compute, in the
//! same f32 operation order, so values are bit-identical (`tests/gguf_golden.rs`).
//!
//! Quantisers: Q5_0 and Q5_1 follow ggml's round-to-nearest reference quantisers (checked
//! against `gguf` on fixed data); Q8_K is a simple one of our own for activations. The Q4_K,
//! Q5_K and Q6_K weight quantisers are error-minimising searches (`search.rs`).

use crate::blocks::{
    f16_to_f32, f32_to_f16, get_scale_min_k4, BlockQ4K, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1, QK, QK_K,
};

// ---------------------------------------------------------------------------------------------
// Q5_0 / Q5_1

/// Packs 32 values (0..=31) into low nibbles and the `qh` word.
pub(crate) fn pack_q5(q: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qs = [0u8; QK / 2];
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4);
    }
    for (j, &v) in q.iter().enumerate() {
        qh |= ((v as u32 >> 4) & 1) << j;
    }
    (qh.to_le_bytes(), qs)
}

/// Q5_0 (ggml's reference): the value of largest magnitude (first one, with its sign) maps to
/// -16: `d = max / -16`, `q = min(31, trunc(x / d + 16.5))`.
pub(crate) fn quantize_row_q5_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ5_0::SIZE))
    {
        let max = xb
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; QK] = std::array::from_fn(|j| ((xb[j] * id + 16.5) as i8).min(31) as u8);
        let (qh, qs) = pack_q5(&q);
        BlockQ5_0 {
            d: f32_to_f16(d),
            qh,
            qs,
        }
        .write(ob);
    }
}

/// Q5_1 (ggml's reference): `m = min`, `d = (max - min) / 31`,
/// `q = min(31, trunc((x - m) / d + 0.5))`.
pub(crate) fn quantize_row_q5_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ5_1::SIZE))
    {
        let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
        let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; QK] = std::array::from_fn(|j| (((xb[j] - min) * id + 0.5) as i8).min(31) as u8);
        let (qh, qs) = pack_q5(&q);
        BlockQ5_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qh,
            qs,
        }
        .write(ob);
    }
}

pub(crate) fn dequantize_row_q5_0(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ5_0::SIZE)
        .zip(out.chunks_exact_mut(QK))
    {
        let blk = BlockQ5_0::read(b);
        let d = f16_to_f32(blk.d);
        for (j, v) in o.iter_mut().enumerate() {
            *v = d * (blk.q(j) as i32 - 16) as f32;
        }
    }
}

pub(crate) fn dequantize_row_q5_1(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ5_1::SIZE)
        .zip(out.chunks_exact_mut(QK))
    {
        let blk = BlockQ5_1::read(b);
        let (d, m) = (f16_to_f32(blk.d), f16_to_f32(blk.m));
        for (j, v) in o.iter_mut().enumerate() {
            *v = d * blk.q(j) as f32 + m;
        }
    }
}

pub(crate) fn vec_dot_q5_0_q8_0(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ5_0::SIZE)
        .zip(a.chunks_exact(BlockQ8_0::SIZE))
    {
        let (wb, ab) = (BlockQ5_0::read(wb), BlockQ8_0::read(ab));
        let isum: i32 = (0..QK)
            .map(|j| (wb.q(j) as i32 - 16) * ab.qs[j] as i32)
            .sum();
        sum += isum as f32 * (f16_to_f32(wb.d) * f16_to_f32(ab.d));
    }
    sum
}

/// `sum_b d_w d_a sum_j q_w q_a + m_w s_a`, as for Q4_1.
pub(crate) fn vec_dot_q5_1_q8_1(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ5_1::SIZE)
        .zip(a.chunks_exact(BlockQ8_1::SIZE))
    {
        let (wb, ab) = (BlockQ5_1::read(wb), BlockQ8_1::read(ab));
        let isum: i32 = (0..QK).map(|j| wb.q(j) as i32 * ab.qs[j] as i32).sum();
        sum += isum as f32 * (f16_to_f32(wb.d) * f16_to_f32(ab.d))
            + f16_to_f32(wb.m) * f16_to_f32(ab.s);
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// Q8_K

/// Q8_K (our own rule, the same as Q8_0's): `d = amax / 127` kept in f32,
/// `q = round(x / d)` (ties away from zero), so values lie in -127..=127.
pub(crate) fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BlockQ8K::SIZE))
    {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let qs: [i8; QK_K] = std::array::from_fn(|j| (xb[j] * id).round() as i8);
        let mut bsums = [0u8; 32];
        for (i, s) in bsums.chunks_exact_mut(2).enumerate() {
            let sum: i16 = qs[16 * i..16 * i + 16].iter().map(|&q| q as i16).sum();
            s.copy_from_slice(&sum.to_le_bytes());
        }
        BlockQ8K {
            d: d.to_le_bytes(),
            qs,
            bsums,
        }
        .write(ob);
    }
}

pub(crate) fn dequantize_row_q8_k(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ8K::SIZE)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let blk = BlockQ8K::read(b);
        let d = blk.d();
        for (v, &q) in o.iter_mut().zip(&blk.qs) {
            *v = d * q as f32;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q5_K

/// `(d sc_j, dmin m_j)` for the 8 sub-blocks, as ggml computes them in f32.
fn k4_sub_scales(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12]) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    let mut ds = [0f32; 8];
    let mut dm = [0f32; 8];
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, scales);
        ds[j] = d * sc as f32;
        dm[j] = dmin * m as f32;
    }
    (ds, dm)
}

pub(crate) fn dequantize_row_q4_k(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ4K::SIZE)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let blk = BlockQ4K::read(b);
        let (ds, dm) = k4_sub_scales(blk.d, blk.dmin, &blk.scales);
        for (i, v) in o.iter_mut().enumerate() {
            *v = ds[i / 32] * blk.q(i) as f32 - dm[i / 32];
        }
    }
}

pub(crate) fn dequantize_row_q5_k(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ5K::SIZE)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let blk = BlockQ5K::read(b);
        let (ds, dm) = k4_sub_scales(blk.d, blk.dmin, &blk.scales);
        for (i, v) in o.iter_mut().enumerate() {
            *v = ds[i / 32] * blk.q(i) as f32 - dm[i / 32];
        }
    }
}

/// Dot of a Q4_K/Q5_K super-block (values `q(i)`, scales and mins) with a Q8_K block:
/// `d d_a sum_j sc_j isum_j - dmin d_a sum_j m_j bsum_j`, integer sums exact.
fn dot_minmax_k(
    q: impl Fn(usize) -> u8,
    d: [u8; 2],
    dmin: [u8; 2],
    s: &[u8; 12],
    a: &BlockQ8K,
) -> f32 {
    let mut sumi = 0i32;
    let mut summ = 0i32;
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, s);
        let isum: i32 = (32 * j..32 * j + 32)
            .map(|i| q(i) as i32 * a.qs[i] as i32)
            .sum();
        sumi += sc as i32 * isum;
        summ += m as i32 * (a.bsum(2 * j) as i32 + a.bsum(2 * j + 1) as i32);
    }
    let da = a.d();
    f16_to_f32(d) * da * sumi as f32 - f16_to_f32(dmin) * da * summ as f32
}

pub(crate) fn vec_dot_q4_k_q8_k(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ4K::SIZE)
        .zip(a.chunks_exact(BlockQ8K::SIZE))
    {
        let (wb, ab) = (BlockQ4K::read(wb), BlockQ8K::read(ab));
        sum += dot_minmax_k(|i| wb.q(i), wb.d, wb.dmin, &wb.scales, &ab);
    }
    sum
}

pub(crate) fn vec_dot_q5_k_q8_k(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ5K::SIZE)
        .zip(a.chunks_exact(BlockQ8K::SIZE))
    {
        let (wb, ab) = (BlockQ5K::read(wb), BlockQ8K::read(ab));
        sum += dot_minmax_k(|i| wb.q(i), wb.d, wb.dmin, &wb.scales, &ab);
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// Q6_K

pub(crate) fn dequantize_row_q6_k(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ6K::SIZE)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let blk = BlockQ6K::read(b);
        let d = f16_to_f32(blk.d);
        for (i, v) in o.iter_mut().enumerate() {
            *v = (d * blk.scales[i / 16] as f32) * blk.q(i) as f32;
        }
    }
}

/// `d d_a sum_j sc_j sum_{i in j} q_i a_i` over the 16 sub-blocks, integer sums exact.
pub(crate) fn vec_dot_q6_k_q8_k(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ6K::SIZE)
        .zip(a.chunks_exact(BlockQ8K::SIZE))
    {
        let (wb, ab) = (BlockQ6K::read(wb), BlockQ8K::read(ab));
        let mut sumi = 0i32;
        for j in 0..16 {
            let isum: i32 = (16 * j..16 * j + 16)
                .map(|i| wb.q(i) as i32 * ab.qs[i] as i32)
                .sum();
            sumi += wb.scales[j] as i32 * isum;
        }
        sum += f16_to_f32(wb.d) * ab.d() * sumi as f32;
    }
    sum
}
