//! AVX2 (+FMA+F16C) matmuls on x8-packed weights (see `crate::x8`) with Q16 activations.
//!
//! One 32-bit lane is one of a group's 8 rows: `vpmaddwd` of 8 rows' weight pairs with a
//! broadcast activation pair adds 2 products to each row's integer sum, a block's 8 integer
//! sums are converted and scaled in one instruction each, and the group's outputs are 8
//! adjacent floats: no horizontal sums. A tile is one group by up to 4 tokens; its weights are
//! widened once per chunk and used for every token.

use core::arch::x86_64::*;

use flowrt_dtype::GgmlType;

use crate::a8::A8_BLOCK_BYTES;
use crate::blocks::QK;
use crate::q16::Q16_BLOCK_BYTES;
use crate::x8::ROWS;
use crate::{MatmulArgs, MatmulFn};

/// How far ahead of the block being multiplied the weight stream is prefetched, in bytes.
const PREFETCH_BYTES: usize = 2048;

/// A packed type: its block size and how its chunks widen to 16-bit weight pairs.
pub(super) trait Packed {
    /// Bytes of one packed unit (8 rows x 32 values, or x 256 for Q4_K).
    const BYTES: usize;
    /// Offset of the quants in a packed unit.
    const Q: usize;
    /// 32-value sub-blocks per unit (their quants are 128 bytes apart).
    const SUBS: usize = 1;
    /// The 8 rows' scales of sub-block `s`, and their offset terms' factors (see
    /// `crate::q16::Q16Weight::sub`): `m` for Q4_1, `-8 d` for Q4_0, `-dmin m_s` for Q4_K,
    /// nothing for Q8_0.
    ///
    /// # Safety
    /// `p` points to a whole packed unit; the host has AVX2, FMA and F16C.
    unsafe fn scales(p: *const u8, s: usize) -> (__m256, Option<__m256>);
    /// Bits per weight: 4, 5 or 6 (quants laid out for [`dots4`], with 0, 1 or 2 high-bit
    /// planes after the 128 nibble bytes) or 8 ([`dots8`]).
    const BITS: u32;
    /// Bytes from one sub-block's quants to the next's.
    const STRIDE: usize = 128;
    /// 6-bit types (Q6_K) only, whose scales cover 16 values: the 8 rows' `d * sc` of
    /// 16-value sub-block `j` (the values' integers are centred: `q - 32`).
    ///
    /// # Safety
    /// As for [`Packed::scales`].
    unsafe fn half_scales(_p: *const u8, _j: usize) -> __m256 {
        unreachable!("only 6-bit packed types have a scale per 16 values")
    }
    /// Whether the 4-bit codes index the E2M1 table (MXFP4, [`dots_e2m1`]) instead of being
    /// the weights' integers.
    const E2M1: bool = false;
    /// With A8 activations: the weights' integer offset, added to a block's integer sums as
    /// `offset * sum(q_a)` (Q4_0 -8, Q5_0 -16, MXFP4 -12: its codes look up the doubled E2M1
    /// values plus 12, unsigned for `vpmaddubsw`); 0 for the types whose offset is a float
    /// (`Packed::scales`' second value, times `d_a * sum(q_a)`).
    const A8_INT_OFFSET: i32 = 0;
}

pub(super) struct P4_0;
pub(super) struct P4_1;
pub(super) struct P5_0;
pub(super) struct P5_1;
pub(super) struct P8_0;
pub(super) struct P4K;
pub(super) struct P5K;
pub(super) struct P6K;
pub(super) struct PMxfp4;

/// The 4 bytes at `p` (two Q16 values, or four A8 ones), broadcast to every 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// Bits `from..from + n` of every 16-bit lane of `h`, moved to `to..to + n` (the others
/// cleared).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
///
/// # Safety
/// AVX2 host.
unsafe fn bits_to(h: __m256i, from: u32, to: u32, n: u32) -> __m256i {
    // `from` and `to` are constants after unrolling: the shifts by a count become shifts by
    // an immediate.
    let v = if from >= to {
        _mm256_srl_epi16(h, _mm_cvtsi32_si128((from - to) as i32))
    } else {
        _mm256_sll_epi16(h, _mm_cvtsi32_si128((to - from) as i32))
    };
    _mm256_and_si256(v, _mm256_set1_epi16((((1 << n) - 1) << to) as i16))
}

