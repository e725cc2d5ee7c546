//! Depthwise convolution of 8-bit channels-last images, summed in i32: the integer twin of
//! [`crate::dwconv::Pixels`] (the same pixel and window offsets), reading X's bytes in place.
//!
//! Each output channel of a pixel is `init[j] + sum over the window's taps of x * w`, X's
//! byte as an integer (u8 or i8) and the tap an i16. On AVX-512 VNNI, each tap of 16
//! channels is one `vpmovzxbd` (`vpmovsxbd`) of the bytes and one `vpdpwssd`: the byte and
//! the tap stand as 16-bit pairs `(x, 0|-1)` and `(w, 0)` (the tap zero-extended), whose
//! pairwise sum is `x * w`. Four pixels share each tap's load. Sums wrap as
//! the portable loop's `wrapping_*` (they cannot wrap for a window of at most 256 taps of
//! values within +-255, the callers' case).

use crate::isa::{self, Isa};

/// One call's operands: `count = out.len() / c` pixels of `c` channels each, pixel `p`'s
/// bytes read at `base + p * step` plus each of the `window`'s (input, tap) offsets.
#[derive(Debug, Clone, Copy)]
pub struct QPixels<'a> {
    /// X's bytes (`[.., C]` rows of pixels).
    pub x: &'a [u8],
    /// X's bytes are i8 (else u8).
    pub signed: bool,
    /// The taps, `[kh * kw, c]`.
    pub w: &'a [i16],
    /// The `c` values each pixel's sums start from.
    pub init: &'a [i32],
    pub window: &'a [(usize, usize)],
    pub base: usize,
    pub step: usize,
    pub c: usize,
}

impl QPixels<'_> {
    /// `out = init + window sums`, pixel `p` written to `out[p*c ..]`. Returns `false`,
    /// writing nothing, when an offset or `init` does not fit.
    pub fn run(&self, out: &mut [i32]) -> bool {
        self.run_with(isa::active(), out)
    }

    /// [`QPixels::run`] on a given level (tests compare the levels; only AVX-512 with VNNI
    /// has a kernel of its own).
    pub fn run_with(&self, isa: Isa, out: &mut [i32]) -> bool {
        let &QPixels {
            x,
            signed,
            w,
            init,
            window,
            base,
            step,
            c,
        } = self;
        if c == 0 || !out.len().is_multiple_of(c) {
            return out.is_empty();
        }
        let count = out.len() / c;
        if init.len() != c || !crate::dwconv::window_fits(window, (base, step, count, c), (x.len(), w.len())) {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.has_int8_dot() {
            // SAFETY: AVX-512 F, BW, VL and VNNI are present (`has_int8_dot`); every offset
            // was checked for the last (largest) pixel: `base + p*step + xo + c <= x.len()`
            // for `p < count`, `wo + c <= w.len()`, `init.len() == c`, `out.len() == count *
            // c`.
            unsafe {
                if signed {
                    vnni::pixels::<true>(self, out);
                } else {
                    vnni::pixels::<false>(self, out);
                }
            }
            return true;
        }
        let _ = isa;
        for (p, o) in out.chunks_exact_mut(c).enumerate() {
            o.copy_from_slice(init);
            let at = base + p * step;
            for &(xo, wo) in window {
                let (Some(xs), Some(ws)) = (x.get(at + xo..at + xo + c), w.get(wo..wo + c)) else {
                    continue;
                };
                for ((o, &b), &t) in o.iter_mut().zip(xs).zip(ws) {
                    let v = if signed { i32::from(b as i8) } else { i32::from(b) };
                    *o = o.wrapping_add(v * i32::from(t));
                }
            }
        }
        true
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::QPixels;
    use std::arch::x86_64::*;

    /// Pixels summed together: independent accumulator chains sharing each tap's load.
    const P: usize = 4;
    const LANES: usize = 16;

    /// # Safety
    /// AVX-512 F, BW, VL and VNNI are present; `out.len()` is a multiple of `c > 0`, `count =
    /// out.len() / c`; for every `(xo, wo)` in the window and `p < count`, `base + p * step +
    /// xo + c <= x.len()` and `wo + c <= w.len()`; `init` has `c` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn pixels<const SIGNED: bool>(call: &QPixels<'_>, out: &mut [i32]) {
        let c = call.c;
        let count = out.len() / c;
        let mut p = 0;
        while p + P <= count {
            let mut j0 = 0;
            while j0 + LANES <= c {
                // SAFETY: pixels `p..p + P` and channels `j0..j0 + 16` within the contract.
                unsafe { block::<SIGNED, P>(call, out, p, j0, 0xFFFF) };
                j0 += LANES;
            }
            if j0 < c {
                // SAFETY: as above, the mask limiting the accesses to channels `j0..c`.
                unsafe { block::<SIGNED, P>(call, out, p, j0, (1u16 << (c - j0)) - 1) };
            }
            p += P;
        }
        while p < count {
            let mut j0 = 0;
            while j0 < c {
                let m = if c - j0 >= LANES {
                    0xFFFF
                } else {
                    (1u16 << (c - j0)) - 1
                };
                // SAFETY: pixel `p` and channels `j0..` under the mask, within the contract.
                unsafe { block::<SIGNED, 1>(call, out, p, j0, m) };
                j0 += LANES;
            }
            p += 1;
        }
    }

    /// Pixels `p..p + N`, channels `j0..` of the mask `m` (its lanes from the first).
    ///
    /// # Safety
    /// As [`pixels`], for pixels `p..p + N < count` and the mask's channels below `c`.
    #[inline(always)]
    unsafe fn block<const SIGNED: bool, const N: usize>(
        call: &QPixels<'_>,
        out: &mut [i32],
        p: usize,
        j0: usize,
        m: __mmask16,
    ) {
        let (x, w, c, step) = (call.x.as_ptr(), call.w.as_ptr(), call.c, call.step);
        // SAFETY: the caller's features and bounds: every access below is of the mask's
        // channels at an offset the contract bounds.
        unsafe {
            let start = _mm512_maskz_loadu_epi32(m, call.init.as_ptr().add(j0));
            let mut acc = [start; N];
            for &(xo, wo) in call.window {
                let t = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, w.add(wo + j0)));
                let at = x.add(call.base + p * step + xo + j0);
                for (q, a) in acc.iter_mut().enumerate() {
                    let bytes = _mm_maskz_loadu_epi8(m, at.add(q * step).cast());
                    let v = if SIGNED {
                        _mm512_cvtepi8_epi32(bytes)
                    } else {
                        _mm512_cvtepu8_epi32(bytes)
                    };
                    *a = _mm512_dpwssd_epi32(*a, v, t);
                }
            }
            let o = out.as_mut_ptr().add(p * c + j0);
            for (q, a) in acc.into_iter().enumerate() {
                _mm512_mask_storeu_epi32(o.add(q * c), m, a);
            }
        }
    }
}
