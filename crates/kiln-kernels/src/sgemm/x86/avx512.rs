//! AVX-512 kernels: an 8 x 32 f32 tile (16 zmm accumulators, two B vectors and a broadcast
//! per step of k: 16 FMAs for 2 loads and 8 broadcasts) with masked stores for edge columns,
//! and the vectorised epilogue. Every function here requires AVX-512 F + VL, AVX2 and FMA;
//! they are reached only through [`kernels`], which the dispatcher hands out after detection.

use super::super::driver::{Ahead, Kernels, TileEpi, TileFn};
use super::super::{Act, Affine};
use std::arch::x86_64::*;

/// Rows of the full tile.
pub(crate) const MR: usize = 8;
/// Columns of a tile (two zmm vectors).
pub(crate) const NR: usize = 32;

type V = __m512;
type M = __mmask16;

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn splat(x: f32) -> V {
    _mm512_set1_ps(x)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn zero() -> V {
    _mm512_setzero_ps()
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn add(a: V, b: V) -> V {
    _mm512_add_ps(a, b)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn sub(a: V, b: V) -> V {
    _mm512_sub_ps(a, b)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn mul(a: V, b: V) -> V {
    _mm512_mul_ps(a, b)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn div(a: V, b: V) -> V {
    _mm512_div_ps(a, b)
}
/// `1 / b` for finite `b` of moderate size (Gelu's `1 + z/2`, `1 <= b <= 6`): the 14-bit
/// estimate and one Newton step (relative error ~2^-27), cheaper than a divide.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn recip(b: V) -> V {
    let t = _mm512_rcp14_ps(b);
    _mm512_mul_ps(t, _mm512_fnmadd_ps(b, t, _mm512_set1_ps(2.0)))
}
/// `a * b + c`, one rounding.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn fmadd(a: V, b: V, c: V) -> V {
    _mm512_fmadd_ps(a, b, c)
}
/// `c - a * b`, one rounding.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn fnmadd(a: V, b: V, c: V) -> V {
    _mm512_fnmadd_ps(a, b, c)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn min(a: V, b: V) -> V {
    _mm512_min_ps(a, b)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn max(a: V, b: V) -> V {
    _mm512_max_ps(a, b)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn lt(a: V, b: V) -> M {
    _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn gt(a: V, b: V) -> M {
    _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b)
}
/// `a > b`, or either is NaN.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn gt_or_nan(a: V, b: V) -> M {
    _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(a, b)
}
/// `m ? t : f` per lane.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn blend(m: M, t: V, f: V) -> V {
    _mm512_mask_blend_ps(m, f, t)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn round(a: V) -> V {
    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a)
}
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn abs(a: V) -> V {
    _mm512_abs_ps(a)
}
/// `mag` (non-negative) with the sign of `x`.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn copy_sign(mag: V, x: V) -> V {
    let s = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag), s))
}
/// `y * 2^n` for integral `n` in `[-126, 128]` (`vscalefps`: one instruction, exact).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn scale_pow2(y: V, n: V) -> V {
    _mm512_scalef_ps(y, n)
}

/// `2^n` from `t = n + 1.5 * 2^23` (integral `n` in `[-126, 127]`): `t`'s low mantissa bits
/// hold `n` (two's complement, under the magic number's zero low bits), so
/// `(bits(t) + 127) << 23` is the biased exponent of `2^n` in place.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn pow2_of_magic(t: V) -> V {
    let bits = _mm512_add_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(127));
    _mm512_castsi512_ps(_mm512_slli_epi32::<23>(bits))
}

/// Vectors a sigmoid works on at once (`sigmoid_n`): four chains and their temporaries fit
/// the 32 registers (AVX2's count, measured on Zen 3; not measured here).
const ILP: usize = 4;

/// Floats per vector.
const LANES: usize = 16;

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn load_arr(a: &[f32; LANES]) -> V {
    // SAFETY: the array holds LANES readable floats.
    unsafe { _mm512_loadu_ps(a.as_ptr()) }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn store_arr(a: &mut [f32; LANES], v: V) {
    // SAFETY: the array holds LANES writable floats.
    unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) }
}

