//! The token sampler: logit biases, penalties, then greedy or top-k → temperature → softmax →
//! top-p → min-p → draw.

use std::cmp::Ordering;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::config::{SampleError, SamplerConfig};

/// One token still in play after filtering.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    /// Logit after penalties, before temperature.
    logit: f32,
    /// `exp((logit - max_logit) / temperature)`: unnormalised probability, 1 for the best.
    weight: f32,
}

/// Best first: higher logit, then lower id. A total order, so every selection and sort
/// below picks the same set for the same input.
fn best_first(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// First size of the sorted prefix top-p looks at; doubled until the mass is reached.
const TOP_P_FIRST_CHUNK: usize = 64;

/// Draws tokens from logits. Build one per sequence with [`Sampler::new`]; call
/// [`Sampler::sample`] for each step and [`Sampler::accept`] with the token actually
/// appended (also for prompt tokens if they should count towards the penalties).
///
/// All buffers are allocated in `new`; `sample` and `accept` do not allocate.
///
/// Non-finite logits (NaN, ±inf, also after penalties) are never chosen. If no finite
/// logit is left, `sample` returns [`SampleError::NoFiniteLogits`] instead of a token.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    vocab_size: usize,
    /// The seed `rng` started from (drawn from OS entropy when `cfg.seed` is `None`).
    seed: u64,
    rng: ChaCha20Rng,
    /// (vocab_size) this step's logits after biases and penalties.
    penalized: Vec<f32>,
    /// (≤ vocab_size, capacity vocab_size) tokens still in play.
    candidates: Vec<Candidate>,
    /// (≤ repeat_last_n, capacity repeat_last_n) ring buffer of accepted tokens; empty
    /// and unused when no penalty is active.
    history: Vec<u32>,
    /// Where the next accepted token overwrites `history` once it is full.
    history_next: usize,
    /// (vocab_size when penalties are active, else 0) occurrences of each token in `history`.
    counts: Vec<u32>,
}

