//! Single-thread speed of the attention kernels over an f16 KV cache, for the head geometries
//! of the models flowrt is measured on.
//!
//! `cargo run --profile ci -p flowrt-kernels --example attn_speed [-- LEN]`
//!
//! For each geometry (query heads per KV head, head size), `attn_scores_f16` (one KV head's
//! queries against `LEN` keys, default 2048) and `attn_values_f16` (the weighted sum of `LEN`
//! values) are timed, interleaved over 15 rounds; medians in microseconds and GB/s of K or V
//! read. `softcap` (Gemma 2's `cap · tanh(s / cap)` on the scores) is timed beside them.
use std::time::Instant;

use flowrt_kernels::Kernels;
use half::f16;

const ROUNDS: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let kern = Kernels::detect();
    let len: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2048);
    // (name, query heads per KV head, head size)
    let shapes = [
        ("SmolLM2 (3 x 64)", 3, 64),
        ("MiniCPM5 (8 x 128)", 8, 128),
        ("Gemma 3 270M (4 x 256)", 4, 256),
        ("Gemma 2 2B (2 x 256)", 2, 256),
    ];
    println!(
        "{} single thread, {len} keys, median of {ROUNDS} rounds:",
        kern.name()
    );
    for (name, group, hd) in shapes {
        let q: Vec<f32> = (0..group * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f16> = (0..len * hd)
            .map(|i| f16::from_f32((i as f32 * 0.11).cos()))
            .collect();
        let v = k.clone();
        let mut scores = vec![0f32; group * len];
        let mut out = vec![0f32; group * hd];
        let (mut ts, mut tv, mut tc) = (vec![], vec![], vec![]);
        let iters = (200_000 / len).max(1);
        for _ in 0..ROUNDS {
            let t = Instant::now();
            for _ in 0..iters {
                kern.attn_scores_f16(&q, hd, &k, 0.125, &mut scores);
            }
            ts.push(t.elapsed().as_secs_f64() / iters as f64);
            let t = Instant::now();
            for _ in 0..iters {
                kern.softcap(&mut scores, 50.0);
            }
            tc.push(t.elapsed().as_secs_f64() / iters as f64);
            let t = Instant::now();
            for _ in 0..iters {
                kern.attn_values_f16(&scores, hd, &v, &mut out);
            }
            tv.push(t.elapsed().as_secs_f64() / iters as f64);
            std::hint::black_box((&scores, &out));
        }
        let bytes = (len * hd * 2) as f64;
        let (s, v, c) = (median(ts), median(tv), median(tc));
        println!(
            "  {name:24} scores {:8.1} us ({:5.1} GB/s)   values {:8.1} us ({:5.1} GB/s)   softcap {:8.1} us",
            s * 1e6,
            bytes / s / 1e9,
            v * 1e6,
            bytes / v / 1e9,
            c * 1e6
        );
    }
}
