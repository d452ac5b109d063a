//! Q5_0, Q5_1 and the k-quant blocks (Q4_K, Q5_K, Q6_K and their activation type Q8_K), byte
//! for byte as GGUF stores them. Layouts were checked against the `gguf` Python package's
//! dequantisers (`tests/gguf_golden.rs`).

use std::mem::size_of;

use super::QK;

/// Values per k-quant super-block.
pub const QK_K: usize = flowrt_dtype::GgmlType::Q4K.block_size() as usize;
/// Bytes of the packed 6-bit scales and mins of Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// 5-bit block: `x = d * (q - 16)` with `q = low | high << 4`. The low nibbles are ordered as
/// in [`super::BlockQ4_0`] (value `j < 16` in the low nibble of `qs[j]`, value `j + 16` in the
/// high nibble of `qs[j]`); the fifth bit of value `j` is bit `j` of the little-endian `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ5_0 {
    /// Scale, f16 bits.
    pub d: [u8; 2],
    /// Fifth bits, a little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK / 2],
}

/// 5-bit block with offset: `x = d * q + m`; bits as in [`BlockQ5_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ5_1 {
    /// Scale, f16 bits.
    pub d: [u8; 2],
    /// Minimum (offset), f16 bits.
    pub m: [u8; 2],
    /// Fifth bits, a little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK / 2],
}

/// 4-bit k-quant super-block of 256 values in 8 sub-blocks of 32: value `i` of sub-block `j`
/// is `d * sc_j * q - dmin * m_j`, with 6-bit `sc_j`, `m_j` packed in `scales` (see
/// [`get_scale_min_k4`]). Sub-blocks `2c` and `2c + 1` share the 32 bytes
/// `qs[32c..32c + 32]`: the low nibbles hold sub-block `2c`, the high nibbles `2c + 1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4K {
    /// Super-block scale for the sub-block scales, f16 bits.
    pub d: [u8; 2],
    /// Super-block scale for the sub-block mins, f16 bits.
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 5-bit k-quant super-block: as [`BlockQ4K`], plus a fifth bit per value: bit `j` of
/// `qh[i]` is the fifth bit of value `i` of sub-block `j`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 6-bit k-quant super-block of 256 values in 16 sub-blocks of 16: `x = d * scales[i / 16] *
/// (q - 32)`. Each half `h` (128 values) uses `ql[64h..64h + 64]` and `qh[32h..32h + 32]`:
/// for value `32s + l` of the half (`s` in 0..4, `l` in 0..32) the low 4 bits are nibble
/// `s / 2` (low first) of `ql[64h + 32 (s % 2) + l]` and the high 2 bits are bits `2s..2s+2`
/// of `qh[32h + l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    /// Signed 8-bit sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale, f16 bits.
    pub d: [u8; 2],
}

/// 8-bit k-quant activation block: `x = d * q`, with the sums of each 16 values (ggml's
/// `bsums`, which Q4_K/Q5_K dots use for their mins).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8K {
    /// Scale, f32 bits (little-endian).
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    /// 16 little-endian i16 sums of 16 values each.
    pub bsums: [u8; QK_K / 16 * 2],
}

const _: () = assert!(size_of::<BlockQ5_0>() == flowrt_dtype::GgmlType::Q5_0.type_size() as usize);
const _: () = assert!(size_of::<BlockQ5_1>() == flowrt_dtype::GgmlType::Q5_1.type_size() as usize);
const _: () = assert!(size_of::<BlockQ4K>() == flowrt_dtype::GgmlType::Q4K.type_size() as usize);
const _: () = assert!(size_of::<BlockQ5K>() == flowrt_dtype::GgmlType::Q5K.type_size() as usize);
const _: () = assert!(size_of::<BlockQ6K>() == flowrt_dtype::GgmlType::Q6K.type_size() as usize);
const _: () = assert!(size_of::<BlockQ8K>() == flowrt_dtype::GgmlType::Q8K.type_size() as usize);
const _: () = assert!(std::mem::align_of::<BlockQ8K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ6K>() == 1);

