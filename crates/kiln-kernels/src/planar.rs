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
use crate::sgemm::{Bias, Epilogue, PackedBRef, Residual};

/// Most output channels a convolution runs here with in place of Winograd ([`takes`]):
/// above it Winograd does as well or better.
pub(crate) const MAX_M: usize = 16;
/// Most output channels a convolution that is not Winograd's (a stride, a 2x2 or 5x5
/// window) runs here with in place of the channels-last GEMM ([`takes_direct`]). From 17 to
/// 24 channels the GEMM's tile is its narrow twin (16 lanes and 8 of a half vector: three
/// quarters of the multiplies' width) and copies an im2col row per pixel; here the channels
/// are three 8-row tiles over whole pixel vectors. Intel Xeon (no AMX), per-layer minimum
/// over 6 alternating `kiln profile` rounds: PP-HGNet's 2x2 48 -> 24 at 24 x 485 (6 images)
/// 12.3 -> 8.0 ms, 2x2 32 -> 20 0.51x, 3x3 stride 2 16 -> 24 at 112 x 112 0.60x, 48 -> 24
/// 0.76-0.83x, 64 -> 24 at 224 x 224 0.86x, 5x5 32 -> 24 0.69x. At 32 and 48 channels the
/// GEMM's two whole vectors did as well or better (3x3 stride 2 32 -> 32 1.15x here).
const MAX_M_DIRECT: usize = 24;
/// Most input channels (the staged band's rows grow with them).
const MAX_C: usize = 64;
/// Fewest output columns: a row's pixels fill whole vectors of 16 (5 columns would use 5
/// lanes of 16).
const MIN_OW: usize = 24;

/// Whether a convolution of `m` output and `c` input channels, a `kh x kw` window and `ow`
/// output columns is one this kernel is for, on any level (callers route it here where
/// [`supported`]; the compiler leaves such layers out of Winograd): a 1x1 window stages a
/// row per tap (0.072 -> 0.088 ms on a 64 -> 16 stride-2 layer), so not those.
pub fn takes(m: usize, c: usize, [kh, kw]: [usize; 2], ow: usize) -> bool {
    m <= MAX_M && c <= MAX_C && ow >= MIN_OW && kh * kw > 1
}

/// Whether a convolution that runs direct (not Winograd's: the compiler asked [`takes`]
/// first) is one for this kernel rather than the channels-last GEMM: as [`takes`], with up
/// to [`MAX_M_DIRECT`] output channels, but not an image stem's few input channels, which
/// [`crate::stem`] keeps (3 -> 24 stride 2 at 640 x 640: 2.56 ms there, 3.11 here).
pub fn takes_direct(m: usize, c: usize, [kh, kw]: [usize; 2], ow: usize) -> bool {
    takes(m, c, [kh, kw], ow)
        || (m <= MAX_M_DIRECT && c <= MAX_C && ow >= MIN_OW && kh * kw > 1 && !crate::stem::takes(m, c, [kh, kw], ow))
}

/// Lanes of a pixel vector.
pub(crate) const LANES: usize = 16;
/// Most output channels of one tile (its broadcast rows).
const MAX_ROWS: usize = 8;
/// Floats of staged input a band aims at (kept in L2 beside the output rows).
pub(crate) const STAGE_FLOATS: usize = 48 * 1024;
/// Most output rows a band takes.
pub(crate) const MAX_BAND: usize = 16;

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

/// Whether the kernel runs on this machine's active level (AVX-512 or AVX2); elsewhere
/// callers keep their GEMM paths.
pub fn supported() -> bool {
    matches!(crate::isa::active(), crate::isa::Isa::Avx512 | crate::isa::Isa::Avx2Fma)
}

/// A tile's depth sweep: `k` steps, step `p` multiplying the weights at `w + p * nr` (one
/// per channel) by the pixel vectors at `x + offs[p]`.
#[derive(Clone, Copy)]
pub(crate) struct Depth {
    pub(crate) k: usize,
    pub(crate) w: *const f32,
    pub(crate) nr: usize,
    pub(crate) x: *const f32,
    pub(crate) offs: *const isize,
}

/// One tile: `out[r * ldo + i] = sum_p w[p * nr + r] * x[offs[p] + i]` for `r < R`,
/// `i < 16 * PV` (the planes, for the epilogue to run over afterwards).
type TileFn = unsafe fn(d: Depth, out: *mut f32, ldo: usize);

/// One tile straight into the channels-last output with its epilogue: the sums above, plus
/// `bias[r]`, through the activation and affine, times `slopes[r]` where negative, stored at
/// `y[i * ldy + r]` for the first `pixels` pixels `i`.
type NhwcFn = unsafe fn(d: Depth, y: *mut f32, ldy: usize, pixels: usize, outs: &Outs);

