//! What a test covered on this host, reported where the run's summary can see it.
//!
//! Lines have the form `RAN <suite> [<arch>]: <what>` or
//! `NOT RUN <suite> [<arch>]: <what> (<why>)`, the arch being the one the test was built for
//! (the kernels' tests also run as aarch64 binaries under emulation). With
//! `FLOWRT_TEST_REPORT` set to a path, each line is appended to that file (one `write` of the
//! whole line in append mode, so concurrent tests do not interleave within a line); the line
//! is always printed to stderr as well.

use std::env::consts::ARCH;
use std::io::Write;

/// Environment variable naming the file coverage lines are appended to.
pub const REPORT_ENV: &str = "FLOWRT_TEST_REPORT";

/// Records that `what` ran in `suite`.
pub fn ran(suite: &str, what: &str) {
    emit(&format!("RAN {suite} [{ARCH}]: {what}"));
}

/// Records that `what` did not run in `suite`, and why.
pub fn not_run(suite: &str, what: &str, why: &str) {
    emit(&format!("NOT RUN {suite} [{ARCH}]: {what} ({why})"));
}

fn emit(line: &str) {
    eprintln!("{line}");
    let Some(path) = std::env::var_os(REPORT_ENV) else {
        return;
    };
    let mut buf = line.replace('\n', " ");
    buf.push('\n');
    let res = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(buf.as_bytes()));
    if let Err(e) = res {
        // A report that cannot be written must not pass unnoticed: the summary would then
        // claim less than what ran, or nothing at all.
        panic!(
            "{REPORT_ENV}={}: cannot append the coverage line: {e}",
            std::path::Path::new(&path).display()
        );
    }
}