/// The first `s.len()` (< LANES) lanes from `s`, the others `fill`: a masked load, which
/// reads nothing past the slice.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn load_part(s: &[f32], fill: f32) -> V {
    // SAFETY: the mask enables only the first `s.len()` lanes, all inside the slice; masked
    // lanes are not accessed (no fault, no read).
    unsafe { _mm512_mask_loadu_ps(splat(fill), lanes(s.len()), s.as_ptr()) }
}

/// `v`'s first `s.len()` (< LANES) lanes into `s`: a masked store, touching nothing else.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
fn store_part(s: &mut [f32], v: V) {
    // SAFETY: as in `load_part`, for writes into the exclusively borrowed slice.
    unsafe { _mm512_mask_storeu_ps(s.as_mut_ptr(), lanes(s.len()), v) }
}

simd_math!("avx512f,avx512vl,avx2,fma");

/// Lane mask of the first `n` (clamped to 16) lanes.
fn lanes(n: usize) -> M {
    if n >= 16 { 0xFFFF } else { ((1u32 << n) - 1) as M }
}

/// `v < 0 ? v * s : v` in each lane (a PRelu slope; NaN and -0 kept).
macro_rules! prelu {
    ($v:expr, $s:expr) => {{
        let v = $v;
        _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, _mm512_setzero_ps()), v, $s)
    }};
}

