//! Kernels that read weights in their file types: matmul (matrix-vector shapes for decode,
//! a register-blocked shape for batches) and the embedding lookup.
//!
//! Weights stay in ggml's block layouts on the device (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4), a matrix split into row chunks that each fit one storage
//! binding. Each type's dequantisation is written once in WGSL (`quant/wgsl.rs`: `deq`
//! returns 32 consecutive values of a row as 8 vec4s, reading bytes through u32 words) and
//! shared by every kernel; the matmul body is the same for all types and accumulates in f32.
//!
//! # The matmul body and its shapes
//!
//! A [`Shape`] says how a 64-thread workgroup splits the work: `64 / tpr` row groups, the
//! `tpr` threads of a group splitting the row's 32-value steps (their sums added through
//! workgroup memory), each thread computing `rpt` rows x `nt` tokens in registers. Every
//! dequantised weight serves `nt` tokens and every loaded activation `rpt` rows. A
//! [`Tuning`] picks the shapes by batch size: `decode` (n = 1), `small` (n up to
//! `vector_max`), `tiled` (batches); [`Tuning::for_device`] chooses [`Tuning::CPU`] for
//! CPU emulations and [`Tuning::GPU`] otherwise.
//!
//! On lavapipe (Mesa 22.3, LLVM 15, 2 cores, a shared machine: figures vary by +-30%) every
//! buffer or workgroup-memory load is a loop over the 8 SIMD lanes with a bounds check, so
//! the kernels are shaped to load little: one word of weights at a time, each word once per
//! 32 values, activations as vec4s where `x_stride` is a multiple of 4. Measured (Q4_1):
//! 576x1536 n=1 0.47 ms (1.2 GB/s of weights), n=128 20 ms (11 GFLOP/s); 49152x576 n=1
//! 16 ms (1.1 GB/s), n=128 0.76 s (9.6 GFLOP/s). The first version (a 16-thread split per row
//! and a 64x64 tile through workgroup memory) took 2.1 ms, 112 ms, 95 ms and 3.2 s. Bigger
//! register blocks are a little faster but take lavapipe seconds to compile per kernel
//! (a Q6_K kernel in 16 x 8: 5.7 s; in 8 x 8: 2.1 s; 8 x 1: 0.7 s; Mesa keeps them in its
//! disk cache afterwards).
//!
//! Usage: [`DeviceMatrix::upload`] once per weight, [`DeviceMatrix::bind_matmul`] /
//! [`DeviceMatrix::bind_embed`] once per use (fixed activation buffers), then per step write
//! [`StepParams`] into the step uniform and [`BoundMatmul::record`] / [`BoundEmbed::record`]
//! into a compute pass.

mod wgsl;

use std::collections::HashMap;

use flowrt_dtype::GgmlType;

use crate::error::VulkanError;
use crate::gpu::Gpu;

/// The weight types these kernels read.
pub const TYPES: [GgmlType; 12] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Mxfp4,
];

/// Whether `ty` is one of [`TYPES`].
pub fn supported(ty: GgmlType) -> bool {
    TYPES.contains(&ty)
}

use wgsl::Ids;
pub use wgsl::Shape;

/// Which shapes the matmul kernels run in and when each is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// `n == 1` (decode).
    pub decode: Shape,
    /// `1 < n <= vector_max`.
    pub small: Shape,
    /// The largest `n` recorded with the matrix-vector shapes (`decode`, `small`).
    pub vector_max: u32,
    /// Batches (prefill).
    pub tiled: Shape,
    /// Matrices with fewer rows than `min_groups` workgroups of a shape take a copy of the
    /// shape with each row split over more threads (see [`Shape::spread`]), so that the
    /// device has that many workgroups to run at once.
    pub min_groups: u32,
}

impl Tuning {
    /// For CPU-emulated devices (lavapipe, SwiftShader), where every buffer load is a loop
    /// over the SIMD lanes: no split of rows across threads, each loaded activation used for
    /// 8 rows and (batches) each dequantised weight for 8 tokens. Chosen by measuring shapes
    /// on lavapipe (`tests/quant.rs`, `bench_lavapipe`): for n = 1, 8 rows per thread
    /// halved the time of 4 and 16 gained nothing; for n = 128, 8 x 8 ran at 1.6x the rate of
    /// 4 x 8 and within 20% of 16 x 8, which compiles 3x slower.
    pub const CPU: Tuning = Tuning {
        decode: Shape {
            tpr: 1,
            rpt: 8,
            nt: 1,
        },
        // Two tokens: the decode kernel twice costs about what the batch shape does (less for
        // Q4_0/Q4_1, more for Q6_K) without compiling a third kernel.
        small: Shape {
            tpr: 1,
            rpt: 8,
            nt: 1,
        },
        vector_max: 2,
        tiled: Shape {
            tpr: 1,
            rpt: 8,
            nt: 8,
        },
        min_groups: 1,
    };

