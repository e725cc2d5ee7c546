//! What QDQ graphs leave between their integer nodes. ONNX Runtime's quantizer puts a
//! `QuantizeLinear -> DequantizeLinear` pair after nearly every op, data movement included;
//! the ops kiln runs in float (Softmax, LayerNorm, GELU, a bias Add) read the dequantized
//! values. Two exact rewrites, both with one scale and zero point (constants) per tensor:
//!
//! 1. **8-bit data movement.** `Q(M(DQ(x_q)))` with `M` an op that only moves or selects
//!    elements (Reshape, Transpose, Slice, Gather, ...) or a MaxPool (whose result is one of
//!    its taps, and quantization keeps order) and the same scale, zero point and type on both
//!    sides is `M(x_q)`: requantizing a dequantized value gives it back (for an 8-bit
//!    integer `k` and a scale between 1e-30 and 1e30, `round((k * s) / s) = k` in f32, the two
//!    roundings being far below one half). The movement then moves a quarter of the bytes.
//! 2. **Round trips.** A `QuantizeLinear` that only `DequantizeLinear`s of the same
//!    parameters read becomes one `ElementwiseChain` step, `FakeQuantize`: one pass instead of
//!    two and no 8-bit tensor in between, with the same bits (`fake_quantize_row`). The chain
//!    pass then joins it with the arithmetic around it.
//!
//! 3. **8-bit concatenation.** `Q(Concat(DQ(x_1), ..., DQ(x_n)))` is `Concat(Q(DQ(x_1)), ...,
//!    Q(DQ(x_n)))` element for element (a concatenation only moves elements): the inputs
//!    quantized with the output's parameters already are `x_i` (rule 1's argument); the others
//!    are requantized by a 256-entry table of their bytes (`Lookup8`, made by running the two
//!    ops on the 256 codes: the same bits), and the concatenation moves bytes. DenseNet's
//!    and SqueezeNet's blocks, and detectors' feature pyramids, concatenate branches on
//!    different scales this way.
//!
//! 4. **Per-channel affines on 8 bits.** A `ChannelAffine` (a BatchNormalization no
//!    convolution absorbed: DenseNet's `BN -> ReLU` before each convolution) reading a
//!    DequantizeLinear reads its 8-bit input instead, and one whose only reader is a
//!    QuantizeLinear writes that 8-bit output itself: one pass over a quarter of the bytes,
//!    by the two ops' own kernels (the same bits).
//!
//! Runs after the fusions that match `Q`/`DQ` patterns (the integer products, convolutions and
//! sums) and after the layout is final, before the chain pass.

use super::dce;
use super::edit::{Index, dtype_of, op, replace_all};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::{ChainDequantize, ChainQuantize, Lookup8, LookupTable};
use kiln_ops::elementwise::{ChainStep, ElementwiseChain, ElementwiseOp};
use kiln_ops::movement::MovementOp;
use kiln_ops::nn::{NnOp, Pool, PoolKind};
use kiln_ops::quant::{DequantizeLinear, QuantOp, QuantizeLinear};
use kiln_ops::value::Args;
use kiln_ops::{TensorType, Value, ValueType};
use kiln_tensor::{DType, Tensor};
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = 0;
    // Each movement rewrite exposes the next one down a chain of movements; the graph has
    // finitely many quantize nodes, each rewritten at most once.
    for _ in 0..g.nodes.len() {
        let n = movements(g);
        if n == 0 {
            break;
        }
        count += n;
        dce::run(g)?;
    }
    let n = concats(g) + affines(g);
    if n > 0 {
        count += n;
        dce::run(g)?;
    }
    count += round_trips(g);
    Ok(count)
}

/// One scale and zero point of an 8-bit type, as constants.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct Params {
    pub scale: f32,
    pub zero_point: i32,
    pub dtype: DType,
}

impl Params {
    /// Scales between which requantizing a dequantized 8-bit value is exact.
    fn invertible(&self) -> bool {
        self.scale > 1e-30 && self.scale < 1e30
    }

    fn range(&self) -> (f32, f32) {
        match self.dtype {
            DType::I8 => (-128.0, 127.0),
            _ => (0.0, 255.0),
        }
    }
}

