//! Depthwise 2-D convolution in f32 (`group == channels`, one filter per channel): a direct
//! loop per channel (channels in parallel over the current pool), kernel row and kernel column
//! over contiguous output rows of a zero-padded, stride-phased copy of the input plane, which
//! the compiler vectorises, instead of a GEMM of one row per group. Bias first, then the taps
//! in kernel order, then the activation on the SIMD kernels (`act_slice`).

use kiln_kernels::dwconv::{Clamp, Pixels};
use kiln_kernels::recycle::{ScratchKey, lend};
use kiln_kernels::sgemm::{Act, act_slice};

/// Shape of one depthwise call (all spatial values per axis: height, width).
pub(crate) struct Depthwise {
    pub channels: usize,
    pub input: [usize; 2],
    pub output: [usize; 2],
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pad_begin: [usize; 2],
}

impl Depthwise {
    /// `y = act(bias + conv(x, w))` for one image: `x` is `[C, H, W]`, `w` is `[C, kh, kw]`,
    /// `y` is `[C, OH, OW]`. Returns `false` when a slice does not match the shape.
    pub fn run(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, act: Option<Act>, y: &mut [f32]) -> bool {
        let [ih, iw] = self.input;
        let [oh, ow] = self.output;
        let [kh, kw] = self.kernel;
        let (ip, op, kp) = (ih * iw, oh * ow, kh * kw);
        let c = self.channels;
        if x.len() != c * ip || w.len() != c * kp || y.len() != c * op || bias.is_some_and(|b| b.len() != c) {
            return false;
        }
        if op == 0 {
            return true;
        }
        // Channels in parallel over the current pool: each output plane is its own chunk.
        kiln_kernels::pool::for_each_chunk_mut(y, op, &|ch, out| {
            // The lengths were checked above: channel `ch < c` has its input plane, taps and bias.
            self.channel(
                &x[ch * ip..(ch + 1) * ip],
                &w[ch * kp..(ch + 1) * kp],
                bias.map_or(0.0, |b| b[ch]),
                out,
            );
            if let Some(a) = act {
                act_slice(a, out);
            }
        });
        true
    }

    /// One channel: `out` (`oh x ow`) = bias + the window sums over `xin` (`ih x iw`) with
    /// the `kh x kw` taps `wk`.
    ///
    /// The input plane is first copied, zero-padded along its rows and split into `sw`
    /// phases (`phase[r][i] = padded[i * sw + r]`), so that every tap reads a contiguous run
    /// of a phase row whatever the stride: output row `oy`, tap `(ky, kx)` adds
    /// `w * phase[(kx dw) % sw][iy][ox + (kx dw) / sw]` for `ox < ow`. Rows of the kernel
    /// falling in the vertical padding are skipped.
    fn channel(&self, xin: &[f32], wk: &[f32], bias: f32, out: &mut [f32]) {
        let ih = self.input[0];
        let ow = self.output[1];
        let kw = self.kernel[1];
        let sw = self.strides[1].max(1);
        let dw = self.dilations[1];
        out.fill(bias);
        if ow == 0 || kw == 0 {
            return;
        }
        // Output rows are computed 16 columns at a time (whole vectors, no scalar tail) into
        // `acc`, over phase rows long enough for the rounded-up width; the extra columns read
        // zeros and are dropped.
        const L: usize = 16;
        let owp = ow.next_multiple_of(L);
        let plen = ((owp - 1) * sw + (kw - 1) * dw + 1).div_ceil(sw);
        let mut buf = lend::<Plane>();
        buf.clear();
        buf.resize(ih * sw * plen + owp, 0.0);
        let (planes, acc) = buf.split_at_mut(ih * sw * plen);
        // Compiled for the active level (the body is always inlined there).
        kiln_kernels::simd::vectorize_kernel(ChannelRows {
            dw: self,
            xin,
            wk,
            bias,
            out,
            planes,
            acc,
            plen,
        });
    }

