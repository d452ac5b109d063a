//! What agent apps send, shared by the OpenAI and Ollama routes: structured output
//! (`response_format`, Ollama's `format`), tools and `tool_choice`, and reasoning switches
//! (`chat_template_kwargs`, `reasoning_effort`, Ollama's `think`) — parsed into what the engine
//! and the chat template take, with a 400 naming the field for anything malformed.

use flowrt_engine::tools::{check_tools, ToolChoice, ToolDef, ToolGrammarError, ToolMarkers};
use flowrt_engine::{Constraint, ConstraintSpec, LoadedModel};
use flowrt_text::reasoning::{prompt_ends_in_reasoning, template_reads_enable_thinking};
use flowrt_text::reasoning::{ReasoningDelta, ReasoningSplitter};
use flowrt_text::tools::{generic_messages, ToolDelta};
use flowrt_text::{
    ChatMessage, ChatPrompt, FunctionCall, HarmonyDelta, HarmonyParser, ParsedCall,
    ReasoningFormat, RenderOptions, ToolCall, ToolFormat, ToolStreamParser,
};
use serde_json::{json, Map, Value};

use crate::error::{clip, ApiError};

/// `response_format` of `/v1/chat/completions`: `text` (none), `json_object`, or
/// `json_schema` with its `schema` (`strict` is accepted either way: the schema is always
/// enforced, never only requested).
pub fn response_format(v: Option<&Value>) -> Result<Option<ConstraintSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |p: &str, m: String| ApiError::invalid_param(p, m);
    let obj = v.as_object().ok_or_else(|| {
        bad(
            "response_format",
            "`response_format` must be an object with a `type`".into(),
        )
    })?;
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ConstraintSpec::JsonObject)),
        Some("json_schema") => {
            let js = obj
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    bad(
                        "response_format.json_schema",
                        "`json_schema` must be an object with a `schema`".into(),
                    )
                })?;
            if let Some(s) = js.get("strict") {
                if !s.is_boolean() && !s.is_null() {
                    return Err(bad(
                        "response_format.json_schema.strict",
                        "`strict` must be a boolean".into(),
                    ));
                }
            }
            match js.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(ConstraintSpec::JsonSchema(s.clone()))),
                Some(Value::Bool(true)) | None => Ok(Some(ConstraintSpec::JsonObject)),
                Some(_) => Err(bad(
                    "response_format.json_schema.schema",
                    "`schema` must be a JSON Schema object".into(),
                )),
            }
        }
        Some(other) => Err(bad(
            "response_format.type",
            format!(
                "unknown `response_format` type `{}` (use text, json_object or json_schema)",
                clip(other, 40)
            ),
        )),
        None => Err(bad(
            "response_format.type",
            "`response_format` needs a `type`".into(),
        )),
    }
}

/// Ollama's `format`: `"json"` (any JSON object) or a JSON Schema object; `""` is none.
pub fn ollama_format(v: Option<&Value>) -> Result<Option<ConstraintSpec>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(ConstraintSpec::JsonObject)),
        Some(Value::Object(_)) => Ok(Some(ConstraintSpec::JsonSchema(v.unwrap().clone()))),
        Some(other) => Err(ApiError::invalid_param(
            "format",
            format!(
                "`format` must be \"json\" or a JSON Schema object, got {}",
                clip(&other.to_string(), 60)
            ),
        )),
    }
}

/// An assistant message's `tool_calls`: `[{"id", "type": "function", "function": {"name",
/// "arguments": "<JSON object as a string>"}}]` (OpenAI), or with `arguments` an object (Ollama);
/// the arguments go to the template as an object.
pub fn in_tool_calls(i: usize, v: &Value) -> Result<Vec<ToolCall>, ApiError> {
    let list = v.as_array().ok_or_else(|| {
        ApiError::invalid_param(
            format!("messages[{i}].tool_calls"),
            "`tool_calls` must be a list",
        )
    })?;
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let p = |f: &str| format!("messages[{i}].tool_calls[{j}]{f}");
            let f = c.get("function").ok_or_else(|| {
                ApiError::invalid_param(p(".function"), "a tool call needs a `function`")
            })?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_param(p(".function.name"), "a tool call needs a function `name`")
            })?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(a)) => {
                    let v: Value = serde_json::from_str(a).map_err(|e| {
                        ApiError::invalid_param(
                            p(".function.arguments"),
                            format!("`arguments` is not valid JSON: {e}"),
                        )
                    })?;
                    if !v.is_object() {
                        return Err(ApiError::invalid_param(
                            p(".function.arguments"),
                            "`arguments` must be a JSON object",
                        ));
                    }
                    v
                }
                Some(o @ Value::Object(_)) => o.clone(),
                Some(_) => {
                    return Err(ApiError::invalid_param(
                        p(".function.arguments"),
                        "`arguments` must be a JSON object as a string",
                    ))
                }
            };
            Ok(ToolCall {
                id: c.get("id").and_then(Value::as_str).map(str::to_string),
                kind: "function".into(),
                function: FunctionCall {
                    name: name.to_string(),
                    arguments,
                },
            })
        })
        .collect()
}

