//! Anthropic's Messages API: `POST /v1/messages` (plain and streamed as Anthropic's SSE
//! events) and `POST /v1/messages/count_tokens`, text only and without tools.
//!
//! A request becomes the same chat job as `/v1/chat/completions` ([`crate::gen::start`]):
//! `system` is a leading system message, text blocks are joined with newlines, and the model
//! named must be served here (else 404 `not_found_error`). Errors take Anthropic's shape
//! `{"type": "error", "error": {"type", "message"}}`, with the request field at fault named
//! first in the message.

use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flowrt_engine::FinishReason;
use flowrt_sample::SamplerConfig;
use flowrt_text::ChatMessage;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::agent::{ChatInput, Piece, Shaped, Shaper};
use crate::error::{clip, ApiError, ErrorKind};
use crate::extract::ApiJson;
use crate::gen::{
    collect, new_id, parse_stop, spawn_stream, start, stream_response, GenRequest, PromptInput,
    SamplingParams,
};
use crate::scheduler::{Event, Summary};
use crate::AppState;

/// [`ApiError`] in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error `type` for each kind.
fn error_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::ContextLength | ErrorKind::MethodNotAllowed => {
            "invalid_request_error"
        }
        ErrorKind::Unauthorized => "authentication_error",
        ErrorKind::ModelNotFound | ErrorKind::NotFound => "not_found_error",
        ErrorKind::PayloadTooLarge => "request_too_large",
        ErrorKind::RequestTimeout => "invalid_request_error",
        ErrorKind::UnsupportedMediaType => "invalid_request_error",
        ErrorKind::ForbiddenHost => "permission_error",
        ErrorKind::Overloaded => "rate_limit_error",
        ErrorKind::Unavailable => "overloaded_error",
        ErrorKind::Internal => "api_error",
    }
}

/// The error body (also the data of a streamed `error` event).
pub fn error_body(e: &ApiError) -> Value {
    json!({
        "type": "error",
        "error": { "type": error_type(e.kind), "message": e.ollama_message() },
    })
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        let body = error_body(&e);
        // The status, `Retry-After` and the metrics' kind as the other routes set them.
        let mut resp = e.clone().into_response();
        resp.extensions_mut().remove::<crate::error::OpenAiShaped>();
        let (parts, _) = resp.into_parts();
        resp = Response::from_parts(parts, axum::body::Body::from(body.to_string()));
        resp
    }
}

/// A JSON body read like [`ApiJson`], its errors in Anthropic's shape.
pub struct MessagesJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for MessagesJson<T> {
    type Rejection = AnthropicError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AnthropicError> {
        let ApiJson(v) = ApiJson::<T>::from_request(req, state).await?;
        Ok(MessagesJson(v))
    }
}

#[derive(Deserialize)]
pub struct InMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Deserialize)]
pub struct MessagesRequest {
    model: String,
    #[serde(default)]
    messages: Option<Vec<InMessage>>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<u64>,
    #[serde(default)]
    stop_sequences: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    /// Accepted and ignored (Anthropic's `metadata.user_id`).
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    thinking: Option<Value>,
    /// `format` (structured output) is refused; `effort` is ignored.
    #[serde(default)]
    output_config: Option<Value>,
}

/// Set and not `null`.
fn given(v: &Option<Value>) -> bool {
    !matches!(v, None | Some(Value::Null))
}

/// The text of `content` (a string, or a list of text blocks) at `param`.
fn blocks_text(content: &Value, param: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let ty = b.get("type").and_then(Value::as_str);
                match (ty, b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push(t),
                    (Some("text"), None) => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{j}].text"),
                            "a text block needs a string `text`",
                        ))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{j}].type"),
                            format!(
                                "content block type `{}` is not supported on this server (only `text`: no images, documents, tool_use or tool_result)",
                                clip(other, 40)
                            ),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::invalid_param(
                            format!("{param}[{j}].type"),
                            "a content block needs a string `type`",
                        ))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        _ => Err(ApiError::invalid_param(
            param,
            "must be a string or a list of text blocks",
        )),
    }
}

