//! Relative RMS reconstruction error `‖x − deq(q(x))‖ / ‖x‖` of flowrt's quantisers on the
//! matrices of a model, per type, summed over every matrix (and per matrix with `--per-tensor`).
//! With `--against OTHER.gguf` (the same model quantised elsewhere, e.g. by llama.cpp's
//! `llama-quantize`), each matrix OTHER stores in a quantised type is compared with flowrt's
//! quantiser of that type on the same source values, per type.
//!
//! ```sh
//! cargo run --release -p flowrt-model --example quant_error -- SRC [--types Q4_K,Q6_K]
//!     [--against OTHER.gguf] [--sample N] [--per-tensor] [--reference]
//! ```
//!
//! SRC is a GGUF file (any type flowrt dequantises) or a safetensors file or checkpoint
//! directory (F32, F16, BF16). Matrices are quantised row by row as `flowrt pack` does; a type
//! whose block does not divide a matrix's row length skips that matrix (counted). `--sample N`
//! takes every N-th row. Quantisation is `flowrt pack`'s (`Kernels::quantize_row_weights`);
//! `--reference` uses `Kernels::quantize_row` (ggml's reference rule for Q4_0/Q4_1/Q5_0/Q5_1).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use flowrt_dtype::GgmlType;
use flowrt_kernels::{row_size, Kernels};

/// `--reference`: quantise with `Kernels::quantize_row` (ggml's reference rule for Q4_0, Q4_1,
/// Q5_0, Q5_1) instead of the weight quantisers `flowrt pack` uses.
static REFERENCE: AtomicBool = AtomicBool::new(false);

/// Reads row `r` of a matrix as f32 into the buffer.
type ReadRow = dyn Fn(usize, &mut [f32]) + Sync;

/// One source matrix: its name, row length and f32 rows (read lazily).
struct Matrix {
    name: String,
    cols: usize,
    rows: usize,
    read: Box<ReadRow>,
}

fn usage() -> ! {
    eprintln!(
        "usage: quant_error SRC [--types T,T] [--against OTHER.gguf] [--sample N] [--per-tensor] [--reference]"
    );
    std::process::exit(2);
}

fn parse_type(s: &str) -> GgmlType {
    use GgmlType::*;
    match s.to_ascii_uppercase().as_str() {
        "Q4_0" => Q4_0,
        "Q4_1" => Q4_1,
        "Q5_0" => Q5_0,
        "Q5_1" => Q5_1,
        "Q8_0" => Q8_0,
        "Q4_K" => Q4K,
        "Q5_K" => Q5K,
        "Q6_K" => Q6K,
        other => {
            eprintln!("unknown type {other}");
            std::process::exit(2)
        }
    }
}

fn gguf_matrices(file: &'static flowrt_gguf::GgufFile) -> Vec<Matrix> {
    let k = Kernels::scalar();
    file.tensors()
        .iter()
        .filter(|t| t.dims.len() >= 2 && Kernels::supports_conversion(t.ggml_type))
        .map(|t| {
            let cols = t.dims[0] as usize;
            let rows = (t.n_elements() as usize) / cols;
            let ty = t.ggml_type;
            let data = file.tensor_data(t);
            let rb = row_size(ty, cols);
            Matrix {
                name: t.name.clone(),
                cols,
                rows,
                read: Box::new(move |r, out| {
                    k.dequantize_row(ty, &data[r * rb..(r + 1) * rb], out)
                }),
            }
        })
        .collect()
}

