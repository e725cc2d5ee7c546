//! Elementwise ops: one output element per (broadcast) input element.
//!
//! - [`unary`]: math functions and activations (Abs ... Atanh, Erf, Relu, Sigmoid, Gelu, ...),
//!   IsNaN, IsInf, Not, BitwiseNot;
//! - [`binary`]: arithmetic, Pow, Mod, bit shifts and bitwise ops, logic and comparisons;
//! - [`nary`]: Sum/Mean/Max/Min, Clip, Where, PRelu;
//! - [`cast`]: Cast, CastLike, BitCast;
//! - [`chain`]: `ElementwiseChain`, f32 unary and arithmetic ops fused into one pass (compiler-made);
//! - [`lookup`]: `Lookup8`, a function of an 8-bit value as a 256-entry table (compiler-made).
//!
//! Semantics follow the ONNX operator specs (<https://onnx.ai/onnx/operators/>) and ONNX's
//! numpy reference implementation; each submodule lists the opsets it covers.

mod math;
pub(crate) mod scalar;

pub mod binary;
pub mod cast;
pub mod chain;
pub mod lookup;
pub mod nary;
pub mod unary;

pub use binary::{Binary, BinaryOp};
pub use cast::{BitCast, Cast, CastLike};
pub use chain::{ChainBinary, ChainDequantize, ChainQuantize, ChainStep, ElementwiseChain};
pub use lookup::{Lookup8, LookupTable};
pub use nary::{Clip, VariadicOp};
pub use unary::UnaryOp;

use crate::error::{OpError, Result};
use crate::util::{infer_broadcast, input_dtype};
use crate::value::{Args, InferInput, TensorType, Value, ValueType};

op_family! {
    /// The elementwise family.
    pub enum ElementwiseOp {
        Unary(UnaryOp) = UnaryOp::name,
        Binary(Binary) = Binary::name,
        Variadic(VariadicOp) = VariadicOp::name,
        Clip(Clip),
        Where(Where),
        PRelu(PRelu),
        Cast(Cast),
        CastLike(CastLike),
        BitCast(BitCast),
        /// A run of f32 elementwise ops in one pass (made by the compiler, never imported).
        Chain(ElementwiseChain) = ElementwiseChain::name,
        /// An 8-bit value's function as a table (made by the compiler, never imported).
        Lookup(Lookup8) = Lookup8::name,
    }
}

/// `Where(condition, X, Y)`: X where the condition holds, else Y (numpy broadcasting).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Where;

/// `PRelu(X, slope)`: X where positive, else slope times X (slope broadcast to X).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct PRelu;

/// One tensor output.
fn one(t: kiln_tensor::Tensor) -> Result<crate::Outputs> {
    Ok(smallvec::smallvec![Value::Tensor(t)])
}

/// A tensor of input `i`'s shape and `dtype`.
fn same_shape(inputs: &[InferInput<'_>], i: usize, dtype: Option<kiln_tensor::DType>) -> Vec<ValueType> {
    let shape = inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.shape.clone());
    vec![ValueType::Tensor(TensorType { dtype, shape })]
}

impl UnaryOp {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(args.tensor(0)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let d = input_dtype(inputs, 0).map(|d| self.out_dtype(d)).transpose()?;
        Ok(same_shape(inputs, 0, d))
    }
}

impl Binary {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(args.tensor(0)?, args.tensor(1)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let op = self.op;
        let d = match (input_dtype(inputs, 0), input_dtype(inputs, 1)) {
            (Some(a), Some(b)) => Some(op.out_dtype(a, b)?),
            (Some(a), None) if !op.is_predicate() => Some(a),
            (None, Some(b)) if !op.is_predicate() && op != BinaryOp::Pow => Some(b),
            _ if op.is_predicate() => Some(kiln_tensor::DType::Bool),
            _ => None,
        };
        Ok(match self.legacy_axis {
            Some(_) => same_shape(inputs, 0, d),
            None => vec![infer_broadcast(inputs.get(..2).unwrap_or(inputs), d)],
        })
    }
}

impl VariadicOp {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(&args.tensors()?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let d = inputs.iter().find_map(|x| x.ty.tensor().and_then(|t| t.dtype));
        for x in inputs {
            if let (Some(a), Some(b)) = (d, x.ty.tensor().and_then(|t| t.dtype))
                && a != b
            {
                return Err(OpError::DTypeMismatch { a, b });
            }
        }
        Ok(vec![infer_broadcast(inputs, d)])
    }
}

impl Clip {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(args.tensor(0)?, args.opt_tensor(1)?, args.opt_tensor(2)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(same_shape(inputs, 0, input_dtype(inputs, 0)))
    }
}

impl Where {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(nary::eval_where(args.tensor(0)?, args.tensor(1)?, args.tensor(2)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let d = input_dtype(inputs, 1).or(input_dtype(inputs, 2));
        Ok(vec![infer_broadcast(inputs.get(..3).unwrap_or(inputs), d)])
    }
}

impl PRelu {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(nary::eval_prelu(args.tensor(0)?, args.tensor(1)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(same_shape(inputs, 0, input_dtype(inputs, 0)))
    }
}

impl Cast {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(args.tensor(0)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(same_shape(inputs, 0, Some(self.to)))
    }
}

impl CastLike {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(args.tensor(0)?, args.tensor(1)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(same_shape(inputs, 0, input_dtype(inputs, 1)))
    }
}

impl BitCast {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.apply(args.tensor(0)?)?)
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        if let Some(d) = input_dtype(inputs, 0) {
            self.out_dtype(d)?;
        }
        Ok(same_shape(inputs, 0, Some(self.to)))
    }
}

impl ElementwiseChain {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        one(self.run(args)?)
    }
}

#[cfg(test)]
mod tests;
