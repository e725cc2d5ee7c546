//! The integer GEMM on AMX tiles (x86-64 Linux with AMX-TILE and AMX-INT8): blocks of 32 rows
//! by one [`NR_QUADS`]-column panel of B accumulated in four 16 x 16 i32 tiles, each step
//! multiplying two 16-row tiles of A (64 depths each) by the panel's two 16-column halves with
//! `tdpbusd` (u8 A) or `tdpbssd` (i8 A): 16 x 16 x 64 multiply-adds per instruction, against
//! 16 x 4 for one `vpdpbusd`.
//!
//! B is read as [`PackedB`](super::PackedB)'s quads hold it: a panel's depth quad `q` is a
//! 128-byte row (32 columns x 4 depths), so a B tile is 16 such rows (128 bytes apart)
//! starting at byte 0 (columns 0-15) or 64 (columns 16-31) of the panel's quad. A's whole
//! 64-deep chunks are loaded in place (16 rows `lda` apart); a depth's last partial chunk,
//! and every chunk of a block of other than 16 or 32 rows, are copied zero-padded first, so
//! whatever the last chunk reads of B past the panel's depth (the next panel's quads, or the
//! packed data's zero tail, [`QUADS_TAIL`](super::QUADS_TAIL)) adds nothing. A keeps its own
//! type: i8 A is multiplied as signed (`tdpbssd`), so A's zero point folds in as it is, `-za *
//! colsum` (no offset to u8 as on VNNI). Blocks stored straight into C (whole, the product
//! unfused) start their tiles from those values (loaded with a row stride of 0); a fused
//! product's blocks, and the others, go through an L1 scratch tile from zeroed tiles (a
//! stride-0 load costs as much as a data tile's: a quarter of a 64-deep block's tile time),
//! and each block's epilogue (the requantization, [`vnni::requant_panel`](super::vnni), or
//! the copy into C) adds them, after the next block's products are issued.
//!
//! Sums are exact as on VNNI: the tile multiplies add each lane's four products into its i32
//! without saturating (see the module docs of [`super`] for the depth bound).
//!
//! The tile state: Linux hands it to a process that asks ([`request_tile_state`], once, at
//! detection: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); each call here loads
//! the tile configuration on its thread and releases the tiles when done ([`Tiles`]), so a
//! thread holds AMX state only while it multiplies.

use super::{B_BLOCK_BYTES, Data, Int8, NR_QUADS, Output, Product};
use std::arch::asm;
use std::ops::Range;

/// Rows of one A tile (and of one C tile).
const TILE_ROWS: usize = 16;
/// Depth quads one tile multiply covers: a 64-byte row of A.
const TILE_QUADS: usize = 16;
/// Rows of one block: two A tiles.
const BLOCK_ROWS: usize = 2 * TILE_ROWS;
/// Bytes of one chunk of a B panel: 16 quads of 128 bytes.
const B_CHUNK: usize = TILE_QUADS * 4 * NR_QUADS;
/// How far ahead of the tile loads B is prefetched, in chunks (1, 2, 4 and 8 measured on
/// twelve chained 960-channel 1x1 convolutions, whose 11 MB of weights stream from L3: 2
/// about 8% faster than none, 8 slower).
const PREFETCH_CHUNKS: usize = 2;

