//! Direct convolution of few input channels into many output channels: an image stem (3
//! channels into 24-64, a 3x3 or 7x7 window, often strided) or a spectrogram's first layer
//! (1 channel into 32).
//!
//! The channels-last GEMM multiplies such a layer over im2col rows of only 9-147 floats: a
//! tile's fixed costs (zeroing, the epilogue, 16 stores) weigh against a depth loop of 9-27
//! steps, and the rows are copied first (transposed, for a channels-first image). Here the
//! input rows a band of output rows reads are staged as [`crate::planar`] stages them (per
//! input row, channel and stride phase, zeros in the padding), so output column `ox` reads
//! depth `p` at `offs[p] + ox`, and a tile multiplies up to 12 neighbouring output pixels
//! (one broadcast each) by a panel's 16 or 32 output channels (one or two vectors of the
//! packed B): 24 accumulators for 14 loads a depth step, no im2col at all. The epilogue
//! (bias, the cheap activations, PRelu slopes, the affine) runs on the accumulators, which
//! are stored straight into the channels-last output; a residual or a costly activation
//! stores the sums and runs the GEMM's epilogue over the rows after.
//!
//! Depth step `p` follows the packed B's order `(ky, kx, c)`, as the GEMM's.

use crate::conv::Conv2d;
use crate::planar::{Depth, LANES, Outs, Source};
use crate::sgemm::{Epilogue, PackedBRef};

/// Most input channels (above it the im2col rows are long enough for the GEMM's tiles).
const MAX_C: usize = 4;
/// Fewest output columns (a tile's pixels come from one output row).
const MIN_OW: usize = 8;
/// Most pixels of one tile.
const MAX_PIXELS: usize = 12;
/// Most channel vectors of one tile (a packed panel of 32 columns).
const MAX_VECTORS: usize = 2;

crate::scratch_kinds! {
    /// The band's staged input rows (planar, zero margins).
    Stage: Vec<f32>;
    /// Depth offsets into the staged band.
    Offsets: Vec<isize>;
}

/// Whether a convolution of `m` output and `c` input channels, a `kh x kw` window and `ow`
/// output columns is one this kernel is for: few input channels, more output channels than
/// [`crate::planar`] takes (that kernel puts pixels along the lanes, this one channels), a
/// window wider than 1x1.
pub fn takes(m: usize, c: usize, [kh, kw]: [usize; 2], ow: usize) -> bool {
    m > crate::planar::MAX_M && (1..=MAX_C).contains(&c) && ow >= MIN_OW && kh * kw > 1
}

/// Whether the kernel runs on this machine's active level (AVX-512 or AVX2); elsewhere
/// callers keep their GEMM paths.
pub fn supported() -> bool {
    crate::planar::supported()
}

/// One tile: for pixel `i < P` and column `j < cols <= 16 V`, `y[i * ldy + j]` = the
/// epilogue of `sum_p x[offs[p] + i] * w[p * nr + j]` (`outs`' vectors, when not null, hold
/// `cols` floats from the tile's first column).
type TileFn = unsafe fn(d: Depth, y: *mut f32, ldy: usize, cols: usize, outs: &Outs);

