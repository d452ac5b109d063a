//! Files written by `GgufBuilder` read back exactly, through both `from_bytes` and `open`.

mod common;

use common::{sample_builder, sample_bytes};
use flowrt_gguf::write::{f32_bytes, GgufBuilder};
use flowrt_gguf::{Array, GgmlType, GgufError, GgufFile, Value, ValueType};

#[test]
fn every_value_type_round_trips() {
    let nested = Array::Array(vec![
        Array::Array(vec![Array::from(vec![1u8, 2])]),
        Array::from(Vec::<String>::new()),
        Array::from(vec![true, false]),
    ]);
    let values: Vec<(&str, Value)> = vec![
        ("u8", Value::U8(255)),
        ("i8", Value::I8(-128)),
        ("u16", Value::U16(65_535)),
        ("i16", Value::I16(-32_768)),
        ("u32", Value::U32(u32::MAX)),
        ("i32", Value::I32(i32::MIN)),
        ("f32", Value::F32(-3.25)),
        ("bool.t", Value::Bool(true)),
        ("bool.f", Value::Bool(false)),
        ("string", Value::String("héllo\n\u{1F600}".into())),
        ("string.empty", Value::String(String::new())),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(1e300)),
        ("a.u8", Value::from(vec![0u8, 1, 255])),
        ("a.i8", Value::from(vec![-1i8, 0, 127])),
        ("a.u16", Value::from(vec![1u16, 65_535])),
        ("a.i16", Value::from(vec![-2i16, 300])),
        ("a.u32", Value::from(vec![7u32])),
        ("a.i32", Value::from(vec![-7i32, 1 << 30])),
        ("a.f32", Value::from(vec![0.5f32, -0.0, f32::INFINITY])),
        ("a.bool", Value::from(vec![true, false, true])),
        ("a.string", Value::from(vec!["", "a", "ü"])),
        ("a.u64", Value::from(vec![u64::MAX, 0])),
        ("a.i64", Value::from(vec![i64::MAX, -1])),
        ("a.f64", Value::from(vec![f64::MIN_POSITIVE, -2.0])),
        ("a.empty", Value::from(Vec::<u32>::new())),
        ("a.nested", Value::Array(nested)),
    ];
    let mut b = GgufBuilder::new();
    for (k, v) in &values {
        b.kv(*k, v.clone());
    }
    let file = GgufFile::from_bytes(b.to_bytes()).unwrap();
    assert_eq!(file.metadata().len(), values.len());
    for ((k, v), (rk, rv)) in values.iter().zip(file.metadata()) {
        assert_eq!(k, rk, "metadata keeps file order");
        assert_eq!(v, rv, "value of {k}");
        assert_eq!(file.get(k), Some(v));
    }
    // Every type id is covered, at top level and as an array element.
    for ty in ValueType::ALL {
        assert!(
            values.iter().any(|(_, v)| v.value_type() == ty),
            "no scalar {ty}"
        );
        assert!(
            values
                .iter()
                .any(|(_, v)| v.as_array().is_some_and(|a| a.elem_type() == ty)),
            "no array of {ty}"
        );
    }
}

#[test]
fn nan_and_negative_zero_keep_their_bits() {
    let nan = f32::from_bits(0x7fc0_1234);
    let bytes = GgufBuilder::new()
        .kv("nan", nan)
        .kv("neg0", -0.0f64)
        .kv("nans", vec![nan, -0.0f32])
        .to_bytes();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let Some(Value::F32(x)) = file.get("nan") else {
        panic!("nan missing")
    };
    assert_eq!(x.to_bits(), nan.to_bits());
    let Some(Value::F64(z)) = file.get("neg0") else {
        panic!("neg0 missing")
    };
    assert_eq!(z.to_bits(), (-0.0f64).to_bits());
    let Some(Array::F32(v)) = file.get_array("nans").unwrap() else {
        panic!("nans missing")
    };
    assert_eq!(
        v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        [nan.to_bits(), (-0.0f32).to_bits()]
    );
}

#[test]
fn tensors_round_trip_with_their_data() {
    let file = GgufFile::from_bytes(sample_bytes()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset() % 32, 0);
    let names: Vec<_> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);

    let a = file.tensor("a").unwrap();
    assert_eq!(
        (a.dims.as_slice(), a.ggml_type, a.size_bytes, a.n_elements()),
        (&[4][..], GgmlType::F32, 16, 4)
    );
    assert_eq!(file.tensor_data(a), f32_bytes(&[1.0, 2.0, 3.0, 4.0]));

    let b = file.tensor("b").unwrap();
    assert_eq!(
        (b.ggml_type, b.size_bytes, b.n_elements()),
        (GgmlType::Q8_0, 68, 64)
    );
    assert_eq!(file.tensor_data(b), (0..68).collect::<Vec<u8>>());
    assert_eq!(b.offset, 32, "after 16 bytes of `a` padded to 32");

    let c = file.tensor("c").unwrap();
    assert_eq!(file.tensor_bytes("c"), Some(&[1u8, 2, 3, 4, 5, 6][..]));
    assert_eq!(c.offset, 128);
    assert!(file.tensor("missing").is_none());
    assert!(file.tensor_bytes("missing").is_none());
}

