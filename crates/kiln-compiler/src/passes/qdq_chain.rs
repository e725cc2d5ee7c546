//! The float arithmetic of quantized models on their 8-bit values. After the chain pass, what
//! a quantized model computes in float between its integer nodes is chains reading
//! `DequantizeLinear`s of 8-bit tensors. Two exact rewrites, per-tensor parameters
//! (constants) only:
//!
//! 1. **Tables.** A chain of unary ops and arithmetic on one dequantized value and scalar
//!    constants (SiLU, HardSwish, GELU, Sigmoid, LeakyRelu, a scale and shift), ending on a
//!    `QuantizeLinear` or not, depends on the 8-bit input alone: 256 possible values. They
//!    are computed by running the DequantizeLinear and the chain themselves on the 256
//!    codes, and the chain becomes a [`Lookup8`] of X's bytes: one table read per element.
//!    Inputs that are tables of that same value count as it (`x * sigmoid(x)` with the
//!    sigmoid quantized on its own, as ONNX Runtime's quantizer writes SiLU).
//! 2. **8-bit inputs.** Any other chain reads each dequantized input as its 8-bit tensor with
//!    the parameters ([`ChainDequantize`]), dequantizing as it goes with the
//!    DequantizeLinear's arithmetic: a quarter of the bytes read, no f32 tensor written (a
//!    SiLU spelled `x * sigmoid(x)` over two quantized tensors, a squeeze-excitation scale).
//!
//! First, a chain that ends on a quantize-dequantize round trip (a QOperator model's
//! `QLinearAdd` of a bias, expanded and fused, whose float output feeds a GELU spelled out)
//! and whose readers are all chains ends on the `QuantizeLinear` instead, with a
//! `DequantizeLinear` after it: the same values, and its readers then read an 8-bit value by
//! the two rules (one byte per element written and read instead of four, or a table).
//!
//! Runs last, after the chain pass made the chains; a DequantizeLinear goes when nothing else
//! reads it.

use super::dce;
use super::edit::{Index, add_constant, fresh_name, op, op_node};
use super::qdq_glue::dequantize;
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, Value};
use kiln_ops::elementwise::{ChainDequantize, ChainQuantize, ChainStep, ElementwiseOp, Lookup8, LookupTable};
use kiln_ops::value::Args;
use kiln_tensor::{DType, Tensor};

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = split_round_trips(g);
    // A table can make the chain reading it a function of one value too: rounds until none
    // is left (each round turns at least one of finitely many chains into a table).
    for _ in 0..g.nodes.len() {
        let index = Index::new(g);
        let mut tables = Vec::new();
        for (i, node) in g.nodes.iter().enumerate() {
            if let Some(t) = tabulate(g, &index, node) {
                tables.push((i, t));
            }
        }
        if tables.is_empty() {
            break;
        }
        count += tables.len();
        for (i, (x, lookup)) in tables {
            if let Some(node) = g.nodes.get_mut(i) {
                node.kind = NodeKind::Op(Op::Elementwise(ElementwiseOp::Lookup(lookup)));
                node.inputs = vec![Some(x)];
                node.plan = None;
            }
        }
        dce::run(g)?;
    }
    let index = Index::new(g);
    // 8-bit inputs of the chains left.
    let mut reads = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(Op::Elementwise(ElementwiseOp::Chain(_))) = op(node) else {
            continue;
        };
        for (slot, v) in node.inputs.iter().enumerate() {
            let Some(dq) = v.and_then(|v| index.producer(v)).and_then(|p| g.nodes.get(p)) else {
                continue;
            };
            if let Some((x, _, p)) = dequantize(g, &index, dq) {
                let d = ChainDequantize {
                    scale: p.scale,
                    zero_point: p.zero_point,
                    dtype: p.dtype,
                };
                reads.push((i, slot, x, d));
            }
        }
    }
    count += reads.len();
    for (i, slot, x, d) in reads {
        let Some(node) = g.nodes.get_mut(i) else { continue };
        let inputs = node.inputs.len();
        if let NodeKind::Op(Op::Elementwise(ElementwiseOp::Chain(c))) = &mut node.kind {
            c.dequantize.resize(inputs, None);
            if let (Some(s), Some(v)) = (c.dequantize.get_mut(slot), node.inputs.get_mut(slot)) {
                *s = Some(d);
                *v = Some(x);
            }
        }
    }
    if count > 0 {
        dce::run(g)?;
    }
    Ok(count)
}

