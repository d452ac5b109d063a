//! `flowrt embed`: one vector per text, batched (see `flowrt_engine::Embedder`).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use flowrt_engine::{EmbedOptions, Embedder, Pooling};
use serde_json::json;

use crate::common::{load_model, EngineArgs};

#[derive(Args)]
pub struct EmbedArgs {
    /// Model: a catalog tag (e.g. all-minilm:l6-v2), a registered tag, a GGUF file or a
    /// Hugging Face / sentence-transformers directory.
    pub model: String,
    /// Texts to embed, one vector each.
    pub texts: Vec<String>,
    /// Also embed every line of this file (`-`: standard input), empty lines included, after
    /// the TEXT arguments.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Print JSON: the model, pooling, dimensions, and per text its index, tokens, whether
    /// it was truncated, and the vector.
    #[arg(long)]
    pub json: bool,
    /// Pooling to use: mean, cls or last. Required for a model that declares none (decoders
    /// without a sentence-transformers modules.json or GGUF pooling_type); overrides the
    /// declaration otherwise.
    #[arg(long)]
    pub pooling: Option<Pooling>,
    /// Do not L2-normalise the vectors (default: as the model declares; normalised when it
    /// declares nothing).
    #[arg(long = "no-normalize")]
    pub no_normalize: bool,
    /// Cut texts longer than the model's limit (its max_seq_length) to the limit, keeping the
    /// special tokens, instead of failing. Truncated texts are reported.
    #[arg(long)]
    pub truncate: bool,
    /// Most tokens of one forward pass, every text of the batch together (at least the
    /// longest text).
    #[arg(long = "batch-tokens", default_value_t = 2048)]
    pub batch_tokens: usize,
    /// Most texts of one forward pass.
    #[arg(long = "batch-seqs", default_value_t = 64)]
    pub batch_seqs: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `EngineArgs::batch_size`'s default: `flowrt embed` batches by `--batch-tokens` instead.
const ENGINE_BATCH_DEFAULT: usize = 256;

pub fn embed(args: EmbedArgs) -> Result<ExitCode> {
    if args.engine.batch_size != ENGINE_BATCH_DEFAULT {
        bail!("flowrt embed batches by --batch-tokens and --batch-seqs; --batch-size is not used");
    }
    if args.batch_tokens == 0 || args.batch_seqs == 0 {
        bail!("--batch-tokens and --batch-seqs must be at least 1");
    }
    let mut texts = args.texts.clone();
    if let Some(path) = &args.file {
        let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
            ))
        };
        for (i, line) in reader.lines().enumerate() {
            texts.push(line.with_context(|| format!("{} line {}", path.display(), i + 1))?);
        }
    }
    if texts.is_empty() {
        bail!("nothing to embed: give TEXT arguments or --file");
    }
    let (model, engine) = load_model(&args.model, &args.engine)?;
    let opts = EmbedOptions {
        pooling: args.pooling,
        normalize: args.no_normalize.then_some(false),
        batch_tokens: args.batch_tokens,
        batch_seqs: args.batch_seqs,
    };
    let mut embedder = Embedder::new(&model, &engine, &opts)
        .with_context(|| format!("preparing {} to embed", model.path.display()))?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let t0 = Instant::now();
    let out = embedder.embed(&model, &refs, args.truncate)?;
    let secs = t0.elapsed().as_secs_f64();
    args.engine.write_trace_of(embedder.session().trace())?;

    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let data: Vec<_> = out
            .vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                json!({
                    "index": i,
                    "tokens": out.tokens[i],
                    "truncated": out.truncated[i],
                    "embedding": v,
                })
            })
            .collect();
        let doc = json!({
            "model": model.path.display().to_string(),
            "pooling": embedder.pooling().name(),
            "pooling_source": embedder.pooling_source(),
            "normalized": embedder.normalizes(),
            "dimensions": embedder.dims(),
            "max_tokens": embedder.max_tokens(),
            "tokens": out.total_tokens(),
            "seconds": secs,
            "data": data,
        });
        serde_json::to_writer(&mut w, &doc)?;
        writeln!(w)?;
    } else {
        for v in &out.vectors {
            let line: Vec<String> = v.iter().map(|x| format!("{x}")).collect();
            writeln!(w, "{}", line.join(" "))?;
        }
    }
    w.flush()?;
    let cut = out.truncated.iter().filter(|&&t| t).count();
    eprintln!(
        "embedded {} text(s), {} tokens, in {:.3} s ({:.1} texts/s); {} pooling{}, {} dimensions{}",
        out.vectors.len(),
        out.total_tokens(),
        secs,
        out.vectors.len() as f64 / secs.max(1e-9),
        embedder.pooling(),
        if embedder.normalizes() {
            ", L2-normalised"
        } else {
            ""
        },
        embedder.dims(),
        if cut > 0 {
            format!("; {cut} truncated to {} tokens", embedder.max_tokens())
        } else {
            String::new()
        }
    );
    Ok(ExitCode::SUCCESS)
}
