//! `QuantizeLinear` / `DequantizeLinear` (opsets 10, 13, 19, 21, 23, 24, 25, 28: per-tensor,
//! per-axis and blocked scales, `output_dtype`, `saturate`, `precision`; 8/16-bit, 4/2-bit
//! integer, float8 and float4 quantized types) and `DynamicQuantizeLinear` (opset 11).
//! <https://onnx.ai/onnx/operators/onnx__QuantizeLinear.html>,
//! <https://onnx.ai/onnx/operators/onnx__DequantizeLinear.html>,
//! <https://onnx.ai/onnx/operators/onnx__DynamicQuantizeLinear.html>

use crate::error::{OpError, Result};
use crate::recurrent::num::{self, in_shape, is_ieee_float, round_to, tt};
use crate::util::{input_dtype, norm_axis};
use crate::value::{Args, Dim, InferInput, TensorType, ValueType};
use kiln_tensor::{DType, Data, Tensor, formats};

/// Integer range of an integer quantized type.
pub(crate) fn int_range(dt: DType) -> Option<(f64, f64)> {
    Some(match dt {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::U4 | DType::I4 | DType::U2 | DType::I2 => formats::int_range(dt),
        _ => return None,
    })
}

fn is_fp8(dt: DType) -> bool {
    matches!(
        dt,
        DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ
    )
}

/// A tensor of an integer quantized type from integer values already clamped to its range.
pub(crate) fn int_tensor(dt: DType, shape: Vec<usize>, v: &[f64]) -> Result<Tensor> {
    let data = match dt {
        DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
        DType::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        DType::I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
        DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        DType::U4 | DType::I4 | DType::U2 | DType::I2 => {
            Data::Coded(v.iter().map(|&x| formats::wrap_int(dt, x as i64)).collect())
        }
        other => {
            return Err(OpError::UnsupportedDType { index: 0, got: other });
        }
    };
    Ok(Tensor::new(dt, shape, data)?)
}

/// The shape rules of a scale or zero point (input `index`) against X's, on static shapes:
/// `infer` applies them so that one which cannot fit is an error when the graph is compiled,
/// not when it first runs, and [`param_index`] on the run's shapes. Only dims fixed on both
/// sides are compared; the others wait for the run. Blocked parameters are checked for their
/// rank here, their dims by [`param_index`].
fn param_shape_fits(shape: &[Dim], pshape: &[Dim], axis: i64, block: usize, index: usize) -> Result<()> {
    let fixed = |d: &Dim| match d {
        Dim::Fixed(n) => Some(*n),
        Dim::Sym(_) => None,
    };
    let pfixed: Option<Vec<usize>> = pshape.iter().map(fixed).collect();
    let Some(pfixed) = pfixed else {
        return Ok(());
    };
    if pfixed.iter().product::<usize>() == 1 {
        return Ok(());
    }
    let rank = shape.len();
    let ax = norm_axis(axis, rank)?;
    let want = shape.get(ax).and_then(fixed);
    if block == 0 {
        if pfixed.len() != 1 || want.is_some_and(|w| pfixed.first() != Some(&w)) {
            let axis_dim = want.map_or_else(|| format!("axis {ax}'s size"), |w| w.to_string());
            return Err(OpError::input_shape(
                index,
                format!("one element, or [{axis_dim}] (axis {ax} of input 0)"),
                &pfixed,
            ));
        }
    } else if pfixed.len() != rank {
        return Err(OpError::input_shape(
            index,
            format!("rank {rank}, input 0's, with blocks on axis {ax}"),
            &pfixed,
        ));
    }
    Ok(())
}

