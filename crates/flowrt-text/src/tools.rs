//! Tool calling: how a model writes a tool call, detected from its chat template and
//! vocabulary, and parsed back out of its output.
//!
//! The formats (exact text a model emits; `{args}` is a JSON object):
//! - [`ToolFormat::Hermes`] (Qwen2.5, Qwen3, Hermes): one block per call,
//!   `<tool_call>\n{"name": "f", "arguments": {args}}\n</tool_call>`; parallel calls are
//!   consecutive blocks separated by `\n`. Text may come before the first block.
//! - [`ToolFormat::Llama3Json`] (Llama 3.1/3.2/3.3): the whole message is one call,
//!   `{"name": "f", "parameters": {args}}`, optionally after `<|python_tag|>`. One call per
//!   message (the templates refuse more).
//! - [`ToolFormat::Mistral`] (Mistral Nemo / Small and others with `[TOOL_CALLS]`):
//!   `[TOOL_CALLS][{"name": "f", "arguments": {args}}, ...]` (a JSON list; an `"id"` member
//!   may follow the arguments).
//! - [`ToolFormat::Generic`] (templates without tool support, e.g. SmolLM2): flowrt lists the
//!   tools in a system message and the whole answer is one JSON object, either
//!   `{"tool_calls": [{"name": "f", "arguments": {args}}, ...]}` or `{"content": "text"}`.
//! - [`ToolFormat::Harmony`] (gpt-oss): a message to a function,
//!   `<|channel|>commentary to=functions.f <|constrain|>json<|message|>{args}<|call|>`; read by
//!   [`crate::harmony::HarmonyParser`] together with the reasoning, not by
//!   [`ToolStreamParser`] (which passes harmony text through as content).

use serde_json::Value;

use crate::ChatMessage;

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
    Mistral,
    Generic,
    Harmony,
}

impl ToolFormat {
    /// The name `flowrt show` prints.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3Json => "llama3-json",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Generic => "generic",
            ToolFormat::Harmony => "harmony",
        }
    }
}

impl ToolFormat {
    /// The format of a model, from its chat template source and the texts of its vocabulary.
    ///
    /// The template decides: it is what teaches the model its call syntax.
    /// - [`ToolFormat::Harmony`] when [`crate::harmony::detect`] says so (the template has
    ///   `<|channel|>` and `<|message|>`, or there is no template and the vocabulary has the
    ///   harmony tokens);
    /// - [`ToolFormat::Hermes`] when it mentions `<tool_call>`;
    /// - [`ToolFormat::Mistral`] when it mentions `[TOOL_CALLS]`;
    /// - [`ToolFormat::Llama3Json`] when it mentions `<|python_tag|>`, or writes calls as
    ///   `"parameters"` objects and has an `ipython` role or `<|eom_id|>` (Llama 3.2 has no
    ///   python tag in its template, only in its vocabulary);
    /// - otherwise (no template, or one that never mentions tool calls)
    ///   [`ToolFormat::Generic`].
    ///
    /// The vocabulary only backs up the Llama 3 case: a template with `"parameters"` whose
    /// vocabulary has the `<|python_tag|>` token is Llama3Json even without `ipython`.
    pub fn detect<'a>(
        template_source: Option<&str>,
        token_texts: impl IntoIterator<Item = &'a str> + Clone,
    ) -> ToolFormat {
        if crate::harmony::detect(template_source, token_texts.clone()) {
            return ToolFormat::Harmony;
        }
        let Some(t) = template_source else {
            return ToolFormat::Generic;
        };
        if t.contains(HERMES_OPEN) {
            return ToolFormat::Hermes;
        }
        if t.contains(MISTRAL_MARKER) {
            return ToolFormat::Mistral;
        }
        if t.contains(LLAMA_PYTHON_TAG) {
            return ToolFormat::Llama3Json;
        }
        if t.contains("\"parameters\"") {
            if t.contains("ipython") || t.contains("<|eom_id|>") {
                return ToolFormat::Llama3Json;
            }
            if token_texts.into_iter().any(|tok| tok == LLAMA_PYTHON_TAG) {
                return ToolFormat::Llama3Json;
            }
        }
        ToolFormat::Generic
    }

    /// Whether the model's own template renders `tools` (every format but Generic does);
    /// for Generic, flowrt puts the tools into the prompt itself ([`generic_messages`]).
    pub fn template_renders_tools(self) -> bool {
        self != ToolFormat::Generic
    }
}

