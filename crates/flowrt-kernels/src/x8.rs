//! Weights repacked at load into groups of 8 interleaved rows ("x8" layouts), for matmuls with
//! Q16 activations (see [`crate::q16`]).
//!
//! In ggml's layouts each row is a run of blocks, so a SIMD dot product of one row with an
//! activation ends in a horizontal sum per row, and a few rows processed together read from a
//! few separate streams. In an x8 layout the same block of 8 consecutive rows is stored
//! together, interleaved so that one 32-bit lane of a vector holds one row: `vpmaddwd` of 8
//! rows' weight pairs with a broadcast activation pair gives 8 rows' partial sums at once, the
//! per-block scales of 8 rows are one vector, and a task's weights are one linear stream.
//! The packed bytes have exactly the size of the original rows (Q4_K: 32 bytes more per 8 rows
//! and 256 values, its scales decoded to bytes).
//!
//! A packed matrix is `rows / 8` groups; a group is the `k / 32` packed blocks of its 8 rows, in
//! order. One packed block (of 8 rows, 32 values each):
//!
//! | type | bytes | layout |
//! |---|---|---|
//! | Q4_0 | 144 | `d: [f16; 8]`, `q: [u8; 128]` |
//! | Q4_1 | 160 | `d: [f16; 8]`, `m: [f16; 8]`, `q: [u8; 128]` |
//! | Q8_0 | 272 | `d: [f16; 8]`, `q: [i8; 256]` |
//! | Q4_K | 1184 per 256 values | `d: [f16; 8]`, `dmin: [f16; 8]`, `sc: [[u8; 8]; 8]`, `m: [[u8; 8]; 8]` (sub-block, row: the 6-bit scales and mins decoded), then 8 sub-blocks of 32 values laid out as Q4_0's `q` |
//!
//! 4-bit `q`: 4 units of 32 bytes; unit `u` holds values `8u..8u+8` of all 8 rows as 16
//! little-endian 16-bit lanes. Lane `i` belongs to row `i / 2`; with `j = i % 2`, its low byte
//! holds values `8u + j` (low nibble) and `8u + 4 + j` (high nibble), its high byte values
//! `8u + 2 + j` and `8u + 6 + j`. Masking and shifting the lanes (bits 0..4, 8..12, 4..8,
//! 12..16) gives the 16-bit weight pairs `(8u, 8u+1)`, `(8u+2, 8u+3)`, `(8u+4, 8u+5)`,
//! `(8u+6, 8u+7)` of rows 0..8 in order, without widening instructions.
//! 8-bit `q`: 16 chunks of 16 bytes; chunk `c` holds values `2c, 2c+1`: byte `i` is row `i / 2`,
//! value `2c + i % 2`.

use flowrt_dtype::GgmlType;

use crate::blocks::QK;
use crate::q16::{self, Q16Weight};
use crate::{Isa, MatmulArgs, MatmulFn};

/// Rows per group.
pub const ROWS: usize = 8;

/// Weight types with an x8 layout.
pub fn supports(w: GgmlType) -> bool {
    matches!(
        w,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q4K
    )
}

/// Values per row in one packed unit: a ggml block (32, or 256 for Q4_K).
pub fn unit_values(w: GgmlType) -> usize {
    if w == GgmlType::Q4K {
        256
    } else {
        QK
    }
}

/// Bytes of one packed unit (8 rows x [`unit_values`]).
pub fn unit_bytes(w: GgmlType) -> usize {
    if w == GgmlType::Q4K {
        Q4K_UNIT
    } else {
        ROWS * block_bytes(w)
    }
}

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

/// Bytes of one ggml block of `w` (a supported type).
fn block_bytes(w: GgmlType) -> usize {
    match w {
        GgmlType::Q4_0 => 18,
        GgmlType::Q4_1 => 20,
        GgmlType::Q8_0 => 34,
        GgmlType::Q4K => 144,
        other => panic!("x8: {other} has no x8 layout"),
    }
}

/// Where the quants start in a ggml block of `w`: after `d` (and `m` for Q4_1).
fn quant_offset(w: GgmlType) -> usize {
    if w == GgmlType::Q4_1 {
        4
    } else {
        2
    }
}

/// Bytes of a header (8 rows' scales) in a packed block.
fn header_bytes(w: GgmlType) -> usize {
    if w == GgmlType::Q4_1 {
        32
    } else {
        16
    }
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
    if w == GgmlType::Q4K {
        return pack_q4k(rows, k, src, dst);
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
                if w == GgmlType::Q4_1 {
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
            let q: &mut [u8; 128] = (&mut q[..128]).try_into().expect("128 quant bytes");
            for (r, s) in blk.iter().enumerate() {
                let s: &[u8; 16] = s[qo..qo + 16].try_into().expect("16 nibble bytes");
                pack_q4_row(r, s, q);
            }
        }
    }
}

