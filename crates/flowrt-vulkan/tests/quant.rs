//! The quantised matmul and embedding kernels against the scalar reference dequantisation of
//! `flowrt-kernels`, for every supported weight type, on whatever Vulkan device the machine
//! has (lavapipe on CI). Without a Vulkan device each test reports NOT RUN and returns.

use std::time::{Duration, Instant};

use flowrt_dtype::GgmlType;
use flowrt_kernels::Kernels;
use flowrt_testkit::coverage;
use flowrt_vulkan::quant::{
    self, DeviceExperts, DeviceMatrix, Form, QuantKernels, Shape, StepParams, Tuning,
};
use flowrt_vulkan::{Gpu, VulkanError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SUITE: &str = "vulkan quant";
const TIMEOUT: Duration = Duration::from_secs(120);
/// What unwritten outputs hold.
const SENTINEL: f32 = -12345.0;

fn open(what: &str) -> Option<Gpu> {
    match Gpu::open(None) {
        Ok(g) => {
            eprintln!(
                "{what}: device {} ({}, driver {})",
                g.desc.name, g.desc.kind, g.desc.driver
            );
            Some(g)
        }
        Err(e) => {
            coverage::not_run(SUITE, what, &format!("no Vulkan device: {e}"));
            None
        }
    }
}

fn device(g: &Gpu) -> String {
    format!("{} ({})", g.desc.name, g.desc.kind)
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Byte offsets of the f16 scale fields of one block.
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q6K => &[208],
        _ => &[],
    }
}

fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    ty.row_size(cols as u64).unwrap() as usize
}

/// `rows` rows of type `ty`: even rows quantised from random floats, odd rows (quantised
/// types) random bytes with random finite scales, so every bit of every field is exercised.
fn random_matrix(rng: &mut ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = row_bytes(ty, cols);
    let bs = ty.type_size() as usize;
    let mut out = vec![0u8; rows * rb];
    for (r, row) in out.chunks_exact_mut(rb).enumerate() {
        if r % 2 == 1 && !is_float(ty) {
            rng.fill(row);
            for blk in row.chunks_exact_mut(bs) {
                if ty == GgmlType::Mxfp4 {
                    // The E8M0 exponent: scales 2^-8..2^8 (random bytes overflow to inf).
                    blk[0] = rng.random_range(119u8..=135);
                }
                for &f in scale_fields(ty) {
                    let mag = rng.random_range(-8.0f32..0.0).exp2();
                    let s = if rng.random_bool(0.5) { -mag } else { mag };
                    blk[f..f + 2].copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
                }
            }
        } else {
            let amp = rng.random_range(0.1f32..4.0);
            let bias = rng.random_range(-0.5f32..0.5) * amp;
            let x: Vec<f32> = (0..cols)
                .map(|_| rng.random_range(-1.0f32..1.0) * amp + bias)
                .collect();
            Kernels::scalar().quantize_row(ty, &x, row);
        }
    }
    out
}

fn dequantize(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let rb = row_bytes(ty, cols);
    let mut w = vec![0f32; rows * cols];
    for (r, o) in w.chunks_exact_mut(cols).enumerate() {
        Kernels::scalar().dequantize_row(ty, &bytes[r * rb..(r + 1) * rb], o);
    }
    w
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// `max_binding` that gives chunks of exactly `per` rows.
fn binding_for(ty: GgmlType, cols: usize, per: usize) -> u64 {
    (per * row_bytes(ty, cols) + 7) as u64
}

struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Rows per chunk (None: the device's limit).
    per: Option<usize>,
    ns: &'static [u32],
    /// Forms to check besides `record`'s own choice, with the n for each.
    forms: &'static [(Form, &'static [u32])],
    seed: u64,
}

/// Small shapes that still take every path of the matmul body (threads splitting rows with
/// a reduction; several rows and tokens per thread, clamped at the ends), cheap to compile:
/// every type runs in these.
const TEST_TUNING: Tuning = Tuning {
    decode: Shape {
        tpr: 4,
        rpt: 2,
        nt: 2,
    },
    small: Shape {
        tpr: 4,
        rpt: 2,
        nt: 2,
    },
    vector_max: 4,
    tiled: Shape {
        tpr: 1,
        rpt: 3,
        nt: 3,
    },
    min_groups: 1,
};

