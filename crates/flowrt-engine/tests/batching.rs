//! Continuous batching: several sequences in one device cache, stepped together in one pass
//! over the weights, give each sequence the logits it gets alone.

mod common;

use flowrt_engine::{
    bench_parallel, BatchSession, BatchStepper, BenchOptions, EngineError, EngineOptions,
    KvPrecision, LoadedModel, Session,
};

fn opts() -> EngineOptions {
    EngineOptions {
        threads: 2,
        kv: KvPrecision::F16,
        max_batch: 64,
        ..EngineOptions::default()
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..7).map(|i| (i * 13 + 5) % 300).collect(),
        (0..19).map(|i| (i * 7 + 1) % 300).collect(),
        (0..3).map(|i| (i * 31 + 2) % 300).collect(),
    ]
}

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Each prompt alone, then `steps` decode tokens: the logits after each.
fn solo(m: &LoadedModel, o: &EngineOptions, prompt: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    let mut s = Session::new(m, o).unwrap();
    let mut out = vec![s.feed(prompt).unwrap().to_vec()];
    for &t in next {
        out.push(s.feed(&[t]).unwrap().to_vec());
    }
    out
}

/// Three sequences of different lengths prefilled in one step, then decoded together; a
/// fourth slot idles. Every row equals the sequence run alone up to `tol`: float weights give
/// the same arithmetic per row whatever the batch; with quantised weights the matmul tiles
/// for 1, 4 and 8 tokens sum in different orders, which moves logits by float rounding only.
fn batched_equals_solo(m: &LoadedModel, tol: f32) {
    batched_equals_solo_with(m, tol, &opts())
}

/// [`batched_equals_solo`] with options `o`.
fn batched_equals_solo_with(m: &LoadedModel, tol: f32, o: &EngineOptions) {
    let ps = prompts();
    let next: Vec<Vec<u32>> = (0..3)
        .map(|k| (0..5).map(|i| (k * 50 + i * 3 + 7) as u32).collect())
        .collect();
    let want: Vec<_> = (0..3).map(|k| solo(m, o, &ps[k], &next[k])).collect();
    let vocab = m.model.config.vocab_size;
    let mut b = BatchSession::new(m, o, 4).unwrap();
    // Prefill all three in one step (slots 2, 0, 3: order and slot numbers need not match).
    let slots = [2usize, 0, 3];
    let items: Vec<(usize, &[u32])> = (0..3).map(|k| (slots[k], &ps[k][..])).collect();
    let logits = b.step(&items).unwrap().to_vec();
    assert_eq!(logits.len(), 3 * vocab);
    for k in 0..3 {
        let d = max_diff(&logits[k * vocab..(k + 1) * vocab], &want[k][0]);
        assert!(d <= tol, "prefill of sequence {k}: max diff {d}");
    }
    for step in 0..5 {
        let toks: Vec<[u32; 1]> = (0..3).map(|k| [next[k][step]]).collect();
        // Step 2 leaves sequence 1 out: a slot may sit a step out.
        let active: Vec<usize> = (0..3).filter(|&k| step != 2 || k != 1).collect();
        let items: Vec<(usize, &[u32])> =
            active.iter().map(|&k| (slots[k], &toks[k][..])).collect();
        let logits = b.step(&items).unwrap().to_vec();
        if step == 2 {
            // Catch sequence 1 up alone.
            let l = b.step(&[(slots[1], &toks[1][..])]).unwrap().to_vec();
            assert!(max_diff(&l, &want[1][3]) <= tol);
        }
        for (row, &k) in active.iter().enumerate() {
            let got = &logits[row * vocab..(row + 1) * vocab];
            let d = max_diff(got, &want[k][step + 1]);
            assert!(d <= tol, "decode step {step}, sequence {k}: max diff {d}");
            assert_eq!(argmax(got), argmax(&want[k][step + 1]));
        }
    }
    assert_eq!(b.n_past(slots[0]), 7 + 5);
    assert_eq!(b.n_past(slots[1]), 19 + 5);
    assert_eq!(b.n_past(1), 0);
}

#[test]
fn batched_sequences_equal_solo_runs_f32_llama() {
    batched_equals_solo(
        &LoadedModel::load(&common::fixture("families/llama-tied")).unwrap(),
        1e-5,
    );
}

#[test]
fn batched_sequences_equal_solo_runs_gemma3_sliding_window() {
    batched_equals_solo(
        &LoadedModel::load(&common::fixture("families/gemma3")).unwrap(),
        1e-5,
    );
}

