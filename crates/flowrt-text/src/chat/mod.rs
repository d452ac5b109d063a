//! Chat templates: the Jinja source in `tokenizer.chat_template`, rendered as HF transformers
//! renders it (`apply_chat_template(tokenize=False)`).
//!
//! The environment copies what HF sets up on jinja2: `trim_blocks` and `lstrip_blocks`, loop
//! controls, `raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` filter that is Python's
//! `json.dumps` (non-ASCII kept, `indent`), Python string/dict methods (`.strip()`,
//! `.startswith()`, `.items()`, ...), and Python's printing of `True`/`False`/`None`. Work is
//! bounded by minijinja's fuel.
//!
//! [`ChatTemplate::render_with`] also gives the template `tools` and extra variables, as
//! `apply_chat_template(messages, tools=..., **kwargs)` does; messages carry tool calls, tool
//! results and reasoning ([`ChatMessage`]). Tested against transformers on real model templates
//! (`tests/fixtures/text/tool_templates.json`). One known difference: `{% for x in none %}`
//! loops zero times here where jinja2 raises (Hermes 2 Pro's template without tools).

mod guard;
mod pyfmt;
pub mod sandbox;

pub use guard::ChatPrompt;
use guard::Guard;

use minijinja::value::Kwargs;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{GgufVocab, TextError};

/// One chat message as templates see it: a dict with `role` and, when present, `content`,
/// `reasoning_content`, `tool_calls`, `tool_call_id` and `name`.
///
/// Fields that are `None` are left out of the dict, as transformers drops `None`-valued keys
/// before rendering, so `message.tool_calls is defined` and `'content' in message` behave as
/// they do there. When `reasoning_content` is set the template also sees it as `thinking`
/// (transformers adds that alias for templates that read it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with a role and text content and nothing else.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(content.into()),
            ..Default::default()
        }
    }

    /// The content text, `""` when there is none.
    pub fn text(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }

    /// The dict a template sees (see the type's documentation).
    fn template_value(&self) -> Result<serde_json::Value, TextError> {
        let json = serde_json::to_value(self).map_err(|e| TextError::TemplateInput {
            what: "message",
            message: e.to_string(),
        })?;
        let serde_json::Value::Object(fields) = json else {
            return Err(TextError::TemplateInput {
                what: "message",
                message: "not an object".into(),
            });
        };
        let mut map = serde_json::Map::new();
        if let Some(r) = &self.reasoning_content {
            map.insert("thinking".into(), serde_json::Value::String(r.clone()));
        }
        map.extend(fields);
        Ok(serde_json::Value::Object(map))
    }
}

/// A tool call of an assistant message, as OpenAI's API and HF templates write it:
/// `{"id": ..., "type": "function", "function": {"name": ..., "arguments": {...}}}`.
/// `arguments` is a JSON value (an object for templates that `tojson` it); OpenAI's wire form
/// carries it as a JSON string, which the server parses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".into()
}

