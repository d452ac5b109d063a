//! Loading a model file into something sessions can run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use flowrt_backends::BackendKind;
use flowrt_dispatch::{BackendSettings, DispatchOptions, KvPrecision};
use flowrt_gguf::GgufFile;
use flowrt_model::{EmbeddingSpec, LoadOptions, Model, ModelConfig, ModelError, Plan};
use flowrt_text::{ChatTemplate, GgufVocab, ReasoningFormat, Tokenizer, ToolFormat};

use crate::constraint::{ConstraintError, Guide};
use crate::error::EngineError;

/// How to run a model: settings every backend understands, and the chosen backend's own
/// options, which it checks (see `flowrt_backends`).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Host threads; 0 = the backend's default (the CPU's: physical cores).
    pub threads: usize,
    /// Context length; `None` = the model's.
    pub n_ctx: Option<usize>,
    /// KV cache element type.
    pub kv: KvPrecision,
    /// Most tokens per forward batch (prompts are prefilled in batches of this).
    pub max_batch: usize,
    /// Which backend runs the model (`Auto`: a real GPU when there is one, else the CPU).
    pub backend: BackendKind,
    /// Which of the backend's devices (`None`: its default).
    pub device: Option<usize>,
    /// Backend-specific `name=value` settings (the CPU's `kernels`, `act-quant`, `repack`,
    /// `attn-split`); a backend refuses a name it does not take.
    pub backend_options: Vec<(String, String)>,
    /// How the forward pass is cut into runlists and watched.
    pub dispatch: DispatchOptions,
    /// Record a trace of runlists and ops (see [`crate::Session::trace`]).
    pub trace: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 0,
            n_ctx: None,
            kv: KvPrecision::F16,
            max_batch: 256,
            backend: BackendKind::Cpu,
            device: None,
            backend_options: Vec::new(),
            dispatch: DispatchOptions::default(),
            trace: false,
        }
    }
}

impl EngineOptions {
    /// These options with the backend option `name` set to `value`.
    pub fn with_option(mut self, name: &str, value: impl ToString) -> Self {
        self.backend_options
            .push((name.to_string(), value.to_string()));
        self
    }

    /// What the backend is asked for: a cache of `n_seq` sequences of `n_ctx` positions.
    pub fn backend_settings(&self, n_ctx: usize, n_seq: usize) -> BackendSettings {
        BackendSettings {
            threads: self.threads,
            n_ctx,
            n_seq,
            max_batch: self.max_batch,
            kv: self.kv,
            device: self.device,
            options: self.backend_options.clone(),
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
    /// How the model writes tool calls (from its template and vocabulary).
    pub tool_format: ToolFormat,
    /// How the model marks its reasoning (from its template and vocabulary).
    pub reasoning: ReasoningFormat,
    /// How the model embeds, when its files declare it (see [`crate::Embedder`]).
    pub embedding: Option<EmbeddingSpec>,
    /// Why the files' embedding declaration cannot be used (an unsupported module, a
    /// malformed file): the model still loads, and embedding with it fails saying this.
    pub embedding_problem: Option<String>,
    pub load_time: Duration,
    /// The constrained-decoding token environment, built on first use (see
    /// [`LoadedModel::guide`]); shared with the model's sessions.
    guide: Arc<GuideCell>,
}

/// A [`Guide`] built at most once (a failed build is not kept: the next use tries again).
#[derive(Default)]
pub(crate) struct GuideCell {
    guide: OnceLock<Guide>,
    /// Held while building, so concurrent first uses build it once.
    building: Mutex<()>,
}

impl GuideCell {
    /// The guide for `tokenizer` and `n_logits`, built by the first call. Later calls return
    /// that guide whatever they pass: the cell belongs to one model.
    pub(crate) fn get(
        &self,
        tokenizer: &Tokenizer,
        n_logits: usize,
    ) -> Result<&Guide, ConstraintError> {
        if let Some(g) = self.guide.get() {
            return Ok(g);
        }
        let _building = self.building.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = self.guide.get() {
            return Ok(g);
        }
        let g = Guide::new(tokenizer, n_logits)?;
        Ok(self.guide.get_or_init(|| g))
    }
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
        let (model, tokenizer, template, embedding) = if path.is_dir() {
            let (model, tokenizer, template) = Self::load_hf_dir(path, opts)?;
            (model, tokenizer, template, EmbeddingSpec::read_hf_dir(path))
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
            let embedding = EmbeddingSpec::from_gguf(&file);
            (model, tokenizer, template, embedding)
        };
        let (embedding, embedding_problem) = match embedding {
            Ok(e) => (e, None),
            Err(e) => (None, Some(e.to_string())),
        };
        let model = Arc::new(model);
        let plan = Arc::new(Plan::new(&model.config));
        let source = template.as_ref().map(ChatTemplate::source);
        let texts = || (0..tokenizer.vocab_size() as u32).filter_map(|i| tokenizer.id_to_token(i));
        let tool_format = ToolFormat::detect(source, texts());
        let reasoning = ReasoningFormat::detect(source, texts());
        Ok(LoadedModel {
            path: path.to_path_buf(),
            model,
            plan,
            tokenizer,
            template,
            tool_format,
            reasoning,
            embedding,
            embedding_problem,
            load_time: t0.elapsed(),
            guide: Arc::default(),
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

    /// The constrained-decoding token environment of this model's tokenizer and logits,
    /// built on the first call (tens to hundreds of milliseconds, by vocabulary size) and kept
    /// with the model: compile each request's constraint from it.
    pub fn guide(&self) -> Result<&Guide, ConstraintError> {
        self.guide
            .get(&self.tokenizer, self.model.config.vocab_size)
    }

    /// The cell [`LoadedModel::guide`] reads, for sessions to share.
    pub(crate) fn guide_cell(&self) -> Arc<GuideCell> {
        self.guide.clone()
    }

    /// Whether the model can generate text (its family has an output projection); `false`:
    /// it only embeds.
    pub fn generates(&self) -> bool {
        self.model.config.arch.lm_head
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