    /// For GPUs (not measured on one yet): decode splits each row over 16 threads so that
    /// neighbouring threads read neighbouring blocks; batches give each thread 2 rows x 8
    /// tokens, the activations being the same address across a row group's threads.
    pub const GPU: Tuning = Tuning {
        decode: Shape {
            tpr: 16,
            rpt: 1,
            nt: 1,
        },
        small: Shape {
            tpr: 16,
            rpt: 1,
            nt: 4,
        },
        vector_max: 4,
        tiled: Shape {
            tpr: 1,
            rpt: 2,
            nt: 8,
        },
        min_groups: 64,
    };

    /// [`Tuning::CPU`] for a device of kind `cpu`, else [`Tuning::GPU`].
    pub fn for_device(gpu: &Gpu) -> Tuning {
        if gpu.desc.kind == "cpu" {
            Tuning::CPU
        } else {
            Tuning::GPU
        }
    }
}

/// Uniform of one matmul binding (one per chunk):
/// `y[t * y_stride + y_col0 + r] = sum_k W[r, k] * x[t * x_stride + k]` for `r < rows`,
/// `t < n`, where `n` is the step's `n_tok` if `n_sel == 0`, else its `n_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MatParams {
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub y_col0: u32,
    pub n_sel: u32,
    pub _pad: u32,
}

/// The per-step uniform every kernel reads (the backend writes it before each step).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepParams {
    pub n_tok: u32,
    pub n_out: u32,
    pub _pad: [u32; 2],
}

/// Uniform of one expert-matmul binding (one per chunk of whole experts): [`MatParams`]
/// (`rows`: one expert's rows, `y_col0` 0) and then: `k` pairs per token (the router's top-k),
/// activation row `p / x_div` for pair `p`, and the chunk's experts `e0..e0 + ne`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
struct MatIdParams {
    mat: MatParams,
    k: u32,
    x_div: u32,
    e0: u32,
    ne: u32,
}

/// Uniform of one embedding binding (one per chunk).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbParams {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    row0: u32,
    scale: f32,
    _pad: [u32; 3],
}

/// Which matmul shapes record a batch (for tests and measurements; [`BoundMatmul::record`]
/// chooses by `n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// The matrix-vector shapes (`decode` for one token, else `small`).
    Vector,
    /// The batch shape.
    Tiled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    /// A matmul in this shape; whether activations are read as vec4s.
    Mat(Shape, bool),
    /// The expert matmul (`matmul_id`) in this shape; whether activations are vec4s.
    MatId(Shape, bool),
    /// The expert matmul over pairs grouped by expert, in this shape; whether activations
    /// are vec4s.
    MatGrouped(Shape, bool),
    Embed,
}

/// Compiled pipelines for every type, built lazily per (type, kernel, alignment) and kept.
/// One cache serves one device.
#[derive(Default)]
pub struct QuantKernels {
    cache: HashMap<(GgmlType, Kind, bool), wgpu::ComputePipeline>,
    tuning: Option<Tuning>,
}

impl QuantKernels {
    /// Shapes chosen by the device's kind ([`Tuning::for_device`]) at the first bind.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fixed shapes (tests, measurements).
    pub fn with_tuning(tuning: Tuning) -> Self {
        assert!(
            tuning.decode.valid() && tuning.small.valid() && tuning.tiled.valid(),
            "{tuning:?}"
        );
        Self {
            cache: HashMap::new(),
            tuning: Some(tuning),
        }
    }

    /// The shapes in use (once chosen).
    pub fn tuning(&self) -> Option<Tuning> {
        self.tuning
    }

    fn tuning_for(&mut self, gpu: &Gpu) -> Tuning {
        *self.tuning.get_or_insert_with(|| Tuning::for_device(gpu))
    }

    /// Pairs per tile of the grouped expert matmul (the batch shape's tokens per thread):
    /// what the grouping kernel cuts each expert's slots into.
    pub fn group_tile(&mut self, gpu: &Gpu) -> u32 {
        self.tuning_for(gpu).tiled.nt
    }

