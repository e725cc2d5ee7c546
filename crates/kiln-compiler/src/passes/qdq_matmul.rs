//! QDQ matrix products to integer ones. A MatMul (or Gemm with `alpha = beta = 1`, A not
//! transposed) of `DequantizeLinear(x_q)` by `DequantizeLinear(W_q)`, where `x_q` is an 8-bit
//! activation with one constant scale and zero point and `W_q` an 8-bit constant `[K, N]`
//! (Gemm's `transB`: `[N, K]`, transposed here) with one scale and zero point or one per output
//! column, becomes
//!
//! ```text
//! MatMulInteger(x_q, W_q, zx, zw) -> Cast(f32) -> Mul(sx * sw[n]) [-> Add(C)]
//! ```
//!
//! The products are summed exactly in int32 (the integer GEMM, B packed once) and scaled once,
//! where the float path summed rounded products of dequantized values: the same value up to
//! float rounding, and closer to the exact one. Runs before folding, which would otherwise turn
//! `DequantizeLinear(W_q)` into f32 weights. The dequantize nodes stay for any other reader
//! (dead-code elimination drops them when there is none).

use super::edit::{Index, add_constant, dequantize_of, dtype_of, fresh_name, op_node as node};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::TensorType;
use kiln_ops::elementwise::{Binary, BinaryOp, Cast, ElementwiseOp};
use kiln_ops::nn::NnOp;
use kiln_ops::quant::{MatMulInteger, QuantOp};
use kiln_tensor::{DType, Tensor, formats::RoundMode};
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let found: Vec<(usize, Found)> = g
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| find(g, &index, n).map(|f| (i, f)))
        .collect();
    if found.is_empty() {
        return Ok(0);
    }
    let mut replacement: HashMap<usize, Vec<Node>> = HashMap::new();
    for (i, f) in found {
        let Some(nodes) = rewrite(g, i, f) else { continue };
        replacement.insert(i, nodes);
    }
    let count = replacement.len();
    let old = std::mem::take(&mut g.nodes);
    for (i, node) in old.into_iter().enumerate() {
        match replacement.remove(&i) {
            Some(new) => g.nodes.extend(new),
            None => g.nodes.push(node),
        }
    }
    Ok(count)
}

/// A matched product: its operands' quantized forms and parameters.
struct Found {
    xq: ValueId,
    zx: Option<ValueId>,
    sx: f32,
    /// `W_q` as `[K, N]`.
    w: Tensor,
    zw: Option<Tensor>,
    /// One scale, or one per column.
    sw: Vec<f32>,
    bias: Option<ValueId>,
    y: ValueId,
}

/// The constant tensor of `v`'s single element or 1-D values.
fn constant(g: &Graph, index: &Index, v: ValueId) -> Option<Tensor> {
    index.tensor(g, v).cloned()
}

fn find(g: &Graph, index: &Index, node: &Node) -> Option<Found> {
    if node.activation().is_some() || node.plan.is_some() {
        return None;
    }
    let (trans_b, bias) = match &node.kind {
        NodeKind::Op(Op::Nn(NnOp::MatMul(_))) if node.inputs.len() == 2 => (false, None),
        NodeKind::Op(Op::Nn(NnOp::Gemm(gm)))
            if gm.alpha == 1.0
                && (gm.beta == 1.0 || node.inputs.get(2).copied().flatten().is_none())
                && !gm.trans_a =>
        {
            (gm.trans_b, node.inputs.get(2).copied().flatten())
        }
        _ => return None,
    };
    let (Some(Some(a)), Some(Some(b)), [Some(y)]) = (node.inputs.first(), node.inputs.get(1), node.outputs.as_slice())
    else {
        return None;
    };
    if dtype_of(g, *y) != Some(DType::F32) || bias.is_some_and(|c| dtype_of(g, c) != Some(DType::F32)) {
        return None;
    }
    // A: an 8-bit activation with one scale and zero point.
    let (dqa, ain) = dequantize_of(g, index, *a)?;
    let xq = ain.first().copied().flatten()?;
    let xdt = dtype_of(g, xq)?;
    if !matches!(xdt, DType::U8 | DType::I8) || dqa.output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let sxt = constant(g, index, ain.get(1).copied().flatten()?)?;
    let sx = *sxt.as_slice::<f32>().ok().filter(|s| s.len() == 1)?.first()?;
    let zx = ain.get(2).copied().flatten();
    if let Some(z) = zx {
        let t = constant(g, index, z)?;
        if t.len() != 1 || t.dtype() != xdt {
            return None;
        }
    }
    // B: 8-bit constant weights, per tensor or per output column.
    let (dqb, bin) = dequantize_of(g, index, *b)?;
    if dqb.output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let wq = constant(g, index, bin.first().copied().flatten()?)?;
    let &[r, c] = wq.shape() else { return None };
    if !matches!(wq.dtype(), DType::U8 | DType::I8) {
        return None;
    }
    let (k, n) = if trans_b { (c, r) } else { (r, c) };
    let swt = constant(g, index, bin.get(1).copied().flatten()?)?;
    let sw = swt.as_slice::<f32>().ok()?.to_vec();
    let zw = match bin.get(2).copied().flatten() {
        Some(z) => Some(constant(g, index, z)?),
        None => None,
    };
    // A per-axis parameter must run along the output columns: W's axis 1, or 0 when transposed.
    let column_axis: i64 = if trans_b { 0 } else { 1 };
    let per_column = sw.len() != 1;
    if per_column
        && (sw.len() != n || swt.shape().len() != 1 || (dqb.axis != column_axis && dqb.axis != column_axis - 2))
    {
        return None;
    }
    if let Some(z) = &zw
        && (z.dtype() != wq.dtype() || z.len() != sw.len())
    {
        return None;
    }
    let w = if trans_b { transpose_2d(&wq)? } else { wq };
    debug_assert_eq!(w.shape(), [k, n]);
    Some(Found {
        xq,
        zx,
        sx,
        w,
        zw,
        sw,
        bias,
        y: *y,
    })
}