/// Adds the products of `G` groups' 4-bit blocks (units `u0..u1` of them; `HB` high bits from
/// the vectors after the nibbles complete 5- or 6-bit values, 6-bit ones centred by -32) to
/// `acc[g][t]` for the `T` tokens whose Q16 block quants (32 i16) start at `a[t]`.
///
/// # Safety
/// Each `q[g]` points to a block's quants (and its high-bit planes after them), each `a[t]`
/// to 64 readable bytes; AVX2 host.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots4<const G: usize, const T: usize, const HB: usize>(
    q: &[*const u8; G],
    a: &[*const u8; T],
    acc: &mut [[__m256i; T]; G],
    u0: usize,
    u1: usize,
) {
    let m = _mm256_set1_epi16(0x000F);
    // SAFETY: a 4-bit block has 4 units of 32 bytes at q[g], then HB planes of 32 bytes;
    // unit u pairs with activation values 8u..8u+8 at bytes 16u..16u+16 of each a[t].
    unsafe {
        // Plain loops, not closures: a closure would not inherit this function's target
        // features and, once too large to inline, runs its intrinsics as calls.
        let mut h = [[_mm256_setzero_si256(); 2]; G];
        for (g, h) in h.iter_mut().enumerate() {
            for (i, h) in h.iter_mut().enumerate().take(HB) {
                *h = _mm256_loadu_si256(q[g].add(128 + 32 * i).cast());
            }
        }
        for u in u0..u1 {
            let raw: [__m256i; G] =
                std::array::from_fn(|g| _mm256_loadu_si256(q[g].add(32 * u).cast()));
            // The four nibbles of each 16-bit lane (bits 0..4, 8..12, 4..8, 12..16) in turn:
            // one weight vector per group live at a time keeps the tile in registers.
            for i in 0..4 {
                let mut w = [_mm256_setzero_si256(); G];
                for (g, w) in w.iter_mut().enumerate() {
                    *w = match i {
                        0 => _mm256_and_si256(raw[g], m),
                        1 => _mm256_and_si256(_mm256_srli_epi16::<8>(raw[g]), m),
                        2 => _mm256_and_si256(_mm256_srli_epi16::<4>(raw[g]), m),
                        _ => _mm256_srli_epi16::<12>(raw[g]),
                    };
                    // The high bits of unit u, position i (see `crate::x8`).
                    if HB == 1 {
                        *w = _mm256_or_si256(*w, bits_to(h[g][0], (4 * u + i) as u32, 4, 1));
                    }
                    if HB == 2 {
                        let f = (2 * (4 * (u % 2) + i)) as u32;
                        *w = _mm256_or_si256(*w, bits_to(h[g][u / 2], f, 4, 2));
                        *w = _mm256_sub_epi16(*w, _mm256_set1_epi16(32));
                    }
                }
                for t in 0..T {
                    let ap = pair(a[t].add(16 * u + 4 * i));
                    for g in 0..G {
                        acc[g][t] = _mm256_add_epi32(acc[g][t], _mm256_madd_epi16(w[g], ap));
                    }
                }
            }
        }
    }
}

impl Packed for P4_0 {
    const BYTES: usize = 144;
    const Q: usize = 16;
    const A8_INT_OFFSET: i32 = -8;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, _: usize) -> (__m256, Option<__m256>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        let d = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) });
        (d, Some(_mm256_mul_ps(d, _mm256_set1_ps(-8.0))))
    }
    const BITS: u32 = 4;
}

impl Packed for P4_1 {
    const BYTES: usize = 160;
    const Q: usize = 32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, _: usize) -> (__m256, Option<__m256>) {
        // SAFETY: a Q4_1 packed unit has 8 f16 scales, then 8 f16 minimums.
        unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                Some(_mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast()))),
            )
        }
    }
    const BITS: u32 = 4;
}

