//! QDQ convolutions to integer ones. A 2-D (or 1-D) Conv of `DequantizeLinear(x_q)` (one constant
//! scale and zero point) by `DequantizeLinear(W_q)` (8-bit constant weights, one scale and
//! zero point or one per output channel), whose result only a `QuantizeLinear` (one scale and
//! zero point) reads, directly or through a Relu or a Clip of constant bounds, becomes
//!
//! ```text
//! QLinearConv(x_q, sx, zx, W_q, sw, zw, sy, zy, bias_i32)   [plan: clamp to the activation]
//! ```
//!
//! so the activations stay 8-bit between integer convolutions and the products run on the
//! integer GEMM. The bias (f32, or the DequantizeLinear of an int32 constant as ONNX Runtime's
//! quantizer writes it) becomes `round(bias / (sx * sw[m]))` in int32: the quantizer's own
//! values when its bias scale is that product. The activation folds into the requantization
//! exactly: quantizing is monotonic, so `Q(relu(v)) = max(Q(v), Q(0))` and
//! `Q(clip(v, a, b)) = clamp(Q(v), Q(a), Q(b))`. What differs from the float emulation is the
//! rounding: one of the exact sum instead of one per dequantized product, which the int8
//! accuracy scripts judge (SQNR against the fp32 model).
//!
//! Runs before folding, which would turn `DequantizeLinear(W_q)` into f32 weights; the
//! dequantize nodes stay for any other reader (dead-code elimination drops them otherwise).

use super::edit::{Index, add_constant, dequantize_of, dtype_of, fixed_shape};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::{ElementwiseOp, UnaryOp};
use kiln_ops::fast::{Plan, QConvPlan};
use kiln_ops::nn::NnOp;
use kiln_ops::quant::{AutoPad, ConvAttrs, QLinearConv, QuantOp, QuantizeLinear};
use kiln_tensor::{DType, Tensor};
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let found: Vec<(usize, Found)> = g
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| find(g, &index, n).map(|f| (i, f)))
        .collect();
    if found.is_empty() {
        return Ok(0);
    }
    // The Conv's node becomes the QLinearConv; its activation and QuantizeLinear go.
    let mut replacement: HashMap<usize, Node> = HashMap::new();
    let mut dead = vec![false; g.nodes.len()];
    for (i, f) in found {
        let removed = f.removed.clone();
        let Some(node) = rewrite(g, i, f) else { continue };
        replacement.insert(i, node);
        for r in removed {
            if let Some(d) = dead.get_mut(r) {
                *d = true;
            }
        }
    }
    let count = replacement.len();
    let old = std::mem::take(&mut g.nodes);
    for (i, node) in old.into_iter().enumerate() {
        if dead.get(i).copied().unwrap_or(false) {
            continue;
        }
        match replacement.remove(&i) {
            Some(new) => g.nodes.push(new),
            None => g.nodes.push(node),
        }
    }
    Ok(count)
}

/// A matched convolution.
struct Found {
    attrs: ConvAttrs,
    xq: ValueId,
    sx: ValueId,
    zx: Option<ValueId>,
    wq: ValueId,
    sw: ValueId,
    zw: Option<ValueId>,
    sy: ValueId,
    zy: Option<ValueId>,
    /// The bias in int32, one per output channel.
    bias: Option<Vec<i32>>,
    /// The quantized output bounds of a folded activation, in the output's integers.
    clamp: Option<(i32, i32)>,
    /// The QuantizeLinear's output, which the QLinearConv now writes.
    yq: ValueId,
    /// The activation and QuantizeLinear nodes.
    removed: Vec<usize>,
}

/// One f32 value of a constant.
fn scalar_f32(g: &Graph, index: &Index, v: ValueId) -> Option<f32> {
    let t = index.tensor(g, v)?;
    (t.len() == 1)
        .then(|| t.as_slice::<f32>().ok()?.first().copied())
        .flatten()
}

/// One integer of a constant zero point of type `dt` (absent: 0).
fn zero_point(g: &Graph, index: &Index, v: Option<ValueId>, dt: DType) -> Option<i32> {
    let Some(v) = v else { return Some(0) };
    let t = index.tensor(g, v)?;
    if t.len() != 1 || t.dtype() != dt {
        return None;
    }
    t.to_f64_vec().first().map(|&z| z as i32)
}

