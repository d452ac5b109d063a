//! The dispatcher: a step's runlists submitted in order, each watched by a deadline; failed
//! steps retried at half the depth.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_model::Plan;

use crate::backend::{Backend, Batch, DeviceError, DeviceRates};
use crate::cost::GroupCost;
use crate::cut::{LayerIndex, Runlist};
use crate::trace::Trace;

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
}

impl Default for DispatchOptions {
    fn default() -> Self {
        DispatchOptions {
            max_runlist_layers: None,
            deadline: None,
            retry: true,
            min_layers: 1,
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
        if let DeviceError::Input(msg) = &self.error {
            return f.write_str(msg);
        }
        let rl = &self.runlist;
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

/// Runs steps (one batch through the whole plan) on a backend.
#[derive(Debug)]
pub struct Dispatcher {
    plan: Arc<Plan>,
    idx: LayerIndex,
    costs: Vec<GroupCost>,
    opts: DispatchOptions,
    rates: DeviceRates,
    /// Layers per runlist now (smaller than asked after a retry succeeded at a smaller depth).
    depth: Option<usize>,
}

impl Dispatcher {
    /// A dispatcher for `plan` (whose groups cost `costs`) on `backend`.
    pub fn new(
        plan: Arc<Plan>,
        costs: Vec<GroupCost>,
        opts: DispatchOptions,
        backend: &dyn Backend,
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
        Ok(Dispatcher {
            plan,
            idx,
            costs,
            rates: backend.rates(),
            opts,
            depth,
        })
    }

    /// What each group of the plan costs.
    pub fn costs(&self) -> &[GroupCost] {
        &self.costs
    }

    /// Layers per runlist now (`None`: the whole model in one runlist).
    pub fn depth(&self) -> Option<usize> {
        self.depth
    }

    /// Runlists per step now.
    pub fn runlist_count(&self) -> usize {
        self.idx.count(self.depth)
    }

    /// Every runlist of a step at the current depth, with deadlines for `batch`.
    pub fn runlists(&self, batch: &Batch) -> Vec<Runlist> {
        (0..self.runlist_count())
            .map(|k| self.with_deadline(self.idx.runlist(self.depth, k), batch))
            .collect()
    }

    fn with_deadline(&self, mut rl: Runlist, batch: &Batch) -> Runlist {
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

    /// The next smaller depth to retry with, if any.
    fn smaller(&self, depth: Option<usize>) -> Option<usize> {
        let cur = depth
            .unwrap_or(self.idx.n_layers())
            .min(self.idx.n_layers());
        (cur > self.opts.min_layers).then(|| (cur / 2).max(self.opts.min_layers))
    }

    /// Run `batch` through the whole plan. On a retryable failure the step starts again from
    /// its first runlist at half the depth (down to `min_layers`), and the smaller depth is
    /// kept for later steps. Either every runlist completed, or the error says which failed.
    pub fn step(
        &mut self,
        backend: &mut dyn Backend,
        batch: &Batch,
        mut trace: Option<&mut Trace>,
    ) -> Result<(), Box<DispatchError>> {
        let mut depth = self.depth;
        let mut attempts = Vec::new();
        loop {
            match self.try_step(backend, batch, depth, trace.as_deref_mut()) {
                Ok(()) => {
                    self.depth = depth;
                    return Ok(());
                }
                Err(failed) => {
                    let (runlist, error) = *failed;
                    backend.cancel();
                    let next = if error.retryable() && self.opts.retry {
                        self.smaller(depth)
                    } else {
                        None
                    };
                    match next {
                        Some(d) => {
                            attempts.push(Attempt {
                                depth,
                                runlist,
                                error,
                            });
                            depth = Some(d);
                        }
                        None => {
                            return Err(Box::new(DispatchError {
                                runlist,
                                error,
                                attempts,
                            }))
                        }
                    }
                }
            }
        }
    }

    fn try_step(
        &self,
        backend: &mut dyn Backend,
        batch: &Batch,
        depth: Option<usize>,
        mut trace: Option<&mut Trace>,
    ) -> Result<(), Box<(Runlist, DeviceError)>> {
        for k in 0..self.idx.count(depth) {
            let rl = self.with_deadline(self.idx.runlist(depth, k), batch);
            let start = Instant::now();
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
