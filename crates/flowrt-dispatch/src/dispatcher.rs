//! The dispatcher: a step's runlists submitted in order, each watched by a deadline; failed
//! steps retried at half the depth.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_model::Plan;

use crate::backend::{Backend, BackendInfo, Batch, DeviceError, DeviceRates};
use crate::cost::GroupCost;
use crate::cut::{LayerIndex, Runlist};
use crate::trace::Trace;
use crate::watch::{At, Device, Progress, TryResult};

/// How to cut and watch the forward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchOptions {
    /// Most decoder layers per runlist (`None`: the backend's default).
    pub max_runlist_layers: Option<usize>,
    /// One deadline for every runlist (`None`: derived from each runlist's cost and the
    /// backend's rates).
    pub deadline: Option<Duration>,
    /// Retry a failed step with half the depth, down to `min_layers`.
    pub retry: bool,
    /// Smallest depth retries go down to.
    pub min_layers: usize,
    /// How long past a runlist's deadline the dispatcher keeps waiting for a backend that does
    /// not answer before it gives the device up as lost (`None`: the deadline again, and at
    /// least [`MIN_WATCHDOG_GRACE`]). See [`crate::watch`].
    pub watchdog_grace: Option<Duration>,
}

/// The smallest default grace of the watchdog: a backend checks its deadline between ops, so
/// one long op may overrun it a little before the backend reports the timeout itself.
pub const MIN_WATCHDOG_GRACE: Duration = Duration::from_millis(250);

impl Default for DispatchOptions {
    fn default() -> Self {
        DispatchOptions {
            max_runlist_layers: None,
            deadline: None,
            retry: true,
            min_layers: 1,
            watchdog_grace: None,
        }
    }
}

/// One failed try of a step.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// Layers per runlist of that try (`None`: the whole model in one runlist).
    pub depth: Option<usize>,
    pub runlist: Runlist,
    pub error: DeviceError,
}

/// A step that failed for good: the runlist, its layers and the device's error, after the
/// retries listed in `attempts`.
#[derive(Clone, Debug)]
pub struct DispatchError {
    pub runlist: Runlist,
    pub error: DeviceError,
    /// Earlier failed tries (at larger depths), in order.
    pub attempts: Vec<Attempt>,
}

impl std::fmt::Display for DispatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rl = &self.runlist;
        match &self.error {
            DeviceError::Input(msg) => return f.write_str(msg),
            DeviceError::Unavailable { lost_for } => {
                return write!(
                    f,
                    "the device is lost: runlist {}/{} ({}) of an earlier step has not returned \
                     ({} ms since the watchdog gave up on it); the step was not run",
                    rl.index + 1,
                    rl.count,
                    rl.describe_layers(),
                    lost_for.as_millis()
                )
            }
            _ => {}
        }
        write!(
            f,
            "runlist {}/{} ({}, deadline {} ms) {}",
            rl.index + 1,
            rl.count,
            rl.describe_layers(),
            rl.deadline.as_millis(),
            self.error
        )?;
        if !self.attempts.is_empty() {
            let tries: Vec<String> = self
                .attempts
                .iter()
                .map(|a| {
                    format!(
                        "{} layers/runlist: runlist {}/{} ({}) {}",
                        a.depth.map_or("all".to_string(), |d| d.to_string()),
                        a.runlist.index + 1,
                        a.runlist.count,
                        a.runlist.describe_layers(),
                        a.error
                    )
                })
                .collect();
            write!(f, "; earlier tries: {}", tries.join("; "))?;
        }
        Ok(())
    }
}

impl std::error::Error for DispatchError {}

/// What a dispatcher knows of the plan and the device's rates; shared with the device thread.
#[derive(Debug)]
pub(crate) struct Core {
    plan: Arc<Plan>,
    idx: LayerIndex,
    costs: Vec<GroupCost>,
    opts: DispatchOptions,
    rates: DeviceRates,
}

