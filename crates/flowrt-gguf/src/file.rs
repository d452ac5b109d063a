//! [`GgufFile`]: the file's bytes (memory-mapped or owned) with its parsed header.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::parser::{self, Header};
use crate::{Array, GgufError, TensorInfo, Value};

/// An open GGUF file whose header, metadata and tensor layout have been validated.
pub struct GgufFile {
    bytes: Bytes,
    path: Option<PathBuf>,
    header: Header,
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl GgufFile {
    /// Memory-maps `path` read-only and parses it.
    ///
    /// The file must not be modified or truncated while the returned value is alive (as with
    /// any memory-mapped model file).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only and private to this value, and it lives as long as every
        // slice handed out from it (they borrow `self`). Mapping a file is unsound only if
        // another process changes or truncates it meanwhile; model files are treated as
        // immutable, and `open` documents that requirement.
        #[allow(unsafe_code)]
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(Bytes::Mapped(map), Some(path.to_owned()))
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Bytes::Owned(bytes), None)
    }

    fn parse(bytes: Bytes, path: Option<PathBuf>) -> Result<GgufFile, GgufError> {
        let header = parser::parse(bytes.as_slice())?;
        Ok(GgufFile {
            bytes,
            path,
            header,
        })
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The path given to [`open`](Self::open); `None` for [`from_bytes`](Self::from_bytes).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    pub fn file_len(&self) -> u64 {
        self.as_bytes().len() as u64
    }

    /// File offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Alignment of the data section and of every tensor offset.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// All metadata entries, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.header.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        let &i = self.header.key_index.get(key)?;
        self.header.metadata.get(i).map(|(_, v)| v)
    }

    /// A string value; `Ok(None)` if the key is absent, `TypeMismatch` if it is not a string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get_typed(key, "string", Value::as_str)
    }

    /// An integer value of any type that is not negative.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        let Some(v) = self.get_typed(key, "an integer", Value::as_integer)? else {
            return Ok(None);
        };
        u64::try_from(v)
            .map(Some)
            .map_err(|_| GgufError::NegativeInteger {
                key: key.to_owned(),
                value: v as i64,
            })
    }

    /// A float value (f32 or f64, rounded to f32) or an integer converted to f32.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get_typed(key, "a number", |v| match *v {
            Value::F32(x) => Some(x),
            Value::F64(x) => Some(x as f32),
            ref v => v.as_integer().map(|i| i as f32),
        })
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get_typed(key, "bool", |v| match *v {
            Value::Bool(b) => Some(b),
            _ => None,
        })
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.get_typed(key, "an array", Value::as_array)
    }

    /// An array of strings, borrowed.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let strings = self.get_typed(key, "array of string", |v| v.as_array()?.as_strings())?;
        Ok(strings.map(|s| s.iter().collect()))
    }

    /// Looks `key` up and converts it with `convert`, which returns `None` on a type mismatch.
    fn get_typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match convert(value) {
            Some(t) => Ok(Some(t)),
            None => Err(GgufError::TypeMismatch {
                key: key.to_owned(),
                expected,
                actual: value.describe_type(),
            }),
        }
    }

    /// All tensor infos, in file order.
    /// Tells the kernel that the file's bytes `start..start + len` are not needed for now:
    /// their pages leave this process's resident set and are read again from the file (or the
    /// page cache) if touched later. For a backend that copied them elsewhere (repacked
    /// weights). Best effort: a range shorter than a page, or an in-memory file, is left as is.
    pub fn release(&self, start: usize, len: usize) {
        const PAGE: usize = 4096;
        let Bytes::Mapped(map) = &self.bytes else {
            return;
        };
        let end = start.saturating_add(len).min(map.len()) / PAGE * PAGE;
        let start = start.next_multiple_of(PAGE);
        if end > start {
            // SAFETY: the mapping is read-only and shared, so dropping its pages loses nothing:
            // later reads fault the unchanged file contents back in. (The hazard this call is
            // `unsafe` for is discarding private modified pages, which a read-only map has none
            // of.) Failure (e.g. a larger page size) only leaves the pages resident.
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let &i = self.header.tensor_index.get(name)?;
        self.header.tensors.get(i)
    }

    /// The `size_bytes` bytes of data of `t`, an info of this file.
    ///
    /// # Panics
    ///
    /// If `t` does not describe a range inside this file (it came from another file or was
    /// built by hand). Infos from [`tensors`](Self::tensors) were validated at open.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        match self.try_tensor_data(t) {
            Some(data) => data,
            None => panic!(
                "tensor `{}` ({} bytes at data offset {}) is outside this {}-byte GGUF file; \
                 was its TensorInfo taken from another file?",
                t.name,
                t.size_bytes,
                t.offset,
                self.file_len()
            ),
        }
    }

    /// The data of the tensor called `name`, if there is one.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        self.try_tensor_data(self.tensor(name)?)
    }

    fn try_tensor_data(&self, t: &TensorInfo) -> Option<&[u8]> {
        let start = self.header.data_offset.checked_add(t.offset)?;
        let end = start.checked_add(t.size_bytes)?;
        let range = usize::try_from(start).ok()?..usize::try_from(end).ok()?;
        self.as_bytes().get(range)
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("file_len", &self.file_len())
            .field("metadata_entries", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .field("alignment", &self.header.alignment)
            .field("data_offset", &self.header.data_offset)
            .finish()
    }
}
