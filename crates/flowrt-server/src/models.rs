//! The models a server answers for, and which of them are resident.
//!
//! A [`ModelSpec`] is a model the server may run (its id, aliases, file, hash and details);
//! requests naming anything else get 404 `model_not_found`, never another model. The specs
//! are either a fixed list (the models named to `flowrt serve`) or every model of the
//! registry, re-read as it changes (see [`crate::registry`]). A spec is
//! loaded on first use (or by [`ModelManager::preload`]), runs behind its own
//! [`Scheduler`], stays resident for the keep-alive after its last request, and is unloaded
//! least-recently-used first when loading another would exceed the memory budget. A request
//! for a model that does not fit while the resident models are busy waits, first come first
//! served, for one of them to go idle (`--memory-wait`), then a 503.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use flowrt_engine::{BatchStepper, EmbedOptions, Embedder, LoadedModel, StepEngine};
use flowrt_store::{Entry, ModelFormat, StoreError};
use tokio::sync::watch;

use crate::details::ModelDetails;
use crate::error::{ApiError, ErrorKind};
use crate::metrics::{Metrics, ModelGauges};
use crate::registry::RegistryModels;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::ServerConfig;

/// A model this server can run.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    /// The name responses carry, e.g. `smollm2:135m` or a file name.
    pub id: String,
    /// Other names requests may use for it (a catalog alias, the path it was given as).
    pub aliases: Vec<String>,
    /// GGUF file or HF checkpoint directory.
    pub path: PathBuf,
    /// Lower-case hex SHA-256 of the file (for a directory, of its file list with hashes).
    pub sha256: String,
    /// Bytes on disk.
    pub size: u64,
    /// Where it came from: a registry source (`catalog`, `local`, ...) or `file`.
    pub source: String,
    pub modified: SystemTime,
    pub details: ModelDetails,
    /// The registry entry it is served from, when it is a registered model.
    pub entry: Option<Entry>,
}

impl ModelSpec {
    /// Describe the model at `path`, reading its metadata (not its weights).
    pub fn new(
        id: impl Into<String>,
        path: PathBuf,
        sha256: String,
        size: u64,
        source: impl Into<String>,
    ) -> Result<ModelSpec, String> {
        let details = ModelDetails::read(&path)?;
        let modified = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(ModelSpec {
            id: id.into(),
            aliases: Vec::new(),
            path,
            sha256,
            size,
            source: source.into(),
            modified,
            details,
            entry: None,
        })
    }

    /// The registered model `entry`, served under its tag with the registry's hash, size,
    /// source and format. The file's metadata fills in the details (chat template, name);
    /// when it cannot be read the registry's figures stand in, and loading will fail
    /// with the reason in the log.
    pub fn from_entry(entry: Entry) -> ModelSpec {
        let details = match ModelDetails::read(&entry.path) {
            Ok(mut d) => {
                if d.parameter_count.is_none() {
                    d.parameter_count = Some(entry.info.parameters);
                }
                d
            }
            Err(e) => {
                tracing::warn!(model = %entry.tag, path = %entry.path.display(), error = %e,
                    "cannot read the registered model's metadata; listing the registry's");
                ModelDetails {
                    format: match entry.format {
                        ModelFormat::Gguf => "gguf",
                        ModelFormat::HfDir => "safetensors",
                    },
                    architecture: entry.info.architecture.clone(),
                    name: None,
                    license: None,
                    parameter_count: Some(entry.info.parameters),
                    quantization: entry.info.quantization.to_uppercase(),
                    context_length: usize::try_from(entry.info.context_length)
                        .unwrap_or(usize::MAX),
                    chat_template: None,
                }
            }
        };
        let modified = chrono::DateTime::parse_from_rfc3339(&entry.added_at)
            .map(SystemTime::from)
            .or_else(|_| std::fs::metadata(&entry.path).and_then(|m| m.modified()))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        ModelSpec {
            id: entry.tag.clone(),
            aliases: Vec::new(),
            path: entry.path.clone(),
            sha256: entry.sha256.clone(),
            size: entry.size_bytes,
            source: entry.source.as_str().to_string(),
            modified,
            details,
            entry: Some(entry),
        }
    }

