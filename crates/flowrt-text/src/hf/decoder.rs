//! A `tokenizer.json` decoder, reduced to what [`crate::Tokenizer`] decodes with: the bytes
//! each token stands for, and whether one leading space is dropped from the decoded text.
//!
//! HF decoders work on the list of token strings; the ones in use by BPE and SentencePiece
//! style tokenizers either map every token on its own (`ByteLevel`, `Replace`,
//! `ByteFallback`, `Metaspace`, a `Strip` before `Fuse`) or act on the start of the whole
//! text (`Metaspace` on the first token, a `Strip` after `Fuse`). The first kind becomes the
//! token's piece; the second becomes the leading-space strip. `WordPiece` (BERT) is the
//! same shape: a continuation (`##ing`) is its text without the prefix, any other token a
//! space and its text, and the text's leading space is dropped; its `cleanup` (spaces
//! before punctuation removed) is not applied, like `clean_up_tokenization_spaces`. Anything
//! else (`BPEDecoder`, `CTC`, regex `Replace`) is refused by name rather than decoded
//! differently.
//!
//! Two known, documented differences with HF, both outside what valid generated text hits:
//! - HF's `ByteFallback` turns an invalid run of `<0xNN>` bytes into one U+FFFD per byte;
//!   flowrt's decoder (like `String::from_utf8_lossy`) gives one per invalid sequence.
//! - HF's `Metaspace` decoder drops every `▁` of the first token; flowrt drops only a
//!   leading one (SentencePiece tokens have `▁` only at the start).

use serde_json::Value;

use crate::tokenizer::build::{byte_alphabet, byte_token};
use crate::TextError;

const FILE: &str = "tokenizer.json";

/// One step of a decoder, applied to every token.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Replace {
        from: String,
        to: String,
    },
    ByteFallback,
    ByteLevel,
    /// `▁` (the replacement) becomes a space.
    Metaspace {
        replacement: char,
    },
    /// Drop up to `start` leading and `stop` trailing `content` characters of each token.
    StripEach {
        content: char,
        start: usize,
        stop: usize,
    },
    /// WordPiece: `prefix` marks a continuation; other tokens start a word (a space).
    WordPiece {
        prefix: String,
    },
}

/// What decoding with a `tokenizer.json` decoder comes down to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DecodePlan {
    steps: Vec<Step>,
    /// Drop one leading space from the decoded text.
    pub strip_leading_space: bool,
    /// No decoder: HF joins the tokens with spaces.
    join_with_spaces: bool,
}

impl DecodePlan {
    /// `decoder` is the `"decoder"` value of tokenizer.json (`null` when absent).
    pub(crate) fn from_json(decoder: &Value) -> Result<Self, TextError> {
        let mut plan = DecodePlan {
            steps: Vec::new(),
            strip_leading_space: false,
            join_with_spaces: false,
        };
        if decoder.is_null() {
            // HF: tokens.join(" "), i.e. a space before every token but the first.
            plan.join_with_spaces = true;
            plan.strip_leading_space = true;
            return Ok(plan);
        }
        let mut fused = false;
        plan.add(decoder, &mut fused)?;
        Ok(plan)
    }

