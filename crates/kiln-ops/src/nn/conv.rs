//! Convolutions: `Conv` (opset 1–22), `ConvTranspose` (opset 1–22) and `DeformConv`
//! (opset 19–22), per <https://onnx.ai/onnx/operators/onnx__Conv.html>,
//! <https://onnx.ai/onnx/operators/onnx__ConvTranspose.html> and
//! <https://onnx.ai/onnx/operators/onnx__DeformConv.html>.
//!
//! Conv lowers to im2col + GEMM per (image, group); ConvTranspose to GEMM + col2im.

use super::activation::{self, Activation};
use super::{
    AutoPad, DimGeom, Dims, FastEpilogue, Real, check_float, float_dispatch, floats, from_floats, input_shape, numel,
    pads_attr, spatial_attr, tensor_type, window_dims, window_geom,
};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, Value, ValueType};
use kiln_kernels::conv::{ConvGeometry, col2im_add, im2col};
use kiln_kernels::gemm::{MatLayout, gemm};
use kiln_tensor::Tensor;

thread_local! {
    /// The packed im2col panels of the f32 2-D path, reused across calls on a thread.
    static PACKED: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// A column block's packed panels when blocks run in parallel (one per pool thread).
    static PACKED_TASK: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// The column-phase split input of strided convolutions, reused per thread.
    static PHASES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// The Winograd path's scratch (padded input, transforms, products), reused per thread.
    static WINOGRAD: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `Conv`: attributes with defaults applied (empty lists mean "default for the rank").
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct Conv {
    pub auto_pad: AutoPad,
    pub dilations: Vec<usize>,
    pub group: usize,
    /// Empty: taken from the weights.
    pub kernel_shape: Vec<usize>,
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
    /// Fused activation applied to the output (set by the compiler, never by the importer).
    pub activation: Option<Activation>,
    /// Set by the compiler for a 3x3 stride-1 f32 convolution it chose to run as Winograd
    /// F(4x4, 3x3): input 1 then holds the transformed, packed weights
    /// (`kiln_kernels::winograd::pack_weights`, layout `f32/nr32/v1`) instead of W.
    pub winograd: Option<WinogradWeights>,
    /// Set by the compiler (`layout` pass) for a 2-D convolution it runs channels-last: X, the
    /// residual input 3 and Y are `[N, H, W, C]` instead of ONNX's `[N, C, H, W]`. W keeps
    /// its ONNX layout unless `packed` is set.
    pub channels_last: bool,
    /// With `channels_last`: X alone keeps ONNX's `[N, C, H, W]` layout (Y and the residual
    /// are channels-last). Set by the `layout` pass on a convolution of a few-channel input
    /// (an image) that no channels-last producer provides: the packed path gathers the
    /// windows straight from it, instead of a transpose of X followed by an im2col of
    /// `C`-float runs.
    #[serde(default)]
    pub x_channels_first: bool,
    /// Set by the compiler for a channels-last group-1 f32 convolution with constant weights:
    /// input 1 then holds W as the GEMM's B matrix, `[kh*kw*c, m]` with rows in (ky, kx, c)
    /// order, packed in the `f32/nr32/v1` panels.
    pub packed: Option<PackedConvWeights>,
}

/// What a channels-last Conv's packed weights stand for: W of shape `[m, c, kh, kw]`. With
/// group 1, packed GEMM panels (`pack_channels_last`); on a depthwise Conv (group = m, c = 1),
/// the taps in tap-major order `[kh * kw, m]` (`pack_depthwise_taps`).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PackedConvWeights {
    pub m: usize,
    pub c: usize,
    pub kh: usize,
    pub kw: usize,
}

/// What a Winograd Conv's transformed weights stand for: W of shape `[m, c, 3, 3]`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct WinogradWeights {
    pub m: usize,
    pub c: usize,
}

/// Resolved geometry of a convolution call.
pub(super) struct Plan {
    pub kernel: Dims,
    pub strides: Dims,
    pub dilations: Dims,
    pub geoms: smallvec::SmallVec<[DimGeom; 3]>,
}

fn check_kernel(attr: &[usize], w_kernel: &[usize]) -> Result<()> {
    if !attr.is_empty() && attr != w_kernel {
        return Err(OpError::Shape(format!(
            "kernel_shape {attr:?} does not match the weights' {w_kernel:?}"
        )));
    }
    Ok(())
}

impl Plan {
    /// The 2-D window of this plan over an image of `c` channels of `ih x iw`; `None` unless
    /// the plan is 2-D.
    pub(super) fn conv2d(&self, c: usize, ih: usize, iw: usize) -> Option<kiln_kernels::conv::Conv2d> {
        let (gh, gw) = (self.geoms.first()?, self.geoms.get(1)?);
        let at = |v: &[usize], i: usize| v.get(i).copied().unwrap_or(1);
        Some(kiln_kernels::conv::Conv2d {
            c,
            ih,
            iw,
            kh: at(&self.kernel, 0),
            kw: at(&self.kernel, 1),
            sh: at(&self.strides, 0),
            sw: at(&self.strides, 1),
            dh: at(&self.dilations, 0),
            dw: at(&self.dilations, 1),
            ph: gh.pad_begin,
            pw: gw.pad_begin,
            oh: gh.out,
            ow: gw.out,
        })
    }
}

