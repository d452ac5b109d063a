//! The `flowrt` binary, driven as a user would: acceptance commands and bad input.
//!
//! Needs `FLOWRT_HOME` holding the default model (scripts/test fetches it) and
//! `FLOWRT_SMOLLM2_GGUF` pointing at it.

use flowrt_testkit::golden::{self, Agreement, Bounds};
use std::path::PathBuf;
use std::process::{Command, Output};

fn flowrt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flowrt"));
    c.env("FLOWRT_LOG", "off");
    c
}

fn model() -> PathBuf {
    flowrt_testkit::models::smollm2()
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

/// Runs `flowrt ARGS`, checks that it succeeded, and returns its stdout.
fn ok(args: &[&str]) -> String {
    let o = flowrt().args(args).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{args:?} failed: {out}\n{err}");
    out
}

/// Runs and checks that the process failed cleanly: non-zero exit, an `error:` line naming
/// the problem, and no panic.
fn fails_with(args: &[&str], needle: &str) {
    let o = flowrt().args(args).output().unwrap();
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{args:?} succeeded: {out}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: stderr lacks {needle:?}: {err}"
    );
}

/// Issue 2 acceptance: `flowrt run smollm2:135m "The capital of France is" --raw --temperature 0 --max-tokens 8` says Paris.
#[test]
fn run_default_tag_says_paris() {
    assert!(
        std::env::var_os("FLOWRT_HOME").is_some(),
        "FLOWRT_HOME must name the model store holding smollm2:135m (scripts/test sets it)"
    );
    let out = ok(&[
        "run",
        "smollm2:135m",
        "The capital of France is",
        "--raw",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--no-fetch",
    ]);
    assert!(out.contains("Paris"), "answer: {out:?}");
}

#[test]
fn chat_answers_with_the_template() {
    let m = model();
    let out = ok(&[
        "run",
        m.to_str().unwrap(),
        "What is the capital of France?",
        "--temperature",
        "0",
        "--max-tokens",
        "24",
    ]);
    assert!(out.contains("Paris"), "answer: {out:?}");
    assert!(
        !out.contains("<|im_end|>") && !out.contains("<|im_start|>"),
        "{out:?}"
    );
}

