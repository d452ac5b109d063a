//! Executes command groups on the CPU.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flowrt_dispatch::{
    Backend, BackendInfo, BackendSettings, DeviceError, DeviceRates, KvPrecision, Runlist, Trace,
};

use flowrt_dtype::GgmlType;
use flowrt_kernels::Kernels;
use flowrt_model::plan::{Buf, CommandGroup, GroupKind, MatRole, NormWeight, Op};
use flowrt_model::{Model, Plan, WeightMatrix};

pub use crate::act::ActQuant;
use crate::act::ActRows;
use crate::kv::{self, as_f16_mut, KvCache, KvStore, KvType};
use crate::packed::PackedWeights;
use crate::pool::{ColumnWriter, ThreadPool};
use crate::rope::RopeTable;

mod attention;
mod input_stats;
mod short_conv;
pub use attention::AttnSplit;

/// Rows of a weight matrix one matmul task computes: at least enough that the kernels'
/// software prefetch (16-32 rows ahead) runs inside each task's slice of the weights, at most
/// what the per-thread output tile holds.
const MIN_ROW_BLOCK: usize = 64;
const MAX_ROW_BLOCK: usize = 256;

/// Rows per task for a job of `rows` rows in all on `threads` threads: about two tasks per
/// thread, within [`MIN_ROW_BLOCK`, `MAX_ROW_BLOCK`], a multiple of 16. Larger tasks stream
/// weights better (measured on SmolLM2: decode 117 -> 130 tok/s and 4 batched sequences
/// 241 -> 276 tok/s going from 64 to 128-256 rows), smaller ones balance small matrices
/// over many threads.
pub(crate) fn row_block(rows: usize, threads: usize) -> usize {
    (rows / (2 * threads.max(1)) / 16 * 16).clamp(MIN_ROW_BLOCK, MAX_ROW_BLOCK)
}
/// A matmul's weight and optional bias.
type WeightAndBias<'a> = (&'a WeightMatrix, Option<&'a Vec<f32>>);

/// Most matmuls of one input that run as one parallel job.
const MAX_FUSED: usize = 3;

/// Settings of a CPU backend instance.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Threads in total (the calling thread included).
    pub threads: usize,
    /// Context length: positions the KV cache holds.
    pub n_ctx: usize,
    /// Element type of the KV cache.
    pub kv_type: KvType,
    /// Most tokens one `execute` call may carry (prompts are prefilled in batches of this).
    pub max_batch: usize,
    /// Sequences the KV cache holds (each `n_ctx` positions); a batch may mix them.
    pub n_seq: usize,
    /// Kernels to use (defaults to the best the host supports).
    pub kernels: Option<&'static Kernels>,
    /// Activation quantisation for quantised weights.
    pub act_quant: ActQuant,
    /// Repack the weights that have an x8 layout (`flowrt_kernels::x8`) at creation: faster
    /// matmuls; needs `act_quant` Q16 and a SIMD kernel table (otherwise ignored).
    pub repack: bool,
    /// How attention splits long key ranges over threads (see [`AttnSplit`]).
    pub attn_split: AttnSplit,
}

/// The backend options (`BackendSettings::options`) the CPU takes:
///
/// - `kernels`: the kernel table, as [`Kernels::select`] names them (`scalar`, `avx2`,
///   `avx512`, `avx512vnni`, `neon`); without it the best the host runs, or `FLOWRT_KERNELS`.
/// - `act-quant`: `q16` (the default), `q8x` or `q8` (see [`ActQuant`]).
/// - `repack`: `true` (the default) or `false` (see [`CpuOptions::repack`]).
/// - `attn-split`: `auto` (the default), `off`, or a number of parts (see [`AttnSplit`]).
pub const CPU_OPTIONS: [&str; 4] = ["kernels", "act-quant", "repack", "attn-split"];

impl CpuOptions {
    /// The CPU's configuration for generic `settings`: threads 0 means the physical cores,
    /// the KV precision maps to [`KvType`], and the backend options ([`CPU_OPTIONS`]) are
    /// parsed; an option the CPU does not take, a value it cannot parse or a device other than
    /// 0 (the CPU is one device) is an error naming it.
    pub fn from_settings(s: &BackendSettings) -> Result<CpuOptions, BackendError> {
        s.check_options("cpu", &CPU_OPTIONS)
            .map_err(BackendError::UnknownSetting)?;
        if let Some(index) = s.device.filter(|&d| d != 0) {
            return Err(BackendError::NoSuchDevice { index });
        }
        let bad = |name: &'static str, value: &str, reason: String| BackendError::BadSetting {
            name,
            value: value.to_string(),
            reason,
        };
        let kernels = match s.option("kernels") {
            Some(v) => Some(
                Kernels::select(Some(v)).map_err(|error| BackendError::Kernels {
                    value: v.to_string(),
                    error,
                })?,
            ),
            // `Kernels::detect` (at creation) honours FLOWRT_KERNELS.
            None => None,
        };
        let act_quant = match s.option("act-quant") {
            Some(v) => v.parse().map_err(|r| bad("act-quant", v, r))?,
            None => ActQuant::default(),
        };
        let repack = match s.option("repack") {
            None | Some("true") => true,
            Some("false") => false,
            Some(v) => return Err(bad("repack", v, "use true or false".into())),
        };
        let attn_split = match s.option("attn-split") {
            Some(v) => v.parse().map_err(|r| bad("attn-split", v, r))?,
            None => AttnSplit::default(),
        };
        Ok(CpuOptions {
            threads: match s.threads {
                0 => crate::physical_cores(),
                n => n,
            },
            n_ctx: s.n_ctx,
            kv_type: match s.kv {
                KvPrecision::F16 => KvType::F16,
                KvPrecision::F32 => KvType::F32,
            },
            max_batch: s.max_batch,
            n_seq: s.n_seq,
            kernels,
            act_quant,
            repack,
            attn_split,
        })
    }
}

pub use flowrt_dispatch::{Batch, LogitsWanted, SeqSpan};

