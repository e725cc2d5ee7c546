//! Importers for the reduce family: ONNX node → typed op of `kiln_ops::reduce`.
//!
//! Reduce `axes` moved from attribute to input at opset 13 (ReduceSum) and 18 (the others);
//! the attribute form is stored as `ReduceAxes::Attr`, the input form as `ReduceAxes::Input`.
//! Dropout's `ratio` likewise moved to an input at opset 12.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;
use kiln_ops::reduce::*;
use kiln_tensor::DType;

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    if !ctx.domain.is_empty() {
        return Ok(None);
    }
    let op = match ctx.op_type {
        "ReduceSum" => reduce(ctx, ReduceKind::Sum, 13)?,
        "ReduceMean" => reduce(ctx, ReduceKind::Mean, 18)?,
        "ReduceMax" => reduce(ctx, ReduceKind::Max, 18)?,
        "ReduceMin" => reduce(ctx, ReduceKind::Min, 18)?,
        "ReduceProd" => reduce(ctx, ReduceKind::Prod, 18)?,
        "ReduceL1" => reduce(ctx, ReduceKind::L1, 18)?,
        "ReduceL2" => reduce(ctx, ReduceKind::L2, 18)?,
        "ReduceLogSum" => reduce(ctx, ReduceKind::LogSum, 18)?,
        "ReduceLogSumExp" => reduce(ctx, ReduceKind::LogSumExp, 18)?,
        "ReduceSumSquare" => reduce(ctx, ReduceKind::SumSquare, 18)?,
        "ArgMax" | "ArgMin" => {
            ctx.check_inputs(1, 1)?;
            ReduceOp::ArgReduce(ArgReduce {
                max: ctx.op_type == "ArgMax",
                axis: ctx.attr_i64_or("axis", 0)?,
                keepdims: ctx.attr_bool_or("keepdims", true)?,
                select_last_index: ctx.attr_bool_or("select_last_index", false)?,
            })
        }
        "Softmax" | "LogSoftmax" | "Hardmax" => {
            ctx.check_inputs(1, 1)?;
            let kind = match ctx.op_type {
                "Softmax" => SoftmaxKind::Softmax,
                "LogSoftmax" => SoftmaxKind::LogSoftmax,
                _ => SoftmaxKind::Hardmax,
            };
            let coerce_2d = ctx.opset < 13;
            let axis = ctx.attr_i64_or("axis", if coerce_2d { 1 } else { -1 })?;
            ReduceOp::Softmax(Softmax { kind, axis, coerce_2d })
        }
        "LayerNormalization" => {
            ctx.check_inputs(2, 3)?;
            ReduceOp::LayerNormalization(LayerNorm {
                axis: ctx.attr_i64_or("axis", -1)?,
                epsilon: ctx.attr_f32_or("epsilon", 1e-5)?,
                stash_type: ctx.attr_dtype("stash_type")?.unwrap_or(DType::F32),
            })
        }
        "RMSNormalization" => {
            ctx.check_inputs(2, 2)?;
            ReduceOp::RmsNormalization(RmsNorm {
                axis: ctx.attr_i64_or("axis", -1)?,
                epsilon: ctx.attr_f32_or("epsilon", 1e-5)?,
                stash_type: ctx.attr_dtype("stash_type")?.unwrap_or(DType::F32),
            })
        }
        "GroupNormalization" => {
            ctx.check_inputs(3, 3)?;
            ReduceOp::GroupNormalization(GroupNorm {
                num_groups: ctx.required("num_groups", ctx.attr_i64("num_groups")?)?,
                epsilon: ctx.attr_f32_or("epsilon", 1e-5)?,
                stash_type: ctx.attr_dtype("stash_type")?.unwrap_or(DType::F32),
            })
        }
        "InstanceNormalization" => {
            ctx.check_inputs(3, 3)?;
            ReduceOp::InstanceNormalization(InstanceNorm {
                epsilon: ctx.attr_f32_or("epsilon", 1e-5)?,
            })
        }
        "BatchNormalization" => {
            ctx.check_inputs(5, 5)?;
            let (training_mode, saved_outputs) = if ctx.opset >= 14 {
                (ctx.attr_bool_or("training_mode", false)?, false)
            } else {
                // Before opset 14 the output count selects training (5 outputs) or test mode.
                let training = ctx.num_outputs > 1 && !ctx.attr_bool_or("is_test", false)?;
                (training, true)
            };
            ReduceOp::BatchNormalization(BatchNorm {
                epsilon: ctx.attr_f32_or("epsilon", 1e-5)?,
                momentum: ctx.attr_f32_or("momentum", 0.9)?,
                training_mode,
                saved_outputs,
            })
        }
        "LpNormalization" => {
            ctx.check_inputs(1, 1)?;
            let p = ctx.attr_i64_or("p", 2)?;
            if p != 1 && p != 2 {
                return Err(ctx.attr_err("p", format!("must be 1 or 2, got {p}")));
            }
            ReduceOp::LpNormalization(LpNorm {
                axis: ctx.attr_i64_or("axis", -1)?,
                p,
            })
        }
        "MeanVarianceNormalization" => {
            ctx.check_inputs(1, 1)?;
            ReduceOp::MeanVarianceNormalization(MeanVarianceNorm {
                axes: ctx.attr_i64s("axes")?.unwrap_or_else(|| vec![0, 2, 3]),
            })
        }
        "LRN" => {
            ctx.check_inputs(1, 1)?;
            let size = ctx.required("size", ctx.attr_i64("size")?)?;
            if size < 1 {
                return Err(ctx.attr_err("size", format!("must be positive, got {size}")));
            }
            ReduceOp::Lrn(Lrn {
                alpha: ctx.attr_f32_or("alpha", 1e-4)?,
                beta: ctx.attr_f32_or("beta", 0.75)?,
                bias: ctx.attr_f32_or("bias", 1.0)?,
                size,
            })
        }
        "Dropout" => {
            let ratio = if ctx.opset >= 12 {
                ctx.check_inputs(1, 3)?;
                None
            } else {
                ctx.check_inputs(1, 1)?;
                Some(ctx.attr_f32_or("ratio", 0.5)?)
            };
            ReduceOp::Dropout(Dropout {
                ratio,
                seed: ctx.attr_i64("seed")?,
                mask_same_dtype: ctx.opset < 10,
            })
        }
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => {
            ctx.check_inputs(2, 3)?;
            let reduction = match ctx.attr_string_or("reduction", "mean")?.as_str() {
                "none" => LossReduction::None,
                "sum" => LossReduction::Sum,
                "mean" => LossReduction::Mean,
                other => {
                    return Err(ctx.attr_err("reduction", format!("unknown reduction '{other}'")));
                }
            };
            ReduceOp::Loss(Loss {
                softmax: ctx.op_type == "SoftmaxCrossEntropyLoss",
                reduction,
                ignore_index: ctx.attr_i64("ignore_index")?,
            })
        }
        "Det" => {
            ctx.check_inputs(1, 1)?;
            ReduceOp::Det(Det)
        }
        _ => return Ok(None),
    };
    Ok(Some(Op::Reduce(op)))
}

fn reduce(ctx: &NodeCtx<'_>, kind: ReduceKind, input_since: i64) -> Result<ReduceOp> {
    let axes = if ctx.opset >= input_since {
        ctx.check_inputs(1, 2)?;
        if ctx.has_attr("axes") {
            return Err(ctx.attr_err("axes", format!("is an input since opset {input_since}")));
        }
        if ctx.has_input(1) {
            ReduceAxes::Input
        } else {
            ReduceAxes::Attr(Vec::new())
        }
    } else {
        ctx.check_inputs(1, 1)?;
        ReduceAxes::Attr(ctx.attr_i64s("axes")?.unwrap_or_default())
    };
    // noop_with_empty_axes exists from the opset where axes became an input.
    let noop_with_empty_axes = ctx.opset >= input_since && ctx.attr_bool_or("noop_with_empty_axes", false)?;
    Ok(ReduceOp::Reduce(Reduce {
        kind,
        axes,
        keepdims: ctx.attr_bool_or("keepdims", true)?,
        noop_with_empty_axes,
    }))
}
