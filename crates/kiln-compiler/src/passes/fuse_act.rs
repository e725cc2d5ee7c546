//! Activation fusion: Relu, Clip (constant bounds), Sigmoid, HardSigmoid, HardSwish, Gelu,
//! LeakyRelu, Tanh and SiLU (`Mul(x, Sigmoid(x))`) following a Conv, Gemm, MatMul or
//! ChannelAffine become
//! the producer's epilogue (`activation`), which applies the standalone op's own evaluation to
//! the product, so results are bit-identical. Only when the product is float, has no
//! epilogue yet, and is read by the activation alone (SiLU: by its Sigmoid and Mul alone).

use super::edit::{Index, add_constant, binary, dtype_of, fixed_shape, is_float, mark, remove_nodes, unary_io};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::{BinaryOp, ElementwiseOp, UnaryOp};
use kiln_ops::fast::Plan as OpPlan;
use kiln_ops::nn::{Activation, NnOp};
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let mut taken = vec![false; g.nodes.len()];
    let mut plans = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(p) = plan(g, &index, i, node) else { continue };
        if p.remove
            .iter()
            .chain([&p.producer])
            .any(|&k| taken.get(k).copied().unwrap_or(true))
        {
            continue;
        }
        mark(&mut taken, p.remove.iter().copied().chain([p.producer]));
        plans.push(p);
    }
    let mut dead = vec![false; g.nodes.len()];
    let count = plans.len();
    for p in plans {
        // A PRelu's slopes become the Conv's input 4, a constant of its own.
        let slopes = match (&p.fused, g.nodes.get(p.producer)) {
            (Fused::Slopes(t), Some(n)) => {
                let name = format!("{}_prelu_slopes", n.name);
                Some(add_constant(g, &name, t.clone()))
            }
            _ => None,
        };
        let Some(node) = g.nodes.get_mut(p.producer) else {
            continue;
        };
        match p.fused {
            Fused::Act(act) => {
                if let NodeKind::Op(Op::Nn(NnOp::ChannelAffine(c))) = &mut node.kind {
                    c.activation = Some(act);
                } else if !node.plan_mut().is_some_and(|plan| plan.set_activation(Some(act))) {
                    continue;
                }
            }
            Fused::Slopes(_) => {
                let (Some(plan), Some(v)) = (node.plan_mut().and_then(OpPlan::conv_mut), slopes) else {
                    continue;
                };
                plan.prelu = true;
                node.inputs.resize(4, None);
                node.inputs.push(Some(v));
            }
        }
        node.outputs = vec![Some(p.output)];
        mark(&mut dead, p.remove.iter().copied());
    }
    remove_nodes(g, &dead);
    Ok(count)
}

struct Plan {
    producer: usize,
    fused: Fused,
    /// The activation's nodes.
    remove: Vec<usize>,
    /// The activation's output, which the producer now writes.
    output: ValueId,
}

/// What the producer takes over.
enum Fused {
    /// An activation ([`NodeKind`]'s plan or the ChannelAffine's).
    Act(Activation),
    /// A PRelu's slopes, one per output channel (`[M]` f32): a Conv's `prelu` and input 4.
    Slopes(kiln_tensor::Tensor),
}

/// The node producing `v` when it is an epilogue-free float Conv/Gemm/MatMul with one output.
fn fusable_producer(g: &Graph, index: &Index, v: ValueId) -> Option<usize> {
    let p = index.producer(v)?;
    let node = g.nodes.get(p)?;
    let free = matches!(
        &node.kind,
        NodeKind::Op(Op::Nn(
            NnOp::Conv(_) | NnOp::Gemm(_) | NnOp::MatMul(_) | NnOp::ChannelAffine(_)
        ))
    ) && node.activation().is_none()
        && !matches!(&node.plan, Some(OpPlan::Conv(p)) if p.prelu || p.post.is_some());
    (free && node.outputs.len() == 1 && dtype_of(g, v).is_some_and(is_float)).then_some(p)
}

