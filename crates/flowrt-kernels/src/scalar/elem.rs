//! Scalar f32 element-wise operations and attention helpers (lengths checked by the caller).

use half::f16;

pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss / x.len().max(1) as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * w;
    }
}

#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `0.5 x (1 + tanh(y))` with `y = sqrt(2/pi) (x + 0.044715 x^3)`, computed as
/// `x / (1 + exp(-2y))` (the same function: `(1 + tanh y) / 2 = sigmoid(2y)`).
#[inline]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let y = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * y).exp())
}

pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

pub(crate) fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh(*g) * u;
    }
}

pub(crate) fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

pub(crate) fn softmax(x: &mut [f32]) {
    let (_, sum) = softmax_unscaled(x);
    scale(x, 1.0 / sum);
}

pub(crate) fn softmax_unscaled(x: &mut [f32]) -> (f32, f32) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    (max, sum)
}

pub(crate) fn add(acc: &mut [f32], x: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v;
    }
}

pub(crate) fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(crate) fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}

pub(crate) fn axpy_f32(out: &mut [f32], alpha: f32, x: &[f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o += alpha * v;
    }
}

pub(crate) fn axpy_f16(out: &mut [f32], alpha: f32, x: &[f16]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o += alpha * v.to_f32();
    }
}

pub(crate) fn f32_to_f16(x: &[f32], out: &mut [f16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f16::from_f32(v);
    }
}

pub(crate) fn attn_scores_f16(q: &[f32], hd: usize, k: &[f16], scale: f32, out: &mut [f32]) {
    let len = k.len() / hd;
    for (h, qh) in q.chunks_exact(hd).enumerate() {
        for (j, kj) in k.chunks_exact(hd).enumerate() {
            out[h * len + j] = scale * dot_f32_f16(qh, kj);
        }
    }
}

pub(crate) fn attn_values_f16(p: &[f32], hd: usize, v: &[f16], out: &mut [f32]) {
    let len = v.len() / hd;
    for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
        oh.fill(0.0);
        for (j, vj) in v.chunks_exact(hd).enumerate() {
            axpy_f16(oh, p[h * len + j], vj);
        }
    }
}

/// [`crate::Kernels::panel_dots_f64`] (`W = 8`) and [`crate::Kernels::panel_dots_f32`]
/// (`W = 16`); bounds checked there.
pub(crate) fn panel_dots<T, const W: usize>(
    p: &[T],
    stride: usize,
    i0: usize,
    j0: usize,
    out: &mut [[T; W]; 4],
) where
    T: Copy + Default + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    *out = [[T::default(); W]; 4];
    for row in p.chunks_exact(stride) {
        let b = &row[j0..j0 + W];
        for (o, &a) in out.iter_mut().zip(&row[i0..i0 + 4]) {
            for (acc, &bc) in o.iter_mut().zip(b) {
                *acc += a * bc;
            }
        }
    }
}
