//! The rest of the API clients expect (issue 16): `/tokenize` and `/detokenize`, CORS,
//! `logit_bias` and `n`, on the real SmolLM2 with few tokens.

mod common;

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use common::*;
use flowrt_engine::{EngineOptions, LoadedModel, Session};
use flowrt_server::{
    app, check_cors_origin, host_allowed, AppState, ModelSpec, ServerConfig, LOOPBACK_HOSTS,
};
use serde_json::{json, Value};

/// The engine's own view of SmolLM2, to check the server against.
fn engine_model() -> &'static LoadedModel {
    static M: OnceLock<LoadedModel> = OnceLock::new();
    M.get_or_init(|| LoadedModel::load(&smollm2()).unwrap())
}

fn assert_bad_param(r: &Reply, param: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let p = r.json()["error"]["param"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        p == param || p.starts_with(&format!("{param}[")),
        "param `{p}`, want `{param}`: {}",
        r.text()
    );
}

// ---- /tokenize, /detokenize ------------------------------------------------------------

#[tokio::test]
async fn tokenize_and_detokenize_equal_the_engines_tokenizer() {
    let app = router();
    let tok = &engine_model().tokenizer;
    let text = "Hello, world! <|im_start|>user\nnaïve 日本語 code: fn x() {}";

    // `model` may be left out when one model is served.
    let r = post(&app, "/tokenize", &json!({ "content": text })).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let ids: Vec<u32> = serde_json::from_value(r.json()["tokens"].clone()).unwrap();
    assert_eq!(ids, tok.encode(text, false, true).unwrap());
    assert!(
        ids.contains(&tok.token_to_id("<|im_start|>").unwrap()),
        "a special token written in the text is one id by default"
    );

    let r = post(
        &app,
        "/tokenize",
        &json!({ "model": "smollm2", "content": text, "add_special": true, "parse_special": false }),
    )
    .await;
    let plain: Vec<u32> = serde_json::from_value(r.json()["tokens"].clone()).unwrap();
    assert_eq!(plain, tok.encode(text, true, false).unwrap());
    assert_ne!(plain, ids);

    let r = post(
        &app,
        "/tokenize",
        &json!({ "model": MODEL, "content": text, "with_pieces": true }),
    )
    .await;
    let pieces = r.json()["tokens"].as_array().unwrap().clone();
    assert_eq!(pieces.len(), ids.len());
    let mut bytes = Vec::new();
    for (p, &id) in pieces.iter().zip(&ids) {
        assert_eq!(p["id"], id);
        let piece: Vec<u8> = match &p["piece"] {
            Value::String(s) => s.as_bytes().to_vec(),
            v => serde_json::from_value(v.clone()).unwrap(),
        };
        assert_eq!(piece, tok.token_to_piece(id).unwrap());
        bytes.extend(piece);
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);

    let r = post(&app, "/detokenize", &json!({ "tokens": ids })).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["content"], text);
    let r = post(
        &app,
        "/detokenize",
        &json!({ "model": MODEL, "tokens": [] }),
    )
    .await;
    assert_eq!(r.json()["content"], "");
}

#[tokio::test]
async fn tokenize_errors_name_the_field_and_never_substitute_a_model() {
    let app = router();
    let vocab = engine_model().tokenizer.vocab_size();
    let r = post(
        &app,
        "/tokenize",
        &json!({ "model": "llama3:8b", "content": "hi" }),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = post(
        &app,
        "/detokenize",
        &json!({ "model": "llama3:8b", "tokens": [1] }),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());

    let r = post(&app, "/detokenize", &json!({ "tokens": [1, vocab] })).await;
    assert_bad_param(&r, "tokens");
    assert!(r.text().contains(&vocab.to_string()), "{}", r.text());
    for bad in [json!([1, -3]), json!(["a"]), json!("12"), json!([1.5])] {
        let r = post(&app, "/detokenize", &json!({ "tokens": bad })).await;
        assert_bad_param(&r, "tokens");
    }
    let r = post(&app, "/tokenize", &json!({ "content": 5 })).await;
    assert_bad_param(&r, "content");
    let r = post(&app, "/tokenize", &json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.text().contains("content"), "{}", r.text());
    let r = post(
        &app,
        "/tokenize",
        &json!({ "content": "x", "add_special": "yes" }),
    )
    .await;
    assert_bad_param(&r, "add_special");
    let r = post(
        &app,
        "/tokenize",
        &json!({ "content": "x", "with_pieces": 1 }),
    )
    .await;
    assert_bad_param(&r, "with_pieces");

    // Two models served: the name is needed.
    let path = smollm2();
    let size = std::fs::metadata(&path).unwrap().len();
    let specs = vec![
        ModelSpec::new(MODEL, path.clone(), "ab".repeat(32), size, "test").unwrap(),
        ModelSpec::new("other", path, "cd".repeat(32), size, "test").unwrap(),
    ];
    let two = app_of(AppState::new(specs, config()));
    let r = post(&two, "/tokenize", &json!({ "content": "hi" })).await;
    assert_bad_param(&r, "model");
    let r = post(&two, "/detokenize", &json!({ "tokens": [1] })).await;
    assert_bad_param(&r, "model");
}

fn app_of(state: AppState) -> Router {
    app(state)
}

// ---- CORS --------------------------------------------------------------------------------

fn preflight(uri: &str, origin: &str) -> Request<Body> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri(uri)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .body(Body::empty())
        .unwrap()
}

