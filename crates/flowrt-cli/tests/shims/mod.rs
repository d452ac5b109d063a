//! The port shims of issue 15 (the MiniCPM5 thread) made from a llama-architecture GGUF file
//! (SmolLM2, the default model) in Rust, as `scripts/make_port_shims.py --gguf` makes them with
//! gguf-py: metadata and stored tensor bytes copied, nothing dequantised.
//!
//! - [`Shim::Qwen3Relabel`]: `general.architecture` `qwen3`, `llama.*` keys renamed `qwen3.*`,
//!   all-ones F32 `attn_q_norm` / `attn_k_norm` (head_dim) in every layer. llama GGUF files
//!   store attn_q / attn_k rows permuted per head for adjacent-pair RoPE and qwen3 files in the
//!   half-split order, so those rows are moved back (whole byte rows): the shim differs from its
//!   source by the injected QK-norm only.
//! - [`Shim::KvReplicated`]: each KV head's rows of attn_k / attn_v repeated `factor` times in
//!   place (the llama permutation stays inside a head), `head_count_kv` × `factor`.
//! - [`Shim::TiedDuplicated`]: `output.weight` added, a copy of `token_embd.weight`'s bytes.

#![allow(dead_code)] // Each test file uses some of these.

use std::borrow::Cow;
use std::path::Path;

use flowrt_gguf::write::{StreamWriter, TensorSpec};
use flowrt_gguf::{GgmlType, GgufFile, Value};

/// Which shim.
#[derive(Clone, Copy, Debug)]
pub enum Shim {
    Qwen3Relabel,
    /// KV heads × this factor.
    KvReplicated(usize),
    TiedDuplicated,
}

fn meta_u(f: &GgufFile, key: &str) -> usize {
    f.get_u64(key)
        .unwrap()
        .unwrap_or_else(|| panic!("no {key}")) as usize
}

/// Stored row `r` of a llama GGUF Q/K matrix holds HF row `h*hd + j*hd/2 + i` for
/// `r = h*hd + 2i + j`: the half-split (HF) row `s` is stored at this row.
fn stored_row_of_half_split(s: usize, hd: usize) -> usize {
    let (h, within) = (s / hd, s % hd);
    let (j, i) = (within / (hd / 2), within % (hd / 2));
    h * hd + 2 * i + j
}

/// Writes `shim` of the llama GGUF file `src` to `out`.
pub fn make(src: &Path, shim: Shim, out: &Path) {
    let f = GgufFile::open(src).unwrap();
    assert_eq!(
        f.get_str("general.architecture").unwrap(),
        Some("llama"),
        "{}: the shims start from a llama GGUF",
        src.display()
    );
    let n_head = meta_u(&f, "llama.attention.head_count");
    let n_kv = meta_u(&f, "llama.attention.head_count_kv");
    let hd = meta_u(&f, "llama.embedding_length") / n_head;
    let n_layer = meta_u(&f, "llama.block_count");

    let mut meta: Vec<(String, Value)> = f.metadata().to_vec();
    let mut tensors: Vec<(TensorSpec, Cow<[u8]>)> = f
        .tensors()
        .iter()
        .map(|t| {
            (
                TensorSpec {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                    ty: t.ggml_type,
                },
                Cow::Borrowed(f.tensor_data(t)),
            )
        })
        .collect();
    // Rows of a 2-D tensor moved as whole byte rows.
    let map_rows = |data: &[u8], rows: usize, out_rows: usize, from: &dyn Fn(usize) -> usize| {
        let rb = data.len() / rows;
        let mut v = Vec::with_capacity(out_rows * rb);
        for r in 0..out_rows {
            v.extend_from_slice(&data[from(r) * rb..(from(r) + 1) * rb]);
        }
        v
    };
    match shim {
        Shim::Qwen3Relabel => {
            for (k, v) in &mut meta {
                if let Some(rest) = k.strip_prefix("llama.") {
                    *k = format!("qwen3.{rest}");
                } else if k == "general.architecture" {
                    *v = Value::from("qwen3");
                }
            }
            for (spec, data) in &mut tensors {
                if spec.name.ends_with(".attn_q.weight") || spec.name.ends_with(".attn_k.weight") {
                    let rows = spec.dims[1] as usize;
                    let moved = map_rows(data, rows, rows, &|s| stored_row_of_half_split(s, hd));
                    *data = Cow::Owned(moved);
                }
            }
            let ones: Vec<u8> = (0..hd).flat_map(|_| 1f32.to_le_bytes()).collect();
            for i in 0..n_layer {
                for norm in ["attn_q_norm", "attn_k_norm"] {
                    tensors.push((
                        TensorSpec {
                            name: format!("blk.{i}.{norm}.weight"),
                            dims: vec![hd as u64],
                            ty: GgmlType::F32,
                        },
                        Cow::Owned(ones.clone()),
                    ));
                }
            }
        }
        Shim::KvReplicated(factor) => {
            assert!(
                n_head.is_multiple_of(n_kv * factor),
                "{n_head} query heads cannot use {n_kv} x {factor} KV heads"
            );
            for (k, v) in &mut meta {
                if k == "llama.attention.head_count_kv" {
                    *v = Value::U32((n_kv * factor) as u32);
                }
            }
            for (spec, data) in &mut tensors {
                if spec.name.ends_with(".attn_k.weight") || spec.name.ends_with(".attn_v.weight") {
                    let rows = spec.dims[1] as usize;
                    let out_rows = rows * factor;
                    // New head g is a copy of old head g / factor, rows in the stored order.
                    let moved =
                        map_rows(data, rows, out_rows, &|r| (r / hd) / factor * hd + r % hd);
                    *data = Cow::Owned(moved);
                    spec.dims[1] = out_rows as u64;
                }
            }
        }
        Shim::TiedDuplicated => {
            assert!(f.tensor("output.weight").is_none(), "already untied");
            let (spec, data) = tensors
                .iter()
                .find(|(s, _)| s.name == "token_embd.weight")
                .cloned()
                .expect("token_embd.weight");
            tensors.push((
                TensorSpec {
                    name: "output.weight".into(),
                    ..spec
                },
                data,
            ));
        }
    }
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = StreamWriter::create(out, &meta, &specs).unwrap();
    for (spec, data) in &tensors {
        w.write_tensor(&spec.name, data).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn half_split_rows_come_from_the_llama_permutation() {
    // pack.rs's permuted_row (HF -> llama GGUF) for hd 4: stored row r holds HF row
    // [0, 2, 1, 3][r]; this is its inverse.
    let got: Vec<usize> = (0..8).map(|s| stored_row_of_half_split(s, 4)).collect();
    assert_eq!(got, [0, 2, 1, 3, 4, 6, 5, 7]);
    let got: Vec<usize> = (0..8).map(|s| stored_row_of_half_split(s, 8)).collect();
    assert_eq!(got, [0, 2, 4, 6, 1, 3, 5, 7]);
}
