//! Hyperparameters, read from a model file's metadata (GGUF) or `config.json` (HF). Field names
//! follow HF transformers.

mod gguf;
mod hf;

use std::path::Path;

use crate::arch::{Activation, ArchSpec, RopePairing, Router, RouterScoring};
use crate::error::ModelError;
use crate::rope::{longrope_attention_factor, RopeConfig, RopeScaling};

pub(crate) use gguf::file_name;

/// Most layers a model may have. Checked as soon as the count is read, before any per-layer
/// list is sized by it (a hostile file's `block_count` of 1.4e9 used to build 2.7 GB of
/// per-layer flags before the config was validated).
pub(crate) const MAX_LAYERS: usize = 1 << 12;

/// `n` layers, or the error naming `key` when it is more than [`MAX_LAYERS`].
pub(crate) fn check_layer_count(key: &str, n: usize) -> Result<usize, String> {
    if n > MAX_LAYERS {
        Err(format!(
            "{key} = {n} exceeds the supported maximum {MAX_LAYERS}"
        ))
    } else {
        Ok(n)
    }
}

/// How a layer attends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Every earlier position.
    Full,
    /// The last `sliding_window` positions (the query's own included).
    Sliding,
}

/// The mixture-of-experts layers of a model (HF names: `num_experts`, `num_experts_per_tok`,
/// `moe_intermediate_size`, `norm_topk_prob`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts of each sparse layer.
    pub num_experts: usize,
    /// Experts each token runs (top-k).
    pub num_experts_per_tok: usize,
    /// Width of one expert's gated feed-forward layer.
    pub moe_intermediate_size: usize,
    /// How the router scores and weights the experts.
    pub router: Router,
    /// Whether each layer's feed-forward block is a mixture of experts (`num_hidden_layers`
    /// entries; dense layers use `intermediate_size`).
    pub sparse_layers: Vec<bool>,
}

impl MoeConfig {
    /// Sparse-layer flags from HF's rule: layer `i` is sparse unless it is listed in
    /// `mlp_only_layers`, and when `(i + 1) % decoder_sparse_step == 0`.
    pub fn hf_sparse_layers(
        n_layers: usize,
        decoder_sparse_step: usize,
        mlp_only_layers: &[usize],
    ) -> Vec<bool> {
        (0..n_layers)
            .map(|i| {
                !mlp_only_layers.contains(&i)
                    && decoder_sparse_step > 0
                    && (i + 1).is_multiple_of(decoder_sparse_step)
            })
            .collect()
    }
}

/// The short gated convolution layers of a hybrid model (LFM2; HF names: `conv_L_cache`,
/// `layer_types` / `full_attn_idxs`). A convolution layer mixes positions as
/// `out_proj(C · conv(B · x))` with `(B, C, x) = in_proj(norm(X))` split in three `hidden`-wide
/// parts and `conv` a causal depthwise convolution over the last `kernel` positions, in place
/// of attention.
#[derive(Debug, Clone, PartialEq)]
pub struct ShortConvConfig {
    /// Positions the convolution spans, the current one included (`conv_L_cache`).
    pub kernel: usize,
    /// Whether each layer is a convolution layer (`num_hidden_layers` entries; the others
    /// attend).
    pub conv_layers: Vec<bool>,
    /// The input projection, the convolution and the output projection carry biases (HF
    /// `conv_bias`); the convolution's is added to each channel's sum before the C gate.
    pub bias: bool,
}

