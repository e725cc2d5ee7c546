//! ArgMax / ArgMin (<https://onnx.ai/onnx/operators/onnx__ArgMax.html>), opsets 1-13:
//! index (i64) of the largest / smallest element along `axis`; `keepdims` keeps the reduced
//! axis as size 1; `select_last_index` (opset 12+) picks the last of equal extremes instead of
//! the first. As numpy does, a NaN counts as the extreme (the first NaN, or the last one with
//! `select_last_index`).

use super::common::{self, is_ieee_float, is_plain_int};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::{DType, Data, Tensor};

/// ArgMax (`max`) or ArgMin.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ArgReduce {
    pub max: bool,
    pub axis: i64,
    pub keepdims: bool,
    pub select_last_index: bool,
}

/// Index of the extreme along one lane: `better(x, best)` says `x` beats `best` strictly.
fn lane_arg<T: Copy>(
    get: impl Fn(usize) -> T,
    n: usize,
    better: impl Fn(T, T) -> bool,
    equal: impl Fn(T, T) -> bool,
    last: bool,
) -> usize {
    let mut best_i = 0;
    let mut best = get(0);
    for k in 1..n {
        let x = get(k);
        if better(x, best) || (last && equal(x, best)) {
            best_i = k;
            best = x;
        }
    }
    best_i
}

impl ArgReduce {
    pub fn name(&self) -> &'static str {
        if self.max { "ArgMax" } else { "ArgMin" }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let shape = x.shape();
        let axis = util::norm_axis(self.axis, shape.len())?;
        let (outer, n, inner) = common::split_axis(shape, axis);
        let mut out_shape = shape.to_vec();
        if self.keepdims {
            out_shape[axis] = 1;
        } else {
            out_shape.remove(axis);
        }
        let out_n = outer * inner;
        if n == 0 && out_n > 0 {
            return Err(OpError::input_shape(0, format!("axis {axis} non-empty"), shape));
        }
        let max = self.max;
        let last = self.select_last_index;
        let mut out = Vec::with_capacity(out_n);
        let dtype = x.dtype();
        if is_ieee_float(dtype) || dtype == DType::Bool {
            let v = x.to_f64_vec();
            // NaN beats everything and stays once found (unless a later NaN with `last`).
            let better = |a: f64, b: f64| {
                if b.is_nan() {
                    false
                } else if a.is_nan() {
                    true
                } else if max {
                    a > b
                } else {
                    a < b
                }
            };
            let equal = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
            for o in 0..outer {
                for i in 0..inner {
                    let base = o * n * inner + i;
                    out.push(lane_arg(|k| v[base + k * inner], n, better, equal, last) as i64);
                }
            }
        } else if let (true, Some(v)) = (is_plain_int(dtype), common::ints(x)) {
            let better = |a: i128, b: i128| if max { a > b } else { a < b };
            for o in 0..outer {
                for i in 0..inner {
                    let base = o * n * inner + i;
                    out.push(lane_arg(|k| v[base + k * inner], n, better, |a, b| a == b, last) as i64);
                }
            }
        } else {
            return Err(OpError::UnsupportedDType { index: 0, got: dtype });
        }
        Ok(smallvec::smallvec![
            Tensor::new(DType::I64, out_shape, Data::I64(out.into()))?.into()
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let t = common::input_tensor_type(inputs, 0);
        let shape = match t.shape {
            Some(mut s) => {
                let axis = util::norm_axis(self.axis, s.len())?;
                if self.keepdims {
                    s[axis] = Dim::Fixed(1);
                } else {
                    s.remove(axis);
                }
                Some(s)
            }
            None => None,
        };
        Ok(vec![common::tensor_type(Some(DType::I64), shape)])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run(op: &ArgReduce, x: Tensor) -> Tensor {
        let v = Value::Tensor(x);
        let inputs = [Some(&v)];
        op.eval(&Args::new(&inputs))
            .unwrap()
            .remove(0)
            .as_tensor()
            .unwrap()
            .clone()
    }

    #[test]
    fn argmax_first_and_last() {
        // Spec example: [[2, 1], [3, 10]], axis 1.
        let x = Tensor::from_vec(vec![2, 2], vec![2f32, 2., 3., 10.]).unwrap();
        let mut op = ArgReduce {
            max: true,
            axis: 1,
            keepdims: true,
            select_last_index: false,
        };
        let r = run(&op, x.clone());
        assert_eq!(r.shape(), &[2, 1]);
        assert_eq!(r.as_slice::<i64>().unwrap(), &[0, 1]);
        op.select_last_index = true;
        assert_eq!(run(&op, x.clone()).as_slice::<i64>().unwrap(), &[1, 1]);
        let op = ArgReduce {
            max: false,
            axis: 0,
            keepdims: false,
            select_last_index: false,
        };
        let r = run(&op, x);
        assert_eq!(r.shape(), &[2]);
        assert_eq!(r.as_slice::<i64>().unwrap(), &[0, 0]);
    }

    #[test]
    fn argmin_ints() {
        let x = Tensor::from_vec(vec![4], vec![5u64, u64::MAX, 1, 1]).unwrap();
        let op = ArgReduce {
            max: false,
            axis: -1,
            keepdims: false,
            select_last_index: true,
        };
        assert_eq!(run(&op, x).as_slice::<i64>().unwrap(), &[3]);
    }
}