/// Asks Linux for this process' AMX tile data state; whether it was granted (false on a kernel
/// without AMX support). The grant is process-wide and covers threads started before it.
pub(crate) fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` only changes which
    // extended states the process may use; it reads and writes no memory of ours. The
    // `syscall` instruction clobbers rcx and r11 (declared) and returns in rax.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// The tile configuration `ldtilecfg` reads (palette 1): tiles 0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// This thread's tiles, configured (tmm0-3: C, tmm4-5: A, tmm6-7: B) until dropped, when they
/// are released.
struct Tiles;

impl Tiles {
    fn configure() -> Tiles {
        let mut cfg = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for (c, r) in cfg.colsb.iter_mut().zip(cfg.rows.iter_mut()).take(8) {
            *c = 64;
            *r = TILE_ROWS as u8;
        }
        // SAFETY: `ldtilecfg` reads the 64 bytes of `cfg` (a valid palette-1 configuration,
        // aligned as the instruction wants); callers reach here only when
        // `Isa::has_int8_tiles` said the CPU has AMX and the OS granted its state.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg as *const Config, options(nostack, readonly)) };
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releases this thread's tile state, configured by `configure`; touches no
        // memory.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// B's quads as the tiles read them, and the per-column start `-za * colsum`.
struct Panels<'a> {
    data: &'a [i8],
    /// Bytes from one panel to the next.
    stride: usize,
    /// 64-deep chunks of the depth.
    chunks: usize,
    /// `-za * colsum`, padded to whole panels.
    init: Vec<i32>,
    /// Panels per column block: one depth's worth of B for them stays in L2 while every block
    /// of rows reads it.
    per_block: usize,
}

impl<'a> Panels<'a> {
    /// B's panels for A's zero point `za`; `None` when B is not in quads or its data does not
    /// cover the tiles' reads (a panel's last chunk read whole).
    fn of(b: &'a super::PackedB, za: i32) -> Option<Panels<'a>> {
        let Data::Quads(data) = &b.data else { return None };
        let kq = b.k.div_ceil(4);
        let chunks = kq.div_ceil(TILE_QUADS);
        let stride = kq * 4 * NR_QUADS;
        let panels = b.n.div_ceil(NR_QUADS);
        if chunks == 0 || panels == 0 || data.len() < (panels - 1) * stride + chunks * B_CHUNK {
            return None;
        }
        let mut init = Vec::new();
        b.quads_init(za, &mut init);
        Some(Panels {
            data,
            stride,
            chunks,
            init,
            per_block: (B_BLOCK_BYTES / stride.max(1)).max(1),
        })
    }
}

/// Where a run of blocks writes: C (`ldc` apart; its first column is B's column `first`)
/// and, fused, Y.
struct Sink<'c, 'o, 'y, 'r, 'i> {
    c: &'c mut [i32],
    ldc: usize,
    first: usize,
    out: Option<&'o mut Output<'y, 'r>>,
    /// B's `-za * colsum` by column ([`Panels::init`]): what a block through a scratch tile,
    /// whose tiles started from zero, gets added in its epilogue.
    init: &'i [i32],
}

/// Columns of a scratch slot: two adjacent panels' blocks, whose epilogue is one call.
const SCRATCH_COLS: usize = super::vnni::PANELS_PER_CALL * NR_QUADS;

/// Two blocks' sums (adjacent panels, the same rows), 32 rows of [`SCRATCH_COLS`] i32, on a
/// cache line (a tile's 64-byte rows across two lines would cost a second line each).
#[repr(C, align(64))]
struct TileBuf([i32; BLOCK_ROWS * SCRATCH_COLS]);

/// Blocks of rows multiplied panel by panel, each block's epilogue run after the next
/// block's products are issued (the tiles' stores are still draining; the epilogue, vector
/// code, then runs beside the next products instead of waiting for them).
struct Runner {
    signed: bool,
    /// Fused products' blocks, and blocks that are not whole tiles of C, go through one of two
    /// scratch tiles, alternating.
    scratch: [TileBuf; 2],
    slot: usize,
    pending: Option<Done>,
}

impl Runner {
    fn new(signed: bool) -> Runner {
        Runner {
            signed,
            scratch: [
                TileBuf([0; BLOCK_ROWS * SCRATCH_COLS]),
                TileBuf([0; BLOCK_ROWS * SCRATCH_COLS]),
            ],
            slot: 0,
            pending: None,
        }
    }

    /// Rows `m0..m0 + rows` (at most [`BLOCK_ROWS`]) of C, columns of panels `panels` (cut at
    /// B's column `n`): A's chunks are `a` (row 0's 64 bytes of each chunk and the block's
    /// row stride, in B's chunk order).
    ///
    /// # Safety
    /// The tiles are configured; for each entry `(ptr, lda)` of `a`, 16 rows (32 when `rows >
    /// 16`) of 64 bytes `lda` apart are readable from `ptr`.
    unsafe fn block_row(
        &mut self,
        b: &Panels<'_>,
        a: &[(*const u8, usize)],
        (m0, rows): (usize, usize),
        (panels, n): (Range<usize>, usize),
        sink: &mut Sink<'_, '_, '_, '_, '_>,
        flat: Option<FlatRows>,
    ) {
        if a.len() != b.chunks || rows == 0 || rows > BLOCK_ROWS {
            return;
        }
        let two = rows > TILE_ROWS;
        for p in panels {
            let j0 = p * NR_QUADS;
            let cols = n.saturating_sub(j0).min(NR_QUADS);
            if cols == 0 {
                break;
            }
            let (Some(panel), Some(start), Some(at)) = (
                b.data.get(p * b.stride..p * b.stride + b.chunks * B_CHUNK),
                b.init.get(j0..j0 + NR_QUADS),
                (m0 * sink.ldc + j0).checked_sub(sink.first),
            ) else {
                continue;
            };
            // Unfused, whole tiles go straight to C; fused products (whose C is scratch), a
            // block of other rows or a partial last panel through a scratch tile, which stays
            // in L1 for the epilogue (storing the tiles into a C of a few MB halved the
            // speed of a 6272 x 256 x 128 product).
            let direct = sink.out.is_none()
                && flat.is_none()
                && (rows == TILE_ROWS || rows == BLOCK_ROWS)
                && cols == NR_QUADS
                && at + (rows - 1) * sink.ldc + NR_QUADS <= sink.c.len();
            // A scratch block of the panel after the pending one's, on the same rows (flat
            // rows: of the same segment block), joins it in its slot's second half: one
            // epilogue for both.
            let joins = !direct
                && matches!(&self.pending, Some(d) if d.via.is_some() && d.m0 == m0 && d.rows == rows
                    && d.cols == NR_QUADS && d.j0 + NR_QUADS == j0
                    && d.flat.map(|f| f.f0) == flat.map(|f| f.f0));
            let via = match (&self.pending, joins, direct) {
                (Some(d), true, _) => d.via,
                (_, false, false) => {
                    self.slot ^= 1;
                    Some(self.slot)
                }
                _ => None,
            };
            // SAFETY: A's chunks as this function's contract says (`two` exactly when `rows >
            // 16`); `panel` holds `chunks` chunks of 16 quads of 128 bytes; `start` 32 i32.
            // The tiles are configured (contract).
            unsafe {
                block(
                    (self.signed, two),
                    a,
                    panel.as_ptr().cast::<u8>(),
                    start.as_ptr(),
                    via.is_some(),
                )
            };
            // The previous blocks' epilogue runs while the tiles multiply; its stores go
            // before this block's tile stores, which wait on the products.
            if !joins && let Some(prev) = self.pending.take() {
                prev.finish(&self.scratch, sink);
            }
            let half = if joins { NR_QUADS } else { 0 };
            let dst = match via {
                None => sink.c.get_mut(at..).map(|d| (d.as_mut_ptr(), 4 * sink.ldc)),
                Some(s) => self
                    .scratch
                    .get_mut(s)
                    .and_then(|t| t.0.get_mut(half..))
                    .map(|t| (t.as_mut_ptr(), 4 * SCRATCH_COLS)),
            };
            let Some(dst) = dst else { continue };
            // SAFETY: `dst` is a scratch slot's first or second half (32 rows of 32 i32,
            // SCRATCH_COLS apart) or, `direct`, C at the block's first element with `rows` rows
            // of 32 columns `ldc` apart inside `c` (checked); the tiles hold the block's
            // products.
            unsafe { store_block(two, dst) };
            match (&mut self.pending, joins) {
                (Some(d), true) => d.cols += cols,
                _ => {
                    self.pending = Some(Done {
                        m0,
                        j0,
                        rows,
                        cols,
                        via,
                        flat,
                    })
                }
            }
        }
    }

    /// Runs the last block's epilogue.
    fn finish(mut self, sink: &mut Sink<'_, '_, '_, '_, '_>) {
        if let Some(prev) = self.pending.take() {
            prev.finish(&self.scratch, sink);
        }
    }
}

