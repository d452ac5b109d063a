//! AVX-512 tables. The quantised tiles are the shared ones (`quant.rs`) compiled with AVX-512VL
//! (32 vector registers, so bigger prefill tiles); with VNNI, `vpdpbusd` does the u8 x i8 dot
//! in one instruction. Attention dot/axpy helpers use 512-bit vectors.
//!
//! Q5_0, Q5_1 and the k-quants have no AVX-512 tiles: their ggml-style `vec_dot`/`matmul`
//! entries are the scalar reference (copied from the scalar table). Q16 matmuls on weights in
//! the row layout are the AVX2 ones (`x86/q16.rs`, `x86/q16k.rs`), which
//! `crate::q16::matmul_fn` picks for every x86 table; on x8-packed weights (the default) these
//! tables have their own 512-bit kernels (`x86/x8_512.rs`).
//!
//! The property tests in `tests/` compare these tables with the scalar reference (and the x8
//! kernels with the AVX2 ones, bit for bit) on any host that has the features, and report
//! them NOT RUN elsewhere.

use core::arch::x86_64::*;

use half::f16;

use crate::Kernels;

/// Builds the AVX-512 table, with VNNI tiles if `vnni`.
///
/// # Safety
/// The host must support AVX2, FMA, F16C, AVX-512 F/BW/DQ/VL, and AVX-512 VNNI if `vnni`.
pub(super) unsafe fn build(vnni: bool) -> Kernels {
    let mut t = crate::scalar::table();
    super::avx2::install_common(&mut t);
    if vnni {
        t.isa = crate::Isa::Avx512Vnni;
        vnni::install(&mut t);
    } else {
        t.isa = crate::Isa::Avx512;
        plain::install(&mut t);
    }
    t.elem.dot_f32 = dot_f32;
    t.elem.dot_f32_f16 = dot_f32_f16;
    t.elem.axpy_f32 = axpy_f32;
    t.elem.axpy_f16 = axpy_f16;
    t
}

mod plain {
    use super::super::avx2::{mul_sum_i8_i8, mul_sum_u8_i8_acc};
    super::super::quant::x86_quant_kernels!(
        features: "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl",
        shape: TileShape { decode_rows: 4, prefill_rows: 4, prefill_toks: 4 }
    );
}

mod vnni {
    use core::arch::x86_64::{
        __m256i, _mm256_dpbusd_epi32, _mm256_set1_epi8, _mm256_setzero_si256, _mm256_sub_epi32,
        _mm256_xor_si256,
    };

    /// `acc + sum of 4 adjacent u * a` per i32 lane (`vpdpbusd`, no saturation).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    #[inline]
    fn mul_sum_u8_i8_acc(acc: __m256i, u: __m256i, a: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, a)
    }

    /// `sum of 4 adjacent w * a` per i32 lane: `(w + 128) * a - 128 * a`, both exact in i32.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    #[inline]
    fn mul_sum_i8_i8(w: __m256i, a: __m256i) -> __m256i {
        let zero = _mm256_setzero_si256();
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        let a128 = _mm256_dpbusd_epi32(zero, bias, a);
        _mm256_dpbusd_epi32(_mm256_sub_epi32(zero, a128), _mm256_xor_si256(w, bias), a)
    }

    super::super::quant::x86_quant_kernels!(
        features: "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni",
        shape: TileShape { decode_rows: 4, prefill_rows: 4, prefill_toks: 4 }
    );
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
fn dot_f32_512(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    while i + 32 <= a.len() {
        for (j, s) in acc.iter_mut().enumerate() {
            // SAFETY: i + 16 * j + 16 <= len of both.
            unsafe {
                let va = _mm512_loadu_ps(a.as_ptr().add(i + 16 * j));
                *s = _mm512_fmadd_ps(va, _mm512_loadu_ps(b.as_ptr().add(i + 16 * j)), *s);
            }
        }
        i += 32;
    }
    while i + 16 <= a.len() {
        // SAFETY: i + 16 <= len of both.
        unsafe {
            let va = _mm512_loadu_ps(a.as_ptr().add(i));
            acc[0] = _mm512_fmadd_ps(va, _mm512_loadu_ps(b.as_ptr().add(i)), acc[0]);
        }
        i += 16;
    }
    let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    for j in i..a.len() {
        s += a[j] * b[j];
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
fn dot_f32_f16_512(a: &[f32], b: &[f16]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= a.len() {
        // SAFETY: i + 16 <= len of both; 16 f16 are one __m256i.
        unsafe {
            let va = _mm512_loadu_ps(a.as_ptr().add(i));
            let vb = _mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr().add(i).cast()));
            acc = _mm512_fmadd_ps(va, vb, acc);
        }
        i += 16;
    }
    let mut s = _mm512_reduce_add_ps(acc);
    for j in i..a.len() {
        s += a[j] * b[j].to_f32();
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
fn axpy_f32_512(out: &mut [f32], alpha: f32, x: &[f32]) {
    let va = _mm512_set1_ps(alpha);
    let mut i = 0;
    while i + 16 <= out.len() {
        // SAFETY: i + 16 <= len of both.
        unsafe {
            let p = out.as_mut_ptr().add(i);
            let vx = _mm512_loadu_ps(x.as_ptr().add(i));
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), _mm512_mul_ps(va, vx)));
        }
        i += 16;
    }
    for j in i..out.len() {
        out[j] += alpha * x[j];
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
fn axpy_f16_512(out: &mut [f32], alpha: f32, x: &[f16]) {
    let va = _mm512_set1_ps(alpha);
    let mut i = 0;
    while i + 16 <= out.len() {
        // SAFETY: i + 16 <= len of both; 16 f16 are one __m256i.
        unsafe {
            let p = out.as_mut_ptr().add(i);
            let vx = _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().add(i).cast()));
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), _mm512_mul_ps(va, vx)));
        }
        i += 16;
    }
    for j in i..out.len() {
        out[j] += alpha * x[j].to_f32();
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: this table is only built on hosts with the AVX-512 features above.
    unsafe { dot_f32_512(a, b) }
}

fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    // SAFETY: as for dot_f32.
    unsafe { dot_f32_f16_512(a, b) }
}

fn axpy_f32(out: &mut [f32], alpha: f32, x: &[f32]) {
    // SAFETY: as for dot_f32.
    unsafe { axpy_f32_512(out, alpha, x) }
}

fn axpy_f16(out: &mut [f32], alpha: f32, x: &[f16]) {
    // SAFETY: as for dot_f32.
    unsafe { axpy_f16_512(out, alpha, x) }
}
