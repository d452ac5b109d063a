//! A Hugging Face checkpoint directory: `config.json` -> model config, then the safetensors
//! weights (one `model.safetensors`, or an index naming shards) bound to roles. The input's
//! pieces (cut at `flowrt_fuzz_targets::SEP`) become the files:
//! 0 `config.json`, 1 `model.safetensors` (not written when empty),
//! 2 `model.safetensors.index.json` (not written when empty), 3.. `shard-N.safetensors`.
//! (The body is `flowrt_fuzz_targets::hf_dir`, which CI's stable fuzzer runs too.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| flowrt_fuzz_targets::hf_dir(data));