/// Copies `N` bytes starting at `off`.
fn arr<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    b[off..off + N]
        .try_into()
        .expect("length checked by the slice")
}

/// The fifth bit (0 or 16) of value `j` of a Q5_0/Q5_1 block.
fn high5(qh: [u8; 4], j: usize) -> u8 {
    (((u32::from_le_bytes(qh) >> j) & 1) << 4) as u8
}

impl BlockQ5_0 {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        Self {
            d: arr(b, 0),
            qh: arr(b, 2),
            qs: arr(b, 6),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d);
        out[2..6].copy_from_slice(&self.qh);
        out[6..22].copy_from_slice(&self.qs);
    }

    /// Value `j` (0..32) as stored, 0..=31.
    pub fn q(&self, j: usize) -> u8 {
        super::nibble(&self.qs, j) | high5(self.qh, j)
    }
}

impl BlockQ5_1 {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        Self {
            d: arr(b, 0),
            m: arr(b, 2),
            qh: arr(b, 4),
            qs: arr(b, 8),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d);
        out[2..4].copy_from_slice(&self.m);
        out[4..8].copy_from_slice(&self.qh);
        out[8..24].copy_from_slice(&self.qs);
    }

    /// Value `j` (0..32) as stored, 0..=31.
    pub fn q(&self, j: usize) -> u8 {
        super::nibble(&self.qs, j) | high5(self.qh, j)
    }
}

/// Scale and min (each 0..=63) of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K or
/// Q5_K block. Bytes 0..4 hold the low 6 bits of scales 0..4 and bytes 4..8 those of mins
/// 0..4; for `j >= 4`, byte `j + 4` holds the low 4 bits of scale `j` (low nibble) and of min
/// `j` (high nibble), and the top 2 bits of bytes `j - 4` (scale) and `j` (min) hold their
/// high 2 bits.
pub fn get_scale_min_k4(j: usize, s: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// All 8 scales and 8 mins at once (the same decoding as [`get_scale_min_k4`], on words).
pub fn scales_mins_k4(s: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let w = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, m, c) = (w(0), w(4), w(8));
    let sc_lo = a & 0x3F3F_3F3F;
    let mn_lo = m & 0x3F3F_3F3F;
    let sc_hi = (c & 0x0F0F_0F0F) | ((a >> 2) & 0x3030_3030);
    let mn_hi = ((c >> 4) & 0x0F0F_0F0F) | ((m >> 2) & 0x3030_3030);
    let cat = |lo: u32, hi: u32| {
        let mut o = [0u8; 8];
        o[..4].copy_from_slice(&lo.to_le_bytes());
        o[4..].copy_from_slice(&hi.to_le_bytes());
        o
    };
    (cat(sc_lo, sc_hi), cat(mn_lo, mn_hi))
}

/// Packs 8 scales and 8 mins (each 0..=63) as [`get_scale_min_k4`] reads them.
pub fn pack_scale_min_k4(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut s = [0u8; K_SCALE_SIZE];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    s
}

impl BlockQ4K {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        Self {
            d: arr(b, 0),
            dmin: arr(b, 2),
            scales: arr(b, 4),
            qs: arr(b, 16),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d);
        out[2..4].copy_from_slice(&self.dmin);
        out[4..16].copy_from_slice(&self.scales);
        out[16..144].copy_from_slice(&self.qs);
    }

    /// Value `i` (0..256) as stored, 0..=15.
    pub fn q(&self, i: usize) -> u8 {
        let (j, l) = (i / 32, i % 32);
        (self.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F
    }
}

