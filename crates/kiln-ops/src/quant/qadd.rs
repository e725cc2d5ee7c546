//! `QLinearAdd`: the sum of two quantized tensors, requantized, as one op. kiln's own (the
//! `qdq_conv` family of passes writes it for `QuantizeLinear(DequantizeLinear(A) +
//! DequantizeLinear(B))`), with com.microsoft's input order: `A, A_scale, A_zero_point, B,
//! B_scale, B_zero_point, C_scale, C_zero_point`. Its value is defined as that composition:
//! per-tensor (or per-axis) DequantizeLinear of A and of B, an f32 Add with broadcasting, and
//! QuantizeLinear to C's zero point type. Same-shaped 8-bit operands with one scale and zero
//! point each run in one fused pass: the sum as an affine map of the two codes with the
//! scale ratios (`kiln_kernels::quant::SumMap`, as ONNX Runtime's QLinearAdd computes it),
//! which gives the three ops' codes except where a sum lies within an f32 rounding of a tie
//! (then the neighbouring code); anything else runs the three ops.

use crate::elementwise::{Binary, BinaryOp};
use crate::error::{OpError, Result};
use crate::quant::{DequantizeLinear, QuantizeLinear};
use crate::recurrent::num::{in_shape, tt};
use crate::value::{Args, InferInput, Value, ValueType};
use kiln_kernels::quant::{Operand, Q8, add_dequantized_row};
use kiln_tensor::{DType, Element, Tensor, broadcast_shapes};

/// See the module docs.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct QLinearAdd {
    /// A Relu between the sum and its quantization (kiln's QDQ fusion): `Q(Relu(DQ(a) +
    /// DQ(b)))`, which is `max(Q(DQ(a) + DQ(b)), zy)` exactly (Q is monotonic, `Q(0) = zy`).
    #[serde(default)]
    pub relu: bool,
}

/// One f32 scale.
pub(crate) fn scale(t: &Tensor) -> Option<f32> {
    (t.len() == 1)
        .then(|| t.as_slice::<f32>().ok()?.first().copied())
        .flatten()
}

/// One zero point as f32 (absent: 0).
pub(crate) fn zero(t: Option<&Tensor>) -> Option<f32> {
    match t {
        None => Some(0.0),
        Some(t) if t.len() == 1 => t.to_f64_vec().first().map(|&v| v as f32),
        Some(_) => None,
    }
}

