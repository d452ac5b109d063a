//! Constrained decoding: a per-sequence constraint that masks the logits at every step so the
//! output follows a JSON Schema (or any JSON object, a regular expression, a Lark grammar).
//!
//! Everything specific to `llguidance` (and its `toktrie` token trie) lives here:
//! - [`Guide`]: the token environment built once from a [`Tokenizer`] (each id's bytes, special
//!   tokens marked, the end-of-generation ids) and the model's logit count; cheap to clone.
//! - [`Constraint`]: one sequence's state, compiled from a [`ConstraintSpec`]; call
//!   [`Constraint::mask`] on the logits before sampling and [`Constraint::accept`] with the
//!   token sampled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_text::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

/// What the output must follow.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// A JSON Schema (draft 2020-12 keywords as `llguidance` supports them).
    JsonSchema(serde_json::Value),
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// A grammar in `llguidance`'s Lark dialect.
    Lark(String),
}

/// Why a constraint could not be built or followed.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The schema uses keywords the constraint cannot enforce (never silently ignored).
    #[error("the JSON schema uses unsupported keyword(s): {}", keywords.join(", "))]
    UnsupportedKeyword { keywords: Vec<String> },
    /// The schema is not a valid JSON Schema (wrong type of a keyword, unsatisfiable, ...).
    #[error("invalid JSON schema: {0}")]
    InvalidSchema(String),
    /// The regular expression or grammar does not compile.
    #[error("invalid {kind}: {reason}")]
    InvalidGrammar { kind: &'static str, reason: String },
    /// The vocabulary cannot back a constraint (no end-of-generation token, ...).
    #[error("constrained decoding is unavailable for this vocabulary: {0}")]
    Vocabulary(String),
    /// The constraint failed while generating (a token it did not allow, an internal error).
    #[error("constrained decoding failed: {0}")]
    Runtime(String),
}

/// JSON output style for schemas that do not set `x-guidance` themselves: fixed separators and
/// no free whitespace, so a sampled model cannot wander off into endless blank space.
fn default_json_options() -> serde_json::Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// The token environment and parser factory for one vocabulary. Build with [`Guide::new`]
/// (a [`crate::LoadedModel`] keeps one: [`crate::LoadedModel::guide`]) and compile any number
/// of constraints from it.
#[derive(Clone)]
pub struct Guide {
    factory: Arc<ParserFactory>,
    n_logits: usize,
    /// How long building the token trie and factory took.
    pub build_time: Duration,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide")
            .field("n_logits", &self.n_logits)
            .field("build_time", &self.build_time)
            .finish()
    }
}

/// The bytes of each id as `toktrie` wants them: the decoded bytes of normal tokens, special
/// (control/unknown) tokens as `0xFF` + their text so no text can produce them; ids past the
/// tokenizer's vocabulary (padded logit rows) are empty and never allowed.
fn token_words(tokenizer: &Tokenizer, n_logits: usize) -> Vec<Vec<u8>> {
    (0..n_logits as u32)
        .map(|id| {
            if tokenizer.is_special(id) || tokenizer.is_eog(id) {
                match tokenizer.id_to_token(id) {
                    Some(t) => {
                        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                        w.extend_from_slice(t.as_bytes());
                        w
                    }
                    None => Vec::new(),
                }
            } else {
                tokenizer
                    .token_to_piece(id)
                    .map(|p| p.to_vec())
                    .unwrap_or_default()
            }
        })
        .collect()
}

