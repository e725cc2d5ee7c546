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
use crate::sgemm::{Bias, Epilogue, PackedBRef, Residual};

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

/// Whether the kernel runs on this machine's active level (AVX-512); elsewhere callers keep
/// their GEMM paths.
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
            // SAFETY: the caller's contract: non-null vectors hold `cols` floats.
            let (b, sl) = unsafe {
                (
                    (!outs.bias.is_null()).then(|| *outs.bias.add(j)),
                    (!outs.slopes.is_null()).then(|| *outs.slopes.add(j)),
                )
            };
            let mut v = s + b.unwrap_or(0.0);
            if let Some(act) = outs.act {
                v = act.apply_scalar(v);
            }
            if let Some(post) = outs.post {
                v = post.apply(v);
            }
            if let Some(sl) = sl
                && v < 0.0
            {
                v *= sl;
            }
            // SAFETY: the caller's contract.
            unsafe { *y.add(i * ldy + j) = v };
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

/// A level's tiles, by channel vectors and pixels.
struct Level {
    tiles: [[TileFn; MAX_PIXELS]; MAX_VECTORS],
}

static PORTABLE: Level = Level {
    tiles: tiles!(tile_portable),
};
#[cfg(target_arch = "x86_64")]
static AVX512: Level = Level {
    tiles: tiles!(avx512::tile),
};

/// A row of `ow` output pixels as tiles `(first pixel, pixels)`: as few as take at most 12
/// pixels each, near-equal (a tile of a few pixels has too few accumulators to hide the
/// multiply-add latency: 111 columns as 9 x 12 + 3 would end each row on one).
fn pixel_tiles(ow: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = ow.div_ceil(MAX_PIXELS).max(1);
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
    fn column(b: Bias<'_>, m: usize) -> Option<Option<&[f32]>> {
        match b {
            Bias::None => Some(None),
            Bias::Col(v) if v.len() == m => Some(Some(v)),
            _ => None,
        }
    }
    let direct = match (column(epi.bias, m), column(epi.prelu, m)) {
        (Some(bias), Some(slopes)) if epi.residual.is_none() && epi.act.is_none_or(|a| a.is_cheap()) => {
            Some((bias, slopes))
        }
        _ => None,
    };
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
            Some((bias, slopes)) => Outs {
                bias: at(bias),
                slopes: at(slopes),
                act: epi.act,
                post: epi.post,
            },
            None => Outs {
                bias: std::ptr::null(),
                slopes: std::ptr::null(),
                act: None,
                post: None,
            },
        };
        panels.push((j0, cols, tiles, outs));
    }
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
            for (ox, p) in pixel_tiles(geo.ow) {
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
        }
        b0 += nb;
    }
    if direct.is_some() {
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

/// [`rows_with`] on the active level: AVX-512 where [`supported`], the scalar twin elsewhere.
pub fn rows(
    geo: &Conv2d,
    m: usize,
    x: Source<'_>,
    w: &PackedBRef<'_>,
    oy0: usize,
    y: &mut [f32],
    epi: &Epilogue<'_>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if supported() {
        return rows_with(&AVX512, geo, m, x, w, oy0, y, epi);
    }
    rows_with(&PORTABLE, geo, m, x, w, oy0, y, epi)
}

