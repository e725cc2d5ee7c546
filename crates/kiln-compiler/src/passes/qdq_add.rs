//! QDQ residual additions to one 8-bit op: an f32 `Add` of two `DequantizeLinear`s (8-bit
//! inputs, one constant scale and zero point each, the same fixed shape) whose sum only a
//! per-tensor `QuantizeLinear` reads becomes
//!
//! ```text
//! QLinearAdd(a_q, sa, za, b_q, sb, zb, sy, zy)
//! ```
//!
//! one pass over 8-bit data instead of two dequantizations, an f32 add and a quantization (a
//! Relu between the sum and the QuantizeLinear is absorbed too, as the op's `relu`). The
//! value is the three ops' except where a sum lies within an f32 rounding of a tie between
//! two codes, which may round to the other (`QLinearAdd` multiplies by scale ratios, as ONNX
//! Runtime's does, instead of dividing each element by the output scale).
//! With the integer convolutions (`qdq_conv`), a quantized ResNet keeps its activations
//! 8-bit from block to block. The dequantize nodes stay for any other reader.

use super::edit::{Index, dtype_of, fixed_shape};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp, UnaryOp};
use kiln_ops::quant::{DequantizeLinear, QLinearAdd, QuantOp, QuantizeLinear};
use kiln_tensor::DType;
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    // Add node -> (its replacement, the QuantizeLinear it absorbs, the Relu between).
    let mut found: HashMap<usize, (Node, usize, Option<usize>)> = HashMap::new();
    for (i, node) in g.nodes.iter().enumerate() {
        if let Some(f) = find(g, &index, node) {
            found.insert(i, f);
        }
    }
    let count = found.len();
    if count == 0 {
        return Ok(0);
    }
    let dead: Vec<usize> = found
        .values()
        .flat_map(|&(_, q, relu)| std::iter::once(q).chain(relu))
        .collect();
    let old = std::mem::take(&mut g.nodes);
    for (i, node) in old.into_iter().enumerate() {
        if dead.contains(&i) {
            continue;
        }
        match found.remove(&i) {
            Some((new, ..)) => g.nodes.push(new),
            None => g.nodes.push(node),
        }
    }
    Ok(count)
}

/// `v`'s per-tensor DequantizeLinear of an 8-bit value with constant one-element scale (f32)
/// and zero point: its inputs.
fn dequantized(g: &Graph, index: &Index, v: ValueId) -> Option<[Option<ValueId>; 3]> {
    let node = g.nodes.get(index.producer(v)?)?;
    let NodeKind::Op(Op::Quant(QuantOp::DequantizeLinear(DequantizeLinear {
        block_size: 0,
        output_dtype: None | Some(DType::F32),
        ..
    }))) = &node.kind
    else {
        return None;
    };
    let x = node.inputs.first().copied().flatten()?;
    let s = node.inputs.get(1).copied().flatten()?;
    let z = node.inputs.get(2).copied().flatten();
    let one = |v: ValueId| index.tensor(g, v).is_some_and(|t| t.len() == 1);
    let ok = matches!(dtype_of(g, x), Some(DType::U8 | DType::I8))
        && one(s)
        && dtype_of(g, s) == Some(DType::F32)
        && z.is_none_or(|z| one(z) && dtype_of(g, z) == dtype_of(g, x));
    ok.then_some([Some(x), Some(s), z])
}

