//! The `Resize` fast path: the reference's per-axis taps (`Resize::axis_taps`, so every mode,
//! coordinate transformation, nearest rule, antialias and `exclude_outside` behave the same),
//! applied one axis at a time, innermost resized axis first so the other axes move whole rows.
//! Works in any layout: a channels-last tensor resized on H and W moves whole channel vectors.
//!
//! - Nearest (every axis's taps copies): data movement of any element type (f32, the 8-bit
//!   activations between quantized convolutions, int64, bool), bit-exact.
//! - Weighted taps (linear, cubic, antialias) of f32, u8 and i8: sums in f32 where the
//!   reference sums in f64 (f32 outputs within a few ulp of their magnitude); 8-bit values
//!   pass between axes as f32 and are rounded half to even and saturated once at the end,
//!   as the reference does, so they match it except where the exact value lies within f32
//!   rounding of a half (exactly, for scales whose weights are dyadic such as 2x or 4x).

use crate::Outputs;
use crate::error::Result;
use crate::nn::numel;
use crate::nn::resize::Resize;
use crate::value::Args;
use kiln_kernels::recycle::Recycled;
use kiln_tensor::{DType, Element, Tensor};

/// Runs `op` on the fast path where it has one (see the module doc), else on the reference.
pub(crate) fn eval(op: &Resize, args: &Args<'_>) -> Result<Outputs> {
    let x = args.tensor(0)?;
    if x.shape().contains(&0) || !matches!(x.dtype(), DType::F32 | DType::U8 | DType::I8 | DType::I64 | DType::Bool) {
        return op.eval(args);
    }
    let g = op.call_geometry(args, x.shape())?;
    let mut shape = x.shape().to_vec();
    let mut passes = Vec::new();
    let axes: Vec<usize> = (0..shape.len()).rev().filter(|&a| g.resizes(a, &shape)).collect();
    for a in axes {
        let (Some(&out), Some(&scale)) = (g.out.get(a), g.scales.get(a)) else {
            return op.eval(args);
        };
        let roi = g.roi.as_ref().and_then(|r| r.get(a).copied());
        passes.push(Pass {
            a,
            taps: Flat::new(&op.axis_taps(shape[a], out, scale, roi)),
        });
        shape[a] = out;
    }
    let copies = passes.iter().all(|p| p.taps.copies);
    let ext = op.extrapolation_value;
    let weighted = Weighted { ext };
    match (x.dtype(), copies) {
        (DType::F32, true) => run::<f32, f32, _>(x, &passes, &Copies),
        (DType::U8, true) => run::<u8, u8, _>(x, &passes, &Copies),
        (DType::I8, true) => run::<i8, i8, _>(x, &passes, &Copies),
        (DType::I64, true) => run::<i64, i64, _>(x, &passes, &Copies),
        (DType::Bool, true) => run::<bool, bool, _>(x, &passes, &Copies),
        (DType::F32, false) => run::<f32, f32, _>(x, &passes, &weighted),
        (DType::U8, false) => run::<u8, f32, _>(x, &passes, &weighted),
        (DType::I8, false) => run::<i8, f32, _>(x, &passes, &weighted),
        _ => op.eval(args),
    }
}

/// One resized axis: which, and its taps (their count is the axis' new size).
struct Pass {
    a: usize,
    taps: Flat,
}

impl Pass {
    fn out(&self) -> usize {
        self.taps.ext.len()
    }
}

/// A value a weighted tap reads (as f32).
trait Sample: Copy + Send + Sync {
    fn get(self) -> f32;
}

/// A value a weighted pass writes from its f32 sum.
trait Store: Copy + Send + Sync {
    fn put(v: f32) -> Self;
}

impl Sample for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
}

impl Store for f32 {
    #[inline(always)]
    fn put(v: f32) -> f32 {
        v
    }
}

/// Adding 1.5 * 2^23 to an f32 of magnitude below 2^22 rounds it half to even (the default
/// mode) to an integer whose two's complement sits in the sum's low mantissa bits: no
/// float-to-int conversion, so the loops around it vectorise.
const MAGIC: f32 = 12_582_912.0;

