//! The backend factory: the one place that knows which backends exist.
//!
//! The engine, server and CLI ask for a [`BackendKind`] with generic [`BackendSettings`] and
//! get a `Box<dyn Backend>`; each backend crate parses its own `name=value` options and
//! rejects the ones it does not know. Adding a backend is one crate implementing
//! [`flowrt_dispatch::Backend`] plus one arm in [`open`] (and its devices in [`devices`]).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use flowrt_dispatch::{Backend, BackendSettings};
use flowrt_model::Model;

pub use flowrt_vulkan::DeviceDesc as VulkanDevice;

/// Which backend runs a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BackendKind {
    /// The CPU, with the run-time-selected SIMD kernels.
    #[default]
    Cpu,
    /// A GPU through Vulkan.
    Vulkan,
    /// Vulkan when this machine has a real GPU (a discrete or integrated device), else the
    /// CPU. See [`resolve`].
    Auto,
}

impl BackendKind {
    /// Every kind, in the order help texts list them.
    pub const ALL: [BackendKind; 3] = [BackendKind::Cpu, BackendKind::Vulkan, BackendKind::Auto];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Vulkan => "vulkan",
            BackendKind::Auto => "auto",
        }
    }
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown backend `{s}` (use cpu, vulkan or auto)"))
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a backend could not be opened. Every message names the backend.
///
/// The backend's own error is held, typed, and its message is part of this one (it is not a
/// `source()` as well, so that a report of the whole chain does not say it twice).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cpu backend: {0}")]
    Cpu(flowrt_cpu::BackendError),
    #[error("vulkan backend: {0}")]
    Vulkan(flowrt_vulkan::VulkanError),
    /// Settings the backend cannot honour, found before it was asked to start.
    #[error("{backend} backend: {reason}")]
    Settings {
        backend: BackendKind,
        reason: String,
    },
}

impl From<flowrt_cpu::BackendError> for OpenError {
    fn from(e: flowrt_cpu::BackendError) -> Self {
        OpenError::Cpu(e)
    }
}

impl From<flowrt_vulkan::VulkanError> for OpenError {
    fn from(e: flowrt_vulkan::VulkanError) -> Self {
        OpenError::Vulkan(e)
    }
}

impl OpenError {
    /// The backend that failed to open.
    pub fn backend(&self) -> BackendKind {
        match self {
            OpenError::Cpu(_) => BackendKind::Cpu,
            OpenError::Vulkan(_) => BackendKind::Vulkan,
            OpenError::Settings { backend, .. } => *backend,
        }
    }
}

/// Open a backend of `kind` (`Auto` resolved by [`resolve`]) for `model` with `settings`.
pub fn open(
    kind: BackendKind,
    model: Arc<Model>,
    settings: &BackendSettings,
) -> Result<Box<dyn Backend>, OpenError> {
    let kind = resolve(kind);
    for (name, n) in [
        ("n_ctx", settings.n_ctx),
        ("n_seq", settings.n_seq),
        ("max_batch", settings.max_batch),
    ] {
        if n == 0 {
            return Err(OpenError::Settings {
                backend: kind,
                reason: format!("{name} must be at least 1"),
            });
        }
    }
    match kind {
        BackendKind::Cpu => Ok(Box::new(flowrt_cpu::CpuBackend::from_settings(
            model, settings,
        )?)),
        BackendKind::Vulkan => Ok(Box::new(flowrt_vulkan::VulkanBackend::new(
            model, settings,
        )?)),
        BackendKind::Auto => unreachable!("resolve never returns Auto"),
    }
}

/// The backend `kind` stands for on this machine: `Auto` is Vulkan when some Vulkan device is
/// a real GPU (discrete or integrated; not a software renderer such as lavapipe), else the
/// CPU. The other kinds are themselves.
pub fn resolve(kind: BackendKind) -> BackendKind {
    match kind {
        BackendKind::Auto => devices().auto(),
        k => k,
    }
}

/// The host CPU as a backend device.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuDevice {
    /// The CPU's model name (or the architecture where the OS does not say).
    pub name: String,
    /// Threads the CPU backend uses by default (physical cores).
    pub threads: usize,
    /// The kernel set the CPU backend picks by default (`FLOWRT_KERNELS` honoured).
    pub kernels: &'static str,
    /// Every kernel set this host can run, best last.
    pub kernel_sets: Vec<&'static str>,
    /// SIMD features detected that the kernels care about.
    pub features: Vec<&'static str>,
}

