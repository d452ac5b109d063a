//! Attention over the KV cache, with long key ranges split over threads (flash-decoding).
//!
//! A work item is one (token `t`, KV head `g`): the `group` query heads that share `g`, over
//! the positions row `t` sees. Decode has only `n_kv_heads` items (SmolLM2: 3, Gemma 3 270M:
//! 1), too few for the threads, and at long context each is long. Then each item's key range
//! is cut into `S` contiguous parts: part `s` computes its scores, per head their max `m_s`
//! and `l_s = sum exp(score - m_s)` (`Kernels::softmax_unscaled`), and the un-normalised
//! output `o_s = sum exp(score - m_s) v`; a merge gives each head
//! `sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s` with `M = max_s m_s`, which is the
//! softmax over the whole range up to float rounding. With `S = 1` an item runs as before
//! the split (scores, softmax, values straight into `Attn`).

use flowrt_model::plan::Buf;

use super::{two_bufs, Batch, CpuBackend};
use crate::kv::{as_f16, KvStore};

/// How attention cuts each (token, KV head)'s key range into parts run as separate tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttnSplit {
    /// Split when the batch has fewer items than about [`PARTS_PER_THREAD`] per thread and
    /// the ranges hold at least two parts of [`MIN_PART_KEYS`] keys. The default.
    #[default]
    Auto,
    /// Never split: one task per (token, KV head).
    Off,
    /// Always `n` parts per (token, KV head) over an f16 cache, whatever the batch and
    /// length (a range shorter than `n` keys leaves parts empty). For tests: it makes every
    /// batch go through the split and merge.
    Parts(usize),
}

/// `auto`, `off`, or a number of parts (at least 1) for [`AttnSplit::Parts`].
impl std::str::FromStr for AttnSplit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AttnSplit::Auto),
            "off" => Ok(AttnSplit::Off),
            _ => match s.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(AttnSplit::Parts(n)),
                _ => Err(format!(
                    "unknown attention split `{s}` (use auto, off or a number of parts, at least 1)"
                )),
            },
        }
    }
}

impl std::fmt::Display for AttnSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttnSplit::Auto => f.write_str("auto"),
            AttnSplit::Off => f.write_str("off"),
            AttnSplit::Parts(n) => write!(f, "{n}"),
        }
    }
}

/// Fewest keys in one part under [`AttnSplit::Auto`]: a part's scores and values cost far
/// more than its share of the merge (one `group x head_dim` axpy).
pub const MIN_PART_KEYS: usize = 256;

/// Tasks per thread [`AttnSplit::Auto`] aims at: the threads claim parts dynamically, so a
/// few per thread absorb a thread that starts late or is preempted.
pub const PARTS_PER_THREAD: usize = 4;

impl AttnSplit {
    /// Parts per item for a batch of `items` (token, KV head) pairs whose longest key range
    /// is `max_len`, on `threads` threads.
    pub(super) fn parts(self, threads: usize, items: usize, max_len: usize) -> usize {
        match self {
            AttnSplit::Off => 1,
            AttnSplit::Parts(n) => n.max(1),
            AttnSplit::Auto => {
                let target = PARTS_PER_THREAD * threads;
                if threads < 2 || items == 0 || items >= target {
                    return 1;
                }
                let most = (max_len / MIN_PART_KEYS).max(1);
                let mut s = target.div_ceil(items).min(most);
                // A whole number of parts per thread where the length allows it.
                while s < most && !(items * s).is_multiple_of(threads) {
                    s += 1;
                }
                s
            }
        }
    }

    /// Parts one item of `len` keys is actually cut into when the batch has `parts` per
    /// item (the rest of its `parts` slots stay empty).
    fn parts_of(self, parts: usize, len: usize) -> usize {
        match self {
            AttnSplit::Auto => parts.min(len / MIN_PART_KEYS).max(1),
            _ => parts,
        }
    }

    /// Most part slots a batch of up to `max_items` items can use: the size of the scratch
    /// for partial outputs.
    pub(super) fn max_slots(self, threads: usize, max_items: usize) -> usize {
        match self {
            AttnSplit::Off => 0,
            AttnSplit::Parts(n) => max_items * n.max(1),
            AttnSplit::Auto => (1..=max_items)
                .map(|items| match self.parts(threads, items, usize::MAX) {
                    1 => 0,
                    s => items * s,
                })
                .max()
                .unwrap_or(0),
        }
    }
}

/// The attention geometry of a model: what every task needs from its config.
#[derive(Clone, Copy)]
struct Heads {
    /// Values per head.
    hd: usize,
    /// Values of all query heads of a row.
    qd: usize,
    /// KV heads.
    nkv: usize,
    /// Query heads per KV head.
    group: usize,
    /// Score scale.
    scale: f32,
    /// Soft-cap of the scaled scores (Gemma 2), see [`softcap`].
    cap: Option<f32>,
}

