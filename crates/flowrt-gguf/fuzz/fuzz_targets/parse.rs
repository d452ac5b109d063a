//! `cargo fuzz run parse` (from crates/flowrt-gguf): any bytes must parse or fail with an
//! error, never panic; a file that parses must hand out tensor data of the stated size.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = flowrt_gguf::GgufFile::from_bytes(data.to_vec()) {
        for t in file.tensors() {
            assert_eq!(file.tensor_data(t).len() as u64, t.size_bytes);
        }
        for (key, _) in file.metadata() {
            let _ = (
                file.get_str(key),
                file.get_u64(key),
                file.get_f32(key),
                file.get_str_array(key),
            );
        }
    }
});
