//! The seam between the dispatcher and a device.

use std::time::{Duration, Instant};

use flowrt_model::plan::{Buf, GroupKind, MatRole};
use flowrt_model::Plan;

use crate::cut::Runlist;
use crate::trace::Trace;

/// Which logits a batch produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// The last token's of every span (generation).
    Last,
    /// Every token's (teacher-forced verification).
    All,
    /// None (a prefill batch that is not the prompt's last).
    None,
}

/// A run of tokens of one sequence at consecutive positions `pos0..pos0 + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    /// The sequence's slot in the device's KV cache.
    pub seq: usize,
    pub pos0: usize,
    pub len: usize,
}

/// Tokens of one or more sequences, run through the model as one batch: the weights are read
/// once for all of them. `spans` cover `tokens` in order, each sequence at most once.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub tokens: &'a [u32],
    pub spans: &'a [SeqSpan],
    pub logits: LogitsWanted,
}

/// Why a batch cannot run on a device: an error of the request, never retried.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("a batch carries 1..={max} tokens, got {got}")]
    Size { got: usize, max: usize },
    #[error("token id {id} at batch index {index} is outside the vocabulary (size {vocab})")]
    Token { id: u32, index: usize, vocab: usize },
    #[error("span {span} is empty")]
    EmptySpan { span: usize },
    #[error("span {span} names sequence {seq}, but the device holds {n_seq}")]
    NoSequence {
        span: usize,
        seq: usize,
        n_seq: usize,
    },
    #[error("sequence {seq} appears twice in one batch")]
    SequenceTwice { seq: usize },
    #[error("positions {pos0}..{end} do not fit the context of {n_ctx} tokens")]
    Context {
        pos0: usize,
        end: usize,
        n_ctx: usize,
    },
    #[error("spans cover {covered} tokens of a batch of {tokens}")]
    Coverage { covered: usize, tokens: usize },
}

impl Batch<'_> {
    /// Check the spans against the tokens and a device's sequences and context.
    pub fn check(&self, n_seq: usize, n_ctx: usize) -> Result<(), BatchError> {
        let mut covered = 0usize;
        for (i, s) in self.spans.iter().enumerate() {
            if s.len == 0 {
                return Err(BatchError::EmptySpan { span: i });
            }
            if s.seq >= n_seq {
                return Err(BatchError::NoSequence {
                    span: i,
                    seq: s.seq,
                    n_seq,
                });
            }
            if self.spans[..i].iter().any(|o| o.seq == s.seq) {
                return Err(BatchError::SequenceTwice { seq: s.seq });
            }
            let end = s.pos0.saturating_add(s.len);
            if end > n_ctx {
                return Err(BatchError::Context {
                    pos0: s.pos0,
                    end,
                    n_ctx,
                });
            }
            covered += s.len;
        }
        if covered != self.tokens.len() || self.tokens.is_empty() {
            return Err(BatchError::Coverage {
                covered,
                tokens: self.tokens.len(),
            });
        }
        Ok(())
    }

    /// Everything a device checks before it runs a batch: at most `max_batch` tokens, every
    /// id below `vocab`, and the spans ([`Batch::check`]).
    pub fn check_for(
        &self,
        n_seq: usize,
        n_ctx: usize,
        max_batch: usize,
        vocab: usize,
    ) -> Result<(), BatchError> {
        if self.tokens.len() > max_batch {
            return Err(BatchError::Size {
                got: self.tokens.len(),
                max: max_batch,
            });
        }
        if let Some((index, &id)) = self
            .tokens
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(BatchError::Token { id, index, vocab });
        }
        self.check(n_seq, n_ctx)
    }

    /// Positions attended over the batch (Σ over tokens of `pos + 1`), for cost estimates.
    pub fn attended(&self) -> u64 {
        self.spans
            .iter()
            .map(|s| {
                (0..s.len as u64)
                    .map(|t| s.pos0 as u64 + t + 1)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Logit rows the batch produces.
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            LogitsWanted::Last => self.spans.len(),
            LogitsWanted::All => self.tokens.len(),
            LogitsWanted::None => 0,
        }
    }
}