/// The constant per-tensor parameters of a Q/DQ node's inputs 1 and 2, `dtype` its 8-bit side.
fn params(g: &Graph, index: &Index, node: &Node, dtype: DType) -> Option<Params> {
    if !matches!(dtype, DType::U8 | DType::I8) {
        return None;
    }
    let s = index.tensor(g, (*node.inputs.get(1)?)?)?;
    if s.len() != 1 || s.dtype() != DType::F32 {
        return None;
    }
    let scale = *s.as_slice::<f32>().ok()?.first()?;
    if !(scale.is_finite() && scale > 0.0) {
        return None;
    }
    let zero_point = match node.inputs.get(2).copied().flatten() {
        None => 0,
        Some(z) => {
            let t = index.tensor(g, z)?;
            if t.len() != 1 || t.dtype() != dtype {
                return None;
            }
            *t.to_f64_vec().first()? as i32
        }
    };
    Some(Params {
        scale,
        zero_point,
        dtype,
    })
}

/// A per-tensor f32 -> 8-bit QuantizeLinear: its input, output and parameters.
pub(crate) fn quantize(g: &Graph, index: &Index, node: &Node) -> Option<(ValueId, ValueId, Params)> {
    let ok = matches!(
        op(node),
        Some(Op::Quant(QuantOp::QuantizeLinear(QuantizeLinear {
            block_size: 0,
            precision: None | Some(DType::F32),
            ..
        })))
    );
    conversion(g, index, node, ok, true)
}

/// A per-tensor 8-bit -> f32 DequantizeLinear: its input, output and parameters.
pub(crate) fn dequantize(g: &Graph, index: &Index, node: &Node) -> Option<(ValueId, ValueId, Params)> {
    let ok = matches!(
        op(node),
        Some(Op::Quant(QuantOp::DequantizeLinear(DequantizeLinear {
            block_size: 0,
            output_dtype: None | Some(DType::F32),
            ..
        })))
    );
    conversion(g, index, node, ok, false)
}

/// A one-in, one-out conversion between f32 and 8 bits (`to_8_bit`: f32 in) whose op `ok`
/// accepted: its input, output and parameters.
fn conversion(g: &Graph, index: &Index, node: &Node, ok: bool, to_8_bit: bool) -> Option<(ValueId, ValueId, Params)> {
    let (true, Some(Some(x)), [Some(y)]) = (ok, node.inputs.first(), node.outputs.as_slice()) else {
        return None;
    };
    let (float, bytes) = if to_8_bit { (*x, *y) } else { (*y, *x) };
    if dtype_of(g, float) != Some(DType::F32) {
        return None;
    }
    Some((*x, *y, params(g, index, node, dtype_of(g, bytes)?)?))
}

/// Ops whose output's elements are elements of input 0 (the other inputs being indices,
/// shapes or axes): they commute with any elementwise map, quantization included.
pub(crate) fn moves_elements(op: &Op) -> bool {
    matches!(
        op,
        Op::Movement(
            MovementOp::Reshape(_)
                | MovementOp::Flatten(_)
                | MovementOp::Squeeze(_)
                | MovementOp::Unsqueeze(_)
                | MovementOp::Transpose(_)
                | MovementOp::Slice(_)
                | MovementOp::Expand(_)
                | MovementOp::Tile(_)
                | MovementOp::DepthToSpace(_)
                | MovementOp::SpaceToDepth(_)
                | MovementOp::Gather(_)
                | MovementOp::Identity(_)
        )
    )
}

