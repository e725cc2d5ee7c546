//! Family module: neural-network ops — convolutions, pooling, matrix products, resampling,
//! detection helpers. Reference semantics follow the ONNX operator specs
//! (<https://onnx.ai/onnx/operators/>); each submodule names the ops and opsets it covers.
//!
//! Float ops compute in f32 for f32/f16/bf16 inputs (converted back on output) and in f64 for
//! f64 inputs.

use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Dim, InferInput, TensorType, ValueType};
use kiln_kernels::gemm::GemmScalar;
use kiln_kernels::gemm::MatLayout;
use kiln_tensor::{DType, Element, Tensor, bf16, f16};
use std::borrow::Cow;

pub mod activation;
mod affine;
pub mod conv;
pub mod grid;
pub mod matmul;
pub mod nms;
pub mod pool;
pub use affine::ChannelAffine;
pub mod resize;
/// Compiler-made: a 1x1 Conv and the depthwise Conv reading it (its kernel is `crate::fast`).
pub use crate::fast::PointwiseDepthwise;

pub use activation::Activation;
pub use conv::{Conv, ConvTranspose, DeformConv};
pub use grid::{AffineGrid, GridSample, GridSampleMode, GridSamplePadding, RoiAlign, RoiAlignMode};
pub use matmul::{Einsum, Gemm, MatMul};
pub use nms::NonMaxSuppression;
pub use pool::{GlobalPool, GlobalPoolKind, LpPool, MaxUnpool, Pool, PoolKind};
pub use resize::{CoordMode, KeepAspect, NearestMode, Resize, ResizeMode};

/// How the spatial padding of a windowed op is chosen.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq, Default)]
pub enum AutoPad {
    /// Explicit `pads`.
    #[default]
    NotSet,
    /// Output size `ceil(in / stride)`, extra padding at the end.
    SameUpper,
    /// Output size `ceil(in / stride)`, extra padding at the start.
    SameLower,
    /// No padding.
    Valid,
}

op_family! {
    /// The neural-network family.
    pub enum NnOp {
        Conv(Conv),
        ConvTranspose(ConvTranspose),
        DeformConv(DeformConv),
        /// MaxPool, AveragePool and LpPool.
        Pool(Pool) = Pool::name,
        /// GlobalAveragePool, GlobalMaxPool, GlobalLpPool.
        GlobalPool(GlobalPool) = GlobalPool::name,
        MaxUnpool(MaxUnpool),
        MatMul(MatMul),
        Gemm(Gemm),
        Einsum(Einsum),
        /// Resize and the deprecated Upsample.
        Resize(Resize) = Resize::name,
        GridSample(GridSample),
        AffineGrid(AffineGrid),
        RoiAlign(RoiAlign),
        NonMaxSuppression(NonMaxSuppression),
        /// A 1x1 Conv and the depthwise Conv reading it, fused by the compiler.
        PointwiseDepthwise(PointwiseDepthwise),
        /// A per-channel scale and shift (an unfolded inference BatchNorm), made by the compiler.
        ChannelAffine(ChannelAffine),
    }
}

