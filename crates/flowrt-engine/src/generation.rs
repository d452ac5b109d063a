//! One sequence's generation state machine: sampling (optionally under a constraint),
//! end-of-generation, stop strings, streamed text, `max_tokens` and the context limit.
//!
//! [`crate::generate`] (one [`crate::Session`], what `flowrt run` uses) and the server's
//! scheduler (many sequences stepped together over a [`crate::BatchSession`]) both drive a
//! [`Generation`]: feed the model, hand the logits after the last token to
//! [`Generation::step`], show the text it returns, feed the token it sampled, until it reports
//! a [`FinishReason`]; then [`Generation::flush`] gives the text held back at the end. The
//! caller owns the model and the clock (prefill, time to first token, decode time) and how text
//! is delivered: when a reader goes away it calls [`Generation::cancel`].
//!
//! Not done here: speculative decoding, per-token logprobs (the server computes those itself
//! from the raw, unmasked logits), and any limit other than `max_tokens` and the context.

use flowrt_sample::{Sampler, SamplerConfig, StopMatcher};
use flowrt_text::{TokenStreamDecoder, Tokenizer};

use crate::constraint::Constraint;
use crate::error::EngineError;
use crate::generate::FinishReason;

/// The settings of one generation.
#[derive(Clone, Debug)]
pub struct GenerationSettings {
    pub sampler: SamplerConfig,
    /// Stop strings: the output ends before the first occurrence of any.
    pub stop: Vec<String>,
    /// Most tokens to generate; 0 finishes at once with [`FinishReason::Length`].
    pub max_tokens: usize,
    /// Keep generating past end-of-generation tokens (benchmarks; random-weight models).
    /// Ignored under a constraint: there end-of-generation is only allowed where the output
    /// is complete, and it ends the generation.
    pub ignore_eos: bool,
    /// Positions of the sequence's context: when the next token would not fit, the
    /// generation ends with [`FinishReason::ContextFull`].
    pub n_ctx: usize,
    /// Logits per step (the model's vocabulary rows).
    pub n_logits: usize,
    /// Write special (control) tokens into the text, e.g. a tool-call marker such as
    /// `[TOOL_CALLS]` or `<|python_tag|>` that a parser must see; otherwise they are skipped.
    /// End-of-generation tokens never reach the text either way.
    pub keep_special: bool,
}

/// What one [`Generation::step`] did.
#[derive(Debug)]
pub struct Step<'a> {
    /// The token sampled. Unless it ended the generation, it is to be fed to the model next.
    pub token: u32,
    /// Whether `token` joined the output; `false` for an end-of-generation token that ended
    /// it (such a token is never part of the output).
    pub accepted: bool,
    /// Text now safe to show (possibly empty): what the token completes, less any tail held
    /// back because it might begin a stop string.
    pub text: &'a str,
    /// Set when the generation is over; `None`: feed `token` and step again.
    pub finish: Option<FinishReason>,
}

/// One sequence's generation: sampler, optional compiled [`Constraint`] (with the buffer its
/// masked logits go to), stream decoder, stop matcher, the tokens generated and the limits.
///
/// Each [`Generation::step`], in order: sample (from a masked copy of the logits under a
/// constraint; the caller's logits are left as they are); an end-of-generation token ends it
/// with [`FinishReason::Stop`] unless `ignore_eos` (without a constraint); otherwise the token
/// joins the output and the constraint, its text goes through the stop matcher, and the first
/// of these ends the generation: a stop string ([`FinishReason::Stop`]), the constraint
/// complete ([`FinishReason::Stop`]), `max_tokens` reached ([`FinishReason::Length`], also
/// when a constraint is not complete: the output is then incomplete), the next token not
/// fitting the context ([`FinishReason::ContextFull`]).
pub struct Generation {
    sampler: Sampler,
    constraint: Option<Constraint>,
    /// The masked copy of each step's logits (`n_logits` long under a constraint, else empty).
    masked: Vec<f32>,
    decoder: TokenStreamDecoder,
    stops: StopMatcher,
    out: Vec<u32>,
    max_tokens: usize,
    ignore_eos: bool,
    prompt_len: usize,
    n_ctx: usize,
    finish: Option<FinishReason>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("tokens", &self.out.len())
            .field("max_tokens", &self.max_tokens)
            .field("constraint", &self.constraint)
            .field("finish", &self.finish)
            .finish()
    }
}

