//! The matmul driver: one or more matmuls of one input (Q/K/V, gate/up) as one parallel job
//! over row blocks of their weights, the input quantised once for all of them.

use flowrt_dtype::GgmlType;
use flowrt_model::plan::{Buf, MatRole};
use flowrt_model::{Model, WeightMatrix};

use super::{Batch, CpuBackend};
use crate::act::ActRows;
use crate::pool::ColumnWriter;

/// Rows of a weight matrix one matmul task computes: at least enough that the kernels'
/// software prefetch (16-32 rows ahead) runs inside each task's slice of the weights, at most
/// what the per-thread output tile holds.
pub(super) const MIN_ROW_BLOCK: usize = 64;
pub(super) const MAX_ROW_BLOCK: usize = 256;

/// Rows per task for a job of `rows` rows in all on `threads` threads: about two tasks per
/// thread, within [`MIN_ROW_BLOCK`, `MAX_ROW_BLOCK`], a multiple of 16. Larger tasks stream
/// weights better (measured on SmolLM2: decode 117 -> 130 tok/s and 4 batched sequences
/// 241 -> 276 tok/s going from 64 to 128-256 rows), smaller ones balance small matrices
/// over many threads.
pub(crate) fn row_block(rows: usize, threads: usize) -> usize {
    (rows / (2 * threads.max(1)) / 16 * 16).clamp(MIN_ROW_BLOCK, MAX_ROW_BLOCK)
}
/// A matmul's weight and optional bias.
type WeightAndBias<'a> = (&'a WeightMatrix, Option<&'a Vec<f32>>);

/// Most matmuls of one input that run as one parallel job.
pub(super) const MAX_FUSED: usize = 3;

impl CpuBackend {
    /// A matmul's weight and bias.
    pub(super) fn weight(
        model: &Model,
        layer: Option<usize>,
        role: MatRole,
    ) -> Result<(&WeightMatrix, Option<&Vec<f32>>), String> {
        let w = model.matrix(layer, role).ok_or_else(|| {
            format!("the model has no {role:?} matrix here (or a layer matmul outside a layer)")
        })?;
        Ok((w, model.bias(layer, role)))
    }

    /// How activations are quantised for weights of type `ty` (`packed`: repacked into the
    /// x8 layout).
    pub(super) fn act_rows(&self, ty: GgmlType, packed: bool) -> ActRows {
        ActRows::for_weight(self.act_quant, self.kernels, ty, packed)
    }