/// Why a runlist did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeviceError {
    /// The runlist did not finish by its deadline. `op` is what the device was running, when
    /// it can tell.
    #[error("missed its deadline after {waited:?}{}", at(*group, *kind, *op))]
    Timeout {
        waited: Duration,
        group: Option<usize>,
        kind: Option<GroupKind>,
        op: Option<&'static str>,
    },
    /// The device reported a fault.
    #[error("device fault{}: {reason}", at(*group, *kind, *op))]
    Fault {
        group: Option<usize>,
        kind: Option<GroupKind>,
        op: Option<&'static str>,
        reason: String,
    },
    /// The backend did not return from the runlist within the watchdog's `limit` (its deadline
    /// plus grace): the dispatcher stopped waiting and considers the device lost (see
    /// [`crate::watch`]). Not retried: the backend is still held by the stuck call.
    #[error(
        "did not return from the device within {} ms (deadline plus the watchdog's grace); \
         abandoned after {} ms, the device is considered lost",
        limit.as_millis(),
        waited.as_millis()
    )]
    Lost { waited: Duration, limit: Duration },
    /// The device was lost in an earlier step and has not come back: nothing was run.
    #[error("the device is lost ({} ms ago) and has not come back", lost_for.as_millis())]
    Unavailable { lost_for: Duration },
    /// The input can run on no runlist (a token outside the vocabulary, a full context, ...):
    /// never retried.
    #[error("{0}")]
    Input(String),
}

/// Why a backend could not read or write an activation buffer, or collect matmul input
/// statistics (what `flowrt diff` and `flowrt pack`'s calibration ask of it; nothing in normal
/// running does).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The backend has no way to do it.
    #[error("the {backend} backend cannot {what}")]
    Unsupported { backend: String, what: &'static str },
    /// More rows asked for than the buffer holds (or a buffer of no width).
    #[error("{rows} rows of {buf:?} asked for; the backend holds {max} rows of {width}")]
    Rows {
        buf: Buf,
        rows: usize,
        max: usize,
        width: usize,
    },
    /// Values that are not whole rows, too many of them, or a buffer that cannot be written.
    #[error("cannot write {len} values into {buf:?} (rows of {width}, at most {max} rows)")]
    Write {
        buf: Buf,
        len: usize,
        width: usize,
        max: usize,
    },
    /// The device cannot do it now: it is broken, busy with a runlist, or the transfer failed.
    #[error("cannot {what} {buf:?}: {reason}")]
    Device {
        what: &'static str,
        buf: Buf,
        reason: String,
    },
}

fn at(group: Option<usize>, kind: Option<GroupKind>, op: Option<&'static str>) -> String {
    let mut s = String::new();
    if let Some(k) = kind {
        match k.layer() {
            Some(l) => s.push_str(&format!(" at layer {l}")),
            None => s.push_str(&format!(" in {k:?}")),
        }
    }
    if let Some(op) = op {
        s.push_str(&format!(", op `{op}`"));
    }
    if let Some(g) = group {
        s.push_str(&format!(" (group {g})"));
    }
    s
}

impl DeviceError {
    /// Whether running the step again (at smaller depth) may succeed.
    pub fn retryable(&self) -> bool {
        !matches!(
            self,
            DeviceError::Input(_) | DeviceError::Lost { .. } | DeviceError::Unavailable { .. }
        )
    }

    /// The decoder layer the error happened in, when known.
    pub fn layer(&self) -> Option<usize> {
        match self {
            DeviceError::Timeout { kind, .. } | DeviceError::Fault { kind, .. } => {
                kind.and_then(|k| k.layer())
            }
            _ => None,
        }
    }

    /// The op the error happened in, when known.
    pub fn op(&self) -> Option<&'static str> {
        match self {
            DeviceError::Timeout { op, .. } | DeviceError::Fault { op, .. } => *op,
            _ => None,
        }
    }
}

/// Conservative throughput figures a device gives for deadline estimates: a runlist's
/// deadline is `max(floor, slack × (bytes / bytes_per_s + flops / flops_per_s))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceRates {
    pub bytes_per_s: f64,
    pub flops_per_s: f64,
    pub slack: f64,
    pub floor: Duration,
}

