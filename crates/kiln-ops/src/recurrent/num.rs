//! Numeric helpers shared by the recurrent and quant families: float tensors read as f64,
//! rounding to a storage type (to follow the reference's intermediate precision), building
//! float tensors back, and small shape checks.

use crate::error::{OpError, Result};
use crate::value::{Dim, InferInput, TensorType, ValueType};
use kiln_tensor::{DType, Tensor, bf16, f16};

/// The IEEE float types ops of these families compute in.
pub(crate) fn is_ieee_float(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// Checks that input `index` is an IEEE float tensor.
pub(crate) fn need_float(t: &Tensor, index: usize) -> Result<DType> {
    let dt = t.dtype();
    if is_ieee_float(dt) {
        Ok(dt)
    } else {
        Err(OpError::UnsupportedDType { index, got: dt })
    }
}

/// `x` rounded to the precision of `dt` (unchanged for f64 and non-float types).
pub(crate) fn round_to(dt: DType, x: f64) -> f64 {
    match dt {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

/// A float tensor of `dt` from f64 values (rounded to nearest).
pub(crate) fn float_tensor(dt: DType, shape: Vec<usize>, v: Vec<f64>) -> Result<Tensor> {
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(OpError::UnsupportedDType { index: 0, got: dt });
    }
    Ok(Tensor::from_f64(dt, shape, &v)?)
}

/// Checks the rank of `t`, input `index`.
pub(crate) fn need_rank(t: &Tensor, index: usize, rank: usize) -> Result<()> {
    if t.rank() != rank {
        return Err(OpError::input_shape(index, format!("rank {rank}"), t.shape()));
    }
    Ok(())
}

/// Static shape of input `i` (None when unknown or absent).
pub(crate) fn in_shape(inputs: &[InferInput<'_>], i: usize) -> Option<Vec<Dim>> {
    inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.shape.clone())
}

/// Tensor type with the given dtype and shape (shape may be unknown).
pub(crate) fn tt(dtype: Option<DType>, shape: Option<Vec<Dim>>) -> ValueType {
    ValueType::Tensor(TensorType { dtype, shape })
}

/// Product of two dims when both are fixed.
pub(crate) fn dim_mul(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x.checked_mul(*y).map(Dim::Fixed),
        _ => None,
    }
}

/// Quotient of a fixed dim by `n` when it divides exactly.
pub(crate) fn dim_div(a: &Dim, n: usize) -> Option<Dim> {
    match a {
        Dim::Fixed(x) if n > 0 && x % n == 0 => Some(Dim::Fixed(x / n)),
        _ => None,
    }
}

/// Sum of two dims when both are fixed.
pub(crate) fn dim_add(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x.checked_add(*y).map(Dim::Fixed),
        _ => None,
    }
}

/// A fixed dim's value.
pub(crate) fn fixed(d: &Dim) -> Option<usize> {
    match d {
        Dim::Fixed(n) => Some(*n),
        Dim::Sym(_) => None,
    }
}
