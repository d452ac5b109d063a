//! SHA-256 of model files, with a sidecar cache so a verified file is not rehashed on
//! every run.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::StoreError;

pub(crate) const BUF_SIZE: usize = 1 << 20;

/// Lower-case hex SHA-256 of a file, read in 1 MiB blocks.
pub fn sha256_file(path: &Path) -> Result<String, StoreError> {
    let mut file = File::open(path).map_err(StoreError::io("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = file.read(&mut buf).map_err(StoreError::io("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Lower-case hex SHA-256 of bytes in memory.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `<file>.sha256`, next to the file.
pub(crate) fn sidecar_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    path.with_file_name(name)
}

/// What the sidecar records: the hash, valid while size and modification time match.
#[derive(Debug, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: u128,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let meta = fs::metadata(path).ok()?;
        let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
        Some(Stamp {
            size: meta.len(),
            mtime_ns: mtime.as_nanos(),
        })
    }
}

/// Sidecar format, one line: `<sha256 hex> <size> <mtime in ns since the epoch>`.
fn read_sidecar(path: &Path) -> Option<(String, Stamp)> {
    let text = fs::read_to_string(sidecar_path(path)).ok()?;
    let mut parts = text.split_whitespace();
    let hash = parts.next()?;
    let size = parts.next()?.parse().ok()?;
    let mtime_ns = parts.next()?.parse().ok()?;
    let valid = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| (hash.to_ascii_lowercase(), Stamp { size, mtime_ns }))
}

/// Records `hash` for the file as it is now. Best effort: a read-only store only
/// costs a rehash next time.
pub(crate) fn write_sidecar(path: &Path, hash: &str) {
    if let Some(stamp) = Stamp::of(path) {
        let line = format!("{hash} {} {}\n", stamp.size, stamp.mtime_ns);
        let _ = fs::write(sidecar_path(path), line);
    }
}

/// SHA-256 of `path`, from the sidecar when the file's size and mtime still match what
/// it recorded, otherwise computed (and the sidecar refreshed).
pub(crate) fn cached_sha256(
    path: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<String, StoreError> {
    if let (Some((hash, recorded)), Some(now)) = (read_sidecar(path), Stamp::of(path)) {
        if recorded == now {
            return Ok(hash);
        }
    }
    progress(&format!("checking sha256 of {}", path.display()));
    let hash = sha256_file(path)?;
    write_sidecar(path, &hash);
    Ok(hash)
}

/// What identifies a model's bytes, and their size: for a file, its SHA-256 and length; for
/// a Hugging Face checkpoint directory, the SHA-256 of the list of its model files
/// (`*.json`, `*.safetensors`, `*.jinja`, sorted by name), one `<sha256>  <name>\n` line
/// each, and their total size.
pub fn model_fingerprint(path: &Path) -> Result<(String, u64), StoreError> {
    let meta = fs::metadata(path).map_err(StoreError::io("read", path))?;
    if !meta.is_dir() {
        return Ok((sha256_file(path)?, meta.len()));
    }
    let mut files = Vec::new();
    for entry in fs::read_dir(path).map_err(StoreError::io("list", path))? {
        let p = entry.map_err(StoreError::io("list", path))?.path();
        let is_model_file = p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            [".json", ".safetensors", ".jinja"]
                .iter()
                .any(|x| n.ends_with(x))
        });
        if is_model_file && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    let mut list = String::new();
    let mut size = 0;
    for f in &files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        list.push_str(&format!("{}  {name}\n", sha256_file(f)?));
        size += fs::metadata(f).map_err(StoreError::io("read", f))?.len();
    }
    Ok((sha256_hex(list.as_bytes()), size))
}
