//! One-dimensional convolutions run as two-dimensional ones of height 1: an f32 `Conv` (or an
//! 8-bit `QLinearConv`) of `[N, C, L]` with constant weights becomes Unsqueeze -> Conv `[N,
//! C, 1, L]` (kernel `[1, K]`, the strides, dilations and pads of the width) -> Squeeze, so
//! audio and sequence models (wav2vec2's feature extractor, Whisper's stem, VAD front ends)
//! get the layout, packed kernels and fusions of images. The same arithmetic in the same
//! order: exact.
//!
//! After `fuse_act` (the Conv keeps its fused activation; a fused residual input is
//! unsqueezed too) and before `layout`, which then sees a 2-D convolution.

use super::edit::{Index, add_constant, dtype_of, fixed_shape, fresh_name};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::TensorType;
use kiln_ops::movement::{MovementOp, Squeeze, Unsqueeze};
use kiln_ops::nn::NnOp;
use kiln_ops::quant::QuantOp;
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let eligible: Vec<bool> = g.nodes.iter().map(|n| eligible(g, &index, n)).collect();
    let count = eligible.iter().filter(|&&e| e).count();
    if count == 0 {
        return Ok(0);
    }
    let old = std::mem::take(&mut g.nodes);
    let mut nodes = Vec::with_capacity(old.len() + 3 * count);
    // The height-1 value behind each output this pass squeezed: a convolution reading one
    // reads it directly, so a stack of 1-D convolutions (wav2vec2's feature extractor) has no
    // Squeeze -> Unsqueeze between its layers, which `layout` would have had to run
    // channels-first (a transpose back and forth per layer). The Squeeze stays for other
    // readers; `dce` drops it when there are none.
    let mut unit_height: std::collections::HashMap<ValueId, ValueId> = std::collections::HashMap::new();
    for (mut node, ok) in old.into_iter().zip(eligible) {
        if !ok {
            nodes.push(node);
            continue;
        }
        // X (and a Conv's fused residual) gain a unit height; W is the same data as [M, C,
        // 1, K].
        let quantized = matches!(node.kind, NodeKind::Op(Op::Quant(QuantOp::QLinearConv(_))));
        let (x_slots, w_slot): (&[usize], usize) = if quantized { (&[0], 3) } else { (&[0, 3], 1) };
        for &slot in x_slots {
            let Some(Some(v)) = node.inputs.get(slot).copied() else {
                continue;
            };
            if let Some(&v2) = unit_height.get(&v) {
                if let Some(i) = node.inputs.get_mut(slot) {
                    *i = Some(v2);
                }
                continue;
            }
            let Some(v2) = with_unit_height(g, v) else { continue };
            let name = fresh_name(g, &format!("{}_2d", g.value_name(v)));
            nodes.push(reshape_node(name, true, v, v2));
            if let Some(i) = node.inputs.get_mut(slot) {
                *i = Some(v2);
            }
        }
        if let Some(Some(w)) = node.inputs.get(w_slot).copied()
            && let Some(t) = index.tensor(g, w)
            && let [m, c, k] = *t.shape()
            && let Ok(t2) = t.clone().reshape(vec![m, c, 1, k])
        {
            let w2 = add_constant(g, &format!("{}_2d", g.value_name(w)), t2);
            if let Some(i) = node.inputs.get_mut(w_slot) {
                *i = Some(w2);
            }
        }
        let widen = |v: &mut Vec<usize>, fill: usize| {
            if !v.is_empty() {
                v.insert(0, fill);
            }
        };
        let pads_2d = |pads: &mut Vec<usize>| {
            if let [b, e] = *pads.as_slice() {
                *pads = vec![0, b, 0, e];
            }
        };
        match &mut node.kind {
            NodeKind::Op(Op::Nn(NnOp::Conv(conv))) => {
                widen(&mut conv.kernel_shape, 1);
                widen(&mut conv.strides, 1);
                widen(&mut conv.dilations, 1);
                pads_2d(&mut conv.pads);
            }
            NodeKind::Op(Op::Quant(QuantOp::QLinearConv(q))) => {
                if let Some(k) = q.conv.kernel_shape.as_mut() {
                    widen(k, 1);
                }
                widen(&mut q.conv.strides, 1);
                widen(&mut q.conv.dilations, 1);
                pads_2d(&mut q.conv.pads);
            }
            _ => {}
        }
        let Some(Some(y)) = node.outputs.first().copied() else {
            nodes.push(node);
            continue;
        };
        let Some(y2) = with_unit_height(g, y) else {
            nodes.push(node);
            continue;
        };
        node.outputs = vec![Some(y2)];
        unit_height.insert(y, y2);
        let name = fresh_name(g, &format!("{}_1d", node.name));
        nodes.push(node);
        nodes.push(reshape_node(name, false, y2, y));
    }
    g.nodes = nodes;
    Ok(count)
}

