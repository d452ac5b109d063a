//! Config from a Hugging Face `config.json`: transformers 5's `rope_parameters` and the older
//! `rope_theta` / `rope_scaling` / `rope_local_base_freq` keys both work.

use std::path::Path;

use serde_json::{Map, Value};

use super::{bad, longrope_scaling, LayerType, ModelConfig, MoeConfig, ShortConvConfig};
use crate::arch::{
    self, Activation, ArchSpec, EmbedScale, HfExperts, NormKind, Positions, RopePairing, Scalings,
};
use crate::error::ModelError;
use crate::rope::{yarn_attention_factor, RopeConfig, RopeScaling};

/// Typed access to a JSON object, with errors naming the file and key.
#[derive(Clone, Copy)]
struct Obj<'a> {
    file: &'a Path,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn present(&self, k: &str) -> Option<&'a Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }

    fn usize(&self, k: &str) -> Result<Option<usize>, ModelError> {
        match self.present(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| bad(self.file, format!("`{k}` = {v} is not a count"))),
        }
    }

    fn req_usize(&self, k: &str) -> Result<usize, ModelError> {
        self.usize(k)?.ok_or_else(|| ModelError::MissingKey {
            file: self.file.to_path_buf(),
            key: k.into(),
        })
    }

    fn f32(&self, k: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.f64(k)?.map(|v| v as f32))
    }

    fn f64(&self, k: &str) -> Result<Option<f64>, ModelError> {
        match self.present(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(self.file, format!("`{k}` = {v} is not a number"))),
        }
    }

    fn req_f64(&self, k: &str) -> Result<f64, ModelError> {
        self.f64(k)?.ok_or_else(|| ModelError::MissingKey {
            file: self.file.to_path_buf(),
            key: k.into(),
        })
    }

    /// A required multiplier: present, a number, finite and positive.
    fn req_positive(&self, k: &str) -> Result<f64, ModelError> {
        let v = self.req_f64(k)?;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(bad(
                self.file,
                format!("`{k}` = {v} must be a positive, finite number"),
            ))
        }
    }

    fn str(&self, k: &str) -> Result<Option<&'a str>, ModelError> {
        match self.present(k) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| bad(self.file, format!("`{k}` = {v} is not a string"))),
        }
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ModelError> {
        match self.present(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| bad(self.file, format!("`{k}` = {v} is not a boolean"))),
        }
    }

    fn obj(&self, k: &str) -> Result<Option<Obj<'a>>, ModelError> {
        match self.present(k) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Obj {
                file: self.file,
                map,
            })),
            Some(v) => Err(bad(self.file, format!("`{k}` = {v} is not an object"))),
        }
    }

    fn f32_list(&self, k: &str) -> Result<Option<Vec<f32>>, ModelError> {
        match self.present(k) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_f64().map(|x| x as f32))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| bad(self.file, format!("`{k}` holds a non-number"))),
            Some(v) => Err(bad(self.file, format!("`{k}` = {v} is not a list"))),
        }
    }
}

/// A pre-quantised checkpoint's `quantization_config`: only `quant_method` "mxfp4" on a family
/// whose HF experts are fused (gpt-oss as OpenAI ships it: the experts' `*_blocks` and
/// `*_scales`, bound in MXFP4 by the weights binder; every other matrix a float). Any other
/// method, or MXFP4 on another family, is refused naming the field. Returns the
/// `modules_to_not_convert` patterns (empty when absent) of an MXFP4 config.
fn hf_quantization(top: &Obj<'_>, arch: &ArchSpec) -> Result<Option<Vec<String>>, ModelError> {
    let Some(q) = top.obj("quantization_config")? else {
        return Ok(None);
    };
    let method = q.str("quant_method")?.ok_or_else(|| {
        bad(
            top.file,
            "`quantization_config` has no `quant_method`; pre-quantised checkpoints other than gpt-oss's MXFP4 are not supported".into(),
        )
    })?;
    if method != "mxfp4" {
        return Err(bad(
            top.file,
            format!("`quantization_config.quant_method` = \"{method}\": pre-quantised checkpoints other than gpt-oss's MXFP4 are not supported; use a float checkpoint with --quant, or a GGUF"),
        ));
    }
    if arch.hf_experts != HfExperts::FusedTransposed {
        return Err(bad(
            top.file,
            format!("`quantization_config.quant_method` = \"mxfp4\" is supported for gpt-oss's fused experts only, not for `{}`", arch.name),
        ));
    }
    let key = "quantization_config.modules_to_not_convert";
    match q.present("modules_to_not_convert") {
        None => Ok(Some(Vec::new())),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| bad(top.file, format!("`{key}` holds a non-string"))),
        Some(v) => Err(bad(top.file, format!("`{key}` = {v} is not a list"))),
    }
}

