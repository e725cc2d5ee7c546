//! Elementwise ops: one output element per (broadcast) input element.
//!
//! - [`unary`]: math functions and activations (Abs ... Atanh, Erf, Relu, Sigmoid, Gelu, ...),
//!   IsNaN, IsInf, Not, BitwiseNot;
//! - [`binary`]: arithmetic, Pow, Mod, bit shifts and bitwise ops, logic and comparisons;
//! - [`nary`]: Sum/Mean/Max/Min, Clip, Where, PRelu;
//! - [`cast`]: Cast, CastLike, BitCast;
//! - [`chain`]: `ElementwiseChain`, f32 unary and arithmetic ops fused into one pass (compiler-made).
//!
//! Semantics follow the ONNX operator specs (<https://onnx.ai/onnx/operators/>) and ONNX's
//! numpy reference implementation; each submodule lists the opsets it covers.

mod math;
pub(crate) mod scalar;

pub mod binary;
pub mod cast;
pub mod chain;
pub mod nary;
pub mod unary;

pub use binary::{Binary, BinaryOp};
pub use cast::{BitCast, Cast, CastLike};
pub use chain::{ChainBinary, ChainStep, ElementwiseChain};
pub use nary::{Clip, VariadicOp};
pub use unary::UnaryOp;

use crate::error::{OpError, Result};
use crate::util::{infer_broadcast, input_dtype};
use crate::value::{Args, InferInput, TensorType, Value, ValueType};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum ElementwiseOp {
    Unary(UnaryOp),
    Binary(Binary),
    Variadic(VariadicOp),
    Clip(Clip),
    Where,
    PRelu,
    Cast(Cast),
    CastLike(CastLike),
    BitCast(BitCast),
    /// A run of f32 elementwise ops in one pass (made by the compiler, never imported).
    Chain(ElementwiseChain),
}

impl ElementwiseOp {
    pub fn name(&self) -> &'static str {
        match self {
            ElementwiseOp::Unary(op) => op.name(),
            ElementwiseOp::Binary(op) => op.name(),
            ElementwiseOp::Variadic(op) => op.name(),
            ElementwiseOp::Clip(_) => "Clip",
            ElementwiseOp::Where => "Where",
            ElementwiseOp::PRelu => "PRelu",
            ElementwiseOp::Cast(_) => "Cast",
            ElementwiseOp::CastLike(_) => "CastLike",
            ElementwiseOp::BitCast(_) => "BitCast",
            ElementwiseOp::Chain(op) => op.name(),
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let out = match self {
            ElementwiseOp::Unary(op) => op.eval(args.tensor(0)?)?,
            ElementwiseOp::Binary(op) => op.eval(args.tensor(0)?, args.tensor(1)?)?,
            ElementwiseOp::Variadic(op) => op.eval(&args.tensors()?)?,
            ElementwiseOp::Clip(op) => op.eval(args.tensor(0)?, args.opt_tensor(1)?, args.opt_tensor(2)?)?,
            ElementwiseOp::Where => nary::eval_where(args.tensor(0)?, args.tensor(1)?, args.tensor(2)?)?,
            ElementwiseOp::PRelu => nary::eval_prelu(args.tensor(0)?, args.tensor(1)?)?,
            ElementwiseOp::Cast(op) => op.eval(args.tensor(0)?)?,
            ElementwiseOp::CastLike(op) => op.eval(args.tensor(0)?, args.tensor(1)?)?,
            ElementwiseOp::BitCast(op) => op.eval(args.tensor(0)?)?,
            ElementwiseOp::Chain(op) => op.eval(args)?,
        };
        Ok(smallvec::smallvec![Value::Tensor(out)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dt = |i: usize| input_dtype(inputs, i);
        let same_shape = |i: usize, dtype| {
            let shape = inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.shape.clone());
            ValueType::Tensor(TensorType { dtype, shape })
        };
        let ty = match self {
            ElementwiseOp::Chain(op) => return op.infer(inputs),
            ElementwiseOp::Unary(op) => {
                let d = dt(0).map(|d| op.out_dtype(d)).transpose()?;
                same_shape(0, d)
            }
            ElementwiseOp::Binary(op) => {
                let d = match (dt(0), dt(1)) {
                    (Some(a), Some(b)) => Some(op.op.out_dtype(a, b)?),
                    (Some(a), None) if !op.op.is_predicate() => Some(a),
                    (None, Some(b)) if !op.op.is_predicate() && op.op != BinaryOp::Pow => Some(b),
                    _ if op.op.is_predicate() => Some(kiln_tensor::DType::Bool),
                    _ => None,
                };
                match op.legacy_axis {
                    Some(_) => same_shape(0, d),
                    None => infer_broadcast(inputs.get(..2).unwrap_or(inputs), d),
                }
            }
            ElementwiseOp::Variadic(_) => {
                let d = inputs.iter().find_map(|x| x.ty.tensor().and_then(|t| t.dtype));
                for x in inputs {
                    if let (Some(a), Some(b)) = (d, x.ty.tensor().and_then(|t| t.dtype))
                        && a != b
                    {
                        return Err(OpError::DTypeMismatch { a, b });
                    }
                }
                infer_broadcast(inputs, d)
            }
            ElementwiseOp::Clip(_) => same_shape(0, dt(0)),
            ElementwiseOp::Where => {
                let d = dt(1).or(dt(2));
                infer_broadcast(inputs.get(..3).unwrap_or(inputs), d)
            }
            ElementwiseOp::PRelu => same_shape(0, dt(0)),
            ElementwiseOp::Cast(op) => same_shape(0, Some(op.to)),
            ElementwiseOp::CastLike(_) => same_shape(0, dt(1)),
            ElementwiseOp::BitCast(op) => {
                if let Some(d) = dt(0) {
                    op.out_dtype(d)?;
                }
                same_shape(0, Some(op.to))
            }
        };
        Ok(vec![ty])
    }
}

#[cfg(test)]
mod tests;
