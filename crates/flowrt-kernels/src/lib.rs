//! flowrt-kernels
