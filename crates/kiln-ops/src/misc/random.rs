//! Random generation ops, opset 1+ (Bernoulli 15+):
//! [RandomUniform](https://onnx.ai/onnx/operators/onnx__RandomUniform.html),
//! [RandomNormal](https://onnx.ai/onnx/operators/onnx__RandomNormal.html),
//! [RandomUniformLike](https://onnx.ai/onnx/operators/onnx__RandomUniformLike.html),
//! [RandomNormalLike](https://onnx.ai/onnx/operators/onnx__RandomNormalLike.html),
//! [Bernoulli](https://onnx.ai/onnx/operators/onnx__Bernoulli.html),
//! [Multinomial](https://onnx.ai/onnx/operators/onnx__Multinomial.html).
//!
//! The generator is SplitMix64. With a `seed` the output is reproducible (the same for every
//! evaluation); without one each evaluation draws a fresh stream. The values cannot match
//! another runtime's (numpy's, onnxruntime's) bit for bit: ONNX leaves the generator open.

use super::{input_shape, tensor_from_f64};
use crate::error::{OpError, Result};
use crate::util::{attr_dim, checked_numel, dtype_only, input_dtype};
use crate::value::{Args, Dim, InferInput, TensorType, Value, ValueType};
use kiln_tensor::DType;
use std::sync::atomic::{AtomicU64, Ordering};

/// SplitMix64 (Steele, Lea, Flood 2014).
struct Rng(u64);

impl Rng {
    fn new(seed: Option<f32>) -> Rng {
        match seed {
            Some(s) => Rng(0x853c_49e6_748f_ea9b ^ (s.to_bits() as u64)),
            None => {
                static COUNTER: AtomicU64 = AtomicU64::new(0);
                let n = COUNTER.fetch_add(1, Ordering::Relaxed);
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                Rng(t ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            }
        }
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The distribution of RandomUniform(Like) / RandomNormal(Like).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
enum Dist {
    Uniform { low: f32, high: f32 },
    Normal { mean: f32, scale: f32 },
}

fn sample(dist: Dist, seed: Option<f32>, dtype: DType, shape: Vec<usize>) -> Result<Value> {
    if !dtype.is_float() {
        return Err(OpError::UnsupportedDType { index: 0, got: dtype });
    }
    let n = checked_numel(&shape)?;
    let mut rng = Rng::new(seed);
    let v: Vec<f64> = (0..n)
        .map(|_| match dist {
            Dist::Uniform { low, high } => low as f64 + (high as f64 - low as f64) * rng.uniform(),
            Dist::Normal { mean, scale } => mean as f64 + scale as f64 * rng.normal(),
        })
        .collect();
    Ok(tensor_from_f64(dtype, shape, &v)?.into())
}

fn shape_of(shape: &[i64]) -> Result<Vec<usize>> {
    shape.iter().map(|&d| attr_dim(d, "shape")).collect()
}

fn fixed(dtype: DType, shape: &[i64]) -> ValueType {
    ValueType::Tensor(TensorType::new(
        dtype,
        shape.iter().map(|&d| Dim::Fixed(d.max(0) as usize)).collect(),
    ))
}

/// Uniform samples in [low, high) of a fixed shape.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RandomUniform {
    pub dtype: DType,
    pub low: f32,
    pub high: f32,
    pub seed: Option<f32>,
    pub shape: Vec<i64>,
}

impl RandomUniform {
    pub fn name(&self) -> &'static str {
        "RandomUniform"
    }
    pub fn eval(&self, _args: &Args<'_>) -> Result<crate::Outputs> {
        let dist = Dist::Uniform {
            low: self.low,
            high: self.high,
        };
        let y = sample(dist, self.seed, self.dtype, shape_of(&self.shape)?)?;
        Ok(smallvec::smallvec![y])
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![fixed(self.dtype, &self.shape)])
    }
}

/// Normal samples of a fixed shape.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RandomNormal {
    pub dtype: DType,
    pub mean: f32,
    pub scale: f32,
    pub seed: Option<f32>,
    pub shape: Vec<i64>,
}

impl RandomNormal {
    pub fn name(&self) -> &'static str {
        "RandomNormal"
    }
    pub fn eval(&self, _args: &Args<'_>) -> Result<crate::Outputs> {
        let dist = Dist::Normal {
            mean: self.mean,
            scale: self.scale,
        };
        let y = sample(dist, self.seed, self.dtype, shape_of(&self.shape)?)?;
        Ok(smallvec::smallvec![y])
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![fixed(self.dtype, &self.shape)])
    }
}

/// RandomUniformLike (`normal == false`: `a` = low, `b` = high) or RandomNormalLike
/// (`normal == true`: `a` = mean, `b` = scale), shaped like the input.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RandomLike {
    pub normal: bool,
    /// `None`: the input's dtype.
    pub dtype: Option<DType>,
    pub a: f32,
    pub b: f32,
    pub seed: Option<f32>,
}

