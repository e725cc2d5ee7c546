//! Activation epilogues of `Conv`, `Gemm` and `MatMul`: the unary op that followed the product
//! in the model, fused into it by the compiler.
//!
//! On the reference path an epilogue applies the very functions of the standalone ops
//! (`UnaryOp::eval`, `Clip::eval`, `Mul`) to the product's rounded output, so a fused node
//! computes bit for bit what the unfused pair did. f32 Conv and MatMul on the SIMD kernels
//! apply it in registers instead (`kernel_act`): Relu, Clip and LeakyRelu bit for bit, the
//! others within a few ulp (the kernels' polynomial exp/tanh/erfc).

use crate::elementwise::{Binary, BinaryOp, Clip, UnaryOp};
use crate::error::Result;
use kiln_tensor::Tensor;

/// An activation applied to the output of the op that carries it.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum Activation {
    Relu,
    /// `min(max(x, min), max)`, either bound optional.
    Clip {
        min: Option<f32>,
        max: Option<f32>,
    },
    Sigmoid,
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    HardSwish,
    /// `approximate = "tanh"` when `tanh`.
    Gelu {
        tanh: bool,
    },
    /// `x * sigmoid(x)`: the `Mul(x, Sigmoid(x))` pair.
    Silu,
    LeakyRelu {
        alpha: f32,
    },
    Tanh,
}

impl Activation {
    /// The activation a standalone unary op computes, when it is one of the fusable ones.
    pub fn from_unary(op: UnaryOp) -> Option<Activation> {
        Some(match op {
            UnaryOp::Relu => Activation::Relu,
            UnaryOp::Sigmoid => Activation::Sigmoid,
            UnaryOp::HardSigmoid { alpha, beta } => Activation::HardSigmoid { alpha, beta },
            UnaryOp::HardSwish => Activation::HardSwish,
            UnaryOp::Gelu { tanh } => Activation::Gelu { tanh },
            UnaryOp::LeakyRelu { alpha } => Activation::LeakyRelu { alpha },
            UnaryOp::Tanh => Activation::Tanh,
            _ => return None,
        })
    }

    /// The op name as shown in dumps (`Relu`, `Clip`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Activation::Relu => "Relu",
            Activation::Clip { .. } => "Clip",
            Activation::Sigmoid => "Sigmoid",
            Activation::HardSigmoid { .. } => "HardSigmoid",
            Activation::HardSwish => "HardSwish",
            Activation::Gelu { .. } => "Gelu",
            Activation::Silu => "Silu",
            Activation::LeakyRelu { .. } => "LeakyRelu",
            Activation::Tanh => "Tanh",
        }
    }

    /// Applies the activation to `y` with the standalone ops' own evaluation.
    /// The same activation for the GEMM kernels' epilogue (applied in registers; Relu, Clip and
    /// LeakyRelu bit for bit, the others within a few ulp of this module's f64 formulas).
    pub fn kernel_act(&self) -> kiln_kernels::sgemm::Act {
        use kiln_kernels::sgemm::Act;
        match *self {
            Activation::Relu => Act::Relu,
            Activation::Clip { min, max } => Act::Clip { min, max },
            Activation::Sigmoid => Act::Sigmoid,
            Activation::HardSigmoid { alpha, beta } => Act::HardSigmoid { alpha, beta },
            Activation::HardSwish => Act::HardSwish,
            Activation::Gelu { tanh } => Act::Gelu { tanh },
            Activation::Silu => Act::Silu,
            Activation::LeakyRelu { alpha } => Act::LeakyRelu { alpha },
            Activation::Tanh => Act::Tanh,
        }
    }

    pub fn apply(&self, y: Tensor) -> Result<Tensor> {
        let unary = |op: UnaryOp| op.apply(&y);
        match *self {
            Activation::Relu => unary(UnaryOp::Relu),
            Activation::Clip { min, max } => Clip { min, max }.apply(&y, None, None),
            Activation::Sigmoid => unary(UnaryOp::Sigmoid),
            Activation::HardSigmoid { alpha, beta } => unary(UnaryOp::HardSigmoid { alpha, beta }),
            Activation::HardSwish => unary(UnaryOp::HardSwish),
            Activation::Gelu { tanh } => unary(UnaryOp::Gelu { tanh }),
            Activation::Silu => {
                let s = UnaryOp::Sigmoid.apply(&y)?;
                Binary {
                    op: BinaryOp::Mul,
                    legacy_axis: None,
                }
                .apply(&y, &s)
            }
            Activation::LeakyRelu { alpha } => unary(UnaryOp::LeakyRelu { alpha }),
            Activation::Tanh => unary(UnaryOp::Tanh),
        }
    }
}

/// Applies an optional epilogue.
pub(crate) fn apply(act: Option<&Activation>, y: Tensor) -> Result<Tensor> {
    match act {
        Some(a) => a.apply(y),
        None => Ok(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epilogues_match_the_standalone_ops() {
        let x = Tensor::from_vec(vec![5], vec![-3.0f32, -0.5, 0.0, 0.7, 4.0]).unwrap();
        let relu = Activation::Relu.apply(x.clone()).unwrap();
        assert_eq!(relu.as_slice::<f32>().unwrap(), &[0.0, 0.0, 0.0, 0.7, 4.0]);
        let clip = Activation::Clip {
            min: Some(0.0),
            max: Some(1.0),
        }
        .apply(x.clone())
        .unwrap();
        assert_eq!(clip.as_slice::<f32>().unwrap(), &[0.0, 0.0, 0.0, 0.7, 1.0]);
        // Silu is x * sigmoid(x) rounded per step, as the Mul(x, Sigmoid(x)) pair (f32 Sigmoid
        // runs the vectorised kernel: within a few ulp of the correctly rounded value).
        let silu = Activation::Silu.apply(x.clone()).unwrap();
        let want: Vec<f32> = x
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v * ((1.0 / (1.0 + (-(v as f64)).exp())) as f32))
            .collect();
        for (&g, &w) in silu.as_slice::<f32>().unwrap().iter().zip(&want) {
            assert!((g - w).abs() <= 4.0 * f32::EPSILON * w.abs(), "{g} vs {w}");
        }
        assert_eq!(Activation::from_unary(UnaryOp::Exp), None);
        assert_eq!(Activation::from_unary(UnaryOp::Tanh), Some(Activation::Tanh));
    }
}