/// The whole convolution of a batch: `x` is `batch` images (channels-last `[IH, IW, C]` or
/// channels-first `[C, IH, IW]` each, as `first` says), `y` the `[batch, OH, OW, M]`
/// output; blocks of output rows go over the pool. `false` when an operand is short.
pub fn run(
    geo: &Conv2d,
    m: usize,
    x: &[f32],
    first: bool,
    w: &PackedBRef<'_>,
    y: &mut [f32],
    epi: &Epilogue<'_>,
) -> bool {
    crate::planar::run_bands(geo, m, x, first, w, y, epi, rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sgemm::{Act, BLayout, PackedB};
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
    fn case(
        c: usize,
        m: usize,
        [ih, iw]: [usize; 2],
        [kh, kw]: [usize; 2],
        [sh, sw]: [usize; 2],
        [dh, dw]: [usize; 2],
        [ph, pw]: [usize; 2],
        first: bool,
        seed: u64,
    ) {
        let oh = (ih + 2 * ph).saturating_sub((kh - 1) * dh + 1) / sh + 1;
        let ow = (iw + 2 * pw).saturating_sub((kw - 1) * dw + 1) / sw + 1;
        let g = Conv2d {
            c,
            ih,
            iw,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            ph,
            pw,
            oh,
            ow,
        };
        let x = noise(c * ih * iw, seed);
        let w = noise(m * c * kh * kw, seed + 1);
        let bias = noise(m, seed + 2);
        let want = oracle(&g, m, &x, first, &w);
        let src = if first { Source::First(&x) } else { Source::Last(&x) };
        let slopes = noise(m, seed + 3);
        let resid = noise(oh * ow * m, seed + 4);
        // (activation, PRelu slopes, residual): in registers, then the stored sums' paths.
        let kinds: [(Option<Act>, bool, bool); 5] = [
            (Some(Act::Relu), false, false),
            (Some(Act::HardSwish), false, false),
            (None, true, false),
            (Some(Act::Sigmoid), false, false),
            (Some(Act::Relu), false, true),
        ];
        let kind = kinds[seed as usize % kinds.len()];
        let finish = |i: usize, v: f64| {
            let j = i % m;
            let mut v = v + bias[j] as f64;
            if kind.2 {
                v += resid[i] as f64;
            }
            match kind.0 {
                Some(act) => act.apply_scalar(v as f32) as f64,
                None if kind.1 && v < 0.0 => v * slopes[j] as f64,
                None => v,
            }
        };
        for layout in [BLayout::NR32, BLayout::NR16] {
            let pb = packed(&w, m, &g, layout);
            let wref = pb.view();
            let epi = Epilogue {
                bias: Bias::Col(&bias),
                act: kind.0,
                prelu: if kind.1 { Bias::Col(&slopes) } else { Bias::None },
                ..Epilogue::NONE
            };
            let mut outs = Vec::new();
            #[allow(unused_mut)]
            let mut levels = vec![&PORTABLE];
            #[cfg(target_arch = "x86_64")]
            if supported() {
                levels.push(&AVX512);
            }
            for level in levels {
                let mut y = vec![f32::NAN; oh * ow * m];
                // Two blocks of rows, the second from row 1 (or all of them in one).
                let split = oh.min(1) * ow * m;
                let (a, b) = y.split_at_mut(split);
                fn with<'e>(epi: &Epilogue<'e>, r: Option<&'e [f32]>, m: usize) -> Epilogue<'e> {
                    Epilogue {
                        residual: r.map(|data| Residual { data, ld: m }),
                        ..*epi
                    }
                }
                let resid = kind.2.then_some(resid.as_slice());
                assert!(rows_with(level, &g, m, src, &wref, 0, a, &with(&epi, resid, m)));
                assert!(rows_with(
                    level,
                    &g,
                    m,
                    src,
                    &wref,
                    oh.min(1),
                    b,
                    &with(&epi, resid.map(|r| &r[split..]), m)
                ));
                outs.push(y);
            }
            for y in &outs {
                for (i, (&got, &s)) in y.iter().zip(&want).enumerate() {
                    let s = finish(i, s);
                    assert!(
                        (got as f64 - s).abs() <= 1e-4 * (1.0 + s.abs()),
                        "c {c} m {m} {ih}x{iw} k {kh}x{kw} s {sh},{sw} d {dh},{dw} p {ph},{pw} first {first} {kind:?}: [{i}] {got} vs {s}"
                    );
                }
            }
            // The levels' sums agree bit for bit (the same fused multiply-adds in the same
            // order); the vector activations round within a few ulps of the scalar ones.
            if let [a, b] = &outs[..] {
                for (p, q) in a.iter().zip(b) {
                    if kind.0.is_none_or(|a| a == Act::Relu) {
                        assert_eq!(p.to_bits(), q.to_bits());
                    } else {
                        assert!((p - q).abs() <= 1e-5 * (1.0 + p.abs()));
                    }
                }
            }
        }
    }

    #[test]
    fn stems_match_the_oracle() {
        // A 3 -> 64 stride-2 stem (SqueezeNet's), a 7x7 stride-2 one (ResNet's), a spectrogram's
        // 1 -> 32, a 3 -> 24 stem (a panel with a half-empty second vector), 3 -> 48 (a second
        // panel of one vector), dilated and asymmetric.
        case(3, 64, [33, 35], [3, 3], [2, 2], [1, 1], [0, 0], true, 1);
        case(3, 64, [29, 31], [7, 7], [2, 2], [1, 1], [3, 3], true, 2);
        case(1, 32, [17, 40], [3, 3], [1, 1], [1, 1], [1, 1], false, 3);
        case(3, 24, [20, 27], [3, 3], [2, 2], [1, 1], [1, 1], false, 4);
        case(3, 48, [12, 30], [3, 3], [1, 1], [1, 1], [1, 1], true, 5);
        case(2, 40, [9, 50], [5, 3], [2, 1], [1, 2], [2, 4], false, 6);
        case(4, 17, [8, 13], [2, 2], [1, 3], [2, 1], [0, 1], true, 7);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Random geometries, both sources, channel counts across one and two panels and
        /// partial vectors, windows reading only padding at the edges, rows of 1 to 40 pixels
        /// (every tile width).
        #[test]
        fn levels_match_the_oracle_and_each_other(
            c in 1usize..=4,
            m in 17usize..=80,
            ih in 1usize..=10,
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
    fn pixel_tiles_cover_a_row_without_short_tiles() {
        for ow in 1..200 {
            let mut next = 0;
            for (ox, p) in pixel_tiles(ow) {
                assert_eq!(ox, next, "{ow}");
                assert!((1..=MAX_PIXELS).contains(&p), "{ow}: {p}");
                assert!(p >= MAX_PIXELS.min(ow) / 2, "{ow}: {p}");
                next += p;
            }
            assert_eq!(next, ow);
        }
        assert_eq!(pixel_tiles(25).collect::<Vec<_>>(), [(0, 9), (9, 8), (17, 8)]);
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