macro_rules! byte_sample {
    ($t:ty) => {
        impl Sample for $t {
            #[inline(always)]
            fn get(self) -> f32 {
                f32::from(self)
            }
        }

        impl Store for $t {
            /// Saturated (NaN to the low bound) and rounded half to even, as the reference's
            /// round-then-cast: the low byte of the rounded sum's bits.
            #[inline(always)]
            fn put(v: f32) -> $t {
                let v = v.max(f32::from(<$t>::MIN)).min(f32::from(<$t>::MAX));
                (v + MAGIC).to_bits() as u8 as $t
            }
        }
    };
}
byte_sample!(u8);
byte_sample!(i8);

/// How a pass resizes its axis, reading `S` values and writing `D` values.
trait Resample<S, D> {
    fn axis(&self, src: &[S], shape: &[usize], p: &Pass, dst: &mut [D]);
}

/// Taps that all copy: data movement, any element type.
struct Copies;

impl<T: Copy + Default + Send + Sync> Resample<T, T> for Copies {
    fn axis(&self, src: &[T], shape: &[usize], p: &Pass, dst: &mut [T]) {
        copy_axis(src, shape, p.a, p.out(), &p.taps, dst);
    }
}

/// Weighted taps, summed in f32; `ext` where a position extrapolates.
struct Weighted {
    ext: f32,
}

impl<S: Sample, D: Store> Resample<S, D> for Weighted {
    fn axis(&self, src: &[S], shape: &[usize], p: &Pass, dst: &mut [D]) {
        resize_axis(src, shape, p.a, p.out(), &p.taps, self.ext, dst);
    }
}

/// `x` resized by `passes` with `r`: the first pass reads `T`, the ones between pass `M`
/// (recycled scratch), the last writes `T` into the output buffer.
fn run<T, M, R>(x: &Tensor, passes: &[Pass], r: &R) -> Result<Outputs>
where
    T: Recycled + Element,
    M: Recycled,
    R: Resample<T, T> + Resample<T, M> + Resample<M, M> + Resample<M, T>,
{
    let mut shape = x.shape().to_vec();
    let src = x.as_slice::<T>()?;
    let mut data: Option<Vec<M>> = None;
    for (i, p) in passes.iter().enumerate() {
        let mut next = shape.clone();
        next[p.a] = p.out();
        let n = numel(&next)?;
        if i + 1 == passes.len() {
            let mut y = crate::util::out_buf::<T>(n);
            match data.take() {
                Some(d) => {
                    <R as Resample<M, T>>::axis(r, &d, &shape, p, &mut y);
                    kiln_kernels::recycle::give_of(d);
                }
                None => <R as Resample<T, T>>::axis(r, src, &shape, p, &mut y),
            }
            return Ok(smallvec::smallvec![Tensor::from_buf(next, y)?.into()]);
        }
        let mut y = kiln_kernels::recycle::take_of::<M>(n);
        match &data {
            Some(d) => <R as Resample<M, M>>::axis(r, d, &shape, p, &mut y),
            None => <R as Resample<T, M>>::axis(r, src, &shape, p, &mut y),
        }
        if let Some(d) = data.replace(y) {
            kiln_kernels::recycle::give_of(d);
        }
        shape = next;
    }
    // No axis resized.
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
    let inner: usize = shape.get(a + 1..).unwrap_or(&[]).iter().product();
    let at = |y: usize| t.taps(y).0.first().copied().unwrap_or(0);
    let gather = |s: &[T], d: &mut [T]| {
        for (y, dv) in d.iter_mut().enumerate() {
            *dv = s.get(at(y)).copied().unwrap_or_default();
        }
    };
    let copy = |s: &[T], y: usize, row: &mut [T]| match s.get(at(y) * inner..(at(y) + 1) * inner) {
        Some(s) if s.len() == row.len() => row.copy_from_slice(s),
        _ => row.fill(T::default()),
    };
    over_rows(src, shape, a, out, dst, gather, copy);
}