impl ToolCall {
    /// A `"function"` call.
    pub fn function(
        id: Option<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        Self {
            id,
            kind: function_kind(),
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// The function part of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

/// What one render gets besides the messages (see [`ChatTemplate::render_with`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// Open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// OpenAI tool definitions (`{"type": "function", "function": {"name", "description",
    /// "parameters"}}`), given to the template as `tools`; `None` gives it `tools = none`.
    pub tools: Option<&'a [serde_json::Value]>,
    /// Extra top-level template variables (`enable_thinking`, `reasoning_effort`,
    /// `date_string`, ...). They override `bos_token`/`eos_token` as in transformers.
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// Instructions one render may execute. A long chat with a tool-heavy template takes well
/// under a million; the limit stops runaway loops in a hostile template.
const FUEL: u64 = 20_000_000;

const NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    source: String,
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source`; `bos`/`eos` are the texts of the BOS and EOS tokens, given to the
    /// template as `bos_token` and `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(|state, value, method, args| {
            check_deadline()?;
            minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
        });
        env.set_formatter(|out, _state, value| {
            check_deadline()?;
            let mut s = String::new();
            pyfmt::py_str(&mut s, value);
            out.write_str(&s).map_err(Error::from)
        });
        env.add_filter("tojson", |v: &Value, kwargs: Kwargs| {
            pyfmt::tojson(v, kwargs)
        });
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_string())
            .map_err(TextError::TemplateSyntax)?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// The Jinja source the template was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The model's own template, or `None` when the GGUF has none (there is no silent
    /// fallback: a caller that needs chat reports [`TextError::NoChatTemplate`]).
    pub fn from_vocab(v: &GgufVocab) -> Result<Option<Self>, TextError> {
        let Some(source) = &v.chat_template else {
            return Ok(None);
        };
        let text = |id: Option<u32>| {
            id.and_then(|i| v.tokens.get(i as usize))
                .map(String::as_str)
                .unwrap_or("")
        };
        Self::new(source, text(v.bos), text(v.eos)).map(Some)
    }

    /// Render a conversation. `add_generation_prompt` asks the template to open the
    /// assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                ..Default::default()
            },
        )
    }

    /// Render a conversation with tools and extra template variables, as transformers'
    /// `apply_chat_template(messages, tools=tools, add_generation_prompt=..., **kwargs,
    /// tokenize=False)` does.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions<'_>,
    ) -> Result<String, TextError> {
        let msgs = messages
            .iter()
            .map(ChatMessage::template_value)
            .collect::<Result<Vec<_>, _>>()?;
        let tools = opts.tools.map(|t| serde_json::Value::Array(t.to_vec()));
        self.render_values(msgs, tools, opts)
    }

    /// Render a conversation for `tokenizer` as [`Self::render_with`] does, recording which
    /// stretches of the prompt are message or tool-definition text that spells a special
    /// token, so that [`Tokenizer::encode_chat`] keeps them plain text (see [`ChatPrompt`]).
    /// This is the one way flowrt turns a conversation into a prompt.
    pub fn render_prompt(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions<'_>,
        tokenizer: &crate::Tokenizer,
    ) -> Result<ChatPrompt, TextError> {
        let mut guard = Guard::new(tokenizer)?;
        let mut msgs = Vec::with_capacity(messages.len());
        for m in messages {
            let mut v = m.template_value()?;
            guard.value(&mut v);
            msgs.push(v);
        }
        let tools = opts.tools.map(|t| {
            let mut v = serde_json::Value::Array(t.to_vec());
            guard.value(&mut v);
            v
        });
        let text = self.render_values(msgs, tools, opts)?;
        Ok(guard.restore(text))
    }

    fn render_values(
        &self,
        msgs: Vec<serde_json::Value>,
        tools: Option<serde_json::Value>,
        opts: &RenderOptions<'_>,
    ) -> Result<String, TextError> {
        for k in opts.kwargs.into_iter().flat_map(|m| m.keys()) {
            if RESERVED.contains(&k.as_str()) {
                return Err(TextError::TemplateInput {
                    what: "template variable",
                    message: format!(
                        "{k:?} is set by the renderer and cannot be passed as a kwarg"
                    ),
                });
            }
        }
        if let Some(sandbox) = sandbox::get() {
            return sandbox.render(&sandbox::RequestRef {
                source: &self.source,
                bos: &self.bos,
                eos: &self.eos,
                messages: &msgs,
                tools: tools.as_ref(),
                kwargs: opts.kwargs,
                add_generation_prompt: opts.add_generation_prompt,
            });
        }
        self.render_local(
            &msgs,
            tools.as_ref(),
            opts.kwargs,
            opts.add_generation_prompt,
        )
    }

    /// Render in this process, bounded by fuel, output size and the clock (kwargs already
    /// checked against [`RESERVED`]).
    fn render_local(
        &self,
        msgs: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(TextError::TemplateRender)?;
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("bos_token".into(), Value::from(self.bos.as_str()));
        ctx.insert("eos_token".into(), Value::from(self.eos.as_str()));
        for (k, v) in kwargs.into_iter().flatten() {
            if !RESERVED.contains(&k.as_str()) {
                ctx.insert(k.clone(), Value::from_serialize(v));
            }
        }
        let msgs: Vec<Value> = msgs.iter().map(Value::from_serialize).collect();
        ctx.insert("messages".into(), Value::from(msgs));
        ctx.insert(
            "tools".into(),
            match tools {
                Some(t) => Value::from_serialize(t),
                None => Value::from(()),
            },
        );
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let mut out = CappedOutput {
            buf: Vec::new(),
            over: false,
        };
        let deadline = DeadlineGuard::start(RENDER_TIME_LIMIT);
        let result = tmpl.render_captured_to(Value::from(ctx), &mut out);
        let timed_out = deadline.timed_out();
        drop(deadline);
        match result {
            Ok(_) => {}
            Err(_) if out.over => {
                return Err(TextError::TemplateTooLong {
                    limit: MAX_RENDERED_BYTES,
                })
            }
            Err(_) if timed_out => {
                return Err(TextError::TemplateTimeout {
                    limit: RENDER_TIME_LIMIT,
                })
            }
            Err(e) => return Err(TextError::TemplateRender(e)),
        }
        // Every write was a whole `&str` the template produced.
        String::from_utf8(out.buf).map_err(|e| TextError::TemplateInput {
            what: "rendered prompt",
            message: e.to_string(),
        })
    }
}

