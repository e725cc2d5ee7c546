//! The exact int32 sums of a 2-D 8-bit convolution, for `QLinearConv` (and `ConvInteger`):
//! `sum (x - zx) (w - zw[m])` over each window, by the integer GEMM of W against the matrix of
//! X's window taps (its padding filled with X's zero point, so it adds nothing), or for
//! depthwise convolutions by a direct loop over the taps. The sums are the general path's
//! values exactly (it sums the same integers in f64), so the requantization that follows gives
//! identical results.

use super::integer::{ConvAttrs, Geometry, PackCache};
use crate::error::Result;
use kiln_kernels::igemm::{Int8, MAX_EXACT_DEPTH, PackedB, igemm};
use kiln_tensor::{DType, Tensor};

/// The exact sums `[n, m, oh, ow]` of X `[n, c, h, w]` (u8 or i8, zero point `zx`) convolved
/// with W (u8 or i8, zero point one or one per output channel); `None`
/// when this path does not apply (not 2-D, other types, sums beyond int32), and the caller's
/// general path then computes it.
pub(crate) fn conv2d(
    attrs: &ConvAttrs,
    g: &Geometry,
    x: &Tensor,
    zx: i32,
    w: &Tensor,
    zw: Option<&Tensor>,
    cache: Option<&PackCache>,
) -> Result<Option<Vec<i32>>> {
    if g.out.len() != 2 || x.shape().len() != 4 || w.shape().len() != 4 {
        return Ok(None);
    }
    if attrs.group <= 1 {
        let done = match (x.dtype(), w.dtype()) {
            (DType::U8, DType::U8) => by_pixels::<u8, u8>(g, x, zx, w, zw, cache)?,
            (DType::U8, DType::I8) => by_pixels::<u8, i8>(g, x, zx, w, zw, cache)?,
            (DType::I8, DType::U8) => by_pixels::<i8, u8>(g, x, zx, w, zw, cache)?,
            (DType::I8, DType::I8) => by_pixels::<i8, i8>(g, x, zx, w, zw, cache)?,
            _ => None,
        };
        if done.is_some() {
            return Ok(done);
        }
    }
    match x.dtype() {
        DType::U8 => conv_typed::<u8>(attrs, g, x.as_slice()?, x.shape(), zx, w, zw),
        DType::I8 => conv_typed::<i8>(attrs, g, x.as_slice()?, x.shape(), zx, w, zw),
        _ => Ok(None),
    }
}

