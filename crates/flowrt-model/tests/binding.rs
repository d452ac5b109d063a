//! Binding weights: errors name the file and every missing or mis-shaped tensor.

use std::sync::Arc;

use flowrt_gguf::write::{f32_bytes, GgufBuilder};
use flowrt_gguf::{GgmlType, GgufFile};
use flowrt_model::{Model, ModelError, Plan};

const H: u64 = 8;
const FF: u64 = 16;
const VOCAB: u64 = 10;

/// A tiny llama GGUF (2 layers, 4:2 heads of 2), with `skip` tensors left out and `edit`
/// applied to the metadata.
fn tiny(skip: &[&str], heads_kv: u32, arch: &str) -> GgufFile {
    let mut b = GgufBuilder::new();
    b.kv("general.architecture", arch)
        .kv(format!("{arch}.block_count").as_str(), 2u32)
        .kv(format!("{arch}.context_length").as_str(), 64u32)
        .kv(format!("{arch}.embedding_length").as_str(), H as u32)
        .kv(format!("{arch}.feed_forward_length").as_str(), FF as u32)
        .kv(format!("{arch}.attention.head_count").as_str(), 4u32)
        .kv(format!("{arch}.attention.head_count_kv").as_str(), heads_kv)
        .kv(
            format!("{arch}.attention.layer_norm_rms_epsilon").as_str(),
            1e-5f32,
        )
        .kv(format!("{arch}.vocab_size").as_str(), VOCAB as u32);
    let mut add = |name: String, dims: &[u64]| {
        if skip.contains(&name.as_str()) {
            return;
        }
        let n: u64 = dims.iter().product();
        b.tensor(name, dims, GgmlType::F32, f32_bytes(&vec![0.5; n as usize]));
    };
    add("token_embd.weight".into(), &[H, VOCAB]);
    add("output_norm.weight".into(), &[H]);
    let kv = 2 * heads_kv as u64;
    for l in 0..2 {
        add(format!("blk.{l}.attn_norm.weight"), &[H]);
        add(format!("blk.{l}.attn_q.weight"), &[H, H]);
        add(format!("blk.{l}.attn_k.weight"), &[H, kv]);
        add(format!("blk.{l}.attn_v.weight"), &[H, kv]);
        add(format!("blk.{l}.attn_output.weight"), &[H, H]);
        add(format!("blk.{l}.ffn_norm.weight"), &[H]);
        add(format!("blk.{l}.ffn_gate.weight"), &[H, FF]);
        add(format!("blk.{l}.ffn_up.weight"), &[H, FF]);
        add(format!("blk.{l}.ffn_down.weight"), &[FF, H]);
    }
    GgufFile::from_bytes(b.to_bytes()).unwrap()
}

#[test]
fn tiny_llama_binds_with_tied_output_and_plan_has_groups_per_layer() {
    let m = Model::from_gguf(Arc::new(tiny(&[], 2, "llama"))).unwrap();
    assert!(m.tied_embeddings);
    assert_eq!(m.config.num_key_value_heads, 2);
    assert_eq!(m.config.head_dim, 2);
    let plan = Plan::new(&m.config);
    // embed + (attention, ffn) per layer + output
    assert_eq!(plan.groups.len(), 1 + 2 * 2 + 1);
    assert_eq!(plan.groups[1].kind.layer(), Some(0));
    assert_eq!(plan.groups[4].kind.layer(), Some(1));
}

#[test]
fn every_missing_tensor_is_named() {
    let e = Model::from_gguf(Arc::new(tiny(
        &[
            "blk.0.attn_k.weight",
            "blk.1.ffn_down.weight",
            "output_norm.weight",
        ],
        2,
        "llama",
    )))
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, ModelError::Tensors { ref problems, .. } if problems.len() == 3),
        "{msg}"
    );
    for name in [
        "blk.0.attn_k.weight",
        "blk.1.ffn_down.weight",
        "output_norm.weight",
    ] {
        assert!(msg.contains(name), "{msg}");
    }
}

#[test]
fn unknown_architecture_is_refused() {
    let e = Model::from_gguf(Arc::new(tiny(&[], 2, "mamba"))).unwrap_err();
    assert!(matches!(e, ModelError::UnknownArchitecture { .. }), "{e}");
    assert!(e.to_string().contains("mamba"));
}

#[test]
fn heads_not_divisible_by_kv_heads_is_a_config_error() {
    let e = Model::from_gguf(Arc::new(tiny(&[], 3, "llama"))).unwrap_err();
    assert!(matches!(e, ModelError::BadConfig { .. }), "{e}");
    assert!(e.to_string().contains("num_key_value_heads"), "{e}");
}

#[test]
fn mis_shaped_tensor_is_named_with_both_shapes() {
    let mut b = GgufBuilder::new();
    let f = tiny(&[], 2, "llama");
    for (k, v) in f.metadata() {
        b.kv(k.as_str(), v.clone());
    }
    for t in f.tensors() {
        let (dims, data) = if t.name == "blk.1.attn_q.weight" {
            (vec![H, H / 2], f32_bytes(&vec![0.0; (H * H / 2) as usize]))
        } else {
            (t.dims.clone(), f.tensor_data(t).to_vec())
        };
        b.tensor(t.name.as_str(), &dims, t.ggml_type, data);
    }
    let e = Model::from_gguf(Arc::new(GgufFile::from_bytes(b.to_bytes()).unwrap())).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("blk.1.attn_q.weight") && msg.contains("[8, 4]") && msg.contains("[8, 8]"),
        "{msg}"
    );
}

