//! Behaviour of `Sampler` seen from outside: determinism, greedy equivalences,
//! penalties, empirical distributions, config validation and broken logits.

use flowrt_sample::{SampleError, Sampler, SamplerConfig};

/// Plain temperature-1 sampling, no filters, no penalties.
fn plain(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplerConfig::greedy()
    }
}

/// Deterministic pseudo-random logits (xorshift), so tests need no RNG of their own.
fn logits(n: usize, salt: u64) -> Vec<f32> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

fn naive_argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for i in 1..xs.len() {
        if xs[i] > xs[best] {
            best = i;
        }
    }
    best as u32
}

fn softmax(xs: &[f32]) -> Vec<f64> {
    let max = xs.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let e: Vec<f64> = xs.iter().map(|&x| (x as f64 - max).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|v| v / z).collect()
}

fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut h = vec![0; logits.len()];
    for _ in 0..draws {
        h[s.sample(logits).unwrap() as usize] += 1;
    }
    h
}

/// Pearson chi-square of observed counts against expected probabilities (cells with
/// probability 0 must be empty).
fn chi_square(h: &[usize], p: &[f64]) -> f64 {
    let n: usize = h.iter().sum();
    let mut chi = 0.0;
    for (&o, &pi) in h.iter().zip(p) {
        if pi == 0.0 {
            assert_eq!(o, 0, "drew a token with probability 0");
            continue;
        }
        let e = pi * n as f64;
        chi += (o as f64 - e) * (o as f64 - e) / e;
    }
    chi
}

/// Runs `steps` sample+accept steps over varying logits.
fn run(s: &mut Sampler, steps: usize) -> Vec<u32> {
    (0..steps)
        .map(|i| {
            let t = s.sample(&logits(s.vocab_size(), i as u64)).unwrap();
            s.accept(t);
            t
        })
        .collect()
}

#[test]
fn same_seed_same_sequence_and_reset_replays() {
    let cfg = SamplerConfig {
        repeat_penalty: 1.3,
        seed: Some(42),
        ..SamplerConfig::default()
    };
    let a = run(&mut Sampler::new(cfg.clone(), 500).unwrap(), 200);
    let mut s = Sampler::new(cfg.clone(), 500).unwrap();
    assert_eq!(run(&mut s, 200), a);
    s.reset();
    assert_eq!(run(&mut s, 200), a, "reset must replay from the seed");
    let other = run(
        &mut Sampler::new(
            SamplerConfig {
                seed: Some(43),
                ..cfg
            },
            500,
        )
        .unwrap(),
        200,
    );
    assert_ne!(
        other, a,
        "a different seed should give a different sequence"
    );
}

#[test]
fn unseeded_sampler_records_a_replayable_seed() {
    let cfg = SamplerConfig {
        seed: None,
        ..plain(0)
    };
    let mut s = Sampler::new(cfg.clone(), 300).unwrap();
    let a = run(&mut s, 100);
    let replay = SamplerConfig {
        seed: Some(s.seed()),
        ..cfg
    };
    assert_eq!(run(&mut Sampler::new(replay, 300).unwrap(), 100), a);
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    let mut s = Sampler::new(SamplerConfig::greedy(), 1000).unwrap();
    for salt in 0..20 {
        let l = logits(1000, salt);
        assert_eq!(s.sample(&l).unwrap(), naive_argmax(&l));
    }
    let mut s = Sampler::new(SamplerConfig::greedy(), 5).unwrap();
    assert_eq!(s.sample(&[1.0, 3.0, 2.0, 3.0, 3.0]).unwrap(), 1);
}

#[test]
fn top_k_1_and_tiny_top_p_and_min_p_1_are_greedy() {
    let variants = [
        SamplerConfig {
            top_k: 1,
            ..plain(7)
        },
        SamplerConfig {
            top_p: 1e-6,
            ..plain(7)
        },
        SamplerConfig {
            min_p: 1.0,
            ..plain(7)
        },
    ];
    for cfg in variants {
        let mut s = Sampler::new(cfg.clone(), 2000).unwrap();
        for salt in 0..50 {
            let l = logits(2000, salt);
            assert_eq!(s.sample(&l).unwrap(), naive_argmax(&l), "{cfg:?}");
        }
    }
    // Ties: top_k 1 and tiny top_p take the lowest id, like greedy.
    let tied = [0.0, 5.0, 1.0, 5.0];
    for cfg in [
        SamplerConfig {
            top_k: 1,
            ..plain(3)
        },
        SamplerConfig {
            top_p: 1e-6,
            ..plain(3)
        },
    ] {
        let mut s = Sampler::new(cfg, 4).unwrap();
        assert!((0..200).all(|_| s.sample(&tied).unwrap() == 1));
    }
}

