//! No allocation may be sized by unchecked metadata: with a counting allocator, binding a
//! small hostile GGUF never makes an allocation much larger than the file. Regression for
//! the fuzzer's finding `tests/fixtures/fuzz/gguf_model-oom-block-count.gguf` (116 KB, a
//! `llama.block_count` of 1,392,508,931): per-layer lists were sized by it before the config
//! was validated, 2.7 GB in all.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use flowrt_gguf::GgufFile;
use flowrt_model::Model;

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged, only recording sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_huge_block_count_is_refused_before_anything_is_sized_by_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/fuzz/gguf_model-oom-block-count.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let len = bytes.len();
    let file = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    LARGEST.store(0, Ordering::Relaxed);
    let err = Model::from_gguf(file).unwrap_err().to_string();
    let largest = LARGEST.load(Ordering::Relaxed);
    eprintln!("{err}; largest allocation {largest} bytes for a {len}-byte file");
    assert!(
        err.contains("block_count = 1392508931 exceeds the supported maximum 4096"),
        "{err}"
    );
    assert!(
        largest < 4 * len,
        "an allocation of {largest} bytes for a {len}-byte file"
    );
}

#[test]
fn a_huge_layer_count_in_config_json_is_refused_before_anything_is_sized_by_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families/llama-untied/config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["num_hidden_layers"] = serde_json::Value::from(1_392_508_931u64);
    LARGEST.store(0, Ordering::Relaxed);
    let err = flowrt_model::ModelConfig::from_hf_json(&path, &json)
        .unwrap_err()
        .to_string();
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        err.contains("num_hidden_layers = 1392508931 exceeds the supported maximum 4096"),
        "{err}"
    );
    assert!(largest < 1 << 20, "an allocation of {largest} bytes");
}
