//! The model's tensors, bound to roles and checked against the config.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowrt_dtype::GgmlType;
use flowrt_gguf::GgufFile;
use half::{bf16, f16};

use crate::arch::{ArchSpec, HfExperts, NormKind, NormPosition, Positions, TensorNames};
use crate::config::{file_name, ModelConfig};
use crate::error::ModelError;
use crate::names::TensorRole;
use crate::plan::MatRole;
use crate::rope::RopeScaling;
use crate::safetensors_dir::SafetensorsDir;

/// Where a weight's bytes live.
#[derive(Debug, Clone)]
pub enum WeightData {
    /// A tensor of a memory-mapped GGUF file.
    Gguf { file: Arc<GgufFile>, tensor: usize },
    /// A byte range of a memory-mapped safetensors shard.
    Safetensors {
        dir: Arc<SafetensorsDir>,
        shard: usize,
        start: usize,
        end: usize,
    },
    /// Bytes owned by the process (converted or quantised at load).
    Owned(Arc<Vec<u8>>),
    /// Bytes `start..end` of another weight's bytes: one expert's matrix of a 3-D tensor, or
    /// a row range of a fused one (Q/K/V, gate/up).
    Slice {
        of: Box<WeightData>,
        start: usize,
        end: usize,
    },
    /// MXFP4 rows in ggml's block layout read from a mapped checkpoint's `*_blocks` and
    /// `*_scales` (OpenAI's layout), made whole only when asked for (see [`Mxfp4Rows`]).
    Mxfp4(Arc<Mxfp4Rows>),
}

/// Appends one row of OpenAI's MXFP4 layout (`blocks`: 16 bytes a block, element `2k` in the
/// low nibble of byte `k` and `2k + 1` in its high one; `scales`: an E8M0 exponent byte a
/// block) in ggml's MXFP4 blocks: per block the exponent byte, then element `j` in the low
/// nibble of byte `j` and `j + 16` in its high one. The same codes and exponents, repacked:
/// the values are unchanged.
pub fn mxfp4_row_to_ggml(blocks: &[u8], scales: &[u8], out: &mut Vec<u8>) {
    for (b, &s) in blocks.chunks_exact(16).zip(scales) {
        let code = |j: usize| (b[j / 2] >> (4 * (j % 2))) & 0x0F;
        out.push(s);
        out.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
    }
}

/// An MXFP4 matrix stored as OpenAI ships gpt-oss's experts: `blocks` (16 bytes a block,
/// element `2k` in the low nibble of byte `k`, `2k + 1` in its high one) and `scales` (an E8M0
/// exponent byte a block), rows of `groups` blocks, output row `r` at file row
/// `first + step · r`. A backend that repacks its weights reads rows through
/// [`WeightData::read`] (made a chunk at a time, so no whole row-layout copy is held); the
/// whole ggml-layout matrix is made on the first [`WeightData::bytes`] and kept, and the file's
/// pages are then let go.
pub struct Mxfp4Rows {
    blocks: WeightData,
    scales: WeightData,
    first: usize,
    step: usize,
    rows: usize,
    groups: usize,
    made: std::sync::OnceLock<Vec<u8>>,
}

impl std::fmt::Debug for Mxfp4Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mxfp4Rows")
            .field("first", &self.first)
            .field("step", &self.step)
            .field("rows", &self.rows)
            .field("groups", &self.groups)
            .field("made", &self.made.get().is_some())
            .finish()
    }
}

impl Mxfp4Rows {
    /// Bytes of one ggml MXFP4 block: the exponent byte, then 16 bytes of codes.
    const BLOCK: usize = 17;

    /// Appends rows `r0..r1` in ggml's layout: per block the exponent byte, then element `j`
    /// in the low nibble of byte `j` and `j + 16` in its high one (the same codes and
    /// exponents, repacked; no value changes).
    fn write_rows(&self, r0: usize, r1: usize, out: &mut Vec<u8>) {
        let (blocks, scales) = (self.blocks.bytes(), self.scales.bytes());
        let g = self.groups;
        for r in r0..r1 {
            let at = (self.first + self.step * r) * g;
            mxfp4_row_to_ggml(&blocks[at * 16..(at + g) * 16], &scales[at..at + g], out);
        }
    }

    /// The whole matrix in ggml's layout, made on first use.
    fn bytes(&self) -> &[u8] {
        self.made.get_or_init(|| {
            let mut v = Vec::with_capacity(self.rows * self.groups * Self::BLOCK);
            self.write_rows(0, self.rows, &mut v);
            // The copy replaces the file's bytes: let their pages leave the resident set.
            self.release_source(0, self.rows);
            v
        })
    }

    /// Lets the file pages behind rows `r0..r1` leave the resident set.
    fn release_source(&self, r0: usize, r1: usize) {
        if r1 <= r0 {
            return;
        }
        let g = self.groups;
        let (a, b) = (
            self.first + self.step * r0,
            self.first + self.step * (r1 - 1) + 1,
        );
        self.blocks.release_range(a * g * 16, (b - a) * g * 16);
        self.scales.release_range(a * g, (b - a) * g);
    }

    /// Whether the whole matrix was made (by [`WeightData::bytes`]).
    pub fn is_made(&self) -> bool {
        self.made.get().is_some()
    }
}

impl WeightData {
    pub fn bytes(&self) -> &[u8] {
        match self {
            WeightData::Gguf { file, tensor } => file.tensor_data(&file.tensors()[*tensor]),
            WeightData::Safetensors {
                dir,
                shard,
                start,
                end,
            } => &dir.maps[*shard][*start..*end],
            WeightData::Owned(v) => v,
            WeightData::Slice { of, start, end } => &of.bytes()[*start..*end],
            WeightData::Mxfp4(m) => m.bytes(),
        }
    }

    /// Bytes `offset..offset + len` (whole rows for [`WeightData::Mxfp4`]), without making a
    /// whole copy: a view of the stored or already made bytes, else made into `scratch`. A
    /// backend that keeps its own copy of the weights reads them through this, so that the
    /// process holds them once.
    pub fn read<'a>(&'a self, offset: usize, len: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        match self {
            WeightData::Mxfp4(m) if !m.is_made() => {
                let rb = m.groups * Mxfp4Rows::BLOCK;
                scratch.clear();
                m.write_rows(offset / rb, (offset + len) / rb, scratch);
                scratch
            }
            WeightData::Slice { of, start, .. } if matches!(**of, WeightData::Mxfp4(_)) => {
                of.read(start + offset, len, scratch)
            }
            _ => &self.bytes()[offset..offset + len],
        }
    }

    /// Whether the bytes are not held by the process: a view of a memory-mapped file, or
    /// made from one on demand and not made yet. A backend repacking these (through
    /// [`WeightData::read`], then [`WeightData::release_range`]) holds them once.
    pub fn is_mapped(&self) -> bool {
        match self {
            WeightData::Owned(_) => false,
            WeightData::Slice { of, .. } => of.is_mapped(),
            WeightData::Mxfp4(m) => !m.is_made(),
            _ => true,
        }
    }

    /// Lets the file pages behind bytes `offset..offset + len` leave the resident set (they
    /// are read from the file again if touched): for a backend that keeps its own copy. Owned
    /// bytes stay.
    pub fn release_range(&self, offset: usize, len: usize) {
        match self {
            WeightData::Slice { of, start, end } => {
                let len = len.min(end.saturating_sub(start + offset));
                of.release_range(start + offset, len)
            }
            WeightData::Gguf { file, tensor } => {
                let t = &file.tensors()[*tensor];
                let start = file.data_offset().saturating_add(t.offset) as usize;
                let len = len.min((t.size_bytes as usize).saturating_sub(offset));
                file.release(start.saturating_add(offset), len);
            }
            WeightData::Safetensors {
                dir,
                shard,
                start,
                end,
            } => {
                let a = start.saturating_add(offset).min(*end);
                let b = a.saturating_add(len).min(*end);
                dir.release(&dir.maps[*shard][a..b]);
            }
            WeightData::Mxfp4(m) if !m.is_made() => {
                let rb = m.groups * Mxfp4Rows::BLOCK;
                m.release_source(offset / rb, (offset + len).div_ceil(rb).min(m.rows));
            }
            WeightData::Owned(_) | WeightData::Mxfp4(_) => {}
        }
    }
}

/// Whether `pattern` of a `modules_to_not_convert` list names `module` or a module above it:
/// `*` matches any run of characters (`model.layers.*.self_attn`), and a pattern naming a
/// module names everything under it (`model.layers.0.mlp` lists `model.layers.0.mlp.experts`).
fn module_listed(pattern: &str, module: &str) -> bool {
    let m = module.as_bytes();
    // at[k]: the pattern read so far matches `m[..k]` (linear in each pattern byte).
    let mut at = vec![false; m.len() + 1];
    at[0] = true;
    for &c in pattern.as_bytes() {
        if c == b'*' {
            if let Some(first) = at.iter().position(|&x| x) {
                at[first..].fill(true);
            }
        } else {
            for k in (0..m.len()).rev() {
                at[k + 1] = at[k] && m[k] == c;
            }
            at[0] = false;
        }
    }
    (0..=m.len()).any(|k| at[k] && (k == m.len() || m[k] == b'.'))
}

