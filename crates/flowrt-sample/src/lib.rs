//! flowrt-sample
