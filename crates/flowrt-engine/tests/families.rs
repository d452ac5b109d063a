//! Golden tests of every architecture family against HF transformers: tiny random-weight
//! checkpoints (f32) made by `scripts/make_family_fixtures.py`, each with the reference's
//! logits for a few prompts. flowrt loads the HF directory itself (config.json, safetensors,
//! tokenizer files) and must agree at every position.

mod common;

use flowrt_engine::{verify, EngineOptions, KvPrecision, LoadedModel, Session, VerifyReport};
use flowrt_kernels::Kernels;
use flowrt_testkit::golden;

fn run(case: &str, kv: KvPrecision, max_batch: usize, kernels: &'static Kernels) -> VerifyReport {
    let dir = common::fixture(&format!("families/{case}"));
    let model = LoadedModel::load(&dir).unwrap_or_else(|e| panic!("loading {case}: {e}"));
    let mut s = Session::new(
        &model,
        &EngineOptions {
            threads: 2,
            kv,
            max_batch,
            ..EngineOptions::default()
        }
        .with_option("kernels", kernels.name()),
    )
    .unwrap();
    verify(&mut s, &dir.join("ref.safetensors")).unwrap_or_else(|e| panic!("{case}: {e}"))
}

/// Each family on each path: f32 KV on the default table in 256- and 7-token batches, f32 KV
/// on the scalar reference table, and f16 KV.
fn check(case: &str) {
    let best = Kernels::detect();
    let scalar = Kernels::scalar();
    for (kv, batch, kernels, bounds) in [
        (KvPrecision::F32, 256, best, common::FAMILY_F32_KV),
        (KvPrecision::F32, 7, best, common::FAMILY_F32_KV),
        (KvPrecision::F32, 256, scalar, common::FAMILY_F32_KV),
        (KvPrecision::F16, 256, best, common::FAMILY_F16_KV),
    ] {
        let r = run(case, kv, batch, kernels);
        golden::check(
            &format!("{case} kv={kv:?} batch={batch} kernels={}", kernels.name()),
            &common::agreement(&r),
            &bounds,
        );
    }
}

#[test]
fn llama_tied_16_to_2_gqa() {
    check("llama-tied");
}

#[test]
fn llama_untied() {
    check("llama-untied");
}

#[test]
fn llama_42_layers() {
    check("llama-42l");
}

#[test]
fn llama3_rope_scaling() {
    check("llama3-rope");
}

#[test]
fn qwen2_qkv_bias() {
    check("qwen2");
}

#[test]
fn qwen3_qk_norm() {
    check("qwen3");
}

#[test]
fn gemma3_sliding_window_sandwich_norms_softcap() {
    check("gemma3");
}

#[test]
fn gemma2_attention_softcap_alternating_windows() {
    check("gemma2");
}

#[test]
fn mistral_sliding_window() {
    check("mistral");
}

#[test]
fn minicpm_scalings_and_longrope() {
    check("minicpm");
}

#[test]
fn granite_multipliers() {
    check("granite");
}

#[test]
fn smollm3_nope_layers() {
    check("smollm3");
}

#[test]
fn qwen3_yarn_rope() {
    check("qwen3-yarn");
}

/// Phi-4-mini style: fused QKV and gate/up, 12 of 16 dims rotated, LongRoPE (the reference
/// runs token by token, so positions from 32 on use the long factors), sliding window 16.
#[test]
fn phi3_fused_partial_rotary_longrope() {
    check("phi3");
}

/// A Phi-3 checkpoint whose fused tensors disagree with the config's head counts or
/// intermediate size is refused, naming the tensor and the fields.
#[test]
fn phi3_fused_rows_disagreeing_with_the_config_name_the_fields() {
    let dir = edited_copy("phi3", |c| c["num_key_value_heads"] = 4.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("self_attn.qkv_proj.weight")
            && e.contains("(num_attention_heads + 2 × num_key_value_heads) × head_dim"),
        "{e}"
    );
    let dir = edited_copy("phi3", |c| c["intermediate_size"] = 64.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("mlp.gate_up_proj.weight") && e.contains("2 × intermediate_size = 128"),
        "{e}"
    );
}

/// 8 experts, top-2, renormalised; layer 1 dense (`mlp_only_layers`). The 7-token batches
/// split prompts so that each batch groups a different mix of tokens by expert.
#[test]
fn qwen3_moe_mixture_of_experts() {
    check("qwen3-moe");
}

