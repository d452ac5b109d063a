//! `flowrt verify`: teacher-forced agreement with a reference implementation.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use flowrt_engine::Session;

use crate::common::{load_model, EngineArgs};

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// A .gguf file or a catalog tag.
    pub model: String,
    /// Reference logits (safetensors: prompt.{i}.input_ids, prompt.{i}.logits_all).
    #[arg(long)]
    pub reference: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Fail (exit 1) when the mean KL(reference ‖ flowrt) exceeds this.
    #[arg(long = "max-mean-kl")]
    pub max_mean_kl: Option<f64>,
    /// Fail (exit 1) when the top-1 agreement (0..1) is below this.
    #[arg(long = "min-top1")]
    pub min_top1: Option<f64>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub fn verify(args: VerifyArgs) -> Result<ExitCode> {
    for (name, v) in [
        ("--max-mean-kl", args.max_mean_kl),
        ("--min-top1", args.min_top1),
    ] {
        if let Some(v) = v {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{name} must be a non-negative number, got {v}"
            );
        }
    }
    if let Some(t) = args.min_top1 {
        anyhow::ensure!(
            t <= 1.0,
            "--min-top1 is a fraction between 0 and 1, got {t}"
        );
    }
    let (model, opts) = load_model(&args.model, &args.engine)?;
    let mut session = Session::new(&model, &opts)?;
    let report = flowrt_engine::verify(&mut session, &args.reference);
    args.engine.write_trace(&session)?;
    let report = report?;
    let mut failures = Vec::new();
    if let Some(max) = args.max_mean_kl {
        if report.mean_kl.is_nan() || report.mean_kl > max {
            failures.push(format!(
                "mean KL {:.3e} exceeds --max-mean-kl {max:.3e}",
                report.mean_kl
            ));
        }
    }
    if let Some(min) = args.min_top1 {
        if report.top1_agreement.is_nan() || report.top1_agreement < min {
            failures.push(format!(
                "top-1 agreement {:.4} is below --min-top1 {min:.4}",
                report.top1_agreement
            ));
        }
    }
    if args.json {
        let mut v = serde_json::to_value(&report)?;
        v["model"] = serde_json::json!(model.path.display().to_string());
        v["reference"] = serde_json::json!(args.reference.display().to_string());
        v["kernels"] = serde_json::json!(session.backend_info().kernels);
        v["passed"] = serde_json::json!(failures.is_empty());
        println!("{v}");
    } else {
        println!("model:     {}", model.path.display());
        println!(
            "reference: {} (logits {})",
            args.reference.display(),
            report.reference_dtype
        );
        println!("kernels:   {}", session.backend_info().kernels);
        println!(
            "{:>6} {:>9} {:>8} {:>11} {:>11} {:>13}",
            "prompt", "positions", "top1", "mean_kl", "max_kl", "max_abs_err"
        );
        for p in &report.prompts {
            println!(
                "{:>6} {:>9} {:>7.2}% {:>11.3e} {:>11.3e} {:>13.4}",
                p.index,
                p.positions,
                p.top1_agreement * 100.0,
                p.mean_kl,
                p.max_kl,
                p.max_abs_logit_err
            );
        }
        println!(
            "{:>6} {:>9} {:>7.2}% {:>11.3e} {:>11.3e} {:>13.4}",
            "all",
            report.positions,
            report.top1_agreement * 100.0,
            report.mean_kl,
            report.max_kl,
            report.max_abs_logit_err
        );
    }
    if failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for f in &failures {
            eprintln!("verify failed: {f}");
        }
        Ok(ExitCode::from(1))
    }
}
