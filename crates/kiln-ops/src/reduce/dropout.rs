//! Dropout (<https://onnx.ai/onnx/operators/onnx__Dropout.html>), opsets 1-22, and Det
//! (<https://onnx.ai/onnx/operators/onnx__Det.html>), opsets 11-22.
//!
//! Dropout is the identity with an all-true mask unless `training_mode` (an input, opset 12+)
//! is true and the ratio is non-zero. In training it keeps each element where a uniform draw in
//! [0, 1) is `>= ratio` and scales kept ones by `1 / (1 - ratio)`. The draws come from MT19937
//! seeded with `seed` and turned into doubles as numpy's legacy `RandomState` does, so a seeded
//! node reproduces ONNX's reference outputs; without a seed the clock picks one. Before opset 12
//! the ratio is an attribute and the op always runs in inference mode; before opset 10 the mask
//! has the input's dtype (ones) rather than bool.

use super::common::{self, floats, from_f64};
use crate::error::{OpError, Result};
use crate::value::{Args, InferInput, ValueType};
use kiln_tensor::{DType, Data, Tensor};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Dropout {
    /// The ratio attribute (opset < 12); `None` reads the optional ratio input (default 0.5).
    pub ratio: Option<f32>,
    pub seed: Option<i64>,
    /// Opset < 10: the mask output has the input's dtype.
    pub mask_same_dtype: bool,
}

/// MT19937 as numpy's legacy `RandomState(seed)` runs it.
struct Mt19937 {
    mt: [u32; 624],
    idx: usize,
}

impl Mt19937 {
    fn new(seed: u32) -> Mt19937 {
        let mut mt = [0u32; 624];
        mt[0] = seed;
        for i in 1..624 {
            mt[i] = 1812433253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { mt, idx: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.idx >= 624 {
            for i in 0..624 {
                let y = (self.mt[i] & 0x8000_0000) | (self.mt[(i + 1) % 624] & 0x7fff_ffff);
                let mag = if y & 1 != 0 { 0x9908_b0df } else { 0 };
                self.mt[i] = self.mt[(i + 397) % 624] ^ (y >> 1) ^ mag;
            }
            self.idx = 0;
        }
        let mut y = self.mt[self.idx];
        self.idx += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// A double in [0, 1) with 53 random bits (numpy's `random_sample`).
    fn next_f64(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67108864.0 + b) / 9007199254740992.0
    }
}

fn clock_seed() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32)
}