fn safetensors_matrices(path: &Path) -> Vec<Matrix> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .expect("read dir")
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        v.sort();
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::new();
    for f in files {
        let bytes: &'static [u8] = Vec::leak(std::fs::read(&f).expect("read safetensors"));
        let st = safetensors::SafeTensors::deserialize(bytes).expect("parse safetensors");
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        for name in names {
            let t = st.tensor(&name).expect("tensor");
            let shape = t.shape();
            if shape.len() < 2 {
                continue;
            }
            let (conv, width): (fn(&[u8]) -> f32, usize) = match t.dtype() {
                safetensors::Dtype::F32 => (|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]), 4),
                safetensors::Dtype::F16 => {
                    (|b| flowrt_kernels::blocks::f16_to_f32([b[0], b[1]]), 2)
                }
                safetensors::Dtype::BF16 => {
                    (|b| flowrt_kernels::blocks::bf16_to_f32([b[0], b[1]]), 2)
                }
                _ => continue,
            };
            let cols = *shape.last().expect("2-D");
            let rows = shape.iter().product::<usize>() / cols;
            let data: &'static [u8] = t.data();
            out.push(Matrix {
                name,
                cols,
                rows,
                read: Box::new(move |r, o| {
                    let row = &data[r * cols * width..(r + 1) * cols * width];
                    for (v, b) in o.iter_mut().zip(row.chunks_exact(width)) {
                        *v = conv(b);
                    }
                }),
            });
        }
    }
    out
}

/// `m` as rows of 256 consecutive values (`--flat`: every matrix usable by every type).
fn flatten(m: Matrix) -> Option<Matrix> {
    let total = m.rows * m.cols;
    if !total.is_multiple_of(256) {
        return None;
    }
    let cols = m.cols;
    let inner = m.read;
    Some(Matrix {
        name: m.name,
        cols: 256,
        rows: total / 256,
        read: Box::new(move |r, out| {
            let mut buf = vec![0f32; cols];
            let (start, end) = (r * 256, r * 256 + 256);
            let mut i = start;
            while i < end {
                let (sr, off) = (i / cols, i % cols);
                inner(sr, &mut buf);
                let take = (cols - off).min(end - i);
                out[i - start..i - start + take].copy_from_slice(&buf[off..off + take]);
                i += take;
            }
        }),
    })
}