/// What a channels-last tile applies: per-channel vectors (null when absent, else `R`
/// floats from the tile's first channel) and the cheap activation and affine.
pub(crate) struct Outs {
    pub(crate) bias: *const f32,
    pub(crate) slopes: *const f32,
    pub(crate) act: Option<crate::sgemm::Act>,
    pub(crate) post: Option<crate::sgemm::Affine>,
    /// Each pixel has 8 writable floats from the tile's first channel, and the ones past the
    /// tile's channels are written again later (by the next channel tiles): the AVX2 tile
    /// then stores whole vectors.
    pub(crate) room: bool,
}

/// The depth sums of a tile, `acc[r][i]` (the scalar twin's).
///
/// # Safety
/// `w + p * nr + r` readable for `p < k`, `r < R`; `x + offs[p] + i` readable for `p < k`,
/// `i < 16 * PV`; `offs` has `k` entries.
unsafe fn sums<const R: usize, const PV: usize>(Depth { k, w, nr, x, offs }: Depth) -> [[f32; 48]; R] {
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
    acc
}

/// The scalar twin of the planes tile (the reference the SIMD one is tested against).
///
/// # Safety
/// As [`sums`]; `out + r * ldo + i` writable for `r < R`, `i < 16 * PV`.
unsafe fn tile_portable<const R: usize, const PV: usize>(d: Depth, out: *mut f32, ldo: usize) {
    // SAFETY: the caller's contract.
    let acc = unsafe { sums::<R, PV>(d) };
    for (r, row) in acc.iter().enumerate() {
        for (i, &a) in row.iter().take(LANES * PV).enumerate() {
            // SAFETY: the caller's contract.
            unsafe { *out.add(r * ldo + i) = a };
        }
    }
}

/// The scalar twin of the channels-last tile.
///
/// # Safety
/// As [`sums`]; `y + i * ldy + r` writable for `i < pixels <= 16 * PV`, `r < R`; `outs`'
/// non-null vectors hold `R` floats.
unsafe fn nhwc_portable<const R: usize, const PV: usize>(
    d: Depth,
    y: *mut f32,
    ldy: usize,
    pixels: usize,
    outs: &Outs,
) {
    // SAFETY: the caller's contract.
    let acc = unsafe { sums::<R, PV>(d) };
    for (r, row) in acc.iter().enumerate() {
        for (i, &a) in row.iter().take(pixels.min(LANES * PV)).enumerate() {
            // SAFETY: the caller's contract: `outs`' vectors hold R floats, `y + i * ldy + r`
            // is writable.
            unsafe { *y.add(i * ldy + r) = outs.finish(a, r) };
        }
    }
}

impl Outs {
    /// Channel `j`'s epilogue on a sum, in scalar: bias, activation, affine, PRelu slope.
    ///
    /// # Safety
    /// Each non-null vector holds more than `j` floats.
    pub(crate) unsafe fn finish(&self, sum: f32, j: usize) -> f32 {
        // SAFETY: the caller's contract.
        let (b, s) = unsafe {
            (
                (!self.bias.is_null()).then(|| *self.bias.add(j)),
                (!self.slopes.is_null()).then(|| *self.slopes.add(j)),
            )
        };
        let mut v = sum + b.unwrap_or(0.0);
        if let Some(act) = self.act {
            v = act.apply_scalar(v);
        }
        if let Some(post) = self.post {
            v = post.apply(v);
        }
        match s {
            Some(s) if v < 0.0 => v * s,
            _ => v,
        }
    }
}