/// An axis-`a` resize of `src` (of `shape`) to `out` positions into `dst`, split over the
/// pool: on the last axis, `last(s, d)` fills the output row `d` from the input row `s`;
/// else `row(s, y, d)` fills position `y`'s row `d` of the values inside the axis, `s` the
/// input of its outer index.
fn over_rows<S: Sync, D: Send>(
    src: &[S],
    shape: &[usize],
    a: usize,
    out: usize,
    dst: &mut [D],
    last: impl Fn(&[S], &mut [D]) + Sync,
    row: impl Fn(&[S], usize, &mut [D]) + Sync,
) {
    let input = shape.get(a).copied().unwrap_or(0);
    let inner: usize = shape.get(a + 1..).unwrap_or(&[]).iter().product();
    let (ilen, olen) = (input * inner, out * inner);
    if olen == 0 {
        return;
    }
    if inner == 1 {
        // Whole rows per piece.
        let rows = (PIECE / olen).max(1);
        kiln_kernels::pool::for_each_chunk_mut(dst, rows * olen, &|ci, d| {
            for (r, d) in d.chunks_mut(olen).enumerate() {
                let o = ci * rows + r;
                last(src.get(o * ilen..(o + 1) * ilen).unwrap_or(&[]), d);
            }
        });
        return;
    }
    let rows = (PIECE / inner).max(1);
    kiln_kernels::pool::for_each_chunk_mut(dst, rows * inner, &|ci, d| {
        for (r, d) in d.chunks_mut(inner).enumerate() {
            let g = ci * rows + r;
            let (o, y) = (g / out, g % out);
            row(src.get(o * ilen..(o + 1) * ilen).unwrap_or(&[]), y, d);
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
    /// Every position reads exactly two input positions (linear, none extrapolated): the
    /// taps of position `y` are `idx[2y..2y + 2]`, `w[2y..2y + 2]`.
    pairs: bool,
}

impl Flat {
    fn new(taps: &crate::nn::resize::Taps) -> Flat {
        let mut f = Flat {
            start: Vec::with_capacity(taps.len() + 1),
            idx: Vec::new(),
            w: Vec::new(),
            ext: Vec::with_capacity(taps.len()),
            copies: true,
            pairs: true,
        };
        f.start.push(0);
        for t in taps {
            match t {
                None => {
                    f.ext.push(true);
                    f.copies = false;
                    f.pairs = false;
                }
                Some(t) => {
                    f.ext.push(false);
                    f.pairs &= t.len() == 2;
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
/// written), the rows split over the pool. Sums in f32 whatever `S` and `D` are.
fn resize_axis<S: Sample, D: Store>(
    src: &[S],
    shape: &[usize],
    a: usize,
    out: usize,
    t: &Flat,
    ext: f32,
    dst: &mut [D],
) {
    let inner: usize = shape.get(a + 1..).unwrap_or(&[]).iter().product();
    over_rows(
        src,
        shape,
        a,
        out,
        dst,
        // The last axis: one gather (nearest) or weighted sum per element; linear as plain
        // pairs (the per-position tap lookup had been most of an image's 600 -> 320 pass).
        |s, d| {
            if t.pairs {
                let at = |i: usize| s.get(i).map_or(0.0, |v| v.get());
                for ((dv, i), w) in d.iter_mut().zip(t.idx.chunks_exact(2)).zip(t.w.chunks_exact(2)) {
                    // The sum `position` makes: `(0 + w0 a) + w1 b`, the first addition exact.
                    *dv = D::put(w[0] * at(i[0]) + w[1] * at(i[1]));
                }
                return;
            }
            for (y, dv) in d.iter_mut().enumerate() {
                *dv = D::put(position(s, y, t, ext));
            }
        },
        |s, y, row| {
            let src_row = |i: usize| s.get(i * inner..(i + 1) * inner).unwrap_or(&[]);
            if t.ext.get(y).copied().unwrap_or(true) {
                row.fill(D::put(ext));
                return;
            }
            let (idx, w) = t.taps(y);
            match (idx, w) {
                // Nearest (or a tap of weight 1): a copy.
                ([i], _) if t.copies => convert_or_zero(row, src_row(*i)),
                // Linear: both taps in one pass (the same sum, `w0 a + w1 b`, as tap by tap).
                ([i0, i1], [w0, w1]) => {
                    let (r0, r1) = (src_row(*i0), src_row(*i1));
                    if r0.len() == row.len() && r1.len() == row.len() {
                        for ((d, &p), &q) in row.iter_mut().zip(r0).zip(r1) {
                            *d = D::put(w0 * p.get() + w1 * q.get());
                        }
                    } else {
                        row.fill(D::put(0.0));
                    }
                }
                _ => {
                    // Sums of three or more taps in f32, whatever `D` holds.
                    let mut acc = vec![0.0f32; row.len()];
                    for (&i, &wv) in idx.iter().zip(w) {
                        for (av, sv) in acc.iter_mut().zip(src_row(i)) {
                            *av += wv * sv.get();
                        }
                    }
                    for (d, &v) in row.iter_mut().zip(&acc) {
                        *d = D::put(v);
                    }
                }
            }
        },
    );
}

/// `dst = src` converted, or zeros if the lengths differ (not reached: the taps index the
/// input).
fn convert_or_zero<S: Sample, D: Store>(dst: &mut [D], src: &[S]) {
    if dst.len() == src.len() {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::put(s.get());
        }
    } else {
        dst.fill(D::put(0.0));
    }
}

/// Output position `y` of a last-axis resize of the row `s`.
fn position<S: Sample>(s: &[S], y: usize, t: &Flat, ext: f32) -> f32 {
    if t.ext.get(y).copied().unwrap_or(true) {
        return ext;
    }
    let (idx, w) = t.taps(y);
    if t.copies {
        return idx.first().and_then(|&i| s.get(i)).map_or(ext, |v| v.get());
    }
    let mut acc = 0f32;
    for (&i, &wv) in idx.iter().zip(w) {
        acc += wv * s.get(i).map_or(0.0, |v| v.get());
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

    #[test]
    fn weighted_bytes_round_like_the_reference() {
        // u8 and i8 through linear and cubic (antialias too), up and down: within one step of
        // the reference (f32 sums where it sums f64), and exactly it at 2x, whose weights are
        // dyadic; the sums saturate (cubic overshoots) and round half to even.
        let targets: [(Vec<f32>, bool); 3] = [
            (vec![1.0, 1.0, 2.0, 2.0], true),
            (vec![1.0, 1.0, 0.6, 1.7], false),
            (vec![1.0, 1.0, 3.3, 0.5], false),
        ];
        let shape = [1, 3, 6, 7];
        let n: usize = shape.iter().product();
        // Extremes side by side, so cubic overshoots past the type's range; the low values
        // start at 5, so a 0 (-128 in i8) in an output can only come from saturation.
        let u: Vec<u8> = (0..n)
            .map(|i| if i % 3 == 0 { 255 } else { (i * 37 % 7) as u8 + 5 })
            .collect();
        let s: Vec<i8> = u.iter().map(|&v| (v as i16 - 128) as i8).collect();
        let inputs = [
            Value::Tensor(Tensor::from_vec(shape.to_vec(), u).unwrap()),
            Value::Tensor(Tensor::from_vec(shape.to_vec(), s).unwrap()),
        ];
        let as_i32 = |t: &Tensor| -> Vec<i32> {
            match t.dtype() {
                DType::U8 => t.as_slice::<u8>().unwrap().iter().map(|&v| v as i32).collect(),
                _ => t.as_slice::<i8>().unwrap().iter().map(|&v| v as i32).collect(),
            }
        };
        let mut saturated = false;
        for xv in &inputs {
            for mode in [ResizeMode::Linear, ResizeMode::Cubic] {
                for antialias in [false, true] {
                    for (scales, dyadic) in &targets {
                        let op = Resize {
                            mode,
                            antialias,
                            ..Resize::default()
                        };
                        let empty = f32s(&[]);
                        let sv = f32s(scales);
                        let args = [Some(xv), Some(&empty), Some(&sv)];
                        let args = Args::new(&args);
                        let want = op.eval(&args).unwrap();
                        let got = eval(&op, &args).unwrap();
                        let (w, g) = (want[0].as_tensor().unwrap(), got[0].as_tensor().unwrap());
                        assert_eq!((w.shape(), w.dtype()), (g.shape(), g.dtype()));
                        let (w, g) = (as_i32(w), as_i32(g));
                        saturated |= w.iter().any(|&v| v == 0 || v == -128);
                        for (a, b) in w.iter().zip(&g) {
                            let tol = if *dyadic && !antialias { 0 } else { 1 };
                            assert!((a - b).abs() <= tol, "{a} vs {b}: {mode:?} {scales:?} aa {antialias}");
                        }
                    }
                }
            }
        }
        assert!(saturated);
    }
}