/// `tiny` relabelled `arch` with `extra` metadata and `tensors` added.
fn tiny_with(arch: &str, extra: &[(&str, f32)], tensors: &[(&str, Vec<f32>)]) -> GgufFile {
    let mut b = GgufBuilder::new();
    let f = tiny(&[], 2, arch);
    for (k, v) in f.metadata() {
        b.kv(k.as_str(), v.clone());
    }
    for (k, v) in extra {
        b.kv(format!("{arch}.{k}").as_str(), *v);
    }
    for t in f.tensors() {
        b.tensor(
            t.name.as_str(),
            &t.dims,
            t.ggml_type,
            f.tensor_data(t).to_vec(),
        );
    }
    for (name, v) in tensors {
        b.tensor(*name, &[v.len() as u64], GgmlType::F32, f32_bytes(v));
    }
    GgufFile::from_bytes(b.to_bytes()).unwrap()
}

#[test]
fn minicpm_gguf_reads_its_scalings_and_names_a_missing_one() {
    let keys = [
        ("embedding_scale", 12.0),
        ("residual_scale", 0.5),
        ("logit_scale", 4.0),
    ];
    let m = Model::from_gguf(Arc::new(tiny_with("minicpm", &keys, &[]))).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.embedding_multiplier,
            c.residual_multiplier,
            c.logit_multiplier
        ),
        (12.0, 0.5, 0.25)
    );
    let e = Model::from_gguf(Arc::new(tiny_with("minicpm", &keys[..2], &[]))).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingKey { ref key, .. } if key == "minicpm.logit_scale"),
        "{e}"
    );
}

#[test]
fn granite_gguf_reads_its_four_multipliers_and_names_a_missing_or_bad_one() {
    let keys = [
        ("embedding_scale", 6.0),
        ("attention.scale", 0.25),
        ("residual_scale", 0.45),
        ("logit_scale", 3.5),
    ];
    let m = Model::from_gguf(Arc::new(tiny_with("granite", &keys, &[]))).unwrap();
    let c = &m.config;
    assert_eq!(
        (
            c.embedding_multiplier,
            c.attn_scale,
            c.residual_multiplier,
            c.logit_multiplier
        ),
        (6.0, 0.25, 0.45, (1.0 / 3.5f64) as f32)
    );
    for i in 0..keys.len() {
        let missing: Vec<_> = keys
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, &kv)| kv)
            .collect();
        let e = Model::from_gguf(Arc::new(tiny_with("granite", &missing, &[]))).unwrap_err();
        let want = format!("granite.{}", keys[i].0);
        assert!(
            matches!(e, ModelError::MissingKey { ref key, .. } if *key == want),
            "{e}"
        );
        let mut bad = keys.to_vec();
        bad[i].1 = -1.0;
        let e = Model::from_gguf(Arc::new(tiny_with("granite", &bad, &[]))).unwrap_err();
        assert!(e.to_string().contains(&format!("`{want}`")), "{e}");
    }
}

#[test]
fn gguf_longrope_reads_its_factor_tensors_and_names_a_missing_one() {
    // head_dim 2: one divisor per set. `rope.scaling.type` is a string key.
    let with_type = |tensors: &[(&str, Vec<f32>)]| {
        let f = tiny_with("llama", &[], tensors);
        let mut b = GgufBuilder::new();
        for (k, v) in f.metadata() {
            b.kv(k.as_str(), v.clone());
        }
        b.kv("llama.rope.scaling.type", "longrope")
            .kv("llama.rope.scaling.original_context_length", 16u32);
        for t in f.tensors() {
            b.tensor(
                t.name.as_str(),
                &t.dims,
                t.ggml_type,
                f.tensor_data(t).to_vec(),
            );
        }
        Model::from_gguf(Arc::new(GgufFile::from_bytes(b.to_bytes()).unwrap()))
    };
    let m = with_type(&[
        ("rope_factors_long.weight", vec![4.0]),
        ("rope_factors_short.weight", vec![2.0]),
    ])
    .unwrap();
    // Llama switches sets by position: short before 16, long from 16 on.
    assert_eq!(
        m.config.rope.scaling,
        flowrt_model::RopeScaling::LongRope {
            short_factor: vec![2.0],
            long_factor: vec![4.0],
            original_max_position_embeddings: 16,
            attention_factor: flowrt_model::rope::longrope_attention_factor(64, 16),
        }
    );
    let e = with_type(&[("rope_factors_long.weight", vec![4.0])]).unwrap_err();
    assert!(e.to_string().contains("rope_factors_short.weight"), "{e}");
}

