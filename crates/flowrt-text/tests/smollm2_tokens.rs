//! SmolLM2's tokenizer, built from the real GGUF, against HF goldens
//! (tests/fixtures/text/smollm2_tokens.json, see scripts/make_text_goldens.py for the reference).

mod common;

use common::*;
use flowrt_text::{token_type, Tokenizer, VocabKind};

#[test]
fn gguf_vocab_matches_gguf_py() {
    let fx = fixture("smollm2_tokens.json");
    let g = &fx["gguf"];
    let v = smollm2_vocab();
    assert_eq!(v.model, str_of(g, "model"));
    assert_eq!(v.pre.as_deref(), Some(str_of(g, "pre")));
    assert_eq!(v.tokens.len() as u64, g["vocab_size"].as_u64().unwrap());
    let merges = v.merges.as_ref().expect("merges");
    assert_eq!(merges.len() as u64, g["n_merges"].as_u64().unwrap());
    let first: Vec<&str> = g["first_merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(&merges[..first.len()], first.as_slice());
    let controls: Vec<&str> = g["control_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let ours: Vec<&str> = (0..v.tokens.len())
        .filter(|&i| v.token_type(i) == token_type::CONTROL)
        .map(|i| v.tokens[i].as_str())
        .collect();
    assert_eq!(ours, controls);
    let normal = (0..v.tokens.len())
        .filter(|&i| v.token_type(i) == token_type::NORMAL)
        .count();
    assert_eq!(normal as u64, g["n_normal"].as_u64().unwrap());
    assert_eq!(v.bos.map(u64::from), g["bos"].as_u64());
    assert_eq!(v.eos.map(u64::from), g["eos"].as_u64());
    assert_eq!(v.unk.map(u64::from), g["unk"].as_u64());
    assert_eq!(v.pad.map(u64::from), g["pad"].as_u64());
    assert_eq!(v.add_bos, g["add_bos"].as_bool());
    assert_eq!(v.add_space_prefix, g["add_space_prefix"].as_bool());
    assert_eq!(v.scores.is_some(), g["has_scores"].as_bool().unwrap());
    assert_eq!(v.chat_template.as_deref(), g["chat_template"].as_str());
}

#[test]
fn corpus_matches_hf() {
    let fx = fixture("smollm2_tokens.json");
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 200);
    let tok = smollm2_tokenizer();
    assert_eq!(tok.kind(), VocabKind::ByteLevelBpe);
    let matched = check_token_cases(&tok, cases);
    assert_eq!(matched, cases.len());
}

#[test]
fn special_ids() {
    let tok = smollm2_tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    let id = |t: &str| tok.token_to_id(t).unwrap_or_else(|| panic!("{t} in vocab"));
    assert_eq!(tok.bos(), Some(id("<|im_start|>")));
    assert_eq!(tok.eos(), Some(id("<|im_end|>")));
    assert_eq!(tok.eot(), None);
    // <|im_end|> is eos; <|endoftext|> is a control token that also ends generation.
    let mut eog = vec![id("<|endoftext|>"), id("<|im_end|>")];
    eog.sort();
    assert_eq!(tok.eog_ids(), eog.as_slice());
    assert!(tok.is_eog(id("<|im_end|>")));
    assert!(!tok.is_eog(id("<|im_start|>")));
    assert_eq!(tok.id_to_token(id("Ġthe")), Some("Ġthe"));
    assert_eq!(tok.token_to_piece(id("Ġthe")).unwrap(), b" the");
    assert!(tok.token_to_piece(49152).is_err());
    assert!(tok.decode(&[49152], false).is_err());
}

#[test]
fn add_special_follows_the_vocab() {
    // SmolLM2's GGUF says add_bos_token = false, as its tokenizer.json adds nothing.
    let tok = smollm2_tokenizer();
    assert!(!tok.adds_bos());
    let text = "Hello world";
    assert_eq!(
        tok.encode(text, true, true).unwrap(),
        tok.encode(text, false, true).unwrap()
    );
    let mut v = smollm2_vocab();
    v.add_bos = Some(true);
    v.add_eos = Some(true);
    let tok = Tokenizer::from_vocab(&v).unwrap();
    let body = tok.encode(text, false, true).unwrap();
    let full = tok.encode(text, true, true).unwrap();
    assert_eq!(full.first().copied(), v.bos);
    assert_eq!(full.last().copied(), v.eos);
    assert_eq!(&full[1..full.len() - 1], body.as_slice());
}

#[test]
fn stream_never_splits_a_character() {
    let tok = smollm2_tokenizer();
    let text = "日本語 👨\u{200d}👩\u{200d}👧 🫠 Ω";
    let ids = tok.encode(text, false, true).unwrap();
    // The emoji family is several byte-level tokens per character: some pushes must be empty.
    let mut dec = tok.stream_decoder(false);
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(dec.push(&tok, id).unwrap().to_string());
    }
    assert_eq!(dec.finish(), "");
    assert!(
        pieces.iter().any(String::is_empty),
        "expected held-back bytes: {pieces:?}"
    );
    assert_eq!(pieces.concat(), text);
    // Cut off mid-character: the tail becomes one U+FFFD, as from_utf8_lossy would have it.
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&i| tok.token_to_piece(i).unwrap().to_vec())
        .collect();
    for cut in 0..=ids.len() {
        let want_bytes: Vec<u8> = ids[..cut]
            .iter()
            .flat_map(|&i| tok.token_to_piece(i).unwrap().to_vec())
            .collect();
        assert!(bytes.starts_with(&want_bytes));
        let want = String::from_utf8_lossy(&want_bytes);
        assert_eq!(stream_decode(&tok, &ids[..cut], false), want);
        assert_eq!(tok.decode(&ids[..cut], false).unwrap(), want);
    }
}

#[test]
fn stream_matches_lossy_decoding_on_arbitrary_ids() {
    // Byte-level decoding is from_utf8_lossy of the concatenated token bytes; random id
    // sequences exercise invalid and truncated UTF-8.
    let tok = smollm2_tokenizer();
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    // Byte-valued tokens (single bytes >= 0x80) make broken UTF-8 likely.
    let byte_ids: Vec<u32> = (0..tok.vocab_size() as u32)
        .filter(|&i| {
            tok.token_to_piece(i).unwrap().len() == 1 && tok.token_to_piece(i).unwrap()[0] >= 0x80
        })
        .collect();
    assert!(byte_ids.len() > 60);
    for _ in 0..500 {
        let n = (next() % 12) as usize;
        let ids: Vec<u32> = (0..n)
            .map(|_| {
                if next() % 2 == 0 {
                    byte_ids[(next() % byte_ids.len() as u64) as usize]
                } else {
                    (next() % tok.vocab_size() as u64) as u32
                }
            })
            .collect();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| tok.token_to_piece(i).unwrap().to_vec())
            .collect();
        let want = String::from_utf8_lossy(&bytes);
        assert_eq!(stream_decode(&tok, &ids, false), want, "ids {ids:?}");
    }
}
