//! The inner kernel of channels-last depthwise convolution: one output pixel's channels,
//! `out[ch] = bias[ch] + sum over taps t of x[base + xo_t + ch] * w[wo_t + ch]`, where the
//! window lists `(xo_t, wo_t)`: the offsets of the input pixel and of the tap's weights (both
//! rows of `C` contiguous channels).
//!
//! All offsets are checked once per call; the AVX-512 and AVX2 paths (one source, written
//! over the vector type: [`depthwise_kernels`]) then run without per-tap bounds checks, in
//! 16- or 8-channel blocks (fused multiply-adds, masked tail). A window made of rows of
//! three, five or seven taps (adjacent; three or five two columns apart: dilation 2) with
//! pixels one or two columns apart (3x3, 5x5 and 7x7 interiors and their top and bottom
//! edges, down to a single kernel row: images one or two rows high) runs 8 pixels at a time
//! with a row's weights in registers, each input column loaded once for every pixel that
//! uses it: 3x3 stride 1 needs 30 loads per 72 multiply-adds instead of 81 (MobileNet-v2's
//! 112x112x32 depthwise layer 0.19 -> 0.13 ms); 5x5 over 33x49x960 took 2.6-2.7 ms 4 pixels
//! at a time, 2.2 this way (dilation 2: 3.0-3.1 -> 2.5), 7x7 over 184x368x96 28.0 pixel by
//! pixel, 12.8 this way (Zen 3). The last pixels of a run (fewer than 8) are one more group
//! of 8 overlapping pixels already written (the same sums again). Other windows of 4, 6, 8,
//! 9, 10, 12, 15, 16, 20 or 25 taps (3x3, 4x4 and 5x5 windows and their edges) run 4 pixels
//! at a time sharing each weight load, any other window pixel by pixel. The portable path is
//! the scalar twin (multiply, then add) it is tested against; the two differ by the FMA's
//! single rounding only.

use crate::isa::{self, Isa};

/// Bounds applied to each output after the sums, `min(max(v, lo), hi)` with NaN kept: ReLU is
/// `lo = 0`, Clip its bounds, none `(-inf, inf)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clamp {
    pub lo: f32,
    pub hi: f32,
}

impl Clamp {
    pub const NONE: Clamp = Clamp {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
    };

    /// `v` within the bounds (`hi` wins when `lo > hi`); NaN stays NaN.
    pub fn apply(self, v: f32) -> f32 {
        if v.is_nan() { v } else { v.max(self.lo).min(self.hi) }
    }
}

/// One call's operands: `count = out.len() / c` pixels of `c` channels each (see the module
/// docs), pixel `p` read at input offset `base + p * step` through the `window` of (input,
/// tap) offsets, then `clamp`ed.
#[derive(Debug, Clone, Copy)]
pub struct Pixels<'a> {
    pub x: &'a [f32],
    /// The taps, `[kh * kw, c]`.
    pub w: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub window: &'a [(usize, usize)],
    pub base: usize,
    pub step: usize,
    pub c: usize,
    pub clamp: Clamp,
}

impl Pixels<'_> {
    /// `out = clamp(bias + window sums)`, pixel `p` written to `out[p*c ..]`. Returns
    /// `false`, writing nothing, when an offset or the bias does not fit.
    pub fn run(&self, out: &mut [f32]) -> bool {
        self.run_with(isa::active(), out)
    }

    /// [`Pixels::run`] on a given level (tests compare the levels).
    pub fn run_with(&self, isa: Isa, out: &mut [f32]) -> bool {
        let &Pixels {
            x,
            w,
            bias,
            window,
            base,
            step,
            c,
            clamp,
        } = self;
        if c == 0 || !out.len().is_multiple_of(c) {
            return out.is_empty();
        }
        let count = out.len() / c;
        if bias.is_some_and(|b| b.len() != c) || !window_fits(window, (base, step, count, c), (x.len(), w.len())) {
            return false;
        }
        // SAFETY (both levels): the level's features are present (checked just above), and
        // every offset was checked for the last (largest) pixel: `base + p*step + xo + c <=
        // x.len()` for `p < count`, `wo + c <= w.len()`, `bias.len() == c`, `out.len() ==
        // count * c`.
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 && isa.is_supported() {
            unsafe { avx512::pixels(self, out) };
            return true;
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2Fma && isa.is_supported() {
            // SAFETY: as for the AVX-512 call above.
            unsafe { avx2::pixels(self, out) };
            return true;
        }
        let _ = isa;
        for (p, o) in out.chunks_exact_mut(c).enumerate() {
            match bias {
                Some(b) => o.copy_from_slice(b),
                None => o.fill(0.0),
            }
            let at = base + p * step;
            for &(xo, wo) in window {
                let (Some(xs), Some(ws)) = (x.get(at + xo..at + xo + c), w.get(wo..wo + c)) else {
                    continue;
                };
                for ((o, &a), &b) in o.iter_mut().zip(xs).zip(ws) {
                    *o += a * b;
                }
            }
            for v in o.iter_mut() {
                *v = clamp.apply(*v);
            }
        }
        true
    }
}

