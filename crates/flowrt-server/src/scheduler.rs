//! The per-model scheduler: an actor on its own thread that owns the model's KV cache slots
//! (through a [`StepEngine`]), takes jobs from a bounded queue, and answers each job over its
//! own channel with text, logprobs and a closing summary.
//!
//! Each turn of the loop admits waiting jobs while slots are free, drops sequences whose
//! client went away (their receiver is closed), then makes **one** [`StepEngine::step`] call
//! over every active sequence's pending tokens. A decoding sequence advances by one token; a
//! new sequence's prompt is fed whole or, when the engine's batch is full, in chunks over
//! several steps (chunked prefill), and it samples its first token at the step that feeds the
//! last chunk. Its time to first token runs from admission over all those steps.
//! Each sequence's sampling, constraint, stop strings and streaming text are a
//! [`flowrt_engine::Generation`], the state machine [`flowrt_engine::generate`] runs too, so a
//! greedy answer through the server equals `flowrt run`'s. Every sequence of a batch has its
//! own constraint (or none); it masks a copy of that sequence's logits, and logprobs are
//! computed from the raw, unmasked ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_engine::{
    Constraint, EngineError, Fed, FinishReason, Generation, GenerationSettings, LoadedModel,
    SlotWork, StepEngine,
};
use flowrt_sample::SamplerConfig;
use flowrt_text::Tokenizer;
use tokio::sync::mpsc;

use crate::error::{ApiError, ErrorKind};
use crate::metrics::Metrics;

/// Most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generation request, ready to run: the prompt is tokenized and fits the context.
pub struct Job {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    /// `Some(k)`: report each generated token's logprob and its `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Keep generating past end-of-generation tokens (benchmarks' fixed-length output;
    /// ignored under a constraint, whose end-of-generation means complete).
    pub ignore_eos: bool,
    /// Constrained decoding: compiled from the model's [`LoadedModel::guide`] before the job
    /// is queued (a bad schema is the request's error, not the scheduler's). The job ends with
    /// [`FinishReason::Stop`] when the output is complete, [`FinishReason::Length`] when
    /// `max_tokens` comes first (the output is then incomplete).
    pub constraint: Option<Constraint>,
    /// Write special tokens into the text (tool-call markers the answer's parser reads).
    pub keep_special: bool,
    /// Where the answer goes. Dropping the receiver cancels the sequence within a step.
    pub events: mpsc::UnboundedSender<Event>,
}

/// A token's log-probability under the model (log-softmax of the raw logits).
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub token: u32,
    /// The token's bytes in decoded text (may be part of a character).
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The most likely tokens at this position, best first: (id, bytes, logprob).
    pub top: Vec<(u32, Vec<u8>, f32)>,
}

/// What a job's receiver gets: any number of `Text`, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// New answer text, and the logprobs of the tokens generated since the last event.
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done(Summary),
    Failed(ApiError),
}

/// How a finished job went.
#[derive(Clone, Debug)]
pub struct Summary {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV entries were reused from the slot's previous sequence.
    pub reused_tokens: usize,
    pub completion_tokens: usize,
    pub finish: FinishReason,
    /// The stop string that ended the output, if one did.
    pub stop_sequence: Option<String>,
    pub seed: u64,
    /// Waiting in the queue.
    pub queue_time: Duration,
    /// From admission to the first sampled token (prompt processing).
    pub prefill_time: Duration,
    /// From the first sampled token to the end.
    pub decode_time: Duration,
    /// The generated token ids (EOG excluded).
    pub tokens: Vec<u32>,
    /// Compiling the job's constraint ([`Constraint::compile_time`]; zero without one).
    pub constraint_compile_time: Duration,
}

/// Settings of one model's scheduler.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Jobs that may wait for a slot; beyond this, submissions fail with 429.
    pub queue: usize,
    /// Seconds a rejected client is told to wait.
    pub retry_after_s: u64,
}

/// The handle to a model's scheduler thread. Dropping it lets the thread finish the active
/// sequences and exit.
pub struct Scheduler {
    model_id: String,
    tx: mpsc::Sender<(Job, Instant)>,
    counts: Arc<Counts>,
    retry_after_s: u64,
}

