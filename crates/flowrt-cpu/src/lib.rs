//! flowrt-cpu
