//! A8 activations: rows quantised to 8-bit integers in blocks of 32, for matmuls with weights
//! in the [`crate::x8`] layouts of the 4-, 5- and 6-bit types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
//! Q5_K, Q6_K, MXFP4). An opt-in alternative to [`crate::q16`] (the CPU backend's
//! `act-quant=q8x`).
//!
//! Q16 keeps the activation rounding negligible, and its AVX2 kernels are bound by
//! `vpmaddwd` + `vpaddd`: two instructions per 16 products. With 8-bit activations the
//! unsigned 4- to 6-bit weights meet the signed activations in `vpmaddubsw` (32 products
//! into 16-bit pairs per instruction), several of which add up in 16 bits before one
//! `vpmaddwd` by ones widens a block's sums: about half the integer instructions per product.
//! The price is ggml's precision class: an activation block keeps 8 bits, as llama.cpp's
//! Q8_0 activations do.
//!
//! Block layout (40 bytes, little-endian): `d: f32` (`amax / 127`), `sum: i32` (`sum(q)`, for
//! the weight types' offsets: integer ones such as Q4_0's `-8` are added to the integer block
//! sums, float ones such as Q4_1's `m` multiply `s = d * sum`), `q: [i8; 32]`, each run of 8 values stored in the order
//! [`PERM`] (values 0, 2, 1, 3, 4, 6, 5, 7 of the run): the byte order in which a masked
//! 32-bit lane of an x8 4-bit unit holds one row's values (see [`crate::x8`]), so a broadcast
//! of 4 activation bytes lines up with 4 weights of every row. `q = round(x / d)`, ties away
//! from zero, in -127..=127.
//!
//! Integer block sums are exact: with weights below 32 (unsigned, the offsets applied through
//! `sum`) a 16-bit lane sums at most 16 products of at most `31 * 127`; Q6_K's (below 64, the
//! `-32` of each 16-value half applied through the half's sum, which the kernel adds up from
//! the quants) at most 4 of `63 * 127`. MXFP4's codes index the
//! doubled E2M1 values plus 12 (0..=24), with `-12` as its integer offset.

use flowrt_dtype::GgmlType;

use crate::blocks::QK;
use crate::q16::{self, Q16Weight};
use crate::{Isa, MatmulArgs, MatmulFn};

/// Bytes of one A8 block.
pub const A8_BLOCK_BYTES: usize = 40;

/// Where the 8 values of a run are stored: position `p` of a run holds value `PERM[p]` (its
/// own inverse).
pub const PERM: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// Bytes of an A8 row of `k` values (`k` a multiple of 32).
///
/// # Panics
/// If `k` is not a multiple of 32 (a programmer error: weight rows of the supported types are
/// whole blocks).
pub fn a8_row_size(k: usize) -> usize {
    assert!(
        k.is_multiple_of(QK),
        "a8 rows hold whole 32-value blocks, got {k}"
    );
    k / QK * A8_BLOCK_BYTES
}

/// Weight types with an A8 matmul on their x8 layout.
pub fn supports(w: GgmlType) -> bool {
    use GgmlType::*;
    matches!(w, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4K | Q5K | Q6K | Mxfp4)
}

/// Scalar reference: quantise one row.
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(A8_BLOCK_BYTES)) {
        quantize_block_ref(xb, ob);
    }
}

/// One block: `d = amax / 127`, `q = round(x * (1/d))`, ties away from zero.
///
/// Where `1/d` overflows f32 (`amax` below about 1e-36), `x` and `d` are both scaled by 2^64
/// first (exactly), as in [`q16`]. The SIMD quantisers hand such blocks to this function.
pub(crate) fn quantize_block_ref(xb: &[f32], ob: &mut [u8]) {
    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let (pre, id) = q16::prescaled_inverse(d);
    let mut sum = 0i32;
    for (j, &v) in xb.iter().enumerate() {
        let q = (v * pre * id).round().clamp(-127.0, 127.0) as i8;
        sum += q as i32;
        ob[8 + position(j)] = q as u8;
    }
    ob[0..4].copy_from_slice(&d.to_le_bytes());
    ob[4..8].copy_from_slice(&sum.to_le_bytes());
}

/// Where value `j` of a block is stored among its 32 quants.
#[inline]
pub fn position(j: usize) -> usize {
    j / 8 * 8 + PERM[j % 8]
}

