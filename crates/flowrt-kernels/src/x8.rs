//! Weights repacked at load into groups of 8 interleaved rows ("x8" layouts), for matmuls with
//! Q16 activations (see [`crate::q16`]).
//!
//! In ggml's layouts each row is a run of blocks, so a SIMD dot product of one row with an
//! activation ends in a horizontal sum per row, and a few rows processed together read from a
//! few separate streams. In an x8 layout the same block of 8 consecutive rows is stored
//! together, interleaved so that one 32-bit lane of a vector holds one row: `vpmaddwd` of 8
//! rows' weight pairs with a broadcast activation pair gives 8 rows' partial sums at once, the
//! per-block scales of 8 rows are one vector, and a task's weights are one linear stream.
//! The packed bytes have exactly the size of the original rows (Q4_K and Q5_K: 32 bytes more
//! per 8 rows and 256 values, their scales decoded to bytes).
//!
//! A packed matrix is `rows / 8` groups; a group is the `k / 32` packed blocks of its 8 rows, in
//! order. One packed block (of 8 rows, 32 values each):
//!
//! | type | bytes | layout |
//! |---|---|---|
//! | Q4_0 | 144 | `d: [f16; 8]`, `q: [u8; 128]` |
//! | Q4_1 | 160 | `d: [f16; 8]`, `m: [f16; 8]`, `q: [u8; 128]` |
//! | Q5_0 | 176 | `d: [f16; 8]`, `q: [u8; 128]` (the low 4 bits), `h: [u8; 32]` (the fifth bits) |
//! | Q5_1 | 192 | `d: [f16; 8]`, `m: [f16; 8]`, `q: [u8; 128]`, `h: [u8; 32]` |
//! | Q8_0 | 272 | `d: [f16; 8]`, `q: [i8; 256]` |
//! | Q4_K | 1184 per 256 values | `d: [f16; 8]`, `dmin: [f16; 8]`, `sc: [[u8; 8]; 8]`, `m: [[u8; 8]; 8]` (sub-block, row: the 6-bit scales and mins decoded), then 8 sub-blocks of 32 values laid out as Q4_0's `q` |
//! | Q5_K | 1440 per 256 values | as Q4_K, each sub-block's `q` followed by its `h: [u8; 32]` |
//! | MXFP4 | 136 | `e: [u8; 8]` (the E8M0 exponents), `q: [u8; 128]` (the E2M1 codes, laid out as Q4_0's `q`) |
//! | Q6_K | 1680 per 256 values | `d: [f16; 8]`, `sc: [[i8; 8]; 16]` (16-value sub-block, row), then 8 sub-blocks of 32 values: `q: [u8; 128]` (low 4 bits of `q + 32`), `h: [[u8; 32]; 2]` (its bits 4 and 5) |
//!
//! 4-bit `q`: 4 units of 32 bytes; unit `u` holds values `8u..8u+8` of all 8 rows as 16
//! little-endian 16-bit lanes. Lane `i` belongs to row `i / 2`; with `j = i % 2`, its low byte
//! holds values `8u + j` (low nibble) and `8u + 4 + j` (high nibble), its high byte values
//! `8u + 2 + j` and `8u + 6 + j`. Masking and shifting the lanes (bits 0..4, 8..12, 4..8,
//! 12..16) gives the 16-bit weight pairs `(8u, 8u+1)`, `(8u+2, 8u+3)`, `(8u+4, 8u+5)`,
//! `(8u+6, 8u+7)` of rows 0..8 in order, without widening instructions.
//! A high-bit plane (Q5's `h`) holds the fifth bit of each of the 32 values of 8 rows: 16-bit
//! lane `2r + j`, bit `4u + p`, is the bit of value `8u + 2p + j` of row `r`, the value whose
//! low 4 bits sit in unit `u`'s lane `2r + j` at the `p`-th of the positions above. Shifting the
//! plane and masking one bit completes the weight pairs of that position. Q6_K's two high bits
//! take two such vectors, one per 16-value half (units 0-1, 2-3): the 2-bit field at bits
//! `2f..2f+2`, `f = 4 (u % 2) + p`, of lane `2r + j` of vector `u / 2`.
//! 8-bit `q`: 16 chunks of 16 bytes; chunk `c` holds values `2c, 2c+1`: byte `i` is row `i / 2`,
//! value `2c + i % 2`.

