//! Direct convolution over pixel vectors, for convolutions with few output channels (a
//! detector's 3 -> 10, 10 -> 16 and 16 -> 32 layers at full resolution).
//!
//! The channels-last GEMM puts the output channels along the vector lanes: with 16 or fewer
//! of them a tile is one vector wide, and every multiply-add needs a load of its own (a
//! broadcast of the input), so the loads, not the multiplies, bound it (and 10 channels fill
//! 10 of 16 lanes). Here the lanes hold 16 neighbouring output pixels of one output row and
//! the tile is two-dimensional: up to 12 output channels (weights broadcast from the packed
//! B) by up to 3 pixel vectors, 24 accumulators for 11 loads a depth step.
//!
//! The input rows an output band reads are first staged channels-first ("planar"), one row
//! of `WP` floats per (input row, channel, stride phase): phase `f` of a row holds the
//! padded row's columns `f, f + sw, f + 2 sw, ...`, so a tap's 16 pixels are one contiguous
//! load at any stride, and the columns in the padding are zeros. Each band's output rows
//! are accumulated planar, `[M][OWP]`, then transposed into the channels-last output, where
//! the GEMM's epilogue (bias, residual, activation, PRelu, affine) runs over them.
//!
//! Depth step `p` follows the packed B's order `(ky, kx, c)`; its input vector starts at a
//! precomputed offset into the staged band (`offs[p]`), so the inner loop does no address
//! arithmetic beyond one table read.

use crate::conv::Conv2d;
use crate::sgemm::{Epilogue, PackedBRef, Residual};

/// Most output channels a convolution runs here with (callers' routing; above it the
/// channels-last GEMM's two-vector tiles do as well).
pub const MAX_M: usize = 16;
/// Most input channels (the staged band's rows grow with them).
pub const MAX_C: usize = 64;

/// Lanes of a pixel vector.
const LANES: usize = 16;
/// Most output channels of one tile (its broadcast rows).
const MAX_ROWS: usize = 12;
/// Floats of staged input a band aims at (kept in L2 beside the output rows).
const STAGE_FLOATS: usize = 48 * 1024;
/// Most output rows a band takes.
const MAX_BAND: usize = 16;

crate::scratch_kinds! {
    /// The band's staged input rows (planar, zero margins).
    Stage: Vec<f32>;
    /// The band's output rows, planar `[M][OWP]`.
    Planes: Vec<f32>;
    /// Depth offsets into the staged band.
    Offsets: Vec<isize>;
}

/// Where the input image is: channels-last `[IH, IW, C]` or channels-first `[C, IH, IW]`,
/// one image.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    Last(&'a [f32]),
    First(&'a [f32]),
}

/// Whether the kernel runs on this machine's active level (AVX-512); elsewhere callers keep
/// their GEMM paths.
pub fn supported() -> bool {
    crate::isa::active() == crate::isa::Isa::Avx512
}

/// One tile: `out[r * ldo + i] (+)= sum_p w[p * nr + r] * x[offs[p] + i]` for `r < R`,
/// `i < 16 * PV`.
type TileFn = unsafe fn(k: usize, w: *const f32, nr: usize, x: *const f32, offs: *const isize, out: *mut f32, ldo: usize);

