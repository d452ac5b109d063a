//! The CPU as a `flowrt_dispatch::Backend`: runlists submitted, then run (and watched) on
//! `wait`.

use std::time::{Duration, Instant};

use flowrt_dispatch::{Backend, BackendInfo, DeviceError, DeviceRates, ProbeError, Runlist, Trace};
use flowrt_model::plan::Buf;
use flowrt_model::Plan;

use super::{input_stats, Batch, CpuBackend};
use crate::act::{ActQuant, ActRows};

/// The CPU is a synchronous device: `submit` records the runlist, `wait` runs it on the
/// calling thread (and the pool), checking the deadline before each op.
impl Backend for CpuBackend {
    fn info(&self) -> BackendInfo {
        let paths = self.kernels.q16_paths();
        let (decode, prefill) = if self.act_quant == ActQuant::Q8 {
            let k = format!("{}-q8", self.kernels.name());
            (k.clone(), k)
        } else if self.packed.any_of_type(&self.model, |ty| {
            ActRows::for_weight(self.act_quant, self.kernels, ty, true) == ActRows::A8
        }) {
            // The type without A8 kernels (Q8_0) keeps the Q16 x8 path.
            let (decode, prefill) = self.kernels.a8_paths().unwrap_or(("scalar", "scalar"));
            (format!("{decode}-x8-a8"), format!("{prefill}-x8-a8"))
        } else if self.packed_bytes() > 0 {
            (
                format!("{}-x8", paths.x8_decode),
                format!("{}-x8", paths.x8),
            )
        } else {
            let k = format!("{}-q16", paths.rows);
            (k.clone(), k)
        };
        BackendInfo {
            name: "cpu".into(),
            kernels: self.kernels.name().into(),
            matmul_decode: decode,
            matmul_prefill: prefill,
            threads: self.n_threads(),
            device: crate::cpu_name(),
            driver: None,
            memory_bytes: None,
            prepared_weight_bytes: self.packed_bytes() as u64,
            kv_cache_bytes: self.kv.bytes() as u64,
        }
    }

    fn default_max_runlist_layers(&self) -> Option<usize> {
        // No queue to overflow: the whole model in one runlist.
        None
    }

    fn rates(&self) -> DeviceRates {
        // Well below what a CPU with the SIMD kernels sustains (this 2-core Zen 4 VM: ~7 GB/s
        // weight streaming, ~100 GFLOP/s in prefill), times 10, so that only a stall misses.
        DeviceRates {
            bytes_per_s: 1e9,
            flops_per_s: 10e9,
            slack: 10.0,
            floor: Duration::from_secs(2),
        }
    }

    fn submit(&mut self, plan: &Plan, rl: &Runlist, batch: &Batch) -> Result<(), DeviceError> {
        if rl.groups.end > plan.groups.len() || rl.groups.is_empty() {
            return Err(DeviceError::Input(format!(
                "runlist groups {:?} outside the plan's {}",
                rl.groups,
                plan.groups.len()
            )));
        }
        // Input errors are the request's, not the device's: found here, they are never
        // retried.
        batch
            .check_for(
                self.kv.n_seq,
                self.kv.n_ctx,
                self.max_batch,
                self.model.token_embd.rows,
            )
            .map_err(|e| DeviceError::Input(e.to_string()))?;
        self.pending_tokens.clear();
        self.pending_tokens.extend_from_slice(batch.tokens);
        self.pending_spans.clear();
        self.pending_spans.extend_from_slice(batch.spans);
        self.pending = Some((rl.groups.clone(), batch.logits));
        Ok(())
    }

    fn wait(
        &mut self,
        plan: &Plan,
        deadline: Instant,
        trace: Option<&mut Trace>,
    ) -> Result<(), DeviceError> {
        let Some((groups, logits)) = self.pending.take() else {
            return Err(DeviceError::Input(
                "wait without a submitted runlist".into(),
            ));
        };
        let tokens = std::mem::take(&mut self.pending_tokens);
        let spans = std::mem::take(&mut self.pending_spans);
        let batch = Batch {
            tokens: &tokens,
            spans: &spans,
            logits,
        };
        let start = groups.start;
        let r = self.execute_watched(&plan.groups[groups], start, &batch, Some(deadline), trace);
        self.pending_tokens = tokens;
        self.pending_spans = spans;
        r.map_err(|e| e.to_device())
    }

    fn cancel(&mut self) {
        self.pending = None;
    }

    fn logits(&self) -> &[f32] {
        CpuBackend::logits(self)
    }

    fn embeddings(&self) -> &[f32] {
        CpuBackend::embeddings(self)
    }

    fn n_ctx(&self) -> usize {
        CpuBackend::n_ctx(self)
    }

    fn max_batch(&self) -> usize {
        CpuBackend::max_batch(self)
    }

    fn n_seq(&self) -> usize {
        self.kv.n_seq
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn collect_input_stats(
        &mut self,
        what: Option<flowrt_dispatch::InputStatKind>,
    ) -> Result<(), ProbeError> {
        self.input_stats = what.map(input_stats::InputStats::new);
        Ok(())
    }
    fn take_input_stats(&mut self) -> Vec<flowrt_dispatch::InputStat> {
        match self.input_stats.as_mut() {
            Some(s) => std::mem::replace(s, input_stats::InputStats::new(s.kind())).take(),
            None => Vec::new(),
        }
    }
    fn read_activation(&mut self, buf: Buf, rows: usize) -> Result<Vec<f32>, ProbeError> {
        if buf == Buf::Logits {
            return Ok(self.logits().to_vec());
        }
        let width = buf.width(&self.model.config);
        let b = &self.bufs[buf as usize];
        if rows > self.max_batch || rows * width > b.len() {
            return Err(ProbeError::Rows {
                buf,
                rows,
                max: self.max_batch,
                width,
            });
        }
        Ok(b[..rows * width].to_vec())
    }

    fn write_activation(&mut self, buf: Buf, values: &[f32]) -> Result<(), ProbeError> {
        let width = buf.width(&self.model.config);
        let b = &mut self.bufs[buf as usize];
        if buf == Buf::Logits
            || width == 0
            || !values.len().is_multiple_of(width)
            || values.len() / width > self.max_batch
            || values.len() > b.len()
        {
            return Err(ProbeError::Write {
                buf,
                len: values.len(),
                width,
                max: self.max_batch,
            });
        }
        b[..values.len()].copy_from_slice(values);
        Ok(())
    }
}
