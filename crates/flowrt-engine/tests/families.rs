//! Golden tests of every architecture family against HF transformers: tiny random-weight
//! checkpoints (f32) made by `scripts/make_family_fixtures.py`, each with the reference's
//! logits for a few prompts. flowrt loads the HF directory itself (config.json, safetensors,
//! tokenizer files) and must agree at every position.

mod common;

use flowrt_cpu::KvType;
use flowrt_engine::{verify, EngineOptions, LoadedModel, Session, VerifyReport};

fn run(case: &str, kv_type: KvType, max_batch: usize) -> VerifyReport {
    let dir = common::fixture(&format!("families/{case}"));
    let model = LoadedModel::load(&dir).unwrap_or_else(|e| panic!("loading {case}: {e}"));
    let mut s = Session::new(
        &model,
        &EngineOptions {
            threads: 2,
            kv_type,
            max_batch,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    verify(&mut s, &dir.join("ref.safetensors")).unwrap_or_else(|e| panic!("{case}: {e}"))
}

/// The acceptance bar for f32 weights: every top-1 and mean KL <= 1e-5.
fn check(case: &str) {
    for (kv, batch) in [(KvType::F32, 256), (KvType::F32, 7), (KvType::F16, 256)] {
        let r = run(case, kv, batch);
        eprintln!(
            "{case} kv={kv:?} batch={batch}: {} positions, top-1 {:.4}, mean KL {:.3e}, max KL {:.3e}, max |err| {:.3e}",
            r.positions, r.top1_agreement, r.mean_kl, r.max_kl, r.max_abs_logit_err
        );
        assert_eq!(
            r.top1_agreement, 1.0,
            "{case} kv={kv:?}: top-1 {}",
            r.top1_agreement
        );
        assert!(r.mean_kl <= 1e-5, "{case} kv={kv:?}: mean KL {}", r.mean_kl);
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
fn mistral_sliding_window() {
    check("mistral");
}

#[test]
fn minicpm_scalings_and_longrope() {
    check("minicpm");
}