/// Gauges shared with the actor.
#[derive(Default)]
pub struct Counts {
    /// Submitted, not yet admitted.
    pub queued: AtomicUsize,
    /// Admitted, not yet finished.
    pub active: AtomicUsize,
}

impl Scheduler {
    /// Start the actor thread for `model` over `engine`.
    pub fn spawn(
        model_id: String,
        model: Arc<LoadedModel>,
        engine: Box<dyn StepEngine>,
        cfg: &SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Scheduler> {
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let counts = Arc::new(Counts::default());
        let actor = Actor {
            model_id: model_id.clone(),
            model,
            free: (0..engine.slots()).rev().collect(),
            engine,
            rx,
            counts: counts.clone(),
            metrics,
            active: Vec::new(),
        };
        std::thread::Builder::new()
            .name(format!(
                "flowrt-sched-{}",
                crate::error::clip(&model_id, 40)
            ))
            .spawn(move || actor.run())?;
        Ok(Scheduler {
            model_id,
            tx,
            counts,
            retry_after_s: cfg.retry_after_s,
        })
    }

    /// Queue `job`; a full queue is a 429 with `Retry-After`.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.counts.queued.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send((job, Instant::now())) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.counts.queued.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    mpsc::error::TrySendError::Full(_) => {
                        ApiError::overloaded(&self.model_id, self.retry_after_s)
                    }
                    mpsc::error::TrySendError::Closed(_) => ApiError::internal(
                        "submitting to the model's scheduler",
                        &"the scheduler thread has stopped",
                    ),
                })
            }
        }
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Jobs queued or running.
    pub fn in_flight(&self) -> usize {
        self.counts.queued.load(Ordering::SeqCst) + self.counts.active.load(Ordering::SeqCst)
    }
}

/// One active sequence.
struct Seq {
    job: Job,
    slot: usize,
    /// Tokens to feed at the next step: the uncached prompt (less what earlier steps fed of
    /// it), then the last sampled token.
    pending: Vec<u32>,
    gen: Generation,
    /// Logprobs not yet sent with text.
    logprobs: Vec<TokenLogprob>,
    reused: usize,
    queue_time: Duration,
    admitted: Instant,
    first_token: Option<Instant>,
}

enum Outcome {
    /// Sampled a token; it is pending for the next step.
    Continue,
    /// The step fed only this many of the pending tokens (chunked prefill).
    Fed(usize),
    Finished(FinishReason),
    Failed(ApiError),
}

struct Actor {
    model_id: String,
    model: Arc<LoadedModel>,
    engine: Box<dyn StepEngine>,
    rx: mpsc::Receiver<(Job, Instant)>,
    counts: Arc<Counts>,
    metrics: Arc<Metrics>,
    /// Free slots (popped from the back).
    free: Vec<usize>,
    active: Vec<Seq>,
}

impl Actor {
    fn run(mut self) {
        tracing::debug!(model = %self.model_id, "scheduler started");
        loop {
            if self.active.is_empty() {
                match self.rx.blocking_recv() {
                    Some((job, t)) => self.admit(job, t),
                    None => break,
                }
            }
            while !self.free.is_empty() {
                match self.rx.try_recv() {
                    Ok((job, t)) => self.admit(job, t),
                    Err(_) => break,
                }
            }
            self.drop_cancelled();
            if !self.active.is_empty() {
                self.step();
            }
        }
        tracing::debug!(model = %self.model_id, "scheduler stopped");
    }