use flowrt_dtype::GgmlType;

use crate::blocks::QK;
use crate::blocks::QK_K;
use crate::q16::{self, Q16Weight};
use crate::{Isa, MatmulArgs, MatmulFn};

/// Rows per group.
pub const ROWS: usize = 8;

/// Weight types with an x8 layout.
pub fn supports(w: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        w,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q5K | Q6K | Mxfp4
    )
}

/// Values per row in one packed unit: a ggml block (32, or 256 for Q4_K).
pub fn unit_values(w: GgmlType) -> usize {
    if matches!(w, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K) {
        256
    } else {
        QK
    }
}

/// Bytes of one packed unit (8 rows x [`unit_values`]).
pub fn unit_bytes(w: GgmlType) -> usize {
    match w {
        GgmlType::Q4K => Q4K_UNIT,
        GgmlType::Q5K => Q5K_UNIT,
        _ => ROWS * block_bytes(w),
    }
}

/// Bytes of a ggml Q6_K block.
const Q6K_BLOCK: usize = GgmlType::Q6K.type_size() as usize;

const _: () = assert!(
    Q6K_UNIT == ROWS * Q6K_BLOCK,
    "packed Q6_K keeps the size of its rows"
);

/// Packed bytes per row of `k` values (a group of 8 rows takes 8 times this).
pub fn packed_row_bytes(w: GgmlType, k: usize) -> usize {
    k / unit_values(w) * unit_bytes(w) / ROWS
}

/// Bytes of a packed `rows x k` matrix.
pub fn packed_size(w: GgmlType, rows: usize, k: usize) -> usize {
    rows * packed_row_bytes(w, k)
}

/// Whether a `rows x k` matrix of type `w` can be packed.
pub fn can_pack(w: GgmlType, rows: usize, k: usize) -> bool {
    supports(w) && rows.is_multiple_of(ROWS) && k.is_multiple_of(unit_values(w)) && k > 0
}

/// Bytes of a packed Q4_K unit: d, dmin (8 f16 each), sub-block scales and mins (64 bytes
/// each), 8 sub-blocks of 128 quant bytes.
const Q4K_UNIT: usize = 32 + 128 + 8 * 128;

/// Bytes of a packed Q5_K unit: as Q4_K's, each sub-block with a 32-byte high-bit plane.
const Q5K_UNIT: usize = 32 + 128 + 8 * 160;

/// Bytes of one ggml block of `w` (a supported type).
fn block_bytes(w: GgmlType) -> usize {
    assert!(supports(w), "x8: {w} has no x8 layout");
    w.type_size() as usize
}

/// Where the quants start in a ggml block of `w`: after `d` (and `m` for Q4_1 and Q5_1,
/// `qh` for Q5_0 and Q5_1).
fn quant_offset(w: GgmlType) -> usize {
    match w {
        GgmlType::Q4_1 => 4,
        GgmlType::Q5_0 => 6,
        GgmlType::Q5_1 => 8,
        _ => 2,
    }
}

/// Bytes of a header (8 rows' scales, and minimums for Q4_1 and Q5_1) in a packed block.
fn header_bytes(w: GgmlType) -> usize {
    if matches!(w, GgmlType::Q4_1 | GgmlType::Q5_1) {
        32
    } else {
        16
    }
}

/// Whether `w` (a 32-value type) has a fifth bit per value.
fn has_high(w: GgmlType) -> bool {
    matches!(w, GgmlType::Q5_0 | GgmlType::Q5_1)
}

/// The 32 unsigned values of the ggml block `s` of the 4- or 5-bit type `w`.
fn block_values(w: GgmlType, s: &[u8]) -> [u8; QK] {
    use crate::blocks::{BlockQ5_0, BlockQ5_1};
    match w {
        GgmlType::Q5_0 => {
            let b = BlockQ5_0::read(s);
            std::array::from_fn(|j| b.q(j))
        }
        GgmlType::Q5_1 => {
            let b = BlockQ5_1::read(s);
            std::array::from_fn(|j| b.q(j))
        }
        _ => {
            let q = &s[quant_offset(w)..quant_offset(w) + 16];
            std::array::from_fn(|j| if j < 16 { q[j] & 0x0F } else { q[j - 16] >> 4 })
        }
    }
}

