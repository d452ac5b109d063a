//! Architecture families as data.
//!
//! Every difference between families is a field here or a value in [`crate::ModelConfig`] that
//! a field says how to read. Adding a family means adding a row to [`ARCHS`], its tensor-name
//! mapping (if it differs) and a golden test against the reference. The decoder branches on
//! fields, never on a family's name.

/// Gated feed-forward activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, Mistral, MiniCPM).
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
    /// Exact GELU, `0.5 x (1 + erf(x / √2))` (BERT's `gelu`).
    Gelu,
    /// gpt-oss's clamped SwiGLU: with `g = min(gate, limit)` and `u = clamp(up, -limit,
    /// limit)`, `g · sigmoid(alpha · g) · (u + 1)` (HF `swiglu_alpha`, `swiglu_limit`).
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl Activation {
    /// The activation an HF `hidden_act` / `hidden_activation` value names.
    pub fn from_hf(name: &str) -> Option<Activation> {
        match name {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Some(Activation::GeluTanh),
            "gelu" => Some(Activation::Gelu),
            _ => None,
        }
    }
}

/// Which pairs of a head's dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// Pairs `(2i, 2i+1)`. GGUF llama-family files store Q/K rows permuted for this layout.
    Adjacent,
    /// Pairs `(i, i + d/2)`: "rotate half" as in HF transformers (and NeoX-style GGUF families).
    HalfSplit,
}

/// How token embeddings are scaled before the first layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedScale {
    /// Not scaled.
    None,
    /// × √hidden_size (Gemma).
    SqrtHidden,
    /// × the value of this HF config key (MiniCPM `scale_emb`, Granite
    /// `embedding_multiplier`); GGUF files carry it as `{arch}.embedding_scale`.
    FromConfig(&'static str),
}

/// Which extra scalings of the residual stream and logits the family defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalings {
    /// None.
    None,
    /// MiniCPM's muP scalings: residual branches × `scale_depth / √num_hidden_layers`, final
    /// hidden states ÷ (`hidden_size / dim_model_base`) before the output projection.
    MiniCpm,
    /// Multipliers the config states as they are (Granite), under these HF keys: residual
    /// branches × `residual`, logits ÷ `logit_divisor`, attention scores × `attention` in place
    /// of 1/√head_dim. GGUF files carry them as `{arch}.residual_scale`, `{arch}.logit_scale`
    /// and `{arch}.attention.scale` (all required).
    Direct {
        residual: &'static str,
        logit_divisor: &'static str,
        attention: &'static str,
    },
}

/// How a block's input (or output) is normalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / √(mean(x²) + eps) · w` (decoders).
    Rms,
    /// LayerNorm with a bias: `(x - mean(x)) / √(var(x) + eps) · w + b` (BERT).
    Layer,
}

/// Where each block's norm sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormPosition {
    /// On the block's input, the residual stream left as it is: `x + block(norm(x))`
    /// (decoders). The final norm precedes the output projection.
    Pre,
    /// On the residual stream after the block's output is added: `norm(x + block(x))` (BERT).
    /// There is no final norm.
    Post,
}

/// How a token's position enters the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positions {
    /// Q and K rotated by their positions in every layer.
    Rope,
    /// A learned embedding per absolute position, added to the token embeddings once (BERT).
    Learned,
}

/// Which naming scheme a family's tensors follow in each format (see
/// [`crate::names::TensorRole`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorNames {
    /// `model.layers.{i}.self_attn.q_proj` (HF), `blk.{i}.attn_q` (GGUF).
    Decoder,
    /// `encoder.layer.{i}.attention.self.query` (HF `BertModel`, optionally under `bert.`);
    /// `blk.{i}.attn_q` with llama.cpp's BERT names for the rest (GGUF).
    Bert,
    /// LFM2's HF names: `model.layers.{i}.operator_norm`, `self_attn.out_proj`,
    /// `self_attn.q_layernorm`, `feed_forward.w1/w3/w2`, `conv.in_proj/conv/out_proj`, and the
    /// final norm `model.embedding_norm`; GGUF as llama.cpp's `lfm2` (`blk.{i}.shortconv.*`,
    /// the final norm `token_embd_norm`).
    Lfm2,
}

