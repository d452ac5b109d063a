//! Tokenizer and chat template from a Hugging Face checkpoint directory.
//!
//! Files read (only `tokenizer.json` is required):
//!
//! - `tokenizer.json`: the whole `tokenizers` pipeline, run as is by the `tokenizers` crate.
//! - `tokenizer_config.json`: `bos_token` / `eos_token` (a string or an `{"content": ...}`
//!   object), `add_bos_token` / `add_eos_token`, `chat_template` (a string, or a list of
//!   `{name, template}` of which `default` is used).
//! - `generation_config.json`: `eos_token_id` (an id or a list), which ends generation.
//! - `chat_template.jinja`: the chat template; takes priority over `tokenizer_config.json`.
//!
//! Behaviour, and where it follows HF:
//!
//! - `encode(text, add_special = true, ..)`: when `tokenizer_config.json` has
//!   `add_bos_token` or `add_eos_token`, BOS/EOS are added per those flags (a missing one
//!   counts as false), as transformers' `update_post_processor` does; otherwise whatever the
//!   `tokenizer.json` post-processor adds, as HF's `tokenizer(text)` does. (transformers 5
//!   ignores the two flags whenever a tokenizer.json exists; checkpoints normally agree.)
//! - Added tokens with `"special": true` are special: matched in text only with
//!   `parse_special`, left out by `decode(.., skip_special = true)`. Other added tokens
//!   always match and are never skipped.
//! - End of generation: the EOS token, `generation_config.json`'s `eos_token_id`s, and the
//!   usual end-of-turn tokens (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, ...) when they are
//!   special tokens of the vocab -- the same rule as for GGUF vocabs.
//! - Decoding uses per-token bytes derived from the `tokenizer.json` decoder (see
//!   `decoder.rs` for the two documented corner cases where HF differs), so
//!   [`crate::TokenStreamDecoder`] works for byte-level BPE and for SentencePiece-style
//!   (Metaspace / byte-fallback) files alike.
//! - `clean_up_tokenization_spaces` is not applied (it is reported in
//!   [`HfText::clean_up_tokenization_spaces`]; current checkpoints set it false).
//! - Ids the model has beyond the tokenizer's vocabulary (embedding matrices are often padded)
//!   are refused by `decode` / `token_to_piece` with [`TextError::UnknownId`], never a panic;
//!   mask logits at and above [`Tokenizer::vocab_size`] to keep the sampler off them. An id
//!   inside the vocabulary that has no token (a gap in the ids) decodes to nothing, as in HF.
//! - The tokenizer's own BOS/EOS texts go to the chat template as `bos_token` / `eos_token`.

mod decoder;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::Value;

use crate::tokenizer::{AddSpecial, Engine, Parts};
use crate::{token_type, ChatTemplate, TextError, Tokenizer, VocabKind};

use decoder::{short, Alphabet, DecodePlan};

const TOKENIZER_JSON: &str = "tokenizer.json";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
const GENERATION_CONFIG: &str = "generation_config.json";
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Largest file read from a tokenizer directory (the biggest real tokenizer.json files are a
/// few tens of MB).
const MAX_FILE_BYTES: u64 = 512 << 20;

/// Ids may have gaps, but not so many that the id table would dwarf the vocabulary.
const MAX_ID_SLACK: usize = 1 << 16;

/// The contents of a tokenizer directory, as text. `tokenizer_json` is required.
#[derive(Debug, Clone, Copy, Default)]
pub struct HfSources<'a> {
    pub tokenizer_json: &'a str,
    pub tokenizer_config: Option<&'a str>,
    pub generation_config: Option<&'a str>,
    pub chat_template: Option<&'a str>,
}

