//! Kernels that read weights in their file types: matmul (a matrix-vector form for decode and
//! a tiled form for batches) and the embedding lookup. Not written yet.
