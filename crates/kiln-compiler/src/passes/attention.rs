//! Attention recognition: the scaled dot-product attention subgraph transformer exporters emit
//! (PyTorch for BERT, MiniLM, ViT, ...) becomes one ONNX `Attention` node on the 3-D inputs.
//!
//! The pattern, from the three `[B, S, H·D]` projections to the `[B, S_q, H·D_v]` result:
//!
//! ```text
//! Q: Reshape [B,S_q,H,D]  → Transpose (0,2,1,3) → (× or ÷ scalar)? ─┐
//! K: Reshape [B,S_kv,H,D] → Transpose (0,2,3,1) → (× or ÷ scalar)? ─┤   (or (0,2,1,3) then (0,1,3,2))
//!    MatMul → (× or ÷ scalar)? → (+ mask)? → Softmax(last axis) ─────┤
//! V: Reshape [B,S_kv,H,D_v] → Transpose (0,2,1,3) ──────────────────┤
//!    MatMul → Transpose (0,2,1,3) → Reshape [B,S_q,H·D_v]
//! ```
//!
//! becomes `Attention(Q, K, V, mask?)` with `q_num_heads = kv_num_heads = H` and `scale` the
//! product of the scalar factors (1 when there are none). The mask must be a float additive
//! mask of the scores' type whose last dim is `S_kv` and whose other dims are 1 or the scores'
//! (Attention pads a shorter last dim with -inf where `Add` would broadcast it).
//!
//! Rewritten only when every intermediate value is read by the next node of the pattern alone
//! and is not a graph output, every Reshape target is a constant that gives exactly the split
//! or merge of the last axis shown above, the perms and the Softmax axis are the ones above,
//! the head count and sizes agree across Q, K and V, and everything is one float type.
//! Attention computes in f64 and rounds where the ONNX reference casts (the scaled Q and K,
//! the logits, the probabilities), where the subgraph rounded after each op: results agree to
//! the last bits of the type. One difference at the edge: a score row whose mask is -inf
//! everywhere gives zeros from Attention and NaN from the Softmax (exporters' masks use the
//! type's lowest finite value, which both treat alike).

use super::edit::{Index, binary, dtype_of, is_float, mark, op, remove_nodes, shape_of};
use crate::CompileError;
use kiln_ir::{Dim, Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::BinaryOp;
use kiln_ops::movement::{MovementOp, Reshape, Transpose};
use kiln_ops::nn::{MatMul, NnOp};
use kiln_ops::recurrent::{Attention, RecurrentOp};
use kiln_ops::reduce::{ReduceOp, Softmax, SoftmaxKind};
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let m = Matcher { g, index: &index };
    let mut taken = vec![false; g.nodes.len()];
    let mut plans: Vec<Plan> = Vec::new();
    for i in 0..g.nodes.len() {
        let Some(p) = m.attention(i) else { continue };
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
            node.kind = NodeKind::Op(Op::Recurrent(RecurrentOp::Attention(p.op.clone())));
            node.inputs = p.inputs.clone();
        }
    }
    remove_nodes(g, &dead);
    Ok(plans.len())
}

/// A recognised attention: its nodes (the anchor, the final Reshape, becomes the Attention node
/// and keeps its output; the others go), the op and its inputs.
struct Plan {
    anchor: usize,
    nodes: Vec<usize>,
    op: Attention,
    inputs: Vec<Option<ValueId>>,
}

struct Matcher<'a> {
    g: &'a Graph,
    index: &'a Index,
}

/// `(0, 2, 1, 3)`: `[B, S, H, D]` ↔ `[B, H, S, D]`.
const SWAP_SEQ_HEADS: [i64; 4] = [0, 2, 1, 3];
/// `(0, 2, 3, 1)`: `[B, S, H, D]` → `[B, H, D, S]`.
const TO_KEYS_T: [i64; 4] = [0, 2, 3, 1];
/// `(0, 1, 3, 2)`: the last two axes swapped.
const SWAP_LAST: [i64; 4] = [0, 1, 3, 2];

/// The fixed size of a dim.
fn fixed(d: &Dim) -> Option<usize> {
    match d {
        Dim::Fixed(n) => Some(*n),
        Dim::Sym(_) => None,
    }
}