/// Rewrites every `Q(M(DQ(x_q)))` of equal parameters to `M(x_q)`, in the quantize node's
/// place and with its output; returns how many.
fn movements(g: &mut Graph) -> usize {
    let index = Index::new(g);
    let mut found: Vec<(usize, Node)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some((m_out, _, pq)) = quantize(g, &index, node) else {
            continue;
        };
        let Some(mi) = index.producer(m_out) else { continue };
        let Some(m) = g.nodes.get(mi) else { continue };
        let Some(mop) = op(m) else { continue };
        let one_output = matches!(m.outputs.as_slice(), [Some(_), rest @ ..] if rest.iter().all(Option::is_none));
        // A MaxPool's plan (channels-last) holds for its 8-bit values too; other plans may
        // be made for f32 alone.
        let max_pool = matches!(
            mop,
            Op::Nn(NnOp::Pool(Pool {
                kind: PoolKind::Max { .. },
                ..
            }))
        );
        if !one_output || !(moves_elements(mop) || max_pool) || (m.plan.is_some() && !max_pool) {
            continue;
        }
        let Some(Some(m_in)) = m.inputs.first() else { continue };
        let Some(di) = index.producer(*m_in) else { continue };
        let Some((xq, _, pd)) = g.nodes.get(di).and_then(|d| dequantize(g, &index, d)) else {
            continue;
        };
        if pd != pq || !pq.invertible() {
            continue;
        }
        let mut inputs = m.inputs.clone();
        if let Some(first) = inputs.first_mut() {
            *first = Some(xq);
        }
        found.push((
            i,
            Node {
                name: node.name.clone(),
                kind: m.kind.clone(),
                inputs,
                outputs: node.outputs.clone(),
                plan: m.plan.clone(),
            },
        ));
    }
    let count = found.len();
    for (i, new) in found {
        if let Some(slot) = g.nodes.get_mut(i) {
            *slot = new;
        }
    }
    count
}

/// One input of an 8-bit concatenation: its bytes as they are, or requantized by a table.
enum Part {
    Same(ValueId),
    Table(ValueId, Lookup8),
}

/// Rewrites every `Q(Concat(DQ(x_1), ..., DQ(x_n)))` (per-tensor constant parameters, the
/// Concat read by the Q alone) to a Concat of the `x_i`, each requantized to the Q's
/// parameters by a table unless it has them; returns how many.
fn concats(g: &mut Graph) -> usize {
    let index = Index::new(g);
    // (the Q's position, the inputs, the Concat node to put there)
    let mut found: Vec<(usize, Vec<Part>, Node)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some((c_out, _, pq)) = quantize(g, &index, node) else {
            continue;
        };
        let Some(ci) = index.producer(c_out) else { continue };
        let Some(concat) = g.nodes.get(ci) else { continue };
        let is_concat = matches!(op(concat), Some(Op::Movement(MovementOp::Concat(_))));
        if !is_concat || !index.sole_use(c_out, i) || concat.outputs.len() != 1 || !pq.invertible() {
            continue;
        }
        let parts: Option<Vec<Part>> = concat
            .inputs
            .iter()
            .map(|v| {
                let d = g.nodes.get(index.producer((*v)?)?)?;
                let (xq, _, pd) = dequantize(g, &index, d)?;
                if pd == pq {
                    return Some(Part::Same(xq));
                }
                Some(Part::Table(
                    xq,
                    requantize_table(g, &index, d, node, pd.dtype, pq.dtype)?,
                ))
            })
            .collect();
        let Some(parts) = parts else { continue };
        found.push((
            i,
            parts,
            Node {
                name: concat.name.clone(),
                kind: concat.kind.clone(),
                inputs: vec![],
                outputs: node.outputs.clone(),
                plan: concat.plan.clone(),
            },
        ));
    }
    let count = found.len();
    // From the back: the tables go in before their Concat, which moves the later nodes on.
    for (i, parts, mut new) in found.into_iter().rev() {
        let mut tables = Vec::new();
        for part in parts {
            match part {
                Part::Same(x) => new.inputs.push(Some(x)),
                Part::Table(x, lookup) => {
                    let Some(info) = g.value(x) else { return count };
                    let shape = match &info.ty {
                        ValueType::Tensor(t) => t.shape.clone(),
                        _ => None,
                    };
                    let dtype = match lookup.table {
                        LookupTable::I8(_) => DType::I8,
                        _ => DType::U8,
                    };
                    let name = super::edit::fresh_name(g, &format!("{}_requantized", info.name));
                    let y = g.add_value(
                        name.clone(),
                        ValueType::Tensor(TensorType {
                            dtype: Some(dtype),
                            shape,
                        }),
                    );
                    let op = Op::Elementwise(ElementwiseOp::Lookup(lookup));
                    tables.push(super::edit::op_node(name, op, vec![Some(x)], y));
                    new.inputs.push(Some(y));
                }
            }
        }
        if let Some(slot) = g.nodes.get_mut(i) {
            *slot = new;
        }
        for (k, t) in tables.into_iter().enumerate() {
            g.nodes.insert(i + k, t);
        }
    }
    count
}

