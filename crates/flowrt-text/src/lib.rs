//! flowrt-text: tokenizers built from GGUF metadata or Hugging Face tokenizer files, and chat
//! templates.
//!
//! - [`GgufVocab`]: the `tokenizer.*` metadata of a GGUF file as plain data.
//! - [`hf::load_dir`]: the same [`Tokenizer`] and [`ChatTemplate`] from a Hugging Face
//!   checkpoint directory (`tokenizer.json`, `tokenizer_config.json`, ...).
//! - [`Tokenizer`]: text <-> ids for `gpt2` (byte-level BPE) and `llama` (SentencePiece BPE)
//!   vocabs, built with the HF `tokenizers` crate; [`TokenStreamDecoder`] for generated text.
//! - [`ChatTemplate`]: `tokenizer.chat_template` rendered with minijinja the way HF
//!   transformers renders it with jinja2.
//!
//! - [`tools`]: tool-call formats (detection from the template, parsing, streaming) and the
//!   prompt for templates without tool support; [`reasoning`]: `<think>` separation;
//!   [`harmony`]: gpt-oss's harmony format (channels as reasoning, content and tool calls).
//!
//! Tests compare against HF goldens made by `scripts/make_text_goldens.py` and
//! `scripts/make_hf_tokenizer_fixtures.py`.

mod chat;
mod error;
mod gguf_read;
pub mod harmony;
pub mod hf;
pub mod reasoning;
mod tokenizer;
pub mod tools;
mod vocab;

pub use chat::sandbox;
pub use chat::{
    ChatMessage, ChatPrompt, ChatTemplate, FunctionCall, RenderOptions, ToolCall,
    MAX_RENDERED_BYTES, RENDER_TIME_LIMIT,
};
pub use error::TextError;
pub use harmony::{parse_harmony, HarmonyDelta, HarmonyError, HarmonyParse, HarmonyParser};
pub use reasoning::{ReasoningFormat, ReasoningSplitter};
pub use tokenizer::{supported_pre_tokenizers, TokenStreamDecoder, Tokenizer, VocabKind};
pub use tools::{parse_tool_calls, ParsedCall, ToolFormat, ToolParse, ToolStreamParser};
pub use vocab::{token_type, GgufVocab};
