//! The model registry: round trip, damaged files, tag rules, bare-family resolution, and
//! model-argument parsing through it. No model files are loaded: entries point at small
//! stand-in files.

use std::fs;
use std::path::{Path, PathBuf};

use flowrt_store::{
    find_entry, Entry, ModelFormat, ModelInfo, ModelRef, ModelSource, Registry, Store, StoreError,
    REGISTRY_FILE,
};

fn entry(tag: &str, path: &Path) -> Entry {
    Entry {
        tag: tag.into(),
        path: path.to_path_buf(),
        format: ModelFormat::Gguf,
        info: ModelInfo {
            architecture: "llama".into(),
            context_length: 2048,
            parameters: 1_000_000,
            quantization: "q4_0".into(),
        },
        size_bytes: 1,
        sha256: "ab".repeat(32),
        source: ModelSource::Local,
        origin: path.display().to_string(),
        added_at: "2025-01-01T00:00:00Z".into(),
    }
}

/// A home with a one-byte stand-in model file.
fn home() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.gguf");
    fs::write(&file, b"x").unwrap();
    (dir, file)
}

#[test]
fn round_trip_keeps_every_field_and_sorts_by_tag() {
    let (dir, file) = home();
    let mut r = Registry::open(dir.path()).unwrap();
    assert!(r.list().is_empty(), "a missing file is an empty registry");
    let a = entry("zeta:1b", &file);
    let mut b = entry("alpha:7b", &file);
    b.format = ModelFormat::HfDir;
    b.source = ModelSource::Catalog;
    b.info.quantization = "bf16".into();
    assert_eq!(r.add(a.clone(), false).unwrap(), None);
    assert_eq!(r.add(b.clone(), false).unwrap(), None);

    let again = Registry::open(dir.path()).unwrap();
    assert_eq!(again.list(), &[b.clone(), a.clone()]);
    assert_eq!(again.get("zeta:1b"), Some(a.clone()));
    assert_eq!(again.get("zeta"), None, "get is exact");

    // The file is versioned JSON with the documented field names.
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.path().join(REGISTRY_FILE)).unwrap()).unwrap();
    assert_eq!(v["version"], 1);
    let m = &v["models"][0];
    for k in [
        "tag",
        "path",
        "format",
        "architecture",
        "context_length",
        "parameters",
        "quantization",
        "size_bytes",
        "sha256",
        "source",
        "origin",
        "added_at",
    ] {
        assert!(m.get(k).is_some(), "missing {k}: {m}");
    }
    assert_eq!(m["format"], "hf-dir");
    assert_eq!(m["source"], "catalog");

    // Existing tags are refused unless replacing.
    let mut r = again;
    let mut a2 = a.clone();
    a2.info.parameters = 7;
    match r.add(a2.clone(), false) {
        Err(e @ StoreError::TagExists { .. }) => assert!(e.to_string().contains("--force"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.add(a2.clone(), true).unwrap(), Some(a));
    assert_eq!(Registry::open(dir.path()).unwrap().get("zeta:1b"), Some(a2));

    // Remove, and removing again names what is registered.
    assert_eq!(r.remove("alpha:7b").unwrap().tag, "alpha:7b");
    match r.remove("alpha:7b") {
        Err(e @ StoreError::NotRegistered { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("alpha:7b") && msg.contains("zeta:1b"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(Registry::open(dir.path()).unwrap().list().len(), 1);
    // No temporary files are left next to it.
    let names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".registry-"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn changes_by_another_handle_are_kept() {
    // Two processes (here: two snapshots) adding models must not lose each other's.
    let (dir, file) = home();
    let mut one = Registry::open(dir.path()).unwrap();
    let mut two = Registry::open(dir.path()).unwrap();
    one.add(entry("a:1", &file), false).unwrap();
    two.add(entry("b:1", &file), false).unwrap();
    let tags: Vec<String> = Registry::open(dir.path())
        .unwrap()
        .list()
        .iter()
        .map(|e| e.tag.clone())
        .collect();
    assert_eq!(tags, ["a:1", "b:1"]);
}

#[test]
fn invalid_tags_are_refused_on_add() {
    let (dir, file) = home();
    let mut r = Registry::open(dir.path()).unwrap();
    for bad in ["nocolon", "Upper:1b", "a:b:c", "a/b:1", ":1", "a:"] {
        match r.add(entry(bad, &file), false) {
            Err(e @ StoreError::InvalidTag { .. }) => {
                assert!(e.to_string().contains(bad), "{e}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(!dir.path().join(REGISTRY_FILE).exists());
}

#[test]
fn damaged_registry_is_an_error_naming_the_file() {
    let (dir, file) = home();
    let path = dir.path().join(REGISTRY_FILE);
    let good = serde_json::json!({"version": 1, "models": [entry("a:1", &file)]});
    let dup =
        serde_json::json!({"version": 1, "models": [entry("a:1", &file), entry("a:1", &file)]});
    let bad_tag = serde_json::json!({"version": 1, "models": [entry("A:1", &file)]});
    let cases: [(&str, String); 7] = [
        ("truncated", good.to_string()[..40].to_string()),
        ("not JSON", "hello".into()),
        ("no version", r#"{"models": []}"#.into()),
        (
            "wrong type",
            r#"{"version": 1, "models": [{"tag": 3}]}"#.into(),
        ),
        ("duplicate", dup.to_string()),
        ("bad tag", bad_tag.to_string()),
        ("binary", "\u{0}\u{1}".into()),
    ];
    for (what, text) in cases {
        // A handle opened while the file was good.
        fs::write(&path, good.to_string()).unwrap();
        let mut before = Registry::open(dir.path()).unwrap();
        fs::write(&path, &text).unwrap();
        match Registry::open(dir.path()) {
            Err(e @ StoreError::RegistryCorrupt { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
            }
            other => panic!("{what}: {other:?}"),
        }
        // A change is refused too, and leaves the damaged file for the user to inspect.
        assert!(
            matches!(
                before.add(entry("b:1", &file), false),
                Err(StoreError::RegistryCorrupt { .. })
            ),
            "{what}"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), text, "{what}");
    }
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, br#"{"version": 2, "models": []}"#).unwrap();
    match Registry::open(dir.path()) {
        Err(e @ StoreError::RegistryVersion { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("version 2") && msg.contains(REGISTRY_FILE),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Model-argument parsing reports it too (paths still work without the registry).
    fs::write(&path, &bytes).unwrap();
    let store = Store::new(dir.path());
    assert!(matches!(
        store.parse_model_arg("a:1"),
        Err(StoreError::RegistryCorrupt { .. })
    ));
    assert_eq!(
        store.parse_model_arg(file.to_str().unwrap()).unwrap(),
        ModelRef::Path(file.clone())
    );
}

#[test]
fn bare_family_resolution_rules() {
    let (dir, file) = home();
    let mut r = Registry::open(dir.path()).unwrap();

    // 1. A catalog alias names its default size, and only that size.
    r.add(entry("smollm2:360m", &file), false).unwrap();
    match r.resolve_tag("smollm2") {
        Err(e @ StoreError::DefaultNotPresent { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("smollm2:135m") && msg.contains("flowrt pull"),
                "{msg}"
            );
        }
        other => panic!("the catalog default must not be replaced by 360m: {other:?}"),
    }
    r.add(entry("smollm2:135m", &file), false).unwrap();
    assert_eq!(r.resolve_tag("smollm2").unwrap().tag, "smollm2:135m");
    assert_eq!(r.resolve_tag("smollm2:360m").unwrap().tag, "smollm2:360m");

    // 2. Without a catalog alias, the single registered size.
    r.add(entry("mine:1b", &file), false).unwrap();
    assert_eq!(r.resolve_tag("mine").unwrap().tag, "mine:1b");

    // 3. Several sizes: an error listing them.
    r.add(entry("mine:7b", &file), false).unwrap();
    match r.resolve_tag("mine") {
        Err(e @ StoreError::AmbiguousFamily { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("mine:1b") && msg.contains("mine:7b"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // Full tags still resolve exactly.
    assert_eq!(r.resolve_tag("mine:7b").unwrap().tag, "mine:7b");
}

#[test]
fn unknown_names_are_errors_and_never_substituted() {
    let (dir, file) = home();
    let mut r = Registry::open(dir.path()).unwrap();
    r.add(entry("mine:1b", &file), false).unwrap();
    for name in ["mine:2b", "min", "mine:", "other", "Mine:1b", ""] {
        match r.resolve_tag(name) {
            Err(e @ StoreError::UnknownModel { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("mine:1b") && msg.contains("smollm2:135m"),
                    "{msg}"
                );
            }
            other => panic!("{name:?}: {other:?}"),
        }
    }
    // A catalog tag that is not registered is not quietly something else either.
    assert!(matches!(
        r.resolve_tag("gemma3:270m"),
        Err(StoreError::DefaultNotPresent { .. })
    ));
}

#[test]
fn model_arguments_accept_registered_tags() {
    let (dir, file) = home();
    let store = Store::new(dir.path());
    let smol = find_entry("smollm2:135m").unwrap();
    // Before registration: the catalog.
    assert_eq!(
        store.parse_model_arg("smollm2").unwrap(),
        ModelRef::Tag(smol)
    );
    match store.parse_model_arg("mine") {
        Err(StoreError::UnknownModel { known, .. }) => {
            assert_eq!(known, ["smollm2:135m", "gemma3:270m", "all-minilm:l6-v2"])
        }
        other => panic!("{other:?}"),
    }

    let mut r = store.registry().unwrap();
    let e = entry("mine:1b", &file);
    r.add(e.clone(), false).unwrap();
    assert_eq!(
        store.parse_model_arg("mine:1b").unwrap(),
        ModelRef::Registered(e.clone())
    );
    assert_eq!(
        store.parse_model_arg("mine").unwrap(),
        ModelRef::Registered(e.clone())
    );
    let resolved = store
        .resolve("mine:1b", flowrt_store::FetchPolicy::Never, &mut |_| {})
        .unwrap();
    assert_eq!(resolved, file);
    assert_eq!(
        store
            .resolve_entry("mine", flowrt_store::FetchPolicy::Never, &mut |_| {})
            .unwrap(),
        e
    );
    match store.parse_model_arg("mine:2b") {
        Err(StoreError::UnknownModel { known, .. }) => {
            assert_eq!(
                known,
                ["smollm2:135m", "gemma3:270m", "all-minilm:l6-v2", "mine:1b"]
            )
        }
        other => panic!("{other:?}"),
    }

    // A registered file that changed or vanished is an error naming the tag, not a guess.
    fs::write(&file, b"longer now").unwrap();
    match store.resolve("mine:1b", flowrt_store::FetchPolicy::Never, &mut |_| {}) {
        Err(e @ StoreError::RegisteredFileChanged { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("mine:1b") && msg.contains("m.gguf"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    fs::remove_file(&file).unwrap();
    assert!(matches!(
        store.resolve_entry("mine:1b", flowrt_store::FetchPolicy::Never, &mut |_| {}),
        Err(StoreError::RegisteredFileChanged { .. })
    ));
}
