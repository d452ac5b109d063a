//! flowrt's HTTP server: an OpenAI- and Ollama-compatible API that runs exactly the model a
//! request names, or answers 404 `model_not_found`.
//!
//! [`app`] builds the [`axum::Router`]; tests drive it with `tower::ServiceExt::oneshot`
//! and no socket, and `flowrt serve` runs it with [`serve`] on a TCP listener.
//!
//! Layout:
//! - [`models`]: the models served ([`ModelSpec`]), loading on first use, keep-alive and
//!   least-recently-used unloading within a memory budget;
//! - `registry`: serving every model of the registry (`$FLOWRT_HOME/registry.json`) by
//!   its tag, re-read as it changes ([`AppState::from_registry`]);
//! - [`scheduler`]: one actor thread per resident model owning its KV cache slots, a bounded
//!   queue (429 beyond it), one engine step per turn over all active sequences (the engine's
//!   batching policy, [`flowrt_engine::BatchStepper`]: every active sequence in one forward
//!   pass of at most the batch size, long prompts fed in chunks over several steps),
//!   cancellation when a client goes away;
//! - `openai`, `ollama`, `anthropic` (`/v1/messages`): the routes; `embed`: the embedding
//!   routes of both APIs; `tokenize`: llama-server's `/tokenize` and `/detokenize`;
//!   [`error`]: the one error type; [`metrics`]: Prometheus; `web`: the chat page at `/`;
//! - `listen`: the connection loop ([`serve`]): a header-read timeout per connection and a
//!   bounded graceful shutdown.

#[doc(hidden)]
pub mod agent;
mod anthropic;
pub mod details;
mod embed;
pub mod error;
mod extract;
mod gen;
mod listen;
pub mod metrics;
pub mod models;
mod ollama;
mod openai;
mod registry;
pub mod scheduler;
mod tokenize;
mod web;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use flowrt_engine::EngineOptions;
use serde_json::json;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::{DefaultOnFailure, TraceLayer};

pub use error::{ApiError, ErrorKind};
pub use listen::{serve, ServeOptions, Stopped, DEFAULT_HEADER_TIMEOUT};
pub use metrics::Metrics;
pub use models::{ModelManager, ModelSpec, ModelState};

/// The default `--body-timeout`: 4 MiB (the default body limit) arrives in it at 70 KB/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// The default `--memory-wait`.
pub const DEFAULT_MEMORY_WAIT: Duration = Duration::from_secs(60);

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Threads, context length, KV type, batch size, backend and its options for every model.
    pub engine: EngineOptions,
    /// Sequences each model runs at once (its KV cache slots).
    pub parallel: usize,
    /// Requests each model lets wait for a slot; beyond that, 429.
    pub queue: usize,
    /// How long a model stays resident after its last request; `None` = until shutdown.
    pub keep_alive: Option<Duration>,
    /// Most bytes (weights plus KV caches, estimated) resident models may take; `None` = no
    /// limit.
    pub memory_budget: Option<u64>,
    /// How long a request for a model that does not fit the memory budget while the resident
    /// models are busy waits for one of them to go idle (then unloaded to make room) before a
    /// 503; `ZERO` = refuse at once. Requests waiting so are served first come, first served,
    /// at most `queue` of them.
    pub memory_wait: Duration,
    /// With a key, every route but `/health` and the chat page's files needs
    /// `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`).
    pub api_key: Option<String>,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// How long a JSON request body may take to arrive once its header has (a 408 then);
    /// `None` = no bound. Against clients that send a body a byte at a time to hold a
    /// connection and its buffer.
    pub body_timeout: Option<Duration>,
    /// Web origins (`https://app.example`, or `*` for any) whose pages may read this
    /// server's answers (CORS). Empty: no CORS headers at all, so browsers keep other sites'
    /// pages from reading a local server. See [`check_cors_origin`].
    pub cors_origins: Vec<String>,
    /// Report `usage.prompt_tokens_details.cached_tokens` (prompt tokens reused from the
    /// shared prefix cache). Off by default: with several clients it reveals how much of a
    /// guessed prompt matches another client's (their system prompt, token by token).
    pub report_cached_tokens: bool,
    /// The names a request's `Host` header may carry (any port), against DNS rebinding: a
    /// page on a name the attacker controls, re-pointed at 127.0.0.1, reaches a loopback
    /// server with its own name in `Host`. `None`: no check. See [`host_allowed`].
    pub allowed_hosts: Option<Vec<String>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            engine: EngineOptions::default(),
            parallel: 4,
            queue: 64,
            keep_alive: Some(Duration::from_secs(300)),
            memory_budget: None,
            memory_wait: DEFAULT_MEMORY_WAIT,
            api_key: None,
            max_body_bytes: 4 << 20,
            body_timeout: Some(DEFAULT_BODY_TIMEOUT),
            cors_origins: Vec::new(),
            report_cached_tokens: false,
            allowed_hosts: None,
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<ServerConfig>,
    pub models: Arc<ModelManager>,
    pub metrics: Arc<Metrics>,
    pub started: Instant,
    /// Set when the server is shutting down: new requests get 503 while open ones finish.
    pub draining: Arc<AtomicBool>,
}

