//! Reasoning ("thinking") separation: models such as Qwen3, QwQ and the DeepSeek-R1 distills
//! write their reasoning between `<think>` and `</think>` before the answer.
//!
//! Where the opening tag comes from differs:
//! - DeepSeek-R1 style templates end the generation prompt with `<think>\n`, so the output
//!   starts inside the reasoning and only `</think>` appears in it;
//! - Qwen3's template leaves it to the model to write `<think>\n...\n</think>\n\n`;
//! - Qwen3 with `enable_thinking=false` renders an empty `<think>\n\n</think>\n\n` into the
//!   prompt, and the output is all answer.
//!
//! [`ReasoningSplitter::for_prompt`] starts in the reasoning exactly when the rendered prompt
//! ends inside an open `<think>`.

use crate::TextError;

/// Opening tag of a reasoning block.
pub const THINK_OPEN: &str = "<think>";
/// Closing tag of a reasoning block.
pub const THINK_CLOSE: &str = "</think>";

/// How a model marks its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReasoningFormat {
    /// The model does not reason in a marked block.
    None,
    /// `<think>` ... `</think>` before the answer.
    Think,
    /// The harmony format's `analysis` channel (gpt-oss; see [`crate::harmony`]). The model
    /// always reasons; `reasoning_effort` (low, medium, high) sets how much.
    Harmony,
}

impl ReasoningFormat {
    /// From the chat template source and the vocabulary's token texts: `Harmony` when
    /// [`crate::harmony::detect`] says so; `Think` when the template mentions `<think>` or
    /// `</think>`, or the vocabulary has both tags as tokens.
    pub fn detect<'a>(
        template_source: Option<&str>,
        token_texts: impl IntoIterator<Item = &'a str> + Clone,
    ) -> ReasoningFormat {
        if crate::harmony::detect(template_source, token_texts.clone()) {
            return ReasoningFormat::Harmony;
        }
        if let Some(t) = template_source {
            if t.contains(THINK_OPEN) || t.contains(THINK_CLOSE) {
                return ReasoningFormat::Think;
            }
        }
        let (mut open, mut close) = (false, false);
        for tok in token_texts {
            open |= tok == THINK_OPEN;
            close |= tok == THINK_CLOSE;
            if open && close {
                return ReasoningFormat::Think;
            }
        }
        ReasoningFormat::None
    }

    /// Whether the model can reason in a separate block at all.
    pub fn supports_thinking(self) -> bool {
        self != ReasoningFormat::None
    }

    /// `Ok` when a request for thinking (`think: true`, a reasoning effort, ...) can be
    /// honoured, otherwise an error that says why (a client error).
    pub fn require_thinking(self) -> Result<(), TextError> {
        if self.supports_thinking() {
            Ok(())
        } else {
            Err(TextError::ThinkingUnsupported)
        }
    }

    /// The name `flowrt show` prints.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningFormat::None => "none",
            ReasoningFormat::Think => "think",
            ReasoningFormat::Harmony => "harmony",
        }
    }
}

/// Whether a template switches thinking with an `enable_thinking` variable (Qwen3 style).
pub fn template_reads_enable_thinking(template_source: &str) -> bool {
    template_source.contains("enable_thinking")
}

/// Whether a rendered prompt ends inside an open `<think>` block (only whitespace after the
/// last `<think>`, and no `</think>` after it).
pub fn prompt_ends_in_reasoning(prompt: &str) -> bool {
    match prompt.rfind(THINK_OPEN) {
        Some(at) => prompt[at + THINK_OPEN.len()..].trim().is_empty(),
        None => false,
    }
}

/// What a [`ReasoningSplitter`] releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReasoningDelta {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace yet: a `<think>` may open.
    Start,
    /// Inside the reasoning, nothing released yet (leading newlines are dropped).
    ReasoningStart,
    Reasoning,
    /// Just after `</think>`: leading whitespace is dropped.
    AfterReasoning,
    Content,
}

/// Splits generated text into reasoning and answer as it arrives.
///
/// `<think>` is recognised only at the start of the output (after whitespace); `</think>`
/// ends the reasoning. Newlines right after `<think>`, right before `</think>` and whitespace
/// right after `</think>` belong to neither part. Partial tags and trailing newlines of the
/// reasoning are held back until the next text decides them.
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    phase: Phase,
    buf: String,
    opened: bool,
}

impl ReasoningSplitter {
    /// `in_reasoning`: the prompt already opened the reasoning block.
    pub fn new(in_reasoning: bool) -> Self {
        Self {
            phase: if in_reasoning {
                Phase::ReasoningStart
            } else {
                Phase::Start
            },
            buf: String::new(),
            opened: in_reasoning,
        }
    }

