//! Benchmarks of prefill and decode, measured on the loaded model. Nothing is estimated.

use std::time::Instant;

use serde::Serialize;

use crate::error::EngineError;
use crate::session::{BatchSession, Session};
use crate::verify::argmax;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Prompt tokens to prefill.
    pub n_prompt: usize,
    /// Tokens to decode after the prompt.
    pub n_gen: usize,
    /// Measured repetitions (after one warm-up run).
    pub repetitions: usize,
}

/// Median, minimum and maximum over repetitions.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    pub fn of(v: &[f64]) -> Stat {
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let median = if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Stat {
            median,
            min: s.first().copied().unwrap_or(f64::NAN),
            max: s.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// Measured figures of one benchmark run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub repetitions: usize,
    pub prefill_tok_s: Stat,
    /// Prefill plus sampling the first token.
    pub ttft_ms: Stat,
    pub decode_tok_s: Stat,
    pub threads: usize,
    pub kernels: String,
}

/// Prompt of `n` token ids spread over the vocabulary (deterministic).
fn bench_prompt(n: usize, vocab: usize) -> Vec<u32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Measure prefill of `n_prompt` tokens and greedy decode of `n_gen` tokens.
pub fn bench(session: &mut Session, opts: &BenchOptions) -> Result<BenchReport, EngineError> {
    if opts.n_prompt == 0 || opts.repetitions == 0 {
        return Err(EngineError::Invalid(
            "bench needs at least one prompt token and one repetition".into(),
        ));
    }
    session.reset();
    session.check_fits(opts.n_prompt, opts.n_gen)?;
    let prompt = bench_prompt(opts.n_prompt, session.vocab_size());
    let mut run = |n_gen: usize| -> Result<(f64, f64, f64), EngineError> {
        session.reset();
        let t0 = Instant::now();
        let logits = session.feed(&prompt)?;
        let prefill = t0.elapsed().as_secs_f64();
        let mut tok = argmax(logits) as u32;
        let ttft = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for _ in 0..n_gen {
            tok = argmax(session.feed(&[tok])?) as u32;
        }
        let decode = t1.elapsed().as_secs_f64();
        Ok((prefill, ttft, decode))
    };
    // Warm-up: page in the weights, wake the threads.
    run(opts.n_gen.min(8))?;
    let (mut pre, mut ttft, mut dec) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..opts.repetitions {
        let (p, t, d) = run(opts.n_gen)?;
        pre.push(opts.n_prompt as f64 / p);
        ttft.push(t * 1e3);
        if opts.n_gen > 0 {
            dec.push(opts.n_gen as f64 / d);
        }
    }
    session.reset();
    Ok(BenchReport {
        n_prompt: opts.n_prompt,
        n_gen: opts.n_gen,
        repetitions: opts.repetitions,
        prefill_tok_s: Stat::of(&pre),
        ttft_ms: Stat::of(&ttft),
        decode_tok_s: Stat::of(&dec),
        threads: session.backend_info().threads,
        kernels: session.backend_info().kernels,
    })
}

/// Measured figures of a multi-sequence decode benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct ParallelReport {
    pub sequences: usize,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub repetitions: usize,
    /// Tokens decoded per second over all sequences together (one step decodes one token of
    /// every sequence).
    pub aggregate_decode_tok_s: Stat,
    pub threads: usize,
    pub kernels: String,
}

/// Prefill `n_prompt` tokens in each of the session's slots (different prompts), then decode
/// `n_gen` greedy tokens in every slot, all slots in one step each, and measure the aggregate
/// decode rate.
pub fn bench_parallel(
    session: &mut BatchSession,
    opts: &BenchOptions,
) -> Result<ParallelReport, EngineError> {
    let n_seq = session.n_slots();
    if opts.n_prompt == 0 || opts.repetitions == 0 {
        return Err(EngineError::Invalid(
            "bench needs at least one prompt token and one repetition".into(),
        ));
    }
    session.check_fits(0, opts.n_prompt, opts.n_gen)?;
    let vocab = session.vocab_size();
    let prompts: Vec<Vec<u32>> = (0..n_seq)
        .map(|s| {
            let mut p = bench_prompt(opts.n_prompt + s, vocab);
            p.drain(..s);
            p
        })
        .collect();
    let max = session.max_batch();
    let mut run = |n_gen: usize| -> Result<f64, EngineError> {
        let mut next = vec![0u32; n_seq];
        for (s, p) in prompts.iter().enumerate() {
            session.truncate(s, 0);
            for chunk in p.chunks(max) {
                let l = session.step(&[(s, chunk)])?;
                next[s] = argmax(l) as u32;
            }
        }
        let t0 = Instant::now();
        let mut toks = vec![[0u32; 1]; n_seq];
        for _ in 0..n_gen {
            for (t, &n) in toks.iter_mut().zip(&next) {
                *t = [n];
            }
            let items: Vec<(usize, &[u32])> =
                toks.iter().enumerate().map(|(s, t)| (s, &t[..])).collect();
            let logits = session.step(&items)?;
            for (s, row) in logits.chunks_exact(vocab).enumerate() {
                next[s] = argmax(row) as u32;
            }
        }
        Ok(t0.elapsed().as_secs_f64())
    };
    run(opts.n_gen.min(8))?;
    let mut dec = Vec::new();
    for _ in 0..opts.repetitions {
        let d = run(opts.n_gen)?;
        if opts.n_gen > 0 {
            dec.push((n_seq * opts.n_gen) as f64 / d);
        }
    }
    for s in 0..n_seq {
        session.truncate(s, 0);
    }
    Ok(ParallelReport {
        sequences: n_seq,
        n_prompt: opts.n_prompt,
        n_gen: opts.n_gen,
        repetitions: opts.repetitions,
        aggregate_decode_tok_s: Stat::of(&dec),
        threads: session.backend_info().threads,
        kernels: session.backend_info().kernels,
    })
}
