//! Sampler parameters, their defaults and their validation.

/// The most history tokens a sampler will keep for penalties; larger
/// `repeat_last_n` values are rejected rather than allocating without bound.
pub const MAX_REPEAT_LAST_N: usize = 1 << 20;

/// Everything that decides how a token is drawn from one step's logits.
///
/// Field names and meanings follow the usual llama.cpp / OpenAI options.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `0` means greedy (argmax after penalties).
    pub temperature: f32,
    /// Keep only the `top_k` highest logits; `0` turns the filter off.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability
    /// mass reaches `top_p`; `1` turns the filter off. Must be in `(0, 1]`.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely token's;
    /// `0` turns the filter off. Must be in `[0, 1]`.
    pub min_p: f32,
    /// Repetition penalty for tokens seen in the last `repeat_last_n` accepted tokens:
    /// positive logits are divided by it, negative ones multiplied. `1` = off; must be > 0.
    pub repeat_penalty: f32,
    /// How many of the most recently accepted tokens the penalties look at; `0` = none.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token present in the penalty window.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the penalty window.
    pub frequency_penalty: f32,
    /// RNG seed; `None` draws one from OS entropy (see [`crate::Sampler::seed`]).
    pub seed: Option<u64>,
    /// `(token id, bias)` pairs added to those tokens' logits before anything else (OpenAI's
    /// `logit_bias`): a large negative bias bans a token, a large positive one forces it.
    /// Ids must be below the vocabulary size and biases finite; an id listed twice gets both.
    /// A token a constraint masked out stays out (`-inf` plus any bias is `-inf`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    /// The llama.cpp command-line defaults: temperature 0.8, top-k 40, top-p 0.95,
    /// min-p 0.05, no penalties, a 64-token penalty window, random seed.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerConfig {
    /// Deterministic argmax decoding with every filter and penalty off.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: Some(0),
            logit_bias: Vec::new(),
        }
    }

    /// Checks every parameter; the error names the first bad one and its allowed range.
    pub fn validate(&self) -> Result<(), SampleError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SampleError::InvalidTemperature { value: t });
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SampleError::InvalidTopP { value: p });
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(SampleError::InvalidMinP { value: m });
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SampleError::InvalidRepeatPenalty { value: r });
        }
        if self.repeat_last_n > MAX_REPEAT_LAST_N {
            return Err(SampleError::InvalidRepeatLastN {
                value: self.repeat_last_n,
                max: MAX_REPEAT_LAST_N,
            });
        }
        if !self.presence_penalty.is_finite() {
            return Err(SampleError::InvalidPresencePenalty {
                value: self.presence_penalty,
            });
        }
        if !self.frequency_penalty.is_finite() {
            return Err(SampleError::InvalidFrequencyPenalty {
                value: self.frequency_penalty,
            });
        }
        if let Some(&(id, value)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(SampleError::InvalidLogitBias { id, value });
        }
        Ok(())
    }

    /// True when any of the three penalties would change a logit.
    pub(crate) fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// Errors from building a sampler or sampling.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("temperature must be a finite number >= 0 (0 = greedy), got {value}")]
    InvalidTemperature { value: f32 },
    #[error("top_p must be in (0, 1] (1 = off), got {value}")]
    InvalidTopP { value: f32 },
    #[error("min_p must be in [0, 1] (0 = off), got {value}")]
    InvalidMinP { value: f32 },
    #[error("repeat_penalty must be a finite number > 0 (1 = off), got {value}")]
    InvalidRepeatPenalty { value: f32 },
    #[error("repeat_last_n must be at most {max}, got {value}")]
    InvalidRepeatLastN { value: usize, max: usize },
    #[error("presence_penalty must be a finite number, got {value}")]
    InvalidPresencePenalty { value: f32 },
    #[error("frequency_penalty must be a finite number, got {value}")]
    InvalidFrequencyPenalty { value: f32 },
    #[error("logit_bias of token {id} must be a finite number, got {value}")]
    InvalidLogitBias { id: u32, value: f32 },
    #[error("logit_bias names token {id}, outside the vocabulary of {vocab_size} tokens")]
    LogitBiasOutOfVocab { id: u32, vocab_size: usize },
    #[error("vocabulary size must be between 1 and {max}, got {value}")]
    InvalidVocabSize { value: usize, max: usize },
    #[error("logits have {got} entries but the sampler was built for a vocabulary of {expected}")]
    LogitsLength { got: usize, expected: usize },
    #[error("every logit is NaN or infinite; the model output is broken")]
    NoFiniteLogits,
}
