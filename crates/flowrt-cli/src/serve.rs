//! `flowrt serve`: the OpenAI- and Ollama-compatible HTTP server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use flowrt_server::{app, AppState, ModelSpec, ServeOptions, ServerConfig, Stopped};
use flowrt_store::{find_entry, ModelRef, Store};

use crate::common::{model_fingerprint, resolve_model, EngineArgs};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Models to serve: registered or catalog tags (e.g. smollm2:135m), bare families, .gguf
    /// files or checkpoint directories. Without any, every registered model is served
    /// (loaded on its first request), including models registered while the server runs.
    pub models: Vec<String>,
    /// Address to listen on (loopback by default; anything else exposes the server).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port; the address is printed).
    #[arg(long, default_value_t = 8001)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every route but /health
    /// (also FLOWRT_API_KEY).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Sequences each model generates at once.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Requests each model lets wait for a free sequence; beyond that, 429.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// How long a model stays loaded after its last request: seconds or 30s/5m/1h; -1 =
    /// until shutdown.
    #[arg(long = "keep-alive", default_value = "5m", allow_hyphen_values = true)]
    pub keep_alive: String,
    /// Most memory resident models may take (weights plus KV caches, estimated), e.g. 8G;
    /// least recently used idle models are unloaded to make room. Default: no limit.
    #[arg(long = "max-memory")]
    pub max_memory: Option<String>,
    /// How long a request for a model that does not fit --max-memory while the loaded models
    /// are busy waits for one of them to go idle (seconds or 30s/5m; 0 = refuse at once with
    /// a 503). Such requests wait first come, first served, at most --queue of them.
    #[arg(long = "memory-wait", default_value = "60s")]
    pub memory_wait: String,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 4 << 20)]
    pub max_body: usize,
    /// Let web pages from ORIGIN (scheme://host[:port], or `*` for any) read the API (CORS);
    /// repeatable. Off by default: without it no browser page of another site can read the
    /// server's answers.
    #[arg(long = "cors-origin", value_name = "ORIGIN", value_parser = parse_cors_origin)]
    pub cors_origin: Vec<String>,
    /// Also answer requests whose `Host` header is NAME (a host name or address, without a
    /// port; repeatable; `*` turns the check off). A server bound to loopback answers only to
    /// localhost, 127.0.0.1 and [::1] by default (against DNS rebinding); one bound elsewhere
    /// checks `Host` only when this option is given (then also against the bound address).
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// Report `usage.prompt_tokens_details.cached_tokens`. Off by default: the prefix cache is
    /// shared, so the count would let one client read another's prompt; for single-user setups.
    #[arg(long = "report-cached-tokens")]
    pub report_cached_tokens: bool,
    /// Load models on their first request instead of at start.
    #[arg(long)]
    pub lazy: bool,
    /// On SIGTERM or Ctrl-C, how long open requests may run on (seconds or 30s/5m) before
    /// they are cut off and the server exits; new requests get 503 meanwhile.
    #[arg(
        long = "shutdown-timeout",
        visible_alias = "shutdown-grace",
        default_value = "10s"
    )]
    pub shutdown_timeout: String,
    /// How long a connection may take to send a complete request header (seconds or
    /// 10s/1m; -1 = no bound); then it is closed without an answer. A kept-alive connection
    /// idle for this long after its last response is closed too. Against clients that open
    /// connections and send nothing or half a header.
    #[arg(
        long = "header-timeout",
        default_value = "10s",
        allow_hyphen_values = true
    )]
    pub header_timeout: String,
    /// How long a JSON request body may take to arrive after its header (seconds or 10s/1m;
    /// -1 = no bound); then the answer is a 408. Against clients that trickle a body to hold
    /// a connection and its buffer.
    #[arg(
        long = "body-timeout",
        default_value = "60s",
        allow_hyphen_values = true
    )]
    pub body_timeout: String,
    #[command(flatten)]
    pub engine: EngineArgs,
}

fn parse_cors_origin(s: &str) -> Result<String, String> {
    flowrt_server::check_cors_origin(s).map(|()| s.to_string())
}