/// An f32 Conv of fixed rank-3 shapes with constant rank-3 weights and one output, or such an
/// 8-bit QLinearConv. `auto_pad` stays as it is: the added height of 1 with a kernel of 1
/// pads nothing in any mode.
fn eligible(g: &Graph, index: &Index, node: &Node) -> bool {
    let rank3 = |v: ValueId, d: &[DType]| {
        dtype_of(g, v).is_some_and(|t| d.contains(&t)) && fixed_shape(g, v).is_some_and(|s| s.len() == 3)
    };
    let one_d = |k: &[usize], s: &[usize], d: &[usize], p: &[usize]| {
        [k, s, d].iter().all(|v| v.len() <= 1) && (p.is_empty() || p.len() == 2)
    };
    match &node.kind {
        NodeKind::Op(Op::Nn(NnOp::Conv(conv))) => {
            let (Some(Some(x)), Some(Some(w)), [Some(y)]) =
                (node.inputs.first(), node.inputs.get(1), node.outputs.as_slice())
            else {
                return false;
            };
            let f32s = &[DType::F32];
            rank3(*x, f32s)
                && rank3(*y, f32s)
                && one_d(&conv.kernel_shape, &conv.strides, &conv.dilations, &conv.pads)
                && index
                    .tensor(g, *w)
                    .is_some_and(|t| t.rank() == 3 && t.dtype() == DType::F32)
                && node
                    .inputs
                    .iter()
                    .skip(2)
                    .flatten()
                    .all(|&v| dtype_of(g, v) == Some(DType::F32))
                && node.inputs.get(3).copied().flatten().is_none_or(|v| rank3(v, f32s))
        }
        NodeKind::Op(Op::Quant(QuantOp::QLinearConv(q))) => {
            let (Some(Some(x)), Some(Some(w)), [Some(y)]) =
                (node.inputs.first(), node.inputs.get(3), node.outputs.as_slice())
            else {
                return false;
            };
            let bytes = &[DType::U8, DType::I8];
            let c = &q.conv;
            rank3(*x, bytes)
                && rank3(*y, bytes)
                && one_d(
                    c.kernel_shape.as_deref().unwrap_or(&[]),
                    &c.strides,
                    &c.dilations,
                    &c.pads,
                )
                && index.tensor(g, *w).is_some_and(|t| t.rank() == 3)
        }
        _ => false,
    }
}

/// A new value of `v`'s shape `[n, c, l]` as `[n, c, 1, l]`.
fn with_unit_height(g: &mut Graph, v: ValueId) -> Option<ValueId> {
    let s = fixed_shape(g, v)?;
    let &[n, c, l] = s.as_slice() else { return None };
    let dtype = dtype_of(g, v)?;
    let name = fresh_name(g, &format!("{}_h1", g.value_name(v)));
    Some(g.add_value(name, ValueType::Tensor(TensorType::fixed(dtype, &[n, c, 1, l]))))
}