/// Why a batch could not run.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("token id {id} at batch index {index} is outside the vocabulary (size {vocab})")]
    BadToken { id: u32, index: usize, vocab: usize },
    #[error("positions {pos0}..{end} do not fit the context of {n_ctx} tokens")]
    ContextFull {
        pos0: usize,
        end: usize,
        n_ctx: usize,
    },
    #[error("a batch carries 1..={max} tokens, got {got}")]
    BadBatch { got: usize, max: usize },
    #[error("bad batch: {0}")]
    BadSpans(String),
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

/// Per-thread scratch, allocated once.
struct ThreadScratch {
    scores: Vec<f32>, // (group, n_ctx) attention scores of the query heads of one KV head
    tile: Vec<f32>,   // (max_batch, MAX_ROW_BLOCK) one matmul task's output
}

/// The CPU backend for one model instance (one sequence's KV cache).
pub struct CpuBackend {
    model: Arc<Model>,
    kernels: &'static Kernels,
    pool: ThreadPool,
    rope: RopeTable,
    /// RoPE of sliding-window layers that have their own (Gemma 3).
    rope_local: Option<RopeTable>,
    kv: KvCache,
    max_batch: usize,
    bufs: [Vec<f32>; 12], // indexed by `Buf as usize`, each (max_batch, width)
    quant: Vec<u8>,       // quantised activation rows for the current matmul input
    quant_of: Option<(Buf, ActRows, usize, usize)>, // (buffer, format, first row, rows) held in `quant`
    rows: Vec<(usize, usize)>, // (max_batch) sequence and position of each row of the batch
    row_last: Vec<usize>, // (max_batch) last position of each row's span (bidirectional attention)
    row_see: Vec<usize>,  // (max_batch) last position each row attends to in the current attention
    pooled: Vec<f32>,     // (spans, hidden) the last batch's pooled rows (embedding plans)
    n_pooled: usize,      // rows of `pooled` the last batch produced
    logit_rows: Vec<usize>, // (max_batch) rows whose logits the batch wants
    act_quant: ActQuant,
    /// Matrices repacked in the x8 layout (the rest are used in their row layout).
    packed: PackedWeights,
    per_thread: Vec<Mutex<ThreadScratch>>,
    /// A mixture-of-experts layer's batch scratch (empty without experts).
    moe: crate::moe::MoeBatch,
    attn_split: AttnSplit,
    /// (slots, group, head_dim + 2) partial outputs of split attention, with each head's max
    /// and sum (see `attention::slot_len`); empty when no batch can split.
    attn_parts: Vec<f32>,
    n_logit_rows: usize,
    /// A submitted runlist: its groups and logits wanted; tokens and spans alongside.
    pending: Option<(Range<usize>, LogitsWanted)>,
    pending_tokens: Vec<u32>,    // (max_batch)
    pending_spans: Vec<SeqSpan>, // (n_seq)
    /// The dense matmuls' input statistics while collecting them
    /// ([`Backend::collect_input_stats`]).
    input_stats: Option<input_stats::InputStats>,
}

impl CpuBackend {
    /// A CPU backend for generic settings (see [`CpuOptions::from_settings`]).
    pub fn from_settings(model: Arc<Model>, s: &BackendSettings) -> Result<Self, BackendError> {
        Self::new(model, &CpuOptions::from_settings(s)?)
    }

    pub fn new(model: Arc<Model>, opts: &CpuOptions) -> Result<Self, BackendError> {
        let kernels = opts.kernels.unwrap_or_else(Kernels::detect);
        let c = &model.config;
        let mut mats: Vec<&WeightMatrix> = vec![&model.token_embd];
        mats.extend(&model.output);
        mats.extend(&model.pos_embd);
        mats.extend(&model.token_types);
        for l in &model.layers {
            mats.extend(l.matrices());
        }
        for m in mats {
            if !Kernels::supports(m.dtype) {
                return Err(BackendError::UnsupportedType {
                    tensor: m.name.clone(),
                    ty: m.dtype,
                });
            }
        }
        let max_batch = opts.max_batch.max(1);
        let n_ctx = opts.n_ctx.max(1);
        let bufs = Buf::ALL.map(|b| {
            // Logits grow on demand (most batches want one row).
            let rows = if b == Buf::Logits { 1 } else { max_batch };
            vec![0.0f32; rows * b.width(&model.config)]
        });
        let pool = ThreadPool::new(opts.threads);
        let packed = if opts.repack
            && matches!(opts.act_quant, ActQuant::Q16 | ActQuant::Q8x)
            && kernels.isa() != flowrt_kernels::Isa::Scalar
        {
            PackedWeights::build(&model, pool.n_threads()).map_err(BackendError::Repack)?
        } else {
            PackedWeights::none(model.layers.len())
        };
        let per_thread = (0..pool.n_threads())
            .map(|_| {
                Mutex::new(ThreadScratch {
                    scores: vec![0.0; n_ctx * (c.num_attention_heads / c.num_key_value_heads)],
                    tile: vec![0.0; max_batch * MAX_ROW_BLOCK],
                })
            })
            .collect();
        let (group, kv_items) = (
            c.num_attention_heads / c.num_key_value_heads,
            max_batch * c.num_key_value_heads,
        );
        let attn_slots = match opts.kv_type {
            KvType::F16 => opts.attn_split.max_slots(pool.n_threads(), kv_items),
            KvType::F32 => 0,
        };
        Ok(CpuBackend {
            rope: RopeTable::new(c.rope_dim, &c.rope, c.rope_pairing, n_ctx),
            rope_local: c
                .rope_local
                .as_ref()
                .map(|r| RopeTable::new(c.rope_dim, r, c.rope_pairing, n_ctx)),
            kv: KvCache::hybrid(
                opts.kv_type,
                &(0..c.num_hidden_layers)
                    .map(|l| if c.layer_is_conv(l) { c.hidden_size } else { 0 })
                    .collect::<Vec<_>>(),
                opts.n_seq.max(1),
                n_ctx,
                c.num_key_value_heads,
                c.head_dim,
            ),
            kernels,
            pool,
            max_batch,
            bufs,
            quant: Vec::new(),
            quant_of: None,
            rows: Vec::with_capacity(max_batch),
            row_last: Vec::with_capacity(max_batch),
            row_see: Vec::with_capacity(max_batch),
            pooled: Vec::new(),
            n_pooled: 0,
            logit_rows: Vec::with_capacity(max_batch),
            per_thread,
            moe: Default::default(),
            attn_split: opts.attn_split,
            attn_parts: vec![0.0; attn_slots * attention::slot_len(group, c.head_dim)],
            n_logit_rows: 0,
            pending: None,
            pending_tokens: Vec::with_capacity(max_batch),
            pending_spans: Vec::with_capacity(opts.n_seq.max(1)),
            input_stats: None,
            act_quant: opts.act_quant,
            packed,
            model,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    pub fn kernels(&self) -> &'static Kernels {
        self.kernels
    }
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx
    }
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }
    /// Bytes of weights repacked at creation (0 when none were).
    pub fn packed_bytes(&self) -> usize {
        self.packed.bytes()
    }

    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    /// Logits of the last batch: `(rows, vocab)`, one row per token that asked for them.
    pub fn logits(&self) -> &[f32] {
        &self.bufs[Buf::Logits as usize][..self.n_logit_rows * self.model.config.vocab_size]
    }

