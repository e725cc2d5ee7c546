//! Channels-last 2-D convolution: a `Conv` whose plan sets `channels_last` (the compiler's
//! `layout` pass), X `[N, H, W, C]`, residual and Y `[N, OH, OW, M]`.
//!
//! Three paths, chosen from the op and the operands:
//! - **packed** (`ConvPlan::packed`, group 1, f32): a GEMM whose A is the im2col matrix in its
//!   natural channels-last order (one row per output pixel: the `kh x kw` windows of `C`
//!   contiguous channels) and whose B is the weights packed at compile time. A 1x1, stride-1,
//!   unpadded convolution reads X itself as A (no copy at all); the others copy row blocks of
//!   A that fit in L2 (in parallel over the pool, each block multiplied by its own thread).
//!   Bias (per column), residual and activation run in the GEMM epilogue. When many taps
//!   read only padding (a dilated window on a small image), the output pixels are grouped by
//!   the taps that read the image and each group multiplies over those alone
//!   ([`Geometry::tap_classes`], B's rows gathered in place). With
//!   `x_channels_first` (an image stem), X is `[N, C, H, W]` and each block is gathered
//!   transposed instead, one row per tap (a strided walk along an input row), which the GEMM
//!   reads as a transposed A.
//! - **depthwise** (f32, `group == C == M`): a direct loop vectorised over channels
//!   ([`super::depthwise::Depthwise::run_nhwc`]): contiguous channel runs, no padded copy.
//! - **grouped** (f32, `1 < group`, not depthwise, no residual): per output pixel and block of
//!   16 outputs, a direct loop over the taps and the group's input channels
//!   (`kiln_kernels::grouped`), W tap-major `[kh * kw, cg, M]` (packed at compile time);
//!   the pixels split by the taps inside the image, so no padded copy.
//! - everything else (other types, group shapes without a vector form, unpacked weights): the channels-first
//!   evaluation between two transposes (the reference semantics, exact but not fast).

use super::conv::{Planned, f32_bias, f32_residual};
use super::{ConvPlan, PackedConvWeights, PostAffine};
use crate::error::{OpError, Result};
use crate::movement::Transpose;
use crate::nn::{input_shape, numel, tensor_type};
use crate::util;
use crate::value::{Args, Dim, InferInput, Value, ValueType};
use kiln_kernels::conv::Conv2d;
use kiln_kernels::recycle::lend;
use kiln_tensor::{DType, Tensor};

kiln_kernels::scratch_kinds! {
    /// A block of im2col rows of the packed path.
    Rows: Vec<f32>;
    /// A block's product before it is copied into Y (the packed path's tap classes).
    RegionOut: Vec<f32>;
}

/// Floats of im2col rows copied per block (128 KiB: the block, the B panels it meets and its
/// C rows stay in Zen 4's 1 MiB L2).
const BLOCK_FLOATS: usize = 32 * 1024;
/// Weights (B) larger than this many floats (1 MiB) do not stay in L2 between row blocks.
const B_L2_FLOATS: usize = 256 * 1024;
/// Weights of the output channels a grouped convolution computes per sweep of its rows
/// (256 KiB, a quarter of Zen 4's L2).
const GROUPED_L2_FLOATS: usize = 64 * 1024;
/// Smallest row block when B does not stay in L2.
const B_ROWS: usize = 256;

/// Channels-first `[N, C, H, W]` to channels-last `[N, H, W, C]`, and back.
pub(crate) const TO_LAST: [i64; 4] = [0, 2, 3, 1];
pub(crate) const TO_FIRST: [i64; 4] = [0, 3, 1, 2];

pub(crate) fn transpose(v: &Value, perm: [i64; 4]) -> Result<Value> {
    let t = Transpose {
        perm: Some(perm.to_vec()),
    };
    let inputs = [Some(v)];
    Ok(Value::Tensor(t.apply(Args::new(&inputs).tensor(0)?)?))
}

/// A depthwise W `[c, 1, kh, kw]` tap-major, `[kh * kw, c]`: the order the channels-last
/// depthwise kernel reads (`PackedConvWeights { m: c, c: 1, kh, kw }` on a Conv with
/// `group == c`).
pub fn pack_depthwise_taps(w: &[f32], c: usize, kh: usize, kw: usize) -> Result<Vec<f32>> {
    let taps = kh * kw;
    let n = numel(&[taps, c])?;
    if w.len() != n {
        return Err(OpError::input_value(
            1,
            format!("the {n} weights of a depthwise W [{c}, 1, {kh}, {kw}]"),
            format!("{} weights", w.len()),
        ));
    }
    let mut wt = vec![0.0f32; n];
    for (ch, src) in w.chunks_exact(taps.max(1)).enumerate() {
        for (t, &v) in src.iter().enumerate() {
            if let Some(d) = wt.get_mut(t * c + ch) {
                *d = v;
            }
        }
    }
    Ok(wt)
}

/// W `[m, c, kh, kw]` (row-major) as a channels-last Conv's packed weights: the GEMM's B,
/// `[kh*kw*c, m]` with rows in (ky, kx, c) order, in `f32/nr32/v1` panels.
pub fn pack_channels_last(w: &[f32], pk: PackedConvWeights) -> Result<Vec<f32>> {
    use kiln_kernels::gemm::MatLayout;
    use kiln_kernels::sgemm::{BLayout, PackedB};
    let PackedConvWeights { m, c, kh, kw } = pk;
    let (taps, k) = (kh * kw, numel(&[kh, kw, c])?);
    let n = numel(&[m, k])?;
    if n != w.len() {
        return Err(OpError::input_value(
            1,
            format!("the {n} weights of W [{m}, {c}, {kh}, {kw}]"),
            format!("{} weights", w.len()),
        ));
    }
    // B[(t * c + ci), mo] = W[mo, ci, t] for tap t = ky * kw + kx.
    let mut b = vec![0.0f32; w.len()];
    for (mo, filter) in w.chunks_exact(k.max(1)).enumerate() {
        for (ci, window) in filter.chunks_exact(taps.max(1)).enumerate() {
            for (t, &v) in window.iter().enumerate() {
                if let Some(d) = b.get_mut((t * c + ci) * m + mo) {
                    *d = v;
                }
            }
        }
    }
    let p = PackedB::pack(BLayout::NR32, k, m, &b, MatLayout::row_major(m))
        .map_err(|e| OpError::input_value(1, format!("weights packable as W [{m}, {c}, {kh}, {kw}]"), e))?;
    Ok(p.view().data().to_vec())
}

/// X's type made channels-first (`[N, H, W, C]` to `[N, C, H, W]`) for the channels-first
/// inference; `Ok(None)` when its shape is unknown, an error unless it has rank 4 (or unknown
/// when it has symbols: evaluation names the shape then).
pub(crate) fn x_type_first(inputs: &[InferInput<'_>], what: &str) -> Result<Option<ValueType>> {
    let dtype = util::input_dtype(inputs, 0);
    let Some(xs) = input_shape(inputs, 0) else {
        return Ok(None);
    };
    let [n, h, w, c] = xs.as_slice() else {
        return match xs
            .iter()
            .map(crate::recurrent::num::fixed)
            .collect::<Option<Vec<usize>>>()
        {
            Some(fixed) => Err(OpError::input_shape(
                0,
                format!("[N, H, W, C] (a channels-last {what})"),
                &fixed,
            )),
            None => Ok(None),
        };
    };
    Ok(Some(tensor_type(
        dtype,
        Some(vec![n.clone(), c.clone(), h.clone(), w.clone()]),
    )))
}

/// A channels-first output type (`[N, C, H, W]`) made channels-last.
pub(crate) fn type_to_last(t: ValueType) -> ValueType {
    match t {
        ValueType::Tensor(t) => {
            let shape = match t.shape.as_deref() {
                Some([n, c, h, w]) => Some(vec![n.clone(), h.clone(), w.clone(), c.clone()]),
                _ => None,
            };
            tensor_type(t.dtype, shape)
        }
        other => other,
    }
}

/// The first output of a channels-first evaluation, transposed to channels-last.
pub(crate) fn output_to_last(y: crate::Outputs, what: &'static str) -> Result<crate::Outputs> {
    // Every channels-first evaluation gives its output first.
    let y = y.first().ok_or(OpError::Plan {
        op: what,
        plan: "nhwc".into(),
        reason: "the channels-first evaluation gave no output",
    })?;
    Ok(smallvec::smallvec![transpose(y, TO_LAST)?])
}

/// X, W, the bias and the residual, and whether all present ones are f32.
fn operands<'a>(args: &Args<'a>) -> Result<([&'a Tensor; 2], [Option<&'a Tensor>; 2], bool)> {
    let (x, w, b, r) = (
        args.tensor(0)?,
        args.tensor(1)?,
        args.opt_tensor(2)?,
        args.opt_tensor(3)?,
    );
    let f32s = |t: &Tensor| t.dtype() == DType::F32;
    Ok((
        [x, w],
        [b, r],
        f32s(x) && f32s(w) && b.is_none_or(f32s) && r.is_none_or(f32s),
    ))
}

/// The geometry of one channels-last call, from the op's attributes and the operands: the
/// image count, output channels and the 2-D window (`Conv2d`, whose `k()` is also a
/// channels-last im2col row: `kh * kw * c` values).
pub(crate) struct Geometry {
    batch: usize,
    m: usize,
    conv: Conv2d,
}

impl std::ops::Deref for Geometry {
    type Target = Conv2d;
    fn deref(&self) -> &Conv2d {
        &self.conv
    }
}

impl Geometry {
    /// Output pixels (rows of A and of Y).
    fn rows(&self) -> usize {
        self.batch * self.oh * self.ow
    }

    /// The depthwise window of this geometry (its `c` channels each their own group).
    pub(crate) fn depthwise(&self) -> super::depthwise::Depthwise {
        super::depthwise::Depthwise {
            channels: self.c,
            input: [self.ih, self.iw],
            output: [self.oh, self.ow],
            kernel: [self.kh, self.kw],
            strides: [self.sh, self.sw],
            dilations: [self.dh, self.dw],
            pad_begin: [self.ph, self.pw],
        }
    }

    /// The kernel rows that read the image (not only the padding) for some output pixel in
    /// `r0 .. r0 + n`: an interval, as the input row grows with both the output row and the
    /// kernel row. A dilated window on a small image (DeepLab's ASPP: dilation 12-36 on
    /// 33 rows) has whole blocks of output rows whose first or last kernel rows read only
    /// padding; their products are skipped.
    fn live_kernel_rows(&self, r0: usize, n: usize) -> std::ops::Range<usize> {
        let plane = self.oh * self.ow;
        if n == 0 || plane == 0 || self.ow == 0 {
            return 0..self.kh;
        }
        let (first, last) = (r0, r0 + n - 1);
        if first / plane != last / plane {
            // Rows of two images: every output row occurs.
            return 0..self.kh;
        }
        let (oy0, oy1) = (first % plane / self.ow, last % plane / self.ow);
        live_taps(oy0, oy1, self.sh, self.dh, self.ph, self.ih, self.kh)
    }

