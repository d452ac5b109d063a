//! Malformed and hostile requests: each gets a 4xx JSON error, and the server keeps serving.

mod common;

use axum::body::Body;
use axum::http::{Method, Request};
use common::*;
use serde_json::{json, Value};

fn chat(extra: Value) -> String {
    let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            b.as_object_mut().unwrap().remove(k);
        } else {
            b[k] = v.clone();
        }
    }
    b.to_string()
}

#[tokio::test]
async fn hostile_requests_get_4xx_json_errors_and_the_server_keeps_serving() {
    let app = router();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let giant = format!(
        "{{\"model\":\"{MODEL}\",\"prompt\":\"{}\"}}",
        "a".repeat(5 << 20)
    );
    let long_prompt = "lorem ipsum ".repeat(600);
    let c = "/v1/chat/completions";
    let p = "/v1/completions";
    let cases: Vec<(Method, &str, String)> = vec![
        (Method::POST, c, "{not json".into()),
        (Method::POST, c, "".into()),
        (Method::POST, c, "null".into()),
        (Method::POST, c, "[]".into()),
        (Method::POST, c, "42".into()),
        (Method::POST, c, deep.clone()),
        (Method::POST, c, giant.clone()),
        (Method::POST, c, format!("{} trailing", chat(json!({})))),
        (Method::POST, c, chat(json!({"model": null}))),
        (Method::POST, c, chat(json!({"model": 7}))),
        (Method::POST, c, chat(json!({"model": ""}))),
        (Method::POST, c, chat(json!({"model": "no-such-model"}))),
        (Method::POST, c, chat(json!({"model": "../../etc/passwd"}))),
        (Method::POST, c, chat(json!({"messages": []}))),
        (Method::POST, c, chat(json!({"messages": null}))),
        (Method::POST, c, chat(json!({"messages": {"role": "user"}}))),
        (Method::POST, c, chat(json!({"messages": [{"role": "wizard", "content": "hi"}]}))),
        (Method::POST, c, chat(json!({"messages": [{"role": "tool", "content": "hi"}]}))),
        (Method::POST, c, chat(json!({"messages": [{"content": "hi"}]}))),
        (Method::POST, c, chat(json!({"messages": [{"role": "user"}]}))),
        (Method::POST, c, chat(json!({"messages": [{"role": "user", "content": 5}]}))),
        (Method::POST, c, chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}))),
        (Method::POST, c, chat(json!({"messages": [{"role": "user", "content": long_prompt}]}))),
        (Method::POST, c, chat(json!({"max_tokens": -1}))),
        (Method::POST, c, chat(json!({"max_tokens": 0}))),
        (Method::POST, c, chat(json!({"max_tokens": 1e30}))),
        (Method::POST, c, chat(json!({"max_tokens": 18446744073709551615u64}))),
        (Method::POST, c, chat(json!({"max_tokens": "ten"}))),
        (Method::POST, c, chat(json!({"max_completion_tokens": 0}))),
        (Method::POST, c, chat(json!({"n": 17}))),
        (Method::POST, c, chat(json!({"n": 0}))),
        (Method::POST, c, chat(json!({"temperature": -1}))),
        (Method::POST, c, chat(json!({"temperature": 3}))),
        (Method::POST, c, chat(json!({"temperature": "hot"}))),
        (Method::POST, c, chat(json!({"top_p": 0}))),
        (Method::POST, c, chat(json!({"top_p": 1.5}))),
        (Method::POST, c, chat(json!({"min_p": 2}))),
        (Method::POST, c, chat(json!({"presence_penalty": 5}))),
        (Method::POST, c, chat(json!({"frequency_penalty": -3}))),
        (Method::POST, c, chat(json!({"repeat_penalty": 0}))),
        (Method::POST, c, chat(json!({"stop": 5}))),
        (Method::POST, c, chat(json!({"stop": [1, 2]}))),
        (Method::POST, c, chat(json!({"stop": vec!["x"; 17]}))),
        (Method::POST, c, chat(json!({"stop": ["y".repeat(1000)]}))),
        (Method::POST, c, chat(json!({"seed": "abc"}))),
        (Method::POST, c, chat(json!({"logprobs": true, "top_logprobs": 50}))),
        (Method::POST, c, chat(json!({"top_logprobs": 2}))),
        (Method::POST, c, chat(json!({"logit_bias": {"99999999": -100}}))),
        (Method::POST, c, chat(json!({"logit_bias": {"x": -100}}))),
        (Method::POST, c, chat(json!({"tools": [{"type": "function", "function": {"name": "f f"}}]}))),
        (Method::POST, c, chat(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array", "uniqueItems": true}}}]}))),
        (Method::POST, c, chat(json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}))),
        (Method::POST, c, chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "x"}}}}))),
        (Method::POST, c, chat(json!({"response_format": {"type": "xml"}}))),
        (Method::POST, c, chat(json!({"chat_template_kwargs": {"enable_thinking": true}}))),
        (Method::POST, c, chat(json!({"stream_options": {"include_usage": true}}))),
        (Method::POST, c, chat(json!({"stream": "yes"}))),
        (Method::POST, p, json!({"model": MODEL}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": 5}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": ["a", "b"]}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": [99999999]}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": [1, -2]}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": []}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": "hi", "echo": true}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": "hi", "best_of": 3}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": "hi", "suffix": "x"}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": "hi", "logprobs": 9}).to_string()),
        (Method::POST, p, json!({"model": MODEL, "prompt": long_prompt}).to_string()),
        (Method::POST, p, giant.clone()),
        (Method::POST, "/api/chat", json!({"model": MODEL, "messages": [{"role": "function", "content": "x"}]}).to_string()),
        (Method::POST, "/api/chat", json!({"model": MODEL, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}).to_string()),
        (Method::POST, "/api/chat", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "format": "yaml"}).to_string()),
        (Method::POST, "/api/chat", json!({"model": MODEL, "messages": "hi"}).to_string()),
        (Method::POST, "/api/chat", json!({"messages": []}).to_string()),
        (Method::POST, "/api/generate", json!({"model": MODEL, "prompt": "x", "options": {"num_predict": 0}}).to_string()),
        (Method::POST, "/api/generate", json!({"model": MODEL, "prompt": "x", "options": {"temperature": -2}}).to_string()),
        (Method::POST, "/api/generate", json!({"model": MODEL, "prompt": "x", "keep_alive": "forever-ish"}).to_string()),
        (Method::POST, "/api/generate", json!({"model": MODEL, "prompt": "x", "context": [1, 2, 3]}).to_string()),
        (Method::POST, "/api/generate", json!({"model": MODEL, "prompt": 12}).to_string()),
        (Method::POST, "/api/generate", "{{{".into()),
        (Method::POST, "/api/show", json!({}).to_string()),
        (Method::POST, "/api/show", json!({"model": "nope"}).to_string()),
        (Method::GET, c, String::new()),
        (Method::DELETE, "/v1/models", String::new()),
        (Method::GET, "/v1/nope", String::new()),
        (Method::GET, "/v1/models/nope%00x", String::new()),
        (Method::POST, "/api/tags", "{}".into()),
        (Method::POST, "/v1/messages", deep.clone()),
        (Method::POST, "/v1/messages", giant.clone()),
        (Method::POST, "/v1/messages", "[]".into()),
        (Method::POST, "/v1/messages", json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": long_prompt}]}).to_string()),
        (Method::POST, "/v1/messages", json!({"model": MODEL, "max_tokens": 1e30, "messages": [{"role": "user", "content": "x"}]}).to_string()),
        (Method::POST, "/v1/messages/count_tokens", json!({"model": "../../etc/passwd", "messages": [{"role": "user", "content": "x"}]}).to_string()),
        (Method::POST, "/tokenize", "{}".into()),
        (Method::POST, "/tokenize", json!({"content": ["a"]}).to_string()),
        (Method::POST, "/tokenize", json!({"model": "nope", "content": "a"}).to_string()),
        (Method::POST, "/detokenize", json!({"tokens": [99999999]}).to_string()),
        (Method::POST, "/detokenize", json!({"tokens": "1 2"}).to_string()),
        (Method::GET, "/tokenize", String::new()),
    ];
    assert!(cases.len() >= 50, "{} cases", cases.len());
    for (i, (method, uri, body)) in cases.into_iter().enumerate() {
        let req = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header("content-type", "application/json")
            .body(Body::from(body.clone()))
            .unwrap();
        let r = send(&app, req).await;
        let shown = &body[..body.len().min(120)];
        assert!(
            r.status.is_client_error(),
            "case {i} {method} {uri} {shown}: {} {}",
            r.status,
            r.text()
        );
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("case {i} {uri} {shown}: not JSON ({e}): {}", r.text()));
        let err = &v["error"];
        let msg = err.as_str().or_else(|| err["message"].as_str());
        assert!(
            msg.is_some_and(|m| !m.is_empty()),
            "case {i} {uri} {shown}: {v}"
        );
        assert!(
            !msg.unwrap().contains("/work/") && !msg.unwrap().contains(".gguf"),
            "case {i}: leaks a path: {v}"
        );
    }
    // Still serving.
    let r = send(&app, request(Method::POST, c, chat(json!({})))).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(get(&app, "/health").await.json()["status"], "ok");
}