impl Conv {
    pub(super) fn plan(&self, x: &[usize], w: &[usize]) -> Result<Plan> {
        if x.len() < 3 || w.len() != x.len() {
            return Err(OpError::Shape(format!(
                "Conv needs X [N,C,spatial..] and W of the same rank, got {x:?} and {w:?}"
            )));
        }
        let n = x.len() - 2;
        let kernel = Dims::from_slice(w.get(2..).unwrap_or(&[]));
        check_kernel(&self.kernel_shape, &kernel)?;
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let dilations = spatial_attr(&self.dilations, n, 1, "dilations")?;
        let pads = pads_attr(&self.pads, n)?;
        let geoms = (0..n)
            .map(|i| {
                window_geom(
                    x[i + 2],
                    kernel[i],
                    strides[i],
                    dilations[i],
                    pads[i],
                    pads[i + n],
                    self.auto_pad,
                    false,
                )
            })
            .collect::<Result<smallvec::SmallVec<_>>>()?;
        Ok(Plan {
            kernel,
            strides,
            dilations,
            geoms,
        })
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        if self.channels_last {
            return self.eval_channels_last(args);
        }
        if let Some(info) = self.winograd {
            return Ok(smallvec::smallvec![self.eval_winograd(args, info)?.into()]);
        }
        let x = args.tensor(0)?;
        let w = args.tensor(1)?;
        let b = args.opt_tensor(2)?;
        check_float(x, 0)?;
        // The fast f32 kernels apply the activation in their epilogue; other types (and f16,
        // whose product rounds before the activation) apply it after.
        let act = self
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
        let (y, act_done) = float_dispatch!(x.dtype(), 0, conv_run(self, x, w, b, act))?;
        if act_done {
            return Ok(smallvec::smallvec![y.into()]);
        }
        Ok(smallvec::smallvec![
            activation::apply(self.activation.as_ref(), y)?.into()
        ])
    }