#[test]
fn min_p_1_keeps_every_tied_maximum_and_nothing_else() {
    let mut s = Sampler::new(
        SamplerConfig {
            min_p: 1.0,
            ..plain(5)
        },
        4,
    )
    .unwrap();
    let h = histogram(&mut s, &[2.0, 5.0, 4.999, 5.0], 2000);
    assert_eq!(h[0] + h[2], 0);
    assert!(h[1] > 800 && h[3] > 800, "{h:?}");
}

#[test]
fn temperature_1_matches_softmax() {
    let l = [1.0, 2.0, 0.5, 3.0, -1.0, 2.5];
    let p = softmax(&l);
    for seed in [1, 2, 3] {
        let h = histogram(&mut Sampler::new(plain(seed), l.len()).unwrap(), &l, 20_000);
        // 5 degrees of freedom: P(chi2 > 20.5) ≈ 0.001 for a correct sampler.
        let chi = chi_square(&h, &p);
        assert!(
            chi < 20.5,
            "seed {seed}: chi2 {chi:.2}, counts {h:?}, p {p:?}"
        );
    }
}

#[test]
fn temperature_scales_logits_before_softmax() {
    let l = [1.0, 2.0, 0.5, 3.0];
    let cfg = SamplerConfig {
        temperature: 0.5,
        ..plain(11)
    };
    let scaled: Vec<f32> = l.iter().map(|x| x / 0.5).collect();
    let h = histogram(&mut Sampler::new(cfg, 4).unwrap(), &l, 20_000);
    let chi = chi_square(&h, &softmax(&scaled));
    assert!(chi < 16.3, "chi2 {chi:.2} (3 dof), counts {h:?}");
}

#[test]
fn top_k_2_draws_only_the_two_best_in_their_ratio() {
    let l = [1.0, 2.0, 0.5, 3.0, -1.0, 2.5];
    let cfg = SamplerConfig {
        top_k: 2,
        ..plain(9)
    };
    let h = histogram(&mut Sampler::new(cfg, l.len()).unwrap(), &l, 20_000);
    // Renormalised over tokens 3 and 5 only.
    let mut p = vec![0.0; l.len()];
    let two = softmax(&[3.0, 2.5]);
    p[3] = two[0];
    p[5] = two[1];
    let chi = chi_square(&h, &p);
    assert!(chi < 10.9, "chi2 {chi:.2} (1 dof), counts {h:?}");
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_the_mass() {
    // Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two.
    let p = [0.5f64, 0.3, 0.15, 0.05];
    let l: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
    let cfg = SamplerConfig {
        top_p: 0.7,
        ..plain(13)
    };
    let h = histogram(&mut Sampler::new(cfg, 4).unwrap(), &l, 20_000);
    let chi = chi_square(&h, &[0.625, 0.375, 0.0, 0.0]);
    assert!(chi < 10.9, "chi2 {chi:.2}, counts {h:?}");
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative_logits() {
    let cfg = SamplerConfig {
        repeat_penalty: 2.0,
        repeat_last_n: 2,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(cfg, 3).unwrap();
    // Positive: 2.0 / 2 = 1.0 < 1.5.
    assert_eq!(s.sample(&[2.0, 1.5, 0.0]).unwrap(), 0);
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.5, 0.0]).unwrap(), 1);
    // Negative: -1.0 * 2 = -2.0 < -1.5.
    assert_eq!(s.sample(&[-1.0, -1.5, -9.0]).unwrap(), 1);
    // Once token 0 leaves the 2-token window it is no longer penalised.
    s.accept(2);
    s.accept(2);
    assert_eq!(s.sample(&[2.0, 1.5, 0.0]).unwrap(), 0);
}

