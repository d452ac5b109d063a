//! RoPE frequencies and their scalings, computed the way HF transformers computes them (f32
//! arithmetic in the same order) so that flowrt and the reference rotate by the same angles.

/// How a family stretches RoPE frequencies for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (`rope_type: "linear"`).
    Linear { factor: f32 },
    /// Llama 3.1's piecewise scaling (`rope_type: "llama3"`).
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// LongRoPE (Phi-3, MiniCPM): per-dimension divisors of the frequencies, `short_factor`
    /// for positions below `original_max_position_embeddings` and `long_factor` from there on,
    /// and cos/sin scaled by `attention_factor`.
    ///
    /// The reference implementations pick one factor set for a whole forward pass from the
    /// current sequence length and keep cached keys as they were rotated; flowrt rotates each
    /// position with the set that an incremental (token-by-token) run of the reference would
    /// have used for it, so the two agree exactly for sequences up to the original length and
    /// for token-by-token decoding beyond it.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f32,
    },
    /// Per-dimension divisors of the frequencies (GGUF `rope_freqs.weight`, how llama.cpp stores
    /// Llama 3's scaling).
    FreqFactors(Vec<f32>),
}

/// RoPE of one kind of layer.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base frequency.
    pub theta: f32,
    pub scaling: RopeScaling,
}

/// Frequencies of a RoPE for a span of positions.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeFreqs {
    /// First position these frequencies apply to.
    pub from_pos: usize,
    /// `rope_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
}

impl RopeConfig {
    pub fn plain(theta: f32) -> RopeConfig {
        RopeConfig {
            theta,
            scaling: RopeScaling::None,
        }
    }

    /// The inverse frequencies, as spans starting at increasing positions (one span except for
    /// LongRoPE), for `rope_dim` rotated dimensions.
    pub fn freqs(&self, rope_dim: usize) -> Vec<RopeFreqs> {
        let half = rope_dim / 2;
        // base^(2i / dim) in f32, as `base ** (arange(0, dim, 2).float() / dim)` does.
        let pow = |i: usize| self.theta.powf((2 * i) as f32 / rope_dim as f32);
        let plain: Vec<f32> = (0..half).map(|i| 1.0 / pow(i)).collect();
        let span = |inv_freq| RopeFreqs {
            from_pos: 0,
            inv_freq,
        };
        match &self.scaling {
            RopeScaling::None => vec![span(plain)],
            RopeScaling::Linear { factor } => {
                vec![span(plain.iter().map(|f| f / factor).collect())]
            }
            RopeScaling::FreqFactors(d) => {
                vec![span(plain.iter().zip(d).map(|(f, d)| f / d).collect())]
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = *original_max_position_embeddings as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let inv = plain
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                vec![span(inv)]
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                ..
            } => {
                // 1 / (ext * base^(2i/dim)), as the reference computes it.
                let with = |ext: &[f32]| (0..half).map(|i| 1.0 / (ext[i] * pow(i))).collect();
                vec![
                    span(with(short_factor)),
                    RopeFreqs {
                        from_pos: *original_max_position_embeddings,
                        inv_freq: with(long_factor),
                    },
                ]
            }
        }
    }

