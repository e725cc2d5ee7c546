//! The planned `Conv`: the fast paths a [`super::ConvPlan`] selects, and for calls without
//! a plan the shape-generic f32 kernels (direct depthwise, im2col panels into the packed GEMM).
//! Each path falls back to the reference evaluation (`crate::nn::Conv::eval`, channels-first,
//! any dtype) for the calls it does not take, and applies the plan's activation and residual
//! as the reference of the fused ops would.
//!
//! Paths, in the order they are tried:
//! - channels-last (`conv_nhwc.rs`): packed GEMM, depthwise, grouped, else the reference
//!   between transposes;
//! - Winograd F(4x4, 3x3) (`kiln_kernels::winograd`) on transformed, packed weights;
//! - a residual input 3 (an `Add` fused in): the GEMM epilogue adds it, else the `Add` op's
//!   own evaluation after the convolution;
//! - direct depthwise (f32, `group == C == M`, `depthwise.rs`);
//! - im2col written straight into packed GEMM panels (f32 2-D), bias and activation in the
//!   GEMM's epilogue;
//! - the reference, then the activation.

use super::{ConvPlan, WinogradWeights};
use crate::error::{OpError, Result};
use crate::nn::activation;
use crate::nn::conv::conv_run;
use crate::nn::{
    Conv, check_float, float_dispatch, input_shape, numel, pads_attr, tensor_type, window_dims, window_geom,
};
use crate::util;
use crate::value::{Args, Dim, InferInput, Value, ValueType};
use kiln_kernels::recycle::lend;
use kiln_tensor::Tensor;

kiln_kernels::scratch_kinds! {
    /// The packed im2col panels of the f32 2-D path (a run state's scratch, per thread).
    Packed: Vec<f32>;
    /// A column block's packed panels when blocks run in parallel (one per compute thread).
    PackedTask: Vec<f32>;
    /// The column-phase split input of strided convolutions.
    Phases: Vec<f32>;
    /// The Winograd path's scratch (padded input, transforms, products).
    WinogradScratch: Vec<f32>;
}

/// `f(shape, values)` on an f32 tensor's own storage (a run arena's region or its vector,
/// written in place); `not_f32`'s error for another element type.
fn in_place_f32(y: &mut Tensor, not_f32: impl FnOnce() -> OpError, f: impl FnOnce(&[usize], &mut [f32])) -> Result<()> {
    if y.dtype() != kiln_tensor::DType::F32 {
        return Err(not_f32());
    }
    let shape = kiln_tensor::Shape::from_slice(y.shape());
    let kiln_tensor::Data::F32(mut b) = std::mem::replace(y, Tensor::scalar(0.0f32)).into_data() else {
        return Err(not_f32());
    };
    f(&shape, b.as_mut_slice());
    *y = Tensor::from_buf(shape, b)?;
    Ok(())
}

/// A `Conv` with the plan it runs under. Derefs to the op, so its attributes read as they do
/// in the reference.
#[derive(Clone, Copy)]
pub(crate) struct Planned<'a> {
    pub op: &'a Conv,
    pub plan: ConvPlan,
}

impl std::ops::Deref for Planned<'_> {
    type Target = Conv;
    fn deref(&self) -> &Conv {
        self.op
    }
}

impl<'a> Planned<'a> {
    pub(crate) fn new(op: &'a Conv, plan: &ConvPlan) -> Planned<'a> {
        Planned { op, plan: *plan }
    }

    /// The same op under another plan.
    pub(crate) fn with(&self, plan: ConvPlan) -> Planned<'a> {
        Planned { op: self.op, plan }
    }

    /// The error for inputs this Conv's plan cannot run (only a crafted program gives them).
    pub(super) fn misfit(&self, reason: &'static str) -> OpError {
        OpError::Plan {
            op: "Conv",
            plan: super::Plan::Conv(self.plan).summary(),
            reason,
        }
    }