impl Guide {
    /// Build the token environment for `tokenizer` and a model with `n_logits` logits per step
    /// (at least the tokenizer's vocabulary; extra rows are never allowed).
    pub fn new(tokenizer: &Tokenizer, n_logits: usize) -> Result<Guide, ConstraintError> {
        let t0 = Instant::now();
        let eog = tokenizer.eog_ids();
        let Some(&first_eog) = eog.first() else {
            return Err(ConstraintError::Vocabulary(
                "it has no end-of-generation token".into(),
            ));
        };
        let eos = tokenizer
            .eos()
            .filter(|&e| tokenizer.is_eog(e))
            .unwrap_or(first_eog);
        if n_logits < tokenizer.vocab_size() || eog.iter().any(|&e| e as usize >= n_logits) {
            return Err(ConstraintError::Vocabulary(format!(
                "the model has {n_logits} logits but the tokenizer {} tokens",
                tokenizer.vocab_size()
            )));
        }
        let info = TokRxInfo {
            vocab_size: n_logits as u32,
            tok_eos: eos,
            tok_bos: tokenizer.bos(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let words = token_words(tokenizer, n_logits);
        let mut eos_list = vec![eos];
        eos_list.extend(eog.iter().copied().filter(|&e| e != eos));
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_list);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        // Errors come back as values; nothing on stderr.
        factory.quiet();
        Ok(Guide {
            factory: Arc::new(factory),
            n_logits,
            build_time: t0.elapsed(),
        })
    }

    /// The logits per step this guide masks.
    pub fn n_logits(&self) -> usize {
        self.n_logits
    }

    /// Compile `spec` into a fresh per-sequence constraint.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constraint, ConstraintError> {
        let t0 = Instant::now();
        let (grammar, kind) = match spec {
            ConstraintSpec::JsonSchema(schema) => {
                let mut schema = schema.clone();
                match &mut schema {
                    serde_json::Value::Object(o) => {
                        o.entry("x-guidance").or_insert_with(default_json_options);
                    }
                    serde_json::Value::Bool(_) => {}
                    other => {
                        return Err(ConstraintError::InvalidSchema(format!(
                            "a schema is a JSON object or a boolean, not {}",
                            json_type(other)
                        )))
                    }
                }
                (TopLevelGrammar::from_json_schema(schema), "schema")
            }
            ConstraintSpec::JsonObject => (
                TopLevelGrammar::from_json_schema(serde_json::json!({
                    "type": "object",
                    "x-guidance": default_json_options(),
                })),
                "schema",
            ),
            ConstraintSpec::Regex(rx) => (TopLevelGrammar::from_regex(rx), "regular expression"),
            ConstraintSpec::Lark(g) => (TopLevelGrammar::from_lark(g.clone()), "grammar"),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| compile_error(kind, &e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(compile_error(kind, &e));
        }
        Ok(Constraint {
            matcher,
            n_logits: self.n_logits,
            compile_time: t0.elapsed(),
        })
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Turn a compile error of `llguidance` into a typed one; unimplemented JSON Schema keywords
/// (`Unimplemented keys: ["a", "b"]`) are listed by name.
fn compile_error(kind: &'static str, msg: &str) -> ConstraintError {
    if kind == "schema" {
        if let Some(rest) = msg.split("Unimplemented keys: ").nth(1) {
            let list = rest.split(']').next().unwrap_or("");
            let keywords: Vec<String> = list
                .trim_start_matches('[')
                .split(',')
                .map(|k| k.trim().trim_matches('"').to_string())
                .filter(|k| !k.is_empty())
                .collect();
            if !keywords.is_empty() {
                return ConstraintError::UnsupportedKeyword { keywords };
            }
        }
        ConstraintError::InvalidSchema(msg.trim().to_string())
    } else {
        ConstraintError::InvalidGrammar {
            kind,
            reason: msg.trim().to_string(),
        }
    }
}

/// One sequence's constraint. Each step: [`Constraint::mask`] the logits, sample, then
/// [`Constraint::accept`] the token; stop when [`Constraint::is_finished`].
pub struct Constraint {
    matcher: Matcher,
    n_logits: usize,
    /// How long compiling the spec took.
    pub compile_time: Duration,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("n_logits", &self.n_logits)
            .field("finished", &self.is_finished())
            .field("compile_time", &self.compile_time)
            .finish()
    }
}

impl Constraint {
    /// Set the logit of every token the constraint does not allow next to -inf. When the
    /// constraint is finished only the end-of-generation tokens stay.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        if logits.len() != self.n_logits {
            return Err(ConstraintError::Runtime(format!(
                "{} logits, the constraint was built for {}",
                logits.len(),
                self.n_logits
            )));
        }
        let allowed: SimpleVob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::Runtime(e.to_string()))?;
        let n = logits.len();
        allowed.iter_unset_entries(|i| {
            if i < n {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        Ok(())
    }

    /// Advance past `token` (which the last mask allowed).
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Runtime(e.to_string()))
    }

    /// Whether the output is complete: nothing but end-of-generation may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far could end here (end-of-generation is allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// The logits per step this constraint masks.
    pub fn n_logits(&self) -> usize {
        self.n_logits
    }
}

/// A compiled constraint moves to the thread that decodes its sequence (the server compiles
/// on a blocking task and hands it to the model's scheduler thread); a guide is shared by every
/// thread that serves the model.
const _: () = {
    const fn send<T: Send>() {}
    const fn send_sync<T: Send + Sync>() {}
    send::<Constraint>();
    send_sync::<Guide>();
};