    /// Pipelines compiled so far.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    fn get(
        &mut self,
        gpu: &Gpu,
        ty: GgmlType,
        kind: Kind,
        aligned: bool,
    ) -> Result<wgpu::ComputePipeline, VulkanError> {
        if let Some(p) = self.cache.get(&(ty, kind, aligned)) {
            return Ok(p.clone());
        }
        let info = wgsl::info(ty).ok_or_else(|| VulkanError::Kernel {
            name: format!("{ty}"),
            reason: "no kernel for this type".into(),
        })?;
        let (name, src) = match kind {
            Kind::Mat(sh, xvec4) => (
                format!(
                    "matmul_{ty}_t{}r{}n{}{}",
                    sh.tpr,
                    sh.rpt,
                    sh.nt,
                    if xvec4 { "_x4" } else { "" }
                ),
                wgsl::matmul(&info, aligned, xvec4, sh, Ids::None),
            ),
            Kind::MatId(sh, xvec4) => (
                format!(
                    "matmul_id_{ty}_t{}r{}{}",
                    sh.tpr,
                    sh.rpt,
                    if xvec4 { "_x4" } else { "" }
                ),
                wgsl::matmul(&info, aligned, xvec4, sh, Ids::PerPair),
            ),
            Kind::MatGrouped(sh, xvec4) => (
                format!(
                    "matmul_grouped_{ty}_t{}r{}n{}{}",
                    sh.tpr,
                    sh.rpt,
                    sh.nt,
                    if xvec4 { "_x4" } else { "" }
                ),
                wgsl::matmul(&info, aligned, xvec4, sh, Ids::Grouped),
            ),
            Kind::Embed => (format!("embed_{ty}"), wgsl::embed(&info, aligned)),
        };
        let name = if aligned {
            name
        } else {
            format!("{name}_unaligned")
        };
        let p = gpu.kernel(&name, &src, "main")?;
        self.cache.insert((ty, kind, aligned), p.clone());
        Ok(p)
    }
}

/// The WGSL of a kernel (for inspection): the matmul in `shape`, or the embedding lookup for
/// `None`.
pub fn source(ty: GgmlType, shape: Option<Shape>, aligned: bool, xvec4: bool) -> Option<String> {
    let info = wgsl::info(ty)?;
    Some(match shape {
        Some(sh) => wgsl::matmul(&info, aligned, xvec4, sh, Ids::None),
        None => wgsl::embed(&info, aligned),
    })
}

/// Rows `row0..row0 + rows` of a [`DeviceMatrix`] in one buffer.
pub struct Chunk {
    pub buffer: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
}

/// A weight matrix on the device, in its file type: rows split into chunks so that each
/// chunk's buffer fits the device's largest storage binding.
pub struct DeviceMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub chunks: Vec<Chunk>,
}

/// Bytes of padding after each chunk's rows: the unaligned word reader may touch the word
/// after the last byte.
const PAD: usize = 4;

/// Workgroups `(x, y)` covering `groups` (`x * y >= groups`, both at most `max`).
fn grid(groups: u32, max: u32) -> (u32, u32) {
    let max = max.max(1);
    if groups <= max {
        (groups, 1)
    } else {
        let y = groups.div_ceil(max);
        (groups.div_ceil(y), y)
    }
}

fn u32_of(what: &str, v: usize) -> Result<u32, VulkanError> {
    u32::try_from(v).map_err(|_| VulkanError::Unsupported(format!("{what} ({v}) exceeds 2^32")))
}

