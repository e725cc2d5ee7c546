//! Family module: recurrent and sequence-mixing ops: `Attention` (opsets 23-25),
//! `RotaryEmbedding` (23), `RNN`/`GRU`/`LSTM` (opsets 7-22), and the opset 27/28 additions
//! `LinearAttention`, `CausalConvWithState` and `SwiGLU`, and `AttentionMask`, the mask of
//! ONNX Runtime's com.microsoft attention ops (kiln's own op; see [`contrib`]).

use crate::value::{InferInput, ValueType};

pub mod attention;
mod attention_f32;
pub mod contrib;
pub mod extra;
pub(crate) mod num;
pub mod rnn;

pub use attention::Attention;
pub use contrib::AttentionMask;
pub use extra::{CausalConvWithState, FlexAttention, LinearAttention, RotaryEmbedding, SwiGlu, UpdateRule};
pub use rnn::{Activation, Cell, Direction, Recurrent};

op_family! {
    /// The recurrent and sequence-mixing family.
    pub enum RecurrentOp {
        Attention(Attention),
        /// `RNN`, `GRU` and `LSTM`.
        Recurrent(Recurrent) = Recurrent::name,
        RotaryEmbedding(RotaryEmbedding),
        LinearAttention(LinearAttention),
        CausalConvWithState(CausalConvWithState),
        SwiGlu(SwiGlu) = |_: &SwiGlu| "SwiGLU",
        /// `ai.onnx.preview` `FlexAttention`.
        FlexAttention(FlexAttention),
        /// The additive mask of com.microsoft `Attention` / `MultiHeadAttention` (kiln's own).
        AttentionMask(AttentionMask),
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
