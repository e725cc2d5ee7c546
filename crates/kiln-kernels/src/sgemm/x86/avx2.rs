//! AVX2+FMA kernels: a 6 x 16 f32 tile (12 ymm accumulators, two B vectors and a broadcast:
//! 15 of the 16 registers) and its 6 x 8 half for edges of at most 8 columns, partial edge
//! columns through a stack tile, and the vectorised epilogue.
//! Every function here requires AVX2 and FMA; they are reached only through [`kernels`],
//! which the dispatcher hands out after detection.

use super::super::driver::{Ahead, ColumnAhead, Kernels, TileEpi, TileFn};
use super::super::{Act, Affine};
use std::arch::x86_64::*;

/// Rows of the full tile.
pub(crate) const MR: usize = 6;
/// Columns of a tile (two ymm vectors).
pub(crate) const NR: usize = 16;

type V = __m256;
type M = __m256;

#[target_feature(enable = "avx2,fma")]
#[inline]
fn splat(x: f32) -> V {
    _mm256_set1_ps(x)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn zero() -> V {
    _mm256_setzero_ps()
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn add(a: V, b: V) -> V {
    _mm256_add_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn sub(a: V, b: V) -> V {
    _mm256_sub_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn mul(a: V, b: V) -> V {
    _mm256_mul_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn div(a: V, b: V) -> V {
    _mm256_div_ps(a, b)
}
/// `1 / b` (a divide: AVX2's 12-bit estimate would need two Newton steps).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn recip(b: V) -> V {
    _mm256_div_ps(_mm256_set1_ps(1.0), b)
}
/// `a * b + c`, one rounding.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fmadd(a: V, b: V, c: V) -> V {
    _mm256_fmadd_ps(a, b, c)
}
/// `c - a * b`, one rounding.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fnmadd(a: V, b: V, c: V) -> V {
    _mm256_fnmadd_ps(a, b, c)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn min(a: V, b: V) -> V {
    _mm256_min_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn max(a: V, b: V) -> V {
    _mm256_max_ps(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn lt(a: V, b: V) -> M {
    _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn gt(a: V, b: V) -> M {
    _mm256_cmp_ps::<_CMP_GT_OQ>(a, b)
}
/// `a > b`, or either is NaN.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn gt_or_nan(a: V, b: V) -> M {
    _mm256_cmp_ps::<_CMP_NLE_UQ>(a, b)
}
/// `m ? t : f` per lane.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn blend(m: M, t: V, f: V) -> V {
    _mm256_blendv_ps(f, t, m)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn round(a: V) -> V {
    _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a)
}
#[target_feature(enable = "avx2,fma")]
#[inline]
fn abs(a: V) -> V {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), a)
}
/// `mag` (non-negative) with the sign of `x`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn copy_sign(mag: V, x: V) -> V {
    _mm256_or_ps(mag, _mm256_and_ps(x, _mm256_set1_ps(-0.0)))
}
/// `y * 2^n` for integral `n` in `[-126, 128]`, as two factors so both ends stay normal.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn scale_pow2(y: V, n: V) -> V {
    let n = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(n);
    let n2 = _mm256_sub_epi32(n, n1);
    let bias = _mm256_set1_epi32(127);
    let p1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let p2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    _mm256_mul_ps(_mm256_mul_ps(y, p1), p2)
}

/// `2^n` from `t = n + 1.5 * 2^23` (integral `n` in `[-126, 127]`): `t`'s low mantissa bits
/// hold `n` (two's complement, under the magic number's zero low bits), so
/// `(bits(t) + 127) << 23` is the biased exponent of `2^n` in place.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn pow2_of_magic(t: V) -> V {
    let bits = _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127));
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(bits))
}

