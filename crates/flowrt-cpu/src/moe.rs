//! Mixture-of-experts feed-forward blocks ([`flowrt_model::Op::Moe`]) on the CPU.
//!
//! Each token's router logits pick its top-k experts and their weights ([`route`]). Tokens are
//! then grouped by expert, so that each chosen expert's matrices are read once per batch: the
//! (token, expert) pairs are laid out expert-major, their input rows quantised once, and each
//! expert's gate, up and down matrices multiply all of its rows at once ([`MoeBatch::run`]).
//! The work is split into row blocks of every chosen expert's matrices, so all threads share
//! each phase whether one token chose a few experts (decode) or a batch chose most of them
//! (prefill). The outputs are added, weighted, to the tokens' rows in expert order. An expert
//! no token chose is not read at all.

use flowrt_dtype::GgmlType;
use flowrt_kernels::Kernels;
use flowrt_model::{Activation, MoeWeights, Router, RouterScoring, WeightMatrix};

use crate::act::ActRows;
use crate::pool::ThreadPool;

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

/// Scratch of one mixture-of-experts layer's batch, kept between batches (nothing is
/// allocated once it has grown). Rows are held expert-major: each chosen (token, expert)
/// pair is a *slot*, and expert `e`'s slots are `span[e]`, in token order.
#[derive(Default)]
pub(crate) struct MoeBatch {
    /// (first slot, slots) of each expert.
    span: Vec<(usize, usize)>,
    /// Experts with at least one slot, in index order.
    active: Vec<usize>,
    /// Token row and routing weight of each slot.
    slot_tok: Vec<usize>,
    slot_wt: Vec<f32>,
    /// Each token's slots, in expert order (`top_k` places per token, `tok_n` used).
    tok_slots: Vec<usize>,
    tok_n: Vec<usize>,
    /// Each token's chosen experts and weights (`top_k` places per token).
    chosen: Vec<(usize, f32)>,
    /// [`route`]'s scratch and answer for one token.
    scores: Vec<f32>,
    one: Vec<(usize, f32)>,
    /// Quantised input rows of the slots, for the gate matmul and (when its weights want
    /// another format) the up matmul.
    act_gate: Vec<u8>,
    act_up: Vec<u8>,
    /// (slots, moe_intermediate) activated gate × up of each slot, and its quantised rows.
    mid: Vec<f32>,
    act_mid: Vec<u8>,
    /// (slots, hidden) each slot's expert output.
    out: Vec<f32>,
    /// Per thread: the gate and up tiles of one task.
    tiles: Vec<std::sync::Mutex<(Vec<f32>, Vec<f32>)>>,
}

/// What one mixture-of-experts layer runs with.
pub(crate) struct MoeLayer<'a> {
    pub kern: &'static Kernels,
    /// The activation row format for a weight type, repacked (true) or not.
    pub fmt: &'a (dyn Fn(GgmlType, bool) -> ActRows + Sync),
    pub w: &'a MoeWeights,
    /// Expert `e`'s gate (0), up (1) or down (2) matrix in the x8 layout, where it was
    /// repacked at load (the row layout of `w` otherwise).
    pub packed: &'a (dyn Fn(usize, usize) -> Option<&'a [u8]> + Sync),
    pub act: Activation,
    pub top_k: usize,
    pub router: Router,
    /// The router's selection bias, one per expert, where it has one.
    pub selection_bias: Option<&'a [f32]>,
}

