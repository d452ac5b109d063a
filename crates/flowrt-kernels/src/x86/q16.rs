//! AVX2 (+FMA+F16C) kernels for Q16 activations (see `crate::q16`): `vpmaddwd` on 16-bit
//! pairs, one f32 FMA per block and row/token pair, weights unpacked once per tile and reused
//! for every token of it. This file has the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, MXFP4 in ggml's row layout) and the tile walker; `q16k.rs` the k-quants. AVX-512 tables use these kernels too.

use core::arch::x86_64::*;

use flowrt_dtype::GgmlType;

use crate::blocks::QK;
use crate::q16::{q16_row_size, Q16_BLOCK_BYTES};
use crate::{MatmulArgs, MatmulFn};

/// How many rows ahead of a tile the weights are prefetched.
pub(super) const PREFETCH_ROWS: usize = 16;

/// A weight type's block, unpacked to two vectors of 16 i16 values (elements 0..16, 16..32).
trait Unpack {
    const BYTES: usize;
    /// # Safety
    /// `p` points to a whole block; the host has AVX2 and F16C.
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i, f32, f32);
}

struct W4_0;
struct W4_1;
struct W5_0;
struct W5_1;
struct W8_0;
struct WMxfp4;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(x: __m128i) -> (__m256i, __m256i) {
    // Widen the 16 bytes once; each 16-bit lane then holds `lo + 16 * hi`.
    let b = _mm256_cvtepu8_epi16(x);
    (
        _mm256_and_si256(b, _mm256_set1_epi16(0x0F)),
        _mm256_srli_epi16::<4>(b),
    )
}

/// The fifth bits of a Q5_0/Q5_1 block (`qh`, bit `j` for value `j`) as 16 (bit set) or 0 in
/// two vectors of 16 i16 lanes (values 0..16, 16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(qh: u32) -> (__m256i, __m256i) {
    (fifth_bits16(qh as u16), fifth_bits16((qh >> 16) as u16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits16(h: u16) -> __m256i {
    let bit = _mm256_setr_epi16(
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        512,
        1024,
        2048,
        4096,
        8192,
        16384,
        i16::MIN,
    );
    let set = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(h as i16), bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi16(16))
}

/// The two f16 values at `p` and `p + 2`, converted together.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_halves(p: *const u8) -> (f32, f32) {
    // SAFETY: the caller guarantees four readable bytes at p.
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(
        unsafe { p.cast::<u32>().read_unaligned() } as i32,
    ));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees two readable bytes at p.
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
        unsafe { p.cast::<u16>().read_unaligned() } as i32,
    )))
}

impl Unpack for W4_0 {
    const BYTES: usize = 18;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: a Q4_0 block is 18 bytes: d at 0, 16 bytes of nibbles at 2.
        unsafe {
            let d = half(p);
            let (lo, hi) = nibbles(_mm_loadu_si128(p.add(2).cast()));
            (lo, hi, d, -8.0 * d)
        }
    }
}

impl Unpack for W4_1 {
    const BYTES: usize = 20;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: a Q4_1 block is 20 bytes: d at 0, m at 2, 16 bytes of nibbles at 4.
        unsafe {
            let (lo, hi) = nibbles(_mm_loadu_si128(p.add(4).cast()));
            let (d, m) = two_halves(p);
            (lo, hi, d, m)
        }
    }
}

impl Unpack for W5_0 {
    const BYTES: usize = 22;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: a Q5_0 block is 22 bytes: d at 0, qh (u32) at 2, 16 bytes of nibbles at 6.
        unsafe {
            let d = half(p);
            let (lo, hi) = nibbles(_mm_loadu_si128(p.add(6).cast()));
            let (hlo, hhi) = fifth_bits(p.add(2).cast::<u32>().read_unaligned());
            (
                _mm256_or_si256(lo, hlo),
                _mm256_or_si256(hi, hhi),
                d,
                -16.0 * d,
            )
        }
    }
}

impl Unpack for W5_1 {
    const BYTES: usize = 24;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: a Q5_1 block is 24 bytes: d at 0, m at 2, qh at 4, 16 bytes of nibbles at 8.
        unsafe {
            let (lo, hi) = nibbles(_mm_loadu_si128(p.add(8).cast()));
            let (hlo, hhi) = fifth_bits(p.add(4).cast::<u32>().read_unaligned());
            let (d, m) = two_halves(p);
            (_mm256_or_si256(lo, hlo), _mm256_or_si256(hi, hhi), d, m)
        }
    }
}