/// Row `r`'s 32 values (their low 4 bits) into their places in a packed 4-bit block (`q`,
/// 128 bytes).
fn put_nibbles(r: usize, v: &[u8; QK], q: &mut [u8]) {
    for u in 0..QK / 8 {
        for j in 0..2 {
            let e = 8 * u + j;
            let o = 32 * u + 2 * (2 * r + j);
            q[o] = (v[e] & 0x0F) | ((v[e + 4] & 0x0F) << 4);
            q[o + 1] = (v[e + 2] & 0x0F) | ((v[e + 6] & 0x0F) << 4);
        }
    }
}

/// Row `r`'s 32 low 4-bit values from a packed 4-bit block (the inverse of [`put_nibbles`]).
fn get_nibbles(q: &[u8], r: usize) -> [u8; QK] {
    std::array::from_fn(|e| {
        let (u, m) = (e / 8, e % 8);
        let (high, m) = (m >= 4, m % 4);
        let byte = q[32 * u + 2 * (2 * r + m % 2) + m / 2];
        if high {
            byte >> 4
        } else {
            byte & 0x0F
        }
    })
}

/// Where value `e` of row `r` has its bit in a high-bit plane: (byte, bit).
fn high_place(r: usize, e: usize) -> (usize, usize) {
    let (u, m) = (e / 8, e % 8);
    let (p, j) = (m / 2, m % 2);
    let b = 4 * u + p;
    (2 * (2 * r + j) + b / 8, b % 8)
}

/// Bit `bit` of row `r`'s 32 values into a high-bit plane (`h`, 32 bytes).
fn put_bits(r: usize, v: &[u8; QK], bit: u32, h: &mut [u8]) {
    for (e, &x) in v.iter().enumerate() {
        let (byte, b) = high_place(r, e);
        h[byte] = (h[byte] & !(1 << b)) | (((x >> bit) & 1) << b);
    }
}

/// Where value `e` of row `r` has its two high bits in Q6_K's high-bit vectors (64 bytes):
/// (byte, shift).
fn high2_place(r: usize, e: usize) -> (usize, usize) {
    let (u, m) = (e / 8, e % 8);
    let (p, j) = (m / 2, m % 2);
    let bit = 2 * (4 * (u % 2) + p);
    (32 * (u / 2) + 2 * (2 * r + j) + bit / 8, bit % 8)
}

/// Bits 4 and 5 of row `r`'s 32 values into Q6_K's high-bit vectors (`h`, 64 bytes).
fn put_bits2(r: usize, v: &[u8; QK], h: &mut [u8]) {
    for (e, &x) in v.iter().enumerate() {
        let (byte, sh) = high2_place(r, e);
        h[byte] = (h[byte] & !(3 << sh)) | (((x >> 4) & 3) << sh);
    }
}

/// Row `r`'s bits 4 and 5 from Q6_K's high-bit vectors, in place (the inverse of
/// [`put_bits2`]).
fn get_bits2(h: &[u8], r: usize) -> [u8; QK] {
    std::array::from_fn(|e| {
        let (byte, sh) = high2_place(r, e);
        ((h[byte] >> sh) & 3) << 4
    })
}

/// Row `r`'s bits of a high-bit plane, each moved to bit `bit` (the inverse of [`put_bits`]).
fn get_bits(h: &[u8], r: usize, bit: u32) -> [u8; QK] {
    std::array::from_fn(|e| {
        let (byte, b) = high_place(r, e);
        ((h[byte] >> b) & 1) << bit
    })
}

