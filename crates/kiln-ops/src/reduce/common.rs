//! Helpers shared by the reduce-family ops: dtype checks and conversions between tensors and
//! `f64`/`i128` working buffers, axis splitting, and small inference helpers.

use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Dim, InferInput, TensorType, ValueType};
use kiln_tensor::{DType, Data, Tensor};

/// The IEEE float dtypes the float-only ops of this family accept.
pub(crate) fn is_ieee_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// Plain (not byte-coded) integer dtypes.
pub(crate) fn is_plain_int(d: DType) -> bool {
    d.is_int() && !d.is_byte_coded()
}

/// Elements of a float tensor as f64; other dtypes are refused as input `index`.
pub(crate) fn floats(t: &Tensor, index: usize) -> Result<Vec<f64>> {
    if is_ieee_float(t.dtype()) {
        Ok(t.to_f64_vec())
    } else {
        Err(OpError::UnsupportedDType { index, got: t.dtype() })
    }
}

/// A tensor of `dtype` from f64 values: floats rounded to nearest, integers truncated and
/// wrapped like numpy's integer arithmetic.
pub(crate) fn from_f64(dtype: DType, shape: Vec<usize>, v: &[f64]) -> Result<Tensor> {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Bool => Ok(Tensor::from_f64(dtype, shape, v)?),
        other if is_plain_int(other) => from_i128(other, shape, &v.iter().map(|&x| f64_to_i128(x)).collect::<Vec<_>>()),
        other => Err(OpError::Unsupported(format!("output dtype {other}"))),
    }
}

/// Truncates toward zero (as numpy's float→int cast does for in-range values); NaN gives 0.
pub(crate) fn f64_to_i128(x: f64) -> i128 {
    x as i128
}

/// Elements of a plain-integer tensor as i128 (exact for every integer dtype).
pub(crate) fn ints(t: &Tensor) -> Option<Vec<i128>> {
    Some(match t.data() {
        Data::I8(v) => v.iter().map(|&x| x as i128).collect(),
        Data::I16(v) => v.iter().map(|&x| x as i128).collect(),
        Data::I32(v) => v.iter().map(|&x| x as i128).collect(),
        Data::I64(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U8(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U16(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U32(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U64(v) => v.iter().map(|&x| x as i128).collect(),
        _ => return None,
    })
}

/// A plain-integer tensor from i128 values, wrapping modulo the dtype's width (numpy's
/// overflow behaviour).
pub(crate) fn from_i128(dtype: DType, shape: Vec<usize>, v: &[i128]) -> Result<Tensor> {
    let data = match dtype {
        DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
        DType::I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
        DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        DType::I64 => Data::I64(v.iter().map(|&x| x as i64).collect()),
        DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        DType::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        DType::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
        DType::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
        other => {
            return Err(OpError::Unsupported(format!("integer output dtype {other}")));
        }
    };
    Ok(Tensor::new(dtype, shape, data)?)
}

/// Smallest and largest value of a plain integer dtype.
pub(crate) fn int_bounds(dtype: DType) -> (i128, i128) {
    match dtype {
        DType::I8 => (i8::MIN as i128, i8::MAX as i128),
        DType::I16 => (i16::MIN as i128, i16::MAX as i128),
        DType::I32 => (i32::MIN as i128, i32::MAX as i128),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        DType::U8 => (0, u8::MAX as i128),
        DType::U16 => (0, u16::MAX as i128),
        DType::U32 => (0, u32::MAX as i128),
        DType::U64 => (0, u64::MAX as i128),
        _ => (i64::MIN as i128, i64::MAX as i128),
    }
}

/// `(outer, n, inner)` of `shape` around `axis`: element `(o, k, i)` is at
/// `(o * n + k) * inner + i`.
pub(crate) fn split_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let n = shape[axis];
    let inner = shape[axis + 1..].iter().product();
    (outer, n, inner)
}

/// `(rows, cols)` of `shape` flattened to 2-D at `axis` (`axis` may equal the rank).
pub(crate) fn split_2d(shape: &[usize], axis: usize) -> (usize, usize) {
    (shape[..axis].iter().product(), shape[axis..].iter().product())
}

/// Normalises an axis that may also equal the rank (Flatten-style coercion, LayerNorm).
pub(crate) fn norm_axis_incl(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a > r {
        return Err(OpError::Axis { axis, rank });
    }
    Ok(a as usize)
}

/// The static tensor type of input `i`, or an empty one.
pub(crate) fn input_tensor_type(inputs: &[InferInput<'_>], i: usize) -> TensorType {
    inputs.get(i).and_then(|x| x.ty.tensor()).cloned().unwrap_or_default()
}

/// Same dtype and shape as input `i`.
pub(crate) fn same_as_input(inputs: &[InferInput<'_>], i: usize) -> ValueType {
    ValueType::Tensor(input_tensor_type(inputs, i))
}

/// A tensor type with `dtype` and a shape known only when `shape` is.
pub(crate) fn tensor_type(dtype: Option<DType>, shape: Option<Vec<Dim>>) -> ValueType {
    ValueType::Tensor(TensorType { dtype, shape })
}

/// Refuses a dtype statically known not to be an IEEE float (only when certain).
pub(crate) fn check_float_input(inputs: &[InferInput<'_>], i: usize) -> Result<()> {
    match util::input_dtype(inputs, i) {
        Some(d) if !is_ieee_float(d) => Err(OpError::UnsupportedDType { index: i, got: d }),
        _ => Ok(()),
    }
}

/// A scalar of the given float dtype.
pub(crate) fn scalar_f64(dtype: DType, v: f64) -> Result<Tensor> {
    from_f64(dtype, vec![], &[v])
}
