//! The real models on the Vulkan backend (`--backend vulkan`), through the same engine, factory
//! and dispatcher as the CPU: agreement with HF transformers on the committed references,
//! greedy text, and continuous batching. On a machine without a Vulkan device each test says
//! NOT RUN and why (scripts/test installs Mesa's software driver, lavapipe, where it can).

mod common;

use flowrt_dispatch::DispatchOptions;
use flowrt_engine::{
    generate, verify, BackendKind, BatchSession, EngineOptions, GenerateOptions, KvPrecision,
    LoadOptions, LoadedModel, Session,
};
use flowrt_sample::SamplerConfig;
use flowrt_testkit::coverage;
use flowrt_testkit::golden::{self, Bounds};

const SUITE: &str = "vulkan models";

/// Whether this machine cannot run the Vulkan tests (then says NOT RUN and why).
fn no_device(what: &str) -> bool {
    match flowrt_vulkan::unavailable() {
        Some(why) => {
            coverage::not_run(SUITE, what, &why);
            true
        }
        None => false,
    }
}

fn opts(kv: KvPrecision, max_batch: usize, n_ctx: Option<usize>) -> EngineOptions {
    EngineOptions {
        backend: BackendKind::Vulkan,
        kv,
        max_batch,
        n_ctx,
        ..EngineOptions::default()
    }
}

/// Every tiny family fixture (f32 weights) against transformers, within the CPU's bounds: f32
/// KV in 256-token batches at the default depth and in 7-token batches at one layer per
/// runlist, and f16 KV.
#[test]
fn families_on_vulkan_match_transformers() {
    let cases = [
        "llama-tied",
        "llama-untied",
        "llama-42l",
        "llama3-rope",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma3",
        "gemma2",
        "minicpm",
        "granite",
        "smollm3",
        "qwen3-yarn",
        "phi3",
    ];
    if no_device("family fixtures") {
        return;
    }
    for case in cases {
        family_on_vulkan(case);
    }
    coverage::ran(
        SUITE,
        "family fixtures (f32 and f16 KV, depth 1 and default)",
    );
}

/// One tiny family fixture against transformers on the device, within the CPU's bounds: f32
/// KV in 256-token batches at the default depth and in 7-token batches at one layer per
/// runlist, and f16 KV.
fn family_on_vulkan(case: &str) {
    let dir = common::fixture(&format!("families/{case}"));
    let m = LoadedModel::load(&dir).unwrap_or_else(|e| panic!("loading {case}: {e}"));
    for (kv, batch, depth, bounds) in [
        (KvPrecision::F32, 256, None, common::FAMILY_F32_KV),
        (KvPrecision::F32, 7, Some(1), common::FAMILY_F32_KV),
        (KvPrecision::F16, 256, None, common::FAMILY_F16_KV),
    ] {
        let o = EngineOptions {
            dispatch: DispatchOptions {
                max_runlist_layers: depth,
                ..DispatchOptions::default()
            },
            ..opts(kv, batch, Some(m.model_ctx().min(512)))
        };
        let mut s = Session::new(&m, &o).unwrap();
        let r =
            verify(&mut s, &dir.join("ref.safetensors")).unwrap_or_else(|e| panic!("{case}: {e}"));
        eprintln!(
            "vulkan {case} kv={kv} batch={batch} depth={depth:?}: top-1 {:.4}, mean KL {:.3e}, max KL {:.3e}, max |err| {:.3e}",
            r.top1_agreement, r.mean_kl, r.max_kl, r.max_abs_logit_err
        );
        golden::check(
            &format!("vulkan {case} kv={kv} batch={batch} depth={depth:?}"),
            &common::agreement(&r),
            &bounds,
        );
    }
}

/// Qwen3-MoE (8 experts, top-2, softmax router renormalised; layer 1 dense) on the device
/// against transformers, within the dense families' bounds: the router matmul, the routing
/// kernel (ids and weights stay on the device), the expert matmuls that read each pair's
/// expert from them, and the weighted sum.
#[test]
fn qwen3_moe_on_vulkan_matches_transformers() {
    if no_device("qwen3-moe fixture") {
        return;
    }
    family_on_vulkan("qwen3-moe");
    coverage::ran(
        SUITE,
        "qwen3-moe fixture (f32 and f16 KV, depth 1 and default)",
    );
}

