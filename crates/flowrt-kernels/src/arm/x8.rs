//! NEON matmuls on x8-packed weights (see `crate::x8`) with Q16 activations: the AVX2 kernels'
//! structure (`crate::x86::x8`) in 128-bit registers.
//!
//! A packed 32-byte vector of 8 rows is two NEON registers, rows 0-3 and rows 4-7; each 32-bit
//! lane holds one row's weight pair `(lo, hi)` as two 16-bit lanes. NEON has no `vpmaddwd`, so
//! `vmlal_s16` / `vmlal_high_s16` multiply each 16-bit lane by the activation pair repeated
//! (`a0, a1, a0, a1, ...`) into its own 32-bit lane: an accumulator holds `lo * a0` and
//! `hi * a1` of two rows side by side, and one pairwise add per block (`vpaddq_s32`) gives the
//! rows' sums. A tile is one group of 8 rows by up to 4 tokens.
//!
//! Tested against the scalar reference by the same property tests as the other tables (run
//! under `qemu-aarch64` on the x86-64 development machine); its speed has not been measured
//! on ARM hardware.

use super::arch::*;
use super::load4;

use flowrt_dtype::GgmlType;

use crate::blocks::QK;
use crate::q16::Q16_BLOCK_BYTES;
use crate::x8::ROWS;
use crate::{MatmulArgs, MatmulFn};

/// Rows 0-3 and rows 4-7 of a group: one float (or integer sum) per row.
type Rows8 = (float32x4_t, float32x4_t);

/// A packed type: its block size and how its chunks widen to 16-bit weight pairs (as in the
/// AVX2 kernels' `Packed`).
trait Packed {
    /// Bytes of one packed unit (8 rows x 32 values, or x 256 for the k-quants).
    const BYTES: usize;
    /// Offset of the quants in a packed unit.
    const Q: usize;
    /// 32-value sub-blocks per unit.
    const SUBS: usize = 1;
    /// Bytes from one sub-block's quants to the next's.
    const STRIDE: usize = 128;
    /// Bits per weight: 4, 5 or 6 (nibbles, then 0, 1 or 2 high-bit planes) or 8.
    const BITS: u32;
    /// Whether the 4-bit codes index the doubled E2M1 table (MXFP4) instead of being
    /// unsigned values.
    const E2M1: bool = false;
    /// The 8 rows' scales of sub-block `s`, and their offset terms' factors (`m` for Q4_1,
    /// `-8 d` for Q4_0, `-dmin m_s` for the k-quants, nothing for Q8_0 and Q6_K).
    ///
    /// # Safety
    /// `p` points to a whole packed unit.
    unsafe fn scales(p: *const u8, s: usize) -> (Rows8, Option<Rows8>);
    /// Q6_K only: the 8 rows' `d * sc` of 16-value sub-block `j`.
    ///
    /// # Safety
    /// As for [`Packed::scales`].
    unsafe fn half_scales(_p: *const u8, _j: usize) -> Rows8 {
        unreachable!("only 6-bit packed types have a scale per 16 values")
    }
}

/// 8 little-endian f16 at `p` as f32.
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> Rows8 {
    // SAFETY: the caller guarantees 16 readable bytes.
    unsafe { (load4(p.cast()), load4(p.add(8).cast())) }
}

/// 8 bytes at `p` (unsigned, or signed with `SIGNED`) as f32.
///
/// # Safety
/// 8 readable bytes at `p`.
#[inline(always)]
unsafe fn bytes8<const SIGNED: bool>(p: *const u8) -> Rows8 {
    // SAFETY: the caller guarantees 8 readable bytes.
    unsafe {
        if SIGNED {
            let w = vmovl_s8(vld1_s8(p.cast()));
            (
                vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))),
                vcvtq_f32_s32(vmovl_high_s16(w)),
            )
        } else {
            let w = vmovl_u8(vld1_u8(p));
            (
                vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))),
                vcvtq_f32_u32(vmovl_high_u16(w)),
            )
        }
    }
}