impl RandomLike {
    pub fn name(&self) -> &'static str {
        if self.normal {
            "RandomNormalLike"
        } else {
            "RandomUniformLike"
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let dist = if self.normal {
            Dist::Normal {
                mean: self.a,
                scale: self.b,
            }
        } else {
            Dist::Uniform {
                low: self.a,
                high: self.b,
            }
        };
        Ok(smallvec::smallvec![sample(
            dist,
            self.seed,
            self.dtype.unwrap_or(x.dtype()),
            x.shape().to_vec(),
        )?])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = self.dtype.or(input_dtype(inputs, 0));
        Ok(vec![ValueType::Tensor(TensorType {
            dtype,
            shape: input_shape(inputs, 0),
        })])
    }
}

/// 1 with the probability given by each input element, else 0.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Bernoulli {
    /// `None`: the input's dtype.
    pub dtype: Option<DType>,
    pub seed: Option<f32>,
}

impl Bernoulli {
    pub fn name(&self) -> &'static str {
        "Bernoulli"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        super::require_float(x, 0)?;
        let mut rng = Rng::new(self.seed);
        let v: Vec<f64> = x
            .to_f64_vec()
            .into_iter()
            .map(|p| if rng.uniform() < p { 1.0 } else { 0.0 })
            .collect();
        Ok(smallvec::smallvec![
            tensor_from_f64(self.dtype.unwrap_or(x.dtype()), x.shape().to_vec(), &v)?.into(),
        ])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = self.dtype.or(input_dtype(inputs, 0));
        Ok(vec![ValueType::Tensor(TensorType {
            dtype,
            shape: input_shape(inputs, 0),
        })])
    }
}

/// Class indices drawn from each row of unnormalised log-probabilities `[batch, classes]`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Multinomial {
    pub dtype: DType,
    pub sample_size: usize,
    pub seed: Option<f32>,
}

impl Multinomial {
    pub fn name(&self) -> &'static str {
        "Multinomial"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        super::require_float(x, 0)?;
        if !matches!(self.dtype, DType::I32 | DType::I64) {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: self.dtype,
            });
        }
        let [batch, classes] = *x.shape() else {
            return Err(OpError::input_shape(0, "[batch, classes]", x.shape()));
        };
        if classes == 0 {
            return Err(OpError::input_shape(0, "at least one class", x.shape()));
        }
        let shape = vec![batch, self.sample_size];
        let mut out = Vec::with_capacity(checked_numel(&shape)?);
        let v = x.to_f64_vec();
        let mut rng = Rng::new(self.seed);
        for row in v.chunks(classes) {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut cum = Vec::with_capacity(classes);
            let mut total = 0.0;
            for &l in row {
                total += (l - m).exp();
                cum.push(total);
            }
            for _ in 0..self.sample_size {
                let u = rng.uniform() * total;
                let k = cum.iter().position(|&c| u < c).unwrap_or(classes - 1);
                out.push(k as f64);
            }
        }
        Ok(smallvec::smallvec![tensor_from_f64(self.dtype, shape, &out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![match input_shape(inputs, 0) {
            Some(s) if s.len() == 2 => ValueType::Tensor(TensorType::new(
                self.dtype,
                vec![s[0].clone(), Dim::Fixed(self.sample_size)],
            )),
            _ => dtype_only(Some(self.dtype)),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn seeded_uniform_is_reproducible_and_in_range() {
        let op = RandomUniform {
            dtype: DType::F64,
            low: -2.0,
            high: 3.0,
            seed: Some(1.0),
            shape: vec![1000],
        };
        let a = run(&[], |x| op.eval(x));
        let b = run(&[], |x| op.eval(x));
        assert_eq!(a, b);
        let (_, v) = out::<f64>(&a[0]);
        assert!(v.iter().all(|&x| (-2.0..3.0).contains(&x)));
        let mean = v.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.2, "mean {mean}");
    }

    #[test]
    fn normal_has_requested_moments() {
        let op = RandomNormal {
            dtype: DType::F32,
            mean: 5.0,
            scale: 2.0,
            seed: Some(3.0),
            shape: vec![20000],
        };
        let (_, v) = out::<f32>(&run(&[], |x| op.eval(x))[0]);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(
            (mean - 5.0).abs() < 0.1 && (var.sqrt() - 2.0).abs() < 0.1,
            "{mean} {var}"
        );
    }

    #[test]
    fn bernoulli_and_multinomial_respect_certain_events() {
        let p = t(&[4], vec![0.0f32, 1.0, 1.0, 0.0]);
        let y = run(&[Some(&p)], |a| {
            Bernoulli {
                dtype: Some(DType::I64),
                seed: None,
            }
            .eval(a)
        });
        assert_eq!(out::<i64>(&y[0]).1, vec![0, 1, 1, 0]);
        // Class 1 has all the mass (log-probabilities -inf elsewhere).
        let l = t(
            &[2, 3],
            vec![
                f32::NEG_INFINITY,
                0.0,
                f32::NEG_INFINITY,
                0.0,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
            ],
        );
        let op = Multinomial {
            dtype: DType::I32,
            sample_size: 3,
            seed: Some(0.0),
        };
        let y = run(&[Some(&l)], |a| op.eval(a));
        assert_eq!(out::<i32>(&y[0]), (vec![2, 3], vec![1, 1, 1, 0, 0, 0]));
    }
}
