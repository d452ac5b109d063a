//! AVX-512 matmuls on x8-packed weights (see `crate::x8`) with Q16 activations: two groups of
//! 8 rows per 512-bit vector.
//!
//! The x8 layout puts one row in each 32-bit lane of a 256-bit vector; a 512-bit vector holds
//! the same unit of two adjacent groups (16 rows), so each weight widening (mask, shift),
//! each multiply-add and each block's scaling serves 16 rows instead of 8, and a tile's
//! outputs are 16 adjacent floats. With AVX-512 VNNI the multiply-add is one `vpdpwssd`
//! (`acc + w0 a0 + w1 a1` per 32-bit lane) in place of `vpmaddwd` + `vpaddd`.
//!
//! The arithmetic is the AVX2 kernel's (`x86/x8.rs`) lane for lane: the same exact integer sum
//! per block (`vpdpwssd` wraps like `vpmaddwd` + `vpaddd`), converted and scaled by the same
//! f32 operations in the same order, so every output equals the AVX2 table's bit for bit (a
//! test checks this). A task with an odd number of groups does its last one with the AVX2
//! kernel, and a single token (decode, bound by memory) runs the AVX2 kernel throughout.
//!
//! MXFP4 has kernels here too (the AVX2 kernel's E2M1 lookup on 512-bit vectors).
//!
//! With A8 activations (`crate::a8`, the opt-in `act-quant=q8x`), the unsigned 4- to 6-bit
//! weights meet 4 broadcast activation bytes per 32-bit lane in `dotb`: one `vpdpbusd` with
//! VNNI (no 16-bit intermediate sums to widen), `vpmaddubsw` + `vpmaddwd` + `vpaddd` without.
//! Their integer block sums are exact, and the f32 epilogue is the AVX2 A8 tile's, so these
//! equal the AVX2 table's A8 outputs bit for bit too.
//!
//! [`x8_512_kernels!`] stamps the kernels out for one set of target features; the invoking
//! module supplies `dot(acc, w, a) -> __m512i`, the per-lane `acc + w0 a0 + w1 a1` on 16-bit
//! pairs, and `dotb(acc, w, a)`, the per-lane sum of 4 unsigned-by-signed byte products.

