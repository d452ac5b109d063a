//! Teacher-forced comparison of flowrt's logits with a reference implementation's.
//!
//! The reference file (safetensors) holds, for i = 0, 1, ...: `prompt.{i}.input_ids` (i64 [T])
//! and `prompt.{i}.logits_all` (f32, f16 or bf16 [T, vocab]). flowrt runs exactly those
//! tokens (adding nothing) and compares every position.
//!
//! For big vocabularies a compact form replaces `logits_all` with the reference's top K:
//! `prompt.{i}.topk_ids` (i64 [T, K]), `prompt.{i}.topk_logits` (f32 [T, K], descending) and
//! `prompt.{i}.logsumexp` (f32 [T], over the full row). KL is then computed over the K tokens
//! plus one bucket holding the rest of the probability mass on each side: by the log-sum
//! inequality that is a lower bound of the full KL, and equal to it up to the tail's share
//! (small when K covers nearly all of the reference's mass, as it does for trained models).
//! The logit error is measured over the K tokens only.

use std::path::Path;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::Serialize;

use crate::error::EngineError;
use crate::session::Session;

/// Agreement over one prompt.
#[derive(Clone, Debug, Serialize)]
pub struct PromptReport {
    pub index: usize,
    pub positions: usize,
    pub top1_agreement: f64,
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_abs_logit_err: f64,
}

/// Agreement over all prompts.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    pub positions: usize,
    pub top1_agreement: f64,
    /// Mean over positions of KL(reference ‖ flowrt) of the softmaxes.
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_abs_logit_err: f64,
    /// Element type the reference logits were stored in.
    pub reference_dtype: String,
    pub prompts: Vec<PromptReport>,
}

#[derive(Default)]
pub(crate) struct Acc {
    pub(crate) positions: usize,
    top1: usize,
    kl_sum: f64,
    pub(crate) max_kl: f64,
    pub(crate) max_err: f64,
}

impl Acc {
    /// This accumulator's figures as prompt `index`'s report.
    pub(crate) fn report(&self, index: usize) -> PromptReport {
        let (top1, mean_kl) = self.ratio();
        PromptReport {
            index,
            positions: self.positions,
            top1_agreement: top1,
            mean_kl,
            max_kl: self.max_kl,
            max_abs_logit_err: self.max_err,
        }
    }

    pub(crate) fn add(&mut self, reference: &[f32], ours: &[f32]) {
        let lr = log_softmax(reference);
        let lo = log_softmax(ours);
        let kl: f64 = lr
            .iter()
            .zip(&lo)
            .map(|(&r, &o)| {
                if r.is_finite() {
                    r.exp() * (r - o)
                } else {
                    0.0
                }
            })
            .sum();
        // NaN logits (a broken model) are as far as can be, not "no difference" (which is
        // what `f64::max` would make of them).
        let kl = if kl.is_nan() {
            f64::INFINITY
        } else {
            kl.max(0.0)
        };
        self.positions += 1;
        self.top1 += usize::from(argmax(reference) == argmax(ours));
        self.kl_sum += kl;
        self.max_kl = self.max_kl.max(kl);
        let err = reference
            .iter()
            .zip(ours)
            .map(|(&a, &b)| (a as f64 - b as f64).abs())
            .fold(0.0, f64::max);
        self.max_err = self.max_err.max(err);
    }

    /// One position against a top-K reference (see the module docs).
    fn add_topk(&mut self, ids: &[u32], logits: &[f32], lse: f32, ours: &[f32]) {
        let lo = log_softmax(ours);
        let (mut kl, mut mass_r, mut mass_o, mut err) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (&id, &l) in ids.iter().zip(logits) {
            let lr = l as f64 - lse as f64;
            let o = lo[id as usize];
            kl += lr.exp() * (lr - o);
            mass_r += lr.exp();
            mass_o += o.exp();
            err = err.max((l as f64 - ours[id as usize] as f64).abs());
        }
        let tail_r = (1.0 - mass_r).max(0.0);
        let tail_o = (1.0 - mass_o).max(1e-300);
        if tail_r > 0.0 {
            kl += tail_r * (tail_r.ln() - tail_o.ln());
        }
        let kl = kl.max(0.0);
        self.positions += 1;
        self.top1 += usize::from(ids[0] as usize == argmax(ours));
        self.kl_sum += kl;
        self.max_kl = self.max_kl.max(kl);
        self.max_err = self.max_err.max(err);
    }

