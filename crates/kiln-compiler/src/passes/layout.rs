//! Channels-last layout for convolutional networks: every eligible 2-D convolution runs on
//! `[N, H, W, C]` data (`Conv::channels_last`), where a 1x1 convolution is a plain GEMM over X
//! itself (no im2col copy), an im2col row is `kh` contiguous runs of `kw x C` values, and a
//! depthwise window is a contiguous run of channels per tap. A MaxPool reading a
//! channels-last value (its Indices unread) runs channels-last too (`Pool::channels_last`),
//! and so does a GlobalAveragePool or GlobalMaxPool (`GlobalPool::channels_last`), whose
//! `[N, 1, 1, C]` result turns back to `[N, C, 1, 1]` for next to nothing. An f32 Add, Sub,
//! Mul or Div with a channels-last input follows it when its other input is full-sized, one
//! value, or varies along channels alone (a squeeze-excitation scale `[N, C, 1, 1]`, whose
//! transpose the `unit_transpose` pass makes a view), and so does a `ChannelAffine` (an
//! unfolded BatchNorm), and a Concat along channels with a channels-last input (DenseNet's
//! growing feature maps), which then joins along the last dim.
//!
//! Eligible: an f32 Conv with fixed rank-4 shapes and constant weights, group 1, depthwise
//! (`group == C == M`), or grouped with no residual (`kiln_kernels::grouped::lanes`: every
//! group shape has a vector form); no Winograd or packing yet. Each converted Conv reads the channels-last
//! twin of its X (and residual): the twin another converted Conv produced, else a new
//! Transpose. Its result stays channels-last, and a Transpose back to the original value
//! follows it for any other reader; the final `dce` removes the transposes no one reads, so a
//! chain of convolutions pays one transpose in and one out.
//!
//! Graphs without an eligible convolution are left alone.

use super::edit::{Index, add_constant, binary, dtype_of, fixed_shape, fresh_name};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::TensorType;
use kiln_ops::elementwise::ElementwiseOp;
use kiln_ops::fast::Plan;
use kiln_ops::movement::{MovementOp, Transpose};
use kiln_ops::nn::resize::{CoordMode, Resize};
use kiln_ops::nn::{GlobalPoolKind, NnOp, PoolKind};
use kiln_ops::quant::{DequantizeLinear, QuantOp, QuantizeLinear};
use kiln_tensor::{DType, Tensor};
use std::collections::HashMap;

/// The suffixes of the transposes this pass inserts (into and out of channels-last), by
/// which `kiln profile` tells them from a model's own.
pub const TO_NHWC: &str = "_to_nhwc";
pub const TO_NCHW: &str = "_to_nchw";

/// Whether a node name is one of this pass's transposes.
pub fn is_layout_transpose(name: &str) -> bool {
    name.contains(TO_NHWC) || name.contains(TO_NCHW)
}

/// Input channels up to which a dense convolution reads a channels-first X directly instead
/// of through a transpose: with `C` this small, the channels-last im2col copies runs of only
/// `kw * C` floats (9 for an RGB 3x3), and the transpose of the input is a pass of its own
/// (MobileNet-v2's stem: 0.53 ms with the transpose, 0.41 ms gathering).
const GATHER_MAX_CHANNELS: usize = 4;
/// Deepest window (`C x kh x kw`) read that way. The gathered block is A transposed, one
/// cache line per depth step of a tile: at MobileNet's K = 27 that is cheap, at ResNet's 7x7
/// stem (K = 147) it measured 2.79 against 2.87 ms with the transpose it saves, and at ViT's
/// 16x16 patches (K = 768) it lost 0.1 ms (0.64 -> 0.74 ms with the transpose).
const GATHER_MAX_DEPTH: usize = 256;

/// How a Conv qualifies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dense,
    Depthwise,
    Grouped,
    /// A 2-D MaxPool (f32 or 8-bit) whose Indices no one reads, or an f32 AveragePool.
    MaxPool,
    /// An f32 GlobalAveragePool or GlobalMaxPool of a rank-4 value.
    GlobalPool,
    /// A `ChannelAffine` (an unfolded BatchNorm) of a rank-4 value.
    Affine,
    /// An f32 Concat of rank-4 values along channels.
    Concat,
    /// An f32 Add, Sub, Mul or Div of rank-4 values broadcasting to a rank-4 output, every
    /// input either full-sized or varying along batch and channels alone (a
    /// squeeze-excitation scale `[N, C, 1, 1]`, whose twin `[N, 1, 1, C]` is a reshape), or
    /// one element of any rank.
    Binary,
    /// A one-tensor elementwise op (an activation, Clip with scalar bounds) of a rank-4 f32
    /// value: the same per element in either layout.
    Unary,
    /// An f32 or 8-bit Resize of a rank-4 value by constant scales or sizes over all four axes (no
    /// `axes`, no roi): channels-last, the same constant in `[N, H, W, C]` order.
    Resize,
    /// An f32 PRelu of a rank-4 value whose slope is a constant of one element or one per
    /// channel (`[C, 1, 1]`, `[1, C, 1, 1]`): channels-last, the slope as `[1, 1, 1, C]`
    /// (the same values in the same order).
    PRelu,
    /// A QuantizeLinear or DequantizeLinear of a rank-4 value with one scale and zero point
    /// (per tensor): the same per element in either layout, whatever the two dtypes.
    Quant,
    /// A `QLinearAdd` of two same-shaped rank-4 values: the same per element in either
    /// layout, its operands in slots 0 and 3.
    QAdd,
    /// A 2-D dense (group 1) or depthwise `QLinearConv` of an 8-bit rank-4 value with constant weights and
    /// one scale and zero point for X and for Y: the integer GEMM channels-last
    /// (`QConvPlan::channels_last`).
    QConv,
}

/// A PRelu's constant slope for a channels-last X: one element as it is, one value per
/// channel as `[1, 1, 1, C]`; `None` for any other slope.
fn prelu_slope_nhwc(g: &Graph, index: &Index, x: ValueId, slope: ValueId) -> Option<Tensor> {
    let t = index.tensor(g, slope)?;
    let c = *fixed_shape(g, x)?.get(1)?;
    if t.dtype() != DType::F32 {
        return None;
    }
    let per_channel = matches!(t.shape(), [n, 1, 1] | [1, n, 1, 1] if *n == c);
    if t.len() == 1 {
        Some(t.clone())
    } else if per_channel {
        t.clone().reshape(vec![1, 1, 1, c]).ok()
    } else {
        None
    }
}