impl Unpack for W8_0 {
    const BYTES: usize = 34;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: a Q8_0 block is 34 bytes: d at 0, 32 i8 at 2.
        unsafe {
            let lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2).cast()));
            let hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18).cast()));
            (lo, hi, half(p), 0.0)
        }
    }
}

impl Unpack for WMxfp4 {
    const BYTES: usize = crate::blocks::MXFP4_BLOCK_BYTES;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (__m256i, __m256i, f32, f32) {
        // SAFETY: an MXFP4 block is 17 bytes: the E8M0 exponent at 0, 16 bytes of 4-bit codes
        // at 1 (value j in the low nibble of byte j, value j + 16 in the high one). The codes go
        // through the E2M1 table doubled (`MXFP4_KVALUES`, exact in i8); the half scale undoes
        // the doubling.
        unsafe {
            let x = _mm_loadu_si128(p.add(1).cast());
            let lut = _mm_loadu_si128(crate::blocks::MXFP4_KVALUES.as_ptr().cast());
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_shuffle_epi8(lut, _mm_and_si128(x, mask));
            let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16::<4>(x), mask));
            (
                _mm256_cvtepi8_epi16(lo),
                _mm256_cvtepi8_epi16(hi),
                crate::blocks::mxfp4_half_scale(*p),
                0.0,
            )
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Sums of `p0..p3` (8 i32 lanes each) packed as `[p0, p1, p2, p3]` per 128-bit half: the low
/// half holds each vector's lanes 0..4 summed, the high half lanes 4..8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack4(p0: __m256i, p1: __m256i, p2: __m256i, p3: __m256i) -> __m256i {
    _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3))
}

/// Rows `r0..r0+R` times `4 G` tokens from `t0` (batched decode, prefill). Per block and row,
/// each group of four tokens' integer dots is packed into one vector first, so the conversion
/// to f32 and the scaling are one instruction each for four tokens (instead of one per token);
/// the row's block is unpacked once for all `4 G` tokens.
///
/// # Safety
/// As for [`tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_t4<W: Unpack, const R: usize, const G: usize>(
    g: &mut MatmulArgs<'_>,
    r0: usize,
    t0: usize,
) {
    let nb = g.k / QK;
    let wstride = nb * W::BYTES;
    let astride = nb * Q16_BLOCK_BYTES;
    // Per row and group: lanes [t0 t1 t2 t3 | t0 t1 t2 t3] of the scaled sums, and the offsets.
    let mut acc = [[_mm256_setzero_ps(); G]; R];
    let mut off = [[_mm_setzero_ps(); G]; R];
    let w = g.w.as_ptr();
    let a = g.a.as_ptr();
    // SAFETY (loop): block b of rows r0..r0+R and tokens t0..t0+4G lies inside `g.w`/`g.a`.
    unsafe {
        for b in 0..nb {
            for r in 0..R {
                // Further ahead than the one-token tile: these tiles spend longer per row.
                let ahead = (r0 + r + 2 * PREFETCH_ROWS) * wstride + b * W::BYTES;
                if ahead < g.w.len() {
                    _mm_prefetch::<_MM_HINT_T0>(w.add(ahead).cast());
                }
            }
            let ap = |t: usize| a.add((t0 + t) * astride + b * Q16_BLOCK_BYTES);
            let scales = |gi: usize, at: usize| {
                let t = 4 * gi;
                _mm_setr_ps(
                    ap(t).add(at).cast::<f32>().read_unaligned(),
                    ap(t + 1).add(at).cast::<f32>().read_unaligned(),
                    ap(t + 2).add(at).cast::<f32>().read_unaligned(),
                    ap(t + 3).add(at).cast::<f32>().read_unaligned(),
                )
            };
            let mut da = [_mm256_setzero_ps(); G];
            let mut sa = [_mm_setzero_ps(); G];
            for gi in 0..G {
                let d = scales(gi, 0);
                da[gi] = _mm256_set_m128(d, d);
                sa[gi] = scales(gi, 4);
            }
            for r in 0..R {
                let (wlo, whi, dw, cw) = W::unpack(w.add((r0 + r) * wstride + b * W::BYTES));
                let dot = |t: usize| {
                    let alo = _mm256_loadu_si256(ap(t).add(8).cast());
                    let ahi = _mm256_loadu_si256(ap(t).add(40).cast());
                    _mm256_add_epi32(_mm256_madd_epi16(wlo, alo), _mm256_madd_epi16(whi, ahi))
                };
                let (dwv, cwv) = (_mm256_set1_ps(dw), _mm_set1_ps(cw));
                for gi in 0..G {
                    let t = 4 * gi;
                    let p = pack4(dot(t), dot(t + 1), dot(t + 2), dot(t + 3));
                    let scale = _mm256_mul_ps(dwv, da[gi]);
                    acc[r][gi] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r][gi]);
                    off[r][gi] = _mm_fmadd_ps(cwv, sa[gi], off[r][gi]);
                }
            }
        }
        for r in 0..R {
            for gi in 0..G {
                let v = _mm_add_ps(
                    _mm256_castps256_ps128(acc[r][gi]),
                    _mm256_extractf128_ps::<1>(acc[r][gi]),
                );
                let mut sums = [0.0f32; 4];
                _mm_storeu_ps(sums.as_mut_ptr(), _mm_add_ps(v, off[r][gi]));
                for (t, &v) in sums.iter().enumerate() {
                    *g.out
                        .get_unchecked_mut((t0 + 4 * gi + t) * g.out_stride + r0 + r) = v;
                }
            }
        }
    }
}