    pub(crate) fn merge(&mut self, o: &Acc) {
        self.positions += o.positions;
        self.top1 += o.top1;
        self.kl_sum += o.kl_sum;
        self.max_kl = self.max_kl.max(o.max_kl);
        self.max_err = self.max_err.max(o.max_err);
    }

    pub(crate) fn ratio(&self) -> (f64, f64) {
        let n = self.positions.max(1) as f64;
        (self.top1 as f64 / n, self.kl_sum / n)
    }
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// Index of the largest value (the first of ties).
pub(crate) fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Run every prompt of the reference file teacher-forced and compare.
pub fn verify(session: &mut Session, reference: &Path) -> Result<VerifyReport, EngineError> {
    let err = |reason: String| EngineError::Reference {
        path: reference.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(reference).map_err(|e| err(format!("cannot read: {e}")))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| err(format!("not a safetensors file: {e}")))?;
    let vocab = session.vocab_size();
    let mut total = Acc::default();
    let mut prompts = Vec::new();
    let mut ref_dtype = None;
    for i in 0.. {
        let ids_name = format!("prompt.{i}.input_ids");
        let logits_name = format!("prompt.{i}.logits_all");
        let Ok(ids) = st.tensor(&ids_name) else {
            break;
        };
        if ids.dtype() != Dtype::I64 || ids.shape().len() != 1 {
            return Err(err(format!(
                "`{ids_name}` must be i64 [T], found {:?} {:?}",
                ids.dtype(),
                ids.shape()
            )));
        }
        let t = ids.shape()[0];
        if t == 0 {
            return Err(err(format!("`{ids_name}` is empty")));
        }
        let tokens = read_ids(ids.data(), vocab).map_err(|e| err(format!("`{ids_name}` {e}")))?;
        let reference = if st.tensor(&logits_name).is_ok() {
            full_reference(&st, &logits_name, t, vocab).map_err(err)?
        } else {
            topk_reference(&st, i, t, vocab).map_err(err)?
        };
        ref_dtype.get_or_insert_with(|| reference.describe());
        let mut acc = Acc::default();
        let mut row = vec![0.0f32; vocab];
        session.reset();
        session.feed_all_logits(&tokens, &mut |first, ours| {
            for (j, ours_row) in ours.chunks_exact(vocab).enumerate() {
                let p = first + j;
                match &reference {
                    Reference::Full {
                        data, elem, decode, ..
                    } => {
                        let src = &data[p * vocab * elem..(p + 1) * vocab * elem];
                        for (dst, c) in row.iter_mut().zip(src.chunks_exact(*elem)) {
                            *dst = decode(c);
                        }
                        acc.add(&row, ours_row);
                    }
                    Reference::TopK {
                        k,
                        ids,
                        logits,
                        lse,
                    } => acc.add_topk(
                        &ids[p * k..(p + 1) * k],
                        &logits[p * k..(p + 1) * k],
                        lse[p],
                        ours_row,
                    ),
                }
            }
        })?;
        prompts.push(acc.report(i));
        total.merge(&acc);
    }
    if prompts.is_empty() {
        return Err(err("holds no `prompt.0.input_ids`".into()));
    }
    let (top1, mean_kl) = total.ratio();
    Ok(VerifyReport {
        positions: total.positions,
        top1_agreement: top1,
        mean_kl,
        max_kl: total.max_kl,
        max_abs_logit_err: total.max_err,
        reference_dtype: ref_dtype.unwrap_or_default(),
        prompts,
    })
}

/// One prompt's reference logits.
enum Reference<'a> {
    /// Every logit, stored as `elem`-byte values.
    Full {
        data: &'a [u8],
        elem: usize,
        decode: fn(&[u8]) -> f32,
        dtype: &'static str,
    },
    /// The top `k` per position.
    TopK {
        k: usize,
        ids: Vec<u32>,
        logits: Vec<f32>,
        lse: Vec<f32>,
    },
}

impl Reference<'_> {
    fn describe(&self) -> String {
        match self {
            Reference::Full { dtype, .. } => dtype.to_string(),
            Reference::TopK { k, .. } => format!("top-{k} f32"),
        }
    }
}

