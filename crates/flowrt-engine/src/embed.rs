//! Embeddings: many texts of any lengths, batched into few forward passes.
//!
//! An [`Embedder`] holds a session over the model's embedding plan
//! ([`flowrt_model::Plan::embedding`]): one forward pass carries up to
//! [`EmbedOptions::batch_seqs`] texts and [`EmbedOptions::batch_tokens`] tokens, each text a
//! span of its own sequence, so attention is masked per text (no padding: a short text beside
//! a long one costs only its own tokens) and the backend pools each span into one row. Texts
//! are packed longest first; results come back in input order. Memory is bounded by those two
//! numbers whatever the number of texts.
//!
//! Pooling is what the model declares ([`flowrt_model::EmbeddingSpec`]: a sentence-transformers
//! `modules.json`, a GGUF `pooling_type`). A model without a declaration, decoders included,
//! is refused ([`EngineError::NoPooling`]) unless the caller names a pooling
//! ([`EmbedOptions::pooling`]); flowrt does not guess one.
//!
//! A text longer than the model's limit ([`Embedder::max_tokens`]: `max_seq_length` of a
//! sentence-transformers directory, else the context, at most `batch_tokens`) is an error
//! naming it, or when the caller asks for truncation is cut to the limit keeping the special
//! tokens the tokenizer adds (as sentence-transformers truncates); [`Embeddings::truncated`]
//! says which were.

use flowrt_model::{EmbeddingSpec, Plan, Pooling};

use crate::error::EngineError;
use crate::load::{EngineOptions, LoadedModel};
use crate::session::BatchSession;

/// How to embed.
#[derive(Clone, Debug)]
pub struct EmbedOptions {
    /// Pooling to use instead of the model's declaration (required for a model without one).
    pub pooling: Option<Pooling>,
    /// L2-normalise (`None`: as the model declares; with no declaration, true).
    pub normalize: Option<bool>,
    /// Most tokens of one forward pass, all its texts together (at least the longest text).
    pub batch_tokens: usize,
    /// Most texts of one forward pass.
    pub batch_seqs: usize,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            pooling: None,
            normalize: None,
            batch_tokens: 2048,
            batch_seqs: 64,
        }
    }
}

/// The embeddings of a list of inputs, in input order.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    /// One vector per input, of [`Embedder::dims`] values.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens each input ran with (after any truncation).
    pub tokens: Vec<usize>,
    /// Whether each input was cut to the limit (see [`Embedder::tokenize`]).
    pub truncated: Vec<bool>,
}

impl Embeddings {
    /// Tokens of every input together.
    pub fn total_tokens(&self) -> usize {
        self.tokens.iter().sum()
    }
}

/// A model ready to embed (see the module docs).
pub struct Embedder {
    session: BatchSession,
    pooling: Pooling,
    normalize: bool,
    max_tokens: usize,
    dims: usize,
    /// Where the pooling came from (`modules.json`, `bert.pooling_type`, `--pooling`).
    source: String,
}

impl Embedder {
    /// An embedder for `model` on the backend `engine` names.
    pub fn new(
        model: &LoadedModel,
        engine: &EngineOptions,
        opts: &EmbedOptions,
    ) -> Result<Embedder, EngineError> {
        if let Some(problem) = &model.embedding_problem {
            return Err(EngineError::Invalid(format!(
                "cannot embed with this model: {problem}"
            )));
        }
        let declared = model.embedding.as_ref();
        let (pooling, source) = match (opts.pooling, declared) {
            (Some(p), _) => (p, "requested".to_string()),
            (None, Some(spec)) => (spec.pooling, spec.source.clone()),
            (None, None) => return Err(EngineError::NoPooling(model.path.clone())),
        };
        let normalize = opts
            .normalize
            .unwrap_or(declared.is_none_or(|s: &EmbeddingSpec| s.normalize));
        let hidden = model.model.config.hidden_size;
        if let Some(d) = declared.and_then(|s| s.dimension).filter(|&d| d != hidden) {
            return Err(EngineError::Invalid(format!(
                "{}: the pooling module declares {d} dimensions, the model's hidden size is {hidden}",
                model.path.display()
            )));
        }
        if opts.batch_seqs == 0 || opts.batch_tokens == 0 {
            return Err(EngineError::Invalid(
                "an embedding batch needs at least one text and one token".into(),
            ));
        }
        // `n_ctx` bounds a text, within the model's positions (a server's --ctx-len, sized
        // for its chat models, may exceed an encoder's 512).
        let n_ctx = match engine.n_ctx {
            Some(0) => {
                return Err(EngineError::BadContextLength {
                    requested: 0,
                    model_ctx: model.model_ctx(),
                })
            }
            Some(n) => n.min(model.model_ctx()),
            None => model.model_ctx(),
        };
        let max_tokens = declared
            .and_then(|s| s.max_tokens)
            .unwrap_or(n_ctx)
            .min(n_ctx)
            .min(opts.batch_tokens);
        let mut engine = engine.clone();
        engine.max_batch = opts.batch_tokens;
        engine.n_ctx = Some(max_tokens);
        let plan = Plan::embedding(&model.model.config, pooling);
        let session =
            BatchSession::for_embedding(model, &engine, opts.batch_seqs, plan, max_tokens)?;
        Ok(Embedder {
            session,
            pooling,
            normalize,
            max_tokens,
            dims: model.model.config.hidden_size,
            source,
        })
    }