/// The product of A's rows with B's columns `span` (its start a multiple of [`NR_QUADS`])
/// into C (`ldc` apart, C's first column the span's first), each sum plus `-za * colsum`;
/// with `out`, each block also requantized into Y. False (nothing written) when B is not in
/// quads or its data does not cover the tiles' reads.
pub(super) fn serial<T: Int8>(
    p: Product<'_, T>,
    c: &mut [i32],
    ldc: usize,
    out: Option<&mut Output<'_, '_>>,
    span: Range<usize>,
) -> bool {
    let Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    } = p;
    let Some(panels) = Panels::of(b, a_zero) else {
        return false;
    };
    let chunks = panels.chunks;
    let (first, n) = (span.start, span.end.min(b.n));
    if first >= n {
        return true;
    }
    if !first.is_multiple_of(NR_QUADS) {
        return false;
    }
    let bytes = T::bytes(a);
    // Whole 64-deep chunks of A are read in place; a depth's last partial chunk, and every
    // chunk of a block of other than 16 or 32 rows, are copied zero-padded into `apack`
    // (rows `width` apart).
    let full = k / (4 * TILE_QUADS);
    let mut apack_buf = Vec::new();
    let apack = crate::recycle::scratch_lined(&mut apack_buf, BLOCK_ROWS * chunks * 4 * TILE_QUADS);
    let mut addrs: Vec<(*const u8, usize)> = Vec::with_capacity(chunks);
    let mut run = Runner::new(T::OFFSET != 0);
    let mut sink = Sink {
        c,
        ldc,
        first,
        out,
        init: &panels.init,
    };
    let (p_first, p_end) = (first / NR_QUADS, n.div_ceil(NR_QUADS));
    let _tiles = Tiles::configure();
    for p0 in (p_first..p_end).step_by(panels.per_block) {
        for m0 in (0..m).step_by(BLOCK_ROWS) {
            let rows = (m - m0).min(BLOCK_ROWS);
            let in_place = rows == TILE_ROWS || rows == BLOCK_ROWS;
            let from = if in_place { full } else { 0 };
            let width = pack_a(bytes, (lda, k), (m0, rows), from, apack);
            addrs.clear();
            if in_place && let Some(rows_a) = bytes.get(m0 * lda..) {
                addrs.extend((0..full).map(|ch| (rows_a.as_ptr().wrapping_add(64 * ch), lda)));
            }
            addrs.extend((0..chunks - from).map(|ch| (apack.as_ptr().wrapping_add(64 * ch), width)));
            // SAFETY: in place (16 or 32 rows) A holds the block's rows, `lda` apart, to
            // depth `k >= 64 * full`; `apack` holds BLOCK_ROWS rows of `width = 64 * (chunks
            // - from)` bytes; one address per chunk. The tiles are configured.
            unsafe {
                run.block_row(
                    &panels,
                    &addrs,
                    (m0, rows),
                    (p0..(p0 + panels.per_block).min(p_end), n),
                    &mut sink,
                    None,
                )
            };
        }
    }
    run.finish(&mut sink);
    true
}

