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

/// The dense matrices of a llama layer.
const DENSE_ROLES: &[MatRole] = MatRole::IN_LAYER.split_at(7).0;

/// The f32 llama fixture and two prompts.
fn fixture_and_prompts() -> (LoadedModel, Vec<Vec<u32>>) {
    let m = LoadedModel::load(&common::fixture("families/llama-untied")).unwrap();
    let prompts = [
        "The quick brown fox jumps over the lazy dog.",
        "Importance weights come from the activations.",
    ]
    .iter()
    .map(|p| m.tokenizer.encode(p, false, true).unwrap())
    .collect();
    (m, prompts)
}

/// On the f32 llama fixture, layer 0's attention input is `rms_norm(embedding) * attn_norm`:
/// the Q, K and V statistics are its column sums of squares over every prompt token; gate
/// and up share an input too; every dense matmul of every layer is there, with one row per
/// token (the output projection: one per prompt, the last token's).
#[test]
fn input_stats_are_the_column_sums_of_squares_of_each_matmuls_input() {
    let (m, prompts) = fixture_and_prompts();
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
        for &role in DENSE_ROLES {
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

/// Two threads, an f32 cache and batches of 4 (several chunks per prompt).
fn layer_by_layer_options() -> EngineOptions {
    EngineOptions {
        threads: 2,
        kv: KvPrecision::F32,
        max_batch: 4,
        ..Default::default()
    }
}

/// `LayerByLayer` (pack's `--gptq --sequential`): with nothing replaced, every layer's
/// statistics are the one-pass run's (the output projection's over every position instead of
/// each prompt's last); a matrix replaced changes the statistics of the inputs downstream of
/// it (the attention output after Q/K/V, the next layers) and of nothing upstream; layers are
/// taken in order, and a replacement of the wrong size is refused.
#[test]
fn layer_by_layer_statistics_follow_the_replaced_matrices() {
    use flowrt_engine::LayerByLayer;
    let (m, prompts) = fixture_and_prompts();
    let opts = layer_by_layer_options();
    let once = input_stats(&m, &prompts, &opts, InputStatKind::Gram).unwrap();
    let c = &m.model.config;
    let close = |a: &[f64], b: &[f64], what: &str| {
        for (j, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1e-3),
                "{what} column {j}: {x} vs {y}"
            );
        }
    };
    let mut lbl = LayerByLayer::new(&m, &prompts, &opts, InputStatKind::Gram).unwrap();
    for l in 0..c.num_hidden_layers {
        for &role in DENSE_ROLES {
            let s = lbl
                .stat(Some(l), role)
                .unwrap()
                .expect("statistics")
                .clone();
            let o = stat(&once, Some(l), role);
            assert_eq!(s.rows, o.rows, "layer {l} {role:?}");
            close(&s.sum_sq, &o.sum_sq, &format!("layer {l} {role:?}"));
        }
    }
    let tokens: u64 = prompts.iter().map(|p| p.len() as u64).sum();
    assert_eq!(lbl.tokens(), tokens);
    let out = lbl.stat(None, MatRole::Output).unwrap().expect("output");
    assert_eq!(out.rows, tokens);
    // Asking for a layer already passed is an error.
    let err = lbl.stat(Some(0), MatRole::Q).unwrap_err().to_string();
    assert!(err.contains("in order"), "{err}");

    // Layer 0's Q, K and V quantised to Q4_0: their own input is unchanged, the attention
    // output's and everything after it move.
    let k = flowrt_kernels::Kernels::detect();
    let q4 = |role: MatRole| -> Vec<u8> {
        let w = m.model.matrix(Some(0), role).unwrap();
        let row = flowrt_kernels::row_size(flowrt_dtype::GgmlType::Q4_0, w.cols);
        let mut out = vec![0u8; w.rows * row];
        let mut f = vec![0f32; w.cols];
        for r in 0..w.rows {
            k.dequantize_row(
                w.dtype,
                &w.bytes()[r * w.row_bytes..][..w.row_bytes],
                &mut f,
            );
            k.quantize_row_weighted(
                flowrt_dtype::GgmlType::Q4_0,
                &f,
                None,
                &mut out[r * row..][..row],
            );
        }
        out
    };
    let mut lbl = LayerByLayer::new(&m, &prompts, &opts, InputStatKind::Gram).unwrap();
    let q_before = lbl.stat(Some(0), MatRole::Q).unwrap().unwrap().clone();
    let o_before = lbl.stat(Some(0), MatRole::O).unwrap().unwrap().clone();
    let bad = lbl.replace(
        Some(0),
        MatRole::Q,
        flowrt_dtype::GgmlType::Q4_0,
        vec![0u8; 18],
    );
    assert!(bad.unwrap_err().to_string().contains("bytes of q4_0"));
    for role in [MatRole::Q, MatRole::K, MatRole::V] {
        lbl.replace(Some(0), role, flowrt_dtype::GgmlType::Q4_0, q4(role))
            .unwrap();
    }
    let q_after = lbl.stat(Some(0), MatRole::Q).unwrap().unwrap().clone();
    assert_eq!(q_after.sum_sq, q_before.sum_sq);
    let o_after = lbl.stat(Some(0), MatRole::O).unwrap().unwrap().clone();
    assert_ne!(o_after.sum_sq, o_before.sum_sq);
    assert_ne!(
        o_after.sum_sq,
        stat(&once, Some(0), MatRole::O).sum_sq,
        "the attention output's input comes through the quantised Q/K/V"
    );
    let next = lbl.stat(Some(1), MatRole::Q).unwrap().unwrap().clone();
    let before = &stat(&once, Some(1), MatRole::Q).sum_sq;
    assert!(
        next.sum_sq
            .iter()
            .zip(before)
            .any(|(a, b)| (a - b).abs() > 1e-4 * b.abs()),
        "layer 1's input comes through layer 0 as replaced"
    );
}