fn mul(a: Rows8, b: Rows8) -> Rows8 {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { (vmulq_f32(a.0, b.0), vmulq_f32(a.1, b.1)) }
}

fn mul_n(a: Rows8, n: f32) -> Rows8 {
    // SAFETY: as above.
    unsafe { (vmulq_n_f32(a.0, n), vmulq_n_f32(a.1, n)) }
}

struct P4_0;
struct P4_1;
struct P5_0;
struct P5_1;
struct P8_0;
struct P4K;
struct P5K;
struct P6K;
struct PMxfp4;

impl Packed for P4_0 {
    const BYTES: usize = 144;
    const Q: usize = 16;
    const BITS: u32 = 4;
    unsafe fn scales(p: *const u8, _: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        let d = unsafe { f16x8(p) };
        (d, Some(mul_n(d, -8.0)))
    }
}

impl Packed for P4_1 {
    const BYTES: usize = 160;
    const Q: usize = 32;
    const BITS: u32 = 4;
    unsafe fn scales(p: *const u8, _: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: 8 f16 scales, then 8 f16 minimums.
        unsafe { (f16x8(p), Some(f16x8(p.add(16)))) }
    }
}

impl Packed for P5_0 {
    const BYTES: usize = 176;
    const Q: usize = 16;
    const BITS: u32 = 5;
    unsafe fn scales(p: *const u8, _: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        let d = unsafe { f16x8(p) };
        (d, Some(mul_n(d, -16.0)))
    }
}

impl Packed for P5_1 {
    const BYTES: usize = 192;
    const Q: usize = 32;
    const BITS: u32 = 5;
    unsafe fn scales(p: *const u8, s: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: laid out as Q4_1's header.
        unsafe { P4_1::scales(p, s) }
    }
}

impl Packed for P8_0 {
    const BYTES: usize = 272;
    const Q: usize = 16;
    const BITS: u32 = 8;
    unsafe fn scales(p: *const u8, _: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        (unsafe { f16x8(p) }, None)
    }
}

impl Packed for P4K {
    const BYTES: usize = 1184;
    const Q: usize = 160;
    const SUBS: usize = 8;
    const BITS: u32 = 4;
    unsafe fn scales(p: *const u8, s: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: d and dmin (8 f16 each), then the sub-block scales and mins as bytes,
        // [sub-block][row], at 32 and 96.
        unsafe {
            let (d, dmin) = (f16x8(p), f16x8(p.add(16)));
            (
                mul(d, bytes8::<false>(p.add(32 + 8 * s))),
                Some(mul_n(mul(dmin, bytes8::<false>(p.add(96 + 8 * s))), -1.0)),
            )
        }
    }
}

impl Packed for P5K {
    const BYTES: usize = 1440;
    const Q: usize = 160;
    const SUBS: usize = 8;
    const STRIDE: usize = 160;
    const BITS: u32 = 5;
    unsafe fn scales(p: *const u8, s: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: laid out as Q4_K's header.
        unsafe { P4K::scales(p, s) }
    }
}

impl Packed for P6K {
    const BYTES: usize = 1680;
    const Q: usize = 144;
    const SUBS: usize = 8;
    const STRIDE: usize = 192;
    const BITS: u32 = 6;
    unsafe fn scales(p: *const u8, _: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: a packed unit starts with 8 f16 scales.
        (unsafe { f16x8(p) }, None)
    }
    unsafe fn half_scales(p: *const u8, j: usize) -> Rows8 {
        // SAFETY: d (8 f16), then the 16 sub-block scales of 8 rows as signed bytes,
        // [sub-block][row], at 16.
        unsafe { mul(f16x8(p), bytes8::<true>(p.add(16 + 8 * j))) }
    }
}