/// `Y = requantize(conv(X - zx, B))` for output pixels `pixels` of `win` on the tiles,
/// their sums in `sums` (`pixels.len()` rows of B's columns): blocks of 16 or 32 pixels of
/// one output row whose windows lie inside X read each tap's channels in place (rows `stride
/// * pixel_stride` apart, one 64-channel chunk per tile), the others (windows in the padding,
/// a row's last few pixels) from their im2col rows, copied into `rows`. Only for channels a
/// multiple of 64 (whole chunks per tap); false (nothing written) otherwise, or when B is not
/// in quads.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv<T: Int8 + Default>(
    win: &super::ConvWindow,
    x: &[T],
    pixels: Range<usize>,
    pad: T,
    b: &super::PackedB,
    sums: &mut [i32],
    rows: &mut Vec<T>,
    out: &mut Output<'_, '_>,
) -> bool {
    let (c, (kh, kw)) = (win.channels, win.kernel);
    let k = win.depth();
    if c == 0 || !c.is_multiple_of(4 * TILE_QUADS) || b.k != k || x.len() < win.input_len() || kh == 0 || kw == 0 {
        return false;
    }
    let Some(panels) = Panels::of(b, pad.widen()) else {
        return false;
    };
    let (n, m) = (b.n, pixels.len());
    if sums.len() < m * n || pixels.end > win.pixels() {
        return false;
    }
    let size = std::mem::size_of::<T>();
    let per_tap = c / (4 * TILE_QUADS);
    let bytes = T::bytes(x);
    let (h, w) = win.input;
    let (sw, (dh, dw), ps) = (win.stride.1, win.dilation, win.pixel_stride);
    let lda = sw * ps * size;
    let buf = crate::recycle::scratch_lined(rows, BLOCK_ROWS * k);
    let mut addrs: Vec<(*const u8, usize)> = Vec::with_capacity(panels.chunks);
    let mut run = Runner::new(T::OFFSET != 0);
    let mut sink = Sink {
        c: sums,
        ldc: n,
        first: 0,
        out: Some(out),
        init: &panels.init,
    };
    let p_end = n.div_ceil(NR_QUADS);
    let _tiles = Tiles::configure();
    for p0 in (0..p_end).step_by(panels.per_block) {
        let cols = p0..(p0 + panels.per_block).min(p_end);
        let mut p = pixels.start;
        while p < pixels.end {
            let cursor @ (batch, _, ox) = win.cursor(p);
            // This output row's pixels from `ox` on, within the range, 32 or 16 at a time.
            let seg = win.output.1.saturating_sub(ox).min(pixels.end - p).max(1);
            let here = match seg {
                s if s >= BLOCK_ROWS => BLOCK_ROWS,
                s if s >= TILE_ROWS => TILE_ROWS,
                s => s,
            };
            let (_, y0, x0) = win.cursor_origin(cursor);
            let last_x = x0 + ((here - 1) * sw + (kw - 1) * dw) as isize;
            let inside = here >= TILE_ROWS
                && y0 >= 0
                && x0 >= 0
                && y0 + (((kh - 1) * dh) as isize) < (h as isize)
                && last_x < (w as isize);
            // Copied windows fill whole blocks, across output rows: rows narrower than 16
            // pixels (ResNet's 14 x 14 and 7 x 7 layers) would otherwise run every block on
            // one half-empty tile of rows.
            let here = if inside { here } else { (pixels.end - p).min(BLOCK_ROWS) };
            addrs.clear();
            if inside {
                let (y0, x0) = (y0.unsigned_abs(), x0.unsigned_abs());
                for ky in 0..kh {
                    for kx in 0..kw {
                        let at = ((batch * h + y0 + ky * dh) * w + x0 + kx * dw) * ps;
                        addrs.extend(
                            (0..per_tap)
                                .map(|cc| (bytes.as_ptr().wrapping_add((at + cc * 4 * TILE_QUADS) * size), lda)),
                        );
                    }
                }
            } else {
                for (r, row) in buf.chunks_exact_mut(k).take(BLOCK_ROWS).enumerate() {
                    if r < here {
                        win.im2col_row(x, p + r, pad, row);
                    } else {
                        row.fill(pad);
                    }
                }
                let base = T::bytes(buf).as_ptr();
                addrs.extend((0..panels.chunks).map(|ch| (base.wrapping_add(64 * ch), k * size)));
            }
            // SAFETY: inside, every tap of the block's `here` (16 or 32) windows lies within X
            // (checked above; X holds `input_len` values): row `r`'s tap is `r * sw` pixels
            // after row 0's, `lda` bytes apart, and each chunk's 64 channels lie within the
            // tap's `c`; otherwise the chunks are `buf`'s BLOCK_ROWS rows of `k` values. One
            // address per chunk, in B's `[ky][kx][c]` order. The tiles are configured.
            unsafe {
                run.block_row(
                    &panels,
                    &addrs,
                    (p - pixels.start, here),
                    (cols.clone(), n),
                    &mut sink,
                    None,
                )
            };
            p += here;
        }
    }
    run.finish(&mut sink);
    true
}

