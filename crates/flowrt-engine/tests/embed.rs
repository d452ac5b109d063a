//! Embeddings against sentence-transformers: the tiny random BERT (HF directory and its
//! llama.cpp-style GGUF), the tiny random Qwen3 decoder with last-token pooling, and the real
//! all-MiniLM-L6-v2 on a 107-text corpus (references from
//! `scripts/make_embedding_reference.py`, sentence-transformers 6.2 on torch, f32).

mod common;

use std::path::{Path, PathBuf};

use flowrt_engine::{
    BatchSession, EmbedOptions, Embedder, Embeddings, EngineError, EngineOptions, LoadedModel,
    Pooling,
};
use safetensors::SafeTensors;
use serde_json::Value;

/// A sentence-transformers reference: texts, token ids, truncation, and pooled vectors.
struct Reference {
    texts: Vec<String>,
    ids: Vec<Vec<u32>>,
    truncated: Vec<bool>,
    vectors: Vec<Vec<Vec<f32>>>,
}

fn read_reference(
    json: &Path,
    tensors: &Path,
    texts: Option<Vec<String>>,
    names: &[&str],
) -> Reference {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let texts = texts.unwrap_or_else(|| {
        meta["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect()
    });
    let ids = meta["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    let truncated = meta["truncated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    let bytes = std::fs::read(tensors).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let vectors = names
        .iter()
        .map(|name| {
            let t = st.tensor(name).unwrap();
            let dim = t.shape()[1];
            let vals: Vec<f32> = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            vals.chunks(dim).map(<[f32]>::to_vec).collect()
        })
        .collect();
    Reference {
        texts,
        ids,
        truncated,
        vectors,
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The smallest cosine between `got` and `want`, and where.
fn min_cosine(got: &Embeddings, want: &[Vec<f32>]) -> (f64, usize) {
    assert_eq!(got.vectors.len(), want.len());
    got.vectors
        .iter()
        .zip(want)
        .map(|(a, b)| cosine(a, b))
        .enumerate()
        .map(|(i, c)| (c, i))
        .fold((f64::INFINITY, 0), |m, x| if x.0 < m.0 { x } else { m })
}

fn engine() -> EngineOptions {
    EngineOptions {
        threads: 2,
        ..EngineOptions::default()
    }
}

fn embed_all(model: &LoadedModel, opts: &EmbedOptions, texts: &[String]) -> Embeddings {
    let mut e = Embedder::new(model, &engine(), opts).unwrap();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    e.embed(model, &refs, true).unwrap()
}

/// Token ids as the embedder feeds them (with sentence-transformers' truncation).
fn token_ids(model: &LoadedModel, texts: &[String]) -> Vec<Vec<u32>> {
    let e = Embedder::new(model, &engine(), &EmbedOptions::default()).unwrap();
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| e.tokenize(model, i, t, true).unwrap().0)
        .collect()
}

fn tiny(name: &str) -> PathBuf {
    common::fixture(&format!("embed/{name}"))
}

/// The tiny BERT: every pooling against sentence-transformers, token ids identical,
/// including the text longer than its max_seq_length (48) cut as sentence-transformers cuts.
#[test]
fn tiny_bert_matches_sentence_transformers() {
    let dir = tiny("tiny-bert");
    let r = read_reference(
        &dir.join("ref.json"),
        &dir.join("ref.safetensors"),
        None,
        &["mean", "cls", "last"],
    );
    let model = LoadedModel::load(&dir).unwrap();
    assert!(!model.generates());
    assert_eq!(token_ids(&model, &r.texts), r.ids);
    assert!(
        r.truncated.iter().any(|&t| t),
        "the reference has a truncated text"
    );
    for (k, pooling) in [Pooling::Mean, Pooling::Cls, Pooling::Last]
        .into_iter()
        .enumerate()
    {
        let opts = EmbedOptions {
            pooling: Some(pooling),
            ..EmbedOptions::default()
        };
        let got = embed_all(&model, &opts, &r.texts);
        assert_eq!(got.truncated, r.truncated);
        let (c, i) = min_cosine(&got, &r.vectors[k]);
        eprintln!("tiny-bert {pooling}: min cosine {c:.9} (text {i})");
        // Measured: mean 0.99999988, cls 0.99999982, last 0.99999988 (f16 KV cache).
        assert!(c >= 0.99999, "{pooling}: text {i} cosine {c}");
    }
}

/// The same weights as llama.cpp's `bert` GGUF (phantom-space vocab, pooling_type 1).
#[test]
fn tiny_bert_gguf_matches_sentence_transformers() {
    let dir = tiny("tiny-bert");
    let r = read_reference(
        &dir.join("ref.json"),
        &dir.join("ref.safetensors"),
        None,
        &["mean"],
    );
    let model = LoadedModel::load(&dir.join("model.gguf")).unwrap();
    let spec = model
        .embedding
        .clone()
        .expect("pooling_type declares the pooling");
    assert_eq!(spec.pooling, Pooling::Mean);
    // A GGUF has no max_seq_length: the model's 64 positions bound a text, so the
    // over-long reference text (cut at 48 by sentence-transformers) is left out here.
    let keep: Vec<usize> = (0..r.texts.len()).filter(|&i| !r.truncated[i]).collect();
    let texts: Vec<String> = keep.iter().map(|&i| r.texts[i].clone()).collect();
    let want: Vec<Vec<f32>> = keep.iter().map(|&i| r.vectors[0][i].clone()).collect();
    let ids: Vec<Vec<u32>> = keep.iter().map(|&i| r.ids[i].clone()).collect();
    assert_eq!(token_ids(&model, &texts), ids);
    let got = embed_all(&model, &EmbedOptions::default(), &texts);
    let (c, i) = min_cosine(&got, &want);
    eprintln!("tiny-bert GGUF: min cosine {c:.9} (text {i})");
    // Measured: 0.99999988.
    assert!(c >= 0.99999, "text {i} cosine {c}");
}

/// A decoder embedder (Qwen3-Embedding's shape): last-token pooling over the final norm, from
/// a directory whose tensors have no `model.` prefix.
#[test]
fn tiny_qwen3_last_token_matches_sentence_transformers() {
    let dir = tiny("tiny-qwen3");
    let r = read_reference(
        &dir.join("ref.json"),
        &dir.join("ref.safetensors"),
        None,
        &["last", "mean"],
    );
    let model = LoadedModel::load(&dir).unwrap();
    assert!(model.generates());
    assert_eq!(
        model.embedding.as_ref().map(|e| e.pooling),
        Some(Pooling::Last)
    );
    assert_eq!(token_ids(&model, &r.texts), r.ids);
    let got = embed_all(&model, &EmbedOptions::default(), &r.texts);
    let (c, i) = min_cosine(&got, &r.vectors[0]);
    eprintln!("tiny-qwen3 last: min cosine {c:.9} (text {i})");
    // Measured: 0.99999994.
    assert!(c >= 0.99999, "last: text {i} cosine {c}");
    let mean = EmbedOptions {
        pooling: Some(Pooling::Mean),
        ..EmbedOptions::default()
    };
    let got = embed_all(&model, &mean, &r.texts);
    let (c, i) = min_cosine(&got, &r.vectors[1]);
    eprintln!("tiny-qwen3 mean: min cosine {c:.9} (text {i})");
    assert!(c >= 0.99999, "mean: text {i} cosine {c}");
}

/// Texts batched together (several per forward pass, different lengths) give what each
/// gives alone, and small batch bounds still cover every text.
#[test]
fn batched_texts_equal_texts_alone() {
    let dir = tiny("tiny-bert");
    let r = read_reference(
        &dir.join("ref.json"),
        &dir.join("ref.safetensors"),
        None,
        &[],
    );
    let model = LoadedModel::load(&dir).unwrap();
    let together = embed_all(&model, &EmbedOptions::default(), &r.texts);
    let one_at_a_time = EmbedOptions {
        batch_seqs: 1,
        ..EmbedOptions::default()
    };
    let alone = embed_all(&model, &one_at_a_time, &r.texts);
    let tight = EmbedOptions {
        batch_tokens: 48,
        batch_seqs: 3,
        ..EmbedOptions::default()
    };
    let packed = embed_all(&model, &tight, &r.texts);
    for (i, ((a, b), c)) in together
        .vectors
        .iter()
        .zip(&alone.vectors)
        .zip(&packed.vectors)
        .enumerate()
    {
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let d2 = a
            .iter()
            .zip(c)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        if d > 0.0 || d2 > 0.0 {
            eprintln!("text {i}: batched vs alone {d:e}, vs packed {d2:e}");
        }
        // Measured: 0 (each row's arithmetic does not depend on its neighbours).
        assert!(d <= 1e-6 && d2 <= 1e-6, "text {i}: {d} {d2}");
    }
    assert_eq!(together.tokens, alone.tokens);
}

#[test]
fn over_long_texts_are_refused_unless_truncated() {
    let dir = tiny("tiny-bert");
    let model = LoadedModel::load(&dir).unwrap();
    let mut e = Embedder::new(&model, &engine(), &EmbedOptions::default()).unwrap();
    assert_eq!(e.max_tokens(), 48);
    let long = "word ".repeat(100);
    let err = e.embed(&model, &["short", &long], false).unwrap_err();
    match &err {
        EngineError::InputTooLong { index, tokens, max } => {
            assert_eq!((*index, *max), (1, 48));
            let full = model.tokenizer.encode(&long, true, true).unwrap().len();
            assert_eq!(*tokens, full, "{err}");
        }
        other => panic!("{other}"),
    }
    let out = e.embed(&model, &["short", &long], true).unwrap();
    assert_eq!(out.truncated, [false, true]);
    assert_eq!(out.tokens[1], 48);
    // The cut keeps [CLS] first and [SEP] last.
    let (ids, cut) = e.tokenize(&model, 1, &long, true).unwrap();
    assert!(cut);
    let cls = model.tokenizer.token_to_id("[CLS]").unwrap();
    let sep = model.tokenizer.token_to_id("[SEP]").unwrap();
    assert_eq!((ids[0], ids[47]), (cls, sep));
    // Token-id inputs are checked too.
    let err = e.embed_tokens(&[vec![cls; 49]]).unwrap_err();
    assert!(
        matches!(err, EngineError::InputTooLong { index: 0, .. }),
        "{err}"
    );
    let err = e.embed_tokens(&[vec![cls], vec![]]).unwrap_err();
    assert!(
        matches!(err, EngineError::BadInput { index: 1, .. }),
        "{err}"
    );
    let err = e.embed_tokens(&[vec![400]]).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
}

/// A decoder without a pooling definition is refused until one is named; an embedding-only
/// model cannot generate.
#[test]
fn no_pooling_no_guess_and_no_generation_from_an_encoder() {
    let chat = LoadedModel::load(&common::fixture("families/qwen3")).unwrap();
    assert!(chat.embedding.is_none());
    let err = Embedder::new(&chat, &engine(), &EmbedOptions::default())
        .err()
        .expect("no pooling declared");
    assert!(matches!(err, EngineError::NoPooling(_)), "{err}");
    assert!(err.to_string().contains("--pooling"), "{err}");
    let named = EmbedOptions {
        pooling: Some(Pooling::Last),
        ..EmbedOptions::default()
    };
    let mut e = Embedder::new(&chat, &engine(), &named).unwrap();
    let out = e.embed(&chat, &["hello there"], false).unwrap();
    let norm: f32 = out.vectors[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "normalised by default: {norm}");

    let bert = LoadedModel::load(&tiny("tiny-bert")).unwrap();
    let err = BatchSession::new(&bert, &engine(), 1)
        .err()
        .expect("refused");
    assert!(matches!(err, EngineError::EmbeddingOnly(_)), "{err}");
}

/// The Vulkan backend has none of BERT's ops: it says which, before touching a device.
#[test]
fn vulkan_refuses_an_encoder_naming_what_it_lacks() {
    let bert = LoadedModel::load(&tiny("tiny-bert")).unwrap();
    let opts = EngineOptions {
        backend: flowrt_engine::BackendKind::Vulkan,
        ..engine()
    };
    let err = Embedder::new(&bert, &opts, &EmbedOptions::default())
        .err()
        .expect("refused");
    let msg = err.to_string();
    for what in [
        "bidirectional attention",
        "LayerNorm",
        "learned position embeddings",
    ] {
        assert!(msg.contains(what), "{msg}");
    }
}

fn minilm() -> PathBuf {
    let Some(p) = std::env::var_os("FLOWRT_MINILM_DIR") else {
        panic!(
            "FLOWRT_MINILM_DIR is not set. Run the tests with scripts/test, or fetch the model with \
             `flowrt pull all-minilm:l6-v2` and point FLOWRT_MINILM_DIR at the directory it prints."
        )
    };
    let p = PathBuf::from(p);
    assert!(
        p.join("config.json").is_file(),
        "FLOWRT_MINILM_DIR={} is not a model directory",
        p.display()
    );
    p
}

/// all-MiniLM-L6-v2 on 107 texts (short, up to 256 tokens and two over it, unicode, code):
/// cosine to sentence-transformers >= 0.9999 for every text, token ids identical.
#[test]
fn minilm_matches_sentence_transformers_on_the_corpus() {
    let fix = common::fixture("embed");
    let corpus: Value =
        serde_json::from_str(&std::fs::read_to_string(fix.join("corpus.json")).unwrap()).unwrap();
    let texts: Vec<String> = corpus["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let r = read_reference(
        &fix.join("minilm.json"),
        &fix.join("minilm.safetensors"),
        Some(texts),
        &["embeddings"],
    );
    assert!(r.texts.len() >= 100);
    let model = LoadedModel::load(&minilm()).unwrap();
    assert_eq!(token_ids(&model, &r.texts), r.ids);
    let got = embed_all(&model, &EmbedOptions::default(), &r.texts);
    assert_eq!(got.truncated, r.truncated);
    let (c, i) = min_cosine(&got, &r.vectors[0]);
    eprintln!(
        "all-MiniLM-L6-v2: min cosine {c:.9} (text {i}) over {} texts",
        r.texts.len()
    );
    // Measured: 0.99999992 (f16 KV cache, avx512 kernels).
    assert!(c >= 0.9999, "text {i} ({:?}): cosine {c}", r.texts[i]);
}

/// A sentence-transformers module flowrt does not run (`Dense`) makes embedding fail, naming
/// it; the model itself still loads.
#[test]
fn an_unsupported_module_is_refused_by_name_when_embedding() {
    let src = tiny("tiny-bert");
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    std::fs::copy(
        src.join("1_Pooling/config.json"),
        dir.path().join("1_Pooling/config.json"),
    )
    .unwrap();
    let modules = r#"[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    ]"#;
    std::fs::write(dir.path().join("modules.json"), modules).unwrap();
    let model = LoadedModel::load(dir.path()).unwrap();
    let err = Embedder::new(&model, &engine(), &EmbedOptions::default())
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("sentence_transformers.models.Dense"),
        "{err}"
    );
}