/// Value `j` of the A8 block `b` of row `a`.
#[inline]
fn value(a: &[u8], b: usize, j: usize) -> i32 {
    a[b * A8_BLOCK_BYTES + 8 + position(j)] as i8 as i32
}

/// `(d, sum)` of block `b` of an A8 row.
#[inline]
pub fn block_scale_sum(a: &[u8], b: usize) -> (f32, i32) {
    let o = b * A8_BLOCK_BYTES;
    (
        f32::from_le_bytes([a[o], a[o + 1], a[o + 2], a[o + 3]]),
        i32::from_le_bytes([a[o + 4], a[o + 5], a[o + 6], a[o + 7]]),
    )
}

/// The 32 values of block `b` of an A8 row, in value order (for tests and the reference).
pub fn block_values(a: &[u8], b: usize) -> [i8; QK] {
    std::array::from_fn(|j| value(a, b, j) as i8)
}

/// Scalar reference dot of one weight row (ggml's layout) with one A8 activation row: exact
/// integer sums, scaled once per 32-value block, as [`q16`]'s reference.
fn dot_ref<W: Q16Weight>(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut wi = [0i32; QK];
    let mut sum = 0.0f32;
    for b in 0..k / QK {
        let wb = &w[b / W::SUBS * W::BYTES..(b / W::SUBS + 1) * W::BYTES];
        let (dw, cw) = W::sub(wb, b % W::SUBS, &mut wi);
        let (da, asum) = block_scale_sum(a, b);
        let isum: i64 = (0..QK).map(|j| wi[j] as i64 * value(a, b, j) as i64).sum();
        sum += dw * da * isum as f32 + cw * (da * asum as f32);
    }
    sum
}

/// Scalar reference on x8-packed weights: each packed block is unpacked to ggml blocks and
/// multiplied by [`dot_ref`].
fn matmul_ref<W: Q16Weight>(w: GgmlType, g: MatmulArgs<'_>) {
    crate::x8::matmul_unpacked(w, g, a8_row_size, dot_ref::<W>)
}

/// The scalar reference A8 matmul on x8-packed weights of type `w` (what the SIMD kernels are
/// tested against; also the kernel of tables without one).
pub(crate) fn matmul_ref_fn(w: GgmlType) -> Option<MatmulFn> {
    Some(match w {
        GgmlType::Q4_0 => |g| matmul_ref::<q16::W4_0>(GgmlType::Q4_0, g),
        GgmlType::Q4_1 => |g| matmul_ref::<q16::W4_1>(GgmlType::Q4_1, g),
        GgmlType::Q5_0 => |g| matmul_ref::<q16::W5_0>(GgmlType::Q5_0, g),
        GgmlType::Q5_1 => |g| matmul_ref::<q16::W5_1>(GgmlType::Q5_1, g),
        GgmlType::Q4K => |g| matmul_ref::<q16::W4K>(GgmlType::Q4K, g),
        GgmlType::Q5K => |g| matmul_ref::<q16::W5K>(GgmlType::Q5K, g),
        GgmlType::Q6K => |g| matmul_ref::<q16::W6K>(GgmlType::Q6K, g),
        GgmlType::Mxfp4 => |g| matmul_ref::<q16::WMxfp4>(GgmlType::Mxfp4, g),
        _ => return None,
    })
}

/// The A8 x8 matmul for weight type `w` on `isa`: the AVX2 kernels on the AVX2 table, 512-bit
/// ones (`vpdpbusd` with VNNI) on the AVX-512 tables, the scalar reference elsewhere.
pub(crate) fn matmul_fn(isa: Isa, w: GgmlType) -> Option<MatmulFn> {
    if !supports(w) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    match isa {
        // Each x86 table exists only when the host has its features.
        Isa::Avx2 => return crate::x86::x8::matmul_a8_fn(w),
        Isa::Avx512 => return crate::x86::x8_512::plain::matmul_a8_fn(w),
        Isa::Avx512Vnni => return crate::x86::x8_512::vnni::matmul_a8_fn(w),
        _ => {}
    }
    let _ = isa;
    matmul_ref_fn(w)
}

/// Whether `isa` has SIMD A8 kernels (elsewhere they are the scalar reference: correct, slow).
pub(crate) fn has_simd(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni)
}

/// The A8 row quantiser on `isa`.
pub(crate) fn quantize_fn(isa: Isa) -> fn(&[f32], &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni) {
        return crate::x86::avx2::quantize_row_a8;
    }
    let _ = isa;
    quantize_row_ref
}