impl Packed for P5_0 {
    const BYTES: usize = 176;
    const Q: usize = 16;
    const A8_INT_OFFSET: i32 = -16;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, _: usize) -> (__m256, Option<__m256>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        let d = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) });
        (d, Some(_mm256_mul_ps(d, _mm256_set1_ps(-16.0))))
    }
    const BITS: u32 = 5;
}

impl Packed for P5_1 {
    const BYTES: usize = 192;
    const Q: usize = 32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, s: usize) -> (__m256, Option<__m256>) {
        // SAFETY: laid out as Q4_1's header.
        unsafe { P4_1::scales(p, s) }
    }
    const BITS: u32 = 5;
}

impl Packed for P5K {
    const BYTES: usize = 1440;
    const Q: usize = 160;
    const SUBS: usize = 8;
    const STRIDE: usize = 160;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, s: usize) -> (__m256, Option<__m256>) {
        // SAFETY: laid out as Q4_K's header.
        unsafe { P4K::scales(p, s) }
    }
    const BITS: u32 = 5;
}

impl Packed for P6K {
    const BYTES: usize = 1680;
    const Q: usize = 144;
    const SUBS: usize = 8;
    const STRIDE: usize = 192;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, _: usize) -> (__m256, Option<__m256>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        (_mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) }), None)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half_scales(p: *const u8, j: usize) -> __m256 {
        // SAFETY: a Q6_K packed unit: d (8 f16), then the 16 sub-block scales of 8 rows as
        // signed bytes, [sub-block][row], at 16.
        unsafe {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
            let sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                p.add(16 + 8 * j).cast(),
            )));
            _mm256_mul_ps(d, sc)
        }
    }
    const BITS: u32 = 6;
}

impl Packed for P8_0 {
    const BYTES: usize = 272;
    const Q: usize = 16;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, _: usize) -> (__m256, Option<__m256>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        (_mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) }), None)
    }
    const BITS: u32 = 8;
}

impl Packed for PMxfp4 {
    const BYTES: usize = 136;
    const Q: usize = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, _: usize) -> (__m256, Option<__m256>) {
        // SAFETY: a packed MXFP4 unit starts with the 8 rows' E8M0 exponent bytes.
        unsafe {
            let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
            // Half the scale, 2^(e - 128), exactly (see `blocks::mxfp4_half_scale`): the f32
            // bits `(e - 1) << 23` for e >= 2, the subnormals `0x0020_0000 << e` below.
            let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
            let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
            (
                _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small)),
                None,
            )
        }
    }
    const BITS: u32 = 4;
    const E2M1: bool = true;
    const A8_INT_OFFSET: i32 = -12;
}

/// Adds the products of `G` groups' MXFP4 blocks (codes laid out as Q4_0's nibbles) to
/// `acc[g][t]` for the `T` tokens whose Q16 block quants (32 i16) start at `a[t]`: each code
/// is looked up (`vpshufb`) in the table of doubled E2M1 values (-12..=12), so the integer sums
/// `sum k_j q_a` are exact, as in the scalar reference.
///
/// # Safety
/// Each `q[g]` points to a block's 128 code bytes, each `a[t]` to 64 readable bytes; AVX2 host.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_e2m1<const G: usize, const T: usize>(
    q: &[*const u8; G],
    a: &[*const u8; T],
    acc: &mut [[__m256i; T]; G],
) {
    let lut = _mm256_setr_epi8(
        0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8, 12, 0, -1,
        -2, -3, -4, -6, -8, -12,
    );
    let m = _mm256_set1_epi8(0x0F);
    // SAFETY: 4 units of 32 bytes at q[g]; unit u pairs with activation values 8u..8u+8 at
    // bytes 16u..16u+16 of each a[t].
    unsafe {
        for u in 0..QK / 8 {
            let mut lo = [_mm256_setzero_si256(); G];
            let mut hi = [_mm256_setzero_si256(); G];
            for g in 0..G {
                let raw = _mm256_loadu_si256(q[g].add(32 * u).cast());
                // Bytes of values: bits 0..4 and 8..12 of each 16-bit lane in `lo`'s low and
                // high bytes, bits 4..8 and 12..16 in `hi`'s.
                lo[g] = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m));
                hi[g] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m));
            }
            for i in 0..4 {
                let mut w = [_mm256_setzero_si256(); G];
                for (g, w) in w.iter_mut().enumerate() {
                    // The signed byte of position i, sign-extended to its 16-bit lane.
                    *w = match i {
                        0 => _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(lo[g])),
                        1 => _mm256_srai_epi16::<8>(lo[g]),
                        2 => _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(hi[g])),
                        _ => _mm256_srai_epi16::<8>(hi[g]),
                    };
                }
                for t in 0..T {
                    let ap = pair(a[t].add(16 * u + 4 * i));
                    for g in 0..G {
                        acc[g][t] = _mm256_add_epi32(acc[g][t], _mm256_madd_epi16(w[g], ap));
                    }
                }
            }
        }
    }
}