/// Uploads a random matrix, binds it with x_stride > cols, y_stride > rows and y_col0 > 0
/// with every kernel cache of `ks` (`true`: x_stride a multiple of 4, so that activations are
/// read as vec4s), and compares y for every n of the case with the f64 reference. Returns
/// the largest error relative to the bound.
fn check_matmul(gpu: &Gpu, ks: &mut [(QuantKernels, bool)], c: &Case) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(c.seed);
    let (rows, cols, ty) = (c.rows, c.cols, c.ty);
    let bytes = random_matrix(&mut rng, ty, rows, cols);
    let w = dequantize(ty, &bytes, rows, cols);
    let max_binding = c.per.map_or(u64::MAX, |p| binding_for(ty, cols, p));
    let m = DeviceMatrix::upload(gpu, "w", ty, rows, cols, &bytes, max_binding).unwrap();
    if let Some(p) = c.per {
        assert_eq!(
            m.chunks.len(),
            rows.div_ceil(p),
            "{ty} {rows}x{cols} chunks"
        );
        assert!(m.chunks.iter().all(|ch| ch.rows <= p));
    }
    assert_eq!(
        m.chunks.iter().map(|ch| ch.rows).sum::<usize>(),
        rows,
        "chunk rows"
    );
    let n_max = *c.ns.iter().max().unwrap() as usize;
    let xs: Vec<f32> = (0..n_max * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let y_stride = rows + 7;
    let y_col0 = 3usize;
    let y_len = n_max * y_stride + 4;
    let yb = gpu.storage("y", (y_len * 4) as u64).unwrap();
    let rb = gpu.readback("y readback", (y_len * 4) as u64).unwrap();
    let step = gpu
        .uniform("step", bytemuck::bytes_of(&StepParams::default()))
        .unwrap();

    // Reference for every token, in f64, with the bound sum |w x|.
    let mut want = vec![0f64; n_max * rows];
    let mut mag = vec![0f64; n_max * rows];
    for t in 0..n_max {
        let xt = &xs[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let (mut s, mut a) = (0f64, 0f64);
            for (&wv, &xv) in wr.iter().zip(xt) {
                let p = wv as f64 * xv as f64;
                s += p;
                a += p.abs();
            }
            want[t * rows + r] = s;
            mag[t * rows + r] = a;
        }
    }

    let mut worst = 0f64;
    for (ki, (k, xvec4)) in ks.iter_mut().enumerate() {
        let x_stride = (cols + 4) / 4 * 4 + if *xvec4 { 0 } else { 3 };
        // Activations past each token's row are NaN: a kernel that reads them fails.
        let mut x = vec![f32::NAN; n_max * x_stride + 5];
        for t in 0..n_max {
            x[t * x_stride..t * x_stride + cols].copy_from_slice(&xs[t * cols..(t + 1) * cols]);
        }
        let xb = gpu.upload("x", &bytes_of(&x)).unwrap();
        let n_sel = ((c.seed + ki as u64) % 2) as u32;
        let bound = m
            .bind_matmul(
                gpu,
                k,
                &xb,
                x_stride as u32,
                &yb,
                y_stride as u32,
                y_col0 as u32,
                &step,
                n_sel,
            )
            .unwrap();
        let mut runs: Vec<(u32, Option<Form>)> = c.ns.iter().map(|&n| (n, None)).collect();
        for &(f, ns) in c.forms {
            runs.extend(ns.iter().map(|&n| (n, Some(f))));
        }
        for (n, form) in runs {
            gpu.queue
                .write_buffer(&yb, 0, &bytes_of(&vec![SENTINEL; y_len]));
            // The other count is wrong on purpose: n_sel must pick the right one.
            let sp = if n_sel == 0 {
                StepParams {
                    n_tok: n,
                    n_out: 1,
                    _pad: [0; 2],
                }
            } else {
                StepParams {
                    n_tok: n_max as u32 + 1,
                    n_out: n,
                    _pad: [0; 2],
                }
            };
            gpu.queue.write_buffer(&step, 0, bytemuck::bytes_of(&sp));
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                match form {
                    None => bound.record(&mut pass, n),
                    Some(f) => bound.record_form(&mut pass, n, f),
                }
            }
            gpu.queue.submit([enc.finish()]);
            let y = floats(&gpu.read(&yb, &rb, 0, (y_len * 4) as u64, TIMEOUT).unwrap());
            gpu.check().unwrap();
            let what = format!(
                "{ty} {rows}x{cols} n={n} form={form:?} per={:?} x_stride={x_stride} {:?}",
                c.per,
                k.tuning()
            );
            for t in 0..n_max {
                for col in 0..y_stride {
                    let got = y[t * y_stride + col];
                    let in_range = (t as u32) < n && col >= y_col0 && col < y_col0 + rows;
                    if !in_range {
                        assert_eq!(
                            got, SENTINEL,
                            "{what}: wrote outside: token {t} column {col}"
                        );
                        continue;
                    }
                    let r = col - y_col0;
                    let (e, b) = (want[t * rows + r], 1e-4 * (1.0 + mag[t * rows + r]));
                    let err = (got as f64 - e).abs();
                    assert!(
                        err <= b,
                        "{what}: token {t} row {r}: got {got}, want {e} (|err| {err:e} > bound {b:e})"
                    );
                    worst = worst.max(err / b);
                }
            }
        }
    }
    worst
}