impl Packed for PMxfp4 {
    const BYTES: usize = 136;
    const Q: usize = 8;
    const BITS: u32 = 4;
    const E2M1: bool = true;
    unsafe fn scales(p: *const u8, _: usize) -> (Rows8, Option<Rows8>) {
        // SAFETY: a packed MXFP4 unit starts with the 8 rows' E8M0 exponent bytes; half of
        // each scale goes with the doubled E2M1 values (`blocks::mxfp4_half_scale`, exact).
        unsafe {
            let d: [f32; 8] = std::array::from_fn(|r| crate::blocks::mxfp4_half_scale(*p.add(r)));
            ((vld1q_f32(d.as_ptr()), vld1q_f32(d.as_ptr().add(4))), None)
        }
    }
}

/// One row pair's weights times an activation pair: `acc` holds `lo * a0, hi * a1` for rows
/// `(0, 1)` of the low half and `(2, 3)` of the high half, in two accumulators.
#[inline(always)]
fn madd(acc: &mut [int32x4_t; 2], w: int16x8_t, ap: int16x8_t) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe {
        acc[0] = vmlal_s16(acc[0], vget_low_s16(w), vget_low_s16(ap));
        acc[1] = vmlal_high_s16(acc[1], w, ap);
    }
}

/// The activation pair `p` (two i16) repeated over 8 lanes.
///
/// # Safety
/// 4 readable bytes at `p`.
#[inline(always)]
unsafe fn pair(p: *const u8) -> int16x8_t {
    // SAFETY: the caller guarantees 4 readable bytes.
    unsafe { vreinterpretq_s16_s32(vdupq_n_s32(p.cast::<i32>().read_unaligned())) }
}

/// Bits `from..from + n` of every 16-bit lane of `h`, moved to `to..to + n` (others cleared).
#[inline(always)]
fn bits_to(h: uint16x8_t, from: u32, to: u32, n: u32) -> uint16x8_t {
    // SAFETY: NEON baseline. `vshlq_u16` shifts left by a positive count, right by a negative.
    unsafe {
        let v = vshlq_u16(h, vdupq_n_s16(to as i16 - from as i16));
        vandq_u16(v, vdupq_n_u16((((1u32 << n) - 1) << to) as u16))
    }
}

/// Integer sums of one group's 8 rows for `T` tokens: `acc[t][half]` as in [`madd`], halves
/// 0-1 for rows 0-3 (two accumulators) and 2-3 for rows 4-7.
type Isum<const T: usize> = [[[int32x4_t; 2]; 2]; T];