/// Adds the products of `G` groups' 8-bit blocks to `acc[g][t]` for the `T` tokens whose Q16
/// block quants (32 i16) start at `a[t]`.
///
/// # Safety
/// Each `q[g]` points to a block's quants, each `a[t]` to 64 readable bytes; AVX2 host.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots8<const G: usize, const T: usize>(
    q: &[*const u8; G],
    a: &[*const u8; T],
    acc: &mut [[__m256i; T]; G],
) {
    // SAFETY: an 8-bit block has 16 chunks of 16 bytes at q[g]; chunk c pairs with activation
    // values 2c, 2c+1 at bytes 4c..4c+4 of each a[t].
    unsafe {
        for c in 0..QK / 2 {
            let x: [__m256i; G] = std::array::from_fn(|g| {
                _mm256_cvtepi8_epi16(_mm_loadu_si128(q[g].add(16 * c).cast()))
            });
            for t in 0..T {
                let av = pair(a[t].add(4 * c));
                for g in 0..G {
                    acc[g][t] = _mm256_add_epi32(acc[g][t], _mm256_madd_epi16(x[g], av));
                }
            }
        }
    }
}

/// `acc[g][t] += ` the 16-bit pair sums of `s16[g][t]` widened to 32 bits (`vpmaddwd` by
/// ones), and `s16` cleared.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen<const G: usize, const T: usize>(
    s16: &mut [[__m256i; T]; G],
    acc: &mut [[__m256i; T]; G],
) {
    let ones = _mm256_set1_epi16(1);
    for g in 0..G {
        for t in 0..T {
            acc[g][t] = _mm256_add_epi32(acc[g][t], _mm256_madd_epi16(s16[g][t], ones));
            s16[g][t] = _mm256_setzero_si256();
        }
    }
}

/// With A8 activations: adds the products of `G` groups' Q6_K sub-block half `half` (values
/// `16 half..16 half + 16`: units `2 half`, `2 half + 1`) as unsigned 6-bit integers (`q + 32`,
/// 0..=63; the caller takes back `32 * sum(q_a)` of the half) to `acc[g][t]` for the `T`
/// tokens whose A8 quants start at `a[t]`. The two high bits of each value come from the
/// plane after the nibbles (as in [`dots4`]); a unit's two `vpmaddubsw` (pairs of at most
/// `63 * 127`) are widened before the next unit's.
///
/// # Safety
/// Each `q[g]` points to a sub-block's 128 nibble bytes and its two 32-byte high-bit planes,
/// each `a[t]` to 32 readable bytes; AVX2 host.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots6_a8<const G: usize, const T: usize>(
    q: &[*const u8; G],
    a: &[*const u8; T],
    acc: &mut [[__m256i; T]; G],
    half: usize,
) {
    let m = _mm256_set1_epi8(0x0F);
    // SAFETY: as the contract says; unit u pairs with activation bytes 8u..8u+8.
    unsafe {
        let h: [__m256i; G] =
            std::array::from_fn(|g| _mm256_loadu_si256(q[g].add(128 + 32 * half).cast()));
        let mut s16 = [[_mm256_setzero_si256(); T]; G];
        for u in 2 * half..2 * half + 2 {
            let raw: [__m256i; G] =
                std::array::from_fn(|g| _mm256_loadu_si256(q[g].add(32 * u).cast()));
            for nib in 0..2 {
                let mut w = [_mm256_setzero_si256(); G];
                for (g, w) in w.iter_mut().enumerate() {
                    *w = if nib == 0 {
                        _mm256_and_si256(raw[g], m)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw[g]), m)
                    };
                    // The low byte holds position 2 nib, the high byte 2 nib + 1 of each
                    // 16-bit lane: their 2-bit fields, to bits 4 and 12.
                    let f = (2 * (4 * (u % 2) + 2 * nib)) as u32;
                    *w = _mm256_or_si256(*w, bits_to(h[g], f, 4, 2));
                    *w = _mm256_or_si256(*w, bits_to(h[g], f + 2, 12, 2));
                }
                for t in 0..T {
                    let av = pair(a[t].add(8 * u + 4 * nib));
                    for g in 0..G {
                        s16[g][t] = _mm256_add_epi16(s16[g][t], _mm256_maddubs_epi16(w[g], av));
                    }
                }
            }
            widen(&mut s16, acc);
        }
    }
}