fn kind(g: &Graph, index: &Index, node: &Node) -> Option<Kind> {
    let rank4_f32 = |v: ValueId| dtype_of(g, v) == Some(DType::F32) && fixed_shape(g, v).is_some_and(|s| s.len() == 4);
    if let NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(_) | ElementwiseOp::Clip(_))) = &node.kind {
        let (Some(Some(x)), [Some(y)]) = (node.inputs.first(), node.outputs.as_slice()) else {
            return None;
        };
        let scalar =
            |v: &Option<ValueId>| v.is_none_or(|v| fixed_shape(g, v).is_some_and(|s| s.iter().product::<usize>() == 1));
        let ok = rank4_f32(*x)
            && rank4_f32(*y)
            && fixed_shape(g, *x) == fixed_shape(g, *y)
            && node.inputs.iter().skip(1).all(scalar);
        return ok.then_some(Kind::Unary);
    }
    if let NodeKind::Op(Op::Quant(
        QuantOp::QuantizeLinear(QuantizeLinear { block_size: 0, .. })
        | QuantOp::DequantizeLinear(DequantizeLinear { block_size: 0, .. }),
    )) = &node.kind
    {
        let (Some(Some(x)), [Some(y)]) = (node.inputs.first(), node.outputs.as_slice()) else {
            return None;
        };
        let one =
            |v: &Option<ValueId>| v.is_none_or(|v| fixed_shape(g, v).is_some_and(|s| s.iter().product::<usize>() == 1));
        let rank4 = |v: ValueId| fixed_shape(g, v).is_some_and(|s| s.len() == 4);
        let ok = rank4(*x)
            && fixed_shape(g, *x) == fixed_shape(g, *y)
            && dtype_of(g, *y).is_some()
            && node.inputs.iter().skip(1).all(one);
        return ok.then_some(Kind::Quant);
    }
    if let NodeKind::Op(Op::Quant(QuantOp::QLinearAdd(_))) = &node.kind {
        let (Some(Some(a)), Some(Some(b)), [Some(y)]) =
            (node.inputs.first(), node.inputs.get(3), node.outputs.as_slice())
        else {
            return None;
        };
        let s = fixed_shape(g, *a).filter(|s| s.len() == 4)?;
        let ok = fixed_shape(g, *b).as_ref() == Some(&s) && fixed_shape(g, *y).as_ref() == Some(&s);
        return ok.then_some(Kind::QAdd);
    }
    if let NodeKind::Op(Op::Quant(QuantOp::QLinearConv(q))) = &node.kind {
        let (Some(Some(x)), Some(Some(w)), [Some(y)]) =
            (node.inputs.first(), node.inputs.get(3), node.outputs.as_slice())
        else {
            return None;
        };
        let already = matches!(&node.plan, Some(Plan::QConv(p)) if p.channels_last);
        let one = |slot: usize| {
            node.inputs
                .get(slot)
                .copied()
                .flatten()
                .is_none_or(|v| fixed_shape(g, v).is_some_and(|s| s.iter().product::<usize>() == 1))
        };
        let int8 = |v: ValueId| matches!(dtype_of(g, v), Some(DType::U8 | DType::I8));
        let (Some(xs), Some(ws)) = (fixed_shape(g, *x), index.tensor(g, *w).map(|t| t.shape().to_vec())) else {
            return None;
        };
        let ok = !already
            && int8(*x)
            && int8(*y)
            && xs.len() == 4
            && ws.len() == 4
            && matches!((xs.as_slice(), ws.as_slice()), ([_, c, _, _], [m, cg, _, _])
                if kiln_ops::fast::qconv_channels_last_kind(q.conv.group.max(1), [*c, *m, *cg]).is_some())
            && fixed_shape(g, *y).is_some_and(|s| s.len() == 4)
            && [1, 2, 6, 7].into_iter().all(one);
        return ok.then_some(Kind::QConv);
    }
    if let NodeKind::Op(Op::Nn(NnOp::Resize(r))) = &node.kind {
        let (Some(Some(x)), [Some(y)]) = (node.inputs.first(), node.outputs.as_slice()) else {
            return None;
        };
        // 8-bit values too (QOperator models resize the u8 tensors): the fast path resizes
        // W before H in either layout, so the same sums round to the same bytes.
        let rank4_8bit = |v: ValueId| {
            matches!(dtype_of(g, v), Some(DType::U8 | DType::I8)) && fixed_shape(g, v).is_some_and(|s| s.len() == 4)
        };
        let values = (rank4_f32(*x) && rank4_f32(*y)) || (rank4_8bit(*x) && rank4_8bit(*y));
        let ok = values && resize_target(g, index, node, r).is_some();
        return ok.then_some(Kind::Resize);
    }
    if let NodeKind::Op(Op::Elementwise(ElementwiseOp::PRelu(_))) = &node.kind {
        let ([Some(x), Some(slope)], [Some(y)]) = (node.inputs.as_slice(), node.outputs.as_slice()) else {
            return None;
        };
        let ok = rank4_f32(*x)
            && fixed_shape(g, *x) == fixed_shape(g, *y)
            && prelu_slope_nhwc(g, index, *x, *slope).is_some();
        return ok.then_some(Kind::PRelu);
    }
    if let NodeKind::Op(Op::Movement(MovementOp::Concat(c))) = &node.kind {
        let y = node.outputs.first().copied().flatten()?;
        let rank4 = |v: &Option<ValueId>| {
            v.is_some_and(|v| dtype_of(g, v) == Some(DType::F32) && fixed_shape(g, v).is_some_and(|s| s.len() == 4))
        };
        let ok = (c.axis == 1 || c.axis == -3)
            && node.outputs.len() == 1
            && !node.inputs.is_empty()
            && node.inputs.iter().all(rank4)
            && rank4(&Some(y));
        return ok.then_some(Kind::Concat);
    }
    if let NodeKind::Op(Op::Nn(NnOp::ChannelAffine(a))) = &node.kind {
        let x = node.inputs.first().copied().flatten()?;
        let ok = !a.channels_last && node.outputs.len() == 1 && fixed_shape(g, x).is_some_and(|s| s.len() == 4);
        return ok.then_some(Kind::Affine);
    }
    if let Some((op, a, b)) = binary(node) {
        use kiln_ops::elementwise::BinaryOp::{Add, Div, Mul, Sub};
        let ys = node
            .outputs
            .first()
            .copied()
            .flatten()
            .and_then(|y| fixed_shape(g, y))?;
        let fits = |v: ValueId| {
            let Some(s) = fixed_shape(g, v) else { return false };
            let n: usize = s.iter().product();
            dtype_of(g, v) == Some(DType::F32)
                && (n == 1
                    || s == ys
                    || (s.len() == 4
                        && s.iter().zip(&ys).all(|(&d, &y)| d == 1 || d == y)
                        && s.get(2..) == Some(&[1, 1][..])))
        };
        let ok = matches!(op, Add | Sub | Mul | Div) && ys.len() == 4 && node.outputs.len() == 1 && fits(a) && fits(b);
        return ok.then_some(Kind::Binary);
    }
    if let NodeKind::Op(Op::Nn(NnOp::Pool(pool))) = &node.kind {
        let (Some(Some(x)), Some(Some(y))) = (node.inputs.first(), node.outputs.first()) else {
            return None;
        };
        let indices_unread = match node.outputs.get(1) {
            None | Some(None) => true,
            Some(Some(i)) => index.readers(*i).is_empty() && !index.is_output(*i),
        };
        let ok = matches!(pool.kind, PoolKind::Max { .. } | PoolKind::Average { .. })
            && !node.pool_plan().channels_last
            && pool.kernel_shape.len() == 2
            && indices_unread
            && node.outputs.len() <= 2
            && match dtype_of(g, *x) {
                Some(DType::F32) => true,
                // 8-bit values (a QOperator model's MaxPool between QLinearConvs) have a
                // channels-last kernel for the max only.
                Some(DType::U8 | DType::I8) => matches!(pool.kind, PoolKind::Max { .. }),
                _ => false,
            }
            && fixed_shape(g, *x).is_some_and(|s| s.len() == 4)
            && fixed_shape(g, *y).is_some_and(|s| s.len() == 4);
        return ok.then_some(Kind::MaxPool);
    }
    if let NodeKind::Op(Op::Nn(NnOp::GlobalPool(pool))) = &node.kind {
        let (Some(Some(x)), Some(Some(y))) = (node.inputs.first(), node.outputs.first()) else {
            return None;
        };
        let ok = matches!(pool.kind, GlobalPoolKind::Average | GlobalPoolKind::Max)
            && !node.pool_plan().channels_last
            && node.outputs.len() == 1
            && dtype_of(g, *x) == Some(DType::F32)
            && fixed_shape(g, *x).is_some_and(|s| s.len() == 4)
            && fixed_shape(g, *y).is_some_and(|s| s.len() == 4);
        return ok.then_some(Kind::GlobalPool);
    }
    let NodeKind::Op(Op::Nn(NnOp::Conv(conv))) = &node.kind else {
        return None;
    };
    let plan = node.conv_plan();
    if plan.channels_last || plan.winograd.is_some() || plan.packed.is_some() || node.outputs.len() != 1 {
        return None;
    }
    let (Some(Some(x)), Some(Some(w)), Some(Some(y))) = (node.inputs.first(), node.inputs.get(1), node.outputs.first())
    else {
        return None;
    };
    let f32s = [*x, *w, *y]
        .into_iter()
        .chain(node.inputs.iter().skip(2).flatten().copied())
        .all(|v| dtype_of(g, v) == Some(DType::F32));
    let (Some(xs), Some(ws), Some(ys)) = (fixed_shape(g, *x), fixed_shape(g, *w), fixed_shape(g, *y)) else {
        return None;
    };
    if !f32s || index.tensor(g, *w).is_none() || xs.len() != 4 || ws.len() != 4 || ys.len() != 4 {
        return None;
    }
    let (c, m, group) = (xs[1], ws[0], conv.group.max(1));
    if group == 1 && ws[1] == c {
        Some(Kind::Dense)
    } else if group == c && m == c && ws[1] == 1 && c > 1 {
        Some(Kind::Depthwise)
    } else if group > 1
        && ws[1] * group == c
        && m.is_multiple_of(group)
        && kiln_kernels::grouped::lanes(ws[1], m / group).is_some()
        && node.inputs.get(3).is_none_or(Option::is_none)
    {
        Some(Kind::Grouped)
    } else {
        None
    }
}

