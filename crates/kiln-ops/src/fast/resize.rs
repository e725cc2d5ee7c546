//! The f32 `Resize`: the reference's per-axis taps (`Resize::axis_taps`, so every mode,
//! coordinate transformation, nearest rule, antialias and `exclude_outside` behave the same),
//! applied in f32 without the f64 round trip, innermost resized axis first so the other
//! axes move whole rows. Nearest taps are copies (bit-exact); weighted taps sum in f32 where
//! the reference sums in f64 (within a few ulp of the output's magnitude). Works in any
//! layout: a channels-last tensor resized on H and W copies whole channel vectors. Other
//! element types (8-bit activations between quantized convolutions, int64, bool) take the
//! same path when every resized axis is a nearest copy: data movement, bit-exact.

use crate::Outputs;
use crate::error::Result;
use crate::nn::numel;
use crate::nn::resize::Resize;
use crate::value::Args;
use kiln_tensor::{DType, Tensor};

/// Runs `op` on the fast path for f32, else on the reference.
pub(crate) fn eval(op: &Resize, args: &Args<'_>) -> Result<Outputs> {
    let x = args.tensor(0)?;
    if x.shape().contains(&0) {
        return op.eval(args);
    }
    match x.dtype() {
        DType::F32 => {}
        DType::U8 => return nearest::<u8>(op, args, x),
        DType::I8 => return nearest::<i8>(op, args, x),
        DType::I64 => return nearest::<i64>(op, args, x),
        DType::Bool => return nearest::<bool>(op, args, x),
        _ => return op.eval(args),
    }
    let g = op.call_geometry(args, x.shape())?;
    let mut shape = x.shape().to_vec();
    let axes: Vec<usize> = (0..shape.len()).rev().filter(|&a| g.resizes(a, &shape)).collect();
    // Innermost axis first: it shrinks or grows the rows the outer axes then copy whole. The
    // last pass writes the output buffer; the ones before, recycled scratch.
    let mut data: Option<Vec<f32>> = None;
    for (i, &a) in axes.iter().enumerate() {
        let (Some(&out), Some(&scale)) = (g.out.get(a), g.scales.get(a)) else {
            return op.eval(args);
        };
        let roi = g.roi.as_ref().and_then(|r| r.get(a).copied());
        let taps = Flat::new(&op.axis_taps(shape[a], out, scale, roi));
        let src: &[f32] = match &data {
            Some(d) => d,
            None => x.as_slice::<f32>()?,
        };
        let mut next = shape.clone();
        next[a] = out;
        let n = numel(&next)?;
        if i + 1 == axes.len() {
            let mut y = crate::util::out_f32(n);
            resize_axis(src, &shape, a, out, &taps, op.extrapolation_value, &mut y);
            if let Some(d) = data.take() {
                kiln_kernels::recycle::give(d);
            }
            return Ok(smallvec::smallvec![Tensor::from_buf(next, y)?.into()]);
        }
        let mut y = kiln_kernels::recycle::take(n);
        resize_axis(src, &shape, a, out, &taps, op.extrapolation_value, &mut y);
        if let Some(d) = data.replace(y) {
            kiln_kernels::recycle::give(d);
        }
        shape = next;
    }
    // No axis resized.
    Ok(smallvec::smallvec![x.clone().into()])
}

/// Runs `op` on `x` of a non-f32 type when every resized axis copies (nearest, nothing
/// extrapolated), else on the reference.
fn nearest<T: kiln_kernels::recycle::Recycled + kiln_tensor::Element + Send + Sync>(
    op: &Resize,
    args: &Args<'_>,
    x: &Tensor,
) -> Result<Outputs> {
    let g = op.call_geometry(args, x.shape())?;
    let mut shape = x.shape().to_vec();
    let mut passes = Vec::new();
    for a in (0..shape.len()).rev().filter(|&a| g.resizes(a, &shape)) {
        let (Some(&out), Some(&scale)) = (g.out.get(a), g.scales.get(a)) else {
            return op.eval(args);
        };
        let roi = g.roi.as_ref().and_then(|r| r.get(a).copied());
        let taps = Flat::new(&op.axis_taps(shape[a], out, scale, roi));
        if !taps.copies {
            return op.eval(args);
        }
        passes.push((a, out, taps));
    }
    let mut data: Option<Vec<T>> = None;
    let count = passes.len();
    for (i, (a, out, taps)) in passes.into_iter().enumerate() {
        let src: &[T] = match &data {
            Some(d) => d,
            None => x.as_slice::<T>()?,
        };
        let mut next = shape.clone();
        next[a] = out;
        let n = numel(&next)?;
        if i + 1 == count {
            let mut y = crate::util::out_buf::<T>(n);
            copy_axis(src, &shape, a, out, &taps, &mut y);
            if let Some(d) = data.take() {
                kiln_kernels::recycle::give_of(d);
            }
            return Ok(smallvec::smallvec![Tensor::from_buf(next, y)?.into()]);
        }
        let mut y = kiln_kernels::recycle::take_of::<T>(n);
        copy_axis(src, &shape, a, out, &taps, &mut y);
        if let Some(d) = data.replace(y) {
            kiln_kernels::recycle::give_of(d);
        }
        shape = next;
    }
    Ok(smallvec::smallvec![x.clone().into()])
}

