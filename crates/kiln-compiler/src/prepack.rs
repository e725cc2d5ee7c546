//! Weight prepacking for the GEMM kernels, done once at compile time: a MatMul or Gemm whose B
//! is a constant f32 matrix (`[k, n]`, or `[n, k]` for a Gemm with transB) read by nothing else
//! gets that constant replaced by the kernels' packed panels (layout `f32/nr32/v1`, which every kernel level reads), and records
//! the packing in its op. The packed weights go to the program file's aligned weights section
//! and are used in place from the memory map; no run packs them again.

use kiln_ir::Graph;
use kiln_kernels::gemm::MatLayout;
use kiln_kernels::sgemm::{BLayout, PackedB};
use kiln_ops::fast::{ConvPlan, PackedConvWeights, PackedWeight, Plan, RecurrentPlan, WinogradWeights};
use kiln_ops::nn::NnOp;
use kiln_ops::quant::QuantOp;
use kiln_ops::recurrent::RecurrentOp;
use kiln_ops::{Op, Value, ValueType};
use kiln_runtime::{Program, Step, StepKind};
use kiln_tensor::{DType, Tensor};

/// The packing used: fixed, so a program runs on every kernel level and machine.
pub const LAYOUT: BLayout = BLayout::NR32;

/// How many steps read each slot (captures included), and the program's output slots: a
/// constant may be replaced only when its one reader is the step rewriting it.
fn readers(program: &Program) -> (Vec<usize>, Vec<usize>) {
    let mut reads = vec![0usize; program.num_slots()];
    for step in &program.steps {
        for s in step.inputs.iter().flatten().copied().chain(step.captured_slots()) {
            if let Some(r) = reads.get_mut(s) {
                *r += 1;
            }
        }
    }
    (reads, program.outputs.iter().map(|o| o.slot).collect())
}

/// The f32 tensor constant in `slot` and its position in the program's constants, when the
/// step rewriting it is its only reader and it is not a program output.
fn sole_constant<'p>(
    program: &'p Program,
    reads: &[usize],
    outputs: &[usize],
    slot: usize,
) -> Option<(usize, &'p Tensor)> {
    if reads.get(slot) != Some(&1) || outputs.contains(&slot) {
        return None;
    }
    let ci = program.constants.iter().position(|(s, _)| *s == slot)?;
    match program.constants.get(ci) {
        Some((_, Value::Tensor(t))) => Some((ci, t)),
        _ => None,
    }
}

/// Applies `mark` to every step that `select` picks, given which slots hold program
/// constants; returns how many it marked.
fn mark_steps(
    program: &mut Program,
    select: impl Fn(&Step, &dyn Fn(usize) -> bool) -> bool,
    mark: impl Fn(&mut Step),
) -> usize {
    let constants = &program.constants;
    let is_constant = |slot: usize| constants.iter().any(|(s, _)| *s == slot);
    let mut marked = 0;
    for step in program.steps.iter_mut() {
        if select(step, &is_constant) {
            mark(step);
            marked += 1;
        }
    }
    marked
}

/// Marks the MatMulInteger and QLinearMatMul steps whose B and B zero point are program
/// constants, and the ConvInteger steps whose W and W zero point are: they pack it for the
/// integer GEMM on their first run and keep it (`b_constant`, `w_constant`).
/// Returns how many it marked.
pub fn integer_weights(program: &mut Program) -> usize {
    mark_steps(
        program,
        |step, is_constant| {
            // The weights and their zero point: inputs 1 and 3 of MatMulInteger and
            // ConvInteger, 3 and 5 of QLinearMatMul.
            let (w, zw) = match &step.kind {
                StepKind::Op(Op::Quant(QuantOp::MatMulInteger(m))) if !m.b_constant => (1, 3),
                StepKind::Op(Op::Quant(QuantOp::ConvInteger(c))) if !c.w_constant => (1, 3),
                StepKind::Op(Op::Quant(QuantOp::QLinearMatMul(q))) if !q.b_constant => (3, 5),
                _ => return false,
            };
            step.inputs.get(w).copied().flatten().is_some_and(is_constant)
                && step.inputs.get(zw).copied().flatten().is_none_or(is_constant)
        },
        |step| match &mut step.kind {
            StepKind::Op(Op::Quant(QuantOp::MatMulInteger(m))) => m.b_constant = true,
            StepKind::Op(Op::Quant(QuantOp::QLinearMatMul(q))) => q.b_constant = true,
            StepKind::Op(Op::Quant(QuantOp::ConvInteger(c))) => c.w_constant = true,
            _ => {}
        },
    )
}

