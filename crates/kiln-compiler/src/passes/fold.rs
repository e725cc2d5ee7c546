//! Constant folding: a node whose inputs are all constants is evaluated at compile time with
//! `Op::eval` (the code the runtime runs, so there is one source of semantics) and replaced by
//! constants.
//!
//! Not folded: nondeterministic ops (random generators, Dropout), nodes whose
//! output types are not tensors of a known shape of at most [`MAX_FOLDED_ELEMENTS`] elements
//! (a ConstantOfShape with a huge shape is never materialised), and nodes whose evaluation
//! fails: those stay, and the runtime reports the error with the node's name.

use super::edit::{remove_nodes, subgraphs_mut};
use super::is_nondeterministic;
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op, ValueId};
use kiln_ops::quant::QuantOp;
use kiln_ops::{Args, Value};
use std::collections::HashMap;

/// Largest output (in elements) a folded node may have.
pub(crate) const MAX_FOLDED_ELEMENTS: usize = 1 << 22;

/// Largest output of a folded DequantizeLinear: quantized weights become the f32 constants the
/// float kernels read (a BERT word embedding is 11.7M); bigger ones stay quantized and are
/// dequantized per run, so a large int8 model is never expanded fourfold in memory.
pub(crate) const MAX_FOLDED_DEQUANTIZED: usize = 1 << 26;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    fold_where(g, |_| true)
}

/// Folds the nodes of `g` and its subgraphs whose op `wanted` accepts and whose inputs are all
/// constants.
pub(crate) fn fold_where(g: &mut Graph, wanted: fn(&Op) -> bool) -> Result<usize, CompileError> {
    let mut count = 0;
    for node in &mut g.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                count += fold_where(sub, wanted)?;
            }
        }
    }
    let mut konst: HashMap<ValueId, usize> = g.constants.iter().enumerate().map(|(i, (v, _))| (*v, i)).collect();
    let mut dead = vec![false; g.nodes.len()];
    for (i, is_dead) in dead.iter_mut().enumerate() {
        // Stopped (cancelled or out of time): the rest stays unfolded; the pipeline reports it.
        if kiln_kernels::stop::requested() {
            break;
        }
        let is_wanted = g
            .nodes
            .get(i)
            .is_some_and(|n| matches!(&n.kind, NodeKind::Op(op) if wanted(op)));
        if !is_wanted {
            continue;
        }
        let Some(folded) = fold_node(g, i, &konst) else {
            continue;
        };
        for (id, v) in folded {
            konst.insert(id, g.constants.len());
            g.constants.push((id, v));
        }
        *is_dead = true;
        count += 1;
    }
    remove_nodes(g, &dead);
    Ok(count)
}

/// The constants replacing node `i`'s outputs, when it folds.
fn fold_node(g: &Graph, i: usize, konst: &HashMap<ValueId, usize>) -> Option<Vec<(ValueId, Value)>> {
    let node = g.nodes.get(i)?;
    let NodeKind::Op(op) = &node.kind else {
        return None;
    };
    if is_nondeterministic(op) || node.inputs.iter().all(Option::is_none) {
        return None;
    }
    let mut args: Vec<Option<&Value>> = Vec::with_capacity(node.inputs.len());
    for inp in &node.inputs {
        match inp {
            None => args.push(None),
            Some(v) => args.push(Some(&g.constants.get(*konst.get(v)?)?.1)),
        }
    }
    // Bound the result before computing it: every output a tensor of known, small shape.
    let cap = match op {
        Op::Quant(QuantOp::DequantizeLinear(_)) => MAX_FOLDED_DEQUANTIZED,
        _ => MAX_FOLDED_ELEMENTS,
    };
    for out in node.outputs.iter().flatten() {
        let shape = g.value(*out)?.ty.tensor()?.fixed_shape()?;
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        if n > cap {
            return None;
        }
    }
    let mut outs = op.eval(&Args::new(&args)).ok()?.into_iter();
    let mut folded = Vec::new();
    for out in &node.outputs {
        let v = outs.next();
        let Some(id) = out else { continue };
        let v = v?;
        if v.as_tensor().is_none_or(|t| t.len() > cap) {
            return None;
        }
        folded.push((*id, v));
    }
    Some(folded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::BinaryOp;
    use kiln_tensor::Tensor;

    #[test]
    fn folds_constant_chains_and_keeps_live_inputs() {
        // y = x + (c1 * c2): the Mul folds, the Add (reading the input x) stays.
        let mut b = Builder::new();
        let x = b.input("x", &[3]);
        let c1 = b.constant("c1", Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap());
        let c2 = b.constant("c2", Tensor::from_vec(vec![3], vec![2.0f32, 2.0, 2.0]).unwrap());
        let m = b.binary(BinaryOp::Mul, c1, c2, &[3]);
        let y = b.binary(BinaryOp::Add, x, m, &[3]);
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Add"]);
        let x_in = Tensor::from_vec(vec![3], vec![1.0f32, 1.0, 1.0]).unwrap();
        let out = run_graph(&g, vec![x_in.clone()]);
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &[3.0, 5.0, 7.0]);
        assert_eq!(out, run_graph(&before, vec![x_in]));
    }

    #[test]
    fn failing_and_oversized_folds_stay() {
        // A Reshape of 3 elements to [2] fails: it stays for the runtime to report.
        let mut b = Builder::new();
        let c = b.constant("c", Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap());
        let s = b.constant("s", Tensor::from_vec(vec![1], vec![2i64]).unwrap());
        let r = b.node(reshape(), &[Some(c), Some(s)], &[&[2]]);
        // A ConstantOfShape of 2^30 elements is never materialised.
        let big = b.constant("big", Tensor::from_vec(vec![2], vec![1i64 << 15, 1 << 15]).unwrap());
        let z = b.node(constant_of_shape(), &[Some(big)], &[&[1 << 15, 1 << 15]]);
        let mut g = b.finish(&[r[0], z[0]]);
        assert_eq!(run(&mut g).unwrap(), 0);
        assert_eq!(op_names(&g), ["Reshape", "ConstantOfShape"]);
    }
}
