//! NegativeLogLikelihoodLoss (opsets 12-22) and SoftmaxCrossEntropyLoss (opsets 12-13):
//! <https://onnx.ai/onnx/operators/onnx__NegativeLogLikelihoodLoss.html>,
//! <https://onnx.ai/onnx/operators/onnx__SoftmaxCrossEntropyLoss.html>.
//!
//! Input `(N, C, d1, ..., dk)`, target `(N, d1, ..., dk)` of class indices, optional per-class
//! `weight (C)`. The per-element loss is `-input[n, target, d...] * weight[target]`, 0 where
//! target equals `ignore_index`. `none` returns the per-element losses, `sum` their sum, and
//! `mean` their sum divided by the sum of the weights applied (the count of non-ignored
//! elements without weights). SoftmaxCrossEntropyLoss applies the loss to `LogSoftmax(input)`
//! along axis 1 and also outputs that log-probability tensor.

use super::common::{self, floats, from_f64};
use super::softmax::{SoftmaxKind, softmax_lane};
use crate::error::{OpError, Result};
use crate::value::{Args, Dim, InferInput, ValueType};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum LossReduction {
    None,
    Sum,
    Mean,
}

/// NegativeLogLikelihoodLoss, or SoftmaxCrossEntropyLoss when `softmax` is set.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Loss {
    pub softmax: bool,
    pub reduction: LossReduction,
    pub ignore_index: Option<i64>,
}

