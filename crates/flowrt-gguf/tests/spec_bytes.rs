//! A file spelled out byte by byte from the GGUF spec, independent of this crate's writer:
//! guards against a reader and writer that agree with each other but not with the format.

use flowrt_gguf::write::{f32_bytes, GgufBuilder};
use flowrt_gguf::{Array, GgmlType, GgufFile, Value};

fn hand_written() -> Vec<u8> {
    let mut f: Vec<u8> = Vec::new();
    f.extend(b"GGUF");
    f.extend([3, 0, 0, 0]); // version 3
    f.extend([1, 0, 0, 0, 0, 0, 0, 0]); // tensor_count
    f.extend([3, 0, 0, 0, 0, 0, 0, 0]); // metadata_kv_count
                                        // "n" : u32 0x01020304
    f.extend([1, 0, 0, 0, 0, 0, 0, 0]);
    f.extend(b"n");
    f.extend([4, 0, 0, 0]);
    f.extend([0x04, 0x03, 0x02, 0x01]);
    // "s" : string "hi"
    f.extend([1, 0, 0, 0, 0, 0, 0, 0]);
    f.extend(b"s");
    f.extend([8, 0, 0, 0]);
    f.extend([2, 0, 0, 0, 0, 0, 0, 0]);
    f.extend(b"hi");
    // "a" : array of i16 [-2, 258]
    f.extend([1, 0, 0, 0, 0, 0, 0, 0]);
    f.extend(b"a");
    f.extend([9, 0, 0, 0]); // array
    f.extend([3, 0, 0, 0]); // of i16
    f.extend([2, 0, 0, 0, 0, 0, 0, 0]);
    f.extend([0xfe, 0xff, 0x02, 0x01]);
    // tensor "t": 2 dims [2, 1], f32, offset 0
    f.extend([1, 0, 0, 0, 0, 0, 0, 0]);
    f.extend(b"t");
    f.extend([2, 0, 0, 0]);
    f.extend([2, 0, 0, 0, 0, 0, 0, 0]);
    f.extend([1, 0, 0, 0, 0, 0, 0, 0]);
    f.extend([0, 0, 0, 0]); // f32
    f.extend([0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(f.len(), 134);
    f.resize(160, 0); // pad to the default alignment of 32
    f.extend([0x00, 0x00, 0x80, 0x3f]); // 1.0f32
    f.extend([0x00, 0x00, 0x00, 0xc0]); // -2.0f32
    f
}

#[test]
fn reads_a_hand_written_file() {
    let file = GgufFile::from_bytes(hand_written()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.get("n"), Some(&Value::U32(0x0102_0304)));
    assert_eq!(file.get_str("s").unwrap(), Some("hi"));
    assert_eq!(
        file.get_array("a").unwrap(),
        Some(&Array::I16(vec![-2, 258]))
    );
    assert_eq!(file.data_offset(), 160);
    let t = file.tensor("t").unwrap();
    assert_eq!(
        (t.dims.as_slice(), t.ggml_type, t.offset, t.size_bytes),
        (&[2, 1][..], GgmlType::F32, 0, 8)
    );
    assert_eq!(file.tensor_data(t), [0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]);
}

#[test]
fn builder_writes_the_same_bytes() {
    let bytes = GgufBuilder::new()
        .kv("n", 0x0102_0304u32)
        .kv("s", "hi")
        .kv("a", vec![-2i16, 258])
        .tensor("t", &[2, 1], GgmlType::F32, f32_bytes(&[1.0, -2.0]))
        .to_bytes();
    // The builder pads the last tensor to the alignment as well.
    let mut expected = hand_written();
    expected.resize(192, 0);
    assert_eq!(bytes, expected);
}
