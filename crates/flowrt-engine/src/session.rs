//! Sessions: sequences over a loaded model, run through the dispatcher on a backend.
//!
//! [`BatchSession`] holds several sequences ("slots") in one device KV cache and runs a step
//! over any of them together, so the weights are read once per step for all of them
//! (continuous batching). [`Session`] is the one-sequence case most callers want.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_dispatch::{
    group_costs, Backend, BackendInfo, Batch, Dispatcher, LogitsWanted, SeqSpan, Trace,
};
use flowrt_model::Plan;

use flowrt_text::Tokenizer;

use crate::constraint::{ConstraintError, Guide};
use crate::error::EngineError;
use crate::load::{EngineOptions, GuideCell, LoadedModel};

/// Several sequences over one model and one device. A step appends tokens to any subset of
/// the slots; it either completes for all of them or changes none (the dispatcher's steps are
/// all-or-nothing).
pub struct BatchSession {
    /// Owns the backend (see `flowrt_dispatch::watch`).
    dispatcher: Dispatcher,
    /// Per slot: the tokens whose keys and values are in the cache, in order.
    slots: Vec<Vec<u32>>,
    model_ctx: usize,
    /// Scratch for a step's tokens and spans (allocated once).
    tokens: Vec<u32>,
    spans: Vec<SeqSpan>,
    /// Time to make the session ready (backend, including any weight preparation it does,
    /// and dispatcher).
    setup_time: Duration,
}

impl BatchSession {
    /// `n_slots` sequences on the backend `opts` names, opened through
    /// `flowrt_backends::open`.
    pub fn new(
        model: &LoadedModel,
        opts: &EngineOptions,
        n_slots: usize,
    ) -> Result<BatchSession, EngineError> {
        if n_slots == 0 {
            return Err(EngineError::Invalid(
                "a session needs at least one slot".into(),
            ));
        }
        let t0 = Instant::now();
        let n_ctx = model.n_ctx(opts)?;
        let backend = flowrt_backends::open(
            opts.backend,
            model.model.clone(),
            &opts.backend_settings(n_ctx, n_slots),
        )?;
        let mut session = Self::with_backend(model, opts, backend)?;
        session.setup_time = t0.elapsed();
        Ok(session)
    }

    /// Sequences on any backend (one slot per sequence its cache holds). A model that only
    /// embeds is refused ([`EngineError::EmbeddingOnly`]): its plan has no logits.
    pub fn with_backend(
        model: &LoadedModel,
        opts: &EngineOptions,
        backend: Box<dyn Backend>,
    ) -> Result<BatchSession, EngineError> {
        if !model.generates() {
            return Err(EngineError::EmbeddingOnly(model.path.clone()));
        }
        Self::with_plan(model, opts, backend, model.plan.clone())
    }

    /// `n_slots` sequences of `n_ctx` positions over an embedding plan
    /// ([`Plan::embedding`]), for [`crate::Embedder`].
    pub(crate) fn for_embedding(
        model: &LoadedModel,
        opts: &EngineOptions,
        n_slots: usize,
        plan: Plan,
        n_ctx: usize,
    ) -> Result<BatchSession, EngineError> {
        let t0 = Instant::now();
        let backend = flowrt_backends::open(
            opts.backend,
            model.model.clone(),
            &opts.backend_settings(n_ctx, n_slots),
        )?;
        let mut session = Self::with_plan(model, opts, backend, Arc::new(plan))?;
        session.setup_time = t0.elapsed();
        Ok(session)
    }