    /// Runs the convolution under this plan (see the module docs).
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        if self.plan.prelu {
            return self.eval_prelu(args);
        }
        // The channels-last paths apply a scale and shift after the activation themselves
        // (or come back here for it); the others leave it to `post_after`.
        if self.plan.post.is_some() && !(self.plan.channels_last && self.plan.winograd.is_none()) {
            return self.post_after(args);
        }
        if self.plan.channels_last {
            return self.eval_channels_last(args);
        }
        if let Some(info) = self.plan.winograd {
            return Ok(smallvec::smallvec![self.eval_winograd(args, info, None)?.into()]);
        }
        let x = args.tensor(0)?;
        let w = args.tensor(1)?;
        let b = args.opt_tensor(2)?;
        check_float(x, 0)?;
        // The fast f32 kernels apply the activation in their epilogue; other types (and f16,
        // whose product rounds before the activation) apply it after.
        let act = self
            .plan
            .activation
            .filter(|_| x.dtype() == kiln_tensor::DType::F32)
            .map(|a| a.kernel_act());
        if let Some(r) = args.opt_tensor(3)? {
            return self.eval_residual(args, r, act);
        }
        if let Some(y) = self.depthwise_f32(x, w, b, act)? {
            return Ok(smallvec::smallvec![y.into()]);
        }
        if let Some(y) = self.gemm2d_f32(x, w, b, act, None)? {
            return Ok(smallvec::smallvec![y.into()]);
        }
        let (y, act_done) = float_dispatch!(x.dtype(), 0, conv_run(self.op, x, w, b, act))?;
        if act_done {
            return Ok(smallvec::smallvec![y.into()]);
        }
        Ok(smallvec::smallvec![
            activation::apply(self.plan.activation.as_ref(), y)?.into()
        ])
    }

    /// The convolution and its PRelu ([`ConvPlan::prelu`], the slopes in input 4): in the
    /// epilogue of the channels-last packed path, else over the whole f32 output after the
    /// convolution of inputs 0-3.
    fn eval_prelu(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let slopes = args.tensor(4)?;
        let s = slopes.as_slice::<f32>().map_err(|_| OpError::UnsupportedDType {
            index: 4,
            got: slopes.dtype(),
        })?;
        // One slope per output channel: checked against the packed weights, or the output.
        let bad_slopes =
            |m: usize| OpError::input_shape(4, format!("[{m}] (a PRelu slope per output channel)"), slopes.shape());
        if slopes.rank() != 1 {
            return Err(bad_slopes(s.len()));
        }
        let plain = self.with(ConvPlan {
            prelu: false,
            ..self.plan
        });
        if let (true, None, Some(pk), 1) = (
            self.plan.channels_last,
            self.plan.winograd,
            self.plan.packed,
            self.group.max(1),
        ) {
            let x = args.tensor(0)?;
            if x.rank() != 4 {
                return Err(OpError::input_shape(
                    0,
                    "[N, H, W, C] (a channels-last Conv)",
                    x.shape(),
                ));
            }
            if s.len() != pk.m {
                return Err(bad_slopes(pk.m));
            }
            return Ok(smallvec::smallvec![plain.packed_nhwc(args, pk, Some(s))?.into()]);
        }
        if let Some(info) = self.plan.winograd {
            if s.len() != info.m {
                return Err(bad_slopes(info.m));
            }
            return Ok(smallvec::smallvec![plain.eval_winograd(args, info, Some(s))?.into()]);
        }
        let inputs: smallvec::SmallVec<[Option<&Value>; 4]> = (0..4).map(|i| args.value(i)).collect();
        let mut out = plain.eval(&Args::new(&inputs))?;
        if let Some(Value::Tensor(y)) = out.first_mut() {
            let m = match (self.plan.channels_last, y.shape()) {
                (true, [.., m]) | (false, [_, m, ..]) => *m,
                _ => 0,
            };
            if s.len() != m {
                return Err(bad_slopes(m));
            }
            let channels_last = self.plan.channels_last;
            in_place_f32(
                y,
                || self.misfit("a PRelu after a non-f32 Conv"),
                |shape, v| {
                    if channels_last {
                        kiln_kernels::vector::prelu_channels(v, s);
                    } else {
                        // [N, M, spatial...]: one slope per plane.
                        let plane: usize = shape.iter().skip(2).product();
                        for (i, p) in v.chunks_exact_mut(plane.max(1)).enumerate() {
                            kiln_kernels::vector::prelu_one(p, s.get(i % m).copied().unwrap_or(1.0));
                        }
                    }
                },
            )?;
        }
        Ok(out)
    }

    /// The convolution without its scale and shift ([`ConvPlan::post`]), then those over the
    /// whole f32 output.
    pub(super) fn post_after(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let plain = self.with(ConvPlan {
            post: None,
            ..self.plan
        });
        let mut out = plain.eval(args)?;
        if let Some(post) = self.plan.post
            && let Some(Value::Tensor(y)) = out.first_mut()
        {
            in_place_f32(
                y,
                || self.misfit("a scale and shift after a non-f32 Conv"),
                |_, v| post.kernel().apply_slice(v),
            )?;
        }
        Ok(out)
    }

    /// The Winograd path (see [`ConvPlan::winograd`]): f32 X `[N, c, H, W]` (or `[N, H, W, c]`
    /// channels-last), the packed weights,
    /// optional bias and residual; 3x3, stride 1, group 1 by construction, dilated only
    /// channels-last.
    pub(super) fn eval_winograd(
        &self,
        args: &Args<'_>,
        info: WinogradWeights,
        prelu: Option<&[f32]>,
    ) -> Result<Tensor> {
        use kiln_kernels::sgemm::BLayout;
        use kiln_kernels::winograd::{Winograd, packed_weights_len};
        let x = args.tensor(0)?;
        let u = args.tensor(1)?;
        let b = args.opt_tensor(2)?;
        let r = args.opt_tensor(3)?;
        let WinogradWeights { m, c } = info;
        let (batch, xc, ih, iw) = match (x.shape(), self.plan.channels_last) {
            (&[n, h, w, c], true) => (n, c, h, w),
            (&[n, c, h, w], false) => (n, c, h, w),
            _ => {
                return Err(OpError::input_shape(0, "rank 4 (a Winograd Conv)", x.shape()));
            }
        };
        if xc != c {
            return Err(OpError::input_shape(
                0,
                format!("{c} channels, as the Winograd weights"),
                x.shape(),
            ));
        }
        let layout = BLayout::NR32;
        let want = packed_weights_len(layout, m, c);
        if want != Some(u.len()) {
            let expected = match want {
                Some(n) => format!("the {n} floats of W [{m}, {c}, 3, 3] Winograd-transformed"),
                None => format!("W [{m}, {c}, 3, 3] Winograd-transformed within the size bound"),
            };
            return Err(OpError::input_value(1, expected, format!("{} floats", u.len())));
        }
        let pads = pads_attr(&self.pads, 2)?;
        let dilation = [0, 1].map(|i| self.dilations.get(i).copied().unwrap_or(1));
        if dilation != [1, 1] && !self.plan.channels_last {
            return Err(OpError::Unsupported(format!(
                "a dilated ({dilation:?}) Winograd convolution channels-first (it runs channels-last)"
            )));
        }
        // H and W: axes 1 and 2 of a channels-last X, 2 and 3 of a channels-first one.
        let ah = if self.plan.channels_last { 1 } else { 2 };
        let gh = window_geom(x.shape(), ah, 3, 1, dilation[0], pads[0], pads[2], self.auto_pad, false)?;
        let gw = window_geom(
            x.shape(),
            ah + 1,
            3,
            1,
            dilation[1],
            pads[1],
            pads[3],
            self.auto_pad,
            false,
        )?;
        let shape: kiln_tensor::Shape = if self.plan.channels_last {
            kiln_tensor::smallvec::smallvec![batch, gh.out, gw.out, m]
        } else {
            kiln_tensor::smallvec::smallvec![batch, m, gh.out, gw.out]
        };
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        let (xd, ud) = (x.as_slice::<f32>()?, u.as_slice::<f32>()?);
        let bd = f32_bias(b, m, 2)?;
        let g = Winograd {
            c,
            m,
            ih,
            iw,
            oh: gh.out,
            ow: gw.out,
            ph: gh.pad_begin,
            pw: gw.pad_begin,
            channels_last: self.plan.channels_last,
            dilation,
        };
        g.scratch_len()
            .and_then(|n| numel(&[n]).ok())
            .ok_or_else(|| OpError::too_large("the Winograd scratch of X", format!("{:?}", x.shape())))?;
        let (ip, op) = (c * ih * iw, m * gh.out * gw.out);
        let bad = || OpError::input_shape(0, "a shape that fits the Winograd weights", x.shape());
        let rd = f32_residual(r, &shape)?;
        let act = self.plan.activation.map(|a| a.kernel_act());
        let mut scratch = lend::<WinogradScratch>();
        for n in 0..batch {
            let xi = xd.get(n * ip..(n + 1) * ip).ok_or_else(bad)?;
            let yi = y.get_mut(n * op..(n + 1) * op).ok_or_else(bad)?;
            let ri = match rd {
                Some(rd) => Some(rd.get(n * op..(n + 1) * op).ok_or_else(bad)?),
                None => None,
            };
            if !g.run(xi, ud, layout, bd, ri, act, prelu, yi, &mut scratch) {
                return Err(bad());
            }
        }
        Ok(Tensor::from_buf(shape, y)?)
    }

    /// `activation(conv(X, W, B) + R)`, R the residual input 3 that the compiler fuses in from
    /// a following Add (same shape as the output). The f32 2-D path adds it in the GEMM's
    /// epilogue; others add it after, with the Add op's own evaluation.
    fn eval_residual(
        &self,
        args: &Args<'_>,
        r: &Tensor,
        act: Option<kiln_kernels::sgemm::Act>,
    ) -> Result<crate::Outputs> {
        let (x, w, b) = (args.tensor(0)?, args.tensor(1)?, args.opt_tensor(2)?);
        if let Some(y) = self.gemm2d_f32(x, w, b, act, Some(r))? {
            return Ok(smallvec::smallvec![y.into()]);
        }
        let plain = self.with(ConvPlan {
            activation: None,
            ..self.plan
        });
        let inputs = [args.value(0), args.value(1), args.value(2)];
        let y = plain.eval(&Args::new(&inputs))?;
        let y = match y.first() {
            Some(Value::Tensor(t)) => t,
            _ => return Err(self.misfit("the Conv without its residual gave no tensor")),
        };
        if y.shape() != r.shape() {
            return Err(residual_misfit(r, y.shape()));
        }
        let add = crate::elementwise::Binary {
            op: crate::elementwise::BinaryOp::Add,
            legacy_axis: None,
        };
        let sum = add.apply(y, r)?;
        Ok(smallvec::smallvec![
            activation::apply(self.plan.activation.as_ref(), sum)?.into()
        ])
    }

    /// The f32 2-D path: per (image, group), the im2col matrix is built directly as packed
    /// GEMM panels (in parallel over the current thread pool, into a reused per-thread
    /// buffer), and the GEMM's epilogue adds the bias and applies the activation. `None` when
    /// the call is not f32 2-D (the generic path takes it).
    fn gemm2d_f32(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Option<kiln_kernels::sgemm::Act>,
        residual: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        use kiln_kernels::conv::{im2col_panel_2d, im2col_panel_2d_phased, phase_len, split_phases};
        use kiln_kernels::sgemm::{AMatrix, BLayout, Bias, Epilogue, PackedBRef, sgemm};
        let (xs, ws) = (x.shape(), w.shape());
        let f32s = |t: &Tensor| t.dtype() == kiln_tensor::DType::F32;
        let ([batch, c, ih, iw], [m, _, _, _]) = (xs, ws) else {
            return Ok(None);
        };
        if !f32s(x) || !f32s(w) || !b.is_none_or(f32s) || !residual.is_none_or(f32s) {
            return Ok(None);
        }
        let (batch, c, ih, iw, m) = (*batch, *c, *ih, *iw, *m);
        let window = self.window(xs, ws)?;
        let g = self.group.max(1);
        if c % g != 0 || m % g != 0 || ws[1] * g != c {
            return Err(OpError::inputs(0, 1, format!("X and W that fit group {g}"), xs, ws));
        }
        let Some(geo) = window.conv2d(c / g, ih, iw) else {
            return Ok(None);
        };
        let (kdim, osz, mg) = (geo.k(), geo.n(), m / g);
        let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![batch, m, geo.oh, geo.ow];
        let rd = f32_residual(residual, &shape)?;
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        if y.is_empty() {
            return Ok(Some(activation::apply(
                self.plan.activation.as_ref(),
                Tensor::from_buf(shape, y)?,
            )?));
        }
        let (xd, wd) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let bd = f32_bias(b, m, 2)?;
        let layout = BLayout::for_isa(kiln_kernels::isa::active());
        let nr = layout.nr();
        // Columns per packed block: its panels take at most 512 KiB (half of Zen 4's L2).
        const BLOCK_FLOATS: usize = 128 * 1024;
        let block = (BLOCK_FLOATS / kdim.max(1) / nr).max(1) * nr;
        numel(&[kdim, block])?;
        let bad = || OpError::inputs(0, 1, "X and W that fit the Conv", xs, ws);
        let img = geo.c * ih * iw;
        let mut phases = lend::<Phases>();
        let mut buf = lend::<Packed>();
        (|| -> Result<()> {
            // Every element is written by the panels below: no clearing needed.
            buf.resize(kdim * block, 0.0);
            for n in 0..batch {
                for gi in 0..g {
                    let start = (n * c + gi * geo.c) * ih * iw;
                    let xg = xd.get(start..start + img).ok_or_else(bad)?;
                    // Strided windows of several taps read the input split into column
                    // phases, where each run of a panel row is one slice copy.
                    // Only for a stride within the width: the phases then take under twice
                    // the image (a stride past the width would make each row `sw` floats).
                    let phased = geo.sw > 1 && geo.sw <= geo.iw && geo.kh * geo.kw > 1;
                    if phased {
                        phases.resize(geo.c * ih * geo.sw * phase_len(&geo), 0.0);
                        if !split_phases(&geo, xg, &mut phases) {
                            return Err(bad());
                        }
                    }
                    let phases: &[f32] = &phases;
                    let wg = wd.get(gi * mg * kdim..(gi + 1) * mg * kdim).ok_or_else(bad)?;
                    let ys = (n * m + gi * mg) * osz;
                    let yg = y.get_mut(ys..ys + mg * osz).ok_or_else(bad)?;
                    let bias = match bd.and_then(|v| v.get(gi * mg..(gi + 1) * mg)) {
                        Some(v) => Bias::Row(v),
                        None => Bias::None,
                    };
                    let panel = kdim * nr;
                    let blocks = osz.div_ceil(block);
                    let threads = kiln_kernels::pool::current_threads();
                    if threads > 1 && blocks >= 2 {
                        // Whole column blocks per thread, each packed into and multiplied from
                        // that thread's own cache; results land in per-block buffers (column
                        // blocks of C are not disjoint slices) copied into Y afterwards.
                        let results: Vec<std::sync::Mutex<Vec<f32>>> =
                            (0..blocks).map(|_| std::sync::Mutex::new(Vec::new())).collect();
                        let failed = std::sync::atomic::AtomicBool::new(false);
                        kiln_kernels::pool::parallel_for(blocks, &|bi| {
                            let j0 = bi * block;
                            let nb = block.min(osz - j0);
                            let ok = {
                                let mut pbuf = lend::<PackedTask>();
                                let panels = nb.div_ceil(nr);
                                pbuf.resize(panels * panel, 0.0);
                                let mut ok = true;
                                for (i, p) in pbuf.chunks_exact_mut(panel.max(1)).enumerate() {
                                    let q = j0 / nr + i;
                                    ok &= if phased {
                                        im2col_panel_2d_phased(&geo, phases, nr, q, p)
                                    } else {
                                        im2col_panel_2d(&geo, xg, nr, q, p)
                                    };
                                }
                                let mut out = vec![0.0f32; mg * nb];
                                let residual = rd
                                    .and_then(|r| r.get(ys + j0..ys + mg * osz))
                                    .map(|data| kiln_kernels::sgemm::Residual { data, ld: osz });
                                ok &= rd.is_none() || residual.is_some();
                                let epi = Epilogue {
                                    bias,
                                    residual,
                                    act,
                                    post: None,
                                    prelu: kiln_kernels::sgemm::Bias::None,
                                };
                                ok &= PackedBRef::new(layout, kdim, nb, &pbuf)
                                    .ok()
                                    .and_then(|packed| {
                                        sgemm(mg, AMatrix::row_major(wg, kdim), packed, &mut out, nb, &epi).ok()
                                    })
                                    .is_some();
                                drop(pbuf);
                                if let Some(slot) = results.get(bi) {
                                    *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = out;
                                }
                                ok
                            };
                            if !ok {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                            }
                        });
                        if failed.load(std::sync::atomic::Ordering::Relaxed) {
                            return Err(bad());
                        }
                        for (bi, r) in results.into_iter().enumerate() {
                            let out = r.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
                            let j0 = bi * block;
                            let nb = block.min(osz - j0);
                            for (row, src) in yg.chunks_exact_mut(osz).zip(out.chunks_exact(nb.max(1))) {
                                row.get_mut(j0..j0 + nb).ok_or_else(bad)?.copy_from_slice(src);
                            }
                        }
                        continue;
                    }
                    // Column blocks whose packed panels fit in half the L2 cache: each block is
                    // packed, then multiplied while it is still there.
                    for j0 in (0..osz).step_by(block) {
                        let nb = block.min(osz - j0);
                        let panels = nb.div_ceil(nr);
                        let q0 = j0 / nr;
                        let bbuf = buf.get_mut(..panels * panel).ok_or_else(bad)?;
                        // Panels in parallel: each task fills a disjoint group of whole panels.
                        let tasks = kiln_kernels::pool::current_threads().min(panels).max(1);
                        let per = panels.div_ceil(tasks);
                        let chunks: Vec<std::sync::Mutex<&mut [f32]>> = bbuf
                            .chunks_mut((per * panel).max(1))
                            .map(std::sync::Mutex::new)
                            .collect();
                        let ok = std::sync::atomic::AtomicBool::new(true);
                        kiln_kernels::pool::parallel_for(chunks.len(), &|t| {
                            let Some(chunk) = chunks.get(t) else { return };
                            let mut chunk = chunk.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                            for (i, p) in chunk.chunks_exact_mut(panel.max(1)).enumerate() {
                                let q = q0 + t * per + i;
                                let done = if phased {
                                    im2col_panel_2d_phased(&geo, phases, nr, q, p)
                                } else {
                                    im2col_panel_2d(&geo, xg, nr, q, p)
                                };
                                if !done {
                                    ok.store(false, std::sync::atomic::Ordering::Relaxed);
                                }
                            }
                        });
                        drop(chunks);
                        if !ok.load(std::sync::atomic::Ordering::Relaxed) {
                            return Err(bad());
                        }
                        let bview = buf.get(..panels * panel).ok_or_else(bad)?;
                        let packed = PackedBRef::new(layout, kdim, nb, bview).map_err(|_| bad())?;
                        let epi = Epilogue {
                            bias,
                            residual: match rd {
                                Some(r) => Some(kiln_kernels::sgemm::Residual {
                                    data: r.get(ys + j0..ys + mg * osz).ok_or_else(bad)?,
                                    ld: osz,
                                }),
                                None => None,
                            },
                            act,
                            post: None,
                            prelu: kiln_kernels::sgemm::Bias::None,
                        };
                        let yb = yg.get_mut(j0..).ok_or_else(bad)?;
                        sgemm(mg, AMatrix::row_major(wg, kdim), packed, yb, osz, &epi).map_err(|_| bad())?;
                    }
                }
            }
            // `buf` is kept for the next call on this thread of the run (grown, never shrunk).
            Ok(())
        })()?;
        Ok(Some(Tensor::from_buf(shape, y)?))
    }

    /// The direct depthwise path: f32, 2-D, one filter per channel (`group == C == M`). `None`
    /// when the call is not of that kind (the GEMM path takes it).
    fn depthwise_f32(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        act: Option<kiln_kernels::sgemm::Act>,
    ) -> Result<Option<Tensor>> {
        let (xs, ws) = (x.shape(), w.shape());
        let f32s = |t: &Tensor| t.dtype() == kiln_tensor::DType::F32;
        if !f32s(x) || !f32s(w) || !b.is_none_or(f32s) || xs.len() != 4 || ws.len() != 4 {
            return Ok(None);
        }
        let c = xs[1];
        if self.group != c || ws[0] != c || ws[1] != 1 || c == 0 {
            return Ok(None);
        }
        let window = self.window(xs, ws)?;
        let (Some(gh), Some(gw)) = (window.geoms.first(), window.geoms.get(1)) else {
            return Ok(None);
        };
        let pair = |v: &[usize]| -> Option<[usize; 2]> { Some([*v.first()?, *v.get(1)?]) };
        let (Some(kernel), Some(strides), Some(dilations)) =
            (pair(&window.kernel), pair(&window.strides), pair(&window.dilations))
        else {
            return Ok(None);
        };
        let dw = super::depthwise::Depthwise {
            channels: c,
            input: [xs[2], xs[3]],
            output: [gh.out, gw.out],
            kernel,
            strides,
            dilations,
            pad_begin: [gh.pad_begin, gw.pad_begin],
        };
        let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![xs[0], c, gh.out, gw.out];
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        let (xd, wd) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let bd = f32_bias(b, c, 2)?;
        let (ip, op) = (c * xs[2] * xs[3], c * gh.out * gw.out);
        for n in 0..xs[0] {
            let (Some(xi), Some(yi)) = (xd.get(n * ip..(n + 1) * ip), y.get_mut(n * op..(n + 1) * op)) else {
                return Ok(None);
            };
            if !dw.run(xi, wd, bd, act, yi) {
                return Err(OpError::inputs(0, 1, "X and W that fit a depthwise Conv", xs, ws));
            }
        }
        let y = Tensor::from_buf(shape, y)?;
        // Without a fused activation to apply here, the caller's epilogue would run none either.
        Ok(Some(match (act, self.plan.activation.as_ref()) {
            (None, Some(a)) => activation::apply(Some(a), y)?,
            _ => y,
        }))
    }

    /// The output types under this plan (channels-last permutes them; Winograd weights
    /// record the shape W had).
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        if self.plan.channels_last {
            return self.infer_channels_last(inputs);
        }
        let dtype = util::input_dtype(inputs, 0);
        if let Some(info) = self.plan.winograd {
            // The weights input is the packed transform: the shape W had is in `info`.
            let Some(xs) = input_shape(inputs, 0) else {
                return Ok(vec![util::dtype_only(dtype)]);
            };
            if xs.len() != 4 {
                // With symbols in X's shape, evaluation names it.
                return match xs
                    .iter()
                    .map(crate::recurrent::num::fixed)
                    .collect::<Option<Vec<usize>>>()
                {
                    Some(s) => Err(OpError::input_shape(0, "rank 4 (a Winograd Conv)", &s)),
                    None => Ok(vec![util::dtype_only(dtype)]),
                };
            }
            let pads = pads_attr(&self.pads, 2)?;
            let mut shape = vec![xs[0].clone(), Dim::Fixed(info.m)];
            shape.extend(window_dims(
                &xs,
                &[3, 3],
                &[1, 1],
                &[1, 1],
                &pads,
                self.auto_pad,
                false,
            )?);
            return Ok(vec![tensor_type(dtype, Some(shape))]);
        }
        self.op.infer(inputs)
    }
}

