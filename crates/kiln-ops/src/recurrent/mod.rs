//! Family module: recurrent and sequence-mixing ops: `Attention` (opsets 23-25),
//! `RotaryEmbedding` (23), `RNN`/`GRU`/`LSTM` (opsets 7-22), and the opset 27/28 additions
//! `LinearAttention`, `CausalConvWithState` and `SwiGLU`.

use crate::error::Result;
use crate::value::{Args, InferInput, ValueType};

pub mod attention;
mod attention_f32;
pub mod extra;
pub(crate) mod num;
pub mod rnn;

pub use attention::Attention;
pub use extra::{CausalConvWithState, FlexAttention, LinearAttention, RotaryEmbedding, SwiGlu, UpdateRule};
pub use rnn::{Activation, Cell, Direction, Recurrent};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum RecurrentOp {
    Attention(Attention),
    /// `RNN`, `GRU` and `LSTM`.
    Recurrent(Recurrent),
    RotaryEmbedding(RotaryEmbedding),
    LinearAttention(LinearAttention),
    CausalConvWithState(CausalConvWithState),
    SwiGlu(SwiGlu),
    /// `ai.onnx.preview` `FlexAttention`.
    FlexAttention(FlexAttention),
}

macro_rules! each_op {
    ($self:expr, $op:ident => $body:expr) => {
        match $self {
            RecurrentOp::Attention($op) => $body,
            RecurrentOp::Recurrent($op) => $body,
            RecurrentOp::RotaryEmbedding($op) => $body,
            RecurrentOp::LinearAttention($op) => $body,
            RecurrentOp::CausalConvWithState($op) => $body,
            RecurrentOp::SwiGlu($op) => $body,
            RecurrentOp::FlexAttention($op) => $body,
        }
    };
}

impl RecurrentOp {
    pub fn name(&self) -> &'static str {
        match self {
            RecurrentOp::Attention(_) => "Attention",
            RecurrentOp::Recurrent(op) => op.name(),
            RecurrentOp::RotaryEmbedding(_) => "RotaryEmbedding",
            RecurrentOp::LinearAttention(_) => "LinearAttention",
            RecurrentOp::CausalConvWithState(_) => "CausalConvWithState",
            RecurrentOp::SwiGlu(_) => "SwiGLU",
            RecurrentOp::FlexAttention(_) => "FlexAttention",
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        each_op!(self, op => op.eval(args))
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        each_op!(self, op => op.infer(inputs))
    }
}

impl RecurrentOp {
    pub fn macs(&self, inputs: &[InferInput<'_>], outputs: &[ValueType]) -> u64 {
        match self {
            RecurrentOp::Attention(op) => op.macs(inputs, outputs),
            RecurrentOp::Recurrent(op) => op.macs(inputs, outputs),
            _ => 0,
        }
    }
}
