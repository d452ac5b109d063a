//! Tool calling under a constraint: the grammar that makes a model's answer a tool call in its
//! [`ToolFormat`], with the function name one of the request's tools and the arguments valid
//! against that tool's `parameters` schema.
//!
//! The grammar is `llguidance` Lark: one alternative per tool, each a fixed literal prefix that
//! carries the name (`{"name": "f", "arguments": `) followed by `%json { parameters }` and the
//! closing `}`, so the name decides which schema the arguments follow. JSON inside is compact
//! and fixed (`": "` between key and value, `", "` between items, no other whitespace), the
//! same style as a plain JSON Schema constraint, so a sampled model cannot wander.
//!
//! What each [`ToolChoice`] allows, per format:
//! - `Required`: nothing but calls. Hermes: one `<tool_call>` block (with `parallel`, one or more
//!   separated by `\n`); Mistral: `[TOOL_CALLS]` and a list of one call (with `parallel`, one or
//!   more); Llama3Json: one call, optionally after `<|python_tag|>` (the format has one call per
//!   message, `parallel` does not change it); Generic: `{"tool_calls": [...]}` with one call
//!   (with `parallel`, one or more).
//! - `Named(f)`: as `Required` with `f` the only tool.
//! - `Auto`: Hermes and Mistral: free text without the opening marker; once the marker appears
//!   (the first `<tool_call>` / `[TOOL_CALLS]`, found by a lazy lexeme) the rest of the output
//!   must be the calls, and nothing may follow them. Llama3Json: either free text that does not
//!   begin with `{` (after optional whitespace) and holds no `<|python_tag|>`, or a whole call.
//!   Generic: the `tool_calls` object or `{"content": "text"}`. With no tools, `Auto` is
//!   unconstrained.
//! - `None`: no constraint.
//!
//! Harmony (gpt-oss) calls are messages after the reasoning: `Auto` is not constrained (the
//! output is parsed), `Required` and `Named` are refused ([`ToolGrammarError::Unsupported`]).
//!
//! Markers (`<tool_call>`, `</tool_call>`, `<|python_tag|>`, `[TOOL_CALLS]`) are written as
//! text unless [`ToolMarkers`] says the vocabulary has them as special (control) tokens; then
//! the grammar asks for that token id. Note that generation decodes its text with special
//! tokens skipped, so a marker emitted as a control token does not appear in the output text.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use flowrt_text::{Tokenizer, ToolFormat};
use serde_json::{json, Value};

use crate::constraint::{Constraint, ConstraintError, ConstraintSpec, Guide};

/// One function the model may call (OpenAI `tools[i].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema for the arguments object; `null` means the function takes no arguments.
    pub parameters: Value,
}

/// OpenAI `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides between text and calls.
    Auto,
    /// No calls: the output is not constrained by the tools.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
}

/// Why the tools of a request cannot be turned into a constraint. Every variant is the
/// client's doing (a 400), except [`ToolGrammarError::Grammar`], which would be a bug here.
#[derive(Debug, thiserror::Error)]
pub enum ToolGrammarError {
    /// A tool's `parameters` is not a usable JSON Schema (names the keyword when unsupported).
    #[error("tools[{index}].function.parameters (function {name:?}): {source}")]
    Parameters {
        index: usize,
        name: String,
        #[source]
        source: ConstraintError,
    },
    /// A tool's name is empty, too long, holds control characters or repeats another's.
    #[error("tools[{index}].function.name {name:?}: {reason}")]
    InvalidName {
        index: usize,
        name: String,
        reason: &'static str,
    },
    /// `tool_choice` names a function that is not among the tools.
    #[error("tool_choice names the function {name:?}, which is not among the tools")]
    UnknownFunction { name: String },
    /// `tool_choice: "required"` with an empty tool list.
    #[error("tool_choice is \"required\" but no tools were given")]
    NoTools,
    /// The format has no call grammar for this choice yet (harmony: only `auto`, which is
    /// not constrained).
    #[error("tool_choice {choice} is not supported for the {format} tool-call format yet (use auto or none)")]
    Unsupported {
        format: &'static str,
        choice: &'static str,
    },
    /// The assembled grammar did not compile.
    #[error("the tool-call grammar does not compile: {0}")]
    Grammar(#[source] ConstraintError),
}

/// The marker strings of the formats.
const MARKERS: [&str; 4] = [
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
];

/// Longest function name accepted (OpenAI allows 64).
const MAX_NAME_CHARS: usize = 64;

/// Which format markers the vocabulary holds as special (control) tokens, by id. Markers not
/// listed are written as text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolMarkers {
    special: HashMap<String, u32>,
}