    /// `gguf` or `hf-dir` (the registry's names for how a model is stored).
    pub fn format(&self) -> &'static str {
        match &self.entry {
            Some(e) => e.format.as_str(),
            None if self.path.is_dir() => ModelFormat::HfDir.as_str(),
            None => ModelFormat::Gguf.as_str(),
        }
    }

    pub fn with_aliases(mut self, aliases: impl IntoIterator<Item = String>) -> ModelSpec {
        for a in aliases {
            if a != self.id && !self.aliases.contains(&a) {
                self.aliases.push(a);
            }
        }
        self
    }

    fn answers_to(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name)
    }
}

/// A resident model: loaded weights, its scheduler, and when it was last used.
pub struct Runner {
    pub spec: Arc<ModelSpec>,
    pub model: Arc<LoadedModel>,
    /// Generation; `None` for a model that only embeds.
    pub scheduler: Option<Scheduler>,
    /// Embeddings: made on the model's first embedding request; requests take turns.
    pub embedder: Mutex<Option<Embedder>>,
    /// Embedding requests waiting or running.
    pub embedding: AtomicUsize,
    /// Context length of each sequence.
    pub n_ctx: usize,
    /// Most bytes of text one token of the vocabulary stands for (the longer of its spelling
    /// and its decoded bytes): a prompt longer than `n_ctx` times this cannot fit the context,
    /// so it is refused before it is tokenized.
    pub max_token_bytes: usize,
    /// Prompts of this model tokenized at once (one per `--parallel` slot), so many huge
    /// prompts at once cannot take memory without bound before the queue admits them.
    pub tokenizing: tokio::sync::Semaphore,
    /// Requests waiting for a `tokenizing` permit: at most `--queue` (see
    /// [`crate::gen::tokenize_turn`]).
    pub tokenize_waiting: AtomicUsize,
    /// Estimated resident bytes: weights plus every slot's KV cache.
    pub est_bytes: u64,
    pub loaded_at: SystemTime,
    last_used: Mutex<Instant>,
    /// How long it stays resident after its last request; `None` = until shutdown.
    keep_alive: Mutex<Option<Duration>>,
}

impl Runner {
    pub fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    pub fn set_keep_alive(&self, k: Option<Duration>) {
        *lock(&self.keep_alive) = k;
    }

    /// When it will be unloaded if unused (`None`: never).
    pub fn expires_at(&self) -> Option<SystemTime> {
        let k = (*lock(&self.keep_alive))?;
        let idle = lock(&self.last_used).elapsed();
        Some(SystemTime::now() + k.saturating_sub(idle))
    }

    fn expired(&self) -> bool {
        let Some(k) = *lock(&self.keep_alive) else {
            return false;
        };
        self.in_flight() == 0 && lock(&self.last_used).elapsed() >= k
    }

    /// Requests queued or running: generations and embeddings.
    pub fn in_flight(&self) -> usize {
        self.scheduler.as_ref().map_or(0, Scheduler::in_flight)
            + self.embedding.load(Ordering::SeqCst)
    }
}

type LoadResult = Option<Result<Arc<Runner>, ApiError>>;

enum Resident {
    /// Being loaded; `bytes` (what it held when it last loaded, else its file size: a lower
    /// bound) is reserved in the memory budget meanwhile, so that concurrent loads cannot
    /// overrun it.
    Loading {
        rx: watch::Receiver<LoadResult>,
        bytes: u64,
    },
    Ready(Arc<Runner>),
}

/// Which models a server answers for.
enum Served {
    /// Exactly these (the models named to `flowrt serve`).
    Fixed(Vec<Arc<ModelSpec>>),
    /// Every model in the registry, as it is now.
    Registry(RegistryModels),
}

