//! Parsing of the header, the metadata and the tensor infos.

use std::collections::HashMap;

use crate::cursor::Cursor;
use crate::tensor::{self, TensorInfo};
use crate::value::{Array, StringArray, Value, ValueType};
use crate::{
    GgufError, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_LEN, MAX_KEYS, MAX_NAME_LEN,
    MAX_NESTING, MAX_STRING_LEN, MAX_TENSORS, SUPPORTED_VERSIONS,
};

/// Fewest bytes one metadata entry can take: empty key (8), type (4), one-byte value (1).
const MIN_KV_SIZE: u64 = 8 + 4 + 1;

/// Everything before the data section, validated.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

pub(crate) fn parse(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor::new(bytes);
    let magic = c.array::<4>(format_args!("magic"))?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(format_args!("version"))?;
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count = c.u64(format_args!("tensor count"))?;
    let kv_count = c.u64(format_args!("metadata entry count"))?;
    if kv_count > MAX_KEYS {
        return Err(GgufError::TooManyKeys {
            count: kv_count,
            max: MAX_KEYS,
        });
    }
    if tensor_count > MAX_TENSORS {
        return Err(GgufError::TooManyTensors {
            count: tensor_count,
            max: MAX_TENSORS,
        });
    }

    let (metadata, key_index) = read_metadata(&mut c, kv_count)?;
    let (tensors, tensor_index) = tensor::read_infos(&mut c, tensor_count)?;

    let alignment = alignment(&metadata, &key_index)?;
    let data_offset = c
        .pos()
        .checked_next_multiple_of(alignment)
        .ok_or(GgufError::BadAlignment(alignment))?;
    tensor::validate_layout(&tensors, data_offset, alignment, bytes.len() as u64)?;

    Ok(Header {
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

type Metadata = (Vec<(String, Value)>, HashMap<String, usize>);

fn read_metadata(c: &mut Cursor<'_>, count: u64) -> Result<Metadata, GgufError> {
    // `count` is capped, and checking the bytes keeps the allocations below proportional to
    // the file.
    c.ensure(
        count * MIN_KV_SIZE,
        format_args!("{count} metadata entries"),
    )?;
    let n = count as usize;
    let mut metadata = Vec::with_capacity(n);
    let mut index = HashMap::with_capacity(n);
    for i in 0..n {
        let key = c.str(MAX_NAME_LEN, format_args!("key of metadata entry {i}"))?;
        if index.contains_key(key) {
            return Err(GgufError::DuplicateKey {
                key: key.to_owned(),
            });
        }
        let ty = c.u32(format_args!("value type of `{key}`"))?;
        let ty = ValueType::from_id(ty).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_owned(),
            ty,
        })?;
        let value = read_value(c, ty, key)?;
        index.insert(key.to_owned(), metadata.len());
        metadata.push((key.to_owned(), value));
    }
    Ok((metadata, index))
}

fn read_value(c: &mut Cursor<'_>, ty: ValueType, key: &str) -> Result<Value, GgufError> {
    let what = format_args!("value of `{key}`");
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(c.array(what)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(what)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        ValueType::Bool => Value::Bool(to_bool(c.array::<1>(what)?[0], key)?),
        ValueType::String => Value::String(c.str(MAX_STRING_LEN, what)?.to_owned()),
        ValueType::Array => Value::Array(read_array(c, key, 1)?),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(what)?)),
    })
}

/// An array at nesting `depth` (1 for an array that is a metadata value).
fn read_array(c: &mut Cursor<'_>, key: &str, depth: u32) -> Result<Array, GgufError> {
    if depth > MAX_NESTING {
        return Err(GgufError::NestingTooDeep {
            key: key.to_owned(),
            max: MAX_NESTING,
        });
    }
    let ty = c.u32(format_args!("element type of array `{key}`"))?;
    let ty = ValueType::from_id(ty).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_owned(),
        ty,
    })?;
    let len = c.u64(format_args!("length of array `{key}`"))?;
    if len > MAX_ARRAY_LEN {
        return Err(GgufError::ArrayTooLong {
            key: key.to_owned(),
            len,
            max: MAX_ARRAY_LEN,
        });
    }
    // No overflow: len <= 2^24 and elements take at most 12 bytes.
    c.ensure(
        len * ty.min_encoded_size(),
        format_args!("{len} elements of array `{key}`"),
    )?;
    let n = len as usize;
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(len, format_args!("array `{key}`"))?.to_vec()),
        ValueType::I8 => Array::I8(fixed(c, n, key, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(fixed(c, n, key, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(c, n, key, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(c, n, key, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(c, n, key, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(c, n, key, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(c, n, key, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(c, n, key, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(c, n, key, f64::from_le_bytes)?),
        ValueType::Bool => Array::Bool(
            c.take(len, format_args!("array `{key}`"))?
                .iter()
                .map(|&b| to_bool(b, key))
                .collect::<Result<_, _>>()?,
        ),
        ValueType::String => {
            // One buffer for all the text (each element takes at least its 8-byte length
            // prefix in the file, so `n` is bounded by the bytes left).
            let mut v = StringArray::with_capacity(n, 0);
            for i in 0..n {
                let s = c.str(MAX_STRING_LEN, format_args!("element {i} of array `{key}`"))?;
                v.push(s);
            }
            v.shrink_to_fit();
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

/// `n` fixed-size little-endian elements, decoded by `decode`.
fn fixed<T, const N: usize>(
    c: &mut Cursor<'_>,
    n: usize,
    key: &str,
    decode: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    let bytes = c.take((n * N) as u64, format_args!("array `{key}`"))?;
    Ok(bytes
        .chunks_exact(N)
        .map(|chunk| {
            let mut a = [0u8; N];
            a.copy_from_slice(chunk);
            decode(a)
        })
        .collect())
}

fn to_bool(byte: u8, key: &str) -> Result<bool, GgufError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(GgufError::InvalidBool {
            key: key.to_owned(),
            byte,
        }),
    }
}

/// `general.alignment` (any non-negative integer type; the spec says u32), or the default.
fn alignment(
    metadata: &[(String, Value)],
    index: &HashMap<String, usize>,
) -> Result<u64, GgufError> {
    let Some((_, value)) = index.get(ALIGNMENT_KEY).and_then(|&i| metadata.get(i)) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let a = value.as_integer().ok_or_else(|| GgufError::TypeMismatch {
        key: ALIGNMENT_KEY.to_owned(),
        expected: "u32",
        actual: value.describe_type(),
    })?;
    match u64::try_from(a) {
        Ok(a) if a.is_power_of_two() => Ok(a),
        Ok(a) => Err(GgufError::BadAlignment(a)),
        Err(_) => Err(GgufError::NegativeInteger {
            key: ALIGNMENT_KEY.to_owned(),
            value: a as i64,
        }),
    }
}
