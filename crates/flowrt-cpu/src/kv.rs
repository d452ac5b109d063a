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
#[derive(Debug)]
pub struct KvCache {
    pub ty: KvType,
    pub n_seq: usize,
    pub n_ctx: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub k: Vec<KvStore>, // (layer) -> (seq, kv_head, n_ctx, head_dim)
    pub v: Vec<KvStore>, // (layer) -> (seq, kv_head, n_ctx, head_dim)
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
        let n = n_seq * n_kv_heads * n_ctx * head_dim;
        KvCache {
            ty,
            n_seq,
            n_ctx,
            n_kv_heads,
            head_dim,
            k: (0..n_layers).map(|_| KvStore::zeros(ty, n)).collect(),
            v: (0..n_layers).map(|_| KvStore::zeros(ty, n)).collect(),
        }
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
        2 * self.k.len() * self.n_seq * self.n_kv_heads * self.n_ctx * self.head_dim * elem
    }
}
