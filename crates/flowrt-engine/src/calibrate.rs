//! Matmul input statistics for importance-weighted quantisation.
//!
//! [`input_stats`] runs a model over prompts (the source of a pack, at f32) with its backend
//! collecting, for every dense matmul, the sum of squares of each input column
//! ([`flowrt_dispatch::Backend::collect_input_stats`]). A weight that multiplies a column
//! whose activations are large moves the output more when it is rounded, so `flowrt pack`
//! weighs each value's rounding error by its column's mean square (the idea behind
//! llama.cpp's importance matrices). Sessions and the dispatcher are not involved: the
//! backend is driven directly, the whole plan one runlist per chunk of a prompt.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flowrt_backends::BackendKind;
use flowrt_dispatch::BackendSettings;
use flowrt_dispatch::{Backend, Batch, InputStat, InputStatKind, LogitsWanted, Runlist, SeqSpan};
use flowrt_gguf::GgmlType;
use flowrt_model::plan::{Buf, MatRole};
use flowrt_model::{GroupKind, Model, Plan, WeightData, WeightMatrix};

use crate::error::EngineError;
use crate::load::{EngineOptions, LoadedModel};

/// Every dense matmul's [`InputStat`] over `prompts` (each from position 0, cut to the
/// model's context), in layer and role order.
pub fn input_stats(
    model: &LoadedModel,
    prompts: &[Vec<u32>],
    opts: &EngineOptions,
    kind: InputStatKind,
) -> Result<Vec<InputStat>, EngineError> {
    let max = model.model_ctx().max(1);
    let prompts: Vec<&[u32]> = prompts
        .iter()
        .map(|p| &p[..p.len().min(max)])
        .filter(|p| !p.is_empty())
        .collect();
    if prompts.is_empty() {
        return Err(EngineError::Invalid(
            "no prompt to collect matmul input statistics from".into(),
        ));
    }
    let n_ctx = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
    let settings = opts.backend_settings(n_ctx, 1);
    let mut backend = flowrt_backends::open(opts.backend, model.model.clone(), &settings)?;
    let fail = |e: flowrt_dispatch::ProbeError| {
        EngineError::Invalid(format!("matmul input statistics: {e}"))
    };
    backend.collect_input_stats(Some(kind)).map_err(fail)?;
    let plan = model.plan.clone();
    let layers = model.model.config.num_hidden_layers;
    let rl = Runlist {
        index: 0,
        count: 1,
        groups: 0..plan.groups.len(),
        layers: (layers > 0).then(|| (0, layers - 1)),
        deadline: Duration::from_secs(3600),
    };
    run_prompts(
        backend.as_mut(),
        &plan,
        &rl,
        &prompts,
        None,
        false,
        LogitsWanted::Last,
    )?;
    Ok(backend.take_input_stats())
}

/// Runs `rl` over every prompt, chunk by chunk from position 0, writing each chunk's
/// residual stream from `input` first when given; returns every prompt's stream after the
/// runlist when `read` (positions × hidden).
fn run_prompts<P: AsRef<[u32]>>(
    backend: &mut dyn Backend,
    plan: &Plan,
    rl: &Runlist,
    prompts: &[P],
    input: Option<&[Vec<f32>]>,
    read: bool,
    logits: LogitsWanted,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let fail = |e: flowrt_dispatch::ProbeError| {
        EngineError::Invalid(format!("matmul input statistics: {e}"))
    };
    let max_batch = backend.max_batch().max(1);
    let mut out = Vec::new();
    for (pi, tokens) in prompts.iter().enumerate() {
        let tokens = tokens.as_ref();
        let mut stream = Vec::new();
        for (ci, chunk) in tokens.chunks(max_batch).enumerate() {
            let pos0 = ci * max_batch;
            if let Some(x) = input {
                let hidden = x[pi].len() / tokens.len().max(1);
                let x = &x[pi][pos0 * hidden..(pos0 + chunk.len()) * hidden];
                backend.write_activation(Buf::X, x).map_err(fail)?;
            }
            let spans = [SeqSpan {
                seq: 0,
                pos0,
                len: chunk.len(),
            }];
            let batch = Batch {
                tokens: chunk,
                spans: &spans,
                logits,
            };
            run(backend, plan, rl, &batch)?;
            if read {
                stream.extend(backend.read_activation(Buf::X, chunk.len()).map_err(fail)?);
            }
        }
        if read {
            out.push(stream);
        }
    }
    Ok(out)
}