impl NnOp {
    pub fn macs(&self, inputs: &[InferInput<'_>], outputs: &[ValueType]) -> u64 {
        let fixed = |i: usize| {
            inputs
                .get(i)
                .and_then(|x| x.ty.tensor())
                .and_then(TensorType::fixed_shape)
        };
        let out = outputs
            .first()
            .and_then(ValueType::tensor)
            .and_then(TensorType::fixed_shape);
        let prod = |s: &[usize]| s.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        match self {
            // Every output element takes (C/group) * prod(kernel) MACs = prod(W.shape[1..]).
            // (A planned Conv whose input 1 is packed counts by its plan: `crate::fast::macs`.)
            NnOp::Conv(_) | NnOp::DeformConv(_) => match (fixed(1), out) {
                (Some(w), Some(y)) if !w.is_empty() => prod(&y).saturating_mul(prod(&w[1..])),
                _ => 0,
            },
            // Every input element is scattered into (M/group) * prod(kernel) outputs.
            NnOp::ConvTranspose(_) => match (fixed(0), fixed(1)) {
                (Some(x), Some(w)) if !w.is_empty() => prod(&x).saturating_mul(prod(&w[1..])),
                _ => 0,
            },
            NnOp::MatMul(_) => match (fixed(0), out) {
                (Some(a), Some(y)) if !a.is_empty() => prod(&y).saturating_mul(a[a.len() - 1] as u64),
                _ => 0,
            },
            NnOp::Gemm(g) => match (fixed(0), out) {
                (Some(a), Some(y)) if a.len() == 2 => {
                    let k = if g.trans_a { a[0] } else { a[1] };
                    prod(&y).saturating_mul(k as u64)
                }
                _ => 0,
            },
            // The expansion's MACs (X's pixels times C*E) plus the depthwise ones.
            NnOp::PointwiseDepthwise(PointwiseDepthwise { pointwise, depthwise }) => {
                let (Some(p1), Some(p2)) = (pointwise.plan.packed, depthwise.plan.packed) else {
                    return 0;
                };
                match (fixed(0), out) {
                    (Some(x), Some(y)) => prod(&x)
                        .saturating_mul(p1.m as u64)
                        .saturating_add(prod(&y).saturating_mul((p2.kh * p2.kw) as u64)),
                    _ => 0,
                }
            }
            NnOp::Einsum(e) => {
                let shapes: Option<Vec<Vec<usize>>> = (0..inputs.len()).map(fixed).collect();
                shapes.and_then(|s| e.macs(&s)).unwrap_or(0)
            }
            _ => 0,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers.

/// A float type the reference kernels compute in (f32 or f64).
pub trait Real:
    GemmScalar
    + Element
    + PartialOrd
    + std::ops::Sub<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + std::fmt::Debug
{
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn zero() -> Self {
        Self::default()
    }
    /// `C[m×n] = epilogue(A[m×k] · B[k×n])`, C row-major and dense, A and B in the given
    /// layouts (row-major or transposed), on the packed-panel SIMD kernels when this type has
    /// them: `Some(true)` when done (epilogue included), `Some(false)` when the operands do not
    /// fit, `None` when there is no fast path for the type or the layouts (nothing applied).
    #[allow(clippy::too_many_arguments)]
    fn fast_gemm(
        _m: usize,
        _n: usize,
        _k: usize,
        _a: &[Self],
        _la: MatLayout,
        _b: &[Self],
        _lb: MatLayout,
        _c: &mut [Self],
        _epilogue: FastEpilogue<'_, Self>,
    ) -> Option<bool> {
        None
    }
}

/// What [`Real::fast_gemm`] applies to the product before storing it: a bias per row (conv as
/// GEMM, M = output channels) or per column (MatMul/Gemm), then an activation.
#[derive(Debug)]
pub struct FastEpilogue<'a, T> {
    pub row_bias: Option<&'a [T]>,
    pub col_bias: Option<&'a [T]>,
    pub act: Option<kiln_kernels::sgemm::Act>,
}

impl<T> Clone for FastEpilogue<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for FastEpilogue<'_, T> {}

impl<'a, T> FastEpilogue<'a, T> {
    /// Nothing after the product.
    pub fn none() -> FastEpilogue<'a, T> {
        FastEpilogue {
            row_bias: None,
            col_bias: None,
            act: None,
        }
    }
}

impl Real for f32 {
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn fast_gemm(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        la: MatLayout,
        b: &[f32],
        lb: MatLayout,
        c: &mut [f32],
        ep: FastEpilogue<'_, f32>,
    ) -> Option<bool> {
        use kiln_kernels::sgemm::{AMatrix, BLayout, Bias, Epilogue, PackedB, sgemm};
        // A single row (GEMV) would pay more to pack B than to multiply: the reference loop
        // streams B once. (Weights prepacked at compile time will remove this case.)
        if m == 1 && ep.row_bias.is_none() && ep.col_bias.is_none() && ep.act.is_none() {
            return None;
        }
        let a = match (la.row_stride, la.col_stride) {
            (ld, 1) => AMatrix::row_major(a, ld),
            (1, ld) => AMatrix::transposed(a, ld),
            _ => return None,
        };
        let layout = BLayout::for_isa(kiln_kernels::isa::active());
        let Ok(packed) = PackedB::pack(layout, k, n, b, lb) else {
            return Some(false);
        };
        let bias = match (ep.row_bias, ep.col_bias) {
            (None, None) => Bias::None,
            (Some(r), None) => Bias::Row(r),
            (None, Some(c)) => Bias::Col(c),
            (Some(_), Some(_)) => return None,
        };
        let epilogue = Epilogue {
            bias,
            residual: None,
            act: ep.act,
            post: None,
            prelu: kiln_kernels::sgemm::Bias::None,
        };
        Some(sgemm(m, a, packed.view(), c, n, &epilogue).is_ok())
    }
}

impl Real for f64 {
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}

/// The elements of a float tensor in the compute type `T` (borrowed when already `T`).
pub(crate) fn floats<T: Real>(t: &Tensor, index: usize) -> Result<Cow<'_, [T]>> {
    if let Ok(s) = t.as_slice::<T>() {
        return Ok(Cow::Borrowed(s));
    }
    match t.dtype() {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
            Ok(Cow::Owned(t.to_f64_vec().into_iter().map(T::from_f64).collect()))
        }
        d => Err(OpError::UnsupportedDType { index, got: d }),
    }
}

