//! Hugging Face tokenizer directories (tests/fixtures/hf/, made by
//! scripts/make_hf_tokenizer_fixtures.py) against transformers' own encodings, decodings and
//! chat renders of the same files; then the errors hostile or broken files must give.

mod common;

use std::path::PathBuf;

use common::*;
use flowrt_text::hf::{self, HfSources, HfText};
use flowrt_text::{ChatMessage, TextError, Tokenizer, VocabKind};
use serde_json::Value;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn read(name: &str, file: &str) -> String {
    std::fs::read_to_string(dir(name).join(file)).unwrap()
}

fn golden(name: &str) -> Value {
    serde_json::from_str(&read(name, "golden.json")).unwrap()
}

fn load(name: &str) -> HfText {
    hf::load_dir(&dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every corpus string: ids (special tokens parsed and not), decoding (plain, skipping
/// specials, streamed) and `encode(add_special = true)` equal transformers'.
fn check_against_transformers(name: &str, kind: VocabKind) {
    let g = golden(name);
    let text = load(name);
    let tok = &text.tokenizer;
    assert_eq!(tok.kind(), kind);
    assert_eq!(tok.vocab_size() as u64, g["vocab_size"].as_u64().unwrap());
    assert_eq!(text.bos_token.as_deref(), g["bos_token"].as_str());
    assert_eq!(text.eos_token.as_deref(), g["eos_token"].as_str());
    assert_eq!(tok.bos().map(u64::from), g["bos_token_id"].as_u64());
    assert_eq!(tok.eos().map(u64::from), g["eos_token_id"].as_u64());
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 250);
    assert_eq!(check_token_cases(tok, cases), cases.len());
    let mut bad = Vec::new();
    for case in cases {
        let t = str_of(case, "text");
        let want = ids(&case["ids_add_special"]);
        let got = tok.encode(t, true, true).unwrap();
        if got != want {
            bad.push(format!("{t:?}: want {want:?} got {got:?}"));
        }
    }
    assert!(bad.is_empty(), "encode(add_special): {}", bad.join("\n"));
}

#[test]
fn bytelevel_bpe_matches_transformers() {
    check_against_transformers("bytelevel", VocabKind::ByteLevelBpe);
}

#[test]
fn sentencepiece_metaspace_matches_transformers() {
    check_against_transformers("spm", VocabKind::SentencePieceBpe);
}

#[test]
fn sentencepiece_gemma_pipeline_matches_transformers() {
    check_against_transformers("spm_gemma", VocabKind::SentencePieceBpe);
}

#[test]
fn chat_renders_match_transformers() {
    for name in ["bytelevel", "spm", "spm_gemma"] {
        let g = golden(name);
        let tmpl = load(name).template.expect("fixture has a chat template");
        for chat in g["chats"].as_array().unwrap() {
            let msgs: Vec<ChatMessage> = chat["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| ChatMessage::new(str_of(m, "role"), str_of(m, "content")))
                .collect();
            let add_gen = chat["add_generation_prompt"].as_bool().unwrap();
            let got = tmpl.render(&msgs, add_gen).unwrap();
            assert_eq!(
                got,
                str_of(chat, "expected"),
                "{name} / {} / {add_gen}",
                str_of(chat, "name")
            );
        }
    }
}

#[test]
fn end_of_generation_ids() {
    // bytelevel: eos <|im_end|>; <|endoftext|> is a special end-of-text token.
    let t = load("bytelevel").tokenizer;
    let id = |t: &Tokenizer, s: &str| t.token_to_id(s).unwrap();
    assert_eq!(t.eog_ids(), [id(&t, "<|endoftext|>"), id(&t, "<|im_end|>")]);
    assert!(!t.is_eog(id(&t, "<|im_start|>")));
    // <think> is an added token that is not special: never skipped.
    let think = id(&t, "<think>");
    assert!(!t.is_special(think));
    assert_eq!(t.decode(&[think], true).unwrap(), "<think>");

    // spm_gemma: generation_config lists </s> and <end_of_turn>.
    let t = load("spm_gemma").tokenizer;
    let mut want = vec![id(&t, "</s>"), id(&t, "<end_of_turn>")];
    want.sort();
    assert_eq!(t.eog_ids(), want.as_slice());
    assert!(t.is_special(id(&t, "<start_of_turn>")));
}

#[test]
fn add_bos_token_in_the_config_overrides_the_post_processor() {
    let json = read("spm", "tokenizer.json");
    let with = |config: &str| {
        hf::load(&HfSources {
            tokenizer_json: &json,
            tokenizer_config: Some(config),
            ..Default::default()
        })
        .unwrap()
        .tokenizer
    };
    let body = with("{}").encode("hello", false, true).unwrap();
    // No flags: the post-processor's "<s> $A".
    let t = with(r#"{"bos_token": "<s>", "eos_token": "</s>"}"#);
    assert!(t.adds_bos());
    assert_eq!(
        t.encode("hello", true, true).unwrap(),
        [&[1], &body[..]].concat()
    );
    // add_bos_token false wins; add_eos_token true adds </s>.
    let t = with(
        r#"{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false, "add_eos_token": true}"#,
    );
    assert!(!t.adds_bos());
    assert_eq!(
        t.encode("hello", true, true).unwrap(),
        [&body[..], &[2]].concat()
    );
}

#[test]
fn chat_template_file_wins_and_default_is_picked_from_a_list() {
    let json = read("spm", "tokenizer.json");
    let config = read("spm", "tokenizer_config.json");
    let from_list = hf::load(&HfSources {
        tokenizer_json: &json,
        tokenizer_config: Some(&config),
        ..Default::default()
    })
    .unwrap();
    let msgs = [ChatMessage::new("user", "Hi")];
    let out = from_list.template.unwrap().render(&msgs, false).unwrap();
    assert!(out.starts_with("<s><start_of_turn>user"), "{out}");
    let from_file = hf::load(&HfSources {
        tokenizer_json: &json,
        tokenizer_config: Some(&config),
        chat_template: Some("{{ eos_token }}{{ messages[0]['content'] }}"),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        from_file.template.unwrap().render(&msgs, false).unwrap(),
        "</s>Hi"
    );
    let only_named = hf::load(&HfSources {
        tokenizer_json: &json,
        tokenizer_config: Some(r#"{"chat_template": [{"name": "tool_use", "template": "x"}]}"#),
        ..Default::default()
    })
    .unwrap();
    assert!(only_named.template.is_none());
}

#[test]
fn stream_decoding_holds_back_split_characters() {
    for name in ["bytelevel", "spm", "spm_gemma"] {
        let tok = load(name).tokenizer;
        let text = "naïve ☃ 日本語 🙂 done";
        let ids = tok.encode(text, false, true).unwrap();
        let mut dec = tok.stream_decoder(false);
        let mut pieces = Vec::new();
        for &id in &ids {
            pieces.push(dec.push(&tok, id).unwrap().to_string());
        }
        assert_eq!(dec.finish(), "");
        assert!(pieces.iter().any(String::is_empty), "{name}: {pieces:?}");
        assert_eq!(pieces.concat(), tok.decode(&ids, false).unwrap(), "{name}");
    }
}

#[test]
fn ids_beyond_the_tokenizer_are_errors_not_panics() {
    // Model vocabularies are often padded past the tokenizer's last id.
    let tok = load("spm").tokenizer;
    let n = tok.vocab_size() as u32;
    for id in [n, n + 1, u32::MAX] {
        assert!(matches!(
            tok.decode(&[5, id], false),
            Err(TextError::UnknownId { .. })
        ));
        assert!(tok.stream_decoder(true).push(&tok, id).is_err());
        assert!(tok.token_to_piece(id).is_err());
        assert_eq!(tok.id_to_token(id), None);
    }
}

// ---------------------------------------------------------------------------------------------
// Broken and hostile files
// ---------------------------------------------------------------------------------------------

fn load_err(src: HfSources<'_>) -> String {
    match hf::load(&src) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_post_processor_naming_an_unknown_special_token_is_refused() {
    // Found by the tokenizer fuzz target: the tokenizers library loads such a file and then
    // panics ("no entry found for key") on every encode that adds special tokens.
    let mut tj: Value = serde_json::from_str(&read("bytelevel", "tokenizer.json")).unwrap();
    tj["post_processor"] = serde_json::json!({
        "type": "Sequence",
        "processors": [{
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<missing>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {}
        }]
    });
    let text = tj.to_string();
    let e = load_err(HfSources {
        tokenizer_json: &text,
        ..Default::default()
    });
    assert!(
        e.contains("post_processor.single") && e.contains("<missing>"),
        "{e}"
    );
}

#[test]
fn missing_tokenizer_json_names_the_file() {
    let empty = tempfile_dir();
    let e = hf::load_dir(&empty).unwrap_err();
    assert!(matches!(e, TextError::HfMissingFile { .. }), "{e}");
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
    let _ = std::fs::remove_dir_all(&empty);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("flowrt-text-hf-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn malformed_files_name_the_file_and_the_problem() {
    let json = read("bytelevel", "tokenizer.json");
    let cases: Vec<(HfSources<'_>, &str)> = vec![
        (
            HfSources {
                tokenizer_json: "{not json",
                ..Default::default()
            },
            "tokenizer.json: malformed JSON",
        ),
        (
            HfSources {
                tokenizer_json: &json[..json.len() / 2],
                ..Default::default()
            },
            "tokenizer.json: malformed JSON",
        ),
        (
            HfSources {
                tokenizer_json: r#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}"#,
                ..Default::default()
            },
            "tokenizer.json: the tokenizers library refused it",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                tokenizer_config: Some("[1, 2]"),
                ..Default::default()
            },
            "tokenizer_config.json: expected a JSON object",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                tokenizer_config: Some(r#"{"eos_token": "<|nope|>"}"#),
                ..Default::default()
            },
            "tokenizer_config.json: eos_token: \"<|nope|>\" is not a token",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                tokenizer_config: Some(r#"{"bos_token": {"text": "x"}}"#),
                ..Default::default()
            },
            "tokenizer_config.json: bos_token: an object without a string \"content\"",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                tokenizer_config: Some(r#"{"add_bos_token": "yes"}"#),
                ..Default::default()
            },
            "tokenizer_config.json: add_bos_token: expected true or false",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                tokenizer_config: Some(r#"{"chat_template": [{"name": "default"}]}"#),
                ..Default::default()
            },
            "tokenizer_config.json: chat_template[0]",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                tokenizer_config: Some(r#"{"chat_template": "{% for %}"}"#),
                ..Default::default()
            },
            "chat template does not compile",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                generation_config: Some(r#"{"eos_token_id": "2"}"#),
                ..Default::default()
            },
            "generation_config.json: eos_token_id: expected a token id",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                generation_config: Some(r#"{"eos_token_id": [2, 99999]}"#),
                ..Default::default()
            },
            "generation_config.json: eos_token_id: 99999 is outside",
        ),
        (
            HfSources {
                tokenizer_json: &json,
                generation_config: Some(r#"{"eos_token_id": -1}"#),
                ..Default::default()
            },
            "generation_config.json: eos_token_id",
        ),
    ];
    for (src, want) in cases {
        let msg = load_err(src);
        assert!(msg.starts_with(want), "want {want:?}, got {msg:?}");
    }
}

/// The tokenizer.json of a fixture with one top-level field replaced.
fn with_field(name: &str, key: &str, value: Value) -> String {
    let mut v: Value = serde_json::from_str(&read(name, "tokenizer.json")).unwrap();
    v[key] = value;
    v.to_string()
}

#[test]
fn unsupported_pipelines_are_refused_by_name() {
    let ctc = with_field(
        "bytelevel",
        "decoder",
        serde_json::json!({"type": "CTC", "pad_token": "<pad>", "word_delimiter_token": "|", "cleanup": true}),
    );
    let msg = load_err(HfSources {
        tokenizer_json: &ctc,
        ..Default::default()
    });
    assert!(msg.contains("CTC decoder is not supported"), "{msg}");
}

#[test]
fn sparse_ids_are_refused_not_allocated() {
    // One token with id 4e9 must not make a 4-billion-entry table.
    let mut v: Value = serde_json::from_str(&read("bytelevel", "tokenizer.json")).unwrap();
    v["model"]["vocab"]["zzzz"] = Value::from(4_000_000_000u64);
    let json = v.to_string();
    let msg = load_err(HfSources {
        tokenizer_json: &json,
        ..Default::default()
    });
    assert!(msg.contains("too sparse"), "{msg}");
}

#[test]
fn without_config_files_the_tokenizer_still_loads() {
    let json = read("spm", "tokenizer.json");
    let t = hf::load(&HfSources {
        tokenizer_json: &json,
        ..Default::default()
    })
    .unwrap();
    assert!(t.template.is_none());
    assert_eq!(t.tokenizer.bos(), None);
    // The post-processor still adds <s>, as HF would.
    assert_eq!(t.tokenizer.encode("hi", true, true).unwrap()[0], 1);
}

// ---------------------------------------------------------------------------------------------
// The same model both ways
// ---------------------------------------------------------------------------------------------

/// SmolLM2's tokenizer.json pipeline (as scripts/make_text_goldens.py documents it), written
/// from the real GGUF's vocab and merges: the HF path must give what `from_vocab` gives and
/// what HF gives (tests/fixtures/text/smollm2_tokens.json).
#[test]
fn smollm2_as_tokenizer_json_agrees_with_the_gguf_path() {
    use serde_json::json;
    let v = smollm2_vocab();
    let vocab: serde_json::Map<String, Value> = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), Value::from(i)))
        .collect();
    let added: Vec<Value> = (0..v.tokens.len())
        .filter(|&i| v.token_type(i) == flowrt_text::token_type::CONTROL)
        .map(|i| {
            json!({"id": i, "content": v.tokens[i], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer_json = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": v.merges.clone().unwrap()},
    })
    .to_string();
    let text_of = |id: Option<u32>| v.tokens[id.unwrap() as usize].clone();
    let config = json!({
        "bos_token": text_of(v.bos), "eos_token": text_of(v.eos),
        "chat_template": v.chat_template.clone().unwrap(),
    })
    .to_string();
    let hf_text = hf::load(&HfSources {
        tokenizer_json: &tokenizer_json,
        tokenizer_config: Some(&config),
        ..Default::default()
    })
    .unwrap();
    let hf_tok = &hf_text.tokenizer;
    let gguf_tok = Tokenizer::from_vocab(&v).unwrap();
    assert_eq!(hf_tok.kind(), gguf_tok.kind());
    assert_eq!(hf_tok.vocab_size(), gguf_tok.vocab_size());
    assert_eq!(
        (hf_tok.bos(), hf_tok.eos()),
        (gguf_tok.bos(), gguf_tok.eos())
    );
    assert_eq!(hf_tok.eog_ids(), gguf_tok.eog_ids());
    assert_eq!(hf_tok.adds_bos(), gguf_tok.adds_bos());
    for id in 0..gguf_tok.vocab_size() as u32 {
        assert_eq!(
            hf_tok.token_to_piece(id).unwrap(),
            gguf_tok.token_to_piece(id).unwrap()
        );
        assert_eq!(hf_tok.is_special(id), gguf_tok.is_special(id), "{id}");
    }
    let fx = fixture("smollm2_tokens.json");
    let cases = fx["cases"].as_array().unwrap();
    assert_eq!(check_token_cases(hf_tok, cases), cases.len());

    let conv = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hello!"),
    ];
    let from_gguf = flowrt_text::ChatTemplate::from_vocab(&v).unwrap().unwrap();
    assert_eq!(
        hf_text.template.unwrap().render(&conv, true).unwrap(),
        from_gguf.render(&conv, true).unwrap()
    );
}
