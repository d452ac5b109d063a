//! Loading a model file into something sessions can run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_cpu::{ActQuant, AttnSplit, KvType};
use flowrt_dispatch::DispatchOptions;
use flowrt_gguf::GgufFile;
use flowrt_kernels::Kernels;
use flowrt_model::{LoadOptions, Model, ModelConfig, ModelError, Plan};
use flowrt_text::{ChatTemplate, GgufVocab, Tokenizer};

use crate::error::EngineError;

/// How to run a model.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Threads (calling thread included); 0 = physical cores.
    pub threads: usize,
    /// Context length; `None` = the model's.
    pub n_ctx: Option<usize>,
    /// KV cache element type.
    pub kv_type: KvType,
    /// Most tokens per forward batch (prompts are prefilled in batches of this).
    pub max_batch: usize,
    /// Kernels to use; `None` = the best the host supports (or `FLOWRT_KERNELS`).
    pub kernels: Option<&'static Kernels>,
    /// Activation quantisation for quantised weights.
    pub act_quant: ActQuant,
    /// How the forward pass is cut into runlists and watched.
    pub dispatch: DispatchOptions,
    /// Record a trace of runlists and ops (see [`crate::Session::trace`]).
    pub trace: bool,
    /// Repack weights into the kernels' x8 layout at load (see `flowrt_cpu::CpuOptions`).
    pub repack: bool,
    /// How attention splits long key ranges over threads (see `flowrt_cpu::AttnSplit`).
    pub attn_split: AttnSplit,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 0,
            n_ctx: None,
            kv_type: KvType::F16,
            max_batch: 256,
            kernels: None,
            act_quant: ActQuant::Q16,
            dispatch: DispatchOptions::default(),
            trace: false,
            repack: true,
            attn_split: AttnSplit::Auto,
        }
    }
}

impl EngineOptions {
    pub fn threads(&self) -> usize {
        if self.threads == 0 {
            flowrt_cpu::physical_cores()
        } else {
            self.threads
        }
    }
}

/// A model (GGUF file or HF directory), bound and ready for sessions.
pub struct LoadedModel {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub plan: Arc<Plan>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub load_time: Duration,
}

/// Largest `config.json` read (real ones are a few KB).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

impl LoadedModel {
    /// Open and bind a model: a GGUF file, or a Hugging Face checkpoint directory.
    pub fn load(path: &Path) -> Result<LoadedModel, EngineError> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// [`LoadedModel::load`] with load options (quantisation on load applies to HF
    /// directories; GGUF files are used as they are).
    pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, EngineError> {
        let t0 = Instant::now();
        let (model, tokenizer, template) = if path.is_dir() {
            Self::load_hf_dir(path, opts)?
        } else {
            if let Some(q) = opts.quant {
                return Err(EngineError::Invalid(format!(
                    "{}: --quant {q} applies to Hugging Face directories; a GGUF file runs with the types it holds",
                    path.display()
                )));
            }
            let file = Arc::new(GgufFile::open(path)?);
            let model = Model::from_gguf(file.clone())?;
            let vocab = GgufVocab::from_gguf(&file)?;
            let tokenizer = Tokenizer::from_vocab(&vocab)?;
            let template = ChatTemplate::from_vocab(&vocab)?;
            (model, tokenizer, template)
        };
        let model = Arc::new(model);
        let plan = Arc::new(Plan::new(&model.config));
        Ok(LoadedModel {
            path: path.to_path_buf(),
            model,
            plan,
            tokenizer,
            template,
            load_time: t0.elapsed(),
        })
    }

    fn load_hf_dir(
        dir: &Path,
        opts: &LoadOptions,
    ) -> Result<(Model, Tokenizer, Option<ChatTemplate>), EngineError> {
        let config_path = dir.join("config.json");
        let bad = |reason: String| ModelError::BadCheckpoint {
            path: config_path.clone(),
            reason,
        };
        let len = std::fs::metadata(&config_path)
            .map_err(|e| {
                bad(format!(
                    "{e} (a Hugging Face model directory needs config.json)"
                ))
            })?
            .len();
        if len > MAX_CONFIG_BYTES {
            return Err(bad(format!("{len} bytes is too large for a config")).into());
        }
        let text = std::fs::read_to_string(&config_path).map_err(|e| bad(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let config = ModelConfig::from_hf_json(&config_path, &json)?;
        let model = Model::from_hf_dir(dir, config, *opts)?;
        let text = flowrt_text::hf::load_dir(dir)?;
        Ok((model, text.tokenizer, text.template))
    }

    /// The model's trained context length.
    pub fn model_ctx(&self) -> usize {
        self.model.config.max_position_embeddings
    }

    /// The context length a session gets with `opts`.
    pub fn n_ctx(&self, opts: &EngineOptions) -> Result<usize, EngineError> {
        let model_ctx = self.model_ctx();
        match opts.n_ctx {
            None => Ok(model_ctx),
            Some(n) if n >= 1 && n <= model_ctx => Ok(n),
            Some(n) => Err(EngineError::BadContextLength {
                requested: n,
                model_ctx,
            }),
        }
    }
}