/// `$body` once for each `$i` in `0..$r` (`$r <= MR`), `$i` a constant in each copy: a row
/// loop over the accumulator array, not unrolled, made the compiler keep the array on the
/// stack (16 stores after the depth loop and a load per row), a fixed cost per tile that
/// short depths (K = 16..32 in MobileNet's expansions) felt.
macro_rules! unrolled {
    ($r:expr, $i:ident => $body:block) => {
        unrolled!(@ $r, $i, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $r:expr, $i:ident, $body:block, $($n:literal)*) => {
        $({
            const $i: usize = $n;
            if $i < $r $body
        })*
    };
}

/// `$step!(p, acs)` for each depth step `p` in `$from..$kc`. Row-major A (`acs == 1`) goes
/// four steps a turn with the column stride a constant: the row addresses of a turn share
/// their base registers (displacements 0, 4, 8, 12) and advance once, where a step at a time
/// spent 4-8 address additions on the eight rows. Those share ports with the FMAs on Intel
/// cores (two 512-bit FMA ports): on a Xeon, 3 interleaved rounds of the sgemm bench, +4-15%
/// on depths 256-4608 (128x3072x768: 132 -> 141 GFLOP/s; 49x512x4608: 122 -> 141), none on
/// depths of 64-160; whole transformers 0.92x the time.
macro_rules! depth_steps {
    ($from:expr, $kc:expr, $acs:expr, $step:ident) => {
        depth_steps!($from, $kc, $acs, $step, {})
    };
    // `$turn` once every four steps (the tile's prefetches of the next panel, see `Ahead`).
    ($from:expr, $kc:expr, $acs:expr, $step:ident, $turn:block) => {{
        let (from, kc, acs): (usize, usize, usize) = ($from, $kc, $acs);
        if acs == 1 {
            let mut p = from;
            while p + 4 <= kc {
                $step!(p, 1);
                $step!(p + 1, 1);
                $step!(p + 2, 1);
                $step!(p + 3, 1);
                $turn
                p += 4;
            }
            for p in p..kc {
                $step!(p, 1);
            }
        } else {
            // Four steps a turn here too, so `$turn` costs no test per step.
            let mut p = from;
            while p + 4 <= kc {
                $step!(p, acs);
                $step!(p + 1, acs);
                $step!(p + 2, acs);
                $step!(p + 3, acs);
                $turn
                p += 4;
            }
            for p in p..kc {
                $step!(p, acs);
            }
        }
    }};
}

/// The full-width tile, and (`NARROW`) its twin for edge panels of 17 to 24 columns: that
/// one multiplies the second half in ymm (8 lanes, half an FMA slot of Zen 4's 256-bit pipes)
/// rather than zmm, so a 24-column C (MobileNet's 24-channel projections) spends no FMAs on
/// the panel's 8 zero columns.
///
/// `CHAINS` (one to four rows: a GEMV, a recurrent step's few batch rows) sums the depth in
/// interleaved chains (four for one row, p mod 4; two for two to four rows),
/// added at the end: one row's two accumulators made every FMA wait for the one before it
/// (4 cycles of latency), 8 MACs a cycle where the loads allow 32 (an LSTM step's 128 x 512
/// recurrent product: 2.6 us, B at 100 GB/s from L2).
///
/// # Safety
/// The [`TileFn`] contract with `MR = 8`, `NR = 32` (`NARROW`: `16 < nr <= 24`; `CHAINS`:
/// `R <= 4`, not `NARROW`); the CPU has AVX-512 F + VL, AVX2, FMA.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const NARROW: bool, const CHAINS: bool>(
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
    ahead: Ahead,
) {
    // The residual rows are read, and C's rows written, only after the depth loop: fetch
    // their lines meanwhile, so the epilogue finds them in cache instead of stalling on memory
    // once per tile. C's on every depth block: after the first, the tile adds to C, which by
    // then may have left L2 (a 128 x 3072 C is 1.5 MiB; 86% -> 92% of peak on 128x3072x768).
    // The full tiles spread the prefetches over their first R depth steps, a row's lines a
    // step, rather than issue all at once (up to 32 lines, more than the core tracks); the
    // chained few-row tiles (`CHAINS`) issue theirs first. Prefetches are hints: they never
    // fault. Line `q` is C's (then the residual's) row `q / 2`, half `q % 2`.
    let (resid, resid_ld) = epi.map_or((std::ptr::null(), 0), |e| (e.resid, e.resid_ld));
    let n = if resid.is_null() { 2 * R } else { 4 * R };
    let line = |q: usize| -> *const i8 {
        let (base, ld, q) = if q < 2 * R {
            (c.cast_const(), ldc, q)
        } else {
            (resid, resid_ld, q - 2 * R)
        };
        base.wrapping_add((q >> 1) * ld + (q & 1) * 16).cast::<i8>()
    };
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    macro_rules! step {
        ($p:expr) => {
            step!($p, acs)
        };
        ($p:expr, $acs:expr) => {{
            let (p, acs) = ($p, $acs);
            if NARROW {
                // SAFETY: the TileFn contract gives 32 readable floats at `b + p*bs` for
                // `p < kc` (the narrow tile reads 24 of them).
                let (b0, b1) = unsafe {
                    let bp = b.add(p * bs);
                    (_mm512_loadu_ps(bp), _mm256_loadu_ps(bp.add(16)))
                };
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: the TileFn contract: `a + i*ars + p*acs` readable for `i < R`, `p < kc`.
                    let av = _mm512_set1_ps(unsafe { *a.add(i * ars + p * acs) });
                    acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                    // The low 8 lanes only: the rest are masked off at the store.
                    let lo = _mm256_fmadd_ps(_mm512_castps512_ps256(av), b1, _mm512_castps512_ps256(acc[1]));
                    acc[1] = _mm512_castps256_ps512(lo);
                }
            } else {
                // SAFETY: the TileFn contract gives 32 readable floats at `b + p*bs` for `p < kc`.
                let (b0, b1) = unsafe {
                    let bp = b.add(p * bs);
                    (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)))
                };
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: the TileFn contract: `a + i*ars + p*acs` readable for `i < R`, `p < kc`.
                    let av = _mm512_set1_ps(unsafe { *a.add(i * ars + p * acs) });
                    acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
                }
            }
        }};
    }
    if CHAINS {
        for q in 0..n {
            _mm_prefetch::<_MM_HINT_ET0>(line(q));
        }
        // Interleaved chains of the depth (p mod U): four for one row, two for two to four
        // rows, so at least eight independent accumulators keep both FMA pipes busy.
        const U_MAX: usize = 4;
        let u = if R == 1 { U_MAX } else { 2 };
        let mut chains = [[[_mm512_setzero_ps(); 2]; R]; U_MAX];
        let turns = kc / u;
        for p in (0..turns * u).step_by(u) {
            // B's rows 16 ahead (2 KiB) fetched into L1: the step reads B from L2 (an LSTM's
            // 1 MiB of recurrent weights a step), faster than the hardware prefetcher brings
            // it (3 x 1024 x 256 bench: 13.2 -> 12.1 us; 24 ahead the same, 48 slower).
            // Hints: past-the-end addresses are never dereferenced.
            let far = b.wrapping_add((p + 16) * bs).cast::<i8>();
            for q in 0..u {
                _mm_prefetch::<_MM_HINT_T0>(far.wrapping_add(q * bs * 4));
                _mm_prefetch::<_MM_HINT_T0>(far.wrapping_add(q * bs * 4 + 64));
            }
            for (q, ch) in chains.iter_mut().take(u).enumerate() {
                // SAFETY: the TileFn contract gives 32 readable floats at `b + p*bs` and a
                // readable `a + i*ars + p*acs` for `i < R`, `p < kc` (here `p + q < u *
                // turns <= kc`).
                let (b0, b1) = unsafe {
                    let bp = b.add((p + q) * bs);
                    (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)))
                };
                for (i, ch) in ch.iter_mut().enumerate() {
                    // SAFETY: as above.
                    let av = _mm512_set1_ps(unsafe { *a.add(i * ars + (p + q) * acs) });
                    ch[0] = _mm512_fmadd_ps(av, b0, ch[0]);
                    ch[1] = _mm512_fmadd_ps(av, b1, ch[1]);
                }
            }
        }
        for p in turns * u..kc {
            // SAFETY: as above, `p < kc`.
            let (b0, b1) = unsafe {
                let bp = b.add(p * bs);
                (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)))
            };
            for (i, ch) in chains[0].iter_mut().enumerate() {
                // SAFETY: as above.
                let av = _mm512_set1_ps(unsafe { *a.add(i * ars + p * acs) });
                ch[0] = _mm512_fmadd_ps(av, b0, ch[0]);
                ch[1] = _mm512_fmadd_ps(av, b1, ch[1]);
            }
        }
        let [c0, c1, c2, c3] = chains;
        for (i, acc) in acc.iter_mut().enumerate() {
            for j in 0..2 {
                acc[j] = _mm512_add_ps(_mm512_add_ps(c0[i][j], c1[i][j]), _mm512_add_ps(c2[i][j], c3[i][j]));
            }
        }
    } else {
        // C's rows (and the residual's) fetched over the first R depth steps, a row's two
        // lines a step (the rows are read and written after the loop). A line a step over
        // the first 16-32 steps, its address computed from the step, had been a quarter of a
        // 64-deep tile's time (ResNet's 1x1 layers); all lines before the loop, or a row a
        // turn of the unrolled loop (which made the compiler spill accumulators), were slower.
        let (mut cl, mut rl) = (c.cast_const().cast::<i8>(), resid.cast::<i8>());
        let (c_step, r_step) = (ldc * 4, resid_ld * 4);
        let head = kc.min(R);
        for p in 0..R {
            if p < head {
                step!(p);
            }
            _mm_prefetch::<_MM_HINT_ET0>(cl);
            _mm_prefetch::<_MM_HINT_ET0>(cl.wrapping_add(64));
            cl = cl.wrapping_add(c_step);
            if !rl.is_null() {
                _mm_prefetch::<_MM_HINT_T0>(rl);
                _mm_prefetch::<_MM_HINT_T0>(rl.wrapping_add(64));
                rl = rl.wrapping_add(r_step);
            }
        }
        // The next panel's slice (`Ahead`): two lines a turn, into L2; what the depth loop
        // leaves over after it. Hints: past-the-end addresses are never formed beyond the
        // slice (`wrapping_add`) and never fault.
        let mut pf = ahead.ptr.cast::<i8>();
        let pf_end = pf.wrapping_add(ahead.lines * 64);
        depth_steps!(head, kc, acs, step, {
            if pf < pf_end {
                _mm_prefetch::<_MM_HINT_T1>(pf);
                _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(64));
                pf = pf.wrapping_add(128);
            }
        });
        while pf < pf_end {
            _mm_prefetch::<_MM_HINT_T1>(pf);
            pf = pf.wrapping_add(64);
        }
    }
    if NARROW {
        // Lanes 8..16 of the second half were never computed: zeros, not undefined values.
        for acc in acc.iter_mut() {
            acc[1] = _mm512_zextps256_ps512(_mm512_castps512_ps256(acc[1]));
        }
    }
    let (m0, m1) = (lanes(nr), lanes(nr.saturating_sub(16)));
    // SAFETY: TileEpi's contract: a non-null column bias has `nr` readable floats; the masks
    // cover exactly lanes `< nr`, and `+ 16` is only formed when `nr > 16`.
    let (cb0, cb1) = match epi {
        Some(e) if !e.col_bias.is_null() => unsafe {
            (
                Some(_mm512_maskz_loadu_ps(m0, e.col_bias)),
                (m1 != 0).then(|| _mm512_maskz_loadu_ps(m1, e.col_bias.add(16))),
            )
        },
        _ => (None, None),
    };
    // SAFETY: as for the column bias (TileEpi's contract for the column slopes).
    let (ps0, ps1) = match epi {
        Some(e) if !e.prelu_col.is_null() => unsafe {
            (
                Some(_mm512_maskz_loadu_ps(m0, e.prelu_col)),
                (m1 != 0).then(|| _mm512_maskz_loadu_ps(m1, e.prelu_col.add(16))),
            )
        },
        _ => (None, None),
    };
    // The epilogue's decisions, once per tile (see `Cheap`).
    let null = std::ptr::null::<f32>();
    let (row_bias, resid, resid_ld) = epi.map_or((null, null, 0), |e| (e.row_bias, e.resid, e.resid_ld));
    let prelu_row = epi.map_or(null, |e| e.prelu_row);
    let cheap = cheap_of(epi.and_then(|e| e.act), epi.and_then(|e| e.post));
    // One copy of the row epilogue per row (see `unrolled!`): the accumulators stay in
    // registers instead of going through the stack.
    unrolled!(R, I => {
        if let Some(&[a0, a1]) = acc.get(I) {
            // SAFETY: the TileFn contract gives `nr` writable (initialised unless `first`)
            // floats at `c + I*ldc` for `I < R`, and TileEpi's gives `R` row-bias floats and
            // `nr` residual floats at `resid + I*resid_ld`; the masks cover exactly lanes
            // `< nr` (masked-off lanes are neither read nor written), and `+ 16` is only
            // formed when `nr > 16`.
            unsafe {
                let cp = c.add(I * ldc);
                let mut v0 = a0;
                let mut v1 = a1;
                if !first {
                    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, cp));
                    if m1 != 0 {
                        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, cp.add(16)));
                    }
                }
                // The order of the unfused ops: row bias, column bias, residual, activation.
                if !row_bias.is_null() {
                    let rb = _mm512_set1_ps(*row_bias.add(I));
                    v0 = _mm512_add_ps(v0, rb);
                    v1 = _mm512_add_ps(v1, rb);
                }
                if let Some(cb) = cb0 {
                    v0 = _mm512_add_ps(v0, cb);
                }
                if let Some(cb) = cb1 {
                    v1 = _mm512_add_ps(v1, cb);
                }
                if !resid.is_null() {
                    let rp = resid.add(I * resid_ld);
                    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, rp));
                    if m1 != 0 {
                        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, rp.add(16)));
                    }
                }
                v0 = apply_cheap(cheap, v0);
                v1 = apply_cheap(cheap, v1);
                // PRelu slopes (never with an activation or affine: `validate`).
                if let Some(s) = ps0 {
                    v0 = prelu!(v0, s);
                }
                if let Some(s) = ps1 {
                    v1 = prelu!(v1, s);
                }
                if !prelu_row.is_null() {
                    let s = _mm512_set1_ps(*prelu_row.add(I));
                    v0 = prelu!(v0, s);
                    v1 = prelu!(v1, s);
                }
                if m0 == 0xFFFF {
                    _mm512_storeu_ps(cp, v0);
                } else {
                    _mm512_mask_storeu_ps(cp, m0, v0);
                }
                if m1 == 0xFFFF {
                    _mm512_storeu_ps(cp.add(16), v1);
                } else if m1 != 0 {
                    _mm512_mask_storeu_ps(cp.add(16), m1, v1);
                }
            }
        }
    });
    // Costly activations (exp, erf, tanh) run over the stored rows, still in L1: one call per
    // tile rather than per vector with every accumulator live across it.
    if let Some(a) = epi.and_then(|e| e.act).filter(|a| !a.is_cheap()) {
        // SAFETY: the TileFn contract gives `nr` writable, now initialised floats at
        // `c + i*ldc` for `i < R`, used by no one else during the call.
        unsafe { act_rows(a, c, ldc, R, nr) };
        // SAFETY: as above.
        unsafe { post_rows(epi.and_then(|e| e.post), c, ldc, R, nr) };
    }
}