/// Packs `rows x k` weights of type `w` from ggml's row layout (`src`) into the x8 layout
/// (`dst`, [`packed_size`] bytes).
///
/// # Panics
/// If the matrix cannot be packed (see [`can_pack`]) or a length does not match.
pub fn pack(w: GgmlType, rows: usize, k: usize, src: &[u8], dst: &mut [u8]) {
    assert!(can_pack(w, rows, k), "x8::pack: {w} {rows}x{k}");
    let bb = block_bytes(w);
    let nb = k / unit_values(w);
    assert_eq!(src.len(), rows * nb * bb, "x8::pack: source length");
    assert_eq!(
        dst.len(),
        packed_size(w, rows, k),
        "x8::pack: destination length"
    );
    if matches!(w, GgmlType::Q4K | GgmlType::Q5K) {
        return pack_kq(w, k, src, dst);
    }
    if w == GgmlType::Q6K {
        return pack_q6k(k, src, dst);
    }
    if w == GgmlType::Mxfp4 {
        return pack_mxfp4(k, src, dst);
    }
    let hb = header_bytes(w);
    let qo = quant_offset(w);
    let row_bytes = nb * bb;
    for (src_g, dst_g) in src
        .chunks_exact(ROWS * row_bytes)
        .zip(dst.chunks_exact_mut(ROWS * row_bytes))
    {
        for (b, out) in dst_g.chunks_exact_mut(ROWS * bb).enumerate() {
            let blk: [&[u8]; ROWS] = std::array::from_fn(|r| {
                &src_g[r * row_bytes + b * bb..r * row_bytes + (b + 1) * bb]
            });
            for (r, s) in blk.iter().enumerate() {
                out[2 * r..2 * r + 2].copy_from_slice(&s[0..2]);
                if hb == 32 {
                    out[16 + 2 * r..18 + 2 * r].copy_from_slice(&s[2..4]);
                }
            }
            let q = &mut out[hb..];
            if w == GgmlType::Q8_0 {
                for c in 0..QK / 2 {
                    for i in 0..16 {
                        q[16 * c + i] = blk[i / 2][qo + 2 * c + i % 2];
                    }
                }
                continue;
            }
            for (r, s) in blk.iter().enumerate() {
                let v = block_values(w, s);
                put_nibbles(r, &v, &mut q[..128]);
                if has_high(w) {
                    put_bits(r, &v, 4, &mut q[128..160]);
                }
            }
        }
    }
}

/// Packs MXFP4 rows: per block of 8 rows, their 8 exponent bytes, then their codes placed as
/// Q4_0's nibbles.
fn pack_mxfp4(k: usize, src: &[u8], dst: &mut [u8]) {
    use crate::blocks::{mxfp4_code, MXFP4_BLOCK_BYTES as BB};
    let nb = k / QK;
    let row_bytes = nb * BB;
    for (src_g, dst_g) in src
        .chunks_exact(ROWS * row_bytes)
        .zip(dst.chunks_exact_mut(ROWS * row_bytes))
    {
        for (b, out) in dst_g.chunks_exact_mut(ROWS * BB).enumerate() {
            for r in 0..ROWS {
                let blk = &src_g[r * row_bytes + b * BB..][..BB];
                out[r] = blk[0];
                let v: [u8; QK] = std::array::from_fn(|j| mxfp4_code(&blk[1..], j));
                put_nibbles(r, &v, &mut out[ROWS..ROWS + 128]);
            }
        }
    }
}

/// The MXFP4 block of row `r` from a packed unit (the inverse of [`pack_mxfp4`]).
fn unpack_mxfp4(p: &[u8], r: usize, out: &mut [u8]) {
    out[0] = p[r];
    let v = get_nibbles(&p[ROWS..ROWS + 128], r);
    for j in 0..QK / 2 {
        out[1 + j] = v[j] | (v[j + QK / 2] << 4);
    }
}

/// Bytes of a packed Q6_K unit: d (8 f16), 16 sub-block scales of 8 rows, 8 sub-blocks of
/// 128 quant bytes and two 32-byte high-bit planes.
const Q6K_UNIT: usize = 16 + 128 + 8 * Q6K_SUB;
/// Bytes of one 32-value sub-block of a packed Q6_K unit.
const Q6K_SUB: usize = 128 + 64;

