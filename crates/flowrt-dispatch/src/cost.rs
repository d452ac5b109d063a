//! What each group costs: weight bytes read and FLOPs per token.

use flowrt_model::plan::Op;
use flowrt_model::{Model, Plan, WeightMatrix};

/// The cost of one command group.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupCost {
    /// Weight bytes the group reads once per batch (matrices; norms are negligible).
    pub weight_bytes: u64,
    /// FLOPs per token of the matmuls (2 per multiply-add).
    pub matmul_flops: u64,
    /// FLOPs per token per attended position (scores and weighted sum: 4 · q_dim).
    pub attention_flops_per_pos: u64,
}

impl GroupCost {
    /// FLOPs per token at context position `pos` (attending `pos + 1` positions, or the
    /// layer's window).
    pub fn flops_per_token(&self, attended: usize) -> u64 {
        self.matmul_flops + self.attention_flops_per_pos * attended as u64
    }
}

/// The cost of every group of `plan` over `model`'s weights.
pub fn group_costs(model: &Model, plan: &Plan) -> Vec<GroupCost> {
    let c = &model.config;
    let mat = |w: &WeightMatrix| ((w.rows * w.row_bytes) as u64, 2 * (w.rows * w.cols) as u64);
    plan.groups
        .iter()
        .map(|g| {
            let mut cost = GroupCost::default();
            for op in &g.ops {
                match *op {
                    Op::MatMul { weight, .. } => {
                        let Some(w) = model.matrix(g.kind.layer(), weight) else {
                            continue;
                        };
                        let (bytes, flops) = mat(w);
                        cost.weight_bytes += bytes;
                        cost.matmul_flops += flops;
                    }
                    Op::Embed { .. } => cost.weight_bytes += model.token_embd.row_bytes as u64,
                    // Causal: a token at position p attends p + 1 positions (what the
                    // batch's `attended` counts). Bidirectional: every token of a span sees the
                    // whole span, about twice as many.
                    Op::Attention { causal, .. } => {
                        let per_pos = 4 * c.q_dim() as u64;
                        cost.attention_flops_per_pos += if causal { per_pos } else { 2 * per_pos };
                    }
                    // A mixture of experts: each token runs `top_k` experts. Bytes count the
                    // experts of one token (what a decoded token reads); a batch of many tokens
                    // reads up to every expert once.
                    Op::Moe { top_k, .. } => {
                        let layer = g.kind.layer().and_then(|l| model.layers.get(l));
                        if let Some(x) = layer.and_then(|l| l.moe.as_ref()) {
                            let n = x.gate.len().max(1) as u64;
                            let (bytes, flops) = x
                                .experts()
                                .map(mat)
                                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                            cost.weight_bytes += bytes * top_k as u64 / n;
                            cost.matmul_flops += flops * top_k as u64 / n;
                        }
                    }
                    _ => {}
                }
            }
            cost
        })
        .collect()
}
