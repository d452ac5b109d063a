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
//! - `Logits` (n_out, vocab)     for the tokens whose logits were asked for

use crate::arch::Activation;
use crate::config::ModelConfig;

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
}

impl Buf {
    /// Every buffer, in `Buf as usize` order.
    pub const ALL: [Buf; 10] = [
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
    ];

    /// Values per token (per logit row for `Logits`).
    pub fn width(self, c: &ModelConfig) -> usize {
        match self {
            Buf::X | Buf::Xn | Buf::Proj => c.hidden_size,
            Buf::Q | Buf::Attn => c.q_dim(),
            Buf::K | Buf::V => c.kv_dim(),
            Buf::Gate | Buf::Up => c.intermediate_size,
            Buf::Logits => c.vocab_size,
        }
    }
}

/// Which normalisation weight an op uses (of the group's layer, or the final one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormWeight {
    Attn,
    /// The attention block's output norm (sandwich norms).
    AttnPost,
    Ffn,
    /// The feed-forward block's output norm (sandwich norms).
    FfnPost,
    Output,
}

/// Which matrix an op multiplies by (of the group's layer, or the output projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatRole {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
    Output,
}

/// One step of the forward pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `X[t] = token_embd[token[t]] · scale`.
    Embed { scale: f32 },
    /// `dst = rms_norm(src) * weight`.
    RmsNorm {
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
    /// `Attn = softmax(Q·Kᵀ·scale + causal mask)·V` over the layer's cache (GQA: each KV head
    /// serves `num_attention_heads / num_key_value_heads` query heads; no replication). With a
    /// window `w`, a query at position `p` sees positions `p - w + 1 ..= p`.
    Attention { window: Option<usize> },
    /// `Gate = act(Gate) * Up`.
    GatedAct(Activation),
    /// `X += src · scale`.
    AddResidual { src: Buf, scale: f32 },
    /// `Logits = softcap(Logits · scale)`, `softcap(x) = cap · tanh(x / cap)` when set.
    ScaleLogits { scale: f32, softcap: Option<f32> },
}

impl Op {
    /// Short name for traces and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::MatMul { weight, .. } => match weight {
                MatRole::Q => "matmul_q",
                MatRole::K => "matmul_k",
                MatRole::V => "matmul_v",
                MatRole::O => "matmul_o",
                MatRole::Gate => "matmul_gate",
                MatRole::Up => "matmul_up",
                MatRole::Down => "matmul_down",
                MatRole::Output => "matmul_output",
            },
            Op::QkNorm => "qk_norm",
            Op::Rope { .. } => "rope",
            Op::StoreKv => "store_kv",
            Op::Attention { .. } => "attention",
            Op::GatedAct(_) => "gated_act",
            Op::AddResidual { .. } => "add_residual",
            Op::ScaleLogits { .. } => "scale_logits",
        }
    }
}

/// What a group computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Token embedding lookup.
    Embed,
    /// Attention block of a layer.
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
    /// Compile the forward pass for a config. Branches only on the config's fields.
    pub fn new(cfg: &ModelConfig) -> Plan {
        let mut groups = vec![CommandGroup {
            kind: GroupKind::Embed,
            ops: vec![Op::Embed {
                scale: cfg.embedding_multiplier,
            }],
        }];
        let residual = cfg.residual_multiplier;
        // A block's output (in `Proj`) joins the residual stream, normalised first with
        // sandwich norms (into `Xn`, free by then).
        let add_block = |ops: &mut Vec<Op>, post: NormWeight| {
            if cfg.arch.sandwich_norms {
                ops.push(Op::RmsNorm {
                    src: Buf::Proj,
                    dst: Buf::Xn,
                    weight: post,
                });
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
        };
        for layer in 0..cfg.num_hidden_layers {
            // Attention block: X += Wo · attention(rope(Wq·norm(X)), rope(Wk·norm(X)), Wv·norm(X))
            let mut ops = vec![
                Op::RmsNorm {
                    src: Buf::X,
                    dst: Buf::Xn,
                    weight: NormWeight::Attn,
                },
                Op::MatMul {
                    src: Buf::Xn,
                    dst: Buf::Q,
                    weight: MatRole::Q,
                },
                Op::MatMul {
                    src: Buf::Xn,
                    dst: Buf::K,
                    weight: MatRole::K,
                },
                Op::MatMul {
                    src: Buf::Xn,
                    dst: Buf::V,
                    weight: MatRole::V,
                },
            ];
            if cfg.arch.qk_norm {
                ops.push(Op::QkNorm);
            }
            ops.extend([
                Op::Rope {
                    local: cfg.layer_uses_local_rope(layer),
                },
                Op::StoreKv,
                Op::Attention {
                    window: cfg.layer_window(layer),
                },
                Op::MatMul {
                    src: Buf::Attn,
                    dst: Buf::Proj,
                    weight: MatRole::O,
                },
            ]);
            add_block(&mut ops, NormWeight::AttnPost);
            groups.push(CommandGroup {
                kind: GroupKind::Attention { layer },
                ops,
            });
            // Feed-forward block: X += Wdown · (act(Wgate·norm(X)) * Wup·norm(X))
            let mut ops = vec![
                Op::RmsNorm {
                    src: Buf::X,
                    dst: Buf::Xn,
                    weight: NormWeight::Ffn,
                },
                Op::MatMul {
                    src: Buf::Xn,
                    dst: Buf::Gate,
                    weight: MatRole::Gate,
                },
                Op::MatMul {
                    src: Buf::Xn,
                    dst: Buf::Up,
                    weight: MatRole::Up,
                },
                Op::GatedAct(cfg.activation),
                Op::MatMul {
                    src: Buf::Gate,
                    dst: Buf::Proj,
                    weight: MatRole::Down,
                },
            ];
            add_block(&mut ops, NormWeight::FfnPost);
            groups.push(CommandGroup {
                kind: GroupKind::Ffn { layer },
                ops,
            });
        }
        let mut ops = vec![
            Op::RmsNorm {
                src: Buf::X,
                dst: Buf::Xn,
                weight: NormWeight::Output,
            },
            Op::MatMul {
                src: Buf::Xn,
                dst: Buf::Logits,
                weight: MatRole::Output,
            },
        ];
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
        Plan { groups }
    }
}
