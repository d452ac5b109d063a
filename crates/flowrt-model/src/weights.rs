//! The model's tensors, bound to roles and checked against the config.

use std::sync::Arc;

use flowrt_dtype::GgmlType;
use flowrt_gguf::GgufFile;
use half::{bf16, f16};

use crate::config::{file_name, ModelConfig};
use crate::error::ModelError;
use crate::names::TensorRole;

/// Where a weight's bytes live.
#[derive(Debug, Clone)]
pub enum WeightData {
    /// A range of a memory-mapped model file.
    Mapped { file: Arc<GgufFile>, tensor: usize },
    /// Bytes owned by the process (converted or repacked at load).
    Owned(Arc<Vec<u8>>),
}

impl WeightData {
    pub fn bytes(&self) -> &[u8] {
        match self {
            WeightData::Mapped { file, tensor } => file.tensor_data(&file.tensors()[*tensor]),
            WeightData::Owned(v) => v,
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
    pub attn_norm: Vec<f32>,      // (hidden)
    pub wq: WeightMatrix,         // (q_dim, hidden)
    pub wk: WeightMatrix,         // (kv_dim, hidden)
    pub wv: WeightMatrix,         // (kv_dim, hidden)
    pub bq: Option<Vec<f32>>,     // (q_dim)
    pub bk: Option<Vec<f32>>,     // (kv_dim)
    pub bv: Option<Vec<f32>>,     // (kv_dim)
    pub q_norm: Option<Vec<f32>>, // (head_dim)
    pub k_norm: Option<Vec<f32>>, // (head_dim)
    pub wo: WeightMatrix,         // (hidden, q_dim)
    pub ffn_norm: Vec<f32>,       // (hidden)
    pub w_gate: WeightMatrix,     // (intermediate, hidden)
    pub w_up: WeightMatrix,       // (intermediate, hidden)
    pub w_down: WeightMatrix,     // (hidden, intermediate)
}

/// A loaded model: config plus every weight, ready for a backend.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub file: Arc<GgufFile>,
    pub token_embd: WeightMatrix, // (vocab, hidden)
    pub output_norm: Vec<f32>,    // (hidden)
    /// Output projection; the same bytes as `token_embd` when the embeddings are tied.
    pub output: WeightMatrix, // (vocab, hidden)
    pub tied_embeddings: bool,
    pub layers: Vec<LayerWeights>,
}

/// Collects every problem with a model's tensors before failing, so one error lists them all.
struct Binder<'a> {
    file: &'a Arc<GgufFile>,
    problems: Vec<String>,
}

impl<'a> Binder<'a> {
    fn info(&mut self, name: &str) -> Option<(usize, &'a flowrt_gguf::TensorInfo)> {
        let t = self.file.tensors().iter().position(|t| t.name == name);
        match t {
            Some(i) => Some((i, &self.file.tensors()[i])),
            None => {
                self.problems.push(format!("missing tensor `{name}`"));
                None
            }
        }
    }

    fn matrix(
        &mut self,
        role: TensorRole,
        layer: usize,
        rows: usize,
        cols: usize,
    ) -> Option<WeightMatrix> {
        let name = role.gguf_name(layer);
        let (index, t) = self.info(&name)?;
        let dims: Vec<u64> = t.dims.clone();
        if dims != [cols as u64, rows as u64] {
            self.problems.push(format!(
                "tensor `{name}` has shape {dims:?}, expected [{cols}, {rows}] (ggml order)"
            ));
            return None;
        }
        let row_bytes = match t.ggml_type.row_size(cols as u64) {
            Ok(b) => b as usize,
            Err(e) => {
                self.problems.push(format!("tensor `{name}`: {e}"));
                return None;
            }
        };
        Some(WeightMatrix {
            name,
            dtype: t.ggml_type,
            rows,
            cols,
            row_bytes,
            data: WeightData::Mapped {
                file: self.file.clone(),
                tensor: index,
            },
        })
    }

    fn vector(&mut self, role: TensorRole, layer: usize, len: usize) -> Option<Vec<f32>> {
        let name = role.gguf_name(layer);
        let (_, t) = self.info(&name)?;
        self.vector_from(t, &name, len)
    }

    fn vector_from(
        &mut self,
        t: &flowrt_gguf::TensorInfo,
        name: &str,
        len: usize,
    ) -> Option<Vec<f32>> {
        if t.dims != [len as u64] {
            self.problems.push(format!(
                "tensor `{name}` has shape {:?}, expected [{len}]",
                t.dims
            ));
            return None;
        }
        let bytes = self.file.tensor_data(t);
        let v: Vec<f32> = match t.ggml_type {
            GgmlType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            GgmlType::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            GgmlType::BF16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            ty => {
                self.problems.push(format!(
                    "tensor `{name}` has type {ty}; vectors must be f32, f16 or bf16"
                ));
                return None;
            }
        };
        Some(v)
    }
}

impl Model {
    /// Bind the tensors of a GGUF model to roles, checking every name, shape and type.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let path = file_name(&file);
        let c = &config;
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let mut b = Binder {
            file: &file,
            problems: Vec::new(),
        };

        let token_embd = b.matrix(TensorRole::TokenEmbd, 0, c.vocab_size, h);
        let output_norm = b.vector(TensorRole::OutputNorm, 0, h);
        let tied_embeddings = file.tensor(&TensorRole::Output.gguf_name(0)).is_none();
        let output = if tied_embeddings {
            token_embd.clone()
        } else {
            b.matrix(TensorRole::Output, 0, c.vocab_size, h)
        };

        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            use TensorRole::*;
            let layer = (|| {
                let bias = |b: &mut Binder, role, len| {
                    if c.arch.qkv_bias {
                        b.vector(role, l, len).map(Some)
                    } else {
                        Some(None)
                    }
                };
                let qk_norm = |b: &mut Binder, role| {
                    if c.arch.qk_norm {
                        b.vector(role, l, c.head_dim).map(Some)
                    } else {
                        Some(None)
                    }
                };
                // Bind every tensor (so all problems are collected), then assemble.
                let attn_norm = b.vector(AttnNorm, l, h);
                let wq = b.matrix(AttnQ, l, q, h);
                let wk = b.matrix(AttnK, l, kv, h);
                let wv = b.matrix(AttnV, l, kv, h);
                let bq = bias(&mut b, AttnQBias, q);
                let bk = bias(&mut b, AttnKBias, kv);
                let bv = bias(&mut b, AttnVBias, kv);
                let q_norm = qk_norm(&mut b, AttnQNorm);
                let k_norm = qk_norm(&mut b, AttnKNorm);
                let wo = b.matrix(AttnOutput, l, h, q);
                let ffn_norm = b.vector(FfnNorm, l, h);
                let w_gate = b.matrix(FfnGate, l, ff, h);
                let w_up = b.matrix(FfnUp, l, ff, h);
                let w_down = b.matrix(FfnDown, l, h, ff);
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
                    ffn_norm: ffn_norm?,
                    w_gate: w_gate?,
                    w_up: w_up?,
                    w_down: w_down?,
                })
            })();
            if let Some(layer) = layer {
                layers.push(layer);
            }
        }
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
            file,
            token_embd,
            output_norm,
            output,
            tied_embeddings,
            layers,
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
