//! The real models the suites run on, named by environment variables that `scripts/test` sets
//! after `flowrt pull`. A test that needs one calls [`smollm2`], [`gemma3`] or [`minilm`]:
//! without the variable it fails and says how to get the model; a test that can go without
//! reads [`ModelVar::optional`] and reports NOT RUN itself.

use std::path::PathBuf;

/// One model's variable: its name, the `flowrt pull` tag that fetches the model, and whether
/// the path is a file (GGUF) or a directory (HF checkpoint).
#[derive(Clone, Copy, Debug)]
pub struct ModelVar {
    /// The environment variable.
    pub var: &'static str,
    /// What `flowrt pull` takes to fetch the model (and prints the path of).
    pub tag: &'static str,
    /// The path is a directory, not a file.
    pub dir: bool,
}

/// SmolLM2-135M-Instruct Q4_1, the default model.
pub const SMOLLM2: ModelVar = ModelVar {
    var: "FLOWRT_SMOLLM2_GGUF",
    tag: "smollm2:135m",
    dir: false,
};
/// Gemma 3 270M Q4_K_M.
pub const GEMMA3: ModelVar = ModelVar {
    var: "FLOWRT_GEMMA3_GGUF",
    tag: "gemma3:270m",
    dir: false,
};
/// all-MiniLM-L6-v2, a sentence-transformers directory.
pub const MINILM: ModelVar = ModelVar {
    var: "FLOWRT_MINILM_DIR",
    tag: "all-minilm:l6-v2",
    dir: true,
};

impl ModelVar {
    /// The path the variable names, `None` when it is not set.
    ///
    /// # Panics
    /// When it is set to something that is not a file (a directory, for [`ModelVar::dir`]).
    pub fn optional(&self) -> Option<PathBuf> {
        let p = PathBuf::from(std::env::var_os(self.var)?);
        let (ok, what) = if self.dir {
            (p.is_dir(), "a directory")
        } else {
            (p.is_file(), "a file")
        };
        assert!(ok, "{}={} is not {what}", self.var, p.display());
        Some(p)
    }

    /// The path the variable names.
    ///
    /// # Panics
    /// When it is not set (saying how to fetch the model), or not an existing file or directory.
    pub fn required(&self) -> PathBuf {
        self.optional().unwrap_or_else(|| {
            panic!(
                "{} is not set. Run the tests with scripts/test, or fetch the model with \
                 `flowrt pull {}` and point {} at the path it prints.",
                self.var, self.tag, self.var
            )
        })
    }
}

/// The default model's GGUF file (see [`SMOLLM2`]).
pub fn smollm2() -> PathBuf {
    SMOLLM2.required()
}

/// Gemma 3 270M's GGUF file (see [`GEMMA3`]).
pub fn gemma3() -> PathBuf {
    GEMMA3.required()
}

/// all-MiniLM-L6-v2's directory (see [`MINILM`]).
pub fn minilm() -> PathBuf {
    MINILM.required()
}
