//! Channels-last integer convolutions on the quads micro-tiles without an im2col copy: the
//! depth of a window is ordered `[ky][kx][c]`, so when C is a multiple of four each tap of a
//! pixel is a run of whole quads at one place in X. The micro-tile then reads its eight rows
//! through a table of addresses per tap (a row of padding reads a run of X's zero point)
//! instead of a copied row, and keeps its sums in registers across all taps of a depth
//! block. Other cases (no VNNI, B in pairs, C not a multiple of four) copy the window rows
//! ([`ConvWindow::im2col_row`]) and run the strided product; both give the same bytes.

use super::{
    Data, IgemmError, Int8, KC_QUADS, MAX_EXACT_DEPTH, MR_QUADS, Output, PackedB, Requantize, Tile,
    igemm_requant_serial,
};
use crate::isa::Isa;
use crate::quant::Q8;

/// A channels-last convolution's geometry: X `[batch, h, w, channels]` (each pixel's
/// channels `pixel_stride` apart from the next's), Y `[batch, oh, ow, m]`, the window's depth
/// ordered `[ky][kx][c]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvWindow {
    pub batch: usize,
    pub input: (usize, usize),
    pub channels: usize,
    /// X's values from one pixel to the next: `channels`, or more when the window reads one
    /// group's channels of a grouped convolution's X.
    pub pixel_stride: usize,
    pub kernel: (usize, usize),
    pub output: (usize, usize),
    pub stride: (usize, usize),
    pub dilation: (usize, usize),
    /// Top and left padding (the bottom and right are implied by the output size).
    pub pad: (usize, usize),
}

impl ConvWindow {
    /// Output pixels over the batch.
    pub fn pixels(&self) -> usize {
        self.batch * self.output.0 * self.output.1
    }

    /// Values per window (`kh * kw * c`).
    pub fn depth(&self) -> usize {
        self.kernel.0 * self.kernel.1 * self.channels
    }

    /// X's elements the window reads up to (the last pixel's channels end there).
    pub(super) fn input_len(&self) -> usize {
        match self.batch * self.input.0 * self.input.1 {
            0 => 0,
            pixels => (pixels - 1) * self.pixel_stride + self.channels,
        }
    }

    /// Output pixel `p`'s batch and the input row and column of its window's first tap
    /// (negative in the padding).
    pub fn origin(&self, p: usize) -> (usize, isize, isize) {
        self.cursor_origin(self.cursor(p))
    }

    /// The output pixel `p` as `(batch, row, column)`, for stepping through pixels in order
    /// ([`ConvWindow::advance`]) without a division per pixel.
    pub fn cursor(&self, p: usize) -> (usize, usize, usize) {
        let (oh, ow) = (self.output.0.max(1), self.output.1.max(1));
        (p / (oh * ow), (p / ow) % oh, p % ow)
    }

    /// The output pixel after `cursor`.
    #[inline]
    pub fn advance(&self, (b, oy, ox): (usize, usize, usize)) -> (usize, usize, usize) {
        if ox + 1 < self.output.1 {
            (b, oy, ox + 1)
        } else if oy + 1 < self.output.0 {
            (b, oy + 1, 0)
        } else {
            (b + 1, 0, 0)
        }
    }

    /// [`ConvWindow::origin`] of the pixel at `cursor`.
    #[inline]
    pub fn cursor_origin(&self, (b, oy, ox): (usize, usize, usize)) -> (usize, isize, isize) {
        (
            b,
            (oy * self.stride.0) as isize - self.pad.0 as isize,
            (ox * self.stride.1) as isize - self.pad.1 as isize,
        )
    }

    /// Where in X the tap `(ky, kx)` of the pixel at `origin` ([`ConvWindow::origin`])
    /// starts, or `None` in the padding.
    #[inline]
    pub fn tap(&self, origin: (usize, isize, isize), ky: usize, kx: usize) -> Option<usize> {
        self.tap_at(
            origin,
            ((ky * self.dilation.0) as isize, (kx * self.dilation.1) as isize),
        )
    }