impl DeviceMatrix {
    /// Upload `rows` rows of `cols` values of type `ty` (`bytes`, ggml layout) once. Each
    /// chunk's buffer holds at most `max_binding` bytes (also capped by the device's limits).
    /// Fails with [`VulkanError::UnsupportedType`] for a type not in [`TYPES`].
    pub fn upload(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        max_binding: u64,
    ) -> Result<DeviceMatrix, VulkanError> {
        let bad = |why: String| VulkanError::Unsupported(format!("tensor `{name}`: {why}"));
        if !supported(ty) {
            return Err(VulkanError::UnsupportedType {
                tensor: name.to_string(),
                ty,
            });
        }
        let row_bytes = ty
            .row_size(cols as u64)
            .map_err(|e| bad(e.to_string()))
            .and_then(|b| usize::try_from(b).map_err(|e| bad(e.to_string())))?;
        let total = rows
            .checked_mul(row_bytes)
            .ok_or_else(|| bad(format!("{rows} rows of {row_bytes} bytes overflow")))?;
        if bytes.len() != total {
            return Err(bad(format!(
                "{} bytes for {rows} rows of {cols} {ty} values ({total} bytes)",
                bytes.len()
            )));
        }
        u32_of("columns", cols)?;
        u32_of("row bytes", row_bytes)?;
        u32_of("rows", rows)?;
        let limit = binding_limit(gpu, max_binding);
        // A chunk of r rows takes (r * row_bytes + PAD) rounded up to 4 bytes.
        let per_chunk = limit.saturating_sub(PAD + 3) / row_bytes.max(1);
        if per_chunk == 0 && rows > 0 {
            return Err(bad(format!(
                "a row of {row_bytes} bytes does not fit the device's largest storage binding \
                 ({limit} bytes)"
            )));
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = per_chunk.min(rows - row0);
            let part = &bytes[row0 * row_bytes..(row0 + n) * row_bytes];
            let what = if rows > n || row0 > 0 {
                format!("weights {name} rows {row0}..{}", row0 + n)
            } else {
                format!("weights {name}")
            };
            let buffer = gpu.storage(&what, (part.len() + PAD) as u64)?;
            let whole = part.len() / 4 * 4;
            if whole > 0 {
                gpu.queue.write_buffer(&buffer, 0, &part[..whole]);
            }
            if whole < part.len() {
                let mut tail = [0u8; 4];
                tail[..part.len() - whole].copy_from_slice(&part[whole..]);
                gpu.queue.write_buffer(&buffer, whole as u64, &tail);
            }
            chunks.push(Chunk {
                buffer,
                row0,
                rows: n,
            });
            row0 += n;
        }
        Ok(DeviceMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            chunks,
        })
    }

    /// Device bytes held by the chunks' buffers.
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buffer.size()).sum()
    }

    fn aligned(&self) -> bool {
        wgsl::info(self.ty).is_some_and(|i| i.aligned(self.row_bytes as u32))
    }

    /// Bind once to fixed activation buffers: `x` holds rows of `x_stride` floats (token `t`
    /// at `t * x_stride`), `y` rows of `y_stride` floats; chunk results land at columns
    /// `y_col0 + row0..`. `n_sel` picks the step's token count: 0 `n_tok`, else `n_out`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_matmul(
        &self,
        gpu: &Gpu,
        k: &mut QuantKernels,
        x: &wgpu::Buffer,
        x_stride: u32,
        y: &wgpu::Buffer,
        y_stride: u32,
        y_col0: u32,
        step: &wgpu::Buffer,
        n_sel: u32,
    ) -> Result<BoundMatmul, VulkanError> {
        let aligned = self.aligned();
        let tuning = k.tuning_for(gpu);
        let xvec4 = x_stride.is_multiple_of(4);
        let rows = self.rows as u32;
        let shapes = [tuning.decode, tuning.small, tuning.tiled]
            .map(|sh| sh.spread(rows, tuning.min_groups));
        let mut pipelines = Vec::with_capacity(3);
        for sh in shapes {
            pipelines.push(k.get(gpu, self.ty, Kind::Mat(sh, xvec4), aligned)?);
        }
        let mut chunks = Vec::with_capacity(self.chunks.len());
        for c in &self.chunks {
            let params = MatParams {
                rows: c.rows as u32,
                cols: self.cols as u32,
                row_bytes: self.row_bytes as u32,
                x_stride,
                y_stride,
                y_col0: y_col0 + c.row0 as u32,
                n_sel,
                _pad: 0,
            };
            let uniform = gpu.uniform("matmul params", bytemuck::bytes_of(&params))?;
            let bufs: [&wgpu::Buffer; 5] = [&c.buffer, x, y, &uniform, step];
            chunks.push(BoundChunk {
                rows: c.rows as u32,
                groups: [
                    gpu.bind(&pipelines[0], &bufs),
                    gpu.bind(&pipelines[1], &bufs),
                    gpu.bind(&pipelines[2], &bufs),
                ],
                _uniform: uniform,
            });
        }
        Ok(BoundMatmul {
            shapes,
            vector_max: tuning.vector_max,
            pipelines,
            chunks,
            max_groups: gpu.limits.max_compute_workgroups_per_dimension,
        })
    }

    /// Embedding lookup: for `t < step.n_tok`, `x[t * cols + j] = W[tokens[t], j] * scale`.
    /// `tokens` holds u32 ids already checked to be `< rows`; each chunk writes the tokens in
    /// its row range.
    pub fn bind_embed(
        &self,
        gpu: &Gpu,
        k: &mut QuantKernels,
        tokens: &wgpu::Buffer,
        x: &wgpu::Buffer,
        scale: f32,
        step: &wgpu::Buffer,
    ) -> Result<BoundEmbed, VulkanError> {
        let pipeline = k.get(gpu, self.ty, Kind::Embed, self.aligned())?;
        let mut groups = Vec::with_capacity(self.chunks.len());
        let mut uniforms = Vec::with_capacity(self.chunks.len());
        for c in &self.chunks {
            let params = EmbParams {
                rows: c.rows as u32,
                cols: self.cols as u32,
                row_bytes: self.row_bytes as u32,
                row0: c.row0 as u32,
                scale,
                _pad: [0; 3],
            };
            let uniform = gpu.uniform("embedding params", bytemuck::bytes_of(&params))?;
            groups.push(gpu.bind(&pipeline, &[&c.buffer, tokens, x, &uniform, step]));
            uniforms.push(uniform);
        }
        Ok(BoundEmbed {
            pipeline,
            groups,
            _uniforms: uniforms,
            max_groups: gpu.limits.max_compute_workgroups_per_dimension,
        })
    }
}

