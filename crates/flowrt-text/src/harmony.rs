//! The harmony chat format (gpt-oss): every message has a header and a body,
//! `<|start|>ROLE<|channel|>CHANNEL<|message|>BODY<|end|>`, and an assistant turn is a
//! sequence of such messages ending with `<|return|>` (an answer) or `<|call|>` (a tool call).
//!
//! What the channels mean, as flowrt maps them:
//! - `analysis`: the model's reasoning (`reasoning_content`, Ollama's `thinking`);
//! - `final`: the answer (content);
//! - `commentary` without a recipient: a preamble to the user, also content;
//! - a message with a recipient `to=functions.NAME` (in the header's role part, e.g.
//!   `<|start|>assistant to=functions.f<|channel|>commentary json<|message|>`, or after the
//!   channel, `<|channel|>commentary to=functions.f <|constrain|>json<|message|>`): a call of
//!   `NAME` whose body is the JSON arguments object.
//!
//! The generation prompt ends with `<|start|>assistant`, so the output begins with the rest of
//! a header (`<|channel|>...`). `<|return|>` and `<|call|>` end the turn: they are
//! end-of-generation tokens, so they normally never reach the text; the end of the output
//! ends the last message. `<|end|>` ends a message but not the turn.
//!
//! [`HarmonyParser`] reads an output as it streams; [`parse_harmony`] reads a whole one (the
//! same result for any split of the text). Output that does not follow the format (an unknown
//! channel, a recipient that is not a function, arguments that are not a JSON object, text
//! between messages, an output that ends inside a header) is never dropped: from the
//! offending message on, the raw text is content, and the error says why.

use serde_json::Value;

use crate::tools::ParsedCall;

/// Opens a message (followed by the role).
pub const START: &str = "<|start|>";
/// Opens the channel part of a header.
pub const CHANNEL: &str = "<|channel|>";
/// Ends a header; the body follows.
pub const MESSAGE: &str = "<|message|>";
/// Ends a message (not the turn).
pub const END: &str = "<|end|>";
/// Ends the turn after an answer.
pub const RETURN: &str = "<|return|>";
/// Ends the turn after a tool call.
pub const CALL: &str = "<|call|>";
/// Precedes a call body's content type (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";

/// The namespace of the functions a client declares (`to=functions.NAME`).
pub const FUNCTIONS: &str = "functions.";

/// The longest header (the text between a message's start and `<|message|>`) accepted; a
/// longer one is not harmony.
pub const MAX_HEADER_BYTES: usize = 512;

/// Whether a model writes harmony: its chat template mentions both `<|channel|>` and
/// `<|message|>`, or (with no template) its vocabulary holds `<|channel|>`, `<|message|>`,
/// `<|return|>` and `<|call|>` as tokens.
pub fn detect<'a>(
    template_source: Option<&str>,
    token_texts: impl IntoIterator<Item = &'a str>,
) -> bool {
    if let Some(t) = template_source {
        return t.contains(CHANNEL) && t.contains(MESSAGE);
    }
    let mut seen = [false; 4];
    for tok in token_texts {
        for (i, m) in [CHANNEL, MESSAGE, RETURN, CALL].iter().enumerate() {
            seen[i] |= tok == *m;
        }
        if seen.iter().all(|&s| s) {
            return true;
        }
    }
    false
}

