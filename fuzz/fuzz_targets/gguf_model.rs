//! GGUF bytes -> metadata -> model config -> weights bound to roles -> plan, plus the
//! tokenizer, chat template and pooling a GGUF carries: what `LoadedModel::load` does with a
//! file. Any bytes must load or fail with an error; never panic, hang or allocate without
//! bound. (Absorbs the old crates/flowrt-gguf/fuzz `parse` target's checks.)
//! (The body is `flowrt_fuzz_targets::gguf_model`, which CI's stable fuzzer runs too.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| flowrt_fuzz_targets::gguf_model(data));
