//! `flowrt`: run, verify and benchmark LLMs on the CPU (or another backend, see `flowrt devices`).

mod bench;
mod common;
mod devices;
mod diff;
mod embed;
mod lint;
mod models;
mod pack;
mod plan;
mod run;
mod serve;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "flowrt", version, about = "An LLM inference runtime: run, verify and benchmark models", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text: one answer to PROMPT, or an interactive chat without it.
    Run(run::RunArgs),
    /// Embed texts: one vector each, batched, pooled as the model declares (sentence-
    /// transformers directories, GGUF pooling_type) or as --pooling says.
    Embed(embed::EmbedArgs),
    /// Compare flowrt's logits with a reference implementation's, teacher-forced.
    Verify(verify::VerifyArgs),
    /// Measure prefill and decode speed on a model file.
    Bench(bench::BenchArgs),
    /// Print the forward pass: command groups, their weight bytes and FLOPs, and how they are
    /// cut into runlists with deadlines for the given settings.
    Plan(plan::PlanArgs),
    /// Serve models over an OpenAI- and Ollama-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Fetch a catalog model into the model store and register it.
    Pull(models::PullArgs),
    /// List the registered models.
    List(models::ListArgs),
    /// Show what a model is: architecture, parameters, quantisation, context, template, file.
    Show(models::ShowArgs),
    /// Register a GGUF file or checkpoint directory under a tag (loads it to validate).
    Add(models::AddArgs),
    /// Remove a model from the registry.
    Rm(models::RmArgs),
    /// List the models loaded by a running `flowrt serve`.
    Ps(models::PsArgs),
    /// List the devices each backend can run on (the CPU, Vulkan devices), and what
    /// `--backend auto` picks.
    Devices(devices::DevicesArgs),
    /// Write a model as a GGUF file of a chosen type (F16, Q8_0, Q4_K, ...) and check it
    /// against its source, teacher-forced (exit 1 and no output when the gate's bounds are missed).
    Pack(pack::PackArgs),
    /// Check a model (and, with --source, its port) for shims: injected norms, replicated KV
    /// heads, relabelled architectures, duplicated embeddings, tokenizer drift, NaN/Inf.
    /// Exit 0 clean, 1 findings, 2 error.
    Lint(lint::LintArgs),
    /// Find where two models with one tokenizer part: per-layer divergence of the residual
    /// stream, teacher-forced, and the first layer over a threshold. Exit 0 none, 1 one, 2 error.
    Diff(diff::DiffArgs),
}

fn main() -> ExitCode {
    // Chat templates come from model files: this process renders them in workers that are
    // itself started with WORKER_ARG, whose memory is capped (flowrt_text::sandbox).
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(flowrt_text::sandbox::WORKER_ARG))
    {
        flowrt_text::sandbox::worker_main();
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("FLOWRT_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match std::env::current_exe() {
        Ok(exe) => {
            if let Err(e) = flowrt_text::sandbox::install(exe) {
                tracing::warn!("{e}");
            }
        }
        Err(e) => tracing::warn!(
            "cannot find this executable to render chat templates in a memory-capped worker ({e}); templates render in-process"
        ),
    }
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Embed(a) => embed::embed(a),
        Command::Verify(a) => verify::verify(a),
        Command::Bench(a) => bench::bench(a),
        Command::Plan(a) => plan::plan(a),
        Command::Serve(a) => serve::serve(*a),
        Command::Pull(a) => models::pull(a),
        Command::List(a) => models::list(a),
        Command::Show(a) => models::show(a),
        Command::Add(a) => models::add(a),
        Command::Rm(a) => models::rm(a),
        Command::Ps(a) => models::ps(a),
        Command::Devices(a) => devices::devices(a),
        Command::Pack(a) => pack::pack(a),
        Command::Lint(a) => lint::lint(a),
        Command::Diff(a) => diff::diff(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if common::is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
