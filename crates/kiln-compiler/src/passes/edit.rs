//! Graph-editing helpers shared by the passes: who produces and who reads each value, constant
//! lookup, replacing every use of a value, removing nodes, fresh value names.

use kiln_ir::{ControlFlow, Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp};
use kiln_ops::{Dim, Value};
use kiln_tensor::{DType, Tensor};
use std::collections::{HashMap, HashSet};

/// Producers and readers of every value of one graph (not of its subgraphs).
pub(crate) struct Index {
    /// The node defining each value, if a node does.
    pub producer: Vec<Option<usize>>,
    /// For each value, the nodes reading it, once per read (a control-flow node reads the outer
    /// values its subgraphs capture).
    pub readers: Vec<Vec<usize>>,
    /// Graph outputs (values that must keep their id and meaning).
    pub is_output: Vec<bool>,
    /// Position of each constant in `graph.constants`.
    pub constant: HashMap<ValueId, usize>,
}

impl Index {
    pub fn new(g: &Graph) -> Index {
        let n = g.values.len();
        let mut producer = vec![None; n];
        let mut readers = vec![Vec::new(); n];
        let mut is_output = vec![false; n];
        for (i, node) in g.nodes.iter().enumerate() {
            for v in node.inputs.iter().flatten() {
                if let Some(r) = readers.get_mut(v.index()) {
                    r.push(i);
                }
            }
            if let NodeKind::Control(c) = &node.kind {
                for sub in c.subgraphs() {
                    for cap in &sub.captures {
                        if let Some(r) = readers.get_mut(cap.outer.index()) {
                            r.push(i);
                        }
                    }
                }
            }
            for v in node.outputs.iter().flatten() {
                if let Some(p) = producer.get_mut(v.index()) {
                    *p = Some(i);
                }
            }
        }
        for o in &g.outputs {
            if let Some(x) = is_output.get_mut(o.index()) {
                *x = true;
            }
        }
        let constant = g.constants.iter().enumerate().map(|(i, (v, _))| (*v, i)).collect();
        Index {
            producer,
            readers,
            is_output,
            constant,
        }
    }

    pub fn is_output(&self, v: ValueId) -> bool {
        self.is_output.get(v.index()).copied().unwrap_or(true)
    }

    pub fn readers(&self, v: ValueId) -> &[usize] {
        self.readers.get(v.index()).map_or(&[], |r| r.as_slice())
    }

    /// The node producing `v`, when `v` is read exactly once (by `reader`) and is not a graph
    /// output: the condition for folding the producer into its reader.
    pub fn sole_use(&self, v: ValueId, reader: usize) -> bool {
        !self.is_output(v) && self.readers(v) == [reader]
    }

    pub fn producer(&self, v: ValueId) -> Option<usize> {
        self.producer.get(v.index()).copied().flatten()
    }

    pub fn constant<'g>(&self, g: &'g Graph, v: ValueId) -> Option<&'g Value> {
        self.constant.get(&v).and_then(|&i| g.constants.get(i)).map(|(_, c)| c)
    }

    pub fn tensor<'g>(&self, g: &'g Graph, v: ValueId) -> Option<&'g Tensor> {
        self.constant(g, v).and_then(Value::as_tensor)
    }

    /// The value of a one-element float constant.
    pub fn scalar(&self, g: &Graph, v: ValueId) -> Option<f64> {
        let t = self.tensor(g, v)?;
        if t.len() != 1 || !is_float(t.dtype()) {
            return None;
        }
        t.to_f64_vec().first().copied()
    }
}

/// Sets `flags[k]` for every node index `k` (a pass's taken or dead nodes); indices past the
/// end are ignored.
pub(crate) fn mark(flags: &mut [bool], nodes: impl IntoIterator<Item = usize>) {
    for k in nodes {
        if let Some(f) = flags.get_mut(k) {
            *f = true;
        }
    }
}

pub(crate) fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// The element type of a value, when known.
pub(crate) fn dtype_of(g: &Graph, v: ValueId) -> Option<DType> {
    g.value(v).and_then(|i| i.ty.tensor()).and_then(|t| t.dtype)
}

/// The fully known static shape of a value.
pub(crate) fn fixed_shape(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    g.value(v).and_then(|i| i.ty.tensor()).and_then(|t| t.fixed_shape())
}

/// The static shape of a value (dims possibly symbolic).
pub(crate) fn shape_of(g: &Graph, v: ValueId) -> Option<&[Dim]> {
    g.value(v).and_then(|i| i.ty.tensor()).and_then(|t| t.shape.as_deref())
}