/// Gives every `ChannelAffine` its input's DequantizeLinear and its sole reader's
/// QuantizeLinear (per tensor, constant parameters), each where there is one; returns how
/// many it changed.
fn affines(g: &mut Graph) -> usize {
    let index = Index::new(g);
    // (the affine's position, its 8-bit input and parameters, its 8-bit output, the Q's
    // position and parameters)
    type Found = (usize, Option<(ValueId, Params)>, Option<(ValueId, usize, Params)>);
    let mut found: Vec<Found> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(Op::Nn(NnOp::ChannelAffine(a))) = op(node) else {
            continue;
        };
        if a.dequantize.is_some() || a.quantize.is_some() {
            continue;
        }
        let (Some(Some(x)), [Some(y)]) = (node.inputs.first(), node.outputs.as_slice()) else {
            continue;
        };
        let input = index
            .producer(*x)
            .and_then(|d| g.nodes.get(d))
            .and_then(|d| dequantize(g, &index, d))
            .map(|(xq, _, p)| (xq, p));
        let output = match (index.readers(*y), index.is_output(*y)) {
            (&[r], false) => g
                .nodes
                .get(r)
                .and_then(|q| quantize(g, &index, q))
                .map(|(_, yq, p)| (yq, r, p)),
            _ => None,
        };
        if input.is_some() || output.is_some() {
            found.push((i, input, output));
        }
    }
    let mut dead = vec![false; g.nodes.len()];
    for (i, input, output) in &found {
        let Some(node) = g.nodes.get_mut(*i) else { continue };
        let NodeKind::Op(Op::Nn(NnOp::ChannelAffine(a))) = &mut node.kind else {
            continue;
        };
        if let Some((xq, p)) = input {
            a.dequantize = Some(ChainDequantize {
                scale: p.scale,
                zero_point: p.zero_point,
                dtype: p.dtype,
            });
            if let Some(first) = node.inputs.first_mut() {
                *first = Some(*xq);
            }
        }
        if let Some((yq, r, p)) = output {
            a.quantize = Some(ChainQuantize {
                scale: p.scale,
                zero_point: p.zero_point as f32,
                dtype: p.dtype,
            });
            node.outputs = vec![Some(*yq)];
            if let Some(d) = dead.get_mut(*r) {
                *d = true;
            }
        }
    }
    super::edit::remove_nodes(g, &dead);
    found.len()
}

/// The 256 codes of an 8-bit type in byte order (an i8 code by its two's-complement byte):
/// what a table of that type's values is computed on.
pub(crate) fn codes(dtype: DType) -> Option<Value> {
    let t = match dtype {
        DType::U8 => Tensor::from_vec(vec![256], (0..=255u8).collect::<Vec<u8>>()).ok()?,
        DType::I8 => Tensor::from_vec(vec![256], (0..=255u8).map(|b| b as i8).collect::<Vec<i8>>()).ok()?,
        _ => return None,
    };
    Some(Value::Tensor(t))
}

/// `q(dq(code))` for the 256 codes of `from`, by the two nodes' own ops and constant
/// inputs: the table of a requantization to `to`.
fn requantize_table(g: &Graph, index: &Index, dq: &Node, q: &Node, from: DType, to: DType) -> Option<Lookup8> {
    let mut v = codes(from)?;
    for n in [dq, q] {
        let Some(Op::Quant(qop)) = op(n) else { return None };
        let args: Vec<Option<&Value>> = std::iter::once(Some(&v))
            .chain(n.inputs.iter().skip(1).map(|i| i.and_then(|i| index.constant(g, i))))
            .collect();
        let out = qop.eval(&Args::new(&args)).ok()?.into_iter().next()?;
        v = out;
    }
    let t = v.as_tensor()?;
    let table = match (to, t.dtype()) {
        (DType::U8, DType::U8) => LookupTable::U8(t.as_slice::<u8>().ok()?.to_vec()),
        (DType::I8, DType::I8) => LookupTable::I8(t.as_slice::<i8>().ok()?.to_vec()),
        _ => return None,
    };
    (t.len() == 256).then_some(Lookup8 { input: from, table })
}

