//! Importers for the sequence family: ONNX node → typed op of `kiln_ops::sequence`.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::sequence::{
    ConcatFromSequence, OptionalGetElement, OptionalHasElement, OptionalOp, SequenceAt, SequenceConstruct,
    SequenceEmpty, SequenceErase, SequenceInsert, SequenceLength, SequenceOp, SplitToSequence,
};
use kiln_ops::{Op, ValueType};
use kiln_tensor::DType;

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    if !ctx.domain.is_empty() {
        return Ok(None);
    }
    let op = match ctx.op_type {
        "SequenceEmpty" => SequenceOp::SequenceEmpty(SequenceEmpty {
            dtype: ctx.attr_dtype("dtype")?.unwrap_or(DType::F32),
        }),
        "SequenceConstruct" => SequenceOp::SequenceConstruct(SequenceConstruct),
        "SequenceInsert" => SequenceOp::SequenceInsert(SequenceInsert),
        "SequenceErase" => SequenceOp::SequenceErase(SequenceErase),
        "SequenceAt" => SequenceOp::SequenceAt(SequenceAt),
        "SequenceLength" => SequenceOp::SequenceLength(SequenceLength),
        "SplitToSequence" => SequenceOp::SplitToSequence(SplitToSequence {
            axis: ctx.attr_i64_or("axis", 0)?,
            keepdims: ctx.attr_bool_or("keepdims", true)?,
        }),
        "ConcatFromSequence" => SequenceOp::ConcatFromSequence(ConcatFromSequence {
            axis: ctx.required("axis", ctx.attr_i64("axis")?)?,
            new_axis: ctx.attr_bool_or("new_axis", false)?,
        }),
        "Optional" => {
            // The `type` attribute (a TypeProto) gives the element type of an empty optional.
            let tp = ctx
                .attrs
                .iter()
                .find(|a| a.name.as_deref() == Some("type"))
                .and_then(|a| a.tp.as_ref());
            let elem = match tp {
                Some(tp) => crate::model::value_type(Some(tp)),
                None if ctx.has_input(0) => ValueType::Unknown,
                None => return Err(ctx.attr_err("type", "is required when the input is absent")),
            };
            SequenceOp::Optional(OptionalOp { elem })
        }
        "OptionalHasElement" => SequenceOp::OptionalHasElement(OptionalHasElement),
        "OptionalGetElement" => SequenceOp::OptionalGetElement(OptionalGetElement),
        _ => return Ok(None),
    };
    Ok(Some(Op::Sequence(op)))
}
