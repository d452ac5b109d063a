//! Teacher-forced comparison of flowrt's logits with a reference implementation's.
//!
//! The reference file (safetensors) holds, for i = 0, 1, ...: `prompt.{i}.input_ids` (i64 [T])
//! and `prompt.{i}.logits_all` (f32, f16 or bf16 [T, vocab]). flowrt runs exactly those
//! tokens (adding nothing) and compares every position.

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
struct Acc {
    positions: usize,
    top1: usize,
    kl_sum: f64,
    max_kl: f64,
    max_err: f64,
}

impl Acc {
    fn add(&mut self, reference: &[f32], ours: &[f32]) {
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
        let kl = kl.max(0.0);
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

    fn merge(&mut self, o: &Acc) {
        self.positions += o.positions;
        self.top1 += o.top1;
        self.kl_sum += o.kl_sum;
        self.max_kl = self.max_kl.max(o.max_kl);
        self.max_err = self.max_err.max(o.max_err);
    }

    fn ratio(&self) -> (f64, f64) {
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
        let logits = st
            .tensor(&logits_name)
            .map_err(|_| err(format!("`{ids_name}` has no matching `{logits_name}`")))?;
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
        if logits.shape() != [t, vocab] {
            return Err(err(format!(
                "`{logits_name}` has shape {:?}, expected [{t}, {vocab}] (the model's vocabulary is {vocab})",
                logits.shape()
            )));
        }
        let tokens = ids
            .data()
            .chunks_exact(8)
            .map(|c| {
                let v = i64::from_le_bytes(c.try_into().expect("8 bytes"));
                u32::try_from(v)
                    .ok()
                    .filter(|&v| (v as usize) < vocab)
                    .ok_or_else(|| {
                        err(format!(
                            "`{ids_name}` holds token id {v}, outside the vocabulary of {vocab}"
                        ))
                    })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let (elem, decode): (usize, fn(&[u8]) -> f32) = match logits.dtype() {
            Dtype::F32 => (4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            Dtype::F16 => (2, |c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
            Dtype::BF16 => (2, |c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            d => {
                return Err(err(format!(
                    "`{logits_name}` has dtype {d:?}; use f32, f16 or bf16"
                )))
            }
        };
        ref_dtype.get_or_insert_with(|| format!("{:?}", logits.dtype()).to_lowercase());
        let data = logits.data();
        let mut acc = Acc::default();
        let mut row = vec![0.0f32; vocab];
        session.reset();
        session.feed_all_logits(&tokens, &mut |first, ours| {
            for (j, ours_row) in ours.chunks_exact(vocab).enumerate() {
                let p = first + j;
                let src = &data[p * vocab * elem..(p + 1) * vocab * elem];
                for (dst, c) in row.iter_mut().zip(src.chunks_exact(elem)) {
                    *dst = decode(c);
                }
                acc.add(&row, ours_row);
            }
        })?;
        let (top1, mean_kl) = acc.ratio();
        prompts.push(PromptReport {
            index: i,
            positions: acc.positions,
            top1_agreement: top1,
            mean_kl,
            max_kl: acc.max_kl,
            max_abs_logit_err: acc.max_err,
        });
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