    /// The output pixels grouped by the kernel taps that read the image for them (not only
    /// the padding), when multiplying each group over its own taps saves at least an eighth
    /// of the products: a dilated window on a small image (DeepLab's ASPP, dilation 12-36 on
    /// 33 x 49 pixels) reads padding through a third to two thirds of its taps. The bands of
    /// rows and of columns with one interval of live taps each make rectangles; a rectangle
    /// of fewer than [`MIN_CLASS_PIXELS`] pixels joins the others of its kind in one group
    /// over the hull of their taps (its product would stream the weights for a handful of
    /// rows). `None` when that is not worth it (an ordinary padded 3x3 on a wide image).
    fn tap_classes(&self) -> Option<Vec<TapClass>> {
        let (rows, dead_rows) = bands(self.oh, self.sh, self.dh, self.ph, self.ih, self.kh);
        let (cols, dead_cols) = bands(self.ow, self.sw, self.dw, self.pw, self.iw, self.kw);
        if (dead_rows == 0 && dead_cols == 0) || self.oh == 0 || self.ow == 0 {
            return None;
        }
        // Each class' taps and rectangles (rows, columns); the small rectangles last.
        type Rects = smallvec::SmallVec<[(std::ops::Range<usize>, std::ops::Range<usize>); 4]>;
        let mut classes: Vec<(std::ops::Range<usize>, std::ops::Range<usize>, Rects)> = Vec::new();
        let mut rest: Option<(std::ops::Range<usize>, std::ops::Range<usize>, Rects)> = None;
        let hull = |a: &std::ops::Range<usize>, b: &std::ops::Range<usize>| match (a.is_empty(), b.is_empty()) {
            (true, _) => b.clone(),
            (_, true) => a.clone(),
            _ => a.start.min(b.start)..a.end.max(b.end),
        };
        for r in &rows {
            for c in &cols {
                let rect = (r.o0..r.o1, c.o0..c.o1);
                if (r.o1 - r.o0) * (c.o1 - c.o0) >= MIN_CLASS_PIXELS {
                    classes.push((r.taps.clone(), c.taps.clone(), smallvec::smallvec![rect]));
                    continue;
                }
                let t = rest.get_or_insert_with(|| (0..0, 0..0, Rects::new()));
                t.0 = hull(&t.0, &r.taps);
                t.1 = hull(&t.1, &c.taps);
                t.2.push(rect);
            }
        }
        classes.extend(rest);
        let full = self.oh * self.ow * self.kh * self.kw;
        let work: usize = classes
            .iter()
            .map(|(kys, kxs, rects)| {
                let pixels: usize = rects.iter().map(|(ys, xs)| ys.len() * xs.len()).sum();
                pixels * kys.len() * kxs.len()
            })
            .sum();
        if work * 8 > full * 7 {
            return None;
        }
        Some(
            classes
                .into_iter()
                .map(|(kys, kxs, rects)| TapClass {
                    kys,
                    kxs,
                    pixels: rects
                        .into_iter()
                        .flat_map(|(ys, xs)| ys.flat_map(move |oy| xs.clone().map(move |ox| (oy, ox))))
                        .collect(),
                })
                .collect(),
        )
    }

    /// The im2col rows of image `n`'s output pixels `pixels` over the taps `kys` x `kxs`
    /// (rows of `kys.len() * kxs.len() * C`), zeros where a tap reads the padding.
    fn fill_taps(
        &self,
        x: &[f32],
        n: usize,
        pixels: &[(usize, usize)],
        kys: std::ops::Range<usize>,
        kxs: std::ops::Range<usize>,
        a: &mut [f32],
    ) -> bool {
        let c = self.c;
        let run = kxs.len() * c;
        let k = kys.len() * run;
        if k == 0 {
            return true;
        }
        pixels
            .iter()
            .zip(a.chunks_exact_mut(k))
            .all(|(&(oy, ox), row)| self.fill_pixel(x, n, oy, ox, kys.clone(), kxs.clone(), row))
    }

    /// One im2col row: for each tap `(ky, kx)` in `kys` x `kxs`, in order, the `C` channels of
    /// input pixel `(oy*sh + ky*dh - ph, ox*sw + kx*dw - pw)` of image `n`, or zeros in the
    /// padding. With no dilation, the taps of one kernel row that all fall inside the input
    /// are one copy. `false` if X is shorter than the geometry says.
    #[allow(clippy::too_many_arguments)]
    fn fill_pixel(
        &self,
        x: &[f32],
        n: usize,
        oy: usize,
        ox: usize,
        kys: std::ops::Range<usize>,
        kxs: std::ops::Range<usize>,
        row: &mut [f32],
    ) -> bool {
        let c = self.c;
        let run = kxs.len() * c;
        if run == 0 {
            return true;
        }
        let x0 = (ox * self.sw + kxs.start * self.dw) as isize - self.pw as isize;
        let inside_x = x0 >= 0 && x0 as usize + (kxs.len() - 1) * self.dw < self.iw;
        for (ky, dst) in kys.zip(row.chunks_exact_mut(run)) {
            let iy = (oy * self.sh + ky * self.dh) as isize - self.ph as isize;
            if iy < 0 || iy as usize >= self.ih {
                dst.fill(0.0);
                continue;
            }
            let base = (n * self.ih + iy as usize) * self.iw;
            if inside_x && self.dw == 1 {
                let s = (base + x0 as usize) * c;
                let Some(src) = x.get(s..s + run) else { return false };
                kiln_kernels::vector::copy_run(dst, src);
                continue;
            }
            for (j, d) in dst.chunks_exact_mut(c).enumerate() {
                let ix = x0 + (j * self.dw) as isize;
                if ix < 0 || ix as usize >= self.iw {
                    d.fill(0.0);
                    continue;
                }
                let s = (base + ix as usize) * c;
                let Some(src) = x.get(s..s + c) else { return false };
                kiln_kernels::vector::copy_run(d, src);
            }
        }
        true
    }

    /// A 1x1, stride-1, unpadded window: A is X itself.
    fn is_pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.sh == 1 && self.sw == 1 && self.oh == self.ih && self.ow == self.iw
    }

    /// When every im2col row of an image is one contiguous run of channels-last X, the rows
    /// per image and the step between their starts, so A is X read as overlapping windows
    /// (no copy): the kernel spans X's whole unpadded width and slides down the height with no
    /// dilation (CREPE's `[512, 1]` kernels on one-column images), or X is one row high and
    /// the window slides along the width (every 1-D convolution, run as a 2-D one of height
    /// 1). Every window must lie inside the image (no padding on the sliding axis).
    fn windows(&self) -> Option<(usize, usize)> {
        let c = self.c;
        let down = self.kw == self.iw
            && self.pw == 0
            && self.ow == 1
            && (self.kw == 1 || self.dw == 1)
            && self.dh == 1
            && self.ph == 0
            && self.oh >= 1
            && (self.oh - 1) * self.sh + self.kh <= self.ih;
        if down {
            return Some((self.oh, self.sh * self.iw * c));
        }
        let along = self.ih == 1
            && self.kh == 1
            && self.ph == 0
            && self.oh == 1
            && self.dw == 1
            && self.pw == 0
            && self.ow >= 1
            && (self.ow - 1) * self.sw + self.kw <= self.iw;
        along.then_some((self.ow, self.sw * c))
    }

    /// Writes the im2col rows `r0 .. r0 + a.len() / k` of X (`[N, H, W, C]`) into `a`:
    /// row `(n, oy, ox)` holds, for each tap `(ky, kx)` in order, the `C` channels of input
    /// pixel `(oy*sh + ky*dh - ph, ox*sw + kx*dw - pw)`, or zeros in the padding. With no
    /// dilation, the taps of one kernel row that all fall inside the input are one copy.
    /// Returns `false` if X is shorter than the geometry says.
    fn fill_rows(&self, x: &[f32], r0: usize, a: &mut [f32]) -> bool {
        self.fill_rows_of(x, r0, 0..self.kh, a)
    }

    /// [`Geometry::fill_rows`] with kernel rows `kys` only (rows of `kys.len() * kw * C`).
    fn fill_rows_of(&self, x: &[f32], r0: usize, kys: std::ops::Range<usize>, a: &mut [f32]) -> bool {
        let (c, plane) = (self.c, self.oh * self.ow);
        let k = kys.len() * self.kw * c;
        if k == 0 || plane == 0 || self.ow == 0 {
            return true;
        }
        if self.c == 1 && self.dw == 1 {
            return self.fill_rows_one_channel(x, r0, kys, a);
        }
        // The pixel's coordinates advance with the row (three divisions per pixel cost more
        // than its copies when a row is short: a one-channel 3x3's 9 floats).
        let (mut n, mut oy, mut ox) = (r0 / plane, r0 % plane / self.ow, r0 % self.ow);
        for row in a.chunks_exact_mut(k) {
            if !self.fill_pixel(x, n, oy, ox, kys.clone(), 0..self.kw, row) {
                return false;
            }
            ox += 1;
            if ox == self.ow {
                ox = 0;
                oy += 1;
                if oy == self.oh {
                    oy = 0;
                    n += 1;
                }
            }
        }
        true
    }

    /// [`Geometry::fill_rows_of`] for one input channel without dilation along the width (a
    /// spectrogram's first convolution): a row of A is `kw` floats per kernel row, so the
    /// pixels of one output row whose window lies inside the width are filled a column of A
    /// at a time, each a strided copy of one input row; the pixels at the edges go through
    /// [`Geometry::fill_pixel`]. Per pixel, where the pixel at a time spent ~60 cycles on
    /// bookkeeping for 9 floats.
    fn fill_rows_one_channel(&self, x: &[f32], r0: usize, kys: std::ops::Range<usize>, a: &mut [f32]) -> bool {
        let (kw, plane) = (self.kw, self.oh * self.ow);
        let k = kys.len() * kw;
        let rows = a.len() / k.max(1);
        // Output columns whose whole window is inside the width: `ox * sw >= pw` and
        // `ox * sw + kw - 1 - pw < iw`.
        let lo = self.pw.div_ceil(self.sw.max(1));
        let hi = if self.iw + self.pw >= kw {
            ((self.iw + self.pw - kw) / self.sw.max(1) + 1).min(self.ow)
        } else {
            0
        };
        let mut r = 0;
        while r < rows {
            let p = r0 + r;
            let (n, oy, ox0) = (p / plane, p % plane / self.ow, p % self.ow);
            // This output row's pixels from `ox0` on, as far as A goes.
            let len = (self.ow - ox0).min(rows - r);
            let Some(seg) = a.get_mut(r * k..(r + len) * k) else {
                return false;
            };
            // The interior pixels of this segment: `i0..i1`, empty when `i1 == i0`.
            let i0 = lo.clamp(ox0, ox0 + len);
            let i1 = hi.clamp(i0, ox0 + len);
            for (j, ox) in (ox0..ox0 + len).enumerate() {
                if (i0..i1).contains(&ox) {
                    continue;
                }
                let Some(row) = seg.get_mut(j * k..(j + 1) * k) else {
                    return false;
                };
                if !self.fill_pixel(x, n, oy, ox, kys.clone(), 0..kw, row) {
                    return false;
                }
            }
            if i0 < i1 {
                let Some(inner) = seg.get_mut((i0 - ox0) * k..(i1 - ox0) * k) else {
                    return false;
                };
                for (q, ky) in kys.clone().enumerate() {
                    let iy = (oy * self.sh + ky * self.dh) as isize - self.ph as isize;
                    if iy < 0 || iy as usize >= self.ih {
                        for row in inner.chunks_exact_mut(k) {
                            row.get_mut(q * kw..(q + 1) * kw)
                                .into_iter()
                                .flatten()
                                .for_each(|v| *v = 0.0);
                        }
                        continue;
                    }
                    let start = (n * self.ih + iy as usize) * self.iw + i0 * self.sw - self.pw;
                    let span = (i1 - i0 - 1) * self.sw + kw;
                    let Some(src) = x.get(start..start + span) else {
                        return false;
                    };
                    // Pixel by pixel: `kw` consecutive floats each, as fixed-size moves (a
                    // strided walk per column of A compiled to an iterator loop of ~10
                    // cycles a float).
                    let sw = self.sw.max(1);
                    for (j, row) in inner.chunks_exact_mut(k).enumerate() {
                        let (Some(d), Some(s)) = (row.get_mut(q * kw..(q + 1) * kw), src.get(j * sw..j * sw + kw))
                        else {
                            return false;
                        };
                        kiln_kernels::vector::copy_run(d, s);
                    }
                }
            }
            r += len;
        }
        true
    }
}

