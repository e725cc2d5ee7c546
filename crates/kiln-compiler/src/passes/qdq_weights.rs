//! Fake-quantized weights and float glue to the QDQ forms the integer passes match.
//! Exporters that simulate quantization in float (NVIDIA's pytorch-quantization, torch.ao's
//! QAT, some NNCF graphs) write a weight as `W (f32) -> QuantizeLinear -> DequantizeLinear`,
//! and a torch `Linear` on 3-D activations as `MatMul(x, Transpose(DequantizeLinear(...)))`;
//! NNCF leaves ops that only move values between a DequantizeLinear and the product that reads
//! them (`DQ -> MaxPool -> Conv`, `DQ -> Flatten -> Gemm`). ONNX Runtime's quantizer stores
//! the weight as an 8-bit constant read by the DequantizeLinear and puts a
//! `QuantizeLinear -> DequantizeLinear` pair after every such op. This pass brings the first
//! forms to the second's shape, so that the QDQ passes after it (`qdq_matmul`, `qdq_conv`,
//! `qdq_add`) see 8-bit operands:
//!
//! 1. QuantizeLinear nodes whose inputs are all constants are folded (the runtime's
//!    QuantizeLinear computes the codes: the codes the model would compute every run);
//! 2. a DequantizeLinear moves forward past an op that only moves elements (Reshape,
//!    Transpose, Flatten, Slice, Gather, ...) or takes maxima (MaxPool; the scale is
//!    positive, so dequantizing keeps order): `M(DQ(x_q)) = DQ(M(x_q))` element for element,
//!    and `M` then moves a quarter of the bytes. Per-axis parameters move past a Transpose
//!    only (their axis follows the permutation). Where a QuantizeLinear reads `M`'s output
//!    the graph already has ONNX Runtime's form (`qdq_glue` runs `M` on 8 bits there) and it
//!    is left alone;
//! 3. those movements of constants (a weight's Transpose) are folded.
//!
//! Every value the graph computes is unchanged.

use super::edit::{Index, dtype_of, fresh_name, op, subgraphs_mut};
use super::qdq_glue::moves_elements;
use super::{dce, fold};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::movement::{MovementOp, Transpose};
use kiln_ops::nn::{NnOp, Pool, PoolKind};
use kiln_ops::quant::{DequantizeLinear, QuantOp};
use kiln_tensor::DType;
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let mut count = fold::fold_where(g, |op| matches!(op, Op::Quant(QuantOp::QuantizeLinear(_))))?;
    let moved = propagate(g);
    if moved > 0 {
        fold::fold_where(g, moves_elements)?;
        // The DequantizeLinear nodes left behind, read by nothing now.
        dce::run(g)?;
    }
    count += moved;
    Ok(count)
}

/// Moves DequantizeLinear nodes forward (rule 2) in `g` and its subgraphs until none moves;
/// returns how many moves.
fn propagate(g: &mut Graph) -> usize {
    let mut count = 0;
    for node in &mut g.nodes {
        if let NodeKind::Control(c) = &mut node.kind {
            for sub in subgraphs_mut(c) {
                count += propagate(sub);
            }
        }
    }
    // Each round moves every DequantizeLinear one op on; a chain of n movements takes n rounds.
    for _ in 0..=g.nodes.len() {
        let n = propagate_once(g);
        if n == 0 {
            break;
        }
        count += n;
    }
    count
}

/// One move: `M` (node `mi`) rewritten to read the codes, then the new DequantizeLinear.
struct Move {
    mi: usize,
    codes: ValueId,
    dq: DequantizeLinear,
    /// The DequantizeLinear's scale and zero point inputs.
    params: Vec<Option<ValueId>>,
}

