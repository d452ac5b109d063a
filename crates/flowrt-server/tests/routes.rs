//! Route-level tests of every endpoint on the real SmolLM2, through the router without a
//! socket.

mod common;

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::*;
use flowrt_server::{app, ServerConfig};
use serde_json::{json, Value};
use tower::ServiceExt;

fn chat_body(prompt: &str, extra: Value) -> Value {
    let mut b = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 12,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn assert_openai_error(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status.as_u16(), status, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], code, "{}", r.text());
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(e.get("type").is_some() && e.get("param").is_some());
}

#[tokio::test]
async fn health_models_and_model_by_id() {
    let app = router();
    let r = get(&app, "/health").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["status"], "ok");
    assert_eq!(r.json()["models"][MODEL], "unloaded");

    let r = get(&app, "/v1/models").await;
    assert_eq!(r.status, StatusCode::OK);
    let m = &r.json()["data"][0];
    assert_eq!(m["id"], MODEL);
    assert_eq!(m["object"], "model");
    assert_eq!(m["context_length"], N_CTX);
    assert_eq!(m["max_context_length"], 8192);
    assert_eq!(m["sha256"], "ab".repeat(32));
    assert_eq!(m["quantization"], "Q4_1");

    for name in [MODEL, "smollm2"] {
        let r = get(&app, &format!("/v1/models/{name}")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.json()["id"],
            MODEL,
            "an alias answers with the canonical id"
        );
    }
    let r = get(&app, "/v1/models/llama3:8b").await;
    assert_openai_error(&r, 404, "model_not_found");
    assert_eq!(r.json()["error"]["param"], "model");
}

#[tokio::test]
async fn chat_completion_has_exact_usage_and_names_the_model() {
    let app = router();
    let r = post(
        &app,
        "/v1/chat/completions",
        &chat_body("What is 2+2?", json!({"model": "smollm2", "max_tokens": 5})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(
        v["model"], MODEL,
        "the response names the model that ran, not the alias"
    );
    assert!(v["system_fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("fp_abab"));
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 5);
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + 5
    );
    // SmolLM2's template wraps the default system prompt and the question.
    assert!(u["prompt_tokens"].as_u64().unwrap() > 10);

    // /health now reports the model as loaded, /api/ps lists it.
    assert_eq!(get(&app, "/health").await.json()["models"][MODEL], "ready");
    let ps = get(&app, "/api/ps").await.json();
    assert_eq!(ps["models"][0]["name"], MODEL);
    assert_eq!(ps["models"][0]["context_length"], N_CTX);
}

#[tokio::test]
async fn streaming_chat_equals_the_plain_answer_and_reports_usage() {
    // `cached_tokens` is reported only when asked for (see `prompt_security.rs`).
    let app = app(state_with(ServerConfig {
        report_cached_tokens: true,
        ..config()
    }));
    let plain = post(
        &app,
        "/v1/chat/completions",
        &chat_body("Name a color.", json!({})),
    )
    .await
    .json();
    let r = post(
        &app,
        "/v1/chat/completions",
        &chat_body(
            "Name a color.",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["model"], MODEL);
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(ch) = c["choices"].get(0) {
            text.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            if !ch["finish_reason"].is_null() {
                finish = Some(ch["finish_reason"].clone());
            }
        }
    }
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage_chunk["usage"][k], plain["usage"][k], "{k}");
    }
    // The second request reused the first one's prompt cache.
    let cached = usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached + 1,
        plain["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(finish.unwrap(), plain["choices"][0]["finish_reason"]);
}

#[tokio::test]
async fn completions_plain_streaming_logprobs_and_stop() {
    let app = router();
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 3});
    let r = post(&app, "/v1/completions", &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let c = &v["choices"][0];
    let text = c["text"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{text}");
    let lp = &c["logprobs"];
    let toks = lp["tokens"].as_array().unwrap();
    assert_eq!(
        toks.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        toks.iter().map(|t| t.as_str().unwrap()).collect::<String>(),
        text
    );
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3);
        // Greedy: the chosen token is the most likely one.
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((best - chosen).abs() < 1e-5 && chosen <= 0.0);
    }

    // Streaming gives the same text.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody.as_object_mut().unwrap().remove("logprobs");
    let events = post(&app, "/v1/completions", &sbody).await.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);

    // A stop string ends the answer before it, with finish_reason "stop".
    let mut stop = body.clone();
    stop["stop"] = json!(["Paris"]);
    stop.as_object_mut().unwrap().remove("logprobs");
    let v = post(&app, "/v1/completions", &stop).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(!v["choices"][0]["text"].as_str().unwrap().contains("Paris"));
}

#[tokio::test]
async fn chat_logprobs_and_top_logprobs() {
    let app = router();
    let v = post(
        &app,
        "/v1/chat/completions",
        &chat_body(
            "Hi",
            json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 4}),
        ),
    )
    .await
    .json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(
            top[0]["token"], t["token"],
            "greedy picks the most likely token"
        );
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        assert!(t["bytes"].is_array());
    }
}

