//! Time of error-feedback quantisation (`flowrt_kernels::gptq`) at a model's widths: the
//! factorisation of an `n × n` second-moment matrix, the quantisation of `rows × n`, and
//! `--asymmetric`'s parts: the cross moments of `T` positions (`CROSS_T`, default 4096), the
//! correction's solve and its application to `rows × n`.
//!
//! `cargo run --profile ci -p flowrt-kernels --example gptq_speed [-- N ROWS [THREADS]]`
//!
//! The moments come from random correlated inputs; only the time matters here (the
//! numerics are `tests/gptq.rs`'s). One run, as this takes seconds to minutes at 2B widths.
use std::time::Instant;

use flowrt_dtype::GgmlType;
use flowrt_kernels::gptq::{cross_moment, quantize_matrix, Correction, Factor};
use flowrt_kernels::row_size;

/// xorshift64* uniform in [-1, 1).
fn uniform(s: &mut u64) -> f32 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    let v = s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
    v as f32 / (1u64 << 23) as f32 - 1.0
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("N ROWS [THREADS] are numbers"))
        .collect();
    let n = args.first().copied().unwrap_or(2048);
    let rows = args.get(1).copied().unwrap_or(2048);
    let threads = args.get(2).copied().unwrap_or(2);
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    // A Gram matrix of `n + 64` random inputs mixed from 32 shared factors.
    let tokens = n + 64;
    let mix: Vec<f32> = (0..32 * n).map(|_| uniform(&mut s)).collect();
    let mut x = vec![0f32; n];
    let mut g = vec![0f32; n * n];
    let t0 = Instant::now();
    for _ in 0..tokens {
        let z: Vec<f32> = (0..32).map(|_| uniform(&mut s)).collect();
        for (j, xj) in x.iter_mut().enumerate() {
            *xj = 0.3 * uniform(&mut s) + (0..32).map(|i| z[i] * mix[i * n + j]).sum::<f32>();
        }
        for i in 0..n {
            let xi = x[i];
            for (gj, &xj) in g[i * n..(i + 1) * n].iter_mut().zip(&x) {
                *gj += xi * xj;
            }
        }
    }
    eprintln!(
        "moments of {tokens} inputs: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    let f = Factor::new(&g, n, threads).expect("positive definite");
    println!(
        "factor n={n} threads={threads}: {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    let w0: Vec<f32> = (0..rows * n).map(|_| 0.02 * uniform(&mut s)).collect();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
        let mut w = w0.clone();
        let mut out = vec![0u8; rows * row_size(ty, n)];
        let t0 = Instant::now();
        quantize_matrix(ty, &mut w, &f, &mut out, threads).expect("quantised");
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "quantize {ty} {rows}x{n} threads={threads}: {secs:.2} s ({:.2} GFLOP/s in the feedback)",
            rows as f64 * n as f64 * n as f64 / secs / 1e9
        );
    }
    let t: usize = std::env::var("CROSS_T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    let a: Vec<f32> = (0..t * n).map(|_| uniform(&mut s)).collect();
    let b: Vec<f32> = (0..t * n).map(|_| uniform(&mut s)).collect();
    let t0 = Instant::now();
    let mut c = cross_moment(&a, n, &b, n, threads);
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "cross moments {t} x {n} threads={threads}: {secs:.2} s ({:.1} GMAC/s)",
        t as f64 * n as f64 * n as f64 / secs / 1e9
    );
    c.iter_mut().for_each(|v| *v *= 1e-4);
    let t0 = Instant::now();
    let corr = Correction::new(&c, &f, threads).expect("solved");
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "correction solve n={n} threads={threads}: {secs:.2} s ({:.1} GMAC/s)",
        (n as f64).powi(3) / secs / 1e9
    );
    let mut w = w0.clone();
    let t0 = Instant::now();
    corr.apply(&mut w, 0.25, threads).expect("applied");
    println!(
        "correction apply {rows}x{n} threads={threads}: {:.2} s",
        t0.elapsed().as_secs_f64()
    );
}