/// Tools as a request gives them: the definitions the constraint and parser use, and the list
/// as the chat template receives it (OpenAI's shape, as transformers passes `tools`).
#[derive(Clone, Debug, Default)]
pub struct Tools {
    pub defs: Vec<ToolDef>,
    pub template: Vec<Value>,
}

/// A function name as OpenAI allows it: 1–64 of `a-z A-Z 0-9 _ -` (and `.` for namespaced
/// tools some clients send).
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `tools`: a list of `{"type": "function", "function": {"name", "description", "parameters"}}`
/// (Ollama sends the same shape). Missing `parameters` means no arguments.
pub fn parse_tools(v: Option<&Value>) -> Result<Tools, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Tools::default()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tools",
                "`tools` must be a list of function tools",
            ))
        }
    };
    if list.len() > 128 {
        return Err(ApiError::invalid_param(
            "tools",
            format!("at most 128 tools are allowed, got {}", list.len()),
        ));
    }
    let mut out = Tools::default();
    for (i, t) in list.iter().enumerate() {
        let p = |f: &str| format!("tools[{i}]{f}");
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("function");
        if ty != "function" {
            return Err(ApiError::invalid_param(
                p(".type"),
                format!(
                    "tool type `{}` is not supported (only `function`)",
                    clip(ty, 40)
                ),
            ));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                ApiError::invalid_param(p(".function"), "a tool needs a `function` object")
            })?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
        if !valid_name(name) {
            return Err(ApiError::invalid_param(
                p(".function.name"),
                format!(
                    "function name `{}` is not valid (1 to 64 letters, digits, `_`, `-`, `.`)",
                    clip(name, 80)
                ),
            ));
        }
        if out.defs.iter().any(|d| d.name == name) {
            return Err(ApiError::invalid_param(
                p(".function.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        let description = match f.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    p(".function.description"),
                    "`description` must be a string",
                ))
            }
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => {
                serde_json::json!({"type": "object", "properties": {}})
            }
            Some(s @ Value::Object(_)) => s.clone(),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    p(".function.parameters"),
                    "`parameters` must be a JSON Schema object",
                ))
            }
        };
        let mut tf = Map::new();
        tf.insert("name".into(), Value::from(name));
        if !description.is_empty() {
            tf.insert("description".into(), Value::from(description.clone()));
        }
        tf.insert("parameters".into(), parameters.clone());
        out.template
            .push(serde_json::json!({"type": "function", "function": Value::Object(tf)}));
        out.defs.push(ToolDef {
            name: name.to_string(),
            description: (!description.is_empty()).then_some(description),
            parameters,
        });
    }
    Ok(out)
}

/// `tool_choice`: `"none"`, `"auto"` (the default with tools), `"required"`, or
/// `{"type": "function", "function": {"name": ...}}` naming one of `tools`.
pub fn parse_tool_choice(v: Option<&Value>, tools: &Tools) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::invalid_param("tool_choice", m);
    let choice = match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "unknown `tool_choice` `{}` (use none, auto, required or a named function)",
                    clip(other, 40)
                )))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad("a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ...}}".into())
                })?;
            if !tools.defs.iter().any(|d| d.name == name) {
                return Err(bad(format!(
                    "`tool_choice` names function `{}`, which is not in `tools`",
                    clip(name, 80)
                )));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(_) => return Err(bad("`tool_choice` must be a string or an object".into())),
    };
    if tools.defs.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad(
            "`tool_choice` asks for a tool call, but `tools` is empty".into(),
        ));
    }
    Ok(choice)
}