impl AppState {
    /// A server for `specs` (none is loaded until used or preloaded).
    pub fn new(specs: Vec<ModelSpec>, config: ServerConfig) -> AppState {
        let config = Arc::new(config);
        let metrics = Arc::new(Metrics::default());
        let models = Arc::new(ModelManager::new(specs, config.clone(), metrics.clone()));
        AppState {
            config,
            draining: models.draining_flag(),
            models,
            metrics,
            started: Instant::now(),
        }
    }

    /// A server for every model registered in the flowrt home `home` (none is loaded until
    /// used): requests name a registered tag, or a bare family naming one registered model;
    /// models registered or removed while the server runs are picked up on the next request.
    pub fn from_registry(
        home: PathBuf,
        config: ServerConfig,
    ) -> Result<AppState, flowrt_store::StoreError> {
        let config = Arc::new(config);
        let metrics = Arc::new(Metrics::default());
        let models = Arc::new(ModelManager::from_registry(
            home,
            config.clone(),
            metrics.clone(),
        )?);
        Ok(AppState {
            config,
            draining: models.draining_flag(),
            models,
            metrics,
            started: Instant::now(),
        })
    }
}

/// The router with every route, auth, metrics, request tracing and (when origins are
/// configured) CORS.
pub fn app(state: AppState) -> Router {
    let router = Router::new()
        .route("/", get(web::root))
        .merge(web::routes())
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{*id}", get(openai::get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embed::openai_embeddings))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/embed", post(embed::ollama_embed))
        .route("/api/embeddings", post(embed::ollama_embeddings))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), refuse_when_draining))
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .layer(middleware::from_fn(shape_errors))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .layer(
            // The path only (a query string may hold what a client meant to keep private);
            // a 5xx the server makes itself is logged where it is made (`ApiError::internal`,
            // model loading), so a `/health` 503 while loading is no ERROR line.
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path())
                })
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        );
    // Outermost, so a preflight `OPTIONS` is answered before the API key is checked (browsers
    // send preflights without credentials).
    let router = match cors_layer(&state.config.cors_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.with_state(state)
}

/// Checks a `--cors-origin` value: `*`, or `scheme://host[:port]` as a browser sends it in
/// `Origin` (no path, no trailing slash).
pub fn check_cors_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Err(format!(
            "`{origin}` is not an origin: write `*` or scheme://host[:port], e.g. http://localhost:3000"
        ));
    };
    let ok_scheme = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    let ok_rest = !rest.is_empty()
        && !rest.contains(['/', '?', '#', '*'])
        && rest.chars().all(|c| c.is_ascii_graphic());
    if ok_scheme && ok_rest {
        Ok(())
    } else {
        Err(format!(
            "`{origin}` is not an origin: write `*` or scheme://host[:port] with no path, e.g. http://localhost:3000"
        ))
    }
}

/// CORS for `origins` (`None` when there are none: no CORS headers). Preflights allow GET,
/// POST and OPTIONS with `Authorization` and `Content-Type`, and Anthropic's `x-api-key` and
/// `anthropic-version`.
fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    let valid: Vec<&String> = origins
        .iter()
        .filter(|o| match check_cors_origin(o) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("ignoring CORS origin: {e}");
                false
            }
        })
        .collect();
    if valid.is_empty() {
        return None;
    }
    let allow = if valid.iter().any(|o| o.as_str() == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(valid.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("x-api-key"),
                HeaderName::from_static("anthropic-version"),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorKind::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorKind::MethodNotAllowed,
        "this route does not accept that method",
    )
}