fn cols_for(ty: GgmlType) -> &'static [usize] {
    if ty.block_size() == 256 {
        &[256, 512]
    } else {
        &[32, 96, 544]
    }
}

const NS: &[u32] = &[1, 2, 5, 33, 256];

/// Every type in the test shapes, activations read as vec4s in some cases and as floats in
/// others.
fn matmul_types(types: &[GgmlType], seed0: u64) {
    let what = format!("matmul {types:?} against the scalar dequantisation");
    let Some(gpu) = open(&what) else { return };
    let start = Instant::now();
    let mut ks = [
        (QuantKernels::with_tuning(TEST_TUNING), true),
        (QuantKernels::with_tuning(TEST_TUNING), false),
    ];
    let mut seed = seed0;
    for (ti, &ty) in types.iter().enumerate() {
        let mut worst = 0f64;
        for &cols in cols_for(ty) {
            for (rows, per) in [(1, None), (17, Some(5)), (300, Some(70))] {
                seed += 1;
                let c = Case {
                    ty,
                    rows,
                    cols,
                    per,
                    ns: NS,
                    forms: &[(Form::Vector, &[5, 33]), (Form::Tiled, &[1, 2])],
                    seed,
                };
                // Activations as vec4s or floats: alternate by type (compiling each kernel
                // costs most of this test's time on lavapipe).
                let v = ti % 2;
                worst = worst.max(check_matmul(&gpu, &mut ks[v..v + 1], &c));
            }
        }
        eprintln!("{ty}: worst error {worst:.3} of the bound");
    }
    eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
    coverage::ran(SUITE, &format!("{what} on {}", device(&gpu)));
}

#[test]
fn matmul_float_types() {
    matmul_types(&[GgmlType::F32, GgmlType::F16, GgmlType::BF16], 100);
}

#[test]
fn matmul_32_block_types() {
    use GgmlType::*;
    matmul_types(&[Q4_0, Q4_1, Q5_0, Q5_1, Q8_0], 200);
}

/// MXFP4 (gpt-oss's expert type): E8M0 scales and E2M1 codes against the scalar reference.
#[test]
fn matmul_mxfp4() {
    matmul_types(&[GgmlType::Mxfp4], 400);
}

#[test]
fn matmul_k_types() {
    use GgmlType::*;
    matmul_types(&[Q4K, Q5K, Q6K], 300);
}

