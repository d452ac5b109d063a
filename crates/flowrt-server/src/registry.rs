//! Serving the model registry (`$FLOWRT_HOME/registry.json`, see [`flowrt_store::Registry`]).
//!
//! A server started without model arguments answers for every registered model. The file is
//! re-read whenever the server looks up or lists models, so `flowrt pull`, `flowrt add` and
//! `flowrt rm` take effect on a running server. A request's model name is resolved exactly as
//! the CLI resolves it ([`Registry::resolve_tag`]): a registered tag, or a bare family naming
//! one registered model. A name that resolves to no registered model is 404
//! `model_not_found`, never another model.
//!
//! Each registered model is described once ([`ModelSpec::from_entry`] reads the file's
//! metadata) and described again only when its registry entry changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use flowrt_store::{find_entry, Entry, FetchPolicy, Registry, Store, StoreError};

use crate::error::{clip, ApiError, ErrorKind};
use crate::models::ModelSpec;

/// The registered models of one flowrt home, as last read.
pub(crate) struct RegistryModels {
    home: PathBuf,
    cache: Mutex<Snapshot>,
}

#[derive(Clone)]
struct Snapshot {
    registry: Registry,
    /// One per registered model, sorted by tag.
    specs: Vec<Arc<ModelSpec>>,
}

impl RegistryModels {
    /// Reads the registry of `home` (an error if it cannot be read).
    pub(crate) fn open(home: PathBuf) -> Result<RegistryModels, StoreError> {
        let registry = Registry::open(&home)?;
        let specs = describe(&registry, &[]);
        Ok(RegistryModels {
            home,
            cache: Mutex::new(Snapshot { registry, specs }),
        })
    }

    pub(crate) fn home(&self) -> &Path {
        &self.home
    }

    /// Re-reads the registry and returns it with a spec for every registered model. When the
    /// file cannot be read (e.g. someone left it malformed), the last good snapshot is used
    /// and the error logged, so a running server keeps serving.
    fn refresh(&self) -> Snapshot {
        let read = Registry::open(&self.home);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match read {
            Ok(registry) => {
                if registry.list() != cache.registry.list() {
                    let specs = describe(&registry, &cache.specs);
                    *cache = Snapshot { registry, specs };
                }
            }
            Err(e) => {
                tracing::error!(registry = %self.home.join(flowrt_store::REGISTRY_FILE).display(), error = %e,
                    "cannot read the model registry; serving the models it last listed");
            }
        }
        cache.clone()
    }

    /// Every registered model.
    pub(crate) fn specs(&self) -> Vec<Arc<ModelSpec>> {
        self.refresh().specs
    }

    /// The registered model a request's `name` means. Ollama clients append `:latest` to a
    /// bare name, so `NAME:latest` that is not itself registered means `NAME`.
    pub(crate) fn resolve(&self, name: &str) -> Result<Arc<ModelSpec>, ApiError> {
        let snap = self.refresh();
        let entry = match snap.registry.resolve_tag(name) {
            Ok(e) => e,
            Err(StoreError::UnknownModel { .. }) if name.ends_with(":latest") => {
                let bare = &name[..name.len() - ":latest".len()];
                snap.registry
                    .resolve_tag(bare)
                    .map_err(|e| not_resolved(name, e))?
            }
            Err(e) => return Err(not_resolved(name, e)),
        };
        snap.specs
            .iter()
            .find(|s| s.id == entry.tag)
            .cloned()
            .ok_or_else(|| ApiError::model_not_found(name))
    }

    /// Checks, before loading, that `spec` is still what the registry holds under its tag and
    /// that the file is intact (a catalog model's size and SHA-256; any other file's size).
    /// Blocking: a catalog file whose hash is not cached is hashed.
    pub(crate) fn check_before_load(home: &Path, spec: &ModelSpec) -> Result<(), String> {
        let store = Store::new(home);
        let entry = store
            .resolve_entry(
                &spec.id,
                FetchPolicy::Never,
                &mut |m: &str| tracing::info!(model = %spec.id, "{m}"),
            )
            .map_err(|e| e.to_string())?;
        if entry.sha256 != spec.sha256 || entry.path != spec.path {
            return Err(format!(
                "the registry entry of {} changed (now {}, sha256 {}) while it was being loaded",
                spec.id,
                entry.path.display(),
                entry.sha256
            ));
        }
        Ok(())
    }
}

/// The 404 for a name the registry does not resolve, saying why without naming files.
fn not_resolved(name: &str, e: StoreError) -> ApiError {
    let name = clip(name, 200);
    let message = match e {
        StoreError::UnknownModel { .. } => return ApiError::model_not_found(&name),
        StoreError::DefaultNotPresent { tag, .. } if tag == name => format!(
            "`{name}` is a catalog model that is not registered on this server (GET /v1/models lists the models it serves)"
        ),
        StoreError::DefaultNotPresent { tag, .. } => format!(
            "`{name}` means `{tag}`, which is not registered on this server (GET /v1/models lists the models it serves)"
        ),
        StoreError::AmbiguousFamily { sizes, .. } => format!(
            "`{name}` is ambiguous: this server has {}; name one",
            sizes.join(", ")
        ),
        StoreError::InvalidTag { .. } => return ApiError::model_not_found(&name),
        other => return ApiError::internal("reading the model registry", &other),
    };
    ApiError::new(ErrorKind::ModelNotFound, message).with_param("model")
}

/// A spec for every entry of `registry`, reusing those in `old` whose entry is unchanged.
fn describe(registry: &Registry, old: &[Arc<ModelSpec>]) -> Vec<Arc<ModelSpec>> {
    registry
        .list()
        .iter()
        .map(|entry| {
            let aliases = aliases(registry, entry);
            match old
                .iter()
                .find(|s| s.entry.as_ref() == Some(entry) && s.aliases == aliases)
            {
                Some(s) => s.clone(),
                None => Arc::new(ModelSpec::from_entry(entry.clone()).with_aliases(aliases)),
            }
        })
        .collect()
}

/// The other names that resolve to `entry` today: its bare family and catalog aliases.
fn aliases(registry: &Registry, entry: &Entry) -> Vec<String> {
    let mut names = vec![entry.family().to_string()];
    if let Some(c) = find_entry(&entry.tag) {
        names.extend(c.aliases.iter().map(|a| a.to_string()));
    }
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let resolves = registry.resolve_tag(&n).is_ok_and(|e| e.tag == entry.tag);
        if resolves && n != entry.tag && !out.contains(&n) {
            out.push(n);
        }
    }
    out
}