/// Thinking asked for (`true`) or switched off (`false`), with the request field that said
/// so; `None` leaves it to the model.
pub type Think = Option<(bool, &'static str)>;

/// A chat request's prompt with what agent apps add to it.
#[derive(Clone, Debug)]
pub struct ChatInput {
    pub messages: Vec<ChatMessage>,
    pub tools: Tools,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (more than one call per answer where the format allows).
    pub parallel: bool,
    pub think: Think,
    /// Extra template variables (`chat_template_kwargs`, `reasoning_effort`).
    pub kwargs: Map<String, Value>,
    /// A structured-output constraint is asked for as well (`response_format`, `format`):
    /// the answer must then start at once, without reasoning.
    pub structured: Option<&'static str>,
}

impl ChatInput {
    /// Plain messages, nothing else.
    pub fn plain(messages: Vec<ChatMessage>) -> ChatInput {
        ChatInput {
            messages,
            tools: Tools::default(),
            choice: ToolChoice::Auto,
            parallel: true,
            think: None,
            kwargs: Map::new(),
            structured: None,
        }
    }

    /// Whether tools take part in this answer (given, and `tool_choice` is not `none`).
    fn tools_active(&self) -> bool {
        !self.tools.defs.is_empty() && self.choice != ToolChoice::None
    }
}

/// How a chat answer is to be read: tool calls in the model's format, reasoning split off.
#[derive(Clone, Copy, Debug, Default)]
pub struct OutputShape {
    /// Parse tool calls in this format (tools given and `tool_choice` not `none`).
    pub tools: Option<ToolFormat>,
    /// Split `<think>` reasoning off; `Some(true)` when the prompt already opened it.
    pub reasoning: Option<bool>,
    /// The answer is harmony (gpt-oss): its channels give reasoning, content and (with
    /// `tools` set) calls; `reasoning` is then `None`.
    pub harmony: bool,
}

impl OutputShape {
    /// Whether the answer may hold reasoning to split off.
    pub fn may_reason(&self) -> bool {
        self.reasoning.is_some() || self.harmony
    }
}

/// A rendered chat prompt, the constraint its tools call for, and how to read its answer.
pub struct ChatPlan {
    /// The prompt, with the stretches of message text to tokenise as plain text.
    pub prompt: ChatPrompt,
    pub shape: OutputShape,
    /// The tool-call grammar (`tool_choice` auto/required/named), checked against the model.
    pub tool_constraint: Option<Constraint>,
    /// Write special tokens into the answer (tool-call markers that are control tokens).
    pub keep_special: bool,
}

fn template_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_param(
        "messages",
        format!(
            "the model's chat template rejected these messages: {}",
            clip(&e.to_string(), 400)
        ),
    )
}

fn tool_error(e: ToolGrammarError) -> ApiError {
    match &e {
        ToolGrammarError::Parameters { index, .. } => ApiError::invalid_param(
            format!("tools[{index}].function.parameters"),
            clip(&e.to_string(), 500),
        ),
        ToolGrammarError::UnknownFunction { .. } | ToolGrammarError::Unsupported { .. } => {
            ApiError::invalid_param("tool_choice", clip(&e.to_string(), 300))
        }
        _ => ApiError::invalid_param("tools", clip(&e.to_string(), 500)),
    }
}

