//! One-input elementwise ops: math functions, activations, and the NaN/Inf/not predicates.
//!
//! ONNX operators (<https://onnx.ai/onnx/operators/>), all opsets up to 24: Abs, Neg, Sign,
//! Ceil, Floor, Round, Reciprocal, Sqrt, Exp, Log, Sin, Cos, Tan, Asin, Acos, Atan, Sinh, Cosh,
//! Tanh, Asinh, Acosh, Atanh, Erf, Relu, LeakyRelu, Sigmoid, HardSigmoid, Elu, Selu, Celu,
//! Softplus, Softsign, ThresholdedRelu, HardSwish, Mish, Gelu, Swish, Shrink, IsNaN, IsInf,
//! Not, BitwiseNot.
//!
//! Floats are computed in f64 and rounded to the element type (f16/bf16 included).

use super::math::erf;
use super::scalar::{Int, Num, with_float, with_int};
use crate::error::{OpError, Result};
use kiln_tensor::{DType, Data, Element, Tensor};

/// A one-input elementwise op with its attributes (ONNX defaults applied by the importer).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq)]
pub enum UnaryOp {
    Abs,
    Neg,
    Sign,
    Ceil,
    Floor,
    /// Round half to even.
    Round,
    Reciprocal,
    Sqrt,
    Exp,
    Log,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Asinh,
    Acosh,
    Atanh,
    Erf,
    Relu,
    /// `x < 0 ? alpha * x : x` (default alpha 0.01).
    LeakyRelu {
        alpha: f32,
    },
    Sigmoid,
    /// `max(0, min(1, alpha * x + beta))` (defaults 0.2, 0.5).
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    /// `x < 0 ? alpha * (exp(x) - 1) : x` (default alpha 1).
    Elu {
        alpha: f32,
    },
    /// `gamma * (x <= 0 ? alpha * exp(x) - alpha : x)`.
    Selu {
        alpha: f32,
        gamma: f32,
    },
    /// `max(0, x) + min(0, alpha * (exp(x / alpha) - 1))` (default alpha 1).
    Celu {
        alpha: f32,
    },
    Softplus,
    Softsign,
    /// `x > alpha ? x : 0` (default alpha 1).
    ThresholdedRelu {
        alpha: f32,
    },
    HardSwish,
    Mish,
    /// `approximate = "tanh"` when `tanh`.
    Gelu {
        tanh: bool,
    },
    /// `x * sigmoid(alpha * x)` (default alpha 1).
    Swish {
        alpha: f32,
    },
    /// `x < -lambd ? x + bias : x > lambd ? x - bias : 0` (defaults bias 0, lambd 0.5).
    Shrink {
        bias: f32,
        lambd: f32,
    },
    IsNaN,
    /// Which infinities count (both by default).
    IsInf {
        negative: bool,
        positive: bool,
    },
    Not,
    BitwiseNot,
}

