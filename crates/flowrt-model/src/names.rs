//! Tensor roles and their names in each format.

/// What a tensor is for. Per-layer roles carry the layer index in [`TensorRole::gguf_name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorRole {
    TokenEmbd,
    OutputNorm,
    Output,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnQNorm,
    AttnKNorm,
    AttnOutput,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
}

impl TensorRole {
    /// Name of the tensor in a GGUF file (`layer` is ignored for global roles).
    pub fn gguf_name(self, layer: usize) -> String {
        use TensorRole::*;
        let per_layer = |s: &str| format!("blk.{layer}.{s}");
        match self {
            TokenEmbd => "token_embd.weight".into(),
            OutputNorm => "output_norm.weight".into(),
            Output => "output.weight".into(),
            AttnNorm => per_layer("attn_norm.weight"),
            AttnQ => per_layer("attn_q.weight"),
            AttnK => per_layer("attn_k.weight"),
            AttnV => per_layer("attn_v.weight"),
            AttnQBias => per_layer("attn_q.bias"),
            AttnKBias => per_layer("attn_k.bias"),
            AttnVBias => per_layer("attn_v.bias"),
            AttnQNorm => per_layer("attn_q_norm.weight"),
            AttnKNorm => per_layer("attn_k_norm.weight"),
            AttnOutput => per_layer("attn_output.weight"),
            FfnNorm => per_layer("ffn_norm.weight"),
            FfnGate => per_layer("ffn_gate.weight"),
            FfnUp => per_layer("ffn_up.weight"),
            FfnDown => per_layer("ffn_down.weight"),
        }
    }
}
