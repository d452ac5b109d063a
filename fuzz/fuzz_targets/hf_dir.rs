//! A Hugging Face checkpoint directory: `config.json` -> model config, then the safetensors
//! weights (one `model.safetensors`, or an index naming shards) bound to roles. The input's
//! pieces (cut at `flowrt_fuzz::SEP`) become the files:
//! 0 `config.json`, 1 `model.safetensors` (not written when empty),
//! 2 `model.safetensors.index.json` (not written when empty), 3.. `shard-N.safetensors`.
#![no_main]

use flowrt_fuzz::{clear_dir, scratch_dir, split_parts};
use flowrt_model::{LoadOptions, Model, ModelConfig, Plan};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parts = split_parts(data);
    let dir = scratch_dir();
    clear_dir(dir);
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    write("config.json", parts[0]);
    if let Some(p) = parts.get(1).filter(|p| !p.is_empty()) {
        write("model.safetensors", p);
    }
    if let Some(p) = parts.get(2).filter(|p| !p.is_empty()) {
        write("model.safetensors.index.json", p);
    }
    for (i, p) in parts.iter().skip(3).enumerate() {
        write(&format!("shard-{i}.safetensors"), p);
    }
    // As LoadedModel::load_hf_dir reads it.
    let Ok(text) = std::str::from_utf8(parts[0]) else {
        return;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    let Ok(config) = ModelConfig::from_hf_json(&dir.join("config.json"), &json) else {
        return;
    };
    if let Ok(model) = Model::from_hf_dir(dir, config, LoadOptions::default()) {
        let _ = Plan::new(&model.config);
        let _ = model.weight_bytes_per_token();
    }
});