#[test]
fn batched_sequences_equal_solo_runs_gemma2_softcap() {
    batched_equals_solo(
        &LoadedModel::load(&common::fixture("families/gemma2")).unwrap(),
        1e-5,
    );
}

/// Prefix reuse on Gemma 2 past its window of 8: the capped scores of the kept prefix's keys
/// are recomputed against the new queries, as in a fresh prefill.
#[test]
fn prefix_reuse_equals_fresh_prefill_gemma2() {
    prefix_reuse_equals_fresh("gemma2", 15, 12);
}

#[test]
fn batched_sequences_equal_solo_runs_smollm2_q4_1() {
    // Logits of this model span about ±30; 0.02 is float rounding through 30 layers.
    batched_equals_solo(&LoadedModel::load(&common::smollm2()).unwrap(), 2e-2);
}

#[test]
fn bad_steps_are_errors_and_change_nothing() {
    let m = LoadedModel::load(&common::fixture("families/llama-tied")).unwrap();
    let mut b = BatchSession::new(&m, &opts(), 2).unwrap();
    let t: &[u32] = &[1, 2, 3];
    type Items<'a> = Vec<(usize, &'a [u32])>;
    let cases: Vec<(Items, &str)> = vec![
        (vec![(0, t), (0, t)], "twice"),
        (vec![(2, t)], "does not exist"),
        (vec![(0, &[])], "no tokens"),
        (vec![], "at least one"),
    ];
    for (items, needle) in cases {
        let e = b.step(&items).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
    let big = vec![1u32; 65];
    assert!(matches!(b.step(&[(0, &big)]), Err(EngineError::Invalid(_))));
    // Fill slot 0 to two short of its context; three more tokens do not fit, and a failed
    // step leaves both slots as they were.
    let n_ctx = b.n_ctx();
    while b.n_past(0) < n_ctx - 2 {
        let n = (n_ctx - 2 - b.n_past(0)).min(64);
        b.step(&[(0, &big[..n])]).unwrap();
    }
    b.step(&[(1, t)]).unwrap();
    let e = b.step(&[(1, t), (0, t)]);
    assert!(matches!(e, Err(EngineError::PromptTooLong { .. })), "{e:?}");
    assert_eq!((b.n_past(0), b.n_past(1)), (n_ctx - 2, 3));
}

/// A session fed `len` tokens, then re-synced to a prompt sharing their first `keep`, gives
/// the logits of a fresh prefill of that prompt (9 new tokens after the kept prefix).
fn prefix_reuse_equals_fresh(case: &str, len: u32, keep: usize) {
    let m = LoadedModel::load(&common::fixture(&format!("families/{case}"))).unwrap();
    let a: Vec<u32> = (0..len).map(|i| (i * 17 + 3) % 300).collect();
    let mut b = a.clone();
    b.truncate(keep);
    b.extend((0..9).map(|i| (i * 23 + 40) % 300));
    let mut s = Session::new(&m, &opts()).unwrap();
    s.feed(&a).unwrap();
    assert_eq!(s.common_prefix(&b), keep);
    let reused = s.sync(&b).unwrap().to_vec();
    let mut f = Session::new(&m, &opts()).unwrap();
    let fresh = f.feed(&b).unwrap().to_vec();
    let d = max_diff(&reused, &fresh);
    assert!(d <= 1e-5, "{case}: prefix reuse: max diff {d}");
    assert_eq!(argmax(&reused), argmax(&fresh));
}

/// A mixture of experts (8 experts, top-2): a batch groups its tokens by expert, so each row
/// must still get exactly its own experts' outputs.
#[test]
fn batched_sequences_equal_solo_runs_qwen3_moe() {
    batched_equals_solo(
        &LoadedModel::load(&common::fixture("families/qwen3-moe")).unwrap(),
        1e-5,
    );
}

