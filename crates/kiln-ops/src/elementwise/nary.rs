//! Elementwise ops with other arities: the variadic Sum/Mean/Max/Min, Clip, Where and PRelu.
//!
//! ONNX operators (<https://onnx.ai/onnx/operators/>): Sum, Mean, Max, Min (opsets 1-13, with
//! broadcasting from opset 8), Clip (opsets 1-13: bounds as attributes before 11, as optional
//! inputs since), Where (9-16), PRelu (1-16).

use super::binary::Bcast;
use super::scalar::{Num, map_same2, nan_max, nan_min, with_num, with_num2};
use crate::error::{OpError, Result};
use crate::util::{broadcast_map, checked_numel};
use kiln_tensor::{Data, Element, Tensor, broadcast_shapes};

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

    pub fn eval(&self, inputs: &[&Tensor]) -> Result<Tensor> {
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
    pub fn eval(&self, x: &Tensor, lo: Option<&Tensor>, hi: Option<&Tensor>) -> Result<Tensor> {
        let dt = x.dtype();
        for (i, b) in [(1, lo), (2, hi)] {
            if let Some(b) = b {
                if b.dtype() != dt {
                    return Err(OpError::DTypeMismatch { a: dt, b: b.dtype() });
                }
                if b.len() != 1 {
                    return Err(OpError::Shape(format!(
                        "Clip input {i} must be a scalar, got shape {:?}",
                        b.shape()
                    )));
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
    checked_numel(&shape)?;
    let ic = broadcast_map(c.shape(), &shape)?;
    let ix = broadcast_map(x.shape(), &shape)?;
    let iy = broadcast_map(y.shape(), &shape)?;
    let data = map_same2!(x.data(), y.data(), (xv, yv) => select(cv, xv, yv, &ic, &ix, &iy),
        else return Err(OpError::DTypeMismatch { a: x.dtype(), b: y.dtype() }));
    Ok(Tensor::new(x.dtype(), shape, data)?)
}

fn select<T: Clone>(c: &[bool], x: &[T], y: &[T], ic: &[usize], ix: &[usize], iy: &[usize]) -> Vec<T> {
    ic.iter()
        .zip(ix.iter().zip(iy))
        .map(|(&k, (&i, &j))| if c[k] { x[i].clone() } else { y[j].clone() })
        .collect()
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
    let data = with_num2!(x.data(), slope.data(), (xv, sv) => Element::wrap(prelu_typed(xv, sv, &m)),
        else return Err(OpError::UnsupportedDType { index: 0, got: dt }));
    Ok(Tensor::new(dt, m.shape, data)?)
}

fn prelu_typed<T: Num>(x: &[T], s: &[T], m: &Bcast) -> Vec<T> {
    let zero = T::zero();
    m.zip(x, s, |a, b| if a < zero { a.mul(b) } else { a })
}
