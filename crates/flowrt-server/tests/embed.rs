//! The embedding routes (`/v1/embeddings`, `/api/embed`, `/api/embeddings`) on the tiny
//! fixtures: the random BERT (an embedding-only sentence-transformers directory), the random
//! Qwen3 embedder (a decoder with last-token pooling) and a chat model without pooling.

mod common;

use std::path::PathBuf;

use common::*;
use flowrt_engine::{EmbedOptions, Embedder, EngineOptions, LoadedModel};
use flowrt_server::{app, AppState, ModelSpec};
use serde_json::{json, Value};

const BERT: &str = "tiny-bert:test";
const QWEN3_EMBED: &str = "tiny-qwen3:embed";
const CHAT: &str = "qwen3:chat";

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

fn spec(id: &str, path: PathBuf) -> ModelSpec {
    ModelSpec::new(id, path, "cd".repeat(32), 1, "test").unwrap()
}

fn router() -> axum::Router {
    let mut cfg = config();
    cfg.engine.n_ctx = None;
    app(AppState::new(
        vec![
            spec(BERT, fixture("embed/tiny-bert")),
            spec(QWEN3_EMBED, fixture("embed/tiny-qwen3")),
            spec(CHAT, fixture("families/qwen3")),
        ],
        cfg,
    ))
}

