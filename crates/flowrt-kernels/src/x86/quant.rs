//! The quantised matmul tiles shared by the x86 tables.
//!
//! [`x86_quant_kernels!`] stamps out, for one set of target features, tile kernels that
//! multiply `R` weight rows by `T` activation rows at once: each weight block is loaded and
//! unpacked once and used for `T` tokens, each activation block once for `R` rows, and the
//! `R * T` accumulators stay in registers. The invoking module supplies the two integer
//! primitives, which is all that differs between AVX2 and AVX-512 VNNI:
//!
//! * `mul_sum_u8_i8_acc(acc, u, a) -> __m256i`: `acc + sum of 4 adjacent u8 * i8 products` per
//!   i32 lane (`u <= 15`, or `u == 8` splat, so AVX2's saturating `maddubs` is exact);
//! * `mul_sum_i8_i8(w, a) -> __m256i`: the same for i8 * i8 (`a` in -127..=127).
//!
//! Integer sums are exact per block; they are scaled by `d_w * d_a` in f32 per block (per lane
//! group, summed at the end), so results match the scalar reference within f32 rounding.

use crate::blocks::f16_to_f32;
use crate::MatmulArgs;
use flowrt_dtype::GgmlType;

/// Activation block scales as f32, decoded once per matmul call.
pub(super) struct Scales<'a> {
    /// Q8_0: `ds[t * nb + b]` is the scale of token `t`'s block `b`. Q8_1: `ds[2 (t nb + b)]`
    /// is that scale and `ds[2 (t nb + b) + 1]` the block's `s`.
    pub ds: &'a [f32],
    /// Q8_1 with `ntok > 1`: `st[b * sstride + t]` is the `s` of token `t`'s block `b`; each
    /// block's row has 3 spare entries so a tile can load 4 tokens' worth from any token.
    pub st: &'a [f32],
    pub sstride: usize,
}

