//! Kernel taps that only ever read padding are dropped: with static shapes, a leading or
//! trailing row (or column) of a convolution's kernel whose input position lies in the
//! padding for every output position contributes exactly zero, so the Conv becomes one with
//! a smaller kernel and the pads shrunk by what the dropped taps spanned (the output size is
//! unchanged). Atrous convolutions with a dilation near the image size (DeepLab's ASPP: a
//! 3x3 kernel at dilation 36 on a 33x49 map is a 1x3 one) then do a third of the work.
//!
//! Eligible: a Conv with explicit pads (auto_pad NOTSET), constant float weights read by no
//! other node, fixed shapes; the weights become a new constant, sliced.

use super::edit::{Index, add_constant, fixed_shape, is_float};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op};
use kiln_ops::nn::{AutoPad, NnOp};
use kiln_tensor::Tensor;

/// Ceiling division of non-negative-divisor integers.
trait DivCeil {
    fn div_ceil_i(self, d: i128) -> i128;
}

impl DivCeil for i128 {
    fn div_ceil_i(self, d: i128) -> i128 {
        let q = self.div_euclid(d);
        if self.rem_euclid(d) == 0 { q } else { q + 1 }
    }
}

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let mut plans = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let NodeKind::Op(Op::Nn(NnOp::Conv(conv))) = &node.kind else {
            continue;
        };
        if conv.auto_pad != AutoPad::NotSet || node.plan.is_some() {
            continue;
        }
        let (Some(Some(x)), Some(Some(w)), Some(Some(y))) =
            (node.inputs.first(), node.inputs.get(1), node.outputs.first())
        else {
            continue;
        };
        let (Some(xs), Some(ys), Some(wt)) = (fixed_shape(g, *x), fixed_shape(g, *y), index.tensor(g, *w)) else {
            continue;
        };
        if !is_float(wt.dtype()) || index.readers(*w).len() != 1 || index.is_output(*w) {
            continue;
        }
        let ws = wt.shape();
        let n = ws.len().saturating_sub(2);
        if n == 0 || xs.len() != n + 2 || ys.len() != n + 2 {
            continue;
        }
        let attr = |v: &[usize], k: usize, fill: usize| {
            if v.is_empty() {
                fill
            } else {
                v.get(k).copied().unwrap_or(fill)
            }
        };
        if conv.pads.len() != 2 * n && !conv.pads.is_empty() {
            continue;
        }
        // Per spatial dim: the first and last tap that reads the image for some output.
        let mut keep = Vec::with_capacity(n);
        for k in 0..n {
            let (input, out, taps) = (xs[k + 2], ys[k + 2], ws[k + 2]);
            let (s, d) = (attr(&conv.strides, k, 1), attr(&conv.dilations, k, 1));
            let pb = attr(&conv.pads, k, 0);
            // Tap t reads rows o*s + t*d - pb for o in 0..out; it reads the image for some o
            // when t*d - pb + (out-1)*s >= 0 and t*d - pb < input. Solved for t (in i128: the
            // dims of an empty kernel may be anything).
            let (d, s) = (d.max(1) as i128, s as i128);
            let (pb, input, out, taps) = (pb as i128, input as i128, out as i128, taps as i128);
            let reach = (out - 1).max(0) * s;
            let first = (pb - reach).max(0).div_ceil_i(d);
            let last = ((input + pb).div_ceil_i(d) - 1).min(taps - 1);
            if taps == 0 || first > last || first < 0 {
                keep.clear();
                break;
            }
            let (Ok(first), Ok(last)) = (usize::try_from(first), usize::try_from(last)) else {
                keep.clear();
                break;
            };
            keep.push((first, last));
        }
        if keep.len() != n || keep.iter().zip(&ws[2..]).all(|(&(f, l), &t)| f == 0 && l + 1 == t) {
            continue;
        }
        // New pads: the dropped taps' span comes off each side; both must stay >= 0.
        let mut pads = vec![0usize; 2 * n];
        let mut ok = true;
        for k in 0..n {
            let (f, l) = keep[k];
            let d = attr(&conv.dilations, k, 1);
            let (pb, pe) = (attr(&conv.pads, k, 0), attr(&conv.pads, k + n, 0));
            match (pb.checked_sub(f * d), pe.checked_sub((ws[k + 2] - 1 - l) * d)) {
                (Some(b), Some(e)) => {
                    pads[k] = b;
                    pads[k + n] = e;
                }
                _ => ok = false,
            }
        }
        if !ok {
            continue;
        }
        let Some(sliced) = slice_kernel(wt, &keep) else {
            continue;
        };
        plans.push((
            i,
            keep.iter().map(|&(f, l)| l - f + 1).collect::<Vec<_>>(),
            pads,
            sliced,
        ));
    }
    let count = plans.len();
    for (i, kernel, pads, w) in plans {
        let name = g.nodes.get(i).map_or_else(String::new, |n| format!("{}.taps", n.name));
        let wv = add_constant(g, &name, w);
        if let Some(node) = g.nodes.get_mut(i) {
            if let NodeKind::Op(Op::Nn(NnOp::Conv(conv))) = &mut node.kind {
                conv.kernel_shape = kernel;
                conv.pads = pads;
            }
            if let Some(slot) = node.inputs.get_mut(1) {
                *slot = Some(wv);
            }
        }
    }
    Ok(count)
}

