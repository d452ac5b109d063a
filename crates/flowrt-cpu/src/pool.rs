//! A small persistent thread pool for the forward pass.
//!
//! `run` hands one borrowed closure to every thread (the caller is thread 0) and returns when
//! all have finished. Workers spin briefly between jobs (ops follow each other within
//! microseconds during a forward pass) and then sleep on a condition variable, so an idle
//! runtime costs no CPU. Nothing is allocated per job.
//!
//! This file holds the crate's only `unsafe`: erasing the lifetime of the borrowed closure
//! while `run` waits for every worker, and handing disjoint mutable parts of one buffer to
//! different threads.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    /// The current job. Written only by `run` while no worker reads it (between generations).
    job: UnsafeCell<Option<*const Job>>,
    /// Bumped by `run` to publish a job.
    generation: AtomicUsize,
    /// Workers that finished the current generation.
    done: AtomicUsize,
    /// A worker's job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the thread inside `run` before it publishes a new
// generation (Release) and read by workers after they observe it (Acquire); `run` does not
// return (and so does not write again) until every worker has reported `done`.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced under the protocol above.
unsafe impl Send for Shared {}

/// A fixed set of threads that run jobs together.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

/// Spin iterations before a worker goes to sleep (tens of microseconds).
const SPIN_LIMIT: usize = 1 << 16;

impl ThreadPool {
    /// A pool of `n_threads` threads in total, the calling thread included.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            generation: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|tid| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("flowrt-worker-{tid}"))
                    .spawn(move || worker(shared, tid, n_threads))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            n_threads,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Run `f(thread_index, n_threads)` on every thread of the pool and wait for all.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n_threads == 1 {
            f(0, 1);
            return;
        }
        let s = &*self.shared;
        // SAFETY: the lifetime of `f` is erased only for the duration of this call: workers
        // read the pointer after the generation bump below and we wait until all of them
        // have finished with it before returning.
        let erased: *const Job = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), *const Job>(f)
        };
        // SAFETY: no worker reads `job` now: all finished the previous generation.
        unsafe { *s.job.get() = Some(erased) };
        s.done.store(0, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, self.n_threads)));
        let others = self.n_threads - 1;
        let mut spins = 0usize;
        while s.done.load(Ordering::Acquire) < others {
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: every worker is done with this generation's job.
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a flowrt worker thread panicked");
        }
    }
}

fn worker(s: Arc<Shared>, tid: usize, n: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a new generation: spin, then sleep.
        let mut spins = 0usize;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard =
                if s.generation.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                    s.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
                } else {
                    guard
                };
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            spins = 0;
        }
        // SAFETY: the job was published before the generation bump we just observed, and
        // `run` keeps the closure alive until we report done below.
        let job = unsafe { (*s.job.get()).expect("a published generation has a job") };
        // SAFETY: see above; the pointer refers to a live `Fn + Sync`.
        let f = unsafe { &*job };
        if catch_unwind(AssertUnwindSafe(|| f(tid, n))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A mutable buffer shared by the threads of one job, each writing parts no other touches.
///
/// Callers promise disjointness through the safe methods: [`DisjointMut::chunk`] hands out
/// chunk `i` of a fixed size, and each chunk index must be claimed by one thread only —
/// which the work distributors below guarantee by giving every index to exactly one thread.
pub struct DisjointMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _p: PhantomData<&'a mut [T]>,
}

// SAFETY: access goes through `with_rows`, whose callers (this module's distributors) give
// each index to one thread only.
unsafe impl<T: Send> Sync for DisjointMut<'_, T> {}

impl<'a, T> DisjointMut<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        DisjointMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _p: PhantomData,
        }
    }

    /// Mutable access to `range` of the buffer.
    ///
    /// # Safety
    /// No other thread may access any element of `range` while the returned slice lives.
    #[allow(clippy::mut_from_ref)] // the whole point: disjoint parts handed to several threads
    pub unsafe fn range_mut(&self, start: usize, end: usize) -> &mut [T] {
        assert!(
            start <= end && end <= self.len,
            "range {start}..{end} out of {}",
            self.len
        );
        // SAFETY: in bounds (checked); exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }
}

/// Hands out task indices `0..n` to the threads of a job, each index to exactly one thread.
pub struct TaskCounter {
    next: AtomicUsize,
    n: usize,
}

impl TaskCounter {
    pub fn new(n: usize) -> Self {
        TaskCounter {
            next: AtomicUsize::new(0),
            n,
        }
    }