impl Dropout {
    fn mask_tensor(&self, x: &Tensor, keep: Vec<bool>) -> Result<Tensor> {
        if self.mask_same_dtype {
            let ones: Vec<f64> = keep.iter().map(|&k| if k { 1.0 } else { 0.0 }).collect();
            from_f64(x.dtype(), x.shape().to_vec(), &ones)
        } else {
            Ok(Tensor::new(DType::Bool, x.shape(), Data::Bool(keep.into()))?)
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let ratio = match self.ratio {
            Some(r) => r as f64,
            None => match args.opt_tensor(1)? {
                Some(t) => match t.to_f64_vec().as_slice() {
                    [r] => *r,
                    _ => return Err(OpError::input_shape(1, "one element (the ratio)", t.shape())),
                },
                None => 0.5,
            },
        };
        let training = match (self.ratio, args.opt_tensor(2)?) {
            (None, Some(t)) => match t.data() {
                Data::Bool(v) if v.len() == 1 => v[0],
                _ => {
                    return Err(OpError::input_value(
                        2,
                        "one bool (training_mode)",
                        format!("{}{:?}", t.dtype(), t.shape()),
                    ));
                }
            },
            _ => false,
        };
        if !training || ratio == 0.0 {
            let mask = self.mask_tensor(x, vec![true; x.len()])?;
            return Ok(smallvec::smallvec![x.clone().into(), mask.into()]);
        }
        if !(0.0..1.0).contains(&ratio) {
            return Err(match self.ratio {
                Some(_) => OpError::attribute("ratio", "a value in [0, 1)", ratio),
                None => OpError::input_value(1, "a ratio in [0, 1)", ratio),
            });
        }
        let v = floats(x, 0)?;
        let mut rng = Mt19937::new(self.seed.map_or_else(clock_seed, |s| s as u32));
        let keep: Vec<bool> = (0..v.len()).map(|_| rng.next_f64() >= ratio).collect();
        let scale = 1.0 / (1.0 - ratio);
        let y: Vec<f64> = v
            .iter()
            .zip(&keep)
            .map(|(&a, &k)| if k { a * scale } else { 0.0 })
            .collect();
        let y = from_f64(x.dtype(), x.shape().to_vec(), &y)?;
        Ok(smallvec::smallvec![y.into(), self.mask_tensor(x, keep)?.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let t = common::input_tensor_type(inputs, 0);
        let mask_dtype = if self.mask_same_dtype {
            t.dtype
        } else {
            Some(DType::Bool)
        };
        let mask = common::tensor_type(mask_dtype, t.shape.clone());
        Ok(vec![ValueType::Tensor(t), mask])
    }
}

/// Det: determinant of each square matrix in the last two dims, by LU with partial pivoting
/// in f64.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Det;

fn det(mut a: Vec<f64>, m: usize) -> f64 {
    let mut d = 1.0;
    for col in 0..m {
        let piv = (col..m).fold(col, |best, r| {
            if a[r * m + col].abs() > a[best * m + col].abs() {
                r
            } else {
                best
            }
        });
        if a[piv * m + col] == 0.0 {
            return 0.0;
        }
        if piv != col {
            for k in 0..m {
                a.swap(piv * m + k, col * m + k);
            }
            d = -d;
        }
        let p = a[col * m + col];
        d *= p;
        for r in col + 1..m {
            let f = a[r * m + col] / p;
            for k in col..m {
                a[r * m + k] -= f * a[col * m + k];
            }
        }
    }
    d
}

impl Det {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = floats(x, 0)?;
        let shape = x.shape();
        let r = shape.len();
        if r < 2 || shape[r - 1] != shape[r - 2] {
            return Err(OpError::input_shape(0, "[..., M, M]", shape));
        }
        let m = shape[r - 1];
        let mm = m * m;
        let batch: usize = shape[..r - 2].iter().product();
        let out: Vec<f64> = (0..batch).map(|b| det(v[b * mm..(b + 1) * mm].to_vec(), m)).collect();
        Ok(smallvec::smallvec![
            from_f64(x.dtype(), shape[..r - 2].to_vec(), &out)?.into()
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        common::check_float_input(inputs, 0)?;
        let t = common::input_tensor_type(inputs, 0);
        let shape = match t.shape {
            Some(s) if s.len() >= 2 => Some(s[..s.len() - 2].to_vec()),
            // Rank 0 or 1: named here when fixed, else at evaluation.
            Some(s) => match crate::util::fixed(&s) {
                Some(s) => return Err(OpError::input_shape(0, "[..., M, M]", &s)),
                None => None,
            },
            None => None,
        };
        Ok(vec![common::tensor_type(t.dtype, shape)])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn mt19937_matches_numpy() {
        // numpy: np.random.RandomState(0).random_sample(2) = [0.5488135039273248, 0.7151893663724195]
        let mut r = Mt19937::new(0);
        assert_eq!(r.next_f64(), 0.5488135039273248);
        assert_eq!(r.next_f64(), 0.7151893663724195);
    }

    #[test]
    fn det_2x2_and_3x3() {
        let x = Value::Tensor(Tensor::from_vec(vec![2, 2, 2], vec![1f32, 2., 3., 4., 2., 0., 0., 3.]).unwrap());
        let inputs = [Some(&x)];
        let out = Det.eval(&Args::new(&inputs)).unwrap();
        assert_eq!(out[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[-2., 6.]);
        let y = Value::Tensor(Tensor::from_vec(vec![3, 3], vec![0f64, 2., 1., 1., 1., 1., 2., 0., 3.]).unwrap());
        let inputs = [Some(&y)];
        let d = Det.eval(&Args::new(&inputs)).unwrap()[0]
            .as_tensor()
            .unwrap()
            .as_slice::<f64>()
            .unwrap()[0];
        // 0*(3-0) - 2*(3-2) + 1*(0-2) = -4
        assert!((d + 4.0).abs() < 1e-12);
    }

    #[test]
    fn dropout_inference_is_identity() {
        let op = Dropout {
            ratio: None,
            seed: Some(0),
            mask_same_dtype: false,
        };
        let x = Value::Tensor(Tensor::from_vec(vec![2], vec![1f32, -2.]).unwrap());
        let inputs = [Some(&x)];
        let out = op.eval(&Args::new(&inputs)).unwrap();
        assert_eq!(out[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[1., -2.]);
        assert_eq!(out[1].as_tensor().unwrap().as_slice::<bool>().unwrap(), &[true, true]);
    }
}