/// Why (part of) a harmony output could not be read. The text in question is kept as
/// content (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HarmonyError {
    /// A header names a channel other than analysis, commentary and final.
    #[error("message {index} is on the unknown channel {channel:?}")]
    UnknownChannel { index: usize, channel: String },
    /// A header that cannot be read (no channel, another role than the assistant, a marker
    /// inside it, too long).
    #[error("message {index} has a malformed header: {message}")]
    BadHeader { index: usize, message: String },
    /// Text between messages that does not start a new one.
    #[error("text after message {index} does not start a new message")]
    Stray { index: usize },
    /// A recipient that is not `functions.NAME`.
    #[error("message {index} is addressed to {recipient:?}, which is not a declared function")]
    BadRecipient { index: usize, recipient: String },
    /// A call while no tools were offered.
    #[error("message {index} calls {name:?}, but no tools were offered")]
    UnexpectedCall { index: usize, name: String },
    /// A call's body is not JSON.
    #[error("the arguments of call {index} are not valid JSON: {message}")]
    BadJson { index: usize, message: String },
    /// A call's body is JSON but not an object.
    #[error("the arguments of call {index} are not a JSON object")]
    NotObject { index: usize },
    /// The output ended inside a header, or (cut short) inside a call.
    #[error("the output ended inside message {index}")]
    Unterminated { index: usize },
}

/// What a [`HarmonyParser`] releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HarmonyDelta {
    /// Text of the analysis channel.
    Reasoning(String),
    /// Text of the final channel, of commentary without a recipient, or raw text that could
    /// not be read.
    Content(String),
    /// A complete call.
    Call(ParsedCall),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Reading a header up to `<|message|>` (the role may be known already).
    Header,
    /// Inside a body.
    Body(Body),
    /// After a message: whitespace, then `<|start|>` (or `<|channel|>`) opens the next.
    Between,
    /// Something could not be read: the rest is content.
    Failed,
}

/// Markers that end a body: the message terminators, and the start of a new header (a model
/// that skips `<|end|>`).
const BODY_ENDS: [&str; 5] = [END, RETURN, CALL, START, CHANNEL];

/// Splits a harmony output into reasoning, content and calls as it is generated.
///
/// Reasoning and content stream as they arrive, less a trailing possible prefix of a marker
/// (held until the next text decides it). A call is released when its body ends (a marker, or
/// the end of the output). The parser never panics on any input.
#[derive(Clone, Debug)]
pub struct HarmonyParser {
    state: State,
    buf: String,
    /// Raw text of the current message so far (from its start marker, if any), for the
    /// content of a message that cannot be read.
    raw: String,
    /// Bytes of the output before `buf[0]`.
    base: usize,
    /// Offset in the output where the current message started.
    msg_start: usize,
    /// Offset where the first call message started.
    first_call: Option<usize>,
    /// Index of the current message (0-based).
    index: usize,
    calls_allowed: bool,
    calls: usize,
    error: Option<HarmonyError>,
}

impl HarmonyParser {
    /// A parser for the output that follows a generation prompt ending in
    /// `<|start|>assistant` (the output starts with the rest of the header). `calls_allowed`:
    /// tools were offered; otherwise a call is an [`HarmonyError::UnexpectedCall`] and its
    /// text content.
    pub fn new(calls_allowed: bool) -> Self {
        Self {
            state: State::Header,
            buf: String::new(),
            raw: String::new(),
            base: 0,
            msg_start: 0,
            first_call: None,
            index: 0,
            calls_allowed,
            calls: 0,
            error: None,
        }
    }

    /// The number of calls released so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The byte offset in the output where the first call message started, once one has.
    pub fn first_call_offset(&self) -> Option<usize> {
        self.first_call
    }