/// One layer's experts as the binder returns them: every expert's gate, up and down matrices,
/// then the gate and up biases (`n × ff` each) of families with them.
type ExpertMatrices = (
    Vec<WeightMatrix>,
    Vec<WeightMatrix>,
    Vec<WeightMatrix>,
    Option<Vec<f32>>,
    Option<Vec<f32>>,
);

/// A 2-D weight: `rows` output features, each a row of `cols` input features in `dtype`.
#[derive(Debug, Clone)]
pub struct WeightMatrix {
    pub name: String,
    pub dtype: GgmlType,
    /// Output features (ggml `ne[1]`).
    pub rows: usize,
    /// Input features (ggml `ne[0]`), contiguous in memory.
    pub cols: usize,
    /// Bytes of one row.
    pub row_bytes: usize,
    pub data: WeightData,
}

impl WeightMatrix {
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// The bytes of rows `r0..r1`.
    pub fn rows_bytes(&self, r0: usize, r1: usize) -> &[u8] {
        &self.bytes()[r0 * self.row_bytes..r1 * self.row_bytes]
    }

    /// Rows `r0..r1` as a matrix of their own, named `name`: a view of the same bytes (rows
    /// are whole blocks in every quantised type, so a row range is a byte range).
    pub fn row_range(&self, name: String, r0: usize, r1: usize) -> WeightMatrix {
        let data = WeightData::Slice {
            of: Box::new(self.data.clone()),
            start: r0 * self.row_bytes,
            end: r1 * self.row_bytes,
        };
        WeightMatrix {
            name,
            dtype: self.dtype,
            rows: r1 - r0,
            cols: self.cols,
            row_bytes: self.row_bytes,
            data,
        }
    }
}

/// The weights of one layer. Shapes are `[rows (out), cols (in)]`.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// The attention block's norm: on its input (pre-norm) or after its residual add
    /// (post-norm families).
    pub attn_norm: Vec<f32>, // (hidden)
    pub attn_norm_bias: Option<Vec<f32>>, // (hidden) LayerNorm families only
    /// Q, K, V and O: attention layers only (`None` on a short convolution layer).
    pub wq: Option<WeightMatrix>, // (q_dim, hidden)
    pub wk: Option<WeightMatrix>,         // (kv_dim, hidden)
    pub wv: Option<WeightMatrix>,         // (kv_dim, hidden)
    pub bq: Option<Vec<f32>>,             // (q_dim)
    pub bk: Option<Vec<f32>>,             // (kv_dim)
    pub bv: Option<Vec<f32>>,             // (kv_dim)
    pub q_norm: Option<Vec<f32>>,         // (head_dim)
    pub k_norm: Option<Vec<f32>>,         // (head_dim)
    pub wo: Option<WeightMatrix>,         // (hidden, q_dim)
    pub bo: Option<Vec<f32>>,             // (hidden) families with dense biases
    pub attn_post_norm: Option<Vec<f32>>, // (hidden) sandwich norms only
    /// The feed-forward block's norm, placed as `attn_norm` is.
    pub ffn_norm: Vec<f32>, // (hidden)
    pub ffn_norm_bias: Option<Vec<f32>>,  // (hidden) LayerNorm families only
    pub w_gate: Option<WeightMatrix>,     // (intermediate, hidden) gated feed-forward only
    pub w_up: Option<WeightMatrix>,       // (intermediate, hidden) dense layers only
    pub b_up: Option<Vec<f32>>,           // (intermediate) families with dense biases
    pub w_down: Option<WeightMatrix>,     // (hidden, intermediate) dense layers only
    pub b_down: Option<Vec<f32>>,         // (hidden) families with dense biases
    pub ffn_post_norm: Option<Vec<f32>>,  // (hidden) sandwich norms only
    /// Attention sinks: one logit per query head (families with them).
    pub sinks: Option<Vec<f32>>, // (num_attention_heads)
    /// The experts of a sparse (mixture-of-experts) layer, in place of `w_gate`/`w_up`/`w_down`.
    pub moe: Option<MoeWeights>,
    /// The short gated convolution of a hybrid model's convolution layer, in place of
    /// attention.
    pub conv: Option<ShortConvWeights>,
}

/// One short convolution layer's weights (see [`crate::ShortConvConfig`]).
#[derive(Debug, Clone)]
pub struct ShortConvWeights {
    /// `(3 × hidden, hidden)`: B's rows, then C's, then x's.
    pub in_proj: WeightMatrix,
    /// `(hidden, kernel)` depthwise taps, channel-major: `kernel[c · k + j]` weighs position
    /// `p - (k - 1) + j` of channel `c` (as `torch.nn.Conv1d` stores them).
    pub kernel: Vec<f32>,
    /// `(hidden, hidden)`.
    pub out_proj: WeightMatrix,
    /// Biases of a convolution layer with them ([`crate::ShortConvConfig::bias`], LFM2
    /// `conv_bias`): `in_proj`'s `(3 × hidden)`, the convolution's `(hidden)`, added to each
    /// channel's sum before the C gate, `out_proj`'s `(hidden)`.
    pub in_bias: Option<Vec<f32>>,
    pub kernel_bias: Option<Vec<f32>>,
    pub out_bias: Option<Vec<f32>>,
}

/// The router and experts of one mixture-of-experts layer. Each expert's matrix is its own
/// [`WeightMatrix`] in its stored type (for GGUF, a slice of the 3-D tensor).
#[derive(Debug, Clone)]
pub struct MoeWeights {
    pub router: WeightMatrix,    // (num_experts, hidden)
    pub gate: Vec<WeightMatrix>, // num_experts × (moe_intermediate, hidden)
    pub up: Vec<WeightMatrix>,   // num_experts × (moe_intermediate, hidden)
    pub down: Vec<WeightMatrix>, // num_experts × (hidden, moe_intermediate)
    /// Biases of families with them ([`ArchSpec::moe_bias`]): the router's `(num_experts)`,
    /// and every expert's gate and up `(num_experts × moe_intermediate)` and down
    /// `(num_experts × hidden)`, expert after expert.
    pub router_bias: Option<Vec<f32>>,
    pub gate_bias: Option<Vec<f32>>,
    pub up_bias: Option<Vec<f32>>,
    pub down_bias: Option<Vec<f32>>,
    /// The router's selection bias ([`crate::Router::selection_bias`]), `(num_experts)`:
    /// added to the scores to choose the top-k, not to weight them.
    pub selection_bias: Option<Vec<f32>>,
}

impl MoeWeights {
    /// Every expert matrix (gate, up, down of expert 0, then of expert 1, ...).
    pub fn experts(&self) -> impl Iterator<Item = &WeightMatrix> {
        (0..self.gate.len()).flat_map(|e| [&self.gate[e], &self.up[e], &self.down[e]])
    }
}

impl LayerWeights {
    /// Every matrix of the layer, in role order (Q, K, V, O, gate, up, down; for a sparse
    /// layer the router and then every expert's matrices).
    pub fn matrices(&self) -> impl Iterator<Item = &WeightMatrix> {
        [&self.wq, &self.wk, &self.wv, &self.wo]
            .into_iter()
            .flatten()
            .chain(self.conv.iter().flat_map(|c| [&c.in_proj, &c.out_proj]))
            .chain(self.w_gate.as_ref())
            .chain(self.w_up.as_ref())
            .chain(self.w_down.as_ref())
            .chain(
                self.moe
                    .iter()
                    .flat_map(|m| std::iter::once(&m.router).chain(m.experts())),
            )
    }
}

/// What a model was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    /// A Hugging Face checkpoint directory (safetensors).
    HfDir,
}

/// How to load weights.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Quantise every float matrix to this type while loading (Q4_0, Q4_1 or Q8_0).
    pub quant: Option<GgmlType>,
}

/// Types [`LoadOptions::quant`] accepts.
pub const LOAD_QUANT_TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

/// A loaded model: config plus every weight, ready for a backend.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    /// The file or directory the model came from.
    pub path: PathBuf,
    pub format: ModelFormat,
    pub token_embd: WeightMatrix, // (vocab, hidden)
    /// Learned absolute positions (families with them).
    pub pos_embd: Option<WeightMatrix>, // (max_position_embeddings, hidden)
    /// Token-type embeddings (families with them).
    pub token_types: Option<WeightMatrix>, // (type_vocab_size, hidden)
    /// Norm over the embeddings, and its bias (families with them).
    pub embd_norm: Option<Vec<f32>>, // (hidden)
    pub embd_norm_bias: Option<Vec<f32>>, // (hidden)
    /// Final norm (pre-norm families; post-norm ones end each layer normalised).
    pub output_norm: Option<Vec<f32>>, // (hidden)
    /// Output projection (families that generate); the same bytes as `token_embd` when the
    /// embeddings are tied. `None`: the model only embeds.
    pub output: Option<WeightMatrix>, // (vocab, hidden)
    pub tied_embeddings: bool,
    pub layers: Vec<LayerWeights>,
}

