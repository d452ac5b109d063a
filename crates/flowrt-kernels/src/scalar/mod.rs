//! Portable reference kernels. Every SIMD table is checked against these.
//!
//! They favour plain code over speed, except that integer sums inside a quantised block are
//! exact (i32) and scaled once per block, which the SIMD code reproduces.

pub(crate) mod dot;
pub(crate) mod elem;
pub(crate) mod kquants;
pub(crate) mod legacy_search;
pub(crate) mod mxfp4;
pub(crate) mod quant;
pub(crate) mod search;

use crate::{slot, ElemOps, Kernels, TypeOps, N_SLOTS, SLOT_TYPES};
use flowrt_dtype::GgmlType;

fn type_ops(ty: GgmlType) -> TypeOps {
    use GgmlType::*;
    let (quantize, dequantize, vec_dot): (_, _, Option<crate::VecDotFn>) = match ty {
        F32 => (
            quant::quantize_row_f32 as crate::QuantizeFn,
            quant::dequantize_row_f32 as crate::DequantizeFn,
            Some(dot::vec_dot_f32_f32 as crate::VecDotFn),
        ),
        F16 => (
            quant::quantize_row_f16 as _,
            quant::dequantize_row_f16 as _,
            Some(dot::vec_dot_f16_f32 as _),
        ),
        BF16 => (
            quant::quantize_row_bf16 as _,
            quant::dequantize_row_bf16 as _,
            Some(dot::vec_dot_bf16_f32 as _),
        ),
        Q4_0 => (
            quant::quantize_row_q4_0 as _,
            quant::dequantize_row_q4_0 as _,
            Some(dot::vec_dot_q4_0_q8_0 as _),
        ),
        Q4_1 => (
            quant::quantize_row_q4_1 as _,
            quant::dequantize_row_q4_1 as _,
            Some(dot::vec_dot_q4_1_q8_1 as _),
        ),
        Q8_0 => (
            quant::quantize_row_q8_0 as _,
            quant::dequantize_row_q8_0 as _,
            Some(dot::vec_dot_q8_0_q8_0 as _),
        ),
        Q8_1 => (
            quant::quantize_row_q8_1 as _,
            quant::dequantize_row_q8_1 as _,
            None,
        ),
        Q5_0 => (
            kquants::quantize_row_q5_0 as _,
            kquants::dequantize_row_q5_0 as _,
            Some(kquants::vec_dot_q5_0_q8_0 as _),
        ),
        Q5_1 => (
            kquants::quantize_row_q5_1 as _,
            kquants::dequantize_row_q5_1 as _,
            Some(kquants::vec_dot_q5_1_q8_1 as _),
        ),
        Q4K => (
            search::quantize_row_q4_k::<search::Lanes> as _,
            kquants::dequantize_row_q4_k as _,
            Some(kquants::vec_dot_q4_k_q8_k as _),
        ),
        Q5K => (
            search::quantize_row_q5_k::<search::Lanes> as _,
            kquants::dequantize_row_q5_k as _,
            Some(kquants::vec_dot_q5_k_q8_k as _),
        ),
        Q6K => (
            search::quantize_row_q6_k::<search::Lanes> as _,
            kquants::dequantize_row_q6_k as _,
            Some(kquants::vec_dot_q6_k_q8_k as _),
        ),
        Q8K => (
            kquants::quantize_row_q8_k as _,
            kquants::dequantize_row_q8_k as _,
            None,
        ),
        Mxfp4 => (
            mxfp4::quantize_row_mxfp4 as _,
            mxfp4::dequantize_row_mxfp4 as _,
            Some(mxfp4::vec_dot_mxfp4_q8_0 as _),
        ),
        other => unreachable!("no scalar kernels for {other}"),
    };
    let matmul: Option<crate::MatmulFn> = vec_dot.map(|_| dot::matmul_for(ty));
    TypeOps {
        quantize,
        dequantize,
        vec_dot,
        matmul,
        // Filled by `Kernels::with_matmul_paths` for the table's instruction set.
        matmul_q16: None,
        matmul_q16_x8: None,
        matmul_a8_x8: None,
    }
}

pub(crate) fn elem_ops() -> ElemOps {
    ElemOps {
        rms_norm: elem::rms_norm,
        silu_mul: elem::silu_mul,
        gelu_tanh_mul: elem::gelu_tanh_mul,
        softcap: elem::softcap,
        softmax: elem::softmax,
        softmax_unscaled: elem::softmax_unscaled,
        add: elem::add,
        scale: elem::scale,
        dot_f32: elem::dot_f32,
        dot_f32_f16: elem::dot_f32_f16,
        axpy_f32: elem::axpy_f32,
        axpy_f16: elem::axpy_f16,
        f32_to_f16: elem::f32_to_f16,
        attn_scores_f16: elem::attn_scores_f16,
        attn_values_f16: elem::attn_values_f16,
        panel_dots_f64: elem::panel_dots::<f64, 8>,
        panel_dots_f32: elem::panel_dots::<f32, 16>,
    }
}

/// The scalar table; SIMD tables start from a copy of it.
pub(crate) fn table() -> Kernels {
    let types: [TypeOps; N_SLOTS] = std::array::from_fn(|i| type_ops(SLOT_TYPES[i]));
    debug_assert!(SLOT_TYPES
        .iter()
        .enumerate()
        .all(|(i, &t)| slot(t) == Some(i)));
    Kernels {
        isa: crate::Isa::Scalar,
        types,
        elem: elem_ops(),
        quantize_q16: crate::q16::quantize_row_ref,
        quantize_a8: crate::a8::quantize_row_ref,
    }
}