/// The sum of the A8 quants of values 0..16 of the block whose quants start at `q` (the
/// permutation stays within runs of 8, so they are its first 16 bytes).
///
/// # Safety
/// 16 readable bytes at `q`; AVX2 host.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn a8_first_half_sum(q: *const u8) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm_loadu_si128(q.cast());
        let s = _mm_madd_epi16(_mm_maddubs_epi16(_mm_set1_epi8(1), v), _mm_set1_epi16(1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// With A8 activations (see `crate::a8`): adds the products of `G` groups' 4-bit blocks to
/// `acc[g][t]` for the `T` tokens whose A8 block quants (32 i8 in `a8::PERM` order) start at
/// `a[t]`. The 4-bit codes are the weights' integers (`HB` = 1: a high-bit plane after the
/// nibbles completes 5-bit values), or with `E2M1` (MXFP4) index the doubled E2M1 values plus
/// 12 (0..=24, unsigned for `vpmaddubsw`).
///
/// Masking a unit's bytes with `0x0F` gives, in row `r`'s 32-bit lane, its values
/// `8u, 8u+2, 8u+1, 8u+3`; the same after a shift by 4, `8u+4, 8u+6, 8u+5, 8u+7`: the order of
/// the activation bytes `8u..8u+4` and `8u+4..8u+8`. `vpmaddubsw` multiplies the unsigned
/// weights with the signed activations into 16-bit pairs, which add up in 16 bits before they
/// are widened: 16 products of 4-bit weights (at most `15 * 127` each), 8 of 5-bit ones
/// (`31 * 127`) or of E2M1 ones (`24 * 127`).
///
/// # Safety
/// Each `q[g]` points to a block's 128 quant bytes (and its high-bit plane after them), each
/// `a[t]` to 32 readable bytes; AVX2 host.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots4_a8<const G: usize, const T: usize, const HB: usize, const E2M1: bool>(
    q: &[*const u8; G],
    a: &[*const u8; T],
    acc: &mut [[__m256i; T]; G],
) {
    let m = _mm256_set1_epi8(0x0F);
    let lut = _mm256_setr_epi8(
        12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18, 20, 24,
        12, 11, 10, 9, 8, 6, 4, 0,
    );
    // Units whose products fit 16 bits before widening: all 4 for plain 4-bit weights, 2 else.
    let span = if HB == 0 && !E2M1 { 4 } else { 2 };
    // SAFETY: a 4-bit block has 4 units of 32 bytes at q[g], then HB planes of 32 bytes; unit
    // u pairs with activation bytes 8u..8u+8 of each a[t].
    unsafe {
        let h: [__m256i; G] = std::array::from_fn(|g| {
            if HB == 1 {
                _mm256_loadu_si256(q[g].add(128).cast())
            } else {
                _mm256_setzero_si256()
            }
        });
        let mut s16 = [[_mm256_setzero_si256(); T]; G];
        let mut part_mem = [[_mm256_setzero_si256(); T]; G];
        let part: *mut __m256i = part_mem.as_mut_ptr().cast();
        for u in 0..QK / 8 {
            let raw: [__m256i; G] =
                std::array::from_fn(|g| _mm256_loadu_si256(q[g].add(32 * u).cast()));
            for half in 0..2 {
                let mut w = [_mm256_setzero_si256(); G];
                for (g, w) in w.iter_mut().enumerate() {
                    *w = if half == 0 {
                        _mm256_and_si256(raw[g], m)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw[g]), m)
                    };
                    if E2M1 {
                        *w = _mm256_shuffle_epi8(lut, *w);
                    }
                    if HB == 1 {
                        // Positions 2 half and 2 half + 1 of unit u (see `crate::x8`): the low
                        // and the high byte of each 16-bit lane, their fifth bits at 4 and 12.
                        let p = (4 * u + 2 * half) as u32;
                        *w = _mm256_or_si256(*w, bits_to(h[g], p, 4, 1));
                        *w = _mm256_or_si256(*w, bits_to(h[g], p + 1, 12, 1));
                    }
                }
                for t in 0..T {
                    let av = pair(a[t].add(8 * u + 4 * half));
                    for g in 0..G {
                        s16[g][t] = _mm256_add_epi16(s16[g][t], _mm256_maddubs_epi16(w[g], av));
                    }
                }
            }
            if u % span == span - 1 {
                if u + 1 < QK / 8 {
                    // Not the block's last units: the widened sums wait in memory, so that
                    // the 16-bit sums and the weights keep the registers (as in [`tile`]).
                    // Written out rather than through `widen` and a temporary array, which
                    // compiled to a 13 % slower MXFP4 prefill (docs/performance.md).
                    let ones = _mm256_set1_epi16(1);
                    for g in 0..G {
                        for t in 0..T {
                            let p = part.add(g * T + t);
                            let w = _mm256_madd_epi16(s16[g][t], ones);
                            p.write_volatile(_mm256_add_epi32(p.read_volatile(), w));
                            s16[g][t] = _mm256_setzero_si256();
                        }
                    }
                } else {
                    widen(&mut s16, acc);
                }
            }
        }
        if span < QK / 8 {
            for g in 0..G {
                for t in 0..T {
                    acc[g][t] = _mm256_add_epi32(acc[g][t], part.add(g * T + t).read_volatile());
                }
            }
        }
    }
}

