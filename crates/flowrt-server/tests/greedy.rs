//! Greedy output through the API equals the engine's `generate` (what `flowrt run` calls) for
//! the same prompt and settings. (`crates/flowrt-cli/tests/serve.rs` also compares with the
//! `flowrt run` binary itself.)

mod common;

use common::*;
use flowrt_engine::{generate, EngineOptions, GenerateOptions, LoadedModel, Session};
use flowrt_sample::SamplerConfig;
use flowrt_text::ChatMessage;
use serde_json::json;

fn run_like(prompt: &str, chat: bool, max_tokens: usize) -> String {
    let model = LoadedModel::load(&smollm2()).unwrap();
    let opts = EngineOptions {
        threads: 2,
        n_ctx: Some(N_CTX),
        ..EngineOptions::default()
    };
    let mut session = Session::new(&model, &opts).unwrap();
    let tokens = if chat {
        let text = model
            .template
            .as_ref()
            .unwrap()
            .render(&[ChatMessage::new("user", prompt)], true)
            .unwrap();
        model.tokenizer.encode(&text, false, true).unwrap()
    } else {
        model.tokenizer.encode(prompt, true, true).unwrap()
    };
    let mut out = String::new();
    let gen = GenerateOptions {
        max_tokens,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop: Vec::new(),
        ignore_eos: false,
        constraint: None,
    };
    generate(&mut session, &model.tokenizer, &tokens, &gen, &mut |t| {
        out.push_str(t);
        true
    })
    .unwrap();
    out
}

#[tokio::test]
async fn greedy_chat_and_completion_equal_the_engine() {
    let app = router();
    let prompt = "Explain in one sentence why the sky is blue.";
    let want = run_like(prompt, true, 40);
    let v = post(&app, "/v1/chat/completions", &json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 40})).await.json();
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        want
    );
    let v = post(&app, "/api/chat", &json!({"model": MODEL, "stream": false, "messages": [{"role": "user", "content": prompt}], "options": {"temperature": 0, "num_predict": 40, "repeat_penalty": 1.0, "top_k": 0, "top_p": 1.0}})).await.json();
    assert_eq!(v["message"]["content"].as_str().unwrap(), want);

    let raw = "The capital of France is";
    let want = run_like(raw, false, 24);
    let v = post(
        &app,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": raw, "temperature": 0, "max_tokens": 24}),
    )
    .await
    .json();
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want);
}
