//! Family module: sequence and optional ops (control flow over sequences, SequenceMap, lives in
//! the IR and runtime).
//!
//! - [SequenceEmpty](https://onnx.ai/onnx/operators/onnx__SequenceEmpty.html),
//!   [SequenceConstruct](https://onnx.ai/onnx/operators/onnx__SequenceConstruct.html),
//!   [SequenceInsert](https://onnx.ai/onnx/operators/onnx__SequenceInsert.html),
//!   [SequenceErase](https://onnx.ai/onnx/operators/onnx__SequenceErase.html),
//!   [SequenceAt](https://onnx.ai/onnx/operators/onnx__SequenceAt.html),
//!   [SequenceLength](https://onnx.ai/onnx/operators/onnx__SequenceLength.html),
//!   [SplitToSequence](https://onnx.ai/onnx/operators/onnx__SplitToSequence.html),
//!   [ConcatFromSequence](https://onnx.ai/onnx/operators/onnx__ConcatFromSequence.html):
//!   opset 11+.
//! - [Optional](https://onnx.ai/onnx/operators/onnx__Optional.html) (opset 15+),
//!   [OptionalHasElement](https://onnx.ai/onnx/operators/onnx__OptionalHasElement.html) and
//!   [OptionalGetElement](https://onnx.ai/onnx/operators/onnx__OptionalGetElement.html)
//!   (opset 15, and 18+ where they also accept plain tensors and sequences, and an absent input).

use crate::error::{OpError, Result};
use crate::util::{checked_numel, norm_axis, read_i64, read_i64s};
use crate::value::{Args, Dim, InferInput, Sequence, TensorType, Value, ValueType};
use kiln_tensor::{DType, Data, Tensor};

op_family! {
    /// The sequence and optional family.
    pub enum SequenceOp {
        SequenceEmpty(SequenceEmpty),
        SequenceConstruct(SequenceConstruct),
        SequenceInsert(SequenceInsert),
        SequenceErase(SequenceErase),
        SequenceAt(SequenceAt),
        SequenceLength(SequenceLength),
        SplitToSequence(SplitToSequence),
        ConcatFromSequence(ConcatFromSequence),
        Optional(OptionalOp) = |_: &OptionalOp| "Optional",
        OptionalHasElement(OptionalHasElement),
        OptionalGetElement(OptionalGetElement),
    }
}

/// An empty sequence of the given element type.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SequenceEmpty {
    pub dtype: DType,
}

/// A sequence of all the (tensor) inputs.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SequenceConstruct;

/// Inserts input 1 at position input 2 (default: at the end).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SequenceInsert;

/// Removes the element at position input 1 (default: the last).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SequenceErase;

/// The element at position input 1.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SequenceAt;

/// The number of elements, as an i64 scalar.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SequenceLength;

/// `Optional`: wraps input 0 in an optional, or makes an empty optional of `elem` when there
/// is none.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct OptionalOp {
    pub elem: ValueType,
}

/// Whether input 0 holds a value.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct OptionalHasElement;

/// The value an optional holds (a plain value passes through).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct OptionalGetElement;

/// Splits a tensor along an axis into a sequence.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SplitToSequence {
    pub axis: i64,
    /// Only applies when no `split` input is given: pieces of size 1 keep (or drop) the axis.
    pub keepdims: bool,
}

/// Concatenates (or, with `new_axis`, stacks) the tensors of a sequence.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ConcatFromSequence {
    pub axis: i64,
    pub new_axis: bool,
}

/// One output value.
fn one(v: Value) -> Result<crate::Outputs> {
    Ok(smallvec::smallvec![v])
}