/// What a Hugging Face tokenizer directory gives the engine.
#[derive(Debug)]
pub struct HfText {
    pub tokenizer: Tokenizer,
    /// The chat template (`chat_template.jinja`, else `tokenizer_config.json`), if any.
    pub template: Option<ChatTemplate>,
    /// The text of the BOS token (`tokenizer_config.json` `bos_token`).
    pub bos_token: Option<String>,
    /// The text of the EOS token (`tokenizer_config.json` `eos_token`).
    pub eos_token: Option<String>,
    /// `tokenizer_config.json` asks transformers to tidy spaces around punctuation on decode;
    /// flowrt does not (see the module docs).
    pub clean_up_tokenization_spaces: bool,
}

/// Load the tokenizer and chat template of a Hugging Face checkpoint directory.
pub fn load_dir(dir: &Path) -> Result<HfText, TextError> {
    let tokenizer_json = read(dir, TOKENIZER_JSON)?.ok_or_else(|| TextError::HfMissingFile {
        path: dir.join(TOKENIZER_JSON),
        why: "a Hugging Face tokenizer directory needs tokenizer.json \
              (older slow-tokenizer-only checkpoints are not supported)",
    })?;
    let tokenizer_config = read(dir, TOKENIZER_CONFIG)?;
    let generation_config = read(dir, GENERATION_CONFIG)?;
    let chat_template = read(dir, CHAT_TEMPLATE_FILE)?;
    load(&HfSources {
        tokenizer_json: &tokenizer_json,
        tokenizer_config: tokenizer_config.as_deref(),
        generation_config: generation_config.as_deref(),
        chat_template: chat_template.as_deref(),
    })
}

