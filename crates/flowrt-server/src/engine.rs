//! The scheduler's view of the engine: one call advances every active sequence by a step.
//!
//! [`StepEngine::step`] is shaped for continuous batching: it receives the new tokens of every
//! active sequence (a whole or partial prompt for a sequence being prefilled, the last sampled
//! token for one being decoded) and returns each one's last logits. A batched engine runs that
//! as one forward pass over the weights with a KV cache slot per sequence.
//!
//! [`BatchStepper`] (what the server runs) does exactly that over a
//! [`flowrt_engine::BatchSession`]: every active sequence's tokens go through the model in
//! one pass, so N streams cost about one weight read per step. [`SessionStepper`] keeps one
//! [`Session`] per slot and steps them in turn; it is kept as the unbatched baseline.

use flowrt_engine::{BatchSession, EngineError, EngineOptions, LoadedModel, Session};

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

/// [`StepEngine`] over one [`BatchSession`]: a step's sequences share each forward pass.
/// Prompts longer than the batch are fed over several passes (decode tokens ride along in the
/// first).
pub struct BatchStepper {
    session: BatchSession,
    /// Scratch reused by every step, so a decode step allocates nothing sized by the
    /// vocabulary. Per work item: tokens fed so far, still running, finished; the finished
    /// items' logits (`work.len() x vocab`); this pass's order and chunks.
    fed: Vec<usize>,
    live: Vec<bool>,
    done: Vec<bool>,
    rows: Vec<f32>,
    order: Vec<usize>,
    items: Vec<(usize, usize, usize)>, // (work index, from, to)
}

impl BatchStepper {
    pub fn new(
        model: &LoadedModel,
        opts: &EngineOptions,
        slots: usize,
    ) -> Result<BatchStepper, EngineError> {
        Ok(BatchStepper {
            session: BatchSession::new(model, opts, slots.max(1))?,
            fed: Vec::new(),
            live: Vec::new(),
            done: Vec::new(),
            rows: Vec::new(),
            order: Vec::new(),
            items: Vec::new(),
        })
    }
}

impl StepEngine for BatchStepper {
    fn slots(&self) -> usize {
        self.session.n_slots()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn cached_prefix(&self, slot: usize, prompt: &[u32]) -> usize {
        self.session
            .tokens(slot)
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1))
    }

    fn truncate(&mut self, slot: usize, n: usize) {
        self.session.truncate(slot, n);
    }

    fn step(&mut self, work: &[SlotWork<'_>], on_logits: &mut OnLogits<'_>) {
        let vocab = self.session.vocab_size();
        let max = self.session.max_batch();
        let n = work.len();
        self.fed.clear();
        self.fed.resize(n, 0);
        self.done.clear();
        self.done.resize(n, false);
        self.rows.resize(n * vocab, 0.0);
        // A sequence whose tokens cannot fit its context fails alone, before any pass.
        self.live.clear();
        for (i, w) in work.iter().enumerate() {
            let fits = self.session.check_fits(w.slot, w.tokens.len(), 0);
            self.live.push(fits.is_ok());
            if let Err(e) = fits {
                on_logits(i, Err(e));
            }
        }
        loop {
            // This pass: every live, unfinished sequence's next chunk, within the batch size;
            // one-token decodes first so prompts never starve them.
            let mut budget = max;
            self.items.clear();
            self.order.clear();
            self.order
                .extend((0..n).filter(|&i| self.live[i] && self.fed[i] < work[i].tokens.len()));
            let fed = &self.fed;
            self.order.sort_by_key(|&i| work[i].tokens.len() - fed[i]);
            for &i in &self.order {
                if budget == 0 {
                    break;
                }
                let from = self.fed[i];
                let to = work[i].tokens.len().min(from + budget);
                budget -= to - from;
                self.items.push((i, from, to));
            }
            if self.items.is_empty() {
                break;
            }
            let batch: Vec<(usize, &[u32])> = self
                .items
                .iter()
                .map(|&(i, from, to)| (work[i].slot, &work[i].tokens[from..to]))
                .collect();
            match self.session.step(&batch) {
                Ok(logits) => {
                    for (row, &(i, _, to)) in self.items.iter().enumerate() {
                        self.fed[i] = to;
                        if to == work[i].tokens.len() {
                            self.done[i] = true;
                            self.rows[i * vocab..(i + 1) * vocab]
                                .copy_from_slice(&logits[row * vocab..(row + 1) * vocab]);
                        }
                    }
                }
                Err(e) => {
                    // A device failure fails every sequence of the pass.
                    let msg = e.to_string();
                    let mut first = Some(e);
                    for &(i, _, _) in &self.items {
                        self.live[i] = false;
                        let err = first
                            .take()
                            .unwrap_or_else(|| EngineError::Invalid(msg.clone()));
                        on_logits(i, Err(err));
                    }
                }
            }
        }
        for i in 0..n {
            if self.done[i] {
                on_logits(i, Ok(&self.rows[i * vocab..(i + 1) * vocab]));
            }
        }
    }
}
