//! Static type and shape inference over symbolic dims, and symbol binding.

use crate::graph::{ControlFlow, Graph, NodeKind, ValueId};
use kiln_ops::{Args, Dim, InferInput, Op, OpError, TensorType, Value, ValueType};
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
#[error("node '{node}' ({op}): {source}")]
pub struct InferError {
    pub node: String,
    pub op: String,
    #[source]
    pub source: OpError,
}

/// Infers the type of every node output from its inputs, in node order, keeping whichever of
/// the declared and inferred type is more precise.
///
/// Small shape-arithmetic values are propagated along the way: a node whose output follows from
/// input types (Shape, Size of fixed-shape inputs) or from small known inputs (elementwise and
/// data-movement ops and reductions over at most [`FOLD_LIMIT`] elements) gets its output value computed by
/// the op's own evaluation, so e.g. a Reshape fed by Shape→Gather→Concat still gets its shape.
/// These values only inform inference; the graph itself is not changed.
pub fn infer_types(graph: &mut Graph) -> Result<(), InferError> {
    infer_with(graph, HashMap::new())
}

/// [`infer_types`] with `known` values to start from (an If branch's captures of values its
/// enclosing graph knows).
fn infer_with(graph: &mut Graph, mut known: HashMap<ValueId, Value>) -> Result<(), InferError> {
    for i in 0..graph.nodes.len() {
        infer_branches(graph, i, &known)?;
        let inferred = {
            let node = &graph.nodes[i];
            let input_types: Vec<ValueType> = node
                .inputs
                .iter()
                .map(|v| {
                    v.and_then(|v| graph.value(v))
                        .map_or(ValueType::Unknown, |info| info.ty.clone())
                })
                .collect();
            match &node.kind {
                NodeKind::Op(op) => {
                    let inputs: Vec<InferInput<'_>> = node
                        .inputs
                        .iter()
                        .zip(&input_types)
                        .map(|(v, ty)| InferInput {
                            ty,
                            konst: v.and_then(|v| graph.constant(v).or_else(|| known.get(&v))),
                            present: v.is_some(),
                        })
                        .collect();
                    let types =
                        kiln_ops::fast::infer(op, node.plan.as_ref(), &inputs).map_err(|source| InferError {
                            node: node.name.clone(),
                            op: op.name().to_string(),
                            source,
                        })?;
                    // An output inference already knows to be large is never evaluated here
                    // (ConstantOfShape, Expand or Tile of a few constants can ask for 2^30
                    // elements: the load_onnx fuzz target made one allocate 4.5 GiB).
                    let small = types.iter().all(|t| {
                        t.tensor().and_then(|tt| tt.fixed_shape()).is_none_or(|s| {
                            s.iter()
                                .try_fold(1usize, |n, &d| n.checked_mul(d))
                                .is_some_and(|n| n <= FOLD_LIMIT)
                        })
                    });
                    let folded = if small { fold(op, &inputs) } else { Vec::new() };
                    drop(inputs);
                    for (out, v) in node.outputs.iter().zip(folded) {
                        if let (Some(id), Some(v)) = (out, v) {
                            known.insert(*id, v);
                        }
                    }
                    types
                }
                NodeKind::Control(c) => control_output_types(c, node.outputs.len()),
            }
        };
        let outputs = graph.nodes[i].outputs.clone();
        for (out, ty) in outputs.iter().zip(inferred) {
            if let Some(id) = out {
                merge_into(graph, *id, ty);
            }
        }
    }
    Ok(())
}

/// Largest input (in elements) a node may have for inference to evaluate it.
pub const FOLD_LIMIT: usize = 4096;

