//! Serving the model registry: a server started without model arguments answers for every
//! model registered in its flowrt home, by tag or bare family, loads each on its first
//! request, follows the registry as it changes, and answers 404 `model_not_found` for a
//! name that resolves to no registered model — never another model.
//!
//! Each test has its own temporary flowrt home whose registry points at the real SmolLM2
//! (`FLOWRT_SMOLLM2_GGUF`); models are driven through `app(state)` without a socket.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use flowrt_server::{app, AppState, ModelState, ServerConfig};
use flowrt_store::{now_rfc3339, Entry, ModelFormat, ModelInfo, ModelSource, Registry};
use serde_json::{json, Value};

/// SmolLM2's SHA-256 (hashed once per test binary).
fn smollm2_sha256() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| flowrt_store::sha256_file(&smollm2()).unwrap())
}

/// A registry entry for the SmolLM2 file at `path`, as `flowrt add` records it.
fn entry(tag: &str, path: &Path) -> Entry {
    Entry {
        tag: tag.to_string(),
        path: path.to_path_buf(),
        format: ModelFormat::Gguf,
        info: ModelInfo {
            architecture: "llama".into(),
            context_length: 8192,
            parameters: 134_515_008,
            quantization: "q4_1".into(),
        },
        size_bytes: std::fs::metadata(path).unwrap().len(),
        sha256: smollm2_sha256().to_string(),
        source: ModelSource::Local,
        origin: format!("test copy of {}", path.display()),
        added_at: now_rfc3339(),
    }
}

/// A flowrt home with `tags` registered, each to the SmolLM2 file.
fn home_with(tags: &[&str]) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let mut registry = Registry::open(home.path()).unwrap();
    for tag in tags {
        registry.add(entry(tag, &smollm2()), false).unwrap();
    }
    home
}

fn registry_state(home: &Path, cfg: ServerConfig) -> AppState {
    AppState::from_registry(home.to_path_buf(), cfg).unwrap()
}

/// A server for the tags `a:1` and `b:1` (both SmolLM2) with room in its memory budget for
/// one SmolLM2 (weights plus a small KV cache), not two; `cfg` gives the rest of its settings.
fn room_for_one(cfg: ServerConfig) -> (tempfile::TempDir, AppState, axum::Router) {
    let home = home_with(&["a:1", "b:1"]);
    let size = std::fs::metadata(smollm2()).unwrap().len();
    let cfg = ServerConfig {
        memory_budget: Some(2 * size - 1),
        ..cfg
    };
    let state = registry_state(home.path(), cfg);
    let app = app(state.clone());
    (home, state, app)
}

/// The ids of the resident models, in order.
fn resident(state: &AppState) -> Vec<String> {
    state
        .models
        .running()
        .iter()
        .map(|r| r.spec.id.clone())
        .collect()
}

fn chat(model: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "temperature": 0,
        "max_tokens": 3,
    })
}

fn assert_not_found(r: &Reply, needle: &str) {
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "model_not_found", "{}", r.text());
    assert_eq!(e["param"], "model", "{}", r.text());
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(needle), "`{needle}` not in: {msg}");
    assert!(
        !msg.contains(&*smollm2().to_string_lossy()),
        "a 404 must not name files: {msg}"
    );
}