/// Loads, serves and unloads the models of a server.
pub struct ModelManager {
    served: Served,
    resident: Arc<Mutex<HashMap<String, Resident>>>,
    /// What each model (by id and SHA-256) was estimated to hold when it last loaded: the
    /// reservation for its next load, which is then exact before the load instead of only
    /// its file size.
    known_bytes: Arc<Mutex<HashMap<(String, String), u64>>>,
    config: Arc<ServerConfig>,
    metrics: Arc<Metrics>,
    preloading: AtomicBool,
    /// Requests waiting for room in the memory budget, in arrival order.
    room: Mutex<RoomQueue>,
    /// Set when the server shuts down (the same flag as [`crate::AppState::draining`]):
    /// requests waiting for room then give up at once.
    draining: Arc<AtomicBool>,
}

/// How often a request waiting for room in the memory budget looks again.
const ROOM_POLL: Duration = Duration::from_millis(20);

/// Requests waiting for room in the memory budget: tickets in arrival order, each with the
/// model it wants. Only the first may load; the rest wait behind it, so a large model is not
/// kept out for good by smaller ones that keep fitting before it.
#[derive(Default)]
struct RoomQueue {
    next: u64,
    waiting: VecDeque<(u64, String)>,
}

/// A request's place in the [`RoomQueue`]; dropping it (the request loaded, gave up, or its
/// client went away) gives the place up.
struct RoomTicket<'a> {
    queue: &'a Mutex<RoomQueue>,
    ticket: u64,
}

impl RoomTicket<'_> {
    fn is_first(&self) -> bool {
        lock(self.queue).waiting.front().map(|w| w.0) == Some(self.ticket)
    }
}

impl Drop for RoomTicket<'_> {
    fn drop(&mut self) {
        lock(self.queue).waiting.retain(|w| w.0 != self.ticket);
    }
}

/// Why [`make_room`] found no room.
enum NoRoom {
    /// The model is larger than the whole budget: it never fits.
    Never(ApiError),
    /// The models in the budget are busy or loading; room may come when they go idle.
    Busy,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a model is resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelState {
    Unloaded,
    Loading,
    Ready,
}

impl ModelManager {
    pub fn new(
        specs: Vec<ModelSpec>,
        config: Arc<ServerConfig>,
        metrics: Arc<Metrics>,
    ) -> ModelManager {
        ModelManager::with(
            Served::Fixed(specs.into_iter().map(Arc::new).collect()),
            config,
            metrics,
        )
    }

    /// A manager for every model registered in the flowrt home `home` (see
    /// [`crate::registry`]); fails if the registry cannot be read.
    pub fn from_registry(
        home: PathBuf,
        config: Arc<ServerConfig>,
        metrics: Arc<Metrics>,
    ) -> Result<ModelManager, StoreError> {
        let models = RegistryModels::open(home)?;
        Ok(ModelManager::with(
            Served::Registry(models),
            config,
            metrics,
        ))
    }

    fn with(served: Served, config: Arc<ServerConfig>, metrics: Arc<Metrics>) -> ModelManager {
        ModelManager {
            served,
            resident: Arc::new(Mutex::new(HashMap::new())),
            known_bytes: Arc::new(Mutex::new(HashMap::new())),
            config,
            metrics,
            preloading: AtomicBool::new(false),
            room: Mutex::new(RoomQueue::default()),
            draining: Arc::default(),
        }
    }

    /// The flag that says the server is shutting down (see [`crate::AppState::draining`]).
    pub fn draining_flag(&self) -> Arc<AtomicBool> {
        self.draining.clone()
    }

    /// The flowrt home whose registry this server serves, if it serves one.
    pub fn registry_home(&self) -> Option<&Path> {
        match &self.served {
            Served::Fixed(_) => None,
            Served::Registry(r) => Some(r.home()),
        }
    }

    /// Every model this server answers for now (for a registry, as it is now).
    pub fn specs(&self) -> Vec<Arc<ModelSpec>> {
        match &self.served {
            Served::Fixed(specs) => specs.clone(),
            Served::Registry(r) => r.specs(),
        }
    }