/// Render `input` for `model` (blocking work: template, and with tools the grammar check).
///
/// - Tools: a template with tool support receives them as transformers passes them; for one
///   without ([`ToolFormat::Generic`]) flowrt writes them into the system message and earlier
///   calls and results into the turns. With `tool_choice` auto, required or named, the answer
///   is constrained to the format's call syntax and each function's `parameters`.
/// - Thinking: asking a model that cannot think is a 400; `enable_thinking` is set for
///   templates that read it. A structured-output answer starts without reasoning: thinking is
///   switched off where the template can do it, and refused (400) where it cannot.
/// - Harmony (gpt-oss): the answer is read by its channels (reasoning, content, calls), with
///   special tokens kept in its text; `auto` tool calls are not constrained; see
///   `harmony_checks` for what is refused and how thinking switches map to `reasoning_effort`.
pub fn plan_chat(model: &LoadedModel, input: ChatInput, name: &str) -> Result<ChatPlan, ApiError> {
    let template = model.template.as_ref().ok_or_else(|| {
        ApiError::invalid_param(
            "messages",
            format!("model `{name}` has no chat template; use /v1/completions (or /api/generate with raw) for plain completion"),
        )
    })?;
    let thinks = model.reasoning.supports_thinking();
    let switchable = template_reads_enable_thinking(template.source());
    let tools_active = input.tools_active();
    let harmony =
        model.tool_format == ToolFormat::Harmony || model.reasoning == ReasoningFormat::Harmony;
    let mut kwargs = input.kwargs.clone();
    if harmony {
        harmony_checks(&input, &mut kwargs, name)?;
    }
    // Harmony's `auto` tool calls are parsed, not constrained.
    let constrained = !harmony && (tools_active || input.structured.is_some());
    match input.think {
        Some((true, param)) if !thinks => {
            return Err(ApiError::invalid_param(
                param,
                format!("model `{name}` does not think (its template and vocabulary have no reasoning block), so thinking cannot be switched on"),
            ))
        }
        Some((true, param)) if constrained => {
            return Err(ApiError::invalid_param(
                param,
                "thinking cannot be combined with a constrained answer (`tools` with a `tool_choice` other than none, or structured output) yet",
            ))
        }
        Some((on, _)) if switchable => {
            kwargs.insert("enable_thinking".into(), Value::Bool(on));
        }
        _ => {}
    }
    if constrained && thinks && switchable && input.think.is_none() {
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
    }
    if let (Some(sp), true) = (input.structured, tools_active) {
        return Err(ApiError::invalid_param(
            sp,
            "structured output cannot be combined with tools the model may call yet (OpenAI API: set `tool_choice` to `none`)",
        ));
    }
    let format = model.tool_format;
    let native = format.template_renders_tools();
    let messages = if native {
        let mut m = input.messages.clone();
        if format == ToolFormat::Mistral {
            mistral_ids(&mut m);
        }
        m
    } else if tools_active {
        generic_messages(&input.messages, &input.tools.template)
    } else {
        generic_messages(&input.messages, &[])
    };
    let tools = (native && !input.tools.template.is_empty()).then_some(&input.tools.template[..]);
    let prompt = template
        .render_prompt(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                tools,
                kwargs: Some(&kwargs),
            },
            &model.tokenizer,
        )
        .map_err(template_error)?;
    let in_reasoning = thinks && prompt_ends_in_reasoning(prompt.text());
    if in_reasoning && constrained {
        return Err(ApiError::invalid_param(
            input.structured.unwrap_or("tool_choice"),
            format!("model `{name}`'s template opens a reasoning block in every prompt, which a constrained answer cannot follow yet; use tool_choice none / no response_format"),
        ));
    }
    let mut tool_constraint = None;
    // Harmony's channels and headers are control tokens the parser reads.
    let mut keep_special = harmony;
    if tools_active && !harmony {
        let guide = model
            .guide()
            .map_err(|e| ApiError::internal("building the constraint vocabulary", &e))?;
        let markers = ToolMarkers::from_tokenizer(&model.tokenizer);
        tool_constraint = check_tools(
            guide,
            &markers,
            format,
            &input.tools.defs,
            &input.choice,
            input.parallel,
        )
        .map_err(tool_error)?;
        keep_special = true;
    }
    Ok(ChatPlan {
        prompt,
        shape: OutputShape {
            tools: tools_active.then_some(format),
            reasoning: (model.reasoning == ReasoningFormat::Think).then_some(in_reasoning),
            harmony,
        },
        tool_constraint,
        keep_special,
    })
}