fn with_origin(uri: &str, origin: &str, key: Option<&str>) -> Request<Body> {
    let mut b = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header("origin", origin);
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(Body::empty()).unwrap()
}

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn cors_is_off_by_default() {
    let app = router();
    let r = send(
        &app,
        preflight("/v1/chat/completions", "http://localhost:3000"),
    )
    .await;
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_ne!(r.status, StatusCode::OK, "no preflight answer without CORS");
    let r = send(
        &app,
        with_origin("/v1/models", "http://localhost:3000", None),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
}

#[tokio::test]
async fn cors_answers_preflights_of_allowed_origins_without_the_key() {
    let origin = "http://localhost:3000";
    let app = app_of(state_with(ServerConfig {
        api_key: Some("sekrit".into()),
        cors_origins: vec![origin.into(), "https://chat.example".into()],
        ..config()
    }));
    let r = send(&app, preflight("/v1/chat/completions", origin)).await;
    assert!(r.status.is_success(), "{} {}", r.status, r.text());
    assert_eq!(header(&r, "access-control-allow-origin"), Some(origin));
    let methods = header(&r, "access-control-allow-methods").unwrap();
    assert!(
        methods.contains("POST") && methods.contains("GET"),
        "{methods}"
    );
    let headers = header(&r, "access-control-allow-headers")
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        [
            "authorization",
            "content-type",
            "x-api-key",
            "anthropic-version"
        ]
        .iter()
        .all(|h| headers.contains(h)),
        "{headers}"
    );

    // Another origin gets no allowance.
    let r = send(
        &app,
        preflight("/v1/chat/completions", "http://evil.example"),
    )
    .await;
    assert_eq!(header(&r, "access-control-allow-origin"), None);

    // A real request from an allowed origin carries the header; it still needs the key.
    let r = send(&app, with_origin("/v1/models", origin, Some("sekrit"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(header(&r, "access-control-allow-origin"), Some(origin));
    let r = send(&app, with_origin("/v1/models", origin, None)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(
        &app,
        with_origin("/v1/models", "http://evil.example", Some("sekrit")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(header(&r, "access-control-allow-origin"), None);

    // `*` has to be asked for.
    let any = app_of(state_with(ServerConfig {
        cors_origins: vec!["*".into()],
        ..config()
    }));
    let r = send(&any, preflight("/tokenize", "http://anything.example")).await;
    assert_eq!(header(&r, "access-control-allow-origin"), Some("*"));
}

#[test]
fn cors_origins_are_checked() {
    for ok in [
        "*",
        "http://localhost:3000",
        "https://chat.example",
        "app://x",
    ] {
        assert_eq!(check_cors_origin(ok), Ok(()), "{ok}");
    }
    for bad in [
        "localhost:3000",
        "http://a.example/",
        "http://a.example/path",
        "https://*.example",
        "",
        "http://",
    ] {
        assert!(check_cors_origin(bad).is_err(), "{bad}");
    }
}

// ---- logit_bias --------------------------------------------------------------------------

/// The prompt's tokens and the engine's two best next tokens, best first.
fn top2(prompt: &str) -> (Vec<u32>, u32, u32) {
    let m = engine_model();
    let ids = m.tokenizer.encode(prompt, true, true).unwrap();
    let opts = EngineOptions {
        threads: 2,
        n_ctx: Some(N_CTX),
        ..EngineOptions::default()
    };
    let mut s = Session::new(m, &opts).unwrap();
    let logits = s.feed(&ids).unwrap();
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    (ids, order[0], order[1])
}

fn piece(id: u32) -> String {
    engine_model().tokenizer.decode(&[id], false).unwrap()
}

async fn first_token(app: &Router, prompt: &[u32], bias: Value) -> String {
    let r = post(
        app,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 1, "logit_bias": bias}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn logit_bias_bans_the_greedy_token_and_forces_another() {
    let app = router();
    let (prompt, best, second) = top2("The capital of France is");
    assert_eq!(first_token(&app, &prompt, json!({})).await, piece(best));
    assert_eq!(
        first_token(&app, &prompt, json!({ best.to_string(): -100 })).await,
        piece(second),
        "banning the greedy token leaves the next best"
    );
    let banana = engine_model()
        .tokenizer
        .encode(" banana", false, true)
        .unwrap()[0];
    assert_ne!(banana, best);
    assert_eq!(
        first_token(&app, &prompt, json!({ banana.to_string(): 100 })).await,
        piece(banana),
        "+100 forces a token"
    );

    // Chat too.
    let r = post(
        &app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
                "temperature": 0, "max_tokens": 1, "logit_bias": { banana.to_string(): 100 }}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], piece(banana));
}

#[tokio::test]
async fn logit_bias_under_a_constraint_keeps_the_grammar() {
    let app = router();
    let banana = engine_model()
        .tokenizer
        .encode(" banana", false, true)
        .unwrap()[0];
    let brace = engine_model().tokenizer.encode("{", false, true).unwrap()[0];
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                        "required": ["a"], "additionalProperties": false});
    let r = post(
        &app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Give a JSON object with a number a."}],
                "temperature": 1, "seed": 9, "max_tokens": 24, "n": 2,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                "logit_bias": { banana.to_string(): 100, brace.to_string(): -100 }}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    // Each of the n choices has its own copy of the constraint.
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "stop", "{v}");
        let text = c["message"]["content"].as_str().unwrap();
        let obj: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(obj["a"].is_i64(), "{text}");
        assert!(!text.contains("banana"), "{text}");
    }
}

#[tokio::test]
async fn bad_logit_bias_is_a_400_naming_it() {
    let app = router();
    let vocab = engine_model().model.config.vocab_size;
    for bias in [
        json!({"abc": 1}),
        json!({"-1": 1}),
        json!({ vocab.to_string(): 1 }),
        json!({"5": 100.5}),
        json!({"5": -101}),
        json!({"5": "1"}),
        json!([1, 2]),
        json!("5:1"),
    ] {
        for route in ["/v1/completions", "/v1/chat/completions"] {
            let body = if route == "/v1/completions" {
                json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1, "logit_bias": bias})
            } else {
                json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "logit_bias": bias})
            };
            let r = post(&app, route, &body).await;
            assert_bad_param(&r, "logit_bias");
        }
    }
}

