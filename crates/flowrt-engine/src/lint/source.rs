//! The checks against `--source`: RoPE, config, tokenizer ids on a built-in corpus, chat
//! template, BOS/EOS (against its `generation_config.json`).

use std::path::Path;

use super::{abbreviate, finding, Finding, TOKENIZER_CORPUS};
use crate::error::EngineError;
use crate::load::LoadedModel;

pub(super) fn against_source(
    model: &LoadedModel,
    source: &LoadedModel,
    source_dir: Option<&Path>,
) -> Result<Vec<Finding>, EngineError> {
    let (c, sc) = (&model.model.config, &source.model.config);
    let mut out = Vec::new();
    // RoPE.
    let mut rope = Vec::new();
    if c.rope.theta != sc.rope.theta {
        rope.push(format!("base {} (source {})", c.rope.theta, sc.rope.theta));
    }
    if c.rope.scaling != sc.rope.scaling {
        rope.push(format!(
            "scaling {:?} (source {:?})",
            c.rope.scaling, sc.rope.scaling
        ));
    }
    if c.rope_dim != sc.rope_dim {
        rope.push(format!(
            "rotated dimensions {} (source {})",
            c.rope_dim, sc.rope_dim
        ));
    }
    if c.arch.gguf_rope_pairing != sc.arch.gguf_rope_pairing
        && model.model.format != source.model.format
    {
        // Only GGUF files store a family-specific pairing; HF directories are always half-split.
        let gguf = if model.model.format == flowrt_model::ModelFormat::Gguf {
            c
        } else {
            sc
        };
        let hf = if std::ptr::eq(gguf, c) { sc } else { c };
        if gguf.arch.gguf_rope_pairing != hf.arch.gguf_rope_pairing {
            rope.push(format!(
                "the GGUF side's family `{}` stores {:?} pairing, the source family `{}` expects {:?}",
                gguf.arch.name, gguf.arch.gguf_rope_pairing, hf.arch.name, hf.arch.gguf_rope_pairing
            ));
        }
    }
    if !rope.is_empty() {
        out.push(finding(
            "rope-mismatch",
            format!("RoPE differs from the source: {}", rope.join("; ")),
            "positions are encoded differently: attention breaks, growing with distance".into(),
        ));
    }
    // Shape.
    let mut cfg = Vec::new();
    for (name, a, b) in [
        ("hidden_size", c.hidden_size, sc.hidden_size),
        (
            "intermediate_size",
            c.intermediate_size,
            sc.intermediate_size,
        ),
        (
            "num_hidden_layers",
            c.num_hidden_layers,
            sc.num_hidden_layers,
        ),
        (
            "num_attention_heads",
            c.num_attention_heads,
            sc.num_attention_heads,
        ),
        ("head_dim", c.head_dim, sc.head_dim),
        ("vocab_size", c.vocab_size, sc.vocab_size),
        (
            "max_position_embeddings",
            c.max_position_embeddings,
            sc.max_position_embeddings,
        ),
    ] {
        if a != b {
            cfg.push(format!("{name} {a} (source {b})"));
        }
    }
    if c.arch.name != sc.arch.name {
        cfg.push(format!(
            "family `{}` (source `{}`)",
            c.arch.name, sc.arch.name
        ));
    }
    if c.num_key_value_heads != sc.num_key_value_heads {
        cfg.push(format!(
            "num_key_value_heads {} (source {})",
            c.num_key_value_heads, sc.num_key_value_heads
        ));
    }
    if (c.rms_norm_eps - sc.rms_norm_eps).abs() > 1e-3 * sc.rms_norm_eps {
        cfg.push(format!(
            "rms_norm_eps {} (source {})",
            c.rms_norm_eps, sc.rms_norm_eps
        ));
    }
    if !cfg.is_empty() {
        out.push(finding(
            "config-mismatch",
            format!("the config differs from the source: {}", cfg.join("; ")),
            "a different architecture or shape than the source's; see the other findings for what each costs".into(),
        ));
    }
    // Tokenizer.
    let mut diffs = Vec::new();
    for text in TOKENIZER_CORPUS {
        let a = model.tokenizer.encode(text, true, false)?;
        let b = source.tokenizer.encode(text, true, false)?;
        if a != b {
            diffs.push(format!("{text:?}: {a:?} vs source {b:?}"));
        }
    }
    if !diffs.is_empty() {
        let mut f = finding(
            "tokenizer-mismatch",
            format!(
                "{} of {} corpus texts tokenize differently from the source: {}",
                diffs.len(),
                TOKENIZER_CORPUS.len(),
                abbreviate(&diffs)
            ),
            "the model sees token ids it was not trained on for these texts".into(),
        );
        f.measured = Some(serde_json::json!({
            "texts_differing": diffs.len(),
            "texts": TOKENIZER_CORPUS.len(),
        }));
        out.push(f);
    }
    // Chat template.
    let (t, st) = (
        model.template.as_ref().map(|t| t.source().trim()),
        source.template.as_ref().map(|t| t.source().trim()),
    );
    match (t, st) {
        (None, Some(_)) => out.push(finding(
            "chat-template",
            "the source has a chat template; the model has none".into(),
            "chat requests cannot be formatted as the model was trained".into(),
        )),
        (Some(a), Some(b)) if a != b => out.push(finding(
            "chat-template",
            "the chat template differs from the source's".into(),
            "chats are rendered differently from how the model was trained".into(),
        )),
        _ => {}
    }
    // Special tokens.
    let mut special = Vec::new();
    if model.tokenizer.bos() != source.tokenizer.bos() {
        special.push(format!(
            "BOS {:?} (source tokenizer {:?})",
            model.tokenizer.bos(),
            source.tokenizer.bos()
        ));
    }
    if let Some(gen) = source_dir.and_then(generation_config) {
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            match v {
                serde_json::Value::Number(n) => n.as_u64().map(|x| x as u32).into_iter().collect(),
                serde_json::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_u64().map(|x| x as u32))
                    .collect(),
                _ => Vec::new(),
            }
        };
        if let Some(bos) = gen.get("bos_token_id").map(ids).filter(|v| !v.is_empty()) {
            if model.tokenizer.bos().is_some_and(|b| !bos.contains(&b)) {
                special.push(format!(
                    "BOS {:?} not in generation_config.json's bos_token_id {bos:?}",
                    model.tokenizer.bos()
                ));
            }
        }
        if let Some(eos) = gen.get("eos_token_id").map(ids).filter(|v| !v.is_empty()) {
            let ours: Vec<u32> = [model.tokenizer.eos(), model.tokenizer.eot()]
                .into_iter()
                .flatten()
                .collect();
            if !ours.iter().any(|e| eos.contains(e)) {
                special.push(format!(
                    "EOS/EOT {ours:?} not in generation_config.json's eos_token_id {eos:?}"
                ));
            }
        }
    }
    if !special.is_empty() {
        out.push(finding(
            "special-tokens",
            format!(
                "special tokens differ from the source: {}",
                special.join("; ")
            ),
            "generation starts or stops on the wrong token (runaway or truncated answers)".into(),
        ));
    }
    Ok(out)
}

fn generation_config(dir: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("generation_config.json")).ok()?;
    serde_json::from_str(&text).ok()
}