impl Core {
    /// Runlist `k` of a step at `depth`, with its deadline for `batch`.
    pub(crate) fn runlist(&self, depth: Option<usize>, k: usize, batch: &Batch) -> Runlist {
        let mut rl = self.idx.runlist(depth, k);
        rl.deadline = self.opts.deadline.unwrap_or_else(|| {
            let n = batch.tokens.len() as u64;
            let attended = batch.attended();
            let (mut bytes, mut flops) = (0u64, 0u64);
            for c in &self.costs[rl.groups.clone()] {
                bytes += c.weight_bytes;
                flops += c.matmul_flops * n + c.attention_flops_per_pos * attended;
            }
            let secs =
                bytes as f64 / self.rates.bytes_per_s + flops as f64 / self.rates.flops_per_s;
            Duration::from_secs_f64(secs * self.rates.slack).max(self.rates.floor)
        });
        rl
    }

    /// Runlist `k` (`rl`) started at `started`: the watchdog gives up on it at its deadline
    /// plus the grace (by default the deadline again, at least [`MIN_WATCHDOG_GRACE`]).
    pub(crate) fn watch(&self, k: usize, started: Instant, rl: &Runlist) -> At {
        let grace = self
            .opts
            .watchdog_grace
            .unwrap_or_else(|| rl.deadline.max(MIN_WATCHDOG_GRACE));
        At {
            k,
            started,
            limit: started + rl.deadline + grace,
        }
    }

    /// Every runlist of a step at `depth`, in order, on the device thread. Publishes each
    /// runlist's start and watchdog limit to `progress`.
    pub(crate) fn try_step(
        &self,
        backend: &mut dyn Backend,
        batch: &Batch,
        depth: Option<usize>,
        mut trace: Option<&mut Trace>,
        progress: &Progress,
    ) -> TryResult {
        for k in 0..self.idx.count(depth) {
            let rl = self.runlist(depth, k, batch);
            let start = Instant::now();
            progress.set(self.watch(k, start, &rl));
            let r = backend
                .submit(&self.plan, &rl, batch)
                .and_then(|()| backend.wait(&self.plan, start + rl.deadline, trace.as_deref_mut()));
            if let Some(t) = trace.as_deref_mut() {
                t.runlist(&rl, batch, r.is_ok(), start, Instant::now());
            }
            r.map_err(|e| Box::new((rl, e)))?;
        }
        Ok(())
    }
}

/// Runs steps (one batch through the whole plan) on a backend it owns. The backend runs each
/// step on a device thread watched by the dispatcher ([`crate::watch`]), so every runlist's
/// deadline holds even against a backend that never returns.
#[derive(Debug)]
pub struct Dispatcher {
    core: Arc<Core>,
    /// Layers per runlist now (smaller than asked after a retry succeeded at a smaller depth).
    depth: Option<usize>,
    device: Device,
}

impl Dispatcher {
    /// A dispatcher for `plan` (whose groups cost `costs`) that owns `backend`, recording a
    /// trace when `trace` is given.
    pub fn new(
        plan: Arc<Plan>,
        costs: Vec<GroupCost>,
        opts: DispatchOptions,
        backend: Box<dyn Backend>,
        trace: Option<Trace>,
    ) -> Result<Dispatcher, String> {
        if opts.max_runlist_layers == Some(0) {
            return Err("--max-runlist-layers must be at least 1".into());
        }
        if opts.deadline == Some(Duration::ZERO) {
            return Err("--runlist-deadline-ms must be positive".into());
        }
        if opts.min_layers == 0 {
            return Err("the smallest retry depth must be at least 1 layer".into());
        }
        if costs.len() != plan.groups.len() {
            return Err(format!(
                "{} group costs for {} groups",
                costs.len(),
                plan.groups.len()
            ));
        }
        let idx = LayerIndex::new(&plan);
        let depth = opts
            .max_runlist_layers
            .or(backend.default_max_runlist_layers())
            .filter(|&d| d < idx.n_layers());
        let rates = backend.rates();
        let device = Device::new(backend, trace)
            .map_err(|e| format!("cannot start the device thread: {e}"))?;
        Ok(Dispatcher {
            core: Arc::new(Core {
                plan,
                idx,
                costs,
                rates,
                opts,
            }),
            depth,
            device,
        })
    }