/// Gives the RNN, GRU and LSTM steps whose W and R are program constants a
/// [`Plan::Recurrent`]: they pack those weights on their first run and keep them. Returns how
/// many it planned.
pub fn recurrent_weights(program: &mut Program) -> usize {
    mark_steps(
        program,
        |step, is_constant| {
            matches!(step.kind, StepKind::Op(Op::Recurrent(RecurrentOp::Recurrent(_))))
                && step.plan.is_none()
                && [1, 2]
                    .iter()
                    .all(|&i| step.inputs.get(i).copied().flatten().is_some_and(is_constant))
        },
        |step| step.plan = Some(Plan::Recurrent(RecurrentPlan::default())),
    )
}

/// Prepacks the main program's eligible MatMul and Gemm weights; returns how many it packed.
pub fn run(graph: &Graph, program: &mut Program) -> usize {
    let (reads, outputs) = readers(program);
    let is_f32 = |slot: usize| {
        graph.values.get(slot).is_some_and(|v| match &v.ty {
            ValueType::Tensor(t) => t.dtype == Some(DType::F32),
            _ => false,
        })
    };
    let mut packed = 0;
    for i in 0..program.steps.len() {
        let Some(step) = program.steps.get(i) else { break };
        // Which op, and whether its B is stored transposed (`n x k`).
        let trans_b = match &step.kind {
            StepKind::Op(Op::Nn(NnOp::MatMul(_))) => false,
            StepKind::Op(Op::Nn(NnOp::Gemm(g))) => g.trans_b,
            _ => continue,
        };
        if matches!(&step.plan, Some(Plan::Gemm(p)) if p.packed_b.is_some()) {
            continue;
        }
        let (Some(Some(a)), Some(Some(b))) = (step.inputs.first(), step.inputs.get(1)) else {
            continue;
        };
        let (a, b) = (*a, *b);
        if !is_f32(a) {
            continue;
        }
        let Some((ci, w)) = sole_constant(program, &reads, &outputs, b) else {
            continue;
        };
        let (Ok(data), [r, c]) = (w.as_slice::<f32>(), w.shape()) else {
            continue;
        };
        let ((k, n), layout) = if trans_b {
            ((*c, *r), MatLayout::transposed(*c))
        } else {
            ((*r, *c), MatLayout::row_major(*c))
        };
        let Ok(p) = PackedB::pack(LAYOUT, k, n, data, layout) else {
            continue;
        };
        let floats: Vec<f32> = p.view().data().to_vec();
        let Ok(t) = Tensor::from_vec(vec![floats.len()], floats) else {
            continue;
        };
        let record = Some(PackedWeight {
            k,
            n,
            layout: LAYOUT.tag().to_string(),
        });
        let Some(step) = program.steps.get_mut(i) else { break };
        let plan = step.plan.get_or_insert_with(|| Plan::Gemm(Default::default()));
        let Some(plan) = plan.gemm_mut() else { continue };
        plan.packed_b = record;
        if let Some(c) = program.constants.get_mut(ci) {
            c.1 = Value::Tensor(t);
        }
        packed += 1;
    }
    packed
}

