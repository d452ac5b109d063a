//! Reader for GGUF model files (versions 2 and 3), hardened against hostile input.
//!
//! A GGUF file is little-endian and laid out as:
//!
//! ```text
//! magic "GGUF" | u32 version | u64 tensor_count | u64 metadata_kv_count
//! metadata_kv_count × (string key, u32 value type, value)
//! tensor_count × (string name, u32 n_dims, n_dims × u64 dim, u32 ggml type, u64 offset)
//! padding up to `general.alignment` (default 32)
//! tensor data; each tensor's offset is relative to the start of this section
//! ```
//!
//! Strings are a `u64` byte length followed by UTF-8 bytes. Arrays are a `u32` element type,
//! a `u64` count and the elements; arrays may hold arrays.
//!
//! Every length and count read from the file is checked against a cap (see the `MAX_*`
//! constants) and against the bytes that remain before anything is allocated, so a damaged or
//! crafted file yields a [`GgufError`] naming the problem, never a panic or a huge allocation.
//! Tensor shapes, types, alignment, bounds and overlaps are all validated in
//! [`GgufFile::open`], so [`GgufFile::tensor_data`] can hand out slices without further checks.

mod cursor;
mod error;
mod file;
mod parser;
mod tensor;
mod value;
pub mod write;

pub use error::GgufError;
pub use file::GgufFile;
pub use flowrt_dtype::GgmlType;
pub use tensor::TensorInfo;
pub use value::{Array, StringArray, Value, ValueType};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// GGUF versions this reader accepts (v1 used 32-bit counts and is obsolete).
pub const SUPPORTED_VERSIONS: [u32; 2] = [2, 3];
/// Metadata key holding the data-section alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Alignment used when the file has no `general.alignment` entry.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Longest string value accepted (chat templates are tens of KB; this leaves ample room).
pub const MAX_STRING_LEN: u64 = 16 << 20;
/// Longest metadata key or tensor name accepted.
pub const MAX_NAME_LEN: u64 = 64 << 10;
/// Most elements in one array (real vocabularies and merge lists have a few hundred thousand).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Deepest nesting of arrays inside arrays (a plain array is depth 1).
pub const MAX_NESTING: u32 = 8;
/// Most metadata entries in one file.
pub const MAX_KEYS: u64 = 1 << 16;
/// Most tensors in one file.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most dimensions of one tensor (as in ggml).
pub const MAX_DIMS: u32 = 4;
