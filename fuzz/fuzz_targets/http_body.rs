//! OpenAI, Anthropic and Ollama request bodies through the server's router (every
//! middleware, the JSON extractor and each handler's validation), without a socket, on a
//! server with no model: a body that passes validation ends at "model not found". The first
//! byte picks the route; the rest is the body. Any body must get a 4xx JSON error in the
//! route's own shape, never a panic, a 5xx or a hang.
//! (The body is `flowrt_fuzz_targets::http_body`, which CI's stable fuzzer runs too.)
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| flowrt_fuzz_targets::http_body(data));
