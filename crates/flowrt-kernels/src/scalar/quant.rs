//! Scalar quantisation and dequantisation of rows (ggml's reference semantics).
//!
//! Lengths are checked by the caller ([`crate::Kernels::quantize_row`]); the row functions
//! iterate over whole blocks.

use crate::blocks::{
    bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1,
    QK,
};

/// Round to nearest, ties away from zero (C `roundf`), then to i8. `v` is within ±127.5.
#[inline]
fn round_i8(v: f32) -> i8 {
    v.round() as i8
}

/// Scale and values of one 8-bit block: `d = amax / 127`, `q = round(x * (1/d))`.
/// Returns `d` before its rounding to f16 (Q8_1's `s` uses it).
pub(crate) fn quantize_block_q8(x: &[f32]) -> (f32, [i8; QK]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_i8(v * id);
    }
    (d, qs)
}

pub(crate) fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ8_0::SIZE))
    {
        let (d, qs) = quantize_block_q8(xb);
        BlockQ8_0 {
            d: f32_to_f16(d),
            qs,
        }
        .write(ob);
    }
}

pub(crate) fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ8_1::SIZE))
    {
        let (d, qs) = quantize_block_q8(xb);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        BlockQ8_1 {
            d: f32_to_f16(d),
            s: f32_to_f16(d * sum as f32),
            qs,
        }
        .write(ob);
    }
}

/// Q4_0: the value of largest magnitude (with its sign) maps to -8: `d = max / -8`,
/// `q = min(15, trunc(x / d + 8.5))`.
pub(crate) fn quantize_row_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ4_0::SIZE))
    {
        let max = xb
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            *q = lo | (hi << 4);
        }
        BlockQ4_0 {
            d: f32_to_f16(d),
            qs,
        }
        .write(ob);
    }
}

/// Q4_1: `m = min`, `d = (max - min) / 15`, `q = min(15, trunc((x - m) / d + 0.5))`.
pub(crate) fn quantize_row_q4_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(BlockQ4_1::SIZE))
    {
        let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
        let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = (((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
            let hi = (((xb[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            *q = lo | (hi << 4);
        }
        BlockQ4_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qs,
        }
        .write(ob);
    }
}

pub(crate) fn quantize_row_f32(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn quantize_row_f16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&f32_to_f16(*v));
    }
}

pub(crate) fn quantize_row_bf16(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&f32_to_bf16(*v));
    }
}

pub(crate) fn dequantize_row_q4_0(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ4_0::SIZE)
        .zip(out.chunks_exact_mut(QK))
    {
        let blk = BlockQ4_0::read(b);
        let d = f16_to_f32(blk.d);
        for (j, v) in o.iter_mut().enumerate() {
            *v = (blk.q(j) as i32 - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_row_q4_1(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ4_1::SIZE)
        .zip(out.chunks_exact_mut(QK))
    {
        let blk = BlockQ4_1::read(b);
        let (d, m) = (f16_to_f32(blk.d), f16_to_f32(blk.m));
        for (j, v) in o.iter_mut().enumerate() {
            *v = blk.q(j) as f32 * d + m;
        }
    }
}

pub(crate) fn dequantize_row_q8_0(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ8_0::SIZE)
        .zip(out.chunks_exact_mut(QK))
    {
        let blk = BlockQ8_0::read(b);
        let d = f16_to_f32(blk.d);
        for (v, &q) in o.iter_mut().zip(&blk.qs) {
            *v = q as f32 * d;
        }
    }
}

pub(crate) fn dequantize_row_q8_1(row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(BlockQ8_1::SIZE)
        .zip(out.chunks_exact_mut(QK))
    {
        let blk = BlockQ8_1::read(b);
        let d = f16_to_f32(blk.d);
        for (v, &q) in o.iter_mut().zip(&blk.qs) {
            *v = q as f32 * d;
        }
    }
}

pub(crate) fn dequantize_row_f32(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(4).zip(out.iter_mut()) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(crate) fn dequantize_row_f16(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(2).zip(out.iter_mut()) {
        *o = f16_to_f32([b[0], b[1]]);
    }
}

pub(crate) fn dequantize_row_bf16(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(2).zip(out.iter_mut()) {
        *o = bf16_to_f32([b[0], b[1]]);
    }
}
