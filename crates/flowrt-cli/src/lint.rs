//! `flowrt lint`: find what went wrong in a port (injected norms, replicated KV heads,
//! relabelled architectures, duplicated embeddings, tokenizer/template drift, NaN/Inf), each
//! finding with what it costs, measured where it can be. Exit 0 clean, 1 findings, 2 error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use flowrt_engine::lint::{lint as run_lint, Finding, LintReport};
use flowrt_engine::LoadedModel;

#[derive(Args, Debug)]
pub struct LintArgs {
    /// The model to check: a .gguf file or a Hugging Face checkpoint directory.
    pub model: PathBuf,
    /// The model it was ported from (GGUF or HF directory): RoPE, config, tokenizer ids on a
    /// built-in corpus, chat template, BOS/EOS (against its generation_config.json), and the
    /// measured KL of an injected QK-norm against it.
    #[arg(long)]
    pub source: Option<PathBuf>,
    /// Print one JSON object ({"findings": [...], ...}).
    #[arg(long)]
    pub json: bool,
}

/// Exit code of a lint that found something.
const FINDINGS: u8 = 1;
/// Exit code of a lint that could not run.
const ERROR: u8 = 2;

pub fn lint(args: LintArgs) -> anyhow::Result<ExitCode> {
    match lint_report(&args) {
        Ok(report) => {
            print_report(&report, args.json);
            Ok(if report.findings.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(FINDINGS)
            })
        }
        Err(e) => {
            if args.json {
                println!("{}", serde_json::json!({ "error": format!("{e:#}") }));
            }
            eprintln!("error: {e:#}");
            Ok(ExitCode::from(ERROR))
        }
    }
}

fn load(path: &Path, what: &str) -> anyhow::Result<Result<LoadedModel, String>> {
    if !path.exists() {
        anyhow::bail!("{what} {}: no such file or directory", path.display());
    }
    match LoadedModel::load(path) {
        Ok(m) => Ok(Ok(m)),
        // A tensor the label's family does not use (or lacks) is a finding about the label,
        // not a failure to lint.
        Err(e) if is_label_error(&e.to_string()) => Ok(Err(e.to_string())),
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("cannot load {what} {}", path.display())))
        }
    }
}

fn is_label_error(msg: &str) -> bool {
    msg.contains("does not use") || msg.contains("missing tensor `")
}

fn lint_report(args: &LintArgs) -> anyhow::Result<LintReport> {
    let model = load(&args.model, "model")?;
    let source = match &args.source {
        Some(p) => {
            Some(load(p, "source")?.map_err(|e| anyhow::anyhow!("cannot load source: {e}"))?)
        }
        None => None,
    };
    let model = match model {
        Ok(m) => m,
        Err(e) => {
            return Ok(LintReport {
                model: args.model.display().to_string(),
                arch: String::new(),
                source: args.source.as_ref().map(|p| p.display().to_string()),
                findings: vec![Finding {
                    check: "arch-label".into(),
                    message: format!("the tensors do not match the architecture label: {e}"),
                    cost: "the model does not load as labelled".into(),
                    measured: None,
                }],
                checks: vec!["load".into()],
                quant_error: None,
                block_outliers: Default::default(),
            })
        }
    };
    let source_dir = args.source.as_deref().filter(|p| p.is_dir());
    Ok(run_lint(&model, source.as_ref(), source_dir)?)
}

fn print_report(r: &LintReport, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
        return;
    }
    print!("{} ({})", r.model, r.arch);
    if let Some(s) = &r.source {
        print!(" against source {s}");
    }
    println!();
    if let Some(q) = &r.quant_error {
        print!(
            "quant-error: {} quantised tensor(s) compared with the source ({} left out)",
            q.tensors_compared, q.tensors_skipped
        );
        match &q.worst {
            Some(t) => println!(
                "; worst {} ({}): relative RMS error {:.3e}, {:.2}x what requantising the source gives",
                t.tensor, t.dtype, t.rel_rms_err, t.ratio
            ),
            None if q.tensors_compared == 0 => println!("; none to compare"),
            None => println!("; all identical to the source"),
        }
    }
    let b = &r.block_outliers;
    if b.tensors > 0 {
        println!(
            "damaged-blocks: {} block(s) of {} quantised tensor(s) against their rows and columns; closest to the {}x bound: {:.1}x above ({}), {:.1}x below ({})",
            b.blocks,
            b.tensors,
            b.ratio_bound,
            b.max_up_ratio,
            b.max_up_tensor.as_deref().unwrap_or("-"),
            b.max_down_ratio,
            b.max_down_tensor.as_deref().unwrap_or("-"),
        );
    }
    if r.findings.is_empty() {
        println!("clean: no findings ({} checked)", r.checks.join(", "));
        return;
    }
    for f in &r.findings {
        println!("[{}] {}", f.check, f.message);
        println!("    cost: {}", f.cost);
    }
    println!("{} finding(s)", r.findings.len());
}
