//! Q16 activations: rows quantised to 16-bit integers in blocks of 32, for matmuls with
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and MXFP4 weights. A k-quant super-block of 256
//! values meets 8 activation blocks: each lines up with one Q4_K/Q5_K sub-block (one scale,
//! one min) or with two 16-value Q6_K sub-blocks (two scales).
//!
//! 8-bit activations (Q8_0/Q8_1, ggml's choice) lose enough precision that a small model's
//! next-token distribution drifts measurably from the reference implementation (on SmolLM2-135M
//! Q4_1: 96.7 % top-1 agreement, mean KL 3.4e-3, simulated with transformers). 16-bit
//! activations make the activation rounding negligible (the same simulation: 100 %, 4.5e-6),
//! and on AVX2 they cost about what 8-bit ones do: `vpmaddwd` multiplies 16-bit pairs
//! directly, where the 8-bit path needs `vpmaddubsw` followed by `vpmaddwd` anyway.
//!
//! Block layout (72 bytes, little-endian): `d: f32` (scale, `amax / 32767`), `s: f32`
//! (`d * sum(q)`, for the weight types' offsets), `q: [i16; 32]`.
//! Sums of products fit in i32 for the 32-value types (`|q_w| <= 128`, `|q_a| <= 32767`, 32
//! per block); Q6_K's integers times their sub-block scale reach 4096, so the scalar reference
//! sums in i64 and the SIMD kernels keep at most 4 products per i32 lane.

use flowrt_dtype::GgmlType;

use crate::blocks::{
    f16_to_f32, get_scale_min_k4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, QK,
};
use crate::{Isa, MatmulArgs, MatmulFn};

/// Bytes of one Q16 block.
pub const Q16_BLOCK_BYTES: usize = 72;

/// Bytes of a Q16 row of `k` values (`k` a multiple of 32).
///
/// # Panics
/// If `k` is not a multiple of 32 (a programmer error: weight rows of the supported types are
/// whole blocks).
pub fn q16_row_size(k: usize) -> usize {
    assert!(
        k.is_multiple_of(QK),
        "q16 rows hold whole 32-value blocks, got {k}"
    );
    k / QK * Q16_BLOCK_BYTES
}

/// Weight types with a Q16-activation matmul.
pub fn supports(w: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        w,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q5K | Q6K | Mxfp4
    )
}

/// Scalar reference: quantise one row.
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(Q16_BLOCK_BYTES))
    {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        quantize_block_ref(xb, amax / 32767.0, ob);
    }
}

/// One block with scale `d = amax / 32767`: `q = round(x * (1/d))`, ties away from zero.
///
/// Where `1/d` overflows f32 (`amax` below about 1e-34), `x` and `d` are both scaled by 2^64
/// first (exactly), so `q` still approximates `x / d` instead of becoming `±inf` (or NaN for a
/// zero). The SIMD quantisers hand such blocks to this function.
pub(crate) fn quantize_block_ref(xb: &[f32], d: f32, ob: &mut [u8]) {
    let (pre, id) = prescaled_inverse(d);
    let mut sum = 0i32;
    for (j, &v) in xb.iter().enumerate() {
        let q = (v * pre * id).round().clamp(-32767.0, 32767.0) as i16;
        sum += q as i32;
        ob[8 + 2 * j..10 + 2 * j].copy_from_slice(&q.to_le_bytes());
    }
    ob[0..4].copy_from_slice(&d.to_le_bytes());
    ob[4..8].copy_from_slice(&(d * sum as f32).to_le_bytes());
}

/// `(pre, id)` such that `x * pre * id` is `x / d`: `(1, 1/d)`, `(1, 0)` for `d = 0`, and
/// where `1/d` overflows f32 (`d` below about 3e-39) `(2^64, 1 / (d 2^64))`, exact scalings
/// that keep the quotient finite. Shared by the activation quantisers' references.
pub(crate) fn prescaled_inverse(d: f32) -> (f32, f32) {
    if d == 0.0 {
        (1.0, 0.0)
    } else if (1.0 / d).is_finite() {
        (1.0, 1.0 / d)
    } else {
        const TWO_64: f32 = 18_446_744_073_709_551_616.0; // 2^64
        (TWO_64, 1.0 / (d * TWO_64))
    }
}

/// `(d, s)` of activation block `b` of a Q16 row.
#[inline]
pub(crate) fn act_ds(a: &[u8], b: usize) -> (f32, f32) {
    let o = b * Q16_BLOCK_BYTES;
    (
        f32::from_le_bytes([a[o], a[o + 1], a[o + 2], a[o + 3]]),
        f32::from_le_bytes([a[o + 4], a[o + 5], a[o + 6], a[o + 7]]),
    )
}

