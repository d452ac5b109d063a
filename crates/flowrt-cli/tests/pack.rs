//! `flowrt pack`: requantise GGUF files, the gate, atomic output and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn flowrt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flowrt"));
    c.env("FLOWRT_LOG", "off");
    c
}

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn partial(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// The gate's figures from pack's report: (top-1 fraction, mean KL).
fn gate_figures(out: &str) -> (f64, f64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("gate:") && l.contains("positions"))
        .unwrap_or_else(|| panic!("no gate line in {out}"));
    let after = |key: &str| -> f64 {
        let s = &line[line.find(key).unwrap() + key.len()..];
        let tok: String = s
            .trim_start()
            .chars()
            .take_while(|c| !matches!(c, ',' | '%' | ' ' | '('))
            .collect();
        tok.parse().unwrap()
    };
    (after("top-1 ") / 100.0, after("mean KL "))
}

fn greedy(model: &Path) -> String {
    let o = flowrt()
        .args([
            "run",
            model.to_str().unwrap(),
            "Once upon a time",
            "--raw",
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--ignore-eos",
        ])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "run failed: {out}\n{err}");
    out
}

fn pack(src: &Path, out: &Path, quant: &str, extra: &[&str]) -> Output {
    flowrt()
        .args(["pack", src.to_str().unwrap(), "-o"])
        .arg(out)
        .args(["--quant", quant])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn packs_the_llama_hf_fixture_to_every_type_within_the_gate() {
    let src = fixture("families/llama-untied");
    let dir = tempfile::tempdir().unwrap();
    let reference = greedy(&src);
    for quant in [
        "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_1", "Q4_0",
    ] {
        let out = dir.path().join(format!("m-{quant}.gguf"));
        let o = pack(&src, &out, quant, &[]);
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{quant}: {stdout}\n{stderr}");
        assert!(stdout.contains("gate:      passed"), "{quant}: {stdout}");
        assert!(out.is_file() && !partial(&out).exists(), "{quant}");
        let (top1, kl) = gate_figures(&stdout);
        eprintln!("{quant}: top-1 {top1:.4} mean KL {kl:.3e}");
        if matches!(quant, "F32" | "F16") {
            assert_eq!(greedy(&out), reference, "{quant}: greedy tokens differ");
        }
        if quant == "F32" {
            assert!(kl < 1e-6 && top1 == 1.0, "F32 is lossless: {stdout}");
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name.to_string_lossy().ends_with(".gguf") || name.to_string_lossy().starts_with("ref") {
            continue;
        }
        std::fs::copy(e.path(), to.join(name)).unwrap();
    }
}

#[test]
fn packs_the_tied_fixture_and_requantises_a_gguf() {
    let dir = tempfile::tempdir().unwrap();
    for (src, quant) in [
        (fixture("families/llama-tied"), "Q8_0"),
        (fixture("families/llama-untied/model-f32.gguf"), "Q4_K"),
    ] {
        let out = dir.path().join("m.gguf");
        let o = pack(&src, &out, quant, &[]);
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{src:?} {quant}: {stdout}\n{stderr}");
        let (top1, kl) = gate_figures(&stdout);
        eprintln!("{src:?} {quant}: top-1 {top1:.4} mean KL {kl:.3e}");
        greedy(&out);
    }
}

#[test]
fn a_gate_miss_exits_1_and_leaves_nothing() {
    let src = fixture("families/llama-untied");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let o = pack(&src, &out, "Q4_0", &["--max-mean-kl", "0"]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("pack refused"), "{stderr}");
    assert!(!out.exists() && !partial(&out).exists());
    // --no-gate keeps it, and says the gate was skipped.
    let o = pack(&src, &out, "Q4_0", &["--max-mean-kl", "0", "--no-gate"]);
    let (stdout, _) = text(&o);
    assert!(
        o.status.success() && stdout.contains("skipped (--no-gate)"),
        "{stdout}"
    );
    assert!(out.is_file());
}

#[test]
fn bad_input_is_a_clear_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let o = pack(&dir.path().join("nope.gguf"), &out, "Q8_0", &[]);
    let (_, stderr) = text(&o);
    assert!(
        !o.status.success() && stderr.contains("cannot open source"),
        "{stderr}"
    );
    let src = fixture("families/llama-untied/model-f32.gguf");
    let o = pack(&src, &out, "Q3_K", &[]);
    let (_, stderr) = text(&o);
    assert!(
        !o.status.success() && stderr.contains("not a type pack writes"),
        "{stderr}"
    );
    let o = pack(&fixture("families/qwen2"), &out, "Q8_0", &[]);
    let (_, stderr) = text(&o);
    assert!(
        !o.status.success() && stderr.contains("only the llama family"),
        "{stderr}"
    );
    // A tensor of a dtype pack does not read (model.norm.weight relabelled I32).
    let bad = dir.path().join("bad-dtype");
    copy_dir(&fixture("families/llama-untied"), &bad);
    let st = std::fs::read(bad.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&st[8..8 + n]).unwrap();
    header["model.norm.weight"]["dtype"] = "I32".into();
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(n, b' ');
    let mut st2 = st[..8].to_vec();
    st2.extend_from_slice(&h);
    st2.extend_from_slice(&st[8 + n..]);
    std::fs::write(bad.join("model.safetensors"), st2).unwrap();
    let o = pack(&bad, &out, "Q8_0", &[]);
    let (_, stderr) = text(&o);
    assert!(
        !o.status.success() && stderr.contains("cannot read dtype I32"),
        "{stderr}"
    );
    // A missing shard.
    let shards = dir.path().join("missing-shard");
    copy_dir(&fixture("families/llama-untied"), &shards);
    std::fs::remove_file(shards.join("model.safetensors")).unwrap();
    std::fs::write(
        shards.join("model.safetensors.index.json"),
        r#"{"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let o = pack(&shards, &out, "Q8_0", &[]);
    let (_, stderr) = text(&o);
    assert!(
        !o.status.success() && stderr.contains("model-00001-of-00002"),
        "{stderr}"
    );
    // An output directory that does not exist: no file anywhere.
    let bad_out = dir.path().join("missing/m.gguf");
    let o = pack(&src, &bad_out, "Q8_0", &[]);
    assert!(!o.status.success());
    assert!(!out.exists() && !partial(&out).exists() && !bad_out.exists());
}

#[test]
fn help_states_the_mix_and_the_bounds() {
    let o = flowrt().args(["pack", "--help"]).output().unwrap();
    let (stdout, _) = text(&o);
    assert!(o.status.success());
    for s in [
        "Q4_K_M-like",
        "attn_v",
        "ffn_down",
        "falls back",
        "Gate defaults",
    ] {
        assert!(stdout.contains(s), "`{s}` missing from --help: {stdout}");
    }
}

#[test]
fn requantises_smollm2_to_q8_0() {
    let Some(src) = std::env::var_os("FLOWRT_SMOLLM2_GGUF").map(PathBuf::from) else {
        eprintln!("FLOWRT_SMOLLM2_GGUF not set: skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2-q8_0.gguf");
    let o = pack(&src, &out, "Q8_0", &[]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let (top1, kl) = gate_figures(&stdout);
    eprintln!("SmolLM2 Q4_1 -> Q8_0: top-1 {top1:.4} mean KL {kl:.3e}\n{stdout}");
    assert!(top1 >= 0.9 && kl <= 1e-2, "{stdout}");
}

#[test]
fn ctrl_c_midway_leaves_nothing() {
    let Some(src) = std::env::var_os("FLOWRT_SMOLLM2_GGUF").map(PathBuf::from) else {
        eprintln!("FLOWRT_SMOLLM2_GGUF not set: skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let child = flowrt()
        .args(["pack", src.to_str().unwrap(), "-o"])
        .arg(&out)
        .args(["--quant", "Q8_0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once writing has started (the partial file, or the output being gated).
    let t0 = std::time::Instant::now();
    while !partial(&out).exists() && !out.exists() {
        assert!(t0.elapsed().as_secs() < 60, "pack never started writing");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!out.exists() && !partial(&out).exists());
}