/// One image's run of output pixels for [`conv_flat`]: output rows `oy0..` of image `batch`,
/// its flat rows `lo..hi` (the first pixel's column on the first row to the last pixel's),
/// the first pixel Y's row `y_first`; its padded input rows (`nrows`) start at element `at`
/// of the copy.
struct Segment {
    batch: usize,
    oy0: usize,
    lo: usize,
    hi: usize,
    y_first: usize,
    nrows: usize,
    at: usize,
}

/// Whether [`conv_flat`] takes a convolution with B's depth laid out as `row_run` (see
/// there): stride 1 and at most half again as many flat rows as outputs (the padding
/// columns of each row are computed and dropped: 16 of 14 on ResNet's 14 x 14 layers, 9 of
/// 7 on its 7 x 7 ones, still faster there than copying each window), an image's flat rows
/// at most twice its outputs in whole 32-row blocks, and a halo of rows no taller than the
/// output (or 64 rows); by taps, whole 64-channel chunks; by kernel
/// rows, adjacent taps (no dilation across).
pub(super) fn flat_fits(win: &super::ConvWindow, row_run: Option<usize>) -> bool {
    let (kw, dw) = (win.kernel.1, win.dilation.1);
    let c = win.channels;
    let by = match row_run {
        None => c.is_multiple_of(4 * TILE_QUADS),
        Some(kr) => dw == 1 && kr.is_multiple_of(4 * TILE_QUADS) && kr >= kw * c,
    };
    // The copy's halo of `(kh - 1) * dh` rows is bounded too (a huge dilation with huge
    // padding would otherwise copy rows nothing reads but the padding).
    let halo = (win.kernel.0.max(1) - 1).saturating_mul(win.dilation.0);
    // Each image's flat rows run in whole 32-row blocks: at most twice its outputs (a batch
    // of 1 x 5 outputs would compute 32 rows for 5).
    let (oh, ow) = win.output;
    let wp = ow.saturating_add(kw.saturating_sub(1).saturating_mul(dw));
    let flat = oh.saturating_sub(1).saturating_mul(wp).saturating_add(ow);
    let blocks = flat.div_ceil(BLOCK_ROWS).saturating_mul(BLOCK_ROWS);
    by && blocks <= oh.saturating_mul(ow).saturating_mul(2)
        && win.stride == (1, 1)
        && c > 0
        && win.kernel.0 > 0
        && kw > 0
        && (kw - 1).saturating_mul(dw).saturating_mul(2) <= win.output.1
        && halo <= win.output.0.max(64)
}