macro_rules! x8_512_kernels {
    (features: $f:literal) => {
        use core::arch::x86_64::*;

        use flowrt_dtype::GgmlType;

        use super::super::x8::{
            self as x8_256, PMxfp4, Packed, P4K, P4_0, P4_1, P5K, P5_0, P5_1, P6K, P8_0,
        };
        use crate::a8::A8_BLOCK_BYTES;
        use crate::blocks::QK;
        use crate::q16::Q16_BLOCK_BYTES;
        use crate::x8::ROWS;
        use crate::{MatmulArgs, MatmulFn};

        /// How far ahead of the block being multiplied each group's weight stream is
        /// prefetched, in bytes.
        const PREFETCH_BYTES: usize = 2048;

        /// The 32 bytes at `lo` and at `hi` as one vector (low half, high half).
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn load2(lo: *const u8, hi: *const u8) -> __m512i {
            // SAFETY: the caller guarantees 32 readable bytes at each pointer.
            unsafe {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(lo.cast())),
                    _mm256_loadu_si256(hi.cast()),
                )
            }
        }

        /// Two 16-bit values at `p`, broadcast to every 32-bit lane.
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn pair(p: *const u8) -> __m512i {
            // SAFETY: the caller guarantees 4 readable bytes at p.
            _mm512_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
        }

        /// Bits `from..from + n` of every 16-bit lane of `h`, moved to `to..to + n` (the others
        /// cleared).
        #[inline]
        #[target_feature(enable = $f)]
        fn bits_to(h: __m512i, from: u32, to: u32, n: u32) -> __m512i {
            // Constants after unrolling: the shifts by a count become shifts by an immediate.
            let v = if from >= to {
                _mm512_srl_epi16(h, _mm_cvtsi32_si128((from - to) as i32))
            } else {
                _mm512_sll_epi16(h, _mm_cvtsi32_si128((to - from) as i32))
            };
            _mm512_and_si512(v, _mm512_set1_epi16((((1 << n) - 1) << to) as i16))
        }

        /// Two groups' scales (and offset factors) of sub-block `s`: group `p[0]`'s in the
        /// low 8 lanes, `p[1]`'s in the high 8.
        ///
        /// # Safety
        /// Each pointer is a whole packed unit of `P`.
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn scales2<P: Packed>(p: [*const u8; 2], s: usize) -> (__m512, Option<__m512>) {
            // SAFETY: forwarded.
            let ((d0, o0), (d1, o1)) = unsafe { (P::scales(p[0], s), P::scales(p[1], s)) };
            let d = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(d0), d1);
            let o = match (o0, o1) {
                (Some(o0), Some(o1)) => {
                    Some(_mm512_insertf32x8::<1>(_mm512_castps256_ps512(o0), o1))
                }
                _ => None,
            };
            (d, o)
        }

        /// Two groups' `d * sc` of 16-value sub-block `j` (Q6_K).
        ///
        /// # Safety
        /// As for [`scales2`].
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn half_scales2<P: Packed>(p: [*const u8; 2], j: usize) -> __m512 {
            // SAFETY: forwarded.
            let (a, b) = unsafe { (P::half_scales(p[0], j), P::half_scales(p[1], j)) };
            _mm512_insertf32x8::<1>(_mm512_castps256_ps512(a), b)
        }

        /// Adds the products of `G` group pairs' 4-bit blocks (units `u0..u1`; `HB` high-bit
        /// planes after the nibbles complete 5- or 6-bit values, 6-bit ones centred by -32) to
        /// `acc[g][t]` for the `T` tokens whose Q16 block quants (32 i16) start at `a[t]`.
        ///
        /// # Safety
        /// Each `q[g][h]` points to a block's quants (and its high-bit planes after them), each
        /// `a[t]` to 64 readable bytes.
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn dots4<const G: usize, const T: usize, const HB: usize>(
            q: &[[*const u8; 2]; G],
            a: &[*const u8; T],
            acc: &mut [[__m512i; T]; G],
            u0: usize,
            u1: usize,
        ) {
            let m = _mm512_set1_epi16(0x000F);
            // SAFETY: as in the AVX2 kernel, for each of the two groups of a pair.
            unsafe {
                let mut h = [[_mm512_setzero_si512(); 2]; G];
                for (g, h) in h.iter_mut().enumerate() {
                    for (i, h) in h.iter_mut().enumerate().take(HB) {
                        *h = load2(q[g][0].add(128 + 32 * i), q[g][1].add(128 + 32 * i));
                    }
                }
                for u in u0..u1 {
                    let raw: [__m512i; G] =
                        std::array::from_fn(|g| load2(q[g][0].add(32 * u), q[g][1].add(32 * u)));
                    for i in 0..4 {
                        let mut w = [_mm512_setzero_si512(); G];
                        for (g, w) in w.iter_mut().enumerate() {
                            *w = match i {
                                0 => _mm512_and_si512(raw[g], m),
                                1 => _mm512_and_si512(_mm512_srli_epi16::<8>(raw[g]), m),
                                2 => _mm512_and_si512(_mm512_srli_epi16::<4>(raw[g]), m),
                                _ => _mm512_srli_epi16::<12>(raw[g]),
                            };
                            if HB == 1 {
                                *w =
                                    _mm512_or_si512(*w, bits_to(h[g][0], (4 * u + i) as u32, 4, 1));
                            }
                            if HB == 2 {
                                let f = (2 * (4 * (u % 2) + i)) as u32;
                                *w = _mm512_or_si512(*w, bits_to(h[g][u / 2], f, 4, 2));
                                *w = _mm512_sub_epi16(*w, _mm512_set1_epi16(32));
                            }
                        }
                        for t in 0..T {
                            let ap = pair(a[t].add(16 * u + 4 * i));
                            for g in 0..G {
                                acc[g][t] = dot(acc[g][t], w[g], ap);
                            }
                        }
                    }
                }
            }
        }

        /// Adds the products of `G` group pairs' MXFP4 blocks to `acc[g][t]` for the `T` tokens
        /// whose Q16 block quants start at `a[t]`: the AVX2 kernel's E2M1 lookup
        /// (`x86/x8.rs`'s `dots_e2m1`) on two groups at once.
        ///
        /// # Safety
        /// Each `q[g][h]` points to a block's 128 code bytes, each `a[t]` to 64 readable bytes.
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn dots_e2m1<const G: usize, const T: usize>(
            q: &[[*const u8; 2]; G],
            a: &[*const u8; T],
            acc: &mut [[__m512i; T]; G],
        ) {
            let lut = _mm512_broadcast_i32x4(_mm_setr_epi8(
                0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
            ));
            let m = _mm512_set1_epi8(0x0F);
            // SAFETY: as in the AVX2 kernel, for each of the two groups of a pair.
            unsafe {
                for u in 0..QK / 8 {
                    let mut lo = [_mm512_setzero_si512(); G];
                    let mut hi = [_mm512_setzero_si512(); G];
                    for g in 0..G {
                        let raw = load2(q[g][0].add(32 * u), q[g][1].add(32 * u));
                        lo[g] = _mm512_shuffle_epi8(lut, _mm512_and_si512(raw, m));
                        hi[g] = _mm512_shuffle_epi8(
                            lut,
                            _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m),
                        );
                    }
                    for i in 0..4 {
                        let mut w = [_mm512_setzero_si512(); G];
                        for (g, w) in w.iter_mut().enumerate() {
                            *w = match i {
                                0 => _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(lo[g])),
                                1 => _mm512_srai_epi16::<8>(lo[g]),
                                2 => _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(hi[g])),
                                _ => _mm512_srai_epi16::<8>(hi[g]),
                            };
                        }
                        for t in 0..T {
                            let ap = pair(a[t].add(16 * u + 4 * i));
                            for g in 0..G {
                                acc[g][t] = dot(acc[g][t], w[g], ap);
                            }
                        }
                    }
                }
            }
        }

        /// Adds the products of `G` group pairs' 8-bit blocks to `acc[g][t]` for the `T`
        /// tokens whose Q16 block quants start at `a[t]`.
        ///
        /// # Safety
        /// Each `q[g][h]` points to a block's quants, each `a[t]` to 64 readable bytes.
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn dots8<const G: usize, const T: usize>(
            q: &[[*const u8; 2]; G],
            a: &[*const u8; T],
            acc: &mut [[__m512i; T]; G],
        ) {
            // SAFETY: an 8-bit block has 16 chunks of 16 bytes at each q[g][h]; chunk c pairs
            // with activation values 2c, 2c+1 at bytes 4c..4c+4 of each a[t].
            unsafe {
                for c in 0..QK / 2 {
                    let x: [__m512i; G] = std::array::from_fn(|g| {
                        _mm512_cvtepi8_epi16(_mm256_loadu2_m128i(
                            q[g][1].add(16 * c).cast(),
                            q[g][0].add(16 * c).cast(),
                        ))
                    });
                    for t in 0..T {
                        let av = pair(a[t].add(4 * c));
                        for g in 0..G {
                            acc[g][t] = dot(acc[g][t], x[g], av);
                        }
                    }
                }
            }
        }

        /// With A8 activations (see `crate::a8`): adds the products of `G` group pairs'
        /// 4-bit blocks (units `u0..u1`) to `acc[g][t]` for the `T` tokens whose A8 quants
        /// start at `a[t]`, as the AVX2 kernel (`x86/x8.rs`'s `dots4_a8`, `dots6_a8`) does for
        /// one group: the unsigned codes (`HB` = 1: a high-bit plane completes 5-bit values;
        /// `HB` = 2: two planes, one per 16-value half, complete Q6_K's 6-bit `q + 32`, whose
        /// `-32` the caller takes back through the half's activation sum; with `E2M1`, MXFP4's
        /// codes looked up as the doubled E2M1 values plus 12) meet 4 broadcast activation
        /// bytes in one `dotb` per half unit, straight into the 32-bit sums.
        ///
        /// # Safety
        /// Each `q[g][h]` points to a block's 128 quant bytes (and its `HB` high-bit planes
        /// after them), each `a[t]` to 32 readable bytes.
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn dots4_a8<const G: usize, const T: usize, const HB: usize, const E2M1: bool>(
            q: &[[*const u8; 2]; G],
            a: &[*const u8; T],
            acc: &mut [[__m512i; T]; G],
            u0: usize,
            u1: usize,
        ) {
            let m = _mm512_set1_epi8(0x0F);
            let lut = _mm512_broadcast_i32x4(_mm_setr_epi8(
                12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
            ));
            // SAFETY: as the contract says; unit u pairs with activation bytes 8u..8u+8.
            unsafe {
                // The plane of units u0..u1 (HB = 2: one per two units).
                let h: [__m512i; G] = std::array::from_fn(|g| {
                    let plane = 128 + 32 * (u0 / 2) * (HB == 2) as usize;
                    if HB > 0 {
                        load2(q[g][0].add(plane), q[g][1].add(plane))
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                for u in u0..u1 {
                    let raw: [__m512i; G] =
                        std::array::from_fn(|g| load2(q[g][0].add(32 * u), q[g][1].add(32 * u)));
                    for half in 0..2 {
                        let mut w = [_mm512_setzero_si512(); G];
                        for (g, w) in w.iter_mut().enumerate() {
                            *w = if half == 0 {
                                _mm512_and_si512(raw[g], m)
                            } else {
                                _mm512_and_si512(_mm512_srli_epi16::<4>(raw[g]), m)
                            };
                            if E2M1 {
                                *w = _mm512_shuffle_epi8(lut, *w);
                            }
                            if HB == 1 {
                                // Positions 2 half and 2 half + 1 of unit u: the low and the
                                // high byte of each 16-bit lane, their fifth bits at 4 and 12.
                                let p = (4 * u + 2 * half) as u32;
                                *w = _mm512_or_si512(*w, bits_to(h[g], p, 4, 1));
                                *w = _mm512_or_si512(*w, bits_to(h[g], p + 1, 12, 1));
                            }
                            if HB == 2 {
                                // The same positions' 2-bit fields (see `crate::x8`).
                                let f = (2 * (4 * (u % 2) + 2 * half)) as u32;
                                *w = _mm512_or_si512(*w, bits_to(h[g], f, 4, 2));
                                *w = _mm512_or_si512(*w, bits_to(h[g], f + 2, 12, 2));
                            }
                        }
                        for t in 0..T {
                            let av = pair(a[t].add(8 * u + 4 * half));
                            for g in 0..G {
                                acc[g][t] = dotb(acc[g][t], w[g], av);
                            }
                        }
                    }
                }
            }
        }

        /// Groups `grp..grp + 2G` (rows `8 grp..8 (grp + 2G)`) times tokens `t0..t0 + T`, with
        /// Q16 activations, or A8 ones (`A8`; `P` then a 4-, 5- or 6-bit type or MXFP4). The
        /// integer block sums are exact and are offset, converted and scaled by the AVX2 tile's
        /// f32 operations in its order, so the outputs equal its bit for bit.
        ///
        /// # Safety
        /// The groups and tokens exist in `g` (lengths checked by `Kernels::matmul_q16_x8` /
        /// `Kernels::matmul_a8_x8`).
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn tile<P: Packed, const G: usize, const T: usize, const A8: bool>(
            g: &mut MatmulArgs<'_>,
            grp: usize,
            t0: usize,
        ) {
            let nb = g.k / QK;
            let ablock = if A8 { A8_BLOCK_BYTES } else { Q16_BLOCK_BYTES };
            let astride = nb * ablock;
            let units = nb / P::SUBS;
            let wg: [[*const u8; 2]; G] = std::array::from_fn(|i| {
                std::array::from_fn(|h| {
                    g.w.as_ptr()
                        .wrapping_add((grp + 2 * i + h) * units * P::BYTES)
                })
            });
            let wend = g.w.as_ptr().wrapping_add(g.w.len());
            let a = g.a.as_ptr();
            let mut acc = [[_mm512_setzero_ps(); T]; G];
            // SAFETY (loop): block b of the groups and of tokens t0..t0+T lies inside `g.w` /
            // `g.a`.
            unsafe {
                for b in 0..nb {
                    let (unit, s) = (b / P::SUBS, b % P::SUBS);
                    let p: [[*const u8; 2]; G] = std::array::from_fn(|i| {
                        std::array::from_fn(|h| wg[i][h].add(unit * P::BYTES))
                    });
                    let share = P::BYTES / P::SUBS;
                    for p in p.iter().flatten() {
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
                    // A8 blocks hold the integer sum of their quants (Q16 blocks `d * sum`).
                    let asum: [i32; T] = std::array::from_fn(|t| {
                        if A8 {
                            ab[t].add(4).cast::<i32>().read_unaligned()
                        } else {
                            0
                        }
                    });
                    let q: [[*const u8; 2]; G] = std::array::from_fn(|i| {
                        std::array::from_fn(|h| p[i][h].add(P::Q + P::STRIDE * s))
                    });
                    if P::BITS == 6 {
                        for half in 0..2 {
                            let mut isum = [[_mm512_setzero_si512(); T]; G];
                            if A8 {
                                let u = 2 * half;
                                dots4_a8::<G, T, 2, false>(&q, &aq, &mut isum, u, u + 2);
                                // The -32 of every value, through the half's activation sum.
                                for t in 0..T {
                                    let lo = x8_256::a8_first_half_sum(aq[t]);
                                    let h = if half == 0 { lo } else { asum[t] - lo };
                                    let c = _mm512_set1_epi32(-32 * h);
                                    for i in 0..G {
                                        isum[i][t] = _mm512_add_epi32(isum[i][t], c);
                                    }
                                }
                            } else {
                                dots4::<G, T, 2>(&q, &aq, &mut isum, 2 * half, 2 * half + 2);
                            }
                            for i in 0..G {
                                let dsc = half_scales2::<P>(p[i], 2 * s + half);
                                for t in 0..T {
                                    let da = _mm512_set1_ps(ab[t].cast::<f32>().read_unaligned());
                                    acc[i][t] = _mm512_fmadd_ps(
                                        _mm512_cvtepi32_ps(isum[i][t]),
                                        _mm512_mul_ps(dsc, da),
                                        acc[i][t],
                                    );
                                }
                            }
                        }
                        continue;
                    }
                    let mut isum = [[_mm512_setzero_si512(); T]; G];
                    match P::BITS {
                        _ if A8 && P::E2M1 => dots4_a8::<G, T, 0, true>(&q, &aq, &mut isum, 0, 4),
                        5 if A8 => dots4_a8::<G, T, 1, false>(&q, &aq, &mut isum, 0, 4),
                        _ if A8 => dots4_a8::<G, T, 0, false>(&q, &aq, &mut isum, 0, 4),
                        _ if P::E2M1 => dots_e2m1::<G, T>(&q, &aq, &mut isum),
                        8 => dots8::<G, T>(&q, &aq, &mut isum),
                        5 => dots4::<G, T, 1>(&q, &aq, &mut isum, 0, 4),
                        _ => dots4::<G, T, 0>(&q, &aq, &mut isum, 0, 4),
                    }
                    // With A8, an integer offset (Q4_0's -8, ...) goes into the integer sums.
                    let int_offset = A8 && P::A8_INT_OFFSET != 0;
                    if int_offset {
                        for t in 0..T {
                            let c = _mm512_set1_epi32(P::A8_INT_OFFSET * asum[t]);
                            for i in 0..G {
                                isum[i][t] = _mm512_add_epi32(isum[i][t], c);
                            }
                        }
                    }
                    for i in 0..G {
                        let (d, off) = scales2::<P>(p[i], s);
                        let off = if int_offset { None } else { off };
                        for t in 0..T {
                            let da_s = ab[t].cast::<f32>().read_unaligned();
                            acc[i][t] = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(isum[i][t]),
                                _mm512_mul_ps(d, _mm512_set1_ps(da_s)),
                                acc[i][t],
                            );
                            if let Some(m) = off {
                                let sa = if A8 {
                                    da_s * asum[t] as f32
                                } else {
                                    ab[t].add(4).cast::<f32>().read_unaligned()
                                };
                                acc[i][t] = _mm512_fmadd_ps(m, _mm512_set1_ps(sa), acc[i][t]);
                            }
                        }
                    }
                }
                let out = g.out.as_mut_ptr();
                for i in 0..G {
                    for t in 0..T {
                        _mm512_storeu_ps(
                            out.add((t0 + t) * g.out_stride + (grp + 2 * i) * ROWS),
                            acc[i][t],
                        );
                    }
                }
            }
        }

        /// Group pairs `grp..grp + 2G` times every token: tiles of 4 tokens, then the rest.
        ///
        /// # Safety
        /// As for [`tile`].
        #[inline]
        #[target_feature(enable = $f)]
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

        /// Every group times every token (Q16 or A8 activations): tiles of two pairs, then
        /// single pairs, and an odd last group with the AVX2 kernel.
        ///
        /// # Safety
        /// As for [`tile`]; `g.nrows` is a multiple of 8.
        #[target_feature(enable = $f)]
        unsafe fn run_as<P: Packed, const A8: bool>(g: &mut MatmulArgs<'_>) {
            let ng = g.nrows / ROWS;
            let mut grp = 0;
            // SAFETY: every tile stays within the groups and tokens of `g`; the host has
            // AVX2, FMA and F16C (a subset of this table's features).
            unsafe {
                if g.ntok == 1 {
                    // One token (decode) streams the weights from memory: the AVX2 kernel's
                    // single linear stream per group measured faster end to end (SmolLM2
                    // decode, 2 threads: 285-325 against 177-209 tok/s with group pairs),
                    // though not in cache (docs/performance.md).
                    x8_256::run_groups_as::<P, A8>(g, 0, ng);
                    return;
                }
                while grp + 4 <= ng {
                    all_tokens::<P, 2, A8>(g, grp);
                    grp += 4;
                }
                while grp + 2 <= ng {
                    all_tokens::<P, 1, A8>(g, grp);
                    grp += 2;
                }
                if grp < ng {
                    x8_256::run_groups_as::<P, A8>(g, grp, ng);
                }
            }
        }

        /// [`run_as`] with Q16 activations (the entries of `packed_type_table!`).
        ///
        /// # Safety
        /// As for [`run_as`].
        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn run<P: Packed>(g: &mut MatmulArgs<'_>) {
            // SAFETY: forwarded.
            unsafe { run_as::<P, false>(g) }
        }

        crate::x8::a8_type_table!();

        crate::x8::packed_type_table!();

        /// The MXFP4 x8 matmul of this instruction set (see `crate::x8::matmul_fn`).
        pub(crate) fn matmul_mxfp4(mut g: MatmulArgs<'_>) {
            // SAFETY: reachable only from this instruction set's table, which exists only on
            // hosts with its features, with lengths checked by `Kernels::matmul_q16_x8`.
            unsafe { run::<PMxfp4>(&mut g) }
        }
    };
}

/// AVX-512 F/BW/DQ/VL without VNNI: `vpmaddwd` + `vpaddd`.
pub(crate) mod plain {
    use core::arch::x86_64::{
        __m512i, _mm512_add_epi32, _mm512_madd_epi16, _mm512_maddubs_epi16, _mm512_set1_epi16,
    };

    /// `acc + w0 a0 + w1 a1` per 32-bit lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
    fn dot(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
        _mm512_add_epi32(acc, _mm512_madd_epi16(w, a))
    }

    /// `acc + w0 a0 + w1 a1 + w2 a2 + w3 a3` per 32-bit lane, unsigned bytes `w` times signed
    /// bytes `a`: `vpmaddubsw` (exact: the A8 weights are below 64, so a pair stays far from
    /// saturation), `vpmaddwd` by ones, `vpaddd`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
    fn dotb(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
        let pairs = _mm512_maddubs_epi16(w, a);
        _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
    }

    x8_512_kernels!(features: "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl");
}

/// AVX-512 VNNI: one `vpdpwssd` per multiply-add.
pub(crate) mod vnni {
    use core::arch::x86_64::{__m512i, _mm512_dpbusd_epi32, _mm512_dpwssd_epi32};

    /// `acc + w0 a0 + w1 a1` per 32-bit lane (wrapping, like `vpmaddwd` + `vpaddd`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    fn dot(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
        _mm512_dpwssd_epi32(acc, w, a)
    }

    /// `acc + w0 a0 + w1 a1 + w2 a2 + w3 a3` per 32-bit lane, unsigned bytes `w` times signed
    /// bytes `a` (`vpdpbusd`: one instruction, no saturation).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    fn dotb(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, w, a)
    }

    x8_512_kernels!(features: "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni");
}