/// Vectors a sigmoid works on at once (`sigmoid_n`). Zen 3, EfficientNet-B0 (SiLU after
/// every expansion and depthwise convolution), `kiln profile` one thread, 3 alternating
/// rounds: one at a time 20.1-20.4 ms, three 19.8, four 19.5-19.6 (some temporaries spill;
/// the spills cost less than the chains they overlap).
const ILP: usize = 4;

/// Floats per vector.
const LANES: usize = 8;

#[target_feature(enable = "avx2,fma")]
#[inline]
fn load_arr(a: &[f32; LANES]) -> V {
    // SAFETY: the array holds LANES readable floats.
    unsafe { _mm256_loadu_ps(a.as_ptr()) }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn store_arr(a: &mut [f32; LANES], v: V) {
    // SAFETY: the array holds LANES writable floats.
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) }
}

/// Lane `i` all ones for `i < n`: the mask of `_mm256_maskload_ps` / `_mm256_maskstore_ps`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn part_mask(n: usize) -> __m256i {
    let n = n.min(LANES) as i32;
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// The first `s.len()` (< LANES) lanes from `s`, the others `fill`: a masked load, which
/// reads nothing past the slice.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn load_part(s: &[f32], fill: f32) -> V {
    let m = part_mask(s.len());
    // SAFETY: the mask enables only the first `s.len()` lanes, all inside the slice; masked
    // lanes are not accessed (no fault, no read).
    let v = unsafe { _mm256_maskload_ps(s.as_ptr(), m) };
    _mm256_blendv_ps(splat(fill), v, _mm256_castsi256_ps(m))
}

/// `v`'s first `s.len()` (< LANES) lanes into `s`, touching nothing else ([`store_first`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn store_part(s: &mut [f32], v: V) {
    // SAFETY: `s.len()` floats are writable at its start (the exclusively borrowed slice).
    unsafe { store_first(s.as_mut_ptr(), s.len(), v) }
}

/// Stores `v`'s first `n` lanes (all 8 when `n >= 8`) at `p` and nothing else, as plain
/// 4-, 2- and 1-float stores: `vmaskmovps` stores are microcoded on AMD cores (about 15
/// cycles each on a Zen 4, measured, against under 2 for a plain store), which made every
/// edge store of the tiles and the direct kernels cost as much as many multiply-adds.
///
/// # Safety
/// `min(n, 8)` floats are writable at `p`; the CPU has AVX2.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn store_first(p: *mut f32, n: usize, v: V) {
    // SAFETY: the caller's contract: each store below writes floats `< min(n, 8)` from `p`.
    unsafe {
        if n >= LANES {
            _mm256_storeu_ps(p, v);
            return;
        }
        let (mut p, mut n) = (p, n);
        let mut x = _mm256_castps256_ps128(v);
        if n >= 4 {
            _mm_storeu_ps(p, x);
            x = _mm256_extractf128_ps::<1>(v);
            (p, n) = (p.add(4), n - 4);
        }
        if n >= 2 {
            _mm_store_sd(p.cast::<f64>(), _mm_castps_pd(x));
            x = _mm_movehl_ps(x, x);
            (p, n) = (p.add(2), n - 2);
        }
        if n == 1 {
            _mm_store_ss(p, x);
        }
    }
}

/// [`store_first`] for a mask of the first lanes (`part_mask`'s kind: lanes `0..n` set).
///
/// # Safety
/// The lanes the mask sets are writable at `p`, and they are its first ones; the CPU has
/// AVX2.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn store_prefix(p: *mut f32, m: __m256i, v: V) {
    let n = (_mm256_movemask_ps(_mm256_castsi256_ps(m)) as u32).trailing_ones() as usize;
    // SAFETY: the caller's contract: the first `n` lanes are writable.
    unsafe { store_first(p, n, v) }
}

simd_math!("avx2,fma");

