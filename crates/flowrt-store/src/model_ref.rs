use std::path::{Path, PathBuf};

use crate::{catalog, find_entry, CatalogEntry, StoreError};

/// What a model argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A local model file, or a Hugging Face checkpoint directory (one with a `config.json`).
    Path(PathBuf),
    /// A catalog model, by tag or alias.
    Tag(&'static CatalogEntry),
}

/// Reads a command-line model argument. In order:
/// 1. an existing file, or a directory holding `config.json` → `Path`;
/// 2. a catalog tag or alias → `Tag`;
/// 3. anything that looks like a path (contains a path separator or ends in `.gguf`)
///    → [`StoreError::NotFound`] / [`StoreError::NotAFile`];
/// 4. anything else → [`StoreError::UnknownModel`], listing the known tags.
///
/// An unknown name is never replaced by a different model.
pub fn parse_model_arg(arg: &str) -> Result<ModelRef, StoreError> {
    let path = Path::new(arg);
    if !arg.is_empty() && (path.is_file() || path.join("config.json").is_file()) {
        return Ok(ModelRef::Path(path.to_path_buf()));
    }
    if let Some(entry) = find_entry(arg) {
        return Ok(ModelRef::Tag(entry));
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
        known: catalog().iter().map(|e| e.tag.to_string()).collect(),
    })
}

fn looks_like_path(arg: &str) -> bool {
    arg.contains('/')
        || arg.contains(std::path::MAIN_SEPARATOR)
        || Path::new(arg)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}
