//! The gpt2 pre-tokenizers against HF's (tests/fixtures/text/pretok_splits.json), and the
//! errors for vocabs this crate cannot build.

mod common;

use common::*;
use flowrt_text::{supported_pre_tokenizers, GgufVocab, TextError, Tokenizer};

/// A byte-level vocab of just the 256 byte symbols: enough to build any gpt2 pre-tokenizer.
fn byte_vocab(pre: &str) -> GgufVocab {
    let tok = smollm2_vocab();
    // SmolLM2's vocab is in the byte alphabet; take its single-symbol tokens.
    let tokens: Vec<String> = tok
        .tokens
        .iter()
        .filter(|t| t.chars().count() == 1)
        .cloned()
        .collect();
    GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        merges: Some(vec![]),
        ..Default::default()
    }
}

#[test]
fn splits_match_hf() {
    let fx = fixture("pretok_splits.json");
    let texts = fx["texts"].as_array().unwrap();
    let splits = fx["splits"].as_object().unwrap();
    assert_eq!(splits.len(), 4);
    for (pre, want_all) in splits {
        let tok = Tokenizer::from_vocab(&byte_vocab(pre)).unwrap();
        let mut matched = 0;
        for (text, want) in texts.iter().zip(want_all.as_array().unwrap()) {
            let text = text.as_str().unwrap();
            let want: Vec<&str> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect();
            let got = tok.pre_tokenize(text).unwrap();
            assert_eq!(got, want, "pre-tokenizer {pre:?} on {text:?}");
            matched += 1;
        }
        eprintln!("{pre}: {matched}/{} strings split as HF does", texts.len());
    }
}

#[test]
fn unknown_pre_tokenizer_is_an_error_naming_it() {
    let err = Tokenizer::from_vocab(&byte_vocab("tekken")).unwrap_err();
    match &err {
        TextError::UnsupportedPreTokenizer { pre, supported } => {
            assert_eq!(pre, "tekken");
            for name in supported_pre_tokenizers() {
                assert!(supported.contains(name));
            }
        }
        e => panic!("wrong error {e}"),
    }
    assert!(err.to_string().contains("\"tekken\""), "{err}");
}

#[test]
fn unknown_model_and_missing_parts_are_errors() {
    let mut v = byte_vocab("gpt2");
    v.model = "t5".into();
    assert!(matches!(
        Tokenizer::from_vocab(&v),
        Err(TextError::UnsupportedModel { .. })
    ));
    let mut v = byte_vocab("gpt2");
    v.merges = None;
    assert!(matches!(
        Tokenizer::from_vocab(&v),
        Err(TextError::MissingKey {
            key: "tokenizer.ggml.merges",
            ..
        })
    ));
    let mut v = byte_vocab("gpt2");
    v.merges = Some(vec!["Ġ".into()]);
    assert!(matches!(
        Tokenizer::from_vocab(&v),
        Err(TextError::BadMerge { index: 0, .. })
    ));
    let mut v = byte_vocab("gpt2");
    v.eos = Some(v.tokens.len() as u32);
    assert!(matches!(
        Tokenizer::from_vocab(&v),
        Err(TextError::SpecialIdOutOfRange { .. })
    ));
    let mut v = byte_vocab("gpt2");
    v.model = "llama".into();
    assert!(matches!(
        Tokenizer::from_vocab(&v),
        Err(TextError::MissingKey {
            key: "tokenizer.ggml.scores",
            ..
        })
    ));
    let mut v = byte_vocab("gpt2");
    v.token_types = Some(vec![1]);
    assert!(matches!(
        Tokenizer::from_vocab(&v),
        Err(TextError::LengthMismatch { .. })
    ));
}