#[test]
fn repeat_penalty_lowers_a_repeated_tokens_frequency() {
    let l = [1.0, 1.0, 1.0];
    let base = SamplerConfig {
        repeat_penalty: 1.0,
        ..plain(17)
    };
    let pen = SamplerConfig {
        repeat_penalty: 1.5,
        ..plain(17)
    };
    let mut a = Sampler::new(base, 3).unwrap();
    let mut b = Sampler::new(pen, 3).unwrap();
    a.accept(0);
    b.accept(0);
    let ha = histogram(&mut a, &l, 20_000);
    let hb = histogram(&mut b, &l, 20_000);
    // Penalised logit 1/1.5: expected share e^(2/3) / (e^(2/3) + 2e) ≈ 0.257 vs 1/3.
    let e = std::f64::consts::E;
    let share = (2.0f64 / 3.0).exp() / ((2.0f64 / 3.0).exp() + 2.0 * e);
    assert!(hb[0] < ha[0], "{hb:?} vs {ha:?}");
    let chi = chi_square(&hb, &[share, (1.0 - share) / 2.0, (1.0 - share) / 2.0]);
    assert!(chi < 13.9, "chi2 {chi:.2}, counts {hb:?}");
}

#[test]
fn presence_and_frequency_penalties_subtract() {
    let cfg = SamplerConfig {
        frequency_penalty: 0.3,
        presence_penalty: 0.0,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(cfg, 2).unwrap();
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 0); // 1.7 > 1.5
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 1); // 1.4 < 1.5
    let cfg = SamplerConfig {
        presence_penalty: 0.6,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(cfg, 2).unwrap();
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 1); // 1.4 < 1.5
}

#[test]
fn invalid_configs_name_the_parameter() {
    let ok = plain(0);
    let cases: Vec<(SamplerConfig, SampleError)> = vec![
        (
            SamplerConfig {
                temperature: -0.1,
                ..ok.clone()
            },
            SampleError::InvalidTemperature { value: -0.1 },
        ),
        (
            SamplerConfig {
                top_p: 0.0,
                ..ok.clone()
            },
            SampleError::InvalidTopP { value: 0.0 },
        ),
        (
            SamplerConfig {
                top_p: 1.5,
                ..ok.clone()
            },
            SampleError::InvalidTopP { value: 1.5 },
        ),
        (
            SamplerConfig {
                min_p: -0.5,
                ..ok.clone()
            },
            SampleError::InvalidMinP { value: -0.5 },
        ),
        (
            SamplerConfig {
                min_p: 1.01,
                ..ok.clone()
            },
            SampleError::InvalidMinP { value: 1.01 },
        ),
        (
            SamplerConfig {
                repeat_penalty: 0.0,
                ..ok.clone()
            },
            SampleError::InvalidRepeatPenalty { value: 0.0 },
        ),
        (
            SamplerConfig {
                repeat_last_n: usize::MAX,
                ..ok.clone()
            },
            SampleError::InvalidRepeatLastN {
                value: usize::MAX,
                max: 1 << 20,
            },
        ),
        (
            SamplerConfig {
                presence_penalty: f32::INFINITY,
                ..ok.clone()
            },
            SampleError::InvalidPresencePenalty {
                value: f32::INFINITY,
            },
        ),
        (
            SamplerConfig {
                frequency_penalty: f32::NEG_INFINITY,
                ..ok.clone()
            },
            SampleError::InvalidFrequencyPenalty {
                value: f32::NEG_INFINITY,
            },
        ),
    ];
    for (cfg, want) in cases {
        assert_eq!(cfg.validate(), Err(want.clone()));
        assert_eq!(Sampler::new(cfg, 10).unwrap_err(), want);
    }
    // NaN cannot be compared with ==, so match on the variant.
    let nan = |c: SamplerConfig| c.validate().unwrap_err();
    assert!(matches!(
        nan(SamplerConfig {
            temperature: f32::NAN,
            ..ok.clone()
        }),
        SampleError::InvalidTemperature { .. }
    ));
    assert!(matches!(
        nan(SamplerConfig {
            top_p: f32::NAN,
            ..ok.clone()
        }),
        SampleError::InvalidTopP { .. }
    ));
    assert!(matches!(
        nan(SamplerConfig {
            min_p: f32::NAN,
            ..ok.clone()
        }),
        SampleError::InvalidMinP { .. }
    ));
    assert!(matches!(
        nan(SamplerConfig {
            repeat_penalty: f32::NAN,
            ..ok.clone()
        }),
        SampleError::InvalidRepeatPenalty { .. }
    ));
    let msg = SampleError::InvalidTopP { value: 1.5 }.to_string();
    assert!(msg.contains("top_p") && msg.contains("1.5"), "{msg}");
    assert!(matches!(
        Sampler::new(ok.clone(), 0),
        Err(SampleError::InvalidVocabSize { value: 0, .. })
    ));
    assert!(SamplerConfig::default().validate().is_ok());
    assert!(SamplerConfig::greedy().validate().is_ok());
}

