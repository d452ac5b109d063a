//! Damaged and crafted files: each must fail with the specific typed error, never panic.

mod common;

use common::{one_tensor, raw_file, sample_bytes, RawInfo};
use flowrt_gguf::write::{write_header, write_string, GgufBuilder};
use flowrt_gguf::{
    Array, GgmlType, GgufError, GgufFile, Value, MAX_ARRAY_LEN, MAX_KEYS, MAX_NAME_LEN,
    MAX_NESTING, MAX_STRING_LEN, MAX_TENSORS,
};

fn parse(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("parsed a bad file: {f:?}"),
        Err(e) => e,
    }
}

/// Header with no tensors and one metadata entry, then the entry's key and type id.
fn one_kv_prefix(key: &str, ty: u32) -> Vec<u8> {
    let mut f = Vec::new();
    write_header(&mut f, 3, 0, 1);
    write_string(&mut f, key);
    f.extend(ty.to_le_bytes());
    f
}

fn f32_info<'a>(name: &'a str, dims: &'a [u64], offset: u64) -> RawInfo<'a> {
    RawInfo {
        name,
        dims,
        type_id: GgmlType::F32.id(),
        offset,
    }
}

#[test]
fn bad_magic() {
    let mut f = sample_bytes();
    f[..4].copy_from_slice(b"GGML");
    let e = parse(f);
    assert!(
        matches!(e, GgufError::BadMagic { found } if &found == b"GGML"),
        "{e:?}"
    );
}

#[test]
fn version_1_is_unsupported() {
    let e = parse(GgufBuilder::new().version(1).to_bytes());
    assert!(matches!(e, GgufError::UnsupportedVersion(1)), "{e:?}");
    assert!(e.to_string().contains("obsolete"), "{e}");
}

#[test]
fn unknown_versions_are_unsupported() {
    for v in [0, 4, u32::MAX] {
        let e = parse(GgufBuilder::new().version(v).to_bytes());
        assert!(
            matches!(e, GgufError::UnsupportedVersion(x) if x == v),
            "{e:?}"
        );
    }
}

#[test]
fn big_endian_file_is_named_as_such() {
    let e = parse(GgufBuilder::new().version(3u32.swap_bytes()).to_bytes());
    assert!(
        matches!(e, GgufError::UnsupportedVersion(0x0300_0000)),
        "{e:?}"
    );
    assert!(e.to_string().contains("big-endian"), "{e}");
}

#[test]
fn truncated_at_every_byte_offset() {
    let full = sample_bytes();
    let file = GgufFile::from_bytes(full.clone()).unwrap();
    let data_end = file
        .tensors()
        .iter()
        .map(|t| file.data_offset() + t.offset + t.size_bytes)
        .max()
        .unwrap();
    let mut seen_past_end = false;
    for n in 0..full.len() {
        let result = GgufFile::from_bytes(full[..n].to_vec());
        if n as u64 >= data_end {
            // Only the padding after the last tensor is missing: still a complete file.
            assert!(result.is_ok(), "prefix {n}: {:?}", result.err());
            continue;
        }
        match result {
            // While the header is cut, reads run out; once it is whole, tensors do.
            Err(GgufError::Truncated {
                offset, need, have, ..
            }) => {
                assert!(!seen_past_end, "prefix {n}: Truncated after TensorPastEnd");
                assert!(
                    offset + have == n as u64 && need > have,
                    "prefix {n}: {offset} {need} {have}"
                );
            }
            Err(GgufError::TensorPastEnd { file_len, .. }) => {
                assert_eq!(file_len, n as u64);
                seen_past_end = true;
            }
            other => panic!("prefix {n}: unexpected {other:?}"),
        }
    }
    assert!(seen_past_end);
}

#[test]
fn string_value_too_long() {
    let mut f = one_kv_prefix("k", 8);
    f.extend((MAX_STRING_LEN + 1).to_le_bytes());
    let e = parse(f);
    assert!(
        matches!(e, GgufError::StringTooLong { len, max, .. } if len == MAX_STRING_LEN + 1 && max == MAX_STRING_LEN),
        "{e:?}"
    );
    assert!(e.to_string().contains("value of `k`"), "{e}");
}