/// The squares of one matmul's inputs, summed per input column over every row it multiplied
/// while a backend collected them ([`Backend::collect_input_stats`]): what an importance-
/// weighted quantisation of that matrix weighs its columns by.
#[derive(Clone, Debug, PartialEq)]
pub struct InputStat {
    /// The decoder layer (`None`: the output projection).
    pub layer: Option<usize>,
    pub role: MatRole,
    /// `Σ x_j²` of every input column `j` (the matrix's row length of them).
    pub sum_sq: Vec<f64>,
    /// Rows (tokens) summed.
    pub rows: u64,
    /// `Σ x xᵀ` over the same rows (`n × n`, row-major, f32) when [`InputStatKind::Gram`]
    /// was asked for; shared by the matmuls that read the same input.
    pub gram: Option<std::sync::Arc<Vec<f32>>>,
    /// Every input row summed (`rows × n`, row-major, in the order they were multiplied)
    /// when [`InputStatKind::Inputs`] was asked for; shared like `gram`.
    pub inputs: Option<std::sync::Arc<Vec<f32>>>,
}

/// What [`Backend::collect_input_stats`] accumulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputStatKind {
    /// Each input column's sum of squares ([`InputStat::sum_sq`]).
    SumSquares,
    /// That and the whole second-moment matrix `Σ x xᵀ` of each distinct input
    /// ([`InputStat::gram`]): `4 n²` bytes per input of `n` columns (every layer's), for
    /// error-feedback quantisation.
    Gram,
    /// [`InputStatKind::Gram`] and every input row itself ([`InputStat::inputs`]): `4 n`
    /// bytes per row and input, for the cross moments of two runs over the same positions.
    Inputs,
}

/// What a backend is, for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendInfo {
    /// Backend name (`cpu`, `vulkan`, or `fault(cpu)` when wrapped).
    pub name: String,
    /// Kernel set in use (`avx2`, `scalar`, `wgsl`, ...).
    pub kernels: String,
    /// The matmul code path of decode steps (one token per sequence), e.g. `avx512vnni-x8`.
    pub matmul_decode: String,
    /// The matmul code path of prefill batches.
    pub matmul_prefill: String,
    /// Host threads the backend runs on.
    pub threads: usize,
    /// The device: the CPU's model name, or the GPU's name as its driver reports it.
    pub device: String,
    /// Driver name and version, for devices that have one.
    pub driver: Option<String>,
    /// Memory the device has for weights and caches (`None`: host memory, shared).
    pub memory_bytes: Option<u64>,
    /// Bytes the backend keeps beside the model file's weights: repacked or uploaded weight
    /// copies.
    pub prepared_weight_bytes: u64,
    /// Bytes reserved for the KV cache (every sequence, full context).
    pub kv_cache_bytes: u64,
}

