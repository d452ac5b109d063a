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
