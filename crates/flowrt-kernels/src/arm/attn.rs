//! NEON kernels over the f16 KV cache: attention scores and weighted values, f16 dot and
//! axpy. Same tiling as the AVX2 ones (`x86/elem.rs`) in 128-bit registers: scores in tiles of 4 keys by up to 4 heads (each key chunk converted once for
//! the heads; 16 of the 32 registers accumulate), values in tiles of up to 4 heads by 16
//! values over L1-sized blocks of keys.
//!
//! Tested under `qemu-aarch64` against the scalar reference (`tests/elem.rs`); not timed on
//! ARM hardware.

use half::f16;

use super::arch::*;
use super::load4;
use crate::tiling::{head_tiles, value_block_keys};

/// Heads per tile (4 x 4 score accumulators, or 4 x 4 value accumulators).
const TILE_HEADS: usize = 4;
/// Keys per score tile.
const SCORE_KEYS: usize = 4;

pub(super) fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    let n8 = a.len() & !7;
    // SAFETY: NEON baseline; every 8-value chunk lies inside both slices (i + 8 <= n8).
    let mut sum = unsafe {
        let (mut s0, mut s1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        for i in (0..n8).step_by(8) {
            s0 = vfmaq_f32(s0, vld1q_f32(a.as_ptr().add(i)), load4(b.as_ptr().add(i)));
            s1 = vfmaq_f32(
                s1,
                vld1q_f32(a.as_ptr().add(i + 4)),
                load4(b.as_ptr().add(i + 4)),
            );
        }
        vaddvq_f32(vaddq_f32(s0, s1))
    };
    for i in n8..a.len() {
        sum += a[i] * b[i].to_f32();
    }
    sum
}

pub(super) fn axpy_f16(out: &mut [f32], alpha: f32, x: &[f16]) {
    let n4 = out.len() & !3;
    // SAFETY: NEON baseline; every 4-value chunk lies inside both slices.
    unsafe {
        for i in (0..n4).step_by(4) {
            let o = out.as_mut_ptr().add(i);
            vst1q_f32(
                o,
                vfmaq_n_f32(vld1q_f32(o), load4(x.as_ptr().add(i)), alpha),
            );
        }
    }
    for i in n4..out.len() {
        out[i] += alpha * x[i].to_f32();
    }
}

pub(super) fn attn_scores_f16(q: &[f32], hd: usize, k: &[f16], scale: f32, out: &mut [f32]) {
    if !hd.is_multiple_of(8) {
        return crate::scalar::elem::attn_scores_f16(q, hd, k, scale, out);
    }
    let (group, len) = (q.len() / hd, k.len() / hd);
    let full = len - len % SCORE_KEYS;
    for j in (0..full).step_by(SCORE_KEYS) {
        for (h0, nh) in head_tiles(group, TILE_HEADS) {
            // SAFETY: heads h0..h0 + nh and keys j..j + 4 exist; hd is a multiple of 8.
            unsafe {
                match nh {
                    1 => score_tile::<1>(q, hd, k, scale, out, h0, j),
                    2 => score_tile::<2>(q, hd, k, scale, out, h0, j),
                    3 => score_tile::<3>(q, hd, k, scale, out, h0, j),
                    _ => score_tile::<4>(q, hd, k, scale, out, h0, j),
                }
            }
        }
    }
    for j in full..len {
        for h in 0..group {
            out[h * len + j] =
                scale * dot_f32_f16(&q[h * hd..(h + 1) * hd], &k[j * hd..(j + 1) * hd]);
        }
    }
}