    /// The loops of [`Self::channel`] (see there), always inlined into its vectorised caller.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn channel_rows(
        &self,
        xin: &[f32],
        wk: &[f32],
        bias: f32,
        out: &mut [f32],
        planes: &mut [f32],
        acc: &mut [f32],
        plen: usize,
    ) {
        let [ih, iw] = self.input;
        let [oh, ow] = self.output;
        let [kh, kw] = self.kernel;
        let [sh, sw] = self.strides;
        let [dh, dw] = self.dilations;
        let [ph, pw] = self.pad_begin;
        let sw = sw.max(1);
        let owp = acc.len();
        for (iy, src) in xin.chunks_exact(iw.max(1)).take(ih).enumerate() {
            let rows = &mut planes[iy * sw * plen..(iy + 1) * sw * plen];
            for (r, dst) in rows.chunks_exact_mut(plen).enumerate() {
                if sw == 1 {
                    // Columns pw .. pw + iw of the padded row are the input row.
                    let lo = pw.min(plen);
                    let hi = (pw + iw).min(plen);
                    if hi > lo {
                        dst[lo..hi].copy_from_slice(&src[..hi - lo]);
                    }
                } else {
                    // Phase r holds padded columns k*sw + r, i.e. input columns
                    // x = k*sw + r - pw: from the first k with x >= 0, every sw-th one.
                    let k0 = pw.saturating_sub(r).div_ceil(sw);
                    let x0 = (k0 * sw + r).saturating_sub(pw);
                    if let (Some(d), Some(sv)) = (dst.get_mut(k0..), src.get(x0..)) {
                        for (d, &v) in d.iter_mut().zip(sv.iter().step_by(sw)) {
                            *d = v;
                        }
                    }
                }
            }
        }
        // The taps of one output row: (start of the phase-row run, weight).
        let mut taps: Vec<(usize, f32)> = Vec::with_capacity(kh * kw);
        for (oy, out_row) in out.chunks_exact_mut(ow).take(oh).enumerate() {
            taps.clear();
            for ky in 0..kh {
                let iy = (oy * sh + ky * dh) as isize - ph as isize;
                if iy < 0 || iy >= ih as isize {
                    continue;
                }
                let base = iy as usize * sw * plen;
                for kx in 0..kw {
                    let t = kx * dw;
                    taps.push((base + (t % sw) * plen + t / sw, wk[ky * kw + kx]));
                }
            }
            // 16 output columns at a time, accumulated in registers over all taps.
            for (cb, out16) in acc.chunks_exact_mut(16).enumerate().take(owp / 16) {
                let mut t = [bias; 16];
                for &(start, w) in &taps {
                    let o = start + cb * 16;
                    if let Some(Ok(v)) = planes.get(o..o + 16).map(<&[f32; 16]>::try_from) {
                        let v = *v;
                        for i in 0..16 {
                            t[i] += w * v[i];
                        }
                    }
                }
                out16.copy_from_slice(&t);
            }
            out_row.copy_from_slice(&acc[..ow]);
        }
    }
}

/// The arguments of [`Depthwise::channel_rows`], run by `vectorize_kernel`.
struct ChannelRows<'a> {
    dw: &'a Depthwise,
    xin: &'a [f32],
    wk: &'a [f32],
    bias: f32,
    out: &'a mut [f32],
    planes: &'a mut [f32],
    acc: &'a mut [f32],
    plen: usize,
}

impl kiln_kernels::simd::Kernel for ChannelRows<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        self.dw
            .channel_rows(self.xin, self.wk, self.bias, self.out, self.planes, self.acc, self.plen);
    }
}

kiln_kernels::scratch_kinds! {
    /// The padded, phase-split input plane of [`Depthwise::channel`] (a run state's scratch,
    /// per thread).
    Plane: Vec<f32>;
}

/// Multiply-adds below which a channels-last depthwise layer runs on one thread.
pub(super) const DW_PAR_MIN_MACS: usize = 1 << 19;

/// Output rows per band of a depthwise layer of `oh` rows and `macs` multiply-adds split
/// over the current pool: all of them (one band, on the calling thread) below `serial_macs`
/// or on one thread, else `per_thread` bands a thread.
pub(super) fn row_band(oh: usize, macs: usize, serial_macs: usize, per_thread: usize) -> usize {
    let threads = kiln_kernels::pool::current_threads().max(1);
    if macs < serial_macs || threads == 1 {
        oh
    } else {
        oh.div_ceil(per_thread.max(1) * threads)
    }
}

