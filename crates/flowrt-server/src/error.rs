//! The one error type every route returns, in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` (Ollama routes wrap it as
//! `{"error": "message"}`, see [`OllamaError`]).
//!
//! Messages are written for the client: they name the request field and what to do. Internal
//! failures are logged with their detail and answered with a generic message, so paths, engine
//! state and backtraces never reach a client.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// What went wrong, as far as the client and the metrics are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The request is malformed or asks for something unsupported.
    InvalidRequest,
    /// The prompt (plus the tokens asked for) does not fit the context.
    ContextLength,
    /// The model named is not served here.
    ModelNotFound,
    /// No such route.
    NotFound,
    MethodNotAllowed,
    /// Missing or wrong bearer token.
    Unauthorized,
    /// The request body is larger than the server accepts.
    PayloadTooLarge,
    /// The request body did not arrive within `--body-timeout`.
    RequestTimeout,
    /// A JSON route was sent a body that is not `Content-Type: application/json`.
    UnsupportedMediaType,
    /// The `Host` header names a host this server does not answer for (DNS rebinding).
    ForbiddenHost,
    /// The model's wait queue is full.
    Overloaded,
    /// The model could not be loaded, or does not fit the memory budget.
    Unavailable,
    /// A failure inside the server (logged, never detailed to the client).
    Internal,
}

impl ErrorKind {
    /// The label used in metrics and as OpenAI's `code` where no finer code applies.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::ContextLength => "context_length_exceeded",
            ErrorKind::ModelNotFound => "model_not_found",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::Unauthorized => "invalid_api_key",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::UnsupportedMediaType => "unsupported_media_type",
            ErrorKind::ForbiddenHost => "forbidden_host",
            ErrorKind::Overloaded => "queue_full",
            ErrorKind::Unavailable => "model_unavailable",
            ErrorKind::Internal => "internal_error",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => StatusCode::BAD_REQUEST,
            ErrorKind::ModelNotFound | ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::ForbiddenHost => StatusCode::FORBIDDEN,
            ErrorKind::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` field.
    fn openai_type(self) -> &'static str {
        match self {
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::Overloaded => "rate_limit_error",
            ErrorKind::Unavailable | ErrorKind::Internal => "server_error",
            _ => "invalid_request_error",
        }
    }
}

/// An error answered to a client.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault, when there is one (`messages[2].role`, `max_tokens`).
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// A 400 for a bad or unsupported request value.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::InvalidRequest, message)
    }

    /// A 400 naming the field at fault.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::invalid(message).with_param(param)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> ApiError {
        self.param = Some(param.into());
        self
    }

    pub fn model_not_found(name: &str) -> ApiError {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!(
                "the model `{}` does not exist on this server (GET /v1/models lists the models it serves)",
                clip(name, 200)
            ),
        )
        .with_param("model")
    }

    pub fn overloaded(model: &str, retry_after: u64) -> ApiError {
        let mut e = ApiError::new(
            ErrorKind::Overloaded,
            format!("the wait queue of model `{model}` is full; retry in {retry_after} s"),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// A failure inside the server: the detail goes to the log, the client gets a generic
    /// message.
    pub fn internal(context: &str, detail: &dyn std::fmt::Display) -> ApiError {
        tracing::error!(context, error = %detail, "internal error");
        ApiError::new(
            ErrorKind::Internal,
            format!("internal error while {context} (see the server log)"),
        )
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    fn with_headers(&self, mut resp: Response) -> Response {
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if self.kind == ErrorKind::Unauthorized {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp.extensions_mut().insert(self.kind);
        resp
    }

    /// The error a response of `status` that axum or a layer made before any handler ran
    /// (a plain-text rejection) stands for, with `text` (its body) as the message.
    pub fn from_rejection(status: StatusCode, text: &str) -> ApiError {
        let kind = match status {
            StatusCode::NOT_FOUND => ErrorKind::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ErrorKind::MethodNotAllowed,
            StatusCode::UNAUTHORIZED => ErrorKind::Unauthorized,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::PayloadTooLarge,
            StatusCode::REQUEST_TIMEOUT => ErrorKind::RequestTimeout,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorKind::UnsupportedMediaType,
            StatusCode::FORBIDDEN => ErrorKind::ForbiddenHost,
            StatusCode::TOO_MANY_REQUESTS => ErrorKind::Overloaded,
            StatusCode::SERVICE_UNAVAILABLE => ErrorKind::Unavailable,
            s if s.is_client_error() => ErrorKind::InvalidRequest,
            _ => ErrorKind::Internal,
        };
        let text = text.trim();
        let message = if text.is_empty() {
            status
                .canonical_reason()
                .unwrap_or("request refused")
                .to_string()
        } else {
            clip(text, 300)
        };
        ApiError::new(kind, message)
    }

    /// The OpenAI-shaped body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind.openai_type(),
                "param": self.param,
                "code": self.kind.as_str(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let resp = (self.status(), axum::Json(self.body())).into_response();
        let mut resp = self.with_headers(resp);
        resp.extensions_mut().insert(OpenAiShaped(self));
        resp
    }
}

/// Marks a response answered in OpenAI's shape, so that [`crate::shape_errors`] can answer
/// it in the shape of the route's API instead (errors from extractors, auth and fallbacks).
#[derive(Clone, Debug)]
pub struct OpenAiShaped(pub ApiError);

/// Which API's error shape a path answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    /// `/api/*`: `{"error": "message"}`.
    Ollama,
    /// `/v1/messages*`: `{"type": "error", "error": {...}}`.
    Anthropic,
}

impl Shape {
    pub fn of_path(path: &str) -> Shape {
        if path.starts_with("/api/") || path == "/api" {
            Shape::Ollama
        } else if path.starts_with("/v1/messages") {
            Shape::Anthropic
        } else {
            Shape::OpenAi
        }
    }
}

impl ApiError {
    /// The message as Ollama's `{"error": "..."}` carries it: with no `param` field there,
    /// a 400 whose message does not name its field says it first (`` `think`: ... ``).
    pub fn ollama_message(&self) -> String {
        match &self.param {
            Some(p)
                if self.kind == ErrorKind::InvalidRequest
                    && !self.message.contains(&format!("`{p}`"))
                    && !(p.contains('[') && self.message.contains(p.as_str())) =>
            {
                format!("`{p}`: {}", self.message)
            }
            _ => self.message.clone(),
        }
    }
}

/// [`ApiError`] as Ollama answers errors: `{"error": "message"}`, same status codes.
#[derive(Debug)]
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let e = self.0;
        let resp = (
            e.status(),
            axum::Json(json!({ "error": e.ollama_message() })),
        )
            .into_response();
        e.with_headers(resp)
    }
}

/// At most `max` bytes of `s` (on a character boundary), for echoing client input safely.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