/// The kernel taps along one axis (`0..taps`) that read the image for some output position
/// in `o0..=o1`: an interval, as the input position `o * stride + t * dilation - pad` grows
/// with both. Tap `t` is live when `o1 * stride + t * dilation >= pad` and `o0 * stride + t *
/// dilation < input + pad`; for a single position (`o0 == o1`) exactly the taps inside.
fn live_taps(
    o0: usize,
    o1: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    input: usize,
    taps: usize,
) -> std::ops::Range<usize> {
    let live = |t: usize| o1 * stride + t * dilation >= pad && o0 * stride + t * dilation < input + pad;
    let lo = (0..taps).find(|&t| live(t)).unwrap_or(taps);
    let hi = (lo..taps).rev().find(|&t| live(t)).map_or(lo, |t| t + 1);
    lo..hi
}

/// Output pixels `(oy, ox)` multiplied over the taps `kys` x `kxs` only (see
/// [`Geometry::tap_classes`]).
#[derive(Debug, Clone, PartialEq)]
struct TapClass {
    kys: std::ops::Range<usize>,
    kxs: std::ops::Range<usize>,
    pixels: Vec<(usize, usize)>,
}

/// Fewest pixels a rectangle of one tap interval needs to be a product of its own.
const MIN_CLASS_PIXELS: usize = 64;

/// The packed path over tap classes ([`Geometry::tap_classes`]) of channels-last X: per
/// image and class, blocks of up to `block` of its pixels, each multiplied over the class'
/// taps only (B's matching rows gathered in place) into a buffer of its own, then copied
/// into its rows of Y, adding the residual (then the activation) there when one is given.
/// Blocks run in parallel over the pool. Returns `false` if an operand is shorter than the
/// geometry says.
#[allow(clippy::too_many_arguments)]
fn run_tap_classes(
    geo: &Geometry,
    classes: &[TapClass],
    x: &[f32],
    packed: kiln_kernels::sgemm::PackedBRef<'_>,
    epi: kiln_kernels::sgemm::Epilogue<'_>,
    residual: Option<&[f32]>,
    y: &mut [f32],
    block: usize,
) -> bool {
    use kiln_kernels::sgemm::{AMatrix, sgemm};
    let (c, m, block) = (geo.c, geo.m, block.max(1));
    // (image, class, its pixels) of every block.
    let tasks: Vec<(usize, &TapClass, &[(usize, usize)])> = (0..geo.batch)
        .flat_map(|n| {
            classes
                .iter()
                .flat_map(move |t| t.pixels.chunks(block).map(move |p| (n, t, p)))
        })
        .collect();
    let gemm_epi = kiln_kernels::sgemm::Epilogue {
        act: if residual.is_some() { None } else { epi.act },
        post: if residual.is_some() { None } else { epi.post },
        prelu: if residual.is_some() {
            kiln_kernels::sgemm::Bias::None
        } else {
            epi.prelu
        },
        ..epi
    };
    let y = std::sync::Mutex::new(y);
    let failed = std::sync::atomic::AtomicBool::new(false);
    kiln_kernels::pool::parallel_for(tasks.len(), &|t| {
        let Some(&(n, class, pixels)) = tasks.get(t) else {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        let kb = class.kys.len() * class.kxs.len() * c;
        let ranges: smallvec::SmallVec<[std::ops::Range<usize>; 8]> = class
            .kys
            .clone()
            .map(|ky| (ky * geo.kw + class.kxs.start) * c..(ky * geo.kw + class.kxs.end) * c)
            .collect();
        let rows = pixels.len();
        let mut a = lend::<Rows>();
        a.resize(rows * kb, 0.0);
        let mut ok = geo.fill_taps(x, n, pixels, class.kys.clone(), class.kxs.clone(), &mut a);
        let b = if kb == 0 {
            packed.rows(0, 0)
        } else {
            packed.gather(&ranges)
        };
        let mut out = lend::<RegionOut>();
        out.resize(rows * m, 0.0);
        ok = ok && b.is_some_and(|b| sgemm(rows, AMatrix::row_major(&a, kb), b, &mut out, m, &gemm_epi).is_ok());
        drop(a);
        if ok {
            let mut y = y.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Runs of pixels consecutive in Y, each copied at once.
            let mut i = 0;
            while i < rows && ok {
                let Some(&(oy, ox)) = pixels.get(i) else { break };
                let mut j = i + 1;
                while pixels.get(j).is_some_and(|&(y2, x2)| y2 == oy && x2 == ox + (j - i)) {
                    j += 1;
                }
                let at = ((n * geo.oh + oy) * geo.ow + ox) * m;
                let len = (j - i) * m;
                ok = match (y.get_mut(at..at + len), out.get(i * m..i * m + len)) {
                    (Some(dst), Some(src)) => {
                        dst.copy_from_slice(src);
                        match residual.map(|r| r.get(at..at + len)) {
                            Some(Some(r)) => {
                                kiln_kernels::sgemm::residual_act(dst, Some(r), epi.act);
                                if let kiln_kernels::sgemm::Bias::Col(s) = epi.prelu {
                                    kiln_kernels::vector::prelu_channels(dst, s);
                                }
                                if let Some(p) = epi.post {
                                    p.apply_slice(dst);
                                }
                                true
                            }
                            Some(None) => false,
                            None => true,
                        }
                    }
                    _ => false,
                };
                i = j;
            }
        }
        if !ok {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    !failed.load(std::sync::atomic::Ordering::Relaxed)
}

/// Output positions `o0..o1` along one axis whose live kernel taps are `taps` (see
/// [`Geometry::tap_classes`]).
#[derive(Debug, Clone, PartialEq)]
struct Band {
    o0: usize,
    o1: usize,
    taps: std::ops::Range<usize>,
}

/// The bands of `out` output positions along an axis (consecutive positions with the same
/// live taps, see [`live_taps`]) and the count of dead (position, tap) pairs.
fn bands(
    out: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    input: usize,
    taps: usize,
) -> (smallvec::SmallVec<[Band; 8]>, usize) {
    let mut bands: smallvec::SmallVec<[Band; 8]> = smallvec::SmallVec::new();
    let mut dead = 0usize;
    for o in 0..out {
        let live = live_taps(o, o, stride, dilation, pad, input, taps);
        dead += taps - live.len();
        match bands.last_mut() {
            Some(b) if b.taps == live => b.o1 = o + 1,
            _ => bands.push(Band {
                o0: o,
                o1: o + 1,
                taps: live,
            }),
        }
    }
    (bands, dead)
}

/// `dst[j] = src[j * step]` for every `j` (false if `src` is too short): a copy for step 1,
/// pairs for step 2 (which the compiler vectorises as a deinterleave), else a strided walk.
#[inline(always)]
fn gather(src: &[f32], step: usize, dst: &mut [f32]) -> bool {
    let n = dst.len();
    if n == 0 {
        return true;
    }
    if src.len() <= (n - 1) * step {
        return false;
    }
    match step {
        1 => match src.get(..n) {
            Some(s) => dst.copy_from_slice(s),
            None => return false,
        },
        2 => {
            let pairs = (src.len() / 2).min(n);
            dst.iter_mut().zip(src.chunks_exact(2)).for_each(|(d, p)| *d = p[0]);
            if let (Some(d), Some(&v)) = (dst.get_mut(pairs), src.get(pairs * 2)) {
                *d = v;
            }
        }
        _ => dst.iter_mut().zip(src.iter().step_by(step)).for_each(|(d, &v)| *d = v),
    }
    true
}

impl Geometry {
    /// Writes the transposed im2col block for output pixels `r0 .. r0 + n` of a channels-first
    /// X (`[N, C, H, W]`) into `a` (`k x n`, row `p` = tap `(ky, kx)` and channel `ci` in the
    /// packed weights' (ky, kx, c) order, so `a[p * n + i]` is that tap's input value for
    /// pixel `r0 + i`, or zero in the padding). The block is cut into runs of output pixels of
    /// one output row; for each run (its position computed once) every row `p` gets a strided
    /// walk along one input row. Returns `false` if X is shorter than the geometry says.
    #[inline(always)]
    fn fill_columns(&self, x: &[f32], r0: usize, n: usize, a: &mut [f32]) -> bool {
        let (c, plane, ow) = (self.c, self.oh * self.ow, self.ow);
        if plane == 0 || ow == 0 || c == 0 || n == 0 {
            return true;
        }
        if a.len() != self.k() * n {
            return false;
        }
        let (sw, iw) = (self.sw.max(1), self.iw as isize);
        let mut i = 0;
        while i < n {
            let pix = r0 + i;
            let (img, oy, ox0) = (pix / plane, pix % plane / ow, pix % ow);
            let len = (ow - ox0).min(n - i);
            let end = ox0 + len;
            for ky in 0..self.kh {
                let iy = (oy * self.sh + ky * self.dh) as isize - self.ph as isize;
                let inside = iy >= 0 && (iy as usize) < self.ih;
                for kx in 0..self.kw {
                    // Output column `ox` reads input column `ox * sw + kx * dw - pw`: zero
                    // before column `lo` and from `hi` on, a strided run in between.
                    let off = (kx * self.dw) as isize - self.pw as isize;
                    let lo = if off >= 0 {
                        0
                    } else {
                        (-off).unsigned_abs().div_ceil(sw)
                    }
                    .clamp(ox0, end);
                    let hi = if iw <= off {
                        0
                    } else {
                        (iw - off).unsigned_abs().div_ceil(sw)
                    }
                    .clamp(lo, end);
                    let from = ((lo * sw) as isize + off).max(0).unsigned_abs();
                    for ci in 0..c {
                        let p = (ky * self.kw + kx) * c + ci;
                        let Some(seg) = a.get_mut(p * n + i..p * n + i + len) else {
                            return false;
                        };
                        if !inside {
                            seg.fill(0.0);
                            continue;
                        }
                        let start = ((img * c + ci) * self.ih + iy as usize) * self.iw;
                        let Some(row) = x.get(start..start + self.iw) else {
                            return false;
                        };
                        let (head, rest) = seg.split_at_mut(lo - ox0);
                        let (mid, tail) = rest.split_at_mut(hi - lo);
                        head.fill(0.0);
                        tail.fill(0.0);
                        if !gather(row.get(from..).unwrap_or(&[]), sw, mid) {
                            return false;
                        }
                    }
                }
            }
            i += len;
        }
        true
    }
}

/// [`Geometry::fill_columns`] as a kernel compiled for the active level (as a closure it was
/// left as a call compiled for the baseline: SSE shuffles for the stride-2 walk).
struct FillColumns<'a> {
    geo: &'a Geometry,
    x: &'a [f32],
    r0: usize,
    n: usize,
    a: &'a mut [f32],
}

impl kiln_kernels::simd::Kernel for FillColumns<'_> {
    type Output = bool;
    #[inline(always)]
    fn run(self) -> bool {
        self.geo.fill_columns(self.x, self.r0, self.n, self.a)
    }
}

/// Fewest output rows per image of a batch whose windows run as one GEMM per image: a batch
/// of images of few windows each (an STFT over 31 chunks of audio: 5 windows a chunk) is
/// better copied into one im2col A of every image's rows than run as one GEMM per image: a
/// 5-row GEMM streams all of B for 5 rows (64 -> 100+ GFLOP/s).
const WINDOWS_MIN_ROWS: usize = 64;

/// How a packed channels-last call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A 1x1 stride-1 window: A is X itself.
    Pointwise,
    /// Every image's im2col rows are X read as overlapping windows (rows per image, step).
    Windows(usize, usize),
    /// [`narrow_direct`]: at most [`DIRECT_MAX_M`] output channels.
    Direct,
    /// `kiln_kernels::planar`: few output channels, pixels along the vector lanes.
    Planar,
    /// `kiln_kernels::stem`: few input channels (an image stem), output channels along the
    /// lanes, no im2col.
    Stem,
    /// Blocks of im2col rows (or tap classes), each multiplied by one thread.
    Blocks,
}

/// The operands and epilogue of one packed channels-last call (see
/// [`Planned::packed_nhwc`]).
struct PackedCall<'a> {
    geo: Geometry,
    pk: PackedConvWeights,
    packed: kiln_kernels::sgemm::PackedBRef<'a>,
    xd: &'a [f32],
    x_shape: kiln_tensor::Shape,
    rd: Option<&'a [f32]>,
    bias: kiln_kernels::sgemm::Bias<'a>,
    act: Option<kiln_kernels::sgemm::Act>,
    post: Option<kiln_kernels::sgemm::Affine>,
    prelu: kiln_kernels::sgemm::Bias<'a>,
    /// X is channels-first with more than one channel: A's blocks are gathered transposed
    /// (one row per tap, one column per pixel).
    cf: bool,
}