    /// The spec a request's model name means, or 404 `model_not_found`. A fixed list
    /// matches an id or alias exactly; a registry resolves the name by its rules (a tag, or a
    /// bare family naming one registered model). `NAME:latest` that matches nothing means
    /// `NAME` (Ollama clients add it). Nothing else matches.
    pub fn find(&self, name: &str) -> Result<Arc<ModelSpec>, ApiError> {
        let specs = match &self.served {
            Served::Registry(r) => return r.resolve(name),
            Served::Fixed(specs) => specs,
        };
        let bare = name.strip_suffix(":latest");
        specs
            .iter()
            .find(|s| s.answers_to(name))
            .or_else(|| bare.and_then(|b| specs.iter().find(|s| s.answers_to(b))))
            .cloned()
            .ok_or_else(|| ApiError::model_not_found(name))
    }

    pub fn state(&self, id: &str) -> ModelState {
        match lock(&self.resident).get(id) {
            None => ModelState::Unloaded,
            Some(Resident::Loading { .. }) => ModelState::Loading,
            Some(Resident::Ready(_)) => ModelState::Ready,
        }
    }

    /// True while [`ModelManager::preload`] runs.
    pub fn is_preloading(&self) -> bool {
        self.preloading.load(Ordering::SeqCst)
    }

    /// The resident models.
    pub fn running(&self) -> Vec<Arc<Runner>> {
        let mut v: Vec<Arc<Runner>> = lock(&self.resident)
            .values()
            .filter_map(|r| match r {
                Resident::Ready(r) => Some(r.clone()),
                Resident::Loading { .. } => None,
            })
            .collect();
        v.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
        v
    }

    pub fn gauges(&self) -> Vec<ModelGauges> {
        let running = self.running();
        let room: Vec<String> = lock(&self.room)
            .waiting
            .iter()
            .map(|w| w.1.clone())
            .collect();
        self.specs()
            .iter()
            .map(|s| {
                let r = running.iter().find(|r| r.spec.id == s.id);
                ModelGauges {
                    model: s.id.clone(),
                    queued: r
                        .and_then(|r| r.scheduler.as_ref())
                        .map_or(0, |s| s.counts().queued.load(Ordering::SeqCst)),
                    active: r
                        .and_then(|r| r.scheduler.as_ref())
                        .map_or(0, |s| s.counts().active.load(Ordering::SeqCst))
                        + r.map_or(0, |r| r.embedding.load(Ordering::SeqCst)),
                    loaded: r.is_some(),
                    waiting_memory: room.iter().filter(|id| **id == s.id).count(),
                }
            })
            .collect()
    }

    /// Load each of `ids` now (in order); `/health` says `loading` meanwhile.
    pub async fn preload(&self, ids: &[String]) -> Result<(), ApiError> {
        self.preloading.store(true, Ordering::SeqCst);
        let mut result = Ok(());
        for id in ids {
            if let Err(e) = self.get(id).await {
                result = Err(e);
                break;
            }
        }
        self.preloading.store(false, Ordering::SeqCst);
        result
    }

