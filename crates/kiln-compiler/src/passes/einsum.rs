//! Two-operand `Einsum`s that are a (batched) matrix product become Transpose → `MatMul` →
//! Transpose, so they run on the GEMM (with packed weights when an operand is constant: the
//! fold pass, which runs after this one, turns a constant's Transpose into a constant).
//! Transformer exports write attention and projections this way (`bhqd,bhkd->bhqk`,
//! `bij,jk->bik`), and the com.microsoft `FusedMatMul` expansion writes `...ij,...kj->...ik`.
//!
//! The labels of the equation (the ellipsis expanded into one label per dim, aligned from the
//! right as numpy broadcasts it) must split into exactly one contracted label `k` (in both
//! operands, not in the output), one row label `m` (the last in output order of the labels in
//! A and the output only), one column label `n` (likewise for B), and batch labels: those of
//! both operands and the output, and the other labels of one operand and the output, which
//! `MatMul` broadcasts, provided each operand's batch labels are the last ones of the batch
//! order (the output's). No label repeats within a term and none is summed out of one
//! operand alone. The product is the same sum of the same terms: the GEMM's order of
//! summation is the only difference, as for any MatMul.

use super::edit::{dtype_of, fresh_name, is_float, op, shape_of};
use crate::CompileError;
use kiln_ir::{Dim, Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::TensorType;
use kiln_ops::movement::{MovementOp, Transpose};
use kiln_ops::nn::{Einsum, MatMul, NnOp};

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = 0;
    let plans: Vec<Option<Product>> = g.nodes.iter().map(|n| plan(g, n)).collect();
    if plans.iter().all(Option::is_none) {
        return Ok(count);
    }
    let old = std::mem::take(&mut g.nodes);
    let mut nodes = Vec::with_capacity(old.len());
    for (node, p) in old.into_iter().zip(plans) {
        let Some(p) = p else {
            nodes.push(node);
            continue;
        };
        let (Some(Some(a)), Some(Some(b)), Some(Some(y))) =
            (node.inputs.first(), node.inputs.get(1), node.outputs.first())
        else {
            nodes.push(node);
            continue;
        };
        let (a, b, y) = (*a, *b, *y);
        let a2 = transposed(g, &mut nodes, &node.name, a, &p.perm_a);
        let b2 = transposed(g, &mut nodes, &node.name, b, &p.perm_b);
        let product = match &p.perm_out {
            None => y,
            Some(_) => {
                let ty = ValueType::Tensor(TensorType {
                    dtype: dtype_of(g, y),
                    shape: p.product_shape.clone(),
                });
                let name = fresh_name(g, &format!("{}_product", g.value_name(y)));
                g.add_value(name, ty)
            }
        };
        nodes.push(Node {
            name: node.name.clone(),
            kind: NodeKind::Op(Op::Nn(NnOp::MatMul(MatMul {}))),
            inputs: vec![Some(a2), Some(b2)],
            outputs: vec![Some(product)],
            plan: None,
        });
        if let Some(perm) = p.perm_out {
            nodes.push(transpose_node(format!("{}_out", node.name), product, y, perm));
        }
        count += 1;
    }
    g.nodes = nodes;
    Ok(count)
}

/// The transposes around the MatMul (`None`: identity).
struct Product {
    perm_a: Option<Vec<i64>>,
    perm_b: Option<Vec<i64>>,
    perm_out: Option<Vec<i64>>,
    /// The MatMul's output shape `[batch.., m, n]` (when the operands' shapes are known).
    product_shape: Option<Vec<Dim>>,
}

fn transpose_node(name: String, from: ValueId, into: ValueId, perm: Vec<i64>) -> Node {
    Node {
        name,
        kind: NodeKind::Op(Op::Movement(MovementOp::Transpose(Transpose { perm: Some(perm) }))),
        inputs: vec![Some(from)],
        outputs: vec![Some(into)],
        plan: None,
    }
}

/// `v` permuted by `perm` (a new Transpose node), or `v` itself.
fn transposed(g: &mut Graph, nodes: &mut Vec<Node>, base: &str, v: ValueId, perm: &Option<Vec<i64>>) -> ValueId {
    let Some(perm) = perm else { return v };
    let shape = shape_of(g, v).map(|s| {
        perm.iter()
            .filter_map(|&p| usize::try_from(p).ok().and_then(|p| s.get(p).cloned()))
            .collect()
    });
    let ty = ValueType::Tensor(TensorType {
        dtype: dtype_of(g, v),
        shape,
    });
    let name = fresh_name(g, &format!("{}_t", g.value_name(v)));
    let out = g.add_value(name, ty);
    nodes.push(transpose_node(
        format!("{base}_{}", g.value_name(v)),
        v,
        out,
        perm.clone(),
    ));
    out
}

