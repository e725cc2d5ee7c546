//! Residual fusion: `Add(Conv(...), R)` or `Add(MatMul(...), R)` (either operand order)
//! becomes one Conv or MatMul with R as its residual input (input 3), added in the GEMM
//! epilogue after the bias and before any activation, so the sum never makes its own pass over
//! memory. A later activation (the ResNet block's Relu) then fuses onto that node as usual;
//! a transformer block's skip connections (after the attention's output projection and the
//! MLP's second layer) go into those MatMuls.
//!
//! Only when the producer is f32, has no activation yet, is read by the Add alone, and R has
//! its output's static shape exactly (no broadcasting). The fused node takes the Add's place
//! in the node order (both operands exist there) and the producer's name.

use super::edit::{Index, binary, dtype_of, fixed_shape, mark, remove_nodes};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op, ValueId};
use kiln_ops::elementwise::BinaryOp;
use kiln_ops::nn::NnOp;
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let mut taken = vec![false; g.nodes.len()];
    // (the Add's position, the producer's position, the residual)
    let mut plans: Vec<(usize, usize, ValueId)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some((BinaryOp::Add, a, b)) = binary(node) else {
            continue;
        };
        if node.outputs.len() != 1 {
            continue;
        }
        for (c, r) in [(a, b), (b, a)] {
            if c == r || !index.sole_use(c, i) || index.is_output(c) {
                continue;
            }
            let Some(p) = index.producer(c) else { continue };
            let Some(producer) = g.nodes.get(p) else { continue };
            let activation = match &producer.kind {
                NodeKind::Op(Op::Nn(NnOp::Conv(_) | NnOp::MatMul(_))) => producer.activation(),
                _ => continue,
            };
            let shape = fixed_shape(g, c);
            let ok = activation.is_none()
                && producer.inputs.len() <= 3
                && producer.outputs.len() == 1
                && dtype_of(g, c) == Some(DType::F32)
                && dtype_of(g, r) == Some(DType::F32)
                && shape.is_some()
                && shape == fixed_shape(g, r);
            if !ok || taken.get(p).copied().unwrap_or(true) || taken.get(i).copied().unwrap_or(true) {
                continue;
            }
            mark(&mut taken, [p, i]);
            plans.push((i, p, r));
            break;
        }
    }
    let mut dead = vec![false; g.nodes.len()];
    for &(i, p, r) in &plans {
        let Some(producer) = g.nodes.get(p).cloned() else {
            continue;
        };
        let Some(add) = g.nodes.get_mut(i) else { continue };
        let mut inputs = producer.inputs;
        inputs.resize(3, None);
        inputs.push(Some(r));
        add.name = producer.name;
        add.kind = producer.kind;
        add.inputs = inputs;
        if let Some(d) = dead.get_mut(p) {
            *d = true;
        }
    }
    remove_nodes(g, &dead);
    Ok(plans.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::{Binary, ElementwiseOp};
    use kiln_ops::nn::{Activation, Conv};

    fn add() -> Op {
        Op::Elementwise(ElementwiseOp::Binary(Binary {
            op: BinaryOp::Add,
            legacy_axis: None,
        }))
    }

    /// x -> Conv -> Add(conv, x) [-> Relu], with the residual on either side of the Add.
    fn block(conv_first: bool, relu: bool, bias: bool) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 4, 6, 6]);
        let w = b.constant("w", noise(&[4, 4, 3, 3], 1));
        let bv = bias.then(|| b.constant("b", noise(&[4], 2)));
        let conv = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            pads: vec![1, 1, 1, 1],
            ..Conv::default()
        }));
        let c = b.node(conv, &[Some(x), Some(w), bv], &[&[1, 4, 6, 6]])[0];
        let ins = if conv_first {
            [Some(c), Some(x)]
        } else {
            [Some(x), Some(c)]
        };
        let mut y = b.node(add(), &ins, &[&[1, 4, 6, 6]])[0];
        if relu {
            let r = Op::Elementwise(ElementwiseOp::Unary(kiln_ops::elementwise::UnaryOp::Relu));
            y = b.node(r, &[Some(y)], &[&[1, 4, 6, 6]])[0];
        }
        b.finish(&[y])
    }

    fn same(a: &Graph, b: &Graph) {
        let inputs = vec![noise(&[1, 4, 6, 6], 9)];
        let (x, y) = (run_graph(a, inputs.clone()), run_graph(b, inputs));
        for (p, q) in x.iter().zip(&y) {
            assert_eq!(p.shape(), q.shape());
            for (u, v) in p.to_f64_vec().iter().zip(q.to_f64_vec()) {
                assert!((u - v).abs() <= 1e-6 * v.abs().max(1e-3), "fused {u} vs unfused {v}");
            }
        }
    }

    #[test]
    fn add_after_conv_becomes_its_residual_then_relu_fuses() {
        for conv_first in [true, false] {
            for bias in [true, false] {
                let before = block(conv_first, true, bias);
                let mut g = before.clone();
                assert_eq!(run(&mut g).unwrap(), 1);
                g.verify().unwrap();
                assert_eq!(crate::passes::fuse_act::run(&mut g).unwrap(), 1);
                g.verify().unwrap();
                assert_eq!(g.nodes.len(), 1);
                let n = &g.nodes[0];
                assert_eq!(n.inputs.len(), 4);
                assert_eq!(n.inputs[3], Some(g.inputs[0]));
                match &n.kind {
                    NodeKind::Op(Op::Nn(NnOp::Conv(_))) => assert_eq!(n.activation(), Some(Activation::Relu)),
                    k => panic!("unexpected {}", k.name()),
                }
                same(&g, &before);
            }
        }
    }

    /// x [2, 5, 8] -> MatMul(W [8, 8]) -> Add(bias) -> Add(x) (the skip connection on either
    /// side), at level 2 (bias and residual in the prepacked MatMul's epilogue) against level 0.
    #[test]
    fn skip_connection_after_a_matmul_becomes_its_residual() {
        use crate::{CompileOptions, compile};
        use kiln_ops::Value;
        use kiln_ops::nn::MatMul;
        use kiln_runtime::StepKind;
        for mm_first in [true, false] {
            let mut b = Builder::new();
            let x = b.input("x", &[2, 5, 8]);
            let w = b.constant("w", noise(&[8, 8], 1));
            let bias = b.constant("b", noise(&[8], 2));
            let mm = b.node(
                Op::Nn(NnOp::MatMul(MatMul::default())),
                &[Some(x), Some(w)],
                &[&[2, 5, 8]],
            )[0];
            let h = b.node(add(), &[Some(mm), Some(bias)], &[&[2, 5, 8]])[0];
            let ins = if mm_first {
                [Some(h), Some(x)]
            } else {
                [Some(x), Some(h)]
            };
            let y = b.node(add(), &ins, &[&[2, 5, 8]])[0];
            let g = b.finish(&[y]);
            let level = |opt_level| CompileOptions {
                opt_level,
                ..CompileOptions::default()
            };
            let fast = compile(g.clone(), &level(2)).unwrap().program;
            let plain = compile(g, &level(0)).unwrap().program;
            let kinds: Vec<&str> = fast.steps.iter().map(|s| s.kind.name()).collect();
            assert_eq!(kinds, ["MatMul"], "mm_first {mm_first}");
            let step = &fast.steps[0];
            assert_eq!(step.inputs.len(), 4);
            match &step.kind {
                StepKind::Op(Op::Nn(NnOp::MatMul(_))) => assert!(matches!(
                    &step.plan,
                    Some(kiln_ops::fast::Plan::Gemm(p)) if p.packed_b.is_some()
                )),
                k => panic!("unexpected {}", k.name()),
            }
            let input = noise(&[2, 5, 8], 7);
            let run = |p: &kiln_runtime::Program| {
                let out = kiln_runtime::run(p, vec![("x".into(), Value::Tensor(input.clone()))]).unwrap();
                out[0].1.as_tensor().unwrap().clone()
            };
            let (got, want) = (run(&fast), run(&plain));
            assert_eq!(got.shape(), want.shape());
            // Same additions in the same order, each rounded: the same floats.
            assert_eq!(got.as_slice::<f32>().unwrap(), want.as_slice::<f32>().unwrap());
        }
    }

    #[test]
    fn broadcast_or_shared_or_activated_convs_stay() {
        // The residual broadcasts (a per-channel constant): not fused.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 4, 6, 6]);
        let w = b.constant("w", noise(&[4, 4, 1, 1], 1));
        let k = b.constant("k", noise(&[4, 1, 1], 3));
        let conv = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            ..Conv::default()
        }));
        let c = b.node(conv, &[Some(x), Some(w)], &[&[1, 4, 6, 6]])[0];
        let y = b.node(add(), &[Some(c), Some(k)], &[&[1, 4, 6, 6]])[0];
        let mut g = b.finish(&[y]);
        assert_eq!(run(&mut g).unwrap(), 0);
        // The Conv's output is also a graph output: not fused.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 4, 6, 6]);
        let w = b.constant("w", noise(&[4, 4, 1, 1], 1));
        let conv = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            ..Conv::default()
        }));
        let c = b.node(conv, &[Some(x), Some(w)], &[&[1, 4, 6, 6]])[0];
        let y = b.node(add(), &[Some(c), Some(x)], &[&[1, 4, 6, 6]])[0];
        let mut g = b.finish(&[y, c]);
        assert_eq!(run(&mut g).unwrap(), 0);
    }
}
