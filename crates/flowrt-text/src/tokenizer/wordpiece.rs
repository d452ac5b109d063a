//! WordPiece (BERT) tokenizers from a GGUF `bert` vocabulary.
//!
//! llama.cpp's converter rewrites a BERT vocabulary into "phantom space" form: a continuation
//! `##ing` is stored as `ing`, a word-initial token `play` as `▁play`, and control tokens
//! (`[CLS]`, `[SEP]`, ...) unchanged. This module undoes that to rebuild the WordPiece
//! vocabulary and runs it with the `tokenizers` crate's WordPiece model, BERT's normaliser
//! (clean text, Chinese characters split, lower case; llama.cpp's WordPiece tokenizer lower
//! cases too, and a GGUF does not say otherwise) and pre-tokenizer. Special tokens: BOS
//! (`[CLS]`) in front when `add_bos_token` (default yes), then EOS at the end when
//! `add_eos_token`, else the separator (`[SEP]`) when `add_sep_token` (default yes), as
//! llama.cpp adds them.

use std::str::FromStr;

use serde_json::{json, Value};

use super::{AddSpecial, Engine, Parts, Tokenizer, VocabKind};
use crate::vocab::{token_type, GgufVocab};
use crate::TextError;

/// The WordPiece spelling of a phantom-space token (`None`: a control token, kept as is).
fn wordpiece_spelling(token: &str, ty: i32) -> String {
    if ty == token_type::CONTROL || ty == token_type::UNKNOWN {
        return token.to_string();
    }
    match token.strip_prefix('▁') {
        Some(word) => word.to_string(),
        None => format!("##{token}"),
    }
}

pub(crate) fn from_bert_vocab(v: &GgufVocab) -> Result<Tokenizer, TextError> {
    v.validate()?;
    let spelled: Vec<String> = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| wordpiece_spelling(t, v.token_type(i)))
        .collect();
    let mut vocab = serde_json::Map::with_capacity(spelled.len());
    for (i, t) in spelled.iter().enumerate() {
        // The first id of a repeated spelling wins, as a vocab.txt read in order would give.
        vocab.entry(t.clone()).or_insert(json!(i));
    }
    let unk = match v.unk {
        Some(id) => spelled[id as usize].clone(),
        None => "[UNK]".to_string(),
    };
    if !vocab.contains_key(&unk) {
        return Err(TextError::MissingKey {
            key: "tokenizer.ggml.unknown_token_id",
            why: "a WordPiece vocabulary needs an unknown token ([UNK])",
        });
    }
    let added: Vec<Value> = (0..v.tokens.len())
        .filter(|&i| v.token_type(i) == token_type::CONTROL)
        .map(|i| {
            json!({"id": i, "content": spelled[i], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    // The pipeline as a tokenizer.json would describe it, run by the `tokenizers` crate.
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true,
                       "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordPiece", "unk_token": unk, "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    });
    let hf = tokenizers::Tokenizer::from_str(&spec.to_string())
        .map_err(|e| TextError::tokenizers("build the WordPiece tokenizer", e))?;
    let types: Vec<i32> = (0..v.tokens.len()).map(|i| v.token_type(i)).collect();
    // Decoded text: a continuation joins its word, anything else starts one.
    let pieces = spelled
        .iter()
        .map(|t| match t.strip_prefix("##") {
            Some(rest) => rest.as_bytes().to_vec(),
            None => format!(" {t}").into_bytes(),
        })
        .collect();
    let add_eos = v.add_eos.unwrap_or(false);
    let (eos, add_end) = if add_eos {
        (v.eos, true)
    } else {
        (v.sep.or(v.eos), v.add_sep.unwrap_or(true))
    };
    Ok(Tokenizer::from_parts(Parts {
        kind: VocabKind::WordPiece,
        engine: Engine::Hf(Box::new(hf)),
        tokens: &spelled,
        types,
        pieces,
        bos: v.bos,
        eos,
        eot: None,
        eom: None,
        add_special: AddSpecial::Flags {
            add_bos: v.add_bos.unwrap_or(true),
            add_eos: add_end,
        },
        strip_leading_space: true,
        extra_eog: Vec::new(),
    }))
}