/// Whether the Reshape target `spec` takes a tensor of shape `from` to shape `to` (already known
/// to hold as many elements): every entry is the target dim, a copied input dim (0, without
/// `allowzero`) or the single inferred -1.
fn target_fits(spec: &[i64], allowzero: bool, from: &[Dim], to: &[Dim]) -> bool {
    if spec.len() != to.len() || spec.iter().filter(|&&s| s == -1).count() > 1 {
        return false;
    }
    spec.iter().zip(to).enumerate().all(|(k, (&s, d))| match s {
        -1 => true,
        0 => !allowzero && from.get(k) == Some(d),
        s => usize::try_from(s).is_ok_and(|s| *d == Dim::Fixed(s)),
    })
}

/// The dims of a 3-D `[B, S, H·D]` value split into heads as `[B, S, H, D]`.
struct Split<'a> {
    batch: &'a Dim,
    seq: &'a Dim,
    heads: usize,
    size: usize,
}

impl Matcher<'_> {
    /// The node producing `v` when it is a one-output node, `v` is read by `reader` alone and
    /// `v` is not a graph output.
    fn private(&self, v: ValueId, reader: usize) -> Option<(usize, &Node)> {
        let p = self.index.producer(v)?;
        self.index.sole_use(v, reader).then_some(())?;
        let node = self.g.nodes.get(p)?;
        (node.outputs.len() == 1).then_some((p, node))
    }

    /// The input of a private Transpose with permutation `perm` producing `v`.
    fn transpose(&self, v: ValueId, reader: usize, perm: &[i64]) -> Option<(usize, ValueId)> {
        let (p, node) = self.private(v, reader)?;
        match (op(node)?, node.inputs.as_slice()) {
            (Op::Movement(MovementOp::Transpose(Transpose { perm: Some(got) })), [Some(x)]) if got == perm => {
                Some((p, *x))
            }
            _ => None,
        }
    }

    /// The input of a private Reshape producing `v` whose constant target takes the input's
    /// shape to `v`'s.
    fn reshape(&self, v: ValueId, reader: usize) -> Option<(usize, ValueId)> {
        let (p, node) = self.private(v, reader)?;
        Some((p, self.fitting_reshape(node, v)?))
    }

    /// The input of `node` when it is a Reshape to `y` whose constant target (input or opset-1
    /// attribute) takes the input's shape to `y`'s.
    fn fitting_reshape(&self, node: &Node, y: ValueId) -> Option<ValueId> {
        let Op::Movement(MovementOp::Reshape(Reshape { shape, allowzero })) = op(node)? else {
            return None;
        };
        let (x, spec) = match (shape, node.inputs.as_slice()) {
            (Some(spec), [Some(x)]) => (*x, spec.clone()),
            (None, [Some(x), Some(t)]) => (*x, self.index.tensor(self.g, *t)?.to_i64_vec()?),
            _ => return None,
        };
        target_fits(&spec, *allowzero, shape_of(self.g, x)?, shape_of(self.g, y)?).then_some(x)
    }

    /// The two inputs of a private plain MatMul (no bias, no epilogue) producing `v`.
    fn matmul(&self, v: ValueId, reader: usize) -> Option<(usize, ValueId, ValueId)> {
        let (p, node) = self.private(v, reader)?;
        match (op(node)?, node.inputs.as_slice()) {
            (Op::Nn(NnOp::MatMul(MatMul {})), [Some(a), Some(b)]) if node.plan.is_none() => Some((p, *a, *b)),
            _ => None,
        }
    }

    /// Peels an optional private `v = x * c`, `c * x` or `x / c` by a one-element float constant
    /// that leaves the shape alone: (x, the factor, the node). Without one: (v, 1, None).
    fn scaled(&self, v: ValueId, reader: usize) -> (ValueId, f64, Option<usize>) {
        let peeled = || -> Option<(ValueId, f64, Option<usize>)> {
            let (p, node) = self.private(v, reader)?;
            let (kind, a, b) = binary(node)?;
            let c = |x: ValueId| self.index.scalar(self.g, x);
            let (x, factor) = match kind {
                BinaryOp::Mul => match (c(a), c(b)) {
                    (_, Some(k)) => (a, k),
                    (Some(k), None) => (b, k),
                    (None, None) => return None,
                },
                BinaryOp::Div => (a, 1.0 / c(b)?),
                _ => return None,
            };
            (shape_of(self.g, x)? == shape_of(self.g, v)?).then_some((x, factor, Some(p)))
        };
        peeled().unwrap_or((v, 1.0, None))
    }

    /// Whether `v` has the static shape `want`.
    fn shape_is(&self, v: ValueId, want: &[&Dim]) -> bool {
        shape_of(self.g, v).is_some_and(|s| s.len() == want.len() && s.iter().zip(want).all(|(a, b)| a == *b))
    }

    /// The split of a head Reshape from `x` (`[B, S, H·D]`) to `r` (`[B, S, H, D]`).
    fn split(&self, x: ValueId, r: ValueId) -> Option<Split<'_>> {
        let [b, s, hd] = shape_of(self.g, x)? else {
            return None;
        };
        let [b2, s2, h, d] = shape_of(self.g, r)? else {
            return None;
        };
        let (heads, size) = (fixed(h)?, fixed(d)?);
        let ok = b == b2 && s == s2 && heads > 0 && size > 0 && heads.checked_mul(size) == fixed(hd);
        ok.then_some(Split {
            batch: b,
            seq: s,
            heads,
            size,
        })
    }

    /// K from the MatMul's second operand `kt` (`[B, H, D, S_kv]`), read by node `reader`:
    /// `Transpose(0,2,3,1)` of the head Reshape, or `Transpose(0,1,3,2)` of `Transpose(0,2,1,3)`
    /// of it. Returns (K, the head-split value, the nodes).
    fn keys(&self, kt: ValueId, reader: usize) -> Option<(ValueId, ValueId, Vec<usize>)> {
        let (t, kr, mut nodes) = match self.transpose(kt, reader, &TO_KEYS_T) {
            Some((t, kr)) => (t, kr, vec![t]),
            None => {
                let (t1, k4) = self.transpose(kt, reader, &SWAP_LAST)?;
                let (t2, kr) = self.transpose(k4, t1, &SWAP_SEQ_HEADS)?;
                (t2, kr, vec![t1, t2])
            }
        };
        let (r, k3) = self.reshape(kr, t)?;
        nodes.push(r);
        Some((k3, kr, nodes))
    }

    fn attention(&self, i: usize) -> Option<Plan> {
        // y = Reshape(Transpose(MatMul(P, V4))) of shape [B, S_q, H·D_v].
        let node = self.g.nodes.get(i)?;
        let [Some(y)] = node.outputs.as_slice() else {
            return None;
        };
        let y = *y;
        let dt = dtype_of(self.g, y)?;
        if !is_float(dt) {
            return None;
        }
        let x = self.fitting_reshape(node, y)?;
        let (t_out, o) = self.transpose(x, i, &SWAP_SEQ_HEADS)?;
        let (pv, probs, v4) = self.matmul(o, t_out)?;
        let out = self.split(y, x)?;

        // V: [B, S_kv, H·D_v] → [B, S_kv, H, D_v] → [B, H, S_kv, D_v].
        let (t_v, vr) = self.transpose(v4, pv, &SWAP_SEQ_HEADS)?;
        let (r_v, v3) = self.reshape(vr, t_v)?;
        let vs = self.split(v3, vr)?;

        // P = Softmax over the last axis of the (scaled, masked) scores.
        let (sm, sm_node) = self.private(probs, pv)?;
        let z = match (op(sm_node)?, sm_node.inputs.as_slice()) {
            (
                Op::Reduce(ReduceOp::Softmax(Softmax {
                    kind: SoftmaxKind::Softmax,
                    axis: 3 | -1,
                    ..
                })),
                [Some(z)],
            ) => *z,
            _ => return None,
        };
        let mut nodes = vec![i, t_out, pv, t_v, r_v, sm];
        // z = scores + mask, or the scores alone.
        let (scores, mask) = match self.private(z, sm).and_then(|(p, n)| Some((p, binary(n)?))) {
            Some((add, (BinaryOp::Add, a, b))) => {
                let pick = [(a, b), (b, a)]
                    .into_iter()
                    .find(|&(s, _)| self.scores(s, add).is_some())?;
                nodes.push(add);
                (Some((pick.0, add)), Some(pick.1))
            }
            _ => (None, None),
        };
        let (s, s_reader) = scores.unwrap_or((z, sm));
        let (mm, qa, ka, s_factor, s_nodes) = self.scores(s, s_reader)?;
        nodes.push(mm);
        nodes.extend(s_nodes);

        // Q: [B, S_q, H·D] → [B, S_q, H, D] → [B, H, S_q, D], optionally scaled.
        let (q4, q_factor, q_node) = self.scaled(qa, mm);
        let q_reader = q_node.unwrap_or(mm);
        let (t_q, qr) = self.transpose(q4, q_reader, &SWAP_SEQ_HEADS)?;
        let (r_q, q3) = self.reshape(qr, t_q)?;
        let qs = self.split(q3, qr)?;
        nodes.extend(q_node);
        nodes.extend([t_q, r_q]);

        // K: [B, S_kv, H·D] → [B, S_kv, H, D] → [B, H, D, S_kv], optionally scaled.
        let (kt, k_factor, k_node) = self.scaled(ka, mm);
        let (k3, kr, k_nodes) = self.keys(kt, k_node.unwrap_or(mm))?;
        let ks = self.split(k3, kr)?;
        nodes.extend(k_node);
        nodes.extend(k_nodes);

        // One batch, head count and head size; K and V share their positions; the output is
        // [B, S_q, H·D_v].
        let heads = qs.heads;
        let same_heads = [ks.heads, vs.heads, out.heads].iter().all(|&h| h == heads);
        if !same_heads
            || ks.size != qs.size
            || out.size != vs.size
            || [ks.batch, vs.batch, out.batch].iter().any(|&b| b != qs.batch)
            || ks.seq != vs.seq
            || out.seq != qs.seq
        {
            return None;
        }
        let (b, sq, skv) = (qs.batch, qs.seq, ks.seq);
        let h = Dim::Fixed(heads);
        let (d, dv) = (Dim::Fixed(qs.size), Dim::Fixed(vs.size));
        // The 4-D values have the shapes the perms give (the Reshapes' were checked by split).
        let shapes_hold = self.shape_is(q4, &[b, &h, sq, &d])
            && self.shape_is(qa, &[b, &h, sq, &d])
            && self.shape_is(kt, &[b, &h, &d, skv])
            && self.shape_is(ka, &[b, &h, &d, skv])
            && self.shape_is(v4, &[b, &h, skv, &dv])
            && [s, z, probs].iter().all(|&v| self.shape_is(v, &[b, &h, sq, skv]))
            && self.shape_is(o, &[b, &h, sq, &dv]);
        if !shapes_hold {
            return None;
        }
        if [q3, k3, v3].iter().any(|&v| dtype_of(self.g, v) != Some(dt)) {
            return None;
        }
        if let Some(mk) = mask
            && !self.mask_fits(mk, dt, &[b, &h, sq, skv])
        {
            return None;
        }
        let scale = self.scale(q_factor * k_factor * s_factor, dt)?;
        let mut inputs = vec![Some(q3), Some(k3), Some(v3)];
        inputs.extend(mask.map(Some));
        Some(Plan {
            anchor: i,
            nodes,
            op: Attention {
                is_causal: false,
                q_num_heads: Some(heads),
                kv_num_heads: Some(heads),
                scale: Some(scale),
                softcap: 0.0,
                qk_matmul_output_mode: 0,
                softmax_precision: None,
                left_window_size: -1,
                right_window_size: -1,
            },
            inputs,
        })
    }

    /// The unmasked scores `s` read by `reader`: `MatMul(qa, ka)`, optionally scaled. Returns
    /// (the MatMul, qa, ka, the factor, the scaling node).
    fn scores(&self, s: ValueId, reader: usize) -> Option<(usize, ValueId, ValueId, f64, Option<usize>)> {
        let (raw, factor, node) = self.scaled(s, reader);
        let (mm, qa, ka) = self.matmul(raw, node.unwrap_or(reader))?;
        Some((mm, qa, ka, factor, node))
    }

    /// Whether `m` is an additive mask Attention applies as `Add` did: of type `dt`, rank 1 to
    /// 4, last dim the keys' length, every other dim 1 or the scores'.
    fn mask_fits(&self, m: ValueId, dt: DType, scores: &[&Dim; 4]) -> bool {
        let Some(ms) = shape_of(self.g, m) else {
            return false;
        };
        if dtype_of(self.g, m) != Some(dt) || ms.is_empty() || ms.len() > 4 {
            return false;
        }
        let off = 4 - ms.len();
        ms.iter().enumerate().all(|(k, d)| {
            let target = scores.get(k + off).copied();
            if k + 1 == ms.len() {
                target == Some(d)
            } else {
                *d == Dim::Fixed(1) || target == Some(d)
            }
        })
    }

    /// The Attention `scale` attribute (an f32) for the combined factor, when it is positive and
    /// finite and, for f64 graphs, exactly an f32 (anything else would round more than the
    /// graph did).
    fn scale(&self, factor: f64, dt: DType) -> Option<f32> {
        let s = factor as f32;
        let exact = dt != DType::F64 || f64::from(s) == factor;
        (s.is_finite() && s > 0.0 && exact).then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::UnaryOp;
    use kiln_tensor::Tensor;

    const B: usize = 2;
    const S: usize = 4;
    const H: usize = 2;
    const D: usize = 4;
    const HD: usize = H * D;

    /// How the exporter scales the scores.
    #[derive(Clone, Copy, PartialEq)]
    enum Scale {
        /// `scores / sqrt(D)`.
        Div,
        /// `scores * (1 / sqrt(D))`, the constant first.
        Mul,
        /// `(Q * D^-1/4) · (Kᵀ * D^-1/4)`.
        Split,
    }

    struct Variant {
        scale: Scale,
        mask: bool,
        /// K transposed by (0,2,1,3) then (0,1,3,2) instead of (0,2,3,1) at once.
        two_k_transposes: bool,
        /// The scaled scores have a second reader (a Neg whose result is a graph output).
        scores_read_twice: bool,
        /// The raw scores are also a graph output.
        scores_output: bool,
        /// K transposed by (0,2,1,3) only: scores are Q·K, not Q·Kᵀ (the shapes allow it as
        /// S == D).
        wrong_k_perm: bool,
        softmax_axis: i64,
    }

    const PLAIN: Variant = Variant {
        scale: Scale::Div,
        mask: false,
        two_k_transposes: false,
        scores_read_twice: false,
        scores_output: false,
        wrong_k_perm: false,
        softmax_axis: -1,
    };

    fn transpose(b: &mut Builder, x: ValueId, perm: [i64; 4], out: &[usize]) -> ValueId {
        let t = Op::Movement(MovementOp::Transpose(Transpose {
            perm: Some(perm.to_vec()),
        }));
        b.node(t, &[Some(x)], &[out])[0]
    }

    fn matmul(b: &mut Builder, a: ValueId, c: ValueId, out: &[usize]) -> ValueId {
        b.node(Op::Nn(NnOp::MatMul(MatMul::default())), &[Some(a), Some(c)], &[out])[0]
    }

    /// The PyTorch export of BERT's self-attention on inputs q, k, v `[B, S, H·D]` (and mask
    /// `[B, 1, 1, S]`).
    fn graph(v: &Variant) -> Graph {
        let mut b = Builder::new();
        let q = b.input("q", &[B, S, HD]);
        let k = b.input("k", &[B, S, HD]);
        let val = b.input("v", &[B, S, HD]);
        let mask = v.mask.then(|| b.input("mask", &[B, 1, 1, S]));
        let split = b.constant(
            "split",
            Tensor::from_vec(vec![4], vec![B as i64, S as i64, -1, D as i64]).unwrap(),
        );
        let merge = b.constant("merge", Tensor::from_vec(vec![3], vec![0i64, 0, HD as i64]).unwrap());
        let heads = |b: &mut Builder, x: ValueId| b.node(reshape(), &[Some(x), Some(split)], &[&[B, S, H, D]])[0];
        let qr = heads(&mut b, q);
        let mut q4 = transpose(&mut b, qr, SWAP_SEQ_HEADS, &[B, H, S, D]);
        let kr = heads(&mut b, k);
        let mut kt = if v.wrong_k_perm {
            transpose(&mut b, kr, SWAP_SEQ_HEADS, &[B, H, S, D])
        } else if v.two_k_transposes {
            let k4 = transpose(&mut b, kr, SWAP_SEQ_HEADS, &[B, H, S, D]);
            transpose(&mut b, k4, SWAP_LAST, &[B, H, D, S])
        } else {
            transpose(&mut b, kr, TO_KEYS_T, &[B, H, D, S])
        };
        let vr = heads(&mut b, val);
        let v4 = transpose(&mut b, vr, SWAP_SEQ_HEADS, &[B, H, S, D]);
        let sc = &[B, H, S, S];
        if v.scale == Scale::Split {
            let c = b.constant("sqrt_scale", f32s(&[], &[(D as f32).powf(-0.25)]));
            q4 = b.binary(BinaryOp::Mul, q4, c, &[B, H, S, D]);
            kt = b.binary(BinaryOp::Mul, kt, c, &[B, H, D, S]);
        }
        let raw = matmul(&mut b, q4, kt, sc);
        let scaled = match v.scale {
            Scale::Div => {
                let c = b.constant("sqrt_d", f32s(&[], &[(D as f32).sqrt()]));
                b.binary(BinaryOp::Div, raw, c, sc)
            }
            Scale::Mul => {
                let c = b.constant("scale", f32s(&[1], &[1.0 / (D as f32).sqrt()]));
                b.binary(BinaryOp::Mul, c, raw, sc)
            }
            Scale::Split => raw,
        };
        let z = match mask {
            Some(m) => b.binary(BinaryOp::Add, scaled, m, sc),
            None => scaled,
        };
        let softmax = Op::Reduce(ReduceOp::Softmax(Softmax {
            kind: SoftmaxKind::Softmax,
            axis: v.softmax_axis,
            coerce_2d: false,
        }));
        let p = b.node(softmax, &[Some(z)], &[sc])[0];
        let o = matmul(&mut b, p, v4, &[B, H, S, D]);
        let ot = transpose(&mut b, o, SWAP_SEQ_HEADS, &[B, S, H, D]);
        let y = b.node(reshape(), &[Some(ot), Some(merge)], &[&[B, S, HD]])[0];
        let y = b.unary(UnaryOp::Neg, y, &[B, S, HD]);
        let mut outs = vec![y];
        if v.scores_read_twice {
            outs.push(b.unary(UnaryOp::Neg, scaled, sc));
        }
        if v.scores_output {
            outs.push(raw);
        }
        b.finish(&outs)
    }

    fn inputs(mask: bool) -> Vec<Tensor> {
        let mut v = vec![noise(&[B, S, HD], 1), noise(&[B, S, HD], 2), noise(&[B, S, HD], 3)];
        if mask {
            // BERT's mask: 0 where attended, the lowest f32 where padded (the last key of the
            // second sequence).
            let mut m = vec![0.0f32; B * S];
            m[B * S - 1] = f32::MIN;
            v.push(f32s(&[B, 1, 1, S], &m));
        }
        v
    }

    #[test]
    fn exported_attention_becomes_one_op() {
        let variants = [
            Variant { ..PLAIN },
            Variant {
                scale: Scale::Mul,
                mask: true,
                ..PLAIN
            },
            Variant {
                mask: true,
                two_k_transposes: true,
                softmax_axis: 3,
                ..PLAIN
            },
            Variant {
                scale: Scale::Split,
                ..PLAIN
            },
            Variant {
                scale: Scale::Split,
                mask: true,
                two_k_transposes: true,
                ..PLAIN
            },
        ];
        for v in &variants {
            let mut g = graph(v);
            let before = g.clone();
            assert_eq!(run(&mut g).unwrap(), 1);
            g.verify().unwrap();
            assert_eq!(op_names(&g), ["Attention", "Neg"]);
            let NodeKind::Op(Op::Recurrent(RecurrentOp::Attention(a))) = &g.nodes[0].kind else {
                panic!("not an Attention");
            };
            assert_eq!((a.q_num_heads, a.kv_num_heads), (Some(H), Some(H)));
            let scale = a.scale.unwrap();
            assert!((scale - 0.5).abs() < 1e-6, "scale {scale}");
            assert_eq!(g.nodes[0].inputs.len(), if v.mask { 4 } else { 3 });
            let xs = inputs(v.mask);
            assert_close(&run_graph(&g, xs.clone())[0], &run_graph(&before, xs)[0], 1e-5);
        }
    }

    #[test]
    fn unfit_subgraphs_stay() {
        let variants = [
            Variant {
                scores_read_twice: true,
                mask: true,
                ..PLAIN
            },
            Variant {
                scores_output: true,
                ..PLAIN
            },
            Variant {
                wrong_k_perm: true,
                mask: true,
                ..PLAIN
            },
            Variant {
                softmax_axis: 2,
                ..PLAIN
            },
        ];
        for v in &variants {
            let mut g = graph(v);
            let before = g.clone();
            assert_eq!(run(&mut g).unwrap(), 0);
            assert_eq!(g, before);
        }
    }

    #[test]
    fn target_fits_checks_every_entry() {
        let d = |v: &[usize]| v.iter().map(|&n| Dim::Fixed(n)).collect::<Vec<_>>();
        let (from, to) = (d(&[2, 4, 8]), d(&[2, 4, 2, 4]));
        assert!(target_fits(&[2, 4, -1, 4], false, &from, &to));
        assert!(target_fits(&[0, 0, 2, 4], false, &from, &to));
        assert!(!target_fits(&[0, 0, 2, 4], true, &from, &to));
        assert!(!target_fits(&[2, 4, 4, 2], false, &from, &to));
        assert!(!target_fits(&[-1, 4, -1, 4], false, &from, &to));
        assert!(!target_fits(&[0, 0, 0, 4], false, &from, &to));
    }
}