/// The shapes the backend uses ([`Tuning::CPU`], which lavapipe gets, and [`Tuning::GPU`],
/// with its rows spread over more threads for small matrices), on an unaligned 32-value type
/// and a k-quant (every type's `deq` runs in the test shapes above; kernels take a few
/// seconds each to compile on lavapipe, so not every type runs in every shape).
#[test]
fn matmul_device_tunings() {
    use GgmlType::*;
    let what = "matmul in the CPU and GPU tunings (Q4_0, Q4_K)";
    let Some(gpu) = open(what) else { return };
    let start = Instant::now();
    // Without a fixed tuning, the device's kind chooses.
    let mut auto = QuantKernels::new();
    let m = DeviceMatrix::upload(&gpu, "w", Q4_0, 1, 32, &[0; 18], u64::MAX).unwrap();
    let xb = gpu.storage("x", 128).unwrap();
    let yb = gpu.storage("y", 16).unwrap();
    let step = gpu.uniform("step", &[0; 16]).unwrap();
    m.bind_matmul(&gpu, &mut auto, &xb, 32, &yb, 1, 0, &step, 0)
        .unwrap();
    gpu.check().unwrap();
    assert_eq!(auto.tuning(), Some(Tuning::for_device(&gpu)));
    if gpu.desc.kind == "cpu" {
        assert_eq!(auto.tuning(), Some(Tuning::CPU));
    }
    let mut cpu = (QuantKernels::with_tuning(Tuning::CPU), true);
    let mut gpu_k = (QuantKernels::with_tuning(Tuning::GPU), false);
    let mut seed = 700;
    for ty in [Q4_0, Q4K] {
        let cols = if ty == Q4K { 512 } else { 544 };
        for (rows, per) in [(3, None), (1000, Some(300))] {
            seed += 1;
            let c = Case {
                ty,
                rows,
                cols,
                per,
                ns: NS,
                forms: &[(Form::Vector, &[5]), (Form::Tiled, &[1, 2])],
                seed,
            };
            // The GPU tuning (its batch shape spread to 16 threads per row) on one type and
            // size: compiling is what costs here.
            check_matmul(&gpu, std::slice::from_mut(&mut cpu), &c);
            if ty == Q4_0 && rows > 3 {
                check_matmul(&gpu, std::slice::from_mut(&mut gpu_k), &c);
            }
        }
    }
    eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
    coverage::ran(SUITE, &format!("{what} on {}", device(&gpu)));
}