    /// `dst_j = src · W_jᵀ (+ bias_j)` for each item, as one parallel job over row blocks of
    /// all the matrices (they share the input and its quantisation).
    pub(super) fn matmuls(
        &mut self,
        layer: Option<usize>,
        src: Buf,
        items: &[(Buf, MatRole)],
        batch: &Batch,
    ) -> Result<(), String> {
        let model = self.model.clone();
        let mut ws: [Option<WeightAndBias>; MAX_FUSED] = [None; MAX_FUSED];
        let mut packed: [Option<&[u8]>; MAX_FUSED] = [None; MAX_FUSED];
        for (j, &(_, role)) in items.iter().enumerate() {
            // Borrowed from the cloned `Arc`, so `self`'s buffers stay free below.
            ws[j] = Some(Self::weight(&model, layer, role)?);
            packed[j] = self.packed.get(layer, role);
        }
        let first = ws[0].expect("at least one matmul").0;
        let fmt = self.act_rows(first.dtype, packed[0].is_some());
        let fusable = items.len() > 1
            && ws[..items.len()].iter().zip(&packed).all(|(w, p)| {
                w.is_some_and(|(w, _)| {
                    w.cols == first.cols && self.act_rows(w.dtype, p.is_some()) == fmt
                })
            });
        if items.len() > 1 && !fusable {
            for &item in items {
                self.matmuls(layer, src, &[item], batch)?;
            }
            return Ok(());
        }
        let n = batch.tokens.len();
        let produces_logits = items[0].0 == Buf::Logits;
        // Which rows of `src` feed the matmul: all, or for the output projection those whose
        // logits are wanted (`logit_rows`; `r0 == usize::MAX` marks that selection).
        let (r0, nsel) = if produces_logits {
            if self.logit_rows.is_empty() {
                self.n_logit_rows = 0;
                return Ok(());
            }
            (usize::MAX, self.logit_rows.len())
        } else {
            (0, n)
        };
        let kdim = first.cols;
        // Row `t` of the selection: rows `r0..r0 + nsel`, or the logit rows.
        let logit_rows = &self.logit_rows;
        let row_of = |t: usize| {
            if r0 == usize::MAX {
                logit_rows[t]
            } else {
                r0 + t
            }
        };
        if let Some(stats) = self.input_stats.as_mut() {
            let s = &self.bufs[src as usize];
            let rows: Vec<&[f32]> = (0..nsel)
                .map(|t| {
                    let r = row_of(t);
                    &s[r * kdim..(r + 1) * kdim]
                })
                .collect();
            let roles: Vec<MatRole> = items.iter().map(|&(_, role)| role).collect();
            stats.add(
                self.kernels,
                layer,
                &roles,
                &rows,
                kdim,
                self.pool.n_threads(),
            );
        }
        let act_row = fmt.row_size(kdim);
        let kern = self.kernels;
        if self.quant_of != Some((src, fmt, r0, nsel)) {
            let need = nsel * act_row;
            if self.quant.len() < need {
                self.quant.resize(need, 0);
            }
            let s = &self.bufs[src as usize];
            for t in 0..nsel {
                let r = row_of(t);
                let row = &s[r * kdim..(r + 1) * kdim];
                fmt.quantize(kern, row, &mut self.quant[t * act_row..(t + 1) * act_row]);
            }
            self.quant_of = Some((src, fmt, r0, nsel));
        }
        if produces_logits {
            let out_len = nsel * first.rows;
            let lb = &mut self.bufs[Buf::Logits as usize];
            if lb.len() < out_len {
                lb.resize(out_len, 0.0);
            }
            self.n_logit_rows = nsel;
        }
        // Row blocks of every matrix, numbered consecutively.
        let total_rows: usize = ws[..items.len()].iter().flatten().map(|w| w.0.rows).sum();
        let rb = row_block(total_rows, self.pool.n_threads());
        let mut starts = [0usize; MAX_FUSED + 1];
        for (j, w) in ws[..items.len()].iter().flatten().enumerate() {
            starts[j + 1] = starts[j] + w.0.rows.div_ceil(rb);
        }
        let n_blocks = starts[items.len()];
        let block = |i: usize| {
            let j = (0..items.len()).rfind(|&j| starts[j] <= i).unwrap_or(0);
            let rows = ws[j].map_or(0, |w| w.0.rows);
            let b = i - starts[j];
            (j, b * rb, ((b + 1) * rb).min(rows))
        };
        let quant = &self.quant[..nsel * act_row];
        let per_thread = &self.per_thread;
        let job = |tid: usize, i: usize, wr: &mut ColumnWriter<'_, f32>| {
            let (j, c0, c1) = block(i);
            let Some((w, _)) = ws[j] else { return };
            let nr = c1 - c0;
            let mut scratch = per_thread[tid].lock().unwrap_or_else(|e| e.into_inner());
            let tile = &mut scratch.tile[..nsel * nr];
            fmt.matmul(kern, w, packed[j], c0, c1, quant, nsel, tile);
            for t in 0..nsel {
                wr.row(t).copy_from_slice(&tile[t * nr..(t + 1) * nr]);
            }
        };
        let len = |j: usize| nsel * ws[j].map_or(0, |w| w.0.rows);
        let strides: [usize; MAX_FUSED] = std::array::from_fn(|j| ws[j].map_or(1, |w| w.0.rows));
        match items {
            [(d0, _)] => {
                let [o0] = self
                    .bufs
                    .get_disjoint_mut([*d0 as usize])
                    .map_err(|e| e.to_string())?;
                self.pool.for_each_column_block(
                    [&mut o0[..len(0)]],
                    [strides[0]],
                    n_blocks,
                    &block,
                    &job,
                );
            }
            [(d0, _), (d1, _)] => {
                let [o0, o1] = self
                    .bufs
                    .get_disjoint_mut([*d0 as usize, *d1 as usize])
                    .map_err(|e| e.to_string())?;
                self.pool.for_each_column_block(
                    [&mut o0[..len(0)], &mut o1[..len(1)]],
                    [strides[0], strides[1]],
                    n_blocks,
                    &block,
                    &job,
                );
            }
            [(d0, _), (d1, _), (d2, _)] => {
                let [o0, o1, o2] = self
                    .bufs
                    .get_disjoint_mut([*d0 as usize, *d1 as usize, *d2 as usize])
                    .map_err(|e| e.to_string())?;
                self.pool.for_each_column_block(
                    [&mut o0[..len(0)], &mut o1[..len(1)], &mut o2[..len(2)]],
                    strides,
                    n_blocks,
                    &block,
                    &job,
                );
            }
            _ => {
                return Err(format!(
                    "{} fused matmuls (at most {MAX_FUSED})",
                    items.len()
                ))
            }
        }
        for (j, &(dst, _)) in items.iter().enumerate() {
            if let Some((w, Some(b))) = ws[j] {
                for row in self.bufs[dst as usize][..len(j)].chunks_exact_mut(w.rows) {
                    kern.add(row, b);
                }
            }
        }
        Ok(())
    }
}
