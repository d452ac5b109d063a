//! flowrt-engine