/// A device that runs runlists of a model's plan for one sequence.
///
/// The dispatcher calls `submit` then `wait` for each runlist of a step, in order; after an
/// error it calls `cancel` and may start the step again from its first runlist. A synchronous
/// device may do the work inside `wait` (checking the deadline between ops); an asynchronous
/// one queues it in `submit`. These calls run on a device thread the dispatcher watches
/// ([`crate::watch`]): a `wait` that overruns its deadline by more than the watchdog's grace
/// is abandoned and the device treated as lost until it returns.
pub trait Backend: Send {
    fn info(&self) -> BackendInfo;
    /// Most layers per runlist this device takes by default (`None`: no limit).
    fn default_max_runlist_layers(&self) -> Option<usize>;
    /// Throughput figures for deadlines.
    fn rates(&self) -> DeviceRates;
    /// Queue `runlist` (groups of `plan`) over `batch`.
    fn submit(&mut self, plan: &Plan, runlist: &Runlist, batch: &Batch) -> Result<(), DeviceError>;
    /// Wait for the submitted runlist until `deadline`. Op spans go to `trace` when given.
    fn wait(
        &mut self,
        plan: &Plan,
        deadline: Instant,
        trace: Option<&mut Trace>,
    ) -> Result<(), DeviceError>;
    /// Abandon the submitted runlist; the device stays usable.
    fn cancel(&mut self);
    /// Logits of the last completed batch: `(rows, vocab)`.
    fn logits(&self) -> &[f32];
    /// The pooled rows of the last completed batch when its plan ends in a pooling op
    /// (`flowrt_model::Plan::embedding`): `(spans, hidden)`, one row per span in batch order.
    /// A device without a pooling op returns none (the default), and the engine says so.
    fn embeddings(&self) -> &[f32] {
        &[]
    }
    /// Positions the device's KV cache holds per sequence.
    fn n_ctx(&self) -> usize;
    /// Sequences the device's KV cache holds.
    fn n_seq(&self) -> usize;
    /// Most tokens per batch.
    fn max_batch(&self) -> usize;
    /// Rows of the logits.
    fn vocab_size(&self) -> usize;
    /// The first `rows` rows of activation buffer `buf` (`rows × buf.width(config)` values)
    /// as the last completed runlist left them, for inspection: `flowrt diff` runs a step one
    /// layer per runlist and reads the residual stream `X` after each. Nothing calls this in
    /// normal running. A device that cannot read its buffers back answers why not (the
    /// default).
    fn read_activation(&mut self, buf: Buf, rows: usize) -> Result<Vec<f32>, ProbeError> {
        let _ = (buf, rows);
        Err(ProbeError::Unsupported {
            backend: self.info().name,
            what: "read activation buffers back",
        })
    }
    /// Overwrites the first `values.len() / buf.width(config)` rows of activation buffer `buf`
    /// before the next runlist: `flowrt diff` feeds one model's residual stream `X` into the
    /// other's next layer, to measure each layer's own error on the same input. Nothing calls
    /// this in normal running. A device that cannot write its buffers answers why not (the
    /// default).
    fn write_activation(&mut self, buf: Buf, values: &[f32]) -> Result<(), ProbeError> {
        let _ = (buf, values);
        Err(ProbeError::Unsupported {
            backend: self.info().name,
            what: "write activation buffers",
        })
    }
    /// Starts (`Some`, from zero) or stops (`None`) accumulating [`InputStat`]s of every
    /// dense matmul the following runlists run (not a mixture of experts' expert matrices):
    /// `flowrt pack` calibrates its importance-weighted and error-feedback quantisation with
    /// them. Nothing calls this in normal running. A device that cannot answers why not (the
    /// default).
    fn collect_input_stats(&mut self, what: Option<InputStatKind>) -> Result<(), ProbeError> {
        let _ = what;
        Err(ProbeError::Unsupported {
            backend: self.info().name,
            what: "collect matmul input statistics",
        })
    }
    /// The statistics collected so far (see [`Backend::collect_input_stats`]), in layer and
    /// role order; empty when none were.
    fn take_input_stats(&mut self) -> Vec<InputStat> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch<'a>(tokens: &'a [u32], spans: &'a [SeqSpan]) -> Batch<'a> {
        Batch {
            tokens,
            spans,
            logits: LogitsWanted::Last,
        }
    }

    fn span(seq: usize, pos0: usize, len: usize) -> SeqSpan {
        SeqSpan { seq, pos0, len }
    }

    /// What every backend checks before it runs a batch, each fault with its typed error
    /// (2 sequences of 8 positions, batches of at most 4 tokens, a vocabulary of 10).
    #[test]
    fn batches_are_checked_with_typed_errors() {
        let check = |t: &[u32], s: &[SeqSpan]| batch(t, s).check_for(2, 8, 4, 10);
        assert_eq!(check(&[1, 2, 3], &[span(0, 0, 2), span(1, 5, 1)]), Ok(()));
        assert_eq!(
            check(&[1; 5], &[span(0, 0, 5)]),
            Err(BatchError::Size { got: 5, max: 4 })
        );
        assert_eq!(
            check(&[1, 10], &[span(0, 0, 2)]),
            Err(BatchError::Token {
                id: 10,
                index: 1,
                vocab: 10
            })
        );
        assert_eq!(
            check(&[1], &[span(0, 0, 0), span(1, 0, 1)]),
            Err(BatchError::EmptySpan { span: 0 })
        );
        assert_eq!(
            check(&[1], &[span(2, 0, 1)]),
            Err(BatchError::NoSequence {
                span: 0,
                seq: 2,
                n_seq: 2
            })
        );
        assert_eq!(
            check(&[1, 2], &[span(1, 0, 1), span(1, 1, 1)]),
            Err(BatchError::SequenceTwice { seq: 1 })
        );
        assert_eq!(
            check(&[1, 2], &[span(0, 7, 2)]),
            Err(BatchError::Context {
                pos0: 7,
                end: 9,
                n_ctx: 8
            })
        );
        assert_eq!(
            check(&[1, 2, 3], &[span(0, 0, 2)]),
            Err(BatchError::Coverage {
                covered: 2,
                tokens: 3
            })
        );
        assert_eq!(
            check(&[], &[]),
            Err(BatchError::Coverage {
                covered: 0,
                tokens: 0
            })
        );
        let e = check(&[1, 10], &[span(0, 0, 2)]).unwrap_err();
        assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    }
}