/// Builds a float tensor of `dtype` from values computed in `T` (a vector or an arena region,
/// used as is when `dtype` is `T`'s).
pub(crate) fn from_floats<T: Real>(
    dtype: DType,
    shape: impl Into<kiln_tensor::Shape>,
    v: impl Into<kiln_tensor::Buf<T>>,
) -> Result<Tensor> {
    let shape: kiln_tensor::Shape = shape.into();
    let v: kiln_tensor::Buf<T> = v.into();
    if dtype == T::DTYPE {
        return Ok(Tensor::from_buf(shape, v)?);
    }
    Ok(match dtype {
        DType::F32 => Tensor::from_vec(shape, v.iter().map(|x| x.to_f64() as f32).collect::<Vec<_>>())?,
        DType::F64 => Tensor::from_vec(shape, v.iter().map(|x| x.to_f64()).collect::<Vec<_>>())?,
        DType::F16 => Tensor::from_vec(shape, v.iter().map(|x| f16::from_f64(x.to_f64())).collect::<Vec<_>>())?,
        DType::BF16 => Tensor::from_vec(shape, v.iter().map(|x| bf16::from_f64(x.to_f64())).collect::<Vec<_>>())?,
        d => return Err(OpError::Unsupported(format!("cannot produce a {d} tensor from floats"))),
    })
}

/// Builds a tensor of any numeric `dtype` from f64 values (integers saturate, NaN gives 0).
pub(crate) fn from_f64s(dtype: DType, shape: impl Into<kiln_tensor::Shape>, v: &[f64]) -> Result<Tensor> {
    let shape: kiln_tensor::Shape = shape.into();
    macro_rules! ints {
        ($t:ty) => {
            Tensor::from_vec(
                shape,
                v.iter().map(|&x| x.round_ties_even() as $t).collect::<Vec<$t>>(),
            )?
        };
    }
    Ok(match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Bool => Tensor::from_f64(dtype, shape, v)?,
        DType::I8 => ints!(i8),
        DType::I16 => ints!(i16),
        DType::I32 => ints!(i32),
        DType::I64 => ints!(i64),
        DType::U8 => ints!(u8),
        DType::U16 => ints!(u16),
        DType::U32 => ints!(u32),
        DType::U64 => ints!(u64),
        d => return Err(OpError::Unsupported(format!("cannot produce a {d} tensor here"))),
    })
}

/// Runs `$f::<T>(args..)` with `T = f64` for f64 and `T = f32` for f32/f16/bf16.
macro_rules! float_dispatch {
    ($dtype:expr, $index:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $dtype {
            kiln_tensor::DType::F64 => $f::<f64>($($arg),*),
            kiln_tensor::DType::F32 | kiln_tensor::DType::F16 | kiln_tensor::DType::BF16 => $f::<f32>($($arg),*),
            d => Err($crate::error::OpError::UnsupportedDType { index: $index, got: d }),
        }
    };
}
pub(crate) use float_dispatch;

