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

op_family! {
    /// The reduction family.
    pub enum ReduceOp {
        /// ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
        /// ReduceLogSum, ReduceLogSumExp, ReduceSumSquare.
        Reduce(Reduce) = |op: &Reduce| op.kind.name(),
        /// ArgMax, ArgMin.
        ArgReduce(ArgReduce) = ArgReduce::name,
        /// Softmax, LogSoftmax, Hardmax.
        Softmax(Softmax) = Softmax::name,
        LayerNormalization(LayerNorm),
        RmsNormalization(RmsNorm) = |_: &RmsNorm| "RMSNormalization",
        GroupNormalization(GroupNorm),
        InstanceNormalization(InstanceNorm),
        BatchNormalization(BatchNorm),
        LpNormalization(LpNorm),
        MeanVarianceNormalization(MeanVarianceNorm),
        Lrn(Lrn) = |_: &Lrn| "LRN",
        Dropout(Dropout),
        /// NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
        Loss(Loss) = Loss::name,
        Det(Det),
    }
}