impl ToolMarkers {
    /// Every marker as plain text (vocabularies without tool tokens, or where those tokens are
    /// ordinary ones).
    pub fn text() -> ToolMarkers {
        ToolMarkers::default()
    }

    /// The markers that `tokenizer` has as a single special (control) token.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> ToolMarkers {
        let special = MARKERS
            .iter()
            .filter_map(|m| {
                let id = tokenizer.token_to_id(m)?;
                tokenizer.is_special(id).then(|| (m.to_string(), id))
            })
            .collect();
        ToolMarkers { special }
    }

    /// Treat `marker` as the special token `id`.
    pub fn with_special(mut self, marker: &str, id: u32) -> ToolMarkers {
        self.special.insert(marker.to_string(), id);
        self
    }

    /// The special token id of `marker`, if it is one.
    pub fn special(&self, marker: &str) -> Option<u32> {
        self.special.get(marker).copied()
    }

    /// `marker` as a Lark atom: the token id, or the literal text.
    fn atom(&self, marker: &str) -> String {
        match self.special(marker) {
            Some(id) => format!("<[{id}]>"),
            None => lark_str(marker),
        }
    }
}

/// A Lark (JSON-syntax) string literal for `s`. Callers make sure `s` holds no U+007F, which
/// the Lark lexer does not take unescaped and `serde_json` does not escape.
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The JSON Schema the arguments of `tool` follow, with the fixed JSON style added, or why
/// `parameters` cannot be one.
fn arguments_schema(tool: &ToolDef) -> Result<Value, ConstraintError> {
    let mut schema = match &tool.parameters {
        // No parameters: the empty object only.
        Value::Null => json!({"type": "object", "properties": {}, "additionalProperties": false}),
        Value::Bool(true) => json!({"type": "object"}),
        Value::Bool(false) => {
            return Err(ConstraintError::InvalidSchema(
                "the schema `false` allows no arguments at all".into(),
            ))
        }
        Value::Object(_) => tool.parameters.clone(),
        other => {
            return Err(ConstraintError::InvalidSchema(format!(
                "a schema is a JSON object, not {}",
                match other {
                    Value::Number(_) => "a number",
                    Value::String(_) => "a string",
                    _ => "an array",
                }
            )))
        }
    };
    let Value::Object(o) = &mut schema else {
        return Err(ConstraintError::InvalidSchema(
            "a schema is a JSON object".into(),
        ));
    };
    match o.get("type") {
        None => {
            o.insert("type".into(), json!("object"));
        }
        Some(Value::String(t)) if t == "object" => {}
        Some(t) => {
            return Err(ConstraintError::InvalidSchema(format!(
                "the arguments are a JSON object, but the schema has \"type\": {t}"
            )))
        }
    }
    o.entry("x-guidance").or_insert_with(
        || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
    );
    Ok(schema)
}

fn check_name(
    index: usize,
    name: &str,
    seen: &mut HashSet<String>,
) -> Result<(), ToolGrammarError> {
    let bad = |reason| ToolGrammarError::InvalidName {
        index,
        name: name.to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(bad("a function name is not empty"));
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(bad("a function name has at most 64 characters"));
    }
    if name.chars().any(char::is_control) {
        return Err(bad("a function name holds no control characters"));
    }
    if !seen.insert(name.to_string()) {
        return Err(bad("two tools have this name"));
    }
    Ok(())
}

/// A tool a call may use: its index in the request, name and prepared arguments schema.
type Selected = (usize, String, Value);

