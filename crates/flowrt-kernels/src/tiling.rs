//! How the SIMD attention kernels cut their work, shared by every instruction set.

/// The heads `0..group` in tiles of at most `per_tile`: `(first head, heads)`.
pub(crate) fn head_tiles(group: usize, per_tile: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..group)
        .step_by(per_tile)
        .map(move |h0| (h0, (group - h0).min(per_tile)))
}

/// Bytes of f16 values one block of keys spans in the weighted-values kernels: each tile of
/// heads and values passes over a block, so it should stay in L1.
const VALUE_BLOCK_BYTES: usize = 16 << 10;

/// Keys per block of the weighted-values kernels for head size `hd` (at least 16).
pub(crate) fn value_block_keys(hd: usize) -> usize {
    (VALUE_BLOCK_BYTES / (2 * hd)).max(16)
}