/// [`resize_axis`] for taps that all copy (`t.copies`), of any element type.
fn copy_axis<T: Copy + Default + Send + Sync>(
    src: &[T],
    shape: &[usize],
    a: usize,
    out: usize,
    t: &Flat,
    dst: &mut [T],
) {
    let input = shape.get(a).copied().unwrap_or(0);
    let inner: usize = shape.get(a + 1..).unwrap_or(&[]).iter().product();
    let (ilen, olen) = (input * inner, out * inner);
    if olen == 0 {
        return;
    }
    let at = |y: usize| t.taps(y).0.first().copied().unwrap_or(0);
    if inner == 1 {
        let rows = (PIECE / olen).max(1);
        kiln_kernels::pool::for_each_chunk_mut(dst, rows * olen, &|ci, d| {
            for (r, d) in d.chunks_mut(olen).enumerate() {
                let o = ci * rows + r;
                let s = src.get(o * ilen..(o + 1) * ilen).unwrap_or(&[]);
                for (y, dv) in d.iter_mut().enumerate() {
                    *dv = s.get(at(y)).copied().unwrap_or_default();
                }
            }
        });
        return;
    }
    let rows = (PIECE / inner).max(1);
    kiln_kernels::pool::for_each_chunk_mut(dst, rows * inner, &|ci, d| {
        for (r, row) in d.chunks_mut(inner).enumerate() {
            let g = ci * rows + r;
            let (o, y) = (g / out, g % out);
            let i = at(y);
            match src.get(o * ilen + i * inner..o * ilen + (i + 1) * inner) {
                Some(s) if s.len() == row.len() => row.copy_from_slice(s),
                _ => row.fill(T::default()),
            }
        }
    });
}

/// Taps as flat arrays: position `y` sums `idx[start[y]..start[y + 1]]` with their weights;
/// `ext[y]` marks a position that takes the extrapolation value.
struct Flat {
    start: Vec<usize>,
    idx: Vec<usize>,
    w: Vec<f32>,
    ext: Vec<bool>,
    /// Every position reads exactly one input position with weight 1 (nearest).
    copies: bool,
}

impl Flat {
    fn new(taps: &crate::nn::resize::Taps) -> Flat {
        let mut f = Flat {
            start: Vec::with_capacity(taps.len() + 1),
            idx: Vec::new(),
            w: Vec::new(),
            ext: Vec::with_capacity(taps.len()),
            copies: true,
        };
        f.start.push(0);
        for t in taps {
            match t {
                None => {
                    f.ext.push(true);
                    f.copies = false;
                }
                Some(t) => {
                    f.ext.push(false);
                    f.copies &= t.len() == 1 && t.first().is_some_and(|&(_, w)| w == 1.0);
                    for &(i, w) in t {
                        f.idx.push(i);
                        f.w.push(w as f32);
                    }
                }
            }
            f.start.push(f.idx.len());
        }
        f
    }

    /// Position `y`'s input positions and weights (empty for an extrapolated one).
    fn taps(&self, y: usize) -> (&[usize], &[f32]) {
        let (from, to) = (
            self.start.get(y).copied().unwrap_or(0),
            self.start.get(y + 1).copied().unwrap_or(0),
        );
        (
            self.idx.get(from..to).unwrap_or(&[]),
            self.w.get(from..to).unwrap_or(&[]),
        )
    }
}

/// Floats per piece of work handed to the pool.
const PIECE: usize = 1 << 15;