/// The first step of the channels-last tiles' in-register transpose of 8 channel rows
/// `a(0..8)` (each a vector of pixels), on either level's intrinsics: per 128-bit lane `l`,
/// `u[q]` holds pixel `4l + q`'s channels 0-3 and `h[q]` its channels 4-7.
macro_rules! quarters {
    ($lo:ident, $hi:ident, $shuffle:ident, $a:ident) => {{
        let (t0, t1) = ($lo($a(0), $a(1)), $hi($a(0), $a(1)));
        let (t2, t3) = ($lo($a(2), $a(3)), $hi($a(2), $a(3)));
        let (t4, t5) = ($lo($a(4), $a(5)), $hi($a(4), $a(5)));
        let (t6, t7) = ($lo($a(6), $a(7)), $hi($a(6), $a(7)));
        (
            [
                $shuffle::<0x44>(t0, t2),
                $shuffle::<0xEE>(t0, t2),
                $shuffle::<0x44>(t1, t3),
                $shuffle::<0xEE>(t1, t3),
            ],
            [
                $shuffle::<0x44>(t4, t6),
                $shuffle::<0xEE>(t4, t6),
                $shuffle::<0x44>(t5, t7),
                $shuffle::<0xEE>(t5, t7),
            ],
        )
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Depth, LANES, Outs};
    use crate::sgemm::x86::avx512::VecEpi;
    use std::arch::x86_64::*;

    /// The depth sums of a tile in registers (R x PV <= 24 accumulators).
    ///
    /// # Safety
    /// As [`super::sums`]; the CPU has AVX-512 F.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    #[inline]
    unsafe fn sums<const R: usize, const PV: usize>(Depth { k, w, nr, x, offs }: Depth) -> [[__m512; PV]; R] {
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
        acc
    }

    /// [`super::tile_portable`] on AVX-512.
    ///
    /// # Safety
    /// As [`super::tile_portable`]; the CPU has AVX-512 F.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn tile<const R: usize, const PV: usize>(d: Depth, out: *mut f32, ldo: usize) {
        // SAFETY: the caller's contract.
        let acc = unsafe { sums::<R, PV>(d) };
        for (r, acc) in acc.iter().enumerate() {
            for (v, &a) in acc.iter().enumerate() {
                // SAFETY: the caller's contract: row `r < R` of `out` has 16 * PV writable floats.
                unsafe { _mm512_storeu_ps(out.add(r * ldo + v * LANES), a) };
            }
        }
    }

    /// [`super::nhwc_portable`] on AVX-512: the epilogue on the accumulators, then each
    /// pixel vector's 8 channel rows transposed in registers (unpacks and shuffles to
    /// 4-channel quarters, a two-source permute joining a pixel's two quarters) and stored
    /// as a pixel's `R` channels.
    ///
    /// # Safety
    /// As [`super::nhwc_portable`] with `R <= 8`; the CPU has AVX-512 F + VL.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn nhwc<const R: usize, const PV: usize>(
        d: Depth,
        y: *mut f32,
        ldy: usize,
        pixels: usize,
        outs: &Outs,
    ) {
        // SAFETY: the caller's contract.
        let acc = unsafe { sums::<R, PV>(d) };
        let epi = VecEpi::new(outs.act, outs.post);
        let zero = _mm512_setzero_ps();
        let mut rows = [[zero; PV]; 8];
        for (r, (acc, row)) in acc.iter().zip(rows.iter_mut()).enumerate() {
            // SAFETY: the caller's contract: non-null vectors hold R floats.
            let (b, s) = unsafe {
                (
                    (!outs.bias.is_null()).then(|| _mm512_set1_ps(*outs.bias.add(r))),
                    (!outs.slopes.is_null()).then(|| _mm512_set1_ps(*outs.slopes.add(r))),
                )
            };
            for (&a, o) in acc.iter().zip(row.iter_mut()) {
                let mut v = a;
                if let Some(b) = b {
                    v = _mm512_add_ps(v, b);
                }
                v = epi.apply(v);
                if let Some(s) = s {
                    v = _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, zero), v, s);
                }
                *o = v;
            }
        }
        let mask = ((1u32 << R) - 1) as __mmask8;
        let idx = [
            _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
            _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31),
        ];
        for v in 0..PV {
            let n = pixels.saturating_sub(v * LANES).min(LANES);
            if n == 0 {
                break;
            }
            let a = |r: usize| rows[r][v];
            let (u, h) = quarters!(_mm512_unpacklo_ps, _mm512_unpackhi_ps, _mm512_shuffle_ps, a);
            // SAFETY: the caller's contract: pixel `v * 16 + p < pixels` has R writable
            // floats at `y + (v * 16 + p) * ldy`; the mask covers lanes `< R`.
            unsafe {
                let yv = y.add(v * LANES * ldy);
                for (half, idx) in idx.iter().enumerate() {
                    for q in 0..4 {
                        // Pixels 8 half + q (low 256 bits) and 8 half + 4 + q (high).
                        let z = _mm512_permutex2var_ps(u[q], *idx, h[q]);
                        let lo = _mm512_castps512_ps256(z);
                        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(z)));
                        let p0 = 8 * half + q;
                        if p0 < n {
                            _mm256_mask_storeu_ps(yv.add(p0 * ldy), mask, lo);
                        }
                        if p0 + 4 < n {
                            _mm256_mask_storeu_ps(yv.add((p0 + 4) * ldy), mask, hi);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Depth, LANES, Outs};
    use crate::sgemm::x86::avx2::{VecEpi, store_first};
    use std::arch::x86_64::*;

    /// Lanes of a ymm vector: a 16-pixel vector is two of them.
    const HALF: usize = 8;

    /// The depth sums of a tile in registers, each pixel vector as two ymm halves (the
    /// level's tiles keep R x PV <= 6: 12 accumulators, two loads and a broadcast).
    ///
    /// # Safety
    /// As [`super::sums`]; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn sums<const R: usize, const PV: usize>(Depth { k, w, nr, x, offs }: Depth) -> [[[__m256; 2]; PV]; R] {
        let mut acc = [[[_mm256_setzero_ps(); 2]; PV]; R];
        for p in 0..k {
            // SAFETY: the caller's contract: `offs[p]` and the PV vectors of 16 floats at
            // `x + offs[p]` and the R weights at `w + p * nr` are readable.
            unsafe {
                let xp = x.offset(*offs.add(p));
                let wp = w.add(p * nr);
                let mut xv = [[_mm256_setzero_ps(); 2]; PV];
                for (v, xv) in xv.iter_mut().enumerate() {
                    xv[0] = _mm256_loadu_ps(xp.add(v * LANES));
                    xv[1] = _mm256_loadu_ps(xp.add(v * LANES + HALF));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm256_set1_ps(*wp.add(r));
                    for (a, xv) in acc.iter_mut().zip(xv.iter()) {
                        a[0] = _mm256_fmadd_ps(wv, xv[0], a[0]);
                        a[1] = _mm256_fmadd_ps(wv, xv[1], a[1]);
                    }
                }
            }
        }
        acc
    }

    /// [`super::tile_portable`] on AVX2.
    ///
    /// # Safety
    /// As [`super::tile_portable`]; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const R: usize, const PV: usize>(d: Depth, out: *mut f32, ldo: usize) {
        // SAFETY: the caller's contract.
        let acc = unsafe { sums::<R, PV>(d) };
        for (r, acc) in acc.iter().enumerate() {
            for (v, a) in acc.iter().enumerate() {
                // SAFETY: the caller's contract: row `r < R` of `out` has 16 * PV writable floats.
                unsafe {
                    _mm256_storeu_ps(out.add(r * ldo + v * LANES), a[0]);
                    _mm256_storeu_ps(out.add(r * ldo + v * LANES + HALF), a[1]);
                }
            }
        }
    }

    /// [`super::nhwc_portable`] on AVX2: the epilogue on the accumulators, then each half
    /// vector's 8 pixels by (up to) 8 channel rows transposed in registers (unpacks and
    /// shuffles to 4-channel quarters per 128-bit lane, a lane permute joining a pixel's
    /// two quarters) and stored as a pixel's `R` channels (8 with `outs.room`).
    ///
    /// # Safety
    /// As [`super::nhwc_portable`] with `R <= 8`, and with `outs.room` 8 writable floats at
    /// each pixel's first channel; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn nhwc<const R: usize, const PV: usize>(
        d: Depth,
        y: *mut f32,
        ldy: usize,
        pixels: usize,
        outs: &Outs,
    ) {
        // SAFETY: the caller's contract.
        let acc = unsafe { sums::<R, PV>(d) };
        let epi = VecEpi::new(outs.act, outs.post);
        let zero = _mm256_setzero_ps();
        // Each part of the epilogue over the whole tile, one decision each (see
        // `apply_cheap_all`): bias, the cheap activation and affine, the PRelu slopes.
        let mut acc = acc;
        if !outs.bias.is_null() {
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: the caller's contract: a non-null bias holds R floats.
                let b = _mm256_set1_ps(unsafe { *outs.bias.add(r) });
                for pair in acc.iter_mut() {
                    for v in pair.iter_mut() {
                        *v = _mm256_add_ps(*v, b);
                    }
                }
            }
        }
        epi.apply_all(&mut acc);
        if !outs.slopes.is_null() {
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: the caller's contract: non-null slopes hold R floats.
                let s = _mm256_set1_ps(unsafe { *outs.slopes.add(r) });
                for pair in acc.iter_mut() {
                    for v in pair.iter_mut() {
                        *v = _mm256_blendv_ps(*v, _mm256_mul_ps(*v, s), _mm256_cmp_ps::<_CMP_LT_OQ>(*v, zero));
                    }
                }
            }
        }
        let mut rows = [[[zero; 2]; PV]; 8];
        for (acc, row) in acc.iter().zip(rows.iter_mut()) {
            *row = *acc;
        }
        for v in 0..PV {
            for half in 0..2 {
                let first = v * LANES + half * HALF;
                let n = pixels.saturating_sub(first).min(HALF);
                if n == 0 {
                    break;
                }
                let a = |r: usize| rows[r][v][half];
                let (u, h) = quarters!(_mm256_unpacklo_ps, _mm256_unpackhi_ps, _mm256_shuffle_ps, a);
                // The first R lanes, or all 8 with room (see `Outs::room`); plain stores
                // either way (see `store_first`).
                let width = if outs.room { HALF } else { R };
                // SAFETY: the caller's contract: pixel `first + q < pixels` has R writable
                // floats at `y + (first + q) * ldy`, or 8 with room.
                unsafe {
                    let yv = y.add(first * ldy);
                    for q in 0..4 {
                        if q < n {
                            store_first(yv.add(q * ldy), width, _mm256_permute2f128_ps::<0x20>(u[q], h[q]));
                        }
                        if q + 4 < n {
                            store_first(yv.add((q + 4) * ldy), width, _mm256_permute2f128_ps::<0x31>(u[q], h[q]));
                        }
                    }
                }
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
        ]
    };
}

