//! Execution plans and the fast paths that carry them out.
//!
//! An op (`crate::Op`) is what the model says: its ONNX attributes, and `Op::eval`, the
//! reference semantics, is the oracle. How a node runs is the compiler's choice, recorded
//! beside the op as a [`Plan`]: the data layout (channels-last), the kernel (packed GEMM,
//! Winograd, depthwise, grouped), weights the compiler packed, and a fused activation
//! epilogue. The importer never makes a plan; the compiler's passes set it on IR nodes and
//! lowering copies it onto the program's steps.
//!
//! [`eval`] and [`infer`] are what the runtime and the IR call: an op with a plan runs here,
//! on the plan's kernels (each keeping a reference fallback for calls its kernel does not
//! take, such as another dtype); an op without one runs the same shape-generic fast kernels
//! its reference would (`fast_or_reference`), or its reference evaluation. A new kernel or a
//! new precision adds a plan kind and a module here, never a field in an op.
//!
//! Plans are checked once, by [`validate`], when a program file is decoded: a crafted file
//! can pair an op with a plan of another op, or a packed weight of an impossible geometry.

pub(crate) mod conv;
mod conv_nhwc;
mod conv_transpose;
pub(crate) mod depthwise;
mod group_norm;
mod matmul;
mod pointwise_depthwise;
mod pool_nhwc;
pub(crate) mod qconv_nhwc;
mod recurrent;
mod resize;
mod roi_align;

pub use conv_nhwc::{pack_channels_last, pack_depthwise_taps};
pub use pointwise_depthwise::{ConvStage, PointwiseDepthwise};
pub use qconv_nhwc::{QConvKind, channels_last_kind as qconv_channels_last_kind};
pub use recurrent::PackedWeightsCache;

use crate::error::{OpError, Result};
use crate::nn::{Activation, NnOp};
use crate::quant::QuantOp;
use crate::value::{Args, InferInput, ValueType};
use crate::{Op, Outputs};

/// How the compiler chose to run one node. Never changes what the node computes beyond
/// the documented rounding of the fast kernels; an op without a plan runs as imported.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum Plan {
    Conv(ConvPlan),
    /// MatMul and Gemm.
    Gemm(GemmPlan),
    /// MaxPool, AveragePool, LpPool and the global pools.
    Pool(PoolPlan),
    /// `QLinearConv`: the 8-bit convolution on the integer GEMM.
    QConv(QConvPlan),
    /// RNN, GRU and LSTM whose W and R are the program's constants.
    Recurrent(RecurrentPlan),
}

/// The plan of an RNN, GRU or LSTM whose W and R are program constants (`prepack` sets it):
/// the weights are packed for the GEMM on the first run and kept for later ones, instead of
/// on every call.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct RecurrentPlan {
    #[serde(skip)]
    pub packed: PackedWeightsCache,
}

/// The plan of a `QLinearConv`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct QConvPlan {
    /// X and Y are `[N, H, W, C]` (the `layout` pass): the convolution runs as the integer
    /// GEMM of X's windows (X itself for a 1x1) by the packed weights, requantized in
    /// blocks of output pixels.
    pub channels_last: bool,
    /// The quantized output clamped to `[lo, hi]`: a Relu or Clip that stood between the
    /// float convolution and its QuantizeLinear (`qdq_conv`), exact because quantizing is
    /// monotonic.
    pub clamp: Option<(i32, i32)>,
    /// Channels-last: requantize in f32 (`kiln_kernels::quant::requantize_row_f32`), as the QDQ graph this
    /// node replaced computed its output (`qdq_conv` sets it), instead of the f64 of the
    /// QLinearConv reference.
    #[serde(default)]
    pub float_requant: bool,
    /// Channels-last: a `QLinearAdd` of this convolution's output and another 8-bit value
    /// of its shape, fused (the `qconv_residual` pass). Inputs 9-15 are then the sum's: the
    /// scale and zero point it dequantizes this output with, R, R's scale and zero point,
    /// the sum's scale and zero point; the node's output is the sum. Each block of output
    /// pixels gets its sum while it is still in cache.
    #[serde(default)]
    pub residual: Option<QResidual>,
    /// The weights packed for the integer GEMM on the first run, kept for later ones.
    #[serde(skip)]
    pub packed: crate::quant::PackCache,
    /// A depthwise convolution's taps, made on the first run, kept for later ones.
    #[serde(skip)]
    pub taps: crate::quant::TapsCache,
    /// A grouped convolution's weights packed per group on the first run, kept for later
    /// ones.
    #[serde(skip)]
    pub groups: crate::quant::GroupsPackCache,
}