fn plan(g: &Graph, index: &Index, i: usize, node: &Node) -> Option<Plan> {
    let NodeKind::Op(Op::Elementwise(op)) = &node.kind else {
        return None;
    };
    // SiLU: Mul(x, Sigmoid(x)) in either order.
    if let Some((BinaryOp::Mul, a, b)) = binary(node) {
        let output = node.outputs.first().copied().flatten()?;
        for (x, s) in [(a, b), (b, a)] {
            let Some(sp) = index.producer(s) else { continue };
            let Some(sig) = g.nodes.get(sp) else { continue };
            let is_sigmoid = matches!(
                sig.kind,
                NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Sigmoid)))
            );
            if !is_sigmoid || unary_io(sig) != Some((x, s)) || !index.sole_use(s, i) {
                continue;
            }
            let mut readers = index.readers(x).to_vec();
            readers.sort_unstable();
            let mut want = vec![sp, i];
            want.sort_unstable();
            if readers != want || index.is_output(x) {
                continue;
            }
            let producer = fusable_producer(g, index, x)?;
            return Some(Plan {
                producer,
                fused: Fused::Act(Activation::Silu),
                remove: vec![sp, i],
                output,
            });
        }
        return None;
    }
    let x = node.inputs.first().copied().flatten()?;
    let output = node.outputs.first().copied().flatten()?;
    if node.outputs.len() != 1 || !index.sole_use(x, i) {
        return None;
    }
    if let ElementwiseOp::PRelu(_) = op {
        return prelu_plan(g, index, i, node, x, output);
    }
    let act = match op {
        ElementwiseOp::Unary(u) if node.inputs.len() == 1 => Activation::from_unary(*u)?,
        ElementwiseOp::Clip(c) => {
            let dtype = dtype_of(g, x)?;
            let bound = |k: usize, attr: Option<f32>| -> Option<Option<f32>> {
                match node.inputs.get(k).copied().flatten() {
                    None => Some(attr),
                    Some(v) => {
                        let t = index.tensor(g, v)?;
                        let b = *t.to_f64_vec().first()?;
                        // The bound must survive the trip through f32 (it does for f32/f16/bf16).
                        let exact = t.len() == 1 && t.dtype() == dtype && (b as f32) as f64 == b;
                        exact.then_some(Some(b as f32))
                    }
                }
            };
            Activation::Clip {
                min: bound(1, c.min)?,
                max: bound(2, c.max)?,
            }
        }
        _ => return None,
    };
    let producer = fusable_producer(g, index, x)?;
    Some(Plan {
        producer,
        fused: Fused::Act(act),
        remove: vec![i],
        output,
    })
}

