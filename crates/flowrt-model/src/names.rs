//! Tensor roles and their names in each format.

use crate::arch::{ArchSpec, HfExperts, TensorNames};

/// What a tensor is for. Per-layer roles carry the layer index in the name functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorRole {
    TokenEmbd,
    OutputNorm,
    Output,
    /// Per-dimension RoPE frequency divisors (GGUF llama 3 files).
    RopeFreqs,
    /// LongRoPE's long-context frequency divisors (GGUF files with `rope.scaling.type`
    /// `longrope`).
    RopeFactorsLong,
    /// LongRoPE's short-context frequency divisors.
    RopeFactorsShort,
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
    /// Norm of the attention block's output (sandwich norms).
    AttnPostNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    /// Norm of the feed-forward block's output (sandwich norms).
    FfnPostNorm,
    /// Learned absolute position embeddings, `(max_position_embeddings, hidden)`.
    PosEmbd,
    /// Token-type embeddings, `(type_vocab_size, hidden)`.
    TokenTypes,
    /// Norm over the embeddings, and its bias.
    EmbdNorm,
    EmbdNormBias,
    /// Bias of the attention output projection.
    AttnOutputBias,
    /// Post-norm families: the norm after the attention block's residual add, and its bias.
    AttnOutNorm,
    AttnOutNormBias,
    /// Biases of the feed-forward matrices.
    FfnUpBias,
    FfnDownBias,
    /// Post-norm families: the norm after the feed-forward block's residual add, and its
    /// bias.
    LayerOutNorm,
    LayerOutNormBias,
    /// Q, K and V stacked in one matrix (families with `fused_qkv`).
    AttnQkv,
    /// Gate and up stacked in one matrix, the gate's rows first (families with
    /// `fused_gate_up`).
    FfnGateUp,
    /// Mixture of experts: the router, `(num_experts, hidden)`.
    FfnGateInp,
    /// Mixture of experts: every expert's gate, up and down matrices. GGUF stores each role
    /// as one 3-D tensor (one matrix per expert); HF checkpoints one tensor per expert (see
    /// [`TensorRole::hf_expert_name`]).
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    /// Attention sinks: one logit per query head (families with
    /// [`crate::ArchSpec::attn_sinks`]).
    AttnSinks,
    /// Mixture of experts with biases: the router's, `(num_experts)`.
    FfnGateInpBias,
    /// Every expert's gate, up and down biases, `(num_experts, width)` (GGUF; HF stores gate
    /// and up together, [`TensorRole::FfnGateUpExpsBias`]).
    FfnGateExpsBias,
    FfnUpExpsBias,
    FfnDownExpsBias,
    /// HF fused experts ([`crate::HfExperts::FusedTransposed`]): gate and up of every expert
    /// in one tensor, and their biases.
    FfnGateUpExps,
    FfnGateUpExpsBias,
    /// Short convolution layers (hybrid families): the input projection to B, C and x,
    /// `(3 × hidden, hidden)`; the depthwise kernel, `kernel` taps per channel; the output
    /// projection, `(hidden, hidden)`.
    ShortConvIn,
    ShortConvKernel,
    ShortConvOut,
    /// Mixture of experts with a selection bias ([`crate::Router::selection_bias`]): one
    /// value per expert, `(num_experts)`, added to the scores only to choose the top-k.
    FfnExpProbsB,
    /// Short convolution layers with biases (LFM2 `conv_bias`): the input projection's
    /// `(3 × hidden)`, the convolution's `(hidden)`, the output projection's `(hidden)`.
    ShortConvInBias,
    ShortConvKernelBias,
    ShortConvOutBias,
}

impl TensorRole {
    /// Whether the role is an RMSNorm weight.
    pub fn is_norm(self) -> bool {
        use TensorRole::*;
        matches!(
            self,
            OutputNorm
                | AttnNorm
                | AttnQNorm
                | AttnKNorm
                | AttnPostNorm
                | FfnNorm
                | FfnPostNorm
                | EmbdNorm
                | AttnOutNorm
                | LayerOutNorm
        )
    }

    /// The bias of a LayerNorm weight role, for the norms that families with
    /// [`crate::arch::NormKind::Layer`] have.
    pub fn norm_bias(self) -> Option<TensorRole> {
        use TensorRole::*;
        match self {
            EmbdNorm => Some(EmbdNormBias),
            AttnOutNorm => Some(AttnOutNormBias),
            LayerOutNorm => Some(LayerOutNormBias),
            _ => None,
        }
    }