static TILES: [TileFn; MR] = [
    tile::<1, false, false>,
    tile::<2, false, false>,
    tile::<3, false, false>,
    tile::<4, false, false>,
    tile::<5, false, false>,
    tile::<6, false, false>,
    tile::<7, false, false>,
    tile::<8, false, false>,
];

static NARROW_TILES: [TileFn; MR] = [
    tile::<1, true, false>,
    tile::<2, true, false>,
    tile::<3, true, false>,
    tile::<4, true, false>,
    tile::<5, true, false>,
    tile::<6, true, false>,
    tile::<7, true, false>,
    tile::<8, true, false>,
];

/// # Safety
/// The [`TileFn`] contract with `MR = 8`, `NR = 16` (edge columns: `nr <= 16`; `QUARTER`:
/// `nr <= 8`); the CPU has AVX-512 F + VL, AVX2, FMA.
///
/// `QUARTER` multiplies in ymm (8 lanes): Zen 4 runs a zmm FMA on both of its 256-bit pipes,
/// so for an edge of at most 8 columns (an 8-channel convolution's whole output) the
/// 16-lane tile spent half of every multiply on the panel's zero columns.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn half_tile<const R: usize, const QUARTER: bool>(
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
    let mut acc = [_mm512_setzero_ps(); R];
    if QUARTER {
        let mut q = [_mm256_setzero_ps(); R];
        macro_rules! quarter_step {
            ($p:expr, $acs:expr) => {{
                let (p, acs) = ($p, $acs);
                // SAFETY: the TileFn contract gives 16 (so 8) readable floats at `b + p*bs`
                // for `p < kc`.
                let b0 = unsafe { _mm256_loadu_ps(b.add(p * bs)) };
                for (i, q) in q.iter_mut().enumerate() {
                    // SAFETY: the TileFn contract: `a + i*ars + p*acs` readable for `i < R`, `p < kc`.
                    let av = _mm256_set1_ps(unsafe { *a.add(i * ars + p * acs) });
                    *q = _mm256_fmadd_ps(av, b0, *q);
                }
            }};
        }
        depth_steps!(0, kc, acs, quarter_step);
        for (acc, &q) in acc.iter_mut().zip(&q) {
            *acc = _mm512_zextps256_ps512(q);
        }
    } else {
        macro_rules! half_step {
            ($p:expr, $acs:expr) => {{
                let (p, acs) = ($p, $acs);
                // SAFETY: the TileFn contract gives 16 readable floats at `b + p*bs` for `p < kc`.
                let b0 = unsafe { _mm512_loadu_ps(b.add(p * bs)) };
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: the TileFn contract: `a + i*ars + p*acs` readable for `i < R`, `p < kc`.
                    let av = _mm512_set1_ps(unsafe { *a.add(i * ars + p * acs) });
                    *acc = _mm512_fmadd_ps(av, b0, *acc);
                }
            }};
        }
        depth_steps!(0, kc, acs, half_step);
    }
    let m0 = lanes(nr);
    let cb = match epi {
        // SAFETY: TileEpi's contract: a non-null column bias has `nr` readable floats; the mask
        // covers exactly lanes `< nr`.
        Some(e) if !e.col_bias.is_null() => Some(unsafe { _mm512_maskz_loadu_ps(m0, e.col_bias) }),
        _ => None,
    };
    let ps = match epi {
        // SAFETY: as for the column bias (TileEpi's contract for the column slopes).
        Some(e) if !e.prelu_col.is_null() => Some(unsafe { _mm512_maskz_loadu_ps(m0, e.prelu_col) }),
        _ => None,
    };
    // The epilogue's decisions, once per tile (see `Cheap`).
    let null = std::ptr::null::<f32>();
    let (row_bias, resid, resid_ld) = epi.map_or((null, null, 0), |e| (e.row_bias, e.resid, e.resid_ld));
    let prelu_row = epi.map_or(null, |e| e.prelu_row);
    let cheap = cheap_of(epi.and_then(|e| e.act), epi.and_then(|e| e.post));
    unrolled!(R, I => {
        if let Some(&acc) = acc.get(I) {
            // SAFETY: `nr <= 16` writable (initialised unless `first`) floats at `c + I*ldc`
            // for `I < R`, `R` row-bias floats and `nr` residual floats at
            // `resid + I*resid_ld` (TileFn and TileEpi contracts); the mask covers exactly
            // lanes `< nr`.
            unsafe {
                let cp = c.add(I * ldc);
                let mut v = if first {
                    acc
                } else {
                    _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m0, cp))
                };
                // The order of the unfused ops: row bias, column bias, residual, activation.
                if !row_bias.is_null() {
                    v = _mm512_add_ps(v, _mm512_set1_ps(*row_bias.add(I)));
                }
                if let Some(cb) = cb {
                    v = _mm512_add_ps(v, cb);
                }
                if !resid.is_null() {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m0, resid.add(I * resid_ld)));
                }
                v = apply_cheap(cheap, v);
                if let Some(s) = ps {
                    v = prelu!(v, s);
                }
                if !prelu_row.is_null() {
                    v = prelu!(v, _mm512_set1_ps(*prelu_row.add(I)));
                }
                _mm512_mask_storeu_ps(cp, m0, v);
            }
        }
    });
    // Costly activations over the stored rows (see `tile`).
    if let Some(a) = epi.and_then(|e| e.act).filter(|a| !a.is_cheap()) {
        // SAFETY: the TileFn contract gives `nr` writable, now initialised floats at
        // `c + i*ldc` for `i < R`, used by no one else during the call.
        unsafe { act_rows(a, c, ldc, R, nr) };
        // SAFETY: as above.
        unsafe { post_rows(epi.and_then(|e| e.post), c, ldc, R, nr) };
    }
}

