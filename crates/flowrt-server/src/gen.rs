//! What the OpenAI and Ollama routes share: sampling parameters, prompt tokenization, the
//! context check, compiling a constraint, submitting a job, and collecting or streaming its
//! events.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use flowrt_engine::{Constraint, ConstraintError, ConstraintSpec, FinishReason};
use flowrt_sample::{SampleError, SamplerConfig};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};

use crate::agent::{plan_chat, ChatInput, OutputShape};
use crate::error::{clip, ApiError, ErrorKind};
use crate::models::Runner;
use crate::scheduler::{Event, Job, Summary, TokenLogprob};
use crate::AppState;

/// The prompt of a request, before tokenization.
pub enum PromptInput {
    /// Rendered with the model's chat template (generation prompt added), with tools and
    /// reasoning switches.
    Chat(ChatInput),
    /// Plain text; `add_special` adds BOS as `flowrt run --raw` does.
    Text { text: String, add_special: bool },
    /// Token ids as given.
    Tokens(Vec<u32>),
}

/// Sampling parameters as requests give them; `None` takes the route's default.
#[derive(Default, Clone, Debug)]
pub struct SamplingParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub seed: Option<i64>,
}

impl SamplingParams {
    /// Validate and fill in from `defaults`.
    pub fn to_config(&self, defaults: &SamplerConfig) -> Result<SamplerConfig, ApiError> {
        let mut c = defaults.clone();
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::invalid_param(
                    "temperature",
                    format!("temperature must be between 0 and 2, got {t}"),
                ));
            }
            c.temperature = t;
        }
        if let Some(p) = self.top_p {
            c.top_p = p;
        }
        if let Some(k) = self.top_k {
            c.top_k = usize::try_from(k).unwrap_or(usize::MAX);
        }
        if let Some(p) = self.min_p {
            c.min_p = p;
        }
        for (name, v, slot) in [
            (
                "presence_penalty",
                self.presence_penalty,
                &mut c.presence_penalty,
            ),
            (
                "frequency_penalty",
                self.frequency_penalty,
                &mut c.frequency_penalty,
            ),
        ] {
            if let Some(v) = v {
                if !(-2.0..=2.0).contains(&v) {
                    return Err(ApiError::invalid_param(
                        name,
                        format!("{name} must be between -2 and 2, got {v}"),
                    ));
                }
                *slot = v;
            }
        }
        if let Some(r) = self.repeat_penalty {
            c.repeat_penalty = r;
        }
        if let Some(n) = self.repeat_last_n {
            c.repeat_last_n = match n {
                n if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
                _ => {
                    return Err(ApiError::invalid_param(
                        "repeat_last_n",
                        format!("repeat_last_n must be >= 0, got {n}"),
                    ))
                }
            };
        }
        if let Some(s) = self.seed {
            c.seed = Some(s as u64);
        }
        c.validate().map_err(|e| {
            let param = match e {
                SampleError::InvalidTemperature { .. } => "temperature",
                SampleError::InvalidTopP { .. } => "top_p",
                SampleError::InvalidMinP { .. } => "min_p",
                SampleError::InvalidRepeatPenalty { .. } => "repeat_penalty",
                SampleError::InvalidRepeatLastN { .. } => "repeat_last_n",
                SampleError::InvalidPresencePenalty { .. } => "presence_penalty",
                SampleError::InvalidFrequencyPenalty { .. } => "frequency_penalty",
                SampleError::InvalidLogitBias { .. } | SampleError::LogitBiasOutOfVocab { .. } => {
                    "logit_bias"
                }
                _ => "sampling",
            };
            ApiError::invalid_param(param, e.to_string())
        })?;
        Ok(c)
    }
}