/// Resizes axis `a` of `src` (of `shape`) to `out` positions, into `dst` (every element
/// written), the rows split over the pool.
fn resize_axis(src: &[f32], shape: &[usize], a: usize, out: usize, t: &Flat, ext: f32, dst: &mut [f32]) {
    let input = shape.get(a).copied().unwrap_or(0);
    let inner: usize = shape.get(a + 1..).unwrap_or(&[]).iter().product();
    let (ilen, olen) = (input * inner, out * inner);
    if olen == 0 {
        return;
    }
    if inner == 1 {
        // The last axis: one gather (nearest) or weighted sum per element, whole rows per piece.
        let rows = (PIECE / olen).max(1);
        kiln_kernels::pool::for_each_chunk_mut(dst, rows * olen, &|ci, d| {
            for (r, d) in d.chunks_mut(olen).enumerate() {
                let o = ci * rows + r;
                let s = src.get(o * ilen..(o + 1) * ilen).unwrap_or(&[]);
                for (y, dv) in d.iter_mut().enumerate() {
                    *dv = position(s, y, t, ext);
                }
            }
        });
        return;
    }
    let rows = (PIECE / inner).max(1);
    kiln_kernels::pool::for_each_chunk_mut(dst, rows * inner, &|ci, d| {
        for (r, row) in d.chunks_mut(inner).enumerate() {
            let g = ci * rows + r;
            let (o, y) = (g / out, g % out);
            let s = src.get(o * ilen..(o + 1) * ilen).unwrap_or(&[]);
            let src_row = |i: usize| s.get(i * inner..(i + 1) * inner).unwrap_or(&[]);
            if t.ext.get(y).copied().unwrap_or(true) {
                row.fill(ext);
                continue;
            }
            let (idx, w) = t.taps(y);
            match (idx, w) {
                // Nearest (or a tap of weight 1): a copy.
                ([i], _) if t.copies => copy_or_zero(row, src_row(*i)),
                // Linear: both taps in one pass (the same sum, `w0 a + w1 b`, as tap by tap).
                ([i0, i1], [w0, w1]) => {
                    let (r0, r1) = (src_row(*i0), src_row(*i1));
                    if r0.len() == row.len() && r1.len() == row.len() {
                        for ((d, &p), &q) in row.iter_mut().zip(r0).zip(r1) {
                            *d = w0 * p + w1 * q;
                        }
                    } else {
                        row.fill(0.0);
                    }
                }
                _ => {
                    row.fill(0.0);
                    for (&i, &wv) in idx.iter().zip(w) {
                        for (dv, sv) in row.iter_mut().zip(src_row(i)) {
                            *dv += wv * sv;
                        }
                    }
                }
            }
        }
    });
}

/// `dst = src`, or zeros if the lengths differ (not reached: the taps index the input).
fn copy_or_zero(dst: &mut [f32], src: &[f32]) {
    if dst.len() == src.len() {
        dst.copy_from_slice(src);
    } else {
        dst.fill(0.0);
    }
}

