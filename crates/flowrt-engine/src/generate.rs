//! Text generation: prefill the prompt, then sample, stream and stop.

use std::time::{Duration, Instant};

use flowrt_sample::{Sampler, SamplerConfig, StopMatcher};
use flowrt_text::Tokenizer;

use crate::constraint::{ConstraintSpec, Guide};
use crate::error::EngineError;
use crate::session::Session;

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Stop strings: generation ends before the first occurrence of any.
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (benchmarks; random-weight models).
    pub ignore_eos: bool,
    /// Constrained decoding: every step's logits are masked so the output follows this (JSON
    /// Schema, any JSON object, regex, Lark grammar). Generation stops with
    /// [`FinishReason::Stop`] when the constrained output is complete; if `max_tokens` comes
    /// first the reason stays [`FinishReason::Length`] (the output is then incomplete).
    /// `stop` strings still apply and can cut a constrained output short (the CLI refuses the
    /// combination). `None`: unconstrained, exactly as before.
    pub constraint: Option<ConstraintSpec>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    ContextFull,
    /// The caller asked to stop.
    Cancelled,
}

/// What happened during one generation.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose cache entries were reused from the previous turn.
    pub reused_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt processing time.
    pub prefill_time: Duration,
    /// From the start until the first generated token was sampled.
    pub time_to_first_token: Duration,
    /// Time spent in decode steps after the first token.
    pub decode_time: Duration,
    pub finish: FinishReason,
    pub seed: u64,
    /// The generated tokens (stop strings included; EOG excluded).
    pub tokens: Vec<u32>,
    /// Compiling the constraint (zero without one); not part of prefill or decode time.
    pub constraint_compile_time: Duration,
}

/// Generate a continuation of `prompt` (the full sequence, e.g. the whole rendered chat; the
/// session reuses its cache for the common prefix). `on_text` receives text as it is produced
/// and returns `false` to cancel.
pub fn generate(
    session: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::Invalid(
            "the prompt is empty (no tokens)".into(),
        ));
    }
    opts.sampler.validate()?;
    // The prompt plus at least one generated token must fit.
    if prompt.len() + 1 > session.n_ctx() {
        return Err(EngineError::PromptTooLong {
            prompt_tokens: prompt.len(),
            reserve: 1,
            n_ctx: session.n_ctx(),
            model_ctx: session.model_ctx(),
        });
    }
    let mut sampler = Sampler::new(opts.sampler.clone(), session.vocab_size())?;
    let t_compile = Instant::now();
    let mut constraint = match &opts.constraint {
        Some(spec) => Some(Guide::cached(tokenizer, session.vocab_size())?.compile(spec)?),
        None => None,
    };
    let constraint_compile_time = if constraint.is_some() {
        t_compile.elapsed()
    } else {
        Duration::ZERO
    };
    // The masked copy of each step's logits (constrained decoding only).
    let mut masked = vec![
        0.0f32;
        if constraint.is_some() {
            session.vocab_size()
        } else {
            0
        }
    ];
    for &t in prompt {
        sampler.accept(t);
    }
    let mut decoder = tokenizer.stream_decoder(true);
    let mut stops = StopMatcher::new(opts.stop.clone());
    let mut out_tokens = Vec::with_capacity(opts.max_tokens.min(session.n_ctx()));

    let t0 = Instant::now();
    let reused = session.common_prefix(prompt);
    let mut logits = session.sync(prompt)?;
    let prefill_time = t0.elapsed();
    let mut ttft = None;
    let mut t_first = t0;
    let mut finish = FinishReason::Length;

    while out_tokens.len() < opts.max_tokens {
        let tok = match constraint.as_mut() {
            Some(c) => {
                masked.copy_from_slice(logits);
                c.mask(&mut masked)?;
                sampler.sample(&masked)?
            }
            None => sampler.sample(logits)?,
        };
        if ttft.is_none() {
            ttft = Some(t0.elapsed());
            t_first = Instant::now();
        }
        // Under a constraint, end-of-generation is only allowed where the output is complete.
        if (!opts.ignore_eos || constraint.is_some()) && tokenizer.is_eog(tok) {
            finish = FinishReason::Stop;
            break;
        }
        sampler.accept(tok);
        out_tokens.push(tok);
        if let Some(c) = constraint.as_mut() {
            c.accept(tok)?;
        }
        let piece = decoder.push(tokenizer, tok)?;
        let r = stops.push(piece);
        if !r.emit.is_empty() && !on_text(r.emit) {
            finish = FinishReason::Cancelled;
            break;
        }
        if r.stopped {
            finish = FinishReason::Stop;
            break;
        }
        if constraint.as_ref().is_some_and(|c| c.is_finished()) {
            finish = FinishReason::Stop;
            break;
        }
        if out_tokens.len() == opts.max_tokens {
            break;
        }
        if session.n_past() + 1 > session.n_ctx() {
            finish = FinishReason::ContextFull;
            break;
        }
        logits = session.feed(&[tok])?;
    }
    // Text held back because it might have begun a stop string is the answer's after all.
    if !stops.is_stopped() && finish != FinishReason::Cancelled {
        let tail = decoder.finish();
        let mut rest = stops.push(tail).emit.to_string();
        rest.push_str(stops.finish().emit);
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    let decode_time = if ttft.is_some() {
        t_first.elapsed()
    } else {
        Duration::ZERO
    };
    Ok(GenerationStats {
        prompt_tokens: prompt.len(),
        reused_tokens: reused,
        generated_tokens: out_tokens.len(),
        prefill_time,
        time_to_first_token: ttft.unwrap_or(prefill_time),
        decode_time,
        finish,
        seed: sampler.seed(),
        tokens: out_tokens,
        constraint_compile_time,
    })
}
