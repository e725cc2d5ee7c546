//! Convolutions: `Conv` (opset 1–22), `ConvTranspose` (opset 1–22) and `DeformConv`
//! (opset 19–22), per <https://onnx.ai/onnx/operators/onnx__Conv.html>,
//! <https://onnx.ai/onnx/operators/onnx__ConvTranspose.html> and
//! <https://onnx.ai/onnx/operators/onnx__DeformConv.html>.
//!
//! Conv lowers to im2col + GEMM per (image, group); ConvTranspose to GEMM + col2im.

use super::{
    AutoPad, DimGeom, Dims, FastEpilogue, Real, check_float, float_dispatch, floats, from_floats, input_shape, numel,
    pads_attr, spatial_attr, tensor_type, window_dims, window_geom,
};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, ValueType};
use kiln_kernels::conv::{ConvGeometry, col2im_add, im2col};
use kiln_kernels::gemm::{MatLayout, gemm};
use kiln_tensor::Tensor;

/// `Conv`: attributes with defaults applied (empty lists mean "default for the rank"). How the
/// compiler chose to run one (layout, kernel, packed weights, a fused activation) is its
/// [`crate::fast::ConvPlan`], kept beside the op.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
pub struct Conv {
    pub auto_pad: AutoPad,
    pub dilations: Vec<usize>,
    pub group: usize,
    /// Empty: taken from the weights.
    pub kernel_shape: Vec<usize>,
    pub pads: Vec<usize>,
    pub strides: Vec<usize>,
}

/// Resolved geometry of a convolution call.
pub(crate) struct Window {
    pub kernel: Dims,
    pub strides: Dims,
    pub dilations: Dims,
    pub geoms: smallvec::SmallVec<[DimGeom; 3]>,
}

fn check_kernel(attr: &[usize], w_kernel: &[usize]) -> Result<()> {
    if !attr.is_empty() && attr != w_kernel {
        return Err(OpError::attribute(
            "kernel_shape",
            format!("W's window {w_kernel:?}"),
            format!("{attr:?}"),
        ));
    }
    Ok(())
}

/// X (input 0) of rank below 3, or W (input 1) of another rank.
fn ranks(x: &[usize], w: &[usize]) -> Result<()> {
    if x.len() < 3 {
        return Err(OpError::input_shape(0, "[N, C, spatial...]", x));
    }
    if w.len() != x.len() {
        return Err(OpError::inputs(0, 1, "X and W of the same rank", x, w));
    }
    Ok(())
}

/// [`ranks`] at inference: `Ok(false)` when the ranks do not fit but a shape holds symbols
/// (evaluation names it then).
fn static_ranks(x: &[Dim], w: &[Dim]) -> Result<bool> {
    if x.len() >= 3 && w.len() == x.len() {
        return Ok(true);
    }
    match (util::fixed(x), util::fixed(w)) {
        (Some(x), Some(w)) => ranks(&x, &w).map(|()| true),
        _ => Ok(false),
    }
}