/// Output position `y` of a last-axis resize of the row `s`.
fn position(s: &[f32], y: usize, t: &Flat, ext: f32) -> f32 {
    if t.ext.get(y).copied().unwrap_or(true) {
        return ext;
    }
    let (idx, w) = t.taps(y);
    if t.copies {
        return idx.first().and_then(|&i| s.get(i)).copied().unwrap_or(ext);
    }
    let mut acc = 0f32;
    for (&i, &wv) in idx.iter().zip(w) {
        acc += wv * s.get(i).copied().unwrap_or(0.0);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::resize::{CoordMode, NearestMode, ResizeMode};
    use crate::value::Value;

    fn x(shape: &[usize]) -> Value {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1000) as f32) / 250.0 - 2.0).collect();
        Value::Tensor(Tensor::from_vec(shape.to_vec(), v).unwrap())
    }

    fn f32s(v: &[f32]) -> Value {
        Value::Tensor(Tensor::from_vec(vec![v.len()], v.to_vec()).unwrap())
    }

    fn i64s(v: &[i64]) -> Value {
        Value::Tensor(Tensor::from_vec(vec![v.len()], v.to_vec()).unwrap())
    }

    #[test]
    fn every_mode_matches_the_reference() {
        let shapes = [[1, 3, 5, 7], [2, 2, 4, 4]];
        let modes = [ResizeMode::Nearest, ResizeMode::Linear, ResizeMode::Cubic];
        let coords = [
            CoordMode::HalfPixel,
            CoordMode::PytorchHalfPixel,
            CoordMode::AlignCorners,
            CoordMode::Asymmetric,
            CoordMode::TfHalfPixelForNn,
            CoordMode::HalfPixelSymmetric,
        ];
        let targets: [(Option<Vec<f32>>, Option<Vec<i64>>); 4] = [
            (Some(vec![1.0, 1.0, 2.0, 2.0]), None),
            (Some(vec![1.0, 1.0, 0.6, 1.7]), None),
            (None, Some(vec![1, 2, 9, 3])),
            (Some(vec![1.0, 2.0, 1.0, 1.0]), None),
        ];
        for shape in shapes {
            for mode in modes {
                for coord in coords {
                    for antialias in [false, true] {
                        for (scales, sizes) in &targets {
                            let mut sizes = sizes.clone();
                            if let Some(s) = sizes.as_mut() {
                                s[0] = shape[0] as i64;
                            }
                            let op = Resize {
                                mode,
                                coord,
                                nearest: NearestMode::RoundPreferCeil,
                                antialias,
                                ..Resize::default()
                            };
                            let xv = x(&shape);
                            let empty = f32s(&[]);
                            let sv = scales.as_ref().map(|s| f32s(s));
                            let zv = sizes.as_ref().map(|s| i64s(s));
                            let args = [Some(&xv), Some(&empty), sv.as_ref(), zv.as_ref()];
                            let args = Args::new(&args);
                            let want = op.eval(&args).unwrap();
                            let got = eval(&op, &args).unwrap();
                            let (w, g) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
                            assert_eq!(w.shape(), g.shape());
                            let (w, g) = (w.as_slice::<f32>().unwrap(), g.as_slice::<f32>().unwrap());
                            for (a, b) in w.iter().zip(g) {
                                let tol = if mode == ResizeMode::Nearest { 0.0 } else { 2e-6 * 4.0 };
                                assert!((a - b).abs() <= tol, "{a} vs {b}: {mode:?} {coord:?} {shape:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn crop_and_resize_extrapolates_like_the_reference() {
        let op = Resize {
            mode: ResizeMode::Linear,
            coord: CoordMode::TfCropAndResize,
            extrapolation_value: 9.5,
            ..Resize::default()
        };
        let xv = x(&[1, 1, 4, 4]);
        let roi = f32s(&[0.0, 0.0, -0.2, 0.3, 1.0, 1.0, 1.1, 0.9]);
        let scales = f32s(&[1.0, 1.0, 1.5, 2.0]);
        let args = [Some(&xv), Some(&roi), Some(&scales)];
        let args = Args::new(&args);
        let want = op.eval(&args).unwrap();
        let got = eval(&op, &args).unwrap();
        let (w, g) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
        let (w, g) = (w.as_slice::<f32>().unwrap(), g.as_slice::<f32>().unwrap());
        assert!(w.contains(&9.5));
        for (a, b) in w.iter().zip(g) {
            assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn nearest_bytes_and_integers_match_the_reference() {
        // u8 and i64 through every nearest rule and coordinate mode, up, down and mixed, in
        // both layouts' shapes (channels inner or outer): the generic copy path, bit-exact.
        let nearests = [
            NearestMode::RoundPreferFloor,
            NearestMode::RoundPreferCeil,
            NearestMode::Floor,
            NearestMode::Ceil,
        ];
        let coords = [CoordMode::HalfPixel, CoordMode::AlignCorners, CoordMode::Asymmetric];
        let targets: [(Option<Vec<f32>>, Option<Vec<i64>>); 3] = [
            (Some(vec![1.0, 1.0, 2.0, 2.0]), None),
            (Some(vec![1.0, 1.0, 0.6, 1.7]), None),
            (None, Some(vec![2, 9, 3, 5])),
        ];
        for shape in [[2, 3, 5, 7], [2, 5, 7, 3]] {
            let n: usize = shape.iter().product();
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 % 251) as u8).collect();
            let longs: Vec<i64> = (0..n).map(|i| i as i64 * 1_000_003 - 7).collect();
            let inputs = [
                Value::Tensor(Tensor::from_vec(shape.to_vec(), bytes).unwrap()),
                Value::Tensor(Tensor::from_vec(shape.to_vec(), longs).unwrap()),
            ];
            for xv in &inputs {
                for nearest in nearests {
                    for coord in coords {
                        for (scales, sizes) in &targets {
                            let op = Resize {
                                mode: ResizeMode::Nearest,
                                coord,
                                nearest,
                                ..Resize::default()
                            };
                            let empty = f32s(&[]);
                            let sv = scales.as_ref().map(|s| f32s(s));
                            let zv = sizes.as_ref().map(|s| i64s(s));
                            let args = [Some(xv), Some(&empty), sv.as_ref(), zv.as_ref()];
                            let args = Args::new(&args);
                            let want = op.eval(&args).unwrap();
                            let got = eval(&op, &args).unwrap();
                            let (w, g) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
                            assert_eq!(w, g, "{nearest:?} {coord:?} {shape:?} {scales:?} {sizes:?}");
                        }
                    }
                }
            }
        }
    }
}