/// gpt-oss: attention sinks, sliding (window 8) and full layers alternating, YaRN (truncate
/// false), Q/K/V/O biases, a biased top-k-softmax router over 8 experts (top-2) whose biased
/// experts run the clamped SwiGLU, experts bound from HF's fused, transposed, interleaved
/// tensors. Prompts of 20, 33 and 48 tokens cross the window; the 7-token batches split
/// prompts across batches (sinks over the cached keys); f16 KV runs the split-K path too
/// where it splits.
#[test]
fn gpt_oss_sinks_sliding_experts() {
    check("gpt-oss");
}

/// LFM2: short gated convolution layers (kernel 3) and attention layers; 7-token batches
/// split every prompt so that a convolution reads positions of the previous batch.
#[test]
fn lfm2_hybrid_short_convolution() {
    check("lfm2");
}

/// The LFM2 fixture as a q8_0 GGUF (scripts/hf_to_gguf.py, llama.cpp's `lfm2` names and keys:
/// a per-layer KV-head list with 0 on convolution layers, `shortconv.l_cache`, f32 taps)
/// against transformers' f32 logits: within q8_0's bounds.
#[test]
fn lfm2_gguf_q8_0_within_quantisation_bounds() {
    let dir = common::fixture("families/lfm2");
    let m = LoadedModel::load(&dir.join("model-q8_0.gguf")).unwrap();
    let sc = m
        .model
        .config
        .short_conv
        .as_ref()
        .expect("lfm2 has convolution layers");
    assert_eq!(
        (sc.kernel, &sc.conv_layers[..]),
        (3, &[true, false, true, false][..])
    );
    assert_eq!(m.model.config.intermediate_size, 128);
    let conv = m.model.layers[0]
        .conv
        .as_ref()
        .expect("layer 0 is a convolution layer");
    assert_eq!(conv.in_proj.dtype, flowrt_dtype::GgmlType::Q8_0);
    assert!(m.model.layers[1].conv.is_none(), "layer 1 attends");
    within_bounds(&m, &dir, "lfm2 q8_0 GGUF", Some(7), 0.97, 1e-3);
}

/// LFM2-MoE: LFM2's convolution and attention layers, layer 0 a dense SwiGLU
/// (`num_dense_layers` 1), layers 1-3 mixtures of 8 experts (top-2) behind a sigmoid router
/// whose choice adds a nonzero random `expert_bias` (it changes 65 % of the choices in this
/// fixture) while the weights stay unbiased, renormalised (sum + 1e-6) and × 1.7
/// (`routed_scaling_factor`). 7-token batches split prompts across batches (convolution
/// cache and experts grouped per batch).
#[test]
fn lfm2_moe_sigmoid_router_with_expert_bias() {
    check("lfm2-moe");
}

/// The LFM2-MoE fixture as a q8_0 GGUF (scripts/hf_to_gguf.py, llama.cpp's `lfm2moe` keys:
/// `leading_dense_block_count`, `expert_gating_func` 2, `expert_weights_norm`,
/// `expert_weights_scale`; `exp_probs_b.bias` f32) against transformers' f32 logits: within
/// q8_0's bounds.
#[test]
fn lfm2_moe_gguf_q8_0_within_quantisation_bounds() {
    let dir = common::fixture("families/lfm2-moe");
    let m = LoadedModel::load(&dir.join("model-q8_0.gguf")).unwrap();
    let c = &m.model.config;
    let moe = c.moe.as_ref().expect("lfm2moe has experts");
    assert_eq!(moe.sparse_layers, [false, true, true, true]);
    assert_eq!(moe.router.scoring, flowrt_model::RouterScoring::Sigmoid);
    assert!(moe.router.selection_bias && moe.router.renormalize);
    assert_eq!((moe.router.scale, moe.router.renorm_eps), (1.7, 1e-6));
    assert_eq!(c.intermediate_size, 96, "no LFM2 width adjustment");
    assert!(m.model.layers[0].moe.is_none(), "layer 0 is dense");
    let x = m.model.layers[1].moe.as_ref().expect("layer 1 is sparse");
    assert_eq!(x.gate[7].dtype, flowrt_dtype::GgmlType::Q8_0);
    assert_eq!(x.selection_bias.as_ref().map(Vec::len), Some(8));
    within_bounds(&m, &dir, "lfm2-moe q8_0 GGUF", Some(7), 0.97, 1e-3);
}

