//! Error-minimising quantisers for Q4_K, Q5_K and Q6_K (the weight types `flowrt pack` writes
//! in K-quant mixes).
//!
//! A block `y` is stored as `scale * q + offset` with integer `q` in a fixed range. Rounding
//! with the scale that spans the block's range (the min/max rule) spends the end levels on the
//! one or two extreme values; instead, each block here
//!
//! 1. tries a grid of candidate scales around the range-spanning one, rounds the block with
//!    each, fits scale and offset to that integer assignment by weighted least squares (closed
//!    form from a few sums) and keeps the fit with the least weighted squared error;
//! 2. then rounds with the best fit and refits, keeping the result where the error falls.
//!
//! The k-quants store each sub-block's scale (and min) as a 6-bit (Q6_K: signed 8-bit) integer
//! times an f16 super-block scale. Those integers are chosen per sub-block between the two
//! neighbours of the ideal ratio by the error each gives with the sub-block requantised; then
//! the super-block scales are refitted by least squares over all 256 values with the integers
//! fixed, and the choice is made again, kept if it lowers the error. The last choice is made
//! with the super-block scales rounded to the f16 the file stores, and the values are rounded
//! with the step the dequantiser computes.
//!
//! Weights (there is no importance matrix): every squared error is weighted by
//! `w = sqrt(2 sigma^2) + |y|` (`sigma^2` the super-block's mean square), ggml's form without
//! one, which keeps large values more exact than plain squared error would at almost the same
//! overall error; measured against plain squared error and `sigma^2 + y^2` in
//! `docs/quantisation.md`.
//!
//! Layout and arithmetic: a super-block's sub-blocks are transposed so that each is one lane of
//! an 8-lane vector ([`F8`]) and every step is a lane-wise f32 operation; the only horizontal
//! sums are over lanes, in a fixed order. [`Lanes`] implements the vector in portable Rust (the
//! scalar and NEON tables); the x86 tables instantiate the same code with AVX registers, which
//! compute every lane bit for bit the same (IEEE single operations, no fused multiply-add), so
//! every table writes the same bytes. Each super-block is scaled by a power of two (exact) so
//! its largest magnitude lies in [1, 4); rounding is to nearest, ties to even. For finite input
//! the stored scales are finite (saturated to f16's range), so dequantised values are too; a
//! super-block whose largest magnitude is below 2^-25 is stored as zeros (no f16 scale can do
//! better).

use crate::blocks::{pack_scale_min_k4, BlockQ4K, BlockQ5K, BlockQ6K, QK_K};

/// Eight f32 lanes and the lane-wise operations the searches need.
pub(crate) trait F8: Copy {
    fn splat(v: f32) -> Self;
    fn from_array(a: [f32; 8]) -> Self;
    fn to_array(self) -> [f32; 8];
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn sqrt(self) -> Self;
    /// Lane-wise `if a < b { x } else { y }` (false for NaN, as `cmpltps`).
    fn lt_select(a: Self, b: Self, x: Self, y: Self) -> Self;
}

/// The portable [`F8`].
#[derive(Clone, Copy)]
pub(crate) struct Lanes([f32; 8]);

