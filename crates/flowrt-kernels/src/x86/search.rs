//! The error-minimising quantisers of `scalar/search.rs` (Q4_K, Q5_K, Q6_K)
//! instantiated with AVX vectors: the same lane-wise IEEE single operations on 256-bit
//! registers (`vcmpltps` + `vblendvps` for the selects, no fused multiply-add), so every table
//! writes the scalar table's bytes, several times faster.

use core::arch::x86_64::*;

use crate::scalar::search::F8;
use crate::{slot, Kernels};
use flowrt_dtype::GgmlType;

/// Eight f32 lanes in one AVX register. Its methods are only ever inlined into the
/// `#[target_feature(enable = "avx")]` functions below, which run only in tables built after
/// AVX2 (which includes AVX) was detected.
#[derive(Clone, Copy)]
pub(crate) struct Avx8(__m256);

impl F8 for Avx8 {
    #[inline(always)]
    fn splat(v: f32) -> Self {
        // SAFETY: AVX is present (see the type's comment).
        Avx8(unsafe { _mm256_set1_ps(v) })
    }
    #[inline(always)]
    fn from_array(a: [f32; 8]) -> Self {
        // SAFETY: AVX is present; the load reads the 8 values of `a`.
        Avx8(unsafe { _mm256_loadu_ps(a.as_ptr()) })
    }
    #[inline(always)]
    fn to_array(self) -> [f32; 8] {
        let mut a = [0f32; 8];
        // SAFETY: AVX is present; the store writes the 8 values of `a`.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), self.0) };
        a
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: AVX is present.
        Avx8(unsafe { _mm256_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        // SAFETY: AVX is present.
        Avx8(unsafe { _mm256_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        // SAFETY: AVX is present.
        Avx8(unsafe { _mm256_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        // SAFETY: AVX is present.
        Avx8(unsafe { _mm256_div_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        // SAFETY: AVX is present.
        Avx8(unsafe { _mm256_sqrt_ps(self.0) })
    }
    #[inline(always)]
    fn lt_select(a: Self, b: Self, x: Self, y: Self) -> Self {
        // SAFETY: AVX is present. Ordered, non-signalling `<`: false for NaN, as Rust's `<`.
        Avx8(unsafe { _mm256_blendv_ps(y.0, x.0, _mm256_cmp_ps::<_CMP_LT_OQ>(a.0, b.0)) })
    }
}

macro_rules! avx_quantiser {
    ($name:ident, $f:expr) => {
        fn $name(x: &[f32], out: &mut [u8]) {
            #[target_feature(enable = "avx")]
            fn inner(x: &[f32], out: &mut [u8]) {
                $f(x, out)
            }
            // SAFETY: installed only in tables built after AVX2 (which includes AVX) was
            // detected (`install`'s callers).
            unsafe { inner(x, out) }
        }
    };
}

avx_quantiser!(q4_k, crate::scalar::search::quantize_row_q4_k::<Avx8>);
avx_quantiser!(q5_k, crate::scalar::search::quantize_row_q5_k::<Avx8>);
avx_quantiser!(q6_k, crate::scalar::search::quantize_row_q6_k::<Avx8>);

/// Installs the AVX quantisers; `t` must be a table for hosts with AVX2.
pub(super) fn install(t: &mut Kernels) {
    let s = |ty| slot(ty).expect("slot");
    t.types[s(GgmlType::Q4K)].quantize = q4_k;
    t.types[s(GgmlType::Q5K)].quantize = q5_k;
    t.types[s(GgmlType::Q6K)].quantize = q6_k;
}
