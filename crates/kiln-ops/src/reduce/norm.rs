//! Normalizations: LayerNormalization (opset 17), RMSNormalization (opset 23),
//! GroupNormalization (opsets 18 and 21), InstanceNormalization (1-22), BatchNormalization
//! (1-15), LpNormalization (1-22), MeanVarianceNormalization (9-13) and LRN (1-13); see
//! <https://onnx.ai/onnx/operators/> for each. Statistics are computed in f64 (two-pass mean
//! and population variance) and results rounded to the input dtype.

use super::common::{self, floats, from_f64, is_ieee_float};
use super::reduction::reduce_map;
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_tensor::DType;

/// Reads input `i` (a float tensor) broadcast unidirectionally to `shape`: the values and,
/// for each element of `shape`, the index into them.
fn broadcast_param(args: &Args<'_>, i: usize, shape: &[usize]) -> Result<Option<(Vec<f64>, Vec<usize>)>> {
    match args.opt_tensor(i)? {
        None => Ok(None),
        Some(t) => {
            let v = floats(t, i)?;
            let map = util::broadcast_map(t.shape(), shape, i)?;
            Ok(Some((v, map)))
        }
    }
}

/// Mean and population variance of each of `rows` contiguous blocks of `cols` values.
fn row_stats(v: &[f64], rows: usize, cols: usize) -> Vec<(f64, f64)> {
    (0..rows)
        .map(|r| {
            let s = &v[r * cols..(r + 1) * cols];
            let n = cols as f64;
            let mean = s.iter().sum::<f64>() / n;
            let var = s.iter().map(|&x| (x - mean) * (x - mean)).sum::<f64>() / n;
            (mean, var)
        })
        .collect()
}

/// The dtype statistics outputs use: the stash type when it is a float, else the input's.
fn stat_dtype(stash: DType, x: DType) -> DType {
    if is_ieee_float(stash) { stash } else { x }
}

/// LayerNormalization: normalizes over the dims from `axis` on; outputs Y, Mean, InvStdDev.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LayerNorm {
    pub axis: i64,
    pub epsilon: f32,
    pub stash_type: DType,
}