impl Loss {
    pub fn name(&self) -> &'static str {
        if self.softmax {
            "SoftmaxCrossEntropyLoss"
        } else {
            "NegativeLogLikelihoodLoss"
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let mut inp = floats(x, 0)?;
        let shape = x.shape();
        if shape.len() < 2 {
            return Err(OpError::input_shape(0, "rank >= 2", shape));
        }
        let (n, c) = (shape[0], shape[1]);
        let d: usize = shape[2..].iter().product();
        let t = args.tensor(1)?;
        let mut tshape = shape.to_vec();
        tshape.remove(1);
        if t.shape() != tshape.as_slice() {
            return Err(OpError::input_shape(
                1,
                format!("{tshape:?}, the input's shape without dim 1"),
                t.shape(),
            ));
        }
        let target = t
            .to_i64_vec()
            .filter(|_| common::is_plain_int(t.dtype()))
            .ok_or(OpError::UnsupportedDType {
                index: 1,
                got: t.dtype(),
            })?;
        let weight = match args.opt_tensor(2)? {
            Some(w) => {
                let v = floats(w, 2)?;
                if v.len() != c || w.rank() != 1 {
                    return Err(OpError::input_shape(
                        2,
                        format!("[{c}], one weight per class"),
                        w.shape(),
                    ));
                }
                Some(v)
            }
            None => None,
        };
        if self.softmax {
            let mut lane = vec![0.0; c];
            let mut out = vec![0.0; c];
            for b in 0..n {
                for i in 0..d {
                    for k in 0..c {
                        lane[k] = inp[(b * c + k) * d + i];
                    }
                    softmax_lane(SoftmaxKind::LogSoftmax, &lane, &mut out);
                    for k in 0..c {
                        inp[(b * c + k) * d + i] = out[k];
                    }
                }
            }
        }
        let mut losses = vec![0.0f64; n * d];
        let mut wsum = 0.0f64;
        for b in 0..n {
            for i in 0..d {
                let tv = target[b * d + i];
                if Some(tv) == self.ignore_index {
                    continue;
                }
                let k = usize::try_from(tv)
                    .ok()
                    .filter(|&k| k < c)
                    .ok_or_else(|| OpError::IndexOutOfRange { index: tv, size: c })?;
                let w = weight.as_ref().map_or(1.0, |w| w[k]);
                losses[b * d + i] = -inp[(b * c + k) * d + i] * w;
                wsum += w;
            }
        }
        let dtype = x.dtype();
        let loss = match self.reduction {
            LossReduction::None => from_f64(dtype, tshape, &losses)?,
            LossReduction::Sum => common::scalar_f64(dtype, losses.iter().sum())?,
            LossReduction::Mean => common::scalar_f64(dtype, losses.iter().sum::<f64>() / wsum)?,
        };
        let mut out = vec![loss.into()];
        if self.softmax {
            out.push(from_f64(dtype, shape.to_vec(), &inp)?.into());
        }
        Ok(out.into())
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        common::check_float_input(inputs, 0)?;
        let t = common::input_tensor_type(inputs, 0);
        let shape = match self.reduction {
            LossReduction::None => {
                let target = common::input_tensor_type(inputs, 1);
                target.shape.or_else(|| {
                    t.shape.as_ref().filter(|s| s.len() >= 2).map(|s| {
                        let mut s: Vec<Dim> = s.clone();
                        s.remove(1);
                        s
                    })
                })
            }
            _ => Some(Vec::new()),
        };
        let mut out = vec![common::tensor_type(t.dtype, shape)];
        if self.softmax {
            out.push(ValueType::Tensor(t));
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::value::Value;
    use kiln_tensor::Tensor;

    fn run(op: &Loss, x: Tensor, t: Tensor, w: Option<Tensor>) -> Vec<Tensor> {
        let vals: Vec<Value> = [Some(x), Some(t), w].into_iter().flatten().map(Value::Tensor).collect();
        let inputs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
        op.eval(&Args::new(&inputs))
            .unwrap()
            .into_iter()
            .map(|v| v.as_tensor().unwrap().clone())
            .collect()
    }

    #[test]
    fn nll_reductions() {
        // N=2, C=3: loss = -x[0,2], -x[1,0] = 3, 4.
        let x = Tensor::from_vec(vec![2, 3], vec![-1f32, -2., -3., -4., -5., -6.]).unwrap();
        let t = Tensor::from_vec(vec![2], vec![2i64, 0]).unwrap();
        let mut op = Loss {
            softmax: false,
            reduction: LossReduction::None,
            ignore_index: None,
        };
        assert_eq!(
            run(&op, x.clone(), t.clone(), None)[0].as_slice::<f32>().unwrap(),
            &[3., 4.]
        );
        op.reduction = LossReduction::Mean;
        assert_eq!(
            run(&op, x.clone(), t.clone(), None)[0].as_slice::<f32>().unwrap(),
            &[3.5]
        );
        // Weights [1, 2, 3]: (3*3 + 4*1) / (3 + 1) = 13/4.
        let w = Tensor::from_vec(vec![3], vec![1f32, 2., 3.]).unwrap();
        assert_eq!(
            run(&op, x.clone(), t.clone(), Some(w.clone()))[0]
                .as_slice::<f32>()
                .unwrap(),
            &[3.25]
        );
        // Ignoring class 0 leaves 9 / 3.
        op.ignore_index = Some(0);
        assert_eq!(
            run(&op, x.clone(), t.clone(), Some(w))[0].as_slice::<f32>().unwrap(),
            &[3.]
        );
        op.reduction = LossReduction::Sum;
        assert_eq!(run(&op, x, t, None)[0].as_slice::<f32>().unwrap(), &[3.]);
    }

    #[test]
    fn softmax_cross_entropy_uniform() {
        // Equal logits: log_prob = -ln 3 everywhere, loss ln 3.
        let x = Tensor::from_vec(vec![1, 3], vec![0.5f64; 3]).unwrap();
        let t = Tensor::from_vec(vec![1], vec![1i32]).unwrap();
        let op = Loss {
            softmax: true,
            reduction: LossReduction::Mean,
            ignore_index: None,
        };
        let out = run(&op, x, t, None);
        assert!((out[0].as_slice::<f64>().unwrap()[0] - 3f64.ln()).abs() < 1e-12);
        assert!(
            out[1]
                .as_slice::<f64>()
                .unwrap()
                .iter()
                .all(|v| (v + 3f64.ln()).abs() < 1e-12)
        );
    }
}
