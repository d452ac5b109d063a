//! A small persistent thread pool for the forward pass.
//!
//! `run` offers one borrowed closure to the pool's threads (the caller is thread 0) and
//! returns when every thread that took it up has finished. Jobs hand out their work through a
//! [`TaskCounter`], so the caller alone can complete a job: a worker that the OS has not
//! scheduled by the time the caller runs out of tasks is simply left out of that job instead of
//! being waited for. That keeps a loaded machine (more runnable threads than cores) from
//! turning every op into a wait for a time slice.
//!
//! Workers spin briefly between jobs (ops follow each other within microseconds during a
//! forward pass) and then sleep on a condition variable, so an idle runtime costs no CPU.
//! Nothing is allocated per job.
//!
//! This file holds the crate's only `unsafe`: erasing the lifetime of the borrowed closure
//! while `run` waits for every worker that entered the job, and handing disjoint mutable parts
//! of one buffer to different threads.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = dyn Fn(usize, usize) + Sync;

/// Job state word: generation in the low 32 bits, a "closed" flag, and how many workers
/// entered the job.
const GEN_MASK: u64 = 0xFFFF_FFFF;
const CLOSED: u64 = 1 << 32;
const ENTERED_ONE: u64 = 1 << 33;

struct Shared {
    /// The current job. Written only by `run` while no worker can enter a job.
    job: UnsafeCell<Option<*const Job>>,
    /// Generation, closed flag and entered count of the current job.
    state: AtomicU64,
    /// Workers that finished the current job.
    done: AtomicUsize,
    /// A worker's job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written by `run` only between jobs: after the previous job was closed and
// every worker that entered it reported done, and before the new generation is published.
// Workers read it only after entering the current (open) generation.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced under the protocol above.
unsafe impl Send for Shared {}

/// A fixed set of threads that run jobs together.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

/// Spin iterations before a waiting thread yields or sleeps.
const SPIN_LIMIT: usize = 1 << 14;

impl ThreadPool {
    /// A pool of `n_threads` threads in total, the calling thread included.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            state: AtomicU64::new(CLOSED),
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

