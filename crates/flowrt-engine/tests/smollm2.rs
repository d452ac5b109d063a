//! End-to-end checks of the engine on the real default model.

mod common;

use flowrt_engine::{
    generate, EngineError, EngineOptions, GenerateOptions, KvPrecision, LoadedModel, Session,
};
use flowrt_sample::SamplerConfig;
use flowrt_testkit::golden::{self, Bounds};

fn load() -> LoadedModel {
    LoadedModel::load(&common::smollm2()).expect("loading SmolLM2")
}

fn opts(max_batch: usize, kv: KvPrecision) -> EngineOptions {
    EngineOptions {
        threads: 2,
        n_ctx: Some(512),
        kv,
        max_batch,
        ..EngineOptions::default()
    }
}

/// The committed reference: 212 positions over the fixture's prompts.
const POSITIONS: usize = 212;

/// The default path (Q16 activations, f16 KV cache). Measured: top-1 100 %, mean KL 5.20e-6,
/// max KL 3.49e-5, max |logit err| 0.044 (the avx2 and avx512vnni tables give the same
/// figures; scalar 5.19e-6 / 3.52e-5 / 0.037). An RMSNorm epsilon x10 gives mean KL 3.6e-5.
const Q16_F16_KV: Bounds = Bounds {
    positions: POSITIONS,
    min_top1: 1.0,
    max_mean_kl: 1e-5,
    max_max_kl: 1e-4,
    max_abs_logit_err: 0.1,
};

/// Q16 activations, f32 KV cache. Measured: 100 %, 4.64e-6, 3.66e-5, 0.015.
const Q16_F32_KV: Bounds = Bounds {
    max_abs_logit_err: 0.04,
    ..Q16_F16_KV
};

/// ggml's 8-bit activations (`--act-quant q8`), f16 KV: coarser by design. Measured: top-1
/// 97.6 % (scalar table 96.2 %: near-ties fall the other way), mean KL 4.21e-3 (scalar
/// 3.94e-3), max KL 0.055, max |logit err| 2.4 (scalar 3.1).
const Q8_F16_KV: Bounds = Bounds {
    positions: POSITIONS,
    min_top1: 0.95,
    max_mean_kl: 6e-3,
    max_max_kl: 0.08,
    max_abs_logit_err: 4.0,
};

/// 8-bit activations on the repacked weights (`--act-quant q8x`), f16 KV: ggml's precision
/// class. Measured (avx2 table): top-1 98.1 %, mean KL 3.14e-3, max KL 0.041, max |logit err|
/// 2.2. The scalar table has no A8 kernels and runs Q16 there.
const Q8X_F16_KV: Bounds = Bounds {
    positions: POSITIONS,
    min_top1: 0.96,
    max_mean_kl: 5e-3,
    max_max_kl: 0.06,
    max_abs_logit_err: 3.0,
};

/// Teacher-forced agreement with HF transformers on the same (dequantised) weights, on every
/// path, each bounded at what it achieves (issue 20; issue 2 asked for top-1 >= 98.5 % and
/// mean KL <= 3e-3, which an RMSNorm epsilon x10 passed).
#[test]
fn smollm2_q4_1_matches_transformers() {
    let m = load();
    for (name, kv_type, act_quant, bounds) in [
        ("q16, f16 KV", KvPrecision::F16, "q16", Q16_F16_KV),
        ("q16, f32 KV", KvPrecision::F32, "q16", Q16_F32_KV),
        ("q8, f16 KV", KvPrecision::F16, "q8", Q8_F16_KV),
        ("q8x, f16 KV", KvPrecision::F16, "q8x", Q8X_F16_KV),
    ] {
        let mut s = Session::new(
            &m,
            &EngineOptions {
                n_ctx: None,
                ..opts(256, kv_type)
            }
            .with_option("act-quant", act_quant),
        )
        .unwrap();
        let info = s.backend_info();
        if act_quant == "q8x" && cfg!(target_arch = "x86_64") && info.kernels != "scalar" {
            assert_eq!(
                info.matmul_prefill,
                format!("{}-x8-a8", info.kernels),
                "{name}: the A8 path runs"
            );
        }
        let r = flowrt_engine::verify(&mut s, &common::fixture("ref/smollm2-q4_1.safetensors"))
            .unwrap();
        assert!(r.prompts.len() >= 4);
        golden::check(
            &format!("smollm2 {name} ({})", s.backend_info().kernels),
            &common::agreement(&r),
            &bounds,
        );
    }
}

