//! Row kernels of the memory-bound ops: softmax over contiguous rows and the reductions that
//! layer normalisation needs. Each SIMD path has a portable twin that the property tests
//! (`tests/vector_props.rs`) hold it against.
//!
//! Only the exponential needs hand-written SIMD (the shared polynomial of `sgemm::x86::math`,
//! ~1 ulp); the max, the sums and the scaling are plain loops over lane arrays, which the
//! compiler vectorises for the baseline target.

use crate::isa::{self, Isa};

/// `dst[i] = if src[i] > dst[i] { src[i] } else { dst[i] }` over the shorter of the two: a
/// max pool's step, NaNs in `src` skipped and those in `dst` kept (x86's `maxps(src, dst)`).
/// On AVX2 through intrinsics: written as a select into `dst[i]`, the compiler stores only
/// the lanes that changed, with `vmaskmovps`, microcoded on AMD (5 ns a vector: 0.9 ms of
/// MTCNN R-Net's 1 ms pool), whatever form the select takes. Elsewhere the loop, compiled for
/// the level of a `simd::vectorize` caller (AVX-512's masked stores are plain ones).
#[inline(always)]
pub fn max_into(dst: &mut [f32], src: &[f32]) {
    select_with::<true>(isa::active(), dst, src);
}

/// [`max_into`] on a given level (the AVX2 path where `isa` is AVX2 and the CPU has it).
#[inline(always)]
pub fn max_into_with(isa: Isa, dst: &mut [f32], src: &[f32]) {
    select_with::<true>(isa, dst, src);
}

/// `dst[i] = src[i]` where `src[i]` is NaN (a window's first tap, whose NaN the max pool's
/// result takes), over the shorter of the two; stored as [`max_into`] stores.
#[inline(always)]
pub fn nan_into(dst: &mut [f32], src: &[f32]) {
    select_with::<false>(isa::active(), dst, src);
}

/// [`nan_into`] on a given level.
#[inline(always)]
pub fn nan_into_with(isa: Isa, dst: &mut [f32], src: &[f32]) {
    select_with::<false>(isa, dst, src);
}

/// [`max_into`] (`MAX`) or [`nan_into`] on `isa`: the AVX2 intrinsics, or the loop.
#[inline(always)]
fn select_with<const MAX: bool>(isa: Isa, dst: &mut [f32], src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma && isa.is_supported() {
        // SAFETY: the CPU has AVX2 (checked).
        unsafe { avx2_select::<MAX>(dst, src) };
        return;
    }
    let _ = isa;
    for (m, &v) in dst.iter_mut().zip(src) {
        *m = if if MAX { v > *m } else { v.is_nan() } { v } else { *m };
    }
}

/// [`max_into`] (`MAX`) or [`nan_into`] on AVX2: whole vectors loaded, selected and stored
/// with plain stores, the tail by the scalar rule.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_select<const MAX: bool>(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::*;
    let pick = |mut m: __m256, v: __m256| {
        // SAFETY: an empty asm block: `m` passes through unchanged. It hides from the
        // compiler that `m` was loaded from where the result goes, from which it made the
        // blend a `vmaskmovps` store again.
        unsafe { std::arch::asm!("/* {0} */", inout(ymm_reg) m, options(pure, nomem, nostack)) };
        if MAX {
            // `maxps(v, m)`: `v > m ? v : m`, so a NaN in either gives `m`.
            _mm256_max_ps(v, m)
        } else {
            _mm256_blendv_ps(m, v, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v))
        }
    };
    let n = dst.len().min(src.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, within both slices.
        unsafe {
            let d = dst.as_mut_ptr().add(i);
            _mm256_storeu_ps(d, pick(_mm256_loadu_ps(d), _mm256_loadu_ps(src.as_ptr().add(i))));
        }
        i += 8;
    }
    // The tail through local vectors (a scalar loop here became masked stores again).
    let (Some(d), Some(s)) = (dst.get_mut(i..n), src.get(i..n)) else {
        return;
    };
    if d.is_empty() {
        return;
    }
    let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
    a[..d.len()].copy_from_slice(d);
    b[..s.len()].copy_from_slice(s);
    // SAFETY: `a` and `b` hold 8 floats each.
    unsafe {
        _mm256_storeu_ps(
            a.as_mut_ptr(),
            pick(_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr())),
        )
    };
    d.copy_from_slice(&a[..d.len()]);
}

