//! Executes command groups on the CPU: the backend's state ([`CpuBackend`]) and its ops, one
//! arm of [`CpuBackend::run_op`] per plan op. Beside it: the matmul driver (`matmul`), attention,
//! the short convolution, input statistics, the settings (`options`), the errors (`error`) and
//! the dispatcher's view of the backend (`device`).

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use flowrt_dispatch::{BackendSettings, Trace};

use flowrt_dtype::GgmlType;
use flowrt_kernels::Kernels;
use flowrt_model::plan::{Buf, CommandGroup, GroupKind, MatRole, NormWeight, Op};
use flowrt_model::{Model, WeightMatrix};

pub use crate::act::ActQuant;
use crate::act::ActRows;
use crate::kv::{self, as_f16_mut, KvCache, KvStore, KvType};
use crate::packed::PackedWeights;
use crate::pool::ThreadPool;
use crate::rope::RopeTable;

mod attention;
mod device;
mod error;
mod input_stats;
mod matmul;
mod options;
mod short_conv;
pub use attention::AttnSplit;
pub use error::BackendError;
pub(crate) use matmul::row_block;
use matmul::{MAX_FUSED, MAX_ROW_BLOCK};
pub use options::{CpuOptions, CPU_OPTIONS};

pub use flowrt_dispatch::{Batch, LogitsWanted, SeqSpan};

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
        batch.check_for(
            self.kv.n_seq,
            self.kv.n_ctx,
            self.max_batch,
            self.model.token_embd.rows,
        )?;
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
                // Every id is below `emb.rows`: `execute_watched` checked the batch.
                for (t, &id) in batch.tokens.iter().enumerate() {
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
                    k.softcap(logits, cap);
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
