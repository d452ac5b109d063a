//! AVX2 + FMA + F16C element-wise kernels and attention helpers.
//!
//! Ops whose scalar form LLVM vectorises exactly (add, scale, axpy) are the scalar loops
//! compiled for AVX2. Reductions use 8-lane partial sums (a different summation order than
//! the scalar reference, so results differ within f32 rounding). `exp` is a polynomial
//! approximation (relative error about 1e-7), so silu/gelu/softmax differ from the scalar
//! reference (libm `exp`) by a few ulps. Lengths are checked by `Kernels`.

use core::arch::x86_64::*;

use half::f16;

use crate::tiling::{head_tiles, value_block_keys};
use crate::Kernels;

pub(super) fn install(t: &mut Kernels) {
    t.elem.rms_norm = rms_norm;
    t.elem.silu_mul = silu_mul;
    t.elem.gelu_tanh_mul = gelu_tanh_mul;
    t.elem.softcap = softcap;
    t.elem.softmax = softmax;
    t.elem.softmax_unscaled = softmax_unscaled;
    t.elem.add = add;
    t.elem.scale = scale;
    t.elem.dot_f32 = dot_f32;
    t.elem.dot_f32_f16 = dot_f32_f16;
    t.elem.axpy_f32 = axpy_f32;
    t.elem.axpy_f16 = axpy_f16;
    t.elem.f32_to_f16 = f32_to_f16;
    t.elem.attn_scores_f16 = attn_scores_f16;
    t.elem.attn_values_f16 = attn_values_f16;
    t.elem.panel_dots_f64 = panel_dots_f64;
    t.elem.panel_dots_f32 = panel_dots_f32;
}

/// `exp(x)` for 8 lanes: `2^n * p(r)`, `x = n ln2 + r`, `|r| <= ln2/2`, degree-7 Taylor
/// polynomial (truncation error < 6e-9 relative). Inputs are clamped to [-87.33, 88.37], so
/// results stay finite and normal (`exp(-inf)` gives about 1.2e-38, not 0).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.336_54)),
        _mm256_set1_ps(88.376_26),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    const C: [f32; 8] = [
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let mut p = _mm256_set1_ps(C[0]);
    for &c in &C[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(e))
}