/// `dst.copy_from_slice(src)` (equal lengths), with the short runs of a few-channel image
/// (a stem's 3 channels: 9 floats per kernel row) as fixed-size moves the compiler inlines:
/// as `memmove` calls they took a quarter of MTCNN's first convolution; a pooled pixel's
/// or a Winograd block's 10 channels likewise).
#[inline(always)]
pub fn copy_run(dst: &mut [f32], src: &[f32]) {
    if dst.len() != src.len() || dst.len() >= 64 {
        dst.copy_from_slice(src);
        return;
    }
    // Fewer than 8 (a one-channel window's kernel row: 3, 5 or 7 floats): one fixed-size move
    // each, where the chunked moves below cost ~8% of a spectrogram stem's im2col.
    fn fixed<const N: usize>(d: &mut [f32], s: &[f32]) -> bool {
        match (<&mut [f32; N]>::try_from(d), <&[f32; N]>::try_from(s)) {
            (Ok(d), Ok(s)) => {
                *d = *s;
                true
            }
            _ => false,
        }
    }
    let done = match dst.len() {
        1 => fixed::<1>(dst, src),
        2 => fixed::<2>(dst, src),
        3 => fixed::<3>(dst, src),
        4 => fixed::<4>(dst, src),
        5 => fixed::<5>(dst, src),
        6 => fixed::<6>(dst, src),
        7 => fixed::<7>(dst, src),
        _ => false,
    };
    if done {
        return;
    }
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        if let (Ok(d), Ok(s)) = (<&mut [f32; 8]>::try_from(d), <&[f32; 8]>::try_from(s)) {
            *d = *s;
        }
    }
    let (mut d, mut s) = (d.into_remainder(), s.remainder());
    for w in [4, 2, 1] {
        if d.len() >= w {
            let (dh, dt) = d.split_at_mut(w);
            let (sh, st) = s.split_at(w);
            for (a, b) in dh.iter_mut().zip(sh) {
                *a = *b;
            }
            (d, s) = (dt, st);
        }
    }
}

/// Lane count of the portable partial sums and maxima: as wide as an AVX-512 vector, so
/// the compiler can keep them in registers at any level.
const W: usize = 16;

/// `a`'s lanes combined pairwise (`op(a[i], a[i + h])` halving the width each step): about
/// log2(N) dependent steps where a fold makes N. A row of 128-197 scores or LayerNorm's 192
/// features is only 8-13 vectors, and the fold of a 16-lane partial sum took as long as the
/// pass it ended.
#[inline(always)]
pub(crate) fn tree<T: Copy, const N: usize>(mut a: [T; N], op: impl Fn(T, T) -> T) -> Option<T> {
    let mut w = N;
    while w > 1 {
        let h = w.div_ceil(2);
        let (lo, hi) = a.split_at_mut(h);
        lo.iter_mut()
            .zip(hi.iter().take(w - h))
            .for_each(|(x, &y)| *x = op(*x, y));
        w = h;
    }
    a.first().copied()
}

/// The sum of `a`'s lanes, added pairwise ([`tree`]).
#[inline(always)]
pub(crate) fn tree_sum<T: Copy + Default + std::ops::Add<Output = T>, const N: usize>(a: [T; N]) -> T {
    tree(a, |x, y| x + y).unwrap_or_default()
}

/// The largest of `a`'s lanes (-inf for none), combined pairwise; `a` holds no NaN (the
/// lane maxima below never take one), so this is the same maximum as a fold.
#[inline(always)]
fn tree_max<const N: usize>(a: [f32; N]) -> f32 {
    tree(a, |a, x| if x > a { x } else { a }).unwrap_or(f32::NEG_INFINITY)
}

/// `sum a[p] * b[p]` over the shorter slice, in sixteen interleaved partial sums (lane
/// `p % 16`), reduced pairwise, then the tail in order: plain code the callers' vectorised
/// regions compile to one 512-bit (or two 256-bit) multiply-add per sixteen values, the same
/// bits at every level.
#[inline(always)]
pub fn dot16(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut tail = 0f32;
    dot16_into(&mut acc, &mut tail, a, b);
    reduce16(acc) + tail
}

