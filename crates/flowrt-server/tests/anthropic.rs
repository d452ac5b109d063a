//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on the real SmolLM2,
//! through the router without a socket: the same greedy answer as `/v1/chat/completions`,
//! Anthropic's SSE events, stop reasons, errors in Anthropic's shape, `x-api-key`.

mod common;

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::*;
use flowrt_engine::EngineOptions;
use flowrt_server::{app, AppState, ModelSpec, ServerConfig};
use serde_json::{json, Value};
use tower::ServiceExt;

const SYSTEM: &str = "You are a terse assistant.";

/// The same conversation in OpenAI's and Anthropic's shapes (Anthropic's with text blocks).
fn openai_body(max_tokens: u64) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "Apple."},
            {"role": "user", "content": "Describe the sky."},
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

fn anthropic_body(max_tokens: u64, extra: Value) -> Value {
    let mut b = json!({
        "model": MODEL,
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": [
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": [{"type": "text", "text": "Apple."}]},
            {"role": "user", "content": [{"type": "text", "text": "Describe the sky."}]},
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
        "metadata": {"user_id": "someone"},
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// The `(event, data)` pairs of an SSE body.
fn events(r: &Reply) -> Vec<(String, Value)> {
    r.text()
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap_or_else(|| panic!("{e}"));
            let name = name
                .strip_prefix("event: ")
                .unwrap_or_else(|| panic!("{e}"));
            let data = data.strip_prefix("data: ").unwrap_or_else(|| panic!("{e}"));
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn text_of(v: &Value) -> String {
    let c = v["content"].as_array().unwrap();
    assert_eq!(c.len(), 1, "{v}");
    assert_eq!(c[0]["type"], "text", "{v}");
    c[0]["text"].as_str().unwrap().to_string()
}

/// A streamed answer: the event names in order, the text reassembled, the message_delta.
fn read_stream(r: &Reply) -> (Vec<String>, String, Value) {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let evs = events(r);
    let mut text = String::new();
    let mut delta = Value::Null;
    for (name, data) in &evs {
        assert_eq!(&data["type"], name.as_str(), "each event's data names it");
        match name.as_str() {
            "content_block_delta" => {
                assert_eq!(data["index"], 0);
                assert_eq!(data["delta"]["type"], "text_delta");
                text.push_str(data["delta"]["text"].as_str().unwrap());
            }
            "message_delta" => delta = data.clone(),
            _ => {}
        }
    }
    let names = evs.into_iter().map(|(n, _)| n).collect();
    (names, text, delta)
}

fn assert_stream_order(names: &[String]) {
    let n = names.len();
    assert!(n >= 6, "{names:?}");
    assert_eq!(
        names[..3],
        ["message_start", "content_block_start", "ping"],
        "{names:?}"
    );
    assert_eq!(
        names[n - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{names:?}"
    );
    assert!(
        names[3..n - 3].iter().all(|e| e == "content_block_delta"),
        "{names:?}"
    );
}

fn assert_anthropic_error(r: &Reply, status: u16, ty: &str, needle: &str) {
    assert_eq!(r.status.as_u16(), status, "{needle}: {}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "{}", r.text());
    assert_eq!(v["error"]["type"], ty, "{}", r.text());
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(needle), "`{needle}` not in: {msg}");
}

#[tokio::test]
async fn greedy_message_equals_chat_completions_and_streams_the_same() {
    let app = router();
    let oa = post(&app, "/v1/chat/completions", &openai_body(12)).await;
    assert_eq!(oa.status, StatusCode::OK, "{}", oa.text());
    let oa = oa.json();
    let expected = oa["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!expected.is_empty());

    let r = post(&app, "/v1/messages", &anthropic_body(12, json!({}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], MODEL);
    assert_eq!(text_of(&v), expected);
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(v["usage"]["input_tokens"], oa["usage"]["prompt_tokens"]);
    assert_eq!(v["usage"]["output_tokens"], 12);

    let r = post(
        &app,
        "/v1/messages",
        &anthropic_body(12, json!({"stream": true})),
    )
    .await;
    let (names, text, delta) = read_stream(&r);
    assert_stream_order(&names);
    assert_eq!(text, expected);
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 12);
    let start = &events(&r)[0].1["message"];
    assert_eq!(start["usage"]["input_tokens"], v["usage"]["input_tokens"]);
    assert_eq!(start["model"], MODEL);
    assert_eq!(start["content"], json!([]));

    let mut count = anthropic_body(12, json!({}));
    for k in ["max_tokens", "temperature", "metadata"] {
        count.as_object_mut().unwrap().remove(k);
    }
    let r = post(&app, "/v1/messages/count_tokens", &count).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"input_tokens": v["usage"]["input_tokens"]})
    );
}

#[tokio::test]
async fn stop_sequences_max_tokens_and_end_turn_are_the_stop_reasons() {
    let app = router();
    let whole = text_of(
        &post(&app, "/v1/messages", &anthropic_body(12, json!({})))
            .await
            .json(),
    );
    // A stop string from the middle of the greedy answer: the answer ends before it.
    let chars: Vec<char> = whole.chars().collect();
    assert!(chars.len() >= 6, "{whole}");
    let stop: String = chars[3..5].iter().collect();
    let before = &whole[..whole.find(&stop).unwrap()];
    let r = post(
        &app,
        "/v1/messages",
        &anthropic_body(12, json!({"stop_sequences": ["@@@", stop]})),
    )
    .await;
    let v = r.json();
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], stop.as_str(), "{v}");
    assert_eq!(text_of(&v), before);
    let r = post(
        &app,
        "/v1/messages",
        &anthropic_body(12, json!({"stop_sequences": [stop], "stream": true})),
    )
    .await;
    let (names, text, delta) = read_stream(&r);
    assert_eq!(text, before);
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], stop.as_str());
    assert_eq!(names.last().unwrap(), "message_stop");

    let v = post(&app, "/v1/messages", &anthropic_body(3, json!({})))
        .await
        .json();
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert!(whole.starts_with(&text_of(&v)));

    // `max_tokens` beyond the context is cut to it; an answer that fills the context before
    // `max_tokens` ends with `model_context_window_exceeded`.
    let mut long = anthropic_body(1000, json!({}));
    long["messages"][2]["content"] = json!(format!("Repeat: {}", "la ".repeat(450)));
    let v = post(&app, "/v1/messages", &long).await.json();
    let used = v["usage"]["input_tokens"].as_u64().unwrap()
        + v["usage"]["output_tokens"].as_u64().unwrap();
    assert_eq!(v["stop_reason"], "model_context_window_exceeded", "{v}");
    assert_eq!(used, N_CTX as u64, "{v}");

    // An answer that ends by itself (OpenAI's finish_reason "stop") is `end_turn`.
    let mut oa = openai_body(16);
    oa["messages"][3]["content"] = json!("Name a color.");
    let oa = post(&app, "/v1/chat/completions", &oa).await.json();
    assert_eq!(oa["choices"][0]["finish_reason"], "stop", "{oa}");
    let mut body = anthropic_body(16, json!({}));
    body["messages"][2]["content"] = json!("Name a color.");
    let v = post(&app, "/v1/messages", &body).await.json();
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(
        text_of(&v),
        oa["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[tokio::test]
async fn bad_requests_are_400s_in_anthropics_shape_naming_the_field() {
    let app = router();
    let user = |content: Value| json!([{"role": "user", "content": content}]);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"max_tokens": null}), "max_tokens"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": -1}), "max_tokens"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": null}), "messages"),
        (
            json!({"messages": user(json!([{"type": "image", "source": {}}]))}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": user(json!([{"type": "text", "text": "hi"}, {"type": "tool_result", "tool_use_id": "x"}]))}),
            "tool_result",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}, {"role": "user", "content": "ok"}]}),
            "messages[1].content[0].type",
        ),
        (
            json!({"messages": user(json!([{"type": "text"}]))}),
            "messages[0].content[0].text",
        ),
        (json!({"messages": user(json!(7))}), "messages[0].content"),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "system", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]}),
            "messages[1].role",
        ),
        (
            json!({"system": [{"type": "document", "source": {}}]}),
            "system[0].type",
        ),
        (json!({"system": 3}), "system"),
        (
            json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
            "tools",
        ),
        (json!({"tool_choice": {"type": "auto"}}), "tool_choice"),
        (
            json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}),
            "thinking",
        ),
        (
            json!({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
            "output_config.format",
        ),
        (json!({"temperature": 1.5}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"top_k": -2}), "top_k"),
        (json!({"stop_sequences": "x"}), "stop_sequences"),
        (json!({"stop_sequences": [1]}), "stop_sequences"),
        (json!({"model": ""}), "model"),
        (json!({"stream": "yes"}), "stream"),
    ];
    for (extra, needle) in cases {
        let mut body = anthropic_body(4, extra.clone());
        if body["max_tokens"].is_null() {
            body.as_object_mut().unwrap().remove("max_tokens");
        }
        let r = post(&app, "/v1/messages", &body).await;
        assert_anthropic_error(&r, 400, "invalid_request_error", needle);
    }
    let r = send(
        &app,
        request(Method::POST, "/v1/messages", Body::from("not json")),
    )
    .await;
    assert_anthropic_error(&r, 400, "invalid_request_error", "JSON");
    let mut body = anthropic_body(4, json!({"tools": [{"name": "f"}]}));
    body.as_object_mut().unwrap().remove("max_tokens");
    let r = post(&app, "/v1/messages/count_tokens", &body).await;
    assert_anthropic_error(&r, 400, "invalid_request_error", "tools");

    // An unknown model is a 404, never another model.
    for (uri, extra) in [
        ("/v1/messages", json!({"model": "claude-sonnet-4-5"})),
        (
            "/v1/messages/count_tokens",
            json!({"model": "claude-sonnet-4-5", "max_tokens": null}),
        ),
    ] {
        let r = post(&app, uri, &anthropic_body(4, extra)).await;
        assert_anthropic_error(&r, 404, "not_found_error", "claude-sonnet-4-5");
    }
    // Nothing above loaded the model.
    assert_eq!(
        get(&app, "/health").await.json()["models"][MODEL],
        "unloaded"
    );
    // `thinking` switched off is what this route does anyway.
    let r = post(
        &app,
        "/v1/messages",
        &anthropic_body(2, json!({"thinking": {"type": "disabled"}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

#[tokio::test]
async fn x_api_key_or_bearer_authenticates_and_a_client_going_away_cancels() {
    let state = state_with(ServerConfig {
        api_key: Some("s3cret".into()),
        ..config()
    });
    let app = app(state.clone());
    let req = |headers: &[(&str, &str)], body: &Value| {
        let mut b = Request::builder()
            .method(Method::POST)
            .uri("/v1/messages")
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::from(body.to_string())).unwrap()
    };
    let body = anthropic_body(1, json!({}));
    for h in [
        vec![],
        vec![("x-api-key", "wrong")],
        vec![("x-api-key", "")],
        vec![("authorization", "Bearer wrong")],
    ] {
        let r = send(&app, req(&h, &body)).await;
        assert_anthropic_error(&r, 401, "authentication_error", "x-api-key");
    }
    for h in [
        vec![("x-api-key", "s3cret")],
        vec![("authorization", "Bearer s3cret")],
        vec![("x-api-key", "wrong"), ("authorization", "Bearer s3cret")],
    ] {
        let r = send(&app, req(&h, &body)).await;
        assert_eq!(r.status, StatusCode::OK, "{h:?}: {}", r.text());
    }
    // x-api-key works on the other routes too.
    let r = send(
        &app,
        Request::builder()
            .uri("/v1/models")
            .header("x-api-key", "s3cret")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);

    // Dropping a streamed response cancels its sequence.
    let runner = state.models.running().pop().unwrap();
    let scheduler = runner.scheduler.as_ref().unwrap();
    let active = || scheduler.counts().active.load(Ordering::SeqCst);
    let long = anthropic_body(
        400,
        json!({"stream": true, "stop_sequences": ["@@@@"], "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}),
    );
    let resp = app
        .clone()
        .oneshot(req(&[("x-api-key", "s3cret")], &long))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    wait_until("the stream to run", || active() == 1).await;
    drop(resp);
    wait_until("the dropped stream to be cancelled", || active() == 0).await;
    let t = send(
        &app,
        Request::builder()
            .uri("/metrics")
            .header("x-api-key", "s3cret")
            .body(Body::empty())
            .unwrap(),
    )
    .await
    .text();
    assert!(t.contains("finish=\"cancelled\"} 1"), "{t}");
}

/// The tiny random-weight Qwen3 with the real Qwen3 template (a model that thinks by
/// default): `/v1/messages` switches thinking off, so its prompt and greedy answer are those
/// of `/v1/chat/completions` with `enable_thinking: false`, and the stream (whose blocks open
/// as their first piece arrives for such a model) gives the same blocks as the plain answer.
#[tokio::test]
async fn a_thinking_model_answers_with_thinking_switched_off() {
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = repo.join("tests/fixtures/families/qwen3");
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "config.json",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::copy(
        repo.join("tests/fixtures/text/templates/Qwen-Qwen3-0.6B.jinja"),
        dir.path().join("chat_template.jinja"),
    )
    .unwrap();
    let spec = ModelSpec::new(
        "qwen3-tiny",
        dir.path().to_path_buf(),
        "cd".repeat(32),
        1,
        "t",
    )
    .unwrap();
    let app = app(AppState::new(
        vec![spec],
        ServerConfig {
            engine: EngineOptions {
                threads: 2,
                ..EngineOptions::default()
            },
            parallel: 1,
            ..ServerConfig::default()
        },
    ));
    let messages = json!([{"role": "user", "content": "Hello"}]);
    let oa = post(
        &app,
        "/v1/chat/completions",
        &json!({"model": "qwen3-tiny", "messages": messages, "temperature": 0, "max_tokens": 6,
                "chat_template_kwargs": {"enable_thinking": false}}),
    )
    .await;
    assert_eq!(oa.status, StatusCode::OK, "{}", oa.text());
    let oa = oa.json();
    let body =
        json!({"model": "qwen3-tiny", "messages": messages, "temperature": 0, "max_tokens": 6});
    let v = post(&app, "/v1/messages", &body).await.json();
    assert_eq!(
        v["usage"]["input_tokens"], oa["usage"]["prompt_tokens"],
        "{v}"
    );
    let content = v["content"].as_array().unwrap();
    let text = &content.last().unwrap();
    assert_eq!(text["type"], "text", "{v}");
    assert_eq!(
        text["text"], oa["choices"][0]["message"]["content"],
        "{v}\n{oa}"
    );

    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let r = post(&app, "/v1/messages", &stream).await;
    let evs = events(&r);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    // Blocks rebuilt from the events equal the plain answer's content.
    let mut blocks: Vec<Value> = Vec::new();
    for (name, d) in &evs {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(d["index"], blocks.len());
                blocks.push(d["content_block"].clone());
            }
            "content_block_delta" => {
                let b = &mut blocks[d["index"].as_u64().unwrap() as usize];
                let (field, piece) = match d["delta"]["type"].as_str().unwrap() {
                    "text_delta" => ("text", &d["delta"]["text"]),
                    "thinking_delta" => ("thinking", &d["delta"]["thinking"]),
                    other => panic!("{other}"),
                };
                let joined = format!("{}{}", b[field].as_str().unwrap(), piece.as_str().unwrap());
                b[field] = json!(joined);
            }
            _ => {}
        }
    }
    assert_eq!(Value::from(blocks), v["content"], "{}", r.text());
}
