//! Writing GGUF files: a streaming [`StreamWriter`] for real files (`flowrt pack`), and, for
//! tests, a [`GgufBuilder`] for well-formed files and the low-level
//! encoders it uses, from which tests can assemble deliberately broken files.
//!
//! ```
//! use flowrt_gguf::{write::{f32_bytes, GgufBuilder}, GgmlType, GgufFile};
//!
//! let bytes = GgufBuilder::new()
//!     .kv("general.architecture", "llama")
//!     .kv("llama.block_count", 2u32)
//!     .tensor("output_norm.weight", &[4], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
//!     .to_bytes();
//! let file = GgufFile::from_bytes(bytes).unwrap();
//! assert_eq!(file.get_u64("llama.block_count").unwrap(), Some(2));
//! ```

use flowrt_dtype::GgmlType;

use crate::{Array, Value, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};

/// Builds a GGUF file in memory. Entries and tensors are written in the order added.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufBuilder {
    /// An empty version-3 file.
    pub fn new() -> Self {
        GgufBuilder {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version written in the header (any value, so tests can write bad ones).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Appends a metadata entry. Keys are not deduplicated, so tests can write duplicates.
    pub fn kv(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// Sets `general.alignment` (as u32, replacing any earlier entry). The data section and
    /// tensor offsets are laid out with it.
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        self.metadata.retain(|(k, _)| k != ALIGNMENT_KEY);
        self.kv(ALIGNMENT_KEY, alignment)
    }

    /// Appends a tensor of type `ty` and shape `dims` (`dims[0]` contiguous) with raw `data`.
    ///
    /// # Panics
    ///
    /// If `data` is not exactly the size the type and shape call for; use
    /// [`raw_tensor`](Self::raw_tensor) to write inconsistent tensors on purpose.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<Vec<u8>>,
    ) -> &mut Self {
        let (name, data) = (name.into(), data.into());
        let shape = if dims.is_empty() { &[1][..] } else { dims };
        let expected = ty.tensor_size(shape);
        assert!(
            expected == Ok(data.len() as u64),
            "tensor `{name}`: {} bytes of data given, {ty} with shape {dims:?} needs {expected:?}",
            data.len()
        );
        self.raw_tensor(name, dims, ty.id(), data)
    }

    /// Appends a tensor without checking the type id or the data size.
    pub fn raw_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        type_id: u32,
        data: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            type_id,
            data: data.into(),
        });
        self
    }

    /// The alignment the file will declare: `general.alignment` if it is a valid integer,
    /// else the default. (An invalid declared value is still written, and readers reject it.)
    fn layout_alignment(&self) -> u64 {
        self.metadata
            .iter()
            .rev()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| u64::try_from(v.as_integer()?).ok())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Encodes the file: header, metadata, tensor infos, padding, then each tensor's data
    /// padded to the alignment.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self.layout_alignment();
        let mut out = Vec::new();
        write_header(
            &mut out,
            self.version,
            self.tensors.len() as u64,
            self.metadata.len() as u64,
        );
        for (key, value) in &self.metadata {
            write_kv(&mut out, key, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_tensor_info(&mut out, &t.name, &t.dims, t.type_id, offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
        }
        pad_to(&mut out, alignment);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad_to(&mut out, alignment);
        }
        out
    }
}

/// Magic, version, tensor count and metadata entry count.
pub fn write_header(out: &mut Vec<u8>, version: u32, tensor_count: u64, kv_count: u64) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&tensor_count.to_le_bytes());
    out.extend_from_slice(&kv_count.to_le_bytes());
}

/// A `u64` length and the bytes of `s`.
pub fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A metadata entry: key, value type id, value.
pub fn write_kv(out: &mut Vec<u8>, key: &str, value: &Value) {
    write_string(out, key);
    out.extend_from_slice(&value.value_type().id().to_le_bytes());
    write_value(out, value);
}

/// A value without its type id.
pub fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => write_string(out, s),
        Value::Array(a) => write_array(out, a),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// An array: element type id, count, elements.
pub fn write_array(out: &mut Vec<u8>, array: &Array) {
    out.extend_from_slice(&array.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(array.len() as u64).to_le_bytes());
    match array {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| write_string(out, s)),
        Array::Array(v) => v.iter().for_each(|a| write_array(out, a)),
        Array::U64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
    }
}

/// A tensor info: name, dimension count, dimensions, type id, offset in the data section.
pub fn write_tensor_info(out: &mut Vec<u8>, name: &str, dims: &[u64], type_id: u32, offset: u64) {
    write_string(out, name);
    out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&type_id.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
}

/// Appends zero bytes until `out.len()` is a multiple of `alignment`.
pub fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).next_multiple_of(alignment);
    out.resize(len as usize, 0);
}

/// Little-endian bytes of `values`, the storage of an f32 tensor.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One tensor a [`StreamWriter`] will write: its name, shape (`dims[0]` contiguous) and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

/// Writes a GGUF file to disk tensor by tensor, so that no more than one tensor's data need
/// be in memory: metadata and every tensor info (offsets laid out with `general.alignment`,
/// always [`DEFAULT_ALIGNMENT`] = 32) first, then each tensor's data in the declared order.
///
/// The file is written as `OUT.partial` and renamed to `OUT` by [`finish`](Self::finish)
/// after an fsync; if the writer is dropped unfinished (an error, a panic) the partial file is
/// removed, so `OUT` either is complete or does not exist.
#[derive(Debug)]
pub struct StreamWriter {
    out: std::io::BufWriter<std::fs::File>,
    final_path: std::path::PathBuf,
    partial_path: std::path::PathBuf,
    tensors: Vec<(TensorSpec, u64)>,
    next: usize,
    finished: bool,
}

