//! `flowrt bench`: measured prefill and decode speed on a model file.

use std::process::ExitCode;

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use flowrt_engine::{
    BackendReport, BandwidthOptions, BandwidthReport, BatchStepper, BenchOptions, LoadedModel,
    ProcMemory, Roofline, Session,
};

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
    /// Skip measuring memory read bandwidth (about a second, with a 512 MiB buffer) and so the
    /// decode roofline.
    #[arg(long)]
    pub no_bandwidth: bool,
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
    let rss_after_load = ProcMemory::now().rss_bytes;
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
    let res = Resources::measure(
        &args,
        &model,
        ResourceInputs {
            setup_time: session.setup_time(),
            kv_cache_bytes: session.kv_cache_bytes(),
            rss_after_load,
            threads: r.threads,
            steps_per_s: r.decode_tok_s.median,
        },
    );
    let d = session.dispatcher();
    let (runlists, depth) = (d.runlist_count(), d.depth());
    let features = flowrt_backends::cpu_device().features;
    if args.json {
        let mut v = serde_json::json!({
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
            "kv_type": opts.kv.to_string(),
            "quant_on_load": args.engine.quant.map(|q| q.name()),
            "runlists_per_step": runlists,
            "max_runlist_layers": depth,
        });
        add_device_json(&r.backend, &mut v);
        res.add_json(&mut v);
        println!("{v}");
    } else {
        println!("model:    {} ({} bytes)", model.path.display(), size);
        println!("sha256:   {sha}");
        print_device(&r.backend);
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
        res.print();
    }
    Ok(ExitCode::SUCCESS)
}

fn bench_parallel(
    args: &BenchArgs,
    model: &flowrt_engine::LoadedModel,
    opts: &flowrt_engine::EngineOptions,
) -> Result<ExitCode> {
    let mut stepper = BatchStepper::new(model, opts, args.parallel)?;
    let rss_after_load = ProcMemory::now().rss_bytes;
    let (sha, size) = crate::common::model_fingerprint(&model.path)?;
    let r = flowrt_engine::bench_parallel(
        &mut stepper,
        &BenchOptions {
            n_prompt: args.n_prompt,
            n_gen: args.n_gen,
            repetitions: args.repetitions,
        },
    );
    let session = stepper.session();
    args.engine.write_trace_of(session.trace())?;
    let r = r?;
    let res = Resources::measure(
        args,
        model,
        ResourceInputs {
            setup_time: session.setup_time(),
            kv_cache_bytes: session.kv_cache_bytes(),
            rss_after_load,
            threads: r.threads,
            // Each step reads the weights once.
            steps_per_s: r.aggregate_decode_tok_s.median * r.decode_steps as f64
                / r.decoded_tokens.max(1) as f64,
        },
    );
    if args.json {
        let mut v = serde_json::json!({
            "load_ms": model.load_time.as_secs_f64() * 1e3,
            "model": model.path.display().to_string(),
            "model_sha256": sha,
            "model_size_bytes": size,
            "sequences": r.sequences,
            "n_prompt": r.n_prompt,
            "n_gen": r.n_gen,
            "repetitions": r.repetitions,
            "aggregate_prefill_tok_s": r.aggregate_prefill_tok_s.median,
            "aggregate_decode_tok_s": r.aggregate_decode_tok_s.median,
            "aggregate_decode_tok_s_min": r.aggregate_decode_tok_s.min,
            "aggregate_decode_tok_s_max": r.aggregate_decode_tok_s.max,
            "decode_steps": r.decode_steps,
            "decoded_tokens": r.decoded_tokens,
            "threads": r.threads,
            "kernels": r.kernels,
        });
        add_device_json(&r.backend, &mut v);
        res.add_json(&mut v);
        println!("{v}");
    } else {
        println!("model:    {} ({} bytes)", model.path.display(), size);
        println!("sha256:   {sha}");
        print_device(&r.backend);
        println!("threads:  {}   kernels: {}", r.threads, r.kernels);
        println!(
            "runs:     {} measured after 1 warm-up; median [min, max]",
            r.repetitions
        );
        let p = r.aggregate_prefill_tok_s;
        println!(
            "prefill-{} x {} sequences: {:.2} [{:.2}, {:.2}] tok/s in all",
            r.n_prompt, r.sequences, p.median, p.min, p.max
        );
        let s = r.aggregate_decode_tok_s;
        println!(
            "decode-{} x {} sequences: {:.2} [{:.2}, {:.2}] tok/s in all",
            r.n_gen, r.sequences, s.median, s.min, s.max
        );
        res.print();
    }
    Ok(ExitCode::SUCCESS)
}

/// The device the bench ran on, as its backend reports it: backend name, device name, driver
/// and device memory (`null` when the backend does not say, as for the CPU's shared host
/// memory), and the weight bytes it prepared beside the file's.
fn add_device_json(b: &BackendReport, v: &mut serde_json::Value) {
    if let Some(v) = v.as_object_mut() {
        v.insert("backend".into(), b.name.clone().into());
        v.insert("matmul_decode".into(), b.matmul_decode.clone().into());
        v.insert("matmul_prefill".into(), b.matmul_prefill.clone().into());
        v.insert("device".into(), b.device.clone().into());
        v.insert("driver".into(), b.driver.clone().into());
        v.insert("device_memory_bytes".into(), b.memory_bytes.into());
        v.insert(
            "prepared_weight_bytes".into(),
            b.prepared_weight_bytes.into(),
        );
    }
}

