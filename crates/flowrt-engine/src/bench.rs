//! Benchmarks of prefill and decode, measured on the loaded model. Nothing is estimated.

use std::time::Instant;

use flowrt_dispatch::BackendInfo;
use flowrt_model::{Model, WeightMatrix};
use serde::Serialize;

use crate::error::EngineError;
use crate::session::Session;
use crate::step::{BatchStepper, Fed, SlotWork, StepEngine};
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

/// What a benchmark ran on, as the backend reports it ([`BackendInfo`]).
#[derive(Clone, Debug, Serialize)]
pub struct BackendReport {
    /// `cpu`, `vulkan`, ...
    pub name: String,
    pub kernels: String,
    /// Matmul code paths of decode and prefill (e.g. `avx512vnni-x8`).
    pub matmul_decode: String,
    pub matmul_prefill: String,
    pub threads: usize,
    /// The CPU's model name or the GPU's.
    pub device: String,
    pub driver: Option<String>,
    /// Device memory (`None`: host memory, shared).
    pub memory_bytes: Option<u64>,
    /// Repacked or uploaded weight copies.
    pub prepared_weight_bytes: u64,
    pub kv_cache_bytes: u64,
}

impl From<BackendInfo> for BackendReport {
    fn from(i: BackendInfo) -> Self {
        BackendReport {
            name: i.name,
            kernels: i.kernels,
            matmul_decode: i.matmul_decode,
            matmul_prefill: i.matmul_prefill,
            threads: i.threads,
            device: i.device,
            driver: i.driver,
            memory_bytes: i.memory_bytes,
            prepared_weight_bytes: i.prepared_weight_bytes,
            kv_cache_bytes: i.kv_cache_bytes,
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
    pub backend: BackendReport,
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
    let info = session.backend_info();
    Ok(BenchReport {
        n_prompt: opts.n_prompt,
        n_gen: opts.n_gen,
        repetitions: opts.repetitions,
        prefill_tok_s: Stat::of(&pre),
        ttft_ms: Stat::of(&ttft),
        decode_tok_s: Stat::of(&dec),
        threads: info.threads,
        kernels: info.kernels.clone(),
        backend: info.into(),
    })
}

/// Measured figures of a multi-sequence decode benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct ParallelReport {
    pub sequences: usize,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub repetitions: usize,
    /// Prompt tokens per second over all sequences together, the prompts fed side by side
    /// (chunked to the batch size) from the first step to the last prompt's logits.
    pub aggregate_prefill_tok_s: Stat,
    /// Tokens decoded per second over all sequences together.
    pub aggregate_decode_tok_s: Stat,
    /// Decode steps (forward passes) of the last measured run and the tokens they decoded:
    /// one token of every sequence per step while the sequences fit the batch.
    pub decode_steps: usize,
    pub decoded_tokens: usize,
    pub threads: usize,
    pub kernels: String,
    pub backend: BackendReport,
}

/// Prefill `n_prompt` tokens in each of the stepper's slots (different prompts), then decode
/// `n_gen` greedy tokens in every slot, and measure the aggregate decode rate. Every step goes
/// through [`BatchStepper`], the policy the server's scheduler runs: the prompts together,
/// chunked to the batch size (a sequence whose prompt is in waits for the others), then steps
/// of one token of every sequence, or of as many as the batch holds.
pub fn bench_parallel(
    stepper: &mut BatchStepper,
    opts: &BenchOptions,
) -> Result<ParallelReport, EngineError> {
    let n_seq = stepper.slots();
    if opts.n_prompt == 0 || opts.repetitions == 0 {
        return Err(EngineError::Invalid(
            "bench needs at least one prompt token and one repetition".into(),
        ));
    }
    stepper.session().check_fits(0, opts.n_prompt, opts.n_gen)?;
    let vocab = stepper.session().vocab_size();
    let prompts: Vec<Vec<u32>> = (0..n_seq)
        .map(|s| {
            let mut p = bench_prompt(opts.n_prompt + s, vocab);
            p.drain(..s);
            p
        })
        .collect();
    // Runs every prompt and `n_gen` greedy tokens after it; returns the seconds the prompts
    // took, the seconds from the step after the last prompt completed, the tokens decoded in
    // them and the steps they took.
    let mut run = |n_gen: usize| -> Result<(f64, f64, usize, usize), EngineError> {
        for s in 0..n_seq {
            stepper.truncate(s, 0);
        }
        // Each sequence's tokens still to feed (its prompt, then its last greedy token), how
        // many tokens it has left to generate, and whether its prompt is still going in.
        let mut pending: Vec<Vec<u32>> = prompts.clone();
        let mut left = vec![n_gen; n_seq];
        let mut in_prompt = vec![true; n_seq];
        let mut timed: Option<(Instant, usize)> = None;
        let began = Instant::now();
        let mut prefill = 0.0;
        let mut steps = 0;
        loop {
            if timed.is_none() && !in_prompt.contains(&true) {
                let now = Instant::now();
                prefill = (now - began).as_secs_f64();
                timed = Some((now, 0));
            }
            // While prompts are going in, a sequence whose prompt is in waits with its first
            // token, so that decoding is timed with every sequence in it.
            let prefilling = timed.is_none();
            let live: Vec<usize> = (0..n_seq)
                .filter(|&s| !pending[s].is_empty() && (in_prompt[s] || !prefilling))
                .collect();
            if live.is_empty() {
                break;
            }
            let work: Vec<SlotWork<'_>> = live
                .iter()
                .map(|&s| SlotWork {
                    slot: s,
                    tokens: &pending[s],
                })
                .collect();
            // Per item: how many tokens were fed, and the greedy next token if all were.
            let mut fed: Vec<Option<(usize, Option<u32>)>> = vec![None; live.len()];
            let mut failed = None;
            stepper.step(&work, &mut |i, r| match r {
                Ok(Fed::All(logits)) => {
                    fed[i] = Some((work[i].tokens.len(), Some(argmax(logits) as u32)))
                }
                Ok(Fed::Part(n)) => fed[i] = Some((n, None)),
                Err(e) => failed = failed.take().or(Some(e)),
            });
            if let Some(e) = failed {
                return Err(e);
            }
            if timed.is_some() {
                steps += 1;
            }
            for (&s, f) in live.iter().zip(fed) {
                let Some((n, next)) = f else {
                    return Err(EngineError::Invalid(format!(
                        "the step left sequence {s} without an outcome"
                    )));
                };
                pending[s].drain(..n);
                let Some(next) = next else { continue };
                if !std::mem::replace(&mut in_prompt[s], false) {
                    if let Some((_, decoded)) = timed.as_mut() {
                        *decoded += 1;
                    }
                }
                if left[s] > 0 {
                    left[s] -= 1;
                    pending[s].push(next);
                }
            }
        }
        let (secs, decoded) = timed.map_or((0.0, 0), |(t, n)| (t.elapsed().as_secs_f64(), n));
        Ok((prefill, secs, decoded, steps))
    };
    run(opts.n_gen.min(8))?;
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let (mut pre, mut dec) = (Vec::new(), Vec::new());
    let (mut decode_steps, mut decoded_tokens) = (0, 0);
    for _ in 0..opts.repetitions {
        let (prefill, secs, decoded, steps) = run(opts.n_gen)?;
        pre.push(prompt_tokens as f64 / prefill);
        if decoded > 0 {
            dec.push(decoded as f64 / secs);
        }
        (decode_steps, decoded_tokens) = (steps, decoded);
    }
    for s in 0..n_seq {
        stepper.truncate(s, 0);
    }
    let session = stepper.session();
    let info = session.backend_info();
    Ok(ParallelReport {
        sequences: n_seq,
        n_prompt: opts.n_prompt,
        n_gen: opts.n_gen,
        repetitions: opts.repetitions,
        aggregate_prefill_tok_s: Stat::of(&pre),
        aggregate_decode_tok_s: Stat::of(&dec),
        decode_steps,
        decoded_tokens,
        threads: info.threads,
        kernels: info.kernels.clone(),
        backend: info.into(),
    })
}

/// Bytes of weights the model holds: every matrix once (a tied output projection shares the
/// embeddings' bytes) and every norm and bias vector.
pub fn weight_bytes(model: &Model) -> u64 {
    let m = |w: &WeightMatrix| (w.rows * w.row_bytes) as u64;
    let v = |x: &[f32]| std::mem::size_of_val(x) as u64;
    let o = |x: &Option<Vec<f32>>| x.as_deref().map_or(0, v);
    let layers: u64 = model
        .layers
        .iter()
        .map(|l| {
            l.matrices().map(m).sum::<u64>()
                + v(&l.attn_norm)
                + v(&l.ffn_norm)
                + [
                    &l.bq,
                    &l.bk,
                    &l.bv,
                    &l.q_norm,
                    &l.k_norm,
                    &l.attn_norm_bias,
                    &l.ffn_norm_bias,
                    &l.bo,
                    &l.b_up,
                    &l.b_down,
                ]
                .into_iter()
                .map(o)
                .sum::<u64>()
                + o(&l.attn_post_norm)
                + o(&l.ffn_post_norm)
        })
        .sum();
    let output = match &model.output {
        Some(w) if !model.tied_embeddings => m(w),
        _ => 0,
    };
    layers
        + m(&model.token_embd)
        + [&model.pos_embd, &model.token_types]
            .into_iter()
            .flatten()
            .map(m)
            .sum::<u64>()
        + output
        + [&model.output_norm, &model.embd_norm, &model.embd_norm_bias]
            .into_iter()
            .map(o)
            .sum::<u64>()
}

/// Decode speed against the memory's measured read bandwidth: a decode step reads every
/// weight matrix once (and one embedding row), whatever the batch, so
/// `bytes per step × steps per second` is the weight traffic decode achieved.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Roofline {
    /// [`Model::weight_bytes_per_token`]: the weights one decode step reads.
    pub weight_bytes_per_step: u64,
    /// `weight_bytes_per_step × steps per second`, 10^9 bytes per second.
    pub achieved_gb_s: f64,
    /// Measured read bandwidth (see [`crate::measure_read_bandwidth`]).
    pub read_gb_s: f64,
    /// `achieved / read × 100`.
    pub percent: f64,
}

impl Roofline {
    pub fn new(model: &Model, steps_per_s: f64, read_gb_s: f64) -> Roofline {
        let weight_bytes_per_step = model.weight_bytes_per_token();
        let achieved_gb_s = weight_bytes_per_step as f64 * steps_per_s / 1e9;
        Roofline {
            weight_bytes_per_step,
            achieved_gb_s,
            read_gb_s,
            percent: achieved_gb_s / read_gb_s * 100.0,
        }
    }
}