fn parse_duration(opt: &str, s: &str) -> Result<Option<Duration>> {
    let s = s.trim();
    let (num, mult) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (
            &s[..i],
            match &s[i..] {
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                u => bail!("{opt} {s}: unknown unit `{u}` (use s, m or h)"),
            },
        ),
        None => (s, 1.0),
    };
    let n: f64 = num
        .parse()
        .with_context(|| format!("{opt} {s}: not a duration"))?;
    if !n.is_finite() {
        bail!("{opt} {s}: not a duration");
    }
    Ok((n >= 0.0).then(|| Duration::from_secs_f64(n * mult)))
}

fn parse_bytes(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (
            &s[..i],
            match s[i..].to_ascii_uppercase().trim_end_matches(['B', 'I']) {
                "" => 1u64,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                u => bail!("--max-memory {s}: unknown unit `{u}` (use K, M, G or T)"),
            },
        ),
        None => (s, 1),
    };
    let n: f64 = num
        .parse()
        .with_context(|| format!("--max-memory {s}: not a size"))?;
    if !(n.is_finite() && n > 0.0) {
        bail!("--max-memory {s}: must be positive");
    }
    Ok((n * mult as f64) as u64)
}

/// What the server answers for: each MODEL argument, as `flowrt run` resolves it. A
/// registered model is served under its tag with the registry's hash, size, source and
/// format; a catalog model under its tag; a path under its file name, identified by the hash
/// of its bytes. The name given is an alias of the model it resolved to.
fn model_specs(args: &ServeArgs) -> Result<Vec<ModelSpec>> {
    let mut specs: Vec<ModelSpec> = Vec::new();
    for arg in &args.models {
        let path = resolve_model(arg, args.engine.no_fetch)?;
        let spec = match flowrt_store::parse_model_arg(arg)? {
            ModelRef::Registered(entry) => {
                let catalog_aliases: Vec<String> = find_entry(&entry.tag)
                    .map(|c| c.aliases.iter().map(|a| a.to_string()).collect())
                    .unwrap_or_default();
                ModelSpec::from_entry(entry)
                    .with_aliases(catalog_aliases)
                    .with_aliases([arg.clone()])
            }
            // Resolving a catalog tag registers it, so this is a model the registry could
            // not take (e.g. a read-only home): served under its tag all the same.
            ModelRef::Tag(entry) => {
                ModelSpec::new(entry.tag, path, entry.sha256.into(), entry.size, "catalog")
                    .map_err(anyhow::Error::msg)?
                    .with_aliases(entry.aliases.iter().map(|a| a.to_string()))
                    .with_aliases([arg.clone()])
            }
            ModelRef::Path(p) => {
                let (sha, size) = model_fingerprint(&path)?;
                let id = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| arg.clone());
                ModelSpec::new(id, path, sha, size, "file")
                    .map_err(|e| anyhow::anyhow!("{arg}: {e}"))?
                    .with_aliases([arg.clone()])
            }
        };
        if let Some(dup) = specs.iter().find(|s| s.id == spec.id) {
            bail!("{arg}: the model `{}` is named twice", dup.id);
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// Without MODEL arguments: the registry of the default store, after registering catalog
/// models fetched before the registry existed. Fails when nothing is registered.
fn registry_state(config: ServerConfig) -> Result<AppState> {
    let store = Store::from_env()?;
    store.register_installed(&mut |m: &str| eprintln!("flowrt serve: {m}"))?;
    let state = AppState::from_registry(store.home().to_path_buf(), config)
        .with_context(|| format!("reading the model registry in {}", store.home().display()))?;
    if state.models.specs().is_empty() {
        bail!(
            "no model to serve: nothing is registered in {}; name one (e.g. `flowrt serve smollm2:135m`), \
             fetch one with `flowrt pull smollm2:135m`, or register a file with `flowrt add TAG PATH`",
            store.home().display()
        );
    }
    Ok(state)
}

/// glibc raises its mmap threshold each time a large block is freed (up to 32 MiB); from then
/// on model-sized buffers come from the heap, and when a model is unloaded the allocator keeps
/// their pages. A server swapping three SmolLM2 copies under `--max-memory 400M` grew from
/// 320 to 470+ MiB in two minutes that way, and stayed at 270-290 MiB with the threshold fixed
/// (docs/reliability.md). Fixing it keeps every block of 128 KiB or more in its own mapping,
/// returned to the system when freed. Not done when the user tunes malloc through the
/// environment.
fn fix_malloc_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("GLIBC_TUNABLES").is_some()
            || std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        {
            return;
        }
        // SAFETY: mallopt only sets an allocator parameter; it takes no pointers.
        #[allow(unsafe_code)]
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
        if ok != 1 {
            tracing::warn!("mallopt(M_MMAP_THRESHOLD) failed; unloaded models may leave memory with the allocator");
        }
    }
}

