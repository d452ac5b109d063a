//! Metadata values. Arrays are typed vectors, and a string array is one buffer of text with
//! end offsets ([`StringArray`]), so a 150k-entry vocabulary is two allocations, not 150k
//! strings or boxed enums.

use std::fmt;

/// The GGUF metadata value types; the discriminants are the ids stored in files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// All types, in id order.
    pub const ALL: [ValueType; 13] = [
        Self::U8,
        Self::I8,
        Self::U16,
        Self::I16,
        Self::U32,
        Self::I32,
        Self::F32,
        Self::Bool,
        Self::String,
        Self::Array,
        Self::U64,
        Self::I64,
        Self::F64,
    ];

    /// The type stored in files as `id`, if there is one.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.get(usize::try_from(id).ok()?).copied()
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        }
    }

    /// Bytes one value of this type takes in a file, at least: its exact size for scalars,
    /// the length prefix for strings, the element type and count for arrays.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 12,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: a vector of one element type. Arrays of arrays may mix inner types.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StringArray),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The type for error messages: `u32`, `string`, `array of string`, ...
    pub fn describe_type(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type()),
            v => v.value_type().name().to_owned(),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Any integer type widened to `i128`, so signed and unsigned compare and convert exactly.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_strings(&self) -> Option<&StringArray> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }
}

/// Scalars print as values, strings quoted, arrays as their type and length
/// (`[string; 49152]`), so printing a vocabulary stays short.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(a) => write!(f, "[{}; {}]", a.elem_type(), a.len()),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

macro_rules! from_impls {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant(v)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Self {
                Array::$variant(v)
            }
        }
    )*};
}

from_impls! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, Array => Array, u64 => U64, i64 => I64, f64 => F64,
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}

impl From<Vec<String>> for Array {
    fn from(v: Vec<String>) -> Self {
        Array::String(v.into_iter().collect())
    }
}

impl From<Vec<&str>> for Array {
    fn from(v: Vec<&str>) -> Self {
        Array::String(v.into_iter().collect())
    }
}

/// A string array: every element's text back to back in one `String`, with end offsets
/// (element `i` is `text[ends[i-1]..ends[i]]`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StringArray {
    text: String,
    ends: Vec<usize>,
}

impl StringArray {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `len` elements of `text_bytes` bytes in all.
    pub fn with_capacity(len: usize, text_bytes: usize) -> Self {
        StringArray {
            text: String::with_capacity(text_bytes),
            ends: Vec::with_capacity(len),
        }
    }

    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Element `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.text[start..end])
    }

    /// The elements in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// Release spare capacity (after parsing, when the total length was not known).
    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

impl fmt::Debug for StringArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut a = StringArray::new();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

impl<T> From<Vec<T>> for Value
where
    Array: From<Vec<T>>,
{
    fn from(v: Vec<T>) -> Self {
        Value::Array(Array::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_array_keeps_elements_and_empty_strings_in_order() {
        let a = StringArray::from_iter(["", "Ġthe", "", "<|im_end|>"]);
        assert_eq!(a.len(), 4);
        assert_eq!(a.get(0), Some(""));
        assert_eq!(a.get(1), Some("Ġthe"));
        assert_eq!(a.get(3), Some("<|im_end|>"));
        assert_eq!(a.get(4), None);
        assert_eq!(a.iter().collect::<Vec<_>>(), ["", "Ġthe", "", "<|im_end|>"]);
        assert_eq!(
            Array::from(vec!["a".to_string(), "bc".to_string()]),
            Array::from(vec!["a", "bc"])
        );
        assert!(StringArray::new().is_empty());
    }
}