    /// The next unclaimed task, if any.
    pub fn claim(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.n).then_some(i)
    }
}

impl ThreadPool {
    /// Split `out` into chunks of `chunk` elements and call `f(index, chunk)` for each, spread
    /// over the pool's threads (the last chunk may be shorter).
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        out: &mut [T],
        chunk: usize,
        f: &(dyn Fn(usize, usize, &mut [T]) + Sync),
    ) {
        let chunk = chunk.max(1);
        let n = out.len().div_ceil(chunk);
        let len = out.len();
        let tasks = TaskCounter::new(n);
        let buf = DisjointMut::new(out);
        self.run(&|tid, _| {
            while let Some(i) = tasks.claim() {
                let (s, e) = (i * chunk, ((i + 1) * chunk).min(len));
                // SAFETY: task `i` is claimed by this thread only and chunks don't overlap.
                let part = unsafe { buf.range_mut(s, e) };
                f(tid, i, part);
            }
        });
    }

    /// For a row-major `out` of `n_rows_out` rows of `stride` elements, let tasks own column
    /// blocks: task `i` may write columns `cols(i)` of every row. `f(tid, i, writer)` gets a
    /// [`ColumnWriter`] restricted to its block.
    pub fn for_each_column_block<T: Send>(
        &self,
        out: &mut [T],
        stride: usize,
        n_blocks: usize,
        cols: &(dyn Fn(usize) -> (usize, usize) + Sync),
        f: &(dyn Fn(usize, usize, &mut ColumnWriter<'_, T>) + Sync),
    ) {
        let tasks = TaskCounter::new(n_blocks);
        let n_rows = out.len().checked_div(stride).unwrap_or(0);
        let buf = DisjointMut::new(out);
        self.run(&|tid, _| {
            while let Some(i) = tasks.claim() {
                let (c0, c1) = cols(i);
                assert!(
                    c0 <= c1 && c1 <= stride,
                    "column block {c0}..{c1} out of {stride}"
                );
                let mut w = ColumnWriter {
                    buf: &buf,
                    stride,
                    n_rows,
                    c0,
                    c1,
                };
                f(tid, i, &mut w);
            }
        });
    }
}

/// Write access to columns `c0..c1` of every row of a shared row-major buffer.
pub struct ColumnWriter<'b, T> {
    buf: &'b DisjointMut<'b, T>,
    stride: usize,
    n_rows: usize,
    c0: usize,
    c1: usize,
}

impl<T> ColumnWriter<'_, T> {
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Columns `c0..c1` of row `r`.
    pub fn row(&mut self, r: usize) -> &mut [T] {
        assert!(r < self.n_rows);
        let s = r * self.stride;
        // SAFETY: this writer's column block is owned by one task (claimed once) and blocks
        // of different tasks don't overlap; `&mut self` prevents two live rows at once.
        unsafe { self.buf.range_mut(s + self.c0, s + self.c1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            for _ in 0..200 {
                let count = AtomicUsize::new(0);
                let mask = AtomicUsize::new(0);
                pool.run(&|tid, nth| {
                    assert_eq!(nth, n);
                    count.fetch_add(1, Ordering::Relaxed);
                    mask.fetch_or(1 << tid, Ordering::Relaxed);
                });
                assert_eq!(count.load(Ordering::Relaxed), n);
                assert_eq!(mask.load(Ordering::Relaxed), (1 << n) - 1);
            }
        }
    }

    #[test]
    fn chunks_cover_the_buffer_once() {
        let pool = ThreadPool::new(3);
        let mut v = vec![0u32; 1001];
        pool.for_each_chunk_mut(&mut v, 7, &|_, i, part| {
            for (j, x) in part.iter_mut().enumerate() {
                *x += (i * 7 + j) as u32 + 1;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
    }

    #[test]
    fn column_blocks_cover_the_buffer_once() {
        let pool = ThreadPool::new(2);
        let (rows, stride) = (5, 37);
        let mut v = vec![0u32; rows * stride];
        let nb = stride.div_ceil(8);
        pool.for_each_column_block(
            &mut v,
            stride,
            nb,
            &|i| (i * 8, ((i + 1) * 8).min(stride)),
            &|_, i, w| {
                for r in 0..w.n_rows() {
                    for (j, x) in w.row(r).iter_mut().enumerate() {
                        *x += (r * stride + i * 8 + j) as u32 + 1;
                    }
                }
            },
        );
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = ThreadPool::new(2);
        pool.run(&|_, _| {});
        std::thread::sleep(std::time::Duration::from_millis(50));
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
