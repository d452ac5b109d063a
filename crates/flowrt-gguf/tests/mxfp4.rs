//! MXFP4 tensors (GGUF type 39, as llama.cpp and gguf-py number it: blocks of 32 values in 17
//! bytes) are read and written like any block type; a row that is not whole blocks is refused.

use flowrt_gguf::write::GgufBuilder;
use flowrt_gguf::{GgmlType, GgufFile};

#[test]
fn mxfp4_tensors_round_trip_with_type_id_39() {
    assert_eq!(GgmlType::Mxfp4.id(), 39);
    let data: Vec<u8> = (0..17 * 2 * 3).map(|i| (i * 7) as u8).collect();
    let bytes = GgufBuilder::new()
        .kv("general.architecture", "llama")
        .tensor(
            "blk.0.ffn_up.weight",
            &[64, 3],
            GgmlType::Mxfp4,
            data.clone(),
        )
        .to_bytes();
    let f = GgufFile::from_bytes(bytes).unwrap();
    let t = f.tensor("blk.0.ffn_up.weight").unwrap();
    assert_eq!(t.ggml_type, GgmlType::Mxfp4);
    assert_eq!(t.size_bytes, 17 * 2 * 3);
    assert_eq!(f.tensor_data(t), &data[..]);
}

#[test]
fn mxfp4_rows_must_be_whole_blocks() {
    // 48 values per row: one and a half blocks.
    let bytes = GgufBuilder::new()
        .kv("general.architecture", "llama")
        .raw_tensor("w", &[48, 2], 39, vec![0u8; 64])
        .to_bytes();
    let e = GgufFile::from_bytes(bytes).unwrap_err().to_string();
    assert!(e.contains("mxfp4") && e.contains("48"), "{e}");
}
