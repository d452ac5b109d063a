//! The embedding routes: OpenAI's `POST /v1/embeddings`, Ollama's `POST /api/embed` and its
//! older `POST /api/embeddings`.
//!
//! Every input of a request runs in few forward passes (`flowrt_engine::Embedder`: texts of
//! any lengths batched with per-sequence masks). Each model has one embedder, made on its first
//! embedding request; requests to one model take turns, at most `--queue` waiting (429
//! beyond). Limits, each a 4xx naming the field:
//!
//! - at most [`MAX_INPUTS`] inputs a request (OpenAI's own limit), none of them empty lists;
//! - a text longer than the model's limit (its `max_seq_length`) is a 400 on the OpenAI
//!   route, which has no truncation option; Ollama's `/api/embed` cuts it to the limit unless
//!   `truncate: false` (Ollama's default and field), and says how many tokens ran in
//!   `prompt_eval_count`;
//! - `encoding_format` is `float` (default) or `base64` (little-endian f32, as OpenAI sends);
//! - `dimensions` must be the model's own: none of the models flowrt serves declares
//!   Matryoshka training (neither sentence-transformers nor GGUF files have a field for it),
//!   and cutting other embeddings short would silently degrade them.
//!
//! A model without a pooling definition (a chat model) is a 400 naming `model`, and so is a
//! chat request to a model that only embeds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flowrt_engine::{EmbedOptions, Embedder, Embeddings, EngineError};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorKind, OllamaError};
use crate::extract::ApiJson;
use crate::models::Runner;
use crate::ollama::{apply_keep_alive, keep_alive};
use crate::AppState;

/// Most inputs one request may carry (OpenAI's limit for `input` arrays).
pub const MAX_INPUTS: usize = 2048;

/// One input: a text, or token ids.
enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
pub struct OpenAiRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<Value>,
    #[serde(default)]
    dimensions: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<Value>,
}

/// OpenAI's `input`: a string, a list of strings, a list of token ids, or a list of lists of
/// token ids.
fn openai_inputs(v: &Value) -> Result<Vec<Input>, ApiError> {
    let id = |x: &Value, at: String| -> Result<u32, ApiError> {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                ApiError::invalid_param(
                    at.clone(),
                    format!("`{at}` must be a token id (a non-negative integer)"),
                )
            })
    };
    match v {
        Value::String(s) => Ok(vec![Input::Text(s.clone())]),
        Value::Array(list) if list.is_empty() => Err(ApiError::invalid_param(
            "input",
            "`input` is an empty list: send at least one text or token list",
        )),
        Value::Array(list) if list.len() > MAX_INPUTS => Err(ApiError::invalid_param(
            "input",
            format!(
                "`input` has {} items; at most {MAX_INPUTS} per request",
                list.len()
            ),
        )),
        Value::Array(list) if list.iter().all(Value::is_number) => Ok(vec![Input::Tokens(
            list.iter()
                .enumerate()
                .map(|(i, x)| id(x, format!("input[{i}]")))
                .collect::<Result<_, _>>()?,
        )]),
        Value::Array(list) => list
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(ids) if ids.is_empty() => Err(ApiError::invalid_param(
                    format!("input[{i}]"),
                    format!("`input[{i}]` is an empty token list"),
                )),
                Value::Array(ids) => Ok(Input::Tokens(
                    ids.iter()
                        .enumerate()
                        .map(|(j, x)| id(x, format!("input[{i}][{j}]")))
                        .collect::<Result<_, _>>()?,
                )),
                _ => Err(ApiError::invalid_param(
                    format!("input[{i}]"),
                    format!("`input[{i}]` must be a string or a list of token ids"),
                )),
            })
            .collect(),
        _ => Err(ApiError::invalid_param(
            "input",
            "`input` must be a string, a list of strings, or token ids",
        )),
    }
}

