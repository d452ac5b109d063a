//! Mixture-of-experts feed-forward blocks ([`flowrt_model::Op::Moe`]) on the CPU.
//!
//! Each token's router logits pick its top-k experts and their weights ([`route`]). Tokens are
//! then grouped by expert, so that each chosen expert's matrices are read once per batch: its
//! tokens' input rows are gathered, run through the expert's gated feed-forward as one matmul
//! per matrix ([`ExpertJob::run`]), and the outputs are added, weighted, to the tokens' rows
//! in expert order. Experts run in parallel (one task per expert); an expert no token chose
//! is not read at all.

use flowrt_dtype::GgmlType;
use flowrt_kernels::Kernels;
use flowrt_model::{Activation, MoeWeights, Router, RouterScoring, WeightMatrix};

/// The format of quantised activation rows for a weight type (see `exec::ActRows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowFormat {
    Ggml(GgmlType),
    Q16,
}

/// One expert's share of a batch, and its scratch (kept between batches).
#[derive(Default)]
pub(crate) struct ExpertJob {
    /// (batch row, routing weight) of each token that chose this expert.
    pub rows: Vec<(usize, f32)>,
    x: Vec<f32>,    // (m, hidden) gathered input rows
    act: Vec<u8>,   // (m, row bytes) quantised activation rows of the current matmul
    gate: Vec<f32>, // (m, moe_intermediate)
    up: Vec<f32>,   // (m, moe_intermediate)
    /// (m, hidden) the expert's output for each of its rows.
    pub out: Vec<f32>,
}

/// The experts token `logits` (one per expert) chooses and their weights, into `chosen`
/// (best first): scores by `router.scoring`; the `top_k` highest scores (plus
/// `selection_bias`, one per expert, when given: it moves the choice, not the weights; ties
/// to the lower index); their scores divided by their sum + `router.renorm_eps` when
/// `router.renormalize`, then multiplied by `router.scale`. `scores`: scratch, one per
/// expert (kept between tokens, so routing allocates nothing once it has grown).
pub(crate) fn route(
    logits: &[f32],
    top_k: usize,
    router: Router,
    selection_bias: Option<&[f32]>,
    scores: &mut Vec<f32>,
    chosen: &mut Vec<(usize, f32)>,
) {
    chosen.clear();
    scores.clear();
    match router.scoring {
        RouterScoring::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            scores.extend(logits.iter().map(|&l| (l - max).exp()));
            let sum: f32 = scores.iter().sum();
            scores.iter_mut().for_each(|v| *v /= sum);
        }
        // Chosen by raw logit; weighted by a softmax over the chosen ones below.
        RouterScoring::TopKSoftmax => scores.extend_from_slice(logits),
        RouterScoring::Sigmoid => scores.extend(logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp()))),
    }
    let scores = &scores[..];
    // What the choice ranks by: the score, plus the expert's selection bias when given.
    let key = |i: usize| match selection_bias {
        Some(b) => scores[i] + b[i],
        None => scores[i],
    };
    for _ in 0..top_k.min(scores.len()) {
        let mut best: Option<usize> = None;
        for i in 0..scores.len() {
            if chosen.iter().any(|&(c, _)| c == i) {
                continue;
            }
            if best.is_none_or(|b| key(i) > key(b)) {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            chosen.push((b, scores[b]));
        }
    }
    if router.scoring == RouterScoring::TopKSoftmax {
        // Best first: the first is the max.
        let max = chosen.first().map_or(0.0, |c| c.1);
        chosen.iter_mut().for_each(|c| c.1 = (c.1 - max).exp());
        let sum: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= sum);
    } else if router.renormalize {
        let sum = chosen.iter().map(|c| c.1).sum::<f32>() + router.renorm_eps;
        if sum > 0.0 {
            chosen.iter_mut().for_each(|c| c.1 /= sum);
        }
    }
    if router.scale != 1.0 {
        chosen.iter_mut().for_each(|c| c.1 *= router.scale);
    }
}

