//! The memory planner: static placement of every intermediate tensor of the main graph into
//! one arena, from liveness.
//!
//! Each value a node computes lives from the step that writes it to the last step that reads
//! it (graph outputs to the end of the run; values captured by a subgraph until the control-flow
//! step). Where an elementwise step's input dies at that step and has the output's size, the
//! output takes the input's place (in-place reuse). Buffers are then placed greedily, largest
//! first, at the lowest 64-byte aligned offset free for their whole lifetime. Values whose size
//! is not static (symbolic dims, sequences, values inside subgraphs) are left to the allocator and
//! counted as dynamic.

use kiln_ir::{Graph, NodeKind, ValueId};
use kiln_ops::elementwise::ElementwiseOp;
use kiln_ops::{Dim, Op, ValueType};

/// Alignment of every arena offset.
pub const ARENA_ALIGN: u64 = 64;

/// Where each value of a program's main graph lives in the run arena.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MemoryPlan {
    /// Size of the arena: the peak of the placed buffers.
    pub arena_bytes: u64,
    /// What one buffer per value would take (the sum of all planned sizes).
    pub naive_bytes: u64,
    /// Values placed in the arena.
    pub planned: usize,
    /// Of those, values sharing their input's buffer.
    pub in_place: usize,
    /// Intermediate values whose size is only known at run time.
    pub dynamic: usize,
    /// Arena offset of each slot (value id), `None` when not planned.
    pub offsets: Vec<Option<u64>>,
}

impl MemoryPlan {
    /// One-line summary for reports.
    pub fn summary(&self) -> String {
        format!(
            "arena {} for {} tensors ({} in place), naive sum {} ({:.1}x smaller); {} dynamic",
            mib(self.arena_bytes),
            self.planned,
            self.in_place,
            mib(self.naive_bytes),
            self.naive_bytes as f64 / self.arena_bytes.max(1) as f64,
            self.dynamic
        )
    }
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

/// Static byte size of a value, when its type fixes one.
fn static_bytes(ty: &ValueType) -> Option<u64> {
    let ValueType::Tensor(t) = ty else { return None };
    let dtype = t.dtype?;
    let mut n: u64 = 1;
    for d in t.shape.as_ref()? {
        let Dim::Fixed(k) = d else { return None };
        n = n.checked_mul(*k as u64)?;
    }
    // Byte-coded types are stored one element per byte.
    n.checked_mul(dtype.size_of().max(1) as u64)
}

/// Whether a step may write its output over its first input (same element count, elementwise).
fn may_run_in_place(kind: &NodeKind) -> bool {
    matches!(
        kind,
        NodeKind::Op(Op::Elementwise(
            ElementwiseOp::Unary(_) | ElementwiseOp::Binary(_) | ElementwiseOp::Clip(_)
        ))
    )
}

/// Plans the main graph's intermediate values.
pub fn plan(g: &Graph) -> MemoryPlan {
    let nv = g.values.len();
    let n = g.nodes.len();
    let mut def: Vec<Option<usize>> = vec![None; nv];
    let mut last: Vec<Option<usize>> = vec![None; nv];
    for (i, node) in g.nodes.iter().enumerate() {
        for id in node.outputs.iter().flatten() {
            if let Some(d) = def.get_mut(id.index()) {
                *d = Some(i);
            }
        }
        let mut reads: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
        if let NodeKind::Control(c) = &node.kind {
            for sg in c.subgraphs() {
                reads.extend(sg.captures.iter().map(|cap| cap.outer));
            }
        }
        for id in reads {
            if let Some(l) = last.get_mut(id.index()) {
                *l = Some(l.map_or(i, |x| x.max(i)));
            }
        }
    }
    for o in &g.outputs {
        if let Some(l) = last.get_mut(o.index()) {
            *l = Some(n);
        }
    }
    let mut size: Vec<Option<u64>> = vec![None; nv];
    let mut plan = MemoryPlan {
        offsets: vec![None; nv],
        ..MemoryPlan::default()
    };
    for (v, d) in def.iter().enumerate() {
        let Some(d) = d else { continue };
        match g.values.get(v).and_then(|vi| static_bytes(&vi.ty)) {
            Some(b) => {
                size[v] = Some(b);
                plan.naive_bytes += b;
                plan.planned += 1;
                if last[v].is_none() {
                    last[v] = Some(*d);
                }
            }
            None => plan.dynamic += 1,
        }
    }
    // Buffer groups: a value joins its input's group when it may be computed in place.
    let mut group: Vec<usize> = (0..nv).collect();
    let mut taken = vec![false; nv];
    let is_output = |v: usize| g.outputs.iter().any(|o| o.index() == v);
    for (i, node) in g.nodes.iter().enumerate() {
        if !may_run_in_place(&node.kind) {
            continue;
        }
        let Some(Some(out)) = node.outputs.first() else {
            continue;
        };
        let out = out.index();
        for inp in node.inputs.iter().flatten() {
            let v = inp.index();
            let fits = size.get(v).copied().flatten().is_some()
                && size.get(v) == size.get(out)
                && def.get(v).copied().flatten().is_some()
                && last.get(v).copied().flatten() == Some(i)
                && !is_output(v)
                && !taken[v];
            if fits {
                taken[v] = true;
                group[out] = group[v];
                plan.in_place += 1;
                break;
            }
        }
    }
    // Each group: lifetime and size.
    let mut spans: Vec<Option<(usize, usize, u64)>> = vec![None; nv];
    for v in 0..nv {
        let (Some(b), Some(d), Some(l)) = (size[v], def[v], last[v]) else {
            continue;
        };
        let r = group[v];
        spans[r] = Some(match spans[r] {
            None => (d, l, b),
            Some((d0, l0, b0)) => (d0.min(d), l0.max(l), b0.max(b)),
        });
    }
    let mut order: Vec<usize> = (0..nv).filter(|&r| spans[r].is_some()).collect();
    order.sort_by_key(|&r| std::cmp::Reverse(spans[r].map_or(0, |s| s.2)));
    let mut placed: Vec<(usize, usize, u64, u64)> = Vec::new(); // (def, last, offset, end)
    let mut offset_of: Vec<Option<u64>> = vec![None; nv];
    for r in order {
        let Some((d, l, b)) = spans[r] else { continue };
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|p| p.0 <= l && d <= p.1)
            .map(|p| (p.2, p.3))
            .collect();
        busy.sort();
        let mut at = 0u64;
        for (s, e) in busy {
            if at + b <= s {
                break;
            }
            at = at.max(e.next_multiple_of(ARENA_ALIGN));
        }
        placed.push((d, l, at, at + b));
        offset_of[r] = Some(at);
        plan.arena_bytes = plan.arena_bytes.max(at + b);
    }
    for v in 0..nv {
        if size[v].is_some() && def[v].is_some() {
            plan.offsets[v] = offset_of[group[v]];
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Node;
    use kiln_ops::TensorType;
    use kiln_ops::elementwise::{Binary, BinaryOp, UnaryOp};
    use kiln_tensor::DType;

    fn f32s(n: usize) -> ValueType {
        ValueType::Tensor(TensorType {
            dtype: Some(DType::F32),
            shape: Some(vec![Dim::Fixed(n)]),
        })
    }

    fn node(g: &mut Graph, op: Op, ins: &[ValueId], out: ValueId) {
        g.nodes.push(Node {
            name: format!("n{}", g.nodes.len()),
            kind: NodeKind::Op(op),
            inputs: ins.iter().map(|&i| Some(i)).collect(),
            outputs: vec![Some(out)],
        });
    }

    fn relu() -> Op {
        Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu))
    }
    fn add() -> Op {
        Op::Elementwise(ElementwiseOp::Binary(Binary {
            op: BinaryOp::Add,
            legacy_axis: None,
        }))
    }
    fn softmax_like() -> Op {
        // Any op that is not elementwise: no in-place reuse.
        Op::Movement(kiln_ops::movement::MovementOp::Identity(kiln_ops::movement::Identity))
    }

