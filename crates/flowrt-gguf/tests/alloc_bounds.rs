//! No allocation may be sized by unchecked file data: with a counting allocator, parsing a
//! small hostile file never makes an allocation much larger than the file itself.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use flowrt_gguf::write::{write_header, write_string};
use flowrt_gguf::{GgufFile, MAX_ARRAY_LEN, MAX_KEYS, MAX_STRING_LEN, MAX_TENSORS};

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

/// Largest single allocation made while parsing `bytes` (which is moved in, not copied).
fn largest_allocation(bytes: Vec<u8>) -> usize {
    LARGEST.store(0, Ordering::Relaxed);
    let _ = GgufFile::from_bytes(bytes);
    LARGEST.load(Ordering::Relaxed)
}

fn kv_prefix(ty: u32) -> Vec<u8> {
    let mut f = Vec::new();
    write_header(&mut f, 3, 0, 1);
    write_string(&mut f, "k");
    f.extend(ty.to_le_bytes());
    f
}

/// Everything runs in this one test, so no other test thread allocates meanwhile.
#[test]
fn hostile_counts_allocate_in_proportion_to_the_file() {
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    for elem_ty in 0..=12u32 {
        let mut f = kv_prefix(9);
        f.extend(elem_ty.to_le_bytes());
        f.extend(MAX_ARRAY_LEN.to_le_bytes());
        f.extend([0u8; 200]);
        cases.push(("array at the cap", f));
    }
    let mut f = kv_prefix(8);
    f.extend(MAX_STRING_LEN.to_le_bytes());
    f.extend([b'a'; 200]);
    cases.push(("string at the cap", f));
    let mut f = Vec::new();
    write_header(&mut f, 3, MAX_TENSORS, MAX_KEYS);
    f.extend([0u8; 200]);
    cases.push(("counts at the caps", f));
    let mut f = Vec::new();
    write_header(&mut f, 3, 1, 0);
    write_string(&mut f, "w");
    f.extend(u32::MAX.to_le_bytes());
    f.extend([0u8; 200]);
    cases.push(("dimension count", f));

    for (what, f) in cases {
        let len = f.len();
        let largest = largest_allocation(f);
        assert!(
            largest <= 4096,
            "{what}: allocated {largest} bytes for a {len}-byte file"
        );
    }

    // Random edits of a valid file: the worst legitimate case is a vector of 24-byte
    // `String`s or 32-byte `Array`s whose 8- or 12-byte encodings fill the file.
    let sample = common::sample_bytes();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..20_000 {
        let mut f = sample.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % f.len() as u64) as usize;
            f[i] = next() as u8;
        }
        let len = f.len();
        let largest = largest_allocation(f);
        assert!(
            largest <= 4 * len + 4096,
            "allocated {largest} bytes for a {len}-byte file"
        );
    }
}
