//! Importers for the recurrent family: ONNX node → typed op of `kiln_ops::recurrent`.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;
use kiln_ops::recurrent::{
    Activation, Attention, AttentionMask, CausalConvWithState, Cell, Direction, FlexAttention, LinearAttention,
    Recurrent, RecurrentOp, RotaryEmbedding, SwiGlu, UpdateRule,
};
use kiln_tensor::DType;

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    if ctx.domain == "ai.onnx.preview" && ctx.op_type == "FlexAttention" {
        return flex_attention(ctx).map(|op| Some(Op::Recurrent(RecurrentOp::FlexAttention(op))));
    }
    if ctx.domain == crate::contrib::KILN_DOMAIN {
        return contrib(ctx);
    }
    if !ctx.domain.is_empty() && ctx.domain != "ai.onnx" {
        return Ok(None);
    }
    let op = match ctx.op_type {
        "Attention" => RecurrentOp::Attention(attention(ctx)?),
        "RNN" => RecurrentOp::Recurrent(recurrent(ctx, Cell::Rnn)?),
        "GRU" => {
            let lbr = ctx.opset >= 3 && ctx.attr_bool_or("linear_before_reset", false)?;
            RecurrentOp::Recurrent(recurrent(
                ctx,
                Cell::Gru {
                    linear_before_reset: lbr,
                },
            )?)
        }
        "LSTM" => {
            let input_forget = ctx.attr_bool_or("input_forget", false)?;
            RecurrentOp::Recurrent(recurrent(ctx, Cell::Lstm { input_forget })?)
        }
        "RotaryEmbedding" => {
            ctx.check_inputs(3, 4)?;
            RecurrentOp::RotaryEmbedding(RotaryEmbedding {
                interleaved: ctx.attr_bool_or("interleaved", false)?,
                rotary_embedding_dim: opt_usize(ctx, "rotary_embedding_dim")?.unwrap_or(0),
                num_heads: opt_usize(ctx, "num_heads")?,
                contrib: false,
            })
        }
        "SwiGLU" => {
            ctx.check_inputs(2, 2)?;
            RecurrentOp::SwiGlu(SwiGlu {
                alpha: ctx.attr_f32_or("alpha", 1.0)?,
            })
        }
        "CausalConvWithState" => {
            ctx.check_inputs(2, 4)?;
            let silu = match ctx.attr_string_or("activation", "none")?.as_str() {
                "none" => false,
                "silu" | "swish" => true,
                other => {
                    return Err(ctx.attr_err("activation", format!("unknown activation {other:?}")));
                }
            };
            RecurrentOp::CausalConvWithState(CausalConvWithState { silu })
        }
        "LinearAttention" => {
            ctx.check_inputs(3, 6)?;
            let update_rule = match ctx.attr_string_or("update_rule", "gated_delta")?.as_str() {
                "linear" => UpdateRule::Linear,
                "gated" => UpdateRule::Gated,
                "delta" => UpdateRule::Delta,
                "gated_delta" => UpdateRule::GatedDelta,
                other => return Err(ctx.attr_err("update_rule", format!("unknown rule {other:?}"))),
            };
            let heads = |name: &str| -> Result<usize> {
                let v = ctx.required(name, opt_usize(ctx, name)?)?;
                if v == 0 {
                    return Err(ctx.attr_err(name, "must be positive"));
                }
                Ok(v)
            };
            RecurrentOp::LinearAttention(LinearAttention {
                q_num_heads: heads("q_num_heads")?,
                kv_num_heads: heads("kv_num_heads")?,
                scale: ctx.attr_f32_or("scale", 0.0)?,
                update_rule,
            })
        }
        _ => return Ok(None),
    };
    Ok(Some(Op::Recurrent(op)))
}

/// A non-negative int attribute as usize.
fn opt_usize(ctx: &NodeCtx<'_>, name: &str) -> Result<Option<usize>> {
    match ctx.attr_i64(name)? {
        None => Ok(None),
        Some(v) => usize::try_from(v)
            .map(Some)
            .map_err(|_| ctx.attr_err(name, format!("must be >= 0, got {v}"))),
    }
}

