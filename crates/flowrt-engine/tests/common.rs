//! Shared by the engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

// Each test binary that includes this module uses some of these.
#[allow(unused_imports)]
pub use flowrt_testkit::models::{gemma3, smollm2};

/// A file under the repository's `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// A verify report as the numbers `flowrt_testkit::golden` bounds.
pub fn agreement(r: &flowrt_engine::VerifyReport) -> flowrt_testkit::golden::Agreement {
    flowrt_testkit::golden::Agreement {
        positions: r.positions,
        top1: r.top1_agreement,
        mean_kl: r.mean_kl,
        max_kl: r.max_kl,
        max_abs_logit_err: r.max_abs_logit_err,
    }
}

use flowrt_testkit::golden::Bounds;

/// Every fixture compares 101 positions (scripts/make_family_fixtures.py's prompts).
pub const FAMILY_POSITIONS: usize = 101;

/// Golden bounds of the family fixtures, for every backend (the Vulkan backend on lavapipe
/// measured within them too: f32 KV worst mean KL 8.6e-13, max KL 4.2e-12, max |logit err|
/// 7.6e-6; f16 KV 2.6e-7, 1.0e-6, 4.5e-3).
///
/// f32 weights and f32 KV cache: flowrt computes what transformers computes, up to summation
/// order. Measured (worst family, default and scalar tables alike): mean KL 8.5e-13
/// (llama3-rope), max KL 5.5e-12 (qwen2), max |logit err| 7.4e-6 (llama3-rope). The mutations
/// docs/testing.md lists move the best-hidden family by 1000x or more: RMSNorm epsilon x10
/// gives mean KL >= 9e-10 (qwen3), RoPE base x1.01 >= 8.9e-10 (qwen2), attention scale
/// x(1 + 1e-3) >= 7.7e-9 (llama-42l).
pub const FAMILY_F32_KV: Bounds = Bounds {
    positions: FAMILY_POSITIONS,
    min_top1: 1.0,
    max_mean_kl: 5e-12,
    max_max_kl: 3e-11,
    max_abs_logit_err: 2.5e-5,
};

/// f16 KV cache: keys and values rounded to f16. Measured (worst family): mean KL 2.4e-7, max
/// KL 9.6e-7, max |logit err| 4.1e-3 (all llama-42l).
pub const FAMILY_F16_KV: Bounds = Bounds {
    positions: FAMILY_POSITIONS,
    min_top1: 1.0,
    max_mean_kl: 6e-7,
    max_max_kl: 3e-6,
    max_abs_logit_err: 1e-2,
};

/// SmolLM2 loaded, for the constrained-decoding tests.
pub fn load_smollm2() -> flowrt_engine::LoadedModel {
    flowrt_engine::LoadedModel::load(&smollm2()).expect("loading SmolLM2")
}

/// The session the constrained-decoding tests generate in: 2 threads, 512 positions, f16 KV.
pub fn session_512(m: &flowrt_engine::LoadedModel) -> flowrt_engine::Session {
    flowrt_engine::Session::new(
        m,
        &flowrt_engine::EngineOptions {
            threads: 2,
            n_ctx: Some(512),
            kv: flowrt_engine::KvPrecision::F16,
            max_batch: 64,
            ..flowrt_engine::EngineOptions::default()
        },
    )
    .unwrap()
}

/// Pure sampling: temperature 1.0, no top-k/top-p/min-p, so only a constraint's mask keeps
/// the output in shape.
pub fn hot(seed: u64) -> flowrt_sample::SamplerConfig {
    flowrt_sample::SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..flowrt_sample::SamplerConfig::default()
    }
}

/// A copy of `families/llama-untied` whose tensor `name` is multiplied by `factor`.
pub fn perturbed_copy(name: &str, factor: f32) -> tempfile::TempDir {
    let src = fixture("families/llama-untied");
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut found = false;
    let tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let mut data = t.data().to_vec();
            if n == name {
                found = true;
                assert_eq!(t.dtype(), safetensors::Dtype::F32);
                for c in data.chunks_exact_mut(4) {
                    let v = f32::from_le_bytes(c.try_into().unwrap()) * factor;
                    c.copy_from_slice(&v.to_le_bytes());
                }
            }
            (n, t.dtype(), t.shape().to_vec(), data)
        })
        .collect();
    assert!(found, "no tensor {name}");
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, data)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), data).unwrap(),
            )
        })
        .collect();
    let out = safetensors::serialize(views.iter().map(|(n, v)| (n.as_str(), v)), None).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), out).unwrap();
    dir
}
