//! A scale and shift after a convolution's activation: an `ElementwiseChain` of a `Mul` then
//! an `Add` (or one of them, or a lone `Mul` or `Add` node) of one-element f32 constants,
//! reading a Conv's output alone,
//! becomes the Conv's `post` (`ConvPlan::post`): the channels-last kernels apply it to each
//! block of the output as they make it, instead of a pass over the whole tensor that reads
//! and writes it again. PP-LCNet's learnable affine blocks (`act(x) * a + b` after each of
//! its convolutions: PP-OCRv4 and v5's detectors and recognisers) are that chain: 10% of
//! PP-OCRv4's recogniser ran in them. The same multiply and add, each rounded on its own, so
//! results are bit-identical.
//!
//! Runs after the chain pass made the chains.

use super::edit::{Index, mark, op, remove_nodes, shape_of};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op};
use kiln_ops::elementwise::{Binary, BinaryOp, ChainBinary, ChainStep, ElementwiseOp};
use kiln_ops::fast::{ConvPlan, Plan, PostAffine};
use kiln_ops::nn::NnOp;
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    // (the Conv's position, the chain's position, the scale and shift)
    let mut fusions = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        // The chain's steps, or a lone Mul or Add: (op, operand slot) each, and the slot of
        // the Conv's output.
        let (steps, y): (Vec<(ChainBinary, usize)>, usize) = match op(node) {
            Some(Op::Elementwise(ElementwiseOp::Chain(chain))) => {
                if chain.quantize.is_some() || chain.dequantize.iter().any(Option::is_some) {
                    continue;
                }
                let steps = chain
                    .steps
                    .iter()
                    .map(|s| match *s {
                        // Multiply and add are commutative in floating point: the side does
                        // not matter.
                        ChainStep::Binary { op, operand, .. } => Some((op, operand)),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>();
                match steps {
                    Some(steps) => (steps, 0),
                    None => continue,
                }
            }
            Some(Op::Elementwise(ElementwiseOp::Binary(Binary { op, legacy_axis: None }))) => {
                let o = match op {
                    BinaryOp::Mul => ChainBinary::Mul,
                    BinaryOp::Add => ChainBinary::Add,
                    _ => continue,
                };
                // The Conv's output on either side, the constant on the other.
                let conv_at = node.inputs.iter().position(|v| {
                    v.and_then(|v| index.producer(v))
                        .and_then(|p| g.nodes.get(p))
                        .is_some_and(|n| matches!(&n.kind, NodeKind::Op(Op::Nn(NnOp::Conv(_)))))
                });
                match conv_at {
                    Some(at) if node.inputs.len() == 2 => (vec![(o, 1 - at)], at),
                    _ => continue,
                }
            }
            _ => continue,
        };
        let (Some(Some(y)), [Some(_)]) = (node.inputs.get(y), node.outputs.as_slice()) else {
            continue;
        };
        let Some(p) = index.producer(*y) else { continue };
        let Some(conv) = g.nodes.get(p) else { continue };
        let is_conv = matches!(&conv.kind, NodeKind::Op(Op::Nn(NnOp::Conv(_))));
        if !is_conv
            || conv.conv_plan().post.is_some()
            || conv.conv_plan().prelu
            || !matches!(conv.plan, None | Some(Plan::Conv(_)))
            || conv.outputs.len() != 1
            || !index.sole_use(*y, i)
            || index.is_output(*y)
        {
            continue;
        }
        // The operand of a step: a one-element f32 constant.
        let scalar = |operand: usize| {
            let v = node.inputs.get(operand).copied().flatten()?;
            let t = index.tensor(g, v)?;
            if t.dtype() != DType::F32 || t.len() != 1 {
                return None;
            }
            t.as_slice::<f32>().ok()?.first().copied()
        };
        let step =
            |&(op, operand): &(ChainBinary, usize), want: ChainBinary| (op == want).then(|| scalar(operand)).flatten();
        // A multiply then an add, or either alone.
        let post = match steps.as_slice() {
            [m, a] => PostAffine {
                scale: step(m, ChainBinary::Mul),
                shift: step(a, ChainBinary::Add),
            },
            [s] => PostAffine {
                scale: step(s, ChainBinary::Mul),
                shift: step(s, ChainBinary::Add),
            },
            _ => continue,
        };
        let complete = match steps.len() {
            2 => post.scale.is_some() && post.shift.is_some(),
            _ => post.scale.is_some() || post.shift.is_some(),
        };
        // The output keeps the Conv's shape (a one-element operand of higher rank would
        // broadcast it to more dims).
        let [Some(out)] = node.outputs.as_slice() else { continue };
        if complete && shape_of(g, *out) == shape_of(g, *y) && shape_of(g, *y).is_some() {
            fusions.push((p, i, post));
        }
    }
    let mut dead = vec![false; g.nodes.len()];
    for &(p, i, post) in &fusions {
        let Some(out) = g.nodes.get(i).and_then(|n| n.outputs.first().copied().flatten()) else {
            continue;
        };
        let Some(conv) = g.nodes.get_mut(p) else { continue };
        conv.plan = Some(Plan::Conv(ConvPlan {
            post: Some(post),
            ..conv.conv_plan()
        }));
        conv.outputs = vec![Some(out)];
        mark(&mut dead, [i]);
    }
    remove_nodes(g, &dead);
    Ok(fusions.len())
}