/// 8 bytes at `p` as 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes8(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 8 readable bytes at p.
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.cast()) }))
}

impl Packed for P4K {
    const BYTES: usize = 1184;
    const Q: usize = 160;
    const SUBS: usize = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8, s: usize) -> (__m256, Option<__m256>) {
        // SAFETY: a Q4_K packed unit: d and dmin (8 f16 each), then the sub-block scales and
        // mins as bytes, [sub-block][row], at 32 and 96.
        unsafe {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast()));
            (
                _mm256_mul_ps(d, bytes8(p.add(32 + 8 * s))),
                Some(_mm256_mul_ps(
                    _mm256_mul_ps(dmin, bytes8(p.add(96 + 8 * s))),
                    _mm256_set1_ps(-1.0),
                )),
            )
        }
    }
    // A sub-block's quants are laid out as Q4_0's.
    const BITS: u32 = 4;
}

/// Groups `grp..grp+G` (rows `8 grp..8 (grp + G)`) times tokens `t0..t0+T`.
///
/// # Safety
/// The groups and tokens exist in `g` (lengths checked by `Kernels::matmul_q16_x8`); the host
/// has AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<P: Packed, const G: usize, const T: usize, const A8: bool>(
    g: &mut MatmulArgs<'_>,
    grp: usize,
    t0: usize,
) {
    let nb = g.k / QK;
    let ablock = if A8 { A8_BLOCK_BYTES } else { Q16_BLOCK_BYTES };
    let astride = nb * ablock;
    let units = nb / P::SUBS;
    let wg: [*const u8; G] =
        std::array::from_fn(|i| g.w.as_ptr().wrapping_add((grp + i) * units * P::BYTES));
    let wend = g.w.as_ptr().wrapping_add(g.w.len());
    let a = g.a.as_ptr();
    // The float sums live in memory, read and written once per block: with them in registers
    // too, a two-group, four-token tile needs more than the 16 ymm registers, and where the
    // compiler then spills (the integer sums of the inner loop, or these) decides the speed.
    let mut acc_mem = [[_mm256_setzero_ps(); T]; G];
    let acc: *mut __m256 = acc_mem.as_mut_ptr().cast();
    // SAFETY (loop): block b of the groups and of tokens t0..t0+T lies inside `g.w` / `g.a`.
    unsafe {
        for b in 0..nb {
            let (unit, s) = (b / P::SUBS, b % P::SUBS);
            let p: [*const u8; G] = std::array::from_fn(|i| wg[i].add(unit * P::BYTES));
            for &p in &p {
                // This block's share of the stream, some way ahead.
                let share = P::BYTES / P::SUBS;
                let ahead = p.wrapping_add(s * share + PREFETCH_BYTES);
                if ahead < wend {
                    for line in (0..share).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
                    }
                }
            }
            let ab: [*const u8; T] =
                std::array::from_fn(|t| a.add((t0 + t) * astride + b * ablock));
            let aq: [*const u8; T] = std::array::from_fn(|t| ab[t].add(8));
            let q: [*const u8; G] = std::array::from_fn(|i| p[i].add(P::Q + P::STRIDE * s));
            if P::BITS == 6 {
                // A scale per 16 values: each half's integer sums are scaled on their own.
                for half in 0..2 {
                    let mut isum = [[_mm256_setzero_si256(); T]; G];
                    if A8 {
                        dots6_a8::<G, T>(&q, &aq, &mut isum, half);
                        // The -32 of every value, through the half's activation sum (the
                        // block's sum less the first half's for the second).
                        for t in 0..T {
                            let lo = a8_first_half_sum(aq[t]);
                            let h = if half == 0 {
                                lo
                            } else {
                                ab[t].add(4).cast::<i32>().read_unaligned() - lo
                            };
                            let c = _mm256_set1_epi32(-32 * h);
                            for i in 0..G {
                                isum[i][t] = _mm256_add_epi32(isum[i][t], c);
                            }
                        }
                    } else {
                        dots4::<G, T, 2>(&q, &aq, &mut isum, 2 * half, 2 * half + 2);
                    }
                    for i in 0..G {
                        let dsc = P::half_scales(p[i], 2 * s + half);
                        for t in 0..T {
                            let da = _mm256_set1_ps(ab[t].cast::<f32>().read_unaligned());
                            let p = acc.add(i * T + t);
                            p.write_volatile(_mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(isum[i][t]),
                                _mm256_mul_ps(dsc, da),
                                p.read_volatile(),
                            ));
                        }
                    }
                }
                continue;
            }
            let mut isum = [[_mm256_setzero_si256(); T]; G];
            match P::BITS {
                _ if A8 && P::E2M1 => dots4_a8::<G, T, 0, true>(&q, &aq, &mut isum),
                5 if A8 => dots4_a8::<G, T, 1, false>(&q, &aq, &mut isum),
                _ if A8 => dots4_a8::<G, T, 0, false>(&q, &aq, &mut isum),
                _ if P::E2M1 => dots_e2m1::<G, T>(&q, &aq, &mut isum),
                8 => dots8::<G, T>(&q, &aq, &mut isum),
                5 => dots4::<G, T, 1>(&q, &aq, &mut isum, 0, 4),
                _ => dots4::<G, T, 0>(&q, &aq, &mut isum, 0, 4),
            }
            if A8 && P::A8_INT_OFFSET != 0 {
                // The offset in the integers: exact, and one add per row group and token.
                for t in 0..T {
                    let asum = ab[t].add(4).cast::<i32>().read_unaligned();
                    let c = _mm256_set1_epi32(P::A8_INT_OFFSET * asum);
                    for i in 0..G {
                        isum[i][t] = _mm256_add_epi32(isum[i][t], c);
                    }
                }
            }
            for i in 0..G {
                let (d, off) = P::scales(p[i], s);
                let off = if A8 && P::A8_INT_OFFSET != 0 {
                    None
                } else {
                    off
                };
                for t in 0..T {
                    let da_s = ab[t].cast::<f32>().read_unaligned();
                    let da = _mm256_set1_ps(da_s);
                    let p = acc.add(i * T + t);
                    let mut v = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(isum[i][t]),
                        _mm256_mul_ps(d, da),
                        p.read_volatile(),
                    );
                    if let Some(m) = off {
                        // Q16 blocks hold `s = d_a * sum(q_a)`; A8 blocks the integer sum.
                        let sa = if A8 {
                            da_s * ab[t].add(4).cast::<i32>().read_unaligned() as f32
                        } else {
                            ab[t].add(4).cast::<f32>().read_unaligned()
                        };
                        v = _mm256_fmadd_ps(m, _mm256_set1_ps(sa), v);
                    }
                    p.write_volatile(v);
                }
            }
        }
        let out = g.out.as_mut_ptr();
        for i in 0..G {
            for t in 0..T {
                _mm256_storeu_ps(
                    out.add((t0 + t) * g.out_stride + (grp + i) * ROWS),
                    acc.add(i * T + t).read_volatile(),
                );
            }
        }
    }
}

