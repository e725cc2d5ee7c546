//! Importers for the elementwise family: ONNX node → typed op of `kiln_ops::elementwise`.
//!
//! Attribute defaults per the ONNX operator specs; opset-dependent forms normalised here:
//! Clip's bounds (attributes before opset 11, inputs since) and the `broadcast`/`axis`
//! attributes of binary ops before opset 7.

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;
use kiln_ops::elementwise::{Binary, BinaryOp, BitCast, Cast, CastLike, Clip, ElementwiseOp, UnaryOp, VariadicOp};
use kiln_tensor::formats::RoundMode;

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    if !ctx.domain.is_empty() {
        return Ok(None);
    }
    let op = if let Some(u) = unary(ctx)? {
        ctx.check_inputs(1, 1)?;
        ElementwiseOp::Unary(u)
    } else if let Some(b) = binary(ctx)? {
        ctx.check_inputs(2, 2)?;
        let legacy_axis = if ctx.opset < 7 && ctx.attr_i64_or("broadcast", 0)? != 0 {
            // Opsets 1-6: B broadcasts onto A; no axis means B aligns with A's trailing dims.
            ctx.attr_i64("axis")?
        } else {
            None
        };
        ElementwiseOp::Binary(Binary { op: b, legacy_axis })
    } else {
        match ctx.op_type {
            "Sum" | "Mean" | "Max" | "Min" => {
                if ctx.num_inputs() == 0 || (0..ctx.num_inputs()).any(|i| !ctx.has_input(i)) {
                    return Err(ctx.node_err("expects one or more non-empty inputs"));
                }
                ElementwiseOp::Variadic(match ctx.op_type {
                    "Sum" => VariadicOp::Sum,
                    "Mean" => VariadicOp::Mean,
                    "Max" => VariadicOp::Max,
                    _ => VariadicOp::Min,
                })
            }
            "Clip" => {
                if ctx.opset < 11 {
                    ctx.check_inputs(1, 1)?;
                    ElementwiseOp::Clip(Clip {
                        min: ctx.attr_f32("min")?,
                        max: ctx.attr_f32("max")?,
                    })
                } else {
                    ctx.check_inputs(1, 3)?;
                    ElementwiseOp::Clip(Clip { min: None, max: None })
                }
            }
            "Where" => {
                ctx.check_inputs(3, 3)?;
                ElementwiseOp::Where(kiln_ops::elementwise::Where)
            }
            "Cast" => {
                ctx.check_inputs(1, 1)?;
                let to = ctx.attr_dtype("to")?;
                let to = ctx.required("to", to)?;
                let (saturate, round) = cast_attrs(ctx)?;
                ElementwiseOp::Cast(Cast { to, saturate, round })
            }
            "CastLike" => {
                ctx.check_inputs(2, 2)?;
                let (saturate, round) = cast_attrs(ctx)?;
                ElementwiseOp::CastLike(CastLike { saturate, round })
            }
            "BitCast" => {
                ctx.check_inputs(1, 1)?;
                let to = ctx.attr_dtype("to")?;
                ElementwiseOp::BitCast(BitCast {
                    to: ctx.required("to", to)?,
                })
            }
            "PRelu" => {
                ctx.check_inputs(2, 2)?;
                ElementwiseOp::PRelu(kiln_ops::elementwise::PRelu)
            }
            _ => return Ok(None),
        }
    };
    Ok(Some(Op::Elementwise(op)))
}

/// `saturate` (opset 19+, default 1) and `round_mode` (opset 24+, default "up").
fn cast_attrs(ctx: &NodeCtx<'_>) -> Result<(bool, RoundMode)> {
    let saturate = ctx.attr_bool_or("saturate", true)?;
    let round = match ctx.attr_string_or("round_mode", "up")?.as_str() {
        "up" => RoundMode::Up,
        "down" => RoundMode::Down,
        "nearest" => RoundMode::Nearest,
        other => return Err(ctx.attr_err("round_mode", format!("must be up, down or nearest, got {other:?}"))),
    };
    Ok((saturate, round))
}