/// [`dot16`]'s sums added into `acc` (lane `p % 16`) and `tail` (the last `len % 16` products,
/// in order), not reduced: several runs of one dot product (a convolution's kernel rows)
/// share one set of partial sums.
#[inline(always)]
pub fn dot16_into(acc: &mut [f32; 16], tail: &mut f32, a: &[f32], b: &[f32]) {
    let mut ac = a.chunks_exact(16);
    let mut bc = b.chunks_exact(16);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        *tail += x * y;
    }
}

/// `scale[j] * sum_p a[p] * q[j][p]` for every row `j` of the row-major int8 matrix `q` (rows
/// of `k` = `a.len()` values), into `out[j]`: the product of a vector by weights stored as
/// int8 codes with one scale per row (a recurrent cell's dequantized weights, read as a
/// quarter of the bytes). Four rows at a time share each load of `a`; each row keeps
/// [`dot16`]'s sixteen partial sums and order, so the result is that of `dot16` on the row's
/// codes as floats, then scaled; the same bits at every level. Rows past `out` or `scale` are
/// skipped.
pub fn dot_rows_i8(a: &[f32], q: &[i8], scale: &[f32], out: &mut [f32]) {
    crate::simd::vectorize_kernel(RowsI8 { a, q, scale, out })
}

/// [`dot_rows_i8`]'s loops, always inlined into its vectorised caller.
struct RowsI8<'a> {
    a: &'a [f32],
    q: &'a [i8],
    scale: &'a [f32],
    out: &'a mut [f32],
}

impl crate::simd::Kernel for RowsI8<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let RowsI8 { a, q, scale, out } = self;
        let k = a.len();
        if k == 0 {
            out.iter_mut().for_each(|o| *o = 0.0);
            return;
        }
        let full = k / 16 * 16;
        let (a16, a_tail) = a.split_at(full);
        let n = out.len().min(scale.len()).min(q.len() / k);
        let (mut j, mut acc) = (0, [[0f32; 16]; 4]);
        while j < n {
            let rows = (n - j).min(4);
            acc.iter_mut().for_each(|r| *r = [0.0; 16]);
            if rows == 4 {
                // Four rows side by side: four independent chains of multiply-adds.
                let (Some(q0), Some(q1), Some(q2), Some(q3)) = (
                    q.get(j * k..j * k + full),
                    q.get((j + 1) * k..(j + 1) * k + full),
                    q.get((j + 2) * k..(j + 2) * k + full),
                    q.get((j + 3) * k..(j + 3) * k + full),
                ) else {
                    return;
                };
                let [mut s0, mut s1, mut s2, mut s3] = [[0f32; 16]; 4];
                for (c, x) in a16.chunks_exact(16).enumerate() {
                    let x: &[f32; 16] = x.try_into().unwrap_or(&[0.0; 16]);
                    let at = c * 16..c * 16 + 16;
                    step16(&mut s0, x, q0.get(at.clone()));
                    step16(&mut s1, x, q1.get(at.clone()));
                    step16(&mut s2, x, q2.get(at.clone()));
                    step16(&mut s3, x, q3.get(at));
                }
                acc = [s0, s1, s2, s3];
            } else {
                for (r, accr) in acc.iter_mut().enumerate().take(rows) {
                    let qr = q.get((j + r) * k..(j + r) * k + full).unwrap_or(&[]);
                    for (x, qc) in a16.chunks_exact(16).zip(qr.chunks_exact(16)) {
                        step16(accr, x.try_into().unwrap_or(&[0.0; 16]), Some(qc));
                    }
                }
            }
            for (r, accr) in acc.iter().enumerate().take(rows) {
                let row = q.get((j + r) * k + full..(j + r + 1) * k).unwrap_or(&[]);
                let tail = a_tail.iter().zip(row).fold(0f32, |t, (x, &v)| t + x * f32::from(v));
                if let (Some(o), Some(&s)) = (out.get_mut(j + r), scale.get(j + r)) {
                    *o = s * (reduce16(*accr) + tail);
                }
            }
            j += rows;
        }
    }
}

/// Largest code of a state quantized by [`quantize_state`] (symmetric i16 codes).
pub const STATE_MAX: i32 = 32767;