    /// Feed the next piece of output.
    pub fn push(&mut self, delta: &str) -> Vec<HarmonyDelta> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        self.step(&mut out, false);
        out
    }

    /// The output is complete: release what was held, and the error if some of it could not
    /// be read. `complete`: the output ended by itself (`<|return|>`, `<|call|>`); when it
    /// was cut short, a call it was inside is content ([`HarmonyError::Unterminated`]).
    pub fn finish(&mut self, complete: bool) -> (Vec<HarmonyDelta>, Option<HarmonyError>) {
        let mut out = Vec::new();
        self.step(&mut out, true);
        match std::mem::replace(&mut self.state, State::Between) {
            State::Body(Body::Call(name)) => {
                let n = self.buf.len();
                let body = self.take(n);
                if complete {
                    self.end_call(&mut out, &name, &body);
                } else {
                    self.fail(&mut out, HarmonyError::Unterminated { index: self.index });
                }
            }
            State::Header if !self.buf.trim().is_empty() || !self.raw.trim().is_empty() => {
                let n = self.buf.len();
                self.take(n);
                self.fail(&mut out, HarmonyError::Unterminated { index: self.index });
            }
            s => self.state = s,
        }
        (out, self.error.clone())
    }

    /// Drop `n` bytes from the front of `buf`, keeping them in `raw`.
    fn take(&mut self, n: usize) -> String {
        let s: String = self.buf.drain(..n).collect();
        self.raw.push_str(&s);
        self.base += n;
        s
    }

    fn step(&mut self, out: &mut Vec<HarmonyDelta>, end: bool) {
        loop {
            let progressed = match self.state.clone() {
                State::Header => self.step_header(out),
                State::Body(b) => self.step_body(out, b, end),
                State::Between => self.step_between(out, end),
                State::Failed => {
                    let rest = std::mem::take(&mut self.buf);
                    self.base += rest.len();
                    emit(out, HarmonyDelta::Content(rest));
                    false
                }
            };
            if !progressed {
                break;
            }
        }
    }

    fn step_header(&mut self, out: &mut Vec<HarmonyDelta>) -> bool {
        let found = self.buf.find(MESSAGE);
        // The header so far (up to `<|message|>`, or all of `buf` less a possible partial
        // `<|message|>` at its end): a marker in it, or more bytes than a header may have,
        // and it is not one. The same test whether the text came whole or in pieces.
        let seen = match found {
            Some(at) => at,
            None => held_message(&self.buf),
        };
        let bad = [END, RETURN, CALL, START]
            .iter()
            .any(|m| self.buf[..seen].contains(m));
        let long = match found {
            Some(at) => self.raw.len() + at > MAX_HEADER_BYTES,
            None => self.raw.len() + seen > MAX_HEADER_BYTES,
        };
        if bad || long {
            let e = HarmonyError::BadHeader {
                index: self.index,
                message: format!(
                    "a marker before <|message|>, or no <|message|> within {MAX_HEADER_BYTES} bytes"
                ),
            };
            self.fail(out, e);
            return true;
        }
        let Some(at) = found else {
            return false; // finish() reports an unterminated header
        };
        self.take(at);
        // The raw header as a whole (its start may have come in an earlier push).
        let whole = self.raw.clone();
        self.take(MESSAGE.len());
        match read_header(self.index, &whole) {
            Ok(Header { channel, recipient }) => {
                let body = match recipient {
                    Some(r) => match r.strip_prefix(FUNCTIONS).filter(|n| !n.is_empty()) {
                        Some(name) if self.calls_allowed => {
                            self.first_call.get_or_insert(self.msg_start);
                            Body::Call(name.to_string())
                        }
                        Some(name) => {
                            let e = HarmonyError::UnexpectedCall {
                                index: self.index,
                                name: name.to_string(),
                            };
                            self.fail(out, e);
                            return true;
                        }
                        None => {
                            let e = HarmonyError::BadRecipient {
                                index: self.index,
                                recipient: r,
                            };
                            self.fail(out, e);
                            return true;
                        }
                    },
                    None if channel == "analysis" => Body::Reasoning,
                    None => Body::Content,
                };
                self.state = State::Body(body);
                true
            }
            Err(e) => {
                self.fail(out, e);
                true
            }
        }
    }

    fn step_body(&mut self, out: &mut Vec<HarmonyDelta>, body: Body, end: bool) -> bool {
        let found = BODY_ENDS
            .iter()
            .filter_map(|m| self.buf.find(m).map(|at| (at, *m)))
            .min();
        let Some((at, marker)) = found else {
            if let Body::Call(_) = body {
                return false; // a call is read whole (finish() reads one the output ends in)
            }
            let keep = if end {
                self.buf.len()
            } else {
                held_from(&self.buf)
            };
            let text = self.take(keep);
            emit(out, text_delta(&body, text));
            return false;
        };
        let text = self.take(at);
        match &body {
            Body::Call(name) => {
                let name = name.clone();
                if !self.end_call(out, &name, &text) {
                    return true;
                }
            }
            _ => emit(out, text_delta(&body, text)),
        }
        self.next_message(marker);
        true
    }

    /// After a body: the marker that ended it decides where the next message begins.
    fn next_message(&mut self, marker: &str) {
        self.index += 1;
        self.raw.clear();
        self.msg_start = self.base;
        if marker == START {
            self.take(START.len());
            self.state = State::Header;
        } else if marker == CHANNEL {
            self.state = State::Header; // the header parser reads the channel marker
        } else {
            self.base += marker.len();
            self.buf.drain(..marker.len());
            self.state = State::Between;
        }
    }

    fn step_between(&mut self, out: &mut Vec<HarmonyDelta>, end: bool) -> bool {
        let trimmed = self.buf.trim_start();
        let ws = self.buf.len() - trimmed.len();
        if trimmed.starts_with(START) || trimmed.starts_with(CHANNEL) {
            self.base += ws;
            self.buf.drain(..ws);
            self.raw.clear();
            self.msg_start = self.base;
            if self.buf.starts_with(START) {
                self.take(START.len());
            }
            self.state = State::Header;
            return true;
        }
        if trimmed.is_empty()
            || (!end && (START.starts_with(trimmed) || CHANNEL.starts_with(trimmed)))
        {
            if end {
                self.base += self.buf.len();
                self.buf.clear();
            }
            return false;
        }
        self.base += ws;
        self.buf.drain(..ws);
        self.raw.clear();
        self.msg_start = self.base;
        self.fail(out, HarmonyError::Stray { index: self.index });
        true
    }

    /// Read a call's body; `false` when it failed (the parser is then in `Failed`).
    fn end_call(&mut self, out: &mut Vec<HarmonyDelta>, name: &str, body: &str) -> bool {
        let index = self.calls;
        let trimmed = body.trim();
        let parsed = if trimmed.is_empty() {
            Ok(Value::Object(Default::default()))
        } else {
            serde_json::from_str::<Value>(trimmed).map_err(|e| HarmonyError::BadJson {
                index,
                message: e.to_string(),
            })
        };
        match parsed {
            Ok(Value::Object(m)) => {
                self.calls += 1;
                out.push(HarmonyDelta::Call(ParsedCall {
                    name: name.to_string(),
                    arguments: Value::Object(m),
                    id: None,
                }));
                true
            }
            Ok(_) => {
                self.fail(out, HarmonyError::NotObject { index });
                false
            }
            Err(e) => {
                self.fail(out, e);
                false
            }
        }
    }

    /// The current message cannot be read: its raw text so far and the rest are content.
    fn fail(&mut self, out: &mut Vec<HarmonyDelta>, e: HarmonyError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
        let raw = std::mem::take(&mut self.raw);
        emit(out, HarmonyDelta::Content(raw));
        self.state = State::Failed;
    }
}