    /// The runner for the model `name`, loading it if needed. Unknown names are
    /// `model_not_found`.
    pub async fn get(&self, name: &str) -> Result<Arc<Runner>, ApiError> {
        let spec = self.find(name)?;
        // A resident model whose tag now names other bytes (re-registered) is replaced:
        // the name must run the model the registry holds under it.
        for _ in 0..3 {
            let runner = self.get_spec(&spec).await?;
            if runner.spec.sha256 == spec.sha256 && runner.spec.path == spec.path {
                return Ok(runner);
            }
            let mut map = lock(&self.resident);
            if matches!(map.get(&spec.id), Some(Resident::Ready(r)) if Arc::ptr_eq(r, &runner)) {
                tracing::info!(model = %spec.id, "the registry holds other bytes under this tag now; reloading");
                map.remove(&spec.id);
            }
        }
        Err(ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "model `{}` keeps changing in the registry; retry later",
                spec.id
            ),
        ))
    }

    /// The runner for `spec`, loading it if nothing is resident under its id. A load that
    /// does not fit the memory budget while the models in it are busy waits for room (first
    /// come, first served) up to `--memory-wait`.
    async fn get_spec(&self, spec: &Arc<ModelSpec>) -> Result<Arc<Runner>, ApiError> {
        let started = Instant::now();
        let budget = self.config.memory_budget;
        let mut ticket: Option<RoomTicket<'_>> = None;
        let mut rx = loop {
            {
                let mut map = lock(&self.resident);
                match map.get(&spec.id) {
                    Some(Resident::Ready(r)) => {
                        r.touch();
                        return Ok(r.clone());
                    }
                    Some(Resident::Loading { rx, .. }) => break rx.clone(),
                    None => {}
                }
                // Room first: a model whose weights alone exceed the budget is refused before
                // any of it is read, and idle models make way before the load, not after it,
                // so the budget holds while loading too.
                let need = lock(&self.known_bytes)
                    .get(&(spec.id.clone(), spec.sha256.clone()))
                    .copied()
                    .unwrap_or(spec.size);
                let turn = match &ticket {
                    Some(t) => t.is_first(),
                    None => lock(&self.room).waiting.is_empty(),
                };
                if turn {
                    match make_room(&mut map, &spec.id, need, budget) {
                        Ok(evicted) => {
                            for e in evicted {
                                tracing::info!(model = %e, "unloaded to make room for loading {}", spec.id);
                            }
                            let (tx, rx) = watch::channel(None);
                            map.insert(
                                spec.id.clone(),
                                Resident::Loading {
                                    rx: rx.clone(),
                                    bytes: need,
                                },
                            );
                            drop(map);
                            self.start_load(spec.clone(), tx);
                            break rx;
                        }
                        Err(NoRoom::Never(e)) => return Err(e),
                        Err(NoRoom::Busy) => {}
                    }
                }
                if self.draining.load(Ordering::SeqCst) {
                    return Err(ApiError::new(
                        ErrorKind::Unavailable,
                        format!("the server is shutting down; model `{}` was waiting for room in the memory budget and will not be loaded", spec.id),
                    ));
                }
                let waited = started.elapsed();
                if waited >= self.config.memory_wait {
                    return Err(busy_error(&spec.id, need, budget, waited));
                }
                if ticket.is_none() {
                    ticket = Some(self.join_room_queue(&spec.id)?);
                    tracing::info!(model = %spec.id, "waiting for room in the memory budget");
                }
            }
            tokio::time::sleep(ROOM_POLL).await;
        };
        // The place in the queue is given up before the load is awaited.
        drop(ticket);
        let result = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        };
        result.unwrap_or_else(|| {
            Err(ApiError::internal(
                "loading a model",
                &"the loading task ended without a result",
            ))
        })
    }

    /// A place at the end of the queue for room in the memory budget; a 429 when `--queue`
    /// requests already wait.
    fn join_room_queue(&self, id: &str) -> Result<RoomTicket<'_>, ApiError> {
        let mut q = lock(&self.room);
        if q.waiting.len() >= self.config.queue {
            let mut e = ApiError::new(
                ErrorKind::Overloaded,
                format!(
                    "{} requests already wait for room in the memory budget (--max-memory) to load a model; retry later",
                    q.waiting.len()
                ),
            );
            e.retry_after = Some(1);
            return Err(e);
        }
        let ticket = q.next;
        q.next += 1;
        q.waiting.push_back((ticket, id.to_string()));
        Ok(RoomTicket {
            queue: &self.room,
            ticket,
        })
    }

    fn start_load(&self, spec: Arc<ModelSpec>, tx: watch::Sender<LoadResult>) {
        let config = self.config.clone();
        let metrics = self.metrics.clone();
        let resident = self.resident.clone();
        let known_bytes = self.known_bytes.clone();
        let key = (spec.id.clone(), spec.sha256.clone());
        let id = spec.id.clone();
        tracing::info!(model = %id, path = %spec.path.display(), "loading model");
        let check_home = self.registry_home().map(Path::to_path_buf);
        let handle = tokio::task::spawn_blocking(move || {
            load_runner(spec, &config, metrics, check_home.as_deref())
        });
        let budget = self.config.memory_budget;
        // A detached task finishes the load, so a waiter that goes away does not strand it.
        tokio::spawn(async move {
            let result = match handle.await {
                Ok(r) => r,
                Err(e) => Err(ApiError::internal("loading a model", &e)),
            };
            let mut map = lock(&resident);
            let result = result.and_then(|runner| {
                lock(&known_bytes).insert(key, runner.est_bytes);
                let evicted = make_room(&mut map, &id, runner.est_bytes, budget).map_err(|e| match e {
                    NoRoom::Never(e) => e,
                    NoRoom::Busy => busy_error(&id, runner.est_bytes, budget, Duration::ZERO),
                })?;
                for e in evicted {
                    tracing::info!(model = %e, "unloaded to stay within the memory budget");
                }
                tracing::info!(model = %id, n_ctx = runner.n_ctx, est_bytes = runner.est_bytes, "model ready");
                map.insert(id.clone(), Resident::Ready(runner.clone()));
                Ok(runner)
            });
            if result.is_err() {
                map.remove(&id);
            }
            drop(map);
            let _ = tx.send(Some(result));
        });
    }

    /// Unload `id` now if it is resident and idle; returns whether it was unloaded.
    pub fn unload(&self, id: &str) -> bool {
        let mut map = lock(&self.resident);
        let idle = matches!(map.get(id), Some(Resident::Ready(r)) if r.in_flight() == 0);
        if idle {
            map.remove(id);
            tracing::info!(model = %id, "model unloaded");
        }
        idle
    }

    /// Unload every resident model whose keep-alive has run out.
    pub fn unload_expired(&self) {
        let mut map = lock(&self.resident);
        let expired: Vec<String> = map
            .iter()
            .filter_map(|(id, r)| match r {
                Resident::Ready(r) if r.expired() => Some(id.clone()),
                _ => None,
            })
            .collect();
        for id in expired {
            map.remove(&id);
            tracing::info!(model = %id, "keep-alive ran out; model unloaded");
        }
    }

    /// Check keep-alives every second until the manager is dropped.
    pub fn spawn_reaper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(m) = weak.upgrade() else { break };
                m.unload_expired();
            }
        });
    }
}

