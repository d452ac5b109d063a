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
    /// YaRN (`rope_type: "yarn"`): frequencies below the `beta_slow` rotation count (over
    /// `original_max_position_embeddings` positions) divided by `factor`, those above
    /// `beta_fast` kept, a linear ramp over the dimensions in between, and cos/sin scaled by
    /// `attention_factor` (see [`yarn_attention_factor`]). The same frequencies at every
    /// position, so a KV cache follows the reference exactly.
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// Round the ramp's ends outwards to whole dimensions (transformers' default, and what
        /// llama.cpp always does).
        truncate: bool,
        attention_factor: f32,
    },
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
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                // The ramp's ends in f64 (Python floats in the reference), the blend in f32.
                let (low, high) = yarn_correction_range(
                    *beta_fast as f64,
                    *beta_slow as f64,
                    rope_dim,
                    self.theta as f64,
                    *original_max_position_embeddings,
                    *truncate,
                );
                let high = if low == high { high + 0.001 } else { high };
                let (low32, width) = (low as f32, (high - low) as f32);
                let inv = (0..half)
                    .map(|i| {
                        let ramp = ((i as f32 - low32) / width).clamp(0.0, 1.0);
                        // Share of the extrapolated (unscaled) frequency.
                        let extrapolation = 1.0 - ramp;
                        let pos = pow(i);
                        let interpolated = 1.0 / (factor * pos);
                        let extrapolated = 1.0 / pos;
                        interpolated * (1.0 - extrapolation) + extrapolated * extrapolation
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

    /// Factor cos and sin are multiplied by (1 except for LongRoPE and YaRN).
    pub fn attention_factor(&self) -> f32 {
        match self.scaling {
            RopeScaling::LongRope {
                attention_factor, ..
            }
            | RopeScaling::Yarn {
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
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                ..
            } => {
                positive("factor", *factor)?;
                positive("beta_fast", *beta_fast)?;
                positive("beta_slow", *beta_slow)?;
                positive("attention_factor", *attention_factor)?;
                if beta_fast < beta_slow {
                    return Err(format!(
                        "RoPE scaling `beta_fast` = {beta_fast} is below `beta_slow` = {beta_slow}"
                    ));
                }
                if *original_max_position_embeddings < 2 {
                    return Err(format!(
                        "RoPE scaling `original_max_position_embeddings` = \
                         {original_max_position_embeddings} must be at least 2"
                    ));
                }
                if rope_dim < 2 {
                    return Err(format!("YaRN needs rope_dim >= 2, got {rope_dim}"));
                }
                Ok(())
            }
        }
    }
}

/// YaRN's ramp ends (dimension indices, as transformers' `find_correction_range`): the
/// dimensions that turn `beta_fast` and `beta_slow` times over `original` positions, rounded
/// outwards when `truncate`, clamped to `[0, dim - 1]`. In f64, as Python computes them.
fn yarn_correction_range(
    beta_fast: f64,
    beta_slow: f64,
    dim: usize,
    base: f64,
    original: usize,
    truncate: bool,
) -> (f64, f64) {
    let dim_for = |rotations: f64| {
        (dim as f64 * (original as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (dim_for(beta_fast), dim_for(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    (low.max(0.0), high.min(dim as f64 - 1.0))
}

/// YaRN's default cos/sin factor as transformers computes it: `mscale(factor, mscale) /
/// mscale(factor, mscale_all_dim)` when both are given and non-zero, `mscale(factor, 1)`
/// otherwise, with `mscale(s, m) = 0.1 m ln(s) + 1` (1 for `s <= 1`). llama.cpp's default for
/// a GGUF without `rope.scaling.yarn_attn_factor` is the same `0.1 ln(factor) + 1`.
pub fn yarn_attention_factor(factor: f64, mscale: Option<f64>, mscale_all_dim: Option<f64>) -> f32 {
    let get = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    match (mscale, mscale_all_dim) {
        (Some(m), Some(a)) if m != 0.0 && a != 0.0 => (get(m) / get(a)) as f32,
        _ => get(1.0) as f32,
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

    fn yarn(theta: f32, factor: f32, orig: usize) -> RopeConfig {
        RopeConfig {
            theta,
            scaling: RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: orig,
                beta_fast: 32.0,
                beta_slow: 1.0,
                truncate: true,
                attention_factor: yarn_attention_factor(factor as f64, None, None),
            },
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    // Reference values: transformers 5.24 `_compute_yarn_parameters` on a `Qwen3Config` with
    // the given `rope_parameters` (/work/venv-ref, torch CPU), inv_freq printed as f32 bits.
    #[test]
    fn yarn_matches_transformers_bit_for_bit() {
        // rope_theta 10, head_dim 16, factor 4, original 16 (the qwen3-yarn fixture): ramp
        // from dimension 0 to 4, so dimension 0 is kept, 1..3 blended, 4..7 divided by 4.
        let r = yarn(10.0, 4.0, 16);
        let want: [u32; 8] = [
            0x3f800000, 0x3f1bfa5e, 0x3eb3f300, 0x3e3ceb88, 0x3da1e89b, 0x3d72d423, 0x3d361887,
            0x3d088d77,
        ];
        assert_eq!(bits(&r.freqs(16)[0].inv_freq), want);
        // attention_factor 1.138629436111989 (0.1 ln 4 + 1), as f32.
        assert_eq!(r.attention_factor().to_bits(), 0x3f91be9c);
        assert!(r.validate(16).is_ok());

        // truncate false, beta_fast 16, beta_slow 0.5, mscale 1, mscale_all_dim 0.5.
        let r = RopeConfig {
            theta: 10.0,
            scaling: RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 16,
                beta_fast: 16.0,
                beta_slow: 0.5,
                truncate: false,
                attention_factor: yarn_attention_factor(4.0, Some(1.0), Some(0.5)),
            },
        };
        let want: [u32; 8] = [
            0x3f800000, 0x3f268407, 0x3ed38eda, 0x3e8203cf, 0x3e180dd4, 0x3da3a58f, 0x3d361887,
            0x3d088d77,
        ];
        assert_eq!(bits(&r.freqs(16)[0].inv_freq), want);
        // 1.0648216253695715 in the reference.
        assert_eq!(r.attention_factor().to_bits(), 0x3f884c13);

        // Qwen3's published YaRN recipe: theta 1e6, head_dim 128, factor 4, original 32768
        // (ramp over dimensions 23..40).
        let r = yarn(1_000_000.0, 4.0, 32768);
        let want: [u32; 64] = [
            0x3f800000, 0x3f4e4bad, 0x3f263de0, 0x3f05f6ef, 0x3ed7e89b, 0x3eadfcff, 0x3e8c3504,
            0x3e61f835, 0x3e361887, 0x3e12bd91, 0x3dec7fd6, 0x3dbe94c6, 0x3d99940d, 0x3d778513,
            0x3d47763f, 0x3d20bc1d, 0x3d0186e3, 0x3cd0c1a8, 0x3ca8398b, 0x3c879008, 0x3c5a7bf2,
            0x3c301052, 0x3c0de12d, 0x3be4aa46, 0x3bb02377, 0x3b876388, 0x3b4fa550, 0x3b1ed248,
            0x3af241df, 0x3ab82bc0, 0x3a8b8207, 0x3a527db8, 0x3a1e0eb2, 0x39ec1968, 0x39af3d02,
            0x39811c3e, 0x393c93be, 0x39083e38, 0x38c23e9a, 0x38881d0a, 0x383a7753, 0x38164324,
            0x37f22ce2, 0x37c327b5, 0x379d43a4, 0x377d75d4, 0x374c3fbe, 0x372497ab, 0x3704a2b2,
            0x36d5c441, 0x36ac431d, 0x368ad0ed, 0x365fba4f, 0x36344a0e, 0x361148e3, 0x35ea2732,
            0x35bcb0c1, 0x35980e02, 0x35751070, 0x35457bab, 0x351f23e4, 0x35003dec, 0x34ceaf79,
            0x34a68e4c,
        ];
        // Equal but for dimension 37, one ulp apart: there Rust's `powf` and torch's vectorised
        // pow round 1e6^(74/128) differently (2942.7273 vs 2942.7271), as they do for plain
        // RoPE; the blend itself adds no difference.
        let got = bits(&r.freqs(128)[0].inv_freq);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                g.abs_diff(w) <= u32::from(i == 37),
                "dimension {i}: {g:#x} vs {w:#x}"
            );
        }
        // cos/sin carry the attention factor at every position.
        let (cos, _) = r.cos_sin_table(128, 2);
        assert_eq!(cos[0], r.attention_factor());
        assert_eq!(yarn_attention_factor(1.0, None, None), 1.0);
    }

    #[test]
    fn yarn_rejects_bad_parameters_by_name() {
        let with = |f: &dyn Fn(&mut RopeScaling)| {
            let mut r = yarn(10_000.0, 4.0, 16);
            f(&mut r.scaling);
            r.validate(16).unwrap_err()
        };
        let set = |name: &'static str, v: f32| {
            move |s: &mut RopeScaling| {
                if let RopeScaling::Yarn {
                    factor,
                    beta_fast,
                    beta_slow,
                    ..
                } = s
                {
                    match name {
                        "factor" => *factor = v,
                        "beta_fast" => *beta_fast = v,
                        _ => *beta_slow = v,
                    }
                }
            }
        };
        assert!(with(&set("factor", 0.0)).contains("`factor`"));
        assert!(with(&set("factor", -2.0)).contains("`factor`"));
        let e = with(&set("beta_fast", 0.5));
        assert!(
            e.contains("`beta_fast`") && e.contains("`beta_slow`"),
            "{e}"
        );
        let e = with(&|s: &mut RopeScaling| {
            if let RopeScaling::Yarn {
                original_max_position_embeddings,
                ..
            } = s
            {
                *original_max_position_embeddings = 0;
            }
        });
        assert!(e.contains("`original_max_position_embeddings`"), "{e}");
    }
}