impl Heads {
    fn of(c: &flowrt_model::ModelConfig) -> Heads {
        Heads {
            hd: c.head_dim,
            qd: c.q_dim(),
            nkv: c.num_key_value_heads,
            group: c.num_attention_heads / c.num_key_value_heads,
            scale: c.attn_scale,
            cap: c.attn_logit_softcapping,
        }
    }
}

/// The positions a row attends to, `(first, len)`: all of `0..=last` or the last `w` of them
/// under a sliding window. `last` is the row's own position (causal attention) or the last
/// position of its sequence in the batch (bidirectional).
fn visible(window: Option<usize>, last: usize) -> (usize, usize) {
    let first = window.map_or(0, |w| (last + 1).saturating_sub(w));
    (first, last + 1 - first)
}

/// `s = cap · tanh(s / cap)` for every score, when the model soft-caps them (Gemma 2).
fn softcap(kern: &flowrt_kernels::Kernels, scores: &mut [f32], cap: Option<f32>) {
    if let Some(cap) = cap {
        kern.softcap(scores, cap);
    }
}

/// Softmax of one head's scores in place; with a sink logit `sink`, the sink joins the
/// denominator (`exp(s_j) / (Σ exp(s_i) + exp(sink))`) and has no weight of its own.
fn softmax_sink(kern: &flowrt_kernels::Kernels, x: &mut [f32], sink: Option<f32>) {
    match sink {
        None => kern.softmax(x),
        Some(sink) => {
            let (m, l) = kern.softmax_unscaled(x);
            // exp(sink - m) may overflow to +inf: every weight is then 0, the limit.
            kern.scale(x, 1.0 / (l + (sink - m).exp()));
        }
    }
}

/// Floats one part slot holds for `group` heads of `hd` values: the un-normalised outputs
/// `(group, hd)`, then the maxes `(group)` and the sums `(group)`.
pub(super) fn slot_len(group: usize, hd: usize) -> usize {
    group * (hd + 2)
}

impl CpuBackend {
    /// `Attn[t, head] = softmax(Q[t, head] · K[s, g]ᵀ · scale) · V[s, g]` over positions
    /// `0..=p` of row `t`'s sequence `s` at position `p`, where `g = head / (n_heads /
    /// n_kv_heads)`; with a window `w`, over positions `p+1-w ..= p` only. Not `causal`: `p`
    /// is the last position of the row's span instead of its own.
    ///
    /// One task per row and KV head computes all the query heads that share it, so each
    /// cached key and value row is read once for the group (GQA), not once per query head;
    /// over an f16 cache, long ranges of few items are split (see the module docs).
    /// `sinks`: the layer's sink logits (one per query head) join each head's softmax
    /// denominator.
    pub(super) fn attention(
        &mut self,
        l: usize,
        window: Option<usize>,
        causal: bool,
        sinks: bool,
        batch: &Batch,
    ) -> Result<(), String> {
        let model = self.model.clone();
        let sinks = match (sinks, &model.layers[l].sinks) {
            (false, _) => None,
            (true, Some(s)) => Some(s.as_slice()),
            (true, None) => return Err("the layer has no attention sink weights".into()),
        };
        let n = batch.tokens.len();
        let items = n * self.model.config.num_key_value_heads;
        // The last position each row sees.
        self.row_see.clear();
        if causal {
            self.row_see
                .extend(self.rows[..n].iter().map(|&(_, pos)| pos));
        } else {
            self.row_see.extend_from_slice(&self.row_last[..n]);
        }
        let max_len = self.row_see[..n]
            .iter()
            .map(|&last| visible(window, last).1)
            .max()
            .unwrap_or(0);
        let f16_cache = matches!(
            (&self.kv.k[l], &self.kv.v[l]),
            (KvStore::F16(_), KvStore::F16(_))
        );
        let parts = if f16_cache {
            self.attn_split.parts(self.pool.n_threads(), items, max_len)
        } else {
            1
        };
        // `attn_parts` holds `max_slots` slots: enough for any batch (see the tests below).
        if parts == 1 {
            self.attention_whole(l, window, sinks, n);
        } else {
            self.attention_split(l, window, sinks, n, parts);
        }
        Ok(())
    }

