//! The OpenAI-compatible routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flowrt_sample::SamplerConfig;
use flowrt_text::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::agent::{self, ChatInput, Piece, Shaped, Shaper};
use crate::error::{clip, ApiError};
use crate::extract::ApiJson;
use crate::gen::{
    collect, finish_reason, new_id, parse_logit_bias, parse_stop, spawn_streams, start_n,
    stream_response, unix_now, ConstraintRequest, GenRequest, PromptInput, SamplingParams,
    MAX_CHOICES,
};
use crate::models::{ModelSpec, ModelState};
use crate::scheduler::{Event, Summary, TokenLogprob, MAX_TOP_LOGPROBS};
use crate::AppState;
use flowrt_engine::FinishReason;

/// OpenAI's defaults: temperature 1, top-p 1, no top-k / min-p, no penalties.
fn openai_defaults() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    }
}

fn model_json(state: &AppState, s: &ModelSpec) -> Value {
    let created = s
        .modified
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let running = state.models.running();
    let runner = running.iter().find(|r| r.spec.id == s.id);
    json!({
        "id": s.id,
        "object": "model",
        "created": created,
        "owned_by": "flowrt",
        "aliases": s.aliases,
        "sha256": s.sha256,
        "size": s.size,
        "source": s.source,
        "origin": s.entry.as_ref().map(|e| &e.origin),
        "added_at": s.entry.as_ref().map(|e| &e.added_at),
        "format": s.format(),
        "architecture": s.details.architecture,
        "quantization": s.details.quantization,
        "parameter_count": s.details.parameter_count,
        // What a request gets: the running context, else the configured one (at most the
        // model's).
        "context_length": runner.map_or_else(
            || state.config.engine.n_ctx.map_or(s.details.context_length, |n| n.min(s.details.context_length)),
            |r| r.n_ctx,
        ),
        "max_context_length": s.details.context_length,
        "loaded": state.models.state(&s.id) == ModelState::Ready,
        // false: an embedding-only model (chat and completions answer 400).
        "generates": s.details.generates(),
    })
}

pub async fn list_models(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state
        .models
        .specs()
        .iter()
        .map(|s| model_json(&state, s))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

pub async fn get_model(
    State(state): State<AppState>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id.map_err(|e| {
        ApiError::invalid_param(
            "model",
            format!(
                "the model name in the path is not valid: {}",
                clip(&e.body_text(), 200)
            ),
        )
    })?;
    let spec = state.models.find(&id)?;
    Ok(Json(model_json(&state, &spec)))
}

#[derive(Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
pub struct InMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Value>,
    #[serde(default)]
    tool_call_id: Option<Value>,
    #[serde(default)]
    name: Option<Value>,
    #[serde(default)]
    reasoning_content: Option<Value>,
}

/// Request fields both completion routes share.
#[derive(Deserialize)]
pub struct Common {
    model: String,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    /// Read as any JSON value so a wrong type is a 400 naming `n` (serde loses the field's
    /// name inside a flattened struct).
    #[serde(default)]
    n: Option<Value>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    logit_bias: Option<Value>,
    // Extensions that llama.cpp-style clients send.
    #[serde(default)]
    top_k: Option<u64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    repeat_penalty: Option<f32>,
    /// Generate past end-of-generation tokens (vLLM's extension, for benchmarks).
    #[serde(default)]
    ignore_eos: Option<bool>,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    common: Common,
    messages: Vec<InMessage>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u64>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    functions: Option<Value>,
    #[serde(default)]
    function_call: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    response_format: Option<Value>,
    /// vLLM / llama-server extension: extra chat template variables (`enable_thinking`, ...).
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    #[serde(default)]
    reasoning_effort: Option<Value>,
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    common: Common,
    prompt: Value,
    #[serde(default)]
    logprobs: Option<u64>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    best_of: Option<u64>,
}