impl LayerNorm {
    /// The f32 path with the vectorised row kernel, when X is f32 and Scale (and B, if given)
    /// are f32 with exactly the normalised dims (no broadcasting within a row); `None` otherwise.
    fn eval_f32_rows(&self, args: &Args<'_>, rows: usize, cols: usize, axis: usize) -> Result<Option<crate::Outputs>> {
        let x = args.tensor(0)?;
        let shape = x.shape();
        let scale = args.tensor(1)?;
        let bias = args.opt_tensor(2)?;
        let row_shape = shape.get(axis..).unwrap_or(&[]);
        let fits = |t: &kiln_tensor::Tensor| t.dtype() == DType::F32 && t.shape() == row_shape;
        let (Some(xs), Some(ss)) = (x.as_slice::<f32>().ok(), scale.as_slice::<f32>().ok()) else {
            return Ok(None);
        };
        if cols == 0 || !fits(scale) || bias.is_some_and(|b| !fits(b)) || self.stash_type != DType::F32 {
            return Ok(None);
        }
        let bs = bias.and_then(|b| b.as_slice::<f32>().ok());
        // Every row of Y is written whole.
        let mut y = crate::util::out_f32(xs.len());
        let eps = f64::from(self.epsilon);
        if !args.output_wanted(1) && !args.output_wanted(2) {
            // Y alone: rows in parallel over the current pool.
            kiln_kernels::pool::for_each_chunk_mut(&mut y, cols, &|r, yr| {
                if let Some(xr) = xs.get(r * cols..(r + 1) * cols) {
                    kiln_kernels::vector::layer_norm_row(xr, yr, ss, bs, eps);
                }
            });
            return Ok(Some(smallvec::smallvec![
                kiln_tensor::Tensor::from_buf(shape, y)?.into()
            ]));
        }
        let mut means = Vec::with_capacity(rows);
        let mut invs = Vec::with_capacity(rows);
        for (xr, yr) in xs.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
            let (m, k) = kiln_kernels::vector::layer_norm_row(xr, yr, ss, bs, eps);
            means.push(m as f32);
            invs.push(k as f32);
        }
        let mut stat_shape = shape.get(..axis).unwrap_or(&[]).to_vec();
        stat_shape.resize(shape.len(), 1);
        Ok(Some(smallvec::smallvec![
            kiln_tensor::Tensor::from_buf(shape, y)?.into(),
            kiln_tensor::Tensor::from_vec(stat_shape.clone(), means)?.into(),
            kiln_tensor::Tensor::from_vec(stat_shape, invs)?.into(),
        ]))
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let shape = x.shape();
        let axis = util::norm_axis(self.axis, shape.len())?;
        let (rows, cols) = common::split_2d(shape, axis);
        if let Some(out) = self.eval_f32_rows(args, rows, cols, axis)? {
            return Ok(out);
        }
        let v = floats(x, 0)?;
        let scale = broadcast_param(args, 1, shape)?.ok_or(OpError::MissingInput { index: 1 })?;
        let bias = broadcast_param(args, 2, shape)?;
        let stats = row_stats(&v, rows, cols);
        let eps = self.epsilon as f64;
        let mut y = vec![0.0; v.len()];
        for (idx, out) in y.iter_mut().enumerate() {
            let (mean, var) = stats[idx / cols];
            let mut r = (v[idx] - mean) / (var + eps).sqrt() * scale.0[scale.1[idx]];
            if let Some((b, m)) = &bias {
                r += b[m[idx]];
            }
            *out = r;
        }
        let mut stat_shape = shape[..axis].to_vec();
        stat_shape.resize(shape.len(), 1);
        let sd = stat_dtype(self.stash_type, x.dtype());
        let means: Vec<f64> = stats.iter().map(|s| s.0).collect();
        let inv: Vec<f64> = stats.iter().map(|s| 1.0 / (s.1 + eps).sqrt()).collect();
        Ok(smallvec::smallvec![
            from_f64(x.dtype(), shape.to_vec(), &y)?.into(),
            from_f64(sd, stat_shape.clone(), &means)?.into(),
            from_f64(sd, stat_shape, &inv)?.into(),
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        common::check_float_input(inputs, 0)?;
        let t = common::input_tensor_type(inputs, 0);
        let stat_shape = match &t.shape {
            Some(s) => {
                let axis = util::norm_axis(self.axis, s.len())?;
                let mut d = s[..axis].to_vec();
                d.resize(s.len(), Dim::Fixed(1));
                Some(d)
            }
            None => None,
        };
        let sd = t.dtype.map(|d| stat_dtype(self.stash_type, d));
        Ok(vec![
            ValueType::Tensor(t),
            common::tensor_type(sd, stat_shape.clone()),
            common::tensor_type(sd, stat_shape),
        ])
    }
}

/// RMSNormalization: `X / sqrt(mean(X^2 over dims axis..) + epsilon) * scale`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RmsNorm {
    pub axis: i64,
    pub epsilon: f32,
    pub stash_type: DType,
}

impl RmsNorm {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let shape = x.shape();
        let axis = util::norm_axis(self.axis, shape.len())?;
        let (rows, cols) = common::split_2d(shape, axis);
        let v = floats(x, 0)?;
        let scale = broadcast_param(args, 1, shape)?.ok_or(OpError::MissingInput { index: 1 })?;
        let eps = self.epsilon as f64;
        let inv: Vec<f64> = (0..rows)
            .map(|r| {
                let ms = v[r * cols..(r + 1) * cols].iter().map(|x| x * x).sum::<f64>() / cols as f64;
                1.0 / (ms + eps).sqrt()
            })
            .collect();
        let y: Vec<f64> = (0..v.len())
            .map(|i| v[i] * inv[i / cols] * scale.0[scale.1[i]])
            .collect();
        Ok(smallvec::smallvec![from_f64(x.dtype(), shape.to_vec(), &y)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        common::check_float_input(inputs, 0)?;
        let t = common::input_tensor_type(inputs, 0);
        if let Some(r) = t.rank() {
            util::norm_axis(self.axis, r)?;
        }
        Ok(vec![ValueType::Tensor(t)])
    }
}

/// `(N, C, spatial)` of an `(N, C, D1, ...)` input.
fn nc_spatial(shape: &[usize]) -> Result<(usize, usize, usize)> {
    if shape.len() < 2 {
        return Err(OpError::input_shape(0, "rank >= 2", shape));
    }
    Ok((shape[0], shape[1], shape[2..].iter().product()))
}

/// Reads a 1-D float parameter (input `i`) that must hold `n` values.
fn channel_param(args: &Args<'_>, i: usize, ns: &[usize], what: &str) -> Result<Vec<f64>> {
    let t = args.tensor(i)?;
    let v = floats(t, i)?;
    if !ns.contains(&v.len()) {
        let counts: Vec<String> = ns.iter().map(usize::to_string).collect();
        return Err(OpError::input_shape(
            i,
            format!("{what} of {} elements", counts.join(" or ")),
            t.shape(),
        ));
    }
    Ok(v)
}

/// GroupNormalization: `num_groups` groups of channels, each normalized over its channels and
/// spatial dims. Scale and bias hold one value per channel (opset 21) or per group (opset 18;
/// told apart by their length, which only coincide when each group is one channel).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct GroupNorm {
    pub num_groups: i64,
    pub epsilon: f32,
    pub stash_type: DType,
}