fn decode_f32(c: &[u8]) -> f32 {
    f32::from_le_bytes([c[0], c[1], c[2], c[3]])
}
fn decode_f16(c: &[u8]) -> f32 {
    f16::from_le_bytes([c[0], c[1]]).to_f32()
}
fn decode_bf16(c: &[u8]) -> f32 {
    bf16::from_le_bytes([c[0], c[1]]).to_f32()
}

/// Token ids stored as i64, each checked against the vocabulary.
fn read_ids(data: &[u8], vocab: usize) -> Result<Vec<u32>, String> {
    data.chunks_exact(8)
        .map(|c| {
            let v = i64::from_le_bytes(c.try_into().expect("8 bytes"));
            u32::try_from(v)
                .ok()
                .filter(|&v| (v as usize) < vocab)
                .ok_or_else(|| format!("holds token id {v}, outside the vocabulary of {vocab}"))
        })
        .collect()
}

fn full_reference<'a>(
    st: &SafeTensors<'a>,
    name: &str,
    t: usize,
    vocab: usize,
) -> Result<Reference<'a>, String> {
    let logits = st.tensor(name).map_err(|e| e.to_string())?;
    if logits.shape() != [t, vocab] {
        return Err(format!(
            "`{name}` has shape {:?}, expected [{t}, {vocab}] (the model's vocabulary is {vocab})",
            logits.shape()
        ));
    }
    let (elem, decode, dtype): (usize, fn(&[u8]) -> f32, _) = match logits.dtype() {
        Dtype::F32 => (4, decode_f32, "f32"),
        Dtype::F16 => (2, decode_f16, "f16"),
        Dtype::BF16 => (2, decode_bf16, "bf16"),
        d => return Err(format!("`{name}` has dtype {d:?}; use f32, f16 or bf16")),
    };
    Ok(Reference::Full {
        data: logits.data(),
        elem,
        decode,
        dtype,
    })
}

fn topk_reference<'a>(
    st: &SafeTensors<'a>,
    i: usize,
    t: usize,
    vocab: usize,
) -> Result<Reference<'a>, String> {
    let get = |suffix: &str, dtype: Dtype| {
        let name = format!("prompt.{i}.{suffix}");
        let v = st
            .tensor(&name)
            .map_err(|_| format!("prompt {i} has neither `prompt.{i}.logits_all` nor `{name}`"))?;
        if v.dtype() != dtype {
            return Err(format!("`{name}` must be {dtype:?}, found {:?}", v.dtype()));
        }
        Ok((name, v))
    };
    let (ids_name, ids) = get("topk_ids", Dtype::I64)?;
    let (logits_name, logits) = get("topk_logits", Dtype::F32)?;
    let (lse_name, lse) = get("logsumexp", Dtype::F32)?;
    let k = match ids.shape() {
        [rows, k] if *rows == t && *k >= 1 && *k <= vocab => *k,
        s => {
            return Err(format!(
                "`{ids_name}` has shape {s:?}, expected [{t}, K <= {vocab}]"
            ))
        }
    };
    if logits.shape() != [t, k] {
        return Err(format!(
            "`{logits_name}` has shape {:?}, expected [{t}, {k}]",
            logits.shape()
        ));
    }
    if lse.shape() != [t] {
        return Err(format!(
            "`{lse_name}` has shape {:?}, expected [{t}]",
            lse.shape()
        ));
    }
    let floats = |d: &[u8]| d.chunks_exact(4).map(decode_f32).collect::<Vec<f32>>();
    Ok(Reference::TopK {
        k,
        ids: read_ids(ids.data(), vocab).map_err(|e| format!("`{ids_name}` {e}"))?,
        logits: floats(logits.data()),
        lse: floats(lse.data()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_logits_are_infinitely_far_not_equal() {
        // `f64::max(NaN, 0.0)` is 0: a model producing NaN logits once measured as a perfect
        // match (KL 0) against its reference.
        let mut acc = Acc::default();
        acc.add(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]);
        assert_eq!(acc.max_kl, 0.0);
        acc.add(&[1.0, 2.0, 3.0], &[f32::NAN, 2.0, 3.0]);
        assert_eq!(acc.max_kl, f64::INFINITY);
        assert_eq!(acc.ratio().1, f64::INFINITY);
    }
}
