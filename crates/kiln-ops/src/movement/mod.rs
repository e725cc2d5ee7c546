//! Data-movement and shape ops: reshaping, indexing, scattering, padding, sorting-like
//! selection and running sums. Reference semantics follow the ONNX operator specs
//! (<https://onnx.ai/onnx/operators/>), opsets 1 through 28; each op's doc comment names the
//! opset range it covers. Every op here that only moves elements is generic over every dtype
//! (strings, bool and byte-coded float8/int4 included).

use crate::error::{OpError, Result};
use crate::value::{Args, Dim, InferInput, TensorType, Value, ValueType};
use kiln_tensor::{DType, Data, Tensor, bf16, f16};

mod index;
mod layout;
mod shape;
mod sort;
#[cfg(test)]
mod tests;

pub use index::*;
pub use layout::*;
pub use shape::*;
pub use sort::*;

op_family! {
    /// The movement family: one variant per op, named as its ONNX op type.
    pub enum MovementOp {
        Reshape(Reshape),
        Shape(Shape),
        Size(Size),
        Flatten(Flatten),
        Squeeze(Squeeze),
        Unsqueeze(Unsqueeze),
        Expand(Expand),
        ConstantOfShape(ConstantOfShape),
        Range(Range),
        Identity(Identity),
        EyeLike(EyeLike),
        Transpose(Transpose),
        Concat(Concat),
        Split(Split),
        Slice(Slice),
        Tile(Tile),
        Pad(Pad),
        DepthToSpace(DepthToSpace),
        SpaceToDepth(SpaceToDepth),
        CenterCropPad(CenterCropPad),
        Trilu(Trilu),
        ReverseSequence(ReverseSequence),
        Gather(Gather),
        GatherElements(GatherElements),
        GatherND(GatherND),
        ScatterElements(ScatterElements),
        ScatterND(ScatterND),
        TensorScatter(TensorScatter),
        OneHot(OneHot),
        Compress(Compress),
        NonZero(NonZero),
        TopK(TopK),
        Unique(Unique),
        CumSum(CumSum),
        CumProd(CumProd),
        Col2Im(Col2Im),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers.

/// Applies `$body` (any expression over `$v: &Vec<T>`) to whichever variant `$data` holds.
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::F32($v) => $body,
            Data::F64($v) => $body,
            Data::F16($v) => $body,
            Data::BF16($v) => $body,
            Data::I8($v) => $body,
            Data::I16($v) => $body,
            Data::I32($v) => $body,
            Data::I64($v) => $body,
            Data::U8($v) => $body,
            Data::U16($v) => $body,
            Data::U32($v) => $body,
            Data::U64($v) => $body,
            Data::Bool($v) => $body,
            Data::Str($v) => $body,
            Data::Coded($v) => $body,
        }
    };
}
pub(crate) use with_data;

/// Applies `$body` (returning `Result<Vec<T>>`, generic over [`Num`]) to the numeric variants
/// of `$data`; other dtypes give `UnsupportedDType` for input `$index`.
macro_rules! try_map_num {
    ($t:expr, $index:expr, $v:ident => $body:expr) => {
        match $t.data() {
            Data::F32($v) => $body.map(|v| Data::F32(kiln_tensor::Buf::from_vec(v))),
            Data::F64($v) => $body.map(|v| Data::F64(kiln_tensor::Buf::from_vec(v))),
            Data::F16($v) => $body.map(|v| Data::F16(kiln_tensor::Buf::from_vec(v))),
            Data::BF16($v) => $body.map(|v| Data::BF16(kiln_tensor::Buf::from_vec(v))),
            Data::I8($v) => $body.map(|v| Data::I8(kiln_tensor::Buf::from_vec(v))),
            Data::I16($v) => $body.map(|v| Data::I16(kiln_tensor::Buf::from_vec(v))),
            Data::I32($v) => $body.map(|v| Data::I32(kiln_tensor::Buf::from_vec(v))),
            Data::I64($v) => $body.map(|v| Data::I64(kiln_tensor::Buf::from_vec(v))),
            Data::U8($v) => $body.map(|v| Data::U8(kiln_tensor::Buf::from_vec(v))),
            Data::U16($v) => $body.map(|v| Data::U16(kiln_tensor::Buf::from_vec(v))),
            Data::U32($v) => $body.map(|v| Data::U32(kiln_tensor::Buf::from_vec(v))),
            Data::U64($v) => $body.map(|v| Data::U64(kiln_tensor::Buf::from_vec(v))),
            _ => Err(OpError::UnsupportedDType {
                index: $index,
                got: $t.dtype(),
            }),
        }
    };
}
pub(crate) use try_map_num;

