//! Small GGUF files shared by the integration tests.
#![allow(dead_code)]

use flowrt_gguf::write::{
    f32_bytes, pad_to, write_header, write_kv, write_tensor_info, GgufBuilder,
};
use flowrt_gguf::{Array, GgmlType, Value};

/// A valid file with one entry of every value type (arrays included) and three tensors.
pub fn sample_builder() -> GgufBuilder {
    let mut b = GgufBuilder::new();
    b.kv("general.architecture", "llama")
        .kv("llama.block_count", 2u32)
        .kv("t.u8", 200u8)
        .kv("t.i8", -5i8)
        .kv("t.u16", 60_000u16)
        .kv("t.i16", -30_000i16)
        .kv("t.i32", -7i32)
        .kv("t.f32", 1.5f32)
        .kv("t.bool", true)
        .kv("t.u64", u64::MAX)
        .kv("t.i64", i64::MIN)
        .kv("t.f64", -0.25f64)
        .kv("tokenizer.ggml.tokens", vec!["<s>", "a", "bc", "é"])
        .kv("t.scores", vec![0.0f32, -1.0, 2.5])
        .kv(
            "t.nested",
            vec![Array::from(vec![1u32, 2]), Array::from(vec!["x"])],
        );
    b.tensor("a", &[4], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .tensor("b", &[32, 2], GgmlType::Q8_0, (0..68).collect::<Vec<u8>>())
        .tensor("c", &[3], GgmlType::F16, vec![1, 2, 3, 4, 5, 6]);
    b
}

pub fn sample_bytes() -> Vec<u8> {
    sample_builder().to_bytes()
}

/// One tensor info as written to a hand-assembled file.
pub struct RawInfo<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
    pub type_id: u32,
    pub offset: u64,
}

/// Assembles a file from parts without any consistency checks: header, entries, infos,
/// padding to `align`, then `data`.
pub fn raw_file(
    version: u32,
    kvs: &[(&str, Value)],
    infos: &[RawInfo<'_>],
    data: &[u8],
    align: u64,
) -> Vec<u8> {
    let mut out = Vec::new();
    write_header(&mut out, version, infos.len() as u64, kvs.len() as u64);
    for (k, v) in kvs {
        write_kv(&mut out, k, v);
    }
    for i in infos {
        write_tensor_info(&mut out, i.name, i.dims, i.type_id, i.offset);
    }
    pad_to(&mut out, align);
    out.extend_from_slice(data);
    out
}

/// A file whose only tensor is described by `info`, followed by `data_len` zero bytes.
pub fn one_tensor(info: RawInfo<'_>, data_len: usize) -> Vec<u8> {
    raw_file(3, &[], &[info], &vec![0; data_len], 32)
}