#[tokio::test]
async fn unknown_model_is_404_everywhere_never_a_fallback() {
    let app = router();
    let r = post(
        &app,
        "/v1/chat/completions",
        &chat_body("Hi", json!({"model": "gpt-4o"})),
    )
    .await;
    assert_openai_error(&r, 404, "model_not_found");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("gpt-4o"));
    let r = post(
        &app,
        "/v1/completions",
        &json!({"model": "smollm2:1.7b", "prompt": "x"}),
    )
    .await;
    assert_openai_error(&r, 404, "model_not_found");
    for (uri, body) in [
        (
            "/api/chat",
            json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        ("/api/generate", json!({"model": "llama3", "prompt": "hi"})),
        ("/api/show", json!({"model": "llama3"})),
    ] {
        let r = post(&app, uri, &body).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}");
        assert!(
            r.json()["error"].as_str().unwrap().contains("llama3"),
            "{uri}"
        );
    }
    // Nothing was loaded for any of them.
    assert_eq!(
        get(&app, "/health").await.json()["models"][MODEL],
        "unloaded"
    );
}

#[tokio::test]
async fn over_context_prompts_and_max_tokens_are_400_with_token_counts() {
    let app = router();
    let long = "word ".repeat(700);
    let r = post(&app, "/v1/chat/completions", &chat_body(&long, json!({}))).await;
    assert_openai_error(&r, 400, "context_length_exceeded");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&N_CTX.to_string()) && msg.contains("tokens"),
        "{msg}"
    );
    let r = post(
        &app,
        "/v1/chat/completions",
        &chat_body("Hi", json!({"max_tokens": 100000})),
    )
    .await;
    assert_openai_error(&r, 400, "context_length_exceeded");
    assert_eq!(r.json()["error"]["param"], "max_tokens");
    // Ollama clamps num_predict to the context instead.
    let r = post(&app, "/api/generate", &json!({"model": MODEL, "prompt": "Hi", "stream": false, "options": {"num_predict": 100000, "temperature": 0, "stop": ["."]}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

#[tokio::test]
async fn ollama_tags_show_version_ps() {
    let app = router();
    let v = get(&app, "/api/version").await.json();
    assert!(v["version"].is_string());
    let v = get(&app, "/api/tags").await.json();
    let m = &v["models"][0];
    assert_eq!(m["name"], MODEL);
    assert_eq!(m["digest"], "ab".repeat(32));
    assert_eq!(m["details"]["family"], "llama");
    assert_eq!(m["details"]["quantization_level"], "Q4_1");
    assert_eq!(m["details"]["parameter_size"], "135M");
    assert_eq!(get(&app, "/api/ps").await.json()["models"], json!([]));
    let v = post(&app, "/api/show", &json!({"model": "smollm2"}))
        .await
        .json();
    assert!(v["template"].as_str().unwrap().contains("im_start"));
    assert_eq!(v["model_info"]["general.architecture"], "llama");
    assert_eq!(v["model_info"]["llama.context_length"], 8192);
    assert!(v["model_info"]["general.parameter_count"].as_u64().unwrap() > 100_000_000);
    assert_eq!(v["capabilities"], json!(["completion", "chat"]));
    assert!(get(&app, "/").await.text().contains("running"));
}

#[tokio::test]
async fn ollama_chat_and_generate_plain_and_ndjson() {
    let app = router();
    let opts = json!({"temperature": 0, "num_predict": 6});
    let plain = post(&app, "/api/chat", &json!({"model": MODEL, "stream": false, "options": opts, "messages": [{"role": "user", "content": "Say hi"}]})).await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text());
    let p = plain.json();
    assert_eq!(p["model"], MODEL);
    assert_eq!(p["done"], true);
    assert_eq!(p["eval_count"], 6);
    assert_eq!(p["done_reason"], "length");
    assert!(p["prompt_eval_count"].as_u64().unwrap() > 5);
    // Streaming is the default.
    let r = post(&app, "/api/chat", &json!({"model": MODEL, "options": opts, "messages": [{"role": "user", "content": "Say hi"}]})).await;
    assert_eq!(r.headers["content-type"], "application/x-ndjson");
    let lines = r.ndjson();
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true);
    assert_eq!(last["eval_count"], 6);
    let text: String = lines
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, p["message"]["content"].as_str().unwrap());

    let g = post(
        &app,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "Say hi", "stream": false, "options": opts}),
    )
    .await
    .json();
    assert_eq!(
        g["response"], p["message"]["content"],
        "generate without raw uses the chat template"
    );
    assert_eq!(
        g["context"].as_array().unwrap().len() as u64,
        g["prompt_eval_count"].as_u64().unwrap() + 6
    );
    let lines = post(
        &app,
        "/api/generate",
        &json!({"model": MODEL, "prompt": "The sky is", "raw": true, "options": opts}),
    )
    .await
    .ndjson();
    assert_eq!(lines.last().unwrap()["done"], true);
    assert!(lines.len() >= 2);

    // No prompt: load only; keep_alive 0: unload.
    let v = post(&app, "/api/generate", &json!({"model": MODEL}))
        .await
        .json();
    assert_eq!(v["done_reason"], "load");
    let v = post(
        &app,
        "/api/generate",
        &json!({"model": MODEL, "keep_alive": 0}),
    )
    .await
    .json();
    assert_eq!(v["done_reason"], "unload");
    assert_eq!(get(&app, "/api/ps").await.json()["models"], json!([]));
}