    /// [`ConvWindow::tap`] at the tap's offset from the window's origin (dilation applied).
    #[inline]
    fn tap_at(&self, (b, y0, x0): (usize, isize, isize), (dy, dx): (isize, isize)) -> Option<usize> {
        let (h, w) = self.input;
        let iy = usize::try_from(y0 + dy).ok().filter(|&v| v < h)?;
        let ix = usize::try_from(x0 + dx).ok().filter(|&v| v < w)?;
        Some(((b * h + iy) * w + ix) * self.pixel_stride)
    }

    /// The window row of output pixel `p` (`[ky][kx][c]`, [`ConvWindow::depth`] values), every
    /// value written: X's, or `pad` (X's zero point) outside it.
    pub fn im2col_row<T: Copy>(&self, x: &[T], p: usize, pad: T, dst: &mut [T]) {
        let (c, (kh, kw)) = (self.channels, self.kernel);
        // The pixel's origin once; each tap then adds its offset.
        let origin = self.origin(p);
        // A kernel row whose taps are adjacent pixels (no dilation across, the same pixel
        // stride as channels), all inside X, is one contiguous run of `kw * c` values: one
        // copy. Tap by tap, an image's three channels took a library copy call per tap, nine
        // per pixel of a 3x3 stem.
        let (_, _, x0) = origin;
        let w = self.input.1;
        let row_run = self.dilation.1 == 1
            && self.pixel_stride == c
            && kw > 1
            && x0 >= 0
            && usize::try_from(x0).is_ok_and(|x| x + kw <= w);
        if row_run {
            let run = kw * c;
            for (ky, seg) in dst.chunks_exact_mut(run.max(1)).take(kh).enumerate() {
                // The row's first tap is inside across, so `tap` checks only its row.
                match self.tap(origin, ky, 0).and_then(|at| x.get(at..at + run)) {
                    Some(s) => seg.copy_from_slice(s),
                    None => seg.fill(pad),
                }
            }
            return;
        }
        let mut segs = dst.chunks_exact_mut(c.max(1));
        for ky in 0..kh {
            for kx in 0..kw {
                let Some(seg) = segs.next() else { return };
                match self.tap(origin, ky, kx).and_then(|at| x.get(at..at + c)) {
                    Some(s) => seg.copy_from_slice(s),
                    None => seg.fill(pad),
                }
            }
        }
    }
}

/// Per-thread scratch of [`conv_requant_serial`], kept between calls (contents stale).
#[derive(Debug, Default)]
pub struct ConvScratch<T> {
    sums: Vec<i32>,
    rows: Vec<T>,
    pad: Vec<T>,
    /// The first depth block's `-za * colsum` (`PackedB::quads_init`).
    init: Vec<i32>,
}

impl<T: Clone + Default> ConvScratch<T> {
    /// `sums` i32 and `rows` values of the scratch (stale contents), for callers that run
    /// the product themselves.
    pub fn parts(&mut self, sums: usize, rows: usize) -> (&mut [i32], &mut [T]) {
        (
            crate::recycle::scratch(&mut self.sums, sums),
            crate::recycle::scratch(&mut self.rows, rows),
        )
    }
}

/// The kernel-row run for [`conv_rows_requant_serial`]: on the AMX tiles, a stride-1
/// convolution without dilation across of fewer than 64 channels (wider taps the tiles read
/// from copied windows, or in place in whole chunks; by kernel rows, where the output is too
/// narrow for the padded copy, each pixel's kernel rows are copied out: 129 channels of a
/// 1 x 4 output took twice as long that way) reads each kernel row's `kw * c` values as
/// one run padded to a multiple of 64, when that pads by at most a half or the run is one
/// 64-value chunk (a single channel's 3-wide rows: a tile multiply per kernel row, still
/// several times faster than the VNNI tile on the 3 values). Depends only on the weights'
/// shape and the attributes (B is packed for it once), not on X's size.
pub fn conv_row_run(isa: Isa, win: &ConvWindow) -> Option<usize> {
    let (c, (kh, kw)) = (win.channels, win.kernel);
    let kr = (kw * c).next_multiple_of(64);
    let fits = win.stride == (1, 1)
        && win.dilation.1 == 1
        && c > 0
        && c < 64
        && (2 * kr <= 3 * kw * c || kr == 64)
        && super::on_tiles(isa, 16, kh * kr);
    fits.then_some(kr)
}