fn residual_misfit(r: &Tensor, shape: &[usize]) -> OpError {
    OpError::input_shape(3, format!("{shape:?}, the output's shape (a residual)"), r.shape())
}

/// The optional f32 residual input's elements, checked against the output's shape.
pub(crate) fn f32_residual<'a>(r: Option<&'a Tensor>, shape: &[usize]) -> Result<Option<&'a [f32]>> {
    match r {
        Some(r) if r.shape() != shape => Err(residual_misfit(r, shape)),
        Some(r) => Ok(Some(r.as_slice::<f32>()?)),
        None => Ok(None),
    }
}

/// The optional f32 bias (input `index`) of `m` output channels, checked for length.
pub(crate) fn f32_bias(b: Option<&Tensor>, m: usize, index: usize) -> Result<Option<&[f32]>> {
    match b {
        Some(b) if b.len() != m => Err(OpError::input_shape(
            index,
            format!("{m} elements, one per output channel"),
            b.shape(),
        )),
        Some(b) => Ok(Some(b.as_slice::<f32>()?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::PostAffine;
    use crate::nn::Activation;

    fn run(op: &Conv, plan: &ConvPlan, x: Tensor, w: Tensor, b: Option<Tensor>) -> Tensor {
        let xv = Value::Tensor(x);
        let wv = Value::Tensor(w);
        let bv = b.map(Value::Tensor);
        let ins = [Some(&xv), Some(&wv), bv.as_ref()];
        let out = Planned::new(op, plan).eval(&Args::new(&ins)).unwrap();
        out[0].as_tensor().unwrap().clone()
    }

    /// The load_program fuzz target's finding (2026-11-26): a strided 3x3 window with a
    /// stride of 2^62 sized its column phases as `c * ih * sw * ceil(iw / sw)` floats, which
    /// overflowed. Such a stride (past the width) now takes the unphased path: one output
    /// column, the same as the stride-1 convolution's first.
    #[test]
    fn a_stride_past_the_width_gives_the_first_column() {
        let (c, m, h, w) = (2, 3, 4, 5);
        let x: Vec<f32> = (0..c * h * w).map(|i| (i % 7) as f32 - 3.0).collect();
        let wt: Vec<f32> = (0..m * c * 9).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let t = |shape: Vec<usize>, v: &[f32]| Tensor::from_vec(shape, v.to_vec()).unwrap();
        let plan = ConvPlan::default();
        let conv = |strides: Vec<usize>| Conv {
            strides,
            pads: vec![1, 1, 1, 1],
            ..Default::default()
        };
        let wide = run(
            &conv(vec![1, 1 << 62]),
            &plan,
            t(vec![1, c, h, w], &x),
            t(vec![m, c, 3, 3], &wt),
            None,
        );
        let one = run(
            &conv(vec![1, 1]),
            &plan,
            t(vec![1, c, h, w], &x),
            t(vec![m, c, 3, 3], &wt),
            None,
        );
        assert_eq!(wide.shape(), &[1, m, h, 1]);
        let (wv, ov) = (wide.to_f64_vec(), one.to_f64_vec());
        for (i, &v) in wv.iter().enumerate() {
            assert_eq!(v, ov[i * w], "row {i}");
        }
    }

    /// A scale and shift after the activation on the paths that apply it after the whole
    /// output (channels-first here): the plain convolution's
    /// values, then the multiply and the add, bit for bit.
    #[test]
    fn a_scale_and_shift_after_the_activation_follow_it() {
        let (c, m, h, w) = (3, 4, 6, 5);
        let x: Vec<f32> = (0..c * h * w).map(|i| (i % 11) as f32 * 0.25 - 1.2).collect();
        let wt: Vec<f32> = (0..m * c * 9).map(|i| (i % 7) as f32 * 0.3 - 0.9).collect();
        let t = |shape: Vec<usize>, v: &[f32]| Tensor::from_vec(shape, v.to_vec()).unwrap();
        let op = Conv {
            pads: vec![1, 1, 1, 1],
            ..Default::default()
        };
        let plain = ConvPlan {
            activation: Some(Activation::HardSwish),
            ..ConvPlan::default()
        };
        let post = PostAffine {
            scale: Some(-1.5),
            shift: Some(0.375),
        };
        let with_post = ConvPlan {
            post: Some(post),
            ..plain
        };
        let (xs, ws) = (vec![1, c, h, w], vec![m, c, 3, 3]);
        let want = run(&op, &plain, t(xs.clone(), &x), t(ws.clone(), &wt), None);
        let got = run(&op, &with_post, t(xs, &x), t(ws, &wt), None);
        let (wv, gv) = (want.as_slice::<f32>().unwrap(), got.as_slice::<f32>().unwrap());
        assert_eq!(gv.len(), wv.len());
        for (g, w) in gv.iter().zip(wv) {
            assert_eq!(g.to_bits(), post.kernel().apply(*w).to_bits());
        }
        assert!(wv.iter().any(|&v| v != wv[0]));
    }

    #[test]
    fn depthwise_path_matches_the_gemm_path() {
        // Every geometry mobile nets use and some they do not: strides, dilations, asymmetric pads,
        // kernels wider than the image; checked against the generic path computed in f64.
        let mut seed = 7u32;
        let mut rnd = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((seed >> 8) % 2001) as f32 / 1000.0 - 1.0
        };
        for (hw, k, stride, dil, pads, bias) in [
            ([7, 9], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], true),
            ([8, 8], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], false),
            ([9, 6], [3, 5], [2, 1], [1, 2], [0, 2, 1, 0], true),
            ([5, 5], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2], true),
            ([3, 4], [5, 3], [1, 3], [1, 1], [0, 0, 0, 0], false),
            ([6, 6], [3, 3], [3, 2], [2, 2], [3, 1, 0, 2], true),
        ] {
            let c = 5;
            let xs = vec![2, c, hw[0], hw[1]];
            let x: Vec<f32> = (0..2 * c * hw[0] * hw[1]).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..c * k[0] * k[1]).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..c).map(|_| rnd()).collect();
            if hw[0] + pads[0] + pads[2] < (k[0] - 1) * dil[0] + 1
                || hw[1] + pads[1] + pads[3] < (k[1] - 1) * dil[1] + 1
            {
                continue;
            }
            let op = Conv {
                group: c,
                strides: stride.to_vec(),
                dilations: dil.to_vec(),
                pads: pads.to_vec(),
                ..Default::default()
            };
            let plan = ConvPlan {
                activation: Some(Activation::Relu),
                ..Default::default()
            };
            let t32 = |shape: Vec<usize>, v: &[f32]| Tensor::from_vec(shape, v.to_vec()).unwrap();
            let t64 = |shape: Vec<usize>, v: &[f32]| {
                Tensor::from_vec(shape, v.iter().map(|&a| a as f64).collect::<Vec<_>>()).unwrap()
            };
            let ws = vec![c, 1, k[0], k[1]];
            let fast = run(
                &op,
                &plan,
                t32(xs.clone(), &x),
                t32(ws.clone(), &w),
                bias.then(|| t32(vec![c], &b)),
            );
            let slow = run(&op, &plan, t64(xs, &x), t64(ws, &w), bias.then(|| t64(vec![c], &b)));
            assert_eq!(fast.shape(), slow.shape());
            for (f, s) in fast.to_f64_vec().iter().zip(slow.to_f64_vec()) {
                assert!(
                    (f - s).abs() <= 1e-5 * (1.0 + s.abs()),
                    "{hw:?} {k:?} {stride:?}: {f} vs {s}"
                );
            }
            assert!(fast.to_f64_vec().iter().any(|&v| v > 0.0));
        }
    }

    #[test]
    fn threaded_column_blocks_match_one_thread() {
        let mut seed = 11u32;
        let mut rnd = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((seed >> 8) % 2001) as f32 / 1000.0 - 1.0
        };
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (stride, hw) in [(1usize, 82usize), (2, 163)] {
            let (c, m) = (3, 5);
            let x: Vec<f32> = (0..c * hw * hw).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..m * c * 9).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..m).map(|_| rnd()).collect();
            let o = (hw + 2 - 3) / stride + 1;
            let r: Vec<f32> = (0..m * o * o).map(|_| rnd()).collect();
            let conv = Conv {
                group: 1,
                pads: vec![1, 1, 1, 1],
                strides: vec![stride, stride],
                ..Default::default()
            };
            let plan = ConvPlan {
                activation: Some(Activation::Relu),
                ..Default::default()
            };
            let op = Planned::new(&conv, &plan);
            let vals = [
                Value::Tensor(Tensor::from_vec(vec![1, c, hw, hw], x).unwrap()),
                Value::Tensor(Tensor::from_vec(vec![m, c, 3, 3], w).unwrap()),
                Value::Tensor(Tensor::from_vec(vec![m], b).unwrap()),
                Value::Tensor(Tensor::from_vec(vec![1, m, o, o], r).unwrap()),
            ];
            let ins: Vec<Option<&Value>> = vals.iter().map(Some).collect();
            // Recycled output buffers hold stale values: NaN ones show any element left unwritten.
            kiln_kernels::recycle::give(vec![f32::NAN; m * o * o]);
            let one = op.eval(&Args::new(&ins)).unwrap();
            kiln_kernels::recycle::give(vec![f32::NAN; m * o * o]);
            let two = pool.install(|| op.eval(&Args::new(&ins)).unwrap());
            let (a, b) = (one[0].as_tensor().unwrap(), two[0].as_tensor().unwrap());
            assert_eq!(a.shape(), &[1, m, o, o]);
            assert!(o * o > 131072 / 27, "needs two column blocks");
            assert_eq!(
                a.as_slice::<f32>().unwrap(),
                b.as_slice::<f32>().unwrap(),
                "stride {stride}"
            );
            assert!(a.as_slice::<f32>().unwrap().iter().any(|&v| v > 0.0));
        }
    }
}