/// Depths per block of [`dot_rows_i8_state`]'s AVX2 sums: each i32 lane then sums at most
/// 128 products of an i16 by an i8 (`128 * 32768 * 128 < 2^31`), exact for any codes; the
/// blocks add up in i64.
const STATE_BLOCK: usize = 1024;

/// A state vector as i16 codes for [`dot_rows_i8_state`]: `codes[p] = round(a[p] / s)` with
/// `s = max |a| / STATE_MAX` (so `|a[p] - s codes[p]| <= s / 2`, 2^-16 of the largest
/// magnitude), returning `s`: 0 for an all-zero `a`; `None` (codes unspecified) when `a`
/// holds a NaN or an infinity or its largest magnitude is too small to invert.
pub fn quantize_state(a: &[f32], codes: &mut Vec<i16>) -> Option<f32> {
    codes.clear();
    let mut m = 0f32;
    for &x in a {
        if !x.is_finite() {
            return None;
        }
        m = m.max(x.abs());
    }
    if m == 0.0 {
        codes.resize(a.len(), 0);
        return Some(0.0);
    }
    let top = STATE_MAX as f32;
    let inv = top / m;
    if !inv.is_finite() {
        return None;
    }
    codes.extend(a.iter().map(|&x| (x * inv).round().clamp(-top, top) as i16));
    Some(m / top)
}

/// `out[j] = scale[j] * s * sum_p codes[p] * q[j][p]` for every row `j` of the row-major
/// int8 matrix `q` (rows of `k = codes.len()`): the product of a state quantized by
/// [`quantize_state`] (codes `codes`, step `s`) by weights held as int8 codes with a scale
/// per row. The sums are exact (i64), then scaled in f64 and rounded once: the same bits
/// at every level. Rows past `out` or `scale` are
/// skipped.
pub fn dot_rows_i8_state(codes: &[i16], s: f32, q: &[i8], scale: &[f32], out: &mut [f32]) {
    dot_rows_i8_state_with(crate::isa::active(), codes, s, q, scale, out)
}

/// [`dot_rows_i8_state`] on a given level (tests compare the levels).
pub fn dot_rows_i8_state_with(isa: Isa, codes: &[i16], s: f32, q: &[i8], scale: &[f32], out: &mut [f32]) {
    let k = codes.len();
    let n = out
        .len()
        .min(scale.len())
        .min(q.len().checked_div(k).unwrap_or(usize::MAX));
    #[cfg(target_arch = "x86_64")]
    let simd = isa >= Isa::Avx2Fma && isa.is_supported();
    #[cfg(not(target_arch = "x86_64"))]
    let simd = {
        let _ = isa;
        false
    };
    let mut j = 0;
    while j < n {
        let rows = (n - j).min(4);
        let sums = match q.get(j * k..(j + 4) * k).filter(|_| rows == 4 && simd) {
            // SAFETY: the CPU has AVX2 (`simd`); `block` is the four rows of `k` codes.
            #[cfg(target_arch = "x86_64")]
            Some(block) => unsafe { avx2_state_rows(codes, block) },
            _ => std::array::from_fn(|r| {
                let row = q.get((j + r) * k..(j + r + 1) * k).filter(|_| r < rows).unwrap_or(&[]);
                row.iter().zip(codes).map(|(&w, &c)| i64::from(w) * i64::from(c)).sum()
            }),
        };
        for (r, &sum) in sums.iter().enumerate().take(rows) {
            if let (Some(o), Some(&sc)) = (out.get_mut(j + r), scale.get(j + r)) {
                *o = (sum as f64 * (f64::from(sc) * f64::from(s))) as f32;
            }
        }
        j += rows;
    }
}