/// Checks that `dtype` is one of the float types the float kernels take.
pub(crate) fn check_float(t: &Tensor, index: usize) -> Result<()> {
    match t.dtype() {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
        d => Err(OpError::UnsupportedDType { index, got: d }),
    }
}

/// The static shape of input `i`, when its rank is known.
pub(crate) fn input_shape(inputs: &[InferInput<'_>], i: usize) -> Option<Vec<Dim>> {
    inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.shape.clone())
}

pub(crate) fn tensor_type(dtype: Option<DType>, shape: Option<Vec<Dim>>) -> ValueType {
    ValueType::Tensor(TensorType { dtype, shape })
}

/// Output size and padding of one spatial dim of a windowed op (conv, pool).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub(crate) struct DimGeom {
    pub out: usize,
    pub pad_begin: usize,
    pub pad_end: usize,
}

/// Computes the output size and padding of one spatial dim, axis `axis` of X (input 0, of
/// shape `x`): kernel size `k`, stride `s`, dilation `d`, explicit pads `(pb, pe)` (used with
/// `AutoPad::NotSet`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn window_geom(
    x: &[usize],
    axis: usize,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Result<DimGeom> {
    let input = *x.get(axis).ok_or(OpError::Axis {
        axis: axis as i64,
        rank: x.len(),
    })?;
    for (attr, v) in [("kernel_shape", k), ("strides", s), ("dilations", d)] {
        if v == 0 {
            return Err(OpError::attribute(
                attr,
                "every value >= 1",
                format!("0 on axis {axis}"),
            ));
        }
    }
    let span = (k - 1) * d + 1;
    match auto_pad {
        AutoPad::SameUpper | AutoPad::SameLower => {
            let out = input.div_ceil(s);
            let total = ((out.max(1) - 1) * s + span).saturating_sub(input);
            let small = total / 2;
            let (pad_begin, pad_end) = if auto_pad == AutoPad::SameUpper {
                (small, total - small)
            } else {
                (total - small, small)
            };
            Ok(DimGeom {
                out,
                pad_begin,
                pad_end,
            })
        }
        AutoPad::Valid => {
            let out = if input >= span { (input - span) / s + 1 } else { 0 };
            Ok(DimGeom {
                out,
                pad_begin: 0,
                pad_end: 0,
            })
        }
        AutoPad::NotSet => {
            let padded = input + pb + pe;
            if padded < span {
                return Err(OpError::input_shape(
                    0,
                    format!(
                        "axis {axis} of at least {} (a window of {span}: kernel {k}, dilation {d}, pads {pb} + {pe})",
                        span - pb - pe
                    ),
                    x,
                ));
            }
            let mut out = if ceil_mode {
                (padded - span).div_ceil(s) + 1
            } else {
                (padded - span) / s + 1
            };
            // The last window must start inside the input or the leading padding.
            if ceil_mode && out > 1 && (out - 1) * s >= input + pb {
                out -= 1;
            }
            Ok(DimGeom {
                out,
                pad_begin: pb,
                pad_end: pe,
            })
        }
    }
}

/// Symbolic counterpart of [`window_geom`]'s output size for an unknown input dim: a
/// deterministic name, so equal names mean equal sizes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn window_sym(
    input: &str,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Dim {
    Dim::Sym(format!(
        "win({input},{auto_pad:?},k{k},s{s},d{d},p{pb}+{pe},c{})",
        ceil_mode as u8
    ))
}

