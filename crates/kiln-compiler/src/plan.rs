//! The memory planner: static placement of every intermediate tensor of the main graph into
//! one arena, from liveness.
//!
//! Each value a node computes lives from the step that writes it to the last step that reads
//! it (values captured by a subgraph until the control-flow step). Where a view step's
//! (Reshape, Flatten, Squeeze, Unsqueeze) input 0 dies at that step, the output keeps the
//! input's place: the runtime relabels that tensor instead of copying it (in-place reuse).
//! Buffers are then placed greedily, largest first, at the lowest 64-byte aligned offset free
//! for their whole lifetime. Graph outputs leave the run, so they are not placed; values whose
//! size is not static (symbolic dims, sequences, values inside subgraphs) are left to the
//! allocator and counted as dynamic.
//!
//! The runtime executes the plan ([`MemoryPlan::arena_plan`] goes into the program): each
//! step's output takes its planned range of the run state's arena when the op asks for an
//! output buffer of exactly the planned size.

use kiln_ir::{Graph, NodeKind, ValueId};
use kiln_ops::{Dim, ValueType};
use kiln_runtime::ArenaPlan;

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
    /// Of those, values sharing their input's buffer (views of a dying input).
    pub in_place: usize,
    /// Intermediate values whose size is only known at run time.
    pub dynamic: usize,
    /// Arena offset of each slot (value id), `None` when not planned.
    pub offsets: Vec<Option<u64>>,
    /// Byte size of each planned slot.
    pub sizes: Vec<Option<u64>>,
    /// Bytes of the node-made graph outputs when the graph is fully static (no dynamic
    /// value, no control flow); `None` otherwise (see `ArenaPlan::outside`).
    pub outside: Option<u64>,
}

impl MemoryPlan {
    /// The plan as the runtime executes it: the arena size and each planned slot's range.
    pub fn arena_plan(&self) -> ArenaPlan {
        ArenaPlan {
            bytes: self.arena_bytes,
            places: self.offsets.iter().zip(&self.sizes).map(|(o, s)| o.zip(*s)).collect(),
            outside: self.outside,
        }
    }

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
    // Past the bound on one tensor it can never be made: left to the run, which refuses it.
    // (Placed sizes then stay below 2^33 bytes, so no sum of them overflows.)
    if n > kiln_tensor::MAX_ELEMENTS as u64 {
        return None;
    }
    // Byte-coded types are stored one element per byte.
    n.checked_mul(dtype.size_of().max(1) as u64)
}