impl Generation {
    /// A generation continuing `prompt` (its tokens feed the sampler's repetition penalties;
    /// the caller feeds them to the model). `constraint`, compiled for `n_logits` logits,
    /// masks every step.
    pub fn new(
        tokenizer: &Tokenizer,
        prompt: &[u32],
        settings: GenerationSettings,
        constraint: Option<Constraint>,
    ) -> Result<Generation, EngineError> {
        let GenerationSettings {
            sampler,
            stop,
            max_tokens,
            ignore_eos,
            n_ctx,
            n_logits,
            keep_special,
        } = settings;
        let mut sampler = Sampler::new(sampler, n_logits)?;
        if let Some(c) = &constraint {
            if c.n_logits() != n_logits {
                return Err(EngineError::Invalid(format!(
                    "the constraint was compiled for {} logits, the model has {n_logits}",
                    c.n_logits()
                )));
            }
        }
        for &t in prompt {
            sampler.accept(t);
        }
        let masked = if constraint.is_some() {
            vec![0.0; n_logits]
        } else {
            Vec::new()
        };
        Ok(Generation {
            sampler,
            constraint,
            masked,
            decoder: tokenizer.stream_decoder(!keep_special),
            stops: StopMatcher::new(stop),
            out: Vec::with_capacity(max_tokens.min(n_ctx)),
            max_tokens,
            ignore_eos,
            prompt_len: prompt.len(),
            n_ctx,
            finish: (max_tokens == 0).then_some(FinishReason::Length),
        })
    }

    /// Sample the next token from `logits` (the model's output after the last token fed) and
    /// advance. An error leaves the generation unusable (the caller fails the sequence);
    /// stepping a finished generation is an error.
    pub fn step(&mut self, tokenizer: &Tokenizer, logits: &[f32]) -> Result<Step<'_>, EngineError> {
        if let Some(f) = self.finish {
            return Err(EngineError::Invalid(format!(
                "the generation has already finished ({f:?})"
            )));
        }
        let tok = match self.constraint.as_mut() {
            Some(c) => {
                if logits.len() != self.masked.len() {
                    return Err(EngineError::Invalid(format!(
                        "{} logits, the generation was set up for {}",
                        logits.len(),
                        self.masked.len()
                    )));
                }
                self.masked.copy_from_slice(logits);
                c.mask(&mut self.masked)?;
                self.sampler.sample(&self.masked)?
            }
            None => self.sampler.sample(logits)?,
        };
        // Under a constraint, end-of-generation is only allowed where the output is complete.
        if (!self.ignore_eos || self.constraint.is_some()) && tokenizer.is_eog(tok) {
            self.finish = Some(FinishReason::Stop);
            return Ok(Step {
                token: tok,
                accepted: false,
                text: "",
                finish: self.finish,
            });
        }
        self.sampler.accept(tok);
        self.out.push(tok);
        if let Some(c) = self.constraint.as_mut() {
            c.accept(tok)?;
        }
        let piece = self.decoder.push(tokenizer, tok)?;
        let r = self.stops.push(piece);
        self.finish = if r.stopped || self.constraint.as_ref().is_some_and(|c| c.is_finished()) {
            Some(FinishReason::Stop)
        } else if self.out.len() >= self.max_tokens {
            Some(FinishReason::Length)
        } else if self.prompt_len + self.out.len() > self.n_ctx {
            // The cache holds prompt + out - 1 tokens; feeding `tok` needs one more position.
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        Ok(Step {
            token: tok,
            accepted: true,
            text: r.emit,
            finish: self.finish,
        })
    }

    /// The reader went away: the generation ends with [`FinishReason::Cancelled`] and
    /// [`Generation::flush`] gives nothing more.
    pub fn cancel(&mut self) {
        self.finish = Some(FinishReason::Cancelled);
    }

    /// The text held back at the end (a tail that might have begun a stop string, bytes of an
    /// incomplete character), which is the answer's after all; empty when a stop string
    /// ended the output or the generation was cancelled. Call once, after the last step.
    pub fn flush(&mut self) -> String {
        if self.stops.is_stopped() || self.finish == Some(FinishReason::Cancelled) {
            return String::new();
        }
        let tail = self.decoder.finish();
        let mut rest = self.stops.push(tail).emit.to_string();
        rest.push_str(self.stops.finish().emit);
        rest
    }

    /// Why the generation ended; `None` while it goes on.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// The stop string that ended the output, if one did (also one found in the tail given
    /// back by [`Generation::flush`]).
    pub fn matched_stop(&self) -> Option<&str> {
        self.stops.matched_stop()
    }

    /// The generated tokens (stop strings included; end-of-generation excluded).
    pub fn tokens(&self) -> &[u32] {
        &self.out
    }

    /// The generated tokens, taken out.
    pub fn take_tokens(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.out)
    }

    /// The sampler's seed (the one drawn when the settings gave none).
    pub fn seed(&self) -> u64 {
        self.sampler.seed()
    }

    /// The constraint, if any.
    pub fn constraint(&self) -> Option<&Constraint> {
        self.constraint.as_ref()
    }
}
