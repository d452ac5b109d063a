//! Matmul input statistics for importance-weighted quantisation.
//!
//! [`input_stats`] runs a model over prompts (the source of a pack, at f32) with its backend
//! collecting, for every dense matmul, the sum of squares of each input column
//! ([`flowrt_dispatch::Backend::collect_input_stats`]). A weight that multiplies a column
//! whose activations are large moves the output more when it is rounded, so `flowrt pack`
//! weighs each value's rounding error by its column's mean square (the idea behind
//! llama.cpp's importance matrices). Sessions and the dispatcher are not involved: the
//! backend is driven directly, the whole plan one runlist per chunk of a prompt.

use std::time::{Duration, Instant};

use flowrt_dispatch::{Backend, Batch, InputStat, InputStatKind, LogitsWanted, Runlist, SeqSpan};

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
    let max_batch = backend.max_batch().max(1);
    for tokens in prompts {
        for (ci, chunk) in tokens.chunks(max_batch).enumerate() {
            let spans = [SeqSpan {
                seq: 0,
                pos0: ci * max_batch,
                len: chunk.len(),
            }];
            let batch = Batch {
                tokens: chunk,
                spans: &spans,
                logits: LogitsWanted::Last,
            };
            run(backend.as_mut(), &plan, &rl, &batch)?;
        }
    }
    Ok(backend.take_input_stats())
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