/// [`conv`] for a stride-1 convolution over a padded copy: the input rows the pixels'
/// windows read are copied once per image into `rows` with the padding written out (X's
/// zero point `pad`), `wp = ow + (kw - 1) * dw` pixels a row, so that flat pixel `f` of an
/// image's copy is the window origin of output column `f % wp` of its row `f / wp`. Every
/// block of 32 flat rows is then read in place by the tiles, whatever the padding; the `wp -
/// ow` padding columns of each row are computed and their sums dropped. B's depth is
/// `[ky][kx][c]` by taps (`row_run` `None`: each tap's 64-channel chunks `(ky * dh * wp + kx
/// * dw)` pixels on), or by kernel rows of `row_run` values (`[ky][kx * c + ch]` padded with
/// zero weights to a multiple of 64: each kernel row one run of its adjacent taps' channels
/// read `ky * dh * wp` pixels on, the padding reading the next pixels' values, times zero).
/// False (nothing written) unless [`flat_fits`] and B is in quads of that depth.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_flat<T: Int8 + Default>(
    win: &super::ConvWindow,
    row_run: Option<usize>,
    x: &[T],
    pixels: Range<usize>,
    pad: T,
    b: &super::PackedB,
    rows: &mut Vec<T>,
    out: &mut Output<'_, '_>,
) -> bool {
    let (c, (kh, kw)) = (win.channels, win.kernel);
    let depth = row_run.map_or(win.depth(), |kr| kh * kr);
    if !flat_fits(win, row_run) || b.k != depth || x.len() < win.input_len() || pixels.end > win.pixels() {
        return false;
    }
    if pixels.is_empty() {
        return true;
    }
    let Some(panels) = Panels::of(b, pad.widen()) else {
        return false;
    };
    let ((h, w), (oh, ow)) = (win.input, win.output);
    let ((dh, dw), (ph, pw), ps) = (win.dilation, win.pad, win.pixel_stride);
    let wp = ow + (kw - 1) * dw;
    // The pixels by image: each image's output rows and its padded input rows, plus a
    // block's rows of slack (a block may start at the segment's last flat row) and the
    // pixels a kernel row's padded run reads past its taps.
    let slack = BLOCK_ROWS + row_run.map_or(0, |kr| (kr - kw * c).div_ceil(c));
    let mut segments = Vec::new();
    let mut total = 0usize;
    let mut p = pixels.start;
    while p < pixels.end {
        let (batch, oy0, lo) = win.cursor(p);
        let end = pixels.end.min((batch + 1) * oh * ow);
        let (_, oy1, ox1) = win.cursor(end - 1);
        let nrows = oy1 - oy0 + 1 + (kh - 1) * dh;
        segments.push(Segment {
            batch,
            oy0,
            lo,
            hi: (oy1 - oy0) * wp + ox1 + 1,
            y_first: p - pixels.start,
            nrows,
            at: total,
        });
        total += (nrows * wp + slack) * c;
        p = end;
    }
    let buf = crate::recycle::scratch_lined(rows, total);
    for s in &segments {
        let Some(seg) = buf.get_mut(s.at..s.at + (s.nrows * wp + slack) * c) else {
            return false;
        };
        let (body, slack) = seg.split_at_mut(s.nrows * wp * c);
        slack.fill(pad);
        for (i, row) in body.chunks_exact_mut(wp * c).enumerate() {
            let Some(iy) = (s.oy0 + i).checked_sub(ph).filter(|&iy| iy < h) else {
                row.fill(pad);
                continue;
            };
            // The row's left padding, X's pixels, the right padding; X's pixels one run
            // when they are adjacent (a copy call per pixel of a few channels costs more).
            let (left, rest) = row.split_at_mut((pw * c).min(row.len()));
            left.fill(pad);
            let inside = w.min(rest.len() / c);
            let (mid, right) = rest.split_at_mut(inside * c);
            right.fill(pad);
            let at = (s.batch * h + iy) * w * ps;
            if ps == c {
                match x.get(at..at + inside * c) {
                    Some(v) => mid.copy_from_slice(v),
                    None => mid.fill(pad),
                }
            } else {
                for (ix, px) in mid.chunks_exact_mut(c).enumerate() {
                    match x.get(at + ix * ps..at + ix * ps + c) {
                        Some(v) => px.copy_from_slice(v),
                        None => px.fill(pad),
                    }
                }
            }
        }
    }
    let size = std::mem::size_of::<T>();
    let (n, lda, per_tap) = (b.n, c * size, c / (4 * TILE_QUADS));
    let base = T::bytes(buf).as_ptr();
    let mut addrs: Vec<(*const u8, usize)> = Vec::with_capacity(panels.chunks);
    let mut run = Runner::new(T::OFFSET != 0);
    let mut sink = Sink {
        c: &mut [],
        ldc: n,
        first: 0,
        out: Some(out),
        init: &panels.init,
    };
    let p_end = n.div_ceil(NR_QUADS);
    let _tiles = Tiles::configure();
    for p0 in (0..p_end).step_by(panels.per_block) {
        let cols = p0..(p0 + panels.per_block).min(p_end);
        for s in &segments {
            for f in (s.lo..s.hi).step_by(BLOCK_ROWS) {
                addrs.clear();
                for ky in 0..kh {
                    let chunk = |at: usize, cc: usize| (base.wrapping_add((at + cc * 4 * TILE_QUADS) * size), lda);
                    match row_run {
                        None => {
                            for kx in 0..kw {
                                let at = s.at + (f + ky * dh * wp + kx * dw) * c;
                                addrs.extend((0..per_tap).map(|cc| chunk(at, cc)));
                            }
                        }
                        Some(kr) => {
                            let at = s.at + (f + ky * dh * wp) * c;
                            addrs.extend((0..kr / (4 * TILE_QUADS)).map(|cc| chunk(at, cc)));
                        }
                    }
                }
                let flat = FlatRows {
                    f0: f,
                    wp,
                    ow,
                    lo: s.lo,
                    hi: s.hi,
                    y_first: s.y_first,
                };
                // SAFETY: the block's 32 flat rows from `f`, each tap's `(ky * dh * wp + kx *
                // dw)` pixels on, lie within the segment's copy and its slack: the last read
                // pixel is at most `hi - 1 + 31 + (kh - 1) * dh * wp + (kw - 1) * dw <
                // nrows * wp + BLOCK_ROWS` (as `hi <= (nrows - 1 - (kh - 1) * dh) * wp + ow`
                // and `ow + (kw - 1) * dw = wp`); by taps each chunk's 64 channels lie within
                // the pixel's `c`, by kernel rows a run's `kr - kw * c` values past its taps
                // within the slack's further pixels. One address per chunk, in B's depth
                // order. The tiles are configured.
                unsafe {
                    run.block_row(
                        &panels,
                        &addrs,
                        (0, BLOCK_ROWS),
                        (cols.clone(), n),
                        &mut sink,
                        Some(flat),
                    )
                };
            }
        }
    }
    run.finish(&mut sink);
    true
}

/// A block whose products are done (or two of adjacent panels, in one scratch slot): rows
/// `m0..m0 + rows`, columns `j0..j0 + cols`, its sums in C or in scratch slot `via`.
struct Done {
    m0: usize,
    j0: usize,
    rows: usize,
    cols: usize,
    via: Option<usize>,
    /// The block's rows are flat rows of a padded image ([`conv_flat`]): which are outputs.
    flat: Option<FlatRows>,
}

/// Where a block of flat rows of [`conv_flat`] goes: flat row `f` of a segment is output
/// column `f % wp` of the segment's output row `f / wp`, an output pixel when that column
/// is below `ow` and `f` within `lo..hi` (the segment's pixels); the segment's flat row `lo`
/// is Y's row `y_first`.
#[derive(Clone, Copy)]
struct FlatRows {
    /// The block's first flat row.
    f0: usize,
    wp: usize,
    ow: usize,
    lo: usize,
    hi: usize,
    y_first: usize,
}