/// The nodes the com.microsoft expansions write in kiln's own domain (see `crate::contrib`).
fn contrib(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    let op = match ctx.op_type {
        // `DynamicQuantizeLSTM`'s expansion: the standard LSTM's attributes, its state
        // quantized for the recurrent product (see `Recurrent::quantized_state`).
        "LSTM" => {
            let input_forget = ctx.attr_bool_or("input_forget", false)?;
            RecurrentOp::Recurrent(Recurrent {
                quantized_state: true,
                ..recurrent(ctx, Cell::Lstm { input_forget })?
            })
        }
        "AttentionMask" => {
            ctx.check_inputs(0, 4)?;
            for (i, what) in [(1, "query"), (2, "key")] {
                if !ctx.has_input(i) {
                    return Err(ctx.node_err(format!("input {i} ({what}) is required")));
                }
            }
            RecurrentOp::AttentionMask(AttentionMask {
                filter_value: ctx.attr_f32_or("mask_filter_value", -10000.0)?,
                causal: ctx.attr_bool_or("unidirectional", false)?,
            })
        }
        "RotaryEmbedding" => {
            ctx.check_inputs(4, 4)?;
            RecurrentOp::RotaryEmbedding(RotaryEmbedding {
                interleaved: ctx.attr_bool_or("interleaved", false)?,
                rotary_embedding_dim: opt_usize(ctx, "rotary_embedding_dim")?.unwrap_or(0),
                num_heads: opt_usize(ctx, "num_heads")?.filter(|&h| h > 0),
                contrib: true,
            })
        }
        _ => return Ok(None),
    };
    Ok(Some(Op::Recurrent(op)))
}

fn attention(ctx: &NodeCtx<'_>) -> Result<Attention> {
    ctx.check_inputs(3, 7)?;
    let mode = ctx.attr_i64_or("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(ctx.attr_err("qk_matmul_output_mode", format!("must be 0..=3, got {mode}")));
    }
    let (left, right) = if ctx.opset >= 25 {
        (
            ctx.attr_i64_or("left_window_size", -1)?,
            ctx.attr_i64_or("right_window_size", -1)?,
        )
    } else {
        (-1, -1)
    };
    for (name, v) in [("left_window_size", left), ("right_window_size", right)] {
        if v < -1 {
            return Err(ctx.attr_err(name, format!("must be -1 or >= 0, got {v}")));
        }
    }
    let softmax_precision = ctx.attr_dtype("softmax_precision")?;
    if let Some(p) = softmax_precision
        && !matches!(p, DType::F32 | DType::F16 | DType::F64 | DType::BF16)
    {
        return Err(ctx.attr_err("softmax_precision", format!("must be a float type, got {p}")));
    }
    Ok(Attention {
        is_causal: ctx.attr_bool_or("is_causal", false)?,
        q_num_heads: opt_usize(ctx, "q_num_heads")?,
        kv_num_heads: opt_usize(ctx, "kv_num_heads")?,
        scale: ctx.attr_f32("scale")?,
        softcap: ctx.attr_f32_or("softcap", 0.0)?,
        qk_matmul_output_mode: mode as u8,
        softmax_precision,
        left_window_size: left,
        right_window_size: right,
    })
}

/// Default activations of each cell, per direction.
fn default_activations(cell: Cell) -> &'static [&'static str] {
    match cell {
        Cell::Rnn => &["Tanh"],
        Cell::Gru { .. } => &["Sigmoid", "Tanh"],
        Cell::Lstm { .. } => &["Sigmoid", "Tanh", "Tanh"],
    }
}