/// Hermes call block opening tag.
pub const HERMES_OPEN: &str = "<tool_call>";
/// Hermes call block closing tag.
pub const HERMES_CLOSE: &str = "</tool_call>";
/// Mistral's marker before the list of calls.
pub const MISTRAL_MARKER: &str = "[TOOL_CALLS]";
/// The token Llama 3 may write before a call.
pub const LLAMA_PYTHON_TAG: &str = "<|python_tag|>";

/// One tool call read out of a model's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments object (`{}` when the model gave none).
    pub arguments: Value,
    /// The call id the model wrote (Mistral may write one); `None` otherwise.
    pub id: Option<String>,
}

/// Why (part of) an output could not be read as tool calls. The text in question is never
/// dropped: it is kept as content (see [`parse_tool_calls`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolParseError {
    /// A call body is not JSON.
    #[error("tool call {index} is not valid JSON: {message}")]
    BadJson { index: usize, message: String },
    /// A call body is JSON but not `{"name": "...", "arguments": {...}}` (or the format's
    /// equivalent).
    #[error("tool call {index}: {message}")]
    BadShape { index: usize, message: String },
    /// The output ended inside a call.
    #[error("the output ended inside tool call {index}")]
    Unterminated { index: usize },
}

/// A finished output split into text and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolParse {
    /// The text that is not calls (text before the calls, and text after them). When a call
    /// cannot be read, the raw text from that call on is appended here.
    pub content: String,
    /// The calls, in order; the ones before a malformed call are kept.
    pub calls: Vec<ParsedCall>,
    /// Set when some of the output looked like a call but could not be read.
    pub error: Option<ToolParseError>,
}

/// Split a finished output of a model in `format` into content and calls.
///
/// Whitespace between the content and the first call (and between calls) is not content.
/// A call that cannot be read stops the parse: it and everything after it become content and
/// [`ToolParse::error`] says why. This is exactly what [`ToolStreamParser`] produces when fed
/// the same text, in any pieces.
pub fn parse_tool_calls(format: ToolFormat, text: &str) -> ToolParse {
    let mut p = ToolStreamParser::new(format);
    let mut deltas = p.push(text);
    let (rest, error) = p.finish();
    deltas.extend(rest);
    ToolParse::from_deltas(deltas, error)
}

impl ToolParse {
    /// What a [`ToolStreamParser`] released, merged: content appended, calls in order.
    pub fn from_deltas(
        deltas: impl IntoIterator<Item = ToolDelta>,
        error: Option<ToolParseError>,
    ) -> ToolParse {
        let mut out = ToolParse {
            error,
            ..Default::default()
        };
        for d in deltas {
            match d {
                ToolDelta::Content(s) => out.content.push_str(&s),
                ToolDelta::Call(c) => out.calls.push(c),
            }
        }
        out
    }
}

/// What a [`ToolStreamParser`] releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolDelta {
    /// Text that is content for certain.
    Content(String),
    /// A complete call.
    Call(ParsedCall),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet (Llama3Json and Generic decide on the first character).
    Start,
    /// Free text; a call marker may come (Hermes, Mistral).
    Text,
    /// Free text for good: no call can follow.
    PlainText,
    /// Inside Hermes blocks / the Mistral list / a whole-message JSON call.
    Calls,
    /// Between Hermes blocks (after a `</tool_call>`).
    AfterCall,
    /// A call could not be read: the rest is content.
    Failed,
}

/// Splits a model's output into content and tool calls as it is generated.
///
/// Content is released as soon as it cannot be part of a call marker: a trailing possible
/// prefix of the marker (e.g. `<tool_` for Hermes) and trailing whitespace are held back until
/// the next text decides. Hermes calls are released block by block, Mistral's when the list
/// closes. For [`ToolFormat::Llama3Json`] and [`ToolFormat::Generic`] the first
/// non-whitespace character decides: `{` (or `<|python_tag|>` for Llama) means the whole
/// output is held and read at [`ToolStreamParser::finish`]; anything else streams as content.
#[derive(Clone, Debug)]
pub struct ToolStreamParser {
    format: ToolFormat,
    state: State,
    buf: String,
    calls: usize,
    error: Option<ToolParseError>,
}

