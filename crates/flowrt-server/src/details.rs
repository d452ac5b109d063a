//! What a model file is, read from its metadata without loading it: architecture, parameter
//! count, quantisation, context length, chat template. `/v1/models`, `/api/tags` and
//! `/api/show` report these.

use std::path::Path;

use flowrt_gguf::GgufFile;

/// Largest JSON file read from a checkpoint directory.
const MAX_JSON_BYTES: u64 = 16 << 20;

/// A model's description, as read from its file.
#[derive(Clone, Debug, Default)]
pub struct ModelDetails {
    /// `gguf` or `safetensors`.
    pub format: &'static str,
    /// GGUF `general.architecture` or HF `model_type`, e.g. `llama`.
    pub architecture: String,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    pub license: Option<String>,
    /// Weights' element count (all tensors), when known.
    pub parameter_count: Option<u64>,
    /// `Q4_1`, `Q4_K_M`, `F16`, ...
    pub quantization: String,
    /// The trained context length.
    pub context_length: usize,
    /// The Jinja chat template source, when the model has one.
    pub chat_template: Option<String>,
}

impl ModelDetails {
    /// Read a GGUF file's or a HF checkpoint directory's metadata.
    pub fn read(path: &Path) -> Result<ModelDetails, String> {
        if path.is_dir() {
            read_hf_dir(path)
        } else {
            read_gguf(path)
        }
    }

    /// Whether the model's family can generate text (has an output projection), as the
    /// server decides when a chat request names it; `Some(false)`: it only embeds; `None`: a
    /// family flowrt does not know (loading it will say so).
    pub fn generates(&self) -> Option<bool> {
        let arch = match self.format {
            "gguf" => flowrt_model::arch::by_gguf_arch(&self.architecture),
            _ => flowrt_model::arch::by_hf_model_type(&self.architecture),
        };
        arch.map(|a| a.lm_head)
    }

    /// Ollama's `parameter_size`, e.g. `135M`, `2.0B`.
    pub fn parameter_size(&self) -> String {
        match self.parameter_count {
            Some(n) if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
            Some(n) if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
            Some(n) => format!("{n}"),
            None => String::new(),
        }
    }
}

fn read_gguf(path: &Path) -> Result<ModelDetails, String> {
    let f = GgufFile::open(path).map_err(|e| e.to_string())?;
    let s = |k: &str| f.get_str(k).ok().flatten().map(str::to_string);
    let architecture = s("general.architecture").unwrap_or_default();
    let context_length = f
        .get_u64(&format!("{architecture}.context_length"))
        .ok()
        .flatten()
        .unwrap_or(0) as usize;
    let parameter_count = f.tensors().iter().map(|t| t.n_elements()).sum();
    let quantization = f
        .get_u64("general.file_type")
        .ok()
        .flatten()
        .and_then(file_type_name)
        .map(str::to_string)
        .unwrap_or_else(|| dominant_type(&f));
    Ok(ModelDetails {
        format: "gguf",
        architecture,
        name: s("general.name"),
        license: s("general.license"),
        parameter_count: Some(parameter_count),
        quantization,
        context_length,
        chat_template: s("tokenizer.chat_template"),
    })
}

/// llama.cpp's `general.file_type` numbering (`llama_ftype`).
fn file_type_name(t: u64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// The tensor type holding the most bytes, for files without `general.file_type`.
fn dominant_type(f: &GgufFile) -> String {
    let mut by_type: Vec<(String, u64)> = Vec::new();
    for t in f.tensors() {
        let name = t.ggml_type.name().to_uppercase();
        match by_type.iter_mut().find(|(n, _)| *n == name) {
            Some((_, b)) => *b += t.size_bytes,
            None => by_type.push((name, t.size_bytes)),
        }
    }
    by_type
        .into_iter()
        .max_by_key(|(_, b)| *b)
        .map(|(n, _)| n)
        .unwrap_or_default()
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let len = std::fs::metadata(path).ok()?.len();
    if len > MAX_JSON_BYTES {
        return None;
    }
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn read_hf_dir(dir: &Path) -> Result<ModelDetails, String> {
    let config = read_json(&dir.join("config.json"))
        .ok_or_else(|| format!("{}: no readable config.json", dir.display()))?;
    let text =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let chat_template = std::fs::read_to_string(dir.join("chat_template.jinja"))
        .ok()
        .or_else(|| {
            read_json(&dir.join("tokenizer_config.json")).and_then(|t| text(&t, "chat_template"))
        });
    Ok(ModelDetails {
        format: "safetensors",
        architecture: text(&config, "model_type").unwrap_or_default(),
        name: dir.file_name().map(|n| n.to_string_lossy().into_owned()),
        license: None,
        parameter_count: None,
        quantization: text(&config, "torch_dtype")
            .map(|d| d.to_uppercase())
            .unwrap_or_default(),
        context_length: config
            .get("max_position_embeddings")
            .and_then(|v| v.as_u64())
            .unwrap_or(0) as usize,
        chat_template,
    })
}