fn pack_q6k(k: usize, src: &[u8], dst: &mut [u8]) {
    use crate::blocks::BlockQ6K;
    let nb = k / QK_K;
    let row_bytes = nb * Q6K_BLOCK;
    for (src_g, dst_g) in src
        .chunks_exact(ROWS * row_bytes)
        .zip(dst.chunks_exact_mut(nb * Q6K_UNIT))
    {
        for (b, out) in dst_g.chunks_exact_mut(Q6K_UNIT).enumerate() {
            for r in 0..ROWS {
                let blk = BlockQ6K::read(&src_g[r * row_bytes + b * Q6K_BLOCK..][..Q6K_BLOCK]);
                out[2 * r..2 * r + 2].copy_from_slice(&blk.d);
                for (j, &sc) in blk.scales.iter().enumerate() {
                    out[16 + 8 * j + r] = sc as u8;
                }
                for s in 0..8 {
                    // Stored values 0..=63 (the dot subtracts 32).
                    let v: [u8; QK] = std::array::from_fn(|l| (blk.q(32 * s + l) + 32) as u8);
                    let sub = &mut out[144 + Q6K_SUB * s..][..Q6K_SUB];
                    put_nibbles(r, &v, &mut sub[..128]);
                    put_bits2(r, &v, &mut sub[128..192]);
                }
            }
        }
    }
}

/// The ggml Q6_K block of row `r` from a packed unit (the inverse of [`pack_q6k`]).
fn unpack_q6k(p: &[u8], r: usize, out: &mut [u8]) {
    use crate::blocks::BlockQ6K;
    let mut blk = BlockQ6K {
        ql: [0; 128],
        qh: [0; 64],
        scales: std::array::from_fn(|j| p[16 + 8 * j + r] as i8),
        d: [p[2 * r], p[2 * r + 1]],
    };
    for s in 0..8 {
        let sub = &p[144 + Q6K_SUB * s..][..Q6K_SUB];
        let (lo, hi) = (get_nibbles(&sub[..128], r), get_bits2(&sub[128..192], r));
        for l in 0..QK {
            // Value i of ggml's order (see `BlockQ6K::q`).
            let i = 32 * s + l;
            let (h, c, e) = (i / 128, (i % 128) / 32, i % 32);
            let q = lo[l] | hi[l];
            blk.ql[64 * h + 32 * (c % 2) + e] |= (q & 0x0F) << (4 * (c / 2));
            blk.qh[32 * h + e] |= (q >> 4) << (2 * c);
        }
    }
    blk.write(out);
}

/// Packs Q4_K or Q5_K rows (`w`).
fn pack_kq(w: GgmlType, k: usize, src: &[u8], dst: &mut [u8]) {
    use crate::blocks::{get_scale_min_k4, BlockQ4K, BlockQ5K};
    let (bb, ub, sub) = (block_bytes(w), unit_bytes(w), kq_sub_bytes(w));
    let nb = k / QK_K;
    let row_bytes = nb * bb;
    for (src_g, dst_g) in src
        .chunks_exact(ROWS * row_bytes)
        .zip(dst.chunks_exact_mut(nb * ub))
    {
        for (b, out) in dst_g.chunks_exact_mut(ub).enumerate() {
            for r in 0..ROWS {
                let raw = &src_g[r * row_bytes + b * bb..][..bb];
                // d, dmin and the 12 scale bytes lead both block types.
                out[2 * r..2 * r + 2].copy_from_slice(&raw[0..2]);
                out[16 + 2 * r..18 + 2 * r].copy_from_slice(&raw[2..4]);
                let scales: [u8; 12] = raw[4..16].try_into().expect("12 scale bytes");
                // The block's 256 values, decoded once.
                let values: [u8; 256] = if w == GgmlType::Q5K {
                    let b = BlockQ5K::read(raw);
                    std::array::from_fn(|i| b.q(i))
                } else {
                    let b = BlockQ4K::read(raw);
                    std::array::from_fn(|i| b.q(i))
                };
                for j in 0..8 {
                    let (sc, m) = get_scale_min_k4(j, &scales);
                    out[32 + 8 * j + r] = sc;
                    out[96 + 8 * j + r] = m;
                    let v: [u8; QK] = values[32 * j..32 * j + 32].try_into().expect("32 values");
                    let q = &mut out[160 + sub * j..][..sub];
                    put_nibbles(r, &v, &mut q[..128]);
                    if w == GgmlType::Q5K {
                        put_bits(r, &v, 4, &mut q[128..160]);
                    }
                }
            }
        }
    }
}

