//! Elementwise ops with other arities: the variadic Sum/Mean/Max/Min, Clip, Where and PRelu.
//!
//! ONNX operators (<https://onnx.ai/onnx/operators/>): Sum, Mean, Max, Min (opsets 1-13, with
//! broadcasting from opset 8), Clip (opsets 1-13: bounds as attributes before 11, as optional
//! inputs since), Where (9-16), PRelu (1-16).

use super::binary::Bcast;
use super::scalar::{Num, map_same2, nan_max, nan_min, with_num, with_num2};
use crate::error::{OpError, Result};
use crate::util::{checked_numel, for_each_offset};
use kiln_tensor::{Data, Element, Tensor, broadcast_shapes, numel};

/// Sum, Mean, Max or Min of one or more broadcast inputs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum VariadicOp {
    Sum,
    Mean,
    /// NaN-propagating, as numpy `maximum`.
    Max,
    Min,
}

impl VariadicOp {
    pub fn name(&self) -> &'static str {
        match self {
            VariadicOp::Sum => "Sum",
            VariadicOp::Mean => "Mean",
            VariadicOp::Max => "Max",
            VariadicOp::Min => "Min",
        }
    }

    pub fn apply(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let (first, rest) = inputs.split_first().ok_or(OpError::MissingInput { index: 0 })?;
        let dt = first.dtype();
        if !(dt.is_int() || dt.is_float()) || dt.is_byte_coded() {
            return Err(OpError::UnsupportedDType { index: 0, got: dt });
        }
        let mut acc: Tensor = (*first).clone();
        for t in rest {
            if t.dtype() != dt {
                return Err(OpError::DTypeMismatch { a: dt, b: t.dtype() });
            }
            let m = Bcast::new(acc.shape(), t.shape())?;
            let data = with_num2!(acc.data(), t.data(), (x, y) => Element::wrap(self.combine(x, y, &m)),
                else return Err(OpError::UnsupportedDType { index: 0, got: dt }));
            acc = Tensor::new(dt, m.shape, data)?;
        }
        if *self == VariadicOp::Mean && inputs.len() > 1 {
            let n = inputs.len() as f64;
            let (dt, shape, data) = acc.into_parts();
            let data = with_num!(&data, v => Element::wrap(mean_div(v, n)),
                else return Err(OpError::UnsupportedDType { index: 0, got: dt }));
            acc = Tensor::new(dt, shape, data)?;
        }
        Ok(acc)
    }

    fn combine<T: Num>(&self, x: &[T], y: &[T], m: &Bcast) -> Vec<T> {
        match self {
            VariadicOp::Sum | VariadicOp::Mean => m.zip(x, y, T::add),
            VariadicOp::Max => m.zip(x, y, nan_max),
            VariadicOp::Min => m.zip(x, y, nan_min),
        }
    }
}

fn mean_div<T: Num>(v: &[T], n: f64) -> Vec<T> {
    if T::FLOAT {
        let d = T::from_f64(n);
        v.iter().map(|&a| a.div(d)).collect()
    } else {
        v.iter().map(|&a| T::from_f64(a.to_f64() / n)).collect()
    }
}

/// Clip: bounds as attributes (opset < 11; `None` where absent); from opset 11 they are the
/// optional inputs 1 and 2 and both fields are `None`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub struct Clip {
    pub min: Option<f32>,
    pub max: Option<f32>,
}

impl Clip {
    /// `min(max(x, lo), hi)` (so `hi` wins when `lo > hi`, as numpy's clip); NaN stays NaN.
    pub fn apply(&self, x: &Tensor, lo: Option<&Tensor>, hi: Option<&Tensor>) -> Result<Tensor> {
        let dt = x.dtype();
        for (i, b) in [(1, lo), (2, hi)] {
            if let Some(b) = b {
                if b.dtype() != dt {
                    return Err(OpError::DTypeMismatch { a: dt, b: b.dtype() });
                }
                if b.len() != 1 {
                    return Err(OpError::input_shape(i, "one element", b.shape()));
                }
            }
        }
        let data = with_num!(x.data(), v => Element::wrap(clip_typed(v, lo, hi, self.min, self.max)),
            else return Err(OpError::UnsupportedDType { index: 0, got: dt }));
        Ok(Tensor::new(dt, x.shape(), data)?)
    }
}

fn clip_typed<T: Num>(
    v: &[T],
    lo: Option<&Tensor>,
    hi: Option<&Tensor>,
    amin: Option<f32>,
    amax: Option<f32>,
) -> Vec<T> {
    // Tensor bounds have T's dtype (checked by the caller); attribute bounds are f32.
    let bound = |t: Option<&Tensor>, attr: Option<f32>| match t {
        Some(t) => t.as_slice::<T>().ok().and_then(|s| s.first().copied()),
        None => attr.map(|a| T::from_f64(f64::from(a))),
    };
    let (lo, hi) = (bound(lo, amin), bound(hi, amax));
    v.iter()
        .map(|&a| {
            let mut r = a;
            if let Some(l) = lo
                && r < l
            {
                r = l;
            }
            if let Some(h) = hi
                && r > h
            {
                r = h;
            }
            r
        })
        .collect()
}

