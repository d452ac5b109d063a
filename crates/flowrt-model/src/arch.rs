//! Architecture families as data.
//!
//! Every difference between families is a field here. Adding a family means adding a row to
//! [`ARCHS`], its tensor-name mapping (if it differs) and a golden test against the reference.

/// Gated feed-forward activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, Mistral, MiniCPM).
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
}

/// Which pairs of a head's dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// Pairs `(2i, 2i+1)`. GGUF llama-family files store Q/K rows permuted for this layout.
    Adjacent,
    /// Pairs `(i, i + d/2)`: "rotate half" as in HF transformers (and NeoX-style GGUF families).
    HalfSplit,
}

/// The rules of one architecture family.
#[derive(Debug, PartialEq)]
pub struct ArchSpec {
    /// Our name for the family.
    pub name: &'static str,
    /// `general.architecture` value in GGUF files.
    pub gguf_arch: &'static str,
    /// Feed-forward activation.
    pub activation: Activation,
    /// RoPE pairing of the weights as stored in GGUF files of this family.
    pub gguf_rope_pairing: RopePairing,
    /// Q, K and V projections carry biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on Q and K before RoPE.
    pub qk_norm: bool,
}

/// Llama family: Llama 2/3, SmolLM2, MiniCPM5 (a plain `LlamaForCausalLM`), ...
pub const LLAMA: ArchSpec = ArchSpec {
    name: "llama",
    gguf_arch: "llama",
    activation: Activation::Silu,
    gguf_rope_pairing: RopePairing::Adjacent,
    qkv_bias: false,
    qk_norm: false,
};

/// Every family flowrt runs. Families not listed here are refused, never approximated.
pub const ARCHS: &[&ArchSpec] = &[&LLAMA];

/// The family whose GGUF `general.architecture` is `arch`.
pub fn by_gguf_arch(arch: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().copied().find(|a| a.gguf_arch == arch)
}

/// Comma-separated list of known GGUF architecture names, for error messages.
pub fn known_gguf_archs() -> String {
    ARCHS
        .iter()
        .map(|a| a.gguf_arch)
        .collect::<Vec<_>>()
        .join(", ")
}