/// `200 {"status": "ok"}` when serving; `503 {"status": "loading"}` while models named at
/// start are still loading. Never needs the API key.
async fn health(State(state): State<AppState>) -> Response {
    let models: serde_json::Map<String, serde_json::Value> = state
        .models
        .specs()
        .iter()
        .map(|s| {
            let st = match state.models.state(&s.id) {
                ModelState::Ready => "ready",
                ModelState::Loading => "loading",
                ModelState::Unloaded => "unloaded",
            };
            (s.id.clone(), json!(st))
        })
        .collect();
    let loading = state.models.is_preloading();
    let status = if loading {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = json!({
        "status": if loading { "loading" } else { "ok" },
        "models": models,
        "uptime_s": state.started.elapsed().as_secs(),
    });
    (status, Json(body)).into_response()
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    let text = state.metrics.render(&state.models.gauges());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// API-key check on every route but `/health` and the chat page's files: `Authorization:
/// Bearer KEY`, or `x-api-key: KEY` as Anthropic's clients send it.
async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = state.config.api_key.as_deref() else {
        return next.run(req).await;
    };
    if req.uri().path() == "/health" || web::is_public(&req) {
        return next.run(req).await;
    }
    if key_given(req.headers(), key) {
        return next.run(req).await;
    }
    let e = ApiError::new(
        ErrorKind::Unauthorized,
        "missing or wrong API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
    );
    if req.uri().path().starts_with("/v1/messages") {
        anthropic::AnthropicError(e).into_response()
    } else {
        e.into_response()
    }
}

/// Whether `Authorization: Bearer KEY` or `x-api-key: KEY` carries `key`.
fn key_given(headers: &header::HeaderMap, key: &str) -> bool {
    let header_str = |name| headers.get(name).and_then(|v| v.to_str().ok());
    [
        header_str(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer ")),
        header_str(header::HeaderName::from_static("x-api-key")),
    ]
    .into_iter()
    .flatten()
    .any(|given| constant_time_eq(given.as_bytes(), key.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for (i, &x) in a.iter().enumerate() {
        diff |= x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0);
    }
    diff == 0
}

/// While the server shuts down, new requests get 503 (open ones run on).
/// The names a loopback server answers to whatever `--allowed-host` adds.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Whether the `Host` header value `host` (`name`, `name:port`, `[v6]:port`; any case, a
/// trailing dot) names one of `allowed` (names or addresses as `--allowed-host` takes them,
/// without ports).
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let name = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => &host[..=end],
            None => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host.as_str(),
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && allowed.iter().any(|a| {
            let a = a.trim().to_ascii_lowercase();
            a.strip_suffix('.').unwrap_or(&a) == name
        })
}

/// 403 for a request whose `Host` names none of [`ServerConfig::allowed_hosts`]. A request
/// without `Host` (HTTP/1.0 tools) passes: a browser always sends one.
async fn check_host(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(allowed) = state.config.allowed_hosts.as_deref() else {
        return next.run(req).await;
    };
    let host = req
        .headers()
        .get(header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    match host {
        Some(h) if !host_allowed(&h, allowed) => ApiError::new(
            ErrorKind::ForbiddenHost,
            format!(
                "this server does not answer to the `Host` `{}` (it answers to {}); a page on another name may be a DNS-rebinding attack. Start it with `--allowed-host NAME` to add a name",
                error::clip(&h, 100),
                allowed.join(", ")
            ),
        )
        .with_param("Host")
        .into_response(),
        _ => next.run(req).await,
    }
}

async fn refuse_when_draining(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.draining.load(Ordering::SeqCst) {
        let mut resp = ApiError::new(
            ErrorKind::Unavailable,
            "the server is shutting down; retry against another instance or after it restarts",
        )
        .into_response();
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    next.run(req).await
}

/// Answer every error in the shape of the route's API (see [`error::Shape`]), whoever made
/// it: a handler, an extractor's rejection, auth, a fallback, or axum itself (whose
/// rejections are plain text: bad path segments, body limits).
async fn shape_errors(req: Request, next: Next) -> Response {
    let shape = error::Shape::of_path(req.uri().path());
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let e = if let Some(error::OpenAiShaped(e)) = resp.extensions().get().cloned() {
        if shape == error::Shape::OpenAi {
            return resp;
        }
        e
    } else if resp.extensions().get::<ErrorKind>().is_some() {
        // Already in its API's shape.
        return resp;
    } else {
        // A plain rejection: read its (short) text as the message.
        let text = match axum::body::to_bytes(resp.into_body(), 4096).await {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(_) => String::new(),
        };
        ApiError::from_rejection(status, &text)
    };
    match shape {
        error::Shape::OpenAi => e.into_response(),
        error::Shape::Ollama => error::OllamaError(e).into_response(),
        error::Shape::Anthropic => anthropic::AnthropicError(e).into_response(),
    }
}

/// Count every request by route and status, and errors by kind.
async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let resp = next.run(req).await;
    let kind = resp.extensions().get::<ErrorKind>().copied();
    state.metrics.request(&route, resp.status().as_u16(), kind);
    resp
}