fn last_logits(m: &LoadedModel, o: &EngineOptions, tokens: &[u32]) -> Vec<f32> {
    let mut s = Session::new(m, o).unwrap();
    s.feed(tokens).unwrap().to_vec()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Prefill in batches must give the same result as one batch and as token-by-token decode, up
/// to float rounding: the Q16 matmul tiles for 1, 4 and 8 tokens sum in different orders, and
/// the differences grow through 30 layers to a few thousandths of these ±30 logits.
const BATCHING_TOL: f32 = 2e-2;

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

#[test]
fn batched_prefill_equals_token_by_token() {
    let m = load();
    let tokens = m
        .tokenizer
        .encode(
            "Batched prefill must equal decoding one token at a time, whatever the batch size.",
            false,
            false,
        )
        .unwrap();
    let whole = last_logits(&m, &opts(256, KvPrecision::F16), &tokens);
    for b in [1, 3, 7] {
        let chunked = last_logits(&m, &opts(b, KvPrecision::F16), &tokens);
        let d = max_diff(&whole, &chunked);
        assert!(d < BATCHING_TOL, "batch {b}: max logit difference {d}");
        assert_eq!(argmax(&whole), argmax(&chunked), "batch {b}");
    }
}

/// The x8 repacked weights (the default) and the file's row layout give the same integer
/// block sums; only the float summation order differs.
#[test]
fn repacked_weights_agree_with_the_row_layout() {
    let m = load();
    // The repacking really happens (and is really skipped): the backend says how much it packed.
    for (repack, packed) in [(true, true), (false, false)] {
        let o = EngineOptions {
            n_ctx: Some(64),
            ..opts(8, KvPrecision::F16)
        };
        let s = Session::new(&m, &o.with_option("repack", repack)).unwrap();
        let bytes = s.backend_info().prepared_weight_bytes;
        assert_eq!(bytes > 0, packed, "repack {repack}: {bytes} bytes prepared");
    }
    let tokens = m
        .tokenizer
        .encode("Repacked weights must not change the answer.", false, false)
        .unwrap();
    let packed = last_logits(&m, &opts(256, KvPrecision::F16), &tokens);
    let rows = last_logits(
        &m,
        &opts(256, KvPrecision::F16).with_option("repack", false),
        &tokens,
    );
    let d = max_diff(&packed, &rows);
    assert!(d < BATCHING_TOL, "max logit difference {d}");
    assert_eq!(argmax(&packed), argmax(&rows));
}

#[test]
fn f32_kv_cache_agrees_with_f16() {
    let m = load();
    let tokens = m
        .tokenizer
        .encode("The KV cache type changes little.", false, false)
        .unwrap();
    let a = last_logits(&m, &opts(256, KvPrecision::F16), &tokens);
    let b = last_logits(&m, &opts(256, KvPrecision::F32), &tokens);
    let d = max_diff(&a, &b);
    assert!(
        d > 0.0 && d < 0.1,
        "f16 vs f32 cache: max logit difference {d}"
    );
}

#[test]
fn prompt_over_the_context_is_a_clear_error() {
    let m = load();
    let mut s = Session::new(
        &m,
        &EngineOptions {
            n_ctx: Some(8),
            ..opts(256, KvPrecision::F16)
        },
    )
    .unwrap();
    let tokens: Vec<u32> = (100..120).collect();
    let e = s.feed(&tokens).unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::PromptTooLong {
                prompt_tokens: 20,
                n_ctx: 8,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("20 tokens"), "{e}");
    let gen = GenerateOptions {
        max_tokens: 4,
        sampler: SamplerConfig::default(),
        stop: vec![],
        ignore_eos: false,
        constraint: None,
    };
    let e = generate(&mut s, &m.tokenizer, &tokens[..8], &gen, &mut |_| true).unwrap_err();
    assert!(matches!(e, EngineError::PromptTooLong { .. }), "{e}");
}

#[test]
fn context_length_beyond_the_model_is_refused() {
    let m = load();
    let e = Session::new(
        &m,
        &EngineOptions {
            n_ctx: Some(1 << 20),
            ..opts(256, KvPrecision::F16)
        },
    )
    .err()
    .expect("a context beyond the model's must be refused");
    assert!(e.to_string().contains("8192"), "{e}");
}

#[test]
fn token_outside_the_vocabulary_is_an_error() {
    let m = load();
    let mut s = Session::new(&m, &opts(256, KvPrecision::F16)).unwrap();
    let e = s.feed(&[1, 2, 49152]).unwrap_err();
    assert!(e.to_string().contains("49152"), "{e}");
}

fn run_generate(
    m: &LoadedModel,
    prompt: &str,
    sampler: SamplerConfig,
    stop: Vec<String>,
) -> (String, flowrt_engine::GenerationStats) {
    let mut s = Session::new(m, &opts(256, KvPrecision::F16)).unwrap();
    let tokens = m.tokenizer.encode(prompt, false, false).unwrap();
    let mut text = String::new();
    let gen = GenerateOptions {
        max_tokens: 24,
        sampler,
        stop,
        ignore_eos: false,
        constraint: None,
    };
    let stats = generate(&mut s, &m.tokenizer, &tokens, &gen, &mut |t| {
        text.push_str(t);
        true
    })
    .unwrap();
    (text, stats)
}

#[test]
fn greedy_says_paris_and_seeds_repeat() {
    let m = load();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let (text, _) = run_generate(&m, "The capital of France is", greedy, vec![]);
    assert!(text.contains("Paris"), "{text:?}");

    let sampled = |seed| SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplerConfig::default()
    };
    let (a, sa) = run_generate(&m, "Once upon a time", sampled(7), vec![]);
    let (b, _) = run_generate(&m, "Once upon a time", sampled(7), vec![]);
    let (c, _) = run_generate(&m, "Once upon a time", sampled(8), vec![]);
    assert_eq!(a, b, "same seed, same output");
    assert_eq!(sa.seed, 7);
    assert_ne!(a, c, "different seeds should differ on 24 sampled tokens");
}