    /// The Winograd path (see [`Conv::winograd`]): f32 X `[N, c, H, W]` (or `[N, H, W, c]`
    /// channels-last), the packed weights,
    /// optional bias and residual; 3x3, stride 1, no dilation, group 1 by construction.
    pub(super) fn eval_winograd(&self, args: &Args<'_>, info: WinogradWeights) -> Result<Tensor> {
        use kiln_kernels::sgemm::BLayout;
        use kiln_kernels::winograd::{Winograd, packed_weights_len};
        let x = args.tensor(0)?;
        let u = args.tensor(1)?;
        let b = args.opt_tensor(2)?;
        let r = args.opt_tensor(3)?;
        let WinogradWeights { m, c } = info;
        let (batch, xc, ih, iw) = match (x.shape(), self.channels_last) {
            (&[n, h, w, c], true) => (n, c, h, w),
            (&[n, c, h, w], false) => (n, c, h, w),
            _ => {
                return Err(OpError::Shape(format!(
                    "Winograd Conv needs X of rank 4, got {:?}",
                    x.shape()
                )));
            }
        };
        if xc != c {
            return Err(OpError::Shape(format!(
                "Winograd Conv for {c} input channels got X {:?}",
                x.shape()
            )));
        }
        let layout = BLayout::NR32;
        if packed_weights_len(layout, m, c) != Some(u.len()) {
            return Err(OpError::Shape(format!(
                "Winograd Conv weights hold {} floats, expected {:?} for {m}x{c}x3x3",
                u.len(),
                packed_weights_len(layout, m, c)
            )));
        }
        let pads = pads_attr(&self.pads, 2)?;
        let gh = window_geom(ih, 3, 1, 1, pads[0], pads[2], self.auto_pad, false)?;
        let gw = window_geom(iw, 3, 1, 1, pads[1], pads[3], self.auto_pad, false)?;
        let shape: kiln_tensor::Shape = if self.channels_last {
            kiln_tensor::smallvec::smallvec![batch, gh.out, gw.out, m]
        } else {
            kiln_tensor::smallvec::smallvec![batch, m, gh.out, gw.out]
        };
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        let (xd, ud) = (x.as_slice::<f32>()?, u.as_slice::<f32>()?);
        let bd = f32_bias(b, m)?;
        let g = Winograd {
            c,
            m,
            ih,
            iw,
            oh: gh.out,
            ow: gw.out,
            ph: gh.pad_begin,
            pw: gw.pad_begin,
            channels_last: self.channels_last,
        };
        g.scratch_len()
            .and_then(|n| numel(&[n]).ok())
            .ok_or_else(|| OpError::Shape(format!("Winograd Conv on X {:?} is too large", x.shape())))?;
        let (ip, op) = (c * ih * iw, m * gh.out * gw.out);
        let bad = || OpError::Shape(format!("Winograd Conv: inconsistent shapes X {:?}", x.shape()));
        let rd = f32_residual(r, &shape)?;
        let act = self.activation.map(|a| a.kernel_act());
        let mut scratch = WINOGRAD.with(std::cell::Cell::take);
        for n in 0..batch {
            let xi = xd.get(n * ip..(n + 1) * ip).ok_or_else(bad)?;
            let yi = y.get_mut(n * op..(n + 1) * op).ok_or_else(bad)?;
            let ri = match rd {
                Some(rd) => Some(rd.get(n * op..(n + 1) * op).ok_or_else(bad)?),
                None => None,
            };
            if !g.run(xi, ud, layout, bd, ri, act, yi, &mut scratch) {
                return Err(bad());
            }
        }
        WINOGRAD.with(|cell| cell.set(scratch));
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
        let plain = Conv {
            activation: None,
            ..self.clone()
        };
        let inputs = [args.value(0), args.value(1), args.value(2)];
        let y = plain.eval(&Args::new(&inputs))?;
        let y = match y.first() {
            Some(Value::Tensor(t)) => t,
            _ => return Err(OpError::Value("Conv produced no tensor".into())),
        };
        if y.shape() != r.shape() {
            return Err(OpError::Shape(format!(
                "Conv residual of shape {:?} does not match the output {:?}",
                r.shape(),
                y.shape()
            )));
        }
        let add = crate::elementwise::Binary {
            op: crate::elementwise::BinaryOp::Add,
            legacy_axis: None,
        };
        let sum = add.eval(y, r)?;
        Ok(smallvec::smallvec![
            activation::apply(self.activation.as_ref(), sum)?.into()
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
        let plan = self.plan(xs, ws)?;
        let g = self.group.max(1);
        if c % g != 0 || m % g != 0 || ws[1] * g != c {
            return Err(OpError::Shape(format!(
                "Conv: X {xs:?} and W {ws:?} do not fit group {g}"
            )));
        }
        let Some(geo) = plan.conv2d(c / g, ih, iw) else {
            return Ok(None);
        };
        let (kdim, osz, mg) = (geo.k(), geo.n(), m / g);
        let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![batch, m, geo.oh, geo.ow];
        let rd = f32_residual(residual, &shape)?;
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        if y.is_empty() {
            return Ok(Some(activation::apply(
                self.activation.as_ref(),
                Tensor::from_buf(shape, y)?,
            )?));
        }
        let (xd, wd) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let bd = f32_bias(b, m)?;
        let layout = BLayout::for_isa(kiln_kernels::isa::active());
        let nr = layout.nr();
        // Columns per packed block: its panels take at most 512 KiB (half of Zen 4's L2).
        const BLOCK_FLOATS: usize = 128 * 1024;
        let block = (BLOCK_FLOATS / kdim.max(1) / nr).max(1) * nr;
        numel(&[kdim, block])?;
        let bad = || OpError::Shape(format!("Conv: inconsistent shapes X {xs:?} W {ws:?}"));
        let img = geo.c * ih * iw;
        let mut phases = PHASES.with(std::cell::Cell::take);
        PACKED.with(|cell| -> Result<()> {
            let mut buf = cell.take();
            // Every element is written by the panels below: no clearing needed.
            buf.resize(kdim * block, 0.0);
            for n in 0..batch {
                for gi in 0..g {
                    let start = (n * c + gi * geo.c) * ih * iw;
                    let xg = xd.get(start..start + img).ok_or_else(bad)?;
                    // Strided windows of several taps read the input split into column
                    // phases, where each run of a panel row is one slice copy.
                    let phased = geo.sw > 1 && geo.kh * geo.kw > 1;
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
                            let ok = PACKED_TASK.with(|cell| {
                                let mut pbuf = cell.take();
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
                                let epi = Epilogue { bias, residual, act };
                                ok &= PackedBRef::new(layout, kdim, nb, &pbuf)
                                    .ok()
                                    .and_then(|packed| {
                                        sgemm(mg, AMatrix::row_major(wg, kdim), packed, &mut out, nb, &epi).ok()
                                    })
                                    .is_some();
                                cell.set(pbuf);
                                if let Some(slot) = results.get(bi) {
                                    *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = out;
                                }
                                ok
                            });
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
                        };
                        let yb = yg.get_mut(j0..).ok_or_else(bad)?;
                        sgemm(mg, AMatrix::row_major(wg, kdim), packed, yb, osz, &epi).map_err(|_| bad())?;
                    }
                }
            }
            // Kept for the next call on this thread (grown, never shrunk below this size).
            cell.set(buf);
            Ok(())
        })?;
        PHASES.with(|cell| cell.set(phases));
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
        let plan = self.plan(xs, ws)?;
        let (Some(gh), Some(gw)) = (plan.geoms.first(), plan.geoms.get(1)) else {
            return Ok(None);
        };
        let pair = |v: &[usize]| -> Option<[usize; 2]> { Some([*v.first()?, *v.get(1)?]) };
        let (Some(kernel), Some(strides), Some(dilations)) =
            (pair(&plan.kernel), pair(&plan.strides), pair(&plan.dilations))
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
        let bd = f32_bias(b, c)?;
        let (ip, op) = (c * xs[2] * xs[3], c * gh.out * gw.out);
        for n in 0..xs[0] {
            let (Some(xi), Some(yi)) = (xd.get(n * ip..(n + 1) * ip), y.get_mut(n * op..(n + 1) * op)) else {
                return Ok(None);
            };
            if !dw.run(xi, wd, bd, act, yi) {
                return Err(OpError::Shape(format!("Conv: inconsistent shapes X {xs:?} W {ws:?}")));
            }
        }
        let y = Tensor::from_buf(shape, y)?;
        // Without a fused activation to apply here, the caller's epilogue would run none either.
        Ok(Some(match (act, self.activation.as_ref()) {
            (None, Some(a)) => activation::apply(Some(a), y)?,
            _ => y,
        }))
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        if self.channels_last {
            return self.infer_channels_last(inputs);
        }
        let dtype = util::input_dtype(inputs, 0);
        if let Some(info) = self.winograd {
            // The weights input is the packed transform: the shape W had is in `info`.
            let Some(xs) = input_shape(inputs, 0) else {
                return Ok(vec![util::dtype_only(dtype)]);
            };
            if xs.len() != 4 {
                return Err(OpError::Shape(format!(
                    "Winograd Conv needs X of rank 4, got rank {}",
                    xs.len()
                )));
            }
            let pads = pads_attr(&self.pads, 2)?;
            let mut shape = vec![xs[0].clone(), Dim::Fixed(info.m)];
            shape.extend(window_dims(
                &xs[2..],
                &[3, 3],
                &[1, 1],
                &[1, 1],
                &pads,
                self.auto_pad,
                false,
            )?);
            return Ok(vec![tensor_type(dtype, Some(shape))]);
        }
        let (Some(xs), Some(ws)) = (input_shape(inputs, 0), input_shape(inputs, 1)) else {
            return Ok(vec![util::dtype_only(dtype)]);
        };
        if xs.len() < 3 || ws.len() != xs.len() {
            return Err(OpError::Shape(format!(
                "Conv needs X and W of the same rank >= 3, got ranks {} and {}",
                xs.len(),
                ws.len()
            )));
        }
        let n = xs.len() - 2;
        let kernel: Option<Vec<usize>> = if self.kernel_shape.is_empty() {
            ws[2..]
                .iter()
                .map(|d| if let Dim::Fixed(v) = d { Some(*v) } else { None })
                .collect()
        } else {
            Some(self.kernel_shape.clone())
        };
        let Some(kernel) = kernel else {
            return Ok(vec![tensor_type(dtype, None)]);
        };
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let dilations = spatial_attr(&self.dilations, n, 1, "dilations")?;
        let pads = pads_attr(&self.pads, n)?;
        let mut shape = vec![xs[0].clone(), ws[0].clone()];
        shape.extend(window_dims(
            &xs[2..],
            &kernel,
            &strides,
            &dilations,
            &pads,
            self.auto_pad,
            false,
        )?);
        Ok(vec![tensor_type(dtype, Some(shape))])
    }
}