impl GroupNorm {
    /// The output: X's type (a float).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        infer_same_float(inputs)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = floats(x, 0)?;
        let (n, c, sp) = nc_spatial(x.shape())?;
        let g = util::attr_dim(self.num_groups, "num_groups")?;
        if g == 0 || c % g != 0 {
            return Err(OpError::attribute(
                "num_groups",
                format!("a divisor of the {c} channels"),
                g,
            ));
        }
        let scale = channel_param(args, 1, &[c, g], "scale")?;
        let bias = channel_param(args, 2, &[scale.len()], "bias")?;
        let per_channel = scale.len() == c;
        let cpg = c / g;
        let block = cpg * sp;
        let stats = row_stats(&v, n * g, block);
        let eps = self.epsilon as f64;
        let y: Vec<f64> = (0..v.len())
            .map(|i| {
                let (mean, var) = stats[i / block];
                let ch = (i / sp) % c;
                let p = if per_channel { ch } else { ch / cpg };
                (v[i] - mean) / (var + eps).sqrt() * scale[p] + bias[p]
            })
            .collect();
        Ok(smallvec::smallvec![from_f64(x.dtype(), x.shape().to_vec(), &y)?.into()])
    }
}

/// InstanceNormalization: each (n, c) plane normalized over its spatial dims, then
/// `scale[c] * x + bias[c]`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct InstanceNorm {
    pub epsilon: f32,
}

impl InstanceNorm {
    /// The output: X's type (a float).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        infer_same_float(inputs)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = floats(x, 0)?;
        let (n, c, sp) = nc_spatial(x.shape())?;
        let scale = channel_param(args, 1, &[c], "scale")?;
        let bias = channel_param(args, 2, &[c], "B")?;
        let stats = row_stats(&v, n * c, sp);
        let eps = self.epsilon as f64;
        let y: Vec<f64> = (0..v.len())
            .map(|i| {
                let (mean, var) = stats[i / sp];
                let ch = (i / sp) % c;
                (v[i] - mean) / (var + eps).sqrt() * scale[ch] + bias[ch]
            })
            .collect();
        Ok(smallvec::smallvec![from_f64(x.dtype(), x.shape().to_vec(), &y)?.into()])
    }
}

/// BatchNormalization. Inference: `scale * (x - mean) / sqrt(var + epsilon) + bias` per
/// channel. Training (`training_mode` from opset 14; more than one output before): normalizes
/// with the batch statistics and outputs the updated running statistics
/// `running * momentum + batch * (1 - momentum)`; opsets < 14 also output the batch mean and
/// variance (saved_mean, saved_var). Parameters of length `C * D1 * ...` (opsets < 9 with
/// `spatial = 0`) are applied per element of a sample.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct BatchNorm {
    pub epsilon: f32,
    pub momentum: f32,
    pub training_mode: bool,
    /// Opset < 14 training outputs saved_mean and saved_var too.
    pub saved_outputs: bool,
}