/// The scalar twin of the tile (the reference the SIMD one is tested against).
///
/// # Safety
/// `w + p * nr + r` readable for `p < k`, `r < R`; `x + offs[p] + i` readable for `p < k`,
/// `i < 16 * PV`; `offs` has `k` entries; `out + r * ldo + i` writable for `r < R`,
/// `i < 16 * PV`.
unsafe fn tile_portable<const R: usize, const PV: usize>(
    k: usize,
    w: *const f32,
    nr: usize,
    x: *const f32,
    offs: *const isize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[0f32; 48]; R];
    for p in 0..k {
        // SAFETY: the caller's contract.
        let (xp, wp) = unsafe { (x.offset(*offs.add(p)), w.add(p * nr)) };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            let wv = unsafe { *wp.add(r) };
            for (i, a) in row.iter_mut().take(LANES * PV).enumerate() {
                // SAFETY: the caller's contract.
                *a = wv.mul_add(unsafe { *xp.add(i) }, *a);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (i, &a) in row.iter().take(LANES * PV).enumerate() {
            // SAFETY: the caller's contract.
            unsafe { *out.add(r * ldo + i) = a };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::LANES;
    use std::arch::x86_64::*;

    /// [`super::tile_portable`] on AVX-512: the accumulators stay in registers (R x PV <= 24).
    ///
    /// # Safety
    /// As [`super::tile_portable`]; the CPU has AVX-512 F.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn tile<const R: usize, const PV: usize>(
        k: usize,
        w: *const f32,
        nr: usize,
        x: *const f32,
        offs: *const isize,
        out: *mut f32,
        ldo: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); PV]; R];
        for p in 0..k {
            // SAFETY: the caller's contract: `offs[p]` and the PV vectors at `x + offs[p]`
            // and the R weights at `w + p * nr` are readable.
            unsafe {
                let xp = x.offset(*offs.add(p));
                let wp = w.add(p * nr);
                let mut xv = [_mm512_setzero_ps(); PV];
                for (v, xv) in xv.iter_mut().enumerate() {
                    *xv = _mm512_loadu_ps(xp.add(v * LANES));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wp.add(r));
                    for (a, &xv) in acc.iter_mut().zip(xv.iter()) {
                        *a = _mm512_fmadd_ps(wv, xv, *a);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, &a) in acc.iter().enumerate() {
                // SAFETY: the caller's contract: row `r < R` of `out` has 16 * PV writable floats.
                unsafe { _mm512_storeu_ps(out.add(r * ldo + v * LANES), a) };
            }
        }
    }
}

macro_rules! tiles {
    ($($f:ident)::+) => {
        [
            [$($f)::+::<1, 1>, $($f)::+::<1, 2>, $($f)::+::<1, 3>],
            [$($f)::+::<2, 1>, $($f)::+::<2, 2>, $($f)::+::<2, 3>],
            [$($f)::+::<3, 1>, $($f)::+::<3, 2>, $($f)::+::<3, 3>],
            [$($f)::+::<4, 1>, $($f)::+::<4, 2>, $($f)::+::<4, 3>],
            [$($f)::+::<5, 1>, $($f)::+::<5, 2>, $($f)::+::<5, 3>],
            [$($f)::+::<6, 1>, $($f)::+::<6, 2>, $($f)::+::<6, 3>],
            [$($f)::+::<7, 1>, $($f)::+::<7, 2>, $($f)::+::<7, 3>],
            [$($f)::+::<8, 1>, $($f)::+::<8, 2>, $($f)::+::<8, 3>],
            [$($f)::+::<9, 1>, $($f)::+::<9, 2>, $($f)::+::<9, 2>],
            [$($f)::+::<10, 1>, $($f)::+::<10, 2>, $($f)::+::<10, 2>],
            [$($f)::+::<11, 1>, $($f)::+::<11, 2>, $($f)::+::<11, 2>],
            [$($f)::+::<12, 1>, $($f)::+::<12, 2>, $($f)::+::<12, 2>],
        ]
    };
}

static PORTABLE: [[TileFn; 3]; MAX_ROWS] = tiles!(tile_portable);
#[cfg(target_arch = "x86_64")]
static AVX512: [[TileFn; 3]; MAX_ROWS] = tiles!(avx512::tile);

/// Pixel vectors a tile of `rows` output channels sweeps at once (24 accumulators at most).
fn vectors(rows: usize) -> usize {
    if rows > 8 { 2 } else { 3 }
}

