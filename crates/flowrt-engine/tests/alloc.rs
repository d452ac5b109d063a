//! Steady-state decode performs no heap allocation (issue 2, item 6).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use flowrt_engine::{EngineOptions, LoadedModel, Session};
use flowrt_sample::{Sampler, SamplerConfig};

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// The sizes of the first allocations counted, for the failure message.
static SIZES: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

fn count(size: usize) {
    let i = ALLOCS.fetch_add(1, Ordering::Relaxed);
    if let Some(s) = SIZES.get(i) {
        s.store(size, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            count(l.size());
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            count(n);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One test for every model: the allocation counter is global, so the models run one after
/// another. SmolLM2 (dense), and the fixtures whose layers run other ops: mixtures of experts
/// (routing, grouping tokens per expert, per-expert biases), attention sinks, and LFM2's
/// short convolution.
#[test]
fn decode_steps_do_not_allocate() {
    decode_allocs(&common::smollm2());
    for case in ["qwen3-moe", "gpt-oss", "lfm2", "lfm2-moe"] {
        decode_allocs(&common::fixture(&format!("families/{case}")));
    }
}

fn decode_allocs(path: &std::path::Path) {
    ALLOCS.store(0, Ordering::SeqCst);
    let m = LoadedModel::load(path).unwrap();
    let mut s = Session::new(
        &m,
        &EngineOptions {
            threads: 2,
            n_ctx: Some(128),
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let mut sampler = Sampler::new(
        SamplerConfig {
            temperature: 0.7,
            seed: Some(1),
            ..SamplerConfig::default()
        },
        s.vocab_size(),
    )
    .unwrap();
    let prompt = m
        .tokenizer
        .encode("Counting allocations while decoding", false, false)
        .unwrap();
    let mut tok = sampler.sample(s.feed(&prompt).unwrap()).unwrap();
    // Warm up: first decode steps may size buffers. Between them the device thread is left
    // idle long enough to park on its command channel: the first park grows the channel's
    // list of waiting threads once (std's implementation), which a machine quick enough to
    // hand it each step while it still spins would otherwise leave to a later step.
    for _ in 0..4 {
        sampler.accept(tok);
        tok = sampler.sample(s.feed(&[tok]).unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..32 {
        sampler.accept(tok);
        tok = sampler.sample(s.feed(&[tok]).unwrap()).unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    let sizes: Vec<usize> = SIZES.iter().map(|s| s.load(Ordering::SeqCst)).collect();
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "heap allocations during 32 decode steps of {} (the first ones' sizes: {sizes:?})",
        path.display()
    );
}
