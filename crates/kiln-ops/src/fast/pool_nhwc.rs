//! Channels-last 2-D pooling: a `Pool` whose plan sets `channels_last` (the compiler's
//! `layout` pass, for a MaxPool between channels-last convolutions), X `[N, H, W, C]`, Y
//! `[N, OH, OW, C]`, no Indices output.
//!
//! f32 AveragePool sums each output pixel's taps inside the input, vectorised over channels,
//! and divides by their count (or the padded window's, with `count_include_pad`). f32 MaxPool
//! runs a direct loop vectorised over channels: per output pixel, the first tap
//! inside the input, then every later tap that is greater, lane by lane. That is the reference
//! order exactly (a NaN first tap stays, later NaNs are never greater), so no NaN check is
//! needed; a window with no tap inside the input gives NaN. Other kinds and types run the
//! channels-first evaluation between two transposes.

use super::conv_nhwc::{TO_FIRST, output_to_last, transpose, type_to_last, x_type_first};
use crate::error::{OpError, Result};
use crate::nn::{GlobalPool, GlobalPoolKind, Pool, PoolKind, numel, pads_attr, spatial_attr, window_geom};
use crate::util;
use crate::value::{Args, InferInput, Value, ValueType};
use kiln_kernels::vector::{max_into, nan_into};
use kiln_tensor::{DType, Tensor};

/// One dim of a window: `(input size, kernel, stride, dilation, pad_begin)`.
type Dim1 = (usize, usize, usize, usize, usize);

impl Pool {
    pub(crate) fn eval_channels_last(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let &[n, ih, iw, c] = x.shape() else {
            return Err(OpError::input_shape(
                0,
                "[N, H, W, C] (a channels-last pool)",
                x.shape(),
            ));
        };
        let fast = matches!(self.kind, PoolKind::Max { .. } | PoolKind::Average { .. });
        // The output shape, each dim's window and the pads after, for a 2-D window.
        let geometry = |[kh, kw]: [usize; 2]| -> Result<(kiln_tensor::Shape, [usize; 2], [Dim1; 2], [usize; 2])> {
            let strides = spatial_attr(&self.strides, 2, 1, "strides")?;
            let dil = spatial_attr(&self.dilations, 2, 1, "dilations")?;
            let pads = pads_attr(&self.pads, 2)?;
            let geo = |i: usize, k: usize| {
                window_geom(
                    x.shape(),
                    i + 1,
                    k,
                    strides[i],
                    dil[i],
                    pads[i],
                    pads[i + 2],
                    self.auto_pad,
                    self.ceil_mode,
                )
            };
            let (gh, gw) = (geo(0, kh)?, geo(1, kw)?);
            let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![n, gh.out, gw.out, c];
            let rows = [
                (ih, kh, strides[0], dil[0], gh.pad_begin),
                (iw, kw, strides[1], dil[1], gw.pad_begin),
            ];
            Ok((shape, [gh.out, gw.out], rows, [gh.pad_end, gw.pad_end]))
        };
        if let (true, DType::F32, &[kh, kw]) = (fast, x.dtype(), self.kernel_shape.as_slice()) {
            let (shape, out, rows, pad_ends) = geometry([kh, kw])?;
            // Every element is written below: a recycled buffer needs no clearing.
            let mut y = crate::util::out_f32(numel(&shape)?);
            match self.kind {
                PoolKind::Average { count_include_pad } => {
                    let ends = count_include_pad.then_some(pad_ends);
                    avg_nhwc(x.as_slice::<f32>()?, out, c, rows, ends, &mut y);
                }
                _ => max_nhwc(x.as_slice::<f32>()?, out, c, rows, &mut y),
            }
            return Ok(smallvec::smallvec![Value::Tensor(Tensor::from_buf(shape, y)?)]);
        }
        // 8-bit MaxPool (QDQ models' pools run on their 8-bit values): a maximum is one of
        // its taps, so the bytes pool directly.
        if let (PoolKind::Max { .. }, DType::U8 | DType::I8, &[kh, kw]) =
            (self.kind, x.dtype(), self.kernel_shape.as_slice())
        {
            let (shape, out, rows, _) = geometry([kh, kw])?;
            let len = numel(&shape)?;
            let y = if x.dtype() == DType::U8 {
                let mut y = crate::util::out_buf::<u8>(len);
                max_nhwc_8bit(x.as_slice::<u8>()?, out, c, rows, &mut y);
                Tensor::from_buf(shape, y)?
            } else {
                let mut y = crate::util::out_buf::<i8>(len);
                max_nhwc_8bit(x.as_slice::<i8>()?, out, c, rows, &mut y);
                Tensor::from_buf(shape, y)?
            };
            return Ok(smallvec::smallvec![Value::Tensor(y)]);
        }
        let xv = args.value(0).ok_or(OpError::MissingInput { index: 0 })?;
        let xt = transpose(xv, TO_FIRST)?;
        output_to_last(self.eval(&Args::new(&[Some(&xt)]).with_wanted(1))?, "pooling")
    }