/// A [`QConvPlan`]'s fused residual sum.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq, Default)]
pub struct QResidual {
    /// A Relu between the sum and its quantization, as `QLinearAdd::relu`.
    pub relu: bool,
}

/// The plan of a `Conv`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct ConvPlan {
    /// Fused activation applied to the output (the unary op that followed the Conv).
    pub activation: Option<Activation>,
    /// X, the residual input 3 and Y are `[N, H, W, C]` instead of ONNX's `[N, C, H, W]`
    /// (the `layout` pass). W keeps its ONNX layout unless `packed` is set.
    pub channels_last: bool,
    /// With `channels_last`: X alone keeps ONNX's `[N, C, H, W]` layout. Set on a convolution
    /// of a few-channel input (an image) that no channels-last producer provides: the packed
    /// path gathers the windows straight from it, instead of a transpose of X followed by an
    /// im2col of `C`-float runs.
    pub x_channels_first: bool,
    /// Input 1 holds W packed for the channels-last kernels (see [`PackedConvWeights`]).
    pub packed: Option<PackedConvWeights>,
    /// Input 1 holds W Winograd-transformed and packed (`kiln_kernels::winograd::pack_weights`,
    /// layout `f32/nr32/v1`): a 3x3 stride-1 f32 convolution run as F(4x4, 3x3).
    pub winograd: Option<WinogradWeights>,
    /// A scale and shift after the activation (the `conv_tail` pass: a chain of a `Mul` and
    /// an `Add` of one-element constants that read the output alone). The channels-last
    /// packed and depthwise paths apply it to each block of the output as it is made; the
    /// others after the whole output.
    #[serde(default)]
    pub post: Option<PostAffine>,
    /// Input 4 holds one PRelu slope per output channel (`[M]` f32), applied after the bias
    /// and residual: `v < 0 ? v * slope : v` (the `fuse_act` pass: a PRelu that followed the
    /// convolution). Not with `activation` or `post`. The channels-last packed path applies
    /// it to each block of the output as it is made; the others after the whole output.
    #[serde(default)]
    pub prelu: bool,
}

/// `v * scale + shift` after a Conv's activation, each part optional and rounded on its own
/// (see [`kiln_kernels::sgemm::Affine`]).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct PostAffine {
    pub scale: Option<f32>,
    pub shift: Option<f32>,
}

impl PostAffine {
    /// The kernels' form.
    pub fn kernel(self) -> kiln_kernels::sgemm::Affine {
        kiln_kernels::sgemm::Affine {
            scale: self.scale,
            shift: self.shift,
        }
    }
}

/// What a channels-last Conv's packed weights stand for: W of shape `[m, c, kh, kw]`. With
/// group 1, packed GEMM panels (`pack_channels_last`); on a depthwise Conv (group = m, c = 1),
/// the taps in tap-major order `[kh * kw, m]` (`pack_depthwise_taps`); on a grouped one, the
/// taps `[kh * kw, c, m]`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PackedConvWeights {
    pub m: usize,
    pub c: usize,
    pub kh: usize,
    pub kw: usize,
}

/// What a Winograd Conv's transformed weights stand for: W of shape `[m, c, 3, 3]`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct WinogradWeights {
    pub m: usize,
    pub c: usize,
}

