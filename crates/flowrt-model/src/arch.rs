//! Architecture families as data.
//!
//! Every difference between families is a field here or a value in [`crate::ModelConfig`] that
//! a field says how to read. Adding a family means adding a row to [`ARCHS`], its tensor-name
//! mapping (if it differs) and a golden test against the reference. The decoder branches on
//! fields, never on a family's name.

/// Gated feed-forward activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, Mistral, MiniCPM).
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
}

impl Activation {
    /// The activation an HF `hidden_act` / `hidden_activation` value names.
    pub fn from_hf(name: &str) -> Option<Activation> {
        match name {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Some(Activation::GeluTanh),
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
    /// × the config's `scale_emb` (MiniCPM).
    FromConfig,
}

/// Which extra scalings of the residual stream and logits the family defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalings {
    /// None.
    None,
    /// MiniCPM's muP scalings: residual branches × `scale_depth / √num_hidden_layers`, final
    /// hidden states ÷ (`hidden_size / dim_model_base`) before the output projection.
    MiniCpm,
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
}

const PLAIN_DEFAULTS: ArchDefaults = ArchDefaults {
    rope_theta: 10_000.0,
    local_rope_theta: None,
    sliding_window_pattern: None,
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
};

/// Mistral: Llama with a sliding attention window on every layer.
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
    },
};

/// MiniCPM (1/2/4, `MiniCPMForCausalLM`): Llama with muP scalings and LongRoPE.
pub const MINICPM: ArchSpec = ArchSpec {
    name: "minicpm",
    gguf_archs: &[],
    hf_model_types: &["minicpm"],
    embed_scale: EmbedScale::FromConfig,
    scalings: Scalings::MiniCpm,
    longrope_by_max_position: true,
    ..LLAMA
};

/// Every family flowrt runs. Families not listed here are refused, never approximated.
pub const ARCHS: &[&ArchSpec] = &[&LLAMA, &MISTRAL, &QWEN2, &QWEN3, &GEMMA3, &MINICPM];

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