    pub(crate) fn infer_channels_last(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let Some(xt) = x_type_first(inputs, "pooling")? else {
            return Ok(vec![util::dtype_only(util::input_dtype(inputs, 0))]);
        };
        let out = self.infer(&[InferInput {
            ty: &xt,
            konst: None,
            present: true,
        }])?;
        // Y only: a channels-last pool has no Indices output.
        Ok(vec![type_to_last(out.into_iter().next().unwrap_or(ValueType::Unknown))])
    }
}

/// Elements of one image from which a channels-last global pool splits its channels over
/// the threads (smaller ones run on the calling thread).
const GLOBAL_SPLIT_MIN: usize = 1 << 16;

impl GlobalPool {
    /// `[N, H, W, C]` to `[N, 1, 1, C]` (any rank >= 2).
    pub(crate) fn infer_channels_last(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let shape = crate::nn::input_shape(inputs, 0).filter(|s| s.len() >= 2).map(|s| {
            let mut o = s.to_vec();
            let last = o.len() - 1;
            o[1..last].iter_mut().for_each(|d| *d = crate::value::Dim::Fixed(1));
            o
        });
        Ok(vec![crate::nn::tensor_type(dtype, shape)])
    }

    /// X `[N, H, W, C]` (any rank >= 2: the dims between N and C are the plane) into Y
    /// `[N, 1, .., 1, C]`. f32 Average and Max read X once, row by row, vectorised over the
    /// channels (Average accumulates in f32 lanes, then scales); other kinds and types reduce
    /// each channel's strided plane in f64, as the channels-first evaluation does.
    pub(crate) fn eval_channels_last(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let xs = x.shape();
        let &[n, ref mid @ .., c] = xs else {
            return Err(OpError::input_shape(0, "[N, .., C] (a channels-last global pool)", xs));
        };
        let plane = numel(mid)?;
        let shape: kiln_tensor::Shape = std::iter::once(n)
            .chain(mid.iter().map(|_| 1))
            .chain(std::iter::once(c))
            .collect();
        let fast = match self.kind {
            GlobalPoolKind::Average => Some(false),
            GlobalPoolKind::Max => Some(true),
            GlobalPoolKind::Lp { .. } => None,
        };
        if let (Some(max), Ok(xd)) = (fast, x.as_slice::<f32>()) {
            // Max skips NaN (as the channels-first f64 fold with `f64::max` does); an empty
            // plane averages to NaN (0 / 0) and maxes to -inf, as channels-first.
            let init = if max { f32::NEG_INFINITY } else { 0.0 };
            let mut y = crate::util::out_f32(n * c);
            y.fill(init);
            // Over the pool: by image, or for one image by ranges of channels (whole vectors)
            // when it is large enough to pay for the split (an SE block's 243 x 480 plane).
            let c1 = c.max(1);
            let threads = kiln_kernels::pool::current_threads();
            let chunk = if n == 1 && threads > 1 && plane.saturating_mul(c) >= GLOBAL_SPLIT_MIN {
                c1.div_ceil(threads).next_multiple_of(16).min(c1)
            } else {
                c1
            };
            kiln_kernels::pool::for_each_chunk_mut(&mut y, chunk, &|i, out| {
                // Chunk `i`: image `img`, channels `ch0 ..` (a whole image when `chunk` is `c`).
                let (img, ch0) = ((i * chunk) / c1, (i * chunk) % c1);
                let rows = xd.get(img * plane * c..(img + 1) * plane * c).unwrap_or(&[]);
                kiln_kernels::simd::vectorize(|| {
                    for row in rows.chunks_exact(c1) {
                        let row = row.get(ch0..ch0 + out.len()).unwrap_or(&[]);
                        if max {
                            max_into(out, row);
                        } else {
                            out.iter_mut().zip(row).for_each(|(o, &v)| *o += v);
                        }
                    }
                });
                if !max {
                    let scale = 1.0 / plane as f32;
                    out.iter_mut().for_each(|o| *o *= scale);
                }
            });
            return Ok(smallvec::smallvec![Value::Tensor(Tensor::from_buf(shape, y)?)]);
        }
        let xd = x.to_f64_vec();
        let y: Vec<f64> = (0..n * c)
            .map(|i| {
                let (img, ch) = (i / c.max(1), i % c.max(1));
                let base = img * plane * c + ch;
                let vals = (0..plane).filter_map(|p| xd.get(base + p * c).copied());
                self.kind.reduce(vals, plane)
            })
            .collect();
        Ok(smallvec::smallvec![Value::Tensor(crate::nn::from_f64s(
            x.dtype(),
            shape,
            &y
        )?)])
    }
}

