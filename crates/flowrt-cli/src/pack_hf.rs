//! `flowrt pack` from a Hugging Face checkpoint directory of any family flowrt runs.
//!
//! The config is read by flowrt's own reader ([`ModelConfig::from_hf_json`]), so the GGUF
//! carries the model flowrt runs from the directory. What is written follows llama.cpp's
//! converter (`convert_hf_to_gguf.py`, gguf-py's key and tensor names): the GGUF architecture
//! it picks for the family ([`TARGETS`]), `{arch}.*` hyperparameters, `blk.N.*` tensor names
//! ([`TensorRole::gguf_name`]), attn_q / attn_k rows permuted per head for architectures that
//! rotate adjacent pairs, RMSNorm weights stored as `offset + w` for families whose HF
//! checkpoints store `w` (Gemma), Llama 3 RoPE as `rope_freqs.weight`, LongRoPE as
//! `rope_factors_long.weight` / `rope_factors_short.weight` with `rope.scaling.*` keys, and
//! gpt2-style tokenizer metadata. Where flowrt needs a value llama.cpp's converter does not
//! write (a sliding-window layer pattern, `query_pre_attn_scalar`, a Mistral window), pack
//! writes llama.cpp's key for it; [`HfSource::llama_cpp_caveats`] says which of them
//! llama.cpp's loader for that architecture would not honour.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use flowrt_dtype::GgmlType;
use flowrt_gguf::{Array, StringArray, Value};
use flowrt_kernels::Kernels;
use flowrt_model::arch::{
    self, Activation, ArchSpec, EmbedScale, HfExperts, RouterScoring, Scalings,
};
use flowrt_model::rope::yarn_attention_factor;
use flowrt_model::safetensors_dir::SafetensorsDir;
use flowrt_model::{LayerType, ModelConfig, RopeConfig, RopePairing, RopeScaling, TensorRole};
use serde_json::Value as Json;

use super::{Layout, SrcTensor};

/// How llama.cpp's loader for a GGUF architecture treats sliding windows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Swa {
    /// The architecture has none: every layer attends to the whole context.
    None,
    /// Every `n`-th layer global, the others sliding, whatever the file says (llama.cpp's
    /// `set_swa_pattern(n)`; `attention.sliding_window_pattern` is not read).
    FixedEvery(usize),
}

/// Where llama.cpp's graph for an architecture applies `final_logit_softcapping`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Softcap {
    /// Never.
    Never,
    /// Only for files without a sliding window (llama.cpp's non-iSWA Gemma 3 graph).
    WithoutWindow,
    /// Always (Gemma 2).
    Always,
}

/// What llama.cpp's loader and graph for a GGUF architecture do not take from the file (read
/// from llama.cpp's `src/llama-model.cpp` and `src/models/*.cpp`).
#[derive(Clone, Copy, Debug)]
struct LlamaCpp {
    swa: Swa,
    /// RoPE base of sliding layers, fixed by the loader (`rope.freq_base_swa` not read).
    local_rope_theta: Option<f32>,
    /// Whether `attention.scale` is read (else scores are scaled by 1/√head_dim).
    reads_attention_scale: bool,
    /// Every `n`-th layer skips RoPE, fixed by the graph (`n_no_rope_layer_step`; no key is
    /// read); `None`: every layer is rotated.
    no_rope_every: Option<usize>,
    softcap: Softcap,
    /// Whether the graph soft-caps attention scores by `attn_logit_softcapping`.
    attn_softcap: bool,
    /// Whether `leading_dense_block_count` is read (dense feed-forward blocks before the
    /// experts); other MoE loaders expect experts in every layer.
    reads_leading_dense: bool,
}

// No loader of llama-cpp-python 0.3.36 applies `expert_weights_scale` to the families pack
// writes (measured on lfm2moe: routed_scaling_factor 1.7 gives a mean KL of 1.5e-2 against
// flowrt, 1.0 gives 1.7e-9), so a scale other than 1 is always a caveat.

/// How pack writes one family: the GGUF architecture llama.cpp's converter writes it as, and
/// what llama.cpp's loader for that architecture does not honour.
#[derive(Debug)]
struct Target {
    /// [`ArchSpec::name`].
    family: &'static str,
    /// `general.architecture`.
    gguf_arch: &'static str,
    llama_cpp: LlamaCpp,
}

/// Plain decoders: no window, no scale key, no soft-capping in llama.cpp.
const PLAIN: LlamaCpp = LlamaCpp {
    swa: Swa::None,
    local_rope_theta: None,
    reads_attention_scale: false,
    no_rope_every: None,
    softcap: Softcap::Never,
    attn_softcap: false,
    reads_leading_dense: false,
};

/// One row per family flowrt runs.
const TARGETS: [Target; 14] = [
    Target {
        family: "llama",
        gguf_arch: "llama",
        llama_cpp: PLAIN,
    },
    // llama.cpp's converter registers MistralForCausalLM as its Llama model: arch `llama`,
    // Q/K permuted, `sliding_window` not written and not read.
    Target {
        family: "mistral",
        gguf_arch: "llama",
        llama_cpp: PLAIN,
    },
    Target {
        family: "qwen2",
        gguf_arch: "qwen2",
        llama_cpp: PLAIN,
    },
    Target {
        family: "qwen3",
        gguf_arch: "qwen3",
        llama_cpp: PLAIN,
    },
    // llama.cpp's gemma3 loader: `set_swa_pattern(6)`, sliding layers' base 10 000, scale
    // 1/√head_dim (1/√(hidden/heads) for 62-layer models); soft-capping only without SWA.
    Target {
        family: "gemma3",
        gguf_arch: "gemma3",
        llama_cpp: LlamaCpp {
            swa: Swa::FixedEvery(6),
            local_rope_theta: Some(10_000.0),
            reads_attention_scale: false,
            no_rope_every: None,
            softcap: Softcap::WithoutWindow,
            attn_softcap: false,
            reads_leading_dense: false,
        },
    },
    // llama.cpp's gemma2 loader: `set_swa_pattern(2)` (even layers slide), one RoPE base,
    // scale 1/√head_dim (1/√(hidden/heads) for the 27B), both soft-caps from the file.
    Target {
        family: "gemma2",
        gguf_arch: "gemma2",
        llama_cpp: LlamaCpp {
            swa: Swa::FixedEvery(2),
            softcap: Softcap::Always,
            attn_softcap: true,
            ..PLAIN
        },
    },
    Target {
        family: "minicpm",
        gguf_arch: "minicpm",
        llama_cpp: PLAIN,
    },
    // llama.cpp's granite loader reads all four multipliers, `attention.scale` included.
    Target {
        family: "granite",
        gguf_arch: "granite",
        llama_cpp: LlamaCpp {
            reads_attention_scale: true,
            ..PLAIN
        },
    },
    // llama.cpp's smollm3 graph skips RoPE on every 4th layer, fixed, reading no key.
    Target {
        family: "smollm3",
        gguf_arch: "smollm3",
        llama_cpp: LlamaCpp {
            no_rope_every: Some(4),
            ..PLAIN
        },
    },
    // llama.cpp's phi3: fused `attn_qkv` and `ffn_up` (gate then up) as the HF checkpoint
    // stores them, NeoX RoPE (no permutation); its loader reads `attention.sliding_window`
    // but switches Phi's window off ("Phi SWA is currently disabled").
    Target {
        family: "phi3",
        gguf_arch: "phi3",
        llama_cpp: PLAIN,
    },
    // llama.cpp's qwen3moe: every layer sparse (no key for HF's `mlp_only_layers`), top-k
    // weights always renormalised.
    Target {
        family: "qwen3moe",
        gguf_arch: "qwen3moe",
        llama_cpp: PLAIN,
    },
    // llama.cpp's lfm2: per-layer `attention.head_count_kv` (0: a convolution layer),
    // `shortconv.l_cache`, the final norm as `token_embd_norm`.
    Target {
        family: "lfm2",
        gguf_arch: "lfm2",
        llama_cpp: PLAIN,
    },
    // llama.cpp's lfm2moe: lfm2's layers, `leading_dense_block_count` dense feed-forward
    // blocks first, a sigmoid router with a selection bias (`exp_probs_b`).
    Target {
        family: "lfm2moe",
        gguf_arch: "lfm2moe",
        llama_cpp: LlamaCpp {
            reads_leading_dense: true,
            ..PLAIN
        },
    },
    // llama.cpp's gpt-oss: `set_swa_pattern(2)` (even layers slide), SwiGLU alpha 1.702 and
    // limit 7.0 fixed, YaRN always truncated.
    Target {
        family: "gpt-oss",
        gguf_arch: "gpt-oss",
        llama_cpp: LlamaCpp {
            swa: Swa::FixedEvery(2),
            ..PLAIN
        },
    },
];

