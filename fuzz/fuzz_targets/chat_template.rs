//! Chat-template rendering with hostile templates and messages, the way the server renders a
//! conversation (special-token text in messages guarded, then tokenised). Pieces (cut at
//! `flowrt_fuzz_targets::SEP`): template source, messages (JSON list; other text becomes one user
//! message), tools (JSON list), kwargs (JSON object). Work must stay bounded: minijinja's
//! fuel, its recursion limit and the renderer's output limit end a runaway template with an
//! error.
//! (The body is `flowrt_fuzz_targets::chat_template`, which CI's stable fuzzer runs too.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| flowrt_fuzz_targets::chat_template(data));