fn unary(ctx: &NodeCtx<'_>) -> Result<Option<UnaryOp>> {
    use UnaryOp::*;
    let f = |name: &str, default: f32| ctx.attr_f32_or(name, default);
    Ok(Some(match ctx.op_type {
        "Abs" => Abs,
        "Neg" => Neg,
        "Sign" => Sign,
        "Ceil" => Ceil,
        "Floor" => Floor,
        "Round" => Round,
        "Reciprocal" => Reciprocal,
        "Sqrt" => Sqrt,
        "Exp" => Exp,
        "Log" => Log,
        "Sin" => Sin,
        "Cos" => Cos,
        "Tan" => Tan,
        "Asin" => Asin,
        "Acos" => Acos,
        "Atan" => Atan,
        "Sinh" => Sinh,
        "Cosh" => Cosh,
        "Tanh" => Tanh,
        "Asinh" => Asinh,
        "Acosh" => Acosh,
        "Atanh" => Atanh,
        "Erf" => Erf,
        "Relu" => Relu,
        "LeakyRelu" => LeakyRelu {
            alpha: f("alpha", 0.01)?,
        },
        "Sigmoid" => Sigmoid,
        "HardSigmoid" => HardSigmoid {
            alpha: f("alpha", 0.2)?,
            beta: f("beta", 0.5)?,
        },
        "Elu" => Elu {
            alpha: f("alpha", 1.0)?,
        },
        "Selu" => Selu {
            alpha: f("alpha", 1.673_263_192_176_818_847_656_25)?,
            gamma: f("gamma", 1.050_701_022_148_132_324_218_75)?,
        },
        "Celu" => Celu {
            alpha: f("alpha", 1.0)?,
        },
        "Softplus" => Softplus,
        "Softsign" => Softsign,
        "ThresholdedRelu" => ThresholdedRelu {
            alpha: f("alpha", 1.0)?,
        },
        "HardSwish" => HardSwish,
        "Mish" => Mish,
        "Gelu" => match ctx.attr_string_or("approximate", "none")?.as_str() {
            "none" => Gelu { tanh: false },
            "tanh" => Gelu { tanh: true },
            other => return Err(ctx.attr_err("approximate", format!("must be \"none\" or \"tanh\", got {other:?}"))),
        },
        "Swish" => Swish {
            alpha: f("alpha", 1.0)?,
        },
        "Shrink" => Shrink {
            bias: f("bias", 0.0)?,
            lambd: f("lambd", 0.5)?,
        },
        "IsNaN" => IsNaN,
        "IsInf" => IsInf {
            negative: ctx.attr_bool_or("detect_negative", true)?,
            positive: ctx.attr_bool_or("detect_positive", true)?,
        },
        "Not" => Not,
        "BitwiseNot" => BitwiseNot,
        _ => return Ok(None),
    }))
}

fn binary(ctx: &NodeCtx<'_>) -> Result<Option<BinaryOp>> {
    use BinaryOp::*;
    Ok(Some(match ctx.op_type {
        "Add" => Add,
        "Sub" => Sub,
        "Mul" => Mul,
        "Div" => Div,
        "Pow" => Pow,
        "Mod" => Mod {
            fmod: ctx.attr_bool_or("fmod", false)?,
        },
        "BitShift" => {
            let dir = ctx.attr_string("direction")?;
            match ctx.required("direction", dir)?.as_str() {
                "LEFT" => BitShift { left: true },
                "RIGHT" => BitShift { left: false },
                other => return Err(ctx.attr_err("direction", format!("must be LEFT or RIGHT, got {other:?}"))),
            }
        }
        "BitwiseAnd" => BitwiseAnd,
        "BitwiseOr" => BitwiseOr,
        "BitwiseXor" => BitwiseXor,
        "And" => And,
        "Or" => Or,
        "Xor" => Xor,
        "Equal" => Equal,
        "Less" => Less,
        "LessOrEqual" => LessOrEqual,
        "Greater" => Greater,
        "GreaterOrEqual" => GreaterOrEqual,
        _ => return Ok(None),
    }))
}
