//! Tensor infos: reading them and checking their shapes and placement.

use std::collections::HashMap;

use flowrt_dtype::{DTypeError, GgmlType};

use crate::cursor::Cursor;
use crate::{GgufError, MAX_DIMS, MAX_NAME_LEN};

/// Fewest bytes one tensor info can take: empty name (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// One tensor as described in the file header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the contiguous (row) dimension. Empty for a scalar.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data, from the type's block geometry and the shape.
    pub size_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (1 for a scalar). Cannot overflow for infos read by
    /// [`GgufFile`](crate::GgufFile), which checks it; saturates otherwise.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

type Infos = (Vec<TensorInfo>, HashMap<String, usize>);

pub(crate) fn read_infos(c: &mut Cursor<'_>, count: u64) -> Result<Infos, GgufError> {
    // `count` is capped, and checking the bytes keeps the allocations below proportional to
    // the file.
    c.ensure(
        count * MIN_TENSOR_INFO_SIZE,
        format_args!("{count} tensor infos"),
    )?;
    let n = count as usize;
    let mut infos = Vec::with_capacity(n);
    let mut index = HashMap::with_capacity(n);
    for i in 0..n {
        let info = read_info(c, i)?;
        if index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor { tensor: info.name });
        }
        index.insert(info.name.clone(), infos.len());
        infos.push(info);
    }
    Ok((infos, index))
}

fn read_info(c: &mut Cursor<'_>, i: usize) -> Result<TensorInfo, GgufError> {
    let name = c.str(MAX_NAME_LEN, format_args!("name of tensor {i}"))?;
    let n_dims = c.u32(format_args!("dimension count of tensor `{name}`"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name.to_owned(),
            n: n_dims,
            max: MAX_DIMS,
        });
    }
    let dims = (0..n_dims)
        .map(|d| c.u64(format_args!("dimension {d} of tensor `{name}`")))
        .collect::<Result<Vec<_>, _>>()?;
    let type_id = c.u32(format_args!("type of tensor `{name}`"))?;
    let offset = c.u64(format_args!("offset of tensor `{name}`"))?;

    let ggml_type = GgmlType::from_id(type_id).map_err(|_| GgufError::UnknownTensorType {
        tensor: name.to_owned(),
        id: type_id,
    })?;
    let size_bytes = checked_size(name, &dims, ggml_type)?;
    Ok(TensorInfo {
        name: name.to_owned(),
        dims,
        ggml_type,
        offset,
        size_bytes,
    })
}

/// Bytes of a tensor, rejecting zero dimensions and shapes whose element count or byte size
/// does not fit in 64 bits.
fn checked_size(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim {
            tensor: name.to_owned(),
            dims: dims.to_vec(),
        });
    }
    let overflow = || GgufError::ShapeOverflow {
        tensor: name.to_owned(),
        dims: dims.to_vec(),
    };
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    // A scalar is a single row of one element.
    let shape = if dims.is_empty() { &[1][..] } else { dims };
    ty.tensor_size(shape).map_err(|e| match e {
        DTypeError::RowNotBlockAligned { ty, len, block } => GgufError::RowNotBlockAligned {
            tensor: name.to_owned(),
            ty,
            row: len,
            block,
        },
        DTypeError::UnknownType(id) => GgufError::UnknownTensorType {
            tensor: name.to_owned(),
            id,
        },
        DTypeError::Overflow { .. } => overflow(),
    })
}

/// Checks that every tensor is aligned, lies inside the file and overlaps no other.
pub(crate) fn validate_layout(
    tensors: &[TensorInfo],
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::Misaligned {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size_bytes));
        if !matches!(end, Some(end) if end <= file_len) {
            return Err(GgufError::TensorPastEnd {
                tensor: t.name.clone(),
                offset: t.offset,
                size: t.size_bytes,
                data_offset,
                file_len,
            });
        }
    }
    // Every tensor has at least one byte, so sorting by offset and comparing neighbours finds
    // any overlap. The ends cannot overflow: they were checked against the file length above.
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_unstable_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if let [a, b] = pair {
            if a.offset + a.size_bytes > b.offset {
                return Err(GgufError::Overlap {
                    first: a.name.clone(),
                    second: b.name.clone(),
                });
            }
        }
    }
    Ok(())
}
