//! Transposes that only move dims of size 1 become Reshapes: with the other dims in the same
//! order, the elements keep their order in memory, so the data need not move (a Reshape whose
//! input dies at its step is a view at run time, where a Transpose copies). Exporters emit
//! these around batch-1 layout changes: torchvision's `nn.MultiheadAttention` turns
//! `[1, S, E]` into `[S, 1, E]` and back in every block, and the layout pass's way back to
//! channels-first after a global pooling is `[1, 1, 1, C]` to `[1, C, 1, 1]`.
//!
//! Rewritten only when the input's and the output's shapes are fully known, every dim is at
//! least 1 (a Reshape target of 0 would copy an input dim) and the permutation is valid.
//!
//! First, a Transpose of a Transpose's output reads the first one's input with the composed
//! permutation, and is removed when that is the identity (unless its output is a graph
//! output): the layout pass's way back to channels-first next to a model's own permutation
//! to channels-last (ConvNeXt's blocks: `permute(0, 2, 3, 1)` after each depthwise
//! convolution, which runs channels-last) is no move at all. The first Transpose stays for
//! its other readers, if any (`dce` removes it otherwise).

use super::edit::{Index, fixed_shape, op, remove_nodes, replace_all, subgraphs_mut};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op, ValueId};
use kiln_ops::movement::{MovementOp, Reshape, Transpose};
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
    count += compose_pairs(g);
    let mut rewrites = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(Op::Movement(MovementOp::Transpose(Transpose { perm }))) = op(node) else {
            continue;
        };
        let ([Some(x)], [Some(y)]) = (node.inputs.as_slice(), node.outputs.as_slice()) else {
            continue;
        };
        let (Some(from), Some(to)) = (fixed_shape(g, *x), fixed_shape(g, *y)) else {
            continue;
        };
        if moves_only_unit_dims(&from, perm.as_deref()) && to.iter().all(|&d| d >= 1) && from.len() == to.len() {
            let Ok(spec) = to.iter().map(|&d| i64::try_from(d)).collect::<Result<Vec<i64>, _>>() else {
                continue;
            };
            rewrites.push((i, spec));
        }
    }
    for (i, spec) in &rewrites {
        if let Some(node) = g.nodes.get_mut(*i) {
            node.kind = NodeKind::Op(Op::Movement(MovementOp::Reshape(Reshape {
                shape: Some(spec.clone()),
                allowzero: false,
            })));
        }
    }
    Ok(count + rewrites.len())
}

/// Composes Transposes of Transposes (see the module docs); returns the rewrites made.
fn compose_pairs(g: &mut Graph) -> usize {
    let index = Index::new(g);
    let mut aliases: HashMap<ValueId, ValueId> = HashMap::new();
    let mut dead = vec![false; g.nodes.len()];
    let mut count = 0;
    // In graph order, so a chain composes front to back (each node reads its producer's
    // rewritten form).
    for i in 0..g.nodes.len() {
        let Some(node) = g.nodes.get(i) else { break };
        let (Some(Op::Movement(MovementOp::Transpose(Transpose { perm: Some(q) }))), [Some(y)], [Some(z)]) =
            (op(node), node.inputs.as_slice(), node.outputs.as_slice())
        else {
            continue;
        };
        let (q, y, z) = (q.clone(), *y, *z);
        let Some(first) = index.producer(y).and_then(|p| g.nodes.get(p)) else {
            continue;
        };
        let (Some(Op::Movement(MovementOp::Transpose(Transpose { perm: Some(p) }))), [Some(x)]) =
            (op(first), first.inputs.as_slice())
        else {
            continue;
        };
        let Some(r) = compose(p, &q) else { continue };
        let x = *x;
        let identity = r.iter().enumerate().all(|(a, &b)| usize::try_from(b) == Ok(a));
        if identity && !index.is_output(z) {
            aliases.insert(z, x);
            if let Some(d) = dead.get_mut(i) {
                *d = true;
            }
        }
        if let Some(node) = g.nodes.get_mut(i) {
            node.inputs = vec![Some(x)];
            node.kind = NodeKind::Op(Op::Movement(MovementOp::Transpose(Transpose { perm: Some(r) })));
        }
        count += 1;
    }
    replace_all(g, &aliases);
    remove_nodes(g, &dead);
    count
}

/// The permutation of `transpose(transpose(x, p), q)` as one Transpose of `x`: `r[i] =
/// p[q[i]]`. `None` unless both are permutations of the same rank.
fn compose(p: &[i64], q: &[i64]) -> Option<Vec<i64>> {
    let valid = |v: &[i64]| {
        let mut seen = vec![false; v.len()];
        v.iter()
            .all(|&a| match usize::try_from(a).ok().and_then(|a| seen.get_mut(a)) {
                Some(s) if !*s => {
                    *s = true;
                    true
                }
                _ => false,
            })
    };
    if p.len() != q.len() || !valid(p) || !valid(q) {
        return None;
    }
    q.iter()
        .map(|&b| usize::try_from(b).ok().and_then(|b| p.get(b).copied()))
        .collect()
}

