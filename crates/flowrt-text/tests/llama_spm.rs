//! The `llama` (SentencePiece BPE) path, on a small vocab trained with sentencepiece, against
//! sentencepiece / HF ids (tests/fixtures/text/llama_spm.json).

mod common;

use common::*;
use flowrt_text::{GgufVocab, Tokenizer, VocabKind};
use serde_json::Value;

fn vocab() -> GgufVocab {
    gguf_vocab(&fixture("llama_spm.json")["vocab"])
}

fn cases() -> Vec<Value> {
    fixture("llama_spm.json")["cases"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn corpus_matches_sentencepiece() {
    let tok = Tokenizer::from_vocab(&vocab()).unwrap();
    assert_eq!(tok.kind(), VocabKind::SentencePieceBpe);
    let cases = cases();
    assert!(cases.len() >= 200);
    let matched = check_token_cases(&tok, &cases);
    assert_eq!(matched, cases.len());
}

#[test]
fn bos_is_added_by_default() {
    let mut v = vocab();
    v.add_bos = None; // llama vocabs add BOS unless the file says otherwise
    let tok = Tokenizer::from_vocab(&v).unwrap();
    let body = tok.encode("hello world", false, true).unwrap();
    let full = tok.encode("hello world", true, true).unwrap();
    assert_eq!(full[0], tok.bos().unwrap());
    assert_eq!(&full[1..], body.as_slice());
    v.add_bos = Some(false);
    let tok = Tokenizer::from_vocab(&v).unwrap();
    assert_eq!(tok.encode("hello world", true, true).unwrap(), body);
}

#[test]
fn byte_fallback_pieces_are_bytes() {
    let tok = Tokenizer::from_vocab(&vocab()).unwrap();
    let snow = tok.encode("☃", false, true).unwrap();
    // "▁" then the three UTF-8 bytes of U+2603 as <0xNN> tokens.
    let pieces: Vec<Vec<u8>> = snow
        .iter()
        .map(|&i| tok.token_to_piece(i).unwrap().to_vec())
        .collect();
    assert_eq!(pieces.concat(), " ☃".as_bytes());
    assert!(snow
        .iter()
        .skip(1)
        .all(|&i| tok.id_to_token(i).unwrap().starts_with("<0x")));
    assert_eq!(tok.decode(&snow, false).unwrap(), "☃");
}

#[test]
fn no_space_prefix_when_the_vocab_says_so() {
    let mut v = vocab();
    let with = Tokenizer::from_vocab(&v).unwrap();
    v.add_space_prefix = Some(false);
    let without = Tokenizer::from_vocab(&v).unwrap();
    // Without the prefix, "hello" is the same as " hello" with it minus the leading "▁".
    let a = without.encode(" hello", false, true).unwrap();
    let b = with.encode("hello", false, true).unwrap();
    assert_eq!(a, b);
    assert_eq!(without.decode(&a, false).unwrap(), " hello");
    assert_eq!(with.decode(&b, false).unwrap(), "hello");
}

#[test]
fn token_lookup_round_trips_and_a_repeated_token_maps_to_its_first_id() {
    let mut v = vocab();
    let n = v.tokens.len();
    let repeated = v.tokens[n / 2].clone();
    v.tokens.push(repeated.clone());
    v.scores.as_mut().unwrap().push(-1e9);
    v.token_types.as_mut().unwrap().push(1);
    let tok = Tokenizer::from_vocab(&v).unwrap();
    assert_eq!(tok.vocab_size(), n + 1);
    for (id, t) in v.tokens.iter().enumerate() {
        let first = v.tokens.iter().position(|x| x == t).unwrap() as u32;
        if t.is_empty() {
            assert_eq!(tok.id_to_token(id as u32), None);
        } else {
            assert_eq!(tok.id_to_token(id as u32), Some(t.as_str()));
            assert_eq!(tok.token_to_id(t), Some(first), "{t:?}");
        }
    }
    assert_eq!(tok.token_to_id(&repeated), Some((n / 2) as u32));
    assert_eq!(tok.id_to_token(n as u32), Some(repeated.as_str()));
    assert_eq!(tok.id_to_token(n as u32 + 1), None);
    assert_eq!(tok.token_to_id("no such token in the vocab"), None);
    assert_eq!(tok.token_to_id(""), None);
}