/// MaxPool of `x` (`[N, H, W, C]`) into `y` (`[N, OH, OW, C]`), output rows in parallel.
fn max_nhwc(x: &[f32], out: [usize; 2], c: usize, dims: [Dim1; 2], y: &mut [f32]) {
    let [oh, ow] = out;
    let (ih, iw) = (dims[0].0, dims[1].0);
    if c == 0 || ow == 0 || oh == 0 {
        return;
    }
    kiln_kernels::pool::for_each_chunk_mut(y, ow * c, &|r, row| {
        let (img, oy) = (r / oh, r % oh);
        let Some(xi) = x.get(img * ih * iw * c..(img + 1) * ih * iw * c) else {
            row.fill(f32::NAN);
            return;
        };
        kiln_kernels::simd::vectorize_kernel(MaxRow {
            x: xi,
            oy,
            c,
            dims,
            row,
        });
    });
}

/// MaxPool of 8-bit `x` (`[N, H, W, C]`) into `y` (`[N, OH, OW, C]`), output rows in
/// parallel: per output pixel, the first tap inside the input, then the lane-wise maximum with
/// every other (vectorised over the channels). A window with no tap inside the input (pads as
/// large as the kernel, which ONNX does not allow) gives the type's smallest value.
fn max_nhwc_8bit<T: Copy + Ord + Default + Send + Sync + kiln_kernels::quant::Q8>(
    x: &[T],
    out: [usize; 2],
    c: usize,
    dims: [Dim1; 2],
    y: &mut [T],
) {
    let [oh, ow] = out;
    let (ih, iw) = (dims[0].0, dims[1].0);
    if c == 0 || ow == 0 || oh == 0 {
        return;
    }
    let lowest = T::from_clamped(T::LO);
    kiln_kernels::pool::for_each_chunk_mut(y, ow * c, &|r, row| {
        let (img, oy) = (r / oh, r % oh);
        let xi = x.get(img * ih * iw * c..(img + 1) * ih * iw * c).unwrap_or(&[]);
        let ys: smallvec::SmallVec<[usize; 8]> = taps_in(dims[0], oy).collect();
        kiln_kernels::simd::vectorize(|| {
            for (ox, dst) in row.chunks_exact_mut(c).enumerate() {
                dst.fill(lowest);
                for &iy in &ys {
                    for ix in taps_in(dims[1], ox) {
                        let o = (iy * iw + ix) * c;
                        if let Some(src) = xi.get(o..o + c) {
                            dst.iter_mut().zip(src).for_each(|(m, &v)| *m = (*m).max(v));
                        }
                    }
                }
            }
        });
    });
}