impl<'a> PackedCall<'a> {
    /// The convolution's output shape `[N, OH, OW, M]`.
    fn shape(&self) -> kiln_tensor::Shape {
        let g = &self.geo;
        kiln_tensor::smallvec::smallvec![g.batch, g.oh, g.ow, g.m]
    }

    /// The error for X that does not fit the packed weights.
    fn misfit(&self) -> OpError {
        let pk = self.pk;
        OpError::input_shape(
            0,
            format!(
                "a shape that fits the packed weights [{}, {}, {}, {}]",
                pk.m, pk.c, pk.kh, pk.kw
            ),
            &self.x_shape,
        )
    }

    fn route(&self) -> Route {
        use kiln_kernels::sgemm::BLayout;
        let (geo, cf) = (&self.geo, self.cf);
        let (k, m) = (geo.k(), geo.m);
        if geo.is_pointwise() && !cf {
            return Route::Pointwise;
        }
        if let (false, Some((per_image, step))) = (cf, geo.windows())
            && (geo.batch == 1 || per_image >= WINDOWS_MIN_ROWS)
        {
            return Route::Windows(per_image, step);
        }
        if m > DIRECT_MAX_M
            && kiln_kernels::planar::takes_direct(m, geo.c, [geo.kh, geo.kw], geo.ow)
            && kiln_kernels::planar::supported()
        {
            return Route::Planar;
        }
        if kiln_kernels::stem::takes(m, geo.c, [geo.kh, geo.kw], geo.ow) && kiln_kernels::stem::supported() {
            return Route::Stem;
        }
        if !cf
            && m <= DIRECT_MAX_M
            && k >= DIRECT_MIN_K
            && geo.dw == 1
            && self.rd.is_none()
            && self.packed.data().len() >= k * BLayout::NR32.nr()
        {
            return Route::Direct;
        }
        Route::Blocks
    }

    /// The epilogue with `residual`.
    fn epilogue<'r>(&self, residual: Option<kiln_kernels::sgemm::Residual<'r>>) -> kiln_kernels::sgemm::Epilogue<'r>
    where
        'a: 'r,
    {
        kiln_kernels::sgemm::Epilogue {
            bias: self.bias,
            residual,
            act: self.act,
            post: self.post,
            prelu: self.prelu,
        }
    }

    /// Rows of A a block: each block streams all of B, so when B outgrows the L2 cache,
    /// blocks get at least B_ROWS rows and B's traffic is paid over many rows (deep layers
    /// have few rows and large weights). With several blocks and threads, the block count is
    /// made a multiple of the threads (blocks shrink a little) so each thread's contiguous
    /// group is equal (MobileNet-v2's stem: 11 blocks had split 6/5 over two threads).
    fn block(&self) -> usize {
        let (k, m, rows) = (self.geo.k(), self.geo.m, self.geo.rows());
        let mut block = (BLOCK_FLOATS / k.max(1)).next_multiple_of(8).max(8);
        if k * m > B_L2_FLOATS {
            block = block.max(B_ROWS);
        }
        let mut block = block.min(rows.next_multiple_of(8));
        let threads = kiln_kernels::pool::current_threads();
        if threads > 1 && rows > block {
            let blocks = rows.div_ceil(block).next_multiple_of(threads);
            let even = rows.div_ceil(blocks).next_multiple_of(8);
            if k * m <= B_L2_FLOATS || even >= B_ROWS {
                block = even;
            }
        }
        block
    }

    /// A block of A for output pixels `r0 .. r0 + n`: im2col rows from channels-last X, or
    /// the transposed block gathered from channels-first X. `false` if X is short.
    fn fill(&self, r0: usize, n: usize, a: &mut [f32]) -> bool {
        if self.cf {
            kiln_kernels::simd::vectorize_kernel(FillColumns {
                geo: &self.geo,
                x: self.xd,
                r0,
                n,
                a,
            })
        } else {
            self.geo.fill_rows(self.xd, r0, a)
        }
    }

    /// A block of `n` rows and depth `k` as the GEMM's A.
    fn a_block<'b>(&self, a: &'b [f32], n: usize, k: usize) -> kiln_kernels::sgemm::AMatrix<'b> {
        if self.cf {
            kiln_kernels::sgemm::AMatrix::transposed(a, n)
        } else {
            kiln_kernels::sgemm::AMatrix::row_major(a, k)
        }
    }

    /// Output pixels `r0 .. r0 + out.len() / M` into `out`, as one block of A made and
    /// multiplied by the calling thread. Channels-last X: only the kernel rows that read
    /// the image for this block, and the matching rows of the packed weights (taps are
    /// ordered (ky, kx, c)). `false` when X or the residual is shorter than the geometry.
    fn rows(&self, r0: usize, out: &mut [f32]) -> bool {
        use kiln_kernels::sgemm::{Residual, sgemm};
        let geo = &self.geo;
        let (k, m) = (geo.k(), geo.m);
        let nrows = out.len() / m.max(1);
        let kys = if self.cf {
            0..geo.kh
        } else {
            geo.live_kernel_rows(r0, nrows)
        };
        let per_row = geo.kw * geo.c;
        let mut a = lend::<Rows>();
        let kb = kys.len() * per_row;
        a.resize(nrows * kb, 0.0);
        let (mut ok, b) = if kb == k {
            (self.fill(r0, nrows, &mut a), Some(self.packed))
        } else {
            (
                geo.fill_rows_of(self.xd, r0, kys.clone(), &mut a),
                self.packed.rows(kys.start * per_row, kys.end * per_row),
            )
        };
        let residual = match self.rd {
            Some(r) => r.get(r0 * m..).map(|data| Residual { data, ld: m }),
            None => None,
        };
        ok &= self.rd.is_none() || residual.is_some();
        let epi = self.epilogue(residual);
        match b {
            Some(b) => ok && sgemm(nrows, self.a_block(&a, nrows, kb), b, out, m, &epi).is_ok(),
            None => false,
        }
    }
}

