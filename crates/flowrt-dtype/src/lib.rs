//! Tensor element types, numbered as in ggml/GGUF, and the geometry of their storage.
//!
//! Quantised types store values in blocks: `block_size` values take `type_size` bytes.
//! Every size computation here is checked, because shapes come from untrusted files.

use std::fmt;

/// A tensor element type. The discriminants are the GGUF/ggml type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    Iq2Xxs = 16,
    Iq2Xs = 17,
    Iq3Xxs = 18,
    Iq1S = 19,
    Iq4Nl = 20,
    Iq3S = 21,
    Iq2S = 22,
    Iq4Xs = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    Iq1M = 29,
    BF16 = 30,
    Tq1_0 = 34,
    Tq2_0 = 35,
    /// OCP microscaling FP4 (gpt-oss's expert weights): 32 E2M1 values with an E8M0 scale.
    Mxfp4 = 39,
}

/// Errors computing sizes of tensors.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DTypeError {
    #[error("unknown tensor type id {0}")]
    UnknownType(u32),
    #[error("row of {len} elements is not a multiple of the {ty} block size {block}")]
    RowNotBlockAligned { ty: GgmlType, len: u64, block: u64 },
    #[error("tensor size overflows (type {ty}, shape {shape:?})")]
    Overflow { ty: GgmlType, shape: Vec<u64> },
}

impl GgmlType {
    /// All types this crate knows, in id order.
    pub const ALL: [GgmlType; 32] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Q8K,
        Self::Iq2Xxs,
        Self::Iq2Xs,
        Self::Iq3Xxs,
        Self::Iq1S,
        Self::Iq4Nl,
        Self::Iq3S,
        Self::Iq2S,
        Self::Iq4Xs,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::Iq1M,
        Self::BF16,
        Self::Tq1_0,
        Self::Tq2_0,
        Self::Mxfp4,
    ];

    /// The type with GGUF id `id`.
    pub fn from_id(id: u32) -> Result<Self, DTypeError> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| *t as u32 == id)
            .ok_or(DTypeError::UnknownType(id))
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Name as ggml prints it (`q4_1`, `f16`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            Q8K => "q8_K",
            Iq2Xxs => "iq2_xxs",
            Iq2Xs => "iq2_xs",
            Iq3Xxs => "iq3_xxs",
            Iq1S => "iq1_s",
            Iq4Nl => "iq4_nl",
            Iq3S => "iq3_s",
            Iq2S => "iq2_s",
            Iq4Xs => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            Iq1M => "iq1_m",
            BF16 => "bf16",
            Tq1_0 => "tq1_0",
            Tq2_0 => "tq2_0",
            Mxfp4 => "mxfp4",
        }
    }

    /// Number of values in one block (1 for plain types). The one definition of block
    /// geometry: the kernels' constants and layouts are derived from it.
    pub const fn block_size(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Iq4Nl | Mxfp4 => 32,
            _ => 256,
        }
    }

    /// Bytes of one block.
    pub const fn type_size(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2K => 84,
            Q3K => 110,
            Q4K => 144,
            Q5K => 176,
            Q6K => 210,
            Q8K => 292,
            Iq2Xxs => 66,
            Iq2Xs => 74,
            Iq3Xxs => 98,
            Iq1S => 50,
            Iq4Nl => 18,
            Iq3S => 110,
            Iq2S => 82,
            Iq4Xs => 136,
            Iq1M => 56,
            Tq1_0 => 54,
            Tq2_0 => 66,
            Mxfp4 => 17,
        }
    }

    /// Bytes of a row of `n` values. `n` must be a whole number of blocks.
    pub fn row_size(self, n: u64) -> Result<u64, DTypeError> {
        let block = self.block_size();
        if !n.is_multiple_of(block) {
            return Err(DTypeError::RowNotBlockAligned {
                ty: self,
                len: n,
                block,
            });
        }
        // `ok_or_else`: the error allocates, and this runs on every matmul call.
        (n / block)
            .checked_mul(self.type_size())
            .ok_or_else(|| DTypeError::Overflow {
                ty: self,
                shape: vec![n],
            })
    }

    /// Bytes of a tensor of shape `dims` (ggml order: `dims[0]` is the contiguous row length).
    pub fn tensor_size(self, dims: &[u64]) -> Result<u64, DTypeError> {
        let overflow = || DTypeError::Overflow {
            ty: self,
            shape: dims.to_vec(),
        };
        let Some((&row, rest)) = dims.split_first() else {
            return Ok(self.type_size());
        };
        let row_bytes = self.row_size(row).map_err(|e| match e {
            DTypeError::Overflow { .. } => overflow(),
            e => e,
        })?;
        rest.iter()
            .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
            .ok_or_else(overflow)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()).unwrap(), t);
        }
        assert_eq!(GgmlType::from_id(4), Err(DTypeError::UnknownType(4)));
        assert_eq!(GgmlType::from_id(9999), Err(DTypeError::UnknownType(9999)));
    }

    #[test]
    fn sizes() {
        assert_eq!(GgmlType::Q4_1.row_size(576).unwrap(), 18 * 20);
        assert_eq!(GgmlType::F16.tensor_size(&[3, 5]).unwrap(), 30);
        // As gguf-py's GGML_QUANT_SIZES: (32, 17), id 39.
        assert_eq!(GgmlType::from_id(39).unwrap(), GgmlType::Mxfp4);
        assert_eq!(GgmlType::Mxfp4.row_size(64).unwrap(), 34);
        assert!(matches!(
            GgmlType::Q4_0.row_size(33),
            Err(DTypeError::RowNotBlockAligned { .. })
        ));
        assert!(matches!(
            GgmlType::F32.tensor_size(&[u64::MAX / 2, 4]),
            Err(DTypeError::Overflow { .. })
        ));
    }
}
