//! `ChannelAffine`, made by the compiler: `y = act(x * scale[c] + shift[c])` per channel. It
//! is an inference BatchNormalization that no producer could absorb (DenseNet's
//! pre-activation `BN -> ReLU -> Conv`), its four parameters reduced to one scale and one shift
//! per channel (`scale / sqrt(var + eps)` and `B - mean * that`, computed in f64 and rounded
//! once). Channels are on axis 1 (`[N, C, ...]`), or last when `channels_last` is set (the
//! `layout` pass, when X is channels-last). An activation the `fuse_act` pass fused is
//! applied in the same pass over memory. In a QDQ model (the `qdq_glue` pass), X may be the
//! 8-bit tensor a `DequantizeLinear` read and Y the 8-bit tensor a `QuantizeLinear` wrote:
//! each block is then dequantized, scaled and shifted, activated and quantized in cache, by
//! the kernels of those ops (the same bits).

use super::activation::Activation;
use crate::elementwise::{ChainDequantize, ChainQuantize};
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
    /// X is 8-bit, dequantized with these parameters first.
    #[serde(default)]
    pub dequantize: Option<ChainDequantize>,
    /// Y is quantized to 8 bits with these parameters.
    #[serde(default)]
    pub quantize: Option<ChainQuantize>,
}

/// Elements per block of an 8-bit ChannelAffine's f32 values (in L1).
const BLOCK: usize = 4096;

kiln_kernels::scratch_kinds! {
    /// An 8-bit ChannelAffine's block of f32 values (per thread).
    AffineBlock: Vec<f32>;
}