impl BatchNorm {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = floats(x, 0)?;
        let shape = x.shape();
        let (_, c, sp) = if shape.len() == 1 {
            (shape[0], 1, 1)
        } else {
            nc_spatial(shape)?
        };
        let sizes = [c, c * sp];
        let scale = channel_param(args, 1, &sizes, "scale")?;
        let bias = channel_param(args, 2, &[scale.len()], "B")?;
        let mean = channel_param(args, 3, &[scale.len()], "input_mean")?;
        let var = channel_param(args, 4, &[scale.len()], "input_var")?;
        let per_elem = scale.len() != c;
        let param_of = |i: usize| if per_elem { i % (c * sp) } else { (i / sp) % c };
        let eps = self.epsilon as f64;
        let dtype = x.dtype();
        if !self.training_mode {
            let y: Vec<f64> = (0..v.len())
                .map(|i| {
                    let p = param_of(i);
                    scale[p] * (v[i] - mean[p]) / (var[p] + eps).sqrt() + bias[p]
                })
                .collect();
            let t = |d: &[f64]| from_f64(dtype, vec![d.len()], d);
            let mut out = vec![
                from_f64(dtype, shape.to_vec(), &y)?.into(),
                t(&mean)?.into(),
                t(&var)?.into(),
            ];
            if self.saved_outputs {
                out.push(t(&mean)?.into());
                out.push(t(&var)?.into());
            }
            return Ok(out.into());
        }
        // Batch statistics per parameter slot.
        let np = scale.len();
        let mut sum = vec![0.0f64; np];
        let mut cnt = vec![0usize; np];
        for (i, &xv) in v.iter().enumerate() {
            sum[param_of(i)] += xv;
            cnt[param_of(i)] += 1;
        }
        let bmean: Vec<f64> = sum.iter().zip(&cnt).map(|(s, &k)| s / k as f64).collect();
        let mut sq = vec![0.0f64; np];
        for (i, &xv) in v.iter().enumerate() {
            let d = xv - bmean[param_of(i)];
            sq[param_of(i)] += d * d;
        }
        let bvar: Vec<f64> = sq.iter().zip(&cnt).map(|(s, &k)| s / k as f64).collect();
        let y: Vec<f64> = (0..v.len())
            .map(|i| {
                let p = param_of(i);
                scale[p] * (v[i] - bmean[p]) / (bvar[p] + eps).sqrt() + bias[p]
            })
            .collect();
        let m = self.momentum as f64;
        let run_mean: Vec<f64> = mean.iter().zip(&bmean).map(|(r, b)| r * m + b * (1.0 - m)).collect();
        let run_var: Vec<f64> = var.iter().zip(&bvar).map(|(r, b)| r * m + b * (1.0 - m)).collect();
        let t = |d: &[f64]| from_f64(dtype, vec![d.len()], d);
        let mut out = vec![
            from_f64(dtype, shape.to_vec(), &y)?.into(),
            t(&run_mean)?.into(),
            t(&run_var)?.into(),
        ];
        if self.saved_outputs {
            out.push(t(&bmean)?.into());
            out.push(t(&bvar)?.into());
        }
        Ok(out.into())
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        common::check_float_input(inputs, 0)?;
        let t = common::input_tensor_type(inputs, 0);
        let stat = common::same_as_input(inputs, 3);
        let stat_var = common::same_as_input(inputs, 4);
        let mut out = vec![ValueType::Tensor(t), stat.clone(), stat_var.clone()];
        if self.saved_outputs {
            out.push(stat);
            out.push(stat_var);
        }
        Ok(out)
    }
}

/// LpNormalization: `x / ||x||_p` along `axis` (0 where the norm is 0).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LpNorm {
    pub axis: i64,
    pub p: i64,
}

impl LpNorm {
    /// The output: X's type (a float).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        infer_same_float(inputs)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = floats(x, 0)?;
        let shape = x.shape();
        let axis = util::norm_axis(self.axis, shape.len())?;
        if self.p < 1 {
            return Err(OpError::attribute("p", "1 or 2", self.p));
        }
        let p = self.p as f64;
        let (outer, n, inner) = common::split_axis(shape, axis);
        let mut y = vec![0.0; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let base = o * n * inner + i;
                let norm = match self.p {
                    1 => (0..n).map(|k| v[base + k * inner].abs()).sum::<f64>(),
                    2 => (0..n).map(|k| v[base + k * inner].powi(2)).sum::<f64>().sqrt(),
                    _ => (0..n)
                        .map(|k| v[base + k * inner].abs().powf(p))
                        .sum::<f64>()
                        .powf(1.0 / p),
                };
                for k in 0..n {
                    let j = base + k * inner;
                    y[j] = if norm == 0.0 { 0.0 } else { v[j] / norm };
                }
            }
        }
        Ok(smallvec::smallvec![from_f64(x.dtype(), shape.to_vec(), &y)?.into()])
    }
}