/// A level's tiles, by channels and pixel vectors, and the largest it takes (what fits its
/// registers).
struct Level {
    planes: [[TileFn; 3]; MAX_ROWS],
    nhwc: [[NhwcFn; 3]; MAX_ROWS],
    rows: usize,
    vectors: usize,
}

static PORTABLE: Level = Level {
    planes: tiles!(tile_portable),
    nhwc: tiles!(nhwc_portable),
    rows: MAX_ROWS,
    vectors: 3,
};
#[cfg(target_arch = "x86_64")]
static AVX512: Level = Level {
    planes: tiles!(avx512::tile),
    nhwc: tiles!(avx512::nhwc),
    rows: MAX_ROWS,
    vectors: 3,
};
/// Sixteen ymm registers: 6 channels by one pixel vector (two halves), 12 accumulators.
#[cfg(target_arch = "x86_64")]
static AVX2: Level = Level {
    planes: tiles!(avx2::tile),
    nhwc: tiles!(avx2::nhwc),
    rows: 6,
    vectors: 1,
};

/// Pixel vectors the next tile sweeps when `left` remain: 3 (24 accumulators for 8
/// channels), or 2 where 3 would leave one for a last tile (one vector's 8 accumulators
/// wait on each other's latency and load as much as they multiply: P-Net's 151 columns as
/// 3 + 3 + 3 + 1 vectors ran slower than as 192 columns of threes).
fn vectors(left: usize, most: usize) -> usize {
    let v = match left {
        0..=3 => left,
        4 => 2,
        _ => 3,
    };
    v.min(most)
}