/// `(sum ‖x − deq(q(x))‖², sum ‖x‖²)` over the sampled rows of `m` quantised as `ty`, or the
/// error of `other`'s stored rows (type `ty`) against the same source rows.
fn error(m: &Matrix, ty: GgmlType, sample: usize, other: Option<&ReadRow>) -> (f64, f64) {
    let k = Kernels::detect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows: Vec<usize> = (0..m.rows).step_by(sample).collect();
    let per = rows.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = rows
            .chunks(per)
            .map(|chunk| {
                s.spawn(move || {
                    let mut x = vec![0f32; m.cols];
                    let mut y = vec![0f32; m.cols];
                    let mut q = vec![0u8; row_size(ty, m.cols)];
                    let (mut e, mut n) = (0f64, 0f64);
                    for &r in chunk {
                        (m.read)(r, &mut x);
                        match other {
                            Some(o) => o(r, &mut y),
                            None => {
                                if REFERENCE.load(Ordering::Relaxed) {
                                    k.quantize_row(ty, &x, &mut q);
                                } else {
                                    k.quantize_row_weights(ty, &x, &mut q);
                                }
                                k.dequantize_row(ty, &q, &mut y);
                            }
                        }
                        for (&a, &b) in x.iter().zip(&y) {
                            e += (a as f64 - b as f64).powi(2);
                            n += (a as f64).powi(2);
                        }
                    }
                    (e, n)
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    })
}

fn rel(e: f64, n: f64) -> f64 {
    if n > 0.0 {
        (e / n).sqrt()
    } else {
        0.0
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut src = None;
    let mut types = vec![
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ];
    let mut against = None;
    let mut sample = 1usize;
    let mut per_tensor = false;
    let mut flat = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--types" => {
                types = args
                    .next()
                    .unwrap_or_else(|| usage())
                    .split(',')
                    .map(parse_type)
                    .collect()
            }
            "--against" => against = Some(PathBuf::from(args.next().unwrap_or_else(|| usage()))),
            "--sample" => {
                sample = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            "--per-tensor" => per_tensor = true,
            "--flat" => flat = true,
            "--reference" => REFERENCE.store(true, Ordering::Relaxed),
            _ if src.is_none() && !a.starts_with("--") => src = Some(PathBuf::from(a)),
            _ => usage(),
        }
    }
    let src = src.unwrap_or_else(|| usage());
    let mut matrices = if src.extension().is_some_and(|e| e == "gguf") {
        let f = Box::leak(Box::new(
            flowrt_gguf::GgufFile::open(&src).expect("open SRC"),
        ));
        gguf_matrices(f)
    } else {
        safetensors_matrices(&src)
    };
    if flat {
        matrices = matrices.into_iter().filter_map(flatten).collect();
    }
    if let Some(path) = against {
        let other = Box::leak(Box::new(
            flowrt_gguf::GgufFile::open(&path).expect("open OTHER"),
        ));
        let k = Kernels::scalar();
        // type -> (flowrt err, flowrt norm, other err, other norm, matrices)
        let mut by: BTreeMap<String, (f64, f64, f64, f64, usize)> = BTreeMap::new();
        println!(
            "{:<40} {:>6} {:>12} {:>12}",
            "tensor", "type", "flowrt", "other"
        );
        for m in &matrices {
            let Some(t) = other.tensor(&m.name) else {
                continue;
            };
            let ty = t.ggml_type;
            if !matches!(
                ty,
                GgmlType::Q4_0
                    | GgmlType::Q4_1
                    | GgmlType::Q5_0
                    | GgmlType::Q5_1
                    | GgmlType::Q8_0
                    | GgmlType::Q4K
                    | GgmlType::Q5K
                    | GgmlType::Q6K
            ) || t.dims[0] as usize != m.cols
            {
                continue;
            }
            let data = other.tensor_data(t);
            let rb = row_size(ty, m.cols);
            let read =
                move |r: usize, o: &mut [f32]| k.dequantize_row(ty, &data[r * rb..(r + 1) * rb], o);
            let (fe, fnorm) = error(m, ty, sample, None);
            let (oe, onorm) = error(m, ty, sample, Some(&read));
            if per_tensor {
                println!(
                    "{:<40} {:>6} {:>12.6} {:>12.6}",
                    m.name,
                    ty.to_string(),
                    rel(fe, fnorm),
                    rel(oe, onorm)
                );
            }
            let e = by.entry(ty.to_string()).or_default();
            e.0 += fe;
            e.1 += fnorm;
            e.2 += oe;
            e.3 += onorm;
            e.4 += 1;
        }
        println!("per type (all its matrices): relative RMS error, flowrt vs other");
        for (ty, (fe, fnorm, oe, onorm, n)) in by {
            println!(
                "  {ty:<6} {n:>4} matrices  flowrt {:.6}  other {:.6}  ratio {:.4}",
                rel(fe, fnorm),
                rel(oe, onorm),
                rel(fe, fnorm) / rel(oe, onorm)
            );
        }
        return;
    }
    let mut totals = vec![(0f64, 0f64, 0usize, 0usize); types.len()];
    for m in &matrices {
        let mut line = format!("{:<40} {:>6}x{:<6}", m.name, m.rows, m.cols);
        for (i, &ty) in types.iter().enumerate() {
            if !m.cols.is_multiple_of(ty.block_size() as usize) {
                totals[i].3 += 1;
                line += &format!(" {:>10}", "-");
                continue;
            }
            let (e, n) = error(m, ty, sample, None);
            totals[i].0 += e;
            totals[i].1 += n;
            totals[i].2 += 1;
            line += &format!(" {:>10.6}", rel(e, n));
        }
        if per_tensor {
            println!("{line}");
        }
    }
    println!("relative RMS error over all matrices (every {sample}-th row):");
    for (i, ty) in types.iter().enumerate() {
        let (e, n, used, skipped) = totals[i];
        println!(
            "  {:<6} {:.6}  ({used} matrices, {skipped} skipped: row length)",
            ty.to_string(),
            rel(e, n)
        );
    }
}
