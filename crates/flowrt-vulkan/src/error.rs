//! What can go wrong on the Vulkan backend.

use flowrt_dtype::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum VulkanError {
    /// No Vulkan loader or driver on this machine.
    #[error("no Vulkan device is available: {0} (install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers and libvulkan1, or use --backend cpu)")]
    NoDevice(String),
    /// `--device N` names a device that does not exist.
    #[error(
        "Vulkan device {index} does not exist: this machine has {count} (see `flowrt devices`)"
    )]
    BadDeviceIndex { index: usize, count: usize },
    /// The device refused to open.
    #[error("could not open Vulkan device `{name}`: {reason}")]
    Open { name: String, reason: String },
    /// A weight type without a kernel on this backend.
    #[error("tensor `{tensor}` has type {ty}, which the Vulkan backend has no kernel for (use --backend cpu)")]
    UnsupportedType { tensor: String, ty: GgmlType },
    /// A buffer the device cannot allocate.
    #[error("out of device memory: {what} needs {bytes} bytes ({reason})")]
    OutOfMemory {
        what: String,
        bytes: u64,
        reason: String,
    },
    /// A kernel that did not compile or validate (a bug in flowrt).
    #[error("kernel `{name}` failed to build: {reason}")]
    Kernel { name: String, reason: String },
    /// A family that needs kernels this backend does not have (attention sinks, clamped
    /// SwiGLU, biased experts, LayerNorm, ...), refused by name before anything is uploaded.
    #[error("the Vulkan backend cannot run the `{family}` family: it has no {} (use --backend cpu)", missing.join(", "))]
    Family {
        family: String,
        missing: Vec<&'static str>,
    },
    /// The model or settings ask for something this backend cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The device was lost or a submission failed.
    #[error("the Vulkan device failed: {0}")]
    Device(String),
}