/// What the engine itself gives for `texts` on the tiny BERT.
fn engine_vectors(texts: &[&str]) -> Vec<Vec<f32>> {
    let model = LoadedModel::load(&fixture("embed/tiny-bert")).unwrap();
    let engine = EngineOptions {
        threads: 2,
        ..EngineOptions::default()
    };
    let mut e = Embedder::new(&model, &engine, &EmbedOptions::default()).unwrap();
    e.embed(&model, texts, false).unwrap().vectors
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn from_base64(s: &str) -> Vec<f32> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut bytes = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk
            .iter()
            .map(|&c| if c == b'=' { 0 } else { val(c) })
            .fold(0u32, |n, v| n << 6 | v);
        bytes.extend(&n.to_be_bytes()[1..4 - pad]);
    }
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn assert_error(r: &Reply, status: u16, param: &str) {
    let text: String = r.text().chars().take(400).collect();
    assert_eq!(r.status.as_u16(), status, "{text}");
    let e = &r.json()["error"];
    assert_eq!(e["param"], param, "{text}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
}

#[tokio::test]
async fn openai_embeddings_float_base64_tokens_and_usage() {
    let app = router();
    let texts = ["hello", "A quick brown fox jumps over the lazy dog."];
    let want = engine_vectors(&texts);

    let r = post(
        &app,
        "/v1/embeddings",
        &json!({"model": BERT, "input": texts}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], BERT);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        assert_eq!(
            floats(&d["embedding"]),
            want[i],
            "the API returns the engine's vector"
        );
    }
    let model = LoadedModel::load(&fixture("embed/tiny-bert")).unwrap();
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| model.tokenizer.encode(t, true, true).unwrap())
        .collect();
    let n: usize = ids.iter().map(Vec::len).sum();
    assert_eq!(v["usage"]["prompt_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], n);

    // One string; base64 of little-endian f32; `dimensions` equal to the model's.
    let r = post(
        &app,
        "/v1/embeddings",
        &json!({"model": BERT, "input": texts[1], "encoding_format": "base64", "dimensions": 32}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(from_base64(&b64), want[1]);

    // Token ids: one list, and a list of lists, give the texts' vectors.
    let r = post(
        &app,
        "/v1/embeddings",
        &json!({"model": BERT, "input": ids[1]}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(floats(&r.json()["data"][0]["embedding"]), want[1]);
    let r = post(
        &app,
        "/v1/embeddings",
        &json!({"model": BERT, "input": ids}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(floats(&r.json()["data"][0]["embedding"]), want[0]);
    assert_eq!(r.json()["usage"]["prompt_tokens"], n);
}

#[tokio::test]
async fn bad_embedding_requests_name_the_field() {
    let app = router();
    let cases = [
        (json!({"model": BERT, "input": []}), 400, "input"),
        (json!({"model": BERT, "input": 5}), 400, "input"),
        (json!({"model": BERT, "input": ["a", 3]}), 400, "input[1]"),
        (
            json!({"model": BERT, "input": [[1, 2], []]}),
            400,
            "input[1]",
        ),
        (json!({"model": BERT, "input": [1, -2]}), 400, "input[1]"),
        (json!({"model": BERT, "input": [[400]]}), 400, "input[0]"),
        (
            json!({"model": BERT, "input": "x", "encoding_format": "int8"}),
            400,
            "encoding_format",
        ),
        (
            json!({"model": BERT, "input": "x", "dimensions": 16}),
            400,
            "dimensions",
        ),
        (
            json!({"model": BERT, "input": "x", "dimensions": 0}),
            400,
            "dimensions",
        ),
        // Longer than the model's max_seq_length (48): no silent cut on this route.
        (
            json!({"model": BERT, "input": ["short", "word ".repeat(60)]}),
            400,
            "input[1]",
        ),
        // A chat model declares no pooling.
        (json!({"model": CHAT, "input": "hello"}), 400, "model"),
        (json!({"model": "nope:1b", "input": "hello"}), 404, "model"),
    ];
    for (body, status, param) in cases {
        let r = post(&app, "/v1/embeddings", &body).await;
        assert_error(&r, status, param);
    }
    // 10 000 inputs: refused before anything runs.
    let many: Vec<&str> = vec!["a"; 10_000];
    let r = post(
        &app,
        "/v1/embeddings",
        &json!({"model": BERT, "input": many}),
    )
    .await;
    assert_error(&r, 400, "input");
    assert!(r.text().contains("2048"), "{}", r.text());
    let r = post(
        &app,
        "/v1/embeddings",
        &json!({"model": BERT, "input": ["a", "word ".repeat(60)]}),
    )
    .await;
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
}

#[tokio::test]
async fn chat_to_an_embedding_model_is_a_400() {
    let app = router();
    let r = post(
        &app,
        "/v1/chat/completions",
        &json!({"model": BERT, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_error(&r, 400, "model");
    assert!(r.text().contains("only embeds"), "{}", r.text());
    let r = post(
        &app,
        "/api/generate",
        &json!({"model": BERT, "prompt": "hi", "stream": false}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("only embeds"));
}

#[tokio::test]
async fn ollama_embed_truncates_by_default_and_embeddings_is_the_old_shape() {
    let app = router();
    let long = "word ".repeat(60);
    let want = engine_vectors(&["hello"]);
    let r = post(
        &app,
        "/api/embed",
        &json!({"model": BERT, "input": "hello"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model"], BERT);
    assert_eq!(floats(&v["embeddings"][0]), want[0]);
    assert!(v["total_duration"].as_u64().is_some() && v["load_duration"].as_u64().is_some());

    // Ollama's default `truncate: true` cuts to the model's 48 tokens, and says so.
    let r = post(
        &app,
        "/api/embed",
        &json!({"model": BERT, "input": ["hello", long]}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["embeddings"].as_array().unwrap().len(), 2);
    let hello = LoadedModel::load(&fixture("embed/tiny-bert"))
        .unwrap()
        .tokenizer
        .encode("hello", true, true)
        .unwrap()
        .len();
    assert_eq!(v["prompt_eval_count"], hello + 48);
    let r = post(
        &app,
        "/api/embed",
        &json!({"model": BERT, "input": ["hello", long], "truncate": false}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    assert!(
        r.json()["error"].as_str().unwrap().contains("input[1]"),
        "{}",
        r.text()
    );
    for (body, field) in [
        (json!({"model": BERT, "input": []}), "input"),
        (json!({"model": BERT}), "input"),
        (json!({"model": BERT, "input": [1]}), "input[0]"),
        (
            json!({"model": BERT, "input": "x", "keep_alive": "soon"}),
            "keep_alive",
        ),
    ] {
        let r = post(&app, "/api/embed", &body).await;
        assert_eq!(r.status.as_u16(), 400, "{}", r.text());
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(&format!("`{field}`")), "{msg}");
    }

    let r = post(
        &app,
        "/api/embeddings",
        &json!({"model": BERT, "prompt": "hello"}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(floats(&r.json()["embedding"]), want[0]);
    let r = post(
        &app,
        "/api/embeddings",
        &json!({"model": BERT, "prompt": long}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    assert!(
        r.json()["error"].as_str().unwrap().contains("`prompt`"),
        "{}",
        r.text()
    );
    let r = post(&app, "/api/embeddings", &json!({"model": BERT})).await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
}

/// A decoder that declares last-token pooling embeds through the same routes (and still
/// chats).
#[tokio::test]
async fn a_decoder_embedder_serves_embeddings() {
    let app = router();
    let r = post(
        &app,
        "/v1/embeddings",
        &json!({"model": QWEN3_EMBED, "input": ["hello", "x"]}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let e = floats(&r.json()["data"][1]["embedding"]);
    assert_eq!(e.len(), 32);
    let norm: f32 = e.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    let r = post(
        &app,
        "/v1/completions",
        &json!({"model": QWEN3_EMBED, "prompt": "hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
}