pub fn serve(args: ServeArgs) -> Result<ExitCode> {
    fix_malloc_mmap_threshold();
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if args.engine.quant.is_some() {
        bail!("--quant is not supported by serve yet: quantise a checkpoint to GGUF first");
    }
    if args.engine.trace.is_some() {
        // The server's sessions would record a trace that nothing writes out yet.
        bail!("--trace is not supported by serve yet: trace a model with `flowrt run` or `flowrt bench`");
    }
    let config = ServerConfig {
        engine: args.engine.options()?,
        parallel: args.parallel,
        queue: args.queue,
        keep_alive: parse_duration("--keep-alive", &args.keep_alive)?,
        memory_budget: args.max_memory.as_deref().map(parse_bytes).transpose()?,
        memory_wait: parse_duration("--memory-wait", &args.memory_wait)?
            .context("--memory-wait must be 0 or more seconds")?,
        api_key: api_key(
            args.api_key.clone(),
            std::env::var_os("FLOWRT_API_KEY").map(|v| v.to_string_lossy().into_owned()),
        )?,
        max_body_bytes: args.max_body,
        body_timeout: match parse_duration("--body-timeout", &args.body_timeout)? {
            Some(Duration::ZERO) => {
                bail!("--body-timeout must be more than 0 seconds (or -1 for no bound)")
            }
            t => t,
        },
        cors_origins: args.cors_origin.clone(),
        report_cached_tokens: args.report_cached_tokens,
        allowed_hosts: allowed_hosts(&args.host, &args.allowed_host),
    };
    let grace = parse_duration("--shutdown-timeout", &args.shutdown_timeout)?
        .context("--shutdown-timeout must be 0 or more seconds")?;
    let grace_text = args.shutdown_timeout.clone();
    let header_timeout = parse_duration("--header-timeout", &args.header_timeout)?;
    if header_timeout == Some(Duration::ZERO) {
        bail!("--header-timeout must be more than 0 seconds (or -1 for no bound)");
    }
    let from_registry = args.models.is_empty();
    let state = if from_registry {
        registry_state(config)?
    } else {
        AppState::new(model_specs(&args)?, config)
    };
    let preload: Vec<String> = if args.lazy || from_registry {
        Vec::new()
    } else {
        state.models.specs().iter().map(|s| s.id.clone()).collect()
    };
    let host: std::net::IpAddr = args
        .host
        .parse()
        .with_context(|| format!("--host {}: not an IP address", args.host))?;
    let addr = SocketAddr::new(host, args.port);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr()?;
        state.models.spawn_reaper();
        if let Some(home) = state.models.registry_home() {
            eprintln!("flowrt serve: serving the models registered in {} (each loads on its first request)", home.display());
        }
        for s in state.models.specs() {
            eprintln!("flowrt serve: model {} ({}, sha256 {}, {})", s.id, s.path.display(), s.sha256, s.source);
        }
        eprintln!("flowrt serve: listening on http://{local}");
        if !host.is_loopback() {
            eprintln!("flowrt serve: warning: {host} is not a loopback address; the server is reachable from the network{}", if state.config.api_key.is_none() { " without an API key" } else { "" });
        }
        if !preload.is_empty() {
            let models = state.models.clone();
            tokio::spawn(async move {
                if let Err(e) = models.preload(&preload).await {
                    eprintln!("flowrt serve: preloading failed: {e}");
                }
            });
        }
        let draining = state.draining.clone();
        let signal = async move {
            shutdown_signal().await;
            draining.store(true, std::sync::atomic::Ordering::SeqCst);
        };
        // After the signal, open requests get `grace`; then they are cut off (an endless
        // stream cannot hold the exit; a half-sent request header is closed at its header
        // timeout, or at `grace` if that comes first).
        let options = ServeOptions {
            header_timeout,
            shutdown_timeout: grace,
        };
        match flowrt_server::serve(listener, app(state), options, signal).await {
            Stopped::Drained => eprintln!("flowrt serve: stopped"),
            Stopped::CutOff { open } => eprintln!(
                "flowrt serve: stopped after --shutdown-timeout {grace_text}, cutting off the {open} connection(s) still open"
            ),
        }
        Ok::<_, anyhow::Error>(())
    })?;
    // Connections still open were cut off above; their tasks end with the runtime, and work
    // on blocking threads (a prompt being tokenized) is not waited for.
    runtime.shutdown_timeout(Duration::from_millis(100));
    Ok(ExitCode::SUCCESS)
}