impl BlockQ5K {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        Self {
            d: arr(b, 0),
            dmin: arr(b, 2),
            scales: arr(b, 4),
            qh: arr(b, 16),
            qs: arr(b, 48),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d);
        out[2..4].copy_from_slice(&self.dmin);
        out[4..16].copy_from_slice(&self.scales);
        out[16..48].copy_from_slice(&self.qh);
        out[48..176].copy_from_slice(&self.qs);
    }

    /// Value `i` (0..256) as stored, 0..=31.
    pub fn q(&self, i: usize) -> u8 {
        let (j, l) = (i / 32, i % 32);
        let low = (self.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        low | (((self.qh[l] >> j) & 1) << 4)
    }
}

impl BlockQ6K {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        let mut scales = [0i8; QK_K / 16];
        for (s, &x) in scales.iter_mut().zip(&b[192..208]) {
            *s = x as i8;
        }
        Self {
            ql: arr(b, 0),
            qh: arr(b, 128),
            scales,
            d: arr(b, 208),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        for (o, &s) in out[192..208].iter_mut().zip(&self.scales) {
            *o = s as u8;
        }
        out[208..210].copy_from_slice(&self.d);
    }

    /// Value `i` (0..256) minus 32, -32..=31.
    pub fn q(&self, i: usize) -> i8 {
        let (h, s, l) = (i / 128, (i % 128) / 32, i % 32);
        let low = (self.ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
        let high = (self.qh[32 * h + l] >> (2 * s)) & 3;
        (low | (high << 4)) as i8 - 32
    }
}

impl BlockQ8K {
    pub const SIZE: usize = size_of::<Self>();

    pub fn read(b: &[u8]) -> Self {
        let mut qs = [0i8; QK_K];
        for (q, &x) in qs.iter_mut().zip(&b[4..4 + QK_K]) {
            *q = x as i8;
        }
        Self {
            d: arr(b, 0),
            qs,
            bsums: arr(b, 4 + QK_K),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.d);
        for (o, &q) in out[4..4 + QK_K].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        out[4 + QK_K..Self::SIZE].copy_from_slice(&self.bsums);
    }

    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of values `16 i..16 i + 16`.
    pub fn bsum(&self, i: usize) -> i16 {
        i16::from_le_bytes([self.bsums[2 * i], self.bsums[2 * i + 1]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k4_scales_pack_and_unpack() {
        let sc = [1, 63, 17, 32, 5, 48, 0, 63];
        let mn = [62, 0, 33, 7, 63, 16, 9, 1];
        let packed = pack_scale_min_k4(&sc, &mn);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &packed), (sc[j], mn[j]), "{j}");
        }
        assert_eq!(scales_mins_k4(&packed), (sc, mn));
        // Arbitrary bytes decode the same both ways.
        let s: [u8; 12] = std::array::from_fn(|i| (i as u8).wrapping_mul(97).wrapping_add(13));
        let (a, b) = scales_mins_k4(&s);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &s), (a[j], b[j]));
        }
    }

    #[test]
    fn blocks_round_trip_through_bytes() {
        let bytes: Vec<u8> = (0..292u32).map(|i| (i * 37 % 251) as u8).collect();
        let mut out = vec![0u8; 292];
        BlockQ5_0::read(&bytes).write(&mut out);
        assert_eq!(out[..22], bytes[..22]);
        BlockQ5_1::read(&bytes).write(&mut out);
        assert_eq!(out[..24], bytes[..24]);
        BlockQ4K::read(&bytes).write(&mut out);
        assert_eq!(out[..144], bytes[..144]);
        BlockQ5K::read(&bytes).write(&mut out);
        assert_eq!(out[..176], bytes[..176]);
        BlockQ6K::read(&bytes).write(&mut out);
        assert_eq!(out[..210], bytes[..210]);
        BlockQ8K::read(&bytes).write(&mut out);
        assert_eq!(out, bytes);
    }

    #[test]
    fn q5_high_bit_order() {
        let b = BlockQ5_0 {
            qh: 0x8000_0001u32.to_le_bytes(),
            ..Default::default()
        };
        assert_eq!(b.q(0), 16);
        assert_eq!(b.q(31), 16);
        assert_eq!(b.q(1), 0);
    }
}
