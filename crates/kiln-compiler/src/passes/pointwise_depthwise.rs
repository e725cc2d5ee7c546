//! Depth-first fusion of an inverted residual block's expansion: a channels-last 1x1
//! convolution whose output only a channels-last depthwise convolution reads becomes one
//! `PointwiseDepthwise` node, which expands the input a few rows at a time just ahead of the
//! depthwise window (see `kiln_ops::nn::PointwiseDepthwise`), so the expanded tensor never
//! goes out to memory.
//!
//! Only when: both are f32 with constant weights (packed later by `prepack`); the 1x1 has
//! stride 1, no padding, group 1, no residual, a channels-last X; the depthwise has
//! `group` = its channels, a 2-D window and no residual; and the expanded image is at least
//! [`MIN_BYTES`]: a smaller one stays in L2 between the two layers anyway, and the rows of its
//! narrow images make GEMMs too small to run well one at a time. The fused node takes the
//! depthwise node's place (its inputs all exist there) and its name.

use super::edit::{Index, dtype_of, fixed_shape, remove_nodes};
use crate::CompileError;
use kiln_ir::{Graph, NodeKind, Op};
use kiln_ops::fast::{ConvPlan, ConvStage};
use kiln_ops::nn::{AutoPad, Conv, NnOp, PointwiseDepthwise};
use kiln_tensor::DType;

/// Smallest expanded image (one image of the 1x1's output) fused: half of Zen 4's 1 MiB L2,
/// all of Zen 3's 512 KiB. Measured on Zen 3 (kiln bench, 7 alternating rounds): with 256 KiB
/// MobileNet-v2's 14 x 14 x 384 and x 576 expansions ran fused, one 14-pixel row of GEMM at a
/// time, and the model took 12.1 ms; apart (512 KiB) 11.8 ms (0.96-0.97x, 2 threads 0.98x);
/// apart up to 1 MiB, which unfuses its 28 x 28 x 192 too, 1.11x. On Zen 4 (1 MiB L2) 512 KiB
/// also beat 256 (p50 7.11 against 7.41 ms, 1 thread) and matched 1 MiB.
pub(crate) const MIN_BYTES: usize = 1 << 19;

fn ones(v: &[usize]) -> bool {
    v.iter().all(|&d| d == 1)
}