static HALF_TILES: [TileFn; MR] = [
    half_tile::<1, false>,
    half_tile::<2, false>,
    half_tile::<3, false>,
    half_tile::<4, false>,
    half_tile::<5, false>,
    half_tile::<6, false>,
    half_tile::<7, false>,
    half_tile::<8, false>,
];

static QUARTER_TILES: [TileFn; MR] = [
    half_tile::<1, true>,
    half_tile::<2, true>,
    half_tile::<3, true>,
    half_tile::<4, true>,
    half_tile::<5, true>,
    half_tile::<6, true>,
    half_tile::<7, true>,
    half_tile::<8, true>,
];

/// Loads the first `n <= 16` floats at `p` (others zero).
///
/// # Safety
/// `n` readable floats at `p`.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn load_n(p: *const f32, n: usize) -> V {
    // SAFETY: the mask covers the first `n` lanes, which the caller guarantees readable.
    unsafe { _mm512_maskz_loadu_ps(lanes(n), p) }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
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
    while j < n {
        let w = (n - j).min(16);
        // SAFETY: `j + w <= n`, and `row`, `cb` and `r` have at least `n` floats; masked lanes
        // past `w` are neither read nor written.
        unsafe {
            let cbv = cb.map(|s| load_n(s.as_ptr().add(j), w));
            let rv = r.map(|s| load_n(s.as_ptr().add(j), w));
            let p = row.as_mut_ptr().add(j);
            let v = epi_vec(load_n(p, w), rbv, cbv, rv, a);
            _mm512_mask_storeu_ps(p, lanes(w), v);
        }
        j += w;
    }
    if let Some(x) = costly {
        act_row(x, row);
    }
}

