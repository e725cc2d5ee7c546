//! BatchNormalization folded into the Conv or Gemm producing its input (inference mode, all
//! parameters constant): `W' = W * s`, `b' = (b - mean) * s + B` with
//! `s = scale / sqrt(var + eps)` per output channel, computed in f64 and rounded once to the
//! weights' type. The producer then writes the BatchNorm's output directly. A Mul, Div, Add or
//! Sub of a Conv or Gemm output by a constant that is one value or one per output channel
//! (the `y * w0 + w1` of re-parameterised blocks, an unfolded BatchNorm exported as
//! arithmetic) folds the same way, repeatedly, so a Mul then an Add both go. An inference
//! BatchNorm no producer takes (a pre-activation one, as in DenseNet) becomes a
//! `ChannelAffine` with that scale and shift rounded to f32.

use super::edit::{Index, add_constant, binary, dtype_of, fixed_shape, is_float, remove_nodes};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::BinaryOp;
use kiln_ops::nn::{ChannelAffine, NnOp};
use kiln_ops::reduce::{BatchNorm, ReduceOp};
use kiln_tensor::{DType, Tensor};

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut total = 0;
    // Each round folds one affine step into each producer (a Mul, then the Add after it).
    for _ in 0..8 {
        let n = fold_round(g);
        total += n;
        if n == 0 {
            break;
        }
    }
    Ok(total + standalone(g))
}

/// Folds every BatchNorm or constant affine step whose producer takes it; returns how many.
fn fold_round(g: &mut Graph) -> usize {
    let index = Index::new(g);
    let mut plans = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        if let Some(p) = plan(g, &index, i, node) {
            plans.push(p);
        }
    }
    let mut dead = vec![false; g.nodes.len()];
    let count = plans.len();
    for p in plans {
        let base = g.nodes.get(p.producer).map_or_else(String::new, |n| n.name.clone());
        let w = add_constant(g, &format!("{base}.bn_weight"), p.weight);
        let b = add_constant(g, &format!("{base}.bn_bias"), p.bias);
        if let Some(node) = g.nodes.get_mut(p.producer) {
            node.inputs.truncate(1);
            node.inputs.push(Some(w));
            node.inputs.push(Some(b));
            node.outputs = vec![Some(p.output)];
            if let NodeKind::Op(Op::Nn(NnOp::Gemm(gemm))) = &mut node.kind {
                gemm.beta = 1.0;
            }
        }
        if let Some(d) = dead.get_mut(p.bn) {
            *d = true;
        }
    }
    remove_nodes(g, &dead);
    count
}

/// Every inference BatchNorm left (no producer took it) on an f32 X of known channel count,
/// with constant parameters, becomes a `ChannelAffine`: one scale and shift per channel
/// instead of four parameters and a square root per element.
fn standalone(g: &mut Graph) -> usize {
    let index = Index::new(g);
    let mut plans = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let NodeKind::Op(Op::Reduce(ReduceOp::BatchNormalization(bn))) = &node.kind else {
            continue;
        };
        let (Some(Some(x)), Some(Some(y))) = (node.inputs.first(), node.outputs.first()) else {
            continue;
        };
        let extra_read = node
            .outputs
            .iter()
            .skip(1)
            .flatten()
            .any(|v| !index.readers(*v).is_empty() || index.is_output(*v));
        let channels = fixed_shape(g, *x).and_then(|s| s.get(1).copied());
        if bn.training_mode || extra_read || dtype_of(g, *x) != Some(DType::F32) {
            continue;
        }
        let Some(aff) = channels.and_then(|c| channel_affine(g, &index, bn, node, c)) else {
            continue;
        };
        let c = aff.len();
        let (scale, shift): (Vec<f32>, Vec<f32>) = aff.iter().map(|&(s, t)| (s as f32, t as f32)).unzip();
        let (Ok(scale), Ok(shift)) = (Tensor::from_vec(vec![c], scale), Tensor::from_vec(vec![c], shift)) else {
            continue;
        };
        plans.push((i, *x, *y, scale, shift));
    }
    let count = plans.len();
    for (i, x, y, scale, shift) in plans {
        let base = g.nodes.get(i).map_or_else(String::new, |n| n.name.clone());
        let s = add_constant(g, &format!("{base}.scale"), scale);
        let t = add_constant(g, &format!("{base}.shift"), shift);
        if let Some(node) = g.nodes.get_mut(i) {
            node.kind = NodeKind::Op(Op::Nn(NnOp::ChannelAffine(ChannelAffine::default())));
            node.inputs = vec![Some(x), Some(s), Some(t)];
            node.outputs = vec![Some(y)];
        }
    }
    count
}

