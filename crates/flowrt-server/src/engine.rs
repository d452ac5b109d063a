//! The scheduler's view of the engine: one call advances every active sequence by a step.
//!
//! [`StepEngine::step`] is shaped for continuous batching: it receives the new tokens of every
//! active sequence (a whole or partial prompt for a sequence being prefilled, the last sampled
//! token for one being decoded) and returns each one's last logits. A batched engine runs that
//! as one forward pass over the weights with a KV cache slot per sequence.
//!
//! **Not batched yet.** The engine has no multi-sequence step today, so [`SessionStepper`]
//! keeps one [`Session`] (its own KV cache) per slot and runs the sequences of a step one
//! after another. Throughput with N concurrent streams is therefore about that of one stream;
//! what the scheduler already provides is fair interleaving (every active sequence advances
//! one token per step), a bounded queue, cancellation within a step and prefix reuse per slot.

use flowrt_engine::{EngineError, EngineOptions, LoadedModel, Session};

/// Receives each sequence's logits (or its error) after a step: `(index in work, result)`.
pub type OnLogits<'a> = dyn FnMut(usize, Result<&[f32], EngineError>) + 'a;

/// One sequence's share of a step: append `tokens` to the sequence in `slot`.
#[derive(Clone, Copy, Debug)]
pub struct SlotWork<'a> {
    pub slot: usize,
    /// Never empty.
    pub tokens: &'a [u32],
}

/// Runs forward passes for up to [`StepEngine::slots`] sequences, each in its own KV cache slot.
pub trait StepEngine: Send {
    /// How many sequences can be active at once.
    fn slots(&self) -> usize;
    /// Context length of every slot.
    fn n_ctx(&self) -> usize;
    /// How many leading tokens of `prompt` the slot's cache already holds and can keep (never
    /// all of them: the last prompt token is always recomputed so its logits are fresh).
    fn cached_prefix(&self, slot: usize, prompt: &[u32]) -> usize;
    /// Keep the first `n` tokens of the slot's cache and forget the rest.
    fn truncate(&mut self, slot: usize, n: usize);
    /// Append each item's tokens to its slot's sequence and call `on_logits(i, logits)` with
    /// the logits after the last token of `work[i]` (or the error that sequence hit). Slots in
    /// `work` are distinct.
    fn step(&mut self, work: &[SlotWork<'_>], on_logits: &mut OnLogits<'_>);
}

/// [`StepEngine`] over one [`Session`] per slot, stepped in turn (no batching across
/// sequences; see the module docs).
pub struct SessionStepper {
    sessions: Vec<Session>,
    n_ctx: usize,
}

impl SessionStepper {
    pub fn new(
        model: &LoadedModel,
        opts: &EngineOptions,
        slots: usize,
    ) -> Result<SessionStepper, EngineError> {
        let sessions = (0..slots.max(1))
            .map(|_| Session::new(model, opts))
            .collect::<Result<Vec<_>, _>>()?;
        let n_ctx = sessions[0].n_ctx();
        Ok(SessionStepper { sessions, n_ctx })
    }
}

impl StepEngine for SessionStepper {
    fn slots(&self) -> usize {
        self.sessions.len()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn cached_prefix(&self, slot: usize, prompt: &[u32]) -> usize {
        self.sessions[slot].common_prefix(prompt)
    }

    fn truncate(&mut self, slot: usize, n: usize) {
        self.sessions[slot].truncate(n);
    }

    fn step(&mut self, work: &[SlotWork<'_>], on_logits: &mut OnLogits<'_>) {
        for (i, w) in work.iter().enumerate() {
            on_logits(i, self.sessions[w.slot].feed(w.tokens));
        }
    }
}
