//! `flowrt plan`: the forward pass as the dispatcher will submit it.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use flowrt_dispatch::{Batch, LogitsWanted, SeqSpan};
use flowrt_engine::Session;
use flowrt_model::plan::GroupKind;

use crate::common::{load_model, EngineArgs};

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A .gguf file, a Hugging Face checkpoint directory, or a catalog tag.
    pub model: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

const MIB: f64 = 1024.0 * 1024.0;

pub fn plan(args: PlanArgs) -> Result<ExitCode> {
    let (model, opts) = load_model(&args.model, &args.engine)?;
    let session = Session::new(&model, &opts)?;
    let d = session.dispatcher();
    let costs = d.costs();
    let plan = &model.plan;
    let c = &model.model.config;
    // Deadlines are shown for a decode step at the start of the context and for a full prefill
    // batch; the dispatcher derives them per step from the positions actually attended.
    let decode_tokens = [0u32];
    let prefill_tokens = vec![0u32; opts.max_batch.min(session.n_ctx())];
    let one = [SeqSpan {
        seq: 0,
        pos0: 0,
        len: 1,
    }];
    let full = [SeqSpan {
        seq: 0,
        pos0: 0,
        len: prefill_tokens.len(),
    }];
    let decode = d.runlists(&Batch {
        tokens: &decode_tokens,
        spans: &one,
        logits: LogitsWanted::Last,
    });
    let prefill = d.runlists(&Batch {
        tokens: &prefill_tokens,
        spans: &full,
        logits: LogitsWanted::Last,
    });
    let info = session.backend_info();
    if args.json {
        let groups: Vec<_> = plan
            .groups
            .iter()
            .zip(costs)
            .enumerate()
            .map(|(i, (g, cost))| {
                serde_json::json!({
                    "index": i,
                    "kind": kind_label(g.kind),
                    "layer": g.kind.layer(),
                    "ops": g.ops.iter().map(|o| o.name()).collect::<Vec<_>>(),
                    "weight_bytes": cost.weight_bytes,
                    "matmul_flops_per_token": cost.matmul_flops,
                    "attention_flops_per_token_per_position": cost.attention_flops_per_pos,
                })
            })
            .collect();
        let runlists: Vec<_> = decode
            .iter()
            .zip(&prefill)
            .map(|(rd, rp)| {
                serde_json::json!({
                    "index": rd.index,
                    "groups": [rd.groups.start, rd.groups.end],
                    "layers": rd.layers,
                    "weight_bytes": costs[rd.groups.clone()].iter().map(|c| c.weight_bytes).sum::<u64>(),
                    "deadline_ms_decode": rd.deadline.as_secs_f64() * 1e3,
                    "deadline_ms_prefill": rp.deadline.as_secs_f64() * 1e3,
                })
            })
            .collect();
        let v = serde_json::json!({
            "model": model.path.display().to_string(),
            "architecture": c.arch.name,
            "layers": c.num_hidden_layers,
            "backend": info.name,
            "kernels": info.kernels,
            "max_runlist_layers": d.depth(),
            "prefill_batch": prefill_tokens.len(),
            "groups": groups,
            "runlists": runlists,
        });
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "model:    {} ({}, {} layers, {}:{} heads, head_dim {})",
        model.path.display(),
        c.arch.name,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim
    )?;
    writeln!(
        out,
        "backend:  {} ({} kernels, {} threads)",
        info.name, info.kernels, info.threads
    )?;
    writeln!(
        out,
        "dispatch: {} runlist(s) per step, {}",
        d.runlist_count(),
        d.depth()
            .map_or("the whole model in one".to_string(), |n| format!(
                "at most {n} layers each"
            ))
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>5}  {:<18} {:>10} {:>12}  ops",
        "group", "kind", "weight MiB", "MFLOP/token"
    )?;
    for (i, (g, cost)) in plan.groups.iter().zip(costs).enumerate() {
        let ops: Vec<&str> = g.ops.iter().map(|o| o.name()).collect();
        writeln!(
            out,
            "{i:>5}  {:<18} {:>10.2} {:>12.2}  {}",
            kind_label(g.kind),
            cost.weight_bytes as f64 / MIB,
            cost.matmul_flops as f64 / 1e6,
            ops.join(" ")
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:>7}  {:>9}  {:<14} {:>10} {:>16} {:>19}",
        "runlist",
        "groups",
        "layers",
        "weight MiB",
        "deadline decode",
        format!("deadline prefill-{}", prefill_tokens.len())
    )?;
    for (rd, rp) in decode.iter().zip(&prefill) {
        let bytes: u64 = costs[rd.groups.clone()]
            .iter()
            .map(|c| c.weight_bytes)
            .sum();
        writeln!(
            out,
            "{:>7}  {:>9}  {:<14} {:>10.2} {:>13} ms {:>16} ms",
            rd.index,
            format!("{}..{}", rd.groups.start, rd.groups.end),
            rd.describe_layers(),
            bytes as f64 / MIB,
            rd.deadline.as_millis(),
            rp.deadline.as_millis()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn kind_label(k: GroupKind) -> String {
    match k {
        GroupKind::Embed => "embed".into(),
        GroupKind::Attention { layer } => format!("attention {layer}"),
        GroupKind::Ffn { layer } => format!("ffn {layer}"),
        GroupKind::Output => "output".into(),
    }
}