/// Unsqueeze (`up`) or Squeeze of axis 2, from `from` into `into`.
fn reshape_node(name: String, up: bool, from: ValueId, into: ValueId) -> Node {
    let axes = Some(vec![2]);
    let op = if up {
        MovementOp::Unsqueeze(Unsqueeze { axes })
    } else {
        MovementOp::Squeeze(Squeeze { axes })
    };
    Node {
        name,
        kind: NodeKind::Op(Op::Movement(op)),
        inputs: vec![Some(from)],
        outputs: vec![Some(into)],
        plan: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::nn::Conv;

    #[test]
    fn a_one_dimensional_convolution_runs_as_a_two_dimensional_one() {
        // x [2, 3, 17] -> Conv k5 s2 d2 pads (3, 1), 4 filters, bias -> y [2, 4, 7].
        let mut b = Builder::new();
        let x = b.input("x", &[2, 3, 17]);
        let w = b.constant("w", noise(&[4, 3, 5], 1));
        let bias = b.constant("bias", noise(&[4], 2));
        let conv = Op::Nn(NnOp::Conv(Conv {
            kernel_shape: vec![5],
            strides: vec![2],
            dilations: vec![2],
            pads: vec![3, 1],
            group: 1,
            ..Conv::default()
        }));
        let y = b.node(conv, &[Some(x), Some(w), Some(bias)], &[&[2, 4, 7]])[0];
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        crate::passes::dce::run(&mut g).unwrap();
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Unsqueeze", "Conv", "Squeeze"]);
        let NodeKind::Op(Op::Nn(NnOp::Conv(c))) = &g.nodes[1].kind else {
            panic!("not a Conv")
        };
        assert_eq!(
            (c.kernel_shape.clone(), c.strides.clone(), c.pads.clone()),
            (vec![1, 5], vec![1, 2], vec![0, 3, 0, 1])
        );
        let xin = noise(&[2, 3, 17], 3);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-6,
        );
    }

    /// A stack of 1-D convolutions (wav2vec2's feature extractor): the second reads the first's
    /// height-1 output, with no Squeeze -> Unsqueeze between them, so after `layout` no
    /// transpose runs between the layers; the first's 1-D output, also a graph output, keeps
    /// its Squeeze.
    #[test]
    fn stacked_one_dimensional_convolutions_read_each_other_at_height_1() {
        use kiln_ops::nn::Activation;
        let conv = |k: usize| {
            Op::Nn(NnOp::Conv(Conv {
                kernel_shape: vec![k],
                strides: vec![2],
                group: 1,
                ..Conv::default()
            }))
        };
        for first_is_output in [false, true] {
            let mut b = Builder::new();
            let x = b.input("x", &[1, 4, 41]);
            let w1 = b.constant("w1", noise(&[8, 4, 3], 1));
            let w2 = b.constant("w2", noise(&[8, 8, 3], 2));
            let w3 = b.constant("w3", noise(&[6, 8, 3], 3));
            let h1 = b.node_act(conv(3), Some(Activation::Relu), &[Some(x), Some(w1)], &[&[1, 8, 20]])[0];
            let h2 = b.node_act(conv(3), Some(Activation::Relu), &[Some(h1), Some(w2)], &[&[1, 8, 9]])[0];
            let y = b.node(conv(3), &[Some(h2), Some(w3)], &[&[1, 6, 4]])[0];
            let outputs = if first_is_output { vec![y, h1] } else { vec![y] };
            let mut g = b.finish(&outputs);
            let before = g.clone();
            assert_eq!(run(&mut g).unwrap(), 3);
            crate::passes::dce::run(&mut g).unwrap();
            g.verify().unwrap();
            let squeezes = if first_is_output { 2 } else { 1 };
            let names = op_names(&g);
            assert_eq!(names.iter().filter(|n| **n == "Unsqueeze").count(), 1, "{names:?}");
            assert_eq!(names.iter().filter(|n| **n == "Squeeze").count(), squeezes, "{names:?}");
            crate::passes::layout::run(&mut g).unwrap();
            crate::passes::dce::run(&mut g).unwrap();
            g.verify().unwrap();
            let names = op_names(&g);
            // The first reads its four-channel input as it is (`x_channels_first`): a
            // transpose back per 1-D output only.
            assert_eq!(
                names.iter().filter(|n| **n == "Transpose").count(),
                squeezes,
                "{names:?}"
            );
            let xin = noise(&[1, 4, 41], 4);
            let (got, want) = (run_graph(&g, vec![xin.clone()]), run_graph(&before, vec![xin]));
            for (a, e) in got.iter().zip(&want) {
                assert_close(a, e, 1e-6);
            }
        }
    }

    /// An 8-bit QLinearConv of `[N, C, L]` (a quantized VAD's front end) the same way, then
    /// channels-last: the bytes of the reference.
    #[test]
    fn a_one_dimensional_quantized_convolution_runs_as_a_two_dimensional_one() {
        use kiln_ops::quant::{AutoPad, ConvAttrs, QLinearConv};
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::U8, &[2, 8, 40]);
        let wv: Vec<i8> = (0..6 * 8 * 3).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
        let w = b.constant("w", kiln_tensor::Tensor::from_vec(vec![6, 8, 3], wv).unwrap());
        let c = |b: &mut Builder, n: &str, t: kiln_tensor::Tensor| b.constant(n, t);
        let sx = c(&mut b, "sx", kiln_tensor::Tensor::scalar(0.02f32));
        let zx = c(&mut b, "zx", kiln_tensor::Tensor::scalar(128u8));
        let sw = c(&mut b, "sw", kiln_tensor::Tensor::scalar(0.01f32));
        let zw = c(&mut b, "zw", kiln_tensor::Tensor::scalar(0i8));
        let sy = c(&mut b, "sy", kiln_tensor::Tensor::scalar(0.05f32));
        let zy = c(&mut b, "zy", kiln_tensor::Tensor::scalar(100u8));
        let op = Op::Quant(QuantOp::QLinearConv(QLinearConv {
            conv: ConvAttrs {
                auto_pad: AutoPad::NotSet,
                dilations: vec![1],
                group: 1,
                kernel_shape: Some(vec![3]),
                pads: vec![1, 1],
                strides: vec![2],
            },
        }));
        let y = b.node_typed(
            op,
            &[
                Some(x),
                Some(sx),
                Some(zx),
                Some(w),
                Some(sw),
                Some(zw),
                Some(sy),
                Some(zy),
            ],
            &[(DType::U8, &[2, 6, 20])],
        )[0];
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        crate::passes::dce::run(&mut g).unwrap();
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Unsqueeze", "QLinearConv", "Squeeze"]);
        assert!(crate::passes::layout::run(&mut g).unwrap() >= 1);
        g.verify().unwrap();
        let planned = g.nodes.iter().find(|n| n.kind.name() == "QLinearConv");
        assert!(matches!(
            planned.and_then(|n| n.plan.as_ref()),
            Some(kiln_ops::fast::Plan::QConv(p)) if p.channels_last
        ));
        let bytes: Vec<u8> = (0..640u32).map(|i| (i * 73 % 256) as u8).collect();
        let xin = kiln_tensor::Tensor::from_vec(vec![2, 8, 40], bytes).unwrap();
        let want = run_graph(&before, vec![xin.clone()]);
        let got = run_graph(&g, vec![xin]);
        assert_eq!(got[0].as_slice::<u8>().unwrap(), want[0].as_slice::<u8>().unwrap());
        let v = want[0].as_slice::<u8>().unwrap();
        assert!(v.iter().any(|&a| a != v[0]));
    }
}
