//! Family module: recurrent ops (filled in below).

use crate::error::Result;
use crate::value::{Args, InferInput, Value, ValueType};

#[derive(Debug, Clone, PartialEq)]
pub enum RecurrentOp {}

impl RecurrentOp {
    pub fn name(&self) -> &'static str {
        match *self {}
    }
    pub fn eval(&self, _args: &Args<'_>) -> Result<Vec<Value>> {
        match *self {}
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        match *self {}
    }
}

impl RecurrentOp {
    pub fn macs(&self, _inputs: &[InferInput<'_>], _outputs: &[ValueType]) -> u64 {
        match *self {}
    }
}