/// Output values of a node computable during inference, per output.
fn fold(op: &Op, inputs: &[InferInput<'_>]) -> Vec<Option<Value>> {
    if let Some(v) = op.fold_static(inputs) {
        return vec![Some(v)];
    }
    // Only deterministic families (reductions too: image-size arithmetic takes the larger of
    // two dims with a ReduceMax); a node with no inputs (e.g. a random generator) is not
    // folded.
    if !matches!(op, Op::Elementwise(_) | Op::Movement(_) | Op::Reduce(_)) || inputs.is_empty() {
        return Vec::new();
    }
    let mut args = Vec::with_capacity(inputs.len());
    for inp in inputs {
        match inp.konst {
            Some(v) => {
                if v.as_tensor().is_none_or(|t| t.len() > FOLD_LIMIT) {
                    return Vec::new();
                }
                args.push(Some(v));
            }
            None if !inp.present => args.push(None),
            None => return Vec::new(),
        }
    }
    match op.eval(&Args::new(&args)) {
        Ok(outs)
            if outs
                .iter()
                .all(|v| v.as_tensor().is_some_and(|t| t.len() <= FOLD_LIMIT)) =>
        {
            outs.into_iter().map(Some).collect()
        }
        _ => Vec::new(),
    }
}

/// The types inside node `i`'s If branches: each captured value takes its outer value's
/// type (known by now, where the importer saw it before inference), then the branch is
/// inferred like a graph of its own, so its nodes get the shapes the passes and fast paths
/// need (a model whose work sits in a branch, as Silero VAD's sample-rate If). Loop and Scan
/// bodies keep their declared types: their carried values may change shape per iteration.
fn infer_branches(graph: &mut Graph, i: usize, known: &HashMap<ValueId, Value>) -> Result<(), InferError> {
    let Some(NodeKind::Control(ControlFlow::If(node))) = graph.nodes.get(i).map(|n| &n.kind) else {
        return Ok(());
    };
    let outer_type = |v: ValueId| graph.value(v).map_or(ValueType::Unknown, |x| x.ty.clone());
    let types: [Vec<(ValueId, ValueType)>; 2] = [&node.then_branch, &node.else_branch]
        .map(|b| b.captures.iter().map(|c| (c.inner, outer_type(c.outer))).collect());
    // Captured constants (and small values inference computed) are known inside too: a
    // branch's Pad or Reshape reading the enclosing graph's pads or shape gets its shape.
    let values: [HashMap<ValueId, Value>; 2] = [&node.then_branch, &node.else_branch].map(|b| {
        b.captures
            .iter()
            .filter_map(|c| {
                Some((
                    c.inner,
                    graph.constant(c.outer).or_else(|| known.get(&c.outer))?.clone(),
                ))
            })
            .collect()
    });
    let Some(NodeKind::Control(ControlFlow::If(node))) = graph.nodes.get_mut(i).map(|n| &mut n.kind) else {
        return Ok(());
    };
    let mut failed = None;
    for ((branch, types), values) in [&mut node.then_branch, &mut node.else_branch]
        .into_iter()
        .zip(types)
        .zip(values)
    {
        let before = branch.clone();
        for (inner, ty) in types {
            merge_into(branch, inner, ty);
        }
        if let Err(e) = infer_with(branch, values) {
            // A branch that cannot run on these shapes is an error only when it is taken (the
            // 8 kHz branch of a sample-rate If, given a 16 kHz window): it keeps the types it
            // had, and if it ever runs, the runtime reports the node that fails.
            *branch = before;
            if let Some(first) = failed.replace(e) {
                // Neither branch can run: every run would fail.
                return Err(first);
            }
        }
    }
    Ok(())
}

fn control_output_types(c: &ControlFlow, n: usize) -> Vec<ValueType> {
    let body_out = |g: &Graph, skip: usize| -> Vec<ValueType> {
        g.outputs
            .iter()
            .skip(skip)
            .map(|&v| g.value(v).map_or(ValueType::Unknown, |i| i.ty.clone()))
            .collect()
    };
    let mut out: Vec<ValueType> = match c {
        ControlFlow::If(node) => {
            let a = body_out(&node.then_branch, 0);
            let b = body_out(&node.else_branch, 0);
            a.into_iter()
                .zip(b)
                .map(|(a, b)| if a == b { a } else { loosen(&a, &b) })
                .collect()
        }
        // Loop/Scan outputs gain a leading dim for scan outputs; only dtypes are carried here.
        ControlFlow::Loop(node) => body_out(&node.body, 1).iter().map(dtype_only).collect(),
        ControlFlow::Scan(node) => body_out(&node.body, 0).iter().map(dtype_only).collect(),
        ControlFlow::SequenceMap(node) => body_out(&node.body, 0)
            .iter()
            .map(|t| ValueType::Sequence(Box::new(dtype_only(t))))
            .collect(),
        // The output type comes from the declared value info.
        ControlFlow::FlexAttention(_) => Vec::new(),
    };
    out.resize(n, ValueType::Unknown);
    out
}

fn dtype_only(t: &ValueType) -> ValueType {
    match t {
        ValueType::Tensor(t) => ValueType::Tensor(TensorType::dtype_only(t.dtype)),
        other => other.clone(),
    }
}

/// The common part of two types (e.g. the branches of an If).
fn loosen(a: &ValueType, b: &ValueType) -> ValueType {
    match (a, b) {
        (ValueType::Tensor(x), ValueType::Tensor(y)) => {
            let dtype = if x.dtype == y.dtype { x.dtype } else { None };
            let shape = match (&x.shape, &y.shape) {
                (Some(s), Some(t)) if s.len() == t.len() => Some(
                    s.iter()
                        .zip(t)
                        .map(|(p, q)| if p == q { p.clone() } else { Dim::fresh() })
                        .collect(),
                ),
                _ => None,
            };
            ValueType::Tensor(TensorType { dtype, shape })
        }
        _ => ValueType::Unknown,
    }
}

fn merge_into(graph: &mut Graph, id: ValueId, inferred: ValueType) {
    let Some(info) = graph.values.get_mut(id.index()) else {
        return;
    };
    info.ty = merge(&info.ty, &inferred);
}

/// Combines a declared and an inferred type, keeping the more precise facts of each.
pub(crate) fn merge(declared: &ValueType, inferred: &ValueType) -> ValueType {
    match (declared, inferred) {
        (ValueType::Unknown, t) | (t, ValueType::Unknown) => t.clone(),
        (ValueType::Tensor(d), ValueType::Tensor(i)) => {
            let dtype = i.dtype.or(d.dtype);
            let shape = match (&d.shape, &i.shape) {
                (None, s) | (s, None) => s.clone(),
                (Some(ds), Some(is)) if ds.len() == is.len() => Some(
                    ds.iter()
                        .zip(is)
                        .map(|(a, b)| match (a, b) {
                            (_, Dim::Fixed(n)) => Dim::Fixed(*n),
                            (Dim::Fixed(n), _) => Dim::Fixed(*n),
                            (Dim::Sym(s), _) => Dim::Sym(s.clone()),
                        })
                        .collect(),
                ),
                (_, s) => s.clone(),
            };
            ValueType::Tensor(TensorType { dtype, shape })
        }
        (_, t) => t.clone(),
    }
}

/// Replaces every occurrence of the named symbols by their values, in this graph and its
/// subgraphs, then re-runs inference so bound dims propagate.
pub fn bind_symbols(graph: &mut Graph, symbols: &[(String, usize)]) -> Result<(), InferError> {
    map_dims(graph, &mut |d| {
        if let Dim::Sym(s) = d
            && let Some((_, v)) = symbols.iter().find(|(n, _)| n == s)
        {
            *d = Dim::Fixed(*v);
        }
    });
    infer_types(graph)
}

/// Gives the unnamed dims of the graph's inputs (`Dim::fresh` symbols, whose numbers depend
/// on what else this process imported) names made from their place, `unk__<input>_<axis>`, so
/// the same model always gets the same names: a program compiled from it in one process and
/// a specialisation compiled from it in another agree on them. Still distinct, still unnamed.
pub fn name_unknown_input_dims(graph: &mut Graph) {
    let mut renames: Vec<(String, String)> = Vec::new();
    for (k, &id) in graph.inputs.iter().enumerate() {
        if let Some(ValueType::Tensor(TensorType { shape: Some(s), .. })) = graph.value(id).map(|v| &v.ty) {
            for (axis, d) in s.iter().enumerate() {
                if let Dim::Sym(n) = d
                    && Dim::is_unnamed(n)
                    && !renames.iter().any(|(o, _)| o == n)
                {
                    renames.push((n.clone(), format!("unk__{k}_{axis}")));
                }
            }
        }
    }
    if renames.is_empty() {
        return;
    }
    map_dims(graph, &mut |d| {
        if let Dim::Sym(s) = d
            && let Some((_, new)) = renames.iter().find(|(o, _)| o == s)
        {
            *s = new.clone();
        }
    });
}

/// Applies `f` to every dim of every value type, in this graph and its subgraphs.
fn map_dims(graph: &mut Graph, f: &mut impl FnMut(&mut Dim)) {
    for v in &mut graph.values {
        map_type(&mut v.ty, f);
    }
    for node in &mut graph.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            match c {
                ControlFlow::If(n) => {
                    map_dims(&mut n.then_branch, f);
                    map_dims(&mut n.else_branch, f);
                }
                ControlFlow::Loop(n) => map_dims(&mut n.body, f),
                ControlFlow::Scan(n) => map_dims(&mut n.body, f),
                ControlFlow::SequenceMap(n) => map_dims(&mut n.body, f),
                ControlFlow::FlexAttention(n) => {
                    for g in n.score_mod.iter_mut().chain(n.prob_mod.iter_mut()) {
                        map_dims(g, f);
                    }
                }
            }
        }
    }
}

