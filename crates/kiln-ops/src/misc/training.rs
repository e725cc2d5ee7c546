//! `ai.onnx.preview.training` optimiser steps, opset 1:
//! [Adagrad](https://onnx.ai/onnx/operators/onnx_aionnxpreviewtraining_Adagrad.html),
//! [Adam](https://onnx.ai/onnx/operators/onnx_aionnxpreviewtraining_Adam.html),
//! [Momentum](https://onnx.ai/onnx/operators/onnx_aionnxpreviewtraining_Momentum.html).
//!
//! Inputs are the learning rate R (scalar), the step count T (scalar i64), then for n tensors
//! to optimise: X1..Xn, G1..Gn and the optimiser state (H1..Hn; V1..Vn; V1..Vn, H1..Hn).
//! Outputs are the new X1..Xn followed by the new state in the same grouping.

use super::{require_float, tensor_from_f64};
use crate::error::{OpError, Result};
use crate::util::read_i64;
use crate::value::{Args, InferInput, TensorType, Value, ValueType};
use kiln_tensor::Tensor;

/// The one value of `t`, input `index`.
fn scalar_f64(t: &Tensor, index: usize, what: &str) -> Result<f64> {
    match t.to_f64_vec().as_slice() {
        [v] => Ok(*v),
        _ => Err(OpError::input_shape(index, format!("one element ({what})"), t.shape())),
    }
}

/// Reads R, T and the `groups` groups of n same-shaped float tensors after them.
fn read_groups<'a>(args: &Args<'a>, groups: usize) -> Result<(f64, i64, Vec<Vec<&'a Tensor>>)> {
    let r = scalar_f64(args.tensor(0)?, 0, "the learning rate R")?;
    let t = read_i64(args.tensor(1)?, 1, "step count T")?;
    let rest = args.len().saturating_sub(2);
    if rest == 0 || !rest.is_multiple_of(groups) {
        // Inputs come in full groups: the next one is missing.
        return Err(OpError::MissingInput { index: args.len() });
    }
    let n = rest / groups;
    let mut out = Vec::with_capacity(groups);
    for g in 0..groups {
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            let idx = 2 + g * n + i;
            let x = args.tensor(idx)?;
            require_float(x, idx)?;
            v.push(x);
        }
        out.push(v);
    }
    for (i, s) in out[0].iter().map(|t| t.shape()).enumerate() {
        if let Some(g) = (1..groups).find(|&g| out[g][i].shape() != s) {
            return Err(OpError::inputs(
                2 + i,
                2 + g * n + i,
                "tensors of one optimised value of the same shape",
                s,
                out[g][i].shape(),
            ));
        }
    }
    Ok((r, t, out))
}

/// Output types: each input group after R and T, in order (X, then the state).
fn infer_groups(inputs: &[InferInput<'_>]) -> Vec<ValueType> {
    inputs
        .iter()
        .skip(2)
        .map(|i| ValueType::Tensor(i.ty.tensor().cloned().unwrap_or_else(TensorType::default)))
        .collect()
}

fn output(like: &Tensor, v: &[f64]) -> Result<Value> {
    Ok(tensor_from_f64(like.dtype(), like.shape().to_vec(), v)?.into())
}

/// Adagrad step with learning-rate decay.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Adagrad {
    pub decay_factor: f32,
    pub epsilon: f32,
    pub norm_coefficient: f32,
}

impl Adagrad {
    pub fn name(&self) -> &'static str {
        "Adagrad"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (r, t, g) = read_groups(args, 3)?;
        let (decay, eps, norm) = (
            self.decay_factor as f64,
            self.epsilon as f64,
            self.norm_coefficient as f64,
        );
        let rate = r / (1.0 + t as f64 * decay);
        let (mut xs, mut hs) = (Vec::new(), Vec::new());
        for ((xt, gt), ht) in g[0].iter().zip(&g[1]).zip(&g[2]) {
            let (x, gr, h) = (xt.to_f64_vec(), gt.to_f64_vec(), ht.to_f64_vec());
            let mut x_new = Vec::with_capacity(x.len());
            let mut h_new = Vec::with_capacity(x.len());
            for j in 0..x.len() {
                let gj = norm * x[j] + gr[j];
                let hj = h[j] + gj * gj;
                x_new.push(x[j] - rate * gj / (hj.sqrt() + eps));
                h_new.push(hj);
            }
            xs.push(output(xt, &x_new)?);
            hs.push(output(ht, &h_new)?);
        }
        xs.extend(hs);
        Ok(xs.into())
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let mut v = infer_groups(inputs);
        let n = v.len() / 3;
        v.drain(n..2 * n); // drop the gradients
        Ok(v)
    }
}

/// Adam step with bias correction.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Adam {
    pub alpha: f32,
    pub beta: f32,
    pub epsilon: f32,
    pub norm_coefficient: f32,
    pub norm_coefficient_post: f32,
}

