//! Activations a GEMM epilogue can apply, with their scalar reference definitions.
//!
//! The formulas are those of kiln-ops' standalone operators (`elementwise/unary.rs`,
//! `elementwise/nary.rs` for Clip, `nn/activation.rs` for Silu): the float value is computed
//! in f64 and rounded once to f32, so the portable path is bit for bit what the unfused
//! operator gives. The SIMD paths evaluate the same formulas in f32 (exp and tanh by
//! polynomial approximations, erf by a rational one) and are tested against these within
//! `4u (|y| + L |x|)` (`L` the slope bound, [`Act::lipschitz`]): a few ulp, and for erf-Gelu
//! an absolute error of about `2e-7 |x|` where `1 + erf` cancels.

/// An activation fused after the product (and after bias and residual).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Act {
    /// `x > 0 || x is NaN ? x : 0`.
    Relu,
    /// `min(max(x, min), max)` with each bound optional; `max` wins when `min > max`, NaN stays.
    Clip { min: Option<f32>, max: Option<f32> },
    /// `x < 0 ? alpha * x : x`.
    LeakyRelu { alpha: f32 },
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `0.5 x (1 + erf(x / sqrt 2))`, or with `tanh`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu { tanh: bool },
    /// `clamp(alpha x + beta, 0, 1)`.
    HardSigmoid { alpha: f32, beta: f32 },
    /// `x clamp(x / 6 + 0.5, 0, 1)`.
    HardSwish,
    /// `x * sigmoid(x)`, with the sigmoid rounded to f32 first (the `Mul(x, Sigmoid(x))` pair).
    Silu,
    /// `erf(x)` (the standalone Erf operator).
    Erf,
}

impl Act {
    /// Relu, Clip, HardSigmoid, HardSwish and LeakyRelu: a few compares, blends and
    /// multiplies, applied in registers with the tile's other epilogue terms; the others
    /// (exp, erf, tanh) run in a loop over the stored rows.
    pub fn is_cheap(self) -> bool {
        matches!(
            self,
            Act::Relu | Act::Clip { .. } | Act::HardSigmoid { .. } | Act::HardSwish | Act::LeakyRelu { .. }
        )
    }

    /// `act` split into what a store loop applies per vector (a cheap activation) and what
    /// runs after it over whole rows (a costly one): `(cheap, costly)`, at most one `Some`.
    pub(crate) fn split_costly(act: Option<Act>) -> (Option<Act>, Option<Act>) {
        match act {
            Some(a) if !a.is_cheap() => (None, Some(a)),
            cheap => (cheap, None),
        }
    }

    /// Every activation kind with representative parameters (tests and benchmarks).
    pub const SAMPLES: [Act; 14] = [
        Act::Relu,
        Act::Clip {
            min: Some(0.0),
            max: Some(6.0),
        },
        Act::Clip {
            min: None,
            max: Some(0.5),
        },
        Act::Clip {
            min: Some(-1.0),
            max: None,
        },
        Act::LeakyRelu { alpha: 0.01 },
        Act::LeakyRelu { alpha: -1.5 },
        Act::Sigmoid,
        Act::Tanh,
        Act::Gelu { tanh: false },
        Act::Gelu { tanh: true },
        Act::HardSigmoid { alpha: 0.2, beta: 0.5 },
        Act::HardSwish,
        Act::Silu,
        Act::Erf,
    ];

