//! The dense matmuls' input statistics while a pack calibrates
//! ([`flowrt_dispatch::Backend::collect_input_stats`]): each input column's sum of squares,
//! and with [`InputStatKind::Gram`] the second-moment matrix `Σ x xᵀ` of each distinct input
//! (one per call of `matmuls`, shared by the matrices it feeds), with
//! [`InputStatKind::Inputs`] also the rows themselves.

use std::sync::Arc;

use flowrt_dispatch::{InputStat, InputStatKind};
use flowrt_kernels::Kernels;
use flowrt_model::plan::MatRole;

pub(super) struct InputStats {
    kind: InputStatKind,
    stats: Vec<InputStat>,
    /// Upper triangles (row-major `n × n`, the lower part left zero until [`Self::take`]).
    grams: Vec<(usize, Vec<f32>)>,
    /// Per entry of `stats`: its gram.
    gram_of: Vec<Option<usize>>,
    /// Per gram, the input rows (with [`InputStatKind::Inputs`]).
    inputs: Vec<Vec<f32>>,
}

impl InputStats {
    pub(super) fn new(kind: InputStatKind) -> Self {
        Self {
            kind,
            stats: Vec::new(),
            grams: Vec::new(),
            gram_of: Vec::new(),
            inputs: Vec::new(),
        }
    }

    pub(super) fn kind(&self) -> InputStatKind {
        self.kind
    }

    /// Adds the input `rows` (each `k` values) of the matmuls of `roles` in `layer`, on up
    /// to `threads` threads with `kern`'s tiles.
    pub(super) fn add(
        &mut self,
        kern: &Kernels,
        layer: Option<usize>,
        roles: &[MatRole],
        rows: &[&[f32]],
        k: usize,
        threads: usize,
    ) {
        let mut sq = vec![0f64; k];
        for r in rows {
            for (acc, &v) in sq.iter_mut().zip(r.iter()) {
                *acc += v as f64 * v as f64;
            }
        }
        // Each role's entry, made where missing; the first Gram matrix one of them has.
        let mut entries = Vec::with_capacity(roles.len());
        for &role in roles {
            let i = match self
                .stats
                .iter()
                .position(|e| e.layer == layer && e.role == role)
            {
                Some(i) => {
                    let e = &mut self.stats[i];
                    e.sum_sq.iter_mut().zip(&sq).for_each(|(a, v)| *a += v);
                    e.rows += rows.len() as u64;
                    i
                }
                None => {
                    self.stats.push(InputStat {
                        layer,
                        role,
                        sum_sq: sq.clone(),
                        rows: rows.len() as u64,
                        gram: None,
                        inputs: None,
                    });
                    self.gram_of.push(None);
                    self.stats.len() - 1
                }
            };
            entries.push(i);
        }
        if self.kind == InputStatKind::SumSquares {
            return;
        }
        let g = match entries.iter().find_map(|&i| self.gram_of[i]) {
            Some(g) => g,
            None => {
                self.grams.push((k, vec![0f32; k * k]));
                self.inputs.push(Vec::new());
                self.grams.len() - 1
            }
        };
        for &i in &entries {
            self.gram_of[i] = Some(g);
        }
        add_outer(kern, &mut self.grams[g].1, rows, k, threads);
        if self.kind == InputStatKind::Inputs {
            let kept = &mut self.inputs[g];
            kept.reserve(rows.len() * k);
            for r in rows {
                kept.extend_from_slice(r);
            }
        }
    }