kiln_kernels::scratch_kinds! {
    /// [`MaxRow`]'s reduced input row and its windows across (the calling thread's).
    PoolRows: (Vec<f32>, Vec<f32>);
}

/// Channel counts that are multiples of this take [`MaxRow`]'s pixel-by-pixel path (whole
/// vectors per tap); others its row-reduction path.
const L: usize = 16;

/// One output row of [`max_nhwc`].
struct MaxRow<'a> {
    x: &'a [f32],
    oy: usize,
    c: usize,
    dims: [Dim1; 2],
    row: &'a mut [f32],
}

/// The input coordinates of the taps of output `o` in one dim, inside the input.
fn taps_in((size, k, s, d, pb): Dim1, o: usize) -> impl Iterator<Item = usize> {
    (0..k).filter_map(move |t| {
        let i = (o * s + t * d) as isize - pb as isize;
        (i >= 0 && (i as usize) < size).then_some(i as usize)
    })
}

impl kiln_kernels::simd::Kernel for MaxRow<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let MaxRow { x, oy, c, dims, row } = self;
        let iw = dims[1].0;
        let ys: smallvec::SmallVec<[usize; 8]> = taps_in(dims[0], oy).collect();
        // A window inside the row: the input column of its first tap.
        let (_, kw, sw, dw, pb) = dims[1];
        let reach = (kw.max(1) - 1) * dw;
        let inside = |ox: usize| (ox * sw).checked_sub(pb).filter(|&ix0| ix0 + reach < iw);
        if c.is_multiple_of(L) || c > 4 * L {
            // Whole 16-channel blocks, or more than four blocks' worth of any count (a pass over
            // the pixel's channels per tap reads any `c`: PP-LCNet's 200 channels had gone through
            // the dense rows below, which reduce every column of a strided pool's rows, 3.3x
            // OpenVINO's time on its 2x2 stride-2 pool). A pixel whose window lies inside the row
            // (all but the edges) reads its taps at fixed offsets from the window's first column,
            // listed once per output row (the tap-by-tap loop below spent an iterator step, a
            // bounds check and a pass over the pixel's channels per tap: SqueezeNet's 3x3 pool over
            // 111x111x64 0.25 ms against ONNX Runtime's 0.16): up to four blocks each keep their
            // maximum in a register, stored once; more, the pixel's channels in L1 take a pass per
            // tap (the register form measured slower there). The first tap is loaded, the others
            // compared with `v > m`, as below (so NaNs match the reference).
            let offs: smallvec::SmallVec<[usize; 16]> = ys
                .iter()
                .flat_map(|&iy| (0..kw).map(move |t| (iy * iw + t * dw) * c))
                .collect();
            for (ox, out) in row.chunks_exact_mut(c).enumerate() {
                if let (Some(ix0), Some((&o0, rest))) = (inside(ox), offs.split_first()) {
                    let base = ix0 * c;
                    if c <= 4 * L {
                        for (j, dst) in out.chunks_exact_mut(L).enumerate() {
                            let at = |o: usize| x.get(base + o + j * L..base + o + (j + 1) * L);
                            let Some(first) = at(o0) else { continue };
                            let mut m = [0f32; L];
                            m.copy_from_slice(first);
                            for v in rest.iter().filter_map(|&o| at(o)) {
                                // In registers: the select needs no store (see `max_into`).
                                for (a, &t) in m.iter_mut().zip(v) {
                                    *a = if t > *a { t } else { *a };
                                }
                            }
                            dst.copy_from_slice(&m);
                        }
                    } else {
                        let at = |o: usize| x.get(base + o..base + o + c);
                        if let Some(first) = at(o0) {
                            out.copy_from_slice(first);
                        }
                        for v in rest.iter().filter_map(|&o| at(o)) {
                            max_into(out, v);
                        }
                    }
                    continue;
                }
                let mut first = true;
                for &iy in &ys {
                    for ix in taps_in(dims[1], ox) {
                        let o = (iy * iw + ix) * c;
                        let Some(src) = x.get(o..o + c) else { continue };
                        if first {
                            out.copy_from_slice(src);
                            first = false;
                        } else {
                            max_into(out, src);
                        }
                    }
                }
                if first {
                    out.fill(f32::NAN);
                }
            }
            return;
        }
        // Any other channel count: the window's input rows first, reduced into one row of
        // `iw * c` floats (contiguous, so it vectorises whatever `c` is), then each output
        // pixel's taps read from that row. A tap at a time per pixel had copied and compared
        // `c`-float slices (MTCNN's 10 channels: a library copy call and a short loop per
        // tap, ~150 cycles an output pixel). NaN as the reference order gives it: the result
        // is NaN when the window's first tap is, else the largest of the taps that are not
        // NaN, so both passes skip NaNs (`v > m` is false for them) from -inf and the first
        // tap is checked at the end.
        let Some(&y0) = ys.first() else {
            row.fill(f32::NAN);
            return;
        };
        let width = iw * c;
        // Both rows in the thread's scratch (fresh vectors per output row had cost MTCNN's
        // 10-channel pool two allocations a row).
        let mut rows = kiln_kernels::recycle::lend::<PoolRows>();
        let (rmax, h) = &mut *rows;
        rmax.clear();
        rmax.resize(width, f32::NEG_INFINITY);
        for &iy in &ys {
            if let Some(src) = x.get(iy * width..(iy + 1) * width) {
                max_into(rmax, src);
            }
        }
        let top = x.get(y0 * width..(y0 + 1) * width).unwrap_or(&[]);
        // Then the taps across, densely: `h[j]` is the window's result for a window whose
        // first tap is at `j / c`, for every column whose window lies inside the row (the
        // first tap's NaN applied in the same pass), so an inside output pixel is a copy of
        // `c` floats from `h`; the pixels whose windows leave the row go tap by tap.
        h.clear();
        if iw > reach {
            h.extend_from_slice(rmax.get(..(iw - reach) * c).unwrap_or(&[]));
            for t in 1..kw {
                max_into(h, rmax.get(t * dw * c..).unwrap_or(&[]));
            }
            nan_into(h, top);
        }
        for (ox, out) in row.chunks_exact_mut(c).enumerate() {
            if let Some(src) = inside(ox).and_then(|ix0| h.get(ix0 * c..(ix0 + 1) * c)) {
                kiln_kernels::vector::copy_run(out, src);
                continue;
            }
            let mut taps = taps_in(dims[1], ox);
            let Some(x0) = taps.next() else {
                out.fill(f32::NAN);
                continue;
            };
            let at = |ix: usize| ix * c..(ix + 1) * c;
            out.fill(f32::NEG_INFINITY);
            for ix in std::iter::once(x0).chain(taps) {
                if let Some(src) = rmax.get(at(ix)) {
                    max_into(out, src);
                }
            }
            if let Some(first) = top.get(at(x0)) {
                nan_into(out, first);
            }
        }
    }
}

