//! Merge ties (issue 20, part 3): vocabularies in which several candidate merges of one word
//! have exactly the same priority, so that the tie-break decides the ids
//! (tests/fixtures/text/spm_ties.json and bpe_ties.json, made by
//! scripts/make_merge_tie_fixtures.py).
//!
//! - `llama` (SentencePiece BPE, tokens + scores): pieces with equal scores, ids out of position
//!   order, parts of different lengths. Reference: `sentencepiece` itself, which merges the
//!   best-scored pair and among equal scores the leftmost, as llama.cpp's `llm_tokenizer_spm`
//!   does (the generator checks a transcription of llama.cpp against it on every string).
//! - `gpt2` (byte-level BPE, ranked merges): one merge applying at overlapping positions
//!   ("aaa", "looo", "nanana") and a better rank to the right of a worse one. Reference: HF
//!   `tokenizers` (best rank first, then leftmost; llama.cpp's `llm_tokenizer_bpe` agrees).
//!
//! The fixtures' strings are chosen so that another tie rule (rightmost first) changes the ids
//! of at least a third of them (the generator counts it, [`assert_tie_sensitive`] checks the
//! count), so a flipped tie-break fails here.

mod common;

use common::*;
use flowrt_text::hf::{self, HfSources};
use flowrt_text::{Tokenizer, VocabKind};
use serde_json::Value;

fn cases(fx: &Value) -> &[Value] {
    fx["cases"].as_array().unwrap()
}

/// The fixture still discriminates: a rightmost-first tie-break changes at least a third of
/// its strings (so a regenerated fixture cannot quietly lose the ties).
fn assert_tie_sensitive(fx: &Value) {
    let n = cases(fx).len() as u64;
    let changed = fx["changed_by_rightmost_tie_break"].as_u64().unwrap();
    assert!(n >= 80, "{n} strings");
    assert!(
        3 * changed >= n,
        "only {changed} of {n} strings depend on the tie-break"
    );
}

/// The fixture's vocab through the GGUF path: every string's ids (special tokens parsed and
/// not), decoding (plain, skipping specials, streamed) and the round trip.
fn check_corpus(fx: &Value, kind: VocabKind) {
    let tok = Tokenizer::from_vocab(&gguf_vocab(&fx["vocab"])).unwrap();
    assert_eq!(tok.kind(), kind);
    let cases = cases(fx);
    assert_eq!(check_token_cases(&tok, cases), cases.len());
    for case in cases {
        let text = str_of(case, "text");
        let ids = tok.encode(text, false, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "round trip");
    }
}

#[test]
fn spm_tied_scores_merge_leftmost_first_like_sentencepiece() {
    let fx = fixture("spm_ties.json");
    assert_tie_sensitive(&fx);
    check_corpus(&fx, VocabKind::SentencePieceBpe);
}

/// Regression: flowrt ranked the merges of a `llama` vocab like transformers' GGUF conversion
/// (score, then longer left part, longer right part, token order), so pieces "bc" (id before)
/// and "ab" with equal scores cut "abc" as "a" "bc". SentencePiece and llama.cpp take the
/// leftmost of equally scored pairs: "ab" "c". Likewise "x" "y" "zw" -> "xy" "zw", where the
/// ranking preferred "yzw" for its longer right part.
#[test]
fn spm_equal_scores_go_leftmost_not_by_rank_of_the_derived_merge() {
    let fx = fixture("spm_ties.json");
    let tok = Tokenizer::from_vocab(&gguf_vocab(&fx["vocab"])).unwrap();
    let pieces = |text: &str| -> Vec<String> {
        tok.encode(text, false, false)
            .unwrap()
            .iter()
            .map(|&id| tok.id_to_token(id).unwrap().to_string())
            .collect()
    };
    assert_eq!(pieces("abc"), ["▁", "ab", "c"]);
    assert_eq!(pieces("aaa"), ["▁", "aa", "a"]);
    assert_eq!(pieces("xyzw"), ["▁", "xy", "zw"]);
    assert_eq!(pieces("rpqs"), ["▁", "rpq", "s"]);
}

/// The same vocab as HF's GGUF conversion writes it to a tokenizer.json (a BPE with merges
/// ranked by score, length and token order), read by flowrt's tokenizer.json path: that path
/// runs HF's pipeline, so it must give HF's ids -- which differ from SentencePiece's on ties.
#[test]
fn spm_vocab_as_hf_tokenizer_json_matches_hf() {
    let fx = fixture("spm_ties.json");
    let text = hf::load(&HfSources {
        tokenizer_json: str_of(&fx, "hf_tokenizer_json"),
        ..Default::default()
    })
    .unwrap();
    let tok = &text.tokenizer;
    let mut bad = Vec::new();
    let mut differ_from_sentencepiece = 0;
    for case in cases(&fx) {
        let t = str_of(case, "text");
        let want = ids(&case["hf_ids"]);
        let got = tok.encode(t, false, true).unwrap();
        if got != want {
            bad.push(format!("{t:?}: want {want:?} got {got:?}"));
        }
        let decoded = tok.decode(&want, false).unwrap();
        if decoded != str_of(case, "hf_decoded") {
            bad.push(format!("decode {t:?}: got {decoded:?}"));
        }
        differ_from_sentencepiece += (want != ids(&case["ids"])) as usize;
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // The two references really disagree on this fixture (on ties and leading spaces).
    assert!(
        differ_from_sentencepiece >= 40,
        "{differ_from_sentencepiece}"
    );
}

#[test]
fn bytelevel_same_rank_at_overlapping_positions_merges_leftmost_like_hf() {
    let fx = fixture("bpe_ties.json");
    assert_tie_sensitive(&fx);
    check_corpus(&fx, VocabKind::ByteLevelBpe);
}

/// The byte-level vocab as a tokenizer.json (what HF `tokenizers` ran to make the fixture),
/// through flowrt's tokenizer.json path.
#[test]
fn bytelevel_tokenizer_json_matches_hf() {
    let fx = fixture("bpe_ties.json");
    let text = hf::load(&HfSources {
        tokenizer_json: str_of(&fx, "hf_tokenizer_json"),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(text.tokenizer.kind(), VocabKind::ByteLevelBpe);
    let cases = cases(&fx);
    assert_eq!(check_token_cases(&text.tokenizer, cases), cases.len());
}
