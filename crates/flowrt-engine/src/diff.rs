//! Where two models part: per-layer divergence of the residual stream, teacher-forced.
//!
//! [`diff`] runs model A (the reference: a source checkpoint) and model B (the candidate: its
//! port or quantisation) over the same token ids and compares, after the embedding and after
//! every decoder layer, the residual stream `X` of every position: the cosine similarity and
//! the relative L2 error `‖x_B − x_A‖ / ‖x_A‖`, averaged and worst over positions. The first
//! layer whose mean relative error exceeds a threshold is where the pack goes wrong. The
//! logits are compared as `flowrt verify` does: top-1 agreement and KL(A ‖ B).
//!
//! Both models run on their own backend, driven directly one layer per runlist (the cuts the
//! dispatcher makes at `--max-runlist-layers 1`, with the embedding split off), reading `X`
//! back with [`flowrt_dispatch::Backend::read_activation`] after each. Sessions and the
//! dispatcher are not involved: normal running pays nothing for this.

use std::ops::Range;
use std::time::{Duration, Instant};

use flowrt_dispatch::{Backend, Batch, LogitsWanted, Runlist, SeqSpan};
use flowrt_model::plan::Buf;
use flowrt_model::Plan;
use serde::Serialize;

use crate::error::EngineError;
use crate::load::{EngineOptions, LoadedModel};

/// One prompt to run: plain text (tokenized with special tokens added) or the built-in chat.
#[derive(Clone, Debug, PartialEq)]
pub enum DiffPrompt {
    Text(String),
    /// The built-in chat ([`crate::compare::BUILTIN_CHAT`]) rendered with model A's chat
    /// template (skipped when A has none).
    Chat,
}

impl DiffPrompt {
    /// The built-in set ([`crate::compare::BUILTIN_TEXTS`] and the chat), the one `pack`'s
    /// gate and `lint` use too.
    pub fn builtin() -> Vec<DiffPrompt> {
        crate::compare::BUILTIN_TEXTS
            .iter()
            .map(|p| DiffPrompt::Text(p.to_string()))
            .chain([DiffPrompt::Chat])
            .collect()
    }
}

/// How to diff.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// Backend settings, used for both models.
    pub engine: EngineOptions,
    /// A layer diverges when its mean relative error exceeds this.
    pub threshold: f64,
    /// Most tokens per prompt (longer ones are cut).
    pub max_tokens: usize,
}

/// The default divergence threshold (mean relative L2 error of the residual stream).
pub const DEFAULT_DIFF_THRESHOLD: f64 = 0.2;

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            engine: EngineOptions::default(),
            threshold: DEFAULT_DIFF_THRESHOLD,
            max_tokens: 512,
        }
    }
}

/// Divergence of the residual stream after one stage (the embedding or a decoder layer).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LayerDiff {
    /// The decoder layer; `None` for the embedding.
    pub layer: Option<usize>,
    pub positions: usize,
    pub mean_cosine: f64,
    pub min_cosine: f64,
    /// Mean over positions of `‖x_B − x_A‖ / ‖x_A‖`.
    pub mean_rel_err: f64,
    pub max_rel_err: f64,
    /// Where the worst relative error is: (prompt index, position).
    pub worst_at: (usize, usize),
    /// Whether `mean_rel_err` exceeds the threshold.
    pub divergent: bool,
}

/// What [`diff`] found.
#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    pub threshold: f64,
    /// Prompts run and the tokens of each.
    pub prompt_tokens: Vec<usize>,
    /// The embedding first, then layer 0, 1, ...
    pub layers: Vec<LayerDiff>,
    /// The first stage over the threshold: `Some(None)` is the embedding, `Some(Some(k))`
    /// layer k, `None` none. In JSON: `first_divergent_layer`, the layer's number, `"embedding"`
    /// or null.
    #[serde(rename = "first_divergent_layer", serialize_with = "stage_json")]
    pub first_divergent: Option<Option<usize>>,
    pub positions: usize,
    /// Share of positions whose top-1 token is the same in both.
    pub top1_agreement: f64,
    /// Mean over positions of KL(A ‖ B) of the softmaxes.
    pub mean_kl: f64,
    pub max_kl: f64,
}

