//! Importers for the quant family: ONNX node → typed op of `kiln_ops::quant`.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;
use kiln_ops::quant::{
    AutoPad, ConvAttrs, ConvInteger, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearConv,
    QLinearMatMul, QuantOp, QuantizeLinear,
};
use kiln_tensor::DType;

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    if !ctx.domain.is_empty() && ctx.domain != "ai.onnx" {
        return Ok(None);
    }
    let op = match ctx.op_type {
        "QuantizeLinear" => {
            ctx.check_inputs(2, 3)?;
            let output_dtype = if ctx.opset >= 21 {
                ctx.attr_dtype("output_dtype")?
            } else {
                None
            };
            if let Some(d) = output_dtype
                && !quantized_type(d)
            {
                return Err(ctx.attr_err("output_dtype", format!("{d} is not a quantized type")));
            }
            let precision = if ctx.opset >= 23 {
                ctx.attr_dtype("precision")?
            } else {
                None
            };
            if let Some(p) = precision
                && !matches!(p, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
            {
                return Err(ctx.attr_err("precision", format!("{p} is not a float type")));
            }
            QuantOp::QuantizeLinear(QuantizeLinear {
                axis: axis(ctx)?,
                saturate: ctx.opset < 19 || ctx.attr_bool_or("saturate", true)?,
                block_size: block_size(ctx)?,
                output_dtype,
                precision,
            })
        }
        "DequantizeLinear" => {
            ctx.check_inputs(2, 3)?;
            let output_dtype = if ctx.opset >= 23 {
                ctx.attr_dtype("output_dtype")?
            } else {
                None
            };
            if let Some(d) = output_dtype
                && !matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
            {
                return Err(ctx.attr_err("output_dtype", format!("{d} is not a float type")));
            }
            QuantOp::DequantizeLinear(DequantizeLinear {
                axis: axis(ctx)?,
                block_size: block_size(ctx)?,
                output_dtype,
            })
        }
        "DynamicQuantizeLinear" => {
            ctx.check_inputs(1, 1)?;
            QuantOp::DynamicQuantizeLinear(DynamicQuantizeLinear)
        }
        "MatMulInteger" => {
            ctx.check_inputs(2, 4)?;
            QuantOp::MatMulInteger(MatMulInteger::default())
        }
        "QLinearMatMul" => {
            ctx.check_inputs(8, 8)?;
            QuantOp::QLinearMatMul(QLinearMatMul::default())
        }
        "ConvInteger" => {
            ctx.check_inputs(2, 4)?;
            QuantOp::ConvInteger(ConvInteger {
                conv: conv_attrs(ctx)?,
                w_constant: false,
                packed: Default::default(),
            })
        }
        "QLinearConv" => {
            ctx.check_inputs(8, 9)?;
            QuantOp::QLinearConv(QLinearConv { conv: conv_attrs(ctx)? })
        }
        _ => return Ok(None),
    };
    Ok(Some(Op::Quant(op)))
}

fn quantized_type(d: DType) -> bool {
    matches!(
        d,
        DType::U8
            | DType::I8
            | DType::U16
            | DType::I16
            | DType::U4
            | DType::I4
            | DType::U2
            | DType::I2
            | DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F4E2M1
    )
}

fn axis(ctx: &NodeCtx<'_>) -> Result<i64> {
    if ctx.opset >= 13 {
        ctx.attr_i64_or("axis", 1)
    } else {
        Ok(1)
    }
}

fn block_size(ctx: &NodeCtx<'_>) -> Result<usize> {
    if ctx.opset < 21 {
        return Ok(0);
    }
    let b = ctx.attr_i64_or("block_size", 0)?;
    usize::try_from(b).map_err(|_| ctx.attr_err("block_size", format!("must be >= 0, got {b}")))
}

fn usizes(ctx: &NodeCtx<'_>, name: &str) -> Result<Vec<usize>> {
    ctx.attr_i64s(name)?
        .unwrap_or_default()
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| ctx.attr_err(name, format!("must be >= 0, got {v}"))))
        .collect()
}

fn conv_attrs(ctx: &NodeCtx<'_>) -> Result<ConvAttrs> {
    let auto_pad = match ctx.attr_string_or("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => return Err(ctx.attr_err("auto_pad", format!("unknown mode {other:?}"))),
    };
    let group = ctx.attr_i64_or("group", 1)?;
    let group = usize::try_from(group)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| ctx.attr_err("group", format!("must be > 0, got {group}")))?;
    let kernel_shape = if ctx.has_attr("kernel_shape") {
        Some(usizes(ctx, "kernel_shape")?)
    } else {
        None
    };
    Ok(ConvAttrs {
        auto_pad,
        dilations: usizes(ctx, "dilations")?,
        group,
        kernel_shape,
        pads: usizes(ctx, "pads")?,
        strides: usizes(ctx, "strides")?,
    })
}