/// `system` and `messages` as chat messages.
fn conversation(req: &MessagesRequest) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    match &req.system {
        None | Some(Value::Null) => {}
        Some(s) => out.push(ChatMessage::new("system", blocks_text(s, "system")?)),
    }
    let messages = match &req.messages {
        Some(m) if !m.is_empty() => m,
        _ => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must hold at least one message",
            ))
        }
    };
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            r @ ("user" | "assistant") => r,
            "system" => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    "messages have the roles user and assistant; give the system prompt as the top-level `system`",
                ))
            }
            other => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("unknown role `{}` (use user or assistant)", clip(other, 40)),
                ))
            }
        };
        let param = format!("messages[{i}].content");
        let Some(content) = m.content.as_ref().filter(|c| !c.is_null()) else {
            return Err(ApiError::invalid_param(param, "a message needs `content`"));
        };
        out.push(ChatMessage::new(role, blocks_text(content, &param)?));
    }
    if messages.last().is_some_and(|m| m.role == "assistant") {
        return Err(ApiError::invalid_param(
            format!("messages[{}].role", messages.len() - 1),
            "a last `assistant` message (prefilling the answer) is not supported on this server: end with a user message",
        ));
    }
    Ok(out)
}

/// `tools`, `tool_choice` and `thinking` other than `{"type": "disabled"}` are refused.
fn refuse_unsupported(req: &MessagesRequest) -> Result<(), ApiError> {
    for (name, v) in [("tools", &req.tools), ("tool_choice", &req.tool_choice)] {
        if given(v) {
            return Err(ApiError::invalid_param(
                name,
                format!("`{name}` is not supported on /v1/messages (this route is text only, without tools; /v1/chat/completions serves tools)"),
            ));
        }
    }
    if given(&req.thinking)
        && req
            .thinking
            .as_ref()
            .and_then(|t| t.get("type"))
            .and_then(Value::as_str)
            != Some("disabled")
    {
        return Err(ApiError::invalid_param(
            "thinking",
            "`thinking` is not supported on /v1/messages (only `{\"type\": \"disabled\"}`)",
        ));
    }
    if req
        .output_config
        .as_ref()
        .and_then(|c| c.get("format"))
        .is_some_and(|f| !f.is_null())
    {
        return Err(ApiError::invalid_param(
            "output_config.format",
            "`output_config.format` (structured output) is not supported on /v1/messages (/v1/chat/completions serves `response_format`)",
        ));
    }
    Ok(())
}

/// Anthropic's defaults: temperature 1, no top-p / top-k truncation.
fn defaults() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    }
}

/// The checked request: prompt, sampling, stop strings.
struct Checked {
    messages: Vec<ChatMessage>,
    sampler: SamplerConfig,
    stop: Vec<String>,
}

fn check(req: &MessagesRequest) -> Result<Checked, ApiError> {
    if req.model.is_empty() {
        return Err(ApiError::invalid_param(
            "model",
            "`model` must name a model (GET /v1/models lists them)",
        ));
    }
    refuse_unsupported(req)?;
    let messages = conversation(req)?;
    if let Some(t) = req.temperature {
        if !(0.0..=1.0).contains(&t) {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("`temperature` must be between 0 and 1, got {t}"),
            ));
        }
    }
    let sampler = SamplingParams {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        ..SamplingParams::default()
    }
    .to_config(&defaults())?;
    if let Some(Value::String(_)) = &req.stop_sequences {
        return Err(ApiError::invalid_param(
            "stop_sequences",
            "`stop_sequences` must be a list of strings",
        ));
    }
    let stop = parse_stop(req.stop_sequences.as_ref(), "stop_sequences")?;
    Ok(Checked {
        messages,
        sampler,
        stop,
    })
}

/// The chat input: no tools; thinking switched off where the template can switch it.
fn chat_input(messages: Vec<ChatMessage>) -> ChatInput {
    let mut input = ChatInput::plain(messages);
    input.think = Some((false, "thinking"));
    input
}