/// How a mixture-of-experts router turns its logits (one per expert) into the scores from
/// which each token's top-k experts are chosen and weighted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterScoring {
    /// `softmax` over all experts (Qwen3-MoE, Mixtral).
    Softmax,
    /// The top-k experts by raw logit, weighted by a softmax over their k logits only
    /// (gpt-oss). The same weights as [`RouterScoring::Softmax`] renormalised over the chosen
    /// k, up to rounding; `renormalize` changes nothing (they already sum to 1).
    TopKSoftmax,
    /// `sigmoid` of each logit on its own (LFM2-MoE): scores in (0, 1) that need not sum to
    /// 1; the top-k chosen by score (plus the layer's selection bias when
    /// [`Router::selection_bias`]), weighted by their unbiased scores.
    Sigmoid,
}

/// How an HF checkpoint stores a mixture of experts' matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfExperts {
    /// One tensor per expert and matrix, `mlp.experts.{j}.{gate,up,down}_proj.weight`, and
    /// the router as `mlp.gate.weight` (Qwen3-MoE).
    PerExpert,
    /// One 3-D tensor per role, input features first: `mlp.experts.gate_up_proj` `(experts,
    /// hidden, 2 × width)` with gate and up interleaved along the last dimension (gate at even
    /// indices), `mlp.experts.down_proj` `(experts, width, hidden)`, their biases
    /// `gate_up_proj_bias` `(experts, 2 × width)` and `down_proj_bias` `(experts, hidden)`;
    /// the router as `mlp.router.weight` / `.bias` (gpt-oss). Transposed and split at load
    /// into owned per-expert matrices.
    FusedTransposed,
}

/// A mixture-of-experts router: how experts are scored, which k are chosen, and how their
/// weights are finished: divided by their sum (HF `norm_topk_prob`) plus `renorm_eps`, then
/// multiplied by `scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Router {
    pub scoring: RouterScoring,
    pub renormalize: bool,
    /// Added to the chosen weights' sum before they are divided by it (when `renormalize`):
    /// LFM2-MoE's 1e-6 ([`ArchSpec::router_renorm_eps`]); 0 divides by the plain sum.
    pub renorm_eps: f32,
    /// The chosen weights are multiplied by this last (HF `routed_scaling_factor`, GGUF
    /// `expert_weights_scale`); 1: not scaled.
    pub scale: f32,
    /// Experts are chosen by score plus the layer's selection bias, one value per expert
    /// (HF `expert_bias` with `use_expert_bias`, GGUF `exp_probs_b`), but weighted by the
    /// unbiased score.
    pub selection_bias: bool,
}

impl Router {
    /// A router that weights the chosen experts by their scores alone (renormalised when
    /// `renormalize`): no epsilon, no scale, no selection bias.
    pub const fn plain(scoring: RouterScoring, renormalize: bool) -> Router {
        Router {
            scoring,
            renormalize,
            renorm_eps: 0.0,
            scale: 1.0,
            selection_bias: false,
        }
    }
}