/// [`load_dir`] on files already in memory.
pub fn load(src: &HfSources<'_>) -> Result<HfText, TextError> {
    let config = match src.tokenizer_config {
        Some(text) => TokenizerConfig::parse(text)?,
        None => TokenizerConfig::default(),
    };
    let gen_eos = match src.generation_config {
        Some(text) => generation_eos(text)?,
        None => Vec::new(),
    };

    let head: Value = parse_json(TOKENIZER_JSON, src.tokenizer_json)?;
    check_post_processor(head.get("post_processor").unwrap_or(&Value::Null))?;
    let mut hf: tokenizers::Tokenizer = tokenizers::Tokenizer::from_str(src.tokenizer_json)
        .map_err(|e| TextError::HfJson {
            file: TOKENIZER_JSON.into(),
            message: format!("the tokenizers library refused it: {e}"),
        })?;
    // A file's truncation and padding settings (sentence-transformers' BERT tokenizer.json
    // files carry `truncation: 128` and fixed padding) would cut or pad every encode
    // silently: flowrt checks lengths itself and never pads.
    hf.with_truncation(None).map_err(|e| TextError::HfJson {
        file: TOKENIZER_JSON.into(),
        message: format!("cannot switch truncation off: {e}"),
    })?;
    hf.with_padding(None);
    let plan = DecodePlan::from_json(head.get("decoder").unwrap_or(&Value::Null))?;
    let model_type = head
        .pointer("/model/type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = match model_type {
        "BPE" if plan.is_byte_level() => VocabKind::ByteLevelBpe,
        "BPE" => VocabKind::SentencePieceBpe,
        "Unigram" => VocabKind::SentencePieceUnigram,
        "WordPiece" => VocabKind::WordPiece,
        other => {
            return Err(TextError::HfUnsupported {
                file: TOKENIZER_JSON.into(),
                what: format!(
                    "model type {other:?} (supported: \"BPE\", \"Unigram\", \"WordPiece\")"
                ),
            })
        }
    };

    // Id table: ids may have gaps (HF then decodes them to nothing).
    let vocab = hf.get_vocab(true);
    let n = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
    if n == 0 {
        return Err(TextError::HfField {
            file: TOKENIZER_JSON.into(),
            field: "model.vocab".into(),
            message: "the vocabulary is empty".into(),
        });
    }
    if n > vocab.len().saturating_mul(2).saturating_add(MAX_ID_SLACK) {
        return Err(TextError::HfField {
            file: TOKENIZER_JSON.into(),
            field: "model.vocab".into(),
            message: format!(
                "{} tokens with ids up to {}: the ids are too sparse to be a vocabulary",
                vocab.len(),
                n - 1
            ),
        });
    }
    let mut tokens = vec![String::new(); n];
    for (id, slot) in tokens.iter_mut().enumerate() {
        if let Some(t) = hf.id_to_token(id as u32) {
            *slot = t;
        }
    }
    let mut types = vec![token_type::NORMAL; n];
    for (id, added) in hf.get_added_tokens_decoder() {
        if let Some(t) = types.get_mut(id as usize) {
            *t = if added.special {
                token_type::CONTROL
            } else {
                token_type::USER_DEFINED
            };
        }
    }
    let alphabet = Alphabet::new();
    let pieces = tokens
        .iter()
        .map(|t| {
            if t.is_empty() {
                Vec::new()
            } else {
                plan.piece(t, &alphabet)
            }
        })
        .collect();

    let id_of = |field: &str, text: &Option<String>| -> Result<Option<u32>, TextError> {
        match text {
            None => Ok(None),
            Some(t) => hf
                .token_to_id(t)
                .map(Some)
                .ok_or_else(|| TextError::HfField {
                    file: TOKENIZER_CONFIG.into(),
                    field: field.into(),
                    message: format!("{t:?} is not a token of tokenizer.json"),
                }),
        }
    };
    let bos = id_of("bos_token", &config.bos_token)?;
    let eos = id_of("eos_token", &config.eos_token)?;
    for &id in &gen_eos {
        if id as usize >= n {
            return Err(TextError::HfField {
                file: GENERATION_CONFIG.into(),
                field: "eos_token_id".into(),
                message: format!("{id} is outside the tokenizer's {n} ids"),
            });
        }
    }
    let add_special = if config.add_bos.is_some() || config.add_eos.is_some() {
        AddSpecial::Flags {
            add_bos: config.add_bos.unwrap_or(false),
            add_eos: config.add_eos.unwrap_or(false),
        }
    } else {
        AddSpecial::PostProcessor
    };

    let tokenizer = Tokenizer::from_parts(Parts {
        kind,
        engine: Engine::Hf(Box::new(hf)),
        tokens: &tokens,
        types,
        pieces,
        bos,
        eos,
        eot: None,
        eom: None,
        add_special,
        strip_leading_space: plan.strip_leading_space,
        extra_eog: gen_eos,
    });

    let template_source = match src.chat_template {
        Some(t) => Some(t.to_string()),
        None => config.chat_template.clone(),
    };
    let template = match template_source {
        None => None,
        Some(source) => Some(ChatTemplate::new(
            &source,
            config.bos_token.as_deref().unwrap_or(""),
            config.eos_token.as_deref().unwrap_or(""),
        )?),
    };
    Ok(HfText {
        tokenizer,
        template,
        bos_token: config.bos_token,
        eos_token: config.eos_token,
        clean_up_tokenization_spaces: config.clean_up,
    })
}

/// The fields of `tokenizer_config.json` this crate uses.
#[derive(Debug, Default)]
struct TokenizerConfig {
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
    chat_template: Option<String>,
    clean_up: bool,
}

impl TokenizerConfig {
    fn parse(text: &str) -> Result<Self, TextError> {
        let v = parse_json(TOKENIZER_CONFIG, text)?;
        if !v.is_object() {
            return Err(TextError::HfJson {
                file: TOKENIZER_CONFIG.into(),
                message: format!("expected a JSON object, found {}", short(&v)),
            });
        }
        Ok(Self {
            bos_token: special_token(&v, "bos_token")?,
            eos_token: special_token(&v, "eos_token")?,
            add_bos: opt_bool(&v, "add_bos_token")?,
            add_eos: opt_bool(&v, "add_eos_token")?,
            chat_template: chat_template(&v)?,
            clean_up: opt_bool(&v, "clean_up_tokenization_spaces")?.unwrap_or(false),
        })
    }
}

fn config_field(field: &str, message: String) -> TextError {
    TextError::HfField {
        file: TOKENIZER_CONFIG.into(),
        field: field.into(),
        message,
    }
}

