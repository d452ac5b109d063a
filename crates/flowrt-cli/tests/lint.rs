//! `flowrt lint` on the port shims of issue 15 (tests/fixtures/shims/, made by
//! scripts/make_port_shims.py from the tiny family fixtures) and on honest models: each shim
//! is flagged with the right explanation and its measured cost, honest models are clean, and
//! bad input is an error with exit code 2.
//!
//! The SmolLM2 tests need `FLOWRT_SMOLLM2_GGUF` and Gemma's `FLOWRT_GEMMA3_GGUF` (scripts/test
//! sets them); the shims of SmolLM2 are built by tests/shims/mod.rs (what
//! `scripts/make_port_shims.py --gguf` makes with gguf-py).

mod shims;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// `flowrt lint --json ARGS`: exit code, parsed report (Null when stdout is not JSON), stderr.
fn lint(args: &[&Path]) -> (i32, Value, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .env("FLOWRT_LOG", "off")
        .arg("lint")
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let json = serde_json::from_str(&out).unwrap_or(Value::Null);
    (
        o.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn lint_source(model: &Path, source: &Path) -> (i32, Value, String) {
    lint(&[model, Path::new("--source"), source])
}

fn findings(r: &Value) -> Vec<Value> {
    r["findings"].as_array().cloned().unwrap_or_default()
}

fn find<'a>(fs: &'a [Value], check: &str) -> &'a Value {
    fs.iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no `{check}` finding in {fs:#?}"))
}

fn checks(fs: &[Value]) -> Vec<String> {
    fs.iter()
        .map(|f| f["check"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn qwen3_relabel_shim_is_flagged_with_its_measured_kl() {
    let shim = fixture("shims/qwen3-relabel");
    let (code, r, err) = lint(&[&shim]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    let f = find(&fs, "injected-qk-norm");
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.contains("constant 1") && msg.contains("not an identity"),
        "{msg}"
    );
    let kl = f["measured"]["with_vs_without_qk_norm"]["mean_kl"]
        .as_f64()
        .unwrap();
    let top1 = f["measured"]["with_vs_without_qk_norm"]["top1_agreement"]
        .as_f64()
        .unwrap();
    assert!(kl > 1e-3, "the injected norm changes the output: KL {kl}");
    assert!(top1 < 1.0, "top-1 {top1}");
    assert!(f["cost"].as_str().unwrap().contains("mean KL"));
    let label = find(&fs, "arch-label")["message"].as_str().unwrap();
    assert!(
        label.contains("qwen3") && label.contains("relabelled"),
        "{label}"
    );

    // Against the Llama it came from: the source has no QK-norm, and running the shim without
    // its QK-norm is exactly the source (same KL against both).
    let src = fixture("families/llama-untied");
    let (code, r, err) = lint_source(&shim, &src);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    let f = find(&fs, "injected-qk-norm");
    assert!(f["message"].as_str().unwrap().contains("has no QK-norm"));
    let vs_source = f["measured"]["source_vs_model"]["mean_kl"]
        .as_f64()
        .unwrap();
    assert!(
        (vs_source - kl).abs() <= 1e-6 * kl.max(1e-12),
        "KL against the source {vs_source} vs with/without QK-norm {kl}"
    );
    let cfg = find(&fs, "config-mismatch")["message"].as_str().unwrap();
    assert!(cfg.contains("family `qwen3` (source `llama`)"), "{cfg}");
}

#[test]
fn kv_replicated_shim_reports_true_heads_and_wasted_cache() {
    let shim = fixture("shims/kv-replicated");
    let (code, r, err) = lint(&[&shim]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["replicated-kv-heads"], "{fs:#?}");
    let f = find(&fs, "replicated-kv-heads");
    let m = &f["measured"];
    assert_eq!(m["stored_kv_heads"], 8);
    assert_eq!(m["true_kv_heads"], 2);
    // 6 extra heads x head_dim 8 x 3 layers x (K, V) x 2 bytes (f16) x 128 positions.
    assert_eq!(m["wasted_kv_cache_bytes"], 6 * 8 * 3 * 2 * 2 * 128);
    assert_eq!(m["kv_cache_bytes"], 8 * 8 * 3 * 2 * 2 * 128);
    assert!(f["message"].as_str().unwrap().contains("2 true KV heads"));
    assert!(f["cost"].as_str().unwrap().contains("75%"));

    let (code, r, _) = lint_source(&shim, &fixture("families/llama-untied"));
    assert_eq!(code, 1);
    let cfg = find(&findings(&r), "config-mismatch")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(cfg.contains("num_key_value_heads 8 (source 2)"), "{cfg}");
}

#[test]
fn tied_duplicated_shim_is_flagged() {
    let (code, r, err) = lint(&[&fixture("shims/tied-duplicated")]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["duplicated-tied-embeddings"], "{fs:#?}");
    let f = find(&fs, "duplicated-tied-embeddings");
    assert!(f["message"].as_str().unwrap().contains("stored twice"));
    // 320 x 64 f32.
    assert!(f["cost"].as_str().unwrap().starts_with("80.0 KiB"), "{f:#}");
}

#[test]
fn honest_fixtures_are_clean() {
    let fam = fixture("families");
    let mut n = 0;
    for e in std::fs::read_dir(&fam).unwrap() {
        let dir = e.unwrap().path();
        if !dir.join("config.json").exists() {
            continue;
        }
        let (code, r, err) = lint(&[&dir]);
        assert_eq!(code, 0, "{}: {r:#}\n{err}", dir.display());
        assert!(findings(&r).is_empty());
        // Against itself as the source too (tokenizer, template, BOS/EOS, RoPE, config).
        let (code, r, err) = lint_source(&dir, &dir);
        assert_eq!(code, 0, "{} vs itself: {r:#}\n{err}", dir.display());
        n += 1;
    }
    assert!(n >= 9, "{n} family fixtures");
    // GGUF conversions of an HF source (llama GGUFs store Q/K permuted for adjacent pairing).
    let src = fam.join("llama-untied");
    for f in ["model-f32.gguf", "model-q4_1.gguf"] {
        let (code, r, err) = lint_source(&src.join(f), &src);
        assert_eq!(code, 0, "{f}: {r:#}\n{err}");
    }
    // Experts, routers and convolution projections are compared too: Q8_0 (and MXFP4
    // experts) of the mixture-of-experts and hybrid fixtures against their sources.
    for (family, file, compared) in [
        ("qwen3-moe", "model-q8_0.gguf", 67),
        ("gpt-oss", "model-q8_0.gguf", 118),
        ("gpt-oss", "model-mxfp4.gguf", 118),
        ("lfm2", "model-q8_0.gguf", 25),
    ] {
        let src = fam.join(family);
        let (code, r, err) = lint_source(&src.join(file), &src);
        assert_eq!(code, 0, "{family} {file}: {r:#}\n{err}");
        assert_eq!(
            r["quant_error"]["tensors_compared"], compared,
            "{family} {file}: {r:#}"
        );
    }
}

use flowrt_testkit::models::{gemma3, smollm2};

#[test]
fn smollm2_and_gemma3_are_clean() {
    for p in [smollm2(), gemma3()] {
        let (code, r, err) = lint(&[&p]);
        assert_eq!(code, 0, "{r:#}\n{err}");
        // Against itself: every quantised tensor's error is 0.
        let (code, r, err) = lint_source(&p, &p);
        assert_eq!(code, 0, "{r:#}\n{err}");
    }
}

/// Greedy text of `model` on the thread's prompt.
fn greedy(model: &Path) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .env("FLOWRT_LOG", "off")
        .arg("run")
        .arg(model)
        .args(["The capital of France is", "--raw", "--temperature", "0"])
        .args(["--max-tokens", "8"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn smollm2_port_shims_run_and_are_flagged_with_their_costs() {
    // The thread's three shims of the default model (9 query heads, 3 KV heads: replication
    // by 3, the most 9 query heads allow, where the thread's 2 KV heads took 4).
    let src = smollm2();
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    let (relabel, kv, tied) = (
        path("qwen3-relabel.gguf"),
        path("kv-replicated.gguf"),
        path("tied-duplicated.gguf"),
    );
    shims::make(&src, shims::Shim::Qwen3Relabel, &relabel);
    shims::make(&src, shims::Shim::KvReplicated(3), &kv);
    shims::make(&src, shims::Shim::TiedDuplicated, &tied);

    // They run; replicated KV heads and duplicated embeddings change nothing, the injected
    // QK-norm changes the answer (measured: " Paris.\n\nThe answer is:\n" and " 20.\n\n\n\n\n").
    let reference = greedy(&src);
    assert!(reference.contains("Paris"), "{reference:?}");
    assert_eq!(greedy(&kv), reference);
    assert_eq!(greedy(&tied), reference);
    assert_ne!(greedy(&relabel), reference);

    // Relabel: the injected norm with its measured KL (2.045 with vs without it, 2.045
    // against the source), the label, and against the source the config.
    let (code, r, err) = lint_source(&relabel, &src);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(
        checks(&fs),
        ["injected-qk-norm", "arch-label", "config-mismatch"],
        "{fs:#?}"
    );
    let f = find(&fs, "injected-qk-norm");
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.contains("all 30 layers is the constant 1") && msg.contains("has no QK-norm"),
        "{msg}"
    );
    let with_without = &f["measured"]["with_vs_without_qk_norm"];
    let kl = with_without["mean_kl"].as_f64().unwrap();
    assert!(kl > 0.5, "{f:#}");
    assert!(
        with_without["top1_agreement"].as_f64().unwrap() < 0.6,
        "{f:#}"
    );
    // Without its QK-norm the shim is the source (its Q/K rows were un-permuted for qwen3's
    // half-split RoPE), so the two KLs agree up to the pairing's rounding.
    let vs_source = f["measured"]["source_vs_model"]["mean_kl"]
        .as_f64()
        .unwrap();
    assert!((vs_source - kl).abs() < 1e-2 * kl, "{vs_source} vs {kl}");
    assert!(f["cost"].as_str().unwrap().contains("mean KL"), "{f:#}");

    // KV heads: 9 stored, 3 true; 6 wasted heads x 64 x 30 layers x (K, V) x 2 bytes x 8192.
    let (code, r, err) = lint(&[&kv]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["replicated-kv-heads"], "{fs:#?}");
    let m = &find(&fs, "replicated-kv-heads")["measured"];
    assert_eq!(m["stored_kv_heads"], 9);
    assert_eq!(m["true_kv_heads"], 3);
    assert_eq!(m["wasted_kv_cache_bytes"], 6u64 * 64 * 30 * 2 * 2 * 8192);
    let (code, r, _) = lint_source(&kv, &src);
    assert_eq!(code, 1);
    assert_eq!(
        checks(&findings(&r)),
        ["replicated-kv-heads", "config-mismatch"],
        "{r:#}"
    );

    // Tied embeddings stored twice: 49152 x 576 Q8_0 = 28.7 MiB.
    for (code, r, err) in [lint(&[&tied]), lint_source(&tied, &src)] {
        assert_eq!(code, 1, "{r:#}\n{err}");
        let fs = findings(&r);
        assert_eq!(checks(&fs), ["duplicated-tied-embeddings"], "{fs:#?}");
        let cost = find(&fs, "duplicated-tied-embeddings")["cost"]
            .as_str()
            .unwrap();
        assert!(cost.starts_with("28.7 MiB"), "{cost}");
    }
}

/// `flowrt pack SRC -o OUT --quant q8_0 --no-gate`.
fn pack_q8_0(src: &Path, out: &Path) {
    pack_as(src, out, "q8_0")
}

/// `flowrt pack SRC -o OUT --quant QUANT --no-gate`.
fn pack_as(src: &Path, out: &Path, quant: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .env("FLOWRT_LOG", "off")
        .arg("pack")
        .arg(src)
        .arg("-o")
        .arg(out)
        .args(["--quant", quant, "--no-gate"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn tensors_far_from_their_types_error_are_flagged() {
    // An honest Q8_0 pack of the HF fixture (attn_q/attn_k rows permuted for llama's
    // adjacent-pair RoPE) is clean against it: each tensor's error is what Q8_0 gives.
    let src = fixture("families/llama-untied");
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("q8_0.gguf");
    pack_q8_0(&src, &pack);
    let (code, r, err) = lint_source(&pack, &src);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert!(r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "quant-error"));

    // Its attn_q of layer 1 with every block scale doubled (Q8_0 block: f16 scale, 32 i8; one
    // more in a normal f16's exponent doubles it).
    let bytes = std::fs::read(&pack).unwrap();
    let f = flowrt_gguf::GgufFile::from_bytes(bytes.clone()).unwrap();
    let t = f.tensor("blk.1.attn_q.weight").unwrap();
    let start = (f.data_offset() + t.offset) as usize;
    let mut bad = bytes;
    for block in bad[start..start + t.size_bytes as usize].chunks_exact_mut(34) {
        let d = u16::from_le_bytes([block[0], block[1]]);
        assert!((1..30).contains(&(d >> 10 & 0x1f)), "a normal scale");
        block[..2].copy_from_slice(&(d + (1 << 10)).to_le_bytes());
    }
    let tampered = dir.path().join("tampered.gguf");
    std::fs::write(&tampered, bad).unwrap();
    let (code, r, err) = lint_source(&tampered, &src);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["quant-error"], "{fs:#?}");
    let f = find(&fs, "quant-error");
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with("1 of 23 quantised tensor(s)")
            && msg.contains("blk.1.attn_q.weight (q8_0)"),
        "{msg}"
    );
    // Doubled scales: the error is the tensor itself (relative RMS 1.000), where Q8_0 gives
    // 0.0052.
    let t = &f["measured"]["flagged"][0];
    assert_eq!(t["tensor"], "blk.1.attn_q.weight");
    let (e, typical) = (
        t["rel_rms_err"].as_f64().unwrap(),
        t["typical"].as_f64().unwrap(),
    );
    assert!(e > 0.9 && e < 1.1 && typical < 0.01, "{t}");
    // Without --source there is nothing to compare with.
    let (code, r, err) = lint(&[&tampered]);
    assert_eq!(code, 0, "{r:#}\n{err}");
}

#[test]
fn source_disagreements_are_flagged() {
    // The source's generation_config.json names another EOS, and its chat template differs.
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("families/llama-untied");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        let name = f.file_name().unwrap();
        if name.to_str().unwrap().ends_with(".gguf") {
            continue;
        }
        std::fs::copy(&f, tmp.path().join(name)).unwrap();
    }
    std::fs::write(
        tmp.path().join("generation_config.json"),
        r#"{"bos_token_id": 0, "eos_token_id": [5, 6]}"#,
    )
    .unwrap();
    let tc = tmp.path().join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&tc).unwrap()).unwrap();
    cfg["chat_template"] = Value::from("{% for m in messages %}[{{ m.content }}]{% endfor %}");
    std::fs::write(&tc, cfg.to_string()).unwrap();
    let (code, r, err) = lint_source(&src, tmp.path());
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    let s = find(&fs, "special-tokens")["message"].as_str().unwrap();
    assert!(s.contains("eos_token_id [5, 6]"), "{s}");
    find(&fs, "chat-template");
}

#[test]
fn label_without_its_tensors_is_a_finding() {
    // A Llama labelled qwen3 without even injecting the norms: the tensors contradict the label.
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("families/llama-untied");
    for name in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(name), tmp.path().join(name)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["model_type"] = Value::from("qwen3");
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let (code, r, err) = lint(&[tmp.path()]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let f = find(&findings(&r), "arch-label")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(f.contains("q_norm"), "{f}");
}

#[test]
fn bad_input_is_an_error_with_exit_2() {
    let (code, r, err) = lint(&[Path::new("/nonexistent/model.gguf")]);
    assert_eq!(code, 2, "{r:#}\n{err}");
    assert!(err.contains("no such file or directory"), "{err}");
    assert!(r["error"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/model.gguf"));
    // A missing source.
    let (code, _, err) = lint_source(
        &fixture("families/llama-tied"),
        Path::new("/nonexistent/src"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("source /nonexistent/src"), "{err}");
    // A file that is not a model.
    let (code, _, err) = lint(&[&fixture("families/README.md")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot load model"), "{err}");
}

/// The byte range of tensor `name` in a safetensors file.
fn tensor_range(bytes: &[u8], name: &str) -> std::ops::Range<usize> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let off = &header[name]["data_offsets"];
    let (a, b) = (off[0].as_u64().unwrap(), off[1].as_u64().unwrap());
    8 + n + a as usize..8 + n + b as usize
}

#[test]
fn non_finite_and_denormal_tensors_are_flagged() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("families/llama-untied");
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(name), tmp.path().join(name)).unwrap();
    }
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    // One NaN in a norm, and a fifth of a matrix subnormal.
    let norm = tensor_range(&bytes, "model.layers.0.input_layernorm.weight");
    bytes[norm.start + 12..norm.start + 16].copy_from_slice(&f32::NAN.to_le_bytes());
    let down = tensor_range(&bytes, "model.layers.1.mlp.down_proj.weight");
    let n = (down.end - down.start) / 4 / 5;
    for i in 0..n {
        let v = 1e-40f32 * (i + 1) as f32 / n as f32;
        bytes[down.start + 4 * i..down.start + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    std::fs::write(tmp.path().join("model.safetensors"), bytes).unwrap();
    let (code, r, err) = lint(&[tmp.path()]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["non-finite", "denormal-heavy"], "{fs:#?}");
    let nf = find(&fs, "non-finite")["message"].as_str().unwrap();
    assert!(nf.contains("layer 0 attn_norm: 1 NaN/Inf of 64"), "{nf}");
    let dn = find(&fs, "denormal-heavy")["message"].as_str().unwrap();
    assert!(
        dn.contains("model.layers.1.mlp.down_proj.weight: 20.0% subnormal"),
        "{dn}"
    );
}

/// `path`'s bytes, with `edit(block)` applied to blocks `which` of tensor `name` (blocks of
/// `block_bytes`), written to `out`.
fn tamper_blocks(
    path: &Path,
    name: &str,
    block_bytes: usize,
    which: &[usize],
    out: &Path,
    edit: &dyn Fn(&mut [u8]),
) {
    let bytes = std::fs::read(path).unwrap();
    let f = flowrt_gguf::GgufFile::from_bytes(bytes.clone()).unwrap();
    let t = f.tensor(name).unwrap();
    let start = (f.data_offset() + t.offset) as usize;
    let mut bad = bytes;
    let blocks: Vec<&mut [u8]> = bad[start..start + t.size_bytes as usize]
        .chunks_exact_mut(block_bytes)
        .collect();
    let n = blocks.len();
    for (i, b) in blocks.into_iter().enumerate() {
        if which.contains(&i) {
            edit(b);
        }
    }
    assert!(which.iter().all(|&i| i < n));
    std::fs::write(out, bad).unwrap();
}

/// A Q4_0 pack of the llama-untied fixture in a temporary directory: (the directory, the
/// source, the pack).
fn llama_q4_0_pack() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let src = fixture("families/llama-untied");
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("q4_0.gguf");
    pack_as(&src, &pack, "q4_0");
    (dir, src, pack)
}

#[test]
fn a_few_damaged_blocks_are_flagged_though_the_tensor_average_hides_them() {
    // A Q4_0 pack (block: f16 scale + 16 bytes of nibbles) with 2 of blk.1.attn_q's 256 blocks
    // zeroed: the tensor's relative RMS error moves from Q4_0's ~0.1 to ~0.13, under the
    // tensor-wide 3x bound, but each zeroed block is wholly wrong (relative error 1).
    let (dir, src, pack) = llama_q4_0_pack();
    let (code, r, err) = lint_source(&pack, &src);
    assert_eq!(
        code, 0,
        "an honest pack is clean, block by block: {r:#}\n{err}"
    );
    let tampered = dir.path().join("zeroed.gguf");
    tamper_blocks(
        &pack,
        "blk.1.attn_q.weight",
        18,
        &[5, 77],
        &tampered,
        &|b| b.fill(0),
    );
    let (code, r, err) = lint_source(&tampered, &src);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    // Zeroed blocks among non-zero rows and columns are out of line without the source too.
    assert_eq!(checks(&fs), ["damaged-blocks", "quant-error"], "{fs:#?}");
    let t = &find(&fs, "quant-error")["measured"]["flagged"][0];
    assert_eq!(t["tensor"], "blk.1.attn_q.weight", "{t}");
    assert!(
        t["ratio"].as_f64().unwrap() < 3.0,
        "the average hides it: {t}"
    );
    assert_eq!(t["bad_blocks"], 2, "{t}");
    assert_eq!(t["blocks"], 256, "{t}");
    let w = &t["worst_block"];
    let rel = w["rel_err"].as_f64().unwrap();
    assert!((rel - 1.0).abs() < 1e-6, "a zeroed block is all error: {w}");
    assert!(w["typical"].as_f64().unwrap() < 0.25, "{w}");
    let msg = find(&fs, "quant-error")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("2 of 256 blocks far from the source"), "{msg}");
}

#[test]
fn a_damaged_expert_is_flagged() {
    // Expert 3 of layer 0 of the Q8_0 Qwen3-MoE fixture (34-byte blocks), one block zeroed.
    let src = fixture("families/qwen3-moe");
    let dir = tempfile::tempdir().unwrap();
    let f = flowrt_gguf::GgufFile::open(src.join("model-q8_0.gguf")).unwrap();
    let t = f.tensor("blk.0.ffn_up_exps.weight").unwrap();
    let per_expert = t.size_bytes as usize / 34 / t.dims[2] as usize;
    let tampered = dir.path().join("expert.gguf");
    tamper_blocks(
        &src.join("model-q8_0.gguf"),
        "blk.0.ffn_up_exps.weight",
        34,
        &[3 * per_expert + 1],
        &tampered,
        &|b| b.fill(0),
    );
    let (code, r, err) = lint_source(&tampered, &src);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["damaged-blocks", "quant-error"], "{fs:#?}");
    let t = &find(&fs, "quant-error")["measured"]["flagged"][0];
    assert_eq!(t["tensor"], "blk.0.ffn_up_exps.weight[3]", "{t}");
    assert_eq!(t["bad_blocks"], 1, "{t}");
}

#[test]
fn non_finite_quantised_blocks_are_flagged_without_a_source() {
    // One Q4_0 block of blk.0.ffn_down with a NaN scale (f16 0x7e00): its 32 values are NaN.
    let (dir, _, pack) = llama_q4_0_pack();
    let (code, r, err) = lint(&[&pack]);
    assert_eq!(code, 0, "{r:#}\n{err}");
    let tampered = dir.path().join("nan.gguf");
    tamper_blocks(&pack, "blk.0.ffn_down.weight", 18, &[3], &tampered, &|b| {
        b[..2].copy_from_slice(&0x7e00u16.to_le_bytes())
    });
    let (code, r, err) = lint(&[&tampered]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["non-finite"], "{fs:#?}");
    let msg = find(&fs, "non-finite")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("blk.0.ffn_down.weight: 32 NaN/Inf of 8192"),
        "{msg}"
    );
}

#[test]
fn blocks_out_of_line_are_flagged_without_a_source() {
    // A Q4_0 pack of the llama-untied fixture: one block of blk.0.ffn_down (128 columns: 4
    // blocks a row) with its f16 scale's exponent raised by 8 (x256, as a flipped exponent
    // bit does), one of blk.1.attn_v zeroed. Neither is NaN; without a source only their
    // magnitude against their rows and columns gives them away.
    let (dir, _, pack) = llama_q4_0_pack();
    let (code, r, err) = lint(&[&pack]);
    assert_eq!(code, 0, "an honest pack is clean: {r:#}\n{err}");
    let b = &r["block_outliers"];
    assert!(b["tensors"].as_u64().unwrap() > 10, "{b}");
    let bound = b["ratio_bound"].as_f64().unwrap();
    assert!(b["max_up_ratio"].as_f64().unwrap() < bound, "{b}");
    assert!(b["max_down_ratio"].as_f64().unwrap() < bound, "{b}");
    let scaled = dir.path().join("scaled.gguf");
    tamper_blocks(&pack, "blk.0.ffn_down.weight", 18, &[9], &scaled, &|b| {
        let d = u16::from_le_bytes([b[0], b[1]]);
        b[..2].copy_from_slice(&(d + (8 << 10)).to_le_bytes())
    });
    let both = dir.path().join("both.gguf");
    tamper_blocks(&scaled, "blk.1.attn_v.weight", 18, &[4], &both, &|b| {
        b.fill(0)
    });
    let (code, r, err) = lint(&[&both]);
    assert_eq!(code, 1, "{r:#}\n{err}");
    let fs = findings(&r);
    assert_eq!(checks(&fs), ["damaged-blocks"], "{fs:#?}");
    let f = find(&fs, "damaged-blocks");
    let ts = f["measured"]["tensors"].as_array().unwrap();
    let names: Vec<&str> = ts.iter().map(|t| t["tensor"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["blk.0.ffn_down.weight", "blk.1.attn_v.weight"],
        "{f}"
    );
    let (up, down) = (&ts[0]["outliers"], &ts[1]["outliers"]);
    assert_eq!(
        (&up["blown_up"], &up["shrunk"]),
        (&1.into(), &0.into()),
        "{up}"
    );
    assert_eq!(
        (&down["blown_up"], &down["shrunk"]),
        (&0.into(), &1.into()),
        "{down}"
    );
    // Block 9 of 4-block rows: row 2, block 1.
    assert_eq!(
        (&up["worst"]["row"], &up["worst"]["block"]),
        (&2.into(), &1.into()),
        "{up}"
    );
    let msg = f["message"].as_str().unwrap();
    assert!(msg.contains("blk.0.ffn_down.weight: 1 of"), "{msg}");
}