impl ExpertJob {
    /// Run expert `e` of `w` on this job's rows of `src` (`(n, hidden)`), into `out`.
    /// `packed`: the expert's gate, up and down matrices in the x8 layout, where they were
    /// repacked at load (the row layout of `w` otherwise).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &mut self,
        kern: &Kernels,
        fmt: &dyn Fn(GgmlType) -> RowFormat,
        w: &MoeWeights,
        e: usize,
        packed: [Option<&[u8]>; 3],
        src: &[f32],
        act: Activation,
    ) {
        let m = self.rows.len();
        if m == 0 {
            return;
        }
        let (gate_w, up_w, down_w) = (&w.gate[e], &w.up[e], &w.down[e]);
        let (h, ff) = (gate_w.cols, gate_w.rows);
        self.x.clear();
        for &(t, _) in &self.rows {
            self.x.extend_from_slice(&src[t * h..(t + 1) * h]);
        }
        self.gate.resize(m * ff, 0.0);
        self.up.resize(m * ff, 0.0);
        self.out.resize(m * h, 0.0);
        let [p_gate, p_up, p_down] = packed;
        matmul(
            kern,
            fmt,
            gate_w,
            p_gate,
            &self.x,
            m,
            &mut self.act,
            &mut self.gate,
        );
        matmul(
            kern,
            fmt,
            up_w,
            p_up,
            &self.x,
            m,
            &mut self.act,
            &mut self.up,
        );
        // Per-expert biases (gpt-oss), one row of each per expert.
        let add_bias = |rows: &mut [f32], bias: &Option<Vec<f32>>, width: usize| {
            if let Some(b) = bias {
                let b = &b[e * width..(e + 1) * width];
                for r in rows.chunks_exact_mut(width) {
                    kern.add(r, b);
                }
            }
        };
        add_bias(&mut self.gate, &w.gate_bias, ff);
        add_bias(&mut self.up, &w.up_bias, ff);
        match act {
            Activation::Silu => kern.silu_mul(&mut self.gate, &self.up),
            Activation::GeluTanh => kern.gelu_tanh_mul(&mut self.gate, &self.up),
            Activation::Gelu => crate::ops::gelu_mul(&mut self.gate, &self.up),
            Activation::ClampedSwiglu { alpha, limit } => {
                crate::ops::clamped_swiglu_mul(&mut self.gate, &self.up, alpha, limit)
            }
        }
        matmul(
            kern,
            fmt,
            down_w,
            p_down,
            &self.gate,
            m,
            &mut self.act,
            &mut self.out,
        );
        add_bias(&mut self.out, &w.down_bias, h);
    }
}