/// Anthropic's `stop_reason`: a stop string, the end of the answer, `max_tokens`, or the
/// context filled before `max_tokens` was reached.
fn stop_reason(s: &Summary, max_tokens: u64) -> &'static str {
    if s.stop_sequence.is_some() {
        return "stop_sequence";
    }
    match s.finish {
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
        FinishReason::Length | FinishReason::ContextFull
            if (s.completion_tokens as u64) < max_tokens =>
        {
            "model_context_window_exceeded"
        }
        FinishReason::Length | FinishReason::ContextFull => "max_tokens",
    }
}

fn message_id() -> String {
    new_id("msg").replacen('-', "_", 1)
}

/// An SSE event with its name.
fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

pub async fn messages(
    State(state): State<AppState>,
    MessagesJson(req): MessagesJson<MessagesRequest>,
) -> Result<Response, AnthropicError> {
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid_param(
            "max_tokens",
            "`max_tokens` is required (the most tokens to generate)",
        )
        .into());
    };
    let c = check(&req)?;
    let mut started = start(
        &state,
        &req.model,
        GenRequest {
            prompt: PromptInput::Chat(chat_input(c.messages)),
            max_tokens: Some(max_tokens),
            max_tokens_param: "max_tokens",
            // Past the context the answer ends there (`model_context_window_exceeded`).
            clamp_max_tokens: true,
            sampler: c.sampler,
            stop: c.stop,
            logprobs: None,
            ignore_eos: false,
            constraint: None,
        },
    )
    .await?;
    let id = message_id();
    let model = started.runner.spec.id.clone();
    let input_tokens = started.prompt_tokens.len();
    let shape = started.shape;
    if req.stream != Some(true) {
        let out = collect(&mut started).await?;
        let mut shaper = Shaper::new(shape);
        let mut shaped = Shaped::default();
        shaped.add(shaper.push(&out.text));
        shaped.add(shaper.finish(out.summary.finish == FinishReason::Stop));
        let mut content = Vec::new();
        if !shaped.reasoning.is_empty() {
            content
                .push(json!({"type": "thinking", "thinking": shaped.reasoning, "signature": ""}));
        }
        content.push(json!({"type": "text", "text": shaped.content}));
        let body = json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason(&out.summary, max_tokens),
            "stop_sequence": out.summary.stop_sequence,
            "usage": {
                "input_tokens": out.summary.prompt_tokens,
                "output_tokens": out.summary.completion_tokens,
            },
        });
        return Ok(Json(body).into_response());
    }
    let (tx, rx) = mpsc::channel(64);
    let start_msg = json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": { "input_tokens": input_tokens, "output_tokens": 0 },
        },
    });
    let mut blocks = Blocks::default();
    let mut first = vec![event("message_start", &start_msg)];
    // A model that cannot think answers in one text block, opened at once; otherwise blocks
    // open as their first piece arrives (thinking before text).
    if !shape.may_reason() {
        first.extend(blocks.open(BlockKind::Text));
    }
    first.push(event("ping", &json!({"type": "ping"})));
    for f in first {
        let _ = tx.try_send(f);
    }
    let mut shaper = Shaper::new(shape);
    spawn_stream(started, tx, move |ev| match ev {
        Event::Text { text, .. } => (blocks.pieces(shaper.push(&text)), false),
        Event::Done(s) => {
            let mut out = blocks.pieces(shaper.finish(s.finish == FinishReason::Stop));
            if !blocks.text_opened {
                out.extend(blocks.open(BlockKind::Text));
            }
            out.extend(blocks.close());
            out.push(event(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": { "stop_reason": stop_reason(&s, max_tokens), "stop_sequence": s.stop_sequence },
                    "usage": { "input_tokens": s.prompt_tokens, "output_tokens": s.completion_tokens },
                }),
            ));
            out.push(event("message_stop", &json!({"type": "message_stop"})));
            (out, true)
        }
        Event::Failed(e) => (vec![event("error", &error_body(&e))], true),
    });
    Ok(stream_response("text/event-stream", rx))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Thinking,
    Text,
}

/// The content blocks of a streamed answer: which is open, and its index.
#[derive(Default)]
struct Blocks {
    open: Option<(usize, BlockKind)>,
    next: usize,
    text_opened: bool,
}