#[test]
fn key_too_long() {
    let mut f = Vec::new();
    write_header(&mut f, 3, 0, 1);
    f.extend((1u64 << 40).to_le_bytes());
    f.extend([0u8; 16]);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::StringTooLong { len, max, .. } if len == 1 << 40 && max == MAX_NAME_LEN),
        "{e:?}"
    );
}

#[test]
fn tensor_name_too_long() {
    let mut f = Vec::new();
    write_header(&mut f, 3, 1, 0);
    f.extend((MAX_NAME_LEN + 1).to_le_bytes());
    f.extend([0u8; 64]);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::StringTooLong { ref what, .. } if what.contains("tensor 0")),
        "{e:?}"
    );
}

#[test]
fn string_longer_than_the_file() {
    let mut f = one_kv_prefix("k", 8);
    f.extend(1000u64.to_le_bytes());
    f.extend(b"short");
    let e = parse(f);
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                need: 1000,
                have: 5,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn array_too_long() {
    let mut f = one_kv_prefix("tokenizer.ggml.tokens", 9);
    f.extend(8u32.to_le_bytes());
    f.extend((MAX_ARRAY_LEN + 1).to_le_bytes());
    let e = parse(f);
    assert!(
        matches!(e, GgufError::ArrayTooLong { ref key, len, max } if key == "tokenizer.ggml.tokens" && len == MAX_ARRAY_LEN + 1 && max == MAX_ARRAY_LEN),
        "{e:?}"
    );
}

#[test]
fn array_longer_than_the_file() {
    // Within the cap, but 2^24 strings need at least 2^27 bytes of length prefixes.
    let mut f = one_kv_prefix("k", 9);
    f.extend(8u32.to_le_bytes());
    f.extend(MAX_ARRAY_LEN.to_le_bytes());
    f.extend([0u8; 100]);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::Truncated { need, have: 100, .. } if need == MAX_ARRAY_LEN * 8),
        "{e:?}"
    );
}

fn nested(depth: u32) -> Array {
    (1..depth).fold(Array::from(vec![1u8]), |inner, _| Array::Array(vec![inner]))
}

#[test]
fn nesting_too_deep() {
    let ok = GgufBuilder::new()
        .kv("deep", nested(MAX_NESTING))
        .to_bytes();
    assert_eq!(
        GgufFile::from_bytes(ok).unwrap().get_array("deep").unwrap(),
        Some(&nested(MAX_NESTING))
    );
    let e = parse(
        GgufBuilder::new()
            .kv("deep", nested(MAX_NESTING + 1))
            .to_bytes(),
    );
    assert!(
        matches!(e, GgufError::NestingTooDeep { ref key, max } if key == "deep" && max == MAX_NESTING),
        "{e:?}"
    );
}

#[test]
fn unknown_value_type() {
    let mut f = one_kv_prefix("k", 13);
    f.extend([0u8; 16]);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::UnknownValueType { ref key, ty: 13 } if key == "k"),
        "{e:?}"
    );
}

#[test]
fn unknown_array_element_type() {
    let mut f = one_kv_prefix("k", 9);
    f.extend(99u32.to_le_bytes());
    f.extend(1u64.to_le_bytes());
    f.extend([0u8; 16]);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::UnknownValueType { ref key, ty: 99 } if key == "k"),
        "{e:?}"
    );
}

#[test]
fn invalid_bool() {
    let mut f = one_kv_prefix("flag", 7);
    f.push(2);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::InvalidBool { ref key, byte: 2 } if key == "flag"),
        "{e:?}"
    );
    let mut f = one_kv_prefix("flags", 9);
    f.extend(7u32.to_le_bytes());
    f.extend(2u64.to_le_bytes());
    f.extend([1, 0xff]);
    assert!(matches!(
        parse(f),
        GgufError::InvalidBool { byte: 0xff, .. }
    ));
}

#[test]
fn invalid_utf8_in_key() {
    let mut f = Vec::new();
    write_header(&mut f, 3, 0, 1);
    f.extend(2u64.to_le_bytes());
    f.extend([0xc3, 0x28]);
    f.extend(0u32.to_le_bytes());
    f.push(0);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, offset: 32 } if what.contains("key")),
        "{e:?}"
    );
}

#[test]
fn invalid_utf8_in_string_value() {
    let mut f = one_kv_prefix("name", 8);
    f.extend(1u64.to_le_bytes());
    f.push(0xff);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, .. } if what.contains("`name`")),
        "{e:?}"
    );
}

