//! Format correctness: our decoders against the `gguf` Python package (gguf-py), an
//! independent implementation of the GGUF block formats. The fixtures are random blocks and
//! gguf-py's dequantisation of them (`tests/fixtures/gguf/generate.py`); every table must give
//! the same f32 bits. Q5_0/Q5_1 quantisers are also checked against gguf-py's (ggml's reference
//! round-to-nearest rule) byte for byte.

mod common;

use common::tables;
use flowrt_dtype::GgmlType;
use flowrt_kernels::row_size;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/gguf/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

const DEQUANT: [(GgmlType, &str); 5] = [
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::Q4K, "q4_k"),
    (GgmlType::Q5K, "q5_k"),
    (GgmlType::Q6K, "q6_k"),
];

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    for (ty, name) in DEQUANT {
        let data = fixture(&format!("{name}.dequant.bin"));
        let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
        let nblocks = data.len() / (ts + 4 * bs);
        assert_eq!(data.len(), nblocks * (ts + 4 * bs), "{name}: fixture size");
        assert!(nblocks >= 3, "{name}: fixture too small");
        let n = nblocks * bs;
        let (row, want) = data.split_at(row_size(ty, n));
        let want = f32s(want);
        for kern in tables() {
            let mut got = vec![f32::NAN; n];
            kern.dequantize_row(ty, row, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} {ty} value {i} (block {}): {g} vs gguf-py {w}",
                    kern.name(),
                    i / bs
                );
            }
        }
    }
}

#[test]
fn q5_quantisers_match_gguf_py_bytes() {
    for (ty, name) in [(GgmlType::Q5_0, "q5_0"), (GgmlType::Q5_1, "q5_1")] {
        let data = fixture(&format!("{name}.quant.bin"));
        let n = 4 * 32;
        let (x, want) = data.split_at(4 * n);
        assert_eq!(want.len(), row_size(ty, n), "{name}: fixture size");
        let x = f32s(x);
        for kern in tables() {
            let mut got = vec![0u8; want.len()];
            kern.quantize_row(ty, &x, &mut got);
            assert_eq!(got, want, "{} {ty}", kern.name());
        }
    }
}