#[allow(clippy::too_many_arguments)]
fn conv_typed<T: Int8 + Default + TryFrom<i32>>(
    attrs: &ConvAttrs,
    g: &Geometry,
    x: &[T],
    xs: &[usize],
    zx: i32,
    w: &Tensor,
    zw: Option<&Tensor>,
) -> Result<Option<Vec<i32>>> {
    let (&[n, c, _, _], &[m, cg, _, _]) = (xs, w.shape()) else {
        return Ok(None);
    };
    let groups = attrs.group.max(1);
    if c != cg * groups || m % groups != 0 {
        return Ok(None);
    }
    let Some(geo) = Geo::of(g, xs, w.shape()) else {
        return Ok(None);
    };
    let Geo {
        h,
        wd,
        kh,
        kw,
        oh,
        ow,
        s: (sh, sw),
        d: (dh, dw),
        p: (ph, pw),
        ..
    } = geo;
    let (opix, ipix, kpix, mpg) = (oh * ow, h * wd, kh * kw, m / groups);
    let mut acc = vec![0i32; crate::util::checked_numel(&[n, m, opix])?];
    // The input row / column a tap reads, or None in the padding.
    let at = |o: usize, k: usize, s: usize, d: usize, p: usize, len: usize| -> Option<usize> {
        (o * s + k * d).checked_sub(p).filter(|&i| i < len)
    };
    if cg == 1 && mpg == 1 {
        // Depthwise: each output channel reads its own input plane.
        if kpix > MAX_EXACT_DEPTH {
            return Ok(None);
        }
        let wv: Vec<i32> = match w.dtype() {
            DType::U8 => w.as_slice::<u8>()?.iter().map(|&v| i32::from(v)).collect(),
            DType::I8 => w.as_slice::<i8>()?.iter().map(|&v| i32::from(v)).collect(),
            _ => return Ok(None),
        };
        let zwv: Vec<i32> = match zw {
            None => vec![0],
            Some(z) if z.dtype() == DType::U8 => z.as_slice::<u8>()?.iter().map(|&v| i32::from(v)).collect(),
            Some(z) if z.dtype() == DType::I8 => z.as_slice::<i8>()?.iter().map(|&v| i32::from(v)).collect(),
            Some(_) => return Ok(None),
        };
        // Tap by tap over whole output rows: for each tap, the run of output columns whose
        // input column is inside the image, a plain loop over contiguous outputs.
        if x.len() != n * c * ipix || wv.len() != m * kpix || !(zwv.len() == 1 || zwv.len() == m) {
            return Ok(None);
        }
        // One output plane per task, over the current pool.
        kiln_kernels::pool::for_each_chunk_mut(&mut acc, opix.max(1), &|i, out| {
            let (ni, ch) = (i / m.max(1), i % m.max(1));
            let (Some(plane), Some(taps)) = (
                x.get((ni * c + ch) * ipix..(ni * c + ch + 1) * ipix),
                wv.get(ch * kpix..(ch + 1) * kpix),
            ) else {
                return;
            };
            let z = zwv.get(ch).or(zwv.first()).copied().unwrap_or(0);
            let taps: Vec<i32> = taps.iter().map(|&v| v - z).collect();
            let xs: Vec<i32> = plane.iter().map(|v| v.widen() - zx).collect();
            for (oy, orow) in out.chunks_mut(ow.max(1)).enumerate().take(oh) {
                for ky in 0..kh {
                    let Some(iy) = at(oy, ky, sh, dh, ph, h) else { continue };
                    let Some(xrow) = xs.get(iy * wd..(iy + 1) * wd) else {
                        continue;
                    };
                    for kx in 0..kw {
                        let t = taps.get(ky * kw + kx).copied().unwrap_or(0);
                        // ox with 0 <= ox * sw + kx * dw - pw < wd.
                        let off = kx * dw;
                        let first = pw.saturating_sub(off).div_ceil(sw);
                        let last = (wd + pw).checked_sub(off + 1).map(|v| v / sw);
                        let Some(last) = last.map(|l| l.min(ow.saturating_sub(1))) else {
                            continue;
                        };
                        if first > last {
                            continue;
                        }
                        let start = first * sw + off - pw;
                        let Some(dst) = orow.get_mut(first..=last) else {
                            continue;
                        };
                        if sw == 1 {
                            if let Some(src) = xrow.get(start..start + dst.len()) {
                                for (o, &v) in dst.iter_mut().zip(src) {
                                    *o += v * t;
                                }
                            }
                        } else {
                            for (i, o) in dst.iter_mut().enumerate() {
                                *o += xrow.get(start + i * sw).copied().unwrap_or(0) * t;
                            }
                        }
                    }
                }
            }
        });
        return Ok(Some(acc));
    }
    let Ok(pad) = T::try_from(zx) else { return Ok(None) };
    let zwv: Vec<i32> = match zw {
        None => vec![0],
        Some(z) if z.dtype() == DType::U8 => z.as_slice::<u8>()?.iter().map(|&v| i32::from(v)).collect(),
        Some(z) if z.dtype() == DType::I8 => z.as_slice::<i8>()?.iter().map(|&v| i32::from(v)).collect(),
        Some(_) => return Ok(None),
    };
    let done = match w.dtype() {
        DType::I8 => gemm_groups(x, w.as_slice::<i8>()?, &zwv, &geo, n, m, groups, pad, &mut acc),
        DType::U8 => gemm_groups(x, w.as_slice::<u8>()?, &zwv, &geo, n, m, groups, pad, &mut acc),
        _ => false,
    };
    if !done {
        return Ok(None);
    }
    Ok(Some(acc))
}

/// The sizes of one 2-D convolution: channels, input, channels per group, kernel, output,
/// strides, dilations and leading pads.
#[derive(Clone, Copy)]
struct Geo {
    c: usize,
    h: usize,
    wd: usize,
    cg: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    s: (usize, usize),
    d: (usize, usize),
    p: (usize, usize),
}

