//! Bad cases on the Vulkan backend are clear errors, never a panic or a silent substitute.

use std::path::PathBuf;
use std::sync::Arc;

use flowrt_dispatch::{BackendSettings, KvPrecision};
use flowrt_model::Model;
use flowrt_testkit::coverage;
use flowrt_vulkan::{VulkanBackend, VulkanError};

fn tiny() -> Arc<Model> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/llama-tied");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cfg = flowrt_model::ModelConfig::from_hf_json(&dir.join("config.json"), &json).unwrap();
    Arc::new(Model::from_hf_dir(&dir, cfg, Default::default()).unwrap())
}

#[test]
fn bad_settings_and_sizes_are_named() {
    if let Some(why) = flowrt_vulkan::unavailable() {
        coverage::not_run("vulkan errors", "bad settings and sizes", &why);
        return;
    }
    let m = tiny();
    let base = BackendSettings {
        n_ctx: 64,
        n_seq: 1,
        max_batch: 8,
        kv: KvPrecision::F32,
        ..BackendSettings::default()
    };
    // A KV cache one binding cannot hold: the error says what and how big.
    let e = VulkanBackend::new(
        m.clone(),
        &BackendSettings {
            n_seq: 1 << 20,
            ..base.clone()
        },
    )
    .err()
    .expect("a cache of 2^20 sequences cannot fit");
    assert!(matches!(e, VulkanError::OutOfMemory { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("KV cache") && msg.contains("bytes"), "{msg}");
    // A device index beyond the list.
    let e = VulkanBackend::new(
        m.clone(),
        &BackendSettings {
            device: Some(99),
            ..base.clone()
        },
    )
    .err()
    .expect("device 99 does not exist");
    assert!(
        matches!(e, VulkanError::BadDeviceIndex { index: 99, .. }),
        "{e}"
    );
    // A backend option it does not take.
    let e = VulkanBackend::new(
        m,
        &BackendSettings {
            options: vec![("kernels".into(), "avx2".into())],
            ..base
        },
    )
    .err()
    .expect("the vulkan backend takes no options");
    assert!(e.to_string().contains("`kernels`"), "{e}");
    coverage::ran("vulkan errors", "bad settings and sizes");
}

fn load_hf(name: &str) -> Arc<Model> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families")
        .join(name);
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cfg = flowrt_model::ModelConfig::from_hf_json(&dir.join("config.json"), &json).unwrap();
    Arc::new(Model::from_hf_dir(&dir, cfg, Default::default()).unwrap())
}

/// A family needing kernels the backend lacks (BERT: LayerNorm, bidirectional attention,
/// ...) is refused at load, before any device is opened, by a typed error naming the family
/// and what it lacks (no panic, no substitute).
#[test]
fn families_without_kernels_are_refused_by_name() {
    let e = VulkanBackend::new(load_hf("../embed/tiny-bert"), &BackendSettings::default())
        .err()
        .expect("BERT is refused");
    let VulkanError::Family { family, missing } = &e else {
        panic!("{e}");
    };
    assert_eq!(family, "bert");
    for m in ["LayerNorm", "bidirectional attention"] {
        assert!(missing.contains(&m), "{e}");
    }
    assert!(e.to_string().contains("`bert`"), "{e}");
}

/// A hybrid model with short convolution layers (LFM2) is refused at load by a typed error
/// that names them (no panic).
#[test]
fn short_convolution_is_refused_by_name() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/lfm2");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cfg = flowrt_model::ModelConfig::from_hf_json(&dir.join("config.json"), &json).unwrap();
    let m = Arc::new(Model::from_hf_dir(&dir, cfg, Default::default()).unwrap());
    let e = VulkanBackend::new(m, &BackendSettings::default())
        .err()
        .expect("short convolution layers are refused");
    assert!(
        matches!(e, VulkanError::ShortConvolution { layers: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("2 short convolution layers"), "{e}");
}

/// Routers the routing kernel does not implement (sigmoid scores, a selection bias, scaled
/// weights: LFM2-MoE's) are refused at load by name, before any device is opened. Made from
/// the Qwen3-MoE fixture with its router changed (LFM2-MoE itself is refused earlier, for its
/// convolution layers).
#[test]
fn routers_without_kernels_are_refused_by_name() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/qwen3-moe");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cfg = flowrt_model::ModelConfig::from_hf_json(&dir.join("config.json"), &json).unwrap();
    let mut m = Model::from_hf_dir(&dir, cfg, Default::default()).unwrap();
    let r = &mut m.config.moe.as_mut().expect("experts").router;
    r.scoring = flowrt_model::RouterScoring::Sigmoid;
    r.selection_bias = true;
    r.scale = 1.7;
    let e = VulkanBackend::new(Arc::new(m), &BackendSettings::default())
        .err()
        .expect("a sigmoid router is refused");
    let VulkanError::Family { family, missing } = &e else {
        panic!("{e}");
    };
    assert_eq!(family, "qwen3moe");
    for want in [
        "sigmoid expert routers",
        "expert selection biases",
        "scaled expert routing weights",
    ] {
        assert!(missing.contains(&want), "{e}");
    }
}