/// Unload idle models, least recently used first, until `need` more bytes fit `budget`.
/// Returns the ids unloaded; fails when models in use leave too little room.
fn make_room(
    map: &mut HashMap<String, Resident>,
    id: &str,
    need: u64,
    budget: Option<u64>,
) -> Result<Vec<String>, NoRoom> {
    let Some(budget) = budget else {
        return Ok(Vec::new());
    };
    if need > budget {
        return Err(NoRoom::Never(ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "model `{id}` needs about {} ({need} bytes), more than the server's memory budget (--max-memory) of {} ({budget} bytes)",
                human_bytes(need),
                human_bytes(budget)
            ),
        )));
    }
    // What the others hold: loads in progress (their reservations) and resident models.
    let mut used = 0u64;
    let mut idle: Vec<(Instant, String, u64)> = Vec::new();
    for (k, r) in map.iter().filter(|(k, _)| k.as_str() != id) {
        match r {
            Resident::Loading { bytes, .. } => used += bytes,
            Resident::Ready(r) => {
                used += r.est_bytes;
                if r.in_flight() == 0 {
                    idle.push((*lock(&r.last_used), k.clone(), r.est_bytes));
                }
            }
        }
    }
    // Least recently used first; nothing is unloaded unless unloading enough makes room.
    idle.sort();
    let mut freed = 0u64;
    let mut evicted = Vec::new();
    for (_, k, bytes) in idle {
        if used - freed + need <= budget {
            break;
        }
        freed += bytes;
        evicted.push(k);
    }
    if used - freed + need > budget {
        return Err(NoRoom::Busy);
    }
    for k in &evicted {
        map.remove(k);
    }
    Ok(evicted)
}

/// The 503 for a model that found no room in the budget while the models in it stayed busy
/// for `waited`.
fn busy_error(id: &str, need: u64, budget: Option<u64>, waited: Duration) -> ApiError {
    let budget = budget.map_or_else(|| "none".to_string(), human_bytes);
    let mut e = ApiError::new(
        ErrorKind::Unavailable,
        format!(
            "model `{id}` ({}) does not fit the memory budget (--max-memory) of {budget} while the models in it are busy or loading (waited {:.1} s, --memory-wait); retry later",
            human_bytes(need),
            waited.as_secs_f64()
        ),
    );
    e.retry_after = Some(1);
    e
}