/// The output channels' tiles: `(first channel, channels)`, none across a panel of the
/// packed B (`nr` columns): a panel's columns split into near-equal tiles of at most `most`
/// (at most [`MAX_ROWS`]).
fn channel_tiles(m: usize, nr: usize, most: usize) -> smallvec::SmallVec<[(usize, usize); 8]> {
    let most = most.clamp(1, MAX_ROWS);
    let mut tiles = smallvec::SmallVec::new();
    let mut j0 = 0;
    while j0 < m {
        let w = (m - j0).min(nr);
        let each = w.div_ceil(w.div_ceil(most));
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
pub(crate) fn widths(geo: &Conv2d) -> (usize, usize, usize) {
    let s = geo.sw.max(1);
    let owp = geo.ow.next_multiple_of(LANES);
    let reach = (geo.kw.saturating_sub(1) * geo.dw) / s;
    (s, (owp + reach).next_multiple_of(LANES), owp)
}

/// Stages padded input row `u` (row `u - ph` of the image, zeros outside it) as `C x phases`
/// rows of `wp` floats into `dst`. `false` if X is short.
pub(crate) fn stage_row(geo: &Conv2d, x: Source<'_>, u: usize, dst: &mut [f32]) -> bool {
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
                        every_nth(src, s, d);
                    }
                }
            }
        }
    }
    true
}

/// `d[i] = src[i * s]` for every `i` (zero where `src` is short), compiled for the active
/// level with the stride a constant for strides 2 to 4, so the reads become loads and
/// shuffles: with the stride a variable, a multiply and a bounds check per float (a 3 ->
/// 32 stride-2 stem spent a quarter of its time here).
fn every_nth(src: &[f32], s: usize, d: &mut [f32]) {
    #[inline(always)]
    fn by<const S: usize>(src: &[f32], d: &mut [f32]) {
        let mut chunks = src.chunks_exact(S);
        let full = d.len().min(chunks.len());
        let (head, tail) = d.split_at_mut(full);
        for (d, c) in head.iter_mut().zip(&mut chunks) {
            *d = c[0];
        }
        for (i, d) in tail.iter_mut().enumerate() {
            *d = src.get((full + i) * S).copied().unwrap_or(0.0);
        }
    }
    crate::simd::vectorize(|| match s {
        2 => by::<2>(src, d),
        3 => by::<3>(src, d),
        4 => by::<4>(src, d),
        _ => {
            for (i, d) in d.iter_mut().enumerate() {
                *d = src.get(i * s).copied().unwrap_or(0.0);
            }
        }
    });
}

/// What the row kernels apply to their accumulators in registers (the column bias and PRelu
/// slopes, `m` floats each or absent, and a cheap activation and affine), and what runs over
/// each finished output row after them (a costly activation, then the affine).
#[derive(Clone, Copy)]
pub(crate) struct Direct<'e> {
    pub(crate) bias: Option<&'e [f32]>,
    pub(crate) slopes: Option<&'e [f32]>,
    pub(crate) act: Option<crate::sgemm::Act>,
    pub(crate) post: Option<crate::sgemm::Affine>,
    /// A costly activation (SiLU, GELU, ...) over the output row once its tiles are stored:
    /// in the tiles it would be one out-of-line call per vector, and through the GEMM's
    /// epilogue after the whole block one call per pixel (a stem's 32 channels), which cost
    /// more than the convolution.
    pub(crate) after: Option<crate::sgemm::Act>,
}

impl Direct<'_> {
    /// The activation and affine [`Direct::after`] leaves to the finished row `out`.
    pub(crate) fn finish_row(&self, out: &mut [f32]) {
        if let Some(a) = self.after {
            crate::sgemm::act_slice(a, out);
            if let Some(post) = self.post {
                post.apply_slice(out);
            }
        }
    }
}