/// Defaults a family documents for config values its files may omit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchDefaults {
    /// RoPE base of global (full-attention) layers when the file does not give one.
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers when the family gives them their own and the file
    /// does not say (Gemma 3: 10 000).
    pub local_rope_theta: Option<f32>,
    /// Every `n`-th layer is global, the others slide, when the file does not list layer types
    /// (Gemma 3: 6, i.e. layers 5, 11, ... are global).
    pub sliding_window_pattern: Option<usize>,
    /// The family has layers without RoPE ("NoPE"), listed per layer by HF's
    /// `no_rope_layers` (1: RoPE, 0: none); when a file lists none, every `n`-th layer skips
    /// RoPE (layers n-1, 2n-1, ...), `n` from `no_rope_layer_interval` or this default
    /// (SmolLM3: 4, as transformers and llama.cpp). `None`: every layer is rotated.
    pub no_rope_layer_interval: Option<usize>,
    /// HF `norm_topk_prob` when a config of a family with a router omits it (Qwen3-MoE:
    /// false; LFM2-MoE: true).
    pub norm_topk_prob: bool,
    /// HF `use_expert_bias` (a per-layer selection bias of the router) when a config omits
    /// it (LFM2-MoE: true; false for families without one).
    pub use_expert_bias: bool,
    /// The family's HF configs count leading dense layers in `num_dense_layers` (this many
    /// when omitted; LFM2-MoE: 2), the rest sparse; `None`: Qwen's `decoder_sparse_step` and
    /// `mlp_only_layers` say which layers are dense.
    pub num_dense_layers: Option<usize>,
    /// GGUF files of the family do not carry `query_pre_attn_scalar`; a file without
    /// `attention.scale` whose model has this many layers scales attention scores by
    /// 1/√(hidden/heads) instead of 1/√head_dim, as llama.cpp's loader decides it: the
    /// family's one published size whose scalar is hidden/heads (Gemma 2 27B: 46 layers;
    /// Gemma 3 27B: 62). `None`: always 1/√head_dim.
    pub gguf_hidden_per_head_scale_layers: Option<usize>,
}

