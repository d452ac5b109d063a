//! AVX2 (+FMA+F16C) Q16-activation kernels for k-quant weights (Q4_K, Q5_K, Q6_K).
//!
//! The same tiles as `q16.rs` (rows x tokens, weights unpacked once per tile, accumulators in
//! registers, rows prefetched ahead), walked per 256-value super-block: its sub-block scales
//! are decoded once per row, then each of its 8 32-value sub-blocks meets one Q16 activation
//! block. Q4_K/Q5_K: `vpmaddwd` of the unsigned values, scaled by `d sc_j d_a`, plus
//! `-dmin m_j s_a`. Q6_K: the signed values `q - 32` are multiplied by their 16-value
//! sub-block's scale in i16 (|x| <= 4096), so one `vpmaddwd` pair (4 products per i32 lane,
//! |sum| < 2^30) and one FMA by `d d_a` serve both halves.

use core::arch::x86_64::*;

use flowrt_dtype::GgmlType;

use super::q16::{half, hsum, run, Tiles, PREFETCH_ROWS};
use crate::blocks::{scales_mins_k4, K_SCALE_SIZE, QK, QK_K};
use crate::q16::Q16_BLOCK_BYTES;
use crate::{MatmulArgs, MatmulFn};

/// A k-quant super-block, unpacked per 32-value sub-block.
trait KUnpack {
    const BYTES: usize;
    /// Whether sub-blocks have a min (`cw != 0`).
    const HAS_MIN: bool;
    /// Per sub-block `j`: `dw[j]` (scale of the integer dot) and `cw[j]` (coefficient of the
    /// activation block's `s`).
    ///
    /// # Safety
    /// `p` points to a whole super-block; the host has AVX2, FMA and F16C.
    unsafe fn scales(p: *const u8, dw: &mut [f32; 8], cw: &mut [f32; 8]);
    /// Sub-block `j`'s integers as two vectors of 16 i16 (values 0..16, 16..32).
    ///
    /// # Safety
    /// As for [`KUnpack::scales`], and `j < 8`.
    unsafe fn sub(p: *const u8, j: usize) -> (__m256i, __m256i);
}

struct W4K;
struct W5K;
struct W6K;

/// Q4_K/Q5_K scales: `dw = d sc_j`, `cw = -dmin m_j` (the f32 products the scalar reference
/// computes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn minmax_scales(p: *const u8, dw: &mut [f32; 8], cw: &mut [f32; 8]) {
    // SAFETY: the caller guarantees a whole Q4_K/Q5_K block: d at 0, dmin at 2, 12 bytes of
    // packed scales at 4; dw and cw are 8 floats each.
    unsafe {
        let d = half(p);
        let dmin = half(p.add(2));
        let packed: [u8; K_SCALE_SIZE] = p.add(4).cast::<[u8; K_SCALE_SIZE]>().read_unaligned();
        let (sc, mn) = scales_mins_k4(&packed);
        let to_ps = |v: [u8; 8]| {
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
                v,
            ))))
        };
        _mm256_storeu_ps(dw.as_mut_ptr(), _mm256_mul_ps(to_ps(sc), _mm256_set1_ps(d)));
        _mm256_storeu_ps(
            cw.as_mut_ptr(),
            _mm256_mul_ps(to_ps(mn), _mm256_set1_ps(-dmin)),
        );
    }
}

/// The low nibbles (`j` even) or high nibbles (`j` odd) of the 32 bytes at `qs + 32 (j / 2)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_nibbles(qs: *const u8, j: usize) -> __m256i {
    // SAFETY: the caller guarantees 128 readable bytes at qs and j < 8.
    let x = unsafe { _mm256_loadu_si256(qs.add(32 * (j / 2)).cast()) };
    let x = _mm256_srl_epi16(x, _mm_cvtsi32_si128(4 * (j % 2) as i32));
    _mm256_and_si256(x, _mm256_set1_epi8(0x0F))
}

/// 32 unsigned bytes as two vectors of 16 i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_u8(x: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(x)),
        _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(x)),
    )
}

impl KUnpack for W4K {
    const BYTES: usize = 144;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, dw: &mut [f32; 8], cw: &mut [f32; 8]) {
        // SAFETY: forwarded contract.
        unsafe { minmax_scales(p, dw, cw) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(p: *const u8, j: usize) -> (__m256i, __m256i) {
        // SAFETY: a Q4_K block has 128 bytes of nibbles at 16.
        widen_u8(unsafe { k_nibbles(p.add(16), j) })
    }
}

impl KUnpack for W5K {
    const BYTES: usize = 176;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, dw: &mut [f32; 8], cw: &mut [f32; 8]) {
        // SAFETY: forwarded contract.
        unsafe { minmax_scales(p, dw, cw) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(p: *const u8, j: usize) -> (__m256i, __m256i) {
        // SAFETY: a Q5_K block has 32 bytes of fifth bits at 16 and 128 bytes of nibbles at 48.
        unsafe {
            let low = k_nibbles(p.add(48), j);
            let qh = _mm256_loadu_si256(p.add(16).cast());
            // Bit j of each byte, moved to bit 4 (no bit crosses a byte).
            let h = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)),
                _mm256_set1_epi8(1),
            );
            widen_u8(_mm256_or_si256(low, _mm256_slli_epi16::<4>(h)))
        }
    }
}

