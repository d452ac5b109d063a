//! flowrt-gguf