/// LFM2 with `conv_bias: true`: biases on each convolution layer's input projection,
/// depthwise convolution (added before the C gate) and output projection.
#[test]
fn lfm2_conv_bias() {
    check("lfm2-conv-bias");
}

/// The conv-bias fixture as a q8_0 GGUF (flowrt's `shortconv.*.bias` names; llama.cpp's
/// lfm2 has none): within q8_0's bounds.
#[test]
fn lfm2_conv_bias_gguf_q8_0_within_quantisation_bounds() {
    let dir = common::fixture("families/lfm2-conv-bias");
    let m = LoadedModel::load(&dir.join("model-q8_0.gguf")).unwrap();
    assert!(m.model.config.short_conv.as_ref().unwrap().bias);
    let conv = m.model.layers[0].conv.as_ref().unwrap();
    assert!(conv.in_bias.is_some() && conv.kernel_bias.is_some() && conv.out_bias.is_some());
    within_bounds(&m, &dir, "lfm2-conv-bias q8_0 GGUF", Some(7), 0.97, 1e-3);
}

/// LFM2-MoE configs the checkpoint or the model contradict: errors naming the field.
#[test]
fn lfm2_moe_bad_config_names_the_field() {
    let dir = edited_copy("lfm2-moe", |c| c["num_experts_per_tok"] = 9.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("num_experts_per_tok (top-k) = 9 exceeds num_experts = 8"),
        "{e}"
    );
    let dir = edited_copy("lfm2-moe", |c| c["num_dense_layers"] = 5.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("num_dense_layers = 5 exceeds num_hidden_layers = 4"),
        "{e}"
    );
    // One dense layer too many: layer 1's experts are left unused and its dense FFN missing.
    let dir = edited_copy("lfm2-moe", |c| c["num_dense_layers"] = 2.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("missing tensor `model.layers.1.feed_forward.w1.weight`"),
        "{e}"
    );
    let dir = edited_copy("lfm2-moe", |c| c["num_experts"] = 6.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("layer 1 has 8 experts") && e.contains("the expert count (num_experts) is 6"),
        "{e}"
    );
    // Without the selection bias the checkpoint's `expert_bias` is a tensor the model
    // does not use.
    let dir = edited_copy("lfm2-moe", |c| c["use_expert_bias"] = false.into());
    let e = load_error(dir.path());
    assert!(e.contains("feed_forward.expert_bias"), "{e}");
    let dir = edited_copy("lfm2-moe", |c| c["routed_scaling_factor"] = 0.0.into());
    let e = load_error(dir.path());
    assert!(e.contains("routed_scaling_factor"), "{e}");
}

/// Teacher-forced `m` (a quantised file of the fixture in `dir`) against the fixture's
/// transformers logits with an f32 KV cache (batches of `max_batch` tokens when given):
/// prints the figures and asserts top-1 ≥ `min_top1` and mean KL ≤ `max_kl`.
fn within_bounds(
    m: &LoadedModel,
    dir: &std::path::Path,
    label: &str,
    max_batch: Option<usize>,
    min_top1: f64,
    max_kl: f64,
) {
    let mut o = EngineOptions {
        threads: 2,
        kv: KvPrecision::F32,
        ..EngineOptions::default()
    };
    if let Some(b) = max_batch {
        o.max_batch = b;
    }
    let mut s = Session::new(m, &o).unwrap();
    let r = verify(&mut s, &dir.join("ref.safetensors")).unwrap();
    eprintln!(
        "{label}: top-1 {:.4}, mean KL {:.3e}, max |err| {:.3e}",
        r.top1_agreement, r.mean_kl, r.max_abs_logit_err
    );
    assert!(
        r.top1_agreement >= min_top1,
        "{label}: top-1 {}",
        r.top1_agreement
    );
    assert!(r.mean_kl <= max_kl, "{label}: mean KL {}", r.mean_kl);
}

/// Copy a fixture into a temporary directory, editing its config.json with `edit`.
fn edited_copy(case: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let src = common::fixture(&format!("families/{case}"));
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&cfg_path, serde_json::to_string(&cfg).unwrap()).unwrap();
    dir
}

