//! The exact int32 sums of a 2-D 8-bit convolution, for `QLinearConv` (and `ConvInteger`):
//! `sum (x - zx) (w - zw[m])` over each window, by the integer GEMM on an im2col of X (its
//! padding filled with X's zero point, so it adds nothing) against W packed per group, or for
//! depthwise convolutions by a direct loop over the taps. The sums are the general path's
//! values exactly (it sums the same integers in f64), so the requantization that follows gives
//! identical results.

use super::integer::{ConvAttrs, Geometry};
use crate::error::Result;
use kiln_kernels::igemm::{Int8, MAX_EXACT_DEPTH, PackedB, igemm};
use kiln_tensor::{DType, Tensor};

/// W of a grouped convolution packed for the integer GEMM: one `[cg * kh * kw, m / group]`
/// matrix per group, with its output channels' zero points.
pub(crate) type GroupPacks = Vec<PackedB>;

/// Packs W `[m, cg, kh, kw]` (u8 or i8, zero point one or one per output channel) per group.
pub(crate) fn pack_groups(w: &Tensor, zw: Option<&Tensor>, groups: usize) -> Option<GroupPacks> {
    match w.dtype() {
        DType::U8 => pack_typed::<u8>(
            w.as_slice().ok()?,
            w.shape(),
            zw.map(|z| z.as_slice::<u8>().ok()),
            groups,
        ),
        DType::I8 => pack_typed::<i8>(
            w.as_slice().ok()?,
            w.shape(),
            zw.map(|z| z.as_slice::<i8>().ok()),
            groups,
        ),
        _ => None,
    }
}

fn pack_typed<T: Int8 + Default>(w: &[T], ws: &[usize], zw: Option<Option<&[T]>>, groups: usize) -> Option<GroupPacks> {
    let &[m, cg, kh, kw] = ws else { return None };
    let zw: &[T] = match zw {
        Some(Some(z)) => z,
        Some(None) => return None,
        None => &[],
    };
    if groups == 0 || m % groups != 0 || (zw.len() > 1 && zw.len() != m) {
        return None;
    }
    let (k, mpg) = (cg * kh * kw, m / groups);
    (0..groups)
        .map(|gi| {
            let mut b = vec![T::default(); k * mpg];
            for j in 0..mpg {
                let row = w.get((gi * mpg + j) * k..(gi * mpg + j + 1) * k)?;
                for (kk, &v) in row.iter().enumerate() {
                    *b.get_mut(kk * mpg + j)? = v;
                }
            }
            let z: Vec<T> = match zw {
                [] => Vec::new(),
                [z] => vec![*z],
                zs => zs.get(gi * mpg..(gi + 1) * mpg)?.to_vec(),
            };
            PackedB::pack(&b, k, mpg, &z).ok()
        })
        .collect()
}

/// The exact sums `[n, m, oh, ow]` of X `[n, c, h, w]` (u8 or i8, zero point `zx`) convolved
/// with W (`packs` from [`pack_groups`], or `w` itself for a depthwise convolution); `None`
/// when this path does not apply (not 2-D, other types, sums beyond int32), and the caller's
/// general path then computes it.
pub(crate) fn conv2d(
    attrs: &ConvAttrs,
    g: &Geometry,
    x: &Tensor,
    zx: i32,
    w: &Tensor,
    zw: Option<&Tensor>,
    packs: Option<&GroupPacks>,
) -> Result<Option<Vec<i32>>> {
    if g.out.len() != 2 || x.shape().len() != 4 || w.shape().len() != 4 {
        return Ok(None);
    }
    match x.dtype() {
        DType::U8 => conv_typed::<u8>(attrs, g, x.as_slice()?, x.shape(), zx, w, zw, packs),
        DType::I8 => conv_typed::<i8>(attrs, g, x.as_slice()?, x.shape(), zx, w, zw, packs),
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
    packs: Option<&GroupPacks>,
) -> Result<Option<Vec<i32>>> {
    let (&[n, c, h, wd], &[m, cg, kh, kw]) = (xs, w.shape()) else {
        return Ok(None);
    };
    let groups = attrs.group.max(1);
    if c != cg * groups || m % groups != 0 {
        return Ok(None);
    }
    let (Some(&oh), Some(&ow)) = (g.out.first(), g.out.get(1)) else {
        return Ok(None);
    };
    let geo = |v: &[usize], d: usize| v.get(d).copied().unwrap_or(1);
    let (sh, sw) = (geo(&g.strides, 0), geo(&g.strides, 1));
    let (dh, dw) = (geo(&g.dilations, 0), geo(&g.dilations, 1));
    let (ph, pw) = (
        g.pad_begin.first().copied().unwrap_or(0),
        g.pad_begin.get(1).copied().unwrap_or(0),
    );
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
        for ni in 0..n {
            for ch in 0..m {
                let (Some(plane), Some(taps)) = (
                    x.get((ni * c + ch) * ipix..(ni * c + ch + 1) * ipix),
                    wv.get(ch * kpix..(ch + 1) * kpix),
                ) else {
                    return Ok(None);
                };
                let z = zwv.get(ch).or(zwv.first()).copied().unwrap_or(0);
                let taps: Vec<i32> = taps.iter().map(|&v| v - z).collect();
                let xs: Vec<i32> = plane.iter().map(|v| v.widen() - zx).collect();
                let Some(out) = acc.get_mut((ni * m + ch) * opix..(ni * m + ch + 1) * opix) else {
                    return Ok(None);
                };
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
            }
        }
        return Ok(Some(acc));
    }
    let owned;
    let packs = match packs {
        Some(p) => p,
        None => {
            let Some(p) = pack_groups(w, zw, groups) else {
                return Ok(None);
            };
            owned = p;
            &owned
        }
    };
    let k = cg * kpix;
    let Ok(pad) = T::try_from(zx) else { return Ok(None) };
    let mut cols = vec![pad; opix * k];
    let mut prod = vec![0i32; opix * mpg];
    for ni in 0..n {
        for (gi, packed) in packs.iter().enumerate().take(groups) {
            // im2col of this image's group: row = output pixel, column = (channel, ky, kx).
            for oy in 0..oh {
                for ox in 0..ow {
                    let Some(row) = cols.get_mut((oy * ow + ox) * k..(oy * ow + ox + 1) * k) else {
                        return Ok(None);
                    };
                    for ci in 0..cg {
                        let Some(plane) = x.get((ni * c + gi * cg + ci) * ipix..(ni * c + gi * cg + ci + 1) * ipix)
                        else {
                            return Ok(None);
                        };
                        for ky in 0..kh {
                            let iy = at(oy, ky, sh, dh, ph, h);
                            for kx in 0..kw {
                                let v = match (iy, at(ox, kx, sw, dw, pw, wd)) {
                                    (Some(iy), Some(ix)) => plane.get(iy * wd + ix).copied().unwrap_or(pad),
                                    _ => pad,
                                };
                                if let Some(slot) = row.get_mut(ci * kpix + ky * kw + kx) {
                                    *slot = v;
                                }
                            }
                        }
                    }
                }
            }
            if igemm(opix, k, &cols, k, zx, packed, &mut prod, mpg).is_err() {
                return Ok(None);
            }
            for j in 0..mpg {
                let Some(out) = acc.get_mut((ni * m + gi * mpg + j) * opix..(ni * m + gi * mpg + j + 1) * opix) else {
                    return Ok(None);
                };
                for (p, o) in out.iter_mut().enumerate() {
                    *o = prod.get(p * mpg + j).copied().unwrap_or(0);
                }
            }
        }
    }
    Ok(Some(acc))
}