    #[test]
    fn chain_of_elementwise_ops_runs_in_one_buffer() {
        // x -> relu -> a -> relu -> b -> relu -> y (output)
        let mut g = Graph::default();
        let x = g.add_value("x", f32s(1000));
        let a = g.add_value("a", f32s(1000));
        let b = g.add_value("b", f32s(1000));
        let y = g.add_value("y", f32s(1000));
        node(&mut g, relu(), &[x], a);
        node(&mut g, relu(), &[a], b);
        node(&mut g, relu(), &[b], y);
        g.inputs = vec![x];
        g.outputs = vec![y];
        let p = plan(&g);
        assert_eq!(p.planned, 3);
        assert_eq!(p.in_place, 2);
        assert_eq!(p.naive_bytes, 12_000);
        assert_eq!(p.arena_bytes, 4000);
        assert_eq!(p.offsets, vec![None, Some(0), Some(0), Some(0)]);
    }

    #[test]
    fn overlapping_lifetimes_get_disjoint_ranges_and_dead_ones_are_reused() {
        // a = id(x); b = id(x); c = a + b; d = id(c); e = id(d)  (e output)
        let mut g = Graph::default();
        let x = g.add_value("x", f32s(100));
        let ids: Vec<ValueId> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| g.add_value(*n, f32s(100)))
            .collect();
        let (a, b, c, d, e) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
        node(&mut g, softmax_like(), &[x], a);
        node(&mut g, softmax_like(), &[x], b);
        node(&mut g, add(), &[a, b], c);
        node(&mut g, softmax_like(), &[c], d);
        node(&mut g, softmax_like(), &[d], e);
        g.inputs = vec![x];
        g.outputs = vec![e];
        let p = plan(&g);
        let off = |v: ValueId| p.offsets[v.index()].unwrap();
        // a and b are alive together: disjoint. c reuses a (in place). d must not overlap c;
        // e must not overlap d.
        let range = |v: ValueId| off(v)..off(v) + 400;
        let disjoint = |u: ValueId, v: ValueId| range(u).end <= range(v).start || range(v).end <= range(u).start;
        assert!(disjoint(a, b));
        assert_eq!(off(c), off(a));
        assert!(disjoint(c, d));
        assert!(disjoint(d, e));
        assert_eq!(p.in_place, 1);
        assert_eq!(p.naive_bytes, 2000);
        // Two 400-byte buffers (each rounded to 448 by alignment) suffice at every step.
        assert!(p.arena_bytes <= 448 + 400, "arena {}", p.arena_bytes);
        assert_eq!(off(a) % ARENA_ALIGN, 0);
        assert_eq!(off(b) % ARENA_ALIGN, 0);
    }

    #[test]
    fn symbolic_sizes_are_dynamic() {
        let mut g = Graph::default();
        let sym = ValueType::Tensor(TensorType {
            dtype: Some(DType::F32),
            shape: Some(vec![Dim::Sym("batch".into())]),
        });
        let x = g.add_value("x", sym.clone());
        let y = g.add_value("y", sym);
        node(&mut g, relu(), &[x], y);
        g.inputs = vec![x];
        g.outputs = vec![y];
        let p = plan(&g);
        assert_eq!((p.planned, p.dynamic, p.arena_bytes), (0, 1, 0));
    }
}
