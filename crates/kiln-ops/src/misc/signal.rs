//! Signal processing ops:
//! - [DFT](https://onnx.ai/onnx/operators/onnx__DFT.html), opsets 17 (axis attribute) and 20
//!   (axis input), including the inverse of a one-sided spectrum (irfft) as ONNX's reference does.
//! - [STFT](https://onnx.ai/onnx/operators/onnx__STFT.html), opset 17+.
//! - [HannWindow](https://onnx.ai/onnx/operators/onnx__HannWindow.html),
//!   [HammingWindow](https://onnx.ai/onnx/operators/onnx__HammingWindow.html),
//!   [BlackmanWindow](https://onnx.ai/onnx/operators/onnx__BlackmanWindow.html), opset 17+.
//! - [MelWeightMatrix](https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html), opset 17+.
//!
//! Transforms are computed directly (O(n²) per line) in f64 and cast back to the input dtype.

use super::{input_shape, present, require_float, tensor_from_f64};
use crate::error::{OpError, Result};
use crate::util::{checked_numel, const_tensor, dtype_only, input_dtype, norm_axis, read_i64};
use crate::value::{Args, Dim, InferInput, TensorType, ValueType};
use kiln_tensor::{DType, Tensor};
use std::f64::consts::PI;

/// `e^{sign·2πi·k·t/n}` as (cos, sin), with the product reduced mod n for accuracy.
fn twiddle(k: usize, t: usize, n: usize, sign: f64) -> (f64, f64) {
    let a = 2.0 * PI * ((k as u128 * t as u128) % n as u128) as f64 / n as f64;
    (a.cos(), sign * a.sin())
}

/// One line of the transform: `sig` is the complex input (re, im), `n` the transform length;
/// returns the `out_len` complex outputs.
fn dft_line(sig: &[(f64, f64)], n: usize, out_len: usize, inverse: bool) -> Vec<(f64, f64)> {
    let m = sig.len().min(n);
    let sign = if inverse { 1.0 } else { -1.0 };
    let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
    (0..out_len)
        .map(|k| {
            let (mut re, mut im) = (0.0, 0.0);
            for (t, &(xr, xi)) in sig[..m].iter().enumerate() {
                let (c, s) = twiddle(k, t, n, sign);
                re += xr * c - xi * s;
                im += xr * s + xi * c;
            }
            (re * scale, im * scale)
        })
        .collect()
}

/// Inverse of a one-sided spectrum of a real signal of length `n` (numpy's `irfft`): the
/// imaginary parts of the DC and Nyquist bins are ignored.
fn irfft_line(spec: &[(f64, f64)], n: usize) -> Vec<f64> {
    let bins = (n / 2 + 1).min(spec.len());
    (0..n)
        .map(|t| {
            let mut acc = 0.0;
            for (k, &(xr, xi)) in spec[..bins].iter().enumerate() {
                let (c, s) = twiddle(k, t, n, 1.0);
                let v = xr * c - xi * s;
                let single = k == 0 || (n.is_multiple_of(2) && k == n / 2);
                acc += if single { v } else { 2.0 * v };
            }
            acc / n as f64
        })
        .collect()
}

/// Discrete Fourier transform along one axis of a real (`[..., 1]`) or complex (`[..., 2]`)
/// signal.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Dft {
    /// The axis attribute (opsets 17-19, default 1); `None` reads input 2 (opset 20, default -2).
    pub axis: Option<i64>,
    pub inverse: bool,
    pub onesided: bool,
}

impl Dft {
    fn axis(&self, args: &Args<'_>) -> Result<i64> {
        match self.axis {
            Some(a) => Ok(a),
            None => match args.opt_tensor(2)? {
                Some(t) => read_i64(t, 2, "axis"),
                None => Ok(-2),
            },
        }
    }
}

