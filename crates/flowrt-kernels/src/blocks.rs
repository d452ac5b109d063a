//! Quantised block layouts, byte-compatible with ggml, and half-float helpers.
//!
//! Every block is `#[repr(C)]` with alignment 1 (halves are stored as `[u8; 2]`, little-endian),
//! so a row of blocks is exactly `nblocks * SIZE` bytes with no padding, as in a GGUF file.
//! The kernels' public API works on `&[u8]` rows; these structs are the readable description of
//! those bytes and what the scalar reference code decodes with [`BlockQ4_0::read`] and friends.
//! Q5_0, Q5_1 and the k-quants (`BlockQ4K`, `BlockQ5K`, `BlockQ6K`, `BlockQ8K`) are in the
//! `k` submodule, re-exported here.

use flowrt_dtype::GgmlType;
use std::mem::size_of;

mod k;
pub use k::*;

/// Values per block of Q4_0, Q4_1, Q8_0 and Q8_1.
pub const QK: usize = GgmlType::Q4_0.block_size() as usize;

/// 4-bit block: `x = d * (q - 8)`. Value `j < 16` is the low nibble of `qs[j]`, value `j + 16`
/// the high nibble of `qs[j]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ4_0 {
    /// Scale, f16 bits (little-endian).
    pub d: [u8; 2],
    /// 32 nibbles.
    pub qs: [u8; QK / 2],
}

/// 4-bit block with offset: `x = d * q + m`; same nibble order as [`BlockQ4_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ4_1 {
    /// Scale, f16 bits.
    pub d: [u8; 2],
    /// Minimum (offset), f16 bits.
    pub m: [u8; 2],
    /// 32 nibbles.
    pub qs: [u8; QK / 2],
}

/// 8-bit block: `x = d * q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// Scale, f16 bits.
    pub d: [u8; 2],
    /// 32 signed values.
    pub qs: [i8; QK],
}

/// 8-bit block with the scaled sum of its values, the activation type for Q4_1 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    /// Scale, f16 bits.
    pub d: [u8; 2],
    /// `d * sum(qs)` (with `d` before rounding to f16), f16 bits.
    pub s: [u8; 2],
    /// 32 signed values.
    pub qs: [i8; QK],
}

const _: () = assert!(size_of::<BlockQ4_0>() == GgmlType::Q4_0.type_size() as usize);
const _: () = assert!(size_of::<BlockQ4_1>() == GgmlType::Q4_1.type_size() as usize);
const _: () = assert!(size_of::<BlockQ8_0>() == GgmlType::Q8_0.type_size() as usize);
const _: () = assert!(size_of::<BlockQ8_1>() == GgmlType::Q8_1.type_size() as usize);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 1);

impl Default for BlockQ8_0 {
    fn default() -> Self {
        Self {
            d: [0; 2],
            qs: [0; QK],
        }
    }
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        Self {
            d: [0; 2],
            s: [0; 2],
            qs: [0; QK],
        }
    }
}

impl BlockQ4_0 {
    pub const SIZE: usize = size_of::<Self>();

    /// Decodes the first [`Self::SIZE`] bytes of `b`.
    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        Self {
            d: [b[0], b[1]],
            qs: b[2..18].try_into().expect("16 bytes"),
        }
    }

    /// Encodes into the first [`Self::SIZE`] bytes of `out`.
    pub fn write(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        out[0..2].copy_from_slice(&self.d);
        out[2..18].copy_from_slice(&self.qs);
    }

    /// Nibble `j` (0..32) as stored, 0..=15.
    pub fn q(&self, j: usize) -> u8 {
        nibble(&self.qs, j)
    }
}

impl BlockQ4_1 {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        Self {
            d: [b[0], b[1]],
            m: [b[2], b[3]],
            qs: b[4..20].try_into().expect("16 bytes"),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        out[0..2].copy_from_slice(&self.d);
        out[2..4].copy_from_slice(&self.m);
        out[4..20].copy_from_slice(&self.qs);
    }

    pub fn q(&self, j: usize) -> u8 {
        nibble(&self.qs, j)
    }
}