#[test]
fn invalid_utf8_in_tensor_name() {
    let mut f = one_tensor(f32_info("ab", &[1], 0), 4);
    let at = f.windows(2).position(|w| w == b"ab").unwrap();
    f[at] = 0x80;
    let e = parse(f);
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, .. } if what.contains("tensor 0")),
        "{e:?}"
    );
}

#[test]
fn too_many_keys() {
    let mut f = Vec::new();
    write_header(&mut f, 3, 0, MAX_KEYS + 1);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::TooManyKeys { count, max } if count == MAX_KEYS + 1 && max == MAX_KEYS),
        "{e:?}"
    );
}

#[test]
fn too_many_tensors() {
    let mut f = Vec::new();
    write_header(&mut f, 3, u64::MAX, 0);
    let e = parse(f);
    assert!(
        matches!(e, GgufError::TooManyTensors { count: u64::MAX, max } if max == MAX_TENSORS),
        "{e:?}"
    );
}

#[test]
fn counts_larger_than_the_file() {
    let mut f = Vec::new();
    write_header(&mut f, 3, 0, MAX_KEYS);
    let e = parse(f);
    assert!(matches!(e, GgufError::Truncated { have: 0, .. }), "{e:?}");
    let mut f = Vec::new();
    write_header(&mut f, 3, MAX_TENSORS, 0);
    f.extend([0u8; 10]);
    let e = parse(f);
    assert!(matches!(e, GgufError::Truncated { have: 10, .. }), "{e:?}");
}

#[test]
fn duplicate_key() {
    let e = parse(
        GgufBuilder::new()
            .kv("a", 1u8)
            .kv("b", 2u8)
            .kv("a", "x")
            .to_bytes(),
    );
    assert!(
        matches!(e, GgufError::DuplicateKey { ref key } if key == "a"),
        "{e:?}"
    );
}

#[test]
fn duplicate_tensor() {
    let e = parse(
        GgufBuilder::new()
            .tensor("w", &[1], GgmlType::F32, [0u8; 4])
            .tensor("w", &[1], GgmlType::F32, [0u8; 4])
            .to_bytes(),
    );
    assert!(
        matches!(e, GgufError::DuplicateTensor { ref tensor } if tensor == "w"),
        "{e:?}"
    );
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48] {
        let e = parse(GgufBuilder::new().alignment(a).to_bytes());
        assert!(
            matches!(e, GgufError::BadAlignment(x) if x == u64::from(a)),
            "{a}: {e:?}"
        );
    }
}

#[test]
fn alignment_of_the_wrong_type() {
    let e = parse(GgufBuilder::new().kv("general.alignment", "32").to_bytes());
    assert!(
        matches!(e, GgufError::TypeMismatch { ref key, .. } if key == "general.alignment"),
        "{e:?}"
    );
    let e = parse(
        GgufBuilder::new()
            .kv("general.alignment", -32i32)
            .to_bytes(),
    );
    assert!(
        matches!(e, GgufError::NegativeInteger { value: -32, .. }),
        "{e:?}"
    );
}

#[test]
fn unknown_tensor_type() {
    let e = parse(
        GgufBuilder::new()
            .raw_tensor("w", &[32], 4, [0u8; 32])
            .to_bytes(),
    );
    assert!(
        matches!(e, GgufError::UnknownTensorType { ref tensor, id: 4 } if tensor == "w"),
        "{e:?}"
    );
}

#[test]
fn too_many_dims() {
    let e = parse(one_tensor(f32_info("w", &[1, 1, 1, 1, 1], 0), 4));
    assert!(
        matches!(e, GgufError::TooManyDims { ref tensor, n: 5, max: 4 } if tensor == "w"),
        "{e:?}"
    );
    // The count is checked before the dims are read, so a huge count allocates nothing.
    let mut f = Vec::new();
    write_header(&mut f, 3, 1, 0);
    write_string(&mut f, "w");
    f.extend(u32::MAX.to_le_bytes());
    f.extend([0u8; 16]);
    assert!(matches!(
        parse(f),
        GgufError::TooManyDims { n: u32::MAX, .. }
    ));
}

