//! The attention scale of Gemma GGUF files without `attention.scale`: llama.cpp's converter
//! drops `query_pre_attn_scalar`, which is head_dim for every published size but the 27Bs
//! (hidden/heads), and its loader tells those by their layer count. flowrt must read such a
//! file as llama.cpp does.

use flowrt_gguf::write::GgufBuilder;
use flowrt_gguf::GgufFile;
use flowrt_model::ModelConfig;

/// The metadata of a Gemma GGUF (`arch`) with `layers` layers, hidden 64, 4 heads of
/// head_dim 32 (hidden/heads = 16), and optionally `attention.scale`.
fn config(arch: &str, layers: u32, scale: Option<f32>) -> ModelConfig {
    let k = |s: &str| format!("{arch}.{s}");
    let mut b = GgufBuilder::new();
    b.kv("general.architecture", arch)
        .kv(k("block_count"), layers)
        .kv(k("embedding_length"), 64u32)
        .kv(k("feed_forward_length"), 128u32)
        .kv(k("attention.head_count"), 4u32)
        .kv(k("attention.head_count_kv"), 2u32)
        .kv(k("attention.key_length"), 32u32)
        .kv(k("attention.value_length"), 32u32)
        .kv(k("attention.layer_norm_rms_epsilon"), 1e-6f32)
        .kv(k("attention.sliding_window"), 16u32)
        .kv(k("context_length"), 128u32)
        .kv(k("vocab_size"), 320u32)
        .kv("tokenizer.ggml.tokens", vec!["a"; 320]);
    if let Some(s) = scale {
        b.kv(k("attention.scale"), s);
    }
    let f = GgufFile::from_bytes(b.to_bytes()).unwrap();
    ModelConfig::from_gguf(&f).unwrap_or_else(|e| panic!("{arch} {layers}: {e}"))
}

#[test]
fn gemma_27b_gguf_scales_by_hidden_per_head() {
    let head_dim = 1.0 / 32f32.sqrt();
    let hidden_per_head = 1.0 / 16f32.sqrt();
    // Gemma 2: 46 layers is the 27B; Gemma 3: 62.
    for (arch, big) in [("gemma2", 46), ("gemma3", 62)] {
        assert_eq!(
            config(arch, big, None).attn_scale,
            hidden_per_head,
            "{arch}"
        );
        for other in [big - 1, big + 1, 26] {
            assert_eq!(
                config(arch, other, None).attn_scale,
                head_dim,
                "{arch} {other}"
            );
        }
        // A file that says its scale is read as it says.
        assert_eq!(config(arch, big, Some(0.125)).attn_scale, 0.125, "{arch}");
    }
}