impl BlockQ8_0 {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        let mut qs = [0i8; QK];
        for (q, &byte) in qs.iter_mut().zip(&b[2..]) {
            *q = byte as i8;
        }
        Self {
            d: [b[0], b[1]],
            qs,
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        out[0..2].copy_from_slice(&self.d);
        for (o, &q) in out[2..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
    }
}

impl BlockQ8_1 {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        let mut qs = [0i8; QK];
        for (q, &byte) in qs.iter_mut().zip(&b[4..]) {
            *q = byte as i8;
        }
        Self {
            d: [b[0], b[1]],
            s: [b[2], b[3]],
            qs,
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        out[0..2].copy_from_slice(&self.d);
        out[2..4].copy_from_slice(&self.s);
        for (o, &q) in out[4..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
    }
}

/// Bytes of an MXFP4 block (ggml's `block_mxfp4`): byte 0 an E8M0 exponent `e`, bytes 1..17
/// 32 E2M1 codes, value `j < 16` in the low nibble of byte `1 + j`, value `j + 16` in its high
/// nibble (Q4_0's order). Value `j` is `mxfp4_half_scale(e) * MXFP4_KVALUES[code_j]`, i.e.
/// `2^(e - 127)` times the E2M1 value.
pub const MXFP4_BLOCK_BYTES: usize = GgmlType::Mxfp4.type_size() as usize;

/// The E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..8) and their negatives (codes 8..16,
/// sign bit 3), doubled so that they are integers (the scale is halved to match).
pub const MXFP4_KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the E8M0 scale `2^(e - 127)`: `2^(e - 128)` exactly, subnormal for `e < 2`; `e = 255`
/// (NaN in the OCP format) gives `2^127`, as ggml's `ggml_e8m0_to_fp32_half` and gguf-py do.
#[inline]
pub fn mxfp4_half_scale(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Code `j` (0..32) of an MXFP4 block's 16 code bytes (the block without its exponent byte).
#[inline]
pub fn mxfp4_code(qs: &[u8], j: usize) -> u8 {
    if j < QK / 2 {
        qs[j] & 0x0F
    } else {
        qs[j - QK / 2] >> 4
    }
}

fn nibble(qs: &[u8; QK / 2], j: usize) -> u8 {
    if j < QK / 2 {
        qs[j] & 0x0F
    } else {
        qs[j - QK / 2] >> 4
    }
}

/// f16 bits (little-endian bytes) to f32, exactly.
#[inline]
pub fn f16_to_f32(h: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(h)).to_f32()
}

/// f32 to f16 bytes, rounding to nearest even (as F16C's `vcvtps2ph` with mode 0).
#[inline]
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// bf16 bits (little-endian bytes) to f32, exactly.
#[inline]
pub fn bf16_to_f32(h: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(h) as u32) << 16)
}

/// f32 to bf16 bytes, rounding to nearest even (NaN stays NaN).
#[inline]
pub fn f32_to_bf16(x: f32) -> [u8; 2] {
    half::bf16::from_f32(x).to_bits().to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_through_bytes() {
        let bytes: Vec<u8> = (0..36u8).map(|i| i.wrapping_mul(37)).collect();
        let mut out = vec![0u8; 36];
        BlockQ4_0::read(&bytes).write(&mut out);
        assert_eq!(out[..18], bytes[..18]);
        BlockQ4_1::read(&bytes).write(&mut out);
        assert_eq!(out[..20], bytes[..20]);
        BlockQ8_0::read(&bytes).write(&mut out);
        assert_eq!(out[..34], bytes[..34]);
        BlockQ8_1::read(&bytes).write(&mut out);
        assert_eq!(out, bytes);
    }

    #[test]
    fn nibble_order_is_low_then_high() {
        let mut b = BlockQ4_0::default();
        b.qs[3] = 0xA5;
        assert_eq!(b.q(3), 5);
        assert_eq!(b.q(3 + 16), 10);
    }

    #[test]
    fn mxfp4_half_scale_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            assert_eq!(
                mxfp4_half_scale(e) as f64,
                2f64.powi(e as i32 - 128),
                "e = {e}"
            );
        }
    }

    #[test]
    fn half_helpers() {
        assert_eq!(f16_to_f32(f32_to_f16(1.5)), 1.5);
        assert_eq!(f32_to_f16(1.0), [0x00, 0x3C]);
        assert_eq!(bf16_to_f32(f32_to_bf16(-2.0)), -2.0);
        assert_eq!(f32_to_bf16(1.0), [0x80, 0x3F]);
    }
}