/// `f` over `x` in 8-lane chunks; the tail goes through a padded copy so every element sees
/// the same arithmetic.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn map8(x: &mut [f32], y: &[f32], f: impl Fn(__m256, __m256) -> __m256) {
    let mut xc = x.chunks_exact_mut(8);
    let mut yc = y.chunks_exact(8);
    for (xs, ys) in (&mut xc).zip(&mut yc) {
        // SAFETY: both chunks hold exactly 8 floats.
        unsafe {
            let v = f(_mm256_loadu_ps(xs.as_ptr()), _mm256_loadu_ps(ys.as_ptr()));
            _mm256_storeu_ps(xs.as_mut_ptr(), v);
        }
    }
    let (xr, yr) = (xc.into_remainder(), yc.remainder());
    if !xr.is_empty() {
        let (mut xb, mut yb) = ([0f32; 8], [0f32; 8]);
        xb[..xr.len()].copy_from_slice(xr);
        yb[..yr.len()].copy_from_slice(yr);
        // SAFETY: the buffers hold 8 floats.
        unsafe {
            let v = f(_mm256_loadu_ps(xb.as_ptr()), _mm256_loadu_ps(yb.as_ptr()));
            _mm256_storeu_ps(xb.as_mut_ptr(), v);
        }
        xr.copy_from_slice(&xb[..xr.len()]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    let one = _mm256_set1_ps(1.0);
    let neg = _mm256_set1_ps(-0.0);
    map8(gate, up, |g, u| {
        let e = exp8(_mm256_xor_ps(g, neg));
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u)
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
fn gelu_tanh_mul_avx2(gate: &mut [f32], up: &[f32]) {
    // gelu_tanh(x) = x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3)))
    let one = _mm256_set1_ps(1.0);
    let c = _mm256_set1_ps(-2.0 * 0.797_884_6);
    let c3 = _mm256_set1_ps(0.044715);
    map8(gate, up, |x, u| {
        let inner = _mm256_fmadd_ps(_mm256_mul_ps(c3, x), _mm256_mul_ps(x, x), x);
        let e = exp8(_mm256_mul_ps(c, inner));
        _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), u)
    });
}

/// `cap · tanh(x / cap)` as `cap - 2 cap / (1 + exp(2 x / cap))`: `exp8` clamps its input, so
/// large `|x|` give `±cap` exactly; NaN is passed through, and the tail past the last whole 8
/// takes the scalar form.
#[target_feature(enable = "avx2,fma,f16c")]
fn softcap_avx2(x: &mut [f32], cap: f32) {
    let n8 = x.len() & !7;
    let (c, c2, k) = (
        _mm256_set1_ps(cap),
        _mm256_set1_ps(2.0 * cap),
        _mm256_set1_ps(2.0 / cap),
    );
    let one = _mm256_set1_ps(1.0);
    for v in x[..n8].chunks_exact_mut(8) {
        // SAFETY: `v` holds 8 floats.
        unsafe {
            let y = _mm256_loadu_ps(v.as_ptr());
            let e = exp8(_mm256_mul_ps(k, y));
            let r = _mm256_sub_ps(c, _mm256_div_ps(c2, _mm256_add_ps(one, e)));
            // NaN in, NaN out (exp8's clamp would turn it into a finite value).
            let r = _mm256_blendv_ps(r, y, _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y));
            _mm256_storeu_ps(v.as_mut_ptr(), r);
        }
    }
    crate::scalar::elem::softcap(&mut x[n8..], cap);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn softmax_avx2(x: &mut [f32]) {
    let (_, sum) = softmax_unscaled_avx2(x);
    scale_avx2(x, 1.0 / sum);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn softmax_unscaled_avx2(x: &mut [f32]) -> (f32, f32) {
    let n8 = x.len() & !7;
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    for c in x[..n8].chunks_exact(8) {
        // SAFETY: 8 floats.
        vmax = _mm256_max_ps(vmax, unsafe { _mm256_loadu_ps(c.as_ptr()) });
    }
    let m = _mm_max_ps(
        _mm256_castps256_ps128(vmax),
        _mm256_extractf128_ps::<1>(vmax),
    );
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let mut max = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    for &v in &x[n8..] {
        max = max.max(v);
    }
    let vmax = _mm256_set1_ps(max);
    let mut vsum = _mm256_setzero_ps();
    for c in x[..n8].chunks_exact_mut(8) {
        // SAFETY: 8 floats.
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), vmax));
            vsum = _mm256_add_ps(vsum, e);
            _mm256_storeu_ps(c.as_mut_ptr(), e);
        }
    }
    let mut sum = hsum(vsum);
    let tail = &mut x[n8..];
    if !tail.is_empty() {
        let mut buf = [max; 8];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: the buffer holds 8 floats.
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), vmax));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
        }
        tail.copy_from_slice(&buf[..tail.len()]);
        sum += tail.iter().sum::<f32>();
    }
    (max, sum)
}

fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    // SAFETY: this table is only built on hosts with AVX2/FMA/F16C.
    unsafe { rms_norm_avx2(x, weight, eps, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rms_norm_avx2(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot_f32_avx2(x, x);
    let inv = 1.0 / (ss / x.len().max(1) as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * w;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n32 = a.len() & !31;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < n32 {
        for (j, s) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8 * j + 8 <= n32 <= len of both.
            unsafe {
                let va = _mm256_loadu_ps(a.as_ptr().add(i + 8 * j));
                let vb = _mm256_loadu_ps(b.as_ptr().add(i + 8 * j));
                *s = _mm256_fmadd_ps(va, vb, *s);
            }
        }
        i += 32;
    }
    while i + 8 <= a.len() {
        // SAFETY: i + 8 <= len of both.
        unsafe {
            let va = _mm256_loadu_ps(a.as_ptr().add(i));
            acc[0] = _mm256_fmadd_ps(va, _mm256_loadu_ps(b.as_ptr().add(i)), acc[0]);
        }
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(v);
    for j in i..a.len() {
        s += a[j] * b[j];
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_f16_avx2(a: &[f32], b: &[f16]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    while i + 16 <= a.len() {
        for (j, s) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8 * j + 8 <= len of both; f16 is 2 bytes, 8 of them one __m128i.
            unsafe {
                let va = _mm256_loadu_ps(a.as_ptr().add(i + 8 * j));
                let vb = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i + 8 * j).cast()));
                *s = _mm256_fmadd_ps(va, vb, *s);
            }
        }
        i += 16;
    }
    while i + 8 <= a.len() {
        // SAFETY: i + 8 <= len of both.
        unsafe {
            let va = _mm256_loadu_ps(a.as_ptr().add(i));
            let vb = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i).cast()));
            acc[0] = _mm256_fmadd_ps(va, vb, acc[0]);
        }
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    for j in i..a.len() {
        s += a[j] * b[j].to_f32();
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
fn axpy_f16_avx2(out: &mut [f32], alpha: f32, x: &[f16]) {
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= out.len() {
        // SAFETY: i + 8 <= len of both.
        unsafe {
            let vx = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i).cast()));
            let p = out.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(va, vx)));
        }
        i += 8;
    }
    for j in i..out.len() {
        out[j] += alpha * x[j].to_f32();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f32_to_f16_avx2(x: &[f32], out: &mut [f16]) {
    let mut i = 0;
    while i + 8 <= x.len() {
        // SAFETY: i + 8 <= len of both.
        unsafe {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), h);
        }
        i += 8;
    }
    for j in i..x.len() {
        out[j] = f16::from_f32(x[j]);
    }
}

