//! Dead-code elimination: nodes none of whose outputs is read (by a node, a subgraph capture or
//! the graph's outputs) are removed, unread outputs of the remaining nodes become absent, and
//! constants nothing reads are dropped. Subgraphs are cleaned first, and captures they no
//! longer read are dropped, so the outer values they held can die too. Graph inputs stay.

use super::edit::{remove_nodes, subgraphs_mut};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind};

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = 0;
    for node in &mut g.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                count += run(sub)?;
                count += prune_captures(sub);
            }
        }
    }
    let mut live = vec![false; g.values.len()];
    let mark = |live: &mut Vec<bool>, v: kiln_ir::ValueId| {
        if let Some(x) = live.get_mut(v.index()) {
            *x = true;
        }
    };
    for &o in &g.outputs {
        mark(&mut live, o);
    }
    let mut dead = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter_mut().enumerate().rev() {
        let is_live = |v: &kiln_ir::ValueId| live.get(v.index()).copied().unwrap_or(true);
        if !node.outputs.iter().flatten().any(is_live) {
            dead[i] = true;
            count += 1;
            continue;
        }
        for out in &mut node.outputs {
            if out.is_some_and(|v| !is_live(&v)) {
                *out = None;
            }
        }
        for v in node.inputs.iter().flatten() {
            mark(&mut live, *v);
        }
        if let NodeKind::Control(c) = &node.kind {
            for sub in c.subgraphs() {
                for cap in &sub.captures {
                    mark(&mut live, cap.outer);
                }
            }
        }
    }
    remove_nodes(g, &dead);
    let before = g.constants.len();
    g.constants
        .retain(|(v, _)| live.get(v.index()).copied().unwrap_or(true));
    count += before - g.constants.len();
    Ok(count)
}

/// Drops the captures of a subgraph that nothing in it reads; returns how many.
fn prune_captures(sub: &mut Graph) -> usize {
    let mut read = vec![false; sub.values.len()];
    let mut mark = |v: kiln_ir::ValueId| {
        if let Some(x) = read.get_mut(v.index()) {
            *x = true;
        }
    };
    for &o in &sub.outputs {
        mark(o);
    }
    for node in &sub.nodes {
        for v in node.inputs.iter().flatten() {
            mark(*v);
        }
        if let NodeKind::Control(c) = &node.kind {
            for inner in c.subgraphs() {
                for cap in &inner.captures {
                    mark(cap.outer);
                }
            }
        }
    }
    let before = sub.captures.len();
    sub.captures
        .retain(|c| read.get(c.inner.index()).copied().unwrap_or(true));
    before - sub.captures.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ir::{Capture, ControlFlow, IfNode, Node, ValueType};
    use kiln_ops::TensorType;
    use kiln_ops::elementwise::{BinaryOp, UnaryOp};
    use kiln_tensor::{DType, Tensor};

    #[test]
    fn unread_nodes_and_constants_go_outputs_and_inputs_stay() {
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let unused_in = b.input("unused", &[2]);
        let c = b.constant("c", f32s(&[2], &[1.0, 1.0]));
        let _c_dead = b.constant("c_dead", f32s(&[2], &[5.0, 5.0]));
        let dead1 = b.binary(BinaryOp::Add, x, c, &[2]);
        let _dead2 = b.unary(UnaryOp::Neg, dead1, &[2]);
        let y = b.unary(UnaryOp::Relu, x, &[2]);
        let mut g = b.finish(&[y]);
        assert_eq!(run(&mut g).unwrap(), 4);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Relu"]);
        assert_eq!(g.inputs, vec![x, unused_in]);
        assert!(g.constants.is_empty());
        let out = run_graph(&g, vec![f32s(&[2], &[-1.0, 3.0]), f32s(&[2], &[0.0, 0.0])]);
        assert_eq!(out[0], f32s(&[2], &[0.0, 3.0]));
    }

    #[test]
    fn captured_values_stay_until_the_subgraph_stops_reading_them() {
        // If(cond) { then: Neg(cap_a) ; else: Relu(x_else_const) }, with a dead node in the
        // else branch reading a captured value `b`: `b`'s capture and producer go, `a` stays.
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let cond = b.input_typed("cond", DType::Bool, &[]);
        let a = b.unary(UnaryOp::Relu, x, &[2]);
        let bv = b.unary(UnaryOp::Neg, x, &[2]);
        let t = || ValueType::Tensor(TensorType::fixed(DType::F32, &[2]));
        let mut then_g = Graph {
            name: "then".into(),
            ..Graph::default()
        };
        let ca = then_g.add_value("a", t());
        let ty = then_g.add_value("ty", t());
        then_g.captures.push(Capture { outer: a, inner: ca });
        then_g.nodes.push(Node {
            name: "neg".into(),
            kind: NodeKind::Op(kiln_ir::Op::Elementwise(kiln_ops::elementwise::ElementwiseOp::Unary(
                UnaryOp::Neg,
            ))),
            inputs: vec![Some(ca)],
            outputs: vec![Some(ty)],
            plan: None,
        });
        then_g.outputs = vec![ty];
        let mut else_g = Graph {
            name: "else".into(),
            ..Graph::default()
        };
        let cb = else_g.add_value("b", t());
        let dead = else_g.add_value("dead", t());
        let k = else_g.add_value("k", t());
        else_g.captures.push(Capture { outer: bv, inner: cb });
        else_g
            .constants
            .push((k, kiln_ops::Value::Tensor(f32s(&[2], &[7.0, 8.0]))));
        else_g.nodes.push(Node {
            name: "dead".into(),
            kind: NodeKind::Op(kiln_ir::Op::Elementwise(kiln_ops::elementwise::ElementwiseOp::Unary(
                UnaryOp::Abs,
            ))),
            inputs: vec![Some(cb)],
            outputs: vec![Some(dead)],
            plan: None,
        });
        else_g.outputs = vec![k];
        let y = b.g.add_value("y", t());
        b.g.nodes.push(Node {
            name: "if".into(),
            kind: NodeKind::Control(ControlFlow::If(IfNode {
                then_branch: then_g,
                else_branch: else_g,
            })),
            inputs: vec![Some(cond)],
            outputs: vec![Some(y)],
            plan: None,
        });
        let mut g = b.finish(&[y]);
        // The dead Abs, the else capture of `b`, then the outer Neg producing `b`.
        assert_eq!(run(&mut g).unwrap(), 3);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Relu", "If"]);
        let xin = f32s(&[2], &[-1.0, 3.0]);
        let yes = Tensor::from_vec(vec![], vec![true]).unwrap();
        let no = Tensor::from_vec(vec![], vec![false]).unwrap();
        assert_eq!(run_graph(&g, vec![xin.clone(), yes])[0], f32s(&[2], &[0.0, -3.0]));
        assert_eq!(run_graph(&g, vec![xin, no])[0], f32s(&[2], &[7.0, 8.0]));
    }
}