/// The scalar twin of the tile (the reference the SIMD one is tested against): the same
/// fused multiply-adds in the same order, so the sums agree bit for bit.
///
/// # Safety
/// `w + p * nr + j` readable for `p < k`, `j < 16 V`; `x + offs[p] + i` readable for
/// `p < k`, `i < P`; `offs` has `k` entries; `y + i * ldy + j` writable for `i < P`,
/// `j < cols <= 16 V`; `outs`' non-null vectors hold `cols` floats.
unsafe fn tile_portable<const V: usize, const P: usize>(d: Depth, y: *mut f32, ldy: usize, cols: usize, outs: &Outs) {
    let Depth { k, w, nr, x, offs } = d;
    let mut acc = [[0f32; 32]; P];
    for p in 0..k {
        // SAFETY: the caller's contract.
        let (xp, wp) = unsafe { (x.offset(*offs.add(p)), w.add(p * nr)) };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            let a = unsafe { *xp.add(i) };
            for (j, s) in row.iter_mut().take(LANES * V).enumerate() {
                // SAFETY: the caller's contract.
                *s = a.mul_add(unsafe { *wp.add(j) }, *s);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, &s) in row.iter().take(cols.min(LANES * V)).enumerate() {
            // SAFETY: the caller's contract: non-null vectors hold `cols > j` floats, `y + i *
            // ldy + j` is writable.
            unsafe { *y.add(i * ldy + j) = outs.finish(s, j) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Depth, LANES, Outs};
    use crate::sgemm::x86::avx512::VecEpi;
    use std::arch::x86_64::*;

    /// [`super::tile_portable`] on AVX-512: `P x V` accumulators in registers, the weights'
    /// `V` vectors loaded once a depth step and each pixel's input broadcast once.
    ///
    /// # Safety
    /// As [`super::tile_portable`]; the CPU has AVX-512 F + VL.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn tile<const V: usize, const P: usize>(
        d: Depth,
        y: *mut f32,
        ldy: usize,
        cols: usize,
        outs: &Outs,
    ) {
        let Depth { k, w, nr, x, offs } = d;
        let mut acc = [[_mm512_setzero_ps(); V]; P];
        for p in 0..k {
            // SAFETY: the caller's contract: `offs[p]`, the P inputs at `x + offs[p]` and the
            // 16 V weights at `w + p * nr` are readable.
            unsafe {
                let xp = x.offset(*offs.add(p));
                let wp = w.add(p * nr);
                let mut wv = [_mm512_setzero_ps(); V];
                for (v, wv) in wv.iter_mut().enumerate() {
                    *wv = _mm512_loadu_ps(wp.add(v * LANES));
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*xp.add(i));
                    for (s, &wv) in acc.iter_mut().zip(wv.iter()) {
                        *s = _mm512_fmadd_ps(a, wv, *s);
                    }
                }
            }
        }
        let epi = VecEpi::new(outs.act, outs.post);
        let zero = _mm512_setzero_ps();
        for v in 0..V {
            let n = cols.saturating_sub(v * LANES).min(LANES);
            if n == 0 {
                break;
            }
            let mask = ((1u32 << n) - 1) as __mmask16;
            // SAFETY: the caller's contract: non-null vectors hold `cols` floats, and the
            // mask covers columns `v * 16 + j < cols`.
            let (b, s) = unsafe {
                (
                    (!outs.bias.is_null()).then(|| _mm512_maskz_loadu_ps(mask, outs.bias.add(v * LANES))),
                    (!outs.slopes.is_null()).then(|| _mm512_maskz_loadu_ps(mask, outs.slopes.add(v * LANES))),
                )
            };
            for (i, acc) in acc.iter().enumerate() {
                let mut r = acc[v];
                if let Some(b) = b {
                    r = _mm512_add_ps(r, b);
                }
                r = epi.apply(r);
                if let Some(s) = s {
                    r = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(r, zero), r, s);
                }
                // SAFETY: the caller's contract: pixel `i < P`, columns under the mask.
                unsafe { _mm512_mask_storeu_ps(y.add(i * ldy + v * LANES), mask, r) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Depth, LANES, Outs};
    use crate::sgemm::x86::avx2::VecEpi;
    use std::arch::x86_64::*;

    /// Lanes of a ymm vector: a 16-channel vector of the packed B is two of them.
    const HALF: usize = 8;

    /// [`super::tile_portable`] on AVX2: `P x 2V` accumulators in registers (the level's
    /// tiles keep them at most 12), the weights' `2V` halves loaded once a depth step and
    /// each pixel's input broadcast once.
    ///
    /// # Safety
    /// As [`super::tile_portable`]; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const V: usize, const P: usize>(
        d: Depth,
        y: *mut f32,
        ldy: usize,
        cols: usize,
        outs: &Outs,
    ) {
        let Depth { k, w, nr, x, offs } = d;
        let mut acc = [[[_mm256_setzero_ps(); 2]; V]; P];
        for p in 0..k {
            // SAFETY: the caller's contract: `offs[p]`, the P inputs at `x + offs[p]` and the
            // 16 V weights at `w + p * nr` are readable.
            unsafe {
                let xp = x.offset(*offs.add(p));
                let wp = w.add(p * nr);
                let mut wv = [[_mm256_setzero_ps(); 2]; V];
                for (v, wv) in wv.iter_mut().enumerate() {
                    wv[0] = _mm256_loadu_ps(wp.add(v * LANES));
                    wv[1] = _mm256_loadu_ps(wp.add(v * LANES + HALF));
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let a = _mm256_set1_ps(*xp.add(i));
                    for (s, wv) in acc.iter_mut().zip(wv.iter()) {
                        s[0] = _mm256_fmadd_ps(a, wv[0], s[0]);
                        s[1] = _mm256_fmadd_ps(a, wv[1], s[1]);
                    }
                }
            }
        }
        let epi = VecEpi::new(outs.act, outs.post);
        let zero = _mm256_setzero_ps();
        if cols >= V * LANES {
            // All columns: each part of the epilogue over the whole tile, one decision each
            // (per vector, the flags' tests and the masks had cost a third of a 27-deep tile).
            // (A copy: mutated in place, the depth loop's accumulators had stayed in memory.)
            let mut acc = acc;
            // SAFETY: the caller's contract: non-null vectors hold `cols >= 16 V` floats,
            // and pixel `i < P` has `cols` writable floats at `y + i * ldy`.
            unsafe {
                if !outs.bias.is_null() {
                    let b: [[__m256; 2]; V] = std::array::from_fn(|v| {
                        std::array::from_fn(|h| _mm256_loadu_ps(outs.bias.add(v * LANES + h * HALF)))
                    });
                    for acc in acc.iter_mut() {
                        for (s, b) in acc.iter_mut().zip(&b) {
                            s[0] = _mm256_add_ps(s[0], b[0]);
                            s[1] = _mm256_add_ps(s[1], b[1]);
                        }
                    }
                }
                epi.apply_all(&mut acc);
                if !outs.slopes.is_null() {
                    let sl: [[__m256; 2]; V] = std::array::from_fn(|v| {
                        std::array::from_fn(|h| _mm256_loadu_ps(outs.slopes.add(v * LANES + h * HALF)))
                    });
                    for acc in acc.iter_mut() {
                        for (s, sl) in acc.iter_mut().zip(&sl) {
                            for (r, &m) in s.iter_mut().zip(sl) {
                                *r = _mm256_blendv_ps(*r, _mm256_mul_ps(*r, m), _mm256_cmp_ps::<_CMP_LT_OQ>(*r, zero));
                            }
                        }
                    }
                }
                for (i, acc) in acc.iter().enumerate() {
                    for (v, s) in acc.iter().enumerate() {
                        _mm256_storeu_ps(y.add(i * ldy + v * LANES), s[0]);
                        _mm256_storeu_ps(y.add(i * ldy + v * LANES + HALF), s[1]);
                    }
                }
            }
            return;
        }
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for v in 0..V {
            for half in 0..2 {
                let first = v * LANES + half * HALF;
                let n = cols.saturating_sub(first).min(HALF);
                if n == 0 {
                    break;
                }
                // Lanes below n set: the columns this half stores.
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
                // SAFETY: the caller's contract: non-null vectors hold `cols` floats, and the
                // mask covers columns `first + j < cols` (masked lanes are not read).
                let (b, s) = unsafe {
                    (
                        (!outs.bias.is_null()).then(|| _mm256_maskload_ps(outs.bias.add(first), mask)),
                        (!outs.slopes.is_null()).then(|| _mm256_maskload_ps(outs.slopes.add(first), mask)),
                    )
                };
                for (i, acc) in acc.iter().enumerate() {
                    let mut r = acc[v][half];
                    if let Some(b) = b {
                        r = _mm256_add_ps(r, b);
                    }
                    r = epi.apply(r);
                    if let Some(s) = s {
                        r = _mm256_blendv_ps(r, _mm256_mul_ps(r, s), _mm256_cmp_ps::<_CMP_LT_OQ>(r, zero));
                    }
                    // SAFETY: the caller's contract: pixel `i < P`, columns `first + j < cols`
                    // (plain stores: see `store_first`).
                    unsafe { crate::sgemm::x86::avx2::store_first(y.add(i * ldy + first), n, r) };
                }
            }
        }
    }

    /// A panel of 32 channels as two tiles of 16 ([`tile`] with one channel vector, `P` up
    /// to 6): 3 pixels of 32 channels in one tile needed 12 accumulators, 4 weight halves and
    /// a broadcast, one register more than AVX2 has, and the spilled accumulators' reloads
    /// ran the depth loop at half speed (a 3 -> 32 stem at 29 GFLOP/s).
    ///
    /// # Safety
    /// As [`super::tile_portable`] with `V = 2`; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pair<const P: usize>(d: Depth, y: *mut f32, ldy: usize, cols: usize, outs: &Outs) {
        // SAFETY: the first 16 columns of the caller's 32: its contract with `cols <= 16`.
        unsafe { tile::<1, P>(d, y, ldy, cols.min(LANES), outs) };
        if cols > LANES {
            let at = |p: *const f32| if p.is_null() { p } else { p.wrapping_add(LANES) };
            let upper = Outs {
                bias: at(outs.bias),
                slopes: at(outs.slopes),
                act: outs.act,
                post: outs.post,
                room: outs.room,
            };
            let d = Depth {
                w: d.w.wrapping_add(LANES),
                ..d
            };
            // SAFETY: columns 16 .. cols of the caller's tile: weights `w + 16 + p * nr + j`
            // for `j < 16` (inside its 32 per depth row), outputs `y + 16 + i * ldy + j` for
            // `j < cols - 16`, the vectors' floats from column 16.
            unsafe { tile::<1, P>(d, y.add(LANES), ldy, cols - LANES, &upper) };
        }
    }
}