    /// One task per (token, KV head), writing `Attn` directly.
    fn attention_whole(
        &mut self,
        l: usize,
        window: Option<usize>,
        sinks: Option<&[f32]>,
        n: usize,
    ) {
        let Heads {
            hd,
            qd,
            nkv,
            group,
            scale,
            cap,
        } = Heads::of(&self.model.config);
        let kern = self.kernels;
        let kv = &self.kv;
        let (kc, vc) = (&kv.k[l], &kv.v[l]);
        let (q, attn) = two_bufs(&mut self.bufs, Buf::Q, Buf::Attn);
        let q = &q[..n * qd];
        let per_thread = &self.per_thread;
        let rows = &self.rows;
        let see = &self.row_see;
        // Heads g*group..(g+1)*group of a row are contiguous in `Attn`: one chunk per (t, g).
        self.pool
            .for_each_chunk_mut(&mut attn[..n * qd], group * hd, &|tid, i, out| {
                let (t, g) = (i / nkv, i % nkv);
                let (seq, pos) = (rows[t].0, see[t]);
                let (first, len) = visible(window, pos);
                let qg = &q[t * qd + g * group * hd..t * qd + (g + 1) * group * hd];
                let mut scratch = per_thread[tid].lock().unwrap_or_else(|e| e.into_inner());
                let scores = &mut scratch.scores[..group * len];
                if let (KvStore::F16(kc), KvStore::F16(vc)) = (kc, vc) {
                    // Positions first..=pos of this KV head are contiguous rows.
                    let o = kv.offset(seq, g, first);
                    let (ks, vs) = (as_f16(&kc[o..o + len * hd]), as_f16(&vc[o..o + len * hd]));
                    kern.attn_scores_f16(qg, hd, ks, scale, scores);
                    softcap(kern, scores, cap);
                    for h in 0..group {
                        let sink = sinks.map(|s| s[g * group + h]);
                        softmax_sink(kern, &mut scores[h * len..(h + 1) * len], sink);
                    }
                    kern.attn_values_f16(scores, hd, vs, out);
                    return;
                }
                for (jj, j) in (first..=pos).enumerate() {
                    let o = kv.offset(seq, g, j);
                    for h in 0..group {
                        let qv = &qg[h * hd..(h + 1) * hd];
                        scores[h * len + jj] = scale
                            * match kc {
                                KvStore::F16(kc) => kern.dot_f32_f16(qv, as_f16(&kc[o..o + hd])),
                                KvStore::F32(kc) => kern.dot_f32(qv, &kc[o..o + hd]),
                            };
                    }
                }
                softcap(kern, scores, cap);
                for h in 0..group {
                    let sink = sinks.map(|s| s[g * group + h]);
                    softmax_sink(kern, &mut scores[h * len..(h + 1) * len], sink);
                }
                out.fill(0.0);
                for (jj, j) in (first..=pos).enumerate() {
                    let o = kv.offset(seq, g, j);
                    for h in 0..group {
                        let p = scores[h * len + jj];
                        let oh = &mut out[h * hd..(h + 1) * hd];
                        match vc {
                            KvStore::F16(vc) => kern.axpy_f16(oh, p, as_f16(&vc[o..o + hd])),
                            KvStore::F32(vc) => kern.axpy_f32(oh, p, &vc[o..o + hd]),
                        }
                    }
                }
            });
    }

