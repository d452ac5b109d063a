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
    /// Per work item: tokens fed so far this step, and its final logits.
    fed: Vec<usize>,
    done: Vec<Option<Vec<f32>>>,
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
            done: Vec::new(),
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
        self.fed.clear();
        self.fed.resize(work.len(), 0);
        self.done.clear();
        self.done.resize(work.len(), None);
        // A sequence whose tokens cannot fit its context fails alone, before any pass.
        let mut live: Vec<bool> = work
            .iter()
            .enumerate()
            .map(
                |(i, w)| match self.session.check_fits(w.slot, w.tokens.len(), 0) {
                    Ok(()) => true,
                    Err(e) => {
                        on_logits(i, Err(e));
                        false
                    }
                },
            )
            .collect();
        loop {
            // This pass: every live, unfinished sequence's next chunk, within the batch size;
            // one-token decodes first so prompts never starve them.
            let mut budget = max;
            let mut items: Vec<(usize, usize, usize)> = Vec::new(); // (work index, from, to)
            let mut order: Vec<usize> = (0..work.len())
                .filter(|&i| live[i] && self.fed[i] < work[i].tokens.len())
                .collect();
            order.sort_by_key(|&i| work[i].tokens.len() - self.fed[i]);
            for i in order {
                if budget == 0 {
                    break;
                }
                let from = self.fed[i];
                let to = work[i].tokens.len().min(from + budget);
                budget -= to - from;
                items.push((i, from, to));
            }
            if items.is_empty() {
                break;
            }
            let batch: Vec<(usize, &[u32])> = items
                .iter()
                .map(|&(i, from, to)| (work[i].slot, &work[i].tokens[from..to]))
                .collect();
            match self.session.step(&batch) {
                Ok(logits) => {
                    for (row, &(i, _, to)) in items.iter().enumerate() {
                        self.fed[i] = to;
                        if to == work[i].tokens.len() {
                            self.done[i] = Some(logits[row * vocab..(row + 1) * vocab].to_vec());
                        }
                    }
                }
                Err(e) => {
                    // A device failure fails every sequence of the pass.
                    let msg = e.to_string();
                    let mut first = Some(e);
                    for &(i, _, _) in &items {
                        live[i] = false;
                        let err = first
                            .take()
                            .unwrap_or_else(|| EngineError::Invalid(msg.clone()));
                        on_logits(i, Err(err));
                    }
                }
            }
        }
        for (i, d) in self.done.iter().enumerate() {
            if let Some(l) = d {
                on_logits(i, Ok(l));
            }
        }
    }
}