    fn add(&mut self, d: &Value, fused: &mut bool) -> Result<(), TextError> {
        let kind = d.get("type").and_then(Value::as_str).ok_or_else(|| {
            field(
                "decoder.type",
                format!(
                    "expected a decoder object with a \"type\", found {}",
                    short(d)
                ),
            )
        })?;
        match kind {
            "Sequence" => {
                let list = d
                    .get("decoders")
                    .and_then(Value::as_array)
                    .ok_or_else(|| field("decoder.decoders", "expected a list".into()))?;
                for sub in list {
                    self.add(sub, fused)?;
                }
            }
            "ByteLevel" => self.steps.push(Step::ByteLevel),
            "WordPiece" => {
                let prefix = match d.get("prefix") {
                    None | Some(Value::Null) => "##",
                    Some(v) => v.as_str().filter(|p| !p.is_empty()).ok_or_else(|| {
                        field(
                            "decoder WordPiece.prefix",
                            format!("expected a non-empty string, found {}", short(v)),
                        )
                    })?,
                };
                self.steps.push(Step::WordPiece {
                    prefix: prefix.to_string(),
                });
                self.strip_leading_space = true;
            }
            "ByteFallback" => self.steps.push(Step::ByteFallback),
            "Fuse" => *fused = true,
            "Replace" => {
                let from = d
                    .get("pattern")
                    .and_then(|p| p.get("String"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| unsupported("a Replace decoder with a regex pattern"))?;
                let to = d
                    .get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| field("decoder Replace.content", "expected a string".into()))?;
                if from.is_empty() {
                    return Err(field("decoder Replace.pattern", "empty pattern".into()));
                }
                self.steps.push(Step::Replace {
                    from: from.to_string(),
                    to: to.to_string(),
                });
            }
            "Metaspace" => {
                let replacement = one_char(d, "replacement", '▁')?;
                // `prepend_scheme` (tokenizers >= 0.14) or `add_prefix_space` (older files).
                let strips = match d.get("prepend_scheme").and_then(Value::as_str) {
                    Some(scheme) => scheme != "never",
                    None => d
                        .get("add_prefix_space")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                };
                self.steps.push(Step::Metaspace { replacement });
                self.strip_leading_space |= strips;
            }
            "Strip" => {
                let content = one_char(d, "content", ' ')?;
                let count = |key: &str| -> Result<usize, TextError> {
                    match d.get(key) {
                        None | Some(Value::Null) => Ok(0),
                        Some(v) => {
                            v.as_u64()
                                .and_then(|n| usize::try_from(n).ok())
                                .ok_or_else(|| {
                                    field(
                                        &format!("decoder Strip.{key}"),
                                        "expected a count".into(),
                                    )
                                })
                        }
                    }
                };
                let (start, stop) = (count("start")?, count("stop")?);
                if !*fused {
                    self.steps.push(Step::StripEach {
                        content,
                        start,
                        stop,
                    });
                } else if content == ' ' && start <= 1 && stop == 0 {
                    self.strip_leading_space |= start == 1;
                } else {
                    return Err(unsupported(&format!(
                        "a Strip decoder after Fuse other than one leading space \
                         (content {content:?}, start {start}, stop {stop})"
                    )));
                }
            }
            other => {
                return Err(unsupported(&format!("the {other} decoder")));
            }
        }
        Ok(())
    }

    /// Whether the decoder maps tokens through the GPT-2 byte alphabet.
    pub(crate) fn is_byte_level(&self) -> bool {
        self.steps.contains(&Step::ByteLevel)
    }

    /// The bytes `token` stands for in decoded text.
    pub(crate) fn piece(&self, token: &str, alphabet: &Alphabet) -> Vec<u8> {
        enum State {
            Text(String),
            Bytes(Vec<u8>),
        }
        let mut state = State::Text(token.to_string());
        for step in &self.steps {
            let State::Text(text) = &mut state else {
                // Bytes from ByteFallback / ByteLevel: text steps after them do not apply
                // to a single byte or a lone character, as in HF they see the same bytes.
                continue;
            };
            match step {
                Step::Replace { from, to } => *text = text.replace(from.as_str(), to),
                Step::Metaspace { replacement } => *text = text.replace(*replacement, " "),
                Step::ByteFallback => {
                    if text.len() == 6 {
                        if let Some(b) = byte_token(text) {
                            state = State::Bytes(vec![b]);
                        }
                    }
                }
                Step::ByteLevel => state = State::Bytes(alphabet.decode(text)),
                Step::StripEach {
                    content,
                    start,
                    stop,
                } => *text = strip_each(text, *content, *start, *stop),
                Step::WordPiece { prefix } => {
                    *text = match text.strip_prefix(prefix.as_str()) {
                        Some(rest) => rest.to_string(),
                        None => format!(" {text}"),
                    }
                }
            }
        }
        let mut bytes = match state {
            State::Text(t) => t.into_bytes(),
            State::Bytes(b) => b,
        };
        if self.join_with_spaces {
            bytes.insert(0, b' ');
        }
        bytes
    }
}

/// The GPT-2 byte alphabet and its inverse.
pub(crate) struct Alphabet {
    inverse: std::collections::HashMap<char, u8>,
}

impl Alphabet {
    pub(crate) fn new() -> Self {
        let inverse = byte_alphabet()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        Self { inverse }
    }