fn find(g: &Graph, index: &Index, node: &Node) -> Option<Found> {
    let NodeKind::Op(Op::Nn(NnOp::Conv(conv))) = &node.kind else {
        return None;
    };
    if node.activation().is_some() || node.plan.is_some() || node.inputs.len() > 3 {
        return None;
    }
    let (Some(Some(x)), Some(Some(w)), [Some(y)]) = (node.inputs.first(), node.inputs.get(1), node.outputs.as_slice())
    else {
        return None;
    };
    // 2-D, or 1-D (`conv1d` gives the QLinearConv a unit height later).
    let rank = fixed_shape(g, *y).map(|s| s.len());
    if dtype_of(g, *y) != Some(DType::F32) || !matches!(rank, Some(3 | 4)) {
        return None;
    }
    // X: an 8-bit activation with one scale and zero point.
    let (dqx, xin) = dequantize_of(g, index, *x)?;
    let xq = xin.first().copied().flatten()?;
    let xdt = dtype_of(g, xq)?;
    if !matches!(xdt, DType::U8 | DType::I8) || dqx.output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let sx_v = xin.get(1).copied().flatten()?;
    let sx = scalar_f32(g, index, sx_v)?;
    let zx = xin.get(2).copied().flatten();
    zero_point(g, index, zx, xdt)?;
    // W: 8-bit constant weights `[m, c, kh, kw]`, per tensor or per output channel.
    let (dqw, win) = dequantize_of(g, index, *w)?;
    if dqw.output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let wq = win.first().copied().flatten()?;
    let wt = index.tensor(g, wq)?;
    let (Some(&m), true) = (wt.shape().first(), Some(wt.rank()) == rank) else {
        return None;
    };
    if !matches!(wt.dtype(), DType::U8 | DType::I8) {
        return None;
    }
    let sw_v = win.get(1).copied().flatten()?;
    let swt = index.tensor(g, sw_v)?;
    let sw = swt.as_slice::<f32>().ok()?.to_vec();
    if sw.len() != 1 && (sw.len() != m || swt.shape().len() != 1 || !(dqw.axis == 0 || dqw.axis == -(wt.rank() as i64)))
    {
        return None;
    }
    let zw = win.get(2).copied().flatten();
    if let Some(z) = zw {
        let t = index.tensor(g, z)?;
        if t.dtype() != wt.dtype() || t.len() != sw.len() {
            return None;
        }
    }
    // The bias, as f32 values.
    let bias_f32: Option<Vec<f32>> = match node.inputs.get(2).copied().flatten() {
        None => None,
        Some(b) => Some(bias_values(g, index, b, m)?),
    };
    // The readers: [Relu | Clip ->] QuantizeLinear, nothing else.
    let mut removed = Vec::new();
    let mut v = *y;
    let mut act: Option<(f32, f32)> = None;
    loop {
        let readers = index.readers(v);
        let (&[r], false) = (readers, index.is_output(v)) else {
            return None;
        };
        let rn = g.nodes.get(r)?;
        match &rn.kind {
            NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu))) if act.is_none() => {
                act = Some((0.0, f32::INFINITY));
            }
            NodeKind::Op(Op::Elementwise(ElementwiseOp::Clip(c))) if act.is_none() => {
                // Bounds as inputs (opset 11+) or attributes (before).
                let bound = |slot: usize, attr: Option<f32>, default: f32| match rn.inputs.get(slot).copied().flatten()
                {
                    None => Some(attr.unwrap_or(default)),
                    Some(b) => scalar_f32(g, index, b),
                };
                act = Some((bound(1, c.min, f32::NEG_INFINITY)?, bound(2, c.max, f32::INFINITY)?));
            }
            NodeKind::Op(Op::Quant(QuantOp::QuantizeLinear(QuantizeLinear { block_size: 0, .. }))) => {
                let (sy_v, zy) = (
                    rn.inputs.get(1).copied().flatten()?,
                    rn.inputs.get(2).copied().flatten(),
                );
                let yq = rn.outputs.first().copied().flatten()?;
                let ydt = dtype_of(g, yq)?;
                if !matches!(ydt, DType::U8 | DType::I8) || rn.inputs.first().copied().flatten() != Some(v) {
                    return None;
                }
                let sy = scalar_f32(g, index, sy_v)?;
                let zyv = zero_point(g, index, zy, ydt)?;
                if !(sy.is_finite() && sy > 0.0 && sx.is_finite() && sx > 0.0) {
                    return None;
                }
                removed.push(r);
                let clamp = act.map(|(a, b)| {
                    let (lo, hi) = if ydt == DType::U8 { (0, 255) } else { (-128, 127) };
                    let q = |v: f32| -> i32 {
                        if v.is_infinite() {
                            return if v > 0.0 { hi } else { lo };
                        }
                        let r = (f64::from(v) / f64::from(sy)).round_ties_even() + f64::from(zyv);
                        r.clamp(f64::from(lo), f64::from(hi)) as i32
                    };
                    (q(a), q(b))
                });
                if clamp.is_some_and(|(a, b)| a > b) {
                    return None;
                }
                let bias = match bias_f32 {
                    None => None,
                    Some(b) => Some(bias_int32(&b, sx, &sw)?),
                };
                return Some(Found {
                    attrs: ConvAttrs {
                        auto_pad: match conv.auto_pad {
                            kiln_ops::nn::AutoPad::NotSet => AutoPad::NotSet,
                            kiln_ops::nn::AutoPad::SameUpper => AutoPad::SameUpper,
                            kiln_ops::nn::AutoPad::SameLower => AutoPad::SameLower,
                            kiln_ops::nn::AutoPad::Valid => AutoPad::Valid,
                        },
                        dilations: conv.dilations.clone(),
                        group: conv.group,
                        kernel_shape: (!conv.kernel_shape.is_empty()).then(|| conv.kernel_shape.clone()),
                        pads: conv.pads.clone(),
                        strides: conv.strides.clone(),
                    },
                    xq,
                    sx: sx_v,
                    zx,
                    wq,
                    sw: sw_v,
                    zw,
                    sy: sy_v,
                    zy,
                    bias,
                    clamp,
                    yq,
                    removed,
                });
            }
            _ => return None,
        }
        removed.push(r);
        v = rn.outputs.first().copied().flatten()?;
        if rn.outputs.len() != 1 || dtype_of(g, v) != Some(DType::F32) {
            return None;
        }
    }
}