/// AveragePool of f32 X `[N, H, W, C]`: per output pixel, the sum of its taps inside the input
/// (vectorised over the channels, in f32), divided by their count, or with `pad_ends` (for
/// `count_include_pad`) by the count of taps inside the padded extent; NaN for an empty
/// window. Output rows in parallel.
fn avg_nhwc(x: &[f32], out: [usize; 2], c: usize, dims: [Dim1; 2], pad_ends: Option<[usize; 2]>, y: &mut [f32]) {
    let [oh, ow] = out;
    let (ih, iw) = (dims[0].0, dims[1].0);
    if c == 0 || ow == 0 || oh == 0 {
        return;
    }
    // Taps of output `o` inside the padded extent of one dim (`size + pad_begin + pad_end`).
    let counted =
        |(size, k, s, d, pb): Dim1, pe: usize, o: usize| (0..k).filter(|&t| o * s + t * d < pb + size + pe).count();
    kiln_kernels::pool::for_each_chunk_mut(y, ow * c, &|r, row| {
        let (img, oy) = (r / oh, r % oh);
        let Some(xi) = x.get(img * ih * iw * c..(img + 1) * ih * iw * c) else {
            row.fill(f32::NAN);
            return;
        };
        let ys: smallvec::SmallVec<[usize; 8]> = taps_in(dims[0], oy).collect();
        let rc = pad_ends.map(|[pe, _]| counted(dims[0], pe, oy));
        for (ox, out) in row.chunks_exact_mut(c).enumerate() {
            let xs: smallvec::SmallVec<[usize; 8]> = taps_in(dims[1], ox).collect();
            let div = match (rc, pad_ends) {
                (Some(rc), Some([_, pe])) => rc * counted(dims[1], pe, ox),
                _ => ys.len() * xs.len(),
            };
            kiln_kernels::simd::vectorize(|| {
                out.fill(0.0);
                for &iy in &ys {
                    for &ix in &xs {
                        let o = (iy * iw + ix) * c;
                        if let Some(src) = xi.get(o..o + c) {
                            for (a, &v) in out.iter_mut().zip(src) {
                                *a += v;
                            }
                        }
                    }
                }
                let d = div as f32;
                for a in out.iter_mut() {
                    *a = if div == 0 { f32::NAN } else { *a / d };
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::conv_nhwc::tests::to_last;
    use crate::fast::{PoolPlan, eval as run_planned};
    use crate::nn::AutoPad;
    use crate::nn::NnOp;

    /// Runs `op` (a pool) channels-last or as imported.
    fn planned(op: &crate::Op, last: bool, x: &Value) -> crate::Outputs {
        let plan = last.then_some(crate::fast::Plan::Pool(PoolPlan { channels_last: true }));
        run_planned(op, plan.as_ref(), &Args::new(&[Some(x)])).unwrap()
    }

    fn eval(op: &(Pool, bool), shape: &[usize], v: Vec<f32>) -> Tensor {
        let x = Value::Tensor(Tensor::from_vec(shape, v).unwrap());
        let out = planned(&crate::Op::Nn(NnOp::Pool(op.0.clone())), op.1, &x);
        out[0].as_tensor().unwrap().clone()
    }

    #[test]
    fn channels_last_pools_match_the_channels_first_reference() {
        let mut seed = 3u32;
        let mut rnd = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((seed >> 8) % 2001) as f32 / 1000.0 - 1.0
        };
        let cases = [
            // (kind, kernel, strides, dilations, pads, ceil_mode, [n, c, h, w])
            (
                PoolKind::Max { storage_order: false },
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                false,
                [2, 19, 11, 9],
            ),
            // Whole 16-channel blocks: the register path inside the rows, tap by tap at the
            // edges.
            (
                PoolKind::Max { storage_order: false },
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                false,
                [2, 32, 9, 10],
            ),
            // Five blocks (a pass over the pixel's channels per tap), dilated across, padded
            // unevenly.
            (
                PoolKind::Max { storage_order: false },
                [2, 3],
                [1, 2],
                [1, 2],
                [0, 1, 1, 0],
                false,
                [1, 80, 6, 13],
            ),
            (
                PoolKind::Max { storage_order: false },
                [2, 3],
                [1, 2],
                [2, 1],
                [0, 1, 1, 0],
                true,
                [1, 5, 7, 8],
            ),
            (
                PoolKind::Max { storage_order: false },
                [3, 3],
                [3, 3],
                [1, 1],
                [0, 0, 0, 0],
                true,
                [1, 3, 7, 7],
            ),
            // Seventy channels (more than four blocks, not whole ones): a pass over the
            // pixel's channels per tap, strided, with a ceil-mode window past the edge.
            (
                PoolKind::Max { storage_order: false },
                [2, 2],
                [2, 2],
                [1, 1],
                [0, 0, 0, 0],
                true,
                [2, 70, 3, 9],
            ),
            // Ten channels (MTCNN's), dilated across, padded unevenly: the dense row passes
            // for the windows inside a row, tap by tap at its ends.
            (
                PoolKind::Max { storage_order: false },
                [2, 3],
                [2, 1],
                [1, 2],
                [1, 2, 0, 1],
                false,
                [1, 10, 9, 12],
            ),
            (
                PoolKind::Max { storage_order: false },
                [2, 2],
                [2, 2],
                [1, 1],
                [0, 0, 0, 0],
                true,
                [2, 10, 7, 9],
            ),
            (
                PoolKind::Average {
                    count_include_pad: true,
                },
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                false,
                [1, 4, 6, 6],
            ),
            // Inception's 3x3 stride-1 average, padded, both divisor rules; a ceil-mode
            // window past the padding.
            (
                PoolKind::Average {
                    count_include_pad: false,
                },
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                false,
                [2, 19, 7, 8],
            ),
            (
                PoolKind::Average {
                    count_include_pad: true,
                },
                [3, 2],
                [2, 2],
                [1, 1],
                [1, 0, 0, 1],
                true,
                [1, 5, 8, 7],
            ),
        ];
        for (kind, k, s, d, p, ceil, xs) in cases {
            let first = Pool {
                kind,
                auto_pad: AutoPad::NotSet,
                ceil_mode: ceil,
                dilations: d.to_vec(),
                kernel_shape: k.to_vec(),
                pads: p.to_vec(),
                strides: s.to_vec(),
            };
            let (first, last) = ((first.clone(), false), (first, true));
            let total = xs.iter().product();
            let mut x: Vec<f32> = (0..total).map(|_| rnd()).collect();
            // A NaN first tap and a later NaN tap, as the reference orders them.
            x[0] = f32::NAN;
            x[total / 2] = f32::NAN;
            if matches!(kind, PoolKind::Max { .. }) {
                // NaNs all over: first taps, later taps of a window's first row, other rows.
                for v in x.iter_mut().skip(5).step_by(23) {
                    *v = f32::NAN;
                }
            }
            let want = eval(&first, &xs, x.clone());
            let &[n, c, oh, ow] = want.shape() else { panic!() };
            let got = eval(&last, &[xs[0], xs[2], xs[3], xs[1]], to_last(&x, xs));
            assert_eq!(got.shape(), &[n, oh, ow, c]);
            let want = to_last(want.as_slice::<f32>().unwrap(), [n, c, oh, ow]);
            for (g, w) in got.as_slice::<f32>().unwrap().iter().zip(&want) {
                assert!(
                    g.to_bits() == w.to_bits() || (g - w).abs() < 1e-6,
                    "{kind:?}: {g} vs {w}"
                );
            }
            assert!(want.iter().any(|v| v.is_nan()) || !matches!(kind, PoolKind::Max { .. }) || ceil);
            // Both f32 paths against the f64 reference evaluation of the same values.
            let x64 = Value::Tensor(
                Tensor::from_vec(&xs[..], x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>()).unwrap(),
            );
            let reference = first.0.eval(&Args::new(&[Some(&x64)])).unwrap();
            let reference = reference[0].as_tensor().unwrap().to_f64_vec();
            let reference: Vec<f32> = to_last(&reference.iter().map(|&v| v as f32).collect::<Vec<_>>(), [n, c, oh, ow]);
            for (g, r) in got.as_slice::<f32>().unwrap().iter().zip(&reference) {
                assert!(
                    g.to_bits() == r.to_bits() || (g - r).abs() <= 1e-6 * (1.0 + r.abs()),
                    "{kind:?} against f64: {g} vs {r}"
                );
            }
        }
    }

    /// 8-bit MaxPool channels-last (the bytes pooled directly) against the channels-first
    /// evaluation of the same values: u8 and i8, padded and strided, ceil mode, channel counts
    /// below and past a vector, on a two-thread pool.
    #[test]
    fn channels_last_8_bit_max_pools_match_channels_first() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (k, s, p, ceil, xs) in [
            ([3, 3], [2, 2], [1, 1, 1, 1], false, [1, 64, 12, 11]),
            ([3, 2], [1, 2], [1, 0, 1, 1], true, [2, 5, 7, 9]),
        ] {
            let op = Pool {
                kind: PoolKind::Max { storage_order: false },
                auto_pad: AutoPad::NotSet,
                ceil_mode: ceil,
                dilations: vec![1, 1],
                kernel_shape: k.to_vec(),
                pads: p.to_vec(),
                strides: s.to_vec(),
            };
            let op = crate::Op::Nn(NnOp::Pool(op));
            let total: usize = xs.iter().product();
            let bytes: Vec<u8> = (0..total).map(|i| ((i * 7919 + 13) % 251) as u8).collect();
            let signed: Vec<i8> = bytes.iter().map(|&b| b.wrapping_sub(128) as i8).collect();
            let last_shape = [xs[0], xs[2], xs[3], xs[1]];
            for (first_x, last_x) in [
                (
                    Tensor::from_vec(&xs[..], bytes.clone()).unwrap(),
                    Tensor::from_vec(&last_shape[..], to_last(&bytes, xs)).unwrap(),
                ),
                (
                    Tensor::from_vec(&xs[..], signed.clone()).unwrap(),
                    Tensor::from_vec(&last_shape[..], to_last(&signed, xs)).unwrap(),
                ),
            ] {
                let want = planned(&op, false, &Value::Tensor(first_x));
                let want = want[0].as_tensor().unwrap();
                let &[n, c, oh, ow] = want.shape() else { panic!() };
                let got = pool.install(|| planned(&op, true, &Value::Tensor(last_x)));
                let got = got[0].as_tensor().unwrap();
                assert_eq!(got.shape(), &[n, oh, ow, c]);
                assert_eq!(got.dtype(), want.dtype());
                let want = to_last(&want.to_f64_vec(), [n, c, oh, ow]);
                assert_eq!(got.to_f64_vec(), want);
                assert!(want.iter().any(|&v| v != want[0]));
            }
        }
    }

    /// Global pooling channels-last (f32 Average and Max on the row loop, Lp and f64 on the
    /// strided fallback) against the channels-first evaluation, with a NaN in one plane; two
    /// images by image, and one large image on two threads by channel ranges (32 + 8).
    #[test]
    fn channels_last_global_pools_match_channels_first() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for xs in [[2, 21, 3, 5], [1, 40, 50, 40]] {
            global_pools_case(&pool, xs);
        }
    }

    fn global_pools_case(pool: &kiln_kernels::pool::ThreadPool, xs: [usize; 4]) {
        let mut seed = 5u32;
        let total: usize = xs.iter().product();
        let mut x: Vec<f32> = (0..total)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                ((seed >> 8) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        x[17] = f32::NAN;
        for kind in [
            GlobalPoolKind::Average,
            GlobalPoolKind::Max,
            GlobalPoolKind::Lp { p: 3.0 },
        ] {
            let op = crate::Op::Nn(NnOp::GlobalPool(GlobalPool::new(kind)));
            let (first, last) = (false, true);
            let run = |last: &bool, shape: &[usize], v: Vec<f32>| {
                let x = Value::Tensor(Tensor::from_vec(shape, v).unwrap());
                pool.install(|| planned(&op, *last, &x)[0].as_tensor().unwrap().clone())
            };
            let want = run(&first, &xs, x.clone());
            let got = run(&last, &[xs[0], xs[2], xs[3], xs[1]], to_last(&x, xs));
            assert_eq!(got.shape(), &[xs[0], 1, 1, xs[1]]);
            let (g, w) = (got.as_slice::<f32>().unwrap(), want.as_slice::<f32>().unwrap());
            assert_eq!(g.len(), w.len());
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                assert!(
                    (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                    "{kind:?} [{i}]: {g} vs {w}"
                );
            }
            // Flat 17 of X (channels-first) is NaN: its channel's average is NaN, its max
            // skips it (Lp's f64 powers carry it).
            let nan_channel = (17 / (xs[2] * xs[3])) % xs[1];
            assert_eq!(g[nan_channel].is_nan(), kind != GlobalPoolKind::Max);
            let plan = crate::fast::Plan::Pool(PoolPlan { channels_last: last });
            let inferred = crate::fast::infer(
                &op,
                Some(&plan),
                &[InferInput {
                    ty: &ValueType::Tensor(crate::value::TensorType::fixed(DType::F32, &[2, 3, 5, 21])),
                    konst: None,
                    present: true,
                }],
            )
            .unwrap();
            assert_eq!(
                inferred[0],
                ValueType::Tensor(crate::value::TensorType::fixed(DType::F32, &[2, 1, 1, 21]))
            );
        }
    }
}
