//! Loading a model file into something sessions can run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_cpu::{ActQuant, KvType};
use flowrt_gguf::GgufFile;
use flowrt_kernels::Kernels;
use flowrt_model::{Model, Plan};
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

/// A model file, bound and ready for sessions.
pub struct LoadedModel {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub plan: Arc<Plan>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub load_time: Duration,
}

impl LoadedModel {
    /// Open and bind a GGUF model file.
    pub fn load(path: &Path) -> Result<LoadedModel, EngineError> {
        let t0 = Instant::now();
        let file = Arc::new(GgufFile::open(path)?);
        let model = Arc::new(Model::from_gguf(file.clone())?);
        let plan = Arc::new(Plan::new(&model.config));
        let vocab = GgufVocab::from_gguf(&file)?;
        let tokenizer = Tokenizer::from_vocab(&vocab)?;
        let template = ChatTemplate::from_vocab(&vocab)?;
        Ok(LoadedModel {
            path: path.to_path_buf(),
            model,
            plan,
            tokenizer,
            template,
            load_time: t0.elapsed(),
        })
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
