//! Sessions open their backend through the factory from generic settings: the backend's own
//! options reach it, one it does not take is refused naming it, and what it reserved is what
//! the session reports.

mod common;

use flowrt_engine::{
    BackendKind, EngineError, EngineOptions, KvPrecision, LoadedModel, OpenError, Session,
};

fn model() -> LoadedModel {
    LoadedModel::load(&common::fixture("families/llama-tied")).unwrap()
}

fn opts() -> EngineOptions {
    EngineOptions {
        threads: 2,
        n_ctx: Some(32),
        max_batch: 8,
        ..EngineOptions::default()
    }
}

#[test]
fn unknown_backend_option_is_refused_naming_it() {
    let m = model();
    let e = Session::new(&m, &opts().with_option("colour", "red"))
        .err()
        .expect("an option the CPU does not take must be refused");
    assert!(
        matches!(e, EngineError::Backend(OpenError::Cpu(_))),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("cpu backend") && msg.contains("`colour`"),
        "{msg}"
    );
    let e = Session::new(&m, &opts().with_option("act-quant", "q3"))
        .err()
        .expect("a bad value must be refused");
    assert!(e.to_string().contains("`act-quant=q3`"), "{e}");
}

#[test]
fn backend_options_reach_the_cpu() {
    let m = model();
    let s = Session::new(&m, &opts().with_option("kernels", "scalar")).unwrap();
    let i = s.backend_info();
    assert_eq!(
        (i.name.as_str(), i.kernels.as_str(), i.threads),
        ("cpu", "scalar", 2)
    );
    assert!(!i.device.is_empty());
    // The session reports the bytes the backend reserved: f32 twice f16.
    let c = &m.model.config;
    let f16 = 2 * c.num_hidden_layers * 32 * c.num_key_value_heads * c.head_dim * 2;
    assert_eq!(s.kv_cache_bytes(), f16 as u64);
    assert_eq!(s.kv_cache_bytes(), i.kv_cache_bytes);
    let s = Session::new(
        &m,
        &EngineOptions {
            kv: KvPrecision::F32,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(s.kv_cache_bytes(), 2 * f16 as u64);
}

/// Vulkan is not built yet (and this machine may have no device): the session fails with an
/// error naming Vulkan, never a panic and never a CPU session in its place.
#[test]
fn vulkan_session_fails_cleanly_or_runs_on_vulkan() {
    let m = model();
    let o = EngineOptions {
        backend: BackendKind::Vulkan,
        ..opts()
    };
    match Session::new(&m, &o) {
        Ok(s) => assert_eq!(s.backend_info().name, "vulkan"),
        Err(e) => assert!(e.to_string().starts_with("vulkan backend:"), "{e}"),
    }
}
