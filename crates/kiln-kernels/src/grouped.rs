//! The inner kernel of channels-last grouped convolution: a set of output pixels, each with
//! `m` channels in groups of `mg`; output `o` of group `g = o / mg` reads the `cg` input
//! channels `g * cg ..` of each tap's input pixel:
//! `out[p][o] = bias[o] + sum over taps t, ci < cg of x[base_p + xo_t + g * cg + ci] * w[wo_t + ci * m + o]`,
//! where pixel `p`'s window starts at input offset `base_p` and the window lists `(xo_t,
//! wo_t)`: the offset of the tap's input pixel (a row of `m / mg * cg` contiguous channels)
//! and of its weights, `[cg, m]` per tap (so W packed tap-major is `[kh * kw, cg, m]`,
//! [`pack_taps`]). Every pixel has the whole window: the caller pads the input.
//!
//! The AVX-512 path computes two blocks of 16 outputs (one where one is left) for 8 pixels at
//! a time, the accumulators in registers, each weight vector loaded once for the 8 pixels; the
//! pixels left over, 4 blocks at a time. How a block gets its inputs ([`Lanes`]):
//! - **broadcast** (every block lies inside one group: a group's outputs in blocks of 16 and
//!   a masked rest, so a 24-wide group is a block of 16 and one of 8): each input value is
//!   broadcast to the block's lanes (ResNeXt's and RegNet's 16-, 24- and 32-wide groups, and
//!   any shape the permute form does not take); a tile's two blocks of one group share each
//!   broadcast (10 loads to 16 FMAs, not 18);
//! - **permute** (`mg` divides 16 and `cg <= mg`: a block's `16 / mg` groups read at most 16
//!   contiguous input channels): each tap loads that vector once per pixel, and a permute
//!   per input channel of the group gives each lane its group's value (ResNeXt's 4- and
//!   8-wide groups, depthwise with a channel multiplier).
//!
//! The AVX2 path is the same with 8-output blocks: broadcast for `mg` a multiple of 8, a
//! group's blocks in sets that share each broadcast input (pairs of 6 pixels a tile, and a
//! triple of 3 pixels where a group leaves three blocks: 24-, 40- and 56-wide groups), an
//! 8-wide group's block alone 6 pixels a tile; permute (`vpermps`) for `mg` dividing 8, 4
//! pixels a tile (the loaded input vectors take registers too); the pixels left over from
//! whole tiles as one tile of their count.
//!
//! No FLOP is spent on other groups' zeros, and no im2col copy is made, where the GEMM of a
//! grouped convolution multiplies matrices of `mg` rows by a packed copy of the input per
//! group. The AVX2 path takes groups of 8k outputs and permutable ones; other shapes there,
//! and the portable level, take the scalar twin (compiled for the active level), which the
//! SIMD paths are tested against; the two differ by the FMA's single rounding only.

use crate::dwconv::Clamp;
use crate::isa::{self, Isa};

/// Pixels every block of outputs sweeps in turn before the next pixels on AVX-512 (a
/// multiple of its 8-pixel tiles): their inputs stay in cache from one block to the next.
const CHUNK: usize = 64;
/// [`CHUNK`] for the AVX2 path: a multiple of all its tiles (8 tiles of 6 pixels, 16 of 3,
/// 12 of 4).
const AVX2_CHUNK: usize = 48;

/// How the AVX-512 path forms the inputs of a block of 16 outputs (see the module docs);
/// `None` from [`lanes`] means the scalar twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lanes {
    Broadcast,
    Permute,
}

/// The vector form for groups of `cg` inputs and `mg` outputs: permuted where `mg` divides
/// 16 and a block's groups read at most 16 inputs, broadcast otherwise (a group's outputs in
/// blocks of 16 and a masked rest); `None` only for empty groups.
pub fn lanes(cg: usize, mg: usize) -> Option<Lanes> {
    if cg == 0 || mg == 0 {
        None
    } else if !mg.is_multiple_of(16) && 16 % mg == 0 && cg <= mg {
        Some(Lanes::Permute)
    } else {
        Some(Lanes::Broadcast)
    }
}

/// The AVX-512 path's blocks of outputs `o0..o1`, each `(first output, outputs <= 16)`:
/// broadcast blocks lie inside one group, permuted ones are 16 outputs of several groups.
fn blocks(lanes: Lanes, mg: usize, o0: usize, o1: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut o = o0;
    std::iter::from_fn(move || {
        if o >= o1 || mg == 0 {
            return None;
        }
        let end = match lanes {
            Lanes::Broadcast => ((o / mg + 1) * mg).min(o + 16).min(o1),
            Lanes::Permute => (o + 16).min(o1),
        };
        let block = (o, end - o);
        o = end;
        Some(block)
    })
}

/// W `[m, cg, kh, kw]` (row-major, ONNX's grouped layout) tap-major as this kernel reads it:
/// `[kh * kw, cg, m]`. `None` when `w` does not have that many values.
pub fn pack_taps(w: &[f32], m: usize, cg: usize, kh: usize, kw: usize) -> Option<Vec<f32>> {
    let taps = kh.checked_mul(kw)?;
    let n = taps.checked_mul(cg)?.checked_mul(m)?;
    if w.len() != n {
        return None;
    }
    let mut out = vec![0.0f32; n];
    for (o, filter) in w.chunks_exact((cg * taps).max(1)).enumerate() {
        for (ci, channel) in filter.chunks_exact(taps.max(1)).enumerate() {
            for (t, &v) in channel.iter().enumerate() {
                if let Some(d) = out.get_mut((t * cg + ci) * m + o) {
                    *d = v;
                }
            }
        }
    }
    Some(out)
}

