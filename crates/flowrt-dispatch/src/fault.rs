//! A backend that wraps another and misbehaves on purpose: runlists deeper than a limit hang
//! (as the NPU runtime in the MiniCPM5 port thread did at 42 layers), and a chosen op of a
//! chosen layer hangs, faults, or gets stuck (a `wait` that ignores its deadline and never
//! returns until released). For tests of the dispatcher's deadlines, watchdog, errors and
//! retries.

use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use flowrt_model::Plan;

use crate::backend::{
    Backend, BackendInfo, Batch, DeviceError, DeviceRates, LogitsWanted, SeqSpan,
};
use crate::cut::Runlist;
use crate::trace::Trace;

/// Which batches a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultScope {
    All,
    /// Batches of one token (decode steps).
    Decode,
    /// Batches of more than one token (prefill).
    Prefill,
}

impl FaultScope {
    fn applies(self, n_tokens: usize) -> bool {
        match self {
            FaultScope::All => true,
            FaultScope::Decode => n_tokens == 1,
            FaultScope::Prefill => n_tokens > 1,
        }
    }
}

/// Where to inject a hang or fault.
#[derive(Clone, Debug, PartialEq)]
pub struct Inject {
    pub layer: usize,
    /// Op name as in [`flowrt_model::plan::Op::name`] (`attention`, `matmul_down`, ...).
    pub op: &'static str,
    /// Only in runlists of more than this many layers (a depth-dependent fault that a retry
    /// at smaller depth avoids); `None`: always (a persistent fault).
    pub only_deeper_than: Option<usize>,
    pub scope: FaultScope,
}

/// What goes wrong.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultSpec {
    /// Runlists of more than this many layers hang before running anything.
    pub max_depth: Option<(usize, FaultScope)>,
    /// This op hangs (never completes; the deadline catches it).
    pub hang: Option<Inject>,
    /// This op reports a device fault.
    pub fault: Option<Inject>,
    /// This op never returns: `wait` blocks, ignoring its deadline (a stuck device or driver),
    /// until the backend's [`StuckGate`] is released; it then reports a timeout.
    pub stuck: Option<Inject>,
    /// `cancel` takes this long: a queue that cannot take back work it has started (a GPU's)
    /// waits in `cancel` for it to drain.
    pub slow_cancel: Option<std::time::Duration>,
}

/// Holds a stuck `wait` until released (a device that comes back late).
#[derive(Clone, Debug, Default)]
pub struct StuckGate(Arc<(Mutex<bool>, Condvar)>);

impl StuckGate {
    /// Let every stuck call return, now and from now on.
    pub fn release(&self) {
        *self.0 .0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0 .1.notify_all();
    }

    /// Block until released.
    fn block(&self) {
        let mut open = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.0 .1.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Counters of what the fault backend saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub submitted: usize,
    pub completed: usize,
    pub hangs: usize,
    pub faults: usize,
    pub stuck: usize,
}

/// The wrapper.
pub struct FaultBackend<B> {
    inner: B,
    /// Shared so a test can change the faults of a backend a session owns.
    spec: Arc<Mutex<FaultSpec>>,
    gate: StuckGate,
    pending: Option<(Runlist, LogitsWanted)>,
    tokens: Vec<u32>,
    spans: Vec<SeqSpan>,
    pub stats: FaultStats,
}

impl<B: Backend> FaultBackend<B> {
    pub fn new(inner: B, spec: FaultSpec) -> Self {
        FaultBackend {
            tokens: Vec::with_capacity(inner.max_batch()),
            spans: Vec::with_capacity(inner.n_seq()),
            inner,
            spec: Arc::new(Mutex::new(spec)),
            gate: StuckGate::default(),
            pending: None,
            stats: FaultStats::default(),
        }
    }

    /// A handle to change the faults later (e.g. clear them to check the device recovers),
    /// also after the backend has moved into a session.
    pub fn spec_handle(&self) -> Arc<Mutex<FaultSpec>> {
        self.spec.clone()
    }

    /// The gate that releases calls stuck by [`FaultSpec::stuck`].
    pub fn stuck_gate(&self) -> StuckGate {
        self.gate.clone()
    }

    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The first group of `groups` where `inj` fires for this runlist, if it does.
    fn fires(
        plan: &Plan,
        inj: &Inject,
        groups: &Range<usize>,
        depth: usize,
        n: usize,
    ) -> Option<usize> {
        if !inj.scope.applies(n) || inj.only_deeper_than.is_some_and(|d| depth <= d) {
            return None;
        }
        groups.clone().find(|&g| {
            let grp = &plan.groups[g];
            grp.kind.layer() == Some(inj.layer) && grp.ops.iter().any(|o| o.name() == inj.op)
        })
    }

