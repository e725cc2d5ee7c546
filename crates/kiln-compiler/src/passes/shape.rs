//! Shape-arithmetic simplification: once symbols are bound, `Shape` and `Size` of values whose
//! static shape is fully known become constants (with the ops' own `fold_static`), so the
//! Gather/Concat/Reshape arithmetic exporters build on them folds away in the next pass.

use super::edit::{remove_nodes, subgraphs_mut};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, ValueType};
use kiln_ops::InferInput;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = 0;
    for node in &mut g.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                count += run(sub)?;
            }
        }
    }
    let mut dead = vec![false; g.nodes.len()];
    let mut new_constants = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let NodeKind::Op(op) = &node.kind else { continue };
        let [Some(out)] = node.outputs.as_slice() else {
            continue;
        };
        let types: Vec<ValueType> = node
            .inputs
            .iter()
            .map(|v| v.and_then(|v| g.value(v)).map_or(ValueType::Unknown, |i| i.ty.clone()))
            .collect();
        let inputs: Vec<InferInput<'_>> = node
            .inputs
            .iter()
            .zip(&types)
            .map(|(v, ty)| InferInput {
                ty,
                konst: None,
                present: v.is_some(),
            })
            .collect();
        if let Some(v) = op.fold_static(&inputs) {
            new_constants.push((*out, v));
            dead[i] = true;
            count += 1;
        }
    }
    g.constants.extend(new_constants);
    remove_nodes(g, &dead);
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ir::Op;
    use kiln_ops::movement::{MovementOp, Shape};
    use kiln_tensor::DType;

    #[test]
    fn shape_of_a_static_value_becomes_a_constant() {
        // Reshape(x, Shape(y)) with y of static shape [2, 3]: the Shape folds.
        let mut b = Builder::new();
        let x = b.input("x", &[6]);
        let y = b.input("y", &[2, 3]);
        let shape = Op::Movement(MovementOp::Shape(Shape { start: 0, end: None }));
        let s = b.node_typed(shape, &[Some(y)], &[(DType::I64, &[2])])[0];
        let r = b.node(reshape(), &[Some(x), Some(s)], &[&[2, 3]])[0];
        let mut g = b.finish(&[r]);
        assert_eq!(run(&mut g).unwrap(), 1);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Reshape"]);
        let out = run_graph(&g, vec![noise(&[6], 1), noise(&[2, 3], 2)]);
        assert_eq!(out[0].shape(), &[2, 3]);
        assert_eq!(out[0], noise(&[6], 1).reshape(vec![2, 3]).unwrap());
    }
}