/// What the CPU backend would run on. Cheap: no other backend is probed.
pub fn cpu_device() -> CpuDevice {
    let kernels = flowrt_kernels::Kernels::detect();
    CpuDevice {
        name: flowrt_cpu::cpu_name(),
        threads: flowrt_cpu::physical_cores(),
        kernels: kernels.name(),
        kernel_sets: flowrt_kernels::Kernels::available()
            .iter()
            .map(|k| k.name())
            .collect(),
        features: flowrt_kernels::Kernels::cpu_features(),
    }
}

/// The devices every backend sees on this machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Devices {
    pub cpu: CpuDevice,
    /// Vulkan devices in the order `--device N` counts them, or why there are none (no
    /// loader, no driver, ...).
    pub vulkan: Result<Vec<VulkanDevice>, String>,
}

impl Devices {
    /// What [`BackendKind::Auto`] picks with these devices.
    pub fn auto(&self) -> BackendKind {
        match &self.vulkan {
            Ok(list) if list.iter().any(is_real_gpu) => BackendKind::Vulkan,
            _ => BackendKind::Cpu,
        }
    }
}

/// Whether a Vulkan device is a GPU (not a software renderer or an unknown kind).
pub fn is_real_gpu(d: &VulkanDevice) -> bool {
    matches!(d.kind, "discrete" | "integrated")
}

/// The CPU and every Vulkan device. Never panics: a Vulkan loader or driver that fails (or
/// panics) is reported as the reason Vulkan has no device.
pub fn devices() -> Devices {
    let vulkan = match std::panic::catch_unwind(flowrt_vulkan::devices) {
        Ok(Ok(list)) if list.is_empty() => Err("no Vulkan driver reported a device".into()),
        Ok(Ok(list)) => Ok(list),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!(
            "enumerating Vulkan devices failed: {}",
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "the driver panicked".into())
        )),
    };
    Devices {
        cpu: cpu_device(),
        vulkan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_print() {
        for k in BackendKind::ALL {
            assert_eq!(k.to_string().parse::<BackendKind>().unwrap(), k);
        }
        let e = "cuda".parse::<BackendKind>().unwrap_err();
        assert!(
            e.contains("`cuda`") && e.contains("cpu") && e.contains("vulkan") && e.contains("auto"),
            "{e}"
        );
        assert!("CPU".parse::<BackendKind>().is_err());
        assert_eq!(BackendKind::default(), BackendKind::Cpu);
    }

    fn vk(kind: &'static str) -> VulkanDevice {
        VulkanDevice {
            index: 0,
            name: format!("a {kind} device"),
            kind,
            driver: "test".into(),
            vendor_id: 0,
            device_id: 0,
        }
    }

    #[test]
    fn auto_takes_vulkan_only_for_a_real_gpu() {
        let with = |vulkan| Devices {
            cpu: cpu_device(),
            vulkan,
        };
        assert_eq!(with(Err("no loader".into())).auto(), BackendKind::Cpu);
        assert_eq!(with(Ok(vec![vk("cpu")])).auto(), BackendKind::Cpu);
        assert_eq!(with(Ok(vec![vk("virtual")])).auto(), BackendKind::Cpu);
        assert_eq!(
            with(Ok(vec![vk("cpu"), vk("integrated")])).auto(),
            BackendKind::Vulkan
        );
        assert_eq!(with(Ok(vec![vk("discrete")])).auto(), BackendKind::Vulkan);
        assert_eq!(resolve(BackendKind::Cpu), BackendKind::Cpu);
        assert_eq!(resolve(BackendKind::Vulkan), BackendKind::Vulkan);
        assert_ne!(resolve(BackendKind::Auto), BackendKind::Auto);
    }

    #[test]
    fn devices_list_the_cpu() {
        let d = devices();
        assert!(!d.cpu.name.is_empty());
        assert!(d.cpu.threads >= 1);
        assert!(d.cpu.kernel_sets.contains(&"scalar"));
        assert!(d.cpu.kernel_sets.contains(&d.cpu.kernels));
        match &d.vulkan {
            Ok(list) => {
                assert!(!list.is_empty());
                for (i, v) in list.iter().enumerate() {
                    assert_eq!(v.index, i);
                }
            }
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
