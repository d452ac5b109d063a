//! The key/value cache: for each layer and KV head, one row of `head_dim` values per position.

use half::f16;
use half::slice::HalfBitsSliceExt;

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    F32,
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            _ => Err(format!("unknown KV cache type `{s}` (use f16 or f32)")),
        }
    }
}

/// Storage of one tensor (all keys or all values of a layer).
///
/// Halves are kept as their bits: `vec![0u16; n]` comes from zeroed pages that the OS maps
/// lazily, so memory is committed only as positions are written (a `vec![f16::ZERO; n]`
/// would write every element up front).
#[derive(Debug)]
pub enum KvStore {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl KvStore {
    fn zeros(ty: KvType, n: usize) -> Self {
        match ty {
            KvType::F16 => KvStore::F16(vec![0u16; n]),
            KvType::F32 => KvStore::F32(vec![0.0; n]),
        }
    }
}

/// Offset of `(head, pos)` within a layer's store of `n_ctx` positions of `head_dim` values
/// (`head` counts the heads of earlier sequences too).
pub fn offset(n_ctx: usize, head_dim: usize, head: usize, pos: usize) -> usize {
    (head * n_ctx + pos) * head_dim
}

/// Row of `(seq, pos)` within a convolution layer's store of `n_ctx` positions per sequence,
/// seen as rows of the layer's `conv_width` values.
pub fn conv_row(n_ctx: usize, seq: usize, pos: usize) -> usize {
    seq * n_ctx + pos
}

/// View f16 bits as halves.
pub fn as_f16(bits: &[u16]) -> &[f16] {
    bits.reinterpret_cast()
}

/// View f16 bits as halves, mutably.
pub fn as_f16_mut(bits: &mut [u16]) -> &mut [f16] {
    bits.reinterpret_cast_mut()
}

/// Keys and values of every layer for `n_seq` sequences, laid out
/// `[layer][seq][kv_head][position][head_dim]` so that attention scans positions of one head of
/// one sequence contiguously.
///
/// A short convolution layer (hybrid models) keeps instead its convolution input `B · x` of
/// every position in `k`, laid out `[seq][position][width]` (`conv_width[layer]` values per
/// position), and nothing in `v`: a convolution reads the last few positions of its sequence
/// from there, so a truncated or batched sequence needs no state of its own. This costs
/// `width` values per position where a rolling state would keep `kernel - 1` positions.
#[derive(Debug)]
pub struct KvCache {
    pub ty: KvType,
    pub n_seq: usize,
    pub n_ctx: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub k: Vec<KvStore>, // (layer) -> (seq, kv_head, n_ctx, head_dim)
    pub v: Vec<KvStore>, // (layer) -> (seq, kv_head, n_ctx, head_dim)
    /// Per layer, values per position of a convolution layer's store; 0 on attention layers.
    pub conv_width: Vec<usize>,
}

impl KvCache {
    pub fn new(
        ty: KvType,
        n_layers: usize,
        n_seq: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        Self::hybrid(ty, &vec![0; n_layers], n_seq, n_ctx, n_kv_heads, head_dim)
    }

    /// A cache whose layers with a nonzero `conv_width` are short convolution layers (see
    /// [`KvCache`]).
    pub fn hybrid(
        ty: KvType,
        conv_width: &[usize],
        n_seq: usize,
        n_ctx: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let n = n_seq * n_kv_heads * n_ctx * head_dim;
        let len = |w: usize, v: bool| match (w, v) {
            (0, _) => n,
            (_, false) => n_seq * n_ctx * w,
            (_, true) => 0,
        };
        KvCache {
            ty,
            n_seq,
            n_ctx,
            n_kv_heads,
            head_dim,
            k: conv_width
                .iter()
                .map(|&w| KvStore::zeros(ty, len(w, false)))
                .collect(),
            v: conv_width
                .iter()
                .map(|&w| KvStore::zeros(ty, len(w, true)))
                .collect(),
            conv_width: conv_width.to_vec(),
        }
    }

    /// Offset of `(seq, pos)` within convolution layer `layer`'s store.
    pub fn conv_offset(&self, layer: usize, seq: usize, pos: usize) -> usize {
        conv_row(self.n_ctx, seq, pos) * self.conv_width[layer]
    }

    /// Offset of `(seq, head, pos)` within a layer's store.
    pub fn offset(&self, seq: usize, head: usize, pos: usize) -> usize {
        offset(self.n_ctx, self.head_dim, seq * self.n_kv_heads + head, pos)
    }

    /// Bytes the cache takes when full.
    pub fn bytes(&self) -> usize {
        let elem = match self.ty {
            KvType::F16 => 2,
            KvType::F32 => 4,
        };
        let per_layer = |w: usize| match w {
            0 => 2 * self.n_kv_heads * self.head_dim,
            w => w,
        };
        let values: usize = self.conv_width.iter().map(|&w| per_layer(w)).sum();
        values * self.n_seq * self.n_ctx * elem
    }
}