/// The rules of one architecture family.
#[derive(Debug, PartialEq)]
pub struct ArchSpec {
    /// Our name for the family.
    pub name: &'static str,
    /// `general.architecture` values in GGUF files (empty: no GGUF support for the family).
    pub gguf_archs: &'static [&'static str],
    /// `model_type` values in HF `config.json`.
    pub hf_model_types: &'static [&'static str],
    /// Feed-forward activation unless the config names another.
    pub activation: Activation,
    /// RoPE pairing of the weights as stored in GGUF files of this family (HF checkpoints are
    /// always [`RopePairing::HalfSplit`]).
    pub gguf_rope_pairing: RopePairing,
    /// Q, K and V projections carry biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on Q and K before RoPE.
    pub qk_norm: bool,
    /// RMSNorms after the attention and feed-forward blocks too, before the residual add
    /// (Gemma 2/3 "sandwich" norms).
    pub sandwich_norms: bool,
    /// HF checkpoints store RMSNorm weights `w` of `x · (offset + w)` (Gemma: 1; GGUF files of
    /// such families store `1 + w` already).
    pub hf_norm_offset: f32,
    /// Embedding scale.
    pub embed_scale: EmbedScale,
    /// Residual and logit scalings.
    pub scalings: Scalings,
    /// Sliding-window layers, when configured, use the window (Mistral, Gemma 3, Qwen).
    pub sliding_window: bool,
    /// LongRoPE picks its factor set once, from the configured `max_position_embeddings`
    /// (long factors when it exceeds `original_max_position_embeddings`, as MiniCPM's own code
    /// does by building its cos/sin cache for the full length), instead of per position.
    pub longrope_by_max_position: bool,
    /// Config defaults.
    pub defaults: ArchDefaults,
    /// Each position attends only to itself and earlier ones (decoders); `false`: to every
    /// position of its own sequence (encoders). A batch of several sequences is masked per
    /// sequence either way.
    pub causal: bool,
    /// How blocks normalise.
    pub norm: NormKind,
    /// Where each block's norm sits.
    pub norm_position: NormPosition,
    /// How positions enter the model.
    pub positions: Positions,
    /// Token-type ("segment") embeddings, of which flowrt adds type 0 to every token (one
    /// text per sequence, as sentence-transformers encodes it).
    pub token_types: bool,
    /// A norm over the embeddings before the first layer.
    pub embed_norm: bool,
    /// Gated feed-forward `down(act(gate(x)) · up(x))`; `false`: `down(act(up(x)))`.
    pub gated_ffn: bool,
    /// Biases on the attention output projection and on the feed-forward matrices (Q/K/V
    /// biases are `qkv_bias`).
    pub dense_bias: bool,
    /// An output projection to logits: the family generates text. `false`: the model only
    /// embeds (its hidden states are pooled).
    pub lm_head: bool,
    /// Tensor naming scheme.
    pub tensor_names: TensorNames,
    /// Layers may mix positions with a short gated convolution instead of attention (LFM2),
    /// as the config lists per layer (see [`crate::ShortConvConfig`]).
    pub short_conv: bool,
    /// Q, K and V are stored as one matrix of `(num_attention_heads + 2 ×
    /// num_key_value_heads) × head_dim` rows, Q's rows first, then K's, then V's (HF
    /// `self_attn.qkv_proj`, GGUF `attn_qkv`); flowrt splits it into row ranges at load, so
    /// the decoder sees three matrices. GGUF files may carry separate `attn_q/k/v` instead.
    pub fused_qkv: bool,
    /// The gated feed-forward's gate and up matrices are stored as one of `2 ×
    /// intermediate_size` rows, the gate's first (HF `mlp.gate_up_proj`; GGUF `ffn_up`, with
    /// no `ffn_gate`); split into row ranges at load.
    pub fused_gate_up: bool,
    /// HF tensors the family's checkpoints carry that flowrt does not use, by name after the
    /// prefix (BERT: the position-id buffer, and the pooler that sentence-transformers does
    /// not use).
    pub hf_unused: &'static [&'static str],
    /// Sparse (mixture-of-experts) feed-forward layers, scored so, where the config says
    /// which layers are sparse (see [`crate::MoeConfig`]); `None`: every layer is dense.
    pub router_scoring: Option<RouterScoring>,
    /// How HF checkpoints store the experts (families with a router).
    pub hf_experts: HfExperts,
    /// The router and every expert matrix carry biases (gpt-oss).
    pub moe_bias: bool,
    /// The HF key of one expert's feed-forward width (`moe_intermediate_size`; gpt-oss:
    /// `intermediate_size`).
    pub hf_expert_width_key: &'static str,
    /// A learned logit per query head (`self_attn.sinks`, GGUF `attn_sinks`) joins each
    /// query's softmax denominator and is dropped from the output (gpt-oss).
    pub attn_sinks: bool,
    /// GGUF files name the feed-forward's input norm `blk.N.post_attention_norm` instead of
    /// `ffn_norm` (llama.cpp's gpt-oss; its loader refuses a file without that name).
    pub gguf_ffn_norm_post_attention: bool,
    /// The router's renormalisation epsilon ([`Router::renorm_eps`]): LFM2-MoE divides by
    /// the chosen weights' sum + 1e-6; 0 for the others.
    pub router_renorm_eps: f32,
    /// HF configs give the dense feed-forward width as LFM2's `intermediate_size` (or
    /// `block_ff_dim`) adjusted by `block_auto_adjust_ff_dim`, `block_ffn_dim_multiplier`
    /// and `block_multiple_of`; `false`: `intermediate_size` as it is.
    pub hf_block_ff_dim: bool,
}

const PLAIN_DEFAULTS: ArchDefaults = ArchDefaults {
    rope_theta: 10_000.0,
    local_rope_theta: None,
    sliding_window_pattern: None,
    no_rope_layer_interval: None,
    norm_topk_prob: false,
    use_expert_bias: false,
    num_dense_layers: None,
    gguf_hidden_per_head_scale_layers: None,
};