    /// Run `groups` (a contiguous part of the model's plan, in order) over `batch`.
    pub fn execute(
        &mut self,
        groups: &[CommandGroup],
        first_group: usize,
        batch: &Batch,
    ) -> Result<(), BackendError> {
        self.execute_watched(groups, first_group, batch, None, None)
    }

    /// [`CpuBackend::execute`], stopping with [`BackendError::Deadline`] before an op that
    /// would start after `deadline`, and recording a span per op in `trace`.
    pub fn execute_watched(
        &mut self,
        groups: &[CommandGroup],
        first_group: usize,
        batch: &Batch,
        deadline: Option<Instant>,
        mut trace: Option<&mut Trace>,
    ) -> Result<(), BackendError> {
        let began = Instant::now();
        let n = batch.tokens.len();
        if n == 0 || n > self.max_batch {
            return Err(BackendError::BadBatch {
                got: n,
                max: self.max_batch,
            });
        }
        for sp in batch.spans {
            let end = sp.pos0.saturating_add(sp.len);
            if end > self.kv.n_ctx {
                return Err(BackendError::ContextFull {
                    pos0: sp.pos0,
                    end,
                    n_ctx: self.kv.n_ctx,
                });
            }
        }
        batch
            .check(self.kv.n_seq, self.kv.n_ctx)
            .map_err(BackendError::BadSpans)?;
        // Sequence and position of every row; the rows whose logits are wanted.
        self.rows.clear();
        self.row_last.clear();
        self.logit_rows.clear();
        self.n_pooled = 0;
        let mut row = 0;
        for sp in batch.spans {
            self.rows
                .extend((sp.pos0..sp.pos0 + sp.len).map(|p| (sp.seq, p)));
            self.row_last
                .extend(std::iter::repeat_n(sp.pos0 + sp.len - 1, sp.len));
            row += sp.len;
            match batch.logits {
                LogitsWanted::Last => self.logit_rows.push(row - 1),
                LogitsWanted::All => self.logit_rows.extend(row - sp.len..row),
                LogitsWanted::None => {}
            }
        }
        for (gi, group) in groups.iter().enumerate() {
            let mut i = 0;
            while i < group.ops.len() {
                let op = &group.ops[i];
                let err = |reason| BackendError::Op {
                    group: first_group + gi,
                    kind: group.kind,
                    op: op.name(),
                    reason,
                };
                let start = Instant::now();
                if let Some(d) = deadline {
                    if start > d {
                        return Err(BackendError::Deadline {
                            group: first_group + gi,
                            kind: group.kind,
                            op: op.name(),
                            late: start - d,
                            ran: start - began,
                        });
                    }
                }
                if let Op::MatMul { src, .. } = *op {
                    // Consecutive matmuls of one input (Q/K/V, gate/up) run as one parallel job.
                    let mut items = [(Buf::X, MatRole::Q); MAX_FUSED];
                    let mut n = 0;
                    while n < MAX_FUSED && i + n < group.ops.len() {
                        match group.ops[i + n] {
                            Op::MatMul {
                                src: s,
                                dst,
                                weight,
                            } if s == src && dst != src => {
                                items[n] = (dst, weight);
                                n += 1;
                            }
                            _ => break,
                        }
                    }
                    self.matmuls(group.kind.layer(), src, &items[..n.max(1)], batch)
                        .map_err(err)?;
                    if let Some(t) = trace.as_deref_mut() {
                        // Fused matmuls share one span each.
                        let end = Instant::now();
                        for o in &group.ops[i..i + n.max(1)] {
                            t.op(o.name(), first_group + gi, group.kind.layer(), start, end);
                        }
                    }
                    i += n.max(1);
                    continue;
                }
                self.run_op(group.kind, op, batch).map_err(err)?;
                if let Some(t) = trace.as_deref_mut() {
                    t.op(
                        op.name(),
                        first_group + gi,
                        group.kind.layer(),
                        start,
                        Instant::now(),
                    );
                }
                // Anything but a matmul may change the quantised input.
                self.quant_of = None;
                i += 1;
            }
        }
        Ok(())
    }

