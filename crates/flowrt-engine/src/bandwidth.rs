//! Read bandwidth of main memory, measured: the roofline that decode speed is compared with.
//!
//! Threads stream a buffer far larger than the last-level cache and sum its words; the best of
//! a few passes is the figure. Decode of a small batch reads every weight once per token, so
//! `weight bytes per token × tokens per second` over this figure says how close decode comes
//! to what the memory can deliver.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How to measure.
#[derive(Clone, Copy, Debug)]
pub struct BandwidthOptions {
    /// Threads reading at once (each streams its own contiguous part of the buffer).
    pub threads: usize,
    /// Size of the buffer read, bytes.
    pub buffer_bytes: usize,
    /// Keep making passes until this much time has gone (at least `min_passes`).
    pub min_time: Duration,
    pub min_passes: usize,
    pub max_passes: usize,
}

impl BandwidthOptions {
    /// What `flowrt bench` uses: 512 MiB or 4 × the last-level cache, whichever is larger,
    /// about half a second of passes after filling the buffer.
    pub fn for_threads(threads: usize) -> BandwidthOptions {
        let llc = last_level_cache_bytes().unwrap_or(0);
        BandwidthOptions {
            threads: threads.max(1),
            buffer_bytes: (512 << 20).max(llc.saturating_mul(4)),
            min_time: Duration::from_millis(500),
            min_passes: 3,
            max_passes: 50,
        }
    }
}

/// The measured figure.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BandwidthReport {
    /// Best pass, in 10^9 bytes per second.
    pub read_gb_s: f64,
    pub threads: usize,
    pub buffer_bytes: usize,
    pub passes: usize,
}

/// Measure read bandwidth as `opts` says. The buffer is filled (by the same threads, so its
/// pages are spread as the readers will touch them) before the timed passes.
pub fn measure_read_bandwidth(opts: &BandwidthOptions) -> BandwidthReport {
    let threads = opts.threads.max(1);
    let words = (opts.buffer_bytes / 8).max(threads);
    let per_thread = words.div_ceil(threads);
    // Nonzero, distinct contents: an untouched zeroed allocation would map one shared zero
    // page and measure the cache instead of memory.
    // `vec![0; n]` maps its pages lazily, so each thread's writes place its own part.
    let mut buf = vec![0u64; words];
    std::thread::scope(|s| {
        for (i, part) in buf.chunks_mut(per_thread).enumerate() {
            s.spawn(move || {
                let base = (i * per_thread) as u64;
                for (j, w) in part.iter_mut().enumerate() {
                    *w = (base + j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                }
            });
        }
    });
    let bytes = (words * 8) as f64;
    let (mut best, mut passes) = (f64::INFINITY, 0);
    let start = Instant::now();
    while passes < opts.min_passes.max(1)
        || (passes < opts.max_passes && start.elapsed() < opts.min_time)
    {
        let t = Instant::now();
        let total = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(per_thread)
                .map(|part| s.spawn(move || sum_words(black_box(part))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        black_box(total);
        best = best.min(t.elapsed().as_secs_f64());
        passes += 1;
    }
    BandwidthReport {
        read_gb_s: bytes / best.max(1e-9) / 1e9,
        threads,
        buffer_bytes: words * 8,
        passes,
    }
}

/// Wrapping sum of the words (integer adds reassociate, so this vectorises).
fn sum_words(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

/// Size of the largest CPU cache Linux reports for CPU 0, if it does.
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| {
        let size = std::fs::read_to_string(e.ok()?.path().join("size")).ok()?;
        parse_cache_size(size.trim())
    })
    .max()
}

/// `32768K`, `2M`, `512` (bytes).
fn parse_cache_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_gives_a_positive_finite_rate() {
        // Small and short: this checks the arithmetic, not the machine.
        let r = measure_read_bandwidth(&BandwidthOptions {
            threads: 2,
            buffer_bytes: 4 << 20,
            min_time: Duration::from_millis(10),
            min_passes: 2,
            max_passes: 5,
        });
        assert!(r.read_gb_s.is_finite() && r.read_gb_s > 0.0, "{r:?}");
        assert_eq!(r.buffer_bytes, 4 << 20);
        assert!(r.passes >= 2);
    }

    #[test]
    fn odd_sizes_work() {
        let r = measure_read_bandwidth(&BandwidthOptions {
            threads: 3,
            buffer_bytes: 1000,
            min_time: Duration::ZERO,
            min_passes: 1,
            max_passes: 1,
        });
        assert!(r.read_gb_s.is_finite() && r.read_gb_s > 0.0, "{r:?}");
    }

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("2M"), Some(2 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("x"), None);
        assert_eq!(parse_cache_size(""), None);
    }
}
