//! Shared by the fuzz targets: one fuzz input carries several files, cut apart at [`SEP`].

/// Separates the pieces of one input (a config, a safetensors file, a template, a message
/// list...). `fuzz/flowrt.dict` holds it so libFuzzer splices it in.
pub const SEP: &[u8] = b"\x00\xffPART\xff\x00";

/// The pieces of `data`, cut at every [`SEP`] (always at least one, possibly empty).
pub fn split_parts(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(i) = find(rest, SEP) {
        out.push(&rest[..i]);
        rest = &rest[i + SEP.len()..];
    }
    out.push(rest);
    out
}

/// The pieces joined back (what the seed generator writes).
pub fn join_parts(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(SEP);
        }
        out.extend_from_slice(p);
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

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
