//! The model store commands: `list`, `show`, `add`, `rm`, `pull`, and `ps` (models loaded
//! by a running server).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use flowrt_engine::LoadedModel;
use flowrt_model::{ModelFormat as LoadedFormat, WeightData, WeightMatrix};
use flowrt_store::{
    check_tag, find_entry, model_fingerprint, now_rfc3339, Entry, FetchPolicy, ModelFormat,
    ModelInfo, ModelRef, ModelSource, Progress, Store, StoreError,
};

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print a JSON array of registry entries.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// A registered tag (or bare family), a catalog tag, or a model path.
    pub tag: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// The tag to register, `family:size` (e.g. `mymodel:1b`).
    pub tag: String,
    /// A .gguf file or a Hugging Face checkpoint directory.
    pub path: PathBuf,
    /// Replace an existing registration of TAG.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The registered tag to remove (exactly as `flowrt list` shows it).
    pub tag: String,
    /// Also delete the model's file, when it lives in the store's models directory (files
    /// elsewhere are never deleted).
    #[arg(long = "delete-files")]
    pub delete_files: bool,
}

#[derive(Args, Debug)]
pub struct PullArgs {
    /// Catalog tag or alias, e.g. smollm2:135m.
    pub tag: String,
}

#[derive(Args, Debug)]
pub struct PsArgs {
    /// Address of the flowrt server.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8001)]
    pub port: u16,
    /// Bearer token, when the server was started with --api-key (also FLOWRT_API_KEY).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Print the server's JSON answer.
    #[arg(long)]
    pub json: bool,
}

/// What the engine reports about a loaded model.
pub struct Described {
    pub info: ModelInfo,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub vocab_size: usize,
    /// Parameters per weight type (matrices only).
    pub by_type: BTreeMap<&'static str, u64>,
    /// For a mixture of experts: the parameters one token runs (every parameter but the
    /// experts its layers' routers do not choose: top-k of each sparse layer's experts).
    pub active_parameters: Option<u64>,
}

/// Parameters, dominant weight type and the rest, from the loaded weights. Parameters
/// count every matrix (the output matrix once when tied to the embeddings), norm and bias;
/// the quantisation is the type holding most parameters of the decoder layers' matrices.
pub fn describe(m: &LoadedModel) -> Described {
    let model = &m.model;
    let cfg = &model.config;
    let mut by_type: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut in_layers: BTreeMap<&'static str, u64> = BTreeMap::new();
    let count = |map: &mut BTreeMap<&'static str, u64>, w: &WeightMatrix| {
        let n = (w.rows * w.cols) as u64;
        *map.entry(w.dtype.name()).or_default() += n;
    };
    count(&mut by_type, &model.token_embd);
    if let (false, Some(output)) = (model.tied_embeddings, &model.output) {
        count(&mut by_type, output);
    }
    for w in [&model.pos_embd, &model.token_types].into_iter().flatten() {
        count(&mut by_type, w);
    }
    for l in &model.layers {
        for w in l.matrices() {
            count(&mut by_type, w);
            count(&mut in_layers, w);
        }
    }
    let params: u64 = by_type.values().sum();
    let opt = |v: &Option<Vec<f32>>| v.as_ref().map_or(0, |v| v.len() as u64);
    let mut vectors = opt(&model.output_norm) + opt(&model.embd_norm) + opt(&model.embd_norm_bias);
    for l in &model.layers {
        vectors += (l.attn_norm.len() + l.ffn_norm.len()) as u64;
        vectors += opt(&l.bq) + opt(&l.bk) + opt(&l.bv) + opt(&l.q_norm) + opt(&l.k_norm);
        vectors += opt(&l.attn_post_norm) + opt(&l.ffn_post_norm);
        vectors += opt(&l.attn_norm_bias) + opt(&l.ffn_norm_bias);
        vectors += opt(&l.bo) + opt(&l.b_up) + opt(&l.b_down) + opt(&l.sinks);
        if let Some(c) = &l.conv {
            vectors += c.kernel.len() as u64;
            vectors += opt(&c.in_bias) + opt(&c.kernel_bias) + opt(&c.out_bias);
        }
    }
    // Experts a token does not run: all but top-k of each sparse layer's, biases included.
    let mut inactive = 0u64;
    for m in model.layers.iter().filter_map(|l| l.moe.as_ref()) {
        let biases = opt(&m.gate_bias) + opt(&m.up_bias) + opt(&m.down_bias);
        vectors += opt(&m.router_bias) + opt(&m.selection_bias) + biases;
        let experts = m.gate.len() as u64;
        let top_k = cfg.moe.as_ref().map_or(0, |c| c.num_experts_per_tok) as u64;
        let all: u64 = m.experts().map(|w| (w.rows * w.cols) as u64).sum::<u64>() + biases;
        if let Some(per_expert) = all.checked_div(experts) {
            inactive += all - per_expert * top_k.min(experts);
        }
    }
    // The decoder layers' matrices decide: small models often keep their (large)
    // embeddings at higher precision than the rest. Ties go to the type named first.
    let decide = if in_layers.is_empty() {
        &by_type
    } else {
        &in_layers
    };
    let dominant = decide
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map_or("none", |(t, _)| t);
    Described {
        info: ModelInfo {
            architecture: cfg.arch.name.to_string(),
            context_length: cfg.max_position_embeddings as u64,
            parameters: params + vectors,
            quantization: dominant.to_string(),
        },
        active_parameters: (inactive > 0).then(|| params + vectors - inactive),
        hidden_size: cfg.hidden_size,
        num_hidden_layers: cfg.num_hidden_layers,
        num_attention_heads: cfg.num_attention_heads,
        num_key_value_heads: cfg.num_key_value_heads,
        vocab_size: cfg.vocab_size,
        by_type,
    }
}

