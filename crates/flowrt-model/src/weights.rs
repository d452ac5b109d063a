//! The model's tensors, bound to roles and checked against the config.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowrt_dtype::GgmlType;
use flowrt_gguf::GgufFile;
use half::{bf16, f16};

use crate::arch::ArchSpec;
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
        }
    }

    /// Whether the bytes are a view of a memory-mapped file (not owned by the process).
    pub fn is_mapped(&self) -> bool {
        !matches!(self, WeightData::Owned(_))
    }

    /// Lets the pages of bytes `offset..offset + len` of a GGUF tensor leave the resident set
    /// (they are read from the file again if touched): for a backend that keeps its own copy.
    /// Other bytes (owned, or from safetensors shards, which hold only float types that no
    /// backend repacks) stay.
    pub fn release_range(&self, offset: usize, len: usize) {
        if let WeightData::Gguf { file, tensor } = self {
            let t = &file.tensors()[*tensor];
            let start = file.data_offset().saturating_add(t.offset) as usize;
            let len = len.min((t.size_bytes as usize).saturating_sub(offset));
            file.release(start.saturating_add(offset), len);
        }
    }
}

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
}

/// The weights of one decoder layer. Shapes are `[rows (out), cols (in)]`.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,              // (hidden)
    pub wq: WeightMatrix,                 // (q_dim, hidden)
    pub wk: WeightMatrix,                 // (kv_dim, hidden)
    pub wv: WeightMatrix,                 // (kv_dim, hidden)
    pub bq: Option<Vec<f32>>,             // (q_dim)
    pub bk: Option<Vec<f32>>,             // (kv_dim)
    pub bv: Option<Vec<f32>>,             // (kv_dim)
    pub q_norm: Option<Vec<f32>>,         // (head_dim)
    pub k_norm: Option<Vec<f32>>,         // (head_dim)
    pub wo: WeightMatrix,                 // (hidden, q_dim)
    pub attn_post_norm: Option<Vec<f32>>, // (hidden) sandwich norms only
    pub ffn_norm: Vec<f32>,               // (hidden)
    pub w_gate: WeightMatrix,             // (intermediate, hidden)
    pub w_up: WeightMatrix,               // (intermediate, hidden)
    pub w_down: WeightMatrix,             // (hidden, intermediate)
    pub ffn_post_norm: Option<Vec<f32>>,  // (hidden) sandwich norms only
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
    pub output_norm: Vec<f32>,    // (hidden)
    /// Output projection; the same bytes as `token_embd` when the embeddings are tied.
    pub output: WeightMatrix, // (vocab, hidden)
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
            Source::Gguf(_) => Some(role.gguf_name(layer)),
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
        let name = t.name;
        if t.dims != [cols as u64, rows as u64] {
            self.problems.push(format!(
                "tensor `{name}` has shape {:?}, expected [{cols}, {rows}] (ggml order: input features first)",
                t.dims
            ));
            return None;
        }
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
        let t = self.find(role, layer)?;
        let name = &t.name;
        if t.dims != [len as u64] {
            self.problems.push(format!(
                "tensor `{name}` has shape {:?}, expected [{len}]",
                t.dims
            ));
            return None;
        }
        let bytes = t.data.bytes();
        let mut v: Vec<f32> = match t.dtype {
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
        if role.is_norm() && self.norm_offset != 0.0 {
            v.iter_mut().for_each(|x| *x += self.norm_offset);
        }
        Some(v)
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
        };
        let mut extra_used = Vec::new();
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
        // Text decoders are under `model.`; multimodal wrappers nest them.
        let layouts = [
            ("model.", ""),
            ("model.language_model.", ""),
            ("language_model.model.", "language_model."),
        ];
        let (prefix, head_prefix) = layouts
            .iter()
            .find(|(p, _)| st.tensors.contains_key(&format!("{p}embed_tokens.weight")))
            .copied()
            .unwrap_or(layouts[0]);
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
            &[],
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
        };

        let token_embd = b.matrix(TensorRole::TokenEmbd, 0, c.vocab_size, h);
        let output_norm = b.vector(TensorRole::OutputNorm, 0, h);
        let tied_embeddings = c
            .tie_word_embeddings
            .unwrap_or_else(|| !b.exists(TensorRole::Output, 0));
        let output = if tied_embeddings {
            // A tied checkpoint may still store the output matrix (the same values).
            if let Some(n) = source.name(c.arch, TensorRole::Output, 0) {
                b.used.insert(n);
            }
            token_embd.clone()
        } else {
            b.matrix(TensorRole::Output, 0, c.vocab_size, h)
        };

        let arch = c.arch;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            use TensorRole::*;
            // Bind every tensor (so all problems are collected), then assemble.
            let attn_norm = b.vector(AttnNorm, l, h);
            let wq = b.matrix(AttnQ, l, q, h);
            let wk = b.matrix(AttnK, l, kv, h);
            let wv = b.matrix(AttnV, l, kv, h);
            let bq = b.optional(arch.qkv_bias, AttnQBias, l, q);
            let bk = b.optional(arch.qkv_bias, AttnKBias, l, kv);
            let bv = b.optional(arch.qkv_bias, AttnVBias, l, kv);
            let q_norm = b.optional(arch.qk_norm, AttnQNorm, l, c.head_dim);
            let k_norm = b.optional(arch.qk_norm, AttnKNorm, l, c.head_dim);
            let wo = b.matrix(AttnOutput, l, h, q);
            let attn_post_norm = b.optional(arch.sandwich_norms, AttnPostNorm, l, h);
            let ffn_norm = b.vector(FfnNorm, l, h);
            let w_gate = b.matrix(FfnGate, l, ff, h);
            let w_up = b.matrix(FfnUp, l, ff, h);
            let w_down = b.matrix(FfnDown, l, h, ff);
            let ffn_post_norm = b.optional(arch.sandwich_norms, FfnPostNorm, l, h);
            let layer = (|| {
                Some(LayerWeights {
                    attn_norm: attn_norm?,
                    wq: wq?,
                    wk: wk?,
                    wv: wv?,
                    bq: bq?,
                    bk: bk?,
                    bv: bv?,
                    q_norm: q_norm?,
                    k_norm: k_norm?,
                    wo: wo?,
                    attn_post_norm: attn_post_norm?,
                    ffn_norm: ffn_norm?,
                    w_gate: w_gate?,
                    w_up: w_up?,
                    w_down: w_down?,
                    ffn_post_norm: ffn_post_norm?,
                })
            })();
            if let Some(layer) = layer {
                layers.push(layer);
            }
        }
        b.check_all_used();
        let (Some(token_embd), Some(output_norm), Some(output), true) =
            (token_embd, output_norm, output, b.problems.is_empty())
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
            (MatRole::Output, _) => return Some(&self.output),
            (_, Some(l)) => self.layers.get(l)?,
            (_, None) => return None,
        };
        Some(match role {
            MatRole::Q => &lw.wq,
            MatRole::K => &lw.wk,
            MatRole::V => &lw.wv,
            MatRole::O => &lw.wo,
            MatRole::Gate => &lw.w_gate,
            MatRole::Up => &lw.w_up,
            MatRole::Down => &lw.w_down,
            MatRole::Output => &self.output,
        })
    }

    /// Bytes of weights read per decoded token (every matrix once; embeddings: one row).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let m = |w: &WeightMatrix| (w.rows * w.row_bytes) as u64;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                m(&l.wq) + m(&l.wk) + m(&l.wv) + m(&l.wo) + m(&l.w_gate) + m(&l.w_up) + m(&l.w_down)
            })
            .sum();
        layers + m(&self.output) + self.token_embd.row_bytes as u64
    }
}
