//! The [`flowrt_dispatch::Backend`] over a Vulkan device.
//!
//! At creation every weight is uploaded, every activation buffer and the KV cache are
//! allocated, and every op of the plan gets its kernel and bind group, so a step only writes
//! the batch's tokens, positions and logit rows, records the runlist's dispatches into one
//! command buffer and submits it.
//!
//! # Mixtures of experts
//!
//! A sparse layer's experts are stacked per role (gate, up, down) in chunks of whole experts
//! ([`DeviceExperts`]), in their file types. The router is a plain matmul into `Router`; the
//! `moe_route` kernel writes each token's top-k expert ids and weights (as the CPU's `route`:
//! ties to the lower index) into device buffers; the expert matmuls run over the batch's
//! (token, slot) pairs in one of two forms, chosen per step by its token count
//! ([`MoeGrouping`]):
//!
//! - per pair (`matmul_id`; decode and small batches): each pair reads its expert id and only
//!   that expert's rows, so an expert chosen by `m` pairs is read `m` times;
//! - grouped by expert (batches where the average expert gets at least half a tile of
//!   pairs): `moe_group`, one workgroup, counts each expert's pairs, writes their offsets,
//!   the pairs expert-major (tokens ascending) and a tile list (expert, first pair, end),
//!   each tile at most `nt` pairs (the batch shape's tokens per thread); then
//!   `matmul_grouped` runs one workgroup layer per tile, as many as the step can have (a
//!   static bound from its token count; layers past the list's end do nothing), so each
//!   dequantised weight serves every pair of the tile and an expert's weights are read
//!   `ceil(m / nt)` times. Each pair's sum is the same as per pair up to summation order.
//!
//! Then the activation (SiLU, GELU-tanh or the clamped SwiGLU), per-expert biases where the
//! family has them, and `moe_combine`, the weighted sum in expert order, all over the pairs
//! in their (token, slot) order. Nothing is read back mid-step. Routers are softmax,
//! top-k softmax or sigmoid, optionally choosing by score plus a per-expert selection bias,
//! renormalised with an epsilon and scaled (LFM2-MoE), as the CPU's `route`.
//!
//! # Short convolutions
//!
//! A hybrid model's convolution layer (LFM2) keeps `B · x` of every position of every
//! sequence in its cache slot (`[seq][position][hidden]`, f16 or f32 as the KV cache; no V),
//! as the CPU does: `conv_store` writes the batch's rows, then `short_conv` reads the last
//! `kernel` positions of each row's own sequence, so batching and prefix reuse need no state
//! snapshots.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_dispatch::{
    Backend, BackendInfo, BackendSettings, Batch, BatchError, DeviceError, DeviceRates,
    KvPrecision, LogitsWanted, ProbeError, Runlist, Trace,
};
use flowrt_model::plan::{Buf, GroupKind, MatRole, NormWeight, Op};
use flowrt_model::{Activation, Model, Plan, RopePairing, RouterScoring, WeightMatrix};

use crate::error::VulkanError;
use crate::gpu::{Gpu, WaitError};
use crate::ops;
use crate::quant::{
    BoundEmbed, BoundMatmul, BoundMatmulId, DeviceExperts, DeviceMatrix, QuantKernels, StepParams,
};

/// Layers per runlist by default: a bounded submission, so that no single command buffer
/// holds the whole model (what a desktop driver's watchdog or an NPU's command timeout
/// punishes).
pub const DEFAULT_RUNLIST_LAYERS: usize = 8;

/// How long `cancel` waits for work a missed deadline left on the queue before it gives the
/// device up.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// Which token count a kernel runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Over {
    /// Every token of the batch.
    Tokens,
    /// The rows whose logits were asked for.
    Logits,
}

/// One recorded dispatch.
enum Cmd {
    /// An element-wise kernel over `n × per` items.
    Ew {
        pipe: usize,
        bind: wgpu::BindGroup,
        per: u32,
        over: Over,
    },
    /// A row kernel over `n × rows` rows (one workgroup each).
    Rows {
        pipe: usize,
        bind: wgpu::BindGroup,
        rows: u32,
    },
    /// Attention: one workgroup per (query head, token).
    Attention {
        pipe: usize,
        bind: wgpu::BindGroup,
        heads: u32,
    },
    Matmul(BoundMatmul, Over),
    /// An expert matmul over the batch's (token, slot) pairs.
    MatmulId(BoundMatmulId),
    /// The grouping of the batch's pairs by expert (one workgroup), recorded only for steps
    /// that run the grouped expert matmuls.
    MoeGroup(wgpu::BindGroup),
    Embed(BoundEmbed),
}

/// Kernels other than the weight readers, by index into `VulkanBackend::pipes`.
const P_RMS: usize = 0;
const P_RMS_INPLACE: usize = 1;
const P_ROPE: usize = 2;
const P_STORE_KV: usize = 3;
const P_ATTENTION: usize = 4;
const P_GATED: usize = 5;
const P_RESIDUAL: usize = 6;
const P_BIAS: usize = 7;
const P_GATHER: usize = 8;
const P_SCALE_LOGITS: usize = 9;
const P_MOE_ROUTE: usize = 10;
const P_MOE_COMBINE: usize = 11;
const P_MOE_BIAS: usize = 12;
const P_CONV_STORE: usize = 13;
const P_SHORT_CONV: usize = 14;
const P_MOE_GROUP: usize = 15;

/// Which form a step's expert matmuls take (the backend setting `moe-grouping`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeGrouping {
    /// Grouped by expert for batches of at least [`VulkanBackend::group_min_tokens`] tokens
    /// (where the average expert gets half a tile of pairs), each (token, slot) pair on its
    /// own below (decode, small batches).
    Auto,
    /// Grouped by expert for every step (tests, measurements).
    Grouped,
    /// Each (token, slot) pair on its own for every step (tests, measurements).
    PerSlot,
}

impl MoeGrouping {
    fn parse(v: &str) -> Result<Self, VulkanError> {
        match v {
            "auto" => Ok(Self::Auto),
            "grouped" => Ok(Self::Grouped),
            "per-slot" => Ok(Self::PerSlot),
            _ => Err(VulkanError::Unsupported(format!(
                "moe-grouping `{v}` (it takes auto, grouped or per-slot)"
            ))),
        }
    }
}

struct Pending {
    index: wgpu::SubmissionIndex,
    groups: Range<usize>,
    /// Rows of logits the submission copies out (0: none).
    logit_rows: usize,
}

/// The Vulkan backend for one model instance (its KV cache holds `n_seq` sequences).
pub struct VulkanBackend {
    model: Arc<Model>,
    gpu: Gpu,
    pipes: Vec<wgpu::ComputePipeline>,
    /// Per plan group, the dispatches of its ops.
    cmds: Vec<Vec<Cmd>>,
    n_groups: usize,
    tokens_buf: wgpu::Buffer,
    rows_buf: wgpu::Buffer,
    out_rows_buf: wgpu::Buffer,
    step_buf: wgpu::Buffer,
    logits_buf: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// The activation buffers, indexed by `Buf as usize` (also in `_keep`): `flowrt diff`
    /// reads and writes them between runlists.
    acts: Vec<wgpu::Buffer>,
    /// Host copies of a step's inputs (allocated once).
    rows: Vec<u32>,
    out_rows: Vec<u32>,
    logits: Vec<f32>,
    n_logit_rows: usize,
    pending: Option<Pending>,
    /// A submission whose deadline passed, still on the queue.
    stale: Option<wgpu::SubmissionIndex>,
    /// Why the device cannot run more work, once it cannot.
    broken: Option<String>,
    n_ctx: usize,
    n_seq: usize,
    max_batch: usize,
    weight_bytes: u64,
    kv_bytes: u64,
    /// Kept alive for the bind groups (weights, caches, activations, tables, uniforms).
    _keep: Vec<wgpu::Buffer>,
    _mats: Vec<DeviceMatrix>,
    _experts: Vec<DeviceExperts>,
    moe_grouping: MoeGrouping,
    /// Under [`MoeGrouping::Auto`], the fewest tokens a step groups its expert matmuls for.
    group_min_tokens: u32,
}