    /// Offer `f(thread_index, n_threads)` to every thread of the pool and wait for those that
    /// took it up. The calling thread always runs it; workers may not (see the module docs),
    /// so `f` must claim its work dynamically (e.g. from a [`TaskCounter`]).
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n_threads == 1 {
            f(0, 1);
            return;
        }
        let s = &*self.shared;
        // SAFETY: the lifetime of `f` is erased only for the duration of this call: workers
        // dereference the pointer only after entering this job, and we close the job and wait
        // for every worker that entered it before returning.
        let erased: *const Job = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), *const Job>(f)
        };
        // SAFETY: the previous job is closed and all who entered it are done: nobody reads.
        unsafe { *s.job.get() = Some(erased) };
        s.done.store(0, Ordering::Relaxed);
        let gen = (s.state.load(Ordering::Relaxed).wrapping_add(1)) & GEN_MASK;
        s.state.store(gen, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, self.n_threads)));
        // Close the job: workers that have not entered yet stay out of it.
        let closed = s.state.fetch_or(CLOSED, Ordering::SeqCst);
        let entered = (closed >> 33) as usize;
        let mut spins = 0usize;
        while s.done.load(Ordering::Acquire) < entered {
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: the job is closed and every worker that entered it is done.
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
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then sleep.
        let mut spins = 0usize;
        let gen = loop {
            let g = s.state.load(Ordering::Acquire) & GEN_MASK;
            if g != seen {
                break g;
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
            let guard = if s.state.load(Ordering::SeqCst) & GEN_MASK == seen
                && !s.stop.load(Ordering::SeqCst)
            {
                s.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
            } else {
                guard
            };
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            spins = 0;
        };
        seen = gen;
        // Enter the job unless it has moved on or been closed.
        let mut cur = s.state.load(Ordering::Acquire);
        let entered = loop {
            if cur & GEN_MASK != gen || cur & CLOSED != 0 {
                break false;
            }
            match s.state.compare_exchange_weak(
                cur,
                cur + ENTERED_ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break true,
                Err(now) => cur = now,
            }
        };
        if !entered {
            continue;
        }
        // SAFETY: we entered the open job `gen`; its pointer was written before the generation
        // was published, and `run` keeps the closure alive until we report done below.
        let job = unsafe { (*s.job.get()).expect("an open job has a closure") };
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

    /// For `N` row-major buffers (`outs[j]` has rows of `strides[j]` elements), let tasks own
    /// column blocks: task `i` writes columns `c0..c1` of every row of buffer `j`, where
    /// `(j, c0, c1) = block(i)`, through the [`ColumnWriter`] that `f(tid, i, writer)` gets.
    /// Blocks must not overlap (each task's block is written by that task only).
    pub fn for_each_column_block<T: Send, const N: usize>(
        &self,
        outs: [&mut [T]; N],
        strides: [usize; N],
        n_blocks: usize,
        block: &(dyn Fn(usize) -> (usize, usize, usize) + Sync),
        f: &(dyn Fn(usize, usize, &mut ColumnWriter<'_, T>) + Sync),
    ) {
        let tasks = TaskCounter::new(n_blocks);
        let n_rows: [usize; N] =
            std::array::from_fn(|j| outs[j].len().checked_div(strides[j]).unwrap_or(0));
        let bufs = outs.map(DisjointMut::new);
        self.run(&|tid, _| {
            while let Some(i) = tasks.claim() {
                let (j, c0, c1) = block(i);
                assert!(
                    c0 <= c1 && c1 <= strides[j],
                    "column block {c0}..{c1} out of {}",
                    strides[j]
                );
                let mut w = ColumnWriter {
                    buf: &bufs[j],
                    stride: strides[j],
                    r0: 0,
                    n_rows: n_rows[j],
                    c0,
                    c1,
                };
                f(tid, i, &mut w);
            }
        });
    }

    /// Let tasks own tiles of one row-major buffer (rows of `stride` elements): task `i`
    /// writes columns `c0..c1` of rows `r0..r1`, where `(r0, r1, c0, c1) = tile(i)`, through
    /// the [`ColumnWriter`] that `f(tid, i, writer)` gets (its row 0 is row `r0`). Tiles must
    /// not overlap (each task's tile is written by that task only).
    pub fn for_each_tile<T: Send>(
        &self,
        out: &mut [T],
        stride: usize,
        n_tiles: usize,
        tile: &(dyn Fn(usize) -> (usize, usize, usize, usize) + Sync),
        f: &(dyn Fn(usize, usize, &mut ColumnWriter<'_, T>) + Sync),
    ) {
        let tasks = TaskCounter::new(n_tiles);
        let total_rows = out.len().checked_div(stride).unwrap_or(0);
        let buf = DisjointMut::new(out);
        self.run(&|tid, _| {
            while let Some(i) = tasks.claim() {
                let (r0, r1, c0, c1) = tile(i);
                assert!(
                    r0 <= r1 && r1 <= total_rows && c0 <= c1 && c1 <= stride,
                    "tile rows {r0}..{r1}, columns {c0}..{c1} out of {total_rows} x {stride}"
                );
                let mut w = ColumnWriter {
                    buf: &buf,
                    stride,
                    r0,
                    n_rows: r1 - r0,
                    c0,
                    c1,
                };
                f(tid, i, &mut w);
            }
        });
    }

    /// Let tasks own column blocks of two row-major buffers at once: task `i` writes columns
    /// `c0..c1` of every row of `a` (rows of `strides.0` elements) and of `b` (rows of
    /// `strides.1`), where `(c0, c1) = block(i)`, through the two [`ColumnWriter`]s that
    /// `f(tid, i, a_writer, b_writer)` gets. The buffers may hold different types (a cache of
    /// halves next to a buffer of floats). Blocks must not overlap. A single block runs on the
    /// calling thread without waking the workers.
    #[allow(clippy::type_complexity)] // one callback taking both writers
    pub fn for_each_column_block_pair<A: Send, B: Send>(
        &self,
        a: &mut [A],
        b: &mut [B],
        strides: (usize, usize),
        n_blocks: usize,
        block: &(dyn Fn(usize) -> (usize, usize) + Sync),
        f: &(dyn Fn(usize, usize, &mut ColumnWriter<'_, A>, &mut ColumnWriter<'_, B>) + Sync),
    ) {
        let tasks = TaskCounter::new(n_blocks);
        let rows_a = a.len().checked_div(strides.0).unwrap_or(0);
        let rows_b = b.len().checked_div(strides.1).unwrap_or(0);
        let (ba, bb) = (DisjointMut::new(a), DisjointMut::new(b));
        let job = |tid: usize, _| {
            while let Some(i) = tasks.claim() {
                let (c0, c1) = block(i);
                assert!(
                    c0 <= c1 && c1 <= strides.0.min(strides.1),
                    "column block {c0}..{c1} out of {} and {}",
                    strides.0,
                    strides.1
                );
                let mut wa = ColumnWriter {
                    buf: &ba,
                    stride: strides.0,
                    r0: 0,
                    n_rows: rows_a,
                    c0,
                    c1,
                };
                let mut wb = ColumnWriter {
                    buf: &bb,
                    stride: strides.1,
                    r0: 0,
                    n_rows: rows_b,
                    c0,
                    c1,
                };
                f(tid, i, &mut wa, &mut wb);
            }
        };
        // One task: the caller alone, without waking the workers.
        if n_blocks <= 1 {
            job(0, 1);
        } else {
            self.run(&job);
        }
    }
}

/// Write access to columns `c0..c1` of rows `r0..r0 + n_rows` of a shared row-major buffer.
pub struct ColumnWriter<'b, T> {
    buf: &'b DisjointMut<'b, T>,
    stride: usize,
    r0: usize,
    n_rows: usize,
    c0: usize,
    c1: usize,
}

impl<T> ColumnWriter<'_, T> {
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Columns `c0..c1` of the writer's row `r` (the buffer's row `r0 + r`).
    pub fn row(&mut self, r: usize) -> &mut [T] {
        assert!(r < self.n_rows);
        let s = (self.r0 + r) * self.stride;
        // SAFETY: this writer's column block is owned by one task (claimed once) and blocks
        // of different tasks don't overlap; `&mut self` prevents two live rows at once.
        unsafe { self.buf.range_mut(s + self.c0, s + self.c1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_the_caller_always_takes_part() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            let mut helped = false;
            let mut jobs = 0;
            // At least 300 jobs, and more until a worker has helped (a loaded machine may
            // not schedule the workers for a while).
            while jobs < 300 || (n > 1 && !helped && jobs < 20_000) {
                jobs += 1;
                let tasks = TaskCounter::new(64);
                let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
                let mask = AtomicUsize::new(0);
                pool.run(&|tid, nth| {
                    assert_eq!(nth, n);
                    mask.fetch_or(1 << tid, Ordering::Relaxed);
                    while let Some(i) = tasks.claim() {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                        // A little work per task, so that workers have time to join.
                        let mut x = i as u64;
                        for _ in 0..2000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6364136223846793005).wrapping_add(1),
                            );
                        }
                    }
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                let m = mask.load(Ordering::Relaxed);
                assert_eq!(m & 1, 1, "the caller runs every job");
                helped |= m != 1;
            }
            assert!(n == 1 || helped, "workers never joined a job");
        }
    }

    /// Soundness: `run` returns only after every worker that entered the job is done with it,
    /// however long that takes; the pool then goes on working.
    #[test]
    fn run_waits_for_workers_inside_the_job() {
        let pool = ThreadPool::new(2);
        let inside = AtomicBool::new(false);
        let finished = AtomicBool::new(false);
        // Retry until the worker gets in (a loaded machine may not schedule it at once).
        for _ in 0..1000 {
            pool.run(&|tid, _| {
                if tid == 1 {
                    inside.store(true, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    finished.store(true, Ordering::SeqCst);
                } else {
                    // Give the worker time to enter before the job closes.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            });
            if inside.load(Ordering::SeqCst) {
                assert!(
                    finished.load(Ordering::SeqCst),
                    "run returned while a worker was inside"
                );
                break;
            }
        }
        assert!(
            inside.load(Ordering::SeqCst),
            "the worker never entered a job"
        );
        let tasks = TaskCounter::new(1000);
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            while tasks.claim().is_some() {
                count.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(count.load(Ordering::Relaxed), 1000);
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
        let rows = 5;
        let strides = [37usize, 16];
        let mut a = vec![0u32; rows * strides[0]];
        let mut b = vec![0u32; rows * strides[1]];
        let nb = [strides[0].div_ceil(8), strides[1].div_ceil(8)];
        let block = |i: usize| {
            let (j, k) = if i < nb[0] { (0, i) } else { (1, i - nb[0]) };
            (j, k * 8, ((k + 1) * 8).min(strides[j]))
        };
        pool.for_each_column_block(
            [&mut a, &mut b],
            strides,
            nb[0] + nb[1],
            &block,
            &|_, i, w| {
                let (j, c0, _) = block(i);
                for r in 0..w.n_rows() {
                    for (c, x) in w.row(r).iter_mut().enumerate() {
                        *x += (j * 1000 + r * strides[j] + c0 + c) as u32 + 1;
                    }
                }
            },
        );
        assert!(a.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
        assert!(b.iter().enumerate().all(|(i, &x)| x == 1000 + i as u32 + 1));
    }

    /// Both buffers' columns of every block, every row, once; one block runs on the caller.
    #[test]
    fn column_block_pairs_cover_both_buffers_once() {
        for (n_threads, blk) in [(3, 8), (2, 40), (1, 8)] {
            let pool = ThreadPool::new(n_threads);
            let (rows_a, rows_b, h) = (7, 3, 37);
            let mut a = vec![0u16; rows_a * h];
            let mut b = vec![0f32; rows_b * h];
            let block = |i: usize| (i * blk, ((i + 1) * blk).min(h));
            pool.for_each_column_block_pair(
                &mut a,
                &mut b,
                (h, h),
                h.div_ceil(blk),
                &block,
                &|_, i, wa, wb| {
                    let (c0, _) = block(i);
                    for r in 0..wa.n_rows() {
                        for (c, x) in wa.row(r).iter_mut().enumerate() {
                            *x += (r * h + c0 + c) as u16 + 1;
                        }
                    }
                    for r in 0..wb.n_rows() {
                        for (c, x) in wb.row(r).iter_mut().enumerate() {
                            *x += (r * h + c0 + c) as f32 + 0.5;
                        }
                    }
                },
            );
            assert!(a.iter().enumerate().all(|(i, &x)| x == i as u16 + 1));
            assert!(b.iter().enumerate().all(|(i, &x)| x == i as f32 + 0.5));
        }
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = ThreadPool::new(2);
        pool.run(&|_, _| {});
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mask = AtomicUsize::new(0);
        // Offer jobs until the sleeping worker wakes up and takes one.
        for _ in 0..10_000 {
            pool.run(&|tid, _| {
                mask.fetch_or(1 << tid, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_micros(100));
            });
            if mask.load(Ordering::Relaxed) == 3 {
                break;
            }
        }
        assert_eq!(mask.load(Ordering::Relaxed), 3);
    }
}
