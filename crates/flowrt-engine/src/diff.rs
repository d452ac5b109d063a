//! Where two models part: per-layer divergence, teacher-forced.
//!
//! [`diff`] runs model A (the reference: a source checkpoint) and model B (the candidate: its
//! port or quantisation) over the same token ids. After the embedding and after every decoder
//! layer it compares the residual stream `X` of every position (cosine similarity and relative
//! L2 error `‖x_B − x_A‖ / ‖x_A‖`, mean and worst over positions) and the logits as
//! `flowrt verify` does (top-1 agreement, KL(A ‖ B)).
//!
//! Where B goes wrong is decided by each block's *own* error. The residual stream cannot tell:
//! once one layer errs, every later one inherits the error, and a layer's update can be small
//! beside the stream it joins. So B is also run a second time, with A's residual stream
//! written into it before each block (attention, feed-forward), and what B's block adds is
//! compared with what A's adds to the same input: `‖X_B' − X_A‖ / ‖X_A − X_in‖` over all
//! positions. A layer diverges when its attention or feed-forward block's own error exceeds
//! the threshold; the first such layer is reported.
//!
//! The default threshold, 0.2, was chosen from measurements (docs/porting.md, "Choosing
//! diff's threshold"): honest Q8_0, Q4_K and F16 packs of SmolLM2 stay at or below 0.026, 4-bit
//! quantisation of the random-weight fixtures at 0.14 to 0.16 (Q4_1) and 0.15 to 0.20 (Q4_0),
//! while the all-ones QK-norm shim of SmolLM2 gives 0.254 in layer 0's attention (and exactly 0
//! in every feed-forward block).
//!
//! The models run on their own backends, driven directly one block per runlist, reading `X`
//! back with [`flowrt_dispatch::Backend::read_activation`] and writing it with
//! [`flowrt_dispatch::Backend::write_activation`]. Sessions and the dispatcher are not
//! involved: normal running pays nothing for this.

use std::ops::Range;
use std::time::{Duration, Instant};

use flowrt_dispatch::{Backend, Batch, LogitsWanted, Runlist, SeqSpan};
use flowrt_model::plan::Buf;
use flowrt_model::{GroupKind, Plan};
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
    /// A layer diverges when its attention or feed-forward block's own error exceeds this.
    pub threshold: f64,
    /// Most tokens per prompt (longer ones are cut).
    pub max_tokens: usize,
}

/// The default divergence threshold: a block's own relative error (see the module docs).
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

/// Divergence after one stage (the embedding or a decoder layer): the residual stream, and
/// each block's own error.
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
    /// The attention block's own error: `‖X_B' − X_A‖ / ‖X_A − X_in‖` over all positions
    /// (Frobenius norms), where `X_in` is A's residual stream before the block, `X_A` A's after
    /// it and `X_B'` what B's block makes of `X_in` (B's KV cache filled from A's inputs too):
    /// how far B's update is from A's, relative to the update, without the error B inherits
    /// from earlier layers. For the embedding row: the embedding's relative error.
    pub attn_err: f64,
    /// The worst position's relative error of the same.
    pub max_attn_err: f64,
    /// The feed-forward block's own error, measured the same way (0 for the embedding).
    pub ffn_err: f64,
    pub max_ffn_err: f64,
    /// Whether `attn_err` or `ffn_err` exceeds the threshold.
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
    /// The first stage whose own error is over the threshold: `Some(None)` is the embedding, `Some(Some(k))`
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

/// A block's own error over many positions: the squared norms of the error of its update
/// and of the update itself, summed, and the worst position's relative error.
#[derive(Clone, Copy, Debug)]
struct Own {
    dd: f64,
    uu: f64,
    max: f64,
}

impl Own {
    fn new() -> Own {
        Own {
            dd: 0.0,
            uu: 0.0,
            max: 0.0,
        }
    }

    /// `‖ΔU‖ / ‖U‖` over every position (Frobenius norms).
    fn relative(&self) -> f64 {
        relative(self.dd, self.uu)
    }
}

