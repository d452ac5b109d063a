//! `flowrt diff A B` on the tiny llama-untied fixture (an f32 HF directory and its Q4_1 GGUF),
//! the tiny qwen3-relabel shim (tests/fixtures/shims/) and the same shim of SmolLM2 (built by
//! tests/shims/mod.rs; needs `FLOWRT_SMOLLM2_GGUF`, which scripts/test sets).

mod shims;

use std::path::PathBuf;
use std::process::{Command, Output};

fn flowrt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .env("FLOWRT_LOG", "off")
        .args(args)
        .output()
        .unwrap()
}

fn fixture(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families")
        .join(rel)
        .display()
        .to_string()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_model_against_itself_exits_0_with_no_divergent_layer() {
    let a = fixture("llama-untied");
    let o = flowrt(&["diff", &a, &a]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("first divergent layer: none"), "{out}");
    assert!(out.contains("top-1 agreement 100.00%"), "{out}");
    for stage in ["embedding", "0", "1", "2"] {
        assert!(
            out.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f[..]
                    == [
                        stage, "1.000000", "1.000000", "0.0000e0", "0.0000e0", "p0:0", "0.0000e0",
                        "0.0000e0",
                    ]
            }),
            "{stage}: {out}"
        );
    }
}

#[test]
fn q4_1_against_its_source_names_the_first_layer_over_the_threshold() {
    let a = fixture("llama-untied");
    let b = fixture("llama-untied/model-q4_1.gguf");
    // Default threshold (0.2): Q4_1 stays under it (every block's own error 0.109 to 0.139).
    let o = flowrt(&["diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    // At 0.1 the embedding (0.077) passes and layer 0 (attention 0.109, feed-forward 0.137)
    // does not: exit 1, like diff(1).
    let o = flowrt(&["diff", &a, &b, "--threshold", "0.1", "--json"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["first_divergent_layer"], 0, "{v}");
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 4);
    assert_eq!(layers[0]["layer"], serde_json::Value::Null);
    assert_eq!(layers[0]["divergent"], false);
    assert_eq!(layers[1]["divergent"], true);
    let own = |l: &serde_json::Value| {
        l["attn_err"]
            .as_f64()
            .unwrap()
            .max(l["ffn_err"].as_f64().unwrap())
    };
    assert!(
        own(&layers[1]) > 0.1 && own(&layers[1]) < 0.2,
        "{}",
        layers[1]
    );
    // --quant quantises B only: the source against itself quantised on load diverges too.
    let o = flowrt(&["diff", &a, &a, "--quant", "q4_1", "--json"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e0 = v["layers"][0]["mean_rel_err"].as_f64().unwrap();
    assert!(e0 > 0.02 && e0 < 0.2, "{v}");
    // At 0.05 the embedding itself (a quantised token_embd) is the first.
    let o = flowrt(&["diff", &a, &b, "--threshold", "0.05"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("first divergent layer: embedding"), "{out}");
}

/// The layer whose block's own error first exceeds the threshold, from `diff --json`, with
/// the report.
fn first_divergent(a: &str, b: &str) -> (serde_json::Value, serde_json::Value) {
    let o = flowrt(&["diff", a, b, "--json"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (v["first_divergent_layer"].clone(), v)
}

/// The thread's shim changes every attention block and no feed-forward one: each attention
/// block's own error is over the threshold, each feed-forward block's exactly 0.
fn assert_attention_only(v: &serde_json::Value) {
    for l in &v["layers"].as_array().unwrap()[1..] {
        assert_eq!(l["ffn_err"], 0.0, "{l}");
    }
    assert!(v["layers"][1]["attn_err"].as_f64().unwrap() > 0.2, "{v}");
}

#[test]
fn injected_qk_norm_is_named_at_layer_0() {
    // The tiny Llama relabelled Qwen3 with all-ones QK-norm: layer 0's attention block (own
    // error 0.418) is where it starts, although the residual stream after layer 0 is still
    // under the threshold (0.151: the error piles up later, 0.208 after layer 1).
    let (first, v) = first_divergent(&fixture("llama-untied"), &fixture("../shims/qwen3-relabel"));
    assert_eq!(first, 0, "{v}");
    assert_attention_only(&v);
    let l0 = &v["layers"][1];
    assert!(l0["mean_rel_err"].as_f64().unwrap() < 0.2, "{l0}");
}

#[test]
fn injected_qk_norm_in_smollm2_is_named_at_layer_0() {
    // Measured: layer 0's attention 0.254 (honest Q8_0/Q4_K/F16 packs of SmolLM2 stay at or
    // below 0.026), every feed-forward block 0; the residual stream after layer 0 is at 0.121.
    let src = flowrt_testkit::models::smollm2();
    let dir = tempfile::tempdir().unwrap();
    let shim = dir.path().join("qwen3-relabel.gguf");
    shims::make(&src, shims::Shim::Qwen3Relabel, &shim);
    let (first, v) = first_divergent(src.to_str().unwrap(), shim.to_str().unwrap());
    assert_eq!(first, 0, "{v}");
    assert_attention_only(&v);
    let l0 = &v["layers"][1];
    assert!(l0["mean_rel_err"].as_f64().unwrap() < 0.2, "{l0}");
}

#[test]
fn prompts_file_adds_prompts() {
    let a = fixture("llama-untied");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("prompts.txt");
    std::fs::write(&p, "hello world\n\n  \nthe cat sat on the mat\n").unwrap();
    let p = p.display().to_string();
    let o = flowrt(&["diff", &a, &a, "--prompts", &p, "--no-builtin", "--json"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["prompt_tokens"].as_array().unwrap().len(), 2, "{v}");
    let o = flowrt(&["diff", &a, &a, "--prompts", &p, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    // The built-in set (flowrt_engine::BUILTIN_TEXTS and the chat) plus the file's two.
    let builtin = flowrt_engine::BUILTIN_TEXTS.len() + 1;
    assert_eq!(
        v["prompt_tokens"].as_array().unwrap().len(),
        builtin + 2,
        "{v}"
    );
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "\n\n").unwrap();
    let o = flowrt(&["diff", &a, &a, "--prompts", &empty.display().to_string()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("holds no prompt"), "{err}");
}

#[test]
fn models_that_cannot_be_compared_exit_2_saying_why() {
    let a = fixture("llama-untied");
    let o = flowrt(&["diff", &a, &fixture("llama-42l")]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains("decoder layers: A has 3, B has 42")
            && err.contains("hidden size: A has 64, B has 32"),
        "{err}"
    );
    let o = flowrt(&["diff", &a, &fixture("qwen2")]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("same tokenizer"), "{err}");
    let o = flowrt(&["diff", &a, &a, "--threshold", "-1"]);
    assert_eq!(o.status.code(), Some(2));
}
