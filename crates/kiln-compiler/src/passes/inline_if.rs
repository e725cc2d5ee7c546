//! An If whose condition is a constant becomes the nodes of the branch it takes, spliced into
//! the enclosing graph in its place. Exporters guard code on shapes (`If(Equal(Size(x), 0))`,
//! a batch of one squeezed, a state of the right rank): once a program is compiled for bound
//! shapes, `shape` and `fold` make those conditions constants, and the branch then runs as part
//! of its graph, planned and fused with it, instead of as a sub-program per run.
//!
//! The branch's values get fresh ids (and names unique in the graph); its captures read the
//! outer values directly; its constants become the graph's. Readers of the If's outputs read the
//! branch's results instead, except graph outputs, which keep their ids: an Identity writes
//! them. Innermost Ifs go first, so a branch arrives with its own constant Ifs already spliced.

use super::edit::{Index, replace_all, subgraphs_mut};
use super::identity;
use crate::CompileError;
use kiln_ir::{ControlFlow, Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::movement::{Identity, MovementOp};
use std::collections::{HashMap, HashSet};

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    // A spliced branch may hold Ifs of conditions that only the enclosing graph knows as
    // constants (captured, not yet the branch's own): another round takes those. Each round
    // removes at least one If, so this ends.
    let mut count = 0;
    loop {
        let n = once(g)?;
        if n == 0 {
            return Ok(count);
        }
        count += n;
    }
}

fn once(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = 0;
    for node in &mut g.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                count += once(sub)?;
            }
        }
    }
    let index = Index::new(g);
    let taken: Vec<Option<bool>> = g.nodes.iter().map(|n| constant_branch(g, &index, n)).collect();
    if taken.iter().all(Option::is_none) {
        return Ok(count);
    }
    let mut names: HashSet<String> = g.values.iter().map(|v| v.name.clone()).collect();
    let mut aliases: HashMap<ValueId, ValueId> = HashMap::new();
    let old = std::mem::take(&mut g.nodes);
    let mut nodes = Vec::with_capacity(old.len());
    for (node, then) in old.into_iter().zip(taken) {
        let (Some(then), NodeKind::Control(ControlFlow::If(ifn))) = (then, &node.kind) else {
            nodes.push(node);
            continue;
        };
        let branch = if then { &ifn.then_branch } else { &ifn.else_branch };
        // A branch must produce one value per output the If declares (verify checks the
        // graph, not this pairing): otherwise the node stays and the runtime reports it.
        if branch.outputs.len() != node.outputs.len() {
            nodes.push(node);
            continue;
        }
        let NodeKind::Control(ControlFlow::If(ifn)) = node.kind else {
            continue;
        };
        let branch = if then { ifn.then_branch } else { ifn.else_branch };
        let results = splice(g, &mut names, branch, &node.name, &mut nodes);
        for (k, (out, res)) in node.outputs.iter().zip(results).enumerate() {
            let Some(out) = *out else { continue };
            if index.is_output(out) {
                nodes.push(Node {
                    name: format!("{}/output{k}", node.name),
                    kind: NodeKind::Op(Op::Movement(MovementOp::Identity(Identity))),
                    inputs: vec![Some(res)],
                    outputs: vec![Some(out)],
                    plan: None,
                });
            } else {
                aliases.insert(out, res);
            }
        }
        count += 1;
    }
    g.nodes = nodes;
    replace_all(g, &aliases);
    // The branch's outputs were its graph outputs, which Identity elimination keeps; here they
    // are plain values.
    identity::run(g)?;
    Ok(count)
}

/// Which branch node `n` takes, when it is an If of a constant condition (the runtime's rule:
/// the first element, nonzero is true).
fn constant_branch(g: &Graph, index: &Index, n: &Node) -> Option<bool> {
    let NodeKind::Control(ControlFlow::If(_)) = &n.kind else {
        return None;
    };
    let cond = n.inputs.first().copied().flatten()?;
    let c = index.tensor(g, cond)?.to_f64_vec().first().copied()?;
    Some(c != 0.0)
}