/// The Q4_0 GGUF of the fixture (made by `flowrt pack`), with 8-bit A8 activations on the repacked weights
/// (`act-quant=q8x`; every matrix of this fixture is Q4_0, so every matmul takes the A8
/// kernels): a batch quantises each row on its own and the kernels' tiles only change the
/// float summation order, so rows equal solo runs up to rounding (measured: bit-identical, as
/// this fixture's rows are two blocks long). The A8 logits are not Q16's (8-bit rounding),
/// and close to them.
#[test]
fn batched_sequences_equal_solo_runs_qwen3_moe_q4_0_a8() {
    let m = LoadedModel::load(&common::fixture("families/qwen3-moe/model-q4_0.gguf")).unwrap();
    let o = opts().with_option("act-quant", "q8x");
    if cfg!(target_arch = "x86_64") {
        let s = Session::new(&m, &o).unwrap();
        assert_eq!(
            s.backend_info().matmul_prefill,
            format!("{}-x8-a8", s.backend_info().kernels)
        );
        let p = &prompts()[1];
        let a8 = Session::new(&m, &o).unwrap().feed(p).unwrap().to_vec();
        let q16 = Session::new(&m, &opts()).unwrap().feed(p).unwrap().to_vec();
        let d = max_diff(&a8, &q16);
        assert!(d > 0.0 && d < 0.1, "A8 against Q16: max diff {d}");
        assert_eq!(argmax(&a8), argmax(&q16));
    }
    batched_equals_solo_with(&m, 1e-5, &o);
}

/// MXFP4 experts (and Q8_0 attention, which keeps Q16 activations) with A8 activations: rows
/// equal solo runs (measured: bit-identical).
#[test]
fn batched_sequences_equal_solo_runs_gpt_oss_mxfp4_a8() {
    let m = LoadedModel::load(&common::fixture("families/gpt-oss/model-mxfp4.gguf")).unwrap();
    let o = opts().with_option("act-quant", "q8x");
    if cfg!(target_arch = "x86_64") {
        let s = Session::new(&m, &o).unwrap();
        assert_eq!(
            s.backend_info().matmul_prefill,
            format!("{}-x8-a8", s.backend_info().kernels)
        );
    }
    batched_equals_solo_with(&m, 1e-5, &o);
}

/// Prefix reuse on the mixture of experts: a session that re-syncs to a longer prompt sharing
/// a prefix gives the logits of a fresh prefill of the whole prompt.
#[test]
fn prefix_reuse_equals_fresh_prefill_qwen3_moe() {
    prefix_reuse_equals_fresh("qwen3-moe", 11, 8);
}

/// gpt-oss (attention sinks, window 8 on alternate layers, biased top-k-softmax experts):
/// batched sequences, each longer than the window, equal solo runs.
#[test]
fn batched_sequences_equal_solo_runs_gpt_oss() {
    batched_equals_solo(
        &LoadedModel::load(&common::fixture("families/gpt-oss")).unwrap(),
        1e-5,
    );
}

/// LFM2 (short convolution layers next to attention layers): each convolution reads its own
/// sequence's cached `B · x` of the last positions, so batched rows equal solo runs.
#[test]
fn batched_sequences_equal_solo_runs_lfm2() {
    batched_equals_solo(
        &LoadedModel::load(&common::fixture("families/lfm2")).unwrap(),
        1e-5,
    );
}

/// Prefix reuse on gpt-oss past the window: a re-synced session continues a 12-token prefix
/// (longer than the window of 8) as a fresh prefill of the whole 21-token prompt does.
#[test]
fn prefix_reuse_equals_fresh_prefill_gpt_oss() {
    prefix_reuse_equals_fresh("gpt-oss", 15, 12);
}

/// Prefix reuse on LFM2: the convolution cache is kept per position like K, so a re-synced
/// session (the first positions kept, the rest overwritten) equals a fresh prefill; the
/// convolution at the first new position reads the two kept positions before it.
#[test]
fn prefix_reuse_equals_fresh_prefill_lfm2() {
    prefix_reuse_equals_fresh("lfm2", 11, 8);
}

/// LFM2-MoE (convolution and attention layers, a dense layer, then sigmoid-routed experts
/// with a selection bias): batched rows equal solo runs.
#[test]
fn batched_sequences_equal_solo_runs_lfm2_moe() {
    batched_equals_solo(
        &LoadedModel::load(&common::fixture("families/lfm2-moe")).unwrap(),
        1e-5,
    );
}

/// Prefix reuse on LFM2-MoE equals a fresh prefill.
#[test]
fn prefix_reuse_equals_fresh_prefill_lfm2_moe() {
    prefix_reuse_equals_fresh("lfm2-moe", 11, 8);
}