/// [`param_shape_fits`] for the scale (input 1) and zero point (input 2) where X's and
/// theirs are known.
fn static_params(inputs: &[InferInput<'_>], axis: i64, block: usize) -> Result<()> {
    let Some(x) = in_shape(inputs, 0) else {
        return Ok(());
    };
    for index in [1, 2] {
        if let Some(p) = in_shape(inputs, index) {
            param_shape_fits(&x, &p, axis, block, index)?;
        }
    }
    Ok(())
}

/// For every element of `shape`, the flat index of its scale / zero point: per-tensor
/// (one element), per-axis (1-D of `shape[axis]`), or blocked (same rank, `axis` dim of
/// `ceil(shape[axis] / block_size)`). The parameter is input `index`.
fn param_index(shape: &[usize], pshape: &[usize], axis: i64, block: usize, index: usize) -> Result<Vec<usize>> {
    let n = crate::util::checked_numel(shape)?;
    let pn: usize = pshape.iter().product();
    if pn == 1 {
        return Ok(vec![0; n]);
    }
    let rank = shape.len();
    let ax = norm_axis(axis, rank)?;
    let strides = kiln_tensor::strides_of(shape);
    if block == 0 {
        // The per-axis rule is `infer`'s, on these fixed shapes.
        let fixed = |s: &[usize]| s.iter().map(|&d| Dim::Fixed(d)).collect::<Vec<_>>();
        param_shape_fits(&fixed(shape), &fixed(pshape), axis, 0, index)?;
        return Ok((0..n).map(|i| (i / strides[ax]) % shape[ax]).collect());
    }
    let blocks = shape[ax].div_ceil(block);
    let ok = pshape.len() == rank
        && (0..rank).all(|d| {
            if d == ax {
                pshape[d] == blocks
            } else {
                pshape[d] == shape[d]
            }
        });
    if !ok {
        let mut want = shape.to_vec();
        want[ax] = blocks;
        return Err(OpError::input_shape(
            index,
            format!("{want:?}, input 0's shape with {blocks} blocks on axis {ax}"),
            pshape,
        ));
    }
    let pstrides = kiln_tensor::strides_of(pshape);
    Ok((0..n)
        .map(|i| {
            (0..rank)
                .map(|d| {
                    let c = (i / strides[d]) % shape[d];
                    let c = if d == ax { c / block } else { c };
                    c * pstrides[d]
                })
                .sum()
        })
        .collect())
}

/// How a per-tensor or per-axis parameter of `pshape` (no blocks) lays over `shape`:
/// `(channels, inner)` with the parameter's element `(i / inner) % channels` for flat element
/// `i` (`channels == 1` per tensor). `None` for blocked or malformed parameters (the general
/// path then reports them).
fn axis_layout(shape: &[usize], pshape: &[usize], axis: i64, block: usize) -> Option<(usize, usize)> {
    if block != 0 {
        return None;
    }
    let n: usize = shape.iter().product();
    if pshape.iter().product::<usize>() == 1 {
        return Some((1, n.max(1)));
    }
    let ax = norm_axis(axis, shape.len()).ok()?;
    let c = *shape.get(ax)?;
    if pshape != [c] {
        return None;
    }
    Some((c, shape.get(ax + 1..)?.iter().product::<usize>().max(1)))
}

/// The runs of `inner` elements of `x` and `y` with their channel (see [`axis_layout`]).
fn channel_runs<'a, A, B>(
    x: &'a [A],
    y: &'a mut [B],
    (channels, inner): (usize, usize),
) -> impl Iterator<Item = (usize, &'a [A], &'a mut [B])> {
    x.chunks(inner)
        .zip(y.chunks_mut(inner))
        .enumerate()
        .map(move |(i, (a, b))| (i % channels.max(1), a, b))
}

/// `QuantizeLinear` of f32 by f32 scales to u8/i8, per tensor or per axis.
fn quantize_fast<T: kiln_kernels::quant::Q8 + kiln_tensor::Element + kiln_kernels::recycle::Recycled>(
    x: &Tensor,
    s: &[f32],
    z: Option<&[T]>,
    layout: (usize, usize),
) -> Option<Tensor> {
    let xv = x.as_slice::<f32>().ok()?;
    let mut y = crate::util::out_buf::<T>(xv.len());
    for (ch, a, b) in channel_runs(xv, y.as_mut_slice(), layout) {
        let scale = *s.get(ch).or(s.first())?;
        let zp = z.map_or(Some(0.0), |z| z.get(ch).or(z.first()).map(|v| v.to_f32()))?;
        kiln_kernels::quant::quantize_row(a, b, scale, zp);
    }
    Tensor::from_buf(x.shape(), y).ok()
}