/// YaRN as llama.cpp's converter writes it: type, factor, original context, betas when given,
/// `yarn_attn_factor` only when config.json set one (else 0.1 ln(factor) + 1).
#[test]
fn gguf_yarn_reads_llama_cpp_keys_and_names_a_missing_one() {
    let read = |extra: &[(&str, f32)], orig: Option<u32>| {
        let f = tiny_with("qwen3", extra, &[]);
        let mut b = GgufBuilder::new();
        for (k, v) in f.metadata() {
            b.kv(k.as_str(), v.clone());
        }
        b.kv("qwen3.rope.scaling.type", "yarn");
        if let Some(o) = orig {
            b.kv("qwen3.rope.scaling.original_context_length", o);
        }
        let g = GgufFile::from_bytes(b.to_bytes()).unwrap();
        flowrt_model::ModelConfig::from_gguf(&g)
    };
    let c = read(&[("rope.scaling.factor", 4.0)], Some(16)).unwrap();
    assert_eq!(
        c.rope.scaling,
        flowrt_model::RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 16,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            attention_factor: flowrt_model::rope::yarn_attention_factor(4.0, None, None),
        }
    );
    let c = read(
        &[
            ("rope.scaling.factor", 4.0),
            ("rope.scaling.yarn_beta_fast", 16.0),
            ("rope.scaling.yarn_beta_slow", 2.0),
            ("rope.scaling.yarn_attn_factor", 1.5),
        ],
        Some(16),
    )
    .unwrap();
    assert!(matches!(
        c.rope.scaling,
        flowrt_model::RopeScaling::Yarn { beta_fast, beta_slow, attention_factor, .. }
            if (beta_fast, beta_slow, attention_factor) == (16.0, 2.0, 1.5)
    ));
    let e = read(&[("rope.scaling.factor", 4.0)], None).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingKey { ref key, .. } if key == "qwen3.rope.scaling.original_context_length"),
        "{e}"
    );
    let e = read(&[], Some(16)).unwrap_err();
    assert!(e.to_string().contains("qwen3.rope.scaling.factor"), "{e}");
    let e = read(
        &[
            ("rope.scaling.factor", 4.0),
            ("rope.scaling.yarn_log_multiplier", 0.1),
        ],
        Some(16),
    )
    .unwrap_err();
    assert!(e.to_string().contains("yarn_log_multiplier"), "{e}");
}

/// SmolLM3 GGUFs: llama.cpp's every-4th NoPE rule without a key (no NoPE layer in 2); `smollm3.no_rope_layers`
/// (HF's list) when the file has it; a list of the wrong length names the key.
#[test]
fn smollm3_gguf_reads_its_nope_layers() {
    // `tiny` has 2 layers.
    let with_list = |list: Option<Vec<u32>>| {
        let f = tiny(&[], 2, "smollm3");
        let mut b = GgufBuilder::new();
        for (k, v) in f.metadata() {
            b.kv(k.as_str(), v.clone());
        }
        if let Some(list) = list {
            b.kv(
                "smollm3.no_rope_layers",
                flowrt_gguf::Value::Array(flowrt_gguf::Array::U32(list)),
            );
        }
        for t in f.tensors() {
            b.tensor(
                t.name.as_str(),
                &t.dims,
                t.ggml_type,
                f.tensor_data(t).to_vec(),
            );
        }
        Model::from_gguf(Arc::new(GgufFile::from_bytes(b.to_bytes()).unwrap()))
    };
    let m = with_list(None).unwrap();
    assert_eq!(m.config.rope_layers, [true, true]);
    let m = with_list(Some(vec![0, 1])).unwrap();
    assert_eq!(m.config.rope_layers, [false, true]);
    let ropes = flowrt_model::Plan::new(&m.config)
        .groups
        .iter()
        .filter(|g| {
            g.ops
                .iter()
                .any(|o| matches!(o, flowrt_model::Op::Rope { .. }))
        })
        .filter_map(|g| g.kind.layer())
        .collect::<Vec<_>>();
    assert_eq!(ropes, [1], "RoPE ops only on the rotated layers");
    let e = with_list(Some(vec![1, 0, 1])).unwrap_err();
    assert!(e.to_string().contains("`smollm3.no_rope_layers`"), "{e}");
}

/// A tiny phi3 GGUF (2 layers, 4:2 heads of 2, f32): Q/K/V fused as `attn_qkv` with
/// `qkv_rows` rows and gate/up fused as `ffn_up` with `gate_up_rows` rows. Every element of a
/// fused matrix's row `r` is `r` (so a split can be checked row by row).
fn tiny_phi3(qkv_rows: u64, gate_up_rows: u64) -> GgufFile {
    let mut b = GgufBuilder::new();
    let f = tiny(&[], 2, "phi3");
    for (k, v) in f.metadata() {
        b.kv(k.as_str(), v.clone());
    }
    b.kv("phi3.rope.dimension_count", 2u32);
    let rows = |n: u64| -> Vec<f32> {
        (0..n)
            .flat_map(|r| std::iter::repeat_n(r as f32, H as usize))
            .collect()
    };
    for t in f.tensors() {
        let n = t.name.as_str();
        if n.contains("attn_q.") || n.contains("attn_k.") || n.contains("attn_v.") {
            continue;
        }
        if n.contains("ffn_gate.") {
            continue;
        }
        if n.contains("ffn_up.") {
            let l = &n[4..5];
            b.tensor(
                format!("blk.{l}.ffn_up.weight"),
                &[H, gate_up_rows],
                GgmlType::F32,
                f32_bytes(&rows(gate_up_rows)),
            );
            b.tensor(
                format!("blk.{l}.attn_qkv.weight"),
                &[H, qkv_rows],
                GgmlType::F32,
                f32_bytes(&rows(qkv_rows)),
            );
            continue;
        }
        b.tensor(n, &t.dims, t.ggml_type, f.tensor_data(t).to_vec());
    }
    GgufFile::from_bytes(b.to_bytes()).unwrap()
}