/// The static type of input `i` (`Unknown` when absent).
fn ty(inputs: &[InferInput<'_>], i: usize) -> ValueType {
    inputs.get(i).map_or(ValueType::Unknown, |x| x.ty.clone())
}

/// A sequence of tensors of `dtype`.
fn seq_of(dtype: Option<DType>) -> ValueType {
    ValueType::Sequence(Box::new(ValueType::Tensor(TensorType::dtype_only(dtype))))
}

/// The element type of a sequence type.
fn elem_of(t: ValueType) -> ValueType {
    match t {
        ValueType::Sequence(e) => *e,
        _ => ValueType::Unknown,
    }
}

/// The element type of tensor input `i`.
fn tensor_dtype(inputs: &[InferInput<'_>], i: usize) -> Option<DType> {
    inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.dtype)
}

/// The element type of the tensors of sequence input `i`.
fn seq_dtype(inputs: &[InferInput<'_>], i: usize) -> Option<DType> {
    match ty(inputs, i) {
        ValueType::Sequence(e) => e.tensor().and_then(|t| t.dtype),
        _ => None,
    }
}

impl SequenceEmpty {
    pub fn eval(&self, _args: &Args<'_>) -> Result<crate::Outputs> {
        one(Value::Sequence(Sequence {
            dtype: Some(self.dtype),
            items: vec![],
        }))
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![seq_of(Some(self.dtype))])
    }
}

impl SequenceConstruct {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let items: Vec<Tensor> = args.tensors()?.into_iter().cloned().collect();
        let dtype = items.first().map(Tensor::dtype);
        check_dtypes(dtype, &items)?;
        one(Value::Sequence(Sequence { dtype, items }))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![seq_of(tensor_dtype(inputs, 0))])
    }
}

impl SequenceInsert {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let s = args.sequence(0)?;
        let t = args.tensor(1)?;
        if let Some(d) = s.dtype.filter(|&d| d != t.dtype()) {
            return Err(OpError::DTypeMismatch { a: d, b: t.dtype() });
        }
        let n = s.items.len();
        let pos = match args.opt_tensor(2)? {
            Some(p) => position(read_i64(p, 2, "position")?, n, true)?,
            None => n,
        };
        let mut items = s.items.clone();
        items.insert(pos, t.clone());
        one(Value::Sequence(Sequence {
            dtype: Some(t.dtype()),
            items,
        }))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![seq_of(seq_dtype(inputs, 0).or(tensor_dtype(inputs, 1)))])
    }
}

impl SequenceErase {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let s = args.sequence(0)?;
        let n = s.items.len();
        let pos = match args.opt_tensor(1)? {
            Some(p) => position(read_i64(p, 1, "position")?, n, false)?,
            None if n > 0 => n - 1,
            None => {
                return Err(OpError::input_value(0, "a non-empty sequence", "an empty one"));
            }
        };
        let mut items = s.items.clone();
        items.remove(pos);
        one(Value::Sequence(Sequence { dtype: s.dtype, items }))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![match ty(inputs, 0) {
            t @ ValueType::Sequence(_) => t,
            _ => seq_of(None),
        }])
    }
}

impl SequenceAt {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let s = args.sequence(0)?;
        let pos = position(read_i64(args.tensor(1)?, 1, "position")?, s.items.len(), false)?;
        let item = s.items.get(pos).ok_or_else(|| OpError::IndexOutOfRange {
            index: pos as i64,
            size: s.items.len(),
        })?;
        one(Value::Tensor(item.clone()))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![match elem_of(ty(inputs, 0)) {
            ValueType::Tensor(t) => ValueType::Tensor(t),
            _ => ValueType::Tensor(TensorType::dtype_only(seq_dtype(inputs, 0))),
        }])
    }
}

impl SequenceLength {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(Value::Tensor(Tensor::scalar(args.sequence(0)?.items.len() as i64)))
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![ValueType::Tensor(TensorType::fixed(DType::I64, &[]))])
    }
}

impl OptionalOp {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(match args.value(0) {
            Some(v) => Value::Optional(Some(Box::new(v.clone())), v.value_type()),
            None => Value::Optional(None, self.elem.clone()),
        })
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![
            if inputs.is_empty() || matches!(ty(inputs, 0), ValueType::Unknown) {
                ValueType::Optional(Box::new(self.elem.clone()))
            } else {
                ValueType::Optional(Box::new(ty(inputs, 0)))
            },
        ])
    }
}

impl OptionalHasElement {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let has = match args.value(0) {
            None | Some(Value::Optional(None, _)) => false,
            Some(_) => true,
        };
        one(Value::Tensor(Tensor::scalar(has)))
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![ValueType::Tensor(TensorType::fixed(DType::Bool, &[]))])
    }
}

impl OptionalGetElement {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(match args.value(0) {
            Some(Value::Optional(Some(v), _)) => (**v).clone(),
            Some(Value::Optional(None, _)) => {
                return Err(OpError::input_value(0, "an optional holding a value", "an empty one"));
            }
            Some(v) => v.clone(),
            None => return Err(OpError::MissingInput { index: 0 }),
        })
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![match ty(inputs, 0) {
            ValueType::Optional(inner) => *inner,
            other => other,
        }])
    }
}