macro_rules! tiles {
    ($($f:ident)::+) => {
        [
            [
                $($f)::+::<1, 1>, $($f)::+::<1, 2>, $($f)::+::<1, 3>, $($f)::+::<1, 4>,
                $($f)::+::<1, 5>, $($f)::+::<1, 6>, $($f)::+::<1, 7>, $($f)::+::<1, 8>,
                $($f)::+::<1, 9>, $($f)::+::<1, 10>, $($f)::+::<1, 11>, $($f)::+::<1, 12>,
            ],
            [
                $($f)::+::<2, 1>, $($f)::+::<2, 2>, $($f)::+::<2, 3>, $($f)::+::<2, 4>,
                $($f)::+::<2, 5>, $($f)::+::<2, 6>, $($f)::+::<2, 7>, $($f)::+::<2, 8>,
                $($f)::+::<2, 9>, $($f)::+::<2, 10>, $($f)::+::<2, 11>, $($f)::+::<2, 12>,
            ],
        ]
    };
}

/// A level's tiles, by channel vectors and pixels, and the most pixels a tile of one and of
/// two channel vectors takes (what fits its registers).
struct Level {
    tiles: [[TileFn; MAX_PIXELS]; MAX_VECTORS],
    pixels: [usize; MAX_VECTORS],
}