/// One matrix role (gate, up or down) of every expert of a layer on the device: the experts'
/// matrices stacked in expert order, each chunk holding whole experts, so that a kernel
/// addresses expert `e`'s matrix from an id it reads on the device ([`bind_matmul_id`]).
///
/// [`bind_matmul_id`]: DeviceExperts::bind_matmul_id
pub struct DeviceExperts {
    pub ty: GgmlType,
    /// Experts in the stack.
    pub experts: usize,
    /// Rows and columns of one expert's matrix.
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Each chunk's first expert and its buffer (rows `0..experts_in_chunk * rows`).
    pub chunks: Vec<(usize, usize, wgpu::Buffer)>,
}

impl DeviceExperts {
    /// Upload the matrices `mats` (one per expert: the same type and shape, bytes in ggml
    /// layout) as one stack, chunked by whole experts within `max_binding` bytes.
    pub fn upload(
        gpu: &Gpu,
        name: &str,
        mats: &[(&str, GgmlType, usize, usize, &[u8])],
        max_binding: u64,
    ) -> Result<DeviceExperts, VulkanError> {
        let &(first, ty, rows, cols, _) = mats.first().ok_or_else(|| {
            VulkanError::Unsupported(format!("`{name}`: a mixture of experts without experts"))
        })?;
        let bad = |t: &str, why: String| VulkanError::Unsupported(format!("tensor `{t}`: {why}"));
        if !supported(ty) {
            return Err(VulkanError::UnsupportedType {
                tensor: first.to_string(),
                ty,
            });
        }
        let row_bytes = ty
            .row_size(cols as u64)
            .map_err(|e| bad(first, e.to_string()))
            .and_then(|b| usize::try_from(b).map_err(|e| bad(first, e.to_string())))?;
        let per_expert = rows
            .checked_mul(row_bytes)
            .ok_or_else(|| bad(first, format!("{rows} rows of {row_bytes} bytes overflow")))?;
        for &(t, ty2, r2, c2, bytes) in mats {
            if (ty2, r2, c2) != (ty, rows, cols) {
                return Err(bad(
                    t,
                    format!(
                        "a {r2}x{c2} {ty2} expert next to `{first}`, {rows}x{cols} {ty}: the \
                         Vulkan backend stacks a layer's experts and needs one type and shape"
                    ),
                ));
            }
            if bytes.len() != per_expert {
                return Err(bad(
                    t,
                    format!(
                        "{} bytes for {rows} rows of {cols} {ty} values ({per_expert} bytes)",
                        bytes.len()
                    ),
                ));
            }
        }
        u32_of("columns", cols)?;
        u32_of("row bytes", row_bytes)?;
        u32_of("rows", rows)?;
        let limit = binding_limit(gpu, max_binding);
        let per_chunk = limit.saturating_sub(PAD + 3) / per_expert.max(1);
        if per_chunk == 0 {
            return Err(bad(
                first,
                format!(
                    "one expert's matrix of {per_expert} bytes does not fit the device's largest \
                     storage binding ({limit} bytes)"
                ),
            ));
        }
        let mut chunks = Vec::new();
        let mut e0 = 0;
        while e0 < mats.len() {
            let n = per_chunk.min(mats.len() - e0);
            let size = n * per_expert;
            let what = format!("experts {name} {e0}..{}", e0 + n);
            let buffer = gpu.storage(&what, (size + PAD).next_multiple_of(4) as u64)?;
            let mut part = Vec::with_capacity(size.next_multiple_of(4));
            for m in &mats[e0..e0 + n] {
                part.extend_from_slice(m.4);
            }
            part.resize(size.next_multiple_of(4), 0);
            gpu.queue.write_buffer(&buffer, 0, &part);
            chunks.push((e0, n, buffer));
            e0 += n;
        }
        Ok(DeviceExperts {
            ty,
            experts: mats.len(),
            rows,
            cols,
            row_bytes,
            chunks,
        })
    }