/// Everything the decoder needs to know about a model's shape and numerics.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// The family's rules.
    pub arch: &'static ArchSpec,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the gated feed-forward layer.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (`num_attention_heads % num_key_value_heads == 0`).
    pub num_key_value_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding and output matrices).
    pub vocab_size: usize,
    /// Epsilon of every norm (RMSNorm, or LayerNorm for families that use it: HF's
    /// `layer_norm_eps`).
    pub rms_norm_eps: f32,
    /// Rows of the token-type embeddings (families with them; 0 otherwise).
    pub type_vocab_size: usize,
    /// Feed-forward activation.
    pub activation: Activation,
    /// RoPE of full-attention layers (and of every layer when `rope_local` is `None`).
    pub rope: RopeConfig,
    /// RoPE of sliding-window layers, when they have their own (Gemma 3).
    pub rope_local: Option<RopeConfig>,
    /// Leading dimensions of each head that RoPE rotates (`<= head_dim`, even).
    pub rope_dim: usize,
    /// RoPE pairing of the weights as loaded.
    pub rope_pairing: RopePairing,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// Scale applied to attention scores (1/√head_dim, or 1/√query_pre_attn_scalar).
    pub attn_scale: f32,
    /// Window of sliding-window layers.
    pub sliding_window: Option<usize>,
    /// How each layer attends (`num_hidden_layers` entries).
    pub layer_types: Vec<LayerType>,
    /// Whether each layer rotates Q and K (`num_hidden_layers` entries; `false`: a "NoPE"
    /// layer, SmolLM3's every 4th).
    pub rope_layers: Vec<bool>,
    /// Token embeddings are multiplied by this (1 for most families).
    pub embedding_multiplier: f32,
    /// Residual branches are multiplied by this before they are added (1 for most families).
    pub residual_multiplier: f32,
    /// Logits are multiplied by this (1 for most families).
    pub logit_multiplier: f32,
    /// `logits = cap · tanh(logits / cap)` when set.
    pub final_logit_softcapping: Option<f32>,
    /// `score = cap · tanh(score / cap)` for every attention score (after the scale, before
    /// the softmax) when set (Gemma 2).
    pub attn_logit_softcapping: Option<f32>,
    /// Whether the output projection is the embedding matrix, when the config says; `None`:
    /// tied exactly when the file has no output matrix.
    pub tie_word_embeddings: Option<bool>,
    /// Mixture-of-experts layers (families with [`ArchSpec::router_scoring`] whose config
    /// names experts); `None`: every layer is dense.
    pub moe: Option<MoeConfig>,
    /// Short gated convolution layers (families with [`ArchSpec::short_conv`]); `None`: every
    /// layer attends.
    pub short_conv: Option<ShortConvConfig>,
    /// A checkpoint whose `quantization_config` says `quant_method` "mxfp4" (gpt-oss as OpenAI
    /// ships it): its `modules_to_not_convert` patterns (module names, `*` matching any run
    /// of characters; a module under a listed one is listed too). `None`: no such config.
    pub hf_mxfp4: Option<Vec<String>>,
}

/// Whether a GGUF file of the family `arch` with `layers` layers and no `attention.scale`
/// scales attention scores by 1/√(hidden/heads) rather than 1/√head_dim: a model of the
/// family's [`ArchDefaults::gguf_hidden_per_head_scale_layers`] layers (as llama.cpp's loader
/// reads it).
///
/// [`ArchDefaults::gguf_hidden_per_head_scale_layers`]: crate::arch::ArchDefaults::gguf_hidden_per_head_scale_layers
pub fn gguf_scales_by_hidden_per_head(arch: &ArchSpec, layers: usize) -> bool {
    arch.defaults.gguf_hidden_per_head_scale_layers == Some(layers)
}

/// The attention scale of a GGUF file without `attention.scale` (see
/// [`gguf_scales_by_hidden_per_head`]).
pub fn gguf_default_attn_scale(
    arch: &ArchSpec,
    layers: usize,
    hidden: usize,
    heads: usize,
    head_dim: usize,
) -> f32 {
    let dim = match hidden.checked_div(heads) {
        Some(d) if gguf_scales_by_hidden_per_head(arch, layers) => d,
        _ => head_dim,
    };
    1.0 / (dim as f32).sqrt()
}

