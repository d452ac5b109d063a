//! Rotary position embeddings: a table of cos/sin per position (`RopeConfig::cos_sin_table`,
//! computed like HF transformers) applied to each head.

use flowrt_model::{RopeConfig, RopePairing};

#[derive(Debug)]
pub struct RopeTable {
    half: usize,
    pairing: RopePairing,
    cos: Vec<f32>, // (n_ctx, rope_dim / 2)
    sin: Vec<f32>, // (n_ctx, rope_dim / 2)
}

impl RopeTable {
    pub fn new(rope_dim: usize, rope: &RopeConfig, pairing: RopePairing, n_ctx: usize) -> Self {
        let half = rope_dim / 2;
        let (cos, sin) = rope.cos_sin_table(rope_dim, n_ctx);
        RopeTable {
            half,
            pairing,
            cos,
            sin,
        }
    }

    /// Rotate one head's vector `x` (length >= rope_dim) for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let h = self.half;
        let (cos, sin) = (
            &self.cos[pos * h..(pos + 1) * h],
            &self.sin[pos * h..(pos + 1) * h],
        );
        match self.pairing {
            RopePairing::Adjacent => {
                for i in 0..h {
                    let (a, b) = (x[2 * i], x[2 * i + 1]);
                    x[2 * i] = a * cos[i] - b * sin[i];
                    x[2 * i + 1] = b * cos[i] + a * sin[i];
                }
            }
            RopePairing::HalfSplit => {
                for i in 0..h {
                    let (a, b) = (x[i], x[i + h]);
                    x[i] = a * cos[i] - b * sin[i];
                    x[i + h] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adjacent pairing on a permuted vector equals half-split pairing on the original:
    /// the GGUF llama layout and HF's rotate-half are the same rotation.
    #[test]
    fn adjacent_on_permuted_equals_half_split() {
        let d = 8;
        let a = RopeTable::new(d, &RopeConfig::plain(10000.0), RopePairing::Adjacent, 16);
        let hs = RopeTable::new(d, &RopeConfig::plain(10000.0), RopePairing::HalfSplit, 16);
        let x: Vec<f32> = (0..d).map(|i| i as f32 * 0.37 - 1.0).collect();
        // GGUF permutation: position 2i <- i, 2i+1 <- i + d/2.
        let perm = |v: &[f32]| -> Vec<f32> {
            (0..d)
                .map(|j| {
                    if j % 2 == 0 {
                        v[j / 2]
                    } else {
                        v[j / 2 + d / 2]
                    }
                })
                .collect()
        };
        for pos in [0, 1, 7, 15] {
            let mut y = x.clone();
            hs.apply(&mut y, pos);
            let mut z = perm(&x);
            a.apply(&mut z, pos);
            let want = perm(&y);
            for (u, v) in z.iter().zip(&want) {
                assert!((u - v).abs() < 1e-6, "{z:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let t = RopeTable::new(4, &RopeConfig::plain(10000.0), RopePairing::Adjacent, 8);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        t.apply(&mut x, 0);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0]);
        t.apply(&mut x, 5);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
    }
}