/// Label ids: letters as themselves, ellipsis dims as 256 + their position from the right.
type Label = u32;

/// One term's labels, the ellipsis expanded for an operand of `rank` dims (`None` for the
/// output, where the ellipsis covers `ell` dims).
fn term(t: &str, rank: usize) -> Option<Vec<Label>> {
    let letters = t.chars().filter(char::is_ascii_alphabetic).count();
    let has_ell = t.contains("...");
    if t.chars().any(|c| !(c.is_ascii_alphabetic() || c == '.')) || (!has_ell && t.contains('.')) {
        return None;
    }
    let ell = if has_ell { rank.checked_sub(letters)? } else { 0 };
    if !has_ell && letters != rank {
        return None;
    }
    let (head, tail) = t.split_once("...").unwrap_or((t, ""));
    let mut out: Vec<Label> = head.chars().map(|c| c as Label).collect();
    out.extend((0..ell).rev().map(|i| 256 + i as Label));
    out.extend(tail.chars().map(|c| c as Label));
    Some(out)
}

fn plan(g: &Graph, node: &Node) -> Option<Product> {
    let Some(Op::Nn(NnOp::Einsum(Einsum { equation }))) = op(node) else {
        return None;
    };
    let ([Some(a), Some(b)], [Some(y)]) = (node.inputs.as_slice(), node.outputs.as_slice()) else {
        return None;
    };
    if !dtype_of(g, *a).is_some_and(is_float) || dtype_of(g, *a) != dtype_of(g, *b) {
        return None;
    }
    let (sa, sb) = (shape_of(g, *a)?, shape_of(g, *b)?);
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = eq.split_once("->")?;
    let (ta, tb) = lhs.split_once(',')?;
    if tb.contains(',') {
        return None;
    }
    let (la, lb) = (term(ta, sa.len())?, term(tb, sb.len())?);
    let ell_out = la
        .iter()
        .chain(&lb)
        .filter(|&&l| l >= 256)
        .map(|&l| l - 255)
        .max()
        .unwrap_or(0) as usize;
    let lo = term(rhs, rhs.chars().filter(char::is_ascii_alphabetic).count() + ell_out)?;
    let distinct = |t: &[Label]| t.iter().enumerate().all(|(i, l)| !t[..i].contains(l));
    if !distinct(&la) || !distinct(&lb) || !distinct(&lo) {
        return None;
    }
    if lo.iter().any(|l| !la.contains(l) && !lb.contains(l)) {
        return None;
    }
    let k: Vec<Label> = la
        .iter()
        .copied()
        .filter(|l| lb.contains(l) && !lo.contains(l))
        .collect();
    if la.iter().chain(&lb).any(|l| !lo.contains(l) && !k.contains(l)) {
        return None; // summed out of one operand alone
    }
    let [k] = k.as_slice() else { return None };
    let m = *lo.iter().rev().find(|l| la.contains(l) && !lb.contains(l))?;
    let n = *lo.iter().rev().find(|l| lb.contains(l) && !la.contains(l))?;
    let batch: Vec<Label> = lo.iter().copied().filter(|&l| l != m && l != n).collect();
    // Each operand's batch labels must be the last ones of the batch order (right-aligned
    // broadcasting), in that order.
    let suffix = |t: &[Label]| {
        let mine: Vec<Label> = batch.iter().copied().filter(|l| t.contains(l)).collect();
        batch.ends_with(&mine)
    };
    if !suffix(&la) || !suffix(&lb) {
        return None;
    }
    let pos = |t: &[Label], l: Label| t.iter().position(|&x| x == l);
    let order_a: Vec<Label> = batch
        .iter()
        .copied()
        .filter(|l| la.contains(l))
        .chain([m, *k])
        .collect();
    let order_b: Vec<Label> = batch
        .iter()
        .copied()
        .filter(|l| lb.contains(l))
        .chain([*k, n])
        .collect();
    let perm_of = |t: &[Label], order: &[Label]| -> Option<Vec<i64>> {
        order.iter().map(|&l| pos(t, l).map(|p| p as i64)).collect()
    };
    let (pa, pb) = (perm_of(&la, &order_a)?, perm_of(&lb, &order_b)?);
    let prod: Vec<Label> = batch.iter().copied().chain([m, n]).collect();
    let po = perm_of(&prod, &lo)?;
    let identity = |p: &[i64]| p.iter().enumerate().all(|(i, &x)| x == i as i64);
    // The product's shape: each label's dim from the operand that has it (a batch label of
    // both: the larger, as MatMul broadcasts; unknown when they are symbols that differ).
    let dim = |l: Label| -> Option<Dim> {
        let da = pos(&la, l).and_then(|p| sa.get(p));
        let db = pos(&lb, l).and_then(|p| sb.get(p));
        match (da, db) {
            (Some(x), None) | (None, Some(x)) => Some(x.clone()),
            (Some(Dim::Fixed(1)), Some(x)) | (Some(x), Some(Dim::Fixed(1))) => Some(x.clone()),
            (Some(x), Some(y)) if x == y => Some(x.clone()),
            _ => None,
        }
    };
    let product_shape: Option<Vec<Dim>> = prod.iter().map(|&l| dim(l)).collect();
    let _ = y;
    Some(Product {
        perm_a: (!identity(&pa)).then_some(pa),
        perm_b: (!identity(&pb)).then_some(pb),
        perm_out: (!identity(&po)).then_some(po),
        product_shape,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;

    fn einsum_graph(eq: &str, sa: &[usize], sb: &[usize], sy: &[usize]) -> Graph {
        let mut b = Builder::new();
        let a = b.input("a", sa);
        let w = b.input("b", sb);
        let op = Op::Nn(NnOp::Einsum(Einsum {
            equation: eq.to_string(),
        }));
        let y = b.node(op, &[Some(a), Some(w)], &[sy]);
        b.finish(&y)
    }

    fn check(eq: &str, sa: &[usize], sb: &[usize], sy: &[usize], ops: &[&str]) {
        let g0 = einsum_graph(eq, sa, sb, sy);
        let mut g = g0.clone();
        assert_eq!(run(&mut g).unwrap(), 1, "{eq}");
        g.verify().unwrap();
        assert_eq!(op_names(&g), ops, "{eq}");
        let (xa, xb) = (noise(sa, 1), noise(sb, 2));
        let want = run_graph(&g0, vec![xa.clone(), xb.clone()]);
        let got = run_graph(&g, vec![xa, xb]);
        assert_close(&got[0], &want[0], 1e-5);
    }

    #[test]
    fn matrix_products_become_matmuls_with_the_reference_result() {
        check("bij,jk->bik", &[2, 3, 4], &[4, 5], &[2, 3, 5], &["MatMul"]);
        check(
            "bhqd,bhkd->bhqk",
            &[2, 3, 4, 5],
            &[2, 3, 6, 5],
            &[2, 3, 4, 6],
            &["Transpose", "MatMul"],
        );
        check(
            "...ij,...kj->...ik",
            &[2, 3, 4],
            &[2, 5, 4],
            &[2, 3, 5],
            &["Transpose", "MatMul"],
        );
        check("ji,jk->ik", &[4, 3], &[4, 5], &[3, 5], &["Transpose", "MatMul"]);
        check(
            "bqd,bkd->bkq",
            &[2, 3, 4],
            &[2, 5, 4],
            &[2, 5, 3],
            &["Transpose", "MatMul", "Transpose"],
        );
        check("ik,kj->ji", &[3, 4], &[4, 5], &[5, 3], &["MatMul", "Transpose"]);
    }

    #[test]
    fn other_contractions_stay_einsums() {
        for (eq, sa, sb, sy) in [
            ("ij,j->i", &[3, 4][..], &[4][..], &[3][..]),             // matrix-vector
            ("ij,ij->ij", &[3, 4], &[3, 4], &[3, 4]),                 // elementwise
            ("ijk,jl->il", &[3, 4, 2], &[4, 5], &[3, 5]),             // k summed out of A alone
            ("ii,ij->ij", &[3, 3], &[3, 4], &[3, 4]),                 // diagonal
            ("ab,bc,cd->ad", &[2, 2], &[2, 2], &[2, 2]),              // three operands
            ("abk,bck->ac", &[2, 3, 4], &[3, 5, 4], &[2, 5]),         // two contracted labels
            ("ibh,hnd->ibnd", &[3, 2, 4], &[4, 2, 5], &[3, 2, 2, 5]), // two row and two column labels
        ] {
            let mut g = einsum_graph(eq, sa, sb, sy);
            assert_eq!(run(&mut g).unwrap(), 0, "{eq}");
            assert_eq!(op_names(&g), ["Einsum"], "{eq}");
        }
    }
}