/// gpt-oss (attention sinks, sliding window 8 on alternate layers, YaRN, Q/K/V/O biases, a
/// biased top-k-softmax router, biased experts with the clamped SwiGLU) on the device against
/// transformers, within the dense families' bounds.
#[test]
fn gpt_oss_on_vulkan_matches_transformers() {
    if no_device("gpt-oss fixture") {
        return;
    }
    family_on_vulkan("gpt-oss");
    coverage::ran(
        SUITE,
        "gpt-oss fixture (f32 and f16 KV, depth 1 and default)",
    );
}

/// The gpt-oss fixture with MXFP4 experts (every other matrix q8_0, as OpenAI ships gpt-oss;
/// the GGUF the CPU's MXFP4 test reads) on the device against transformers' f32 logits,
/// within the CPU test's 4-bit bounds (top-1 >= 78 %, mean KL <= 0.03).
#[test]
fn gpt_oss_mxfp4_experts_on_vulkan_within_quantisation_bounds() {
    let what = "gpt-oss MXFP4 experts GGUF";
    if no_device(what) {
        return;
    }
    let dir = common::fixture("families/gpt-oss");
    let m = LoadedModel::load(&dir.join("model-mxfp4.gguf")).unwrap();
    let x = m.model.layers[0].moe.as_ref().expect("layer 0 is sparse");
    assert_eq!(x.gate[7].dtype, flowrt_dtype::GgmlType::Mxfp4);
    let mut s = Session::new(&m, &opts(KvPrecision::F32, 256, Some(128))).unwrap();
    let r = verify(&mut s, &dir.join("ref.safetensors")).unwrap();
    eprintln!(
        "vulkan {what}: top-1 {:.4}, mean KL {:.3e}, max |err| {:.3e}",
        r.top1_agreement, r.mean_kl, r.max_abs_logit_err
    );
    assert!(
        r.top1_agreement >= 0.78,
        "{what}: top-1 {}",
        r.top1_agreement
    );
    assert!(r.mean_kl <= 0.03, "{what}: mean KL {}", r.mean_kl);
    coverage::ran(SUITE, what);
}

/// gpt-oss batched sequences (each longer than the window) equal solo runs on the device.
#[test]
fn batched_sequences_on_vulkan_equal_solo_runs_gpt_oss() {
    let what = "gpt-oss batched sequences equal solo runs";
    if no_device(what) {
        return;
    }
    check_batched(
        what,
        &common::fixture("families/gpt-oss"),
        KvPrecision::F32,
        1e-5,
    );
}

/// The Qwen3-MoE fixture as a q8_0 GGUF (experts in q8_0, the unaligned word reader) on the
/// device against transformers' f32 logits, within the CPU test's q8_0 bounds (top-1 >= 97 %,
/// mean KL <= 1e-3; the device multiplies f32 activations, the CPU q8_0 ones).
#[test]
fn qwen3_moe_q8_0_gguf_on_vulkan_within_quantisation_bounds() {
    let what = "qwen3-moe q8_0 GGUF";
    if no_device(what) {
        return;
    }
    q8_0_gguf_on_vulkan("qwen3-moe");
    coverage::ran(SUITE, what);
}

/// The fixture's q8_0 GGUF on the device against transformers' f32 logits, within the CPU
/// tests' q8_0 bounds (top-1 >= 97 %, mean KL <= 1e-3).
fn q8_0_gguf_on_vulkan(case: &str) {
    let dir = common::fixture(&format!("families/{case}"));
    let m = LoadedModel::load(&dir.join("model-q8_0.gguf")).unwrap();
    let mut s = Session::new(&m, &opts(KvPrecision::F32, 256, Some(128))).unwrap();
    let r = verify(&mut s, &dir.join("ref.safetensors")).unwrap();
    eprintln!(
        "vulkan {case} q8_0 GGUF: top-1 {:.4}, mean KL {:.3e}, max |err| {:.3e}",
        r.top1_agreement, r.mean_kl, r.max_abs_logit_err
    );
    assert!(
        r.top1_agreement >= 0.97,
        "{case}: top-1 {}",
        r.top1_agreement
    );
    assert!(r.mean_kl <= 1e-3, "{case}: mean KL {}", r.mean_kl);
}