/// A tensor found in a source, before its shape is checked.
struct Found {
    name: String,
    /// ggml order: `dims[0]` is the contiguous dimension.
    dims: Vec<u64>,
    dtype: Result<GgmlType, String>,
    data: WeightData,
}

/// Where tensors come from.
enum Source {
    Gguf(Arc<GgufFile>),
    Hf {
        st: Arc<SafetensorsDir>,
        /// Prefix of the decoder's tensors (`model.`, or `model.language_model.` in
        /// multimodal checkpoints).
        prefix: String,
        /// Prefix of the output projection (``, or `language_model.`).
        head_prefix: String,
    },
}

impl Source {
    fn name(&self, arch: &ArchSpec, role: TensorRole, layer: usize) -> Option<String> {
        match self {
            Source::Gguf(_) => Some(role.gguf_name_in(arch, layer)),
            Source::Hf {
                prefix,
                head_prefix,
                ..
            } => {
                let n = role.hf_name(arch, layer)?;
                Some(if role.hf_in_decoder() {
                    format!("{prefix}{n}")
                } else {
                    format!("{head_prefix}{n}")
                })
            }
        }
    }

    /// Every tensor name the source holds.
    fn names(&self) -> Vec<&str> {
        match self {
            Source::Gguf(file) => file.tensors().iter().map(|t| t.name.as_str()).collect(),
            Source::Hf { st, .. } => st.tensors.keys().map(String::as_str).collect(),
        }
    }

    fn find(&self, name: &str) -> Option<Found> {
        match self {
            Source::Gguf(file) => {
                let i = file.tensors().iter().position(|t| t.name == name)?;
                let t = &file.tensors()[i];
                Some(Found {
                    name: name.to_string(),
                    dims: t.dims.clone(),
                    dtype: Ok(t.ggml_type),
                    data: WeightData::Gguf {
                        file: file.clone(),
                        tensor: i,
                    },
                })
            }
            Source::Hf { st, .. } => {
                let e = st.tensors.get(name)?;
                Some(Found {
                    name: name.to_string(),
                    dims: e.shape.iter().rev().map(|&d| d as u64).collect(),
                    dtype: e.dtype.clone(),
                    data: WeightData::Safetensors {
                        dir: st.clone(),
                        shard: e.shard,
                        start: e.start,
                        end: e.end,
                    },
                })
            }
        }
    }
}

/// Collects every problem with a model's tensors before failing, so one error lists them all.
struct Binder<'a> {
    source: &'a Source,
    arch: &'static ArchSpec,
    opts: LoadOptions,
    /// Added to every norm weight (HF Gemma stores `w` of `x · (1 + w)`).
    norm_offset: f32,
    /// Names of the tensors looked up (bound or found wanting).
    used: HashSet<String>,
    problems: Vec<String>,
    /// An MXFP4 checkpoint's `modules_to_not_convert` ([`ModelConfig::hf_mxfp4`]).
    mxfp4: Option<Vec<String>>,
}