#[test]
fn stop_string_ends_generation_before_it() {
    let m = load();
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let (full, _) = run_generate(&m, "The capital of France is", greedy.clone(), vec![]);
    let stop = "Paris".to_string();
    let (cut, stats) = run_generate(&m, "The capital of France is", greedy, vec![stop.clone()]);
    let at = full.find(&stop).expect("greedy output mentions Paris");
    assert_eq!(cut, full[..at]);
    assert_eq!(stats.finish, flowrt_engine::FinishReason::Stop);
}

/// A multi-turn chat re-renders the whole conversation; the session must reuse the cached
/// prefix and give the same logits as a fresh session.
#[test]
fn prefix_reuse_equals_fresh_prefill() {
    let m = load();
    let a = m
        .tokenizer
        .encode("First turn of a conversation.", false, false)
        .unwrap();
    let b = m
        .tokenizer
        .encode(
            "First turn of a conversation. And the second one.",
            false,
            false,
        )
        .unwrap();
    let o = opts(256, KvPrecision::F16);
    let mut s = Session::new(&m, &o).unwrap();
    s.feed(&a).unwrap();
    let common = s.common_prefix(&b);
    assert!(common > 0);
    let reused = s.sync(&b).unwrap().to_vec();
    let fresh = last_logits(&m, &o, &b);
    assert!(max_diff(&reused, &fresh) < BATCHING_TOL);
    assert_eq!(argmax(&reused), argmax(&fresh));
}
