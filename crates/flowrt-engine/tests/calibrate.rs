//! `flowrt_engine::input_stats`: the matmul input statistics `flowrt pack` weighs its
//! Q4_0/Q4_1 search by, checked against the same sums computed from the weights directly.

mod common;

use flowrt_engine::{
    input_stats, EngineOptions, InputStat, InputStatKind, KvPrecision, LoadedModel,
};
use flowrt_model::plan::MatRole;

fn stat(stats: &[InputStat], layer: Option<usize>, role: MatRole) -> &InputStat {
    stats
        .iter()
        .find(|s| s.layer == layer && s.role == role)
        .unwrap_or_else(|| panic!("no statistics for {layer:?} {role:?}"))
}

/// On the f32 llama fixture, layer 0's attention input is `rms_norm(embedding) * attn_norm`:
/// the Q, K and V statistics are its column sums of squares over every prompt token; gate
/// and up share an input too; every dense matmul of every layer is there, with one row per
/// token (the output projection: one per prompt, the last token's).
#[test]
fn input_stats_are_the_column_sums_of_squares_of_each_matmuls_input() {
    let m = LoadedModel::load(&common::fixture("families/llama-untied")).unwrap();
    let prompts: Vec<Vec<u32>> = [
        "The quick brown fox jumps over the lazy dog.",
        "Importance weights come from the activations.",
    ]
    .iter()
    .map(|p| m.tokenizer.encode(p, false, true).unwrap())
    .collect();
    let opts = EngineOptions {
        threads: 2,
        kv: KvPrecision::F32,
        ..Default::default()
    };
    let stats = input_stats(&m, &prompts, &opts, InputStatKind::Gram).unwrap();
    let tokens: u64 = prompts.iter().map(|p| p.len() as u64).sum();
    let c = &m.model.config;
    let h = c.hidden_size;
    for l in 0..c.num_hidden_layers {
        for role in [
            MatRole::Q,
            MatRole::K,
            MatRole::V,
            MatRole::O,
            MatRole::Gate,
            MatRole::Up,
            MatRole::Down,
        ] {
            let s = stat(&stats, Some(l), role);
            assert_eq!(s.rows, tokens, "layer {l} {role:?}");
            assert!(s.sum_sq.iter().all(|v| v.is_finite() && *v >= 0.0));
            assert!(s.sum_sq.iter().any(|v| *v > 0.0), "layer {l} {role:?}");
        }
        let q = stat(&stats, Some(l), MatRole::Q);
        assert_eq!(q.sum_sq, stat(&stats, Some(l), MatRole::K).sum_sq);
        assert_eq!(q.sum_sq, stat(&stats, Some(l), MatRole::V).sum_sq);
        let g = stat(&stats, Some(l), MatRole::Gate);
        assert_eq!(g.sum_sq, stat(&stats, Some(l), MatRole::Up).sum_sq);
        assert_eq!(
            stat(&stats, Some(l), MatRole::Down).sum_sq.len(),
            c.intermediate_size
        );
    }
    assert_eq!(
        stat(&stats, None, MatRole::Output).rows,
        prompts.len() as u64
    );

    // Layer 0's attention input from the weights: the embedding rows, RMS-normalised.
    let emb = &m.model.token_embd;
    assert_eq!(emb.dtype, flowrt_dtype::GgmlType::F32);
    let norm = &m.model.layers[0].attn_norm;
    let mut want = vec![0f64; h];
    let mut want_gram = vec![0f64; h * h];
    for &t in prompts.iter().flatten() {
        let row: Vec<f32> = emb.bytes()[t as usize * emb.row_bytes..][..h * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + c.rms_norm_eps as f64).sqrt();
        let x: Vec<f64> = (0..h)
            .map(|j| row[j] as f64 * inv * norm[j] as f64)
            .collect();
        for i in 0..h {
            want[i] += x[i] * x[i];
            for j in 0..h {
                want_gram[i * h + j] += x[i] * x[j];
            }
        }
    }
    let got = &stat(&stats, Some(0), MatRole::Q).sum_sq;
    for (j, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1e-3),
            "column {j}: {g} vs {w}"
        );
    }
    // The second moments of the same input: symmetric, its diagonal the sums of squares,
    // one matrix shared by Q, K and V (and by gate and up).
    let gram = stat(&stats, Some(0), MatRole::Q)
        .gram
        .as_ref()
        .expect("gram");
    assert_eq!(gram.len(), h * h);
    for (k, (g, w)) in gram.iter().zip(&want_gram).enumerate() {
        let scale = (want[k / h] * want[k % h]).sqrt().max(1e-3);
        assert!(
            (*g as f64 - w).abs() <= 1e-4 * scale,
            "gram {},{}: {g} vs {w}",
            k / h,
            k % h
        );
    }
    for l in 0..c.num_hidden_layers {
        let g = |r| stat(&stats, Some(l), r).gram.clone().expect("gram");
        assert!(std::sync::Arc::ptr_eq(&g(MatRole::Q), &g(MatRole::V)));
        assert!(std::sync::Arc::ptr_eq(&g(MatRole::Gate), &g(MatRole::Up)));
        assert!(!std::sync::Arc::ptr_eq(&g(MatRole::Q), &g(MatRole::O)));
        assert_eq!(g(MatRole::Down).len(), c.intermediate_size.pow(2));
    }
    // Without asking for them, no second moments.
    let plain = input_stats(&m, &prompts, &opts, InputStatKind::SumSquares).unwrap();
    assert!(plain.iter().all(|s| s.gram.is_none()));
    assert_eq!(stat(&plain, Some(0), MatRole::Q).sum_sq, *got);
}