/// A tiny `qwen3moe` GGUF (2 layers, hidden 8): `expert_count` says `n_key` experts, the 3-D
/// expert tensors hold `n_tensor`, each token runs `top_k`.
fn tiny_moe(n_key: u32, n_tensor: u64, top_k: u32) -> GgufFile {
    const EFF: u64 = 4;
    let arch = "qwen3moe";
    let mut b = GgufBuilder::new();
    let f = tiny(&[], 2, arch);
    for (k, v) in f.metadata() {
        b.kv(k.as_str(), v.clone());
    }
    b.kv("qwen3moe.expert_count", n_key)
        .kv("qwen3moe.expert_used_count", top_k)
        .kv("qwen3moe.expert_feed_forward_length", EFF as u32);
    let mut add = |name: String, dims: &[u64]| {
        let n: u64 = dims.iter().product();
        b.tensor(
            name,
            dims,
            GgmlType::F32,
            f32_bytes(&vec![0.25; n as usize]),
        );
    };
    for t in f.tensors() {
        if !t.name.contains(".ffn_gate.")
            && !t.name.contains(".ffn_up.")
            && !t.name.contains(".ffn_down.")
        {
            add(t.name.clone(), &t.dims);
        }
    }
    for l in 0..2 {
        add(format!("blk.{l}.attn_q_norm.weight"), &[2]);
        add(format!("blk.{l}.attn_k_norm.weight"), &[2]);
        add(format!("blk.{l}.ffn_gate_inp.weight"), &[H, n_key as u64]);
        add(format!("blk.{l}.ffn_gate_exps.weight"), &[H, EFF, n_tensor]);
        add(format!("blk.{l}.ffn_up_exps.weight"), &[H, EFF, n_tensor]);
        add(format!("blk.{l}.ffn_down_exps.weight"), &[EFF, H, n_tensor]);
    }
    GgufFile::from_bytes(b.to_bytes()).unwrap()
}

/// Phi-3's fused Q/K/V and gate/up are split into row ranges at load: Q the first
/// heads × head_dim rows, then K, then V; the gate the first intermediate_size rows, then up.
#[test]
fn phi3_fused_tensors_split_into_row_ranges() {
    // q_dim 8, kv_dim 4: 16 rows; ff 16: 32 rows.
    let m = Model::from_gguf(Arc::new(tiny_phi3(16, 32))).unwrap();
    let first_row = |w: &flowrt_model::WeightMatrix| {
        f32::from_le_bytes(w.rows_bytes(0, 1)[..4].try_into().unwrap())
    };
    let l = &m.layers[1];
    let (wq, wk, wv) = (
        l.wq.as_ref().unwrap(),
        l.wk.as_ref().unwrap(),
        l.wv.as_ref().unwrap(),
    );
    assert_eq!((wq.rows, wk.rows, wv.rows), (8, 4, 4));
    assert_eq!(
        [first_row(wq), first_row(wk), first_row(wv)],
        [0.0, 8.0, 12.0]
    );
    let (gate, up) = (l.w_gate.as_ref().unwrap(), l.w_up.as_ref().unwrap());
    assert_eq!((gate.rows, up.rows), (16, 16));
    assert_eq!([first_row(gate), first_row(up)], [0.0, 16.0]);
    assert_eq!(up.bytes().len(), 16 * 8 * 4);
    assert_eq!(m.config.rope_dim, 2);
}

/// A fused Q/K/V (or gate/up) whose rows disagree with the config is an error naming the
/// tensor and the config fields that size it.
#[test]
fn phi3_fused_rows_disagreeing_with_the_config_name_the_fields() {
    let e = Model::from_gguf(Arc::new(tiny_phi3(12, 32))).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("blk.0.attn_qkv.weight")
            && msg.contains("has 12 rows")
            && msg.contains("(num_attention_heads + 2 × num_key_value_heads) × head_dim = 16"),
        "{msg}"
    );
    let e = Model::from_gguf(Arc::new(tiny_phi3(16, 16))).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("blk.1.ffn_up.weight") && msg.contains("2 × intermediate_size = 32"),
        "{msg}"
    );
}

/// A `partial_rotary_factor` that gives an odd (or zero) rotary width is an error naming the
/// field, wherever config.json puts it.
#[test]
fn phi3_partial_rotary_factor_giving_an_odd_width_names_the_field() {
    let config = |partial: serde_json::Value, nested: bool| {
        let mut c = serde_json::json!({
            "model_type": "phi3", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 32, "max_position_embeddings": 128,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        });
        if nested {
            c["rope_parameters"]["partial_rotary_factor"] = partial;
        } else {
            c["partial_rotary_factor"] = partial;
        }
        flowrt_model::ModelConfig::from_hf_json(std::path::Path::new("config.json"), &c)
    };
    // head_dim 16: 0.75 → 12 rotated dims.
    assert_eq!(config(0.75.into(), true).unwrap().rope_dim, 12);
    assert_eq!(config(0.5.into(), false).unwrap().rope_dim, 8);
    assert!(config(0.75.into(), true)
        .unwrap()
        .features()
        .iter()
        .any(|f| f.contains("partial RoPE 12 of 16 dims")));
    for (bad, nested) in [(0.3125, true), (0.3125, false), (0.0, true), (1.5, true)] {
        let e = config(bad.into(), nested).unwrap_err().to_string();
        assert!(e.contains("`partial_rotary_factor`"), "{bad}: {e}");
    }
}

#[test]
fn qwen3moe_gguf_binds_its_experts_and_plans_a_moe_op() {
    let m = Model::from_gguf(Arc::new(tiny_moe(6, 6, 2))).unwrap();
    let moe = m.config.moe.as_ref().expect("a mixture of experts");
    assert_eq!((moe.num_experts, moe.num_experts_per_tok), (6, 2));
    assert!(moe.router.renormalize, "llama.cpp renormalises qwen3moe");
    let x = m.layers[1].moe.as_ref().unwrap();
    assert_eq!(x.gate.len(), 6);
    assert_eq!((x.down[5].rows, x.down[5].cols), (H as usize, 4));
    assert!(m.layers[0].w_up.is_none());
    let plan = Plan::new(&m.config);
    let ffn = &plan.groups[2];
    assert!(
        ffn.ops.iter().any(|o| o.name() == "matmul_router"),
        "{ffn:?}"
    );
    assert!(ffn.ops.iter().any(|o| o.name() == "moe"), "{ffn:?}");
    let features = m.config.features().join("; ");
    assert!(
        features.contains("mixture of experts: 6 experts, 2 active (softmax, renormalised)")
            && features.contains("384 of 1.15K expert parameters active per token"),
        "{features}"
    );
}

