//! `Sampler::sample`, `Sampler::accept` and `StopMatcher::push` must not allocate once
//! warmed up. A counting global allocator (per thread) checks it.

use flowrt_sample::{Sampler, SamplerConfig, StopMatcher};

#[allow(unsafe_code)]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static ALLOCS: Cell<usize> = const { Cell::new(0) };
    }

    fn bump() {
        // try_with: the thread-local may be gone during thread teardown.
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    }

    /// Counts allocations made by the current thread.
    pub fn allocations() -> usize {
        ALLOCS.with(|c| c.get())
    }

    pub struct Counting;

    // SAFETY: every method forwards unchanged to the system allocator, which upholds the
    // GlobalAlloc contract; the only addition is bumping a const-initialised
    // thread-local counter, which itself never allocates.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            bump();
            // SAFETY: same contract as our caller's.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            bump();
            // SAFETY: same contract as our caller's.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            bump();
            // SAFETY: same contract as our caller's.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: same contract as our caller's.
            unsafe { System.dealloc(ptr, layout) }
        }
    }
}

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

fn logits(n: usize, step: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + step * 104_729) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

#[test]
fn steady_state_sampling_and_stop_matching_do_not_allocate() {
    const VOCAB: usize = 50_000;
    let steps: Vec<Vec<f32>> = (0..64).map(|s| logits(VOCAB, s)).collect();
    let configs = [
        SamplerConfig::greedy(),
        SamplerConfig {
            repeat_penalty: 1.1,
            presence_penalty: 0.2,
            frequency_penalty: 0.1,
            seed: Some(1),
            ..SamplerConfig::default()
        },
        // top_k off: top-p has to walk through several sorted blocks.
        SamplerConfig {
            top_k: 0,
            top_p: 0.9,
            min_p: 0.0,
            repeat_penalty: 1.2,
            repeat_last_n: 16,
            seed: Some(2),
            ..SamplerConfig::default()
        },
    ];
    for cfg in configs {
        let mut s = Sampler::new(cfg.clone(), VOCAB).unwrap();
        // Warm-up fills the penalty ring.
        for l in &steps {
            let t = s.sample(l).unwrap();
            s.accept(t);
        }
        let before = counting::allocations();
        for l in &steps {
            let t = s.sample(l).unwrap();
            s.accept(t);
        }
        let n = counting::allocations() - before;
        assert_eq!(n, 0, "{n} allocations in 64 steps with {cfg:?}");
    }

    let pieces = [
        "Hello", " wor", "ld", "<", "|im", "_e", "x", "nd", "|>", " ok",
    ];
    let mut m = StopMatcher::new(vec!["<|im_end|>".into(), "\n\nUser:".into()]);
    for p in pieces {
        m.push(p);
    }
    let before = counting::allocations();
    let mut shown = 0;
    for _ in 0..100 {
        for p in pieces {
            shown += m.push(p).emit.len();
        }
    }
    assert_eq!(counting::allocations() - before, 0);
    assert!(shown > 0);
}