impl MoeBatch {
    /// `dst` (`(n, hidden)`) = the weighted sum, in expert order, of each row of `src`'s
    /// chosen experts' gated feed-forward outputs, routed by `logits` (`(n, experts)`).
    ///
    /// Each chosen expert's matrices are read once per batch, and the work is spread over the
    /// pool by row blocks of every chosen expert's matrices, so a few experts (decode) keep
    /// every thread busy as well as many do (prefill): the slots' inputs are quantised once,
    /// gate and up run together with the activation applied per row block, then the down
    /// projection, then each token's sum.
    pub(crate) fn run(
        &mut self,
        pool: &ThreadPool,
        l: &MoeLayer<'_>,
        src: &[f32],
        logits: &[f32],
        n: usize,
        dst: &mut [f32],
    ) {
        let w = l.w;
        let ne = w.gate.len();
        let (h, ff) = (
            w.gate.first().map_or(0, |g| g.cols),
            w.gate.first().map_or(0, |g| g.rows),
        );
        let k = l.top_k.min(ne);
        // Route every token, then lay the slots out expert-major, tokens ascending.
        self.chosen.resize(n * k, (0, 0.0));
        self.tok_n.clear();
        self.tok_n.resize(n, 0);
        self.span.clear();
        self.span.resize(ne, (0, 0));
        for t in 0..n {
            let lg = &logits[t * ne..(t + 1) * ne];
            route(
                lg,
                k,
                l.router,
                l.selection_bias,
                &mut self.scores,
                &mut self.one,
            );
            for (j, &(e, wt)) in self.one.iter().enumerate() {
                self.chosen[t * k + j] = (e, wt);
                self.span[e].1 += 1;
            }
            self.tok_n[t] = self.one.len();
        }
        let mut at = 0;
        self.active.clear();
        for (e, sp) in self.span.iter_mut().enumerate() {
            sp.0 = at;
            at += sp.1;
            if sp.1 > 0 {
                self.active.push(e);
            }
            sp.1 = 0; // refilled below
        }
        let slots = at;
        self.slot_tok.resize(slots, 0);
        self.slot_wt.resize(slots, 0.0);
        for t in 0..n {
            for &(e, wt) in &self.chosen[t * k..t * k + self.tok_n[t]] {
                let s = self.span[e].0 + self.span[e].1;
                self.span[e].1 += 1;
                self.slot_tok[s] = t;
                self.slot_wt[s] = wt;
            }
        }
        // Each token's slots in expert order (the order the reference adds them in).
        self.tok_slots.resize(n * k, 0);
        self.tok_n.iter_mut().for_each(|c| *c = 0);
        for &e in &self.active {
            let (s0, m) = self.span[e];
            for s in s0..s0 + m {
                let t = self.slot_tok[s];
                self.tok_slots[t * k + self.tok_n[t]] = s;
                self.tok_n[t] += 1;
            }
        }
        let d = &mut dst[..n * h];
        if slots == 0 {
            d.fill(0.0);
            return;
        }
        let (Some(g0), Some(u0), Some(d0)) = (w.gate.first(), w.up.first(), w.down.first()) else {
            return;
        };
        let fmt = |m: &WeightMatrix, which: usize| (l.fmt)(m.dtype, (l.packed)(0, which).is_some());
        let (f_gate, f_up, f_down) = (fmt(g0, 0), fmt(u0, 1), fmt(d0, 2));
        let kern = l.kern;
        // The slots' input rows, quantised once for gate and up.
        let slot_tok = &self.slot_tok;
        quantize_rows(pool, kern, f_gate, h, slots, &mut self.act_gate, &|s| {
            &src[slot_tok[s] * h..(slot_tok[s] + 1) * h]
        });
        if f_up != f_gate {
            quantize_rows(pool, kern, f_up, h, slots, &mut self.act_up, &|s| {
                &src[slot_tok[s] * h..(slot_tok[s] + 1) * h]
            });
        }
        let threads = pool.n_threads();
        if self.tiles.len() < threads {
            self.tiles.resize_with(threads, Default::default);
        }
        // Gate and up, row blocks of every active expert; the activation per block.
        let (active, span, tiles) = (&self.active, &self.span, &self.tiles);
        let blocks = Blocks::new(active, span, ff, threads);
        // Every thread's tiles sized for the largest tile before the split, so that which
        // thread gets which tile (timing) never grows one mid-step.
        grow_tiles(&tiles[..threads], blocks.most(), true);
        let act_gate = &self.act_gate[..];
        let act_up = if f_up != f_gate {
            &self.act_up[..]
        } else {
            act_gate
        };
        self.mid.resize(slots * ff, 0.0);
        pool.for_each_tile(
            &mut self.mid,
            ff,
            blocks.len(),
            &|i| blocks.tile(i).1,
            &|tid, i, wr| {
                let (e, (s0, _, c0, c1)) = blocks.tile(i);
                let (m, nr) = (wr.n_rows(), c1 - c0);
                let mut t = tiles[tid].lock().unwrap_or_else(|e| e.into_inner());
                let (gt, ut) = &mut *t;
                gt.resize(m * nr, 0.0);
                ut.resize(m * nr, 0.0);
                let ga = &act_gate[s0 * f_gate.row_size(h)..(s0 + m) * f_gate.row_size(h)];
                let ua = &act_up[s0 * f_up.row_size(h)..(s0 + m) * f_up.row_size(h)];
                f_gate.matmul(kern, &w.gate[e], (l.packed)(e, 0), c0, c1, ga, m, gt);
                f_up.matmul(kern, &w.up[e], (l.packed)(e, 1), c0, c1, ua, m, ut);
                // Per-expert biases (gpt-oss), one row of each per expert.
                for (rows, bias) in [(&mut *gt, &w.gate_bias), (&mut *ut, &w.up_bias)] {
                    if let Some(b) = bias {
                        let b = &b[e * ff + c0..e * ff + c1];
                        rows.chunks_exact_mut(nr).for_each(|r| kern.add(r, b));
                    }
                }
                match l.act {
                    Activation::Silu => kern.silu_mul(gt, ut),
                    Activation::GeluTanh => kern.gelu_tanh_mul(gt, ut),
                    Activation::Gelu => crate::ops::gelu_mul(gt, ut),
                    Activation::ClampedSwiglu { alpha, limit } => {
                        crate::ops::clamped_swiglu_mul(gt, ut, alpha, limit)
                    }
                }
                for r in 0..m {
                    wr.row(r).copy_from_slice(&gt[r * nr..(r + 1) * nr]);
                }
            },
        );
        let mid = &self.mid;
        quantize_rows(pool, kern, f_down, ff, slots, &mut self.act_mid, &|s| {
            &mid[s * ff..(s + 1) * ff]
        });
        // Down, row blocks of every active expert.
        let blocks = Blocks::new(active, span, h, threads);
        grow_tiles(&tiles[..threads], blocks.most(), false);
        let act_mid = &self.act_mid[..];
        self.out.resize(slots * h, 0.0);
        pool.for_each_tile(
            &mut self.out,
            h,
            blocks.len(),
            &|i| blocks.tile(i).1,
            &|tid, i, wr| {
                let (e, (s0, _, c0, c1)) = blocks.tile(i);
                let (m, nr) = (wr.n_rows(), c1 - c0);
                let mut t = tiles[tid].lock().unwrap_or_else(|e| e.into_inner());
                let dt = &mut t.0;
                dt.resize(m * nr, 0.0);
                let a = &act_mid[s0 * f_down.row_size(ff)..(s0 + m) * f_down.row_size(ff)];
                f_down.matmul(kern, &w.down[e], (l.packed)(e, 2), c0, c1, a, m, dt);
                if let Some(b) = &w.down_bias {
                    let b = &b[e * h + c0..e * h + c1];
                    dt.chunks_exact_mut(nr).for_each(|r| kern.add(r, b));
                }
                for r in 0..m {
                    wr.row(r).copy_from_slice(&dt[r * nr..(r + 1) * nr]);
                }
            },
        );
        // Each token's weighted sum, in expert order.
        let (out, slot_wt, tok_slots, tok_n) =
            (&self.out, &self.slot_wt, &self.tok_slots, &self.tok_n);
        pool.for_each_chunk_mut(d, h, &|_, t, row| {
            row.fill(0.0);
            for &s in &tok_slots[t * k..t * k + tok_n[t]] {
                kern.axpy_f32(row, slot_wt[s], &out[s * h..(s + 1) * h]);
            }
        });
    }
}

