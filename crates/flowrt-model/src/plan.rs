//! The forward pass as data: a sequence of per-layer command groups.
//!
//! A backend executes groups in order over a batch of tokens. A later dispatcher submits them
//! in bounded chunks ("runlists"); nothing here assumes the whole pass runs at once, so any
//! prefix of groups can run, stop, and the rest continue.
//!
//! Activation buffers (per batch of `n` tokens):
//! - `X`      (n, hidden)        residual stream
//! - `Xn`     (n, hidden)        normalised residual stream
//! - `Q`      (n, q_dim)         queries, `K`/`V` (n, kv_dim) keys and values
//! - `Attn`   (n, q_dim)         attention output before the output projection
//! - `Proj`   (n, hidden)        a projection back into the residual width
//! - `Gate`/`Up` (n, intermediate)
//! - `Router` (n, num_experts)  a mixture of experts' router logits (0 wide without experts)
//! - `ConvIn` (n, 3 × hidden)    a short convolution's B, C and x (0 wide without convolution
//!   layers)
//! - `Logits` (n_out, vocab)     for the tokens whose logits were asked for
//!
//! An embedding plan ([`Plan::embedding`]) ends instead with one pooled row per sequence of
//! the batch, `(n_seq, hidden)`, which a backend hands out as its embeddings.

use crate::arch::{Activation, NormKind, NormPosition, Positions, Router};
use crate::config::ModelConfig;
use crate::pooling::Pooling;

/// An activation buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    X,
    Xn,
    Q,
    K,
    V,
    Attn,
    Proj,
    Gate,
    Up,
    Logits,
    Router,
    ConvIn,
}

impl Buf {
    /// Every buffer, in `Buf as usize` order.
    pub const ALL: [Buf; 12] = [
        Buf::X,
        Buf::Xn,
        Buf::Q,
        Buf::K,
        Buf::V,
        Buf::Attn,
        Buf::Proj,
        Buf::Gate,
        Buf::Up,
        Buf::Logits,
        Buf::Router,
        Buf::ConvIn,
    ];

    /// Values per token (per logit row for `Logits`).
    pub fn width(self, c: &ModelConfig) -> usize {
        match self {
            Buf::X | Buf::Xn | Buf::Proj => c.hidden_size,
            Buf::Q | Buf::Attn => c.q_dim(),
            Buf::K | Buf::V => c.kv_dim(),
            Buf::Gate | Buf::Up => c.intermediate_size,
            Buf::Logits => c.vocab_size,
            Buf::Router => c.moe.as_ref().map_or(0, |m| m.num_experts),
            Buf::ConvIn => c.short_conv.as_ref().map_or(0, |_| 3 * c.hidden_size),
        }
    }
}

/// Which normalisation weight an op uses (of the group's layer, or the final one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormWeight {
    /// The norm over the embeddings (families with one).
    Embed,
    Attn,
    /// The attention block's output norm (sandwich norms).
    AttnPost,
    Ffn,
    /// The feed-forward block's output norm (sandwich norms).
    FfnPost,
    Output,
}

/// Which matrix an op multiplies by (of the group's layer, or the output projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatRole {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
    /// A mixture of experts' router, `(num_experts, hidden)`.
    Router,
    Output,
    /// A short convolution layer's input projection to B, C and x, `(3 × hidden, hidden)`.
    ConvIn,
    /// A short convolution layer's output projection, `(hidden, hidden)`.
    ConvOut,
}

impl MatRole {
    /// A decoder layer's dense matrices (each family's layers have some of them), then its
    /// router.
    pub const IN_LAYER: [MatRole; 10] = [
        MatRole::Q,
        MatRole::K,
        MatRole::V,
        MatRole::O,
        MatRole::Gate,
        MatRole::Up,
        MatRole::Down,
        MatRole::ConvIn,
        MatRole::ConvOut,
        MatRole::Router,
    ];
}