/// `DequantizeLinear` of u8/i8 to f32 by f32 scales, per tensor or per axis.
fn dequantize_fast<T: kiln_kernels::quant::Q8 + kiln_tensor::Element>(
    x: &Tensor,
    s: &[f32],
    z: Option<&Tensor>,
    layout: (usize, usize),
) -> Option<Tensor> {
    let xv = x.as_slice::<T>().ok()?;
    let zv: Option<&[T]> = match z {
        Some(z) => Some(z.as_slice::<T>().ok()?),
        None => None,
    };
    let mut y = crate::util::out_f32(xv.len());
    for (ch, a, b) in channel_runs(xv, y.as_mut_slice(), layout) {
        let scale = *s.get(ch).or(s.first())?;
        let zp = match zv {
            Some(z) => *z.get(ch).or(z.first())?,
            None => T::from_clamped(0.0),
        };
        kiln_kernels::quant::dequantize_row(a, b, scale, zp);
    }
    Tensor::from_buf(x.shape(), y).ok()
}

/// `QuantizeLinear`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct QuantizeLinear {
    pub axis: i64,
    pub saturate: bool,
    /// 0 for per-tensor / per-axis.
    pub block_size: usize,
    /// Output type when there is no zero point (default u8).
    pub output_dtype: Option<DType>,
    /// Type the division `x / y_scale` is computed in (default: the scale's).
    pub precision: Option<DType>,
}

impl QuantizeLinear {
    fn out_dtype(&self, zp: Option<DType>) -> Result<DType> {
        match (zp, self.output_dtype) {
            (Some(z), Some(o)) if z != o => Err(OpError::attribute(
                "output_dtype",
                format!("{z}, the zero point's type"),
                o,
            )),
            (Some(z), _) => Ok(z),
            (None, Some(o)) => Ok(o),
            (None, None) => Ok(DType::U8),
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, s) = (args.tensor(0)?, args.tensor(1)?);
        let zp = args.opt_tensor(2)?;
        let sdt = num::need_float(s, 1)?;
        if !is_ieee_float(x.dtype()) && x.dtype() != DType::I32 {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: x.dtype(),
            });
        }
        let odt = self.out_dtype(zp.map(Tensor::dtype))?;
        // The common case on its own path: f32 in, f32 scales, 8-bit out, per tensor or axis.
        if x.dtype() == DType::F32
            && sdt == DType::F32
            && matches!(self.precision, None | Some(DType::F32))
            && let Some(layout) = axis_layout(x.shape(), s.shape(), self.axis, self.block_size)
            && zp.is_none_or(|z| z.shape() == s.shape())
            && let Ok(sv) = s.as_slice::<f32>()
        {
            let fast = match odt {
                DType::U8 => {
                    let z = match zp {
                        Some(z) => Some(z.as_slice::<u8>()?),
                        None => None,
                    };
                    quantize_fast::<u8>(x, sv, z, layout)
                }
                DType::I8 => {
                    let z = match zp {
                        Some(z) => Some(z.as_slice::<i8>()?),
                        None => None,
                    };
                    quantize_fast::<i8>(x, sv, z, layout)
                }
                _ => None,
            };
            if let Some(t) = fast {
                return Ok(smallvec::smallvec![t.into()]);
            }
        }
        let sidx = param_index(x.shape(), s.shape(), self.axis, self.block_size, 1)?;
        let sv = s.to_f64_vec();
        let zidx = match zp {
            Some(z) => Some(param_index(x.shape(), z.shape(), self.axis, self.block_size, 2)?),
            None => None,
        };
        let zv = zp.map(Tensor::to_f64_vec);
        let xv = x.to_f64_vec();
        // Division precision: the attribute, else the common type of x and the scale.
        let pdt = self.precision.unwrap_or(match (x.dtype(), sdt) {
            (a, b) if a == b => a,
            (DType::F64, _) | (_, DType::F64) => DType::F64,
            _ => DType::F32,
        });
        let q: Vec<f64> = xv
            .iter()
            .zip(&sidx)
            .map(|(&xe, &si)| round_to(pdt, round_to(pdt, xe) / sv[si]))
            .collect();
        let z = |i: usize| match (&zidx, &zv) {
            (Some(zi), Some(zv)) => zv[zi[i]],
            _ => 0.0,
        };
        let shape = x.shape().to_vec();
        let out = if let Some((lo, hi)) = int_range(odt) {
            if odt == DType::I32 {
                return Err(OpError::UnsupportedDType { index: 2, got: odt });
            }
            let v: Vec<f64> = q
                .iter()
                .enumerate()
                .map(|(i, &e)| (e.round_ties_even() + z(i)).clamp(lo, hi))
                .collect();
            int_tensor(odt, shape, &v)?
        } else if is_fp8(odt) || odt == DType::F4E2M1 {
            let codes = q
                .iter()
                .enumerate()
                .map(|(i, &e)| formats::encode_float(odt, (e + z(i)) as f32, self.saturate || odt == DType::F4E2M1))
                .collect();
            Tensor::from_codes(odt, shape, codes)?
        } else {
            return Err(OpError::UnsupportedDType { index: 2, got: odt });
        };
        Ok(smallvec::smallvec![out.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        static_params(inputs, self.axis, self.block_size)?;
        let odt = match (inputs.get(2).map(|i| i.ty), input_dtype(inputs, 2)) {
            (Some(ValueType::Tensor(_)), Some(z)) => Some(self.out_dtype(Some(z))?),
            (Some(ValueType::Tensor(_)), None) => None,
            _ => Some(self.out_dtype(None)?),
        };
        Ok(vec![tt(odt, in_shape(inputs, 0))])
    }
}