impl ModelConfig {
    /// Read an HF `config.json` (already parsed). `file` names it in errors.
    pub fn from_hf_json(file: &Path, json: &Value) -> Result<Self, ModelError> {
        let Value::Object(top) = json else {
            return Err(bad(file, "config.json is not a JSON object".into()));
        };
        let top = Obj { file, map: top };
        let model_type = top
            .str("model_type")?
            .ok_or_else(|| ModelError::MissingKey {
                file: file.to_path_buf(),
                key: "model_type".into(),
            })?;
        let arch =
            arch::by_hf_model_type(model_type).ok_or_else(|| ModelError::UnknownArchitecture {
                file: file.to_path_buf(),
                arch: model_type.to_string(),
                known: arch::known_hf_model_types(),
            })?;
        // Multimodal wrappers (e.g. Gemma 3 4B+) keep the text model's config in `text_config`.
        let c = top.obj("text_config")?.unwrap_or(top);
        let hf_mxfp4 = hf_quantization(&top, arch)?;

        let hidden_size = c.req_usize("hidden_size")?;
        let num_hidden_layers =
            super::check_layer_count("num_hidden_layers", c.req_usize("num_hidden_layers")?)
                .map_err(|m| bad(file, m))?;
        let intermediate_size = if arch.hf_block_ff_dim {
            lfm2_intermediate_size(&c)?
        } else {
            c.req_usize("intermediate_size")?
        };
        let num_attention_heads = c.req_usize("num_attention_heads")?;
        let num_key_value_heads = c
            .usize("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        let head_dim = match c.usize("head_dim")? {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let vocab_size = c.req_usize("vocab_size")?;
        let max_position_embeddings = c.req_usize("max_position_embeddings")?;
        // LayerNorm families say `layer_norm_eps` (BertConfig's default 1e-12).
        let rms_norm_eps = match arch.norm {
            NormKind::Rms => c
                .f32("rms_norm_eps")?
                .or(c.f32("norm_eps")?)
                .unwrap_or(1e-6),
            NormKind::Layer => c.f32("layer_norm_eps")?.unwrap_or(1e-12),
        };
        let type_vocab_size = if arch.token_types {
            c.usize("type_vocab_size")?.unwrap_or(2)
        } else {
            0
        };

        let activation = match (
            arch.activation,
            c.str("hidden_activation")?.or(c.str("hidden_act")?),
        ) {
            // gpt-oss: the experts' clamped SwiGLU, whatever `hidden_act` says.
            (Activation::ClampedSwiglu { alpha, limit }, _) => Activation::ClampedSwiglu {
                alpha: c.f32("swiglu_alpha")?.unwrap_or(alpha),
                limit: c.f32("swiglu_limit")?.unwrap_or(limit),
            },
            (_, None) => arch.activation,
            (_, Some(name)) => Activation::from_hf(name).ok_or_else(|| {
                bad(
                    file,
                    format!("activation `{name}` is not supported (silu, gelu_pytorch_tanh, gelu)"),
                )
            })?,
        };
        let unsupported = |what: &str| Err(bad(file, format!("{what} is not supported")));
        if c.bool("attention_bias")? == Some(true) && !arch.qkv_bias {
            return unsupported("`attention_bias: true` in this family");
        }
        if c.bool("mlp_bias")? == Some(true) && !arch.dense_bias {
            return unsupported("`mlp_bias: true`");
        }
        if arch.positions == Positions::Learned {
            match c.str("position_embedding_type")? {
                None | Some("absolute") => {}
                Some(other) => {
                    return unsupported(&format!(
                        "`position_embedding_type: {other}` (flowrt runs `absolute`)"
                    ))
                }
            }
        }
        if !arch.causal && c.bool("is_decoder")? == Some(true) {
            return unsupported("`is_decoder: true` (a causal BERT)");
        }
        if c.bool("use_bidirectional_attention")? == Some(true) {
            return unsupported("bidirectional attention");
        }

        // transformers 5 keeps `partial_rotary_factor` in `rope_parameters` (older configs
        // at the top level); the rotated width is `int(head_dim × factor)`, as it computes it.
        let partial = match c.obj("rope_parameters")? {
            Some(p) => p.f64("partial_rotary_factor")?,
            None => None,
        }
        .or(c.f64("partial_rotary_factor")?);
        let rope_dim = match partial {
            None => head_dim,
            Some(f) => {
                let d = head_dim as f64 * f;
                if !(f > 0.0 && f <= 1.0) || (d as usize) == 0 || !(d as usize).is_multiple_of(2) {
                    return Err(bad(
                        file,
                        format!(
                            "`partial_rotary_factor` = {f} gives {} rotary dims of head_dim {head_dim}; it must give an even number from 2 to head_dim",
                            d as usize
                        ),
                    ));
                }
                d as usize
            }
        };
        let (rope, rope_local) = read_ropes(&c, arch, rope_dim, max_position_embeddings)?;

        // Sliding windows: `layer_types` when given, else the family's rule.
        let window = if arch.sliding_window && c.bool("use_sliding_window")? != Some(false) {
            c.usize("sliding_window")?.filter(|&w| w > 0)
        } else {
            None
        };
        // Hybrid families list convolution layers in `layer_types` too; their attention
        // layers attend fully.
        let short_conv = match arch.short_conv {
            true => Some(read_short_conv(&c, num_hidden_layers)?),
            false => None,
        };
        let layer_types = match c.present("layer_types") {
            _ if short_conv.is_some() => vec![LayerType::Full; num_hidden_layers],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v.as_str() {
                    Some("full_attention") => Ok(LayerType::Full),
                    Some("sliding_attention") if window.is_some() => Ok(LayerType::Sliding),
                    // A sliding layer without a window attends to everything.
                    Some("sliding_attention") => Ok(LayerType::Full),
                    _ => Err(bad(file, format!("layer type {v} is not supported"))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(v) => return Err(bad(file, format!("`layer_types` = {v} is not a list"))),
            None if window.is_none() => vec![LayerType::Full; num_hidden_layers],
            None => match (
                c.usize("sliding_window_pattern")?
                    .or(arch.defaults.sliding_window_pattern),
                c.usize("max_window_layers")?,
            ) {
                (Some(p), _) => Self::pattern_layer_types(num_hidden_layers, p),
                // Qwen: layers from `max_window_layers` on slide.
                (None, Some(m)) => (0..num_hidden_layers)
                    .map(|i| {
                        if i >= m {
                            LayerType::Sliding
                        } else {
                            LayerType::Full
                        }
                    })
                    .collect(),
                (None, None) => vec![LayerType::Sliding; num_hidden_layers],
            },
        };
        let sliding_window = window.filter(|_| layer_types.contains(&LayerType::Sliding));
        let rope_layers = match arch.defaults.no_rope_layer_interval {
            None => vec![true; num_hidden_layers],
            Some(default) => match c.present("no_rope_layers") {
                Some(Value::Array(a)) => {
                    let values = a
                        .iter()
                        .map(|v| v.as_i64().map(i128::from))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| bad(file, "`no_rope_layers` holds a non-integer".into()))?;
                    Self::rope_layers_from_list(file, &values, num_hidden_layers, "no_rope_layers")?
                }
                Some(v) => return Err(bad(file, format!("`no_rope_layers` = {v} is not a list"))),
                None => {
                    let interval = c.usize("no_rope_layer_interval")?.unwrap_or(default);
                    if interval == 0 {
                        return Err(bad(file, "`no_rope_layer_interval` is 0".into()));
                    }
                    Self::interval_rope_layers(num_hidden_layers, interval)
                }
            },
        };

        let attn_scale = match c.f64("query_pre_attn_scalar")? {
            Some(s) if s > 0.0 => (1.0 / s.sqrt()) as f32,
            Some(s) => {
                return Err(bad(
                    file,
                    format!("query_pre_attn_scalar = {s} must be positive"),
                ))
            }
            None => 1.0 / (head_dim as f32).sqrt(),
        };
        let embedding_multiplier = match arch.embed_scale {
            EmbedScale::None => 1.0,
            EmbedScale::SqrtHidden => (hidden_size as f64).sqrt() as f32,
            EmbedScale::FromConfig(key) => c.req_positive(key)? as f32,
        };
        let (residual_multiplier, logit_multiplier) = match arch.scalings {
            Scalings::None => (1.0, 1.0),
            Scalings::MiniCpm => {
                let depth = c.req_positive("scale_depth")?;
                let base = c.req_positive("dim_model_base")?;
                (
                    (depth / (num_hidden_layers as f64).sqrt()) as f32,
                    (base / hidden_size as f64) as f32,
                )
            }
            Scalings::Direct {
                residual,
                logit_divisor,
                ..
            } => (
                c.req_positive(residual)? as f32,
                (1.0 / c.req_positive(logit_divisor)?) as f32,
            ),
        };
        // A family whose config states the attention scale itself (Granite).
        let attn_scale = match arch.scalings {
            Scalings::Direct { attention, .. } => c.req_positive(attention)? as f32,
            Scalings::None | Scalings::MiniCpm => attn_scale,
        };

        let moe = match arch.router_scoring {
            None => None,
            Some(scoring) => Some(read_moe(&c, arch, scoring, num_hidden_layers)?),
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
            rope,
            rope_local,
            rope_dim,
            rope_pairing: RopePairing::HalfSplit,
            max_position_embeddings,
            attn_scale,
            sliding_window,
            layer_types,
            rope_layers,
            embedding_multiplier,
            residual_multiplier,
            logit_multiplier,
            final_logit_softcapping: c.f32("final_logit_softcapping")?,
            attn_logit_softcapping: c.f32("attn_logit_softcapping")?,
            tie_word_embeddings: c
                .bool("tie_word_embeddings")?
                .or(top.bool("tie_word_embeddings")?)
                .or(c.bool("tie_embedding")?),
            moe,
            short_conv,
            hf_mxfp4,
        };
        cfg.validate(file)?;
        Ok(cfg)
    }
}

/// LFM2's feed-forward width as `Lfm2MLP` computes it: `intermediate_size` (or the older
/// `block_ff_dim`), and when `block_auto_adjust_ff_dim` (default true) `int(2/3 ·)`, then with
/// `block_ffn_dim_multiplier` (default 1) `int(multiplier ·)` rounded up to a multiple of
/// `block_multiple_of` (default 256).
fn lfm2_intermediate_size(c: &Obj) -> Result<usize, ModelError> {
    let base = match c.usize("intermediate_size")? {
        Some(v) => v,
        None => c.req_usize("block_ff_dim")?,
    };
    if !c.bool("block_auto_adjust_ff_dim")?.unwrap_or(true) {
        return Ok(base);
    }
    let mut ff = (2 * base) / 3;
    let multiplier = match c.present("block_ffn_dim_multiplier") {
        Some(_) => c.f64("block_ffn_dim_multiplier")?,
        None if c.map.contains_key("block_ffn_dim_multiplier") => None,
        None => Some(1.0),
    };
    if let Some(m) = multiplier {
        let multiple = c.usize("block_multiple_of")?.unwrap_or(256);
        if multiple == 0 {
            return Err(bad(c.file, "`block_multiple_of` is 0".into()));
        }
        if !(m.is_finite() && m > 0.0) {
            return Err(bad(
                c.file,
                format!("`block_ffn_dim_multiplier` = {m} must be positive"),
            ));
        }
        ff = (m * ff as f64) as usize;
        ff = ff.div_ceil(multiple) * multiple;
    }
    Ok(ff)
}

/// A hybrid family's convolution layers: `layer_types` (`conv` or `full_attention` per layer)
/// when given, else `full_attn_idxs` (the attention layers; every layer when absent), and the
/// kernel size `conv_L_cache` (default 3), and `conv_bias` (default false: biases on the
/// convolution and both its projections).
fn read_short_conv(c: &Obj, n_layers: usize) -> Result<ShortConvConfig, ModelError> {
    let bias = c.bool("conv_bias")?.unwrap_or(false);
    let kernel = c.usize("conv_L_cache")?.unwrap_or(3);
    let conv_layers = match c.present("layer_types") {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_str() {
                Some("conv") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(bad(
                    c.file,
                    format!(
                        "`layer_types`[{i}] = {v} is not a layer kind (`conv` or `full_attention`)"
                    ),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(bad(c.file, format!("`layer_types` = {v} is not a list"))),
        None => match c.present("full_attn_idxs") {
            None => vec![false; n_layers],
            Some(Value::Array(a)) => {
                let idx = a
                    .iter()
                    .map(|v| v.as_u64().map(|x| x as usize).filter(|&l| l < n_layers))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        bad(
                            c.file,
                            format!(
                                "`full_attn_idxs` is not a list of layer indices below {n_layers}"
                            ),
                        )
                    })?;
                (0..n_layers).map(|l| !idx.contains(&l)).collect()
            }
            Some(v) => return Err(bad(c.file, format!("`full_attn_idxs` = {v} is not a list"))),
        },
    };
    if conv_layers.len() != n_layers {
        return Err(bad(
            c.file,
            format!(
                "`layer_types` gives {} layer kinds for {n_layers} layers (num_hidden_layers)",
                conv_layers.len()
            ),
        ));
    }
    Ok(ShortConvConfig {
        kernel,
        conv_layers,
        bias,
    })
}

/// The mixture of experts of a family with a router. The expert width is under the family's
/// [`arch::ArchSpec::hf_expert_width_key`]. The expert count is `num_experts`
/// (transformers 5 writes `num_local_experts`; both must agree when both are given); the
/// top-k, expert width and expert count are required. Dense layers: the first
/// `num_dense_layers` in a family that counts them ([`arch::ArchDefaults::num_dense_layers`]),
/// else those of `mlp_only_layers` (none) and off `decoder_sparse_step` (1).
/// `norm_topk_prob` and `use_expert_bias` take the family's defaults,
/// `routed_scaling_factor` 1.
fn read_moe(
    c: &Obj,
    arch: &arch::ArchSpec,
    scoring: arch::RouterScoring,
    n_layers: usize,
) -> Result<MoeConfig, ModelError> {
    let num_experts = match (c.usize("num_experts")?, c.usize("num_local_experts")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(bad(
                c.file,
                format!("num_experts = {a} and num_local_experts = {b} disagree"),
            ))
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            return Err(ModelError::MissingKey {
                file: c.file.to_path_buf(),
                key: "num_experts".into(),
            })
        }
    };
    let sparse_layers = match arch.defaults.num_dense_layers {
        Some(default) => {
            let dense = c.usize("num_dense_layers")?.unwrap_or(default);
            if dense > n_layers {
                return Err(bad(
                    c.file,
                    format!("num_dense_layers = {dense} exceeds num_hidden_layers = {n_layers}"),
                ));
            }
            (0..n_layers).map(|l| l >= dense).collect()
        }
        None => {
            let step = c.usize("decoder_sparse_step")?.unwrap_or(1);
            if step == 0 {
                return Err(bad(c.file, "decoder_sparse_step is 0".into()));
            }
            let only = match c.present("mlp_only_layers") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_u64().map(|x| x as usize))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(c.file, "`mlp_only_layers` holds a non-integer".into()))?,
                Some(v) => {
                    return Err(bad(
                        c.file,
                        format!("`mlp_only_layers` = {v} is not a list"),
                    ))
                }
            };
            if let Some(&l) = only.iter().find(|&&l| l >= n_layers) {
                return Err(bad(
                    c.file,
                    format!("`mlp_only_layers` names layer {l} of {n_layers}"),
                ));
            }
            MoeConfig::hf_sparse_layers(n_layers, step, &only)
        }
    };
    let scale = match c.f64("routed_scaling_factor")? {
        None => 1.0,
        Some(s) if s.is_finite() && s > 0.0 => s as f32,
        Some(s) => {
            return Err(bad(
                c.file,
                format!("`routed_scaling_factor` = {s} must be a positive, finite number"),
            ))
        }
    };
    Ok(MoeConfig {
        num_experts,
        num_experts_per_tok: c.req_usize("num_experts_per_tok")?,
        moe_intermediate_size: c.req_usize(arch.hf_expert_width_key)?,
        router: arch::Router {
            scoring,
            renormalize: c
                .bool("norm_topk_prob")?
                .unwrap_or(arch.defaults.norm_topk_prob),
            renorm_eps: arch.router_renorm_eps,
            scale,
            selection_bias: c
                .bool("use_expert_bias")?
                .unwrap_or(arch.defaults.use_expert_bias),
        },
        sparse_layers,
    })
}