/// Run `inputs` on `runner`'s embedder (made on first use), on the blocking pool, one request
/// at a time per model. `truncate`: cut over-long texts instead of refusing them. Returns
/// the embeddings and how long the run (excluding the wait) took.
async fn run(
    state: &AppState,
    runner: Arc<Runner>,
    inputs: Vec<Input>,
    truncate: bool,
    dimensions: Option<usize>,
) -> Result<Embeddings, ApiError> {
    let queue = state.config.queue.max(1);
    if runner.embedding.fetch_add(1, Ordering::SeqCst) >= queue {
        runner.embedding.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::overloaded(&runner.spec.id, 1));
    }
    // Counted until the work ends, even when the client goes away first.
    let busy = Busy(runner.clone());
    let engine = state.config.engine.clone();
    let r = runner.clone();
    let out = tokio::task::spawn_blocking(move || {
        let _busy = busy;
        let mut slot = r.embedder.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(
                Embedder::new(&r.model, &engine, &EmbedOptions::default())
                    .map_err(|e| embed_error(&r.spec.id, e))?,
            );
        }
        let embedder = slot.as_mut().expect("made above");
        if let Some(d) = dimensions.filter(|&d| d != embedder.dims()) {
            return Err(ApiError::invalid_param(
                "dimensions",
                format!(
                    "model `{}` gives {} dimensions and does not declare Matryoshka training, so its embeddings cannot be shortened to {d}; omit `dimensions` or send {}",
                    r.spec.id,
                    embedder.dims(),
                    embedder.dims()
                ),
            ));
        }
        let mut ids = Vec::with_capacity(inputs.len());
        let mut cut = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.into_iter().enumerate() {
            match input {
                Input::Text(t) => {
                    let (x, c) = embedder
                        .tokenize(&r.model, i, &t, truncate)
                        .map_err(|e| embed_error(&r.spec.id, e))?;
                    ids.push(x);
                    cut.push(c);
                }
                Input::Tokens(x) => {
                    ids.push(x);
                    cut.push(false);
                }
            }
        }
        let mut out = embedder
            .embed_tokens(&ids)
            .map_err(|e| embed_error(&r.spec.id, e))?;
        out.truncated = cut;
        Ok(out)
    })
    .await;
    runner.touch();
    out.map_err(|e| ApiError::internal("embedding", &e))?
}

/// One embedding request waiting or running on a model (see [`Runner::in_flight`]).
struct Busy(Arc<Runner>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.embedding.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

/// An engine error as the client's 4xx when it is about the request, else a 500.
fn embed_error(model: &str, e: EngineError) -> ApiError {
    match e {
        EngineError::NoPooling(_) => ApiError::invalid_param(
            "model",
            format!(
                "model `{model}` declares no pooling (it is not an embedding model: no sentence-transformers modules.json, no GGUF pooling_type), so it cannot embed"
            ),
        ),
        EngineError::InputTooLong { index, tokens, max } => ApiError::new(
            ErrorKind::ContextLength,
            format!(
                "`input[{index}]` has {tokens} tokens, more than the {max} model `{model}` embeds; shorten it"
            ),
        )
        .with_param(format!("input[{index}]")),
        EngineError::BadInput { index, reason } => ApiError::invalid_param(
            format!("input[{index}]"),
            format!("`input[{index}]`: {reason}"),
        ),
        EngineError::Text(t) => ApiError::invalid_param("input", format!("cannot tokenize: {t}")),
        other => ApiError::internal("embedding", &other),
    }
}

/// The vector as OpenAI's `encoding_format` asks: a list of floats, or base64 of the
/// little-endian f32 bytes.
fn encode(v: &[f32], base64: bool) -> Value {
    if base64 {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        json!(base64_encode(&bytes))
    } else {
        json!(v)
    }
}

/// `dimensions`: a positive integer.
fn parse_dimensions(v: &Option<Value>) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid_param("dimensions", "`dimensions` must be a positive integer")
            }),
    }
}

