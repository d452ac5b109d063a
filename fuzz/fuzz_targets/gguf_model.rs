//! GGUF bytes -> metadata -> model config -> weights bound to roles -> plan, plus the
//! tokenizer, chat template and pooling a GGUF carries: what `LoadedModel::load` does with a
//! file. Any bytes must load or fail with an error; never panic, hang or allocate without
//! bound. (Absorbs the old crates/flowrt-gguf/fuzz `parse` target's checks.)
#![no_main]

use std::sync::Arc;

use flowrt_gguf::GgufFile;
use flowrt_model::{EmbeddingSpec, Model, Plan};
use flowrt_text::{ChatTemplate, GgufVocab, Tokenizer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.size_bytes);
    }
    for (key, _) in file.metadata() {
        let _ = (
            file.get_str(key),
            file.get_u64(key),
            file.get_f32(key),
            file.get_bool(key),
            file.get_str_array(key),
        );
    }
    let file = Arc::new(file);
    let _ = EmbeddingSpec::from_gguf(&file);
    if let Ok(model) = Model::from_gguf(file.clone()) {
        let _ = Plan::new(&model.config);
        let _ = model.weight_bytes_per_token();
    }
    if let Ok(vocab) = GgufVocab::from_gguf(&file) {
        if let Ok(tok) = Tokenizer::from_vocab(&vocab) {
            let _ = tok.encode("Hello, world! <|im_start|> 123", true, true);
        }
        let _ = ChatTemplate::from_vocab(&vocab);
    }
});