impl Geo {
    /// The sizes of X `[n, c, h, w]` convolved by W `[m, cg, kh, kw]` with `g`'s output,
    /// strides, dilations (1 where absent) and leading pads (0).
    fn of(g: &Geometry, xs: &[usize], ws: &[usize]) -> Option<Geo> {
        let (&[_, c, h, wd], &[_, cg, kh, kw], [oh, ow]) = (xs, ws, g.out.as_slice()) else {
            return None;
        };
        let one = |v: &[usize], d: usize| v.get(d).copied().unwrap_or(1);
        Some(Geo {
            c,
            h,
            wd,
            cg,
            kh,
            kw,
            oh: *oh,
            ow: *ow,
            s: (one(&g.strides, 0), one(&g.strides, 1)),
            d: (one(&g.dilations, 0), one(&g.dilations, 1)),
            p: (
                g.pad_begin.first().copied().unwrap_or(0),
                g.pad_begin.get(1).copied().unwrap_or(0),
            ),
        })
    }
}

/// Each image's group as one GEMM with the weights on the left: `acc[m][pixel] = sum_k W[m][k]
/// (X'[k][pixel] - zx)`, X' the `[cg * kh * kw, oh * ow]` matrix of the windows' taps (X's own
/// plane for a 1x1 stride-1 convolution), packed with X's zero point as its columns' zero
/// point, so the output comes out channel-major as the NCHW result wants; W's zero points
/// are then subtracted as `zw[m] * colsum[pixel]` (the packed columns' sums of `X' - zx`).
/// False when a size does not fit (the caller's general path then runs).
#[allow(clippy::too_many_arguments)]
fn gemm_groups<T: Int8, W: Int8>(
    x: &[T],
    w: &[W],
    zw: &[i32],
    g: &Geo,
    n: usize,
    m: usize,
    groups: usize,
    pad: T,
    acc: &mut [i32],
) -> bool {
    let (kpix, opix, ipix) = (g.kh * g.kw, g.oh * g.ow, g.h * g.wd);
    let (k, mpg) = (g.cg * kpix, m / groups.max(1));
    let at = |o: usize, kk: usize, s: usize, d: usize, p: usize, len: usize| -> Option<usize> {
        (o * s + kk * d).checked_sub(p).filter(|&i| i < len)
    };
    let mut taps: Vec<T> = vec![pad; k * opix];
    for ni in 0..n {
        for gi in 0..groups {
            // The tap matrix, a row per (channel, ky, kx), rows over the current pool.
            let base = (ni * g.c + gi * g.cg) * ipix;
            if x.len() < base + g.cg * ipix {
                return false;
            }
            kiln_kernels::pool::for_each_chunk_mut(&mut taps, opix.max(1), &|r, row| {
                let (ci, ky, kx) = (r / kpix, (r % kpix) / g.kw.max(1), r % g.kw.max(1));
                let plane = x.get(base + ci * ipix..base + (ci + 1) * ipix).unwrap_or(&[]);
                for (oy, orow) in row.chunks_mut(g.ow.max(1)).enumerate() {
                    let Some(iy) = at(oy, ky, g.s.0, g.d.0, g.p.0, g.h) else {
                        orow.iter_mut().for_each(|v| *v = pad);
                        continue;
                    };
                    let src = plane.get(iy * g.wd..(iy + 1) * g.wd).unwrap_or(&[]);
                    for (ox, v) in orow.iter_mut().enumerate() {
                        *v = match at(ox, kx, g.s.1, g.d.1, g.p.1, g.wd) {
                            Some(ix) => src.get(ix).copied().unwrap_or(pad),
                            None => pad,
                        };
                    }
                }
            });
            let Ok(packed) = PackedB::pack_for_sums(&taps, k, opix, &[pad]) else {
                return false;
            };
            let (Some(wg), Some(out)) = (
                w.get(gi * mpg * k..(gi + 1) * mpg * k),
                acc.get_mut((ni * m + gi * mpg) * opix..(ni * m + (gi + 1) * mpg) * opix),
            ) else {
                return false;
            };
            if igemm(mpg, k, wg, k, 0, &packed, out, opix).is_err() {
                return false;
            }
            let sums = packed.col_sums();
            for (j, row) in out.chunks_mut(opix.max(1)).enumerate() {
                let z = zw.get(gi * mpg + j).or(zw.first()).copied().unwrap_or(0);
                if z != 0 {
                    for (o, &cs) in row.iter_mut().zip(sums) {
                        *o -= z * cs;
                    }
                }
            }
        }
    }
    true
}

