//! The error type of this crate: one variant per way a file can be wrong, with context.

use std::path::PathBuf;

use flowrt_dtype::GgmlType;

/// Why a GGUF file could not be read, or why a metadata value has the wrong type.
///
/// `what` fields name the item being read (`"value of `general.name`"`), `offset`s are byte
/// offsets in the file unless a field says otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("cannot read GGUF file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("not a GGUF file: it starts with {found:02x?}, expected the magic \"GGUF\"")]
    BadMagic { found: [u8; 4] },

    #[error("unsupported GGUF version {0}{hint}", hint = version_hint(*.0))]
    UnsupportedVersion(u32),

    #[error(
        "GGUF file is truncated or damaged: reading {what} at byte {offset} needs {need} bytes, \
         only {have} remain"
    )]
    Truncated {
        what: String,
        offset: u64,
        need: u64,
        have: u64,
    },

    #[error("{what} claims a length of {len} bytes, over the limit of {max}")]
    StringTooLong { what: String, len: u64, max: u64 },

    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },

    #[error("array in metadata `{key}` claims {len} elements, over the limit of {max}")]
    ArrayTooLong { key: String, len: u64, max: u64 },

    #[error("arrays in metadata `{key}` nest more than {max} levels deep")]
    NestingTooDeep { key: String, max: u32 },

    #[error("metadata `{key}` has unknown value type id {ty} (known: 0..=12)")]
    UnknownValueType { key: String, ty: u32 },

    #[error("metadata `{key}` holds the bool byte {byte}, expected 0 or 1")]
    InvalidBool { key: String, byte: u8 },

    #[error("file declares {count} metadata entries, over the limit of {max}")]
    TooManyKeys { count: u64, max: u64 },

    #[error("file declares {count} tensors, over the limit of {max}")]
    TooManyTensors { count: u64, max: u64 },

    #[error("metadata key `{key}` appears more than once")]
    DuplicateKey { key: String },

    #[error("tensor `{tensor}` appears more than once")]
    DuplicateTensor { tensor: String },

    #[error("general.alignment is {0}; it must be a non-zero power of two")]
    BadAlignment(u64),

    #[error("tensor `{tensor}` has unknown ggml type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },

    #[error("tensor `{tensor}` has {n} dimensions; at most {max} are supported")]
    TooManyDims { tensor: String, n: u32, max: u32 },

    #[error("tensor `{tensor}` has a zero-length dimension in shape {dims:?}")]
    ZeroDim { tensor: String, dims: Vec<u64> },

    #[error("tensor `{tensor}`: shape {dims:?} overflows a 64-bit size")]
    ShapeOverflow { tensor: String, dims: Vec<u64> },

    #[error(
        "tensor `{tensor}` ({ty}): its rows of {row} elements are not a whole number of \
         {block}-element blocks"
    )]
    RowNotBlockAligned {
        tensor: String,
        ty: GgmlType,
        row: u64,
        block: u64,
    },

    #[error("tensor `{tensor}`: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error(
        "tensor `{tensor}` ({size} bytes at offset {offset} of the data section, which starts \
         at byte {data_offset}) ends past the end of the {file_len}-byte file"
    )]
    TensorPastEnd {
        tensor: String,
        offset: u64,
        size: u64,
        data_offset: u64,
        file_len: u64,
    },

    #[error("the data of tensors `{first}` and `{second}` overlap")]
    Overlap { first: String, second: String },

    #[error("metadata `{key}` is {actual}, expected {expected}")]
    TypeMismatch {
        key: String,
        expected: &'static str,
        actual: String,
    },

    #[error("metadata `{key}` is {value}, expected a non-negative integer")]
    NegativeInteger { key: String, value: i64 },
}

fn version_hint(v: u32) -> &'static str {
    if v == 1 {
        " (GGUF v1 is obsolete; re-convert the model with a current tool)"
    } else if v.swap_bytes() == 2 || v.swap_bytes() == 3 {
        " (this looks like a big-endian GGUF file; only little-endian files are supported)"
    } else {
        " (supported: 2 and 3)"
    }
}
