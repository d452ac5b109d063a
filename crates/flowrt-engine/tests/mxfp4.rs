//! MXFP4 weights (ggml type 39, gpt-oss's expert format) through a GGUF and the CPU backend's
//! matmuls: the llama-untied fixture's f32 GGUF with every layer matrix and the output matrix
//! quantised to MXFP4 (flowrt's quantiser, which writes gguf-py's bytes), against the same model
//! with those MXFP4 values dequantised back to f32, and against transformers' f32 logits.

mod common;

use flowrt_dtype::GgmlType;
use flowrt_engine::{verify, EngineOptions, KvPrecision, LoadedModel, Session};
use flowrt_gguf::write::GgufBuilder;
use flowrt_gguf::GgufFile;
use flowrt_kernels::{row_size, Kernels};

/// Writes two copies of `src`: the matrices in MXFP4, and the same values as f32.
fn write_variants(src: &GgufFile, mxfp4: &std::path::Path, dequant: &std::path::Path) -> usize {
    let (mut a, mut b) = (GgufBuilder::new(), GgufBuilder::new());
    for (k, v) in src.metadata() {
        if k != "general.alignment" {
            a.kv(k.clone(), v.clone());
            b.kv(k.clone(), v.clone());
        }
    }
    let kern = Kernels::scalar();
    let mut quantised = 0;
    for t in src.tensors() {
        let data = src.tensor_data(t);
        let matrix = t.dims.len() == 2
            && t.ggml_type == GgmlType::F32
            && (t.name.starts_with("blk.") || t.name == "output.weight")
            && t.dims[0] % 32 == 0;
        if !matrix {
            a.tensor(t.name.clone(), &t.dims, t.ggml_type, data.to_vec());
            b.tensor(t.name.clone(), &t.dims, t.ggml_type, data.to_vec());
            continue;
        }
        let x: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut q = vec![0u8; row_size(GgmlType::Mxfp4, x.len())];
        kern.quantize_row(GgmlType::Mxfp4, &x, &mut q);
        let mut y = vec![0f32; x.len()];
        kern.dequantize_row(GgmlType::Mxfp4, &q, &mut y);
        a.tensor(t.name.clone(), &t.dims, GgmlType::Mxfp4, q);
        b.tensor(
            t.name.clone(),
            &t.dims,
            GgmlType::F32,
            y.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        );
        quantised += 1;
    }
    std::fs::write(mxfp4, a.to_bytes()).unwrap();
    std::fs::write(dequant, b.to_bytes()).unwrap();
    quantised
}

/// Every position's logits for a few fixed prompts.
fn logits(m: &LoadedModel, kernels: &'static Kernels, prompts: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for p in prompts {
        let mut s = Session::new(
            m,
            &EngineOptions {
                threads: 2,
                kv: KvPrecision::F32,
                max_batch: 7,
                ..EngineOptions::default()
            }
            .with_option("kernels", kernels.name()),
        )
        .unwrap();
        let vocab = s.vocab_size();
        s.feed_all_logits(p, &mut |_, rows| {
            out.extend(rows.chunks_exact(vocab).map(|r| r.to_vec()))
        })
        .unwrap();
    }
    out
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// (top-1 agreement, mean KL(p || q), max |logit difference|) of `q` against reference `p`.
fn compare(p: &[Vec<f32>], q: &[Vec<f32>]) -> (f64, f64, f64) {
    assert_eq!(p.len(), q.len());
    let (mut same, mut kl, mut maxd) = (0usize, 0f64, 0f64);
    let argmax = |r: &[f32]| {
        r.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            )
            .0
    };
    for (a, b) in p.iter().zip(q) {
        same += usize::from(argmax(a) == argmax(b));
        let (la, lb) = (log_softmax(a), log_softmax(b));
        kl += la
            .iter()
            .zip(&lb)
            .map(|(x, y)| x.exp() * (x - y))
            .sum::<f64>();
        maxd = a
            .iter()
            .zip(b)
            .fold(maxd, |m, (x, y)| m.max((x - y).abs() as f64));
    }
    (same as f64 / p.len() as f64, kl / p.len() as f64, maxd)
}

#[test]
fn mxfp4_gguf_matches_its_dequantised_f32_and_transformers_within_bounds() {
    let dir = common::fixture("families/llama-untied");
    let src = GgufFile::open(dir.join("model-f32.gguf")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (
        tmp.path().join("mxfp4.gguf"),
        tmp.path().join("dequant.gguf"),
    );
    let n = write_variants(&src, &pa, &pb);
    assert_eq!(n, 3 * 7 + 1, "every layer matrix and the output");
    let a = LoadedModel::load(&pa).unwrap();
    let b = LoadedModel::load(&pb).unwrap();
    assert_eq!(
        a.model.layers[0].wq.as_ref().unwrap().dtype,
        GgmlType::Mxfp4
    );
    assert_eq!(b.model.layers[0].wq.as_ref().unwrap().dtype, GgmlType::F32);

    // Token ids spread over the vocabulary, three prompts of 40 (several batches of 7).
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|p| {
            (0..40u32)
                .map(|i| (i * 37 + p * 101 + 5) % 317 + 3)
                .collect()
        })
        .collect();
    let want = logits(&b, Kernels::detect(), &prompts);
    for kernels in [Kernels::detect(), Kernels::scalar()] {
        let got = logits(&a, kernels, &prompts);
        let (top1, kl, maxd) = compare(&want, &got);
        eprintln!(
            "mxfp4 vs its dequantised f32 ({}): top-1 {top1:.4}, mean KL {kl:.3e}, max |logit err| {maxd:.3e}",
            kernels.name()
        );
        // Measured: mean KL 4.8e-9 (avx512vnni), 4.4e-9 (scalar), max |logit err| 5.6e-4.
        // The only differences: Q16 activation rounding (16-bit, see flowrt_kernels::q16) and
        // summation order.
        assert_eq!(top1, 1.0, "{}: top-1 {top1}", kernels.name());
        assert!(kl <= 1e-8, "{}: mean KL {kl}", kernels.name());
        assert!(maxd <= 1e-3, "{}: max |logit err| {maxd}", kernels.name());
    }

    // Against transformers' f32 logits: MXFP4's rounding of random weights.
    let mut s = Session::new(
        &a,
        &EngineOptions {
            threads: 2,
            kv: KvPrecision::F32,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let r = verify(&mut s, &dir.join("ref.safetensors")).unwrap();
    eprintln!(
        "mxfp4 vs transformers f32: top-1 {:.4}, mean KL {:.3e}, max |err| {:.3e}",
        r.top1_agreement, r.mean_kl, r.max_abs_logit_err
    );
    // Measured: top-1 0.6733, mean KL 1.457e-1 (4-bit rounding of random weights).
    assert!(r.top1_agreement >= 0.6, "top-1 {}", r.top1_agreement);
    assert!(r.mean_kl <= 0.25, "mean KL {}", r.mean_kl);
}