#[test]
fn custom_alignment_lays_out_and_reads_back() {
    for align in [1u32, 8, 64, 4096] {
        let mut b = sample_builder();
        b.alignment(align);
        let file = GgufFile::from_bytes(b.to_bytes()).unwrap();
        assert_eq!(file.alignment(), u64::from(align));
        assert_eq!(file.data_offset() % u64::from(align), 0);
        assert_eq!(
            file.get_u64("general.alignment").unwrap(),
            Some(u64::from(align))
        );
        assert_eq!(file.tensor_bytes("c"), Some(&[1u8, 2, 3, 4, 5, 6][..]));
        for t in file.tensors() {
            assert_eq!(t.offset % u64::from(align), 0);
        }
    }
}

#[test]
fn version_2_is_read() {
    let mut b = sample_builder();
    b.version(2);
    let file = GgufFile::from_bytes(b.to_bytes()).unwrap();
    assert_eq!(file.version(), 2);
    assert_eq!(file.tensors().len(), 3);
}

#[test]
fn scalar_tensor_and_file_without_tensors() {
    let file = GgufFile::from_bytes(GgufBuilder::new().kv("k", 1u8).to_bytes()).unwrap();
    assert!(file.tensors().is_empty());
    let bytes = GgufBuilder::new()
        .tensor("s", &[], GgmlType::F32, f32_bytes(&[7.0]))
        .to_bytes();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let s = file.tensor("s").unwrap();
    assert_eq!((s.size_bytes, s.n_elements()), (4, 1));
    assert_eq!(file.tensor_data(s), 7.0f32.to_le_bytes());
}

#[test]
fn open_maps_a_file_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, sample_bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.path(), Some(path.as_path()));
    assert_eq!(file.file_len(), sample_bytes().len() as u64);
    assert_eq!(file.as_bytes(), sample_bytes());
    assert_eq!(file.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(file.tensor_bytes("c"), Some(&[1u8, 2, 3, 4, 5, 6][..]));
    assert!(GgufFile::from_bytes(sample_bytes())
        .unwrap()
        .path()
        .is_none());
}

#[test]
fn typed_getters_convert_what_they_promise() {
    let file = GgufFile::from_bytes(sample_bytes()).unwrap();
    assert_eq!(file.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(file.get_u64("t.u8").unwrap(), Some(200));
    assert_eq!(file.get_u64("t.u64").unwrap(), Some(u64::MAX));
    assert_eq!(file.get_f32("t.f32").unwrap(), Some(1.5));
    assert_eq!(file.get_f32("t.f64").unwrap(), Some(-0.25));
    assert_eq!(file.get_f32("t.i32").unwrap(), Some(-7.0));
    assert_eq!(file.get_bool("t.bool").unwrap(), Some(true));
    assert_eq!(
        file.get_str_array("tokenizer.ggml.tokens").unwrap(),
        Some(vec!["<s>", "a", "bc", "é"])
    );
    assert_eq!(
        file.get_array("t.scores").unwrap(),
        Some(&Array::F32(vec![0.0, -1.0, 2.5]))
    );
    // Absent keys are Ok(None) for every getter.
    assert_eq!(file.get_str("nope").unwrap(), None);
    assert_eq!(file.get_u64("nope").unwrap(), None);
    assert_eq!(file.get_f32("nope").unwrap(), None);
    assert_eq!(file.get_bool("nope").unwrap(), None);
    assert_eq!(file.get_str_array("nope").unwrap(), None);
    assert!(file.get_array("nope").unwrap().is_none());
    assert!(file.get("nope").is_none());
}

#[test]
fn typed_getters_name_key_and_types_on_mismatch() {
    let file = GgufFile::from_bytes(sample_bytes()).unwrap();
    let err = file.get_str("llama.block_count").unwrap_err();
    match &err {
        GgufError::TypeMismatch {
            key,
            expected,
            actual,
        } => {
            assert_eq!(
                (key.as_str(), *expected, actual.as_str()),
                ("llama.block_count", "string", "u32")
            );
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(
        err.to_string(),
        "metadata `llama.block_count` is u32, expected string"
    );
    let err = file.get_str_array("t.scores").unwrap_err();
    assert!(
        matches!(&err, GgufError::TypeMismatch { actual, .. } if actual == "array of f32"),
        "{err}"
    );
    assert!(matches!(
        file.get_u64("t.f32"),
        Err(GgufError::TypeMismatch { .. })
    ));
    assert!(matches!(
        file.get_u64("t.i8"),
        Err(GgufError::NegativeInteger { value: -5, .. })
    ));
    assert!(matches!(
        file.get_f32("general.architecture"),
        Err(GgufError::TypeMismatch { .. })
    ));
    assert!(matches!(
        file.get_bool("t.u8"),
        Err(GgufError::TypeMismatch { .. })
    ));
    assert!(matches!(
        file.get_array("t.bool"),
        Err(GgufError::TypeMismatch { .. })
    ));
}

#[test]
fn display_of_values_is_short() {
    assert_eq!(Value::from("a\"b").to_string(), "\"a\\\"b\"");
    assert_eq!(Value::from(vec!["x"; 1000]).to_string(), "[string; 1000]");
    assert_eq!(Value::U32(30).to_string(), "30");
}