/// Four rows of [`dot_rows_i8_state`]'s exact sums: sixteen depths a step, the codes
/// widened to i16 and multiplied pairwise into i32 lanes (`vpmaddwd`), the state's load
/// shared by the rows; the lanes summed per [`STATE_BLOCK`] in i64, the tail in order.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_state_rows(codes: &[i16], block: &[i8]) -> [i64; 4] {
    use std::arch::x86_64::*;
    let k = codes.len();
    let mut sums = [0i64; 4];
    if block.len() < 4 * k {
        return sums;
    }
    let (a, q) = (codes.as_ptr(), block.as_ptr());
    let mut p0 = 0;
    while p0 < k {
        let p1 = (p0 + STATE_BLOCK).min(k);
        let full = p0 + (p1 - p0) / 16 * 16;
        let mut acc = [_mm256_setzero_si256(); 4];
        let mut p = p0;
        while p < full {
            // SAFETY: `p + 16 <= k`: sixteen codes of the state and of each row `r < 4`
            // (at `r * k`), inside `codes` and `block` (`4 k` long, checked above).
            unsafe {
                let x = _mm256_loadu_si256(a.add(p).cast::<__m256i>());
                for (r, acc) in acc.iter_mut().enumerate() {
                    let w = _mm256_cvtepi8_epi16(_mm_loadu_si128(q.add(r * k + p).cast::<__m128i>()));
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(w, x));
                }
            }
            p += 16;
        }
        for (r, (sum, acc)) in sums.iter_mut().zip(acc).enumerate() {
            let mut lanes = [0i32; 8];
            // SAFETY: `lanes` holds eight i32.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast::<__m256i>(), acc) };
            let tail: i64 = block
                .get(r * k + full..r * k + p1)
                .unwrap_or(&[])
                .iter()
                .zip(codes.get(full..p1).unwrap_or(&[]))
                .map(|(&w, &c)| i64::from(w) * i64::from(c))
                .sum();
            *sum += lanes.iter().map(|&l| i64::from(l)).sum::<i64>() + tail;
        }
        p0 = p1;
    }
    sums
}

/// `acc[l] += x[l] * q[l]` for sixteen lanes of codes (none: nothing added).
#[inline(always)]
fn step16(acc: &mut [f32; 16], x: &[f32; 16], q: Option<&[i8]>) {
    let Some(q) = q.and_then(|q| <&[i8; 16]>::try_from(q).ok()) else {
        return;
    };
    let qf: [f32; 16] = std::array::from_fn(|l| f32::from(q[l]));
    for l in 0..16 {
        acc[l] += x[l] * qf[l];
    }
}

/// The sum of sixteen partial sums, pairwise (lane `l` with `l + 8`, then `+ 4`, ...).
#[inline(always)]
pub fn reduce16(mut acc: [f32; 16]) -> f32 {
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

/// The largest element of `v` (NaNs skipped; -inf for an empty or all-NaN slice), compiled
/// for the active level (16 lanes with AVX-512).
pub fn max(v: &[f32]) -> f32 {
    crate::simd::vectorize_kernel(Max(v))
}

/// [`max`]'s loop, always inlined into its vectorised caller.
struct Max<'a>(&'a [f32]);

impl crate::simd::Kernel for Max<'_> {
    type Output = f32;
    #[inline(always)]
    fn run(self) -> f32 {
        max_lanes(self.0)
    }
}

#[inline(always)]
fn max_lanes(v: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; W];
    let mut chunks = v.chunks_exact(W);
    for c in &mut chunks {
        for (a, &x) in m.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    for (a, &x) in m.iter_mut().zip(chunks.remainder()) {
        *a = if x > *a { x } else { *a };
    }
    tree_max(m)
}

/// The largest (`largest`) or smallest element of `v` with NaNs skipped (-inf / +inf for an
/// empty or all-NaN slice), and whether `v` holds a NaN; compiled for the active level.
pub fn extreme(v: &[f32], largest: bool) -> (f32, bool) {
    if largest {
        crate::simd::vectorize_kernel(Extreme::<true>(v))
    } else {
        crate::simd::vectorize_kernel(Extreme::<false>(v))
    }
}

/// [`extreme`]'s loop, always inlined into its vectorised caller.
struct Extreme<'a, const MAX: bool>(&'a [f32]);

impl<const MAX: bool> crate::simd::Kernel for Extreme<'_, MAX> {
    type Output = (f32, bool);
    #[inline(always)]
    fn run(self) -> (f32, bool) {
        let start = if MAX { f32::NEG_INFINITY } else { f32::INFINITY };
        let better = |x: f32, a: f32| if MAX { x > a } else { x < a };
        let mut m = [start; W];
        let mut nan = [false; W];
        let mut chunks = self.0.chunks_exact(W);
        for c in &mut chunks {
            for ((a, n), &x) in m.iter_mut().zip(nan.iter_mut()).zip(c) {
                *a = if better(x, *a) { x } else { *a };
                *n |= x.is_nan();
            }
        }
        for ((a, n), &x) in m.iter_mut().zip(nan.iter_mut()).zip(chunks.remainder()) {
            *a = if better(x, *a) { x } else { *a };
            *n |= x.is_nan();
        }
        let best = tree(m, |a, x| if better(x, a) { x } else { a }).unwrap_or(start);
        (best, nan.iter().any(|&n| n))
    }
}