// ---- n -----------------------------------------------------------------------------------

fn chat_n(n: u64, extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}],
                       "temperature": 0, "max_tokens": 6, "n": n});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test]
async fn n_greedy_choices_all_equal_the_single_answer_and_usage_sums() {
    let app = router();
    let one = post(&app, "/v1/chat/completions", &chat_n(1, json!({})))
        .await
        .json();
    let want = one["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!want.is_empty());
    let r = post(&app, "/v1/chat/completions", &chat_n(3, json!({}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], want, "choice {i}");
        assert_eq!(c["finish_reason"], one["choices"][0]["finish_reason"]);
    }
    let u1 = &one["usage"];
    assert_eq!(v["usage"]["prompt_tokens"], u1["prompt_tokens"]);
    let c1 = u1["completion_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3 * c1);
    assert_eq!(
        v["usage"]["total_tokens"],
        u1["prompt_tokens"].as_u64().unwrap() + 3 * c1
    );

    // Streaming: chunks carry their choice's index; each index's text is the answer.
    let r = post(
        &app,
        "/v1/chat/completions",
        &chat_n(
            2,
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    let mut text = [String::new(), String::new()];
    let mut roles = [0, 0];
    let mut finishes = [0, 0];
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        let Some(c) = v["choices"].as_array().unwrap().first() else {
            usage = Some(v["usage"].clone());
            continue;
        };
        let i = c["index"].as_u64().unwrap() as usize;
        if c["delta"]["role"] == "assistant" {
            roles[i] += 1;
        }
        if !c["finish_reason"].is_null() {
            finishes[i] += 1;
        }
        text[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(roles, [1, 1]);
    assert_eq!(finishes, [1, 1]);
    assert_eq!(text, [want.to_string(), want.to_string()]);
    assert_eq!(usage.unwrap()["completion_tokens"], 2 * c1);
}

#[tokio::test]
async fn n_choices_sample_with_seed_plus_their_index() {
    let app = router();
    let body = |n: u64, seed: u64, stream: bool| {
        json!({"model": MODEL, "prompt": "Once upon a time", "temperature": 1.0,
               "max_tokens": 8, "n": n, "seed": seed, "stream": stream})
    };
    let single = |v: Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let a = single(
        post(&app, "/v1/completions", &body(1, 40, false))
            .await
            .json(),
    );
    let b = single(
        post(&app, "/v1/completions", &body(1, 41, false))
            .await
            .json(),
    );
    assert_ne!(a, b, "two seeds drew the same text; pick other seeds");
    let v = post(&app, "/v1/completions", &body(2, 40, false))
        .await
        .json();
    let texts: Vec<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, [a.as_str(), b.as_str()]);

    let r = post(&app, "/v1/completions", &body(2, 40, true)).await;
    let mut text = [String::new(), String::new()];
    for e in r.sse().iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        text[c["index"].as_u64().unwrap() as usize].push_str(c["text"].as_str().unwrap());
    }
    assert_eq!(text, [a, b]);
}

#[tokio::test]
async fn bad_n_is_a_400_naming_it() {
    let app = router();
    // The test server queues 4 requests per model: n = 5 cannot be queued at once.
    for n in [
        json!(0),
        json!(17),
        json!(5),
        json!("2"),
        json!(-1),
        json!(1.5),
    ] {
        let r = post(&app, "/v1/chat/completions", &chat_n(1, json!({ "n": n }))).await;
        assert_bad_param(&r, "n");
        let r = post(
            &app,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1, "n": n}),
        )
        .await;
        assert_bad_param(&r, "n");
    }
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let r = post(
        &app,
        "/v1/chat/completions",
        &chat_n(2, json!({ "tools": tools })),
    )
    .await;
    assert_bad_param(&r, "n");
}

/// The n sequences of one request run at the same time (they share the scheduler's batch),
/// not one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_run_side_by_side() {
    let state = state_with(config());
    let app = app(state.clone());
    let body = json!({"model": MODEL, "prompt": "Count: 1, 2, 3,", "temperature": 0,
                      "max_tokens": 64, "ignore_eos": true, "n": 2});
    let req = tokio::spawn(async move { post(&app, "/v1/completions", &body).await });
    let active = || {
        state
            .models
            .gauges()
            .iter()
            .find(|g| g.model == MODEL)
            .map_or(0, |g| g.active)
    };
    wait_until("both choices active at once", || active() == 2).await;
    let r = req.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 128);
    assert_eq!(v["choices"][0]["text"], v["choices"][1]["text"]);
}

