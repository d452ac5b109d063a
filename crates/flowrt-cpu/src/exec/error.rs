//! Why a batch could not run on the CPU, and what the dispatcher is told.

use flowrt_dispatch::{BatchError, DeviceError};
use flowrt_dtype::GgmlType;
use flowrt_model::plan::GroupKind;

/// Why a batch could not run.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The batch itself is wrong (size, token ids, spans): the request's error.
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("tensor `{tensor}` has type {ty}, which the CPU kernels cannot compute with")]
    UnsupportedType { tensor: String, ty: GgmlType },
    #[error("group {group} ({kind:?}), op `{op}`: deadline passed {late:?} ago, {ran:?} into the runlist")]
    Deadline {
        group: usize,
        kind: GroupKind,
        op: &'static str,
        late: std::time::Duration,
        /// How long the runlist had been running when the op was due to start.
        ran: std::time::Duration,
    },
    #[error("repacking the weights: {0}")]
    Repack(std::io::Error),
    /// A backend option the CPU does not take (the message names it and lists the ones it
    /// takes).
    #[error("{0}")]
    UnknownSetting(String),
    #[error("setting `{name}={value}`: {reason}")]
    BadSetting {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("setting `kernels={value}`: {error}")]
    Kernels {
        value: String,
        error: flowrt_kernels::KernelError,
    },
    #[error(
        "device {index} does not exist: the CPU backend has one device, 0 (see `flowrt devices`)"
    )]
    NoSuchDevice { index: usize },
    #[error("group {group} ({kind:?}), op `{op}`: {reason}")]
    Op {
        group: usize,
        kind: GroupKind,
        op: &'static str,
        reason: String,
    },
}

impl BackendError {
    /// The dispatcher's view of the error.
    pub(super) fn to_device(&self) -> DeviceError {
        match *self {
            BackendError::Deadline {
                group,
                kind,
                op,
                ran,
                ..
            } => DeviceError::Timeout {
                waited: ran,
                group: Some(group),
                kind: Some(kind),
                op: Some(op),
            },
            BackendError::Op {
                group,
                kind,
                op,
                ref reason,
            } => DeviceError::Fault {
                group: Some(group),
                kind: Some(kind),
                op: Some(op),
                reason: reason.clone(),
            },
            _ => DeviceError::Input(self.to_string()),
        }
    }
}