impl Dft {
    pub fn name(&self) -> &'static str {
        "DFT"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        require_float(x, 0)?;
        let shape = x.shape();
        let rank = shape.len();
        let comps = match shape.last() {
            Some(&c @ (1 | 2)) if rank >= 2 => c,
            _ => {
                return Err(OpError::input_shape(0, "[..., 1] (real) or [..., 2] (complex)", shape));
            }
        };
        let axis_v = self.axis(args)?;
        let axis = norm_axis(axis_v, rank)?;
        if axis == rank - 1 {
            return Err(OpError::Axis { axis: axis_v, rank });
        }
        let n_in = shape[axis];
        let n = match args.opt_tensor(1)? {
            Some(t) => {
                let v = read_i64(t, 1, "dft_length")?;
                if v < 1 {
                    return Err(OpError::input_value(1, "a dft_length >= 1", v));
                }
                v as usize
            }
            None if self.inverse && self.onesided => 2 * n_in.saturating_sub(1),
            None => n_in,
        };
        if n == 0 {
            return Err(OpError::input_shape(0, format!("axis {axis} non-empty"), shape));
        }
        let (out_len, out_comps) = match (self.inverse, self.onesided) {
            (false, false) => (n, 2),
            (false, true) => (n / 2 + 1, 2),
            (true, false) => (n, 2),
            (true, true) => (n, 1),
        };
        let mut out_shape = shape.to_vec();
        out_shape[axis] = out_len;
        out_shape[rank - 1] = out_comps;
        let total = checked_numel(&out_shape)?;
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..rank - 1].iter().product();
        let v = x.to_f64_vec();
        let mut out = vec![0.0; total];
        for o in 0..outer {
            for i in 0..inner {
                let at = |t: usize| ((o * n_in + t) * inner + i) * comps;
                let sig: Vec<(f64, f64)> = (0..n_in)
                    .map(|t| (v[at(t)], if comps == 2 { v[at(t) + 1] } else { 0.0 }))
                    .collect();
                let put = |k: usize| ((o * out_len + k) * inner + i) * out_comps;
                if self.inverse && self.onesided {
                    for (k, y) in irfft_line(&sig, n).into_iter().enumerate() {
                        out[put(k)] = y;
                    }
                } else {
                    for (k, (re, im)) in dft_line(&sig, n, out_len, self.inverse).into_iter().enumerate() {
                        out[put(k)] = re;
                        out[put(k) + 1] = im;
                    }
                }
            }
        }
        Ok(smallvec::smallvec![tensor_from_f64(x.dtype(), out_shape, &out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let Some(mut shape) = input_shape(inputs, 0) else {
            return Ok(vec![dtype_only(dtype)]);
        };
        let rank = shape.len();
        let axis = match self.axis {
            Some(a) => Some(a),
            None if !present(inputs, 2) => Some(-2),
            None => const_tensor(inputs, 2).and_then(|t| read_i64(t, 2, "axis").ok()),
        };
        let has_len_input = present(inputs, 1);
        let n_len = const_tensor(inputs, 1).and_then(|t| read_i64(t, 1, "dft_length").ok());
        let (Some(axis), true) = (axis, rank >= 2) else {
            return Ok(vec![super::rank_only(dtype, rank)]);
        };
        let axis = norm_axis(axis, rank)?;
        let n = match (n_len, has_len_input, &shape[axis]) {
            (Some(v), _, _) => Some(v.max(0) as usize),
            (None, true, _) => None,
            (None, false, Dim::Fixed(d)) => Some(if self.inverse && self.onesided {
                2 * d.saturating_sub(1)
            } else {
                *d
            }),
            (None, false, Dim::Sym(_)) => None,
        };
        let (len, comps) = match (self.inverse, self.onesided) {
            (false, true) => (n.map(|n| n / 2 + 1), 2),
            (true, true) => (n, 1),
            _ => (n, 2),
        };
        shape[axis] = len.map_or_else(|| Dim::Sym("dft_len".into()), Dim::Fixed);
        shape[rank - 1] = Dim::Fixed(comps);
        Ok(vec![ValueType::Tensor(TensorType {
            dtype,
            shape: Some(shape),
        })])
    }
}

/// Short-time Fourier transform of `[batch, length, 1 or 2]` signals.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Stft {
    pub onesided: bool,
}

