//! Hostile and damaged model files given to the CLI: each gets a clear error naming the
//! problem and a non-zero exit, never a panic (issue 2, item 1).

use std::path::Path;
use std::process::Command;

use flowrt_gguf::write::{f32_bytes, write_header, write_string, GgufBuilder};
use flowrt_gguf::GgmlType;

fn run_on(bytes: &[u8], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.gguf");
    std::fs::write(&path, bytes).unwrap();
    check(&path, needle);
}

fn check(path: &Path, needle: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_flowrt"))
        .args(["run", path.to_str().unwrap(), "hi", "--raw", "--no-fetch"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "accepted a hostile file ({needle})");
    assert!(!err.contains("panicked"), "panicked: {err}");
    assert!(
        err.contains("hostile.gguf"),
        "the error should name the file: {err}"
    );
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
}

fn small_valid() -> GgufBuilder {
    let mut b = GgufBuilder::new();
    b.kv("general.architecture", "llama").tensor(
        "output_norm.weight",
        &[4],
        GgmlType::F32,
        f32_bytes(&[1.0; 4]),
    );
    b
}

#[test]
fn truncated_file() {
    let bytes = small_valid().to_bytes();
    for cut in [3, 10, 30, bytes.len() - 20] {
        run_on(&bytes[..cut], "");
    }
    run_on(&bytes[..30], "truncated");
}

#[test]
fn tensor_past_the_end_of_the_file() {
    let mut b = small_valid();
    // Declares 1024 f32 values but carries 16 bytes.
    b.raw_tensor(
        "blk.0.attn_q.weight",
        &[1024],
        GgmlType::F32.id(),
        vec![0u8; 16],
    );
    run_on(&b.to_bytes(), "ends past the end");
}

#[test]
fn absurd_string_length() {
    let mut out = Vec::new();
    write_header(&mut out, 3, 0, 1);
    write_string(&mut out, "general.name");
    out.extend_from_slice(&8u32.to_le_bytes()); // string
    out.extend_from_slice(&(1u64 << 60).to_le_bytes());
    out.extend_from_slice(b"abc");
    run_on(&out, "general.name");
}

#[test]
fn absurd_array_length() {
    let mut out = Vec::new();
    write_header(&mut out, 3, 0, 1);
    write_string(&mut out, "tokenizer.ggml.tokens");
    out.extend_from_slice(&9u32.to_le_bytes()); // array
    out.extend_from_slice(&4u32.to_le_bytes()); // of u32
    out.extend_from_slice(&(1u64 << 40).to_le_bytes());
    run_on(&out, "tokenizer.ggml.tokens");
}

#[test]
fn unknown_tensor_type() {
    let mut b = small_valid();
    b.raw_tensor("blk.0.attn_q.weight", &[32], 77, vec![0u8; 64]);
    run_on(&b.to_bytes(), "unknown ggml type id 77");
}

#[test]
fn overflowing_shape() {
    let mut b = small_valid();
    b.raw_tensor(
        "blk.0.attn_q.weight",
        &[1 << 40, 1 << 40, 1 << 20],
        GgmlType::F32.id(),
        vec![0u8; 64],
    );
    run_on(&b.to_bytes(), "overflows");
}

#[test]
fn too_many_tensors_declared() {
    let mut out = Vec::new();
    write_header(&mut out, 3, u64::MAX, 0);
    run_on(&out, "tensors");
}

#[test]
fn valid_container_but_not_a_model() {
    // Parses as GGUF, but lacks everything a llama model needs: the error lists the keys.
    run_on(&small_valid().to_bytes(), "llama.");
}

#[test]
fn unknown_architecture_is_refused_not_substituted() {
    let mut b = GgufBuilder::new();
    b.kv("general.architecture", "rwkv7");
    run_on(&b.to_bytes(), "rwkv7");
}