/// The epilogue split between the row kernels' registers and a pass over each finished row
/// (see [`Direct`]), or `None` when it has a residual or per-row vectors (the sums are then
/// stored and the GEMM's epilogue runs over them).
pub(crate) fn direct_epilogue<'e>(epi: &Epilogue<'e>, m: usize) -> Option<Direct<'e>> {
    fn column(b: Bias<'_>, m: usize) -> Option<Option<&[f32]>> {
        match b {
            Bias::None => Some(None),
            Bias::Col(v) if v.len() == m => Some(Some(v)),
            _ => None,
        }
    }
    if epi.residual.is_some() {
        return None;
    }
    let (bias, slopes) = (column(epi.bias, m)?, column(epi.prelu, m)?);
    let (act, after) = crate::sgemm::Act::split_costly(epi.act);
    // PRelu slopes never come with an activation (`sgemm` refuses the pair).
    if after.is_some() && slopes.is_some() {
        return None;
    }
    Some(Direct {
        bias,
        slopes,
        act,
        post: epi.post,
        after,
    })
}

/// Output rows a band stages (`STAGE_FLOATS` of input, at most `MAX_BAND` rows) when its
/// staged input rows hold `row_floats` floats each, for a block of `nrows` output rows.
pub(crate) fn band_rows(geo: &Conv2d, row_floats: usize, nrows: usize) -> usize {
    (STAGE_FLOATS / (row_floats * geo.sh.max(1)).max(1))
        .clamp(1, MAX_BAND)
        .min(nrows.max(1))
}