fn load_error(dir: &std::path::Path) -> String {
    match LoadedModel::load(dir) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// The MiniCPM5 port shim in reverse: a Qwen3 checkpoint declared as Llama would run without
/// its QK-norm. flowrt refuses it and names the tensors the declared family leaves unused.
#[test]
fn mislabelled_family_is_refused_naming_unused_tensors() {
    let dir = edited_copy("qwen3", |c| c["model_type"] = "llama".into());
    let e = load_error(dir.path());
    assert!(
        e.contains("does not use") && e.contains("self_attn.q_norm.weight"),
        "{e}"
    );
    // Gemma 3 declared as Llama: its sandwich norms would be dropped.
    let dir = edited_copy("gemma3", |c| {
        c["model_type"] = "llama".into();
        c["hidden_act"] = "gelu_pytorch_tanh".into();
    });
    let e = load_error(dir.path());
    assert!(e.contains("post_feedforward_layernorm"), "{e}");
}

/// A soft-cap that is not a positive number is refused naming the key; `null` means none.
#[test]
fn bad_attention_soft_cap_is_refused_naming_the_key() {
    for bad in [
        serde_json::json!(0.0),
        serde_json::json!(-50.0),
        serde_json::json!("50"),
    ] {
        let dir = edited_copy("gemma2", |c| c["attn_logit_softcapping"] = bad.clone());
        let e = load_error(dir.path());
        assert!(e.contains("attn_logit_softcapping"), "{bad}: {e}");
    }
    let dir = edited_copy("gemma2", |c| {
        c["attn_logit_softcapping"] = serde_json::Value::Null
    });
    let m = LoadedModel::load(dir.path()).unwrap();
    assert_eq!(m.model.config.attn_logit_softcapping, None);
}

#[test]
fn unknown_model_type_is_refused() {
    let dir = edited_copy("llama-tied", |c| c["model_type"] = "mamba".into());
    let e = load_error(dir.path());
    assert!(
        e.contains("unknown architecture `mamba`") && e.contains("qwen3"),
        "{e}"
    );
}

#[test]
fn inconsistent_config_names_the_file_and_problem() {
    let dir = edited_copy("llama-tied", |c| c["num_key_value_heads"] = 3.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("config.json") && e.contains("not a multiple"),
        "{e}"
    );
    let dir =
        edited_copy(
            "llama-tied",
            |c| {
                c["rope_parameters"] =
                    serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
            },
        );
    let e = load_error(dir.path());
    assert!(
        e.contains("`yarn` without `original_max_position_embeddings`"),
        "{e}"
    );
    // Dynamic NTK follows the current sequence length, which a KV cache cannot: refused by name.
    let dir = edited_copy(
        "llama-tied",
        |c| {
            c["rope_parameters"] =
                serde_json::json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
        },
    );
    let e = load_error(dir.path());
    assert!(
        e.contains("config.json") && e.contains("rope_type: \"dynamic\""),
        "{e}"
    );
    // YaRN with beta_fast below beta_slow names both.
    let dir = edited_copy("qwen3-yarn", |c| {
        c["rope_parameters"]["beta_fast"] = 0.5.into();
    });
    let e = load_error(dir.path());
    assert!(
        e.contains("`beta_fast`") && e.contains("`beta_slow`"),
        "{e}"
    );
    // Shapes that disagree with the weights: every mis-shaped tensor is listed.
    let dir = edited_copy("llama-tied", |c| c["intermediate_size"] = 100.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("mlp.gate_proj.weight") && e.contains("mlp.down_proj.weight"),
        "{e}"
    );
}

#[test]
fn hostile_shard_index_is_refused() {
    let dir = edited_copy("llama-tied", |_| {});
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"model.embed_tokens.weight": "../../etc/passwd"}}"#,
    )
    .unwrap();
    let e = load_error(dir.path());
    assert!(e.contains("not a plain file name"), "{e}");
    // A truncated shard is an error naming the file, not a crash.
    let dir = edited_copy("llama-tied", |_| {});
    let st = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_error(dir.path());
    assert!(e.contains("model.safetensors"), "{e}");
}