    /// Device bytes held by the chunks' buffers.
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.2.size()).sum()
    }

    /// Bind once: for the step's `n_tok * k` (token, slot) pairs `p`, `y[p * y_stride + r] =
    /// sum_c W_ids[p][r, c] * x[(p / x_div) * x_stride + c]`, `ids` holding each pair's
    /// expert (below `experts`).
    ///
    /// With `grouping` (`perm`, `tiles`: the pairs grouped by expert, see
    /// [`BoundMatmulId::record_grouped`]) the grouped form is bound too.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_matmul_id(
        &self,
        gpu: &Gpu,
        q: &mut QuantKernels,
        x: &wgpu::Buffer,
        x_stride: u32,
        x_div: u32,
        y: &wgpu::Buffer,
        y_stride: u32,
        ids: &wgpu::Buffer,
        k: u32,
        step: &wgpu::Buffer,
        grouping: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
    ) -> Result<BoundMatmulId, VulkanError> {
        let aligned = wgsl::info(self.ty).is_some_and(|i| i.aligned(self.row_bytes as u32));
        let tuning = q.tuning_for(gpu);
        let xvec4 = x_stride.is_multiple_of(4);
        // One pair per thread (each pair has its own expert): the decode shape.
        let shape = Shape {
            nt: 1,
            ..tuning.decode
        }
        .spread(self.rows as u32, tuning.min_groups);
        let pipeline = q.get(gpu, self.ty, Kind::MatId(shape, xvec4), aligned)?;
        let mut chunks = Vec::with_capacity(self.chunks.len());
        for (e0, ne, buffer) in &self.chunks {
            let params = MatIdParams {
                mat: MatParams {
                    rows: self.rows as u32,
                    cols: self.cols as u32,
                    row_bytes: self.row_bytes as u32,
                    x_stride,
                    y_stride,
                    y_col0: 0,
                    n_sel: 0,
                    _pad: 0,
                },
                k,
                x_div,
                e0: *e0 as u32,
                ne: *ne as u32,
            };
            let uniform = gpu.uniform("expert matmul params", bytemuck::bytes_of(&params))?;
            let group = gpu.bind(&pipeline, &[buffer, x, y, &uniform, step, ids]);
            chunks.push((group, uniform));
        }
        let grouped = match grouping {
            None => None,
            Some((perm, tiles)) => {
                // Each dequantised weight serves a tile's pairs: the batch shape.
                let shape = tuning.tiled.spread(self.rows as u32, tuning.min_groups);
                let pipeline = q.get(gpu, self.ty, Kind::MatGrouped(shape, xvec4), aligned)?;
                let groups = self
                    .chunks
                    .iter()
                    .zip(&chunks)
                    .map(|((_, _, buffer), (_, uniform))| {
                        gpu.bind(&pipeline, &[buffer, x, y, uniform, step, perm, tiles])
                    })
                    .collect();
                Some(GroupedId {
                    shape,
                    pipeline,
                    groups,
                })
            }
        };
        Ok(BoundMatmulId {
            shape,
            rows: self.rows as u32,
            k,
            experts: self.experts as u32,
            pipeline,
            chunks,
            grouped,
            max_groups: gpu.limits.max_compute_workgroups_per_dimension,
        })
    }
}

/// The most tiles `pairs` (token, slot) pairs make over `experts` experts when each expert's
/// pairs are cut into tiles of `tile`: `sum_e ceil(c_e / tile)` with `sum_e c_e = pairs`,
/// at most `(pairs + (tile - 1) m) / tile` for the `m <= min(experts, pairs)` experts with
/// pairs.
pub fn max_tiles(pairs: u32, experts: u32, tile: u32) -> u32 {
    let tile = tile.max(1) as u64;
    let m = experts.min(pairs) as u64;
    ((pairs as u64 + (tile - 1) * m) / tile).min(u32::MAX as u64) as u32
}

/// The grouped form of a [`BoundMatmulId`].
struct GroupedId {
    shape: Shape,
    pipeline: wgpu::ComputePipeline,
    /// Per chunk (the per-pair form's uniforms).
    groups: Vec<wgpu::BindGroup>,
}

