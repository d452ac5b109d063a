//! flowrt-store