    /// What each group of the plan costs.
    pub fn costs(&self) -> &[GroupCost] {
        &self.core.costs
    }

    /// Layers per runlist now (`None`: the whole model in one runlist).
    pub fn depth(&self) -> Option<usize> {
        self.depth
    }

    /// Runlists per step now.
    pub fn runlist_count(&self) -> usize {
        self.core.idx.count(self.depth)
    }

    /// Every runlist of a step at the current depth, with deadlines for `batch`.
    pub fn runlists(&self, batch: &Batch) -> Vec<Runlist> {
        (0..self.runlist_count())
            .map(|k| self.core.runlist(self.depth, k, batch))
            .collect()
    }

    /// What the device is (answered also while it is lost).
    pub fn backend_info(&self) -> &BackendInfo {
        &self.device.facts.info
    }
    /// Positions the device's KV cache holds per sequence.
    pub fn n_ctx(&self) -> usize {
        self.device.facts.n_ctx
    }
    /// Sequences the device's KV cache holds.
    pub fn n_seq(&self) -> usize {
        self.device.facts.n_seq
    }
    /// Most tokens per batch.
    pub fn max_batch(&self) -> usize {
        self.device.facts.max_batch
    }
    /// Rows of the logits.
    pub fn vocab_size(&self) -> usize {
        self.device.facts.vocab_size
    }

    /// Logits of the last completed step, `(rows, vocab)`; empty while the device is lost.
    pub fn logits(&self) -> &[f32] {
        self.device.backend().map_or(&[], |b| b.logits())
    }

    /// Pooled rows of the last completed step of an embedding plan, `(spans, hidden)`; empty
    /// while the device is lost or when the backend cannot pool (see
    /// [`crate::Backend::embeddings`]).
    pub fn embeddings(&self) -> &[f32] {
        self.device.backend().map_or(&[], |b| b.embeddings())
    }

    /// The trace recorded so far, if one was asked for (`None` while the device is lost: the
    /// trace travels with the backend).
    pub fn trace(&self) -> Option<&Trace> {
        self.device.trace()
    }

    /// Whether the watchdog gave up on the device and it has not come back yet (as of the last
    /// step; the next step takes it back if it returned meanwhile).
    pub fn device_lost(&self) -> bool {
        self.device.is_lost()
    }

    /// The next smaller depth to retry with, if any.
    fn smaller(&self, depth: Option<usize>) -> Option<usize> {
        let n_layers = self.core.idx.n_layers();
        let cur = depth.unwrap_or(n_layers).min(n_layers);
        (cur > self.core.opts.min_layers).then(|| (cur / 2).max(self.core.opts.min_layers))
    }

    /// Run `batch` through the whole plan. On a retryable failure the step starts again from
    /// its first runlist at half the depth (down to `min_layers`), and the smaller depth is
    /// kept for later steps. Either every runlist completed, or the error says which failed.
    pub fn step(&mut self, batch: &Batch) -> Result<(), Box<DispatchError>> {
        let mut depth = self.depth;
        let mut attempts = Vec::new();
        loop {
            let Err(failed) = self.device.run(&self.core, depth, batch) else {
                self.depth = depth;
                return Ok(());
            };
            // The device thread has cancelled the failed runlist.
            let (runlist, error) = *failed;
            let next = if error.retryable() && self.core.opts.retry {
                self.smaller(depth)
            } else {
                None
            };
            let Some(d) = next else {
                return Err(Box::new(DispatchError {
                    runlist,
                    error,
                    attempts,
                }));
            };
            attempts.push(Attempt {
                depth,
                runlist,
                error,
            });
            depth = Some(d);
        }
    }
}