/// One step of the forward pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `X[t] = token_embd[token[t]] · scale`.
    Embed { scale: f32 },
    /// `X[t] += pos_embd[pos(t)]`, plus `token_types[0]` when `token_type` (learned absolute
    /// positions; every token is of type 0, one text per sequence).
    AddPositions { token_type: bool },
    /// `dst = rms_norm(src) * weight` (`src` may be `dst`).
    RmsNorm {
        src: Buf,
        dst: Buf,
        weight: NormWeight,
    },
    /// `dst = (src - mean) / √(var + eps) · weight + bias` per row (`src` may be `dst`).
    LayerNorm {
        src: Buf,
        dst: Buf,
        weight: NormWeight,
    },
    /// `dst = src · Wᵀ (+ bias when the family has one)`. For `Output`, only the rows whose
    /// logits were requested.
    MatMul { src: Buf, dst: Buf, weight: MatRole },
    /// Per-head RMSNorm of `Q` and `K` (families with QK-norm).
    QkNorm,
    /// Rotate `Q` and `K` by their positions, with the layer's local RoPE (sliding-window
    /// layers of families that give them their own) or the global one.
    Rope { local: bool },
    /// Append `K` and `V` to the layer's cache at the batch positions.
    StoreKv,
    /// `Attn = softmax(Q·Kᵀ·scale + mask)·V` over the layer's cache (GQA: each KV head
    /// serves `num_attention_heads / num_key_value_heads` query heads; no replication).
    /// `causal`: a query at position `p` sees positions `..= p` (with a window `w`, `p - w + 1
    /// ..= p`); otherwise it sees every position of its sequence up to the end of the
    /// sequence's span in the batch (bidirectional: the whole text, which an encoder's batch
    /// carries at once). Each sequence sees only its own keys. `sinks`: the layer's learned
    /// sink logit of each query head joins that head's softmax denominator (as a score of a
    /// key with no value), so its weights over the real keys sum to less than 1.
    Attention {
        window: Option<usize>,
        causal: bool,
        sinks: bool,
    },
    /// A short gated convolution over the layer's convolution cache: with `src`'s rows split
    /// into `hidden`-wide parts `(B, C, x)`, store `B · x` of each row at its sequence and
    /// position in the layer's cache (as `StoreKv` stores keys), then
    /// `dst[t] = C · Σ_{j<kernel} w_j · Bx[pos - (kernel - 1) + j]` per channel (depthwise; a
    /// position before 0 counts as 0). Reading the cache, not a rolling state, keeps
    /// truncation, batching and chunked prefill exact.
    ShortConv { src: Buf, dst: Buf, kernel: usize },
    /// `Gate = act(Gate) * Up`.
    GatedAct(Activation),
    /// `Up = act(Up)` (plain feed-forward).
    Act(Activation),
    /// A mixture of experts: for each token, score the experts from its router logits
    /// (`logits`, `(n, num_experts)`), pick the `top_k` highest scores, weight them as
    /// `router` says, and `dst[t] = Σ weight_e · down_e(act(gate_e(src[t])) * up_e(src[t]))`
    /// over the chosen experts `e` of the layer.
    Moe {
        src: Buf,
        logits: Buf,
        dst: Buf,
        top_k: usize,
        router: Router,
        activation: Activation,
    },
    /// `X += src · scale`.
    AddResidual { src: Buf, scale: f32 },
    /// `Logits = softcap(Logits · scale)`, `softcap(x) = cap · tanh(x / cap)` when set.
    ScaleLogits { scale: f32, softcap: Option<f32> },
    /// One row per sequence of the batch, pooled from `src`'s rows of that sequence's span
    /// (see [`Pooling`]): the backend's embeddings, `(spans, hidden)`.
    Pool { src: Buf, pooling: Pooling },
}

impl Op {
    /// Short name for traces and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::AddPositions { .. } => "add_positions",
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::MatMul { weight, .. } => match weight {
                MatRole::Q => "matmul_q",
                MatRole::K => "matmul_k",
                MatRole::V => "matmul_v",
                MatRole::O => "matmul_o",
                MatRole::Gate => "matmul_gate",
                MatRole::Up => "matmul_up",
                MatRole::Down => "matmul_down",
                MatRole::Router => "matmul_router",
                MatRole::Output => "matmul_output",
                MatRole::ConvIn => "matmul_conv_in",
                MatRole::ConvOut => "matmul_conv_out",
            },
            Op::QkNorm => "qk_norm",
            Op::Rope { .. } => "rope",
            Op::StoreKv => "store_kv",
            Op::ShortConv { .. } => "short_conv",
            Op::Attention { .. } => "attention",
            Op::GatedAct(_) => "gated_act",
            Op::Act(_) => "act",
            Op::Moe { .. } => "moe",
            Op::AddResidual { .. } => "add_residual",
            Op::ScaleLogits { .. } => "scale_logits",
            Op::Pool { .. } => "pool",
        }
    }
}

