//! Text generation: prefill the prompt, then sample, stream and stop.

use std::time::{Duration, Instant};

use flowrt_sample::SamplerConfig;
use flowrt_text::Tokenizer;

use crate::constraint::ConstraintSpec;
use crate::error::EngineError;
use crate::generation::{Generation, GenerationSettings};
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
    /// Compiling the constraint (zero without one; [`crate::Constraint::compile_time`]); not
    /// part of prefill or decode time. The model's token environment, built once on the first
    /// constrained generation ([`crate::Guide::build_time`]), is not counted.
    pub constraint_compile_time: Duration,
}

/// Generate a continuation of `prompt` (the full sequence, e.g. the whole rendered chat; the
/// session reuses its cache for the common prefix). `on_text` receives text as it is produced
/// and returns `false` to cancel. `tokenizer` is the model's (the one of the [`LoadedModel`]
/// the session was made from): a constraint is compiled from the model's token environment,
/// built from it on first use ([`LoadedModel::guide`]).
///
/// The steps are [`Generation`]'s, the same the server's scheduler runs.
///
/// [`LoadedModel`]: crate::LoadedModel
/// [`LoadedModel::guide`]: crate::LoadedModel::guide
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
    let constraint = match &opts.constraint {
        Some(spec) => Some(session.guide(tokenizer)?.compile(spec)?),
        None => None,
    };
    let constraint_compile_time = constraint
        .as_ref()
        .map_or(Duration::ZERO, |c| c.compile_time);
    let settings = GenerationSettings {
        sampler: opts.sampler.clone(),
        stop: opts.stop.clone(),
        max_tokens: opts.max_tokens,
        ignore_eos: opts.ignore_eos,
        n_ctx: session.n_ctx(),
        n_logits: session.vocab_size(),
        keep_special: false,
    };
    let mut gen = Generation::new(tokenizer, prompt, settings, constraint)?;

    let t0 = Instant::now();
    let reused = session.common_prefix(prompt);
    let mut logits = session.sync(prompt)?;
    let prefill_time = t0.elapsed();
    let mut ttft = None;
    let mut t_first = t0;
    // Set at once when max_tokens is 0.
    let mut finish = gen.finish_reason();
    while finish.is_none() {
        let step = gen.step(tokenizer, logits)?;
        if ttft.is_none() {
            ttft = Some(t0.elapsed());
            t_first = Instant::now();
        }
        let (tok, done) = (step.token, step.finish);
        if !step.text.is_empty() && !on_text(step.text) {
            gen.cancel();
            finish = gen.finish_reason();
            break;
        }
        finish = done;
        if finish.is_none() {
            logits = session.feed(&[tok])?;
        }
    }
    let rest = gen.flush();
    if !rest.is_empty() {
        on_text(&rest);
    }
    let decode_time = if ttft.is_some() {
        t_first.elapsed()
    } else {
        Duration::ZERO
    };
    Ok(GenerationStats {
        prompt_tokens: prompt.len(),
        reused_tokens: reused,
        generated_tokens: gen.tokens().len(),
        prefill_time,
        time_to_first_token: ttft.unwrap_or(prefill_time),
        decode_time,
        finish: finish.unwrap_or(FinishReason::Length),
        seed: gen.seed(),
        tokens: gen.take_tokens(),
        constraint_compile_time,
    })
}
