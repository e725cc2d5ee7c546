//! `Resize` (opset 10, 11, 13, 18, 19) and the deprecated `Upsample` (opset 7–9), per
//! <https://onnx.ai/onnx/operators/onnx__Resize.html>.
//!
//! Interpolation is separable: each resized axis is processed in turn, every output position
//! taking a weighted sum of a fixed-size window of input positions (edge-clamped), exactly as
//! ONNX's reference implementation does; nearest mode is the 2-tap window with 0/1 weights.

use super::{from_f64s, input_shape, tensor_type};
use crate::error::{OpError, Result};
use crate::util;
use crate::value::{Args, Dim, InferInput, Value, ValueType};
use kiln_tensor::{DType, Tensor};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq, Default)]
pub enum ResizeMode {
    #[default]
    Nearest,
    Linear,
    Cubic,
}

/// `coordinate_transformation_mode`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq, Default)]
pub enum CoordMode {
    #[default]
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
    TfCropAndResize,
}

/// `nearest_mode`; `Simple` is opset 10's rule (floor when upsampling, ceil when downsampling).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq, Default)]
pub enum NearestMode {
    #[default]
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    Simple,
}

/// `keep_aspect_ratio_policy`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq, Default)]
pub enum KeepAspect {
    #[default]
    Stretch,
    NotLarger,
    NotSmaller,
}

/// Resize / Upsample with attributes applied and the positions of its inputs (which moved
/// across opsets).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Resize {
    /// Reports the op as `Upsample`.
    pub upsample: bool,
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub nearest: NearestMode,
    pub keep_aspect: KeepAspect,
    pub antialias: bool,
    /// Axes the scales/sizes apply to (empty: all).
    pub axes: Vec<i64>,
    pub cubic_coeff_a: f32,
    pub exclude_outside: bool,
    pub extrapolation_value: f32,
    pub roi_input: Option<usize>,
    pub scales_input: Option<usize>,
    pub sizes_input: Option<usize>,
    /// Upsample-7 `scales` attribute.
    pub scales_attr: Vec<f32>,
}

impl Default for Resize {
    fn default() -> Resize {
        Resize {
            upsample: false,
            mode: ResizeMode::Nearest,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::RoundPreferFloor,
            keep_aspect: KeepAspect::Stretch,
            antialias: false,
            axes: Vec::new(),
            cubic_coeff_a: -0.75,
            exclude_outside: false,
            extrapolation_value: 0.0,
            roi_input: Some(1),
            scales_input: Some(2),
            sizes_input: Some(3),
            scales_attr: Vec::new(),
        }
    }
}

/// Output geometry of one call: per axis scale, output size and roi.
pub(crate) struct Geometry {
    pub(crate) scales: Vec<f64>,
    pub(crate) out: Vec<usize>,
    pub(crate) roi: Option<Vec<(f64, f64)>>,
}

impl Geometry {
    /// Whether axis `a` of an input of `shape` changes (another size, scale or roi).
    pub(crate) fn resizes(&self, a: usize, shape: &[usize]) -> bool {
        let trivial_roi = self.roi.as_ref().is_none_or(|r| {
            r.get(a)
                .is_none_or(|r| (r.0 - 0.0).abs() < 1e-9 && (r.1 - 1.0).abs() < 1e-9)
        });
        let scale = self.scales.get(a).copied().unwrap_or(1.0);
        !((scale - 1.0).abs() < 1e-9 && self.out.get(a) == shape.get(a) && trivial_roi)
    }
}

/// The interpolation of one resized axis: per output position, the input positions and
/// weights it sums (edge-clamped, zero weights dropped), or `None` where it takes the
/// extrapolation value.
pub(crate) type Taps = Vec<Option<Vec<(usize, f64)>>>;

/// Scales or sizes as given (before axis expansion).
enum Target {
    /// Scales, and whether they are the Upsample-7 attribute's.
    Scales(Vec<f64>, bool),
    Sizes(Vec<usize>),
}

/// What a list of `n` per-axis values should be.
fn one_per_axis(what: &str, n: usize) -> String {
    format!("{n} {what}, one per resized axis")
}

impl Resize {
    /// Resize, or the deprecated Upsample it was imported from.
    pub fn name(&self) -> &'static str {
        if self.upsample { "Upsample" } else { "Resize" }
    }
}