/// What a group computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Token embedding lookup.
    Embed,
    /// Attention block of a layer (on a hybrid model's convolution layer, the short
    /// convolution that takes its place).
    Attention { layer: usize },
    /// Feed-forward block of a layer.
    Ffn { layer: usize },
    /// Final norm and output projection.
    Output,
}

impl GroupKind {
    /// The decoder layer this group belongs to, if any.
    pub fn layer(&self) -> Option<usize> {
        match *self {
            GroupKind::Attention { layer } | GroupKind::Ffn { layer } => Some(layer),
            GroupKind::Embed | GroupKind::Output => None,
        }
    }
}

/// A group of ops that runs as a unit.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandGroup {
    pub kind: GroupKind,
    pub ops: Vec<Op>,
}

/// The whole forward pass, compiled once per model.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub groups: Vec<CommandGroup>,
}

impl Plan {
    /// Compile the forward pass for a config. Branches only on the config's fields. A family
    /// without an output projection ([`crate::ArchSpec::lm_head`] false) gets no output group:
    /// it runs only as [`Plan::embedding`].
    pub fn new(cfg: &ModelConfig) -> Plan {
        let arch = cfg.arch;
        let norm = |src: Buf, dst: Buf, weight: NormWeight| match arch.norm {
            NormKind::Rms => Op::RmsNorm { src, dst, weight },
            NormKind::Layer => Op::LayerNorm { src, dst, weight },
        };
        let pre = arch.norm_position == NormPosition::Pre;
        let mut embed = vec![Op::Embed {
            scale: cfg.embedding_multiplier,
        }];
        if arch.positions == Positions::Learned {
            embed.push(Op::AddPositions {
                token_type: arch.token_types,
            });
        }
        if arch.embed_norm {
            embed.push(norm(Buf::X, Buf::X, NormWeight::Embed));
        }
        let mut groups = vec![CommandGroup {
            kind: GroupKind::Embed,
            ops: embed,
        }];
        let residual = cfg.residual_multiplier;
        // A block's output (in `Proj`) joins the residual stream, normalised first with
        // sandwich norms (into `Xn`, free by then); post-norm families then normalise the
        // stream itself.
        let add_block = |ops: &mut Vec<Op>, post: NormWeight, block: NormWeight| {
            if arch.sandwich_norms {
                ops.push(norm(Buf::Proj, Buf::Xn, post));
                ops.push(Op::AddResidual {
                    src: Buf::Xn,
                    scale: residual,
                });
            } else {
                ops.push(Op::AddResidual {
                    src: Buf::Proj,
                    scale: residual,
                });
            }
            if !pre {
                ops.push(norm(Buf::X, Buf::X, block));
            }
        };
        // A block's input: the normalised stream (pre-norm) or the stream itself.
        let input = |ops: &mut Vec<Op>, block: NormWeight| {
            if pre {
                ops.push(norm(Buf::X, Buf::Xn, block));
                Buf::Xn
            } else {
                Buf::X
            }
        };
        for layer in 0..cfg.num_hidden_layers {
            // Attention block: X += Wo · attention(rope(Wq·norm(X)), rope(Wk·norm(X)), Wv·norm(X))
            let mut ops = Vec::new();
            let src = input(&mut ops, NormWeight::Attn);
            if let Some(sc) = cfg.short_conv.as_ref().filter(|s| s.conv_layers[layer]) {
                // Short convolution block: X += Wout · (C · conv(B · x)), (B, C, x) = Win·norm(X).
                // The convolution's output goes to `Xn` (free once Win has read it).
                ops.extend([
                    Op::MatMul {
                        src,
                        dst: Buf::ConvIn,
                        weight: MatRole::ConvIn,
                    },
                    Op::ShortConv {
                        src: Buf::ConvIn,
                        dst: Buf::Xn,
                        kernel: sc.kernel,
                    },
                    Op::MatMul {
                        src: Buf::Xn,
                        dst: Buf::Proj,
                        weight: MatRole::ConvOut,
                    },
                ]);
                add_block(&mut ops, NormWeight::AttnPost, NormWeight::Attn);
                groups.push(CommandGroup {
                    kind: GroupKind::Attention { layer },
                    ops,
                });
            } else {
                for (dst, weight) in [
                    (Buf::Q, MatRole::Q),
                    (Buf::K, MatRole::K),
                    (Buf::V, MatRole::V),
                ] {
                    ops.push(Op::MatMul { src, dst, weight });
                }
                if arch.qk_norm {
                    ops.push(Op::QkNorm);
                }
                if arch.positions == Positions::Rope && cfg.layer_uses_rope(layer) {
                    ops.push(Op::Rope {
                        local: cfg.layer_uses_local_rope(layer),
                    });
                }
                ops.extend([
                    Op::StoreKv,
                    Op::Attention {
                        window: cfg.layer_window(layer),
                        causal: arch.causal,
                        sinks: arch.attn_sinks,
                    },
                    Op::MatMul {
                        src: Buf::Attn,
                        dst: Buf::Proj,
                        weight: MatRole::O,
                    },
                ]);
                add_block(&mut ops, NormWeight::AttnPost, NormWeight::Attn);
                groups.push(CommandGroup {
                    kind: GroupKind::Attention { layer },
                    ops,
                });
            }
            // Feed-forward block: X += Wdown · (act(Wgate·norm(X)) * Wup·norm(X)), or
            // Wdown · act(Wup·X) without a gate.
            // A sparse layer: X += Σ_top-k w_e · expert_e(norm(X)), routed by Wrouter·norm(X).
            let mut ops = Vec::new();
            let src = input(&mut ops, NormWeight::Ffn);
            if let Some(moe) = cfg.layer_moe(layer) {
                ops.extend([
                    Op::MatMul {
                        src,
                        dst: Buf::Router,
                        weight: MatRole::Router,
                    },
                    Op::Moe {
                        src,
                        logits: Buf::Router,
                        dst: Buf::Proj,
                        top_k: moe.num_experts_per_tok,
                        router: moe.router,
                        activation: cfg.activation,
                    },
                ]);
            } else if arch.gated_ffn {
                ops.extend([
                    Op::MatMul {
                        src,
                        dst: Buf::Gate,
                        weight: MatRole::Gate,
                    },
                    Op::MatMul {
                        src,
                        dst: Buf::Up,
                        weight: MatRole::Up,
                    },
                    Op::GatedAct(cfg.activation),
                    Op::MatMul {
                        src: Buf::Gate,
                        dst: Buf::Proj,
                        weight: MatRole::Down,
                    },
                ]);
            } else {
                ops.extend([
                    Op::MatMul {
                        src,
                        dst: Buf::Up,
                        weight: MatRole::Up,
                    },
                    Op::Act(cfg.activation),
                    Op::MatMul {
                        src: Buf::Up,
                        dst: Buf::Proj,
                        weight: MatRole::Down,
                    },
                ]);
            }
            add_block(&mut ops, NormWeight::FfnPost, NormWeight::Ffn);
            groups.push(CommandGroup {
                kind: GroupKind::Ffn { layer },
                ops,
            });
        }
        if arch.lm_head {
            let mut ops = Vec::new();
            let src = if pre {
                ops.push(norm(Buf::X, Buf::Xn, NormWeight::Output));
                Buf::Xn
            } else {
                Buf::X
            };
            ops.push(Op::MatMul {
                src,
                dst: Buf::Logits,
                weight: MatRole::Output,
            });
            if cfg.logit_multiplier != 1.0 || cfg.final_logit_softcapping.is_some() {
                ops.push(Op::ScaleLogits {
                    scale: cfg.logit_multiplier,
                    softcap: cfg.final_logit_softcapping,
                });
            }
            groups.push(CommandGroup {
                kind: GroupKind::Output,
                ops,
            });
        }
        Plan { groups }
    }

    /// The forward pass of an embedding: the layers of [`Plan::new`], then the final norm
    /// (pre-norm families) and `pooling` over each sequence of the batch.
    pub fn embedding(cfg: &ModelConfig, pooling: Pooling) -> Plan {
        let mut plan = Plan::new(cfg);
        plan.groups.retain(|g| g.kind != GroupKind::Output);
        let mut ops = Vec::new();
        let src = if cfg.arch.norm_position == NormPosition::Pre {
            ops.push(match cfg.arch.norm {
                NormKind::Rms => Op::RmsNorm {
                    src: Buf::X,
                    dst: Buf::Xn,
                    weight: NormWeight::Output,
                },
                NormKind::Layer => Op::LayerNorm {
                    src: Buf::X,
                    dst: Buf::Xn,
                    weight: NormWeight::Output,
                },
            });
            Buf::Xn
        } else {
            Buf::X
        };
        ops.push(Op::Pool { src, pooling });
        plan.groups.push(CommandGroup {
            kind: GroupKind::Output,
            ops,
        });
        plan
    }
}