/// Set and not empty (`null`, `[]`, `{}` count as unset).
fn present(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

impl Common {
    fn check(&self) -> Result<(), ApiError> {
        if self.model.is_empty() {
            return Err(ApiError::invalid_param(
                "model",
                "`model` must name a model (GET /v1/models lists them)",
            ));
        }
        self.n()?;
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ));
        }
        Ok(())
    }

    /// The sampler's settings: the request's over OpenAI's defaults, with `logit_bias`.
    fn sampler(&self) -> Result<SamplerConfig, ApiError> {
        let mut c = self.sampling().to_config(&openai_defaults())?;
        c.logit_bias = parse_logit_bias(self.logit_bias.as_ref(), "logit_bias")?;
        Ok(c)
    }

    fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: None,
            seed: self.seed,
        }
    }

    /// `n`: an integer from 1 to [`MAX_CHOICES`]; 1 when absent or null.
    fn n(&self) -> Result<usize, ApiError> {
        match &self.n {
            None | Some(Value::Null) => Ok(1),
            Some(v) => match v.as_u64() {
                Some(n) if (1..=MAX_CHOICES as u64).contains(&n) => Ok(n as usize),
                _ => Err(ApiError::invalid_param(
                    "n",
                    format!(
                        "`n` must be an integer between 1 and {MAX_CHOICES}, got {}",
                        clip(&v.to_string(), 40)
                    ),
                )),
            },
        }
    }

    /// How many choices: `n` (checked by [`Common::check`]), at most the model's wait queue,
    /// since every choice is a sequence queued at once.
    fn choices(&self, state: &AppState) -> Result<usize, ApiError> {
        let n = self.n()?;
        let queue = state.config.queue.max(1);
        if n > queue {
            return Err(ApiError::invalid_param(
                "n",
                format!(
                    "`n` = {n} is more than this server queues for one model ({queue}, `--queue`)"
                ),
            ));
        }
        Ok(n)
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}

/// A message's text: a string, or a list of `{"type": "text", "text": ...}` parts.
fn message_text(i: usize, m: &InMessage) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match &m.content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
                match (ty, p.get("text").and_then(Value::as_str)) {
                    ("text", Some(t)) => out.push(t),
                    ("text", None) => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{j}].text"),
                            "a text part needs a string `text`",
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{j}].type"),
                            format!(
                                "content part type `{}` is not supported (only text)",
                                clip(ty, 40)
                            ),
                        ))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        None | Some(Value::Null) if present(&m.tool_calls) => Ok(String::new()),
        None | Some(Value::Null) => {
            Err(ApiError::invalid_param(param, "a message needs `content`"))
        }
        Some(_) => Err(ApiError::invalid_param(
            param,
            "`content` must be a string or a list of text parts",
        )),
    }
}

/// An optional string field of message `i`.
fn opt_str(v: &Option<Value>, param: impl FnOnce() -> String) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid_param(param(), "must be a string")),
    }
}

/// Check roles and contents; `developer` is a system message. Assistant messages may carry
/// `tool_calls` (and `reasoning_content`); `tool` messages carry a call's result.
pub fn chat_messages(messages: &[InMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                "function" => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        "legacy `function` messages are not supported: send results as `tool` messages with a `tool_call_id`",
                    ))
                }
                other => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        format!(
                            "unknown role `{}` (use system, user, assistant or tool)",
                            clip(other, 40)
                        ),
                    ))
                }
            };
            if role != "assistant" && present(&m.tool_calls) {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].tool_calls"),
                    "only assistant messages carry `tool_calls`",
                ));
            }
            let mut msg = ChatMessage::new(role, message_text(i, m)?);
            if role == "assistant" {
                if let Some(tc) = m.tool_calls.as_ref().filter(|v| !v.is_null()) {
                    let calls = agent::in_tool_calls(i, tc)?;
                    if !calls.is_empty() {
                        msg.tool_calls = Some(calls);
                    }
                }
                msg.reasoning_content = opt_str(&m.reasoning_content, || {
                    format!("messages[{i}].reasoning_content")
                })?;
            }
            if role == "tool" {
                let id = opt_str(&m.tool_call_id, || format!("messages[{i}].tool_call_id"))?;
                if id.as_deref().is_none_or(str::is_empty) {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].tool_call_id"),
                        "a `tool` message needs the `tool_call_id` of the call it answers",
                    ));
                }
                msg.tool_call_id = id;
            }
            msg.name = opt_str(&m.name, || format!("messages[{i}].name"))?;
            Ok(msg)
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(check_tool_results)
}