/// Every group times every token, two groups per tile where there are several tokens.
///
/// # Safety
/// As for [`tile`]; `g.nrows` is a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<P: Packed>(g: &mut MatmulArgs<'_>) {
    // SAFETY: forwarded.
    unsafe { run_groups::<P>(g, 0, g.nrows / ROWS) }
}

/// Groups `from..to` times every token, two groups per tile where there are several tokens
/// (the AVX-512 kernels do an odd last group here).
///
/// # Safety
/// As for [`tile`]; `to <= g.nrows / 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_groups<P: Packed>(g: &mut MatmulArgs<'_>, from: usize, to: usize) {
    // SAFETY: forwarded.
    unsafe { run_groups_as::<P, false>(g, from, to) }
}

/// [`run_groups`] with Q16 (`A8` false) or A8 activations.
///
/// # Safety
/// As for [`run_groups`]; with `A8`, `P` is a 4- or 5-bit type or MXFP4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_groups_as<P: Packed, const A8: bool>(
    g: &mut MatmulArgs<'_>,
    from: usize,
    to: usize,
) {
    let ng = to;
    let mut grp = from;
    // SAFETY: every tile stays within the groups and tokens of `g`.
    unsafe {
        // Two groups per tile when there are several tokens: each broadcast activation pair
        // then feeds two multiplies (the loads, not the multiplies, limit one-group tiles).
        while g.ntok > 1 && grp + 2 <= ng {
            all_tokens::<P, 2, A8>(g, grp);
            grp += 2;
        }
        while grp < ng {
            all_tokens::<P, 1, A8>(g, grp);
            grp += 1;
        }
    }
}