/// `DequantizeLinear`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DequantizeLinear {
    pub axis: i64,
    pub block_size: usize,
    /// Output type (default: the scale's).
    pub output_dtype: Option<DType>,
}

impl DequantizeLinear {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (x, s) = (args.tensor(0)?, args.tensor(1)?);
        let zp = args.opt_tensor(2)?;
        let sdt = num::need_float(s, 1)?;
        let xdt = x.dtype();
        let float_x = is_fp8(xdt) || xdt == DType::F4E2M1;
        if !float_x && int_range(xdt).is_none() {
            return Err(OpError::UnsupportedDType { index: 0, got: xdt });
        }
        let odt = self.output_dtype.unwrap_or(sdt);
        if !is_ieee_float(odt) {
            return Err(OpError::UnsupportedDType { index: 1, got: odt });
        }
        if sdt == DType::F32
            && odt == DType::F32
            && let Some(layout) = axis_layout(x.shape(), s.shape(), self.axis, self.block_size)
            && zp.is_none_or(|z| z.shape() == s.shape() && z.dtype() == xdt)
            && let Ok(sv) = s.as_slice::<f32>()
        {
            let fast = match xdt {
                DType::U8 => dequantize_fast::<u8>(x, sv, zp, layout),
                DType::I8 => dequantize_fast::<i8>(x, sv, zp, layout),
                _ => None,
            };
            if let Some(t) = fast {
                return Ok(smallvec::smallvec![t.into()]);
            }
        }
        let sidx = param_index(x.shape(), s.shape(), self.axis, self.block_size, 1)?;
        let sv = s.to_f64_vec();
        let xv = x.to_f64_vec();
        // Float8/float4 zero points are zero by definition; integer ones are subtracted.
        let zsub: Option<(Vec<usize>, Vec<f64>)> = match zp {
            Some(z) if !float_x => {
                if z.dtype() != xdt {
                    return Err(OpError::DTypeMismatch { a: xdt, b: z.dtype() });
                }
                Some((
                    param_index(x.shape(), z.shape(), self.axis, self.block_size, 2)?,
                    z.to_f64_vec(),
                ))
            }
            _ => None,
        };
        let y: Vec<f64> = xv
            .iter()
            .enumerate()
            .map(|(i, &e)| {
                let d = match &zsub {
                    Some((zi, zv)) => e - zv[zi[i]],
                    None => e,
                };
                round_to(odt, round_to(DType::F32, round_to(DType::F32, d) * sv[sidx[i]]))
            })
            .collect();
        Ok(smallvec::smallvec![
            num::float_tensor(odt, x.shape().to_vec(), y)?.into()
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        static_params(inputs, self.axis, self.block_size)?;
        let odt = self.output_dtype.or_else(|| input_dtype(inputs, 1));
        Ok(vec![tt(odt, in_shape(inputs, 0))])
    }
}

/// `DynamicQuantizeLinear`: u8 asymmetric quantization with scale and zero point computed
/// from the data range (which always includes 0).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DynamicQuantizeLinear;

/// Elements per piece of `DynamicQuantizeLinear`'s two passes over the pool.
const DYNAMIC_PIECE: usize = 1 << 14;

impl DynamicQuantizeLinear {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let xv = x.as_slice::<f32>().map_err(|_| OpError::UnsupportedDType {
            index: 0,
            got: x.dtype(),
        })?;
        // Without NaNs: the vectorised range, then the quantize row kernel (the same formulas),
        // both split over the pool by pieces (a range is the same whatever the split).
        let piece = DYNAMIC_PIECE;
        let mut ranges: Vec<Option<(f32, f32)>> = vec![None; xv.len().div_ceil(piece)];
        kiln_kernels::pool::for_each_chunk_mut(&mut ranges, 1, &|i, r| {
            if let (Some(slot), Some(part)) = (r.first_mut(), xv.get(i * piece..xv.len().min((i + 1) * piece))) {
                *slot = kiln_kernels::quant::min_max(part);
            }
        });
        let range = ranges.iter().try_fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), r| {
            r.map(|(a, b)| (l.min(a), h.max(b)))
        });
        if let Some((lo, hi)) = range {
            let (minx, maxx) = (lo.min(0.0), hi.max(0.0));
            let scale = (if maxx == minx { 1.0 } else { maxx - minx }) / 255.0f32;
            let zp = (0.0f32 - minx / scale).clamp(0.0, 255.0).round_ties_even();
            let mut y = crate::util::out_buf::<u8>(xv.len());
            kiln_kernels::pool::for_each_chunk_mut(y.as_mut_slice(), piece, &|i, out| {
                if let Some(part) = xv.get(i * piece..) {
                    kiln_kernels::quant::quantize_row(part, out, scale, zp);
                }
            });
            return Ok(smallvec::smallvec![
                Tensor::from_buf(x.shape(), y)?.into(),
                Tensor::scalar(scale).into(),
                Tensor::scalar(zp as u8).into(),
            ]);
        }
        let maxx = xv.iter().fold(0.0f32, |m, &v| if v > m || v.is_nan() { v } else { m });
        let minx = xv.iter().fold(0.0f32, |m, &v| if v < m || v.is_nan() { v } else { m });
        let scale = (if maxx == minx { 1.0 } else { maxx - minx }) / 255.0f32;
        let zp = (0.0f32 - minx / scale).clamp(0.0, 255.0).round_ties_even();
        let y: Vec<u8> = xv
            .iter()
            .map(|&v| ((v / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8)
            .collect();
        Ok(smallvec::smallvec![
            Tensor::from_vec(x.shape(), y)?.into(),
            Tensor::scalar(scale).into(),
            Tensor::scalar(zp as u8).into(),
        ])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![
            tt(Some(DType::U8), in_shape(inputs, 0)),
            ValueType::Tensor(TensorType::fixed(DType::F32, &[])),
            ValueType::Tensor(TensorType::fixed(DType::U8, &[])),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run1(outs: Result<crate::Outputs>) -> Tensor {
        outs.unwrap().remove(0).as_tensor().unwrap().clone()
    }

    #[test]
    fn infer_refuses_parameters_that_cannot_fit_x() {
        let ty = |shape: &[usize]| ValueType::Tensor(TensorType::fixed(DType::F32, shape));
        let sym = ValueType::Tensor(TensorType {
            dtype: Some(DType::F32),
            shape: Some(vec![Dim::Sym("n".into())]),
        });
        let op = DequantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: None,
        };
        let infer = |x: &ValueType, s: &ValueType| {
            let inputs = [
                InferInput {
                    ty: x,
                    konst: None,
                    present: true,
                },
                InferInput {
                    ty: s,
                    konst: None,
                    present: true,
                },
            ];
            op.infer(&inputs)
        };
        // Per-channel scales on a rank-1 tensor with axis 1 (ONNX Runtime's quantizer writes
        // them for some biases): the axis is out of range.
        assert!(matches!(
            infer(&ty(&[64]), &ty(&[64])),
            Err(OpError::Axis { axis: 1, rank: 1 })
        ));
        // Four scales for axis 1 of size 8.
        assert!(infer(&ty(&[2, 8]), &ty(&[4])).is_err());
        // Fitting, one element, or a size known only at run time: accepted.
        assert!(infer(&ty(&[2, 8]), &ty(&[8])).is_ok());
        assert!(infer(&ty(&[64]), &ty(&[1])).is_ok());
        assert!(infer(&ty(&[2, 8]), &sym).is_ok());
    }

    #[test]
    fn quantize_per_axis_rounds_half_even_and_saturates() {
        // Per-axis scales [1, 2] on axis 1, zero point 10: 2.5/1 -> 2 (+10) = 12;
        // 5/2 = 2.5 -> 2 (+10) = 12; 300 saturates to 255; -7/2 = -3.5 -> -4 (+10) = 6.
        let x = Tensor::from_vec(vec![2, 2], vec![2.5f32, 5.0, 300.0, -7.0]).unwrap();
        let s = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
        let z = Tensor::from_vec(vec![2], vec![10u8, 10]).unwrap();
        let op = QuantizeLinear {
            axis: 1,
            saturate: true,
            block_size: 0,
            output_dtype: None,
            precision: None,
        };
        let (vx, vs, vz) = (Value::Tensor(x), Value::Tensor(s), Value::Tensor(z));
        let y = run1(op.eval(&Args::new(&[Some(&vx), Some(&vs), Some(&vz)])));
        assert_eq!(y.as_slice::<u8>().unwrap(), &[12, 12, 255, 6]);
    }

    #[test]
    fn dequantize_int4_blocked() {
        // int4 codes for [-8, 7, 1, -1] in one row, blocks of 2 with scales [0.5, 2]:
        // y = [-4, 3.5, 2, -2].
        let codes = vec![0x8u8, 0x7, 0x1, 0xF];
        let x = Tensor::from_codes(DType::I4, vec![1, 4], codes).unwrap();
        let s = Tensor::from_vec(vec![1, 2], vec![0.5f32, 2.0]).unwrap();
        let op = DequantizeLinear {
            axis: 1,
            block_size: 2,
            output_dtype: None,
        };
        let (vx, vs) = (Value::Tensor(x), Value::Tensor(s));
        let y = run1(op.eval(&Args::new(&[Some(&vx), Some(&vs)])));
        assert_eq!(y.as_slice::<f32>().unwrap(), &[-4.0, 3.5, 2.0, -2.0]);
    }

    /// Split over a two-thread pool by pieces, the range is the whole tensor's (its minimum
    /// and maximum sit in different pieces) and every element is the formula's.
    #[test]
    fn dynamic_quantize_over_the_pool_takes_the_whole_range() {
        let n = 50_000;
        let mut v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.001).sin()).collect();
        v[3] = -2.0;
        v[n - 2] = 3.1;
        let vx = Value::Tensor(Tensor::from_vec(vec![n], v.clone()).unwrap());
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let out = pool.install(|| DynamicQuantizeLinear.eval(&Args::new(&[Some(&vx)])).unwrap());
        let scale = out[1].as_tensor().unwrap().as_slice::<f32>().unwrap()[0];
        let zp = out[2].as_tensor().unwrap().as_slice::<u8>().unwrap()[0];
        assert_eq!(scale, 5.1f32 / 255.0);
        let want_zp = (2.0f32 / scale).round_ties_even();
        assert_eq!(f32::from(zp), want_zp);
        let y = out[0].as_tensor().unwrap().as_slice::<u8>().unwrap();
        for (i, (&q, &x)) in y.iter().zip(&v).enumerate() {
            let want = ((x / scale).round_ties_even() + want_zp).clamp(0.0, 255.0) as u8;
            assert_eq!(q, want, "element {i}");
        }
    }

    #[test]
    fn dynamic_quantize_by_hand() {
        // Range [-1, 1.55]: scale = 2.55/255 = 0.01, zp = 100; 0.5 -> 50 + 100 = 150.
        let x = Tensor::from_vec(vec![3], vec![-1.0f32, 1.55, 0.5]).unwrap();
        let vx = Value::Tensor(x);
        let out = DynamicQuantizeLinear.eval(&Args::new(&[Some(&vx)])).unwrap();
        let y = out[0].as_tensor().unwrap();
        assert_eq!(y.as_slice::<u8>().unwrap(), &[0, 255, 150]);
        let s = out[1].as_tensor().unwrap().as_slice::<f32>().unwrap()[0];
        assert!((s - 0.01).abs() < 1e-7);
        assert_eq!(out[2].as_tensor().unwrap().as_slice::<u8>().unwrap(), &[100]);
    }
}
