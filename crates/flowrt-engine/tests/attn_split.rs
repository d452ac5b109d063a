//! Attention with each (token, KV head)'s key range split into parts over threads and merged
//! (flash-decoding, `flowrt_cpu::AttnSplit`) gives the logits of the unsplit path up to float
//! rounding: prefill and decode, sliding windows, several sequences in one batch.

mod common;

use flowrt_cpu::AttnSplit;
use flowrt_engine::{BatchSession, EngineOptions, KvPrecision, LoadedModel, Session};

fn opts(attn_split: AttnSplit, max_batch: usize) -> EngineOptions {
    EngineOptions {
        threads: 2,
        kv: KvPrecision::F16,
        max_batch,
        ..EngineOptions::default()
    }
    .with_option("attn-split", attn_split)
}

/// Largest `|a - b|`; NaN if any difference is NaN (a NaN must fail the comparison, and
/// `f32::max` would drop it).
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m, d| if d.is_nan() || d > m { d } else { m })
}

/// Float rounding on the f32 fixtures: the merge sums in another order than one softmax, and
/// the random weights amplify it to at most ~5e-4 on logits of about ±8-15 (less than the
/// scalar and AVX2 kernel tables differ by on the same prompts, up to ~6e-4). A wrong merge,
/// key range, window or sequence moves logits by 0.3 or more.
const TOL: f32 = 2e-3;

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

/// The logits at every position of `prompt` (prefilled in batches of `max_batch`), then after
/// each of `next` decoded one at a time.
fn all_logits(m: &LoadedModel, o: &EngineOptions, prompt: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    let vocab = m.model.config.vocab_size;
    let mut s = Session::new(m, o).unwrap();
    let mut out = Vec::new();
    s.feed_all_logits(prompt, &mut |_, rows| {
        out.extend(rows.chunks_exact(vocab).map(|r| r.to_vec()))
    })
    .unwrap();
    for &t in next {
        out.push(s.feed(&[t]).unwrap().to_vec());
    }
    out
}

/// Forced splits (2, 3 and 7 parts: ranges shorter than the parts leave some empty) against
/// the unsplit path at every position of a prompt that outgrows the window, prefilled in
/// batches of 7 tokens, and 8 decode steps.
fn split_equals_unsplit(case: &str) {
    let m = LoadedModel::load(&common::fixture(&format!("families/{case}"))).unwrap();
    let prompt: Vec<u32> = (0..90).map(|i| (i * 37 + 11) % 300).collect();
    let next: Vec<u32> = (0..8).map(|i| (i * 53 + 5) % 300).collect();
    let want = all_logits(&m, &opts(AttnSplit::Off, 7), &prompt, &next);
    for parts in [2, 3, 7] {
        let got = all_logits(&m, &opts(AttnSplit::Parts(parts), 7), &prompt, &next);
        assert_eq!(got.len(), want.len());
        for (p, (g, w)) in got.iter().zip(&want).enumerate() {
            let d = max_diff(g, w);
            assert!(
                d <= TOL,
                "{case}, {parts} parts, position {p}: max diff {d}"
            );
            assert_eq!(argmax(g), argmax(w), "{case}, {parts} parts, position {p}");
        }
    }
}

#[test]
fn split_attention_equals_unsplit_llama_gqa() {
    split_equals_unsplit("llama-tied");
}

#[test]
fn split_attention_equals_unsplit_gemma3_sliding_window() {
    split_equals_unsplit("gemma3");
}

#[test]
fn split_attention_equals_unsplit_mistral_sliding_window() {
    split_equals_unsplit("mistral");
}

/// Gemma 2: every part soft-caps its own scores before its max and sum.
#[test]
fn split_attention_equals_unsplit_gemma2_softcap() {
    split_equals_unsplit("gemma2");
}

/// gpt-oss: the sinks join the softmax denominator once, in the merge of the parts.
#[test]
fn split_attention_equals_unsplit_gpt_oss_sinks() {
    split_equals_unsplit("gpt-oss");
}

/// Three sequences of different lengths in one cache, prefilled in one step and decoded
/// together (one sits a step out): each row's keys come from its own sequence in every part.
#[test]
fn split_attention_equals_unsplit_with_several_sequences_in_a_batch() {
    let m = LoadedModel::load(&common::fixture("families/gemma3")).unwrap();
    let prompts: Vec<Vec<u32>> = [(7, 13), (41, 7), (23, 31)]
        .iter()
        .map(|&(n, k)| (0..n).map(|i| (i * k + 2) % 300).collect())
        .collect();
    let run = |split| {
        let mut b = BatchSession::new(&m, &opts(split, 128), 4).unwrap();
        let slots = [2usize, 0, 3];
        let items: Vec<(usize, &[u32])> = (0..3).map(|k| (slots[k], &prompts[k][..])).collect();
        let mut out = vec![b.step(&items).unwrap().to_vec()];
        for step in 0..6u32 {
            let toks: Vec<[u32; 1]> = (0..3).map(|k| [(k * 50 + step * 3 + 7) % 300]).collect();
            let items: Vec<(usize, &[u32])> = (0..3)
                .filter(|&k| step != 2 || k != 1)
                .map(|k| (slots[k], &toks[k][..]))
                .collect();
            out.push(b.step(&items).unwrap().to_vec());
        }
        out
    };
    let want = run(AttnSplit::Off);
    for parts in [2, 5] {
        let got = run(AttnSplit::Parts(parts));
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let d = max_diff(g, w);
            assert!(d <= TOL, "{parts} parts, step {step}: max diff {d}");
        }
    }
}

/// The default (`Auto`) on the real model: decode after a 700-token prompt on 2 threads
/// splits each of the 3 KV heads' ranges in 2 (parts of at least 256 keys) and agrees with
/// the unsplit path. Logits span about ±30; 0.02 is float rounding through 30 layers.
#[test]
fn auto_split_decode_equals_unsplit_smollm2() {
    let m = LoadedModel::load(&common::smollm2()).unwrap();
    let prompt: Vec<u32> = (0..700).map(|i| (i * 7 + 3) % 3000).collect();
    let next = [42, 1000, 7];
    let decode = |split| {
        let mut s = Session::new(&m, &opts(split, 256)).unwrap();
        s.feed(&prompt).unwrap();
        next.iter()
            .map(|&t| s.feed(&[t]).unwrap().to_vec())
            .collect::<Vec<_>>()
    };
    let (want, got) = (decode(AttnSplit::Off), decode(AttnSplit::Auto));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let d = max_diff(g, w);
        assert!(d <= 2e-2, "decode step {i}: max diff {d}");
        assert_eq!(argmax(g), argmax(w), "decode step {i}");
    }
}
