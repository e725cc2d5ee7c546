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

/// Bytes per quad: [`QuadRow`] packs four of a channel's input bytes in one dword, and a
/// window's kernel row is summed four taps to a `vpdpbusd`.
pub const QUAD: usize = 4;

/// The code of X's byte in a quad: u8 as is, i8 moved up by 128 (`x ^ 0x80`), so every code
/// is a u8 and `code(x) - code(z) = x - z`.
#[inline(always)]
pub fn quad_code(byte: u8, signed: bool) -> u8 {
    if signed { byte ^ 0x80 } else { byte }
}

/// Depthwise taps `[kh * kw][c]` packed for [`QuadTaps`]: `[kh][groups][c][QUAD]`, groups =
/// `kw.div_ceil(4)`, tap `kx` of a kernel row in group `kx / 4`, byte `kx % 4`, missing taps
/// zero. `None` when `taps` is not `kh * kw * c` values.
pub fn pack_quad_taps(taps: &[i8], (kh, kw): (usize, usize), c: usize) -> Option<Vec<i8>> {
    let groups = kw.div_ceil(QUAD);
    if taps.len() != kh.checked_mul(kw)?.checked_mul(c)? {
        return None;
    }
    let mut out = vec![0i8; kh * groups * c * QUAD];
    for ky in 0..kh {
        for kx in 0..kw {
            for ch in 0..c {
                let at = ((ky * groups + kx / QUAD) * c + ch) * QUAD + kx % QUAD;
                *out.get_mut(at)? = *taps.get((ky * kw + kx) * c + ch)?;
            }
        }
    }
    Some(out)
}

/// One input row of a channels-last image, padded on the left by `pad` columns and on the
/// right as far as needed, packed as quads: quad `(px, ch)` holds, in byte `j`, the
/// [`quad_code`] of channel `ch` of padded column `px + j * dilation` (column `px + j *
/// dilation - pad` of `x`, or `fill` outside it). An empty `x` makes a row of padding.
#[derive(Debug, Clone, Copy)]
pub struct QuadRow<'a> {
    /// The row's bytes, `[w][c]`.
    pub x: &'a [u8],
    pub signed: bool,
    pub c: usize,
    pub pad: usize,
    /// The padding's byte (X's zero point, as X stores it).
    pub fill: u8,
    pub dilation: usize,
}

impl QuadRow<'_> {
    /// Fills `out` (`out.len() / c` quads a channel); `false`, writing nothing, when `c` is 0,
    /// `out` is not whole pixels, `x` is not whole pixels or the dilation is 0. Portable: the
    /// definition [`QuadBand`]'s twin packs with (its SIMD kernel packs blocks of its own).
    pub fn pack(&self, out: &mut [u32]) -> bool {
        let c = self.c;
        if c == 0 || self.dilation == 0 || !out.len().is_multiple_of(c) || !self.x.len().is_multiple_of(c) {
            return false;
        }
        let w = self.x.len() / c;
        let fill = quad_code(self.fill, self.signed);
        for (px, o) in out.chunks_exact_mut(c).enumerate() {
            for (ch, o) in o.iter_mut().enumerate() {
                let mut q = 0u32;
                for j in 0..QUAD {
                    let b = (px + j * self.dilation)
                        .checked_sub(self.pad)
                        .filter(|&col| col < w)
                        .and_then(|col| self.x.get(col * c + ch))
                        .map_or(fill, |&b| quad_code(b, self.signed));
                    q |= u32::from(b) << (8 * j);
                }
                *o = q;
            }
        }
        true
    }
}

/// One output row of a depthwise convolution from quad-packed input rows ([`QuadRow`]):
/// pixel `p`'s channel `ch` is `init[ch]` plus, for each kernel row `r` and group `g`, the
/// dot product of quad `(p * stride + g * reach, ch)` of `rows[r]` (u8 codes) with the taps'
/// `[r][g][ch]` four i8 values (what one `vpdpbusd` lane computes). Exact: a
/// window of at most 65,793 products of a u8 and an i8 cannot wrap an i32.
#[derive(Debug, Clone, Copy)]
pub struct QuadTaps<'a> {
    /// One packed row per kernel row.
    pub rows: &'a [&'a [u32]],
    /// `[rows.len()][groups][c][QUAD]`, as [`pack_quad_taps`] makes them.
    pub taps: &'a [i8],
    pub init: &'a [i32],
    pub groups: usize,
    /// Quads between two output pixels (the horizontal stride).
    pub stride: usize,
    /// Quads between a pixel's groups (`QUAD` times the horizontal dilation).
    pub reach: usize,
    pub c: usize,
}

