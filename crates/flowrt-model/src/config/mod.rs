//! Hyperparameters, read from a model file's metadata. Field names follow HF transformers.

use std::path::{Path, PathBuf};

use flowrt_gguf::GgufFile;

use crate::arch::{self, ArchSpec, RopePairing};
use crate::error::ModelError;

/// Everything the decoder needs to know about a model's shape and numerics.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// The family's rules.
    pub arch: &'static ArchSpec,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the gated feed-forward layer.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (`num_attention_heads % num_key_value_heads == 0`).
    pub num_key_value_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding and output matrices).
    pub vocab_size: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Leading dimensions of each head that RoPE rotates (`<= head_dim`, even).
    pub rope_dim: usize,
    /// RoPE pairing of the weights as loaded.
    pub rope_pairing: RopePairing,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// Scale applied to attention scores (1/sqrt(head_dim) for Llama).
    pub attn_scale: f32,
}

impl ModelConfig {
    /// Read the config of a GGUF model.
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
        let num_hidden_layers = req_u("block_count")?;
        let intermediate_size = req_u("feed_forward_length")?;
        let num_attention_heads = req_u("attention.head_count")?;
        let num_key_value_heads = opt_u("attention.head_count_kv")?.unwrap_or(num_attention_heads);
        let max_position_embeddings = req_u("context_length")?;
        let head_dim = match opt_u("attention.key_length")? {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let rope_dim = opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        let rms_norm_eps = f
            .get_f32(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| ModelError::MissingKey {
                file: file.clone(),
                key: key("attention.layer_norm_rms_epsilon"),
            })?;
        let rope_theta = f.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
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
            rope_theta,
            rope_dim,
            rope_pairing: arch.gguf_rope_pairing,
            max_position_embeddings,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
        };
        cfg.validate(&file)?;
        Ok(cfg)
    }

    /// Check that the numbers describe a model that can exist.
    pub fn validate(&self, file: &Path) -> Result<(), ModelError> {
        let err = |r: String| Err(bad(file, r));
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in positive {
            if v == 0 {
                return err(format!("{name} is 0"));
            }
        }
        // Caps that no real model reaches but that stop absurd metadata from sizing buffers.
        let caps = [
            ("hidden_size", self.hidden_size, 1 << 16),
            ("intermediate_size", self.intermediate_size, 1 << 18),
            ("num_hidden_layers", self.num_hidden_layers, 1 << 12),
            ("num_attention_heads", self.num_attention_heads, 1 << 10),
            ("head_dim", self.head_dim, 1 << 12),
            ("vocab_size", self.vocab_size, 1 << 22),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                1 << 24,
            ),
        ];
        for (name, v, cap) in caps {
            if v > cap {
                return err(format!("{name} = {v} exceeds the supported maximum {cap}"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return err(format!(
                "rope dimension count {} must be even and at most head_dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return err(format!(
                "rms_norm_eps = {} must be positive",
                self.rms_norm_eps
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return err(format!("rope_theta = {} must be positive", self.rope_theta));
        }
        Ok(())
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}

fn bad(file: &Path, reason: String) -> ModelError {
    ModelError::BadConfig {
        file: file.to_path_buf(),
        reason,
    }
}

pub(crate) fn file_name(f: &GgufFile) -> PathBuf {
    f.path()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "<memory>".into())
}