/// Quantisation on load: the q4_1 weights flowrt makes from the f32 checkpoint and the q4_1
/// GGUF made from it by an independent converter (gguf-py, scripts/hf_to_gguf.py) give the
/// same logits, and both agree with transformers running the GGUF's dequantised weights.
#[test]
fn quantised_on_load_matches_the_gguf_of_the_same_model() {
    let dir = common::fixture("families/llama-untied");
    let reference = dir.join("ref-q4_1.safetensors");
    let opts = EngineOptions {
        threads: 2,
        kv: KvPrecision::F32,
        ..EngineOptions::default()
    };
    let hf = LoadedModel::load_with(
        &dir,
        &flowrt_engine::LoadOptions {
            quant: Some(flowrt_dtype::GgmlType::Q4_1),
        },
    )
    .unwrap();
    assert_eq!(
        hf.model.layers[0].wq.as_ref().unwrap().dtype,
        flowrt_dtype::GgmlType::Q4_1
    );
    let gguf = LoadedModel::load(&dir.join("model-q4_1.gguf")).unwrap();
    let mut reports = Vec::new();
    for m in [&hf, &gguf] {
        let mut s = Session::new(m, &opts).unwrap();
        let r = verify(&mut s, &reference).unwrap();
        eprintln!(
            "{}: top-1 {:.4}, mean KL {:.3e}, max |err| {:.3e}",
            m.path.display(),
            r.top1_agreement,
            r.mean_kl,
            r.max_abs_logit_err
        );
        reports.push(r);
    }
    for r in &reports {
        assert_eq!(r.top1_agreement, 1.0, "top-1 {}", r.top1_agreement);
        assert!(r.mean_kl <= 1e-6, "mean KL {}", r.mean_kl);
    }
}

/// Granite's four multipliers are required: missing, zero, negative or non-numeric values are
/// errors naming the field.
#[test]
fn granite_missing_or_invalid_multiplier_names_the_field() {
    for key in [
        "embedding_multiplier",
        "attention_multiplier",
        "residual_multiplier",
        "logits_scaling",
    ] {
        let dir = edited_copy("granite", |c| {
            c.as_object_mut().unwrap().remove(key);
        });
        let e = load_error(dir.path());
        assert!(e.contains("missing") && e.contains(key), "{key}: {e}");
        for bad in [
            serde_json::json!(0.0),
            serde_json::json!(-2.0),
            serde_json::json!("x"),
        ] {
            let dir = edited_copy("granite", |c| c[key] = bad.clone());
            let e = load_error(dir.path());
            assert!(e.contains(&format!("`{key}`")), "{key} = {bad}: {e}");
        }
    }
}

/// SmolLM3's `no_rope_layers` must have one 0/1 entry per layer; without it,
/// `no_rope_layer_interval` must be positive. Errors name the field.
#[test]
fn smollm3_bad_no_rope_layers_names_the_field() {
    for (what, bad) in [
        ("too short", serde_json::json!([1, 1, 0])),
        ("too long", serde_json::json!([1, 1, 1, 0, 1, 1])),
        ("not 0/1", serde_json::json!([1, 1, 2, 0, 1])),
        ("not a list", serde_json::json!(4)),
    ] {
        let dir = edited_copy("smollm3", |c| c["no_rope_layers"] = bad.clone());
        let e = load_error(dir.path());
        assert!(e.contains("`no_rope_layers`"), "{what}: {e}");
    }
    let dir = edited_copy("smollm3", |c| {
        c.as_object_mut().unwrap().remove("no_rope_layers");
        c["no_rope_layer_interval"] = 0.into();
    });
    let e = load_error(dir.path());
    assert!(e.contains("`no_rope_layer_interval`"), "{e}");
    // Without the list, transformers' rule: every 4th layer (index 3) skips RoPE.
    let dir = edited_copy("smollm3", |c| {
        c.as_object_mut().unwrap().remove("no_rope_layers");
    });
    let m = LoadedModel::load(dir.path()).unwrap();
    assert_eq!(m.model.config.rope_layers, [true, true, true, false, true]);
}

/// Qwen3-MoE's expert count contradicted by the checkpoint's experts, or a top-k beyond the
/// experts: errors naming the field.
#[test]
fn qwen3_moe_bad_expert_config_names_the_field() {
    let dir = edited_copy("qwen3-moe", |c| c["num_local_experts"] = 6.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("layer 0 has 8 experts") && e.contains("the expert count (num_experts) is 6"),
        "{e}"
    );
    let dir = edited_copy("qwen3-moe", |c| c["num_experts_per_tok"] = 9.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("num_experts_per_tok (top-k) = 9 exceeds num_experts = 8"),
        "{e}"
    );
    let dir = edited_copy("qwen3-moe", |c| {
        c.as_object_mut().unwrap().remove("num_local_experts");
    });
    let e = load_error(dir.path());
    assert!(e.contains("num_experts"), "{e}");
}

