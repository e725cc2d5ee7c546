//! Shape-level ops: Reshape, Shape, Size, Flatten, Squeeze, Unsqueeze, Expand,
//! ConstantOfShape, Range, Identity, EyeLike.

use super::*;
use crate::util::{checked_numel, const_tensor, input_dtype, norm_axes, read_i64, read_i64s};

/// ONNX `Reshape` (opsets 1-25). `shape` holds the opset-1..4 attribute; later opsets read
/// input 1. `allowzero` (opset 14) makes a 0 mean a zero-size dim instead of "copy".
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Reshape {
    pub shape: Option<Vec<i64>>,
    pub allowzero: bool,
}

/// A Reshape target that does not fit: the `shape` attribute's (opsets < 5) or input 1's.
fn bad_spec(from_attr: bool, expected: String, spec: &[i64]) -> OpError {
    match from_attr {
        true => OpError::attribute("shape", expected, format!("{spec:?}")),
        false => OpError::input_value(1, expected, format!("{spec:?}")),
    }
}

/// The target shape of a Reshape of `input` (dims possibly symbolic) to `spec` (the attribute
/// when `from_attr`, else input 1). Inline vectors throughout: at run time (all dims fixed) it
/// allocates nothing.
fn reshape_dims(input: &[Dim], spec: &[i64], allowzero: bool, from_attr: bool) -> Result<Option<DimVec>> {
    let bad = |expected: String| bad_spec(from_attr, expected, spec);
    let mut out: smallvec::SmallVec<[Option<Dim>; 6]> = smallvec::SmallVec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            0 if !allowzero => {
                let d = input.get(i).ok_or_else(|| {
                    bad(format!(
                        "a 0 (copy the dim) only where input 0 has a dim, at most rank {}",
                        input.len()
                    ))
                })?;
                out.push(Some(d.clone()));
            }
            -1 => {
                if infer_at.is_some() {
                    return Err(bad("at most one -1".into()));
                }
                infer_at = Some(i);
                out.push(None);
            }
            s if s < 0 => {
                return Err(bad("dims >= -1".into()));
            }
            s => out.push(Some(Dim::Fixed(s as usize))),
        }
    }
    if let Some(at) = infer_at {
        if allowzero && spec.contains(&0) {
            return Err(bad("no 0 beside a -1 under allowzero".into()));
        }
        // Cancel symbols present on both sides, then divide the fixed parts.
        let mut in_syms: smallvec::SmallVec<[&Dim; 6]> = smallvec::SmallVec::new();
        let mut in_fixed: usize = 1;
        for d in input {
            match d {
                Dim::Fixed(n) => in_fixed = in_fixed.saturating_mul(*n),
                s => in_syms.push(s),
            }
        }
        let mut out_fixed: usize = 1;
        for d in out.iter().flatten() {
            match d {
                Dim::Fixed(n) => out_fixed = out_fixed.saturating_mul(*n),
                s => match in_syms.iter().position(|x| *x == s) {
                    Some(p) => {
                        in_syms.remove(p);
                    }
                    None => return Ok(None),
                },
            }
        }
        let d = if in_fixed == 0 && in_syms.is_empty() {
            if out_fixed == 0 {
                return Err(bad("no -1 beside a 0-sized dim (the -1 would be ambiguous)".into()));
            }
            Dim::Fixed(0)
        } else {
            if out_fixed == 0 || !in_fixed.is_multiple_of(out_fixed) {
                if in_syms.is_empty() {
                    return Err(bad(format!("a shape of input 0's {in_fixed} elements")));
                }
                return Ok(None);
            }
            let k = in_fixed / out_fixed;
            match in_syms.as_slice() {
                [] => Dim::Fixed(k),
                [s] if k == 1 => (*s).clone(),
                _ => return Ok(None),
            }
        };
        out[at] = Some(d);
    }
    let out: DimVec = out.into_iter().flatten().collect();
    if let (Some(a), Some(b)) = (fixed_of(input), fixed_of(&out)) {
        let n = checked_numel(&a)?;
        if n != checked_numel(&b)? {
            return Err(bad(format!("a shape of input 0's {n} elements")));
        }
    }
    Ok(Some(out))
}