/// Float rows that end inside the kernels' 32-value virtual block (and rows of odd length,
/// whose F16/BF16 rows are not 4-byte aligned).
/// The expert matmul grouped by expert (`record_grouped`: pairs sorted by expert, tiles of
/// `nt` pairs of one expert per workgroup layer) against the per-pair form and the f64
/// reference, for every type, in two tunings (tiles of 3 pairs with one thread per row, and
/// with rows split over 4 threads: the reduction's write path). 5 experts of 19 rows in
/// chunks of 2 experts; 11 tokens x 2 slots with uneven loads: expert 0 in every token's
/// first slot (11 pairs, 4 tiles, the last partial), expert 1 in none, the rest mixed. The
/// grouping (`perm`, `tiles`) is computed here as the backend's `moe_group` kernel writes it
/// (that kernel is checked through the engine's MoE tests).
#[test]
fn matmul_id_grouped_every_type() {
    let what = "expert matmul grouped by expert, every type";
    let Some(gpu) = open(what) else {
        return;
    };
    let (ne, rows, cols, n_tok, k) = (5usize, 19usize, 256usize, 11usize, 2usize);
    let ids: Vec<u32> = (0..n_tok)
        .flat_map(|t| [0u32, [2, 3, 4][t % 3] as u32])
        .collect();
    let pairs = n_tok * k;
    let mut worst_ref = 0f64;
    let mut worst_pair = 0f32;
    for tiled in [
        Shape {
            tpr: 1,
            rpt: 3,
            nt: 3,
        },
        Shape {
            tpr: 4,
            rpt: 2,
            nt: 3,
        },
    ] {
        let tuning = Tuning {
            tiled,
            ..TEST_TUNING
        };
        let mut q = QuantKernels::with_tuning(tuning);
        let tile = q.group_tile(&gpu) as usize;
        assert_eq!(tile, 3);
        // The grouping: pairs expert-major, ascending; tiles (e, s0, s1).
        let mut perm = Vec::new();
        let mut tiles = vec![0u32];
        for e in 0..ne as u32 {
            let s0 = perm.len();
            perm.extend((0..pairs as u32).filter(|&p| ids[p as usize] == e));
            let s1 = perm.len();
            for s in (s0..s1).step_by(tile) {
                tiles.extend([e, s as u32, s1 as u32]);
            }
        }
        tiles[0] = ((tiles.len() - 1) / 3) as u32;
        assert!(tiles[0] <= quant::max_tiles(pairs as u32, ne as u32, tile as u32));
        for (i, &ty) in quant::TYPES.iter().enumerate() {
            let mut rng = ChaCha8Rng::seed_from_u64(900 + i as u64);
            let mats: Vec<Vec<u8>> = (0..ne)
                .map(|_| random_matrix(&mut rng, ty, rows, cols))
                .collect();
            let w: Vec<Vec<f32>> = mats.iter().map(|b| dequantize(ty, b, rows, cols)).collect();
            let parts: Vec<(&str, GgmlType, usize, usize, &[u8])> = mats
                .iter()
                .map(|b| ("expert", ty, rows, cols, &b[..]))
                .collect();
            let per_expert = rows * row_bytes(ty, cols);
            let ex = DeviceExperts::upload(&gpu, "experts", &parts, (2 * per_expert + 8) as u64)
                .unwrap();
            assert_eq!(ex.chunks.len(), 3, "{ty}: chunks of 2 experts");
            let x_stride = cols + 4;
            let mut x = vec![f32::NAN; n_tok * x_stride];
            for t in 0..n_tok {
                for c in 0..cols {
                    x[t * x_stride + c] = rng.random_range(-1.0f32..1.0);
                }
            }
            let y_stride = rows + 5;
            let y_len = pairs * y_stride;
            let xb = gpu.upload("x", &bytes_of(&x)).unwrap();
            let yb = gpu.storage("y", (y_len * 4) as u64).unwrap();
            let rb = gpu.readback("y readback", (y_len * 4) as u64).unwrap();
            let idb = gpu.upload("ids", bytemuck::cast_slice(&ids)).unwrap();
            let pb = gpu.upload("perm", bytemuck::cast_slice(&perm)).unwrap();
            let tb = gpu.upload("tiles", bytemuck::cast_slice(&tiles)).unwrap();
            let sp = StepParams {
                n_tok: n_tok as u32,
                n_out: 0,
                _pad: [0; 2],
            };
            let step = gpu.uniform("step", bytemuck::bytes_of(&sp)).unwrap();
            let bound = ex
                .bind_matmul_id(
                    &gpu,
                    &mut q,
                    &xb,
                    x_stride as u32,
                    k as u32,
                    &yb,
                    y_stride as u32,
                    &idb,
                    k as u32,
                    &step,
                    Some((&pb, &tb)),
                )
                .unwrap();
            assert!(bound.can_group(n_tok as u32));
            let mut outs = Vec::new();
            for grouped in [false, true] {
                gpu.queue
                    .write_buffer(&yb, 0, &bytes_of(&vec![SENTINEL; y_len]));
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    if grouped {
                        bound.record_grouped(&mut pass, n_tok as u32);
                    } else {
                        bound.record(&mut pass, n_tok as u32);
                    }
                }
                gpu.queue.submit([enc.finish()]);
                let y = floats(&gpu.read(&yb, &rb, 0, (y_len * 4) as u64, TIMEOUT).unwrap());
                gpu.check().unwrap();
                let what = format!("{ty} grouped={grouped} {tiled:?}");
                for p in 0..pairs {
                    let (e, t) = (ids[p] as usize, p / k);
                    for col in 0..y_stride {
                        let got = y[p * y_stride + col];
                        if col >= rows {
                            assert_eq!(got, SENTINEL, "{what}: pair {p} wrote column {col}");
                            continue;
                        }
                        let (mut s, mut a) = (0f64, 0f64);
                        for c in 0..cols {
                            let v = w[e][col * cols + c] as f64 * x[t * x_stride + c] as f64;
                            s += v;
                            a += v.abs();
                        }
                        let b = 1e-4 * (1.0 + a);
                        let err = (got as f64 - s).abs();
                        assert!(
                            err <= b,
                            "{what}: pair {p} (token {t}, expert {e}) row {col}: got {got}, \
                             want {s} (|err| {err:e} > {b:e})"
                        );
                        worst_ref = worst_ref.max(err / b);
                    }
                }
                outs.push(y);
            }
            let d = outs[0]
                .iter()
                .zip(&outs[1])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            worst_pair = worst_pair.max(d);
        }
    }
    eprintln!(
        "{what} on {}: worst error / bound {worst_ref:.3}, max |grouped - per-pair| {worst_pair:e}",
        device(&gpu)
    );
    coverage::ran(SUITE, &format!("{what} on {}", device(&gpu)));
}