    fn with_plan(
        model: &LoadedModel,
        opts: &EngineOptions,
        backend: Box<dyn Backend>,
        plan: Arc<Plan>,
    ) -> Result<BatchSession, EngineError> {
        let t0 = Instant::now();
        let costs = group_costs(&model.model, &plan);
        let dispatcher = Dispatcher::new(
            plan,
            costs,
            opts.dispatch.clone(),
            backend,
            opts.trace.then(Trace::new),
        )
        .map_err(EngineError::Invalid)?;
        let n_slots = dispatcher.n_seq();
        Ok(BatchSession {
            slots: (0..n_slots)
                .map(|_| Vec::with_capacity(dispatcher.n_ctx()))
                .collect(),
            tokens: Vec::with_capacity(dispatcher.max_batch()),
            spans: Vec::with_capacity(n_slots),
            dispatcher,
            model_ctx: model.model_ctx(),
            setup_time: t0.elapsed(),
        })
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }
    /// Positions each slot holds.
    pub fn n_ctx(&self) -> usize {
        self.dispatcher.n_ctx()
    }
    /// Most tokens one step carries, over all slots.
    pub fn max_batch(&self) -> usize {
        self.dispatcher.max_batch()
    }
    pub fn vocab_size(&self) -> usize {
        self.dispatcher.vocab_size()
    }
    pub fn model_ctx(&self) -> usize {
        self.model_ctx
    }
    /// Tokens cached in `slot`.
    pub fn tokens(&self, slot: usize) -> &[u32] {
        &self.slots[slot]
    }
    pub fn n_past(&self, slot: usize) -> usize {
        self.slots[slot].len()
    }
    /// Keep the first `n` tokens of `slot` and forget the rest (the cache is overwritten as
    /// new tokens arrive).
    pub fn truncate(&mut self, slot: usize, n: usize) {
        self.slots[slot].truncate(n);
    }
    /// What the session runs on.
    pub fn backend_info(&self) -> BackendInfo {
        self.dispatcher.backend_info().clone()
    }
    /// How the forward pass is cut into runlists now.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }
    /// The trace recorded so far (with `EngineOptions::trace`).
    pub fn trace(&self) -> Option<&Trace> {
        self.dispatcher.trace()
    }
    /// Bytes the backend reserved for the KV cache (all slots, full context), as its
    /// [`BackendInfo::kv_cache_bytes`] says.
    pub fn kv_cache_bytes(&self) -> u64 {
        self.dispatcher.backend_info().kv_cache_bytes
    }
    /// How long making this session took: creating the backend (with any weight preparation
    /// it does at load) and the dispatcher. For [`BatchSession::with_backend`], the dispatcher
    /// only.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// Check that `n_new` more tokens plus `reserve` generated ones fit `slot`'s context.
    pub fn check_fits(&self, slot: usize, n_new: usize, reserve: usize) -> Result<(), EngineError> {
        let n_ctx = self.n_ctx();
        let past = self.n_past(slot);
        if past + n_new + reserve > n_ctx {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: past + n_new,
                reserve,
                n_ctx,
                model_ctx: self.model_ctx,
            });
        }
        Ok(())
    }

    /// One step over several slots: `items` are `(slot, tokens)` with distinct slots, at most
    /// [`BatchSession::max_batch`] tokens in all (a prompt longer than that is fed over
    /// several steps). Returns the last token's logits of each item, `(items, vocab)`.
    pub fn step(&mut self, items: &[(usize, &[u32])]) -> Result<&[f32], EngineError> {
        self.run(items, LogitsWanted::Last)
    }

    /// One step of an embedding plan over whole texts: each item's slot is emptied first and
    /// after (nothing is kept between steps). Returns the pooled rows, `(items, hidden)`.
    pub(crate) fn embed_step(&mut self, items: &[(usize, &[u32])]) -> Result<&[f32], EngineError> {
        for &(slot, _) in items {
            if slot < self.n_slots() {
                self.truncate(slot, 0);
            }
        }
        let r = self.run(items, LogitsWanted::None).map(|_| ());
        for &(slot, _) in items {
            if slot < self.n_slots() {
                self.truncate(slot, 0);
            }
        }
        r?;
        Ok(self.dispatcher.embeddings())
    }

    /// [`BatchSession::step`] with the logits to produce chosen: `Last` (one row per item),
    /// `All` (one per token) or `None`.
    pub fn run(
        &mut self,
        items: &[(usize, &[u32])],
        logits: LogitsWanted,
    ) -> Result<&[f32], EngineError> {
        if items.is_empty() {
            return Err(EngineError::Invalid(
                "a step needs at least one sequence".into(),
            ));
        }
        let total: usize = items.iter().map(|(_, t)| t.len()).sum();
        if total > self.max_batch() {
            return Err(EngineError::Invalid(format!(
                "a step carries at most {} tokens, got {total}",
                self.max_batch()
            )));
        }
        self.tokens.clear();
        self.spans.clear();
        for (i, &(slot, toks)) in items.iter().enumerate() {
            if slot >= self.n_slots() {
                return Err(EngineError::Invalid(format!(
                    "slot {slot} does not exist (the session has {})",
                    self.n_slots()
                )));
            }
            if toks.is_empty() {
                return Err(EngineError::Invalid(format!("item {i} has no tokens")));
            }
            if items[..i].iter().any(|&(s, _)| s == slot) {
                return Err(EngineError::Invalid(format!(
                    "slot {slot} appears twice in one step"
                )));
            }
            self.check_fits(slot, toks.len(), 0)?;
            self.spans.push(SeqSpan {
                seq: slot,
                pos0: self.slots[slot].len(),
                len: toks.len(),
            });
            self.tokens.extend_from_slice(toks);
        }
        self.dispatcher.step(&Batch {
            tokens: &self.tokens,
            spans: &self.spans,
            logits,
        })?;
        for &(slot, toks) in items {
            self.slots[slot].extend_from_slice(toks);
        }
        Ok(self.dispatcher.logits())
    }
}

