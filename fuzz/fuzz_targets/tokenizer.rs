//! Tokenizer construction, then encode/decode, from either source. Pieces (cut at
//! `flowrt_fuzz_targets::SEP`):
//! - `gguf`, GGUF bytes (its `tokenizer.*` metadata), text;
//! - anything else: `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`,
//!   `chat_template.jinja` (each absent when empty), text.
//! (The body is `flowrt_fuzz_targets::tokenizer`, which CI's stable fuzzer runs too.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| flowrt_fuzz_targets::tokenizer(data));
