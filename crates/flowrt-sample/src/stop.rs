//! Stop strings over streamed text.

/// What to print after one [`StopMatcher::push`] or [`StopMatcher::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopResult<'a> {
    /// Text that is now safe to show: it cannot be part of a stop string.
    pub emit: &'a str,
    /// A stop string was found; `emit` ends right before it and generation should end.
    pub stopped: bool,
}

/// Watches streamed text for stop strings.
///
/// Any tail of the text that could still grow into a stop string is held back, so the
/// reader never sees part of a stop string printed. When a stop string is found, the
/// text before its first occurrence is emitted and `stopped` is reported; everything
/// after is dropped. Joining all `emit`s (including [`StopMatcher::finish`]'s) gives the
/// text up to, excluding, the earliest occurrence of any stop string, or all of it.
///
/// Empty stop strings are ignored. Buffers are reused between calls, so steady-state
/// pushes do not allocate.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Length in bytes of the longest stop string.
    max_len: usize,
    /// Text received but not yet emitted: a tail that may start a stop string.
    pending: String,
    /// Backing store for the `emit` slice handed out by the last call.
    out: String,
    /// Index into `stops` of the string that stopped the stream.
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        StopMatcher {
            pending: String::with_capacity(max_len * 2),
            stops,
            max_len,
            out: String::new(),
            matched: None,
        }
    }

    /// The stop strings in use (empty ones removed).
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// True once a stop string has been found; further pushes emit nothing.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that ended the stream, if any.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Forgets held-back text and the stopped state, keeping the stop strings.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.out.clear();
        self.matched = None;
    }

    /// Adds the next piece of generated text and returns what may be printed now.
    pub fn push(&mut self, piece: &str) -> StopResult<'_> {
        self.out.clear();
        if self.matched.is_some() {
            return self.result();
        }
        if self.stops.is_empty() {
            self.out.push_str(piece);
            return self.result();
        }
        self.pending.push_str(piece);
        let full = self.earliest_full_match();
        let partial = self.earliest_partial_match();
        match (full, partial) {
            // A complete stop string with no earlier candidate still open: stop there.
            (Some((at, i)), None) => self.stop_at(at, i),
            (Some((at, i)), Some(q)) if q >= at => self.stop_at(at, i),
            // Otherwise everything before the earliest open candidate is safe. (A full
            // match after an open candidate stays in `pending` and is found again.)
            (_, q) => {
                let safe = q.unwrap_or(self.pending.len());
                self.out.push_str(&self.pending[..safe]);
                self.pending.drain(..safe);
            }
        }
        self.result()
    }

    /// Ends the stream: no more text can complete a stop string, so the held-back text
    /// is emitted, up to a stop string if it holds a complete one.
    pub fn finish(&mut self) -> StopResult<'_> {
        self.out.clear();
        if self.matched.is_none() {
            match self.earliest_full_match() {
                Some((at, i)) => self.stop_at(at, i),
                None => {
                    self.out.push_str(&self.pending);
                    self.pending.clear();
                }
            }
        }
        self.result()
    }

    fn result(&self) -> StopResult<'_> {
        StopResult {
            emit: &self.out,
            stopped: self.matched.is_some(),
        }
    }

    fn stop_at(&mut self, at: usize, stop: usize) {
        self.out.push_str(&self.pending[..at]);
        self.pending.clear();
        self.matched = Some(stop);
    }

    /// Earliest (byte offset, stop index) of a complete stop string in `pending`.
    fn earliest_full_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, i)))
            .min()
    }

    /// Earliest offset `q` where `pending[q..]` is a proper prefix of some stop string,
    /// i.e. text that might still become a stop string.
    fn earliest_partial_match(&self) -> Option<usize> {
        let len = self.pending.len();
        let from = len.saturating_sub(self.max_len - 1);
        (from..len).find(|&q| {
            self.pending.is_char_boundary(q) && {
                let tail = &self.pending[q..];
                self.stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
            }
        })
    }
}
