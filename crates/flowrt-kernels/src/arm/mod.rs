//! aarch64 tables. Advanced SIMD (NEON) is part of the aarch64 baseline, so the NEON table is
//! always available there.

// Tails index two slices in step.
#![allow(clippy::needless_range_loop)]

mod attn;
mod neon;
pub(crate) mod x8;

use std::sync::OnceLock;

use crate::Kernels;

use arch::*;

/// The intrinsics the NEON files use (one place to point it at).
use core::arch::aarch64 as arch;

pub(crate) fn table() -> Option<&'static Kernels> {
    static NEON: OnceLock<Option<Kernels>> = OnceLock::new();
    NEON.get_or_init(|| {
        std::arch::is_aarch64_feature_detected!("neon").then(|| neon::build().with_matmul_paths())
    })
    .as_ref()
}

/// 4 f16 at `p` as f32, exactly (subnormals, infinities and NaNs included).
///
/// By bits rather than `vcvt_f32_f16`, whose intrinsic needs a newer Rust than this crate's
/// minimum: exponent and mantissa moved to f32's places are the value times 2^-112, so one
/// multiply by 2^112 finishes normal and subnormal values alike (with flush-to-zero off, as
/// Linux leaves it); exponent 31 (infinity, NaN) becomes 255.
///
/// # Safety
/// 4 readable values at `p`.
#[inline(always)]
pub(super) unsafe fn load4(p: *const half::f16) -> float32x4_t {
    // SAFETY: the caller guarantees 8 readable bytes; f16 is 2 bytes of IEEE half bits.
    unsafe {
        let h = vmovl_u16(vld1_u16(p.cast()));
        let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
        let em = vandq_u32(h, vdupq_n_u32(0x7FFF));
        let moved = vshlq_n_u32::<13>(em);
        let finite = vreinterpretq_u32_f32(vmulq_f32(
            vreinterpretq_f32_u32(moved),
            vdupq_n_f32(f32::from_bits(0x7780_0000)), // 2^112
        ));
        let special = vorrq_u32(moved, vdupq_n_u32(0x7F80_0000));
        let is_special = vcgeq_u32(em, vdupq_n_u32(0x7C00));
        vreinterpretq_f32_u32(vorrq_u32(vbslq_u32(is_special, special, finite), sign))
    }
}