/// An expert matmul bound to its buffers; see [`DeviceExperts::bind_matmul_id`].
pub struct BoundMatmulId {
    shape: Shape,
    rows: u32,
    k: u32,
    experts: u32,
    pipeline: wgpu::ComputePipeline,
    chunks: Vec<(wgpu::BindGroup, wgpu::Buffer)>,
    grouped: Option<GroupedId>,
    max_groups: u32,
}

impl BoundMatmulId {
    /// Records the dispatches for `n_tok` tokens (the step uniform's `n_tok`): one workgroup
    /// layer per (token, slot) pair and chunk; a pair whose expert another chunk holds
    /// returns at once.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        let pairs = n_tok * self.k;
        if pairs == 0 {
            return;
        }
        let (gx, gy) = grid(
            self.rows.div_ceil(self.shape.rows_per_group()),
            self.max_groups,
        );
        pass.set_pipeline(&self.pipeline);
        for (g, _) in &self.chunks {
            pass.set_bind_group(0, g, &[]);
            pass.dispatch_workgroups(gx, gy, pairs);
        }
    }

    /// Whether the grouped form can record `n_tok` tokens: it was bound and the step's most
    /// tiles ([`max_tiles`]) fit one dispatch dimension.
    pub fn can_group(&self, n_tok: u32) -> bool {
        self.grouped.as_ref().is_some_and(|g| {
            max_tiles(n_tok.saturating_mul(self.k), self.experts, g.shape.nt) <= self.max_groups
        })
    }

    /// Records the grouped form for `n_tok` tokens: one workgroup layer per tile of the
    /// step's tile list, as many layers as the step can have tiles ([`max_tiles`]; layers past
    /// the list's end do nothing), per chunk. The grouping kernel must have written `perm`
    /// and `tiles` for this step first. Falls back to [`record`](Self::record) where
    /// [`can_group`](Self::can_group) says no.
    pub fn record_grouped(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        let pairs = n_tok * self.k;
        if pairs == 0 {
            return;
        }
        let Some(g) = self.grouped.as_ref().filter(|_| self.can_group(n_tok)) else {
            return self.record(pass, n_tok);
        };
        let tiles = max_tiles(pairs, self.experts, g.shape.nt);
        let (gx, gy) = grid(
            self.rows.div_ceil(g.shape.rows_per_group()),
            self.max_groups,
        );
        pass.set_pipeline(&g.pipeline);
        for b in &g.groups {
            pass.set_bind_group(0, b, &[]);
            pass.dispatch_workgroups(gx, gy, tiles);
        }
    }
}

struct BoundChunk {
    rows: u32,
    /// Bind groups of the decode, small and tiled pipelines.
    groups: [wgpu::BindGroup; 3],
    _uniform: wgpu::Buffer,
}

/// A matmul bound to its activation buffers; see [`DeviceMatrix::bind_matmul`].
pub struct BoundMatmul {
    shapes: [Shape; 3],
    vector_max: u32,
    pipelines: Vec<wgpu::ComputePipeline>,
    chunks: Vec<BoundChunk>,
    max_groups: u32,
}

impl BoundMatmul {
    /// Records the dispatches for `n` tokens (the step uniform must say `n` too): the
    /// matrix-vector shapes for `n <=` [`Tuning::vector_max`], the batch shape above.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n: u32) {
        let form = if n <= self.vector_max {
            Form::Vector
        } else {
            Form::Tiled
        };
        self.record_form(pass, n, form);
    }

    /// Records `n` tokens with the given form (any `n`: for tests and measurements).
    pub fn record_form(&self, pass: &mut wgpu::ComputePass<'_>, n: u32, form: Form) {
        if n == 0 {
            return;
        }
        let i = match form {
            Form::Vector if n == 1 => 0,
            Form::Vector => 1,
            Form::Tiled => 2,
        };
        let shape = self.shapes[i];
        pass.set_pipeline(&self.pipelines[i]);
        for c in &self.chunks {
            let (gx, gy) = grid(c.rows.div_ceil(shape.rows_per_group()), self.max_groups);
            if gx == 0 {
                continue;
            }
            pass.set_bind_group(0, &c.groups[i], &[]);
            pass.dispatch_workgroups(gx, gy, n.div_ceil(shape.nt));
        }
    }
}

