//! Chat-template rendering with hostile templates and messages, the way the server renders a
//! conversation (special-token text in messages guarded, then tokenised). Pieces (cut at
//! `flowrt_fuzz::SEP`): template source, messages (JSON list; other text becomes one user
//! message), tools (JSON list), kwargs (JSON object). Work must stay bounded: minijinja's
//! fuel, its recursion limit and the renderer's output limit end a runaway template with an
//! error.
#![no_main]

use std::sync::OnceLock;

use flowrt_fuzz::split_parts;
use flowrt_text::{hf, ChatMessage, ChatTemplate, RenderOptions, Tokenizer};
use libfuzzer_sys::fuzz_target;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../crates/flowrt-text/tests/fixtures/hf/bytelevel"
        );
        hf::load_dir(std::path::Path::new(dir))
            .expect("the bytelevel fixture loads")
            .tokenizer
    })
}

fuzz_target!(|data: &[u8]| {
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
    let tok = tokenizer();
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
});
