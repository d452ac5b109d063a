//! `ModelConfig::features` (what `flowrt show` lists) on the family fixtures' configs: each
//! family's distinguishing settings are named, and a plain Llama names only its GQA.

use std::path::PathBuf;

use flowrt_model::ModelConfig;

fn features(case: &str) -> Vec<String> {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families")
        .join(case)
        .join("config.json");
    let json = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    ModelConfig::from_hf_json(&file, &json)
        .unwrap_or_else(|e| panic!("{case}: {e}"))
        .features()
}

#[test]
fn a_plain_llama_names_its_attention_layout_and_rope_only() {
    assert_eq!(
        features("llama-tied"),
        [
            "grouped-query attention 16:2",
            "head_dim 8 (≠ hidden/heads)",
            "RoPE base 10000",
        ]
    );
}

#[test]
fn granite_names_its_four_multipliers() {
    let f = features("granite");
    assert_eq!(f[0], "grouped-query attention 8:2");
    for want in [
        "embeddings ×6",
        "residual branches ×0.45",
        "attention scale 0.25 (not 1/√head_dim)",
        "logits ×0.2857143",
    ] {
        assert!(f.iter().any(|s| s == want), "{want} not in {f:?}");
    }
}

#[test]
fn smollm3_names_its_layers_without_rope() {
    let f = features("smollm3");
    assert!(f.iter().any(|s| s == "no RoPE on layers 0, 3"), "{f:?}");
}

#[test]
fn yarn_and_qk_norm_are_named() {
    let f = features("qwen3-yarn");
    assert!(f.iter().any(|s| s == "QK-norm"), "{f:?}");
    assert!(
        f.iter().any(|s| s == "RoPE base 10, YaRN ×4 from 16"),
        "{f:?}"
    );
}

#[test]
fn gemma3_names_windows_local_rope_scale_and_soft_cap() {
    let f = features("gemma3");
    for want in [
        "QK-norm",
        "sandwich norms",
        "sliding window 8 on 3 of 5 layers",
        "RoPE base 500000 (sliding layers 10000)",
        "embeddings ×8",
        "logit soft-cap 8",
    ] {
        assert!(f.iter().any(|s| s == want), "{want} not in {f:?}");
    }
    assert!(
        f.iter().any(|s| s.starts_with("attention scale 0.2041")),
        "1/√24: {f:?}"
    );
}

#[test]
fn qwen3_moe_names_its_experts_and_active_parameters() {
    let f = features("qwen3-moe");
    // 2 sparse layers × 8 experts × 3 · 64 · 32 parameters; top-2 of them per token.
    assert!(
        f.contains(
            &"mixture of experts: 8 experts, 2 active (softmax, renormalised), expert FFN 32, \
              on 2 of 3 layers; 24.6K of 98.3K expert parameters active per token"
                .to_string()
        ),
        "{f:?}"
    );
}

#[test]
fn gpt_oss_names_sinks_windows_experts_and_clamped_swiglu() {
    let f = features("gpt-oss");
    for want in [
        "attention sinks",
        "sliding window 8 on alternate layers (0, 2, ...)",
        "clamped SwiGLU (alpha 1.702, limit 0.6, up + 1)",
    ] {
        assert!(f.contains(&want.to_string()), "{want}: {f:?}");
    }
    assert!(
        f.iter().any(|s| s.starts_with(
            "mixture of experts: 8 experts, 2 active (softmax over the top-k logits), expert FFN 32, router and experts with biases"
        )),
        "{f:?}"
    );
}

#[test]
fn lfm2_moe_names_its_sigmoid_router_selection_bias_and_active_parameters() {
    let f = features("lfm2-moe");
    // 3 sparse layers × 8 experts × 3 · 64 · 32 parameters; top-2 of them per token.
    assert!(
        f.contains(
            &"mixture of experts: 8 experts, 2 active (sigmoid, chosen with a per-expert \
              selection bias, renormalised, weights ×1.7), expert FFN 32, on 3 of 4 layers; \
              36.9K of 147K expert parameters active per token"
                .to_string()
        ),
        "{f:?}"
    );
    assert!(
        f.iter()
            .any(|s| s.starts_with("hybrid: 2 short-convolution layers")),
        "{f:?}"
    );
    assert!(!f.contains(&"convolution biases".to_string()), "{f:?}");
    assert!(features("lfm2-conv-bias").contains(&"convolution biases".to_string()));
}