/// One sequence over a loaded model: its device (owning the KV cache), the dispatcher that
/// submits the forward pass to it in bounded runlists, and the tokens whose keys and values
/// the cache holds. The sequence advances only when a whole step succeeded.
pub struct Session {
    inner: BatchSession,
    /// The model's constrained-decoding token environment (see [`LoadedModel::guide`]).
    guide: Arc<GuideCell>,
}

impl Session {
    /// A session on the backend `opts` names.
    pub fn new(model: &LoadedModel, opts: &EngineOptions) -> Result<Session, EngineError> {
        Ok(Session {
            inner: BatchSession::new(model, opts, 1)?,
            guide: model.guide_cell(),
        })
    }

    /// A session on any backend (e.g. a fault-injecting wrapper of the CPU one).
    pub fn with_backend(
        model: &LoadedModel,
        opts: &EngineOptions,
        backend: Box<dyn Backend>,
    ) -> Result<Session, EngineError> {
        Ok(Session {
            inner: BatchSession::with_backend(model, opts, backend)?,
            guide: model.guide_cell(),
        })
    }

    /// What the session runs on.
    pub fn backend_info(&self) -> BackendInfo {
        self.inner.backend_info()
    }
    /// How the forward pass is cut into runlists now.
    pub fn dispatcher(&self) -> &Dispatcher {
        self.inner.dispatcher()
    }
    /// The trace recorded so far (with `EngineOptions::trace`).
    pub fn trace(&self) -> Option<&Trace> {
        self.inner.trace()
    }
    /// See [`BatchSession::kv_cache_bytes`].
    pub fn kv_cache_bytes(&self) -> u64 {
        self.inner.kv_cache_bytes()
    }
    /// See [`BatchSession::setup_time`].
    pub fn setup_time(&self) -> Duration {
        self.inner.setup_time()
    }
    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    pub fn n_past(&self) -> usize {
        self.inner.n_past(0)
    }
    pub fn tokens(&self) -> &[u32] {
        self.inner.tokens(0)
    }
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    pub fn model_ctx(&self) -> usize {
        self.inner.model_ctx()
    }

    /// The model's constrained-decoding token environment ([`LoadedModel::guide`]), built from
    /// `tokenizer` (the model's) by its first use through the model or any of its sessions.
    pub(crate) fn guide(&self, tokenizer: &Tokenizer) -> Result<&Guide, ConstraintError> {
        self.guide.get(tokenizer, self.vocab_size())
    }

    /// Forget everything (the cache is overwritten as new tokens arrive).
    pub fn reset(&mut self) {
        self.inner.truncate(0, 0);
    }

    /// Keep the first `n` tokens of the cache and forget the rest.
    pub fn truncate(&mut self, n: usize) {
        self.inner.truncate(0, n);
    }

    /// Check that `n_new` more tokens plus `reserve` generated ones fit the context.
    pub fn check_fits(&self, n_new: usize, reserve: usize) -> Result<(), EngineError> {
        self.inner.check_fits(0, n_new, reserve)
    }

    /// Append `tokens` to the sequence (prefill in batches) and return the last token's logits.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Invalid("feed needs at least one token".into()));
        }
        self.check_fits(tokens.len(), 0)?;
        let max = self.inner.max_batch();
        let n_chunks = tokens.len().div_ceil(max);
        for (i, chunk) in tokens.chunks(max).enumerate() {
            let logits = if i + 1 == n_chunks {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            self.inner.run(&[(0, chunk)], logits)?;
        }
        Ok(self.inner.dispatcher.logits())
    }

    /// Append `tokens`, calling `on_logits(first_index, logits_rows)` with every token's logits
    /// (`rows x vocab`) batch by batch. Used for teacher-forced verification.
    pub fn feed_all_logits(
        &mut self,
        tokens: &[u32],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.check_fits(tokens.len(), 0)?;
        let max = self.inner.max_batch();
        for (i, chunk) in tokens.chunks(max).enumerate() {
            let logits = self.inner.run(&[(0, chunk)], LogitsWanted::All)?;
            on_logits(i * max, logits);
        }
        Ok(())
    }

    /// Make the cached sequence equal `tokens` while recomputing as little as possible: keep
    /// the longest common prefix, then feed the rest. At least the last token is always fed so
    /// that its logits are fresh. Returns the last token's logits.
    pub fn sync(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        let common = self.common_prefix(tokens);
        self.truncate(common);
        self.feed(&tokens[common..])
    }

    /// How many leading tokens of `tokens` the cache already holds and [`Session::sync`] would
    /// keep (never all of them: the last is always recomputed).
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens()
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1))
    }
}