/// Whether a step's output is its input 0's buffer under another shape when that input dies
/// there (the runtime moves it: `Op::is_view`).
fn reuses_input_buffer(kind: &NodeKind) -> bool {
    matches!(kind, NodeKind::Op(op) if op.is_view())
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
        sizes: vec![None; nv],
        ..MemoryPlan::default()
    };
    let is_output = |v: usize| g.outputs.iter().any(|o| o.index() == v);
    let mut outside = Some(0u64).filter(|_| g.nodes.iter().all(|n| matches!(n.kind, NodeKind::Op(_))));
    for (v, d) in def.iter().enumerate() {
        let Some(d) = d else { continue };
        if is_output(v) {
            let b = g.values.get(v).and_then(|vi| static_bytes(&vi.ty));
            outside = outside.zip(b).map(|(a, b)| a.saturating_add(b));
            continue;
        }
        match g.values.get(v).and_then(|vi| static_bytes(&vi.ty)) {
            Some(b) => {
                size[v] = Some(b);
                plan.naive_bytes = plan.naive_bytes.saturating_add(b);
                plan.planned += 1;
                if last[v].is_none() {
                    last[v] = Some(*d);
                }
            }
            None => {
                plan.dynamic += 1;
                outside = None;
            }
        }
    }
    plan.outside = outside;
    // Buffer groups: a view's output joins its input's group when that input dies there
    // (and is read by no other input of the step, as the runtime requires to move it).
    let mut group: Vec<usize> = (0..nv).collect();
    for (i, node) in g.nodes.iter().enumerate() {
        if !reuses_input_buffer(&node.kind) {
            continue;
        }
        let (Some(Some(out)), Some(Some(inp))) = (node.outputs.first(), node.inputs.first()) else {
            continue;
        };
        let (out, v) = (out.index(), inp.index());
        let fits = size.get(v).copied().flatten().is_some()
            && size.get(v) == size.get(out)
            && last.get(v).copied().flatten() == Some(i)
            && node.inputs.iter().skip(1).all(|x| *x != Some(*inp));
        if fits {
            group[out] = group[v];
            plan.in_place += 1;
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
            plan.sizes[v] = size[v];
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Node;
    use kiln_ops::Op;
    use kiln_ops::TensorType;
    use kiln_ops::elementwise::ElementwiseOp;
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
            plan: None,
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

    fn flatten() -> Op {
        Op::Movement(kiln_ops::movement::MovementOp::Flatten(kiln_ops::movement::Flatten {
            axis: 0,
        }))
    }

    #[test]
    fn a_view_of_a_dying_input_shares_its_range_and_outputs_are_not_placed() {
        // x -> relu -> a -> flatten -> b -> relu -> y (output)
        let mut g = Graph::default();
        let x = g.add_value("x", f32s(1000));
        let a = g.add_value("a", f32s(1000));
        let b = g.add_value("b", f32s(1000));
        let y = g.add_value("y", f32s(1000));
        node(&mut g, relu(), &[x], a);
        node(&mut g, flatten(), &[a], b);
        node(&mut g, relu(), &[b], y);
        g.inputs = vec![x];
        g.outputs = vec![y];
        let p = plan(&g);
        assert_eq!((p.planned, p.in_place, p.dynamic), (2, 1, 0));
        assert_eq!(p.naive_bytes, 8000);
        assert_eq!(p.arena_bytes, 4000);
        assert_eq!(p.offsets, vec![None, Some(0), Some(0), None]);
        let arena = p.arena_plan();
        assert_eq!(arena.bytes, 4000);
        assert_eq!(arena.place(a.index()), Some((0, 4000)));
        assert_eq!(arena.place(y.index()), None, "the output leaves the run");
    }

    /// Fuzz finding (run_model): static sizes past the bound on one tensor summed past 2^64.
    /// They are left to the run (which refuses them), and nothing overflows.
    #[test]
    fn sizes_past_the_tensor_bound_are_dynamic_and_never_overflow() {
        let mut g = Graph::default();
        let x = g.add_value("x", f32s(4));
        let mut prev = x;
        for k in 0..4 {
            let v = g.add_value(format!("h{k}"), f32s(1 << 62));
            node(&mut g, relu(), &[prev], v);
            prev = v;
        }
        let y = g.add_value("y", f32s(4));
        node(&mut g, add(), &[prev, x], y);
        g.inputs = vec![x];
        g.outputs = vec![y];
        let p = plan(&g);
        assert_eq!((p.planned, p.dynamic), (0, 4));
        assert_eq!(p.arena_bytes, 0);
    }

    #[test]
    fn a_view_whose_input_lives_on_gets_its_own_range() {
        // a = relu(x); b = flatten(a); c = a + b (a still alive at the view)
        let mut g = Graph::default();
        let x = g.add_value("x", f32s(100));
        let a = g.add_value("a", f32s(100));
        let b = g.add_value("b", f32s(100));
        let c = g.add_value("c", f32s(100));
        let y = g.add_value("y", f32s(100));
        node(&mut g, relu(), &[x], a);
        node(&mut g, flatten(), &[a], b);
        node(&mut g, add(), &[a, b], c);
        node(&mut g, relu(), &[c], y);
        g.inputs = vec![x];
        g.outputs = vec![y];
        let p = plan(&g);
        assert_eq!(p.in_place, 0);
        assert_ne!(p.offsets[a.index()], p.offsets[b.index()]);
    }

    #[test]
    fn overlapping_lifetimes_get_disjoint_ranges_and_dead_ones_are_reused() {
        // a = id(x); b = id(x); c = a + b; d = id(c); e = id(d); f = id(e)  (f output)
        let mut g = Graph::default();
        let x = g.add_value("x", f32s(100));
        let ids: Vec<ValueId> = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .map(|n| g.add_value(*n, f32s(100)))
            .collect();
        let (a, b, c, d, e, f) = (ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
        node(&mut g, softmax_like(), &[x], a);
        node(&mut g, softmax_like(), &[x], b);
        node(&mut g, add(), &[a, b], c);
        node(&mut g, softmax_like(), &[c], d);
        node(&mut g, softmax_like(), &[d], e);
        node(&mut g, softmax_like(), &[e], f);
        g.inputs = vec![x];
        g.outputs = vec![f];
        let p = plan(&g);
        let off = |v: ValueId| p.offsets[v.index()].unwrap();
        let range = |v: ValueId| off(v)..off(v) + 400;
        let disjoint = |u: ValueId, v: ValueId| range(u).end <= range(v).start || range(v).end <= range(u).start;
        // a, b and c are alive together at c's step; d with c, e with d.
        assert!(disjoint(a, b) && disjoint(a, c) && disjoint(b, c));
        assert!(disjoint(c, d));
        assert!(disjoint(d, e));
        // e starts after c died: it reuses a dead range.
        assert!([a, b, c].iter().any(|&v| off(v) == off(e)), "e reuses a, b or c");
        assert_eq!(p.offsets[f.index()], None);
        assert_eq!(p.in_place, 0);
        assert_eq!(p.naive_bytes, 2000);
        // Three 400-byte buffers (two rounded to 448 by alignment) suffice at every step.
        assert!(p.arena_bytes <= 2 * 448 + 400, "arena {}", p.arena_bytes);
        for v in [a, b, c, d, e] {
            assert_eq!(off(v) % ARENA_ALIGN, 0);
        }
    }

    #[test]
    fn symbolic_sizes_are_dynamic() {
        let mut g = Graph::default();
        let sym = ValueType::Tensor(TensorType {
            dtype: Some(DType::F32),
            shape: Some(vec![Dim::Sym("batch".into())]),
        });
        let x = g.add_value("x", sym.clone());
        let y = g.add_value("y", sym.clone());
        let z = g.add_value("z", sym);
        node(&mut g, relu(), &[x], y);
        node(&mut g, relu(), &[y], z);
        g.inputs = vec![x];
        g.outputs = vec![z];
        let p = plan(&g);
        assert_eq!((p.planned, p.dynamic, p.arena_bytes), (0, 1, 0));
    }
}
