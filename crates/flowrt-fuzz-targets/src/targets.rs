//! The bodies of the fuzz targets, one function per target: the libFuzzer binaries in
//! `fuzz/fuzz_targets/` call them, and so does CI's stable mutation fuzzer
//! ([`crate::fuzzer`]). Each must return for any input; a panic is a finding.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use flowrt_gguf::GgufFile;
use flowrt_model::{EmbeddingSpec, LoadOptions, Model, ModelConfig, Plan};
use flowrt_server::{app, AppState, ServerConfig};
use flowrt_text::{hf, ChatMessage, ChatTemplate, GgufVocab, RenderOptions, Tokenizer};
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::parts::split_parts;
use crate::scratch::{clear_dir, scratch_dir};

/// GGUF bytes -> metadata -> model config -> weights bound to roles -> plan, plus the
/// tokenizer, chat template and pooling a GGUF carries: what `LoadedModel::load` does with a
/// file. Any bytes must load or fail with an error; never panic, hang or allocate without
/// bound. (Absorbs the old crates/flowrt-gguf/fuzz `parse` target's checks.)
pub fn gguf_model(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.size_bytes);
    }
    for (key, _) in file.metadata() {
        let _ = (
            file.get_str(key),
            file.get_u64(key),
            file.get_f32(key),
            file.get_bool(key),
            file.get_str_array(key),
        );
    }
    let file = Arc::new(file);
    let _ = EmbeddingSpec::from_gguf(&file);
    if let Ok(model) = Model::from_gguf(file.clone()) {
        let _ = Plan::new(&model.config);
        let _ = model.weight_bytes_per_token();
    }
    if let Ok(vocab) = GgufVocab::from_gguf(&file) {
        if let Ok(tok) = Tokenizer::from_vocab(&vocab) {
            let _ = tok.encode("Hello, world! <|im_start|> 123", true, true);
        }
        let _ = ChatTemplate::from_vocab(&vocab);
    }
}

/// A Hugging Face checkpoint directory: `config.json` -> model config, then the safetensors
/// weights (one `model.safetensors`, or an index naming shards) bound to roles. The input's
/// pieces (cut at `crate::SEP`) become the files:
/// 0 `config.json`, 1 `model.safetensors` (not written when empty),
/// 2 `model.safetensors.index.json` (not written when empty), 3.. `shard-N.safetensors`.
pub fn hf_dir(data: &[u8]) {
    let parts = split_parts(data);
    let dir = scratch_dir();
    clear_dir(dir);
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    write("config.json", parts[0]);
    if let Some(p) = parts.get(1).filter(|p| !p.is_empty()) {
        write("model.safetensors", p);
    }
    if let Some(p) = parts.get(2).filter(|p| !p.is_empty()) {
        write("model.safetensors.index.json", p);
    }
    for (i, p) in parts.iter().skip(3).enumerate() {
        write(&format!("shard-{i}.safetensors"), p);
    }
    // As LoadedModel::load_hf_dir reads it.
    let Ok(text) = std::str::from_utf8(parts[0]) else {
        return;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    let Ok(config) = ModelConfig::from_hf_json(&dir.join("config.json"), &json) else {
        return;
    };
    if let Ok(model) = Model::from_hf_dir(dir, config, LoadOptions::default()) {
        let _ = Plan::new(&model.config);
        let _ = model.weight_bytes_per_token();
    }
}

fn exercise_tokenizer(tok: &Tokenizer, text: &str) {
    for (add, parse) in [(true, true), (false, false)] {
        if let Ok(ids) = tok.encode(text, add, parse) {
            let _ = tok.decode(&ids, false);
            let _ = tok.decode(&ids, true);
        }
    }
    let _ = tok.pre_tokenize(text);
    // Ids from the text's bytes, most of them out of range: errors, not panics.
    let ids: Vec<u32> = text.bytes().map(|b| u32::from(b) * 37).collect();
    let _ = tok.decode(&ids, false);
    let mut stream = tok.stream_decoder(true);
    for &id in &ids {
        let _ = stream.push(tok, id);
    }
    let _ = stream.finish();
    for &id in ids.iter().take(8) {
        let _ = (
            tok.token_to_piece(id),
            tok.id_to_token(id),
            tok.is_special(id),
        );
    }
    let n = tok.vocab_size() as u32;
    let _ = (tok.token_to_piece(n), tok.id_to_token(n), tok.is_eog(n));
}

/// Tokenizer construction, then encode/decode, from either source. Pieces (cut at
/// `crate::SEP`):
/// - `gguf`, GGUF bytes (its `tokenizer.*` metadata), text;
/// - anything else: `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`,
///   `chat_template.jinja` (each absent when empty), text.
pub fn tokenizer(data: &[u8]) {
    let parts = split_parts(data);
    let text = |i: usize| std::str::from_utf8(parts.get(i).copied().unwrap_or(b"")).ok();
    let opt = |i: usize| text(i).filter(|s| !s.is_empty());
    if parts[0] == b"gguf" {
        let Some(bytes) = parts.get(1) else { return };
        let Ok(file) = GgufFile::from_bytes(bytes.to_vec()) else {
            return;
        };
        let Ok(vocab) = GgufVocab::from_gguf(&file) else {
            return;
        };
        let _ = ChatTemplate::from_vocab(&vocab);
        if let Ok(tok) = Tokenizer::from_vocab(&vocab) {
            exercise_tokenizer(&tok, text(2).unwrap_or("Hello world"));
        }
    } else {
        let Some(tokenizer_json) = text(0) else {
            return;
        };
        let src = hf::HfSources {
            tokenizer_json,
            tokenizer_config: opt(1),
            generation_config: opt(2),
            chat_template: opt(3),
        };
        if let Ok(loaded) = hf::load(&src) {
            exercise_tokenizer(&loaded.tokenizer, text(4).unwrap_or("Hello world"));
        }
    }
}

fn bytelevel_tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../crates/flowrt-text/tests/fixtures/hf/bytelevel"
        );
        hf::load_dir(std::path::Path::new(dir))
            .expect("the bytelevel fixture loads")
            .tokenizer
    })
}