/// One call's operands: `bases.len()` pixels of `m` outputs each (see the module docs), pixel
/// `p` read at input offset `bases[p]` through the `window` of (input, tap) offsets, then
/// `clamp`ed.
#[derive(Debug, Clone, Copy)]
pub struct Pixels<'a> {
    pub x: &'a [f32],
    /// The taps, `[kh * kw, cg, m]`.
    pub w: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub window: &'a [(usize, usize)],
    pub bases: &'a [usize],
    /// Where each pixel's outputs go: pixel `p` at `out[dsts[p] ..]`, or at `out[p * m ..]`
    /// when `None` (a caller splitting an image's pixels by the taps that read it writes each
    /// class's pixels in place).
    pub dsts: Option<&'a [usize]>,
    /// Input channels per group.
    pub cg: usize,
    /// Outputs per group.
    pub mg: usize,
    /// Outputs per pixel, a multiple of `mg`.
    pub m: usize,
    /// The outputs of each pixel this call computes, `[o0, o1)` with `o0` a multiple of 16
    /// (the others are left as they are): a caller walks the outputs in ranges whose weights
    /// stay in cache while it sweeps the pixels.
    pub outs: [usize; 2],
    pub clamp: Clamp,
}

impl Pixels<'_> {
    /// `out = clamp(bias + window sums)` for outputs `outs` of pixel `p`, written to
    /// `out[dst + o]` with `dst = dsts[p]` (or `p * m`, `out` then holding `bases.len() * m`
    /// floats). Returns `false`, writing nothing, when the groups do not divide `m`, `outs`
    /// is not a range of them starting at a multiple of 16, or a length, an offset or the
    /// bias does not fit.
    pub fn run(&self, out: &mut [f32]) -> bool {
        self.run_with(isa::active(), out)
    }

    /// [`Pixels::run`] on a given level (tests compare the levels).
    pub fn run_with(&self, isa: Isa, out: &mut [f32]) -> bool {
        let (x, w, bias, window, bases) = (self.x, self.w, self.bias, self.window, self.bases);
        let (cg, mg, m, [o0, o1]) = (self.cg, self.mg, self.m, self.outs);
        if m == 0 || mg == 0 || cg == 0 || !m.is_multiple_of(mg) {
            return false;
        }
        let outs_fit = match self.dsts {
            None => bases.len().checked_mul(m) == Some(out.len()),
            Some(d) => d.len() == bases.len() && d.iter().all(|&d| d.checked_add(m).is_some_and(|e| e <= out.len())),
        };
        if !outs_fit {
            return false;
        }
        if o0 > o1 || o1 > m || !o0.is_multiple_of(16) {
            return false;
        }
        // Input channels per pixel, and weights per tap.
        let (Some(cin), Some(per_tap)) = ((m / mg).checked_mul(cg), cg.checked_mul(m)) else {
            return false;
        };
        // The largest pixel offset: every pixel's reads lie below it plus the window.
        let last = bases.iter().max().copied();
        let fits = |o: Option<usize>, n: usize, len: usize| o.and_then(|o| o.checked_add(n)).is_some_and(|e| e <= len);
        if bias.is_some_and(|b| b.len() != m)
            || !window.iter().all(|&(xo, wo)| {
                fits(last.and_then(|l| l.checked_add(xo)), cin, x.len()) && fits(Some(wo), per_tap, w.len())
            })
        {
            return false;
        }
        if bases.is_empty() || o0 == o1 {
            return true;
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512
            && isa.is_supported()
            && let Some(lanes) = lanes(cg, mg)
        {
            // SAFETY: AVX-512 F is present (checked just above); `m = (m / mg) * mg`,
            // `outs` lies in `0..=m` from a multiple of 16, and every offset was checked for
            // the largest pixel offset: `bases[p] + xo + cin <= x.len()` for every pixel with
            // `cin = m / mg * cg`, `wo + cg*m <= w.len()`, `bias.len() == m`, every pixel's
            // output offset plus `m` at most `out.len()`.
            unsafe { avx512::pixels(self, lanes, out) };
            return true;
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2Fma && isa.is_supported() {
            // Eight lanes: groups of 8k outputs broadcast, groups dividing 8 that read at
            // most 8 inputs a block permute; others take the scalar twin.
            let l = if mg.is_multiple_of(8) {
                Some(Lanes::Broadcast)
            } else if 8 % mg == 0 && cg <= mg {
                Some(Lanes::Permute)
            } else {
                None
            };
            if let Some(l) = l {
                // SAFETY: AVX2 and FMA are present (checked just above); `l` is Broadcast
                // only for `mg` a multiple of 8 and Permute only for `mg` dividing 8 with
                // `cg <= mg`; the offsets as for AVX-512, with `outs` from a multiple of 16.
                unsafe { avx2::pixels(self, l, out) };
                return true;
            }
        }
        let _ = isa;
        crate::simd::vectorize_kernel(Scalar { call: self, out })
    }
}

/// The scalar twin as a kernel compiled for the active level (auto-vectorised along each
/// group's outputs).
struct Scalar<'a, 'b> {
    call: &'a Pixels<'b>,
    out: &'a mut [f32],
}

impl crate::simd::Kernel for Scalar<'_, '_> {
    type Output = bool;
    #[inline(always)]
    fn run(self) -> bool {
        let Pixels {
            x,
            w,
            bias,
            window,
            bases,
            dsts,
            cg,
            mg,
            m,
            outs: [o0, o1],
            clamp,
        } = *self.call;
        // Groups `g0 .. g1` hold the outputs (the range's ends rounded out to whole groups).
        let (g0, g1) = (o0 / mg, o1.div_ceil(mg));
        let mut acc = vec![0.0f32; (g1 - g0) * mg];
        for (p, &at) in bases.iter().enumerate() {
            let dst = dsts.map_or(p * m, |d| d.get(p).copied().unwrap_or(usize::MAX));
            let Some(o) = self.out.get_mut(dst..dst.saturating_add(m)) else {
                continue;
            };
            match bias.and_then(|b| b.get(g0 * mg..g1 * mg)) {
                Some(b) => acc.copy_from_slice(b),
                None => acc.fill(0.0),
            }
            for &(xo, wo) in window {
                for ci in 0..cg {
                    let Some(ws) = w.get(wo + ci * m + g0 * mg..wo + ci * m + g1 * mg) else {
                        continue;
                    };
                    for (g, (og, wg)) in acc.chunks_exact_mut(mg).zip(ws.chunks_exact(mg)).enumerate() {
                        let Some(&a) = x.get(at + xo + (g0 + g) * cg + ci) else {
                            continue;
                        };
                        for (o, &b) in og.iter_mut().zip(wg) {
                            *o += a * b;
                        }
                    }
                }
            }
            let skip = o0 - g0 * mg;
            for (d, &v) in o.iter_mut().take(o1).skip(o0).zip(acc.iter().skip(skip)) {
                *d = clamp.apply(v);
            }
        }
        true
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Lanes, Pixels};
    use std::arch::x86_64::*;

    /// Pixels computed together per block: independent accumulator chains sharing each
    /// weight load.
    const P: usize = 8;

    /// One block's operands: pointers at the block's first input channel, weight and
    /// output, and its masks.
    #[derive(Clone, Copy)]
    struct Block {
        /// X at the block's first input channel.
        x: *const f32,
        /// W at the block's first output.
        w: *const f32,
        out: *mut f32,
        bias: __m512,
        /// The block's outputs (at most 16).
        omask: __mmask16,
        /// The input lanes a permuted block loads.
        xmask: __mmask16,
    }

    /// The call's shape and bounds.
    #[derive(Clone, Copy)]
    struct Shape<'a> {
        m: usize,
        cg: usize,
        lanes: Lanes,
        /// Permute mode with groups of 4 inputs to 4 outputs.
        quads: bool,
        lo: __m512,
        hi: __m512,
        /// Each pixel's output offset (`None`: pixel `p` at `p * m`).
        dsts: Option<&'a [usize]>,
    }

    /// # Safety
    /// AVX-512 F is present; `m` is a multiple of `mg`, `lanes == super::lanes(cg, mg)`;
    /// every pixel's output offset (`dsts[p]`, or `p * m`) plus `m` is at most `out.len()`; `outs` is a range of `0..=m` starting at a multiple
    /// of 16; for every `(xo, wo)` in the window and every base, `base + xo + m / mg * cg <=
    /// x.len()` and `wo + cg * m <= w.len()`; a bias has `m` floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pixels(call: &Pixels<'_>, lanes: Lanes, out: &mut [f32]) {
        let (m, mg, cg) = (call.m, call.mg, call.cg);
        let [o0, o1] = call.outs;
        let count = call.bases.len();
        let cin = m / mg * cg;
        // Permute mode: lane `l` takes input lane `(l / mg) * cg + ci` of the loaded vector.
        let mut idx = [_mm512_setzero_si512(); 16];
        if lanes == Lanes::Permute {
            for (ci, v) in idx.iter_mut().enumerate().take(cg) {
                let mut lane = [0i32; 16];
                for (l, d) in lane.iter_mut().enumerate() {
                    *d = ((l / mg) * cg + ci) as i32;
                }
                // SAFETY: `lane` is 16 i32s.
                *v = unsafe { _mm512_loadu_si512(lane.as_ptr().cast()) };
            }
        }
        let shape = Shape {
            m,
            cg,
            lanes,
            quads: lanes == Lanes::Permute && cg == 4 && mg == 4,
            lo: _mm512_set1_ps(call.clamp.lo),
            hi: _mm512_set1_ps(call.clamp.hi),
            dsts: call.dsts,
        };
        let out = out.as_mut_ptr();
        let mask = |n: usize| -> __mmask16 { if n >= 16 { 0xffff } else { (1u16 << n) - 1 } };
        // SAFETY (of `block`'s pointers): the caller's contract: `o + n <= o1 <= m` outputs,
        // a bias of `m` floats, every pixel's input row holds `cin > xoff` channels.
        let block = |(o, n): (usize, usize)| unsafe {
            let xoff = o / mg * cg;
            Block {
                x: call.x.as_ptr().add(xoff),
                w: call.w.as_ptr().add(o),
                out: out.add(o),
                bias: match call.bias {
                    Some(b) => _mm512_maskz_loadu_ps(mask(n), b.as_ptr().add(o)),
                    None => _mm512_setzero_ps(),
                },
                omask: mask(n),
                xmask: mask(cin - xoff),
            }
        };
        // The blocks, `(first output, outputs)`: broadcast blocks lie inside one group (a
        // group of 24 is a block of 16 and one of 8), permuted ones take 16 outputs of
        // several groups.
        let blocks: Vec<Block> = super::blocks(lanes, mg, o0, o1).map(block).collect();
        let full = count - count % P;
        let (win, bases) = (call.window, call.bases);
        // SAFETY: the caller's contract, passed on: pixels below `count`, blocks inside `outs`.
        unsafe {
            // Two blocks a tile where there are two (16 independent chains: with 8, the
            // FMA's latency held a 16-wide group's layer to one FMA a cycle), then one; the
            // pixels in chunks that every block sweeps while their inputs are in L1/L2 (one
            // sweep of a whole stride-2 layer per block pair streamed its image from L3).
            for c0 in (0..full).step_by(super::CHUNK) {
                let c1 = (c0 + super::CHUNK).min(full);
                // Each pair's blocks made where they are used (read back from a list, their
                // pointers were hoisted per pixel and spilled: 7% slower).
                let mut pairs = super::blocks(lanes, mg, o0, o1);
                while let Some(a) = pairs.next() {
                    if let Some(b) = pairs.next() {
                        let blk = [block(a), block(b)];
                        if lanes == Lanes::Broadcast && a.0 / mg == b.0 / mg {
                            // Both in one group (24 = 16 + 8, or 32 and wider): one
                            // broadcast feeds both blocks.
                            for p in (c0..c1).step_by(P) {
                                tile::<P, 2, true>(shape, blk, &idx, win, bases, p);
                            }
                        } else {
                            for p in (c0..c1).step_by(P) {
                                tile::<P, 2, false>(shape, blk, &idx, win, bases, p);
                            }
                        }
                    } else {
                        let blk = [block(a)];
                        for p in (c0..c1).step_by(P) {
                            tile::<P, 1, false>(shape, blk, &idx, win, bases, p);
                        }
                    }
                }
            }
            // The pixels left over: 4 at a time 2 blocks at a time, then 1 at a time 4
            // blocks at a time (independent chains where a weight load serves few pixels).
            let mut p = full;
            while p + 4 <= count {
                for pair in blocks.chunks(2) {
                    match *pair {
                        [a, b] => tile::<4, 2, false>(shape, [a, b], &idx, win, bases, p),
                        [a] => tile::<4, 1, false>(shape, [a], &idx, win, bases, p),
                        _ => {}
                    }
                }
                p += 4;
            }
            while p < count {
                for quad in blocks.chunks(4) {
                    match *quad {
                        [a, b, c, d] => tile::<1, 4, false>(shape, [a, b, c, d], &idx, win, bases, p),
                        [a, b, c] => {
                            tile::<1, 2, false>(shape, [a, b], &idx, win, bases, p);
                            tile::<1, 1, false>(shape, [c], &idx, win, bases, p);
                        }
                        [a, b] => tile::<1, 2, false>(shape, [a, b], &idx, win, bases, p),
                        [a] => tile::<1, 1, false>(shape, [a], &idx, win, bases, p),
                        _ => {}
                    }
                }
                p += 1;
            }
        }
    }

    /// Pixels `p0 .. p0 + T` of blocks `blk`: bias, the window's taps, bounds, masked stores.
    /// Broadcast: each input value of a tap's group channel broadcast to the lanes. Permute:
    /// each tap's input vector loaded once per pixel, permuted per input channel of the
    /// groups.
    ///
    /// # Safety
    /// As [`pixels`], with `p0 + T <= bases.len()` and every block inside `outs`.
    #[inline(always)]
    unsafe fn tile<const T: usize, const NB: usize, const SHARE: bool>(
        s: Shape<'_>,
        blk: [Block; NB],
        idx: &[__m512i; 16],
        window: &[(usize, usize)],
        bases: &[usize],
        p0: usize,
    ) {
        // SAFETY: the offsets were checked for every pixel (see `pixels`); the permuted input
        // loads are masked to the channels a pixel holds, the weight loads to the block's
        // outputs.
        unsafe {
            let at: [usize; T] = std::array::from_fn(|q| *bases.get_unchecked(p0 + q));
            let to: [usize; T] = std::array::from_fn(|q| match s.dsts {
                Some(d) => *d.get_unchecked(p0 + q),
                None => (p0 + q) * s.m,
            });
            let mut acc = [[_mm512_setzero_ps(); T]; NB];
            for (a, b) in acc.iter_mut().zip(&blk) {
                *a = [b.bias; T];
            }
            for &(xo, wo) in window {
                match s.lanes {
                    Lanes::Broadcast if SHARE => {
                        // Blocks of one group: each input value broadcast once for all.
                        for ci in 0..s.cg {
                            let wv: [__m512; NB] = std::array::from_fn(|b| {
                                _mm512_maskz_loadu_ps(blk[b].omask, blk[b].w.add(wo + ci * s.m))
                            });
                            let xp = blk[0].x.add(xo + ci);
                            for (q, &at) in at.iter().enumerate() {
                                let v = _mm512_set1_ps(*xp.add(at));
                                for (a, w) in acc.iter_mut().zip(&wv) {
                                    a[q] = _mm512_fmadd_ps(v, *w, a[q]);
                                }
                            }
                        }
                    }
                    Lanes::Broadcast => {
                        for ci in 0..s.cg {
                            for (a, b) in acc.iter_mut().zip(&blk) {
                                let wv = _mm512_maskz_loadu_ps(b.omask, b.w.add(wo + ci * s.m));
                                let xp = b.x.add(xo + ci);
                                for (a, &at) in a.iter_mut().zip(&at) {
                                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*xp.add(at)), wv, *a);
                                }
                            }
                        }
                    }
                    Lanes::Permute => {
                        let mut xv = [[_mm512_setzero_ps(); T]; NB];
                        for (v, b) in xv.iter_mut().zip(&blk) {
                            for (v, &at) in v.iter_mut().zip(&at) {
                                *v = _mm512_maskz_loadu_ps(b.xmask, b.x.add(at + xo));
                            }
                        }
                        if s.quads {
                            // Groups of 4 in 4: the in-lane shuffle broadcasting element `ci`
                            // of each 128-bit lane.
                            macro_rules! quad {
                                ($($ci:literal => $imm:literal),+) => {$(
                                    for ((a, b), v) in acc.iter_mut().zip(&blk).zip(&xv) {
                                        let wv = _mm512_maskz_loadu_ps(b.omask, b.w.add(wo + $ci * s.m));
                                        for (a, &v) in a.iter_mut().zip(v) {
                                            *a = _mm512_fmadd_ps(_mm512_permute_ps::<$imm>(v), wv, *a);
                                        }
                                    }
                                )+};
                            }
                            quad!(0 => 0x00, 1 => 0x55, 2 => 0xaa, 3 => 0xff);
                            continue;
                        }
                        for (ci, ix) in idx.iter().enumerate().take(s.cg) {
                            for ((a, b), v) in acc.iter_mut().zip(&blk).zip(&xv) {
                                let wv = _mm512_maskz_loadu_ps(b.omask, b.w.add(wo + ci * s.m));
                                for (a, &v) in a.iter_mut().zip(v) {
                                    *a = _mm512_fmadd_ps(_mm512_permutexvar_ps(*ix, v), wv, *a);
                                }
                            }
                        }
                    }
                }
            }
            for (a, b) in acc.iter().zip(&blk) {
                for (q, &v) in a.iter().enumerate() {
                    // With the bound first, a NaN `v` comes through as it is.
                    let v = _mm512_min_ps(s.hi, _mm512_max_ps(s.lo, v));
                    _mm512_mask_storeu_ps(b.out.add(to[q]), b.omask, v);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Lanes, Pixels};
    use std::arch::x86_64::*;

    /// One 8-output block's operands: pointers at the block's first input channel, weight and
    /// output, and its masks (a lane is touched when its top bit is set, `vmaskmovps`).
    #[derive(Clone, Copy)]
    struct Block {
        x: *const f32,
        w: *const f32,
        out: *mut f32,
        bias: __m256,
        /// The block's outputs (at most 8).
        omask: __m256i,
        /// The input lanes a permuted block loads.
        xmask: __m256i,
    }

    /// The call's shape and bounds.
    #[derive(Clone, Copy)]
    struct Shape<'a> {
        m: usize,
        cg: usize,
        lanes: Lanes,
        /// Permute mode with groups of 4 inputs to 4 outputs.
        quads: bool,
        lo: __m256,
        hi: __m256,
        /// Each pixel's output offset (`None`: pixel `p` at `p * m`).
        dsts: Option<&'a [usize]>,
    }

    /// The first `min(n, 8)` lanes.
    ///
    /// # Safety
    /// AVX2 is present.
    #[inline(always)]
    unsafe fn mask(n: usize) -> __m256i {
        let n = n.min(8) as i32;
        // SAFETY: register-only AVX2 instructions (the contract).
        unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
    }

    /// # Safety
    /// AVX2 and FMA are present; `m` is a multiple of `mg`; `lanes` is `Broadcast` only when
    /// `mg` is a multiple of 8 and `Permute` only when `mg` divides 8 and `cg <= mg`;
    /// every pixel's output offset (`dsts[p]`, or `p * m`) plus `m` is at most `out.len()`;
    /// `outs` is a range of `0..=m` starting at a multiple of 8; for every `(xo, wo)` in the window and every base, `base + xo + m / mg * cg <=
    /// x.len()` and `wo + cg * m <= w.len()`; a bias has `m` floats.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pixels(call: &Pixels<'_>, lanes: Lanes, out: &mut [f32]) {
        let (m, mg, cg) = (call.m, call.mg, call.cg);
        let [o0, o1] = call.outs;
        let count = call.bases.len();
        let cin = m / mg * cg;
        // Permute mode: lane `l` takes input lane `(l / mg) * cg + ci` of the loaded vector.
        let mut idx = [_mm256_setzero_si256(); 8];
        if lanes == Lanes::Permute {
            for (ci, v) in idx.iter_mut().enumerate().take(cg) {
                let lane: [i32; 8] = std::array::from_fn(|l| ((l / mg) * cg + ci) as i32);
                // SAFETY: `lane` is 8 i32s.
                *v = unsafe { _mm256_loadu_si256(lane.as_ptr().cast()) };
            }
        }
        let shape = Shape {
            m,
            cg,
            lanes,
            quads: lanes == Lanes::Permute && cg == 4 && mg == 4,
            lo: _mm256_set1_ps(call.clamp.lo),
            hi: _mm256_set1_ps(call.clamp.hi),
            dsts: call.dsts,
        };
        let out = out.as_mut_ptr();
        // SAFETY (of `block`'s pointers): the caller's contract: `o + n <= o1 <= m` outputs,
        // a bias of `m` floats, every pixel's input row holds `cin > xoff` channels.
        let block = |o: usize| unsafe {
            let n = o1 - o;
            let xoff = o / mg * cg;
            Block {
                x: call.x.as_ptr().add(xoff),
                w: call.w.as_ptr().add(o),
                out: out.add(o),
                bias: match call.bias {
                    Some(b) => _mm256_maskload_ps(b.as_ptr().add(o), mask(n)),
                    None => _mm256_setzero_ps(),
                },
                omask: mask(n),
                xmask: mask(cin - xoff),
            }
        };
        let (win, bases) = (call.window, call.bases);
        // SAFETY: the caller's contract, passed on: pixels below `count`, blocks inside `outs`.
        unsafe {
            // A group's 8-output blocks in sets that share each broadcast input: pairs, 6
            // pixels a tile (12 accumulators, two weights, one broadcast: 8 loads to 12
            // FMAs), and a triple where a group's blocks leave three (24-wide groups, and
            // 40- or 56-wide ones after their pairs), 3 pixels a tile (9 accumulators: with
            // 4, one accumulator spilled and its chain ran through memory; one block of 8
            // pixels at a time took 27 loads to 24 FMAs and broadcast each input three
            // times). 8-wide groups and a range's odd blocks: one block of 8 pixels (9 loads
            // to 8 FMAs). Permuting: 4 pixels, whose loaded input vectors also take
            // registers (16 in all).
            let mode = match lanes {
                Lanes::Broadcast if mg >= 16 => Mode::Shared,
                Lanes::Broadcast => Mode::Single,
                Lanes::Permute => Mode::Permute,
            };
            let run = Run {
                shape,
                idx: &idx,
                window: win,
                bases,
                outs: [o0, o1],
                mg,
                mode,
            };
            for c0 in (0..count).step_by(super::AVX2_CHUNK) {
                run.sweep(&block, c0..(c0 + super::AVX2_CHUNK).min(count));
            }
        }
    }

    /// How a sweep groups its blocks of outputs (see `pixels`).
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Mode {
        /// Broadcast, a group's blocks two or three at a time sharing each input.
        Shared,
        /// Broadcast, one block at a time.
        Single,
        /// Permuted inputs, one block at a time.
        Permute,
    }

    /// What every tile of one call shares.
    struct Run<'a> {
        shape: Shape<'a>,
        idx: &'a [__m256i; 8],
        window: &'a [(usize, usize)],
        bases: &'a [usize],
        outs: [usize; 2],
        mg: usize,
        mode: Mode,
    }

    impl Run<'_> {
        /// Pixels `pixels` over every block of the outputs, set by set (a set's weights
        /// stay in L1 while the pixels sweep).
        ///
        /// # Safety
        /// As [`pixels`], with `pixels.end <= bases.len()`; `block(o)` is the block of
        /// outputs from `o` (a multiple of 8 inside `outs`).
        #[inline(always)]
        unsafe fn sweep(&self, block: &impl Fn(usize) -> Block, pixels: std::ops::Range<usize>) {
            let [o0, o1] = self.outs;
            // SAFETY: the caller's contract; a shared set's blocks are whole and lie inside
            // one group: `left` counts the outputs from `o` to its group's end (or `o1`).
            unsafe {
                let mut o = o0;
                while o < o1 {
                    let left = (self.mg - o % self.mg).min(o1 - o);
                    match self.mode {
                        Mode::Shared if left >= 16 && left != 24 => {
                            self.set::<2, true, 6>([block(o), block(o + 8)], pixels.clone());
                            o += 16;
                        }
                        Mode::Shared if left >= 24 => {
                            self.set::<3, true, 3>([block(o), block(o + 8), block(o + 16)], pixels.clone());
                            o += 24;
                        }
                        // A whole block loads its weights unmasked (the shared form).
                        Mode::Shared | Mode::Single if left >= 8 => {
                            self.set::<1, true, 6>([block(o)], pixels.clone());
                            o += 8;
                        }
                        Mode::Shared | Mode::Single => {
                            self.set::<1, false, 8>([block(o)], pixels.clone());
                            o += 8;
                        }
                        Mode::Permute => {
                            self.set::<1, false, 4>([block(o)], pixels.clone());
                            o += 8;
                        }
                    }
                }
            }
        }

        /// The blocks `blk` for `pixels`: tiles of `T` pixels, then the rest as one tile
        /// (most of a small image's edge classes: one pixel at a time, they took half of a
        /// 7 x 7 layer's time).
        ///
        /// # Safety
        /// As [`Run::sweep`], for these blocks (with `SHARED`, of one group and whole).
        #[inline(always)]
        unsafe fn set<const NB: usize, const SHARED: bool, const T: usize>(
            &self,
            blk: [Block; NB],
            pixels: std::ops::Range<usize>,
        ) {
            let (s, idx, win, bases) = (self.shape, self.idx, self.window, self.bases);
            let full = pixels.start + pixels.len() / T * T;
            // SAFETY: the caller's contract: every tile's pixels below `pixels.end`.
            unsafe {
                for p in (pixels.start..full).step_by(T) {
                    tile::<T, NB, SHARED>(s, blk, idx, win, bases, p);
                }
                match pixels.end - full {
                    0 => {}
                    1 => tile::<1, NB, SHARED>(s, blk, idx, win, bases, full),
                    2 => tile::<2, NB, SHARED>(s, blk, idx, win, bases, full),
                    3 => tile::<3, NB, SHARED>(s, blk, idx, win, bases, full),
                    4 => tile::<4, NB, SHARED>(s, blk, idx, win, bases, full),
                    5 => tile::<5, NB, SHARED>(s, blk, idx, win, bases, full),
                    6 => tile::<6, NB, SHARED>(s, blk, idx, win, bases, full),
                    _ => tile::<7, NB, SHARED>(s, blk, idx, win, bases, full),
                }
            }
        }
    }

    /// Pixels `p0 .. p0 + T` of blocks `blk`: bias, the window's taps, bounds, masked stores
    /// (as the AVX-512 tile, 8 lanes wide). `SHARED`: the blocks read the same inputs (one
    /// group's), each input broadcast once for all of them, and have 8 outputs each (weights
    /// loaded whole: their masks would take the two registers the tile lacks).
    ///
    /// # Safety
    /// As [`pixels`], with `p0 + T <= bases.len()` and every block inside `outs`; with
    /// `SHARED`, every block's `x` is the first's and every block has 8 outputs.
    #[inline(always)]
    unsafe fn tile<const T: usize, const NB: usize, const SHARED: bool>(
        s: Shape<'_>,
        blk: [Block; NB],
        idx: &[__m256i; 8],
        window: &[(usize, usize)],
        bases: &[usize],
        p0: usize,
    ) {
        // SAFETY: the offsets were checked for every pixel (see `pixels`); the permuted input
        // loads are masked to the channels a pixel holds, the weight loads to the block's
        // outputs.
        unsafe {
            let at: [usize; T] = std::array::from_fn(|q| *bases.get_unchecked(p0 + q));
            let to: [usize; T] = std::array::from_fn(|q| match s.dsts {
                Some(d) => *d.get_unchecked(p0 + q),
                None => (p0 + q) * s.m,
            });
            let mut acc = [[_mm256_setzero_ps(); T]; NB];
            for (a, b) in acc.iter_mut().zip(&blk) {
                *a = [b.bias; T];
            }
            for &(xo, wo) in window {
                match s.lanes {
                    Lanes::Broadcast if SHARED => {
                        for ci in 0..s.cg {
                            let wv: [__m256; NB] =
                                std::array::from_fn(|j| _mm256_loadu_ps(blk[j].w.add(wo + ci * s.m)));
                            let xp = blk[0].x.add(xo + ci);
                            for (q, &at) in at.iter().enumerate() {
                                let xb = _mm256_set1_ps(*xp.add(at));
                                for (a, &wv) in acc.iter_mut().zip(&wv) {
                                    a[q] = _mm256_fmadd_ps(xb, wv, a[q]);
                                }
                            }
                        }
                    }
                    Lanes::Broadcast => {
                        for ci in 0..s.cg {
                            for (a, b) in acc.iter_mut().zip(&blk) {
                                let wv = _mm256_maskload_ps(b.w.add(wo + ci * s.m), b.omask);
                                let xp = b.x.add(xo + ci);
                                for (a, &at) in a.iter_mut().zip(&at) {
                                    *a = _mm256_fmadd_ps(_mm256_set1_ps(*xp.add(at)), wv, *a);
                                }
                            }
                        }
                    }
                    Lanes::Permute => {
                        let mut xv = [[_mm256_setzero_ps(); T]; NB];
                        for (v, b) in xv.iter_mut().zip(&blk) {
                            for (v, &at) in v.iter_mut().zip(&at) {
                                *v = _mm256_maskload_ps(b.x.add(at + xo), b.xmask);
                            }
                        }
                        if s.quads {
                            // Groups of 4 in 4: the in-lane shuffle broadcasting element `ci`
                            // of each 128-bit lane (one cycle, where `vpermps` takes three).
                            quad::<0x00, T, NB>(&mut acc, &blk, &xv, wo);
                            quad::<0x55, T, NB>(&mut acc, &blk, &xv, wo + s.m);
                            quad::<0xaa, T, NB>(&mut acc, &blk, &xv, wo + 2 * s.m);
                            quad::<0xff, T, NB>(&mut acc, &blk, &xv, wo + 3 * s.m);
                            continue;
                        }
                        for (ci, ix) in idx.iter().enumerate().take(s.cg) {
                            for ((a, b), v) in acc.iter_mut().zip(&blk).zip(&xv) {
                                let wv = _mm256_maskload_ps(b.w.add(wo + ci * s.m), b.omask);
                                for (a, &v) in a.iter_mut().zip(v) {
                                    *a = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(v, *ix), wv, *a);
                                }
                            }
                        }
                    }
                }
            }
            for (a, b) in acc.iter().zip(&blk) {
                for (q, &v) in a.iter().enumerate() {
                    // With the bound first, a NaN `v` comes through as it is.
                    let v = _mm256_min_ps(s.hi, _mm256_max_ps(s.lo, v));
                    // `omask` is `mask(n)`, the first lanes (plain stores: see `store_first`).
                    crate::sgemm::x86::avx2::store_prefix(b.out.add(to[q]), b.omask, v);
                }
            }
        }
    }

    /// One input channel of groups of 4 in 4: `acc += shuffle::<IMM>(x) * w[wo ..]` for each
    /// block and pixel, `IMM` picking the channel within each 128-bit lane.
    ///
    /// # Safety
    /// As [`tile`]: the weights at `wo` are those of one input channel of the blocks' groups.
    #[inline(always)]
    unsafe fn quad<const IMM: i32, const T: usize, const NB: usize>(
        acc: &mut [[__m256; T]; NB],
        blk: &[Block; NB],
        xv: &[[__m256; T]; NB],
        wo: usize,
    ) {
        // SAFETY: the weight loads are masked to the blocks' outputs (the caller's contract).
        unsafe {
            for ((a, b), v) in acc.iter_mut().zip(blk).zip(xv) {
                let wv = _mm256_maskload_ps(b.w.add(wo), b.omask);
                for (a, &v) in a.iter_mut().zip(v) {
                    *a = _mm256_fmadd_ps(_mm256_permute_ps::<IMM>(v), wv, *a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The f64 sum of the module docs' formula, for one pixel's output `o`.
    fn oracle(call: &Pixels<'_>, p: usize, o: usize) -> f64 {
        let g = o / call.mg;
        let mut s = call.bias.map_or(0.0, |b| f64::from(b[o]));
        for &(xo, wo) in call.window {
            for ci in 0..call.cg {
                let a = call.x[call.bases[p] + xo + g * call.cg + ci];
                s += f64::from(a) * f64::from(call.w[wo + ci * call.m + o]);
            }
        }
        s
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn vector_forms() {
        assert_eq!(lanes(16, 16), Some(Lanes::Broadcast));
        assert_eq!(lanes(3, 32), Some(Lanes::Broadcast));
        assert_eq!(lanes(4, 4), Some(Lanes::Permute));
        assert_eq!(lanes(1, 8), Some(Lanes::Permute));
        assert_eq!(lanes(8, 8), Some(Lanes::Permute));
        assert_eq!(lanes(16, 8), Some(Lanes::Broadcast));
        assert_eq!(lanes(8, 4), Some(Lanes::Broadcast));
        assert_eq!(lanes(24, 24), Some(Lanes::Broadcast));
        assert_eq!(lanes(0, 16), None);
        let all = |l, mg, o0, o1| blocks(l, mg, o0, o1).collect::<Vec<_>>();
        // Groups of 24: a block of 16 and one of 8 each; permuted blocks of 16 across groups.
        assert_eq!(all(Lanes::Broadcast, 24, 0, 48), [(0, 16), (16, 8), (24, 16), (40, 8)]);
        assert_eq!(all(Lanes::Broadcast, 24, 16, 30), [(16, 8), (24, 6)]);
        assert_eq!(
            all(Lanes::Broadcast, 32, 0, 64),
            [(0, 16), (16, 16), (32, 16), (48, 16)]
        );
        assert_eq!(all(Lanes::Permute, 4, 0, 40), [(0, 16), (16, 16), (32, 8)]);
    }

    #[test]
    fn packing_is_tap_major() {
        // W [m=2, cg=3, 1, 2]: value 100*o + 10*ci + t.
        let w: Vec<f32> = (0..2)
            .flat_map(|o| (0..3).flat_map(move |ci| (0..2).map(move |t| (100 * o + 10 * ci + t) as f32)))
            .collect();
        let p = pack_taps(&w, 2, 3, 1, 2).unwrap();
        for t in 0..2 {
            for ci in 0..3 {
                for o in 0..2 {
                    assert_eq!(p[(t * 3 + ci) * 2 + o], (100 * o + 10 * ci + t) as f32);
                }
            }
        }
        assert!(pack_taps(&w[1..], 2, 3, 1, 2).is_none());
    }

    #[test]
    fn offsets_out_of_range_are_refused() {
        let x = vec![1.0f32; 40];
        let w = vec![1.0f32; 2 * 4 * 8];
        let call = Pixels {
            x: &x,
            w: &w,
            bias: None,
            window: &[(0, 0), (8, 32)],
            bases: &[0, 8, 16, 24],
            dsts: None,
            cg: 4,
            mg: 4,
            m: 8,
            outs: [0, 8],
            clamp: Clamp::NONE,
        };
        let mut out = vec![0.0f32; 8 * 4];
        assert!(call.run(&mut out));
        // An output of another length; a pixel at 32 would read x[32 + 8 .. 48] past the end.
        assert!(!call.run(&mut [0.0f32; 8 * 5]));
        assert!(
            !Pixels {
                bases: &[0, 32, 8, 16],
                ..call
            }
            .run(&mut out)
        );
        // Groups that do not divide m, and a tap past the weights.
        assert!(!Pixels { mg: 3, ..call }.run(&mut [0.0; 8]));
        assert!(
            !Pixels {
                window: &[(0, 33)],
                ..call
            }
            .run(&mut [0.0; 8])
        );
        assert!(
            !Pixels {
                bias: Some(&[0.0; 7]),
                ..call
            }
            .run(&mut [0.0; 8])
        );
        // Output offsets: one per pixel, each with room for m outputs.
        assert!(
            Pixels {
                dsts: Some(&[24, 0, 16, 8]),
                ..call
            }
            .run(&mut out)
        );
        assert!(
            !Pixels {
                dsts: Some(&[24, 0, 16]),
                ..call
            }
            .run(&mut out)
        );
        assert!(
            !Pixels {
                dsts: Some(&[25, 0, 16, 8]),
                ..call
            }
            .run(&mut out)
        );
        // Output ranges past m, reversed, or not starting at a multiple of 16.
        assert!(!Pixels { outs: [0, 9], ..call }.run(&mut [0.0; 8]));
        assert!(!Pixels { outs: [4, 8], ..call }.run(&mut [0.0; 8]));
    }

    /// The (cg, mg) shapes of both vector forms and of the scalar-only one, with tails.
    fn shapes() -> impl Strategy<Value = (usize, usize, usize)> {
        prop_oneof![
            Just((16, 16)),
            Just((3, 32)),
            Just((4, 4)),
            Just((8, 8)),
            Just((2, 8)),
            Just((1, 2)),
            Just((1, 1)),
            Just((5, 6)),
            Just((6, 24)),
            Just((24, 24)),
            Just((3, 72)),
            Just((5, 40)),
            Just((2, 56)),
            Just((8, 4)),
        ]
        .prop_flat_map(|(cg, mg)| (Just(cg), Just(mg), 1usize..=(48 / mg).max(1)))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// Every level against the scalar twin and an f64 oracle: random group shapes, group
        /// counts (so output tails of any width), windows, steps, pixel counts around the
        /// 8-pixel blocks, bias and clamp.
        #[test]
        fn levels_match_the_scalar_twin(
            (cg, mg, groups) in shapes(),
            taps in 1usize..=9,
            count in prop_oneof![1usize..=19, 60usize..=140],
            stride in 1usize..=2,
            with_bias: bool,
            relu: bool,
            range in (0usize..4, 0usize..64),
            scatter in proptest::option::of(0usize..3),
            seed in 0u64..1000,
        ) {
            let m = mg * groups;
            let cin = cg * groups;
            let step = stride * cin;
            // Outputs [o0, o1): o0 a multiple of 16 up to m, any end after it (often m).
            let o0 = (range.0 * 16).min(m / 16 * 16);
            let o1 = if range.1 < 32 { m } else { o0 + range.1 % (m - o0 + 1) };
            // Taps at scattered pixels of a row, one pixel of `cin` channels each.
            let window: Vec<(usize, usize)> = (0..taps).map(|t| ((t * 5 % 7) * cin, t * cg * m)).collect();
            let xlen = (count - 1) * step + 7 * cin + cin;
            // Pixel p at p * step, but in shuffled order (callers pass pixels of several rows).
            let bases: Vec<usize> = (0..count).map(|p| (p * 7 % count) * step).collect();
            let x = values(xlen, seed);
            let w = values(taps * cg * m, seed + 1);
            let bias = values(m, seed + 2);
            // Scattered outputs: the pixels written in reverse order, `gap` floats apart.
            let gap = scatter.unwrap_or(0);
            let dsts: Vec<usize> = (0..count).map(|p| (count - 1 - p) * (m + gap)).collect();
            let dst = |p: usize| if scatter.is_some() { dsts[p] } else { p * m };
            let len = count * (m + gap);
            let call = Pixels {
                x: &x,
                w: &w,
                bias: with_bias.then_some(bias.as_slice()),
                window: &window,
                bases: &bases,
                dsts: scatter.map(|_| dsts.as_slice()),
                cg,
                mg,
                m,
                outs: [o0, o1],
                clamp: if relu { Clamp { lo: 0.0, hi: f32::INFINITY } } else { Clamp::NONE },
            };
            let mut scalar = vec![f32::NAN; len];
            prop_assert!(call.run_with(Isa::Portable, &mut scalar));
            for p in 0..count {
                for o in 0..m {
                    let got = f64::from(scalar[dst(p) + o]);
                    if !(o0..o1).contains(&o) {
                        prop_assert!(got.is_nan(), "p{p} o{o} outside {o0}..{o1} was written");
                        continue;
                    }
                    let mut want = oracle(&call, p, o);
                    if relu {
                        want = want.max(0.0);
                    }
                    prop_assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "scalar p{p} o{o}: {got} vs {want}");
                }
            }
            for isa in [Isa::Avx2Fma, Isa::Avx512] {
                if !isa.is_supported() {
                    continue;
                }
                let mut fast = vec![f32::NAN; len];
                prop_assert!(call.run_with(isa, &mut fast));
                for (i, (a, b)) in fast.iter().zip(&scalar).enumerate() {
                    let same = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
                    prop_assert!(same, "{isa:?} at {i}: {a} vs {b}");
                }
            }
        }
    }
}