/// The optional f32 residual input's elements, checked against the output's shape.
pub(super) fn f32_residual<'a>(r: Option<&'a Tensor>, shape: &[usize]) -> Result<Option<&'a [f32]>> {
    match r {
        Some(r) if r.shape() != shape => Err(OpError::Shape(format!(
            "Conv residual of shape {:?} does not match the output {shape:?}",
            r.shape()
        ))),
        Some(r) => Ok(Some(r.as_slice::<f32>()?)),
        None => Ok(None),
    }
}

/// The optional f32 bias of `m` output channels, checked for length.
pub(super) fn f32_bias(b: Option<&Tensor>, m: usize) -> Result<Option<&[f32]>> {
    match b {
        Some(b) if b.len() != m => Err(OpError::Shape(format!(
            "bias has {} elements for {m} output channels",
            b.len()
        ))),
        Some(b) => Ok(Some(b.as_slice::<f32>()?)),
        None => Ok(None),
    }
}

/// Reads the optional bias of `m` channels.
fn bias<T: Real>(b: Option<&Tensor>, m: usize, index: usize) -> Result<Option<Vec<T>>> {
    let Some(b) = b else { return Ok(None) };
    if b.len() != m {
        return Err(OpError::Shape(format!(
            "bias has {} elements for {m} output channels",
            b.len()
        )));
    }
    Ok(Some(floats::<T>(b, index)?.into_owned()))
}

/// Adds `bias[c]` to every element of each `[plane]`-sized output plane of channel `c`
/// (planes are laid out batch-major, channel-minor).
fn add_channel_bias<T: Real>(y: &mut [T], bias: Option<&[T]>, plane: usize) {
    let Some(bias) = bias.filter(|b| !b.is_empty()) else {
        return;
    };
    for (i, chunk) in y.chunks_mut(plane.max(1)).enumerate() {
        let bv = bias[i % bias.len()];
        chunk.iter_mut().for_each(|v| *v += bv);
    }
}