/// Every `tool` message answers a call of an earlier assistant message (by `tool_call_id`),
/// as OpenAI requires.
fn check_tool_results(messages: Vec<ChatMessage>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut ids: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(calls) = &m.tool_calls {
            ids.extend(calls.iter().filter_map(|c| c.id.as_deref()));
        }
        if m.role == "tool" {
            let id = m.tool_call_id.as_deref().unwrap_or("");
            if !ids.contains(&id) {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].tool_call_id"),
                    format!(
                        "`tool_call_id` `{}` does not name a call of an earlier assistant message",
                        clip(id, 80)
                    ),
                ));
            }
        }
    }
    Ok(messages)
}

/// `chat_template_kwargs` and `reasoning_effort`: template variables, and whether they ask
/// for thinking (`enable_thinking`, or an effort other than `none`).
fn reasoning_switches(
    req: &ChatRequest,
) -> Result<(serde_json::Map<String, Value>, crate::agent::Think), ApiError> {
    let mut kwargs = match &req.chat_template_kwargs {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "chat_template_kwargs",
                "`chat_template_kwargs` must be an object",
            ))
        }
    };
    let mut think = None;
    match kwargs.get("enable_thinking") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => think = Some((*b, "chat_template_kwargs.enable_thinking")),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "chat_template_kwargs.enable_thinking",
                "`enable_thinking` must be a boolean",
            ))
        }
    }
    kwargs.remove("enable_thinking");
    match &req.reasoning_effort {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) => {
            let e = e.as_str();
            if !matches!(e, "none" | "minimal" | "low" | "medium" | "high") {
                return Err(ApiError::invalid_param(
                    "reasoning_effort",
                    format!(
                        "unknown `reasoning_effort` `{}` (use none, minimal, low, medium or high)",
                        clip(e, 40)
                    ),
                ));
            }
            kwargs.insert("reasoning_effort".into(), Value::from(e));
            if think.is_none() {
                think = Some((e != "none", "reasoning_effort"));
            }
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "reasoning_effort",
                "`reasoning_effort` must be a string",
            ))
        }
    }
    Ok((kwargs, think))
}

