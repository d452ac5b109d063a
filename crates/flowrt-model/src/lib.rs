//! flowrt-model