#[test]
fn moe_top_k_beyond_the_experts_or_zero_is_named() {
    let e = Model::from_gguf(Arc::new(tiny_moe(4, 4, 5)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("num_experts_per_tok (top-k) = 5 exceeds num_experts = 4"),
        "{e}"
    );
    let e = Model::from_gguf(Arc::new(tiny_moe(4, 4, 0)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_experts_per_tok (top-k) is 0"), "{e}");
}

#[test]
fn moe_expert_count_contradicted_by_the_tensors_is_named() {
    let e = Model::from_gguf(Arc::new(tiny_moe(8, 4, 2)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.0.ffn_gate_exps.weight")
            && e.contains("holds 4 experts but the expert count (num_experts) is 8"),
        "{e}"
    );
}

/// The LFM2 fixture directory (HF, f32) and its q8_0 GGUF.
fn lfm2_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/lfm2")
}

/// The LFM2 fixture's weights under its config.json edited by `edit`.
fn lfm2_hf(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Model, ModelError> {
    let dir = lfm2_dir();
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    let cfg = flowrt_model::ModelConfig::from_hf_json(&path, &json)?;
    Model::from_hf_dir(&dir, cfg, Default::default())
}

#[test]
fn lfm2_binds_its_convolution_layers_and_plans_a_short_conv_op() {
    let m = lfm2_hf(|_| {}).unwrap();
    let sc = m.config.short_conv.as_ref().unwrap();
    assert_eq!(
        (sc.kernel, &sc.conv_layers[..]),
        (3, &[true, false, true, false][..])
    );
    // intermediate_size 150 auto-adjusted: int(2/3 · 150) = 100, up to a multiple of 32.
    assert_eq!(m.config.intermediate_size, 128);
    let conv = m.layers[0].conv.as_ref().unwrap();
    assert_eq!((conv.in_proj.rows, conv.kernel.len()), (3 * 64, 64 * 3));
    assert!(m.layers[0].wq.is_none() && m.layers[1].wq.is_some());
    let plan = Plan::new(&m.config);
    let names = |g: usize| -> Vec<&str> { plan.groups[g].ops.iter().map(|o| o.name()).collect() };
    assert_eq!(
        names(1),
        [
            "rms_norm",
            "matmul_conv_in",
            "short_conv",
            "matmul_conv_out",
            "add_residual"
        ]
    );
    assert!(names(3).contains(&"attention"), "{:?}", names(3));
    let features = m.config.features().join("; ");
    assert!(
        features.contains("hybrid: 2 short-convolution layers (kernel 3), 2 attention layers"),
        "{features}"
    );
}

/// A kernel size the convolution tensors contradict, a layer-kind list of the wrong length
/// or with an unknown kind, convolution biases the checkpoint lacks: errors naming the field.
#[test]
fn lfm2_bad_conv_kernel_or_layer_kinds_are_named() {
    let e = lfm2_hf(|c| c["conv_L_cache"] = 4.into())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.layers.0.conv.conv.weight")
            && e.contains(
                "holds a kernel of 3 positions but conv_L_cache (the convolution kernel size) is 4"
            ),
        "{e}"
    );
    let e = lfm2_hf(|c| c["conv_L_cache"] = 0.into())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("conv_L_cache (the convolution kernel size) = 0"),
        "{e}"
    );
    let e = lfm2_hf(|c| {
        c["layer_types"] = serde_json::json!(["conv", "full_attention", "conv"]);
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`layer_types` gives 3 layer kinds for 4 layers"),
        "{e}"
    );
    let e = lfm2_hf(|c| {
        c["layer_types"] = serde_json::json!(["conv", "mamba", "conv", "full_attention"]);
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`layer_types`[1] = \"mamba\" is not a layer kind"),
        "{e}"
    );
    // Kinds swapped: the attention tensors are missing where the list says attention.
    let e = lfm2_hf(|c| {
        c["layer_types"] = serde_json::json!(["full_attention", "conv", "conv", "full_attention"]);
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("missing tensor `model.layers.0.self_attn.q_proj.weight`")
            && e.contains("missing tensor `model.layers.1.conv.in_proj.weight`"),
        "{e}"
    );
    // `conv_bias: true` on a checkpoint without convolution biases.
    let e = lfm2_hf(|c| c["conv_bias"] = true.into())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "missing tensor `model.layers.0.conv.conv.bias`, which `conv_bias: true` calls for"
        ),
        "{e}"
    );
}

/// The GGUF's per-layer KV-head list (0 on convolution layers) of the wrong length, and a
/// `shortconv.l_cache` the taps contradict: errors naming the key.
#[test]
fn lfm2_gguf_bad_layer_list_or_kernel_is_named() {
    use flowrt_gguf::{Array, Value};
    let f = GgufFile::open(lfm2_dir().join("model-q8_0.gguf")).unwrap();
    let rebuilt = |edit: &dyn Fn(&str, &Value) -> Value| {
        let mut b = GgufBuilder::new();
        for (k, v) in f.metadata() {
            b.kv(k.as_str(), edit(k, v));
        }
        for t in f.tensors() {
            b.tensor(
                t.name.clone(),
                &t.dims,
                t.ggml_type,
                f.tensor_data(t).to_vec(),
            );
        }
        Model::from_gguf(Arc::new(GgufFile::from_bytes(b.to_bytes()).unwrap()))
    };
    let m = rebuilt(&|_, v| v.clone()).unwrap();
    assert_eq!(
        m.config.short_conv.as_ref().unwrap().conv_layers,
        [true, false, true, false]
    );
    let e = rebuilt(&|k, v| match k {
        "lfm2.attention.head_count_kv" => Value::Array(Array::I32(vec![0, 2, 0])),
        _ => v.clone(),
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`lfm2.attention.head_count_kv` has 3 entries for 4 layers"),
        "{e}"
    );
    let e = rebuilt(&|k, v| match k {
        "lfm2.shortconv.l_cache" => Value::U32(2),
        _ => v.clone(),
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("blk.0.shortconv.conv.weight")
            && e.contains(
                "holds a kernel of 3 positions but conv_L_cache (the convolution kernel size) is 2"
            ),
        "{e}"
    );
}

/// The gpt-oss fixture with its experts in OpenAI's MXFP4 safetensors layout
/// (scripts/make_gptoss_mxfp4_fixture.py).
fn gptoss_mxfp4_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families/gpt-oss-mxfp4")
}

/// The weights in `dir` under its config.json edited by `edit`.
fn hf_edited(
    dir: &std::path::Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<Model, ModelError> {
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    let cfg = flowrt_model::ModelConfig::from_hf_json(&path, &json)?;
    Model::from_hf_dir(dir, cfg, Default::default())
}

/// The values of MXFP4 code `c` (transformers' FP4_VALUES).
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Every expert matrix of layer 0, dequantised by the kernels' MXFP4 reference, equals the
/// checkpoint's blocks read as transformers reads them: rows are output features (gate at
/// even rows of gate_up, up at odd ones), byte k of a block holds elements 2k (low nibble) and
/// 2k + 1 (high nibble), the scale byte s means 2^(s - 127).
#[test]
fn gpt_oss_mxfp4_experts_bind_as_ggml_blocks_with_transformers_values() {
    use flowrt_kernels::Kernels;
    let dir = gptoss_mxfp4_dir();
    let m = hf_edited(&dir, |_| {}).unwrap();
    let (h, ff, n) = (32usize, 32usize, 8usize);
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| st.tensor(name).unwrap().data().to_vec();
    // Row r of expert e of (blocks, scales) with `g` blocks a row, as transformers reads it.
    let oai_row = |blocks: &[u8], scales: &[u8], rows: usize, g: usize, e: usize, r: usize| {
        let mut v = Vec::new();
        for k in 0..g {
            let at = (e * rows + r) * g + k;
            let s = 2f32.powi(scales[at] as i32 - 127);
            for &byte in &blocks[at * 16..(at + 1) * 16] {
                v.push(FP4[(byte & 15) as usize] * s);
                v.push(FP4[(byte >> 4) as usize] * s);
            }
        }
        v
    };
    let p = "model.layers.0.mlp.experts.";
    let (gub, gus) = (
        get(&format!("{p}gate_up_proj_blocks")),
        get(&format!("{p}gate_up_proj_scales")),
    );
    let (db, ds) = (
        get(&format!("{p}down_proj_blocks")),
        get(&format!("{p}down_proj_scales")),
    );
    let x = m.layers[0].moe.as_ref().unwrap();
    let k = Kernels::scalar();
    let mut checked = 0;
    for e in 0..n {
        // (matrix, rows, cols, blocks, scales, rows in the file, file row = stride · r + offset)
        for (w, rows, cols, blocks, scales, file_rows, stride, offset) in [
            (&x.gate[e], ff, h, &gub, &gus, 2 * ff, 2, 0),
            (&x.up[e], ff, h, &gub, &gus, 2 * ff, 2, 1),
            (&x.down[e], h, ff, &db, &ds, h, 1, 0),
        ] {
            assert_eq!((w.dtype, w.rows, w.cols), (GgmlType::Mxfp4, rows, cols));
            for r in 0..rows {
                let mut got = vec![0f32; cols];
                k.dequantize_row(GgmlType::Mxfp4, w.rows_bytes(r, r + 1), &mut got);
                let want = oai_row(blocks, scales, file_rows, cols / 32, e, stride * r + offset);
                assert_eq!(got, want, "{} row {r}", w.name);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, n * (2 * ff + h));
}

/// Bad MXFP4 checkpoints: experts contradicting the config's intermediate_size or expert
/// count, a hidden_size or intermediate_size that is not a multiple of 32, a quant_method
/// other than mxfp4 or none, MXFP4 on a family without fused experts: errors naming the
/// tensor or field.
#[test]
fn gpt_oss_mxfp4_bad_checkpoints_name_the_tensor_or_field() {
    let dir = gptoss_mxfp4_dir();
    let err = |edit: &dyn Fn(&mut serde_json::Value)| {
        hf_edited(&dir, |c| edit(c)).unwrap_err().to_string()
    };
    let e = err(&|c| c["intermediate_size"] = 64.into());
    assert!(
        e.contains("tensor `model.layers.0.mlp.experts.gate_up_proj_blocks` has shape [8, 64, 1, 16], expected [8, 128, 1, 16]")
            && e.contains("tensor `model.layers.0.mlp.experts.down_proj_scales` has shape [8, 32, 1], expected [8, 32, 2]"),
        "{e}"
    );
    let e = err(&|c| c["num_local_experts"] = 6.into());
    assert!(
        e.contains("tensor `model.layers.3.mlp.experts.down_proj_blocks` holds 8 experts but the expert count (num_local_experts) is 6"),
        "{e}"
    );
    let e = err(&|c| c["hidden_size"] = 48.into());
    assert!(
        e.contains("tensor `model.layers.0.mlp.experts.gate_up_proj_blocks`: hidden_size = 48 is not a multiple of 32"),
        "{e}"
    );
    let e = err(&|c| c["intermediate_size"] = 48.into());
    assert!(
        e.contains("tensor `model.layers.0.mlp.experts.down_proj_blocks`: intermediate_size = 48 is not a multiple of 32"),
        "{e}"
    );
    let e = err(&|c| c["quantization_config"]["quant_method"] = "gptq".into());
    assert!(
        e.contains("`quantization_config.quant_method` = \"gptq\"") && e.contains("not supported"),
        "{e}"
    );
    let e = err(&|c| {
        c["quantization_config"]
            .as_object_mut()
            .unwrap()
            .remove("quant_method");
    });
    assert!(
        e.contains("`quantization_config` has no `quant_method`"),
        "{e}"
    );
    // MXFP4 declared on a family whose experts are not fused (LFM2 has none).
    let e = lfm2_hf(|c| c["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`quantization_config.quant_method` = \"mxfp4\" is supported for gpt-oss's fused experts only"),
        "{e}"
    );
}

/// A copy of the MXFP4 fixture with its tensors rewritten by `edit` (name, dtype, shape,
/// bytes; `None` drops the tensor): errors for a scales tensor of another element type and for
/// a missing one name the tensor.
#[test]
fn gpt_oss_mxfp4_wrong_dtype_or_missing_scales_is_named() {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let src = gptoss_mxfp4_dir();
    let tmp = std::env::temp_dir().join(format!("flowrt-mxfp4-binding-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(src.join("config.json"), tmp.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out = Vec::new();
    for (name, v) in st.tensors() {
        if name == "model.layers.1.mlp.experts.down_proj_scales" {
            continue;
        }
        let dtype = if name == "model.layers.0.mlp.experts.gate_up_proj_scales" {
            Dtype::I8
        } else {
            v.dtype()
        };
        out.push((
            name,
            TensorView::new(dtype, v.shape().to_vec(), v.data()).unwrap(),
        ));
    }
    safetensors::serialize_to_file(out, None, &tmp.join("model.safetensors")).unwrap();
    let e = hf_edited(&tmp, |_| {}).unwrap_err().to_string();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(
        e.contains("tensor `model.layers.0.mlp.experts.gate_up_proj_scales` has element type I8; MXFP4 blocks and scales are U8")
            && e.contains("missing tensor `model.layers.1.mlp.experts.down_proj_scales` (MXFP4 experts)"),
        "{e}"
    );
}

/// `quantization_config.modules_to_not_convert` decides which experts are MXFP4: a checkpoint
/// whose layer 0 experts are stored in f32 (the float fixture's) and the rest in MXFP4 loads
/// when the list names `model.layers.0.mlp.experts` (layer 0 then f32 with the float
/// fixture's values, layer 1 MXFP4), and is refused naming the tensor when it does not; the
/// MXFP4 fixture with its experts listed is refused naming the blocks tensor and the pattern;
/// a list that is not one of strings is refused naming the field.
#[test]
fn gpt_oss_mxfp4_modules_to_not_convert_decides_which_experts_are_mxfp4() {
    use safetensors::tensor::TensorView;
    let src = gptoss_mxfp4_dir();
    let float_dir = src.join("../gpt-oss");
    let tmp = std::env::temp_dir().join(format!("flowrt-mxfp4-keep-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(src.join("config.json"), tmp.join("config.json")).unwrap();
    let qbytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let fbytes = std::fs::read(float_dir.join("model.safetensors")).unwrap();
    let q = safetensors::SafeTensors::deserialize(&qbytes).unwrap();
    let f = safetensors::SafeTensors::deserialize(&fbytes).unwrap();
    let p0 = "model.layers.0.mlp.experts.";
    let mut out: Vec<(String, TensorView)> = q
        .tensors()
        .into_iter()
        .filter(|(n, _)| !(n.starts_with(p0) && (n.ends_with("_blocks") || n.ends_with("_scales"))))
        .collect();
    for n in ["gate_up_proj", "down_proj"] {
        let name = format!("{p0}{n}");
        out.push((name.clone(), f.tensor(&name).unwrap()));
    }
    safetensors::serialize_to_file(out, None, &tmp.join("model.safetensors")).unwrap();
    fn keep(extra: &'static [&'static str]) -> impl FnOnce(&mut serde_json::Value) {
        move |c: &mut serde_json::Value| {
            let l = c["quantization_config"]["modules_to_not_convert"]
                .as_array_mut()
                .unwrap();
            l.extend(extra.iter().map(|&p| serde_json::Value::from(p)));
        }
    }
    let mixed = hf_edited(&tmp, keep(&["model.layers.0.mlp.experts"]));
    let unlisted = hf_edited(&tmp, keep(&[]));
    std::fs::remove_dir_all(&tmp).unwrap();
    let m = mixed.unwrap();
    let want = hf_edited(&float_dir, |_| {}).unwrap();
    let (x0, w0) = (
        m.layers[0].moe.as_ref().unwrap(),
        want.layers[0].moe.as_ref().unwrap(),
    );
    for e in 0..8 {
        for (got, want) in [(&x0.gate[e], &w0.gate[e]), (&x0.down[e], &w0.down[e])] {
            assert_eq!(got.dtype, GgmlType::F32, "{}", got.name);
            assert!(got.bytes() == want.bytes(), "{}", got.name);
        }
    }
    assert_eq!(
        m.layers[1].moe.as_ref().unwrap().up[2].dtype,
        GgmlType::Mxfp4
    );
    let e = unlisted.unwrap_err().to_string();
    assert!(
        e.contains("tensor `model.layers.0.mlp.experts.gate_up_proj` is stored unquantised, but `quantization_config` says mxfp4 and its `modules_to_not_convert` does not list module `model.layers.0.mlp.experts`"),
        "{e}"
    );
    let e = hf_edited(&src, keep(&["model.layers.*.mlp"]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tensor `model.layers.2.mlp.experts.gate_up_proj_blocks` is MXFP4, but `quantization_config.modules_to_not_convert` lists `model.layers.*.mlp`, so module `model.layers.2.mlp.experts` must be stored unquantised"),
        "{e}"
    );
    let e = hf_edited(&src, |c| {
        c["quantization_config"]["modules_to_not_convert"] = "lm_head".into()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`quantization_config.modules_to_not_convert` = \"lm_head\" is not a list"),
        "{e}"
    );
}

/// A tensor's (dims, bytes) from its name, dims and bytes; `None` leaves it out.
type TensorEdit = dyn Fn(&str, Vec<u64>, Vec<u8>) -> Option<(Vec<u64>, Vec<u8>)>;

/// The LFM2-MoE fixture's q8_0 GGUF rebuilt with `edit` applied to its metadata and
/// `tensor` to each tensor (name, dims, bytes; `None` leaves it out).
fn lfm2_moe_gguf_rebuilt(
    edit: &dyn Fn(&str, &flowrt_gguf::Value) -> Option<flowrt_gguf::Value>,
    tensor: &TensorEdit,
) -> Result<Model, ModelError> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families/lfm2-moe");
    let f = GgufFile::open(dir.join("model-q8_0.gguf")).unwrap();
    let mut b = GgufBuilder::new();
    for (k, v) in f.metadata() {
        if let Some(v) = edit(k, v) {
            b.kv(k.as_str(), v);
        }
    }
    for t in f.tensors() {
        if let Some((dims, data)) = tensor(&t.name, t.dims.clone(), f.tensor_data(t).to_vec()) {
            b.tensor(t.name.clone(), &dims, t.ggml_type, data);
        }
    }
    Model::from_gguf(Arc::new(GgufFile::from_bytes(b.to_bytes()).unwrap()))
}

/// llama.cpp's `lfm2moe` keys: leading dense layers, the sigmoid gating function, the
/// selection bias `exp_probs_b`; a file they contradict is refused naming the key or tensor.
#[test]
fn lfm2moe_gguf_reads_its_router_keys_and_names_bad_ones() {
    use flowrt_gguf::Value;
    let same = |_: &str, v: &Value| Some(v.clone());
    let keep = |_: &str, d: Vec<u64>, b: Vec<u8>| Some((d, b));
    let m = lfm2_moe_gguf_rebuilt(&same, &keep).unwrap();
    let moe = m.config.moe.as_ref().unwrap();
    assert_eq!(moe.sparse_layers, [false, true, true, true]);
    assert_eq!(moe.router.scoring, flowrt_model::RouterScoring::Sigmoid);
    assert_eq!(moe.router.scale, 1.7);
    assert!(moe.router.selection_bias);
    let plan = Plan::new(&m.config);
    assert!(plan.groups.iter().any(|g| g
        .ops
        .iter()
        .any(|o| matches!(o, flowrt_model::Op::Moe { router, .. } if router.selection_bias))));

    let e = lfm2_moe_gguf_rebuilt(
        &|k, v| match k {
            "lfm2moe.expert_gating_func" => Some(Value::U32(1)),
            _ => Some(v.clone()),
        },
        &keep,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`lfm2moe.expert_gating_func` = 1") && e.contains("sigmoid"),
        "{e}"
    );
    let e = lfm2_moe_gguf_rebuilt(
        &|k, v| match k {
            "lfm2moe.leading_dense_block_count" => Some(Value::U32(5)),
            _ => Some(v.clone()),
        },
        &keep,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`lfm2moe.leading_dense_block_count` = 5 exceeds `lfm2moe.block_count` = 4"),
        "{e}"
    );
    let e = lfm2_moe_gguf_rebuilt(
        &|k, v| match k {
            "lfm2moe.expert_weights_scale" => Some(Value::F32(-1.0)),
            _ => Some(v.clone()),
        },
        &keep,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`lfm2moe.expert_weights_scale` = -1"), "{e}");
    // A selection bias of 6 values for 8 experts.
    let e = lfm2_moe_gguf_rebuilt(&same, &|n, d, b| {
        Some(if n == "blk.2.exp_probs_b.bias" {
            (vec![6], b[..24].to_vec())
        } else {
            (d, b)
        })
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("tensor `blk.2.exp_probs_b.bias` has shape [6], expected [8] (num_experts = 8)"),
        "{e}"
    );
    // The first sparse layer has a selection bias, a later one none.
    let e = lfm2_moe_gguf_rebuilt(&same, &|n, d, b| {
        (n != "blk.3.exp_probs_b.bias").then_some((d, b))
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("missing tensor `blk.3.exp_probs_b.bias`, which the router's selection bias (`use_expert_bias`) calls for"),
        "{e}"
    );
    // None at all: experts chosen by score alone (what the file says).
    let m = lfm2_moe_gguf_rebuilt(&same, &|n, d, b| {
        (!n.ends_with("exp_probs_b.bias")).then_some((d, b))
    })
    .unwrap();
    assert!(!m.config.moe.unwrap().router.selection_bias);
}