fn text_delta(body: &Body, text: String) -> HarmonyDelta {
    match body {
        Body::Reasoning => HarmonyDelta::Reasoning(text),
        _ => HarmonyDelta::Content(text),
    }
}

fn emit(out: &mut Vec<HarmonyDelta>, d: HarmonyDelta) {
    match (&d, out.last_mut()) {
        (HarmonyDelta::Reasoning(s) | HarmonyDelta::Content(s), _) if s.is_empty() => {}
        (HarmonyDelta::Reasoning(s), Some(HarmonyDelta::Reasoning(last)))
        | (HarmonyDelta::Content(s), Some(HarmonyDelta::Content(last))) => last.push_str(s),
        _ => out.push(d),
    }
}

/// Where a possible partial `<|message|>` at the end of `buf` starts (`buf.len()` if none).
fn held_message(buf: &str) -> usize {
    buf.char_indices()
        .map(|(i, _)| i)
        .find(|&i| MESSAGE.starts_with(&buf[i..]))
        .unwrap_or(buf.len())
}

/// Where the held-back tail of a body starts: a suffix that may begin one of the markers.
fn held_from(buf: &str) -> usize {
    for (i, _) in buf.char_indices() {
        let tail = &buf[i..];
        if BODY_ENDS
            .iter()
            .any(|m| tail.len() < m.len() && m.starts_with(tail))
        {
            return i;
        }
    }
    buf.len()
}

