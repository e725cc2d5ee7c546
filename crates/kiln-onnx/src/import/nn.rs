//! Importers for the nn family: ONNX node → typed op of `kiln_ops::nn`.
//!
//! Covers Conv, ConvTranspose, DeformConv, MaxPool, AveragePool, LpPool, the Global pools,
//! MaxUnpool, MatMul, Gemm, Einsum, Resize, Upsample, GridSample, AffineGrid, RoiAlign and
//! NonMaxSuppression, with each attribute's default for the node's opset.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;
use kiln_ops::nn::{
    AffineGrid, AutoPad, Conv, ConvTranspose, CoordMode, DeformConv, Einsum, Gemm, GlobalPool, GlobalPoolKind,
    GridSample, GridSampleMode, GridSamplePadding, KeepAspect, MatMul, MaxUnpool, NearestMode, NnOp, NonMaxSuppression,
    Pool, PoolKind, Resize, ResizeMode, RoiAlign, RoiAlignMode,
};

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    if !ctx.domain.is_empty() {
        return Ok(None);
    }
    let op = match ctx.op_type {
        "Conv" => {
            ctx.check_inputs(2, 3)?;
            NnOp::Conv(Conv {
                auto_pad: auto_pad(ctx)?,
                dilations: usizes(ctx, "dilations")?,
                group: group(ctx, "group")?,
                kernel_shape: usizes(ctx, "kernel_shape")?,
                pads: usizes(ctx, "pads")?,
                strides: usizes(ctx, "strides")?,
            })
        }
        "ConvTranspose" => {
            ctx.check_inputs(2, 3)?;
            NnOp::ConvTranspose(ConvTranspose {
                auto_pad: auto_pad(ctx)?,
                dilations: usizes(ctx, "dilations")?,
                group: group(ctx, "group")?,
                kernel_shape: usizes(ctx, "kernel_shape")?,
                output_padding: usizes(ctx, "output_padding")?,
                output_shape: usizes(ctx, "output_shape")?,
                pads: usizes(ctx, "pads")?,
                strides: usizes(ctx, "strides")?,
            })
        }
        "DeformConv" => {
            ctx.check_inputs(3, 5)?;
            NnOp::DeformConv(DeformConv {
                dilations: usizes(ctx, "dilations")?,
                group: group(ctx, "group")?,
                kernel_shape: usizes(ctx, "kernel_shape")?,
                offset_group: group(ctx, "offset_group")?,
                pads: usizes(ctx, "pads")?,
                strides: usizes(ctx, "strides")?,
            })
        }
        "MaxPool" => {
            ctx.check_inputs(1, 1)?;
            let storage_order = ctx.attr_bool_or("storage_order", false)?;
            NnOp::Pool(pool(ctx, PoolKind::Max { storage_order })?)
        }
        "AveragePool" => {
            ctx.check_inputs(1, 1)?;
            let count_include_pad = ctx.attr_bool_or("count_include_pad", false)?;
            NnOp::Pool(pool(ctx, PoolKind::Average { count_include_pad })?)
        }
        "LpPool" => {
            ctx.check_inputs(1, 1)?;
            NnOp::Pool(pool(ctx, PoolKind::Lp { p: lp_p(ctx)? })?)
        }
        "GlobalAveragePool" => {
            ctx.check_inputs(1, 1)?;
            NnOp::GlobalPool(GlobalPool::new(GlobalPoolKind::Average))
        }
        "GlobalMaxPool" => {
            ctx.check_inputs(1, 1)?;
            NnOp::GlobalPool(GlobalPool::new(GlobalPoolKind::Max))
        }
        "GlobalLpPool" => {
            ctx.check_inputs(1, 1)?;
            NnOp::GlobalPool(GlobalPool::new(GlobalPoolKind::Lp { p: lp_p(ctx)? }))
        }
        "MaxUnpool" => {
            ctx.check_inputs(2, 3)?;
            let kernel_shape = usizes(ctx, "kernel_shape")?;
            if kernel_shape.is_empty() {
                return Err(ctx.attr_err("kernel_shape", "is required but missing"));
            }
            NnOp::MaxUnpool(MaxUnpool {
                kernel_shape,
                pads: usizes(ctx, "pads")?,
                strides: usizes(ctx, "strides")?,
            })
        }
        "MatMul" => {
            ctx.check_inputs(2, 2)?;
            NnOp::MatMul(MatMul::default())
        }
        "Gemm" => {
            ctx.check_inputs(2, 3)?;
            NnOp::Gemm(Gemm {
                alpha: ctx.attr_f32_or("alpha", 1.0)?,
                beta: ctx.attr_f32_or("beta", 1.0)?,
                trans_a: ctx.attr_bool_or("transA", false)?,
                trans_b: ctx.attr_bool_or("transB", false)?,
            })
        }
        "Einsum" => {
            if ctx.num_inputs() == 0 {
                return Err(ctx.node_err("Einsum needs at least one input"));
            }
            let equation = ctx.attr_string("equation")?;
            NnOp::Einsum(Einsum {
                equation: ctx.required("equation", equation)?,
            })
        }
        "Resize" => {
            ctx.check_inputs(1, 4)?;
            NnOp::Resize(resize(ctx)?)
        }
        "Upsample" => {
            ctx.check_inputs(1, 2)?;
            NnOp::Resize(upsample(ctx)?)
        }
        "GridSample" => {
            ctx.check_inputs(2, 2)?;
            let mode = match ctx
                .attr_string_or("mode", if ctx.opset >= 20 { "linear" } else { "bilinear" })?
                .as_str()
            {
                "bilinear" | "linear" => GridSampleMode::Linear,
                "nearest" => GridSampleMode::Nearest,
                "bicubic" | "cubic" => GridSampleMode::Cubic,
                m => return Err(ctx.attr_err("mode", format!("unknown mode {m:?}"))),
            };
            let padding = match ctx.attr_string_or("padding_mode", "zeros")?.as_str() {
                "zeros" => GridSamplePadding::Zeros,
                "border" => GridSamplePadding::Border,
                "reflection" => GridSamplePadding::Reflection,
                m => return Err(ctx.attr_err("padding_mode", format!("unknown padding mode {m:?}"))),
            };
            NnOp::GridSample(GridSample {
                align_corners: ctx.attr_bool_or("align_corners", false)?,
                mode,
                padding,
            })
        }
        "AffineGrid" => {
            ctx.check_inputs(2, 2)?;
            NnOp::AffineGrid(AffineGrid {
                align_corners: ctx.attr_bool_or("align_corners", false)?,
            })
        }
        "RoiAlign" => {
            ctx.check_inputs(3, 3)?;
            let half_pixel = if ctx.opset >= 16 {
                match ctx
                    .attr_string_or("coordinate_transformation_mode", "half_pixel")?
                    .as_str()
                {
                    "half_pixel" => true,
                    "output_half_pixel" => false,
                    m => return Err(ctx.attr_err("coordinate_transformation_mode", format!("unknown mode {m:?}"))),
                }
            } else {
                false
            };
            let mode = match ctx.attr_string_or("mode", "avg")?.as_str() {
                "avg" => RoiAlignMode::Avg,
                "max" => RoiAlignMode::Max,
                m => return Err(ctx.attr_err("mode", format!("unknown mode {m:?}"))),
            };
            NnOp::RoiAlign(RoiAlign {
                half_pixel,
                mode,
                output_height: nonneg(ctx, "output_height", 1)?,
                output_width: nonneg(ctx, "output_width", 1)?,
                sampling_ratio: nonneg(ctx, "sampling_ratio", 0)?,
                spatial_scale: ctx.attr_f32_or("spatial_scale", 1.0)?,
            })
        }
        "NonMaxSuppression" => {
            ctx.check_inputs(2, 5)?;
            NnOp::NonMaxSuppression(NonMaxSuppression {
                center_point_box: ctx.attr_bool_or("center_point_box", false)?,
            })
        }
        _ => return Ok(None),
    };
    Ok(Some(Op::Nn(op)))
}