impl ToolStreamParser {
    pub fn new(format: ToolFormat) -> Self {
        let state = match format {
            ToolFormat::Hermes | ToolFormat::Mistral => State::Text,
            ToolFormat::Llama3Json | ToolFormat::Generic => State::Start,
            ToolFormat::Harmony => State::PlainText,
        };
        Self {
            format,
            state,
            buf: String::new(),
            calls: 0,
            error: None,
        }
    }

    /// The number of calls released so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feed the next piece of output.
    pub fn push(&mut self, delta: &str) -> Vec<ToolDelta> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        self.step(&mut out, false);
        out
    }

    /// The output is complete: release what was held, and the error if a call could not be
    /// read.
    pub fn finish(&mut self) -> (Vec<ToolDelta>, Option<ToolParseError>) {
        let mut out = Vec::new();
        self.step(&mut out, true);
        (out, self.error.clone())
    }

    fn step(&mut self, out: &mut Vec<ToolDelta>, end: bool) {
        loop {
            let progressed = match self.state {
                State::Start => self.step_start(end),
                State::Text => self.step_text(out, end),
                State::PlainText | State::Failed => {
                    emit(out, std::mem::take(&mut self.buf));
                    false
                }
                State::Calls => self.step_calls(out, end),
                State::AfterCall => self.step_after_call(end),
            };
            if !progressed {
                break;
            }
        }
    }

    /// Llama3Json / Generic: decide on the first non-whitespace character.
    fn step_start(&mut self, end: bool) -> bool {
        let llama = self.format == ToolFormat::Llama3Json;
        let trimmed = self.buf.trim_start();
        if trimmed.is_empty() {
            if !end {
                return false;
            }
            self.state = State::PlainText;
            return true;
        }
        if llama
            && !end
            && trimmed.len() < LLAMA_PYTHON_TAG.len()
            && LLAMA_PYTHON_TAG.starts_with(trimmed)
        {
            return false; // maybe the python tag: wait for more
        }
        self.state = if trimmed.starts_with('{') || (llama && trimmed.starts_with(LLAMA_PYTHON_TAG))
        {
            State::Calls
        } else {
            State::PlainText
        };
        true
    }

    /// Hermes / Mistral free text: release what cannot start a marker.
    fn step_text(&mut self, out: &mut Vec<ToolDelta>, end: bool) -> bool {
        let marker = self.marker();
        if let Some(at) = self.buf.find(marker) {
            let content = self.buf[..at].trim_end().to_string();
            emit(out, content);
            self.buf.drain(..at + marker.len());
            self.state = State::Calls;
            return true;
        }
        if end {
            emit(out, std::mem::take(&mut self.buf));
            return false;
        }
        let hold = held_from(&self.buf, marker);
        let released: String = self.buf.drain(..hold).collect();
        emit(out, released);
        false
    }

    fn marker(&self) -> &'static str {
        match self.format {
            ToolFormat::Mistral => MISTRAL_MARKER,
            _ => HERMES_OPEN,
        }
    }

    fn step_calls(&mut self, out: &mut Vec<ToolDelta>, end: bool) -> bool {
        match self.format {
            ToolFormat::Hermes => self.step_hermes(out, end),
            ToolFormat::Mistral => self.step_mistral(out, end),
            ToolFormat::Harmony => false, // never in Calls
            ToolFormat::Llama3Json | ToolFormat::Generic => {
                if !end {
                    return false;
                }
                self.finish_whole(out);
                false
            }
        }
    }

    fn step_hermes(&mut self, out: &mut Vec<ToolDelta>, end: bool) -> bool {
        let index = self.calls;
        let (body, consumed, closed) = match self.buf.find(HERMES_CLOSE) {
            Some(at) => (&self.buf[..at], at + HERMES_CLOSE.len(), true),
            None if end => (self.buf.as_str(), self.buf.len(), false),
            None => return false,
        };
        let parsed = serde_json::from_str::<Value>(body.trim())
            .map_err(|e| {
                if closed {
                    ToolParseError::BadJson {
                        index,
                        message: e.to_string(),
                    }
                } else {
                    ToolParseError::Unterminated { index }
                }
            })
            .and_then(|v| call_from_object(index, &v, &["arguments", "parameters"]));
        match parsed {
            Ok(call) => {
                self.calls += 1;
                out.push(ToolDelta::Call(call));
                self.buf.drain(..consumed);
                self.state = State::AfterCall;
            }
            Err(e) => self.fail(out, HERMES_OPEN, e),
        }
        true
    }

    fn step_mistral(&mut self, out: &mut Vec<ToolDelta>, end: bool) -> bool {
        let index = self.calls;
        let mut stream = serde_json::Deserializer::from_str(&self.buf).into_iter::<Value>();
        match stream.next() {
            Some(Ok(list)) => {
                let consumed = stream.byte_offset();
                let calls = match &list {
                    Value::Array(items) => items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| call_from_object(index + i, v, &["arguments"]))
                        .collect::<Result<Vec<_>, _>>(),
                    _ => Err(ToolParseError::BadShape {
                        index,
                        message: "[TOOL_CALLS] is not followed by a JSON list".into(),
                    }),
                };
                match calls {
                    Ok(calls) => {
                        self.calls += calls.len();
                        out.extend(calls.into_iter().map(ToolDelta::Call));
                        self.buf.drain(..consumed);
                        // Text after the list is content; another [TOOL_CALLS] may follow.
                        self.state = State::AfterCall;
                    }
                    Err(e) => self.fail(out, MISTRAL_MARKER, e),
                }
                true
            }
            Some(Err(e)) if e.is_eof() && !end => false,
            Some(Err(e)) => {
                let err = if e.is_eof() {
                    ToolParseError::Unterminated { index }
                } else {
                    ToolParseError::BadJson {
                        index,
                        message: e.to_string(),
                    }
                };
                self.fail(out, MISTRAL_MARKER, err);
                true
            }
            None if end => {
                self.fail(out, MISTRAL_MARKER, ToolParseError::Unterminated { index });
                true
            }
            None => false,
        }
    }

    /// Between calls: whitespace is dropped; a marker opens the next call; other text is
    /// content, after which more calls may still come.
    fn step_after_call(&mut self, end: bool) -> bool {
        let trimmed = self.buf.trim_start();
        if trimmed.is_empty() {
            if end {
                self.buf.clear();
            }
            return false;
        }
        let marker = self.marker();
        if trimmed.starts_with(marker) {
            let at = self.buf.len() - trimmed.len() + marker.len();
            self.buf.drain(..at);
            self.state = State::Calls;
            return true;
        }
        if marker.starts_with(trimmed) && !end {
            return false;
        }
        let at = self.buf.len() - trimmed.len();
        self.buf.drain(..at);
        self.state = State::Text;
        true
    }

    /// Llama3Json / Generic at the end of a whole-message JSON answer.
    fn finish_whole(&mut self, out: &mut Vec<ToolDelta>) {
        let text = std::mem::take(&mut self.buf);
        let trimmed = text.trim();
        let (json_text, tagged) = match trimmed.strip_prefix(LLAMA_PYTHON_TAG) {
            Some(rest) if self.format == ToolFormat::Llama3Json => (rest.trim_start(), true),
            _ => (trimmed, false),
        };
        let value = match serde_json::from_str::<Value>(json_text) {
            Ok(v) => v,
            Err(e) => {
                // A `{...}` that is not JSON: keep the text, and say a call was likely meant.
                self.error = Some(ToolParseError::BadJson {
                    index: 0,
                    message: e.to_string(),
                });
                emit(out, text);
                self.state = State::Failed;
                return;
            }
        };
        match self.format {
            ToolFormat::Llama3Json => {
                match call_from_object(0, &value, &["parameters", "arguments"]) {
                    Ok(call) => {
                        self.calls += 1;
                        out.push(ToolDelta::Call(call));
                    }
                    Err(e) => {
                        // Plain JSON content is fine unless the python tag announced a call.
                        if tagged {
                            self.error = Some(e);
                        }
                        emit(out, text);
                    }
                }
            }
            _ => match generic_answer(&value) {
                Ok(GenericAnswer::Calls(calls)) => {
                    self.calls += calls.len();
                    out.extend(calls.into_iter().map(ToolDelta::Call));
                }
                Ok(GenericAnswer::Content(c)) => emit(out, c),
                Err(e) => {
                    self.error = Some(e);
                    emit(out, text);
                }
            },
        }
        self.state = State::Failed;
    }

    /// A call could not be read: it (from its marker on) and the rest become content.
    fn fail(&mut self, out: &mut Vec<ToolDelta>, marker: &str, e: ToolParseError) {
        self.error = Some(e);
        let mut raw = String::from(marker);
        raw.push_str(&std::mem::take(&mut self.buf));
        emit(out, raw);
        self.state = State::Failed;
    }
}