#[test]
fn non_finite_logits_are_skipped_and_all_non_finite_is_an_error() {
    let l = [
        f32::NAN,
        1.0,
        f32::INFINITY,
        0.5,
        f32::NAN,
        f32::NEG_INFINITY,
    ];
    let mut g = Sampler::new(SamplerConfig::greedy(), l.len()).unwrap();
    assert_eq!(g.sample(&l).unwrap(), 1);
    let mut s = Sampler::new(plain(21), l.len()).unwrap();
    let h = histogram(&mut s, &l, 5000);
    assert_eq!(h[0] + h[2] + h[4] + h[5], 0, "{h:?}");
    let mut full = Sampler::new(SamplerConfig::default(), l.len()).unwrap();
    for _ in 0..100 {
        let t = full.sample(&l).unwrap();
        assert!(t == 1 || t == 3);
    }

    let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    for cfg in [SamplerConfig::greedy(), plain(1), SamplerConfig::default()] {
        let mut s = Sampler::new(cfg, 3).unwrap();
        assert_eq!(s.sample(&bad), Err(SampleError::NoFiniteLogits));
    }
}

#[test]
fn wrong_logits_length_is_an_error() {
    let mut s = Sampler::new(plain(0), 4).unwrap();
    assert_eq!(
        s.sample(&[0.0; 3]),
        Err(SampleError::LogitsLength {
            got: 3,
            expected: 4
        })
    );
}

#[test]
fn tiny_temperature_does_not_produce_nan() {
    let cfg = SamplerConfig {
        temperature: 1e-40, // subnormal: 1/t overflows
        ..plain(4)
    };
    let mut s = Sampler::new(cfg, 1000).unwrap();
    for salt in 0..10 {
        let l = logits(1000, salt);
        assert_eq!(s.sample(&l).unwrap(), naive_argmax(&l));
    }
}

/// `logit_bias`: -100 bans the greedy token (the next best wins), +100 forces a token, a
/// bias shifts the whole distribution like an edited logit, and a token masked to -inf stays
/// out whatever its bias.
#[test]
fn logit_bias_bans_forces_and_shifts() {
    let l = logits(50, 7);
    let best = naive_argmax(&l);
    let mut rest = l.clone();
    rest[best as usize] = f32::NEG_INFINITY;
    let second = naive_argmax(&rest);
    let greedy = |bias: Vec<(u32, f32)>| {
        let cfg = SamplerConfig {
            logit_bias: bias,
            ..SamplerConfig::greedy()
        };
        Sampler::new(cfg, 50).unwrap().sample(&l).unwrap()
    };
    assert_eq!(greedy(vec![]), best);
    assert_eq!(greedy(vec![(best, -100.0)]), second);
    let worst = l
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0 as u32;
    assert_eq!(greedy(vec![(worst, 100.0)]), worst);

    // At temperature 1 a bias equals editing the logit: same seed, same draws.
    let mut edited = l.clone();
    edited[3] += 2.5;
    edited[9] -= 1.0;
    let biased = SamplerConfig {
        logit_bias: vec![(3, 2.5), (9, -1.0)],
        ..plain(11)
    };
    let mut a = Sampler::new(biased, 50).unwrap();
    let mut b = Sampler::new(plain(11), 50).unwrap();
    for _ in 0..200 {
        assert_eq!(a.sample(&l).unwrap(), b.sample(&edited).unwrap());
    }

    let mut masked = l.clone();
    masked[worst as usize] = f32::NEG_INFINITY;
    let cfg = SamplerConfig {
        logit_bias: vec![(worst, 100.0)],
        ..SamplerConfig::greedy()
    };
    assert_eq!(
        Sampler::new(cfg, 50).unwrap().sample(&masked).unwrap(),
        best
    );
}

#[test]
fn logit_bias_outside_the_vocabulary_or_not_finite_is_refused() {
    let cfg = SamplerConfig {
        logit_bias: vec![(1, 1.0), (50, -1.0)],
        ..SamplerConfig::greedy()
    };
    assert_eq!(
        Sampler::new(cfg, 50).unwrap_err(),
        SampleError::LogitBiasOutOfVocab {
            id: 50,
            vocab_size: 50
        }
    );
    let cfg = SamplerConfig {
        logit_bias: vec![(2, f32::NAN)],
        ..SamplerConfig::greedy()
    };
    assert!(matches!(
        Sampler::new(cfg, 50).unwrap_err(),
        SampleError::InvalidLogitBias { id: 2, .. }
    ));
}