    /// Name of the tensor in a GGUF file (`layer` is ignored for global roles).
    pub fn gguf_name(self, layer: usize) -> String {
        use TensorRole::*;
        let per_layer = |s: &str| format!("blk.{layer}.{s}");
        match self {
            TokenEmbd => "token_embd.weight".into(),
            OutputNorm => "output_norm.weight".into(),
            Output => "output.weight".into(),
            RopeFreqs => "rope_freqs.weight".into(),
            RopeFactorsLong => "rope_factors_long.weight".into(),
            RopeFactorsShort => "rope_factors_short.weight".into(),
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
            AttnPostNorm => per_layer("post_attention_norm.weight"),
            FfnNorm => per_layer("ffn_norm.weight"),
            FfnGate => per_layer("ffn_gate.weight"),
            FfnUp => per_layer("ffn_up.weight"),
            FfnDown => per_layer("ffn_down.weight"),
            FfnPostNorm => per_layer("post_ffw_norm.weight"),
            // llama.cpp's BERT names.
            PosEmbd => "position_embd.weight".into(),
            TokenTypes => "token_types.weight".into(),
            EmbdNorm => "token_embd_norm.weight".into(),
            EmbdNormBias => "token_embd_norm.bias".into(),
            AttnOutputBias => per_layer("attn_output.bias"),
            AttnOutNorm => per_layer("attn_output_norm.weight"),
            AttnOutNormBias => per_layer("attn_output_norm.bias"),
            FfnUpBias => per_layer("ffn_up.bias"),
            FfnDownBias => per_layer("ffn_down.bias"),
            LayerOutNorm => per_layer("layer_output_norm.weight"),
            LayerOutNormBias => per_layer("layer_output_norm.bias"),
            AttnQkv => per_layer("attn_qkv.weight"),
            // llama.cpp's phi3: `ffn_up` holds gate and up, with no `ffn_gate`.
            FfnGateUp => per_layer("ffn_up.weight"),
            FfnGateInp => per_layer("ffn_gate_inp.weight"),
            FfnGateExps => per_layer("ffn_gate_exps.weight"),
            FfnUpExps => per_layer("ffn_up_exps.weight"),
            FfnDownExps => per_layer("ffn_down_exps.weight"),
            AttnSinks => per_layer("attn_sinks.weight"),
            FfnGateInpBias => per_layer("ffn_gate_inp.bias"),
            FfnGateExpsBias => per_layer("ffn_gate_exps.bias"),
            FfnUpExpsBias => per_layer("ffn_up_exps.bias"),
            FfnDownExpsBias => per_layer("ffn_down_exps.bias"),
            // GGUF stores gate and up apart.
            FfnGateUpExps => per_layer("ffn_gate_up_exps.weight"),
            FfnGateUpExpsBias => per_layer("ffn_gate_up_exps.bias"),
            ShortConvIn => per_layer("shortconv.in_proj.weight"),
            ShortConvKernel => per_layer("shortconv.conv.weight"),
            ShortConvOut => per_layer("shortconv.out_proj.weight"),
            FfnExpProbsB => per_layer("exp_probs_b.bias"),
            ShortConvInBias => per_layer("shortconv.in_proj.bias"),
            ShortConvKernelBias => per_layer("shortconv.conv.bias"),
            ShortConvOutBias => per_layer("shortconv.out_proj.bias"),
        }
    }

    /// Name of the tensor in a GGUF file of `arch`: [`TensorRole::gguf_name`], except where a
    /// family's files differ (llama.cpp's lfm2 stores the final norm as `token_embd_norm`;
    /// its gpt-oss the FFN's input norm as `post_attention_norm`).
    pub fn gguf_name_in(self, arch: &ArchSpec, layer: usize) -> String {
        match (arch.tensor_names, self) {
            (TensorNames::Lfm2, TensorRole::OutputNorm) => "token_embd_norm.weight".into(),
            (_, TensorRole::FfnNorm) if arch.gguf_ffn_norm_post_attention => {
                TensorRole::AttnPostNorm.gguf_name(layer)
            }
            _ => self.gguf_name(layer),
        }
    }