    fn run_op(&mut self, kind: GroupKind, op: &Op, batch: &Batch) -> Result<(), String> {
        let n = batch.tokens.len();
        let c = &self.model.config;
        let (h, qd, kvd, hd) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.head_dim);
        let layer = kind.layer();
        let k = self.kernels;
        match *op {
            Op::Embed { scale } => {
                let emb = &self.model.token_embd;
                // Tied embeddings packed for the output projection: look rows up there, so the
                // file's copy is never paged in again.
                let packed = if self.model.tied_embeddings {
                    self.packed.get(None, MatRole::Output)
                } else {
                    None
                };
                let x = &mut self.bufs[Buf::X as usize];
                for (t, &id) in batch.tokens.iter().enumerate() {
                    if id as usize >= emb.rows {
                        return Err(BackendError::BadToken {
                            id,
                            index: t,
                            vocab: emb.rows,
                        }
                        .to_string());
                    }
                    let out = &mut x[t * h..(t + 1) * h];
                    match packed {
                        Some(p) => {
                            flowrt_kernels::x8::dequantize_row(emb.dtype, p, id as usize, out)
                        }
                        None => {
                            let row = emb.rows_bytes(id as usize, id as usize + 1);
                            k.dequantize_row(emb.dtype, row, out)
                        }
                    }
                }
                if scale != 1.0 {
                    k.scale(&mut x[..n * h], scale);
                }
            }
            Op::AddPositions { token_type } => {
                let model = &self.model;
                let pe = model
                    .pos_embd
                    .as_ref()
                    .ok_or("the model has no position embeddings")?;
                // Every token is of type 0 (one text per sequence).
                let mut row = vec![0f32; h];
                let mut type0 = vec![0f32; h];
                if token_type {
                    let tt = model
                        .token_types
                        .as_ref()
                        .ok_or("the model has no token-type embeddings")?;
                    k.dequantize_row(tt.dtype, tt.rows_bytes(0, 1), &mut type0);
                }
                let x = &mut self.bufs[Buf::X as usize];
                for (t, &(_, pos)) in self.rows.iter().enumerate() {
                    if pos >= pe.rows {
                        return Err(format!(
                            "position {pos} is beyond the model's {} learned positions",
                            pe.rows
                        ));
                    }
                    k.dequantize_row(pe.dtype, pe.rows_bytes(pos, pos + 1), &mut row);
                    let xt = &mut x[t * h..(t + 1) * h];
                    k.add(xt, &row);
                    if token_type {
                        k.add(xt, &type0);
                    }
                }
            }
            Op::RmsNorm { src, dst, weight } => {
                let (w, _) = Self::norm_weights(&self.model, weight, layer)?;
                if src == dst {
                    let x = &mut self.bufs[src as usize];
                    for row in x[..n * h].chunks_exact_mut(h) {
                        rms_norm_in_place(k, row, w, c.rms_norm_eps);
                    }
                } else {
                    let (s, d) = two_bufs(&mut self.bufs, src, dst);
                    for t in 0..n {
                        k.rms_norm(
                            &s[t * h..(t + 1) * h],
                            w,
                            c.rms_norm_eps,
                            &mut d[t * h..(t + 1) * h],
                        );
                    }
                }
            }
            Op::LayerNorm { src, dst, weight } => {
                let (w, b) = Self::norm_weights(&self.model, weight, layer)?;
                let b = b.ok_or("a LayerNorm without a bias")?;
                if src != dst {
                    let (s, d) = two_bufs(&mut self.bufs, src, dst);
                    d[..n * h].copy_from_slice(&s[..n * h]);
                }
                let x = &mut self.bufs[dst as usize];
                for row in x[..n * h].chunks_exact_mut(h) {
                    crate::ops::layer_norm_in_place(row, w, b, c.rms_norm_eps);
                }
            }
            Op::MatMul { src, dst, weight } => self.matmuls(layer, src, &[(dst, weight)], batch)?,
            Op::QkNorm => {
                let l = layer.ok_or("qk_norm outside a layer")?;
                let lw = &self.model.layers[l];
                let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) else {
                    return Err("the model has no QK-norm weights".into());
                };
                for (b, w, width) in [(Buf::Q, qn, qd), (Buf::K, kn, kvd)] {
                    let buf = &mut self.bufs[b as usize];
                    for head in buf[..n * width].chunks_exact_mut(hd) {
                        rms_norm_in_place(k, head, w, c.rms_norm_eps);
                    }
                }
            }
            Op::Rope { local } => {
                let rope = match (local, &self.rope_local) {
                    (false, _) => &self.rope,
                    (true, Some(r)) => r,
                    (true, None) => return Err("the model has no local RoPE".into()),
                };
                for (b, width) in [(Buf::Q, qd), (Buf::K, kvd)] {
                    let buf = &mut self.bufs[b as usize];
                    for (t, &(_, pos)) in self.rows.iter().enumerate() {
                        for head in buf[t * width..(t + 1) * width].chunks_exact_mut(hd) {
                            rope.apply(head, pos);
                        }
                    }
                }
            }
            Op::StoreKv => {
                let l = layer.ok_or("store_kv outside a layer")?;
                let nkv = c.num_key_value_heads;
                for (b, is_k) in [(Buf::K, true), (Buf::V, false)] {
                    let src = &self.bufs[b as usize];
                    let (n_ctx, kv_hd) = (self.kv.n_ctx, self.kv.head_dim);
                    let off = |seq, g, p| kv::offset(n_ctx, kv_hd, seq * nkv + g, p);
                    let store = if is_k {
                        &mut self.kv.k[l]
                    } else {
                        &mut self.kv.v[l]
                    };
                    for (t, &(seq, pos)) in self.rows.iter().enumerate() {
                        for g in 0..nkv {
                            let o = off(seq, g, pos);
                            let row = &src[t * kvd + g * hd..t * kvd + (g + 1) * hd];
                            match store {
                                KvStore::F16(s) => k.f32_to_f16(row, as_f16_mut(&mut s[o..o + hd])),
                                KvStore::F32(s) => s[o..o + hd].copy_from_slice(row),
                            }
                        }
                    }
                }
            }
            Op::ShortConv { src, dst, kernel } => {
                let l = layer.ok_or("short_conv outside a layer")?;
                self.short_conv(l, src, dst, kernel, n)?;
            }
            Op::Attention {
                window,
                causal,
                sinks,
            } => {
                let l = layer.ok_or("attention outside a layer")?;
                self.attention(l, window, causal, sinks, batch)?;
            }
            Op::Moe {
                src,
                logits,
                dst,
                top_k,
                router,
                activation,
            } => self.moe(layer, [src, logits, dst], top_k, router, activation, n)?,
            Op::Act(act) => {
                let ff = c.intermediate_size;
                let up = &mut self.bufs[Buf::Up as usize][..n * ff];
                match act {
                    flowrt_model::Activation::Gelu => {
                        self.pool
                            .for_each_chunk_mut(up, ff, &|_, _, row| crate::ops::gelu_in_place(row))
                    }
                    other => return Err(format!("no plain activation kernel for {other:?}")),
                }
            }
            Op::Pool { src, pooling } => self.pool_rows(src, pooling, batch)?,
            Op::ScaleLogits { scale, softcap } => {
                let logits =
                    &mut self.bufs[Buf::Logits as usize][..self.n_logit_rows * c.vocab_size];
                if scale != 1.0 {
                    k.scale(logits, scale);
                }
                if let Some(cap) = softcap {
                    for v in logits.iter_mut() {
                        *v = cap * (*v / cap).tanh();
                    }
                }
            }
            Op::GatedAct(act) => {
                let ff = c.intermediate_size;
                let (up, gate) = two_bufs(&mut self.bufs, Buf::Up, Buf::Gate);
                match act {
                    flowrt_model::Activation::Silu => {
                        k.silu_mul(&mut gate[..n * ff], &up[..n * ff])
                    }
                    flowrt_model::Activation::GeluTanh => {
                        k.gelu_tanh_mul(&mut gate[..n * ff], &up[..n * ff])
                    }
                    flowrt_model::Activation::Gelu => {
                        crate::ops::gelu_mul(&mut gate[..n * ff], &up[..n * ff])
                    }
                    flowrt_model::Activation::ClampedSwiglu { alpha, limit } => {
                        crate::ops::clamped_swiglu_mul(
                            &mut gate[..n * ff],
                            &up[..n * ff],
                            alpha,
                            limit,
                        )
                    }
                }
            }
            Op::AddResidual { src, scale } => {
                let (s, x) = two_bufs(&mut self.bufs, src, Buf::X);
                if scale == 1.0 {
                    k.add(&mut x[..n * h], &s[..n * h]);
                } else {
                    for (xi, si) in x[..n * h].iter_mut().zip(&s[..n * h]) {
                        *xi += si * scale;
                    }
                }
            }
        }
        Ok(())
    }

    /// A mixture of experts over the batch's `n` rows: route each row by its logits, run each
    /// chosen expert once on its rows, and sum the weighted outputs into `dst` (see
    /// [`crate::moe`]).
    fn moe(
        &mut self,
        layer: Option<usize>,
        [src, logits, dst]: [Buf; 3],
        top_k: usize,
        router: flowrt_model::Router,
        act: flowrt_model::Activation,
        n: usize,
    ) -> Result<(), String> {
        let model = self.model.clone();
        let w = layer
            .and_then(|l| model.layers.get(l))
            .and_then(|l| l.moe.as_ref())
            .ok_or("the layer has no experts")?;
        let h = model.config.hidden_size;
        let ne = w.gate.len();
        let lg = &self.bufs[logits as usize];
        if lg.len() < n * ne || self.bufs[src as usize].len() < n * h {
            return Err(format!("buffers too small for {n} rows of {ne} experts"));
        }
        let selection_bias = match (router.selection_bias, &w.selection_bias) {
            (false, _) => None,
            (true, Some(b)) if b.len() == ne => Some(&b[..]),
            (true, _) => {
                return Err(
                    "the layer's router has no selection bias of one value per expert".into(),
                )
            }
        };
        let (act_quant, kern) = (self.act_quant, self.kernels);
        let fmt = |ty: GgmlType, packed: bool| ActRows::for_weight(act_quant, kern, ty, packed);
        let l = layer.ok_or("the layer has no experts")?;
        let packed = &self.packed;
        let packed = |e: usize, which: usize| packed.expert(l, e, which);
        let run = crate::moe::MoeLayer {
            kern: self.kernels,
            fmt: &fmt,
            w,
            packed: &packed,
            act,
            top_k,
            router,
            selection_bias,
        };
        let [x, lg, d] = self
            .bufs
            .get_disjoint_mut([src as usize, logits as usize, dst as usize])
            .map_err(|e| e.to_string())?;
        self.moe.run(&self.pool, &run, x, lg, n, d);
        Ok(())
    }

    /// A matmul's weight and bias.
    fn weight(
        model: &Model,
        layer: Option<usize>,
        role: MatRole,
    ) -> Result<(&WeightMatrix, Option<&Vec<f32>>), String> {
        let w = model.matrix(layer, role).ok_or_else(|| {
            format!("the model has no {role:?} matrix here (or a layer matmul outside a layer)")
        })?;
        Ok((w, model.bias(layer, role)))
    }

    /// A norm's weight and (LayerNorm) bias.
    fn norm_weights(
        model: &Model,
        weight: NormWeight,
        layer: Option<usize>,
    ) -> Result<(&Vec<f32>, Option<&Vec<f32>>), String> {
        let lw = |l: usize| &model.layers[l];
        Ok(match (weight, layer) {
            (NormWeight::Embed, _) => (
                model
                    .embd_norm
                    .as_ref()
                    .ok_or("the model has no embedding norm")?,
                model.embd_norm_bias.as_ref(),
            ),
            (NormWeight::Attn, Some(l)) => (&lw(l).attn_norm, lw(l).attn_norm_bias.as_ref()),
            (NormWeight::Ffn, Some(l)) => (&lw(l).ffn_norm, lw(l).ffn_norm_bias.as_ref()),
            (NormWeight::AttnPost, Some(l)) => (
                lw(l)
                    .attn_post_norm
                    .as_ref()
                    .ok_or("the model has no attention output norm")?,
                None,
            ),
            (NormWeight::FfnPost, Some(l)) => (
                lw(l)
                    .ffn_post_norm
                    .as_ref()
                    .ok_or("the model has no feed-forward output norm")?,
                None,
            ),
            (NormWeight::Output, _) => (
                model
                    .output_norm
                    .as_ref()
                    .ok_or("the model has no final norm")?,
                None,
            ),
            _ => return Err("a layer norm outside a layer group".into()),
        })
    }

    /// One row per span of the batch from `src`'s rows of that span, into `pooled`.
    fn pool_rows(
        &mut self,
        src: Buf,
        pooling: flowrt_model::Pooling,
        batch: &Batch,
    ) -> Result<(), String> {
        let h = self.model.config.hidden_size;
        if src.width(&self.model.config) != h {
            return Err(format!("pooling {src:?}, which is not of the hidden width"));
        }
        let spans = batch.spans.len();
        if self.pooled.len() < spans * h {
            self.pooled.resize(spans * h, 0.0);
        }
        let x = &self.bufs[src as usize];
        let mut r0 = 0;
        for (i, sp) in batch.spans.iter().enumerate() {
            let out = &mut self.pooled[i * h..(i + 1) * h];
            let row = |r: usize| &x[r * h..(r + 1) * h];
            match pooling {
                flowrt_model::Pooling::Cls => out.copy_from_slice(row(r0)),
                flowrt_model::Pooling::Last => out.copy_from_slice(row(r0 + sp.len - 1)),
                flowrt_model::Pooling::Mean => {
                    out.fill(0.0);
                    for r in r0..r0 + sp.len {
                        self.kernels.add(out, row(r));
                    }
                    self.kernels.scale(out, 1.0 / sp.len as f32);
                }
            }
            r0 += sp.len;
        }
        self.n_pooled = spans;
        Ok(())
    }

    /// Pooled rows of the last batch (embedding plans): `(spans, hidden)`.
    pub fn embeddings(&self) -> &[f32] {
        &self.pooled[..self.n_pooled * self.model.config.hidden_size]
    }

    /// How activations are quantised for weights of type `ty` (`packed`: repacked into the
    /// x8 layout).
    fn act_rows(&self, ty: GgmlType, packed: bool) -> ActRows {
        ActRows::for_weight(self.act_quant, self.kernels, ty, packed)
    }

    /// `dst_j = src · W_jᵀ (+ bias_j)` for each item, as one parallel job over row blocks of
    /// all the matrices (they share the input and its quantisation).
    fn matmuls(
        &mut self,
        layer: Option<usize>,
        src: Buf,
        items: &[(Buf, MatRole)],
        batch: &Batch,
    ) -> Result<(), String> {
        let model = self.model.clone();
        let mut ws: [Option<WeightAndBias>; MAX_FUSED] = [None; MAX_FUSED];
        let mut packed: [Option<&[u8]>; MAX_FUSED] = [None; MAX_FUSED];
        for (j, &(_, role)) in items.iter().enumerate() {
            // Borrowed from the cloned `Arc`, so `self`'s buffers stay free below.
            ws[j] = Some(Self::weight(&model, layer, role)?);
            packed[j] = self.packed.get(layer, role);
        }
        let first = ws[0].expect("at least one matmul").0;
        let fmt = self.act_rows(first.dtype, packed[0].is_some());
        let fusable = items.len() > 1
            && ws[..items.len()].iter().zip(&packed).all(|(w, p)| {
                w.is_some_and(|(w, _)| {
                    w.cols == first.cols && self.act_rows(w.dtype, p.is_some()) == fmt
                })
            });
        if items.len() > 1 && !fusable {
            for &item in items {
                self.matmuls(layer, src, &[item], batch)?;
            }
            return Ok(());
        }
        let n = batch.tokens.len();
        let produces_logits = items[0].0 == Buf::Logits;
        // Which rows of `src` feed the matmul: all, or for the output projection those whose
        // logits are wanted (`logit_rows`; `r0 == usize::MAX` marks that selection).
        let (r0, nsel) = if produces_logits {
            if self.logit_rows.is_empty() {
                self.n_logit_rows = 0;
                return Ok(());
            }
            (usize::MAX, self.logit_rows.len())
        } else {
            (0, n)
        };
        let kdim = first.cols;
        // Row `t` of the selection: rows `r0..r0 + nsel`, or the logit rows.
        let logit_rows = &self.logit_rows;
        let row_of = |t: usize| {
            if r0 == usize::MAX {
                logit_rows[t]
            } else {
                r0 + t
            }
        };
        if let Some(stats) = self.input_stats.as_mut() {
            let s = &self.bufs[src as usize];
            let rows: Vec<&[f32]> = (0..nsel)
                .map(|t| {
                    let r = row_of(t);
                    &s[r * kdim..(r + 1) * kdim]
                })
                .collect();
            let roles: Vec<MatRole> = items.iter().map(|&(_, role)| role).collect();
            stats.add(
                self.kernels,
                layer,
                &roles,
                &rows,
                kdim,
                self.pool.n_threads(),
            );
        }
        let act_row = fmt.row_size(kdim);
        let kern = self.kernels;
        if self.quant_of != Some((src, fmt, r0, nsel)) {
            let need = nsel * act_row;
            if self.quant.len() < need {
                self.quant.resize(need, 0);
            }
            let s = &self.bufs[src as usize];
            for t in 0..nsel {
                let r = row_of(t);
                let row = &s[r * kdim..(r + 1) * kdim];
                fmt.quantize(kern, row, &mut self.quant[t * act_row..(t + 1) * act_row]);
            }
            self.quant_of = Some((src, fmt, r0, nsel));
        }
        if produces_logits {
            let out_len = nsel * first.rows;
            let lb = &mut self.bufs[Buf::Logits as usize];
            if lb.len() < out_len {
                lb.resize(out_len, 0.0);
            }
            self.n_logit_rows = nsel;
        }
        // Row blocks of every matrix, numbered consecutively.
        let total_rows: usize = ws[..items.len()].iter().flatten().map(|w| w.0.rows).sum();
        let rb = row_block(total_rows, self.pool.n_threads());
        let mut starts = [0usize; MAX_FUSED + 1];
        for (j, w) in ws[..items.len()].iter().flatten().enumerate() {
            starts[j + 1] = starts[j] + w.0.rows.div_ceil(rb);
        }
        let n_blocks = starts[items.len()];
        let block = |i: usize| {
            let j = (0..items.len()).rfind(|&j| starts[j] <= i).unwrap_or(0);
            let rows = ws[j].map_or(0, |w| w.0.rows);
            let b = i - starts[j];
            (j, b * rb, ((b + 1) * rb).min(rows))
        };
        let quant = &self.quant[..nsel * act_row];
        let per_thread = &self.per_thread;
        let job = |tid: usize, i: usize, wr: &mut ColumnWriter<'_, f32>| {
            let (j, c0, c1) = block(i);
            let Some((w, _)) = ws[j] else { return };
            let nr = c1 - c0;
            let mut scratch = per_thread[tid].lock().unwrap_or_else(|e| e.into_inner());
            let tile = &mut scratch.tile[..nsel * nr];
            fmt.matmul(kern, w, packed[j], c0, c1, quant, nsel, tile);
            for t in 0..nsel {
                wr.row(t).copy_from_slice(&tile[t * nr..(t + 1) * nr]);
            }
        };
        let len = |j: usize| nsel * ws[j].map_or(0, |w| w.0.rows);
        let strides: [usize; MAX_FUSED] = std::array::from_fn(|j| ws[j].map_or(1, |w| w.0.rows));
        match items {
            [(d0, _)] => {
                let [o0] = self
                    .bufs
                    .get_disjoint_mut([*d0 as usize])
                    .map_err(|e| e.to_string())?;
                self.pool.for_each_column_block(
                    [&mut o0[..len(0)]],
                    [strides[0]],
                    n_blocks,
                    &block,
                    &job,
                );
            }
            [(d0, _), (d1, _)] => {
                let [o0, o1] = self
                    .bufs
                    .get_disjoint_mut([*d0 as usize, *d1 as usize])
                    .map_err(|e| e.to_string())?;
                self.pool.for_each_column_block(
                    [&mut o0[..len(0)], &mut o1[..len(1)]],
                    [strides[0], strides[1]],
                    n_blocks,
                    &block,
                    &job,
                );
            }
            [(d0, _), (d1, _), (d2, _)] => {
                let [o0, o1, o2] = self
                    .bufs
                    .get_disjoint_mut([*d0 as usize, *d1 as usize, *d2 as usize])
                    .map_err(|e| e.to_string())?;
                self.pool.for_each_column_block(
                    [&mut o0[..len(0)], &mut o1[..len(1)], &mut o2[..len(2)]],
                    strides,
                    n_blocks,
                    &block,
                    &job,
                );
            }
            _ => {
                return Err(format!(
                    "{} fused matmuls (at most {MAX_FUSED})",
                    items.len()
                ))
            }
        }
        for (j, &(dst, _)) in items.iter().enumerate() {
            if let Some((w, Some(b))) = ws[j] {
                for row in self.bufs[dst as usize][..len(j)].chunks_exact_mut(w.rows) {
                    kern.add(row, b);
                }
            }
        }
        Ok(())
    }
}