/// Where a channels-last Resize takes its per-axis target from.
enum Target {
    /// Input `slot` (scales or sizes) becomes this constant, already in `[N, H, W, C]` order.
    Input(usize, Tensor),
    /// Upsample's `scales` attribute, permuted in place.
    Attribute,
}

/// `[v0, v1, v2, v3]` (NCHW order) as `[v0, v2, v3, v1]` (NHWC order).
fn nhwc<T: Copy>(v: &[T]) -> Vec<T> {
    match v {
        [n, c, h, w] => vec![*n, *h, *w, *c],
        _ => v.to_vec(),
    }
}

/// How a Resize's target would read channels-last, when it can: constant scales or sizes of
/// all four axes (or Upsample's attribute), no `axes`, no roi, no crop-and-resize.
fn resize_target(g: &Graph, index: &Index, node: &Node, r: &Resize) -> Option<Target> {
    if !r.axes.is_empty() || r.coord == CoordMode::TfCropAndResize {
        return None;
    }
    let input = |slot: Option<usize>| slot.and_then(|s| node.inputs.get(s).copied().flatten().map(|v| (s, v)));
    let konst = |slot: Option<usize>| -> Option<Option<(usize, Tensor)>> {
        match input(slot) {
            None => Some(None),
            Some((s, v)) => {
                let t = index.tensor(g, v)?;
                Some((!t.is_empty()).then(|| (s, t.clone())))
            }
        }
    };
    if konst(r.roi_input)?.is_some() {
        return None;
    }
    match (konst(r.scales_input)?, konst(r.sizes_input)?) {
        (Some((slot, t)), None) | (None, Some((slot, t))) if t.len() == 4 && t.rank() == 1 => {
            let permuted = match t.dtype() {
                DType::F32 => Tensor::from_vec(vec![4], nhwc(t.as_slice::<f32>().ok()?)).ok()?,
                DType::I64 => Tensor::from_vec(vec![4], nhwc(t.as_slice::<i64>().ok()?)).ok()?,
                _ => return None,
            };
            Some(Target::Input(slot, permuted))
        }
        (None, None) if r.scales_attr.len() == 4 => Some(Target::Attribute),
        _ => None,
    }
}

fn transpose_node(name: String, perm: [i64; 4], from: ValueId, to: ValueId) -> Node {
    Node {
        name,
        kind: NodeKind::Op(Op::Movement(MovementOp::Transpose(Transpose {
            perm: Some(perm.to_vec()),
        }))),
        inputs: vec![Some(from)],
        outputs: vec![Some(to)],
        plan: None,
    }
}