impl Done {
    /// The block's epilogue: fused, its sums requantized into Y from its scratch tile;
    /// otherwise copied from its scratch tile into C (whole tiles are already there).
    fn finish(&self, scratch: &[TileBuf; 2], sink: &mut Sink<'_, '_, '_, '_, '_>) {
        let Done {
            m0,
            j0,
            rows,
            cols,
            via,
            flat,
        } = *self;
        // Blocks through a scratch tile started from zero: their columns' `init` is added here.
        let init = sink.init.get(j0..).unwrap_or_default();
        if let Some(fr) = flat {
            // Runs of flat rows that are output pixels of one output row, each requantized
            // into its Y rows; the padding columns' sums are dropped.
            let (Some(tile), Some(o)) = (via.and_then(|s| scratch.get(s)), sink.out.as_deref_mut()) else {
                return;
            };
            let mut r = 0;
            while r < rows {
                let f = fr.f0 + r;
                if f >= fr.hi {
                    break;
                }
                // Blocks start at the segment's first flat row, so `f >= lo`.
                let ox = f % fr.wp.max(1);
                if ox >= fr.ow {
                    r += fr.wp - ox;
                    continue;
                }
                let run = (fr.ow - ox).min(rows - r).min(fr.hi - f);
                // Y's row of flat row `f`: the output rows before it, its column, less the
                // segment's first column (`lo`, on its first output row).
                let y = fr.y_first + (f / fr.wp) * fr.ow + ox - fr.lo;
                if let (Some(sums), Some(fin)) = (tile.0.get(r * SCRATCH_COLS..), o.tile(y, j0 - sink.first, j0, cols))
                {
                    super::vnni::requant_panel(sums, SCRATCH_COLS, run, cols, fin, init);
                }
                r += run;
            }
            return;
        }
        let ldc = sink.ldc;
        let Some(at) = (m0 * ldc + j0).checked_sub(sink.first) else {
            return;
        };
        // Fused blocks always go through a scratch tile (`block_row`'s `direct` is for unfused
        // products only): requantized from there, C untouched.
        let Some(tile) = via.and_then(|s| scratch.get(s)).map(|t| &t.0[..]) else {
            return;
        };
        if let Some(f) = sink
            .out
            .as_deref_mut()
            .and_then(|o| o.tile(m0, j0 - sink.first, j0, cols))
        {
            super::vnni::requant_panel(tile, SCRATCH_COLS, rows, cols, f, init);
            return;
        }
        for (r, sums) in tile.chunks_exact(SCRATCH_COLS).take(rows).enumerate() {
            let (Some(d), Some(s)) = (sink.c.get_mut(at + r * ldc..at + r * ldc + cols), sums.get(..cols)) else {
                break;
            };
            for ((d, &s), &i) in d.iter_mut().zip(s).zip(init) {
                *d = s.wrapping_add(i);
            }
        }
    }
}

/// Copies rows `m0..m0 + rows` of A (`lda` apart, `k` deep), depths from chunk `from` on,
/// into `out` as [`BLOCK_ROWS`] rows of whole 64-byte chunks, depths past `k` and rows past
/// `rows` zero; returns the rows' width in bytes.
fn pack_a(a: &[u8], (lda, k): (usize, usize), (m0, rows): (usize, usize), from: usize, out: &mut [u8]) -> usize {
    let d0 = (from * 4 * TILE_QUADS).min(k);
    let width = (k - d0).div_ceil(4 * TILE_QUADS) * 4 * TILE_QUADS;
    if width == 0 {
        return 0;
    }
    for (r, dst) in out.chunks_exact_mut(width).take(BLOCK_ROWS).enumerate() {
        let src = if r < rows {
            a.get((m0 + r) * lda + d0..(m0 + r) * lda + k)
        } else {
            None
        };
        match src {
            Some(src) => {
                let (head, tail) = dst.split_at_mut(src.len().min(width));
                head.copy_from_slice(src.get(..head.len()).unwrap_or_default());
                tail.fill(0);
            }
            None => dst.fill(0),
        }
    }
    width
}