/// MeanVarianceNormalization: `(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)` with the
/// expectations over `axes` (default [0, 2, 3]), as ONNX's function body defines it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct MeanVarianceNorm {
    pub axes: Vec<i64>,
}

impl MeanVarianceNorm {
    /// The output: X's type (a float).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        infer_same_float(inputs)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = floats(x, 0)?;
        let shape = x.shape();
        let mut axes = util::norm_axes(&self.axes, shape.len())?;
        axes.sort_unstable();
        let (map, out_n, group) = reduce_map(shape, &axes)?;
        let mut s = vec![0.0f64; out_n];
        let mut s2 = vec![0.0f64; out_n];
        for (&o, &xv) in map.iter().zip(&v) {
            s[o] += xv;
            s2[o] += xv * xv;
        }
        let g = group as f64;
        let mean: Vec<f64> = s.iter().map(|a| a / g).collect();
        let std: Vec<f64> = s2
            .iter()
            .zip(&mean)
            .map(|(a, m)| (a / g - m * m).max(0.0).sqrt())
            .collect();
        let y: Vec<f64> = map
            .iter()
            .zip(&v)
            .map(|(&o, &xv)| (xv - mean[o]) / (std[o] + 1e-9))
            .collect();
        Ok(smallvec::smallvec![from_f64(x.dtype(), shape.to_vec(), &y)?.into()])
    }
}

/// LRN across channels: `x / (bias + alpha / size * sum(x^2 over the window))^beta`, the
/// window spanning channels `[c - floor((size-1)/2), c + ceil((size-1)/2)]`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Lrn {
    pub alpha: f32,
    pub beta: f32,
    pub bias: f32,
    pub size: i64,
}

impl Lrn {
    /// The output: X's type (a float).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        infer_same_float(inputs)
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = floats(x, 0)?;
        let (n, c, sp) = nc_spatial(x.shape())?;
        let size = util::attr_dim(self.size, "size")?;
        if size == 0 {
            return Err(OpError::attribute("size", ">= 1", 0));
        }
        let lo = (size - 1) / 2;
        let hi = (size - 1).div_ceil(2);
        let (alpha, beta, bias) = (self.alpha as f64, self.beta as f64, self.bias as f64);
        let mut y = vec![0.0; v.len()];
        for b in 0..n {
            for ch in 0..c {
                let c0 = ch.saturating_sub(lo);
                let c1 = (ch + hi).min(c - 1);
                for s in 0..sp {
                    let sq: f64 = (c0..=c1).map(|k| v[(b * c + k) * sp + s].powi(2)).sum();
                    let i = (b * c + ch) * sp + s;
                    y[i] = v[i] / (bias + alpha / size as f64 * sq).powf(beta);
                }
            }
        }
        Ok(smallvec::smallvec![from_f64(x.dtype(), x.shape().to_vec(), &y)?.into()])
    }
}