/// The sum of `v` in f64 (16 partial sums, then added pairwise), compiled for the active
/// level (the same sums at every level: the lanes are explicit).
pub fn sum_f64(v: &[f32]) -> f64 {
    crate::simd::vectorize_kernel(SumF64(v))
}

/// PRelu over channels-last values: `v < 0 ? v * slopes[c] : v` for each element of channel
/// `c` (`slopes.len()` channels a pixel; a partial last pixel is left as it is). NaN and -0
/// are kept (the standalone op's f32 multiply).
pub fn prelu_channels(v: &mut [f32], slopes: &[f32]) {
    if slopes.is_empty() {
        return;
    }
    crate::simd::vectorize(|| {
        for px in v.chunks_exact_mut(slopes.len()) {
            for (x, &s) in px.iter_mut().zip(slopes) {
                *x = if *x < 0.0 { *x * s } else { *x };
            }
        }
    });
}

/// PRelu with one slope for all of `v` (a channel's plane, a row of C).
pub fn prelu_one(v: &mut [f32], slope: f32) {
    crate::simd::vectorize(|| {
        for x in v.iter_mut() {
            *x = if *x < 0.0 { *x * slope } else { *x };
        }
    });
}

/// [`sum_f64`] of each `cols`-long row of `x`, times `scale`, rounded into `out` (one per
/// row; `out.len()` rows, `x` at least `out.len() * cols` long, else the rows `x` lacks are
/// left as they are): the same sums, with one dispatch for all the rows rather than one a
/// row (rows of a few values, a reduction over a short last axis, had spent most of their
/// time in the call).
pub fn sum_rows_f64(x: &[f32], cols: usize, scale: f64, out: &mut [f32]) {
    crate::simd::vectorize_kernel(SumRows { x, cols, scale, out })
}

/// [`sum_rows_f64`]'s loop.
struct SumRows<'a> {
    x: &'a [f32],
    cols: usize,
    scale: f64,
    out: &'a mut [f32],
}

impl crate::simd::Kernel for SumRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        if self.cols == 0 {
            return;
        }
        for (o, row) in self.out.iter_mut().zip(self.x.chunks_exact(self.cols)) {
            *o = (SumF64(row).run() * self.scale) as f32;
        }
    }
}

/// [`sum_f64`]'s loop.
struct SumF64<'a>(&'a [f32]);

impl crate::simd::Kernel for SumF64<'_> {
    type Output = f64;
    #[inline(always)]
    fn run(self) -> f64 {
        let mut s = [0.0f64; W];
        let mut chunks = self.0.chunks_exact(W);
        for c in &mut chunks {
            for (a, &x) in s.iter_mut().zip(c) {
                *a += f64::from(x);
            }
        }
        for (a, &x) in s.iter_mut().zip(chunks.remainder()) {
            *a += f64::from(x);
        }
        tree_sum(s)
    }
}

/// `sum (v[i] - mean)^2` in f64 (16 partial sums, added pairwise): [`layer_norm_row`]'s
/// second pass, inlined into its caller's vectorised function.
struct SqDevSumF64<'a>(&'a [f32], f64);

impl crate::simd::Kernel for SqDevSumF64<'_> {
    type Output = f64;
    #[inline(always)]
    fn run(self) -> f64 {
        let SqDevSumF64(v, mean) = self;
        let mut s = [0.0f64; W];
        let mut chunks = v.chunks_exact(W);
        for c in &mut chunks {
            for (a, &x) in s.iter_mut().zip(c) {
                let d = f64::from(x) - mean;
                *a += d * d;
            }
        }
        for (a, &x) in s.iter_mut().zip(chunks.remainder()) {
            let d = f64::from(x) - mean;
            *a += d * d;
        }
        tree_sum(s)
    }
}

/// `row[i] = e^(row[i] - shift)`; returns the sum of the results.
pub fn exp_shift_sum(row: &mut [f32], shift: f32) -> f32 {
    exp_shift_sum_with(isa::active(), row, shift)
}