/// Largest template file read for `show`.
const MAX_TEMPLATE_BYTES: u64 = 4 << 20;

/// The chat template's source text: `tokenizer.chat_template` of a GGUF file; for a
/// checkpoint directory `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of `{name, template}` of which `default` counts).
fn template_source(m: &LoadedModel) -> Option<String> {
    match m.model.format {
        LoadedFormat::Gguf => match &m.model.token_embd.data {
            WeightData::Gguf { file, .. } => file
                .get_str("tokenizer.chat_template")
                .ok()
                .flatten()
                .map(str::to_string),
            _ => None,
        },
        LoadedFormat::HfDir => {
            let read = |name: &str| {
                let p = m.path.join(name);
                let small = std::fs::metadata(&p).is_ok_and(|md| md.len() <= MAX_TEMPLATE_BYTES);
                small.then(|| std::fs::read_to_string(&p).ok()).flatten()
            };
            if let Some(t) = read("chat_template.jinja") {
                return Some(t);
            }
            let cfg: serde_json::Value =
                serde_json::from_str(&read("tokenizer_config.json")?).ok()?;
            match cfg.get("chat_template")? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Array(list) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            }
        }
    }
}

/// The first non-empty line of a template, cut to 100 characters.
fn first_line(source: &str) -> String {
    let line = source
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut out: String = line.chars().take(100).collect();
    if line.chars().count() > 100 {
        out.push('…');
    }
    out
}

/// `134.5M`, `1.2B`.
pub fn human_params(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// `98.4 MB`, `1.2 GB` (decimal units).
pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1} GB", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} MB", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} KB", n as f64 / 1e3),
        n => format!("{n} B"),
    }
}