/// `flowrt_tokenized_prompt_bytes_total` from `/metrics`.
async fn tokenized_bytes(app: &axum::Router) -> u64 {
    let t = get(app, "/metrics").await.text();
    t.lines()
        .find_map(|l| l.strip_prefix("flowrt_tokenized_prompt_bytes_total "))
        .unwrap_or_else(|| panic!("no tokenized-bytes counter: {t}"))
        .parse()
        .unwrap()
}

/// Issue 18: a ~4 MB prompt was tokenised whole (hundreds of MB of memory, seconds of CPU)
/// before the context check refused it. A prompt whose text is longer than the context could
/// spell (n_ctx times the vocabulary's longest token, in bytes) is refused before the
/// tokenizer sees it; one just under the bound is tokenized and gets the usual token count.
#[tokio::test]
async fn a_prompt_longer_than_the_context_could_hold_is_refused_before_tokenizing() {
    let app = router();
    let huge = "hello ".repeat(400_000);
    let r = send(
        &app,
        request(
            Method::POST,
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": huge}]})),
        ),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["param"], "messages", "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let msg = v["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains(&format!("({N_CTX} tokens")), "{msg}");
    assert_eq!(
        tokenized_bytes(&app).await,
        0,
        "the huge prompt was tokenized"
    );
    // The same on Ollama's route, naming `prompt`.
    let r = send(
        &app,
        request(
            Method::POST,
            "/api/generate",
            json!({"model": MODEL, "prompt": huge, "stream": false}).to_string(),
        ),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    let m = r.json()["error"].as_str().unwrap().to_string();
    assert!(m.contains("`prompt`") && m.contains("context"), "{m}");
    assert_eq!(
        tokenized_bytes(&app).await,
        0,
        "the huge prompt was tokenized"
    );

    // "… ({N_CTX} tokens of at most B bytes each, MAX bytes) …": just under MAX is tokenized
    // and refused by its token count as before.
    let max: usize = msg
        .split(" bytes each, ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no byte bound in {msg}"));
    assert!((16 * N_CTX..1 << 20).contains(&max), "bound {max}");
    let under = "hello ".repeat((max - 200) / 6);
    let r = send(
        &app,
        request(
            Method::POST,
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": under}]})),
        ),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        m.starts_with("the prompt has ") && m.contains(" tokens"),
        "{m}"
    );
    assert!(tokenized_bytes(&app).await >= under.len() as u64);
}