/// Every logit of every output, as bits.
fn bits(outs: &[Vec<f32>]) -> Vec<Vec<u32>> {
    outs.iter()
        .map(|o| o.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// LFM2's logits with the pool at `threads`: a 70-token prefill, a prefix-reuse re-sync, then
/// three sequences prefilled in one step and stepped together at different positions with
/// different numbers of tokens (rows of several sequences in one batch). The 70-token prefill
/// and the steps of 66 and more rows are large enough for the pool (below 2048 rows × channels
/// the convolution stays on the calling thread: 32 rows of `lfm2`'s 64 channels, 64 rows of
/// `lfm2-conv-bias`'s 32); the small steps read what the large ones cached.
fn lfm2_outputs(m: &LoadedModel, kv: KvPrecision, threads: usize) -> Vec<Vec<f32>> {
    // Attention's key-range split depends on the thread count; off, so that only the
    // convolution (and ops that never depend on it) could make threads differ.
    let o = EngineOptions {
        threads,
        kv,
        max_batch: 128,
        ..opts()
    }
    .with_option("attn-split", "off");
    let seq =
        |len: u32, a: u32, b: u32| -> Vec<u32> { (0..len).map(|i| (i * a + b) % 300).collect() };
    let mut out = Vec::new();
    let a = seq(70, 17, 3);
    let mut s = Session::new(m, &o).unwrap();
    out.push(s.feed(&a).unwrap().to_vec());
    let mut b = a[..10].to_vec();
    b.extend(seq(9, 23, 40));
    out.push(s.sync(&b).unwrap().to_vec());
    let mut bs = BatchSession::new(m, &o, 4).unwrap();
    let slots = [2, 0, 3];
    for (step, lens) in [[25, 30, 20], [1, 3, 2], [22, 23, 21], [2, 1, 1]]
        .iter()
        .enumerate()
    {
        let toks: Vec<Vec<u32>> = (0..3)
            .map(|k| seq(lens[k], 7 + 2 * k as u32, 11 * step as u32 + k as u32))
            .collect();
        let items: Vec<(usize, &[u32])> = (0..3).map(|k| (slots[k], &toks[k][..])).collect();
        out.push(bs.step(&items).unwrap().to_vec());
    }
    out
}

/// Issue 17: the short convolution runs over the thread pool by channel blocks, each channel
/// keeping the additions of the one-thread op in their order, so the logits with 2 and 3
/// threads are bit-identical to 1 thread's, with and without a convolution bias, over f16 and
/// f32 caches.
#[test]
fn issue_17_lfm2_logits_bit_identical_over_1_2_3_threads() {
    for case in ["lfm2", "lfm2-conv-bias"] {
        let m = LoadedModel::load(&common::fixture(&format!("families/{case}"))).unwrap();
        for kv in [KvPrecision::F16, KvPrecision::F32] {
            let one = bits(&lfm2_outputs(&m, kv, 1));
            for threads in [2, 3] {
                let got = bits(&lfm2_outputs(&m, kv, threads));
                assert_eq!(got.len(), one.len());
                for (i, (g, w)) in got.iter().zip(&one).enumerate() {
                    let diff = g.iter().zip(w).filter(|(a, b)| a != b).count();
                    assert!(
                        diff == 0 && g.len() == w.len(),
                        "{case}, {kv:?} cache, {threads} threads: output {i} has {diff} of {} \
                         logits differing from 1 thread's",
                        w.len()
                    );
                }
            }
        }
    }
}

/// `bench --parallel` steps through the server's policy ([`BatchStepper`]): with more
/// sequences than a step holds, decodes that do not fit wait for the next step, and none is
/// lost or counted twice: 5 sequences, 3 tokens a step, 4 tokens each take 7 steps
/// (ceil(20 / 3)).
#[test]
fn bench_parallel_steps_through_the_batching_policy() {
    let m = LoadedModel::load(&common::fixture("families/llama-tied")).unwrap();
    let o = EngineOptions {
        max_batch: 3,
        ..opts()
    };
    let mut stepper = BatchStepper::new(&m, &o, 5).unwrap();
    let r = bench_parallel(
        &mut stepper,
        &BenchOptions {
            n_prompt: 6,
            n_gen: 4,
            repetitions: 2,
        },
    )
    .unwrap();
    assert_eq!((r.sequences, r.decoded_tokens, r.decode_steps), (5, 20, 7));
    assert!(r.aggregate_decode_tok_s.median > 0.0, "{r:?}");
    let p = r.aggregate_prefill_tok_s.median;
    assert!(p.is_finite() && p > 0.0, "{r:?}");
    // Every slot is left empty for what runs next.
    assert!((0..5).all(|s| stepper.session().tokens(s).is_empty()));
}
