//! The Ollama-compatible routes: `/api/tags`, `/api/show`, `/api/chat`, `/api/generate`
//! (NDJSON streaming, the default), `/api/ps`, `/api/version`.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use flowrt_engine::FinishReason;
use flowrt_sample::SamplerConfig;
use flowrt_text::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::agent::{self, ChatInput, Shaped, Shaper};
use crate::error::{clip, ApiError, OllamaError};
use crate::extract::ApiJson;
use crate::gen::{
    collect, finish_reason, parse_stop, spawn_stream, start, stream_response, GenRequest,
    PromptInput, SamplingParams, Started,
};
use crate::models::ModelSpec;
use crate::scheduler::{Event, Summary};
use crate::AppState;

type OResult<T> = Result<T, OllamaError>;

fn rfc3339(t: std::time::SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Nanos, true)
}

fn now() -> String {
    rfc3339(std::time::SystemTime::now())
}

fn details_json(s: &ModelSpec) -> Value {
    let family = s.details.architecture.clone();
    json!({
        "parent_model": "",
        "format": s.details.format,
        "family": family,
        "families": [family],
        "parameter_size": s.details.parameter_size(),
        "quantization_level": s.details.quantization,
    })
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

pub async fn tags(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .models
        .specs()
        .iter()
        .map(|s| {
            json!({
                "name": s.id,
                "model": s.id,
                "modified_at": rfc3339(s.modified),
                "size": s.size,
                "digest": s.sha256,
                "details": details_json(s),
            })
        })
        .collect();
    Json(json!({ "models": models }))
}

pub async fn ps(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .models
        .running()
        .iter()
        .map(|r| {
            let s = &r.spec;
            json!({
                "name": s.id,
                "model": s.id,
                "size": r.est_bytes,
                "digest": s.sha256,
                "details": details_json(s),
                "expires_at": r.expires_at().map(rfc3339).unwrap_or_else(|| "9999-12-31T23:59:59Z".into()),
                "size_vram": 0,
                "context_length": r.n_ctx,
            })
        })
        .collect();
    Json(json!({ "models": models }))
}

#[derive(Deserialize)]
pub struct ShowRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

fn model_name(model: Option<String>, name: Option<String>) -> Result<String, ApiError> {
    model
        .or(name)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid_param("model", "`model` is required"))
}

pub async fn show(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ShowRequest>,
) -> OResult<Json<Value>> {
    let name = model_name(req.model, req.name)?;
    let s = state.models.find(&name)?;
    let d = &s.details;
    let arch = &d.architecture;
    let mut info = serde_json::Map::new();
    info.insert("general.architecture".into(), json!(arch));
    if let Some(n) = &d.name {
        info.insert("general.name".into(), json!(n));
    }
    if let Some(p) = d.parameter_count {
        info.insert("general.parameter_count".into(), json!(p));
    }
    info.insert(format!("{arch}.context_length"), json!(d.context_length));
    info.insert("general.file_type".into(), json!(d.quantization));
    info.insert("flowrt.sha256".into(), json!(s.sha256));
    info.insert("flowrt.source".into(), json!(s.source));
    info.insert("flowrt.format".into(), json!(s.format()));
    if let Some(e) = &s.entry {
        info.insert("flowrt.origin".into(), json!(e.origin));
        info.insert("flowrt.added_at".into(), json!(e.added_at));
    }
    let mut caps = vec!["completion"];
    if d.chat_template.is_some() {
        caps.push("chat");
    }
    let template = d.chat_template.clone().unwrap_or_default();
    Ok(Json(json!({
        "license": d.license.clone().unwrap_or_default(),
        "modelfile": format!("# flowrt: {}\nFROM {}\n", s.id, s.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        "parameters": "",
        "template": template,
        "details": details_json(&s),
        "model_info": info,
        "capabilities": caps,
        "modified_at": rfc3339(s.modified),
    })))
}

/// Ollama's `options`.
#[derive(Deserialize, Default)]
pub struct Options {
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<u64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    num_predict: Option<i64>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default)]
    repeat_penalty: Option<f32>,
    #[serde(default)]
    repeat_last_n: Option<i64>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
}

impl Options {
    fn sampler(&self) -> Result<SamplerConfig, ApiError> {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        }
        .to_config(&ollama_defaults())
    }

    /// `num_predict`: -1 (or unset) = until the context is full.
    fn max_tokens(&self) -> Result<Option<u64>, ApiError> {
        match self.num_predict {
            None | Some(-1) | Some(-2) => Ok(None),
            Some(n) if n > 0 => Ok(Some(n as u64)),
            Some(n) => Err(ApiError::invalid_param(
                "options.num_predict",
                format!("`num_predict` must be positive or -1, got {n}"),
            )),
        }
    }
}