/// The output channels' tiles: `(first channel, channels)`, none across a panel of the
/// packed B (`nr` columns): a panel of up to 12 columns is one tile, a wider one splits into
/// near-equal tiles of at most 8.
fn channel_tiles(m: usize, nr: usize) -> Vec<(usize, usize)> {
    let mut tiles = Vec::new();
    let mut j0 = 0;
    while j0 < m {
        let w = (m - j0).min(nr);
        let n = if w <= MAX_ROWS { 1 } else { w.div_ceil(8) };
        let each = w.div_ceil(n);
        let mut j = 0;
        while j < w {
            let r = each.min(w - j);
            tiles.push((j0 + j, r));
            j += r;
        }
        j0 += w;
    }
    tiles
}

/// The staged band's sizes for `geo`: `(phases, WP, OWP)`: stride phases per row, floats per
/// staged (row, channel, phase), output columns rounded up to whole vectors.
fn widths(geo: &Conv2d) -> (usize, usize, usize) {
    let s = geo.sw.max(1);
    let owp = geo.ow.next_multiple_of(LANES);
    let reach = (geo.kw.saturating_sub(1) * geo.dw) / s;
    (s, (owp + reach).next_multiple_of(LANES), owp)
}

/// Stages padded input row `u` (row `u - ph` of the image, zeros outside it) as `C x phases`
/// rows of `wp` floats into `dst`. `false` if X is short.
fn stage_row(geo: &Conv2d, x: Source<'_>, u: usize, dst: &mut [f32]) -> bool {
    let (s, wp, _) = widths(geo);
    let c = geo.c;
    let Some(iy) = u.checked_sub(geo.ph).filter(|&iy| iy < geo.ih) else {
        dst.fill(0.0);
        return true;
    };
    for f in 0..s {
        // Columns t with t * s + f - pw inside the image.
        let lo = geo.pw.saturating_sub(f).div_ceil(s).min(wp);
        let hi = (geo.iw + geo.pw).saturating_sub(f).div_ceil(s).clamp(lo, wp);
        for ci in 0..c {
            let Some(row) = dst.get_mut((ci * s + f) * wp..(ci * s + f + 1) * wp) else {
                return false;
            };
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
        }
        if lo == hi {
            continue;
        }
        let x0 = lo * s + f - geo.pw;
        let n = hi - lo;
        match x {
            Source::Last(x) => {
                let start = (iy * geo.iw + x0) * c;
                let Some(src) = x.get(start..start + ((n - 1) * s + 1) * c) else {
                    return false;
                };
                let Some(d) = dst.get_mut(f * wp + lo..) else {
                    return false;
                };
                if !crate::transpose::transpose_f32(src, s * c, n, c, d, s * wp) {
                    return false;
                }
            }
            Source::First(x) => {
                for ci in 0..c {
                    let start = (ci * geo.ih + iy) * geo.iw + x0;
                    let (Some(src), Some(d)) = (
                        x.get(start..start + (n - 1) * s + 1),
                        dst.get_mut((ci * s + f) * wp + lo..(ci * s + f) * wp + hi),
                    ) else {
                        return false;
                    };
                    if s == 1 {
                        d.copy_from_slice(src);
                    } else {
                        for (d, v) in d.iter_mut().zip(src.iter().step_by(s)) {
                            *d = *v;
                        }
                    }
                }
            }
        }
    }
    true
}