/// `LayerByLayer::reference` (pack's `--asymmetric`): the source's own matrix inputs, row for
/// row beside the working path's [`InputStat::inputs`]. With nothing replaced the two are the
/// same for every matrix; once layer 0's Q/K/V are quantised the working path's inputs of the
/// attention output and of layer 1 move and the source's do not.
#[test]
fn reference_inputs_are_the_sources_own_path() {
    use flowrt_engine::LayerByLayer;
    let (m, prompts) = fixture_and_prompts();
    let opts = layer_by_layer_options();
    let c = &m.model.config;
    let tokens: usize = prompts.iter().map(Vec::len).sum();
    let mut lbl = LayerByLayer::new(&m, &prompts, &opts, InputStatKind::Inputs).unwrap();
    let mut plain = Vec::new();
    for l in 0..c.num_hidden_layers {
        for &role in DENSE_ROLES {
            let s = lbl
                .stat(Some(l), role)
                .unwrap()
                .expect("statistics")
                .clone();
            let rows = s.inputs.clone().expect("the input rows");
            let n = s.sum_sq.len();
            assert_eq!(rows.len(), tokens * n, "layer {l} {role:?}");
            // The rows are the ones summed.
            for (j, want) in s.sum_sq.iter().enumerate() {
                let got: f64 = rows.chunks(n).map(|r| r[j] as f64 * r[j] as f64).sum();
                assert!(
                    (got - want).abs() <= 1e-5 * want.max(1e-3),
                    "layer {l} {role:?} {j}"
                );
            }
            let src = lbl
                .reference(Some(l), role)
                .unwrap()
                .expect("the source's rows");
            assert_eq!(*src, *rows, "layer {l} {role:?}: nothing replaced");
            plain.push(((l, role), rows));
        }
    }
    let out = lbl
        .reference(None, MatRole::Output)
        .unwrap()
        .expect("output");
    assert_eq!(out.len(), tokens * c.hidden_size);
    assert!(lbl
        .reference(Some(0), MatRole::Q)
        .unwrap_err()
        .to_string()
        .contains("in order"));
    let rows_of = |l: usize, role: MatRole| {
        plain
            .iter()
            .find(|(k, _)| *k == (l, role))
            .map(|(_, r)| r.clone())
            .unwrap()
    };

    let mut lbl = LayerByLayer::new(&m, &prompts, &opts, InputStatKind::Inputs).unwrap();
    for role in [MatRole::Q, MatRole::K, MatRole::V] {
        let w = m.model.matrix(Some(0), role).unwrap();
        // Every weight halved: a large, exact change.
        let mut f = vec![0f32; w.rows * w.cols];
        let k = flowrt_kernels::Kernels::detect();
        for (r, row) in f.chunks_mut(w.cols).enumerate() {
            k.dequantize_row(w.dtype, &w.bytes()[r * w.row_bytes..][..w.row_bytes], row);
        }
        let bytes: Vec<u8> = f.iter().flat_map(|v| (v * 0.5).to_le_bytes()).collect();
        lbl.replace(Some(0), role, flowrt_dtype::GgmlType::F32, bytes)
            .unwrap();
    }
    let o = lbl.stat(Some(0), MatRole::O).unwrap().unwrap().clone();
    assert_ne!(*o.inputs.unwrap(), *rows_of(0, MatRole::O));
    assert_eq!(
        *lbl.reference(Some(0), MatRole::O).unwrap().unwrap(),
        *rows_of(0, MatRole::O)
    );
    let next = lbl.stat(Some(1), MatRole::Gate).unwrap().unwrap().clone();
    assert_ne!(*next.inputs.unwrap(), *rows_of(1, MatRole::Gate));
    assert_eq!(
        *lbl.reference(Some(1), MatRole::Gate).unwrap().unwrap(),
        *rows_of(1, MatRole::Gate)
    );

    // Without the rows asked for, no reference.
    let mut lbl = LayerByLayer::new(&m, &prompts, &opts, InputStatKind::Gram).unwrap();
    assert!(lbl.reference(Some(0), MatRole::Q).is_err());
}