    /// The statistics in layer and role order, each Gram matrix made symmetric and shared.
    pub(super) fn take(self) -> Vec<InputStat> {
        let keep = self.kind == InputStatKind::Inputs;
        let inputs: Vec<Arc<Vec<f32>>> = self.inputs.into_iter().map(Arc::new).collect();
        let grams: Vec<Arc<Vec<f32>>> = self
            .grams
            .into_iter()
            .map(|(k, mut g)| {
                for i in 0..k {
                    for j in 0..i {
                        g[i * k + j] = g[j * k + i];
                    }
                }
                Arc::new(g)
            })
            .collect();
        let mut s: Vec<InputStat> = self
            .stats
            .into_iter()
            .zip(self.gram_of)
            .map(|(mut e, g)| {
                e.gram = g.map(|g| grams[g].clone());
                e.inputs = g.filter(|_| keep).map(|g| inputs[g].clone());
                e
            })
            .collect();
        s.sort_by_key(|e| (e.layer.is_none(), e.layer, e.role as usize));
        s
    }
}

/// Columns of the panel one pass over the row tiles takes (a multiple of 16).
const COLUMN_BLOCK: usize = 128;

/// `g += Σ_t x_t x_tᵀ` on the upper triangle: the rows copied into one zero-padded panel,
/// then 4 × 16 tiles of [`Kernels::panel_dots_f32`], rows of tiles dealt round-robin to
/// `threads` threads (their lengths fall along the triangle). Each thread takes the columns
/// a block of [`COLUMN_BLOCK`] at a time, for all its row tiles above the diagonal, so that
/// block's part of the panel stays in cache.
fn add_outer(kern: &Kernels, g: &mut [f32], rows: &[&[f32]], k: usize, threads: usize) {
    if rows.is_empty() || k == 0 {
        return;
    }
    let stride = k.div_ceil(16) * 16;
    let mut panel = vec![0f32; rows.len() * stride];
    for (p, x) in panel.chunks_exact_mut(stride).zip(rows) {
        p[..k].copy_from_slice(x);
    }
    let panel = &panel[..];
    let threads = threads.clamp(1, k.div_ceil(4));
    let mut parts: Vec<Vec<(usize, &mut [f32])>> = (0..threads).map(|_| Vec::new()).collect();
    for (t, tile_rows) in g.chunks_mut(4 * k).enumerate() {
        parts[t % threads].push((4 * t, tile_rows));
    }
    std::thread::scope(|s| {
        for mut part in parts {
            s.spawn(move || {
                let mut out = [[0f32; 16]; 4];
                for jb in (0..k).step_by(COLUMN_BLOCK) {
                    let jend = (jb + COLUMN_BLOCK).min(k);
                    // Row tiles in increasing order: those from `jend` on are below the block.
                    for (i0, tile_rows) in part.iter_mut().take_while(|(i0, _)| *i0 < jend) {
                        // From the tile holding the diagonal.
                        for j0 in ((*i0 / 16 * 16).max(jb)..jend).step_by(16) {
                            kern.panel_dots_f32(panel, stride, *i0, j0, &mut out);
                            for (r, grow) in tile_rows.chunks_mut(k).enumerate() {
                                let lo = (*i0 + r).max(j0);
                                let hi = (j0 + 16).min(k);
                                for (a, v) in grow[lo..hi].iter_mut().zip(&out[r][lo - j0..]) {
                                    *a += v;
                                }
                            }
                        }
                    }
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiles and column blocks cover the upper triangle once, on any thread count, at
    /// widths on and off the tile and block sizes.
    #[test]
    fn add_outer_is_the_upper_triangle_of_the_sum_of_outer_products() {
        let kern = Kernels::detect();
        for k in [1, 5, 16, 37, 128, 300] {
            let xs: Vec<Vec<f32>> = (0..7)
                .map(|t| {
                    (0..k)
                        .map(|i| ((t * 31 + i * 17) % 13) as f32 - 6.0)
                        .collect()
                })
                .collect();
            let rows: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
            for threads in 1..=3 {
                let mut g = vec![1f32; k * k];
                add_outer(kern, &mut g, &rows, k, threads);
                for i in 0..k {
                    for j in 0..k {
                        let want = if j >= i {
                            1.0 + xs.iter().map(|x| x[i] * x[j]).sum::<f32>()
                        } else {
                            1.0
                        };
                        assert_eq!(g[i * k + j], want, "k {k} threads {threads} at ({i}, {j})");
                    }
                }
            }
        }
    }
}