#[test]
fn matmul_float_rows_of_any_length() {
    let what = "matmul F32/F16/BF16 with rows of 1, 7, 45 and 100 values";
    let Some(gpu) = open(what) else { return };
    let mut ks = [
        (QuantKernels::with_tuning(TEST_TUNING), true),
        (QuantKernels::with_tuning(TEST_TUNING), false),
    ];
    let mut seed = 400;
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for cols in [1, 7, 45, 100] {
            seed += 1;
            check_matmul(
                &gpu,
                &mut ks,
                &Case {
                    ty,
                    rows: 13,
                    cols,
                    per: Some(4),
                    ns: &[1, 3, 70],
                    forms: &[(Form::Vector, &[70]), (Form::Tiled, &[1, 3])],
                    seed,
                },
            );
        }
    }
    coverage::ran(SUITE, &format!("{what} on {}", device(&gpu)));
}

/// More rows than one grid dimension holds (262144 + 5 rows: 65537 workgroups of the vector
/// form), as the largest vocabularies need.
#[test]
fn matmul_folds_the_grid_for_many_rows() {
    let what = "matmul Q4_0 with 262149 rows (grid folded past 65535 workgroups)";
    let Some(gpu) = open(what) else { return };
    // The GPU tuning's vector shapes take 4 rows per workgroup: 65538 workgroups.
    let mut ks = [(QuantKernels::with_tuning(Tuning::GPU), true)];
    assert!(262_149u32.div_ceil(Tuning::GPU.decode.rows_per_group()) > 65535);
    assert!(262_149u32.div_ceil(Tuning::GPU.small.rows_per_group()) > 65535);
    check_matmul(
        &gpu,
        &mut ks,
        &Case {
            ty: GgmlType::Q4_0,
            rows: 262_149,
            cols: 32,
            per: None,
            ns: &[1, 3],
            forms: &[(Form::Tiled, &[2])],
            seed: 500,
        },
    );
    coverage::ran(SUITE, &format!("{what} on {}", device(&gpu)));
}

