//! Scalar dot products of a weight row with an activation row, and the plain matmul loop.
//!
//! Quantised dots sum `q_w * q_a` exactly in i32 within a block, then scale by the two block
//! scales in f32 and accumulate in f32, block by block.

use super::kquants::{
    vec_dot_q4_k_q8_k, vec_dot_q5_0_q8_0, vec_dot_q5_1_q8_1, vec_dot_q5_k_q8_k, vec_dot_q6_k_q8_k,
};
use super::mxfp4::vec_dot_mxfp4_q8_0;
use crate::blocks::{bf16_to_f32, f16_to_f32, BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
use crate::{MatmulArgs, MatmulFn, VecDotFn};
use flowrt_dtype::GgmlType;

pub(crate) fn vec_dot_q4_0_q8_0(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ4_0::SIZE)
        .zip(a.chunks_exact(BlockQ8_0::SIZE))
    {
        let (wb, ab) = (BlockQ4_0::read(wb), BlockQ8_0::read(ab));
        let isum: i32 = (0..QK)
            .map(|j| (wb.q(j) as i32 - 8) * ab.qs[j] as i32)
            .sum();
        sum += isum as f32 * (f16_to_f32(wb.d) * f16_to_f32(ab.d));
    }
    sum
}

/// `sum_b d_w d_a sum_j q_w q_a + m_w s_a`, with `s_a = d_a sum_j q_a` from the Q8_1 block.
pub(crate) fn vec_dot_q4_1_q8_1(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ4_1::SIZE)
        .zip(a.chunks_exact(BlockQ8_1::SIZE))
    {
        let (wb, ab) = (BlockQ4_1::read(wb), BlockQ8_1::read(ab));
        let isum: i32 = (0..QK).map(|j| wb.q(j) as i32 * ab.qs[j] as i32).sum();
        sum += isum as f32 * (f16_to_f32(wb.d) * f16_to_f32(ab.d))
            + f16_to_f32(wb.m) * f16_to_f32(ab.s);
    }
    sum
}

pub(crate) fn vec_dot_q8_0_q8_0(_k: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w
        .chunks_exact(BlockQ8_0::SIZE)
        .zip(a.chunks_exact(BlockQ8_0::SIZE))
    {
        let (wb, ab) = (BlockQ8_0::read(wb), BlockQ8_0::read(ab));
        let isum: i32 = wb
            .qs
            .iter()
            .zip(&ab.qs)
            .map(|(&x, &y)| x as i32 * y as i32)
            .sum();
        sum += isum as f32 * (f16_to_f32(wb.d) * f16_to_f32(ab.d));
    }
    sum
}

fn f32_at(a: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]])
}

pub(crate) fn vec_dot_f32_f32(k: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..k).map(|i| f32_at(w, i) * f32_at(a, i)).sum()
}

pub(crate) fn vec_dot_f16_f32(k: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..k)
        .map(|i| f16_to_f32([w[2 * i], w[2 * i + 1]]) * f32_at(a, i))
        .sum()
}

pub(crate) fn vec_dot_bf16_f32(k: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..k)
        .map(|i| bf16_to_f32([w[2 * i], w[2 * i + 1]]) * f32_at(a, i))
        .sum()
}

/// The plain matmul: one `vec_dot` per (row, token).
pub(crate) fn matmul_with(args: MatmulArgs<'_>, ty: GgmlType, dot: VecDotFn) {
    let wsize = crate::row_size(ty, args.k);
    let asize = crate::row_size(crate::Kernels::vec_dot_type(ty), args.k);
    for t in 0..args.ntok {
        let arow = &args.a[t * asize..(t + 1) * asize];
        let out = &mut args.out[t * args.out_stride..t * args.out_stride + args.nrows];
        for (r, o) in out.iter_mut().enumerate() {
            *o = dot(args.k, &args.w[r * wsize..(r + 1) * wsize], arow);
        }
    }
}

macro_rules! scalar_matmuls {
    ($($name:ident: $ty:ident => $dot:ident;)*) => {
        $(fn $name(args: MatmulArgs<'_>) { matmul_with(args, GgmlType::$ty, $dot) })*

        /// The scalar matmul for weight type `ty`.
        pub(crate) fn matmul_for(ty: GgmlType) -> MatmulFn {
            match ty {
                $(GgmlType::$ty => $name,)*
                other => unreachable!("no scalar matmul for {other}"),
            }
        }
    };
}

scalar_matmuls! {
    matmul_f32: F32 => vec_dot_f32_f32;
    matmul_f16: F16 => vec_dot_f16_f32;
    matmul_bf16: BF16 => vec_dot_bf16_f32;
    matmul_q4_0: Q4_0 => vec_dot_q4_0_q8_0;
    matmul_q4_1: Q4_1 => vec_dot_q4_1_q8_1;
    matmul_q8_0: Q8_0 => vec_dot_q8_0_q8_0;
    matmul_q5_0: Q5_0 => vec_dot_q5_0_q8_0;
    matmul_q5_1: Q5_1 => vec_dot_q5_1_q8_1;
    matmul_q4_k: Q4K => vec_dot_q4_k_q8_k;
    matmul_q5_k: Q5K => vec_dot_q5_k_q8_k;
    matmul_q6_k: Q6K => vec_dot_q6_k_q8_k;
    matmul_mxfp4: Mxfp4 => vec_dot_mxfp4_q8_0;
}
