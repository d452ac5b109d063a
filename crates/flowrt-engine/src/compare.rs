//! Teacher-forced comparison of two models that share a tokenizer (a pack and its source, two
//! quantisations): the same token ids through both, KL(reference ‖ candidate) and top-1
//! agreement at every position. `flowrt pack`'s gate uses it.

use flowrt_text::{ChatMessage, ChatTemplate, Tokenizer};

use crate::error::EngineError;
use crate::session::Session;
use crate::verify::{Acc, VerifyReport};

/// Plain texts of the built-in prompt set.
pub const BUILTIN_TEXTS: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog. Meanwhile, in a small village by the sea, \
     the fishermen were mending their nets and talking about the weather.",
    "In mathematics, a prime number is a natural number greater than 1 that is not a product \
     of two smaller natural numbers. The first primes are 2, 3, 5, 7, 11 and 13.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
];

/// The chat conversation of the built-in prompt set (rendered with a model's template).
pub const BUILTIN_CHAT: &[(&str, &str)] = &[
    ("user", "What is the capital of France?"),
    ("assistant", "The capital of France is Paris."),
    ("user", "And what river runs through it?"),
];

/// [`BUILTIN_CHAT`] as messages.
pub fn builtin_chat() -> Vec<ChatMessage> {
    BUILTIN_CHAT
        .iter()
        .map(|(role, content)| ChatMessage::new(*role, *content))
        .collect()
}

/// The built-in prompt set as token ids: [`BUILTIN_TEXTS`] (with the tokenizer's special
/// tokens added), one chat conversation rendered with `template` when there is one, then
/// `extra` texts (one prompt each). Empty encodings are dropped.
pub fn builtin_prompts(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    extra: &[String],
) -> Result<Vec<Vec<u32>>, EngineError> {
    let mut out = Vec::new();
    for t in BUILTIN_TEXTS {
        out.push(tokenizer.encode(t, true, false)?);
    }
    if let Some(tmpl) = template {
        let text = tmpl.render(&builtin_chat(), true)?;
        out.push(tokenizer.encode(&text, false, true)?);
    }
    for t in extra {
        out.push(tokenizer.encode(t, true, false)?);
    }
    out.retain(|p| !p.is_empty());
    Ok(out)
}

/// Runs every prompt teacher-forced through `reference` and `candidate` and compares the
/// logits at every position (KL(reference ‖ candidate), top-1, largest logit difference).
/// Prompts longer than either session's context are cut to fit.
pub fn compare_models(
    reference: &mut Session,
    candidate: &mut Session,
    prompts: &[Vec<u32>],
) -> Result<VerifyReport, EngineError> {
    let vocab = reference.vocab_size();
    if candidate.vocab_size() != vocab {
        return Err(EngineError::Reference {
            path: Default::default(),
            reason: format!(
                "the models' vocabularies differ ({vocab} and {} logits)",
                candidate.vocab_size()
            ),
        });
    }
    let n_ctx = reference.n_ctx().min(candidate.n_ctx());
    let mut total = Acc::default();
    let mut reports = Vec::new();
    for (index, prompt) in prompts.iter().enumerate() {
        let tokens = &prompt[..prompt.len().min(n_ctx)];
        let mut ref_logits = Vec::with_capacity(tokens.len() * vocab);
        reference.reset();
        reference.feed_all_logits(tokens, &mut |_, rows| ref_logits.extend_from_slice(rows))?;
        let mut acc = Acc::default();
        candidate.reset();
        candidate.feed_all_logits(tokens, &mut |first, rows| {
            for (j, row) in rows.chunks_exact(vocab).enumerate() {
                let p = first + j;
                acc.add(&ref_logits[p * vocab..(p + 1) * vocab], row);
            }
        })?;
        reports.push(acc.report(index));
        total.merge(&acc);
    }
    let (top1, mean_kl) = total.ratio();
    Ok(VerifyReport {
        positions: total.positions,
        top1_agreement: top1,
        mean_kl,
        max_kl: total.max_kl,
        max_abs_logit_err: total.max_err,
        reference_dtype: "f32 (reference model)".into(),
        prompts: reports,
    })
}
