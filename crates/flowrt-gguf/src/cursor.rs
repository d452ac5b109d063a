//! Bounds-checked little-endian reads over a byte slice.
//!
//! Every read checks the bytes that remain and reports a [`GgufError::Truncated`] naming what
//! was being read. The description is passed as `fmt::Arguments`, so it costs nothing unless
//! an error is actually built.

use std::fmt;

use crate::GgufError;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    /// Invariant: `pos <= buf.len()`.
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Byte offset of the next read.
    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the cursor.
    pub fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Fails with `Truncated` unless at least `need` bytes remain.
    pub fn ensure(&self, need: u64, what: fmt::Arguments<'_>) -> Result<(), GgufError> {
        if need > self.remaining() {
            return Err(self.truncated(need, what));
        }
        Ok(())
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: u64, what: fmt::Arguments<'_>) -> Result<&'a [u8], GgufError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n));
        let Some(bytes) = end.and_then(|end| self.buf.get(self.pos..end)) else {
            return Err(self.truncated(n, what));
        };
        self.pos += bytes.len();
        Ok(bytes)
    }

    pub fn array<const N: usize>(
        &mut self,
        what: fmt::Arguments<'_>,
    ) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub fn u32(&mut self, what: fmt::Arguments<'_>) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, what: fmt::Arguments<'_>) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: `u64` length, then that many UTF-8 bytes. Lengths over `max` are
    /// rejected before anything else is read.
    pub fn str(&mut self, max: u64, what: fmt::Arguments<'_>) -> Result<&'a str, GgufError> {
        let len = self.u64(format_args!("length of {what}"))?;
        if len > max {
            return Err(GgufError::StringTooLong {
                what: what.to_string(),
                len,
                max,
            });
        }
        let start = self.pos();
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what: what.to_string(),
            offset: start,
        })
    }

    fn truncated(&self, need: u64, what: fmt::Arguments<'_>) -> GgufError {
        GgufError::Truncated {
            what: what.to_string(),
            offset: self.pos(),
            need,
            have: self.remaining(),
        }
    }
}
