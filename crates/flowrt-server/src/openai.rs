//! The OpenAI-compatible routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flowrt_sample::SamplerConfig;
use flowrt_text::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::{clip, ApiError};
use crate::extract::ApiJson;
use crate::gen::{
    collect, finish_reason, new_id, parse_stop, spawn_stream, start, stream_response, unix_now,
    GenRequest, PromptInput, SamplingParams,
};
use crate::models::{ModelSpec, ModelState};
use crate::scheduler::{Event, Summary, TokenLogprob, MAX_TOP_LOGPROBS};
use crate::AppState;

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
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
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
    #[serde(default)]
    n: Option<u64>,
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
    response_format: Option<Value>,
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
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid_param("n", format!("`n` = {n} is not supported: this server returns exactly one choice per request (n = 1)")));
            }
        }
        if present(&self.logit_bias) {
            return Err(ApiError::invalid_param(
                "logit_bias",
                "`logit_bias` is not supported",
            ));
        }
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Err(ApiError::invalid_param(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ));
        }
        Ok(())
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
        None | Some(Value::Null) if present(&m.tool_calls) => Err(ApiError::invalid_param(
            format!("messages[{i}].tool_calls"),
            "tool calls are not supported",
        )),
        None | Some(Value::Null) => {
            Err(ApiError::invalid_param(param, "a message needs `content`"))
        }
        Some(_) => Err(ApiError::invalid_param(
            param,
            "`content` must be a string or a list of text parts",
        )),
    }
}

/// Check roles and contents; `developer` is a system message.
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
                "tool" | "function" => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        "tool and function messages are not supported",
                    ))
                }
                other => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        format!(
                            "unknown role `{}` (use system, user or assistant)",
                            clip(other, 40)
                        ),
                    ))
                }
            };
            Ok(ChatMessage::new(role, message_text(i, m)?))
        })
        .collect()
}

fn usage_json(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": s.reused_tokens },
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
    if present(&req.tools) || present(&req.functions) {
        return Err(ApiError::invalid_param(
            "tools",
            "tools and function calling are not supported",
        ));
    }
    if let Some(rf) = &req.response_format {
        let ty = rf.get("type").and_then(Value::as_str);
        if !rf.is_null() && ty != Some("text") {
            return Err(ApiError::invalid_param(
                "response_format",
                "only `{\"type\": \"text\"}` is supported as `response_format`",
            ));
        }
    }
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
    let sampler = c.sampling().to_config(&openai_defaults())?;
    let stop = parse_stop(c.stop.as_ref(), "stop")?;
    let mut started = start(
        &state,
        &c.model,
        GenRequest {
            prompt: PromptInput::Chat(messages),
            max_tokens,
            max_tokens_param: max_param,
            clamp_max_tokens: false,
            sampler,
            stop,
            logprobs,
            ignore_eos: c.ignore_eos.unwrap_or(false),
            constraint: None,
        },
    )
    .await?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let model = started.runner.spec.id.clone();
    let fp = fingerprint(&started.runner.spec.sha256);
    if c.stream != Some(true) {
        let out = collect(&mut started).await?;
        let body = json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": fp,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": out.text, "refusal": null },
                "logprobs": if logprobs.is_some() { chat_logprobs(&out.logprobs) } else { Value::Null },
                "finish_reason": finish_reason(out.summary.finish),
            }],
            "usage": usage_json(&out.summary),
        });
        return Ok(Json(body).into_response());
    }
    let include_usage = c.include_usage();
    let chunk = move |delta: Value, lp: Value, finish: Value| {
        let mut v = json!({
            "id": id, "object": "chat.completion.chunk", "created": created,
            "model": model, "system_fingerprint": fp,
            "choices": [{ "index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish }],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let (tx, rx) = mpsc::channel(64);
    let first = sse(&chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
        Value::Null,
    ));
    let _ = tx.try_send(first);
    spawn_stream(started, tx, move |ev| match ev {
        Event::Text {
            text,
            logprobs: lps,
        } => {
            let lp = if logprobs.is_some() {
                chat_logprobs(&lps)
            } else {
                Value::Null
            };
            (
                vec![sse(&chunk(json!({ "content": text }), lp, Value::Null))],
                false,
            )
        }
        Event::Done(s) => {
            let mut out = vec![sse(&chunk(
                json!({}),
                Value::Null,
                json!(finish_reason(s.finish)),
            ))];
            if include_usage {
                let mut u = chunk(json!({}), Value::Null, Value::Null);
                u["choices"] = json!([]);
                u["usage"] = usage_json(&s);
                out.push(sse(&u));
            }
            out.push("data: [DONE]\n\n".to_string());
            (out, true)
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
    let sampler = c.sampling().to_config(&openai_defaults())?;
    let stop = parse_stop(c.stop.as_ref(), "stop")?;
    let mut started = start(
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
    )
    .await?;
    let id = new_id("cmpl");
    let created = unix_now();
    let model = started.runner.spec.id.clone();
    let fp = fingerprint(&started.runner.spec.sha256);
    if c.stream != Some(true) {
        let out = collect(&mut started).await?;
        return Ok(Json(json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fp,
            "choices": [{
                "index": 0,
                "text": out.text,
                "logprobs": if logprobs.is_some() { completion_logprobs(&out.logprobs, 0) } else { Value::Null },
                "finish_reason": finish_reason(out.summary.finish),
            }],
            "usage": usage_json(&out.summary),
        }))
        .into_response());
    }
    let include_usage = c.include_usage();
    let chunk = move |text: &str, lp: Value, finish: Value| {
        let mut v = json!({
            "id": id, "object": "text_completion", "created": created,
            "model": model, "system_fingerprint": fp,
            "choices": [{ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish }],
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let (tx, rx) = mpsc::channel(64);
    let mut offset = 0;
    spawn_stream(started, tx, move |ev| match ev {
        Event::Text {
            text,
            logprobs: lps,
        } => {
            let lp = if logprobs.is_some() {
                completion_logprobs(&lps, offset)
            } else {
                Value::Null
            };
            offset += text.len();
            (vec![sse(&chunk(&text, lp, Value::Null))], false)
        }
        Event::Done(s) => {
            let mut out = vec![sse(&chunk("", Value::Null, json!(finish_reason(s.finish))))];
            if include_usage {
                let mut u = chunk("", Value::Null, Value::Null);
                u["choices"] = json!([]);
                u["usage"] = usage_json(&s);
                out.push(sse(&u));
            }
            out.push("data: [DONE]\n\n".to_string());
            (out, true)
        }
        Event::Failed(e) => (vec![sse(&e.body()), "data: [DONE]\n\n".to_string()], true),
    });
    Ok(stream_response("text/event-stream", rx))
}