#[tokio::test]
async fn registered_models_are_listed_with_the_registry_metadata() {
    let home = home_with(&["smollm2:135m"]);
    let app = app(registry_state(home.path(), config()));
    let size = std::fs::metadata(smollm2()).unwrap().len();

    let r = get(&app, "/v1/models").await;
    assert_eq!(r.status, StatusCode::OK);
    let data = r.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 1, "{data:?}");
    let m = &data[0];
    assert_eq!(m["id"], "smollm2:135m");
    assert_eq!(m["sha256"], smollm2_sha256());
    assert_eq!(m["size"], size);
    assert_eq!(m["source"], "local");
    assert_eq!(m["format"], "gguf");
    assert_eq!(m["aliases"], json!(["smollm2"]));
    assert!(m["origin"].as_str().unwrap().starts_with("test copy of"));
    assert_eq!(m["architecture"], "llama");
    assert_eq!(m["quantization"], "Q4_1");
    assert_eq!(m["max_context_length"], 8192);
    assert_eq!(m["context_length"], N_CTX);
    assert_eq!(m["loaded"], false);

    // The bare family and Ollama's `:latest` answer with the tag.
    for name in ["smollm2:135m", "smollm2", "smollm2:latest"] {
        let r = get(&app, &format!("/v1/models/{name}")).await;
        assert_eq!(r.status, StatusCode::OK, "{name}: {}", r.text());
        assert_eq!(r.json()["id"], "smollm2:135m");
    }

    let r = get(&app, "/api/tags").await;
    assert_eq!(r.status, StatusCode::OK);
    let t = &r.json()["models"][0];
    assert_eq!(t["name"], "smollm2:135m");
    assert_eq!(t["digest"], smollm2_sha256());
    assert_eq!(t["size"], size);
    assert_eq!(t["details"]["quantization_level"], "Q4_1");

    let r = post(&app, "/api/show", &json!({"model": "smollm2"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let info = &r.json()["model_info"];
    assert_eq!(info["flowrt.sha256"], smollm2_sha256());
    assert_eq!(info["flowrt.source"], "local");
    assert_eq!(info["flowrt.format"], "gguf");

    let r = get(&app, "/health").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["models"]["smollm2:135m"], "unloaded");
}

#[tokio::test]
async fn a_registered_tag_loads_on_its_first_request_and_names_itself() {
    let home = home_with(&["smollm2:135m"]);
    let state = registry_state(home.path(), config());
    let app = app(state.clone());
    assert_eq!(state.models.state("smollm2:135m"), ModelState::Unloaded);

    // Asked for by its bare family: the response names the tag that ran.
    let r = post(&app, "/v1/chat/completions", &chat("smollm2")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["model"], "smollm2:135m");
    assert_eq!(state.models.state("smollm2:135m"), ModelState::Ready);

    let r = get(&app, "/api/ps").await;
    let ps = &r.json()["models"][0];
    assert_eq!(ps["name"], "smollm2:135m");
    assert_eq!(ps["digest"], smollm2_sha256());

    let r = post(
        &app,
        "/api/generate",
        &json!({"model": "smollm2:latest", "prompt": "Hi", "stream": false,
                "options": {"temperature": 0, "num_predict": 2}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["model"], "smollm2:135m");
}

#[tokio::test]
async fn names_the_registry_does_not_resolve_are_404_never_another_model() {
    // Two sizes of a family that is not in the catalog: its bare name is ambiguous.
    let home = home_with(&["smollm2:135m", "tiny:1", "tiny:2"]);
    let state = registry_state(home.path(), config());
    let app = app(state.clone());

    // Not registered at all.
    let r = post(&app, "/v1/chat/completions", &chat("llama3:8b")).await;
    assert_not_found(&r, "llama3:8b");
    // A catalog model that is not registered here, by tag and by its catalog alias.
    let r = post(&app, "/v1/chat/completions", &chat("gemma3:270m")).await;
    assert_not_found(&r, "gemma3:270m");
    let r = post(&app, "/v1/chat/completions", &chat("gemma3")).await;
    assert_not_found(&r, "gemma3:270m");
    // A family with several registered sizes names none of them.
    let r = post(&app, "/v1/chat/completions", &chat("tiny")).await;
    assert_not_found(&r, "tiny:1, tiny:2");
    // A size that is not registered, and a path-like name.
    let r = post(&app, "/v1/chat/completions", &chat("smollm2:360m")).await;
    assert_not_found(&r, "smollm2:360m");
    let r = post(
        &app,
        "/v1/completions",
        &json!({"model": "../registry.json", "prompt": "x"}),
    )
    .await;
    assert_not_found(&r, "../registry.json");
    // The same on the Ollama routes, in Ollama's error shape.
    let r = post(
        &app,
        "/api/chat",
        &json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("llama3"));
    let r = post(&app, "/api/show", &json!({"model": "tiny"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());

    // Nothing was loaded by any of them.
    assert!(state.models.running().is_empty());
}

#[tokio::test]
async fn the_server_follows_the_registry_while_it_runs() {
    let home = home_with(&["smollm2:135m"]);
    let state = registry_state(home.path(), config());
    let app = app(state.clone());
    let r = get(&app, "/v1/models/mine:1").await;
    assert_not_found(&r, "mine:1");

    // `flowrt add mine:1 ...` while the server runs: listed and served.
    let mut registry = Registry::open(home.path()).unwrap();
    registry.add(entry("mine:1", &smollm2()), false).unwrap();
    let ids: Vec<Value> = get(&app, "/v1/models").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!("mine:1"), json!("smollm2:135m")]);
    let r = post(&app, "/v1/chat/completions", &chat("mine")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["model"], "mine:1");

    // Re-registered to other bytes under the same tag: the next request runs the new file.
    let copy_dir = tempfile::tempdir().unwrap();
    let copy: PathBuf = copy_dir.path().join("copy.gguf");
    std::fs::copy(smollm2(), &copy).unwrap();
    registry.add(entry("mine:1", &copy), true).unwrap();
    let before = state
        .models
        .running()
        .into_iter()
        .find(|r| r.spec.id == "mine:1")
        .unwrap();
    assert_eq!(before.spec.path, smollm2());
    let r = post(&app, "/v1/chat/completions", &chat("mine:1")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let after = state
        .models
        .running()
        .into_iter()
        .find(|r| r.spec.id == "mine:1")
        .unwrap();
    assert_eq!(after.spec.path, copy, "the re-registered file runs");

    // `flowrt rm mine:1`: no longer listed or served, even though it is still resident.
    registry.remove("mine:1").unwrap();
    let r = post(&app, "/v1/chat/completions", &chat("mine:1")).await;
    assert_not_found(&r, "mine:1");
    let r = get(&app, "/api/tags").await;
    assert_eq!(r.json()["models"].as_array().unwrap().len(), 1);

    // A registry left unreadable: the server keeps serving what it last read.
    std::fs::write(home.path().join("registry.json"), "{ not json").unwrap();
    let r = get(&app, "/v1/models/smollm2:135m").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

#[tokio::test]
async fn registered_models_load_within_the_memory_budget_least_recently_used_out() {
    let (_home, state, app) = room_for_one(config());

    let r = post(&app, "/v1/chat/completions", &chat("a:1")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(resident(&state), ["a:1"]);
    let r = post(&app, "/v1/chat/completions", &chat("b:1")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["model"], "b:1");
    assert_eq!(resident(&state), ["b:1"], "a:1 made room for b:1");
}

#[tokio::test]
async fn a_model_larger_than_the_memory_budget_is_refused_before_loading() {
    // The registered file is not even a model: had the server read it, the error would be
    // about the file. The budget check comes first and names both sizes.
    let home = tempfile::tempdir().unwrap();
    let junk = home.path().join("junk.gguf");
    std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    Registry::open(home.path())
        .unwrap()
        .add(entry("junk:1", &junk), false)
        .unwrap();
    let cfg = ServerConfig {
        memory_budget: Some(512 << 10),
        ..config()
    };
    let state = registry_state(home.path(), cfg);
    let app = app(state.clone());
    let r = post(&app, "/v1/chat/completions", &chat("junk:1")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("needs about 1.0 MiB (1048576 bytes)")
            && msg.contains("--max-memory) of 0.5 MiB (524288 bytes)"),
        "{msg}"
    );
    assert!(state.models.running().is_empty());
}

#[tokio::test]
async fn concurrent_loads_of_two_models_never_overrun_the_memory_budget() {
    // Room for one SmolLM2. Two requests for two tags arrive together: the first load
    // reserves its size, so the second (with --memory-wait 0) is told to retry instead of
    // loading a second copy beside it (which would then evict the first, after the fact).
    let (_home, state, app) = room_for_one(ServerConfig {
        memory_wait: Duration::ZERO,
        ..config()
    });
    let (ca, cb) = (chat("a:1"), chat("b:1"));
    let (ra, rb) = tokio::join!(
        post(&app, "/v1/chat/completions", &ca),
        post(&app, "/v1/chat/completions", &cb)
    );
    let mut statuses = [ra.status, rb.status];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE],
        "{} / {}",
        ra.text(),
        rb.text()
    );
    let refused = if ra.status == StatusCode::OK {
        &rb
    } else {
        &ra
    };
    assert!(refused.text().contains("retry later"), "{}", refused.text());
    assert_eq!(state.models.running().len(), 1);
    // Once the first is idle, the second makes room for itself.
    let other = if ra.status == StatusCode::OK {
        "b:1"
    } else {
        "a:1"
    };
    let r = post(&app, "/v1/chat/completions", &chat(other)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(resident(&state), [other]);
}

/// Watches `ids` every millisecond until the returned flag is set, and keeps the most of
/// them that were loading or resident at once.
fn watch_resident(state: &AppState, ids: &[&str]) -> (Arc<AtomicBool>, Arc<AtomicUsize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let (state, ids) = (
        state.clone(),
        ids.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    );
    let (s2, m2) = (stop.clone(), most.clone());
    tokio::spawn(async move {
        while !s2.load(Ordering::SeqCst) {
            let n = ids
                .iter()
                .filter(|id| state.models.state(id) != ModelState::Unloaded)
                .count();
            m2.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    (stop, most)
}

/// A chat that keeps `model` busy for a while (1900 tokens, end of text ignored).
fn long_chat(model: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "temperature": 0,
        "max_tokens": 1900,
        "ignore_eos": true,
    })
}

/// `flowrt_requests_waiting_for_memory` for `model` in /metrics.
async fn waiting_for_memory(app: &axum::Router, model: &str) -> usize {
    let text = get(app, "/metrics").await.text();
    let prefix = format!("flowrt_requests_waiting_for_memory{{model=\"{model}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_load_that_does_not_fit_waits_for_the_busy_model_to_go_idle() {
    // Room for one SmolLM2, and the default --memory-wait: two requests for two tags that
    // arrive together are both answered, one model after the other, and at no moment are
    // two loaded or loading.
    let (_home, state, app) = room_for_one(config());
    let (stop, most) = watch_resident(&state, &["a:1", "b:1"]);
    let (ca, cb) = (chat("a:1"), chat("b:1"));
    let (ra, rb) = tokio::join!(
        post(&app, "/v1/chat/completions", &ca),
        post(&app, "/v1/chat/completions", &cb)
    );
    stop.store(true, Ordering::SeqCst);
    assert_eq!(ra.status, StatusCode::OK, "{}", ra.text());
    assert_eq!(rb.status, StatusCode::OK, "{}", rb.text());
    assert_eq!(ra.json()["model"], "a:1");
    assert_eq!(rb.json()["model"], "b:1");
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two models were in memory at once"
    );
    assert_eq!(state.models.running().len(), 1);
    assert_eq!(waiting_for_memory(&app, "a:1").await, 0);
    assert_eq!(waiting_for_memory(&app, "b:1").await, 0);
}

#[tokio::test]
async fn a_request_waiting_for_room_is_counted_bounded_and_gives_up_after_the_wait() {
    // a:1 generates for a while; b:1 (no room beside it) waits and shows in /metrics; c:1,
    // behind it, is refused with a 429 (--queue 1); a request whose client goes away gives
    // its place up; b:1 gets a 503 naming the wait once --memory-wait has passed, and at
    // once when the server shuts down.
    let home = home_with(&["a:1", "b:1", "c:1"]);
    // A context long enough that a:1 stays busy for seconds on any machine (the busy request
    // is cut off at the end); the budget fits one model with this context, not two.
    let long_ctx = ServerConfig {
        engine: flowrt_engine::EngineOptions {
            n_ctx: Some(2048),
            ..config().engine
        },
        ..config()
    };
    let one = {
        let state = registry_state(home.path(), long_ctx.clone());
        let r = post(&app(state.clone()), "/v1/chat/completions", &chat("a:1")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        state.models.running()[0].est_bytes
    };
    let wait = Duration::from_millis(1500);
    let cfg = ServerConfig {
        memory_budget: Some(one * 3 / 2),
        memory_wait: wait,
        queue: 1,
        ..long_ctx
    };
    let state = registry_state(home.path(), cfg);
    let app = app(state.clone());
    let r = post(&app, "/v1/chat/completions", &chat("a:1")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    let busy = tokio::spawn({
        let app = app.clone();
        async move { post(&app, "/v1/chat/completions", &long_chat("a:1")).await }
    });
    // The long request is running once a:1 has a sequence in flight.
    let started = std::time::Instant::now();
    while state.models.running()[0].in_flight() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "a:1 never got busy"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A client that goes away while waiting gives its place up.
    let gone = tokio::time::timeout(
        Duration::from_millis(200),
        post(&app, "/v1/chat/completions", &chat("c:1")),
    )
    .await;
    assert!(gone.is_err(), "c:1 was answered although a:1 is busy");
    assert_eq!(waiting_for_memory(&app, "c:1").await, 0);

    let t0 = std::time::Instant::now();
    let waiter = tokio::spawn({
        let app = app.clone();
        async move { post(&app, "/v1/chat/completions", &chat("b:1")).await }
    });
    while waiting_for_memory(&app, "b:1").await == 0 {
        assert!(t0.elapsed() < wait, "b:1 never showed as waiting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let full = post(&app, "/v1/chat/completions", &chat("c:1")).await;
    assert_eq!(
        full.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        full.text()
    );
    assert!(full.text().contains("wait for room"), "{}", full.text());

    let r = waiter.await.unwrap();
    let took = t0.elapsed();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(
        r.text().contains("--memory-wait") && r.text().contains("retry later"),
        "{}",
        r.text()
    );
    assert!(took >= wait, "b:1 gave up after {took:?}, before its wait");
    assert!(
        !busy.is_finished(),
        "a:1 finished too soon for this test to show anything"
    );
    assert_eq!(waiting_for_memory(&app, "b:1").await, 0);

    // At shutdown a waiting request gives up at once.
    let waiter = tokio::spawn({
        let app = app.clone();
        async move { post(&app, "/v1/chat/completions", &chat("b:1")).await }
    });
    while waiting_for_memory(&app, "b:1").await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t1 = std::time::Instant::now();
    state
        .draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let r = waiter.await.unwrap();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(r.text().contains("shutting down"), "{}", r.text());
    assert!(
        t1.elapsed() < wait / 2,
        "the waiter took {:?} to give up at shutdown",
        t1.elapsed()
    );
    assert!(!busy.is_finished());
    busy.abort();
}

#[tokio::test]
async fn a_registered_file_that_changed_is_not_loaded() {
    // Registered with a size the file no longer has: loading refuses it (503), and the
    // client is not told where the file is.
    let home = tempfile::tempdir().unwrap();
    let mut e = entry("smollm2:135m", &smollm2());
    e.size_bytes += 1;
    Registry::open(home.path()).unwrap().add(e, false).unwrap();
    let state = registry_state(home.path(), config());
    let app = app(state.clone());
    let r = post(&app, "/v1/chat/completions", &chat("smollm2:135m")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "model_unavailable");
    assert!(!r.text().contains(&*smollm2().to_string_lossy()));
    assert!(state.models.running().is_empty());
}
