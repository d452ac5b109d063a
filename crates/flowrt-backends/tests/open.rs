//! Opening backends through the factory on a tiny model: the CPU opens with generic settings
//! and its own options, unknown options are refused naming them, Vulkan fails cleanly.

use std::sync::Arc;

use flowrt_backends::{open, BackendKind, OpenError};
use flowrt_dispatch::{BackendSettings, KvPrecision};
use flowrt_gguf::write::{f32_bytes, GgufBuilder};
use flowrt_gguf::{GgmlType, GgufFile};
use flowrt_model::Model;

const H: u64 = 8;
const FF: u64 = 16;
const VOCAB: u64 = 10;

/// A tiny llama (2 layers, 4:2 heads of 2, f32 weights).
fn tiny() -> Arc<Model> {
    let mut b = GgufBuilder::new();
    b.kv("general.architecture", "llama")
        .kv("llama.block_count", 2u32)
        .kv("llama.context_length", 64u32)
        .kv("llama.embedding_length", H as u32)
        .kv("llama.feed_forward_length", FF as u32)
        .kv("llama.attention.head_count", 4u32)
        .kv("llama.attention.head_count_kv", 2u32)
        .kv("llama.attention.layer_norm_rms_epsilon", 1e-5f32)
        .kv("llama.vocab_size", VOCAB as u32);
    let mut add = |name: String, dims: &[u64]| {
        let n: u64 = dims.iter().product();
        b.tensor(name, dims, GgmlType::F32, f32_bytes(&vec![0.5; n as usize]));
    };
    add("token_embd.weight".into(), &[H, VOCAB]);
    add("output_norm.weight".into(), &[H]);
    for l in 0..2 {
        add(format!("blk.{l}.attn_norm.weight"), &[H]);
        add(format!("blk.{l}.attn_q.weight"), &[H, H]);
        add(format!("blk.{l}.attn_k.weight"), &[H, 4]);
        add(format!("blk.{l}.attn_v.weight"), &[H, 4]);
        add(format!("blk.{l}.attn_output.weight"), &[H, H]);
        add(format!("blk.{l}.ffn_norm.weight"), &[H]);
        add(format!("blk.{l}.ffn_gate.weight"), &[H, FF]);
        add(format!("blk.{l}.ffn_up.weight"), &[H, FF]);
        add(format!("blk.{l}.ffn_down.weight"), &[FF, H]);
    }
    let file = GgufFile::from_bytes(b.to_bytes()).unwrap();
    Arc::new(Model::from_gguf(Arc::new(file)).unwrap())
}

fn settings(options: &[(&str, &str)]) -> BackendSettings {
    BackendSettings {
        threads: 2,
        n_ctx: 16,
        n_seq: 3,
        max_batch: 4,
        kv: KvPrecision::F32,
        device: None,
        options: options
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn cpu_opens_with_generic_settings_and_its_options() {
    let b = open(
        BackendKind::Cpu,
        tiny(),
        &settings(&[
            ("kernels", "scalar"),
            ("act-quant", "q8"),
            ("repack", "false"),
        ]),
    )
    .unwrap();
    let i = b.info();
    assert_eq!(i.name, "cpu");
    assert_eq!(i.kernels, "scalar");
    assert_eq!(i.threads, 2);
    assert_eq!(i.prepared_weight_bytes, 0);
    // K and V, 2 layers, 3 sequences, 16 positions, 2 KV heads of 2, 4-byte elements.
    assert_eq!(i.kv_cache_bytes, 2 * 2 * 3 * 16 * 2 * 2 * 4);
    assert_eq!((b.n_ctx(), b.n_seq(), b.max_batch()), (16, 3, 4));
}

#[test]
fn unknown_and_bad_options_are_named() {
    let e = open(BackendKind::Cpu, tiny(), &settings(&[("colour", "blue")]))
        .err()
        .expect("an unknown option must be refused");
    assert!(matches!(e, OpenError::Cpu(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("cpu backend") && msg.contains("`colour`") && msg.contains("kernels"),
        "{msg}"
    );
    for (name, value) in [
        ("kernels", "sse9"),
        ("act-quant", "q4"),
        ("repack", "maybe"),
        ("attn-split", "0"),
    ] {
        let e = open(BackendKind::Cpu, tiny(), &settings(&[(name, value)]))
            .err()
            .unwrap_or_else(|| panic!("{name}={value} must be refused"));
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("`{name}={value}`")),
            "{name}={value}: {msg}"
        );
    }
    // A device index means nothing to the CPU.
    let e = open(
        BackendKind::Cpu,
        tiny(),
        &BackendSettings {
            device: Some(1),
            ..settings(&[])
        },
    )
    .err()
    .expect("--device on the CPU must be refused");
    assert!(e.to_string().contains("device"), "{e}");
}

/// The Vulkan backend is still being built, and this machine may have no Vulkan device at all:
/// opening it gives a Vulkan backend or an error naming Vulkan, never a panic or a CPU
/// backend; a CPU option is refused naming it.
#[test]
fn vulkan_opens_or_fails_cleanly() {
    match open(BackendKind::Vulkan, tiny(), &settings(&[])) {
        Ok(b) => assert_eq!(b.info().name, "vulkan"),
        Err(e) => assert!(e.to_string().starts_with("vulkan backend:"), "{e}"),
    }
    let e = open(
        BackendKind::Vulkan,
        tiny(),
        &settings(&[("kernels", "scalar")]),
    )
    .err()
    .expect("the CPU's `kernels` must be refused by Vulkan");
    assert!(matches!(e, OpenError::Vulkan(_)), "{e:?}");
    assert!(e.to_string().contains("`kernels`"), "{e}");
}

#[test]
fn empty_caches_and_batches_are_refused() {
    for s in [
        BackendSettings {
            n_ctx: 0,
            ..settings(&[])
        },
        BackendSettings {
            n_seq: 0,
            ..settings(&[])
        },
        BackendSettings {
            max_batch: 0,
            ..settings(&[])
        },
    ] {
        let e = open(BackendKind::Cpu, tiny(), &s)
            .err()
            .expect("must be refused");
        assert!(matches!(e, OpenError::Settings { .. }), "{e:?}");
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
}

#[test]
fn auto_opens_what_resolve_picks() {
    let want = flowrt_backends::resolve(BackendKind::Auto);
    match open(BackendKind::Auto, tiny(), &settings(&[])) {
        Ok(b) => assert_eq!(b.info().name, want.name()),
        Err(e) => {
            assert_eq!(want, BackendKind::Vulkan, "the CPU must open: {e}");
            assert!(e.to_string().starts_with("vulkan backend:"), "{e}");
        }
    }
}