/// Output spatial dims of a windowed op with X's static dims `x` (fixed or symbolic; the
/// spatial ones from axis 2).
pub(crate) fn window_dims(
    x: &[Dim],
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
    pads: &[usize],
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Result<Vec<Dim>> {
    let spatial = x.get(2..).unwrap_or(&[]);
    let fixed = crate::util::fixed(x);
    let n = spatial.len();
    let mut out = Vec::with_capacity(n);
    for (i, sd) in spatial.iter().enumerate() {
        let k = kernel.get(i).copied().unwrap_or(1);
        let s = strides.get(i).copied().unwrap_or(1);
        let d = dilations.get(i).copied().unwrap_or(1);
        let pb = pads.get(i).copied().unwrap_or(0);
        let pe = pads.get(i + n).copied().unwrap_or(0);
        out.push(match (sd, &fixed) {
            (Dim::Fixed(_), Some(xs)) => Dim::Fixed(window_geom(xs, i + 2, k, s, d, pb, pe, auto_pad, ceil_mode)?.out),
            // Other dims are symbolic: a window that does not fit is named at evaluation.
            (Dim::Fixed(v), None) => match window_geom(&[*v], 0, k, s, d, pb, pe, auto_pad, ceil_mode) {
                Ok(g) => Dim::Fixed(g.out),
                Err(_) => window_sym(&v.to_string(), k, s, d, pb, pe, auto_pad, ceil_mode),
            },
            (Dim::Sym(name), _) => window_sym(name, k, s, d, pb, pe, auto_pad, ceil_mode),
        });
    }
    Ok(out)
}

/// Validates per-spatial-dim attribute lists: empty means the default `fill`.
/// Per-spatial-dim values (kernel, strides, pads, ...): inline for up to 3 spatial dims (6
/// pads), so resolving a call's geometry allocates nothing.
pub(crate) type Dims = smallvec::SmallVec<[usize; 6]>;

pub(crate) fn spatial_attr(v: &[usize], n: usize, fill: usize, attr: &'static str) -> Result<Dims> {
    if v.is_empty() {
        return Ok(smallvec::smallvec![fill; n]);
    }
    if v.len() != n {
        return Err(OpError::attribute(
            attr,
            format!("{n} values, one per spatial axis"),
            format!("{v:?}"),
        ));
    }
    Ok(Dims::from_slice(v))
}

/// Validates the `pads` attribute (2 values per spatial dim, empty for none).
pub(crate) fn pads_attr(v: &[usize], n: usize) -> Result<Dims> {
    if v.is_empty() {
        return Ok(smallvec::smallvec![0; 2 * n]);
    }
    if v.len() != 2 * n {
        return Err(OpError::attribute(
            "pads",
            format!("{} values, a begin and an end per spatial axis", 2 * n),
            format!("{v:?}"),
        ));
    }
    Ok(Dims::from_slice(v))
}

/// Product of dims with overflow and allocation-bound checks.
pub(crate) fn numel(shape: &[usize]) -> Result<usize> {
    util::checked_numel(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tt(dtype: DType, dims: &[Dim]) -> ValueType {
        ValueType::Tensor(TensorType::new(dtype, dims.to_vec()))
    }
    fn f(n: usize) -> Dim {
        Dim::Fixed(n)
    }

    #[test]
    fn conv_infer_and_macs() {
        // ResNet stem: 1x3x224x224, 64x3x7x7, stride 2, pad 3 → 1x64x112x112.
        let op = NnOp::Conv(Conv {
            strides: vec![2, 2],
            pads: vec![3, 3, 3, 3],
            group: 1,
            ..Default::default()
        });
        let x = tt(DType::F32, &[Dim::Sym("N".into()), f(3), f(224), f(224)]);
        let w = tt(DType::F32, &[f(64), f(3), f(7), f(7)]);
        let ins = [
            InferInput {
                ty: &x,
                konst: None,
                present: true,
            },
            InferInput {
                ty: &w,
                konst: None,
                present: true,
            },
        ];
        let out = op.infer(&ins).unwrap();
        assert_eq!(out[0], tt(DType::F32, &[Dim::Sym("N".into()), f(64), f(112), f(112)]));
        let xf = tt(DType::F32, &[f(1), f(3), f(224), f(224)]);
        let ins = [
            InferInput {
                ty: &xf,
                konst: None,
                present: true,
            },
            InferInput {
                ty: &w,
                konst: None,
                present: true,
            },
        ];
        let out = op.infer(&ins).unwrap();
        // 64*112*112 outputs x 3*7*7 taps = 118,013,952.
        assert_eq!(op.macs(&ins, &out), 118_013_952);
    }

    #[test]
    fn pool_and_global_infer() {
        // MaxPool 3x3 stride 2 pad 1 on 112 → 56; Indices output is i64.
        let op = NnOp::Pool(Pool {
            kind: PoolKind::Max { storage_order: false },
            auto_pad: AutoPad::NotSet,
            ceil_mode: false,
            dilations: vec![],
            kernel_shape: vec![3, 3],
            pads: vec![1, 1, 1, 1],
            strides: vec![2, 2],
        });
        let x = tt(DType::F32, &[f(1), f(64), f(112), f(112)]);
        let out = op
            .infer(&[InferInput {
                ty: &x,
                konst: None,
                present: true,
            }])
            .unwrap();
        assert_eq!(out[0], tt(DType::F32, &[f(1), f(64), f(56), f(56)]));
        assert_eq!(out[1], tt(DType::I64, &[f(1), f(64), f(56), f(56)]));
        let g = NnOp::GlobalPool(GlobalPool::new(GlobalPoolKind::Average));
        let out = g
            .infer(&[InferInput {
                ty: &x,
                konst: None,
                present: true,
            }])
            .unwrap();
        assert_eq!(out[0], tt(DType::F32, &[f(1), f(64), f(1), f(1)]));
    }

    #[test]
    fn matmul_gemm_infer_and_macs() {
        let a = tt(DType::F32, &[Dim::Sym("B".into()), f(128), f(768)]);
        let b = tt(DType::F32, &[f(768), f(3072)]);
        let op = NnOp::MatMul(MatMul::default());
        let ins = [
            InferInput {
                ty: &a,
                konst: None,
                present: true,
            },
            InferInput {
                ty: &b,
                konst: None,
                present: true,
            },
        ];
        assert_eq!(
            op.infer(&ins).unwrap()[0],
            tt(DType::F32, &[Dim::Sym("B".into()), f(128), f(3072)])
        );
        let a = tt(DType::F32, &[f(1), f(2048)]);
        let b = tt(DType::F32, &[f(1000), f(2048)]);
        let op = NnOp::Gemm(Gemm {
            trans_b: true,
            ..Gemm::default()
        });
        let ins = [
            InferInput {
                ty: &a,
                konst: None,
                present: true,
            },
            InferInput {
                ty: &b,
                konst: None,
                present: true,
            },
        ];
        let out = op.infer(&ins).unwrap();
        assert_eq!(out[0], tt(DType::F32, &[f(1), f(1000)]));
        assert_eq!(op.macs(&ins, &out), 2_048_000);
    }

    #[test]
    fn window_geometry_rules() {
        // SAME_UPPER: out = ceil(5/2) = 3, total pad (3-1)*2+3-5 = 2 → 1/1.
        let g = window_geom(&[5], 0, 3, 2, 1, 0, 0, AutoPad::SameUpper, false).unwrap();
        assert_eq!((g.out, g.pad_begin, g.pad_end), (3, 1, 1));
        // SAME_LOWER with odd total (4 in, k 2, s 1: total 1) puts it first.
        let g = window_geom(&[4], 0, 2, 1, 1, 0, 0, AutoPad::SameLower, false).unwrap();
        assert_eq!((g.out, g.pad_begin, g.pad_end), (4, 1, 0));
        // ceil_mode: 4 in, k 3, s 2 → ceil(1/2)+1 = 2; floor gives 1.
        assert_eq!(
            window_geom(&[4], 0, 3, 2, 1, 0, 0, AutoPad::NotSet, true).unwrap().out,
            2
        );
        assert_eq!(
            window_geom(&[4], 0, 3, 2, 1, 0, 0, AutoPad::NotSet, false).unwrap().out,
            1
        );
        assert_eq!(
            window_geom(&[1, 3, 2, 4], 2, 3, 1, 1, 0, 0, AutoPad::NotSet, false).unwrap_err(),
            OpError::input_shape(
                0,
                "axis 2 of at least 3 (a window of 3: kernel 3, dilation 1, pads 0 + 0)",
                &[1, 3, 2, 4]
            )
        );
    }
}