#[tokio::test]
async fn metrics_count_requests_tokens_and_errors() {
    let app = router();
    post(
        &app,
        "/v1/chat/completions",
        &chat_body("Hi", json!({"max_tokens": 3})),
    )
    .await;
    post(
        &app,
        "/v1/chat/completions",
        &chat_body("Hi", json!({"n": 0})),
    )
    .await;
    let r = get(&app, "/metrics").await;
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let t = r.text();
    for needle in [
        "flowrt_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
        "flowrt_requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1",
        "flowrt_errors_total{kind=\"invalid_request\"} 1",
        "flowrt_completion_tokens_total{model=\"smollm2:135m\"} 3",
        "flowrt_time_to_first_token_seconds_count{model=\"smollm2:135m\"} 1",
        "flowrt_decode_tokens_per_second_count{model=\"smollm2:135m\"} 1",
        "flowrt_queue_depth{model=\"smollm2:135m\"} 0",
        "flowrt_model_loaded{model=\"smollm2:135m\"} 1",
    ] {
        assert!(t.contains(needle), "missing {needle} in\n{t}");
    }
}

#[tokio::test]
async fn api_key_guards_everything_but_health() {
    let app = app(state_with(ServerConfig {
        api_key: Some("s3cret".into()),
        ..config()
    }));
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
    for uri in ["/v1/models", "/api/tags", "/metrics", "/api/version"] {
        let r = get(&app, uri).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{uri}");
        // Each API's own error shape (Ollama's is `{"error": "message"}`).
        if uri.starts_with("/api/") {
            assert!(r.json()["error"].is_string(), "{uri}: {}", r.text());
        } else {
            assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        }
    }
    let req = |key: &str| {
        axum::http::Request::builder()
            .uri("/v1/models")
            .header("authorization", format!("Bearer {key}"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, req("s3cret")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, req("s3cret2")).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(send(&app, req("")).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn full_queue_is_429_with_retry_after_and_disconnect_cancels() {
    let state = state_with(ServerConfig {
        parallel: 1,
        queue: 1,
        ..config()
    });
    let app = app(state.clone());
    let long = |p: &str| {
        request(
            Method::POST,
            "/v1/chat/completions",
            chat_body(
                p,
                json!({"stream": true, "max_tokens": 400, "stop": ["@@@@"]}),
            )
            .to_string(),
        )
    };
    // Load first, so the timings below are about generation.
    post(
        &app,
        "/v1/chat/completions",
        &chat_body("Hi", json!({"max_tokens": 1})),
    )
    .await;
    let runner = state.models.running().pop().unwrap();
    let scheduler = runner
        .scheduler
        .as_ref()
        .expect("a chat model has a scheduler");
    let counts = || {
        (
            scheduler.counts().queued.load(Ordering::SeqCst),
            scheduler.counts().active.load(Ordering::SeqCst),
        )
    };

    let first = app
        .clone()
        .oneshot(long("Write a long story about a dragon."))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    wait_until("the first request to run", || counts() == (0, 1)).await;
    let second = app
        .clone()
        .oneshot(long("Write a long story about a cat."))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(counts(), (1, 1));
    let third = send(&app, long("And another.")).await;
    assert_eq!(
        third.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        third.text()
    );
    assert_eq!(third.headers["retry-after"], "1");
    assert_eq!(third.json()["error"]["code"], "queue_full");

    // Dropping the responses (a client going away) cancels both sequences.
    drop(first);
    drop(second);
    wait_until("the cancelled sequences to end", || counts() == (0, 0)).await;
    let t = get(&app, "/metrics").await.text();
    assert!(t.contains("finish=\"cancelled\"} 2"), "{t}");
    // And the server keeps serving.
    let r = post(
        &app,
        "/v1/chat/completions",
        &chat_body("Hi", json!({"max_tokens": 2})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn concurrent_greedy_requests_get_the_same_answers_as_sequential_ones() {
    let app = router();
    let prompts = [
        "What is the capital of France?",
        "Count to five.",
        "Name a fruit.",
    ];
    let mut sequential = Vec::new();
    for p in prompts {
        sequential.push(
            post(&app, "/v1/chat/completions", &chat_body(p, json!({})))
                .await
                .json()["choices"][0]["message"]["content"]
                .clone(),
        );
    }
    let futs = prompts.map(|p| {
        let app = app.clone();
        tokio::spawn(async move {
            post(&app, "/v1/chat/completions", &chat_body(p, json!({})))
                .await
                .json()
        })
    });
    for (f, want) in futs.into_iter().zip(sequential) {
        let v = f.await.unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], want);
    }
}