pub(crate) fn fixed_of(d: &[Dim]) -> Option<kiln_tensor::Shape> {
    d.iter()
        .map(|d| if let Dim::Fixed(n) = d { Some(*n) } else { None })
        .collect()
}

impl Reshape {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(args.tensor(0)?.clone().reshape(self.view_shape(args)?)?)
    }
    /// The output's shape (the output is input 0's elements under it).
    pub fn view_shape(&self, args: &Args<'_>) -> Result<kiln_tensor::Shape> {
        let x = args.tensor(0)?;
        let spec = match &self.shape {
            Some(s) => std::borrow::Cow::Borrowed(s.as_slice()),
            None => crate::util::read_i64s_cow(args.tensor(1)?, 1, "shape")?,
        };
        let from_attr = self.shape.is_some();
        reshape_dims(&fixed_dims(x.shape()), &spec, self.allowzero, from_attr)?
            .and_then(|d| fixed_of(&d))
            .ok_or_else(|| bad_spec(from_attr, format!("a shape of input 0's {} elements", x.len()), &spec))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let spec = match &self.shape {
            Some(s) => Some(s.clone()),
            None => const_tensor(inputs, 1).map(|t| read_i64s(t, 1, "shape")).transpose()?,
        };
        let shape = match (spec, in_shape(inputs, 0)) {
            (Some(spec), Some(input)) => {
                reshape_dims(&input, &spec, self.allowzero, self.shape.is_some())?.map(DimVec::into_vec)
            }
            // Without the input shape, only a spec free of 0 and -1 decides the output.
            (Some(spec), None) if spec.iter().all(|&s| s > 0 || (s == 0 && self.allowzero)) => {
                Some(spec.iter().map(|&s| Dim::Fixed(s as usize)).collect())
            }
            _ => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `Shape` (opsets 1-25); `start`/`end` (opset 15) select a clamped range of dims.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Shape {
    pub start: i64,
    pub end: Option<i64>,
}

impl Shape {
    fn range(&self, rank: usize) -> (usize, usize) {
        let r = rank as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let s = clamp(self.start);
        let e = self.end.map_or(rank, clamp);
        (s, e.max(s))
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let (s, e) = self.range(x.rank());
        let v: Vec<i64> = x.shape()[s..e].iter().map(|&d| d as i64).collect();
        one(Tensor::from_vec(vec![v.len()], v)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = in_shape(inputs, 0).map(|s| {
            let (a, b) = self.range(s.len());
            vec![Dim::Fixed(b - a)]
        });
        Ok(vec![tensor_type(Some(DType::I64), shape)])
    }
    /// The output value when the selected input dims are all fixed.
    pub fn fold_static(&self, inputs: &[InferInput<'_>]) -> Option<Value> {
        let dims = inputs.first()?.ty.tensor()?.shape.as_ref()?;
        let (a, b) = self.range(dims.len());
        let v: Vec<i64> = dims[a..b]
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Some(*n as i64),
                Dim::Sym(_) => None,
            })
            .collect::<Option<_>>()?;
        Tensor::from_vec(vec![v.len()], v).ok().map(Value::Tensor)
    }
}

/// ONNX `Size` (opsets 1-25): the element count as an i64 scalar.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Size;

impl Size {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(Tensor::scalar(args.tensor(0)?.len() as i64))
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![ValueType::Tensor(TensorType::fixed(DType::I64, &[]))])
    }
    /// The element count when every input dim is fixed.
    pub fn fold_static(&self, inputs: &[InferInput<'_>]) -> Option<Value> {
        let n = inputs
            .first()?
            .ty
            .tensor()?
            .fixed_shape()?
            .iter()
            .try_fold(1i64, |acc, &d| acc.checked_mul(d as i64))?;
        Some(Value::Tensor(Tensor::scalar(n)))
    }
}

/// ONNX `Flatten` (opsets 1-25): to 2-D, splitting the dims at `axis` (in `[-r, r]`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Flatten {
    pub axis: i64,
}

