//! Helpers shared by op implementations: axis normalisation, broadcasting index maps, reading
//! shape-like inputs, size checks before allocation.

use crate::error::{OpError, Result};
use kiln_tensor::{Tensor, numel};

/// The buffer of an op's output of `n` elements, which the op then writes whole: the running
/// step's planned range of the run arena when the compiler planned one of exactly this size
/// (f32 and int64), else a recycled vector; stale contents either way. An op takes at most
/// one output buffer this way; scratch comes from `kiln_kernels::recycle::take`.
pub fn out_buf<T: kiln_kernels::recycle::Recycled>(n: usize) -> kiln_tensor::Buf<T> {
    match T::take_planned(n) {
        Some(r) => kiln_tensor::Buf::from_region(r),
        None => kiln_tensor::Buf::from_vec(kiln_kernels::recycle::take_of(n)),
    }
}

/// [`out_buf`] for f32.
pub fn out_f32(n: usize) -> kiln_tensor::Buf<f32> {
    out_buf(n)
}

/// Turns a possibly negative ONNX axis into an index below `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(0) {
        return Err(OpError::Axis { axis, rank });
    }
    Ok(a as usize)
}

/// Normalises a list of axes; duplicates are an error.
pub fn norm_axes(axes: &[i64], rank: usize) -> Result<kiln_tensor::Shape> {
    let mut out = kiln_tensor::Shape::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(a, rank)?;
        if out.contains(&n) {
            return Err(OpError::RepeatedAxis {
                axis: a,
                axes: axes.to_vec(),
            });
        }
        out.push(n);
    }
    Ok(out)
}

/// Element count of a shape, refused when above the allocation bound.
pub fn checked_numel(shape: &[usize]) -> Result<usize> {
    numel(shape).ok_or_else(|| OpError::too_large("shape", format!("{shape:?}")))
}

/// Element strides of `in_shape` (the shape of input `index`) read as `out_shape` under numpy
/// broadcasting: per output dim, the input's stride, 0 where the input has no such dim or a
/// broadcast 1.
pub fn broadcast_strides(in_shape: &[usize], out_shape: &[usize], index: usize) -> Result<kiln_tensor::Shape> {
    let bad = || OpError::input_shape(index, format!("a shape that broadcasts to {out_shape:?}"), in_shape);
    let off = out_shape.len().checked_sub(in_shape.len()).ok_or_else(bad)?;
    let mut strides: kiln_tensor::Shape = smallvec::smallvec![0; out_shape.len()];
    let mut step = 1usize;
    for (i, &d) in in_shape.iter().enumerate().rev() {
        let o = out_shape.get(i + off).copied().ok_or_else(bad)?;
        if d == o {
            if d != 1
                && let Some(s) = strides.get_mut(i + off)
            {
                *s = step;
            }
        } else if d != 1 {
            return Err(bad());
        }
        step = step.saturating_mul(d);
    }
    Ok(strides)
}

/// Calls `f` for every element of `shape`, in row-major order, with its offset in each of `K`
/// operands read with the given per-dim strides (0 on broadcast dims): the one odometer behind
/// the ops' strided walks (broadcast and transpose maps, Where, Expand).
pub fn for_each_offset<const K: usize>(shape: &[usize], strides: [&[usize]; K], mut f: impl FnMut([usize; K])) {
    if shape.contains(&0) {
        return;
    }
    let rank = shape.len();
    let mut idx: kiln_tensor::Shape = smallvec::smallvec![0; rank];
    let mut off = [0usize; K];
    loop {
        f(off);
        let mut d = rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for (o, s) in off.iter_mut().zip(strides) {
                *o += s.get(d).copied().unwrap_or(0);
            }
            if idx[d] < shape[d] {
                break;
            }
            for (o, s) in off.iter_mut().zip(strides) {
                *o -= s.get(d).copied().unwrap_or(0) * shape[d];
            }
            idx[d] = 0;
        }
    }
}

/// For each element of `out_shape` (row-major), the flat index of the element of a tensor of
/// `in_shape` (input `index`) that numpy broadcasting reads. `in_shape` must broadcast to
/// `out_shape`.
pub fn broadcast_map(in_shape: &[usize], out_shape: &[usize], index: usize) -> Result<Vec<usize>> {
    let n = checked_numel(out_shape)?;
    let strides = broadcast_strides(in_shape, out_shape, index)?;
    if in_shape == out_shape {
        return Ok((0..n).collect());
    }
    let mut out = Vec::with_capacity(n);
    for_each_offset(out_shape, [&strides], |[i]| out.push(i));
    Ok(out)
}

/// Reads a 1-D (or scalar) integer tensor, input `index` of its op, e.g. a shape, axes or pads
/// input; `what` names it in errors.
pub fn read_i64s(t: &Tensor, index: usize, what: &str) -> Result<Vec<i64>> {
    if t.rank() > 1 {
        return Err(OpError::input_shape(
            index,
            format!("{what} as a 1-D tensor"),
            t.shape(),
        ));
    }
    t.to_i64_vec().ok_or_else(|| not_integers(t, index, what))
}