/// The plan of a `MatMul` or `Gemm`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct GemmPlan {
    /// Fused activation applied to the output.
    pub activation: Option<Activation>,
    /// B is a constant the compiler prepacked for the GEMM kernels (Gemm: `op(B)`,
    /// transposition included): input 1 is then the packed panels (1-D f32).
    pub packed_b: Option<PackedWeight>,
}

/// A weight stored packed for the GEMM kernels: its logical `k × n` and the packing's format
/// tag (e.g. `f32/nr32/v1`), checked when the op runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct PackedWeight {
    pub k: usize,
    pub n: usize,
    pub layout: String,
}

/// The plan of a pool.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct PoolPlan {
    /// X and Y are `[N, H, W, C]` (a windowed pool: no Indices output; a global pool: Y is
    /// `[N, 1, 1, C]`).
    pub channels_last: bool,
}

impl Plan {
    /// One line for dumps and `kiln info`: `nhwc packed(m=64 c=3 3x3) +Relu`.
    pub fn summary(&self) -> String {
        let act = |a: &Option<Activation>| a.map(|a| format!(" +{a:?}")).unwrap_or_default();
        match self {
            Plan::Conv(p) => {
                let mut s = String::new();
                if p.channels_last {
                    s.push_str(if p.x_channels_first { "nchw->nhwc" } else { "nhwc" });
                } else {
                    s.push_str("nchw");
                }
                if let Some(w) = p.packed {
                    s.push_str(&format!(" packed(m={} c={} {}x{})", w.m, w.c, w.kh, w.kw));
                }
                if let Some(w) = p.winograd {
                    s.push_str(&format!(" winograd(m={} c={})", w.m, w.c));
                }
                s.push_str(&act(&p.activation));
                if p.prelu {
                    s.push_str(" +PRelu");
                }
                if let Some(PostAffine { scale, shift }) = p.post {
                    s.push_str(&format!(" then x{} +{}", scale.unwrap_or(1.0), shift.unwrap_or(0.0)));
                }
                s
            }
            Plan::Gemm(p) => {
                let mut s = match &p.packed_b {
                    Some(w) => format!("packed_b({}x{} {})", w.k, w.n, w.layout),
                    None => "gemm".to_string(),
                };
                s.push_str(&act(&p.activation));
                s
            }
            Plan::Pool(p) => if p.channels_last { "nhwc" } else { "nchw" }.to_string(),
            Plan::QConv(p) => {
                let mut s = if p.channels_last { "nhwc int8" } else { "nchw int8" }.to_string();
                if let Some((lo, hi)) = p.clamp {
                    s.push_str(&format!(" clamp({lo}, {hi})"));
                }
                if let Some(r) = p.residual {
                    s.push_str(if r.relu { " +residual relu" } else { " +residual" });
                }
                s
            }
            Plan::Recurrent(_) => "constant weights, packed once".to_string(),
        }
    }

    /// The default plan of `op`'s kind (what the op does unplanned); `None` for an op that
    /// takes no plan.
    pub fn default_for(op: &Op) -> Option<Plan> {
        match op {
            Op::Nn(NnOp::Conv(_)) => Some(Plan::Conv(ConvPlan::default())),
            Op::Nn(NnOp::MatMul(_) | NnOp::Gemm(_)) => Some(Plan::Gemm(GemmPlan::default())),
            Op::Nn(NnOp::Pool(_) | NnOp::GlobalPool(_)) => Some(Plan::Pool(PoolPlan::default())),
            Op::Quant(QuantOp::QLinearConv(_)) => Some(Plan::QConv(QConvPlan::default())),
            _ => None,
        }
    }

    pub fn conv_mut(&mut self) -> Option<&mut ConvPlan> {
        match self {
            Plan::Conv(p) => Some(p),
            _ => None,
        }
    }