/// # Safety
/// The [`TileFn`] contract with `R <= MR = 6` rows and a width of `8 * NV` columns (`NR =
/// 16` for the full tiles, 8 for the half ones, 32 for the GEMV tile); the CPU has AVX2 and
/// FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const NV: usize, const SPLIT: bool>(
    kc: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    b: *const f32,
    bs: usize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
    first: bool,
    epi: Option<&TileEpi>,
    _ahead: Ahead,
) {
    let width = LANES * NV;
    // SAFETY: the TileFn contract, passed on.
    let acc = unsafe {
        if acs == 1 {
            products::<R, NV, true, SPLIT>(kc, a, ars, 1, b, bs)
        } else {
            products::<R, NV, false, SPLIT>(kc, a, ars, acs, b, bs)
        }
    };
    // What follows makes no calls on the common paths: a call would spill every accumulator
    // (all ymm registers are the caller's to save), which on a short depth (a 1x1
    // convolution's 16-64 channels) cost as much as the products.
    let null = std::ptr::null::<f32>();
    let (row_bias, col_bias, resid, resid_ld, act, post) = match epi {
        Some(e) => (e.row_bias, e.col_bias, e.resid, e.resid_ld, e.act, e.post),
        None => (null, null, null, 0, None, None),
    };
    // The cheap activation's decisions once per tile (see `Cheap`); a costly one runs over the
    // stored rows after the loop (as on AVX-512): applied per vector, its out-of-line call
    // spilled every live accumulator (all ymm registers are caller-saved), and a bias + SiLU
    // epilogue cost 3.5x the 12544x96x16 product it followed (1.0x after).
    let cheap = cheap_of(act, post);
    let costly = match act {
        Some(a) if !a.is_cheap() => Some(a),
        _ => None,
    };
    if nr == width {
        // Each part of the epilogue over the whole tile, one decision each (the loops over
        // the constant tile unroll): `acc (+ C) + row bias + column bias + residual`, then
        // the cheap activation, the sums in the unfused ops' order.
        let mut acc = acc;
        // SAFETY: the TileFn contract gives `width` writable (initialised unless `first`)
        // floats at `c + i*ldc` for `i < R`; TileEpi's gives `R` row-bias floats, `width`
        // column-bias floats and `width` residual floats at `resid + i*resid_ld`.
        unsafe {
            if !first {
                for (i, row) in acc.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = _mm256_add_ps(*x, _mm256_loadu_ps(c.add(i * ldc + LANES * v)));
                    }
                }
            }
            if !row_bias.is_null() {
                for (i, row) in acc.iter_mut().enumerate() {
                    let b = _mm256_set1_ps(*row_bias.add(i));
                    for x in row.iter_mut() {
                        *x = _mm256_add_ps(*x, b);
                    }
                }
            }
            if !col_bias.is_null() {
                let cb: [V; NV] = std::array::from_fn(|v| _mm256_loadu_ps(col_bias.add(LANES * v)));
                for row in acc.iter_mut() {
                    for (x, &b) in row.iter_mut().zip(&cb) {
                        *x = _mm256_add_ps(*x, b);
                    }
                }
            }
            if !resid.is_null() {
                for (i, row) in acc.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = _mm256_add_ps(*x, _mm256_loadu_ps(resid.add(i * resid_ld + LANES * v)));
                    }
                }
            }
            apply_cheap_all(cheap, std::array::from_mut(&mut acc));
            for (i, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    _mm256_storeu_ps(c.add(i * ldc + LANES * v), x);
                }
            }
        }
    } else {
        for (i, acc) in acc.iter().enumerate() {
            // SAFETY: the TileFn contract gives `nr < width` writable (initialised unless
            // `first`) floats at `c + i*ldc` for `i < R`, TileEpi's gives `R` row-bias floats and
            // `nr` residual floats at `resid + i*resid_ld`; the masked accesses enable only lanes
            // of columns `< nr`.
            unsafe {
                let cp = c.add(i * ldc);
                let rp = if resid.is_null() {
                    None
                } else {
                    Some(resid.add(i * resid_ld))
                };
                // The edge: masked loads and stores on the vectors the `nr` columns reach (the
                // epilogue in registers, as above; masked lanes are neither read nor written).
                // Through a stack tile and an out-of-line epilogue per row, a 10-column output
                // (MTCNN's first layer) spent more time there than in the products.
                let rbv = if row_bias.is_null() {
                    None
                } else {
                    Some(_mm256_set1_ps(*row_bias.add(i)))
                };
                for (v, &acc) in acc.iter().enumerate() {
                    let lo = LANES * v;
                    if lo >= nr {
                        break;
                    }
                    let m = part_mask(nr - lo);
                    let p = cp.add(lo);
                    let mut x = acc;
                    if !first {
                        x = _mm256_add_ps(x, _mm256_maskload_ps(p, m));
                    }
                    if epi.is_some() {
                        let cbv = if col_bias.is_null() {
                            None
                        } else {
                            Some(_mm256_maskload_ps(col_bias.add(lo), m))
                        };
                        let rv = match rp {
                            Some(r) => Some(_mm256_maskload_ps(r.add(lo), m)),
                            None => None,
                        };
                        x = epi_vec(x, rbv, cbv, rv, cheap);
                    }
                    store_first(p, nr - lo, x);
                }
            }
        }
    }
    if let Some(a) = costly {
        // SAFETY: the TileFn contract gives `nr` writable, now initialised floats at
        // `c + i*ldc` for `i < R`, used by no one else during the call.
        unsafe { act_rows(a, c, ldc, R, nr) };
        // SAFETY: as above.
        unsafe { post_rows(post, c, ldc, R, nr) };
    }
}