impl KUnpack for W6K {
    const BYTES: usize = 210;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, dw: &mut [f32; 8], _cw: &mut [f32; 8]) {
        // SAFETY: a Q6_K block has d at 208.
        let d = unsafe { half(p.add(208)) };
        *dw = [d; 8];
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(p: *const u8, j: usize) -> (__m256i, __m256i) {
        let (h, s) = (j / 4, j % 4);
        // SAFETY: a Q6_K block has ql (128 bytes) at 0, qh (64) at 128, 16 i8 scales at 192;
        // h < 2 and s < 4 keep every load inside them.
        unsafe {
            let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (s % 2)).cast());
            let low = _mm256_and_si256(
                _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (s / 2) as i32)),
                _mm256_set1_epi8(0x0F),
            );
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
            let high = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s as i32)),
                _mm256_set1_epi8(3),
            );
            let q = _mm256_sub_epi8(
                _mm256_or_si256(low, _mm256_slli_epi16::<4>(high)),
                _mm256_set1_epi8(32),
            );
            let sc0 = *p.add(192 + 2 * j) as i8 as i16;
            let sc1 = *p.add(193 + 2 * j) as i8 as i16;
            (
                _mm256_mullo_epi16(
                    _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
                    _mm256_set1_epi16(sc0),
                ),
                _mm256_mullo_epi16(
                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(q)),
                    _mm256_set1_epi16(sc1),
                ),
            )
        }
    }
}

/// The tiles of a k-quant type.
struct Super<W>(std::marker::PhantomData<W>);

impl<W: KUnpack> Tiles for Super<W> {
    /// Rows `r0..r0+R` times tokens `t0..t0+T`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const T: usize>(g: &mut MatmulArgs<'_>, r0: usize, t0: usize) {
        if T == 8 {
            // Eight tokens' accumulators would not fit the registers: two tiles of four.
            // SAFETY: forwarded contract (tokens t0..t0+8 exist).
            unsafe {
                Self::tile::<R, 4>(g, r0, t0);
                Self::tile::<R, 4>(g, r0, t0 + 4);
            }
            return;
        }
        let nsb = g.k / QK_K;
        let wstride = nsb * W::BYTES;
        let astride = g.k / QK * Q16_BLOCK_BYTES;
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut off = [[0.0f32; T]; R];
        let w = g.w.as_ptr();
        let a = g.a.as_ptr();
        // SAFETY (loop): super-block sb of rows r0..r0+R and activation blocks 8 sb..8 sb + 8
        // of tokens t0..t0+T lie inside `g.w`/`g.a` (Tiles contract; lengths checked by
        // `Kernels::matmul_q16`); prefetches stay inside `g.w`.
        unsafe {
            for sb in 0..nsb {
                // Prefetch the same super-block PREFETCH_ROWS rows ahead, every cache line of
                // it (a super-block spans 3 to 5 lines).
                for r in 0..R {
                    let ahead = (r0 + r + PREFETCH_ROWS) * wstride + sb * W::BYTES;
                    if ahead + W::BYTES <= g.w.len() {
                        let mut o = 0;
                        while o < W::BYTES {
                            _mm_prefetch::<_MM_HINT_T0>(w.add(ahead + o).cast());
                            o += 64;
                        }
                        _mm_prefetch::<_MM_HINT_T0>(w.add(ahead + W::BYTES - 1).cast());
                    }
                }
                let mut dw = [[0.0f32; 8]; R];
                let mut cw = [[0.0f32; 8]; R];
                for r in 0..R {
                    W::scales(
                        w.add((r0 + r) * wstride + sb * W::BYTES),
                        &mut dw[r],
                        &mut cw[r],
                    );
                }
                for j in 0..8 {
                    let mut wlo = [_mm256_setzero_si256(); R];
                    let mut whi = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let (lo, hi) = W::sub(w.add((r0 + r) * wstride + sb * W::BYTES), j);
                        wlo[r] = lo;
                        whi[r] = hi;
                    }
                    let b = sb * 8 + j;
                    for t in 0..T {
                        let ap = a.add((t0 + t) * astride + b * Q16_BLOCK_BYTES);
                        let da = ap.cast::<f32>().read_unaligned();
                        let alo = _mm256_loadu_si256(ap.add(8).cast());
                        let ahi = _mm256_loadu_si256(ap.add(40).cast());
                        for r in 0..R {
                            let p = _mm256_add_epi32(
                                _mm256_madd_epi16(wlo[r], alo),
                                _mm256_madd_epi16(whi[r], ahi),
                            );
                            acc[r][t] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(p),
                                _mm256_set1_ps(dw[r][j] * da),
                                acc[r][t],
                            );
                        }
                        if W::HAS_MIN {
                            let sa = ap.add(4).cast::<f32>().read_unaligned();
                            for r in 0..R {
                                off[r][t] += cw[r][j] * sa;
                            }
                        }
                    }
                }
            }
            for r in 0..R {
                for t in 0..T {
                    *g.out.get_unchecked_mut((t0 + t) * g.out_stride + r0 + r) =
                        hsum(acc[r][t]) + off[r][t];
                }
            }
        }
    }
}

fn matmul_q4_k(mut g: MatmulArgs<'_>) {
    // SAFETY: only reachable from tables built after AVX2/FMA/F16C were detected, with lengths
    // checked by `Kernels::matmul_q16`.
    unsafe { run::<Super<W4K>>(&mut g) }
}
fn matmul_q5_k(mut g: MatmulArgs<'_>) {
    // SAFETY: as for `matmul_q4_k`.
    unsafe { run::<Super<W5K>>(&mut g) }
}
fn matmul_q6_k(mut g: MatmulArgs<'_>) {
    // SAFETY: as for `matmul_q4_k`.
    unsafe { run::<Super<W6K>>(&mut g) }
}

/// The k-quant Q16 matmuls.
pub(super) fn matmul_fn(w: GgmlType) -> Option<MatmulFn> {
    match w {
        GgmlType::Q4K => Some(matmul_q4_k),
        GgmlType::Q5K => Some(matmul_q5_k),
        GgmlType::Q6K => Some(matmul_q6_k),
        _ => None,
    }
}