/// The `which`-th convolution of a step (its weights are input [`conv_weight_input`]): a Conv
/// itself (`which` 0), or a PointwiseDepthwise's 1x1 (0) and depthwise (1) convolutions.
/// [`conv_of`] without making a plan: the convolution and the plan it runs under (the
/// default for a Conv step that has none).
fn conv_ref<'a>(kind: &'a StepKind, plan: Option<&Plan>, which: usize) -> Option<(&'a kiln_ops::nn::Conv, ConvPlan)> {
    match (kind, which, plan) {
        (StepKind::Op(Op::Nn(NnOp::Conv(c))), 0, Some(Plan::Conv(p))) => Some((c, *p)),
        (StepKind::Op(Op::Nn(NnOp::Conv(c))), 0, None) => Some((c, ConvPlan::default())),
        (StepKind::Op(Op::Nn(NnOp::PointwiseDepthwise(f))), 0, _) => Some((&f.pointwise.conv, f.pointwise.plan)),
        (StepKind::Op(Op::Nn(NnOp::PointwiseDepthwise(f))), 1, _) => Some((&f.depthwise.conv, f.depthwise.plan)),
        _ => None,
    }
}

/// With the plan it runs under (a Conv step's own, made when absent: call it to write).
fn conv_of<'a>(
    kind: &'a mut StepKind,
    plan: &'a mut Option<Plan>,
    which: usize,
) -> Option<(&'a mut kiln_ops::nn::Conv, &'a mut ConvPlan)> {
    match (kind, which) {
        (StepKind::Op(Op::Nn(NnOp::Conv(c))), 0) => {
            let plan = plan.get_or_insert_with(|| Plan::Conv(ConvPlan::default()));
            Some((c, plan.conv_mut()?))
        }
        (StepKind::Op(Op::Nn(NnOp::PointwiseDepthwise(f))), 0) => Some((&mut f.pointwise.conv, &mut f.pointwise.plan)),
        (StepKind::Op(Op::Nn(NnOp::PointwiseDepthwise(f))), 1) => Some((&mut f.depthwise.conv, &mut f.depthwise.plan)),
        _ => None,
    }
}

/// The input holding the weights of [`conv_of`]`(which)`, and whether that convolution
/// has a residual input.
fn conv_weight_input(kind: &StepKind, inputs: &[Option<usize>], which: usize) -> (usize, bool) {
    match kind {
        StepKind::Op(Op::Nn(NnOp::PointwiseDepthwise(_))) => ([1, 3].get(which).copied().unwrap_or(1), false),
        _ => (1, matches!(inputs.get(3), Some(Some(_)))),
    }
}

/// Packs the weights of the main program's channels-last f32 convolutions (the `layout`
/// pass's, also inside PointwiseDepthwise steps): group 1 as the GEMM's B, `[kh*kw*c, m]`
/// with rows in (ky, kx, c) order, the order of a channels-last im2col row; depthwise as taps
/// `[kh*kw, m]`; other groups as taps `[kh*kw, c, m]` (`c` per group). Only constant weights of shape `[m, c, kh, kw]` read by nothing else;
/// returns how many it packed.
pub fn channels_last(program: &mut Program) -> usize {
    let (reads, outputs) = readers(program);
    let mut packed = 0;
    for i in 0..program.steps.len() {
        for which in 0..2 {
            let Some(step) = program.steps.get(i) else { break };
            let (wi, residual) = conv_weight_input(&step.kind, &step.inputs, which);
            let Some((conv, plan)) = conv_ref(&step.kind, step.plan.as_ref(), which) else {
                continue;
            };
            if !plan.channels_last || plan.packed.is_some() || plan.winograd.is_some() {
                continue;
            }
            let group = conv.group.max(1);
            let Some(&Some(w)) = step.inputs.get(wi) else { continue };
            let Some((ci, wt)) = sole_constant(program, &reads, &outputs, w) else {
                continue;
            };
            let (Ok(data), &[m, c, kh, kw]) = (wt.as_slice::<f32>(), wt.shape()) else {
                continue;
            };
            // An empty kernel has nothing to pack (and a kernel_shape with a 0 would not load).
            if data.is_empty() {
                continue;
            }
            let pk = PackedConvWeights { m, c, kh, kw };
            let weights = match (group, c) {
                (1, _) => kiln_ops::fast::pack_channels_last(data, pk),
                // Depthwise: the taps in the order the channels-last kernel reads them.
                (g, 1) if g == m && !residual => kiln_ops::fast::pack_depthwise_taps(data, m, kh, kw),
                // Grouped: the taps `[kh*kw, c, m]`, for the grouped kernel.
                (g, _) if g > 1 && m.is_multiple_of(g) && !residual => {
                    kiln_kernels::grouped::pack_taps(data, m, c, kh, kw)
                        .ok_or_else(|| kiln_ops::OpError::input_shape(wi, "a W the grouped kernel packs", wt.shape()))
                }
                _ => continue,
            };
            let Ok(t) = weights.and_then(|v| Ok(Tensor::from_vec(vec![v.len()], v)?)) else {
                continue;
            };
            let Some((conv, plan)) = program
                .steps
                .get_mut(i)
                .and_then(|s| conv_of(&mut s.kind, &mut s.plan, which))
            else {
                break;
            };
            plan.packed = Some(pk);
            conv.kernel_shape = vec![kh, kw];
            if let Some(c) = program.constants.get_mut(ci) {
                c.1 = Value::Tensor(t);
            }
            packed += 1;
        }
    }
    packed
}

