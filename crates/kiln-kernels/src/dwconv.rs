//! The inner kernel of channels-last depthwise convolution: one output pixel's channels,
//! `out[ch] = bias[ch] + sum over taps t of x[base + xo_t + ch] * w[wo_t + ch]`, where the
//! window lists `(xo_t, wo_t)`: the offsets of the input pixel and of the tap's weights (both
//! rows of `C` contiguous channels).
//!
//! All offsets are checked once per call; the AVX-512 path then runs the taps over blocks of
//! 64 channels held in four registers (fused multiply-adds, masked tail), with no per-tap
//! bounds checks. The portable path is the scalar twin (multiply, then add) it is tested
//! against; the two differ by the FMA's single rounding only.

use crate::isa::{self, Isa};

/// `out = bias + window sums` for `count = out.len() / c` pixels of `c` channels each (see
/// the module docs), pixel `p` at input offset `base + p * step`, written to `out[p*c ..]`.
/// Returns `false`, writing nothing, when an offset or the bias does not fit.
#[allow(clippy::too_many_arguments)]
pub fn pixels(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    window: &[(usize, usize)],
    base: usize,
    step: usize,
    c: usize,
    out: &mut [f32],
) -> bool {
    pixels_with(isa::active(), x, w, bias, window, base, step, c, out)
}

/// [`pixels`] on a given level (tests compare the levels).
#[allow(clippy::too_many_arguments)]
pub fn pixels_with(
    isa: Isa,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    window: &[(usize, usize)],
    base: usize,
    step: usize,
    c: usize,
    out: &mut [f32],
) -> bool {
    if c == 0 || !out.len().is_multiple_of(c) {
        return out.is_empty();
    }
    let count = out.len() / c;
    // The last pixel's input offset: every pixel's reads lie below it plus the window.
    let last = (count.max(1) - 1).checked_mul(step).and_then(|v| v.checked_add(base));
    let fits = |o: Option<usize>, len: usize| o.and_then(|o| o.checked_add(c)).is_some_and(|e| e <= len);
    if bias.is_some_and(|b| b.len() != c)
        || !window
            .iter()
            .all(|&(xo, wo)| fits(last.and_then(|l| l.checked_add(xo)), x.len()) && fits(Some(wo), w.len()))
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_supported() {
        for (p, o) in out.chunks_exact_mut(c).enumerate() {
            // SAFETY: AVX-512 F is present (checked just above), and every offset was checked
            // for the last (largest) pixel: `base + p*step + xo + c <= x.len()` for `p < count`,
            // `wo + c <= w.len()`, `bias.len() == c == o.len()`.
            unsafe { avx512::pixel(x, w, bias, window, base + p * step, o) };
        }
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
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512 F is present; for every `(xo, wo)` in `window`, `base + xo + out.len() <=
    /// x.len()` and `wo + out.len() <= w.len()`; a bias has `out.len()` floats.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn pixel(
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        window: &[(usize, usize)],
        base: usize,
        out: &mut [f32],
    ) {
        let c = out.len();
        let (xp, wp, op) = (x.as_ptr(), w.as_ptr(), out.as_mut_ptr());
        let bp = bias.map(<[f32]>::as_ptr);
        let mut c0 = 0;
        // SAFETY (for every load and store below): channels `c0 .. c0 + 64` (or the masked
        // `c0 .. c`) are below `c`, so `base + xo + ch < x.len()`, `wo + ch < w.len()`,
        // `ch < out.len()` and `ch < bias.len()` by the caller's contract.
        unsafe {
            while c0 + 64 <= c {
                let mut acc = match bp {
                    Some(b) => [0, 16, 32, 48].map(|k| _mm512_loadu_ps(b.add(c0 + k))),
                    None => [_mm512_setzero_ps(); 4],
                };
                for &(xo, wo) in window {
                    let (xs, ws) = (xp.add(base + xo + c0), wp.add(wo + c0));
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_loadu_ps(xs.add(16 * k)), _mm512_loadu_ps(ws.add(16 * k)), *a);
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(op.add(c0 + 16 * k), *a);
                }
                c0 += 64;
            }
            while c0 < c {
                let n = (c - c0).min(16);
                let m: __mmask16 = if n >= 16 {
                    0xFFFF
                } else {
                    ((1u32 << n) - 1) as __mmask16
                };
                let mut acc = match bp {
                    Some(b) => _mm512_maskz_loadu_ps(m, b.add(c0)),
                    None => _mm512_setzero_ps(),
                };
                for &(xo, wo) in window {
                    let xv = _mm512_maskz_loadu_ps(m, xp.add(base + xo + c0));
                    let wv = _mm512_maskz_loadu_ps(m, wp.add(wo + c0));
                    acc = _mm512_fmadd_ps(xv, wv, acc);
                }
                _mm512_mask_storeu_ps(op.add(c0), m, acc);
                c0 += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_out_of_range_are_refused() {
        let (x, w) = (vec![1.0f32; 40], vec![2.0f32; 18]);
        let mut out = vec![0.0f32; 8];
        for isa in Isa::ALL {
            assert!(pixels_with(isa, &x, &w, None, &[(0, 0), (32, 10)], 0, 0, 8, &mut out));
            assert_eq!(out, vec![4.0; 8]);
            assert!(!pixels_with(isa, &x, &w, None, &[(33, 0)], 0, 0, 8, &mut out));
            assert!(!pixels_with(isa, &x, &w, None, &[(0, 11)], 0, 0, 8, &mut out));
            assert!(!pixels_with(isa, &x, &w, None, &[(0, 0)], usize::MAX, 0, 8, &mut out));
            assert!(!pixels_with(isa, &x, &w, Some(&[1.0; 7]), &[(0, 0)], 0, 0, 8, &mut out));
            // Two pixels of 4 channels, 30 floats apart: the second reads x[30..34] (ones).
            let mut two = vec![0.0f32; 8];
            assert!(pixels_with(isa, &x, &w, None, &[(2, 0)], 0, 30, 4, &mut two));
            assert_eq!(two, vec![2.0; 8]);
            // A step that takes the last pixel past the end is refused.
            assert!(!pixels_with(isa, &x, &w, None, &[(2, 0)], 0, 36, 4, &mut two));
        }
    }
}