struct Header {
    channel: String,
    recipient: Option<String>,
}

/// A header (everything between a message's start and `<|message|>`, the start marker
/// included or not): `ROLE [to=R]<|channel|>CHANNEL [to=R] [<|constrain|>TYPE | TYPE]`.
fn read_header(index: usize, h: &str) -> Result<Header, HarmonyError> {
    let bad = |m: &str| HarmonyError::BadHeader {
        index,
        message: m.to_string(),
    };
    let h = h.strip_prefix(START).unwrap_or(h);
    let Some(at) = h.find(CHANNEL) else {
        return Err(bad("no <|channel|>"));
    };
    let (role_part, chan_part) = (&h[..at], &h[at + CHANNEL.len()..]);
    if chan_part.contains(CHANNEL) {
        return Err(bad("two <|channel|> markers"));
    }
    let mut recipient = None;
    for w in role_part.split_whitespace() {
        match w.strip_prefix("to=") {
            Some(r) => recipient = Some(r.to_string()),
            None if w == "assistant" => {}
            None => return Err(bad(&format!("the role {w:?} is not the assistant"))),
        }
    }
    let chan_words = chan_part.replace(CONSTRAIN, " ");
    let mut words = chan_words.split_whitespace();
    let channel = words.next().ok_or_else(|| bad("an empty channel"))?;
    // The recipient may be glued to the channel's name by a model (`commentary to=...`) only
    // with whitespace; content types (`json`) and other words are not needed.
    for w in words {
        if let Some(r) = w.strip_prefix("to=") {
            recipient = Some(r.to_string());
        }
    }
    if !matches!(channel, "analysis" | "commentary" | "final") {
        return Err(HarmonyError::UnknownChannel {
            index,
            channel: channel.chars().take(40).collect(),
        });
    }
    Ok(Header {
        channel: channel.to_string(),
        recipient,
    })
}

/// A whole harmony output read at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HarmonyParse {
    /// The analysis channel's text.
    pub reasoning: String,
    /// The final channel's text, commentary without a recipient, and unreadable raw text.
    pub content: String,
    pub calls: Vec<ParsedCall>,
    pub error: Option<HarmonyError>,
}

impl HarmonyParse {
    /// What a [`HarmonyParser`] released, merged.
    pub fn from_deltas(
        deltas: impl IntoIterator<Item = HarmonyDelta>,
        error: Option<HarmonyError>,
    ) -> HarmonyParse {
        let mut out = HarmonyParse {
            error,
            ..Default::default()
        };
        for d in deltas {
            match d {
                HarmonyDelta::Reasoning(s) => out.reasoning.push_str(&s),
                HarmonyDelta::Content(s) => out.content.push_str(&s),
                HarmonyDelta::Call(c) => out.calls.push(c),
            }
        }
        out
    }
}

/// Read a finished harmony output (one that ended by itself) at once: exactly what a
/// [`HarmonyParser`] releases for the same text fed in any pieces.
pub fn parse_harmony(text: &str, calls_allowed: bool) -> HarmonyParse {
    let mut p = HarmonyParser::new(calls_allowed);
    let mut deltas = p.push(text);
    let (rest, error) = p.finish(true);
    deltas.extend(rest);
    HarmonyParse::from_deltas(deltas, error)
}