/// The numeric element types (the op families' one numeric trait).
pub(crate) use crate::elementwise::scalar::Num;

/// A one-element tensor of `dtype` holding `v` (converted as a cast would).
pub(crate) fn scalar_of(dtype: DType, v: f64) -> Result<Tensor> {
    let data = match dtype {
        DType::F32 => Data::F32(vec![v as f32].into()),
        DType::F64 => Data::F64(vec![v].into()),
        DType::F16 => Data::F16(vec![f16::from_f64(v)].into()),
        DType::BF16 => Data::BF16(vec![bf16::from_f64(v)].into()),
        DType::I8 => Data::I8(vec![v as i8].into()),
        DType::I16 => Data::I16(vec![v as i16].into()),
        DType::I32 => Data::I32(vec![v as i32].into()),
        DType::I64 => Data::I64(vec![v as i64].into()),
        DType::U8 => Data::U8(vec![v as u8].into()),
        DType::U16 => Data::U16(vec![v as u16].into()),
        DType::U32 => Data::U32(vec![v as u32].into()),
        DType::U64 => Data::U64(vec![v as u64].into()),
        DType::Bool => Data::Bool(vec![v != 0.0].into()),
        DType::String => {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: DType::String,
            });
        }
        d if d.is_float() => Data::Coded(vec![kiln_tensor::formats::encode_float(d, v as f32, false)].into()),
        d => Data::Coded(vec![kiln_tensor::formats::encode_int(d, v)].into()),
    };
    Ok(Tensor::new(dtype, vec![1], data)?)
}

/// Appends the elements of `b` to `acc`; `false` (nothing appended) when their storage
/// variants differ.
pub(crate) fn extend_data(acc: &mut Data, b: &Data) -> bool {
    macro_rules! ext {
        ($($var:ident),*) => {
            match (acc, b) {
                $((Data::$var(a), Data::$var(b)) => { a.extend_from_slice(b); true })*
                _ => false,
            }
        };
    }
    ext!(
        F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64, Bool, Str, Coded
    )
}

/// All elements of `parts` one after another, as a 1-D tensor of their (common) dtype.
pub(crate) fn concat_flat(parts: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = parts.first() else {
        return Err(OpError::MissingInput { index: 0 });
    };
    let dtype = first.dtype();
    let mut data = first.data().clone();
    for p in &parts[1..] {
        if p.dtype() != dtype || !extend_data(&mut data, p.data()) {
            return Err(OpError::DTypeMismatch { a: dtype, b: p.dtype() });
        }
    }
    let n = data.len();
    Ok(Tensor::new(dtype, vec![n], data)?)
}

/// Builds a tensor of `shape` whose element `i` is `src[idx[i]]`, or `fill` (a one-element
/// tensor of the same dtype) where `idx[i]` is `None`.
pub(crate) fn gather_or_fill(src: &Tensor, fill: &Tensor, shape: Vec<usize>, idx: &[Option<usize>]) -> Result<Tensor> {
    let n = src.len();
    let ext = concat_flat(&[src, fill])?;
    let flat: Vec<usize> = idx.iter().map(|i| i.unwrap_or(n)).collect();
    Ok(ext.gather_flat(shape, &flat)?)
}

/// One zero (empty string, false) of `dtype`, as a one-element tensor.
pub(crate) fn zero_of(dtype: DType) -> Result<Tensor> {
    Ok(Tensor::zeros(dtype, vec![1])?)
}