/// Normalises a sequence position; `insert` allows `n` (append).
fn position(p: i64, n: usize, insert: bool) -> Result<usize> {
    let len = n as i64;
    let hi = if insert { len } else { len - 1 };
    let q = if p < 0 { p + len } else { p };
    if q < 0 || q > hi {
        return Err(OpError::IndexOutOfRange { index: p, size: n });
    }
    Ok(q as usize)
}

fn check_dtypes(dtype: Option<DType>, items: &[Tensor]) -> Result<()> {
    if let Some(d) = dtype
        && let Some(t) = items.iter().find(|t| t.dtype() != d)
    {
        return Err(OpError::DTypeMismatch { a: d, b: t.dtype() });
    }
    Ok(())
}

/// Most tensors SplitToSequence makes (a sequence of 2^20 tensor headers, 64 MiB; an empty
/// tensor may have an axis of any size).
const MAX_SPLIT_ITEMS: usize = 1 << 20;

/// Slice `[start, start + len)` of `t` along `axis`.
fn slice_axis(t: &Tensor, axis: usize, start: usize, len: usize, keep: bool) -> Result<Tensor> {
    let shape = t.shape();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let d = shape[axis];
    let n = outer
        .checked_mul(len)
        .and_then(|v| v.checked_mul(inner))
        .filter(|&v| v <= kiln_tensor::MAX_ELEMENTS)
        .ok_or_else(|| OpError::too_large("a split piece", format!("{outer} x {len} x {inner} elements")))?;
    let mut idx = Vec::with_capacity(n);
    for o in 0..outer {
        for a in start..start + len {
            let base = (o * d + a) * inner;
            idx.extend(base..base + inner);
        }
    }
    let mut out_shape = shape.to_vec();
    if keep {
        out_shape[axis] = len;
    } else {
        out_shape.remove(axis);
    }
    Ok(t.gather_flat(out_shape, &idx)?)
}

impl SplitToSequence {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.split(args)?)
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![seq_of(tensor_dtype(inputs, 0))])
    }

    fn split(&self, args: &Args<'_>) -> Result<Value> {
        let x = args.tensor(0)?;
        let rank = x.rank();
        let axis = norm_axis(self.axis, rank)?;
        let d = x.shape()[axis];
        let split = args.opt_tensor(1)?;
        let too_many =
            |n: usize| OpError::too_large("SplitToSequence pieces", format!("{n}, more than {MAX_SPLIT_ITEMS}"));
        let (sizes, keep): (Vec<usize>, bool) = match split {
            None if d > MAX_SPLIT_ITEMS => return Err(too_many(d)),
            None => (vec![1; d], self.keepdims),
            Some(s) if s.rank() == 0 => {
                let chunk = read_i64(s, 1, "split")?;
                if chunk < 1 {
                    return Err(OpError::input_value(1, "a split >= 1", chunk));
                }
                let chunk = usize::try_from(chunk).unwrap_or(usize::MAX);
                if d / chunk > MAX_SPLIT_ITEMS {
                    return Err(too_many(d / chunk));
                }
                let mut sizes = vec![chunk; d / chunk];
                if d % chunk != 0 {
                    sizes.push(d % chunk);
                }
                (sizes, true)
            }
            Some(s) => {
                let v = read_i64s(s, 1, "split")?;
                if v.iter().any(|&x| x < 0) {
                    return Err(OpError::input_value(1, "split sizes >= 0", format!("{v:?}")));
                }
                if v.len() > MAX_SPLIT_ITEMS {
                    return Err(too_many(v.len()));
                }
                let sizes: Vec<usize> = v.iter().map(|&x| x as usize).collect();
                // Summed without wrapping: [2^63, 2^63] must not pass for an axis of 0.
                if sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(d) {
                    return Err(OpError::input_value(
                        1,
                        format!("split sizes adding up to {d}, the axis' size"),
                        format!("{v:?}"),
                    ));
                }
                (sizes, true)
            }
        };
        let mut items = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for len in sizes {
            items.push(slice_axis(x, axis, start, len, keep)?);
            start += len;
        }
        Ok(Value::Sequence(Sequence {
            dtype: Some(x.dtype()),
            items,
        }))
    }
}

