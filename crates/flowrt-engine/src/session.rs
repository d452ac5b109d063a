//! A session: one sequence's KV cache and position over a loaded model.

use std::sync::Arc;

use flowrt_cpu::{CpuBackend, CpuOptions};
use flowrt_dispatch::{group_costs, Backend, BackendInfo, Batch, Dispatcher, LogitsWanted, Trace};
use flowrt_model::Plan;

use crate::error::EngineError;
use crate::load::{EngineOptions, LoadedModel};

/// One sequence over a loaded model: its device (owning the KV cache), the dispatcher that
/// submits the forward pass to it in bounded runlists, and the tokens whose keys and values
/// the cache holds. The sequence advances only when a whole step succeeded.
pub struct Session {
    backend: Box<dyn Backend>,
    dispatcher: Dispatcher,
    /// Tokens whose keys and values are in the cache, in order.
    tokens: Vec<u32>,
    model_ctx: usize,
    trace: Option<Trace>,
}

impl Session {
    /// A session on the CPU backend.
    pub fn new(model: &LoadedModel, opts: &EngineOptions) -> Result<Session, EngineError> {
        let n_ctx = model.n_ctx(opts)?;
        let backend = CpuBackend::new(
            model.model.clone(),
            &CpuOptions {
                threads: opts.threads(),
                n_ctx,
                kv_type: opts.kv_type,
                max_batch: opts.max_batch,
                kernels: opts.kernels,
                act_quant: opts.act_quant,
            },
        )?;
        Self::with_backend(model, opts, Box::new(backend))
    }

    /// A session on any backend (e.g. a fault-injecting wrapper of the CPU one).
    pub fn with_backend(
        model: &LoadedModel,
        opts: &EngineOptions,
        backend: Box<dyn Backend>,
    ) -> Result<Session, EngineError> {
        let plan: Arc<Plan> = model.plan.clone();
        let costs = group_costs(&model.model, &plan);
        let dispatcher = Dispatcher::new(plan, costs, opts.dispatch.clone(), backend.as_ref())
            .map_err(EngineError::Invalid)?;
        Ok(Session {
            tokens: Vec::with_capacity(backend.n_ctx()),
            backend,
            dispatcher,
            model_ctx: model.model_ctx(),
            trace: opts.trace.then(Trace::new),
        })
    }

    /// What the session runs on.
    pub fn backend_info(&self) -> BackendInfo {
        self.backend.info()
    }

    /// How the forward pass is cut into runlists now.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// The trace recorded so far (with `EngineOptions::trace`).
    pub fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }

    pub fn n_ctx(&self) -> usize {
        self.backend.n_ctx()
    }
    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    pub fn vocab_size(&self) -> usize {
        self.backend.vocab_size()
    }

    /// Forget everything (the cache is overwritten as new tokens arrive).
    pub fn reset(&mut self) {
        self.tokens.clear();
    }

    /// Keep the first `n` tokens of the cache and forget the rest.
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Check that `n_new` more tokens plus `reserve` generated ones fit the context.
    pub fn check_fits(&self, n_new: usize, reserve: usize) -> Result<(), EngineError> {
        let n_ctx = self.n_ctx();
        if self.n_past() + n_new + reserve > n_ctx {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: self.n_past() + n_new,
                reserve,
                n_ctx,
                model_ctx: self.model_ctx,
            });
        }
        Ok(())
    }

    /// Append `tokens` to the sequence (prefill in batches) and return the last token's logits.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Invalid("feed needs at least one token".into()));
        }
        self.check_fits(tokens.len(), 0)?;
        let max = self.backend.max_batch();
        let n_chunks = tokens.len().div_ceil(max);
        for (i, chunk) in tokens.chunks(max).enumerate() {
            let logits = if i + 1 == n_chunks {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            self.run(chunk, logits)?;
        }
        Ok(self.backend.logits())
    }

    /// Append `tokens`, calling `on_logits(first_index, logits_rows)` with every token's logits
    /// (`rows x vocab`) batch by batch. Used for teacher-forced verification.
    pub fn feed_all_logits(
        &mut self,
        tokens: &[u32],
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.check_fits(tokens.len(), 0)?;
        let max = self.backend.max_batch();
        for (i, chunk) in tokens.chunks(max).enumerate() {
            self.run(chunk, LogitsWanted::All)?;
            on_logits(i * max, self.backend.logits());
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
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1))
    }

    pub fn model_ctx(&self) -> usize {
        self.model_ctx
    }

    fn run(&mut self, chunk: &[u32], logits: LogitsWanted) -> Result<(), EngineError> {
        let pos0 = self.tokens.len();
        self.dispatcher.step(
            self.backend.as_mut(),
            &Batch {
                tokens: chunk,
                pos0,
                logits,
            },
            self.trace.as_mut(),
        )?;
        self.tokens.extend_from_slice(chunk);
        Ok(())
    }
}