/// Most bytes one render may write. Fuel bounds instructions, not bytes: a loop of a few
/// instructions that prints a long message again and again would otherwise build a prompt
/// of gigabytes before anything could refuse it. A real prompt is a small multiple of the
/// request that carries it (requests are bounded by the server's body limit).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// Longest one render may run. Fuel counts instructions, but one instruction can take long
/// (serialising a large conversation, a string method on a long message), so a loop well
/// within the fuel could run for minutes. The clock is read wherever rendering runs flowrt's
/// code: each piece of output, the `tojson` filter (per item), Python string methods and
/// `strftime_now`. A loop that calls none of them (only operators and minijinja's own
/// filters) is bounded by the fuel alone.
pub const RENDER_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

thread_local! {
    /// The current render's deadline on this thread, and whether it has passed.
    static DEADLINE: std::cell::Cell<(Option<std::time::Instant>, bool)> =
        const { std::cell::Cell::new((None, false)) };
}

/// Sets this thread's render deadline; restores the previous one when dropped.
struct DeadlineGuard {
    prev: (Option<std::time::Instant>, bool),
}

impl DeadlineGuard {
    fn start(limit: std::time::Duration) -> Self {
        let prev = DEADLINE.get();
        DEADLINE.set((Some(std::time::Instant::now() + limit), false));
        Self { prev }
    }

    fn timed_out(&self) -> bool {
        DEADLINE.get().1
    }
}

impl Drop for DeadlineGuard {
    fn drop(&mut self) {
        DEADLINE.set(self.prev);
    }
}

/// An error once the current render's deadline has passed.
pub(crate) fn check_deadline() -> Result<(), Error> {
    match DEADLINE.get() {
        (Some(t), _) if std::time::Instant::now() > t => {
            DEADLINE.set((Some(t), true));
            Err(Error::new(
                ErrorKind::InvalidOperation,
                "chat template ran out of time",
            ))
        }
        _ => Ok(()),
    }
}

/// The render's output, refusing to grow past [`MAX_RENDERED_BYTES`].
struct CappedOutput {
    buf: Vec<u8>,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        check_deadline().map_err(std::io::Error::other)?;
        if self.buf.len() + data.len() > MAX_RENDERED_BYTES {
            self.over = true;
            return Err(std::io::Error::other("chat template output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Variables the renderer sets itself (transformers refuses them as kwargs too).
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// `strftime_now(fmt)`: local time formatted with C strftime codes.
fn strftime_now(fmt: String) -> Result<Value, Error> {
    check_deadline()?;
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write as _;
    let items: Vec<Item<'_>> = StrftimeItems::new(&fmt).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format {fmt:?}"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime_now: format failed"))?;
    Ok(Value::from(out))
}
