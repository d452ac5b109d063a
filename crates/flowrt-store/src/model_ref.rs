use std::path::{Path, PathBuf};

use crate::registry::Lookup;
use crate::{CatalogEntry, Entry, Registry, StoreError};

/// What a model argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A local model file, or a Hugging Face checkpoint directory (one with a `config.json`).
    Path(PathBuf),
    /// A model in the registry, by tag or bare family (see [`Registry::resolve_tag`]).
    Registered(Entry),
    /// A catalog model, by tag or alias, that is not registered (yet).
    Tag(&'static CatalogEntry),
}

/// Reads a command-line model argument against the default store's registry
/// ([`crate::flowrt_home`]; without one, the catalog alone). In order:
/// 1. an existing file, or a directory holding `config.json` → `Path`;
/// 2. a registered tag, or a bare family naming one (see [`Registry::resolve_tag`])
///    → `Registered`;
/// 3. a catalog tag or alias that is not registered → `Tag`;
/// 4. anything that looks like a path (contains a path separator or ends in `.gguf`)
///    → [`StoreError::NotFound`] / [`StoreError::NotAFile`];
/// 5. anything else → [`StoreError::UnknownModel`], listing the known tags.
///
/// An unknown name is never replaced by a different model.
pub fn parse_model_arg(arg: &str) -> Result<ModelRef, StoreError> {
    if is_existing_model_path(arg) {
        return Ok(ModelRef::Path(arg.into()));
    }
    let registry = match crate::flowrt_home() {
        Ok(home) => Some(Registry::open(home)?),
        Err(StoreError::NoHome) => None,
        Err(e) => return Err(e),
    };
    parse_with(arg, registry.as_ref())
}

pub(crate) fn is_existing_model_path(arg: &str) -> bool {
    let path = Path::new(arg);
    !arg.is_empty() && (path.is_file() || path.join("config.json").is_file())
}

/// [`parse_model_arg`] against `registry` (`None`: an empty one).
pub(crate) fn parse_with(arg: &str, registry: Option<&Registry>) -> Result<ModelRef, StoreError> {
    let path = Path::new(arg);
    if is_existing_model_path(arg) {
        return Ok(ModelRef::Path(path.to_path_buf()));
    }
    let empty;
    let registry = match registry {
        Some(r) => r,
        None => {
            empty = Registry::empty();
            &empty
        }
    };
    match registry.lookup(arg) {
        Ok(Lookup::Registered(e)) => return Ok(ModelRef::Registered(e)),
        Ok(Lookup::Catalog(e)) => return Ok(ModelRef::Tag(e)),
        Err(StoreError::UnknownModel { .. }) => {}
        Err(e) => return Err(e),
    }
    if looks_like_path(arg) {
        return Err(if path.exists() {
            StoreError::NotAFile { path: path.into() }
        } else {
            StoreError::NotFound { path: path.into() }
        });
    }
    Err(StoreError::UnknownModel {
        name: arg.to_string(),
        known: registry.known_tags(),
    })
}

fn looks_like_path(arg: &str) -> bool {
    arg.contains('/')
        || arg.contains(std::path::MAIN_SEPARATOR)
        || Path::new(arg)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}
