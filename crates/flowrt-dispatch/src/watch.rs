//! The dispatcher's watchdog: each step runs on a thread of the device's own, and the
//! dispatcher waits for it with a limit it keeps itself, so a backend whose `wait` never
//! returns (a stuck device, a driver bug) cannot hang the caller.
//!
//! Between steps the backend lives with the dispatcher. For a step it moves to the device
//! thread together with the step's tokens and the trace (no copies: the vectors move), and it
//! comes back with the result. The device thread publishes which runlist it is on and when the
//! watchdog gives up on that runlist: its deadline plus a grace period
//! ([`crate::DispatchOptions::watchdog_grace`]). A backend that honours its deadline reports
//! [`DeviceError::Timeout`] itself well before then (with the op it was in) and the step is
//! retried as usual. If the limit passes without an answer, the dispatcher stops waiting:
//!
//! * the step fails with [`DeviceError::Lost`], naming the runlist and its layers, and is not
//!   retried (the backend is still held by the stuck call);
//! * the device is marked lost, and every later step fails at once with
//!   [`DeviceError::Unavailable`] while it stays away;
//! * a backend that comes back late is taken back at the start of the next step: its late
//!   result is discarded (the caller had already been told the step failed, and its sequences
//!   did not advance, so cache entries the late step wrote are overwritten like those of any
//!   failed step), `cancel` is called, and the step runs on it as on a healthy device;
//! * dropping a dispatcher whose device is lost does not wait for it: the device thread ends,
//!   dropping the backend, when the stuck call returns (or with the process).
//!
//! After a failed runlist the device thread calls `cancel` under a fresh limit: the failed
//! runlist's deadline plus grace, counted from the cancel's start. A device whose queue cannot
//! take back work it has started (a GPU) waits there for that work to drain; one that drains
//! no faster is lost like one whose `wait` does not return.
//!
//! A panic inside the backend is caught on the device thread and reported as a
//! [`DeviceError::Fault`] of the runlist it happened in, instead of unwinding through the
//! caller.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::backend::{Backend, BackendInfo, Batch, DeviceError, LogitsWanted, SeqSpan};
use crate::cut::Runlist;
use crate::dispatcher::Core;
use crate::trace::Trace;

/// What a step's try returns: the failed runlist and why.
pub(crate) type TryResult = Result<(), Box<(Runlist, DeviceError)>>;

/// What moves to the device thread for a step and back.
struct Held {
    backend: Box<dyn Backend>,
    trace: Option<Trace>,
    /// The step's tokens and spans (capacity kept between steps).
    tokens: Vec<u32>,
    spans: Vec<SeqSpan>,
}

struct Job {
    core: Arc<Core>,
    depth: Option<usize>,
    logits: LogitsWanted,
    held: Held,
}

struct Done {
    held: Held,
    result: TryResult,
}

/// Where the device thread is in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct At {
    /// Runlist index within the step.
    pub k: usize,
    pub started: Instant,
    /// When the watchdog gives up on it.
    pub limit: Instant,
}

/// Shared by the dispatcher (reads) and the device thread (writes at each runlist's start).
#[derive(Debug)]
pub(crate) struct Progress(Mutex<At>);