/// One block's tile products, left in the C tiles ([`store_block`] stores them): C's 16
/// rows (32 when `two`) of 32 i32 become `init` (32 i32, every row; nothing when `zeroed`,
/// the tiles then start from zero) plus A's rows times the panel's 32 columns: A's chunk `i`
/// is 16 (32) rows of 64 bytes from `a[i].0`, `a[i].1` apart, B's chunks one after another
/// from `b`; `tdpbssd` (i8 A) when `signed`, else `tdpbusd`.
///
/// # Safety
/// The tiles are configured ([`Tiles`]); each A chunk's rows are readable, `b` holds
/// `a.len()` chunks of [`B_CHUNK`] bytes, and `init` 32 i32.
unsafe fn block((signed, two): (bool, bool), a: &[(*const u8, usize)], b: *const u8, init: *const i32, zeroed: bool) {
    let (s0, s128) = (0usize, 128usize);
    if zeroed {
        // SAFETY: zeroes the configured C tiles; no memory access.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            )
        };
    } else {
        // SAFETY: each C tile loads its 16 columns of `init` into all 16 rows (row stride 0).
        unsafe {
            asm!(
                "tileloadd tmm0, [{i} + {s0}*1]",
                "tileloadd tmm1, [{i} + {s0}*1 + 64]",
                "tileloadd tmm2, [{i} + {s0}*1]",
                "tileloadd tmm3, [{i} + {s0}*1 + 64]",
                i = in(reg) init, s0 = in(reg) s0,
                options(nostack, readonly),
            )
        };
    }
    let mut bp = b;
    for &(ap, lda) in a {
        // B's chunk [`PREFETCH_CHUNKS`] on (the next panel's, past a panel's end: panels lie
        // one after another) asked for now: a B of a few hundred KB streams from L3 for each
        // product, and the tile loads alone keep too few lines in flight. A prefetch never
        // faults; addresses past B's data are only formed (`wrapping_add`), never read.
        let ahead = bp.wrapping_add(PREFETCH_CHUNKS * B_CHUNK);
        for line in 0..B_CHUNK / 64 {
            crate::hint::to_l1(ahead.wrapping_add(64 * line));
        }
        // The second tile's rows 16 rows on (read only when `two`); formed with
        // `wrapping_add`, read within the caller's contract.
        let ap1 = ap.wrapping_add(TILE_ROWS * lda);
        let s64 = lda;
        // SAFETY: the loads read 16 rows of 64 bytes: A's at `ap` (and `ap1`), `lda` apart,
        // B's at `bp` and `bp + 64`, 128 apart: within the caller's buffers (see above).
        unsafe {
            match (signed, two) {
                (false, true) => asm!(
                    "tileloadd tmm4, [{a} + {s64}*1]",
                    "tileloadd tmm6, [{b} + {s128}*1]",
                    "tileloadd tmm7, [{b} + {s128}*1 + 64]",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tdpbusd tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {s64}*1]",
                    "tdpbusd tmm2, tmm5, tmm6",
                    "tdpbusd tmm3, tmm5, tmm7",
                    a = in(reg) ap, a1 = in(reg) ap1, b = in(reg) bp, s64 = in(reg) s64, s128 = in(reg) s128,
                    options(nostack, readonly),
                ),
                (true, true) => asm!(
                    "tileloadd tmm4, [{a} + {s64}*1]",
                    "tileloadd tmm6, [{b} + {s128}*1]",
                    "tileloadd tmm7, [{b} + {s128}*1 + 64]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {s64}*1]",
                    "tdpbssd tmm2, tmm5, tmm6",
                    "tdpbssd tmm3, tmm5, tmm7",
                    a = in(reg) ap, a1 = in(reg) ap1, b = in(reg) bp, s64 = in(reg) s64, s128 = in(reg) s128,
                    options(nostack, readonly),
                ),
                (false, false) => asm!(
                    "tileloadd tmm4, [{a} + {s64}*1]",
                    "tileloadd tmm6, [{b} + {s128}*1]",
                    "tileloadd tmm7, [{b} + {s128}*1 + 64]",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tdpbusd tmm1, tmm4, tmm7",
                    a = in(reg) ap, b = in(reg) bp, s64 = in(reg) s64, s128 = in(reg) s128,
                    options(nostack, readonly),
                ),
                (true, false) => asm!(
                    "tileloadd tmm4, [{a} + {s64}*1]",
                    "tileloadd tmm6, [{b} + {s128}*1]",
                    "tileloadd tmm7, [{b} + {s128}*1 + 64]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    a = in(reg) ap, b = in(reg) bp, s64 = in(reg) s64, s128 = in(reg) s128,
                    options(nostack, readonly),
                ),
            }
        }
        bp = bp.wrapping_add(B_CHUNK);
    }
}

/// Stores the C tiles of a [`block`]'s products: 16 rows (32 when `two`) of 32 i32,
/// `ld_bytes` apart at `c`.
///
/// # Safety
/// The tiles are configured and hold a block's products; `c` has 16 (32 when `two`) rows of
/// 32 i32, `ld_bytes` apart.
unsafe fn store_block(two: bool, (c, ld_bytes): (*mut i32, usize)) {
    // SAFETY: stores 16 rows of 64 bytes per C tile, rows `ld_bytes` apart: tiles 0 and 1 at
    // rows 0-15 (columns 0-15 and 16-31), tiles 2 and 3 at rows 16-31 when `two`, inside C
    // as the caller promised.
    unsafe {
        asm!(
            "tilestored [{c} + {ld}*1], tmm0",
            "tilestored [{c} + {ld}*1 + 64], tmm1",
            c = in(reg) c, ld = in(reg) ld_bytes,
            options(nostack),
        );
        if two {
            asm!(
                "tilestored [{c} + {ld}*1], tmm2",
                "tilestored [{c} + {ld}*1 + 64], tmm3",
                c = in(reg) c.cast::<u8>().add(TILE_ROWS * ld_bytes), ld = in(reg) ld_bytes,
                options(nostack),
            );
        }
    }
}
