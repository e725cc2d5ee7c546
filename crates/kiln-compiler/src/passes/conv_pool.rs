//! A channels-last 2-D MaxPool that reads a channels-last convolution's output alone goes
//! into the convolution (`ConvPlan::pool`): its packed path makes the output a band of rows
//! at a time and pools each band while it is in cache, so the convolution's full output is
//! never written to memory and read back (a spectrogram model's first 3x3 convolution wrote
//! 14 MB a run that its 2x2 pool then read: a third of DNSMOS P.808's time in the two). The
//! maximum of the same values, so results are bit-identical.
//!
//! Runs after the layout pass (which makes both channels-last) and the passes that fuse an
//! activation, PRelu, residual sum or scale and shift into the convolution (all of them act
//! before the pool, in the convolution's epilogue).

use super::edit::{Index, mark, op, remove_nodes};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op};
use kiln_ops::fast::{ConvPlan, MaxPoolWindow, Plan};
use kiln_ops::nn::NnOp;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    // (the Conv's position, the pool's position, its window)
    let mut fusions = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(Op::Nn(NnOp::Pool(pool))) = op(node) else {
            continue;
        };
        let Some(window) = MaxPoolWindow::of(pool) else {
            continue;
        };
        // Y alone: a channels-last pool has no Indices output.
        let (true, [Some(x)], Some(Some(_))) = (
            node.pool_plan().channels_last,
            node.inputs.as_slice(),
            node.outputs.first(),
        ) else {
            continue;
        };
        if node.outputs.iter().skip(1).any(Option::is_some) {
            continue;
        }
        let Some(p) = index.producer(*x) else { continue };
        let Some(conv) = g.nodes.get(p) else { continue };
        let NodeKind::Op(Op::Nn(NnOp::Conv(c))) = &conv.kind else {
            continue;
        };
        let plan = conv.conv_plan();
        let residual = conv.inputs.get(3).is_some_and(Option::is_some);
        if !plan.channels_last
            || plan.pool.is_some()
            || !matches!(conv.plan, Some(Plan::Conv(_)))
            || c.group.max(1) != 1
            || residual
            || conv.outputs.len() != 1
            || !index.sole_use(*x, i)
            || index.is_output(*x)
        {
            continue;
        }
        fusions.push((p, i, window));
    }
    let mut dead = vec![false; g.nodes.len()];
    for &(p, i, window) in &fusions {
        let Some(out) = g.nodes.get(i).and_then(|n| n.outputs.first().copied().flatten()) else {
            continue;
        };
        let Some(conv) = g.nodes.get_mut(p) else { continue };
        conv.plan = Some(Plan::Conv(ConvPlan {
            pool: Some(window),
            ..conv.conv_plan()
        }));
        conv.outputs = vec![Some(out)];
        mark(&mut dead, [i]);
    }
    remove_nodes(g, &dead);
    Ok(fusions.len())
}

#[cfg(test)]
mod tests {
    use crate::passes::testutil::*;
    use crate::{CompileOptions, compile};
    use kiln_ir::Graph;
    use kiln_ops::fast::{ConvPlan, MaxPoolWindow, Plan};
    use kiln_ops::nn::{Activation, AutoPad, NnOp, Pool, PoolKind};
    use kiln_ops::{Op, Value};
    use kiln_runtime::StepKind;
    use kiln_tensor::Tensor;

    fn max_pool(k: usize, s: usize, pad: usize, ceil_mode: bool) -> Op {
        Op::Nn(NnOp::Pool(Pool {
            kind: PoolKind::Max { storage_order: false },
            auto_pad: AutoPad::NotSet,
            ceil_mode,
            dilations: vec![],
            kernel_shape: vec![k, k],
            pads: vec![pad; 4],
            strides: vec![s, s],
        }))
    }

    /// The pooled size of `n` under a `k`/`s`/`pad` window.
    fn pooled(n: usize, k: usize, s: usize, pad: usize, ceil_mode: bool) -> usize {
        let span = n + 2 * pad - k;
        let out = if ceil_mode { span.div_ceil(s) + 1 } else { span / s + 1 };
        // ONNX: a last window that starts in the end padding is dropped.
        if ceil_mode && (out - 1) * s >= n + pad {
            out - 1
        } else {
            out
        }
    }

    /// x [batch, 3, h, w] -> 3x3 pad 1 stride `cs`, 3 -> m (Relu) -> MaxPool -> 3x3 pad 1,
    /// m -> 8 (so the pool sits between channels-last convolutions). With `second`, a 3x3
    /// convolution 3 -> 8 comes first, so the pooled one reads channels-last X.
    #[allow(clippy::type_complexity)]
    fn graph(
        (batch, h, w, m, cs, pool, second): (usize, usize, usize, usize, usize, (usize, usize, usize, bool), bool),
    ) -> (Graph, [usize; 4]) {
        let (k, s, pad, ceil) = pool;
        let mut b = Builder::new();
        let mut x = b.input("x", &[batch, 3, h, w]);
        let mut c = 3;
        if second {
            let w0 = b.constant("w0", noise(&[8, 3, 3, 3], 4));
            x = b.node(conv2d(1, 1, 1), &[Some(x), Some(w0)], &[&[batch, 8, h, w]])[0];
            c = 8;
        }
        let w1 = b.constant("w1", noise(&[m, c, 3, 3], 1));
        let b1 = b.constant("b1", noise(&[m], 2));
        let w2 = b.constant("w2", noise(&[8, m, 3, 3], 3));
        let (oh, ow) = ((h - 1) / cs + 1, (w - 1) / cs + 1);
        let c = b.node_act(
            conv2d(1, 1, cs),
            Some(Activation::Relu),
            &[Some(x), Some(w1), Some(b1)],
            &[&[batch, m, oh, ow]],
        )[0];
        let (ph, pw) = (pooled(oh, k, s, pad, ceil), pooled(ow, k, s, pad, ceil));
        let p = b.node(max_pool(k, s, pad, ceil), &[Some(c)], &[&[batch, m, ph, pw]])[0];
        let y = b.node(conv2d(1, 1, 1), &[Some(p), Some(w2)], &[&[batch, 8, ph, pw]])[0];
        (b.finish(&[y]), [batch, 3, h, w])
    }