    /// Values per embedding.
    pub fn dims(&self) -> usize {
        self.dims
    }
    /// Most tokens of one text.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }
    pub fn normalizes(&self) -> bool {
        self.normalize
    }
    /// Where the pooling came from.
    pub fn pooling_source(&self) -> &str {
        &self.source
    }
    /// The session's backend, for reports.
    pub fn session(&self) -> &BatchSession {
        &self.session
    }

    /// A text's token ids as the model embeds it (special tokens added as the tokenizer's
    /// post-processor or flags say, special-token text matched as HF does), within the
    /// limit: an error for a longer text, or with `truncate` the first ids of the text's body
    /// kept beside the added special tokens. Returns the ids and whether they were cut.
    pub fn tokenize(
        &self,
        model: &LoadedModel,
        index: usize,
        text: &str,
        truncate: bool,
    ) -> Result<(Vec<u32>, bool), EngineError> {
        let full = model.tokenizer.encode(text, true, true)?;
        if full.len() <= self.max_tokens {
            return Ok((full, false));
        }
        if !truncate {
            return Err(EngineError::InputTooLong {
                index,
                tokens: full.len(),
                max: self.max_tokens,
            });
        }
        let body = model.tokenizer.encode(text, false, true)?;
        // The added tokens sit around the body: `full = head + body + tail`.
        let head = (0..=full.len() - body.len())
            .find(|&p| full[p..p + body.len()] == body[..])
            .ok_or_else(|| EngineError::BadInput {
                index,
                reason: "cannot truncate: the tokenizer's added tokens do not surround the text's tokens".into(),
            })?;
        let added = full.len() - body.len();
        if added >= self.max_tokens {
            return Err(EngineError::BadInput {
                index,
                reason: format!(
                    "cannot truncate: the tokenizer adds {added} tokens, as many as the limit {}",
                    self.max_tokens
                ),
            });
        }
        let keep = self.max_tokens - added;
        let mut ids = Vec::with_capacity(self.max_tokens);
        ids.extend_from_slice(&full[..head]);
        ids.extend_from_slice(&body[..keep]);
        ids.extend_from_slice(&full[head + body.len()..]);
        Ok((ids, true))
    }

    /// Embed texts (tokenized with [`Embedder::tokenize`]).
    pub fn embed(
        &mut self,
        model: &LoadedModel,
        texts: &[&str],
        truncate: bool,
    ) -> Result<Embeddings, EngineError> {
        let mut ids = Vec::with_capacity(texts.len());
        let mut truncated = Vec::with_capacity(texts.len());
        for (i, t) in texts.iter().enumerate() {
            let (x, cut) = self.tokenize(model, i, t, truncate)?;
            ids.push(x);
            truncated.push(cut);
        }
        let mut out = self.embed_tokens(&ids)?;
        out.truncated = truncated;
        Ok(out)
    }

    /// Embed token-id inputs, each within [`Embedder::max_tokens`] and not empty.
    pub fn embed_tokens(&mut self, inputs: &[Vec<u32>]) -> Result<Embeddings, EngineError> {
        let vocab = self.session.vocab_size();
        for (i, x) in inputs.iter().enumerate() {
            if x.is_empty() {
                return Err(EngineError::BadInput {
                    index: i,
                    reason: "it has no tokens".into(),
                });
            }
            if x.len() > self.max_tokens {
                return Err(EngineError::InputTooLong {
                    index: i,
                    tokens: x.len(),
                    max: self.max_tokens,
                });
            }
            if let Some(&id) = x.iter().find(|&&id| id as usize >= vocab) {
                return Err(EngineError::BadInput {
                    index: i,
                    reason: format!("token id {id} is outside the vocabulary (size {vocab})"),
                });
            }
        }
        // Longest first, then greedy batches within both bounds.
        let mut order: Vec<usize> = (0..inputs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(inputs[i].len()));
        let (max_seqs, max_toks) = (self.session.n_slots(), self.session.max_batch());
        let mut vectors = vec![Vec::new(); inputs.len()];
        let mut start = 0;
        while start < order.len() {
            let (mut end, mut toks) = (start, 0);
            while end < order.len()
                && end - start < max_seqs
                && toks + inputs[order[end]].len() <= max_toks
            {
                toks += inputs[order[end]].len();
                end += 1;
            }
            let items: Vec<(usize, &[u32])> = order[start..end]
                .iter()
                .enumerate()
                .map(|(slot, &i)| (slot, inputs[i].as_slice()))
                .collect();
            let backend = self.session.backend_info().name;
            let pooled = self.session.embed_step(&items)?;
            if pooled.len() != items.len() * self.dims {
                return Err(EngineError::Invalid(format!(
                    "the {backend} backend returned {} pooled values for {} texts of {} (it has no pooling op; use --backend cpu)",
                    pooled.len(),
                    items.len(),
                    self.dims
                )));
            }
            for (k, &i) in order[start..end].iter().enumerate() {
                let mut v = pooled[k * self.dims..(k + 1) * self.dims].to_vec();
                if self.normalize {
                    l2_normalize(&mut v);
                }
                vectors[i] = v;
            }
            start = end;
        }
        Ok(Embeddings {
            vectors,
            tokens: inputs.iter().map(Vec::len).collect(),
            truncated: vec![false; inputs.len()],
        })
    }
}

/// `v / max(‖v‖, 1e-12)`, as `torch.nn.functional.normalize`.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let inv = 1.0 / norm.max(1e-12);
    for x in v {
        *x = (*x as f64 * inv) as f32;
    }
}