// ---- Host check (DNS rebinding) ----------------------------------------------------------

fn with_host(method: Method, uri: &str, host: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("host", host)
        .header("content-type", "application/json")
        .body(Body::empty())
        .unwrap()
}

#[test]
fn host_names_are_matched_without_port_case_or_trailing_dot() {
    let allowed: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    for ok in [
        "localhost",
        "localhost:8001",
        "LOCALHOST.:8001",
        "127.0.0.1:9",
        "[::1]:8001",
        "[::1]",
    ] {
        assert!(host_allowed(ok, &allowed), "{ok}");
    }
    for bad in [
        "evil.example",
        "evil.example:8001",
        "localhost.evil.example",
        "127.0.0.1.nip.io:8001",
        "localhost:80x",
        "[::1:8001",
        "",
        ":8001",
    ] {
        assert!(!host_allowed(bad, &allowed), "{bad}");
    }
}

#[tokio::test]
async fn a_foreign_host_is_refused_in_the_routes_shape_and_loopback_names_pass() {
    let app = app_of(state_with(ServerConfig {
        allowed_hosts: Some(LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect()),
        ..config()
    }));
    // A rebound name: refused on every route, in that route's error shape.
    let r = send(
        &app,
        with_host(Method::GET, "/v1/models", "evil.example:8001"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "Host", "{}", r.text());
    let r = send(&app, with_host(Method::GET, "/api/tags", "evil.example")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        r.json()["error"].is_string(),
        "Ollama's shape: {}",
        r.text()
    );
    let r = send(
        &app,
        with_host(Method::POST, "/v1/chat/completions", "evil.example"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    // The loopback names pass, with any port.
    for host in ["localhost:8001", "127.0.0.1:45678", "[::1]:8001"] {
        let r = send(&app, with_host(Method::GET, "/v1/models", host)).await;
        assert_eq!(r.status, StatusCode::OK, "{host}: {}", r.text());
    }
    // Without the check (no allowed_hosts), any Host is served.
    let open = router();
    let r = send(&open, with_host(Method::GET, "/v1/models", "evil.example")).await;
    assert_eq!(r.status, StatusCode::OK);
}
