//! Intermediate outputs (qaic's `set_output_tensors` / `enable_intermediate_outputs`): named
//! values, or every value a node computes, become extra graph outputs, so any layer can be
//! compared with a reference. They are exposed before optimisation, and passes never rewrite a
//! graph output away, so each keeps its meaning at every level.

use crate::CompileError;
use kiln_ir::{Graph, ValueId};
use kiln_ops::ValueType;

/// Adds the values named in `names` (or, with `all`, every node output of the main graph) to the
/// graph's outputs, after the model's own outputs and in graph order.
pub fn expose(graph: &mut Graph, names: &[String], all: bool) -> Result<(), CompileError> {
    let mut wanted: Vec<ValueId> = Vec::new();
    for name in names {
        let found = graph.values.iter().position(|v| &v.name == name);
        let Some(i) = found else {
            return Err(CompileError::UnknownTensor {
                name: name.clone(),
                close: close_names(graph, name),
            });
        };
        let id = ValueId(i as u32);
        if !graph.outputs.contains(&id) && !wanted.contains(&id) {
            wanted.push(id);
        }
    }
    if all {
        for node in &graph.nodes {
            for &id in node.outputs.iter().flatten() {
                let is_tensor = graph
                    .value(id)
                    .is_some_and(|v| matches!(v.ty, ValueType::Tensor(_) | ValueType::Unknown));
                if is_tensor && !graph.outputs.contains(&id) && !wanted.contains(&id) {
                    wanted.push(id);
                }
            }
        }
    }
    graph.outputs.extend(wanted);
    Ok(())
}

/// Up to five value names close to `name` (by edit distance, or containing it), for the error.
fn close_names(graph: &Graph, name: &str) -> Vec<String> {
    let mut scored: Vec<(usize, &str)> = graph
        .values
        .iter()
        .map(|v| v.name.as_str())
        .filter(|n| !n.is_empty())
        .map(|n| {
            let d = strsim::levenshtein(n, name);
            (if n.contains(name) { d.min(1) } else { d }, n)
        })
        .filter(|(d, _)| *d <= (name.len() / 3).max(2))
        .collect();
    scored.sort();
    scored.into_iter().take(5).map(|(_, n)| n.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Node, NodeKind};
    use kiln_ops::{Op, TensorType};

    fn chain() -> Graph {
        // x -> Relu -> a -> Neg -> y
        let mut g = Graph::default();
        let t = || ValueType::Tensor(TensorType::default());
        let x = g.add_value("x", t());
        let a = g.add_value("conv1_out", t());
        let y = g.add_value("y", t());
        use kiln_ops::elementwise::{ElementwiseOp, UnaryOp};
        let relu = Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu));
        let neg = Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Neg));
        for (name, op, i, o) in [("r", relu, x, a), ("n", neg, a, y)] {
            g.nodes.push(Node {
                name: name.into(),
                kind: NodeKind::Op(op),
                inputs: vec![Some(i)],
                outputs: vec![Some(o)],
                plan: None,
            });
        }
        g.inputs = vec![x];
        g.outputs = vec![y];
        g
    }

    #[test]
    fn named_and_all_outputs_are_appended_once() {
        let mut g = chain();
        expose(&mut g, &["conv1_out".into(), "y".into()], false).unwrap();
        assert_eq!(g.outputs, vec![ValueId(2), ValueId(1)]);
        let mut g = chain();
        expose(&mut g, &[], true).unwrap();
        assert_eq!(g.outputs, vec![ValueId(2), ValueId(1)]);
    }

    #[test]
    fn unknown_name_suggests_close_ones() {
        let mut g = chain();
        let e = expose(&mut g, &["conv1_ou".into()], false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "output tensor 'conv1_ou' is not a value of the model (similar: conv1_out)"
        );
    }
}