impl Stft {
    pub fn name(&self) -> &'static str {
        "STFT"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        require_float(x, 0)?;
        let (batch, len, comps) = match *x.shape() {
            [b, l, c @ (1 | 2)] => (b, l, c),
            ref s => {
                return Err(OpError::input_shape(0, "[batch, length, 1 or 2]", s));
            }
        };
        let step = read_i64(args.tensor(1)?, 1, "frame_step")?;
        if step < 1 {
            return Err(OpError::input_value(1, "a frame_step >= 1", step));
        }
        let step = step as usize;
        let window = args.opt_tensor(2)?;
        if let Some(w) = window
            && w.rank() != 1
        {
            return Err(OpError::input_shape(2, "a 1-D window", w.shape()));
        }
        let frame_len = match (args.opt_tensor(3)?, window) {
            (Some(t), w) => {
                let v = read_i64(t, 3, "frame_length")?;
                if v < 1 {
                    return Err(OpError::input_value(3, "a frame_length >= 1", v));
                }
                if let Some(w) = w
                    && w.len() != v as usize
                {
                    return Err(OpError::input_shape(2, format!("[{v}], the frame_length"), w.shape()));
                }
                v as usize
            }
            (None, Some(w)) => w.len(),
            (None, None) => len,
        };
        if frame_len == 0 || frame_len > len {
            return Err(OpError::input_shape(
                0,
                format!("a signal of at least the frame length {frame_len} (and one sample)"),
                x.shape(),
            ));
        }
        let win: Vec<f64> = window.map_or_else(|| vec![1.0; frame_len], Tensor::to_f64_vec);
        let frames = 1 + (len - frame_len) / step;
        let bins = if self.onesided { frame_len / 2 + 1 } else { frame_len };
        let out_shape = vec![batch, frames, bins, 2];
        let mut out = vec![0.0; checked_numel(&out_shape)?];
        let v = x.to_f64_vec();
        for b in 0..batch {
            for f in 0..frames {
                let sig: Vec<(f64, f64)> = (0..frame_len)
                    .map(|t| {
                        let p = (b * len + f * step + t) * comps;
                        let im = if comps == 2 { v[p + 1] } else { 0.0 };
                        (v[p] * win[t], im * win[t])
                    })
                    .collect();
                for (k, (re, im)) in dft_line(&sig, frame_len, bins, false).into_iter().enumerate() {
                    let p = ((b * frames + f) * bins + k) * 2;
                    out[p] = re;
                    out[p + 1] = im;
                }
            }
        }
        Ok(smallvec::smallvec![tensor_from_f64(x.dtype(), out_shape, &out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = input_dtype(inputs, 0);
        let shape = input_shape(inputs, 0);
        let batch = shape
            .as_ref()
            .and_then(|s| s.first().cloned())
            .unwrap_or(Dim::Sym("batch".into()));
        let len = shape.as_ref().and_then(|s| match s.get(1) {
            Some(Dim::Fixed(n)) => Some(*n),
            _ => None,
        });
        let step = const_tensor(inputs, 1).and_then(|t| read_i64(t, 1, "frame_step").ok());
        let frame_len = const_tensor(inputs, 3)
            .and_then(|t| read_i64(t, 3, "frame_length").ok())
            .map(|v| v.max(0) as usize)
            .or_else(|| {
                inputs
                    .get(2)
                    .and_then(|i| i.ty.tensor())
                    .and_then(|t| t.fixed_shape())
                    .and_then(|s| s.first().copied())
            });
        let frames = match (len, step, frame_len) {
            (Some(l), Some(s), Some(f)) if s >= 1 && f <= l => Dim::Fixed(1 + (l - f) / s as usize),
            _ => Dim::Sym("frames".into()),
        };
        let bins = frame_len.map_or(Dim::Sym("bins".into()), |f| {
            Dim::Fixed(if self.onesided { f / 2 + 1 } else { f })
        });
        Ok(vec![ValueType::Tensor(TensorType {
            dtype,
            shape: Some(vec![batch, frames, bins, Dim::Fixed(2)]),
        })])
    }
}

/// Which window function.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum WindowKind {
    Hann,
    Hamming,
    Blackman,
}

/// A window of the length given by the scalar input.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Window {
    pub kind: WindowKind,
    pub periodic: bool,
    pub dtype: DType,
}

impl Window {
    fn values(&self, size: usize) -> Vec<f64> {
        let denom = if self.periodic { size as f64 } else { size as f64 - 1.0 };
        (0..size)
            .map(|i| {
                let x = i as f64 / denom;
                match self.kind {
                    WindowKind::Hann => (PI * x).sin().powi(2),
                    WindowKind::Hamming => {
                        let alpha = 25.0 / 46.0;
                        alpha - (1.0 - alpha) * (2.0 * PI * x).cos()
                    }
                    WindowKind::Blackman => 0.42 - 0.5 * (2.0 * PI * x).cos() + 0.08 * (4.0 * PI * x).cos(),
                }
            })
            .collect()
    }
}