fn stage_json<S: serde::Serializer>(v: &Option<Option<usize>>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        None => s.serialize_none(),
        Some(None) => s.serialize_str("embedding"),
        Some(Some(l)) => s.serialize_u64(*l as u64),
    }
}

#[derive(Clone, Copy)]
struct Acc {
    n: usize,
    cos_sum: f64,
    cos_min: f64,
    err_sum: f64,
    err_max: f64,
    worst_at: (usize, usize),
}

impl Acc {
    fn new() -> Acc {
        Acc {
            n: 0,
            cos_sum: 0.0,
            cos_min: f64::INFINITY,
            err_sum: 0.0,
            err_max: f64::NEG_INFINITY,
            worst_at: (0, 0),
        }
    }

    fn add(&mut self, a: &[f32], b: &[f32], at: (usize, usize)) {
        let (mut aa, mut bb, mut ab, mut dd) = (0f64, 0f64, 0f64, 0f64);
        for (&x, &y) in a.iter().zip(b) {
            let (x, y) = (x as f64, y as f64);
            aa += x * x;
            bb += y * y;
            ab += x * y;
            dd += (y - x) * (y - x);
        }
        // Identical rows are exactly similar (not 1 − rounding).
        let cos = if dd == 0.0 {
            1.0
        } else if aa == 0.0 || bb == 0.0 {
            0.0
        } else {
            ab / (aa.sqrt() * bb.sqrt())
        };
        let err = if dd == 0.0 {
            0.0
        } else if aa == 0.0 {
            f64::INFINITY
        } else {
            (dd / aa).sqrt()
        };
        // NaN (a broken model) counts as the worst possible.
        let (cos, err) = (
            if cos.is_nan() { -1.0 } else { cos },
            if err.is_nan() { f64::INFINITY } else { err },
        );
        self.n += 1;
        self.cos_sum += cos;
        self.cos_min = self.cos_min.min(cos);
        self.err_sum += err;
        if err > self.err_max {
            self.err_max = err;
            self.worst_at = at;
        }
    }
}

/// The groups of `plan` run as one stage each: the embedding (everything before layer 0),
/// then each decoder layer (the last with the output head).
fn stages(plan: &Plan) -> Vec<(Option<usize>, Range<usize>)> {
    let mut out: Vec<(Option<usize>, Range<usize>)> = Vec::new();
    for (i, g) in plan.groups.iter().enumerate() {
        let layer = g.kind.layer();
        match out.last_mut() {
            // A group outside any layer after the first layer (the output) joins the last.
            Some(last) if layer == last.0 || (layer.is_none() && last.0.is_some()) => {
                last.1.end = i + 1
            }
            _ => out.push((layer, i..i + 1)),
        }
    }
    out
}

