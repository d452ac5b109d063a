//! Rough single-thread speed of the Q16 matmul vs the 8-bit one (decode shape).
//! `cargo run --release -p flowrt-kernels --example q16_speed [-- K ROWS]` (large ROWS: weights
//! stream from memory, as in decode)
use std::time::Instant;

use flowrt_dtype::GgmlType;
use flowrt_kernels::{q16, row_size, Kernels};

fn main() {
    let kern = Kernels::detect();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (k, rows) = (
        args.first().copied().unwrap_or(576),
        args.get(1).copied().unwrap_or(1536),
    );
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0] {
        let w: Vec<u8> = (0..row_size(ty, k) * rows)
            .map(|i| (i * 7 % 251) as u8 & 0x3F)
            .collect();
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut a16 = vec![0u8; q16::q16_row_size(k)];
        kern.quantize_row_q16(&x, &mut a16);
        let at = Kernels::vec_dot_type(ty);
        let mut a8 = vec![0u8; row_size(at, k)];
        kern.quantize_row(at, &x, &mut a8);
        let mut out = vec![0f32; rows];
        let iters = (2_000_000_000 / w.len()).clamp(3, 2000);
        for (name, q16) in [("q16", true), ("q8", false)] {
            let t = Instant::now();
            for _ in 0..iters {
                if q16 {
                    kern.matmul_q16(ty, k, &w, rows, &a16, 1, &mut out, rows);
                } else {
                    kern.matmul(ty, k, &w, rows, &a8, 1, &mut out, rows);
                }
            }
            let s = t.elapsed().as_secs_f64() / iters as f64;
            println!(
                "{} {ty} {name}: {:.1} us, {:.1} GB/s of weights",
                kern.name(),
                s * 1e6,
                w.len() as f64 / s / 1e9
            );
        }
    }
}