impl QLinearAdd {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        if let Some(t) = self.fused(args)? {
            return Ok(smallvec::smallvec![t.into()]);
        }
        let dq = DequantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: None,
        };
        let part = |i: usize| -> Result<Value> {
            let inputs = [args.value(i), args.value(i + 1), args.value(i + 2)];
            let mut out = dq.eval(&Args::new(&inputs))?;
            out.pop().ok_or(OpError::MissingInput { index: i })
        };
        let (a, b) = (part(0)?, part(3)?);
        let add = Binary {
            op: BinaryOp::Add,
            legacy_axis: None,
        };
        let mut sum = add.eval(&Args::new(&[Some(&a), Some(&b)]))?;
        let mut sum = sum.pop().ok_or(OpError::MissingInput { index: 0 })?;
        if self.relu {
            let relu = crate::elementwise::UnaryOp::Relu;
            sum = relu
                .eval(&Args::new(&[Some(&sum)]))?
                .pop()
                .ok_or(OpError::MissingInput { index: 0 })?;
        }
        let q = QuantizeLinear {
            axis: 1,
            saturate: true,
            block_size: 0,
            output_dtype: None,
            precision: None,
        };
        q.eval(&Args::new(&[Some(&sum), args.value(6), args.value(7)]))
    }

    /// The fused pass, when it applies.
    fn fused(&self, args: &Args<'_>) -> Result<Option<Tensor>> {
        let (a, b) = (args.tensor(0)?, args.tensor(3)?);
        let (Some(sa), Some(sb), Some(sy)) = (scale(args.tensor(1)?), scale(args.tensor(4)?), scale(args.tensor(6)?))
        else {
            return Ok(None);
        };
        let (Some(za), Some(zb)) = (zero(args.opt_tensor(2)?), zero(args.opt_tensor(5)?)) else {
            return Ok(None);
        };
        let zt = args.opt_tensor(7)?;
        let Some(zy) = zero(zt) else { return Ok(None) };
        if a.shape() != b.shape() || zt.is_some_and(|z| z.dtype() != DType::U8 && z.dtype() != DType::I8) {
            return Ok(None);
        }
        let ydt = zt.map_or(DType::U8, Tensor::dtype);
        fn go<A: Q8 + Element, B: Q8 + Element, Y: Q8 + Element + Ord + kiln_kernels::recycle::Recycled>(
            a: &Tensor,
            (sa, za): (f32, f32),
            b: &Tensor,
            (sb, zb): (f32, f32),
            (sy, zy): (f32, f32),
            relu: bool,
        ) -> Result<Tensor> {
            let (av, bv) = (a.as_slice::<A>()?, b.as_slice::<B>()?);
            // The Relu's floor: the output's zero point (already within Y's range).
            let floor = Y::from_clamped(zy.clamp(Y::LO, Y::HI));
            let mut y = crate::util::out_buf::<Y>(av.len());
            // Blocks over the current pool.
            const BLOCK: usize = 1 << 14;
            kiln_kernels::pool::for_each_chunk_mut(&mut y, BLOCK, &|i, out| {
                let r = i * BLOCK..i * BLOCK + out.len();
                let (Some(x), Some(z)) = (av.get(r.clone()), bv.get(r)) else {
                    return;
                };
                add_dequantized_row(
                    Operand {
                        values: x,
                        scale: sa,
                        zero_point: za,
                    },
                    Operand {
                        values: z,
                        scale: sb,
                        zero_point: zb,
                    },
                    out,
                    sy,
                    zy,
                );
                if relu {
                    kiln_kernels::simd::vectorize(|| {
                        for v in out.iter_mut() {
                            *v = (*v).max(floor);
                        }
                    });
                }
            });
            Ok(Tensor::from_buf(a.shape().to_vec(), y)?)
        }
        let (pa, pb, py) = ((sa, za), (sb, zb), (sy, zy));
        let t = match (a.dtype(), b.dtype(), ydt) {
            (DType::U8, DType::U8, DType::U8) => go::<u8, u8, u8>(a, pa, b, pb, py, self.relu)?,
            (DType::U8, DType::U8, DType::I8) => go::<u8, u8, i8>(a, pa, b, pb, py, self.relu)?,
            (DType::I8, DType::I8, DType::I8) => go::<i8, i8, i8>(a, pa, b, pb, py, self.relu)?,
            (DType::I8, DType::I8, DType::U8) => go::<i8, i8, u8>(a, pa, b, pb, py, self.relu)?,
            (DType::U8, DType::I8, DType::U8) => go::<u8, i8, u8>(a, pa, b, pb, py, self.relu)?,
            (DType::I8, DType::U8, DType::U8) => go::<i8, u8, u8>(a, pa, b, pb, py, self.relu)?,
            _ => return Ok(None),
        };
        Ok(Some(t))
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dt = crate::util::input_dtype(inputs, 7).or(Some(DType::U8));
        let shape = match (in_shape(inputs, 0), in_shape(inputs, 3)) {
            (Some(a), Some(b)) if a == b => Some(a),
            (Some(a), Some(b)) => {
                let fixed = |s: &[crate::value::Dim]| {
                    s.iter()
                        .map(crate::recurrent::num::fixed)
                        .collect::<Option<Vec<usize>>>()
                };
                match (fixed(&a), fixed(&b)) {
                    (Some(x), Some(y)) => broadcast_shapes(&x, &y)
                        .ok()
                        .map(|s| s.into_iter().map(crate::value::Dim::Fixed).collect()),
                    _ => None,
                }
            }
            _ => None,
        };
        Ok(vec![tt(dt, shape)])
    }
}