/// A sparse layer's router and experts on the device.
struct LayerExperts {
    router: DeviceMatrix,
    /// The router's selection bias (one value per expert), where it has one.
    selection_bias: Option<wgpu::Buffer>,
    gate_bias: Option<wgpu::Buffer>,
    up_bias: Option<wgpu::Buffer>,
    down_bias: Option<wgpu::Buffer>,
    gate: DeviceExperts,
    up: DeviceExperts,
    down: DeviceExperts,
}

/// A mixture of experts' per-step scratch (see `VulkanBackend::new`).
struct MoeBufs {
    ids: wgpu::Buffer,
    wts: wgpu::Buffer,
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    out: wgpu::Buffer,
    /// The grouping by expert (`ops::moe_group`): counts and offsets, the pairs in expert
    /// order, the tile list.
    cnt: wgpu::Buffer,
    perm: wgpu::Buffer,
    tiles: wgpu::Buffer,
}

/// Activation buffers, indexed by `Buf as usize`, plus the gathered logit rows.
struct Acts {
    bufs: Vec<wgpu::Buffer>,
    gathered: wgpu::Buffer,
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl VulkanBackend {
    /// Open the device `settings.device` names (or the default one), upload the weights and
    /// allocate the KV cache and activations.
    pub fn new(model: Arc<Model>, settings: &BackendSettings) -> Result<Self, VulkanError> {
        settings
            .check_options("vulkan", &["moe-grouping"])
            .map_err(VulkanError::Unsupported)?;
        let moe_grouping = match settings.option("moe-grouping") {
            Some(v) => MoeGrouping::parse(v)?,
            None => MoeGrouping::Auto,
        };
        let c = &model.config;
        // Every matrix type first: a clear error before anything is uploaded (MXFP4 experts
        // are refused here, by tensor and type).
        let mut mats: Vec<&WeightMatrix> = vec![&model.token_embd];
        mats.extend(&model.output);
        for l in &model.layers {
            mats.extend(l.matrices());
        }
        for m in &mats {
            if !crate::quant::supported(m.dtype) {
                return Err(VulkanError::UnsupportedType {
                    tensor: m.name.clone(),
                    ty: m.dtype,
                });
            }
        }
        check_layers(&model, settings.kv == KvPrecision::F16)?;
        let missing = lacks(c);
        if !missing.is_empty() {
            return Err(VulkanError::Family {
                family: c.arch.name.to_string(),
                missing,
            });
        }
        if let Some(m) = &c.moe {
            if m.num_experts_per_tok == 0 || m.num_experts_per_tok > m.num_experts {
                return Err(VulkanError::Unsupported(format!(
                    "num_experts_per_tok {} of {} experts (the router picks 1 to num_experts)",
                    m.num_experts_per_tok, m.num_experts
                )));
            }
        }
        if c.head_dim > ops::MAX_HEAD_DIM || !c.head_dim.is_multiple_of(2) {
            return Err(VulkanError::Unsupported(format!(
                "head_dim {} (the Vulkan attention kernel takes even head sizes up to {})",
                c.head_dim,
                ops::MAX_HEAD_DIM
            )));
        }
        let gpu = Gpu::open(settings.device)?;
        let max_binding = gpu.limits.max_storage_buffer_binding_size;
        let n_ctx = settings.n_ctx.max(1);
        let n_seq = settings.n_seq.max(1);
        // Logits of every token of a batch must fit one binding.
        let logit_row_bytes = (c.vocab_size * 4) as u64;
        let max_logit_rows = (max_binding / logit_row_bytes).max(1) as usize;
        let mut max_batch = settings.max_batch.clamp(1, max_logit_rows);
        // A mixture of experts: (token, slot) pairs are one workgroup dimension, and each
        // pair's gate/up/down rows must fit one binding.
        let moe_dims = c.moe.as_ref().map(|m| {
            (
                m.num_experts_per_tok,
                m.moe_intermediate_size,
                m.num_experts,
            )
        });
        if let Some((k, ff, _)) = moe_dims {
            let pair_bytes = (k * ff.max(c.hidden_size) * 4) as u64;
            let by_binding = (max_binding / pair_bytes.max(1)).max(1) as usize;
            let by_dim = (gpu.limits.max_compute_workgroups_per_dimension as usize / k).max(1);
            max_batch = max_batch.min(by_binding).min(by_dim);
        }
        let f16_kv = settings.kv == KvPrecision::F16;
        let mut keep: Vec<wgpu::Buffer> = Vec::new();

        // Kernels.
        let pipes = vec![
            gpu.kernel("rms_norm", &ops::rms_norm(), "main")?,
            gpu.kernel("rms_norm_inplace", &ops::rms_norm_inplace(), "main")?,
            gpu.kernel("rope", &ops::rope(), "main")?,
            gpu.kernel("store_kv", &ops::store_kv(f16_kv), "main")?,
            gpu.kernel("attention", &ops::attention(f16_kv), "main")?,
            gpu.kernel("gated_act", &ops::gated_act(), "main")?,
            gpu.kernel("add_residual", &ops::add_residual(), "main")?,
            gpu.kernel("add_bias", &ops::add_bias(), "main")?,
            gpu.kernel("gather_rows", &ops::gather_rows(), "main")?,
            gpu.kernel("scale_logits", &ops::scale_logits(), "main")?,
            gpu.kernel("moe_route", &ops::moe_route(), "main")?,
            gpu.kernel("moe_combine", &ops::moe_combine(), "main")?,
            gpu.kernel("moe_bias", &ops::moe_bias(), "main")?,
            gpu.kernel("conv_store", &ops::conv_store(f16_kv), "main")?,
            gpu.kernel("short_conv", &ops::short_conv(f16_kv), "main")?,
            gpu.kernel("moe_group", &ops::moe_group(), "main")?,
        ];
        let mut qk = QuantKernels::new();
        let tile = qk.group_tile(&gpu);
        // The grouped form computes whole tiles, so it pays once the average expert has half
        // a tile of pairs; below, each pair on its own reads less (on lavapipe, 32 experts,
        // top-4, tiles of 8: grouped took 1.9x the time of per-pair at 8 tokens, 0.8x at 32,
        // 0.7x at 128).
        let group_min_tokens = moe_dims.map_or(2, |(k, _, ne)| {
            ((ne * tile as usize).div_ceil(2 * k) as u32).max(2)
        });

        // Per-step inputs.
        let tokens_buf = gpu.storage("tokens", (max_batch * 4) as u64)?;
        let rows_buf = gpu.storage("rows", (max_batch * 8) as u64)?;
        let out_rows_buf = gpu.storage("logit rows", (max_batch * 4) as u64)?;
        let step_buf = gpu.uniform(
            "step",
            bytemuck::bytes_of(&StepParams {
                n_tok: 0,
                n_out: 0,
                _pad: [0; 2],
            }),
        )?;

        // Activations.
        let mut bufs = Vec::with_capacity(Buf::ALL.len());
        for b in Buf::ALL {
            // At least 4 bytes: a buffer a model does not use (`Router` without experts) is
            // still bound.
            let bytes = ((max_batch * b.width(&model.config) * 4) as u64).max(4);
            bufs.push(gpu.storage(&format!("activations {b:?}"), bytes)?);
        }
        let acts = Acts {
            bufs,
            gathered: gpu.storage(
                "logit rows of the residual stream",
                (max_batch * c.hidden_size * 4) as u64,
            )?,
        };
        // A mixture of experts' scratch, shared by its layers: per (token, slot) pair the
        // chosen expert and its weight, the expert's gate and up rows and its output row.
        let moe_bufs = match moe_dims {
            Some((k, ff, ne)) => {
                let pairs = (max_batch * k) as u64;
                let tiles = crate::quant::max_tiles(pairs as u32, ne as u32, tile) as u64;
                Some(MoeBufs {
                    ids: gpu.storage("expert ids", pairs * 4)?,
                    wts: gpu.storage("expert weights", pairs * 4)?,
                    gate: gpu.storage("expert gate rows", pairs * ff as u64 * 4)?,
                    up: gpu.storage("expert up rows", pairs * ff as u64 * 4)?,
                    out: gpu.storage("expert output rows", pairs * c.hidden_size as u64 * 4)?,
                    cnt: gpu.storage("expert pair counts", 2 * ne as u64 * 4)?,
                    perm: gpu.storage("pairs by expert", pairs * 4)?,
                    tiles: gpu.storage("expert tiles", (1 + 3 * tiles) * 4)?,
                })
            }
            None => None,
        };
        let logits_buf = acts.bufs[Buf::Logits as usize].clone();
        let readback = gpu.readback("logits readback", (max_batch * c.vocab_size * 4) as u64)?;

        // KV cache: one K and one V buffer per attention layer. A short convolution layer
        // keeps `B · x` of every position instead (`hidden` values per position, laid out
        // `[seq][position][hidden]` as the CPU's cache) in its K slot, and no V.
        let kv_layer_bytes =
            (n_seq * c.num_key_value_heads * n_ctx * c.head_dim * settings.kv.bytes()) as u64;
        let conv_layer_bytes = (n_seq * n_ctx * c.hidden_size * settings.kv.bytes()) as u64;
        let is_conv = |l: usize| {
            c.short_conv
                .as_ref()
                .is_some_and(|sc| sc.conv_layers.get(l).copied().unwrap_or(false))
        };
        let mut kcache = Vec::with_capacity(c.num_hidden_layers);
        let mut vcache = Vec::with_capacity(c.num_hidden_layers);
        let mut kv_bytes = 0u64;
        for l in 0..c.num_hidden_layers {
            let (what, bytes) = if is_conv(l) {
                ("one convolution layer's cache", conv_layer_bytes)
            } else {
                ("one layer's KV cache", kv_layer_bytes)
            };
            if bytes > max_binding {
                return Err(VulkanError::OutOfMemory {
                    what: what.into(),
                    bytes,
                    reason: format!(
                        "larger than the device's largest binding, {max_binding} bytes; use a smaller --ctx-len or fewer parallel sequences"
                    ),
                });
            }
            if is_conv(l) {
                kcache.push(gpu.storage(&format!("convolution cache of layer {l}"), bytes)?);
                vcache.push(gpu.storage(&format!("no V cache (layer {l})"), 4)?);
                kv_bytes += bytes;
            } else {
                kcache.push(gpu.storage(&format!("K cache of layer {l}"), bytes)?);
                vcache.push(gpu.storage(&format!("V cache of layer {l}"), bytes)?);
                kv_bytes += 2 * bytes;
            }
        }

        // RoPE tables: cos then sin, (n_ctx, rope_dim / 2) each.
        let table = |rope: &flowrt_model::RopeConfig| -> Result<wgpu::Buffer, VulkanError> {
            let (mut cos, sin) = rope.cos_sin_table(c.rope_dim, n_ctx);
            cos.extend_from_slice(&sin);
            gpu.upload("RoPE table", f32_bytes(&cos))
        };
        let rope_global = table(&c.rope)?;
        let rope_local = match &c.rope_local {
            Some(r) => Some(table(r)?),
            None => None,
        };

        // Weights, uploaded once (tied embeddings once for both uses).
        let mut weight_bytes = 0u64;
        let mut up = |m: &WeightMatrix| -> Result<DeviceMatrix, VulkanError> {
            let d = DeviceMatrix::upload(
                &gpu,
                &m.name,
                m.dtype,
                m.rows,
                m.cols,
                m.bytes(),
                max_binding,
            )?;
            weight_bytes += d.bytes();
            Ok(d)
        };
        let embd = up(&model.token_embd)?;
        // `lacks` refused models without an output projection, a final norm or a gate.
        let absent = |what: &str| VulkanError::Unsupported(format!("the model has no {what}"));
        let output = if model.tied_embeddings {
            None
        } else {
            Some(up(model
                .output
                .as_ref()
                .ok_or_else(|| absent("output projection"))?)?)
        };
        let mut layer_mats = Vec::with_capacity(model.layers.len());
        let mut layer_experts: Vec<Option<LayerExperts>> = Vec::with_capacity(model.layers.len());
        let mut expert_bytes = 0u64;
        // Per layer, its dense matrices by role.
        for lw in &model.layers {
            let mut m: Vec<(MatRole, DeviceMatrix)> = match &lw.conv {
                Some(cw) => vec![
                    (MatRole::ConvIn, up(&cw.in_proj)?),
                    (MatRole::ConvOut, up(&cw.out_proj)?),
                ],
                None => vec![
                    (
                        MatRole::Q,
                        up(lw.wq.as_ref().ok_or_else(|| absent("query projection"))?)?,
                    ),
                    (
                        MatRole::K,
                        up(lw.wk.as_ref().ok_or_else(|| absent("key projection"))?)?,
                    ),
                    (
                        MatRole::V,
                        up(lw.wv.as_ref().ok_or_else(|| absent("value projection"))?)?,
                    ),
                    (
                        MatRole::O,
                        up(lw.wo.as_ref().ok_or_else(|| absent("attention output"))?)?,
                    ),
                ],
            };
            match &lw.moe {
                Some(moe) => {
                    let router = up(&moe.router)?;
                    let stack = |which: &str, ms: &[WeightMatrix]| {
                        let parts: Vec<_> = ms
                            .iter()
                            .map(|w| (w.name.as_str(), w.dtype, w.rows, w.cols, w.bytes()))
                            .collect();
                        DeviceExperts::upload(&gpu, which, &parts, max_binding)
                    };
                    let bias = |what: &str, v: &Option<Vec<f32>>| {
                        v.as_ref()
                            .map(|v| gpu.upload(what, f32_bytes(v)))
                            .transpose()
                    };
                    let ex = LayerExperts {
                        selection_bias: bias("expert selection biases", &moe.selection_bias)?,
                        gate_bias: bias("expert gate biases", &moe.gate_bias)?,
                        up_bias: bias("expert up biases", &moe.up_bias)?,
                        down_bias: bias("expert down biases", &moe.down_bias)?,
                        router,
                        gate: stack("gate", &moe.gate)?,
                        up: stack("up", &moe.up)?,
                        down: stack("down", &moe.down)?,
                    };
                    expert_bytes += ex.gate.bytes() + ex.up.bytes() + ex.down.bytes();
                    layer_experts.push(Some(ex));
                }
                None => {
                    m.push((
                        MatRole::Gate,
                        up(lw
                            .w_gate
                            .as_ref()
                            .ok_or_else(|| absent("feed-forward gate"))?)?,
                    ));
                    m.push((
                        MatRole::Up,
                        up(lw.w_up.as_ref().ok_or_else(|| absent("feed-forward up"))?)?,
                    ));
                    m.push((
                        MatRole::Down,
                        up(lw
                            .w_down
                            .as_ref()
                            .ok_or_else(|| absent("feed-forward down"))?)?,
                    ));
                    layer_experts.push(None);
                }
            }
            layer_mats.push(m);
        }
        weight_bytes += expert_bytes;
        let vec_buf = |what: &str, v: &[f32]| gpu.upload(what, f32_bytes(v));
        let mut norms = Vec::with_capacity(model.layers.len());
        for (l, lw) in model.layers.iter().enumerate() {
            let opt =
                |v: &Option<Vec<f32>>, what: &str| -> Result<Option<wgpu::Buffer>, VulkanError> {
                    v.as_ref()
                        .map(|v| vec_buf(&format!("{what} of layer {l}"), v))
                        .transpose()
                };
            norms.push(LayerVecs {
                attn_norm: vec_buf("attention norm", &lw.attn_norm)?,
                ffn_norm: vec_buf("feed-forward norm", &lw.ffn_norm)?,
                attn_post: opt(&lw.attn_post_norm, "attention output norm")?,
                ffn_post: opt(&lw.ffn_post_norm, "feed-forward output norm")?,
                q_norm: opt(&lw.q_norm, "Q norm")?,
                k_norm: opt(&lw.k_norm, "K norm")?,
            });
        }
        let output_norm = vec_buf(
            "output norm",
            model
                .output_norm
                .as_ref()
                .ok_or_else(|| absent("final norm"))?,
        )?;

        // Bound where a layer has no attention sinks (not read).
        let no_sinks = gpu.storage("no attention sinks", 4)?;
        keep.push(no_sinks.clone());
        // Every op of the plan, bound once.
        let plan = Plan::new(c);
        let mut b = Binder {
            gpu: &gpu,
            pipes: &pipes,
            step: &step_buf,
            uniforms: Vec::new(),
        };
        let mut cmds = Vec::with_capacity(plan.groups.len());
        for g in &plan.groups {
            let layer = g.kind.layer();
            let mut out = Vec::new();
            for op in &g.ops {
                match *op {
                    Op::Embed { scale } => {
                        out.push(Cmd::Embed(embd.bind_embed(
                            &gpu,
                            &mut qk,
                            &tokens_buf,
                            &acts.bufs[Buf::X as usize],
                            scale,
                            &step_buf,
                        )?));
                    }
                    Op::RmsNorm { src, dst, weight } => {
                        let w = match (weight, layer) {
                            (NormWeight::Attn, Some(l)) => &norms[l].attn_norm,
                            (NormWeight::Ffn, Some(l)) => &norms[l].ffn_norm,
                            (NormWeight::AttnPost, Some(l)) => {
                                norms[l].attn_post.as_ref().ok_or_else(|| {
                                    VulkanError::Unsupported(
                                        "the plan asks for an attention output norm the model lacks"
                                            .into(),
                                    )
                                })?
                            }
                            (NormWeight::FfnPost, Some(l)) => {
                                norms[l].ffn_post.as_ref().ok_or_else(|| {
                                    VulkanError::Unsupported(
                                        "the plan asks for a feed-forward output norm the model lacks"
                                            .into(),
                                    )
                                })?
                            }
                            (NormWeight::Output, _) => &output_norm,
                            _ => {
                                return Err(VulkanError::Unsupported(
                                    "a layer norm outside a layer group".into(),
                                ))
                            }
                        };
                        let p = b.uniform(&[
                            src.width(&model.config) as u32,
                            1,
                            c.rms_norm_eps.to_bits(),
                            0,
                        ])?;
                        out.push(Cmd::Rows {
                            pipe: P_RMS,
                            bind: b.bind(
                                P_RMS,
                                &[&acts.bufs[src as usize], &acts.bufs[dst as usize], w, &p],
                            ),
                            rows: 1,
                        });
                    }
                    Op::MatMul { src, dst, weight } => {
                        let no_mat = || {
                            VulkanError::Unsupported(format!(
                                "the plan asks for a {weight:?} matrix layer {layer:?} lacks"
                            ))
                        };
                        let mat = match (weight, layer) {
                            (MatRole::Output, _) => output.as_ref().unwrap_or(&embd),
                            (MatRole::Router, Some(l)) => {
                                &layer_experts[l].as_ref().ok_or_else(no_mat)?.router
                            }
                            (r, Some(l)) => layer_mats[l]
                                .iter()
                                .find(|(role, _)| *role == r)
                                .map(|(_, m)| m)
                                .ok_or_else(no_mat)?,
                            _ => {
                                return Err(VulkanError::Unsupported(
                                    "a layer matmul outside a layer group".into(),
                                ))
                            }
                        };
                        let w_in = src.width(&model.config) as u32;
                        let w_out = dst.width(&model.config) as u32;
                        if weight == MatRole::Output {
                            // Only the rows whose logits were asked for.
                            let p = b.uniform(&[w_in, 0, 0, 0])?;
                            out.push(Cmd::Ew {
                                pipe: P_GATHER,
                                bind: b.bind(
                                    P_GATHER,
                                    &[&acts.bufs[src as usize], &acts.gathered, &out_rows_buf, &p],
                                ),
                                per: w_in,
                                over: Over::Logits,
                            });
                            out.push(Cmd::Matmul(
                                mat.bind_matmul(
                                    &gpu,
                                    &mut qk,
                                    &acts.gathered,
                                    w_in,
                                    &acts.bufs[dst as usize],
                                    w_out,
                                    0,
                                    &step_buf,
                                    1,
                                )?,
                                Over::Logits,
                            ));
                        } else {
                            out.push(Cmd::Matmul(
                                mat.bind_matmul(
                                    &gpu,
                                    &mut qk,
                                    &acts.bufs[src as usize],
                                    w_in,
                                    &acts.bufs[dst as usize],
                                    w_out,
                                    0,
                                    &step_buf,
                                    0,
                                )?,
                                Over::Tokens,
                            ));
                            // Q/K/V, O, feed-forward and router biases of the families with them.
                            if let Some(v) = model.bias(layer, weight) {
                                let bias = gpu.upload(
                                    &format!("{weight:?} bias of layer {layer:?}"),
                                    f32_bytes(v),
                                )?;
                                b.uniforms.push(bias.clone());
                                let p = b.uniform(&[w_out, 0, 0, 0])?;
                                out.push(Cmd::Ew {
                                    pipe: P_BIAS,
                                    bind: b.bind(P_BIAS, &[&acts.bufs[dst as usize], &bias, &p]),
                                    per: w_out,
                                    over: Over::Tokens,
                                });
                            }
                        }
                    }
                    Op::QkNorm => {
                        let l = layer.ok_or_else(|| {
                            VulkanError::Unsupported("qk_norm outside a layer".into())
                        })?;
                        let (Some(qn), Some(kn)) = (&norms[l].q_norm, &norms[l].k_norm) else {
                            return Err(VulkanError::Unsupported(
                                "the plan asks for QK-norm but the model has no QK-norm weights"
                                    .into(),
                            ));
                        };
                        for (buf, w, heads) in [
                            (Buf::Q, qn, c.num_attention_heads),
                            (Buf::K, kn, c.num_key_value_heads),
                        ] {
                            let p = b.uniform(&[
                                c.head_dim as u32,
                                heads as u32,
                                c.rms_norm_eps.to_bits(),
                                0,
                            ])?;
                            out.push(Cmd::Rows {
                                pipe: P_RMS_INPLACE,
                                bind: b.bind(P_RMS_INPLACE, &[&acts.bufs[buf as usize], w, &p]),
                                rows: heads as u32,
                            });
                        }
                    }
                    Op::Rope { local } => {
                        let table = match (local, &rope_local) {
                            (false, _) => &rope_global,
                            (true, Some(t)) => t,
                            (true, None) => {
                                return Err(VulkanError::Unsupported(
                                    "the plan asks for a local RoPE the model lacks".into(),
                                ))
                            }
                        };
                        let half = (c.rope_dim / 2) as u32;
                        let pairing = match c.rope_pairing {
                            RopePairing::Adjacent => 0,
                            RopePairing::HalfSplit => 1,
                        };
                        for (buf, heads) in [
                            (Buf::Q, c.num_attention_heads),
                            (Buf::K, c.num_key_value_heads),
                        ] {
                            let p = b.uniform(&[
                                heads as u32,
                                c.head_dim as u32,
                                half,
                                pairing,
                                n_ctx as u32,
                                0,
                                0,
                                0,
                            ])?;
                            out.push(Cmd::Ew {
                                pipe: P_ROPE,
                                bind: b.bind(
                                    P_ROPE,
                                    &[&acts.bufs[buf as usize], table, &rows_buf, &p],
                                ),
                                per: heads as u32 * half,
                                over: Over::Tokens,
                            });
                        }
                    }
                    Op::StoreKv => {
                        let l = layer.ok_or_else(|| {
                            VulkanError::Unsupported("store_kv outside a layer".into())
                        })?;
                        let p = b.uniform(&[
                            c.kv_dim() as u32,
                            c.head_dim as u32,
                            c.num_key_value_heads as u32,
                            n_ctx as u32,
                        ])?;
                        out.push(Cmd::Ew {
                            pipe: P_STORE_KV,
                            bind: b.bind(
                                P_STORE_KV,
                                &[
                                    &acts.bufs[Buf::K as usize],
                                    &acts.bufs[Buf::V as usize],
                                    &kcache[l],
                                    &vcache[l],
                                    &rows_buf,
                                    &p,
                                ],
                            ),
                            per: if f16_kv {
                                c.kv_dim() as u32 / 2
                            } else {
                                c.kv_dim() as u32
                            },
                            over: Over::Tokens,
                        });
                    }
                    Op::Attention {
                        window,
                        causal,
                        sinks,
                    } => {
                        let l = layer.ok_or_else(|| {
                            VulkanError::Unsupported("attention outside a layer".into())
                        })?;
                        let sink_buf = if sinks {
                            let v = model.layers[l].sinks.as_ref().ok_or_else(|| {
                                VulkanError::Unsupported(format!(
                                    "the plan asks for attention sinks layer {l} lacks"
                                ))
                            })?;
                            let buf = gpu.upload(&format!("sinks of layer {l}"), f32_bytes(v))?;
                            b.uniforms.push(buf.clone());
                            buf
                        } else {
                            no_sinks.clone()
                        };
                        if !causal {
                            return Err(VulkanError::Unsupported(
                                "bidirectional attention has no Vulkan kernel".into(),
                            ));
                        }
                        let p = b.uniform(&[
                            c.num_attention_heads as u32,
                            c.num_key_value_heads as u32,
                            c.head_dim as u32,
                            n_ctx as u32,
                            window.unwrap_or(0) as u32,
                            c.attn_scale.to_bits(),
                            sinks as u32,
                            c.attn_logit_softcapping.unwrap_or(0.0).to_bits(),
                        ])?;
                        out.push(Cmd::Attention {
                            pipe: P_ATTENTION,
                            bind: b.bind(
                                P_ATTENTION,
                                &[
                                    &acts.bufs[Buf::Q as usize],
                                    &kcache[l],
                                    &vcache[l],
                                    &acts.bufs[Buf::Attn as usize],
                                    &rows_buf,
                                    &sink_buf,
                                    &p,
                                ],
                            ),
                            heads: c.num_attention_heads as u32,
                        });
                    }
                    Op::GatedAct(act) => {
                        let [a, alpha, limit] = gated_words(act)?;
                        let p = b.uniform(&[c.intermediate_size as u32, a, alpha, limit])?;
                        out.push(Cmd::Ew {
                            pipe: P_GATED,
                            bind: b.bind(
                                P_GATED,
                                &[
                                    &acts.bufs[Buf::Gate as usize],
                                    &acts.bufs[Buf::Up as usize],
                                    &p,
                                ],
                            ),
                            per: c.intermediate_size as u32,
                            over: Over::Tokens,
                        });
                    }
                    Op::AddResidual { src, scale } => {
                        let p = b.uniform(&[c.hidden_size as u32, scale.to_bits(), 0, 0])?;
                        out.push(Cmd::Ew {
                            pipe: P_RESIDUAL,
                            bind: b.bind(
                                P_RESIDUAL,
                                &[&acts.bufs[Buf::X as usize], &acts.bufs[src as usize], &p],
                            ),
                            per: c.hidden_size as u32,
                            over: Over::Tokens,
                        });
                    }
                    Op::Moe {
                        src,
                        logits,
                        dst,
                        top_k,
                        router,
                        activation,
                    } => {
                        let (Some(l), Some(mb)) = (layer, moe_bufs.as_ref()) else {
                            return Err(VulkanError::Unsupported(
                                "experts outside a layer, or in a model without experts".into(),
                            ));
                        };
                        let ex = layer_experts[l].as_ref().ok_or_else(|| {
                            VulkanError::Unsupported(format!(
                                "the plan asks for experts in layer {l}, which has none"
                            ))
                        })?;
                        let (ne, ff, h) = (ex.gate.experts, ex.gate.rows, c.hidden_size);
                        let k = top_k as u32;
                        let scoring = match router.scoring {
                            RouterScoring::Softmax => 0,
                            RouterScoring::TopKSoftmax => 1,
                            RouterScoring::Sigmoid => 2,
                        };
                        // `check_layers` made sure a router that asks for a selection bias
                        // has one.
                        let (sel, has_sel) = match (router.selection_bias, &ex.selection_bias) {
                            (true, Some(v)) => (v, 1),
                            (true, None) => {
                                return Err(VulkanError::Unsupported(format!(
                                    "the router of layer {l} asks for a selection bias it lacks"
                                )))
                            }
                            (false, _) => (&no_sinks, 0),
                        };
                        let [a, alpha, limit] = gated_words(activation)?;
                        let p = b.uniform(&[
                            ne as u32,
                            k,
                            scoring,
                            router.renormalize as u32,
                            router.renorm_eps.to_bits(),
                            router.scale.to_bits(),
                            has_sel,
                            0,
                        ])?;
                        out.push(Cmd::Ew {
                            pipe: P_MOE_ROUTE,
                            bind: b.bind(
                                P_MOE_ROUTE,
                                &[&acts.bufs[logits as usize], &mb.ids, &mb.wts, sel, &p],
                            ),
                            per: 1,
                            over: Over::Tokens,
                        });
                        if ne > moe_dims.map_or(0, |d| d.2) {
                            return Err(VulkanError::Unsupported(format!(
                                "layer {l} has {ne} experts, more than the config's {}",
                                moe_dims.map_or(0, |d| d.2)
                            )));
                        }
                        let p = b.uniform(&[ne as u32, k, tile, 0])?;
                        out.push(Cmd::MoeGroup(
                            b.bind(P_MOE_GROUP, &[&mb.ids, &mb.cnt, &mb.perm, &mb.tiles, &p]),
                        ));
                        let grouping = Some((&mb.perm, &mb.tiles));
                        let x = &acts.bufs[src as usize];
                        // Per-expert biases (gpt-oss) after each expert matmul.
                        for (m, y, bias) in [
                            (&ex.gate, &mb.gate, &ex.gate_bias),
                            (&ex.up, &mb.up, &ex.up_bias),
                        ] {
                            out.push(Cmd::MatmulId(m.bind_matmul_id(
                                &gpu, &mut qk, x, h as u32, k, y, ff as u32, &mb.ids, k, &step_buf,
                                grouping,
                            )?));
                            out.extend(expert_bias(&mut b, y, bias.as_ref(), &mb.ids, ff, k)?);
                        }
                        let p = b.uniform(&[k * ff as u32, a, alpha, limit])?;
                        out.push(Cmd::Ew {
                            pipe: P_GATED,
                            bind: b.bind(P_GATED, &[&mb.gate, &mb.up, &p]),
                            per: k * ff as u32,
                            over: Over::Tokens,
                        });
                        out.push(Cmd::MatmulId(ex.down.bind_matmul_id(
                            &gpu, &mut qk, &mb.gate, ff as u32, 1, &mb.out, h as u32, &mb.ids, k,
                            &step_buf, grouping,
                        )?));
                        out.extend(expert_bias(
                            &mut b,
                            &mb.out,
                            ex.down_bias.as_ref(),
                            &mb.ids,
                            h,
                            k,
                        )?);
                        let p = b.uniform(&[h as u32, k, 0, 0])?;
                        out.push(Cmd::Ew {
                            pipe: P_MOE_COMBINE,
                            bind: b.bind(
                                P_MOE_COMBINE,
                                &[&mb.out, &mb.ids, &mb.wts, &acts.bufs[dst as usize], &p],
                            ),
                            per: h as u32,
                            over: Over::Tokens,
                        });
                    }
                    Op::ShortConv { src, dst, kernel } => {
                        let l = layer.ok_or_else(|| {
                            VulkanError::Unsupported("short_conv outside a layer".into())
                        })?;
                        // `check_layers` checked the taps' and the bias's sizes.
                        let cw = model.layers[l].conv.as_ref().ok_or_else(|| {
                            VulkanError::Unsupported(format!(
                                "the plan asks for a short convolution layer {l} lacks"
                            ))
                        })?;
                        let taps = gpu.upload(
                            &format!("convolution taps of layer {l}"),
                            f32_bytes(&cw.kernel),
                        )?;
                        b.uniforms.push(taps.clone());
                        let bias = match &cw.kernel_bias {
                            Some(v) => {
                                let buf = gpu.upload(
                                    &format!("convolution bias of layer {l}"),
                                    f32_bytes(v),
                                )?;
                                b.uniforms.push(buf.clone());
                                buf
                            }
                            None => no_sinks.clone(),
                        };
                        let h = c.hidden_size as u32;
                        let p = b.uniform(&[
                            h,
                            n_ctx as u32,
                            kernel as u32,
                            cw.kernel_bias.is_some() as u32,
                        ])?;
                        let (s, d) = (&acts.bufs[src as usize], &acts.bufs[dst as usize]);
                        // Every row's `B · x` into the cache first: a row reads earlier rows'.
                        out.push(Cmd::Ew {
                            pipe: P_CONV_STORE,
                            bind: b.bind(P_CONV_STORE, &[s, &kcache[l], &rows_buf, &p]),
                            per: if f16_kv { h / 2 } else { h },
                            over: Over::Tokens,
                        });
                        out.push(Cmd::Ew {
                            pipe: P_SHORT_CONV,
                            bind: b.bind(
                                P_SHORT_CONV,
                                &[s, d, &kcache[l], &taps, &bias, &rows_buf, &p],
                            ),
                            per: h,
                            over: Over::Tokens,
                        });
                    }
                    Op::AddPositions { .. }
                    | Op::LayerNorm { .. }
                    | Op::Act(_)
                    | Op::Pool { .. } => {
                        return Err(VulkanError::Unsupported(format!(
                            "op `{}` has no Vulkan kernel (use --backend cpu)",
                            op.name()
                        )))
                    }
                    Op::ScaleLogits { scale, softcap } => {
                        let p = b.uniform(&[
                            c.vocab_size as u32,
                            scale.to_bits(),
                            softcap.unwrap_or(0.0).to_bits(),
                            0,
                        ])?;
                        out.push(Cmd::Ew {
                            pipe: P_SCALE_LOGITS,
                            bind: b.bind(P_SCALE_LOGITS, &[&acts.bufs[Buf::Logits as usize], &p]),
                            per: c.vocab_size as u32,
                            over: Over::Logits,
                        });
                    }
                }
            }
            cmds.push(out);
        }
        keep.extend(b.uniforms);
        gpu.check()?;
        let act_bufs = acts.bufs.clone();
        keep.extend(acts.bufs);
        keep.push(acts.gathered);
        keep.extend(kcache);
        keep.extend(vcache);
        keep.push(rope_global);
        keep.extend(rope_local);
        keep.push(output_norm);
        for n in norms {
            keep.extend([n.attn_norm, n.ffn_norm]);
            keep.extend(
                [n.attn_post, n.ffn_post, n.q_norm, n.k_norm]
                    .into_iter()
                    .flatten(),
            );
        }
        let mut mats = vec![embd];
        mats.extend(output);
        for l in layer_mats {
            mats.extend(l.into_iter().map(|(_, m)| m));
        }
        let mut experts = Vec::new();
        for ex in layer_experts.into_iter().flatten() {
            mats.push(ex.router);
            keep.extend(
                [ex.selection_bias, ex.gate_bias, ex.up_bias, ex.down_bias]
                    .into_iter()
                    .flatten(),
            );
            experts.extend([ex.gate, ex.up, ex.down]);
        }
        if let Some(mb) = moe_bufs {
            keep.extend([
                mb.ids, mb.wts, mb.gate, mb.up, mb.out, mb.cnt, mb.perm, mb.tiles,
            ]);
        }
        let n_groups = plan.groups.len();
        Ok(VulkanBackend {
            rows: Vec::with_capacity(2 * max_batch),
            out_rows: Vec::with_capacity(max_batch),
            logits: Vec::new(),
            n_logit_rows: 0,
            pending: None,
            stale: None,
            broken: None,
            n_ctx,
            n_seq,
            max_batch,
            weight_bytes,
            kv_bytes,
            pipes,
            cmds,
            n_groups,
            tokens_buf,
            rows_buf,
            out_rows_buf,
            step_buf,
            logits_buf,
            readback,
            acts: act_bufs,
            _keep: keep,
            _mats: mats,
            _experts: experts,
            moe_grouping,
            group_min_tokens,
            gpu,
            model,
        })
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &crate::DeviceDesc {
        &self.gpu.desc
    }

    /// Which form the expert matmuls take (the `moe-grouping` setting).
    pub fn moe_grouping(&self) -> MoeGrouping {
        self.moe_grouping
    }

    /// Under [`MoeGrouping::Auto`], the fewest tokens a step groups its expert matmuls for.
    pub fn group_min_tokens(&self) -> u32 {
        self.group_min_tokens
    }

    /// Whether a step of `n_tok` tokens runs the expert matmuls grouped by expert.
    fn groups_experts(&self, n_tok: u32) -> bool {
        match self.moe_grouping {
            MoeGrouping::Auto => n_tok >= self.group_min_tokens,
            MoeGrouping::Grouped => true,
            MoeGrouping::PerSlot => false,
        }
    }

    fn record(&self, enc: &mut wgpu::CommandEncoder, groups: Range<usize>, n_tok: u32, n_out: u32) {
        let max_dim = self.gpu.limits.max_compute_workgroups_per_dimension;
        let grouped = self.groups_experts(n_tok);
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("runlist"),
            timestamp_writes: None,
        });
        for g in groups {
            for cmd in &self.cmds[g] {
                match cmd {
                    Cmd::Ew {
                        pipe,
                        bind,
                        per,
                        over,
                    } => {
                        let n = if *over == Over::Tokens { n_tok } else { n_out };
                        if n == 0 {
                            continue;
                        }
                        let (x, y) = ops::grid(n * per, max_dim);
                        pass.set_pipeline(&self.pipes[*pipe]);
                        pass.set_bind_group(0, bind, &[]);
                        pass.dispatch_workgroups(x, y, 1);
                    }
                    Cmd::Rows { pipe, bind, rows } => {
                        let (x, y) = ops::row_grid(n_tok * rows, max_dim);
                        pass.set_pipeline(&self.pipes[*pipe]);
                        pass.set_bind_group(0, bind, &[]);
                        pass.dispatch_workgroups(x, y, 1);
                    }
                    Cmd::Attention { pipe, bind, heads } => {
                        pass.set_pipeline(&self.pipes[*pipe]);
                        pass.set_bind_group(0, bind, &[]);
                        pass.dispatch_workgroups(*heads, n_tok, 1);
                    }
                    Cmd::Matmul(m, over) => {
                        let n = if *over == Over::Tokens { n_tok } else { n_out };
                        if n > 0 {
                            m.record(&mut pass, n);
                        }
                    }
                    Cmd::MatmulId(m) if grouped => m.record_grouped(&mut pass, n_tok),
                    Cmd::MatmulId(m) => m.record(&mut pass, n_tok),
                    Cmd::MoeGroup(bind) => {
                        if grouped && n_tok > 0 {
                            pass.set_pipeline(&self.pipes[P_MOE_GROUP]);
                            pass.set_bind_group(0, bind, &[]);
                            pass.dispatch_workgroups(1, 1, 1);
                        }
                    }
                    Cmd::Embed(e) => e.record(&mut pass, n_tok),
                }
            }
        }
    }

