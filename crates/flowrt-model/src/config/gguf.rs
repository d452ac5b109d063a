//! Config from GGUF metadata (`{arch}.embedding_length`, ...).

use std::path::{Path, PathBuf};

use flowrt_gguf::{Array, GgufFile, Value};

use super::{bad, longrope_scaling, LayerType, ModelConfig, MoeConfig, ShortConvConfig};
use crate::arch::{self, Activation, EmbedScale, NormKind, Scalings};
use crate::error::ModelError;
use crate::names::TensorRole;
use crate::rope::{yarn_attention_factor, RopeConfig, RopeScaling};

impl ModelConfig {
    /// Read the config of a GGUF model. Keys the family's GGUF files omit take the family's
    /// documented defaults ([`crate::arch::ArchDefaults`]).
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ModelError> {
        let file = file_name(f);
        let arch_name = f
            .get_str("general.architecture")?
            .ok_or_else(|| ModelError::MissingKey {
                file: file.clone(),
                key: "general.architecture".into(),
            })?
            .to_string();
        let arch =
            arch::by_gguf_arch(&arch_name).ok_or_else(|| ModelError::UnknownArchitecture {
                file: file.clone(),
                arch: arch_name.clone(),
                known: arch::known_gguf_archs(),
            })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req_u = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            let v = f.get_u64(&full)?.ok_or_else(|| ModelError::MissingKey {
                file: file.clone(),
                key: full.clone(),
            })?;
            usize::try_from(v)
                .map_err(|_| bad(&file, format!("`{full}` = {v} does not fit in memory")))
        };
        let opt_u = |k: &str| -> Result<Option<usize>, ModelError> {
            let full = key(k);
            match f.get_u64(&full)? {
                None => Ok(None),
                Some(v) => usize::try_from(v)
                    .map(Some)
                    .map_err(|_| bad(&file, format!("`{full}` = {v} does not fit in memory"))),
            }
        };

