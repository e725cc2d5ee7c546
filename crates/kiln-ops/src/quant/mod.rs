//! Family module: quantization ops: `QuantizeLinear`, `DequantizeLinear`,
//! `DynamicQuantizeLinear`, `MatMulInteger`, `ConvInteger`, `QLinearMatMul`, `QLinearConv`.

use crate::error::Result;
use crate::value::{Args, InferInput, ValueType};

pub mod integer;
pub mod linear;

pub use integer::{AutoPad, ConvAttrs, ConvInteger, MatMulInteger, QLinearConv, QLinearMatMul};
pub use linear::{DequantizeLinear, DynamicQuantizeLinear, QuantizeLinear};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum QuantOp {
    QuantizeLinear(QuantizeLinear),
    DequantizeLinear(DequantizeLinear),
    DynamicQuantizeLinear(DynamicQuantizeLinear),
    MatMulInteger(MatMulInteger),
    ConvInteger(ConvInteger),
    QLinearMatMul(QLinearMatMul),
    QLinearConv(QLinearConv),
}

macro_rules! each_op {
    ($self:expr, $op:ident => $body:expr) => {
        match $self {
            QuantOp::QuantizeLinear($op) => $body,
            QuantOp::DequantizeLinear($op) => $body,
            QuantOp::DynamicQuantizeLinear($op) => $body,
            QuantOp::MatMulInteger($op) => $body,
            QuantOp::ConvInteger($op) => $body,
            QuantOp::QLinearMatMul($op) => $body,
            QuantOp::QLinearConv($op) => $body,
        }
    };
}

impl QuantOp {
    pub fn name(&self) -> &'static str {
        match self {
            QuantOp::QuantizeLinear(_) => "QuantizeLinear",
            QuantOp::DequantizeLinear(_) => "DequantizeLinear",
            QuantOp::DynamicQuantizeLinear(_) => "DynamicQuantizeLinear",
            QuantOp::MatMulInteger(_) => "MatMulInteger",
            QuantOp::ConvInteger(_) => "ConvInteger",
            QuantOp::QLinearMatMul(_) => "QLinearMatMul",
            QuantOp::QLinearConv(_) => "QLinearConv",
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        each_op!(self, op => op.eval(args))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        each_op!(self, op => op.infer(inputs))
    }
}