/// The tools a call may use under `choice` with their prepared argument schemas, or `None`
/// when there is no constraint.
fn selected(
    tools: &[ToolDef],
    choice: &ToolChoice,
) -> Result<Option<Vec<Selected>>, ToolGrammarError> {
    let mut seen = HashSet::new();
    for (i, t) in tools.iter().enumerate() {
        check_name(i, &t.name, &mut seen)?;
    }
    let picked: Vec<usize> = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Auto if tools.is_empty() => return Ok(None),
        ToolChoice::Auto => (0..tools.len()).collect(),
        ToolChoice::Required if tools.is_empty() => return Err(ToolGrammarError::NoTools),
        ToolChoice::Required => (0..tools.len()).collect(),
        ToolChoice::Named(f) => match tools.iter().position(|t| &t.name == f) {
            Some(i) => vec![i],
            None => return Err(ToolGrammarError::UnknownFunction { name: f.clone() }),
        },
    };
    // Every tool's schema is checked, also those a named choice leaves out: the request is
    // either valid or not.
    let mut schemas = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let s = arguments_schema(t).map_err(|source| ToolGrammarError::Parameters {
            index: i,
            name: t.name.clone(),
            source,
        })?;
        schemas.push(s);
    }
    Ok(Some(
        picked
            .into_iter()
            .map(|i| (i, tools[i].name.clone(), schemas[i].clone()))
            .collect(),
    ))
}

/// The Lark grammar for the calls, or `None` when the output is not constrained.
fn grammar(
    format: ToolFormat,
    tools: &[Selected],
    choice: &ToolChoice,
    parallel: bool,
    markers: &ToolMarkers,
) -> Option<String> {
    let auto = matches!(choice, ToolChoice::Auto);
    let args_key = match format {
        ToolFormat::Llama3Json => "parameters",
        _ => "arguments",
    };
    let mut g = String::new();
    // One alternative per tool: the name fixes the schema.
    let alts: Vec<String> = (0..tools.len()).map(|k| format!("tool_{k}")).collect();
    let _ = writeln!(g, "call: {}", alts.join(" | "));
    for (k, (_, name, schema)) in tools.iter().enumerate() {
        let prefix = format!(
            "{{\"name\": {}, \"{args_key}\": ",
            serde_json::to_string(name).unwrap_or_default()
        );
        let _ = writeln!(
            g,
            "tool_{k}: {} %json {} \"}}\"",
            lark_str(&prefix),
            serde_json::to_string(schema).unwrap_or_default()
        );
    }
    let start = match format {
        ToolFormat::Hermes => {
            let (open, close) = (markers.atom("<tool_call>"), markers.atom("</tool_call>"));
            let _ = writeln!(g, "body: \"\\n\" call \"\\n\" {close}");
            let _ = writeln!(g, "block: {open} body");
            let more = if parallel { " (\"\\n\" block)*" } else { "" };
            if !auto {
                format!("block{more}")
            } else {
                text_or_marker(&mut g, markers, "<tool_call>", &format!("body{more}"))
            }
        }
        ToolFormat::Mistral => {
            let list = if parallel {
                "\"[\" call (\", \" call)* \"]\""
            } else {
                "\"[\" call \"]\""
            };
            let _ = writeln!(g, "list: {list}");
            if !auto {
                format!("{} list", markers.atom("[TOOL_CALLS]"))
            } else {
                text_or_marker(&mut g, markers, "[TOOL_CALLS]", "list")
            }
        }
        ToolFormat::Llama3Json => {
            let tag = markers.atom("<|python_tag|>");
            if !auto {
                format!("{tag}? call")
            } else {
                // Text is anything that cannot be read as the start of a call.
                // (The tag's text is refused even where the tag is a special token.)
                let _ = writeln!(
                    g,
                    "PLAIN: /(.|\\n)+/ & ~(/[ \\t\\r\\n]*/ \"{{\" /(.|\\n)*/) \
                     & ~(/(.|\\n)*/ \"<|python_tag|>\" /(.|\\n)*/)"
                );
                format!("PLAIN? | {tag}? call")
            }
        }
        // Refused before (see `tool_call_constraint_with`).
        ToolFormat::Harmony => return None,
        ToolFormat::Generic => {
            let calls = if parallel {
                "call (\", \" call)*"
            } else {
                "call"
            };
            let _ = writeln!(
                g,
                "tool_calls: {} {calls} \"]}}\"",
                lark_str("{\"tool_calls\": [")
            );
            if auto {
                let _ = writeln!(
                    g,
                    "content: {} %json {{\"type\": \"string\"}} \"}}\"",
                    lark_str("{\"content\": ")
                );
                "tool_calls | content".to_string()
            } else {
                "tool_calls".to_string()
            }
        }
    };
    Some(format!("start: {start}\n{g}"))
}

