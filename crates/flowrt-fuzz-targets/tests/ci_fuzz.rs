//! CI's fuzzing on stable: each target through the coverage-blind mutation fuzzer
//! (`flowrt_fuzz_targets::fuzzer`) for `FLOWRT_CI_FUZZ_SECS` seconds (default 12), after
//! every seed and regression input once unmodified. A panic fails the test naming the target,
//! the panic and the saved input (`target/ci-fuzz-findings/TARGET-<hash>`); a hang ends the
//! process the same way. `FLOWRT_CI_FUZZ_REPLAY=FILE` replays one file instead (filter to its
//! target: `-- TARGET --exact`). See docs/fuzzing.md, "In CI".

use flowrt_fuzz_targets::fuzzer::{self, Config, REPLAY_ENV};
use flowrt_testkit::coverage;

fn fuzz(name: &str) {
    let target = fuzzer::target(name).expect("a known target");
    if let Some(path) = std::env::var_os(REPLAY_ENV) {
        fuzzer::replay(target, std::path::Path::new(&path));
        return;
    }
    let cfg = Config::from_env().unwrap_or_else(|e| panic!("{e}"));
    let report = fuzzer::run(target, &cfg).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", report.summary());
    coverage::ran(
        "fuzz",
        &format!(
            "{name} [stable mutation]: {} execs in {:.1} s, {} seeds, {} findings",
            report.execs,
            report.secs,
            report.seeds(),
            report.findings.len()
        ),
    );
    assert!(report.findings.is_empty(), "{}", report.failure_message());
}

#[test]
fn gguf_model() {
    fuzz("gguf_model");
}

#[test]
fn hf_dir() {
    fuzz("hf_dir");
}

#[test]
fn tokenizer() {
    fuzz("tokenizer");
}

#[test]
fn chat_template() {
    fuzz("chat_template");
}

#[test]
fn http_body() {
    fuzz("http_body");
}