    pub fn gemm_mut(&mut self) -> Option<&mut GemmPlan> {
        match self {
            Plan::Gemm(p) => Some(p),
            _ => None,
        }
    }

    pub fn qconv_mut(&mut self) -> Option<&mut QConvPlan> {
        match self {
            Plan::QConv(p) => Some(p),
            _ => None,
        }
    }

    pub fn pool_mut(&mut self) -> Option<&mut PoolPlan> {
        match self {
            Plan::Pool(p) => Some(p),
            _ => None,
        }
    }

    /// Sets the fused activation; false for a plan without an epilogue (a pool).
    pub fn set_activation(&mut self, act: Option<Activation>) -> bool {
        match self {
            Plan::Conv(p) => p.activation = act,
            Plan::Gemm(p) => p.activation = act,
            Plan::Pool(_) | Plan::QConv(_) | Plan::Recurrent(_) => return false,
        }
        true
    }

    /// The fused activation, if the plan has one.
    pub fn activation(&self) -> Option<Activation> {
        match self {
            Plan::Conv(p) => p.activation,
            Plan::Gemm(p) => p.activation,
            Plan::Pool(_) | Plan::QConv(_) | Plan::Recurrent(_) => None,
        }
    }
}

fn mismatch(op: &Op, plan: &Plan) -> OpError {
    misfit(op, plan, "the plan is of another op kind")
}

fn misfit(op: &Op, plan: &Plan, reason: &'static str) -> OpError {
    OpError::Plan {
        op: op.name(),
        plan: plan.summary(),
        reason,
    }
}

/// Checks that `plan` fits `op`: a plan of the op's kind, with consistent fields. Called for
/// every step when a program file is decoded (the compiler makes only valid plans).
pub fn validate(op: &Op, plan: Option<&Plan>) -> Result<()> {
    let Some(plan) = plan else { return Ok(()) };
    match (op, plan) {
        (Op::Nn(NnOp::Conv(c)), Plan::Conv(p)) => {
            if p.x_channels_first && !p.channels_last {
                return Err(misfit(
                    op,
                    plan,
                    "X read channels-first needs a channels-last convolution",
                ));
            }
            if p.prelu && (p.activation.is_some() || p.post.is_some()) {
                return Err(misfit(
                    op,
                    plan,
                    "PRelu slopes go with neither an activation nor a scale and shift",
                ));
            }
            if p.packed.is_some() && p.winograd.is_some() {
                return Err(misfit(
                    op,
                    plan,
                    "weights cannot be both packed and Winograd-transformed",
                ));
            }
            if let Some(w) = p.packed
                && (w.m == 0 || w.c == 0 || w.kh == 0 || w.kw == 0 || !p.channels_last)
            {
                return Err(misfit(op, plan, "packed weights need channels-last and no zero dim"));
            }
            if let Some(w) = p.winograd
                && (w.m == 0 || w.c == 0 || c.group.max(1) != 1 || p.x_channels_first)
            {
                return Err(misfit(op, plan, "Winograd weights need group 1 and no zero dim"));
            }
            Ok(())
        }
        (Op::Nn(NnOp::MatMul(_) | NnOp::Gemm(_)), Plan::Gemm(_)) => Ok(()),
        (Op::Nn(NnOp::Pool(_) | NnOp::GlobalPool(_)), Plan::Pool(_)) => Ok(()),
        (Op::Recurrent(crate::recurrent::RecurrentOp::Recurrent(_)), Plan::Recurrent(_)) => Ok(()),
        (Op::Quant(QuantOp::QLinearConv(_)), Plan::QConv(p)) => match p.clamp {
            Some((lo, hi)) if lo > hi => Err(misfit(op, plan, "the clamp's low bound is above its high bound")),
            _ if p.residual.is_some() && !p.channels_last => Err(misfit(
                op,
                plan,
                "a fused residual sum needs a channels-last convolution",
            )),
            _ => Ok(()),
        },
        _ => Err(mismatch(op, plan)),
    }
}

