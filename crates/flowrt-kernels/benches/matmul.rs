//! Matmul throughput per available kernel table, in bytes of weights per second.
//!
//! Shapes are SmolLM2-135M's: hidden 576, FFN 1536, vocabulary 49152 (the Q8_0 output head is
//! cut to 6144 rows to keep the run short). `ntok = 1` is decode, `ntok = 32` a prefill chunk.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Kernels};
use rand::{Rng, SeedableRng};

fn random_rows(rng: &mut rand::rngs::StdRng, ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut out = vec![0u8; row_size(ty, k) * n];
    let rs = row_size(ty, k);
    for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(rs)) {
        Kernels::scalar().quantize_row(ty, xr, or);
    }
    out
}

fn bench_matmul(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let cases = [
        (GgmlType::Q4_1, 576, 1536, 1),
        (GgmlType::Q4_1, 576, 1536, 32),
        (GgmlType::Q4_1, 1536, 576, 1),
        (GgmlType::Q8_0, 576, 6144, 1),
        (GgmlType::Q8_0, 576, 1536, 32),
        (GgmlType::Q4_0, 576, 1536, 1),
        (GgmlType::Q4_0, 576, 1536, 32),
        (GgmlType::F16, 576, 1536, 1),
    ];
    for (ty, k, nrows, ntok) in cases {
        let at = Kernels::vec_dot_type(ty);
        let w = random_rows(&mut rng, ty, k, nrows);
        let a = random_rows(&mut rng, at, k, ntok);
        let mut out = vec![0f32; nrows * ntok];
        let mut group = c.benchmark_group(format!("matmul_{ty}_k{k}_n{nrows}_t{ntok}"));
        group.throughput(Throughput::Bytes(w.len() as u64));
        group.sample_size(20);
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(1));
        for kern in Kernels::available() {
            group.bench_with_input(
                BenchmarkId::from_parameter(kern.name()),
                &kern,
                |b, kern| b.iter(|| kern.matmul(ty, k, &w, nrows, &a, ntok, &mut out, nrows)),
            );
        }
        group.finish();
    }
}

fn bench_quantize(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let x: Vec<f32> = (0..576).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut group = c.benchmark_group("quantize_q8_1_k576");
    group.throughput(Throughput::Elements(576));
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(1));
    for kern in Kernels::available() {
        let mut out = vec![0u8; row_size(GgmlType::Q8_1, 576)];
        group.bench_function(kern.name(), |b| {
            b.iter(|| kern.quantize_row(GgmlType::Q8_1, &x, &mut out))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_matmul, bench_quantize);
criterion_main!(benches);
