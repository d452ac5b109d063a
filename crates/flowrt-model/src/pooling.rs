//! How a model turns a sequence's hidden states into one embedding, as its files declare it.
//!
//! - A sentence-transformers directory lists its modules in `modules.json`: the transformer
//!   (path `""`), `Pooling` (its `config.json`, e.g. `1_Pooling/config.json`:
//!   `"pooling_mode": "mean" | "cls" | "lasttoken"`, or the older flags
//!   `pooling_mode_mean_tokens`, `pooling_mode_cls_token`, `pooling_mode_lasttoken`), and
//!   optionally `Normalize` (L2 normalisation), whatever the package path of each class.
//!   `sentence_bert_config.json`'s `max_seq_length` (or, as sentence-transformers 3+ saves
//!   it, `tokenizer_config.json`'s `model_max_length`) bounds the tokens of one text.
//!   Prompts (`config_sentence_transformers.json`) are not added: a caller who wants a
//!   model's query prompt writes it into the text. Any other module (`Dense`, ...) is refused by name: flowrt would
//!   otherwise return something other than what the model computes.
//! - A GGUF file says `{arch}.pooling_type` (llama.cpp's numbering: 1 mean, 2 CLS, 3 last).
//!   GGUF files carry no normalisation flag; llama.cpp's embedding tools normalise by
//!   default, and so does flowrt for a GGUF with a pooling type (documented in the README).
//!
//! A model without any of these has no pooling definition: [`EmbeddingSpec::read_hf_dir`]
//! and [`EmbeddingSpec::from_gguf`] return `None`, and the engine refuses to embed with it
//! unless the caller names a pooling.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::ModelError;

/// How the rows of one sequence become its embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// The mean of every token's row (special tokens included, as sentence-transformers'
    /// attention mask counts them).
    Mean,
    /// The first token's row (BERT's `[CLS]`).
    Cls,
    /// The last token's row (decoder embedders, e.g. Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// The name flowrt uses (`mean`, `cls`, `last`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            _ => Err(format!("unknown pooling `{s}` (use mean, cls or last)")),
        }
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A model's embedding definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddingSpec {
    pub pooling: Pooling,
    /// L2-normalise the pooled vector.
    pub normalize: bool,
    /// Most tokens of one text (special tokens included), when the files say
    /// (`sentence_bert_config.json`'s `max_seq_length`, else `tokenizer_config.json`'s
    /// `model_max_length`); otherwise the model's context.
    pub max_tokens: Option<usize>,
    /// The width the pooling module declares (its `embedding_dimension`), when it does.
    pub dimension: Option<usize>,
    /// Where the definition came from, for reports (`modules.json`, `bert.pooling_type`).
    pub source: String,
}

const MODULES: &str = "modules.json";
const ST_CONFIG: &str = "sentence_bert_config.json";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// Largest sentence-transformers JSON file read (real ones are a few hundred bytes).
const MAX_JSON_BYTES: u64 = 1 << 20;

