//! Family module: reductions along axes and the ops built on them: the `Reduce*` ops,
//! ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, the normalizations (Layer, RMS, Group, Instance,
//! Batch, Lp, MeanVariance, LRN), Dropout, the NegativeLogLikelihood and SoftmaxCrossEntropy
//! losses, and Det. Each submodule cites the ONNX operator spec and opsets it follows.

mod arg;
mod common;
mod dropout;
mod loss;
mod norm;
mod reduction;
mod softmax;

pub use arg::ArgReduce;
pub use dropout::{Det, Dropout};
pub use loss::{Loss, LossReduction};
pub use norm::{BatchNorm, GroupNorm, InstanceNorm, LayerNorm, LpNorm, Lrn, MeanVarianceNorm, RmsNorm};
pub use reduction::{Reduce, ReduceAxes, ReduceKind};
pub use softmax::{Softmax, SoftmaxKind};

use crate::error::Result;
use crate::value::{Args, InferInput, ValueType};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum ReduceOp {
    /// ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
    /// ReduceLogSum, ReduceLogSumExp, ReduceSumSquare.
    Reduce(Reduce),
    /// ArgMax, ArgMin.
    ArgReduce(ArgReduce),
    /// Softmax, LogSoftmax, Hardmax.
    Softmax(Softmax),
    LayerNormalization(LayerNorm),
    RmsNormalization(RmsNorm),
    GroupNormalization(GroupNorm),
    InstanceNormalization(InstanceNorm),
    BatchNormalization(BatchNorm),
    LpNormalization(LpNorm),
    MeanVarianceNormalization(MeanVarianceNorm),
    Lrn(Lrn),
    Dropout(Dropout),
    /// NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
    Loss(Loss),
    Det(Det),
}

impl ReduceOp {
    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Reduce(op) => op.kind.name(),
            ReduceOp::ArgReduce(op) => op.name(),
            ReduceOp::Softmax(op) => op.name(),
            ReduceOp::LayerNormalization(_) => "LayerNormalization",
            ReduceOp::RmsNormalization(_) => "RMSNormalization",
            ReduceOp::GroupNormalization(_) => "GroupNormalization",
            ReduceOp::InstanceNormalization(_) => "InstanceNormalization",
            ReduceOp::BatchNormalization(_) => "BatchNormalization",
            ReduceOp::LpNormalization(_) => "LpNormalization",
            ReduceOp::MeanVarianceNormalization(_) => "MeanVarianceNormalization",
            ReduceOp::Lrn(_) => "LRN",
            ReduceOp::Dropout(_) => "Dropout",
            ReduceOp::Loss(op) => op.name(),
            ReduceOp::Det(_) => "Det",
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        match self {
            ReduceOp::Reduce(op) => op.eval(args),
            ReduceOp::ArgReduce(op) => op.eval(args),
            ReduceOp::Softmax(op) => op.eval(args),
            ReduceOp::LayerNormalization(op) => op.eval(args),
            ReduceOp::RmsNormalization(op) => op.eval(args),
            ReduceOp::GroupNormalization(op) => op.eval(args),
            ReduceOp::InstanceNormalization(op) => op.eval(args),
            ReduceOp::BatchNormalization(op) => op.eval(args),
            ReduceOp::LpNormalization(op) => op.eval(args),
            ReduceOp::MeanVarianceNormalization(op) => op.eval(args),
            ReduceOp::Lrn(op) => op.eval(args),
            ReduceOp::Dropout(op) => op.eval(args),
            ReduceOp::Loss(op) => op.eval(args),
            ReduceOp::Det(op) => op.eval(args),
        }
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        match self {
            ReduceOp::Reduce(op) => op.infer(inputs),
            ReduceOp::ArgReduce(op) => op.infer(inputs),
            ReduceOp::Softmax(op) => op.infer(inputs),
            ReduceOp::LayerNormalization(op) => op.infer(inputs),
            ReduceOp::RmsNormalization(op) => op.infer(inputs),
            ReduceOp::BatchNormalization(op) => op.infer(inputs),
            ReduceOp::GroupNormalization(_)
            | ReduceOp::InstanceNormalization(_)
            | ReduceOp::LpNormalization(_)
            | ReduceOp::MeanVarianceNormalization(_)
            | ReduceOp::Lrn(_) => norm::infer_same_float(inputs),
            ReduceOp::Dropout(op) => op.infer(inputs),
            ReduceOp::Loss(op) => op.infer(inputs),
            ReduceOp::Det(op) => op.infer(inputs),
        }
    }
}