// The scalar loops below vectorise exactly (no reassociation needed).
#[target_feature(enable = "avx2,fma,f16c")]
fn add_avx2(acc: &mut [f32], x: &[f32]) {
    crate::scalar::elem::add(acc, x)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn scale_avx2(x: &mut [f32], s: f32) {
    crate::scalar::elem::scale(x, s)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn axpy_f32_avx2(out: &mut [f32], alpha: f32, x: &[f32]) {
    crate::scalar::elem::axpy_f32(out, alpha, x)
}

macro_rules! safe_wrappers {
    ($($name:ident => $imp:ident ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {$(
        fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: this table is only built on hosts with AVX2/FMA/F16C.
            unsafe { $imp($($arg),*) }
        }
    )*};
}

safe_wrappers! {
    silu_mul => silu_mul_avx2(gate: &mut [f32], up: &[f32]);
    gelu_tanh_mul => gelu_tanh_mul_avx2(gate: &mut [f32], up: &[f32]);
    softcap => softcap_avx2(x: &mut [f32], cap: f32);
    softmax => softmax_avx2(x: &mut [f32]);
    softmax_unscaled => softmax_unscaled_avx2(x: &mut [f32]) -> (f32, f32);
    add => add_avx2(acc: &mut [f32], x: &[f32]);
    scale => scale_avx2(x: &mut [f32], s: f32);
    dot_f32 => dot_f32_avx2(a: &[f32], b: &[f32]) -> f32;
    dot_f32_f16 => dot_f32_f16_avx2(a: &[f32], b: &[f16]) -> f32;
    axpy_f32 => axpy_f32_avx2(out: &mut [f32], alpha: f32, x: &[f32]);
    axpy_f16 => axpy_f16_avx2(out: &mut [f32], alpha: f32, x: &[f16]);
    f32_to_f16 => f32_to_f16_avx2(x: &[f32], out: &mut [f16]);
    attn_scores_f16 => attn_scores_f16_avx2(q: &[f32], hd: usize, k: &[f16], scale: f32, out: &mut [f32]);
    attn_values_f16 => attn_values_f16_avx2(p: &[f32], hd: usize, v: &[f16], out: &mut [f32]);
    panel_dots_f64 => panel_dots_f64_avx2(p: &[f64], stride: usize, i0: usize, j0: usize, out: &mut crate::PanelTile);
    panel_dots_f32 => panel_dots_f32_avx2(p: &[f32], stride: usize, i0: usize, j0: usize, out: &mut crate::PanelTileF32);
}

/// Query heads per tile of the attention kernels: a tile's accumulators (2 heads x 4 keys
/// for scores, 2 heads x 32 values for the weighted values) and its operands stay in the 16
/// vector registers. Three heads would spill an accumulator to the stack every step.
const TILE_HEADS: usize = 2;

/// Keys per score tile: each key's 8-value chunks are converted once for the tile's heads,
/// and a head's 4 sums are reduced together (3 `vhaddps` instead of 4 horizontal sums).
const SCORE_KEYS: usize = 4;

#[target_feature(enable = "avx2,fma,f16c")]
fn attn_scores_f16_avx2(q: &[f32], hd: usize, k: &[f16], scale: f32, out: &mut [f32]) {
    if !hd.is_multiple_of(8) {
        return crate::scalar::elem::attn_scores_f16(q, hd, k, scale, out);
    }
    let (group, len) = (q.len() / hd, k.len() / hd);
    let full = len - len % SCORE_KEYS;
    // Keys outer, heads inner: a tile of keys comes from memory once for all the heads.
    for j in (0..full).step_by(SCORE_KEYS) {
        for (h0, nh) in head_tiles(group, TILE_HEADS) {
            // SAFETY: AVX2 host (this table); heads h0..h0 + nh and keys j..j + 4 exist, hd is
            // a multiple of 8 and out is (group, len), as `score_tile` needs.
            unsafe {
                if nh == 2 {
                    score_tile::<2>(q, hd, k, scale, out, h0, j);
                } else {
                    score_tile::<1>(q, hd, k, scale, out, h0, j);
                }
            }
        }
    }
    for j in full..len {
        for h in 0..group {
            let mut acc = _mm256_setzero_ps();
            for c in (0..hd).step_by(8) {
                // SAFETY: key j and head h have hd values; c + 8 <= hd.
                unsafe {
                    let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(j * hd + c).cast()));
                    let qv = _mm256_loadu_ps(q.as_ptr().add(h * hd + c));
                    acc = _mm256_fmadd_ps(qv, kv, acc);
                }
            }
            out[h * len + j] = scale * hsum(acc);
        }
    }
}

/// Scores of heads `h0..h0 + H` against keys `j..j + 4`.
///
/// # Safety
/// AVX2 host; `hd` a multiple of 8; the heads exist in `q`, the keys in `k`, and `out` is
/// `(group, len)` for `len = k.len() / hd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
    let mut acc = [[_mm256_setzero_ps(); SCORE_KEYS]; H];
    let (kp, qp) = (k.as_ptr(), q.as_ptr());
    for c in (0..hd).step_by(8) {
        for kk in 0..SCORE_KEYS {
            // SAFETY: key j + kk and heads h0..h0 + H have hd values; c + 8 <= hd.
            unsafe {
                let kv = _mm256_cvtph_ps(_mm_loadu_si128(kp.add((j + kk) * hd + c).cast()));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm256_loadu_ps(qp.add((h0 + h) * hd + c));
                    acc[kk] = _mm256_fmadd_ps(qv, kv, acc[kk]);
                }
            }
        }
    }
    let s = _mm_set1_ps(scale);
    for (h, a) in acc.iter().enumerate() {
        // [a0 a1 a2 a3] -> their four sums: pairwise adds, then the two 128-bit halves.
        let t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        let sums = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
        // SAFETY: row h0 + h of out has len >= j + 4 entries.
        unsafe {
            _mm_storeu_ps(
                out.as_mut_ptr().add((h0 + h) * len + j),
                _mm_mul_ps(sums, s),
            )
        };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn attn_values_f16_avx2(p: &[f32], hd: usize, v: &[f16], out: &mut [f32]) {
    // 8-value chunks per tile: 4 where hd allows (8 accumulators with 2 heads).
    let c = [4, 2, 1].into_iter().find(|c| hd.is_multiple_of(8 * c));
    let Some(c) = c else {
        return crate::scalar::elem::attn_values_f16(p, hd, v, out);
    };
    let (group, len) = (out.len() / hd, v.len() / hd);
    // Keys in blocks whose values stay in L1 while every tile passes over them; the tiles'
    // sums live in `out` between blocks.
    let block = value_block_keys(hd);
    out.fill(0.0);
    for j0 in (0..len).step_by(block) {
        let j1 = (j0 + block).min(len);
        for (h0, nh) in head_tiles(group, TILE_HEADS) {
            for c0 in (0..hd).step_by(8 * c) {
                // SAFETY: AVX2 host (this table); heads h0..h0 + nh, keys j0..j1 and values
                // c0..c0 + 8c exist (c0 + 8c <= hd since 8c divides hd), as `value_tile` needs.
                unsafe {
                    match (nh, c) {
                        (2, 4) => value_tile::<2, 4>(p, hd, v, out, h0, c0, j0..j1),
                        (1, 4) => value_tile::<1, 4>(p, hd, v, out, h0, c0, j0..j1),
                        (2, 2) => value_tile::<2, 2>(p, hd, v, out, h0, c0, j0..j1),
                        (1, 2) => value_tile::<1, 2>(p, hd, v, out, h0, c0, j0..j1),
                        (2, _) => value_tile::<2, 1>(p, hd, v, out, h0, c0, j0..j1),
                        _ => value_tile::<1, 1>(p, hd, v, out, h0, c0, j0..j1),
                    }
                }
            }
        }
    }
}

/// Adds `sum_j p[h, j] * v[j, c0..c0 + 8C]` over `keys` to `out[h, c0..c0 + 8C]` for heads
/// `h0..h0 + H`: each weight is broadcast once for `C` chunks, each value chunk converted
/// once for the heads.
///
/// # Safety
/// AVX2 host; `p` is `(group, len)`, `v` `(len, hd)`, `out` `(group, hd)` with the heads,
/// keys and values named existing in them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
        let mut acc: [[__m256; C]; H] = std::array::from_fn(|h| {
            std::array::from_fn(|i| _mm256_loadu_ps(o.add((h0 + h) * hd + c0 + 8 * i)))
        });
        for j in keys {
            let vv: [__m256; C] = std::array::from_fn(|i| {
                _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(j * hd + c0 + 8 * i).cast()))
            });
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*p.get_unchecked((h0 + h) * len + j));
                for i in 0..C {
                    acc[i] = _mm256_fmadd_ps(w, vv[i], acc[i]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (i, &a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add((h0 + h) * hd + c0 + 8 * i), a);
            }
        }
    }
}