/// Output rows `oy0 .. oy0 + y.len() / (OW * M)` of one image's convolution into `y`
/// (channels-last `[rows, OW, M]`), on the calling thread, with `tiles` of the given
/// level: staged in bands, accumulated planar, transposed, then `epi` (whose residual
/// starts at this block's first pixel). `false` when an operand is shorter than `geo` says.
#[allow(clippy::too_many_arguments)]
fn rows_with(
    tiles: &[[TileFn; 3]; MAX_ROWS],
    geo: &Conv2d,
    m: usize,
    x: Source<'_>,
    w: &PackedBRef<'_>,
    oy0: usize,
    y: &mut [f32],
    epi: &Epilogue<'_>,
) -> bool {
    let (s, wp, owp) = widths(geo);
    let (c, k, nr) = (geo.c, geo.k(), w.layout().nr());
    let per_row = geo.ow * m;
    // The packed B whole (not a gathered view of some of its depths).
    let whole = matches!(w.runs().as_slice(), [(0, 0, d)] if *d == k);
    if per_row == 0 || w.k() != k || w.n() != m || k == 0 || !whole {
        return false;
    }
    let nrows = y.len() / per_row;
    let row_floats = c * s * wp;
    let band = (STAGE_FLOATS / (row_floats * geo.sh.max(1)).max(1)).clamp(1, MAX_BAND).min(nrows.max(1));
    let staged_rows = |b: usize| (b - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1;
    // Depth offsets into a staged band, `(ky, kx, c)` order as the packed B's.
    let mut offs = crate::recycle::lend::<Offsets>();
    offs.clear();
    for ky in 0..geo.kh {
        for kx in 0..geo.kw {
            let (f, t) = ((kx * geo.dw) % s, (kx * geo.dw) / s);
            for ci in 0..c {
                offs.push((((ky * geo.dh * c + ci) * s + f) * wp + t) as isize);
            }
        }
    }
    let max_off = offs.iter().copied().max().unwrap_or(0).max(0) as usize;
    let tiles_m = channel_tiles(m, nr);
    let mut stage = crate::recycle::lend::<Stage>();
    stage.resize(staged_rows(band) * row_floats, 0.0);
    let mut planes = crate::recycle::lend::<Planes>();
    planes.resize(m * owp, 0.0);
    let data = w.data();
    // Without a residual the epilogue runs on the planes, one call per channel row (per
    // pixel after the transpose it was a call per 16 floats); a residual is channels-last,
    // and comes before the activation, so then it all runs after the transpose.
    let by_pixel = |b: crate::sgemm::Bias<'_>| matches!(b, crate::sgemm::Bias::Row(_));
    let planar_epi = match epi.residual {
        _ if by_pixel(epi.bias) || by_pixel(epi.prelu) => None,
        Some(_) => None,
        None => Some(Epilogue {
            bias: columns_as_rows(epi.bias),
            prelu: columns_as_rows(epi.prelu),
            ..*epi
        }),
    };
    let mut b0 = 0;
    while b0 < nrows {
        let nb = band.min(nrows - b0);
        let oy = oy0 + b0;
        for r in 0..staged_rows(nb) {
            let Some(dst) = stage.get_mut(r * row_floats..(r + 1) * row_floats) else {
                return false;
            };
            if !stage_row(geo, x, oy * geo.sh + r, dst) {
                return false;
            }
        }
        for j in 0..nb {
            let base = j * geo.sh * row_floats;
            // The farthest float a tile reads: the largest depth offset plus a whole row
            // of vectors.
            let reach = base + max_off + owp;
            if reach > stage.len() {
                return false;
            }
            for &(j0, r) in &tiles_m {
                let (panel, jj) = (j0 / nr, j0 % nr);
                let wstart = panel * w.stride() + jj;
                if wstart + (k - 1) * nr + r > data.len() {
                    return false;
                }
                let pv = vectors(r);
                let mut v0 = 0;
                let nv = owp / LANES;
                while v0 < nv {
                    let step = pv.min(nv - v0);
                    let Some(f) = tiles.get(r - 1).and_then(|t| t.get(step - 1)) else {
                        return false;
                    };
                    // SAFETY: the weights span was checked above (`r` columns of every depth
                    // inside `data`); every offset plus `base + v0 * 16 + 16 * step <=
                    // base + max offset + owp <= stage.len()`; the planes hold `m` rows of
                    // `owp` floats and `j0 + r <= m`, `v0 * 16 + 16 * step <= owp`.
                    unsafe {
                        f(
                            k,
                            data.as_ptr().add(wstart),
                            nr,
                            stage.as_ptr().add(base + v0 * LANES),
                            offs.as_ptr(),
                            planes.as_mut_ptr().add(j0 * owp + v0 * LANES),
                            owp,
                        )
                    };
                    v0 += step;
                }
            }
            if let Some(e) = &planar_epi
                && !crate::sgemm::epilogue_rows(&mut planes, owp, e)
            {
                return false;
            }
            let Some(out) = y.get_mut((b0 + j) * per_row..(b0 + j + 1) * per_row) else {
                return false;
            };
            if !crate::transpose::transpose_f32(&planes, owp, m, geo.ow, out, m) {
                return false;
            }
        }
        b0 += nb;
    }
    if planar_epi.is_some() {
        return true;
    }
    let epi = match epi.residual {
        Some(r) => Epilogue {
            residual: Some(Residual {
                data: match r.data.get(..y.len()) {
                    Some(d) => d,
                    None => return false,
                },
                ld: r.ld,
            }),
            ..*epi
        },
        None => *epi,
    };
    crate::sgemm::epilogue_rows(y, m, &epi)
}

/// A per-channel vector of the channels-last output (a column of C there) as the planes'
/// per-row vector.
fn columns_as_rows(b: crate::sgemm::Bias<'_>) -> crate::sgemm::Bias<'_> {
    match b {
        crate::sgemm::Bias::Col(v) => crate::sgemm::Bias::Row(v),
        other => other,
    }
}

/// [`rows_with`] on the active level: AVX-512 where [`supported`], the scalar twin elsewhere.
pub fn rows(geo: &Conv2d, m: usize, x: Source<'_>, w: &PackedBRef<'_>, oy0: usize, y: &mut [f32], epi: &Epilogue<'_>) -> bool {
    #[cfg(target_arch = "x86_64")]
    if supported() {
        return rows_with(&AVX512, geo, m, x, w, oy0, y, epi);
    }
    rows_with(&PORTABLE, geo, m, x, w, oy0, y, epi)
}

/// The whole convolution of a batch: `x` is `batch` images (channels-last `[IH, IW, C]` or
/// channels-first `[C, IH, IW]` each, as `first` says), `y` the `[batch, OH, OW, M]`
/// output; bands of output rows go over the pool. `false` when an operand is short.
pub fn run(geo: &Conv2d, m: usize, x: &[f32], first: bool, w: &PackedBRef<'_>, y: &mut [f32], epi: &Epilogue<'_>) -> bool {
    let per_row = geo.ow * m;
    let image = geo.ih * geo.iw * geo.c;
    if per_row == 0 || geo.oh == 0 {
        return y.is_empty();
    }
    let threads = crate::pool::current_threads().max(1);
    // Blocks of output rows: several per thread (rows cost alike), none across images.
    let block = geo.oh.div_ceil(4 * threads).max(1);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let images = y.len() / (geo.oh * per_row);
    for n in 0..images {
        let Some(xi) = x.get(n * image..(n + 1) * image) else {
            return false;
        };
        let Some(yi) = y.get_mut(n * geo.oh * per_row..(n + 1) * geo.oh * per_row) else {
            return false;
        };
        let src = if first { Source::First(xi) } else { Source::Last(xi) };
        let residual = match epi.residual {
            Some(r) => match r.data.get(n * geo.oh * per_row..) {
                Some(data) => Some(Residual { data, ld: r.ld }),
                None => return false,
            },
            None => None,
        };
        crate::pool::for_each_chunk_mut(yi, block * per_row, &|bi, out| {
            let oy0 = bi * block;
            let residual = match residual {
                Some(r) => match r.data.get(oy0 * per_row..) {
                    Some(data) => Some(Residual { data, ld: r.ld }),
                    None => {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                        return;
                    }
                },
                None => None,
            };
            let e = Epilogue { residual, ..*epi };
            if !rows(geo, m, src, w, oy0, out, &e) {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    !failed.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sgemm::{Act, Bias, BLayout, PackedB};
    use proptest::prelude::*;

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The f64 oracle: channels-last `[OH, OW, M]` of one image, `w` as `[M][C][KH][KW]`.
    fn oracle(g: &Conv2d, m: usize, x: &[f32], first: bool, w: &[f32]) -> Vec<f64> {
        let mut y = vec![0f64; g.oh * g.ow * m];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                for j in 0..m {
                    let mut s = 0f64;
                    for ci in 0..g.c {
                        for ky in 0..g.kh {
                            for kx in 0..g.kw {
                                let iy = (oy * g.sh + ky * g.dh) as isize - g.ph as isize;
                                let ix = (ox * g.sw + kx * g.dw) as isize - g.pw as isize;
                                if iy < 0 || ix < 0 || iy as usize >= g.ih || ix as usize >= g.iw {
                                    continue;
                                }
                                let (iy, ix) = (iy as usize, ix as usize);
                                let xv = if first {
                                    x[(ci * g.ih + iy) * g.iw + ix]
                                } else {
                                    x[(iy * g.iw + ix) * g.c + ci]
                                };
                                s += xv as f64 * w[((j * g.c + ci) * g.kh + ky) * g.kw + kx] as f64;
                            }
                        }
                    }
                    y[(oy * g.ow + ox) * m + j] = s;
                }
            }
        }
        y
    }

    /// W `[M][C][KH][KW]` as the channels-last GEMM's packed B: depth `(ky, kx, c)`.
    fn packed(w: &[f32], m: usize, g: &Conv2d, layout: BLayout) -> PackedB {
        let k = g.k();
        let mut b = vec![0f32; k * m];
        for j in 0..m {
            for ci in 0..g.c {
                for ky in 0..g.kh {
                    for kx in 0..g.kw {
                        b[((ky * g.kw + kx) * g.c + ci) * m + j] = w[((j * g.c + ci) * g.kh + ky) * g.kw + kx];
                    }
                }
            }
        }
        PackedB::pack(layout, k, m, &b, crate::gemm::MatLayout::row_major(m)).unwrap()
    }

    #[allow(clippy::too_many_arguments)]
    fn case(c: usize, m: usize, [ih, iw]: [usize; 2], [kh, kw]: [usize; 2], [sh, sw]: [usize; 2], [dh, dw]: [usize; 2], [ph, pw]: [usize; 2], first: bool, seed: u64) {
        let oh = (ih + 2 * ph).saturating_sub((kh - 1) * dh + 1) / sh + 1;
        let ow = (iw + 2 * pw).saturating_sub((kw - 1) * dw + 1) / sw + 1;
        let g = Conv2d { c, ih, iw, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow };
        let x = noise(c * ih * iw, seed);
        let w = noise(m * c * kh * kw, seed + 1);
        let bias = noise(m, seed + 2);
        let want = oracle(&g, m, &x, first, &w);
        let src = if first { Source::First(&x) } else { Source::Last(&x) };
        for layout in [BLayout::NR32, BLayout::NR16] {
            let pb = packed(&w, m, &g, layout);
            let wref = pb.view();
            let epi = Epilogue {
                bias: Bias::Col(&bias),
                act: Some(Act::Relu),
                ..Epilogue::NONE
            };
            let mut outs = Vec::new();
            #[allow(unused_mut)]
            let mut levels = vec![&PORTABLE];
            #[cfg(target_arch = "x86_64")]
            if supported() {
                levels.push(&AVX512);
            }
            for tiles in levels {
                let mut y = vec![f32::NAN; oh * ow * m];
                // Two blocks of rows, the second from row 1 (or all of them in one).
                let split = oh.min(1) * ow * m;
                let (a, b) = y.split_at_mut(split);
                assert!(rows_with(tiles, &g, m, src, &wref, 0, a, &epi));
                assert!(rows_with(tiles, &g, m, src, &wref, oh.min(1), b, &epi));
                outs.push(y);
            }
            for y in &outs {
                for (i, (&got, &s)) in y.iter().zip(&want).enumerate() {
                    let s = (s + bias[i % m] as f64).max(0.0);
                    assert!(
                        (got as f64 - s).abs() <= 1e-4 * (1.0 + s.abs()),
                        "c {c} m {m} {ih}x{iw} k {kh}x{kw} s {sh},{sw} d {dh},{dw} p {ph},{pw} first {first}: [{i}] {got} vs {s}"
                    );
                }
            }
            // The levels agree to rounding (the scalar twin fuses each multiply-add too).
            if let [a, b] = &outs[..] {
                for (p, q) in a.iter().zip(b) {
                    assert!((p - q).abs() <= 1e-5 * (1.0 + p.abs()));
                }
            }
        }
    }

    #[test]
    fn detector_layers_match_the_oracle() {
        case(10, 16, [21, 37], [3, 3], [1, 1], [1, 1], [0, 0], false, 1);
        case(3, 10, [30, 19], [3, 3], [1, 1], [1, 1], [0, 0], true, 2);
        case(3, 16, [33, 35], [3, 3], [2, 2], [1, 1], [1, 1], true, 3);
        case(16, 12, [9, 50], [5, 5], [2, 1], [1, 2], [2, 4], false, 4);
        case(1, 5, [4, 3], [3, 3], [1, 1], [1, 1], [1, 1], false, 5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Random geometries, both sources, channels across every tile shape (1-16, so
        /// one-tile panels, split panels, panels across NR16's boundary), windows reading
        /// only padding at the edges.
        #[test]
        fn levels_match_the_oracle_and_each_other(
            c in 1usize..=9,
            m in 1usize..=16,
            ih in 1usize..=12,
            iw in 1usize..=40,
            kh in 1usize..=4,
            kw in 1usize..=4,
            sh in 1usize..=3,
            sw in 1usize..=3,
            dh in 1usize..=2,
            dw in 1usize..=2,
            ph in 0usize..=3,
            pw in 0usize..=3,
            first: bool,
            seed in 0u64..1000,
        ) {
            prop_assume!(ih + 2 * ph > (kh - 1) * dh && iw + 2 * pw > (kw - 1) * dw);
            case(c, m, [ih, iw], [kh, kw], [sh, sw], [dh, dw], [ph, pw], first, seed);
        }
    }

    #[test]
    fn channel_tiles_cover_each_channel_once_inside_a_panel() {
        for nr in [16, 32] {
            for m in 1..=40 {
                let t = channel_tiles(m, nr);
                let mut next = 0;
                for &(j0, r) in &t {
                    assert_eq!(j0, next);
                    assert!((1..=MAX_ROWS).contains(&r));
                    assert_eq!(j0 / nr, (j0 + r - 1) / nr, "m {m} nr {nr}: {t:?}");
                    next += r;
                }
                assert_eq!(next, m);
            }
        }
        assert_eq!(channel_tiles(10, 32), [(0, 10)]);
        assert_eq!(channel_tiles(16, 32), [(0, 8), (8, 8)]);
        assert_eq!(channel_tiles(24, 16), [(0, 8), (8, 8), (16, 8)]);
    }

    #[test]
    fn short_operands_are_refused() {
        let g = Conv2d { c: 2, ih: 5, iw: 5, kh: 3, kw: 3, sh: 1, sw: 1, dh: 1, dw: 1, ph: 1, pw: 1, oh: 5, ow: 5 };
        let pb = packed(&noise(8 * 18, 1), 8, &g, BLayout::NR32);
        let mut y = vec![0f32; 5 * 5 * 8];
        assert!(!rows(&g, 8, Source::Last(&noise(49, 2)), &pb.view(), 0, &mut y, &Epilogue::NONE));
        assert!(rows(&g, 8, Source::Last(&noise(50, 2)), &pb.view(), 0, &mut y, &Epilogue::NONE));
        let g2 = Conv2d { c: 3, ..g };
        assert!(!rows(&g2, 8, Source::Last(&noise(75, 2)), &pb.view(), 0, &mut y, &Epilogue::NONE));
    }
}