        let hidden_size = req_u("embedding_length")?;
        let num_hidden_layers =
            super::check_layer_count(&key("block_count"), req_u("block_count")?)
                .map_err(|m| bad(&file, m))?;
        let intermediate_size = req_u("feed_forward_length")?;
        let num_attention_heads = req_u("attention.head_count")?;
        // Hybrid families (llama.cpp's lfm2) list KV heads per layer, 0 on convolution layers.
        let kv_list = match (arch.short_conv, f.get(&key("attention.head_count_kv"))) {
            (true, Some(Value::Array(a))) => Some(integers(a).ok_or_else(|| {
                bad(
                    &file,
                    format!(
                        "`{}` is not a list of integers",
                        key("attention.head_count_kv")
                    ),
                )
            })?),
            _ => None,
        };
        let (num_key_value_heads, short_conv) = match kv_list {
            None if arch.short_conv => (
                opt_u("attention.head_count_kv")?.unwrap_or(num_attention_heads),
                Some(ShortConvConfig {
                    kernel: req_u("shortconv.l_cache")?,
                    conv_layers: vec![false; num_hidden_layers],
                    bias: false,
                }),
            ),
            None => (
                opt_u("attention.head_count_kv")?.unwrap_or(num_attention_heads),
                None,
            ),
            Some(list) => {
                let k = key("attention.head_count_kv");
                if list.len() != num_hidden_layers {
                    return Err(bad(
                        &file,
                        format!(
                            "`{k}` has {} entries for {num_hidden_layers} layers (block_count)",
                            list.len()
                        ),
                    ));
                }
                let mut heads = list.iter().filter(|&&h| h != 0);
                let first = heads.next().copied().unwrap_or(num_attention_heads as i128);
                if first < 0 || heads.any(|&h| h != first) {
                    return Err(bad(
                        &file,
                        format!("`{k}` = {list:?}: attention layers must share one KV head count"),
                    ));
                }
                // Convolution biases (HF `conv_bias`; llama.cpp has none) when the first
                // convolution layer carries them; every convolution layer must then.
                let bias = list.iter().position(|&h| h == 0).is_some_and(|l| {
                    let name = TensorRole::ShortConvKernelBias.gguf_name_in(arch, l);
                    f.tensors().iter().any(|t| t.name == name)
                });
                (
                    first as usize,
                    Some(ShortConvConfig {
                        kernel: req_u("shortconv.l_cache")?,
                        conv_layers: list.iter().map(|&h| h == 0).collect(),
                        bias,
                    }),
                )
            }
        };
        let max_position_embeddings = req_u("context_length")?;
        let head_dim = match opt_u("attention.key_length")? {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        if let Some(v) = opt_u("attention.value_length")? {
            if v != head_dim {
                return Err(bad(
                    &file,
                    format!("value head width {v} differs from key head width {head_dim}"),
                ));
            }
        }
        let rope_dim = opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        let eps_key = match arch.norm {
            NormKind::Rms => key("attention.layer_norm_rms_epsilon"),
            NormKind::Layer => key("attention.layer_norm_epsilon"),
        };
        let rms_norm_eps = f.get_f32(&eps_key)?.ok_or_else(|| ModelError::MissingKey {
            file: file.clone(),
            key: eps_key.clone(),
        })?;
        if !arch.causal {
            if let Some(Value::Bool(true)) = f.get(&key("attention.causal")) {
                return Err(bad(
                    &file,
                    format!(
                        "`{}` is true: a causal `{arch_name}` is not supported",
                        key("attention.causal")
                    ),
                ));
            }
        }
        // Token types: llama.cpp writes their count as `tokenizer.ggml.token_type_count`;
        // without it, the rows of the tensor.
        let type_vocab_size = if arch.token_types {
            match f.get_u64("tokenizer.ggml.token_type_count")? {
                Some(n) => usize::try_from(n).map_err(|_| {
                    bad(
                        &file,
                        format!("`tokenizer.ggml.token_type_count` = {n} does not fit"),
                    )
                })?,
                None => {
                    let name = TensorRole::TokenTypes.gguf_name(0);
                    match f.tensors().iter().find(|t| t.name == name) {
                        Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
                        _ => {
                            return Err(ModelError::MissingKey {
                                file,
                                key: "tokenizer.ggml.token_type_count".into(),
                            })
                        }
                    }
                }
            }
        } else {
            0
        };
        let rope_theta = f
            .get_f32(&key("rope.freq_base"))?
            .unwrap_or(arch.defaults.rope_theta);
        // A required multiplier: present, finite and positive.
        let req_positive = |k: &str| -> Result<f32, ModelError> {
            let v = f.get_f32(&key(k))?.ok_or_else(|| ModelError::MissingKey {
                file: file.clone(),
                key: key(k),
            })?;
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(bad(
                    &file,
                    format!("`{}` = {v} must be a positive, finite number", key(k)),
                ))
            }
        };
        let scaling = match f.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: f.get_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0),
            },
            // LongRoPE as llama.cpp stores it: the two divisor sets as tensors, the original
            // context length and the cos/sin factor as keys.
            Some("longrope") => {
                let orig = opt_u("rope.scaling.original_context_length")?
                    .unwrap_or(max_position_embeddings);
                let half = rope_dim / 2;
                longrope_scaling(
                    arch,
                    factor_tensor(f, &file, TensorRole::RopeFactorsShort, half)?,
                    factor_tensor(f, &file, TensorRole::RopeFactorsLong, half)?,
                    orig,
                    max_position_embeddings,
                    f.get_f32(&key("rope.scaling.attn_factor"))?,
                )
            }
            // YaRN as llama.cpp's converter writes it. flowrt computes it as transformers does;
            // llama.cpp differs in that it always rounds the ramp's ends outwards (transformers'
            // `truncate: true`, the default) and has no `mscale` / `mscale_all_dim` pair (the
            // converter writes the resulting factor as `yarn_attn_factor` when config.json gives
            // `attention_factor`; otherwise both default to 0.1 ln(factor) + 1).
            Some("yarn") => {
                let factor = req_positive("rope.scaling.factor")?;
                let orig = opt_u("rope.scaling.original_context_length")?.ok_or_else(|| {
                    ModelError::MissingKey {
                        file: file.clone(),
                        key: key("rope.scaling.original_context_length"),
                    }
                })?;
                // DeepSeek's log multiplier and a non-default extrapolation mix are llama.cpp
                // knobs with no transformers counterpart here: refuse rather than guess.
                for (k, neutral) in [
                    ("rope.scaling.yarn_log_multiplier", 0.0),
                    ("rope.scaling.yarn_ext_factor", 1.0),
                ] {
                    if let Some(v) = f.get_f32(&key(k))? {
                        if v != neutral {
                            return Err(bad(
                                &file,
                                format!("`{}` = {v} is not supported (flowrt runs YaRN as transformers does)", key(k)),
                            ));
                        }
                    }
                }
                let beta = |k: &str, default: f32| -> Result<f32, ModelError> {
                    Ok(f.get_f32(&key(k))?.filter(|&b| b != 0.0).unwrap_or(default))
                };
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: orig,
                    beta_fast: beta("rope.scaling.yarn_beta_fast", 32.0)?,
                    beta_slow: beta("rope.scaling.yarn_beta_slow", 1.0)?,
                    // transformers' `truncate` (llama.cpp always truncates); `flowrt pack`
                    // and scripts/hf_to_gguf.py write `false` (gpt-oss) under this key.
                    truncate: match f.get(&key("rope.scaling.yarn_truncate")) {
                        None => true,
                        Some(Value::Bool(b)) => *b,
                        Some(v) => {
                            return Err(bad(
                                &file,
                                format!("`{}` = {v:?} is not a bool", key("rope.scaling.yarn_truncate")),
                            ))
                        }
                    },
                    attention_factor: match f.get_f32(&key("rope.scaling.yarn_attn_factor"))? {
                        Some(a) => a,
                        None => yarn_attention_factor(factor as f64, None, None),
                    },
                }
            }
            Some(other) => {
                return Err(bad(
                    &file,
                    format!("RoPE scaling type `{other}` is not supported (flowrt runs none, linear, llama3, longrope and yarn)"),
                ))
            }
        };
        // The vocabulary size is the number of tokens when the arch key is absent.
        let vocab_size = match opt_u("vocab_size")? {
            Some(v) => v,
            None => match f.get_array("tokenizer.ggml.tokens")? {
                Some(a) => a.len(),
                None => {
                    return Err(ModelError::MissingKey {
                        file,
                        key: key("vocab_size"),
                    })
                }
            },
        };

        // Sliding windows. Gemma 3 GGUFs give the window but (in most files) not which layers
        // use it nor the local RoPE base: the family's defaults fill them in. The window is
        // honoured whenever a file gives one, whatever the family: a Mistral checkpoint is
        // written as `llama`, with `llama.attention.sliding_window` when `flowrt pack` writes
        // it (llama.cpp's converter drops it).
        let sliding_window = opt_u("attention.sliding_window")?.filter(|&w| w > 0);
        let layer_types = match (
            sliding_window,
            f.get(&key("attention.sliding_window_pattern")),
        ) {
            (None, _) => vec![LayerType::Full; num_hidden_layers],
            (Some(_), Some(Value::Array(Array::Bool(v)))) => {
                // Newer files: one flag per layer, true = sliding.
                v.iter()
                    .map(|&s| {
                        if s {
                            LayerType::Sliding
                        } else {
                            LayerType::Full
                        }
                    })
                    .collect()
            }
            (Some(_), Some(v)) => match v.as_integer() {
                Some(p) if p > 0 => Self::pattern_layer_types(num_hidden_layers, p as usize),
                _ => {
                    return Err(bad(
                        &file,
                        format!(
                            "`{}` = {v} is not a layer pattern",
                            key("attention.sliding_window_pattern")
                        ),
                    ))
                }
            },
            (Some(_), None) => match arch.defaults.sliding_window_pattern {
                Some(p) => Self::pattern_layer_types(num_hidden_layers, p),
                None => vec![LayerType::Sliding; num_hidden_layers],
            },
        };
        // NoPE layers: HF's list under `{arch}.no_rope_layers` when the file carries it (as
        // `flowrt pack` writes it; llama.cpp reads no key for it), else the family's interval.
        let rope_layers = match arch.defaults.no_rope_layer_interval {
            None => vec![true; num_hidden_layers],
            Some(interval) => match f.get(&key("no_rope_layers")) {
                None => Self::interval_rope_layers(num_hidden_layers, interval),
                Some(Value::Array(a)) => {
                    let values = integers(a).ok_or_else(|| {
                        bad(
                            &file,
                            format!("`{}` is not a list of integers", key("no_rope_layers")),
                        )
                    })?;
                    Self::rope_layers_from_list(
                        &file,
                        &values,
                        num_hidden_layers,
                        &key("no_rope_layers"),
                    )?
                }
                Some(v) => {
                    return Err(bad(
                        &file,
                        format!("`{}` = {v} is not a list", key("no_rope_layers")),
                    ))
                }
            },
        };
        let rope_local = match (sliding_window, arch.defaults.local_rope_theta) {
            (Some(_), Some(default)) => Some(RopeConfig::plain(
                f.get_f32(&key("rope.freq_base_swa"))?.unwrap_or(default),
            )),
            _ => None,
        };
        // The attention score scale: `attention.scale` when the file gives it (llama.cpp's
        // name for it; `flowrt pack` writes Gemma's 1/√query_pre_attn_scalar there when it
        // differs from the default below), else the family's default: Gemma GGUFs from
        // llama.cpp's converter carry no query_pre_attn_scalar, which is head_dim for the
        // published sizes except the 27Bs, where it is hidden/heads (llama.cpp tells them by
        // their layer count, and so does `gguf_default_attn_scale`).
        // A family that states its scale (Granite) must give the key.
        let attn_scale = match (f.get_f32(&key("attention.scale"))?, arch.scalings) {
            (_, Scalings::Direct { .. }) => req_positive("attention.scale")?,
            (Some(s), _) => s,
            (None, _) => super::gguf_default_attn_scale(
                arch,
                num_hidden_layers,
                hidden_size,
                num_attention_heads,
                head_dim,
            ),
        };
        let embedding_multiplier = match arch.embed_scale {
            EmbedScale::None => 1.0,
            EmbedScale::SqrtHidden => (hidden_size as f32).sqrt(),
            EmbedScale::FromConfig(_) => req_positive("embedding_scale")?,
        };
        // llama.cpp's names: residual branches × `residual_scale`, logits ÷ `logit_scale`.
        let (residual_multiplier, logit_multiplier) = match arch.scalings {
            Scalings::None => (1.0, 1.0),
            Scalings::MiniCpm | Scalings::Direct { .. } => (
                req_positive("residual_scale")?,
                (1.0 / req_positive("logit_scale")? as f64) as f32,
            ),
        };
        let final_logit_softcapping = f
            .get_f32(&key("final_logit_softcapping"))?
            .filter(|&c| c > 0.0);
        let attn_logit_softcapping = f
            .get_f32(&key("attn_logit_softcapping"))?
            .filter(|&c| c > 0.0);

        // Mixtures of experts: llama.cpp's `expert_count`, `expert_used_count` and
        // `expert_feed_forward_length`; top-k weights renormalised unless
        // `expert_weights_norm` says otherwise (llama.cpp always renormalises qwen3moe's and
        // lfm2moe's), times `expert_weights_scale` (1 when absent). The first
        // `leading_dense_block_count` layers (0 when absent) are dense, and those
        // `{arch}.mlp_only_layers` (HF's list, as `flowrt pack` writes it; llama.cpp reads no
        // such key) names. `expert_gating_func` (2: sigmoid), when given, must agree with
        // the family's router. A selection bias (`exp_probs_b`) is used when the first sparse layer
        // carries one; every sparse layer must then.
        let moe = match arch.router_scoring {
            None => None,
            Some(scoring) => {
                let renormalize = match f.get(&key("expert_weights_norm")) {
                    None => true,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => {
                        return Err(bad(
                            &file,
                            format!("`{}` = {v:?} is not a bool", key("expert_weights_norm")),
                        ))
                    }
                };
                if let Some(g) = f.get_u64(&key("expert_gating_func"))? {
                    let sigmoid = scoring == arch::RouterScoring::Sigmoid;
                    // 2 is llama.cpp's sigmoid; softmax families may say 1 (softmax) or
                    // another softmax variant.
                    if (g == 2) != sigmoid {
                        return Err(bad(
                            &file,
                            format!(
                                "`{}` = {g}: the `{arch_name}` family's router is {}",
                                key("expert_gating_func"),
                                if sigmoid {
                                    "sigmoid (2)"
                                } else {
                                    "a softmax, not sigmoid (2)"
                                },
                            ),
                        ));
                    }
                }
                let scale = match f.get_f32(&key("expert_weights_scale"))? {
                    None => 1.0,
                    Some(s) if s.is_finite() && s > 0.0 => s,
                    Some(s) => {
                        return Err(bad(
                            &file,
                            format!(
                                "`{}` = {s} must be a positive, finite number",
                                key("expert_weights_scale")
                            ),
                        ))
                    }
                };
                let lead = opt_u("leading_dense_block_count")?.unwrap_or(0);
                if lead > num_hidden_layers {
                    return Err(bad(
                        &file,
                        format!(
                            "`{}` = {lead} exceeds `{}` = {num_hidden_layers}",
                            key("leading_dense_block_count"),
                            key("block_count")
                        ),
                    ));
                }
                let only = match f.get(&key("mlp_only_layers")) {
                    None => Vec::new(),
                    Some(Value::Array(a)) => integers(a)
                        .and_then(|v| {
                            v.into_iter()
                                .map(|x| usize::try_from(x).ok().filter(|&l| l < num_hidden_layers))
                                .collect::<Option<Vec<_>>>()
                        })
                        .ok_or_else(|| {
                            bad(
                                &file,
                                format!(
                                    "`{}` is not a list of layer indices below {num_hidden_layers}",
                                    key("mlp_only_layers")
                                ),
                            )
                        })?,
                    Some(v) => {
                        return Err(bad(
                            &file,
                            format!("`{}` = {v:?} is not a list", key("mlp_only_layers")),
                        ))
                    }
                };
                let mut sparse_layers = MoeConfig::hf_sparse_layers(num_hidden_layers, 1, &only);
                sparse_layers[..lead].fill(false);
                let selection_bias = sparse_layers.iter().position(|&s| s).is_some_and(|l| {
                    let name = TensorRole::FfnExpProbsB.gguf_name_in(arch, l);
                    f.tensors().iter().any(|t| t.name == name)
                });
                Some(MoeConfig {
                    num_experts: req_u("expert_count")?,
                    num_experts_per_tok: req_u("expert_used_count")?,
                    moe_intermediate_size: req_u("expert_feed_forward_length")?,
                    router: arch::Router {
                        scoring,
                        renormalize,
                        renorm_eps: arch.router_renorm_eps,
                        scale,
                        selection_bias,
                    },
                    sparse_layers,
                })
            }
        };

        // gpt-oss's clamped SwiGLU: llama.cpp fixes alpha and limit (the family's defaults);
        // flowrt reads `{arch}.swiglu_alpha` / `swiglu_limit` when a file gives them (as
        // scripts/hf_to_gguf.py writes them for a checkpoint that differs).
        let activation = match arch.activation {
            Activation::ClampedSwiglu { alpha, limit } => Activation::ClampedSwiglu {
                alpha: f.get_f32(&key("swiglu_alpha"))?.unwrap_or(alpha),
                limit: f.get_f32(&key("swiglu_limit"))?.unwrap_or(limit),
            },
            a => a,
        };
        let cfg = ModelConfig {
            arch,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size,
            rms_norm_eps,
            type_vocab_size,
            activation,
            rope: RopeConfig {
                theta: rope_theta,
                scaling,
            },
            rope_local,
            rope_dim,
            rope_pairing: arch.gguf_rope_pairing,
            max_position_embeddings,
            attn_scale,
            sliding_window,
            layer_types,
            rope_layers,
            embedding_multiplier,
            residual_multiplier,
            logit_multiplier,
            final_logit_softcapping,
            attn_logit_softcapping,
            tie_word_embeddings: None,
            moe,
            short_conv,
            hf_mxfp4: None,
        };
        cfg.validate(&file)?;
        Ok(cfg)
    }
}