fn not_integers(t: &Tensor, index: usize, what: &str) -> OpError {
    OpError::input_value(index, format!("{what} as integers"), format!("a {} tensor", t.dtype()))
}

/// [`read_i64s`], borrowing the elements of an i64 tensor instead of copying them.
pub fn read_i64s_cow<'a>(t: &'a Tensor, index: usize, what: &str) -> Result<std::borrow::Cow<'a, [i64]>> {
    match t.as_slice::<i64>() {
        Ok(v) if t.rank() <= 1 => Ok(std::borrow::Cow::Borrowed(v)),
        _ => read_i64s(t, index, what).map(std::borrow::Cow::Owned),
    }
}

/// Reads a scalar (or one-element) integer tensor, input `index` of its op.
pub fn read_i64(t: &Tensor, index: usize, what: &str) -> Result<i64> {
    let v = t.to_i64_vec().ok_or_else(|| not_integers(t, index, what))?;
    match v.as_slice() {
        [x] => Ok(*x),
        _ => Err(OpError::input_shape(index, format!("{what} as one element"), t.shape())),
    }
}

/// The sizes of `dims` when every one is fixed.
pub fn fixed(dims: &[Dim]) -> Option<Vec<usize>> {
    dims.iter()
        .map(|d| match d {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        })
        .collect()
}

/// Converts a dimension read from input `index` (named `what`) to usize, refusing negatives.
pub fn dim(v: i64, index: usize, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| OpError::input_value(index, format!("{what} >= 0"), v))
}

/// Converts a dimension given by the attribute `attr` to usize, refusing negatives.
pub fn attr_dim(v: i64, attr: &'static str) -> Result<usize> {
    usize::try_from(v).map_err(|_| OpError::attribute(attr, ">= 0", v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_map_repeats_rows_and_columns() {
        assert_eq!(broadcast_map(&[3], &[2, 3], 0).unwrap(), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_map(&[2, 1], &[2, 3], 0).unwrap(), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_map(&[], &[2], 0).unwrap(), vec![0, 0]);
        assert_eq!(
            broadcast_map(&[2], &[3], 1).unwrap_err(),
            OpError::input_shape(1, "a shape that broadcasts to [3]", &[2])
        );
    }

    #[test]
    fn axes_normalise() {
        assert_eq!(norm_axis(-1, 3).unwrap(), 2);
        assert!(norm_axis(3, 3).is_err());
        assert!(norm_axis(0, 0).is_err());
        assert_eq!(
            norm_axes(&[0, -3], 3).unwrap_err(),
            OpError::RepeatedAxis {
                axis: -3,
                axes: vec![0, -3]
            }
        );
    }
}

use crate::value::{Dim, InferInput, TensorType, ValueType};
use kiln_tensor::DType;

/// Broadcast of two static shapes; `None` when it cannot be decided or does not broadcast.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let rank = a.len().max(b.len());
    let get = |s: &[Dim], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank].clone()
        } else {
            Dim::Fixed(1)
        }
    };
    (0..rank)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, y) if x == y => Some(x),
            (Dim::Fixed(1), y) => Some(y),
            (x, Dim::Fixed(1)) => Some(x),
            (Dim::Fixed(_), Dim::Fixed(_)) => None,
            // Two different symbols (or a symbol and a number): runtime decides.
            (Dim::Fixed(n), Dim::Sym(_)) | (Dim::Sym(_), Dim::Fixed(n)) => Some(Dim::Fixed(n)),
            (Dim::Sym(x), Dim::Sym(_)) => Some(Dim::Sym(x)),
        })
        .collect()
}

/// Broadcast of the shapes of several inputs (absent ones skipped) with the given dtype.
pub fn infer_broadcast(inputs: &[InferInput<'_>], dtype: Option<DType>) -> ValueType {
    let mut shape: Option<Vec<Dim>> = Some(Vec::new());
    for inp in inputs {
        let s = inp.ty.tensor().and_then(|t| t.shape.clone());
        shape = match (shape, s) {
            (Some(a), Some(b)) => broadcast_dims(&a, &b),
            _ => None,
        };
    }
    ValueType::Tensor(TensorType { dtype, shape })
}

/// The dtype of input `i`, when known.
pub fn input_dtype(inputs: &[InferInput<'_>], i: usize) -> Option<DType> {
    inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.dtype)
}

/// Whether input `i` is given (an optional input the node leaves out is not).
pub fn present(inputs: &[InferInput<'_>], i: usize) -> bool {
    inputs.get(i).is_some_and(|x| x.present)
}

/// The static type of input `i` (Unknown when absent).
pub fn input_type(inputs: &[InferInput<'_>], i: usize) -> ValueType {
    inputs.get(i).map_or(ValueType::Unknown, |x| x.ty.clone())
}

/// The constant tensor value of input `i`, when it is a compile-time constant.
pub fn const_tensor<'a>(inputs: &[InferInput<'a>], i: usize) -> Option<&'a kiln_tensor::Tensor> {
    inputs.get(i).and_then(|x| x.konst).and_then(|v| v.as_tensor())
}

/// A tensor type with only the dtype known.
pub fn dtype_only(dtype: Option<DType>) -> ValueType {
    ValueType::Tensor(TensorType::dtype_only(dtype))
}