/// Decodes the scales of `ntok` activation rows of type `act` (Q8_0 or Q8_1), `nb` blocks each,
/// and calls `f` with them. Small cases use a stack buffer (no allocation on the decode path).
pub(super) fn with_scales<R>(
    a: &[u8],
    act: GgmlType,
    nb: usize,
    ntok: usize,
    f: impl FnOnce(&Scales<'_>) -> R,
) -> R {
    let with_s = act == GgmlType::Q8_1;
    let bsize = act.type_size() as usize;
    let sstride = ntok + 3;
    let n_ds = ntok * nb * if with_s { 2 } else { 1 };
    let total = n_ds + if with_s && ntok > 1 { nb * sstride } else { 0 };
    let mut stack = [0f32; 512];
    let mut heap = Vec::new();
    let buf: &mut [f32] = if total <= stack.len() {
        &mut stack[..total]
    } else {
        heap.resize(total, 0.0);
        &mut heap
    };
    let (ds, st) = buf.split_at_mut(n_ds);
    for (i, blk) in a.chunks_exact(bsize).take(ntok * nb).enumerate() {
        let d = f16_to_f32([blk[0], blk[1]]);
        if with_s {
            let s = f16_to_f32([blk[2], blk[3]]);
            ds[2 * i] = d;
            ds[2 * i + 1] = s;
            if ntok > 1 {
                let (t, b) = (i / nb, i % nb);
                st[b * sstride + t] = s;
            }
        } else {
            ds[i] = d;
        }
    }
    f(&Scales { ds, st, sstride })
}

/// Raw view of one matmul call for the tile kernels.
///
/// Contract for a tile over rows `r0..r0 + R` and tokens `t0..t0 + T`: `r0 + R <= nrows` and
/// `t0 + T <= ntok` of the [`MatmulArgs`] this was made from (whose lengths
/// `Kernels::matmul` checked), and `T <= 4`.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub w: *const u8,
    /// Bytes per weight row.
    pub wstride: usize,
    pub a: *const u8,
    /// Bytes per activation row.
    pub astride: usize,
    /// Blocks per row.
    pub nb: usize,
    pub ds: *const f32,
    pub st: *const f32,
    pub sstride: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

impl Tile {
    pub(super) fn new(
        w: &[u8],
        wty: GgmlType,
        a: &[u8],
        k: usize,
        sc: &Scales<'_>,
        out: &mut [f32],
        out_stride: usize,
    ) -> Tile {
        Tile {
            w: w.as_ptr(),
            wstride: crate::row_size(wty, k),
            a: a.as_ptr(),
            astride: crate::row_size(crate::Kernels::vec_dot_type(wty), k),
            nb: k / crate::blocks::QK,
            ds: sc.ds.as_ptr(),
            st: sc.st.as_ptr(),
            sstride: sc.sstride,
            out: out.as_mut_ptr(),
            out_stride,
        }
    }
}

/// Tile sizes: rows per tile when decoding (one token), rows and tokens per tile otherwise.
#[derive(Clone, Copy)]
pub(super) struct TileShape {
    pub decode_rows: usize,
    pub prefill_rows: usize,
    pub prefill_toks: usize,
}

/// Walks the output in tiles: rows in blocks of about 16 KiB of weights (which stay in L1/L2
/// while every token chunk passes over them), tokens in chunks, rows within a block in tiles.
/// Calls `tile(rows, toks, r0, t0)` with `rows <= max rows` and `toks <= max toks` of `shape`.
pub(super) fn drive(
    nrows: usize,
    ntok: usize,
    wstride: usize,
    shape: TileShape,
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    let (rmax, tmax) = if ntok == 1 {
        (shape.decode_rows, 1)
    } else {
        (shape.prefill_rows, shape.prefill_toks)
    };
    let block_rows = (16 * 1024 / wstride.max(1)).max(rmax) / rmax * rmax;
    let mut rb = 0;
    while rb < nrows {
        let rend = (rb + block_rows).min(nrows);
        let mut t0 = 0;
        while t0 < ntok {
            let tt = tmax.min(ntok - t0);
            let mut r0 = rb;
            while r0 < rend {
                let rr = rmax.min(rend - r0);
                tile(rr, tt, r0, t0);
                r0 += rr;
            }
            t0 += tt;
        }
        rb = rend;
    }
}

/// Runs a quantised matmul: decodes the activation scales, then walks the output calling
/// `tile(view, rows, toks, r0, t0)`, always within the [`Tile`] contract.
pub(super) fn run_matmul(
    args: MatmulArgs<'_>,
    wty: GgmlType,
    shape: TileShape,
    tile: impl Fn(&Tile, usize, usize, usize, usize),
) {
    let MatmulArgs {
        k,
        w,
        nrows,
        a,
        ntok,
        out,
        out_stride,
    } = args;
    let nb = k / crate::blocks::QK;
    let aty = crate::Kernels::vec_dot_type(wty);
    with_scales(a, aty, nb, ntok, |sc| {
        let g = Tile::new(w, wty, a, k, sc, out, out_stride);
        drive(nrows, ntok, g.wstride, shape, |rr, tt, r0, t0| {
            tile(&g, rr, tt, r0, t0)
        });
    })
}

/// A one-row, one-token matmul.
pub(super) fn vec_dot_via(k: usize, w: &[u8], a: &[u8], matmul: crate::MatmulFn) -> f32 {
    let mut out = [0f32];
    matmul(MatmulArgs {
        k,
        w,
        nrows: 1,
        a,
        ntok: 1,
        out: &mut out,
        out_stride: 1,
    });
    out[0]
}

/// Calls `$f::<rows, toks>(args)` for run-time `rows, toks` in 1..=4.
macro_rules! dispatch_tile {
    ($f:ident, $rr:expr, $tt:expr, $($arg:expr),*) => {
        match ($rr, $tt) {
            (1, 1) => $f::<1, 1>($($arg),*),
            (1, 2) => $f::<1, 2>($($arg),*),
            (1, 3) => $f::<1, 3>($($arg),*),
            (1, 4) => $f::<1, 4>($($arg),*),
            (2, 1) => $f::<2, 1>($($arg),*),
            (2, 2) => $f::<2, 2>($($arg),*),
            (2, 3) => $f::<2, 3>($($arg),*),
            (2, 4) => $f::<2, 4>($($arg),*),
            (3, 1) => $f::<3, 1>($($arg),*),
            (3, 2) => $f::<3, 2>($($arg),*),
            (3, 3) => $f::<3, 3>($($arg),*),
            (3, 4) => $f::<3, 4>($($arg),*),
            (4, 1) => $f::<4, 1>($($arg),*),
            (4, 2) => $f::<4, 2>($($arg),*),
            (4, 3) => $f::<4, 3>($($arg),*),
            (4, 4) => $f::<4, 4>($($arg),*),
            (r, t) => unreachable!("no {r}x{t} tile"),
        }
    };
}
pub(super) use dispatch_tile;

/// Defines `matmul_q4_0`, `matmul_q4_1`, `matmul_q8_0` and the matching `vec_dot_*` (safe
/// wrappers: only sound on hosts with `$feat`, so only the table builder may hand them out).
macro_rules! x86_quant_kernels {
    (features: $feat:tt, shape: $shape:expr) => {
        use core::arch::x86_64::*;
        use flowrt_dtype::GgmlType;
        use $crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1};
        use $crate::x86::quant::{dispatch_tile, run_matmul, vec_dot_via, Tile, TileShape};
        use $crate::MatmulArgs;

        const SHAPE: TileShape = $shape;

        #[target_feature(enable = $feat)]
        #[inline]
        fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }

        /// 16 bytes of nibbles at `p` as 32 bytes: low nibbles, then high nibbles.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn load_nibbles(p: *const u8) -> __m256i {
            // SAFETY: the caller guarantees 16 readable bytes at `p`.
            let x = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(p.cast()) });
            let x = _mm256_srlv_epi64(x, _mm256_set_epi64x(4, 4, 0, 0));
            _mm256_and_si256(x, _mm256_set1_epi8(0x0F))
        }

        /// `[d, second half or 0, 0, 0]` from the f16 pair at `p` (4 readable bytes).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn load_f16_pair(p: *const u8) -> __m128 {
            // SAFETY: the caller guarantees 4 readable bytes at `p`.
            let bits = unsafe { p.cast::<i32>().read_unaligned() };
            _mm_cvtph_ps(_mm_cvtsi32_si128(bits))
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn store_tile<const R: usize, const T: usize>(
            g: &Tile,
            r0: usize,
            t0: usize,
            acc: &[[__m256; T]; R],
            extra: &[[f32; 4]; R],
        ) {
            for r in 0..R {
                for t in 0..T {
                    let v = hsum(acc[r][t]) + extra[r][t];
                    // SAFETY: Tile contract: row r0 + r < nrows, token t0 + t < ntok, and
                    // Kernels::matmul checked out.len() >= (ntok - 1) * out_stride + nrows.
                    unsafe { *g.out.add((t0 + t) * g.out_stride + r0 + r) = v };
                }
            }
        }

        /// Q4_1 x Q8_1: `sum_b d_w d_a isum + m_w s_a`. Decoding (`T == 1`), one multiply of
        /// `[d_w, m_w]` by `[d_a, s_a]` gives both the block scale and the `m_w s_a` term;
        /// otherwise `m_w s_a` is accumulated for 4 tokens at once from the transposed `s`.
        #[target_feature(enable = $feat)]
        unsafe fn tile_q4_1<const R: usize, const T: usize>(g: &Tile, r0: usize, t0: usize) {
            let zero = _mm256_setzero_si256();
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            let mut accm = [_mm_setzero_ps(); R];
            for b in 0..g.nb {
                // SAFETY: Tile contract: rows r0..r0+R, tokens t0..t0+T and block b exist;
                // `ds` has 2 floats per (token, block); `st` has `sstride = ntok + 3` floats
                // per block when ntok > 1 (T > 1 implies ntok > 1), so 4 from t0 < ntok fit.
                unsafe {
                    let s = if T > 1 {
                        _mm_loadu_ps(g.st.add(b * g.sstride + t0))
                    } else {
                        _mm_setzero_ps()
                    };
                    for r in 0..R {
                        let wb = g.w.add((r0 + r) * g.wstride + b * BlockQ4_1::SIZE);
                        let dm = load_f16_pair(wb);
                        let wq = load_nibbles(wb.add(4));
                        if T == 1 {
                            let ab = g.a.add(t0 * g.astride + b * BlockQ8_1::SIZE);
                            let ds = g.ds.add((t0 * g.nb + b) * 2);
                            let ds = _mm_castpd_ps(_mm_load_sd(ds.cast()));
                            let prod = _mm_mul_ps(dm, ds);
                            accm[r] = _mm_add_ps(accm[r], prod);
                            let aq = _mm256_loadu_si256(ab.add(4).cast());
                            let p = _mm256_cvtepi32_ps(mul_sum_u8_i8_acc(zero, wq, aq));
                            acc[r][0] = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(prod), acc[r][0]);
                        } else {
                            let dw = _mm256_broadcastss_ps(dm);
                            accm[r] = _mm_fmadd_ps(_mm_permute_ps::<0x55>(dm), s, accm[r]);
                            for t in 0..T {
                                let ab = g.a.add((t0 + t) * g.astride + b * BlockQ8_1::SIZE);
                                let aq = _mm256_loadu_si256(ab.add(4).cast());
                                let da = _mm256_set1_ps(*g.ds.add(((t0 + t) * g.nb + b) * 2));
                                let p = _mm256_cvtepi32_ps(mul_sum_u8_i8_acc(zero, wq, aq));
                                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(p, da), dw, acc[r][t]);
                            }
                        }
                    }
                }
            }
            let mut extra = [[0f32; 4]; R];
            for r in 0..R {
                let mut lanes = [0f32; 4];
                // SAFETY: `lanes` is 4 floats.
                unsafe { _mm_storeu_ps(lanes.as_mut_ptr(), accm[r]) };
                if T == 1 {
                    extra[r][0] = lanes[1];
                } else {
                    extra[r] = lanes;
                }
            }
            // SAFETY: same tile contract.
            unsafe { store_tile(g, r0, t0, &acc, &extra) }
        }

        /// Q4_0 x Q8_0: `isum = sum q a - 8 sum a`, the correction folded into the integer sum.
        #[target_feature(enable = $feat)]
        unsafe fn tile_q4_0<const R: usize, const T: usize>(g: &Tile, r0: usize, t0: usize) {
            let zero = _mm256_setzero_si256();
            let eight = _mm256_set1_epi8(8);
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..g.nb {
                // SAFETY: Tile contract: rows r0..r0+R, tokens t0..t0+T and block b exist.
                unsafe {
                    for r in 0..R {
                        let wb = g.w.add((r0 + r) * g.wstride + b * BlockQ4_0::SIZE);
                        let dw = _mm256_broadcastss_ps(load_f16_pair(wb));
                        let wq = load_nibbles(wb.add(2));
                        for t in 0..T {
                            let ab = g.a.add((t0 + t) * g.astride + b * BlockQ8_0::SIZE);
                            let aq = _mm256_loadu_si256(ab.add(2).cast());
                            let da = _mm256_set1_ps(*g.ds.add((t0 + t) * g.nb + b));
                            let neg8a = _mm256_sub_epi32(zero, mul_sum_u8_i8_acc(zero, eight, aq));
                            let p = _mm256_cvtepi32_ps(mul_sum_u8_i8_acc(neg8a, wq, aq));
                            acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(p, da), dw, acc[r][t]);
                        }
                    }
                }
            }
            // SAFETY: same tile contract.
            unsafe { store_tile(g, r0, t0, &acc, &[[0.0; 4]; R]) }
        }

        /// Q8_0 x Q8_0.
        #[target_feature(enable = $feat)]
        unsafe fn tile_q8_0<const R: usize, const T: usize>(g: &Tile, r0: usize, t0: usize) {
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..g.nb {
                // SAFETY: Tile contract: rows r0..r0+R, tokens t0..t0+T and block b exist.
                unsafe {
                    for r in 0..R {
                        let wb = g.w.add((r0 + r) * g.wstride + b * BlockQ8_0::SIZE);
                        let dw = _mm256_broadcastss_ps(load_f16_pair(wb));
                        let wq = _mm256_loadu_si256(wb.add(2).cast());
                        for t in 0..T {
                            let ab = g.a.add((t0 + t) * g.astride + b * BlockQ8_0::SIZE);
                            let aq = _mm256_loadu_si256(ab.add(2).cast());
                            let da = _mm256_set1_ps(*g.ds.add((t0 + t) * g.nb + b));
                            let p = _mm256_cvtepi32_ps(mul_sum_i8_i8(wq, aq));
                            acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(p, da), dw, acc[r][t]);
                        }
                    }
                }
            }
            // SAFETY: same tile contract.
            unsafe { store_tile(g, r0, t0, &acc, &[[0.0; 4]; R]) }
        }

        pub(super) fn matmul_q4_0(args: MatmulArgs<'_>) {
            run_matmul(args, GgmlType::Q4_0, SHAPE, |g, rr, tt, r0, t0| {
                // SAFETY: only reachable through a table built after the host's features were
                // detected; `run_matmul` upholds the Tile contract.
                unsafe { dispatch_tile!(tile_q4_0, rr, tt, g, r0, t0) }
            })
        }

        pub(super) fn matmul_q4_1(args: MatmulArgs<'_>) {
            run_matmul(args, GgmlType::Q4_1, SHAPE, |g, rr, tt, r0, t0| {
                // SAFETY: as in matmul_q4_0.
                unsafe { dispatch_tile!(tile_q4_1, rr, tt, g, r0, t0) }
            })
        }

        pub(super) fn matmul_q8_0(args: MatmulArgs<'_>) {
            run_matmul(args, GgmlType::Q8_0, SHAPE, |g, rr, tt, r0, t0| {
                // SAFETY: as in matmul_q4_0.
                unsafe { dispatch_tile!(tile_q8_0, rr, tt, g, r0, t0) }
            })
        }

        pub(super) fn vec_dot_q4_0(k: usize, w: &[u8], a: &[u8]) -> f32 {
            vec_dot_via(k, w, a, matmul_q4_0)
        }

        pub(super) fn vec_dot_q4_1(k: usize, w: &[u8], a: &[u8]) -> f32 {
            vec_dot_via(k, w, a, matmul_q4_1)
        }

        pub(super) fn vec_dot_q8_0(k: usize, w: &[u8], a: &[u8]) -> f32 {
            vec_dot_via(k, w, a, matmul_q8_0)
        }

        /// Points the quantised weight rows of `t` at this module's kernels.
        pub(super) fn install(t: &mut $crate::Kernels) {
            use $crate::slot;
            let set = |t: &mut $crate::Kernels, ty, mm: $crate::MatmulFn, vd: $crate::VecDotFn| {
                let s = slot(ty).expect("slot");
                t.types[s].matmul = Some(mm);
                t.types[s].vec_dot = Some(vd);
            };
            set(t, GgmlType::Q4_0, matmul_q4_0, vec_dot_q4_0);
            set(t, GgmlType::Q4_1, matmul_q4_1, vec_dot_q4_1);
            set(t, GgmlType::Q8_0, matmul_q8_0, vec_dot_q8_0);
        }
    };
}
pub(super) use x86_quant_kernels;
