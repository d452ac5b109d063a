//! The Vulkan backend against HF transformers on every tiny family fixture (f32 weights), the
//! same references the CPU's golden tests use (`tests/fixtures/families`), through the
//! dispatcher at the default depth and at one layer per runlist.

use std::path::PathBuf;

use flowrt_dispatch::{BackendSettings, DispatchOptions, KvPrecision};
use flowrt_engine::{verify, EngineOptions, LoadedModel, Session, VerifyReport};
use flowrt_testkit::coverage;
use flowrt_testkit::golden::{self, Agreement, Bounds};
use flowrt_vulkan::VulkanBackend;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// The reason this machine cannot run the Vulkan tests, if it cannot.
fn no_device() -> Option<String> {
    match flowrt_vulkan::devices() {
        Ok(d) if !d.is_empty() => None,
        Ok(_) => Some("no Vulkan device".into()),
        Err(e) => Some(e.to_string()),
    }
}

fn run(case: &str, kv: KvPrecision, max_batch: usize, depth: Option<usize>) -> VerifyReport {
    let dir = fixture(&format!("families/{case}"));
    let model = LoadedModel::load(&dir).unwrap_or_else(|e| panic!("loading {case}: {e}"));
    let backend = VulkanBackend::new(
        model.model.clone(),
        &BackendSettings {
            n_ctx: model.model_ctx().min(512),
            n_seq: 1,
            max_batch,
            kv,
            ..BackendSettings::default()
        },
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    let opts = EngineOptions {
        dispatch: DispatchOptions {
            max_runlist_layers: depth,
            ..DispatchOptions::default()
        },
        ..EngineOptions::default()
    };
    let mut s = Session::with_backend(&model, &opts, Box::new(backend)).unwrap();
    verify(&mut s, &dir.join("ref.safetensors")).unwrap_or_else(|e| panic!("{case}: {e}"))
}

fn agreement(r: &VerifyReport) -> Agreement {
    Agreement {
        positions: r.positions,
        top1: r.top1_agreement,
        mean_kl: r.mean_kl,
        max_kl: r.max_kl,
        max_abs_logit_err: r.max_abs_logit_err,
    }
}

/// Every fixture compares 101 positions.
const POSITIONS: usize = 101;

/// f32 KV cache on the device: the CPU's f32 bounds (the issue asks for mean KL <= 1e-5).
/// Measured on lavapipe (worst family): mean KL 8.6e-13 (llama3-rope), max KL 4.2e-12
/// (llama3-rope), max |logit err| 7.6e-6 (llama3-rope, llama-tied).
const F32_KV: Bounds = Bounds {
    positions: POSITIONS,
    min_top1: 1.0,
    max_mean_kl: 5e-12,
    max_max_kl: 3e-11,
    max_abs_logit_err: 2.5e-5,
};

/// f16 KV cache on the device: the CPU's f16 bounds. Measured on lavapipe (worst family):
/// mean KL 2.6e-7, max KL 1.0e-6, max |logit err| 4.5e-3 (all llama-42l).
const F16_KV: Bounds = Bounds {
    positions: POSITIONS,
    min_top1: 1.0,
    max_mean_kl: 6e-7,
    max_max_kl: 3e-6,
    max_abs_logit_err: 1e-2,
};

fn check(case: &str) {
    if let Some(why) = no_device() {
        coverage::not_run("vulkan families", case, &why);
        return;
    }
    for (kv, batch, depth, bounds) in [
        (KvPrecision::F32, 256, None, F32_KV),
        (KvPrecision::F32, 7, Some(1), F32_KV),
        (KvPrecision::F16, 256, None, F16_KV),
    ] {
        let r = run(case, kv, batch, depth);
        golden::check(
            &format!("vulkan {case} kv={kv} batch={batch} depth={depth:?}"),
            &agreement(&r),
            &bounds,
        );
    }
    coverage::ran("vulkan families", case);
}

#[test]
fn llama_tied() {
    check("llama-tied");
}
#[test]
fn llama_untied() {
    check("llama-untied");
}
#[test]
fn llama_42l() {
    check("llama-42l");
}
#[test]
fn llama3_rope() {
    check("llama3-rope");
}
#[test]
fn mistral() {
    check("mistral");
}
#[test]
fn qwen2() {
    check("qwen2");
}
#[test]
fn qwen3() {
    check("qwen3");
}
#[test]
fn gemma3() {
    check("gemma3");
}
#[test]
fn minicpm() {
    check("minicpm");
}