/// The tile's products, `acc[i][v] = sum_p a[i*ars + p*acs] * b[p*bs + 8v ..]`: four depths a
/// turn of the loop, then the remainder one by one. One depth a turn had spent a quarter of
/// its instructions on moving row pointers and the loop (26 for twelve multiply-adds, now 21):
/// with four, the rows' addresses are formed once a turn and, when `UNIT` (A row-major in
/// place, `acs == 1`), the depths are constant offsets from them. The core's issue slots are
/// what a sibling hardware thread takes, so the saving is largest on a busy host (Zen 3 VM,
/// sgemm alternated in one process, medians: 128 x 3072 x 768 8.3 -> 6.9 ms in a quiet
/// phase, 11.4 -> 8.8 in a busy one; 48 x 3072 x 768 4.7 -> 3.5).
///
/// # Safety
/// The [`TileFn`] contract's reads of A and B for these `kc`, `a`, `ars`, `acs`, `b`, `bs`;
/// `acs == 1` when `UNIT`; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn products<const R: usize, const NV: usize, const UNIT: bool, const SPLIT: bool>(
    kc: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    b: *const f32,
    bs: usize,
) -> [[V; NV]; R] {
    const UNROLL: usize = 4;
    /// One depth: `acc[i] += a[i*ars] * b[..8 NV]`.
    ///
    /// # Safety
    /// `ap + i*ars` readable for `i < R`, `LANES * NV` floats at `bp`; inlined only into
    /// functions with AVX2 and FMA enabled.
    #[inline(always)]
    unsafe fn step<const R: usize, const NV: usize>(
        acc: &mut [[V; NV]; R],
        ap: *const f32,
        ars: usize,
        bp: *const f32,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            let bv: [V; NV] = std::array::from_fn(|v| _mm256_loadu_ps(bp.add(LANES * v)));
            for (i, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*ap.add(i * ars));
                for (acc, &bv) in acc.iter_mut().zip(&bv) {
                    *acc = _mm256_fmadd_ps(av, bv, *acc);
                }
            }
        }
    }
    let acs = if UNIT { 1 } else { acs };
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    // With `SPLIT` (the tiles of products of at most 3 rows: a recurrent step, a GEMV) odd
    // depths sum into a second set: six chains of 4-cycle FMAs keep 1.5 of the two FMA pipes
    // busy, twelve keep both (the sets are added at the end). Every tile of one product sums
    // in the same order (the kernel table is chosen per product), so equal columns or rows
    // give equal bits.
    let mut odd = [[_mm256_setzero_ps(); NV]; R];
    let (mut ap, mut bp) = (a, b);
    // Wrapping steps: past the end only after the last depth, and never read then.
    for _ in 0..kc / UNROLL {
        for u in 0..UNROLL {
            let set = if SPLIT && u % 2 == 1 { &mut odd } else { &mut acc };
            // SAFETY: depth `p + u < kc` (p the depths done): the contract gives `a + i*ars +
            // (p+u)*acs` for `i < R` and `LANES * NV` floats at `b + (p+u)*bs`.
            unsafe { step(set, ap.add(u * acs), ars, bp.add(u * bs)) };
        }
        ap = ap.wrapping_add(UNROLL * acs);
        bp = bp.wrapping_add(UNROLL * bs);
    }
    for _ in 0..kc % UNROLL {
        // SAFETY: as above, for the one depth `p < kc`.
        unsafe { step(&mut acc, ap, ars, bp) };
        ap = ap.wrapping_add(acs);
        bp = bp.wrapping_add(bs);
    }
    if SPLIT {
        for (acc, odd) in acc.iter_mut().zip(&odd) {
            for (a, &o) in acc.iter_mut().zip(odd) {
                *a = _mm256_add_ps(*a, o);
            }
        }
    }
    acc
}