fn target(family: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.family == family)
}

/// Per-layer roles in the order they are written.
const LAYER_ROLES: [TensorRole; 38] = {
    use TensorRole::*;
    [
        AttnNorm,
        AttnQkv,
        AttnQ,
        AttnK,
        AttnV,
        AttnQBias,
        AttnKBias,
        AttnVBias,
        AttnQNorm,
        AttnKNorm,
        AttnOutput,
        AttnOutputBias,
        AttnSinks,
        AttnPostNorm,
        ShortConvIn,
        ShortConvInBias,
        ShortConvKernel,
        ShortConvKernelBias,
        ShortConvOut,
        ShortConvOutBias,
        FfnNorm,
        FfnGateUp,
        FfnGate,
        FfnUp,
        FfnUpBias,
        FfnDown,
        FfnDownBias,
        FfnGateInp,
        FfnGateInpBias,
        FfnExpProbsB,
        FfnGateExps,
        FfnUpExps,
        FfnDownExps,
        FfnGateExpsBias,
        FfnUpExpsBias,
        FfnDownExpsBias,
        FfnPostNorm,
        // Never written (HF-only roles); listed so every layer role is decided here.
        FfnGateUpExps,
    ]
};

/// Whether layer `l` of the model has a tensor of `role` in GGUF.
fn uses(c: &ModelConfig, role: TensorRole, l: usize) -> bool {
    use TensorRole::*;
    let arch = c.arch;
    let attends = !c.layer_is_conv(l);
    let sparse = c.layer_moe(l).is_some();
    match role {
        // Fused families are written fused, as llama.cpp's converter writes them.
        AttnQkv => attends && arch.fused_qkv,
        AttnQ | AttnK | AttnV => attends && !arch.fused_qkv,
        AttnQBias | AttnKBias | AttnVBias => attends && arch.qkv_bias,
        AttnQNorm | AttnKNorm => attends && arch.qk_norm,
        AttnOutput => attends,
        AttnOutputBias => attends && arch.dense_bias,
        AttnSinks => attends && arch.attn_sinks,
        AttnPostNorm | FfnPostNorm => arch.sandwich_norms,
        ShortConvIn | ShortConvKernel | ShortConvOut => !attends,
        ShortConvInBias | ShortConvKernelBias | ShortConvOutBias => {
            !attends && c.short_conv.as_ref().is_some_and(|sc| sc.bias)
        }
        FfnExpProbsB => sparse && c.moe.as_ref().is_some_and(|m| m.router.selection_bias),
        FfnGateUp => !sparse && arch.gated_ffn && arch.fused_gate_up,
        FfnGate => !sparse && arch.gated_ffn && !arch.fused_gate_up,
        FfnUp => !(sparse || arch.gated_ffn && arch.fused_gate_up),
        FfnDown => !sparse,
        FfnUpBias | FfnDownBias => !sparse && arch.dense_bias,
        FfnGateInp | FfnGateExps | FfnUpExps | FfnDownExps => sparse,
        FfnGateInpBias | FfnGateExpsBias | FfnUpExpsBias | FfnDownExpsBias => {
            sparse && arch.moe_bias
        }
        FfnGateUpExps | FfnGateUpExpsBias => false,
        _ => true,
    }
}

/// Metadata entries and the tensors to write.
pub(crate) type Plan<'a> = (Vec<(String, Value)>, Vec<SrcTensor<'a>>);

/// A tensor pack computes (offset norms, RoPE divisors): f32, little-endian.
struct Made {
    /// GGUF name.
    name: String,
    /// GGUF dims (`dims[0]` contiguous).
    dims: Vec<u64>,
    values: Vec<u8>,
}

pub(crate) struct HfSource {
    dir: PathBuf,
    /// config.json as written.
    json: Json,
    /// The model flowrt runs from the directory.
    cfg: ModelConfig,
    target: &'static Target,
    st: SafetensorsDir,
    pre: Option<String>,
    made: Vec<Made>,
}