    /// A splitter for the output that follows `prompt` (see [`prompt_ends_in_reasoning`]).
    pub fn for_prompt(prompt: &str) -> Self {
        Self::new(prompt_ends_in_reasoning(prompt))
    }

    /// Whether the output is (so far) inside the reasoning.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.phase, Phase::ReasoningStart | Phase::Reasoning)
    }

    /// Whether a reasoning block was opened (by the prompt or the output).
    pub fn had_reasoning(&self) -> bool {
        self.opened
    }

    /// Feed the next piece of generated text.
    pub fn push(&mut self, delta: &str) -> Vec<ReasoningDelta> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        self.step(&mut out, false);
        out
    }

    /// The output is complete: release what was held. An unclosed reasoning block stays
    /// reasoning.
    pub fn finish(&mut self) -> Vec<ReasoningDelta> {
        let mut out = Vec::new();
        self.step(&mut out, true);
        out
    }

    fn step(&mut self, out: &mut Vec<ReasoningDelta>, end: bool) {
        loop {
            match self.phase {
                Phase::Start => {
                    let t = self.buf.trim_start();
                    if t.starts_with(THINK_OPEN) {
                        let at = self.buf.len() - t.len() + THINK_OPEN.len();
                        self.buf.drain(..at);
                        self.phase = Phase::ReasoningStart;
                        self.opened = true;
                    } else if !end && THINK_OPEN.starts_with(t) {
                        return; // empty or a partial `<think>`: wait
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::ReasoningStart => {
                    let t = self.buf.trim_start_matches(['\n', '\r']);
                    if t.is_empty() && !end {
                        return;
                    }
                    let at = self.buf.len() - t.len();
                    self.buf.drain(..at);
                    self.phase = Phase::Reasoning;
                }
                Phase::Reasoning => {
                    if let Some(at) = self.buf.find(THINK_CLOSE) {
                        let r = self.buf[..at].trim_end_matches(['\n', '\r']).to_string();
                        push(out, ReasoningDelta::Reasoning(r));
                        self.buf.drain(..at + THINK_CLOSE.len());
                        self.phase = Phase::AfterReasoning;
                        continue;
                    }
                    let keep = if end {
                        self.buf.trim_end_matches(['\n', '\r']).len()
                    } else {
                        held_from(&self.buf)
                    };
                    let r: String = self.buf.drain(..keep).collect();
                    push(out, ReasoningDelta::Reasoning(r));
                    if end {
                        self.buf.clear();
                    }
                    return;
                }
                Phase::AfterReasoning => {
                    let t = self.buf.trim_start();
                    if t.is_empty() && !end {
                        self.buf.clear();
                        return;
                    }
                    let at = self.buf.len() - t.len();
                    self.buf.drain(..at);
                    self.phase = Phase::Content;
                }
                Phase::Content => {
                    let c = std::mem::take(&mut self.buf);
                    push(out, ReasoningDelta::Content(c));
                    return;
                }
            }
        }
    }
}

fn push(out: &mut Vec<ReasoningDelta>, d: ReasoningDelta) {
    match (&d, out.last_mut()) {
        (ReasoningDelta::Reasoning(s) | ReasoningDelta::Content(s), _) if s.is_empty() => {}
        (ReasoningDelta::Reasoning(s), Some(ReasoningDelta::Reasoning(last)))
        | (ReasoningDelta::Content(s), Some(ReasoningDelta::Content(last))) => last.push_str(s),
        _ => out.push(d),
    }
}

/// Where the held-back tail of reasoning starts: a possible `</think>` prefix and the
/// newlines before it.
fn held_from(buf: &str) -> usize {
    let mut from = buf.len();
    for (i, _) in buf.char_indices() {
        if buf.len() - i < THINK_CLOSE.len() && THINK_CLOSE.starts_with(&buf[i..]) {
            from = i;
            break;
        }
    }
    buf[..from].trim_end_matches(['\n', '\r']).len()
}

/// Split a finished output (see [`ReasoningSplitter`]): `(reasoning, content)`; `reasoning` is
/// `None` when the output had no reasoning block.
pub fn split_reasoning(in_reasoning: bool, text: &str) -> (Option<String>, String) {
    let mut s = ReasoningSplitter::new(in_reasoning);
    let mut deltas = s.push(text);
    let opened = s.opened;
    deltas.extend(s.finish());
    let mut reasoning = String::new();
    let mut content = String::new();
    for d in deltas {
        match d {
            ReasoningDelta::Reasoning(r) => reasoning.push_str(&r),
            ReasoningDelta::Content(c) => content.push_str(&c),
        }
    }
    (opened.then_some(reasoning), content)
}