/// Groups `grp..grp+G` times every token: tiles of 4 tokens, then the remainder.
///
/// # Safety
/// As for [`tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn all_tokens<P: Packed, const G: usize, const A8: bool>(
    g: &mut MatmulArgs<'_>,
    grp: usize,
) {
    let nt = g.ntok;
    let mut t = 0;
    // SAFETY: forwarded contract; every tile stays within 0..nt.
    unsafe {
        while t + 4 <= nt {
            tile::<P, G, 4, A8>(g, grp, t);
            t += 4;
        }
        match nt - t {
            3 => tile::<P, G, 3, A8>(g, grp, t),
            2 => tile::<P, G, 2, A8>(g, grp, t),
            1 => tile::<P, G, 1, A8>(g, grp, t),
            _ => {}
        }
    }
}

crate::x8::packed_type_table!();

/// The MXFP4 x8 matmul (every x86 table uses it; see `crate::x8::matmul_fn`).
pub(crate) fn matmul_mxfp4(mut g: MatmulArgs<'_>) {
    // SAFETY: reachable only from the x86 tables, which exist only on hosts with AVX2, FMA
    // and F16C, with lengths checked by `Kernels::matmul_q16_x8`.
    unsafe { run::<PMxfp4>(&mut g) }
}

/// Every group times every token with Q16 (`A8` false) or A8 activations.
///
/// # Safety
/// As for [`run_groups_as`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_as<P: Packed, const A8: bool>(g: &mut MatmulArgs<'_>) {
    // SAFETY: forwarded.
    unsafe { run_groups_as::<P, A8>(g, 0, g.nrows / ROWS) }
}

crate::x8::a8_type_table!();
