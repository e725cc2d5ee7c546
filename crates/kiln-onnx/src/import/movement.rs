//! Importers for the movement family: ONNX node → typed op of `kiln_ops::movement`.
//! Attributes that later opsets turned into inputs are stored in their attribute form here
//! (`Some(..)`), and left `None` when the node's opset reads the input.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;
use kiln_ops::movement::*;

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    if !ctx.domain.is_empty() {
        return Ok(None);
    }
    let op = match ctx.op_type {
        "Reshape" => {
            let shape = if ctx.opset < 5 {
                Some(ctx.required("shape", ctx.attr_i64s("shape")?)?)
            } else {
                None
            };
            MovementOp::Reshape(Reshape {
                shape,
                allowzero: ctx.attr_bool_or("allowzero", false)?,
            })
        }
        "Shape" => MovementOp::Shape(Shape {
            start: ctx.attr_i64_or("start", 0)?,
            end: ctx.attr_i64("end")?,
        }),
        "Size" => MovementOp::Size(Size),
        "Flatten" => MovementOp::Flatten(Flatten {
            axis: ctx.attr_i64_or("axis", 1)?,
        }),
        "Squeeze" => {
            let axes = if ctx.opset < 13 { ctx.attr_i64s("axes")? } else { None };
            MovementOp::Squeeze(Squeeze { axes })
        }
        "Unsqueeze" => {
            let axes = if ctx.opset < 13 {
                Some(ctx.required("axes", ctx.attr_i64s("axes")?)?)
            } else {
                None
            };
            MovementOp::Unsqueeze(Unsqueeze { axes })
        }
        "Expand" => MovementOp::Expand(Expand),
        "ConstantOfShape" => MovementOp::ConstantOfShape(ConstantOfShape {
            value: ctx.attr_tensor("value")?,
        }),
        "Range" => MovementOp::Range(Range),
        "Identity" => MovementOp::Identity(Identity),
        "EyeLike" => MovementOp::EyeLike(EyeLike {
            dtype: ctx.attr_dtype("dtype")?,
            k: ctx.attr_i64_or("k", 0)?,
        }),
        "Transpose" => MovementOp::Transpose(Transpose {
            perm: ctx.attr_i64s("perm")?,
        }),
        "Concat" => {
            let axis = if ctx.opset < 4 {
                ctx.attr_i64_or("axis", 1)?
            } else {
                ctx.required("axis", ctx.attr_i64("axis")?)?
            };
            MovementOp::Concat(Concat { axis })
        }
        "Split" => {
            let split = if ctx.opset < 13 {
                ctx.attr_i64s("split")?.filter(|s| !s.is_empty())
            } else {
                None
            };
            let num_outputs = if ctx.opset >= 18 {
                ctx.attr_i64("num_outputs")?
            } else {
                None
            };
            let num_outputs = num_outputs
                .map(|n| usize::try_from(n).map_err(|_| ctx.attr_err("num_outputs", format!("must be >= 0, got {n}"))))
                .transpose()?;
            MovementOp::Split(Split {
                axis: ctx.attr_i64_or("axis", 0)?,
                split,
                num_outputs,
                outputs: ctx.num_outputs,
            })
        }
        "Slice" => {
            let attrs = if ctx.opset < 10 {
                Some(SliceAttrs {
                    starts: ctx.required("starts", ctx.attr_i64s("starts")?)?,
                    ends: ctx.required("ends", ctx.attr_i64s("ends")?)?,
                    axes: ctx.attr_i64s("axes")?.filter(|a| !a.is_empty()),
                })
            } else {
                None
            };
            MovementOp::Slice(Slice { attrs })
        }
        "Tile" => MovementOp::Tile(Tile),
        "Pad" => {
            let mode = match ctx.attr_string_or("mode", "constant")?.as_str() {
                "constant" => PadMode::Constant,
                "reflect" => PadMode::Reflect,
                "edge" => PadMode::Edge,
                "wrap" => PadMode::Wrap,
                m => return Err(ctx.attr_err("mode", format!("unknown pad mode '{m}'"))),
            };
            let (pads, value) = if ctx.opset < 11 {
                let name = if ctx.opset < 2 { "paddings" } else { "pads" };
                (
                    Some(ctx.required(name, ctx.attr_i64s(name)?)?),
                    ctx.attr_f32_or("value", 0.0)?,
                )
            } else {
                (None, 0.0)
            };
            MovementOp::Pad(Pad { mode, pads, value })
        }
        "DepthToSpace" | "SpaceToDepth" => {
            let bs = ctx.required("blocksize", ctx.attr_i64("blocksize")?)?;
            let blocksize = usize::try_from(bs)
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(|| ctx.attr_err("blocksize", format!("must be > 0, got {bs}")))?;
            let crd = match ctx.attr_string_or("mode", "DCR")?.as_str() {
                "DCR" => false,
                "CRD" => true,
                m => return Err(ctx.attr_err("mode", format!("unknown mode '{m}'"))),
            };
            if ctx.op_type == "DepthToSpace" {
                MovementOp::DepthToSpace(DepthToSpace { blocksize, crd })
            } else {
                MovementOp::SpaceToDepth(SpaceToDepth { blocksize, crd })
            }
        }
        "CenterCropPad" => MovementOp::CenterCropPad(CenterCropPad {
            axes: ctx.attr_i64s("axes")?,
        }),
        "Trilu" => MovementOp::Trilu(Trilu {
            upper: ctx.attr_bool_or("upper", true)?,
        }),
        "ReverseSequence" => MovementOp::ReverseSequence(ReverseSequence {
            batch_axis: ctx.attr_i64_or("batch_axis", 1)?,
            time_axis: ctx.attr_i64_or("time_axis", 0)?,
        }),
        "Gather" => MovementOp::Gather(Gather {
            axis: ctx.attr_i64_or("axis", 0)?,
        }),
        "GatherElements" => MovementOp::GatherElements(GatherElements {
            axis: ctx.attr_i64_or("axis", 0)?,
        }),
        "GatherND" => {
            let b = ctx.attr_i64_or("batch_dims", 0)?;
            let batch_dims =
                usize::try_from(b).map_err(|_| ctx.attr_err("batch_dims", format!("must be >= 0, got {b}")))?;
            MovementOp::GatherND(GatherND { batch_dims })
        }
        "Scatter" | "ScatterElements" => MovementOp::ScatterElements(ScatterElements {
            axis: ctx.attr_i64_or("axis", 0)?,
            reduction: reduction(ctx)?,
        }),
        "ScatterND" => MovementOp::ScatterND(ScatterND {
            reduction: reduction(ctx)?,
        }),
        "TensorScatter" => {
            let circular = match ctx.attr_string_or("mode", "linear")?.as_str() {
                "linear" => false,
                "circular" => true,
                m => return Err(ctx.attr_err("mode", format!("unknown mode '{m}'"))),
            };
            MovementOp::TensorScatter(TensorScatter {
                axis: ctx.attr_i64_or("axis", -2)?,
                circular,
            })
        }
        "OneHot" => MovementOp::OneHot(OneHot {
            axis: ctx.attr_i64_or("axis", -1)?,
        }),
        "Compress" => MovementOp::Compress(Compress {
            axis: ctx.attr_i64("axis")?,
        }),
        "NonZero" => MovementOp::NonZero(NonZero),
        "TopK" => MovementOp::TopK(TopK {
            axis: ctx.attr_i64_or("axis", -1)?,
            largest: ctx.attr_bool_or("largest", true)?,
            sorted: ctx.attr_bool_or("sorted", true)?,
            k: if ctx.opset < 10 {
                Some(ctx.required("k", ctx.attr_i64("k")?)?)
            } else {
                None
            },
        }),
        "Unique" => MovementOp::Unique(Unique {
            axis: ctx.attr_i64("axis")?,
            sorted: ctx.attr_bool_or("sorted", true)?,
        }),
        "CumSum" => MovementOp::CumSum(CumSum {
            exclusive: ctx.attr_bool_or("exclusive", false)?,
            reverse: ctx.attr_bool_or("reverse", false)?,
        }),
        "CumProd" => MovementOp::CumProd(CumProd {
            exclusive: ctx.attr_bool_or("exclusive", false)?,
            reverse: ctx.attr_bool_or("reverse", false)?,
        }),
        "Col2Im" => MovementOp::Col2Im(Col2Im {
            dilations: ctx.attr_i64s("dilations")?,
            pads: ctx.attr_i64s("pads")?,
            strides: ctx.attr_i64s("strides")?,
        }),
        _ => return Ok(None),
    };
    Ok(Some(Op::Movement(op)))
}

fn reduction(ctx: &NodeCtx<'_>) -> Result<Reduction> {
    Ok(match ctx.attr_string_or("reduction", "none")?.as_str() {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        r => return Err(ctx.attr_err("reduction", format!("unknown reduction '{r}'"))),
    })
}
