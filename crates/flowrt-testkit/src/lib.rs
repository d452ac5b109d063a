//! Test support shared by flowrt's suites (a dev-dependency only; depends on nothing of
//! flowrt's, so every crate can use it).
//!
//! * [`coverage`]: a test that covers something only on some hosts (an instruction-set table,
//!   a model named by an environment variable) says what it ran and what it did NOT RUN and
//!   why. The line goes to stderr and, when `FLOWRT_TEST_REPORT` names a file, is appended to
//!   it; `scripts/test` sets that variable and prints the collected lines in its summary, so
//!   a green run shows what it covered.
//! * [`golden`]: the bounds every golden test (flowrt against HF transformers) asserts.
//! * [`models`]: the real models the suites run on, named by environment variables.

pub mod coverage;
pub mod golden;
pub mod models;

/// Peak resident memory (`VmHWM`) of process `pid` ("self" for this one), in KiB, from /proc.
pub fn peak_rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("reading /proc/PID/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}