/// Moves `branch`'s values, constants and nodes into `g` (nodes appended to `nodes`) and returns
/// the outer ids of its outputs.
fn splice(
    g: &mut Graph,
    names: &mut HashSet<String>,
    branch: Graph,
    prefix: &str,
    nodes: &mut Vec<Node>,
) -> Vec<ValueId> {
    let mut map: Vec<Option<ValueId>> = vec![None; branch.values.len()];
    for cap in &branch.captures {
        if let Some(m) = map.get_mut(cap.inner.index()) {
            *m = Some(cap.outer);
        }
    }
    for (i, info) in branch.values.into_iter().enumerate() {
        let Some(m) = map.get_mut(i) else { continue };
        if m.is_some() {
            continue;
        }
        let name = unique(names, &info.name, prefix);
        *m = Some(g.add_value(name, info.ty));
    }
    let at = |v: ValueId| map.get(v.index()).copied().flatten().unwrap_or(v);
    for (v, c) in branch.constants {
        g.constants.push((at(v), c));
    }
    for mut node in branch.nodes {
        node.inputs.iter_mut().flatten().for_each(|v| *v = at(*v));
        node.outputs.iter_mut().flatten().for_each(|v| *v = at(*v));
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                for cap in &mut sub.captures {
                    cap.outer = at(cap.outer);
                }
            }
        }
        nodes.push(node);
    }
    branch.outputs.into_iter().map(at).collect()
}