/// The [`ColumnFn`] of the `MR x 8 NV` tile.
///
/// # Safety
/// [`ColumnFn`]'s contract; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn column<const NV: usize>(
    count: usize,
    kc: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    b: *const f32,
    bs: usize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
    first: bool,
    epi: Option<&TileEpi>,
    ahead: ColumnAhead,
) {
    let per = ahead.lines.div_ceil(count.max(1));
    for t in 0..count {
        let row = t * MR;
        // Hints only (wrapping addresses, nothing read): C's rows and the residual's two
        // tiles down, this tile's share of the next micro-panel.
        if ahead.c_ahead && t + 2 < count {
            for i in row + 2 * MR..row + 3 * MR {
                crate::hint::to_l1(c.wrapping_add(i * ldc));
                crate::hint::to_l1(c.wrapping_add(i * ldc + LANES * NV - 1));
                if let Some(e) = epi.filter(|e| !e.resid.is_null()) {
                    crate::hint::to_l1(e.resid.wrapping_add(i * e.resid_ld));
                    crate::hint::to_l1(e.resid.wrapping_add(i * e.resid_ld + LANES * NV - 1));
                }
            }
        }
        for l in (t * per).min(ahead.lines)..((t + 1) * per).min(ahead.lines) {
            crate::hint::to_l2(ahead.ptr.wrapping_add(l * ahead.stride));
        }
        let moved = epi.map(|e| TileEpi {
            row_bias: if e.row_bias.is_null() {
                e.row_bias
            } else {
                e.row_bias.wrapping_add(row)
            },
            resid: if e.resid.is_null() {
                e.resid
            } else {
                e.resid.wrapping_add(row * e.resid_ld)
            },
            prelu_row: if e.prelu_row.is_null() {
                e.prelu_row
            } else {
                e.prelu_row.wrapping_add(row)
            },
            ..*e
        });
        // SAFETY: the ColumnFn contract: tile `t`'s rows `row .. row + MR` of A, C and the
        // epilogue's operands satisfy the TileFn contract, at the offsets formed here.
        unsafe {
            tile::<MR, NV, false>(
                kc,
                a.add(row * ars),
                ars,
                acs,
                b,
                bs,
                c.add(row * ldc),
                ldc,
                nr,
                first,
                moved.as_ref(),
                Ahead::NONE,
            );
        }
    }
}