impl Planned<'_> {
    /// The channels-last evaluation (see the module docs).
    pub(crate) fn eval_channels_last(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        if let Some(info) = self.plan.winograd {
            return Ok(smallvec::smallvec![self.eval_winograd(args, info, None)?.into()]);
        }
        let x = args.tensor(0)?;
        if x.rank() != 4 {
            return Err(OpError::input_shape(
                0,
                "[N, H, W, C] (a channels-last Conv)",
                x.shape(),
            ));
        }
        if let Some(pw) = self.plan.packed
            && self.group.max(1) == 1
        {
            return Ok(smallvec::smallvec![self.packed_nhwc(args, pw, None)?.into()]);
        }
        if !self.plan.x_channels_first
            && let Some(y) = self.depthwise_nhwc(args)?
        {
            return Ok(smallvec::smallvec![y.into()]);
        }
        // The paths below leave a scale and shift after the activation to `post_after`.
        if self.plan.post.is_some() {
            return self.post_after(args);
        }
        if !self.plan.x_channels_first
            && let Some(y) = self.grouped_nhwc(args)?
        {
            return Ok(smallvec::smallvec![y.into()]);
        }
        // The reference: the channels-first evaluation between transposes.
        let (xv, wv) = match (args.value(0), args.value(1)) {
            (Some(x), Some(w)) => (x, w),
            (None, _) => return Err(OpError::MissingInput { index: 0 }),
            (_, None) => return Err(OpError::MissingInput { index: 1 }),
        };
        // X as it is when it already is channels-first, else its transpose.
        let transposed = (!self.plan.x_channels_first)
            .then(|| transpose(xv, TO_FIRST))
            .transpose()?;
        let xt = transposed.as_ref().unwrap_or(xv);
        let rt = args.value(3).map(|r| transpose(r, TO_FIRST)).transpose()?;
        let first = self.with(ConvPlan {
            channels_last: false,
            x_channels_first: false,
            ..self.plan
        });
        let inputs = [Some(xt), Some(wv), args.value(2), rt.as_ref()];
        output_to_last(first.eval(&Args::new(&inputs))?, "Conv")
    }

    /// The output type: the channels-first inference on the permuted X (and the weight shape
    /// `packed` records), permuted back.
    pub(crate) fn infer_channels_last(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let dtype = util::input_dtype(inputs, 0);
        let xt = if self.plan.x_channels_first {
            inputs.first().map(|i| i.ty.clone())
        } else {
            x_type_first(inputs, "Conv")?
        };
        let Some(xt) = xt else {
            return Ok(vec![util::dtype_only(dtype)]);
        };
        let wt = match self.plan.packed {
            Some(p) => tensor_type(
                dtype,
                Some([p.m, p.c, p.kh, p.kw].into_iter().map(Dim::Fixed).collect()),
            ),
            None => inputs.get(1).map_or(ValueType::Unknown, |i| i.ty.clone()),
        };
        let first = self.with(ConvPlan {
            channels_last: false,
            x_channels_first: false,
            packed: None,
            ..self.plan
        });
        let ins = [&xt, &wt].map(|ty| InferInput {
            ty,
            konst: None,
            present: true,
        });
        Ok(first.infer(&ins)?.into_iter().map(type_to_last).collect())
    }

    /// The geometry of a channels-last call on X `xs` with weights `[m, c_per_group, kh, kw]`.
    pub(crate) fn geometry_nhwc(&self, xs: &[usize], m: usize, cg: usize, kh: usize, kw: usize) -> Result<Geometry> {
        let &[batch, ih, iw, c] = xs else {
            return Err(OpError::input_shape(0, "[N, H, W, C] (a channels-last Conv)", xs));
        };
        let conv = self
            .window(&[batch, c, ih, iw], &[m, cg, kh, kw])?
            .conv2d(c, ih, iw)
            .ok_or_else(|| OpError::input_shape(0, "[N, H, W, C] (a channels-last Conv)", xs))?;
        Ok(Geometry { batch, m, conv })
    }

    /// The operands and epilogue of a packed channels-last call, checked against the packed
    /// weights.
    fn packed_call<'b>(
        &self,
        args: &Args<'b>,
        pk: PackedConvWeights,
        slopes: Option<&'b [f32]>,
    ) -> Result<PackedCall<'b>> {
        use kiln_kernels::sgemm::{BLayout, Bias, PackedBRef};
        let ([x, w], [b, r], f32s) = operands(args)?;
        if !f32s {
            return Err(self.misfit("packed weights take f32 X, bias and residual"));
        }
        if self.group.max(1) != 1 {
            return Err(OpError::attribute("group", "1 (the weights are packed)", self.group));
        }
        let geo = match (self.plan.x_channels_first, x.shape()) {
            (true, &[n, c, h, w]) => self.geometry_nhwc(&[n, h, w, c], pk.m, pk.c, pk.kh, pk.kw)?,
            (true, xs) => {
                return Err(OpError::input_shape(0, "[N, C, H, W] (X left channels-first)", xs));
            }
            (false, xs) => self.geometry_nhwc(xs, pk.m, pk.c, pk.kh, pk.kw)?,
        };
        if geo.c != pk.c {
            return Err(OpError::input_shape(
                0,
                format!("{} channels, as the packed weights", pk.c),
                x.shape(),
            ));
        }
        // One input channel: X channels-first is X channels-last, byte for byte (an STFT's
        // audio), and takes the channels-last paths (windows read in place, im2col rows).
        let cf = self.plan.x_channels_first && geo.c != 1;
        let (k, m) = (geo.k(), geo.m);
        let packed = PackedBRef::new(BLayout::NR32, k, m, w.as_slice::<f32>()?).map_err(|e| {
            OpError::input_value(
                1,
                format!("weights packed for W [{m}, {}, {}, {}]", pk.c, pk.kh, pk.kw),
                e,
            )
        })?;
        let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![geo.batch, geo.oh, geo.ow, m];
        Ok(PackedCall {
            rd: f32_residual(r, &shape)?,
            bias: f32_bias(b, m, 2)?.map_or(Bias::None, Bias::Col),
            act: self.plan.activation.map(|a| a.kernel_act()),
            post: self.plan.post.map(PostAffine::kernel),
            prelu: slopes.map_or(Bias::None, Bias::Col),
            xd: x.as_slice::<f32>()?,
            x_shape: kiln_tensor::Shape::from_slice(x.shape()),
            pk,
            geo,
            packed,
            cf,
        })
    }

    /// The packed GEMM path (see the module docs).
    pub(super) fn packed_nhwc(&self, args: &Args<'_>, pk: PackedConvWeights, slopes: Option<&[f32]>) -> Result<Tensor> {
        use kiln_kernels::sgemm::{AMatrix, Bias, Residual, sgemm};
        let call = self.packed_call(args, pk, slopes)?;
        let PackedCall {
            ref geo,
            packed,
            xd,
            rd,
            bias,
            act,
            post,
            cf,
            ..
        } = call;
        let (k, m) = (geo.k(), geo.m);
        let shape = call.shape();
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        let rows = geo.rows();
        if y.is_empty() {
            return Ok(Tensor::from_buf(shape, y)?);
        }
        let bad = || call.misfit();
        match call.route() {
            Route::Pointwise => {
                let epi = call.epilogue(rd.map(|data| Residual { data, ld: m }));
                sgemm(rows, AMatrix::row_major(xd, k), packed, &mut y, m, &epi).map_err(|_| bad())?;
                return Ok(Tensor::from_buf(shape, y)?);
            }
            Route::Windows(per_image, step) => {
                // One GEMM per image on X's own overlapping rows (it splits its rows over the pool).
                let image = geo.ih * geo.iw * geo.c;
                for (n, out) in y.chunks_exact_mut(per_image * m).enumerate() {
                    let xi = xd.get(n * image..(n + 1) * image).ok_or_else(bad)?;
                    let residual = match rd {
                        Some(r) => Some(Residual {
                            data: r.get(n * per_image * m..).ok_or_else(bad)?,
                            ld: m,
                        }),
                        None => None,
                    };
                    let epi = call.epilogue(residual);
                    sgemm(per_image, AMatrix::windows(xi, step), packed, out, m, &epi).map_err(|_| bad())?;
                }
                return Ok(Tensor::from_buf(shape, y)?);
            }
            Route::Direct => {
                let bias = match bias {
                    Bias::Col(v) => Some(v),
                    _ => None,
                };
                if !narrow_direct(geo, xd, packed.data(), bias, &mut y) {
                    return Err(bad());
                }
                if let Some(a) = act {
                    kiln_kernels::sgemm::act_slice(a, &mut y);
                }
                if let Some(s) = slopes {
                    kiln_kernels::vector::prelu_channels(&mut y, s);
                }
                if let Some(p) = post {
                    p.apply_slice(&mut y);
                }
                return Ok(Tensor::from_buf(shape, y)?);
            }
            Route::Planar => {
                let epi = call.epilogue(rd.map(|data| Residual { data, ld: m }));
                if !kiln_kernels::planar::run(geo, m, xd, cf, &packed, &mut y, &epi, kiln_kernels::planar::rows) {
                    return Err(bad());
                }
                return Ok(Tensor::from_buf(shape, y)?);
            }
            Route::Stem => {
                let epi = call.epilogue(rd.map(|data| Residual { data, ld: m }));
                if !kiln_kernels::planar::run(geo, m, xd, cf, &packed, &mut y, &epi, kiln_kernels::stem::rows) {
                    return Err(bad());
                }
                return Ok(Tensor::from_buf(shape, y)?);
            }
            Route::Blocks => {}
        }
        let block = call.block();
        if let (false, Some(classes)) = (cf, geo.tap_classes()) {
            let ok = run_tap_classes(geo, &classes, xd, packed, call.epilogue(None), rd, &mut y, block);
            if !ok {
                return Err(bad());
            }
            return Ok(Tensor::from_buf(shape, y)?);
        }
        if rows <= block {
            // One block: the GEMM itself splits its rows over the pool.
            let mut a = lend::<Rows>();
            a.resize(rows * k, 0.0);
            let ok = call.fill(0, rows, &mut a);
            let epi = call.epilogue(rd.map(|data| Residual { data, ld: m }));
            let ok = ok && sgemm(rows, call.a_block(&a, rows, k), packed, &mut y, m, &epi).is_ok();
            drop(a);
            if !ok {
                return Err(bad());
            }
            return Ok(Tensor::from_buf(shape, y)?);
        }
        let failed = std::sync::atomic::AtomicBool::new(false);
        kiln_kernels::pool::for_each_chunk_mut(&mut y, block * m, &|bi, out| {
            if !call.rows(bi * block, out) {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(bad());
        }
        Ok(Tensor::from_buf(shape, y)?)
    }

    /// The depthwise path: f32, `group == C`, W `[C, 1, kh, kw]`, or W already tap-major
    /// `[kh * kw * C]` when `packed` says so (see [`pack_depthwise_taps`]). `None` when the
    /// call is not of that kind.
    fn depthwise_nhwc(&self, args: &Args<'_>) -> Result<Option<Tensor>> {
        let ([x, w], [b, r], f32s) = operands(args)?;
        if self.plan.packed.is_some_and(|pk| pk.c > 1 || self.group != pk.m) {
            // Grouped weights, tap-major: the grouped path's.
            return Ok(None);
        }
        if !f32s || r.is_some() {
            if self.plan.packed.is_some() {
                return Err(self.misfit("tap-major depthwise weights take f32 X and bias, no residual"));
            }
            return Ok(None);
        }
        let (xs, ws) = (x.shape(), w.shape());
        let (c, kh, kw) = match (xs, ws, self.plan.packed) {
            (&[_, _, _, c], _, Some(pk)) if pk.m == c && pk.c == 1 && ws == [pk.kh * pk.kw * c] => (c, pk.kh, pk.kw),
            (&[_, _, _, c], &[wm, 1, kh, kw], None) if wm == c => (c, kh, kw),
            (_, _, Some(pk)) => {
                return Err(OpError::inputs(
                    0,
                    1,
                    format!(
                        "X [N, H, W, {}] and W of {} taps x {} channels, as the tap-major weights",
                        pk.m,
                        pk.kh * pk.kw,
                        pk.m
                    ),
                    xs,
                    ws,
                ));
            }
            _ => return Ok(None),
        };
        if self.group != c || c == 0 {
            if self.plan.packed.is_some() {
                return Err(OpError::attribute(
                    "group",
                    format!("X's {c} channels (depthwise tap-major weights)"),
                    self.group,
                ));
            }
            return Ok(None);
        }
        let geo = self.geometry_nhwc(xs, c, 1, kh, kw)?;
        let dw = geo.depthwise();
        let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![geo.batch, geo.oh, geo.ow, c];
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        let (xd, wd) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        // The taps channels-last too: `[kh * kw, C]` (packed at compile time, or here).
        let wt = match self.plan.packed {
            Some(_) => std::borrow::Cow::Borrowed(wd),
            None => std::borrow::Cow::Owned(pack_depthwise_taps(wd, c, kh, kw)?),
        };
        let bd = f32_bias(b, c, 2)?;
        let act = self.plan.activation.map(|a| a.kernel_act());
        let (ip, op) = (geo.ih * geo.iw * c, geo.oh * geo.ow * c);
        for n in 0..geo.batch {
            let (Some(xi), Some(yi)) = (xd.get(n * ip..(n + 1) * ip), y.get_mut(n * op..(n + 1) * op)) else {
                return Ok(None);
            };
            if !dw.run_nhwc(xi, &wt, bd, (act, self.plan.post.map(PostAffine::kernel)), yi) {
                return Err(OpError::inputs(0, 1, "X and W that fit a depthwise Conv", xs, ws));
            }
        }
        Ok(Some(Tensor::from_buf(shape, y)?))
    }
}

impl Planned<'_> {
    /// The grouped path (see the module docs): f32, `group > 1` and not depthwise (`C` groups
    /// of one channel to one output each, which has its own kernel), no residual; W `[m,
    /// cg, kh, kw]`, or tap-major `[kh * kw * cg * m]` when `packed` says so
    /// ([`kiln_kernels::grouped::pack_taps`]). `None` when the call is not of that kind, or
    /// its group shape has no vector form and W is not packed (the reference is then as
    /// fast).
    fn grouped_nhwc(&self, args: &Args<'_>) -> Result<Option<Tensor>> {
        use kiln_kernels::grouped::{self, Pixels as GroupPixels};
        let ([x, w], [b, r], f32s) = operands(args)?;
        let (xs, ws) = (x.shape(), w.shape());
        let g = self.group.max(1);
        let (m, cg, kh, kw) = match (ws, self.plan.packed) {
            (_, Some(pk)) => (pk.m, pk.c, pk.kh, pk.kw),
            (&[m, cg, kh, kw], None) => (m, cg, kh, kw),
            _ => return Ok(None),
        };
        let c = xs.get(3).copied().unwrap_or(0);
        let depthwise = cg == 1 && m == c;
        let fits = f32s && r.is_none() && g > 1 && !depthwise && cg * g == c && m.is_multiple_of(g);
        if !fits || (self.plan.packed.is_none() && grouped::lanes(cg, m / g).is_none()) {
            if let Some(pk) = self.plan.packed
                && !(pk.c == 1 && pk.m == c)
            {
                return Err(if !f32s {
                    self.misfit("tap-major grouped weights take f32 X and bias")
                } else if r.is_some() {
                    self.misfit("tap-major grouped weights take no residual")
                } else if g < 2 {
                    OpError::attribute("group", ">= 2 (the weights are grouped tap-major)", self.group)
                } else if c != pk.c * g {
                    OpError::input_shape(
                        0,
                        format!("[N, H, W, {}] (group {g} x the weights' {} channels)", pk.c * g, pk.c),
                        xs,
                    )
                } else {
                    OpError::attribute(
                        "group",
                        format!("a divisor of the weights' {} outputs", pk.m),
                        self.group,
                    )
                });
            }
            return Ok(None);
        }
        let mg = m / g;
        let geo = self.geometry_nhwc(xs, m, cg, kh, kw)?;
        let shape: kiln_tensor::Shape = kiln_tensor::smallvec::smallvec![geo.batch, geo.oh, geo.ow, m];
        // Every element is written below: a recycled buffer needs no clearing.
        let mut y = crate::util::out_f32(numel(&shape)?);
        let (xd, wd) = (x.as_slice::<f32>()?, w.as_slice::<f32>()?);
        let bad = || OpError::inputs(0, 1, format!("X and W that fit a Conv of group {g}"), xs, ws);
        let wt = match self.plan.packed {
            Some(_) => std::borrow::Cow::Borrowed(wd),
            None => std::borrow::Cow::Owned(grouped::pack_taps(wd, m, cg, kh, kw).ok_or_else(bad)?),
        };
        if wt.len() != kh * kw * cg * m {
            return Err(bad());
        }
        let bd = f32_bias(b, m, 2)?;
        let (clamp, after) = super::depthwise::split_act(self.plan.activation.map(|a| a.kernel_act()));
        if y.is_empty() {
            return Ok(Some(Tensor::from_buf(shape, y)?));
        }
        // The image is read in place: the output pixels are split into classes by the
        // kernel rows and columns whose taps fall inside the image (a 3x3 window with pads
        // of 1: the interior, four edges, four corners), and each class runs with only those
        // taps from its first one, so no tap reads padding and no padded copy is made (the
        // copy of a stride-2 layer's input was a third of its time).
        let (c_, iw_) = (c, geo.iw);
        let (kh_, kw_, dh, dw) = (kh, kw, geo.dh, geo.dw);
        let rows_in = |oy: usize| live_taps(oy, oy, geo.sh, dh, geo.ph, geo.ih, kh_);
        let cols_in: Vec<std::ops::Range<usize>> = (0..geo.ow)
            .map(|ox| live_taps(ox, ox, geo.sw, dw, geo.pw, iw_, kw_))
            .collect();
        let pixel = GroupPixels {
            x: &[],
            w: &wt,
            bias: bd,
            window: &[],
            bases: &[],
            dsts: None,
            cg,
            mg,
            m,
            outs: [0, m],
            clamp,
        };
        // Outputs in ranges whose weights (`kh*kw*cg` floats each) stay in L2 while a band of
        // pixels is swept (ResNeXt's 14x14 -> 7x7 layer has 1.2 MB of weights), in multiples
        // of 64 (the kernel's 4-block tiles) and of the group (the kernel shares each input
        // among a group's blocks counted from the group's start).
        let per_out = (kh * kw * cg).max(1);
        let unit = (64 / gcd(64, mg).max(1)).saturating_mul(mg).max(64);
        let span = (GROUPED_L2_FLOATS / per_out / unit * unit).max(unit);
        let (ip, op, row_len) = (geo.ih * geo.iw * c, geo.oh * geo.ow * m, geo.ow * m);
        // Bands of rows, one per thread (each thread sweeps its own pixels through every
        // range); a small layer is one band on the calling thread, as a depthwise one is.
        let threads = kiln_kernels::pool::current_threads().max(1);
        let bands = if op * cg * kh * kw < super::depthwise::DW_PAR_MIN_MACS {
            1
        } else {
            threads.min(geo.oh)
        };
        let band_rows = geo.oh.div_ceil(bands.max(1)).max(1);
        let failed = std::sync::atomic::AtomicBool::new(false);
        for n in 0..geo.batch {
            let (Some(xi), Some(yi)) = (xd.get(n * ip..(n + 1) * ip), y.get_mut(n * op..(n + 1) * op)) else {
                return Err(bad());
            };
            let band = |bi: usize, band: &mut [f32]| {
                let oy0 = bi * band_rows;
                let rows = band.len() / row_len.max(1);
                // The band's pixel classes: (kernel rows, kernel columns) inside the image,
                // each with its pixels' first-tap offsets and output offsets in the band.
                let mut classes: Vec<GroupedClass> = Vec::new();
                for r in 0..rows {
                    let ys = rows_in(oy0 + r);
                    for (ox, xs) in cols_in.iter().enumerate() {
                        let (ylo, xlo) = (ys.start, xs.start);
                        let key = [ys.start, ys.end, xs.start, xs.end];
                        let at = match classes.iter().position(|k| k.key == key) {
                            Some(i) => i,
                            None => {
                                classes.push(GroupedClass::new(key, [dh * iw_ * c_, dw * c_], kw_, cg * m));
                                classes.len() - 1
                            }
                        };
                        let Some(class) = classes.get_mut(at) else {
                            continue;
                        };
                        // The first tap's input pixel (inside the image when the class has taps).
                        let iy = ((oy0 + r) * geo.sh + ylo * dh).saturating_sub(geo.ph);
                        let ix = (ox * geo.sw + xlo * dw).saturating_sub(geo.pw);
                        class.bases.push(if class.window.is_empty() {
                            0
                        } else {
                            (iy * iw_ + ix) * c_
                        });
                        class.dsts.push((r * geo.ow + ox) * m);
                    }
                }
                for o in (0..m).step_by(span) {
                    for class in &classes {
                        let call = GroupPixels {
                            x: xi,
                            window: &class.window,
                            bases: &class.bases,
                            dsts: Some(&class.dsts),
                            outs: [o, (o + span).min(m)],
                            ..pixel
                        };
                        if !call.run(band) {
                            failed.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
                if let Some(a) = after {
                    kiln_kernels::sgemm::act_slice(a, band);
                }
            };
            if bands <= 1 {
                band(0, yi);
            } else {
                kiln_kernels::pool::for_each_chunk_mut(yi, band_rows * row_len, &band);
            }
        }
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(bad());
        }
        Ok(Some(Tensor::from_buf(shape, y)?))
    }
}

/// The greatest common divisor (`gcd(a, 0) = a`).
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The output pixels of a grouped convolution's band that read the same taps: `key` is
/// `[first kernel row, end row, first column, end column]` inside the image, `window` those
/// taps' (input offset from the first tap, weight offset), `bases` each pixel's first-tap
/// input offset, `dsts` its output offset in the band.
struct GroupedClass {
    key: [usize; 4],
    window: Vec<(usize, usize)>,
    bases: Vec<usize>,
    dsts: Vec<usize>,
}

impl GroupedClass {
    /// A class with no pixels yet: `step` is the input offset of one kernel row and one
    /// kernel column (dilation included), `per_tap` the weights of one tap.
    fn new(key: [usize; 4], step: [usize; 2], kw: usize, per_tap: usize) -> Self {
        let [ylo, yhi, xlo, xhi] = key;
        let window = (ylo..yhi)
            .flat_map(|ky| {
                (xlo..xhi).map(move |kx| ((ky - ylo) * step[0] + (kx - xlo) * step[1], (ky * kw + kx) * per_tap))
            })
            .collect();
        GroupedClass {
            key,
            window,
            bases: Vec::new(),
            dsts: Vec::new(),
        }
    }
}

/// Output channels up to which a channels-last convolution runs as direct dot products
/// ([`narrow_direct`]).
const DIRECT_MAX_M: usize = 4;
/// Shallowest depth (taps x channels) [`narrow_direct`] takes.
const DIRECT_MIN_K: usize = 32;

kiln_kernels::scratch_kinds! {
    /// [`narrow_direct`]'s weights as columns over the depth (the calling thread's).
    DirectCols: Vec<f32>;
}

/// A channels-last convolution to at most [`DIRECT_MAX_M`] channels with no dilation along
/// the width (a transcription or segmentation head's k x k convolution to one map): each
/// output is its bias plus, for every kernel row that reads the image, one dot product of
/// the row's taps inside the image (a contiguous run of X, all channels) with the matching
/// run of W's column. No im2col row is written; the GEMM had copied one per pixel and spent
/// 31 of its 32 tile columns on padding (basic-pitch's 5x5 and 3x7 heads: 5 GFLOP/s).
/// `w` is the packed B of one 32-column panel (`w[q * 32 + j]`); rows of output pixels go
/// over the pool. `false` when X or W is shorter than the geometry says.
fn narrow_direct(geo: &Geometry, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) -> bool {
    let (m, k, c) = (geo.m, geo.k(), geo.c);
    let nr = kiln_kernels::sgemm::BLayout::NR32.nr();
    let failed = std::sync::atomic::AtomicBool::new(false);
    // W's columns, each contiguous over the depth, once per call.
    let mut cols = kiln_kernels::recycle::lend::<DirectCols>();
    cols.clear();
    for j in 0..m {
        cols.extend((0..k).map(|q| w.get(q * nr + j).copied().unwrap_or(0.0)));
    }
    let cols: &[f32] = &cols;
    kiln_kernels::pool::for_each_chunk_mut(y, geo.ow * m, &|row, out| {
        let (b, oy) = (row / geo.oh.max(1), row % geo.oh.max(1));
        let ok = kiln_kernels::simd::vectorize(|| {
            for (ox, o) in out.chunks_exact_mut(m).enumerate() {
                for (j, v) in o.iter_mut().enumerate() {
                    *v = bias.and_then(|b| b.get(j)).copied().unwrap_or(0.0);
                }
                let x0 = (ox * geo.sw) as isize - geo.pw as isize;
                let lo = (-x0).clamp(0, geo.kw as isize) as usize;
                let hi = (geo.iw as isize - x0).clamp(0, geo.kw as isize) as usize;
                if lo >= hi {
                    continue;
                }
                let rows = (0..geo.kh).filter_map(|ky| {
                    let iy = (oy * geo.sh + ky * geo.dh) as isize - geo.ph as isize;
                    (iy >= 0 && (iy as usize) < geo.ih).then_some((ky, iy as usize))
                });
                if let [v] = o {
                    // One channel (the common head): one set of partial sums over every live
                    // kernel row (their runs have the pixel's width clip, so one length),
                    // reduced once.
                    let mut acc = [0f32; 16];
                    let mut tail = 0f32;
                    for (ky, iy) in rows {
                        let s = ((b * geo.ih + iy) * geo.iw + (x0 + lo as isize) as usize) * c;
                        let t = (ky * geo.kw + lo) * c;
                        let (Some(xs), Some(ws)) = (x.get(s..s + (hi - lo) * c), cols.get(t..t + (hi - lo) * c)) else {
                            return false;
                        };
                        kiln_kernels::vector::dot16_into(&mut acc, &mut tail, xs, ws);
                    }
                    *v += kiln_kernels::vector::reduce16(acc) + tail;
                    continue;
                }
                for (ky, iy) in rows {
                    let s = ((b * geo.ih + iy) * geo.iw + (x0 + lo as isize) as usize) * c;
                    let Some(xs) = x.get(s..s + (hi - lo) * c) else {
                        return false;
                    };
                    let t = (ky * geo.kw + lo) * c;
                    for (j, v) in o.iter_mut().enumerate() {
                        let Some(ws) = cols.get(j * k + t..j * k + t + (hi - lo) * c) else {
                            return false;
                        };
                        *v += kiln_kernels::vector::dot16(xs, ws);
                    }
                }
            }
            true
        });
        if !ok {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    !failed.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::nn::Activation;
    use crate::nn::Conv;

    fn rng(mut seed: u32) -> impl FnMut() -> f32 {
        move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((seed >> 8) % 2001) as f32 / 1000.0 - 1.0
        }
    }

    /// A Conv and the plan it runs under.
    type Op = (Conv, ConvPlan);

    fn eval((op, plan): &Op, vals: &[Option<Value>]) -> Tensor {
        let ins: Vec<Option<&Value>> = vals.iter().map(Option::as_ref).collect();
        let out = Planned::new(op, plan).eval(&Args::new(&ins)).unwrap();
        out[0].as_tensor().unwrap().clone()
    }

    fn tensor(shape: &[usize], v: &[f32]) -> Value {
        Value::Tensor(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }

    fn f64s(shape: &[usize], v: &[f32]) -> Value {
        Value::Tensor(Tensor::from_vec(shape, v.iter().map(|&a| a as f64).collect::<Vec<_>>()).unwrap())
    }

    /// `[N, C, H, W]` data as `[N, H, W, C]`.
    pub(crate) fn to_last<T: Copy>(v: &[T], [n, c, h, w]: [usize; 4]) -> Vec<T> {
        let mut out = Vec::with_capacity(v.len());
        for i in 0..n {
            for y in 0..h {
                for x in 0..w {
                    for ch in 0..c {
                        out.push(v[((i * c + ch) * h + y) * w + x]);
                    }
                }
            }
        }
        out
    }

    /// One case: the channels-last op (packed for group 1, plain W for depthwise) on 1 and 2
    /// threads against the channels-first generic path in f64, with bias, residual and Relu.
    #[allow(clippy::too_many_arguments)]
    fn check(
        n: usize,
        c: usize,
        m: usize,
        hw: [usize; 2],
        k: [usize; 2],
        stride: [usize; 2],
        dil: [usize; 2],
        pads: [usize; 4],
        group: usize,
        residual: bool,
        seed: u32,
    ) {
        let mut rnd = rng(seed);
        let xs = [n, c, hw[0], hw[1]];
        let ws = [m, c / group, k[0], k[1]];
        let x: Vec<f32> = (0..xs.iter().product::<usize>()).map(|_| rnd()).collect();
        let w: Vec<f32> = (0..ws.iter().product::<usize>()).map(|_| rnd()).collect();
        let b: Vec<f32> = (0..m).map(|_| rnd()).collect();
        let first: Op = (
            Conv {
                group,
                strides: stride.to_vec(),
                dilations: dil.to_vec(),
                pads: pads.to_vec(),
                ..Default::default()
            },
            ConvPlan {
                activation: Some(Activation::Relu),
                ..Default::default()
            },
        );
        // The output shape, from the channels-first op without a residual.
        let probe = eval(
            &first,
            &[Some(f64s(&xs, &x)), Some(f64s(&ws, &w)), Some(f64s(&[m], &b))],
        );
        let &[_, _, oh, ow] = probe.shape() else { panic!() };
        let ys = [n, m, oh, ow];
        let r: Vec<f32> = (0..ys.iter().product::<usize>()).map(|_| rnd()).collect();
        let rv = residual.then(|| f64s(&ys, &r));
        let slow = eval(
            &first,
            &[Some(f64s(&xs, &x)), Some(f64s(&ws, &w)), Some(f64s(&[m], &b)), rv],
        );
        let mut last: Op = (
            first.0.clone(),
            ConvPlan {
                channels_last: true,
                ..first.1
            },
        );
        let wv = if group == 1 {
            let pk = PackedConvWeights {
                m,
                c,
                kh: k[0],
                kw: k[1],
            };
            last.1.packed = Some(pk);
            let p = pack_channels_last(&w, pk).unwrap();
            tensor(&[p.len()], &p)
        } else if c / group > 1 || m != c {
            // Grouped: the taps packed as the compiler packs them.
            let pk = PackedConvWeights {
                m,
                c: c / group,
                kh: k[0],
                kw: k[1],
            };
            last.1.packed = Some(pk);
            let p = kiln_kernels::grouped::pack_taps(&w, m, c / group, k[0], k[1]).unwrap();
            tensor(&[p.len()], &p)
        } else {
            tensor(&ws, &w)
        };
        let vals = [
            Some(tensor(&[n, hw[0], hw[1], c], &to_last(&x, xs))),
            Some(wv),
            Some(tensor(&[m], &b)),
            residual.then(|| tensor(&[n, oh, ow, m], &to_last(&r, ys))),
        ];
        // Recycled output buffers hold stale values: NaN ones show any element left unwritten.
        kiln_kernels::recycle::give(vec![f32::NAN; n * oh * ow * m]);
        let one = eval(&last, &vals);
        kiln_kernels::recycle::give(vec![f32::NAN; n * oh * ow * m]);
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let two = pool.install(|| eval(&last, &vals));
        assert_eq!(one.shape(), &[n, oh, ow, m]);
        assert_eq!(one.as_slice::<f32>().unwrap(), two.as_slice::<f32>().unwrap());
        let want = to_last(
            &slow.to_f64_vec().iter().map(|&v| v as f32).collect::<Vec<_>>(),
            [n, m, oh, ow],
        );
        let got = one.as_slice::<f32>().unwrap();
        for (i, (g, s)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - s).abs() <= 1e-5 * (1.0 + s.abs()),
                "c {c} m {m} {hw:?} k {k:?} s {stride:?} d {dil:?} p {pads:?} g {group}: [{i}] {g} vs {s}"
            );
        }
        assert!(got.iter().any(|&v| v > 0.0) && got.contains(&0.0));
        // With W as ONNX has it, a group-1 op takes the reference path and a grouped one packs
        // W at run time: the same values.
        if last.1.packed.is_some() {
            let plain: Op = (last.0.clone(), ConvPlan { packed: None, ..last.1 });
            let mut plain_vals = vals.clone();
            plain_vals[1] = Some(tensor(&ws, &w));
            let reference = eval(&plain, &plain_vals);
            for (g, s) in got.iter().zip(reference.as_slice::<f32>().unwrap()) {
                assert!((g - s).abs() <= 1e-5 * (1.0 + s.abs()));
            }
        }
        if group == 1 {
            // X kept channels-first (`x_channels_first`): the windows gathered from it, packed
            // and plain, on 1 and 2 threads, give the same values.
            let mut first_vals = vals;
            first_vals[0] = Some(tensor(&xs, &x));
            let gathered: Op = (
                last.0.clone(),
                ConvPlan {
                    x_channels_first: true,
                    ..last.1
                },
            );
            kiln_kernels::recycle::give(vec![f32::NAN; n * oh * ow * m]);
            let one = eval(&gathered, &first_vals);
            kiln_kernels::recycle::give(vec![f32::NAN; n * oh * ow * m]);
            let two = pool.install(|| eval(&gathered, &first_vals));
            assert_eq!(one.as_slice::<f32>().unwrap(), two.as_slice::<f32>().unwrap());
            first_vals[1] = Some(tensor(&ws, &w));
            let slow_first = eval(
                &(
                    gathered.0.clone(),
                    ConvPlan {
                        packed: None,
                        ..gathered.1
                    },
                ),
                &first_vals,
            );
            for out in [&one, &slow_first] {
                assert_eq!(out.shape(), &[n, oh, ow, m]);
                for (i, (g, s)) in out.as_slice::<f32>().unwrap().iter().zip(&want).enumerate() {
                    assert!(
                        (g - s).abs() <= 1e-5 * (1.0 + s.abs()),
                        "X first, c {c} {hw:?} k {k:?} s {stride:?} p {pads:?}: [{i}] {g} vs {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn tap_classes_split_where_the_live_taps_change() {
        let geo = |iw: usize, kw: usize, d: usize| {
            let ow = iw + 2 * d - d * (kw - 1);
            Geometry {
                batch: 1,
                m: 8,
                conv: Conv2d {
                    c: 4,
                    ih: 33,
                    iw,
                    kh: 3,
                    kw,
                    sh: 1,
                    sw: 1,
                    dh: d,
                    dw: d,
                    ph: d,
                    pw: d,
                    oh: 33,
                    ow,
                },
            }
        };
        let band = |o0, o1, taps| Band { o0, o1, taps };
        // DeepLab's ASPP at dilation 12 on 33 x 49: bands of rows and of columns.
        let (cols, dead) = bands(49, 1, 12, 12, 49, 3);
        assert_eq!(
            (cols.as_slice(), dead),
            (
                [band(0, 12, 1..3), band(12, 37, 0..3), band(37, 49, 0..2)].as_slice(),
                24
            )
        );
        let (rows, dead) = bands(33, 1, 12, 12, 33, 3);
        assert_eq!(
            (rows.as_slice(), dead),
            (
                [band(0, 12, 1..3), band(12, 21, 0..3), band(21, 33, 0..2)].as_slice(),
                24
            )
        );
        // Nine rectangles, each over its own taps; every pixel once.
        let classes = geo(49, 3, 12).tap_classes().unwrap();
        assert_eq!(classes.len(), 9);
        let mut seen: Vec<(usize, usize)> = classes.iter().flat_map(|t| t.pixels.clone()).collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..33).flat_map(|y| (0..49).map(move |x| (y, x))).collect::<Vec<_>>()
        );
        let corner = classes.iter().find(|t| t.pixels.contains(&(0, 0))).unwrap();
        assert_eq!(
            (corner.kys.clone(), corner.kxs.clone(), corner.pixels.len()),
            (1..3, 1..3, 144)
        );
        let centre = classes.iter().find(|t| t.pixels.contains(&(16, 24))).unwrap();
        assert_eq!(
            (centre.kys.clone(), centre.kxs.clone(), centre.pixels.len()),
            (0..3, 0..3, 9 * 25)
        );
        // Dilation 24: the one column whose taps are all live makes rectangles of 9-15
        // pixels, which go together over the hull of their taps.
        let classes = geo(49, 3, 24).tap_classes().unwrap();
        assert_eq!(classes.len(), 7);
        let rest = classes.last().unwrap();
        assert_eq!(
            (rest.kys.clone(), rest.kxs.clone(), rest.pixels.len()),
            (0..3, 0..3, 33)
        );
        // An ordinary padded 3x3 on 56 columns: not worth it.
        assert!(geo(56, 3, 1).tap_classes().is_none());
    }

    #[test]
    fn packed_convolutions_match_the_channels_first_reference() {
        // 1x1 (X read in place), 1x1 strided, 3x3 padded, the stem's 3 channels with stride
        // 2, dilation, asymmetric pads, a kernel wider than the image; 2 images; with and
        // without a residual; row blocks over several threads (the 3-channel stem at 41x41).
        check(1, 16, 40, [9, 7], [1, 1], [1, 1], [1, 1], [0; 4], 1, true, 1);
        check(2, 12, 20, [9, 9], [1, 1], [2, 2], [1, 1], [0; 4], 1, false, 2);
        check(2, 9, 33, [8, 10], [3, 3], [1, 1], [1, 1], [1; 4], 1, true, 3);
        check(1, 3, 32, [41, 41], [3, 3], [2, 2], [1, 1], [1; 4], 1, false, 4);
        check(1, 5, 7, [9, 9], [3, 3], [1, 2], [2, 2], [0, 2, 1, 0], 1, true, 5);
        check(1, 4, 6, [3, 4], [5, 3], [1, 1], [1, 1], [2, 1, 2, 1], 1, false, 6);
        // A ResNet-like 7x7 stride-2 stem: 400 output pixels in blocks of 224 rows (K = 147).
        check(2, 3, 16, [40, 39], [7, 7], [2, 2], [1, 1], [3; 4], 1, true, 7);
        // Few output channels over rows of 24 or more pixels (`kiln_kernels::planar` on
        // AVX-512): a detector's layers, strided and dilated, with a residual, batches.
        check(1, 3, 16, [30, 50], [3, 3], [2, 2], [1, 1], [1; 4], 1, true, 40);
        check(2, 10, 12, [12, 30], [3, 3], [1, 1], [1, 1], [1; 4], 1, true, 41);
        check(1, 16, 9, [7, 33], [5, 3], [1, 1], [2, 1], [2, 1, 2, 1], 1, false, 42);
        // Few input channels into more than 16 outputs (`kiln_kernels::stem` on AVX-512): a
        // spectrogram's 1 -> 32 with a residual over two images, a 7x7 stride-2 3 -> 40 stem
        // (two panels, the second partial), asymmetric pads.
        check(2, 1, 32, [20, 30], [3, 3], [1, 1], [1, 1], [1; 4], 1, true, 43);
        check(1, 3, 40, [33, 47], [7, 7], [2, 2], [1, 1], [3, 2, 3, 1], 1, false, 44);
        // X read as overlapping windows: a kernel spanning the whole width sliding down (one
        // column, then three), and 1-D convolutions as height-1 ones (strided; padded, which
        // takes the im2col path).
        check(3, 2, 8, [30, 1], [8, 1], [2, 1], [1, 1], [0; 4], 1, true, 8);
        check(2, 5, 12, [20, 3], [4, 3], [1, 1], [1, 1], [0; 4], 1, false, 9);
        check(2, 6, 10, [1, 40], [1, 5], [1, 3], [1, 1], [0; 4], 1, true, 10);
        check(1, 6, 10, [1, 40], [1, 5], [1, 1], [1, 1], [0, 2, 0, 2], 1, false, 11);
        // One input channel (an STFT over chunks of audio): X channels-first is X
        // channels-last; few windows per image over several images copy them into one A.
        check(4, 1, 10, [1, 40], [1, 8], [1, 4], [1, 1], [0; 4], 1, false, 21);
        check(1, 1, 34, [1, 64], [1, 16], [1, 8], [1, 1], [0; 4], 1, true, 22);
        // One channel, 3x3 and wider kernels (a spectrogram's first layer): padded, strided,
        // dilated rows, two images, an image narrower than the kernel with its pads.
        check(2, 1, 32, [19, 13], [3, 3], [1, 1], [1, 1], [1; 4], 1, true, 23);
        check(1, 1, 16, [17, 21], [3, 5], [2, 2], [2, 1], [1, 2, 0, 3], 1, false, 24);
        check(1, 1, 8, [6, 3], [3, 5], [1, 1], [1, 1], [1, 2, 1, 2], 1, false, 25);
        // Kernel rows of 6 (copied by the general loop) and 7 floats, strided.
        check(1, 1, 16, [12, 30], [2, 6], [1, 2], [1, 1], [1; 4], 1, false, 26);
        check(2, 1, 16, [23, 29], [7, 7], [2, 2], [1, 1], [3; 4], 1, false, 27);
        // ASPP-like dilated windows on a small image (K = 576: blocks of 56 rows, under 3
        // image rows): blocks whose first or last kernel rows read only padding skip them;
        // with dilation 8 on 20 rows, the middle kernel row alone for some blocks; two images
        // (a block across both keeps every kernel row); dilation 30: only the centre is live.
        check(2, 64, 24, [20, 22], [3, 3], [1, 1], [8, 8], [8; 4], 1, true, 12);
        // Column regions with no live tap at all (pads wider than the kernel reaches: those
        // pixels are the bias alone), and strided dilated windows over two images.
        check(1, 5, 9, [3, 4], [2, 2], [1, 1], [1, 1], [4; 4], 1, true, 14);
        check(2, 7, 20, [13, 11], [3, 3], [2, 2], [4, 4], [4, 4, 4, 4], 1, true, 15);
        check(
            1,
            64,
            16,
            [20, 22],
            [3, 3],
            [1, 1],
            [30, 3],
            [30, 3, 30, 3],
            1,
            false,
            13,
        );
        // One to four channels out as direct dot products: 5x5 padded over two images, 3x7
        // strided with asymmetric pads wider than the kernel reaches at the edges, dilated
        // rows, a kernel wider than the image; with a residual, the GEMM path.
        check(2, 8, 1, [12, 17], [5, 5], [1, 1], [1, 1], [2; 4], 1, false, 16);
        check(1, 33, 3, [9, 10], [3, 7], [2, 1], [1, 1], [1, 4, 1, 5], 1, false, 17);
        check(1, 6, 4, [11, 9], [3, 3], [1, 2], [2, 1], [2, 1, 2, 1], 1, false, 18);
        check(1, 4, 2, [5, 3], [3, 5], [1, 1], [1, 1], [1, 2, 1, 2], 1, false, 19);
        check(1, 8, 1, [12, 17], [5, 5], [1, 1], [1, 1], [2; 4], 1, true, 20);
    }

    #[test]
    fn depthwise_convolutions_match_the_channels_first_reference() {
        // Channel counts covering the 64-, 16- and 1-wide blocks; strides, dilations,
        // asymmetric pads, kernels wider than the image.
        check(1, 83, 83, [7, 9], [3, 3], [1, 1], [1, 1], [1; 4], 83, false, 11);
        check(2, 21, 21, [8, 8], [3, 3], [2, 2], [1, 1], [1; 4], 21, false, 12);
        check(1, 5, 5, [9, 6], [3, 5], [2, 1], [1, 2], [0, 2, 1, 1], 5, false, 13);
        check(1, 32, 32, [5, 5], [5, 5], [1, 1], [1, 1], [2; 4], 32, false, 14);
        check(1, 17, 17, [3, 4], [5, 3], [1, 3], [1, 1], [2, 1, 2, 1], 17, false, 15);
    }

    #[test]
    fn grouped_convolutions_match_the_channels_first_reference() {
        // Groups of 4 in 4 (the in-lane shuffle), 8 in 8 strided, 16 in 16 (broadcast) with
        // dilation and asymmetric pads, 3 in 32 (broadcast, two blocks a group), 1 in 2 (a
        // channel multiplier: permuted), 2 in 3 (broadcast, one masked block a group); odd widths
        // leave pixels and blocks over; the last is large enough to split over 2 threads.
        // Pads of 3 around a 3x3 window: the border pixels read only padding (their bias).
        check(1, 32, 32, [4, 5], [3, 3], [1, 1], [1, 1], [3, 2, 3, 1], 2, false, 38);
        check(2, 32, 32, [9, 7], [3, 3], [1, 1], [1, 1], [1; 4], 8, false, 31);
        check(1, 48, 48, [11, 10], [3, 3], [2, 2], [1, 1], [1; 4], 6, false, 32);
        check(1, 64, 64, [10, 9], [3, 3], [1, 1], [2, 2], [0, 2, 1, 1], 4, false, 33);
        check(1, 6, 64, [7, 8], [5, 3], [1, 2], [1, 1], [2, 1, 2, 1], 2, false, 34);
        check(1, 8, 16, [6, 9], [3, 3], [1, 1], [1, 1], [1; 4], 8, false, 35);
        check(1, 10, 15, [5, 6], [3, 3], [1, 1], [1, 1], [1; 4], 5, false, 36);
        check(1, 64, 64, [18, 17], [3, 3], [1, 1], [1, 1], [1; 4], 4, false, 37);
    }

    #[test]
    fn a_depthwise_residual_takes_the_reference_path_and_unpacked_grouped_weights_pack_at_run_time() {
        check(1, 16, 16, [6, 6], [3, 3], [1, 1], [1, 1], [1; 4], 16, true, 21);
        // Grouped (not depthwise), 2 inputs to 3 outputs a group, W in its ONNX layout (not
        // packed at compile time): packed tap-major on the call, the reference's values.
        let mut rnd = rng(22);
        let x: Vec<f32> = (0..4 * 5 * 5).map(|_| rnd()).collect();
        let w: Vec<f32> = (0..6 * 2 * 9).map(|_| rnd()).collect();
        let first: Op = (
            Conv {
                group: 2,
                pads: vec![1; 4],
                ..Default::default()
            },
            ConvPlan::default(),
        );
        let last: Op = (
            first.0.clone(),
            ConvPlan {
                channels_last: true,
                ..Default::default()
            },
        );
        let a = eval(
            &first,
            &[Some(tensor(&[1, 4, 5, 5], &x)), Some(tensor(&[6, 2, 3, 3], &w))],
        );
        let b = eval(
            &last,
            &[
                Some(tensor(&[1, 5, 5, 4], &to_last(&x, [1, 4, 5, 5]))),
                Some(tensor(&[6, 2, 3, 3], &w)),
            ],
        );
        assert_eq!(b.shape(), &[1, 5, 5, 6]);
        let want = to_last(a.as_slice::<f32>().unwrap(), [1, 6, 5, 5]);
        for (i, (g, s)) in b.as_slice::<f32>().unwrap().iter().zip(&want).enumerate() {
            assert!((g - s).abs() <= 1e-5 * (1.0 + s.abs()), "[{i}] {g} vs {s}");
        }
    }

    #[test]
    fn packed_weights_of_the_wrong_size_or_channels_are_refused() {
        let pk = PackedConvWeights {
            m: 4,
            c: 3,
            kh: 3,
            kw: 3,
        };
        assert_eq!(
            pack_channels_last(&[0.0; 10], pk).unwrap_err(),
            OpError::input_value(1, "the 108 weights of W [4, 3, 3, 3]", "10 weights")
        );
        let conv = Conv {
            group: 1,
            ..Default::default()
        };
        let plan = ConvPlan {
            channels_last: true,
            packed: Some(pk),
            ..Default::default()
        };
        let op = Planned::new(&conv, &plan);
        let x = tensor(&[1, 5, 5, 3], &[0.5; 75]);
        let w = pack_channels_last(&[0.25; 108], pk).unwrap();
        let ins = [Some(&x), Some(&tensor(&[w.len() - 1], &w[1..]))];
        let e = op.eval(&Args::new(&ins)).unwrap_err();
        assert!(
            matches!(&e, OpError::InputValue { index: 1, expected, .. } if expected == "weights packed for W [4, 3, 3, 3]"),
            "{e}"
        );
        let x4 = tensor(&[1, 5, 5, 4], &[0.5; 100]);
        let wv = tensor(&[w.len()], &w);
        assert_eq!(
            op.eval(&Args::new(&[Some(&x4), Some(&wv)])).unwrap_err(),
            OpError::input_shape(0, "3 channels, as the packed weights", &[1, 5, 5, 4])
        );
        let y = op.eval(&Args::new(&[Some(&x), Some(&wv)])).unwrap();
        // No padding: 3x3 windows of 27 values 0.5 * 0.25.
        let t = y[0].as_tensor().unwrap();
        assert_eq!(t.shape(), &[1, 3, 3, 4]);
        assert!(
            t.as_slice::<f32>()
                .unwrap()
                .iter()
                .all(|&v| (v - 27.0 * 0.125).abs() < 1e-5)
        );
        // Grouped tap-major weights (2 groups of 4 channels to 8 outputs): the wrong size, X
        // of other channels, or a residual are refused, never read as another layout.
        let gk = PackedConvWeights {
            m: 16,
            c: 4,
            kh: 3,
            kw: 3,
        };
        let gconv = Conv {
            group: 2,
            ..Default::default()
        };
        let gplan = ConvPlan {
            channels_last: true,
            packed: Some(gk),
            ..Default::default()
        };
        let grouped = Planned::new(&gconv, &gplan);
        let gw = tensor(&[9 * 4 * 16], &[0.25; 9 * 4 * 16]);
        let x8 = tensor(&[1, 5, 5, 8], &[0.5; 200]);
        let y = grouped.eval(&Args::new(&[Some(&x8), Some(&gw)])).unwrap();
        let t = y[0].as_tensor().unwrap();
        assert_eq!(t.shape(), &[1, 3, 3, 16]);
        assert!(
            t.as_slice::<f32>()
                .unwrap()
                .iter()
                .all(|&v| (v - 36.0 * 0.125).abs() < 1e-5)
        );
        let short = tensor(&[9 * 4 * 16 - 1], &[0.25; 9 * 4 * 16 - 1]);
        assert!(grouped.eval(&Args::new(&[Some(&x8), Some(&short)])).is_err());
        assert!(grouped.eval(&Args::new(&[Some(&x4), Some(&gw)])).is_err());
        let r = tensor(&[1, 3, 3, 16], &[1.0; 144]);
        let err = grouped
            .eval(&Args::new(&[Some(&x8), Some(&gw), None, Some(&r)]))
            .unwrap_err();
        assert_eq!(
            err,
            OpError::Plan {
                op: "Conv",
                plan: crate::fast::Plan::Conv(gplan).summary(),
                reason: "tap-major grouped weights take no residual",
            }
        );
    }
}