/// The convolution, and whether `act` was applied (by the fast kernels' epilogue).
fn conv_run<T: Real>(
    op: &Conv,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    act: Option<kiln_kernels::sgemm::Act>,
) -> Result<(Tensor, bool)> {
    let (xs, ws) = (x.shape(), w.shape());
    let plan = op.plan(xs, ws)?;
    let (batch, c) = (xs[0], xs[1]);
    let m = ws[0];
    let g = op.group.max(1);
    if c % g != 0 || m % g != 0 || ws[1] * g != c {
        return Err(OpError::Shape(format!(
            "Conv: X {xs:?} and W {ws:?} do not fit group {g}"
        )));
    }
    let (cg, mg) = (c / g, m / g);
    let image: Vec<usize> = xs[2..].to_vec();
    let grid: Vec<usize> = plan.geoms.iter().map(|d| d.out).collect();
    let pad_begin: Vec<usize> = plan.geoms.iter().map(|d| d.pad_begin).collect();
    let img_sz = numel(&image)?;
    let osz = numel(&grid)?;
    let ksz = numel(&plan.kernel)?;
    let mut yshape = vec![batch, m];
    yshape.extend(&grid);
    let total = numel(&yshape)?;
    let xd = floats::<T>(x, 0)?;
    let wd = floats::<T>(w, 1)?;
    let bd = bias::<T>(b, m, 2)?;
    let mut y = vec![T::zero(); total];
    let pointwise = plan.kernel.iter().all(|&k| k == 1)
        && plan.strides.iter().all(|&s| s == 1)
        && pad_begin.iter().all(|&p| p == 0)
        && grid == image;
    let kdim = cg * ksz;
    let mut col = if pointwise {
        Vec::new()
    } else {
        vec![T::zero(); numel(&[kdim, osz])?]
    };
    let geom = ConvGeometry {
        image: &image,
        kernel: &plan.kernel,
        grid: &grid,
        strides: &plan.strides,
        dilations: &plan.dilations,
        pad_begin: &pad_begin,
    };
    let bad = || OpError::Shape(format!("Conv: inconsistent shapes X {xs:?} W {ws:?}"));
    // The bias is added by the fast kernels' epilogue when they run, else after the loop.
    let mut fast_done = false;
    for n in 0..batch {
        for gi in 0..g {
            let xg = &xd[(n * c + gi * cg) * img_sz..(n * c + (gi + 1) * cg) * img_sz];
            let colref: &[T] = if pointwise {
                xg
            } else {
                if !im2col(&geom, cg, xg, &mut col) {
                    return Err(bad());
                }
                &col
            };
            let wg = &wd[gi * mg * kdim..(gi + 1) * mg * kdim];
            let yg = &mut y[(n * m + gi * mg) * osz..(n * m + (gi + 1) * mg) * osz];
            let bias_g = bd.as_deref().and_then(|b| b.get(gi * mg..(gi + 1) * mg));
            match T::fast_gemm(
                mg,
                osz,
                kdim,
                wg,
                MatLayout::row_major(kdim),
                colref,
                MatLayout::row_major(osz),
                yg,
                FastEpilogue {
                    row_bias: bias_g,
                    col_bias: None,
                    act,
                },
            ) {
                Some(true) => {
                    fast_done = true;
                    continue;
                }
                Some(false) => return Err(bad()),
                None => {}
            }
            if !gemm(
                mg,
                osz,
                kdim,
                wg,
                MatLayout::row_major(kdim),
                colref,
                MatLayout::row_major(osz),
                yg,
            ) {
                return Err(bad());
            }
        }
    }
    if !fast_done {
        add_channel_bias(&mut y, bd.as_deref(), osz);
    }
    // An empty output (no image or no group) ran no kernel: the activation is still due.
    Ok((from_floats(x.dtype(), yshape, y)?, fast_done && act.is_some()))
}

/// `ConvTranspose`: attributes with defaults applied.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct ConvTranspose {
    pub auto_pad: AutoPad,
    pub dilations: Vec<usize>,
    pub group: usize,
    pub kernel_shape: Vec<usize>,
    pub output_padding: Vec<usize>,
    /// Spatial output shape (the attribute may also list N and C; the importer keeps the
    /// trailing spatial dims only when it has rank+2 entries — see `plan`).
    pub output_shape: Vec<usize>,
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