static PORTABLE: Level = Level {
    tiles: tiles!(tile_portable),
    pixels: [MAX_PIXELS, MAX_PIXELS],
};
#[cfg(target_arch = "x86_64")]
static AVX512: Level = Level {
    tiles: tiles!(avx512::tile),
    pixels: [MAX_PIXELS, MAX_PIXELS],
};
/// Sixteen ymm registers: 6 pixels of 16 channels (two halves each), 12 accumulators
/// beside the weights' halves and a broadcast; a panel of 32 channels as two such tiles
/// (`avx2::pair`).
#[cfg(target_arch = "x86_64")]
static AVX2: Level = Level {
    tiles: [
        tiles!(avx2::tile)[0],
        [
            avx2::pair::<1>,
            avx2::pair::<2>,
            avx2::pair::<3>,
            avx2::pair::<4>,
            avx2::pair::<5>,
            avx2::pair::<6>,
            avx2::pair::<7>,
            avx2::pair::<8>,
            avx2::pair::<9>,
            avx2::pair::<10>,
            avx2::pair::<11>,
            avx2::pair::<12>,
        ],
    ],
    pixels: [6, 6],
};

/// A row of `ow` output pixels as tiles `(first pixel, pixels)`: as few as take at most
/// `most` (at most 12) pixels each, near-equal (a tile of a few pixels has too few
/// accumulators to hide the multiply-add latency: 111 columns as 9 x 12 + 3 would end each
/// row on one).
fn pixel_tiles(ow: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = ow.div_ceil(most.clamp(1, MAX_PIXELS)).max(1);
    let (each, extra) = (ow / n, ow % n);
    (0..n).map(move |t| (t * each + t.min(extra), each + usize::from(t < extra)))
}