/// [`exp_shift_sum`] on a given level (a level this CPU lacks runs the portable code).
pub fn exp_shift_sum_with(isa: Isa, row: &mut [f32], shift: f32) -> f32 {
    exp_scale_shift_sum_with(isa, row, 1.0, shift)
}

/// `row[i] = e^(scale row[i] - shift)` on a given level (the SIMD levels round
/// `scale row[i] - shift` once, the portable one twice; with `scale` 1 both are exact
/// subtractions); returns the sum of the results.
fn exp_scale_shift_sum_with(isa: Isa, row: &mut [f32], scale: f32, shift: f32) -> f32 {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    #[cfg(target_arch = "x86_64")]
    {
        use crate::sgemm::x86::{avx2, avx512};
        match isa {
            Isa::Avx512 => return avx512::exp_shift_sum(row, scale, shift),
            Isa::Avx2Fma => return avx2::exp_shift_sum(row, scale, shift),
            Isa::Portable => {}
        }
    }
    let _ = isa;
    let mut s = [0.0f32; W];
    let mut chunks = row.chunks_exact_mut(W);
    for c in &mut chunks {
        for (a, x) in s.iter_mut().zip(c) {
            *x = (*x * scale - shift).exp();
            *a += *x;
        }
    }
    for (a, x) in s.iter_mut().zip(chunks.into_remainder()) {
        *x = (*x * scale - shift).exp();
        *a += *x;
    }
    tree_sum(s)
}

/// The softmax of a row of attention scores, left unnormalised: `row[i] = e^(z[i] - max z)`
/// with `z = scale row + mask` (`mask`, when given, of the row's length; elements past a
/// shorter one get none), and returns `1 / sum`, the factor by which the caller scales what
/// it computes from the row (`P V`: `dv` values per row instead of the row's length). Two
/// passes over the row where [`softmax_row`] after a scaling pass makes four: without a
/// mask and with `scale > 0` the maximum is taken over the raw scores and the scale goes into
/// the exponential's argument (one rounding); with a mask, scaling, masking and the maximum
/// are one pass. A row masked everywhere (maximum -inf) becomes zeros and returns 0, as the
/// reference attention gives zeros; an infinite maximum otherwise shifts by 0 (as
/// [`softmax_row`]), so an unmasked all -inf row gives `1 / 0`.
pub fn softmax_unnormalized_row(row: &mut [f32], scale: f32, mask: Option<&[f32]>) -> f32 {
    softmax_unnormalized_row_with(isa::active(), row, scale, mask)
}

/// [`softmax_unnormalized_row`] on a given level.
pub fn softmax_unnormalized_row_with(isa: Isa, row: &mut [f32], scale: f32, mask: Option<&[f32]>) -> f32 {
    let finite = |m: f32| if m.is_finite() { m } else { 0.0 };
    match mask {
        Some(add) => {
            let m = crate::simd::vectorize_kernel(ScaleAddMax { row, scale, add });
            if m == f32::NEG_INFINITY {
                row.fill(0.0);
                return 0.0;
            }
            1.0 / exp_scale_shift_sum_with(isa, row, 1.0, finite(m))
        }
        None if scale > 0.0 && scale.is_finite() => {
            // Rounding is monotonic, so the largest scaled score is the largest score scaled.
            let shift = finite(max(row) * scale);
            1.0 / exp_scale_shift_sum_with(isa, row, scale, shift)
        }
        None => {
            crate::simd::vectorize(|| row.iter_mut().for_each(|x| *x *= scale));
            let shift = finite(max(row));
            1.0 / exp_scale_shift_sum_with(isa, row, 1.0, shift)
        }
    }
}

/// [`softmax_unnormalized_row`]'s masked pass: `row = row * scale + add`, returning the
/// maximum (NaNs skipped, as [`max`]).
struct ScaleAddMax<'a> {
    row: &'a mut [f32],
    scale: f32,
    add: &'a [f32],
}