impl ModelConfig {
    /// Check that the numbers describe a model that can exist and that flowrt can run.
    pub fn validate(&self, file: &Path) -> Result<(), ModelError> {
        let err = |r: String| Err(bad(file, r));
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in positive {
            if v == 0 {
                return err(format!("{name} is 0"));
            }
        }
        // Caps that no real model reaches but that stop absurd metadata from sizing buffers.
        let caps = [
            ("hidden_size", self.hidden_size, 1 << 16),
            ("intermediate_size", self.intermediate_size, 1 << 18),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, 1 << 10),
            ("head_dim", self.head_dim, 1 << 12),
            ("vocab_size", self.vocab_size, 1 << 22),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                1 << 24,
            ),
        ];
        for (name, v, cap) in caps {
            if v > cap {
                return err(format!("{name} = {v} exceeds the supported maximum {cap}"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) || self.rope_dim == 0 {
            return err(format!(
                "rope dimension count {} must be even, positive and at most head_dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return err(format!(
                "rms_norm_eps = {} must be positive",
                self.rms_norm_eps
            ));
        }
        for r in std::iter::once(&self.rope).chain(&self.rope_local) {
            if let Err(e) = r.validate(self.rope_dim) {
                return err(e);
            }
        }
        if self.layer_types.len() != self.num_hidden_layers {
            return err(format!(
                "{} layer types for {} layers",
                self.layer_types.len(),
                self.num_hidden_layers
            ));
        }
        if self.rope_layers.len() != self.num_hidden_layers {
            return err(format!(
                "`no_rope_layers` has {} entries for {} layers",
                self.rope_layers.len(),
                self.num_hidden_layers
            ));
        }
        let slides = self.layer_types.contains(&LayerType::Sliding);
        match self.sliding_window {
            Some(0) => return err("sliding_window is 0".into()),
            None if slides => return err("sliding layers but no sliding_window".into()),
            _ => {}
        }
        let finite_positive = [
            ("attention scale", self.attn_scale),
            ("embedding multiplier", self.embedding_multiplier),
            ("residual multiplier", self.residual_multiplier),
            ("logit multiplier", self.logit_multiplier),
        ];
        for (name, v) in finite_positive {
            if !(v.is_finite() && v > 0.0) {
                return err(format!("{name} = {v} must be positive"));
            }
        }
        if self.arch.token_types && self.type_vocab_size == 0 {
            return err("type_vocab_size is 0 in a family with token-type embeddings".into());
        }
        let caps = [
            ("final_logit_softcapping", self.final_logit_softcapping),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
        ];
        for (name, cap) in caps {
            if let Some(c) = cap {
                if !(c.is_finite() && c > 0.0) {
                    return err(format!("{name} = {c} must be positive"));
                }
            }
        }
        if let Activation::ClampedSwiglu { alpha, limit } = self.activation {
            if !(alpha.is_finite() && alpha > 0.0) {
                return err(format!("swiglu_alpha = {alpha} must be positive"));
            }
            if !(limit.is_finite() && limit > 0.0) {
                return err(format!("swiglu_limit = {limit} must be positive"));
            }
        }
        if let Some(m) = &self.moe {
            if m.num_experts == 0 {
                return err("num_experts is 0".into());
            }
            if m.num_experts > 1 << 12 {
                return err(format!(
                    "num_experts = {} exceeds the supported maximum {}",
                    m.num_experts,
                    1 << 12
                ));
            }
            if m.num_experts_per_tok == 0 {
                return err("num_experts_per_tok (top-k) is 0".into());
            }
            if m.num_experts_per_tok > m.num_experts {
                return err(format!(
                    "num_experts_per_tok (top-k) = {} exceeds num_experts = {}",
                    m.num_experts_per_tok, m.num_experts
                ));
            }
            if m.moe_intermediate_size == 0 || m.moe_intermediate_size > 1 << 18 {
                return err(format!(
                    "moe_intermediate_size = {} must be positive and at most {}",
                    m.moe_intermediate_size,
                    1 << 18
                ));
            }
            let r = m.router;
            if !(r.scale.is_finite() && r.scale > 0.0) {
                return err(format!(
                    "routed_scaling_factor (expert_weights_scale) = {} must be positive",
                    r.scale
                ));
            }
            if !(r.renorm_eps.is_finite() && r.renorm_eps >= 0.0) {
                return err(format!(
                    "router renormalisation epsilon {} must be finite and not negative",
                    r.renorm_eps
                ));
            }
            if m.sparse_layers.len() != self.num_hidden_layers {
                return err(format!(
                    "{} sparse-layer flags for {} layers",
                    m.sparse_layers.len(),
                    self.num_hidden_layers
                ));
            }
        }
        if let Some(sc) = &self.short_conv {
            if sc.kernel == 0 || sc.kernel > 64 {
                return err(format!(
                    "conv_L_cache (the convolution kernel size) = {} must be from 1 to 64",
                    sc.kernel
                ));
            }
            if sc.conv_layers.len() != self.num_hidden_layers {
                return err(format!(
                    "`layer_types` gives {} layer kinds for {} layers",
                    sc.conv_layers.len(),
                    self.num_hidden_layers
                ));
            }
        }
        Ok(())
    }

    /// Whether layer `l` is a short convolution layer (no attention, no KV).
    pub fn layer_is_conv(&self, l: usize) -> bool {
        self.short_conv.as_ref().is_some_and(|s| s.conv_layers[l])
    }

    /// The attention scale a GGUF file of this model means when it carries no
    /// `attention.scale` (see [`gguf_default_attn_scale`]).
    pub fn gguf_default_attn_scale(&self) -> f32 {
        gguf_default_attn_scale(
            self.arch,
            self.num_hidden_layers,
            self.hidden_size,
            self.num_attention_heads,
            self.head_dim,
        )
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// The attention window of layer `l` (`None`: all earlier positions).
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        match self.layer_types[l] {
            LayerType::Full => None,
            LayerType::Sliding => self.sliding_window,
        }
    }

    /// The mixture of experts of layer `l`, when its feed-forward block is sparse.
    pub fn layer_moe(&self, l: usize) -> Option<&MoeConfig> {
        self.moe.as_ref().filter(|m| m.sparse_layers[l])
    }

    /// Whether layer `l` uses the local RoPE (`rope_local`).
    pub fn layer_uses_local_rope(&self, l: usize) -> bool {
        self.rope_local.is_some() && self.layer_types[l] == LayerType::Sliding
    }

    /// What sets this model apart from a plain decoder, one short phrase each, as `flowrt show`
    /// lists them: attention layout, norms and biases, sliding windows, RoPE and its scaling,
    /// layers without RoPE, and the multipliers of the embeddings, residual stream, attention
    /// scores and logits. Never empty: the positions (RoPE and its base, or learned) are always
    /// named.
    pub fn features(&self) -> Vec<String> {
        let arch = self.arch;
        let mut f = Vec::new();
        let (q, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if kv == 1 && q > 1 {
            f.push(format!(
                "multi-query attention ({q} query heads, 1 KV head)"
            ));
        } else if kv < q {
            f.push(format!("grouped-query attention {q}:{kv}"));
        }
        if self.head_dim * q != self.hidden_size {
            f.push(format!("head_dim {} (≠ hidden/heads)", self.head_dim));
        }
        if !arch.causal {
            f.push("bidirectional attention (encoder)".into());
        }
        if let Some(sc) = &self.short_conv {
            let conv = sc.conv_layers.iter().filter(|&&c| c).count();
            f.push(format!(
                "hybrid: {conv} short-convolution layers (kernel {}), {} attention layers; a convolution layer caches {} values per position (an attention layer {} K+V)",
                sc.kernel,
                self.num_hidden_layers - conv,
                self.hidden_size,
                2 * self.kv_dim(),
            ));
            if sc.bias {
                f.push("convolution biases".into());
            }
        }
        if arch.qk_norm {
            f.push("QK-norm".into());
        }
        if arch.qkv_bias {
            f.push("Q/K/V biases".into());
        }
        if arch.attn_sinks {
            f.push("attention sinks".into());
        }
        if arch.fused_qkv {
            f.push("fused QKV".into());
        }
        if arch.fused_gate_up {
            f.push("fused gate/up".into());
        }
        if arch.sandwich_norms {
            f.push("sandwich norms".into());
        }
        if arch.norm_position == crate::arch::NormPosition::Post {
            f.push("norms after each block (post-norm)".into());
        }
        let sliding = self
            .layer_types
            .iter()
            .filter(|t| **t == LayerType::Sliding)
            .count();
        // Sliding exactly on the even layers (0, 2, ...): "alternate layers".
        let alternate = self.num_hidden_layers > 1
            && self
                .layer_types
                .iter()
                .enumerate()
                .all(|(i, t)| (*t == LayerType::Sliding) == (i % 2 == 0));
        match (self.sliding_window, sliding > 0) {
            (Some(w), true) if alternate => f.push(format!(
                "sliding window {w} on alternate layers (0, 2, ...)"
            )),
            (Some(w), true) => f.push(format!(
                "sliding window {w} on {sliding} of {} layers",
                self.num_hidden_layers
            )),
            _ => {}
        }
        if arch.positions == crate::arch::Positions::Rope {
            let mut rope = format!("RoPE base {}", self.rope.theta);
            if let Some(local) = &self.rope_local {
                rope += &format!(" (sliding layers {})", local.theta);
            }
            if self.rope_dim < self.head_dim {
                rope += &format!(", partial RoPE {} of {} dims", self.rope_dim, self.head_dim);
            }
            match &self.rope.scaling {
                RopeScaling::None => {}
                RopeScaling::Linear { factor } => rope += &format!(", linear scaling ×{factor}"),
                RopeScaling::Llama3 {
                    factor,
                    original_max_position_embeddings: o,
                    ..
                } => rope += &format!(", llama3 scaling ×{factor} from {o}"),
                RopeScaling::LongRope {
                    original_max_position_embeddings: o,
                    ..
                } => rope += &format!(", LongRoPE from {o}"),
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: o,
                    ..
                } => rope += &format!(", YaRN ×{factor} from {o}"),
                RopeScaling::FreqFactors(_) => rope += ", per-dimension frequency factors",
            }
            f.push(rope);
            let nope: Vec<String> = (0..self.num_hidden_layers)
                .filter(|&l| !self.layer_uses_rope(l))
                .map(|l| l.to_string())
                .collect();
            if !nope.is_empty() {
                f.push(format!("no RoPE on layers {}", nope.join(", ")));
            }
        } else {
            f.push("learned absolute positions".into());
        }
        if self.embedding_multiplier != 1.0 {
            f.push(format!("embeddings ×{}", self.embedding_multiplier));
        }
        if self.residual_multiplier != 1.0 {
            f.push(format!("residual branches ×{}", self.residual_multiplier));
        }
        let plain_scale = 1.0 / (self.head_dim as f32).sqrt();
        if (self.attn_scale - plain_scale).abs() > 1e-6 * plain_scale {
            f.push(format!(
                "attention scale {} (not 1/√head_dim)",
                self.attn_scale
            ));
        }
        if self.logit_multiplier != 1.0 {
            f.push(format!("logits ×{}", self.logit_multiplier));
        }
        if let Some(cap) = self.attn_logit_softcapping {
            f.push(format!("attention score soft-cap {cap}"));
        }
        if let Some(cap) = self.final_logit_softcapping {
            f.push(format!("logit soft-cap {cap}"));
        }
        if let Some(m) = &self.moe {
            let scoring = match m.router.scoring {
                RouterScoring::Softmax => "softmax",
                RouterScoring::TopKSoftmax => "softmax over the top-k logits",
                RouterScoring::Sigmoid => "sigmoid",
            };
            let mut renorm = String::new();
            if m.router.selection_bias {
                renorm += ", chosen with a per-expert selection bias";
            }
            if m.router.renormalize && m.router.scoring != RouterScoring::TopKSoftmax {
                renorm += ", renormalised";
            }
            if m.router.scale != 1.0 {
                renorm += &format!(", weights ×{}", m.router.scale);
            }
            let sparse = m.sparse_layers.iter().filter(|s| **s).count();
            let biased = if arch.moe_bias {
                ", router and experts with biases"
            } else {
                ""
            };
            let mut s = format!(
                "mixture of experts: {} experts, {} active ({scoring}{renorm}), expert FFN {}{biased}",
                m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size
            );
            if sparse < self.num_hidden_layers {
                s += &format!(", on {sparse} of {} layers", self.num_hidden_layers);
            }
            // Gate, up and down of each expert; a token runs top-k of them per sparse layer.
            let per_expert = 3 * (self.hidden_size * m.moe_intermediate_size) as u64;
            let all = per_expert * (m.num_experts * sparse) as u64;
            let active = per_expert * (m.num_experts_per_tok * sparse) as u64;
            s += &format!(
                "; {} of {} expert parameters active per token",
                short_count(active),
                short_count(all)
            );
            f.push(s);
        }
        if let Activation::ClampedSwiglu { alpha, limit } = self.activation {
            f.push(format!(
                "clamped SwiGLU (alpha {alpha}, limit {limit}, up + 1)"
            ));
        }
        f
    }

    /// Whether layer `l` rotates Q and K.
    pub fn layer_uses_rope(&self, l: usize) -> bool {
        self.rope_layers[l]
    }

    /// RoPE flags of a model whose every `interval`-th layer skips RoPE (transformers'
    /// `no_rope_layer_interval`: layer `i` is rotated unless `(i + 1) % interval == 0`).
    pub fn interval_rope_layers(n_layers: usize, interval: usize) -> Vec<bool> {
        (0..n_layers)
            .map(|i| interval == 0 || !(i + 1).is_multiple_of(interval))
            .collect()
    }

    /// RoPE flags from HF's `no_rope_layers` values (1: rotated, 0: not), one per layer.
    pub(crate) fn rope_layers_from_list(
        file: &Path,
        values: &[i128],
        n_layers: usize,
        key: &str,
    ) -> Result<Vec<bool>, ModelError> {
        if values.len() != n_layers {
            return Err(bad(
                file,
                format!("`{key}` has {} entries for {n_layers} layers", values.len()),
            ));
        }
        values
            .iter()
            .map(|&v| match v {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(bad(
                    file,
                    format!("`{key}` holds {v}; entries are 1 (RoPE) or 0 (no RoPE)"),
                )),
            })
            .collect()
    }

    /// Layer types of a model whose every `pattern`-th layer is global.
    pub fn pattern_layer_types(n_layers: usize, pattern: usize) -> Vec<LayerType> {
        (0..n_layers)
            .map(|i| {
                if pattern > 0 && (i + 1).is_multiple_of(pattern) {
                    LayerType::Full
                } else {
                    LayerType::Sliding
                }
            })
            .collect()
    }
}

/// LongRoPE as `arch` runs it, from the configured `short` and `long` divisors (the same for
/// `config.json` and GGUF files): a family that picks one set from the configured length
/// ([`ArchSpec::longrope_by_max_position`]) gets that set for every position, the long one
/// when `max_pos` exceeds `orig`. `attention_factor` defaults to LongRoPE's
/// `√(1 + ln(max_pos / orig) / ln(orig))`.
pub(crate) fn longrope_scaling(
    arch: &ArchSpec,
    short: Vec<f32>,
    long: Vec<f32>,
    orig: usize,
    max_pos: usize,
    attention_factor: Option<f32>,
) -> RopeScaling {
    let (short_factor, long_factor) = match arch.longrope_by_max_position {
        true if max_pos > orig => (long.clone(), long),
        true => (short.clone(), short),
        false => (short, long),
    };
    RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: orig,
        attention_factor: attention_factor
            .unwrap_or_else(|| longrope_attention_factor(max_pos, orig)),
    }
}

/// `n` with a K/M/B suffix (3 significant digits), for feature phrases.
fn short_count(n: u64) -> String {
    let (v, unit) = match n {
        0..1_000 => return n.to_string(),
        1_000..1_000_000 => (n as f64 / 1e3, "K"),
        1_000_000..1_000_000_000 => (n as f64 / 1e6, "M"),
        _ => (n as f64 / 1e9, "B"),
    };
    let digits = if v < 10.0 {
        2
    } else if v < 100.0 {
        1
    } else {
        0
    };
    format!("{v:.digits$}{unit}")
}

fn bad(file: &Path, reason: String) -> ModelError {
    ModelError::BadConfig {
        file: file.to_path_buf(),
        reason,
    }
}