/// The subgraphs of a control-flow node, mutably.
pub(crate) fn subgraphs_mut(c: &mut ControlFlow) -> Vec<&mut Graph> {
    match c {
        ControlFlow::If(n) => vec![&mut n.then_branch, &mut n.else_branch],
        ControlFlow::Loop(n) => vec![&mut n.body],
        ControlFlow::Scan(n) => vec![&mut n.body],
        ControlFlow::SequenceMap(n) => vec![&mut n.body],
        ControlFlow::FlexAttention(n) => n.score_mod.iter_mut().chain(n.prob_mod.iter_mut()).collect(),
    }
}

/// Makes every reader of a key of `map` read its value instead, following chains (`a → b`,
/// `b → c` gives `a → c`). Graph outputs are left alone.
pub(crate) fn replace_all(g: &mut Graph, map: &HashMap<ValueId, ValueId>) {
    if map.is_empty() {
        return;
    }
    let resolve = |mut v: ValueId| {
        for _ in 0..=map.len() {
            match map.get(&v) {
                Some(&next) => v = next,
                None => break,
            }
        }
        v
    };
    for node in &mut g.nodes {
        for v in node.inputs.iter_mut().flatten() {
            *v = resolve(*v);
        }
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                for cap in &mut sub.captures {
                    cap.outer = resolve(cap.outer);
                }
            }
        }
    }
}

/// Removes the nodes marked in `dead`, keeping the order of the others.
pub(crate) fn remove_nodes(g: &mut Graph, dead: &[bool]) {
    let mut i = 0;
    g.nodes.retain(|_| {
        let keep = !dead.get(i).copied().unwrap_or(false);
        i += 1;
        keep
    });
}

/// A value name not used in `g`, derived from `base`.
pub(crate) fn fresh_name(g: &Graph, base: &str) -> String {
    let taken: HashSet<&str> = g.values.iter().map(|v| v.name.as_str()).collect();
    if !taken.contains(base) {
        return base.to_string();
    }
    (1..)
        .map(|k| format!("{base}_{k}"))
        .find(|n| !taken.contains(n.as_str()))
        .unwrap_or_else(|| base.to_string())
}

/// Adds a constant value named after `base`.
pub(crate) fn add_constant(g: &mut Graph, base: &str, t: Tensor) -> ValueId {
    let name = fresh_name(g, base);
    let id = g.add_value(name, ValueType::Tensor(kiln_ops::TensorType::of(&t)));
    g.constants.push((id, Value::Tensor(t)));
    id
}

/// The op of a node, when it is one.
pub(crate) fn op(node: &Node) -> Option<&Op> {
    match &node.kind {
        NodeKind::Op(op) => Some(op),
        NodeKind::Control(_) => None,
    }
}

/// The kind of a plain (numpy-broadcasting) binary arithmetic node and its two inputs.
pub(crate) fn binary(node: &Node) -> Option<(BinaryOp, ValueId, ValueId)> {
    match op(node)? {
        Op::Elementwise(ElementwiseOp::Binary(Binary { op, legacy_axis: None })) => match node.inputs.as_slice() {
            [Some(a), Some(b)] => Some((*op, *a, *b)),
            _ => None,
        },
        _ => None,
    }
}

/// The single input and output of a one-in, one-out node.
pub(crate) fn unary_io(node: &Node) -> Option<(ValueId, ValueId)> {
    match (node.inputs.as_slice(), node.outputs.as_slice()) {
        ([Some(i)], [Some(o)]) => Some((*i, *o)),
        _ => None,
    }
}

/// A node of `op` writing `output` alone, with no plan.
pub(crate) fn op_node(name: String, op: Op, inputs: Vec<Option<ValueId>>, output: ValueId) -> Node {
    Node {
        name,
        kind: NodeKind::Op(op),
        inputs,
        outputs: vec![Some(output)],
        plan: None,
    }
}

/// The DequantizeLinear (per tensor or per axis, no blocks) producing `v`, with its inputs.
pub(crate) fn dequantize_of<'g>(
    g: &'g Graph,
    index: &Index,
    v: ValueId,
) -> Option<(&'g kiln_ops::quant::DequantizeLinear, &'g [Option<ValueId>])> {
    let node = g.nodes.get(index.producer(v)?)?;
    match &node.kind {
        NodeKind::Op(Op::Quant(kiln_ops::quant::QuantOp::DequantizeLinear(dq))) if dq.block_size == 0 => {
            Some((dq, node.inputs.as_slice()))
        }
        _ => None,
    }
}