/// Borrow buffer `a` shared and buffer `b` mutably (they must differ).
fn two_bufs(bufs: &mut [Vec<f32>; 12], a: Buf, b: Buf) -> (&[f32], &mut [f32]) {
    let [a, b] = bufs
        .get_disjoint_mut([a as usize, b as usize])
        .expect("an op reads and writes the same buffer");
    (a, b)
}

/// `x = x / sqrt(mean(x^2) + eps) * w`, as `Kernels::rms_norm` computes it (its sum of squares
/// is the table's `dot_f32`, SIMD where the table has it).
fn rms_norm_in_place(k: &Kernels, x: &mut [f32], w: &[f32], eps: f32) {
    let ss = k.dot_f32(x, x) / x.len().max(1) as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for (v, &wi) in x.iter_mut().zip(w) {
        *v *= inv * wi;
    }
}

impl BackendError {
    /// The dispatcher's view of the error.
    fn to_device(&self) -> DeviceError {
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

/// The CPU is a synchronous device: `submit` records the runlist, `wait` runs it on the
/// calling thread (and the pool), checking the deadline before each op.
impl Backend for CpuBackend {
    fn info(&self) -> BackendInfo {
        let paths = self.kernels.q16_paths();
        let (decode, prefill) = if self.act_quant == ActQuant::Q8 {
            let k = format!("{}-q8", self.kernels.name());
            (k.clone(), k)
        } else if self.packed.any_of_type(&self.model, |ty| {
            ActRows::for_weight(self.act_quant, self.kernels, ty, true) == ActRows::A8
        }) {
            // The A8 kernels are AVX2 code in every x86 table; the types without one (Q8_0,
            // Q6_K) keep the Q16 x8 path.
            let k = "avx2-x8-a8".to_string();
            (k.clone(), k)
        } else if self.packed_bytes() > 0 {
            (
                format!("{}-x8", paths.x8_decode),
                format!("{}-x8", paths.x8),
            )
        } else {
            let k = format!("{}-q16", paths.rows);
            (k.clone(), k)
        };
        BackendInfo {
            name: "cpu".into(),
            kernels: self.kernels.name().into(),
            matmul_decode: decode,
            matmul_prefill: prefill,
            threads: self.n_threads(),
            device: crate::cpu_name(),
            driver: None,
            memory_bytes: None,
            prepared_weight_bytes: self.packed_bytes() as u64,
            kv_cache_bytes: self.kv.bytes() as u64,
        }
    }

    fn default_max_runlist_layers(&self) -> Option<usize> {
        // No queue to overflow: the whole model in one runlist.
        None
    }

    fn rates(&self) -> DeviceRates {
        // Well below what a CPU with the SIMD kernels sustains (this 2-core Zen 4 VM: ~7 GB/s
        // weight streaming, ~100 GFLOP/s in prefill), times 10, so that only a stall misses.
        DeviceRates {
            bytes_per_s: 1e9,
            flops_per_s: 10e9,
            slack: 10.0,
            floor: Duration::from_secs(2),
        }
    }

    fn submit(&mut self, plan: &Plan, rl: &Runlist, batch: &Batch) -> Result<(), DeviceError> {
        if rl.groups.end > plan.groups.len() || rl.groups.is_empty() {
            return Err(DeviceError::Input(format!(
                "runlist groups {:?} outside the plan's {}",
                rl.groups,
                plan.groups.len()
            )));
        }
        if batch.tokens.len() > self.max_batch {
            return Err(DeviceError::Input(
                BackendError::BadBatch {
                    got: batch.tokens.len(),
                    max: self.max_batch,
                }
                .to_string(),
            ));
        }
        // Input errors are the request's, not the device's: found here, they are never
        // retried.
        let vocab = self.model.token_embd.rows;
        if let Some((index, &id)) = batch
            .tokens
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(DeviceError::Input(
                BackendError::BadToken { id, index, vocab }.to_string(),
            ));
        }
        for sp in batch.spans {
            let end = sp.pos0.saturating_add(sp.len);
            if end > self.kv.n_ctx {
                return Err(DeviceError::Input(
                    BackendError::ContextFull {
                        pos0: sp.pos0,
                        end,
                        n_ctx: self.kv.n_ctx,
                    }
                    .to_string(),
                ));
            }
        }
        batch
            .check(self.kv.n_seq, self.kv.n_ctx)
            .map_err(|e| DeviceError::Input(BackendError::BadSpans(e).to_string()))?;
        self.pending_tokens.clear();
        self.pending_tokens.extend_from_slice(batch.tokens);
        self.pending_spans.clear();
        self.pending_spans.extend_from_slice(batch.spans);
        self.pending = Some((rl.groups.clone(), batch.logits));
        Ok(())
    }

    fn wait(
        &mut self,
        plan: &Plan,
        deadline: Instant,
        trace: Option<&mut Trace>,
    ) -> Result<(), DeviceError> {
        let Some((groups, logits)) = self.pending.take() else {
            return Err(DeviceError::Input(
                "wait without a submitted runlist".into(),
            ));
        };
        let tokens = std::mem::take(&mut self.pending_tokens);
        let spans = std::mem::take(&mut self.pending_spans);
        let batch = Batch {
            tokens: &tokens,
            spans: &spans,
            logits,
        };
        let start = groups.start;
        let r = self.execute_watched(&plan.groups[groups], start, &batch, Some(deadline), trace);
        self.pending_tokens = tokens;
        self.pending_spans = spans;
        r.map_err(|e| e.to_device())
    }

    fn cancel(&mut self) {
        self.pending = None;
    }

    fn logits(&self) -> &[f32] {
        CpuBackend::logits(self)
    }

    fn embeddings(&self) -> &[f32] {
        CpuBackend::embeddings(self)
    }

    fn n_ctx(&self) -> usize {
        CpuBackend::n_ctx(self)
    }

    fn max_batch(&self) -> usize {
        CpuBackend::max_batch(self)
    }

    fn n_seq(&self) -> usize {
        self.kv.n_seq
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn collect_input_stats(
        &mut self,
        what: Option<flowrt_dispatch::InputStatKind>,
    ) -> Result<(), String> {
        self.input_stats = what.map(input_stats::InputStats::new);
        Ok(())
    }
    fn take_input_stats(&mut self) -> Vec<flowrt_dispatch::InputStat> {
        match self.input_stats.as_mut() {
            Some(s) => std::mem::replace(s, input_stats::InputStats::new(s.kind())).take(),
            None => Vec::new(),
        }
    }
    fn read_activation(&mut self, buf: Buf, rows: usize) -> Result<Vec<f32>, String> {
        if buf == Buf::Logits {
            return Ok(self.logits().to_vec());
        }
        let width = buf.width(&self.model.config);
        let b = &self.bufs[buf as usize];
        if rows > self.max_batch || rows * width > b.len() {
            return Err(format!(
                "{rows} rows of {buf:?} asked for; the backend holds {}",
                self.max_batch
            ));
        }
        Ok(b[..rows * width].to_vec())
    }

    fn write_activation(&mut self, buf: Buf, values: &[f32]) -> Result<(), String> {
        let width = buf.width(&self.model.config);
        let b = &mut self.bufs[buf as usize];
        if buf == Buf::Logits
            || width == 0
            || !values.len().is_multiple_of(width)
            || values.len() / width > self.max_batch
            || values.len() > b.len()
        {
            return Err(format!(
                "cannot write {} values into {buf:?} (rows of {width}, at most {} rows)",
                values.len(),
                self.max_batch
            ));
        }
        b[..values.len()].copy_from_slice(values);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(options: &[(&str, &str)]) -> BackendSettings {
        BackendSettings {
            options: options
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..BackendSettings::default()
        }
    }

    #[test]
    fn settings_map_to_cpu_options() {
        let o = CpuOptions::from_settings(&BackendSettings {
            threads: 3,
            n_ctx: 100,
            n_seq: 2,
            max_batch: 7,
            kv: KvPrecision::F32,
            device: Some(0),
            options: Vec::new(),
        })
        .unwrap();
        assert_eq!((o.threads, o.n_ctx, o.n_seq, o.max_batch), (3, 100, 2, 7));
        assert_eq!(o.kv_type, KvType::F32);
        // The defaults: best kernels (decided at creation), Q16, repacked, automatic split.
        assert!(o.kernels.is_none());
        assert_eq!(o.act_quant, ActQuant::Q16);
        assert!(o.repack);
        assert_eq!(o.attn_split, AttnSplit::Auto);
        let o = CpuOptions::from_settings(&BackendSettings::default()).unwrap();
        assert_eq!(
            o.threads,
            crate::physical_cores(),
            "threads 0: physical cores"
        );
        assert_eq!(o.kv_type, KvType::F16);

        let o = CpuOptions::from_settings(&settings(&[
            ("kernels", "scalar"),
            ("act-quant", "q8"),
            ("repack", "false"),
            ("attn-split", "3"),
        ]))
        .unwrap();
        assert_eq!(o.kernels.map(|k| k.name()), Some("scalar"));
        assert_eq!(o.act_quant, ActQuant::Q8);
        assert!(!o.repack);
        assert_eq!(o.attn_split, AttnSplit::Parts(3));
        for (v, want) in [("off", AttnSplit::Off), ("auto", AttnSplit::Auto)] {
            let o = CpuOptions::from_settings(&settings(&[("attn-split", v)])).unwrap();
            assert_eq!(o.attn_split, want);
            assert_eq!(want.to_string(), v);
        }
    }

    #[test]
    fn bad_settings_are_named() {
        let e = CpuOptions::from_settings(&settings(&[("kernels", "avx2"), ("colour", "red")]))
            .unwrap_err();
        assert!(matches!(e, BackendError::UnknownSetting(_)), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("`colour`"), "{msg}");
        for name in CPU_OPTIONS {
            assert!(msg.contains(name), "{msg} lacks {name}");
        }
        for (name, value) in [
            ("kernels", "sse9"),
            ("act-quant", "q4"),
            ("repack", "yes"),
            ("attn-split", "0"),
            ("attn-split", "many"),
        ] {
            let e = CpuOptions::from_settings(&settings(&[(name, value)])).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("`{name}={value}`")), "{msg}");
        }
        let e = CpuOptions::from_settings(&BackendSettings {
            device: Some(2),
            ..BackendSettings::default()
        })
        .unwrap_err();
        assert!(
            matches!(e, BackendError::NoSuchDevice { index: 2 }),
            "{e:?}"
        );
    }
}
