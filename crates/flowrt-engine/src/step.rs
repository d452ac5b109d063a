//! The batching policy: one call is one step over the active sequences, what the server's
//! scheduler and `flowrt bench --parallel` drive.
//!
//! [`StepEngine::step`] is shaped for continuous batching: it receives the new tokens of every
//! active sequence (the rest of a prompt for a sequence being prefilled, the last sampled
//! token for one being decoded) and reports, for each, either the logits after its last token
//! ([`Fed::All`]) or how many of its leading tokens it consumed ([`Fed::Part`]): an engine may
//! feed a long prompt over several steps, and the caller hands the rest back at the next one.
//!
//! [`BatchStepper`] makes each step **one** forward pass of at most
//! [`BatchSession::max_batch`] tokens over a KV cache slot per sequence: decodes first, then
//! prompt chunks (chunked prefill; policy on [`BatchStepper`]), so a long prompt arriving
//! never stalls the other sequences' next tokens and N streams cost about one weight read per
//! step.

use crate::error::EngineError;
use crate::load::{EngineOptions, LoadedModel};
use crate::session::BatchSession;
use flowrt_dispatch::LogitsWanted;

/// What a step did with one sequence's tokens.
#[derive(Clone, Copy, Debug)]
pub enum Fed<'a> {
    /// Every token was fed: the logits after the last one (`vocab` values).
    All(&'a [f32]),
    /// Only the first `n` tokens (`n < tokens.len()`, possibly 0) were fed; the rest are to be
    /// given again at a later step. There are no logits to sample from yet.
    Part(usize),
}

/// Receives each sequence's outcome after a step: `(index in work, outcome)`. Called exactly
/// once per work item.
pub type OnFed<'a> = dyn FnMut(usize, Result<Fed<'_>, EngineError>) + 'a;

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
    /// Append to each item's slot a prefix of its tokens (all of them, or as many as the step
    /// has room for) and call `on_fed(i, ..)` once per item: [`Fed::All`] with the logits
    /// after the last token of `work[i]`, [`Fed::Part`] with how many tokens it consumed, or
    /// the error that sequence hit (its slot's cache is then unspecified past what earlier
    /// steps appended). Slots in `work` are distinct.
    fn step(&mut self, work: &[SlotWork<'_>], on_fed: &mut OnFed<'_>);
}

/// [`StepEngine`] over one [`BatchSession`]: a step is one forward pass shared by the step's
/// sequences, carrying at most [`BatchSession::max_batch`] tokens (chunked prefill).
///
/// The budget goes to the shortest remainders first: one-token decodes (so a prompt never
/// delays another sequence's next token while the slots fit the batch), then prompts by how
/// many tokens they still have to feed, the last one to get room cut to what is left; ties take
/// turns from step to step. Shortest-first brings the most prompts to their first token soonest; a
/// long prompt gets what the decodes and shorter prompts leave, so it waits only while they
/// fill the whole batch (under a steady stream of such prompts it keeps waiting: admission
/// order would prevent that at the cost of mean time to first token). With more slots than
/// the batch holds, the decodes that do not fit wait for the next step ([`Fed::Part`] of 0),
/// and taking turns lets each of them through.
pub struct BatchStepper {
    session: BatchSession,
    /// Scratch reused by every step: the order work items are given the budget in, and this
    /// pass's items as (work index, tokens fed).
    order: Vec<usize>,
    items: Vec<(usize, usize)>,
    /// Steps run; rotates which of equally long items goes first.
    turn: usize,
}

impl BatchStepper {
    pub fn new(
        model: &LoadedModel,
        opts: &EngineOptions,
        slots: usize,
    ) -> Result<BatchStepper, EngineError> {
        Ok(BatchStepper::with_session(BatchSession::new(
            model,
            opts,
            slots.max(1),
        )?))
    }

    /// Steps over `session` (its slots are the sequences).
    pub fn with_session(session: BatchSession) -> BatchStepper {
        BatchStepper {
            session,
            order: Vec::new(),
            items: Vec::new(),
            turn: 0,
        }
    }

    /// The session the steps run on.
    pub fn session(&self) -> &BatchSession {
        &self.session
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

    fn step(&mut self, work: &[SlotWork<'_>], on_fed: &mut OnFed<'_>) {
        // A sequence whose tokens cannot fit its context fails alone, before the pass.
        self.order.clear();
        for (i, w) in work.iter().enumerate() {
            match self.session.check_fits(w.slot, w.tokens.len(), 0) {
                Ok(()) => self.order.push(i),
                Err(e) => on_fed(i, Err(e)),
            }
        }
        // The pass: shortest remainders first, ties in turn, as many tokens as the batch holds.
        let (n, turn) = (work.len(), self.turn);
        self.turn = self.turn.wrapping_add(1);
        self.order
            .sort_by_key(|&i| (work[i].tokens.len(), (i + n - turn % n) % n));
        let mut budget = self.session.max_batch();
        self.items.clear();
        for &i in &self.order {
            let take = work[i].tokens.len().min(budget);
            if take == 0 {
                on_fed(i, Ok(Fed::Part(0)));
            } else {
                budget -= take;
                self.items.push((i, take));
            }
        }
        if self.items.is_empty() {
            return;
        }
        let batch: Vec<(usize, &[u32])> = self
            .items
            .iter()
            .map(|&(i, take)| (work[i].slot, &work[i].tokens[..take]))
            .collect();
        // A pass of prompt chunks only (no sequence completes) needs no logits.
        let complete = |&(i, take): &(usize, usize)| take == work[i].tokens.len();
        let wanted = if self.items.iter().any(complete) {
            LogitsWanted::Last
        } else {
            LogitsWanted::None
        };
        let vocab = self.session.vocab_size();
        match self.session.run(&batch, wanted) {
            Ok(logits) => {
                for (row, item) in self.items.iter().enumerate() {
                    let fed = if complete(item) {
                        Fed::All(&logits[row * vocab..(row + 1) * vocab])
                    } else {
                        Fed::Part(item.1)
                    };
                    on_fed(item.0, Ok(fed));
                }
            }
            Err(e) => {
                // A device failure fails every sequence of the pass.
                let msg = e.to_string();
                let mut first = Some(e);
                for &(i, _) in &self.items {
                    let err = first
                        .take()
                        .unwrap_or_else(|| EngineError::Invalid(msg.clone()));
                    on_fed(i, Err(err));
                }
            }
        }
    }
}
