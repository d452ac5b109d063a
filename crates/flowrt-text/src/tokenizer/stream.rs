//! Incremental decoding of generated ids.

use super::Tokenizer;
use crate::TextError;

/// Turns ids into text one id at a time, never splitting a multi-byte character: bytes of an
/// incomplete character are held back until the id that completes it arrives. Bytes that can
/// never become a character are replaced by U+FFFD, exactly as `String::from_utf8_lossy` would
/// on the whole output; the text of all `push` calls plus `finish` equals
/// [`Tokenizer::decode`] of the same ids.
///
/// The decoder owns two small buffers and reuses them, so steady-state decoding allocates
/// nothing. It does not hold the tokenizer: pass the same one to every call.
///
/// ```no_run
/// # fn demo(tok: &flowrt_text::Tokenizer, ids: &[u32]) -> Result<(), flowrt_text::TextError> {
/// let mut dec = tok.stream_decoder(true);
/// for &id in ids {
///     print!("{}", dec.push(tok, id)?);
/// }
/// print!("{}", dec.finish());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TokenStreamDecoder {
    skip_special: bool,
    /// Bytes received but not yet emitted: at most an incomplete character (3 bytes).
    pending: Vec<u8>,
    /// The text returned by the last call.
    out: String,
    /// No byte has been seen yet (for the SentencePiece leading-space strip).
    at_start: bool,
}

impl TokenStreamDecoder {
    /// With `skip_special`, special tokens (control and unknown) produce no text.
    pub fn new(skip_special: bool) -> Self {
        Self {
            skip_special,
            pending: Vec::with_capacity(16),
            out: String::with_capacity(64),
            at_start: true,
        }
    }

    /// Feed one id; returns the text it completes (often the whole piece, sometimes nothing).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<&str, TextError> {
        self.out.clear();
        let piece = tok.token_to_piece(id)?;
        if self.skip_special && tok.is_special(id) {
            return Ok(&self.out);
        }
        let mut piece = piece;
        if self.at_start && !piece.is_empty() {
            self.at_start = false;
            if tok.strips_leading_space() && piece[0] == b' ' {
                piece = &piece[1..];
            }
        }
        self.pending.extend_from_slice(piece);
        self.drain_complete();
        Ok(&self.out)
    }

    /// End of stream: an incomplete character left over becomes U+FFFD. The decoder is then
    /// ready for a new stream.
    pub fn finish(&mut self) -> &str {
        self.out.clear();
        if !self.pending.is_empty() {
            self.out.push(char::REPLACEMENT_CHARACTER);
            self.pending.clear();
        }
        self.at_start = true;
        &self.out
    }

    /// Forget everything received so far.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.out.clear();
        self.at_start = true;
    }

    /// Move every complete character (and U+FFFD for every invalid sequence) from `pending`
    /// to `out`, keeping only an incomplete tail.
    fn drain_complete(&mut self) {
        let mut pos = 0;
        loop {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    self.out.push_str(s);
                    pos = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    let s = std::str::from_utf8(&self.pending[pos..pos + valid])
                        .expect("prefix checked valid");
                    self.out.push_str(s);
                    match e.error_len() {
                        Some(bad) => {
                            self.out.push(char::REPLACEMENT_CHARACTER);
                            pos += valid + bad;
                        }
                        None => {
                            pos += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..pos);
    }
}