/// Chat-template rendering with hostile templates and messages, the way the server renders a
/// conversation (special-token text in messages guarded, then tokenised). Pieces (cut at
/// `crate::SEP`): template source, messages (JSON list; other text becomes one user
/// message), tools (JSON list), kwargs (JSON object). Work must stay bounded: minijinja's
/// fuel, its recursion limit and the renderer's output limit end a runaway template with an
/// error.
pub fn chat_template(data: &[u8]) {
    let parts = split_parts(data);
    let text =
        |i: usize| String::from_utf8_lossy(parts.get(i).copied().unwrap_or(b"")).into_owned();
    let Ok(template) = ChatTemplate::new(&text(0), "<|endoftext|>", "<|im_end|>") else {
        return;
    };
    let raw = text(1);
    let messages: Vec<ChatMessage> = serde_json::from_str(&raw).unwrap_or_else(|_| {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", raw),
        ]
    });
    let tools: Option<Vec<serde_json::Value>> = serde_json::from_str(&text(2)).ok();
    let kwargs: Option<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_str(&text(3)).ok();
    let opts = RenderOptions {
        add_generation_prompt: true,
        tools: tools.as_deref(),
        kwargs: kwargs.as_ref(),
    };
    let tok = bytelevel_tokenizer();
    if let Ok(prompt) = template.render_prompt(&messages, &opts, tok) {
        assert!(prompt.text().len() <= flowrt_text::MAX_RENDERED_BYTES);
        for r in prompt.plain_spans() {
            assert!(r.start <= r.end && r.end <= prompt.text().len());
            assert!(
                prompt.text().is_char_boundary(r.start) && prompt.text().is_char_boundary(r.end)
            );
        }
        // The server tokenises a prompt only when it could fit the context (a bound in bytes
        // from n_ctx and the longest token); 4096 tokens of this vocabulary's is about this.
        if prompt.text().len() <= 64 << 10 {
            let _ = tok.encode_chat(&prompt);
        }
    }
    let _ = template.render(&messages, false);
}

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

/// OpenAI, Anthropic and Ollama request bodies through the server's router (every
/// middleware, the JSON extractor and each handler's validation), without a socket, on a
/// server with no model: a body that passes validation ends at "model not found". The first
/// byte picks the route; the rest is the body. Any body must get a 4xx JSON error in the
/// route's own shape, never a panic, a 5xx or a hang.
pub fn http_body(data: &[u8]) {
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
}