/// `"<s>"` or `{"content": "<s>", ...}` or null.
fn special_token(v: &Value, key: &str) -> Result<Option<String>, TextError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(obj @ Value::Object(_)) => match obj.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(config_field(
                key,
                format!("an object without a string \"content\": {}", short(obj)),
            )),
        },
        Some(other) => Err(config_field(
            key,
            format!(
                "expected a string or {{\"content\": ...}}, found {}",
                short(other)
            ),
        )),
    }
}

fn opt_bool(v: &Value, key: &str) -> Result<Option<bool>, TextError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(config_field(
            key,
            format!("expected true or false, found {}", short(other)),
        )),
    }
}

/// A string, or a list of `{name, template}` of which `default` is taken.
fn chat_template(v: &Value) -> Result<Option<String>, TextError> {
    match v.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            for (i, entry) in list.iter().enumerate() {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_string())),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(config_field(
                            &format!("chat_template[{i}]"),
                            format!(
                                "expected {{\"name\": ..., \"template\": ...}}, found {}",
                                short(entry)
                            ),
                        ))
                    }
                }
            }
            // Named templates only (tool_use, rag, ...): no template for plain chat.
            Ok(None)
        }
        Some(other) => Err(config_field(
            "chat_template",
            format!(
                "expected a string or a list of templates, found {}",
                short(other)
            ),
        )),
    }
}

/// `eos_token_id` of generation_config.json: an id, a list of ids, or absent.
fn generation_eos(text: &str) -> Result<Vec<u32>, TextError> {
    let v = parse_json(GENERATION_CONFIG, text)?;
    let bad = |found: &Value| TextError::HfField {
        file: GENERATION_CONFIG.into(),
        field: "eos_token_id".into(),
        message: format!(
            "expected a token id or a list of ids, found {}",
            short(found)
        ),
    };
    let id = |x: &Value| {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(x))
    };
    match v.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list.iter().map(id).collect(),
        Some(x) => Ok(vec![id(x)?]),
    }
}

/// A `TemplateProcessing` post-processor (alone or in a `Sequence`) whose `single` or `pair`
/// template names a special token missing from its `special_tokens` loads in the
/// `tokenizers` library but panics there on every encode that adds special tokens.
fn check_post_processor(pp: &Value) -> Result<(), TextError> {
    match pp.get("type").and_then(Value::as_str) {
        Some("Sequence") => {
            for p in pp
                .get("processors")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                check_post_processor(p)?;
            }
        }
        Some("TemplateProcessing") => {
            let known = pp.get("special_tokens").and_then(Value::as_object);
            for which in ["single", "pair"] {
                for piece in pp
                    .get(which)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let Some(id) = piece.pointer("/SpecialToken/id").and_then(Value::as_str) else {
                        continue;
                    };
                    if !known.is_some_and(|k| k.contains_key(id)) {
                        return Err(TextError::HfField {
                            file: TOKENIZER_JSON.into(),
                            field: format!("post_processor.{which}"),
                            message: format!(
                                "special token {id:?} is not in post_processor.special_tokens"
                            ),
                        });
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn parse_json(file: &str, text: &str) -> Result<Value, TextError> {
    serde_json::from_str(text).map_err(|e| TextError::HfJson {
        file: file.into(),
        message: format!("malformed JSON: {e}"),
    })
}

/// `dir/name` as text; `None` when it does not exist.
fn read(dir: &Path, name: &str) -> Result<Option<String>, TextError> {
    let path: PathBuf = dir.join(name);
    let io = |source| TextError::HfRead {
        path: path.clone(),
        source,
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(TextError::HfJson {
            file: path.display().to_string(),
            message: format!(
                "{} bytes is more than the {MAX_FILE_BYTES} a tokenizer file may have",
                meta.len()
            ),
        });
    }
    let bytes = std::fs::read(&path).map_err(io)?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| TextError::HfJson {
            file: path.display().to_string(),
            message: format!("not UTF-8 text: {e}"),
        })
}