impl crate::simd::Kernel for ScaleAddMax<'_> {
    type Output = f32;
    #[inline(always)]
    fn run(self) -> f32 {
        let k = self.scale;
        let mut m = [f32::NEG_INFINITY; W];
        let n = self.row.len().min(self.add.len());
        let (head, tail) = self.row.split_at_mut(n);
        let mut rows = head.chunks_exact_mut(W);
        let mut adds = self.add.chunks_exact(W);
        for (r, a) in (&mut rows).zip(&mut adds) {
            // Whole lanes copied in and out: the compiler cannot tell that the row and the mask
            // do not overlap, and element by element it kept this loop scalar.
            let (Ok(r), Ok(a)) = (<&mut [f32; W]>::try_from(r), <&[f32; W]>::try_from(a)) else {
                continue;
            };
            let (mut v, a) = (*r, *a);
            for ((x, &b), mx) in v.iter_mut().zip(&a).zip(m.iter_mut()) {
                *x = *x * k + b;
                *mx = if *x > *mx { *x } else { *mx };
            }
            *r = v;
        }
        for ((x, &b), mx) in rows.into_remainder().iter_mut().zip(adds.remainder()).zip(m.iter_mut()) {
            *x = *x * k + b;
            *mx = if *x > *mx { *x } else { *mx };
        }
        let mut tm = f32::NEG_INFINITY;
        for x in tail.iter_mut() {
            *x *= k;
            tm = if *x > tm { *x } else { tm };
        }
        let lanes = tree_max(m);
        if tm > lanes { tm } else { lanes }
    }
}

/// Softmax of one contiguous row in place: `e^(x - max) / sum`. A row whose maximum is
/// infinite is shifted by 0 (as the reference op), so +inf gives NaN and an all -inf row NaN.
pub fn softmax_row(row: &mut [f32]) {
    softmax_row_with(isa::active(), row);
}

/// [`softmax_row`] on a given level.
pub fn softmax_row_with(isa: Isa, row: &mut [f32]) {
    let m = max(row);
    let shift = if m.is_finite() { m } else { 0.0 };
    let sum = exp_shift_sum_with(isa, row, shift);
    let inv = 1.0 / sum;
    crate::simd::vectorize(|| row.iter_mut().for_each(|x| *x *= inv));
}

/// LogSoftmax of one contiguous row in place: `x - max - ln(sum e^(x - max))`.
pub fn log_softmax_row_with(isa: Isa, row: &mut [f32], scratch: &mut Vec<f32>) {
    let m = max(row);
    let shift = if m.is_finite() { m } else { 0.0 };
    scratch.clear();
    scratch.extend_from_slice(row);
    let lse = shift + exp_shift_sum_with(isa, scratch, shift).ln();
    row.iter_mut().for_each(|x| *x -= lse);
}

/// Layer normalisation of one contiguous row: `y = (x - mean) / sqrt(var + eps) * scale
/// (+ bias)`, statistics in f64 (two passes, population variance). `scale` and `bias`
/// have the row's length (shorter ones shorten the output). Returns `(mean, 1/sqrt(var+eps))`.
pub fn layer_norm_row(x: &[f32], y: &mut [f32], scale: &[f32], bias: Option<&[f32]>, eps: f64) -> (f64, f64) {
    crate::simd::vectorize_kernel(LayerNormRow { x, y, scale, bias, eps })
}

/// [`layer_norm_row`] whole, statistics and output, in one function compiled for the active
/// level: three calls through the dispatch per row (and the divisions between them) had
/// cost as much as the passes on a 192-feature row.
struct LayerNormRow<'a> {
    x: &'a [f32],
    y: &'a mut [f32],
    scale: &'a [f32],
    bias: Option<&'a [f32]>,
    eps: f64,
}

impl crate::simd::Kernel for LayerNormRow<'_> {
    type Output = (f64, f64);
    #[inline(always)]
    fn run(self) -> (f64, f64) {
        let LayerNormRow { x, y, scale, bias, eps } = self;
        let n = x.len().max(1) as f64;
        let mean = SumF64(x).run() / n;
        let var = SqDevSumF64(x, mean).run() / n;
        let inv = 1.0 / (var + eps).sqrt();
        let (m, k) = (mean as f32, inv as f32);
        match bias {
            Some(b) => {
                for (((o, &v), &s), &c) in y.iter_mut().zip(x).zip(scale).zip(b) {
                    *o = (v - m) * k * s + c;
                }
            }
            None => {
                for ((o, &v), &s) in y.iter_mut().zip(x).zip(scale) {
                    *o = (v - m) * k * s;
                }
            }
        }
        (mean, inv)
    }
}