/// A tool call as OpenAI returns it (`arguments` a JSON string); `index` for stream deltas.
fn out_tool_call(c: &flowrt_text::ParsedCall, id: &str, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": id,
        "type": "function",
        "function": { "name": c.name, "arguments": c.arguments.to_string() },
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// Usage of a request's choices: the prompt counted once (as OpenAI does: every choice
/// continues the same prompt), the completion tokens of all choices summed. Cached tokens are
/// the first choice's, and only with `report_cached` (`--report-cached-tokens`): the prefix
/// cache is shared by all clients, so the count would tell one client how much of its prompt
/// another's began with (issue 18); by default it is always 0.
fn usage_json(choices: &[Summary], report_cached: bool) -> Value {
    let prompt = choices.first().map_or(0, |s| s.prompt_tokens);
    let cached = match choices.first() {
        Some(s) if report_cached => s.reused_tokens,
        _ => 0,
    };
    let completion: usize = choices.iter().map(|s| s.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

fn token_str(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Chat `logprobs.content` entries.
fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            json!({
                "token": token_str(&l.bytes),
                "logprob": l.logprob,
                "bytes": l.bytes,
                "top_logprobs": l.top.iter().map(|(_, b, lp)| json!({
                    "token": token_str(b), "logprob": lp, "bytes": b,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "content": content })
}

/// Legacy completions `logprobs` (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
fn completion_logprobs(lps: &[TokenLogprob], offset0: usize) -> Value {
    let mut offset = offset0;
    let mut offsets = Vec::with_capacity(lps.len());
    for l in lps {
        offsets.push(offset);
        offset += token_str(&l.bytes).len();
    }
    json!({
        "tokens": lps.iter().map(|l| token_str(&l.bytes)).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| {
            let m: serde_json::Map<String, Value> = l.top.iter().map(|(_, b, lp)| (token_str(b), json!(lp))).collect();
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

fn fingerprint(sha: &str) -> String {
    format!("fp_{}", &sha[..sha.len().min(12)])
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

pub async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let c = &req.common;
    c.check()?;
    if present(&req.functions) || present(&req.function_call) {
        return Err(ApiError::invalid_param(
            "functions",
            "legacy `functions` / `function_call` are not supported: use `tools` and `tool_choice`",
        ));
    }
    let structured = agent::response_format(req.response_format.as_ref())?;
    let tools = agent::parse_tools(req.tools.as_ref())?;
    let choice = agent::parse_tool_choice(req.tool_choice.as_ref(), &tools)?;
    let (kwargs, think) = reasoning_switches(&req)?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(k)) if k as usize > MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ))
        }
        (true, k) => Some(k.unwrap_or(0) as usize),
        (false, None) => None,
    };
    let (max_tokens, max_param) = match (req.max_completion_tokens, c.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    let messages = chat_messages(&req.messages)?;
    let sampler = c.sampler()?;
    let stop = parse_stop(c.stop.as_ref(), "stop")?;
    let input = ChatInput {
        messages,
        tools,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
        think,
        kwargs,
        structured: structured.is_some().then_some("response_format"),
    };
    let n = c.choices(&state)?;
    let report_cached = state.config.report_cached_tokens;
    let mut all = start_n(
        &state,
        &c.model,
        GenRequest {
            prompt: PromptInput::Chat(input),
            max_tokens,
            max_tokens_param: max_param,
            clamp_max_tokens: false,
            sampler,
            stop,
            logprobs,
            ignore_eos: c.ignore_eos.unwrap_or(false),
            constraint: structured.map(|spec| ConstraintRequest {
                spec,
                param: "response_format",
            }),
        },
        n,
    )
    .await?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let model = all[0].runner.spec.id.clone();
    let fp = fingerprint(&all[0].runner.spec.sha256);
    let shape = all[0].shape;
    // A finished answer with calls ends in `tool_calls`; one cut short keeps `length`.
    let finish_of = move |f: FinishReason, calls: usize| {
        if calls > 0 && f == FinishReason::Stop {
            "tool_calls"
        } else {
            finish_reason(f)
        }
    };
    if c.stream != Some(true) {
        let mut choices = Vec::with_capacity(n);
        let mut summaries = Vec::with_capacity(n);
        for (index, started) in all.iter_mut().enumerate() {
            let out = collect(started).await?;
            let mut shaper = Shaper::new(shape);
            let mut shaped = Shaped::default();
            shaped.add(shaper.push(&out.text));
            shaped.add(shaper.finish(out.summary.finish == FinishReason::Stop));
            let mut message =
                json!({ "role": "assistant", "content": shaped.content, "refusal": null });
            if !shaped.calls.is_empty() {
                let calls: Vec<Value> = shaped
                    .calls
                    .iter()
                    .map(|c| out_tool_call(c, &agent::call_id(shape.tools), None))
                    .collect();
                message["tool_calls"] = json!(calls);
                if shaped.content.is_empty() {
                    message["content"] = Value::Null;
                }
            }
            if !shaped.reasoning.is_empty() {
                message["reasoning_content"] = json!(shaped.reasoning);
            }
            choices.push(json!({
                "index": index,
                "message": message,
                "logprobs": if logprobs.is_some() { chat_logprobs(&out.logprobs) } else { Value::Null },
                "finish_reason": finish_of(out.summary.finish, shaped.calls.len()),
            }));
            summaries.push(out.summary);
        }
        let body = json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": fp,
            "choices": choices,
            "usage": usage_json(&summaries, report_cached),
        });
        return Ok(Json(body).into_response());
    }
    let include_usage = c.include_usage();
    let chunk = move |index: usize, delta: Value, lp: Value, finish: Value| {
        let mut v = json!({
            "id": id, "object": "chat.completion.chunk", "created": created,
            "model": model, "system_fingerprint": fp,
            "choices": [{ "index": index, "delta": delta, "logprobs": lp, "finish_reason": finish }],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let (tx, rx) = mpsc::channel(64);
    for index in 0..n {
        let first = sse(&chunk(
            index,
            json!({"role": "assistant", "content": ""}),
            Value::Null,
            Value::Null,
        ));
        let _ = tx.try_send(first);
    }
    // Per choice: its answer's reader, and the logprobs of tokens whose text is still held
    // back (a possible tool-call marker).
    let mut shapers: Vec<Shaper> = (0..n).map(|_| Shaper::new(shape)).collect();
    let mut held: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut summaries: Vec<Summary> = Vec::with_capacity(n);
    // Frames for the pieces of an answer; logprobs ride on the first content frame.
    let piece_chunk = chunk.clone();
    let frames =
        move |index: usize, pieces: Vec<Piece>, held: &mut Vec<TokenLogprob>, shaper: &Shaper| {
            let chunk = &piece_chunk;
            let calls_before = shaper.calls()
                - pieces
                    .iter()
                    .filter(|p| matches!(p, Piece::Call(_)))
                    .count();
            let mut k = calls_before;
            let mut out = Vec::new();
            for p in pieces {
                match p {
                    Piece::Reasoning(r) => out.push(sse(&chunk(
                        index,
                        json!({ "reasoning_content": r }),
                        Value::Null,
                        Value::Null,
                    ))),
                    Piece::Content(t) => {
                        let lp = if logprobs.is_some() {
                            chat_logprobs(&std::mem::take(held))
                        } else {
                            Value::Null
                        };
                        out.push(sse(&chunk(index, json!({ "content": t }), lp, Value::Null)));
                    }
                    Piece::Call(c) => {
                        let call = out_tool_call(&c, &agent::call_id(shape.tools), Some(k));
                        k += 1;
                        out.push(sse(&chunk(
                            index,
                            json!({ "tool_calls": [call] }),
                            Value::Null,
                            Value::Null,
                        )));
                    }
                }
            }
            out
        };
    spawn_streams(all, tx, move |i, ev| match ev {
        Event::Text {
            text,
            logprobs: lps,
        } => {
            held[i].extend(lps);
            let pieces = shapers[i].push(&text);
            (frames(i, pieces, &mut held[i], &shapers[i]), false)
        }
        Event::Done(s) => {
            let pieces = shapers[i].finish(s.finish == FinishReason::Stop);
            let mut out = frames(i, pieces, &mut held[i], &shapers[i]);
            if logprobs.is_some() && !held[i].is_empty() {
                let lp = chat_logprobs(&std::mem::take(&mut held[i]));
                out.push(sse(&chunk(i, json!({}), lp, Value::Null)));
            }
            out.push(sse(&chunk(
                i,
                json!({}),
                Value::Null,
                json!(finish_of(s.finish, shapers[i].calls())),
            )));
            summaries.push(s);
            let last = summaries.len() == n;
            if last {
                if include_usage {
                    let mut u = chunk(0, json!({}), Value::Null, Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&summaries, report_cached);
                    out.push(sse(&u));
                }
                out.push("data: [DONE]\n\n".to_string());
            }
            (out, last)
        }
        Event::Failed(e) => (vec![sse(&e.body()), "data: [DONE]\n\n".to_string()], true),
    });
    Ok(stream_response("text/event-stream", rx))
}

/// The prompt of `/v1/completions`: a string, a one-element list of strings, or a list of
/// token ids.
fn completion_prompt(v: &Value) -> Result<PromptInput, ApiError> {
    let text = |s: &str| PromptInput::Text {
        text: s.to_string(),
        add_special: true,
    };
    match v {
        Value::String(s) => Ok(text(s)),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Ok(text(a[0].as_str().unwrap_or("")))
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_u64) => Ok(PromptInput::Tokens(
            a.iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(|| {
                            ApiError::invalid_param("prompt", "token ids must fit in 32 bits")
                        })
                })
                .collect::<Result<_, _>>()?,
        )),
        Value::Array(a) if a.len() > 1 && a.iter().all(Value::is_string) => {
            Err(ApiError::invalid_param(
                "prompt",
                "a list of several prompts is not supported: send one prompt per request",
            ))
        }
        _ => Err(ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string or a list of token ids",
        )),
    }
}

pub async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let c = &req.common;
    c.check()?;
    if req.echo == Some(true) {
        return Err(ApiError::invalid_param(
            "echo",
            "`echo: true` is not supported",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "`suffix` is not supported",
        ));
    }
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid_param(
            "best_of",
            "`best_of` other than 1 is not supported",
        ));
    }
    let logprobs = match req.logprobs {
        Some(k) if k > 5 => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("`logprobs` must be between 0 and 5, got {k}"),
            ))
        }
        k => k.map(|k| k as usize),
    };
    let prompt = completion_prompt(&req.prompt)?;
    let sampler = c.sampler()?;
    let stop = parse_stop(c.stop.as_ref(), "stop")?;
    let n = c.choices(&state)?;
    let report_cached = state.config.report_cached_tokens;
    let mut all = start_n(
        &state,
        &c.model,
        GenRequest {
            prompt,
            max_tokens: Some(c.max_tokens.unwrap_or(16)),
            max_tokens_param: "max_tokens",
            clamp_max_tokens: false,
            sampler,
            stop,
            logprobs,
            ignore_eos: c.ignore_eos.unwrap_or(false),
            constraint: None,
        },
        n,
    )
    .await?;
    let id = new_id("cmpl");
    let created = unix_now();
    let model = all[0].runner.spec.id.clone();
    let fp = fingerprint(&all[0].runner.spec.sha256);
    if c.stream != Some(true) {
        let mut choices = Vec::with_capacity(n);
        let mut summaries = Vec::with_capacity(n);
        for (index, started) in all.iter_mut().enumerate() {
            let out = collect(started).await?;
            choices.push(json!({
                "index": index,
                "text": out.text,
                "logprobs": if logprobs.is_some() { completion_logprobs(&out.logprobs, 0) } else { Value::Null },
                "finish_reason": finish_reason(out.summary.finish),
            }));
            summaries.push(out.summary);
        }
        return Ok(Json(json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fp,
            "choices": choices,
            "usage": usage_json(&summaries, report_cached),
        }))
        .into_response());
    }
    let include_usage = c.include_usage();
    let chunk = move |index: usize, text: &str, lp: Value, finish: Value| {
        let mut v = json!({
            "id": id, "object": "text_completion", "created": created,
            "model": model, "system_fingerprint": fp,
            "choices": [{ "index": index, "text": text, "logprobs": lp, "finish_reason": finish }],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let (tx, rx) = mpsc::channel(64);
    let mut offsets = vec![0; n];
    let mut summaries: Vec<Summary> = Vec::with_capacity(n);
    spawn_streams(all, tx, move |i, ev| match ev {
        Event::Text {
            text,
            logprobs: lps,
        } => {
            let lp = if logprobs.is_some() {
                completion_logprobs(&lps, offsets[i])
            } else {
                Value::Null
            };
            offsets[i] += text.len();
            (vec![sse(&chunk(i, &text, lp, Value::Null))], false)
        }
        Event::Done(s) => {
            let mut out = vec![sse(&chunk(
                i,
                "",
                Value::Null,
                json!(finish_reason(s.finish)),
            ))];
            summaries.push(s);
            let last = summaries.len() == n;
            if last {
                if include_usage {
                    let mut u = chunk(0, "", Value::Null, Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&summaries, report_cached);
                    out.push(sse(&u));
                }
                out.push("data: [DONE]\n\n".to_string());
            }
            (out, last)
        }
        Event::Failed(e) => (vec![sse(&e.body()), "data: [DONE]\n\n".to_string()], true),
    });
    Ok(stream_response("text/event-stream", rx))
}