/// Chains ending on a round trip to 8 bits, read by chains alone, end on the quantization,
/// a DequantizeLinear restoring their float output (see the module docs). How many.
fn split_round_trips(g: &mut Graph) -> usize {
    let is_chain = |n: &Node| matches!(op(n), Some(Op::Elementwise(ElementwiseOp::Chain(_))));
    let index = Index::new(g);
    let mut splits = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(Op::Elementwise(ElementwiseOp::Chain(c))) = op(node) else {
            continue;
        };
        let (
            None,
            Some(&ChainStep::FakeQuantize {
                scale,
                zero_point,
                lo,
                hi,
            }),
        ) = (c.quantize, c.steps.last())
        else {
            continue;
        };
        let dtype = match (lo, hi) {
            (0.0, 255.0) => DType::U8,
            (-128.0, 127.0) => DType::I8,
            _ => continue,
        };
        let [Some(v)] = node.outputs.as_slice() else { continue };
        let readers = index.readers(*v);
        let by_chains = !readers.is_empty() && readers.iter().all(|&r| g.nodes.get(r).is_some_and(is_chain));
        if by_chains && !index.is_output(*v) && zero_point.fract() == 0.0 && zero_point.abs() <= 255.0 {
            splits.push((i, *v, scale, zero_point, dtype));
        }
    }
    // From the back, so the indices of the chains before stay put.
    for &(i, v, scale, zero_point, dtype) in splits.iter().rev() {
        let Some(info) = g.values.get(v.0 as usize) else {
            continue;
        };
        let (name, shape) = match &info.ty {
            kiln_ir::ValueType::Tensor(t) => (info.name.clone(), t.shape.clone()),
            _ => continue,
        };
        let bytes_name = fresh_name(g, &format!("{name}_quantized"));
        let bytes = g.add_value(
            bytes_name,
            kiln_ir::ValueType::Tensor(kiln_ops::TensorType {
                dtype: Some(dtype),
                shape,
            }),
        );
        let z = match dtype {
            DType::U8 => Tensor::scalar(zero_point as u8),
            _ => Tensor::scalar(zero_point as i8),
        };
        let s = add_constant(g, &format!("{name}_scale"), Tensor::scalar(scale));
        let z = add_constant(g, &format!("{name}_zero_point"), z);
        let Some(node) = g.nodes.get_mut(i) else { continue };
        if let NodeKind::Op(Op::Elementwise(ElementwiseOp::Chain(c))) = &mut node.kind {
            c.steps.pop();
            c.quantize = Some(ChainQuantize {
                scale,
                zero_point,
                dtype,
            });
        }
        node.outputs = vec![Some(bytes)];
        node.plan = None;
        let dq_name = format!("{}#dequantized", node.name);
        let dq = op_node(dq_name, dequantize_op(), vec![Some(bytes), Some(s), Some(z)], v);
        g.nodes.insert(i + 1, dq);
    }
    splits.len()
}

/// A per-tensor DequantizeLinear to f32.
fn dequantize_op() -> Op {
    Op::Quant(kiln_ops::quant::QuantOp::DequantizeLinear(
        kiln_ops::quant::DequantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: None,
        },
    ))
}