/// Adds the channels-last twin of `v` (shape `[n, c, h, w]`) as a new value.
fn twin(g: &mut Graph, v: ValueId) -> Option<ValueId> {
    let s = fixed_shape(g, v)?;
    let &[n, c, h, w] = s.as_slice() else { return None };
    let dtype = dtype_of(g, v).unwrap_or(DType::F32);
    let name = fresh_name(g, &format!("{}_nhwc", g.value_name(v)));
    Some(g.add_value(name, ValueType::Tensor(TensorType::fixed(dtype, &[n, h, w, c]))))
}

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let kinds: Vec<Option<Kind>> = g.nodes.iter().map(|n| kind(g, &index, n)).collect();
    if !kinds
        .iter()
        .any(|k| matches!(k, Some(Kind::Dense | Kind::Depthwise | Kind::Grouped | Kind::QConv)))
    {
        return Ok(0);
    }
    // A Resize that grows its input converts only when a reader needs the channels-last
    // result: else the transpose back would be of the larger tensor (a segmentation head's
    // final upsampling), where the one it saves was of the smaller. Per-element readers
    // (activations, quantize and dequantize, PRelu, affines) need it only if a reader of
    // theirs does, looked up a few levels deep.
    fn needs_twin(g: &Graph, index: &Index, kinds: &[Option<Kind>], y: ValueId, depth: usize) -> bool {
        index.readers(y).iter().any(|&r| match kinds.get(r).copied().flatten() {
            None => false,
            Some(Kind::Unary | Kind::Quant | Kind::PRelu | Kind::Affine) => {
                depth > 0
                    && g.nodes
                        .get(r)
                        .and_then(|n| n.outputs.first().copied().flatten())
                        .is_some_and(|v| needs_twin(g, index, kinds, v, depth - 1))
            }
            Some(_) => true,
        })
    }
    let resize_ok: Vec<bool> = g
        .nodes
        .iter()
        .zip(&kinds)
        .map(|(n, k)| {
            k != &Some(Kind::Resize)
                || n.outputs
                    .first()
                    .copied()
                    .flatten()
                    .is_some_and(|y| needs_twin(g, &index, &kinds, y, 4))
        })
        .collect();
    let old = std::mem::take(&mut g.nodes);
    let mut nodes = Vec::with_capacity(old.len() + 2);
    // Channels-first value → its channels-last twin.
    let mut last: HashMap<ValueId, ValueId> = HashMap::new();
    let mut converted = 0;
    for ((mut node, k), resize_ok) in old.into_iter().zip(kinds).zip(resize_ok) {
        // A pool converts only when its input is already channels-last, an elementwise node
        // when one of its inputs is.
        let twin_in = |slot: usize| {
            node.inputs
                .get(slot)
                .copied()
                .flatten()
                .is_some_and(|x| last.contains_key(&x))
        };
        let reads_twin = twin_in(0);
        let Some(y) = node.outputs.first().copied().flatten().filter(|_| {
            matches!(k, Some(Kind::Dense | Kind::Depthwise | Kind::Grouped | Kind::QConv))
                || (matches!(k, Some(Kind::MaxPool | Kind::GlobalPool | Kind::Affine)) && reads_twin)
                || (k == Some(Kind::Binary) && (twin_in(0) || twin_in(1)))
                || (k == Some(Kind::QAdd) && (twin_in(0) || twin_in(3)))
                || (matches!(k, Some(Kind::Unary | Kind::PRelu | Kind::Quant)) && reads_twin)
                || (k == Some(Kind::Resize) && reads_twin && resize_ok)
                || (k == Some(Kind::Concat) && (0..node.inputs.len()).any(twin_in))
        }) else {
            nodes.push(node);
            continue;
        };
        let Some(yt) = twin(g, y) else {
            nodes.push(node);
            continue;
        };
        // A dense convolution of a few-channel value no channels-last producer provides (an
        // image) reads it as it is: see `Conv::x_channels_first`.
        let input_shape = |slot: usize| node.inputs.get(slot).copied().flatten().and_then(|v| fixed_shape(g, v));
        let gather_x = k == Some(Kind::Dense)
            && !reads_twin
            && input_shape(0).is_some_and(|xs| xs.get(1).is_some_and(|&c| c <= GATHER_MAX_CHANNELS))
            && input_shape(1).is_some_and(|ws| ws.iter().skip(1).product::<usize>() <= GATHER_MAX_DEPTH);
        let slots: Vec<usize> = match k {
            Some(Kind::Binary) => vec![0, 1],
            Some(Kind::QAdd) => vec![0, 3],
            Some(Kind::Unary | Kind::Resize | Kind::PRelu | Kind::Quant | Kind::QConv) => vec![0],
            Some(Kind::Concat) => (0..node.inputs.len()).collect(),
            _ => vec![0, 3],
        };
        for slot in slots {
            let Some(Some(v)) = node.inputs.get(slot).copied() else {
                continue;
            };
            if slot == 0 && gather_x {
                continue;
            }
            // One element broadcasts the same way in either layout.
            if k == Some(Kind::Binary) && fixed_shape(g, v).is_none_or(|s| s.len() != 4) {
                continue;
            }
            let vt = match last.get(&v) {
                Some(&t) => t,
                None => {
                    let Some(t) = twin(g, v) else { continue };
                    let name = fresh_name(g, &format!("{}{TO_NHWC}", g.value_name(v)));
                    nodes.push(transpose_node(name, [0, 2, 3, 1], v, t));
                    last.insert(v, t);
                    t
                }
            };
            if let Some(i) = node.inputs.get_mut(slot) {
                *i = Some(vt);
            }
        }
        if k == Some(Kind::PRelu)
            && let Some(Some(slope)) = node.inputs.get(1).copied()
            && let Some(x) = node.inputs.first().copied().flatten()
        {
            // The slope was checked by `kind` against the channels-first X, whose twin now
            // stands in slot 0: look the channel count up on the original value.
            let original = last.iter().find(|(_, t)| **t == x).map_or(x, |(o, _)| *o);
            if let Some(t) = prelu_slope_nhwc(g, &index, original, slope) {
                let v = add_constant(g, &format!("{}_nhwc_slope", node.name), t);
                if let Some(i) = node.inputs.get_mut(1) {
                    *i = Some(v);
                }
            }
        }
        if k == Some(Kind::Resize) {
            // Scales or sizes in [N, H, W, C] order: a new constant, or Upsample's attribute.
            let target = match &node.kind {
                NodeKind::Op(Op::Nn(NnOp::Resize(r))) => resize_target(g, &index, &node, r),
                _ => None,
            };
            match target {
                Some(Target::Input(slot, t)) => {
                    let v = add_constant(g, &format!("{}_nhwc_target", node.name), t);
                    if let Some(i) = node.inputs.get_mut(slot) {
                        *i = Some(v);
                    }
                }
                Some(Target::Attribute) => {
                    if let NodeKind::Op(Op::Nn(NnOp::Resize(r))) = &mut node.kind {
                        r.scales_attr = nhwc(&r.scales_attr);
                    }
                }
                None => {}
            }
        }
        match &mut node.kind {
            NodeKind::Op(Op::Nn(NnOp::Conv(_))) => {
                if let Some(p) = node.plan_mut().and_then(Plan::conv_mut) {
                    p.channels_last = true;
                    p.x_channels_first = gather_x;
                }
            }
            NodeKind::Op(Op::Nn(NnOp::Pool(_) | NnOp::GlobalPool(_))) => {
                if let Some(p) = node.plan_mut().and_then(Plan::pool_mut) {
                    p.channels_last = true;
                }
            }
            NodeKind::Op(Op::Quant(QuantOp::QLinearConv(_))) => {
                if let Some(p) = node.plan_mut().and_then(Plan::qconv_mut) {
                    p.channels_last = true;
                }
            }
            NodeKind::Op(Op::Nn(NnOp::ChannelAffine(a))) => a.channels_last = true,
            NodeKind::Op(Op::Movement(MovementOp::Concat(c))) => c.axis = 3,
            _ => {}
        }
        node.outputs = vec![Some(yt)];
        let back = format!("{}{TO_NCHW}", node.name);
        nodes.push(node);
        nodes.push(transpose_node(back, [0, 3, 1, 2], yt, y));
        last.insert(y, yt);
        converted += 1;
    }
    g.nodes = nodes;
    Ok(converted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::fast::ConvPlan;
    use kiln_ops::nn::Activation;

    /// x [1,8,9,9] → pointwise 8→16 (Relu) → depthwise 3x3 stride 2 → pointwise 16→8 (+x
    /// pooled: a residual from outside the chain) → y; the depthwise output is also a graph
    /// output, so one transpose back stays.
    fn block() -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 9, 9]);
        let r = b.input("r", &[1, 8, 5, 5]);
        let w1 = b.constant("w1", noise(&[16, 8, 1, 1], 1));
        let b1 = b.constant("b1", noise(&[16], 2));
        let w2 = b.constant("w2", noise(&[16, 1, 3, 3], 3));
        let b2 = b.constant("b2", noise(&[16], 4));
        let w3 = b.constant("w3", noise(&[8, 16, 1, 1], 5));
        let h = b.node_act(
            conv2d(1, 0, 1),
            Some(Activation::Relu),
            &[Some(x), Some(w1), Some(b1)],
            &[&[1, 16, 9, 9]],
        )[0];
        let d = b.node_act(
            conv2d(16, 1, 2),
            None,
            &[Some(h), Some(w2), Some(b2)],
            &[&[1, 16, 5, 5]],
        )[0];
        let y = b.node_act(
            conv2d(1, 0, 1),
            None,
            &[Some(d), Some(w3), None, Some(r)],
            &[&[1, 8, 5, 5]],
        )[0];
        b.finish(&[y, d])
    }

    fn ops(g: &Graph) -> Vec<String> {
        g.nodes
            .iter()
            .map(|n| match &n.kind {
                NodeKind::Op(Op::Nn(NnOp::Conv(_))) => {
                    format!("Conv{}", if n.conv_plan().channels_last { "/nhwc" } else { "" })
                }
                NodeKind::Op(op) => op.name().to_string(),
                NodeKind::Control(_) => "control".into(),
            })
            .collect()
    }

    /// `g` after the layout pass and the dce that follows it (verified), and the count of
    /// nodes the pass converted.
    fn laid_out(g: &Graph) -> (usize, Graph) {
        let mut h = g.clone();
        let n = run(&mut h).unwrap();
        crate::passes::dce::run(&mut h).unwrap();
        h.verify().unwrap();
        (n, h)
    }

    /// `graph()` compiled at level 2 and at level 0.
    fn at_levels_2_and_0(graph: impl Fn() -> Graph) -> (crate::Compiled, crate::Compiled) {
        let level = |opt_level| crate::CompileOptions {
            opt_level,
            ..crate::CompileOptions::default()
        };
        (
            crate::compile(graph(), &level(2)).unwrap(),
            crate::compile(graph(), &level(0)).unwrap(),
        )
    }

    /// What `f` says of each step of `c`'s main program that it says something of.
    /// `f` of each op step's op and Conv plan (the default for other steps).
    fn steps<T>(c: &crate::Compiled, f: impl Fn(&Op, ConvPlan) -> Option<T>) -> Vec<T> {
        c.program
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                kiln_runtime::StepKind::Op(op) => {
                    let plan = match &s.plan {
                        Some(Plan::Conv(p)) => *p,
                        _ => ConvPlan::default(),
                    };
                    f(op, plan)
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_depthwise_chain_runs_channels_last_with_one_transpose_each_way() {
        let g = block();
        let (n, h) = laid_out(&g);
        assert_eq!(n, 3);
        assert_eq!(
            ops(&h),
            [
                "Transpose",
                "Conv/nhwc",
                "Conv/nhwc",
                "Transpose",
                "Transpose",
                "Conv/nhwc",
                "Transpose"
            ]
        );
        // `kiln profile` tells the inserted transposes by name; the model had none.
        assert!(
            h.nodes
                .iter()
                .all(|n| (n.kind.name() == "Transpose") == is_layout_transpose(&n.name))
        );
        assert!(g.nodes.iter().all(|n| !is_layout_transpose(&n.name)));
        let inputs = vec![noise(&[1, 8, 9, 9], 7), noise(&[1, 8, 5, 5], 8)];
        let (p, q) = (run_graph(&g, inputs.clone()), run_graph(&h, inputs));
        for (a, b) in p.iter().zip(&q) {
            assert_close(b, a, 1e-5);
        }
    }

    #[test]
    fn activations_and_resizes_between_convolutions_stay_channels_last() {
        // x → Conv 3x3 → HardSwish → Clip(0, 6) → Resize nearest 2x → Conv 1x1: no transpose
        // between the convolutions, the Resize's scales in [N, H, W, C] order.
        use kiln_ops::elementwise::{Clip, ElementwiseOp, UnaryOp};
        use kiln_ops::nn::resize::{Resize, ResizeMode};
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 6, 5]);
        let w1 = b.constant("w1", noise(&[8, 8, 3, 3], 1));
        let w2 = b.constant("w2", noise(&[4, 8, 1, 1], 2));
        let scales = b.constant(
            "scales",
            Tensor::from_vec(vec![4], vec![1.0f32, 1.0, 2.0, 3.0]).unwrap(),
        );
        let lo = b.constant("lo", Tensor::scalar(0.0f32));
        let hi = b.constant("hi", Tensor::scalar(0.5f32));
        let c = b.node_act(conv2d(1, 1, 1), None, &[Some(x), Some(w1)], &[&[1, 8, 6, 5]])[0];
        let hs = b.node(
            Op::Elementwise(ElementwiseOp::Unary(UnaryOp::HardSwish)),
            &[Some(c)],
            &[&[1, 8, 6, 5]],
        )[0];
        let cl = b.node(
            Op::Elementwise(ElementwiseOp::Clip(Clip { min: None, max: None })),
            &[Some(hs), Some(lo), Some(hi)],
            &[&[1, 8, 6, 5]],
        )[0];
        let resize = Op::Nn(NnOp::Resize(Resize {
            mode: ResizeMode::Nearest,
            ..Resize::default()
        }));
        let r = b.node(resize, &[Some(cl), None, Some(scales)], &[&[1, 8, 12, 15]])[0];
        let y = b.node_act(conv2d(1, 0, 1), None, &[Some(r), Some(w2)], &[&[1, 4, 12, 15]])[0];
        let g = b.finish(&[y]);
        let (n, h) = laid_out(&g);
        assert_eq!(n, 5);
        assert_eq!(
            ops(&h),
            [
                "Transpose",
                "Conv/nhwc",
                "HardSwish",
                "Clip",
                "Resize",
                "Conv/nhwc",
                "Transpose"
            ]
        );
        let inputs = vec![noise(&[1, 8, 6, 5], 3)];
        assert_close(&run_graph(&h, inputs.clone())[0], &run_graph(&g, inputs)[0], 1e-5);

        // A Resize whose result only a graph output reads stays channels-first: the transpose
        // back is then of its smaller input.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 6, 5]);
        let w1 = b.constant("w1", noise(&[8, 8, 3, 3], 1));
        let scales = b.constant(
            "scales",
            Tensor::from_vec(vec![4], vec![1.0f32, 1.0, 4.0, 4.0]).unwrap(),
        );
        let c = b.node_act(conv2d(1, 1, 1), None, &[Some(x), Some(w1)], &[&[1, 8, 6, 5]])[0];
        let resize = Op::Nn(NnOp::Resize(Resize::default()));
        let r = b.node(resize, &[Some(c), None, Some(scales)], &[&[1, 8, 24, 20]])[0];
        let g = b.finish(&[r]);
        let (_, h) = laid_out(&g);
        assert_eq!(ops(&h), ["Transpose", "Conv/nhwc", "Transpose", "Resize"]);
    }

    #[test]
    fn a_per_channel_prelu_between_convolutions_stays_channels_last() {
        // x → Conv 3x3 → PRelu (slope [8, 1, 1]) → Conv 1x1, and a PRelu whose slope varies
        // along the width (not per channel), which stays channels-first.
        use kiln_ops::elementwise::{ElementwiseOp, PRelu};
        let build = |slope: Tensor| {
            let mut b = Builder::new();
            let x = b.input("x", &[1, 8, 6, 5]);
            let w1 = b.constant("w1", noise(&[8, 8, 3, 3], 1));
            let w2 = b.constant("w2", noise(&[4, 8, 1, 1], 2));
            let s = b.constant("slope", slope);
            let c = b.node_act(conv2d(1, 1, 1), None, &[Some(x), Some(w1)], &[&[1, 8, 6, 5]])[0];
            let p = b.node(
                Op::Elementwise(ElementwiseOp::PRelu(PRelu)),
                &[Some(c), Some(s)],
                &[&[1, 8, 6, 5]],
            )[0];
            let y = b.node_act(conv2d(1, 0, 1), None, &[Some(p), Some(w2)], &[&[1, 4, 6, 5]])[0];
            b.finish(&[y])
        };
        let g = build(noise(&[8, 1, 1], 4));
        let (n, h) = laid_out(&g);
        assert_eq!(n, 3);
        assert_eq!(ops(&h), ["Transpose", "Conv/nhwc", "PRelu", "Conv/nhwc", "Transpose"]);
        let inputs = vec![noise(&[1, 8, 6, 5], 3)];
        assert_close(
            &run_graph(&h, inputs.clone())[0],
            &run_graph(&g, inputs.clone())[0],
            1e-5,
        );
        let g = build(noise(&[1, 5], 5));
        let (_, h) = laid_out(&g);
        assert_eq!(
            ops(&h),
            [
                "Transpose",
                "Conv/nhwc",
                "Transpose",
                "PRelu",
                "Transpose",
                "Conv/nhwc",
                "Transpose"
            ]
        );
        assert_close(&run_graph(&h, inputs.clone())[0], &run_graph(&g, inputs)[0], 1e-5);
    }

    /// x (u8 `[1, 8, 10, 10]`) → QLinearConv 3x3 → `middle` (of the convolution's output,
    /// giving 8 channels of `hw`) → QLinearConv 1x1.
    fn around_two_qconvs(middle: &dyn Fn(&mut Builder, ValueId) -> ValueId, hw: [usize; 2]) -> Graph {
        use kiln_ops::quant::{ConvAttrs, QLinearConv, QuantOp};
        let qconv = |pads: usize| {
            Op::Quant(QuantOp::QLinearConv(QLinearConv {
                conv: ConvAttrs {
                    auto_pad: kiln_ops::quant::AutoPad::NotSet,
                    dilations: vec![],
                    group: 1,
                    kernel_shape: None,
                    pads: vec![pads; 4],
                    strides: vec![],
                },
            }))
        };
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::U8, &[1, 8, 10, 10]);
        let (sx, zx) = (
            b.constant("sx", Tensor::scalar(0.02f32)),
            b.constant("zx", Tensor::scalar(120u8)),
        );
        let bytes = |shape: &[usize], seed: u64| {
            let v: Vec<i8> = noise(shape, seed)
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| (v * 60.0) as i8)
                .collect();
            Tensor::from_vec(shape.to_vec(), v).unwrap()
        };
        let (w1, w2) = (
            b.constant("w1", bytes(&[8, 8, 3, 3], 1)),
            b.constant("w2", bytes(&[6, 8, 1, 1], 2)),
        );
        let sw = b.constant("sw", Tensor::scalar(0.01f32));
        let zw = b.constant("zw", Tensor::scalar(0i8));
        let sy = b.constant("sy", Tensor::scalar(0.05f32));
        let c1 = b.node_typed(
            qconv(1),
            &[
                Some(x),
                Some(sx),
                Some(zx),
                Some(w1),
                Some(sw),
                Some(zw),
                Some(sy),
                Some(zx),
            ],
            &[(DType::U8, &[1, 8, 10, 10])],
        )[0];
        let p = middle(&mut b, c1);
        let y = b.node_typed(
            qconv(0),
            &[
                Some(p),
                Some(sy),
                Some(zx),
                Some(w2),
                Some(sw),
                Some(zw),
                Some(sx),
                Some(zx),
            ],
            &[(DType::U8, &[1, 6, hw[0], hw[1]])],
        )[0];
        b.finish(&[y])
    }

    /// `h`'s output bytes are `g`'s on one u8 input, and vary (the graph did something).
    fn same_bytes(g: &Graph, h: &Graph) {
        let bytes_in: Vec<u8> = (0..800u32).map(|i| (i * 37 % 251) as u8).collect();
        let input = vec![Tensor::from_vec(vec![1, 8, 10, 10], bytes_in).unwrap()];
        let want = run_graph(g, input.clone());
        let got = run_graph(h, input);
        assert_eq!(got[0].as_slice::<u8>().unwrap(), want[0].as_slice::<u8>().unwrap());
        let w = want[0].as_slice::<u8>().unwrap();
        assert!(w.iter().any(|&v| v != w[0]));
    }

    /// MaxPool 3x3, stride 2, padding 1.
    fn max_pool_3x3_s2() -> Op {
        Op::Nn(NnOp::Pool(kiln_ops::nn::Pool {
            kind: PoolKind::Max { storage_order: false },
            auto_pad: kiln_ops::nn::AutoPad::NotSet,
            ceil_mode: false,
            dilations: vec![],
            kernel_shape: vec![3, 3],
            pads: vec![1; 4],
            strides: vec![2, 2],
        }))
    }

    /// A QOperator model's u8 MaxPool between two QLinearConvs runs channels-last on the
    /// bytes, with no transpose around it, and gives the channels-first graph's bytes.
    #[test]
    fn an_8_bit_max_pool_between_quantized_convolutions_stays_channels_last() {
        let pool = |b: &mut Builder, c: ValueId| {
            let pool = max_pool_3x3_s2();
            b.node_typed(pool, &[Some(c)], &[(DType::U8, &[1, 8, 5, 5])])[0]
        };
        let g = around_two_qconvs(&pool, [5, 5]);
        let (_, h) = laid_out(&g);
        assert_eq!(
            ops(&h),
            ["Transpose", "QLinearConv", "MaxPool", "QLinearConv", "Transpose"]
        );
        let pooled = h.nodes.iter().find(|n| n.kind.name() == "MaxPool");
        assert!(pooled.is_some_and(|n| n.pool_plan().channels_last));
        same_bytes(&g, &h);
    }

    /// A u8 Resize between two QLinearConvs (a detector's FPN upsampling, a segmentation
    /// head's bilinear one) runs channels-last, its scales in `[N, H, W, C]` order, with the
    /// channels-first bytes.
    #[test]
    fn an_8_bit_resize_between_quantized_convolutions_stays_channels_last() {
        use kiln_ops::nn::resize::{Resize, ResizeMode};
        for mode in [ResizeMode::Nearest, ResizeMode::Linear] {
            let resize = |b: &mut Builder, c: ValueId| {
                let scales = b.constant(
                    "scales",
                    Tensor::from_vec(vec![4], vec![1.0f32, 1.0, 2.0, 1.5]).unwrap(),
                );
                let op = Op::Nn(NnOp::Resize(Resize {
                    mode,
                    ..Resize::default()
                }));
                b.node_typed(op, &[Some(c), None, Some(scales)], &[(DType::U8, &[1, 8, 20, 15])])[0]
            };
            let g = around_two_qconvs(&resize, [20, 15]);
            let (_, h) = laid_out(&g);
            assert_eq!(
                ops(&h),
                ["Transpose", "QLinearConv", "Resize", "QLinearConv", "Transpose"]
            );
            same_bytes(&g, &h);
        }
    }

    #[test]
    fn a_max_pool_after_a_convolution_follows_it_and_other_graphs_are_left_alone() {
        // x → Conv 3x3 (Relu) → MaxPool 3x3 s2 → Conv 1x1 → GlobalAveragePool.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 4, 12, 12]);
        let w1 = b.constant("w1", noise(&[8, 4, 3, 3], 1));
        let w2 = b.constant("w2", noise(&[6, 8, 1, 1], 2));
        let c = b.node_act(
            conv2d(1, 1, 1),
            Some(Activation::Relu),
            &[Some(x), Some(w1)],
            &[&[1, 8, 12, 12]],
        )[0];
        let pool = max_pool_3x3_s2();
        let p = b.node(pool, &[Some(c)], &[&[1, 8, 6, 6]])[0];
        let y = b.node_act(conv2d(1, 0, 1), None, &[Some(p), Some(w2)], &[&[1, 6, 6, 6]])[0];
        // A global average of the last convolution follows it too: the transpose back is of
        // the pooled [1, 1, 1, 6] value.
        let gap = Op::Nn(NnOp::GlobalPool(kiln_ops::nn::GlobalPool::new(GlobalPoolKind::Average)));
        let m = b.node(gap, &[Some(y)], &[&[1, 6, 1, 1]])[0];
        let g = b.finish(&[m]);
        let (n, h) = laid_out(&g);
        assert_eq!(n, 4);
        // The 4-channel X is read as it is (no transpose in).
        assert_eq!(
            ops(&h),
            ["Conv/nhwc", "MaxPool", "Conv/nhwc", "GlobalAveragePool", "Transpose"]
        );
        let NodeKind::Op(Op::Nn(NnOp::Conv(_))) = &h.nodes[0].kind else {
            panic!("not a Conv")
        };
        assert!(h.nodes[0].conv_plan().x_channels_first);
        let back = h.nodes.last().and_then(|n| n.inputs.first().copied().flatten());
        assert_eq!(back.and_then(|v| fixed_shape(&h, v)), Some(vec![1, 1, 1, 6]));
        let inputs = vec![noise(&[1, 4, 12, 12], 3)];
        assert_close(&run_graph(&h, inputs.clone())[0], &run_graph(&g, inputs)[0], 1e-5);

        // Weights that are not constant: nothing qualifies, nothing changes.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 9, 9]);
        let w = b.input("w", &[8, 8, 3, 3]);
        let y = b.node_act(conv2d(1, 1, 1), None, &[Some(x), Some(w)], &[&[1, 8, 9, 9]])[0];
        let mut g = b.finish(&[y]);
        assert_eq!(run(&mut g).unwrap(), 0);
        assert_eq!(ops(&g), ["Conv"]);
    }

    #[test]
    fn compiled_channels_last_programs_pack_their_weights_and_match_level_0() {
        let (fast, plain) = at_levels_2_and_0(block);
        // The two dense convolutions are packed as GEMM panels, the depthwise one as taps.
        let packed = steps(&fast, |op, plan| match op {
            Op::Nn(NnOp::Conv(_)) => Some(plan.channels_last && plan.packed.is_some()),
            _ => None,
        });
        assert_eq!(packed, [true, true, true]);
        assert_eq!(fast.prepacked, 3);
        let inputs = vec![
            ("x".to_string(), kiln_ops::Value::Tensor(noise(&[1, 8, 9, 9], 7))),
            ("r".to_string(), kiln_ops::Value::Tensor(noise(&[1, 8, 5, 5], 8))),
        ];
        let a = kiln_runtime::run(&fast.program, inputs.clone()).unwrap();
        let b = kiln_runtime::run(&plain.program, inputs).unwrap();
        assert_eq!(a.len(), 2);
        for ((_, p), (_, q)) in a.iter().zip(&b) {
            assert_close(p.as_tensor().unwrap(), q.as_tensor().unwrap(), 1e-5);
        }
    }

    #[test]
    fn a_channel_scale_and_a_scalar_add_follow_a_channels_last_convolution() {
        channel_scale_case(1);
        // A batch of images: the scale [2,8,1,1] varies along batch and channels.
        channel_scale_case(2);
    }

    /// x [batch,8,6,6] → Conv 3x3 (Relu) → × s [batch,8,1,1] (a squeeze-excitation scale) → + 0.5 →
    /// Conv 1x1 → × t [1,1,6,6] (varies along H and W: stays channels-first) → y.
    fn channel_scale_case(batch: usize) {
        use kiln_ops::elementwise::BinaryOp;
        let mut b = Builder::new();
        let x = b.input("x", &[batch, 8, 6, 6]);
        let s = b.input("s", &[batch, 8, 1, 1]);
        let t = b.input("t", &[1, 1, 6, 6]);
        let w1 = b.constant("w1", noise(&[8, 8, 3, 3], 1));
        let w2 = b.constant("w2", noise(&[4, 8, 1, 1], 2));
        let half = b.constant("half", noise(&[1], 3));
        let h = b.node_act(
            conv2d(1, 1, 1),
            Some(Activation::Relu),
            &[Some(x), Some(w1)],
            &[&[batch, 8, 6, 6]],
        )[0];
        let m = b.node(
            crate::passes::testutil::binary(BinaryOp::Mul),
            &[Some(h), Some(s)],
            &[&[batch, 8, 6, 6]],
        )[0];
        let a = b.node(
            crate::passes::testutil::binary(BinaryOp::Add),
            &[Some(half), Some(m)],
            &[&[batch, 8, 6, 6]],
        )[0];
        let c = b.node_act(conv2d(1, 0, 1), None, &[Some(a), Some(w2)], &[&[batch, 4, 6, 6]])[0];
        let y = b.node(
            crate::passes::testutil::binary(BinaryOp::Mul),
            &[Some(c), Some(t)],
            &[&[batch, 4, 6, 6]],
        )[0];
        let g = b.finish(&[y]);
        let (n, h) = laid_out(&g);
        assert_eq!(n, 4);
        assert_eq!(
            ops(&h),
            [
                "Transpose",
                "Conv/nhwc",
                "Transpose",
                "Mul",
                "Add",
                "Conv/nhwc",
                "Transpose",
                "Mul"
            ]
        );
        // The scale's transpose moves only unit dims: [batch, 8, 1, 1] → [batch, 1, 1, 8].
        let scale = h.nodes[2].outputs[0].and_then(|v| fixed_shape(&h, v));
        assert_eq!(scale, Some(vec![batch, 1, 1, 8]));
        let inputs = vec![
            noise(&[batch, 8, 6, 6], 4),
            noise(&[batch, 8, 1, 1], 5),
            noise(&[1, 1, 6, 6], 6),
        ];
        assert_close(&run_graph(&h, inputs.clone())[0], &run_graph(&g, inputs)[0], 1e-5);
    }

    /// DenseNet's pattern: x → [Conv 3x3 (8), Conv 1x1 (4)] → Concat → BatchNorm (constant
    /// parameters, no producer to fold into) → Relu → Conv 1x1 → y.
    #[test]
    fn a_dense_block_runs_channels_last_through_its_concat_and_batchnorm() {
        use kiln_ops::elementwise::{ElementwiseOp, UnaryOp};
        use kiln_ops::reduce::{BatchNorm, ReduceOp};
        let graph = || {
            let mut b = Builder::new();
            let x = b.input("x", &[1, 4, 6, 6]);
            let w1 = b.constant("w1", noise(&[8, 4, 3, 3], 1));
            let w2 = b.constant("w2", noise(&[4, 4, 1, 1], 2));
            let w3 = b.constant("w3", noise(&[6, 12, 1, 1], 3));
            let c1 = b.node_act(conv2d(1, 1, 1), None, &[Some(x), Some(w1)], &[&[1, 8, 6, 6]])[0];
            let c2 = b.node_act(conv2d(1, 0, 1), None, &[Some(x), Some(w2)], &[&[1, 4, 6, 6]])[0];
            let concat = Op::Movement(MovementOp::Concat(kiln_ops::movement::Concat { axis: 1 }));
            let cat = b.node(concat, &[Some(c1), Some(c2)], &[&[1, 12, 6, 6]])[0];
            let params: Vec<_> = (0..4)
                .map(|i| {
                    let t = noise(&[12], 10 + i);
                    // A positive variance.
                    let t = if i == 3 {
                        f32s(
                            &[12],
                            &t.as_slice::<f32>()
                                .unwrap()
                                .iter()
                                .map(|v| v.abs() + 0.5)
                                .collect::<Vec<_>>(),
                        )
                    } else {
                        t
                    };
                    Some(b.constant(&format!("bn{i}"), t))
                })
                .collect();
            let bn = Op::Reduce(ReduceOp::BatchNormalization(BatchNorm {
                epsilon: 1e-5,
                momentum: 0.9,
                training_mode: false,
                saved_outputs: false,
            }));
            let mut ins = vec![Some(cat)];
            ins.extend(params);
            let n = b.node(bn, &ins, &[&[1, 12, 6, 6]])[0];
            let relu = Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu));
            let r = b.node(relu, &[Some(n)], &[&[1, 12, 6, 6]])[0];
            let y = b.node_act(conv2d(1, 0, 1), None, &[Some(r), Some(w3)], &[&[1, 6, 6, 6]])[0];
            b.finish(&[y])
        };
        let (fast, plain) = at_levels_2_and_0(graph);
        let kinds = steps(&fast, |op, plan| {
            Some(match op {
                Op::Nn(NnOp::Conv(_)) => format!("Conv last={}", plan.channels_last),
                Op::Nn(NnOp::ChannelAffine(a)) => {
                    format!("ChannelAffine last={} act={:?}", a.channels_last, a.activation)
                }
                Op::Movement(MovementOp::Concat(c)) => format!("Concat axis={}", c.axis),
                op => op.name().to_string(),
            })
        });
        assert_eq!(
            kinds,
            // The 4-channel X is read as it is (no transpose in).
            [
                "Conv last=true",
                "Conv last=true",
                "Concat axis=3",
                "ChannelAffine last=true act=Some(Relu)",
                "Conv last=true",
                "Transpose"
            ]
        );
        let inputs = vec![("x".to_string(), kiln_ops::Value::Tensor(noise(&[1, 4, 6, 6], 7)))];
        let a = kiln_runtime::run(&fast.program, inputs.clone()).unwrap();
        let b = kiln_runtime::run(&plain.program, inputs).unwrap();
        assert_close(a[0].1.as_tensor().unwrap(), b[0].1.as_tensor().unwrap(), 1e-5);
    }

    /// x [1,32,10,10] → 1x1 32→32 (Relu) → 3x3 in 8 groups of 4 (Relu) → 1x1 32→16 → a 3x3
    /// in 2 groups of 8 inputs to 3 outputs (broadcast, a masked block a group) → y.
    fn grouped_block() -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 32, 10, 10]);
        let w1 = b.constant("w1", noise(&[32, 32, 1, 1], 1));
        let w2 = b.constant("w2", noise(&[32, 4, 3, 3], 2));
        let b2 = b.constant("b2", noise(&[32], 3));
        let w3 = b.constant("w3", noise(&[16, 32, 1, 1], 4));
        let w4 = b.constant("w4", noise(&[6, 8, 3, 3], 5));
        let h = b.node_act(
            conv2d(1, 0, 1),
            Some(Activation::Relu),
            &[Some(x), Some(w1)],
            &[&[1, 32, 10, 10]],
        )[0];
        let d = b.node_act(
            conv2d(8, 1, 1),
            Some(Activation::Relu),
            &[Some(h), Some(w2), Some(b2)],
            &[&[1, 32, 10, 10]],
        )[0];
        let e = b.node_act(conv2d(1, 0, 1), None, &[Some(d), Some(w3)], &[&[1, 16, 10, 10]])[0];
        let y = b.node_act(conv2d(2, 1, 1), None, &[Some(e), Some(w4)], &[&[1, 6, 10, 10]])[0];
        b.finish(&[y])
    }

    #[test]
    fn grouped_convolutions_run_channels_last_packed_as_taps() {
        let (n, h) = laid_out(&grouped_block());
        assert_eq!(n, 4);
        assert_eq!(
            ops(&h),
            [
                "Transpose",
                "Conv/nhwc",
                "Conv/nhwc",
                "Conv/nhwc",
                "Conv/nhwc",
                "Transpose"
            ]
        );
        let (fast, plain) = at_levels_2_and_0(grouped_block);
        let packed = steps(&fast, |op, plan| match op {
            Op::Nn(NnOp::Conv(c)) => Some(plan.packed.map(|p| [c.group, p.c, p.m])),
            _ => None,
        });
        assert_eq!(
            packed,
            [Some([1, 32, 32]), Some([8, 4, 32]), Some([1, 32, 16]), Some([2, 8, 6])]
        );
        let inputs = vec![("x".to_string(), kiln_ops::Value::Tensor(noise(&[1, 32, 10, 10], 7)))];
        let a = kiln_runtime::run(&fast.program, inputs.clone()).unwrap();
        let b = kiln_runtime::run(&plain.program, inputs).unwrap();
        assert_close(a[0].1.as_tensor().unwrap(), b[0].1.as_tensor().unwrap(), 1e-5);
    }
}