impl Binder<'_> {
    fn find(&mut self, role: TensorRole, layer: usize) -> Option<Found> {
        let Some(name) = self.source.name(self.arch, role, layer) else {
            self.problems
                .push(format!("{role:?} has no name in this format"));
            return None;
        };
        let found = self.source.find(&name);
        if found.is_none() {
            self.problems.push(format!("missing tensor `{name}`"));
        }
        self.used.insert(name);
        found
    }

    /// Tensors of the source that no role of the family took: a file whose family is
    /// mislabelled (e.g. a Qwen3 checkpoint declared as Llama, leaving its QK-norm weights
    /// unused) must not run under the wrong rules.
    fn check_all_used(&mut self) {
        let mut unused: Vec<&str> = self
            .source
            .names()
            .into_iter()
            // Buffers some checkpoints save that carry no weights.
            .filter(|n| !n.ends_with("rotary_emb.inv_freq") && !self.used.contains(*n))
            .collect();
        if unused.is_empty() {
            return;
        }
        unused.sort_unstable();
        let n = unused.len();
        let shown = unused[..n.min(8)].join("`, `");
        let more = if n > 8 {
            format!(" and {} more", n - 8)
        } else {
            String::new()
        };
        self.problems.push(format!(
            "{n} tensor(s) that the `{}` family does not use: `{shown}`{more} (is the architecture declared correctly?)",
            self.arch.name
        ));
    }

    fn exists(&self, role: TensorRole, layer: usize) -> bool {
        self.source
            .name(self.arch, role, layer)
            .is_some_and(|n| self.source.find(&n).is_some())
    }

    fn matrix(
        &mut self,
        role: TensorRole,
        layer: usize,
        rows: usize,
        cols: usize,
    ) -> Option<WeightMatrix> {
        let t = self.find(role, layer)?;
        self.shaped_matrix(t, rows, cols)
    }

    /// A matrix from tensor `t` when its shape is `(rows, cols)`, else a problem naming both.
    fn shaped_matrix(&mut self, t: Found, rows: usize, cols: usize) -> Option<WeightMatrix> {
        if t.dims != [cols as u64, rows as u64] {
            self.problems.push(format!(
                "tensor `{}` has shape {:?}, expected [{cols}, {rows}] (ggml order: input features first)",
                t.name, t.dims
            ));
            return None;
        }
        self.finish_matrix(t.name, t.dtype, rows, cols, t.data)
    }

    /// The experts' matrices of an experts role in `layer`, each `(rows, cols)`: the slices
    /// of a 3-D GGUF tensor `[cols, rows, n]`, or one HF tensor per expert. A count of experts
    /// other than `n` is a problem naming the config's expert count.
    fn experts(
        &mut self,
        role: TensorRole,
        layer: usize,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Option<Vec<WeightMatrix>> {
        match self.source {
            Source::Gguf(_) => {
                let t = self.find(role, layer)?;
                let name = t.name;
                if t.dims.len() == 3
                    && t.dims[..2] == [cols as u64, rows as u64]
                    && t.dims[2] != n as u64
                {
                    self.problems.push(format!(
                        "tensor `{name}` holds {} experts but the expert count (num_experts) is {n}",
                        t.dims[2]
                    ));
                    return None;
                }
                if t.dims != [cols as u64, rows as u64, n as u64] {
                    self.problems.push(format!(
                        "tensor `{name}` has shape {:?}, expected [{cols}, {rows}, {n}] (ggml order: input features first, then one matrix per expert)",
                        t.dims
                    ));
                    return None;
                }
                let per = match &t.dtype {
                    Ok(d) => match d.row_size(cols as u64) {
                        Ok(b) => b as usize * rows,
                        Err(e) => {
                            self.problems.push(format!("tensor `{name}`: {e}"));
                            return None;
                        }
                    },
                    Err(_) => 0,
                };
                (0..n)
                    .map(|e| {
                        let data = WeightData::Slice {
                            of: Box::new(t.data.clone()),
                            start: e * per,
                            end: (e + 1) * per,
                        };
                        self.finish_matrix(
                            format!("{name}[{e}]"),
                            t.dtype.clone(),
                            rows,
                            cols,
                            data,
                        )
                    })
                    .collect()
            }
            Source::Hf { prefix, .. } => {
                let name = |e: usize| {
                    role.hf_expert_name_in(self.arch, layer, e)
                        .map(|n| format!("{prefix}{n}"))
                };
                let present = |e: usize| name(e).is_some_and(|n| self.source.find(&n).is_some());
                let found = (0..).take_while(|&e| present(e)).count();
                if found != n {
                    let which = if found < n {
                        format!("`{}` is missing", name(found).unwrap_or_default())
                    } else {
                        format!("up to `{}`", name(found - 1).unwrap_or_default())
                    };
                    self.problems.push(format!(
                        "layer {layer} has {found} experts ({which}) but the expert count (num_experts) is {n}"
                    ));
                    for e in 0..found {
                        if let Some(nm) = name(e) {
                            self.used.insert(nm);
                        }
                    }
                    return None;
                }
                (0..n)
                    .map(|e| {
                        let nm = name(e)?;
                        self.used.insert(nm.clone());
                        let t = self.source.find(&nm)?;
                        self.shaped_matrix(t, rows, cols)
                    })
                    .collect()
            }
        }
    }

    /// A matrix from a tensor whose shape was checked: its type, row size and (if asked)
    /// quantisation on load.
    fn finish_matrix(
        &mut self,
        name: String,
        dtype: Result<GgmlType, String>,
        rows: usize,
        cols: usize,
        data: WeightData,
    ) -> Option<WeightMatrix> {
        let t = Found {
            name: name.clone(),
            dims: Vec::new(),
            dtype,
            data,
        };
        let dtype = match t.dtype {
            Ok(d) => d,
            Err(ty) => {
                self.problems.push(format!(
                    "tensor `{name}` has element type {ty}, which flowrt cannot use"
                ));
                return None;
            }
        };
        let row_bytes = match dtype.row_size(cols as u64) {
            Ok(b) => b as usize,
            Err(e) => {
                self.problems.push(format!("tensor `{name}`: {e}"));
                return None;
            }
        };
        let m = WeightMatrix {
            name,
            dtype,
            rows,
            cols,
            row_bytes,
            data: t.data,
        };
        match self.opts.quant {
            Some(q) if matches!(dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => {
                match quantize_matrix(&m, q) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        self.problems.push(e);
                        None
                    }
                }
            }
            _ => Some(m),
        }
    }

    fn vector(&mut self, role: TensorRole, layer: usize, len: usize) -> Option<Vec<f32>> {
        self.sized_vector(role, layer, len, None)
    }

    /// A vector of `len` values; `what` names the config field that sizes it, for the error
    /// when the tensor disagrees.
    fn sized_vector(
        &mut self,
        role: TensorRole,
        layer: usize,
        len: usize,
        what: Option<&str>,
    ) -> Option<Vec<f32>> {
        let t = self.find(role, layer)?;
        if t.dims != [len as u64] {
            let why = what.map_or(String::new(), |w| format!(" ({w} = {len})"));
            self.problems.push(format!(
                "tensor `{}` has shape {:?}, expected [{len}]{why}",
                t.name, t.dims
            ));
            return None;
        }
        let mut v = self.floats(&t)?;
        if role.is_norm() && self.norm_offset != 0.0 {
            v.iter_mut().for_each(|x| *x += self.norm_offset);
        }
        Some(v)
    }

    /// A `(rows, cols)` table of float values (per-expert biases), row after row.
    fn table(
        &mut self,
        role: TensorRole,
        layer: usize,
        rows: usize,
        cols: usize,
    ) -> Option<Vec<f32>> {
        let t = self.find(role, layer)?;
        if t.dims != [cols as u64, rows as u64] {
            self.problems.push(format!(
                "tensor `{}` has shape {:?}, expected [{cols}, {rows}] (ggml order: one row of {cols} per expert)",
                t.name, t.dims
            ));
            return None;
        }
        self.floats(&t)
    }

    /// A short convolution's depthwise kernel, `(hidden, kernel)` channel-major: HF stores it
    /// `(hidden, 1, kernel)`, GGUF `[kernel, hidden]` (ggml order). A kernel length other than
    /// the config's is a problem naming `conv_L_cache`.
    fn conv_kernel(&mut self, layer: usize, h: usize, k: usize) -> Option<Vec<f32>> {
        let t = self.find(TensorRole::ShortConvKernel, layer)?;
        let (len, rest) = match t.dims.split_first() {
            Some((&len, rest)) => (len, rest),
            None => (0, &[][..]),
        };
        let channels_fit = rest == [h as u64] || rest == [1, h as u64];
        if channels_fit && len != k as u64 {
            self.problems.push(format!(
                "tensor `{}` holds a kernel of {len} positions but conv_L_cache (the convolution kernel size) is {k}",
                t.name
            ));
            return None;
        }
        if !channels_fit {
            self.problems.push(format!(
                "tensor `{}` has shape {:?}, expected [{k}, {h}] or [{k}, 1, {h}] (ggml order: kernel positions first)",
                t.name, t.dims
            ));
            return None;
        }
        self.floats(&t)
    }

    /// The values of a float tensor (f32, f16 or bf16) as f32.
    fn floats(&mut self, t: &Found) -> Option<Vec<f32>> {
        let name = &t.name;
        let bytes = t.data.bytes();
        let v: Vec<f32> = match &t.dtype {
            Ok(GgmlType::F32) => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Ok(GgmlType::F16) => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Ok(GgmlType::BF16) => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Ok(ty) => {
                self.problems.push(format!(
                    "tensor `{name}` has type {ty}; vectors must be f32, f16 or bf16"
                ));
                return None;
            }
            Err(ty) => {
                self.problems.push(format!(
                    "tensor `{name}` has element type {ty}, which flowrt cannot use"
                ));
                return None;
            }
        };
        Some(v)
    }

    /// Every expert's gate, up and down (`None` when any of them failed), with the gate and
    /// up biases split from HF's `gate_up_proj_bias`, whose gate values sit at even indices.
    fn expert_matrices(
        &mut self,
        gate: Vec<Option<WeightMatrix>>,
        up: Vec<Option<WeightMatrix>>,
        dn: Vec<Option<WeightMatrix>>,
        gu_bias: Option<Found>,
    ) -> Option<ExpertMatrices> {
        let (gate_bias, up_bias) = match gu_bias {
            None => (None, None),
            Some(b) => {
                let v = self.floats(&b)?;
                let gb = v.iter().step_by(2).copied().collect();
                let ub = v.iter().skip(1).step_by(2).copied().collect();
                (Some(gb), Some(ub))
            }
        };
        Some((
            gate.into_iter().collect::<Option<Vec<_>>>()?,
            up.into_iter().collect::<Option<Vec<_>>>()?,
            dn.into_iter().collect::<Option<Vec<_>>>()?,
            gate_bias,
            up_bias,
        ))
    }

    /// HF fused, transposed experts ([`crate::HfExperts::FusedTransposed`]) of `layer`: `n`
    /// experts of width `ff` over `h` features. Gate and up come interleaved in
    /// `gate_up_proj` `(n, h, 2 ff)` (gate at even indices), down as `(n, ff, h)`; each
    /// expert's matrices are transposed into owned `(rows, cols)` copies in the stored float
    /// type (a copy of the experts' bytes at load). Returns gate, up, down and the gate and
    /// up biases (`n × ff` each) when the family has biases.
    fn fused_experts(
        &mut self,
        layer: usize,
        n: usize,
        ff: usize,
        h: usize,
        bias: bool,
    ) -> Option<ExpertMatrices> {
        use TensorRole::*;
        if let Some(name) = self.source.name(self.arch, FfnGateUpExps, layer) {
            let blocks = format!("{name}_blocks");
            let quantised = self.source.find(&blocks).is_some();
            // An MXFP4 config says which experts are quantised: those of a module its
            // `modules_to_not_convert` does not list. A file that disagrees is refused.
            if let Some(keep) = &self.mxfp4 {
                let module = name.rsplit_once('.').map_or(name.as_str(), |(m, _)| m);
                let listed = keep.iter().find(|p| module_listed(p, module));
                match listed {
                    Some(p) if quantised => {
                        self.used.insert(blocks.clone());
                        self.problems.push(format!(
                            "tensor `{blocks}` is MXFP4, but `quantization_config.modules_to_not_convert` lists `{p}`, so module `{module}` must be stored unquantised (as `{name}`)"
                        ));
                        return None;
                    }
                    None if !quantised && self.source.find(&name).is_some() => {
                        self.used.insert(name.clone());
                        self.problems.push(format!(
                            "tensor `{name}` is stored unquantised, but `quantization_config` says mxfp4 and its `modules_to_not_convert` does not list module `{module}`: expected `{blocks}` and `{name}_scales`"
                        ));
                        return None;
                    }
                    _ => {}
                }
            }
            if quantised {
                return self.mxfp4_experts(layer, n, ff, h, bias);
            }
        }
        let gu = self.find(FfnGateUpExps, layer);
        let down = self.find(FfnDownExps, layer);
        let gu_bias = if bias {
            self.find(FfnGateUpExpsBias, layer).map(Some)
        } else {
            Some(None)
        };
        let (gu, down, gu_bias) = (gu?, down?, gu_bias?);
        let mut ok = true;
        for (t, want) in [(&gu, [2 * ff, h, n]), (&down, [h, ff, n])] {
            let want = want.map(|d| d as u64);
            if t.dims.len() == 3 && t.dims[..2] == want[..2] && t.dims[2] != n as u64 {
                self.problems.push(format!(
                    "tensor `{}` holds {} experts but the expert count (num_local_experts) is {n}",
                    t.name, t.dims[2]
                ));
                ok = false;
            } else if t.dims != want {
                self.problems.push(format!(
                    "tensor `{}` has shape {:?}, expected {want:?} (ggml order; HF shape ({n}, {}, {}): experts, input features, output features{})",
                    t.name,
                    t.dims,
                    want[1],
                    want[0],
                    if want[0] == 2 * ff as u64 { ", 2 × intermediate_size with gate and up interleaved" } else { "" }
                ));
                ok = false;
            }
        }
        if let Some(b) = &gu_bias {
            if b.dims != [2 * ff as u64, n as u64] {
                self.problems.push(format!(
                    "tensor `{}` has shape {:?}, expected [{}, {n}] (one row of 2 × intermediate_size per expert)",
                    b.name,
                    b.dims,
                    2 * ff
                ));
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        let elem = |t: &Found| match t.dtype {
            Ok(GgmlType::F32) => Some(4usize),
            Ok(GgmlType::F16) | Ok(GgmlType::BF16) => Some(2),
            _ => None,
        };
        let (Some(es), Some(des)) = (elem(&gu), elem(&down)) else {
            self.problems.push(format!(
                "tensors `{}` and `{}` must be f32, f16 or bf16 to be split into experts",
                gu.name, down.name
            ));
            return None;
        };
        // Element (r, c) of a row-major (rows, cols) matrix of `es`-byte elements.
        fn transpose(
            src: &[u8],
            es: usize,
            rows: usize,
            cols: usize,
            pick: impl Fn(usize, usize) -> usize,
        ) -> Vec<u8> {
            let mut out = Vec::with_capacity(rows * cols * es);
            for r in 0..rows {
                for c in 0..cols {
                    let i = pick(r, c) * es;
                    out.extend_from_slice(&src[i..i + es]);
                }
            }
            out
        }
        let (gub, db) = (gu.data.bytes(), down.data.bytes());
        let (mut gate, mut up, mut dn) = (Vec::new(), Vec::new(), Vec::new());
        for e in 0..n {
            // gate_up[e] is (h, 2 ff): element (k, j) at e·h·2ff + k·2ff + j.
            let base = e * h * 2 * ff;
            let g = transpose(gub, es, ff, h, |i, k| base + k * 2 * ff + 2 * i);
            let u = transpose(gub, es, ff, h, |i, k| base + k * 2 * ff + 2 * i + 1);
            // down[e] is (ff, h): element (i, j) at e·ff·h + i·h + j; the matrix is (h, ff).
            let dbase = e * ff * h;
            let d = transpose(db, des, h, ff, |j, i| dbase + i * h + j);
            let own = |v: Vec<u8>| WeightData::Owned(Arc::new(v));
            gate.push(self.finish_matrix(
                format!("{}[{e}].gate", gu.name),
                gu.dtype.clone(),
                ff,
                h,
                own(g),
            ));
            up.push(self.finish_matrix(
                format!("{}[{e}].up", gu.name),
                gu.dtype.clone(),
                ff,
                h,
                own(u),
            ));
            dn.push(self.finish_matrix(
                format!("{}[{e}]", down.name),
                down.dtype.clone(),
                h,
                ff,
                own(d),
            ));
        }
        self.expert_matrices(gate, up, dn, gu_bias)
    }

    /// HF fused experts in MXFP4, as OpenAI ships gpt-oss: per role `{name}_blocks` (U8,
    /// `(n, rows, cols / 32, 16)`) and `{name}_scales` (U8, `(n, rows, cols / 32)`), rows the
    /// output features (gate_up: `2 ff` rows, gate at even rows and up at odd ones; down: `h`
    /// rows), each row in blocks of 32 consecutive input features. Byte `k` of a block holds
    /// element `2k` in its low nibble and `2k + 1` in its high one; a scale byte is an E8M0
    /// exponent (`2^(s - 127)`), as transformers' `convert_moe_packed_tensors` reads them. Each
    /// expert's gate, up and down become MXFP4 matrices in ggml's block layout
    /// ([`WeightData::Mxfp4`]: the same codes and exponents repacked, no value changes, made
    /// when first read). Returns what [`Binder::fused_experts`] returns.
    fn mxfp4_experts(
        &mut self,
        layer: usize,
        n: usize,
        ff: usize,
        h: usize,
        bias: bool,
    ) -> Option<ExpertMatrices> {
        use TensorRole::*;
        // (blocks, scales) of a role, checked against (n, rows, cols); `cols_key` names the
        // config field that sizes the input features.
        let pair = |b: &mut Self, role: TensorRole, rows: usize, cols: usize, cols_key: &str| {
            let base = b.source.name(b.arch, role, layer)?;
            let mut get = |suffix: &str| {
                let name = format!("{base}{suffix}");
                b.used.insert(name.clone());
                let t = b.source.find(&name);
                if t.is_none() {
                    b.problems
                        .push(format!("missing tensor `{name}` (MXFP4 experts)"));
                }
                t
            };
            let (blocks, scales) = (get("_blocks"), get("_scales"));
            let (blocks, scales) = (blocks?, scales?);
            if !cols.is_multiple_of(32) {
                b.problems.push(format!(
                    "tensor `{}`: {cols_key} = {cols} is not a multiple of 32, MXFP4's block length",
                    blocks.name
                ));
                return None;
            }
            let g = (cols / 32) as u64;
            let mut ok = true;
            for (t, want) in [
                (&blocks, vec![16, g, rows as u64, n as u64]),
                (&scales, vec![g, rows as u64, n as u64]),
            ] {
                if !matches!(&t.dtype, Err(ty) if ty == "U8") {
                    let ty = match &t.dtype {
                        Ok(ty) => ty.to_string(),
                        Err(ty) => ty.clone(),
                    };
                    b.problems.push(format!(
                        "tensor `{}` has element type {ty}; MXFP4 blocks and scales are U8",
                        t.name
                    ));
                    ok = false;
                    continue;
                }
                let hf: Vec<u64> = want.iter().rev().copied().collect();
                let got: Vec<u64> = t.dims.iter().rev().copied().collect();
                if t.dims.len() == want.len() && t.dims[..want.len() - 1] == want[..want.len() - 1]
                {
                    if t.dims[want.len() - 1] != n as u64 {
                        b.problems.push(format!(
                            "tensor `{}` holds {} experts but the expert count (num_local_experts) is {n}",
                            t.name,
                            t.dims[want.len() - 1]
                        ));
                        ok = false;
                    }
                } else {
                    b.problems.push(format!(
                        "tensor `{}` has shape {got:?}, expected {hf:?} (experts, {rows} output features, {cols_key} = {cols} input features in blocks of 32{})",
                        t.name,
                        if t.name == blocks.name { ", 16 bytes a block" } else { "" }
                    ));
                    ok = false;
                }
            }
            ok.then_some((blocks, scales))
        };
        let Some(gu_rows) = ff.checked_mul(2) else {
            self.problems.push(format!(
                "intermediate_size = {ff} is too large (2 × intermediate_size overflows)"
            ));
            return None;
        };
        let gu = pair(self, FfnGateUpExps, gu_rows, h, "hidden_size");
        let down = pair(self, FfnDownExps, h, ff, "intermediate_size");
        let gu_bias = if bias {
            self.find(FfnGateUpExpsBias, layer).map(Some)
        } else {
            Some(None)
        };
        let ((gub, gus), (db, ds), gu_bias) = (gu?, down?, gu_bias?);
        if let Some(b) = &gu_bias {
            if b.dims != [gu_rows as u64, n as u64] {
                self.problems.push(format!(
                    "tensor `{}` has shape {:?}, expected [{}, {n}] (one row of 2 × intermediate_size per expert)",
                    b.name,
                    b.dims,
                    gu_rows
                ));
                return None;
            }
        }
        // Expert `e`'s matrix of `rows` output rows, file row `first + step · r` of a pair
        // with `file_rows` rows an expert and `groups` blocks a row.
        let matrix = |(b, s): (&Found, &Found), file_rows, first, step, rows, groups, e| {
            WeightData::Mxfp4(Arc::new(Mxfp4Rows {
                blocks: b.data.clone(),
                scales: s.data.clone(),
                first: e * file_rows + first,
                step,
                rows,
                groups,
                made: std::sync::OnceLock::new(),
            }))
        };
        let (gh, gf) = (h / 32, ff / 32);
        let (mut gate, mut up, mut dn) = (Vec::new(), Vec::new(), Vec::new());
        for e in 0..n {
            let g = matrix((&gub, &gus), gu_rows, 0, 2, ff, gh, e);
            let u = matrix((&gub, &gus), gu_rows, 1, 2, ff, gh, e);
            let d = matrix((&db, &ds), h, 0, 1, h, gf, e);
            gate.push(self.finish_matrix(
                format!("{}[{e}].gate", gub.name),
                Ok(GgmlType::Mxfp4),
                ff,
                h,
                g,
            ));
            up.push(self.finish_matrix(
                format!("{}[{e}].up", gub.name),
                Ok(GgmlType::Mxfp4),
                ff,
                h,
                u,
            ));
            dn.push(self.finish_matrix(format!("{}[{e}]", db.name), Ok(GgmlType::Mxfp4), h, ff, d));
        }
        self.expert_matrices(gate, up, dn, gu_bias)
    }

    /// A fused matrix of `parts` stacked row ranges, split into one matrix per part, in order.
    /// `what` says how the config sizes each part (for the error when the rows disagree).
    fn fused(
        &mut self,
        role: TensorRole,
        layer: usize,
        parts: &[(&str, usize)],
        cols: usize,
        what: &str,
    ) -> Option<Vec<WeightMatrix>> {
        let rows: usize = parts.iter().map(|p| p.1).sum();
        let name = self.source.name(self.arch, role, layer)?;
        if let Some(t) = self.source.find(&name) {
            if t.dims.len() == 2 && t.dims[0] == cols as u64 && t.dims[1] != rows as u64 {
                self.used.insert(name.clone());
                self.problems.push(format!(
                    "tensor `{name}` has {} rows, but the config gives {what} = {rows} (ggml shape {:?}, expected [{cols}, {rows}])",
                    t.dims[1], t.dims
                ));
                return None;
            }
        }
        let m = self.matrix(role, layer, rows, cols)?;
        let mut r0 = 0;
        Some(
            parts
                .iter()
                .map(|&(part, n)| {
                    let sub = m.row_range(format!("{}[{part}]", m.name), r0, r0 + n);
                    r0 += n;
                    sub
                })
                .collect(),
        )
    }

    /// A matrix that exists only when `present` (`layer` 0: global roles).
    fn optional_matrix(
        &mut self,
        present: bool,
        role: TensorRole,
        rows: usize,
        cols: usize,
    ) -> Option<Option<WeightMatrix>> {
        if present {
            self.matrix(role, 0, rows, cols).map(Some)
        } else {
            Some(None)
        }
    }

    /// A per-layer matrix that exists only when `present`.
    fn optional_layer_matrix(
        &mut self,
        present: bool,
        role: TensorRole,
        layer: usize,
        rows: usize,
        cols: usize,
    ) -> Option<Option<WeightMatrix>> {
        if present {
            self.matrix(role, layer, rows, cols).map(Some)
        } else {
            Some(None)
        }
    }

    /// The bias of LayerNorm weight `norm`, when `present`.
    fn norm_bias(
        &mut self,
        present: bool,
        norm: TensorRole,
        layer: usize,
        len: usize,
    ) -> Option<Option<Vec<f32>>> {
        if !present {
            return Some(None);
        }
        match norm.norm_bias() {
            Some(role) => self.vector(role, layer, len).map(Some),
            None => {
                self.problems
                    .push(format!("{norm:?} has no LayerNorm bias in flowrt's names"));
                None
            }
        }
    }

    /// A per-layer vector of `len` values that the config asks for when `present` (`field`
    /// says how, e.g. "`conv_bias: true`"): a missing tensor is a problem naming the field;
    /// `what` names the config value that sizes it.
    fn called_for(
        &mut self,
        present: bool,
        field: &str,
        role: TensorRole,
        layer: usize,
        len: usize,
        what: Option<&str>,
    ) -> Option<Option<Vec<f32>>> {
        if !present {
            return Some(None);
        }
        if !self.exists(role, layer) {
            let name = self
                .source
                .name(self.arch, role, layer)
                .unwrap_or_else(|| format!("{role:?}"));
            self.problems
                .push(format!("missing tensor `{name}`, which {field} calls for"));
            self.used.insert(name);
            return None;
        }
        self.sized_vector(role, layer, len, what).map(Some)
    }

    /// A per-layer vector that exists only when `present`.
    fn optional(
        &mut self,
        present: bool,
        role: TensorRole,
        layer: usize,
        len: usize,
    ) -> Option<Option<Vec<f32>>> {
        if present {
            self.vector(role, layer, len).map(Some)
        } else {
            Some(None)
        }
    }
}

/// Quantise a float matrix to `q` (rows converted and quantised in parallel).
fn quantize_matrix(m: &WeightMatrix, q: GgmlType) -> Result<WeightMatrix, String> {
    if !LOAD_QUANT_TYPES.contains(&q) {
        return Err(format!(
            "cannot quantise to {q} on load (use q4_0, q4_1 or q8_0)"
        ));
    }
    let bs = q.block_size() as usize;
    if !m.cols.is_multiple_of(bs) {
        return Err(format!(
            "tensor `{}` has rows of {} values, not a multiple of {bs}: it cannot be quantised to {q}",
            m.name, m.cols
        ));
    }
    let row_bytes = q
        .row_size(m.cols as u64)
        .map_err(|e| format!("tensor `{}`: {e}", m.name))? as usize;
    let mut out = vec![0u8; row_bytes * m.rows];
    let kern = flowrt_kernels::Kernels::detect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows_per = m.rows.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (ci, chunk) in out.chunks_mut(rows_per * row_bytes).enumerate() {
            s.spawn(move || {
                let mut f = vec![0f32; m.cols];
                for (i, dst) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                    let r = ci * rows_per + i;
                    kern.dequantize_row(m.dtype, m.rows_bytes(r, r + 1), &mut f);
                    kern.quantize_row(q, &f, dst);
                }
            });
        }
    });
    Ok(WeightMatrix {
        name: m.name.clone(),
        dtype: q,
        rows: m.rows,
        cols: m.cols,
        row_bytes,
        data: WeightData::Owned(Arc::new(out)),
    })
}