/// One stage's figures: the residual stream after it (B's own run against A's), and the
/// block's own error (B's block fed A's input, against A's block).
#[derive(Clone, Copy)]
struct Acc {
    n: usize,
    cos_sum: f64,
    cos_min: f64,
    err_sum: f64,
    err_max: f64,
    worst_at: (usize, usize),
    own: Own,
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
            own: Own::new(),
        }
    }

    /// One position of the block's own error: `x_B' − x_A` against `x_A − x_in`, where `x_in`
    /// is A's residual stream before the block and `x_B'` what B's block made of it: the error
    /// of the block's update, and the update.
    fn add_own(&mut self, a: &[f32], a_in: &[f32], b: &[f32]) {
        let (mut uu, mut dd) = (0f64, 0f64);
        for ((&x, &x0), &y) in a.iter().zip(a_in).zip(b) {
            let u = x as f64 - x0 as f64;
            uu += u * u;
            dd += (y as f64 - x as f64) * (y as f64 - x as f64);
        }
        self.own.dd += dd;
        self.own.uu += uu;
        self.own.max = self.own.max.max(relative(dd, uu));
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
        let err = relative(dd, aa);
        // NaN (a broken model) counts as the worst possible.
        let cos = if cos.is_nan() { -1.0 } else { cos };
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

/// `sqrt(dd / aa)`: 0 when `dd` is 0, infinite when only `aa` is, and NaN (a broken model)
/// counted as infinite.
fn relative(dd: f64, aa: f64) -> f64 {
    let e = if dd == 0.0 {
        0.0
    } else if aa == 0.0 {
        f64::INFINITY
    } else {
        (dd / aa).sqrt()
    };
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

/// A block of the forward pass whose update to the residual stream is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Embed,
    Attention,
    Ffn,
}

/// The groups of `plan` run as one stage each: the embedding, then each layer's attention and
/// feed-forward blocks (the output head joins the last block).
fn stages(plan: &Plan) -> Vec<(Option<usize>, Block, Range<usize>)> {
    let mut out: Vec<(Option<usize>, Block, Range<usize>)> = Vec::new();
    for (i, g) in plan.groups.iter().enumerate() {
        let block = match g.kind {
            GroupKind::Embed => Block::Embed,
            GroupKind::Attention { .. } => Block::Attention,
            GroupKind::Ffn { .. } => Block::Ffn,
            GroupKind::Output => match out.last_mut() {
                Some(last) => {
                    last.2.end = i + 1;
                    continue;
                }
                None => Block::Embed,
            },
        };
        out.push((g.kind.layer(), block, i..i + 1));
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

    fn write_residual(&mut self, x: &[f32]) -> Result<(), EngineError> {
        self.backend
            .write_activation(Buf::X, x)
            .map_err(|e| EngineError::Invalid(format!("model {}: {e}", self.name)))
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
    // B once more, fed A's residual stream before every block.
    let mut rbo = open(b, "B (on A's input)")?;
    let sa = stages(&a.plan);
    let sb = stages(&b.plan);
    let key = |s: &(Option<usize>, Block, Range<usize>)| (s.0, s.1);
    if sa.iter().map(key).ne(sb.iter().map(key)) {
        return Err(EngineError::Invalid(
            "the two models' forward passes have different layers".into(),
        ));
    }
    let runlists = |s: &[(Option<usize>, Block, Range<usize>)]| -> Vec<Runlist> {
        s.iter()
            .enumerate()
            .map(|(k, (layer, _, groups))| Runlist {
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
    let max_batch = ra
        .backend
        .max_batch()
        .min(rb.backend.max_batch())
        .min(rbo.backend.max_batch())
        .max(1);
    let mut accs = vec![Acc::new(); sa.len()];
    // The logits, compared as `verify` and `pack`'s gate compare them.
    let mut logits = crate::verify::Acc::default();
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
            // A's residual stream before the stage (the embedding's input: nothing).
            let mut a_in: Option<Vec<f32>> = None;
            for (k, acc) in accs.iter_mut().enumerate() {
                ra.run(&rla[k], &batch)?;
                let xa = ra.residual(n)?;
                rb.run(&rlb[k], &batch)?;
                let xb = rb.residual(n)?;
                // B's block on A's input (the embedding has none: it is B's own).
                if let Some(x) = &a_in {
                    rbo.write_residual(x)?;
                }
                rbo.run(&rlb[k], &batch)?;
                let xo = rbo.residual(n)?;
                let zeros = vec![0f32; hidden];
                for t in 0..n {
                    let r = t * hidden..(t + 1) * hidden;
                    acc.add(&xa[r.clone()], &xb[r.clone()], (pi, pos0 + t));
                    let before = a_in.as_ref().map_or(&zeros[..], |x| &x[r.clone()]);
                    acc.add_own(&xa[r.clone()], before, &xo[r]);
                }
                a_in = Some(xa);
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
                logits.add(ra_row, rb_row);
            }
        }
    }
    let mut layers: Vec<LayerDiff> = Vec::new();
    for (k, (acc, (layer, block, _))) in accs.iter().zip(&sa).enumerate() {
        // A layer's row: the residual after its feed-forward block, the own errors of its
        // attention block (the stage before) and of its feed-forward block.
        let (attn, ffn) = match block {
            Block::Embed => (acc.own, Own::new()),
            Block::Ffn if k > 0 => (accs[k - 1].own, acc.own),
            _ => continue,
        };
        let n = acc.n.max(1) as f64;
        let (attn_err, ffn_err) = (attn.relative(), ffn.relative());
        layers.push(LayerDiff {
            layer: *layer,
            positions: acc.n,
            mean_cosine: acc.cos_sum / n,
            min_cosine: acc.cos_min,
            mean_rel_err: acc.err_sum / n,
            max_rel_err: acc.err_max,
            worst_at: acc.worst_at,
            attn_err,
            max_attn_err: attn.max,
            ffn_err,
            max_ffn_err: ffn.max,
            divergent: attn_err.max(ffn_err) > opts.threshold,
        });
    }
    let first_divergent = layers.iter().find(|l| l.divergent).map(|l| l.layer);
    let (top1_agreement, mean_kl) = logits.ratio();
    Ok(DiffReport {
        threshold: opts.threshold,
        prompt_tokens: token_lists.iter().map(Vec::len).collect(),
        first_divergent,
        layers,
        positions: logits.positions,
        top1_agreement,
        mean_kl,
        max_kl: logits.max_kl,
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