/// The same Qwen3-MoE prompt on the CPU and on the device: prefill (every position's logits)
/// and three decode steps agree to within f32 rounding.
#[test]
fn qwen3_moe_cpu_and_vulkan_logits_agree() {
    let what = "qwen3-moe cpu and vulkan agree";
    if no_device(what) {
        return;
    }
    let worst = cpu_vs_vulkan("families/qwen3-moe");
    eprintln!("qwen3-moe cpu vs vulkan: max |logit difference| {worst}");
    assert!(
        worst <= 1e-4,
        "cpu vs vulkan: max |logit difference| {worst}"
    );
    coverage::ran(SUITE, what);
}

/// LFM2 (short convolution layers next to attention layers), LFM2 with `conv_bias` and
/// LFM2-MoE (a sigmoid router choosing by score + selection bias, renormalised with an
/// epsilon and scaled) on the device against transformers, within the CPU's bounds: the
/// convolution cache in the K slot of convolution layers (f32 and f16), the `conv_store` and
/// `short_conv` kernels, the convolution biases and the routing kernel.
#[test]
fn lfm2_families_on_vulkan_match_transformers() {
    if no_device("lfm2 fixtures") {
        return;
    }
    for case in ["lfm2", "lfm2-conv-bias", "lfm2-moe"] {
        family_on_vulkan(case);
    }
    coverage::ran(
        SUITE,
        "lfm2, lfm2-conv-bias, lfm2-moe fixtures (f32 and f16 KV, depth 1 and default)",
    );
}

/// The LFM2 fixtures as q8_0 GGUFs (llama.cpp's `lfm2`/`lfm2moe` keys: a per-layer
/// `head_count_kv` list with 0 on convolution layers) on the device against transformers' f32
/// logits, within the CPU tests' q8_0 bounds (top-1 >= 97 %, mean KL <= 1e-3).
#[test]
fn lfm2_q8_0_ggufs_on_vulkan_within_quantisation_bounds() {
    let what = "lfm2 q8_0 GGUFs";
    if no_device(what) {
        return;
    }
    for case in ["lfm2", "lfm2-conv-bias", "lfm2-moe"] {
        q8_0_gguf_on_vulkan(case);
    }
    coverage::ran(SUITE, what);
}

/// The same LFM2 prompt on the CPU and on the device: prefill (every position's logits) and
/// three decode steps agree to within f32 rounding, on each LFM2 fixture.
#[test]
fn lfm2_cpu_and_vulkan_logits_agree() {
    let what = "lfm2 families cpu and vulkan agree";
    if no_device(what) {
        return;
    }
    for case in ["lfm2", "lfm2-conv-bias", "lfm2-moe"] {
        let worst = cpu_vs_vulkan(&format!("families/{case}"));
        eprintln!("{case} cpu vs vulkan: max |logit difference| {worst}");
        assert!(
            worst <= 1e-4,
            "{case} cpu vs vulkan: max |logit difference| {worst}"
        );
    }
    coverage::ran(SUITE, what);
}

/// The largest logit difference between the CPU and the device on a 23-token prompt and three
/// decode steps of the fixture at `path` (the top-1 tokens must agree).
fn cpu_vs_vulkan(path: &str) -> f32 {
    let m = LoadedModel::load(&common::fixture(path)).unwrap();
    let prompt: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 320).collect();
    let run = |backend: BackendKind| -> Vec<Vec<f32>> {
        let o = EngineOptions {
            backend,
            threads: 2,
            ..opts(KvPrecision::F32, 64, Some(64))
        };
        let mut s = Session::new(&m, &o).unwrap();
        let mut out = vec![s.feed(&prompt).unwrap().to_vec()];
        for t in [5u32, 77, 301] {
            out.push(s.feed(&[t]).unwrap().to_vec());
        }
        out
    };
    let (cpu, vk) = (run(BackendKind::Cpu), run(BackendKind::Vulkan));
    let mut worst = 0.0f32;
    for (c, v) in cpu.iter().zip(&vk) {
        worst = worst.max(max_diff(c, v));
        assert_eq!(argmax(c), argmax(v), "{path}");
    }
    worst
}

