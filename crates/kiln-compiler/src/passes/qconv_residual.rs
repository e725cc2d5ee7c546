//! 8-bit residual fusion: `QLinearAdd(QLinearConv(...), R)` (either operand order) becomes
//! one QLinearConv whose plan carries the sum (`QConvPlan::residual`, inputs 9-15), made on
//! each block of output pixels while it is still in cache: the convolution's 8-bit output
//! never makes a pass over memory of its own, nor does the sum. A convolution rewritten from
//! QDQ (its stage in f32) sums its unrounded values, rounding once
//! (`kiln_kernels::quant::requantize_summed_row_f32`: a result moves by at most a code
//! toward the float graph's where the sum's scale is at least the convolution's); one with
//! QLinearConv's f64 stage, and sums made after the convolution (depthwise, grouped), give
//! the two ops' bits (`QLinearAdd`'s one-pass arithmetic on the convolution's bytes).
//!
//! Only a channels-last QLinearConv (its plan is final: this runs after `layout`) read by the
//! sum alone, with one output and no sum yet, whose output, R and the sum have one 8-bit
//! type and the same static shape. The fused node takes the sum's place in the node order
//! (R exists there) and the convolution's name.

use super::edit::{Index, dtype_of, fixed_shape, mark, remove_nodes};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op, ValueId};
use kiln_ops::fast::{Plan, QResidual};
use kiln_ops::quant::{QLinearAdd, QuantOp};
use kiln_tensor::DType;

