//! Common-subexpression elimination: equal constants (same type, shape and bits, up to
//! [`MAX_DEDUP_ELEMENTS`] elements) merge, then nodes with the same op (attributes included)
//! reading the same inputs merge into the first one. Nondeterministic ops and control flow
//! never merge, and a value that is a graph output is never merged away.

use super::edit::{Index, remove_nodes, subgraphs_mut};
use super::is_nondeterministic;
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, ValueId};
use kiln_tensor::{DType, Data, Tensor};
use std::collections::HashMap;

/// Largest constant (in elements) compared for merging.
const MAX_DEDUP_ELEMENTS: usize = 1 << 16;

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
    let mut alias: HashMap<ValueId, ValueId> = HashMap::new();

    // Constants.
    let mut seen: HashMap<(DType, Vec<usize>, Vec<u8>), ValueId> = HashMap::new();
    for (id, v) in &g.constants {
        let Some(t) = v.as_tensor() else { continue };
        if t.len() > MAX_DEDUP_ELEMENTS || index.is_output(*id) {
            continue;
        }
        let Some(bits) = bits(t) else { continue };
        let key = (t.dtype(), t.shape().to_vec(), bits);
        match seen.get(&key) {
            Some(&first) => {
                alias.insert(*id, first);
            }
            None => {
                seen.insert(key, *id);
            }
        }
    }
    g.constants.retain(|(id, _)| !alias.contains_key(id));
    count += alias.len();

    // Nodes, in order, each reading through the merges made so far.
    let mut by_inputs: HashMap<Vec<Option<ValueId>>, Vec<usize>> = HashMap::new();
    let mut dead = vec![false; g.nodes.len()];
    for j in 0..g.nodes.len() {
        let Some(node) = g.nodes.get_mut(j) else { break };
        for v in node.inputs.iter_mut().flatten() {
            if let Some(&to) = alias.get(v) {
                *v = to;
            }
        }
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                for cap in &mut sub.captures {
                    if let Some(&to) = alias.get(&cap.outer) {
                        cap.outer = to;
                    }
                }
            }
            continue;
        }
        let NodeKind::Op(op) = &node.kind else { continue };
        if is_nondeterministic(op) || node.outputs.iter().flatten().any(|&o| index.is_output(o)) {
            continue;
        }
        let key = node.inputs.clone();
        let (earlier, rest) = g.nodes.split_at(j);
        let Some(this) = rest.first() else { break };
        let candidates = by_inputs.entry(key).or_default();
        let twin = candidates.iter().find_map(|&i| {
            earlier.get(i).filter(|e| {
                e.kind == this.kind
                    && e.outputs.len() == this.outputs.len()
                    && e.outputs
                        .iter()
                        .zip(&this.outputs)
                        .all(|(a, b)| a.is_some() || b.is_none())
            })
        });
        match twin {
            Some(e) => {
                for (a, b) in e.outputs.iter().zip(&this.outputs) {
                    if let (Some(a), Some(b)) = (a, b) {
                        alias.insert(*b, *a);
                    }
                }
                if let Some(d) = dead.get_mut(j) {
                    *d = true;
                }
                count += 1;
            }
            None => candidates.push(j),
        }
    }
    remove_nodes(g, &dead);
    Ok(count)
}

/// The exact bits of a tensor's elements (`None` for strings).
fn bits(t: &Tensor) -> Option<Vec<u8>> {
    match t.data() {
        Data::Bool(v) => Some(v.iter().map(|&b| b as u8).collect()),
        Data::Str(_) => None,
        d => d.as_bytes().map(<[u8]>::to_vec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::{BinaryOp, UnaryOp};

    #[test]
    fn equal_nodes_and_constants_merge() {
        // y = Relu(x + c1) * Relu(x + c2), c1 == c2: one Add, one Relu remain.
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let c1 = b.constant("c1", f32s(&[2], &[1.0, -2.0]));
        let c2 = b.constant("c2", f32s(&[2], &[1.0, -2.0]));
        let c3 = b.constant("c3", f32s(&[2], &[1.0, -0.0]));
        let c4 = b.constant("c4", f32s(&[2], &[1.0, 0.0]));
        let a1 = b.binary(BinaryOp::Add, x, c1, &[2]);
        let a2 = b.binary(BinaryOp::Add, x, c2, &[2]);
        let r1 = b.unary(UnaryOp::Relu, a1, &[2]);
        let r2 = b.unary(UnaryOp::Relu, a2, &[2]);
        let y = b.binary(BinaryOp::Mul, r1, r2, &[2]);
        // -0.0 and 0.0 compare equal but are different constants: they do not merge.
        let d1 = b.binary(BinaryOp::Div, x, c3, &[2]);
        let d2 = b.binary(BinaryOp::Div, x, c4, &[2]);
        let mut g = b.finish(&[y, d1, d2]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 3);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Add", "Relu", "Mul", "Div", "Div"]);
        assert_eq!(g.constants.len(), 3);
        let xin = f32s(&[2], &[0.5, 3.0]);
        let out = run_graph(&g, vec![xin.clone()]);
        assert_eq!(out, run_graph(&before, vec![xin]));
        assert_eq!(out[0], f32s(&[2], &[2.25, 1.0]));
        assert_eq!(out[1].as_slice::<f32>().unwrap()[1], f32::NEG_INFINITY);
        assert_eq!(out[2].as_slice::<f32>().unwrap()[1], f32::INFINITY);
    }
}