/// Most entries a `logit_bias` map may hold.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// OpenAI's `logit_bias`: a map from token id (a decimal string) to a bias in [-100, 100]
/// added to that token's logit. Ids are checked against the model's vocabulary when the
/// model is known ([`start`]).
pub fn parse_logit_bias(
    v: Option<&serde_json::Value>,
    param: &str,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid_param(param, format!("`{param}` {m}"));
    let map = match v {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Object(m)) => m,
        Some(_) => {
            return Err(bad(
                "must be an object mapping token ids to biases".to_string()
            ))
        }
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(bad(format!(
            "may hold at most {MAX_LOGIT_BIAS} tokens, got {}",
            map.len()
        )));
    }
    map.iter()
        .map(|(k, b)| {
            let id: u32 = k.parse().map_err(|_| {
                bad(format!(
                    "keys must be token ids (decimal integers), got `{}`",
                    clip(k, 40)
                ))
            })?;
            match b.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(bad(format!(
                    "values must be numbers between -100 and 100, got {} for token {id}",
                    clip(&b.to_string(), 40)
                ))),
            }
        })
        .collect()
}

/// `stop` as a string or a list of strings (at most 16, each at most 256 bytes).
pub fn parse_stop(v: Option<&serde_json::Value>, param: &str) -> Result<Vec<String>, ApiError> {
    let bad = |m: &str| ApiError::invalid_param(param, format!("`{param}` {m}"));
    let stops = match v {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("must hold only strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("must be a string or a list of strings")),
    };
    if stops.len() > 16 {
        return Err(bad("may hold at most 16 strings"));
    }
    if stops.iter().any(|s| s.len() > 256) {
        return Err(bad("strings may be at most 256 bytes long"));
    }
    Ok(stops)
}

/// One generation, as the routes ask for it.
pub struct GenRequest {
    pub prompt: PromptInput,
    /// `None`: up to the end of the context.
    pub max_tokens: Option<u64>,
    /// Where `max_tokens` came from, for error messages.
    pub max_tokens_param: &'static str,
    /// Beyond the context, clamp `max_tokens` (Ollama) instead of refusing (OpenAI).
    pub clamp_max_tokens: bool,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// Constrained decoding (`None`: unconstrained).
    pub constraint: Option<ConstraintRequest>,
}

/// A request's constraint and the parameter it came from.
#[derive(Clone, Debug)]
pub struct ConstraintRequest {
    pub spec: ConstraintSpec,
    /// The request parameter that gave it (e.g. `response_format`), named by a 400 when the
    /// schema or grammar is bad.
    pub param: &'static str,
}

/// A submitted job: its events, and the model that runs it.
pub struct Started {
    pub runner: Arc<Runner>,
    /// How to read the answer (tool calls, reasoning); default for non-chat prompts.
    pub shape: OutputShape,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub prompt_tokens: Vec<u32>,
    _guard: UseGuard,
}

/// Marks the model used when the request ends (the keep-alive counts from then).
struct UseGuard(Arc<Runner>);

impl Drop for UseGuard {
    fn drop(&mut self) {
        self.0.touch();
    }
}

/// Resolve the model, tokenize, check the context, and queue the job.
pub async fn start(state: &AppState, model: &str, req: GenRequest) -> Result<Started, ApiError> {
    let mut started = start_n(state, model, req, 1).await?;
    Ok(started.remove(0))
}

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// [`start`] for `n` independent sequences of one prompt (OpenAI's `n`): tokenized once,
/// queued together so the scheduler batches them, choice `i` sampling with seed `seed + i`
/// when the request gives a seed (each draws its own otherwise) and with its own copy of the
/// constraint. If any cannot be queued (429), the ones queued before it are cancelled.
pub async fn start_n(
    state: &AppState,
    model: &str,
    req: GenRequest,
    choices: usize,
) -> Result<Vec<Started>, ApiError> {
    if req.max_tokens == Some(0) {
        return Err(ApiError::invalid_param(
            req.max_tokens_param,
            format!("`{}` must be at least 1", req.max_tokens_param),
        ));
    }
    let runner = state.models.get(model).await?;
    let Some(scheduler) = runner.scheduler.as_ref() else {
        return Err(ApiError::invalid_param(
            "model",
            format!(
                "model `{}` only embeds (it has no output projection): use POST /v1/embeddings or /api/embed",
                runner.spec.id
            ),
        ));
    };
    let vocab = runner.model.model.config.vocab_size;
    if let Some(&(id, _)) = req
        .sampler
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= vocab)
    {
        return Err(ApiError::invalid_param(
            "logit_bias",
            format!("`logit_bias` names token {id}, outside the vocabulary of {vocab} tokens"),
        ));
    }
    let (tokens, plan) = tokenize_bounded(state, &runner, req.prompt).await?;
    let (shape, keep_special, tool_constraint) = match plan {
        Some(p) => (p.shape, p.keep_special, p.tool_constraint),
        None => (OutputShape::default(), false, None),
    };
    let n = tokens.len();
    let n_ctx = runner.n_ctx;
    let id = &runner.spec.id;
    if n == 0 {
        return Err(ApiError::invalid_param(
            "prompt",
            "the prompt is empty (it has no tokens)",
        ));
    }
    if n + 1 > n_ctx {
        return Err(ApiError::new(
            ErrorKind::ContextLength,
            format!("the prompt has {n} tokens, but the context of model `{id}` holds {n_ctx} tokens including at least 1 to generate; shorten the prompt"),
        )
        .with_param("messages"));
    }
    let room = n_ctx - n;
    let max_tokens = match req.max_tokens {
        None => room,
        Some(m) if m as u128 <= room as u128 => m as usize,
        Some(_) if req.clamp_max_tokens => room,
        Some(m) => {
            return Err(ApiError::new(
                ErrorKind::ContextLength,
                format!("the prompt has {n} tokens and `{p}` asks for {m} more, but the context of model `{id}` holds {n_ctx} tokens; set `{p}` to at most {room} or shorten the prompt", p = req.max_tokens_param),
            )
            .with_param(req.max_tokens_param))
        }
    };
    // Compiled before queueing, off the async workers (the first compile for a model also
    // builds its token environment), so a bad schema is this request's 400. A tool-call
    // constraint was compiled with the prompt (`plan_chat`); a request cannot have both.
    if choices > 1 && tool_constraint.is_some() {
        return Err(ApiError::invalid_param(
            "n",
            "`n` > 1 is not supported together with `tools`: ask for one choice",
        ));
    }
    let constraints: Vec<Option<Constraint>> = match req.constraint {
        None => std::iter::once(tool_constraint)
            .chain(std::iter::repeat_with(|| None))
            .take(choices)
            .collect(),
        Some(c) => {
            let model = runner.model.clone();
            tokio::task::spawn_blocking(move || {
                let guide = model.guide().map_err(|e| constraint_error(c.param, e))?;
                (0..choices)
                    .map(|_| {
                        guide
                            .compile(&c.spec)
                            .map(Some)
                            .map_err(|e| constraint_error(c.param, e))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await
            .map_err(|e| ApiError::internal("compiling the constraint", &e))??
        }
    };
    let mut started = Vec::with_capacity(choices);
    for (i, constraint) in constraints.into_iter().enumerate() {
        let mut sampler = req.sampler.clone();
        sampler.seed = sampler.seed.map(|s| s.wrapping_add(i as u64));
        let (tx, rx) = mpsc::unbounded_channel();
        scheduler.submit(Job {
            prompt: tokens.clone(),
            max_tokens,
            sampler,
            stop: req.stop.clone(),
            logprobs: req.logprobs,
            ignore_eos: req.ignore_eos,
            constraint,
            keep_special,
            events: tx,
        })?;
        started.push(Started {
            shape,
            _guard: UseGuard(runner.clone()),
            runner: runner.clone(),
            events: rx,
            prompt_tokens: tokens.clone(),
        });
    }
    Ok(started)
}

/// A constraint that does not compile is the request's error, naming `param`; a failure
/// inside the constraint library is the server's.
fn constraint_error(param: &str, e: ConstraintError) -> ApiError {
    match e {
        ConstraintError::Runtime(_) => ApiError::internal("compiling the constraint", &e),
        ConstraintError::UnsupportedKeyword { .. }
        | ConstraintError::InvalidSchema(_)
        | ConstraintError::InvalidGrammar { .. }
        | ConstraintError::Vocabulary(_) => {
            ApiError::invalid_param(param, format!("`{param}`: {}", clip(&e.to_string(), 600)))
        }
    }
}

/// The prompt's tokens, and for a chat the rest of its plan (constraint, answer shape).
pub(crate) type Tokenized = (Vec<u32>, Option<crate::agent::ChatPlan>);

/// Tokenize `prompt` for `runner`'s model with bounded work: at most one prompt per
/// `--parallel` slot is tokenized at once, off the async workers, and a prompt whose text is
/// longer than the context could hold is refused before the tokenizer sees it.
pub(crate) async fn tokenize_bounded(
    state: &AppState,
    runner: &Arc<Runner>,
    prompt: PromptInput,
) -> Result<Tokenized, ApiError> {
    let _permit = tokenize_turn(state, runner).await?;
    let r = runner.clone();
    let metrics = state.metrics.clone();
    tokio::task::spawn_blocking(move || tokenize(&r, prompt, &metrics))
        .await
        .map_err(|e| ApiError::internal("tokenizing the prompt", &e))?
}

/// A turn to tokenize on `runner`: one of its `--parallel` permits. The line for a turn is as
/// long as the job queue (`--queue`): a request that finds it full is a 429, as one that finds
/// the job queue full is, so a flood of prompts cannot pile up in memory before the queue sees
/// them. A request that goes away while it waits leaves the line.
pub(crate) async fn tokenize_turn<'a>(
    state: &AppState,
    runner: &'a Runner,
) -> Result<tokio::sync::SemaphorePermit<'a>, ApiError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct InLine<'a>(&'a AtomicUsize);
    impl Drop for InLine<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let line = &runner.tokenize_waiting;
    if line.fetch_add(1, Ordering::SeqCst) >= state.config.queue.max(1) {
        line.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::overloaded(&runner.spec.id, 1));
    }
    let _in_line = InLine(line);
    runner
        .tokenizing
        .acquire()
        .await
        .map_err(|e| ApiError::internal("waiting to tokenize the prompt", &e))
}

/// A prompt of `len` bytes of text (`param` names the request field it came from) cannot
/// fit `runner`'s context when it is longer than `n_ctx` tokens of the vocabulary's longest
/// token could spell: a 400 before any tokenizing.
fn check_prompt_bytes(runner: &Runner, len: usize, param: &str) -> Result<(), ApiError> {
    let max = runner.n_ctx.saturating_mul(runner.max_token_bytes);
    if len <= max {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorKind::ContextLength,
        format!(
            "`{param}` holds {len} bytes of prompt text, more than the context of model `{id}` ({n_ctx} tokens of at most {b} bytes each, {max} bytes) could hold; shorten the prompt",
            id = runner.spec.id,
            n_ctx = runner.n_ctx,
            b = runner.max_token_bytes,
        ),
    )
    .with_param(param))
}

pub(crate) fn tokenize(
    runner: &Runner,
    prompt: PromptInput,
    metrics: &crate::Metrics,
) -> Result<Tokenized, ApiError> {
    let model = &runner.model;
    let name = runner.spec.id.as_str();
    let enc_err = |e: flowrt_text::TextError| {
        ApiError::invalid_param(
            "prompt",
            format!(
                "the prompt could not be tokenized: {}",
                clip(&e.to_string(), 300)
            ),
        )
    };
    match prompt {
        PromptInput::Chat(input) => {
            let plan = plan_chat(model, input, name)?;
            let text = plan.prompt.text();
            check_prompt_bytes(runner, text.len(), "messages")?;
            metrics.tokenized(text.len());
            // Message text is never parsed into control tokens (see `ChatPrompt`).
            let ids = model.tokenizer.encode_chat(&plan.prompt).map_err(enc_err)?;
            Ok((ids, Some(plan)))
        }
        PromptInput::Text { text, add_special } => {
            check_prompt_bytes(runner, text.len(), "prompt")?;
            metrics.tokenized(text.len());
            model
                .tokenizer
                .encode(&text, add_special, true)
                .map(|ids| (ids, None))
                .map_err(enc_err)
        }
        PromptInput::Tokens(ids) => {
            let vocab = model.model.config.vocab_size;
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
                ));
            }
            Ok((ids, None))
        }
    }
}