/// Bytes of one 32-value sub-block of a packed Q4_K (128) or Q5_K (160) unit.
fn kq_sub_bytes(w: GgmlType) -> usize {
    if w == GgmlType::Q5K {
        160
    } else {
        128
    }
}

/// The ggml Q4_K or Q5_K block of row `r` from a packed unit (the inverse of [`pack_kq`]).
fn unpack_kq(w: GgmlType, p: &[u8], r: usize, out: &mut [u8]) {
    out[0..2].copy_from_slice(&p[2 * r..2 * r + 2]);
    out[2..4].copy_from_slice(&p[16 + 2 * r..18 + 2 * r]);
    let sc = |j: usize| p[32 + 8 * j + r];
    let m = |j: usize| p[96 + 8 * j + r];
    // The 12 scale bytes (the inverse of `get_scale_min_k4`).
    let s = &mut out[4..16];
    for j in 0..4 {
        s[j] = sc(j) | ((sc(j + 4) >> 4) << 6);
        s[j + 4] = m(j) | ((m(j + 4) >> 4) << 6);
        s[j + 8] = (sc(j + 4) & 0x0F) | ((m(j + 4) & 0x0F) << 4);
    }
    let sub = kq_sub_bytes(w);
    // Q5_K: the fifth bits (`qh`, bit j of byte l for value 32 j + l) before the nibbles.
    let qs0 = if w == GgmlType::Q5K { 48 } else { 16 };
    out[16..qs0 + 128].fill(0);
    for j in 0..8 {
        let q = &p[160 + sub * j..][..sub];
        let v = get_nibbles(&q[..128], r);
        let h = if w == GgmlType::Q5K {
            get_bits(&q[128..160], r, 0)
        } else {
            [0; QK]
        };
        // ggml order: value 32 j + l in qs[32 (j / 2) + l], low nibbles for even j.
        for l in 0..QK {
            out[qs0 + 32 * (j / 2) + l] |= v[l] << (4 * (j % 2));
            out[16 + l] |= h[l] << j;
        }
    }
}

/// The ggml block `b` of row `r` (within its group) of packed block bytes `p`, written to `out`
/// (one ggml block of `w`). The inverse of [`pack`], block by block.
pub fn unpack_block(w: GgmlType, p: &[u8], r: usize, out: &mut [u8]) {
    let bb = block_bytes(w);
    let hb = header_bytes(w);
    assert!(
        p.len() == unit_bytes(w) && out.len() == bb && r < ROWS,
        "x8::unpack_block lengths"
    );
    match w {
        GgmlType::Q4K | GgmlType::Q5K => return unpack_kq(w, p, r, out),
        GgmlType::Q6K => return unpack_q6k(p, r, out),
        GgmlType::Mxfp4 => return unpack_mxfp4(p, r, out),
        _ => {}
    }
    out[0..2].copy_from_slice(&p[2 * r..2 * r + 2]);
    if hb == 32 {
        out[2..4].copy_from_slice(&p[16 + 2 * r..18 + 2 * r]);
    }
    let q = &p[hb..];
    match w {
        GgmlType::Q8_0 => {
            for e in 0..QK {
                let (c, j) = (e / 2, e % 2);
                out[2 + e] = q[16 * c + 2 * r + j];
            }
        }
        _ => {
            let v = get_nibbles(&q[..128], r);
            if has_high(w) {
                let h = get_bits(&q[128..160], r, 0);
                let qh: u32 = (0..QK).map(|j| (h[j] as u32) << j).sum();
                out[quant_offset(w) - 4..quant_offset(w)].copy_from_slice(&qh.to_le_bytes());
            }
            let o = &mut out[quant_offset(w)..];
            for (j, o) in o[..16].iter_mut().enumerate() {
                *o = v[j] | (v[j + 16] << 4);
            }
        }
    }
}