fn short_hash(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

fn eprint_line(msg: &str) {
    eprintln!("{msg}");
}

pub fn list(args: ListArgs) -> Result<ExitCode> {
    let store = Store::from_env()?;
    // Catalog models fetched before the registry existed (or by another tool).
    store.register_installed(&mut eprint_line)?;
    let registry = store.registry()?;
    let models = registry.list();
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, models)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if models.is_empty() {
        eprintln!(
            "no models registered in {}; `flowrt pull smollm2` fetches one, `flowrt add TAG PATH` \
             registers a file",
            registry.path().display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 8]> = models
        .iter()
        .map(|e| {
            [
                e.tag.clone(),
                e.info.architecture.clone(),
                human_params(e.info.parameters),
                e.info.quantization.clone(),
                e.info.context_length.to_string(),
                human_bytes(e.size_bytes),
                short_hash(&e.sha256).to_string(),
                e.source.as_str().to_string(),
            ]
        })
        .collect();
    let header = [
        "NAME", "ARCH", "PARAMS", "QUANT", "CONTEXT", "SIZE", "SHA256", "SOURCE",
    ];
    print_table(&mut out, &header, &rows)?;
    Ok(ExitCode::SUCCESS)
}

fn print_table<const N: usize>(
    out: &mut impl Write,
    header: &[&str; N],
    rows: &[[String; N]],
) -> Result<()> {
    let mut width = header.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for r in rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

pub fn show(args: ShowArgs) -> Result<ExitCode> {
    let store = Store::from_env()?;
    // The registry entry, or none for a plain path.
    let entry = match store.parse_model_arg(&args.tag)? {
        ModelRef::Path(_) => None,
        _ => Some(store.resolve_entry(&args.tag, FetchPolicy::Never, &mut eprint_line)?),
    };
    let path = entry
        .as_ref()
        .map_or_else(|| PathBuf::from(&args.tag), |e| e.path.clone());
    let model = LoadedModel::load(&path).with_context(|| format!("loading {}", path.display()))?;
    let d = describe(&model);
    let (sha256, size) = match &entry {
        Some(e) => (e.sha256.clone(), e.size_bytes),
        None => model_fingerprint(&path)?,
    };
    // Present means the engine compiled one; the first line is read from its source.
    let template_present = model.template.is_some();
    let template_line = template_source(&model)
        .as_deref()
        .map(first_line)
        .filter(|_| template_present);
    let format = match model.model.format {
        LoadedFormat::Gguf => ModelFormat::Gguf,
        LoadedFormat::HfDir => ModelFormat::HfDir,
    };
    let (source, origin, added) = match &entry {
        Some(e) => (
            e.source.as_str(),
            e.origin.clone(),
            Some(e.added_at.clone()),
        ),
        None => ("unregistered", String::new(), None),
    };
    if args.json {
        let v = serde_json::json!({
            "tag": entry.as_ref().map(|e| e.tag.clone()),
            "architecture": d.info.architecture,
            "features": model.model.config.features(),
            "parameters": d.info.parameters,
            "active_parameters": d.active_parameters,
            "quantization": d.info.quantization,
            "parameters_by_type": d.by_type,
            "context_length": d.info.context_length,
            "hidden_size": d.hidden_size,
            "num_hidden_layers": d.num_hidden_layers,
            "num_attention_heads": d.num_attention_heads,
            "num_key_value_heads": d.num_key_value_heads,
            "vocab_size": d.vocab_size,
            "chat_template": template_present,
            "chat_template_first_line": template_line,
            "tool_call_format": model.tool_format.name(),
            "reasoning_format": model.reasoning.name(),
            "generates": model.generates(),
            "embedding": model.embedding.as_ref().map(|e| serde_json::json!({
                "pooling": e.pooling.name(),
                "normalize": e.normalize,
                "max_tokens": e.max_tokens,
                "source": e.source,
            })),
            "format": format.as_str(),
            "path": path.display().to_string(),
            "size_bytes": size,
            "sha256": sha256,
            "source": source,
            "origin": origin,
            "added_at": added,
        });
        writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let types: Vec<String> = d
        .by_type
        .iter()
        .rev()
        .map(|(t, n)| format!("{t} {}", human_params(*n)))
        .collect();
    let mut rows: Vec<(&str, String)> = Vec::new();
    if let Some(e) = &entry {
        rows.push(("model", e.tag.clone()));
    }
    rows.extend([
        ("architecture", d.info.architecture.clone()),
        (
            "parameters",
            match d.active_parameters {
                None => format!(
                    "{} ({})",
                    human_params(d.info.parameters),
                    d.info.parameters
                ),
                Some(a) => format!(
                    "{} ({}), {} ({a}) active per token",
                    human_params(d.info.parameters),
                    d.info.parameters,
                    human_params(a)
                ),
            },
        ),
        (
            "quantization",
            format!("{} (matrices: {})", d.info.quantization, types.join(", ")),
        ),
        ("context length", d.info.context_length.to_string()),
        ("features", model.model.config.features().join("; ")),
        (
            "layers",
            format!(
                "{} (hidden {}, heads {}/{} kv, vocab {})",
                d.num_hidden_layers,
                d.hidden_size,
                d.num_attention_heads,
                d.num_key_value_heads,
                d.vocab_size
            ),
        ),
        (
            "embeds",
            match &model.embedding {
                Some(e) => format!(
                    "{} pooling{}{} (from {})",
                    e.pooling,
                    if e.normalize { ", L2-normalised" } else { "" },
                    e.max_tokens
                        .map(|n| format!(", at most {n} tokens a text"))
                        .unwrap_or_default(),
                    e.source
                ),
                None => "no pooling declared (`flowrt embed --pooling` names one)".into(),
            },
        ),
    ]);
    let chat_rows = [
        (
            "chat template",
            match (&template_line, template_present) {
                (Some(l), _) => format!("yes: {l}"),
                (None, true) => "yes".into(),
                (None, false) => "none".into(),
            },
        ),
        (
            "tool calls",
            format!(
                "{}{}",
                model.tool_format.name(),
                if model.tool_format == flowrt_text::ToolFormat::Generic {
                    " (the template has no tool support: flowrt lists the tools in a system message and constrains a JSON answer)"
                } else {
                    " (the template renders tools; calls are parsed in this format)"
                }
            ),
        ),
        (
            "reasoning",
            if model.reasoning.supports_thinking() {
                "think (<think>...</think> is split off as reasoning_content / thinking)".into()
            } else {
                "none (requests to think are refused)".into()
            },
        ),
    ];
    if model.generates() {
        rows.extend(chat_rows);
    } else {
        rows.push((
            "generates",
            "no: an embedding model (no output projection)".into(),
        ));
    }
    rows.extend([
        ("format", format.as_str().into()),
        ("file", path.display().to_string()),
        ("size", format!("{} ({size} bytes)", human_bytes(size))),
        ("sha256", sha256),
        (
            "source",
            if origin.is_empty() {
                source.to_string()
            } else {
                format!("{source}: {origin}")
            },
        ),
    ]);
    if let Some(a) = added {
        rows.push(("added", a));
    }
    let mut out = std::io::stdout().lock();
    for (k, v) in rows {
        writeln!(out, "{k:<15}{v}")?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn add(args: AddArgs) -> Result<ExitCode> {
    check_tag(&args.tag)?;
    let store = Store::from_env()?;
    let mut registry = store.registry()?;
    if let (Some(old), false) = (registry.get(&args.tag), args.force) {
        return Err(StoreError::TagExists {
            tag: old.tag,
            path: old.path,
        }
        .into());
    }
    let path = std::path::absolute(&args.path)
        .with_context(|| format!("cannot use path {}", args.path.display()))?;
    if !path.is_file() && !path.join("config.json").is_file() {
        return Err(if path.exists() {
            StoreError::NotAFile { path }
        } else {
            StoreError::NotFound { path }
        }
        .into());
    }
    let model = LoadedModel::load(&path).with_context(|| {
        format!(
            "{} is not a model flowrt can load, so it was not added",
            path.display()
        )
    })?;
    let d = describe(&model);
    drop(model);
    eprintln!("hashing {}", path.display());
    let (sha256, size_bytes) = model_fingerprint(&path)?;
    let entry = Entry {
        tag: args.tag.clone(),
        format: ModelFormat::of_path(&path),
        path,
        info: d.info,
        size_bytes,
        sha256,
        source: ModelSource::Local,
        origin: args.path.display().to_string(),
        added_at: now_rfc3339(),
    };
    let replaced = registry.add(entry.clone(), args.force)?;
    if let Some(old) = replaced {
        eprintln!("replaced {} (was {})", old.tag, old.path.display());
    }
    writeln!(
        std::io::stdout(),
        "added {}: {} ({}, {} parameters, {}, context {}, sha256 {})",
        entry.tag,
        entry.path.display(),
        entry.info.architecture,
        human_params(entry.info.parameters),
        entry.info.quantization,
        entry.info.context_length,
        short_hash(&entry.sha256)
    )?;
    Ok(ExitCode::SUCCESS)
}

pub fn rm(args: RmArgs) -> Result<ExitCode> {
    let store = Store::from_env()?;
    let mut registry = store.registry()?;
    let entry = registry.remove(&args.tag)?;
    writeln!(
        std::io::stdout(),
        "removed {} ({})",
        entry.tag,
        entry.path.display()
    )?;
    if !args.delete_files {
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(other) = registry.list().iter().find(|e| e.path == entry.path) {
        eprintln!(
            "kept {}: {} is registered to it too",
            entry.path.display(),
            other.tag
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !inside(&entry.path, &store.models_dir()) {
        eprintln!(
            "kept {}: flowrt deletes only files in its models directory {}",
            entry.path.display(),
            store.models_dir().display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let p = &entry.path;
    if p.is_dir() {
        std::fs::remove_dir_all(p).with_context(|| format!("deleting {}", p.display()))?;
    } else {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {}", p.display())),
        }
        // The hash cache next to it.
        let mut sidecar = p.as_os_str().to_owned();
        sidecar.push(".sha256");
        let _ = std::fs::remove_file(sidecar);
    }
    writeln!(std::io::stdout(), "deleted {}", p.display())?;
    Ok(ExitCode::SUCCESS)
}

/// Whether `path` is strictly inside `dir`, after resolving symbolic links (a link in the
/// models directory pointing elsewhere does not count as inside).
fn inside(path: &Path, dir: &Path) -> bool {
    match (std::fs::canonicalize(path), std::fs::canonicalize(dir)) {
        (Ok(p), Ok(d)) => p != d && p.starts_with(&d),
        _ => false,
    }
}

pub fn pull(args: PullArgs) -> Result<ExitCode> {
    let Some(entry) = find_entry(&args.tag) else {
        let known = flowrt_store::catalog()
            .iter()
            .map(|e| e.tag.to_string())
            .collect();
        return Err(StoreError::UnknownModel {
            name: args.tag,
            known,
        })
        .context("`flowrt pull` fetches catalog models; `flowrt add TAG PATH` registers a file");
    };
    let store = Store::from_env()?;
    // A tag registered to another file keeps that registration (the store says so).
    let _registered = if std::io::stderr().is_terminal() {
        let mut bar = BarProgress::new();
        let r = store.pull(entry, &mut bar);
        bar.finish();
        r
    } else {
        store.pull(entry, &mut LineProgress::default())
    }?;
    // The catalog model (what scripts read: the file, or the directory an archive unpacks
    // into), even when the tag is registered elsewhere.
    let path = std::path::absolute(store.run_path(entry))?;
    writeln!(std::io::stdout(), "{}", path.display())?;
    Ok(ExitCode::SUCCESS)
}

/// Progress as plain lines on stderr: every message, and every tenth of a transfer.
#[derive(Default)]
struct LineProgress {
    last_tenth: u64,
}

impl Progress for LineProgress {
    fn message(&mut self, msg: &str) {
        eprintln!("{msg}");
        self.last_tenth = 0;
    }

    fn bytes(&mut self, done: u64, total: u64) {
        let tenth = done * 10 / total.max(1);
        if tenth > self.last_tenth && done < total {
            eprintln!(
                "{}% ({} of {})",
                tenth * 10,
                human_bytes(done),
                human_bytes(total)
            );
            self.last_tenth = tenth;
        }
    }
}

/// Progress as an `indicatif` bar on a terminal, shown from the first byte count on;
/// messages print above it.
#[derive(Default)]
struct BarProgress {
    bar: Option<indicatif::ProgressBar>,
}

impl BarProgress {
    fn new() -> Self {
        Self::default()
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Progress for BarProgress {
    fn message(&mut self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.println(msg),
            None => eprintln!("{msg}"),
        }
    }

    fn bytes(&mut self, done: u64, total: u64) {
        let bar = self.bar.get_or_insert_with(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        if bar.length() != Some(total) {
            bar.set_length(total);
            bar.reset_eta();
        }
        bar.set_position(done);
    }
}

pub fn ps(args: PsArgs) -> Result<ExitCode> {
    let host = if args.host.contains(':') && !args.host.starts_with('[') {
        format!("[{}]", args.host)
    } else {
        args.host.clone()
    };
    let url = format!("http://{host}:{}/api/ps", args.port);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .proxy(None)
        .build()
        .new_agent();
    let mut req = agent.get(&url);
    let api_key = args.api_key.clone().or_else(|| {
        std::env::var("FLOWRT_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
    });
    if let Some(key) = &api_key {
        req = req.header("Authorization", &format!("Bearer {key}"));
    }
    let mut resp = req.call().map_err(|e| {
        anyhow::anyhow!(
            "no flowrt server answered at {url} ({e}); start one with `flowrt serve`, or pass \
             --host/--port"
        )
    })?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(16 << 20)
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    if status == 401 {
        anyhow::bail!("the server at {url} wants an API key: pass --api-key or set FLOWRT_API_KEY");
    }
    if status != 200 {
        anyhow::bail!("the server at {url} answered {status}: {}", body.trim());
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("the answer of {url} is not JSON"))?;
    if args.json {
        writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let models = v
        .get("models")
        .and_then(|m| m.as_array())
        .with_context(|| format!("the answer of {url} has no \"models\" list: {body}"))?;
    if models.is_empty() {
        eprintln!("no models loaded by the server at {url}");
        return Ok(ExitCode::SUCCESS);
    }
    let s = |m: &serde_json::Value, k: &str| {
        m.get(k)
            .map(|v| match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            })
            .unwrap_or_default()
    };
    let rows: Vec<[String; 5]> = models
        .iter()
        .map(|m| {
            let name = match s(m, "name") {
                n if n.is_empty() => s(m, "model"),
                n => n,
            };
            let digest = s(m, "digest");
            let digest = digest.strip_prefix("sha256:").unwrap_or(&digest);
            [
                name,
                short_hash(digest).to_string(),
                m.get("size")
                    .and_then(|v| v.as_u64())
                    .map(human_bytes)
                    .unwrap_or_default(),
                s(m, "context_length"),
                s(m, "expires_at"),
            ]
        })
        .collect();
    let mut out = std::io::stdout().lock();
    print_table(
        &mut out,
        &["NAME", "SHA256", "SIZE", "CONTEXT", "UNTIL"],
        &rows,
    )?;
    Ok(ExitCode::SUCCESS)
}