/// The bias of `m` channels: an f32 constant, or the DequantizeLinear of an int32 constant.
fn bias_values(g: &Graph, index: &Index, b: ValueId, m: usize) -> Option<Vec<f32>> {
    if let Some(t) = index.tensor(g, b) {
        let v = t.as_slice::<f32>().ok()?.to_vec();
        return (v.len() == m).then_some(v);
    }
    let (dq, inputs) = dequantize_of(g, index, b)?;
    if dq.output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let q = index.tensor(g, inputs.first().copied().flatten()?)?;
    if q.dtype() != DType::I32 || q.len() != m {
        return None;
    }
    let s = index
        .tensor(g, inputs.get(1).copied().flatten()?)?
        .as_slice::<f32>()
        .ok()?
        .to_vec();
    let z: Vec<f64> = match inputs.get(2).copied().flatten() {
        None => vec![0.0],
        Some(z) => index.tensor(g, z)?.to_f64_vec(),
    };
    if !(s.len() == 1 || s.len() == m) || !(z.len() == 1 || z.len() == m) {
        return None;
    }
    let pick = |v: &[f64], j: usize| v.get(j).or(v.first()).copied().unwrap_or(0.0);
    let sv: Vec<f64> = s.iter().map(|&x| f64::from(x)).collect();
    let qv = q.to_f64_vec();
    // DequantizeLinear's own arithmetic: (q - z) * s in f32.
    Some(
        (0..m)
            .map(|j| ((pick(&qv, j) - pick(&z, j)) as f32) * (pick(&sv, j) as f32))
            .collect(),
    )
}