    /// `parts` tasks per (token, KV head) over an f16 cache, each writing a part slot of
    /// `attn_parts`; then one task per (token, KV head) merges its slots into `Attn`.
    fn attention_split(
        &mut self,
        l: usize,
        window: Option<usize>,
        sinks: Option<&[f32]>,
        n: usize,
        parts: usize,
    ) {
        let Heads {
            hd,
            qd,
            nkv,
            group,
            scale,
            cap,
        } = Heads::of(&self.model.config);
        let kern = self.kernels;
        let kv = &self.kv;
        let (KvStore::F16(kc), KvStore::F16(vc)) = (&kv.k[l], &kv.v[l]) else {
            unreachable!("attention is split over an f16 cache only")
        };
        let split = self.attn_split;
        let slot = slot_len(group, hd);
        let (q, attn) = two_bufs(&mut self.bufs, Buf::Q, Buf::Attn);
        let q = &q[..n * qd];
        let slots = &mut self.attn_parts[..n * nkv * parts * slot];
        let per_thread = &self.per_thread;
        let rows = &self.rows;
        let see = &self.row_see;
        // Slot i * parts + s: part s of item i = (t, g).
        self.pool.for_each_chunk_mut(slots, slot, &|tid, j, out| {
            let (i, s) = (j / parts, j % parts);
            let (t, g) = (i / nkv, i % nkv);
            let (seq, pos) = (rows[t].0, see[t]);
            let (first, len) = visible(window, pos);
            let cut = split.parts_of(parts, len);
            let (outs, stats) = out.split_at_mut(group * hd);
            let (maxes, sums) = stats.split_at_mut(group);
            // Keys first+k0 .. first+k1 of the item's range.
            let (k0, k1) = if s < cut {
                (s * len / cut, (s + 1) * len / cut)
            } else {
                (0, 0)
            };
            if k0 == k1 {
                // An empty part: weight exp(-inf - M) = 0 in the merge.
                outs.fill(0.0);
                maxes.fill(f32::NEG_INFINITY);
                sums.fill(0.0);
                return;
            }
            let plen = k1 - k0;
            let qg = &q[t * qd + g * group * hd..t * qd + (g + 1) * group * hd];
            let mut scratch = per_thread[tid].lock().unwrap_or_else(|e| e.into_inner());
            let scores = &mut scratch.scores[..group * plen];
            let o = kv.offset(seq, g, first + k0);
            let (ks, vs) = (as_f16(&kc[o..o + plen * hd]), as_f16(&vc[o..o + plen * hd]));
            kern.attn_scores_f16(qg, hd, ks, scale, scores);
            softcap(kern, scores, cap);
            for h in 0..group {
                (maxes[h], sums[h]) = kern.softmax_unscaled(&mut scores[h * plen..(h + 1) * plen]);
            }
            kern.attn_values_f16(scores, hd, vs, outs);
        });
        let slots = &*slots;
        self.pool
            .for_each_chunk_mut(&mut attn[..n * qd], group * hd, &|_, i, out| {
                let g = i % nkv;
                let item = &slots[i * parts * slot..(i + 1) * parts * slot];
                for h in 0..group {
                    // Head h's max and sum in part s.
                    let max = |s: usize| item[s * slot + group * hd + h];
                    let sum = |s: usize| item[s * slot + group * (hd + 1) + h];
                    // Finite: every item has at least one key, so one part is not empty.
                    let m = (0..parts).map(max).fold(f32::NEG_INFINITY, f32::max);
                    let oh = &mut out[h * hd..(h + 1) * hd];
                    oh.fill(0.0);
                    // A sink joins the denominator: exp(sink - m), no value.
                    let mut total = sinks.map_or(0.0, |s| (s[g * group + h] - m).exp());
                    for s in 0..parts {
                        let w = (max(s) - m).exp();
                        total += w * sum(s);
                        kern.axpy_f32(oh, w, &item[s * slot + h * hd..s * slot + (h + 1) * hd]);
                    }
                    kern.scale(oh, 1.0 / total);
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_splits_few_long_items_into_whole_parts_per_thread() {
        let auto = AttnSplit::Auto;
        // SmolLM2 decode (3 KV heads) on 2 threads after 2048 tokens: 12 parts of ~512 keys.
        assert_eq!(auto.parts(2, 3, 2049), 4);
        // Gemma 3 270M decode (1 KV head): 8 parts, fewer where the range is shorter.
        assert_eq!(auto.parts(2, 1, 4096), 8);
        assert_eq!(auto.parts(2, 1, 1025), 4);
        assert_eq!(auto.parts(2, 1, 512), 2);
        // Short ranges, one thread, or enough items already: today's path.
        assert_eq!(auto.parts(2, 3, 511), 1);
        assert_eq!(auto.parts(1, 1, 100_000), 1);
        assert_eq!(auto.parts(2, 8, 100_000), 1);
        assert_eq!(auto.parts(2, 3 * 64, 2049), 1);
        // A short item of a split batch is cut into fewer parts.
        assert_eq!(auto.parts_of(4, 2049), 4);
        assert_eq!(auto.parts_of(4, 600), 2);
        assert_eq!(auto.parts_of(4, 10), 1);
        assert_eq!(AttnSplit::Off.parts(8, 1, 100_000), 1);
        assert_eq!(AttnSplit::Parts(3).parts(1, 100, 5), 3);
        assert_eq!(AttnSplit::Parts(3).parts_of(3, 2), 3);
    }

    /// The scratch sized once at creation holds every batch's slots.
    #[test]
    fn max_slots_bounds_every_batch() {
        for split in [AttnSplit::Auto, AttnSplit::Off, AttnSplit::Parts(5)] {
            for threads in 1..=64 {
                for max_items in [1, 2, 3, 7, 64, 256 * 8] {
                    let cap = split.max_slots(threads, max_items);
                    for items in 1..=max_items {
                        for len in [1, 255, 256, 511, 2049, 1 << 20] {
                            let s = split.parts(threads, items, len);
                            assert!(
                                s == 1 || items * s <= cap,
                                "{split:?} threads {threads} items {items} len {len}: {s} parts, {cap} slots"
                            );
                        }
                    }
                }
            }
        }
    }
}
