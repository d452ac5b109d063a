//! Chat templates: the Jinja source in `tokenizer.chat_template`, rendered as HF transformers
//! renders it (`apply_chat_template(tokenize=False)`).
//!
//! The environment copies what HF sets up on jinja2: `trim_blocks` and `lstrip_blocks`, loop
//! controls, `raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` filter that is Python's
//! `json.dumps` (non-ASCII kept, `indent`), Python string/dict methods (`.strip()`,
//! `.startswith()`, `.items()`, ...), and Python's printing of `True`/`False`/`None`. Work is
//! bounded by minijinja's fuel.

mod pyfmt;

use minijinja::value::Kwargs;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::{GgufVocab, TextError};

/// One chat message as templates see it (`message['role']`, `message['content']`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Instructions one render may execute. A long chat with a tool-heavy template takes well
/// under a million; the limit stops runaway loops in a hostile template.
const FUEL: u64 = 20_000_000;

const NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
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
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
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
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
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
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(TextError::TemplateRender)?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
            tools => Value::from(()),
            documents => Value::from(()),
        };
        tmpl.render(ctx).map_err(TextError::TemplateRender)
    }
}

/// `strftime_now(fmt)`: local time formatted with C strftime codes.
fn strftime_now(fmt: String) -> Result<Value, Error> {
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