#[test]
fn zero_dim() {
    let e = parse(one_tensor(f32_info("w", &[4, 0], 0), 16));
    assert!(
        matches!(e, GgufError::ZeroDim { ref tensor, ref dims } if tensor == "w" && dims == &[4, 0]),
        "{e:?}"
    );
}

#[test]
fn shape_overflow() {
    // The element count overflows.
    let dims = [1 << 32, 1 << 32, 1 << 32];
    let e = parse(one_tensor(f32_info("w", &dims, 0), 4));
    assert!(
        matches!(e, GgufError::ShapeOverflow { ref tensor, ref dims } if tensor == "w" && dims.len() == 3),
        "{e:?}"
    );
    // The element count fits but the byte size does not.
    let e = parse(one_tensor(f32_info("w", &[1 << 62], 0), 4));
    assert!(matches!(e, GgufError::ShapeOverflow { .. }), "{e:?}");
}

#[test]
fn row_not_block_aligned() {
    let e = parse(one_tensor(
        RawInfo {
            name: "q",
            dims: &[33],
            type_id: GgmlType::Q4_0.id(),
            offset: 0,
        },
        64,
    ));
    assert!(
        matches!(e, GgufError::RowNotBlockAligned { ref tensor, ty: GgmlType::Q4_0, row: 33, block: 32 } if tensor == "q"),
        "{e:?}"
    );
}

#[test]
fn misaligned() {
    let e = parse(one_tensor(f32_info("w", &[1], 8), 64));
    assert!(
        matches!(e, GgufError::Misaligned { ref tensor, offset: 8, alignment: 32 } if tensor == "w"),
        "{e:?}"
    );
}

#[test]
fn tensor_past_end() {
    let f = one_tensor(f32_info("w", &[8], 0), 31);
    let len = f.len() as u64;
    let e = parse(f);
    assert!(
        matches!(e, GgufError::TensorPastEnd { ref tensor, offset: 0, size: 32, file_len, .. } if tensor == "w" && file_len == len),
        "{e:?}"
    );
}

#[test]
fn tensor_offset_overflowing_u64() {
    let offset = u64::MAX - 31; // aligned to 32; adding the data offset overflows
    let e = parse(one_tensor(f32_info("w", &[1], offset), 4));
    assert!(
        matches!(e, GgufError::TensorPastEnd { offset: o, .. } if o == offset),
        "{e:?}"
    );
}

#[test]
fn overlap() {
    let infos = [f32_info("a", &[16], 0), f32_info("b", &[8], 32)];
    let e = parse(raw_file(3, &[], &infos, &[0; 128], 32));
    assert!(
        matches!(e, GgufError::Overlap { ref first, ref second } if first == "a" && second == "b"),
        "{e:?}"
    );
    // Touching is fine.
    let infos = [f32_info("a", &[16], 0), f32_info("b", &[8], 64)];
    assert!(GgufFile::from_bytes(raw_file(3, &[], &infos, &[0; 128], 32)).is_ok());
    // So is sharing nothing but being listed out of order.
    let infos = [f32_info("b", &[8], 64), f32_info("a", &[16], 0)];
    assert!(
        GgufFile::from_bytes(raw_file(3, &[("x", Value::U8(1))], &infos, &[0; 128], 32)).is_ok()
    );
}

#[test]
fn open_missing_file_is_io_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.gguf");
    let e = GgufFile::open(&path).unwrap_err();
    assert!(
        matches!(e, GgufError::Io { path: ref p, .. } if p == &path),
        "{e:?}"
    );
    assert!(e.to_string().contains("absent.gguf"), "{e}");
}

#[test]
fn open_empty_file_is_truncated() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let e = GgufFile::open(file.path()).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                offset: 0,
                need: 4,
                have: 0,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
#[should_panic(expected = "outside this")]
fn tensor_data_with_an_info_from_another_file_panics() {
    let small = GgufFile::from_bytes(
        GgufBuilder::new()
            .tensor("a", &[1], GgmlType::F32, [0u8; 4])
            .to_bytes(),
    )
    .unwrap();
    let big = GgufFile::from_bytes(
        GgufBuilder::new()
            .tensor("a", &[1000], GgmlType::F32, vec![0u8; 4000])
            .to_bytes(),
    )
    .unwrap();
    small.tensor_data(big.tensor("a").unwrap());
}