/// Ollama's defaults (llama.cpp's: temperature 0.8, top-k 40, top-p 0.9, repeat penalty 1.1
/// over 64 tokens).
fn ollama_defaults() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.0,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        ..SamplerConfig::default()
    }
}

/// Ollama's `keep_alive`: seconds as a number, or a duration string (`5m`, `1h`, `30s`);
/// negative = forever.
pub(crate) fn keep_alive(v: &Option<Value>) -> Result<Option<Option<Duration>>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "keep_alive",
            "`keep_alive` must be a number of seconds or a duration such as \"5m\"",
        )
    };
    let secs: f64 = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(bad)?,
        Some(Value::String(s)) => {
            let s = s.trim();
            let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
                Some(i) => (&s[..i], &s[i..]),
                None => (s, "s"),
            };
            let n: f64 = num.parse().map_err(|_| bad())?;
            n * match unit {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(bad()),
            }
        }
        Some(_) => return Err(bad()),
    };
    if !secs.is_finite() {
        return Err(bad());
    }
    Ok(Some(if secs < 0.0 {
        None
    } else {
        Some(Duration::from_secs_f64(secs.min(1e9)))
    }))
}

#[derive(Deserialize)]
pub struct OMessage {
    role: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    images: Option<Value>,
    /// An assistant turn's calls: `[{"function": {"name", "arguments": {...}}}]`.
    #[serde(default)]
    tool_calls: Option<Value>,
    /// A `tool` message's function.
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    model: String,
    #[serde(default)]
    messages: Vec<OMessage>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    options: Option<Options>,
    #[serde(default)]
    format: Option<Value>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    think: Option<Value>,
}

#[derive(Deserialize)]
pub struct GenerateRequest {
    model: String,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    raw: Option<bool>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    options: Option<Options>,
    #[serde(default)]
    format: Option<Value>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    images: Option<Value>,
    #[serde(default)]
    think: Option<Value>,
}

fn set(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// `think`: `true`/`false`, or an effort (`"low"`, `"medium"`, `"high"`) given to the
/// template as `reasoning_effort`.
fn parse_think(
    v: Option<&Value>,
    kwargs: &mut serde_json::Map<String, Value>,
) -> Result<Option<(bool, &'static str)>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some((*b, "think"))),
        Some(Value::String(e)) if matches!(e.as_str(), "low" | "medium" | "high") => {
            kwargs.insert("reasoning_effort".into(), Value::from(e.as_str()));
            Ok(Some((true, "think")))
        }
        Some(other) => Err(ApiError::invalid_param(
            "think",
            format!(
                "`think` must be true, false, \"low\", \"medium\" or \"high\", got {}",
                clip(&other.to_string(), 40)
            ),
        )),
    }
}

/// The answer part of an Ollama object: `message` (chat: `content`, `thinking`,
/// `tool_calls`) or `response` and `thinking` (generate).
fn answer_fields(chat: bool, a: &Shaped) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    if chat {
        let mut msg = json!({ "role": "assistant", "content": a.content });
        if !a.reasoning.is_empty() {
            msg["thinking"] = json!(a.reasoning);
        }
        if !a.calls.is_empty() {
            msg["tool_calls"] = json!(a
                .calls
                .iter()
                .map(|c| json!({ "function": { "name": c.name, "arguments": c.arguments } }))
                .collect::<Vec<_>>());
        }
        m.insert("message".into(), msg);
    } else {
        m.insert("response".into(), json!(a.content));
        if !a.reasoning.is_empty() {
            m.insert("thinking".into(), json!(a.reasoning));
        }
    }
    m
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid_param(param, format!("{what} is not supported"))
}

fn stats_json(s: &Summary, total: Duration, load: Duration) -> serde_json::Map<String, Value> {
    let ns = |d: Duration| d.as_nanos() as u64;
    let mut m = serde_json::Map::new();
    m.insert("done_reason".into(), json!(finish_reason(s.finish)));
    m.insert("total_duration".into(), json!(ns(total)));
    m.insert("load_duration".into(), json!(ns(load)));
    m.insert("prompt_eval_count".into(), json!(s.prompt_tokens));
    m.insert("prompt_eval_duration".into(), json!(ns(s.prefill_time)));
    m.insert("eval_count".into(), json!(s.completion_tokens));
    m.insert("eval_duration".into(), json!(ns(s.decode_time)));
    m
}

/// Apply a request's `keep_alive`; `Some(0)` on a request with nothing to run unloads.
pub(crate) fn apply_keep_alive(state: &AppState, model: &str, ka: Option<Option<Duration>>) {
    if let (Some(ka), Some(r)) = (
        ka,
        state
            .models
            .running()
            .into_iter()
            .find(|r| r.spec.id == model),
    ) {
        r.set_keep_alive(ka);
    }
}