/// The tiles of one phase: each active expert's `width` output rows in blocks of `rb`
/// (`per` blocks an expert), over that expert's slots.
struct Blocks<'b> {
    active: &'b [usize],
    span: &'b [(usize, usize)],
    width: usize,
    rb: usize,
    per: usize,
}

impl<'b> Blocks<'b> {
    fn new(active: &'b [usize], span: &'b [(usize, usize)], width: usize, threads: usize) -> Self {
        let rb = crate::exec::row_block(active.len() * width, threads);
        Blocks {
            active,
            span,
            width,
            rb,
            per: width.div_ceil(rb),
        }
    }

    fn len(&self) -> usize {
        self.active.len() * self.per
    }

    /// The most values a tile holds: an expert's most slots times a row block.
    fn most(&self) -> usize {
        let slots = self.active.iter().map(|&e| self.span[e].1).max();
        slots.unwrap_or(0) * self.rb.min(self.width)
    }

    /// Tile `i`: its expert, and (first slot, end slot, first row, end row) of the output.
    fn tile(&self, i: usize) -> (usize, (usize, usize, usize, usize)) {
        let (e, b) = (self.active[i / self.per], i % self.per);
        let (s0, m) = self.span[e];
        let c1 = ((b + 1) * self.rb).min(self.width);
        (e, (s0, s0 + m, b * self.rb, c1))
    }
}