/// A channels-last f32 1x1 convolution of the kind fused (see the module docs).
fn is_pointwise(op: &Conv, plan: &ConvPlan) -> bool {
    plan.channels_last
        && !plan.x_channels_first
        && plan.post.is_none()
        && plan.winograd.is_none()
        && plan.packed.is_none()
        && op.group.max(1) == 1
        && ones(&op.strides)
        && ones(&op.dilations)
        // A 1x1 stride-1 window pads nothing under any auto_pad but explicit pads.
        && (op.auto_pad != AutoPad::NotSet || op.pads.iter().all(|&p| p == 0))
}

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    // (the depthwise node's position, the 1x1's position, the fused op)
    let mut plans: Vec<(usize, usize, PointwiseDepthwise)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let NodeKind::Op(Op::Nn(NnOp::Conv(dw))) = &node.kind else {
            continue;
        };
        let (Some(Some(mid)), Some(Some(w2))) = (node.inputs.first(), node.inputs.get(1)) else {
            continue;
        };
        let dw_plan = node.conv_plan();
        if !dw_plan.channels_last
            || dw_plan.x_channels_first
            || dw_plan.post.is_some()
            || dw_plan.winograd.is_some()
            || dw_plan.packed.is_some()
            || node.inputs.len() > 3
            || node.outputs.len() != 1
            || !index.sole_use(*mid, i)
        {
            continue;
        }
        let Some(p) = index.producer(*mid) else { continue };
        let Some(pw_node) = g.nodes.get(p) else { continue };
        let NodeKind::Op(Op::Nn(NnOp::Conv(pw))) = &pw_node.kind else {
            continue;
        };
        let Some(Some(w1)) = pw_node.inputs.get(1) else {
            continue;
        };
        if !is_pointwise(pw, &pw_node.conv_plan()) || pw_node.inputs.len() > 3 || pw_node.outputs.len() != 1 {
            continue;
        }
        let (Some(t1), Some(t2), Some(ms)) = (index.tensor(g, *w1), index.tensor(g, *w2), fixed_shape(g, *mid)) else {
            continue;
        };
        let (&[e, _, 1, 1], &[e2, 1, _, _], &[_, h, w, c]) = (t1.shape(), t2.shape(), ms.as_slice()) else {
            continue;
        };
        let f32s = [Some(*mid), pw_node.inputs.first().copied().flatten()]
            .into_iter()
            .flatten()
            .all(|v| dtype_of(g, v) == Some(DType::F32))
            && t1.dtype() == DType::F32
            && t2.dtype() == DType::F32;
        let big = h.saturating_mul(w).saturating_mul(c).saturating_mul(4) >= MIN_BYTES;
        if !f32s || !big || e != c || e2 != c || dw.group != c {
            continue;
        }
        let fused = PointwiseDepthwise {
            pointwise: ConvStage {
                conv: pw.clone(),
                plan: pw_node.conv_plan(),
            },
            depthwise: ConvStage {
                conv: dw.clone(),
                plan: dw_plan,
            },
        };
        plans.push((i, p, fused));
    }
    let count = plans.len();
    let mut dead = vec![false; g.nodes.len()];
    for (i, p, fused) in plans {
        let Some(mut inputs) = g.nodes.get(p).map(|n| n.inputs.clone()) else {
            continue;
        };
        let Some(node) = g.nodes.get_mut(i) else { continue };
        inputs.resize(3, None);
        inputs.extend(node.inputs.iter().skip(1).copied());
        inputs.resize(5, None);
        node.kind = NodeKind::Op(Op::Nn(NnOp::PointwiseDepthwise(fused)));
        // The two Convs' plans are inside the fused op now.
        node.plan = None;
        node.inputs = inputs;
        if let Some(d) = dead.get_mut(p) {
            *d = true;
        }
    }
    remove_nodes(g, &dead);
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use crate::{CompileOptions, compile};
    use kiln_ops::Value;
    use kiln_ops::nn::Activation;
    use kiln_runtime::StepKind;
    use kiln_tensor::Tensor;

    /// The depthwise window of one case.
    struct Window {
        stride: usize,
        dilation: usize,
        pads: [usize; 4],
        act: Option<Activation>,
        biases: bool,
    }

    /// x [n, 8, s, s] -> 1x1 8->e (Clip 0..6) -> depthwise 3x3 `window` -> y.
    fn block(n: usize, s: usize, e: usize, win: &Window) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[n, 8, s, s]);
        let w1 = b.constant("w1", noise(&[e, 8, 1, 1], 1));
        let b1 = win.biases.then(|| b.constant("b1", noise(&[e], 2)));
        let w2 = b.constant("w2", noise(&[e, 1, 3, 3], 3));
        let b2 = win.biases.then(|| b.constant("b2", noise(&[e], 4)));
        let pw = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            ..Conv::default()
        }));
        let relu6 = Some(Activation::Clip {
            min: Some(0.0),
            max: Some(6.0),
        });
        let h = b.node_act(pw, relu6, &[Some(x), Some(w1), b1], &[&[n, e, s, s]])[0];
        let [pt, pl, pb, pr] = win.pads;
        let out = |pad: usize| (s + pad - 2 * win.dilation - 1) / win.stride + 1;
        let (oh, ow) = (out(pt + pb), out(pl + pr));
        let dw = Op::Nn(NnOp::Conv(Conv {
            group: e,
            pads: win.pads.to_vec(),
            strides: vec![win.stride; 2],
            dilations: vec![win.dilation; 2],
            ..Conv::default()
        }));
        let y = b.node_act(dw, win.act, &[Some(h), Some(w2), b2], &[&[n, e, oh, ow]])[0];
        b.finish(&[y])
    }

    fn level(opt_level: u8) -> CompileOptions {
        CompileOptions {
            opt_level,
            ..CompileOptions::default()
        }
    }

    fn run_on(program: &kiln_runtime::Program, x: Tensor, threads: usize) -> Tensor {
        let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap();
        let out = pool.install(|| kiln_runtime::run(program, vec![("x".into(), Value::Tensor(x))]).unwrap());
        out[0].1.as_tensor().unwrap().clone()
    }

    #[test]
    fn an_expansion_and_its_depthwise_convolution_run_fused_as_computed_apart() {
        let windows = [
            Window {
                stride: 1,
                dilation: 1,
                pads: [1; 4],
                act: Some(Activation::Clip {
                    min: Some(0.0),
                    max: Some(6.0),
                }),
                biases: true,
            },
            // Stride 2, uneven pads, an activation applied after the depthwise kernel.
            Window {
                stride: 2,
                dilation: 1,
                pads: [0, 1, 1, 0],
                act: Some(Activation::HardSwish),
                biases: true,
            },
            // Dilation 2 (a ring of five rows), no biases, no activation.
            Window {
                stride: 1,
                dilation: 2,
                pads: [2; 4],
                act: None,
                biases: false,
            },
        ];
        // 64 x 64 x 48 floats (768 KiB per expanded image) runs fused on 1 and 2 threads;
        // 16 x 16 x 512 (512 KiB) too on 1, but on 2 the rows expanded twice would be an eighth
        // of the image: the expansion then runs whole.
        for (i, win) in windows.iter().enumerate() {
            for (n, s, e) in [(1, 64, 48), (2, 64, 48), (1, 16, 512), (2, 16, 512)] {
                let g = block(n, s, e, win);
                let fast = compile(g.clone(), &level(2)).unwrap();
                let plain = compile(g.clone(), &level(0)).unwrap();
                let fused: Vec<_> = fast
                    .program
                    .steps
                    .iter()
                    .filter_map(|s| match &s.kind {
                        StepKind::Op(Op::Nn(NnOp::PointwiseDepthwise(f))) => Some(f),
                        _ => None,
                    })
                    .collect();
                assert_eq!(fused.len(), 1, "case {i}");
                assert!(fused[0].pointwise.plan.packed.is_some() && fused[0].depthwise.plan.packed.is_some());
                let x = noise(&[n, 8, s, s], 10 + i as u64);
                let want = run_on(&plain.program, x.clone(), 1);
                for threads in [1, 2] {
                    assert_close(&run_on(&fast.program, x.clone(), threads), &want, 1e-5);
                }
                // The graph-level node without packed weights runs the two convolutions.
                let mut h = g.clone();
                crate::passes::layout::run(&mut h).unwrap();
                crate::passes::dce::run(&mut h).unwrap();
                assert_eq!(run(&mut h).unwrap(), 1);
                h.verify().unwrap();
                assert_close(&run_graph(&h, vec![x])[0], &want, 1e-5);
            }
        }
    }

    #[test]
    fn small_images_and_shared_expansions_stay_apart() {
        let win = Window {
            stride: 1,
            dilation: 1,
            pads: [1; 4],
            act: None,
            biases: true,
        };
        // 16 x 16 x 48 floats: 48 KiB, which stays in L2 between the layers; 24 x 24 x 192
        // (432 KiB, as MobileNet-v2's 14 x 14 x 576) too.
        for (s, e) in [(16, 48), (24, 192)] {
            let mut g = block(1, s, e, &win);
            crate::passes::layout::run(&mut g).unwrap();
            crate::passes::dce::run(&mut g).unwrap();
            assert_eq!(run(&mut g).unwrap(), 0, "{s} x {s} x {e}");
        }
        // The expansion is also a graph output: it must be written out, so nothing fuses.
        let mut g = block(1, 64, 48, &win);
        let mid = g.nodes[0].outputs[0].unwrap();
        g.outputs.push(mid);
        crate::passes::layout::run(&mut g).unwrap();
        crate::passes::dce::run(&mut g).unwrap();
        assert_eq!(run(&mut g).unwrap(), 0);
    }
}