    fn admit(&mut self, mut job: Job, enqueued: Instant) {
        self.counts.queued.fetch_sub(1, Ordering::SeqCst);
        if job.events.is_closed() {
            self.record(&job, 0, "cancelled", None, None);
            return;
        }
        let n_ctx = self.engine.n_ctx();
        if job.prompt.is_empty() || job.prompt.len() + 1 > n_ctx {
            let _ = job.events.send(Event::Failed(ApiError::new(
                ErrorKind::ContextLength,
                format!(
                    "the prompt has {} tokens; this model's context holds {n_ctx} (prompt plus at least 1 generated token)",
                    job.prompt.len()
                ),
            )));
            return;
        }
        let settings = GenerationSettings {
            sampler: job.sampler.clone(),
            stop: job.stop.clone(),
            max_tokens: job.max_tokens,
            ignore_eos: job.ignore_eos,
            n_ctx,
            n_logits: self.model.model.config.vocab_size,
            keep_special: job.keep_special,
        };
        let gen = match Generation::new(
            &self.model.tokenizer,
            &job.prompt,
            settings,
            job.constraint.take(),
        ) {
            Ok(g) => g,
            Err(e) => {
                let _ = job
                    .events
                    .send(Event::Failed(ApiError::invalid(e.to_string())));
                return;
            }
        };
        // Prefer the free slot whose cache shares the longest prefix with this prompt.
        let (pos, reused) = self
            .free
            .iter()
            .enumerate()
            .map(|(i, &slot)| (i, self.engine.cached_prefix(slot, &job.prompt)))
            .max_by_key(|&(i, n)| (n, i))
            .unwrap_or((0, 0));
        let slot = self.free.swap_remove(pos);
        self.engine.truncate(slot, reused);
        self.counts.active.fetch_add(1, Ordering::SeqCst);
        self.active.push(Seq {
            pending: job.prompt[reused..].to_vec(),
            gen,
            logprobs: Vec::new(),
            slot,
            reused,
            queue_time: enqueued.elapsed(),
            admitted: Instant::now(),
            first_token: None,
            job,
        });
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].job.events.is_closed() {
                let seq = self.active.swap_remove(i);
                self.release(&seq);
                let generated = seq.gen.tokens().len();
                self.record(&seq.job, generated, "cancelled", None, None);
                tracing::info!(model = %self.model_id, generated, "client went away; sequence cancelled");
            } else {
                i += 1;
            }
        }
    }

    fn release(&mut self, seq: &Seq) {
        self.free.push(seq.slot);
        self.counts.active.fetch_sub(1, Ordering::SeqCst);
    }

    /// One engine step over every active sequence, then sampling and streaming for those
    /// whose tokens were all fed; a sequence the step fed only part of keeps the rest pending.
    fn step(&mut self) {
        let mut pending: Vec<Vec<u32>> = self
            .active
            .iter_mut()
            .map(|s| std::mem::take(&mut s.pending))
            .collect();
        let work: Vec<SlotWork<'_>> = self
            .active
            .iter()
            .zip(&pending)
            .map(|(s, p)| SlotWork {
                slot: s.slot,
                tokens: p,
            })
            .collect();
        let tokenizer = &self.model.tokenizer;
        let active = &mut self.active;
        // An item the engine did not report on keeps all its tokens pending.
        let mut outcomes: Vec<Outcome> = (0..active.len()).map(|_| Outcome::Fed(0)).collect();
        self.engine.step(&work, &mut |i, fed| {
            outcomes[i] = match fed {
                Ok(Fed::All(logits)) => advance(&mut active[i], logits, tokenizer),
                Ok(Fed::Part(n)) => Outcome::Fed(n),
                Err(e) => Outcome::Failed(engine_error(e)),
            };
        });
        drop(work);
        for i in (0..outcomes.len()).rev() {
            match std::mem::replace(&mut outcomes[i], Outcome::Continue) {
                Outcome::Continue => {}
                Outcome::Fed(n) => {
                    // Not sampled this step: the rest of its prompt goes to the next one.
                    let mut rest = std::mem::take(&mut pending[i]);
                    rest.drain(..n.min(rest.len()));
                    self.active[i].pending = rest;
                }
                Outcome::Finished(reason) => {
                    let seq = self.active.swap_remove(i);
                    self.release(&seq);
                    self.finish(seq, reason);
                }
                Outcome::Failed(e) => {
                    let seq = self.active.swap_remove(i);
                    self.release(&seq);
                    self.engine.truncate(seq.slot, 0);
                    self.record(&seq.job, seq.gen.tokens().len(), "error", None, None);
                    let _ = seq.job.events.send(Event::Failed(e));
                }
            }
        }
    }

    fn finish(&mut self, mut seq: Seq, finish: FinishReason) {
        // Text held back because it might have begun a stop string is the answer's after all
        // (none after a stop string); logprobs not yet sent go with it.
        let rest = seq.gen.flush();
        if !rest.is_empty() || !seq.logprobs.is_empty() {
            let logprobs = std::mem::take(&mut seq.logprobs);
            let _ = seq.job.events.send(Event::Text {
                text: rest,
                logprobs,
            });
        }
        let now = Instant::now();
        let first = seq.first_token.unwrap_or(now);
        let prefill_time = first - seq.admitted;
        let decode_time = now - first;
        let ttft = seq.queue_time + prefill_time;
        let generated = seq.gen.tokens().len();
        let tps = (generated > 1 && decode_time > Duration::ZERO)
            .then(|| (generated - 1) as f64 / decode_time.as_secs_f64());
        let label = match finish {
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::ContextFull => "length",
            FinishReason::Cancelled => "cancelled",
        };
        self.record(
            &seq.job,
            generated,
            label,
            seq.first_token.map(|_| ttft.as_secs_f64()),
            tps,
        );
        let summary = Summary {
            prompt_tokens: seq.job.prompt.len(),
            reused_tokens: seq.reused,
            completion_tokens: generated,
            finish,
            stop_sequence: seq.gen.matched_stop().map(str::to_string),
            seed: seq.gen.seed(),
            queue_time: seq.queue_time,
            prefill_time,
            decode_time,
            tokens: seq.gen.take_tokens(),
            constraint_compile_time: seq
                .gen
                .constraint()
                .map_or(Duration::ZERO, |c| c.compile_time),
        };
        let _ = seq.job.events.send(Event::Done(summary));
    }

    fn record(
        &self,
        job: &Job,
        generated: usize,
        finish: &'static str,
        ttft: Option<f64>,
        tps: Option<f64>,
    ) {
        self.metrics.sequence(
            &self.model_id,
            job.prompt.len(),
            generated,
            finish,
            ttft,
            tps,
        );
    }
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::PromptTooLong { .. } => ApiError::new(ErrorKind::ContextLength, e.to_string()),
        other => ApiError::internal("running the model", &other),
    }
}