    /// Name of the tensor in an HF checkpoint, after the model prefix (`model.` for the
    /// decoder; the output projection is `lm_head.weight` outside it, see
    /// [`TensorRole::hf_in_decoder`]). `None`: the format has no such tensor.
    pub fn hf_name(self, arch: &ArchSpec, layer: usize) -> Option<String> {
        match arch.tensor_names {
            TensorNames::Bert => return self.hf_bert_name(layer),
            TensorNames::Lfm2 => return self.hf_lfm2_name(layer),
            TensorNames::Decoder => {}
        }
        use TensorRole::*;
        let per_layer = |s: &str| Some(format!("layers.{layer}.{s}"));
        match self {
            TokenEmbd => Some("embed_tokens.weight".into()),
            OutputNorm => Some("norm.weight".into()),
            Output => Some("lm_head.weight".into()),
            RopeFreqs | RopeFactorsLong | RopeFactorsShort => None,
            AttnNorm => per_layer("input_layernorm.weight"),
            AttnQ => per_layer("self_attn.q_proj.weight"),
            AttnK => per_layer("self_attn.k_proj.weight"),
            AttnV => per_layer("self_attn.v_proj.weight"),
            AttnQBias => per_layer("self_attn.q_proj.bias"),
            AttnKBias => per_layer("self_attn.k_proj.bias"),
            AttnVBias => per_layer("self_attn.v_proj.bias"),
            AttnQNorm => per_layer("self_attn.q_norm.weight"),
            AttnKNorm => per_layer("self_attn.k_norm.weight"),
            AttnOutput => per_layer("self_attn.o_proj.weight"),
            // With sandwich norms HF's `post_attention_layernorm` is the attention output's
            // norm and the FFN's input norm is `pre_feedforward_layernorm`; without them
            // `post_attention_layernorm` is the FFN's input norm.
            AttnPostNorm => per_layer("post_attention_layernorm.weight"),
            FfnNorm if arch.sandwich_norms => per_layer("pre_feedforward_layernorm.weight"),
            FfnNorm => per_layer("post_attention_layernorm.weight"),
            FfnGate => per_layer("mlp.gate_proj.weight"),
            FfnUp => per_layer("mlp.up_proj.weight"),
            FfnDown => per_layer("mlp.down_proj.weight"),
            FfnPostNorm => per_layer("post_feedforward_layernorm.weight"),
            AttnOutputBias => per_layer("self_attn.o_proj.bias"),
            FfnUpBias => per_layer("mlp.up_proj.bias"),
            FfnDownBias => per_layer("mlp.down_proj.bias"),
            AttnQkv => per_layer("self_attn.qkv_proj.weight"),
            FfnGateUp => per_layer("mlp.gate_up_proj.weight"),
            FfnGateInp if arch.hf_experts == HfExperts::FusedTransposed => {
                per_layer("mlp.router.weight")
            }
            FfnGateInp => per_layer("mlp.gate.weight"),
            FfnGateInpBias => per_layer("mlp.router.bias"),
            AttnSinks => per_layer("self_attn.sinks"),
            FfnGateUpExps => per_layer("mlp.experts.gate_up_proj"),
            FfnGateUpExpsBias => per_layer("mlp.experts.gate_up_proj_bias"),
            FfnDownExps if arch.hf_experts == HfExperts::FusedTransposed => {
                per_layer("mlp.experts.down_proj")
            }
            FfnDownExpsBias => per_layer("mlp.experts.down_proj_bias"),
            // One tensor per expert: `hf_expert_name`.
            FfnGateExps | FfnUpExps | FfnDownExps => None,
            FfnGateExpsBias | FfnUpExpsBias => None,
            ShortConvIn | ShortConvKernel | ShortConvOut => None,
            FfnExpProbsB | ShortConvInBias | ShortConvKernelBias | ShortConvOutBias => None,
            PosEmbd | TokenTypes | EmbdNorm | EmbdNormBias | AttnOutNorm | AttnOutNormBias
            | LayerOutNorm | LayerOutNormBias => None,
        }
    }

    /// HF `BertModel` names (after an optional `bert.` prefix).
    fn hf_bert_name(self, layer: usize) -> Option<String> {
        use TensorRole::*;
        let per_layer = |s: &str| Some(format!("encoder.layer.{layer}.{s}"));
        match self {
            TokenEmbd => Some("embeddings.word_embeddings.weight".into()),
            PosEmbd => Some("embeddings.position_embeddings.weight".into()),
            TokenTypes => Some("embeddings.token_type_embeddings.weight".into()),
            EmbdNorm => Some("embeddings.LayerNorm.weight".into()),
            EmbdNormBias => Some("embeddings.LayerNorm.bias".into()),
            AttnQ => per_layer("attention.self.query.weight"),
            AttnK => per_layer("attention.self.key.weight"),
            AttnV => per_layer("attention.self.value.weight"),
            AttnQBias => per_layer("attention.self.query.bias"),
            AttnKBias => per_layer("attention.self.key.bias"),
            AttnVBias => per_layer("attention.self.value.bias"),
            AttnOutput => per_layer("attention.output.dense.weight"),
            AttnOutputBias => per_layer("attention.output.dense.bias"),
            AttnOutNorm => per_layer("attention.output.LayerNorm.weight"),
            AttnOutNormBias => per_layer("attention.output.LayerNorm.bias"),
            FfnUp => per_layer("intermediate.dense.weight"),
            FfnUpBias => per_layer("intermediate.dense.bias"),
            FfnDown => per_layer("output.dense.weight"),
            FfnDownBias => per_layer("output.dense.bias"),
            LayerOutNorm => per_layer("output.LayerNorm.weight"),
            LayerOutNormBias => per_layer("output.LayerNorm.bias"),
            OutputNorm | Output | RopeFreqs | RopeFactorsLong | RopeFactorsShort | AttnNorm
            | AttnQNorm | AttnKNorm | AttnPostNorm | FfnNorm | FfnGate | FfnPostNorm | AttnQkv
            | FfnGateUp | FfnGateInp | FfnGateExps | FfnUpExps | FfnDownExps | AttnSinks
            | FfnGateInpBias | FfnGateExpsBias | FfnUpExpsBias | FfnDownExpsBias
            | FfnGateUpExps | FfnGateUpExpsBias | ShortConvIn | ShortConvKernel | ShortConvOut
            | FfnExpProbsB | ShortConvInBias | ShortConvKernelBias | ShortConvOutBias => None,
        }
    }