/// Grows each thread's tile scratch (the first, and with `both` the second) to `n` values.
fn grow_tiles(tiles: &[std::sync::Mutex<(Vec<f32>, Vec<f32>)>], n: usize, both: bool) {
    for t in tiles {
        let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
        if t.0.len() < n {
            t.0.resize(n, 0.0);
        }
        if both && t.1.len() < n {
            t.1.resize(n, 0.0);
        }
    }
}

/// Quantise `rows` rows of `k` values (`row(i)` gives row `i`) into `act`, in parallel.
fn quantize_rows<'s>(
    pool: &ThreadPool,
    kern: &Kernels,
    f: ActRows,
    k: usize,
    rows: usize,
    act: &mut Vec<u8>,
    row: &(dyn Fn(usize) -> &'s [f32] + Sync),
) {
    let rs = f.row_size(k);
    act.resize(rows * rs, 0);
    // Rows are short next to a matmul: several per task.
    pool.for_each_chunk_mut(&mut act[..rows * rs], rs * 8, &|_, i, part| {
        for (j, dst) in part.chunks_exact_mut(rs).enumerate() {
            f.quantize(kern, row(i * 8 + j), dst);
        }
    });
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

    type PackedFn<'a> = dyn Fn(usize, usize) -> Option<&'a [u8]> + Sync + 'a;

    /// A random `rows x cols` Q4_0 matrix and its dequantised values.
    fn q4_0_matrix(rows: usize, cols: usize, seed: &mut u64) -> (WeightMatrix, Vec<f32>) {
        let kern = Kernels::scalar();
        let rb = flowrt_kernels::row_size(GgmlType::Q4_0, cols);
        let (mut bytes, mut deq) = (vec![0u8; rows * rb], vec![0f32; rows * cols]);
        let mut x = vec![0f32; cols];
        for r in 0..rows {
            for v in x.iter_mut() {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *v = ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2;
            }
            kern.quantize_row(GgmlType::Q4_0, &x, &mut bytes[r * rb..(r + 1) * rb]);
            kern.dequantize_row(
                GgmlType::Q4_0,
                &bytes[r * rb..(r + 1) * rb],
                &mut deq[r * cols..(r + 1) * cols],
            );
        }
        let w = WeightMatrix {
            name: "expert".into(),
            dtype: GgmlType::Q4_0,
            rows,
            cols,
            row_bytes: rb,
            data: flowrt_model::WeightData::Owned(std::sync::Arc::new(bytes)),
        };
        (w, deq)
    }

    /// The batch's experts, split into row blocks over threads (several blocks per expert,
    /// a short last block, x8-packed and row-layout weights, one token and many), equal a
    /// plain per-token evaluation in f32 up to the activations' 16-bit rounding.
    #[test]
    fn moe_batch_equals_a_per_token_reference() {
        let (ne, h, ff, top_k) = (8, 256, 352, 3);
        let mut seed = 7u64;
        let mut deq = Vec::new();
        let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ne {
            let (g, gd) = q4_0_matrix(ff, h, &mut seed);
            let (u, ud) = q4_0_matrix(ff, h, &mut seed);
            let (d, dd) = q4_0_matrix(h, ff, &mut seed);
            gate.push(g);
            up.push(u);
            down.push(d);
            deq.push([gd, ud, dd]);
        }
        let (router, _) = q4_0_matrix(ne, h, &mut seed);
        let w = MoeWeights {
            router,
            gate,
            up,
            down,
            router_bias: None,
            selection_bias: None,
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        };
        let kern = Kernels::detect();
        let packed: Vec<[Vec<u8>; 3]> = (0..ne)
            .map(|e| {
                [&w.gate[e], &w.up[e], &w.down[e]].map(|m| {
                    let mut p = vec![0u8; flowrt_kernels::x8::packed_size(m.dtype, m.rows, m.cols)];
                    flowrt_kernels::x8::pack(m.dtype, m.rows, m.cols, m.bytes(), &mut p);
                    p
                })
            })
            .collect();
        let with_x8 = |e: usize, which: usize| Some(&packed[e][which][..]);
        let rows_only = |_: usize, _: usize| None;
        let fmt = |_: GgmlType, _: bool| ActRows::Q16;
        let router = Router::plain(SOFTMAX, true);
        for n in [1usize, 2, 19] {
            let mut x = vec![0f32; n * h];
            let mut logits = vec![0f32; n * ne];
            for v in x.iter_mut().chain(logits.iter_mut()) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *v = (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            }
            // Reference: each token, each chosen expert, in f32.
            let mut want = vec![0f32; n * h];
            let (mut sc, mut ch) = (Vec::new(), Vec::new());
            for t in 0..n {
                route(
                    &logits[t * ne..(t + 1) * ne],
                    top_k,
                    router,
                    None,
                    &mut sc,
                    &mut ch,
                );
                let xt = &x[t * h..(t + 1) * h];
                for &(e, wt) in &ch {
                    let [gd, ud, dd] = &deq[e];
                    let dot = |m: &[f32], r: usize, v: &[f32]| -> f32 {
                        m[r * v.len()..(r + 1) * v.len()]
                            .iter()
                            .zip(v)
                            .map(|(a, b)| a * b)
                            .sum()
                    };
                    let mid: Vec<f32> = (0..ff)
                        .map(|r| {
                            let (g, u) = (dot(gd, r, xt), dot(ud, r, xt));
                            g / (1.0 + (-g).exp()) * u
                        })
                        .collect();
                    for r in 0..h {
                        want[t * h + r] += wt * dot(dd, r, &mid);
                    }
                }
            }
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let layouts: [&PackedFn; 2] = [&with_x8, &rows_only];
                for packed in layouts {
                    let layer = MoeLayer {
                        kern,
                        fmt: &fmt,
                        w: &w,
                        packed,
                        act: Activation::Silu,
                        top_k,
                        router,
                        selection_bias: None,
                    };
                    let mut got = vec![f32::NAN; n * h];
                    let mut batch = MoeBatch::default();
                    batch.run(&pool, &layer, &x, &logits, n, &mut got);
                    let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
                    for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - r).abs() <= 2e-3 * scale,
                            "n {n}, {threads} threads, value {i}: {g} vs {r} (scale {scale})"
                        );
                    }
                }
            }
        }
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