impl Resize {
    fn axes(&self, rank: usize) -> Result<Vec<usize>> {
        if self.axes.is_empty() {
            Ok((0..rank).collect())
        } else {
            util::norm_axes(&self.axes, rank).map(|a| a.to_vec())
        }
    }

    /// The input positions of roi, scales and sizes (for errors).
    fn roi_index(&self) -> usize {
        self.roi_input.unwrap_or(1)
    }
    fn scales_index(&self) -> usize {
        self.scales_input.unwrap_or(2)
    }
    fn sizes_index(&self) -> usize {
        self.sizes_input.unwrap_or(3)
    }

    /// Scales that do not fit: the Upsample-7 attribute's or the scales input's.
    fn bad_scales(&self, from_attr: bool, expected: String, got: String) -> OpError {
        match from_attr {
            true => OpError::attribute("scales", expected, got),
            false => OpError::input_value(self.scales_index(), expected, got),
        }
    }

    fn target_of(&self, scales: Option<&Tensor>, sizes: Option<&Tensor>) -> Result<Target> {
        if let Some(s) = sizes.filter(|t| !t.is_empty()) {
            let i = self.sizes_index();
            let v = util::read_i64s(s, i, "sizes")?;
            return Ok(Target::Sizes(
                v.iter().map(|&d| util::dim(d, i, "sizes")).collect::<Result<_>>()?,
            ));
        }
        if let Some(s) = scales.filter(|t| !t.is_empty()) {
            if s.rank() > 1 {
                return Err(OpError::input_shape(self.scales_index(), "1-D scales", s.shape()));
            }
            let v = s.to_f64_vec();
            if v.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                return Err(self.bad_scales(false, "finite scales > 0".into(), format!("{v:?}")));
            }
            return Ok(Target::Scales(v, false));
        }
        if !self.scales_attr.is_empty() {
            return Ok(Target::Scales(
                self.scales_attr.iter().map(|&x| x as f64).collect(),
                true,
            ));
        }
        Err(OpError::input_value(
            self.scales_index(),
            format!("scales, or sizes as input {}", self.sizes_index()),
            "neither",
        ))
    }

    fn geometry(&self, shape: &[usize], target: Target, roi: Option<&Tensor>) -> Result<Geometry> {
        let r = shape.len();
        let axes = self.axes(r)?;
        let mut scales = vec![1.0f64; r];
        let mut out = shape.to_vec();
        match target {
            Target::Scales(s, from_attr) => {
                if s.len() != axes.len() {
                    return Err(self.bad_scales(from_attr, one_per_axis("scales", axes.len()), format!("{s:?}")));
                }
                for (&a, &sc) in axes.iter().zip(&s) {
                    scales[a] = sc;
                    let o = (sc * shape[a] as f64).floor();
                    if !(0.0..=(kiln_tensor::MAX_ELEMENTS as f64)).contains(&o) {
                        return Err(OpError::too_large("resized dim", format!("{o} (axis {a})")));
                    }
                    out[a] = o as usize;
                }
            }
            Target::Sizes(sz) => {
                if sz.len() != axes.len() {
                    return Err(OpError::input_value(
                        self.sizes_index(),
                        one_per_axis("sizes", axes.len()),
                        format!("{sz:?}"),
                    ));
                }
                for (&a, &s) in axes.iter().zip(&sz) {
                    scales[a] = s as f64 / shape[a] as f64;
                    out[a] = s;
                }
                if self.keep_aspect != KeepAspect::Stretch {
                    let it = axes.iter().map(|&a| scales[a]);
                    let sc = if self.keep_aspect == KeepAspect::NotLarger {
                        it.fold(f64::INFINITY, f64::min)
                    } else {
                        it.fold(0.0, f64::max)
                    };
                    for &a in &axes {
                        scales[a] = sc;
                        out[a] = (sc * shape[a] as f64 + 0.5) as usize;
                    }
                }
            }
        }
        util::checked_numel(&out)?;
        let roi = match roi.filter(|t| !t.is_empty()) {
            Some(t) if self.coord == CoordMode::TfCropAndResize => {
                let v = t.to_f64_vec();
                if v.len() != 2 * axes.len() {
                    return Err(OpError::input_value(
                        self.roi_index(),
                        format!("{} values, a start and an end per axis", 2 * axes.len()),
                        format!("{} values", v.len()),
                    ));
                }
                let mut full = vec![(0.0, 1.0); r];
                let na = axes.len();
                for (i, &a) in axes.iter().enumerate() {
                    full[a] = (v[i], v[na + i]);
                }
                Some(full)
            }
            _ => None,
        };
        if self.coord == CoordMode::TfCropAndResize && roi.is_none() {
            return Err(OpError::input_value(
                self.roi_index(),
                "a roi (the mode is tf_crop_and_resize)",
                "none",
            ));
        }
        Ok(Geometry { scales, out, roi })
    }

    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        match x.dtype() {
            DType::String | DType::Bool => {
                return Err(OpError::UnsupportedDType {
                    index: 0,
                    got: x.dtype(),
                });
            }
            d if d.is_byte_coded() => return Err(OpError::UnsupportedDType { index: 0, got: d }),
            _ => {}
        }
        let g = self.call_geometry(args, x.shape())?;
        let mut shape = x.shape().to_vec();
        let mut data = x.to_f64_vec();
        for a in 0..shape.len() {
            if !g.resizes(a, &shape) {
                continue;
            }
            data = self.resize_axis(&data, &shape, a, g.scales[a], g.out[a], g.roi.as_ref().map(|r| r[a]))?;
            shape[a] = g.out[a];
        }
        Ok(smallvec::smallvec![Value::Tensor(from_f64s(x.dtype(), shape, &data)?)])
    }

    /// The geometry of a call on an input of `shape`, from its scales, sizes and roi inputs.
    pub(crate) fn call_geometry(&self, args: &Args<'_>, shape: &[usize]) -> Result<Geometry> {
        let get = |i: Option<usize>| -> Result<Option<&Tensor>> {
            match i {
                Some(i) => args.opt_tensor(i),
                None => Ok(None),
            }
        };
        let target = self.target_of(get(self.scales_input)?, get(self.sizes_input)?)?;
        self.geometry(shape, target, get(self.roi_input)?)
    }

    /// The taps of an axis of `input` positions resized to `out` (see [`Taps`]).
    pub(crate) fn axis_taps(&self, input: usize, out: usize, scale: f64, roi: Option<(f64, f64)>) -> Taps {
        let mut taps: Taps = Vec::with_capacity(out);
        if input == 0 {
            // Nothing to read: every position extrapolates (callers refuse this first).
            taps.resize(out, None);
            return taps;
        }
        for y in 0..out {
            let x = self.source_coord(y as f64, scale, input, out, roi);
            if self.coord == CoordMode::TfCropAndResize && (x < 0.0 || x > (input - 1) as f64) {
                taps.push(None);
                continue;
            }
            let fl = x.floor();
            let (reference, ratio) = if fl == x {
                (fl as i64 - 1, 1.0)
            } else {
                (fl as i64, x - fl)
            };
            let (start, mut w) = self.weights(ratio, scale, scale < 1.0);
            let idx: Vec<i64> = (0..w.len() as i64).map(|j| reference + start + j).collect();
            if self.exclude_outside {
                for (wv, &i) in w.iter_mut().zip(&idx) {
                    if i < 0 || i >= input as i64 {
                        *wv = 0.0;
                    }
                }
                let s: f64 = w.iter().sum();
                let s = if s == 0.0 { 1.0 } else { s };
                w.iter_mut().for_each(|v| *v /= s);
            }
            let t = idx
                .iter()
                .zip(&w)
                .filter(|(_, w)| **w != 0.0)
                .map(|(&i, &w)| (i.clamp(0, input as i64 - 1) as usize, w))
                .collect();
            taps.push(Some(t));
        }
        taps
    }

    /// Source coordinate of output index `y` along an axis.
    fn source_coord(&self, y: f64, scale: f64, input: usize, out: usize, roi: Option<(f64, f64)>) -> f64 {
        let in_f = input as f64;
        let out_w = scale * in_f;
        match self.coord {
            CoordMode::HalfPixel => (y + 0.5) / scale - 0.5,
            CoordMode::HalfPixelSymmetric => {
                let adjustment = out as f64 / out_w;
                let center = in_f / 2.0;
                let offset = center * (1.0 - adjustment);
                offset + (y + 0.5) / scale - 0.5
            }
            CoordMode::PytorchHalfPixel => {
                if out_w == 1.0 || out == 1 {
                    -0.5
                } else {
                    (y + 0.5) / scale - 0.5
                }
            }
            CoordMode::AlignCorners => {
                if out_w == 1.0 || out == 1 {
                    0.0
                } else {
                    y * (in_f - 1.0) / (out_w - 1.0)
                }
            }
            CoordMode::Asymmetric => y / scale,
            CoordMode::TfHalfPixelForNn => (y + 0.5) / scale,
            CoordMode::TfCropAndResize => {
                let (s, e) = roi.unwrap_or((0.0, 1.0));
                let base = if out_w == 1.0 || out == 1 {
                    (e - s) * (in_f - 1.0) / 2.0
                } else {
                    y * (e - s) * (in_f - 1.0) / (out_w - 1.0)
                };
                base + s * (in_f - 1.0)
            }
        }
    }

    /// Window offset `start` (relative to the reference index) and weights for one position
    /// with `ratio` in (0, 1].
    fn weights(&self, ratio: f64, scale: f64, downsample: bool) -> (i64, Vec<f64>) {
        let a = self.cubic_coeff_a as f64;
        let cubic = |x: f64| {
            let x = x.abs();
            if x <= 1.0 {
                ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
            } else if x < 2.0 {
                ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
            } else {
                0.0
            }
        };
        match self.mode {
            ResizeMode::Nearest => {
                let up = if ratio == 1.0 {
                    true
                } else {
                    match self.nearest {
                        NearestMode::RoundPreferFloor => ratio > 0.5,
                        NearestMode::RoundPreferCeil => ratio >= 0.5,
                        NearestMode::Floor => false,
                        NearestMode::Ceil => true,
                        NearestMode::Simple => downsample,
                    }
                };
                (0, if up { vec![0.0, 1.0] } else { vec![1.0, 0.0] })
            }
            ResizeMode::Linear => {
                if self.antialias && scale < 1.0 {
                    let start = (-1.0 / scale).floor() as i64 + 1;
                    let n = 2 - 2 * start;
                    let w: Vec<f64> = (0..n)
                        .map(|j| (1.0 - (((start + j) as f64 - ratio) * scale).abs()).clamp(0.0, 1.0))
                        .collect();
                    let s: f64 = w.iter().sum();
                    (start, w.into_iter().map(|v| v / s).collect())
                } else {
                    (0, vec![1.0 - ratio, ratio])
                }
            }
            ResizeMode::Cubic => {
                if self.antialias && scale < 1.0 {
                    let start = (-2.0 / scale).floor() as i64 + 1;
                    let n = 2 - 2 * start;
                    let w: Vec<f64> = (0..n).map(|j| cubic(scale * ((start + j) as f64 - ratio))).collect();
                    let s: f64 = w.iter().sum();
                    (start, w.into_iter().map(|v| v / s).collect())
                } else {
                    (
                        -1,
                        vec![cubic(ratio + 1.0), cubic(ratio), cubic(1.0 - ratio), cubic(2.0 - ratio)],
                    )
                }
            }
        }
    }

    fn resize_axis(
        &self,
        data: &[f64],
        shape: &[usize],
        axis: usize,
        scale: f64,
        out: usize,
        roi: Option<(f64, f64)>,
    ) -> Result<Vec<f64>> {
        let input = shape[axis];
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let mut new_shape = shape.to_vec();
        new_shape[axis] = out;
        let total = util::checked_numel(&new_shape)?;
        if input == 0 {
            return if total == 0 {
                Ok(Vec::new())
            } else {
                Err(OpError::input_shape(
                    0,
                    format!("axis {axis} non-empty, to resize it to {out}"),
                    shape,
                ))
            };
        }
        let taps = self.axis_taps(input, out, scale, roi);
        let ext = self.extrapolation_value as f64;
        let mut res = vec![0.0f64; total];
        for o in 0..outer {
            let src = &data[o * input * inner..(o + 1) * input * inner];
            let dst = &mut res[o * out * inner..(o + 1) * out * inner];
            for (y, t) in taps.iter().enumerate() {
                let d = &mut dst[y * inner..(y + 1) * inner];
                match t {
                    None => d.fill(ext),
                    Some(t) => {
                        for &(i, w) in t {
                            let s = &src[i * inner..(i + 1) * inner];
                            for (dv, sv) in d.iter_mut().zip(s) {
                                *dv += w * sv;
                            }
                        }
                    }
                }
            }
        }
        Ok(res)
    }

    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let Some(xs) = input_shape(inputs, 0) else {
            return Ok(vec![util::dtype_only(dtype)]);
        };
        let konst = |i: Option<usize>| i.and_then(|i| util::const_tensor(inputs, i));
        let sizes = konst(self.sizes_input).filter(|t| !t.is_empty());
        let scales = konst(self.scales_input).filter(|t| !t.is_empty());
        // A non-constant sizes/scales input leaves the dims unknown.
        if sizes.is_none() && scales.is_none() && self.scales_attr.is_empty() {
            return Ok(vec![tensor_type(dtype, None)]);
        }
        let fixed: Option<Vec<usize>> = xs
            .iter()
            .map(|d| if let Dim::Fixed(v) = d { Some(*v) } else { None })
            .collect();
        if let Some(fixed) = fixed {
            let target = self.target_of(scales, sizes)?;
            // The roi only matters for its validity, which eval checks.
            let out = match self.geometry(&fixed, target, None) {
                Ok(g) => g.out,
                Err(_) => return Ok(vec![tensor_type(dtype, None)]),
            };
            return Ok(vec![tensor_type(
                dtype,
                Some(out.into_iter().map(Dim::Fixed).collect()),
            )]);
        }
        // Symbolic input: keep the dims whose scale is exactly 1 (scales mode, stretch).
        if sizes.is_none() {
            let target = self.target_of(scales, None)?;
            let Target::Scales(s, from_attr) = target else {
                return Ok(vec![tensor_type(dtype, None)]);
            };
            let axes = self.axes(xs.len())?;
            if s.len() != axes.len() {
                return Err(self.bad_scales(from_attr, one_per_axis("scales", axes.len()), format!("{s:?}")));
            }
            let mut out = xs.clone();
            for (&a, &sc) in axes.iter().zip(&s) {
                out[a] = match &xs[a] {
                    Dim::Fixed(v) => Dim::Fixed((sc * *v as f64).floor() as usize),
                    Dim::Sym(n) if sc == 1.0 => Dim::Sym(n.clone()),
                    Dim::Sym(n) => Dim::Sym(format!("resize({n},x{sc})")),
                };
            }
            return Ok(vec![tensor_type(dtype, Some(out))]);
        }
        Ok(vec![tensor_type(dtype, None)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: &Resize, x: Tensor, scales: Option<Vec<f32>>, sizes: Option<Vec<i64>>) -> Tensor {
        let xv = Value::Tensor(x);
        let sv = scales.map(|s| Value::Tensor(Tensor::from_vec(vec![s.len()], s).unwrap()));
        let zv = sizes.map(|s| Value::Tensor(Tensor::from_vec(vec![s.len()], s).unwrap()));
        let ins = [Some(&xv), None, sv.as_ref(), zv.as_ref()];
        op.eval(&Args::new(&ins)).unwrap()[0].as_tensor().unwrap().clone()
    }

    #[test]
    fn nearest_upsample_by_two() {
        let x = Tensor::from_vec(vec![1, 1, 1, 2], vec![1.0f32, 2.0]).unwrap();
        let op = Resize {
            coord: CoordMode::Asymmetric,
            ..Resize::default()
        };
        let y = run(&op, x, Some(vec![1.0, 1.0, 1.0, 2.0]), None);
        assert_eq!(y.shape(), &[1, 1, 1, 4]);
        assert_eq!(y.as_slice::<f32>().unwrap(), &[1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn linear_half_pixel_upsample() {
        // [1, 2] → 4 with half_pixel: x = (y+0.5)/2-0.5 = -0.25, 0.25, 0.75, 1.25 → clamped
        // edges give 1, 1.25, 1.75, 2.
        let x = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
        let op = Resize {
            mode: ResizeMode::Linear,
            ..Resize::default()
        };
        let y = run(&op, x, None, Some(vec![4]));
        assert_eq!(y.as_slice::<f32>().unwrap(), &[1.0, 1.25, 1.75, 2.0]);
    }
}