fn epi(row: &mut [f32], rb: Option<f32>, cb: Option<&[f32]>, r: Option<&[f32]>, a: Option<Act>) {
    if cb.is_some_and(|s| s.len() != row.len()) || r.is_some_and(|s| s.len() != row.len()) {
        return super::super::portable::epi(row, rb, cb, r, a);
    }
    // SAFETY: this function is only reachable through `kernels()`, which `Kernels::select`
    // returns only for `Isa::Avx512`, which callers pass only after `is_supported()` (CPUID
    // says AVX-512 F + VL, AVX2 and FMA are present).
    unsafe { epi_impl(row, rb, cb, r, a) }
}

/// One row of A (a GEMV) by 32-column panels: the depth in four chains (see [`tile`]).
static GEMV_TILES: [TileFn; 1] = [tile::<1, false, true>];

/// Two to four rows of A (a recurrent step's batch) by 32-column panels: the depth in two
/// chains (see [`tile`]); a plain tile of three rows keeps six accumulators, each multiply-add
/// waiting on the one before it.
static FEW_TILES: [TileFn; 4] = [
    tile::<1, false, true>,
    tile::<2, false, true>,
    tile::<3, false, true>,
    tile::<4, false, true>,
];

/// The AVX-512 kernel table for two to four rows of A and B in 32-column panels. Only for a
/// CPU with this level.
pub(crate) fn few_kernels() -> Kernels {
    Kernels {
        mr: 4,
        tiles: &FEW_TILES,
        column: None,
        half: &[],
        quarter: &[],
        narrow: &[],
        ..kernels()
    }
}