/// Llama family: Llama 2/3, SmolLM2, MiniCPM5 (a plain `LlamaForCausalLM`), ...
pub const LLAMA: ArchSpec = ArchSpec {
    name: "llama",
    gguf_archs: &["llama"],
    hf_model_types: &["llama"],
    activation: Activation::Silu,
    gguf_rope_pairing: RopePairing::Adjacent,
    qkv_bias: false,
    qk_norm: false,
    sandwich_norms: false,
    hf_norm_offset: 0.0,
    embed_scale: EmbedScale::None,
    scalings: Scalings::None,
    sliding_window: false,
    longrope_by_max_position: false,
    defaults: PLAIN_DEFAULTS,
    causal: true,
    norm: NormKind::Rms,
    norm_position: NormPosition::Pre,
    positions: Positions::Rope,
    token_types: false,
    embed_norm: false,
    gated_ffn: true,
    dense_bias: false,
    lm_head: true,
    tensor_names: TensorNames::Decoder,
    short_conv: false,
    fused_qkv: false,
    fused_gate_up: false,
    hf_unused: &[],
    router_scoring: None,
    hf_experts: HfExperts::PerExpert,
    moe_bias: false,
    hf_expert_width_key: "moe_intermediate_size",
    attn_sinks: false,
    gguf_ffn_norm_post_attention: false,
    router_renorm_eps: 0.0,
    hf_block_ff_dim: false,
};

/// Mistral: Llama with a sliding attention window on every layer. GGUF files of Mistral
/// checkpoints say `llama` (llama.cpp's converter writes them so, and drops the window);
/// flowrt's GGUF reader honours `llama.attention.sliding_window` when a file carries it, as
/// `flowrt pack` writes it.
pub const MISTRAL: ArchSpec = ArchSpec {
    name: "mistral",
    gguf_archs: &[],
    hf_model_types: &["mistral"],
    sliding_window: true,
    ..LLAMA
};

/// Qwen2 / Qwen2.5: biases on Q, K and V.
pub const QWEN2: ArchSpec = ArchSpec {
    name: "qwen2",
    gguf_archs: &["qwen2"],
    hf_model_types: &["qwen2"],
    gguf_rope_pairing: RopePairing::HalfSplit,
    qkv_bias: true,
    sliding_window: true,
    ..LLAMA
};

/// Qwen3: per-head RMSNorm on Q and K; `head_dim` independent of hidden / heads.
pub const QWEN3: ArchSpec = ArchSpec {
    name: "qwen3",
    gguf_archs: &["qwen3"],
    hf_model_types: &["qwen3"],
    gguf_rope_pairing: RopePairing::HalfSplit,
    qk_norm: true,
    sliding_window: true,
    ..LLAMA
};

/// Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3 whose feed-forward layers are mixtures of
/// experts (softmax router, top-k, renormalised when `norm_topk_prob`), except the layers of
/// `mlp_only_layers` and those off `decoder_sparse_step`, which stay dense. GGUF (llama.cpp's
/// `qwen3moe`): `qwen3moe.expert_count`, `expert_used_count`, `expert_feed_forward_length`;
/// llama.cpp always renormalises qwen3moe's top-k weights.
pub const QWEN3_MOE: ArchSpec = ArchSpec {
    name: "qwen3moe",
    gguf_archs: &["qwen3moe"],
    hf_model_types: &["qwen3_moe"],
    router_scoring: Some(RouterScoring::Softmax),
    ..QWEN3
};

/// Gemma 3 (text): GELU-tanh, sandwich norms with `1 + w`, QK-norm, embeddings × √hidden,
/// interleaved sliding-window and global layers with their own RoPE bases.
pub const GEMMA3: ArchSpec = ArchSpec {
    name: "gemma3",
    gguf_archs: &["gemma3"],
    hf_model_types: &["gemma3_text", "gemma3"],
    activation: Activation::GeluTanh,
    gguf_rope_pairing: RopePairing::HalfSplit,
    qkv_bias: false,
    qk_norm: true,
    sandwich_norms: true,
    hf_norm_offset: 1.0,
    embed_scale: EmbedScale::SqrtHidden,
    scalings: Scalings::None,
    sliding_window: true,
    longrope_by_max_position: false,
    // Documented in HF's Gemma3TextConfig: global base 1e6, local base 1e4, pattern 6.
    defaults: ArchDefaults {
        rope_theta: 1_000_000.0,
        local_rope_theta: Some(10_000.0),
        sliding_window_pattern: Some(6),
        gguf_hidden_per_head_scale_layers: Some(62),
        ..PLAIN_DEFAULTS
    },
    ..LLAMA
};