fn print_device(b: &BackendReport) {
    let mut extra = Vec::new();
    if let Some(d) = &b.driver {
        extra.push(format!("driver {d}"));
    }
    if let Some(m) = b.memory_bytes {
        extra.push(format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64));
    }
    if b.prepared_weight_bytes > 0 {
        extra.push(format!(
            "{:.1} MiB of prepared weights",
            b.prepared_weight_bytes as f64 / (1 << 20) as f64
        ));
    }
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(" ({})", extra.join(", "))
    };
    println!("backend:  {} on {}{extra}", b.name, b.device);
    println!(
        "matmul:   decode {}, prefill {}",
        b.matmul_decode, b.matmul_prefill
    );
}

/// What [`Resources::measure`] needs from the session and the run.
struct ResourceInputs {
    setup_time: Duration,
    kv_cache_bytes: u64,
    rss_after_load: Option<u64>,
    threads: usize,
    /// Decode steps per second (each reads the weights once).
    steps_per_s: f64,
}

/// Load time, memory and the decode roofline of a bench run.
struct Resources {
    /// Model load (file open, tensors bound, tokenizer).
    load: Duration,
    /// Session setup: backend (with any weight preparation it does) and dispatcher.
    setup: Duration,
    rss_after_load: Option<u64>,
    peak_rss: Option<u64>,
    /// Resident memory at the end of the run, before the bandwidth probe.
    end: ProcMemory,
    weights: u64,
    kv_cache: Option<u64>,
    bandwidth: Option<BandwidthReport>,
    roofline: Option<Roofline>,
}

impl Resources {
    /// Read the peak RSS first, then (unless `--no-bandwidth`) run the bandwidth probe,
    /// whose buffer must not count in the peak.
    fn measure(args: &BenchArgs, model: &LoadedModel, i: ResourceInputs) -> Resources {
        let end = ProcMemory::now();
        let bandwidth = (!args.no_bandwidth).then(|| {
            flowrt_engine::measure_read_bandwidth(&BandwidthOptions::for_threads(i.threads))
        });
        let roofline = bandwidth
            .filter(|_| i.steps_per_s.is_finite() && i.steps_per_s > 0.0)
            .map(|b| Roofline::new(&model.model, i.steps_per_s, b.read_gb_s));
        Resources {
            load: model.load_time,
            setup: i.setup_time,
            rss_after_load: i.rss_after_load,
            peak_rss: end.peak_rss_bytes,
            end,
            weights: flowrt_engine::weight_bytes(&model.model),
            kv_cache: Some(i.kv_cache_bytes),
            bandwidth,
            roofline,
        }
    }

    /// Peak RSS over weights plus KV cache (1.10 or less is the target).
    fn peak_ratio(&self) -> Option<f64> {
        let reserved = self.weights + self.kv_cache?;
        Some(self.peak_rss? as f64 / reserved as f64)
    }

    /// New fields of the JSON report (`null` where not available).
    fn add_json(&self, v: &mut serde_json::Value) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let fields = serde_json::json!({
            "session_setup_ms": ms(self.setup),
            "load_to_ready_ms": ms(self.load + self.setup),
            "rss_after_load_bytes": self.rss_after_load,
            "peak_rss_bytes": self.peak_rss,
            "end_rss_anon_bytes": self.end.rss_anon_bytes,
            "end_rss_file_bytes": self.end.rss_file_bytes,
            "weights_bytes": self.weights,
            "kv_cache_bytes": self.kv_cache,
            "peak_rss_over_weights_kv": self.peak_ratio(),
            "read_bandwidth_gb_s": self.bandwidth.map(|b| b.read_gb_s),
            "bandwidth_buffer_bytes": self.bandwidth.map(|b| b.buffer_bytes),
            "weight_bytes_per_token": self.roofline.map(|r| r.weight_bytes_per_step),
            "decode_weight_gb_s": self.roofline.map(|r| r.achieved_gb_s),
            "decode_roofline_pct": self.roofline.map(|r| r.percent),
        });
        if let (Some(v), serde_json::Value::Object(f)) = (v.as_object_mut(), fields) {
            v.extend(f);
        }
    }

    fn print(&self) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "load:     {:.1} ms to ready (model {:.1} ms + session {:.1} ms)",
            ms(self.load + self.setup),
            ms(self.load),
            ms(self.setup)
        );
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
        let opt = |b: Option<u64>| b.map_or("not available".to_string(), mib);
        println!(
            "memory:   rss after load {}, peak rss {} (at the end: {} anonymous, {} file-backed)",
            opt(self.rss_after_load),
            opt(self.peak_rss),
            opt(self.end.rss_anon_bytes),
            opt(self.end.rss_file_bytes)
        );
        println!(
            "          weights {} + kv cache {}; peak / (weights + kv) = {}",
            mib(self.weights),
            opt(self.kv_cache),
            self.peak_ratio()
                .map_or("not available".to_string(), |r| format!("{r:.2}"))
        );
        match (self.bandwidth, self.roofline) {
            (Some(b), Some(r)) => println!(
                "roofline: decode {:.1} GB/s of weights ({:.1} MB per token) = {:.1} % of {:.1} GB/s read bandwidth ({} threads, {} buffer)",
                r.achieved_gb_s,
                r.weight_bytes_per_step as f64 / 1e6,
                r.percent,
                b.read_gb_s,
                b.threads,
                mib(b.buffer_bytes as u64),
            ),
            (Some(b), None) => println!(
                "roofline: read bandwidth {:.1} GB/s; no decode rate to compare",
                b.read_gb_s
            ),
            (None, _) => println!("roofline: not measured (--no-bandwidth)"),
        }
    }
}