#[test]
fn embedding_lookup_every_type() {
    let what = "embedding lookup for every type, chunked";
    let Some(gpu) = open(what) else { return };
    let mut k = QuantKernels::new();
    let mut rng = ChaCha8Rng::seed_from_u64(600);
    for ty in quant::TYPES {
        let cols = if ty.block_size() == 256 { 256 } else { 96 };
        let rows = 300;
        let bytes = random_matrix(&mut rng, ty, rows, cols);
        let w = dequantize(ty, &bytes, rows, cols);
        let m = DeviceMatrix::upload(
            &gpu,
            "embd",
            ty,
            rows,
            cols,
            &bytes,
            binding_for(ty, cols, 70),
        )
        .unwrap();
        assert_eq!(m.chunks.len(), 5);
        let mut tokens: Vec<u32> = vec![0, 299, 69, 70, 139, 140, 5, 5];
        tokens.extend((0..30).map(|_| rng.random_range(0..rows as u32)));
        let n = tokens.len();
        let extra = 2 * cols; // past n_tok: must stay untouched
        let mut tok_buf = tokens.clone();
        tok_buf.extend([1, 2]);
        let tb = gpu
            .upload("tokens", bytemuck::cast_slice(&tok_buf))
            .unwrap();
        let x_len = n * cols + extra;
        let xb = gpu.upload("x", &bytes_of(&vec![SENTINEL; x_len])).unwrap();
        let rb = gpu.readback("x readback", (x_len * 4) as u64).unwrap();
        let step = gpu
            .uniform(
                "step",
                bytemuck::bytes_of(&StepParams {
                    n_tok: n as u32,
                    n_out: 1,
                    _pad: [0; 2],
                }),
            )
            .unwrap();
        let scale = 1.75f32;
        let bound = m.bind_embed(&gpu, &mut k, &tb, &xb, scale, &step).unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            bound.record(&mut pass, n as u32);
        }
        gpu.queue.submit([enc.finish()]);
        let x = floats(&gpu.read(&xb, &rb, 0, (x_len * 4) as u64, TIMEOUT).unwrap());
        for (t, &tok) in tokens.iter().enumerate() {
            for j in 0..cols {
                let want = w[tok as usize * cols + j] * scale;
                let got = x[t * cols + j];
                assert!(
                    (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{ty}: token {t} (row {tok}) column {j}: got {got}, want {want}"
                );
            }
        }
        assert!(
            x[n * cols..].iter().all(|&v| v == SENTINEL),
            "{ty}: wrote past n_tok"
        );
    }
    coverage::ran(SUITE, &format!("{what} on {}", device(&gpu)));
}

#[test]
fn unsupported_type_is_refused() {
    let what = "upload of an unsupported type";
    let Some(gpu) = open(what) else { return };
    for ty in [
        GgmlType::Q2K,
        GgmlType::Q8_1,
        GgmlType::Iq4Nl,
        GgmlType::I32,
    ] {
        assert!(!quant::supported(ty));
        let cols = ty.block_size() as usize;
        let bytes = vec![0u8; row_bytes(ty, cols) * 2];
        match DeviceMatrix::upload(&gpu, "blk.0.ffn_up.weight", ty, 2, cols, &bytes, u64::MAX) {
            Err(VulkanError::UnsupportedType { tensor, ty: t }) => {
                assert_eq!(tensor, "blk.0.ffn_up.weight");
                assert_eq!(t, ty);
            }
            Err(e) => panic!("{ty}: wrong error {e}"),
            Ok(_) => panic!("{ty}: accepted"),
        }
    }
    for ty in quant::TYPES {
        assert!(quant::supported(ty));
    }
    coverage::ran(SUITE, &format!("{what} on {}", device(&gpu)));
}

// ---------------------------------------------------------------------------------------------
// Measurement (not a check): `cargo test --profile ci -p flowrt-vulkan --test quant -- --ignored
// --nocapture bench`.

