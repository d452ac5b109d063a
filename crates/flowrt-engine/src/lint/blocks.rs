//! `damaged-blocks` (no source needed): quantisation blocks out of line with both their row
//! and their column.
//!
//! A corrupted block scale (a flipped exponent bit multiplies a block by 2^k), a block zeroed
//! by a bad copy or a block from another tensor shows up as a block whose magnitude (its
//! largest |value|, dequantised) differs wildly from the blocks around it. Weights of trained
//! models are not uniform (input channels with outlier features, dead output rows, unused
//! token embeddings), so a block is compared with two references, the median magnitude of its
//! row's blocks and that of its column's (the blocks at the same position in every row), and
//! is flagged only when it is out of line with both:
//!
//! - *blown up*: its magnitude more than [`BLOCK_OUTLIER_RATIO`] times the larger median;
//! - *shrunk*: under 1/[`BLOCK_OUTLIER_RATIO`] of the smaller median (a zeroed block among
//!   non-zero rows and columns).
//!
//! An outlier feature raises its whole column's median, a dead row lowers its row's median,
//! so neither is flagged. With `--source`, `quant-error`'s block check also compares each
//! block with the source's values; this check needs none.

use serde::Serialize;

/// A block is flagged when its magnitude is this many times above the larger of its row's and
/// its column's median block magnitude, or this many times below the smaller one.
pub const BLOCK_OUTLIER_RATIO: f32 = 64.0;

/// The largest |value| of every quantisation block of a matrix, row-major.
pub(super) struct BlockGrid {
    pub rows: usize,
    /// Blocks per row.
    pub per_row: usize,
    pub absmax: Vec<f32>,
}

/// A flagged block.
#[derive(Clone, Debug, Serialize)]
pub struct OutlierBlock {
    pub row: usize,
    /// Index of the block within its row (elements `block * block_size ..`).
    pub block: usize,
    pub absmax: f32,
    pub row_median: f32,
    pub column_median: f32,
}

/// What [`check`] found in one matrix.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BlockOutliers {
    pub blocks: usize,
    pub blown_up: usize,
    pub shrunk: usize,
    /// The flagged block furthest out of line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<OutlierBlock>,
    /// The largest `absmax / max(row median, column median)` and
    /// `min(row median, column median) / absmax` over the matrix's blocks (flagged or not):
    /// how close an honest matrix comes to the bound.
    pub max_up_ratio: f32,
    pub max_down_ratio: f32,
}

impl BlockOutliers {
    pub fn flagged(&self) -> usize {
        self.blown_up + self.shrunk
    }
}

fn median(v: &mut [f32]) -> f32 {
    if v.is_empty() {
        return 0.0;
    }
    let mid = v.len() / 2;
    *v.select_nth_unstable_by(mid, f32::total_cmp).1
}

/// Blocks of `g` out of line with both their row and their column. Blocks with a NaN/Inf are
/// left to the `non-finite` check. A matrix of one block per row or one row has no second
/// reference and is not judged.
pub(super) fn check(g: &BlockGrid) -> BlockOutliers {
    let (rows, per) = (g.rows, g.per_row);
    let mut out = BlockOutliers {
        blocks: rows * per,
        ..Default::default()
    };
    if rows < 2 || per < 2 || g.absmax.len() != rows * per {
        return out;
    }
    let finite = |x: &f32| x.is_finite();
    let mut scratch: Vec<f32> = Vec::with_capacity(rows.max(per));
    let row_med: Vec<f32> = g
        .absmax
        .chunks_exact(per)
        .map(|r| {
            scratch.clear();
            scratch.extend(r.iter().copied().filter(finite));
            median(&mut scratch)
        })
        .collect();
    let col_med: Vec<f32> = (0..per)
        .map(|j| {
            scratch.clear();
            scratch.extend((0..rows).map(|r| g.absmax[r * per + j]).filter(finite));
            median(&mut scratch)
        })
        .collect();
    let mut worst = 0f32;
    for (r, (row, &mr)) in g.absmax.chunks_exact(per).zip(&row_med).enumerate() {
        for (j, (&a, &mc)) in row.iter().zip(&col_med).enumerate() {
            if !a.is_finite() {
                continue;
            }
            let (hi, lo) = (mr.max(mc), mr.min(mc));
            let up = if hi > 0.0 { a / hi } else { 0.0 };
            // A zeroed block: a very large, finite ratio.
            let down = if lo > 0.0 {
                lo / a.max(f32::MIN_POSITIVE)
            } else {
                0.0
            };
            out.max_up_ratio = out.max_up_ratio.max(up);
            out.max_down_ratio = out.max_down_ratio.max(down);
            let bad_up = up > BLOCK_OUTLIER_RATIO;
            let bad_down = down > BLOCK_OUTLIER_RATIO;
            out.blown_up += usize::from(bad_up);
            out.shrunk += usize::from(bad_down);
            let score = up.max(down);
            if (bad_up || bad_down) && score > worst {
                worst = score;
                out.worst = Some(OutlierBlock {
                    row: r,
                    block: j,
                    absmax: a,
                    row_median: mr,
                    column_median: mc,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(rows: usize, per: usize, f: impl Fn(usize, usize) -> f32) -> BlockGrid {
        BlockGrid {
            rows,
            per_row: per,
            absmax: (0..rows * per).map(|i| f(i / per, i % per)).collect(),
        }
    }

    /// A pseudo-random magnitude in [0.5, 1.5).
    fn noise(r: usize, j: usize) -> f32 {
        let h = (r as u64 * 0x9E37_79B9_7F4A_7C15) ^ (j as u64 * 0xC2B2_AE3D_27D4_EB4F);
        0.5 + (h.rotate_left(17) % 1000) as f32 / 1000.0
    }

    #[test]
    fn honest_structure_is_not_flagged() {
        // Outlier input channels (columns 3 and 9 at 200x), dead rows (all zero), a few
        // near-zero rows (unused embeddings), and noise.
        let g = grid(300, 24, |r, j| {
            let col = if j == 3 || j == 9 { 200.0 } else { 1.0 };
            let row = match r {
                7 | 100 => 0.0,
                50..=59 => 1e-4,
                _ => 1.0,
            };
            col * row * noise(r, j)
        });
        let o = check(&g);
        assert_eq!(o.flagged(), 0, "{o:?}");
        assert!(o.max_up_ratio < 8.0 && o.max_down_ratio < 8.0, "{o:?}");
    }

    #[test]
    fn a_blown_up_and_a_zeroed_block_are_flagged() {
        let mut g = grid(64, 16, noise);
        g.absmax[5 * 16 + 2] *= 256.0;
        g.absmax[40 * 16 + 11] = 0.0;
        g.absmax[41 * 16 + 1] = f32::NAN; // left to the non-finite check
        let o = check(&g);
        assert_eq!((o.blown_up, o.shrunk), (1, 1), "{o:?}");
        let w = o.worst.unwrap();
        assert_eq!(
            (w.row, w.block),
            (40, 11),
            "the zeroed block is furthest out"
        );
        // A block scaled by 16 (an exponent bit of a lower weight) stays under the bound.
        let mut g = grid(64, 16, noise);
        g.absmax[5 * 16 + 2] *= 16.0;
        assert_eq!(check(&g).flagged(), 0);
    }

    #[test]
    fn degenerate_shapes_are_not_judged() {
        assert_eq!(check(&grid(1, 50, |_, j| j as f32)).flagged(), 0);
        assert_eq!(check(&grid(50, 1, |r, _| r as f32)).flagged(), 0);
        assert_eq!(check(&grid(0, 0, |_, _| 0.0)).blocks, 0);
    }
}