impl Window {
    /// The 2-D window over an image of `c` channels of `ih x iw`; `None` unless
    /// the window is 2-D.
    pub(crate) fn conv2d(&self, c: usize, ih: usize, iw: usize) -> Option<kiln_kernels::conv::Conv2d> {
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
    /// The window geometry of this convolution on X of shape `x` and W of shape `w`.
    pub(crate) fn window(&self, x: &[usize], w: &[usize]) -> Result<Window> {
        ranks(x, w)?;
        let n = x.len() - 2;
        let kernel = Dims::from_slice(w.get(2..).unwrap_or(&[]));
        check_kernel(&self.kernel_shape, &kernel)?;
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let dilations = spatial_attr(&self.dilations, n, 1, "dilations")?;
        let pads = pads_attr(&self.pads, n)?;
        let geoms = (0..n)
            .map(|i| {
                window_geom(
                    x,
                    i + 2,
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
        Ok(Window {
            kernel,
            strides,
            dilations,
            geoms,
        })
    }

    /// The reference semantics (<https://onnx.ai/onnx/operators/onnx__Conv.html>): im2col and
    /// a GEMM per (image, group), channels-first, in f32 (f64 for f64 inputs). The planned and
    /// fast paths live in `crate::fast::conv`.
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let w = args.tensor(1)?;
        let b = args.opt_tensor(2)?;
        check_float(x, 0)?;
        let (y, _) = float_dispatch!(x.dtype(), 0, conv_run(self, x, w, b, None))?;
        Ok(smallvec::smallvec![y.into()])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let (Some(xs), Some(ws)) = (input_shape(inputs, 0), input_shape(inputs, 1)) else {
            return Ok(vec![util::dtype_only(dtype)]);
        };
        if !static_ranks(&xs, &ws)? {
            return Ok(vec![util::dtype_only(dtype)]);
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
            &xs,
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

/// Reads the optional bias of `m` channels.
fn bias<T: Real>(b: Option<&Tensor>, m: usize, index: usize) -> Result<Option<Vec<T>>> {
    let Some(b) = b else { return Ok(None) };
    if b.len() != m {
        return Err(OpError::input_shape(
            index,
            format!("{m} elements, one per output channel"),
            b.shape(),
        ));
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
pub(crate) fn conv_run<T: Real>(
    op: &Conv,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    act: Option<kiln_kernels::sgemm::Act>,
) -> Result<(Tensor, bool)> {
    let (xs, ws) = (x.shape(), w.shape());
    let window = op.window(xs, ws)?;
    let (batch, c) = (xs[0], xs[1]);
    let m = ws[0];
    let g = op.group.max(1);
    if c % g != 0 || m % g != 0 || ws[1] * g != c {
        return Err(OpError::inputs(0, 1, format!("X and W that fit group {g}"), xs, ws));
    }
    let (cg, mg) = (c / g, m / g);
    let image: Vec<usize> = xs[2..].to_vec();
    let grid: Vec<usize> = window.geoms.iter().map(|d| d.out).collect();
    let pad_begin: Vec<usize> = window.geoms.iter().map(|d| d.pad_begin).collect();
    let img_sz = numel(&image)?;
    let osz = numel(&grid)?;
    let ksz = numel(&window.kernel)?;
    let mut yshape = vec![batch, m];
    yshape.extend(&grid);
    let total = numel(&yshape)?;
    let xd = floats::<T>(x, 0)?;
    let wd = floats::<T>(w, 1)?;
    let bd = bias::<T>(b, m, 2)?;
    let mut y = vec![T::zero(); total];
    let pointwise = window.kernel.iter().all(|&k| k == 1)
        && window.strides.iter().all(|&s| s == 1)
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
        kernel: &window.kernel,
        grid: &grid,
        strides: &window.strides,
        dilations: &window.dilations,
        pad_begin: &pad_begin,
    };
    let bad = || OpError::inputs(0, 1, "X and W that fit the Conv", xs, ws);
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
    pub(crate) fn geometry(&self, x: &[usize], kernel: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
        let n = x.len();
        check_kernel(&self.kernel_shape, kernel)?;
        let strides = spatial_attr(&self.strides, n, 1, "strides")?;
        let dilations = spatial_attr(&self.dilations, n, 1, "dilations")?;
        let out_pad = spatial_attr(&self.output_padding, n, 0, "output_padding")?;
        let explicit_out: Option<Vec<usize>> = match self.output_shape.len() {
            0 => None,
            l if l == n => Some(self.output_shape.clone()),
            l if l == n + 2 => Some(self.output_shape[2..].to_vec()),
            _ => {
                return Err(OpError::attribute(
                    "output_shape",
                    format!("{n} values (one per spatial axis) or {}", n + 2),
                    format!("{:?}", self.output_shape),
                ));
            }
        };
        let same = matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower);
        let mut out = Vec::with_capacity(n);
        let mut pad_begin = Vec::with_capacity(n);
        for i in 0..n {
            for (attr, v) in [("strides", &strides), ("dilations", &dilations)] {
                if v[i] == 0 {
                    return Err(OpError::attribute(attr, "every value >= 1", format!("{v:?}")));
                }
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
                        OpError::attribute(
                            "pads",
                            format!("at most {full} in all on spatial axis {i}, the full output"),
                            format!("{:?}", self.pads),
                        )
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
        if !static_ranks(&xs, &ws)? {
            return Ok(vec![util::dtype_only(dtype)]);
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
    ranks(xs, ws)?;
    let g = op.group.max(1);
    let (batch, c) = (xs[0], xs[1]);
    if ws[0] != c || c % g != 0 {
        return Err(OpError::inputs(
            0,
            1,
            format!("W's dim 0 equal to X's channels, divisible by group {g}"),
            xs,
            ws,
        ));
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
    let bad = || OpError::inputs(0, 1, "X and W that fit the ConvTranspose", xs, ws);
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
        return Err(OpError::inputs(
            0,
            1,
            format!("X and W that fit group {g} and offset_group {og}"),
            xs,
            ws,
        ));
    }
    let (oh, ow) = (os[2], os[3]);
    let ksz = kh * kw;
    if os[0] != batch || os[1] != og * 2 * ksz {
        return Err(OpError::input_shape(
            2,
            format!(
                "[{batch}, {}, out H, out W] (offset_group x 2 x {kh}x{kw} taps)",
                og * 2 * ksz
            ),
            os,
        ));
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
                return Err(OpError::input_shape(
                    4,
                    format!("{:?}", [batch, og * ksz, oh, ow]),
                    mt.shape(),
                ));
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
                return Err(OpError::inputs(0, 1, "X and W that fit the DeformConv", xs, ws));
            }
        }
    }
    add_channel_bias(&mut y, bd.as_deref(), osz);
    from_floats(x.dtype(), std::mem::take(&mut yshape), y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn run(op: &Conv, x: Tensor, w: Tensor, b: Option<Tensor>) -> Tensor {
        let xv = Value::Tensor(x);
        let wv = Value::Tensor(w);
        let bv = b.map(Value::Tensor);
        let ins = [Some(&xv), Some(&wv), bv.as_ref()];
        let out = op.eval(&Args::new(&ins)).unwrap();
        out[0].as_tensor().unwrap().clone()
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
}