fn auto_pad(ctx: &NodeCtx<'_>) -> Result<AutoPad> {
    Ok(match ctx.attr_string_or("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        m => return Err(ctx.attr_err("auto_pad", format!("unknown value {m:?}"))),
    })
}

/// A list of non-negative ints (empty when absent).
fn usizes(ctx: &NodeCtx<'_>, name: &str) -> Result<Vec<usize>> {
    ctx.attr_i64s(name)?
        .unwrap_or_default()
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| ctx.attr_err(name, format!("must be >= 0, got {v}"))))
        .collect()
}

/// A group count (default 1); `Op::validate` checks it is at least 1.
fn group(ctx: &NodeCtx<'_>, name: &str) -> Result<usize> {
    let g = ctx.attr_i64_or(name, 1)?;
    usize::try_from(g).map_err(|_| ctx.attr_err(name, format!("must be >= 1, got {g}")))
}

fn nonneg(ctx: &NodeCtx<'_>, name: &str, default: i64) -> Result<usize> {
    let v = ctx.attr_i64_or(name, default)?;
    usize::try_from(v).map_err(|_| ctx.attr_err(name, format!("must be >= 0, got {v}")))
}

/// LpPool's `p`: a float in opset 1, an int afterwards (accept either).
fn lp_p(ctx: &NodeCtx<'_>) -> Result<f64> {
    let p = match ctx.attr_i64("p") {
        Ok(Some(v)) => v as f64,
        Ok(None) => 2.0,
        Err(_) => ctx.attr_f32_or("p", 2.0)? as f64,
    };
    if p <= 0.0 || !p.is_finite() {
        return Err(ctx.attr_err("p", format!("must be positive, got {p}")));
    }
    Ok(p)
}