/// Weight block geometry and decoding, per type.
pub(crate) trait Q16Weight {
    /// Bytes of one weight block.
    const BYTES: usize;
    /// 32-value sub-blocks (one Q16 activation block each) per weight block: 1, or 8 for the
    /// 256-value k-quants.
    const SUBS: usize;
    /// Sub-block `j` of the weight block `b`: its 32 integers into `out`, and `(d, c)` such
    /// that its dot with an activation block `(d_a, s_a, q_a)` is
    /// `d * d_a * sum(ints * q_a) + c * s_a`. `c` is `-8 d` (Q4_0), `-16 d` (Q5_0), `m`
    /// (Q4_1, Q5_1), `-dmin m_j` (Q4_K, Q5_K) or 0 (Q8_0, Q6_K; Q6_K's integers are
    /// `(q - 32)` times their 16-value sub-block's scale, `d` the super-block's).
    fn sub(b: &[u8], j: usize, out: &mut [i32; QK]) -> (f32, f32);
}

pub(crate) struct W4_0;
pub(crate) struct W4_1;
pub(crate) struct W5_0;
pub(crate) struct W5_1;
pub(crate) struct W8_0;
pub(crate) struct W4K;
pub(crate) struct W5K;
pub(crate) struct W6K;
pub(crate) struct WMxfp4;

impl Q16Weight for WMxfp4 {
    const BYTES: usize = crate::blocks::MXFP4_BLOCK_BYTES;
    const SUBS: usize = 1;
    /// The doubled E2M1 values (-12..=12) and the halved E8M0 scale: the block's dot is
    /// `2^(e - 128) d_a sum(k_j q_a)`, no offset term.
    fn sub(b: &[u8], _: usize, out: &mut [i32; QK]) -> (f32, f32) {
        use crate::blocks::{mxfp4_code, mxfp4_half_scale, MXFP4_KVALUES};
        for (j, o) in out.iter_mut().enumerate() {
            *o = MXFP4_KVALUES[mxfp4_code(&b[1..], j) as usize] as i32;
        }
        (mxfp4_half_scale(b[0]), 0.0)
    }
}

impl Q16Weight for W4_0 {
    const BYTES: usize = GgmlType::Q4_0.type_size() as usize;
    const SUBS: usize = 1;
    fn sub(b: &[u8], _: usize, out: &mut [i32; QK]) -> (f32, f32) {
        let blk = BlockQ4_0::read(b);
        for (j, o) in out.iter_mut().enumerate() {
            *o = blk.q(j) as i32;
        }
        let d = f16_to_f32(blk.d);
        (d, -8.0 * d)
    }
}

impl Q16Weight for W4_1 {
    const BYTES: usize = GgmlType::Q4_1.type_size() as usize;
    const SUBS: usize = 1;
    fn sub(b: &[u8], _: usize, out: &mut [i32; QK]) -> (f32, f32) {
        let blk = BlockQ4_1::read(b);
        for (j, o) in out.iter_mut().enumerate() {
            *o = blk.q(j) as i32;
        }
        (f16_to_f32(blk.d), f16_to_f32(blk.m))
    }
}

impl Q16Weight for W5_0 {
    const BYTES: usize = GgmlType::Q5_0.type_size() as usize;
    const SUBS: usize = 1;
    fn sub(b: &[u8], _: usize, out: &mut [i32; QK]) -> (f32, f32) {
        let blk = BlockQ5_0::read(b);
        for (j, o) in out.iter_mut().enumerate() {
            *o = blk.q(j) as i32;
        }
        let d = f16_to_f32(blk.d);
        (d, -16.0 * d)
    }
}

impl Q16Weight for W5_1 {
    const BYTES: usize = GgmlType::Q5_1.type_size() as usize;
    const SUBS: usize = 1;
    fn sub(b: &[u8], _: usize, out: &mut [i32; QK]) -> (f32, f32) {
        let blk = BlockQ5_1::read(b);
        for (j, o) in out.iter_mut().enumerate() {
            *o = blk.q(j) as i32;
        }
        (f16_to_f32(blk.d), f16_to_f32(blk.m))
    }
}

impl Q16Weight for W8_0 {
    const BYTES: usize = GgmlType::Q8_0.type_size() as usize;
    const SUBS: usize = 1;
    fn sub(b: &[u8], _: usize, out: &mut [i32; QK]) -> (f32, f32) {
        for j in 0..QK {
            out[j] = b[2 + j] as i8 as i32;
        }
        (f16_to_f32([b[0], b[1]]), 0.0)
    }
}