/// `[r, c]` to `[c, r]` for an 8-bit tensor.
fn transpose_2d(t: &Tensor) -> Option<Tensor> {
    let &[r, c] = t.shape() else { return None };
    fn tr<T: Copy>(v: &[T], r: usize, c: usize) -> Vec<T> {
        (0..c)
            .flat_map(|j| (0..r).filter_map(move |i| v.get(i * c + j).copied()))
            .collect()
    }
    match t.dtype() {
        DType::U8 => Tensor::from_vec(vec![c, r], tr(t.as_slice::<u8>().ok()?, r, c)).ok(),
        DType::I8 => Tensor::from_vec(vec![c, r], tr(t.as_slice::<i8>().ok()?, r, c)).ok(),
        _ => None,
    }
}

/// The nodes replacing product `i`.
fn rewrite(g: &mut Graph, i: usize, f: Found) -> Option<Vec<Node>> {
    let base = g.nodes.get(i)?.name.clone();
    let y_shape = match &g.value(f.y)?.ty {
        ValueType::Tensor(t) => t.shape.clone(),
        _ => return None,
    };
    let n = *f.w.shape().get(1)?;
    let w = add_constant(g, &format!("{base}_wq"), f.w);
    let zw = match f.zw {
        Some(z) => {
            let z = if z.len() == 1 {
                z.reshape(vec![]).ok()?
            } else {
                z.reshape(vec![n]).ok()?
            };
            Some(add_constant(g, &format!("{base}_wq_zero"), z))
        }
        None => None,
    };
    // One rounding of each scale product, in f32 (as the float path's dequantized factors).
    let scales: Vec<f32> = f.sw.iter().map(|&s| f.sx * s).collect();
    let scale = if scales.len() == 1 {
        Tensor::from_vec(vec![], scales).ok()?
    } else {
        Tensor::from_vec(vec![n], scales).ok()?
    };
    let scale = add_constant(g, &format!("{base}_scale"), scale);
    let typed = |dt: DType| {
        ValueType::Tensor(TensorType {
            dtype: Some(dt),
            shape: y_shape.clone(),
        })
    };
    let acc_name = fresh_name(g, &format!("{base}_acc"));
    let acc = g.add_value(acc_name, typed(DType::I32));
    let accf_name = fresh_name(g, &format!("{base}_accf"));
    let accf = g.add_value(accf_name, typed(DType::F32));
    let mut out = vec![
        node(
            format!("{base}_integer"),
            Op::Quant(QuantOp::MatMulInteger(MatMulInteger::default())),
            vec![Some(f.xq), Some(w), f.zx, zw],
            acc,
        ),
        node(
            format!("{base}_to_f32"),
            Op::Elementwise(ElementwiseOp::Cast(Cast {
                to: DType::F32,
                saturate: true,
                round: RoundMode::Up,
            })),
            vec![Some(acc)],
            accf,
        ),
    ];
    let mul = |x: ValueId, s: ValueId, y: ValueId, name: String| {
        node(
            name,
            Op::Elementwise(ElementwiseOp::Binary(Binary {
                op: BinaryOp::Mul,
                legacy_axis: None,
            })),
            vec![Some(x), Some(s)],
            y,
        )
    };
    match f.bias {
        None => out.push(mul(accf, scale, f.y, format!("{base}_scale"))),
        Some(c) => {
            let scaled_name = fresh_name(g, &format!("{base}_scaled"));
            let scaled = g.add_value(scaled_name, typed(DType::F32));
            out.push(mul(accf, scale, scaled, format!("{base}_scale")));
            out.push(node(
                format!("{base}_bias"),
                Op::Elementwise(ElementwiseOp::Binary(Binary {
                    op: BinaryOp::Add,
                    legacy_axis: None,
                })),
                vec![Some(scaled), Some(c)],
                f.y,
            ));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::nn::{Gemm, MatMul};

    /// `x -> Q -> DQ -> MatMul(DQ(W)) [+ bias]` with per-column weight scales: the integer
    /// form, and within float rounding of the QDQ float semantics.
    fn check(trans_b: bool, bias: bool) {
        let (m, k, n) = (5usize, 12usize, 7usize);
        let mut b = Builder::new();
        let x = b.input("x", &[m, k]);
        let sx = b.constant("sx", f32s(&[], &[0.02]));
        let zx = b.constant("zx", Tensor::scalar(128u8));
        let xq = b.node_typed(quantize(), &[Some(x), Some(sx), Some(zx)], &[(DType::U8, &[m, k])])[0];
        let xd = b.node(dequantize(1), &[Some(xq), Some(sx), Some(zx)], &[&[m, k]])[0];
        let wshape = if trans_b { [n, k] } else { [k, n] };
        let wv: Vec<i8> = (0..k * n).map(|i| ((i * 37) % 255) as u8 as i8).collect();
        let w = b.constant(
            "w",
            Tensor::from_vec(wshape.to_vec(), wv).unwrap_or_else(|e| panic!("{e}")),
        );
        let sw: Vec<f32> = (0..n).map(|j| 0.01 + 0.001 * j as f32).collect();
        let sw = b.constant("sw", f32s(&[n], &sw));
        let zw = b.constant(
            "zw",
            Tensor::from_vec(vec![n], (0..n).map(|j| j as i8 - 3).collect::<Vec<i8>>())
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let wd = b.node(
            dequantize(if trans_b { 0 } else { 1 }),
            &[Some(w), Some(sw), Some(zw)],
            &[&wshape],
        )[0];
        let c = b.constant("c", noise(&[n], 9));
        let y = if trans_b || bias {
            let gemm = Op::Nn(NnOp::Gemm(Gemm {
                trans_b,
                ..Gemm::default()
            }));
            let inputs = [Some(xd), Some(wd), bias.then_some(c)];
            b.node(gemm, &inputs, &[&[m, n]])[0]
        } else {
            b.node(
                Op::Nn(NnOp::MatMul(MatMul::default())),
                &[Some(xd), Some(wd)],
                &[&[m, n]],
            )[0]
        };
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 1);
        g.verify().unwrap_or_else(|e| panic!("{e}"));
        assert!(op_names(&g).contains(&"MatMulInteger"), "{:?}", op_names(&g));
        let xin = noise(&[m, k], 4);
        let got = run_graph(&g, vec![xin.clone()]);
        let want = run_graph(&before, vec![xin]);
        assert_close(&got[0], &want[0], 1e-5);
    }

    #[test]
    fn matmul_of_dequantized_operands_becomes_integer() {
        check(false, false);
    }

    #[test]
    fn gemm_with_transposed_weights_and_bias_becomes_integer() {
        check(true, true);
        check(false, true);
    }

    #[test]
    fn per_row_weight_scales_are_left_alone() {
        // Scales along W's axis 0 (the depth) cannot be factored out of the sum.
        let (m, k, n) = (2usize, 3usize, 4usize);
        let mut b = Builder::new();
        let xq = b.input_typed("xq", DType::U8, &[m, k]);
        let sx = b.constant("sx", f32s(&[], &[0.5]));
        let xd = b.node(dequantize(1), &[Some(xq), Some(sx)], &[&[m, k]])[0];
        let w = b.constant(
            "w",
            Tensor::from_vec(vec![k, n], vec![1i8; k * n]).unwrap_or_else(|e| panic!("{e}")),
        );
        let sw = b.constant("sw", f32s(&[k], &[0.1, 0.2, 0.3]));
        let wd = b.node(dequantize(0), &[Some(w), Some(sw)], &[&[k, n]])[0];
        let y = b.node(
            Op::Nn(NnOp::MatMul(MatMul::default())),
            &[Some(xd), Some(wd)],
            &[&[m, n]],
        )[0];
        let mut g = b.finish(&[y]);
        assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 0);
    }
}