/// An embedding lookup bound to its buffers; see [`DeviceMatrix::bind_embed`].
pub struct BoundEmbed {
    pipeline: wgpu::ComputePipeline,
    groups: Vec<wgpu::BindGroup>,
    _uniforms: Vec<wgpu::Buffer>,
    max_groups: u32,
}

impl BoundEmbed {
    /// Records the lookup of `n_tok` tokens (the step uniform's `n_tok`).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        if n_tok == 0 {
            return;
        }
        let (gx, gy) = grid(n_tok, self.max_groups);
        pass.set_pipeline(&self.pipeline);
        for g in &self.groups {
            pass.set_bind_group(0, g, &[]);
            pass.dispatch_workgroups(gx, gy, 1);
        }
    }
}

/// The most bytes one weight binding may hold: `max_binding`, the device's storage-binding
/// and buffer limits, and u32 (byte offsets inside a chunk are u32 in the kernels).
fn binding_limit(gpu: &Gpu, max_binding: u64) -> usize {
    max_binding
        .min(gpu.limits.max_storage_buffer_binding_size)
        .min(gpu.limits.max_buffer_size)
        .min(u32::MAX as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_folds_past_the_limit() {
        assert_eq!(grid(10, 65535), (10, 1));
        assert_eq!(grid(65535, 65535), (65535, 1));
        let (x, y) = grid(65536, 65535);
        assert!(x <= 65535 && y <= 65535 && x * y >= 65536, "{x} {y}");
        let (x, y) = grid(1 << 20, 2000);
        assert!(x <= 2000 && y <= 2000 && x as u64 * y as u64 >= 1 << 20);
    }

    #[test]
    fn shapes_spread_to_enough_workgroups() {
        for t in [Tuning::CPU, Tuning::GPU] {
            for sh in [t.decode, t.small, t.tiled] {
                assert!(sh.valid(), "{sh:?}");
                assert_eq!(sh.spread(1 << 20, t.min_groups), sh);
                for rows in [1, 3, 17, 192, 576, 1536, 4096] {
                    let s = sh.spread(rows, t.min_groups);
                    assert!(s.valid(), "{sh:?} {rows}: {s:?}");
                    assert!(
                        rows.div_ceil(s.rows_per_group()) >= t.min_groups || s.tpr == 64,
                        "{sh:?} {rows}: {s:?}"
                    );
                }
            }
        }
        let big = Shape {
            tpr: 1,
            rpt: 16,
            nt: 8,
        };
        // 128 accumulators do not fit the reduction: rows per thread halve first.
        assert_eq!(
            big.spread(4096, 8),
            Shape {
                tpr: 1,
                rpt: 8,
                nt: 8
            }
        );
        assert_eq!(
            big.spread(200, 8),
            Shape {
                tpr: 32,
                rpt: 8,
                nt: 8
            }
        );
        assert!(!Shape {
            tpr: 2,
            rpt: 16,
            nt: 8
        }
        .valid());
    }

    #[test]
    fn max_tiles_bounds_every_split() {
        // Exhaustively for small cases: every way to spread `pairs` over `experts`.
        fn splits(pairs: u32, experts: u32, out: &mut Vec<Vec<u32>>, cur: &mut Vec<u32>) {
            if experts == 1 {
                cur.push(pairs);
                out.push(cur.clone());
                cur.pop();
                return;
            }
            for c in 0..=pairs {
                cur.push(c);
                splits(pairs - c, experts - 1, out, cur);
                cur.pop();
            }
        }
        for experts in 1..5 {
            for pairs in 0..13 {
                for tile in 1..6 {
                    let mut all = Vec::new();
                    splits(pairs, experts, &mut all, &mut Vec::new());
                    let worst = all
                        .iter()
                        .map(|s| s.iter().map(|c| c.div_ceil(tile)).sum::<u32>())
                        .max()
                        .unwrap();
                    assert!(
                        worst <= max_tiles(pairs, experts, tile),
                        "{pairs} pairs, {experts} experts, tile {tile}: {worst} tiles"
                    );
                }
            }
        }
        assert_eq!(max_tiles(46, 8, 8), 12);
        assert_eq!(max_tiles(0, 8, 8), 0);
    }

    #[test]
    fn every_type_has_a_snippet() {
        for ty in TYPES {
            let i = wgsl::info(ty).unwrap();
            assert_eq!(i.block as u64 % 32, 0);
            if !i.float {
                assert_eq!(i.block as u64, ty.block_size());
                assert_eq!(i.bsize as u64, ty.type_size());
            }
        }
        assert!(wgsl::info(GgmlType::Q2K).is_none());
    }
}