/// Gemma 2 (`Gemma2ForCausalLM`): Gemma 3 without QK-norm, every other layer sliding (layer 0
/// slides), one RoPE base, and attention scores soft-capped (`attn_logit_softcapping`) as
/// well as the logits. GGUF (llama.cpp's `gemma2`): `gemma2.attn_logit_softcapping`,
/// `final_logit_softcapping`, `attention.sliding_window`.
pub const GEMMA2: ArchSpec = ArchSpec {
    name: "gemma2",
    gguf_archs: &["gemma2"],
    hf_model_types: &["gemma2"],
    qk_norm: false,
    // Documented in HF's Gemma2Config: base 10 000, layers alternate sliding and full.
    defaults: ArchDefaults {
        rope_theta: 10_000.0,
        local_rope_theta: None,
        sliding_window_pattern: Some(2),
        gguf_hidden_per_head_scale_layers: Some(46),
        ..PLAIN_DEFAULTS
    },
    ..GEMMA3
};

/// MiniCPM (1/2/4, `MiniCPMForCausalLM`): Llama with muP scalings and LongRoPE. GGUF files
/// (llama.cpp's `minicpm`) carry the scalings as `minicpm.embedding_scale`, `residual_scale`
/// and `logit_scale`, and LongRoPE's factors as `rope_factors_long` / `rope_factors_short`.
pub const MINICPM: ArchSpec = ArchSpec {
    name: "minicpm",
    gguf_archs: &["minicpm"],
    hf_model_types: &["minicpm"],
    embed_scale: EmbedScale::FromConfig("scale_emb"),
    scalings: Scalings::MiniCpm,
    longrope_by_max_position: true,
    ..LLAMA
};

/// Granite 3.x (`GraniteForCausalLM`): Llama with four multipliers from the config —
/// embeddings × `embedding_multiplier`, attention scores × `attention_multiplier` (instead of
/// 1/√head_dim), each residual branch × `residual_multiplier`, logits ÷ `logits_scaling`.
/// GGUF (llama.cpp's `granite`): `granite.embedding_scale`, `granite.attention.scale`,
/// `granite.residual_scale`, `granite.logit_scale`; Q/K rows permuted as Llama's.
pub const GRANITE: ArchSpec = ArchSpec {
    name: "granite",
    gguf_archs: &["granite"],
    hf_model_types: &["granite"],
    embed_scale: EmbedScale::FromConfig("embedding_multiplier"),
    scalings: Scalings::Direct {
        residual: "residual_multiplier",
        logit_divisor: "logits_scaling",
        attention: "attention_multiplier",
    },
    ..LLAMA
};

/// SmolLM3 (`SmolLM3ForCausalLM`): Llama whose "NoPE" layers skip RoPE (every 4th by
/// default; `no_rope_layers` lists them per layer). GGUF (llama.cpp's `smollm3`): Q/K rows
/// permuted as Llama's; llama.cpp fixes every 4th layer as NoPE and reads no key for it, so
/// flowrt reads `smollm3.no_rope_layers` (HF's list) when a file carries it, as `flowrt pack`
/// writes it, and llama.cpp's rule otherwise.
pub const SMOLLM3: ArchSpec = ArchSpec {
    name: "smollm3",
    gguf_archs: &["smollm3"],
    hf_model_types: &["smollm3"],
    sliding_window: true,
    defaults: ArchDefaults {
        no_rope_layer_interval: Some(4),
        ..PLAIN_DEFAULTS
    },
    ..LLAMA
};