impl QuadTaps<'_> {
    /// `out = init + window sums` for `out.len() / c` pixels. Returns `false`, writing
    /// nothing, when a row, the taps or `init` do not fit. Portable: the definition
    /// [`QuadBand`]'s twin sums with.
    pub fn run(&self, out: &mut [i32]) -> bool {
        let &QuadTaps {
            rows,
            taps,
            init,
            groups,
            stride,
            reach,
            c,
        } = self;
        if c == 0 || !out.len().is_multiple_of(c) {
            return out.is_empty();
        }
        let count = out.len() / c;
        if count == 0 {
            return true;
        }
        let reach_end = (count - 1)
            .checked_mul(stride)
            .and_then(|a| {
                groups
                    .saturating_sub(1)
                    .checked_mul(reach)
                    .and_then(|b| a.checked_add(b))
            })
            .and_then(|q| q.checked_add(1))
            .and_then(|q| q.checked_mul(c));
        let fits = reach_end.is_some_and(|end| rows.iter().all(|r| r.len() >= end))
            && init.len() == c
            && rows
                .len()
                .checked_mul(groups)
                .and_then(|v| v.checked_mul(c * QUAD))
                .is_some_and(|n| taps.len() == n);
        if !fits {
            return false;
        }
        for (p, o) in out.chunks_exact_mut(c).enumerate() {
            o.copy_from_slice(init);
            for (r, row) in rows.iter().enumerate() {
                for g in 0..groups {
                    let q0 = (p * stride + g * reach) * c;
                    let t0 = (r * groups + g) * c * QUAD;
                    let (Some(qs), Some(ts)) = (row.get(q0..q0 + c), taps.get(t0..t0 + c * QUAD)) else {
                        continue;
                    };
                    for ((o, &q), t) in o.iter_mut().zip(qs).zip(ts.chunks_exact(QUAD)) {
                        for (j, &t) in t.iter().enumerate() {
                            let b = (q >> (8 * j)) & 0xFF;
                            *o = o.wrapping_add(b as i32 * i32::from(t));
                        }
                    }
                }
            }
        }
        true
    }
}

/// [`QuadBand`]'s requantization of its sums, in f32 as `quant::requantize_pixels_f32` does
/// it (the same fused operations, so the same bytes): `clamp(sum * mult + (bias * mult +
/// zero_point), range)` rounded half to even.
#[derive(Debug, Clone, Copy)]
pub struct QuadRequant<'a> {
    pub bias: &'a [f32],
    pub mult: &'a [f32],
    pub zero_point: f32,
    /// Whole bounds within the output type's.
    pub range: (f32, f32),
}

/// A band of output rows of an 8-bit channels-last depthwise convolution, requantized: the
/// rows packed as quads ([`QuadRow`]), summed four taps to a `vpdpbusd` ([`QuadTaps`]) and
/// requantized ([`QuadRequant`]), one block of 16 channels at a time on AVX-512 VNNI, so a
/// block's packed rows (a ring of the window's rows, each packed once) stay in L1 and its
/// sums never leave registers. Padding is X's zero point (`fill`); `init` is each
/// channel's start (`-code(zero point)` times its sum of taps takes the zero point out).
#[derive(Debug, Clone, Copy)]
pub struct QuadBand<'a> {
    /// One image's bytes, `[h][w][c]`.
    pub x: &'a [u8],
    pub signed: bool,
    pub fill: u8,
    pub input: [usize; 2],
    pub output: [usize; 2],
    pub c: usize,
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    /// Padding before the first row and column.
    pub pad: [usize; 2],
    /// `[kh][groups][c][QUAD]`, as [`pack_quad_taps`] makes them.
    pub taps: &'a [i8],
    pub init: &'a [i32],
    pub requant: QuadRequant<'a>,
}