/// Where(condition, X, Y): X where condition holds, else Y, all three broadcast.
pub fn eval_where(c: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let Data::Bool(cv) = c.data() else {
        return Err(OpError::UnsupportedDType {
            index: 0,
            got: c.dtype(),
        });
    };
    if x.dtype() != y.dtype() {
        return Err(OpError::DTypeMismatch {
            a: x.dtype(),
            b: y.dtype(),
        });
    }
    let shape = broadcast_shapes(&broadcast_shapes(c.shape(), x.shape())?, y.shape())?;
    let n = checked_numel(&shape)?;
    let strides = [
        crate::util::broadcast_strides(c.shape(), &shape, 0)?,
        crate::util::broadcast_strides(x.shape(), &shape, 1)?,
        crate::util::broadcast_strides(y.shape(), &shape, 2)?,
    ];
    if let (Ok(xv), Ok(yv)) = (x.as_slice::<f32>(), y.as_slice::<f32>()) {
        // Every element is written below: a recycled buffer needs no clearing.
        let mut out = crate::util::out_f32(n);
        let mut dst = out.iter_mut();
        for_each_offset(&shape, strides.each_ref().map(|s| s.as_slice()), |[k, i, j]| {
            if let Some(d) = dst.next() {
                *d = if cv.get(k).copied().unwrap_or(false) {
                    xv.get(i)
                } else {
                    yv.get(j)
                }
                .copied()
                .unwrap_or(0.0);
            }
        });
        return Ok(Tensor::from_buf(shape, out)?);
    }
    let data = map_same2!(x.data(), y.data(), (xv, yv) => select(cv, xv, yv, &shape, &strides),
        else return Err(OpError::DTypeMismatch { a: x.dtype(), b: y.dtype() }));
    Ok(Tensor::new(x.dtype(), shape, data)?)
}

fn select<T: Clone + Default>(
    c: &[bool],
    x: &[T],
    y: &[T],
    shape: &[usize],
    strides: &[kiln_tensor::Shape; 3],
) -> Vec<T> {
    let mut out = Vec::with_capacity(numel(shape).unwrap_or(0));
    for_each_offset(shape, strides.each_ref().map(|s| s.as_slice()), |[k, i, j]| {
        let v = if c.get(k).copied().unwrap_or(false) {
            x.get(i)
        } else {
            y.get(j)
        };
        out.push(v.cloned().unwrap_or_default());
    });
    out
}

/// PRelu(X, slope): `x < 0 ? slope * x : x`, slope broadcast to X. A 1-D slope that does not
/// broadcast numpy-style applies along the one axis of X with its length (as ONNX's reference
/// does for old models).
pub fn eval_prelu(x: &Tensor, slope: &Tensor) -> Result<Tensor> {
    let dt = x.dtype();
    if slope.dtype() != dt {
        return Err(OpError::DTypeMismatch {
            a: dt,
            b: slope.dtype(),
        });
    }
    let m = match Bcast::new(x.shape(), slope.shape()) {
        Ok(m) => m,
        Err(e) => {
            let [d] = slope.shape() else { return Err(e) };
            let hits: Vec<usize> = x
                .shape()
                .iter()
                .enumerate()
                .filter(|(_, s)| *s == d)
                .map(|(i, _)| i)
                .collect();
            let [axis] = hits.as_slice() else { return Err(e) };
            let s: Vec<usize> = (0..x.rank()).map(|i| if i == *axis { *d } else { 1 }).collect();
            Bcast::new(x.shape(), &s)?
        }
    };
    let data = with_num2!(x.data(), slope.data(), (xv, sv) => Element::wrap_buf(prelu_typed(xv, sv, &m)),
        else return Err(OpError::UnsupportedDType { index: 0, got: dt }));
    Ok(Tensor::new(dt, m.shape, data)?)
}

fn prelu_typed<T: Num + Send + Sync>(x: &[T], s: &[T], m: &Bcast) -> kiln_tensor::Buf<T> {
    m.arith(x, s, prelu_one)
}

/// `x < 0 ? x * slope : x` (NaN stays).
fn prelu_one<T: Num>(x: T, slope: T) -> T {
    if x < T::zero() { x.mul(slope) } else { x }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn where_broadcasts_all_three_inputs_in_every_element_type() {
        // cond [2, 1, 3], x [1, 2, 1], y scalar -> [2, 2, 3]; the value at (i, j, k) is
        // x[j] when cond[i][k] else y, written out by hand.
        let c = Tensor::from_vec(vec![2, 1, 3], vec![true, false, true, false, false, true]).unwrap();
        let want = [1.0, -5.0, 1.0, 2.0, -5.0, 2.0, -5.0, -5.0, 1.0, -5.0, -5.0, 2.0];
        let x32 = Tensor::from_vec(vec![1, 2, 1], vec![1.0f32, 2.0]).unwrap();
        let y32 = Tensor::scalar(-5.0f32);
        let r = eval_where(&c, &x32, &y32).unwrap();
        assert_eq!(r.shape(), [2, 2, 3]);
        assert_eq!(r.as_slice::<f32>().unwrap(), want.map(|v| v as f32));
        // The generic path (i64) gives the same selection.
        let x64 = Tensor::from_vec(vec![1, 2, 1], vec![1i64, 2]).unwrap();
        let r = eval_where(&c, &x64, &Tensor::scalar(-5i64)).unwrap();
        assert_eq!(r.as_slice::<i64>().unwrap(), want.map(|v| v as i64));
        // Shapes that do not broadcast are refused.
        let bad = Tensor::from_vec(vec![4], vec![0.0f32; 4]).unwrap();
        assert!(eval_where(&c, &bad, &y32).is_err());
    }
}