impl Window {
    pub fn name(&self) -> &'static str {
        match self.kind {
            WindowKind::Hann => "HannWindow",
            WindowKind::Hamming => "HammingWindow",
            WindowKind::Blackman => "BlackmanWindow",
        }
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let size = read_i64(args.tensor(0)?, 0, "size")?;
        let size = crate::util::dim(size, 0, "size")?;
        checked_numel(&[size])?;
        Ok(smallvec::smallvec![
            tensor_from_f64(self.dtype, vec![size], &self.values(size))?.into(),
        ])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let d = const_tensor(inputs, 0)
            .and_then(|t| read_i64(t, 0, "size").ok())
            .map_or(Dim::Sym("window".into()), |s| Dim::Fixed(s.max(0) as usize));
        Ok(vec![ValueType::Tensor(TensorType::new(self.dtype, vec![d]))])
    }
}

/// Matrix mapping a one-sided linear spectrum to mel bands, `[dft_length/2 + 1, num_mel_bins]`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct MelWeightMatrix {
    pub dtype: DType,
}

impl MelWeightMatrix {
    pub fn name(&self) -> &'static str {
        "MelWeightMatrix"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let mel = crate::util::dim(read_i64(args.tensor(0)?, 0, "num_mel_bins")?, 0, "num_mel_bins")?;
        let dft_len = read_i64(args.tensor(1)?, 1, "dft_length")?;
        let rate = read_i64(args.tensor(2)?, 2, "sample_rate")?;
        let scalar_f = |i: usize, what: &str| -> Result<f64> {
            let t = args.tensor(i)?;
            match t.to_f64_vec().as_slice() {
                [v] => Ok(*v),
                _ => Err(OpError::input_shape(i, format!("one element ({what})"), t.shape())),
            }
        };
        let (lower, upper) = (scalar_f(3, "lower_edge_hertz")?, scalar_f(4, "upper_edge_hertz")?);
        for (i, v, what) in [(1, dft_len, "a dft_length >= 1"), (2, rate, "a sample_rate >= 1")] {
            if v < 1 {
                return Err(OpError::input_value(i, what, v));
            }
        }
        let spec_bins = dft_len as usize / 2 + 1;
        let shape = vec![spec_bins, mel];
        let mut out = vec![0.0; checked_numel(&shape)?];
        let to_mel = |hz: f64| 2595.0 * (1.0 + hz / 700.0).log10();
        let (lo, hi) = (to_mel(lower), to_mel(upper));
        let step = (hi - lo) / (mel + 2) as f64;
        let points: Vec<i64> = (0..mel + 2)
            .map(|i| {
                let hz = 700.0 * ((i as f64 * step + lo) / 2595.0 * std::f64::consts::LN_10).exp_m1();
                (((dft_len + 1) as f64 * hz) / rate as f64).floor() as i64
            })
            .collect();
        let mut set = |j: i64, i: usize, v: f64| -> Result<()> {
            let j = usize::try_from(j)
                .ok()
                .filter(|&j| j < spec_bins)
                .ok_or_else(|| OpError::IndexOutOfRange {
                    index: j,
                    size: spec_bins,
                })?;
            out[j * mel + i] = v;
            Ok(())
        };
        for i in 0..mel {
            let (l, c, h) = (points[i], points[i + 1], points[i + 2]);
            if c == l {
                set(c, i, 1.0)?;
            } else {
                for j in l..=c {
                    set(j, i, (j - l) as f64 / (c - l) as f64)?;
                }
            }
            if h > c {
                for j in c..h {
                    set(j, i, (h - j) as f64 / (h - c) as f64)?;
                }
            }
        }
        Ok(smallvec::smallvec![tensor_from_f64(self.dtype, shape, &out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let k = |i: usize| {
            const_tensor(inputs, i)
                .and_then(|t| read_i64(t, i, "").ok())
                .map(|v| v.max(0) as usize)
        };
        let rows = k(1).map_or(Dim::Sym("spectrum_bins".into()), |d| Dim::Fixed(d / 2 + 1));
        let cols = k(0).map_or(Dim::Sym("mel_bins".into()), Dim::Fixed);
        Ok(vec![ValueType::Tensor(TensorType::new(self.dtype, vec![rows, cols]))])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn dft_of_impulse_and_constant() {
        // Real [1, 0, 0, 0] → flat spectrum of ones; constant 1s → 4 at DC only.
        let x = t(&[2, 4, 1], vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
        let op = Dft {
            axis: Some(1),
            inverse: false,
            onesided: false,
        };
        let y = run(&[Some(&x)], |a| op.eval(a));
        let (shape, v) = out::<f32>(&y[0]);
        assert_eq!(shape, vec![2, 4, 2]);
        assert_eq!(
            v.iter().map(|x| x.round()).collect::<Vec<_>>(),
            vec![
                1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            ]
        );
        // [0, 1, 0, 0]: X[k] = e^{-iπk/2} = 1, -i, -1, i; onesided keeps k = 0..=2.
        let x = t(&[1, 4, 1], vec![0.0f64, 1.0, 0.0, 0.0]);
        let op = Dft {
            axis: Some(1),
            inverse: false,
            onesided: true,
        };
        let y = run(&[Some(&x)], |a| op.eval(a));
        let (shape, v) = out::<f64>(&y[0]);
        assert_eq!(shape, vec![1, 3, 2]);
        assert!(close(&v, &[1.0, 0.0, 0.0, -1.0, -1.0, 0.0], 1e-12));
    }

    #[test]
    fn inverse_and_irfft_undo_forward() {
        // Spectrum of [1, 2, 3, 4]: [10, -2+2i, -2, -2-2i].
        let spec = t(&[1, 4, 2], vec![10.0f64, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0]);
        let inv = Dft {
            axis: None,
            inverse: true,
            onesided: false,
        };
        let y = run(&[Some(&spec)], |a| inv.eval(a));
        assert!(close(
            &out::<f64>(&y[0]).1,
            &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0],
            1e-12
        ));
        let half = t(&[1, 3, 2], vec![10.0f64, 0.0, -2.0, 2.0, -2.0, 0.0]);
        let irfft = Dft {
            axis: None,
            inverse: true,
            onesided: true,
        };
        let y = run(&[Some(&half)], |a| irfft.eval(a));
        let (shape, v) = out::<f64>(&y[0]);
        assert_eq!(shape, vec![1, 4, 1]);
        assert!(close(&v, &[1.0, 2.0, 3.0, 4.0], 1e-12));
    }

    #[test]
    fn windows_match_closed_forms() {
        let size = t(&[], vec![4i64]);
        let hann = Window {
            kind: WindowKind::Hann,
            periodic: true,
            dtype: DType::F64,
        };
        let y = run(&[Some(&size)], |a| hann.eval(a));
        assert!(close(&out::<f64>(&y[0]).1, &[0.0, 0.5, 1.0, 0.5], 1e-12));
        let ham = Window {
            kind: WindowKind::Hamming,
            periodic: false,
            dtype: DType::F64,
        };
        let size3 = t(&[], vec![3i64]);
        let y = run(&[Some(&size3)], |a| ham.eval(a));
        // alpha - beta, alpha + beta, alpha - beta with alpha = 25/46.
        assert!(close(&out::<f64>(&y[0]).1, &[4.0 / 46.0, 1.0, 4.0 / 46.0], 1e-12));
        let bl = Window {
            kind: WindowKind::Blackman,
            periodic: false,
            dtype: DType::F64,
        };
        let y = run(&[Some(&size3)], |a| bl.eval(a));
        assert!(close(&out::<f64>(&y[0]).1, &[0.0, 1.0, 0.0], 1e-12));
    }

    #[test]
    fn stft_frames_a_signal() {
        // Signal of 6 ones, frames of 4 with step 2 → 2 frames, each DC = 4.
        let x = t(&[1, 6, 1], vec![1.0f32; 6]);
        let step = t(&[], vec![2i64]);
        let len = t(&[], vec![4i64]);
        let op = Stft { onesided: true };
        let y = run(&[Some(&x), Some(&step), None, Some(&len)], |a| op.eval(a));
        let (shape, v) = out::<f32>(&y[0]);
        assert_eq!(shape, vec![1, 2, 3, 2]);
        assert!(close(
            &v.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            &[4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            1e-6
        ));
    }
}