struct Plan {
    bn: usize,
    producer: usize,
    weight: Tensor,
    bias: Tensor,
    /// The BatchNorm's output, which the producer now writes.
    output: ValueId,
}

/// Per-channel BatchNorm parameters as (scale, shift) with `y = x * scale + shift`.
fn channel_affine(g: &Graph, index: &Index, bn: &BatchNorm, node: &Node, channels: usize) -> Option<Vec<(f64, f64)>> {
    let param = |k: usize| -> Option<Vec<f64>> {
        let t = index.tensor(g, node.inputs.get(k).copied().flatten()?)?;
        (is_float(t.dtype()) && t.len() == channels).then(|| t.to_f64_vec())
    };
    let (scale, bias, mean, var) = (param(1)?, param(2)?, param(3)?, param(4)?);
    let eps = bn.epsilon as f64;
    Some(
        scale
            .iter()
            .zip(&bias)
            .zip(mean.iter().zip(&var))
            .map(|((&sc, &b), (&m, &v))| {
                let s = sc / (v + eps).sqrt();
                (s, b - m * s)
            })
            .collect(),
    )
}

/// `b * s + t` per channel: an old bias through the BatchNorm's affine map.
fn shifted(b: &[f64], aff: &[(f64, f64)]) -> Vec<f64> {
    b.iter().zip(aff).map(|(&b, &(s, t))| b * s + t).collect()
}

/// What maps a producer's output channels: a BatchNorm, or arithmetic with a constant
/// (`x_first`: the producer's output is the left operand).
enum Affine<'a> {
    Bn(&'a BatchNorm),
    Const { op: BinaryOp, c: ValueId, x_first: bool },
}

impl Affine<'_> {
    /// `(scale, shift)` per channel of `channels`, with `y = x * scale + shift`; the producer's
    /// output has the channels on axis 1 of `out_rank` axes.
    fn params(
        &self,
        g: &Graph,
        index: &Index,
        node: &Node,
        channels: usize,
        out_rank: usize,
    ) -> Option<Vec<(f64, f64)>> {
        let (op, c, x_first) = match self {
            Affine::Bn(bn) => return channel_affine(g, index, bn, node, channels),
            Affine::Const { op, c, x_first } => (*op, *c, *x_first),
        };
        let t = index.tensor(g, c)?;
        if !is_float(t.dtype()) {
            return None;
        }
        let v = t.to_f64_vec();
        // One value, or one per channel laid along axis 1 once broadcast to the output.
        let off = out_rank.checked_sub(t.rank())?;
        let along_channels = t.len() == channels
            && t.shape()
                .iter()
                .enumerate()
                .all(|(j, &d)| if off + j == 1 { d == channels } else { d == 1 });
        let per: Vec<f64> = match v.as_slice() {
            [one] => vec![*one; channels],
            _ if along_channels => v,
            _ => return None,
        };
        per.into_iter()
            .map(|k| match (op, x_first) {
                (BinaryOp::Mul, _) => Some((k, 0.0)),
                (BinaryOp::Add, _) => Some((1.0, k)),
                (BinaryOp::Sub, true) => Some((1.0, -k)),
                (BinaryOp::Sub, false) => Some((-1.0, k)),
                (BinaryOp::Div, true) if k != 0.0 => Some((1.0 / k, 0.0)),
                _ => None,
            })
            .collect()
    }
}