fn propagate_once(g: &mut Graph) -> usize {
    let index = Index::new(g);
    let mut moves: Vec<Move> = Vec::new();
    for (mi, m) in g.nodes.iter().enumerate() {
        if let Some(mv) = find_move(g, &index, mi, m) {
            moves.push(mv);
        }
    }
    if moves.is_empty() {
        return 0;
    }
    let mut replacement: HashMap<usize, [Node; 2]> = HashMap::new();
    for mv in moves {
        let Some(m) = g.nodes.get(mv.mi) else { continue };
        let Some(Some(y)) = m.outputs.first().copied() else {
            continue;
        };
        let (Some(y_ty), Some(code_dtype)) = (g.value(y).map(|v| v.ty.clone()), dtype_of(g, mv.codes)) else {
            continue;
        };
        let mut codes_ty = y_ty;
        if let ValueType::Tensor(t) = &mut codes_ty {
            t.dtype = Some(code_dtype);
        }
        let (m_name, mut m_node) = (m.name.clone(), m.clone());
        let moved = g.add_value(fresh_name(g, &format!("{m_name}_codes")), codes_ty);
        if let Some(first) = m_node.inputs.first_mut() {
            *first = Some(mv.codes);
        }
        m_node.outputs = vec![Some(moved)];
        let mut dq_inputs = vec![Some(moved)];
        dq_inputs.extend(mv.params);
        let dq_node = Node {
            name: fresh_name(g, &format!("{m_name}_dequantize")),
            kind: NodeKind::Op(Op::Quant(QuantOp::DequantizeLinear(mv.dq))),
            inputs: dq_inputs,
            outputs: vec![Some(y)],
            plan: None,
        };
        replacement.insert(mv.mi, [m_node, dq_node]);
    }
    let count = replacement.len();
    let old = std::mem::take(&mut g.nodes);
    for (i, node) in old.into_iter().enumerate() {
        match replacement.remove(&i) {
            Some(new) => g.nodes.extend(new),
            None => g.nodes.push(node),
        }
    }
    count
}