/// A request with no prompt loads (or, with `keep_alive: 0`, unloads) the model.
async fn load_only(
    state: &AppState,
    model: &str,
    ka: Option<Option<Duration>>,
    chat: bool,
) -> OResult<Response> {
    let spec = state.models.find(model)?;
    let reason = if ka == Some(Some(Duration::ZERO)) {
        state.models.unload(&spec.id);
        "unload"
    } else {
        state.models.get(&spec.id).await?;
        apply_keep_alive(state, &spec.id, ka);
        "load"
    };
    let mut v =
        json!({ "model": spec.id, "created_at": now(), "done": true, "done_reason": reason });
    if chat {
        v["message"] = json!({ "role": "assistant", "content": "" });
    } else {
        v["response"] = json!("");
    }
    Ok(Json(v).into_response())
}

/// Run a started job as Ollama answers: one JSON object, or NDJSON lines.
async fn respond(
    mut started: Started,
    stream: bool,
    chat: bool,
    t0: Instant,
    load: Duration,
) -> OResult<Response> {
    let model = started.runner.spec.id.clone();
    let context = move |s: &Summary, prompt: &[u32]| -> Value {
        if chat {
            Value::Null
        } else {
            json!(prompt.iter().chain(&s.tokens).collect::<Vec<_>>())
        }
    };
    let mut shaper = Shaper::new(started.shape);
    if !stream {
        let out = collect(&mut started).await?;
        let mut shaped = Shaped::default();
        shaped.add(shaper.push(&out.text));
        shaped.add(shaper.finish(out.summary.finish == FinishReason::Stop));
        let mut v = serde_json::Map::new();
        v.insert("model".into(), json!(model));
        v.insert("created_at".into(), json!(now()));
        v.extend(answer_fields(chat, &shaped));
        v.insert("done".into(), json!(true));
        v.extend(stats_json(&out.summary, t0.elapsed(), load));
        if !chat {
            v.insert(
                "context".into(),
                context(&out.summary, &started.prompt_tokens),
            );
        }
        return Ok(Json(Value::Object(v)).into_response());
    }
    let (tx, rx) = mpsc::channel(64);
    let prompt = started.prompt_tokens.clone();
    let line = |v: Value| format!("{v}\n");
    let frame = move |shaped: &Shaped, done: bool| {
        let mut v = serde_json::Map::new();
        v.insert("model".into(), json!(model));
        v.insert("created_at".into(), json!(now()));
        v.extend(answer_fields(chat, shaped));
        v.insert("done".into(), json!(done));
        v
    };
    let empty = |s: &Shaped| s.content.is_empty() && s.reasoning.is_empty() && s.calls.is_empty();
    spawn_stream(started, tx, move |ev| match ev {
        Event::Text { text, .. } => {
            let mut shaped = Shaped::default();
            shaped.add(shaper.push(&text));
            if empty(&shaped) {
                return (Vec::new(), false);
            }
            (vec![line(Value::Object(frame(&shaped, false)))], false)
        }
        Event::Done(s) => {
            let mut out = Vec::new();
            let mut rest = Shaped::default();
            rest.add(shaper.finish(s.finish == FinishReason::Stop));
            if !empty(&rest) {
                out.push(line(Value::Object(frame(&rest, false))));
            }
            let mut v = frame(&Shaped::default(), true);
            v.extend(stats_json(&s, t0.elapsed(), load));
            if !chat {
                v.insert("context".into(), context(&s, &prompt));
            }
            out.push(line(Value::Object(v)));
            (out, true)
        }
        Event::Failed(e) => (vec![line(json!({ "error": e.message }))], true),
    });
    Ok(stream_response("application/x-ndjson", rx))
}