    fn input_error(&self, batch: &Batch) -> Result<(), BatchError> {
        batch.check_for(
            self.n_seq,
            self.n_ctx,
            self.max_batch,
            self.model.token_embd.rows,
        )
    }
}

/// The `gated_act` kernel's `act`, `alpha` and `limit` words for `act`.
fn gated_words(act: Activation) -> Result<[u32; 3], VulkanError> {
    Ok(match act {
        Activation::Silu => [0, 0, 0],
        Activation::GeluTanh => [1, 0, 0],
        Activation::ClampedSwiglu { alpha, limit } => [2, alpha.to_bits(), limit.to_bits()],
        Activation::Gelu => {
            return Err(VulkanError::Unsupported(
                "exact (erf) GELU has no Vulkan kernel".into(),
            ))
        }
    })
}

/// Per-expert biases (`width` per expert) added to the (token, slot) rows of `y`.
fn expert_bias(
    b: &mut Binder,
    y: &wgpu::Buffer,
    bias: Option<&wgpu::Buffer>,
    ids: &wgpu::Buffer,
    width: usize,
    k: u32,
) -> Result<Option<Cmd>, VulkanError> {
    let Some(bias) = bias else { return Ok(None) };
    let p = b.uniform(&[width as u32, k, 0, 0])?;
    Ok(Some(Cmd::Ew {
        pipe: P_MOE_BIAS,
        bind: b.bind(P_MOE_BIAS, &[y, bias, ids, &p]),
        per: k * width as u32,
        over: Over::Tokens,
    }))
}

