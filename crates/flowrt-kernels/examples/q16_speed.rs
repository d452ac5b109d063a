//! Single-thread decode (one token) matmul speed, in GB/s of weights, with Q16 activations
//! (and optionally the ggml 8-bit activations).
//!
//! `cargo run --profile ci -p flowrt-kernels --example q16_speed [-- K ROWS [TYPE...] [q8] [x8] [a8] [tokens=N]]`
//!
//! `x8` adds the same matmul on weights packed in the x8 layout (`flowrt_kernels::x8`); `a8`
//! the x8 matmul with 8-bit A8 activations (`flowrt_kernels::a8`), for the types that have it.
//!
//! `tokens=N` multiplies N activation rows at once (batched decode or prefill); MAC/s counts
//! every weight-activation product.
//!
//! Types are ggml names (`q4_1 q4_k q6_k ...`; default: every type with a Q16 matmul). Each
//! round times a batch of matmuls per type, types interleaved so they see the same machine
//! state; the median over rounds is reported. Large ROWS make the weights stream from memory,
//! as in decode; small ones measure the kernel from cache.
use std::time::Instant;

use flowrt_dtype::GgmlType;
use flowrt_kernels::{q16, row_size, x8, Kernels};

const ROUNDS: usize = 15;

#[derive(PartialEq)]
enum Mode {
    Q16,
    Q8,
    X8,
    A8,
}

struct Case {
    ty: GgmlType,
    mode: Mode,
    w: Vec<u8>,
    a: Vec<u8>,
    times: Vec<f64>,
}

fn main() {
    let kern = Kernels::detect();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (k, rows) = (
        nums.first().copied().unwrap_or(2048),
        nums.get(1).copied().unwrap_or(2048),
    );
    let with_q8 = args.iter().any(|a| a == "q8");
    let with_x8 = args.iter().any(|a| a == "x8");
    let with_a8 = args.iter().any(|a| a == "a8");
    let ntok: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("tokens=")?.parse().ok())
        .unwrap_or(1)
        .max(1);
    let mut types: Vec<GgmlType> = args
        .iter()
        .filter_map(|a| {
            GgmlType::ALL
                .into_iter()
                .find(|t| t.name().eq_ignore_ascii_case(a))
        })
        .collect();
    if types.is_empty() {
        types = GgmlType::ALL
            .into_iter()
            .filter(|&t| Kernels::supports_q16(t))
            .collect();
    }
    let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut cases = Vec::new();
    for &ty in &types {
        assert!(Kernels::supports_q16(ty), "{ty} has no Q16 matmul");
        // Realistic blocks: quantised from smooth pseudo-random values.
        let wf: Vec<f32> = (0..k)
            .map(|i| ((i * 7919 % 1009) as f32 / 504.5 - 1.0) * 0.1)
            .collect();
        let mut wrow = vec![0u8; row_size(ty, k)];
        kern.quantize_row(ty, &wf, &mut wrow);
        let w: Vec<u8> = wrow
            .iter()
            .copied()
            .cycle()
            .take(wrow.len() * rows)
            .collect();
        let mut a16 = vec![0u8; q16::q16_row_size(k)];
        kern.quantize_row_q16(&x, &mut a16);
        let a16 = a16.repeat(ntok);
        if with_a8 && flowrt_kernels::a8::supports(ty) && x8::can_pack(ty, rows, k) {
            let mut p = vec![0u8; x8::packed_size(ty, rows, k)];
            x8::pack(ty, rows, k, &w, &mut p);
            let mut a = vec![0u8; flowrt_kernels::a8::a8_row_size(k)];
            kern.quantize_row_a8(&x, &mut a);
            cases.push(Case {
                ty,
                mode: Mode::A8,
                w: p,
                a: a.repeat(ntok),
                times: Vec::new(),
            });
        }
        if with_x8 && x8::can_pack(ty, rows, k) {
            let mut p = vec![0u8; x8::packed_size(ty, rows, k)];
            x8::pack(ty, rows, k, &w, &mut p);
            cases.push(Case {
                ty,
                mode: Mode::X8,
                w: p,
                a: a16.clone(),
                times: Vec::new(),
            });
        }
        cases.push(Case {
            ty,
            mode: Mode::Q16,
            w: w.clone(),
            a: a16,
            times: Vec::new(),
        });
        if with_q8 {
            let at = Kernels::vec_dot_type(ty);
            let mut a8 = vec![0u8; row_size(at, k)];
            kern.quantize_row(at, &x, &mut a8);
            let a8 = a8.repeat(ntok);
            cases.push(Case {
                ty,
                mode: Mode::Q8,
                w,
                a: a8,
                times: Vec::new(),
            });
        }
    }
    let mut out = vec![0f32; rows * ntok];
    for _ in 0..ROUNDS {
        for c in cases.iter_mut() {
            let iters = (200_000_000 / c.w.len()).clamp(2, 500);
            let t = Instant::now();
            for _ in 0..iters {
                match c.mode {
                    Mode::Q8 => kern.matmul(c.ty, k, &c.w, rows, &c.a, ntok, &mut out, rows),
                    Mode::Q16 => kern.matmul_q16(c.ty, k, &c.w, rows, &c.a, ntok, &mut out, rows),
                    Mode::X8 => kern.matmul_q16_x8(c.ty, k, &c.w, rows, &c.a, ntok, &mut out, rows),
                    Mode::A8 => kern.matmul_a8_x8(c.ty, k, &c.w, rows, &c.a, ntok, &mut out, rows),
                }
            }
            c.times.push(t.elapsed().as_secs_f64() / iters as f64);
        }
    }
    println!(
        "{} K={k} rows={rows}, {ntok} token(s), median of {ROUNDS} rounds:",
        kern.name()
    );
    for c in &mut cases {
        c.times.sort_by(f64::total_cmp);
        let s = c.times[ROUNDS / 2];
        println!(
            "  {:5} {}: {:8.1} us, {:5.1} GB/s of weights ({:.2} MB), {:.2} GMAC/s",
            c.ty.name(),
            match c.mode {
                Mode::Q8 => "q8 ",
                Mode::Q16 => "q16",
                Mode::X8 => "x8 ",
                Mode::A8 => "a8 ",
            },
            s * 1e6,
            c.w.len() as f64 / s / 1e9,
            c.w.len() as f64 / 1e6,
            (k * rows * ntok) as f64 / s / 1e9
        );
    }
}