/// `bytes` in MiB or GiB, for messages.
fn human_bytes(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// Load a model and start its scheduler (blocking: runs on the blocking pool).
/// With `check_home`, the registry of that home must still hold the spec's file, intact.
fn load_runner(
    spec: Arc<ModelSpec>,
    config: &ServerConfig,
    metrics: Arc<Metrics>,
    check_home: Option<&Path>,
) -> Result<Arc<Runner>, ApiError> {
    let failed = |e: &dyn std::fmt::Display| {
        tracing::error!(model = %spec.id, path = %spec.path.display(), error = %e, "loading failed");
        ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "model `{}` could not be loaded (see the server log)",
                spec.id
            ),
        )
    };
    if let Some(home) = check_home {
        RegistryModels::check_before_load(home, &spec).map_err(|e| failed(&e))?;
    }
    let model = Arc::new(LoadedModel::load(&spec.path).map_err(|e| failed(&e))?);
    let c = &model.model.config;
    let kv_elem = config.engine.kv.bytes() as u64;
    let kv_row = 2 * c.num_hidden_layers as u64 * c.kv_dim() as u64 * kv_elem;
    // An embedder's cache: its sequences times its longest text (at most the batch).
    let embed = EmbedOptions::default();
    let embed_bytes = kv_row * (embed.batch_seqs * embed.batch_tokens) as u64;
    let (scheduler, n_ctx, est_bytes) = if model.generates() {
        let parallel = config.parallel.max(1);
        let engine = BatchStepper::new(&model, &config.engine, parallel).map_err(|e| failed(&e))?;
        let n_ctx = StepEngine::n_ctx(&engine);
        let est_bytes = spec.size + kv_row * n_ctx as u64 * parallel as u64;
        let scheduler = Scheduler::spawn(
            spec.id.clone(),
            model.clone(),
            Box::new(engine),
            &SchedulerConfig {
                queue: config.queue,
                retry_after_s: 1,
            },
            metrics,
        )
        .map_err(|e| failed(&e))?;
        (Some(scheduler), n_ctx, est_bytes)
    } else {
        // What a text may hold: the context asked for, within the model's positions.
        let n_ctx = config
            .engine
            .n_ctx
            .map_or(model.model_ctx(), |n| n.min(model.model_ctx()));
        (None, n_ctx, spec.size + embed_bytes)
    };
    let max_token_bytes = longest_token_bytes(&model.tokenizer);
    Ok(Arc::new(Runner {
        spec,
        model,
        scheduler,
        embedder: Mutex::new(None),
        embedding: AtomicUsize::new(0),
        n_ctx,
        max_token_bytes,
        tokenizing: tokio::sync::Semaphore::new(config.parallel.max(1)),
        tokenize_waiting: AtomicUsize::new(0),
        est_bytes,
        loaded_at: SystemTime::now(),
        last_used: Mutex::new(Instant::now()),
        keep_alive: Mutex::new(config.keep_alive),
    }))
}

/// The most bytes of prompt text any one token of `tok` stands for, at least 1: its
/// decoded bytes (what byte-level BPE and SentencePiece tokens consume of the text: `Ġthe` is
/// ` the`, `▁the` is ` the`, a byte-fallback token one byte), or for a special token the
/// longer of that and its spelling (`<|im_start|>` is matched in the text as spelled).
pub fn longest_token_bytes(tok: &flowrt_text::Tokenizer) -> usize {
    (0..tok.vocab_size() as u32)
        .map(|id| {
            let piece = tok.token_to_piece(id).map_or(0, <[u8]>::len);
            let spelled = match tok.is_special(id) {
                true => tok.id_to_token(id).map_or(0, str::len),
                false => 0,
            };
            piece.max(spelled)
        })
        .max()
        .unwrap_or(0)
        .max(1)
}