/// Scores of heads `h0..h0 + H` against keys `j..j + 4`.
///
/// # Safety
/// `hd` a multiple of 8; the heads exist in `q`, the keys in `k`; `out` is `(group, len)`.
#[inline(always)]
unsafe fn score_tile<const H: usize>(
    q: &[f32],
    hd: usize,
    k: &[f16],
    scale: f32,
    out: &mut [f32],
    h0: usize,
    j: usize,
) {
    let len = k.len() / hd;
    let (kp, qp) = (k.as_ptr(), q.as_ptr());
    // SAFETY (block): every index below is inside `q`, `k` and `out`, as the caller guarantees.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); SCORE_KEYS]; H];
        for c in (0..hd).step_by(8) {
            let kv: [[float32x4_t; 2]; SCORE_KEYS] = std::array::from_fn(|kk| {
                let p = kp.add((j + kk) * hd + c);
                [load4(p), load4(p.add(4))]
            });
            for (h, acc) in acc.iter_mut().enumerate() {
                let p = qp.add((h0 + h) * hd + c);
                let (q0, q1) = (vld1q_f32(p), vld1q_f32(p.add(4)));
                for kk in 0..SCORE_KEYS {
                    acc[kk] = vfmaq_f32(vfmaq_f32(acc[kk], q0, kv[kk][0]), q1, kv[kk][1]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add((h0 + h) * len + j);
            for (kk, &a) in acc.iter().enumerate() {
                *o.add(kk) = scale * vaddvq_f32(a);
            }
        }
    }
}

pub(super) fn attn_values_f16(p: &[f32], hd: usize, v: &[f16], out: &mut [f32]) {
    // 4-value chunks per tile: 4 where hd allows.
    let Some(c) = [4, 2, 1].into_iter().find(|c| hd.is_multiple_of(4 * c)) else {
        return crate::scalar::elem::attn_values_f16(p, hd, v, out);
    };
    let (group, len) = (out.len() / hd, v.len() / hd);
    let block = value_block_keys(hd);
    out.fill(0.0);
    for j0 in (0..len).step_by(block) {
        let keys = j0..(j0 + block).min(len);
        for (h0, nh) in head_tiles(group, TILE_HEADS) {
            for c0 in (0..hd).step_by(4 * c) {
                let ks = keys.clone();
                // SAFETY: heads h0..h0 + nh, the keys and values c0..c0 + 4c exist.
                unsafe {
                    match (nh, c) {
                        (1, 4) => value_tile::<1, 4>(p, hd, v, out, h0, c0, ks),
                        (2, 4) => value_tile::<2, 4>(p, hd, v, out, h0, c0, ks),
                        (3, 4) => value_tile::<3, 4>(p, hd, v, out, h0, c0, ks),
                        (_, 4) => value_tile::<4, 4>(p, hd, v, out, h0, c0, ks),
                        (1, 2) => value_tile::<1, 2>(p, hd, v, out, h0, c0, ks),
                        (2, 2) => value_tile::<2, 2>(p, hd, v, out, h0, c0, ks),
                        (3, 2) => value_tile::<3, 2>(p, hd, v, out, h0, c0, ks),
                        (_, 2) => value_tile::<4, 2>(p, hd, v, out, h0, c0, ks),
                        (1, _) => value_tile::<1, 1>(p, hd, v, out, h0, c0, ks),
                        (2, _) => value_tile::<2, 1>(p, hd, v, out, h0, c0, ks),
                        (3, _) => value_tile::<3, 1>(p, hd, v, out, h0, c0, ks),
                        _ => value_tile::<4, 1>(p, hd, v, out, h0, c0, ks),
                    }
                }
            }
        }
    }
}

/// Adds `sum_j p[h, j] * v[j, c0..c0 + 4C]` over `keys` to `out[h, c0..c0 + 4C]` for heads
/// `h0..h0 + H`.
///
/// # Safety
/// `p` is `(group, len)`, `v` `(len, hd)`, `out` `(group, hd)`, with the heads, keys and
/// values named existing in them.
#[inline(always)]
unsafe fn value_tile<const H: usize, const C: usize>(
    p: &[f32],
    hd: usize,
    v: &[f16],
    out: &mut [f32],
    h0: usize,
    c0: usize,
    keys: std::ops::Range<usize>,
) {
    let len = v.len() / hd;
    let o = out.as_mut_ptr();
    // SAFETY (block): the caller guarantees every index below exists.
    unsafe {
        let mut acc: [[float32x4_t; C]; H] = std::array::from_fn(|h| {
            std::array::from_fn(|i| vld1q_f32(o.add((h0 + h) * hd + c0 + 4 * i)))
        });
        for j in keys {
            let vv: [float32x4_t; C] =
                std::array::from_fn(|i| load4(v.as_ptr().add(j * hd + c0 + 4 * i)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = *p.get_unchecked((h0 + h) * len + j);
                for i in 0..C {
                    acc[i] = vfmaq_n_f32(acc[i], vv[i], w);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (i, &a) in acc.iter().enumerate() {
                vst1q_f32(o.add((h0 + h) * hd + c0 + 4 * i), a);
            }
        }
    }
}