/// Node `m` as a move: an element-moving op or a MaxPool, without a plan, whose input 0 a
/// DequantizeLinear of 8-bit codes with constant parameters (positive scales) writes, and
/// whose output no QuantizeLinear reads.
fn find_move(g: &Graph, index: &Index, mi: usize, m: &Node) -> Option<Move> {
    let mop = op(m)?;
    let max_pool = matches!(
        mop,
        Op::Nn(NnOp::Pool(Pool {
            kind: PoolKind::Max { .. },
            ..
        }))
    );
    if !(moves_elements(mop) || max_pool) || m.plan.is_some() || m.activation().is_some() {
        return None;
    }
    // One output (MaxPool's indices output unused).
    let (Some(Some(x)), [Some(y), rest @ ..]) = (m.inputs.first(), m.outputs.as_slice()) else {
        return None;
    };
    if rest.iter().any(Option::is_some) {
        return None;
    }
    let quantized_after = index.readers(*y).iter().any(|&r| {
        g.nodes
            .get(r)
            .and_then(op)
            .is_some_and(|o| matches!(o, Op::Quant(QuantOp::QuantizeLinear(_))))
    });
    if quantized_after {
        return None;
    }
    let d = g.nodes.get(index.producer(*x)?)?;
    let Some(Op::Quant(QuantOp::DequantizeLinear(dq))) = op(d) else {
        return None;
    };
    if dq.block_size != 0 || !matches!(dq.output_dtype, None | Some(DType::F32)) {
        return None;
    }
    let codes = d.inputs.first().copied().flatten()?;
    if !matches!(dtype_of(g, codes), Some(DType::I8 | DType::U8)) {
        return None;
    }
    let scale = index.tensor(g, d.inputs.get(1).copied().flatten()?)?;
    let scales = scale.as_slice::<f32>().ok()?;
    if scales.is_empty() || !scales.iter().all(|s| s.is_finite() && *s > 0.0) {
        return None;
    }
    let zp = d.inputs.get(2).copied().flatten();
    if let Some(z) = zp
        && index.tensor(g, z)?.len() != scales.len()
    {
        return None;
    }
    let axis = if scales.len() == 1 {
        dq.axis
    } else {
        // Per axis: past a Transpose only, the axis following the permutation.
        let Op::Movement(MovementOp::Transpose(Transpose { perm: Some(perm) })) = mop else {
            return None;
        };
        let rank = i64::try_from(perm.len()).ok()?;
        let axis = if dq.axis < 0 { dq.axis + rank } else { dq.axis };
        i64::try_from(perm.iter().position(|&p| p == axis)?).ok()?
    };
    Some(Move {
        mi,
        codes,
        dq: DequantizeLinear { axis, ..dq.clone() },
        params: d.inputs.iter().skip(1).copied().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::nn::{AutoPad, MatMul};
    use kiln_tensor::Tensor;

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_slice::<f32>()
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    fn transpose(perm: &[i64]) -> Op {
        Op::Movement(MovementOp::Transpose(Transpose {
            perm: Some(perm.to_vec()),
        }))
    }

    /// A torch `Linear` as fake-quantizing exporters write it: `x -> Q -> DQ`, and the float
    /// weight `[n, k] -> Q -> DQ (per output row) -> Transpose -> MatMul`.
    fn fake_quantized_linear(weight_scale_sign: f32) -> (Graph, usize, usize, usize) {
        let (m, k, n) = (6usize, 10usize, 5usize);
        let mut b = Builder::new();
        let x = b.input("x", &[2, m, k]);
        let sx = b.constant("sx", f32s(&[], &[0.03]));
        let zx = b.constant("zx", Tensor::scalar(0i8));
        let xq = b.node_typed(quantize(), &[Some(x), Some(sx), Some(zx)], &[(DType::I8, &[2, m, k])])[0];
        let xd = b.node(dequantize(1), &[Some(xq), Some(sx), Some(zx)], &[&[2, m, k]])[0];
        let w = b.constant("w", noise(&[n, k], 3));
        let sw: Vec<f32> = (0..n).map(|j| weight_scale_sign * (0.01 + 0.002 * j as f32)).collect();
        let sw = b.constant("sw", f32s(&[n], &sw));
        let zw = b.constant(
            "zw",
            Tensor::from_vec(vec![n], vec![0i8; n]).unwrap_or_else(|e| panic!("{e}")),
        );
        let mut q = quantize();
        if let Op::Quant(QuantOp::QuantizeLinear(ql)) = &mut q {
            ql.axis = 0;
        }
        let wq = b.node_typed(q, &[Some(w), Some(sw), Some(zw)], &[(DType::I8, &[n, k])])[0];
        let wd = b.node(dequantize(0), &[Some(wq), Some(sw), Some(zw)], &[&[n, k]])[0];
        let wt = b.node(transpose(&[1, 0]), &[Some(wd)], &[&[k, n]])[0];
        let y = b.node(
            Op::Nn(NnOp::MatMul(MatMul::default())),
            &[Some(xd), Some(wt)],
            &[&[2, m, n]],
        )[0];
        (b.finish(&[y]), m, k, n)
    }

    #[test]
    fn fake_quantized_weights_become_8_bit_constants_the_integer_product_takes() {
        let (g, m, k, n) = fake_quantized_linear(1.0);
        let input = noise(&[2, m, k], 4);
        let want = run_graph(&g, vec![input.clone()]);
        let mut rewritten = g.clone();
        // The weight's QuantizeLinear folded, then its DequantizeLinear moved past the
        // Transpose (folded onto the codes).
        assert!(run(&mut rewritten).unwrap_or_else(|e| panic!("{e}")) >= 2);
        rewritten.verify().unwrap_or_else(|e| panic!("{e}"));
        let index = Index::new(&rewritten);
        let matmul = rewritten
            .nodes
            .iter()
            .find(|n| n.kind.name() == "MatMul")
            .unwrap_or_else(|| panic!("no MatMul in {:?}", op_names(&rewritten)));
        let w = matmul
            .inputs
            .get(1)
            .copied()
            .flatten()
            .unwrap_or_else(|| panic!("no B"));
        let (dq, inputs) =
            super::super::edit::dequantize_of(&rewritten, &index, w).unwrap_or_else(|| panic!("B not dequantized"));
        let codes = inputs
            .first()
            .copied()
            .flatten()
            .and_then(|c| index.tensor(&rewritten, c))
            .unwrap_or_else(|| panic!("codes not constant"));
        assert_eq!((codes.dtype(), codes.shape(), dq.axis), (DType::I8, &[k, n][..], 1));
        // Every value the same bits.
        assert_eq!(bits(&run_graph(&rewritten, vec![input.clone()])[0]), bits(&want[0]));
        // And the integer product pass now takes it.
        assert_eq!(
            super::super::qdq_matmul::run(&mut rewritten).unwrap_or_else(|e| panic!("{e}")),
            1
        );
        assert!(
            op_names(&rewritten).contains(&"MatMulInteger"),
            "{:?}",
            op_names(&rewritten)
        );
        assert_close(&run_graph(&rewritten, vec![input])[0], &want[0], 1e-5);
    }

    fn max_pool() -> Op {
        Op::Nn(NnOp::Pool(Pool {
            kind: PoolKind::Max { storage_order: false },
            auto_pad: AutoPad::NotSet,
            ceil_mode: false,
            dilations: vec![1, 1],
            kernel_shape: vec![3, 3],
            pads: vec![1, 1, 1, 1],
            strides: vec![2, 2],
        }))
    }

    /// `Q -> DQ -> MaxPool -> Flatten -> Relu` with the given scale; with `requantized`, a
    /// QuantizeLinear reads the pool as well.
    fn pooled(scale: f32, requantized: bool) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 3, 6, 6]);
        let (s, z) = (
            b.constant("s", Tensor::scalar(scale)),
            b.constant("z", Tensor::scalar(7u8)),
        );
        let q = b.node_typed(quantize(), &[Some(x), Some(s), Some(z)], &[(DType::U8, &[1, 3, 6, 6])])[0];
        let d = b.node(dequantize(1), &[Some(q), Some(s), Some(z)], &[&[1, 3, 6, 6]])[0];
        let p = b.node(max_pool(), &[Some(d)], &[&[1, 3, 3, 3]])[0];
        let flatten = Op::Movement(MovementOp::Flatten(kiln_ops::movement::Flatten { axis: 1 }));
        let f = b.node(flatten, &[Some(p)], &[&[1, 27]])[0];
        let mut outputs = vec![b.unary(kiln_ops::elementwise::UnaryOp::Relu, f, &[1, 27])];
        if requantized {
            outputs.push(b.node_typed(quantize(), &[Some(p), Some(s), Some(z)], &[(DType::U8, &[1, 3, 3, 3])])[0]);
        }
        b.finish(&outputs)
    }

    #[test]
    fn dequantization_moves_past_pools_and_movements_with_the_same_bits() {
        let g = pooled(0.05, false);
        let input = noise(&[1, 3, 6, 6], 5);
        let want = run_graph(&g, vec![input.clone()]);
        let mut moved = g.clone();
        // Past the MaxPool, then past the Flatten.
        assert_eq!(run(&mut moved).unwrap_or_else(|e| panic!("{e}")), 2);
        moved.verify().unwrap_or_else(|e| panic!("{e}"));
        let names = op_names(&moved);
        let pos = |name: &str| names.iter().position(|n| *n == name);
        assert!(
            pos("MaxPool") < pos("Flatten") && pos("Flatten") < pos("DequantizeLinear"),
            "{names:?}"
        );
        let index = Index::new(&moved);
        let pool = moved.nodes.iter().find(|n| n.kind.name() == "MaxPool");
        let pool_in = pool.and_then(|n| n.inputs.first().copied().flatten());
        assert_eq!(pool_in.and_then(|v| dtype_of(&moved, v)), Some(DType::U8));
        assert!(pool_in.is_some_and(|v| index.producer(v).is_some()));
        assert_eq!(bits(&run_graph(&moved, vec![input])[0]), bits(&want[0]));
    }

    #[test]
    fn ops_already_requantized_and_negative_scales_stay() {
        // A QuantizeLinear reads the pool: ONNX Runtime's form, which `qdq_glue` handles.
        let mut g = pooled(0.05, true);
        assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 0);
        // A negative scale reverses the order: the maximum of the codes is not the maximum.
        let mut g = pooled(-0.05, false);
        let before = op_names(&g);
        assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 0);
        assert_eq!(op_names(&g), before);
    }
}
