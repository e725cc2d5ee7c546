//! Pattern recognition: subgraphs transformer exporters emit for one operation become that op.
//!
//! - GELU, erf form: `x * 0.5 * (1 + erf(x / sqrt2))` (or `x * 0.7071..`), the three factors in
//!   any grouping and order, becomes `Gelu`; tanh form: `x * 0.5 * (1 + tanh(sqrt(2/pi) *
//!   (x + 0.044715 * x^3)))` with `x^3` as `Pow(x, 3)` or `x * x * x`, becomes
//!   `Gelu(approximate = tanh)`.
//! - HardSwish spelled out (paddle2onnx, tf2onnx): `x * clip(x + 3, 0, 6) / 6`, the division
//!   by 6 or product with 1/6 applied to the product or to the clip, becomes `HardSwish`, which
//!   the activation fusion then puts in its producer's epilogue.
//! - LayerNorm: `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta` over the
//!   trailing axes (`Pow(d, 2)` or `d * d`; beta optional) becomes `LayerNormalization`.
//!
//! The fused ops compute in f64 and round once, where the subgraph rounded every step: results
//! agree to the last bits of the type, not bit for bit. Every intermediate value must be read
//! only inside the pattern (and not be a graph output); constants must be one-element floats
//! within 1e-3 relative of the expected value (half-precision models store them rounded).
//!
//! Attention (`MatMul(Q, Kᵀ)`, scale, mask, Softmax, `MatMul(·, V)`) is recognised by `attention.rs`.

use super::edit::{Index, binary, dtype_of, is_float, mark, remove_nodes, shape_of};
use crate::CompileError;
use kiln_ir::{Dim, Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::{BinaryOp, ElementwiseOp, UnaryOp};
use kiln_ops::reduce::{LayerNorm, Reduce, ReduceAxes, ReduceKind, ReduceOp};
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let m = Matcher { g, index: &index };
    let mut taken = vec![false; g.nodes.len()];
    let mut plans: Vec<Plan> = Vec::new();
    // Last node first, so the largest match wins (LayerNorm with its beta Add over the one
    // ending at the gamma Mul).
    for i in (0..g.nodes.len()).rev() {
        let Some(p) = m.gelu(i).or_else(|| m.hard_swish(i)).or_else(|| m.layer_norm(i)) else {
            continue;
        };
        if p.nodes.iter().any(|&k| taken.get(k).copied().unwrap_or(true)) {
            continue;
        }
        mark(&mut taken, p.nodes.iter().copied());
        plans.push(p);
    }
    let mut dead = vec![false; g.nodes.len()];
    for p in &plans {
        for &k in &p.nodes {
            if let Some(d) = dead.get_mut(k) {
                *d = k != p.anchor;
            }
        }
        if let Some(node) = g.nodes.get_mut(p.anchor) {
            node.kind = NodeKind::Op(p.op.clone());
            node.inputs = p.inputs.clone();
        }
    }
    remove_nodes(g, &dead);
    Ok(plans.len())
}

/// A recognised pattern: its nodes (the anchor, last in graph order, becomes the fused op and
/// keeps its output; the others go), the fused op and its inputs.
struct Plan {
    anchor: usize,
    nodes: Vec<usize>,
    op: Op,
    inputs: Vec<Option<ValueId>>,
}

struct Matcher<'a> {
    g: &'a Graph,
    index: &'a Index,
}

fn near(v: f64, want: f64) -> bool {
    (v - want).abs() <= 1e-3 * want.abs()
}