/// Sample the next token of `seq` from `logits` and stream what it completes.
fn advance(seq: &mut Seq, logits: &[f32], tokenizer: &Tokenizer) -> Outcome {
    let step = match seq.gen.step(tokenizer, logits) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(ApiError::internal("generating a token", &e)),
    };
    if seq.first_token.is_none() {
        seq.first_token = Some(Instant::now());
    }
    let (tok, finish) = (step.token, step.finish);
    if step.accepted {
        if let Some(k) = seq.job.logprobs {
            // From the raw logits: what the model thinks, not what a constraint allowed.
            seq.logprobs.push(token_logprob(tokenizer, logits, tok, k));
        }
    }
    if !step.text.is_empty() {
        let text = step.text.to_string();
        let logprobs = std::mem::take(&mut seq.logprobs);
        if seq.job.events.send(Event::Text { text, logprobs }).is_err() {
            seq.gen.cancel();
            return Outcome::Finished(FinishReason::Cancelled);
        }
    }
    match finish {
        Some(reason) => Outcome::Finished(reason),
        None => {
            seq.pending.push(tok);
            Outcome::Continue
        }
    }
}

/// The log-probability of `tok` and the `k` most likely tokens under `logits`.
fn token_logprob(tokenizer: &Tokenizer, logits: &[f32], tok: u32, k: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    let log_z = max as f64 + sum.ln();
    let lp = |id: u32| -> f32 {
        let l = logits[id as usize];
        if l.is_finite() {
            (l as f64 - log_z) as f32
        } else {
            f32::NEG_INFINITY
        }
    };
    let bytes = |id: u32| {
        tokenizer
            .token_to_piece(id)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    };
    // The k best by a single pass keeping a small sorted list.
    let k = k.min(MAX_TOP_LOGPROBS);
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (id, &l) in logits.iter().enumerate() {
            if !l.is_finite() || (best.len() == k && l <= best[k - 1].1) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (id as u32, l));
            best.truncate(k);
        }
    }
    TokenLogprob {
        token: tok,
        bytes: bytes(tok),
        logprob: lp(tok),
        top: best
            .into_iter()
            .map(|(id, _)| (id, bytes(id), lp(id)))
            .collect(),
    }
}