/// LFM2 on the device: batched sequences (each convolution reads its own sequence's cached
/// `B · x`) equal solo runs, f32 and f16 caches (the CPU's bound for it: 1e-5).
#[test]
fn batched_sequences_on_vulkan_equal_solo_runs_lfm2() {
    let what = "lfm2 batched sequences equal solo runs";
    if no_device(what) {
        return;
    }
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        check_batched(what, &common::fixture("families/lfm2"), kv, 1e-5);
    }
}

/// LFM2-MoE on the device: batched sequences equal solo runs (each row routes by its own
/// sigmoid scores and selection bias).
#[test]
fn batched_sequences_on_vulkan_equal_solo_runs_lfm2_moe() {
    let what = "lfm2-moe batched sequences equal solo runs";
    if no_device(what) {
        return;
    }
    check_batched(
        what,
        &common::fixture("families/lfm2-moe"),
        KvPrecision::F32,
        1e-5,
    );
}

/// Prefix reuse on the device for LFM2 and LFM2-MoE: a session that keeps the first 8
/// positions of an 11-token prompt and re-syncs to a new continuation gives the logits of a
/// fresh prefill of the whole new prompt (the convolution at the first new position reads the
/// kept positions before it from the cache).
#[test]
fn prefix_reuse_on_vulkan_equals_fresh_prefill_lfm2() {
    let what = "lfm2 prefix reuse equals fresh prefill";
    if no_device(what) {
        return;
    }
    for case in ["lfm2", "lfm2-conv-bias", "lfm2-moe"] {
        let m = LoadedModel::load(&common::fixture(&format!("families/{case}"))).unwrap();
        let o = opts(KvPrecision::F32, 64, Some(128));
        let a: Vec<u32> = (0..11).map(|i| (i * 17 + 3) % 300).collect();
        let mut b = a[..8].to_vec();
        b.extend((0..9).map(|i| (i * 23 + 40) % 300));
        let mut s = Session::new(&m, &o).unwrap();
        s.feed(&a).unwrap();
        assert_eq!(s.common_prefix(&b), 8);
        let reused = s.sync(&b).unwrap().to_vec();
        let mut f = Session::new(&m, &o).unwrap();
        let fresh = f.feed(&b).unwrap().to_vec();
        let d = max_diff(&reused, &fresh);
        eprintln!("vulkan {case} prefix reuse: max |logit difference| {d}");
        assert!(d <= 1e-5, "{case}: prefix reuse: max diff {d}");
        assert_eq!(argmax(&reused), argmax(&fresh), "{case}");
    }
    coverage::ran(SUITE, what);
}

/// SmolLM2-135M Q4_1 against transformers on the dequantised weights (212 positions). The
/// device computes in f32 from the quantised blocks (no activation quantisation).
#[test]
fn smollm2_q4_1_on_vulkan_matches_transformers() {
    let what = "smollm2 q4_1 verify (f16 and f32 KV)";
    if no_device(what) {
        return;
    }
    let m = LoadedModel::load(&common::smollm2()).unwrap();
    for (kv, bounds) in [
        // The acceptance: top-1 >= 99.5 %, mean KL <= 1e-4. Measured on lavapipe: top-1
        // 99.53 % (one near-tie of 212 falls the other way), mean KL 5.39e-6, max KL 3.59e-5,
        // max |logit err| 0.045 (the CPU's Q16 path: 100 %, 5.2e-6, 3.5e-5, 0.044).
        (
            KvPrecision::F16,
            Bounds {
                positions: 212,
                min_top1: 0.995,
                max_mean_kl: 1e-5,
                max_max_kl: 1e-4,
                max_abs_logit_err: 0.1,
            },
        ),
        // Measured on lavapipe: top-1 100 %, mean KL 4.56e-6, max KL 3.61e-5, max |logit err|
        // 0.015 (the CPU's Q16 path with f32 KV: 100 %, 4.6e-6, 3.7e-5, 0.015): what is left is
        // the reference's own rounding, not the cache's.
        (
            KvPrecision::F32,
            Bounds {
                positions: 212,
                min_top1: 1.0,
                max_mean_kl: 1e-5,
                max_max_kl: 1e-4,
                max_abs_logit_err: 0.04,
            },
        ),
    ] {
        let mut s = Session::new(&m, &opts(kv, 256, None)).unwrap();
        assert_eq!(s.backend_info().name, "vulkan");
        let r = verify(&mut s, &common::fixture("ref/smollm2-q4_1.safetensors")).unwrap();
        golden::check(
            &format!("vulkan smollm2 kv={kv} on {}", s.backend_info().device),
            &common::agreement(&r),
            &bounds,
        );
    }
    coverage::ran(SUITE, what);
}