fn emit(out: &mut Vec<ToolDelta>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(ToolDelta::Content(last)) = out.last_mut() {
        last.push_str(&s);
    } else {
        out.push(ToolDelta::Content(s));
    }
}

/// Where the held-back tail of free text starts: a suffix that may begin `marker`, together
/// with the whitespace before it (whitespace right before a call is not content).
fn held_from(buf: &str, marker: &str) -> usize {
    let mut from = buf.len();
    for (i, _) in buf.char_indices() {
        if buf.len() - i < marker.len() && marker.starts_with(&buf[i..]) {
            from = i;
            break;
        }
    }
    let head = &buf[..from];
    head.trim_end().len()
}

/// `{"name": "f", <args_key>: {...}}` (the first of `args_keys` present) as a call. A
/// string argument that holds a JSON object is accepted as that object; absent arguments
/// are `{}`.
fn call_from_object(
    index: usize,
    v: &Value,
    args_keys: &[&str],
) -> Result<ParsedCall, ToolParseError> {
    let shape = |message: &str| ToolParseError::BadShape {
        index,
        message: message.to_string(),
    };
    let obj = v.as_object().ok_or_else(|| shape("not a JSON object"))?;
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| shape("no \"name\" string"))?;
    let args = args_keys.iter().find_map(|k| obj.get(*k));
    let arguments = match args {
        None => Value::Object(Default::default()),
        Some(Value::Object(m)) => Value::Object(m.clone()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Value::Object(m),
            _ => return Err(shape("arguments are a string that is not a JSON object")),
        },
        Some(_) => return Err(shape("arguments are not a JSON object")),
    };
    let id = obj.get("id").and_then(Value::as_str).map(str::to_string);
    Ok(ParsedCall {
        name: name.to_string(),
        arguments,
        id,
    })
}