/// `out = x · Wᵀ` for `m` rows of `x`, quantising them into `act` first; `packed`: `w` in
/// the x8 layout, if it was repacked.
#[allow(clippy::too_many_arguments)]
fn matmul(
    kern: &Kernels,
    fmt: &dyn Fn(GgmlType) -> RowFormat,
    w: &WeightMatrix,
    packed: Option<&[u8]>,
    x: &[f32],
    m: usize,
    act: &mut Vec<u8>,
    out: &mut [f32],
) {
    let k = w.cols;
    let f = fmt(w.dtype);
    let row = match f {
        RowFormat::Q16 => flowrt_kernels::q16::q16_row_size(k),
        RowFormat::Ggml(t) => flowrt_kernels::row_size(t, k),
    };
    act.resize(m * row, 0);
    for (r, dst) in act.chunks_exact_mut(row).enumerate() {
        let xr = &x[r * k..(r + 1) * k];
        match f {
            RowFormat::Q16 => kern.quantize_row_q16(xr, dst),
            RowFormat::Ggml(t) => kern.quantize_row(t, xr, dst),
        }
    }
    let out = &mut out[..m * w.rows];
    match (f, packed) {
        (RowFormat::Q16, Some(p)) => kern.matmul_q16_x8(w.dtype, k, p, w.rows, act, m, out, w.rows),
        (RowFormat::Q16, None) => {
            kern.matmul_q16(w.dtype, k, w.bytes(), w.rows, act, m, out, w.rows)
        }
        (RowFormat::Ggml(_), _) => kern.matmul(w.dtype, k, w.bytes(), w.rows, act, m, out, w.rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOFTMAX: RouterScoring = RouterScoring::Softmax;

    fn experts(c: &[(usize, f32)]) -> Vec<usize> {
        c.iter().map(|x| x.0).collect()
    }

    fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + (-x).exp())
    }

    #[test]
    fn route_picks_the_top_k_and_renormalises() {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        let logits = [0.0, 2.0, -1.0, 1.0];
        route(
            &logits,
            2,
            Router::plain(SOFTMAX, true),
            None,
            &mut s,
            &mut c,
        );
        assert_eq!(experts(&c), [1, 3]);
        let (a, b) = (2f32.exp(), 1f32.exp());
        assert!((c[0].1 - a / (a + b)).abs() < 1e-6);
        assert!((c[0].1 + c[1].1 - 1.0).abs() < 1e-6);
        route(
            &logits,
            2,
            Router::plain(SOFTMAX, false),
            None,
            &mut s,
            &mut c,
        );
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((c[1].1 - b / z).abs() < 1e-6);
    }

    /// LFM2-MoE's router: sigmoid scores; the top-k chosen by score + selection bias (here
    /// the bias sinks expert 1, the best score, and lifts expert 2), weighted by the unbiased
    /// scores, divided by their sum + eps, times the scale.
    #[test]
    fn sigmoid_route_chooses_by_biased_score_and_weights_by_the_unbiased_one() {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        let logits = [0.0, 2.0, -1.0, 1.0, -3.0];
        let bias = [0.0, -0.9, 0.6, 0.0, 0.1];
        let router = Router {
            scoring: RouterScoring::Sigmoid,
            renormalize: true,
            renorm_eps: 1e-6,
            scale: 2.5,
            selection_bias: true,
        };
        route(&logits, 2, router, Some(&bias), &mut s, &mut c);
        // Scores 0.5, 0.881, 0.269, 0.731, 0.047; biased 0.5, -0.019, 0.869, 0.731, 0.147:
        // experts 2 then 3 (unbiased, 1 and 3).
        assert_eq!(experts(&c), [2, 3]);
        let (p2, p3) = (sigmoid(-1.0), sigmoid(1.0));
        let d = p2 + p3 + 1e-6;
        assert!((c[0].1 - 2.5 * p2 / d).abs() < 1e-6, "{c:?}");
        assert!((c[1].1 - 2.5 * p3 / d).abs() < 1e-6, "{c:?}");

        // Without the bias: plain top-k by score (experts 1 and 3).
        route(&logits, 2, router, None, &mut s, &mut c);
        assert_eq!(experts(&c), [1, 3]);

        // A bias that reorders the whole choice: expert 4 (score 0.047) first.
        let lift = [0.0, 0.0, 0.0, 0.0, 1.0];
        route(&logits, 3, router, Some(&lift), &mut s, &mut c);
        assert_eq!(experts(&c), [4, 1, 3]);
        let sum: f32 = [-3.0f32, 2.0, 1.0].iter().map(|&l| sigmoid(l)).sum();
        assert!((c[0].1 - 2.5 * sigmoid(-3.0) / (sum + 1e-6)).abs() < 1e-6);

        // eps counts: with tiny scores the weights sum to sum / (sum + eps), not 1.
        let tiny = [-20.0f32, -20.0, -20.0];
        let r = Router {
            scale: 1.0,
            ..router
        };
        route(&tiny, 2, r, None, &mut s, &mut c);
        let p = sigmoid(-20.0);
        let want = p / (2.0 * p + 1e-6);
        assert!((c[0].1 - want).abs() < 1e-3 * want, "{} vs {want}", c[0].1);
        assert!(c[0].1 + c[1].1 < 0.99);

        // Not renormalised: the raw sigmoid scores, scaled.
        let r = Router {
            renormalize: false,
            ..router
        };
        route(&logits, 2, r, Some(&bias), &mut s, &mut c);
        assert!((c[0].1 - 2.5 * p2).abs() < 1e-6);
        assert!((c[1].1 - 2.5 * p3).abs() < 1e-6);
    }
}