/// Smallest output, in 4x4 tiles, and channel counts for which a 3x3 convolution runs as
/// Winograd. The transformed weights are 4x the size of W (36 vs 9 values per channel pair),
/// paid once in file size, load time and resident memory, while the time saved grows with the
/// tile count: at 4 tiles (ResNet's 7x7 layers, 512 channels) Winograd measured 1.9 ms
/// against 3.1 ms, but 38 MB of weights per layer made ResNet-18's program 2.5x larger and its
/// load only 8.9x faster than an ONNX Runtime session (the bar is 10x). From 16 tiles the
/// saving is larger per byte.
const WINOGRAD_MIN_TILES: usize = 16;
const WINOGRAD_MIN_CHANNELS: usize = 8;

/// Chooses Winograd F(4x4, 3x3) for the main program's eligible convolutions, from their
/// static shapes: f32, 3x3 constant weights read by nothing else, group 1, stride 1, a
/// fixed `[N, C, H, W]` input, at least [`WINOGRAD_MIN_TILES`] output tiles and
/// [`WINOGRAD_MIN_CHANNELS`] channels each way. Dilated convolutions too when channels-last:
/// they run as one Winograd pass per class of outputs a dilation apart (PLCMOS's (2, 1)
/// layers), each at least [`WINOGRAD_MIN_TILES`] tiles. The weights constant is replaced by its
/// transform, packed (`kiln_kernels::winograd::pack_weights`, layout [`LAYOUT`]); returns how
/// many convolutions it converted.
pub fn winograd(graph: &Graph, program: &mut Program) -> usize {
    let (reads, outputs) = readers(program);
    let fixed_f32 = |slot: usize| -> Option<Vec<usize>> {
        let v = graph.values.get(slot)?;
        match &v.ty {
            ValueType::Tensor(t) if t.dtype == Some(DType::F32) => t.fixed_shape(),
            _ => None,
        }
    };
    let mut converted = 0;
    for i in 0..program.steps.len() {
        let Some(step) = program.steps.get(i) else { break };
        let (StepKind::Op(Op::Nn(NnOp::Conv(_))), Some((conv, plan))) =
            (&step.kind, conv_ref(&step.kind, step.plan.as_ref(), 0))
        else {
            continue;
        };
        let ones = |v: &[usize]| v.iter().all(|&d| d == 1);
        if plan.winograd.is_some()
            || plan.packed.is_some()
            || plan.x_channels_first
            || conv.group.max(1) != 1
            || !ones(&conv.strides)
            || (!ones(&conv.dilations) && !plan.channels_last)
        {
            continue;
        }
        let (Some(Some(x)), Some(Some(w)), Some(Some(y))) =
            (step.inputs.first(), step.inputs.get(1), step.outputs.first())
        else {
            continue;
        };
        let (x, w) = (*x, *w);
        let (Some(xs), Some(ys)) = (fixed_f32(x), fixed_f32(*y)) else {
            continue;
        };
        let Some((ci, wt)) = sole_constant(program, &reads, &outputs, w) else {
            continue;
        };
        let (Ok(data), &[m, c, 3, 3], &[_, x1, _, x3], &[_, y1, y2, y3]) =
            (wt.as_slice::<f32>(), wt.shape(), xs.as_slice(), ys.as_slice())
        else {
            continue;
        };
        // Channels-last X is [N, H, W, C] and Y [N, OH, OW, M].
        let (xc, oh, ow) = if plan.channels_last { (x3, y1, y2) } else { (x1, y2, y3) };
        // The smallest class of outputs (all of them when undilated).
        let dilation = |i: usize| conv.dilations.get(i).copied().unwrap_or(1).max(1);
        let (dh, dw) = (dilation(0), dilation(1));
        let tiles = (oh / dh).div_ceil(4) * (ow / dw).div_ceil(4);
        if xc != c || tiles < WINOGRAD_MIN_TILES || c < WINOGRAD_MIN_CHANNELS || m < WINOGRAD_MIN_CHANNELS {
            continue;
        }
        // Few output channels channels-last: the direct kernel over pixel vectors
        // (`kiln_kernels::planar`) beats the transforms, which cost as much per tile as at
        // 32 channels (P-Net's 10 -> 16 layer at 151x151: 1.29 ms as Winograd).
        if plan.channels_last && kiln_kernels::planar::takes(m, c, [3, 3], ow) {
            continue;
        }
        let Ok(u) = kiln_kernels::winograd::pack_weights(data, m, c, LAYOUT) else {
            continue;
        };
        let Ok(t) = Tensor::from_vec(vec![u.len()], u) else {
            continue;
        };
        let Some(step) = program.steps.get_mut(i) else { break };
        if let Some((conv, plan)) = conv_of(&mut step.kind, &mut step.plan, 0) {
            plan.winograd = Some(WinogradWeights { m, c });
            conv.kernel_shape = vec![3, 3];
        }
        if let Some(c) = program.constants.get_mut(ci) {
            c.1 = Value::Tensor(t);
        }
        converted += 1;
    }
    converted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use crate::{CompileOptions, compile};
    use kiln_ops::nn::MatMul;

    fn matmul() -> Op {
        Op::Nn(NnOp::MatMul(MatMul::default()))
    }

    /// The default options at optimisation level `opt_level`.
    fn level(opt_level: u8) -> CompileOptions {
        CompileOptions {
            opt_level,
            ..CompileOptions::default()
        }
    }

    fn run_program(p: &Program, x: Tensor) -> Tensor {
        let out = kiln_runtime::run(p, vec![("x".into(), Value::Tensor(x))]).unwrap();
        out[0].1.as_tensor().unwrap().clone()
    }

    #[test]
    fn constant_weights_are_packed_once_and_give_the_same_product() {
        // y = (x · W1) · W2 with x [2, 5, 7]; W1 [7, 40], W2 [40, 3]; both weights packed.
        let mut b = Builder::new();
        let x = b.input("x", &[2, 5, 7]);
        let w1 = b.constant("w1", noise(&[7, 40], 1));
        let w2 = b.constant("w2", noise(&[40, 3], 2));
        let h = b.node(matmul(), &[Some(x), Some(w1)], &[&[2, 5, 40]])[0];
        let y = b.node(matmul(), &[Some(h), Some(w2)], &[&[2, 5, 3]])[0];
        let g = b.finish(&[y]);
        let packed = compile(g.clone(), &level(2)).unwrap();
        let plain = compile(g, &level(0)).unwrap();
        assert_eq!((packed.prepacked, plain.prepacked), (2, 0));
        let layouts: Vec<Option<PackedWeight>> = packed
            .program
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Op(Op::Nn(NnOp::MatMul(_))) => Some(match &s.plan {
                    Some(Plan::Gemm(p)) => p.packed_b.clone(),
                    _ => None,
                }),
                _ => None,
            })
            .collect();
        assert_eq!(
            layouts,
            vec![
                Some(PackedWeight {
                    k: 7,
                    n: 40,
                    layout: "f32/nr32/v1".into()
                }),
                Some(PackedWeight {
                    k: 40,
                    n: 3,
                    layout: "f32/nr32/v1".into()
                }),
            ]
        );
        let x = noise(&[2, 5, 7], 3);
        assert_close(
            &run_program(&packed.program, x.clone()),
            &run_program(&plain.program, x),
            1e-5,
        );
    }

    /// A bidirectional LSTM of constant weights gets the kept-packing plan; its outputs, on
    /// the run that packs and on a later one, are the unplanned program's.
    #[test]
    fn recurrent_weights_are_planned_to_pack_once() {
        use kiln_ops::recurrent::{Activation, Cell, Direction, Recurrent};
        let (seq, batch, input, hs) = (6, 1, 5, 12);
        let mut b = Builder::new();
        let x = b.input("x", &[seq, batch, input]);
        let w = b.constant("w", noise(&[2, 4 * hs, input], 6));
        let r = b.constant("r", noise(&[2, 4 * hs, hs], 7));
        let bias = b.constant("b", noise(&[2, 8 * hs], 8));
        let lstm = Op::Recurrent(RecurrentOp::Recurrent(Recurrent {
            cell: Cell::Lstm { input_forget: false },
            hidden_size: Some(hs),
            direction: Direction::Bidirectional,
            activations: [Activation::Sigmoid, Activation::Tanh, Activation::Tanh].repeat(2),
            clip: None,
            batch_first: false,
            quantized_state: false,
        }));
        let y = b.node(lstm, &[Some(x), Some(w), Some(r), Some(bias)], &[&[seq, 2, batch, hs]])[0];
        let g = b.finish(&[y]);
        let planned = compile(g.clone(), &level(2)).unwrap();
        let plain = compile(g, &level(0)).unwrap();
        let plans = |p: &Program| {
            p.steps
                .iter()
                .filter(|s| matches!(s.plan, Some(Plan::Recurrent(_))))
                .count()
        };
        assert_eq!((plans(&planned.program), plans(&plain.program)), (1, 0));
        let x = noise(&[seq, batch, input], 9);
        let want = run_program(&plain.program, x.clone());
        for _ in 0..2 {
            assert_close(&run_program(&planned.program, x.clone()), &want, 1e-5);
        }
    }

    #[test]
    fn gemm_weights_with_trans_b_alpha_beta_and_c_give_the_same_result() {
        use kiln_ops::nn::Gemm;
        let mut b = Builder::new();
        let x = b.input("x", &[3, 20]);
        let w = b.constant("w", noise(&[37, 20], 4));
        let c = b.constant("c", noise(&[37], 5));
        let gemm = Op::Nn(NnOp::Gemm(Gemm {
            alpha: 0.5,
            beta: 2.0,
            trans_b: true,
            ..Gemm::default()
        }));
        let y = b.node(gemm, &[Some(x), Some(w), Some(c)], &[&[3, 37]])[0];
        let g = b.finish(&[y]);
        let packed = compile(g.clone(), &level(1)).unwrap();
        let plain = compile(g, &level(0)).unwrap();
        assert_eq!(packed.prepacked, 1);
        let x = noise(&[3, 20], 6);
        assert_close(
            &run_program(&packed.program, x.clone()),
            &run_program(&plain.program, x),
            1e-5,
        );
    }

    #[test]
    fn shared_weights_stay_as_they_are() {
        // One weight read by two MatMuls is left unpacked (the other reader needs the matrix).
        let mut b = Builder::new();
        let x = b.input("x", &[4, 6]);
        let w = b.constant("w", noise(&[6, 6], 1));
        let h = b.node(matmul(), &[Some(x), Some(w)], &[&[4, 6]])[0];
        let y = b.node(matmul(), &[Some(h), Some(w)], &[&[4, 6]])[0];
        let g = b.finish(&[y]);
        let c = compile(g, &CompileOptions::default()).unwrap();
        assert_eq!(c.prepacked, 0);
    }

    /// A 3x3 residual block (Conv + Add + Relu) compiles to one Winograd Conv at level 2 and
    /// computes what the unoptimised graph does, within Winograd's rounding (see
    /// `kiln_kernels::winograd`), dilated ones too (channels-last, one pass per class of
    /// outputs); a strided or too small one stays on the GEMM path.
    #[test]
    fn three_by_three_convolutions_become_winograd() {
        use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp, UnaryOp};
        use kiln_ops::nn::Conv;
        let dilated = |size: usize, stride: usize, [dh, dw]: [usize; 2]| {
            let mut b = Builder::new();
            let x = b.input("x", &[1, 8, size, size]);
            let w = b.constant("w", noise(&[8, 8, 3, 3], 3));
            let bias = b.constant("b", noise(&[8], 4));
            let conv = Op::Nn(NnOp::Conv(Conv {
                group: 1,
                pads: vec![dh, dw, dh, dw],
                strides: vec![stride, stride],
                dilations: vec![dh, dw],
                ..Conv::default()
            }));
            let o = (size - 1) / stride + 1;
            let c = b.node(conv, &[Some(x), Some(w), Some(bias)], &[&[1, 8, o, o]])[0];
            let y = if stride == 1 {
                let add = Op::Elementwise(ElementwiseOp::Binary(Binary {
                    op: BinaryOp::Add,
                    legacy_axis: None,
                }));
                let s = b.node(add, &[Some(c), Some(x)], &[&[1, 8, o, o]])[0];
                let relu = Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu));
                b.node(relu, &[Some(s)], &[&[1, 8, o, o]])[0]
            } else {
                c
            };
            b.finish(&[y])
        };
        let block = |size: usize, stride: usize| dilated(size, stride, [1, 1]);
        // 18 and 22 columns: under `planar`'s (which takes 8 output channels from 24).
        for (size, d) in [(18, [1, 1]), (22, [2, 1]), (22, [1, 2])] {
            let g = dilated(size, 1, d);
            let fast = compile(g.clone(), &level(2)).unwrap();
            let plain = compile(g, &level(0)).unwrap();
            assert_eq!((fast.winograd, plain.winograd), (1, 0), "dilation {d:?}");
            // The Conv, channels-last between the transposes of the `layout` pass.
            assert_eq!(fast.program.steps.len(), 3);
            let x = noise(&[1, 8, size, size], 5);
            let (a, r) = (run_program(&fast.program, x.clone()), run_program(&plain.program, x));
            let (a, r) = (a.to_f64_vec(), r.to_f64_vec());
            let scale = r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert!(r.iter().any(|&v| v == 0.0) && r.iter().any(|&v| v > 0.0));
            for (p, q) in a.iter().zip(&r) {
                assert!(
                    (p - q).abs() <= 1e-5 * scale,
                    "winograd (dilation {d:?}) {p} vs reference {q}"
                );
            }
        }
        // Stride 2, or fewer than 16 output tiles (in each class of a dilated one): the GEMM
        // path.
        assert_eq!(compile(block(18, 2), &level(2)).unwrap().winograd, 0);
        assert_eq!(compile(block(12, 1), &level(2)).unwrap().winograd, 0);
        assert_eq!(compile(dilated(18, 1, [2, 2]), &level(2)).unwrap().winograd, 0);
    }
}
