//! `flowrt bench`: measured prefill and decode speed on a model file.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use flowrt_engine::{BatchSession, BenchOptions, Session};
use flowrt_kernels::Kernels;

use crate::common::{load_model, EngineArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// A .gguf file or a catalog tag.
    pub model: String,
    /// Prompt tokens to prefill.
    #[arg(short = 'p', long = "n-prompt", default_value_t = 128)]
    pub n_prompt: usize,
    /// Tokens to decode.
    #[arg(short = 'n', long = "n-gen", default_value_t = 64)]
    pub n_gen: usize,
    /// Measured repetitions (after a warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Decode this many sequences together, one batched step over the weights per token of
    /// every sequence, and report the aggregate decode rate (continuous batching).
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub fn bench(args: BenchArgs) -> Result<ExitCode> {
    anyhow::ensure!(args.n_prompt >= 1, "-p must be at least 1");
    anyhow::ensure!(args.repetitions >= 1, "-r must be at least 1");
    let (model, mut opts) = load_model(&args.model, &args.engine)?;
    if opts.n_ctx.is_none() {
        // The benchmark needs only its own tokens; a small cache keeps memory honest.
        opts.n_ctx = Some((args.n_prompt + args.n_gen + 8).min(model.model_ctx()));
    }
    anyhow::ensure!(args.parallel >= 1, "--parallel must be at least 1");
    if args.parallel > 1 {
        return bench_parallel(&args, &model, &opts);
    }
    let mut session = Session::new(&model, &opts)?;
    let (sha, size) = crate::common::model_fingerprint(&model.path)?;
    let r = flowrt_engine::bench(
        &mut session,
        &BenchOptions {
            n_prompt: args.n_prompt,
            n_gen: args.n_gen,
            repetitions: args.repetitions,
        },
    );
    args.engine.write_trace(&session)?;
    let r = r?;
    let d = session.dispatcher();
    let (runlists, depth) = (d.runlist_count(), d.depth());
    let features = Kernels::cpu_features();
    if args.json {
        let v = serde_json::json!({
            "model": model.path.display().to_string(),
            "model_sha256": sha,
            "model_size_bytes": size,
            "load_ms": model.load_time.as_secs_f64() * 1e3,
            "n_prompt": r.n_prompt,
            "n_gen": r.n_gen,
            "repetitions": r.repetitions,
            "prefill_tok_s": r.prefill_tok_s.median,
            "prefill_tok_s_min": r.prefill_tok_s.min,
            "prefill_tok_s_max": r.prefill_tok_s.max,
            "ttft_ms": r.ttft_ms.median,
            "ttft_ms_min": r.ttft_ms.min,
            "ttft_ms_max": r.ttft_ms.max,
            "decode_tok_s": r.decode_tok_s.median,
            "decode_tok_s_min": r.decode_tok_s.min,
            "decode_tok_s_max": r.decode_tok_s.max,
            "threads": r.threads,
            "kernels": r.kernels,
            "cpu_features": features,
            "kv_type": format!("{:?}", opts.kv_type).to_lowercase(),
            "quant_on_load": args.engine.quant.map(|q| q.name()),
            "runlists_per_step": runlists,
            "max_runlist_layers": depth,
        });
        println!("{v}");
    } else {
        println!("model:    {} ({} bytes)", model.path.display(), size);
        println!("sha256:   {sha}");
        println!(
            "threads:  {}   kernels: {}   cpu: {}",
            r.threads,
            r.kernels,
            features.join(" ")
        );
        println!(
            "dispatch: {runlists} runlist(s) per step ({})",
            depth.map_or("whole model".to_string(), |d| format!(
                "at most {d} layers each"
            ))
        );
        println!(
            "runs:     {} measured after 1 warm-up; median [min, max]",
            r.repetitions
        );
        let s = |x: flowrt_engine::Stat| format!("{:>9.2} [{:.2}, {:.2}]", x.median, x.min, x.max);
        println!("prefill-{:<4} tok/s {}", r.n_prompt, s(r.prefill_tok_s));
        println!("ttft         ms    {}", s(r.ttft_ms));
        println!("decode-{:<5} tok/s {}", r.n_gen, s(r.decode_tok_s));
    }
    Ok(ExitCode::SUCCESS)
}

fn bench_parallel(
    args: &BenchArgs,
    model: &flowrt_engine::LoadedModel,
    opts: &flowrt_engine::EngineOptions,
) -> Result<ExitCode> {
    let mut session = BatchSession::new(model, opts, args.parallel)?;
    let (sha, size) = crate::common::model_fingerprint(&model.path)?;
    let r = flowrt_engine::bench_parallel(
        &mut session,
        &BenchOptions {
            n_prompt: args.n_prompt,
            n_gen: args.n_gen,
            repetitions: args.repetitions,
        },
    );
    args.engine.write_trace_of(session.trace())?;
    let r = r?;
    if args.json {
        let v = serde_json::json!({
            "model": model.path.display().to_string(),
            "model_sha256": sha,
            "model_size_bytes": size,
            "sequences": r.sequences,
            "n_prompt": r.n_prompt,
            "n_gen": r.n_gen,
            "repetitions": r.repetitions,
            "aggregate_decode_tok_s": r.aggregate_decode_tok_s.median,
            "aggregate_decode_tok_s_min": r.aggregate_decode_tok_s.min,
            "aggregate_decode_tok_s_max": r.aggregate_decode_tok_s.max,
            "threads": r.threads,
            "kernels": r.kernels,
        });
        println!("{v}");
    } else {
        println!("model:    {} ({} bytes)", model.path.display(), size);
        println!("sha256:   {sha}");
        println!("threads:  {}   kernels: {}", r.threads, r.kernels);
        println!(
            "runs:     {} measured after 1 warm-up; median [min, max]",
            r.repetitions
        );
        let s = r.aggregate_decode_tok_s;
        println!(
            "decode-{} x {} sequences: {:.2} [{:.2}, {:.2}] tok/s in all",
            r.n_gen, r.sequences, s.median, s.min, s.max
        );
    }
    Ok(ExitCode::SUCCESS)
}