fn with_type(method: Method, uri: &str, content_type: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = content_type {
        b = b.header("content-type", t);
    }
    b.body(Body::from(body.to_string())).unwrap()
}

/// Issue 18: errors made before a handler ran (bad JSON, 405, 404, 413, 401) answered
/// `/api/*` in OpenAI's shape, and an invalid UTF-8 path segment got a plain-text 400. Each
/// route answers in its API's shape: Ollama `{"error": "…"}`, Anthropic
/// `{"type": "error", "error": {…}}`, OpenAI `{"error": {"message", …}}`.
#[tokio::test]
async fn errors_before_the_handler_answer_in_the_routes_own_shape() {
    let app = flowrt_server::app(state_with(flowrt_server::ServerConfig {
        max_body_bytes: 1000,
        ..config()
    }));
    let json = Some("application/json");
    let big = format!("{{\"model\":\"x\",\"prompt\":\"{}\"}}", "a".repeat(2000));
    let ollama: Vec<(Request<Body>, u16, &str)> = vec![
        (
            with_type(Method::POST, "/api/chat", json, "{not json"),
            400,
            "key must be a string",
        ),
        (with_type(Method::GET, "/api/chat", None, ""), 405, "method"),
        (
            with_type(Method::POST, "/api/nope", json, "{}"),
            404,
            "route",
        ),
        (
            with_type(Method::POST, "/api/generate", json, &big),
            413,
            "limit",
        ),
        (
            with_type(Method::POST, "/api/chat", Some("text/plain"), "{}"),
            415,
            "Content-Type",
        ),
        (
            with_type(Method::POST, "/api/chat", None, "{}"),
            415,
            "Content-Type",
        ),
    ];
    for (req, status, word) in ollama {
        let what = format!("{} {}", req.method(), req.uri());
        let r = send(&app, req).await;
        assert_eq!(r.status.as_u16(), status, "{what}: {}", r.text());
        let v = r.json();
        let m = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: not Ollama's shape: {v}"));
        assert!(m.contains(word), "{what}: {m}");
    }
    let anthropic: Vec<(Request<Body>, u16, &str)> = vec![
        (
            with_type(Method::POST, "/v1/messages", json, "{not json"),
            400,
            "invalid_request_error",
        ),
        (
            with_type(Method::GET, "/v1/messages", None, ""),
            405,
            "invalid_request_error",
        ),
        (
            with_type(Method::POST, "/v1/messages", Some("text/plain"), "{}"),
            415,
            "invalid_request_error",
        ),
    ];
    for (req, status, ty) in anthropic {
        let what = format!("{} {}", req.method(), req.uri());
        let r = send(&app, req).await;
        assert_eq!(r.status.as_u16(), status, "{what}: {}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{what}: {v}");
        assert_eq!(v["error"]["type"], ty, "{what}: {v}");
    }
    let openai: Vec<(Request<Body>, u16, &str)> = vec![
        (
            with_type(Method::GET, "/v1/models/%FF", None, ""),
            400,
            "model",
        ),
        (
            with_type(
                Method::POST,
                "/v1/chat/completions",
                Some("text/plain"),
                "{}",
            ),
            415,
            "Content-Type",
        ),
        (
            with_type(
                Method::POST,
                "/v1/completions",
                Some("application/x-www-form-urlencoded"),
                "a=b",
            ),
            415,
            "Content-Type",
        ),
    ];
    for (req, status, param) in openai {
        let what = format!("{} {}", req.method(), req.uri());
        let r = send(&app, req).await;
        assert_eq!(r.status.as_u16(), status, "{what}: {}", r.text());
        let v = r.json();
        assert_eq!(v["error"]["param"], param, "{what}: {v}");
    }
    // A 401 on `/api/*` is Ollama's shape too.
    let app = flowrt_server::app(state_with(flowrt_server::ServerConfig {
        api_key: Some("s3cret".into()),
        ..config()
    }));
    let r = get(&app, "/api/tags").await;
    assert_eq!(r.status.as_u16(), 401);
    assert!(
        r.json()["error"]
            .as_str()
            .is_some_and(|m| m.contains("API key")),
        "{}",
        r.text()
    );
}

/// Issue 18: while the server shuts down (SIGTERM), new requests get 503 in their route's
/// shape instead of starting work the exit would cut off.
#[tokio::test]
async fn requests_while_draining_get_503() {
    let state = state_with(config());
    let app = flowrt_server::app(state.clone());
    assert_eq!(get(&app, "/v1/models").await.status.as_u16(), 200);
    state
        .draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let r = send(
        &app,
        request(Method::POST, "/v1/chat/completions", chat(json!({}))),
    )
    .await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("shutting down"));
    let r = get(&app, "/api/tags").await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("shutting down"));
}