/// Whether `perm` (absent: reversed axes) is a permutation of `shape`'s axes that keeps the
/// axes of size other than 1 in their order, with every dim at least 1.
fn moves_only_unit_dims(shape: &[usize], perm: Option<&[i64]>) -> bool {
    let rank = shape.len();
    let perm: Vec<usize> = match perm {
        Some(p) => match p.iter().map(|&a| usize::try_from(a)).collect::<Result<Vec<usize>, _>>() {
            Ok(p) => p,
            Err(_) => return false,
        },
        None => (0..rank).rev().collect(),
    };
    let mut seen = vec![false; rank];
    for &a in &perm {
        match seen.get_mut(a) {
            Some(s) if !*s => *s = true,
            _ => return false,
        }
    }
    if perm.len() != rank || shape.contains(&0) {
        return false;
    }
    let kept: Vec<usize> = perm.into_iter().filter(|&a| shape.get(a) != Some(&1)).collect();
    kept.windows(2).all(|w| w[0] < w[1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::{Builder, noise, op_names, run_graph};

    fn transpose(perm: &[i64]) -> Op {
        Op::Movement(MovementOp::Transpose(Transpose {
            perm: Some(perm.to_vec()),
        }))
    }

    #[test]
    fn permutations_compose() {
        // NHWC -> NCHW, then NCHW -> NHWC: nothing moves.
        assert_eq!(compose(&[0, 3, 1, 2], &[0, 2, 3, 1]), Some(vec![0, 1, 2, 3]));
        // [a, b, c] -> [b, c, a] -> swap the last two: [b, a, c].
        assert_eq!(compose(&[1, 2, 0], &[0, 2, 1]), Some(vec![1, 0, 2]));
        assert_eq!(compose(&[0, 1], &[0, 1, 2]), None);
        assert_eq!(compose(&[0, 0], &[1, 0]), None);
        assert_eq!(compose(&[0, 1], &[2, 0]), None);
    }

    #[test]
    fn transposes_of_transposes_read_the_first_input() {
        // x -> NCHW (also read by an Add) -> back to NHWC -> Relu; and a chain of three that
        // composes to one real transpose.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 4, 5, 3]);
        let y = b.node(transpose(&[0, 3, 1, 2]), &[Some(x)], &[&[1, 3, 4, 5]])[0];
        let z = b.node(transpose(&[0, 2, 3, 1]), &[Some(y)], &[&[1, 4, 5, 3]])[0];
        let r = b.unary(kiln_ops::elementwise::UnaryOp::Relu, z, &[1, 4, 5, 3]);
        let s = b.binary(kiln_ops::elementwise::BinaryOp::Add, y, y, &[1, 3, 4, 5]);
        let t1 = b.node(transpose(&[1, 0, 2, 3]), &[Some(s)], &[&[3, 1, 4, 5]])[0];
        let t2 = b.node(transpose(&[0, 1, 3, 2]), &[Some(t1)], &[&[3, 1, 5, 4]])[0];
        let t3 = b.node(transpose(&[3, 2, 1, 0]), &[Some(t2)], &[&[4, 5, 1, 3]])[0];
        let g = b.finish(&[r, t3]);
        let inputs = vec![noise(&[1, 4, 5, 3], 7)];
        let want = run_graph(&g, inputs.clone());
        let mut h = g.clone();
        assert_eq!(compose_pairs(&mut h), 3);
        // The pair is gone; t2 and t3 read s directly (t1 and t2 are left for dce).
        assert_eq!(
            op_names(&h),
            ["Transpose", "Relu", "Add", "Transpose", "Transpose", "Transpose"]
        );
        let got = run_graph(&h, inputs);
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.shape(), g.shape());
            assert_eq!(w.as_slice::<f32>().unwrap(), g.as_slice::<f32>().unwrap());
        }
    }

    #[test]
    fn only_moves_of_unit_dims_keep_memory_order() {
        // [1, 197, 768] -> [197, 1, 768]: the batch dim moves, nothing else.
        assert!(moves_only_unit_dims(&[1, 197, 768], Some(&[1, 0, 2])));
        // [1, 1, 1, C] -> [1, C, 1, 1].
        assert!(moves_only_unit_dims(&[1, 1, 1, 64], Some(&[0, 3, 1, 2])));
        // A real transpose: two dims of size > 1 swap.
        assert!(!moves_only_unit_dims(&[1, 197, 768], Some(&[0, 2, 1])));
        // The default (reversed) perm of [1, 5]: only the unit dim moves; of [2, 3]: a swap.
        assert!(moves_only_unit_dims(&[1, 5], None));
        assert!(!moves_only_unit_dims(&[2, 3], None));
        // Invalid perms and empty tensors are left alone.
        assert!(!moves_only_unit_dims(&[1, 4], Some(&[0, 0])));
        assert!(!moves_only_unit_dims(&[1, 4], Some(&[1, 2])));
        assert!(!moves_only_unit_dims(&[1, 4], Some(&[-1, 0])));
        assert!(!moves_only_unit_dims(&[1, 4], Some(&[1])));
        assert!(!moves_only_unit_dims(&[0, 1, 4], Some(&[1, 0, 2])));
    }
}
