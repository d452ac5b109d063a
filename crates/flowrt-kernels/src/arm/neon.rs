//! NEON kernels: the quantised dot products and the f32 dot/axpy, written to mirror the scalar
//! reference step by step. Integer block sums are exact (i16 pair sums cannot overflow because
//! activation values lie in -127..=127) and the float operations are the scalar code's, in the
//! same order, so results equal the scalar table's. Matmul is the plain loop over these dots.
//!
//! Q5_0, Q5_1 and the k-quants use the scalar reference here for the ggml-style dots and for
//! Q16 matmuls on row-layout weights; the default path (weights repacked to x8) has NEON
//! kernels for every type in `x8.rs`, and the attention kernels over the f16 KV cache are in
//! `attn.rs`.
//!
//! Tested under `qemu-aarch64` on the x86-64 development machine (`scripts/test-aarch64`);
//! not timed on ARM hardware.

use super::arch::*;

use crate::blocks::{f16_to_f32, BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1};
use crate::scalar::dot::matmul_with;
use crate::{slot, Kernels, MatmulArgs};
use flowrt_dtype::GgmlType;

pub(super) fn build() -> Kernels {
    let mut t = crate::scalar::table();
    t.isa = crate::Isa::Neon;
    let s = |ty| slot(ty).expect("slot");
    t.types[s(GgmlType::Q4_0)].vec_dot = Some(vec_dot_q4_0_q8_0);
    t.types[s(GgmlType::Q4_0)].matmul = Some(matmul_q4_0);
    t.types[s(GgmlType::Q4_1)].vec_dot = Some(vec_dot_q4_1_q8_1);
    t.types[s(GgmlType::Q4_1)].matmul = Some(matmul_q4_1);
    t.types[s(GgmlType::Q8_0)].vec_dot = Some(vec_dot_q8_0_q8_0);
    t.types[s(GgmlType::Q8_0)].matmul = Some(matmul_q8_0);
    t.elem.dot_f32 = dot_f32;
    t.elem.axpy_f32 = axpy_f32;
    t.elem.dot_f32_f16 = super::attn::dot_f32_f16;
    t.elem.axpy_f16 = super::attn::axpy_f16;
    t.elem.attn_scores_f16 = super::attn::attn_scores_f16;
    t.elem.attn_values_f16 = super::attn::attn_values_f16;
    t
}

/// Exact i32 sum of `w[j] * a[j]` for the 32 values `w0 ++ w1` and the 32 i8 at `a`.
///
/// # Safety
/// `a` must point to 32 readable bytes.
#[inline]
unsafe fn dot32(w0: int8x16_t, w1: int8x16_t, a: *const i8) -> i32 {
    let a0 = vld1q_s8(a);
    let a1 = vld1q_s8(a.add(16));
    let p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(a0)), w0, a0);
    let p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(a1)), w1, a1);
    vaddvq_s32(vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)))
}

/// The 32 nibbles at `qs` as (values 0..16, values 16..32), each 0..=15.
///
/// # Safety
/// `qs` must point to 16 readable bytes.
#[inline]
unsafe fn nibbles(qs: *const u8) -> (int8x16_t, int8x16_t) {
    let q = vld1q_u8(qs);
    let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
    (lo, hi)
}

fn vec_dot_q4_0_q8_0(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ4_0::SIZE)
        .zip(a.chunks_exact(BlockQ8_0::SIZE))
    {
        // SAFETY: a Q4_0 block has 16 nibble bytes at offset 2, a Q8_0 block 32 values at 2.
        let isum = unsafe {
            let (lo, hi) = nibbles(wb.as_ptr().add(2));
            let eight = vdupq_n_s8(8);
            dot32(
                vsubq_s8(lo, eight),
                vsubq_s8(hi, eight),
                ab.as_ptr().add(2).cast(),
            )
        };
        sum += isum as f32 * (f16_to_f32([wb[0], wb[1]]) * f16_to_f32([ab[0], ab[1]]));
    }
    sum
}

fn vec_dot_q4_1_q8_1(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ4_1::SIZE)
        .zip(a.chunks_exact(BlockQ8_1::SIZE))
    {
        // SAFETY: a Q4_1 block has 16 nibble bytes at offset 4, a Q8_1 block 32 values at 4.
        let isum = unsafe {
            let (lo, hi) = nibbles(wb.as_ptr().add(4));
            dot32(lo, hi, ab.as_ptr().add(4).cast())
        };
        sum += isum as f32 * (f16_to_f32([wb[0], wb[1]]) * f16_to_f32([ab[0], ab[1]]))
            + f16_to_f32([wb[2], wb[3]]) * f16_to_f32([ab[2], ab[3]]);
    }
    sum
}

fn vec_dot_q8_0_q8_0(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ8_0::SIZE)
        .zip(a.chunks_exact(BlockQ8_0::SIZE))
    {
        // SAFETY: both Q8_0 blocks have 32 values at offset 2.
        let isum = unsafe {
            let wp = wb.as_ptr().add(2).cast::<i8>();
            dot32(
                vld1q_s8(wp),
                vld1q_s8(wp.add(16)),
                ab.as_ptr().add(2).cast(),
            )
        };
        sum += isum as f32 * (f16_to_f32([wb[0], wb[1]]) * f16_to_f32([ab[0], ab[1]]));
    }
    sum
}

fn matmul_q4_0(args: MatmulArgs<'_>) {
    matmul_with(args, GgmlType::Q4_0, vec_dot_q4_0_q8_0)
}

fn matmul_q4_1(args: MatmulArgs<'_>) {
    matmul_with(args, GgmlType::Q4_1, vec_dot_q4_1_q8_1)
}

fn matmul_q8_0(args: MatmulArgs<'_>) {
    matmul_with(args, GgmlType::Q8_0, vec_dot_q8_0_q8_0)
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n16 = a.len() / 16 * 16;
    let mut i = 0;
    // SAFETY: every load reads 4 floats at i + 4j < n16 <= len of both.
    let mut s = unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        while i < n16 {
            for (j, v) in acc.iter_mut().enumerate() {
                let p = i + 4 * j;
                *v = vfmaq_f32(
                    *v,
                    vld1q_f32(a.as_ptr().add(p)),
                    vld1q_f32(b.as_ptr().add(p)),
                );
            }
            i += 16;
        }
        vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ))
    };
    for j in i..a.len() {
        s += a[j] * b[j];
    }
    s
}

fn axpy_f32(out: &mut [f32], alpha: f32, x: &[f32]) {
    let n4 = out.len() / 4 * 4;
    let mut i = 0;
    // SAFETY: every access touches 4 floats at i < n4 <= len of both.
    unsafe {
        let va = vdupq_n_f32(alpha);
        while i < n4 {
            let p = out.as_mut_ptr().add(i);
            let v = vaddq_f32(vld1q_f32(p), vmulq_f32(va, vld1q_f32(x.as_ptr().add(i))));
            vst1q_f32(p, v);
            i += 4;
        }
    }
    for j in i..out.len() {
        out[j] += alpha * x[j];
    }
}
