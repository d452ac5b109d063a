//! Property tests: damaged files never panic, and random metadata round-trips.

mod common;

use std::sync::OnceLock;

use common::sample_bytes;
use flowrt_gguf::write::GgufBuilder;
use flowrt_gguf::{Array, GgufFile, Value};
use proptest::prelude::*;
use proptest::sample::Index;

fn sample() -> &'static [u8] {
    static SAMPLE: OnceLock<Vec<u8>> = OnceLock::new();
    SAMPLE.get_or_init(sample_bytes)
}

/// Parses `bytes`; a file that parses must hold up to use.
fn parse_and_use(bytes: Vec<u8>) {
    match GgufFile::from_bytes(bytes) {
        Ok(file) => {
            for t in file.tensors() {
                assert_eq!(file.tensor_data(t).len() as u64, t.size_bytes);
                assert_eq!(file.tensor(&t.name), Some(t));
            }
            for (k, v) in file.metadata() {
                // The same entry, compared by address (values may hold NaN).
                assert!(file.get(k).is_some_and(|got| std::ptr::eq(got, v)), "{k}");
                let _ = (
                    file.get_str(k),
                    file.get_u64(k),
                    file.get_f32(k),
                    file.get_str_array(k),
                );
                let _ = v.to_string();
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Values a length or count field may be overwritten with.
fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(255),
        Just(1 << 24),
        Just((1 << 24) + 1),
        Just(u32::MAX as u64),
        Just(1 << 63),
        Just(u64::MAX),
        any::<u64>(),
        0u64..4096,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_byte_edits_never_panic(
        edits in prop::collection::vec((any::<Index>(), any::<u8>()), 1..8),
        cut in prop::option::of(any::<Index>()),
    ) {
        let mut f = sample().to_vec();
        for (at, byte) in edits {
            let i = at.index(f.len());
            f[i] = byte;
        }
        if let Some(cut) = cut {
            f.truncate(cut.index(f.len()));
        }
        parse_and_use(f);
    }

    #[test]
    fn overwritten_length_fields_never_panic(at in any::<Index>(), value in interesting_u64(), width in prop_oneof![Just(4usize), Just(8)]) {
        let mut f = sample().to_vec();
        let i = at.index(f.len() - width);
        f[i..i + width].copy_from_slice(&value.to_le_bytes()[..width]);
        parse_and_use(f);
    }
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        (-1e30f32..1e30).prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        (-1e300f64..1e300).prop_map(Value::F64),
    ]
}

fn array() -> impl Strategy<Value = Array> {
    use prop::collection::vec;
    let leaf = prop_oneof![
        vec(any::<u8>(), 0..6).prop_map(Array::U8),
        vec(any::<i16>(), 0..6).prop_map(Array::I16),
        vec(any::<u32>(), 0..6).prop_map(Array::U32),
        vec(-1e6f32..1e6, 0..6).prop_map(Array::F32),
        vec(any::<bool>(), 0..6).prop_map(Array::Bool),
        vec(".{0,6}", 0..6).prop_map(Array::from),
        vec(any::<i64>(), 0..6).prop_map(Array::I64),
        vec(-1e6f64..1e6, 0..6).prop_map(Array::F64),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| vec(inner, 0..4).prop_map(Array::Array))
}

proptest! {
    #[test]
    fn random_metadata_round_trips(
        entries in prop::collection::vec(prop_oneof![scalar(), array().prop_map(Value::Array)], 0..12),
    ) {
        let mut b = GgufBuilder::new();
        for (i, v) in entries.iter().enumerate() {
            b.kv(format!("key.{i}"), v.clone());
        }
        let file = GgufFile::from_bytes(b.to_bytes()).unwrap();
        let read: Vec<&Value> = file.metadata().iter().map(|(_, v)| v).collect();
        prop_assert_eq!(read, entries.iter().collect::<Vec<_>>());
    }
}