/// Per-layer vectors on the device.
struct LayerVecs {
    attn_norm: wgpu::Buffer,
    ffn_norm: wgpu::Buffer,
    attn_post: Option<wgpu::Buffer>,
    ffn_post: Option<wgpu::Buffer>,
    q_norm: Option<wgpu::Buffer>,
    k_norm: Option<wgpu::Buffer>,
}

/// Makes the uniforms and bind groups of ops at creation.
struct Binder<'a> {
    gpu: &'a Gpu,
    pipes: &'a [wgpu::ComputePipeline],
    step: &'a wgpu::Buffer,
    uniforms: Vec<wgpu::Buffer>,
}

impl Binder<'_> {
    fn uniform(&mut self, words: &[u32]) -> Result<wgpu::Buffer, VulkanError> {
        let b = self
            .gpu
            .uniform("op constants", bytemuck::cast_slice(words))?;
        self.uniforms.push(b.clone());
        Ok(b)
    }

    /// A bind group of `bufs` then the step uniform.
    fn bind(&self, pipe: usize, bufs: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let mut all: Vec<&wgpu::Buffer> = bufs.to_vec();
        all.push(self.step);
        self.gpu.bind(&self.pipes[pipe], &all)
    }
}

impl Backend for VulkanBackend {
    fn info(&self) -> BackendInfo {
        let d = &self.gpu.desc;
        BackendInfo {
            name: "vulkan".into(),
            kernels: "wgsl".into(),
            matmul_decode: "wgsl".into(),
            matmul_prefill: "wgsl".into(),
            threads: 1,
            device: format!("{} ({})", d.name, d.kind),
            driver: Some(d.driver.clone()),
            memory_bytes: None,
            prepared_weight_bytes: self.weight_bytes,
            kv_cache_bytes: self.kv_bytes,
        }
    }