/// The reasoning efforts gpt-oss is trained on (`Reasoning: low|medium|high` in its system
/// message, from the template variable `reasoning_effort`).
const HARMONY_EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// What a harmony model can and cannot do with a request:
/// - it always reasons (in the analysis channel): switching thinking off (`think: false`,
///   `reasoning_effort: "none"`, Anthropic's default) asks for the least reasoning, effort
///   `low`, and the reasoning is still split off; efforts below low (`none`, `minimal`) are
///   `low`; other efforts than low, medium and high are a 400;
/// - structured output and forced tool calls (`tool_choice` required or named) have no
///   grammar for harmony yet: a 400 naming the field.
fn harmony_checks(
    input: &ChatInput,
    kwargs: &mut Map<String, Value>,
    name: &str,
) -> Result<(), ApiError> {
    if let Some(sp) = input.structured {
        return Err(ApiError::invalid_param(
            sp,
            format!("structured output is not supported yet for model `{name}`, whose harmony format puts the answer after its reasoning in a channel of its own"),
        ));
    }
    if input.tools_active() && matches!(input.choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(ApiError::invalid_param(
            "tool_choice",
            format!("model `{name}` writes harmony, whose calls can be left to the model (`auto`) but not forced yet (`required` or a named function)"),
        ));
    }
    match kwargs.get("reasoning_effort") {
        None | Some(Value::Null) => {
            if let Some((false, _)) = input.think {
                kwargs.insert("reasoning_effort".into(), Value::from("low"));
            }
        }
        Some(Value::String(e)) if matches!(e.as_str(), "none" | "minimal") => {
            kwargs.insert("reasoning_effort".into(), Value::from("low"));
        }
        Some(Value::String(e)) if HARMONY_EFFORTS.contains(&e.as_str()) => {}
        Some(other) => {
            return Err(ApiError::invalid_param(
                "reasoning_effort",
                format!(
                "model `{name}` (harmony) takes the reasoning efforts low, medium and high, not {}",
                clip(&other.to_string(), 40)
            ),
            ))
        }
    }
    Ok(())
}

/// A piece of an answer, as the routes present it.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
    Call(ParsedCall),
}

/// Reads an answer as it streams: reasoning split off first, then tool calls out of the rest
/// (a harmony answer: all three from its channels, by [`HarmonyParser`]).
///
/// Tool calls are presented only for a complete answer: from the first call on, everything is
/// held until [`Shaper::finish`]; an answer cut short (`max_tokens`, context) gives its held
/// text back as content, so a call is never presented from an incomplete answer.
#[derive(Debug)]
pub struct Shaper {
    /// A harmony answer: this parser reads all of it (`reasoning` and `tools` are `None`).
    harmony: Option<HarmonyParser>,
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolStreamParser>,
    /// The content-side text given to the tool parser, as generated.
    raw: String,
    /// Bytes of content released before the first call (a prefix of `raw`, less the
    /// whitespace the parser drops before a call).
    released: usize,
    /// Pieces from the first call on, held until the answer is complete.
    held: Option<Vec<Piece>>,
    calls: usize,
}

impl Shaper {
    pub fn new(shape: OutputShape) -> Shaper {
        if shape.harmony {
            return Shaper {
                harmony: Some(HarmonyParser::new(shape.tools.is_some())),
                reasoning: None,
                tools: None,
                raw: String::new(),
                released: 0,
                held: None,
                calls: 0,
            };
        }
        Shaper {
            harmony: None,
            reasoning: shape.reasoning.map(ReasoningSplitter::new),
            tools: shape.tools.map(ToolStreamParser::new),
            raw: String::new(),
            released: 0,
            held: None,
            calls: 0,
        }
    }

    /// How many tool calls the answer released so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Release `p`, or hold it once a call has been seen.
    fn gate(&mut self, p: Piece, out: &mut Vec<Piece>) {
        if let Some(held) = &mut self.held {
            held.push(p);
            return;
        }
        match p {
            Piece::Call(_) => self.held = Some(vec![p]),
            Piece::Content(ref c) => {
                self.released += c.len();
                out.push(p);
            }
            Piece::Reasoning(_) => out.push(p),
        }
    }

    fn content(&mut self, text: String, out: &mut Vec<Piece>) {
        let Some(p) = &mut self.tools else {
            if !text.is_empty() {
                out.push(Piece::Content(text));
            }
            return;
        };
        self.raw.push_str(&text);
        for d in p.push(&text) {
            self.gate(tool_piece(d), out);
        }
    }

    fn reasoning_pieces(&mut self, deltas: Vec<ReasoningDelta>, out: &mut Vec<Piece>) {
        for d in deltas {
            match d {
                ReasoningDelta::Reasoning(r) if !r.is_empty() => out.push(Piece::Reasoning(r)),
                ReasoningDelta::Reasoning(_) => {}
                ReasoningDelta::Content(c) => self.content(c, out),
            }
        }
    }