/// QLinearConv's own inputs (the fused sum's follow them).
const CONV_INPUTS: usize = 9;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let mut taken = vec![false; g.nodes.len()];
    // (the sum's position, the convolution's position, the sum's inputs after the
    // convolution's: its scale and zero point for the convolution's output, R, R's, its own)
    let mut plans: Vec<(usize, usize, Vec<Option<ValueId>>, bool)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let NodeKind::Op(Op::Quant(QuantOp::QLinearAdd(QLinearAdd { relu }))) = &node.kind else {
            continue;
        };
        let ([Some(a), sa, za, Some(b), sb, zb, sy, zy], [Some(y)]) = (node.inputs.as_slice(), node.outputs.as_slice())
        else {
            continue;
        };
        for ((c, sc, zc), (r, sr, zr)) in [((*a, sa, za), (*b, sb, zb)), ((*b, sb, zb), (*a, sa, za))] {
            if c == r || !index.sole_use(c, i) {
                continue;
            }
            let Some(p) = index.producer(c) else { continue };
            let Some(conv) = g.nodes.get(p) else { continue };
            let fusable = matches!(conv.kind, NodeKind::Op(Op::Quant(QuantOp::QLinearConv(_))))
                && matches!(&conv.plan, Some(Plan::QConv(q)) if q.channels_last && q.residual.is_none())
                && conv.inputs.len() <= CONV_INPUTS
                && conv.outputs.len() == 1;
            let t = dtype_of(g, c);
            let shape = fixed_shape(g, c);
            let typed = matches!(t, Some(DType::U8 | DType::I8)) && dtype_of(g, r) == t && dtype_of(g, *y) == t;
            let shaped = shape.is_some() && fixed_shape(g, r) == shape && fixed_shape(g, *y) == shape;
            if !(fusable && typed && shaped)
                || taken.get(p).copied().unwrap_or(true)
                || taken.get(i).copied().unwrap_or(true)
            {
                continue;
            }
            mark(&mut taken, [p, i]);
            plans.push((i, p, vec![*sc, *zc, Some(r), *sr, *zr, *sy, *zy], *relu));
            break;
        }
    }
    let mut dead = vec![false; g.nodes.len()];
    for (i, p, sum_inputs, relu) in plans {
        let Some(mut conv) = g.nodes.get(p).cloned() else {
            continue;
        };
        let Some(Plan::QConv(q)) = conv.plan.as_mut() else {
            continue;
        };
        q.residual = Some(QResidual { relu });
        let Some(sum) = g.nodes.get_mut(i) else { continue };
        conv.inputs.resize(CONV_INPUTS, None);
        conv.inputs.extend(sum_inputs);
        conv.outputs = std::mem::take(&mut sum.outputs);
        *sum = conv;
        if let Some(d) = dead.get_mut(p) {
            *d = true;
        }
    }
    let fused = dead.iter().filter(|&&d| d).count();
    remove_nodes(g, &dead);
    Ok(fused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::UnaryOp;
    use kiln_ops::nn::{Conv, NnOp};
    use kiln_tensor::Tensor;

    /// `x -> Q -> DQ -> Conv 3x3 (pad 1) -> Q -> DQ`, plus `DQ(Q(x))` (the block's input as
    /// its residual), `[Relu] -> Q -> DQ -> y`: a QDQ residual block of `c` channels, dense
    /// or depthwise; the sum's operands in either order; the residual's scale and zero point
    /// differ from the convolution output's.
    fn block(c: usize, depthwise: bool, conv_first: bool, relu: bool) -> Graph {
        let hw = 9usize;
        let shape = [1, c, hw, hw];
        let cg = if depthwise { 1 } else { c };
        let mut b = Builder::new();
        let x = b.input("x", &shape);
        let (sx, zx) = (
            b.constant("sx", f32s(&[], &[0.012])),
            b.constant("zx", Tensor::scalar(118u8)),
        );
        let xq = b.node_typed(quantize(), &[Some(x), Some(sx), Some(zx)], &[(DType::U8, &shape)])[0];
        let xd = b.node(dequantize(1), &[Some(xq), Some(sx), Some(zx)], &[&shape])[0];
        let wv: Vec<i8> = (0..c * cg * 9).map(|i| ((i * 37 + 11) % 255) as u8 as i8).collect();
        let w = b.constant(
            "w",
            Tensor::from_vec(vec![c, cg, 3, 3], wv).unwrap_or_else(|e| panic!("{e}")),
        );
        let swv: Vec<f32> = (0..c).map(|j| 0.002 + 0.0003 * j as f32).collect();
        let sw = b.constant("sw", f32s(&[c], &swv));
        let zw = b.constant(
            "zw",
            Tensor::from_vec(vec![c], vec![0i8; c]).unwrap_or_else(|e| panic!("{e}")),
        );
        let wd = b.node(dequantize(0), &[Some(w), Some(sw), Some(zw)], &[&[c, cg, 3, 3]])[0];
        let conv = Op::Nn(NnOp::Conv(Conv {
            group: if depthwise { c } else { 1 },
            pads: vec![1; 4],
            ..Default::default()
        }));
        let h = b.node(conv, &[Some(xd), Some(wd)], &[&shape])[0];
        let (sh, zh) = (
            b.constant("sh", f32s(&[], &[0.02])),
            b.constant("zh", Tensor::scalar(131u8)),
        );
        let hq = b.node_typed(quantize(), &[Some(h), Some(sh), Some(zh)], &[(DType::U8, &shape)])[0];
        let hd = b.node(dequantize(1), &[Some(hq), Some(sh), Some(zh)], &[&shape])[0];
        let ins = if conv_first { (hd, xd) } else { (xd, hd) };
        let mut s = b.binary(kiln_ops::elementwise::BinaryOp::Add, ins.0, ins.1, &shape);
        if relu {
            s = b.unary(UnaryOp::Relu, s, &shape);
        }
        let (sy, zy) = (
            b.constant("sy", f32s(&[], &[0.023])),
            b.constant("zy", Tensor::scalar(97u8)),
        );
        let yq = b.node_typed(quantize(), &[Some(s), Some(sy), Some(zy)], &[(DType::U8, &shape)])[0];
        let y = b.node(dequantize(1), &[Some(yq), Some(sy), Some(zy)], &[&shape])[0];
        b.finish(&[y])
    }

    /// The block as the passes before this one leave it: a channels-last QLinearConv and a
    /// QLinearAdd.
    fn planned(c: usize, depthwise: bool, conv_first: bool, relu: bool) -> Graph {
        let mut g = block(c, depthwise, conv_first, relu);
        for pass in [
            crate::passes::qdq_conv::run,
            crate::passes::qdq_add::run,
            crate::passes::layout::run,
            crate::passes::dce::run,
        ] {
            pass(&mut g).unwrap_or_else(|e| panic!("{e}"));
            g.verify().unwrap_or_else(|e| panic!("{e}"));
        }
        g
    }

    /// Fused: one QLinearConv, no QLinearAdd, and the two ops' output, for a dense
    /// convolution (the sum made per block, rounded once) and a depthwise one (made after
    /// it, bit for bit), with and without the Relu, the convolution on either side of the
    /// sum.
    #[test]
    fn a_residual_sum_goes_into_the_convolution_with_the_same_bits() {
        for (c, depthwise, conv_first, relu) in [
            (8, false, true, false),
            (8, false, false, true),
            (16, true, true, true),
            (16, true, false, false),
        ] {
            let unfused = planned(c, depthwise, conv_first, relu);
            assert!(op_names(&unfused).contains(&"QLinearAdd"), "{:?}", op_names(&unfused));
            let mut g = unfused.clone();
            assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 1);
            g.verify().unwrap_or_else(|e| panic!("{e}"));
            let names = op_names(&g);
            assert!(!names.contains(&"QLinearAdd"), "{names:?}");
            assert_eq!(names.iter().filter(|&&n| n == "QLinearConv").count(), 1, "{names:?}");
            let x = noise(&[1, c, 9, 9], 5);
            let want = run_graph(&unfused, vec![x.clone()])[0].to_f64_vec();
            let got = run_graph(&g, vec![x])[0].to_f64_vec();
            if depthwise {
                assert_eq!(got, want, "c {c} depthwise");
            } else {
                // The dense stage (an f32 one: the graph came from QDQ) rounds the sum once:
                // within one of the output's codes (0.023; its scale is above the
                // convolution's), most of them the same (~20% differ here).
                assert_eq!(got.len(), want.len());
                let off = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
                assert!(
                    worst <= 0.0231 && off * 3 < got.len(),
                    "c {c}: {off} differ, by up to {worst}"
                );
            }
            // Not vacuous: the Relu's floor is reached with it, values below it without.
            let floor = want.iter().copied().fold(f64::INFINITY, f64::min);
            assert_eq!(floor == 0.0, relu, "lowest output {floor}");
        }
    }

    /// A convolution whose output has another reader keeps its own output.
    #[test]
    fn a_convolution_read_elsewhere_is_not_fused() {
        let mut g = planned(8, false, true, false);
        let conv_out = g
            .nodes
            .iter()
            .find(|n| n.kind.name() == "QLinearConv")
            .and_then(|n| n.outputs.first().copied().flatten());
        let Some(v) = conv_out else { panic!("no QLinearConv") };
        g.outputs.push(v);
        assert_eq!(run(&mut g).unwrap_or_else(|e| panic!("{e}")), 0);
    }
}