/// Phi-3 / Phi-4-mini (`Phi3ForCausalLM`): Llama with Q/K/V and gate/up each stored fused,
/// partial rotary (`partial_rotary_factor`: Phi-4-mini rotates 96 of 128 dims), LongRoPE
/// picked per position (short factors below `original_max_position_embeddings`, long from
/// there on, as a token-by-token run of transformers does), and a sliding window on every
/// layer when the config gives one. GGUF (llama.cpp's `phi3`): `attn_qkv` (or separate
/// `attn_q/k/v`), `ffn_up` holding gate then up, NeoX-style RoPE (no Q/K permutation),
/// LongRoPE's factors as `rope_factors_short/long`.
pub const PHI3: ArchSpec = ArchSpec {
    name: "phi3",
    gguf_archs: &["phi3"],
    hf_model_types: &["phi3"],
    gguf_rope_pairing: RopePairing::HalfSplit,
    sliding_window: true,
    fused_qkv: true,
    fused_gate_up: true,
    ..LLAMA
};

/// LFM2 (`Lfm2ForCausalLM`): a hybrid whose layers mix positions either with GQA attention
/// (per-head RMSNorm on Q and K, RoPE) or with a short gated convolution (`in_proj` to B, C, x;
/// `C · conv(B · x)` over the last `conv_L_cache` positions; `out_proj`), as `layer_types`
/// (or `full_attn_idxs`) lists; SwiGLU feed-forward on every layer; the final norm is called
/// `embedding_norm`. GGUF (llama.cpp's `lfm2`): `lfm2.shortconv.l_cache`, a per-layer
/// `attention.head_count_kv` list with 0 on convolution layers.
pub const LFM2: ArchSpec = ArchSpec {
    name: "lfm2",
    gguf_archs: &["lfm2"],
    hf_model_types: &["lfm2"],
    gguf_rope_pairing: RopePairing::HalfSplit,
    qk_norm: true,
    tensor_names: TensorNames::Lfm2,
    short_conv: true,
    defaults: ArchDefaults {
        rope_theta: 1_000_000.0,
        ..PLAIN_DEFAULTS
    },
    hf_block_ff_dim: true,
    ..LLAMA
};

/// LFM2-MoE (`Lfm2MoeForCausalLM`): LFM2's hybrid of short convolution and attention layers
/// whose feed-forward blocks are dense SwiGLU (`intermediate_size` as it is, no LFM2 width
/// adjustment) on the first `num_dense_layers` layers and mixtures of experts on the rest: a
/// sigmoid router whose top-k are chosen by score + a per-layer `expert_bias` buffer
/// (`use_expert_bias`) but weighted by the unbiased score, divided by their sum + 1e-6
/// (`norm_topk_prob`), times `routed_scaling_factor`. HF checkpoints store one tensor per
/// expert (`feed_forward.experts.{j}.w1/w3/w2`, the router `feed_forward.gate`). GGUF
/// (llama.cpp's `lfm2moe`): `lfm2moe.leading_dense_block_count`, `expert_count`,
/// `expert_used_count`, `expert_feed_forward_length`, `expert_gating_func` (2: sigmoid),
/// `expert_weights_norm`, `expert_weights_scale`; tensors `ffn_gate_inp`,
/// `ffn_{gate,up,down}_exps`, `exp_probs_b.bias`, and LFM2's for the rest.
pub const LFM2_MOE: ArchSpec = ArchSpec {
    name: "lfm2moe",
    gguf_archs: &["lfm2moe"],
    hf_model_types: &["lfm2_moe"],
    defaults: ArchDefaults {
        rope_theta: 1_000_000.0,
        norm_topk_prob: true,
        use_expert_bias: true,
        num_dense_layers: Some(2),
        ..PLAIN_DEFAULTS
    },
    router_scoring: Some(RouterScoring::Sigmoid),
    router_renorm_eps: 1e-6,
    hf_block_ff_dim: false,
    ..LFM2
};