/// The AVX2 panel-dots kernels (bounds checked by `Kernels`): a 4-row tile of two vectors
/// per row (eight accumulators), each lane summed in row order with fused multiply-adds.
macro_rules! panel_dots_avx2 {
    ($(#[$doc:meta])* $name:ident, $t:ty, $tile:ty, $lanes:literal,
     $zero:ident, $load:ident, $set1:ident, $fmadd:ident, $store:ident) => {
        $(#[$doc])*
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $name(p: &[$t], stride: usize, i0: usize, j0: usize, out: &mut $tile) {
            let mut acc = [[$zero(); 2]; 4];
            for row in p.chunks_exact(stride) {
                let b = &row[j0..j0 + 2 * $lanes];
                let a = &row[i0..i0 + 4];
                // SAFETY: `b` has two vectors' values, read as two unaligned loads.
                let (b0, b1) = unsafe { ($load(b.as_ptr()), $load(b.as_ptr().add($lanes))) };
                for (acc, &ar) in acc.iter_mut().zip(a) {
                    let ar = $set1(ar);
                    acc[0] = $fmadd(ar, b0, acc[0]);
                    acc[1] = $fmadd(ar, b1, acc[1]);
                }
            }
            for (o, acc) in out.iter_mut().zip(acc) {
                // SAFETY: `o` has two vectors' values, written as two unaligned stores.
                unsafe {
                    $store(o.as_mut_ptr(), acc[0]);
                    $store(o.as_mut_ptr().add($lanes), acc[1]);
                }
            }
        }
    };
}

panel_dots_avx2!(
    /// [`crate::Kernels::panel_dots_f64`]: 4-lane f64 vectors.
    panel_dots_f64_avx2, f64, crate::PanelTile, 4,
    _mm256_setzero_pd, _mm256_loadu_pd, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_storeu_pd
);
panel_dots_avx2!(
    /// [`crate::Kernels::panel_dots_f32`]: 8-lane f32 vectors.
    panel_dots_f32_avx2, f32, crate::PanelTileF32, 8,
    _mm256_setzero_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps
);