/// A PRelu of an f32 Conv's output (read by it alone) whose slope is a constant: one
/// element, as a LeakyRelu (the same f32 multiply), or one per output channel (`[M, 1, ..]`
/// or `[1, M, 1, ..]` against the output's `[N, M, ..]`), as the Conv's `prelu` slopes.
fn prelu_plan(g: &Graph, index: &Index, i: usize, node: &Node, x: ValueId, output: ValueId) -> Option<Plan> {
    let slope = node.inputs.get(1).copied().flatten()?;
    let t = index.tensor(g, slope)?;
    let shape = fixed_shape(g, x)?;
    if node.inputs.len() != 2 || t.dtype() != DType::F32 || dtype_of(g, x) != Some(DType::F32) {
        return None;
    }
    let producer = fusable_producer(g, index, x)?;
    let is_conv = g.nodes.get(producer).is_some_and(|n| {
        matches!(&n.kind, NodeKind::Op(Op::Nn(NnOp::Conv(_)))) && matches!(n.plan, None | Some(OpPlan::Conv(_)))
    });
    let values = t.as_slice::<f32>().ok()?;
    if let [alpha] = values {
        return Some(Plan {
            producer,
            fused: Fused::Act(Activation::LeakyRelu { alpha: *alpha }),
            remove: vec![i],
            output,
        });
    }
    let m = *shape.get(1)?;
    // The slope's dims right-aligned with the output's: M on the channel axis, 1 elsewhere.
    let ts = t.shape();
    let per_channel = ts.len() <= shape.len()
        && ts.len() + 1 >= shape.len()
        && ts.iter().rev().enumerate().all(|(k, &d)| {
            let axis = shape.len() - 1 - k;
            d == if axis == 1 { m } else { 1 }
        });
    if !is_conv || !per_channel || values.len() != m {
        return None;
    }
    let slopes = kiln_tensor::Tensor::from_vec(vec![m], values.to_vec()).ok()?;
    Some(Plan {
        producer,
        fused: Fused::Slopes(slopes),
        remove: vec![i],
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::Clip;
    use kiln_ops::nn::{Conv, Gemm, MatMul};

    fn conv_graph(act: impl FnOnce(&mut Builder, ValueId) -> ValueId) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 2, 5, 5]);
        let w = b.constant("w", noise(&[4, 2, 3, 3], 1));
        let bias = b.constant("b", noise(&[4], 2));
        let conv = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            ..Conv::default()
        }));
        let c = b.node(conv, &[Some(x), Some(w), Some(bias)], &[&[1, 4, 3, 3]])[0];
        let y = act(&mut b, c);
        b.finish(&[y])
    }

    fn check_fused(mut g: Graph, want: Activation) {
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        g.verify().unwrap();
        assert_eq!(g.nodes.len(), 1);
        match &g.nodes[0].kind {
            NodeKind::Op(Op::Nn(NnOp::Conv(_) | NnOp::Gemm(_) | NnOp::MatMul(_))) => {
                assert_eq!(g.nodes[0].activation(), Some(want))
            }
            k => panic!("unexpected {}", k.name()),
        }
        let inputs: Vec<_> = g
            .inputs
            .iter()
            .map(|&v| noise(&crate::passes::edit::fixed_shape(&g, v).unwrap(), 7))
            .collect();
        let (after, reference) = (run_graph(&g, inputs.clone()), run_graph(&before, inputs));
        // The same values: f32 products run the SIMD kernels, whose epilogue computes the
        // activation in registers within a few ulp of the standalone op (Relu, Clip and
        // LeakyRelu bit for bit).
        assert_eq!(after.len(), reference.len());
        for (a, r) in after.iter().zip(&reference) {
            assert_eq!(a.shape(), r.shape());
            let (a, r) = (a.to_f64_vec(), r.to_f64_vec());
            for (x, y) in a.iter().zip(&r) {
                assert!((x - y).abs() <= 1e-6 * y.abs().max(1e-3), "fused {x} vs unfused {y}");
            }
        }
    }

    #[test]
    fn unary_activations_fuse_into_conv() {
        for u in [
            UnaryOp::Relu,
            UnaryOp::Sigmoid,
            UnaryOp::Tanh,
            UnaryOp::HardSwish,
            UnaryOp::Gelu { tanh: false },
            UnaryOp::Gelu { tanh: true },
            UnaryOp::LeakyRelu { alpha: 0.1 },
            UnaryOp::HardSigmoid { alpha: 0.3, beta: 0.4 },
        ] {
            let g = conv_graph(|b, c| b.unary(u, c, &[1, 4, 3, 3]));
            check_fused(g, Activation::from_unary(u).unwrap());
        }
    }

    #[test]
    fn clip_with_constant_bounds_and_silu_fuse() {
        let g = conv_graph(|b, c| {
            let lo = b.constant("lo", f32s(&[], &[0.0]));
            let hi = b.constant("hi", f32s(&[], &[0.25]));
            let clip = Op::Elementwise(ElementwiseOp::Clip(Clip { min: None, max: None }));
            b.node(clip, &[Some(c), Some(lo), Some(hi)], &[&[1, 4, 3, 3]])[0]
        });
        check_fused(
            g,
            Activation::Clip {
                min: Some(0.0),
                max: Some(0.25),
            },
        );
        let g = conv_graph(|b, c| {
            let s = b.unary(UnaryOp::Sigmoid, c, &[1, 4, 3, 3]);
            b.binary(BinaryOp::Mul, s, c, &[1, 4, 3, 3])
        });
        check_fused(g, Activation::Silu);
    }

    #[test]
    fn gemm_and_matmul_take_epilogues() {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 3]);
        let w = b.constant("w", noise(&[3, 4], 1));
        let h = b.node(Op::Nn(NnOp::Gemm(Gemm::default())), &[Some(x), Some(w)], &[&[2, 4]])[0];
        let y = b.unary(UnaryOp::Relu, h, &[2, 4]);
        check_fused(b.finish(&[y]), Activation::Relu);
        let mut b = Builder::new();
        let x = b.input("x", &[2, 2, 3]);
        let w = b.constant("w", noise(&[3, 4], 1));
        let h = b.node(
            Op::Nn(NnOp::MatMul(MatMul::default())),
            &[Some(x), Some(w)],
            &[&[2, 2, 4]],
        )[0];
        let y = b.unary(UnaryOp::Gelu { tanh: false }, h, &[2, 2, 4]);
        check_fused(b.finish(&[y]), Activation::Gelu { tanh: false });
    }

    #[test]
    fn no_fusion_when_the_product_has_other_readers() {
        // Conv output read by Relu and also a graph output.
        let mut g = conv_graph(|b, c| b.unary(UnaryOp::Relu, c, &[1, 4, 3, 3]));
        let c = g.nodes[0].outputs[0].unwrap();
        g.outputs.push(c);
        assert_eq!(run(&mut g).unwrap(), 0);
        // Conv output read by Relu and by an Add.
        let mut g = conv_graph(|b, c| {
            let r = b.unary(UnaryOp::Relu, c, &[1, 4, 3, 3]);
            b.binary(BinaryOp::Add, r, c, &[1, 4, 3, 3])
        });
        assert_eq!(run(&mut g).unwrap(), 0);
        // Exp is not an epilogue.
        let mut g = conv_graph(|b, c| b.unary(UnaryOp::Exp, c, &[1, 4, 3, 3]));
        assert_eq!(run(&mut g).unwrap(), 0);
    }

    /// A PRelu with a slope per output channel after a Conv becomes the Conv's `prelu` (the
    /// slopes its input 4), one with a single slope a LeakyRelu; compiled programs then match
    /// level 0 on every convolution path the slopes can meet: packed channels-last (3x3 stride
    /// 2, 1x1, a few-channel image read channels-first), Winograd (3x3 stride 1), depthwise,
    /// grouped, one-dimensional, and a Conv with a fused residual.
    #[test]
    fn prelu_fuses_into_conv_and_compiled_programs_match_level_0() {
        use kiln_ops::elementwise::PRelu;
        use kiln_ops::nn::Conv;
        // (x shape, W shape, group, pads, stride, slope shape, with a residual)
        let cases: [(&[usize], &[usize], usize, usize, usize, &[usize], bool); 8] = [
            (&[1, 8, 11, 11], &[16, 8, 3, 3], 1, 1, 2, &[1, 16, 1, 1], false),
            (&[2, 16, 9, 9], &[24, 16, 1, 1], 1, 0, 1, &[24, 1, 1], false),
            (&[1, 3, 20, 20], &[10, 3, 3, 3], 1, 0, 1, &[1, 10, 1, 1], false),
            (&[1, 16, 12, 12], &[32, 16, 3, 3], 1, 1, 1, &[32, 1, 1], false),
            (&[1, 16, 10, 10], &[16, 1, 3, 3], 16, 1, 1, &[1, 16, 1, 1], false),
            (&[1, 16, 10, 10], &[32, 4, 3, 3], 4, 1, 1, &[1, 32, 1, 1], false),
            (&[1, 8, 30], &[12, 8, 5], 1, 2, 1, &[12, 1], false),
            (&[1, 8, 9, 9], &[8, 8, 3, 3], 1, 1, 1, &[1, 8, 1, 1], true),
        ];
        for (i, (xs, ws, group, pads, stride, ss, residual)) in cases.into_iter().enumerate() {
            let rank = xs.len();
            let spatial = |d: usize, k: usize| (d + 2 * pads - k) / stride + 1;
            let mut ys = vec![xs[0], ws[0]];
            for a in 2..rank {
                ys.push(spatial(xs[a], ws[a]));
            }
            let graph = || {
                let mut b = Builder::new();
                let x = b.input("x", xs);
                let w = b.constant("w", noise(ws, 1 + i as u64));
                let bias = b.constant("b", noise(&ws[..1], 2));
                let slope = b.constant("s", noise(ss, 3));
                let conv = Op::Nn(NnOp::Conv(Conv {
                    group,
                    pads: vec![pads; 2 * (rank - 2)],
                    strides: vec![stride; rank - 2],
                    ..Conv::default()
                }));
                let mut c = b.node(conv, &[Some(x), Some(w), Some(bias)], &[&ys])[0];
                if residual {
                    let r = b.input("r", &ys);
                    c = b.binary(BinaryOp::Add, c, r, &ys);
                }
                let y = b.node(
                    Op::Elementwise(ElementwiseOp::PRelu(PRelu)),
                    &[Some(c), Some(slope)],
                    &[&ys],
                )[0];
                b.finish(&[y])
            };
            let level = |opt_level| crate::CompileOptions {
                opt_level,
                ..crate::CompileOptions::default()
            };
            let fast = crate::compile(graph(), &level(2)).unwrap();
            let plain = crate::compile(graph(), &level(0)).unwrap();
            let ops: Vec<(&str, bool)> = fast
                .program
                .steps
                .iter()
                .filter_map(|s| match (&s.kind, &s.plan) {
                    (kiln_runtime::StepKind::Op(op), Some(OpPlan::Conv(p))) => Some((op.name(), p.prelu)),
                    (kiln_runtime::StepKind::Op(op), _) => Some((op.name(), false)),
                    _ => None,
                })
                .filter(|(n, _)| *n != "Transpose" && *n != "Squeeze" && *n != "Unsqueeze")
                .collect();
            assert_eq!(ops, [("Conv", true)], "case {i}");
            let mut inputs = vec![("x".to_string(), kiln_ops::Value::Tensor(noise(xs, 9)))];
            if residual {
                inputs.push(("r".to_string(), kiln_ops::Value::Tensor(noise(&ys, 10))));
            }
            let a = kiln_runtime::run(&fast.program, inputs.clone()).unwrap();
            let b = kiln_runtime::run(&plain.program, inputs).unwrap();
            let (a, b) = (a[0].1.as_tensor().unwrap(), b[0].1.as_tensor().unwrap());
            assert!(b.to_f64_vec().iter().any(|&v| v < 0.0), "case {i}: no negative output");
            assert_close(a, b, 1e-5);
        }
        // One slope: a LeakyRelu.
        check_fused(
            conv_graph(|b, c| {
                let s = b.constant("s", kiln_tensor::Tensor::from_vec(vec![1], vec![0.25f32]).unwrap());
                b.node(
                    Op::Elementwise(ElementwiseOp::PRelu(kiln_ops::elementwise::PRelu)),
                    &[Some(c), Some(s)],
                    &[&[1, 4, 3, 3]],
                )[0]
            }),
            Activation::LeakyRelu { alpha: 0.25 },
        );
    }
}