static TILES: [TileFn; MR] = [
    tile::<1, 2, false>,
    tile::<2, 2, false>,
    tile::<3, 2, false>,
    tile::<4, 2, false>,
    tile::<5, 2, false>,
    tile::<6, 2, false>,
];
/// Tiles of 8 columns for edges of at most 8 (MobileNet's and EfficientNet's 24- and
/// 40-channel layers: 16 + 8 columns instead of two full tiles, a third fewer multiplies).
static HALF_TILES: [TileFn; MR] = [
    tile::<1, 1, false>,
    tile::<2, 1, false>,
    tile::<3, 1, false>,
    tile::<4, 1, false>,
    tile::<5, 1, false>,
    tile::<6, 1, false>,
];

#[target_feature(enable = "avx2,fma")]
fn epi_impl(row: &mut [f32], rb: Option<f32>, cb: Option<&[f32]>, r: Option<&[f32]>, a: Option<Act>) {
    // Callers pass slices of `row`'s length; the minimum keeps every access inside all three.
    let n = row
        .len()
        .min(cb.map_or(usize::MAX, <[f32]>::len))
        .min(r.map_or(usize::MAX, <[f32]>::len));
    let row = &mut row[..n];
    // A costly activation runs after the sums, over the whole row at once (`act_row`: several
    // vectors' chains side by side); per vector inside the loop below it was one out-of-line
    // call each, with every live register spilled around it: a bias + SiLU over a stem's
    // rows took longer than the convolution (1.5 ms of a 3 -> 32 stem at 112 x 112, AVX2).
    let (a, costly) = Act::split_costly(a);
    if rb.is_none() && cb.is_none() && r.is_none() && a.is_none() {
        if let Some(x) = costly {
            act_row(x, row);
        }
        return;
    }
    let rbv = rb.map(|b| splat(b));
    let a = cheap_of(a, None);
    let mut j = 0;
    while j + 8 <= n {
        // SAFETY: `j + 8 <= n`, and `row`, `cb` and `r` have at least `n` floats.
        unsafe {
            let cbv = cb.map(|s| _mm256_loadu_ps(s.as_ptr().add(j)));
            let rv = r.map(|s| _mm256_loadu_ps(s.as_ptr().add(j)));
            let p = row.as_mut_ptr().add(j);
            _mm256_storeu_ps(p, epi_vec(_mm256_loadu_ps(p), rbv, cbv, rv, a));
        }
        j += 8;
    }
    if j < n {
        // The tail through local arrays: full vectors, no access past the slices.
        let w = n - j;
        let chunk = |s: &[f32]| {
            let mut t = [0.0f32; 8];
            t[..w].copy_from_slice(&s[j..]);
            t
        };
        let cbv = cb.map(|s| load_arr(&chunk(s)));
        let rv = r.map(|s| load_arr(&chunk(s)));
        let v = epi_vec(load_arr(&chunk(row)), rbv, cbv, rv, a);
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 writable floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        row[j..].copy_from_slice(&out[..w]);
    }
    if let Some(x) = costly {
        act_row(x, row);
    }
}

fn epi(row: &mut [f32], rb: Option<f32>, cb: Option<&[f32]>, r: Option<&[f32]>, a: Option<Act>) {
    if cb.is_some_and(|s| s.len() != row.len()) || r.is_some_and(|s| s.len() != row.len()) {
        return super::super::portable::epi(row, rb, cb, r, a);
    }
    // SAFETY: this function is only reachable through `kernels()` and `gemv_kernels()`, which
    // `Kernels::select` returns only for `Isa::Avx2Fma` or `Isa::Avx512`, which callers pass only after
    // `is_supported()` (CPUID says AVX2 and FMA are present).
    unsafe { epi_impl(row, rb, cb, r, a) }
}

/// One row by 32 columns (four vectors): a GEMV (a batch-1 classifier or decoder step) reads
/// each 32-column panel of B front to back in one pass, where 16-column tiles read every other
/// 64-byte line in two passes.
static GEMV_TILES: [TileFn; 1] = [tile::<1, 4, true>];