/// Gemma 3 270M Q4_K_M (Q4_K, Q5_K, Q6_K, Q8_0 weights; sliding windows, local RoPE, sandwich
/// norms, GELU) against transformers' top-K logits (185 positions).
#[test]
fn gemma3_270m_on_vulkan_matches_transformers() {
    let what = "gemma3 270m q4_k_m verify";
    if no_device(what) {
        return;
    }
    let m = LoadedModel::load(&common::gemma3()).unwrap();
    let mut s = Session::new(&m, &opts(KvPrecision::F16, 256, None)).unwrap();
    let r = verify(
        &mut s,
        &common::fixture("ref/gemma3-270m-q4_k_m.topk.safetensors"),
    )
    .unwrap();
    // Measured on lavapipe: top-1 100 %, mean KL 1.35e-7, max KL 1.32e-6, max |logit err|
    // 0.017 (the CPU: 100 %, 1.6e-7, 1.3e-6, 0.026); the issue asks top-1 >= 99 %, mean KL <= 1e-4.
    golden::check(
        &format!("vulkan gemma3 270m on {}", s.backend_info().device),
        &common::agreement(&r),
        &Bounds {
            positions: 185,
            min_top1: 1.0,
            max_mean_kl: 4e-7,
            max_max_kl: 4e-6,
            max_abs_logit_err: 0.06,
        },
    );
    coverage::ran(SUITE, what);
}