impl Sampler {
    /// Validates `cfg` and allocates buffers for a vocabulary of `vocab_size` tokens.
    pub fn new(cfg: SamplerConfig, vocab_size: usize) -> Result<Sampler, SampleError> {
        cfg.validate()?;
        let max = u32::MAX as usize;
        if vocab_size == 0 || vocab_size > max {
            return Err(SampleError::InvalidVocabSize {
                value: vocab_size,
                max,
            });
        }
        if let Some(&(id, _)) = cfg
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= vocab_size)
        {
            return Err(SampleError::LogitBiasOutOfVocab { id, vocab_size });
        }
        let seed = cfg.seed.unwrap_or_else(rand::random::<u64>);
        let (history_cap, counts_len) = if cfg.penalties_active() {
            (cfg.repeat_last_n, vocab_size)
        } else {
            (0, 0)
        };
        Ok(Sampler {
            rng: ChaCha20Rng::seed_from_u64(seed),
            seed,
            vocab_size,
            penalized: vec![0.0; vocab_size],
            candidates: Vec::with_capacity(vocab_size),
            history: Vec::with_capacity(history_cap),
            history_next: 0,
            counts: vec![0; counts_len],
            cfg,
        })
    }

    /// The seed the RNG started from; pass it back as `SamplerConfig::seed` to replay.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Forgets the penalty history and restarts the RNG from [`Sampler::seed`], so a
    /// reset sampler draws exactly what a fresh one with the same seed would.
    pub fn reset(&mut self) {
        for &t in &self.history {
            self.counts[t as usize] = 0;
        }
        self.history.clear();
        self.history_next = 0;
        self.rng = ChaCha20Rng::seed_from_u64(self.seed);
    }

    /// Records `token` for the penalties (the last `repeat_last_n` tokens count).
    /// Ids outside the vocabulary are ignored; nothing is recorded when no penalty is on.
    pub fn accept(&mut self, token: u32) {
        let cap = self.history.capacity().min(self.cfg.repeat_last_n);
        if cap == 0 || token as usize >= self.vocab_size {
            return;
        }
        if self.history.len() < cap {
            self.history.push(token);
        } else {
            let old = std::mem::replace(&mut self.history[self.history_next], token);
            self.counts[old as usize] -= 1;
            self.history_next = (self.history_next + 1) % cap;
        }
        self.counts[token as usize] += 1;
    }

    /// Picks the next token from `logits` (one entry per vocabulary id).
    ///
    /// Steps: the configured logit biases; penalties from the accepted history; then, at temperature 0, the argmax
    /// (ties → lowest id); otherwise top-k → temperature → softmax → top-p → min-p → a
    /// draw from the seeded RNG. Does not record the token: call [`Sampler::accept`].
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        if logits.len() != self.vocab_size {
            return Err(SampleError::LogitsLength {
                got: logits.len(),
                expected: self.vocab_size,
            });
        }
        self.penalized.copy_from_slice(logits);
        for &(id, bias) in &self.cfg.logit_bias {
            self.penalized[id as usize] += bias;
        }
        self.apply_penalties();
        if self.cfg.temperature == 0.0 {
            return argmax(&self.penalized).ok_or(SampleError::NoFiniteLogits);
        }
        self.collect_candidates();
        if self.candidates.is_empty() {
            return Err(SampleError::NoFiniteLogits);
        }
        self.top_k();
        self.softmax_weights();
        self.top_p();
        self.min_p();
        Ok(self.draw())
    }

    /// Repetition penalty (divide positive logits, multiply negative ones), then
    /// `count * frequency_penalty + presence_penalty` subtracted, once per distinct token.
    fn apply_penalties(&mut self) {
        let rp = self.cfg.repeat_penalty;
        let pp = self.cfg.presence_penalty;
        let fp = self.cfg.frequency_penalty;
        // Each distinct token is penalised once: its count is zeroed as a "done" mark
        // and rebuilt from the ring afterwards, so no scratch set is needed.
        for &t in &self.history {
            let c = self.counts[t as usize];
            if c == 0 {
                continue;
            }
            let l = &mut self.penalized[t as usize];
            if *l <= 0.0 {
                *l *= rp;
            } else {
                *l /= rp;
            }
            *l -= c as f32 * fp + pp;
            self.counts[t as usize] = 0;
        }
        for &t in &self.history {
            self.counts[t as usize] += 1;
        }
    }

    fn collect_candidates(&mut self) {
        self.candidates.clear();
        for (id, &logit) in self.penalized.iter().enumerate() {
            if logit.is_finite() {
                self.candidates.push(Candidate {
                    id: id as u32,
                    logit,
                    weight: 0.0,
                });
            }
        }
    }

    /// Keeps the `top_k` best candidates (unordered), by selection rather than a sort.
    fn top_k(&mut self) {
        let k = self.cfg.top_k;
        if k > 0 && k < self.candidates.len() {
            self.candidates.select_nth_unstable_by(k - 1, best_first);
            self.candidates.truncate(k);
        }
    }

    /// Sets each weight to `exp((logit - max) / temperature)`; the best gets exactly 1.
    fn softmax_weights(&mut self) {
        let t = self.cfg.temperature;
        let max = self
            .candidates
            .iter()
            .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        for c in &mut self.candidates {
            // Divide rather than multiply by 1/t: 1/t overflows for subnormal t.
            c.weight = ((c.logit - max) / t).exp();
        }
    }

    /// Keeps the smallest best-first prefix whose mass reaches `top_p` of the total.
    /// Sorts only as much as needed: a prefix of 64, then 128, ... (each step selects
    /// the next block out of the unsorted tail and sorts just that block).
    fn top_p(&mut self) {
        let p = self.cfg.top_p;
        if p >= 1.0 {
            return;
        }
        let n = self.candidates.len();
        let total: f64 = self.candidates.iter().map(|c| c.weight as f64).sum();
        let target = p as f64 * total;
        let mut sorted = 0; // candidates[..sorted] are the best `sorted`, best first
        let mut want = TOP_P_FIRST_CHUNK.min(n);
        let mut cum = 0.0f64;
        loop {
            let tail = &mut self.candidates[sorted..];
            let block = want - sorted;
            if block < tail.len() {
                tail.select_nth_unstable_by(block - 1, best_first);
            }
            tail[..block].sort_unstable_by(best_first);
            for i in sorted..want {
                cum += self.candidates[i].weight as f64;
                if cum >= target {
                    self.candidates.truncate(i + 1);
                    return;
                }
            }
            if want == n {
                return; // rounding left the target just out of reach: keep everything
            }
            sorted = want;
            want = (want * 2).min(n);
        }
    }

    /// Drops candidates below `min_p` times the best one's probability (the best has
    /// weight 1 and always survives top-k and top-p).
    fn min_p(&mut self) {
        let m = self.cfg.min_p;
        if m > 0.0 {
            self.candidates.retain(|c| c.weight >= m);
        }
    }

    /// Draws one candidate with probability proportional to its weight.
    fn draw(&mut self) -> u32 {
        let total: f64 = self.candidates.iter().map(|c| c.weight as f64).sum();
        let r = self.rng.random::<f64>() * total;
        let mut acc = 0.0f64;
        let mut last_positive = self.candidates[0].id;
        for c in &self.candidates {
            if c.weight > 0.0 {
                acc += c.weight as f64;
                last_positive = c.id;
                if r < acc {
                    return c.id;
                }
            }
        }
        last_positive // r rounded up to the total
    }
}

/// Index of the largest finite value, lowest index on ties; `None` if none is finite.
fn argmax(xs: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in xs.iter().enumerate() {
        if !x.is_finite() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map(|(i, _)| i as u32)
}

#[cfg(test)]
mod tests;