/// The fused node, the QuantizeLinear it absorbs and the Relu between, if any.
fn find(g: &Graph, index: &Index, node: &Node) -> Option<(Node, usize, Option<usize>)> {
    let NodeKind::Op(Op::Elementwise(ElementwiseOp::Binary(Binary {
        op: BinaryOp::Add,
        legacy_axis: None,
    }))) = &node.kind
    else {
        return None;
    };
    let ([Some(a), Some(b)], [Some(y)]) = (node.inputs.as_slice(), node.outputs.as_slice()) else {
        return None;
    };
    let shape = fixed_shape(g, *a)?;
    if fixed_shape(g, *b).as_ref() != Some(&shape) || fixed_shape(g, *y).as_ref() != Some(&shape) {
        return None;
    }
    let (da, db) = (dequantized(g, index, *a)?, dequantized(g, index, *b)?);
    // The sum's one reader: a per-tensor QuantizeLinear to 8 bits, or a Relu that one reads.
    let (&[r], false) = (index.readers(*y), index.is_output(*y)) else {
        return None;
    };
    // `r` becomes the QuantizeLinear, `read` the value it reads.
    let (r, relu, read) = match &g.nodes.get(r)?.kind {
        NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu))) => {
            let h = g.nodes.get(r)?.outputs.first().copied().flatten()?;
            let (&[q], false) = (index.readers(h), index.is_output(h)) else {
                return None;
            };
            (q, Some(r), h)
        }
        _ => (r, None, *y),
    };
    let q = g.nodes.get(r)?;
    let NodeKind::Op(Op::Quant(QuantOp::QuantizeLinear(QuantizeLinear { block_size: 0, .. }))) = &q.kind else {
        return None;
    };
    let (Some(Some(sy)), zy, [Some(yq)]) = (
        q.inputs.get(1),
        q.inputs.get(2).copied().flatten(),
        q.outputs.as_slice(),
    ) else {
        return None;
    };
    let one = |v: ValueId| index.tensor(g, v).is_some_and(|t| t.len() == 1);
    let ok = q.inputs.first().copied().flatten() == Some(read)
        && one(*sy)
        && dtype_of(g, *sy) == Some(DType::F32)
        && zy.is_none_or(one)
        && matches!(dtype_of(g, *yq), Some(DType::U8 | DType::I8))
        && (zy.is_some() || dtype_of(g, *yq) == Some(DType::U8));
    if !ok {
        return None;
    }
    let [xa, sa, za] = da;
    let [xb, sb, zb] = db;
    let new = Node {
        name: node.name.clone(),
        kind: NodeKind::Op(Op::Quant(QuantOp::QLinearAdd(QLinearAdd { relu: relu.is_some() }))),
        inputs: vec![xa, sa, za, xb, sb, zb, Some(*sy), zy],
        outputs: vec![Some(*yq)],
        plan: None,
    };
    Some((new, r, relu))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_tensor::Tensor;

    /// `Q(DQ(Q(x)) + DQ(Q(r))) -> DQ`, with and without a Relu before the Q: fused, the same
    /// output bit for bit (these scales put no sum within an f32 rounding of a tie).
    #[test]
    fn a_quantized_residual_add_becomes_one_op_with_the_same_bits() {
        for relu in [false, true] {
            residual_add(relu);
        }
    }

    fn residual_add(relu: bool) {
        let shape = [1usize, 6, 5, 5];
        let mut b = Builder::new();
        let x = b.input("x", &shape);
        let r = b.input("r", &shape);
        let (sx, zx) = (
            b.constant("sx", f32s(&[], &[0.013])),
            b.constant("zx", Tensor::scalar(7u8)),
        );
        let (sr, zr) = (
            b.constant("sr", f32s(&[], &[0.021])),
            b.constant("zr", Tensor::scalar(131u8)),
        );
        let (sy, zy) = (
            b.constant("sy", f32s(&[], &[0.017])),
            b.constant("zy", Tensor::scalar(90u8)),
        );
        let xq = b.node_typed(quantize(), &[Some(x), Some(sx), Some(zx)], &[(DType::U8, &shape)])[0];
        let rq = b.node_typed(quantize(), &[Some(r), Some(sr), Some(zr)], &[(DType::U8, &shape)])[0];
        let xd = b.node(dequantize(1), &[Some(xq), Some(sx), Some(zx)], &[&shape])[0];
        let rd = b.node(dequantize(1), &[Some(rq), Some(sr), Some(zr)], &[&shape])[0];
        let mut s = b.binary(BinaryOp::Add, xd, rd, &shape);
        if relu {
            s = b.unary(UnaryOp::Relu, s, &shape);
        }
        let yq = b.node_typed(quantize(), &[Some(s), Some(sy), Some(zy)], &[(DType::U8, &shape)])[0];
        let y = b.node(dequantize(1), &[Some(yq), Some(sy), Some(zy)], &[&shape])[0];
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 1);
        g.verify().unwrap_or_else(|e| panic!("{e}"));
        let names = op_names(&g);
        assert!(
            names.contains(&"QLinearAdd") && !names.contains(&"Add") && !names.contains(&"Relu"),
            "{names:?}"
        );
        let inputs = vec![noise(&shape, 1), noise(&shape, 2)];
        let want = run_graph(&before, inputs.clone())[0].to_f64_vec();
        assert_eq!(run_graph(&g, inputs)[0].to_f64_vec(), want);
        // Negative sums exist without the Relu and are cut to 0 with it: not vacuous.
        assert_eq!(want.iter().any(|&v| v < 0.0), !relu, "relu {relu}");
        assert!(want.iter().any(|&v| v == 0.0));
    }
}