/// The global and (if the family has one) local RoPE.
fn read_ropes(
    c: &Obj,
    arch: &'static arch::ArchSpec,
    rope_dim: usize,
    max_pos: usize,
) -> Result<(RopeConfig, Option<RopeConfig>), ModelError> {
    // transformers 5: `rope_parameters`, flat or keyed by layer type.
    if let Some(p) = c.obj("rope_parameters")? {
        let per_type = p.obj("full_attention")?;
        let global = per_type.as_ref().unwrap_or(&p);
        let g = read_rope(c, arch, global, arch.defaults.rope_theta, rope_dim, max_pos)?;
        let local = match (p.obj("sliding_attention")?, arch.defaults.local_rope_theta) {
            (Some(l), Some(default)) => Some(read_rope(c, arch, &l, default, rope_dim, max_pos)?),
            (None, Some(default)) => Some(RopeConfig::plain(default)),
            (_, None) => None,
        };
        return Ok((g, local));
    }
    // Older keys.
    let theta = c.f32("rope_theta")?.unwrap_or(arch.defaults.rope_theta);
    let global = match c.obj("rope_scaling")? {
        Some(s) => read_rope_scaling(c, arch, &s, theta, rope_dim, max_pos)?,
        None => RopeConfig::plain(theta),
    };
    let local = match arch.defaults.local_rope_theta {
        Some(default) => Some(RopeConfig::plain(
            c.f32("rope_local_base_freq")?.unwrap_or(default),
        )),
        None => None,
    };
    Ok((global, local))
}

