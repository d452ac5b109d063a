//! The device: adapter choice, buffers, kernels and waits, with every wgpu error captured
//! (wgpu's default for an uncaptured error is to panic; flowrt records it and reports it as
//! the step's fault instead).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::VulkanError;

/// A Vulkan device as `flowrt devices` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceDesc {
    pub index: usize,
    pub name: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` (a software driver such as lavapipe) or
    /// `other`.
    pub kind: &'static str,
    pub driver: String,
    pub vendor_id: u32,
    pub device_id: u32,
}

fn kind_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

fn adapters() -> Result<Vec<wgpu::Adapter>, VulkanError> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc);
    let list = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    if list.is_empty() {
        return Err(VulkanError::NoDevice(
            "no Vulkan loader (libvulkan) or no driver reported a device".into(),
        ));
    }
    Ok(list)
}

fn describe(index: usize, a: &wgpu::Adapter) -> DeviceDesc {
    let i = a.get_info();
    DeviceDesc {
        index,
        name: i.name.clone(),
        kind: kind_name(i.device_type),
        driver: if i.driver_info.is_empty() {
            i.driver.clone()
        } else {
            format!("{} ({})", i.driver, i.driver_info)
        },
        vendor_id: i.vendor,
        device_id: i.device,
    }
}

/// Every Vulkan device on this machine, in the order `--device N` counts them.
pub fn devices() -> Result<Vec<DeviceDesc>, VulkanError> {
    Ok(adapters()?
        .iter()
        .enumerate()
        .map(|(i, a)| describe(i, a))
        .collect())
}

/// The index of the device used when none is named: the first real GPU (discrete, then
/// integrated), else the first device.
pub fn default_device(list: &[DeviceDesc]) -> usize {
    let mut best = 0;
    for (i, d) in list.iter().enumerate() {
        let r = |k: &str| match k {
            "discrete" => 0,
            "integrated" => 1,
            "virtual" => 2,
            "other" => 3,
            _ => 4,
        };
        if r(d.kind) < r(list[best].kind) {
            best = i;
        }
    }
    best
}

/// An open device and its queue.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub desc: DeviceDesc,
    pub limits: wgpu::Limits,
    /// Errors wgpu raised outside an error scope since the last [`Gpu::take_errors`].
    errors: Arc<Mutex<Vec<String>>>,
    /// Why the device was lost, once it was.
    lost: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    /// Open device `index` (`None`: the default choice, see [`default_device`]).
    pub fn open(index: Option<usize>) -> Result<Gpu, VulkanError> {
        let list = adapters()?;
        let descs: Vec<DeviceDesc> = list
            .iter()
            .enumerate()
            .map(|(i, a)| describe(i, a))
            .collect();
        let index = match index {
            Some(i) if i >= list.len() => {
                return Err(VulkanError::BadDeviceIndex {
                    index: i,
                    count: list.len(),
                })
            }
            Some(i) => i,
            None => default_device(&descs),
        };
        let adapter = &list[index];
        let desc = descs[index].clone();
        // Ask for the largest buffers and bindings the adapter has: weights are big.
        let al = adapter.limits();
        let limits = wgpu::Limits {
            max_buffer_size: al.max_buffer_size,
            max_storage_buffer_binding_size: al.max_storage_buffer_binding_size,
            max_storage_buffers_per_shader_stage: al.max_storage_buffers_per_shader_stage.min(16),
            max_compute_workgroup_storage_size: al.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: al.max_compute_invocations_per_workgroup,
            max_compute_workgroup_size_x: al.max_compute_workgroup_size_x,
            max_compute_workgroups_per_dimension: al.max_compute_workgroups_per_dimension,
            ..wgpu::Limits::downlevel_defaults()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("flowrt"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| VulkanError::Open {
            name: desc.name.clone(),
            reason: e.to_string(),
        })?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let e2 = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = e2.lock() {
                if v.len() < 16 {
                    v.push(e.to_string());
                }
            }
        }));
        let lost = Arc::new(Mutex::new(None));
        let l2 = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = l2.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        Ok(Gpu {
            device,
            queue,
            desc,
            limits,
            errors,
            lost,
        })
    }

    /// Errors raised since the last call (cleared).
    pub fn take_errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }

    /// Why the device was lost, if it was.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().ok().and_then(|l| l.clone())
    }

    /// Fails with the first error wgpu raised or the loss of the device.
    pub fn check(&self) -> Result<(), VulkanError> {
        if let Some(l) = self.lost() {
            return Err(VulkanError::Device(format!("device lost: {l}")));
        }
        let e = self.take_errors();
        match e.first() {
            Some(first) => Err(VulkanError::Device(first.clone())),
            None => Ok(()),
        }
    }

    /// Compile a WGSL kernel with entry point `entry` (bind group 0 laid out from the shader).
    pub fn kernel(
        &self,
        name: &str,
        wgsl: &str,
        entry: &str,
    ) -> Result<wgpu::ComputePipeline, VulkanError> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(wgsl.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(VulkanError::Kernel {
                name: name.to_string(),
                reason: e.to_string(),
            });
        }
        Ok(pipeline)
    }

    fn buffer(
        &self,
        what: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, VulkanError> {
        let size = size.max(4).next_multiple_of(4);
        if size > self.limits.max_buffer_size {
            return Err(VulkanError::OutOfMemory {
                what: what.to_string(),
                bytes: size,
                reason: format!(
                    "larger than the device's largest buffer, {} bytes",
                    self.limits.max_buffer_size
                ),
            });
        }
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(what),
            size,
            usage,
            mapped_at_creation: false,
        });
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o.or(v) {
            return Err(VulkanError::OutOfMemory {
                what: what.to_string(),
                bytes: size,
                reason: e.to_string(),
            });
        }
        Ok(b)
    }

    /// A storage buffer of `size` bytes (rounded up to 4), zeroed.
    pub fn storage(&self, what: &str, size: u64) -> Result<wgpu::Buffer, VulkanError> {
        self.buffer(
            what,
            size,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        )
    }

    /// A storage buffer holding `bytes` (padded with zeros to a multiple of 4).
    pub fn upload(&self, what: &str, bytes: &[u8]) -> Result<wgpu::Buffer, VulkanError> {
        let b = self.storage(what, bytes.len() as u64)?;
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(&b, 0, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(&b, whole as u64, &tail);
        }
        Ok(b)
    }

    /// A uniform buffer holding `bytes`.
    pub fn uniform(&self, what: &str, bytes: &[u8]) -> Result<wgpu::Buffer, VulkanError> {
        let b = self.buffer(
            what,
            bytes.len().next_multiple_of(16) as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )?;
        self.queue.write_buffer(&b, 0, bytes);
        Ok(b)
    }

    /// A buffer the host reads results from.
    pub fn readback(&self, what: &str, size: u64) -> Result<wgpu::Buffer, VulkanError> {
        self.buffer(
            what,
            size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// A bind group for `pipeline`'s group 0 with `buffers` at bindings 0, 1, ...
    pub fn bind(
        &self,
        pipeline: &wgpu::ComputePipeline,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// Wait for `index` (or everything submitted) for at most `timeout`.
    pub fn wait(
        &self,
        index: Option<wgpu::SubmissionIndex>,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        match self.device.poll(wgpu::PollType::Wait {
            submission_index: index,
            timeout: Some(timeout),
        }) {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => Err(WaitError::Timeout),
            Err(e) => Err(WaitError::Failed(e.to_string())),
        }
    }

    /// Copy `len` bytes at `offset` of `src` into `dst` (a readback buffer), submit, wait up to
    /// `timeout` and return them.
    pub fn read(
        &self,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        offset: u64,
        len: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, VulkanError> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, offset, dst, 0, Some(len.next_multiple_of(4)));
        self.queue.submit([enc.finish()]);
        let mut out = Vec::new();
        self.map_read(dst, len, timeout, |b| out.extend_from_slice(b))?;
        self.check()?;
        Ok(out)
    }

    /// Map the first `len` bytes of readback buffer `buf` (its copy already submitted), wait up
    /// to `timeout`, hand them to `take` and unmap.
    pub fn map_read(
        &self,
        buf: &wgpu::Buffer,
        len: u64,
        timeout: Duration,
        take: impl FnOnce(&[u8]),
    ) -> Result<(), VulkanError> {
        let len4 = len.next_multiple_of(4);
        let slot = Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        buf.map_async(wgpu::MapMode::Read, 0..len4, move |r| {
            if let Ok(mut s) = s2.lock() {
                *s = Some(r);
            }
        });
        self.wait(None, timeout).map_err(|e| match e {
            WaitError::Timeout => {
                VulkanError::Device(format!("reading results took longer than {timeout:?}"))
            }
            WaitError::Failed(m) => VulkanError::Device(m),
        })?;
        let mapped = slot.lock().ok().and_then(|mut s| s.take());
        match mapped {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(VulkanError::Device(format!("mapping results: {e}"))),
            None => return Err(VulkanError::Device("results were not mapped".into())),
        }
        {
            let view = buf
                .get_mapped_range(0..len4)
                .map_err(|e| VulkanError::Device(format!("mapping results: {e}")))?;
            take(&view[..len as usize]);
        }
        buf.unmap();
        Ok(())
    }
}

/// Why this machine has no Vulkan device to run on (`None`: it has one). Tests use it to say
/// NOT RUN and why.
pub fn unavailable() -> Option<String> {
    match devices() {
        Ok(d) if !d.is_empty() => None,
        Ok(_) => Some("no Vulkan device".into()),
        Err(e) => Some(e.to_string()),
    }
}

/// Why a wait ended without the work done.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitError {
    Timeout,
    Failed(String),
}