/// Adds the products of a group's 4-bit block (units `u0..u1`; `HB` high-bit planes after
/// the nibbles complete 5- or 6-bit values, 6-bit ones centred by -32) to `acc` for the `T`
/// tokens whose Q16 block quants start at `a[t]`.
///
/// # Safety
/// `q` points to a block's quants (and its high-bit planes after them), each `a[t]` to 64
/// readable bytes.
#[inline(always)]
unsafe fn dots4<const T: usize, const HB: usize, const E2M1: bool>(
    q: *const u8,
    a: &[*const u8; T],
    acc: &mut Isum<T>,
    u0: usize,
    u1: usize,
) {
    // SAFETY: a 4-bit block has 4 units of 32 bytes at q, then HB planes of 32 bytes; unit u
    // pairs with activation values 8u..8u+8 at bytes 16u..16u+16 of each a[t].
    unsafe {
        let m = vdupq_n_u16(0x000F);
        let lut = vld1q_s8(crate::blocks::MXFP4_KVALUES.as_ptr());
        let mut h = [[vdupq_n_u16(0); 2]; 2];
        for (i, h) in h.iter_mut().enumerate().take(HB) {
            *h = [
                vld1q_u16(q.add(128 + 32 * i).cast()),
                vld1q_u16(q.add(128 + 32 * i + 16).cast()),
            ];
        }
        for u in u0..u1 {
            let raw = [
                vld1q_u16(q.add(32 * u).cast()),
                vld1q_u16(q.add(32 * u + 16).cast()),
            ];
            // The nibbles of each 16-bit lane (bits 0..4, 8..12, 4..8, 12..16) in turn.
            for i in 0..4 {
                let mut w = [vdupq_n_s16(0); 2];
                for half in 0..2 {
                    let r = raw[half];
                    let mut x = match i {
                        0 => vandq_u16(r, m),
                        1 => vandq_u16(vshrq_n_u16::<8>(r), m),
                        2 => vandq_u16(vshrq_n_u16::<4>(r), m),
                        _ => vshrq_n_u16::<12>(r),
                    };
                    if HB == 1 {
                        x = vorrq_u16(x, bits_to(h[0][half], (4 * u + i) as u32, 4, 1));
                    }
                    if HB == 2 {
                        let f = (2 * (4 * (u % 2) + i)) as u32;
                        x = vorrq_u16(x, bits_to(h[u / 2][half], f, 4, 2));
                    }
                    w[half] = if E2M1 {
                        // Each lane's code (its high byte 0) looked up in the doubled E2M1
                        // table: the value lands in the low byte, sign-extended to 16 bits.
                        let v = vqtbl1q_s8(lut, vreinterpretq_u8_u16(x));
                        vshrq_n_s16::<8>(vshlq_n_s16::<8>(vreinterpretq_s16_s8(v)))
                    } else {
                        vreinterpretq_s16_u16(x)
                    };
                    if HB == 2 {
                        // 6-bit values are centred.
                        w[half] = vsubq_s16(w[half], vdupq_n_s16(32));
                    }
                }
                for t in 0..T {
                    let ap = pair(a[t].add(16 * u + 4 * i));
                    madd(&mut acc[t][0], w[0], ap);
                    madd(&mut acc[t][1], w[1], ap);
                }
            }
        }
    }
}

/// Adds the products of a group's 8-bit block to `acc` for the `T` tokens whose Q16 block
/// quants start at `a[t]`.
///
/// # Safety
/// `q` points to a block's 256 quant bytes, each `a[t]` to 64 readable bytes.
#[inline(always)]
unsafe fn dots8<const T: usize>(q: *const u8, a: &[*const u8; T], acc: &mut Isum<T>) {
    // SAFETY: chunk c (16 bytes at q + 16c) pairs with activation values 2c, 2c+1 at bytes
    // 4c..4c+4 of each a[t].
    unsafe {
        for c in 0..QK / 2 {
            let x = vld1q_s8(q.add(16 * c).cast());
            let w = [vmovl_s8(vget_low_s8(x)), vmovl_high_s8(x)];
            for t in 0..T {
                let ap = pair(a[t].add(4 * c));
                madd(&mut acc[t][0], w[0], ap);
                madd(&mut acc[t][1], w[1], ap);
            }
        }
    }
}

/// `acc += isum * scale * da` (8 rows), `isum` as [`Isum`]'s per-token entry.
#[inline(always)]
fn scale_into(acc: &mut Rows8, isum: &[[int32x4_t; 2]; 2], d: Rows8, da: f32) {
    // SAFETY: NEON baseline.
    unsafe {
        let lo = vcvtq_f32_s32(vpaddq_s32(isum[0][0], isum[0][1]));
        let hi = vcvtq_f32_s32(vpaddq_s32(isum[1][0], isum[1][1]));
        acc.0 = vfmaq_f32(acc.0, lo, vmulq_n_f32(d.0, da));
        acc.1 = vfmaq_f32(acc.1, hi, vmulq_n_f32(d.1, da));
    }
}

