//! White-box checks of the sampler's stages against naive reference versions.

use super::*;
use proptest::prelude::*;

fn cfg(temperature: f32) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(1),
        ..SamplerConfig::greedy()
    }
}

proptest! {
    /// The count-based penalties over the ring buffer equal a direct computation over
    /// the last `repeat_last_n` accepted tokens.
    #[test]
    fn penalties_match_naive_window(
        logits in prop::collection::vec(-5.0f32..5.0, 1..40),
        history in prop::collection::vec(0u32..50, 0..80),
        window in 0usize..20,
        rp in 0.5f32..2.0,
        pp in -1.0f32..1.0,
        fp in -1.0f32..1.0,
    ) {
        let n = logits.len();
        let c = SamplerConfig {
            repeat_penalty: rp,
            presence_penalty: pp,
            frequency_penalty: fp,
            repeat_last_n: window,
            ..cfg(1.0)
        };
        let mut s = Sampler::new(c, n).unwrap();
        for &t in &history {
            s.accept(t);
        }
        s.penalized.copy_from_slice(&logits);
        s.apply_penalties();

        // Reference: out-of-vocabulary ids are ignored by accept, then the last `window`.
        let kept: Vec<u32> = history.iter().copied().filter(|&t| (t as usize) < n).collect();
        let recent = &kept[kept.len().saturating_sub(window)..];
        for (id, &l) in logits.iter().enumerate() {
            let count = recent.iter().filter(|&&t| t as usize == id).count();
            let want = if count == 0 || window == 0 || (rp == 1.0 && pp == 0.0 && fp == 0.0) {
                l
            } else {
                let l = if l <= 0.0 { l * rp } else { l / rp };
                l - (count as f32 * fp + pp)
            };
            prop_assert!((s.penalized[id] - want).abs() <= 1e-5, "id {id}: {} vs {want}", s.penalized[id]);
        }
        // Applying penalties must leave the counts as they were.
        let again = s.penalized.clone();
        s.penalized.copy_from_slice(&logits);
        s.apply_penalties();
        prop_assert_eq!(&s.penalized, &again);
    }

    /// top-k → temperature → top-p → min-p keep the set a full-sort reference keeps
    /// (up to float rounding at the exact top-p / min-p boundaries).
    #[test]
    fn filters_match_full_sort_reference(
        logits in prop::collection::vec(-4.0f32..4.0, 1..1500),
        top_k in 0usize..300,
        top_p in 0.01f32..=1.0,
        min_p in 0.0f32..0.5,
        temperature in 0.2f32..2.0,
    ) {
        let c = SamplerConfig { top_k, top_p, min_p, ..cfg(temperature) };
        let mut s = Sampler::new(c, logits.len()).unwrap();
        s.penalized.copy_from_slice(&logits);
        s.collect_candidates();
        s.top_k();
        s.softmax_weights();
        s.top_p();
        s.min_p();
        let mut got: Vec<u32> = s.candidates.iter().map(|c| c.id).collect();
        got.sort_unstable();

        // Reference with a full sort and f64 arithmetic.
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if top_k > 0 {
            order.truncate(top_k);
        }
        let max = logits[order[0]] as f64;
        let w: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] as f64 - max) / temperature as f64).exp())
            .collect();
        let total: f64 = w.iter().sum();
        let eps = 1e-5;
        let first_reaching = |target: f64| {
            let mut cum = 0.0;
            for (i, wi) in w.iter().enumerate() {
                cum += wi;
                if cum >= target {
                    return i + 1;
                }
            }
            w.len()
        };
        let (n_lo, n_hi) = if top_p < 1.0 {
            (
                first_reaching((top_p as f64 - eps) * total),
                first_reaching((top_p as f64 + eps) * total),
            )
        } else {
            (w.len(), w.len())
        };
        let rank: std::collections::HashMap<usize, usize> =
            order.iter().enumerate().map(|(r, &i)| (i, r)).collect();
        for &id in &got {
            let r = *rank.get(&(id as usize)).expect("kept a token top-k removed");
            prop_assert!(r < n_hi, "kept rank {r}, top-p allows at most {n_hi}");
            prop_assert!(w[r] >= min_p as f64 - eps, "kept weight {} below min_p {min_p}", w[r]);
        }
        for r in 0..n_lo {
            if w[r] >= min_p as f64 + eps {
                prop_assert!(got.binary_search(&(order[r] as u32)).is_ok(), "dropped rank {r}");
            }
        }
    }
}

#[test]
fn top_p_walks_past_the_first_chunk() {
    // 1000 equal logits: top_p 0.5 must keep exactly 500 (several doublings of the
    // sorted prefix), and the lowest ids because ties go to the lower id.
    let c = SamplerConfig {
        top_p: 0.5,
        ..cfg(1.0)
    };
    let mut s = Sampler::new(c, 1000).unwrap();
    s.penalized.fill(0.25);
    s.collect_candidates();
    s.softmax_weights();
    s.top_p();
    let mut ids: Vec<u32> = s.candidates.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..500).collect::<Vec<u32>>());
}