impl ChannelAffine {
    /// Inputs: X (f32), scale and shift (f32, `[C]`).
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, scale, shift) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let x_type = self.dequantize.map_or(DType::F32, |d| d.dtype);
        if let Some((index, t)) = [(x_type, x), (DType::F32, scale), (DType::F32, shift)]
            .into_iter()
            .enumerate()
            .find(|(_, (want, t))| t.dtype() != *want)
        {
            return Err(OpError::UnsupportedDType {
                index,
                got: t.1.dtype(),
            });
        }
        if self.dequantize.is_some() || self.quantize.is_some() {
            return self.eval_8bit(x, scale, shift);
        }
        let shape = x.shape();
        // Channels-first: rows are planes of one channel; channels-last: rows are pixels.
        let (c, row) = self.geometry(shape, scale, shift)?;
        let (xd, s, t) = (x.as_slice::<f32>()?, scale.as_slice::<f32>()?, shift.as_slice::<f32>()?);
        let act = self.activation.map(|a| a.kernel_act());
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(xd.len());
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

    /// The channel count of X and each row's length (a pixel's channels, or a channel's
    /// plane), checked against the parameters.
    fn geometry(&self, shape: &[usize], scale: &Tensor, shift: &Tensor) -> Result<(usize, usize)> {
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
        let row = if self.channels_last {
            c
        } else {
            shape.iter().skip(2).product::<usize>()
        };
        Ok((c, row))
    }

    /// X 8-bit or Y 8-bit (or both): per block of whole rows, X's values dequantized into an
    /// f32 block (or copied), scaled and shifted, activated, and quantized into Y (or copied).
    fn eval_8bit(&self, x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<crate::Outputs> {
        let shape = x.shape().to_vec();
        let (c, row) = self.geometry(&shape, scale, shift)?;
        let (s, t) = (scale.as_slice::<f32>()?, shift.as_slice::<f32>()?);
        let y = match (self.dequantize.map(|d| d.dtype), self.quantize.map(|q| q.dtype)) {
            (None, None) => {
                return Err(OpError::UnsupportedDType {
                    index: 0,
                    got: x.dtype(),
                });
            }
            (None, Some(DType::U8)) => self.blocks::<f32, u8>(x, (c, row), s, t)?,
            (None, Some(DType::I8)) => self.blocks::<f32, i8>(x, (c, row), s, t)?,
            (Some(DType::U8), None) => self.blocks::<u8, f32>(x, (c, row), s, t)?,
            (Some(DType::I8), None) => self.blocks::<i8, f32>(x, (c, row), s, t)?,
            (Some(DType::U8), Some(DType::U8)) => self.blocks::<u8, u8>(x, (c, row), s, t)?,
            (Some(DType::U8), Some(DType::I8)) => self.blocks::<u8, i8>(x, (c, row), s, t)?,
            (Some(DType::I8), Some(DType::U8)) => self.blocks::<i8, u8>(x, (c, row), s, t)?,
            (Some(DType::I8), Some(DType::I8)) => self.blocks::<i8, i8>(x, (c, row), s, t)?,
            (Some(got), _) | (_, Some(got)) => return Err(OpError::UnsupportedDType { index: 0, got }),
        };
        Ok(smallvec::smallvec![y.into()])
    }

    fn blocks<X: Side, Y: Side>(&self, x: &Tensor, (c, row): (usize, usize), s: &[f32], t: &[f32]) -> Result<Tensor> {
        let xd = x.as_slice::<X>()?;
        let act = self.activation.map(|a| a.kernel_act());
        let mut y = crate::util::out_buf::<Y>(xd.len());
        let rows = (BLOCK / row.max(1)).max(1);
        let (dq, q) = (self.dequantize, self.quantize);
        let apply = |i: usize, out: &mut [Y]| {
            let first = i * rows * row;
            let Some(src) = xd.get(first..first + out.len()) else {
                return;
            };
            // This thread's block of f32 values, kept for the next block and run.
            let mut block = kiln_kernels::recycle::lend::<AffineBlock>();
            block.clear();
            block.resize(out.len(), 0.0);
            let v = &mut block[..];
            X::load(src, v, dq);
            for (k, r) in v.chunks_mut(row.max(1)).enumerate() {
                if self.channels_last {
                    kiln_kernels::simd::vectorize(|| {
                        for ((o, &a), &b) in r.iter_mut().zip(s).zip(t) {
                            *o = *o * a + b;
                        }
                    });
                } else {
                    let ch = (i * rows + k) % c.max(1);
                    let (a, b) = (s.get(ch).copied().unwrap_or(0.0), t.get(ch).copied().unwrap_or(0.0));
                    kiln_kernels::simd::vectorize(|| {
                        for o in r.iter_mut() {
                            *o = *o * a + b;
                        }
                    });
                }
            }
            if let Some(a) = act {
                kiln_kernels::sgemm::act_slice(a, v);
            }
            Y::store(v, out, q);
        };
        if row > 0 && c > 0 {
            if xd.len() < PAR_MIN {
                y.chunks_mut(rows * row).enumerate().for_each(|(i, out)| apply(i, out));
            } else {
                kiln_kernels::pool::for_each_chunk_mut(&mut y, rows * row, &apply);
            }
        }
        Ok(Tensor::from_buf(x.shape().to_vec(), y)?)
    }

    /// Y has X's type, or the 8-bit type it is quantized to (f32 when X is dequantized only).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let x = inputs.first().map_or(ValueType::Unknown, |i| i.ty.clone());
        let dtype = match (self.dequantize, self.quantize) {
            (_, Some(q)) => q.dtype,
            (Some(_), None) => DType::F32,
            (None, None) => return Ok(vec![x]),
        };
        Ok(vec![match x {
            ValueType::Tensor(t) => ValueType::Tensor(crate::value::TensorType {
                dtype: Some(dtype),
                shape: t.shape,
            }),
            other => other,
        }])
    }
}

/// An element type on either side of an 8-bit ChannelAffine: f32 as it is, or 8-bit values
/// (de)quantized by the ops' own kernels.
trait Side: kiln_tensor::Element + kiln_kernels::recycle::Recycled + Send + Sync {
    /// `x` into `v` (dequantized when 8-bit).
    fn load(x: &[Self], v: &mut [f32], dq: Option<ChainDequantize>);
    /// `v` into `y` (quantized when 8-bit).
    fn store(v: &[f32], y: &mut [Self], q: Option<ChainQuantize>);
}