#[test]
fn interactive_chat_keeps_the_conversation() {
    use std::io::Write;
    let m = model();
    let mut child = flowrt()
        .args([
            "run",
            m.to_str().unwrap(),
            "--temperature",
            "0",
            "--max-tokens",
            "16",
            "--stats",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\nAnd of Germany?\n/exit\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("[prompt ").count(), 2, "two answers: {err}");
    // The second turn reuses the cache of the first.
    let second = err
        .lines()
        .filter(|l| l.starts_with("[prompt "))
        .nth(1)
        .unwrap();
    assert!(!second.contains("(0 reused)"), "{second}");
    assert!(out.contains("Paris"), "{out}");
}

/// `flowrt verify --json` on the committed reference, as an [`Agreement`], and the kernel
/// table it ran.
fn verify_json(m: &std::path::Path, extra: &[&str]) -> (Agreement, String) {
    let r = fixture("ref/smollm2-q4_1.safetensors");
    let mut args = vec![
        "verify",
        m.to_str().unwrap(),
        "--reference",
        r.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let v: serde_json::Value = serde_json::from_str(ok(&args).trim()).unwrap();
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing or not a number: {v}"))
    };
    let a = Agreement {
        positions: f("positions") as usize,
        top1: f("top1_agreement"),
        mean_kl: f("mean_kl"),
        max_kl: f("max_kl"),
        max_abs_logit_err: f("max_abs_logit_err"),
    };
    (a, v["kernels"].as_str().unwrap_or_default().to_string())
}

/// The default path through the CLI, bounded as in the engine's golden test
/// (crates/flowrt-engine/tests/smollm2.rs, where the measured figures are): top-1 100 %, mean
/// KL 5.2e-6, max KL 3.5e-5, max |logit err| 0.044.
const SMOLLM2_DEFAULT: Bounds = Bounds {
    positions: 212,
    min_top1: 1.0,
    max_mean_kl: 1e-5,
    max_max_kl: 1e-4,
    max_abs_logit_err: 0.1,
};

#[test]
fn verify_json_and_bounds() {
    let m = model();
    let (a, kernels) = verify_json(&m, &["--min-top1", "1", "--max-mean-kl", "1e-5"]);
    golden::check(
        &format!("flowrt verify smollm2 ({kernels})"),
        &a,
        &SMOLLM2_DEFAULT,
    );

    // An impossible bound exits 1.
    let r = fixture("ref/smollm2-q4_1.safetensors");
    let o = flowrt()
        .args([
            "verify",
            m.to_str().unwrap(),
            "--reference",
            r.to_str().unwrap(),
            "--max-mean-kl",
            "1e-12",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(text(&o).1.contains("exceeds --max-mean-kl"));
}

#[test]
fn bench_reports_what_ran() {
    let m = model();
    let out = ok(&[
        "bench",
        m.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "8",
        "-r",
        "2",
        "--json",
        "-t",
        "2",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for k in ["prefill_tok_s", "ttft_ms", "decode_tok_s"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {v}");
    }
    assert_eq!(v["threads"], 2);
    // The device, as the backend reports it: the CPU, shared host memory, repacked weights.
    assert_eq!(v["backend"], "cpu", "{v}");
    assert!(v["device"].as_str().is_some_and(|d| !d.is_empty()), "{v}");
    assert!(
        v["driver"].is_null() && v["device_memory_bytes"].is_null(),
        "{v}"
    );
    assert!(
        v["prepared_weight_bytes"].as_f64().is_some_and(|x| x > 0.0),
        "{v}"
    );
    assert_eq!(v["model"], m.display().to_string());
    assert_eq!(
        v["model_sha256"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    // Issue 6: load time, memory and the decode roofline (sane, not fast).
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing or not a number: {v}"))
    };
    assert!(f("load_to_ready_ms") > 0.0 && f("load_to_ready_ms") >= f("load_ms"));
    if cfg!(target_os = "linux") {
        let (rss, peak) = (f("rss_after_load_bytes"), f("peak_rss_bytes"));
        assert!(rss > 0.0 && peak >= rss, "{v}");
        assert!(f("peak_rss_over_weights_kv") > 0.0, "{v}");
    }
    assert!(f("weights_bytes") > 0.0 && f("kv_cache_bytes") > 0.0, "{v}");
    // A decode step reads each matrix once and one embedding row, never more than all.
    assert!(f("weight_bytes_per_token") <= f("weights_bytes"), "{v}");
    for k in [
        "read_bandwidth_gb_s",
        "decode_weight_gb_s",
        "decode_roofline_pct",
    ] {
        assert!(f(k).is_finite() && f(k) > 0.0, "{k}: {v}");
    }
    // The derived figures are what their definitions say, not just positive numbers.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()) + 1e-9;
    let gb_s = f("weight_bytes_per_token") * f("decode_tok_s") / 1e9;
    assert!(
        close(f("decode_weight_gb_s"), gb_s),
        "decode_weight_gb_s != {gb_s}: {v}"
    );
    let pct = 100.0 * f("decode_weight_gb_s") / f("read_bandwidth_gb_s");
    assert!(
        close(f("decode_roofline_pct"), pct),
        "decode_roofline_pct != {pct}: {v}"
    );
    if cfg!(target_os = "linux") {
        let ratio = f("peak_rss_bytes") / (f("weights_bytes") + f("kv_cache_bytes"));
        assert!(close(f("peak_rss_over_weights_kv"), ratio), "{ratio}: {v}");
    }
    // SmolLM2 Q4_1 holds 96.6 MB of weights (measured; the file is 98.4 MB with its
    // metadata), and a decode token reads at least the matrices of its 30 layers, most of it.
    let w = f("weights_bytes");
    assert!((90e6..=98.4e6).contains(&w), "weights_bytes {w}: {v}");
    assert!(f("weight_bytes_per_token") >= 0.5 * w, "{v}");
    // One prefill of 16 tokens takes no less than a decode step of one token.
    assert!(f("ttft_ms") >= 1000.0 / f("decode_tok_s") * 0.5, "{v}");
    // A host's read bandwidth is between a slow laptop's and a GPU's.
    assert!((0.5..=2000.0).contains(&f("read_bandwidth_gb_s")), "{v}");
}

#[test]
fn bench_parallel_reports_memory_and_skips_bandwidth_when_asked() {
    let m = model();
    let out = ok(&[
        "bench",
        m.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--parallel",
        "2",
        "--json",
        "-t",
        "2",
        "--no-bandwidth",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["aggregate_decode_tok_s"]
        .as_f64()
        .is_some_and(|x| x > 0.0));
    assert!(v["aggregate_prefill_tok_s"]
        .as_f64()
        .is_some_and(|x| x.is_finite() && x > 0.0));
    if cfg!(target_os = "linux") {
        assert!(v["peak_rss_bytes"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    }
    assert!(v["kv_cache_bytes"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(v["read_bandwidth_gb_s"].is_null(), "{v}");
    assert!(v["decode_roofline_pct"].is_null(), "{v}");
}

/// The scalar reference table is selectable from the CLI, really runs (verify reports it), and
/// agrees with the default table: within the default path's golden bounds (measured: mean KL
/// 5.19e-6, max KL 3.52e-5, max |logit err| 0.037), and the same greedy text.
#[test]
fn scalar_kernels_are_selectable_and_agree() {
    let m = model();
    let (a, kernels) = verify_json(&m, &["--kernels", "scalar"]);
    assert_eq!(kernels, "scalar");
    golden::check("flowrt verify smollm2 (scalar)", &a, &SMOLLM2_DEFAULT);
    let greedy = |extra: &[&str]| {
        let mut args = vec![
            "run",
            m.to_str().unwrap(),
            "The capital of France is",
            "--raw",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
        ];
        args.extend_from_slice(extra);
        ok(&args)
    };
    let scalar = greedy(&["--kernels", "scalar"]);
    assert!(scalar.contains("Paris"), "{scalar}");
    assert_eq!(scalar, greedy(&[]), "scalar and default greedy text differ");
    fails_with(
        &["run", m.to_str().unwrap(), "hi", "--kernels", "sse9"],
        "sse9",
    );
}

#[test]
fn bad_input_gets_clear_errors() {
    let m = model();
    let m = m.to_str().unwrap();
    fails_with(
        &["run", "/nonexistent/model.gguf", "hi"],
        "/nonexistent/model.gguf",
    );
    fails_with(&["run", "nosuchmodel:7b", "hi"], "smollm2:135m");
    fails_with(&["run", m, "hi", "--temperature=-1"], "temperature");
    fails_with(&["run", m, "hi", "--top-p", "0"], "top_p");
    fails_with(&["run", m, "hi", "--threads", "0"], "--threads");
    fails_with(&["run", m, "hi", "--ctx-len", "0"], "context length");
    fails_with(
        &["run", m, &"word ".repeat(100), "--raw", "--ctx-len", "32"],
        "does not fit the context of 32",
    );
    fails_with(
        &["verify", m, "--reference", "/nonexistent.safetensors"],
        "/nonexistent.safetensors",
    );
    fails_with(&["bench", m, "-p", "0"], "-p");

    // Hostile and damaged model files.
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(m).unwrap();
    let trunc = dir.path().join("truncated.gguf");
    std::fs::write(&trunc, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(
        &["run", trunc.to_str().unwrap(), "hi", "--no-fetch"],
        "truncated.gguf",
    );
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"not a gguf file at all").unwrap();
    fails_with(&["run", garbage.to_str().unwrap(), "hi"], "magic");
    let bad_ref = dir.path().join("bad.safetensors");
    // A valid, empty safetensors file: an 8-byte header `{}` padded with spaces.
    std::fs::write(&bad_ref, b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ").unwrap();
    fails_with(
        &["verify", m, "--reference", bad_ref.to_str().unwrap()],
        "prompt.0.input_ids",
    );
}

/// `flowrt plan` shows the groups and the runlists the dispatcher will submit.
#[test]
fn plan_shows_groups_and_runlists() {
    let dir = fixture("families/llama-42l");
    let d = dir.to_str().unwrap();
    let out = ok(&["plan", d, "--max-runlist-layers", "21"]);
    assert!(
        out.contains("2 runlist(s) per step, at most 21 layers each"),
        "{out}"
    );
    assert!(
        out.contains("layers 0–20") && out.contains("layers 21–41"),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&["plan", d, "--json"])).unwrap();
    assert_eq!(v["layers"], 42);
    assert_eq!(v["runlists"].as_array().unwrap().len(), 1);
    // Embedding, two groups per layer, output.
    assert_eq!(v["groups"].as_array().unwrap().len(), 86);
    assert_eq!(v["groups"][1]["ops"][1], "matmul_q");
    fails_with(&["plan", d, "--max-runlist-layers", "0"], "at least 1");
}

/// `--trace` writes Chrome trace JSON with runlist and op spans.
#[test]
fn run_writes_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    let m = fixture("families/llama-tied");
    ok(&[
        "run",
        m.to_str().unwrap(),
        "hello there",
        "--raw",
        "--temperature",
        "0",
        "--max-tokens",
        "3",
        "--ignore-eos",
        "--max-runlist-layers",
        "1",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let runlists = ev.iter().filter(|e| e["cat"] == "runlist").count();
    // Two layers, one runlist each; a prefill step and at least two decode steps.
    assert!(
        runlists >= 6 && runlists % 2 == 0,
        "{runlists} runlist spans"
    );
    assert!(ev
        .iter()
        .any(|e| e["name"] == "attention" && e["cat"] == "op"));
}

/// A Hugging Face checkpoint directory runs like a GGUF file, also quantised on load.
#[test]
fn hf_directory_runs_and_quantises_on_load() {
    let m = fixture("families/qwen3");
    let m = m.to_str().unwrap();
    let plain = ok(&[
        "run",
        m,
        "abc",
        "--raw",
        "--temperature",
        "0",
        "-n",
        "4",
        "--ignore-eos",
    ]);
    assert!(!plain.is_empty());
    ok(&[
        "run",
        m,
        "abc",
        "--raw",
        "--temperature",
        "0",
        "-n",
        "4",
        "--quant",
        "q8_0",
    ]);
    fails_with(
        &["run", m, "abc", "--quant", "q3_k"],
        "cannot quantise to `q3_k`",
    );
    fails_with(
        &["run", model().to_str().unwrap(), "abc", "--quant", "q4_0"],
        "applies to Hugging Face directories",
    );
}

/// Options `serve` does not implement are refused, not silently ignored (a trace that nothing
/// writes would only grow).
#[test]
fn serve_refuses_options_it_does_not_implement() {
    let m = model();
    let m = m.to_str().unwrap();
    fails_with(
        &["serve", m, "--trace", "t.json"],
        "--trace is not supported by serve",
    );
    fails_with(
        &["serve", m, "--quant", "q8_0"],
        "--quant is not supported by serve",
    );
}

/// `--backend` takes cpu, vulkan or auto; anything else is a usage error listing them.
#[test]
fn backend_flag_parses_and_bad_names_are_refused() {
    let m = fixture("families/llama-tied");
    let m = m.to_str().unwrap();
    let o = flowrt()
        .args(["run", m, "hi", "--backend", "cuda"])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    for word in ["`cuda`", "cpu", "vulkan", "auto"] {
        assert!(err.contains(word), "stderr lacks {word}: {err}");
    }
    fails_with(&["run", m, "hi", "--backend", "CPU"], "unknown backend");
    fails_with(&["run", m, "hi", "--backend"], "--backend");
    let args = [
        "run",
        m,
        "hello",
        "--raw",
        "--temperature",
        "0",
        "--max-tokens",
        "3",
        "--ignore-eos",
    ];
    let cpu = ok(&args);
    let mut explicit = args.to_vec();
    explicit.extend(["--backend", "cpu", "--device", "0"]);
    assert_eq!(
        ok(&explicit),
        cpu,
        "--backend cpu --device 0 is the default"
    );
    fails_with(
        &["run", m, "hi", "--device", "3"],
        "cpu backend: device 3 does not exist",
    );
    let help = ok(&["run", "--help"]);
    assert!(
        help.contains("--backend") && help.contains("--device") && help.contains("real GPU"),
        "{help}"
    );
}

/// CPU-only flags reach the CPU as its settings; given to another backend they are refused by
/// it, naming the setting, and an unknown value is refused by the CPU naming flag and value.
#[test]
fn cpu_flags_are_backend_settings() {
    let m = fixture("families/llama-tied");
    let m = m.to_str().unwrap();
    for (flag, setting) in [
        (&["--kernels", "scalar"][..], "`kernels`"),
        (&["--act-quant", "q8"][..], "`act-quant`"),
        (&["--no-repack"][..], "`repack`"),
        (&["--no-attn-split"][..], "`attn-split`"),
    ] {
        let mut args = vec!["run", m, "hi", "--backend", "vulkan"];
        args.extend_from_slice(flag);
        fails_with(&args, "vulkan backend");
        fails_with(&args, setting);
    }
    fails_with(
        &["run", m, "hi", "--act-quant", "q4"],
        "cpu backend: setting `act-quant=q4`",
    );
}

/// `flowrt devices` lists the CPU, and Vulkan's devices or why it has none.
#[test]
fn devices_lists_the_cpu_and_vulkan() {
    let out = ok(&["devices"]);
    assert!(out.starts_with("cpu (--backend cpu)"), "{out}");
    assert!(out.contains("vulkan (--backend vulkan"), "{out}");
    assert!(out.contains("--backend auto picks: "), "{out}");
    let v: serde_json::Value = serde_json::from_str(ok(&["devices", "--json"]).trim()).unwrap();
    let cpu = &v["cpu"];
    assert!(cpu["name"].as_str().is_some_and(|n| !n.is_empty()), "{v}");
    assert!(out.contains(cpu["name"].as_str().unwrap()), "{out}");
    assert!(cpu["threads"].as_u64().is_some_and(|t| t >= 1), "{v}");
    let sets = cpu["kernel_sets"].as_array().unwrap();
    assert!(
        sets.iter().any(|k| k == "scalar") && sets.contains(&cpu["kernels"]),
        "{v}"
    );
    // Either devices or the reason there are none, and that reason printed.
    let devices = v["vulkan"]["devices"].as_array().unwrap();
    match v["vulkan"]["error"].as_str() {
        Some(why) => {
            assert!(devices.is_empty() && !why.is_empty(), "{v}");
            assert!(out.contains(&format!("no device: {why}")), "{out}");
        }
        None => {
            assert!(!devices.is_empty(), "{v}");
            for d in devices {
                assert!(out.contains(d["name"].as_str().unwrap()), "{out}");
            }
        }
    }
    let gpu = devices.iter().any(|d| d["gpu"] == true);
    assert_eq!(v["auto"], if gpu { "vulkan" } else { "cpu" }, "{v}");
}

/// Without a Vulkan driver (the loader pointed at no driver file), `--backend vulkan` fails
/// with an error saying there is no device and what to do, and `devices` says why; the CPU
/// still runs.
#[test]
fn without_a_vulkan_driver_the_errors_say_so() {
    let m = fixture("families/llama-tied");
    let m = m.to_str().unwrap();
    let no_driver = |args: &[&str]| {
        flowrt()
            .args(args)
            .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
            .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
            .output()
            .unwrap()
    };
    let o = no_driver(&[
        "run",
        m,
        "hi",
        "--raw",
        "--max-tokens",
        "1",
        "--backend",
        "vulkan",
    ]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && !err.contains("panicked"), "{err}");
    assert!(
        err.contains("no Vulkan device is available") && err.contains("--backend cpu"),
        "{err}"
    );
    let o = no_driver(&["devices"]);
    let (out, _) = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("no device:") && out.contains("--backend auto picks: cpu"),
        "{out}"
    );
    let o = no_driver(&[
        "run",
        m,
        "hi",
        "--raw",
        "--max-tokens",
        "1",
        "--backend",
        "auto",
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
}

/// `flowrt run --json-schema FILE` prints only a complete answer that follows the schema;
/// `--json` any JSON object; a bad schema file is an error naming the problem.
#[test]
fn run_json_schema_prints_conforming_json() {
    let m = model();
    let m = m.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "population": {"type": "integer", "minimum": 0},
                           "size": {"enum": ["small", "medium", "large"]}},
            "required": ["city", "population", "size"],
            "additionalProperties": false}"#,
    )
    .unwrap();
    for seed in ["1", "2"] {
        let out = ok(&[
            "run",
            m,
            "Describe Paris as JSON.",
            "--json-schema",
            schema.to_str().unwrap(),
            "--temperature",
            "1",
            "--seed",
            seed,
            "--max-tokens",
            "200",
        ]);
        let v: serde_json::Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"));
        let o = v.as_object().unwrap();
        let mut keys: Vec<_> = o.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["city", "population", "size"], "{out}");
        assert!(o["city"].as_str().unwrap().chars().count() <= 20, "{out}");
        assert!(o["population"].as_u64().is_some(), "{out}");
        assert!(
            ["small", "medium", "large"].contains(&o["size"].as_str().unwrap()),
            "{out}"
        );
    }
    let out = ok(&["run", m, "Say hi as JSON.", "--json", "--temperature", "0"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v.is_object(), "{out}");

    // Too few tokens to finish: an error, nothing printed as if complete.
    let o = flowrt()
        .args([
            "run",
            m,
            "Describe Paris as JSON.",
            "--json-schema",
            schema.to_str().unwrap(),
            "--max-tokens",
            "3",
        ])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.trim().is_empty(), "{out}");
    assert!(err.contains("not complete after 3 tokens"), "{err}");

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"type\": \"object\",").unwrap();
    fails_with(
        &["run", m, "hi", "--json-schema", bad.to_str().unwrap()],
        "bad.json: not valid JSON",
    );
    std::fs::write(&bad, r#"{"type": "array", "uniqueItems": true}"#).unwrap();
    fails_with(
        &["run", m, "hi", "--json-schema", bad.to_str().unwrap()],
        "unsupported keyword(s): uniqueItems",
    );
    std::fs::write(&bad, r#"{"type": "array", "minItems": "two"}"#).unwrap();
    fails_with(
        &["run", m, "hi", "--json-schema", bad.to_str().unwrap()],
        "invalid JSON schema",
    );
    fails_with(
        &["run", m, "hi", "--json-schema", "/nonexistent/schema.json"],
        "/nonexistent/schema.json",
    );
}

#[test]
fn run_grammar_and_regex_print_conforming_answers() {
    let m = model();
    let m = m.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let grammar = dir.path().join("answer.lark");
    std::fs::write(
        &grammar,
        "start: \"Answer: \" color \" \" NUMBER\ncolor: \"red\" | \"green\" | \"blue\"\nNUMBER: /[1-9][0-9]?/\n",
    )
    .unwrap();
    for seed in ["1", "2", "3"] {
        let out = ok(&[
            "run",
            m,
            "Pick a color and a number.",
            "--grammar",
            grammar.to_str().unwrap(),
            "--temperature",
            "1",
            "--seed",
            seed,
        ]);
        let line = out.trim();
        let rest = line
            .strip_prefix("Answer: ")
            .unwrap_or_else(|| panic!("{line:?}"));
        let (color, n) = rest.split_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        assert!(["red", "green", "blue"].contains(&color), "{line:?}");
        let n: u32 = n.parse().unwrap_or_else(|_| panic!("{line:?}"));
        assert!((1..100).contains(&n), "{line:?}");
    }
    let out = ok(&[
        "run",
        m,
        "What year did the war end?",
        "--regex",
        "19[0-9]{2}",
        "--temperature",
        "1",
        "--seed",
        "4",
    ]);
    let y = out.trim();
    assert!(
        y.len() == 4 && y.starts_with("19") && y.parse::<u32>().is_ok(),
        "{y:?}"
    );

    std::fs::write(&grammar, "start: \"a\" missing_rule\n").unwrap();
    fails_with(
        &["run", m, "hi", "--grammar", grammar.to_str().unwrap()],
        "invalid",
    );
    fails_with(&["run", m, "hi", "--regex", "(unclosed"], "invalid");
}

/// The `prompt.{i}.input_ids` of a REF file (tests/fixtures/ref/README.md): i64 [T].
fn ref_input_ids(path: &std::path::Path, i: usize) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header[format!("prompt.{i}.input_ids")];
    assert_eq!(t["dtype"], "I64", "{t}");
    let (a, b) = (
        t["data_offsets"][0].as_u64().unwrap() as usize,
        t["data_offsets"][1].as_u64().unwrap() as usize,
    );
    bytes[8 + n + a..8 + n + b]
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

/// `--print-token-ids` prints what the model was fed and what it generated: for SmolLM2's
/// first reference prompt (plain, 5 prompt ids, then 10 greedy ids appended by transformers)
/// both lines equal the REF file's ids, which came from HF tokenizers and transformers.
#[test]
fn run_prints_the_token_ids_it_fed_and_generated() {
    let m = model();
    let reference = fixture("ref/smollm2-q4_1.safetensors");
    let ids = ref_input_ids(&reference, 0);
    assert_eq!(
        ids.len(),
        15,
        "the REF's prompt 0: 5 prompt + 10 greedy ids"
    );
    let o = flowrt()
        .args([
            "run",
            m.to_str().unwrap(),
            "The capital of France is",
            "--raw",
            "--temperature",
            "0",
            "--max-tokens",
            "10",
            "--ignore-eos",
            "--print-token-ids",
        ])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let line = |key: &str| -> Vec<u32> {
        let l = err
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no `{key}` line in {err}"));
        l.split_whitespace().map(|t| t.parse().unwrap()).collect()
    };
    assert_eq!(line("prompt token ids: "), ids[..5], "{err}");
    assert_eq!(line("generated token ids: "), ids[5..], "{err}");
    assert!(out.contains("Paris"), "{out}");
    // Without the flag, nothing of the kind is printed.
    let o = flowrt()
        .args([
            "run",
            m.to_str().unwrap(),
            "Hi",
            "--raw",
            "--max-tokens",
            "2",
        ])
        .output()
        .unwrap();
    assert!(!text(&o).1.contains("token ids"), "{}", text(&o).1);
}