/// Rows `r0..r0+R` times tokens `t0..t0+T`.
///
/// # Safety
/// The rows and tokens exist in `g` (whose lengths `Kernels::matmul_q16` checked), and the host
/// has AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<W: Unpack, const R: usize, const T: usize>(
    g: &mut MatmulArgs<'_>,
    r0: usize,
    t0: usize,
) {
    if T == 4 {
        // SAFETY: forwarded contract.
        return unsafe { tile_t4::<W, R, 1>(g, r0, t0) };
    }
    if T == 8 {
        // SAFETY: forwarded contract.
        return unsafe { tile_t4::<W, R, 2>(g, r0, t0) };
    }
    let nb = g.k / QK;
    let wstride = nb * W::BYTES;
    let astride = nb * Q16_BLOCK_BYTES;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut off = [[0.0f32; T]; R];
    let w = g.w.as_ptr();
    let a = g.a.as_ptr();
    // SAFETY (loop): block b of rows r0..r0+R and tokens t0..t0+T lies inside `g.w`/`g.a`.
    unsafe {
        for b in 0..nb {
            let mut wlo = [_mm256_setzero_si256(); R];
            let mut whi = [_mm256_setzero_si256(); R];
            let mut dw = [0.0f32; R];
            let mut cw = [0.0f32; R];
            // Weights stream from memory once per token: ask for the rows PREFETCH_ROWS ahead
            // (hardware prefetchers miss this pattern of several short interleaved streams).
            for r in 0..R {
                let ahead = (r0 + r + PREFETCH_ROWS) * wstride + b * W::BYTES;
                if ahead < g.w.len() {
                    _mm_prefetch::<_MM_HINT_T0>(w.add(ahead).cast());
                }
            }
            for r in 0..R {
                let (lo, hi, d, c) = W::unpack(w.add((r0 + r) * wstride + b * W::BYTES));
                wlo[r] = lo;
                whi[r] = hi;
                dw[r] = d;
                cw[r] = c;
            }
            for t in 0..T {
                let ap = a.add((t0 + t) * astride + b * Q16_BLOCK_BYTES);
                let da = ap.cast::<f32>().read_unaligned();
                let sa = ap.add(4).cast::<f32>().read_unaligned();
                let alo = _mm256_loadu_si256(ap.add(8).cast());
                let ahi = _mm256_loadu_si256(ap.add(40).cast());
                for r in 0..R {
                    let p = _mm256_add_epi32(
                        _mm256_madd_epi16(wlo[r], alo),
                        _mm256_madd_epi16(whi[r], ahi),
                    );
                    acc[r][t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(p),
                        _mm256_set1_ps(dw[r] * da),
                        acc[r][t],
                    );
                    off[r][t] += cw[r] * sa;
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

/// A family of tile kernels: `tile::<R, T>(g, r0, t0)` computes rows `r0..r0+R` times tokens
/// `t0..t0+T` (R, T in 1..=4).
pub(super) trait Tiles {
    /// # Safety
    /// The rows and tokens exist in `g` (whose lengths `Kernels::matmul_q16` checked), and the
    /// host has AVX2, FMA and F16C.
    unsafe fn tile<const R: usize, const T: usize>(g: &mut MatmulArgs<'_>, r0: usize, t0: usize);
}

/// The tiles of a 32-value block type.
struct Blocks<W>(std::marker::PhantomData<W>);

impl<W: Unpack> Tiles for Blocks<W> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const T: usize>(g: &mut MatmulArgs<'_>, r0: usize, t0: usize) {
        // SAFETY: forwarded contract.
        unsafe { tile::<W, R, T>(g, r0, t0) }
    }
}

/// The whole matmul, a band of 4 rows at a time: the band's weights stay in L1 while every
/// token is multiplied with them, 8 tokens per tile (then 4, then single tokens). Weights are read
/// from memory once per matmul however many tokens there are; activations stay in cache.
///
/// # Safety
/// As for [`Tiles::tile`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run<X: Tiles>(g: &mut MatmulArgs<'_>) {
    let (nr, nt) = (g.nrows, g.ntok);
    // SAFETY: every tile stays within 0..nr rows and 0..nt tokens.
    unsafe {
        let mut r = 0;
        while r + 4 <= nr {
            let mut t = 0;
            while t + 8 <= nt {
                X::tile::<2, 8>(g, r, t);
                X::tile::<2, 8>(g, r + 2, t);
                t += 8;
            }
            while t + 4 <= nt {
                X::tile::<4, 4>(g, r, t);
                t += 4;
            }
            while t < nt {
                X::tile::<4, 1>(g, r, t);
                t += 1;
            }
            r += 4;
        }
        while r < nr {
            let mut t = 0;
            while t + 4 <= nt {
                X::tile::<1, 4>(g, r, t);
                t += 4;
            }
            while t < nt {
                X::tile::<1, 1>(g, r, t);
                t += 1;
            }
            r += 1;
        }
    }
}

fn matmul_q4_0(mut g: MatmulArgs<'_>) {
    // SAFETY: this function is only reachable from tables built after AVX2/FMA/F16C were
    // detected, with lengths checked by `Kernels::matmul_q16`.
    unsafe { run::<Blocks<W4_0>>(&mut g) }
}
fn matmul_q4_1(mut g: MatmulArgs<'_>) {
    // SAFETY: as for `matmul_q4_0`.
    unsafe { run::<Blocks<W4_1>>(&mut g) }
}
fn matmul_q5_0(mut g: MatmulArgs<'_>) {
    // SAFETY: as for `matmul_q4_0`.
    unsafe { run::<Blocks<W5_0>>(&mut g) }
}
fn matmul_q5_1(mut g: MatmulArgs<'_>) {
    // SAFETY: as for `matmul_q4_0`.
    unsafe { run::<Blocks<W5_1>>(&mut g) }
}
fn matmul_q8_0(mut g: MatmulArgs<'_>) {
    // SAFETY: as for `matmul_q4_0`.
    unsafe { run::<Blocks<W8_0>>(&mut g) }
}
fn matmul_mxfp4(mut g: MatmulArgs<'_>) {
    // SAFETY: as for `matmul_q4_0`.
    unsafe { run::<Blocks<WMxfp4>>(&mut g) }
}

pub(crate) fn matmul_fn(w: GgmlType) -> Option<MatmulFn> {
    match w {
        GgmlType::Q4_0 => Some(matmul_q4_0),
        GgmlType::Q4_1 => Some(matmul_q4_1),
        GgmlType::Q5_0 => Some(matmul_q5_0),
        GgmlType::Q5_1 => Some(matmul_q5_1),
        GgmlType::Q8_0 => Some(matmul_q8_0),
        GgmlType::Mxfp4 => Some(matmul_mxfp4),
        other => super::q16k::matmul_fn(other),
    }
}

/// Quantise one row to Q16 (round to nearest, ties to even: may differ from the scalar
/// reference's ties-away by one unit on exact ties).
pub(crate) fn quantize_row(x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), q16_row_size(x.len()));
    // SAFETY: reachable only from AVX2 tables (see `matmul_q4_0`); lengths checked above.
    unsafe { quantize_row_avx2(x, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_avx2(x: &[f32], out: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (xb, ob) in x
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(Q16_BLOCK_BYTES))
    {
        // SAFETY: xb has 32 floats, ob 72 bytes.
        unsafe {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
            );
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            let d = amax / 32767.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            if !inv.is_finite() {
                // A block of values below about 1e-34: the reference's rescaled path.
                crate::q16::quantize_block_ref(xb, d, ob);
                continue;
            }
            let id = _mm256_set1_ps(inv);
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(v[i], id)))
            });
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            let sum = _mm_cvtsi128_si32(s);
            let p01 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
            let p23 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[2], q[3]));
            let o = ob.as_mut_ptr();
            o.cast::<f32>().write_unaligned(d);
            o.add(4).cast::<f32>().write_unaligned(d * sum as f32);
            _mm256_storeu_si256(o.add(8).cast(), p01);
            _mm256_storeu_si256(o.add(40).cast(), p23);
        }
    }
}