impl ConvTranspose {
    /// Output spatial dims and leading pads for input spatial dims `x` and kernel `kernel`.
    fn geometry(&self, x: &[usize], kernel: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
        let n = x.len();
        check_kernel(&self.kernel_shape, kernel)?;
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let dilations = spatial_attr(&self.dilations, n, 1, "dilations")?;
        let out_pad = spatial_attr(&self.output_padding, n, 0, "output_padding")?;
        let explicit_out: Option<Vec<usize>> = match self.output_shape.len() {
            0 => None,
            l if l == n => Some(self.output_shape.clone()),
            l if l == n + 2 => Some(self.output_shape[2..].to_vec()),
            l => {
                return Err(OpError::Value(format!(
                    "output_shape has {l} values for {n} spatial dims"
                )));
            }
        };
        let same = matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower);
        let mut out = Vec::with_capacity(n);
        let mut pad_begin = Vec::with_capacity(n);
        for i in 0..n {
            if strides[i] == 0 || dilations[i] == 0 {
                return Err(OpError::Value("strides and dilations must be positive".into()));
            }
            let full = strides[i] * x[i].saturating_sub(1) + out_pad[i] + (kernel[i].max(1) - 1) * dilations[i] + 1;
            let target = match &explicit_out {
                Some(o) => Some(o[i]),
                None if same => Some(x[i] * strides[i]),
                None => None,
            };
            match target {
                Some(t) => {
                    // Total padding may be negative (the output extends past the full size);
                    // the split floors as the spec's integer division does.
                    let total = full as i64 - t as i64;
                    let half = total.div_euclid(2);
                    let pb = if self.auto_pad == AutoPad::SameUpper {
                        half
                    } else {
                        total - half
                    };
                    let pb = usize::try_from(pb).map_err(|_| {
                        OpError::Unsupported(format!("ConvTranspose output size {t} needs a negative leading pad"))
                    })?;
                    out.push(t);
                    pad_begin.push(pb);
                }
                None => {
                    let pads = pads_attr(&self.pads, n)?;
                    let o = full.checked_sub(pads[i] + pads[i + n]).ok_or_else(|| {
                        OpError::Shape(format!(
                            "ConvTranspose pads {:?} exceed the full size {full}",
                            self.pads
                        ))
                    })?;
                    out.push(o);
                    pad_begin.push(pads[i]);
                }
            }
        }
        Ok((out, pad_begin))
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let w = args.tensor(1)?;
        let b = args.opt_tensor(2)?;
        check_float(x, 0)?;
        let y = float_dispatch!(x.dtype(), 0, conv_transpose_run(self, x, w, b))?;
        Ok(smallvec::smallvec![y.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let (Some(xs), Some(ws)) = (input_shape(inputs, 0), input_shape(inputs, 1)) else {
            return Ok(vec![util::dtype_only(dtype)]);
        };
        if xs.len() < 3 || ws.len() != xs.len() {
            return Err(OpError::Shape(
                "ConvTranspose needs X and W of the same rank >= 3".into(),
            ));
        }
        let fixed = |s: &[Dim]| -> Option<Vec<usize>> {
            s.iter()
                .map(|d| if let Dim::Fixed(v) = d { Some(*v) } else { None })
                .collect()
        };
        let g = self.group.max(1);
        let m = match &ws[1] {
            Dim::Fixed(v) => Dim::Fixed(v * g),
            d if g == 1 => d.clone(),
            _ => return Ok(vec![tensor_type(dtype, None)]),
        };
        let spatial = match (fixed(&xs[2..]), fixed(&ws[2..])) {
            (Some(x), Some(k)) => self.geometry(&x, &k)?.0.into_iter().map(Dim::Fixed).collect(),
            _ => return Ok(vec![util::dtype_only(dtype)]),
        };
        let mut shape = vec![xs[0].clone(), m];
        shape.extend::<Vec<Dim>>(spatial);
        Ok(vec![tensor_type(dtype, Some(shape))])
    }
}

fn conv_transpose_run<T: Real>(op: &ConvTranspose, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(OpError::Shape(format!(
            "ConvTranspose needs X [N,C,..] and W of the same rank, got {xs:?} {ws:?}"
        )));
    }
    let g = op.group.max(1);
    let (batch, c) = (xs[0], xs[1]);
    if ws[0] != c || c % g != 0 {
        return Err(OpError::Shape(format!(
            "ConvTranspose: X {xs:?} and W {ws:?} do not fit group {g}"
        )));
    }
    let (cg, mg) = (c / g, ws[1]);
    let m = mg * g;
    let kernel = ws[2..].to_vec();
    let n = xs.len() - 2;
    let (out, pad_begin) = op.geometry(&xs[2..], &kernel)?;
    let strides = spatial_attr(&op.strides, n, 1, "strides")?;
    let dilations = spatial_attr(&op.dilations, n, 1, "dilations")?;
    let isz = numel(&xs[2..])?;
    let osz = numel(&out)?;
    let ksz = numel(&kernel)?;
    let mut yshape = vec![batch, m];
    yshape.extend(&out);
    let mut y = vec![T::zero(); numel(&yshape)?];
    let xd = floats::<T>(x, 0)?;
    let wd = floats::<T>(w, 1)?;
    let bd = bias::<T>(b, m, 2)?;
    let rows = mg * ksz;
    let mut col = vec![T::zero(); numel(&[rows, isz])?];
    let geom = ConvGeometry {
        image: &out,
        kernel: &kernel,
        grid: &xs[2..],
        strides: &strides,
        dilations: &dilations,
        pad_begin: &pad_begin,
    };
    let bad = || OpError::Shape(format!("ConvTranspose: inconsistent shapes X {xs:?} W {ws:?}"));
    for bn in 0..batch {
        for gi in 0..g {
            let xg = &xd[(bn * c + gi * cg) * isz..(bn * c + (gi + 1) * cg) * isz];
            let wg = &wd[gi * cg * rows..(gi + 1) * cg * rows];
            // col[rows, isz] = Wg^T [rows, cg] x Xg [cg, isz]
            if !gemm(
                rows,
                isz,
                cg,
                wg,
                MatLayout::transposed(rows),
                xg,
                MatLayout::row_major(isz),
                &mut col,
            ) {
                return Err(bad());
            }
            let yg = &mut y[(bn * m + gi * mg) * osz..(bn * m + (gi + 1) * mg) * osz];
            if !col2im_add(&geom, mg, &col, yg) {
                return Err(bad());
            }
        }
    }
    add_channel_bias(&mut y, bd.as_deref(), osz);
    from_floats(x.dtype(), yshape, y)
}