impl Model {
    /// Bind the tensors of a GGUF model to roles, checking every name, shape and type.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let mut config = ModelConfig::from_gguf(&file)?;
        let path = file_name(&file);
        let source = Source::Gguf(file);
        // llama.cpp stores Llama 3's RoPE scaling as per-dimension divisors.
        let mut b = Binder {
            source: &source,
            arch: config.arch,
            opts: LoadOptions::default(),
            norm_offset: 0.0,
            used: HashSet::new(),
            problems: Vec::new(),
            mxfp4: None,
        };
        let mut extra_used = Vec::new();
        // LongRoPE's divisor tensors were read with the config.
        if matches!(config.rope.scaling, RopeScaling::LongRope { .. }) {
            extra_used.extend(
                [TensorRole::RopeFactorsLong, TensorRole::RopeFactorsShort].map(|r| r.gguf_name(0)),
            );
        }
        if b.exists(TensorRole::RopeFreqs, 0) {
            extra_used.push(TensorRole::RopeFreqs.gguf_name(0));
            if config.rope.scaling != RopeScaling::None {
                return Err(ModelError::BadConfig {
                    file: path,
                    reason: "both a RoPE scaling type and rope_freqs.weight".into(),
                });
            }
            if let Some(f) = b.vector(TensorRole::RopeFreqs, 0, config.rope_dim / 2) {
                config.rope.scaling = RopeScaling::FreqFactors(f);
                config
                    .rope
                    .validate(config.rope_dim)
                    .map_err(|reason| ModelError::BadConfig {
                        file: path.clone(),
                        reason,
                    })?;
            }
            if !b.problems.is_empty() {
                return Err(ModelError::Tensors {
                    file: path,
                    problems: b.problems,
                });
            }
        }
        Self::bind(
            config,
            path,
            ModelFormat::Gguf,
            &source,
            LoadOptions::default(),
            &extra_used,
        )
    }

    /// Load a Hugging Face checkpoint directory's weights (its `config.json` already read),
    /// optionally quantising them.
    pub fn from_hf_dir(
        dir: &Path,
        config: ModelConfig,
        opts: LoadOptions,
    ) -> Result<Self, ModelError> {
        if let Some(q) = opts.quant {
            if !LOAD_QUANT_TYPES.contains(&q) {
                return Err(ModelError::BadCheckpoint {
                    path: dir.to_path_buf(),
                    reason: format!("cannot quantise to {q} on load (use q4_0, q4_1 or q8_0)"),
                });
            }
        }
        let st = Arc::new(SafetensorsDir::open(dir)?);
        let (prefix, head_prefix) = match config.arch.tensor_names {
            TensorNames::Decoder | TensorNames::Lfm2 => st.decoder_prefixes(),
            TensorNames::Bert => bert_prefixes(&st),
        };
        // Tensors the family's checkpoints carry that flowrt does not use.
        let unused: Vec<String> = config
            .arch
            .hf_unused
            .iter()
            .map(|n| format!("{prefix}{n}"))
            .collect();
        let source = Source::Hf {
            st,
            prefix: prefix.into(),
            head_prefix: head_prefix.into(),
        };
        Self::bind(
            config,
            dir.to_path_buf(),
            ModelFormat::HfDir,
            &source,
            opts,
            &unused,
        )
    }

    /// Bind every role; `extra_used` names tensors the caller already consumed.
    fn bind(
        config: ModelConfig,
        path: PathBuf,
        format: ModelFormat,
        source: &Source,
        opts: LoadOptions,
        extra_used: &[String],
    ) -> Result<Self, ModelError> {
        let c = &config;
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let mut b = Binder {
            source,
            arch: c.arch,
            opts,
            norm_offset: match format {
                ModelFormat::HfDir => c.arch.hf_norm_offset,
                ModelFormat::Gguf => 0.0,
            },
            used: extra_used.iter().cloned().collect(),
            problems: Vec::new(),
            mxfp4: match format {
                ModelFormat::HfDir => c.hf_mxfp4.clone(),
                ModelFormat::Gguf => None,
            },
        };

        let arch = c.arch;
        let token_embd = b.matrix(TensorRole::TokenEmbd, 0, c.vocab_size, h);
        let learned = arch.positions == Positions::Learned;
        let pos_embd =
            b.optional_matrix(learned, TensorRole::PosEmbd, c.max_position_embeddings, h);
        let token_types = b.optional_matrix(
            arch.token_types,
            TensorRole::TokenTypes,
            c.type_vocab_size,
            h,
        );
        let layer_norm = arch.norm == NormKind::Layer;
        let embd_norm = b.optional(arch.embed_norm, TensorRole::EmbdNorm, 0, h);
        let embd_norm_bias = b.norm_bias(arch.embed_norm && layer_norm, TensorRole::EmbdNorm, 0, h);
        let pre_norm = arch.norm_position == NormPosition::Pre;
        let output_norm = b.optional(pre_norm, TensorRole::OutputNorm, 0, h);
        if pre_norm && layer_norm {
            b.problems.push(
                "a LayerNorm before each block (with biases) is not supported; flowrt runs LayerNorm families post-norm".into(),
            );
        }
        let tied_embeddings = arch.lm_head
            && c.tie_word_embeddings
                .unwrap_or_else(|| !b.exists(TensorRole::Output, 0));
        let output = if !arch.lm_head {
            Some(None)
        } else if tied_embeddings {
            // A tied checkpoint may still store the output matrix (the same values).
            if let Some(n) = source.name(c.arch, TensorRole::Output, 0) {
                b.used.insert(n);
            }
            token_embd.clone().map(Some)
        } else {
            b.matrix(TensorRole::Output, 0, c.vocab_size, h).map(Some)
        };
        // Which norm roles the blocks use: on the block's input, or after its residual add.
        let (attn_norm_role, ffn_norm_role) = match arch.norm_position {
            NormPosition::Pre => (TensorRole::AttnNorm, TensorRole::FfnNorm),
            NormPosition::Post => (TensorRole::AttnOutNorm, TensorRole::LayerOutNorm),
        };

        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            use TensorRole::*;
            // Bind every tensor (so all problems are collected), then assemble.
            let attn_norm = b.vector(attn_norm_role, l, h);
            let attn_norm_bias = b.norm_bias(layer_norm, attn_norm_role, l, h);
            // Fused Q/K/V: required in HF checkpoints; GGUF files may store them apart.
            let qkv_fused = arch.fused_qkv
                && (format == ModelFormat::HfDir || b.exists(AttnQkv, l) || !b.exists(AttnQ, l));
            // A short convolution layer has no attention matrices.
            let conv_kernel = c
                .short_conv
                .as_ref()
                .filter(|s| s.conv_layers[l])
                .map(|s| (s.kernel, s.bias));
            let attends = conv_kernel.is_none();
            let conv = match conv_kernel {
                None => Some(None),
                Some((k, bias)) => {
                    let in_proj = b.matrix(ShortConvIn, l, 3 * h, h);
                    let kernel = b.conv_kernel(l, h, k);
                    let out_proj = b.matrix(ShortConvOut, l, h, h);
                    let field = "`conv_bias: true`";
                    let in_bias = b.called_for(bias, field, ShortConvInBias, l, 3 * h, None);
                    let kernel_bias = b.called_for(bias, field, ShortConvKernelBias, l, h, None);
                    let out_bias = b.called_for(bias, field, ShortConvOutBias, l, h, None);
                    (|| {
                        Some(Some(ShortConvWeights {
                            in_proj: in_proj?,
                            kernel: kernel?,
                            out_proj: out_proj?,
                            in_bias: in_bias?,
                            kernel_bias: kernel_bias?,
                            out_bias: out_bias?,
                        }))
                    })()
                }
            };
            let (wq, wk, wv) = if !attends {
                (Some(None), Some(None), Some(None))
            } else if qkv_fused {
                let what = "(num_attention_heads + 2 × num_key_value_heads) × head_dim";
                match b.fused(AttnQkv, l, &[("q", q), ("k", kv), ("v", kv)], h, what) {
                    Some(mut m) => {
                        let v = m.pop().map(Some);
                        let k = m.pop().map(Some);
                        (m.pop().map(Some), k, v)
                    }
                    None => (None, None, None),
                }
            } else {
                (
                    b.matrix(AttnQ, l, q, h).map(Some),
                    b.matrix(AttnK, l, kv, h).map(Some),
                    b.matrix(AttnV, l, kv, h).map(Some),
                )
            };
            let bq = b.optional(attends && arch.qkv_bias, AttnQBias, l, q);
            let bk = b.optional(attends && arch.qkv_bias, AttnKBias, l, kv);
            let bv = b.optional(attends && arch.qkv_bias, AttnVBias, l, kv);
            let q_norm = b.optional(attends && arch.qk_norm, AttnQNorm, l, c.head_dim);
            let k_norm = b.optional(attends && arch.qk_norm, AttnKNorm, l, c.head_dim);
            let wo = b.optional_layer_matrix(attends, AttnOutput, l, h, q);
            let bo = b.optional(attends && arch.dense_bias, AttnOutputBias, l, h);
            let attn_post_norm = b.optional(arch.sandwich_norms, AttnPostNorm, l, h);
            let ffn_norm = b.vector(ffn_norm_role, l, h);
            let ffn_norm_bias = b.norm_bias(layer_norm, ffn_norm_role, l, h);
            let moe_cfg = c.layer_moe(l);
            let dense = moe_cfg.is_none();
            // A sparse layer has experts in place of gate/up/down.
            let (w_gate, w_up) = if !dense {
                (Some(None), Some(None))
            } else if arch.gated_ffn && arch.fused_gate_up {
                let what = "2 × intermediate_size";
                match b.fused(FfnGateUp, l, &[("gate", ff), ("up", ff)], h, what) {
                    Some(mut m) => {
                        let up = m.pop();
                        (m.pop().map(Some), up.map(Some))
                    }
                    None => (None, None),
                }
            } else if arch.gated_ffn {
                (
                    b.matrix(FfnGate, l, ff, h).map(Some),
                    b.matrix(FfnUp, l, ff, h).map(Some),
                )
            } else {
                (Some(None), b.matrix(FfnUp, l, ff, h).map(Some))
            };
            let b_up = b.optional(arch.dense_bias && dense, FfnUpBias, l, ff);
            let w_down = b.optional_layer_matrix(dense, FfnDown, l, h, ff);
            let moe = match moe_cfg {
                None => Some(None),
                Some(m) => {
                    let (n, mf) = (m.num_experts, m.moe_intermediate_size);
                    let bias = arch.moe_bias;
                    let router = b.matrix(FfnGateInp, l, n, h);
                    let router_bias = b.optional(bias, FfnGateInpBias, l, n);
                    let selection_bias = b.called_for(
                        m.router.selection_bias,
                        "the router's selection bias (`use_expert_bias`)",
                        FfnExpProbsB,
                        l,
                        n,
                        Some("num_experts"),
                    );
                    let fused = format == ModelFormat::HfDir
                        && arch.hf_experts == HfExperts::FusedTransposed;
                    let experts = if fused {
                        b.fused_experts(l, n, mf, h, bias)
                    } else {
                        let gate = b.experts(FfnGateExps, l, n, mf, h);
                        let up = b.experts(FfnUpExps, l, n, mf, h);
                        let down = b.experts(FfnDownExps, l, n, h, mf);
                        let (gb, ub) = if bias {
                            (
                                b.table(FfnGateExpsBias, l, n, mf).map(Some),
                                b.table(FfnUpExpsBias, l, n, mf).map(Some),
                            )
                        } else {
                            (Some(None), Some(None))
                        };
                        (|| Some((gate?, up?, down?, gb?, ub?)))()
                    };
                    let down_bias = if bias {
                        b.table(FfnDownExpsBias, l, n, h).map(Some)
                    } else {
                        Some(None)
                    };
                    (|| {
                        let (gate, up, down, gate_bias, up_bias) = experts?;
                        Some(Some(MoeWeights {
                            router: router?,
                            gate,
                            up,
                            down,
                            router_bias: router_bias?,
                            gate_bias,
                            up_bias,
                            down_bias: down_bias?,
                            selection_bias: selection_bias?,
                        }))
                    })()
                }
            };
            let b_down = b.optional(arch.dense_bias && dense, FfnDownBias, l, h);
            let sinks = if arch.attn_sinks {
                b.sized_vector(
                    AttnSinks,
                    l,
                    c.num_attention_heads,
                    Some("num_attention_heads"),
                )
                .map(Some)
            } else {
                Some(None)
            };
            let ffn_post_norm = b.optional(arch.sandwich_norms, FfnPostNorm, l, h);
            let layer = (|| {
                Some(LayerWeights {
                    attn_norm: attn_norm?,
                    attn_norm_bias: attn_norm_bias?,
                    wq: wq?,
                    wk: wk?,
                    wv: wv?,
                    bq: bq?,
                    bk: bk?,
                    bv: bv?,
                    q_norm: q_norm?,
                    k_norm: k_norm?,
                    wo: wo?,
                    bo: bo?,
                    attn_post_norm: attn_post_norm?,
                    ffn_norm: ffn_norm?,
                    ffn_norm_bias: ffn_norm_bias?,
                    w_gate: w_gate?,
                    w_up: w_up?,
                    b_up: b_up?,
                    w_down: w_down?,
                    b_down: b_down?,
                    ffn_post_norm: ffn_post_norm?,
                    sinks: sinks?,
                    moe: moe?,
                    conv: conv?,
                })
            })();
            if let Some(layer) = layer {
                layers.push(layer);
            }
        }
        b.check_all_used();
        let (
            Some(token_embd),
            Some(pos_embd),
            Some(token_types),
            Some(embd_norm),
            Some(embd_norm_bias),
            Some(output_norm),
            Some(output),
            true,
        ) = (
            token_embd,
            pos_embd,
            token_types,
            embd_norm,
            embd_norm_bias,
            output_norm,
            output,
            b.problems.is_empty(),
        )
        else {
            // Every `None` above was recorded as a problem.
            return Err(ModelError::Tensors {
                file: path,
                problems: b.problems,
            });
        };
        Ok(Model {
            config,
            path,
            format,
            token_embd,
            pos_embd,
            token_types,
            embd_norm,
            embd_norm_bias,
            output_norm,
            output,
            tied_embeddings,
            layers,
        })
    }

    /// The matrix playing `role` in `layer`: the output projection whatever the layer, `None`
    /// for a layer role without a layer.
    pub fn matrix(&self, layer: Option<usize>, role: MatRole) -> Option<&WeightMatrix> {
        let lw = match (role, layer) {
            (MatRole::Output, _) => return self.output.as_ref(),
            (_, Some(l)) => self.layers.get(l)?,
            (_, None) => return None,
        };
        Some(match role {
            MatRole::Q => lw.wq.as_ref()?,
            MatRole::K => lw.wk.as_ref()?,
            MatRole::V => lw.wv.as_ref()?,
            MatRole::O => lw.wo.as_ref()?,
            MatRole::ConvIn => &lw.conv.as_ref()?.in_proj,
            MatRole::ConvOut => &lw.conv.as_ref()?.out_proj,
            MatRole::Gate => lw.w_gate.as_ref()?,
            MatRole::Up => lw.w_up.as_ref()?,
            MatRole::Down => lw.w_down.as_ref()?,
            MatRole::Router => &lw.moe.as_ref()?.router,
            MatRole::Output => self.output.as_ref()?,
        })
    }

    /// The matrix playing `role` in `layer`, to replace (as [`Model::matrix`]).
    pub fn matrix_mut(&mut self, layer: Option<usize>, role: MatRole) -> Option<&mut WeightMatrix> {
        let lw = match (role, layer) {
            (MatRole::Output, _) => return self.output.as_mut(),
            (_, Some(l)) => self.layers.get_mut(l)?,
            (_, None) => return None,
        };
        Some(match role {
            MatRole::Q => lw.wq.as_mut()?,
            MatRole::K => lw.wk.as_mut()?,
            MatRole::V => lw.wv.as_mut()?,
            MatRole::O => lw.wo.as_mut()?,
            MatRole::ConvIn => &mut lw.conv.as_mut()?.in_proj,
            MatRole::ConvOut => &mut lw.conv.as_mut()?.out_proj,
            MatRole::Gate => lw.w_gate.as_mut()?,
            MatRole::Up => lw.w_up.as_mut()?,
            MatRole::Down => lw.w_down.as_mut()?,
            MatRole::Router => &mut lw.moe.as_mut()?.router,
            MatRole::Output => self.output.as_mut()?,
        })
    }

    /// The bias added after the matrix playing `role` in `layer`, if the family has one.
    pub fn bias(&self, layer: Option<usize>, role: MatRole) -> Option<&Vec<f32>> {
        let lw = self.layers.get(layer?)?;
        match role {
            MatRole::Q => lw.bq.as_ref(),
            MatRole::K => lw.bk.as_ref(),
            MatRole::V => lw.bv.as_ref(),
            MatRole::O => lw.bo.as_ref(),
            MatRole::Up => lw.b_up.as_ref(),
            MatRole::Down => lw.b_down.as_ref(),
            MatRole::Router => lw.moe.as_ref()?.router_bias.as_ref(),
            MatRole::ConvIn => lw.conv.as_ref()?.in_bias.as_ref(),
            MatRole::ConvOut => lw.conv.as_ref()?.out_bias.as_ref(),
            MatRole::Gate | MatRole::Output => None,
        }
    }

    /// Bytes of weights read per decoded token (every matrix once; of a mixture of experts,
    /// the router and the share of the experts a token runs, top-k of them; embeddings: one
    /// row).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let m = |w: &WeightMatrix| (w.rows * w.row_bytes) as u64;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                let dense: u64 = [&l.wq, &l.wk, &l.wv, &l.wo]
                    .into_iter()
                    .flatten()
                    .chain(l.conv.iter().flat_map(|c| [&c.in_proj, &c.out_proj]))
                    .chain(&l.w_gate)
                    .chain(&l.w_up)
                    .chain(&l.w_down)
                    .map(m)
                    .sum();
                let experts = l.moe.as_ref().map_or(0, |x| {
                    let all: u64 = x.experts().map(m).sum();
                    let k = self
                        .config
                        .moe
                        .as_ref()
                        .map_or(0, |c| c.num_experts_per_tok);
                    m(&x.router) + all * k as u64 / x.gate.len().max(1) as u64
                });
                dense + experts
            })
            .sum();
        layers + self.output.as_ref().map_or(0, m) + self.token_embd.row_bytes as u64
    }
}