fn time_matmul(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, shapes: &[Shape], ns: &[u32]) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let bytes = random_matrix(&mut rng, ty, rows, cols);
    let m = DeviceMatrix::upload(gpu, "w", ty, rows, cols, &bytes, u64::MAX).unwrap();
    let n_max = *ns.iter().max().unwrap() as usize;
    let x: Vec<f32> = (0..n_max * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let xb = gpu.upload("x", &bytes_of(&x)).unwrap();
    let yb = gpu.storage("y", (n_max * rows * 4) as u64).unwrap();
    let step = gpu
        .uniform("step", bytemuck::bytes_of(&StepParams::default()))
        .unwrap();
    for &shape in shapes {
        let mut k = QuantKernels::with_tuning(Tuning {
            decode: shape,
            small: shape,
            vector_max: 0,
            tiled: shape,
            min_groups: 1,
        });
        let bound = m
            .bind_matmul(gpu, &mut k, &xb, cols as u32, &yb, rows as u32, 0, &step, 0)
            .unwrap();
        for &n in ns {
            gpu.queue.write_buffer(
                &step,
                0,
                bytemuck::bytes_of(&StepParams {
                    n_tok: n,
                    n_out: n,
                    _pad: [0; 2],
                }),
            );
            let run = |reps: u32| {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    for _ in 0..reps {
                        bound.record_form(&mut pass, n, Form::Tiled);
                    }
                }
                let t = Instant::now();
                let idx = gpu.queue.submit([enc.finish()]);
                gpu.wait(Some(idx), TIMEOUT).unwrap();
                t.elapsed().as_secs_f64()
            };
            let first = run(1);
            if n == ns[0] {
                eprintln!(
                    "first dispatch t{}r{}n{}: {:.0} ms",
                    shape.tpr,
                    shape.rpt,
                    shape.nt,
                    first * 1e3
                );
            }
            let one = run(1);
            let reps = ((0.2 / one) as u32).clamp(1, 100);
            // The least of 3 runs: the machine may be busy with other work.
            let s = (0..3).map(|_| run(reps)).fold(f64::INFINITY, f64::min) / reps as f64;
            let gb = m.bytes() as f64 / s / 1e9;
            let gflop = 2.0 * rows as f64 * cols as f64 * n as f64 / s / 1e9;
            eprintln!(
                "{ty} {rows}x{cols} n={n:3} t{}r{}n{}: {:9.3} ms {gb:6.2} GB/s {gflop:6.2} GFLOP/s",
                shape.tpr,
                shape.rpt,
                shape.nt,
                s * 1e3
            );
        }
    }
}

fn env_list<T>(name: &str, parse: impl Fn(&str) -> T) -> Option<Vec<T>> {
    std::env::var(name)
        .ok()
        .map(|s| s.split(',').map(|v| parse(v.trim())).collect())
}

/// Timings on the device: `QUANT_BENCH_TYPES=q4_1,q8_0`, `QUANT_BENCH_N=1,128`,
/// `QUANT_BENCH_SHAPES=1x4x1,16x1x1` (threads per row x rows x tokens per thread; default:
/// the device's tuning), `QUANT_BENCH_SMALL=1` (only the 576x1536 matrix).
#[test]
#[ignore]
fn bench_lavapipe() {
    let Some(gpu) = open("matmul timings") else {
        return;
    };
    let types = env_list("QUANT_BENCH_TYPES", |n| {
        *quant::TYPES
            .iter()
            .find(|t| t.name() == n)
            .unwrap_or_else(|| panic!("type {n}"))
    })
    .unwrap_or_else(|| vec![GgmlType::Q4_1]);
    let ns = env_list("QUANT_BENCH_N", |v| v.parse::<u32>().unwrap());
    let shapes = env_list("QUANT_BENCH_SHAPES", |v| {
        let p: Vec<u32> = v.split('x').map(|d| d.parse().unwrap()).collect();
        Shape {
            tpr: p[0],
            rpt: p[1],
            nt: p[2],
        }
    });
    let t = Tuning::for_device(&gpu);
    // Per n, the shape record() would use, unless shapes are given.
    let plan: Vec<(Vec<Shape>, Vec<u32>)> = match (shapes, ns) {
        (Some(sh), Some(ns)) => vec![(sh, ns)],
        (Some(sh), None) => vec![(sh, vec![1, 4, 8, 16, 128])],
        (None, ns) => ns
            .unwrap_or_else(|| vec![1, 4, 16, 128])
            .into_iter()
            .map(|n| {
                let sh = if n == 1 {
                    t.decode
                } else if n <= t.vector_max {
                    t.small
                } else {
                    t.tiled
                };
                (vec![sh], vec![n])
            })
            .collect(),
    };
    for ty in types {
        // k-quant rows are whole 256-value blocks: 512 columns for the vocabulary matrix.
        let vocab_cols = if ty.block_size() == 256 { 512 } else { 576 };
        for (rows, cols) in [(576, 1536), (49152, vocab_cols)] {
            if rows > 576 && std::env::var("QUANT_BENCH_SMALL").is_ok() {
                continue;
            }
            for (sh, ns) in &plan {
                time_matmul(&gpu, ty, rows, cols, sh, ns);
            }
        }
    }
}