fn map_type(ty: &mut ValueType, f: &mut impl FnMut(&mut Dim)) {
    match ty {
        ValueType::Tensor(t) => {
            if let Some(shape) = &mut t.shape {
                shape.iter_mut().for_each(&mut *f);
            }
        }
        ValueType::Sequence(t) | ValueType::Optional(t) => map_type(t, f),
        ValueType::Unknown => {}
    }
}

/// All symbol names used in the graph's input types, in first-seen order.
pub fn input_symbols(graph: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for &id in &graph.inputs {
        if let Some(ValueType::Tensor(TensorType { shape: Some(s), .. })) = graph.value(id).map(|v| &v.ty) {
            for d in s {
                if let Dim::Sym(n) = d
                    && !out.contains(n)
                {
                    out.push(n.clone());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Capture, IfNode, Node};
    use kiln_ops::movement::{MovementOp, Reshape, Squeeze};
    use kiln_tensor::{DType, Tensor};

    /// `y = If(c) { Squeeze(x, axes = [0]) } else { Reshape(x, [2]) }`, `x: f32[n]`: the then
    /// branch runs for n = 1, the else branch for n = 2.
    fn graph() -> Graph {
        let mut g = Graph::default();
        let x = g.add_value(
            "x",
            ValueType::Tensor(TensorType::new(DType::F32, vec![Dim::Sym("n".into())])),
        );
        let c = g.add_value("c", ValueType::Tensor(TensorType::fixed(DType::Bool, &[])));
        let y = g.add_value("y", ValueType::Tensor(TensorType::dtype_only(Some(DType::F32))));
        g.inputs = vec![x, c];
        g.outputs = vec![y];
        let branch = |op: Op, spec: Option<Tensor>| {
            let mut b = Graph::default();
            let bx = b.add_value("x", ValueType::Unknown);
            let out = b.add_value("out", ValueType::Unknown);
            b.captures = vec![Capture { outer: x, inner: bx }];
            let mut inputs = vec![Some(bx)];
            if let Some(t) = spec {
                let s = b.add_value("shape", ValueType::Tensor(TensorType::of(&t)));
                b.constants.push((s, Value::Tensor(t)));
                inputs.push(Some(s));
            }
            b.nodes.push(Node {
                name: op.name().to_lowercase(),
                kind: NodeKind::Op(op),
                inputs,
                outputs: vec![Some(out)],
                plan: None,
            });
            b.outputs = vec![out];
            b
        };
        let squeeze = Op::Movement(MovementOp::Squeeze(Squeeze { axes: Some(vec![0]) }));
        let reshape = Op::Movement(MovementOp::Reshape(Reshape {
            shape: None,
            allowzero: false,
        }));
        let spec = Tensor::from_vec(vec![1], vec![2i64]).unwrap();
        g.nodes.push(Node {
            name: "if".into(),
            kind: NodeKind::Control(ControlFlow::If(IfNode {
                then_branch: branch(squeeze, None),
                else_branch: branch(reshape, Some(spec)),
            })),
            inputs: vec![Some(c)],
            outputs: vec![Some(y)],
            plan: None,
        });
        g
    }

    fn branch_output_shape(g: &Graph, then: bool) -> Option<Vec<usize>> {
        let NodeKind::Control(ControlFlow::If(n)) = &g.nodes[0].kind else {
            panic!("not an If")
        };
        let b = if then { &n.then_branch } else { &n.else_branch };
        b.value(b.outputs[0])?.ty.tensor()?.fixed_shape()
    }

    #[test]
    fn a_branch_that_cannot_run_on_the_bound_shapes_keeps_its_types() {
        let mut g = graph();
        bind_symbols(&mut g, &[("n".into(), 2)]).unwrap();
        // The then branch (squeezing a dim of 2) is left as it was: unknown shapes, no error.
        assert_eq!(branch_output_shape(&g, true), None);
        assert_eq!(branch_output_shape(&g, false), Some(vec![2]));
        let mut g = graph();
        bind_symbols(&mut g, &[("n".into(), 1)]).unwrap();
        assert_eq!(branch_output_shape(&g, true), Some(vec![]));
        assert_eq!(branch_output_shape(&g, false), None);
    }

    #[test]
    fn neither_branch_running_is_an_error_naming_the_node() {
        let mut g = graph();
        let e = bind_symbols(&mut g, &[("n".into(), 5)]).unwrap_err();
        assert_eq!(e.node, "squeeze", "{e}");
    }
}