/// ReLU and Clip as the bounds the depthwise kernel applies before its stores; any other
/// activation is returned to run over the output after.
pub(super) fn split_act(act: Option<Act>) -> (Clamp, Option<Act>) {
    match act {
        None => (Clamp::NONE, None),
        Some(Act::Relu) => (
            Clamp {
                lo: 0.0,
                hi: f32::INFINITY,
            },
            None,
        ),
        Some(Act::Clip { min, max }) => (
            Clamp {
                lo: min.unwrap_or(f32::NEG_INFINITY),
                hi: max.unwrap_or(f32::INFINITY),
            },
            None,
        ),
        Some(a) => (Clamp::NONE, Some(a)),
    }
}

// Tested against the generic convolution computed in f64 over strides, dilations, asymmetric
// pads and kernels wider than the image: `conv.rs`, `depthwise_path_matches_the_gemm_path`.

/// The window lists of [`Depthwise::nhwc_row`]: kernel rows inside the input, the interior
/// window, one border pixel's window. Lent once per band of rows (a lend per row cost as much
/// as a 16-channel row's sums).
#[derive(Default)]
pub(super) struct RowWindows {
    rows: Vec<usize>,
    interior: Vec<(usize, usize)>,
    window: Vec<(usize, usize)>,
}

impl ScratchKey for RowWindows {
    type Value = RowWindows;
}

