//! flowrt-text