/// The API key from `--api-key` or else `FLOWRT_API_KEY`. An empty one is an error: it would
/// otherwise turn authentication off without a word.
fn api_key(arg: Option<String>, env: Option<String>) -> Result<Option<String>> {
    let (key, from) = match (arg, env) {
        (Some(k), _) => (k, "--api-key"),
        (None, Some(k)) => (k, "FLOWRT_API_KEY"),
        (None, None) => return Ok(None),
    };
    if key.trim().is_empty() {
        bail!("{from} is empty: give a non-empty key, or leave {from} unset to serve without one");
    }
    Ok(Some(key))
}

/// Ctrl-C or SIGTERM: stop accepting connections and let the open ones finish.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("flowrt serve: shutting down (finishing open requests; new ones get 503)");
}

/// The `Host` names the server answers to (`None`: any). See `--allowed-host`.
fn allowed_hosts(bind: &str, extra: &[String]) -> Option<Vec<String>> {
    if extra.iter().any(|h| h.trim() == "*") {
        return None;
    }
    let ip: Option<std::net::IpAddr> = bind.parse().ok();
    let loopback = ip.is_some_and(|ip| ip.is_loopback());
    if !loopback && extra.is_empty() {
        return None;
    }
    let mut hosts: Vec<String> = flowrt_server::LOOPBACK_HOSTS
        .iter()
        .map(|h| h.to_string())
        .collect();
    if let Some(ip) = ip.filter(|ip| !ip.is_unspecified()) {
        let own = match ip {
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        };
        if !hosts.contains(&own) {
            hosts.push(own);
        }
    }
    for h in extra {
        let h = h.trim().to_string();
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    Some(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_hosts_follow_the_bind_address_and_the_option() {
        let loopback = ["localhost", "127.0.0.1", "[::1]"];
        assert_eq!(allowed_hosts("127.0.0.1", &[]).unwrap(), loopback);
        assert_eq!(allowed_hosts("::1", &[]).unwrap(), loopback);
        assert_eq!(
            allowed_hosts("127.0.0.1", &["box.lan".into()]).unwrap(),
            ["localhost", "127.0.0.1", "[::1]", "box.lan"]
        );
        // Bound elsewhere: no check unless asked for, then also the bound address.
        assert_eq!(allowed_hosts("0.0.0.0", &[]), None);
        assert_eq!(
            allowed_hosts("192.168.1.5", &["box.lan".into()]).unwrap(),
            ["localhost", "127.0.0.1", "[::1]", "192.168.1.5", "box.lan"]
        );
        assert_eq!(allowed_hosts("127.0.0.1", &["*".into()]), None);
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(
            parse_duration("--keep-alive", "5m").unwrap(),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            parse_duration("--keep-alive", "30").unwrap(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_duration("--keep-alive", "-1").unwrap(), None);
        assert!(parse_duration("--keep-alive", "5x").is_err());
        assert_eq!(parse_bytes("8G").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert!(parse_bytes("-1G").is_err());
        assert!(parse_bytes("3Q").is_err());
    }
}