/// LongRoPE divisors stored as a 1-D f32 tensor of `len` values (`rope_factors_long.weight`,
/// `rope_factors_short.weight`).
fn factor_tensor(
    f: &GgufFile,
    file: &Path,
    role: TensorRole,
    len: usize,
) -> Result<Vec<f32>, ModelError> {
    let name = role.gguf_name(0);
    let t = f.tensors().iter().find(|t| t.name == name).ok_or_else(|| {
        bad(
            file,
            format!("RoPE scaling `longrope` without the tensor `{name}`"),
        )
    })?;
    if t.dims != [len as u64] || t.ggml_type != flowrt_gguf::GgmlType::F32 {
        return Err(bad(
            file,
            format!(
                "tensor `{name}` is {} {:?}, expected F32 [{len}] (rope dimension count / 2)",
                t.ggml_type, t.dims
            ),
        ));
    }
    Ok(f.tensor_data(t)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The values of an integer array.
fn integers(a: &Array) -> Option<Vec<i128>> {
    Some(match a {
        Array::U8(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I8(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U16(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I16(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U32(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I32(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U64(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I64(v) => v.iter().map(|&x| x.into()).collect(),
        _ => return None,
    })
}

pub(crate) fn file_name(f: &GgufFile) -> PathBuf {
    f.path()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "<memory>".into())
}