    /// The pieces `text` (the next part of the answer) completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if let Some(h) = self.harmony.as_mut() {
            self.raw.push_str(text);
            let d = h.push(text);
            self.harmony_pieces(d, &mut out);
            return out;
        }
        match self.reasoning.as_mut() {
            Some(r) => {
                let d = r.push(text);
                self.reasoning_pieces(d, &mut out);
            }
            None => self.content(text.to_string(), &mut out),
        }
        out
    }

    /// The answer is over (`complete`: it ended by itself, not by a limit): what was held
    /// back. Calls are released only for a complete answer; otherwise the text from the
    /// first call on is content. A call the answer did not finish is content either way.
    pub fn finish(&mut self, complete: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        if let Some(h) = self.harmony.as_mut() {
            let (d, err) = h.finish(complete);
            if let Some(e) = err {
                tracing::debug!(error = %e, "the answer holds text that is not harmony");
            }
            let first_call = h.first_call_offset();
            self.harmony_pieces(d, &mut out);
            if let Some(held) = self.held.take() {
                if complete {
                    self.calls += held.iter().filter(|p| matches!(p, Piece::Call(_))).count();
                    out.extend(held);
                } else if let Some(rest) = first_call
                    .and_then(|at| self.raw.get(at..))
                    .filter(|r| !r.is_empty())
                {
                    // Cut short after a call: the text from that call's message on is content.
                    out.push(Piece::Content(rest.to_string()));
                }
            }
            return out;
        }
        if let Some(r) = self.reasoning.as_mut() {
            let d = r.finish();
            self.reasoning_pieces(d, &mut out);
        }
        if let Some(p) = self.tools.as_mut() {
            let (rest, err) = p.finish();
            if let Some(e) = err {
                tracing::debug!(error = %e, "the answer holds text that is not a complete tool call");
            }
            for d in rest {
                self.gate(tool_piece(d), &mut out);
            }
        }
        if let Some(held) = self.held.take() {
            if complete {
                self.calls += held.iter().filter(|p| matches!(p, Piece::Call(_))).count();
                out.extend(held);
            } else if let Some(rest) = self.raw.get(self.released..).filter(|r| !r.is_empty()) {
                out.push(Piece::Content(rest.to_string()));
            }
        }
        out
    }
}

impl Shaper {
    fn harmony_pieces(&mut self, deltas: Vec<HarmonyDelta>, out: &mut Vec<Piece>) {
        for d in deltas {
            let p = match d {
                HarmonyDelta::Reasoning(r) => Piece::Reasoning(r),
                HarmonyDelta::Content(c) => Piece::Content(c),
                HarmonyDelta::Call(c) => Piece::Call(c),
            };
            self.gate(p, out);
        }
    }
}

fn tool_piece(d: ToolDelta) -> Piece {
    match d {
        ToolDelta::Content(s) => Piece::Content(s),
        ToolDelta::Call(c) => Piece::Call(c),
    }
}

/// A whole answer read at once: reasoning, content and calls.
#[derive(Clone, Debug, Default)]
pub struct Shaped {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

impl Shaped {
    pub fn add(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Reasoning(r) => self.reasoning.push_str(&r),
                Piece::Content(c) => self.content.push_str(&c),
                Piece::Call(c) => self.calls.push(c),
            }
        }
    }
}

/// 9 letters and digits derived from `seed` (FNV-1a), the id shape Mistral's templates check.
fn alnum9(seed: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let digits = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..9)
        .map(|i| digits[((h >> (i * 6)) % 62) as usize] as char)
        .collect()
}

/// A call id as a Mistral template takes it: kept when it is 9 letters and digits, else
/// mapped (the same way for the call and for the result that answers it).
fn mistral_id(id: &str) -> String {
    if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        id.to_string()
    } else {
        alnum9(id)
    }
}

/// Call ids of earlier turns in the shape Mistral's templates check (clients send
/// `call_...` ids from other servers).
fn mistral_ids(messages: &mut [ChatMessage]) {
    for m in messages {
        if let Some(calls) = &mut m.tool_calls {
            for c in calls {
                if let Some(id) = &mut c.id {
                    *id = mistral_id(id);
                }
            }
        }
        if let Some(id) = &mut m.tool_call_id {
            *id = mistral_id(id);
        }
    }
}

/// A new tool-call id: 9 letters and digits for Mistral (its templates check the length),
/// `call_` and a unique suffix otherwise.
pub fn call_id(format: Option<ToolFormat>) -> String {
    let id = crate::gen::new_id("call").replace('-', "_");
    if format == Some(ToolFormat::Mistral) {
        alnum9(&id)
    } else {
        id
    }
}