    /// HF `Lfm2ForCausalLM` and `Lfm2MoeForCausalLM` names (after `model.`).
    fn hf_lfm2_name(self, layer: usize) -> Option<String> {
        use TensorRole::*;
        let per_layer = |s: &str| Some(format!("layers.{layer}.{s}"));
        match self {
            TokenEmbd => Some("embed_tokens.weight".into()),
            OutputNorm => Some("embedding_norm.weight".into()),
            Output => Some("lm_head.weight".into()),
            AttnNorm => per_layer("operator_norm.weight"),
            AttnQ => per_layer("self_attn.q_proj.weight"),
            AttnK => per_layer("self_attn.k_proj.weight"),
            AttnV => per_layer("self_attn.v_proj.weight"),
            AttnQNorm => per_layer("self_attn.q_layernorm.weight"),
            AttnKNorm => per_layer("self_attn.k_layernorm.weight"),
            AttnOutput => per_layer("self_attn.out_proj.weight"),
            FfnNorm => per_layer("ffn_norm.weight"),
            FfnGate => per_layer("feed_forward.w1.weight"),
            FfnUp => per_layer("feed_forward.w3.weight"),
            FfnDown => per_layer("feed_forward.w2.weight"),
            ShortConvIn => per_layer("conv.in_proj.weight"),
            ShortConvKernel => per_layer("conv.conv.weight"),
            ShortConvOut => per_layer("conv.out_proj.weight"),
            ShortConvInBias => per_layer("conv.in_proj.bias"),
            ShortConvKernelBias => per_layer("conv.conv.bias"),
            ShortConvOutBias => per_layer("conv.out_proj.bias"),
            FfnGateInp => per_layer("feed_forward.gate.weight"),
            FfnExpProbsB => per_layer("feed_forward.expert_bias"),
            _ => None,
        }
    }

    /// HF name (after the model prefix) of expert `expert`'s matrix of an experts role
    /// (`layers.{i}.mlp.experts.{j}.gate_proj.weight`, as transformers 5 saves Qwen3-MoE).
    pub fn hf_expert_name(self, layer: usize, expert: usize) -> Option<String> {
        let m = match self {
            TensorRole::FfnGateExps => "gate_proj",
            TensorRole::FfnUpExps => "up_proj",
            TensorRole::FfnDownExps => "down_proj",
            _ => return None,
        };
        Some(format!("layers.{layer}.mlp.experts.{expert}.{m}.weight"))
    }

    /// HF name (after the model prefix) of expert `expert`'s matrix of an experts role in a
    /// checkpoint of `arch`: [`TensorRole::hf_expert_name`], or with LFM2's names
    /// (`layers.{i}.feed_forward.experts.{j}.w1.weight`: w1 gate, w3 up, w2 down, as
    /// transformers 5 saves LFM2-MoE).
    pub fn hf_expert_name_in(self, arch: &ArchSpec, layer: usize, expert: usize) -> Option<String> {
        if arch.tensor_names != TensorNames::Lfm2 {
            return self.hf_expert_name(layer, expert);
        }
        let m = match self {
            TensorRole::FfnGateExps => "w1",
            TensorRole::FfnUpExps => "w3",
            TensorRole::FfnDownExps => "w2",
            _ => return None,
        };
        Some(format!(
            "layers.{layer}.feed_forward.experts.{expert}.{m}.weight"
        ))
    }

    /// Whether the HF name sits under the decoder's prefix (`model.`); the output projection
    /// sits beside it.
    pub fn hf_in_decoder(self) -> bool {
        self != TensorRole::Output
    }
}