    /// The reference value: the standalone operator's result on one f32.
    pub fn apply_scalar(self, x: f32) -> f32 {
        let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
        let xd = f64::from(x);
        match self {
            Act::Relu => {
                if x > 0.0 || x.is_nan() {
                    x
                } else {
                    0.0
                }
            }
            Act::Clip { min, max } => {
                let mut r = x;
                if let Some(l) = min
                    && r < l
                {
                    r = l;
                }
                if let Some(h) = max
                    && r > h
                {
                    r = h;
                }
                r
            }
            Act::LeakyRelu { alpha } => {
                if x < 0.0 {
                    (f64::from(alpha) * xd) as f32
                } else {
                    x
                }
            }
            Act::Sigmoid => sigmoid(xd) as f32,
            Act::Tanh => xd.tanh() as f32,
            Act::Gelu { tanh: false } => (0.5 * xd * (1.0 + erf(xd / std::f64::consts::SQRT_2))) as f32,
            Act::Gelu { tanh: true } => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                (0.5 * xd * (1.0 + (k * (xd + 0.044715 * xd * xd * xd)).tanh())) as f32
            }
            Act::HardSigmoid { alpha, beta } => clamp01(f64::from(alpha) * xd + f64::from(beta)) as f32,
            Act::HardSwish => (xd * clamp01(xd / 6.0 + 0.5)) as f32,
            Act::Silu => x * (sigmoid(xd) as f32),
            Act::Erf => erf(xd) as f32,
        }
    }

    /// The reference applied to every element (the portable path's epilogue).
    pub fn apply_scalar_slice(self, v: &mut [f32]) {
        for x in v {
            *x = self.apply_scalar(*x);
        }
    }

    /// The largest slope `|f'(x)|` over all x: how much an error in the activation's input can
    /// grow (tests use it to bound the fused epilogue's error).
    pub fn lipschitz(self) -> f32 {
        match self {
            Act::Relu | Act::Clip { .. } | Act::Tanh => 1.0,
            Act::LeakyRelu { alpha } => alpha.abs().max(1.0),
            Act::Sigmoid => 0.25,
            // max of d/dx x Phi(x) is ~1.129; the tanh form is within 0.01 of it.
            Act::Gelu { .. } => 1.13,
            Act::HardSigmoid { alpha, .. } => alpha.abs(),
            Act::HardSwish => 1.5,
            Act::Silu => 1.1,
            // erf'(0) = 2 / sqrt(pi).
            Act::Erf => 1.13,
        }
    }
}

/// `v.clamp(0, 1)`, NaN kept (as kiln-ops' HardSigmoid and HardSwish).
fn clamp01(v: f64) -> f64 {
    v.clamp(0.0, 1.0)
}

/// The error function, to about 1e-13: its Maclaurin series below |x| = 3, the continued
/// fraction of erfc above. The one definition kiln has: kiln-ops' Erf and Gelu call it too, so
/// the portable Gelu epilogue agrees bit for bit with the standalone operator.
pub fn erf(x: f64) -> f64 {
    use std::f64::consts::FRAC_2_SQRT_PI;
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < 1e-300 {
        return FRAC_2_SQRT_PI * x;
    }
    if a < 3.0 {
        let x2 = x * x;
        let mut term = x;
        let mut sum = x;
        for k in 1..200 {
            let n = k as f64;
            term *= -x2 / n;
            let t = term / (2.0 * n + 1.0);
            sum += t;
            if t.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        FRAC_2_SQRT_PI * sum
    } else if a > 27.0 {
        1f64.copysign(x)
    } else {
        let mut t = a;
        for k in (1..=120).rev() {
            t = a + (k as f64 / 2.0) / t;
        }
        let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / t;
        (1.0 - erfc).copysign(x)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        assert_eq!(Act::Relu.apply_scalar(-2.0), 0.0);
        assert!(Act::Relu.apply_scalar(f32::NAN).is_nan());
        assert_eq!(Act::Relu.apply_scalar(-0.0).to_bits(), 0.0f32.to_bits());
        let clip = Act::Clip {
            min: Some(2.0),
            max: Some(1.0),
        };
        assert_eq!(clip.apply_scalar(0.0), 1.0); // max wins
        assert!(clip.apply_scalar(f32::NAN).is_nan());
        assert_eq!(Act::LeakyRelu { alpha: 0.5 }.apply_scalar(-2.0), -1.0);
        assert_eq!(Act::Sigmoid.apply_scalar(0.0), 0.5);
        assert_eq!(Act::HardSwish.apply_scalar(3.0), 3.0);
        assert_eq!(Act::HardSwish.apply_scalar(-3.0), 0.0);
        assert!((Act::Gelu { tanh: false }.apply_scalar(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((Act::Gelu { tanh: true }.apply_scalar(1.0) - 0.841_192).abs() < 1e-6);
        assert!((erf(1.0) - 0.842_700_792_949_714_9).abs() < 1e-13);
        assert_eq!(Act::Silu.apply_scalar(0.0), 0.0);
    }
}
