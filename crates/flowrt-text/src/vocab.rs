//! The tokenizer part of a GGUF's metadata, as plain data.

use crate::TextError;

/// GGUF `tokenizer.ggml.token_type` values (the same numbers as SentencePiece piece types).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    /// `<unk>`: treated like a control token.
    pub const UNKNOWN: i32 = 2;
    /// Special tokens such as `<|im_start|>` or `<s>`: matched whole in text only when asked
    /// (`parse_special`), dropped by `decode(.., skip_special = true)`.
    pub const CONTROL: i32 = 3;
    /// Added tokens such as `<think>`: always matched whole in text, never skipped.
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    /// `<0xNN>` byte-fallback tokens of SentencePiece vocabs.
    pub const BYTE: i32 = 6;
}

/// The `tokenizer.*` metadata of a GGUF file, under llama.cpp's key names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE), `"llama"` (SentencePiece BPE) or
    /// `"bert"` (WordPiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a `gpt2` vocab (`"smollm"`, `"llama-bpe"`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: one per token; required by `llama` (merge priority).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: one per token, see [`token_type`]; absent means all normal.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: `"left right"` rules, best first; required by `gpt2`.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (llama.cpp's spelling; `bert` vocabs: `[SEP]`).
    pub sep: Option<u32>,
    /// `tokenizer.ggml.add_sep_token` (`bert` vocabs).
    pub add_sep: Option<bool>,
    /// `tokenizer.ggml.add_bos_token`; when absent, `llama` vocabs add BOS and `gpt2` ones do not.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; absent means no.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (`llama` only); absent means yes.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// Read the tokenizer metadata of an open GGUF file.
    pub fn from_gguf(f: &flowrt_gguf::GgufFile) -> Result<Self, TextError> {
        crate::gguf_read::read_vocab(f)
    }

    /// The type of token `id` ([`token_type::NORMAL`] when the file gives no types).
    pub fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .as_ref()
            .and_then(|t| t.get(id).copied())
            .unwrap_or(token_type::NORMAL)
    }

    /// Check lengths and special ids against the vocabulary size.
    pub fn validate(&self) -> Result<(), TextError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(TextError::MissingKey {
                key: "tokenizer.ggml.tokens",
                why: "the vocabulary is empty",
            });
        }
        if let Some(s) = &self.scores {
            if s.len() != n {
                return Err(TextError::LengthMismatch {
                    key: "tokenizer.ggml.scores",
                    len: s.len(),
                    expected: n,
                });
            }
        }
        if let Some(t) = &self.token_types {
            if t.len() != n {
                return Err(TextError::LengthMismatch {
                    key: "tokenizer.ggml.token_type",
                    len: t.len(),
                    expected: n,
                });
            }
        }
        let ids = [
            ("tokenizer.ggml.bos_token_id", self.bos),
            ("tokenizer.ggml.eos_token_id", self.eos),
            ("tokenizer.ggml.eot_token_id", self.eot),
            ("tokenizer.ggml.eom_token_id", self.eom),
            ("tokenizer.ggml.unknown_token_id", self.unk),
            ("tokenizer.ggml.padding_token_id", self.pad),
            ("tokenizer.ggml.seperator_token_id", self.sep),
        ];
        for (key, id) in ids {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(TextError::SpecialIdOutOfRange {
                        key,
                        id: id.into(),
                        vocab_size: n,
                    });
                }
            }
        }
        Ok(())
    }
}