/// `DeformConv` (2-D): attributes with defaults applied.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct DeformConv {
    pub dilations: Vec<usize>,
    pub group: usize,
    pub kernel_shape: Vec<usize>,
    pub offset_group: usize,
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

impl DeformConv {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        check_float(x, 0)?;
        let y = float_dispatch!(x.dtype(), 0, deform_run(self, args))?;
        Ok(smallvec::smallvec![y.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        match (input_shape(inputs, 0), input_shape(inputs, 1), input_shape(inputs, 2)) {
            (Some(xs), Some(ws), Some(os)) if xs.len() >= 3 && ws.len() == xs.len() && os.len() == xs.len() => {
                let mut shape = vec![xs[0].clone(), ws[0].clone()];
                shape.extend(os[2..].iter().cloned());
                Ok(vec![tensor_type(dtype, Some(shape))])
            }
            _ => Ok(vec![util::dtype_only(dtype)]),
        }
    }
}

/// Bilinear sample of a `[h, w]` plane at (y, x), zero outside (each corner separately).
fn bilinear_zero<T: Real>(plane: &[T], h: usize, w: usize, y: f64, x: f64) -> f64 {
    let (y0, x0) = (y.floor(), x.floor());
    let (dy, dx) = (y - y0, x - x0);
    let mut acc = 0.0;
    for (yy, wy) in [(y0, 1.0 - dy), (y0 + 1.0, dy)] {
        if wy == 0.0 || yy < 0.0 || yy >= h as f64 {
            continue;
        }
        for (xx, wx) in [(x0, 1.0 - dx), (x0 + 1.0, dx)] {
            if wx == 0.0 || xx < 0.0 || xx >= w as f64 {
                continue;
            }
            acc += wy * wx * plane[yy as usize * w + xx as usize].to_f64();
        }
    }
    acc
}

fn deform_run<T: Real>(op: &DeformConv, args: &Args<'_>) -> Result<Tensor> {
    let x = args.tensor(0)?;
    let w = args.tensor(1)?;
    let off = args.tensor(2)?;
    let b = args.opt_tensor(3)?;
    let mask = args.opt_tensor(4)?;
    let (xs, ws, os) = (x.shape(), w.shape(), off.shape());
    if xs.len() != 4 || ws.len() != 4 || os.len() != 4 {
        return Err(OpError::Unsupported(format!(
            "DeformConv is implemented for 2-D inputs, got X {xs:?}"
        )));
    }
    let (batch, c, ih, iw) = (xs[0], xs[1], xs[2], xs[3]);
    let (m, kh, kw) = (ws[0], ws[2], ws[3]);
    check_kernel(&op.kernel_shape, &ws[2..])?;
    let g = op.group.max(1);
    let og = op.offset_group.max(1);
    if c % g != 0 || m % g != 0 || ws[1] * g != c || c % og != 0 {
        return Err(OpError::Shape(format!(
            "DeformConv: X {xs:?}, W {ws:?} do not fit group {g} / offset_group {og}"
        )));
    }
    let (oh, ow) = (os[2], os[3]);
    let ksz = kh * kw;
    if os[0] != batch || os[1] != og * 2 * ksz {
        return Err(OpError::Shape(format!(
            "DeformConv: offset shape {os:?} does not fit X {xs:?} and kernel {kh}x{kw}"
        )));
    }
    let strides = spatial_attr(&op.strides, 2, 1, "strides")?;
    let dil = spatial_attr(&op.dilations, 2, 1, "dilations")?;
    let pads = pads_attr(&op.pads, 2)?;
    let xd = floats::<T>(x, 0)?;
    let wd = floats::<T>(w, 1)?;
    let od = floats::<T>(off, 2)?;
    let bd = bias::<T>(b, m, 3)?;
    let md = match mask {
        Some(mt) => {
            if mt.shape() != [batch, og * ksz, oh, ow] {
                return Err(OpError::Shape(format!(
                    "DeformConv: mask shape {:?} does not fit",
                    mt.shape()
                )));
            }
            Some(floats::<T>(mt, 4)?)
        }
        None => None,
    };
    let (cg, mg) = (c / g, m / g);
    let osz = oh * ow;
    let kdim = cg * ksz;
    let cpo = c / og;
    let mut yshape = vec![batch, m, oh, ow];
    let mut y = vec![T::zero(); numel(&yshape)?];
    let mut col = vec![T::zero(); numel(&[c * ksz, osz])?];
    for n in 0..batch {
        // Sample every (channel, kernel tap, output point).
        for ch in 0..c {
            let ogi = ch / cpo;
            let plane = &xd[(n * c + ch) * ih * iw..(n * c + ch + 1) * ih * iw];
            for ki in 0..kh {
                for kj in 0..kw {
                    let tap = ki * kw + kj;
                    let row = (ch * ksz + tap) * osz;
                    let offh = ((n * og + ogi) * 2 * ksz + 2 * tap) * osz;
                    let offw = offh + osz;
                    for i in 0..oh {
                        for j in 0..ow {
                            let p = i * ow + j;
                            let yy =
                                (i * strides[0]) as f64 - pads[0] as f64 + (ki * dil[0]) as f64 + od[offh + p].to_f64();
                            let xx =
                                (j * strides[1]) as f64 - pads[1] as f64 + (kj * dil[1]) as f64 + od[offw + p].to_f64();
                            let mut v = bilinear_zero(plane, ih, iw, yy, xx);
                            if let Some(md) = &md {
                                v *= md[((n * og + ogi) * ksz + tap) * osz + p].to_f64();
                            }
                            col[row + p] = T::from_f64(v);
                        }
                    }
                }
            }
        }
        for gi in 0..g {
            let wg = &wd[gi * mg * kdim..(gi + 1) * mg * kdim];
            let cgi = &col[gi * kdim * osz..(gi + 1) * kdim * osz];
            let yg = &mut y[(n * m + gi * mg) * osz..(n * m + (gi + 1) * mg) * osz];
            if !gemm(
                mg,
                osz,
                kdim,
                wg,
                MatLayout::row_major(kdim),
                cgi,
                MatLayout::row_major(osz),
                yg,
            ) {
                return Err(OpError::Shape("DeformConv: inconsistent shapes".into()));
            }
        }
    }
    add_channel_bias(&mut y, bd.as_deref(), osz);
    from_floats(x.dtype(), std::mem::take(&mut yshape), y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: &Conv, x: Tensor, w: Tensor, b: Option<Tensor>) -> Tensor {
        let xv = Value::Tensor(x);
        let wv = Value::Tensor(w);
        let bv = b.map(Value::Tensor);
        let ins = [Some(&xv), Some(&wv), bv.as_ref()];
        let out = op.eval(&Args::new(&ins)).unwrap();
        out[0].as_tensor().unwrap().clone()
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
                t32(xs.clone(), &x),
                t32(ws.clone(), &w),
                bias.then(|| t32(vec![c], &b)),
            );
            let slow = run(&op, t64(xs, &x), t64(ws, &w), bias.then(|| t64(vec![c], &b)));
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
    fn conv_3x3_with_padding_matches_hand_sums() {
        // The ONNX "basic_conv_with_padding" case: 5x5 ramp 0..24, 3x3 ones, pad 1.
        let x = Tensor::from_vec(vec![1, 1, 5, 5], (0..25).map(|v| v as f32).collect::<Vec<_>>()).unwrap();
        let w = Tensor::from_vec(vec![1, 1, 3, 3], vec![1.0f32; 9]).unwrap();
        let op = Conv {
            pads: vec![1, 1, 1, 1],
            group: 1,
            ..Default::default()
        };
        let y = run(&op, x, w, Some(Tensor::from_vec(vec![1], vec![1.0f32]).unwrap()));
        assert_eq!(y.shape(), &[1, 1, 5, 5]);
        let v = y.as_slice::<f32>().unwrap();
        // Corner (0,0): 0+1+5+6 = 12 (+1 bias); centre (1,1): sum 0..2,5..7,10..12 = 54 (+1).
        assert_eq!(v[0], 13.0);
        assert_eq!(v[6], 55.0);
    }

    #[test]
    fn conv_transpose_stride_2_spreads_values() {
        // 1x1x2 input [1, 2], kernel [1, 1, 1] stride 2 → [1, 1, 3, 2, 2] (length (2-1)*2+3=5).
        let x = Tensor::from_vec(vec![1, 1, 2], vec![1.0f32, 2.0]).unwrap();
        let w = Tensor::from_vec(vec![1, 1, 3], vec![1.0f32, 1.0, 1.0]).unwrap();
        let op = ConvTranspose {
            strides: vec![2],
            group: 1,
            ..Default::default()
        };
        let xv = Value::Tensor(x);
        let wv = Value::Tensor(w);
        let ins = [Some(&xv), Some(&wv)];
        let y = op.eval(&Args::new(&ins)).unwrap();
        assert_eq!(
            y[0].as_tensor().unwrap().as_slice::<f32>().unwrap(),
            &[1.0, 1.0, 3.0, 2.0, 2.0]
        );
    }

    /// The f32 2-D path split over threads (column blocks per thread, strided and not, with
    /// bias, residual and activation) computes exactly what one thread does.
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
            let op = Conv {
                group: 1,
                pads: vec![1, 1, 1, 1],
                strides: vec![stride, stride],
                activation: Some(Activation::Relu),
                ..Default::default()
            };
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
