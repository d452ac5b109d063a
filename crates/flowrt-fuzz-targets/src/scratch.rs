//! A scratch directory for the files a target writes (`hf_dir`).

/// A directory for a target's files, made once per process (on tmpfs when there is one) and
/// emptied before each input.
pub fn scratch_dir() -> &'static std::path::Path {
    use std::sync::OnceLock;
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            if let Ok(d) = tempfile::Builder::new()
                .prefix("flowrt-fuzz")
                .tempdir_in(shm)
            {
                return d;
            }
        }
        tempfile::Builder::new()
            .prefix("flowrt-fuzz")
            .tempdir()
            .expect("a temporary directory")
    })
    .path()
}

/// Empty `dir` (files only; the targets write no subdirectories).
pub fn clear_dir(dir: &std::path::Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