    fn run(p: &kiln_runtime::Program, x: &Tensor) -> Tensor {
        let out = kiln_runtime::run(p, vec![("x".into(), Value::Tensor(x.clone()))]).unwrap();
        out.into_iter().next().unwrap().1.as_tensor().unwrap().clone()
    }

    fn level(opt_level: u8) -> CompileOptions {
        CompileOptions {
            opt_level,
            ..CompileOptions::default()
        }
    }

    /// Pools over convolutions of several bands per image (a 160-row image of 32 channels
    /// makes about 60 rows a band), over a batch (bands that end one image and start the
    /// next), with overlapping windows, padding and ceil mode, strided convolutions, X read
    /// channels-first (the image) and channels-last (a convolution's output), and a
    /// Winograd convolution (pooled after its whole output).
    #[test]
    fn max_pools_fuse_into_their_convolutions_and_match_level_0() {
        let cases = [
            (1, 160, 64, 32, 1, (2, 2, 0, false), false),
            (2, 150, 66, 32, 1, (3, 2, 1, false), false),
            (2, 97, 41, 32, 1, (2, 2, 0, true), false),
            (1, 121, 70, 16, 2, (3, 2, 1, true), false),
            (3, 20, 18, 24, 1, (3, 1, 1, false), false),
            (2, 150, 66, 32, 2, (2, 2, 0, false), true),
            (1, 131, 70, 16, 2, (3, 2, 1, true), true),
            (1, 64, 48, 16, 1, (3, 2, 1, false), true),
        ];
        for case in cases {
            let (batch, h, w, m, cs, pool, _) = case;
            let (g, xs) = graph(case);
            let x = noise(&xs, 9);
            let want = run(&compile(g.clone(), &level(0)).unwrap().program, &x);
            let fused = compile(g, &level(2)).unwrap().program;
            let pooled_plans: Vec<ConvPlan> = fused
                .steps
                .iter()
                .filter_map(|s| match (&s.kind, &s.plan) {
                    (StepKind::Op(Op::Nn(NnOp::Conv(_))), Some(Plan::Conv(p))) if p.pool.is_some() => Some(*p),
                    _ => None,
                })
                .collect();
            let windows: Vec<MaxPoolWindow> = pooled_plans.iter().filter_map(|p| p.pool).collect();
            // A stride-1 3x3 of 8 channels and more runs Winograd (then the pool after it).
            let winograd = cs == 1 && case.6;
            assert_eq!(
                pooled_plans.iter().map(|p| p.winograd.is_some()).collect::<Vec<_>>(),
                [winograd]
            );
            let pools = fused
                .steps
                .iter()
                .filter(|s| matches!(&s.kind, StepKind::Op(Op::Nn(NnOp::Pool(_)))))
                .count();
            let case = format!("{batch}x{h}x{w} m={m} stride {cs} pool {pool:?}");
            assert_eq!((windows.len(), pools), (1, 0), "{case}");
            let (k, s, pad, ceil) = pool;
            assert_eq!(
                (
                    windows[0].kernel,
                    windows[0].strides,
                    windows[0].pads,
                    windows[0].ceil_mode
                ),
                ([k, k], [s, s], [pad; 4], ceil),
                "{case}"
            );
            let got = run(&fused, &x);
            assert_eq!(got.shape(), want.shape(), "{case}");
            assert_close(&got, &want, 1e-5);
            let v = want.to_f64_vec();
            assert!(v.iter().any(|&q| (q - v[0]).abs() > 1e-3), "{case}");
        }
    }

    /// A pool whose input another op reads too stays a pool.
    #[test]
    fn a_convolution_output_read_twice_keeps_its_pool() {
        let mut b = Builder::new();
        let x = b.input("x", &[1, 8, 16, 16]);
        let w1 = b.constant("w1", noise(&[16, 8, 3, 3], 1));
        let w2 = b.constant("w2", noise(&[8, 16, 3, 3], 3));
        let c = b.node(conv2d(1, 1, 1), &[Some(x), Some(w1)], &[&[1, 16, 16, 16]])[0];
        let p = b.node(max_pool(2, 2, 0, false), &[Some(c)], &[&[1, 16, 8, 8]])[0];
        let y = b.node(conv2d(1, 1, 1), &[Some(p), Some(w2)], &[&[1, 8, 8, 8]])[0];
        let g = b.finish(&[y, c]);
        let fused = compile(g, &level(2)).unwrap().program;
        let pooled = fused
            .steps
            .iter()
            .any(|s| matches!(&s.plan, Some(Plan::Conv(p)) if p.pool.is_some()));
        assert!(!pooled);
    }
}