    /// Factor cos and sin are multiplied by (1 except for LongRoPE).
    pub fn attention_factor(&self) -> f32 {
        match self.scaling {
            RopeScaling::LongRope {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// cos and sin of every position's angles, `(n_ctx, rope_dim / 2)` each, computed as the
    /// reference does (inverse frequencies and angles in f32, cos/sin rounded from f64, times
    /// the attention factor). Every backend rotates with this table.
    pub fn cos_sin_table(&self, rope_dim: usize, n_ctx: usize) -> (Vec<f32>, Vec<f32>) {
        let half = rope_dim / 2;
        let spans = self.freqs(rope_dim);
        let factor = self.attention_factor();
        let mut cos = Vec::with_capacity(n_ctx * half);
        let mut sin = Vec::with_capacity(n_ctx * half);
        for p in 0..n_ctx {
            // The last span starting at or before `p` (the first starts at 0).
            let span = spans
                .iter()
                .rev()
                .find(|s| s.from_pos <= p)
                .unwrap_or(&spans[0]);
            for &f in &span.inv_freq {
                let angle = p as f32 * f;
                cos.push((angle as f64).cos() as f32 * factor);
                sin.push((angle as f64).sin() as f32 * factor);
            }
        }
        (cos, sin)
    }

    /// Check the scaling's parameters against the rotated width.
    pub fn validate(&self, rope_dim: usize) -> Result<(), String> {
        if !(self.theta.is_finite() && self.theta > 0.0) {
            return Err(format!("rope_theta = {} must be positive", self.theta));
        }
        let positive = |name: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("RoPE scaling `{name}` = {v} must be positive"))
            }
        };
        let factors = |name: &str, v: &[f32]| {
            if v.len() != rope_dim / 2 {
                return Err(format!(
                    "RoPE scaling `{name}` has {} entries, expected rope_dim / 2 = {}",
                    v.len(),
                    rope_dim / 2
                ));
            }
            v.iter().try_for_each(|&x| positive(name, x))
        };
        match &self.scaling {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } => positive("factor", *factor),
            RopeScaling::FreqFactors(d) => factors("rope_freqs", d),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("high_freq_factor", *high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err("RoPE scaling needs high_freq_factor > low_freq_factor".into());
                }
                if *original_max_position_embeddings == 0 {
                    return Err("RoPE scaling `original_max_position_embeddings` is 0".into());
                }
                Ok(())
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            } => {
                factors("short_factor", short_factor)?;
                factors("long_factor", long_factor)?;
                positive("attention_factor", *attention_factor)?;
                if *original_max_position_embeddings == 0 {
                    return Err("RoPE scaling `original_max_position_embeddings` is 0".into());
                }
                Ok(())
            }
        }
    }
}

/// LongRoPE's default cos/sin factor: `√(1 + ln(max / original) / ln(original))`, 1 when the
/// context is not extended.
pub fn longrope_attention_factor(max_position_embeddings: usize, original: usize) -> f32 {
    let factor = max_position_embeddings as f64 / original as f64;
    if factor <= 1.0 || original <= 1 {
        1.0
    } else {
        (1.0 + factor.ln() / (original as f64).ln()).sqrt() as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_keeps_high_frequencies_and_divides_low_ones() {
        let r = RopeConfig {
            theta: 500_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
        };
        let plain = RopeConfig::plain(500_000.0).freqs(128)[0].inv_freq.clone();
        let scaled = &r.freqs(128)[0].inv_freq;
        assert_eq!(scaled[0], plain[0], "highest frequency untouched");
        assert_eq!(scaled[63], plain[63] / 8.0, "lowest frequency divided");
        // In between, monotone and bounded by the two.
        for i in 0..64 {
            assert!(scaled[i] <= plain[i] && scaled[i] >= plain[i] / 8.0);
        }
    }

    #[test]
    fn longrope_switches_factor_sets_at_the_original_length() {
        let r = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::LongRope {
                short_factor: vec![1.0, 2.0],
                long_factor: vec![4.0, 8.0],
                original_max_position_embeddings: 16,
                attention_factor: 1.2,
            },
        };
        let f = r.freqs(4);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].from_pos, 0);
        assert_eq!(f[1].from_pos, 16);
        assert_eq!(f[0].inv_freq[1], 1.0 / (2.0 * 100.0));
        assert_eq!(f[1].inv_freq[0], 1.0 / 4.0);
        assert!(r.validate(4).is_ok());
        assert!(r.validate(6).is_err(), "factor count must match rope_dim/2");
        assert!((longrope_attention_factor(65536, 4096) - 1.1547).abs() < 1e-3);
        assert_eq!(longrope_attention_factor(4096, 4096), 1.0);
    }
}