    fn default_max_runlist_layers(&self) -> Option<usize> {
        Some(DEFAULT_RUNLIST_LAYERS)
    }

    fn rates(&self) -> DeviceRates {
        // Well below what the device sustains, times 10: only a stall misses. A software
        // driver (the CPU emulating the GPU) gets CPU-like figures.
        if self.gpu.desc.kind == "cpu" {
            DeviceRates {
                bytes_per_s: 0.3e9,
                flops_per_s: 3e9,
                slack: 10.0,
                // A software driver shares the CPU with everything else on the machine.
                floor: Duration::from_secs(30),
            }
        } else {
            DeviceRates {
                bytes_per_s: 20e9,
                flops_per_s: 500e9,
                slack: 10.0,
                floor: Duration::from_secs(2),
            }
        }
    }

    fn submit(&mut self, plan: &Plan, rl: &Runlist, batch: &Batch) -> Result<(), DeviceError> {
        if let Some(why) = &self.broken {
            return Err(DeviceError::Fault {
                group: None,
                kind: None,
                op: None,
                reason: why.clone(),
            });
        }
        if plan.groups.len() != self.n_groups
            || rl.groups.end > self.n_groups
            || rl.groups.is_empty()
        {
            return Err(DeviceError::Input(format!(
                "runlist groups {:?} do not belong to the plan this device was built for ({} groups)",
                rl.groups, self.n_groups
            )));
        }
        if let Err(e) = self.input_error(batch) {
            return Err(DeviceError::Input(e.to_string()));
        }
        // The batch's rows: (sequence, position) per token, and the rows whose logits it wants.
        self.rows.clear();
        self.out_rows.clear();
        let mut t = 0u32;
        for sp in batch.spans {
            for i in 0..sp.len {
                self.rows.push(sp.seq as u32);
                self.rows.push((sp.pos0 + i) as u32);
            }
            t += sp.len as u32;
            match batch.logits {
                LogitsWanted::Last => self.out_rows.push(t - 1),
                LogitsWanted::All => self.out_rows.extend(t - sp.len as u32..t),
                LogitsWanted::None => {}
            }
        }
        let has_output = plan.groups[rl.groups.clone()]
            .iter()
            .any(|g| g.kind == GroupKind::Output);
        let n_tok = batch.tokens.len() as u32;
        let n_out = self.out_rows.len() as u32;
        let q = &self.gpu.queue;
        q.write_buffer(&self.tokens_buf, 0, bytemuck::cast_slice(batch.tokens));
        q.write_buffer(&self.rows_buf, 0, bytemuck::cast_slice(&self.rows));
        if !self.out_rows.is_empty() {
            q.write_buffer(&self.out_rows_buf, 0, bytemuck::cast_slice(&self.out_rows));
        }
        q.write_buffer(
            &self.step_buf,
            0,
            bytemuck::bytes_of(&StepParams {
                n_tok,
                n_out,
                _pad: [0; 2],
            }),
        );
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("runlist"),
            });
        self.record(&mut enc, rl.groups.clone(), n_tok, n_out);
        let logit_rows = if has_output { n_out as usize } else { 0 };
        if logit_rows > 0 {
            let bytes = (logit_rows * self.model.config.vocab_size * 4) as u64;
            enc.copy_buffer_to_buffer(&self.logits_buf, 0, &self.readback, 0, Some(bytes));
        }
        let index = q.submit([enc.finish()]);
        self.pending = Some(Pending {
            index,
            groups: rl.groups.clone(),
            logit_rows,
        });
        Ok(())
    }

    fn wait(
        &mut self,
        _plan: &Plan,
        deadline: Instant,
        _trace: Option<&mut Trace>,
    ) -> Result<(), DeviceError> {
        let Some(p) = self.pending.take() else {
            return Err(DeviceError::Input(
                "wait without a submitted runlist".into(),
            ));
        };
        let began = Instant::now();
        let fault = |reason: String| DeviceError::Fault {
            group: Some(p.groups.start),
            kind: None,
            op: None,
            reason,
        };
        match self.gpu.wait(
            Some(p.index.clone()),
            deadline.saturating_duration_since(began),
        ) {
            Ok(()) => {}
            Err(WaitError::Timeout) => {
                // The queue cannot take the work back: `cancel` drains it.
                self.stale = Some(p.index);
                return Err(DeviceError::Timeout {
                    waited: began.elapsed(),
                    group: None,
                    kind: None,
                    op: None,
                });
            }
            Err(WaitError::Failed(e)) => return Err(fault(e)),
        }
        self.gpu.check().map_err(|e| fault(e.to_string()))?;
        if p.logit_rows > 0 {
            let vocab = self.model.config.vocab_size;
            let len = (p.logit_rows * vocab * 4) as u64;
            let limit = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(1));
            let logits = &mut self.logits;
            self.gpu
                .map_read(&self.readback, len, limit, |b| {
                    logits.clear();
                    logits.extend_from_slice(bytemuck::cast_slice(b));
                })
                .map_err(|e| fault(e.to_string()))?;
            self.n_logit_rows = p.logit_rows;
        } else if p.groups.end == self.n_groups {
            self.n_logit_rows = 0;
        }
        Ok(())
    }

    fn cancel(&mut self) {
        self.pending = None;
        if let Some(idx) = self.stale.take() {
            if let Err(e) = self.gpu.wait(Some(idx), DRAIN_LIMIT) {
                self.broken = Some(format!(
                    "work of a runlist that missed its deadline did not leave the queue within {} s ({e:?})",
                    DRAIN_LIMIT.as_secs()
                ));
            }
        }
    }

    fn logits(&self) -> &[f32] {
        &self.logits[..self.n_logit_rows * self.model.config.vocab_size]
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn n_seq(&self) -> usize {
        self.n_seq
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn read_activation(&mut self, buf: Buf, rows: usize) -> Result<Vec<f32>, ProbeError> {
        if buf == Buf::Logits {
            return Ok(self.logits().to_vec());
        }
        self.idle_for("read", buf)?;
        let width = buf.width(&self.model.config);
        if rows > self.max_batch || width == 0 {
            return Err(ProbeError::Rows {
                buf,
                rows,
                max: self.max_batch,
                width,
            });
        }
        let len = (rows * width * 4) as u64;
        if len == 0 {
            return Ok(Vec::new());
        }
        let dst = self
            .gpu
            .readback(&format!("{buf:?} readback"), len.next_multiple_of(4))
            .map_err(|e| read_failed(buf, e))?;
        let bytes = self
            .gpu
            .read(&self.acts[buf as usize], &dst, 0, len, DRAIN_LIMIT)
            .map_err(|e| read_failed(buf, e))?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    fn write_activation(&mut self, buf: Buf, values: &[f32]) -> Result<(), ProbeError> {
        self.idle_for("write", buf)?;
        let width = buf.width(&self.model.config);
        if buf == Buf::Logits
            || width == 0
            || !values.len().is_multiple_of(width)
            || values.len() / width > self.max_batch
        {
            return Err(ProbeError::Write {
                buf,
                len: values.len(),
                width,
                max: self.max_batch,
            });
        }
        // Ordered before the next submission on the queue.
        self.gpu
            .queue
            .write_buffer(&self.acts[buf as usize], 0, bytemuck::cast_slice(values));
        Ok(())
    }
}

impl VulkanBackend {
    /// Activations are read and written between runlists only, on a working device.
    fn idle_for(&self, what: &'static str, buf: Buf) -> Result<(), ProbeError> {
        let busy = |reason: String| ProbeError::Device { what, buf, reason };
        if let Some(why) = &self.broken {
            return Err(busy(why.to_string()));
        }
        if self.pending.is_some() || self.stale.is_some() {
            return Err(busy(
                "a runlist is on the device (wait for it first)".into(),
            ));
        }
        Ok(())
    }
}

/// A failed read-back of activation buffer `buf`.
fn read_failed(buf: Buf, e: impl std::fmt::Display) -> ProbeError {
    ProbeError::Device {
        what: "read",
        buf,
        reason: e.to_string(),
    }
}

/// What a model's family needs that this backend has no kernel for, in words (empty: it can
/// run). Checked before anything is uploaded, so such a model is refused by name rather than
/// run wrong.
fn lacks(c: &flowrt_model::ModelConfig) -> Vec<&'static str> {
    use flowrt_model::arch::{NormKind, NormPosition, Positions};
    let a = c.arch;
    let mut missing = Vec::new();
    if !a.causal {
        missing.push("bidirectional attention");
    }
    if a.norm == NormKind::Layer {
        missing.push("LayerNorm");
    }
    if a.norm_position == NormPosition::Post {
        missing.push("post-norm blocks");
    }
    if a.positions == Positions::Learned {
        missing.push("learned position embeddings");
    }
    if a.token_types {
        missing.push("token-type embeddings");
    }
    if a.embed_norm {
        missing.push("embedding norm");
    }
    if !a.gated_ffn {
        missing.push("plain (ungated) feed-forward");
    }
    if c.activation == flowrt_model::Activation::Gelu {
        missing.push("exact (erf) GELU");
    }
    if !a.lm_head {
        missing.push("embedding-only models (no output projection; pooling)");
    }
    missing
}

/// Per-layer weights the kernels read with sizes from the config, checked before anything is
/// uploaded: a short convolution layer's taps `(hidden, kernel)` and bias `(hidden)`, and a
/// router's selection bias `(num_experts)` where the router asks for one. With f16 values in
/// the convolution cache (`f16_kv`), `hidden` must be even (two values per word).
fn check_layers(model: &Model, f16_kv: bool) -> Result<(), VulkanError> {
    let c = &model.config;
    let h = c.hidden_size;
    for (l, lw) in model.layers.iter().enumerate() {
        if let (Some(sc), Some(cw)) = (&c.short_conv, &lw.conv) {
            if sc.kernel == 0 || cw.kernel.len() != h * sc.kernel {
                return Err(VulkanError::Unsupported(format!(
                    "layer {l}'s convolution taps hold {} values, not hidden {h} × kernel {}",
                    cw.kernel.len(),
                    sc.kernel
                )));
            }
            if let Some(b) = &cw.kernel_bias {
                if b.len() != h {
                    return Err(VulkanError::Unsupported(format!(
                        "layer {l}'s convolution bias holds {} values, not hidden {h}",
                        b.len()
                    )));
                }
            }
            if f16_kv && !h.is_multiple_of(2) {
                return Err(VulkanError::Unsupported(format!(
                    "short convolution layers with an odd hidden size ({h}) and an f16 cache have no Vulkan kernel (use --kv-type f32)"
                )));
            }
        }
        if let (Some(m), Some(mw)) = (&c.moe, &lw.moe) {
            if m.router.selection_bias {
                let n = mw.selection_bias.as_ref().map(Vec::len);
                if n != Some(mw.gate.len()) {
                    return Err(VulkanError::Unsupported(format!(
                        "the router of layer {l} asks for a selection bias of one value per expert ({}); the layer has {}",
                        mw.gate.len(),
                        n.map_or("none".to_string(), |n| format!("{n} values"))
                    )));
                }
            }
        }
    }
    Ok(())
}