/// Output pixels per block of [`by_pixels`]: their window rows (`K` bytes each) and sums stay
/// in L2.
const PIXEL_BLOCK: usize = 256;

/// The exact sums of an ungrouped convolution with the output pixels as the GEMM's rows: X
/// copied channels-last once, each block of [`PIXEL_BLOCK`] pixels' windows gathered as rows
/// of `kh * kw * c` values (padding X's zero point), multiplied by the packed weights (kept
/// in `cache` when W is a constant), and the `[pixel, m]` sums written back channel-major.
/// The weights are then the GEMM's packed operand (quads on VNNI and AMX, u8 weights held
/// about their center) and X is never packed. `None` where it does not apply.
fn by_pixels<
    T: Int8 + Default + TryFrom<i32> + kiln_tensor::Element + kiln_kernels::transpose::Byte,
    W: Int8 + Default + kiln_tensor::Element,
>(
    g: &Geometry,
    x: &Tensor,
    zx: i32,
    w: &Tensor,
    zw: Option<&Tensor>,
    cache: Option<&PackCache>,
) -> Result<Option<Vec<i32>>> {
    let (&[n, _, _, _], &[m, _, _, _]) = (x.shape(), w.shape()) else {
        return Ok(None);
    };
    let Some(Geo {
        c,
        h,
        wd,
        cg: cw,
        kh,
        kw,
        oh,
        ow,
        s: (sh, sw),
        d: (dh, dw),
        p: (ph, pw),
    }) = Geo::of(g, x.shape(), w.shape())
    else {
        return Ok(None);
    };
    let k = c * kh * kw;
    // Fewer than four channels gather runs of a few bytes per window (a stem's one channel:
    // 2.0 ms here against 0.9 by the channel-major path, W as A, the taps packed as B).
    if cw != c || k == 0 || k > MAX_EXACT_DEPTH || m == 0 || (c < 4 && kh * kw > 1) {
        return Ok(None);
    }
    let Ok(pad) = T::try_from(zx) else { return Ok(None) };
    // B is `[(ky, kx, ci), m]`: the QLinearConv plans' packing, for int32 sums.
    let pack = || {
        let depth = crate::fast::qconv_nhwc::Depth::Taps(c);
        crate::fast::qconv_nhwc::pack_weights::<W>(w, zw, depth, 0..m, PackedB::pack_for_sums)
    };
    let fresh;
    let packed = match cache {
        Some(cache) => cache.0.get_or_init(pack).as_ref(),
        None => {
            fresh = pack();
            fresh.as_ref()
        }
    };
    let Some(packed) = packed.filter(|p| p.depth() == k && p.columns() == m) else {
        return Ok(None);
    };
    let xv: &[T] = x.as_slice()?;
    let (opix, ipix) = (oh * ow, h * wd);
    let mut acc = vec![0i32; crate::util::checked_numel(&[n, m, opix])?];
    let mut nhwc: Vec<T> = vec![pad; crate::util::checked_numel(&[ipix, c])?];
    let mut sums = vec![0i32; crate::util::checked_numel(&[opix, m])?];
    let isa = kiln_kernels::isa::active();
    let failed = std::sync::atomic::AtomicBool::new(false);
    let pointwise = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) && (oh, ow) == (h, wd);
    for (image, out) in xv
        .chunks_exact((c * ipix).max(1))
        .zip(acc.chunks_exact_mut((m * opix).max(1)))
        .take(n)
    {
        // Channels-last, one pixel's channels together.
        if !transpose_over_pool(image, ipix, c, &mut nhwc, kiln_kernels::transpose::transpose_bytes::<T>) {
            return Ok(None);
        }
        let nhwc = &nhwc;
        kiln_kernels::pool::for_each_chunk_mut(&mut sums, PIXEL_BLOCK * m, &|b, block| {
            let p0 = b * PIXEL_BLOCK;
            let rows = block.len() / m;
            if pointwise {
                // The channels-last rows are the windows.
                let done = nhwc
                    .get(p0 * c..(p0 + rows) * c)
                    .map(|a| kiln_kernels::igemm::igemm_serial(isa, rows, k, a, k, zx, packed, block, m).is_ok());
                if done != Some(true) {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return;
            }
            let mut rows_scratch = kiln_kernels::recycle::lend::<WindowRows>();
            // Stale bytes: a window inside the image overwrites its whole row below, one
            // that reaches the padding is filled with it first.
            let a = T::of_bytes_mut(kiln_kernels::recycle::scratch(&mut rows_scratch, rows * k));
            for (r, row) in a.chunks_exact_mut(k).enumerate() {
                let (oy, ox) = ((p0 + r) / ow.max(1), (p0 + r) % ow.max(1));
                // The window's first input column; its kernel row is one run of `kw * c`
                // values of the channels-last row when undilated and inside the image.
                let ix0 = (ox * sw).checked_sub(pw).filter(|&i| dw == 1 && i + kw <= wd);
                let rows_inside = (oy * sh).checked_sub(ph).is_some_and(|top| top + (kh - 1) * dh < h);
                if ix0.is_none() || !rows_inside {
                    row.fill(pad);
                }
                for ky in 0..kh {
                    let Some(iy) = (oy * sh + ky * dh).checked_sub(ph).filter(|&i| i < h) else {
                        continue;
                    };
                    if let Some(ix0) = ix0 {
                        let at = (iy * wd + ix0) * c;
                        if let (Some(dst), Some(src)) =
                            (row.get_mut(ky * kw * c..(ky + 1) * kw * c), nhwc.get(at..at + kw * c))
                        {
                            dst.copy_from_slice(src);
                        }
                        continue;
                    }
                    for kx in 0..kw {
                        let Some(ix) = (ox * sw + kx * dw).checked_sub(pw).filter(|&i| i < wd) else {
                            continue;
                        };
                        let at = (iy * wd + ix) * c;
                        if let (Some(dst), Some(src)) = (
                            row.get_mut((ky * kw + kx) * c..(ky * kw + kx + 1) * c),
                            nhwc.get(at..at + c),
                        ) {
                            dst.copy_from_slice(src);
                        }
                    }
                }
            }
            if kiln_kernels::igemm::igemm_serial(isa, rows, k, a, k, zx, packed, block, m).is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        // Back to channel-major.
        if !transpose_over_pool(&sums, m, opix, out, kiln_kernels::transpose::transpose_i32) {
            return Ok(None);
        }
    }
    Ok(Some(acc))
}

/// Elements per piece of [`transpose_over_pool`].
const TRANSPOSE_RUN: usize = 64 * 1024;

/// `transpose(src, lds, rows, cols, dst, rows)` with `cols = dst.len() / rows` (a layout
/// transpose of [`by_pixels`]: pixels in, channels out), in runs of whole `dst` rows of about
/// [`TRANSPOSE_RUN`] elements over the pool. `false` if a run does not fit.
fn transpose_over_pool<T: Send + Sync>(
    src: &[T],
    lds: usize,
    rows: usize,
    dst: &mut [T],
    transpose: fn(&[T], usize, usize, usize, &mut [T], usize) -> bool,
) -> bool {
    let run = TRANSPOSE_RUN.div_ceil(rows.max(1)).max(1);
    let failed = std::sync::atomic::AtomicBool::new(false);
    kiln_kernels::pool::for_each_chunk_mut(dst, run * rows, &|i, d| {
        let cols = d.len() / rows.max(1);
        if !src
            .get(i * run..)
            .is_some_and(|s| transpose(s, lds, rows, cols, d, rows))
        {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    !failed.into_inner()
}

kiln_kernels::scratch_kinds! {
    /// [`by_pixels`]' window rows of one block of pixels, as bytes (per thread).
    WindowRows: Vec<u8>;
}