/// Output rows `oy0 .. oy0 + y.len() / (OW * M)` of one image's convolution into `y`
/// (channels-last `[rows, OW, M]`), on the calling thread, with the tiles of `level`; with a
/// residual (channels-last, added before the activation), a costly activation or per-pixel
/// vectors, the sums are stored and `epi` (whose residual starts at this block's first
/// pixel) runs over them after. `false` when an operand is shorter than `geo` says.
#[allow(clippy::too_many_arguments)]
fn rows_with(
    level: &Level,
    geo: &Conv2d,
    m: usize,
    x: Source<'_>,
    w: &PackedBRef<'_>,
    oy0: usize,
    y: &mut [f32],
    epi: &Epilogue<'_>,
) -> bool {
    let (s, wp, owp) = crate::planar::widths(geo);
    let (c, k, nr) = (geo.c, geo.k(), w.layout().nr());
    let per_row = geo.ow * m;
    // The packed B whole (not a gathered view of some of its depths).
    let whole = matches!(w.runs().as_slice(), [(0, 0, d)] if *d == k);
    if per_row == 0 || w.k() != k || w.n() != m || k == 0 || !whole || nr > LANES * MAX_VECTORS {
        return false;
    }
    let direct = crate::planar::direct_epilogue(epi, m);
    let nrows = y.len() / per_row;
    let row_floats = c * s * wp;
    let band = crate::planar::band_rows(geo, row_floats, nrows);
    let mut offs = crate::recycle::lend::<Offsets>();
    let max_off = crate::planar::depth_offsets(geo, &mut offs);
    let mut stage = crate::recycle::lend::<Stage>();
    stage.resize(crate::planar::staged_rows(geo, band) * row_floats, 0.0);
    let data = w.data();
    // Each panel of the packed B: its first column, columns, tiles (by pixels) and epilogue.
    let mut panels: smallvec::SmallVec<[(usize, usize, &[TileFn; MAX_PIXELS], Outs); 4]> = smallvec::SmallVec::new();
    for j0 in (0..m).step_by(nr) {
        let cols = nr.min(m - j0);
        let vectors = cols.div_ceil(LANES);
        if (j0 / nr) * w.stride() + (k - 1) * nr + vectors * LANES > data.len() {
            return false;
        }
        let Some(tiles) = level.tiles.get(vectors - 1) else {
            return false;
        };
        let at = |v: Option<&[f32]>| v.map_or(std::ptr::null(), |v| v[j0..].as_ptr());
        let outs = match direct {
            Some(dir) => Outs {
                bias: at(dir.bias),
                slopes: at(dir.slopes),
                act: dir.act,
                post: dir.post.filter(|_| dir.after.is_none()),
                room: false,
            },
            None => Outs {
                bias: std::ptr::null(),
                slopes: std::ptr::null(),
                act: None,
                post: None,
                room: false,
            },
        };
        panels.push((j0, cols, tiles, outs));
    }
    // The widest panel's vectors set the pixels a tile takes.
    let widest = nr.min(m).div_ceil(LANES).clamp(1, MAX_VECTORS);
    let most = level.pixels.get(widest - 1).copied().unwrap_or(1);
    let mut b0 = 0;
    while b0 < nrows {
        let nb = band.min(nrows - b0);
        if !crate::planar::stage_band(geo, x, oy0 + b0, nb, &mut stage) {
            return false;
        }
        for j in 0..nb {
            let base = j * geo.sh * row_floats;
            // The farthest float a tile reads: the largest depth offset plus the row's
            // last pixel.
            if base + max_off + owp > stage.len() {
                return false;
            }
            let Some(out) = y.get_mut((b0 + j) * per_row..(b0 + j + 1) * per_row) else {
                return false;
            };
            // Pixel tiles outermost: a tile's pixels get all their channels (whole
            // output lines, one after the other) before the next tile's.
            for (ox, p) in pixel_tiles(geo.ow, most) {
                for &(j0, cols, f, ref outs) in &panels[..] {
                    let Some(&f) = f.get(p - 1) else {
                        return false;
                    };
                    let d = Depth {
                        k,
                        w: data[(j0 / nr) * w.stride()..].as_ptr(),
                        nr,
                        x: stage[base + ox..].as_ptr(),
                        offs: offs.as_ptr(),
                    };
                    // SAFETY: the weights: `16 * vectors <= nr` floats of every depth row of
                    // this panel lie inside `data` (checked when the panels were listed; the
                    // panel is zero-padded past `m`). The stage: every offset plus `base + ox
                    // + p <= base + max offset + OW <= stage.len()` (checked above, `OW <=
                    // OWP`). The output: pixel `ox + i < OW` of this row has columns `j0 ..
                    // j0 + cols <= m` in `out`. The bias and slopes hold `m >= j0 + cols`
                    // floats; only cheap activations come with them.
                    unsafe { f(d, out[ox * m + j0..].as_mut_ptr(), m, cols, outs) };
                }
            }
            if let Some(dir) = direct {
                dir.finish_row(out);
            }
        }
        b0 += nb;
    }
    if direct.is_some() {
        return true;
    }
    // The residual starts at this block's first pixel; `epilogue_rows` checks its length.
    crate::sgemm::epilogue_rows(y, m, epi)
}