fn pack_q4k(rows: usize, k: usize, src: &[u8], dst: &mut [u8]) {
    use crate::blocks::{get_scale_min_k4, BlockQ4K};
    let nb = k / 256;
    let row_bytes = nb * 144;
    for (src_g, dst_g) in src
        .chunks_exact(ROWS * row_bytes)
        .zip(dst.chunks_exact_mut(nb * Q4K_UNIT))
    {
        let _ = rows;
        for (b, out) in dst_g.chunks_exact_mut(Q4K_UNIT).enumerate() {
            for r in 0..ROWS {
                let blk = BlockQ4K::read(&src_g[r * row_bytes + b * 144..][..144]);
                out[2 * r..2 * r + 2].copy_from_slice(&blk.d);
                out[16 + 2 * r..18 + 2 * r].copy_from_slice(&blk.dmin);
                for j in 0..8 {
                    let (sc, m) = get_scale_min_k4(j, &blk.scales);
                    out[32 + 8 * j + r] = sc;
                    out[96 + 8 * j + r] = m;
                    // Sub-block j's 32 values in the 32-value nibble order pack_q4_row takes.
                    let mut s16 = [0u8; 16];
                    for (e, byte) in s16.iter_mut().enumerate() {
                        *byte = blk.q(32 * j + e) | (blk.q(32 * j + e + 16) << 4);
                    }
                    let q: &mut [u8; 128] = (&mut out[160 + 128 * j..][..128])
                        .try_into()
                        .expect("128 quant bytes");
                    pack_q4_row(r, &s16, q);
                }
            }
        }
    }
}

/// The ggml Q4_K block of row `r` from a packed unit (the inverse of [`pack_q4k`]).
fn unpack_q4k(p: &[u8], r: usize, out: &mut [u8]) {
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
    let mut v = [0u8; 256];
    for j in 0..8 {
        let mut sub = [0u8; 20];
        unpack_block(
            GgmlType::Q4_0,
            &q4_0_view(&p[160 + 128 * j..][..128]),
            r,
            &mut sub[..18],
        );
        for e in 0..16 {
            v[32 * j + e] = sub[2 + e] & 0x0F;
            v[32 * j + e + 16] = sub[2 + e] >> 4;
        }
    }
    // ggml order: 64-value chunk c in qs[32c..32c+32], low nibbles first.
    for c in 0..4 {
        for l in 0..32 {
            out[16 + 32 * c + l] = v[64 * c + l] | (v[64 * c + 32 + l] << 4);
        }
    }
}

/// A packed Q4_0 unit with zero scales around 128 quant bytes (to reuse its unpacking).
fn q4_0_view(q: &[u8]) -> [u8; 144] {
    let mut p = [0u8; 144];
    p[16..].copy_from_slice(q);
    p
}

/// Row `r`'s 32 nibbles (ggml order: value `e < 16` in the low nibble of byte `e`, value
/// `e >= 16` in the high nibble of byte `e - 16`) into their places of a packed 4-bit block.
#[inline]
fn pack_q4_row(r: usize, s: &[u8; 16], q: &mut [u8; 128]) {
    let nib = |e: usize| {
        if e < 16 {
            s[e] & 0x0F
        } else {
            s[e - 16] >> 4
        }
    };
    for u in 0..QK / 8 {
        for j in 0..2 {
            let e = 8 * u + j;
            let o = 32 * u + 2 * (2 * r + j);
            q[o] = nib(e) | (nib(e + 4) << 4);
            q[o + 1] = nib(e + 2) | (nib(e + 6) << 4);
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
    if w == GgmlType::Q4K {
        return unpack_q4k(p, r, out);
    }
    out[0..2].copy_from_slice(&p[2 * r..2 * r + 2]);
    if w == GgmlType::Q4_1 {
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
            let nib = |e: usize| {
                let (u, m) = (e / 8, e % 8);
                let (high, m) = (m >= 4, m % 4);
                let byte = q[32 * u + 2 * (2 * r + m % 2) + m / 2];
                if high {
                    byte >> 4
                } else {
                    byte & 0x0F
                }
            };
            let o = &mut out[quant_offset(w)..];
            for (j, o) in o[..16].iter_mut().enumerate() {
                *o = nib(j) | (nib(j + 16) << 4);
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
    let bb = W::BYTES;
    let nb = g.k / unit_values(w);
    let ub = unit_bytes(w);
    let arow = q16::q16_row_size(g.k);
    let mut row = vec![0u8; nb * bb];
    for r in 0..g.nrows {
        let (grp, ri) = (r / ROWS, r % ROWS);
        for b in 0..nb {
            let o = (grp * nb + b) * ub;
            unpack_block(w, &g.w[o..o + ub], ri, &mut row[b * bb..(b + 1) * bb]);
        }
        for t in 0..g.ntok {
            g.out[t * g.out_stride + r] =
                q16::dot_ref::<W>(g.k, &row, &g.a[t * arow..(t + 1) * arow]);
        }
    }
}

fn matmul_ref_q4_0(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W4_0>(GgmlType::Q4_0, g)
}
fn matmul_ref_q4_1(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W4_1>(GgmlType::Q4_1, g)
}
fn matmul_ref_q8_0(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W8_0>(GgmlType::Q8_0, g)
}
fn matmul_ref_q4k(g: MatmulArgs<'_>) {
    matmul_ref::<q16::W4K>(GgmlType::Q4K, g)
}

/// The x8 matmul (Q16 activations) for weight type `w` on `isa`.
pub(crate) fn matmul_fn(isa: Isa, w: GgmlType) -> Option<MatmulFn> {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni) {
        // The table for `isa` exists only when the host has AVX2, FMA and F16C.
        return crate::x86::x8::matmul_fn(w);
    }
    let _ = isa;
    match w {
        GgmlType::Q4_0 => Some(matmul_ref_q4_0),
        GgmlType::Q4_1 => Some(matmul_ref_q4_1),
        GgmlType::Q8_0 => Some(matmul_ref_q8_0),
        GgmlType::Q4K => Some(matmul_ref_q4k),
        _ => None,
    }
}