/// Row-major multi-index of flat position `flat` in `shape`.
pub(crate) fn unravel(mut flat: usize, shape: &[usize], out: &mut [usize]) {
    for d in (0..shape.len()).rev() {
        let s = shape[d].max(1);
        out[d] = flat % s;
        flat /= s;
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> kiln_tensor::Shape {
    kiln_tensor::strides_of(shape)
}

/// Source indices of a transpose: element `i` of the output (of shape `shape[perm]`) is element
/// `idx[i]` of the input.
pub(crate) fn transpose_map(shape: &[usize], perm: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let n = crate::util::checked_numel(&out_shape)?;
    let in_strides = strides(shape);
    let st: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let mut idx = Vec::with_capacity(n);
    crate::util::for_each_offset(&out_shape, [&st], |[i]| idx.push(i));
    Ok((out_shape, idx))
}

/// Normalises an index along a dimension of `size` (negative counts from the end).
pub(crate) fn norm_index(i: i64, size: usize) -> Result<usize> {
    let s = size as i64;
    let j = if i < 0 { i + s } else { i };
    if j < 0 || j >= s {
        return Err(OpError::IndexOutOfRange { index: i, size });
    }
    Ok(j as usize)
}

/// Dims of a shape, inline to rank 6 (`Dim::Fixed` owns nothing, so a run-time shape
/// converts without allocating).
pub(crate) type DimVec = smallvec::SmallVec<[Dim; 6]>;

pub(crate) fn fixed_dims(s: &[usize]) -> DimVec {
    s.iter().map(|&d| Dim::Fixed(d)).collect()
}

/// The static shape of input `i`, when its rank is known.
pub(crate) fn in_shape(inputs: &[InferInput<'_>], i: usize) -> Option<Vec<Dim>> {
    inputs.get(i)?.ty.tensor()?.shape.clone()
}

pub(crate) fn tensor_type(dtype: Option<DType>, shape: Option<Vec<Dim>>) -> ValueType {
    ValueType::Tensor(TensorType { dtype, shape })
}

/// Product of dims: a number when all are fixed, the symbol when one symbol remains and the
/// fixed part is 1, otherwise unknown.
pub(crate) fn dim_product(dims: &[Dim]) -> Option<Dim> {
    let mut n: usize = 1;
    let mut sym = None;
    for d in dims {
        match d {
            Dim::Fixed(k) => n = n.checked_mul(*k)?,
            Dim::Sym(_) if sym.is_none() => sym = Some(d.clone()),
            Dim::Sym(_) => return None,
        }
    }
    match sym {
        None => Some(Dim::Fixed(n)),
        Some(s) if n == 1 => Some(s),
        Some(_) if n == 0 => Some(Dim::Fixed(0)),
        Some(_) => None,
    }
}

/// Reads an optional integer-list input, or the attribute form when the op holds one.
pub(crate) fn ints_from<'a>(
    attr: &'a Option<Vec<i64>>,
    args: &Args<'a>,
    i: usize,
    what: &str,
) -> Result<Option<std::borrow::Cow<'a, [i64]>>> {
    if let Some(a) = attr {
        return Ok(Some(std::borrow::Cow::Borrowed(a)));
    }
    match args.opt_tensor(i)? {
        Some(t) => Ok(Some(crate::util::read_i64s_cow(t, i, what)?)),
        None => Ok(None),
    }
}

/// Inference-time counterpart of [`ints_from`]: `Err(())` when the input is present but not a
/// constant.
pub(crate) fn const_ints(
    attr: &Option<Vec<i64>>,
    inputs: &[InferInput<'_>],
    i: usize,
) -> std::result::Result<Option<Vec<i64>>, ()> {
    if let Some(a) = attr {
        return Ok(Some(a.clone()));
    }
    let present = crate::util::present(inputs, i);
    match crate::util::const_tensor(inputs, i) {
        Some(t) => t.to_i64_vec().map(Some).ok_or(()),
        None if present => Err(()),
        None => Ok(None),
    }
}

pub(crate) fn one(v: Tensor) -> Result<crate::Outputs> {
    Ok(smallvec::smallvec![Value::Tensor(v)])
}
