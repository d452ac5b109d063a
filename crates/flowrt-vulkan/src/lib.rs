//! The Vulkan backend: runs the decoder's command groups ([`flowrt_model::Plan`]) as compute
//! kernels on a GPU queue.
//!
//! # Binding: `wgpu`
//!
//! flowrt reaches Vulkan through [`wgpu`] (Vulkan back end only) and writes its kernels in
//! WGSL, which wgpu's `naga` translates to SPIR-V at run time. The alternatives weighed:
//!
//! - **`ash`** (raw Vulkan) gives fences with timeouts, integer dot products
//!   (`VK_KHR_shader_integer_dot_product`) and full control of memory heaps, but its kernels must
//!   be SPIR-V, which needs a GLSL/HLSL compiler (glslc, dxc) at build time that a fresh machine
//!   does not have; committing pre-built SPIR-V blobs would hide the source of truth.
//! - **`wgpu`** compiles WGSL in-process (no tool at build time), validates every buffer access
//!   (an out-of-bounds index in a kernel cannot corrupt memory), reports device loss through a
//!   callback and waits on a submission with a timeout (`PollType::Wait { timeout }`), which is
//!   the runlist deadline. It builds in about a minute with only the `vulkan` and `wgsl`
//!   features. What it costs: no integer dot-product instructions in WGSL (quantised weights
//!   are dequantised in registers and multiplied in f32), f16 arithmetic only where the
//!   device has `shader-f16` (flowrt does not need it: f16 data is unpacked with
//!   `unpack2x16float`), subgroups only behind a feature (not used), and no report of the
//!   device's memory size.
//!
//! # What runs where
//!
//! Weights are uploaded once, in their file types (quantised blocks stay quantised; a matrix
//! larger than the device's largest storage binding is split into row chunks). The KV cache
//! and every activation buffer live in device memory. Per step, the tokens and their
//! (sequence, position) pairs go in and the requested logits come out; nothing else crosses
//! the bus.
//!
//! # Runlists on the queue
//!
//! `submit` records a runlist's groups into one command buffer and submits it; `wait` blocks
//! on that submission with the runlist's deadline as the timeout (`PollType::Wait`). A missed
//! deadline is reported with the runlist's layers; because a GPU queue cannot take back work
//! it has started, `cancel` drains the queue (bounded) before the dispatcher retries, and a
//! queue that does not drain marks the device lost.

mod backend;
mod error;
pub mod gpu;
mod ops;
pub mod quant;

pub use backend::{MoeGrouping, VulkanBackend};
pub use error::VulkanError;
pub use gpu::{devices, unavailable, DeviceDesc, Gpu};