fn read_rope(
    c: &Obj,
    arch: &arch::ArchSpec,
    p: &Obj,
    default_theta: f32,
    rope_dim: usize,
    max_pos: usize,
) -> Result<RopeConfig, ModelError> {
    let theta = p
        .f32("rope_theta")?
        .or(c.f32("rope_theta")?)
        .unwrap_or(default_theta);
    read_rope_scaling(c, arch, p, theta, rope_dim, max_pos)
}

/// A RoPE from a scaling object (`rope_scaling` or one `rope_parameters` entry).
fn read_rope_scaling(
    c: &Obj,
    arch: &arch::ArchSpec,
    s: &Obj,
    theta: f32,
    rope_dim: usize,
    max_pos: usize,
) -> Result<RopeConfig, ModelError> {
    let kind = s.str("rope_type")?.or(s.str("type")?).unwrap_or("default");
    let factor = || -> Result<f32, ModelError> {
        s.f32("factor")?
            .ok_or_else(|| bad(c.file, format!("RoPE scaling `{kind}` without a `factor`")))
    };
    let orig = || -> Result<usize, ModelError> {
        s.usize("original_max_position_embeddings")?
            .or(c.usize("original_max_position_embeddings")?)
            .ok_or_else(|| {
                bad(
                    c.file,
                    format!("RoPE scaling `{kind}` without `original_max_position_embeddings`"),
                )
            })
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: s.f32("low_freq_factor")?.unwrap_or(1.0),
            high_freq_factor: s.f32("high_freq_factor")?.unwrap_or(4.0),
            original_max_position_embeddings: orig()?,
        },
        "longrope" => {
            let orig = orig()?;
            let list = |k: &str| {
                s.f32_list(k)?.ok_or_else(|| {
                    bad(c.file, format!("RoPE scaling `longrope` without `{k}`"))
                })
            };
            let (short, long) = (list("short_factor")?, list("long_factor")?);
            // transformers: `attention_factor`, else from `factor` when given, else from
            // max_position_embeddings / original_max_position_embeddings.
            let attention_factor = match (s.f32("attention_factor")?, s.f64("factor")?) {
                (Some(a), _) => Some(a),
                (None, Some(f)) if f <= 1.0 => Some(1.0),
                (None, Some(f)) => Some((1.0 + f.ln() / (orig as f64).ln()).sqrt() as f32),
                (None, None) => None,
            };
            longrope_scaling(arch, short, long, orig, max_pos, attention_factor)
        }
        "yarn" => {
            let orig = orig()?;
            // transformers: a missing factor is max_position_embeddings / original (DeepSeek).
            let factor = match s.f64("factor")? {
                Some(f) => f,
                None => max_pos as f64 / orig as f64,
            };
            // `x or default` in the reference: 0 (or absent) means the default.
            let beta = |k: &str, default: f32| -> Result<f32, ModelError> {
                Ok(s.f32(k)?.filter(|&b| b != 0.0).unwrap_or(default))
            };
            let attention_factor = match s.f64("attention_factor")? {
                Some(a) => a as f32,
                None => yarn_attention_factor(factor, s.f64("mscale")?, s.f64("mscale_all_dim")?),
            };
            RopeScaling::Yarn {
                factor: factor as f32,
                original_max_position_embeddings: orig,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                truncate: s.bool("truncate")?.unwrap_or(true),
                attention_factor,
            }
        }
        // Dynamic NTK raises the base with the current sequence length once it passes
        // max_position_embeddings, and the reference keeps cached keys rotated with the old
        // base, so no fixed per-position table reproduces it past that length.
        "dynamic" => {
            return Err(bad(
                c.file,
                "RoPE scaling `rope_type: \"dynamic\"` (dynamic NTK) is not supported: it \
                 changes the RoPE base with the current sequence length, which rotations \
                 already held in the KV cache cannot follow"
                    .into(),
            ))
        }
        other => {
            return Err(bad(
                c.file,
                format!("RoPE scaling type `{other}` is not supported (flowrt runs default, linear, llama3, longrope and yarn)"),
            ))
        }
    };
    let r = RopeConfig { theta, scaling };
    r.validate(rope_dim).map_err(|e| bad(c.file, e))?;
    Ok(r)
}