#[cfg(test)]
mod tests {
    use crate::passes::testutil::*;
    use crate::{CompileOptions, compile};
    use kiln_ir::Graph;
    use kiln_ops::elementwise::{BinaryOp, ElementwiseOp, UnaryOp};
    use kiln_ops::fast::{Plan, PostAffine};
    use kiln_ops::nn::{Activation, NnOp};
    use kiln_ops::{Op, Value};
    use kiln_runtime::StepKind;
    use kiln_tensor::Tensor;

    /// x [1, 8, 12, 12] -> 1x1 8 -> 16 (Relu) -> * a + b -> depthwise 3x3 (HardSwish) -> * c +
    /// d -> 3x3 stride 2, 16 -> 8 (Relu) -> * e; with `extra_reader`, the depthwise's output is also
    /// read by another op (so its scale and shift stay a chain).
    fn graph(extra_reader: bool) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 12, 12]);
        let w1 = b.constant("w1", noise(&[16, 8, 1, 1], 1));
        let b1 = b.constant("b1", noise(&[16], 2));
        let w2 = b.constant("w2", noise(&[16, 1, 3, 3], 3));
        let w3 = b.constant("w3", noise(&[8, 16, 3, 3], 4));
        let s = |b: &mut Builder, name: &str, v: f32| b.constant(name, Tensor::scalar(v));
        let (a, bb, c, d, e) = (
            s(&mut b, "a", 1.37),
            s(&mut b, "bb", -0.21),
            s(&mut b, "c", 0.73),
            s(&mut b, "d", 0.05),
            s(&mut b, "e", -2.5),
        );
        let h = b.node_act(
            conv2d(1, 0, 1),
            Some(Activation::Relu),
            &[Some(x), Some(w1), Some(b1)],
            &[&[1, 16, 12, 12]],
        )[0];
        let h = b.binary(BinaryOp::Mul, h, a, &[1, 16, 12, 12]);
        let h = b.binary(BinaryOp::Add, bb, h, &[1, 16, 12, 12]);
        let dw = b.node_act(
            conv2d(16, 1, 1),
            Some(Activation::HardSwish),
            &[Some(h), Some(w2)],
            &[&[1, 16, 12, 12]],
        )[0];
        let t = b.binary(BinaryOp::Mul, c, dw, &[1, 16, 12, 12]);
        let t = b.binary(BinaryOp::Add, t, d, &[1, 16, 12, 12]);
        let y = b.node_act(
            conv2d(1, 1, 2),
            Some(Activation::Relu),
            &[Some(t), Some(w3)],
            &[&[1, 8, 6, 6]],
        )[0];
        let y = b.binary(BinaryOp::Mul, y, e, &[1, 8, 6, 6]);
        let mut outs = vec![y];
        if extra_reader {
            // The depthwise output read by another op too: its tail stays a chain.
            outs.push(b.unary(UnaryOp::Neg, dw, &[1, 16, 12, 12]));
        }
        b.finish(&outs)
    }

    fn run(p: &kiln_runtime::Program, x: &Tensor) -> Vec<Tensor> {
        kiln_runtime::run(p, vec![("x".into(), Value::Tensor(x.clone()))])
            .unwrap()
            .into_iter()
            .map(|(_, v)| v.as_tensor().unwrap().clone())
            .collect()
    }

    fn level(opt_level: u8) -> CompileOptions {
        CompileOptions {
            opt_level,
            ..CompileOptions::default()
        }
    }

    #[test]
    fn scale_and_shift_after_a_conv_go_into_it() {
        for extra_reader in [false, true] {
            let g = graph(extra_reader);
            let x = noise(&[1, 8, 12, 12], 9);
            let want = run(&compile(g.clone(), &level(0)).unwrap().program, &x);
            let fused = compile(g, &level(2)).unwrap().program;
            let posts: Vec<PostAffine> = fused
                .steps
                .iter()
                .filter_map(|s| match (&s.kind, &s.plan) {
                    (StepKind::Op(Op::Nn(NnOp::Conv(_))), Some(Plan::Conv(p))) => p.post,
                    _ => None,
                })
                .collect();
            let chains = fused
                .steps
                .iter()
                .filter(|s| matches!(&s.kind, StepKind::Op(Op::Elementwise(ElementwiseOp::Chain(_)))))
                .count();
            let p = |scale: Option<f32>, shift: Option<f32>| PostAffine { scale, shift };
            if extra_reader {
                assert_eq!(posts, [p(Some(1.37), Some(-0.21)), p(Some(-2.5), None)]);
                assert_eq!(chains, 1);
            } else {
                assert_eq!(
                    posts,
                    [
                        p(Some(1.37), Some(-0.21)),
                        p(Some(0.73), Some(0.05)),
                        p(Some(-2.5), None)
                    ]
                );
                assert_eq!(chains, 0);
            }
            let got = run(&fused, &x);
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_close(g, w, 1e-5);
            }
            // The values vary (a constant output would pass a weaker check).
            let v = want[0].to_f64_vec();
            assert!(v.iter().any(|&q| (q - v[0]).abs() > 1e-3));
        }
    }
}
