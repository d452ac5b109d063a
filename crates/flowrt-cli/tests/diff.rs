//! `flowrt diff A B` on the tiny llama-untied fixture (an f32 HF directory and its Q4_1 GGUF).

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
                        stage, "1.000000", "1.000000", "0.0000e0", "+0.000e0", "0.0000e0", "p0:0",
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
    // Default threshold (0.2): Q4_1 stays under it.
    let o = flowrt(&["diff", &a, &b]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    // At 0.1 the embedding (~0.077) passes and layer 0 (~0.105) does not: exit 1, like diff(1).
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