impl Depthwise {
    /// `y = post(act(bias + conv(x, w)))` for one channels-last image: `x` is `[H, W, C]`, `taps`
    /// is `[kh * kw, C]` (tap-major: W transposed), `y` is `[OH, OW, C]`. Output rows in
    /// parallel over the current pool; each pixel's channels from `kiln_kernels::dwconv`
    /// (bias, then the window's taps inside the input in kernel order). Returns `false` when
    /// a slice does not match the shape.
    pub fn run_nhwc(
        &self,
        x: &[f32],
        taps: &[f32],
        bias: Option<&[f32]>,
        (act, post): (Option<Act>, Option<kiln_kernels::sgemm::Affine>),
        y: &mut [f32],
    ) -> bool {
        let [ih, iw] = self.input;
        let [oh, ow] = self.output;
        let [kh, kw] = self.kernel;
        let c = self.channels;
        if x.len() != ih * iw * c
            || taps.len() != kh * kw * c
            || y.len() != oh * ow * c
            || bias.is_some_and(|b| b.len() != c)
        {
            return false;
        }
        if y.is_empty() {
            return true;
        }
        let (clamp, after) = split_act(act);
        let failed = std::sync::atomic::AtomicBool::new(false);
        // A small layer runs on the calling thread: split, it ran slower than alone
        // (MobileNet-v2's 7x7x960 layers, 27 -> 40 us on 2 threads: the fork-join, and half
        // of an input the previous GEMM wrote split by columns coming from the other core).
        // Otherwise bands of rows, a few per thread.
        let band = row_band(oh, oh * ow * c * kh * kw, DW_PAR_MIN_MACS, 4);
        let rows = |b: usize, rows: &mut [f32]| {
            let mut scratch = lend::<RowWindows>();
            for (r, row) in rows.chunks_mut(ow * c).enumerate() {
                if !self.nhwc_row(&mut scratch, x, |iy| iy, taps, bias, clamp, b * band + r, row) {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                if let Some(a) = after {
                    act_slice(a, row);
                }
                if let Some(p) = post {
                    p.apply_slice(row);
                }
            }
        };
        if band >= oh {
            rows(0, y);
        } else {
            kiln_kernels::pool::for_each_chunk_mut(y, band * ow * c, &rows);
        }
        !failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One output row of [`Self::run_nhwc`]: per pixel, the window's (input, tap) offsets for
    /// `kiln_kernels::dwconv::Pixels` ([`Self::row_spans`]). Input row `iy` is row
    /// `row_of(iy)` of `x` (`[rows, W, C]`): the image itself, or a ring of its rows. `false`
    /// when the kernel refused an offset (shapes inconsistent).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nhwc_row(
        &self,
        scratch: &mut RowWindows,
        x: &[f32],
        row_of: impl Fn(usize) -> usize,
        taps: &[f32],
        bias: Option<&[f32]>,
        clamp: Clamp,
        oy: usize,
        row: &mut [f32],
    ) -> bool {
        let c = self.channels;
        self.row_spans(scratch, row_of, oy, |span| {
            let Some(out) = row.get_mut(span.pixels.start * c..span.pixels.end * c) else {
                return false;
            };
            Pixels {
                x,
                w: taps,
                bias,
                window: span.window,
                base: span.base,
                step: span.step,
                c,
                clamp,
            }
            .run(out)
        })
    }

    /// Output row `oy`'s pixels as runs that share a window of (input, tap) offsets, each
    /// given to `each` in turn: interior pixels (every column tap inside the input) in one
    /// run, pixel `p` at input offset `base + p * step`; border pixels one by one, their
    /// window the taps inside the input, offsets from the input's start. Input row `iy` is
    /// row `row_of(iy)` of the input (`[rows, W, C]`). `false` when `each` refused a run
    /// (every run is still offered).
    pub(super) fn row_spans(
        &self,
        scratch: &mut RowWindows,
        row_of: impl Fn(usize) -> usize,
        oy: usize,
        mut each: impl FnMut(RowSpan<'_>) -> bool,
    ) -> bool {
        let [ih, iw] = self.input;
        let [kh, kw] = self.kernel;
        let [sh, sw] = self.strides;
        let [dh, dw] = self.dilations;
        let [ph, pw] = self.pad_begin;
        let c = self.channels;
        // The window lists live in the caller's buffers, reused row after row.
        let RowWindows { rows, interior, window } = scratch;
        rows.clear();
        rows.extend((0..kh).filter(|&ky| {
            let iy = (oy * sh + ky * dh) as isize - ph as isize;
            iy >= 0 && (iy as usize) < ih
        }));
        let in_row = |ky: usize| row_of((oy * sh + ky * dh).saturating_sub(ph));
        // Interior columns: ox*sw >= pw and ox*sw - pw + (kw-1)*dw < iw.
        let span = (kw.max(1) - 1) * dw;
        let lo = pw.div_ceil(sw.max(1));
        let hi = if iw + pw > span {
            (iw + pw - span - 1) / sw.max(1) + 1
        } else {
            0
        };
        let (lo, hi) = (lo.min(self.output[1]), hi.clamp(lo.min(self.output[1]), self.output[1]));
        // Interior window: (input offset relative to the pixel's first column, tap offset).
        interior.clear();
        interior.extend(
            rows.iter()
                .flat_map(|&ky| (0..kw).map(move |kx| ((in_row(ky) * iw + kx * dw) * c, (ky * kw + kx) * c))),
        );
        let mut ok = true;
        let ow = self.output[1];
        // The interior pixels in one run: bases `(ox*sw - pw) * c` step `sw * c`.
        if hi > lo {
            ok &= each(RowSpan {
                pixels: lo..hi,
                window: interior,
                base: (lo * sw - pw) * c,
                step: sw * c,
            });
        }
        for ox in (0..lo).chain(hi.max(lo)..ow) {
            window.clear();
            for &ky in rows.iter() {
                for kx in 0..kw {
                    let ix = (ox * sw + kx * dw) as isize - pw as isize;
                    if ix >= 0 && (ix as usize) < iw {
                        window.push(((in_row(ky) * iw + ix as usize) * c, (ky * kw + kx) * c));
                    }
                }
            }
            ok &= each(RowSpan {
                pixels: ox..ox + 1,
                window,
                base: 0,
                step: 0,
            });
        }
        ok
    }
}

/// A run of one output row's pixels sharing a window ([`Depthwise::row_spans`]): pixel
/// `p` of the run (output column `pixels.start + p`) reads the input at `base + p * step`
/// plus each input offset of `window`, with the taps at its tap offsets.
pub(super) struct RowSpan<'w> {
    pub pixels: std::ops::Range<usize>,
    pub window: &'w [(usize, usize)],
    pub base: usize,
    pub step: usize,
}