/// [`conv_requant_serial`] with B's depth by kernel rows: `[ky][kx * c + ch]`, each kernel
/// row padded with zero weights to `row_run` values ([`conv_row_run`]), read in place from a
/// padded copy of X's rows on the AMX tiles. `Ok(false)` (nothing written) where that path
/// does not run (no tiles, or output rows too narrow for the padded copy): the caller then
/// copies the kernel rows out itself.
#[allow(clippy::too_many_arguments)]
pub fn conv_rows_requant_serial<T: Int8 + Default, O: Int8 + Q8>(
    isa: Isa,
    win: &ConvWindow,
    row_run: usize,
    x: &[T],
    pixels: std::ops::Range<usize>,
    pad: T,
    b: &PackedB,
    scratch: &mut ConvScratch<T>,
    stage: Requantize<'_>,
    y: &mut [O],
    ldy: usize,
) -> Result<bool, IgemmError> {
    let (n, m) = (b.n, pixels.len());
    b.uncentered()?;
    if m == 0 || n == 0 {
        return Ok(true);
    }
    if ldy < n {
        return Err(IgemmError::Short {
            what: "Y's row stride",
            got: ldy,
            want: n,
        });
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if super::on_tiles(isa, 16, b.k) && super::amx::flat_fits(win, Some(row_run)) {
        let stage = stage.checked::<O>(y.len(), (m - 1) * ldy + n, n)?;
        let mut out = Output {
            y: O::bytes_mut(y),
            ldy,
            stage,
        };
        return Ok(super::amx::conv_flat(
            win,
            Some(row_run),
            x,
            pixels,
            pad,
            b,
            &mut scratch.rows,
            &mut out,
        ));
    }
    let _ = (isa, win, row_run, x, pad, scratch, stage, y);
    Ok(false)
}

/// `Y = requantize(conv(X - zx, B))` for output pixels `pixels` of `win` (rows of `y`, `ldy`
/// apart, each B's `n` columns): the integer convolution with the output stage `stage` (see
/// [`Requantize`]), X's zero point `pad` (the value of its padding too). The same bytes as
/// [`igemm_requant_serial`] over the window rows.
#[allow(clippy::too_many_arguments)]
pub fn conv_requant_serial<T: Int8 + Default, O: Int8 + Q8>(
    isa: Isa,
    win: &ConvWindow,
    x: &[T],
    pixels: std::ops::Range<usize>,
    pad: T,
    b: &PackedB,
    scratch: &mut ConvScratch<T>,
    stage: Requantize<'_>,
    y: &mut [O],
    ldy: usize,
) -> Result<(), IgemmError> {
    let (k, n, m) = (win.depth(), b.n, pixels.len());
    b.uncentered()?;
    if k != b.k {
        return Err(IgemmError::Depth { m, k, bk: b.k, n });
    }
    for (what, got, want) in [
        ("X's pixel stride", win.pixel_stride, win.channels),
        ("Y's row stride", ldy, n),
    ] {
        if got < want {
            return Err(IgemmError::Short { what, got, want });
        }
    }
    if x.len() < win.input_len() {
        return Err(IgemmError::Short {
            what: "X",
            got: x.len(),
            want: win.input_len(),
        });
    }
    if pixels.end > win.pixels() {
        return Err(IgemmError::Short {
            what: "the output pixels",
            got: win.pixels(),
            want: pixels.end,
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let sums = crate::recycle::scratch(&mut scratch.sums, m * n);
    let c = win.channels;
    // On AMX with whole 64-channel chunks per tap and output rows of at least one whole
    // block of 32 pixels: the tiles read the windows in place, a row at a time. Narrower rows
    // would leave most of each tile empty (7 of 16 rows of a 7x7 map); their im2col rows
    // below fill whole tiles across output rows.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if super::on_tiles(isa, m, k) && super::amx::flat_fits(win, None) {
        let stage = stage.checked::<O>(y.len(), (m - 1) * ldy + n, n)?;
        let mut out = Output {
            y: O::bytes_mut(y),
            ldy,
            stage,
        };
        if super::amx::conv_flat(win, None, x, pixels.clone(), pad, b, &mut scratch.rows, &mut out) {
            return Ok(());
        }
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if super::on_tiles(isa, m, k) && c.is_multiple_of(64) && win.output.1 >= 32 {
        let stage = stage.checked::<O>(y.len(), (m - 1) * ldy + n, n)?;
        let mut out = Output {
            y: O::bytes_mut(y),
            ldy,
            stage,
        };
        if super::amx::conv(win, x, pixels.clone(), pad, b, sums, &mut scratch.rows, &mut out) {
            return Ok(());
        }
    }
    // On AMX the rows are copied and multiplied on the tiles (which load A with one stride)
    // when each tap's channels are a long run to copy and the columns many; windows of few
    // channels (a stem's folded rows), or few columns to share each copy (PP-OCR's 96 -> 24
    // 3x3: 1.7 ms on VNNI, 2.2 on the tiles), are read in place by the VNNI micro-tiles.
    let tiles = super::on_tiles(isa, m, k) && c >= 64 && n >= 64;
    let gather = isa.has_int8_dot()
        && !tiles
        && matches!(b.data, Data::Quads(_))
        && c.is_multiple_of(4)
        && c > 0
        && k <= MAX_EXACT_DEPTH;
    if !gather {
        // On the tiles each copied row starts on a cache line (its pitch a whole number of
        // 64-byte chunks; the tiles copy a row's last partial chunk zero-padded themselves).
        let pitch = if tiles { k.next_multiple_of(64) } else { k };
        let rows = crate::recycle::scratch_lined(&mut scratch.rows, m * pitch);
        for (p, row) in pixels.clone().zip(rows.chunks_exact_mut(pitch.max(1))) {
            win.im2col_row(x, p, pad, row.get_mut(..k).unwrap_or_default());
        }
        return igemm_requant_serial(isa, (m, k), rows, pitch, pad.widen(), b, sums, stage, y, ldy);
    }
    let stage = stage.checked::<O>(y.len(), (m - 1) * ldy + n, n)?;
    let pad_row = crate::recycle::scratch(&mut scratch.pad, c);
    pad_row.fill(pad);
    let mut out = Output {
        y: O::bytes_mut(y),
        ldy,
        stage,
    };
    b.quads_init(pad.widen().wrapping_add(T::OFFSET), &mut scratch.init);
    let init = &scratch.init;
    let (quads_per_tap, taps) = (c / 4, win.kernel.0 * win.kernel.1);
    let per_block = (KC_QUADS / 4 / quads_per_tap).max(1);
    let kw = win.kernel.1.max(1);
    // Each tap's offset from its window's origin, as (rows, columns) and in bytes: windows
    // wholly inside X (most of them) then find each tap's address by one addition, no
    // bounds to check.
    let (h, w) = win.input;
    let pixel_bytes = win.pixel_stride * std::mem::size_of::<T>();
    let offsets: Vec<((isize, isize), usize)> = (0..taps)
        .map(|t| {
            let (dy, dx) = ((t / kw) * win.dilation.0, (t % kw) * win.dilation.1);
            // Saturating: a window larger than X is never `inside`, its bytes never used.
            let bytes = dy.saturating_mul(w).saturating_add(dx).saturating_mul(pixel_bytes);
            ((dy as isize, dx as isize), bytes)
        })
        .collect();
    let ((last_y, last_x), _) = offsets.last().copied().unwrap_or_default();
    let inside =
        |(_, y0, x0): (usize, isize, isize)| y0 >= 0 && x0 >= 0 && y0 + last_y < h as isize && x0 + last_x < w as isize;
    let base = x.as_ptr().cast::<u8>();
    let pad_ptr = pad_row.as_ptr().cast::<u8>();
    let mut table: Vec<[*const u8; MR_QUADS]> = vec![[pad_ptr; MR_QUADS]; per_block.min(taps)];
    for t0 in (0..taps).step_by(per_block) {
        let t1 = (t0 + per_block).min(taps);
        let (q0, q1) = (t0 * quads_per_tap, t1 * quads_per_tap);
        let table = table.get_mut(..t1 - t0).unwrap_or_default();
        let block = offsets.get(t0..t1).unwrap_or_default();
        let mut cursor = win.cursor(pixels.start);
        for m0 in (0..m).step_by(MR_QUADS) {
            let rows = (m - m0).min(MR_QUADS);
            // A whole tile of pixels along one output row, every window inside X: row `r`'s
            // taps are row 0's plus `r` strides, which the kernel adds itself (`STRIDED`):
            // one address per tap.
            let (batch, oy, ox) = cursor;
            let first = win.cursor_origin(cursor);
            let (_, _, last_x0) = win.cursor_origin((batch, oy, ox + rows - 1));
            let strided =
                rows == MR_QUADS && ox + rows <= win.output.1 && inside(first) && inside((batch, first.1, last_x0));
            if strided {
                let (_, y0, x0) = first;
                let at = ((batch * h + y0.unsigned_abs()) * w + x0.unsigned_abs()) * pixel_bytes;
                for (&(_, off), entry) in block.iter().zip(table.iter_mut()) {
                    if let Some(slot) = entry.first_mut() {
                        *slot = base.wrapping_add(at + off);
                    }
                }
                for _ in 0..rows {
                    cursor = win.advance(cursor);
                }
            }
            for r in 0..MR_QUADS {
                if strided {
                    break;
                }
                let origin = (r < rows).then(|| {
                    let o = win.cursor_origin(cursor);
                    cursor = win.advance(cursor);
                    o
                });
                if let Some(o @ (b, y0, x0)) = origin
                    && inside(o)
                {
                    // The whole window is in X (`inside`): its first pixel and every tap's
                    // offset from it stay within `input_len` values, checked above.
                    let first = ((b * h + y0.unsigned_abs()) * w + x0.unsigned_abs()) * pixel_bytes;
                    for (&(_, off), entry) in block.iter().zip(table.iter_mut()) {
                        if let Some(slot) = entry.get_mut(r) {
                            *slot = base.wrapping_add(first + off);
                        }
                    }
                    continue;
                }
                for (&(off, _), entry) in block.iter().zip(table.iter_mut()) {
                    let at = origin.and_then(|o| win.tap_at(o, off));
                    // `tap` is within X (it checks the pixel against the input size, and X
                    // holds `input_len` values, checked above): `wrapping_add` then stays in
                    // X's allocation; padding rows read the pad row.
                    if let Some(slot) = entry.get_mut(r) {
                        *slot = at.map_or(pad_ptr, |at| base.wrapping_add(at * std::mem::size_of::<T>()));
                    }
                }
            }
            let Some(cpart) = sums.get_mut(m0 * n..) else {
                continue;
            };
            let tile = Tile {
                rows,
                cols: n,
                ldc: n,
                init: (t0 == 0).then_some(&init[..]),
            };
            let fin = if t1 == taps { out.tile(m0, 0, 0, n) } else { None };
            // SAFETY: every table entry is X's address of a pixel's tap (`tap_at`, within X
            // as said above) or the pad row's, each followed by the tap's `c` values =
            // `quads_per_tap` whole quads; strided, each tap's first entry is row 0's, and
            // row `r`'s tap `r * sw` pixels on is inside X too (`inside` of the tile's last
            // window, on the same row); `micro_rows` checks B's strip.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                super::vnni::micro_rows(
                    table,
                    (if strided { win.stride.1 * pixel_bytes } else { 0 }, 4),
                    quads_per_tap,
                    T::OFFSET != 0,
                    b.quad_strip(q0, q1),
                    cpart,
                    tile,
                    fin,
                );
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (tile, fin, q0, q1, cpart);
        }
    }
    Ok(())
}