fn run(
    backend: &mut dyn Backend,
    plan: &flowrt_model::Plan,
    rl: &Runlist,
    batch: &Batch,
) -> Result<(), EngineError> {
    let deadline = Instant::now() + rl.deadline;
    backend
        .submit(plan, rl, batch)
        .and_then(|()| backend.wait(plan, deadline, None))
        .map_err(|e| {
            EngineError::Invalid(format!(
                "collecting matmul input statistics failed at {}: {e}",
                rl.describe_layers()
            ))
        })
}

/// An error unless layer `target`'s `what` may still be asked for when layer `at`'s were last:
/// layers go in order.
fn in_order(what: &str, target: usize, at: usize) -> Result<(), EngineError> {
    if target < at {
        return Err(EngineError::Invalid(format!(
            "layer {target}'s {what} were asked for after layer {at}'s: layers must come in order"
        )));
    }
    Ok(())
}

/// Which block of a layer a matrix belongs to, and whether its input depends on another
/// matrix of the same block (the attention output on Q/K/V, the down projection on
/// gate/up, a convolution's output on its input projection).
fn stage_of(role: MatRole) -> (Stage, bool) {
    match role {
        MatRole::Q | MatRole::K | MatRole::V | MatRole::ConvIn => (Stage::Mixer, false),
        MatRole::O | MatRole::ConvOut => (Stage::Mixer, true),
        MatRole::Gate | MatRole::Up | MatRole::Router => (Stage::Ffn, false),
        MatRole::Down => (Stage::Ffn, true),
        MatRole::Output => (Stage::Output, false),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Attention, or a short convolution in its place.
    Mixer,
    Ffn,
    Output,
}

/// Statistics taken, and the versions of the matrices upstream of their input then.
struct Taken {
    stat: InputStat,
    key: (u64, u64),
}

/// Matmul input statistics taken layer by layer through the matrices already quantised:
/// GPTQ's sequential calibration, for `flowrt pack --gptq`.
///
/// The caller asks for a matrix's input statistics ([`LayerByLayer::stat`]), quantises the
/// matrix and hands the result back ([`LayerByLayer::replace`]), in the order the forward
/// pass reads the matrices. The residual stream of every calibration position is held
/// between layers (positions × hidden f32), so each layer runs only over its own blocks: the
/// attention block (or short convolution) with the layer's Q/K/V as they are when their
/// statistics are asked for, again for the output projection once Q/K/V are replaced, and the
/// same for the feed-forward block's gate/up and down; once a layer's matrices are all
/// replaced, the stream is carried through them to the next layer. Each run opens a backend
/// on the source model with the current layer's replacements (the layers already passed need
/// no weights: their output is held), so only one layer's second moments exist at a time.
pub struct LayerByLayer {
    source: Arc<Model>,
    working: Model,
    plan: Arc<Plan>,
    backend: BackendKind,
    settings: BackendSettings,
    kind: InputStatKind,
    prompts: Vec<Vec<u32>>,
    /// Every prompt's residual stream before `layer` (`None` until the embedding has run).
    x: Option<Vec<Vec<f32>>>,
    /// The layer `x` enters (the layer count once past the last).
    layer: usize,
    /// `layer`'s stream after its attention block, and the mixer version it was taken at.
    mid: Option<(u64, Vec<Vec<f32>>)>,
    /// Bumped when a matrix of `layer` is replaced: any of the mixer's, the mixer's first
    /// (Q/K/V, convolution input), the feed-forward block's first (gate/up).
    mixer_any: u64,
    mixer_first: u64,
    ffn_first: u64,
    taken: Vec<Taken>,
    /// The source's own path, with [`InputStatKind::Inputs`].
    reference: Option<Reference>,
}

/// The source's own forward pass over the calibration positions, a layer at a time beside
/// the working one: the inputs its matrices multiply there, for asymmetric targets.
struct Reference {
    /// The layer `x` enters (the layer count once past the last).
    layer: usize,
    x: Vec<Vec<f32>>,
    /// `layer`'s stream after its attention block, and after the whole layer.
    mid: Option<Vec<Vec<f32>>>,
    next: Option<Vec<Vec<f32>>>,
    /// The statistics (with the input rows) of `layer`'s matrices taken so far.
    taken: Vec<InputStat>,
}

impl LayerByLayer {
    /// Prepares to calibrate `model` over `prompts` (each from position 0, cut to the model's
    /// context). Nothing runs until the first [`LayerByLayer::stat`].
    pub fn new(
        model: &LoadedModel,
        prompts: &[Vec<u32>],
        opts: &EngineOptions,
        kind: InputStatKind,
    ) -> Result<Self, EngineError> {
        let max = model.model_ctx().max(1);
        let prompts: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| p[..p.len().min(max)].to_vec())
            .filter(|p| !p.is_empty())
            .collect();
        if prompts.is_empty() {
            return Err(EngineError::Invalid(
                "no prompt to collect matmul input statistics from".into(),
            ));
        }
        let n_ctx = prompts.iter().map(Vec::len).max().unwrap_or(1);
        Ok(LayerByLayer {
            source: model.model.clone(),
            working: (*model.model).clone(),
            plan: model.plan.clone(),
            backend: opts.backend,
            settings: opts.backend_settings(n_ctx, 1),
            kind,
            prompts,
            x: None,
            layer: 0,
            mid: None,
            mixer_any: 0,
            mixer_first: 0,
            ffn_first: 0,
            taken: Vec::new(),
            reference: None,
        })
    }

    /// The calibration positions (every prompt's tokens).
    pub fn tokens(&self) -> u64 {
        self.prompts.iter().map(|p| p.len() as u64).sum()
    }

    /// The statistics of the input of `role`'s matrix in `layer` (`None`: the output
    /// projection), taken through every matrix replaced so far; `None` when no matmul of the
    /// model reads it. Layers must be asked for in order.
    pub fn stat(
        &mut self,
        layer: Option<usize>,
        role: MatRole,
    ) -> Result<Option<&InputStat>, EngineError> {
        let Some((stage, target)) = self.target(layer, role) else {
            return Ok(None);
        };
        self.advance_to(target)?;
        let key = self.key(role);
        let found = |t: &Taken| t.stat.layer == layer && t.stat.role == role && t.key == key;
        if !self.taken.iter().any(found) {
            let (groups, input) = match stage {
                Stage::Mixer => (self.groups(GroupKind::Attention { layer: target }), false),
                Stage::Ffn => {
                    self.ensure_mid()?;
                    (self.groups(GroupKind::Ffn { layer: target }), true)
                }
                Stage::Output => (self.groups(GroupKind::Output), false),
            };
            let Some(groups) = groups else {
                return Ok(None);
            };
            let src = match (input, &self.mid) {
                (true, Some((_, mid))) => mid,
                _ => self.x.as_ref().expect("embedded by advance_to"),
            };
            let (_, stats) = self.run(false, groups, layer, Some(src), true, false)?;
            for stat in stats {
                if stat.layer != layer || stage_of(stat.role).0 != stage {
                    continue;
                }
                let key = self.key(stat.role);
                self.taken
                    .retain(|t| !(t.stat.layer == stat.layer && t.stat.role == stat.role));
                self.taken.push(Taken { stat, key });
            }
        }
        Ok(self.taken.iter().find(|t| found(t)).map(|t| &t.stat))
    }

    /// Replaces the matrix playing `role` in `layer` (`None`: the output projection) with
    /// `rows` of `dtype` (its quantised form, in the model's own row order), for the
    /// statistics asked for after.
    pub fn replace(
        &mut self,
        layer: Option<usize>,
        role: MatRole,
        dtype: GgmlType,
        rows: Vec<u8>,
    ) -> Result<(), EngineError> {
        let (stage, second) = stage_of(role);
        let Some(l) = layer.filter(|_| stage != Stage::Output) else {
            // Nothing reads the logits' input after the output projection.
            return Ok(());
        };
        self.advance_to(l)?;
        let Some(cur) = self.working.matrix_mut(layer, role) else {
            return Err(EngineError::Invalid(format!(
                "layer {l} has no {role:?} matrix to replace"
            )));
        };
        *cur = replacement(cur, dtype, rows)?;
        match (stage, second) {
            (Stage::Mixer, false) => {
                self.mixer_first += 1;
                self.mixer_any += 1;
            }
            (Stage::Mixer, true) => self.mixer_any += 1,
            (Stage::Ffn, false) => self.ffn_first += 1,
            _ => {}
        }
        Ok(())
    }

    /// Replaces the token embedding (and the output projection when tied) with `rows` of
    /// `dtype`, before anything has run.
    pub fn replace_embedding(&mut self, dtype: GgmlType, rows: Vec<u8>) -> Result<(), EngineError> {
        if self.x.is_some() {
            return Err(EngineError::Invalid(
                "the token embedding must be replaced before any statistics are taken".into(),
            ));
        }
        let m = replacement(&self.working.token_embd, dtype, rows)?;
        if self.working.tied_embeddings {
            if let Some(out) = self.working.output.as_mut() {
                *out = m.clone();
            }
        }
        self.working.token_embd = m;
        Ok(())
    }

    /// The rows the source itself multiplies `role`'s matrix in `layer` by (`None`: the
    /// output projection) at the calibration positions, in the order of the rows of
    /// [`InputStat::inputs`] that [`LayerByLayer::stat`] gives; `None` when no matmul reads
    /// that input. Only with [`InputStatKind::Inputs`]; layers must be asked for in order.
    pub fn reference(
        &mut self,
        layer: Option<usize>,
        role: MatRole,
    ) -> Result<Option<Arc<Vec<f32>>>, EngineError> {
        if self.kind != InputStatKind::Inputs {
            return Err(EngineError::Invalid(
                "the source's matrix inputs are kept only when the input rows are asked for".into(),
            ));
        }
        let Some((stage, target)) = self.target(layer, role) else {
            return Ok(None);
        };
        let mut r = match self.reference.take() {
            Some(r) => r,
            None => {
                let groups = self.groups(GroupKind::Embed).ok_or_else(|| {
                    EngineError::Invalid("the model's plan has no embedding".into())
                })?;
                let (x, _) = self.run(true, groups, None, None, false, true)?;
                Reference {
                    layer: 0,
                    x,
                    mid: None,
                    next: None,
                    taken: Vec::new(),
                }
            }
        };
        let result = self.reference_step(&mut r, target, stage);
        self.reference = Some(r);
        result?;
        let r = self.reference.as_ref().expect("just set");
        Ok(r.taken
            .iter()
            .find(|s| s.layer == layer && s.role == role)
            .and_then(|s| s.inputs.clone()))
    }

    /// Carries `r` to `target` and takes the source's inputs of `stage` there.
    fn reference_step(
        &self,
        r: &mut Reference,
        target: usize,
        stage: Stage,
    ) -> Result<(), EngineError> {
        in_order("source inputs", target, r.layer)?;
        while r.layer < target {
            self.reference_layer(r, Stage::Ffn)?;
            r.x = r.next.take().expect("set by reference_layer");
            r.mid = None;
            r.taken.clear();
            r.layer += 1;
        }
        if stage != Stage::Output {
            self.reference_layer(r, stage)?;
        } else if !r.taken.iter().any(|s| s.layer.is_none()) {
            if let Some(g) = self.groups(GroupKind::Output) {
                self.reference_block(r, g, None, false)?;
            }
        }
        Ok(())
    }

    /// Runs `r`'s layer on the source up to `stage` (its attention block, and for
    /// [`Stage::Ffn`] its feed-forward block too), unless already run, keeping the inputs.
    fn reference_layer(&self, r: &mut Reference, stage: Stage) -> Result<(), EngineError> {
        let l = r.layer;
        if r.mid.is_none() {
            let mid = match self.groups(GroupKind::Attention { layer: l }) {
                Some(g) => self.reference_block(r, g, Some(l), true)?,
                None => r.x.clone(),
            };
            r.mid = Some(mid);
        }
        if stage == Stage::Ffn && r.next.is_none() {
            let next = match self.groups(GroupKind::Ffn { layer: l }) {
                Some(g) => self.reference_block(r, g, Some(l), true)?,
                None => r.mid.clone().expect("set above"),
            };
            r.next = Some(next);
        }
        Ok(())
    }

    /// Runs `groups` on the source over `r`'s stream after its attention block when it has
    /// one (else before it), keeping the statistics; the stream after them when `read`.
    fn reference_block(
        &self,
        r: &mut Reference,
        groups: std::ops::Range<usize>,
        layer: Option<usize>,
        read: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let input = r.mid.as_ref().unwrap_or(&r.x);
        let (out, stats) = self.run(true, groups, layer, Some(input), true, read)?;
        r.taken.extend(stats);
        Ok(out)
    }

    /// The block `role`'s matrix in `layer` belongs to, and the layer its input enters (the
    /// layer count for the output projection); `None` for a layer the model lacks.
    fn target(&self, layer: Option<usize>, role: MatRole) -> Option<(Stage, usize)> {
        let (stage, _) = stage_of(role);
        let layers = self.source.config.num_hidden_layers;
        match (stage, layer) {
            (Stage::Output, _) => Some((stage, layers)),
            (_, Some(l)) if l < layers => Some((stage, l)),
            _ => None,
        }
    }

    /// What a statistic of `role` depends on, as the versions of the matrices upstream of
    /// its input in the current layer.
    fn key(&self, role: MatRole) -> (u64, u64) {
        match stage_of(role) {
            (Stage::Mixer, false) | (Stage::Output, _) => (0, 0),
            (Stage::Mixer, true) => (0, self.mixer_first),
            (Stage::Ffn, false) => (self.mixer_any, 0),
            (Stage::Ffn, true) => (self.mixer_any, self.ffn_first),
        }
    }

    /// The plan's groups of `kind` (one range).
    fn groups(&self, kind: GroupKind) -> Option<std::ops::Range<usize>> {
        let groups = &self.plan.groups;
        let first = groups.iter().position(|g| g.kind == kind)?;
        let last = groups.iter().rposition(|g| g.kind == kind)?;
        Some(first..last + 1)
    }

    /// Embeds the prompts if not yet done, then carries the stream through the current
    /// layers (as replaced) until it enters `target`.
    fn advance_to(&mut self, target: usize) -> Result<(), EngineError> {
        if self.x.is_none() {
            let groups = self
                .groups(GroupKind::Embed)
                .ok_or_else(|| EngineError::Invalid("the model's plan has no embedding".into()))?;
            let (x, _) = self.run(false, groups, None, None, false, true)?;
            self.x = Some(x);
        }
        in_order("matrix inputs", target, self.layer)?;
        while self.layer < target {
            let l = self.layer;
            let mid = self.take_mid()?;
            let next = match self.groups(GroupKind::Ffn { layer: l }) {
                Some(g) => self.run(false, g, Some(l), Some(&mid), false, true)?.0,
                None => mid,
            };
            self.x = Some(next);
            // The layer passed needs no weights again: give back its replacements, and let
            // the source's file pages behind its matrices leave the resident set.
            self.working.layers[l] = self.source.layers[l].clone();
            for role in MatRole::IN_LAYER {
                if let Some(m) = self.source.matrix(Some(l), role) {
                    m.data.release_range(0, m.rows * m.row_bytes);
                }
            }
            self.layer += 1;
            self.mixer_any = 0;
            self.mixer_first = 0;
            self.ffn_first = 0;
            self.taken.clear();
        }
        Ok(())
    }

    /// The current layer's stream after its attention block as it now stands, taken out.
    fn take_mid(&mut self) -> Result<Vec<Vec<f32>>, EngineError> {
        self.ensure_mid()?;
        match self.mid.take() {
            Some((_, mid)) => Ok(mid),
            None => Err(EngineError::Invalid(
                "layer-by-layer calibration lost the attention block's output".into(),
            )),
        }
    }

    /// Sets `mid`: the current layer's stream after its attention block as it now stands.
    fn ensure_mid(&mut self) -> Result<(), EngineError> {
        if matches!(&self.mid, Some((v, _)) if *v == self.mixer_any) {
            return Ok(());
        }
        let l = self.layer;
        let x = self.x.take().expect("embedded before a layer runs");
        let mid = match self.groups(GroupKind::Attention { layer: l }) {
            Some(g) => self
                .run(false, g, Some(l), Some(&x), false, true)
                .map(|r| r.0),
            None => Ok(x.clone()),
        };
        self.x = Some(x);
        self.mid = Some((self.mixer_any, mid?));
        Ok(())
    }

    /// Runs `groups` of the working model over every prompt, the residual stream written
    /// from `input` first (when given); returns the stream after them (when `read`) and the
    /// statistics (when `stats`).
    fn run(
        &self,
        source: bool,
        groups: std::ops::Range<usize>,
        layer: Option<usize>,
        input: Option<&[Vec<f32>]>,
        stats: bool,
        read: bool,
    ) -> Result<(Vec<Vec<f32>>, Vec<InputStat>), EngineError> {
        let model = if source {
            self.source.clone()
        } else {
            Arc::new(self.working.clone())
        };
        let mut backend = flowrt_backends::open(self.backend, model, &self.settings)?;
        if stats {
            backend
                .collect_input_stats(Some(self.kind))
                .map_err(|e| EngineError::Invalid(format!("layer-by-layer calibration: {e}")))?;
        }
        let output = groups.end == self.plan.groups.len();
        let rl = Runlist {
            index: 0,
            count: 1,
            groups,
            layers: layer.map(|l| (l, l)),
            deadline: Duration::from_secs(3600),
        };
        // The output projection's statistics over every position.
        let logits = if output {
            LogitsWanted::All
        } else {
            LogitsWanted::Last
        };
        let out = run_prompts(
            backend.as_mut(),
            &self.plan,
            &rl,
            &self.prompts,
            input,
            read,
            logits,
        )?;
        let stats = if stats {
            backend.take_input_stats()
        } else {
            Vec::new()
        };
        Ok((out, stats))
    }
}

/// `cur` with its bytes replaced by `rows` of `dtype`, checked against its shape.
fn replacement(
    cur: &WeightMatrix,
    dtype: GgmlType,
    rows: Vec<u8>,
) -> Result<WeightMatrix, EngineError> {
    let row_bytes = flowrt_kernels::row_size(dtype, cur.cols);
    if !cur.cols.is_multiple_of(dtype.block_size() as usize) || rows.len() != cur.rows * row_bytes {
        return Err(EngineError::Invalid(format!(
            "replacement for `{}` ({} x {}): {} bytes of {dtype}, where {} are needed",
            cur.name,
            cur.rows,
            cur.cols,
            rows.len(),
            cur.rows * row_bytes
        )));
    }
    Ok(WeightMatrix {
        name: cur.name.clone(),
        dtype,
        rows: cur.rows,
        cols: cur.cols,
        row_bytes,
        data: WeightData::Owned(Arc::new(rows)),
    })
}
