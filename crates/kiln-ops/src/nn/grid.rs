//! Spatial sampling: `GridSample` (opset 16, 20, 22; N-d), `AffineGrid` (opset 20) and
//! `RoiAlign` (opset 10, 16), per <https://onnx.ai/onnx/operators/onnx__GridSample.html>,
//! <https://onnx.ai/onnx/operators/onnx__AffineGrid.html> and
//! <https://onnx.ai/onnx/operators/onnx__RoiAlign.html>.

use super::{check_float, from_f64s, input_shape, numel, tensor_type};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, Value, ValueType};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum GridSampleMode {
    /// `bilinear` (opset 16) / `linear`.
    Linear,
    Nearest,
    /// `bicubic` (opset 16) / `cubic`.
    Cubic,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum GridSamplePadding {
    Zeros,
    Border,
    Reflection,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct GridSample {
    pub align_corners: bool,
    pub mode: GridSampleMode,
    pub padding: GridSamplePadding,
}

/// Reflects `x` into `[lo, hi]` by bouncing off the nearer border (PyTorch's rule).
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if rng <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n as i64 % 2 == 0 { lo + r } else { hi - r }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n as i64 % 2 == 0 { hi - r } else { lo + r }
    } else {
        x
    }
}

fn cubic_coeffs(t: f64) -> [f64; 4] {
    let a = -0.75;
    let c = |x: f64| {
        let x = x.abs();
        if x <= 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
        } else {
            0.0
        }
    };
    [c(t + 1.0), c(t), c(1.0 - t), c(2.0 - t)]
}