/// Runs `op` as `plan` says (see the module docs); without a plan, the op's shape-generic
/// fast kernels where it has them, else its reference evaluation.
pub fn eval(op: &Op, plan: Option<&Plan>, args: &Args<'_>) -> Result<Outputs> {
    match (op, plan) {
        (Op::Nn(NnOp::Conv(c)), None) => conv::Planned::new(c, &ConvPlan::default()).eval(args),
        (Op::Nn(NnOp::Conv(c)), Some(Plan::Conv(p))) => conv::Planned::new(c, p).eval(args),
        (Op::Nn(NnOp::MatMul(m)), Some(Plan::Gemm(p))) => matmul::eval_matmul(m, p, args),
        (Op::Nn(NnOp::Gemm(g)), Some(Plan::Gemm(p))) => matmul::eval_gemm(g, p, args),
        (Op::Nn(NnOp::Pool(o)), Some(Plan::Pool(p))) if p.channels_last => o.eval_channels_last(args),
        (Op::Nn(NnOp::GlobalPool(o)), Some(Plan::Pool(p))) if p.channels_last => o.eval_channels_last(args),
        (Op::Nn(NnOp::Pool(_) | NnOp::GlobalPool(_)), Some(Plan::Pool(_))) => op.eval(args),
        (Op::Quant(QuantOp::QLinearConv(c)), Some(Plan::QConv(p))) => qconv_nhwc::eval(c, p, args),
        (Op::Recurrent(crate::recurrent::RecurrentOp::Recurrent(r)), None) => recurrent::eval(r, None, args),
        (Op::Recurrent(crate::recurrent::RecurrentOp::Recurrent(r)), Some(Plan::Recurrent(p))) => {
            recurrent::eval(r, Some(&p.packed), args)
        }
        (Op::Nn(NnOp::Resize(r)), None) => resize::eval(r, args),
        (Op::Nn(NnOp::RoiAlign(r)), None) => roi_align::eval(r, args),
        (Op::Nn(NnOp::ConvTranspose(c)), None) => conv_transpose::eval(c, args),
        (Op::Reduce(crate::reduce::ReduceOp::InstanceNormalization(o)), None) => group_norm::eval_instance(o, args),
        (Op::Reduce(crate::reduce::ReduceOp::GroupNormalization(o)), None) => group_norm::eval_group(o, args),
        (op, None) => op.eval(args),
        (op, Some(plan)) => Err(mismatch(op, plan)),
    }
}

/// The output types of `op` run as `plan` says (a channels-last plan permutes them, a packed
/// weight records the shape W had).
pub fn infer(op: &Op, plan: Option<&Plan>, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
    match (op, plan) {
        (Op::Nn(NnOp::Conv(c)), Some(Plan::Conv(p))) => conv::Planned::new(c, p).infer(inputs),
        (Op::Nn(NnOp::MatMul(m)), Some(Plan::Gemm(p))) => matmul::infer_matmul(m, p, inputs),
        (Op::Nn(NnOp::Gemm(g)), Some(Plan::Gemm(p))) => matmul::infer_gemm(g, p, inputs),
        (Op::Nn(NnOp::Pool(o)), Some(Plan::Pool(p))) if p.channels_last => o.infer_channels_last(inputs),
        (Op::Nn(NnOp::GlobalPool(o)), Some(Plan::Pool(p))) if p.channels_last => o.infer_channels_last(inputs),
        (Op::Nn(NnOp::Pool(_) | NnOp::GlobalPool(_)), Some(Plan::Pool(_))) => op.infer(inputs),
        (Op::Quant(QuantOp::QLinearConv(c)), Some(Plan::QConv(p))) => qconv_nhwc::infer(c, p, inputs),
        (Op::Recurrent(_), Some(Plan::Recurrent(_))) => op.infer(inputs),
        (op, None) => op.infer(inputs),
        (op, Some(plan)) => Err(mismatch(op, plan)),
    }
}