/// The AVX-512 kernel table for one row of A and B in 32-column panels. Only for a CPU with
/// this level.
pub(crate) fn gemv_kernels() -> Kernels {
    Kernels {
        mr: 1,
        tiles: &GEMV_TILES,
        column: None,
        half: &[],
        quarter: &[],
        narrow: &[],
        ..kernels()
    }
}

/// The AVX-512 kernel table. Only for a CPU with AVX-512 F + VL, AVX2 and FMA.
pub(crate) fn kernels() -> Kernels {
    Kernels {
        mr: MR,
        nr: NR,
        kc: super::super::KC_MAX,
        tiles: &TILES,
        column: None,
        half: &HALF_TILES,
        quarter: &QUARTER_TILES,
        narrow: &NARROW_TILES,
        fused: true,
        prelu: true,
        prefetch: false,
        stream_b: true,
        epi,
    }
}

/// `row[i] = e^(scale row[i] - shift)`; returns the sum. Only for a CPU with this level.
pub(crate) fn exp_shift_sum(row: &mut [f32], scale: f32, shift: f32) -> f32 {
    // SAFETY: `crate::vector` calls this only for `Isa::Avx512`, after `is_supported()` (CPUID says AVX-512 F + VL, AVX2 and FMA are present).
    unsafe { exp_shift_sum_impl(row, scale, shift) }
}