/// The table of chain `node` when it reads a per-tensor DequantizeLinear of an 8-bit value
/// and otherwise only one-element constants: that value and the lookup.
fn tabulate(g: &Graph, index: &Index, node: &Node) -> Option<(kiln_ir::ValueId, Lookup8)> {
    let Some(Op::Elementwise(ElementwiseOp::Chain(chain))) = op(node) else {
        return None;
    };
    // Each input: a one-element constant, or a DequantizeLinear of the root 8-bit value `x`
    // or of a table of it (an earlier rewrite's: `x * sigmoid(x)` over two quantized
    // tensors is a function of `x`).
    // Or a float table of `x` (a dequantized HardSwish an earlier round made, which the
    // chain then scales and shifts: PP-OCR's learnable HardSwish).
    enum Input<'g> {
        Constant(&'g Value),
        Dequantized { dq: &'g Node, table: Option<&'g Lookup8> },
        Looked(&'g Lookup8),
    }
    let mut root: Option<(kiln_ir::ValueId, DType)> = None;
    let mut inputs = Vec::new();
    for v in &node.inputs {
        let v = (*v)?;
        if let Some(c) = index.constant(g, v) {
            if c.as_tensor().is_some_and(|t| t.len() == 1) {
                inputs.push(Input::Constant(c));
                continue;
            }
            return None;
        }
        let producer = g.nodes.get(index.producer(v)?)?;
        if let Some(Op::Elementwise(ElementwiseOp::Lookup(l))) = op(producer)
            && matches!(l.table, LookupTable::F32(_))
        {
            let x = (*producer.inputs.first()?)?;
            if root.is_some_and(|r| r != (x, l.input)) {
                return None;
            }
            root = Some((x, l.input));
            inputs.push(Input::Looked(l));
            continue;
        }
        let dq = producer;
        let (bytes, _, params) = dequantize(g, index, dq)?;
        let from_table = index
            .producer(bytes)
            .and_then(|p| g.nodes.get(p))
            .and_then(|n| match op(n) {
                Some(Op::Elementwise(ElementwiseOp::Lookup(l)))
                    if matches!(l.table, LookupTable::U8(_) | LookupTable::I8(_)) =>
                {
                    Some((l, (*n.inputs.first()?)?))
                }
                _ => None,
            });
        let (x, dtype, table) = match from_table {
            Some((l, x)) => (x, l.input, Some(l)),
            None => (bytes, params.dtype, None),
        };
        if root.is_some_and(|r| r != (x, dtype)) {
            return None;
        }
        root = Some((x, dtype));
        inputs.push(Input::Dequantized { dq, table });
    }
    let (x, dtype) = root?;
    let codes = super::qdq_glue::codes(dtype)?;
    // Each input's 256 values, by the ops that compute it.
    let mut values = Vec::new();
    for input in &inputs {
        values.push(match input {
            Input::Constant(c) => (*c).clone(),
            Input::Looked(l) => l.eval(&Args::new(&[Some(&codes)])).ok()?.into_iter().next()?,
            Input::Dequantized { dq, table } => {
                let looked;
                let bytes = match table {
                    Some(l) => {
                        looked = l.eval(&Args::new(&[Some(&codes)])).ok()?.into_iter().next()?;
                        &looked
                    }
                    None => &codes,
                };
                let Some(Op::Quant(dq_op)) = op(dq) else { return None };
                let args: Vec<Option<&Value>> = std::iter::once(Some(bytes))
                    .chain(dq.inputs.iter().skip(1).map(|v| v.and_then(|v| index.constant(g, v))))
                    .collect();
                dq_op.eval(&Args::new(&args)).ok()?.into_iter().next()?
            }
        });
    }
    // The start must be one of the 256-value inputs (the chain's output takes its shape).
    if !matches!(inputs.first(), Some(Input::Dequantized { .. } | Input::Looked(_))) {
        return None;
    }
    let refs: Vec<Option<&Value>> = values.iter().map(Some).collect();
    let out = chain.eval(&Args::new(&refs)).ok()?.into_iter().next()?;
    let out = out.as_tensor()?;
    if out.len() != 256 {
        return None;
    }
    let table = match (chain.quantize.map(|q| q.dtype), out.dtype()) {
        (Some(DType::U8), DType::U8) => LookupTable::U8(out.as_slice::<u8>().ok()?.to_vec()),
        (Some(DType::I8), DType::I8) => LookupTable::I8(out.as_slice::<i8>().ok()?.to_vec()),
        (None, DType::F32) => LookupTable::F32(out.as_slice::<f32>().ok()?.to_vec()),
        _ => return None,
    };
    Some((x, Lookup8 { input: dtype, table }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::{Builder, dequantize, noise, op_names, quantize, run_graph};
    use kiln_ops::elementwise::{BinaryOp, UnaryOp};

    /// `DQ(x) -> x * sigmoid(x) -> Q` (SiLU, as a QDQ YOLO writes it) and `DQ(x) ->
    /// HardSigmoid-like clip(x / 6 + 0.5)` with a float output, from u8 and i8 values.
    fn graph(dtype: DType, quantized: bool) -> kiln_ir::Graph {
        let mut b = Builder::new();
        let x = b.input_typed("x", dtype, &[2, 3, 50]);
        let s = b.constant("s", Tensor::scalar(0.07f32));
        let z = match dtype {
            DType::U8 => b.constant("z", Tensor::scalar(131u8)),
            _ => b.constant("z", Tensor::scalar(-9i8)),
        };
        let d = b.node(dequantize(1), &[Some(x), Some(s), Some(z)], &[&[2, 3, 50]])[0];
        let sig = b.unary(UnaryOp::Sigmoid, d, &[2, 3, 50]);
        let silu = b.binary(BinaryOp::Mul, d, sig, &[2, 3, 50]);
        let sixth = b.constant("sixth", Tensor::scalar(1.0f32 / 6.0));
        let scaled = b.binary(BinaryOp::Mul, silu, sixth, &[2, 3, 50]);
        let y = if quantized {
            let (sy, zy) = (
                b.constant("sy", Tensor::scalar(0.013f32)),
                b.constant("zy", Tensor::scalar(7u8)),
            );
            b.node_typed(
                quantize(),
                &[Some(scaled), Some(sy), Some(zy)],
                &[(DType::U8, &[2, 3, 50])],
            )[0]
        } else {
            scaled
        };
        b.finish(&[y])
    }

    fn codes(dtype: DType) -> Tensor {
        // Every byte value, then some again.
        let v: Vec<u8> = (0..300u32).map(|i| (i * 97 % 256) as u8).collect();
        match dtype {
            DType::U8 => Tensor::from_vec(vec![2, 3, 50], v).unwrap(),
            _ => Tensor::from_vec(vec![2, 3, 50], v.into_iter().map(|b| b as i8).collect::<Vec<i8>>()).unwrap(),
        }
    }

    #[test]
    fn quantized_functions_of_one_8_bit_value_become_tables_with_the_same_values() {
        for dtype in [DType::U8, DType::I8] {
            for quantized in [true, false] {
                let g = graph(dtype, quantized);
                let want = run_graph(&g, vec![codes(dtype)]);
                let mut h = g.clone();
                assert!(crate::passes::chain::run(&mut h).unwrap() >= 1);
                assert_eq!(run(&mut h).unwrap(), 1, "{dtype:?} {quantized}");
                h.verify().unwrap();
                assert_eq!(op_names(&h), ["Lookup8"]);
                let got = run_graph(&h, vec![codes(dtype)]);
                assert_eq!(got[0].dtype(), want[0].dtype());
                assert_eq!(got[0].shape(), want[0].shape());
                // Bit for bit (f32 compared by bits).
                let bits = |t: &Tensor| -> Vec<u64> {
                    match t.dtype() {
                        DType::F32 => t
                            .as_slice::<f32>()
                            .unwrap()
                            .iter()
                            .map(|v| u64::from(v.to_bits()))
                            .collect(),
                        _ => t.to_f64_vec().iter().map(|v| v.to_bits()).collect(),
                    }
                };
                assert_eq!(bits(&got[0]), bits(&want[0]), "{dtype:?} {quantized}");
                // The values vary: a table of one entry would pass a weaker check.
                let v = want[0].to_f64_vec();
                assert!(v.iter().any(|&a| a != v[0]));
            }
        }
    }

    /// `Q(DQ(a) * DQ(b))` with a bias from a third 8-bit tensor along the last axis (SiLU
    /// over two quantized tensors, a squeeze-excitation scale): the chain reads the three
    /// 8-bit tensors, with the same bits.
    #[test]
    fn chains_read_dequantized_inputs_as_their_8_bit_values() {
        let mut b = Builder::new();
        let xa = b.input_typed("a", DType::U8, &[3, 5000]);
        let xb = b.input_typed("b", DType::I8, &[3, 5000]);
        let xc = b.input_typed("c", DType::U8, &[5000]);
        let (sa, za) = (
            b.constant("sa", Tensor::scalar(0.03f32)),
            b.constant("za", Tensor::scalar(100u8)),
        );
        let (sb, zb) = (
            b.constant("sb", Tensor::scalar(0.011f32)),
            b.constant("zb", Tensor::scalar(-4i8)),
        );
        let (sc, zc) = (
            b.constant("sc", Tensor::scalar(0.5f32)),
            b.constant("zc", Tensor::scalar(3u8)),
        );
        let da = b.node(dequantize(1), &[Some(xa), Some(sa), Some(za)], &[&[3, 5000]])[0];
        let db = b.node(dequantize(1), &[Some(xb), Some(sb), Some(zb)], &[&[3, 5000]])[0];
        let dc = b.node(dequantize(1), &[Some(xc), Some(sc), Some(zc)], &[&[5000]])[0];
        let m = b.binary(BinaryOp::Mul, da, db, &[3, 5000]);
        let t = b.binary(BinaryOp::Add, m, dc, &[3, 5000]);
        let (sy, zy) = (
            b.constant("sy", Tensor::scalar(0.02f32)),
            b.constant("zy", Tensor::scalar(9u8)),
        );
        let y = b.node_typed(quantize(), &[Some(t), Some(sy), Some(zy)], &[(DType::U8, &[3, 5000])])[0];
        let g = b.finish(&[y]);
        let bytes = |n: usize, seed: u32| -> Vec<u8> {
            (0..n as u32)
                .map(|i| (i.wrapping_mul(2654435761u32).wrapping_add(seed) >> 24) as u8)
                .collect()
        };
        let inputs = vec![
            Tensor::from_vec(vec![3, 5000], bytes(15000, 1)).unwrap(),
            Tensor::from_vec(
                vec![3, 5000],
                bytes(15000, 2).into_iter().map(|v| v as i8).collect::<Vec<i8>>(),
            )
            .unwrap(),
            Tensor::from_vec(vec![5000], bytes(5000, 3)).unwrap(),
        ];
        let want = run_graph(&g, inputs.clone());
        let mut h = g.clone();
        assert!(crate::passes::chain::run(&mut h).unwrap() >= 1);
        assert_eq!(run(&mut h).unwrap(), 3);
        h.verify().unwrap();
        assert_eq!(op_names(&h), ["ElementwiseChain"]);
        let got = run_graph(&h, inputs);
        assert_eq!(got[0].as_slice::<u8>().unwrap(), want[0].as_slice::<u8>().unwrap());
        let v = want[0].as_slice::<u8>().unwrap();
        assert!(v.iter().any(|&a| a != v[0]));
    }

    /// A QOperator GELU: `v = DQ(Q(DQ(x) + bias))` (a QLinearAdd of a bias, expanded), then
    /// `Q(v * (erf(v / sqrt 2) + 1) * 0.5)`. The first chain ends on its quantization, so the
    /// GELU becomes a table of its bytes: the same bits, and only the bias chain and the
    /// table left.
    #[test]
    fn a_round_trip_read_by_a_chain_ends_the_chain_in_8_bits() {
        for dtype in [DType::U8, DType::I8] {
            let mut b = Builder::new();
            let x = b.input_typed("x", DType::U8, &[3, 700]);
            let (sx, zx) = (
                b.constant("sx", Tensor::scalar(0.05f32)),
                b.constant("zx", Tensor::scalar(120u8)),
            );
            let bias: Vec<f32> = (0..700).map(|i| (i % 13) as f32 * 0.3 - 2.0).collect();
            let bias = b.constant("bias", Tensor::from_vec(vec![700], bias).unwrap());
            let dx = b.node(dequantize(1), &[Some(x), Some(sx), Some(zx)], &[&[3, 700]])[0];
            let t = b.binary(BinaryOp::Add, dx, bias, &[3, 700]);
            let (sv, zv) = match dtype {
                DType::U8 => (
                    b.constant("sv", Tensor::scalar(0.07f32)),
                    b.constant("zv", Tensor::scalar(100u8)),
                ),
                _ => (
                    b.constant("sv", Tensor::scalar(0.07f32)),
                    b.constant("zv", Tensor::scalar(-20i8)),
                ),
            };
            let q = b.node_typed(quantize(), &[Some(t), Some(sv), Some(zv)], &[(dtype, &[3, 700])])[0];
            let v = b.node(dequantize(1), &[Some(q), Some(sv), Some(zv)], &[&[3, 700]])[0];
            let root2 = b.constant("root2", Tensor::scalar(std::f32::consts::SQRT_2));
            let d = b.binary(BinaryOp::Div, v, root2, &[3, 700]);
            let e = b.unary(UnaryOp::Erf, d, &[3, 700]);
            let one = b.constant("one", Tensor::scalar(1.0f32));
            let e1 = b.binary(BinaryOp::Add, e, one, &[3, 700]);
            let m = b.binary(BinaryOp::Mul, v, e1, &[3, 700]);
            let half = b.constant("half", Tensor::scalar(0.5f32));
            let g = b.binary(BinaryOp::Mul, m, half, &[3, 700]);
            let (sy, zy) = (
                b.constant("sy", Tensor::scalar(0.04f32)),
                b.constant("zy", Tensor::scalar(10u8)),
            );
            let y = b.node_typed(quantize(), &[Some(g), Some(sy), Some(zy)], &[(DType::U8, &[3, 700])])[0];
            let g = b.finish(&[y]);
            let input = Tensor::from_vec(
                vec![3, 700],
                (0..2100u32).map(|i| (i * 37 % 256) as u8).collect::<Vec<u8>>(),
            )
            .unwrap();
            let want = run_graph(&g, vec![input.clone()]);
            let mut h = g.clone();
            // The glue pass makes the round trip a chain step, as in the pipeline.
            assert!(crate::passes::qdq_glue::run(&mut h).unwrap() >= 1);
            assert!(crate::passes::chain::run(&mut h).unwrap() >= 1);
            assert!(run(&mut h).unwrap() >= 2, "{dtype:?}");
            h.verify().unwrap();
            assert_eq!(op_names(&h), ["ElementwiseChain", "Lookup8"], "{dtype:?}");
            let got = run_graph(&h, vec![input]);
            assert_eq!(
                got[0].as_slice::<u8>().unwrap(),
                want[0].as_slice::<u8>().unwrap(),
                "{dtype:?}"
            );
            let w = want[0].as_slice::<u8>().unwrap();
            assert!(w.iter().any(|&a| a != w[0]));
        }
    }

    /// SiLU as ONNX Runtime's quantizer writes it: `s = Q(sigmoid(DQ(x)))`, then
    /// `Q(DQ(x) * DQ(s))`. The sigmoid becomes a table, which makes the product a function of
    /// `x` alone: one table of the same bits in the end.
    #[test]
    fn a_chain_over_a_value_and_its_tables_becomes_one_table() {
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::U8, &[2, 3, 50]);
        let (s, z) = (
            b.constant("s", Tensor::scalar(0.05f32)),
            b.constant("z", Tensor::scalar(128u8)),
        );
        let (ss, zs) = (
            b.constant("ss", Tensor::scalar(1.0f32 / 255.0)),
            b.constant("zs", Tensor::scalar(0u8)),
        );
        let shape: &[usize] = &[2, 3, 50];
        let d = b.node(dequantize(1), &[Some(x), Some(s), Some(z)], &[shape])[0];
        let sig = b.unary(UnaryOp::Sigmoid, d, shape);
        let sq = b.node_typed(quantize(), &[Some(sig), Some(ss), Some(zs)], &[(DType::U8, shape)])[0];
        let ds = b.node(dequantize(1), &[Some(sq), Some(ss), Some(zs)], &[shape])[0];
        let d2 = b.node(dequantize(1), &[Some(x), Some(s), Some(z)], &[shape])[0];
        let m = b.binary(BinaryOp::Mul, d2, ds, shape);
        let (sy, zy) = (
            b.constant("sy", Tensor::scalar(0.03f32)),
            b.constant("zy", Tensor::scalar(20u8)),
        );
        let y = b.node_typed(quantize(), &[Some(m), Some(sy), Some(zy)], &[(DType::U8, shape)])[0];
        let g = b.finish(&[y]);
        let want = run_graph(&g, vec![codes(DType::U8)]);
        let mut h = g.clone();
        assert!(crate::passes::chain::run(&mut h).unwrap() >= 1);
        assert_eq!(run(&mut h).unwrap(), 2);
        h.verify().unwrap();
        assert_eq!(op_names(&h), ["Lookup8"]);
        let got = run_graph(&h, vec![codes(DType::U8)]);
        assert_eq!(got[0].as_slice::<u8>().unwrap(), want[0].as_slice::<u8>().unwrap());
        let v = want[0].as_slice::<u8>().unwrap();
        assert!(v.iter().any(|&a| a != v[0]));
    }

    /// A chain with a tensor operand (a bias) depends on more than the 8-bit value: no table.
    #[test]
    fn chains_reading_tensors_get_no_table() {
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::U8, &[4, 8]);
        let s = b.constant("s", Tensor::scalar(0.05f32));
        let z = b.constant("z", Tensor::scalar(128u8));
        let d = b.node(dequantize(1), &[Some(x), Some(s), Some(z)], &[&[4, 8]])[0];
        let bias = b.constant("bias", noise(&[8], 3));
        let t = b.binary(BinaryOp::Add, d, bias, &[4, 8]);
        let y = b.unary(UnaryOp::Tanh, t, &[4, 8]);
        let mut g = b.finish(&[y]);
        crate::passes::chain::run(&mut g).unwrap();
        // No table; the chain reads the 8-bit X instead of its dequantized value.
        assert_eq!(run(&mut g).unwrap(), 1);
        assert_eq!(op_names(&g), ["ElementwiseChain"]);
    }

    /// A float table of an 8-bit value that a chain scales, shifts and quantizes (PP-OCR's
    /// learnable HardSwish: `Q(a * hardswish(DQ(x)) + b)`, the HardSwish's float also read
    /// elsewhere): the chain becomes a table of `x` too, with the same bits.
    #[test]
    fn chains_over_a_float_table_become_tables() {
        let shape = [2usize, 3, 50];
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::U8, &shape);
        let (s, z) = (
            b.constant("s", Tensor::scalar(0.05f32)),
            b.constant("z", Tensor::scalar(120u8)),
        );
        let d = b.node(dequantize(1), &[Some(x), Some(s), Some(z)], &[&shape])[0];
        let sig = b.unary(UnaryOp::Sigmoid, d, &shape);
        let hs = b.binary(BinaryOp::Mul, d, sig, &shape);
        let a = b.constant("a", Tensor::scalar(0.8f32));
        let scaled = b.binary(BinaryOp::Mul, hs, a, &shape);
        let c = b.constant("c", Tensor::scalar(-0.3f32));
        let shifted = b.binary(BinaryOp::Add, scaled, c, &shape);
        let (sy, zy) = (
            b.constant("sy", Tensor::scalar(0.02f32)),
            b.constant("zy", Tensor::scalar(30u8)),
        );
        let y = b.node_typed(quantize(), &[Some(shifted), Some(sy), Some(zy)], &[(DType::U8, &shape)])[0];
        let g = b.finish(&[y, hs]);
        let want = run_graph(&g, vec![codes(DType::U8)]);
        let mut h = g.clone();
        assert!(crate::passes::chain::run(&mut h).unwrap() >= 1);
        assert!(run(&mut h).unwrap() >= 2);
        h.verify().unwrap();
        assert_eq!(op_names(&h), ["Lookup8", "Lookup8"]);
        let got = run_graph(&h, vec![codes(DType::U8)]);
        assert_eq!(got[0].as_slice::<u8>().unwrap(), want[0].as_slice::<u8>().unwrap());
        let bits = |t: &Tensor| -> Vec<u32> { t.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&got[1]), bits(&want[1]));
        let v = want[0].to_f64_vec();
        assert!(v.iter().any(|&a| a != v[0]));
    }
}