impl F8 for Lanes {
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Lanes([v; 8])
    }
    #[inline(always)]
    fn from_array(a: [f32; 8]) -> Self {
        Lanes(a)
    }
    #[inline(always)]
    fn to_array(self) -> [f32; 8] {
        self.0
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Lanes(std::array::from_fn(|l| self.0[l] + o.0[l]))
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Lanes(std::array::from_fn(|l| self.0[l] - o.0[l]))
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Lanes(std::array::from_fn(|l| self.0[l] * o.0[l]))
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        Lanes(std::array::from_fn(|l| self.0[l] / o.0[l]))
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        Lanes(self.0.map(f32::sqrt))
    }
    #[inline(always)]
    fn lt_select(a: Self, b: Self, x: Self, y: Self) -> Self {
        Lanes(std::array::from_fn(|l| {
            if a.0[l] < b.0[l] {
                x.0[l]
            } else {
                y.0[l]
            }
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// Lane-wise helpers

#[inline(always)]
fn min<V: F8>(a: V, b: V) -> V {
    V::lt_select(a, b, a, b)
}

#[inline(always)]
fn max<V: F8>(a: V, b: V) -> V {
    V::lt_select(b, a, a, b)
}

#[inline(always)]
fn clamp<V: F8>(v: V, lo: V, hi: V) -> V {
    min(max(v, lo), hi)
}

#[inline(always)]
fn abs<V: F8>(v: V) -> V {
    max(v, V::splat(0.0).sub(v))
}

/// Round to nearest, ties to even, for `|v| < 2^22` (1.5 * 2^23 has a unit last place of 1).
#[inline(always)]
fn rint<V: F8>(v: V) -> V {
    let magic = V::splat(12_582_912.0);
    v.add(magic).sub(magic)
}

/// `1 / v` where `v` is not 0 (either sign), else 0.
#[inline(always)]
fn recip_or_zero<V: F8>(v: V) -> V {
    let zero = V::splat(0.0);
    V::lt_select(zero, abs(v), V::splat(1.0).div(v), zero)
}

/// The sum of the 8 lanes, in one fixed order.
#[inline(always)]
fn hsum<V: F8>(v: V) -> f32 {
    let a = v.to_array();
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// A power of two `p` with `amax * p` in [1, 4), and `1 / p`; `None` when `amax` is below
/// 2^-25 (or NaN), where storing zeros is at least as exact as any f16 scale can be.
fn normaliser(amax: f32) -> Option<(f32, f32)> {
    if amax.is_nan() || amax < 2f32.powi(-25) {
        return None;
    }
    let e = (((amax.to_bits() >> 23) & 0xFF) as i32 - 127).min(126);
    let p = f32::from_bits(((127 - e) as u32) << 23);
    let inv = f32::from_bits(((127 + e) as u32) << 23);
    Some((p, inv))
}

/// `v` (normalised units) as the stored f16 (times `inv`, saturated to f16's finite range, NaN
/// to 0) and that f16 back in normalised units (times `p`).
fn as_f16(v: f32, (p, inv): (f32, f32)) -> (half::f16, f32) {
    let t = v * inv;
    let t = if t.is_nan() {
        0.0
    } else {
        t.clamp(-half::f16::MAX.to_f32(), half::f16::MAX.to_f32())
    };
    let h = half::f16::from_f32(t);
    (h, h.to_f32() * p)
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Weights `sqrt(2 sigma^2) + |t|` for every value of a super-block (`sigma^2` its mean square;
/// see the module comment).
#[inline(always)]
fn weights<V: F8, const N: usize>(t: &[V; N]) -> [V; N] {
    let mut acc = V::splat(0.0);
    for v in t {
        acc = acc.add(v.mul(*v));
    }
    let base = V::splat(2.0 * hsum(acc) / (8 * N) as f32).sqrt();
    let mut w = [V::splat(0.0); N];
    for i in 0..N {
        w[i] = base.add(abs(t[i]));
    }
    w
}

// ---------------------------------------------------------------------------------------------
// Block searches (each lane one block)

/// Candidate scales: `iscale = (levels + r) / range` for `r` in the grid (0 first: the scale
/// that spans the range).
const GRID_AFFINE: [f32; 21] = [
    0.0, -1.0, -0.9, -0.8, -0.7, -0.6, -0.5, -0.4, -0.3, -0.2, -0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6,
    0.7, 0.8, 0.9, 1.0,
];
const GRID_SYMMETRIC: [f32; 19] = [
    0.0, -0.9, -0.8, -0.7, -0.6, -0.5, -0.4, -0.3, -0.2, -0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7,
    0.8, 0.9,
];
/// Round-and-refit passes after the grid.
const REFINE: usize = 2;
/// Super-block refits (each kept only if it lowers the error).
const REFIT: usize = 1;

/// Constant sums of the weighted blocks: `sum w`, `sum w t`, `sum w t^2`.
#[derive(Clone, Copy)]
struct Moments<V> {
    w: V,
    wt: V,
    wtt: V,
}

#[inline(always)]
fn moments<V: F8, const N: usize>(t: &[V; N], w: &[V; N]) -> Moments<V> {
    let zero = V::splat(0.0);
    let mut m = Moments {
        w: zero,
        wt: zero,
        wtt: zero,
    };
    for i in 0..N {
        let wt = w[i].mul(t[i]);
        m.w = m.w.add(w[i]);
        m.wt = m.wt.add(wt);
        m.wtt = m.wtt.add(wt.mul(t[i]));
    }
    m
}

/// Rounds `(t - base) * iscale` into `lo..=hi`; returns `sum w q`, `sum w q^2`, `sum w t q`.
#[inline(always)]
fn assign<V: F8, const N: usize>(
    t: &[V; N],
    w: &[V; N],
    base: V,
    iscale: V,
    (lo, hi): (V, V),
) -> (V, V, V) {
    let zero = V::splat(0.0);
    let (mut a, mut b, mut c) = (zero, zero, zero);
    for i in 0..N {
        let q = rint(clamp(t[i].sub(base).mul(iscale), lo, hi));
        let wq = w[i].mul(q);
        a = a.add(wq);
        b = b.add(wq.mul(q));
        c = c.add(wq.mul(t[i]));
    }
    (a, b, c)
}

/// The weighted least-squares `(scale, offset)` for one assignment (sums `a`, `b`, `c` from
/// [`assign`]) and its error; the error is +inf where the fit is unusable (no positive finite
/// scale). With `offset_at_most_zero` the offset is held at 0 where the free fit puts it above.
#[inline(always)]
fn fit_affine<V: F8>(m: Moments<V>, (a, b, c): (V, V, V), offset_at_most_zero: bool) -> (V, V, V) {
    let zero = V::splat(0.0);
    let inf = V::splat(f32::INFINITY);
    let wb = m.w.mul(b);
    let det = wb.sub(a.mul(a));
    let s_free = m.w.mul(c).sub(m.wt.mul(a)).div(det);
    let o_free = b.mul(m.wt).sub(a.mul(c)).div(det);
    let s_zero = c.div(b);
    // The free fit where the assignment is not constant.
    let free = wb.mul(V::splat(1e-6));
    let mut s = V::lt_select(free, det, s_free, s_zero);
    let mut o = V::lt_select(free, det, o_free, zero);
    if offset_at_most_zero {
        s = V::lt_select(zero, o, s_zero, s);
        o = min(o, zero);
    }
    let two = V::splat(2.0);
    let err = m
        .wtt
        .sub(two.mul(s).mul(c))
        .sub(two.mul(o).mul(m.wt))
        .add(s.mul(s).mul(b))
        .add(two.mul(s).mul(o).mul(a))
        .add(o.mul(o).mul(m.w));
    let err = max(err, zero);
    // Usable: 0 < s < inf (false for NaN), o finite.
    let ok = V::lt_select(zero, s, V::lt_select(s, inf, abs(o), inf), inf);
    let err = V::lt_select(ok, inf, err, inf);
    (s, o, err)
}

/// Per lane, the best `(scale, offset)` for `t ≈ scale * q + offset`, `q` in `0..=qmax`, by
/// weighted squared error; `scale >= 0`, and `offset <= 0` with `offset_at_most_zero` (the
/// k-quants store `-offset` as an unsigned min). A constant lane gets scale 0.
#[inline(always)]
fn search_affine<V: F8, const N: usize>(
    t: &[V; N],
    w: &[V; N],
    qmax: f32,
    offset_at_most_zero: bool,
) -> (V, V) {
    let zero = V::splat(0.0);
    let one = V::splat(1.0);
    let (mut lo, mut hi) = (t[0], t[0]);
    for v in &t[1..] {
        lo = min(lo, *v);
        hi = max(hi, *v);
    }
    if offset_at_most_zero {
        lo = min(lo, zero);
    }
    let m = moments(t, w);
    let bounds = (zero, V::splat(qmax));
    // Lanes without spread keep (0, lo): the offset alone represents them.
    let range = V::lt_select(lo, hi, hi.sub(lo), one);
    let (mut best_s, mut best_o, mut best_e) = (zero, lo, V::splat(f32::INFINITY));
    for r in GRID_AFFINE {
        let iscale = V::splat(qmax + r).div(range);
        let sums = assign(t, w, lo, iscale, bounds);
        let f = fit_affine(m, sums, offset_at_most_zero);
        best_s = V::lt_select(f.2, best_e, f.0, best_s);
        best_o = V::lt_select(f.2, best_e, f.1, best_o);
        best_e = min(f.2, best_e);
    }
    for _ in 0..REFINE {
        let sums = assign(t, w, best_o, recip_or_zero(best_s), bounds);
        let f = fit_affine(m, sums, offset_at_most_zero);
        best_s = V::lt_select(f.2, best_e, f.0, best_s);
        best_o = V::lt_select(f.2, best_e, f.1, best_o);
        best_e = min(f.2, best_e);
    }
    (best_s, best_o)
}

/// Per lane, the best signed `scale` for `t ≈ scale * q`, `q` in `-qneg..=qneg - 1`, by
/// weighted squared error. Candidates map the value of largest magnitude onto `-qneg` (the sign
/// of the scale follows), as ggml does, so the extra negative level is used.
#[inline(always)]
fn search_symmetric<V: F8, const N: usize>(t: &[V; N], w: &[V; N], qneg: f32) -> V {
    let zero = V::splat(0.0);
    // The first value of largest magnitude, with its sign.
    let mut v = t[0];
    for x in &t[1..] {
        v = V::lt_select(abs(v), abs(*x), *x, v);
    }
    let inv_v = recip_or_zero(v);
    let bounds = (V::splat(-qneg), V::splat(qneg - 1.0));
    let (mut best_s, mut best_g) = (zero, zero);
    for r in GRID_SYMMETRIC {
        let iscale = V::splat(-(qneg + r)).mul(inv_v);
        let (s, g) = score(assign(t, w, zero, iscale, bounds));
        best_s = V::lt_select(best_g, g, s, best_s);
        best_g = max(g, best_g);
    }
    for _ in 0..REFINE {
        let (s, g) = score(assign(t, w, zero, recip_or_zero(best_s), bounds));
        best_s = V::lt_select(best_g, g, s, best_s);
        best_g = max(g, best_g);
    }
    best_s
}

/// The fitted scale `c / b` of a symmetric assignment and its score `c^2 / b` (maximising it
/// minimises the error of the fitted scale); both 0 where `b` is 0.
#[inline(always)]
fn score<V: F8>((_, b, c): (V, V, V)) -> (V, V) {
    let zero = V::splat(0.0);
    let s = c.div(b);
    (
        V::lt_select(zero, b, s, zero),
        V::lt_select(zero, b, c.mul(s), zero),
    )
}

/// Rounds `(t + off) / step` into `lo..=hi` (0 where `step` is 0); returns the integers and the
/// weighted squared error of `step * q - off` (the dequantiser's expression).
#[inline(always)]
fn requantise<V: F8, const N: usize>(
    t: &[V; N],
    w: &[V; N],
    step: V,
    off: V,
    (lo, hi): (V, V),
) -> ([V; N], V) {
    let inv = recip_or_zero(step);
    let mut err = V::splat(0.0);
    let mut q = [V::splat(0.0); N];
    for i in 0..N {
        q[i] = rint(clamp(t[i].add(off).mul(inv), lo, hi));
        let r = step.mul(q[i]).sub(off).sub(t[i]);
        err = err.add(w[i].mul(r).mul(r));
    }
    (q, err)
}

/// The integers nearest below `v / unit` and the next one up, within `lo..=hi` (both 0 where
/// `unit` is 0).
#[inline(always)]
fn neighbours<V: F8>(v: V, unit: f32, lo: f32, hi: f32) -> (V, V) {
    let (lo, hi) = (V::splat(lo), V::splat(hi));
    if unit == 0.0 {
        let z = clamp(V::splat(0.0), lo, hi);
        return (z, z);
    }
    let ratio = clamp(v.div(V::splat(unit)), V::splat(-1e6), V::splat(1e6));
    let r = rint(ratio);
    let f = V::lt_select(ratio, r, r.sub(V::splat(1.0)), r);
    (clamp(f, lo, hi), clamp(f.add(V::splat(1.0)), lo, hi))
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q5_K: `x = d sc_j q - dmin mn_j`, 8 sub-blocks of 32, 6-bit sc/mn, q in 0..=qmax

/// The sub-blocks of a normalised super-block, one per lane: `t[i]` lane `j` is value `i` of
/// sub-block `j`.
struct SuperK<V> {
    t: [V; 32],
    w: [V; 32],
    /// Each sub-block's searched scale and min (`-offset`).
    ideal: (V, V),
    qmax: f32,
}

/// A choice of integer scales and mins: per lane `sc`, `mn`, the rounded values and the error.
struct ChoiceK<V> {
    sc: V,
    mn: V,
    q: [V; 32],
    err: f32,
}

/// Each sub-block's best `(sc, mn)` among the neighbours of its ideal ratios to `(d, dmin)`.
#[inline(always)]
fn choose_k<V: F8>(k: &SuperK<V>, (d, dmin): (f32, f32)) -> ChoiceK<V> {
    let (sc0, sc1) = neighbours(k.ideal.0, d, 0.0, 63.0);
    let (mn0, mn1) = neighbours(k.ideal.1, dmin, 0.0, 63.0);
    let bounds = (V::splat(0.0), V::splat(k.qmax));
    let (dv, mv) = (V::splat(d), V::splat(dmin));
    let (mut q, mut e) = requantise(&k.t, &k.w, dv.mul(sc0), mv.mul(mn0), bounds);
    let (mut sc, mut mn) = (sc0, mn0);
    for (a, b) in [(sc0, mn1), (sc1, mn0), (sc1, mn1)] {
        let (qc, ec) = requantise(&k.t, &k.w, dv.mul(a), mv.mul(b), bounds);
        sc = V::lt_select(ec, e, a, sc);
        mn = V::lt_select(ec, e, b, mn);
        for i in 0..32 {
            q[i] = V::lt_select(ec, e, qc[i], q[i]);
        }
        e = min(ec, e);
    }
    ChoiceK {
        sc,
        mn,
        q,
        err: hsum(e),
    }
}

/// Least-squares `(d, dmin)` for a choice's integers: `t ≈ d (sc_j q) - dmin mn_j` over all
/// 256 values, both at least 0.
#[inline(always)]
fn refit_k<V: F8>(k: &SuperK<V>, c: &ChoiceK<V>) -> Option<(f32, f32)> {
    let zero = V::splat(0.0);
    let (mut wq, mut wqq, mut w, mut wt, mut wtq) = (zero, zero, zero, zero, zero);
    for i in 0..32 {
        let x = k.w[i].mul(c.q[i]);
        wq = wq.add(x);
        wqq = wqq.add(x.mul(c.q[i]));
        w = w.add(k.w[i]);
        wt = wt.add(k.w[i].mul(k.t[i]));
        wtq = wtq.add(x.mul(k.t[i]));
    }
    let (sc, mn) = (c.sc.to_array(), c.mn.to_array());
    let (wq, wqq, w, wt, wtq) = (
        wq.to_array(),
        wqq.to_array(),
        w.to_array(),
        wt.to_array(),
        wtq.to_array(),
    );
    // Columns sc q (for d) and -mn (for dmin): normal equations, in f64.
    let (mut aa, mut ac, mut cc, mut ay, mut cy) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for j in 0..8 {
        let (s, m) = (sc[j] as f64, mn[j] as f64);
        aa += s * s * wqq[j] as f64;
        ac -= s * m * wq[j] as f64;
        cc += m * m * w[j] as f64;
        ay += s * wtq[j] as f64;
        cy -= m * wt[j] as f64;
    }
    let det = aa * cc - ac * ac;
    let (d, dmin) = if cc > 0.0 && det > 1e-9 * aa * cc {
        ((ay * cc - ac * cy) / det, (aa * cy - ac * ay) / det)
    } else {
        (ay / aa, 0.0)
    };
    let (d, dmin) = if dmin < 0.0 {
        (ay / aa, 0.0)
    } else {
        (d, dmin)
    };
    (d >= 0.0 && d.is_finite() && dmin.is_finite()).then_some((d as f32, dmin as f32))
}

/// One Q4_K/Q5_K super-block: stored `d`, `dmin`, the 8 `sc`, `mn` and the 256 values.
#[inline(always)]
fn quantise_affine_k<V: F8>(
    x: &[f32],
    qmax: f32,
) -> (half::f16, half::f16, [u8; 8], [u8; 8], [u8; QK_K]) {
    let zero16 = half::f16::from_f32(0.0);
    let Some(norm) = normaliser(amax(x)) else {
        return (zero16, zero16, [0; 8], [0; 8], [0; QK_K]);
    };
    let mut t = [V::splat(0.0); 32];
    for (i, v) in t.iter_mut().enumerate() {
        let mut a = [0f32; 8];
        for (j, a) in a.iter_mut().enumerate() {
            *a = x[32 * j + i] * norm.0;
        }
        *v = V::from_array(a);
    }
    let w = weights(&t);
    let (s, o) = search_affine(&t, &w, qmax, true);
    let k = SuperK {
        t,
        w,
        ideal: (s, V::splat(0.0).sub(o)),
        qmax,
    };
    let smax = k.ideal.0.to_array().iter().fold(0.0f32, |a, &v| a.max(v));
    let mmax = k.ideal.1.to_array().iter().fold(0.0f32, |a, &v| a.max(v));
    let mut ds = (smax / 63.0, mmax / 63.0);
    let mut cur = choose_k(&k, ds);
    for _ in 0..REFIT {
        let Some(next) = refit_k(&k, &cur) else {
            break;
        };
        let cand = choose_k(&k, next);
        if cand.err < cur.err {
            (ds, cur) = (next, cand);
        } else {
            break;
        }
    }
    let (d, dn) = as_f16(ds.0, norm);
    let (dmin, dminn) = as_f16(ds.1, norm);
    let c = choose_k(&k, (dn, dminn));
    let (sc, mn) = (c.sc.to_array(), c.mn.to_array());
    let mut q = [0u8; QK_K];
    for i in 0..32 {
        for (j, v) in c.q[i].to_array().into_iter().enumerate() {
            q[32 * j + i] = v as u8;
        }
    }
    (d, dmin, sc.map(|v| v as u8), mn.map(|v| v as u8), q)
}

#[inline(always)]
pub(crate) fn quantize_row_q4_k<V: F8>(x: &[f32], out: &mut [u8]) {
    quantize_row_q45_k::<V>(x, out, false)
}

#[inline(always)]
pub(crate) fn quantize_row_q5_k<V: F8>(x: &[f32], out: &mut [u8]) {
    quantize_row_q45_k::<V>(x, out, true)
}

/// Q4_K (`five` false) or Q5_K rows.
#[inline(always)]
fn quantize_row_q45_k<V: F8>(x: &[f32], out: &mut [u8], five: bool) {
    let size = if five { BlockQ5K::SIZE } else { BlockQ4K::SIZE };
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(size)) {
        let (d, dmin, sc, mn, q) = quantise_affine_k::<V>(xb, if five { 31.0 } else { 15.0 });
        let mut qs = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 8];
        for (i, &v) in q.iter().enumerate() {
            let (j, l) = (i / 32, i % 32);
            qs[32 * (j / 2) + l] |= (v & 0x0F) << (4 * (j % 2));
            qh[l] |= (v >> 4) << j;
        }
        let (d, dmin) = (d.to_bits().to_le_bytes(), dmin.to_bits().to_le_bytes());
        let scales = pack_scale_min_k4(&sc, &mn);
        if five {
            BlockQ5K {
                d,
                dmin,
                scales,
                qh,
                qs,
            }
            .write(ob);
        } else {
            BlockQ4K {
                d,
                dmin,
                scales,
                qs,
            }
            .write(ob);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q6_K: `x = d sc_j (q - 32)`, 16 sub-blocks of 16, signed 8-bit sc

const Q6_BOUNDS: (f32, f32) = (-32.0, 31.0);

/// Each sub-block's best `sc` between the neighbours of its ideal ratio to `d` (two groups of 8
/// sub-blocks), the rounded values (`q - 32`) and the total error.
#[inline(always)]
fn choose_q6<V: F8>(
    t: &[[V; 16]; 2],
    w: &[[V; 16]; 2],
    ideal: &[V; 2],
    d: f32,
) -> ([V; 2], [[V; 16]; 2], f32) {
    let bounds = (V::splat(Q6_BOUNDS.0), V::splat(Q6_BOUNDS.1));
    let mut sc = [V::splat(0.0); 2];
    let mut q = [[V::splat(0.0); 16]; 2];
    let mut total = 0.0;
    for g in 0..2 {
        let (a, b) = neighbours(ideal[g], d, -128.0, 127.0);
        let (qa, ea) = requantise(&t[g], &w[g], V::splat(d).mul(a), V::splat(0.0), bounds);
        let (qb, eb) = requantise(&t[g], &w[g], V::splat(d).mul(b), V::splat(0.0), bounds);
        sc[g] = V::lt_select(eb, ea, b, a);
        for i in 0..16 {
            q[g][i] = V::lt_select(eb, ea, qb[i], qa[i]);
        }
        total += hsum(min(ea, eb));
    }
    (sc, q, total)
}

/// Least-squares `d` for fixed integers: `t ≈ d (sc_j q)`.
#[inline(always)]
fn refit_q6<V: F8>(
    t: &[[V; 16]; 2],
    w: &[[V; 16]; 2],
    sc: &[V; 2],
    q: &[[V; 16]; 2],
) -> Option<f32> {
    let (mut aa, mut ay) = (0f64, 0f64);
    for g in 0..2 {
        let zero = V::splat(0.0);
        let (mut wqq, mut wtq) = (zero, zero);
        for i in 0..16 {
            let x = w[g][i].mul(q[g][i]);
            wqq = wqq.add(x.mul(q[g][i]));
            wtq = wtq.add(x.mul(t[g][i]));
        }
        let (s, wqq, wtq) = (sc[g].to_array(), wqq.to_array(), wtq.to_array());
        for j in 0..8 {
            aa += (s[j] as f64) * (s[j] as f64) * wqq[j] as f64;
            ay += s[j] as f64 * wtq[j] as f64;
        }
    }
    let d = ay / aa;
    (aa > 0.0 && d.is_finite()).then_some(d as f32)
}

/// One Q6_K super-block: stored `d`, the 16 `sc` and the 256 values as `q - 32`.
#[inline(always)]
fn quantise_q6_k<V: F8>(x: &[f32]) -> (half::f16, [i8; 16], [i8; QK_K]) {
    let Some(norm) = normaliser(amax(x)) else {
        return (half::f16::from_f32(0.0), [0; 16], [0; QK_K]);
    };
    // Group g, lane j: sub-block 8g + j.
    let mut t = [[V::splat(0.0); 16]; 2];
    for (g, tg) in t.iter_mut().enumerate() {
        for (i, v) in tg.iter_mut().enumerate() {
            let mut a = [0f32; 8];
            for (j, a) in a.iter_mut().enumerate() {
                *a = x[16 * (8 * g + j) + i] * norm.0;
            }
            *v = V::from_array(a);
        }
    }
    // One sigma^2 for the super-block.
    let mut both = [V::splat(0.0); 32];
    both[..16].copy_from_slice(&t[0]);
    both[16..].copy_from_slice(&t[1]);
    let wb = weights(&both);
    let mut w = [[V::splat(0.0); 16]; 2];
    w[0].copy_from_slice(&wb[..16]);
    w[1].copy_from_slice(&wb[16..]);
    let ideal = [
        search_symmetric(&t[0], &w[0], 32.0),
        search_symmetric(&t[1], &w[1], 32.0),
    ];
    // The scale of largest magnitude maps to -128, using the extra negative level.
    let (i0, i1) = (ideal[0].to_array(), ideal[1].to_array());
    let smax = i0
        .iter()
        .chain(&i1)
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let mut d = -smax / 128.0;
    let mut cur = choose_q6(&t, &w, &ideal, d);
    for _ in 0..REFIT {
        let Some(next) = refit_q6(&t, &w, &cur.0, &cur.1) else {
            break;
        };
        let cand = choose_q6(&t, &w, &ideal, next);
        if cand.2 < cur.2 {
            (d, cur) = (next, cand);
        } else {
            break;
        }
    }
    let (dh, dn) = as_f16(d, norm);
    let (sc, q, _) = choose_q6(&t, &w, &ideal, dn);
    let mut scales = [0i8; 16];
    let mut qs = [0i8; QK_K];
    for g in 0..2 {
        for (j, v) in sc[g].to_array().into_iter().enumerate() {
            scales[8 * g + j] = v as i8;
        }
        for i in 0..16 {
            for (j, v) in q[g][i].to_array().into_iter().enumerate() {
                qs[16 * (8 * g + j) + i] = v as i8;
            }
        }
    }
    (dh, scales, qs)
}

#[inline(always)]
pub(crate) fn quantize_row_q6_k<V: F8>(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BlockQ6K::SIZE))
    {
        let (d, scales, q) = quantise_q6_k::<V>(xb);
        let mut blk = BlockQ6K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales,
            d: d.to_bits().to_le_bytes(),
        };
        for (i, &v) in q.iter().enumerate() {
            let u = (v as i32 + 32) as u8;
            let (h, sb, l) = (i / 128, (i % 128) / 32, i % 32);
            blk.ql[64 * h + 32 * (sb % 2) + l] |= (u & 0x0F) << (4 * (sb / 2));
            blk.qh[32 * h + l] |= (u >> 4) << (2 * sb);
        }
        blk.write(ob);
    }
}