/// All elements of the tensors, one after the other, in one storage.
fn join_data(items: &[&Tensor]) -> Result<Data> {
    macro_rules! join {
        ($($var:ident),*) => {
            match items.first().map(|t| t.data()) {
                None => Err(OpError::input_value(0, "a non-empty sequence", "an empty one")),
                $(Some(Data::$var(_)) => {
                    let mut out = Vec::new();
                    for t in items {
                        match t.data() {
                            Data::$var(v) => out.extend_from_slice(v),
                            _ => return Err(OpError::DTypeMismatch { a: items[0].dtype(), b: t.dtype() }),
                        }
                    }
                    Ok(Data::$var(out.into()))
                })*
            }
        };
    }
    join!(
        F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64, Bool, Str, Coded
    )
}

impl ConcatFromSequence {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.concat(args)?)
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = seq_dtype(inputs, 0);
        // The rank follows from the element rank when it is known.
        let rank = match elem_of(ty(inputs, 0)) {
            ValueType::Tensor(t) => t.rank(),
            _ => None,
        };
        let shape = rank.map(|r| {
            let r = if self.new_axis { r + 1 } else { r };
            (0..r).map(|_| Dim::fresh()).collect()
        });
        Ok(vec![ValueType::Tensor(TensorType { dtype, shape })])
    }

    fn concat(&self, args: &Args<'_>) -> Result<Value> {
        let s = args.sequence(0)?;
        let first = s
            .items
            .first()
            .ok_or_else(|| OpError::input_value(0, "a non-empty sequence", "an empty one"))?;
        check_dtypes(Some(first.dtype()), &s.items)?;
        let rank = first.rank();
        // With new_axis each element gets a unit axis inserted first, then they concatenate.
        let out_rank = if self.new_axis { rank + 1 } else { rank };
        let axis = norm_axis(self.axis, out_rank)?;
        let shapes: Vec<Vec<usize>> = s
            .items
            .iter()
            .map(|t| {
                let mut sh = t.shape().to_vec();
                if self.new_axis {
                    sh.insert(axis, 1);
                }
                sh
            })
            .collect();
        let base = &shapes[0];
        for sh in &shapes {
            let same = sh.len() == base.len() && sh.iter().zip(base).enumerate().all(|(i, (a, b))| i == axis || a == b);
            if !same {
                return Err(OpError::input_value(
                    0,
                    format!("elements whose shapes agree off axis {axis}"),
                    format!("shapes {base:?} and {sh:?}"),
                ));
            }
        }
        let mut out_shape = base.clone();
        out_shape[axis] = shapes.iter().map(|sh| sh[axis]).sum();
        let total = checked_numel(&out_shape)?;
        let outer: usize = base[..axis].iter().product();
        let inner: usize = base[axis + 1..].iter().product();
        let mut offsets = Vec::with_capacity(shapes.len());
        let mut off = 0;
        for t in &s.items {
            offsets.push(off);
            off += t.len();
        }
        let mut idx = Vec::with_capacity(total);
        for o in 0..outer {
            for (sh, &off) in shapes.iter().zip(&offsets) {
                let chunk = sh[axis] * inner;
                let start = off + o * chunk;
                idx.extend(start..start + chunk);
            }
        }
        let refs: Vec<&Tensor> = s.items.iter().collect();
        let all = Tensor::new(first.dtype(), vec![off], join_data(&refs)?)?;
        Ok(Value::Tensor(all.gather_flat(out_shape, &idx)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }
    fn eval(op: &SequenceOp, inputs: &[Option<&Value>]) -> Value {
        op.eval(&Args::new(inputs)).unwrap().remove(0)
    }
    fn seq(v: &Value) -> &Sequence {
        match v {
            Value::Sequence(s) => s,
            _ => panic!("not a sequence"),
        }
    }

    /// Fuzz finding (load_program): split sizes [2^63, 2^63] summed (wrapping) to an empty
    /// axis' 0, then a piece of 2^63 elements overflowed the capacity. Both are errors now, and
    /// so is an empty axis of 2^40 split in ones.
    #[test]
    fn split_sizes_never_wrap_or_blow_up() {
        let op = SequenceOp::SplitToSequence(SplitToSequence {
            axis: 1,
            keepdims: true,
        });
        let x = Value::Tensor(Tensor::zeros(DType::F32, vec![3, 0]).unwrap());
        let split = Value::Tensor(Tensor::from_vec(vec![2], vec![1i64 << 62, 3 << 62]).unwrap());
        assert!(op.eval(&Args::new(&[Some(&x), Some(&split)])).is_err());
        let wide = Value::Tensor(Tensor::zeros(DType::F32, vec![0, 1 << 40]).unwrap());
        match op.eval(&Args::new(&[Some(&wide)])) {
            Err(OpError::TooLarge { .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn insert_erase_at() {
        let a = Value::Tensor(t(&[1], vec![1.0]));
        let b = Value::Tensor(t(&[1], vec![2.0]));
        let c = Value::Tensor(t(&[2], vec![3.0, 4.0]));
        let s = eval(&SequenceOp::SequenceConstruct(SequenceConstruct), &[Some(&a), Some(&b)]);
        let front = Value::Tensor(Tensor::from_vec(vec![1], vec![0i64]).unwrap());
        let s = eval(
            &SequenceOp::SequenceInsert(SequenceInsert),
            &[Some(&s), Some(&c), Some(&front)],
        );
        assert_eq!(seq(&s).items.len(), 3);
        let last = Value::Tensor(Tensor::scalar(-1i64));
        let at = eval(&SequenceOp::SequenceAt(SequenceAt), &[Some(&s), Some(&last)]);
        assert_eq!(at.as_tensor().unwrap().as_slice::<f32>().unwrap(), &[2.0]);
        let s = eval(&SequenceOp::SequenceErase(SequenceErase), &[Some(&s), Some(&front)]);
        let n = eval(&SequenceOp::SequenceLength(SequenceLength), &[Some(&s)]);
        assert_eq!(n.as_tensor().unwrap().as_slice::<i64>().unwrap(), &[2]);
        let far = Value::Tensor(Tensor::scalar(2i64));
        assert!(
            SequenceOp::SequenceAt(SequenceAt)
                .eval(&Args::new(&[Some(&s), Some(&far)]))
                .is_err()
        );
    }

    #[test]
    fn split_and_concat_round_trip() {
        let x = Value::Tensor(t(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let two = Value::Tensor(Tensor::scalar(2i64));
        let op = SequenceOp::SplitToSequence(SplitToSequence {
            axis: 1,
            keepdims: true,
        });
        let s = eval(&op, &[Some(&x), Some(&two)]);
        let items = &seq(&s).items;
        assert_eq!(items[0].shape(), &[2, 2]);
        assert_eq!(items[0].as_slice::<f32>().unwrap(), &[1.0, 2.0, 4.0, 5.0]);
        assert_eq!(items[1].as_slice::<f32>().unwrap(), &[3.0, 6.0]);
        let cat = SequenceOp::ConcatFromSequence(ConcatFromSequence {
            axis: 1,
            new_axis: false,
        });
        assert_eq!(eval(&cat, &[Some(&s)]), x);
        // No split, keepdims=0: rows of shape [3]; stacking them on a new last axis transposes.
        let op = SequenceOp::SplitToSequence(SplitToSequence {
            axis: 0,
            keepdims: false,
        });
        let s = eval(&op, &[Some(&x)]);
        assert_eq!(seq(&s).items[1].shape(), &[3]);
        let stack = SequenceOp::ConcatFromSequence(ConcatFromSequence {
            axis: -1,
            new_axis: true,
        });
        let y = eval(&stack, &[Some(&s)]);
        assert_eq!(y, Value::Tensor(t(&[3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0])));
    }

    #[test]
    fn optionals() {
        let x = Value::Tensor(t(&[1], vec![1.0]));
        let ty = ValueType::Tensor(TensorType::dtype_only(Some(DType::F32)));
        let empty = eval(&SequenceOp::Optional(OptionalOp { elem: ty.clone() }), &[]);
        assert_eq!(empty, Value::Optional(None, ty.clone()));
        let full = eval(&SequenceOp::Optional(OptionalOp { elem: ty }), &[Some(&x)]);
        let has = |v: Option<&Value>| eval(&SequenceOp::OptionalHasElement(OptionalHasElement), &[v]);
        assert_eq!(has(Some(&full)), Value::Tensor(Tensor::scalar(true)));
        assert_eq!(has(Some(&empty)), Value::Tensor(Tensor::scalar(false)));
        assert_eq!(has(None), Value::Tensor(Tensor::scalar(false)));
        assert_eq!(
            eval(&SequenceOp::OptionalGetElement(OptionalGetElement), &[Some(&full)]),
            x
        );
        assert!(
            SequenceOp::OptionalGetElement(OptionalGetElement)
                .eval(&Args::new(&[Some(&empty)]))
                .is_err()
        );
    }
}