impl QuadBand<'_> {
    /// Quads of a packed row: the last output pixel's last group.
    fn width(&self) -> Option<usize> {
        let groups = self.kernel[1].div_ceil(QUAD);
        let last = self.output[1].checked_sub(1)?.checked_mul(self.strides[1])?;
        let reach = groups.checked_sub(1)?.checked_mul(QUAD * self.dilations[1])?;
        last.checked_add(reach)?.checked_add(1)
    }

    /// Padded row `oy * sh + ky * dh` as X's row, `None` in the padding.
    fn input_row(&self, oy: usize, ky: usize) -> Option<usize> {
        (oy * self.strides[0] + ky * self.dilations[0])
            .checked_sub(self.pad[0])
            .filter(|&iy| iy < self.input[0])
    }

    /// Output rows `oy0..` into `out` (whole rows of `ow * c`). `false`, writing nothing, when
    /// the operands do not fit the geometry.
    pub fn run<O: crate::quant::Q8 + crate::igemm::Int8>(&self, oy0: usize, out: &mut [O]) -> bool {
        self.run_with(isa::active(), oy0, out)
    }

    /// [`QuadBand::run`] on a given level (only AVX-512 with VNNI has a kernel of its own; the
    /// portable twin packs, sums and requantizes row by row).
    pub fn run_with<O: crate::quant::Q8 + crate::igemm::Int8>(&self, isa: Isa, oy0: usize, out: &mut [O]) -> bool {
        let c = self.c;
        let [h, w] = self.input;
        let [oh, ow] = self.output;
        let [kh, kw] = self.kernel;
        let groups = kw.div_ceil(QUAD);
        let row = ow.saturating_mul(c);
        let fits = c > 0
            && kh > 0
            && kw > 0
            && self.strides.iter().chain(&self.dilations).all(|&v| v > 0)
            && h.checked_mul(w).and_then(|p| p.checked_mul(c)) == Some(self.x.len())
            && row > 0
            && out.len().is_multiple_of(row)
            && oy0.checked_add(out.len() / row).is_some_and(|end| end <= oh)
            && kh
                .checked_mul(groups)
                .and_then(|v| v.checked_mul(c * QUAD))
                .is_some_and(|n| n == self.taps.len())
            && [self.init.len(), self.requant.bias.len(), self.requant.mult.len()] == [c, c, c]
            && self
                .width()
                .is_some_and(|pw| pw.checked_mul(c * QUAD * (kh + 1)).is_some());
        if !fits {
            return false;
        }
        let (lo, hi) = (
            self.requant.range.0.max(O::LO).ceil(),
            self.requant.range.1.min(O::HI).floor(),
        );
        #[cfg(target_arch = "x86_64")]
        if isa.has_int8_dot() {
            // SAFETY: AVX-512 F, BW, VL and VNNI are present (`has_int8_dot`); the checks
            // above are `quads::band`'s contract.
            unsafe { quads::band(self, oy0, O::bytes_mut(out), (lo, hi)) };
            return true;
        }
        let _ = isa;
        let pw = self.width().unwrap_or(0);
        let mut packed = vec![vec![0u32; pw * c]; kh];
        let mut sums = vec![0i32; row];
        for (r, orow) in out.chunks_exact_mut(row).enumerate() {
            for (ky, p) in packed.iter_mut().enumerate() {
                let x = self
                    .input_row(oy0 + r, ky)
                    .and_then(|iy| self.x.get(iy * w * c..(iy + 1) * w * c))
                    .unwrap_or_default();
                let quads = QuadRow {
                    x,
                    signed: self.signed,
                    c,
                    pad: self.pad[1],
                    fill: self.fill,
                    dilation: self.dilations[1],
                };
                quads.pack(p);
            }
            let rows: Vec<&[u32]> = packed.iter().map(|p| &p[..]).collect();
            let dot = QuadTaps {
                rows: &rows,
                taps: self.taps,
                init: self.init,
                groups,
                stride: self.strides[1],
                reach: QUAD * self.dilations[1],
                c,
            };
            dot.run(&mut sums);
            let QuadRequant {
                bias, mult, zero_point, ..
            } = self.requant;
            for (yp, ap) in orow.chunks_exact_mut(c).zip(sums.chunks_exact(c)) {
                for (((o, &a), &b), &m) in yp.iter_mut().zip(ap).zip(bias).zip(mult) {
                    // The vector path's fused steps (`quant::stage_start`), so both levels
                    // round alike.
                    let v = (a as f32).mul_add(m, crate::quant::stage_start(b, m, zero_point));
                    let q = crate::quant::clamp_to(v, lo, hi);
                    *o = O::from_low_byte((q + crate::quant::ROUND).to_bits());
                }
            }
        }
        true
    }
}