/// Group `grp` (rows `8 grp..8 grp + 8`) times tokens `t0..t0 + T`.
///
/// # Safety
/// The group and tokens exist in `g` (lengths checked by `Kernels::matmul_q16_x8`).
#[inline(always)]
unsafe fn tile<P: Packed, const T: usize>(g: &mut MatmulArgs<'_>, grp: usize, t0: usize) {
    let nb = g.k / QK;
    let astride = nb * Q16_BLOCK_BYTES;
    let units = nb / P::SUBS;
    let wg = g.w.as_ptr().wrapping_add(grp * units * P::BYTES);
    let a = g.a.as_ptr();
    // SAFETY: NEON baseline.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut acc: [Rows8; T] = [(zero, zero); T];
    // SAFETY (loop): block b of the group and of tokens t0..t0+T lies inside `g.w` / `g.a`.
    unsafe {
        let z = vdupq_n_s32(0);
        for b in 0..nb {
            let (unit, s) = (b / P::SUBS, b % P::SUBS);
            let p = wg.add(unit * P::BYTES);
            let ab: [*const u8; T] =
                std::array::from_fn(|t| a.add((t0 + t) * astride + b * Q16_BLOCK_BYTES));
            let aq: [*const u8; T] = std::array::from_fn(|t| ab[t].add(8));
            let da: [f32; T] = std::array::from_fn(|t| ab[t].cast::<f32>().read_unaligned());
            let q = p.add(P::Q + P::STRIDE * s);
            if P::BITS == 6 {
                // A scale per 16 values: each half's integer sums are scaled on their own.
                for half in 0..2 {
                    let mut isum: Isum<T> = [[[z; 2]; 2]; T];
                    dots4::<T, 2, false>(q, &aq, &mut isum, 2 * half, 2 * half + 2);
                    let dsc = P::half_scales(p, 2 * s + half);
                    for t in 0..T {
                        scale_into(&mut acc[t], &isum[t], dsc, da[t]);
                    }
                }
                continue;
            }
            let mut isum: Isum<T> = [[[z; 2]; 2]; T];
            match P::BITS {
                8 => dots8::<T>(q, &aq, &mut isum),
                5 => dots4::<T, 1, false>(q, &aq, &mut isum, 0, 4),
                _ if P::E2M1 => dots4::<T, 0, true>(q, &aq, &mut isum, 0, 4),
                _ => dots4::<T, 0, false>(q, &aq, &mut isum, 0, 4),
            }
            let (d, off) = P::scales(p, s);
            for t in 0..T {
                scale_into(&mut acc[t], &isum[t], d, da[t]);
                if let Some(m) = off {
                    let sa = ab[t].add(4).cast::<f32>().read_unaligned();
                    acc[t].0 = vfmaq_n_f32(acc[t].0, m.0, sa);
                    acc[t].1 = vfmaq_n_f32(acc[t].1, m.1, sa);
                }
            }
        }
        let out = g.out.as_mut_ptr();
        for (t, acc) in acc.iter().enumerate() {
            let o = out.add((t0 + t) * g.out_stride + grp * ROWS);
            vst1q_f32(o, acc.0);
            vst1q_f32(o.add(4), acc.1);
        }
    }
}

/// Every group times every token, in tiles of 4 tokens and then the remainder.
///
/// # Safety
/// As for [`tile`]; `g.nrows` is a multiple of 8.
unsafe fn run<P: Packed>(g: &mut MatmulArgs<'_>) {
    let (ng, nt) = (g.nrows / ROWS, g.ntok);
    // SAFETY: every tile stays within the groups and tokens of `g`.
    unsafe {
        for grp in 0..ng {
            let mut t = 0;
            while t + 4 <= nt {
                tile::<P, 4>(g, grp, t);
                t += 4;
            }
            match nt - t {
                3 => tile::<P, 3>(g, grp, t),
                2 => tile::<P, 2>(g, grp, t),
                1 => tile::<P, 1>(g, grp, t),
                _ => {}
            }
        }
    }
}

crate::x8::packed_type_table!();

/// The MXFP4 x8 matmul (see `crate::x8::matmul_fn`): Q4_0's kernel with each code looked up
/// in the doubled E2M1 table, so the integer sums are exact, as in the scalar reference.
pub(crate) fn matmul_mxfp4(g: MatmulArgs<'_>) {
    entry::<PMxfp4>(g)
}