impl GridSample {
    /// Index of pixel `i` along a dim of size `d` under the padding mode; `None` reads zero.
    fn pixel(&self, i: i64, d: usize, lo: f64, hi: f64) -> Option<usize> {
        let last = d as i64 - 1;
        match self.padding {
            GridSamplePadding::Zeros => (i >= 0 && i <= last).then_some(i as usize),
            GridSamplePadding::Border => Some(i.clamp(0, last.max(0)) as usize),
            GridSamplePadding::Reflection => Some((reflect(i as f64, lo, hi) as i64).clamp(0, last.max(0)) as usize),
        }
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let grid = args.tensor(1)?;
        check_float(grid, 1)?;
        if x.dtype().is_byte_coded() || !(x.dtype().is_float() || x.dtype().is_int()) {
            return Err(OpError::UnsupportedDType {
                index: 0,
                got: x.dtype(),
            });
        }
        let (xs, gs) = (x.shape(), grid.shape());
        if xs.len() < 3 {
            return Err(OpError::input_shape(0, "[N, C, spatial...]", xs));
        }
        if gs.len() != xs.len() || gs[0] != xs[0] || gs[gs.len() - 1] != xs.len() - 2 {
            return Err(OpError::inputs(
                0,
                1,
                format!("a grid [{}, out spatial..., {}] for X", xs[0], xs.len() - 2),
                xs,
                gs,
            ));
        }
        let nd = xs.len() - 2;
        let dims = &xs[2..];
        let (batch, chans) = (xs[0], xs[1]);
        let out_sp = &gs[1..gs.len() - 1];
        let npts = numel(out_sp)?;
        let isz = numel(dims)?;
        let mut yshape = vec![batch, chans];
        yshape.extend(out_sp);
        let total = numel(&yshape)?;
        let xd = x.to_f64_vec();
        let gd = grid.to_f64_vec();
        let strides = kiln_tensor::strides_of(dims);
        let (lo, hi): (Vec<f64>, Vec<f64>) = dims
            .iter()
            .map(|&d| {
                if self.align_corners {
                    (0.0, d as f64 - 1.0)
                } else {
                    (-0.5, d as f64 - 0.5)
                }
            })
            .unzip();
        let mut y = vec![0.0f64; total];
        // Per point: taps per dim (pixel index or None, weight).
        let mut taps: Vec<Vec<(Option<usize>, f64)>> = vec![Vec::new(); nd];
        for n in 0..batch {
            for p in 0..npts {
                let g = &gd[(n * npts + p) * nd..(n * npts + p + 1) * nd];
                for i in 0..nd {
                    // Grid holds coordinates innermost-dim first.
                    let v = g[nd - 1 - i];
                    let d = dims[i] as f64;
                    let mut c = if self.align_corners {
                        (v + 1.0) / 2.0 * (d - 1.0)
                    } else {
                        ((v + 1.0) * d - 1.0) / 2.0
                    };
                    if self.mode == GridSampleMode::Nearest {
                        c = c.round_ties_even();
                    }
                    if c < lo[i] || c > hi[i] {
                        match self.padding {
                            GridSamplePadding::Border => c = c.clamp(0.0, d - 1.0),
                            GridSamplePadding::Reflection => c = reflect(c, lo[i], hi[i]),
                            GridSamplePadding::Zeros => {}
                        }
                    }
                    let t = &mut taps[i];
                    t.clear();
                    match self.mode {
                        GridSampleMode::Nearest => {
                            // Out-of-range NaN/inf coordinates read the padding.
                            let ci = if c.is_finite() { c as i64 } else { i64::MIN / 2 };
                            t.push((self.pixel(ci, dims[i], lo[i], hi[i]), 1.0));
                        }
                        GridSampleMode::Linear => {
                            let f = c.floor();
                            let fr = c - f;
                            let fi = if f.is_finite() { f as i64 } else { i64::MIN / 2 };
                            t.push((self.pixel(fi, dims[i], lo[i], hi[i]), 1.0 - fr));
                            t.push((self.pixel(fi + 1, dims[i], lo[i], hi[i]), fr));
                        }
                        GridSampleMode::Cubic => {
                            let f = c.floor();
                            let fi = if f.is_finite() { f as i64 } else { i64::MIN / 2 };
                            let w = cubic_coeffs(c - f);
                            for (k, wk) in w.iter().enumerate() {
                                t.push((self.pixel(fi - 1 + k as i64, dims[i], lo[i], hi[i]), *wk));
                            }
                        }
                    }
                }
                for ch in 0..chans {
                    let plane = &xd[(n * chans + ch) * isz..(n * chans + ch + 1) * isz];
                    y[(n * chans + ch) * npts + p] = sum_taps(plane, &taps, &strides, 0, 0, 1.0);
                }
            }
        }
        Ok(smallvec::smallvec![Value::Tensor(from_f64s(x.dtype(), yshape, &y)?)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        match (input_shape(inputs, 0), input_shape(inputs, 1)) {
            (Some(xs), Some(gs)) if xs.len() >= 3 && gs.len() == xs.len() => {
                let mut s = vec![xs[0].clone(), xs[1].clone()];
                s.extend(gs[1..gs.len() - 1].iter().cloned());
                Ok(vec![tensor_type(dtype, Some(s))])
            }
            _ => Ok(vec![util::dtype_only(dtype)]),
        }
    }
}

/// Weighted sum over the cartesian product of per-dim taps (a `None` index reads zero).
fn sum_taps(
    plane: &[f64],
    taps: &[Vec<(Option<usize>, f64)>],
    strides: &[usize],
    dim: usize,
    off: usize,
    w: f64,
) -> f64 {
    if dim == taps.len() {
        return w * plane[off];
    }
    let mut acc = 0.0;
    for &(i, wi) in &taps[dim] {
        if let Some(i) = i
            && wi != 0.0
        {
            acc += sum_taps(plane, taps, strides, dim + 1, off + i * strides[dim], w * wi);
        }
    }
    acc
}

/// `AffineGrid`: the sampling grid of an affine transform `theta` for an output `size`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct AffineGrid {
    pub align_corners: bool,
}

impl AffineGrid {
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let theta = args.tensor(0)?;
        check_float(theta, 0)?;
        let size = util::read_i64s(args.tensor(1)?, 1, "size")?;
        let size = size
            .iter()
            .map(|&d| util::dim(d, 1, "size"))
            .collect::<Result<Vec<_>>>()?;
        let nd = size.len().saturating_sub(2);
        let ts = theta.shape();
        if !(nd == 2 || nd == 3) {
            return Err(OpError::input_value(
                1,
                "a size [N, C, H, W] or [N, C, D, H, W]",
                format!("{size:?}"),
            ));
        }
        if ts != [size[0], nd, nd + 1] {
            return Err(OpError::input_shape(
                0,
                format!("[{}, {nd}, {}], as size", size[0], nd + 1),
                ts,
            ));
        }
        let sp = &size[2..];
        let npts = numel(sp)?;
        let mut yshape = vec![size[0]];
        yshape.extend(sp);
        yshape.push(nd);
        let total = numel(&yshape)?;
        let base = |i: usize, l: usize| -> f64 {
            if self.align_corners {
                if l <= 1 {
                    -1.0
                } else {
                    -1.0 + 2.0 * i as f64 / (l - 1) as f64
                }
            } else {
                -1.0 + (2.0 * i as f64 + 1.0) / l as f64
            }
        };
        let th = theta.to_f64_vec();
        let mut y = Vec::with_capacity(total);
        let mut idx = vec![0usize; nd];
        for n in 0..size[0] {
            let t = &th[n * nd * (nd + 1)..(n + 1) * nd * (nd + 1)];
            idx.iter_mut().for_each(|v| *v = 0);
            for _ in 0..npts {
                // Homogeneous point (x, y[, z], 1) with x the innermost dim.
                let mut hp: Vec<f64> = (0..nd).map(|k| base(idx[nd - 1 - k], sp[nd - 1 - k])).collect();
                hp.push(1.0);
                for r in 0..nd {
                    y.push((0..=nd).map(|c| t[r * (nd + 1) + c] * hp[c]).sum::<f64>());
                }
                super::pool::step(&mut idx, sp);
            }
        }
        Ok(smallvec::smallvec![Value::Tensor(from_f64s(
            theta.dtype(),
            yshape,
            &y
        )?)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        if let Some(t) = util::const_tensor(inputs, 1) {
            let s = util::read_i64s(t, 1, "size")?;
            if s.len() >= 3 {
                let mut out = vec![Dim::Fixed(util::dim(s[0], 1, "size")?)];
                for &d in &s[2..] {
                    out.push(Dim::Fixed(util::dim(d, 1, "size")?));
                }
                out.push(Dim::Fixed(s.len() - 2));
                return Ok(vec![tensor_type(dtype, Some(out))]);
            }
        }
        Ok(vec![util::dtype_only(dtype)])
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum RoiAlignMode {
    Avg,
    Max,
}

/// `RoiAlign`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RoiAlign {
    /// `coordinate_transformation_mode` half_pixel (opset 16 default) vs output_half_pixel.
    pub half_pixel: bool,
    pub mode: RoiAlignMode,
    pub output_height: usize,
    pub output_width: usize,
    pub sampling_ratio: usize,
    pub spatial_scale: f32,
}

/// One roi's bilinear taps: `per_bin` samples for each of the `output_height x output_width`
/// bins, bin after bin, each sample four (flat `y * W + x` offset, weight) taps into an
/// `H x W` plane (all-zero weights for a sample outside the image).
pub(crate) struct RoiSamples {
    pub taps: Vec<[(usize, f64); 4]>,
    pub per_bin: usize,
}

impl RoiSamples {
    /// What an average divides by: the samples per bin (at least 1).
    pub fn count(&self) -> f64 {
        self.per_bin.max(1) as f64
    }
}

impl RoiAlign {
    /// The taps of the roi `[x1, y1, x2, y2]` over an `h x w` plane (the spec's sampling
    /// grid, shared by the reference and the fast path, so both sample the same points).
    pub(crate) fn samples(&self, roi: [f64; 4], h: usize, w: usize) -> Result<RoiSamples> {
        let (oh, ow) = (self.output_height, self.output_width);
        let scale = self.spatial_scale as f64;
        let offset = if self.half_pixel { 0.5 } else { 0.0 };
        let (hf, wf) = (h as f64, w as f64);
        let (sw, sh) = (roi[0] * scale - offset, roi[1] * scale - offset);
        let (ew, eh) = (roi[2] * scale - offset, roi[3] * scale - offset);
        let (mut rw, mut rh) = (ew - sw, eh - sh);
        if !self.half_pixel {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / oh as f64, rw / ow as f64);
        let gh = if self.sampling_ratio > 0 {
            self.sampling_ratio
        } else {
            (rh / oh as f64).ceil().max(0.0) as usize
        };
        let gw = if self.sampling_ratio > 0 {
            self.sampling_ratio
        } else {
            (rw / ow as f64).ceil().max(0.0) as usize
        };
        // Sampling grids come from roi values: bound them before allocating.
        let total = numel(&[oh, ow, gh, gw])?;
        let mut taps = Vec::with_capacity(total);
        for ph in 0..oh {
            for pw in 0..ow {
                for iy in 0..gh {
                    let yy = sh + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                    for ix in 0..gw {
                        let xx = sw + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                        if yy < -1.0 || yy > hf || xx < -1.0 || xx > wf || h == 0 || w == 0 {
                            taps.push([(0, 0.0); 4]);
                            continue;
                        }
                        let (mut yv, mut xv) = (yy.max(0.0), xx.max(0.0));
                        let (mut yl, mut xl) = (yv as usize, xv as usize);
                        let yhi = if yl >= h - 1 {
                            yl = h - 1;
                            yv = yl as f64;
                            yl
                        } else {
                            yl + 1
                        };
                        let xhi = if xl >= w - 1 {
                            xl = w - 1;
                            xv = xl as f64;
                            xl
                        } else {
                            xl + 1
                        };
                        let (ly, lx) = (yv - yl as f64, xv - xl as f64);
                        let (hy, hx) = (1.0 - ly, 1.0 - lx);
                        taps.push([
                            (yl * w + xl, hy * hx),
                            (yl * w + xhi, hy * lx),
                            (yhi * w + xl, ly * hx),
                            (yhi * w + xhi, ly * lx),
                        ]);
                    }
                }
            }
        }
        Ok(RoiSamples { taps, per_bin: gh * gw })
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let rois = args.tensor(1)?;
        let bi = args.tensor(2)?;
        check_float(x, 0)?;
        let xs = x.shape();
        if xs.len() != 4 {
            return Err(OpError::input_shape(0, "[N, C, H, W]", xs));
        }
        if rois.rank() != 2 || rois.shape()[1] != 4 {
            return Err(OpError::input_shape(1, "[num_rois, 4]", rois.shape()));
        }
        if bi.len() != rois.shape()[0] {
            return Err(OpError::input_shape(
                2,
                format!("[{}], one batch index per roi", rois.shape()[0]),
                bi.shape(),
            ));
        }
        let (nb, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
        let nr = rois.shape()[0];
        let (oh, ow) = (self.output_height, self.output_width);
        let yshape = vec![nr, c, oh, ow];
        let mut y = vec![0.0f64; numel(&yshape)?];
        let xd = x.to_f64_vec();
        let rd = rois.to_f64_vec();
        let bd = util::read_i64s(bi, 2, "batch_indices")?;
        for r in 0..nr {
            let b = usize::try_from(bd[r])
                .ok()
                .filter(|&b| b < nb)
                .ok_or_else(|| OpError::IndexOutOfRange { index: bd[r], size: nb })?;
            let roi = [rd[r * 4], rd[r * 4 + 1], rd[r * 4 + 2], rd[r * 4 + 3]];
            let samples = self.samples(roi, h, w)?;
            let count = samples.count();
            let RoiSamples { taps, per_bin } = samples;
            let samples: Vec<&[[(usize, f64); 4]]> = taps.chunks(per_bin.max(1)).collect();
            for ch in 0..c {
                let plane = &xd[(b * c + ch) * h * w..(b * c + ch + 1) * h * w];
                for (bin, s) in samples.iter().enumerate() {
                    let v = match self.mode {
                        RoiAlignMode::Avg => {
                            s.iter()
                                .map(|t| t.iter().map(|&(i, wt)| wt * plane[i]).sum::<f64>())
                                .sum::<f64>()
                                / count
                        }
                        RoiAlignMode::Max => s
                            .iter()
                            .map(|t| t.iter().map(|&(i, wt)| wt * plane[i]).fold(f64::NEG_INFINITY, f64::max))
                            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
                            .unwrap_or(0.0),
                    };
                    y[(r * c + ch) * oh * ow + bin] = v;
                }
            }
        }
        Ok(smallvec::smallvec![Value::Tensor(from_f64s(x.dtype(), yshape, &y)?)])
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let nr = input_shape(inputs, 1).and_then(|s| s.first().cloned());
        let c = input_shape(inputs, 0).and_then(|s| s.get(1).cloned());
        match (nr, c) {
            (Some(nr), Some(c)) => Ok(vec![tensor_type(
                dtype,
                Some(vec![
                    nr,
                    c,
                    Dim::Fixed(self.output_height),
                    Dim::Fixed(self.output_width),
                ]),
            )]),
            _ => Ok(vec![util::dtype_only(dtype)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_tensor::Tensor;

    #[test]
    fn reflect_bounces() {
        assert_eq!(reflect(-1.0, -0.5, 2.5), 0.0);
        assert_eq!(reflect(3.0, -0.5, 2.5), 2.0);
        assert_eq!(reflect(1.0, -0.5, 2.5), 1.0);
    }

    #[test]
    fn grid_sample_identity_corners() {
        // align_corners: grid (-1,-1) is pixel (0,0), (1,1) is the last pixel.
        let x = Value::Tensor(Tensor::from_vec(vec![1, 1, 2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap());
        let g = Value::Tensor(Tensor::from_vec(vec![1, 1, 2, 2], vec![-1.0f32, -1.0, 1.0, 1.0]).unwrap());
        let op = GridSample {
            align_corners: true,
            mode: GridSampleMode::Linear,
            padding: GridSamplePadding::Zeros,
        };
        let y = op.eval(&Args::new(&[Some(&x), Some(&g)])).unwrap();
        assert_eq!(y[0].as_tensor().unwrap().as_slice::<f32>().unwrap(), &[1.0, 4.0]);
    }
}
