//! `flowrt_engine::diff`: per-layer divergence of two models on the tiny family fixtures.

mod common;

use std::path::Path;

use flowrt_engine::{diff, DiffOptions, DiffPrompt, DiffReport, LoadedModel};

fn load(p: &Path) -> LoadedModel {
    LoadedModel::load(p).unwrap_or_else(|e| panic!("loading {}: {e}", p.display()))
}

fn run(a: &Path, b: &Path) -> DiffReport {
    let opts = DiffOptions::default();
    diff(&load(a), &load(b), &DiffPrompt::builtin(), &opts).unwrap()
}

fn show(r: &DiffReport) -> String {
    r.layers
        .iter()
        .map(|l| {
            format!(
                "{:?}: cos {:.6}/{:.6} err {:.3e}/{:.3e}",
                l.layer, l.mean_cosine, l.min_cosine, l.mean_rel_err, l.max_rel_err
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_model_against_itself_does_not_diverge() {
    let dir = common::fixture("families/llama-untied");
    let r = run(&dir, &dir);
    eprintln!("{}", show(&r));
    assert_eq!(r.layers.len(), 4, "the embedding and 3 layers");
    assert_eq!(r.layers[0].layer, None);
    for (i, l) in r.layers[1..].iter().enumerate() {
        assert_eq!(l.layer, Some(i));
    }
    for l in &r.layers {
        assert!(l.positions > 50, "{l:?}");
        assert_eq!((l.min_cosine, l.max_rel_err), (1.0, 0.0), "{l:?}");
        assert!(!l.divergent);
    }
    assert_eq!(r.first_divergent, None);
    assert_eq!(r.top1_agreement, 1.0);
    assert_eq!(r.max_kl, 0.0);
}

#[test]
fn a_perturbed_layer_is_named_as_the_first_divergent_one() {
    for k in [1usize, 2] {
        let b = common::perturbed_copy(&format!("model.layers.{k}.mlp.down_proj.weight"), -1.0);
        let r = run(&common::fixture("families/llama-untied"), b.path());
        eprintln!("layer {k}:\n{}", show(&r));
        assert_eq!(r.first_divergent, Some(Some(k)), "{}", show(&r));
        for l in &r.layers[..=k] {
            // Before layer k nothing differs at all.
            assert_eq!(l.max_rel_err, 0.0, "{l:?}");
        }
        assert!(r.top1_agreement < 1.0);
    }
}

#[test]
fn f32_source_against_its_q4_1_gguf_diverges_a_little_and_more_with_depth() {
    let dir = common::fixture("families/llama-untied");
    let r = run(&dir, &dir.join("model-q4_1.gguf"));
    eprintln!(
        "{}\ntop1 {} mean_kl {:.3e}",
        show(&r),
        r.top1_agreement,
        r.mean_kl
    );
    assert_eq!(r.first_divergent, None, "{}", show(&r));
    for l in &r.layers {
        // Q4_1 of 64-wide random rows: about 8% at the embedding, growing by ~2% a layer.
        assert!(l.mean_rel_err > 0.02 && l.mean_rel_err < 0.2, "{l:?}");
        assert!(l.mean_cosine > 0.98, "{l:?}");
    }
    let errs: Vec<f64> = r.layers.iter().map(|l| l.mean_rel_err).collect();
    assert!(errs.windows(2).all(|w| w[1] > w[0]), "{errs:?}");
    // A random tiny model's flat distributions: top-1 ~70%, KL ~0.1.
    assert!(r.top1_agreement > 0.5 && r.mean_kl < 0.2, "{r:?}");
}

#[test]
fn models_that_cannot_be_compared_are_a_clear_error() {
    let untied = load(&common::fixture("families/llama-untied"));
    let opts = DiffOptions::default();
    let prompts = DiffPrompt::builtin();
    let err = |b: &str| {
        diff(&untied, &load(&common::fixture(b)), &prompts, &opts)
            .err()
            .unwrap_or_else(|| panic!("{b} was diffed"))
            .to_string()
    };
    let e = err("families/llama-42l");
    assert!(
        e.contains("decoder layers: A has 3, B has 42")
            && e.contains("hidden size: A has 64, B has 32"),
        "{e}"
    );
    let e = err("families/llama-tied");
    assert!(e.contains("decoder layers: A has 3, B has 2"), "{e}");
    let e = err("families/qwen2");
    assert!(
        e.contains("vocabulary") && e.contains("same tokenizer"),
        "{e}"
    );
}

/// What `diff` and calibration ask of a backend fails with a typed error naming the buffer and
/// the sizes: more rows than a batch holds, values that are not whole rows, or the logits.
#[test]
fn bad_activation_reads_and_writes_are_typed_errors() {
    use flowrt_dispatch::ProbeError;
    use flowrt_model::plan::Buf;
    let m = load(&common::fixture("families/llama-untied"));
    let opts = flowrt_engine::EngineOptions {
        max_batch: 4,
        ..Default::default()
    };
    let mut b = flowrt_backends::open(opts.backend, m.model.clone(), &opts.backend_settings(16, 1))
        .unwrap();
    let h = m.model.config.hidden_size;
    assert_eq!(b.read_activation(Buf::X, 2).unwrap().len(), 2 * h);
    match b.read_activation(Buf::X, 5) {
        Err(ProbeError::Rows {
            buf: Buf::X,
            rows: 5,
            max: 4,
            width,
        }) => assert_eq!(width, h),
        other => panic!("{other:?}"),
    }
    b.write_activation(Buf::X, &vec![0.5; 2 * h]).unwrap();
    for (buf, len) in [(Buf::X, h + 1), (Buf::X, 5 * h), (Buf::Logits, 0)] {
        match b.write_activation(buf, &vec![0.0; len]) {
            Err(ProbeError::Write {
                buf: got,
                len: l,
                max: 4,
                ..
            }) => {
                assert_eq!((got, l), (buf, len))
            }
            other => panic!("{buf:?} {len}: {other:?}"),
        }
    }
}