/// BERT (`BertModel`, what sentence-transformers models such as all-MiniLM-L6-v2 are): a
/// bidirectional encoder with learned absolute positions, token-type embeddings, post-norm
/// LayerNorms with biases, a plain GELU (erf) feed-forward and biases on every matrix. It has
/// no output projection: it embeds (see [`crate::pooling`]). GGUF: llama.cpp's `bert`.
pub const BERT: ArchSpec = ArchSpec {
    name: "bert",
    gguf_archs: &["bert"],
    hf_model_types: &["bert"],
    activation: Activation::Gelu,
    gguf_rope_pairing: RopePairing::HalfSplit,
    qkv_bias: true,
    causal: false,
    norm: NormKind::Layer,
    norm_position: NormPosition::Post,
    positions: Positions::Learned,
    token_types: true,
    embed_norm: true,
    gated_ffn: false,
    dense_bias: true,
    lm_head: false,
    tensor_names: TensorNames::Bert,
    hf_unused: &[
        "embeddings.position_ids",
        "pooler.dense.weight",
        "pooler.dense.bias",
    ],
    ..LLAMA
};

/// gpt-oss (`GptOssForCausalLM`): every feed-forward layer a mixture of experts whose router
/// takes the top-k raw logits (with a bias) and softmaxes over them; experts with biases and
/// the clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`; HF's `hidden_act` is not used);
/// attention with biases on Q/K/V/O and a learned sink logit per head; sliding-window
/// (`sliding_window`, 128) and full layers alternating as `layer_types` says (layer 0
/// slides); YaRN RoPE. HF stores the experts fused and transposed ([`HfExperts`]). GGUF
/// (llama.cpp's `gpt-oss`): `gpt-oss.expert_count`, `expert_used_count`,
/// `expert_feed_forward_length`, `attention.sliding_window` with every other layer sliding
/// from layer 0 (llama.cpp's pattern 2), `attn_sinks`, `post_attention_norm` (the FFN's
/// input norm), `ffn_gate_inp` + `.bias`,
/// `ffn_{gate,up,down}_exps` + `.bias` (gate and up apart); llama.cpp fixes alpha 1.702 and
/// limit 7.0.
pub const GPT_OSS: ArchSpec = ArchSpec {
    name: "gpt-oss",
    gguf_archs: &["gpt-oss"],
    hf_model_types: &["gpt_oss"],
    activation: Activation::ClampedSwiglu {
        alpha: 1.702,
        limit: 7.0,
    },
    gguf_rope_pairing: RopePairing::HalfSplit,
    qkv_bias: true,
    dense_bias: true,
    sliding_window: true,
    defaults: ArchDefaults {
        rope_theta: 150_000.0,
        sliding_window_pattern: Some(2),
        ..PLAIN_DEFAULTS
    },
    router_scoring: Some(RouterScoring::TopKSoftmax),
    hf_experts: HfExperts::FusedTransposed,
    moe_bias: true,
    hf_expert_width_key: "intermediate_size",
    attn_sinks: true,
    gguf_ffn_norm_post_attention: true,
    ..LLAMA
};

/// Every family flowrt runs. Families not listed here are refused, never approximated.
pub const ARCHS: &[&ArchSpec] = &[
    &LLAMA, &MISTRAL, &QWEN2, &QWEN3, &GEMMA2, &GEMMA3, &MINICPM, &GRANITE, &SMOLLM3, &BERT, &PHI3,
    &QWEN3_MOE, &GPT_OSS, &LFM2, &LFM2_MOE,
];

/// The family whose GGUF `general.architecture` is `arch`.
pub fn by_gguf_arch(arch: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().copied().find(|a| a.gguf_archs.contains(&arch))
}

/// The family whose HF `model_type` is `model_type`.
pub fn by_hf_model_type(model_type: &str) -> Option<&'static ArchSpec> {
    ARCHS
        .iter()
        .copied()
        .find(|a| a.hf_model_types.contains(&model_type))
}

/// Comma-separated list of known GGUF architecture names, for error messages.
pub fn known_gguf_archs() -> String {
    ARCHS
        .iter()
        .flat_map(|a| a.gguf_archs.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Comma-separated list of known HF model types, for error messages.
pub fn known_hf_model_types() -> String {
    ARCHS
        .iter()
        .flat_map(|a| a.hf_model_types.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}