/// The Qwen3-MoE fixture as a q8_0 GGUF (scripts/hf_to_gguf.py: every matrix, router and the
/// 3-D expert tensors in q8_0) against transformers' f32 logits: within q8_0's bounds.
#[test]
fn qwen3_moe_gguf_q8_0_within_quantisation_bounds() {
    let dir = common::fixture("families/qwen3-moe");
    let m = LoadedModel::load(&dir.join("model-q8_0.gguf")).unwrap();
    let x = m.model.layers[0].moe.as_ref().expect("layer 0 is sparse");
    assert_eq!(x.gate[7].dtype, flowrt_dtype::GgmlType::Q8_0);
    assert!(m.model.layers[1].moe.is_none(), "layer 1 is dense");
    // Measured: top-1 0.9802 (2 of 101 positions), mean KL 5.5e-4; the f32 GGUF of the same
    // checkpoint agrees to mean KL 7e-13, so the rest is q8_0 rounding (router included).
    within_bounds(&m, &dir, "qwen3-moe q8_0 GGUF", None, 0.97, 1e-3);
}

/// The gpt-oss fixture as a q8_0 GGUF (scripts/hf_to_gguf.py: llama.cpp's `gpt-oss` names,
/// gate/up de-interleaved into `ffn_{gate,up}_exps`, every expert transposed, biases and
/// sinks f32, YaRN with flowrt's `yarn_truncate` false, flowrt's `swiglu_limit`) against
/// transformers' f32 logits: within q8_0's bounds.
#[test]
fn gpt_oss_gguf_q8_0_within_quantisation_bounds() {
    let dir = common::fixture("families/gpt-oss");
    let m = LoadedModel::load(&dir.join("model-q8_0.gguf")).unwrap();
    let c = &m.model.config;
    assert_eq!(
        c.layer_types,
        [
            flowrt_model::LayerType::Sliding,
            flowrt_model::LayerType::Full,
            flowrt_model::LayerType::Sliding,
            flowrt_model::LayerType::Full
        ]
    );
    assert_eq!(c.sliding_window, Some(8));
    let x = m.model.layers[0].moe.as_ref().expect("layer 0 is sparse");
    assert_eq!(x.gate[7].dtype, flowrt_dtype::GgmlType::Q8_0);
    assert!(x.router_bias.is_some() && x.down_bias.is_some());
    assert!(m.model.layers[3].sinks.is_some());
    within_bounds(&m, &dir, "gpt-oss q8_0 GGUF", None, 0.97, 1e-3);
}

/// The gpt-oss fixture with its experts in MXFP4 and every other matrix in q8_0
/// (`scripts/hf_to_gguf.py --outtype mxfp4_moe`, llama.cpp's MXFP4_MOE mix; gguf-py's
/// quantiser), as OpenAI ships gpt-oss: the experts run the MXFP4 x8 kernels. Against
/// transformers' f32 logits, within 4-bit bounds (tiny random experts quantise worse than
/// trained ones).
#[test]
fn gpt_oss_gguf_mxfp4_experts_within_quantisation_bounds() {
    let dir = common::fixture("families/gpt-oss");
    let m = LoadedModel::load(&dir.join("model-mxfp4.gguf")).unwrap();
    let x = m.model.layers[0].moe.as_ref().expect("layer 0 is sparse");
    assert_eq!(x.gate[7].dtype, flowrt_dtype::GgmlType::Mxfp4);
    assert_eq!(x.down[0].dtype, flowrt_dtype::GgmlType::Mxfp4);
    within_bounds(
        &m,
        &dir,
        "gpt-oss MXFP4 experts GGUF",
        None,
        TOP1_MXFP4,
        KL_MXFP4,
    );
}
/// Measured 0.832 / 1.37e-2; an MXFP4 scale off by one exponent gives 0.327 / 0.56.
const TOP1_MXFP4: f64 = 0.78;
const KL_MXFP4: f64 = 0.03;