/// `round(bias / f32(sx * sw[m]))` per channel, in int32 (`None` when one does not fit).
fn bias_int32(bias: &[f32], sx: f32, sw: &[f32]) -> Option<Vec<i32>> {
    bias.iter()
        .enumerate()
        .map(|(j, &b)| {
            let s = sx * sw.get(j).or(sw.first()).copied()?;
            if !(s.is_finite() && s > 0.0) {
                return None;
            }
            let q = (f64::from(b) / f64::from(s)).round_ties_even();
            (q.abs() < 2_147_483_520.0).then_some(q as i32)
        })
        .collect()
}

/// The QLinearConv replacing Conv `i`.
fn rewrite(g: &mut Graph, i: usize, f: Found) -> Option<Node> {
    let base = g.nodes.get(i)?.name.clone();
    let zero = |g: &mut Graph, v: ValueId, name: &str| -> Option<ValueId> {
        let t = match dtype_of(g, v)? {
            DType::U8 => Tensor::scalar(0u8),
            DType::I8 => Tensor::scalar(0i8),
            _ => return None,
        };
        Some(add_constant(g, &format!("{base}_{name}"), t))
    };
    let zx = match f.zx {
        Some(z) => z,
        None => zero(g, f.xq, "x_zero")?,
    };
    let zw = match f.zw {
        Some(z) => z,
        None => zero(g, f.wq, "w_zero")?,
    };
    let zy = match f.zy {
        Some(z) => z,
        None => zero(g, f.yq, "y_zero")?,
    };
    let bias = match f.bias {
        Some(b) => {
            let n = b.len();
            Some(add_constant(
                g,
                &format!("{base}_bias_i32"),
                Tensor::from_vec(vec![n], b).ok()?,
            ))
        }
        None => None,
    };
    let mut inputs = vec![
        Some(f.xq),
        Some(f.sx),
        Some(zx),
        Some(f.wq),
        Some(f.sw),
        Some(zw),
        Some(f.sy),
        Some(zy),
    ];
    if bias.is_some() {
        inputs.push(bias);
    }
    Some(Node {
        name: base,
        kind: NodeKind::Op(Op::Quant(QuantOp::QLinearConv(QLinearConv { conv: f.attrs }))),
        inputs,
        outputs: vec![Some(f.yq)],
        plan: Some(Plan::QConv(QConvPlan {
            clamp: f.clamp,
            float_requant: true,
            ..QConvPlan::default()
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::Clip;
    use kiln_ops::nn::Conv;

    /// What follows the float convolution before its QuantizeLinear.
    #[derive(Clone, Copy, PartialEq)]
    enum Act {
        None,
        Relu,
        Clip6,
    }

    /// `x -> Q -> DQ -> Conv(DQ(W), DQ(bias_i32)) [-> act] -> Q -> DQ -> y`, the QDQ form ONNX
    /// Runtime's quantizer writes, per-channel s8 weights; 3x3 pad 1 stride `stride`.
    fn graph(act: Act, stride: usize, signed_x: bool, depthwise: bool) -> Graph {
        let (c, hw) = (if depthwise { 20 } else { 5 }, 6usize);
        let m = if depthwise { c } else { 7 };
        let cg = if depthwise { 1 } else { c };
        let oh = (hw + 2 - 3) / stride + 1;
        let mut b = Builder::new();
        let x = b.input("x", &[1, c, hw, hw]);
        let sx = b.constant("sx", f32s(&[], &[0.01]));
        let (zx, xdt) = if signed_x {
            (b.constant("zx", Tensor::scalar(-3i8)), DType::I8)
        } else {
            (b.constant("zx", Tensor::scalar(120u8)), DType::U8)
        };
        let xq = b.node_typed(quantize(), &[Some(x), Some(sx), Some(zx)], &[(xdt, &[1, c, hw, hw])])[0];
        let xd = b.node(dequantize(1), &[Some(xq), Some(sx), Some(zx)], &[&[1, c, hw, hw]])[0];
        let wv: Vec<i8> = (0..m * cg * 9).map(|i| ((i * 37 + 11) % 255) as u8 as i8).collect();
        let w = b.constant(
            "w",
            Tensor::from_vec(vec![m, cg, 3, 3], wv).unwrap_or_else(|e| panic!("{e}")),
        );
        let swv: Vec<f32> = (0..m).map(|j| 0.002 + 0.0003 * j as f32).collect();
        let sw = b.constant("sw", f32s(&[m], &swv));
        let zw = b.constant(
            "zw",
            Tensor::from_vec(vec![m], vec![0i8; m]).unwrap_or_else(|e| panic!("{e}")),
        );
        let wd = b.node(dequantize(0), &[Some(w), Some(sw), Some(zw)], &[&[m, cg, 3, 3]])[0];
        let bq: Vec<i32> = (0..m as i32).map(|j| j * 97 - 300).collect();
        let bq = b.constant("bq", Tensor::from_vec(vec![m], bq).unwrap_or_else(|e| panic!("{e}")));
        let sb: Vec<f32> = swv.iter().map(|s| s * 0.01).collect();
        let sb = b.constant("sb", f32s(&[m], &sb));
        let bd = b.node(dequantize(0), &[Some(bq), Some(sb)], &[&[m]])[0];
        let conv = Op::Nn(NnOp::Conv(Conv {
            group: if depthwise { c } else { 1 },
            pads: vec![1; 4],
            strides: vec![stride; 2],
            ..Default::default()
        }));
        let shape = [1, m, oh, oh];
        let mut h = b.node(conv, &[Some(xd), Some(wd), Some(bd)], &[&shape])[0];
        match act {
            Act::None => {}
            Act::Relu => h = b.unary(UnaryOp::Relu, h, &shape),
            Act::Clip6 => {
                let lo = b.constant("lo", f32s(&[], &[0.0]));
                let hi = b.constant("hi", f32s(&[], &[0.3]));
                h = b.node(
                    Op::Elementwise(ElementwiseOp::Clip(Clip { min: None, max: None })),
                    &[Some(h), Some(lo), Some(hi)],
                    &[&shape],
                )[0];
            }
        }
        let sy = b.constant("sy", f32s(&[], &[0.004]));
        let zy = b.constant("zy", Tensor::scalar(100u8));
        let yq = b.node_typed(quantize(), &[Some(h), Some(sy), Some(zy)], &[(DType::U8, &shape)])[0];
        let y = b.node(dequantize(1), &[Some(yq), Some(sy), Some(zy)], &[&shape])[0];
        b.finish(&[y])
    }

    /// The integer form differs from the float emulation by at most one output step (the
    /// sum is rounded once instead of per product), and channels-last gives the same values
    /// as channels-first exactly.
    #[test]
    fn qdq_convolutions_become_integer_and_run_channels_last() {
        for (act, stride, signed_x, depthwise) in [
            (Act::None, 1, false, false),
            (Act::Relu, 1, false, false),
            (Act::Clip6, 2, false, false),
            (Act::Relu, 2, true, false),
            (Act::Relu, 1, false, true),
            (Act::Clip6, 2, true, true),
        ] {
            let mut g = graph(act, stride, signed_x, depthwise);
            let before = g.clone();
            assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 1);
            g.verify().unwrap_or_else(|e| panic!("{e}"));
            let names = op_names(&g);
            assert!(names.contains(&"QLinearConv"), "{names:?}");
            assert!(
                !names.contains(&"Conv") && !names.contains(&"Relu") && !names.contains(&"Clip"),
                "{names:?}"
            );
            let c = if depthwise { 20 } else { 5 };
            let x = noise(&[1, c, 6, 6], 3);
            let want = run_graph(&before, vec![x.clone()]);
            let got = run_graph(&g, vec![x.clone()]);
            let (w, gv) = (want[0].to_f64_vec(), got[0].to_f64_vec());
            assert_eq!(w.len(), gv.len());
            let mut differ = 0;
            for (a, b) in w.iter().zip(&gv) {
                assert!((a - b).abs() <= 0.004 * 1.001, "{a} vs {b}");
                differ += usize::from(a != b);
            }
            assert!(differ * 10 <= w.len(), "{differ} of {} values moved a step", w.len());
            if act != Act::None {
                // The clamp did something: values at the activation's floor exist.
                assert!(gv.iter().any(|&v| v == 0.0), "no value at the Relu/Clip floor");
            }
            let mut nhwc = g.clone();
            assert!(crate::passes::layout::run(&mut nhwc).unwrap_or_else(|e| panic!("{e}")) >= 1);
            nhwc.verify().unwrap_or_else(|e| panic!("{e}"));
            let planned = nhwc.nodes.iter().find(|n| n.kind.name() == "QLinearConv");
            assert!(
                matches!(planned.and_then(|n| n.plan.as_ref()), Some(Plan::QConv(p)) if p.channels_last),
                "the QLinearConv runs channels-last"
            );
            assert_eq!(run_graph(&nhwc, vec![x])[0].to_f64_vec(), gv);
        }
    }

    /// A 1-D QDQ convolution (a quantized audio front end) becomes integer too, then runs
    /// as a 2-D one channels-last: within one output step of the float emulation, and the
    /// 2-D form's bytes those of the 1-D QLinearConv.
    #[test]
    fn one_dimensional_qdq_convolutions_become_integer() {
        let (c, m, l) = (5usize, 7usize, 30usize);
        let mut b = Builder::new();
        let x = b.input("x", &[1, c, l]);
        let sx = b.constant("sx", f32s(&[], &[0.01]));
        let zx = b.constant("zx", Tensor::scalar(120u8));
        let xq = b.node_typed(quantize(), &[Some(x), Some(sx), Some(zx)], &[(DType::U8, &[1, c, l])])[0];
        let xd = b.node(dequantize(1), &[Some(xq), Some(sx), Some(zx)], &[&[1, c, l]])[0];
        let wv: Vec<i8> = (0..m * c * 3).map(|i| ((i * 37 + 11) % 255) as u8 as i8).collect();
        let w = b.constant(
            "w",
            Tensor::from_vec(vec![m, c, 3], wv).unwrap_or_else(|e| panic!("{e}")),
        );
        let swv: Vec<f32> = (0..m).map(|j| 0.002 + 0.0003 * j as f32).collect();
        let sw = b.constant("sw", f32s(&[m], &swv));
        let wd = b.node(dequantize(0), &[Some(w), Some(sw)], &[&[m, c, 3]])[0];
        let conv = Op::Nn(NnOp::Conv(Conv {
            pads: vec![1, 1],
            strides: vec![2],
            ..Default::default()
        }));
        let shape = [1, m, 15];
        let h = b.node(conv, &[Some(xd), Some(wd)], &[&shape])[0];
        let sy = b.constant("sy", f32s(&[], &[0.004]));
        let zy = b.constant("zy", Tensor::scalar(100u8));
        let yq = b.node_typed(quantize(), &[Some(h), Some(sy), Some(zy)], &[(DType::U8, &shape)])[0];
        let y = b.node(dequantize(1), &[Some(yq), Some(sy), Some(zy)], &[&shape])[0];
        let g = b.finish(&[y]);
        let mut q = g.clone();
        assert_eq!(run(&mut q).unwrap_or_else(|e| panic!("{e}")), 1);
        q.verify().unwrap_or_else(|e| panic!("{e}"));
        assert!(op_names(&q).contains(&"QLinearConv"));
        let xin = noise(&[1, c, l], 5);
        let want = run_graph(&g, vec![xin.clone()])[0].to_f64_vec();
        let got = run_graph(&q, vec![xin.clone()])[0].to_f64_vec();
        assert_eq!(want.len(), got.len());
        for (a, b) in want.iter().zip(&got) {
            assert!((a - b).abs() <= 0.004 * 1.001, "{a} vs {b}");
        }
        let mut two = q.clone();
        assert_eq!(
            crate::passes::conv1d::run(&mut two).unwrap_or_else(|e| panic!("{e}")),
            1
        );
        crate::passes::layout::run(&mut two).unwrap_or_else(|e| panic!("{e}"));
        two.verify().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run_graph(&two, vec![xin])[0].to_f64_vec(), got);
    }

    #[test]
    fn a_conv_whose_result_has_another_reader_stays_float() {
        let mut g = graph(Act::Relu, 1, false, false);
        // Make the Conv's output a graph output as well.
        let conv_out = g
            .nodes
            .iter()
            .find(|n| n.kind.name() == "Conv")
            .and_then(|n| n.outputs.first().copied().flatten())
            .unwrap_or_else(|| panic!("no Conv"));
        g.outputs.push(conv_out);
        assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 0);
    }
}