/// Check that A and B can be compared, returning the reason they cannot.
fn check_compatible(a: &LoadedModel, b: &LoadedModel) -> Result<(), EngineError> {
    let (ca, cb) = (&a.model.config, &b.model.config);
    let mut bad = Vec::new();
    for (what, x, y) in [
        ("decoder layers", ca.num_hidden_layers, cb.num_hidden_layers),
        ("hidden size", ca.hidden_size, cb.hidden_size),
        ("vocabulary (logit rows)", ca.vocab_size, cb.vocab_size),
        (
            "tokenizer vocabulary",
            a.tokenizer.vocab_size(),
            b.tokenizer.vocab_size(),
        ),
    ] {
        if x != y {
            bad.push(format!("{what}: A has {x}, B has {y}"));
        }
    }
    if bad.is_empty() {
        let n = a.tokenizer.vocab_size() as u32;
        let differ: Vec<u32> = (0..n)
            .filter(|&i| a.tokenizer.id_to_token(i) != b.tokenizer.id_to_token(i))
            .collect();
        if let Some(&first) = differ.first() {
            bad.push(format!(
                "tokenizers: {} of {n} tokens differ (id {first} is {:?} in A, {:?} in B)",
                differ.len(),
                a.tokenizer.id_to_token(first).unwrap_or("<none>"),
                b.tokenizer.id_to_token(first).unwrap_or("<none>"),
            ));
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    Err(EngineError::Invalid(format!(
        "{} and {} cannot be diffed layer by layer (they need the same tokenizer, layer count \
         and hidden size): {}",
        a.path.display(),
        b.path.display(),
        bad.join("; ")
    )))
}

/// The token ids of `prompt` under `model`'s tokenizer (`None`: a chat prompt for a model
/// without a template).
fn tokenize(model: &LoadedModel, prompt: &DiffPrompt) -> Result<Option<Vec<u32>>, EngineError> {
    Ok(match prompt {
        DiffPrompt::Text(t) => Some(model.tokenizer.encode(t, true, false)?),
        DiffPrompt::Chat => match &model.template {
            None => None,
            Some(tmpl) => {
                let text = tmpl.render(&crate::compare::builtin_chat(), true)?;
                Some(model.tokenizer.encode(&text, false, true)?)
            }
        },
    })
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
    let lse = m + s.ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// One backend driven stage by stage.
struct Runner {
    backend: Box<dyn Backend>,
    plan: std::sync::Arc<Plan>,
    name: &'static str,
}

impl Runner {
    fn run(&mut self, rl: &Runlist, batch: &Batch) -> Result<(), EngineError> {
        let deadline = Instant::now() + Duration::from_secs(3600);
        self.backend
            .submit(&self.plan, rl, batch)
            .and_then(|()| self.backend.wait(&self.plan, deadline, None))
            .map_err(|e| {
                EngineError::Invalid(format!(
                    "model {} failed at {}: {e}",
                    self.name,
                    rl.describe_layers()
                ))
            })
    }

    fn residual(&mut self, rows: usize) -> Result<Vec<f32>, EngineError> {
        self.backend
            .read_activation(Buf::X, rows)
            .map_err(|e| EngineError::Invalid(format!("model {}: {e}", self.name)))
    }
}

/// Run A (reference) and B (candidate) teacher-forced over `prompts` and compare them layer
/// by layer (see the module docs).
pub fn diff(
    a: &LoadedModel,
    b: &LoadedModel,
    prompts: &[DiffPrompt],
    opts: &DiffOptions,
) -> Result<DiffReport, EngineError> {
    if !(opts.threshold.is_finite() && opts.threshold >= 0.0) {
        return Err(EngineError::Invalid(format!(
            "the threshold must be a non-negative number, got {}",
            opts.threshold
        )));
    }
    check_compatible(a, b)?;
    let max_tokens = opts.max_tokens.min(a.model_ctx()).min(b.model_ctx()).max(1);
    let mut token_lists = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let Some(mut ta) = tokenize(a, p)? else {
            continue;
        };
        let tb = tokenize(b, p)?;
        if tb.as_ref() != Some(&ta) {
            return Err(EngineError::Invalid(format!(
                "prompt {i} tokenizes differently in A ({} ids) and B ({}): the models need \
                 the same tokenizer",
                ta.len(),
                tb.map_or("no template".to_string(), |t| format!("{} ids", t.len()))
            )));
        }
        ta.truncate(max_tokens);
        if !ta.is_empty() {
            token_lists.push(ta);
        }
    }
    if token_lists.is_empty() {
        return Err(EngineError::Invalid("no prompt to run".into()));
    }
    let n_ctx = token_lists.iter().map(Vec::len).max().unwrap_or(1);
    let settings = opts.engine.backend_settings(n_ctx, 1);
    let open = |m: &LoadedModel, name| -> Result<Runner, EngineError> {
        Ok(Runner {
            backend: flowrt_backends::open(opts.engine.backend, m.model.clone(), &settings)?,
            plan: m.plan.clone(),
            name,
        })
    };
    let mut ra = open(a, "A")?;
    let mut rb = open(b, "B")?;
    let sa = stages(&a.plan);
    let sb = stages(&b.plan);
    if sa.iter().map(|s| s.0).ne(sb.iter().map(|s| s.0)) {
        return Err(EngineError::Invalid(
            "the two models' forward passes have different layers".into(),
        ));
    }
    let runlists = |s: &[(Option<usize>, Range<usize>)]| -> Vec<Runlist> {
        s.iter()
            .enumerate()
            .map(|(k, (layer, groups))| Runlist {
                index: k,
                count: s.len(),
                groups: groups.clone(),
                layers: layer.map(|l| (l, l)),
                deadline: Duration::from_secs(3600),
            })
            .collect()
    };
    let (rla, rlb) = (runlists(&sa), runlists(&sb));
    let hidden = a.model.config.hidden_size;
    let vocab = a.model.config.vocab_size;
    let max_batch = ra.backend.max_batch().min(rb.backend.max_batch()).max(1);
    let mut accs = vec![Acc::new(); sa.len()];
    let (mut positions, mut top1, mut kl_sum, mut kl_max) = (0usize, 0usize, 0f64, 0f64);
    for (pi, tokens) in token_lists.iter().enumerate() {
        for (ci, chunk) in tokens.chunks(max_batch).enumerate() {
            let pos0 = ci * max_batch;
            let spans = [SeqSpan {
                seq: 0,
                pos0,
                len: chunk.len(),
            }];
            let batch = Batch {
                tokens: chunk,
                spans: &spans,
                logits: LogitsWanted::All,
            };
            let n = chunk.len();
            for (k, acc) in accs.iter_mut().enumerate() {
                ra.run(&rla[k], &batch)?;
                let xa = ra.residual(n)?;
                rb.run(&rlb[k], &batch)?;
                let xb = rb.residual(n)?;
                for t in 0..n {
                    let r = t * hidden..(t + 1) * hidden;
                    acc.add(&xa[r.clone()], &xb[r], (pi, pos0 + t));
                }
            }
            let (la, lb) = (ra.backend.logits(), rb.backend.logits());
            if la.len() != n * vocab || lb.len() != n * vocab {
                return Err(EngineError::Invalid(format!(
                    "expected {n} logit rows of {vocab}, got {} and {} values",
                    la.len(),
                    lb.len()
                )));
            }
            for (ra_row, rb_row) in la.chunks_exact(vocab).zip(lb.chunks_exact(vocab)) {
                let (pa, pb) = (log_softmax(ra_row), log_softmax(rb_row));
                let kl: f64 = pa
                    .iter()
                    .zip(&pb)
                    .map(|(&x, &y)| {
                        if x.is_finite() {
                            x.exp() * (x - y)
                        } else {
                            0.0
                        }
                    })
                    .sum();
                let kl = if kl.is_nan() {
                    f64::INFINITY
                } else {
                    kl.max(0.0)
                };
                positions += 1;
                top1 += usize::from(argmax(ra_row) == argmax(rb_row));
                kl_sum += kl;
                kl_max = kl_max.max(kl);
            }
        }
    }
    let layers: Vec<LayerDiff> = accs
        .iter()
        .zip(&sa)
        .map(|(acc, (layer, _))| {
            let n = acc.n.max(1) as f64;
            let mean_rel_err = acc.err_sum / n;
            LayerDiff {
                layer: *layer,
                positions: acc.n,
                mean_cosine: acc.cos_sum / n,
                min_cosine: acc.cos_min,
                mean_rel_err,
                max_rel_err: acc.err_max,
                worst_at: acc.worst_at,
                divergent: mean_rel_err > opts.threshold,
            }
        })
        .collect();
    let first_divergent = layers.iter().find(|l| l.divergent).map(|l| l.layer);
    Ok(DiffReport {
        threshold: opts.threshold,
        prompt_tokens: token_lists.iter().map(Vec::len).collect(),
        first_divergent,
        layers,
        positions,
        top1_agreement: top1 as f64 / positions.max(1) as f64,
        mean_kl: kl_sum / positions.max(1) as f64,
        max_kl: kl_max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulator_measures_cosine_and_relative_error() {
        let mut acc = Acc::new();
        acc.add(&[1.0, 0.0], &[1.0, 0.0], (0, 0));
        assert_eq!((acc.cos_min, acc.err_max), (1.0, 0.0));
        acc.add(&[1.0, 0.0], &[0.0, 1.0], (0, 1));
        assert!((acc.cos_min - 0.0).abs() < 1e-12);
        assert!((acc.err_max - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(acc.worst_at, (0, 1));
        acc.add(&[1.0, 0.0], &[f32::NAN, 0.0], (1, 0));
        assert_eq!(acc.err_max, f64::INFINITY);
        assert_eq!(acc.worst_at, (1, 0));
    }
}