/// Padded input rows a band of `b >= 1` output rows reads.
pub(crate) fn staged_rows(geo: &Conv2d, b: usize) -> usize {
    (b - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1
}

/// Fills `offs` with each depth's offset into a staged band (`(ky, kx, c)` order, as the
/// packed B's): output column `ox` of the band's first row reads depth `p` at `offs[p] + ox`.
/// Returns the largest offset.
pub(crate) fn depth_offsets(geo: &Conv2d, offs: &mut Vec<isize>) -> usize {
    let (s, wp, _) = widths(geo);
    let c = geo.c;
    offs.clear();
    for ky in 0..geo.kh {
        for kx in 0..geo.kw {
            let (f, t) = ((kx * geo.dw) % s, (kx * geo.dw) / s);
            for ci in 0..c {
                offs.push((((ky * geo.dh * c + ci) * s + f) * wp + t) as isize);
            }
        }
    }
    offs.iter().copied().max().unwrap_or(0).max(0) as usize
}

/// Stages the padded input rows of output rows `oy .. oy + nb` into `stage` (rows of
/// `C * phases * WP` floats). `false` if X or `stage` is short.
pub(crate) fn stage_band(geo: &Conv2d, x: Source<'_>, oy: usize, nb: usize, stage: &mut [f32]) -> bool {
    let (s, wp, _) = widths(geo);
    let row_floats = geo.c * s * wp;
    for r in 0..staged_rows(geo, nb) {
        let Some(dst) = stage.get_mut(r * row_floats..(r + 1) * row_floats) else {
            return false;
        };
        if !stage_row(geo, x, oy * geo.sh + r, dst) {
            return false;
        }
    }
    true
}

/// Output rows `oy0 .. oy0 + y.len() / (OW * M)` of one image's convolution into `y`
/// (channels-last `[rows, OW, M]`), on the calling thread, with the tiles of `level`:
/// staged in bands, then each tile stored channels-last with its epilogue; with a residual
/// (channels-last, added before the activation), a costly activation or per-pixel vectors,
/// accumulated planar, transposed, then `epi` (whose residual starts at this block's first
/// pixel). `false` when an operand is shorter than `geo` says.
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
    let (s, wp, owp) = widths(geo);
    let (c, k, nr) = (geo.c, geo.k(), w.layout().nr());
    let per_row = geo.ow * m;
    // The packed B whole (not a gathered view of some of its depths).
    let whole = matches!(w.runs().as_slice(), [(0, 0, d)] if *d == k);
    if per_row == 0 || w.k() != k || w.n() != m || k == 0 || !whole {
        return false;
    }
    let direct = direct_epilogue(epi, m);
    let nrows = y.len() / per_row;
    let row_floats = c * s * wp;
    let band = band_rows(geo, row_floats, nrows);
    let mut offs = crate::recycle::lend::<Offsets>();
    let max_off = depth_offsets(geo, &mut offs);
    let tiles_m = channel_tiles(m, nr, level.rows);
    let mut stage = crate::recycle::lend::<Stage>();
    stage.resize(staged_rows(geo, band) * row_floats, 0.0);
    let mut planes = crate::recycle::lend::<Planes>();
    if direct.is_none() {
        planes.resize(m * owp, 0.0);
    }
    let data = w.data();
    let nv = owp / LANES;
    let mut b0 = 0;
    while b0 < nrows {
        let nb = band.min(nrows - b0);
        if !stage_band(geo, x, oy0 + b0, nb, &mut stage) {
            return false;
        }
        for j in 0..nb {
            let base = j * geo.sh * row_floats;
            // The farthest float a tile reads: the largest depth offset plus a whole row
            // of vectors.
            if base + max_off + owp > stage.len() {
                return false;
            }
            let Some(out) = y.get_mut((b0 + j) * per_row..(b0 + j + 1) * per_row) else {
                return false;
            };
            for &(j0, r) in &tiles_m {
                let (panel, jj) = (j0 / nr, j0 % nr);
                let wstart = panel * w.stride() + jj;
                if r == 0 || r > MAX_ROWS || j0 + r > m || wstart + (k - 1) * nr + r > data.len() {
                    return false;
                }
                let mut v0 = 0;
                while v0 < nv {
                    let step = vectors(nv - v0, level.vectors);
                    let d = Depth {
                        k,
                        w: data[wstart..].as_ptr(),
                        nr,
                        x: stage[base + v0 * LANES..].as_ptr(),
                        offs: offs.as_ptr(),
                    };
                    match direct {
                        Some(dir) => {
                            let pixels = (geo.ow - v0 * LANES).min(step * LANES);
                            let at = |v: Option<&[f32]>| v.map_or(std::ptr::null(), |v| v[j0..].as_ptr());
                            let outs = Outs {
                                bias: at(dir.bias),
                                slopes: at(dir.slopes),
                                act: dir.act,
                                post: dir.post.filter(|_| dir.after.is_none()),
                                // Channel tiles go in ascending order within the pixel.
                                room: j0 + 8 <= m,
                            };
                            let f = level.nhwc[r - 1][step - 1];
                            // SAFETY: the weights span was checked above (`r` columns of
                            // every depth inside `data`); every offset plus `base + v0 * 16
                            // + 16 * step <= base + max offset + owp <= stage.len()`; pixel
                            // `i < pixels` of this chunk is output column `v0 * 16 + i <
                            // OW`, whose channels `j0 .. j0 + r <= m` lie in `out`; the bias
                            // and slopes hold `m >= j0 + r` floats; the cheap check above.
                            unsafe { f(d, out[v0 * LANES * m + j0..].as_mut_ptr(), m, pixels, &outs) };
                        }
                        None => {
                            let f = level.planes[r - 1][step - 1];
                            // SAFETY: as above for the weights and the stage; the planes
                            // hold `m` rows of `owp` floats, `j0 + r <= m` and `v0 * 16 +
                            // 16 * step <= owp`.
                            unsafe { f(d, planes[j0 * owp + v0 * LANES..].as_mut_ptr(), owp) };
                        }
                    }
                    v0 += step;
                }
            }
            match direct {
                Some(dir) => dir.finish_row(out),
                None => {
                    if !crate::transpose::transpose_f32(&planes, owp, m, geo.ow, out, m) {
                        return false;
                    }
                }
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

/// The residual from float `at` on (the same leading dimension), or `None` when it is shorter;
/// no residual stays none.
fn residual_from(r: Option<Residual<'_>>, at: usize) -> Option<Option<Residual<'_>>> {
    match r {
        Some(r) => Some(Some(Residual {
            data: r.data.get(at..)?,
            ld: r.ld,
        })),
        None => Some(None),
    }
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
    #[cfg(target_arch = "x86_64")]
    match crate::isa::active() {
        crate::isa::Isa::Avx512 => rows_with(&AVX512, geo, m, x, w, oy0, y, epi),
        crate::isa::Isa::Avx2Fma => rows_with(&AVX2, geo, m, x, w, oy0, y, epi),
        _ => rows_with(&PORTABLE, geo, m, x, w, oy0, y, epi),
    }
}

/// Output rows `oy0 ..` of one image into `y` with an epilogue (whose residual starts at
/// the block's first pixel): [`rows`], or another kernel's over the same staged bands
/// ([`crate::stem::rows`]).
pub type RowsFn = fn(&Conv2d, usize, Source<'_>, &PackedBRef<'_>, usize, &mut [f32], &Epilogue<'_>) -> bool;

/// The whole convolution of a batch with the row kernel `rows`: `x` is `batch` images
/// (channels-last `[IH, IW, C]` or channels-first `[C, IH, IW]` each, as `first` says), `y`
/// the `[batch, OH, OW, M]` output; blocks of output rows go over the pool. `false` when an
/// operand is short.
#[allow(clippy::too_many_arguments)]
pub fn run(
    geo: &Conv2d,
    m: usize,
    x: &[f32],
    first: bool,
    w: &PackedBRef<'_>,
    y: &mut [f32],
    epi: &Epilogue<'_>,
    rows: RowsFn,
) -> bool {
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
        let Some(residual) = residual_from(epi.residual, n * geo.oh * per_row) else {
            return false;
        };
        crate::pool::for_each_chunk_mut(yi, block * per_row, &|bi, out| {
            let oy0 = bi * block;
            let Some(residual) = residual_from(residual, oy0 * per_row) else {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
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
    use crate::conv_testkit::{RowsAt, case as kit, noise, packed};
    use crate::sgemm::BLayout;

    /// [`crate::conv_testkit::case`] over this kernel's levels.
    fn levels() -> Vec<&'static RowsAt> {
        crate::conv_testkit::levels!(rows_with, PORTABLE, AVX2, AVX512)
    }

    #[test]
    fn detector_layers_match_the_oracle() {
        let levels = levels();
        for (c, m, hw, k, s, d, p, first, seed) in [
            (10, 16, [21, 37], [3, 3], [1, 1], [1, 1], [0, 0], false, 1),
            (3, 10, [30, 19], [3, 3], [1, 1], [1, 1], [0, 0], true, 2),
            (3, 16, [33, 35], [3, 3], [2, 2], [1, 1], [1, 1], true, 3),
            (16, 12, [9, 50], [5, 5], [2, 1], [1, 2], [2, 4], false, 4),
            (1, 5, [4, 3], [3, 3], [1, 1], [1, 1], [1, 1], false, 5),
            // PP-HGNet's stem: 2x2 windows, 48 -> 24 and 20 outputs (three 8-row tiles, the
            // last one short), a 3x3 stride-2 16 -> 24.
            (48, 24, [6, 50], [2, 2], [1, 1], [1, 1], [0, 0], false, 6),
            (32, 20, [5, 40], [2, 2], [1, 1], [1, 1], [0, 0], false, 7),
            (16, 24, [13, 61], [3, 3], [2, 2], [1, 1], [1, 1], false, 8),
        ] {
            kit(&levels, false, c, m, hw, k, s, d, p, first, seed);
        }
    }

    /// Random geometries, channels across every tile shape (1-24 outputs: one-tile panels,
    /// split panels, panels across NR16's boundary, three tiles of a panel).
    #[test]
    fn levels_match_the_oracle_and_each_other() {
        crate::conv_testkit::random_cases(&levels(), false, 1..=9, 1..=24, 64);
    }

    #[test]
    fn direct_layers_of_up_to_24_channels_come_here_but_stems_and_wider_ones_do_not() {
        // PP-HGNet's 2x2 48 -> 24 and a 3x3 16 -> 24: here when not Winograd's.
        assert!(takes_direct(24, 48, [2, 2], 485));
        assert!(takes_direct(24, 16, [3, 3], 56));
        assert!(
            !takes(24, 48, [2, 2], 485),
            "Winograd keeps 3x3 layers of 17-24 channels"
        );
        // An image stem (3 input channels) stays with `stem`, 32 channels with the GEMM, a
        // 1x1 window and a narrow image with the GEMM.
        assert!(!takes_direct(24, 3, [3, 3], 320));
        assert!(crate::stem::takes(24, 3, [3, 3], 320));
        assert!(!takes_direct(32, 32, [3, 3], 56));
        assert!(!takes_direct(24, 48, [1, 1], 485));
        assert!(!takes_direct(24, 48, [3, 3], 14));
        // What `takes` routes here still comes.
        assert!(takes_direct(16, 3, [3, 3], 320) && takes(16, 3, [3, 3], 320));
    }

    #[test]
    fn channel_tiles_cover_each_channel_once_inside_a_panel() {
        for (nr, most) in [(16, 8), (32, 8), (16, 6), (32, 6)] {
            for m in 1..=40 {
                let t = channel_tiles(m, nr, most);
                let mut next = 0;
                for &(j0, r) in &t {
                    assert_eq!(j0, next);
                    assert!((1..=most).contains(&r));
                    assert_eq!(j0 / nr, (j0 + r - 1) / nr, "m {m} nr {nr}: {t:?}");
                    next += r;
                }
                assert_eq!(next, m);
            }
        }
        assert_eq!(channel_tiles(10, 32, 8).as_slice(), [(0, 5), (5, 5)]);
        assert_eq!(channel_tiles(16, 32, 8).as_slice(), [(0, 8), (8, 8)]);
        assert_eq!(channel_tiles(24, 16, 8).as_slice(), [(0, 8), (8, 8), (16, 8)]);
        assert_eq!(channel_tiles(16, 16, 6).as_slice(), [(0, 6), (6, 6), (12, 4)]);
    }

    #[test]
    fn short_operands_are_refused() {
        let g = Conv2d {
            c: 2,
            ih: 5,
            iw: 5,
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            ph: 1,
            pw: 1,
            oh: 5,
            ow: 5,
        };
        let pb = packed(&noise(8 * 18, 1), 8, &g, BLayout::NR32);
        let mut y = vec![0f32; 5 * 5 * 8];
        assert!(!rows(
            &g,
            8,
            Source::Last(&noise(49, 2)),
            &pb.view(),
            0,
            &mut y,
            &Epilogue::NONE
        ));
        assert!(rows(
            &g,
            8,
            Source::Last(&noise(50, 2)),
            &pb.view(),
            0,
            &mut y,
            &Epilogue::NONE
        ));
        let g2 = Conv2d { c: 3, ..g };
        assert!(!rows(
            &g2,
            8,
            Source::Last(&noise(75, 2)),
            &pb.view(),
            0,
            &mut y,
            &Epilogue::NONE
        ));
    }
}