impl UnaryOp {
    pub fn name(&self) -> &'static str {
        use UnaryOp::*;
        match self {
            Abs => "Abs",
            Neg => "Neg",
            Sign => "Sign",
            Ceil => "Ceil",
            Floor => "Floor",
            Round => "Round",
            Reciprocal => "Reciprocal",
            Sqrt => "Sqrt",
            Exp => "Exp",
            Log => "Log",
            Sin => "Sin",
            Cos => "Cos",
            Tan => "Tan",
            Asin => "Asin",
            Acos => "Acos",
            Atan => "Atan",
            Sinh => "Sinh",
            Cosh => "Cosh",
            Tanh => "Tanh",
            Asinh => "Asinh",
            Acosh => "Acosh",
            Atanh => "Atanh",
            Erf => "Erf",
            Relu => "Relu",
            LeakyRelu { .. } => "LeakyRelu",
            Sigmoid => "Sigmoid",
            HardSigmoid { .. } => "HardSigmoid",
            Elu { .. } => "Elu",
            Selu { .. } => "Selu",
            Celu { .. } => "Celu",
            Softplus => "Softplus",
            Softsign => "Softsign",
            ThresholdedRelu { .. } => "ThresholdedRelu",
            HardSwish => "HardSwish",
            Mish => "Mish",
            Gelu { .. } => "Gelu",
            Swish { .. } => "Swish",
            Shrink { .. } => "Shrink",
            IsNaN => "IsNaN",
            IsInf { .. } => "IsInf",
            Not => "Not",
            BitwiseNot => "BitwiseNot",
        }
    }

    /// Output dtype for an input dtype; an error when the op does not accept it.
    pub fn out_dtype(&self, dt: DType) -> Result<DType> {
        use UnaryOp::*;
        let bad = || Err(OpError::UnsupportedDType { index: 0, got: dt });
        let numeric = dt.is_int() && !dt.is_byte_coded();
        let native_float = matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
        match self {
            IsNaN | IsInf { .. } => {
                if dt.is_float() {
                    Ok(DType::Bool)
                } else {
                    bad()
                }
            }
            Not => {
                if dt == DType::Bool {
                    Ok(dt)
                } else {
                    bad()
                }
            }
            BitwiseNot => {
                if numeric {
                    Ok(dt)
                } else {
                    bad()
                }
            }
            Abs | Neg | Sign | Relu | Shrink { .. } | Erf => {
                if numeric || native_float {
                    Ok(dt)
                } else {
                    bad()
                }
            }
            _ => {
                if native_float {
                    Ok(dt)
                } else {
                    bad()
                }
            }
        }
    }

    /// The op on one value, for float inputs (and integer inputs of the ops that take them
    /// through f64: Shrink, Erf).
    fn f(&self, x: f64) -> f64 {
        use UnaryOp::*;
        let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
        let softplus = |v: f64| v.max(0.0) + (-v.abs()).exp().ln_1p();
        match *self {
            Abs => x.abs(),
            Neg => -x,
            Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x // 0, -0 or NaN
                }
            }
            Ceil => x.ceil(),
            Floor => x.floor(),
            Round => x.round_ties_even(),
            Reciprocal => 1.0 / x,
            Sqrt => x.sqrt(),
            Exp => x.exp(),
            Log => x.ln(),
            Sin => x.sin(),
            Cos => x.cos(),
            Tan => x.tan(),
            Asin => x.asin(),
            Acos => x.acos(),
            Atan => x.atan(),
            Sinh => x.sinh(),
            Cosh => x.cosh(),
            Tanh => x.tanh(),
            Asinh => x.asinh(),
            Acosh => x.acosh(),
            Atanh => x.atanh(),
            Erf => erf(x),
            Relu => {
                if x > 0.0 || x.is_nan() {
                    x
                } else {
                    0.0
                }
            }
            LeakyRelu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x
                } else {
                    x
                }
            }
            Sigmoid => sigmoid(x),
            HardSigmoid { alpha, beta } => (alpha as f64 * x + beta as f64).clamp(0.0, 1.0),
            Elu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x.exp_m1()
                } else {
                    x
                }
            }
            Selu { alpha, gamma } => {
                let (a, g) = (alpha as f64, gamma as f64);
                if x > 0.0 { g * x } else { g * (a * x.exp() - a) }
            }
            Celu { alpha } => {
                let a = alpha as f64;
                x.max(0.0) + (a * (x / a).exp_m1()).min(0.0)
            }
            Softplus => softplus(x),
            Softsign => x / (1.0 + x.abs()),
            ThresholdedRelu { alpha } => {
                if x > alpha as f64 {
                    x
                } else {
                    0.0
                }
            }
            HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            Mish => x * softplus(x).tanh(),
            Gelu { tanh: false } => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            Gelu { tanh: true } => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
            }
            Swish { alpha } => x * sigmoid(alpha as f64 * x),
            Shrink { bias, lambd } => {
                let (b, l) = (bias as f64, lambd as f64);
                if x < -l {
                    x + b
                } else if x > l {
                    x - b
                } else {
                    0.0
                }
            }
            // Not reached: predicates and bitwise ops take their own paths.
            IsNaN | IsInf { .. } | Not | BitwiseNot => x,
        }
    }

    /// The vectorised kernel computing this op on f32 (the activations the GEMM epilogues
    /// also apply: Relu and LeakyRelu bit for bit, the others within a few ulp of [`Self::f`]).
    fn kernel_act(&self) -> Option<kiln_kernels::sgemm::Act> {
        use kiln_kernels::sgemm::Act;
        Some(match *self {
            UnaryOp::Relu => Act::Relu,
            UnaryOp::LeakyRelu { alpha } => Act::LeakyRelu { alpha },
            UnaryOp::Sigmoid => Act::Sigmoid,
            UnaryOp::Tanh => Act::Tanh,
            UnaryOp::Gelu { tanh } => Act::Gelu { tanh },
            UnaryOp::HardSigmoid { alpha, beta } => Act::HardSigmoid { alpha, beta },
            UnaryOp::HardSwish => Act::HardSwish,
            UnaryOp::Erf => Act::Erf,
            _ => return None,
        })
    }

    /// Whether the op maps f32 to f32 (so [`Self::apply_f32`] computes it).
    pub fn is_f32_map(&self) -> bool {
        self.out_dtype(DType::F32).is_ok_and(|d| d == DType::F32)
    }

    /// The op on f32 values in place, exactly as [`Self::eval`] computes each element of an
    /// f32 tensor (the vector kernel for the activations, else through f64); only for ops
    /// where [`Self::is_f32_map`] holds.
    pub fn apply_f32(&self, v: &mut [f32]) {
        match self.kernel_act() {
            Some(act) => kiln_kernels::sgemm::act_slice(act, v),
            None => v.iter_mut().for_each(|x| *x = self.f(f64::from(*x)) as f32),
        }
    }

    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        use UnaryOp::*;
        let dt = x.dtype();
        let out_dt = self.out_dtype(dt)?;
        let shape = x.shape().to_vec();
        let data = match self {
            IsNaN => Data::Bool(x.to_f64_vec().into_iter().map(f64::is_nan).collect()),
            IsInf { negative, positive } => Data::Bool(
                x.to_f64_vec()
                    .into_iter()
                    .map(|v| (v == f64::INFINITY && *positive) || (v == f64::NEG_INFINITY && *negative))
                    .collect(),
            ),
            Not => match x.data() {
                Data::Bool(v) => Data::Bool(v.iter().map(|b| !b).collect()),
                _ => return Err(OpError::UnsupportedDType { index: 0, got: dt }),
            },
            BitwiseNot => with_int!(x.data(), v => Element::wrap(v.iter().map(|&a| Int::not(a)).collect::<Vec<_>>()),
                else return Err(OpError::UnsupportedDType { index: 0, got: dt })),
            Abs | Neg | Sign | Relu if dt.is_int() => {
                with_int!(x.data(), v => Element::wrap(int_native(*self, v)),
                    else return Err(OpError::UnsupportedDType { index: 0, got: dt }))
            }
            _ if dt == DType::F32 && self.is_f32_map() => match x.data() {
                Data::F32(v) => {
                    // The run's planned (or recycled) buffer: a fresh vector of a large
                    // activation faulted its pages in on every run (wav2vec2's first GELU,
                    // 13 MB).
                    let mut out = crate::util::out_f32(v.len());
                    for (d, &s) in out.as_mut_slice().iter_mut().zip(v.iter()) {
                        *d = s;
                    }
                    self.apply_f32(out.as_mut_slice());
                    Data::F32(out)
                }
                _ => return Err(OpError::UnsupportedDType { index: 0, got: dt }),
            },
            _ if dt.is_int() => with_int!(x.data(), v => Element::wrap(via_f64(*self, v)),
                else return Err(OpError::UnsupportedDType { index: 0, got: dt })),
            _ => with_float!(x.data(), v => Element::wrap(via_f64(*self, v)),
                else return Err(OpError::UnsupportedDType { index: 0, got: dt })),
        };
        Ok(Tensor::new(out_dt, shape, data)?)
    }
}

fn via_f64<T: Num>(op: UnaryOp, v: &[T]) -> Vec<T> {
    v.iter().map(|&a| T::from_f64(op.f(a.to_f64()))).collect()
}

fn int_native<T: Num>(op: UnaryOp, v: &[T]) -> Vec<T> {
    let zero = T::zero();
    v.iter()
        .map(|&a| match op {
            UnaryOp::Abs => a.abs(),
            UnaryOp::Neg => a.neg(),
            UnaryOp::Sign => T::from_f64(if a > zero {
                1.0
            } else if a < zero {
                -1.0
            } else {
                0.0
            }),
            _ => {
                if a > zero {
                    a
                } else {
                    zero
                }
            }
        })
        .collect()
}
