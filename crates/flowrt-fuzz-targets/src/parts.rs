//! One fuzz input carries several files (a config, a safetensors file, a template, a message
//! list...), cut apart at [`SEP`]. The targets split inputs with [`split_parts`]; the seed
//! generator writes them with [`join_parts`].

/// Separates the pieces of one input. `fuzz/flowrt.dict` holds it so libFuzzer splices it in.
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

/// The pieces joined back: `split_parts(&join_parts(p)) == p` for pieces without [`SEP`].
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_undoes_join() {
        let parts: [&[u8]; 4] = [b"config", b"", b"\x00\xffPAR", b"tail"];
        assert_eq!(split_parts(&join_parts(&parts)), parts);
        assert_eq!(split_parts(b""), [b"" as &[u8]]);
    }
}