/// Whether `count` pixels of `c` channels, pixel `p` at input offset `base + p * step`, read
/// through `window`'s (input, tap) offsets, stay inside an input of `x_len` values and taps
/// of `w_len` (the last pixel's reads are the furthest).
pub(crate) fn window_fits(
    window: &[(usize, usize)],
    (base, step, count, c): (usize, usize, usize, usize),
    (x_len, w_len): (usize, usize),
) -> bool {
    let last = (count.max(1) - 1).checked_mul(step).and_then(|v| v.checked_add(base));
    let fits = |o: Option<usize>, len: usize| o.and_then(|o| o.checked_add(c)).is_some_and(|e| e <= len);
    window
        .iter()
        .all(|&(xo, wo)| fits(last.and_then(|l| l.checked_add(xo)), x_len) && fits(Some(wo), w_len))
}

/// The x86 kernels, written once over a vector type: the invoking module (one per level)
/// defines `V` (a vector of `LANES` floats), `Mask` (which of its lanes a masked access
/// touches), and the register operations `zero`, `splat`, `fmadd`, `vmin`, `vmax`, `load`,
/// `store`, `load_masked` (masked-off lanes read as 0 and never touched), `store_masked`,
/// `full` and `mask(n)` (the first `min(n, LANES)` lanes), each `#[inline(always)]`; `$feat`
/// is the level's target features, which the entry point [`pixels`] is compiled for.
#[cfg(target_arch = "x86_64")]
macro_rules! depthwise_kernels {
    ($feat:literal) => {
        /// Pixels computed together in the unrolled path: independent accumulator chains sharing
        /// each weight load.
        const P: usize = 4;

        /// One call's operands: the slices' pointers, the channel count, the input offset between
        /// pixels and the bounds.
        #[derive(Clone, Copy)]
        struct Io {
            x: *const f32,
            w: *const f32,
            bias: Option<*const f32>,
            out: *mut f32,
            c: usize,
            step: usize,
            lo: V,
            hi: V,
        }

        /// # Safety
        /// the CPU has the level's features; `out.len()` is a multiple of `c > 0`, `count = out.len() / c`;
        /// for every `(xo, wo)` in `window` and `p < count`, `base + p * step + xo + c <=
        /// x.len()` and `wo + c <= w.len()`; a bias has `c` floats.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn pixels(call: &Pixels<'_>, out: &mut [f32]) {
            let (c, step, base, window) = (call.c, call.step, call.base, call.window);
            let count = out.len() / c;
            let io = Io {
                x: call.x.as_ptr(),
                w: call.w.as_ptr(),
                bias: call.bias.map(<[f32]>::as_ptr),
                out: out.as_mut_ptr(),
                c,
                step,
                // SAFETY: this function is compiled for the level's features (the contract).
                lo: unsafe { splat(call.clamp.lo) },
                // SAFETY: as above.
                hi: unsafe { splat(call.clamp.hi) },
            };
            // SAFETY: the caller's contract, passed on.
            unsafe {
                //             // Rows of three adjacent taps (3x3 interiors and their top and bottom edges) one or
                // two pixels apart: each input column is loaded once for the pixels that use it.
                if try_rows::<3, 3, 1>(io, window, base, count)
                    || try_rows::<3, 2, 1>(io, window, base, count)
                    || try_rows::<3, 1, 1>(io, window, base, count)
                    || try_rows::<5, 5, 1>(io, window, base, count)
                    || try_rows::<5, 4, 1>(io, window, base, count)
                    || try_rows::<5, 3, 1>(io, window, base, count)
                    || try_rows::<5, 2, 1>(io, window, base, count)
                    || try_rows::<5, 1, 1>(io, window, base, count)
                    || try_rows::<7, 7, 1>(io, window, base, count)
                    || try_rows::<7, 6, 1>(io, window, base, count)
                    || try_rows::<7, 5, 1>(io, window, base, count)
                    || try_rows::<7, 4, 1>(io, window, base, count)
                    || try_rows::<7, 3, 1>(io, window, base, count)
                    || try_rows::<7, 2, 1>(io, window, base, count)
                    || try_rows::<7, 1, 1>(io, window, base, count)
                    || try_rows::<3, 3, 2>(io, window, base, count)
                    || try_rows::<5, 5, 2>(io, window, base, count)
                    || try_unrolled::<9>(io, window, base, count)
                    || try_unrolled::<6>(io, window, base, count)
                    || try_unrolled::<4>(io, window, base, count)
                    || try_unrolled::<25>(io, window, base, count)
                    || try_unrolled::<20>(io, window, base, count)
                    || try_unrolled::<16>(io, window, base, count)
                    || try_unrolled::<15>(io, window, base, count)
                    || try_unrolled::<12>(io, window, base, count)
                    || try_unrolled::<10>(io, window, base, count)
                    || try_unrolled::<8>(io, window, base, count)
                {
                    return;
                }
                for p in 0..count {
                    pixel(io, window, base + p * step, p * c);
                }
            }
        }

        /// [`rows`] when `window` is `R` rows of `K` taps `D` input columns apart and pixels are
        /// one or two columns apart; `false`, doing nothing, otherwise.
        ///
        /// # Safety
        /// As for [`pixels`].
        #[inline(always)]
        unsafe fn try_rows<const K: usize, const R: usize, const D: usize>(
            io: Io,
            window: &[(usize, usize)],
            base: usize,
            count: usize,
        ) -> bool {
            let Some(first) = rows_of::<K, R, D>(window, io.c) else {
                return false;
            };
            // SAFETY: the caller's contract, with `io.step` checked against `S * c`.
            unsafe {
                if io.step == io.c {
                    rows::<K, R, 1, D>(io, &first, window, base, count);
                    return true;
                }
                if io.step == 2 * io.c && D == 1 {
                    rows::<K, R, 2, D>(io, &first, window, base, count);
                    return true;
                }
            }
            false
        }

        /// [`unrolled`] when `window` has `T` taps; `false`, doing nothing, otherwise.
        ///
        /// # Safety
        /// As for [`pixels`].
        #[inline(always)]
        unsafe fn try_unrolled<const T: usize>(io: Io, window: &[(usize, usize)], base: usize, count: usize) -> bool {
            let Ok(win) = <&[(usize, usize); T]>::try_from(window) else {
                return false;
            };
            // SAFETY: the caller's contract.
            unsafe { unrolled(io, win, base, count) };
            true
        }

        /// `min(hi, max(lo, v))`: with the bound first, a NaN `v` comes through as it is.
        ///
        /// # Safety
        /// the CPU has the level's features.
        #[inline(always)]
        unsafe fn bound(v: V, io: Io) -> V {
            // SAFETY: register-only instructions of the level, present by the contract.
            unsafe { vmin(io.hi, vmax(io.lo, v)) }
        }

        /// A window of `T` taps, `P` pixels at a time (independent FMA chains): for each
        /// `LANES`-channel block, the `T` tap weights are loaded once for the group's `P` pixels. The
        /// group's input stays in L1 across its blocks.
        ///
        /// # Safety
        /// As for [`pixels`].
        #[inline(always)]
        unsafe fn unrolled<const T: usize>(io: Io, window: &[(usize, usize); T], base: usize, count: usize) {
            // SAFETY: every block's channels are below `c` and its pixels below `count`: within
            // the slices by the caller's contract.
            unsafe {
                let mut p = 0;
                while p < count {
                    let group = (count - p).min(P);
                    let (at, o) = (base + p * io.step, p * io.c);
                    let mut c0 = 0;
                    // Whole `LANES`-channel blocks with plain loads and stores, then a masked tail.
                    while c0 + LANES <= io.c {
                        block::<T, false>(io, window, at, o, group, c0, full());
                        c0 += LANES;
                    }
                    if c0 < io.c {
                        block::<T, true>(io, window, at, o, group, c0, mask(io.c - c0));
                    }
                    p += group;
                }
            }
        }

        /// `window` as `R` kernel rows of `K` taps `D` input columns apart, `(xo, wo)` of each
        /// row's first tap, when that is its shape: taps `K r + k` at `(xo_r + k D c, wo_r + k c)`.
        fn rows_of<const K: usize, const R: usize, const D: usize>(
            window: &[(usize, usize)],
            c: usize,
        ) -> Option<[(usize, usize); R]> {
            if window.len() != K * R {
                return None;
            }
            let mut rows = [(0, 0); R];
            for (row, taps) in rows.iter_mut().zip(window.chunks_exact(K)) {
                let &(x0, w0) = taps.first()?;
                let spaced = taps.iter().enumerate().all(|(k, &(x, w))| {
                    k.checked_mul(D * c).and_then(|d| x0.checked_add(d)) == Some(x)
                        && k.checked_mul(c).and_then(|d| w0.checked_add(d)) == Some(w)
                });
                if !spaced {
                    return None;
                }
                *row = (x0, w0);
            }
            Some(rows)
        }

        /// Output pixels computed together by [`rows`].
        const G: usize = 8;

        /// A window of `R` rows of `K` taps `D` input columns apart, pixels `S` input columns
        /// apart: `G` pixels at a time, per `LANES`-channel block, with a row's `K` tap weights
        /// in registers and each of the `(G-1)S + (K-1)D + 1` input columns of a row loaded
        /// once and used by every pixel whose window covers it. Each pixel's taps are summed in
        /// window order, as [`pixel`] does. The pixels left over (fewer than `G`) go through
        /// [`pixel`].
        ///
        /// # Safety
        /// As for [`pixels`], with `window` the flattened `rows` and `io.step == S * io.c`.
        #[inline(always)]
        unsafe fn rows<const K: usize, const R: usize, const S: usize, const D: usize>(
            io: Io,
            first: &[(usize, usize); R],
            window: &[(usize, usize)],
            base: usize,
            count: usize,
        ) {
            // SAFETY: pixel `q` of a group at `p` reads tap `(r, k)` at `base + (p+q)*step +
            // xo_r + k*D*c` and the weights at `wo_r + k*c`: the window's own offsets, in range
            // for every pixel below `count` by the caller's contract, as are the blocks' channels.
            unsafe {
                let c = io.c;
                let mut p = 0;
                while p + G <= count {
                    group_blocks::<K, R, S, D>(io, first, base, p);
                    p += G;
                }
                if p < count && count >= G {
                    // The last `G` pixels as one more group, overlapping pixels already written:
                    // they get the same values again (the sums run in the same order), and
                    // the tail runs at the group's speed instead of pixel by pixel.
                    group_blocks::<K, R, S, D>(io, first, base, count - G);
                    p = count;
                }
                for q in p..count {
                    pixel(io, window, base + q * io.step, q * c);
                }
            }
        }

        /// Every channel block of the `G` pixels of [`rows`] from pixel `p`.
        ///
        /// # Safety
        /// As for [`rows`], with `p + G <= count`.
        #[inline(always)]
        unsafe fn group_blocks<const K: usize, const R: usize, const S: usize, const D: usize>(
            io: Io,
            first: &[(usize, usize); R],
            base: usize,
            p: usize,
        ) {
            let c = io.c;
            let (at, o) = (base + p * io.step, p * c);
            let mut c0 = 0;
            // SAFETY: the caller's contract; the blocks' channels are below `c`.
            unsafe {
                while c0 + LANES <= c {
                    group::<K, R, S, D, false>(io, first, at, o, c0, full());
                    c0 += LANES;
                }
                if c0 < c {
                    group::<K, R, S, D, true>(io, first, at, o, c0, mask(c - c0));
                }
            }
        }

        /// One `LANES`-channel block (lanes `m`, from channel `c0`) of `G` pixels of [`rows`]:
        /// pixel `q` reads the input at `at + q * step` and writes the output at `o + q * c`.
        ///
        /// # Safety
        /// As for [`rows`]; without `MASKED`, all `LANES` lanes are in range.
        #[inline(always)]
        unsafe fn group<const K: usize, const R: usize, const S: usize, const D: usize, const MASKED: bool>(
            io: Io,
            first: &[(usize, usize); R],
            at: usize,
            o: usize,
            c0: usize,
            m: Mask,
        ) {
            let c = io.c;
            // SAFETY: lanes `m` of channels `c0 ..` are in range for every pointer (the contract).
            unsafe {
                let bv = match io.bias {
                    Some(b) => ld::<MASKED>(m, b.add(c0)),
                    None => zero(),
                };
                let mut acc = [bv; G];
                for &(xo, wo) in first {
                    let ws = io.w.add(wo + c0);
                    let wv: [V; K] = std::array::from_fn(|k| ld::<MASKED>(m, ws.add(k * c)));
                    let xs = io.x.add(at + xo + c0);
                    // Tap `k` of pixel `q` is input column `q*S + k*D`. Fully unrolled, the
                    // loads of a column shared by several pixels are one load (no store comes
                    // between).
                    for (q, a) in acc.iter_mut().enumerate() {
                        for (k, &w) in wv.iter().enumerate() {
                            *a = fmadd(ld::<MASKED>(m, xs.add((q * S + k * D) * c)), w, *a);
                        }
                    }
                }
                let out = io.out.add(o + c0);
                for (q, a) in acc.iter().enumerate() {
                    st::<MASKED>(m, out.add(q * c), bound(*a, io));
                }
            }
        }

        /// Lanes `m` at `p` (all `LANES` without `MASKED`).
        ///
        /// # Safety
        /// the CPU has the level's features; those lanes are readable.
        #[inline(always)]
        unsafe fn ld<const MASKED: bool>(m: Mask, p: *const f32) -> V {
            // SAFETY: the contract.
            unsafe { if MASKED { load_masked(m, p) } else { load(p) } }
        }

        /// Stores lanes `m` of `v` at `p` (all `LANES` without `MASKED`).
        ///
        /// # Safety
        /// the CPU has the level's features; those lanes are writable.
        #[inline(always)]
        unsafe fn st<const MASKED: bool>(m: Mask, p: *mut f32, v: V) {
            // SAFETY: the contract.
            unsafe {
                if MASKED {
                    store_masked(p, m, v)
                } else {
                    store(p, v)
                }
            }
        }

        /// One `LANES`-channel block (lanes `m`, from channel `c0`) of `group <= P` pixels: pixel `q`
        /// reads the input at `at + q * step` and writes the output at `o + q * c`.
        ///
        /// # Safety
        /// As for [`unrolled`]; without `MASKED`, all `LANES` lanes are in range.
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn block<const T: usize, const MASKED: bool>(
            io: Io,
            window: &[(usize, usize); T],
            at: usize,
            o: usize,
            group: usize,
            c0: usize,
            m: Mask,
        ) {
            // Opaque to the optimiser: otherwise it hoists all `T x P` input addresses out of the
            // caller's loop over blocks and spills them, reloading one per multiply-add.
            let c0 = std::hint::black_box(c0);
            let (step, c) = (io.step, io.c);
            // SAFETY: lanes `m` of channels `c0 ..` are in range for every pointer (the contract).
            unsafe {
                let bv = match io.bias {
                    Some(b) => ld::<MASKED>(m, b.add(c0)),
                    None => zero(),
                };
                let out = io.out.add(o + c0);
                if group == P {
                    let mut acc = [bv; P];
                    for &(xo, wo) in window {
                        let wv = ld::<MASKED>(m, io.w.add(wo + c0));
                        let xs = io.x.add(at + xo + c0);
                        for (q, a) in acc.iter_mut().enumerate() {
                            *a = fmadd(ld::<MASKED>(m, xs.add(q * step)), wv, *a);
                        }
                    }
                    for (q, a) in acc.iter().enumerate() {
                        st::<MASKED>(m, out.add(q * c), bound(*a, io));
                    }
                } else {
                    for q in 0..group {
                        let mut a = bv;
                        for &(xo, wo) in window {
                            let xv = ld::<MASKED>(m, io.x.add(at + q * step + xo + c0));
                            a = fmadd(xv, ld::<MASKED>(m, io.w.add(wo + c0)), a);
                        }
                        st::<MASKED>(m, out.add(q * c), bound(a, io));
                    }
                }
            }
        }

        /// One pixel over any window, reading the input at `base` and writing the output at `o`:
        /// blocks of `4 * LANES` channels in four registers, then a masked tail.
        ///
        /// # Safety
        /// As for [`pixels`], for one of its pixels.
        #[inline(always)]
        unsafe fn pixel(io: Io, window: &[(usize, usize)], base: usize, o: usize) {
            let c = io.c;
            let mut c0 = 0;
            // SAFETY (for every load and store below): channels `c0 .. c0 + 4 * LANES` (or the masked
            // `c0 .. c`) are below `c`, so `base + xo + ch < x.len()`, `wo + ch < w.len()`,
            // `o + ch < out.len()` and `ch < c` for the bias, by the caller's contract.
            unsafe {
                let out = io.out.add(o);
                while c0 + 4 * LANES <= c {
                    let mut acc = match io.bias {
                        Some(b) => [0, 1, 2, 3].map(|k| load(b.add(c0 + k * LANES))),
                        None => [zero(); 4],
                    };
                    for &(xo, wo) in window {
                        let (xs, ws) = (io.x.add(base + xo + c0), io.w.add(wo + c0));
                        for (k, a) in acc.iter_mut().enumerate() {
                            *a = fmadd(load(xs.add(LANES * k)), load(ws.add(LANES * k)), *a);
                        }
                    }
                    for (k, a) in acc.iter().enumerate() {
                        store(out.add(c0 + LANES * k), bound(*a, io));
                    }
                    c0 += 4 * LANES;
                }
                while c0 < c {
                    let n = (c - c0).min(LANES);
                    let m = mask(n);
                    let mut acc = match io.bias {
                        Some(b) => load_masked(m, b.add(c0)),
                        None => zero(),
                    };
                    for &(xo, wo) in window {
                        let xv = load_masked(m, io.x.add(base + xo + c0));
                        let wv = load_masked(m, io.w.add(wo + c0));
                        acc = fmadd(xv, wv, acc);
                    }
                    store_masked(out.add(c0), m, bound(acc, io));
                    c0 += n;
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Pixels;
    use std::arch::x86_64::*;

    type V = __m512;
    type Mask = __mmask16;
    const LANES: usize = 16;

    // SAFETY (every function below): callers run with AVX-512 F present (the `pixels` entry
    // is compiled for it and reached only after detection), and pass pointers valid for the
    // lanes accessed.
    #[inline(always)]
    unsafe fn zero() -> V {
        // SAFETY: AVX-512 F present (the note above).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> V {
        // SAFETY: AVX-512 F present (the note above).
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: V, b: V, c: V) -> V {
        // SAFETY: AVX-512 F present (the note above).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn vmin(a: V, b: V) -> V {
        // SAFETY: AVX-512 F present (the note above).
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn vmax(a: V, b: V) -> V {
        // SAFETY: AVX-512 F present (the note above).
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        // SAFETY: AVX-512 F present (the note above); the caller passes a pointer valid for the lanes.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V) {
        // SAFETY: AVX-512 F present (the note above); the caller passes a pointer valid for the lanes.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_masked(m: Mask, p: *const f32) -> V {
        // SAFETY: AVX-512 F present (the note above); the caller passes a pointer valid for the lanes.
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }
    #[inline(always)]
    unsafe fn store_masked(p: *mut f32, m: Mask, v: V) {
        // SAFETY: AVX-512 F present (the note above); the caller passes a pointer valid for the lanes.
        unsafe { _mm512_mask_storeu_ps(p, m, v) }
    }
    #[inline(always)]
    fn full() -> Mask {
        0xFFFF
    }
    #[inline(always)]
    fn mask(n: usize) -> Mask {
        if n >= LANES { 0xFFFF } else { ((1u32 << n) - 1) as Mask }
    }

    depthwise_kernels!("avx512f");
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Pixels;
    use std::arch::x86_64::*;

    type V = __m256;
    /// A lane is touched when its 32 bits have the top bit set (`vmaskmovps`).
    type Mask = __m256i;
    const LANES: usize = 8;

    // SAFETY (every function below): callers run with AVX2 and FMA present (the `pixels`
    // entry is compiled for them and reached only after detection), and pass pointers valid
    // for the lanes accessed.
    #[inline(always)]
    unsafe fn zero() -> V {
        // SAFETY: AVX2 and FMA present (the note above).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> V {
        // SAFETY: AVX2 and FMA present (the note above).
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: V, b: V, c: V) -> V {
        // SAFETY: AVX2 and FMA present (the note above).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn vmin(a: V, b: V) -> V {
        // SAFETY: AVX2 and FMA present (the note above).
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn vmax(a: V, b: V) -> V {
        // SAFETY: AVX2 and FMA present (the note above).
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        // SAFETY: AVX2 and FMA present (the note above); the caller passes a pointer valid for the lanes.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V) {
        // SAFETY: AVX2 and FMA present (the note above); the caller passes a pointer valid for the lanes.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_masked(m: Mask, p: *const f32) -> V {
        // SAFETY: AVX2 and FMA present (the note above); the caller passes a pointer valid for the lanes.
        unsafe { _mm256_maskload_ps(p, m) }
    }
    #[inline(always)]
    unsafe fn store_masked(p: *mut f32, m: Mask, v: V) {
        // SAFETY: AVX2 and FMA present (the note above); the caller passes a pointer valid for the
        // lanes, and the mask is `mask(n)`'s, the first lanes (plain stores: see `store_first`).
        unsafe { crate::sgemm::x86::avx2::store_prefix(p, m, v) }
    }
    #[inline(always)]
    fn full() -> Mask {
        // SAFETY: AVX is present (the contract above); a register-only instruction.
        // SAFETY: AVX2 and FMA present (the note above).
        unsafe { _mm256_set1_epi32(-1) }
    }
    #[inline(always)]
    fn mask(n: usize) -> Mask {
        let n = n.min(LANES) as i32;
        // SAFETY: AVX2 is present (the contract above); register-only instructions. Lane `i`
        // is set when `i < n`.
        // SAFETY: AVX2 and FMA present (the note above).
        unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
    }

    depthwise_kernels!("avx2,fma");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_out_of_range_are_refused() {
        let (x, w) = (vec![1.0f32; 40], vec![2.0f32; 18]);
        for isa in Isa::ALL {
            // (window, base, step, channels, bias) on `out`, no bounds.
            let run = |window: &[(usize, usize)], base, step, c, bias: Option<&[f32]>, out: &mut [f32]| {
                let call = Pixels {
                    x: &x,
                    w: &w,
                    bias,
                    window,
                    base,
                    step,
                    c,
                    clamp: Clamp::NONE,
                };
                call.run_with(isa, out)
            };
            let mut out = vec![0.0f32; 8];
            assert!(run(&[(0, 0), (32, 10)], 0, 0, 8, None, &mut out));
            assert_eq!(out, vec![4.0; 8]);
            assert!(!run(&[(33, 0)], 0, 0, 8, None, &mut out));
            assert!(!run(&[(0, 11)], 0, 0, 8, None, &mut out));
            assert!(!run(&[(0, 0)], usize::MAX, 0, 8, None, &mut out));
            assert!(!run(&[(0, 0)], 0, 0, 8, Some(&[1.0; 7]), &mut out));
            // Two pixels of 4 channels, 30 floats apart: the second reads x[30..34] (ones).
            let mut two = vec![0.0f32; 8];
            assert!(run(&[(2, 0)], 0, 30, 4, None, &mut two));
            assert_eq!(two, vec![2.0; 8]);
            // A step that takes the last pixel past the end is refused.
            assert!(!run(&[(2, 0)], 0, 36, 4, None, &mut two));
        }
    }
}
