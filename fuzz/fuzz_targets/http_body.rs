//! OpenAI, Anthropic and Ollama request bodies through the server's router (every
//! middleware, the JSON extractor and each handler's validation), without a socket, on a
//! server with no model: a body that passes validation ends at "model not found". The first
//! byte picks the route; the rest is the body. Any body must get a 4xx JSON error in the
//! route's own shape, never a panic, a 5xx or a hang.
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use flowrt_server::{app, AppState, ServerConfig};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

const ROUTES: [&str; 12] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/api/embed",
    "/api/embeddings",
    "/tokenize",
    "/detokenize",
    "/api/show",
    "/api/chat",
    "/api/generate",
];

struct Harness {
    rt: tokio::runtime::Runtime,
    router: Router,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let router = rt.block_on(async { app(AppState::new(Vec::new(), ServerConfig::default())) });
        Harness { rt, router }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let route = ROUTES[pick as usize % ROUTES.len()];
    let h = harness();
    let req = Request::builder()
        .method("POST")
        .uri(route)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .unwrap();
    let (status, bytes) = h.rt.block_on(async {
        let resp = h.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, bytes)
    });
    assert!(
        !status.is_server_error() && status != StatusCode::OK,
        "{route}: {status} for a server with no model: {}",
        String::from_utf8_lossy(&bytes)
    );
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{route}: {status} body is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert!(
        json.get("error").is_some(),
        "{route}: {status} without `error`: {json}"
    );
});