/// Where a BERT checkpoint's tensors sit: `BertModel` (sentence-transformers) at the top,
/// the task models (`BertForMaskedLM`, ...) under `bert.`.
fn bert_prefixes(st: &SafetensorsDir) -> (&'static str, &'static str) {
    const LAYOUTS: [(&str, &str); 2] = [("", ""), ("bert.", "")];
    LAYOUTS
        .iter()
        .find(|(p, _)| {
            st.tensors
                .contains_key(&format!("{p}embeddings.word_embeddings.weight"))
        })
        .copied()
        .unwrap_or(LAYOUTS[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `modules_to_not_convert` patterns as OpenAI's configs write them.
    #[test]
    fn module_patterns_match_whole_dotted_prefixes() {
        let e = "model.layers.12.mlp.experts";
        for p in [
            "model.layers.*.mlp.experts",
            "model.layers.*.mlp",
            "model.layers.12",
            "model",
            "*",
            "*.experts",
            e,
        ] {
            assert!(module_listed(p, e), "{p}");
        }
        for p in [
            "model.layers.*.self_attn",
            "model.layers.1",
            "model.layers.1*.mlp.router",
            "lm_head",
            "model.embed_tokens",
            "model.layers.12.mlp.expert",
            "",
        ] {
            assert!(!module_listed(p, e), "{p}");
        }
        // Many stars do not blow up.
        assert!(!module_listed(&"*a".repeat(200), &"a".repeat(150)));
    }

    /// Rows of an MXFP4 pair read in chunks (as a repacking backend reads them, not yet made)
    /// equal the same rows of the whole matrix made at once, for the up half of a gate/up
    /// interleave of a second expert and chunks that end mid-matrix.
    #[test]
    fn mxfp4_rows_read_in_chunks_equal_the_whole_matrix() {
        let (experts, file_rows, groups) = (2usize, 2 * 700, 3usize);
        let mut seed = 1u64;
        let mut byte = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 56) as u8
        };
        let blocks: Vec<u8> = (0..experts * file_rows * groups * 16)
            .map(|_| byte())
            .collect();
        let scales: Vec<u8> = (0..experts * file_rows * groups).map(|_| byte()).collect();
        let rows = Mxfp4Rows {
            blocks: WeightData::Owned(Arc::new(blocks)),
            scales: WeightData::Owned(Arc::new(scales)),
            first: file_rows + 1,
            step: 2,
            rows: 700,
            groups,
            made: std::sync::OnceLock::new(),
        };
        let data = WeightData::Mxfp4(Arc::new(rows));
        let rb = groups * Mxfp4Rows::BLOCK;
        let mut scratch = Vec::new();
        let mut chunks = Vec::new();
        for r0 in (0..700).step_by(256) {
            let r1 = (r0 + 256).min(700);
            chunks.push((
                r0,
                data.read(r0 * rb, (r1 - r0) * rb, &mut scratch).to_vec(),
            ));
        }
        assert!(data.is_mapped(), "reading chunks made the whole matrix");
        let whole = data.bytes();
        assert_eq!(whole.len(), 700 * rb);
        assert!(!data.is_mapped());
        for (r0, c) in chunks {
            assert!(c == whole[r0 * rb..r0 * rb + c.len()], "rows from {r0}");
        }
        // Row 5's first block: the exponent, then elements j and j + 16 in one byte.
        let WeightData::Mxfp4(m) = &data else {
            unreachable!()
        };
        let at = (m.first + 2 * 5) * groups;
        let (b, s) = (
            &m.blocks.bytes()[at * 16..at * 16 + 16],
            m.scales.bytes()[at],
        );
        let code = |j: usize| (b[j / 2] >> (4 * (j % 2))) & 15;
        assert_eq!(whole[5 * rb], s);
        assert_eq!(whole[5 * rb + 1], code(0) | code(16) << 4);
        assert_eq!(whole[5 * rb + 16], code(15) | code(31) << 4);
    }
}