fn read_json(path: &Path) -> Result<Json> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl HfSource {
    /// Drops a written tensor's pages from the resident set (the checkpoint is read once).
    pub(crate) fn release(&self, data: &[u8]) {
        self.st.release(data);
    }

    pub(crate) fn open(dir: &Path, pre: Option<&str>) -> Result<HfSource> {
        let path = dir.join("config.json");
        let json = read_json(&path)?;
        let cfg = ModelConfig::from_hf_json(&path, &json)?;
        let target = target(cfg.arch.name).with_context(|| {
            format!(
                "{}: pack has no GGUF layout for the `{}` family",
                dir.display(),
                cfg.arch.name
            )
        })?;
        let st = SafetensorsDir::open(dir)
            .with_context(|| format!("cannot open the weights of {}", dir.display()))?;
        let mut src = HfSource {
            dir: dir.to_path_buf(),
            json,
            cfg,
            target,
            st,
            pre: pre.map(str::to_string),
            made: Vec::new(),
        };
        src.made = src.make_tensors()?;
        Ok(src)
    }

    /// The flowrt family the GGUF is read back as (the file's architecture).
    fn gguf_spec(&self) -> &'static ArchSpec {
        arch::by_gguf_arch(self.target.gguf_arch).expect("every target arch is a flowrt family")
    }

    /// HF name of `role` in `layer` (`None`: the format has none).
    fn hf_name(&self, role: TensorRole, layer: usize) -> Option<String> {
        let (prefix, head_prefix) = self.st.decoder_prefixes();
        let n = role.hf_name(self.cfg.arch, layer)?;
        Some(if role.hf_in_decoder() {
            format!("{prefix}{n}")
        } else {
            format!("{head_prefix}{n}")
        })
    }

    /// Whether the output projection is the embedding matrix.
    fn tied(&self) -> bool {
        let has_head = self
            .hf_name(TensorRole::Output, 0)
            .is_some_and(|n| self.st.tensors.contains_key(&n));
        self.cfg.tie_word_embeddings.unwrap_or(!has_head)
    }

    /// Every (role, layer) the GGUF holds, in writing order.
    fn roles(&self) -> Vec<(TensorRole, usize)> {
        let mut out = vec![(TensorRole::TokenEmbd, 0)];
        for l in 0..self.cfg.num_hidden_layers {
            out.extend(
                LAYER_ROLES
                    .iter()
                    .filter(|&&r| uses(&self.cfg, r, l))
                    .map(|&r| (r, l)),
            );
        }
        out.push((TensorRole::OutputNorm, 0));
        if !self.tied() {
            out.push((TensorRole::Output, 0));
        }
        out
    }

    /// Norm weights with the family's HF offset added, and the RoPE divisor tensors.
    fn make_tensors(&self) -> Result<Vec<Made>> {
        let mut made = Vec::new();
        let c = &self.cfg;
        match &c.rope.scaling {
            RopeScaling::None | RopeScaling::Linear { .. } | RopeScaling::Yarn { .. } => {}
            // llama.cpp stores Llama 3's scaling as per-dimension divisors of the plain
            // frequencies (1, factor, or 1 / ((1 - smooth) / factor + smooth)); these are
            // the divisors of flowrt's own scaled frequencies.
            RopeScaling::Llama3 { .. } => {
                let v = freq_divisors(&c.rope, c.rope_dim);
                made.push(Made {
                    name: TensorRole::RopeFreqs.gguf_name(0),
                    dims: vec![v.len() as u64],
                    values: f32_bytes(&v),
                })
            }
            RopeScaling::LongRope { .. } => {
                let (short, long) = self.longrope_factors()?;
                for (role, v) in [
                    (TensorRole::RopeFactorsLong, long),
                    (TensorRole::RopeFactorsShort, short),
                ] {
                    made.push(Made {
                        name: role.gguf_name(0),
                        dims: vec![v.len() as u64],
                        values: f32_bytes(&v),
                    });
                }
            }
            RopeScaling::FreqFactors(_) => {
                bail!("config.json: RoPE divisors cannot come from an HF config")
            }
        }
        let offset = c.arch.hf_norm_offset;
        if offset != 0.0 {
            let k = Kernels::detect();
            for (role, l) in self.roles().into_iter().filter(|(r, _)| r.is_norm()) {
                let Some(hn) = self.hf_name(role, l) else {
                    continue;
                };
                let Some(e) = self.st.tensors.get(&hn) else {
                    continue; // reported as missing by `plan`
                };
                let ty = match &e.dtype {
                    Ok(ty) if Kernels::supports_conversion(*ty) && e.shape.len() == 1 => *ty,
                    Ok(ty) => bail!(
                        "tensor `{hn}`: a norm weight of type {ty}, shape {:?}",
                        e.shape
                    ),
                    Err(name) => bail!("tensor `{hn}`: pack cannot read dtype {name}"),
                };
                let bytes = self.st.bytes(e);
                let n = e.shape[0];
                anyhow::ensure!(
                    bytes.len() == flowrt_kernels::row_size(ty, n),
                    "tensor `{hn}`: {} bytes stored, its shape needs {}",
                    bytes.len(),
                    flowrt_kernels::row_size(ty, n)
                );
                let mut v = vec![0f32; n];
                k.dequantize_row(ty, bytes, &mut v);
                v.iter_mut().for_each(|x| *x += offset);
                made.push(Made {
                    name: role.gguf_name_in(self.gguf_spec(), l),
                    dims: vec![n as u64],
                    values: f32_bytes(&v),
                });
            }
        }
        made.extend(self.split_expert_biases()?);
        Ok(made)
    }

    /// HF's fused experts' gate/up biases `(experts, 2 × width)`, gate at even indices, split
    /// into GGUF's `ffn_gate_exps.bias` and `ffn_up_exps.bias` (`[width, experts]` each).
    fn split_expert_biases(&self) -> Result<Vec<Made>> {
        let c = &self.cfg;
        let mut made = Vec::new();
        if c.arch.hf_experts != HfExperts::FusedTransposed || !c.arch.moe_bias {
            return Ok(made);
        }
        let k = Kernels::detect();
        for l in 0..c.num_hidden_layers {
            let Some(m) = c.layer_moe(l) else { continue };
            let (n, ff) = (m.num_experts, m.moe_intermediate_size);
            let Some(hn) = self.hf_name(TensorRole::FfnGateUpExpsBias, l) else {
                continue;
            };
            let Some(e) = self.st.tensors.get(&hn) else {
                continue; // reported as missing by `plan`
            };
            if e.shape.len() == 2 && e.shape[1] == 2 * ff && e.shape[0] != n {
                bail!(
                    "tensor `{hn}` holds {} experts but the expert count (num_local_experts) is {n}",
                    e.shape[0]
                );
            }
            if e.shape != [n, 2 * ff] {
                bail!(
                    "tensor `{hn}` has shape {:?}, expected [{n}, {}] (num_local_experts, 2 × intermediate_size)",
                    e.shape,
                    2 * ff
                );
            }
            let ty = match &e.dtype {
                Ok(ty) if Kernels::supports_conversion(*ty) => *ty,
                Ok(ty) => bail!("tensor `{hn}`: pack cannot read type {ty}"),
                Err(name) => bail!("tensor `{hn}`: pack cannot read dtype {name}"),
            };
            let bytes = self.st.bytes(e);
            let row = flowrt_kernels::row_size(ty, 2 * ff);
            anyhow::ensure!(
                bytes.len() == n * row,
                "tensor `{hn}`: {} bytes stored, its shape needs {}",
                bytes.len(),
                n * row
            );
            let (mut gate, mut up) = (Vec::with_capacity(n * ff), Vec::with_capacity(n * ff));
            let mut v = vec![0f32; 2 * ff];
            for r in bytes.chunks_exact(row) {
                k.dequantize_row(ty, r, &mut v);
                gate.extend(v.iter().step_by(2));
                up.extend(v.iter().skip(1).step_by(2));
            }
            for (role, vals) in [
                (TensorRole::FfnGateExpsBias, gate),
                (TensorRole::FfnUpExpsBias, up),
            ] {
                made.push(Made {
                    name: role.gguf_name_in(self.gguf_spec(), l),
                    dims: vec![ff as u64, n as u64],
                    values: f32_bytes(&vals),
                });
            }
        }
        Ok(made)
    }

    /// LongRoPE's short and long divisors as config.json gives them (flowrt's config holds
    /// only the set the family runs with).
    fn longrope_factors(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let c = self.json.get("text_config").unwrap_or(&self.json);
        let p = &c["rope_parameters"];
        let obj = [&p["full_attention"], p, &c["rope_scaling"]]
            .into_iter()
            .find(|o| o.get("long_factor").is_some())
            .context("config.json: LongRoPE without `long_factor`")?;
        let list = |k: &str| -> Result<Vec<f32>> {
            obj[k]
                .as_array()
                .with_context(|| format!("config.json: LongRoPE `{k}` is not a list"))?
                .iter()
                .map(|v| {
                    v.as_f64()
                        .map(|x| x as f32)
                        .with_context(|| format!("config.json: LongRoPE `{k}` holds {v}"))
                })
                .collect()
        };
        Ok((list("short_factor")?, list("long_factor")?))
    }

    /// The `{arch}.*` hyperparameters.
    fn hyperparameters(&self) -> Result<Vec<(String, Value)>> {
        let c = &self.cfg;
        let a = self.target.gguf_arch;
        let k = |key: &str| format!("{a}.{key}");
        let u = |v: usize| Value::U32(v as u32);
        let swiglu = match (c.activation, c.arch.activation) {
            (
                Activation::ClampedSwiglu { alpha, limit },
                Activation::ClampedSwiglu {
                    alpha: a0,
                    limit: l0,
                },
            ) => Some((alpha, limit, a0, l0)),
            _ => None,
        };
        if swiglu.is_none() && c.activation != c.arch.activation {
            bail!(
                "config.json: activation {:?} is not the `{}` family's {:?}, and GGUF `{a}` has no key for it",
                c.activation,
                c.arch.name,
                c.arch.activation
            );
        }
        // Hybrid families: KV heads per layer, 0 on convolution layers (llama.cpp's lfm2).
        let kv_heads = match &c.short_conv {
            Some(sc) => Value::Array(Array::U32(
                sc.conv_layers
                    .iter()
                    .map(|&conv| {
                        if conv {
                            0
                        } else {
                            c.num_key_value_heads as u32
                        }
                    })
                    .collect(),
            )),
            None => u(c.num_key_value_heads),
        };
        let mut meta: Vec<(String, Value)> = vec![
            (k("context_length"), u(c.max_position_embeddings)),
            (k("embedding_length"), u(c.hidden_size)),
            (k("block_count"), u(c.num_hidden_layers)),
            (k("feed_forward_length"), u(c.intermediate_size)),
            (k("attention.head_count"), u(c.num_attention_heads)),
            (k("attention.head_count_kv"), kv_heads),
            (
                k("attention.layer_norm_rms_epsilon"),
                Value::F32(c.rms_norm_eps),
            ),
            (k("attention.key_length"), u(c.head_dim)),
            (k("attention.value_length"), u(c.head_dim)),
            (k("rope.dimension_count"), u(c.rope_dim)),
            (k("rope.freq_base"), Value::F32(c.rope.theta)),
            (k("vocab_size"), u(c.vocab_size)),
        ];
        if let Some(sc) = &c.short_conv {
            meta.push((k("shortconv.l_cache"), u(sc.kernel)));
        }
        // Mixtures of experts: llama.cpp's keys; HF's dense layers (`mlp_only_layers`,
        // `decoder_sparse_step`) under flowrt's `mlp_only_layers` (llama.cpp has no key).
        if let Some(m) = &c.moe {
            meta.push((k("expert_count"), u(m.num_experts)));
            meta.push((k("expert_used_count"), u(m.num_experts_per_tok)));
            meta.push((k("expert_feed_forward_length"), u(m.moe_intermediate_size)));
            // Whether top-k weights are renormalised: a question for softmax and sigmoid
            // routers (gpt-oss's softmax over the top k needs none).
            if m.router.scoring != RouterScoring::TopKSoftmax {
                meta.push((k("expert_weights_norm"), Value::Bool(m.router.renormalize)));
            }
            if m.router.scoring == RouterScoring::Sigmoid {
                // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
                meta.push((k("expert_gating_func"), Value::U32(2)));
            }
            if m.router.scale != 1.0 {
                meta.push((k("expert_weights_scale"), Value::F32(m.router.scale)));
            }
            // Dense layers: a leading run as llama.cpp's `leading_dense_block_count` (its
            // lfm2moe reads it; flowrt reads it for every family), the rest as flowrt's
            // `mlp_only_layers`.
            let lead = m
                .sparse_layers
                .iter()
                .take_while(|&&sparse| !sparse)
                .count();
            if lead > 0 {
                meta.push((k("leading_dense_block_count"), u(lead)));
            }
            let dense: Vec<u32> = (lead..c.num_hidden_layers)
                .filter(|&l| !m.sparse_layers[l])
                .map(|l| l as u32)
                .collect();
            if !dense.is_empty() {
                meta.push((k("mlp_only_layers"), Value::Array(Array::U32(dense))));
            }
        }
        // gpt-oss's clamped SwiGLU: flowrt's keys where the model differs from the family's
        // (llama.cpp's fixed) values.
        if let Some((alpha, limit, a0, l0)) = swiglu {
            if alpha != a0 {
                meta.push((k("swiglu_alpha"), Value::F32(alpha)));
            }
            if limit != l0 {
                meta.push((k("swiglu_limit"), Value::F32(limit)));
            }
        }
        match &c.rope.scaling {
            RopeScaling::Linear { factor } => {
                meta.push((k("rope.scaling.type"), "linear".into()));
                meta.push((k("rope.scaling.factor"), Value::F32(*factor)));
            }
            RopeScaling::LongRope {
                original_max_position_embeddings,
                attention_factor,
                ..
            } => {
                meta.push((k("rope.scaling.type"), "longrope".into()));
                meta.push((
                    k("rope.scaling.original_context_length"),
                    u(*original_max_position_embeddings),
                ));
                meta.push((k("rope.scaling.attn_factor"), Value::F32(*attention_factor)));
            }
            // llama.cpp's converter's keys. The ramp ends are always rounded outwards there;
            // `truncate: false` (gpt-oss) goes under flowrt's `rope.scaling.yarn_truncate`. The
            // cos/sin factor is written, as the converter does, only when it is not the default.
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor,
            } => {
                meta.push((k("rope.scaling.type"), "yarn".into()));
                // flowrt's key for transformers' `truncate: false` (llama.cpp always
                // truncates; the report says so).
                if !truncate {
                    meta.push((k("rope.scaling.yarn_truncate"), Value::Bool(false)));
                }
                meta.push((k("rope.scaling.factor"), Value::F32(*factor)));
                meta.push((
                    k("rope.scaling.original_context_length"),
                    u(*original_max_position_embeddings),
                ));
                meta.push((k("rope.scaling.yarn_beta_fast"), Value::F32(*beta_fast)));
                meta.push((k("rope.scaling.yarn_beta_slow"), Value::F32(*beta_slow)));
                if *attention_factor != yarn_attention_factor(*factor as f64, None, None) {
                    meta.push((
                        k("rope.scaling.yarn_attn_factor"),
                        Value::F32(*attention_factor),
                    ));
                }
            }
            // As tensors (`make_tensors`), or nothing.
            RopeScaling::None | RopeScaling::Llama3 { .. } | RopeScaling::FreqFactors(_) => {}
        }
        if let Some(w) = c.sliding_window {
            meta.push((k("attention.sliding_window"), u(w)));
            let flags: Vec<bool> = c
                .layer_types
                .iter()
                .map(|&t| t == LayerType::Sliding)
                .collect();
            meta.push((
                k("attention.sliding_window_pattern"),
                Value::Array(Array::Bool(flags)),
            ));
            if let Some(local) = &c.rope_local {
                if local.scaling != RopeScaling::None {
                    bail!("config.json: the sliding layers' RoPE is scaled; GGUF `{a}` has no key for it");
                }
                meta.push((k("rope.freq_base_swa"), Value::F32(local.theta)));
            }
        }
        // Families that state their scale (Granite) always carry the key llama.cpp requires.
        let direct = matches!(c.arch.scalings, Scalings::Direct { .. });
        if direct || c.attn_scale != c.gguf_default_attn_scale() {
            meta.push((k("attention.scale"), Value::F32(c.attn_scale)));
        }
        if let Some(cap) = c.final_logit_softcapping {
            meta.push((k("final_logit_softcapping"), Value::F32(cap)));
        }
        if let Some(cap) = c.attn_logit_softcapping {
            meta.push((k("attn_logit_softcapping"), Value::F32(cap)));
        }
        // NoPE layers: HF's list (1: RoPE, 0: none), which flowrt's reader takes over the
        // family's interval.
        if c.arch.defaults.no_rope_layer_interval.is_some() {
            let list = c.rope_layers.iter().map(|&r| u32::from(r)).collect();
            meta.push((k("no_rope_layers"), Value::Array(Array::U32(list))));
        }
        if matches!(c.arch.embed_scale, EmbedScale::FromConfig(_)) {
            meta.push((k("embedding_scale"), Value::F32(c.embedding_multiplier)));
        }
        if c.arch.scalings != Scalings::None {
            meta.push((k("residual_scale"), Value::F32(c.residual_multiplier)));
            // The divisor as config.json states it when it states one (Granite's
            // `logits_scaling`), rather than the reciprocal of the rounded multiplier.
            let stated = match c.arch.scalings {
                Scalings::Direct { logit_divisor, .. } => self
                    .json
                    .get("text_config")
                    .unwrap_or(&self.json)
                    .get(logit_divisor)
                    .and_then(Json::as_f64),
                _ => None,
            };
            let divisor = stated.unwrap_or(1.0 / c.logit_multiplier as f64);
            meta.push((k("logit_scale"), Value::F32(divisor as f32)));
        }
        Ok(meta)
    }

    /// What llama.cpp's loader for the written architecture would run differently from this
    /// model (empty when nothing is known to differ).
    pub(crate) fn llama_cpp_caveats(&self) -> Vec<String> {
        let c = &self.cfg;
        let a = self.target.gguf_arch;
        let rules = self.target.llama_cpp;
        let mut out = Vec::new();
        let sliding: Vec<usize> = (0..c.num_hidden_layers)
            .filter(|&l| c.layer_types[l] == LayerType::Sliding)
            .collect();
        if let (Some(w), false) = (c.sliding_window, sliding.is_empty()) {
            match rules.swa {
                Swa::None => out.push(format!(
                    "its `{a}` loader has no sliding window: layers {sliding:?} would attend to \
                     the whole context instead of the last {w} positions"
                )),
                Swa::FixedEvery(n) => {
                    let fixed: Vec<usize> =
                        ModelConfig::pattern_layer_types(c.num_hidden_layers, n)
                            .iter()
                            .enumerate()
                            .filter(|(_, &t)| t == LayerType::Sliding)
                            .map(|(l, _)| l)
                            .collect();
                    if fixed != sliding {
                        out.push(format!(
                            "its `{a}` loader fixes every {n}th layer global and ignores \
                             attention.sliding_window_pattern: it would slide layers {fixed:?}, \
                             this model slides {sliding:?}"
                        ));
                    }
                }
            }
            if let (Some(fixed), Some(local)) = (rules.local_rope_theta, &c.rope_local) {
                if local.theta != fixed {
                    out.push(format!(
                        "its `{a}` loader fixes the sliding layers' RoPE base to {fixed} and \
                         ignores rope.freq_base_swa = {}",
                        local.theta
                    ));
                }
            }
        }
        let default_scale = c.gguf_default_attn_scale();
        if c.attn_scale != default_scale && !rules.reads_attention_scale {
            let rule = if flowrt_model::config::gguf_scales_by_hidden_per_head(
                c.arch,
                c.num_hidden_layers,
            ) {
                "1/sqrt(hidden/heads), by its layer count,"
            } else {
                "1/sqrt(head_dim)"
            };
            out.push(format!(
                "its `{a}` loader ignores attention.scale = {:.6}: it scales attention scores \
                 by {rule} = {default_scale:.6}",
                c.attn_scale,
            ));
        }
        let nope =
            |rope: &[bool]| -> Vec<usize> { (0..rope.len()).filter(|&l| !rope[l]).collect() };
        let fixed = match rules.no_rope_every {
            Some(n) => ModelConfig::interval_rope_layers(c.num_hidden_layers, n),
            None => vec![true; c.num_hidden_layers],
        };
        if fixed != c.rope_layers {
            out.push(format!(
                "its `{a}` graph skips RoPE on layers {:?} and reads no key for it; this \
                 model skips it on layers {:?}",
                nope(&fixed),
                nope(&c.rope_layers)
            ));
        }
        if let Some(cap) = c.final_logit_softcapping {
            let applied = match rules.softcap {
                Softcap::Never => false,
                Softcap::WithoutWindow => c.sliding_window.is_none(),
                Softcap::Always => true,
            };
            if !applied {
                out.push(format!(
                    "its `{a}` graph does not apply final_logit_softcapping = {cap} to this model"
                ));
            }
        }
        if let (Some(cap), false) = (c.attn_logit_softcapping, rules.attn_softcap) {
            out.push(format!(
                "its `{a}` graph does not soft-cap attention scores (attn_logit_softcapping = {cap})"
            ));
        }
        if let RopeScaling::Yarn {
            truncate: false, ..
        } = c.rope.scaling
        {
            out.push(
                "it always rounds YaRN's ramp ends outwards; this model does not \
                 (`truncate: false`, written as rope.scaling.yarn_truncate)"
                    .to_string(),
            );
        }
        if c.short_conv.as_ref().is_some_and(|sc| sc.bias) {
            out.push(format!(
                "its `{a}` graph has no convolution biases; this model has them (`conv_bias`, \
                 written as shortconv.*.bias)"
            ));
        }
        if let Some(m) = &c.moe {
            let lead = if rules.reads_leading_dense {
                m.sparse_layers
                    .iter()
                    .take_while(|&&sparse| !sparse)
                    .count()
            } else {
                0
            };
            let dense: Vec<usize> = (lead..c.num_hidden_layers)
                .filter(|&l| !m.sparse_layers[l])
                .collect();
            if !dense.is_empty() {
                out.push(format!(
                    "its `{a}` loader reads no mlp_only_layers: it expects experts in every \
                     layer{} and would refuse dense layers {dense:?}",
                    if lead > 0 {
                        " after the leading dense ones"
                    } else {
                        ""
                    }
                ));
            }
            if m.router.scale != 1.0 {
                out.push(format!(
                    "its `{a}` graph does not scale the expert weights; this model multiplies \
                     them by {} (routed_scaling_factor, written as expert_weights_scale)",
                    m.router.scale
                ));
            }
            if a == "qwen3moe" && !m.router.renormalize {
                out.push(format!(
                    "its `{a}` graph always renormalises the top-k expert weights; this model \
                     does not (norm_topk_prob false)"
                ));
            }
        }
        if let (
            Activation::ClampedSwiglu { alpha, limit },
            Activation::ClampedSwiglu {
                alpha: a0,
                limit: l0,
            },
        ) = (c.activation, c.arch.activation)
        {
            if (alpha, limit) != (a0, l0) {
                out.push(format!(
                    "its `{a}` graph fixes SwiGLU alpha {a0} and limit {l0}; this model has \
                     alpha {alpha}, limit {limit} (written as swiglu_alpha / swiglu_limit)"
                ));
            }
        }
        if let RopeScaling::LongRope {
            original_max_position_embeddings: orig,
            ..
        } = c.rope.scaling
        {
            let flowrt = if !c.arch.longrope_by_max_position {
                format!("switches to rope_factors_long from position {orig} on")
            } else if c.max_position_embeddings > orig {
                "uses rope_factors_long at every position".to_string()
            } else {
                "uses rope_factors_short at every position".to_string()
            };
            out.push(format!(
                "it uses rope_factors_long only when its context (-c) exceeds \
                 rope.scaling.original_context_length = {orig}, rope_factors_short otherwise; \
                 flowrt, like the HF model, {flowrt}"
            ));
        }
        out
    }

    /// The metadata and the tensors to write.
    pub(crate) fn plan<'a>(&'a self) -> Result<Plan<'a>> {
        let c = &self.cfg;
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), self.target.gguf_arch.into()),
            ("general.name".into(), name.into()),
        ];
        meta.extend(self.hyperparameters()?);
        meta.extend(self.tokenizer_metadata(c.vocab_size)?);

        let adjacent = self.gguf_spec().gguf_rope_pairing == RopePairing::Adjacent;
        let mut tensors: Vec<SrcTensor<'_>> = Vec::new();
        let made: HashMap<&str, &Made> = self.made.iter().map(|m| (m.name.as_str(), m)).collect();
        let made_tensor = |m: &'a Made| SrcTensor {
            name: m.name.clone(),
            dims: m.dims.clone(),
            ty: Ok(GgmlType::F32),
            data: &m.values,
            permute_heads: None,
            file_offset: 0,
            layout: Layout::Rows,
        };
        // Computed tensors that no role names (the RoPE divisors) go first.
        let roles = self.roles();
        let gguf_spec = self.gguf_spec();
        let role_names: HashSet<String> = roles
            .iter()
            .map(|&(r, l)| r.gguf_name_in(gguf_spec, l))
            .collect();
        for m in self.made.iter().filter(|m| !role_names.contains(&m.name)) {
            tensors.push(made_tensor(m));
        }
        let mut used: HashSet<String> = HashSet::new();
        let mut missing = Vec::new();
        for (role, l) in roles {
            let gn = role.gguf_name_in(gguf_spec, l);
            if let Some(m) = made.get(gn.as_str()) {
                // Computed from a stored tensor (offset norms, split expert biases).
                if let Some(hn) = self.hf_name(role, l) {
                    if !self.st.tensors.contains_key(&hn) {
                        missing.push(hn);
                        continue;
                    }
                    used.insert(hn);
                }
                if matches!(
                    role,
                    TensorRole::FfnGateExpsBias | TensorRole::FfnUpExpsBias
                ) {
                    if let Some(hn) = self.hf_name(TensorRole::FfnGateUpExpsBias, l) {
                        used.insert(hn);
                    }
                }
                tensors.push(made_tensor(m));
                continue;
            }
            if let Some(t) = self.expert_tensor(role, l, gn.clone(), &mut used, &mut missing)? {
                tensors.push(t);
                continue;
            }
            let Some(hn) = self.hf_name(role, l) else {
                if matches!(
                    role,
                    TensorRole::FfnGateExpsBias | TensorRole::FfnUpExpsBias
                ) {
                    // Split from the fused bias, which is missing (reported below).
                    if let Some(hn) = self.hf_name(TensorRole::FfnGateUpExpsBias, l) {
                        missing.push(hn);
                    }
                }
                continue;
            };
            let Some(e) = self.st.tensors.get(&hn) else {
                missing.push(hn);
                continue;
            };
            used.insert(hn.clone());
            let mut dims: Vec<u64> = e.shape.iter().rev().map(|&d| d as u64).collect();
            if role == TensorRole::ShortConvKernel {
                // HF (hidden, 1, kernel) -> GGUF [kernel, hidden], as llama.cpp's converter.
                match e.shape[..] {
                    [h, 1, k] | [h, k] => dims = vec![k as u64, h as u64],
                    _ => bail!(
                        "tensor `{hn}` has shape {:?}, expected (hidden_size, 1, conv_L_cache)",
                        e.shape
                    ),
                }
            }
            let permute_heads = match role {
                TensorRole::AttnQ if adjacent => Some(c.num_attention_heads),
                TensorRole::AttnK if adjacent => Some(c.num_key_value_heads),
                _ => None,
            };
            tensors.push(SrcTensor {
                name: gn,
                dims,
                ty: e.dtype.clone(),
                data: self.st.bytes(e),
                permute_heads,
                file_offset: e.start,
                layout: Layout::Rows,
            });
        }
        if !missing.is_empty() {
            let n = missing.len();
            missing.truncate(8);
            bail!("{n} tensor(s) missing from the checkpoint: {missing:?}");
        }
        // A tied checkpoint may still store the output matrix (the same values).
        if let Some(n) = self.hf_name(TensorRole::Output, 0) {
            used.insert(n);
        }
        let mut unused: Vec<&String> = self
            .st
            .tensors
            .keys()
            .filter(|k| !used.contains(k.as_str()) && !k.ends_with("rotary_emb.inv_freq"))
            .collect();
        if !unused.is_empty() {
            unused.sort();
            unused.truncate(8);
            bail!(
                "tensors the `{}` family does not use (is model_type right?): {unused:?}",
                c.arch.name
            );
        }
        Ok((meta, tensors))
    }

    /// The 3-D GGUF tensor of an experts role (`ffn_{gate,up,down}_exps`: one matrix per
    /// expert, `[in, out, experts]`), read from HF's per-expert tensors or from its fused,
    /// transposed ones; `None` for other roles, or when a source tensor is missing (recorded
    /// in `missing`).
    fn expert_tensor<'a>(
        &'a self,
        role: TensorRole,
        l: usize,
        gn: String,
        used: &mut HashSet<String>,
        missing: &mut Vec<String>,
    ) -> Result<Option<SrcTensor<'a>>> {
        use TensorRole::*;
        if !matches!(role, FfnGateExps | FfnUpExps | FfnDownExps) {
            return Ok(None);
        }
        let m = self
            .cfg
            .layer_moe(l)
            .context("an experts tensor in a dense layer")?;
        let (n, ff, h) = (m.num_experts, m.moe_intermediate_size, self.cfg.hidden_size);
        let width_key = self.cfg.arch.hf_expert_width_key;
        match self.cfg.arch.hf_experts {
            HfExperts::PerExpert => {
                let (prefix, _) = self.st.decoder_prefixes();
                let want = if role == FfnDownExps {
                    [h, ff]
                } else {
                    [ff, h]
                };
                let mut parts = Vec::with_capacity(n);
                let mut first: Option<(String, String, usize)> = None;
                for e in 0..n {
                    let hn = format!(
                        "{prefix}{}",
                        role.hf_expert_name_in(self.cfg.arch, l, e)
                            .context("an experts role")?
                    );
                    let Some(t) = self.st.tensors.get(&hn) else {
                        missing.push(format!(
                            "{hn} (expert {e} of {n}: num_experts / num_local_experts)"
                        ));
                        continue;
                    };
                    used.insert(hn.clone());
                    if t.shape != want {
                        bail!(
                            "tensor `{hn}` has shape {:?}, expected {want:?} (moe_intermediate_size = {ff}, hidden_size = {h})",
                            t.shape
                        );
                    }
                    let ty = format!("{:?}", t.dtype);
                    match &first {
                        None => first = Some((hn.clone(), ty, t.start)),
                        Some((f, fty, _)) if *fty != ty => {
                            bail!("tensor `{hn}` is stored as {ty}, expert 0 (`{f}`) as {fty}")
                        }
                        Some(_) => {}
                    }
                    parts.push((t, self.st.bytes(t)));
                }
                if parts.len() != n {
                    return Ok(None);
                }
                Ok(Some(SrcTensor {
                    name: gn,
                    dims: vec![want[1] as u64, want[0] as u64, n as u64],
                    ty: parts[0].0.dtype.clone(),
                    data: parts[0].1,
                    permute_heads: None,
                    file_offset: parts[0].0.start,
                    layout: Layout::Stacked(parts.iter().map(|p| p.1).collect()),
                }))
            }
            HfExperts::FusedTransposed => {
                // gate_up_proj (experts, hidden, 2 × width), gate at even indices;
                // down_proj (experts, width, hidden).
                let (src_role, want, k, w, step, offset) = match role {
                    FfnGateExps => (FfnGateUpExps, [n, h, 2 * ff], h, 2 * ff, 2, 0),
                    FfnUpExps => (FfnGateUpExps, [n, h, 2 * ff], h, 2 * ff, 2, 1),
                    _ => (FfnDownExps, [n, ff, h], ff, h, 1, 0),
                };
                let hn = self.hf_name(src_role, l).context("an experts role")?;
                let Some(e) = self.st.tensors.get(&hn) else {
                    if self.st.tensors.contains_key(&format!("{hn}_blocks")) {
                        // OpenAI's MXFP4 experts: (n, rows, cols / 32, 16) blocks and
                        // (n, rows, cols / 32) scales, rows the output features.
                        let (rows, cols) = (w, k);
                        return self.mxfp4_experts(
                            &hn,
                            gn,
                            [n, rows, cols],
                            step,
                            offset,
                            used,
                            missing,
                        );
                    }
                    missing.push(hn);
                    return Ok(None);
                };
                used.insert(hn.clone());
                if e.shape.len() == 3 && e.shape[1..] == want[1..] && e.shape[0] != n {
                    bail!(
                        "tensor `{hn}` holds {} experts but the expert count (num_local_experts) is {n}",
                        e.shape[0]
                    );
                }
                if e.shape != want {
                    bail!(
                        "tensor `{hn}` has shape {:?}, expected {want:?} (num_local_experts, then input and output features; {width_key} = {ff}, hidden_size = {h})",
                        e.shape
                    );
                }
                let out_rows = w.div_ceil(step).min(if step == 2 { ff } else { w });
                Ok(Some(SrcTensor {
                    name: gn,
                    dims: vec![k as u64, out_rows as u64, n as u64],
                    ty: e.dtype.clone(),
                    data: self.st.bytes(e),
                    permute_heads: None,
                    file_offset: e.start,
                    layout: Layout::Columns {
                        experts: n,
                        k,
                        w,
                        step,
                        offset,
                    },
                }))
            }
        }
    }

    /// One GGUF experts tensor `gn` from OpenAI's MXFP4 pair `{hn}_blocks` / `{hn}_scales` of
    /// `n` experts of `rows` output rows of `cols` inputs (GGUF row `i` = row `step · i +
    /// offset`), checked as the loader checks them. The config's `modules_to_not_convert`
    /// was checked by the loader that read the config ([`ModelConfig::hf_mxfp4`]).
    #[allow(clippy::too_many_arguments)]
    fn mxfp4_experts(
        &self,
        hn: &str,
        gn: String,
        [n, rows, cols]: [usize; 3],
        step: usize,
        offset: usize,
        used: &mut HashSet<String>,
        missing: &mut Vec<String>,
    ) -> Result<Option<SrcTensor<'_>>> {
        let (bn, sn) = (format!("{hn}_blocks"), format!("{hn}_scales"));
        let (Some(b), Some(s)) = (self.st.tensors.get(&bn), self.st.tensors.get(&sn)) else {
            missing.push(format!("{sn} (MXFP4 experts)"));
            return Ok(None);
        };
        used.insert(bn.clone());
        used.insert(sn.clone());
        anyhow::ensure!(
            cols.is_multiple_of(32),
            "tensor `{bn}`: {cols} input features are not a multiple of 32, MXFP4's block length"
        );
        let g = cols / 32;
        for (name, t, want) in [(&bn, b, vec![n, rows, g, 16]), (&sn, s, vec![n, rows, g])] {
            match &t.dtype {
                Err(ty) if ty == "U8" => {}
                Ok(ty) => {
                    bail!("tensor `{name}` has element type {ty}; MXFP4 blocks and scales are U8")
                }
                Err(ty) => {
                    bail!("tensor `{name}` has element type {ty}; MXFP4 blocks and scales are U8")
                }
            }
            if t.shape != want {
                bail!(
                    "tensor `{name}` has shape {:?}, expected {want:?} (num_local_experts, {rows} output features, {cols} input features in blocks of 32)",
                    t.shape
                );
            }
        }
        let out_rows = if step == 2 { rows / 2 } else { rows };
        Ok(Some(SrcTensor {
            name: gn,
            dims: vec![cols as u64, out_rows as u64, n as u64],
            ty: Ok(GgmlType::Mxfp4),
            data: self.st.bytes(b),
            permute_heads: None,
            file_offset: b.start,
            layout: Layout::Mxfp4 {
                scales: self.st.bytes(s),
                experts: n,
                rows,
                groups: g,
                step,
                offset,
            },
        }))
    }

    /// `tokenizer.ggml.*` and `tokenizer.chat_template` from tokenizer.json and
    /// tokenizer_config.json (byte-level BPE only).
    fn tokenizer_metadata(&self, vocab_size: usize) -> Result<Vec<(String, Value)>> {
        let tj = read_json(&self.dir.join("tokenizer.json"))?;
        let model = &tj["model"];
        if model["type"].as_str() != Some("BPE") {
            bail!(
                "tokenizer.json: model type {} is not supported by pack (byte-level BPE only)",
                model["type"]
            );
        }
        let tc_path = self.dir.join("tokenizer_config.json");
        let tc = if tc_path.is_file() {
            read_json(&tc_path)?
        } else {
            Json::Null
        };
        let mut by_id: HashMap<usize, String> = HashMap::new();
        for (tok, id) in model["vocab"]
            .as_object()
            .context("tokenizer.json: no vocab")?
        {
            let id = id
                .as_u64()
                .context("tokenizer.json: a vocab id is not an integer")?;
            by_id.insert(id as usize, tok.clone());
        }
        let mut types: HashMap<usize, i32> = HashMap::new();
        for at in tj["added_tokens"].as_array().into_iter().flatten() {
            let (Some(id), Some(content)) = (at["id"].as_u64(), at["content"].as_str()) else {
                continue;
            };
            by_id.insert(id as usize, content.to_string());
            let special = at["special"].as_bool().unwrap_or(false);
            types.insert(id as usize, if special { 3 } else { 4 });
        }
        let n_tok = by_id.keys().max().map_or(0, |m| m + 1);
        if n_tok > vocab_size {
            bail!("the tokenizer has {n_tok} ids but the model's vocab_size is {vocab_size}");
        }
        let mut tokens = StringArray::new();
        let mut token_type = Vec::with_capacity(vocab_size);
        for i in 0..vocab_size {
            match by_id.get(&i) {
                Some(t) => {
                    tokens.push(t);
                    token_type.push(types.get(&i).copied().unwrap_or(1));
                }
                None => {
                    tokens.push(&format!("[PAD{i}]"));
                    token_type.push(5);
                }
            }
        }
        let mut merges = StringArray::new();
        for m in model["merges"].as_array().into_iter().flatten() {
            match m {
                Json::String(s) => merges.push(s),
                Json::Array(parts) => {
                    let parts: Vec<&str> = parts.iter().filter_map(Json::as_str).collect();
                    merges.push(&parts.join(" "));
                }
                _ => bail!("tokenizer.json: a merge is neither a string nor a pair"),
            }
        }
        let pre = match &self.pre {
            Some(p) => p.clone(),
            None => detect_pre(&tj["pre_tokenizer"])?,
        };
        let special_id = |key: &str| -> Option<u32> {
            let v = &tc[key];
            let content = v.as_str().or(v["content"].as_str());
            if let Some(c) = content {
                if let Some((&id, _)) = by_id.iter().filter(|(_, t)| *t == c).min_by_key(|p| p.0) {
                    return Some(id as u32);
                }
            }
            let alt = &self.json[format!("{key}_id")];
            alt.as_u64()
                .or(alt.as_array().and_then(|a| a.first()?.as_u64()))
                .map(|v| v as u32)
        };
        let mut meta: Vec<(String, Value)> = vec![
            ("tokenizer.ggml.model".into(), "gpt2".into()),
            ("tokenizer.ggml.pre".into(), pre.into()),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(Array::String(tokens)),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(Array::I32(token_type)),
            ),
            (
                "tokenizer.ggml.merges".into(),
                Value::Array(Array::String(merges)),
            ),
        ];
        for (key, gkey) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
            ("pad_token", "tokenizer.ggml.padding_token_id"),
        ] {
            if let Some(id) = special_id(key) {
                meta.push((gkey.into(), Value::U32(id)));
            }
        }
        meta.push((
            "tokenizer.ggml.add_bos_token".into(),
            Value::Bool(tc["add_bos_token"].as_bool().unwrap_or(false)),
        ));
        meta.push((
            "tokenizer.ggml.add_eos_token".into(),
            Value::Bool(tc["add_eos_token"].as_bool().unwrap_or(false)),
        ));
        let jinja = self.dir.join("chat_template.jinja");
        let template = match tc["chat_template"].as_str() {
            Some(t) => Some(t.to_string()),
            None if jinja.is_file() => Some(
                std::fs::read_to_string(&jinja)
                    .with_context(|| format!("cannot read {}", jinja.display()))?,
            ),
            None => None,
        };
        if let Some(t) = template {
            meta.push(("tokenizer.chat_template".into(), t.into()));
        }
        Ok(meta)
    }
}