/// The whole answer of a non-streaming request.
pub struct Collected {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub summary: Summary,
}

/// Wait for every event of a job.
pub async fn collect(started: &mut Started) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = started.events.recv().await {
        match ev {
            Event::Text {
                text: t,
                logprobs: l,
            } => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            Event::Done(summary) => {
                return Ok(Collected {
                    text,
                    logprobs,
                    summary,
                })
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "generating",
        &"the scheduler dropped the request",
    ))
}

/// OpenAI's `finish_reason` (and Ollama's `done_reason`).
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

/// A streaming response fed by `frames`: the body ends when the sender is dropped, and a
/// client that disconnects drops the receiver (which the producer notices).
pub fn stream_response(content_type: &'static str, frames: mpsc::Receiver<String>) -> Response {
    let body =
        Body::from_stream(ReceiverStream::new(frames).map(|s| Ok::<_, Infallible>(Bytes::from(s))));
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Drive a started job into `frames`: `on_event` turns each event into frames and says
/// whether they were the last; returns when they were or the client goes away (then dropping
/// the job's receiver cancels it).
pub fn spawn_stream<F>(started: Started, frames: mpsc::Sender<String>, mut on_event: F)
where
    F: FnMut(Event) -> (Vec<String>, bool) + Send + 'static,
{
    spawn_streams(vec![started], frames, move |_, ev| on_event(ev));
}

/// [`spawn_stream`] for several jobs (the choices of one request): their events interleave
/// as they come, each with its job's index; `on_event` says when the stream is over (after
/// the last job's end, or at a failure). A client that goes away cancels every job.
pub fn spawn_streams<F>(started: Vec<Started>, frames: mpsc::Sender<String>, mut on_event: F)
where
    F: FnMut(usize, Event) -> (Vec<String>, bool) + Send + 'static,
{
    let mut guards = Vec::with_capacity(started.len());
    let mut events =
        futures_util::stream::select_all(started.into_iter().enumerate().map(|(i, s)| {
            guards.push((s.runner, s._guard));
            UnboundedReceiverStream::new(s.events).map(move |ev| (i, ev))
        }));
    tokio::spawn(async move {
        loop {
            let ev = tokio::select! {
                _ = frames.closed() => break,
                ev = events.next() => ev,
            };
            let Some((i, ev)) = ev else { break };
            let (out, last) = on_event(i, ev);
            for f in out {
                if frames.send(f).await.is_err() {
                    return;
                }
            }
            if last {
                break;
            }
        }
        drop(events);
        drop(guards);
    });
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh response id with `prefix`.
pub fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("{prefix}-{t:x}{n:04x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelSpec, ServerConfig};
    use flowrt_engine::EngineOptions;

    fn state() -> AppState {
        let path = std::path::PathBuf::from(
            std::env::var_os("FLOWRT_SMOLLM2_GGUF").expect("FLOWRT_SMOLLM2_GGUF is set"),
        );
        let size = std::fs::metadata(&path).unwrap().len();
        let spec = ModelSpec::new("smollm2:135m", path, "ab".repeat(32), size, "test").unwrap();
        AppState::new(
            vec![spec],
            ServerConfig {
                engine: EngineOptions {
                    threads: 2,
                    n_ctx: Some(256),
                    ..EngineOptions::default()
                },
                parallel: 2,
                queue: 4,
                ..ServerConfig::default()
            },
        )
    }

    fn request(spec: ConstraintSpec, max_tokens: u64) -> GenRequest {
        GenRequest {
            prompt: PromptInput::Chat(ChatInput::plain(vec![flowrt_text::ChatMessage::new(
                "user",
                "Say hi as JSON.",
            )])),
            max_tokens: Some(max_tokens),
            max_tokens_param: "max_tokens",
            clamp_max_tokens: false,
            sampler: SamplerConfig {
                temperature: 1.0,
                seed: Some(3),
                ..SamplerConfig::default()
            },
            stop: Vec::new(),
            logprobs: None,
            ignore_eos: false,
            constraint: Some(ConstraintRequest {
                spec,
                param: "response_format",
            }),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_constraint_is_compiled_before_queueing_and_a_bad_one_is_a_400_naming_its_param() {
        let state = state();
        for (spec, needle) in [
            (
                ConstraintSpec::JsonSchema(serde_json::json!({"type": "nonsense"})),
                "invalid JSON schema",
            ),
            (
                ConstraintSpec::JsonSchema(serde_json::json!({
                    "type": "array", "uniqueItems": true
                })),
                "uniqueItems",
            ),
            (
                ConstraintSpec::Regex("(unclosed".into()),
                "regular expression",
            ),
        ] {
            let e = match start(&state, "smollm2:135m", request(spec, 8)).await {
                Ok(_) => panic!("a bad constraint was queued"),
                Err(e) => e,
            };
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{e:?}");
            assert_eq!(e.param.as_deref(), Some("response_format"), "{e:?}");
            assert!(e.message.contains(needle), "{e:?}");
        }
        let mut started = start(
            &state,
            "smollm2:135m",
            request(ConstraintSpec::JsonObject, 200),
        )
        .await
        .unwrap();
        let c = collect(&mut started).await.unwrap();
        assert_eq!(c.summary.finish, FinishReason::Stop, "{}", c.text);
        let v: serde_json::Value = serde_json::from_str(&c.text).unwrap();
        assert!(v.is_object(), "{}", c.text);
        assert!(c.summary.constraint_compile_time > std::time::Duration::ZERO);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_line_for_a_tokenizing_turn_is_as_long_as_the_queue_and_then_a_429() {
        use std::sync::atomic::Ordering;
        let state = state();
        let runner = state.models.get("smollm2:135m").await.unwrap();
        // Both `--parallel` turns taken: every request now waits in line.
        let held = runner.tokenizing.acquire_many(2).await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..4 {
            let (state, runner) = (state.clone(), runner.clone());
            waiters.push(tokio::spawn(async move {
                tokenize_turn(&state, &runner).await.map(drop)
            }));
        }
        let t0 = std::time::Instant::now();
        while runner.tokenize_waiting.load(Ordering::SeqCst) < 4 {
            assert!(t0.elapsed().as_secs() < 10, "the waiters never got in line");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let e = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokenize_turn(&state, &runner),
        )
        .await
        .expect("a request past the full line waited instead of a 429")
        .map(drop)
        .unwrap_err();
        assert_eq!(
            e.status(),
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            "{e:?}"
        );
        assert_eq!(e.retry_after, Some(1), "{e:?}");
        // One that goes away leaves the line, and makes room for another.
        waiters.pop().unwrap().abort();
        while runner.tokenize_waiting.load(Ordering::SeqCst) > 3 {
            assert!(
                t0.elapsed().as_secs() < 10,
                "an aborted waiter stayed in line"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let (s2, r2) = (state.clone(), runner.clone());
        waiters.push(tokio::spawn(async move {
            tokenize_turn(&s2, &r2).await.map(drop)
        }));
        drop(held);
        for w in waiters {
            w.await.unwrap().unwrap();
        }
        assert_eq!(runner.tokenize_waiting.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn only_a_failure_inside_the_constraint_library_is_the_servers() {
        let e = constraint_error("tools", ConstraintError::Runtime("boom".into()));
        assert_eq!(e.kind, ErrorKind::Internal);
        let e = constraint_error("tools", ConstraintError::Vocabulary("no EOG".into()));
        assert_eq!(
            (e.kind, e.param.as_deref()),
            (ErrorKind::InvalidRequest, Some("tools"))
        );
    }
}