/// Multiply-accumulates of `op` run as `plan` says, for profiles and `kiln info` (a packed or
/// Winograd Conv's input 1 no longer has W's shape; its plan records it).
pub fn macs(op: &Op, plan: Option<&Plan>, inputs: &[InferInput<'_>], outputs: &[ValueType]) -> u64 {
    use crate::value::TensorType;
    let out = outputs
        .first()
        .and_then(ValueType::tensor)
        .and_then(TensorType::fixed_shape);
    let prod = |s: &[usize]| s.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
    match plan {
        // A Winograd Conv counts the direct method's MACs (its GFLOP/s are "effective").
        Some(Plan::Conv(ConvPlan { winograd: Some(w), .. })) => {
            out.map_or(0, |y| prod(&y).saturating_mul((w.c * 9) as u64))
        }
        Some(Plan::Conv(ConvPlan { packed: Some(w), .. })) => {
            out.map_or(0, |y| prod(&y).saturating_mul(prod(&[w.c, w.kh, w.kw])))
        }
        _ => op.macs(inputs, outputs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{Conv, MatMul};
    use crate::value::Value;
    use kiln_tensor::Tensor;

    fn conv() -> Op {
        Op::Nn(NnOp::Conv(Conv {
            group: 1,
            ..Default::default()
        }))
    }

    #[test]
    fn a_plan_must_fit_its_op() {
        let matmul = Op::Nn(NnOp::MatMul(MatMul::default()));
        let conv_plan = Plan::Conv(ConvPlan::default());
        assert!(validate(&conv(), Some(&conv_plan)).is_ok());
        assert!(validate(&conv(), None).is_ok());
        let e = validate(&matmul, Some(&conv_plan)).unwrap_err().to_string();
        assert!(e.contains("MatMul") && e.contains("nchw"), "{e}");
        let first_without_last = Plan::Conv(ConvPlan {
            x_channels_first: true,
            ..Default::default()
        });
        assert!(validate(&conv(), Some(&first_without_last)).is_err());
        let both = Plan::Conv(ConvPlan {
            channels_last: true,
            packed: Some(PackedConvWeights {
                m: 4,
                c: 3,
                kh: 3,
                kw: 3,
            }),
            winograd: Some(WinogradWeights { m: 4, c: 3 }),
            ..Default::default()
        });
        assert!(validate(&conv(), Some(&both)).is_err());
        // Run with a plan of another op: refused, never read as another layout.
        let a = Value::Tensor(Tensor::from_vec(vec![2, 2], vec![1.0f32; 4]).unwrap());
        let args = [Some(&a), Some(&a)];
        assert!(eval(&matmul, Some(&conv_plan), &Args::new(&args)).is_err());
        assert!(eval(&matmul, None, &Args::new(&args)).is_ok());
    }

    #[test]
    fn a_planned_activation_applies_and_the_reference_has_none() {
        // [[1, -2]] x I: the reference keeps -2; a plan's fused Relu clamps it, like a Relu
        // node after the product.
        let a = Value::Tensor(Tensor::from_vec(vec![1, 2], vec![1.0f32, -2.0]).unwrap());
        let i = Value::Tensor(Tensor::from_vec(vec![2, 2], vec![1.0f32, 0.0, 0.0, 1.0]).unwrap());
        let op = Op::Nn(NnOp::MatMul(MatMul::default()));
        let args = [Some(&a), Some(&i)];
        let plan = Plan::Gemm(GemmPlan {
            activation: Some(Activation::Relu),
            packed_b: None,
        });
        let plain = op.eval(&Args::new(&args)).unwrap();
        let fused = eval(&op, Some(&plan), &Args::new(&args)).unwrap();
        let v = |o: &Outputs| o[0].as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec();
        assert_eq!(v(&plain), [1.0, -2.0]);
        assert_eq!(v(&fused), [1.0, 0.0]);
        assert_eq!(plan.summary(), "gemm +Relu");
    }
}