#[cfg(target_arch = "x86_64")]
mod quads {
    use super::{QUAD, QuadBand};
    use std::arch::x86_64::*;

    const LANES: usize = 16;

    fn mask(left: usize) -> __mmask16 {
        if left >= LANES {
            0xFFFF
        } else {
            ((1u32 << left) - 1) as __mmask16
        }
    }

    /// Padded column `col`'s quad codes of channels `j0..` (the mask's) as dwords: column `col -
    /// pad` of `x` (`w` pixels of `c` bytes), each byte flipped by `flip`, or `fill` outside.
    ///
    /// # Safety
    /// AVX-512 F and BW are present; `x` holds `w * c` bytes, the mask's channels are below
    /// `c`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn column(
        x: *const u8,
        (w, c, pad): (usize, usize, usize),
        j0: usize,
        m: __mmask16,
        flip: __m128i,
        fill: __m512i,
        col: usize,
    ) -> __m512i {
        match col.checked_sub(pad).filter(|&i| i < w) {
            // SAFETY: column `i < w` of `x`, the mask's channels below `c`.
            Some(i) => unsafe {
                let b = _mm_maskz_loadu_epi8(m, x.add(i * c + j0).cast());
                _mm512_cvtepu8_epi32(_mm_xor_si128(b, flip))
            },
            None => fill,
        }
    }

    /// [`QuadBand::run_with`] on AVX-512 VNNI, output rows `oy0..` into `out` (bytes), one block
    /// of 16 channels at a time: a ring of the window's input rows packed for the block (and
    /// a row of padding), then each output row's pixels summed and requantized in registers.
    ///
    /// # Safety
    /// AVX-512 F, BW, VL and VNNI are present and the band's operands passed
    /// [`QuadBand::run_with`]'s checks for `oy0` and `out`; `(lo, hi)` are whole bounds within
    /// the output type's.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn band(b: &QuadBand<'_>, oy0: usize, out: &mut [u8], (lo, hi): (f32, f32)) {
        let c = b.c;
        let [kh, kw] = b.kernel;
        let sw = b.strides[1];
        let [dh, dw] = b.dilations;
        let ow = b.output[1];
        let w = b.input[1];
        let groups = kw.div_ceil(QUAD);
        // At stride 2 (undilated), only every other column's quad is read: each packed
        // quad holds columns `2k..2k + 3` (`step` 2), half the packing.
        let step = if sw == 2 && dw == 1 { 2 } else { 1 };
        let Some(pw) = b.width().map(|w| (w - 1) / step + 1) else {
            return;
        };
        let rows = out.len() / (ow * c);
        let slots = (kh - 1) * dh + 1;
        // Packed rows of one block: `slots` input rows, then the padding's.
        let mut ring = vec![0u32; (slots + 1) * pw * LANES];
        let mut held = vec![usize::MAX; slots];
        let mut at = vec![0usize; kh];
        let mut rowp: Vec<*const u32> = Vec::with_capacity(kh);
        // The padding's code: in a quad's low byte (a column), in all four (a row of padding).
        let fill = _mm512_set1_epi32(i32::from(super::quad_code(b.fill, b.signed)));
        let fill_row = _mm512_set1_epi32(i32::from_ne_bytes([super::quad_code(b.fill, b.signed); 4]));
        let flip = _mm_set1_epi8(if b.signed { 0x80u8 as i8 } else { 0 });
        let epi = Epilogue {
            lo: _mm512_set1_ps(lo),
            hi: _mm512_set1_ps(hi),
            zero_point: _mm512_set1_ps(b.requant.zero_point),
            round: _mm512_set1_ps(crate::quant::ROUND),
        };
        let x = b.x.as_ptr();
        let r0 = ring.as_mut_ptr();
        let mut j0 = 0;
        while j0 < c {
            let m = mask(c - j0);
            for px in 0..pw {
                // SAFETY: the padding's row, quad `px < pw`.
                unsafe { _mm512_storeu_si512(r0.add((slots * pw + px) * LANES).cast(), fill_row) };
            }
            held.iter_mut().for_each(|v| *v = usize::MAX);
            // SAFETY: the mask's channels of `init`, the requantization's `c` values.
            let (init, start, mult) = unsafe {
                let mult = _mm512_maskz_loadu_ps(m, b.requant.mult.as_ptr().add(j0));
                let bias = _mm512_maskz_loadu_ps(m, b.requant.bias.as_ptr().add(j0));
                (
                    _mm512_maskz_loadu_epi32(m, b.init.as_ptr().add(j0)),
                    crate::quant::stage_start_x16(bias, mult, epi.zero_point),
                    mult,
                )
            };
            for r in 0..rows {
                let oy = oy0 + r;
                for (ky, a) in at.iter_mut().enumerate() {
                    let Some(iy) = b.input_row(oy, ky) else {
                        *a = slots;
                        continue;
                    };
                    let slot = iy % slots;
                    *a = slot;
                    if let Some(hd) = held.get_mut(slot).filter(|hd| **hd != iy) {
                        *hd = iy;
                        // SAFETY: row `iy < h` of X (`h * w * c` bytes), the mask's channels;
                        // the ring's slot `slot < slots` holds `pw` quads of 16 lanes.
                        unsafe {
                            let (row, dims, to) = (x.add(iy * w * c), (w, c, b.pad[1], dw), r0.add(slot * pw * LANES));
                            match (step == 2, b.signed, j0 + LANES <= c) {
                                (false, false, true) => {
                                    pack_block::<false, true>(row, dims, j0, m, (flip, fill), to, pw)
                                }
                                (false, false, false) => {
                                    pack_block::<false, false>(row, dims, j0, m, (flip, fill), to, pw)
                                }
                                (false, true, true) => pack_block::<true, true>(row, dims, j0, m, (flip, fill), to, pw),
                                (false, true, false) => {
                                    pack_block::<true, false>(row, dims, j0, m, (flip, fill), to, pw)
                                }
                                (true, false, true) => {
                                    pack_pairs::<false, true>(row, dims, j0, m, (flip, fill), to, pw)
                                }
                                (true, false, false) => {
                                    pack_pairs::<false, false>(row, dims, j0, m, (flip, fill), to, pw)
                                }
                                (true, true, true) => pack_pairs::<true, true>(row, dims, j0, m, (flip, fill), to, pw),
                                (true, true, false) => {
                                    pack_pairs::<true, false>(row, dims, j0, m, (flip, fill), to, pw)
                                }
                            }
                        };
                    }
                }
                rowp.clear();
                // SAFETY: slot `s <= slots` of the ring's `slots + 1` rows.
                rowp.extend(at.iter().map(|&s| unsafe { r0.add(s * pw * LANES) }.cast_const()));
                let geo = Geometry {
                    rows: &rowp,
                    taps: b.taps.as_ptr(),
                    groups,
                    c,
                    j0,
                    stride: sw / step,
                    reach: QUAD * dw / step,
                };
                // SAFETY: output row `r < rows`, channel `j0 < c`.
                let o = unsafe { out.as_mut_ptr().add(r * ow * c + j0) };
                let mut px = 0;
                // SAFETY (the loops below): pixels `px..px + N <= ow` of the output row `r <
                // rows`, the mask's channels; quads `((px + N - 1) * sw + (groups - 1) *
                // QUAD * dw) / step < pw` of each ring row.
                while px + 8 <= ow {
                    // SAFETY: pixels `px..px + 8 <= ow`, as above.
                    unsafe { pixels::<8>(&geo, px, m, (init, start, mult), &epi, o) };
                    px += 8;
                }
                // The last pixels (fewer than 8) as one group: independent chains hide the
                // `vpdpbusd` latency a pixel at a time would wait on.
                let ops = (init, start, mult);
                // SAFETY: pixels `px..ow`, fewer than 8, as above.
                unsafe {
                    match ow - px {
                        1 => pixels::<1>(&geo, px, m, ops, &epi, o),
                        2 => pixels::<2>(&geo, px, m, ops, &epi, o),
                        3 => pixels::<3>(&geo, px, m, ops, &epi, o),
                        4 => pixels::<4>(&geo, px, m, ops, &epi, o),
                        5 => pixels::<5>(&geo, px, m, ops, &epi, o),
                        6 => pixels::<6>(&geo, px, m, ops, &epi, o),
                        7 => pixels::<7>(&geo, px, m, ops, &epi, o),
                        _ => {}
                    }
                }
            }
            j0 += LANES;
        }
    }

    /// The requantization's constants.
    struct Epilogue {
        lo: __m512,
        hi: __m512,
        zero_point: __m512,
        round: __m512,
    }

    /// One output row's operands for [`pixels`]: the kernel rows' packed rows of the block.
    struct Geometry<'a> {
        rows: &'a [*const u32],
        taps: *const i8,
        groups: usize,
        c: usize,
        j0: usize,
        stride: usize,
        reach: usize,
    }

    /// Output pixels `px..px + N` of the block: summed, requantized, stored at `o` (the row's
    /// channel `j0`) plus `pixel * c`.
    ///
    /// # Safety
    /// As [`band`]'s call sites say.
    #[inline(always)]
    unsafe fn pixels<const N: usize>(
        g: &Geometry<'_>,
        px: usize,
        m: __mmask16,
        (init, start, mult): (__m512i, __m512, __m512),
        e: &Epilogue,
        o: *mut u8,
    ) {
        // SAFETY: the caller's bounds.
        unsafe {
            let mut acc = [init; N];
            for (ky, &row) in g.rows.iter().enumerate() {
                for gi in 0..g.groups {
                    let t = _mm512_maskz_loadu_epi32(m, g.taps.add(((ky * g.groups + gi) * g.c + g.j0) * QUAD).cast());
                    let q0 = row.add((px * g.stride + gi * g.reach) * LANES);
                    for (k, a) in acc.iter_mut().enumerate() {
                        let q = _mm512_loadu_si512(q0.add(k * g.stride * LANES).cast());
                        *a = _mm512_dpbusd_epi32(*a, q, t);
                    }
                }
            }
            for (k, a) in acc.into_iter().enumerate() {
                let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), mult, start);
                let v = _mm512_min_ps(_mm512_max_ps(v, e.lo), e.hi);
                let bits = _mm512_castps_si512(_mm512_add_ps(v, e.round));
                _mm_mask_storeu_epi8(o.add((px + k) * g.c).cast(), m, _mm512_cvtepi32_epi8(bits));
            }
        }
    }

    /// The mask's 16 bytes at `at` as quad codes in dwords (`FULL`: all 16, unmasked).
    ///
    /// # Safety
    /// AVX-512 F and BW are present; the mask's bytes at `at` (all 16 when `FULL`) are
    /// readable.
    #[inline(always)]
    unsafe fn codes<const SIGNED: bool, const FULL: bool>(at: *const u8, m: __mmask16, flip32: __m512i) -> __m512i {
        // SAFETY: the caller's features and bytes.
        unsafe {
            let v = if FULL {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(at.cast()))
            } else {
                _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, at.cast()))
            };
            if SIGNED { _mm512_xor_si512(v, flip32) } else { v }
        }
    }

    /// [`pack_block`] at stride 2 (no dilation): quad `k` of `to` holds padded columns `2k..2k
    /// + 3`, each the last moved down two bytes with two new columns on top.
    ///
    /// # Safety
    /// As [`pack_block`] (its `d` is 1 here).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pack_pairs<const SIGNED: bool, const FULL: bool>(
        x: *const u8,
        (w, c, pad, _): (usize, usize, usize, usize),
        j0: usize,
        m: __mmask16,
        (flip, fill): (__m128i, __m512i),
        to: *mut u32,
        pw: usize,
    ) {
        let dims = (w, c, pad);
        // SAFETY: the mask's channels of `x`'s `w` pixels (columns `2k + 2 - pad` and `2k + 3
        // - pad` below `w` in the middle loop); quads `k < pw` of `to`.
        unsafe {
            let flip32 = _mm512_set1_epi32(0x80);
            let mut q = first_quad(x, dims, j0, m, (flip, fill), 0, 1);
            if pw > 0 {
                _mm512_storeu_si512(to.cast(), q);
            }
            let mut k = 1;
            while k < pw {
                let col = 2 * k + 2;
                let (a, b) = if col >= pad && col + 1 < pad + w {
                    let at = x.add((col - pad) * c + j0);
                    (
                        codes::<SIGNED, FULL>(at, m, flip32),
                        codes::<SIGNED, FULL>(at.add(c), m, flip32),
                    )
                } else {
                    (
                        column(x, dims, j0, m, flip, fill, col),
                        column(x, dims, j0, m, flip, fill, col + 1),
                    )
                };
                let top = _mm512_or_si512(_mm512_slli_epi32::<16>(a), _mm512_slli_epi32::<24>(b));
                q = _mm512_or_si512(_mm512_srli_epi32::<16>(q), top);
                _mm512_storeu_si512(to.add(k * LANES).cast(), q);
                k += 1;
            }
        }
    }

    /// The first quad of a run: padded columns `first + j * step` for `j < 4`, the first in
    /// each dword's low byte.
    ///
    /// # Safety
    /// As [`column`] for each of those columns.
    #[inline(always)]
    unsafe fn first_quad(
        x: *const u8,
        dims: (usize, usize, usize),
        j0: usize,
        m: __mmask16,
        (flip, fill): (__m128i, __m512i),
        first: usize,
        step: usize,
    ) -> __m512i {
        // SAFETY: the caller's contract, column by column.
        unsafe {
            let mut q = _mm512_setzero_si512();
            for j in 0..QUAD {
                q = _mm512_or_si512(q, column(x, dims, j0, m, flip, fill, first + j * step));
                q = _mm512_ror_epi32::<8>(q);
            }
            q
        }
    }

    /// The next quad of a sliding run: `q` moved down a byte, the new column's code on top.
    ///
    /// # Safety
    /// AVX-512 F is present.
    #[inline(always)]
    unsafe fn slide(q: __m512i, top: __m512i) -> __m512i {
        // SAFETY: the caller's features.
        unsafe { _mm512_or_si512(_mm512_srli_epi32::<8>(q), _mm512_slli_epi32::<24>(top)) }
    }

    /// Packs channels `j0..` (the mask's) of one input row (`w` pixels of `c` bytes at `x`)
    /// into `pw` quads of 16 lanes at `to`, as [`QuadRow::pack`](super::QuadRow::pack) does for whole rows: each residue of
    /// the dilation slides on its own, and the columns that enter a quad come from the
    /// padding, then the row (plain loads, no bounds test: `FULL` blocks of 16 channels
    /// unmasked), then the padding again.
    ///
    /// # Safety
    /// AVX-512 F and BW are present; `x` holds `w * c` bytes, the mask's channels are below
    /// `c` (all 16 of them when `FULL`); `to` holds `pw * 16` dwords; `d > 0`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pack_block<const SIGNED: bool, const FULL: bool>(
        x: *const u8,
        (w, c, pad, d): (usize, usize, usize, usize),
        j0: usize,
        m: __mmask16,
        (flip, fill): (__m128i, __m512i),
        to: *mut u32,
        pw: usize,
    ) {
        let dims = (w, c, pad);
        let last = (QUAD - 1) * d;
        // SAFETY: the mask's channels of `x`'s `w` pixels (column `px + last - pad < w` in
        // the middle loop); quads `px < pw` of `to`.
        unsafe {
            let flip32 = _mm512_set1_epi32(0x80);
            for first in 0..d.min(pw) {
                let mut q = first_quad(x, dims, j0, m, (flip, fill), first, d);
                _mm512_storeu_si512(to.add(first * LANES).cast(), q);
                let mut px = first + d;
                while px < pw && px + last < pad {
                    q = slide(q, fill);
                    _mm512_storeu_si512(to.add(px * LANES).cast(), q);
                    px += d;
                }
                while px < pw && px + last < pad + w {
                    let at = x.add((px + last - pad) * c + j0);
                    q = slide(q, codes::<SIGNED, FULL>(at, m, flip32));
                    _mm512_storeu_si512(to.add(px * LANES).cast(), q);
                    px += d;
                }
                while px < pw {
                    q = slide(q, fill);
                    _mm512_storeu_si512(to.add(px * LANES).cast(), q);
                    px += d;
                }
            }
        }
    }
}