/// Per-dimension divisors of `rope`'s plain frequencies that give its scaled ones (how
/// llama.cpp stores Llama 3's scaling, as `rope_freqs.weight`).
fn freq_divisors(rope: &RopeConfig, rope_dim: usize) -> Vec<f32> {
    let plain = &RopeConfig::plain(rope.theta).freqs(rope_dim)[0].inv_freq;
    let scaled = &rope.freqs(rope_dim)[0].inv_freq;
    plain
        .iter()
        .zip(scaled)
        .map(|(&p, &s)| (p as f64 / s as f64) as f32)
        .collect()
}

/// The attention scale a GGUF reader assumes without `attention.scale`: 1/√head_dim.
/// `tokenizer.ggml.pre` for a tokenizer.json pre-tokenizer: plain byte-level (`gpt-2`) or
/// digits split then byte-level (`smollm`); anything else needs `--pre`.
fn detect_pre(pt: &Json) -> Result<String> {
    let is_byte_level = |p: &Json| p["type"] == "ByteLevel";
    if is_byte_level(pt) && pt["use_regex"].as_bool().unwrap_or(true) {
        return Ok("gpt-2".into());
    }
    if pt["type"] == "Sequence" {
        let items: Vec<&Json> = pt["pretokenizers"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        if items.len() == 2
            && items[0]["type"] == "Digits"
            && items[0]["individual_digits"] == true
            && is_byte_level(items[1])
        {
            return Ok("smollm".into());
        }
    }
    bail!(
        "tokenizer.json: pre-tokenizer {} not recognised; name it with --pre (gpt-2, smollm, llama-bpe, qwen2)",
        pt["type"]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_is_read_back_with_its_familys_rules() {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.family).collect();
        assert_eq!(
            names,
            [
                "llama", "mistral", "qwen2", "qwen3", "gemma3", "gemma2", "minicpm", "granite",
                "smollm3", "phi3", "qwen3moe", "lfm2", "lfm2moe", "gpt-oss"
            ]
        );
        for t in &TARGETS {
            let spec = arch::ARCHS
                .iter()
                .find(|a| a.name == t.family)
                .unwrap_or_else(|| panic!("no family `{}`", t.family));
            let back = arch::by_gguf_arch(t.gguf_arch)
                .unwrap_or_else(|| panic!("{}: flowrt cannot read `{}`", spec.name, t.gguf_arch));
            // Everything the decoder branches on must survive the trip through the GGUF arch
            // (the window is a key of the file, honoured for every family).
            let rules = |a: &ArchSpec| {
                (
                    a.activation,
                    a.gguf_rope_pairing,
                    a.qkv_bias,
                    a.qk_norm,
                    a.sandwich_norms,
                    a.embed_scale,
                    a.scalings,
                    a.longrope_by_max_position,
                )
            };
            assert_eq!(rules(spec), rules(back), "{} as {}", spec.name, t.gguf_arch);
            // The GGUF reader gives sliding layers their own RoPE only where the arch's
            // defaults have one.
            assert_eq!(
                spec.defaults.local_rope_theta,
                back.defaults.local_rope_theta
            );
        }
    }

    #[test]
    fn llama3_divisors_are_llama_cpps() {
        // llama.cpp's converter: 1 above the high-frequency wavelength, `factor` below the
        // low one, 1 / ((1 - smooth) / factor + smooth) between.
        let (theta, dim, factor, low, high, orig) = (10_000.0f32, 16, 8.0f64, 1.0, 4.0, 32.0);
        let cfg = RopeConfig {
            theta,
            scaling: RopeScaling::Llama3 {
                factor: factor as f32,
                low_freq_factor: low as f32,
                high_freq_factor: high as f32,
                original_max_position_embeddings: orig as usize,
            },
        };
        let plain = &RopeConfig::plain(theta).freqs(dim)[0].inv_freq;
        for (&p, got) in plain.iter().zip(freq_divisors(&cfg, dim)) {
            let wavelen = 2.0 * std::f64::consts::PI / p as f64;
            let want = if wavelen < orig / high {
                1.0
            } else if wavelen > orig / low {
                factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            let got = got as f64;
            assert!((got - want).abs() < 1e-5 * want, "{got} vs {want}");
        }
    }
}
