//! Tokenizer construction, then encode/decode, from either source. Pieces (cut at
//! `flowrt_fuzz::SEP`):
//! - `gguf`, GGUF bytes (its `tokenizer.*` metadata), text;
//! - anything else: `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`,
//!   `chat_template.jinja` (each absent when empty), text.
#![no_main]

use flowrt_fuzz::split_parts;
use flowrt_gguf::GgufFile;
use flowrt_text::{hf, ChatTemplate, GgufVocab, Tokenizer};
use libfuzzer_sys::fuzz_target;

fn exercise(tok: &Tokenizer, text: &str) {
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

fuzz_target!(|data: &[u8]| {
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
            exercise(&tok, text(2).unwrap_or("Hello world"));
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
            exercise(&loaded.tokenizer, text(4).unwrap_or("Hello world"));
        }
    }
});