/// [`rows_with`] on the active level: AVX-512 or AVX2 where [`supported`], the scalar twin
/// elsewhere.
pub fn rows(
    geo: &Conv2d,
    m: usize,
    x: Source<'_>,
    w: &PackedBRef<'_>,
    oy0: usize,
    y: &mut [f32],
    epi: &Epilogue<'_>,
) -> bool {
    match crate::isa::active() {
        #[cfg(target_arch = "x86_64")]
        crate::isa::Isa::Avx512 => rows_with(&AVX512, geo, m, x, w, oy0, y, epi),
        #[cfg(target_arch = "x86_64")]
        crate::isa::Isa::Avx2Fma => rows_with(&AVX2, geo, m, x, w, oy0, y, epi),
        _ => rows_with(&PORTABLE, geo, m, x, w, oy0, y, epi),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv_testkit::{RowsAt, case as kit, noise, packed};
    use crate::sgemm::BLayout;

    /// [`crate::conv_testkit::case`] over this kernel's levels.
    fn levels() -> Vec<&'static RowsAt> {
        crate::conv_testkit::levels!(rows_with, PORTABLE, AVX2, AVX512)
    }

    #[test]
    fn stems_match_the_oracle() {
        // A 3 -> 64 stride-2 stem (SqueezeNet's), a 7x7 stride-2 one (ResNet's), a spectrogram's
        // 1 -> 32, a 3 -> 24 stem (a panel with a half-empty second vector), 3 -> 48 (a second
        // panel of one vector), dilated and asymmetric.
        let levels = levels();
        for (c, m, hw, k, s, d, p, first, seed) in [
            (3, 64, [33, 35], [3, 3], [2, 2], [1, 1], [0, 0], true, 1),
            (3, 64, [29, 31], [7, 7], [2, 2], [1, 1], [3, 3], true, 2),
            (1, 32, [17, 40], [3, 3], [1, 1], [1, 1], [1, 1], false, 3),
            (3, 24, [20, 27], [3, 3], [2, 2], [1, 1], [1, 1], false, 4),
            (3, 48, [12, 30], [3, 3], [1, 1], [1, 1], [1, 1], true, 5),
            (2, 40, [9, 50], [5, 3], [2, 1], [1, 2], [2, 4], false, 6),
            (4, 17, [8, 13], [2, 2], [1, 3], [2, 1], [0, 1], true, 7),
        ] {
            kit(&levels, true, c, m, hw, k, s, d, p, first, seed);
        }
    }

    /// Random geometries, output channels across one and two panels and partial vectors.
    #[test]
    fn levels_match_the_oracle_and_each_other() {
        crate::conv_testkit::random_cases(&levels(), true, 1..=4, 17..=80, 48);
    }

    #[test]
    fn pixel_tiles_cover_a_row_without_short_tiles() {
        for most in [3, 6, MAX_PIXELS] {
            for ow in 1..200 {
                let mut next = 0;
                for (ox, p) in pixel_tiles(ow, most) {
                    assert_eq!(ox, next, "{ow}");
                    assert!((1..=most).contains(&p), "{ow}: {p}");
                    assert!(p >= most.min(ow) / 2, "{ow}: {p}");
                    next += p;
                }
                assert_eq!(next, ow);
            }
        }
        assert_eq!(
            pixel_tiles(25, MAX_PIXELS).collect::<Vec<_>>(),
            [(0, 9), (9, 8), (17, 8)]
        );
        assert_eq!(
            pixel_tiles(25, 6).collect::<Vec<_>>(),
            [(0, 5), (5, 5), (10, 5), (15, 5), (20, 5)]
        );
    }

    #[test]
    fn short_operands_are_refused() {
        let g = Conv2d {
            c: 2,
            ih: 5,
            iw: 9,
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            ph: 1,
            pw: 1,
            oh: 5,
            ow: 9,
        };
        let pb = packed(&noise(20 * 18, 1), 20, &g, BLayout::NR32);
        let mut y = vec![0f32; 5 * 9 * 20];
        assert!(!rows(
            &g,
            20,
            Source::Last(&noise(89, 2)),
            &pb.view(),
            0,
            &mut y,
            &Epilogue::NONE
        ));
        assert!(rows(
            &g,
            20,
            Source::Last(&noise(90, 2)),
            &pb.view(),
            0,
            &mut y,
            &Epilogue::NONE
        ));
        let g2 = Conv2d { c: 3, ..g };
        assert!(!rows(
            &g2,
            20,
            Source::Last(&noise(135, 2)),
            &pb.view(),
            0,
            &mut y,
            &Epilogue::NONE
        ));
    }
}