impl Blocks {
    /// Frames that close the open block, if any.
    fn close(&mut self) -> Vec<String> {
        match self.open.take() {
            Some((i, _)) => vec![event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": i}),
            )],
            None => Vec::new(),
        }
    }

    /// Frames that make `kind` the open block (closing another first).
    fn open(&mut self, kind: BlockKind) -> Vec<String> {
        if matches!(self.open, Some((_, k)) if k == kind) {
            return Vec::new();
        }
        let mut out = self.close();
        let i = self.next;
        self.next += 1;
        self.open = Some((i, kind));
        let block = match kind {
            BlockKind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            BlockKind::Text => {
                self.text_opened = true;
                json!({"type": "text", "text": ""})
            }
        };
        out.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": i, "content_block": block}),
        ));
        out
    }

    fn delta(&self, delta: Value) -> String {
        let i = self.open.map_or(0, |(i, _)| i);
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": i, "delta": delta}),
        )
    }

    /// Frames for the pieces of an answer (no tools are given, so there are no calls).
    fn pieces(&mut self, pieces: Vec<Piece>) -> Vec<String> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                // Reasoning after the text block opened would reorder the answer; it cannot
                // happen (the shaper splits reasoning off first).
                Piece::Reasoning(r) if !r.is_empty() && !self.text_opened => {
                    out.extend(self.open(BlockKind::Thinking));
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": r})));
                }
                Piece::Content(t) if !t.is_empty() => {
                    out.extend(self.open(BlockKind::Text));
                    out.push(self.delta(json!({"type": "text_delta", "text": t})));
                }
                _ => {}
            }
        }
        out
    }
}

#[derive(Deserialize)]
pub struct CountRequest {
    model: String,
    #[serde(default)]
    messages: Option<Vec<InMessage>>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    thinking: Option<Value>,
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would feed them.
pub async fn count_tokens(
    State(state): State<AppState>,
    MessagesJson(req): MessagesJson<CountRequest>,
) -> Result<Response, AnthropicError> {
    let req = MessagesRequest {
        model: req.model,
        messages: req.messages,
        system: req.system,
        max_tokens: None,
        temperature: None,
        top_p: None,
        top_k: None,
        stop_sequences: None,
        stream: None,
        metadata: None,
        tools: req.tools,
        tool_choice: req.tool_choice,
        thinking: req.thinking,
        output_config: None,
    };
    let c = check(&req)?;
    let runner = state.models.get(&req.model).await?;
    let input = PromptInput::Chat(chat_input(c.messages));
    let (tokens, _) = crate::gen::tokenize_bounded(&state, &runner, input).await?;
    runner.touch();
    Ok((
        StatusCode::OK,
        Json(json!({ "input_tokens": tokens.len() })),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

    #[tokio::test]
    async fn errors_keep_their_status_and_headers_in_anthropics_shape() {
        for (e, status, ty) in [
            (
                ApiError::invalid_param("top_k", "bad"),
                400,
                "invalid_request_error",
            ),
            (
                ApiError::new(ErrorKind::ContextLength, "long"),
                400,
                "invalid_request_error",
            ),
            (
                ApiError::new(ErrorKind::Unauthorized, "key"),
                401,
                "authentication_error",
            ),
            (ApiError::model_not_found("claude"), 404, "not_found_error"),
            (
                ApiError::new(ErrorKind::PayloadTooLarge, "big"),
                413,
                "request_too_large",
            ),
            (ApiError::overloaded("m", 1), 429, "rate_limit_error"),
            (
                ApiError::new(ErrorKind::Unavailable, "budget"),
                503,
                "overloaded_error",
            ),
            (ApiError::internal("testing", &"detail"), 500, "api_error"),
        ] {
            let kind = e.kind;
            let resp = AnthropicError(e).into_response();
            assert_eq!(resp.status().as_u16(), status, "{kind:?}");
            assert_eq!(resp.extensions().get::<ErrorKind>(), Some(&kind));
            if kind == ErrorKind::Overloaded {
                assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
            }
            let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], ty, "{kind:?}");
            assert!(!v["error"]["message"].as_str().unwrap().is_empty());
            if kind == ErrorKind::InvalidRequest {
                assert!(v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("`top_k`"));
            }
        }
    }
}