/// `POST /v1/embeddings`.
pub async fn openai_embeddings(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<OpenAiRequest>,
) -> Result<Json<Value>, ApiError> {
    let base64 = match &req.encoding_format {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("`encoding_format` must be \"float\" or \"base64\", not {other}"),
            ))
        }
    };
    let dimensions = parse_dimensions(&req.dimensions)?;
    let inputs = openai_inputs(&req.input)?;
    let runner = state.models.get(&req.model).await?;
    let out = run(&state, runner.clone(), inputs, false, dimensions).await?;
    let data: Vec<Value> = out
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": encode(v, base64)}))
        .collect();
    let n = out.total_tokens();
    state.metrics.embedded(&runner.spec.id, n);
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": runner.spec.id,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    })))
}

#[derive(Deserialize)]
pub struct OllamaEmbedRequest {
    model: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    dimensions: Option<Value>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    options: Option<Value>,
}

/// `POST /api/embed`: `input` a string or a list of strings; `truncate` (default true, as
/// Ollama) cuts over-long texts to the model's limit.
pub async fn ollama_embed(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<OllamaEmbedRequest>,
) -> Result<Response, OllamaError> {
    let t0 = Instant::now();
    let ka = keep_alive(&req.keep_alive)?;
    let dimensions = parse_dimensions(&req.dimensions)?;
    let inputs: Vec<Input> = match &req.input {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param("input", "`input` is missing").into())
        }
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(list)) if list.is_empty() => {
            return Err(ApiError::invalid_param(
                "input",
                "`input` is an empty list: send at least one text",
            )
            .into())
        }
        Some(Value::Array(list)) if list.len() > MAX_INPUTS => {
            return Err(ApiError::invalid_param(
                "input",
                format!(
                    "`input` has {} items; at most {MAX_INPUTS} per request",
                    list.len()
                ),
            )
            .into())
        }
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(Input::Text(s.clone())),
                _ => Err(ApiError::invalid_param(
                    format!("input[{i}]"),
                    format!("`input[{i}]` must be a string"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "input",
                "`input` must be a string or a list of strings",
            )
            .into())
        }
    };
    let load_started = Instant::now();
    let runner = state.models.get(&req.model).await?;
    let load = load_started.elapsed();
    apply_keep_alive(&state, &runner.spec.id, ka);
    let out = run(
        &state,
        runner.clone(),
        inputs,
        req.truncate.unwrap_or(true),
        dimensions,
    )
    .await?;
    let n = out.total_tokens();
    state.metrics.embedded(&runner.spec.id, n);
    Ok(Json(json!({
        "model": runner.spec.id,
        "embeddings": out.vectors,
        "total_duration": t0.elapsed().as_nanos() as u64,
        "load_duration": load.as_nanos() as u64,
        "prompt_eval_count": n,
    }))
    .into_response())
}

#[derive(Deserialize)]
pub struct OllamaEmbeddingsRequest {
    model: String,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    options: Option<Value>,
}

/// `POST /api/embeddings` (Ollama's older route): one `prompt`, `{"embedding": [...]}`. An
/// over-long prompt is a 400 (this route has no `truncate`).
pub async fn ollama_embeddings(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<OllamaEmbeddingsRequest>,
) -> Result<Response, OllamaError> {
    let ka = keep_alive(&req.keep_alive)?;
    let Some(prompt) = req.prompt else {
        return Err(ApiError::invalid_param("prompt", "`prompt` is missing").into());
    };
    let runner = state.models.get(&req.model).await?;
    apply_keep_alive(&state, &runner.spec.id, ka);
    let out = run(
        &state,
        runner.clone(),
        vec![Input::Text(prompt)],
        false,
        None,
    )
    .await
    .map_err(|mut e| {
        // This route's one text is `prompt`.
        if e.param.as_deref() == Some("input[0]") {
            e.param = Some("prompt".into());
            e.message = e.message.replace("`input[0]`", "`prompt`");
        }
        e
    })?;
    state.metrics.embedded(&runner.spec.id, out.total_tokens());
    Ok(Json(json!({ "embedding": out.vectors[0] })).into_response())
}

/// Standard base64 (RFC 4648, with padding).
fn base64_encode(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(raw.as_bytes()), enc, "{raw:?}");
        }
        assert_eq!(base64_encode(&[0xff, 0xfe, 0x00]), "//4A");
    }
}