impl Q16Weight for W4K {
    const BYTES: usize = GgmlType::Q4K.type_size() as usize;
    const SUBS: usize = 8;
    fn sub(b: &[u8], j: usize, out: &mut [i32; QK]) -> (f32, f32) {
        let blk = BlockQ4K::read(b);
        for (l, o) in out.iter_mut().enumerate() {
            *o = blk.q(32 * j + l) as i32;
        }
        let (sc, m) = get_scale_min_k4(j, &blk.scales);
        (
            f16_to_f32(blk.d) * sc as f32,
            -(f16_to_f32(blk.dmin) * m as f32),
        )
    }
}

impl Q16Weight for W5K {
    const BYTES: usize = GgmlType::Q5K.type_size() as usize;
    const SUBS: usize = 8;
    fn sub(b: &[u8], j: usize, out: &mut [i32; QK]) -> (f32, f32) {
        let blk = BlockQ5K::read(b);
        for (l, o) in out.iter_mut().enumerate() {
            *o = blk.q(32 * j + l) as i32;
        }
        let (sc, m) = get_scale_min_k4(j, &blk.scales);
        (
            f16_to_f32(blk.d) * sc as f32,
            -(f16_to_f32(blk.dmin) * m as f32),
        )
    }
}

impl Q16Weight for W6K {
    const BYTES: usize = GgmlType::Q6K.type_size() as usize;
    const SUBS: usize = 8;
    fn sub(b: &[u8], j: usize, out: &mut [i32; QK]) -> (f32, f32) {
        let blk = BlockQ6K::read(b);
        for (l, o) in out.iter_mut().enumerate() {
            let i = 32 * j + l;
            *o = blk.q(i) as i32 * blk.scales[i / 16] as i32;
        }
        (f16_to_f32(blk.d), 0.0)
    }
}

/// Scalar reference dot of one weight row with one Q16 activation row. Integer sums are exact
/// (i64: Q6_K's scaled integers reach 4096 in magnitude), scaled once per 32-value block.
pub(crate) fn dot_ref<W: Q16Weight>(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut wi = [0i32; QK];
    let mut sum = 0.0f32;
    for b in 0..k / QK {
        let wb = &w[b / W::SUBS * W::BYTES..(b / W::SUBS + 1) * W::BYTES];
        let (dw, cw) = W::sub(wb, b % W::SUBS, &mut wi);
        let (da, sa) = act_ds(a, b);
        let ab = &a[b * Q16_BLOCK_BYTES + 8..(b + 1) * Q16_BLOCK_BYTES];
        let isum: i64 = wi
            .iter()
            .zip(ab.chunks_exact(2))
            .map(|(&x, q)| x as i64 * i16::from_le_bytes([q[0], q[1]]) as i64)
            .sum();
        sum += dw * da * isum as f32 + cw * sa;
    }
    sum
}

fn matmul_ref<W: Q16Weight>(g: MatmulArgs<'_>) {
    let wrow = g.k / (QK * W::SUBS) * W::BYTES;
    let arow = q16_row_size(g.k);
    for t in 0..g.ntok {
        let a = &g.a[t * arow..(t + 1) * arow];
        for r in 0..g.nrows {
            g.out[t * g.out_stride + r] = dot_ref::<W>(g.k, &g.w[r * wrow..(r + 1) * wrow], a);
        }
    }
}

/// The Q16 matmul for weight type `w` on `isa` (scalar where no SIMD version exists).
pub(crate) fn matmul_fn(isa: Isa, w: GgmlType) -> Option<MatmulFn> {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni) {
        // The table for `isa` exists only when the host has AVX2, FMA and F16C. (MXFP4 rows
        // are what the x8 repack does not cover: experts the loader owns, such as those
        // repacked from OpenAI's MXFP4 safetensors.)
        return crate::x86::q16::matmul_fn(w);
    }
    let _ = isa;
    match w {
        GgmlType::Q4_0 => Some(matmul_ref::<W4_0>),
        GgmlType::Q4_1 => Some(matmul_ref::<W4_1>),
        GgmlType::Q8_0 => Some(matmul_ref::<W8_0>),
        GgmlType::Q5_0 => Some(matmul_ref::<W5_0>),
        GgmlType::Q5_1 => Some(matmul_ref::<W5_1>),
        GgmlType::Q4K => Some(matmul_ref::<W4K>),
        GgmlType::Q5K => Some(matmul_ref::<W5K>),
        GgmlType::Q6K => Some(matmul_ref::<W6K>),
        GgmlType::Mxfp4 => Some(matmul_ref::<WMxfp4>),
        _ => None,
    }
}

/// The Q16 row quantiser on `isa`.
pub(crate) fn quantize_fn(isa: Isa) -> fn(&[f32], &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni) {
        return crate::x86::q16::quantize_row;
    }
    let _ = isa;
    quantize_row_ref
}