fn plan(g: &Graph, index: &Index, i: usize, node: &Node) -> Option<Plan> {
    let y = node.outputs.first().copied().flatten()?;
    let (x, affine) = match &node.kind {
        NodeKind::Op(Op::Reduce(ReduceOp::BatchNormalization(bn))) => {
            if bn.training_mode {
                return None;
            }
            // The running-statistics outputs must be unread.
            for extra in node.outputs.iter().skip(1).flatten() {
                if !index.readers(*extra).is_empty() || index.is_output(*extra) {
                    return None;
                }
            }
            (node.inputs.first().copied().flatten()?, Affine::Bn(bn))
        }
        _ => {
            let (op, a, b) = binary(node)?;
            if !matches!(op, BinaryOp::Mul | BinaryOp::Div | BinaryOp::Add | BinaryOp::Sub) || node.outputs.len() != 1 {
                return None;
            }
            // The producer's output on one side, a constant on the other.
            let (x, c, x_first) = if index.tensor(g, b).is_some() {
                (a, b, true)
            } else if index.tensor(g, a).is_some() {
                (b, a, false)
            } else {
                return None;
            };
            if fixed_shape(g, x).is_none() || fixed_shape(g, x) != fixed_shape(g, y) {
                return None;
            }
            (x, Affine::Const { op, c, x_first })
        }
    };
    let p = index.producer(x)?;
    if !index.sole_use(x, i) {
        return None;
    }
    let prod = g.nodes.get(p)?;
    if prod.outputs.len() != 1 {
        return None;
    }
    let NodeKind::Op(Op::Nn(op)) = &prod.kind else {
        return None;
    };
    let w = index.tensor(g, prod.inputs.get(1).copied().flatten()?)?;
    if !is_float(w.dtype()) {
        return None;
    }
    let old_bias = match prod.inputs.get(2).copied().flatten() {
        Some(b) => Some(index.tensor(g, b)?),
        None => None,
    };
    let wv = w.to_f64_vec();
    let (weight, bias) = match op {
        NnOp::Conv(_) if prod.plan.is_none() && w.rank() >= 3 => {
            let m = *w.shape().first()?;
            let per = w.len() / m.max(1);
            let aff = affine.params(g, index, node, m, w.rank())?;
            let b0 = match old_bias {
                Some(b) if b.len() == m && is_float(b.dtype()) => b.to_f64_vec(),
                Some(_) => return None,
                None => vec![0.0; m],
            };
            // Output channel c owns the c-th block of `per` weights.
            let nw: Vec<f64> = wv
                .chunks(per.max(1))
                .zip(&aff)
                .flat_map(|(block, &(s, _))| block.iter().map(move |&v| v * s))
                .collect();
            (nw, shifted(&b0, &aff))
        }
        NnOp::Gemm(gemm) if prod.plan.is_none() => {
            let &[r, c] = w.shape() else { return None };
            let n = if gemm.trans_b { r } else { c };
            let aff = affine.params(g, index, node, n, 2)?;
            let beta = gemm.beta as f64;
            let c0: Vec<f64> = match old_bias {
                Some(b) if is_float(b.dtype()) && b.len() == n && b.shape().iter().rev().skip(1).all(|&d| d == 1) => {
                    b.to_f64_vec().into_iter().map(|v| v * beta).collect()
                }
                Some(b) if is_float(b.dtype()) && b.len() == 1 => vec![b.to_f64_vec().first()? * beta; n],
                Some(_) => return None,
                None => vec![0.0; n],
            };
            // Output column j is row j of B when transposed, else column j of every row.
            let nw: Vec<f64> = if gemm.trans_b {
                wv.chunks(c.max(1))
                    .zip(&aff)
                    .flat_map(|(row, &(s, _))| row.iter().map(move |&v| v * s))
                    .collect()
            } else {
                wv.chunks(c.max(1))
                    .flat_map(|row| row.iter().zip(&aff).map(|(&v, &(s, _))| v * s))
                    .collect()
            };
            (nw, shifted(&c0, &aff))
        }
        _ => return None,
    };
    let bias_dtype = old_bias.map_or(w.dtype(), Tensor::dtype);
    let n = bias.len();
    Some(Plan {
        bn: i,
        producer: p,
        weight: Tensor::from_f64(w.dtype(), w.shape().to_vec(), &weight).ok()?,
        bias: Tensor::from_f64(bias_dtype, vec![n], &bias).ok()?,
        output: y,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::nn::{Conv, Gemm};

    fn bn_op() -> Op {
        Op::Reduce(ReduceOp::BatchNormalization(BatchNorm {
            epsilon: 1e-5,
            momentum: 0.9,
            training_mode: false,
            saved_outputs: false,
        }))
    }

    #[test]
    fn conv_batchnorm_folds_into_the_conv() {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.constant("w", noise(&[3, 2, 3, 3], 1));
        let cb = b.constant("cb", noise(&[3], 2));
        let conv = Op::Nn(NnOp::Conv(Conv {
            pads: vec![1, 1, 1, 1],
            group: 1,
            ..Conv::default()
        }));
        let c = b.node(conv, &[Some(x), Some(w), Some(cb)], &[&[1, 3, 4, 4]])[0];
        let scale = b.constant("scale", f32s(&[3], &[1.5, -0.5, 2.0]));
        let shift = b.constant("shift", f32s(&[3], &[0.1, 0.2, -0.3]));
        let mean = b.constant("mean", f32s(&[3], &[0.3, -0.1, 0.0]));
        let var = b.constant("var", f32s(&[3], &[0.5, 2.0, 1.0]));
        let y = b.node(
            bn_op(),
            &[Some(c), Some(scale), Some(shift), Some(mean), Some(var)],
            &[&[1, 3, 4, 4]],
        )[0];
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Conv"]);
        assert_eq!(g.nodes[0].outputs, vec![Some(y)]);
        let xin = noise(&[1, 2, 4, 4], 3);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-6,
        );
    }

    #[test]
    fn constant_arithmetic_after_a_conv_folds_into_it() {
        // Conv -> Mul by one value -> Add of one value per channel -> Sub from a constant:
        // all three fold (one per round); a Mul by a per-pixel constant does not.
        use kiln_ops::elementwise::BinaryOp;
        let mut b = Builder::new();
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.constant("w", noise(&[3, 2, 3, 3], 1));
        let conv = Op::Nn(NnOp::Conv(Conv {
            pads: vec![1, 1, 1, 1],
            group: 1,
            ..Conv::default()
        }));
        let c = b.node(conv, &[Some(x), Some(w)], &[&[1, 3, 4, 4]])[0];
        let s = &[1, 3, 4, 4];
        let k = b.constant("k", f32s(&[1], &[1.75]));
        let t = b.constant("t", f32s(&[3, 1, 1], &[0.5, -1.0, 2.0]));
        let one = b.constant("one", f32s(&[1], &[1.0]));
        let pixel = b.constant("pixel", noise(&[1, 1, 4, 4], 2));
        let m = b.binary(BinaryOp::Mul, c, k, s);
        let a = b.binary(BinaryOp::Add, t, m, s);
        let d = b.binary(BinaryOp::Sub, one, a, s);
        let y = b.binary(BinaryOp::Mul, d, pixel, s);
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 3);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Conv", "Mul"]);
        let xin = noise(&[1, 2, 4, 4], 3);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-5,
        );
    }

    #[test]
    fn gemm_batchnorm_folds_and_shared_inputs_do_not() {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 3]);
        let w = b.constant("w", noise(&[4, 3], 4));
        let gemm = Op::Nn(NnOp::Gemm(Gemm {
            trans_b: true,
            beta: 0.5,
            ..Gemm::default()
        }));
        let cc = b.constant("c", noise(&[4], 5));
        let h = b.node(gemm, &[Some(x), Some(w), Some(cc)], &[&[2, 4]])[0];
        let p: Vec<ValueId> = (0..4)
            .map(|k| b.constant(&format!("p{k}"), f32s(&[4], &[0.5 + k as f32, 1.0, 2.0, 0.25])))
            .collect();
        let y = b.node(
            bn_op(),
            &[Some(h), Some(p[0]), Some(p[1]), Some(p[2]), Some(p[3])],
            &[&[2, 4]],
        )[0];
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        assert_eq!(op_names(&g), ["Gemm"]);
        let xin = noise(&[2, 3], 6);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-6,
        );
        // The Gemm's output is also a graph output: no fold. The BatchNorm becomes a
        // ChannelAffine of the same values instead.
        let mut g = before.clone();
        g.outputs.push(g.nodes[0].outputs[0].unwrap());
        let shared = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        assert_eq!(op_names(&g), ["Gemm", "ChannelAffine"]);
        let xin = noise(&[2, 3], 7);
        let (a, b) = (run_graph(&g, vec![xin.clone()]), run_graph(&shared, vec![xin]));
        for (p, q) in a.iter().zip(&b) {
            assert_close(p, q, 1e-6);
        }
        // In training mode, or with X of another type, the BatchNorm stays.
        let mut g = shared.clone();
        if let NodeKind::Op(Op::Reduce(ReduceOp::BatchNormalization(bn))) = &mut g.nodes[1].kind {
            bn.training_mode = true;
        }
        assert_eq!(run(&mut g).unwrap(), 0);
    }
}
