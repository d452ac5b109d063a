//! How the forward pass reaches a device.
//!
//! The model's [`flowrt_model::Plan`] is a sequence of per-layer command groups. A
//! [`Dispatcher`] cuts it into **runlists** of at most N layers (a backend default, or the
//! user's `--max-runlist-layers`), submits each to a [`Backend`], and waits for it with a
//! **deadline** derived from its cost. When a runlist misses its deadline or the device
//! reports a fault, the dispatcher cancels it, reports which runlist, layers and op failed,
//! and retries the whole step with half the depth (down to one layer), keeping the smaller
//! depth for later steps; only then does the request fail. A step is all-or-nothing: the
//! caller advances its sequence only when every runlist of the step succeeded, so a failed
//! step leaves no half-applied layer behind (its cache entries are rewritten on retry).
//!
//! - [`backend`]: the seam a device implements (submit, wait with a deadline, cancel).
//! - [`cut`]: cutting a plan into runlists.
//! - [`cost`]: weight bytes and FLOPs per group, for deadlines and `flowrt plan`.
//! - [`dispatcher`]: the retrying dispatcher.
//! - [`watch`]: the device thread and the watchdog that enforces deadlines even on a backend
//!   whose `wait` never returns.
//! - [`trace`]: Chrome trace-event JSON (opens in Perfetto): one span per runlist and per op.
//! - [`settings`]: what every backend is asked for, and backend-specific `name=value` settings.
//! - [`fault`]: a fault-injecting backend wrapping another, for tests.

pub mod backend;
pub mod cost;
pub mod cut;
pub mod dispatcher;
pub mod fault;
pub mod settings;
pub mod trace;
pub mod watch;

pub use backend::{
    Backend, BackendInfo, Batch, BatchError, DeviceError, DeviceRates, InputStat, InputStatKind,
    LogitsWanted, ProbeError, SeqSpan,
};
pub use cost::{group_costs, GroupCost};
pub use cut::{runlists, Runlist};
pub use dispatcher::{Attempt, DispatchError, DispatchOptions, Dispatcher, MIN_WATCHDOG_GRACE};
pub use fault::{FaultBackend, FaultScope, FaultSpec, Inject, StuckGate};
pub use settings::{BackendSettings, KvPrecision};
pub use trace::Trace;