impl Side for f32 {
    fn load(x: &[f32], v: &mut [f32], _: Option<ChainDequantize>) {
        v.copy_from_slice(x.get(..v.len()).unwrap_or(x));
    }
    fn store(v: &[f32], y: &mut [f32], _: Option<ChainQuantize>) {
        y.copy_from_slice(v.get(..y.len()).unwrap_or(v));
    }
}

macro_rules! side_8bit {
    ($t:ty) => {
        impl Side for $t {
            fn load(x: &[$t], v: &mut [f32], dq: Option<ChainDequantize>) {
                let (scale, zero) = dq.map_or((1.0, 0), |d| (d.scale, d.zero_point));
                kiln_kernels::quant::dequantize_row(x, v, scale, zero as $t);
            }
            fn store(v: &[f32], y: &mut [$t], q: Option<ChainQuantize>) {
                let (scale, zero) = q.map_or((1.0, 0.0), |q| (q.scale, q.zero_point));
                kiln_kernels::quant::quantize_row(v, y, scale, zero);
            }
        }
    };
}
side_8bit!(u8);
side_8bit!(i8);

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
                    ..ChannelAffine::default()
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
                    ..ChannelAffine::default()
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

    /// 8-bit X and Y, channels first and last, serial and over 2 threads: each byte is the
    /// quantized `relu(dq(x) * s[c] + t[c])` of its channel, by the formulas themselves.
    #[test]
    fn bytes_in_and_out_are_the_quantized_affine_of_the_dequantized_bytes() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let (sx, zx, sy, zy) = (0.03f32, 5u8, 0.021f32, 11.0f32);
        for (n, c, hw) in [(2, 3, 5), (1, 24, 48 * 48)] {
            let x: Vec<u8> = (0..n * c * hw).map(|i| (i * 37 % 251) as u8).collect();
            let s: Vec<f32> = (0..c).map(|i| 0.5 - 0.07 * i as f32).collect();
            let t: Vec<f32> = (0..c).map(|i| 0.2 * i as f32 - 1.0).collect();
            for channels_last in [false, true] {
                let op = ChannelAffine {
                    channels_last,
                    activation: Some(Activation::Relu),
                    dequantize: Some(ChainDequantize {
                        scale: sx,
                        zero_point: i32::from(zx),
                        dtype: DType::U8,
                    }),
                    quantize: Some(ChainQuantize {
                        scale: sy,
                        zero_point: zy,
                        dtype: DType::U8,
                    }),
                };
                let shape = if channels_last { vec![n, hw, c] } else { vec![n, c, hw] };
                let vals = [
                    Value::Tensor(Tensor::from_vec(shape, x.clone()).unwrap()),
                    Value::Tensor(Tensor::from_vec(vec![c], s.clone()).unwrap()),
                    Value::Tensor(Tensor::from_vec(vec![c], t.clone()).unwrap()),
                ];
                let ins: Vec<Option<&Value>> = vals.iter().map(Some).collect();
                let out = pool.install(|| op.eval(&Args::new(&ins))).unwrap();
                let got = out[0].as_tensor().unwrap().as_slice::<u8>().unwrap().to_vec();
                for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
                    let ch = if channels_last { i % c } else { i / hw % c };
                    let f = ((f32::from(v) - f32::from(zx)) * sx * s[ch] + t[ch]).max(0.0);
                    let want = ((f / sy).round_ties_even() + zy).clamp(0.0, 255.0) as u8;
                    assert_eq!(g, want, "[{i}] channels_last {channels_last}");
                }
                assert!(got.iter().any(|&q| q == 11) && got.iter().any(|&q| q > 40));
            }
        }
    }
}