/// Rewrites every quantize node that only dequantize nodes of its parameters read into one
/// `FakeQuantize` chain step producing the first one's output; returns how many.
fn round_trips(g: &mut Graph) -> usize {
    let index = Index::new(g);
    let mut rename: HashMap<ValueId, ValueId> = HashMap::new();
    let mut dead = vec![false; g.nodes.len()];
    let mut found: Vec<(usize, Node)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some((x, yq, p)) = quantize(g, &index, node) else {
            continue;
        };
        let readers = index.readers(yq);
        if index.is_output(yq) || readers.is_empty() {
            continue;
        }
        let outs: Option<Vec<ValueId>> = readers
            .iter()
            .map(|&r| {
                let (_, y, pd) = dequantize(g, &index, g.nodes.get(r)?)?;
                (pd == p).then_some(y)
            })
            .collect();
        let Some(outs) = outs else { continue };
        let Some((&first, rest)) = outs.split_first() else {
            continue;
        };
        if rest.iter().any(|&o| index.is_output(o)) {
            continue;
        }
        for &o in rest {
            rename.insert(o, first);
        }
        for &r in readers {
            if let Some(d) = dead.get_mut(r) {
                *d = true;
            }
        }
        let (lo, hi) = p.range();
        found.push((
            i,
            Node {
                name: node.name.clone(),
                kind: NodeKind::Op(Op::Elementwise(ElementwiseOp::Chain(ElementwiseChain {
                    steps: vec![ChainStep::FakeQuantize {
                        scale: p.scale,
                        zero_point: p.zero_point as f32,
                        lo,
                        hi,
                    }],
                    quantize: None,
                    dequantize: vec![],
                }))),
                inputs: vec![Some(x)],
                outputs: vec![Some(first)],
                plan: None,
            },
        ));
    }
    let count = found.len();
    for (i, new) in found {
        if let Some(slot) = g.nodes.get_mut(i) {
            *slot = new;
        }
    }
    super::edit::remove_nodes(g, &dead);
    replace_all(g, &rename);
    count
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::passes::chain;
    use crate::passes::testutil::{Builder, binary, dequantize, f32s, noise, op_names, quantize, reshape, run_graph};
    use kiln_ops::elementwise::BinaryOp;
    use kiln_ops::movement::Transpose;
    use kiln_ops::reduce::{ReduceOp, Softmax, SoftmaxKind};
    use kiln_tensor::Tensor;

    /// What ONNX Runtime's quantizer writes around data movement and a float op: `x` quantized,
    /// then Reshape and Transpose each between a DequantizeLinear and a QuantizeLinear of the
    /// same parameters, a Softmax, its round trip (other parameters, read by two
    /// DequantizeLinears) and a bias Add along the last axis.
    fn qdq_graph() -> (kiln_ir::Graph, ValueId) {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 4, 6]);
        let (s0, z0) = (
            b.constant("s0", Tensor::scalar(0.02f32)),
            b.constant("z0", Tensor::scalar(120u8)),
        );
        let (s1, z1) = (
            b.constant("s1", Tensor::scalar(1.0f32 / 255.0)),
            b.constant("z1", Tensor::scalar(0u8)),
        );
        let shape = b.constant("shape", Tensor::from_vec(vec![2], vec![2i64, 24]).unwrap());
        let bias = b.constant("bias", f32s(&[2], &[0.25, -0.5]));
        let q = |b: &mut Builder, v, s, z, shape: &[usize]| {
            b.node_typed(quantize(), &[Some(v), Some(s), Some(z)], &[(DType::U8, shape)])[0]
        };
        let dq = |b: &mut Builder, v, s, z, shape: &[usize]| {
            b.node(dequantize(1), &[Some(v), Some(s), Some(z)], &[shape])[0]
        };
        let q0 = q(&mut b, x, s0, z0, &[2, 4, 6]);
        let d0 = dq(&mut b, q0, s0, z0, &[2, 4, 6]);
        let r = b.node(reshape(), &[Some(d0), Some(shape)], &[&[2, 24]])[0];
        let q1 = q(&mut b, r, s0, z0, &[2, 24]);
        let d1 = dq(&mut b, q1, s0, z0, &[2, 24]);
        let transpose = Op::Movement(MovementOp::Transpose(Transpose { perm: Some(vec![1, 0]) }));
        let t = b.node(transpose, &[Some(d1)], &[&[24, 2]])[0];
        let q2 = q(&mut b, t, s0, z0, &[24, 2]);
        let d2 = dq(&mut b, q2, s0, z0, &[24, 2]);
        let softmax = Op::Reduce(ReduceOp::Softmax(Softmax {
            kind: SoftmaxKind::Softmax,
            axis: -1,
            coerce_2d: false,
        }));
        let sm = b.node(softmax, &[Some(d2)], &[&[24, 2]])[0];
        let q3 = q(&mut b, sm, s1, z1, &[24, 2]);
        let d3 = dq(&mut b, q3, s1, z1, &[24, 2]);
        let d3b = dq(&mut b, q3, s1, z1, &[24, 2]);
        let sum = b.node(binary(BinaryOp::Add), &[Some(d3), Some(d3b)], &[&[24, 2]])[0];
        let y = b.node(binary(BinaryOp::Add), &[Some(bias), Some(sum)], &[&[24, 2]])[0];
        (b.finish(&[y]), y)
    }

    #[test]
    fn data_movement_runs_on_8_bits_and_round_trips_join_the_arithmetic_with_the_same_bits() {
        let (g, y) = qdq_graph();
        let input = noise(&[2, 4, 6], 9);
        let want = run_graph(&g, vec![input.clone()]);
        let mut fused = g.clone();
        // Two movements and one round trip.
        assert_eq!(run(&mut fused).unwrap(), 3);
        fused.verify().unwrap();
        assert_eq!(
            op_names(&fused),
            [
                "QuantizeLinear",
                "Reshape",
                "Transpose",
                "DequantizeLinear",
                "Softmax",
                "ElementwiseChain",
                "Add",
                "Add"
            ]
        );
        chain::run(&mut fused).unwrap();
        fused.verify().unwrap();
        // The sum of the round trip's two readers (now one value, `v + v`, which a chain
        // step cannot read) and the bias: one pass.
        assert_eq!(
            op_names(&fused),
            [
                "QuantizeLinear",
                "Reshape",
                "Transpose",
                "DequantizeLinear",
                "Softmax",
                "ElementwiseChain",
                "ElementwiseChain"
            ]
        );
        assert_eq!(fused.outputs, [y]);
        let got = run_graph(&fused, vec![input]);
        let bits = |t: &Tensor| {
            t.as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&got[0]), bits(&want[0]));
        assert!(
            want[0]
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .any(|&v| v != 0.25 && v != -0.5)
        );
    }

    /// `Q(MaxPool(DQ(x_q)))` of equal parameters pools the 8-bit values: the same bits.
    #[test]
    fn a_max_pool_between_equal_parameters_pools_the_8_bit_values() {
        use kiln_ops::nn::AutoPad;
        let mut b = Builder::new();
        let x = b.input("x", &[1, 3, 6, 6]);
        let (s0, z0) = (
            b.constant("s0", Tensor::scalar(0.01f32)),
            b.constant("z0", Tensor::scalar(-5i8)),
        );
        let q0 = b.node_typed(
            quantize(),
            &[Some(x), Some(s0), Some(z0)],
            &[(DType::I8, &[1, 3, 6, 6])],
        )[0];
        let d0 = b.node(dequantize(1), &[Some(q0), Some(s0), Some(z0)], &[&[1, 3, 6, 6]])[0];
        let pool = Op::Nn(NnOp::Pool(Pool {
            kind: PoolKind::Max { storage_order: false },
            auto_pad: AutoPad::NotSet,
            ceil_mode: false,
            dilations: vec![1, 1],
            kernel_shape: vec![3, 3],
            pads: vec![1, 1, 1, 1],
            strides: vec![2, 2],
        }));
        let p = b.node(pool, &[Some(d0)], &[&[1, 3, 3, 3]])[0];
        let q1 = b.node_typed(
            quantize(),
            &[Some(p), Some(s0), Some(z0)],
            &[(DType::I8, &[1, 3, 3, 3])],
        )[0];
        let y = b.node(dequantize(1), &[Some(q1), Some(s0), Some(z0)], &[&[1, 3, 3, 3]])[0];
        let g = b.finish(&[y]);
        let input = noise(&[1, 3, 6, 6], 4);
        let want = run_graph(&g, vec![input.clone()]);
        let mut fused = g.clone();
        assert_eq!(run(&mut fused).unwrap(), 1);
        fused.verify().unwrap();
        assert_eq!(op_names(&fused), ["QuantizeLinear", "MaxPool", "DequantizeLinear"]);
        let got = run_graph(&fused, vec![input]);
        let bits = |t: &Tensor| {
            t.as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&got[0]), bits(&want[0]));
    }

    /// `Q(Concat(DQ(a), DQ(b), DQ(c)))` with `c` on the output's parameters, `a` on other u8
    /// ones and `b` an i8 tensor: one Concat of bytes, `a` and `b` requantized by tables, `c`
    /// as it is; the same output bits.
    #[test]
    fn a_concatenation_of_quantized_branches_concatenates_bytes() {
        let shapes: [&[usize]; 3] = [&[1, 2, 3, 4], &[1, 3, 3, 4], &[1, 1, 3, 4]];
        let params: [(f32, Tensor); 3] = [
            (0.013, Tensor::scalar(7u8)),
            (0.031, Tensor::scalar(-9i8)),
            (0.02, Tensor::scalar(128u8)),
        ];
        let mut b = Builder::new();
        let mut parts = Vec::new();
        for (k, (shape, (scale, zero))) in shapes.iter().zip(params).enumerate() {
            let x = b.input(&format!("x{k}"), shape);
            let dtype = zero.dtype();
            let (s, z) = (
                b.constant(&format!("s{k}"), Tensor::scalar(scale)),
                b.constant(&format!("z{k}"), zero),
            );
            let q = b.node_typed(quantize(), &[Some(x), Some(s), Some(z)], &[(dtype, shape)])[0];
            parts.push(Some(b.node(dequantize(1), &[Some(q), Some(s), Some(z)], &[shape])[0]));
        }
        let out = [1, 6, 3, 4];
        let c = b.node(
            Op::Movement(MovementOp::Concat(kiln_ops::movement::Concat { axis: 1 })),
            &parts,
            &[&out],
        )[0];
        let (s, z) = (
            b.constant("s", Tensor::scalar(0.02f32)),
            b.constant("z", Tensor::scalar(128u8)),
        );
        let q = b.node_typed(quantize(), &[Some(c), Some(s), Some(z)], &[(DType::U8, &out)])[0];
        let y = b.node(dequantize(1), &[Some(q), Some(s), Some(z)], &[&out])[0];
        let g = b.finish(&[y]);
        let inputs: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(k, s)| noise(s, 11 + k as u64))
            .collect();
        let want = run_graph(&g, inputs.clone());
        let mut fused = g.clone();
        assert!(run(&mut fused).unwrap() >= 1);
        fused.verify().unwrap();
        let names = op_names(&fused);
        assert_eq!(names.iter().filter(|&&n| n == "Lookup8").count(), 2, "{names:?}");
        assert_eq!(names.iter().filter(|&&n| n == "QuantizeLinear").count(), 3, "{names:?}");
        assert_eq!(
            names.iter().filter(|&&n| n == "DequantizeLinear").count(),
            1,
            "{names:?}"
        );
        let concat = fused.nodes.iter().find(|n| n.kind.name() == "Concat").unwrap();
        let out_type = concat
            .outputs
            .first()
            .copied()
            .flatten()
            .and_then(|v| dtype_of(&fused, v));
        assert_eq!(out_type, Some(DType::U8));
        let got = run_graph(&fused, inputs);
        assert_eq!(got[0].to_f64_vec(), want[0].to_f64_vec());
        // Not vacuous: each table moves codes (neither input is on the output's parameters).
        for n in fused.nodes.iter().filter(|n| n.kind.name() == "Lookup8") {
            let Some(Op::Elementwise(ElementwiseOp::Lookup(l))) = op(n) else {
                panic!("not a lookup")
            };
            let LookupTable::U8(t) = &l.table else {
                panic!("not to u8")
            };
            assert!(
                t.iter().enumerate().any(|(i, &v)| usize::from(v) != i),
                "an identity table"
            );
        }
    }

    /// `Q(Relu(x * scale[c] + shift[c]))` of a dequantized 8-bit `x`, channels first and
    /// last: one ChannelAffine from bytes to bytes, the same output bits; with a second reader
    /// of its float output, it keeps writing floats (reading bytes all the same).
    #[test]
    fn a_channel_affine_between_quantized_tensors_runs_on_bytes() {
        use kiln_ops::nn::{Activation, ChannelAffine};
        for (channels_last, second_reader) in [(false, false), (true, false), (true, true)] {
            let shape: &[usize] = if channels_last { &[1, 5, 6, 7] } else { &[1, 7, 5, 6] };
            let c = 7;
            let mut b = Builder::new();
            let x = b.input("x", shape);
            let (s0, z0) = (
                b.constant("s0", Tensor::scalar(0.02f32)),
                b.constant("z0", Tensor::scalar(-3i8)),
            );
            let q0 = b.node_typed(quantize(), &[Some(x), Some(s0), Some(z0)], &[(DType::I8, shape)])[0];
            let d0 = b.node(dequantize(1), &[Some(q0), Some(s0), Some(z0)], &[shape])[0];
            let sc: Vec<f32> = (0..c).map(|k| 0.3 + 0.2 * k as f32).collect();
            let sh: Vec<f32> = (0..c).map(|k| 0.1 * k as f32 - 0.3).collect();
            let (sc, sh) = (b.constant("sc", f32s(&[c], &sc)), b.constant("sh", f32s(&[c], &sh)));
            let affine = Op::Nn(NnOp::ChannelAffine(ChannelAffine {
                channels_last,
                activation: Some(Activation::Relu),
                ..ChannelAffine::default()
            }));
            let a = b.node(affine, &[Some(d0), Some(sc), Some(sh)], &[shape])[0];
            let (s1, z1) = (
                b.constant("s1", Tensor::scalar(0.011f32)),
                b.constant("z1", Tensor::scalar(9u8)),
            );
            let q1 = b.node_typed(quantize(), &[Some(a), Some(s1), Some(z1)], &[(DType::U8, shape)])[0];
            let y = b.node(dequantize(1), &[Some(q1), Some(s1), Some(z1)], &[shape])[0];
            let outs = if second_reader { vec![y, a] } else { vec![y] };
            let g = b.finish(&outs);
            let input = noise(shape, 21);
            let want = run_graph(&g, vec![input.clone()]);
            let mut fused = g.clone();
            assert!(run(&mut fused).unwrap() >= 1);
            fused.verify().unwrap();
            let names = op_names(&fused);
            let expect: &[&str] = if second_reader {
                // (the round trip on the float output one chain step)
                &["QuantizeLinear", "ChannelAffine", "ElementwiseChain"]
            } else {
                &["QuantizeLinear", "ChannelAffine", "DequantizeLinear"]
            };
            assert_eq!(names, expect, "channels_last {channels_last}");
            let got = run_graph(&fused, vec![input]);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.to_f64_vec(), w.to_f64_vec(), "channels_last {channels_last}");
            }
            // The Relu's floor and values above it both occur.
            let v = want[0].to_f64_vec();
            assert!(v.iter().any(|&e| e == 0.0) && v.iter().any(|&e| e > 0.5), "{v:?}");
        }
    }

    #[test]
    fn different_parameters_or_graph_outputs_keep_the_quantize_nodes() {
        // The Reshape's requantization uses another scale: not the identity, left alone (the
        // first quantize node, which only its dequantize node reads, is a round trip).
        let mut b = Builder::new();
        let x = b.input("x", &[2, 6]);
        let (s0, z0) = (
            b.constant("s0", Tensor::scalar(0.02f32)),
            b.constant("z0", Tensor::scalar(3u8)),
        );
        let s1 = b.constant("s1", Tensor::scalar(0.03f32));
        let shape = b.constant("shape", Tensor::from_vec(vec![1], vec![12i64]).unwrap());
        let q0 = b.node_typed(quantize(), &[Some(x), Some(s0), Some(z0)], &[(DType::U8, &[2, 6])])[0];
        let d0 = b.node(dequantize(1), &[Some(q0), Some(s0), Some(z0)], &[&[2, 6]])[0];
        let r = b.node(reshape(), &[Some(d0), Some(shape)], &[&[12]])[0];
        let q1 = b.node_typed(quantize(), &[Some(r), Some(s1), Some(z0)], &[(DType::U8, &[12])])[0];
        // q1 is a graph output: no round trip either.
        let d1 = b.node(dequantize(0), &[Some(q1), Some(s1), Some(z0)], &[&[12]])[0];
        let mut g = b.finish(&[d1, q1]);
        assert_eq!(run(&mut g).unwrap(), 1);
        assert_eq!(
            op_names(&g),
            ["ElementwiseChain", "Reshape", "QuantizeLinear", "DequantizeLinear"]
        );
    }
}