/// Row `row` of a packed `rows x k` matrix (`packed`, all of it) dequantised to `out` (`k`
/// values), exactly as [`crate::Kernels::dequantize_row`] dequantises the original row: for
/// lookups in tied embeddings that were packed for the output projection.
///
/// # Panics
/// On a length mismatch or a row outside the matrix.
pub fn dequantize_row(w: GgmlType, packed: &[u8], row: usize, out: &mut [f32]) {
    let k = out.len();
    let (uv, ub, bb) = (unit_values(w), unit_bytes(w), block_bytes(w));
    assert!(
        k.is_multiple_of(uv) && packed.len().is_multiple_of(packed_row_bytes(w, k) * ROWS),
        "x8::dequantize_row lengths"
    );
    let nb = k / uv;
    let group = &packed[row / ROWS * nb * ub..(row / ROWS + 1) * nb * ub];
    let mut blk = [0u8; 256];
    for (b, o) in out.chunks_exact_mut(uv).enumerate() {
        unpack_block(w, &group[b * ub..(b + 1) * ub], row % ROWS, &mut blk[..bb]);
        crate::Kernels::scalar().dequantize_row(w, &blk[..bb], o);
    }
}

/// Scalar reference: each packed block is unpacked to ggml blocks and multiplied exactly as
/// [`q16`]'s reference does, so the result equals the unpacked matmul's bit for bit.
fn matmul_ref<W: Q16Weight>(w: GgmlType, g: MatmulArgs<'_>) {
    matmul_unpacked(w, g, q16::q16_row_size, q16::dot_ref::<W>)
}

/// Each row of the packed matrix `g.w` unpacked to ggml's layout, then `dot(k, row, a_t)` with
/// each activation row (`arow(k)` bytes): the x8 scalar references (Q16 and A8 activations).
pub(crate) fn matmul_unpacked(
    w: GgmlType,
    g: MatmulArgs<'_>,
    arow: fn(usize) -> usize,
    dot: fn(usize, &[u8], &[u8]) -> f32,
) {
    let bb = block_bytes(w);
    let nb = g.k / unit_values(w);
    let ub = unit_bytes(w);
    let arow = arow(g.k);
    let mut row = vec![0u8; nb * bb];
    for r in 0..g.nrows {
        let (grp, ri) = (r / ROWS, r % ROWS);
        for b in 0..nb {
            let o = (grp * nb + b) * ub;
            unpack_block(w, &g.w[o..o + ub], ri, &mut row[b * bb..(b + 1) * bb]);
        }
        for t in 0..g.ntok {
            g.out[t * g.out_stride + r] = dot(g.k, &row, &g.a[t * arow..(t + 1) * arow]);
        }
    }
}

fn matmul_ref_q4_0(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W4_0>(GgmlType::Q4_0, g)
}
fn matmul_ref_q4_1(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W4_1>(GgmlType::Q4_1, g)
}
fn matmul_ref_q5_0(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W5_0>(GgmlType::Q5_0, g)
}
fn matmul_ref_q5_1(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W5_1>(GgmlType::Q5_1, g)
}
fn matmul_ref_q5k(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W5K>(GgmlType::Q5K, g)
}
fn matmul_ref_q6k(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W6K>(GgmlType::Q6K, g)
}
fn matmul_ref_q8_0(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W8_0>(GgmlType::Q8_0, g)
}
fn matmul_ref_q4k(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W4K>(GgmlType::Q4K, g)
}
fn matmul_ref_mxfp4(g: MatmulArgs<'_>) {
    matmul_ref::<q16::WMxfp4>(GgmlType::Mxfp4, g)
}

/// Defines a driver module's per-type table, `matmul_fn(w)`: the entry that runs the module's
/// `unsafe fn run::<P>` for the packed type `P` of `w` (the module has `P4_0` ... `P6K`,
/// `Packed`, `GgmlType`, `MatmulArgs` and `MatmulFn` in scope). Every instruction set's x8
/// driver defines its table with it, so the type list is written once.
macro_rules! packed_type_table {
    () => {
        /// The table entry for packed type `P`.
        fn entry<P: Packed>(mut g: MatmulArgs<'_>) {
            // SAFETY: entries are only reachable from the kernel table of this module's
            // instruction set, which exists only on hosts with its features, with lengths
            // checked by `Kernels::matmul_q16_x8`.
            unsafe { run::<P>(&mut g) }
        }

        pub(crate) fn matmul_fn(w: GgmlType) -> Option<MatmulFn> {
            Some(match w {
                GgmlType::Q4_0 => entry::<P4_0>,
                GgmlType::Q4_1 => entry::<P4_1>,
                GgmlType::Q5_0 => entry::<P5_0>,
                GgmlType::Q5_1 => entry::<P5_1>,
                GgmlType::Q8_0 => entry::<P8_0>,
                GgmlType::Q4K => entry::<P4K>,
                GgmlType::Q5K => entry::<P5K>,
                GgmlType::Q6K => entry::<P6K>,
                _ => return None,
            })
        }
    };
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) use packed_type_table;