enum GenericAnswer {
    Calls(Vec<ParsedCall>),
    Content(String),
}

/// `{"tool_calls": [...]}` or `{"content": "text"}`.
fn generic_answer(v: &Value) -> Result<GenericAnswer, ToolParseError> {
    let shape = |message: &str| ToolParseError::BadShape {
        index: 0,
        message: message.to_string(),
    };
    let obj = v
        .as_object()
        .ok_or_else(|| shape("the answer is not a JSON object"))?;
    if let Some(calls) = obj.get("tool_calls") {
        let list = calls
            .as_array()
            .ok_or_else(|| shape("\"tool_calls\" is not a list"))?;
        if list.is_empty() {
            return Err(shape("\"tool_calls\" is empty"));
        }
        return list
            .iter()
            .enumerate()
            .map(|(i, c)| call_from_object(i, c, &["arguments"]))
            .collect::<Result<Vec<_>, _>>()
            .map(GenericAnswer::Calls);
    }
    match obj.get("content") {
        Some(Value::String(s)) => Ok(GenericAnswer::Content(s.clone())),
        _ => Err(shape(
            "neither {\"tool_calls\": [...]} nor {\"content\": \"...\"}",
        )),
    }
}

/// The system-message text that lists `tools` (OpenAI tool objects) for a model whose
/// template has no tool support, and asks for the [`ToolFormat::Generic`] answer shape.
pub fn generic_tools_prompt(tools: &[Value]) -> String {
    let mut s = String::from(
        "You can call functions (tools). The available tools, each with a JSON Schema of its \
         arguments:\n",
    );
    for tool in tools {
        let f = tool.get("function").unwrap_or(tool);
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        s.push_str("\n- ");
        s.push_str(name);
        if let Some(d) = f.get("description").and_then(Value::as_str) {
            s.push_str(": ");
            s.push_str(d);
        }
        if let Some(p) = f.get("parameters") {
            s.push_str("\n  arguments schema: ");
            s.push_str(&serde_json::to_string(p).unwrap_or_default());
        }
    }
    s.push_str(
        "\n\nAnswer with one JSON object and nothing else. To call tools: \
         {\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<arguments>}}]} \
         (one entry per call). To answer without a tool: {\"content\": \"<your answer>\"}. \
         Tool results come back in a user message that starts with \"Tool results:\".",
    );
    s
}