/// `Auto` for a format whose calls begin with `marker` and may follow text: either text that
/// never holds the marker, or text up to the first marker and then `rest` (the calls), which
/// ends the output. A text marker is found by a lazy lexeme (text and marker in one, ending
/// at the marker's first occurrence); a special-token marker simply follows the text.
fn text_or_marker(g: &mut String, markers: &ToolMarkers, marker: &str, rest: &str) -> String {
    let m = lark_str(marker);
    // Text never holds the marker's text, also where the marker is a special token (so no
    // text can pass for a call).
    let _ = writeln!(g, "PLAIN: /(.|\\n)+/ & ~(/(.|\\n)*/ {m} /(.|\\n)*/)");
    match markers.special(marker) {
        Some(id) => format!("PLAIN? | PLAIN? <[{id}]> {rest}"),
        None => {
            let _ = writeln!(g, "head[lazy]: /(.|\\n)*/ {m}");
            format!("PLAIN? | head {rest}")
        }
    }
}

/// The constraint that makes the output follow `choice` over `tools` in `format`, with every
/// marker written as text (see [`tool_call_constraint_with`] for vocabularies that hold them as
/// special tokens). `Ok(None)`: the output is not constrained (`ToolChoice::None`, or `Auto`
/// without tools). This checks names, the choice and the shape of each `parameters`; only
/// compiling (see [`check_tools`]) finds unsupported schema keywords.
pub fn tool_call_constraint(
    format: ToolFormat,
    tools: &[ToolDef],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Option<ConstraintSpec>, ToolGrammarError> {
    tool_call_constraint_with(&ToolMarkers::text(), format, tools, choice, parallel)
}

/// [`tool_call_constraint`] with the markers `markers` says are special tokens asked for by id.
pub fn tool_call_constraint_with(
    markers: &ToolMarkers,
    format: ToolFormat,
    tools: &[ToolDef],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Option<ConstraintSpec>, ToolGrammarError> {
    let Some(sel) = selected(tools, choice)? else {
        return Ok(None);
    };
    if format == ToolFormat::Harmony {
        // Harmony calls are messages after the model's reasoning; `auto` leaves the model
        // free (its output is parsed), a forced call has no grammar yet.
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            ToolChoice::Required => Err(ToolGrammarError::Unsupported {
                format: format.name(),
                choice: "required",
            }),
            ToolChoice::Named(_) => Err(ToolGrammarError::Unsupported {
                format: format.name(),
                choice: "named",
            }),
        };
    }
    Ok(grammar(format, &sel, choice, parallel, markers).map(ConstraintSpec::Lark))
}

/// Everything a server checks before generating: builds the constraint for `tools` and
/// `choice` (markers as `guide`'s vocabulary has them: pass
/// [`ToolMarkers::from_tokenizer`]), compiles every tool's `parameters` on its own so an
/// unsupported or malformed schema is reported with the tool's index and the keyword, then
/// compiles the whole grammar once. Returns the compiled constraint to generate with.
pub fn check_tools(
    guide: &Guide,
    markers: &ToolMarkers,
    format: ToolFormat,
    tools: &[ToolDef],
    choice: &ToolChoice,
    parallel: bool,
) -> Result<Option<Constraint>, ToolGrammarError> {
    let Some(spec) = tool_call_constraint_with(markers, format, tools, choice, parallel)? else {
        return Ok(None);
    };
    for (i, t) in tools.iter().enumerate() {
        // Shapes were checked while building; compiling finds keywords and invalid values.
        let schema = arguments_schema(t).map_err(|source| ToolGrammarError::Parameters {
            index: i,
            name: t.name.clone(),
            source,
        })?;
        guide
            .compile(&ConstraintSpec::JsonSchema(schema))
            .map_err(|source| ToolGrammarError::Parameters {
                index: i,
                name: t.name.clone(),
                source,
            })?;
    }
    guide
        .compile(&spec)
        .map(Some)
        .map_err(ToolGrammarError::Grammar)
}