/// Checks the input is a float tensor and returns its type (for shape-preserving ops).
pub(crate) fn infer_same_float(inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
    common::check_float_input(inputs, 0)?;
    Ok(vec![common::same_as_input(inputs, 0)])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::value::Value;
    use kiln_tensor::Tensor;

    fn eval(f: impl Fn(&Args<'_>) -> Result<crate::Outputs>, ins: Vec<Tensor>) -> Vec<Tensor> {
        let vals: Vec<Value> = ins.into_iter().map(Value::Tensor).collect();
        let inputs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
        f(&Args::new(&inputs))
            .unwrap()
            .into_iter()
            .map(|v| v.as_tensor().unwrap().clone())
            .collect()
    }

    fn t(shape: &[usize], v: &[f64]) -> Tensor {
        Tensor::from_vec(shape, v.to_vec()).unwrap()
    }

    fn close(a: &Tensor, b: &[f64]) {
        let a = a.as_slice::<f64>().unwrap();
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-9, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn layer_norm_rows() {
        // Row [1, 3]: mean 2, var 1, inv 1/sqrt(1 + eps); eps = 0 for exact values.
        let op = LayerNorm {
            axis: -1,
            epsilon: 0.0,
            stash_type: DType::F64,
        };
        let out = eval(
            |a| op.eval(a),
            vec![t(&[2, 2], &[1., 3., 0., 4.]), t(&[2], &[1., 2.]), t(&[2], &[0., 1.])],
        );
        close(&out[0], &[-1., 3., -1., 3.]);
        assert_eq!(out[1].shape(), &[2, 1]);
        close(&out[1], &[2., 2.]);
        close(&out[2], &[1., 0.5]);
    }

    #[test]
    fn rms_norm_row() {
        // [3, 4]: mean square 12.5.
        let op = RmsNorm {
            axis: -1,
            epsilon: 0.0,
            stash_type: DType::F32,
        };
        let out = eval(|a| op.eval(a), vec![t(&[1, 2], &[3., 4.]), t(&[2], &[1., 2.])]);
        let r = 12.5f64.sqrt();
        close(&out[0], &[3. / r, 8. / r]);
    }

    #[test]
    fn group_and_instance_norm() {
        // N=1, C=2, spatial 2; one group of both channels: values 0, 2, 4, 6 → mean 3, var 5.
        let x = t(&[1, 2, 2], &[0., 2., 4., 6.]);
        let s5 = 5f64.sqrt();
        let op = GroupNorm {
            num_groups: 1,
            epsilon: 0.0,
            stash_type: DType::F32,
        };
        let out = eval(|a| op.eval(a), vec![x.clone(), t(&[2], &[1., 2.]), t(&[2], &[0., 10.])]);
        close(&out[0], &[-3. / s5, -1. / s5, 10. + 2. / s5, 10. + 6. / s5]);
        // Opset-18 form: one scale per group.
        let out = eval(|a| op.eval(a), vec![x.clone(), t(&[1], &[2.]), t(&[1], &[1.])]);
        close(&out[0], &[1. - 6. / s5, 1. - 2. / s5, 1. + 2. / s5, 1. + 6. / s5]);
        // Instance norm: each channel separately, mean 1 / 5, var 1.
        let op = InstanceNorm { epsilon: 0.0 };
        let out = eval(|a| op.eval(a), vec![x, t(&[2], &[1., 2.]), t(&[2], &[0., 1.])]);
        close(&out[0], &[-1., 1., -1., 3.]);
    }

    #[test]
    fn batch_norm_inference_and_training() {
        let x = t(&[2, 1, 1], &[1., 3.]);
        let params = |m: f64, v: f64| vec![x.clone(), t(&[1], &[2.]), t(&[1], &[1.]), t(&[1], &[m]), t(&[1], &[v])];
        let op = BatchNorm {
            epsilon: 0.0,
            momentum: 0.9,
            training_mode: false,
            saved_outputs: false,
        };
        let out = eval(|a| op.eval(a), params(1.0, 4.0));
        close(&out[0], &[1., 3.]);
        // Training: batch mean 2, var 1; running = 0.9 * old + 0.1 * batch.
        let op = BatchNorm {
            training_mode: true,
            ..op
        };
        let out = eval(|a| op.eval(a), params(0.0, 0.0));
        close(&out[0], &[-1., 3.]);
        let m = 0.9f32 as f64;
        close(&out[1], &[(1. - m) * 2.]);
        close(&out[2], &[1. - m]);
    }

    #[test]
    fn lp_mvn_lrn() {
        let op = LpNorm { axis: 1, p: 2 };
        let out = eval(|a| op.eval(a), vec![t(&[2, 2], &[3., 4., 0., 0.])]);
        close(&out[0], &[0.6, 0.8, 0., 0.]);
        let op = LpNorm { axis: 1, p: 1 };
        let out = eval(|a| op.eval(a), vec![t(&[1, 2], &[1., -3.])]);
        close(&out[0], &[0.25, -0.75]);
        // MVN over axis 0 of [1, 3]: mean 2, std 1.
        let op = MeanVarianceNorm { axes: vec![0] };
        let out = eval(|a| op.eval(a), vec![t(&[2], &[1., 3.])]);
        close(&out[0], &[-1. / (1. + 1e-9), 1. / (1. + 1e-9)]);
        // LRN size 3 over C=2 channels: both windows cover both channels, sum sq = 1 + 4.
        let op = Lrn {
            alpha: 3.0,
            beta: 1.0,
            bias: 1.0,
            size: 3,
        };
        let out = eval(|a| op.eval(a), vec![t(&[1, 2, 1, 1], &[1., 2.])]);
        close(&out[0], &[1. / 6., 2. / 6.]);
    }
}