/// The AVX2 kernel table for one row of A and B in 32-column panels. Only for a CPU with
/// AVX2 and FMA.
pub(crate) fn gemv_kernels() -> Kernels {
    Kernels {
        mr: 1,
        nr: 4 * LANES,
        kc: super::super::KC_AVX2,
        tiles: &GEMV_TILES,
        column: None,
        half: &[],
        quarter: &[],
        narrow: &[],
        fused: true,
        prelu: false,
        prefetch: true,
        stream_b: false,
        epi,
    }
}

/// The tiles of products of at most [`FEW`] rows, summing in two sets (see `products`).
static FEW_TILES: [TileFn; FEW] = [tile::<1, 2, true>, tile::<2, 2, true>, tile::<3, 2, true>];
/// [`FEW_TILES`] of 8 columns, for edges.
static FEW_HALF_TILES: [TileFn; FEW] = [tile::<1, 1, true>, tile::<2, 1, true>, tile::<3, 1, true>];

/// Rows up to which a product takes [`few_kernels`].
pub(crate) const FEW: usize = 3;

/// The AVX2 kernel table for products of at most [`FEW`] rows (a recurrent step over a
/// batch of a few sequences): their tiles have at most six accumulators, too few chains for
/// the FMA pipes, and sum odd depths into a second set. Only for a CPU with AVX2 and FMA.
pub(crate) fn few_kernels() -> Kernels {
    Kernels {
        mr: FEW,
        tiles: &FEW_TILES,
        column: None,
        half: &FEW_HALF_TILES,
        ..kernels()
    }
}

/// The AVX2 kernel table. Only for a CPU with AVX2 and FMA.
pub(crate) fn kernels() -> Kernels {
    Kernels {
        mr: MR,
        nr: NR,
        kc: super::super::KC_AVX2,
        tiles: &TILES,
        column: Some(column::<2>),
        half: &HALF_TILES,
        quarter: &[],
        narrow: &[],
        fused: true,
        prelu: false,
        prefetch: true,
        stream_b: false,
        epi,
    }
}

/// `row[i] = e^(scale row[i] - shift)`; returns the sum. Only for a CPU with this level.
pub(crate) fn exp_shift_sum(row: &mut [f32], scale: f32, shift: f32) -> f32 {
    // SAFETY: `crate::vector` calls this only for `Isa::Avx2Fma` or `Isa::Avx512`, after `is_supported()` (CPUID says AVX2 and FMA are present).
    unsafe { exp_shift_sum_impl(row, scale, shift) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `store_first` and `store_prefix` write exactly the first `n` lanes, at any offset.
    #[test]
    fn partial_stores_touch_only_their_lanes() {
        if !crate::isa::Isa::Avx2Fma.is_supported() {
            return;
        }
        let lanes: [f32; 8] = std::array::from_fn(|i| i as f32 + 1.0);
        for at in 0..3 {
            for n in 0..=9usize {
                for by_mask in [false, true] {
                    let mut buf = [-1.0f32; 16];
                    // SAFETY: AVX2 is present (checked above); the buffer holds `at + 8`
                    // floats, so `min(n, 8)` from `at` are writable.
                    unsafe {
                        let v = _mm256_loadu_ps(lanes.as_ptr());
                        let p = buf.as_mut_ptr().add(at);
                        if by_mask {
                            store_prefix(p, part_mask(n), v);
                        } else {
                            store_first(p, n, v);
                        }
                    }
                    let k = n.min(8);
                    for (i, &b) in buf.iter().enumerate() {
                        let want = if (at..at + k).contains(&i) { lanes[i - at] } else { -1.0 };
                        assert_eq!(b, want, "at {at} n {n} mask {by_mask} lane {i}");
                    }
                }
            }
        }
    }
}
