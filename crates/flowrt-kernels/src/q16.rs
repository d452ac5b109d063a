//! Q16 activations: rows quantised to 16-bit integers in blocks of 32, for matmuls with
//! Q4_0, Q4_1 and Q8_0 weights.
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
//! Sums of products fit in i32: `|q_w| <= 128`, `|q_a| <= 32767`, 32 per block.

use flowrt_dtype::GgmlType;

use crate::blocks::{f16_to_f32, QK};
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
    matches!(w, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Scalar reference: quantise one row.
pub fn quantize_row_ref(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(Q16_BLOCK_BYTES))
    {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 32767.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (j, &v) in xb.iter().enumerate() {
            let q = (v * id).round().clamp(-32767.0, 32767.0) as i16;
            sum += q as i32;
            ob[8 + 2 * j..10 + 2 * j].copy_from_slice(&q.to_le_bytes());
        }
        ob[0..4].copy_from_slice(&d.to_le_bytes());
        ob[4..8].copy_from_slice(&(d * sum as f32).to_le_bytes());
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
    const BYTES: usize;
    /// `(d, offset_coefficient)`: the block's value is `d * q_int + c * s_act` summed, where
    /// `c` is `-8 d` (Q4_0), `m` (Q4_1) or 0 (Q8_0).
    fn scales(b: &[u8]) -> (f32, f32);
    /// The block's 32 integer values.
    fn ints(b: &[u8], out: &mut [i32; QK]);
}

pub(crate) struct W4_0;
pub(crate) struct W4_1;
pub(crate) struct W8_0;

impl Q16Weight for W4_0 {
    const BYTES: usize = 18;
    fn scales(b: &[u8]) -> (f32, f32) {
        let d = f16_to_f32([b[0], b[1]]);
        (d, -8.0 * d)
    }
    fn ints(b: &[u8], out: &mut [i32; QK]) {
        for j in 0..16 {
            out[j] = (b[2 + j] & 0x0F) as i32;
            out[j + 16] = (b[2 + j] >> 4) as i32;
        }
    }
}

impl Q16Weight for W4_1 {
    const BYTES: usize = 20;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_to_f32([b[0], b[1]]), f16_to_f32([b[2], b[3]]))
    }
    fn ints(b: &[u8], out: &mut [i32; QK]) {
        for j in 0..16 {
            out[j] = (b[4 + j] & 0x0F) as i32;
            out[j + 16] = (b[4 + j] >> 4) as i32;
        }
    }
}

impl Q16Weight for W8_0 {
    const BYTES: usize = 34;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_to_f32([b[0], b[1]]), 0.0)
    }
    fn ints(b: &[u8], out: &mut [i32; QK]) {
        for j in 0..QK {
            out[j] = b[2 + j] as i8 as i32;
        }
    }
}

/// Scalar reference dot of one weight row with one Q16 activation row.
pub(crate) fn dot_ref<W: Q16Weight>(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut wi = [0i32; QK];
    let mut sum = 0.0f32;
    for b in 0..k / QK {
        let wb = &w[b * W::BYTES..(b + 1) * W::BYTES];
        W::ints(wb, &mut wi);
        let (dw, cw) = W::scales(wb);
        let (da, sa) = act_ds(a, b);
        let ab = &a[b * Q16_BLOCK_BYTES + 8..(b + 1) * Q16_BLOCK_BYTES];
        let isum: i32 = wi
            .iter()
            .zip(ab.chunks_exact(2))
            .map(|(&x, q)| x * i16::from_le_bytes([q[0], q[1]]) as i32)
            .sum();
        sum += dw * da * isum as f32 + cw * sa;
    }
    sum
}

fn matmul_ref<W: Q16Weight>(g: MatmulArgs<'_>) {
    let wrow = g.k / QK * W::BYTES;
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
        // The table for `isa` exists only when the host has AVX2, FMA and F16C.
        return crate::x86::q16::matmul_fn(w);
    }
    let _ = isa;
    match w {
        GgmlType::Q4_0 => Some(matmul_ref::<W4_0>),
        GgmlType::Q4_1 => Some(matmul_ref::<W4_1>),
        GgmlType::Q8_0 => Some(matmul_ref::<W8_0>),
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