/// `path` with `.partial` appended to its file name.
pub fn partial_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".partial");
    std::path::PathBuf::from(s)
}

impl StreamWriter {
    /// Creates `out.partial` and writes the header, `metadata` (any `general.alignment` in it
    /// is replaced by 32) and the infos of `tensors`.
    pub fn create(
        out: &std::path::Path,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> std::io::Result<StreamWriter> {
        use std::io::Write;
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        let mut sized = Vec::with_capacity(tensors.len());
        for t in tensors {
            let shape = if t.dims.is_empty() { &[1][..] } else { &t.dims };
            let size =
                t.ty.tensor_size(shape)
                    .map_err(|e| invalid(format!("tensor `{}`: {e}", t.name)))?;
            sized.push((t.clone(), size));
        }
        let partial_path = partial_path(out);
        let file = std::fs::File::create(&partial_path)?;
        let mut w = StreamWriter {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            final_path: out.to_path_buf(),
            partial_path,
            tensors: sized,
            next: 0,
            finished: false,
        };
        let alignment = DEFAULT_ALIGNMENT;
        let meta: Vec<&(String, Value)> = metadata
            .iter()
            .filter(|(k, _)| k != ALIGNMENT_KEY)
            .collect();
        let mut head = Vec::new();
        write_header(&mut head, 3, w.tensors.len() as u64, meta.len() as u64 + 1);
        write_kv(&mut head, ALIGNMENT_KEY, &Value::U32(alignment as u32));
        for (k, v) in meta {
            write_kv(&mut head, k, v);
        }
        let mut offset = 0u64;
        for (t, size) in &w.tensors {
            write_tensor_info(&mut head, &t.name, &t.dims, t.ty.id(), offset);
            offset = (offset + size).next_multiple_of(alignment);
        }
        pad_to(&mut head, alignment);
        w.out.write_all(&head)?;
        Ok(w)
    }

    /// The tensor whose data [`write_tensor`](Self::write_tensor) expects next.
    pub fn next_tensor(&self) -> Option<&TensorSpec> {
        self.tensors.get(self.next).map(|(t, _)| t)
    }

    /// Writes the data of the next declared tensor (which must be `name`, with exactly its
    /// size), padded to the alignment.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        let Some((spec, size)) = self.tensors.get(self.next) else {
            return Err(invalid(format!("tensor `{name}` was not declared")));
        };
        if spec.name != name {
            return Err(invalid(format!(
                "tensor `{name}` written where `{}` was declared",
                spec.name
            )));
        }
        if *size != data.len() as u64 {
            return Err(invalid(format!(
                "tensor `{name}`: {} bytes given, {} declared",
                data.len(),
                size
            )));
        }
        self.out.write_all(data)?;
        let pad = (*size).next_multiple_of(DEFAULT_ALIGNMENT) - size;
        self.out.write_all(&vec![0u8; pad as usize])?;
        self.next += 1;
        Ok(())
    }

    /// Checks every tensor was written, flushes, fsyncs and renames `OUT.partial` to `OUT`.
    pub fn finish(mut self) -> std::io::Result<()> {
        use std::io::Write;
        if self.next != self.tensors.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} of {} tensors written", self.next, self.tensors.len()),
            ));
        }
        self.out.flush()?;
        self.out.get_ref().sync_all()?;
        std::fs::rename(&self.partial_path, &self.final_path)?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.partial_path);
        }
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;
    use crate::GgufFile;

    fn specs() -> Vec<TensorSpec> {
        vec![
            TensorSpec {
                name: "a".into(),
                dims: vec![3],
                ty: GgmlType::F32,
            },
            TensorSpec {
                name: "b".into(),
                dims: vec![2, 2],
                ty: GgmlType::F16,
            },
        ]
    }

    #[test]
    fn streamed_file_reads_back_like_the_builder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.gguf");
        let meta = vec![
            ("general.architecture".to_string(), Value::from("llama")),
            (ALIGNMENT_KEY.to_string(), Value::U32(64)),
        ];
        let mut w = StreamWriter::create(&out, &meta, &specs()).unwrap();
        assert!(partial_path(&out).exists() && !out.exists());
        w.write_tensor("a", &f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
        w.write_tensor("b", &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        w.finish().unwrap();
        assert!(!partial_path(&out).exists());
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.alignment(), 32);
        assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
        assert_eq!(
            f.tensor_bytes("a").unwrap(),
            &f32_bytes(&[1.0, 2.0, 3.0])[..]
        );
        assert_eq!(f.tensor_bytes("b").unwrap(), &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(f.tensor("b").unwrap().offset, 32);
    }

    #[test]
    fn unfinished_or_wrong_writes_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.gguf");
        let mut w = StreamWriter::create(&out, &[], &specs()).unwrap();
        assert!(w.write_tensor("b", &[0; 8]).is_err(), "out of order");
        assert!(w.write_tensor("a", &[0; 8]).is_err(), "wrong size");
        w.write_tensor("a", &[0; 12]).unwrap();
        assert!(w.finish().is_err(), "b missing");
        assert!(!out.exists() && !partial_path(&out).exists());
        let w = StreamWriter::create(&out, &[], &specs()).unwrap();
        drop(w);
        assert!(!out.exists() && !partial_path(&out).exists());
    }
}