impl Matcher<'_> {
    /// The node producing `v` when `v` is read by `reader` alone.
    fn private(&self, v: ValueId, reader: usize) -> Option<(usize, &Node)> {
        let p = self.index.producer(v)?;
        self.index.sole_use(v, reader).then_some(())?;
        Some((p, self.g.nodes.get(p)?))
    }

    /// `(a, b)` of a private binary node of kind `op` producing `v`.
    fn bin(&self, v: ValueId, reader: usize, op: BinaryOp) -> Option<(usize, ValueId, ValueId)> {
        let (p, node) = self.private(v, reader)?;
        let (k, a, b) = binary(node)?;
        (k == op).then_some((p, a, b))
    }

    /// The input of a private unary node `u` producing `v`.
    fn unary(&self, v: ValueId, reader: usize, u: UnaryOp) -> Option<(usize, ValueId)> {
        let (p, node) = self.private(v, reader)?;
        match (&node.kind, node.inputs.as_slice()) {
            (NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(k))), [Some(x)]) if *k == u => Some((p, *x)),
            _ => None,
        }
    }

    fn is_scalar(&self, v: ValueId, want: f64) -> bool {
        self.index.scalar(self.g, v).is_some_and(|c| near(c, want))
    }

    /// Of two operands, the one that is not the scalar constant `want`.
    fn other_than(&self, a: ValueId, b: ValueId, want: f64) -> Option<ValueId> {
        if self.is_scalar(b, want) {
            Some(a)
        } else if self.is_scalar(a, want) {
            Some(b)
        } else {
            None
        }
    }

    /// The factors of a product tree rooted at node `root` (a Mul), two levels deep, and the
    /// Mul nodes of the tree.
    fn factors(&self, root: usize) -> Option<(Vec<ValueId>, Vec<usize>)> {
        let (BinaryOp::Mul, a, b) = binary(self.g.nodes.get(root)?)? else {
            return None;
        };
        let mut out = Vec::new();
        let mut nodes = vec![root];
        for v in [a, b] {
            match self.bin(v, root, BinaryOp::Mul) {
                Some((p, c, d)) => {
                    nodes.push(p);
                    out.extend([c, d]);
                }
                None => out.push(v),
            }
        }
        Some((out, nodes))
    }

    fn gelu(&self, i: usize) -> Option<Plan> {
        let node = self.g.nodes.get(i)?;
        let y = node.outputs.first().copied().flatten()?;
        if !dtype_of(self.g, y).is_some_and(is_float) {
            return None;
        }
        let (factors, mut nodes) = self.factors(i)?;
        let [f0, f1, f2] = factors.as_slice() else {
            return None;
        };
        let fs = [*f0, *f1, *f2];
        let half = fs.iter().position(|&v| self.is_scalar(v, 0.5))?;
        let rest: Vec<ValueId> = fs
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != half)
            .map(|(_, v)| *v)
            .collect();
        let [r0, r1] = rest.as_slice() else { return None };
        for (x, p) in [(*r0, *r1), (*r1, *r0)] {
            // p = 1 + act(t), read by one of the tree's Muls.
            let Some(&reader) = self.index.readers(p).first() else {
                continue;
            };
            if !nodes.contains(&reader) {
                continue;
            }
            let Some((add, a, b)) = self.bin(p, reader, BinaryOp::Add) else {
                continue;
            };
            let Some(e) = self.other_than(a, b, 1.0) else { continue };
            let mut found = self.unary(e, add, UnaryOp::Erf).map(|(n, t)| (n, t, false));
            if found.is_none() {
                found = self.unary(e, add, UnaryOp::Tanh).map(|(n, t)| (n, t, true));
            }
            let Some((act, t, tanh)) = found else { continue };
            let inner = if tanh {
                self.tanh_arg(t, act, x)
            } else {
                self.erf_arg(t, act, x)
            };
            let Some(inner) = inner else { continue };
            nodes.extend([add, act]);
            nodes.extend(inner);
            return Some(Plan {
                anchor: i,
                nodes,
                op: Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Gelu { tanh })),
                inputs: vec![Some(x)],
            });
        }
        None
    }

    /// `x * clip(x + 3, 0, 6) / 6` ending at node `i`: `(x * c) / 6`, `(x * c) * (1/6)`,
    /// `x * (c / 6)` or `x * (c * (1/6))`.
    fn hard_swish(&self, i: usize) -> Option<Plan> {
        let node = self.g.nodes.get(i)?;
        let y = node.outputs.first().copied().flatten()?;
        if !dtype_of(self.g, y).is_some_and(is_float) {
            return None;
        }
        let (k, a, b) = binary(node)?;
        let plan = |x: ValueId, nodes: Vec<usize>| Plan {
            anchor: i,
            nodes,
            op: Op::Elementwise(ElementwiseOp::Unary(UnaryOp::HardSwish)),
            inputs: vec![Some(x)],
        };
        // A sixth of something: the product `x * c`, or the clip `c`.
        let sixth = |v: ValueId, reader: usize| -> Option<(usize, ValueId)> {
            if let Some((d, p, q)) = self.bin(v, reader, BinaryOp::Div) {
                return self.is_scalar(q, 6.0).then_some((d, p));
            }
            let (m, p, q) = self.bin(v, reader, BinaryOp::Mul)?;
            Some((m, self.other_than(p, q, 1.0 / 6.0)?))
        };
        let outer = match k {
            BinaryOp::Div if self.is_scalar(b, 6.0) => Some(a),
            BinaryOp::Mul => self.other_than(a, b, 1.0 / 6.0),
            _ => None,
        };
        if let Some(prod) = outer
            && let Some((m, p, q)) = self.bin(prod, i, BinaryOp::Mul)
        {
            for (x, c) in [(p, q), (q, p)] {
                if let Some(clip) = self.relu6_of_x_plus_3(c, m, x) {
                    return Some(plan(x, [vec![i, m], clip].concat()));
                }
            }
        }
        if k == BinaryOp::Mul {
            // `x * HardSigmoid(x)` on HardSwish's own line (alpha 1/6, beta 1/2), as ONNX
            // Runtime's saved graphs spell it: left apart, the pair kept MobileNet-v3's
            // convolutions from taking it as their epilogue (21 extra passes, 9% of its run).
            for (x, h) in [(a, b), (b, a)] {
                let Some((p, hn)) = self.private(h, i) else { continue };
                if let NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(UnaryOp::HardSigmoid { alpha, beta }))) =
                    &hn.kind
                    && (f64::from(*alpha) - 1.0 / 6.0).abs() <= 1e-7
                    && *beta == 0.5
                    && hn.inputs.first().copied().flatten() == Some(x)
                {
                    return Some(plan(x, vec![i, p]));
                }
            }
            for (x, h) in [(a, b), (b, a)] {
                let Some((d, c)) = sixth(h, i) else { continue };
                if let Some(clip) = self.relu6_of_x_plus_3(c, d, x) {
                    return Some(plan(x, [vec![i, d], clip].concat()));
                }
            }
        }
        None
    }

    /// The nodes computing `c = clip(x + 3, 0, 6)` for node `reader`.
    fn relu6_of_x_plus_3(&self, c: ValueId, reader: usize, x: ValueId) -> Option<Vec<usize>> {
        let (p, node) = self.private(c, reader)?;
        let NodeKind::Op(Op::Elementwise(ElementwiseOp::Clip(clip))) = &node.kind else {
            return None;
        };
        let bound = |attr: Option<f32>, slot: usize| {
            attr.map(f64::from).or_else(|| {
                let v = node.inputs.get(slot).copied().flatten()?;
                self.index.scalar(self.g, v)
            })
        };
        let (lo, hi) = (bound(clip.min, 1)?, bound(clip.max, 2)?);
        if lo != 0.0 || !near(hi, 6.0) {
            return None;
        }
        let t = node.inputs.first().copied().flatten()?;
        let (add, u, w) = self.bin(t, p, BinaryOp::Add)?;
        (self.other_than(u, w, 3.0)? == x).then(|| vec![p, add])
    }

    /// The nodes computing `t = x / sqrt2` (or `x * (1/sqrt2)`) for the Erf node `reader`.
    fn erf_arg(&self, t: ValueId, reader: usize, x: ValueId) -> Option<Vec<usize>> {
        if let Some((p, a, b)) = self.bin(t, reader, BinaryOp::Div) {
            return (a == x && self.is_scalar(b, std::f64::consts::SQRT_2)).then(|| vec![p]);
        }
        let (p, a, b) = self.bin(t, reader, BinaryOp::Mul)?;
        (self.other_than(a, b, std::f64::consts::FRAC_1_SQRT_2)? == x).then(|| vec![p])
    }

    /// The nodes computing `t = sqrt(2/pi) * (x + 0.044715 * x^3)` for the Tanh node `reader`.
    fn tanh_arg(&self, t: ValueId, reader: usize, x: ValueId) -> Option<Vec<usize>> {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let (m, a, b) = self.bin(t, reader, BinaryOp::Mul)?;
        let sum = self.other_than(a, b, k)?;
        let (s, a, b) = self.bin(sum, m, BinaryOp::Add)?;
        let cubic = if a == x {
            b
        } else if b == x {
            a
        } else {
            return None;
        };
        let (c, a, b) = self.bin(cubic, s, BinaryOp::Mul)?;
        let cube = self.other_than(a, b, 0.044715)?;
        let mut nodes = vec![m, s, c];
        if let Some((p, a, b)) = self.bin(cube, c, BinaryOp::Pow) {
            (a == x && self.is_scalar(b, 3.0)).then_some(())?;
            nodes.push(p);
            return Some(nodes);
        }
        // x * (x * x) in either grouping.
        let (p, a, b) = self.bin(cube, c, BinaryOp::Mul)?;
        let sq = if a == x {
            b
        } else if b == x {
            a
        } else {
            return None;
        };
        let (q, a, b) = self.bin(sq, p, BinaryOp::Mul)?;
        (a == x && b == x).then_some(())?;
        nodes.extend([p, q]);
        Some(nodes)
    }

    /// The normalised axes of a private ReduceMean (keepdims) producing `v`, and its input.
    fn reduce_mean(&self, v: ValueId, reader: usize, rank: usize) -> Option<(usize, ValueId, Vec<usize>)> {
        let (p, node) = self.private(v, reader)?;
        let NodeKind::Op(Op::Reduce(ReduceOp::Reduce(Reduce {
            kind: ReduceKind::Mean,
            axes,
            keepdims: true,
            ..
        }))) = &node.kind
        else {
            return None;
        };
        let x = node.inputs.first().copied().flatten()?;
        let list = match axes {
            ReduceAxes::Attr(list) => list.clone(),
            ReduceAxes::Input => self
                .index
                .tensor(self.g, node.inputs.get(1).copied().flatten()?)?
                .to_i64_vec()?,
        };
        let mut norm: Vec<usize> = list
            .iter()
            .map(|&a| {
                usize::try_from(if a < 0 { a + rank as i64 } else { a })
                    .ok()
                    .filter(|&a| a < rank)
            })
            .collect::<Option<_>>()?;
        norm.sort_unstable();
        norm.dedup();
        Some((p, x, norm))
    }

    fn layer_norm(&self, i: usize) -> Option<Plan> {
        let node = self.g.nodes.get(i)?;
        let (op, a, b) = binary(node)?;
        // y = scaled + beta, or y = scaled alone.
        let (scaled_node, scaled, beta) = match op {
            BinaryOp::Add => {
                let (left, right) = [(a, b), (b, a)].into_iter().find(|(s, bt)| {
                    self.bin(*s, i, BinaryOp::Mul).is_some() && self.index.tensor(self.g, *bt).is_some()
                })?;
                let (p, c, d) = self.bin(left, i, BinaryOp::Mul)?;
                (Some(p), (c, d), Some(right))
            }
            BinaryOp::Mul => (None, (a, b), None),
            _ => return None,
        };
        let mul_node = scaled_node.unwrap_or(i);
        let (normed, gamma) = [(scaled.0, scaled.1), (scaled.1, scaled.0)]
            .into_iter()
            .find(|(n, gm)| {
                self.bin(*n, mul_node, BinaryOp::Div).is_some() && self.index.tensor(self.g, *gm).is_some()
            })?;
        let (div, d, sd) = self.bin(normed, mul_node, BinaryOp::Div)?;
        let (sub, x, mean) = self.index.producer(d).and_then(|p| {
            let n = self.g.nodes.get(p)?;
            match binary(n)? {
                (BinaryOp::Sub, x, m) => Some((p, x, m)),
                _ => None,
            }
        })?;
        let dtype = dtype_of(self.g, x)?;
        if !is_float(dtype) || self.index.is_output(d) {
            return None;
        }
        let xs = shape_of(self.g, x)?;
        let rank = xs.len();
        let (rm1, x1, axes) = self.reduce_mean(mean, sub, rank)?;
        let axis = *axes.first()?;
        if x1 != x || axes != (axis..rank).collect::<Vec<_>>() {
            return None;
        }
        let (sqrt, ve) = self.unary(sd, div, UnaryOp::Sqrt)?;
        let (add_eps, p, q) = self.bin(ve, sqrt, BinaryOp::Add)?;
        let (var, eps) = if self.index.scalar(self.g, q).is_some() {
            (p, q)
        } else {
            (q, p)
        };
        let eps = self.index.scalar(self.g, eps)?;
        let (rm2, sq, axes2) = self.reduce_mean(var, add_eps, rank)?;
        if axes2 != axes {
            return None;
        }
        // sq = d^2 as Pow(d, 2) or Mul(d, d); d is read by the square and the Div only.
        let sq_node = self.index.producer(sq)?;
        if !self.index.sole_use(sq, rm2) {
            return None;
        }
        match binary(self.g.nodes.get(sq_node)?)? {
            (BinaryOp::Pow, a, e) if a == d && self.is_scalar(e, 2.0) => {}
            (BinaryOp::Mul, a, b) if a == d && b == d => {}
            _ => return None,
        }
        let mut d_readers = self.index.readers(d).to_vec();
        d_readers.sort_unstable();
        d_readers.dedup();
        let mut want = vec![sq_node, div];
        want.sort_unstable();
        if d_readers != want {
            return None;
        }
        for param in [Some(gamma), beta].into_iter().flatten() {
            if !self.broadcasts_over(param, xs, axis) {
                return None;
            }
        }
        let mut nodes = vec![i, div, sub, rm1, sqrt, add_eps, rm2, sq_node];
        nodes.extend(scaled_node);
        Some(Plan {
            anchor: i,
            nodes,
            op: Op::Reduce(ReduceOp::LayerNormalization(LayerNorm {
                axis: axis as i64,
                epsilon: eps as f32,
                stash_type: DType::F32,
            })),
            inputs: vec![Some(x), Some(gamma), beta],
        })
    }

    /// Whether constant `p` broadcasts onto `x` (of shape `xs`) without enlarging it and varies
    /// only along the axes from `axis` on: what LayerNormalization's scale and bias allow.
    fn broadcasts_over(&self, p: ValueId, xs: &[Dim], axis: usize) -> bool {
        let Some(t) = self.index.tensor(self.g, p) else {
            return false;
        };
        let ps = t.shape();
        if ps.len() > xs.len() || !is_float(t.dtype()) {
            return false;
        }
        let off = xs.len() - ps.len();
        ps.iter().enumerate().all(|(k, &d)| {
            let pos = k + off;
            d == 1 || (pos >= axis && xs.get(pos) == Some(&Dim::Fixed(d)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_tensor::Tensor;

    fn scalar(b: &mut Builder, name: &str, v: f32) -> ValueId {
        b.constant(name, f32s(&[], &[v]))
    }

    #[test]
    fn bert_gelu_becomes_one_op() {
        // PyTorch/HF: Div(x, 1.4142135) -> Erf -> Add 1 -> Mul x -> Mul 0.5.
        let mut b = Builder::new();
        let s = &[2, 3];
        let x = b.input("x", s);
        let x2 = b.unary(UnaryOp::Neg, x, s);
        let c = scalar(&mut b, "sqrt2", 1.4142135);
        let one = scalar(&mut b, "one", 1.0);
        let half = scalar(&mut b, "half", 0.5);
        let d = b.binary(BinaryOp::Div, x2, c, s);
        let e = b.unary(UnaryOp::Erf, d, s);
        let p = b.binary(BinaryOp::Add, e, one, s);
        let m = b.binary(BinaryOp::Mul, x2, p, s);
        let y = b.binary(BinaryOp::Mul, m, half, s);
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Neg", "Gelu"]);
        let xin = noise(s, 1);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-6,
        );
    }

    #[test]
    fn x_times_its_hard_sigmoid_on_hard_swish_line_becomes_hard_swish() {
        let s = &[2, 5];
        for (alpha, beta, fused) in [(1.0 / 6.0, 0.5, true), (0.2, 0.5, false), (1.0 / 6.0, 0.4, false)] {
            let mut b = Builder::new();
            let x = b.input("x", s);
            let hs = Op::Elementwise(ElementwiseOp::Unary(UnaryOp::HardSigmoid { alpha, beta }));
            let h = b.node(hs, &[Some(x)], &[s])[0];
            let y = b.binary(BinaryOp::Mul, h, x, s);
            rewrites_to_hard_swish(b.finish(&[y]), s, fused, &format!("alpha {alpha} beta {beta}"));
        }
    }

    /// The pass on `g` (one input of shape `s`, one output): one rewrite to a lone HardSwish
    /// when `fused`, none otherwise, and the same values as before either way, around
    /// HardSwish's corners (-3, 3).
    fn rewrites_to_hard_swish(mut g: Graph, s: &[usize], fused: bool, case: &str) {
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), usize::from(fused), "{case}");
        crate::passes::dce::run(&mut g).unwrap();
        g.verify().unwrap();
        if fused {
            assert_eq!(op_names(&g), ["HardSwish"], "{case}");
        }
        let xin = f32s(s, &[-4.0, -3.0, -2.5, -1.0, 0.0, 0.5, 1.0, 2.9, 3.0, 7.0]);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-6,
        );
    }

    #[test]
    fn spelled_out_hard_swish_becomes_one_op() {
        // paddle2onnx: Add 3 -> Clip(0, 6) (bounds as inputs) -> Mul x -> Div 6; and
        // x * (clip(x + 3, 0, 6) * (1/6)) with the bounds as attributes.
        use kiln_ops::elementwise::Clip;
        let s = &[2, 5];
        for form in 0..2 {
            let mut b = Builder::new();
            let x = b.input("x", s);
            let three = scalar(&mut b, "three", 3.0);
            let six = scalar(&mut b, "six", 6.0);
            let zero = scalar(&mut b, "zero", 0.0);
            let sixth = scalar(&mut b, "sixth", 1.0 / 6.0);
            let t = b.binary(BinaryOp::Add, x, three, s);
            let y = if form == 0 {
                let clip = Op::Elementwise(ElementwiseOp::Clip(Clip { min: None, max: None }));
                let c = b.node(clip, &[Some(t), Some(zero), Some(six)], &[s])[0];
                let m = b.binary(BinaryOp::Mul, x, c, s);
                b.binary(BinaryOp::Div, m, six, s)
            } else {
                let clip = Op::Elementwise(ElementwiseOp::Clip(Clip {
                    min: Some(0.0),
                    max: Some(6.0),
                }));
                let c = b.node(clip, &[Some(t)], &[s])[0];
                let h = b.binary(BinaryOp::Mul, sixth, c, s);
                b.binary(BinaryOp::Mul, h, x, s)
            };
            rewrites_to_hard_swish(b.finish(&[y]), s, true, &format!("form {form}"));
        }
    }

    #[test]
    fn tanh_gelu_with_pow_becomes_one_op() {
        // 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3))), with Mul(Mul(0.5, x), p).
        let mut b = Builder::new();
        let s = &[4];
        let x = b.input("x", s);
        let three = scalar(&mut b, "three", 3.0);
        let k1 = scalar(&mut b, "k1", 0.044715);
        let k2 = scalar(&mut b, "k2", 0.7978845608);
        let one = scalar(&mut b, "one", 1.0);
        let half = scalar(&mut b, "half", 0.5);
        let cube = b.binary(BinaryOp::Pow, x, three, s);
        let c = b.binary(BinaryOp::Mul, k1, cube, s);
        let sum = b.binary(BinaryOp::Add, x, c, s);
        let t = b.binary(BinaryOp::Mul, sum, k2, s);
        let th = b.unary(UnaryOp::Tanh, t, s);
        let p = b.binary(BinaryOp::Add, one, th, s);
        let hx = b.binary(BinaryOp::Mul, half, x, s);
        let y = b.binary(BinaryOp::Mul, hx, p, s);
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        assert_eq!(op_names(&g), ["Gelu"]);
        assert!(matches!(
            g.nodes[0].kind,
            NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Gelu { tanh: true })))
        ));
        let xin = f32s(s, &[-2.0, -0.5, 0.3, 1.7]);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-6,
        );
    }

    #[test]
    fn gelu_is_left_alone_when_an_intermediate_is_read_elsewhere() {
        let mut b = Builder::new();
        let s = &[2];
        let x = b.input("x", s);
        let c = scalar(&mut b, "sqrt2", 1.4142135);
        let one = scalar(&mut b, "one", 1.0);
        let half = scalar(&mut b, "half", 0.5);
        let d = b.binary(BinaryOp::Div, x, c, s);
        let e = b.unary(UnaryOp::Erf, d, s);
        let p = b.binary(BinaryOp::Add, e, one, s);
        let m = b.binary(BinaryOp::Mul, x, p, s);
        let y = b.binary(BinaryOp::Mul, m, half, s);
        let mut g = b.finish(&[y, e]);
        assert_eq!(run(&mut g).unwrap(), 0);
    }

    fn layer_norm_graph(pow: bool, beta: bool) -> Graph {
        let mut b = Builder::new();
        let s = &[2, 3, 4];
        let r = &[2, 3, 1];
        let x = b.input("x", s);
        let axes = b.constant("axes", Tensor::from_vec(vec![1], vec![-1i64]).unwrap());
        let mean_op = || {
            Op::Reduce(ReduceOp::Reduce(Reduce {
                kind: ReduceKind::Mean,
                axes: ReduceAxes::Input,
                keepdims: true,
                noop_with_empty_axes: false,
            }))
        };
        let m = b.node(mean_op(), &[Some(x), Some(axes)], &[r])[0];
        let d = b.binary(BinaryOp::Sub, x, m, s);
        let sq = if pow {
            let two = scalar(&mut b, "two", 2.0);
            b.binary(BinaryOp::Pow, d, two, s)
        } else {
            b.binary(BinaryOp::Mul, d, d, s)
        };
        let v = b.node(mean_op(), &[Some(sq), Some(axes)], &[r])[0];
        let eps = scalar(&mut b, "eps", 1e-5);
        let ve = b.binary(BinaryOp::Add, v, eps, r);
        let sd = b.unary(UnaryOp::Sqrt, ve, r);
        let n = b.binary(BinaryOp::Div, d, sd, s);
        let gamma = b.constant("gamma", f32s(&[4], &[1.0, 2.0, 0.5, -1.0]));
        let y = b.binary(BinaryOp::Mul, n, gamma, s);
        let y = if beta {
            let bt = b.constant("beta", f32s(&[4], &[0.1, 0.0, -0.2, 0.3]));
            b.binary(BinaryOp::Add, bt, y, s)
        } else {
            y
        };
        b.finish(&[y])
    }

    #[test]
    fn layer_norm_subgraphs_become_one_op() {
        for (pow, beta) in [(true, true), (false, true), (true, false)] {
            let mut g = layer_norm_graph(pow, beta);
            let before = g.clone();
            assert_eq!(run(&mut g).unwrap(), 1, "pow {pow} beta {beta}");
            g.verify().unwrap();
            assert_eq!(op_names(&g), ["LayerNormalization"]);
            let xin = noise(&[2, 3, 4], 5);
            assert_close(
                &run_graph(&g, vec![xin.clone()])[0],
                &run_graph(&before, vec![xin])[0],
                1e-5,
            );
        }
    }
}
