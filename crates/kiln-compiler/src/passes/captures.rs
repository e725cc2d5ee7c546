//! Constants a subgraph captures from its enclosing graph become the subgraph's own
//! constants: inside an If branch or a Loop body, a Conv's or MatMul's weights are then
//! constants the fusions, the layout pass and the weight packing see, as in the main graph
//! (Silero VAD's whole network sits in a sample-rate If, its weights outer initializers).
//! The capture is dropped; an outer constant no one else reads is left to `dce`. Tensors
//! share their storage, so a copy costs no weight memory. Nested subgraphs are handled from
//! the outside in: what a branch now holds as a constant, its own subgraphs can take in turn.

use super::edit::subgraphs_mut;
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Value, ValueId};
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let constants: HashMap<ValueId, Value> = g.constants.iter().cloned().collect();
    let mut moved = 0;
    for node in &mut g.nodes {
        let NodeKind::Control(c) = &mut node.kind else {
            continue;
        };
        for sub in subgraphs_mut(c) {
            let before = sub.captures.len();
            let mut kept = Vec::with_capacity(before);
            for cap in std::mem::take(&mut sub.captures) {
                match constants.get(&cap.outer) {
                    Some(v) => sub.constants.push((cap.inner, v.clone())),
                    None => kept.push(cap),
                }
            }
            moved += before - kept.len();
            sub.captures = kept;
            moved += run(sub)?;
        }
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Capture, ControlFlow, IfNode, Node, ValueType};
    use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp};
    use kiln_ops::{Op, TensorType};
    use kiln_tensor::{DType, Tensor};

    /// y = If(cond) then x + w else x - w, `w` an outer constant both branches capture.
    fn graph() -> Graph {
        let f32s = || ValueType::Tensor(TensorType::fixed(DType::F32, &[2]));
        let mut g = Graph::default();
        let cond = g.add_value("cond", ValueType::Tensor(TensorType::fixed(DType::Bool, &[])));
        let x = g.add_value("x", f32s());
        let w = g.add_value("w", f32s());
        let y = g.add_value("y", f32s());
        g.inputs = vec![cond, x];
        g.outputs = vec![y];
        let wt = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
        g.constants.push((w, Value::Tensor(wt)));
        let branch = |op: BinaryOp| {
            let mut b = Graph::default();
            let xi = b.add_value("x", f32s());
            let wi = b.add_value("w", f32s());
            let out = b.add_value("out", f32s());
            b.captures = vec![Capture { outer: x, inner: xi }, Capture { outer: w, inner: wi }];
            b.nodes.push(Node {
                name: "op".into(),
                kind: NodeKind::Op(Op::Elementwise(ElementwiseOp::Binary(Binary { op, legacy_axis: None }))),
                inputs: vec![Some(xi), Some(wi)],
                outputs: vec![Some(out)],
                plan: None,
            });
            b.outputs = vec![out];
            b
        };
        g.nodes.push(Node {
            name: "if".into(),
            kind: NodeKind::Control(ControlFlow::If(IfNode {
                then_branch: branch(BinaryOp::Add),
                else_branch: branch(BinaryOp::Sub),
            })),
            inputs: vec![Some(cond)],
            outputs: vec![Some(y)],
            plan: None,
        });
        g
    }

    #[test]
    fn captured_constants_become_the_branches_own() {
        let g0 = graph();
        let mut g = g0.clone();
        assert_eq!(run(&mut g).unwrap(), 2);
        g.verify().unwrap();
        let NodeKind::Control(ControlFlow::If(n)) = &g.nodes[0].kind else {
            panic!("not an If")
        };
        for b in [&n.then_branch, &n.else_branch] {
            // x (an input) stays captured; w is the branch's constant now.
            assert_eq!(b.captures.len(), 1);
            assert_eq!(b.constants.len(), 1);
        }
        // The same results either way.
        for cond in [true, false] {
            let inputs = || {
                vec![
                    Tensor::from_vec(vec![], vec![cond]).unwrap(),
                    Tensor::from_vec(vec![2], vec![10.0f32, 20.0]).unwrap(),
                ]
            };
            let want = crate::passes::testutil::run_graph(&g0, inputs());
            let got = crate::passes::testutil::run_graph(&g, inputs());
            assert_eq!(got[0].as_slice::<f32>().unwrap(), want[0].as_slice::<f32>().unwrap());
            let expect: [f32; 2] = if cond { [11.0, 22.0] } else { [9.0, 18.0] };
            assert_eq!(got[0].as_slice::<f32>().unwrap(), expect);
        }
    }
}
