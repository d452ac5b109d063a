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

fn load_fixture(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families")
        .join(name);
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cfg = flowrt_model::ModelConfig::from_hf_json(&dir.join("config.json"), &json).unwrap();
    Model::from_hf_dir(&dir, cfg, Default::default()).unwrap()
}

/// A short convolution layer whose taps or bias do not have the sizes the config gives is
/// refused at load by a typed error naming the layer and the sizes, before any device is
/// opened (no panic, no out-of-bounds read on the device).
#[test]
fn short_convolution_with_wrong_sizes_is_refused_by_name() {
    let mut m = load_fixture("lfm2-conv-bias");
    let l = (0..m.layers.len())
        .find(|&l| m.layers[l].conv.is_some())
        .expect("a convolution layer");
    m.layers[l].conv.as_mut().unwrap().kernel.pop();
    let e = VulkanBackend::new(Arc::new(m), &BackendSettings::default())
        .err()
        .expect("short taps are refused");
    assert!(matches!(e, VulkanError::Unsupported(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("layer {l}'s convolution taps")),
        "{msg}"
    );

    let mut m = load_fixture("lfm2-conv-bias");
    m.layers[l]
        .conv
        .as_mut()
        .unwrap()
        .kernel_bias
        .as_mut()
        .unwrap()
        .push(0.0);
    let e = VulkanBackend::new(Arc::new(m), &BackendSettings::default())
        .err()
        .expect("a long bias is refused");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("layer {l}'s convolution bias")),
        "{msg}"
    );
}

/// A router that asks for a selection bias (LFM2-MoE's `exp_probs_b`) in a layer that has none
/// is refused at load by a typed error naming the layer, before any device is opened. Made
/// from the Qwen3-MoE fixture with its router changed to LFM2-MoE's kind.
#[test]
fn router_without_its_selection_bias_is_refused_by_name() {
    let mut m = load_fixture("qwen3-moe");
    let r = &mut m.config.moe.as_mut().expect("experts").router;
    r.scoring = flowrt_model::RouterScoring::Sigmoid;
    r.selection_bias = true;
    r.scale = 1.7;
    let e = VulkanBackend::new(Arc::new(m), &BackendSettings::default())
        .err()
        .expect("a missing selection bias is refused");
    assert!(matches!(e, VulkanError::Unsupported(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("selection bias"), "{msg}");
    assert!(msg.contains("the layer has none"), "{msg}");
}
