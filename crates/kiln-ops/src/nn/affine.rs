//! `ChannelAffine`, made by the compiler: `y = act(x * scale[c] + shift[c])` per channel. It
//! is an inference BatchNormalization that no producer could absorb (DenseNet's
//! pre-activation `BN -> ReLU -> Conv`), its four parameters reduced to one scale and one shift
//! per channel (`scale / sqrt(var + eps)` and `B - mean * that`, computed in f64 and rounded
//! once). Channels are on axis 1 (`[N, C, ...]`), or last when `channels_last` is set (the
//! `layout` pass, when X is channels-last). An activation the `fuse_act` pass fused is
//! applied in the same pass over memory.

use super::activation::Activation;
use crate::error::{OpError, Result};
use crate::value::{Args, InferInput, ValueType};
use kiln_tensor::{DType, Tensor};

/// Values below which one thread does the whole op (the fork-join costs more).
const PAR_MIN: usize = 1 << 15;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct ChannelAffine {
    /// Channels are X's last dim (`[N, ..., C]`) instead of dim 1.
    pub channels_last: bool,
    pub activation: Option<Activation>,
}

impl ChannelAffine {
    /// Inputs: X (f32), scale and shift (f32, `[C]`).
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, scale, shift) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        if let Some((index, t)) = [x, scale, shift]
            .into_iter()
            .enumerate()
            .find(|(_, t)| t.dtype() != DType::F32)
        {
            return Err(OpError::UnsupportedDType { index, got: t.dtype() });
        }
        let shape = x.shape();
        let c = if self.channels_last {
            shape.last().copied()
        } else {
            shape.get(1).copied()
        }
        .ok_or_else(|| OpError::input_shape(0, "a channel dim", shape))?;
        for (index, t) in [(1, scale), (2, shift)] {
            if t.shape() != [c] {
                return Err(OpError::input_shape(
                    index,
                    format!("[{c}], one per channel of X"),
                    t.shape(),
                ));
            }
        }
        let (xd, s, t) = (x.as_slice::<f32>()?, scale.as_slice::<f32>()?, shift.as_slice::<f32>()?);
        let act = self.activation.map(|a| a.kernel_act());
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(xd.len());
        // Channels-first: rows are planes of one channel; channels-last: rows are pixels.
        let row = if self.channels_last {
            c
        } else {
            shape.iter().skip(2).product::<usize>()
        };
        if row > 0 && c > 0 {
            let apply = |i: usize, out: &mut [f32]| {
                let Some(src) = xd.get(i * row..i * row + out.len()) else {
                    return;
                };
                if self.channels_last {
                    kiln_kernels::simd::vectorize(|| {
                        for (((o, &v), &a), &b) in out.iter_mut().zip(src).zip(s).zip(t) {
                            *o = v * a + b;
                        }
                    });
                } else {
                    let (a, b) = (
                        s.get(i % c).copied().unwrap_or(0.0),
                        t.get(i % c).copied().unwrap_or(0.0),
                    );
                    kiln_kernels::simd::vectorize(|| {
                        for (o, &v) in out.iter_mut().zip(src) {
                            *o = v * a + b;
                        }
                    });
                }
                if let Some(a) = act {
                    kiln_kernels::sgemm::act_slice(a, out);
                }
            };
            if xd.len() < PAR_MIN {
                y.chunks_mut(row).enumerate().for_each(|(i, out)| apply(i, out));
            } else {
                kiln_kernels::pool::for_each_chunk_mut(&mut y, row, &apply);
            }
        }
        Ok(smallvec::smallvec![Tensor::from_buf(shape.to_vec(), y)?.into()])
    }

    /// Y has X's type.
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![inputs.first().map_or(ValueType::Unknown, |i| i.ty.clone())])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run(op: &ChannelAffine, x: &Tensor, s: &[f32], t: &[f32]) -> Vec<f32> {
        let c = s.len();
        let vals = [
            Value::Tensor(x.clone()),
            Value::Tensor(Tensor::from_vec(vec![c], s.to_vec()).unwrap()),
            Value::Tensor(Tensor::from_vec(vec![c], t.to_vec()).unwrap()),
        ];
        let ins: Vec<Option<&Value>> = vals.iter().map(Some).collect();
        let out = op.eval(&Args::new(&ins)).unwrap();
        out[0].as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec()
    }

    /// Channels-first and channels-last, with and without ReLU, small and large enough to
    /// split over 2 threads: each value is `x * s[c] + t[c]` of its channel.
    #[test]
    fn each_value_takes_its_channels_scale_and_shift() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (n, c, hw) in [(2, 3, 5), (1, 24, 48 * 48)] {
            let x: Vec<f32> = (0..n * c * hw).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.5).collect();
            let s: Vec<f32> = (0..c).map(|i| 0.5 + i as f32).collect();
            let t: Vec<f32> = (0..c).map(|i| i as f32 - 2.0).collect();
            for relu in [false, true] {
                let act = relu.then_some(Activation::Relu);
                let first = ChannelAffine {
                    channels_last: false,
                    activation: act,
                };
                let xf = Tensor::from_vec(vec![n, c, hw], x.clone()).unwrap();
                let got = pool.install(|| run(&first, &xf, &s, &t));
                for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
                    let ch = i / hw % c;
                    let want = v * s[ch] + t[ch];
                    assert_eq!(g, if relu { want.max(0.0) } else { want }, "first [{i}]");
                }
                // The same values channels-last: X [n, hw, c].
                let xl: Vec<f32> = (0..n * hw * c)
                    .map(|i| x[(i / (hw * c) * c + i % c) * hw + i / c % hw])
                    .collect();
                let last = ChannelAffine {
                    channels_last: true,
                    activation: act,
                };
                let got = pool.install(|| run(&last, &Tensor::from_vec(vec![n, hw, c], xl.clone()).unwrap(), &s, &t));
                for (i, (&g, &v)) in got.iter().zip(&xl).enumerate() {
                    let want = v * s[i % c] + t[i % c];
                    assert_eq!(g, if relu { want.max(0.0) } else { want }, "last [{i}]");
                }
            }
        }
    }

    #[test]
    fn parameters_of_the_wrong_length_or_type_are_refused() {
        let op = ChannelAffine::default();
        let x = Value::Tensor(Tensor::from_vec(vec![1, 3, 2], vec![0.0f32; 6]).unwrap());
        let two = Value::Tensor(Tensor::from_vec(vec![2], vec![1.0f32; 2]).unwrap());
        let three64 = Value::Tensor(Tensor::from_vec(vec![3], vec![1.0f64; 3]).unwrap());
        assert!(op.eval(&Args::new(&[Some(&x), Some(&two), Some(&two)])).is_err());
        assert!(
            op.eval(&Args::new(&[Some(&x), Some(&three64), Some(&three64)]))
                .is_err()
        );
    }
}
