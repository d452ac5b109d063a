//! `flowrt embed` on the tiny random BERT fixture (its references are checked in the engine's
//! tests; here: the command's inputs, outputs and refusals).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

fn flowrt(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .args(args)
        .args(["-t", "2", "--no-fetch"])
        .env("FLOWRT_PYTHON", "/nonexistent/python")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn fails_with(o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "succeeded: {err}");
    assert!(err.contains(want), "wanted {want:?} in: {err}");
}

#[test]
fn embeds_texts_and_file_lines_in_order_as_json_and_plain_text() {
    let bert = fixture("embed/tiny-bert");
    let b = bert.to_str().unwrap();
    let v = json(&flowrt(
        &["embed", b, "hello", "--file", "-", "--json"],
        Some("x\nA quick brown fox jumps over the lazy dog.\n"),
    ));
    assert_eq!(v["pooling"], "mean");
    assert_eq!(v["pooling_source"], "modules.json");
    assert_eq!(v["normalized"], true);
    assert_eq!(v["dimensions"], 32);
    assert_eq!(v["max_tokens"], 48);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3, "one TEXT and two lines");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        let e: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(e.len(), 32);
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    // "hello" alone is the first vector of the batch.
    let alone = json(&flowrt(&["embed", b, "hello", "--json"], None));
    assert_eq!(alone["data"][0]["embedding"], data[0]["embedding"]);
    // Plain text: one line of values per text; --no-normalize keeps the pooled scale.
    let o = flowrt(&["embed", b, "hello", "x", "--no-normalize"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let first: Vec<f64> = lines[0].split(' ').map(|x| x.parse().unwrap()).collect();
    assert_eq!(first.len(), 32);
    let norm = first.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() > 1e-3, "not normalised: {norm}");
}

#[test]
fn over_long_texts_fail_unless_truncated_and_bad_requests_are_named() {
    let bert = fixture("embed/tiny-bert");
    let b = bert.to_str().unwrap();
    let long = "word ".repeat(60);
    fails_with(&flowrt(&["embed", b, "ok", &long], None), "input 1 has");
    let v = json(&flowrt(
        &["embed", b, "ok", &long, "--truncate", "--json"],
        None,
    ));
    assert_eq!(v["data"][1]["truncated"], true);
    assert_eq!(v["data"][1]["tokens"], 48);
    assert_eq!(v["data"][0]["truncated"], false);

    fails_with(&flowrt(&["embed", b], None), "nothing to embed");
    fails_with(
        &flowrt(&["embed", b, "x", "--pooling", "max"], None),
        "unknown pooling `max`",
    );
    fails_with(
        &flowrt(&["embed", b, "x", "--batch-size", "64"], None),
        "--batch-tokens",
    );
    // A chat model declares no pooling: refused until one is named.
    let chat = fixture("families/qwen3");
    let c = chat.to_str().unwrap();
    fails_with(&flowrt(&["embed", c, "x"], None), "--pooling");
    let v = json(&flowrt(
        &["embed", c, "x", "--pooling", "last", "--json"],
        None,
    ));
    assert_eq!(v["pooling"], "last");
    assert_eq!(v["pooling_source"], "requested");
    // And the encoder cannot generate.
    fails_with(&flowrt(&["run", b, "hello", "--raw"], None), "only embeds");
}