pub async fn chat(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> OResult<Response> {
    let t0 = Instant::now();
    if req.model.is_empty() {
        return Err(ApiError::invalid_param("model", "`model` is required").into());
    }
    let structured = agent::ollama_format(req.format.as_ref())?;
    let tools = agent::parse_tools(req.tools.as_ref())?;
    let mut kwargs = serde_json::Map::new();
    let think = parse_think(req.think.as_ref(), &mut kwargs)?;
    let ka = keep_alive(&req.keep_alive)?;
    if req.messages.is_empty() {
        return load_only(&state, &req.model, ka, true).await;
    }
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if set(&m.images) {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].images"),
                    "image inputs are not supported",
                ));
            }
            match m.role.as_str() {
                "system" | "user" | "assistant" | "tool" => {
                    let mut msg = ChatMessage::new(m.role.clone(), m.content.clone());
                    if m.role == "assistant" {
                        if let Some(tc) = m.tool_calls.as_ref().filter(|v| !v.is_null()) {
                            let calls = agent::in_tool_calls(i, tc)?;
                            if !calls.is_empty() {
                                msg.tool_calls = Some(calls);
                            }
                        }
                        msg.reasoning_content = m.thinking.clone().filter(|t| !t.is_empty());
                    } else if set(&m.tool_calls) {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].tool_calls"),
                            "only assistant messages carry `tool_calls`",
                        ));
                    }
                    if m.role == "tool" {
                        msg.name = m.tool_name.clone();
                    }
                    Ok(msg)
                }
                other => Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!(
                        "unknown role `{}` (use system, user, assistant or tool)",
                        clip(other, 40)
                    ),
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let opts = req.options.unwrap_or_default();
    let stream = req.stream != Some(false);
    let input = ChatInput {
        messages,
        tools,
        choice: flowrt_engine::tools::ToolChoice::Auto,
        parallel: true,
        think,
        kwargs,
        structured: structured.is_some().then_some("format"),
    };
    run(
        &state,
        &req.model,
        PromptInput::Chat(input),
        structured,
        &opts,
        ka,
        stream,
        true,
        t0,
    )
    .await
}

pub async fn generate(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<GenerateRequest>,
) -> OResult<Response> {
    let t0 = Instant::now();
    if req.model.is_empty() {
        return Err(ApiError::invalid_param("model", "`model` is required").into());
    }
    let structured = agent::ollama_format(req.format.as_ref())?;
    let mut kwargs = serde_json::Map::new();
    let think = parse_think(req.think.as_ref(), &mut kwargs)?;
    if set(&req.images) {
        return Err(unsupported("images", "image input").into());
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(unsupported("suffix", "`suffix` (fill in the middle)").into());
    }
    if req.template.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(unsupported("template", "a custom `template`").into());
    }
    if set(&req.context) {
        return Err(unsupported("context", "continuing from `context`").into());
    }
    let ka = keep_alive(&req.keep_alive)?;
    let prompt = req.prompt.unwrap_or_default();
    if prompt.is_empty() {
        return load_only(&state, &req.model, ka, false).await;
    }
    let input = if req.raw == Some(true) {
        if think.is_some() {
            return Err(unsupported("think", "`think` with `raw` (no template to switch)").into());
        }
        PromptInput::Text {
            text: prompt,
            add_special: true,
        }
    } else {
        let mut messages = Vec::new();
        if let Some(s) = req.system.filter(|s| !s.is_empty()) {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", prompt));
        let mut input = ChatInput::plain(messages);
        input.think = think;
        input.kwargs = kwargs;
        input.structured = structured.is_some().then_some("format");
        PromptInput::Chat(input)
    };
    let opts = req.options.unwrap_or_default();
    let stream = req.stream != Some(false);
    run(
        &state, &req.model, input, structured, &opts, ka, stream, false, t0,
    )
    .await
}

/// `/api/generate` renders its `prompt` as a chat: an error about the chat's `messages` is
/// about the request's `prompt`.
fn messages_as_prompt(mut e: ApiError) -> ApiError {
    if e.param.as_deref() == Some("messages") {
        e.param = Some("prompt".into());
        e.message = e.message.replace("`messages`", "`prompt`");
    }
    e
}

/// Generate for `/api/chat` (`chat`) or `/api/generate` with Ollama's options, apply the
/// keep-alive, and answer (NDJSON when `stream`), reporting load time when this request loaded
/// the model.
#[allow(clippy::too_many_arguments)]
async fn run(
    state: &AppState,
    model: &str,
    prompt: PromptInput,
    structured: Option<flowrt_engine::ConstraintSpec>,
    opts: &Options,
    ka: Option<Option<Duration>>,
    stream: bool,
    chat: bool,
    t0: Instant,
) -> OResult<Response> {
    let loaded_before = state.models.state(
        &state
            .models
            .find(model)
            .map(|s| s.id.clone())
            .unwrap_or_default(),
    ) == crate::models::ModelState::Ready;
    let started = start(
        state,
        model,
        GenRequest {
            prompt,
            max_tokens: opts.max_tokens()?,
            max_tokens_param: "options.num_predict",
            clamp_max_tokens: true,
            sampler: opts.sampler()?,
            stop: parse_stop(opts.stop.as_ref(), "options.stop")?,
            logprobs: None,
            ignore_eos: false,
            constraint: structured.map(|spec| crate::gen::ConstraintRequest {
                spec,
                param: "format",
            }),
        },
    )
    .await
    .map_err(|e| if chat { e } else { messages_as_prompt(e) })?;
    apply_keep_alive(state, &started.runner.spec.id, ka);
    let load = if loaded_before {
        Duration::ZERO
    } else {
        t0.elapsed()
    };
    respond(started, stream, chat, t0, load).await
}
