//! `POST /tokenize` and `POST /detokenize` in llama-server's shapes, with a `model` field
//! naming which of the served models' tokenizers to use.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::models::Runner;
use crate::AppState;

#[derive(Deserialize)]
pub struct TokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    content: String,
    /// Add what the model's tokenizer adds around a text (BOS for most GGUFs).
    #[serde(default)]
    add_special: bool,
    /// Match special tokens written in the text (`<|im_start|>`) as single ids, as prompts
    /// are tokenized.
    #[serde(default = "yes")]
    parse_special: bool,
    /// Answer `[{"id", "piece"}]` instead of bare ids.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u64>,
}

/// The model a tokenizer request names; with `model` left out, the only model served (a
/// server of several models needs the name: it never picks one).
async fn runner(state: &AppState, model: Option<&str>) -> Result<Arc<Runner>, ApiError> {
    let name = match model {
        Some(m) => m.to_string(),
        None => {
            let specs = state.models.specs();
            match specs.as_slice() {
                [one] => one.id.clone(),
                _ => {
                    return Err(ApiError::invalid_param(
                        "model",
                        format!(
                            "this server serves {} models: name one in `model` (GET /v1/models lists them)",
                            specs.len()
                        ),
                    ))
                }
            }
        }
    };
    state.models.get(&name).await
}

/// A piece as text when it is whole UTF-8, else its bytes (half a character).
fn piece_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => json!(s),
        Err(_) => json!(bytes),
    }
}

pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let runner = runner(&state, req.model.as_deref()).await?;
    let _turn = crate::gen::tokenize_turn(&state, &runner).await?;
    let model = runner.model.clone();
    let body = tokio::task::spawn_blocking(move || {
        let tok = &model.tokenizer;
        let ids = tok
            .encode(&req.content, req.add_special, req.parse_special)
            .map_err(|e| {
                ApiError::invalid_param("content", format!("`content` could not be tokenized: {e}"))
            })?;
        if !req.with_pieces {
            return Ok(json!({ "tokens": ids }));
        }
        let tokens = ids
            .iter()
            .map(|&id| {
                let piece = tok
                    .token_to_piece(id)
                    .map_err(|e| ApiError::internal("reading a token's piece", &e))?;
                Ok(json!({ "id": id, "piece": piece_json(piece) }))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(json!({ "tokens": tokens }))
    })
    .await
    .map_err(|e| ApiError::internal("tokenizing", &e))?;
    runner.touch();
    body.map(Json)
}

pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let runner = runner(&state, req.model.as_deref()).await?;
    let vocab = runner.model.tokenizer.vocab_size();
    let ids = req
        .tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "tokens",
                        format!("`tokens[{i}]` = {t} is outside the vocabulary of {vocab} tokens"),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let model = runner.model.clone();
    let text = tokio::task::spawn_blocking(move || model.tokenizer.decode(&ids, false))
        .await
        .map_err(|e| ApiError::internal("detokenizing", &e))?
        .map_err(|e| ApiError::invalid_param("tokens", format!("`tokens`: {e}")))?;
    runner.touch();
    Ok(Json(json!({ "content": text })))
}
