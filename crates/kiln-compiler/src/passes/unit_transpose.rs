//! Transposes that only move dims of size 1 become Reshapes: with the other dims in the same
//! order, the elements keep their order in memory, so the data need not move (a Reshape whose
//! input dies at its step is a view at run time, where a Transpose copies). Exporters emit
//! these around batch-1 layout changes: torchvision's `nn.MultiheadAttention` turns
//! `[1, S, E]` into `[S, 1, E]` and back in every block, and the layout pass's way back to
//! channels-first after a global pooling is `[1, 1, 1, C]` to `[1, C, 1, 1]`.
//!
//! Rewritten only when the input's and the output's shapes are fully known, every dim is at
//! least 1 (a Reshape target of 0 would copy an input dim) and the permutation is valid.

use super::edit::{fixed_shape, op, subgraphs_mut};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op};
use kiln_ops::movement::{MovementOp, Reshape, Transpose};

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = 0;
    for node in &mut g.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                count += run(sub)?;
            }
        }
    }
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