fn recurrent(ctx: &NodeCtx<'_>, cell: Cell) -> Result<Recurrent> {
    let max_inputs = if matches!(cell, Cell::Lstm { .. }) { 8 } else { 6 };
    ctx.check_inputs(3, max_inputs)?;
    let default_dir = if ctx.op_type == "GRU" && ctx.opset < 3 {
        "foward"
    } else {
        "forward"
    };
    let direction = match ctx.attr_string_or("direction", default_dir)?.as_str() {
        "forward" | "foward" => Direction::Forward,
        "reverse" => Direction::Reverse,
        "bidirectional" => Direction::Bidirectional,
        other => return Err(ctx.attr_err("direction", format!("unknown direction {other:?}"))),
    };
    let nd = direction.count();
    let per = cell.activations_per_direction();
    let names: Vec<String> = match ctx.attr_strings("activations")? {
        Some(v) => v,
        None => default_activations(cell).iter().map(|s| s.to_string()).collect(),
    };
    let names: Vec<String> = if names.len() == per && nd == 2 {
        names.iter().chain(names.iter()).cloned().collect()
    } else {
        names
    };
    if names.len() != per * nd {
        return Err(ctx.attr_err(
            "activations",
            format!("expects {} names, got {}", per * nd, names.len()),
        ));
    }
    // alpha/beta values are consumed in order by the activations that take them.
    let alphas = ctx.attr_f32s("activation_alpha")?.unwrap_or_default();
    let betas = ctx.attr_f32s("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (alphas.iter(), betas.iter());
    let mut activations = Vec::with_capacity(names.len());
    for n in &names {
        let mut alpha = |d: f32| ai.next().copied().unwrap_or(d);
        let act = match n.to_ascii_lowercase().as_str() {
            "relu" => Activation::Relu,
            "tanh" => Activation::Tanh,
            "sigmoid" => Activation::Sigmoid,
            "softsign" => Activation::Softsign,
            "softplus" => Activation::Softplus,
            "leakyrelu" => Activation::LeakyRelu { alpha: alpha(0.01) },
            "thresholdedrelu" => Activation::ThresholdedRelu { alpha: alpha(1.0) },
            "elu" => Activation::Elu { alpha: alpha(1.0) },
            "affine" => {
                let a = alpha(1.0);
                Activation::Affine {
                    alpha: a,
                    beta: bi.next().copied().unwrap_or(0.0),
                }
            }
            "scaledtanh" => {
                let a = alpha(1.0);
                Activation::ScaledTanh {
                    alpha: a,
                    beta: bi.next().copied().unwrap_or(1.0),
                }
            }
            "hardsigmoid" => {
                let a = alpha(0.2);
                Activation::HardSigmoid {
                    alpha: a,
                    beta: bi.next().copied().unwrap_or(0.5),
                }
            }
            _ => return Err(ctx.attr_err("activations", format!("unknown activation {n:?}"))),
        };
        activations.push(act);
    }
    let clip = ctx.attr_f32("clip")?;
    if let Some(c) = clip
        && (c.is_nan() || c <= 0.0)
    {
        return Err(ctx.attr_err("clip", format!("must be positive, got {c}")));
    }
    let layout = if ctx.opset >= 14 {
        ctx.attr_i64_or("layout", 0)?
    } else {
        0
    };
    if !(0..=1).contains(&layout) {
        return Err(ctx.attr_err("layout", format!("must be 0 or 1, got {layout}")));
    }
    Ok(Recurrent {
        cell,
        hidden_size: opt_usize(ctx, "hidden_size")?,
        direction,
        activations,
        clip,
        batch_first: layout == 1,
        quantized_state: false,
    })
}

/// The FlexAttention op's own attributes; its `score_mod` / `prob_mod` subgraphs (when
/// present, the node is built as control flow by the graph builder) are not read here.
pub(crate) fn flex_attention(ctx: &NodeCtx<'_>) -> Result<FlexAttention> {
    ctx.check_inputs(3, 3)?;
    let softmax_precision = ctx.attr_dtype("softmax_precision")?;
    if let Some(p) = softmax_precision
        && !matches!(p, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    {
        return Err(ctx.attr_err("softmax_precision", format!("must be a float type, got {p}")));
    }
    Ok(FlexAttention {
        scale: ctx.attr_f32("scale")?,
        softmax_precision,
    })
}
