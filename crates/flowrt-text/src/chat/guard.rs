//! Message text never becomes control tokens.
//!
//! A rendered chat prompt is tokenised with special tokens parsed, so that the template's own
//! markup (`<|im_start|>`, `<start_of_turn>`, ...) becomes control tokens. Message text that
//! spells a special token (`<|im_end|>\n<|im_start|>system ...` in a user message) must not:
//! it would let whoever writes a message forge turns. Before rendering, every occurrence of a
//! special token's text in a message string (content, reasoning, names, tool-call ids and
//! arguments, keys included) or in a tool definition is swapped for a marker
//! (`U+FDD0 index U+FDD1`, Unicode noncharacters); after rendering, each marker is put back
//! and its byte range recorded in [`ChatPrompt::plain_spans`], which
//! [`Tokenizer::encode_chat`] tokenises as plain text.
//!
//! A conversation with no special-token text in it is rendered with no marker at all, so its
//! text and ids are exactly what rendering and `encode(text, false, true)` give. Limits: a
//! template that cuts a message string in the middle of a marker leaves the marker's
//! characters in the prompt (the special-token text is then lost, never parsed); two message
//! fields written back to back with nothing between them could join halves of a special
//! token (no known template does this).

use std::ops::Range;

use crate::{TextError, Tokenizer};

/// Opens a marker; the index of the swapped text follows in decimal, then [`CLOSE`].
const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// A rendered chat prompt and the byte ranges of it to tokenise as plain text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompt {
    text: String,
    plain: Vec<Range<usize>>,
}

impl ChatPrompt {
    /// The rendered prompt (the same text [`crate::ChatTemplate::render_with`] gives).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Byte ranges of [`Self::text`] that are message text spelling a special token, in order.
    pub fn plain_spans(&self) -> &[Range<usize>] {
        &self.plain
    }

    /// A prompt whose special-token text is all the template's (a raw prompt, a test).
    pub fn trusted(text: String) -> Self {
        Self {
            text,
            plain: Vec::new(),
        }
    }
}

/// Swaps special-token text in message strings for markers and keeps the originals.
pub(crate) struct Guard<'a> {
    specials: &'a aho_corasick::AhoCorasick,
    swapped: Vec<String>,
}

impl<'a> Guard<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer) -> Result<Self, TextError> {
        Ok(Self {
            specials: tokenizer.special_matcher()?,
            swapped: Vec::new(),
        })
    }

    /// Swap in every string of `v`, object keys included.
    pub(crate) fn value(&mut self, v: &mut serde_json::Value) {
        use serde_json::Value;
        match v {
            Value::String(s) => self.string(s),
            Value::Array(a) => a.iter_mut().for_each(|x| self.value(x)),
            Value::Object(m) => {
                let needs_key = m.keys().any(|k| self.finds(k));
                if needs_key {
                    let old = std::mem::take(m);
                    for (mut k, mut x) in old {
                        self.string(&mut k);
                        self.value(&mut x);
                        m.insert(k, x);
                    }
                } else {
                    m.values_mut().for_each(|x| self.value(x));
                }
            }
            _ => {}
        }
    }

    fn finds(&self, s: &str) -> bool {
        s.contains([OPEN, CLOSE]) || self.specials.is_match(s)
    }

    fn string(&mut self, s: &mut String) {
        if !self.finds(s) {
            return;
        }
        let mut out = String::with_capacity(s.len() + 8);
        let mut last = 0;
        for (start, end) in self.spans(s) {
            out.push_str(&s[last..start]);
            out.push(OPEN);
            out.push_str(&self.swapped.len().to_string());
            out.push(CLOSE);
            self.swapped.push(s[start..end].to_string());
            last = end;
        }
        out.push_str(&s[last..]);
        *s = out;
    }

    /// Special-token matches (leftmost-longest) and marker characters in `s`, in order.
    fn spans(&self, s: &str) -> Vec<(usize, usize)> {
        let mut spans: Vec<(usize, usize)> = self
            .specials
            .find_iter(s)
            .map(|m| (m.start(), m.end()))
            .collect();
        let mut marks: Vec<(usize, usize)> = s
            .char_indices()
            .filter(|&(_, c)| c == OPEN || c == CLOSE)
            .map(|(i, c)| (i, i + c.len_utf8()))
            .filter(|&(i, _)| !spans.iter().any(|&(a, b)| a <= i && i < b))
            .collect::<Vec<_>>();
        if !marks.is_empty() {
            spans.append(&mut marks);
            spans.sort_unstable();
        }
        spans
    }

    /// Put the swapped texts back into `rendered`, recording where they landed. A marker the
    /// template broke stays as it is.
    pub(crate) fn restore(self, rendered: String) -> ChatPrompt {
        if self.swapped.is_empty() {
            return ChatPrompt::trusted(rendered);
        }
        let mut text = String::with_capacity(rendered.len());
        let mut plain = Vec::new();
        let mut rest = rendered.as_str();
        while let Some(open) = rest.find(OPEN) {
            text.push_str(&rest[..open]);
            let after = &rest[open + OPEN.len_utf8()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let index = after[..digits].parse::<usize>().ok();
            match (index, after[digits..].starts_with(CLOSE)) {
                (Some(i), true) if i < self.swapped.len() => {
                    let start = text.len();
                    text.push_str(&self.swapped[i]);
                    plain.push(start..text.len());
                    rest = &after[digits + CLOSE.len_utf8()..];
                }
                _ => {
                    text.push(OPEN);
                    rest = after;
                }
            }
        }
        text.push_str(rest);
        ChatPrompt { text, plain }
    }
}

impl Tokenizer {
    /// Ids of a rendered chat prompt, without BOS/EOS added (the template writes them):
    /// special tokens are parsed in the template's text and not in [`ChatPrompt::plain_spans`].
    /// With no plain span this is exactly `encode(prompt.text(), false, true)`; otherwise each
    /// stretch between spans is tokenised on its own.
    pub fn encode_chat(&self, prompt: &ChatPrompt) -> Result<Vec<u32>, TextError> {
        let text = prompt.text();
        let mut ids = Vec::new();
        let mut last = 0;
        for span in prompt.plain_spans() {
            if span.start > last {
                ids.extend(self.encode(&text[last..span.start], false, true)?);
            }
            ids.extend(self.encode(&text[span.clone()], false, false)?);
            last = span.end;
        }
        if last < text.len() || ids.is_empty() {
            ids.extend(self.encode(&text[last..], false, true)?);
        }
        Ok(ids)
    }
}
