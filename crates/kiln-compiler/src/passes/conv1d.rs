//! One-dimensional convolutions run as two-dimensional ones of height 1: an f32 `Conv` of
//! `[N, C, L]` with constant weights becomes Unsqueeze -> Conv `[N, C, 1, L]` (kernel
//! `[1, K]`, the strides, dilations and pads of the width) -> Squeeze, so audio and sequence
//! models (wav2vec2's feature extractor, Whisper's stem, VAD front ends) get the layout,
//! packed kernels and fusions of images. The same arithmetic in the same order: exact.
//!
//! After `fuse_act` (the Conv keeps its fused activation; a fused residual input is
//! unsqueezed too) and before `layout`, which then sees a 2-D convolution.

use super::edit::{Index, add_constant, dtype_of, fixed_shape, fresh_name};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::TensorType;
use kiln_ops::movement::{MovementOp, Squeeze, Unsqueeze};
use kiln_ops::nn::NnOp;
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
    for (mut node, ok) in old.into_iter().zip(eligible) {
        if !ok {
            nodes.push(node);
            continue;
        }
        // X (and a fused residual) gain a unit height; W is the same data as [M, C, 1, K].
        for slot in [0, 3] {
            let Some(Some(v)) = node.inputs.get(slot).copied() else {
                continue;
            };
            let Some(v2) = with_unit_height(g, v) else { continue };
            let name = fresh_name(g, &format!("{}_2d", g.value_name(v)));
            nodes.push(reshape_node(name, true, v, v2));
            if let Some(i) = node.inputs.get_mut(slot) {
                *i = Some(v2);
            }
        }
        if let Some(Some(w)) = node.inputs.get(1).copied()
            && let Some(t) = index.tensor(g, w)
            && let [m, c, k] = *t.shape()
            && let Ok(t2) = t.clone().reshape(vec![m, c, 1, k])
        {
            let w2 = add_constant(g, &format!("{}_2d", g.value_name(w)), t2);
            if let Some(i) = node.inputs.get_mut(1) {
                *i = Some(w2);
            }
        }
        if let NodeKind::Op(Op::Nn(NnOp::Conv(conv))) = &mut node.kind {
            let widen = |v: &mut Vec<usize>, fill: usize| {
                if !v.is_empty() {
                    v.insert(0, fill);
                }
            };
            widen(&mut conv.kernel_shape, 1);
            widen(&mut conv.strides, 1);
            widen(&mut conv.dilations, 1);
            if let [b, e] = *conv.pads.as_slice() {
                conv.pads = vec![0, b, 0, e];
            }
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
        let name = fresh_name(g, &format!("{}_1d", node.name));
        nodes.push(node);
        nodes.push(reshape_node(name, false, y2, y));
    }
    g.nodes = nodes;
    Ok(count)
}

/// An f32 Conv of fixed rank-3 shapes with constant rank-3 weights and one output.
fn eligible(g: &Graph, index: &Index, node: &Node) -> bool {
    let NodeKind::Op(Op::Nn(NnOp::Conv(conv))) = &node.kind else {
        return false;
    };
    let (Some(Some(x)), Some(Some(w)), [Some(y)]) = (node.inputs.first(), node.inputs.get(1), node.outputs.as_slice())
    else {
        return false;
    };
    let rank3 = |v: ValueId| dtype_of(g, v) == Some(DType::F32) && fixed_shape(g, v).is_some_and(|s| s.len() == 3);
    let attrs_1d = [&conv.kernel_shape, &conv.strides, &conv.dilations]
        .iter()
        .all(|v| v.len() <= 1)
        && (conv.pads.is_empty() || conv.pads.len() == 2);
    rank3(*x)
        && rank3(*y)
        && attrs_1d
        && index
            .tensor(g, *w)
            .is_some_and(|t| t.rank() == 3 && t.dtype() == DType::F32)
        && node
            .inputs
            .iter()
            .skip(2)
            .flatten()
            .all(|&v| dtype_of(g, v) == Some(DType::F32))
        && node.inputs.get(3).copied().flatten().is_none_or(rank3)
}

/// A new value of `v`'s shape `[n, c, l]` as `[n, c, 1, l]`.
fn with_unit_height(g: &mut Graph, v: ValueId) -> Option<ValueId> {
    let s = fixed_shape(g, v)?;
    let &[n, c, l] = s.as_slice() else { return None };
    let name = fresh_name(g, &format!("{}_h1", g.value_name(v)));
    Some(g.add_value(name, ValueType::Tensor(TensorType::fixed(DType::F32, &[n, c, 1, l]))))
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
}