/// Defines a driver module's A8 table, `matmul_a8_fn(w)`: the entry that runs the module's
/// `unsafe fn run_as::<P, true>` for the packed type `P` of `w` (the types with A8 kernels,
/// see `crate::a8::supports`; the module has them in scope, as for [`packed_type_table!`]).
/// Only the x86 drivers have A8 kernels.
#[cfg(target_arch = "x86_64")]
macro_rules! a8_type_table {
    () => {
        /// The A8 x8 matmul of this module's instruction set for weight type `w` (see
        /// `crate::a8`).
        pub(crate) fn matmul_a8_fn(w: GgmlType) -> Option<MatmulFn> {
            fn entry<P: Packed>(mut g: MatmulArgs<'_>) {
                // SAFETY: reachable only from the kernel table of this module's instruction
                // set, which exists only on hosts with its features, with lengths checked by
                // `Kernels::matmul_a8_x8`; P is one of the types below.
                unsafe { run_as::<P, true>(&mut g) }
            }
            Some(match w {
                GgmlType::Q4_0 => entry::<P4_0>,
                GgmlType::Q4_1 => entry::<P4_1>,
                GgmlType::Q5_0 => entry::<P5_0>,
                GgmlType::Q5_1 => entry::<P5_1>,
                GgmlType::Q4K => entry::<P4K>,
                GgmlType::Q5K => entry::<P5K>,
                GgmlType::Q6K => entry::<P6K>,
                GgmlType::Mxfp4 => entry::<PMxfp4>,
                _ => return None,
            })
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use a8_type_table;

/// The x8 matmul (Q16 activations) for weight type `w` on `isa`.
pub(crate) fn matmul_fn(isa: Isa, w: GgmlType) -> Option<MatmulFn> {
    // MXFP4 has AVX2, AVX-512 and NEON kernels (outside `packed_type_table!`); elsewhere the
    // scalar reference.
    #[cfg(target_arch = "x86_64")]
    if w == GgmlType::Mxfp4 {
        // Each table exists only when the host has the features of its kernels.
        match isa {
            Isa::Avx2 => return Some(crate::x86::x8::matmul_mxfp4),
            Isa::Avx512 => return Some(crate::x86::x8_512::plain::matmul_mxfp4),
            Isa::Avx512Vnni => return Some(crate::x86::x8_512::vnni::matmul_mxfp4),
            _ => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    if w == GgmlType::Mxfp4 && isa == Isa::Neon {
        // The NEON table exists only on aarch64 hosts with NEON.
        return Some(crate::arm::x8::matmul_mxfp4);
    }
    if w == GgmlType::Mxfp4 {
        return Some(matmul_ref_mxfp4);
    }
    #[cfg(target_arch = "x86_64")]
    match isa {
        // Each table exists only when the host has the features of its kernels.
        Isa::Avx2 => return crate::x86::x8::matmul_fn(w),
        Isa::Avx512 => return crate::x86::x8_512::plain::matmul_fn(w),
        Isa::Avx512Vnni => return crate::x86::x8_512::vnni::matmul_fn(w),
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // The NEON table exists only on aarch64 hosts with NEON.
        return crate::arm::x8::matmul_fn(w);
    }
    let _ = isa;
    match w {
        GgmlType::Q4_0 => Some(matmul_ref_q4_0),
        GgmlType::Q4_1 => Some(matmul_ref_q4_1),
        GgmlType::Q5_0 => Some(matmul_ref_q5_0),
        GgmlType::Q5_1 => Some(matmul_ref_q5_1),
        GgmlType::Q8_0 => Some(matmul_ref_q8_0),
        GgmlType::Q4K => Some(matmul_ref_q4k),
        GgmlType::Q5K => Some(matmul_ref_q5k),
        GgmlType::Q6K => Some(matmul_ref_q6k),
        _ => None,
    }
}
