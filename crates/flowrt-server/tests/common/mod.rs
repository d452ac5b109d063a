//! Shared by the server's route tests: a state serving the real SmolLM2 and a way to call
//! the router without a socket.
#![allow(dead_code)]

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use flowrt_engine::EngineOptions;
use flowrt_server::{app, AppState, ModelSpec, ServerConfig};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub const MODEL: &str = "smollm2:135m";
pub const N_CTX: usize = 512;

#[allow(unused_imports)] // not every test binary that includes this module uses it
pub use flowrt_testkit::models::smollm2;

pub fn config() -> ServerConfig {
    ServerConfig {
        engine: EngineOptions {
            threads: 2,
            n_ctx: Some(N_CTX),
            ..EngineOptions::default()
        },
        parallel: 2,
        queue: 4,
        ..ServerConfig::default()
    }
}

pub fn state_with(cfg: ServerConfig) -> AppState {
    let path = smollm2();
    let size = std::fs::metadata(&path).unwrap().len();
    let spec = ModelSpec::new(MODEL, path, "ab".repeat(32), size, "test")
        .unwrap()
        .with_aliases(["smollm2".to_string()]);
    AppState::new(vec![spec], cfg)
}

pub fn router() -> Router {
    app(state_with(config()))
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The `data:` payloads of an SSE body.
    pub fn sse(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
    /// The lines of an NDJSON body, parsed.
    pub fn ndjson(&self) -> Vec<Value> {
        self.text()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

pub fn request(method: Method, uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let resp = tokio::time::timeout(Duration::from_secs(120), app.clone().oneshot(req))
        .await
        .expect("the router answered within 120 s")
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(300), resp.into_body().collect())
        .await
        .expect("the body ended within 300 s")
        .unwrap()
        .to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

pub async fn get(app: &Router, uri: &str) -> Reply {
    send(app, request(Method::GET, uri, Body::empty())).await
}

pub async fn post(app: &Router, uri: &str, body: &Value) -> Reply {
    send(app, request(Method::POST, uri, body.to_string())).await
}

/// Poll `f` until it is true (panics after 30 s).
pub async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}