fn bad(path: &Path, reason: String) -> ModelError {
    ModelError::BadCheckpoint {
        path: path.to_path_buf(),
        reason,
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, ModelError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(path, e.to_string())),
    };
    if meta.len() > MAX_JSON_BYTES {
        return Err(bad(
            path,
            format!("{} bytes is too large for this file", meta.len()),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| bad(path, format!("not valid JSON: {e}")))
}

impl EmbeddingSpec {
    /// The definition a sentence-transformers directory declares (`None`: the directory has
    /// no `modules.json`).
    pub fn read_hf_dir(dir: &Path) -> Result<Option<EmbeddingSpec>, ModelError> {
        let modules_path = dir.join(MODULES);
        let Some(modules) = read_json(&modules_path)? else {
            return Ok(None);
        };
        let Value::Array(list) = &modules else {
            return Err(bad(&modules_path, "expected a list of modules".into()));
        };
        let mut pooling: Option<Pooling> = None;
        let mut normalize = false;
        let mut transformer = false;
        let mut dimension = None;
        for (i, m) in list.iter().enumerate() {
            let field = |k: &str| m.get(k).and_then(Value::as_str);
            let ty = field("type")
                .ok_or_else(|| bad(&modules_path, format!("module {i} has no string `type`")))?;
            let path = field("path").unwrap_or("");
            // The class name, whatever the package path (`sentence_transformers.models.X`).
            let class = ty.rsplit('.').next().unwrap_or(ty);
            match class {
                "Transformer" if !transformer && pooling.is_none() => transformer = true,
                "Pooling" if transformer && pooling.is_none() => {
                    let (p, d) = read_pooling(&dir.join(safe_subdir(&modules_path, path)?))?;
                    pooling = Some(p);
                    dimension = d;
                }
                "Normalize" if pooling.is_some() && !normalize => normalize = true,
                _ => {
                    return Err(bad(
                        &modules_path,
                        format!(
                            "module {i} (`{ty}`) is not supported here: flowrt runs a Transformer, then Pooling, then optionally Normalize"
                        ),
                    ))
                }
            }
        }
        let Some(pooling) = pooling else {
            return Err(bad(
                &modules_path,
                "no `sentence_transformers.models.Pooling` module".into(),
            ));
        };
        // sentence-transformers 2 writes `max_seq_length` to sentence_bert_config.json; 3+
        // to tokenizer_config.json's `model_max_length`.
        let mut max_tokens = None;
        for (file, key) in [
            (ST_CONFIG, "max_seq_length"),
            (TOKENIZER_CONFIG, "model_max_length"),
        ] {
            let path = dir.join(file);
            let Some(v) = read_json(&path)? else { continue };
            match v.get(key) {
                None | Some(Value::Null) => continue,
                Some(n) => {
                    // transformers writes a huge sentinel (1e30) for "no limit".
                    let n = n
                        .as_f64()
                        .filter(|&n| n >= 1.0 && n.fract() == 0.0)
                        .ok_or_else(|| bad(&path, format!("`{key}` = {n} is not a count")))?;
                    if n < 1e12 {
                        max_tokens = Some(n as usize);
                    }
                    break;
                }
            }
        }
        Ok(Some(EmbeddingSpec {
            pooling,
            normalize,
            max_tokens,
            dimension,
            source: MODULES.into(),
        }))
    }

    /// The definition of a GGUF file: `{arch}.pooling_type` (`None` when absent or 0, "none").
    pub fn from_gguf(f: &flowrt_gguf::GgufFile) -> Result<Option<EmbeddingSpec>, ModelError> {
        let file: PathBuf = crate::config::file_name(f);
        let Some(arch) = f.get_str("general.architecture")? else {
            return Ok(None);
        };
        let key = format!("{arch}.pooling_type");
        let pooling = match f.get_u64(&key)? {
            None | Some(0) => return Ok(None),
            Some(1) => Pooling::Mean,
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            Some(n) => {
                return Err(ModelError::BadConfig {
                    file,
                    reason: format!(
                        "`{key}` = {n} is not supported (1 mean, 2 cls, 3 last; 4, ranking, is not an embedding)"
                    ),
                })
            }
        };
        Ok(Some(EmbeddingSpec {
            pooling,
            normalize: true,
            max_tokens: None,
            dimension: None,
            source: key,
        }))
    }
}

/// A module's `path`: a plain subdirectory name.
fn safe_subdir<'a>(modules: &Path, path: &'a str) -> Result<&'a str, ModelError> {
    let plain = !path.is_empty()
        && Path::new(path).file_name().and_then(|f| f.to_str()) == Some(path)
        && path != ".."
        && path != ".";
    if plain {
        Ok(path)
    } else {
        Err(bad(
            modules,
            format!("module path `{path}` is not a subdirectory name"),
        ))
    }
}

/// `Pooling`'s `config.json`: one mode flowrt runs, as sentence-transformers 3+ writes it
/// (`"pooling_mode": "mean"`, or a list of one) or as older versions did (one
/// `pooling_mode_*_token(s)` flag set); and the dimension it declares.
fn read_pooling(dir: &Path) -> Result<(Pooling, Option<usize>), ModelError> {
    let path = dir.join("config.json");
    let v = read_json(&path)?.ok_or_else(|| bad(&path, "missing".into()))?;
    let dim = v
        .get("embedding_dimension")
        .or(v.get("word_embedding_dimension"))
        .and_then(Value::as_u64)
        .and_then(|d| usize::try_from(d).ok());
    let by_name = |name: &str| match name {
        "mean" => Ok(Pooling::Mean),
        "cls" => Ok(Pooling::Cls),
        "lasttoken" => Ok(Pooling::Last),
        other => Err(bad(
            &path,
            format!(
                "pooling mode `{other}` is not supported (flowrt pools mean, cls and lasttoken)"
            ),
        )),
    };
    if let Some(mode) = v.get("pooling_mode") {
        let pooling = match mode {
            Value::String(m) => by_name(m)?,
            Value::Array(list) if list.len() == 1 && list[0].is_string() => {
                by_name(list[0].as_str().unwrap_or_default())?
            }
            other => {
                return Err(bad(
                    &path,
                    format!("`pooling_mode` = {other}: flowrt runs one mode, named by a string"),
                ))
            }
        };
        return Ok((pooling, dim));
    }
    let on = |k: &str| v.get(k).and_then(Value::as_bool) == Some(true);
    let modes = [
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_lasttoken", "lasttoken"),
        ("pooling_mode_max_tokens", "max"),
        ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
        ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ];
    let set: Vec<(&str, &str)> = modes.into_iter().filter(|(k, _)| on(k)).collect();
    match set.as_slice() {
        [(_, name)] => Ok((by_name(name)?, dim)),
        [] => Err(bad(&path, "no pooling mode is set".into())),
        more => Err(bad(
            &path,
            format!(
                "{} pooling modes set at once ({}); flowrt runs one",
                more.len(),
                more.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}