impl Flatten {
    fn split(&self, rank: usize) -> Result<usize> {
        let r = rank as i64;
        let a = if self.axis < 0 { self.axis + r } else { self.axis };
        if a < 0 || a > r {
            return Err(OpError::Axis { axis: self.axis, rank });
        }
        Ok(a as usize)
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(args.tensor(0)?.clone().reshape(self.view_shape(args)?)?)
    }
    /// The output's shape (the output is input 0's elements under it).
    pub fn view_shape(&self, args: &Args<'_>) -> Result<kiln_tensor::Shape> {
        let x = args.tensor(0)?;
        let a = self.split(x.rank())?;
        let outer: usize = x.shape()[..a].iter().product();
        let inner: usize = x.shape()[a..].iter().product();
        Ok(kiln_tensor::smallvec::smallvec![outer, inner])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = match in_shape(inputs, 0) {
            Some(s) => {
                let a = self.split(s.len())?;
                match (dim_product(&s[..a]), dim_product(&s[a..])) {
                    (Some(x), Some(y)) => Some(vec![x, y]),
                    _ => None,
                }
            }
            None => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `Squeeze` (opsets 1-25): `axes` is an attribute before opset 13, input 1 after;
/// without axes every size-1 dim goes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Squeeze {
    pub axes: Option<Vec<i64>>,
}

/// The squeezed shape; `axes` are the attribute's when `from_attr`, else input 1's.
fn squeeze_dims(shape: &[Dim], axes: Option<&[i64]>, from_attr: bool) -> Result<Option<DimVec>> {
    match axes {
        Some(axes) => {
            let ax = norm_axes(axes, shape.len())?;
            for (&a, &given) in ax.iter().zip(axes) {
                if let Dim::Fixed(n) = shape[a]
                    && n != 1
                {
                    let expected = "axes of dims of size 1";
                    let got = format!("axis {given}, of size {n}");
                    return Err(match from_attr {
                        true => OpError::attribute("axes", expected, got),
                        false => OpError::input_value(1, expected, got),
                    });
                }
            }
            Ok(Some(
                shape
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !ax.contains(i))
                    .map(|(_, d)| d.clone())
                    .collect(),
            ))
        }
        None => {
            if shape.iter().any(|d| matches!(d, Dim::Sym(_))) {
                return Ok(None);
            }
            Ok(Some(shape.iter().filter(|d| **d != Dim::Fixed(1)).cloned().collect()))
        }
    }
}

impl Squeeze {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(args.tensor(0)?.clone().reshape(self.view_shape(args)?)?)
    }
    /// The output's shape (the output is input 0's elements under it).
    pub fn view_shape(&self, args: &Args<'_>) -> Result<kiln_tensor::Shape> {
        let x = args.tensor(0)?;
        let axes = ints_from(&self.axes, args, 1, "axes")?;
        let dims =
            squeeze_dims(&fixed_dims(x.shape()), axes.as_deref(), self.axes.is_some())?.and_then(|d| fixed_of(&d));
        // Fixed dims always give a shape.
        dims.ok_or_else(|| OpError::input_shape(0, "fixed dims", x.shape()))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = match (const_ints(&self.axes, inputs, 1), in_shape(inputs, 0)) {
            (Ok(axes), Some(s)) => squeeze_dims(&s, axes.as_deref(), self.axes.is_some())?.map(DimVec::into_vec),
            _ => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `Unsqueeze` (opsets 1-25): `axes` (positions in the output) is an attribute before
/// opset 13, input 1 after.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Unsqueeze {
    pub axes: Option<Vec<i64>>,
}

fn unsqueeze_dims(shape: &[Dim], axes: &[i64]) -> Result<DimVec> {
    let rank = shape.len() + axes.len();
    let ax = norm_axes(axes, rank)?;
    let mut src = shape.iter();
    let mut out = DimVec::with_capacity(rank);
    for i in 0..rank {
        if ax.contains(&i) {
            out.push(Dim::Fixed(1));
        } else {
            // norm_axes leaves exactly shape.len() positions to fill.
            let axis = i as i64;
            out.push(src.next().cloned().ok_or(OpError::Axis { axis, rank })?);
        }
    }
    Ok(out)
}

impl Unsqueeze {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(args.tensor(0)?.clone().reshape(self.view_shape(args)?)?)
    }
    /// The output's shape (the output is input 0's elements under it).
    pub fn view_shape(&self, args: &Args<'_>) -> Result<kiln_tensor::Shape> {
        let x = args.tensor(0)?;
        let axes = ints_from(&self.axes, args, 1, "axes")?.ok_or(OpError::MissingInput { index: 1 })?;
        Ok(fixed_of(&unsqueeze_dims(&fixed_dims(x.shape()), &axes)?).unwrap_or_default())
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = match (const_ints(&self.axes, inputs, 1), in_shape(inputs, 0)) {
            (Ok(Some(axes)), Some(s)) => Some(unsqueeze_dims(&s, &axes)?.into_vec()),
            _ => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `Expand` (opsets 8-13): bidirectional broadcast of the input to input 1's shape.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Expand;

/// The elements of `x` read with `strides` (0 on broadcast dims) over `shape`, in order, in a
/// recycled buffer of `n` elements: runs along the last dim are copied (or filled, when that
/// dim is broadcast).
fn expand_into<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element>(
    x: &[T],
    shape: &[usize],
    strides: &[usize],
    n: usize,
) -> kiln_tensor::Buf<T> {
    let mut out = crate::util::out_buf::<T>(n);
    let (Some((&inner, outer)), Some((&step, outer_strides))) = (shape.split_last(), strides.split_last()) else {
        // A scalar output.
        if let (Some(o), Some(&v)) = (out.first_mut(), x.first()) {
            *o = v;
        }
        return out;
    };
    if n == 0 || inner == 0 {
        return out;
    }
    let mut dst = out.chunks_exact_mut(inner);
    crate::util::for_each_offset(outer, [outer_strides], |[base]| {
        let Some(dst) = dst.next() else { return };
        if step == 0 {
            dst.fill(x.get(base).copied().unwrap_or_default());
        } else if let Some(src) = x.get(base..base + inner) {
            dst.copy_from_slice(src);
        }
    });
    out
}

impl Expand {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let spec = crate::util::read_i64s_cow(args.tensor(1)?, 1, "shape")?;
        let spec: kiln_tensor::Shape = spec
            .iter()
            .map(|&d| crate::util::dim(d, 1, "shape"))
            .collect::<Result<_>>()?;
        let out = kiln_tensor::broadcast_shapes(x.shape(), &spec)?;
        let n = checked_numel(&out)?;
        // Element types the arena recycles: a walk over the output with the input's broadcast
        // strides, into a recycled buffer. Others: through an index map.
        let strides = crate::util::broadcast_strides(x.shape(), &out, 0)?;
        match x.data() {
            Data::F32(v) => return one(Tensor::from_buf(out.clone(), expand_into(v, &out, &strides, n))?),
            Data::I64(v) => return one(Tensor::from_buf(out.clone(), expand_into(v, &out, &strides, n))?),
            Data::Bool(v) => return one(Tensor::from_buf(out.clone(), expand_into(v, &out, &strides, n))?),
            _ => {}
        }
        let idx = crate::util::broadcast_map(x.shape(), &out, 0)?;
        one(x.gather_flat(out, &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = match (const_tensor(inputs, 1), in_shape(inputs, 0)) {
            (Some(t), Some(s)) => {
                let spec = read_i64s(t, 1, "shape")?;
                let spec: Vec<Dim> = spec
                    .iter()
                    .map(|&d| crate::util::dim(d, 1, "shape").map(Dim::Fixed))
                    .collect::<Result<_>>()?;
                crate::util::broadcast_dims(&s, &spec)
            }
            _ => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `ConstantOfShape` (opsets 9-25): a tensor of input 0's shape filled with `value`
/// (one element; f32 0 by default).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ConstantOfShape {
    pub value: Option<Tensor>,
}

impl ConstantOfShape {
    fn value(&self) -> Result<Tensor> {
        match &self.value {
            Some(v) if v.len() == 1 => Ok(v.clone()),
            Some(v) => Err(OpError::attribute(
                "value",
                "one element",
                format!("shape {:?}", v.shape()),
            )),
            None => Ok(Tensor::scalar(0f32)),
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let spec = read_i64s(args.tensor(0)?, 0, "shape")?;
        let shape: Vec<usize> = spec
            .iter()
            .map(|&d| crate::util::dim(d, 0, "shape"))
            .collect::<Result<_>>()?;
        checked_numel(&shape)?;
        one(self.value()?.filled(shape)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = Some(self.value.as_ref().map_or(DType::F32, |v| v.dtype()));
        let shape = if let Some(t) = const_tensor(inputs, 0) {
            let spec = read_i64s(t, 0, "shape")?;
            Some(
                spec.iter()
                    .map(|&d| crate::util::dim(d, 0, "shape").map(Dim::Fixed))
                    .collect::<Result<_>>()?,
            )
        } else {
            // An empty shape input gives a scalar.
            match in_shape(inputs, 0).as_deref() {
                Some([Dim::Fixed(0)]) => Some(vec![]),
                _ => None,
            }
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// ONNX `Range` (opsets 11-27): `start + i * delta` for `i < max(ceil((limit - start) /
/// delta), 0)`. Computed in f64 for float types (the reference's precision for every
/// `stash_type`), exactly for integers.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Range;

fn range_len(start: f64, limit: f64, delta: f64) -> Result<usize> {
    if delta == 0.0 {
        return Err(OpError::input_value(2, "a delta other than 0", 0));
    }
    let n = ((limit - start) / delta).ceil();
    if n.is_nan() {
        // A NaN bound, or infinite start and limit (their difference is undefined).
        let index = [start, limit, delta].iter().position(|v| v.is_nan()).unwrap_or(1);
        return Err(OpError::input_value(
            index,
            "bounds giving a defined length",
            format!("start {start}, limit {limit}, delta {delta}"),
        ));
    }
    let n = n.max(0.0);
    if n > kiln_tensor::MAX_ELEMENTS as f64 {
        return Err(OpError::too_large("range of", format!("{n} elements")));
    }
    Ok(n as usize)
}

impl Range {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (s, l, d) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let dtype = s.dtype();
        for t in [l, d] {
            if t.dtype() != dtype {
                return Err(OpError::DTypeMismatch { a: dtype, b: t.dtype() });
            }
        }
        for (i, t) in [s, l, d].iter().enumerate() {
            if t.len() != 1 {
                return Err(OpError::input_shape(i, "one element", t.shape()));
            }
        }
        if dtype.is_int() && !dtype.is_byte_coded() {
            let (s, l, d) = (
                read_i64(s, 0, "start")?,
                read_i64(l, 1, "limit")?,
                read_i64(d, 2, "delta")?,
            );
            if d == 0 {
                return Err(OpError::input_value(2, "a delta other than 0", 0));
            }
            let span = (l as i128) - (s as i128);
            let d128 = d as i128;
            let n = if (span > 0 && d128 > 0) || (span < 0 && d128 < 0) {
                (span + d128 - d128.signum()) / d128
            } else {
                0
            };
            if n > kiln_tensor::MAX_ELEMENTS as i128 {
                return Err(OpError::too_large("range of", format!("{n} elements")));
            }
            let v: Vec<i64> = (0..n as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect();
            let t = Tensor::from_vec(vec![v.len()], v)?;
            return one(cast_i64(&t, dtype)?);
        }
        let (s, l, d) = (s.to_f64_vec()[0], l.to_f64_vec()[0], d.to_f64_vec()[0]);
        let n = range_len(s, l, d)?;
        let v: Vec<f64> = (0..n).map(|i| s + i as f64 * d).collect();
        let data = match dtype {
            DType::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => Data::F64(v.into()),
            DType::F16 => Data::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => Data::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            d => return Err(OpError::UnsupportedDType { index: 0, got: d }),
        };
        one(Tensor::new(dtype, vec![n], data)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = match (
            const_tensor(inputs, 0),
            const_tensor(inputs, 1),
            const_tensor(inputs, 2),
        ) {
            (Some(s), Some(l), Some(d)) => {
                let args = [
                    Value::Tensor(s.clone()),
                    Value::Tensor(l.clone()),
                    Value::Tensor(d.clone()),
                ];
                let refs: Vec<Option<&Value>> = args.iter().map(Some).collect();
                let out = self.eval(&Args::new(&refs))?;
                out.first()
                    .and_then(|v| v.as_tensor())
                    .map(|t| fixed_dims(t.shape()).into_vec())
            }
            _ => None,
        };
        Ok(vec![tensor_type(dtype, shape)])
    }
}

/// Converts an i64 tensor to another integer dtype (wrapping).
fn cast_i64(t: &Tensor, dtype: DType) -> Result<Tensor> {
    let v = t.as_slice::<i64>()?;
    let data = match dtype {
        DType::I64 => Data::I64(v.to_vec().into()),
        DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        DType::I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
        DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
        DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        DType::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        DType::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
        DType::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
        d => return Err(OpError::UnsupportedDType { index: 0, got: d }),
    };
    Ok(Tensor::new(dtype, t.shape(), data)?)
}

/// ONNX `Identity` (opsets 1-25): passes any value (tensor, sequence, optional) through.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Identity;

impl Identity {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let v = args.value(0).ok_or(OpError::MissingInput { index: 0 })?;
        Ok(smallvec::smallvec![v.clone()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![crate::util::input_type(inputs, 0)])
    }
}

/// ONNX `EyeLike` (opsets 9-22): a 2-D tensor of input 0's shape with ones on diagonal `k`,
/// of `dtype` (default: the input's).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct EyeLike {
    pub dtype: Option<DType>,
    pub k: i64,
}

impl EyeLike {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let dtype = self.dtype.unwrap_or(x.dtype());
        let (r, c) = match *x.shape() {
            [n] => (n, n),
            [r, c] => (r, c),
            _ => {
                return Err(OpError::input_shape(0, "a 1-D or 2-D input", x.shape()));
            }
        };
        let vals = concat_flat(&[&scalar_of(dtype, 0.0)?, &scalar_of(dtype, 1.0)?])?;
        let n = checked_numel(&[r, c])?;
        let idx: Vec<usize> = (0..n)
            .map(|i| ((i % c.max(1)) as i64 - (i / c.max(1)) as i64 == self.k) as usize)
            .collect();
        one(vals.gather_flat(vec![r, c], &idx)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = self.dtype.or(input_dtype(inputs, 0));
        let shape = in_shape(inputs, 0).map(|s| {
            if s.len() == 1 {
                vec![s[0].clone(), s[0].clone()]
            } else {
                s
            }
        });
        Ok(vec![tensor_type(dtype, shape)])
    }
}