/// `w[:, :, f0..=l0, f1..=l1, ...]` for the kept tap ranges.
fn slice_kernel(w: &Tensor, keep: &[(usize, usize)]) -> Option<Tensor> {
    let ws = w.shape();
    let v = w.to_f64_vec();
    let spatial = ws.get(2..)?;
    let sizes: Vec<usize> = keep.iter().map(|&(f, l)| l - f + 1).collect();
    let (plane, kept): (usize, usize) = (spatial.iter().product(), sizes.iter().product());
    let mut new_shape = ws.get(..2)?.to_vec();
    new_shape.extend(&sizes);
    // The old flat position of each kept position, in row-major order.
    let positions: Vec<usize> = (0..kept)
        .map(|j| {
            let (mut rest, mut flat, mut stride) = (j, 0, 1);
            for k in (0..sizes.len()).rev() {
                flat += (keep[k].0 + rest % sizes[k]) * stride;
                rest /= sizes[k];
                stride *= spatial[k];
            }
            flat
        })
        .collect();
    let mut out = Vec::with_capacity(v.len() / plane.max(1) * kept);
    for block in v.chunks(plane.max(1)) {
        for &p in &positions {
            out.push(*block.get(p)?);
        }
    }
    Tensor::from_f64(w.dtype(), new_shape, &out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::nn::Conv;

    #[test]
    fn taps_that_only_read_padding_are_dropped() {
        // 3x3 at dilation (6, 2) on a 5x7 image, pads 6 and 2: vertically only the middle row
        // reads the image; horizontally all three columns do.
        let mut b = Builder::new();
        let x = b.input("x", &[1, 3, 5, 7]);
        let w = b.constant("w", noise(&[4, 3, 3, 3], 1));
        let conv = Op::Nn(NnOp::Conv(Conv {
            dilations: vec![6, 2],
            pads: vec![6, 2, 6, 2],
            group: 1,
            ..Conv::default()
        }));
        let y = b.node(conv, &[Some(x), Some(w)], &[&[1, 4, 5, 7]])[0];
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        crate::passes::dce::run(&mut g).unwrap();
        g.verify().unwrap();
        let NodeKind::Op(Op::Nn(NnOp::Conv(c))) = &g.nodes[0].kind else {
            panic!("not a Conv")
        };
        assert_eq!((c.kernel_shape.clone(), c.pads.clone()), (vec![1, 3], vec![0, 2, 0, 2]));
        let xin = noise(&[1, 3, 5, 7], 2);
        assert_close(
            &run_graph(&g, vec![xin.clone()])[0],
            &run_graph(&before, vec![xin])[0],
            1e-6,
        );
        // Nothing to drop: left alone.
        assert_eq!(run(&mut g).unwrap(), 0);
    }

    /// Fuzz finding (load_onnx): an empty kernel may have a dim of 2^40; the live taps are
    /// solved for, not scanned (the scan took minutes).
    #[test]
    fn an_empty_kernel_with_a_huge_dim_is_answered_at_once() {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 0, 5, 5]);
        let w = b.constant(
            "w",
            Tensor::zeros(kiln_tensor::DType::F32, vec![2, 0, 1, 1 << 40]).unwrap(),
        );
        let conv = Op::Nn(NnOp::Conv(Conv {
            pads: vec![0, 0, 0, 0],
            group: 1,
            ..Conv::default()
        }));
        let y = b.node(conv, &[Some(x), Some(w)], &[&[1, 2, 5, 1]])[0];
        let mut g = b.finish(&[y]);
        assert_eq!(run(&mut g).unwrap(), 0);
    }
}
