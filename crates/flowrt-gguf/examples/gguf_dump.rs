//! Prints a GGUF file's metadata and tensor table, and how long opening it took.
//!
//! `cargo run --release -p flowrt-gguf --example gguf_dump -- model.gguf`

use std::time::Instant;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: gguf_dump FILE.gguf");
        std::process::exit(2);
    };
    let start = Instant::now();
    let file = match flowrt_gguf::GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let elapsed = start.elapsed();
    println!(
        "{path}: GGUF v{}, {} bytes, data at {} (alignment {})",
        file.version(),
        file.file_len(),
        file.data_offset(),
        file.alignment()
    );
    for (key, value) in file.metadata() {
        let mut shown = value.to_string();
        if shown.chars().count() > 80 {
            shown = shown.chars().take(77).chain("...".chars()).collect();
        }
        println!("  {key} = {shown}");
    }
    for t in file.tensors() {
        println!(
            "  {:<32} {:<8} {:?} @{} ({} bytes)",
            t.name, t.ggml_type, t.dims, t.offset, t.size_bytes
        );
    }
    println!(
        "opened and validated in {:.2} ms",
        elapsed.as_secs_f64() * 1e3
    );
}