/// `base` when no value of the graph has that name yet, else `prefix/base` (numbered if need be).
fn unique(names: &mut HashSet<String>, base: &str, prefix: &str) -> String {
    let mut name = base.to_string();
    if names.contains(&name) {
        name = format!("{prefix}/{base}");
        let stem = name.clone();
        let mut k = 1;
        while names.contains(&name) {
            name = format!("{stem}_{k}");
            k += 1;
        }
    }
    names.insert(name.clone());
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::{Builder, f32s, run_graph};
    use kiln_ir::{Capture, IfNode, ValueType};
    use kiln_ops::TensorType;
    use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp};
    use kiln_tensor::{DType, Tensor};

    fn f32t() -> ValueType {
        ValueType::Tensor(TensorType::fixed(DType::F32, &[2]))
    }

    fn bin(op: BinaryOp, a: ValueId, b: ValueId, out: ValueId) -> Node {
        Node {
            name: format!("{op:?}"),
            kind: NodeKind::Op(Op::Elementwise(ElementwiseOp::Binary(Binary { op, legacy_axis: None }))),
            inputs: vec![Some(a), Some(b)],
            outputs: vec![Some(out)],
            plan: None,
        }
    }

    fn if_node(name: &str, cond: ValueId, then_branch: Graph, else_branch: Graph, out: ValueId) -> Node {
        Node {
            name: name.into(),
            kind: NodeKind::Control(ControlFlow::If(IfNode {
                then_branch,
                else_branch,
            })),
            inputs: vec![Some(cond)],
            outputs: vec![Some(out)],
            plan: None,
        }
    }

    /// `y = If(c1) { a = x + w; If(c2) { a * a } else { a - w } } else { x - w }`, `z = y * x`;
    /// outputs y and z. `w` and both conditions are outer constants the branches capture (the
    /// `captures` pass has not run: the capture path is tested too).
    fn graph(c1: bool, c2: bool) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let w = b.constant("w", f32s(&[2], &[1.0, 2.0]));
        let cond1 = b.constant("c1", Tensor::from_vec(vec![], vec![c1]).unwrap());
        let cond2 = b.constant("c2", Tensor::from_vec(vec![], vec![c2]).unwrap());
        let y = b.g.add_value("y", f32t());
        let z = b.g.add_value("z", f32t());
        // The inner If, inside the then branch: captures `a` (a branch value) and `w`.
        let mut then = Graph::default();
        let (tx, tw, tc2) = (
            then.add_value("x", f32t()),
            then.add_value("w", f32t()),
            then.add_value("c2", ValueType::Tensor(TensorType::fixed(DType::Bool, &[]))),
        );
        let a = then.add_value("a", f32t());
        let r = then.add_value("r", f32t());
        then.captures = vec![
            Capture { outer: x, inner: tx },
            Capture { outer: w, inner: tw },
            Capture {
                outer: cond2,
                inner: tc2,
            },
        ];
        let mut inner_then = Graph::default();
        let (ia, o1) = (inner_then.add_value("a", f32t()), inner_then.add_value("sq", f32t()));
        inner_then.captures = vec![Capture { outer: a, inner: ia }];
        inner_then.nodes.push(bin(BinaryOp::Mul, ia, ia, o1));
        inner_then.outputs = vec![o1];
        let mut inner_else = Graph::default();
        let (ea, ew, o2) = (
            inner_else.add_value("a", f32t()),
            inner_else.add_value("w", f32t()),
            inner_else.add_value("y", f32t()),
        );
        inner_else.captures = vec![Capture { outer: a, inner: ea }, Capture { outer: tw, inner: ew }];
        inner_else.nodes.push(bin(BinaryOp::Sub, ea, ew, o2));
        inner_else.outputs = vec![o2];
        then.nodes.push(bin(BinaryOp::Add, tx, tw, a));
        then.nodes.push(if_node("inner", tc2, inner_then, inner_else, r));
        then.outputs = vec![r];
        let mut els = Graph::default();
        let (ex, ew, eo) = (
            els.add_value("x", f32t()),
            els.add_value("w", f32t()),
            els.add_value("d", f32t()),
        );
        els.captures = vec![Capture { outer: x, inner: ex }, Capture { outer: w, inner: ew }];
        els.nodes.push(bin(BinaryOp::Sub, ex, ew, eo));
        els.outputs = vec![eo];
        b.g.nodes.push(if_node("outer", cond1, then, els, y));
        b.g.nodes.push(bin(BinaryOp::Mul, y, x, z));
        b.finish(&[y, z])
    }

    #[test]
    fn constant_ifs_become_their_taken_branches_nested_ones_too() {
        let x = [3.0f32, -4.0];
        for (c1, c2) in [(true, true), (true, false), (false, true)] {
            let g0 = graph(c1, c2);
            let mut g = g0.clone();
            // The outer If and, when the then branch is taken, the inner one (whose condition
            // the branch captures: a second round splices it).
            assert_eq!(run(&mut g).unwrap(), if c1 { 2 } else { 1 });
            g.verify().unwrap();
            assert!(
                g.nodes.iter().all(|n| matches!(n.kind, NodeKind::Op(_))),
                "{c1} {c2}: an If is left"
            );
            // The graph outputs keep their ids and names.
            assert_eq!(g.outputs.len(), 2);
            assert_eq!(g.value_name(g.outputs[0]), "y");
            let y: Vec<f32> = x
                .iter()
                .zip([1.0f32, 2.0])
                .map(|(&x, w)| match (c1, c2) {
                    (true, true) => (x + w) * (x + w),
                    (true, false) => x + w - w,
                    _ => x - w,
                })
                .collect();
            let z: Vec<f32> = y.iter().zip(x).map(|(y, x)| y * x).collect();
            let input = || vec![Tensor::from_vec(vec![2], x.to_vec()).unwrap()];
            for got in [run_graph(&g, input()), run_graph(&g0, input())] {
                assert_eq!(got[0].as_slice::<f32>().unwrap(), y.as_slice(), "{c1} {c2}");
                assert_eq!(got[1].as_slice::<f32>().unwrap(), z.as_slice(), "{c1} {c2}");
            }
        }
    }

    #[test]
    fn an_if_of_a_runtime_condition_stays() {
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let c = b.input_typed("c", DType::Bool, &[]);
        let y = b.g.add_value("y", f32t());
        let branch = |op: BinaryOp| {
            let mut s = Graph::default();
            let (sx, o) = (s.add_value("x", f32t()), s.add_value("o", f32t()));
            s.captures = vec![Capture { outer: x, inner: sx }];
            s.nodes.push(bin(op, sx, sx, o));
            s.outputs = vec![o];
            s
        };
        b.g.nodes
            .push(if_node("if", c, branch(BinaryOp::Add), branch(BinaryOp::Mul), y));
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 0);
        assert_eq!(g, before);
    }
}