    /// HF's ByteLevel decoding of one token: its bytes when every character is in the
    /// alphabet, else the token's own UTF-8 (an added token written as plain text).
    fn decode(&self, token: &str) -> Vec<u8> {
        token
            .chars()
            .map(|c| self.inverse.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
            .unwrap_or_else(|| token.as_bytes().to_vec())
    }
}

fn strip_each(text: &str, content: char, start: usize, stop: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    let lead = chars
        .iter()
        .take(start)
        .take_while(|&&c| c == content)
        .count();
    let rest = &chars[lead..];
    let trail = rest
        .iter()
        .rev()
        .take(stop)
        .take_while(|&&c| c == content)
        .count();
    rest[..rest.len() - trail].iter().collect()
}

fn one_char(d: &Value, key: &str, default: char) -> Result<char, TextError> {
    match d.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => {
            let s = v.as_str().unwrap_or("");
            let mut it = s.chars();
            match (it.next(), it.next()) {
                (Some(c), None) => Ok(c),
                _ => Err(field(
                    &format!("decoder.{key}"),
                    format!("expected one character, found {}", short(v)),
                )),
            }
        }
    }
}

fn field(name: &str, message: String) -> TextError {
    TextError::HfField {
        file: FILE.into(),
        field: name.into(),
        message,
    }
}

fn unsupported(what: &str) -> TextError {
    TextError::HfUnsupported {
        file: FILE.into(),
        what: what.into(),
    }
}

/// A JSON value for an error message, cut to a readable length.
pub(crate) fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pieces(decoder: Value, tokens: &[&str]) -> (Vec<Vec<u8>>, bool) {
        let plan = DecodePlan::from_json(&decoder).unwrap();
        let a = Alphabet::new();
        (
            tokens.iter().map(|t| plan.piece(t, &a)).collect(),
            plan.strip_leading_space,
        )
    }

    #[test]
    fn llama_sequence() {
        let d = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        let (p, strip) = pieces(d, &["▁hi", "<0xE2>", "<0x4>", "a▁b"]);
        assert_eq!(
            p,
            [
                b" hi".to_vec(),
                vec![0xE2],
                b"<0x4>".to_vec(),
                b"a b".to_vec()
            ]
        );
        assert!(strip);
    }

    #[test]
    fn byte_level_and_raw_added_tokens() {
        let (p, strip) = pieces(json!({"type": "ByteLevel"}), &["Ġthe", "Ċ", "<x y>"]);
        assert_eq!(p, [b" the".to_vec(), b"\n".to_vec(), b"<x y>".to_vec()]);
        assert!(!strip);
    }

    #[test]
    fn no_decoder_joins_with_spaces() {
        let (p, strip) = pieces(Value::Null, &["a", "b"]);
        assert_eq!(p, [b" a".to_vec(), b" b".to_vec()]);
        assert!(strip);
    }

    #[test]
    fn wordpiece_continuations_join_and_words_get_a_space() {
        let (p, strip) = pieces(
            json!({"type": "WordPiece", "prefix": "##", "cleanup": true}),
            &["hello", "##world", "[CLS]", "."],
        );
        assert_eq!(
            p,
            [
                b" hello".to_vec(),
                b"world".to_vec(),
                b" [CLS]".to_vec(),
                b" .".to_vec()
            ]
        );
        assert!(strip);
        let e = DecodePlan::from_json(&json!({"type": "WordPiece", "prefix": ""})).unwrap_err();
        assert!(matches!(e, TextError::HfField { .. }), "{e}");
    }

    #[test]
    fn unsupported_decoders_are_named() {
        for d in [
            json!({"type": "CTC", "pad_token": "<pad>"}),
            json!({"type": "Replace", "pattern": {"Regex": "x"}, "content": ""}),
            json!({"type": "Sequence", "decoders": [{"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}),
        ] {
            let e = DecodePlan::from_json(&d).unwrap_err();
            assert!(matches!(e, TextError::HfUnsupported { .. }), "{e}");
        }
        for d in [
            json!(3),
            json!({"type": "Sequence"}),
            json!({"type": "Metaspace", "replacement": "ab"}),
        ] {
            let e = DecodePlan::from_json(&d).unwrap_err();
            assert!(matches!(e, TextError::HfField { .. }), "{e}");
        }
    }
}