    /// Run groups `range` on the inner backend.
    fn run_inner(
        &mut self,
        plan: &Plan,
        rl: &Runlist,
        range: Range<usize>,
        batch: &Batch,
        deadline: Instant,
        trace: Option<&mut Trace>,
    ) -> Result<(), DeviceError> {
        if range.is_empty() {
            return Ok(());
        }
        let sub = Runlist {
            groups: range,
            ..rl.clone()
        };
        self.inner.submit(plan, &sub, batch)?;
        self.inner.wait(plan, deadline, trace)
    }
}

#[derive(Clone, Copy)]
enum Effect {
    Stuck,
    Hang,
    Fault,
}

fn sleep_until(deadline: Instant) {
    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
}

impl<B: Backend> Backend for FaultBackend<B> {
    fn info(&self) -> BackendInfo {
        let i = self.inner.info();
        BackendInfo {
            name: format!("fault({})", i.name),
            ..i
        }
    }
    fn default_max_runlist_layers(&self) -> Option<usize> {
        self.inner.default_max_runlist_layers()
    }
    fn rates(&self) -> DeviceRates {
        self.inner.rates()
    }

    fn submit(&mut self, _plan: &Plan, rl: &Runlist, batch: &Batch) -> Result<(), DeviceError> {
        self.stats.submitted += 1;
        self.tokens.clear();
        self.tokens.extend_from_slice(batch.tokens);
        self.spans.clear();
        self.spans.extend_from_slice(batch.spans);
        self.pending = Some((rl.clone(), batch.logits));
        Ok(())
    }

    fn wait(
        &mut self,
        plan: &Plan,
        deadline: Instant,
        trace: Option<&mut Trace>,
    ) -> Result<(), DeviceError> {
        let Some((rl, logits)) = self.pending.take() else {
            return Err(DeviceError::Fault {
                group: None,
                kind: None,
                op: None,
                reason: "wait without a submitted runlist".into(),
            });
        };
        let started = Instant::now();
        let depth = rl.layers.map_or(0, |(a, b)| b - a + 1);
        let tokens = std::mem::take(&mut self.tokens);
        let spans = std::mem::take(&mut self.spans);
        let n = tokens.len();
        let batch = Batch {
            tokens: &tokens,
            spans: &spans,
            logits,
        };
        let spec = self.spec.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let result = (|| {
            if let Some((max, scope)) = spec.max_depth {
                if depth > max && scope.applies(n) {
                    // Like a device whose command queue overflows: nothing runs, nothing
                    // reports, the host's wait times out.
                    self.stats.hangs += 1;
                    sleep_until(deadline);
                    return Err(DeviceError::Timeout {
                        waited: started.elapsed(),
                        group: None,
                        kind: None,
                        op: None,
                    });
                }
            }
            // The earliest injection that fires (at equal groups: stuck, hang, fault).
            let fire = [
                (&spec.stuck, Effect::Stuck),
                (&spec.hang, Effect::Hang),
                (&spec.fault, Effect::Fault),
            ]
            .into_iter()
            .filter_map(|(inj, effect)| {
                let inj = inj.as_ref()?;
                Some((
                    Self::fires(plan, inj, &rl.groups, depth, n)?,
                    inj.op,
                    effect,
                ))
            })
            .min_by_key(|f| f.0);
            match fire {
                None => self.run_inner(plan, &rl, rl.groups.clone(), &batch, deadline, trace),
                Some((g, op, effect)) => {
                    // The groups before the faulty one run for real.
                    self.run_inner(plan, &rl, rl.groups.start..g, &batch, deadline, trace)?;
                    let kind = Some(plan.groups[g].kind);
                    let timeout = || DeviceError::Timeout {
                        waited: started.elapsed(),
                        group: Some(g),
                        kind,
                        op: Some(op),
                    };
                    match effect {
                        Effect::Hang => {
                            self.stats.hangs += 1;
                            sleep_until(deadline);
                            Err(timeout())
                        }
                        Effect::Stuck => {
                            self.stats.stuck += 1;
                            self.gate.block();
                            Err(timeout())
                        }
                        Effect::Fault => {
                            self.stats.faults += 1;
                            Err(DeviceError::Fault {
                                group: Some(g),
                                kind,
                                op: Some(op),
                                reason: "injected fault".into(),
                            })
                        }
                    }
                }
            }
        })();
        self.tokens = tokens;
        self.spans = spans;
        if result.is_ok() {
            self.stats.completed += 1;
        }
        result
    }

    fn cancel(&mut self) {
        self.pending = None;
        let slow = self
            .spec
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slow_cancel;
        if let Some(d) = slow {
            std::thread::sleep(d);
        }
        self.inner.cancel();
    }
    fn logits(&self) -> &[f32] {
        self.inner.logits()
    }
    fn embeddings(&self) -> &[f32] {
        self.inner.embeddings()
    }
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    fn n_seq(&self) -> usize {
        self.inner.n_seq()
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn read_activation(
        &mut self,
        buf: flowrt_model::plan::Buf,
        rows: usize,
    ) -> Result<Vec<f32>, crate::ProbeError> {
        self.inner.read_activation(buf, rows)
    }
    fn write_activation(
        &mut self,
        buf: flowrt_model::plan::Buf,
        values: &[f32],
    ) -> Result<(), crate::ProbeError> {
        self.inner.write_activation(buf, values)
    }
    fn collect_input_stats(
        &mut self,
        what: Option<crate::InputStatKind>,
    ) -> Result<(), crate::ProbeError> {
        self.inner.collect_input_stats(what)
    }
    fn take_input_stats(&mut self) -> Vec<crate::InputStat> {
        self.inner.take_input_stats()
    }
}