/// The assistant text of a [`ToolFormat::Generic`] call answer (what the model is asked to
/// write, compact JSON).
pub fn generic_calls_text(calls: &[crate::ToolCall]) -> String {
    let list: Vec<Value> = calls
        .iter()
        .map(|c| serde_json::json!({"name": c.function.name, "arguments": c.function.arguments}))
        .collect();
    serde_json::json!({ "tool_calls": list }).to_string()
}

/// A tool conversation rewritten for a template without tool support
/// ([`ToolFormat::Generic`]):
/// - the tools prompt ([`generic_tools_prompt`]) is appended to the first system message
///   (after a blank line), or becomes a new first system message;
/// - an assistant message with `tool_calls` becomes `{"tool_calls": [...]}` text, and (when
///   `tools` is non-empty) a plain assistant answer becomes `{"content": "..."}`, so earlier
///   turns show the model the shape it is asked for;
/// - consecutive `tool` messages become one user message, `Tool results:` followed by one
///   JSON line per result (`{"name": ..., "tool_call_id": ..., "content": ...}`).
///
/// `reasoning_content` is kept; other messages pass through unchanged.
pub fn generic_messages(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let prompt = (!tools.is_empty()).then(|| generic_tools_prompt(tools));
    let mut rest = messages;
    if let Some(p) = &prompt {
        match messages.first() {
            Some(m) if m.role == "system" => {
                let mut sys = m.clone();
                let text = match sys.content.as_deref() {
                    Some(c) if !c.is_empty() => format!("{c}\n\n{p}"),
                    _ => p.clone(),
                };
                sys.content = Some(text);
                out.push(sys);
                rest = &messages[1..];
            }
            _ => out.push(ChatMessage::new("system", p.as_str())),
        }
    }
    let mut pending_results: Vec<String> = Vec::new();
    let flush = |out: &mut Vec<ChatMessage>, pending: &mut Vec<String>| {
        if !pending.is_empty() {
            let text = format!("Tool results:\n{}", pending.join("\n"));
            out.push(ChatMessage::new("user", text));
            pending.clear();
        }
    };
    for m in rest {
        if m.role == "tool" {
            let mut r = serde_json::Map::new();
            if let Some(n) = &m.name {
                r.insert("name".into(), Value::String(n.clone()));
            }
            if let Some(id) = &m.tool_call_id {
                r.insert("tool_call_id".into(), Value::String(id.clone()));
            }
            r.insert("content".into(), Value::String(m.text().to_string()));
            pending_results.push(Value::Object(r).to_string());
            continue;
        }
        flush(&mut out, &mut pending_results);
        if m.role == "assistant" {
            let mut a = m.clone();
            match m.tool_calls.as_deref() {
                Some(calls) if !calls.is_empty() => {
                    a.content = Some(generic_calls_text(calls));
                }
                _ if prompt.is_some() => {
                    a.content = Some(serde_json::json!({ "content": m.text() }).to_string());
                }
                _ => {}
            }
            a.tool_calls = None;
            out.push(a);
        } else {
            out.push(m.clone());
        }
    }
    flush(&mut out, &mut pending_results);
    out
}