/// gpt-oss as OpenAI ships it on Hugging Face: the gpt-oss fixture with its experts in MXFP4
/// safetensors (`*_blocks` / `*_scales`, `quantization_config` mxfp4;
/// scripts/make_gptoss_mxfp4_fixture.py), bound in MXFP4 by repacking the bytes into ggml's
/// blocks, against transformers loading that directory (its experts dequantised into f32
/// parameters: the same values flowrt's blocks hold). The MXFP4 kernels multiply with Q8_0
/// activations, so the only error is the activations' 8-bit rounding in the experts.
#[test]
fn gpt_oss_mxfp4_safetensors_experts() {
    let dir = common::fixture("families/gpt-oss-mxfp4");
    let m = LoadedModel::load(&dir).unwrap();
    let x = m.model.layers[0].moe.as_ref().expect("layer 0 is sparse");
    assert_eq!(x.gate[7].dtype, flowrt_dtype::GgmlType::Mxfp4);
    assert_eq!(x.up[3].dtype, flowrt_dtype::GgmlType::Mxfp4);
    assert_eq!(x.down[0].dtype, flowrt_dtype::GgmlType::Mxfp4);
    assert_eq!(
        m.model.layers[0].wq.as_ref().unwrap().dtype,
        flowrt_dtype::GgmlType::F32
    );
    for (batch, kernels) in [
        (256, Kernels::detect()),
        (7, Kernels::detect()),
        (256, Kernels::scalar()),
    ] {
        let mut s = Session::new(
            &m,
            &EngineOptions {
                threads: 2,
                kv: KvPrecision::F32,
                max_batch: batch,
                ..EngineOptions::default()
            }
            .with_option("kernels", kernels.name()),
        )
        .unwrap();
        let r = verify(&mut s, &dir.join("ref.safetensors")).unwrap();
        golden::check(
            &format!(
                "gpt-oss MXFP4 safetensors batch={batch} kernels={}",
                kernels.name()
            ),
            &common::agreement(&r),
            &MXFP4_ST,
        );
    }
}
/// Measured (avx512vnni and scalar tables, batches of 256 and 7): top-1 1.0, mean KL 3.2e-10,
/// max KL 9.3e-10, max |logit err| 1.5e-4, against 2e-13 / 7e-13 / 3e-6 for the float fixture:
/// the Q8_0 rounding of the experts' activations. The bounds give 10x. Mutations of the repack
/// give mean KL >= 0.42 and top-1 <= 0.44: the two nibbles of a byte swapped 0.42 / 0.41,
/// gate and up read as halves instead of interleaved rows 0.46 / 0.44, the bytes copied
/// without repacking 0.49 / 0.32, the exponent off by one 0.56 / 0.32.
const MXFP4_ST: golden::Bounds = golden::Bounds {
    positions: common::FAMILY_POSITIONS,
    min_top1: 1.0,
    max_mean_kl: 3e-9,
    max_max_kl: 1e-8,
    max_abs_logit_err: 1.5e-3,
};

/// gpt-oss bad input: an expert count the fused expert tensors contradict, a top-k beyond the
/// experts, a sinks tensor of the wrong length: errors naming the field.
#[test]
fn gpt_oss_bad_config_names_the_field() {
    let dir = edited_copy("gpt-oss", |c| c["num_local_experts"] = 6.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("holds 8 experts but the expert count (num_local_experts) is 6"),
        "{e}"
    );
    let dir = edited_copy("gpt-oss", |c| c["num_experts_per_tok"] = 9.into());
    let e = load_error(dir.path());
    assert!(
        e.contains("num_experts_per_tok (top-k) = 9 exceeds num_experts = 8"),
        "{e}"
    );
    // 8 query heads of head_dim 8: the sinks hold 4.
    let dir = edited_copy("gpt-oss", |c| {
        c["num_attention_heads"] = 8.into();
        c["head_dim"] = 8.into();
    });
    let e = load_error(dir.path());
    assert!(
        e.contains("self_attn.sinks` has shape [4], expected [8] (num_attention_heads = 8)"),
        "{e}"
    );
    let dir = edited_copy("gpt-oss", |c| c["swiglu_limit"] = (-1.0).into());
    let e = load_error(dir.path());
    assert!(e.contains("swiglu_limit = -1 must be positive"), "{e}");
}