#[test]
fn smollm2_on_vulkan_says_paris() {
    let what = "smollm2 greedy text";
    if no_device(what) {
        return;
    }
    let m = LoadedModel::load(&common::smollm2()).unwrap();
    let mut s = Session::new(&m, &opts(KvPrecision::F16, 256, Some(256))).unwrap();
    let prompt = m
        .tokenizer
        .encode("The capital of France is", true, false)
        .unwrap();
    let mut text = String::new();
    generate(
        &mut s,
        &m.tokenizer,
        &prompt,
        &GenerateOptions {
            max_tokens: 8,
            sampler: SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            stop: vec![],
            ignore_eos: false,
            constraint: None,
        },
        &mut |t| {
            text.push_str(t);
            true
        },
    )
    .unwrap();
    assert!(text.contains("Paris"), "{text:?}");
    coverage::ran(SUITE, what);
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

/// Three sequences of different lengths in one device cache, prefilled in one step and decoded
/// together, equal each sequence run alone within the CPU tests' bound (2e-2 on SmolLM2's
/// logits; measured on the device: see the assertion message).
#[test]
fn batched_sequences_on_vulkan_equal_solo_runs() {
    let what = "smollm2 batched sequences equal solo runs";
    if no_device(what) {
        return;
    }
    check_batched(what, &common::smollm2(), KvPrecision::F16, 2e-2);
}

/// The same for the Qwen3-MoE fixture (f32 KV): each row of a batch routes to its own experts
/// and gets exactly their outputs (the CPU's bound for it: 1e-5).
#[test]
fn batched_sequences_on_vulkan_equal_solo_runs_qwen3_moe() {
    let what = "qwen3-moe batched sequences equal solo runs";
    if no_device(what) {
        return;
    }
    check_batched(
        what,
        &common::fixture("families/qwen3-moe"),
        KvPrecision::F32,
        1e-5,
    );
}

/// [`batched_equals_solo`] on the model at `path`, within `bound`, recorded as `what`.
fn check_batched(what: &str, path: &std::path::Path, kv: KvPrecision, bound: f32) {
    let m = LoadedModel::load(path).unwrap();
    let worst = batched_equals_solo(&m, kv);
    eprintln!("vulkan {what}: max |logit difference| {worst}");
    assert!(
        worst <= bound,
        "{what}: max |logit difference| {worst} (bound {bound})"
    );
    coverage::ran(SUITE, what);
}

/// Three sequences prefilled in one step and decoded together, against each run alone: the
/// largest logit difference (the top-1 tokens must agree).
fn batched_equals_solo(m: &LoadedModel, kv: KvPrecision) -> f32 {
    let o = opts(kv, 64, Some(128));
    let prompts: Vec<Vec<u32>> = vec![
        (0..7).map(|i| (i * 13 + 5) % 300).collect(),
        (0..19).map(|i| (i * 7 + 1) % 300).collect(),
        (0..3).map(|i| (i * 31 + 2) % 300).collect(),
    ];
    let next: Vec<Vec<u32>> = (0..3)
        .map(|k| (0..3).map(|i| (k * 50 + i * 3 + 7) as u32).collect())
        .collect();
    let solo: Vec<Vec<Vec<f32>>> = (0..3)
        .map(|k| {
            let mut s = Session::new(m, &o).unwrap();
            let mut out = vec![s.feed(&prompts[k]).unwrap().to_vec()];
            for &t in &next[k] {
                out.push(s.feed(&[t]).unwrap().to_vec());
            }
            out
        })
        .collect();
    let vocab = m.model.config.vocab_size;
    let mut b = BatchSession::new(m, &o, 4).unwrap();
    let slots = [2usize, 0, 3];
    let items: Vec<(usize, &[u32])> = (0..3).map(|k| (slots[k], &prompts[k][..])).collect();
    let logits = b.step(&items).unwrap().to_vec();
    let mut worst = 0.0f32;
    for k in 0..3 {
        let got = &logits[k * vocab..(k + 1) * vocab];
        worst = worst.max(max_diff(got, &solo[k][0]));
        assert_eq!(argmax(got), argmax(&solo[k][0]));
    }
    for step in 0..3 {
        let toks: Vec<[u32; 1]> = (0..3).map(|k| [next[k][step]]).collect();
        let items: Vec<(usize, &[u32])> = (0..3).map(|k| (slots[k], &toks[k][..])).collect();
        let logits = b.step(&items).unwrap().to_vec();
        for k in 0..3 {
            let got = &logits[k * vocab..(k + 1) * vocab];
            worst = worst.max(max_diff(got, &solo[k][step + 1]));
            assert_eq!(argmax(got), argmax(&solo[k][step + 1]));
        }
    }
    worst
}

#[test]
fn bad_vulkan_settings_are_clear_errors() {
    let what = "bad settings";
    if no_device(what) {
        return;
    }
    let m = LoadedModel::load(&common::smollm2()).unwrap();
    // A CPU-only option.
    let e = Session::new(
        &m,
        &opts(KvPrecision::F16, 8, Some(64)).with_option("kernels", "scalar"),
    )
    .err()
    .expect("the vulkan backend must refuse a CPU option")
    .to_string();
    assert!(e.contains("vulkan") && e.contains("`kernels`"), "{e}");
    // A device that does not exist.
    let e = Session::new(
        &m,
        &EngineOptions {
            device: Some(99),
            ..opts(KvPrecision::F16, 8, Some(64))
        },
    )
    .err()
    .expect("device 99 does not exist")
    .to_string();
    assert!(
        e.contains("device 99") && e.contains("flowrt devices"),
        "{e}"
    );
    coverage::ran(SUITE, what);
}

/// `flowrt diff` on the Vulkan backend (activations read back and written between runlists)
/// gives the CPU's figures: the same first divergent layer for a model with one layer's
/// feed-forward output negated, and for a Q4_1 GGUF against its f32 source the same per-layer
/// errors within the two backends' rounding.
#[test]
fn diff_on_vulkan_gives_the_cpus_figures() {
    if no_device("diff on vulkan") {
        return;
    }
    use flowrt_engine::{diff, DiffOptions, DiffPrompt, DiffReport};
    let run = |a: &std::path::Path, b: &std::path::Path, backend: BackendKind| -> DiffReport {
        let load = |p: &std::path::Path| LoadedModel::load(p).unwrap();
        let opts = DiffOptions {
            engine: EngineOptions {
                backend,
                kv: KvPrecision::F32,
                ..EngineOptions::default()
            },
            ..DiffOptions::default()
        };
        diff(&load(a), &load(b), &DiffPrompt::builtin(), &opts).unwrap()
    };
    let src = common::fixture("families/llama-untied");
    let perturbed = common::perturbed_copy("model.layers.1.mlp.down_proj.weight", -1.0);
    let q4 = src.join("model-q4_1.gguf");
    for (b, first) in [(perturbed.path(), Some(Some(1))), (q4.as_path(), None)] {
        let cpu = run(&src, b, BackendKind::Cpu);
        let vk = run(&src, b, BackendKind::Vulkan);
        assert_eq!(cpu.first_divergent, first, "{cpu:?}");
        assert_eq!(vk.first_divergent, first, "{vk:?}");
        assert_eq!(vk.layers.len(), cpu.layers.len());
        assert_eq!(vk.positions, cpu.positions);
        for (v, c) in vk.layers.iter().zip(&cpu.layers) {
            assert_eq!(v.layer, c.layer);
            for (what, x, y) in [
                ("mean_rel_err", v.mean_rel_err, c.mean_rel_err),
                ("attn_err", v.attn_err, c.attn_err),
                ("ffn_err", v.ffn_err, c.ffn_err),
                ("mean_cosine", v.mean_cosine, c.mean_cosine),
            ] {
                assert!(
                    (x - y).abs() <= 1e-4 + 1e-3 * y.abs(),
                    "layer {:?} {what}: vulkan {x}, cpu {y}",
                    v.layer
                );
            }
        }
        assert!(
            (vk.mean_kl - cpu.mean_kl).abs() <= 1e-5 + 1e-3 * cpu.mean_kl,
            "mean KL: vulkan {}, cpu {}",
            vk.mean_kl,
            cpu.mean_kl
        );
        coverage::ran(SUITE, "diff on vulkan");
    }
}

/// A MoE prefill with its expert matmuls grouped by expert (`moe-grouping=grouped`: the
/// step's (token, slot) pairs sorted by expert on the device, each weight tile read once for
/// a tile of pairs) against the same steps with each pair on its own (`per-slot`), the
/// default choice (`auto`, grouped here: 40 tokens give 8 experts 10 pairs each on average)
/// and the CPU, on every MoE fixture and weight type the fixtures carry: f32 (Qwen3-MoE,
/// gpt-oss with per-expert biases and the clamped SwiGLU, LFM2-MoE's sigmoid router with a
/// selection bias), q8_0 GGUFs, gpt-oss's MXFP4 experts, and Q4_0 / Q4_1 quantised on load
/// (the K-quants need rows of 256 the fixtures lack). Uneven
/// loads: a 40-token prompt of one repeated token sends every token to the same experts in
/// the first sparse layer (two experts with 40 slots each, five tiles, the others none; the
/// repeated token's value rows are equal, so attention returns them whatever its weights),
/// and a mixed prompt (24 repeats, then 16 varied tokens) leaves partial tiles; then three
/// decode steps (one token: six experts with no slot). Grouped and per-slot differ only in
/// summation order (see the bound); the CPU within the device's usual bounds.
#[test]
fn moe_prefill_grouped_by_expert_on_vulkan_matches_per_slot_and_cpu() {
    let what = "moe prefill grouped by expert equals per-slot and cpu";
    if no_device(what) {
        return;
    }
    let same: Vec<u32> = vec![41; 40];
    let mut mixed: Vec<u32> = vec![77; 24];
    mixed.extend((0..16).map(|i| (i * 37 + 11) % 300));
    use flowrt_dtype::GgmlType::{Q4_0, Q4_1};
    for (case, file, quant, cpu_bound) in [
        ("qwen3-moe", None, None, 1e-4f32),
        ("qwen3-moe", Some("model-q8_0.gguf"), None, 5e-3),
        ("qwen3-moe", None, Some(Q4_0), 5e-3),
        ("gpt-oss", None, None, 1e-4),
        ("gpt-oss", Some("model-mxfp4.gguf"), None, 5e-3),
        ("gpt-oss", None, Some(Q4_1), 5e-3),
        ("lfm2-moe", None, None, 1e-4),
        ("lfm2-moe", Some("model-q8_0.gguf"), None, 5e-3),
    ] {
        let dir = common::fixture(&format!("families/{case}"));
        let m = LoadedModel::load_with(
            &file.map_or(dir.clone(), |f| dir.join(f)),
            &LoadOptions { quant },
        )
        .unwrap();
        let name = format!(
            "{case} {}",
            file.map_or_else(
                || quant.map_or("f32".into(), |q| format!("{q}")),
                String::from
            )
        );
        let vocab = m.model.config.vocab_size;
        for prompt in [&same, &mixed] {
            // Every position's logits of the prefill (one step), then three decode steps.
            let run = |backend: BackendKind, grouping: Option<&str>| -> Vec<Vec<f32>> {
                let mut o = EngineOptions {
                    backend,
                    threads: 2,
                    ..opts(KvPrecision::F32, 64, Some(64))
                };
                if let Some(g) = grouping {
                    o = o.with_option("moe-grouping", g);
                }
                let mut s = Session::new(&m, &o).unwrap();
                let mut rows = Vec::new();
                s.feed_all_logits(prompt, &mut |_, l| {
                    rows.extend(l.chunks(vocab).map(<[f32]>::to_vec))
                })
                .unwrap();
                assert_eq!(rows.len(), prompt.len());
                for t in [5u32, 77, 301] {
                    rows.push(s.feed(&[t]).unwrap().to_vec());
                }
                rows
            };
            let grouped = run(BackendKind::Vulkan, Some("grouped"));
            let per_slot = run(BackendKind::Vulkan, Some("per-slot"));
            let auto = run(BackendKind::Vulkan, None);
            let cpu = run(BackendKind::Cpu, None);
            let worst = |a: &[Vec<f32>], b: &[Vec<f32>]| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| max_diff(x, y))
                    .fold(0.0f32, f32::max)
            };
            let (gp, ga, gc) = (
                worst(&grouped, &per_slot),
                worst(&grouped, &auto),
                worst(&grouped, &cpu),
            );
            eprintln!(
                "vulkan {name} ({} tokens): max |logit difference| grouped vs per-slot {gp:e}, \
                 vs auto {ga:e}, vs cpu {gc:e}",
                prompt.len()
            );
            assert!(gp <= 1e-5, "{name}: grouped vs per-slot {gp}");
            assert!(ga <= 1e-5, "{name}: grouped vs auto {ga}");
            assert!(gc <= cpu_bound, "{name}: grouped vs cpu {gc}");
            let agree = grouped
                .iter()
                .zip(&cpu)
                .filter(|(g, c)| argmax(g) == argmax(c))
                .count();
            assert!(
                agree * 10 >= grouped.len() * 9,
                "{name}: top-1 agrees with the cpu on {agree} of {} rows",
                grouped.len()
            );
        }
    }
    coverage::ran(SUITE, what);
}

/// A `moe-grouping` value the backend does not know is a clear error naming it.
#[test]
fn bad_moe_grouping_is_a_clear_error() {
    let what = "bad moe-grouping setting";
    if no_device(what) {
        return;
    }
    let m = LoadedModel::load(&common::fixture("families/qwen3-moe")).unwrap();
    let o = opts(KvPrecision::F32, 8, Some(32)).with_option("moe-grouping", "sorted");
    let e = Session::new(&m, &o).err().expect("an unknown value fails");
    let msg = e.to_string();
    assert!(
        msg.contains("moe-grouping `sorted`") && msg.contains("per-slot"),
        "{msg}"
    );
    coverage::ran(SUITE, what);
}