impl Adam {
    pub fn name(&self) -> &'static str {
        "Adam"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (r, t, g) = read_groups(args, 4)?;
        let (a, b, eps) = (self.alpha as f64, self.beta as f64, self.epsilon as f64);
        let (norm, post) = (self.norm_coefficient as f64, self.norm_coefficient_post as f64);
        let rate = if t > 0 {
            let t = t as f64;
            r * (1.0 - b.powf(t)).sqrt() / (1.0 - a.powf(t))
        } else {
            r
        };
        let (mut xs, mut vs, mut hs) = (Vec::new(), Vec::new(), Vec::new());
        for (((xt, gt), vt), ht) in g[0].iter().zip(&g[1]).zip(&g[2]).zip(&g[3]) {
            let (x, gr, v, h) = (xt.to_f64_vec(), gt.to_f64_vec(), vt.to_f64_vec(), ht.to_f64_vec());
            let (mut xn, mut vn, mut hn) = (Vec::new(), Vec::new(), Vec::new());
            for j in 0..x.len() {
                let gj = norm * x[j] + gr[j];
                let vj = a * v[j] + (1.0 - a) * gj;
                let hj = b * h[j] + (1.0 - b) * gj * gj;
                let xj = x[j] - rate * vj / (hj.sqrt() + eps);
                xn.push((1.0 - post) * xj);
                vn.push(vj);
                hn.push(hj);
            }
            xs.push(output(xt, &xn)?);
            vs.push(output(vt, &vn)?);
            hs.push(output(ht, &hn)?);
        }
        xs.extend(vs);
        xs.extend(hs);
        Ok(xs.into())
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let mut v = infer_groups(inputs);
        let n = v.len() / 4;
        v.drain(n..2 * n);
        Ok(v)
    }
}

/// SGD with (standard or Nesterov) momentum.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Momentum {
    pub alpha: f32,
    pub beta: f32,
    pub nesterov: bool,
    pub norm_coefficient: f32,
}

impl Momentum {
    pub fn name(&self) -> &'static str {
        "Momentum"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (r, t, g) = read_groups(args, 3)?;
        let (a, norm) = (self.alpha as f64, self.norm_coefficient as f64);
        let b = if t > 0 { self.beta as f64 } else { 1.0 };
        let (mut xs, mut vs) = (Vec::new(), Vec::new());
        for ((xt, gt), vt) in g[0].iter().zip(&g[1]).zip(&g[2]) {
            let (x, gr, v) = (xt.to_f64_vec(), gt.to_f64_vec(), vt.to_f64_vec());
            let (mut xn, mut vn) = (Vec::new(), Vec::new());
            for j in 0..x.len() {
                let gj = norm * x[j] + gr[j];
                let vj = a * v[j] + b * gj;
                xn.push(if self.nesterov {
                    x[j] - r * (gj + a * vj)
                } else {
                    x[j] - r * vj
                });
                vn.push(vj);
            }
            xs.push(output(xt, &xn)?);
            vs.push(output(vt, &vn)?);
        }
        xs.extend(vs);
        Ok(xs.into())
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let mut v = infer_groups(inputs);
        let n = v.len() / 3;
        v.drain(n..2 * n);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn adagrad_step() {
        // r = 0.1, t = 0, x = 1, g = 0.5, h = 0, no decay/norm/eps: h' = 0.25, x' = 1 - 0.1·0.5/0.5.
        let op = Adagrad {
            decay_factor: 0.0,
            epsilon: 0.0,
            norm_coefficient: 0.0,
        };
        let (r, t0, x, g, h) = (
            t(&[], vec![0.1f32]),
            t(&[], vec![0i64]),
            t(&[1], vec![1.0f32]),
            t(&[1], vec![0.5f32]),
            t(&[1], vec![0.0f32]),
        );
        let y = run(&[Some(&r), Some(&t0), Some(&x), Some(&g), Some(&h)], |a| op.eval(a));
        assert!((out::<f32>(&y[0]).1[0] - 0.9).abs() < 1e-6);
        assert_eq!(out::<f32>(&y[1]).1, vec![0.25]);
    }

    #[test]
    fn momentum_first_step_uses_unit_beta() {
        // t = 0: v' = alpha·v + g = 0.5·1 + 2 = 2.5; x' = x - r·v' = 1 - 0.1·2.5.
        let op = Momentum {
            alpha: 0.5,
            beta: 0.1,
            nesterov: false,
            norm_coefficient: 0.0,
        };
        let (r, t0, x, g, v) = (
            t(&[], vec![0.1f64]),
            t(&[], vec![0i64]),
            t(&[1], vec![1.0f64]),
            t(&[1], vec![2.0f64]),
            t(&[1], vec![1.0f64]),
        );
        let y = run(&[Some(&r), Some(&t0), Some(&x), Some(&g), Some(&v)], |a| op.eval(a));
        assert!(close(&out::<f64>(&y[0]).1, &[0.75], 1e-12));
        assert!(close(&out::<f64>(&y[1]).1, &[2.5], 1e-12));
    }

    #[test]
    fn adam_without_bias_correction_at_t0() {
        // alpha = beta = 0.5, g = 2: v' = 1, h' = 2, x' = 1 - 1·1/√2.
        let op = Adam {
            alpha: 0.5,
            beta: 0.5,
            epsilon: 0.0,
            norm_coefficient: 0.0,
            norm_coefficient_post: 0.0,
        };
        let (r, t0) = (t(&[], vec![1.0f64]), t(&[], vec![0i64]));
        let (x, g, v, h) = (
            t(&[1], vec![1.0f64]),
            t(&[1], vec![2.0f64]),
            t(&[1], vec![0.0f64]),
            t(&[1], vec![0.0f64]),
        );
        let y = run(&[Some(&r), Some(&t0), Some(&x), Some(&g), Some(&v), Some(&h)], |a| {
            op.eval(a)
        });
        assert!(close(&out::<f64>(&y[0]).1, &[1.0 - 1.0 / 2f64.sqrt()], 1e-12));
        assert!(close(&out::<f64>(&y[1]).1, &[1.0], 1e-12));
        assert!(close(&out::<f64>(&y[2]).1, &[2.0], 1e-12));
    }
}
