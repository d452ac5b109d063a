//! What the server logs, at every level down to TRACE: the route of each request, never the
//! API key (right or wrong), the query string or the text of a prompt. Its own test binary,
//! because it installs the process-wide log subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::*;
use serde_json::json;

/// Log lines, shared with the subscriber's writer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const KEY: &str = "sk-KEYSECRET-7f3a";
const WRONG_KEY: &str = "sk-WRONGSECRET-91c2";
const QUERY: &str = "QUERYSECRET-55e1";
const PROMPT: &str = "PROMPTSECRET-0b7d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_name_routes_and_never_keys_queries_or_prompts() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .unwrap();
    let app = flowrt_server::app(state_with(flowrt_server::ServerConfig {
        api_key: Some(KEY.into()),
        ..config()
    }));
    let with = |method: Method, uri: &str, auth: (&'static str, String), body: Body| {
        let mut r = request(method, uri, body);
        r.headers_mut().insert(auth.0, auth.1.parse().unwrap());
        r
    };
    let bearer = |k: &str| ("authorization", format!("Bearer {k}"));
    let bearer: fn(&str) -> (&'static str, String) = bearer;
    let r = send(
        &app,
        with(
            Method::GET,
            &format!("/v1/models?token={QUERY}"),
            bearer(KEY),
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    for auth in [bearer(WRONG_KEY), ("x-api-key", WRONG_KEY.to_string())] {
        let r = send(&app, with(Method::GET, "/v1/models", auth, Body::empty())).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    }
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": format!("{PROMPT}: say hi")}],
        "max_tokens": 4,
    });
    let r = send(
        &app,
        with(
            Method::POST,
            "/v1/chat/completions",
            bearer(KEY),
            chat.to_string().into(),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // A prompt the server refuses is not logged either.
    let bad = json!({"model": MODEL, "messages": [{"role": PROMPT, "content": PROMPT}]});
    let r = send(
        &app,
        with(
            Method::POST,
            "/v1/chat/completions",
            bearer(KEY),
            bad.to_string().into(),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());

    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    // The capture works and requests are logged by their route ...
    assert!(
        logs.contains("path=/v1/models") && logs.contains("path=/v1/chat/completions"),
        "the request spans are missing from the log:\n{logs}"
    );
    // ... and nothing secret is.
    for secret in [KEY, WRONG_KEY, QUERY, PROMPT, "KEYSECRET", "Bearer"] {
        assert!(
            !logs.contains(secret),
            "`{secret}` appears in the log:\n{logs}"
        );
    }
}
