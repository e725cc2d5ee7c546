//! Identity elimination: nodes that pass their input through unchanged are removed and their
//! readers read the input instead. Covered: `Identity`, `Cast` to the input's own type,
//! inference-mode `Dropout` whose mask is unread, and `Reshape` to the input's own fixed shape.
//! A node whose output is a graph output stays (outputs keep their names).

use super::edit::{Index, dtype_of, fixed_shape, remove_nodes, replace_all, subgraphs_mut};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::ElementwiseOp;
use kiln_ops::movement::MovementOp;
use kiln_ops::reduce::ReduceOp;
use kiln_tensor::Data;
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = 0;
    for node in &mut g.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                count += run(sub)?;
            }
        }
    }
    let index = Index::new(g);
    let mut aliases = HashMap::new();
    let mut dead = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        if let Some((x, y)) = passthrough(g, &index, node)
            && !index.is_output(y)
        {
            aliases.insert(y, x);
            dead[i] = true;
        }
    }
    count += aliases.len();
    replace_all(g, &aliases);
    remove_nodes(g, &dead);
    Ok(count)
}

/// `(input, output)` of a node that copies its input to its output.
fn passthrough(g: &Graph, index: &Index, node: &Node) -> Option<(ValueId, ValueId)> {
    let NodeKind::Op(op) = &node.kind else {
        return None;
    };
    let x = node.inputs.first().copied().flatten()?;
    let y = node.outputs.first().copied().flatten()?;
    let same = match op {
        Op::Movement(MovementOp::Identity(_)) => node.inputs.len() == 1,
        Op::Elementwise(ElementwiseOp::Cast(c)) => dtype_of(g, x) == Some(c.to),
        Op::Reduce(ReduceOp::Dropout(d)) => {
            let mask_unread = match node.outputs.get(1).copied().flatten() {
                Some(m) => index.readers(m).is_empty() && !index.is_output(m),
                None => true,
            };
            let inference = match (d.ratio, node.inputs.get(2).copied().flatten()) {
                (Some(_), _) | (None, None) => true,
                (None, Some(t)) => index
                    .tensor(g, t)
                    .is_some_and(|t| matches!(t.data(), Data::Bool(v) if v.len() == 1 && v.iter().all(|b| !b))),
            };
            mask_unread && inference
        }
        Op::Movement(MovementOp::Reshape(_)) => {
            let xs = fixed_shape(g, x)?;
            let spec = match node.inputs.get(1).copied().flatten() {
                Some(s) => index.tensor(g, s)?.to_i64_vec()?,
                None => return None,
            };
            spec.len() == xs.len() && spec.iter().zip(&xs).all(|(&a, &b)| a > 0 && a as usize == b)
        }
        _ => false,
    };
    // Identity passes anything through; the others must keep a known element type.
    let typed = dtype_of(g, x).is_some() && dtype_of(g, x) == dtype_of(g, y);
    (same && (typed || matches!(op, Op::Movement(MovementOp::Identity(_))))).then_some((x, y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::UnaryOp;
    use kiln_ops::movement::Identity;

    #[test]
    fn identity_chains_disappear_but_outputs_stay() {
        // x -> Identity -> a -> Identity -> b -> Relu -> y; b2 = Identity(x) is an output.
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let id = || Op::Movement(MovementOp::Identity(Identity));
        let a = b.node(id(), &[Some(x)], &[&[2]])[0];
        let bb = b.node(id(), &[Some(a)], &[&[2]])[0];
        let y = b.unary(UnaryOp::Relu, bb, &[2]);
        let out2 = b.node(id(), &[Some(x)], &[&[2]])[0];
        let mut g = b.finish(&[y, out2]);
        assert_eq!(run(&mut g).unwrap(), 2);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Relu", "Identity"]);
        assert_eq!(g.nodes[0].inputs, vec![Some(x)]);
        let out = run_graph(&g, vec![f32s(&[2], &[-1.0, 2.0])]);
        assert_eq!(out[0], f32s(&[2], &[0.0, 2.0]));
        assert_eq!(out[1], f32s(&[2], &[-1.0, 2.0]));
    }
}
