//! The process's resident memory, for reports: now and at its peak.
//!
//! Linux gives both in `/proc/self/status` (`VmRSS`, `VmHWM`, and the split of `VmRSS` into
//! anonymous and file-backed pages). Elsewhere they are reported as
//! not available (`None`) rather than estimated.

use serde::Serialize;

/// Resident set sizes of this process, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcMemory {
    /// Resident now (`VmRSS`).
    pub rss_bytes: Option<u64>,
    /// Highest resident size so far (`VmHWM`, the high-water mark).
    pub peak_rss_bytes: Option<u64>,
    /// Of `rss_bytes`: anonymous memory (heap, stacks) (`RssAnon`).
    pub rss_anon_bytes: Option<u64>,
    /// Of `rss_bytes`: pages of mapped files, such as the model and the binary (`RssFile`).
    pub rss_file_bytes: Option<u64>,
}

impl ProcMemory {
    /// Read this process's figures; fields the platform does not give are `None`.
    pub fn now() -> ProcMemory {
        match std::fs::read_to_string("/proc/self/status") {
            Ok(text) => parse_proc_status(&text),
            Err(_) => ProcMemory::default(),
        }
    }
}

/// Parse the `VmRSS`, `VmHWM`, `RssAnon` and `RssFile` lines of a `/proc/<pid>/status` text (`VmHWM:\t  1234 kB`).
/// A missing or malformed line gives `None` for its field.
pub fn parse_proc_status(text: &str) -> ProcMemory {
    let field = |key: &str| bytes_field(text, key);
    ProcMemory {
        rss_bytes: field("VmRSS"),
        peak_rss_bytes: field("VmHWM"),
        rss_anon_bytes: field("RssAnon"),
        rss_file_bytes: field("RssFile"),
    }
}

/// The value of a `Key:  1234 kB` line of a `/proc` text in bytes (`None`: missing or
/// malformed).
fn bytes_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let mut words = rest.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        let unit = match words.next() {
            Some("kB") => 1024,
            Some("B") | None => 1,
            Some(_) => return None,
        };
        n.checked_mul(unit)
    })
}

/// The memory the system can still give without swapping (`MemAvailable` of
/// `/proc/meminfo`), in bytes; `None` where the platform does not say.
pub fn available_memory_bytes() -> Option<u64> {
    bytes_field(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rss_and_peak_from_proc_status() {
        let text = "Name:\tflowrt\nUmask:\t0022\nState:\tR (running)\nVmPeak:\t  912340 kB\n\
                    VmSize:\t  912340 kB\nVmHWM:\t  123456 kB\nVmRSS:\t  120000 kB\n\
                    RssAnon:\t   20000 kB\nRssFile:\t  100000 kB\nThreads:\t2\n";
        let m = parse_proc_status(text);
        assert_eq!(m.peak_rss_bytes, Some(123456 * 1024));
        assert_eq!(m.rss_bytes, Some(120000 * 1024));
        assert_eq!(m.rss_anon_bytes, Some(20000 * 1024));
        assert_eq!(m.rss_file_bytes, Some(100000 * 1024));
    }

    #[test]
    fn missing_or_malformed_lines_are_none() {
        let m = parse_proc_status("Name:\tx\nVmHWM:\tlots kB\nVmRSSx:\t5 kB\n");
        assert_eq!(m, ProcMemory::default());
        assert_eq!(parse_proc_status(""), ProcMemory::default());
    }

    #[test]
    fn reads_available_memory_where_linux_gives_it() {
        let m = bytes_field(
            "MemTotal:  2000 kB\nMemAvailable:   1500 kB\n",
            "MemAvailable",
        );
        assert_eq!(m, Some(1500 * 1024));
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(available_memory_bytes().is_some_and(|b| b > 0));
        }
    }

    #[test]
    fn reads_this_process_without_panicking() {
        let m = ProcMemory::now();
        if cfg!(target_os = "linux") {
            let (rss, peak) = (m.rss_bytes.unwrap(), m.peak_rss_bytes.unwrap());
            assert!(rss > 0 && peak >= rss, "{m:?}");
        }
    }
}