impl Progress {
    pub(crate) fn set(&self, at: At) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }
    fn get(&self) -> At {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Facts about the backend that do not change, kept so they can be answered while the backend
/// is on the device thread (or lost).
#[derive(Clone, Debug)]
pub(crate) struct Facts {
    pub info: BackendInfo,
    pub n_ctx: usize,
    pub n_seq: usize,
    pub max_batch: usize,
    pub vocab_size: usize,
}

/// A device abandoned by the watchdog.
#[derive(Clone, Debug)]
struct Lost {
    runlist: Runlist,
    since: Instant,
}

/// The backend, its device thread and the watchdog's state.
pub(crate) struct Device {
    held: Option<Held>,
    jobs: Option<mpsc::SyncSender<Job>>,
    done: mpsc::Receiver<Done>,
    progress: Arc<Progress>,
    thread: Option<JoinHandle<()>>,
    lost: Option<Lost>,
    pub facts: Facts,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("backend", &self.facts.info.name)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl Device {
    pub(crate) fn new(backend: Box<dyn Backend>, trace: Option<Trace>) -> std::io::Result<Device> {
        let facts = Facts {
            info: backend.info(),
            n_ctx: backend.n_ctx(),
            n_seq: backend.n_seq(),
            max_batch: backend.max_batch(),
            vocab_size: backend.vocab_size(),
        };
        // One job is in flight at a time, so bounded channels of one never block, and their
        // preallocated slot keeps steady-state steps free of heap allocation (an unbounded
        // channel allocates a block every few dozen messages).
        let (jobs, job_rx) = mpsc::sync_channel::<Job>(1);
        let (done_tx, done) = mpsc::sync_channel::<Done>(1);
        let now = Instant::now();
        let progress = Arc::new(Progress(Mutex::new(At {
            k: 0,
            started: now,
            limit: now,
        })));
        let p = progress.clone();
        let thread = std::thread::Builder::new()
            .name(format!("flowrt-device({})", facts.info.name))
            .spawn(move || device_thread(job_rx, done_tx, p))?;
        Ok(Device {
            held: Some(Held {
                tokens: Vec::with_capacity(facts.max_batch),
                spans: Vec::with_capacity(facts.n_seq),
                backend,
                trace,
            }),
            jobs: Some(jobs),
            done,
            progress,
            thread: Some(thread),
            lost: None,
            facts,
        })
    }

    /// The backend, unless it is away (lost to a stuck call).
    pub(crate) fn backend(&self) -> Option<&dyn Backend> {
        self.held.as_ref().map(|h| h.backend.as_ref())
    }

    pub(crate) fn trace(&self) -> Option<&Trace> {
        self.held.as_ref().and_then(|h| h.trace.as_ref())
    }

    /// Whether the watchdog gave up on the device and it has not come back yet (as far as the
    /// last step saw).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_some()
    }

    /// Take the backend back if it returned from a stuck call.
    fn reclaim(&mut self) -> TryResult {
        let Some(lost) = &self.lost else {
            return Ok(());
        };
        match self.done.try_recv() {
            Ok(mut late) => {
                // The late result is the abandoned step's: its caller was told it failed.
                late.held.backend.cancel();
                self.held = Some(late.held);
                self.lost = None;
                Ok(())
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => Err(Box::new((
                lost.runlist.clone(),
                DeviceError::Unavailable {
                    lost_for: lost.since.elapsed(),
                },
            ))),
        }
    }

    /// Run one try of a step at `depth` on the device thread, watching it.
    pub(crate) fn run(
        &mut self,
        core: &Arc<Core>,
        depth: Option<usize>,
        batch: &Batch,
    ) -> TryResult {
        self.reclaim()?;
        // Between steps the backend is away only while the device is lost, and then
        // `reclaim` has returned above.
        let mut held = self
            .held
            .take()
            .expect("the backend is held unless the device is lost");
        held.tokens.clear();
        held.tokens.extend_from_slice(batch.tokens);
        held.spans.clear();
        held.spans.extend_from_slice(batch.spans);
        // The device thread publishes each runlist as it starts it; until then the watchdog
        // watches the first, from now (a stale limit of the last step would fire at once).
        let first = core.runlist(depth, 0, batch);
        self.progress.set(core.watch(0, Instant::now(), &first));
        let job = Job {
            core: core.clone(),
            depth,
            logits: batch.logits,
            held,
        };
        let jobs = self.jobs.as_ref().expect("the job sender lives until drop");
        if let Err(mpsc::SendError(job)) = jobs.send(job) {
            self.held = Some(job.held);
            return Err(Box::new((
                first,
                fault(None, "the device thread has exited".into()),
            )));
        }
        loop {
            let at = self.progress.get();
            match self
                .done
                .recv_timeout(at.limit.saturating_duration_since(Instant::now()))
            {
                Ok(done) => {
                    self.held = Some(done.held);
                    return done.result;
                }
                Err(RecvTimeoutError::Timeout) => {
                    let at = self.progress.get();
                    if at.limit > Instant::now() {
                        // The device moved on to the next runlist meanwhile.
                        continue;
                    }
                    let error = DeviceError::Lost {
                        waited: at.started.elapsed(),
                        limit: at.limit - at.started,
                    };
                    return Err(self.give_up(core.runlist(depth, at.k, batch), error));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The thread ended without answering: nothing to reclaim, ever.
                    let rl = core.runlist(depth, self.progress.get().k, batch);
                    let error = fault(None, "the device thread ended without answering".into());
                    return Err(self.give_up(rl, error));
                }
            }
        }
    }

    /// Mark the device lost in `runlist` and say why.
    fn give_up(&mut self, runlist: Runlist, error: DeviceError) -> Box<(Runlist, DeviceError)> {
        self.lost = Some(Lost {
            runlist: runlist.clone(),
            since: Instant::now(),
        });
        Box::new((runlist, error))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Dropping the sender ends the device thread's loop. Join it only when it is idle: a
        // thread stuck in a lost backend's call must not hang the drop.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            if self.lost.is_none() {
                let _ = t.join();
            }
        }
    }
}

fn fault(op: Option<&'static str>, reason: String) -> DeviceError {
    DeviceError::Fault {
        group: None,
        kind: None,
        op,
        reason,
    }
}

fn device_thread(jobs: mpsc::Receiver<Job>, done: mpsc::SyncSender<Done>, progress: Arc<Progress>) {
    // The first time a thread blocks on a channel the standard library sets up its waiting
    // context, which allocates; do it now, so that no step allocates.
    let (_keep, warm) = mpsc::sync_channel::<()>(1);
    let _ = warm.recv_timeout(std::time::Duration::from_micros(1));
    while let Ok(job) = jobs.recv() {
        let Job {
            core,
            depth,
            logits,
            mut held,
        } = job;
        let result = {
            let Held {
                backend,
                trace,
                tokens,
                spans,
            } = &mut held;
            let batch = Batch {
                tokens,
                spans,
                logits,
            };
            let r = catch_unwind(AssertUnwindSafe(|| {
                core.try_step(backend.as_mut(), &batch, depth, trace.as_mut(), &progress)
            }));
            let r = r.unwrap_or_else(|panic| {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                let rl = core.runlist(depth, progress.get().k, &batch);
                Err(Box::new((
                    rl,
                    fault(None, format!("the backend panicked: {msg}")),
                )))
            });
            if let Err(failed) = &r {
                // `cancel` gets the failed runlist's limit again, from its own start: a
                // device whose queue cannot take started work back (a GPU) drains it there.
                progress.set(core.watch(progress.get().k, Instant::now(), &failed.0));
                let _ = catch_unwind(AssertUnwindSafe(|| backend.cancel()));
            }
            r
        };
        if done.send(Done { held, result }).is_err() {
            // The dispatcher is gone (dropped while this step was lost).
            return;
        }
    }
}