fn pool(ctx: &NodeCtx<'_>, kind: PoolKind) -> Result<Pool> {
    let kernel_shape = usizes(ctx, "kernel_shape")?;
    if kernel_shape.is_empty() {
        return Err(ctx.attr_err("kernel_shape", "is required but missing"));
    }
    Ok(Pool {
        kind,
        auto_pad: auto_pad(ctx)?,
        ceil_mode: ctx.attr_bool_or("ceil_mode", false)?,
        dilations: usizes(ctx, "dilations")?,
        kernel_shape,
        pads: usizes(ctx, "pads")?,
        strides: usizes(ctx, "strides")?,
    })
}

fn resize_mode(ctx: &NodeCtx<'_>) -> Result<ResizeMode> {
    Ok(match ctx.attr_string_or("mode", "nearest")?.as_str() {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" | "trilinear" => ResizeMode::Linear,
        "cubic" => ResizeMode::Cubic,
        m => return Err(ctx.attr_err("mode", format!("unknown mode {m:?}"))),
    })
}

fn resize(ctx: &NodeCtx<'_>) -> Result<Resize> {
    let mode = resize_mode(ctx)?;
    if ctx.opset < 11 {
        // Resize-10: inputs (X, scales), asymmetric coordinates.
        return Ok(Resize {
            mode,
            coord: CoordMode::Asymmetric,
            nearest: NearestMode::Simple,
            roi_input: None,
            scales_input: Some(1),
            sizes_input: None,
            ..Resize::default()
        });
    }
    let coord = match ctx
        .attr_string_or("coordinate_transformation_mode", "half_pixel")?
        .as_str()
    {
        "half_pixel" => CoordMode::HalfPixel,
        "half_pixel_symmetric" => CoordMode::HalfPixelSymmetric,
        "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
        "align_corners" => CoordMode::AlignCorners,
        "asymmetric" => CoordMode::Asymmetric,
        "tf_half_pixel_for_nn" => CoordMode::TfHalfPixelForNn,
        "tf_crop_and_resize" => CoordMode::TfCropAndResize,
        m => return Err(ctx.attr_err("coordinate_transformation_mode", format!("unknown mode {m:?}"))),
    };
    let nearest = match ctx.attr_string_or("nearest_mode", "round_prefer_floor")?.as_str() {
        "round_prefer_floor" => NearestMode::RoundPreferFloor,
        "round_prefer_ceil" => NearestMode::RoundPreferCeil,
        "floor" => NearestMode::Floor,
        "ceil" => NearestMode::Ceil,
        m => return Err(ctx.attr_err("nearest_mode", format!("unknown mode {m:?}"))),
    };
    let keep_aspect = match ctx.attr_string_or("keep_aspect_ratio_policy", "stretch")?.as_str() {
        "stretch" => KeepAspect::Stretch,
        "not_larger" => KeepAspect::NotLarger,
        "not_smaller" => KeepAspect::NotSmaller,
        m => return Err(ctx.attr_err("keep_aspect_ratio_policy", format!("unknown policy {m:?}"))),
    };
    Ok(Resize {
        upsample: false,
        mode,
        coord,
        nearest,
        keep_aspect,
        antialias: ctx.attr_bool_or("antialias", false)?,
        axes: ctx.attr_i64s("axes")?.unwrap_or_default(),
        cubic_coeff_a: ctx.attr_f32_or("cubic_coeff_a", -0.75)?,
        exclude_outside: ctx.attr_bool_or("exclude_outside", false)?,
        extrapolation_value: ctx.attr_f32_or("extrapolation_value", 0.0)?,
        roi_input: Some(1),
        scales_input: Some(2),
        sizes_input: Some(3),
        scales_attr: Vec::new(),
    })
}

fn upsample(ctx: &NodeCtx<'_>) -> Result<Resize> {
    let mode = resize_mode(ctx)?;
    let scales_attr = if ctx.opset < 9 {
        let s = ctx.attr_f32s("scales")?;
        ctx.required("scales", s)?
    } else {
        Vec::new()
    };
    Ok(Resize {
        upsample: true,
        mode,
        coord: CoordMode::Asymmetric,
        nearest: NearestMode::Simple,
        roi_input: None,
        scales_input: if ctx.opset < 9 { None } else { Some(1) },
        sizes_input: None,
        scales_attr,
        ..Resize::default()
    })
}
