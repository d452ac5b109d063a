//! `flowrt pack` refusing: a full disk (a small tmpfs, and a size-limited file), and the gate
//! against the model a shimmed source was made from (`--against`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flowrt_testkit::coverage;

fn flowrt_bin() -> &'static str {
    env!("CARGO_BIN_EXE_flowrt")
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs `script` under `sh -c` with `$FLOWRT`, `$SRC` and `$DIR` set.
fn sh(script: &str, src: &Path, dir: &Path) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("FLOWRT", flowrt_bin())
        .env("SRC", src)
        .env("DIR", dir)
        .output()
        .unwrap()
}

/// The F32 pack of the fixture is ~690 KB; both limits below are far less.
#[test]
fn a_full_disk_is_a_clear_error_and_leaves_nothing() {
    let src = fixture("families/llama-untied");
    let dir = tempfile::tempdir().unwrap();

    // A size-limited file (RLIMIT_FSIZE, with SIGXFSZ ignored so the write fails with EFBIG
    // instead of killing the process): runs everywhere.
    let o = sh(
        "trap '' XFSZ; ulimit -f 256; exec \"$FLOWRT\" pack \"$SRC\" -o \"$DIR/m.gguf\" --quant F32",
        &src,
        dir.path(),
    );
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("m.gguf.partial"), "{stderr}");
    assert!(stderr.contains("File too large"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left after a failed write: {left:?}");

    // A real full file system: a 200 KiB tmpfs in a private mount namespace (needs
    // unprivileged user namespaces). What is left on it is listed from inside.
    let probe = Command::new("unshare").args(["-r", "-m", "true"]).output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        coverage::not_run(
            "cli",
            "pack on a full tmpfs",
            "`unshare -r -m` is not permitted here (no user namespaces); the size-limited-file case ran",
        );
        return;
    }
    let o = sh(
        "exec unshare -r -m sh -c 'mount -t tmpfs -o size=200k tmpfs \"$DIR\" || exit 97; \
         \"$FLOWRT\" pack \"$SRC\" -o \"$DIR/m.gguf\" --quant F32; rc=$?; \
         echo \"left: [$(ls -A \"$DIR\")]\"; exit $rc'",
        &src,
        dir.path(),
    );
    let (stdout, stderr) = text(&o);
    assert_ne!(o.status.code(), Some(97), "mount failed: {stderr}");
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("No space left on device") && stderr.contains("m.gguf.partial"),
        "{stderr}"
    );
    assert!(stdout.contains("left: []"), "{stdout}");
    coverage::ran("cli", "pack on a full tmpfs");
}

fn pack(src: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(flowrt_bin())
        .arg("pack")
        .arg(src)
        .arg("-o")
        .arg(out)
        .args(["--quant", "F16"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn against_the_original_refuses_the_qk_norm_shim_and_passes_equivalent_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let untied = fixture("families/llama-untied");
    let untied = untied.to_str().unwrap();

    // KV heads replicated 4x: the same model, so the gate against the original passes.
    let o = pack(
        &fixture("shims/kv-replicated"),
        &out,
        &["--against", untied],
    );
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("(--against)"), "{stdout}");
    // Tied embeddings stored twice: the same model too.
    let o = pack(
        &fixture("shims/tied-duplicated"),
        &out,
        &[
            "--against",
            fixture("families/llama-tied").to_str().unwrap(),
        ],
    );
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");

    // Llama relabelled as Qwen3 with all-ones QK-norm: it packs fine against itself, but
    // against the Llama it was made from the gate refuses and nothing is left.
    let shim = fixture("shims/qwen3-relabel");
    let o = pack(&shim, &out, &[]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    std::fs::remove_file(&out).unwrap();
    let o = pack(&shim, &out, &["--against", untied]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("pack refused"), "{stderr}");
    assert!(!out.exists());

    // A model with another tokenizer cannot be a reference.
    let smollm2 = std::env::var_os("FLOWRT_SMOLLM2_GGUF");
    if let Some(other) = smollm2 {
        let o = pack(
            Path::new(untied),
            &out,
            &["--against", other.to_str().unwrap()],
        );
        let (stdout, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("vocabularies differ") || stderr.contains("tokenises"),
            "{stderr}"
        );
        assert!(!out.exists());
    }
}
