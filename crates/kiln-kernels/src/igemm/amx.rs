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
//! colsum` (no offset to u8 as on VNNI). The C tiles start from those values (loaded with a
//! row stride of 0) and are stored straight into C when whole; each block's epilogue (the
//! requantization of a fused product, [`vnni::requant_panel`](super::vnni)) runs after the
//! next block's products are issued, beside them rather than waiting for the tile stores.
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

/// The product of A's rows with B's columns `span` (its start a multiple of [`NR_QUADS`])
/// into C (`ldc` apart, C's first column the span's first), each sum plus `-za * colsum`;
/// with `out`, each block also requantized into Y. False (nothing written) when B is not in
/// quads or its data does not cover the tiles' reads.
pub(super) fn serial<T: Int8>(
    p: Product<'_, T>,
    c: &mut [i32],
    ldc: usize,
    mut out: Option<&mut Output<'_, '_>>,
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
    let Data::Quads(data) = &b.data else { return false };
    let kq = k.div_ceil(4);
    let chunks = kq.div_ceil(TILE_QUADS);
    let stride = kq * 4 * NR_QUADS;
    let panels = b.n.div_ceil(NR_QUADS);
    if chunks == 0 || panels == 0 || data.len() < (panels - 1) * stride + chunks * B_CHUNK {
        return false;
    }
    let (first, n) = (span.start, span.end.min(b.n));
    if first >= n {
        return true;
    }
    if !first.is_multiple_of(NR_QUADS) {
        return false;
    }
    let signed = T::OFFSET != 0;
    // Each column's starting value, `-za * colsum`, padded to whole panels: the C tiles start
    // from it (loaded with a row stride of 0).
    let mut init = Vec::new();
    b.quads_init(a_zero, &mut init);
    let bytes = T::bytes(a);
    // Whole 64-deep chunks of A are read in place; a depth's last partial chunk, and every
    // chunk of a block of other than 16 or 32 rows, are copied zero-padded into `apack`
    // (rows `width` apart).
    let full = k / (4 * TILE_QUADS);
    let mut apack = vec![0u8; BLOCK_ROWS * chunks * 4 * TILE_QUADS];
    // Blocks that are not whole tiles of C go through one of two scratch tiles (alternating,
    // since a block's epilogue runs after the next block's products).
    let mut scratch = [[0i32; BLOCK_ROWS * NR_QUADS]; 2];
    let mut slot = 0;
    // The last block computed, its epilogue not yet run: the tiles' stores are still
    // draining when the next block's products are issued, and the epilogue (vector code)
    // then runs beside them instead of waiting for the stores.
    let mut pending: Option<Done> = None;
    // Panels per column block: one depth's worth of B for them stays in L2 while every block
    // of rows reads it.
    let per_block = (B_BLOCK_BYTES / stride.max(1)).max(1);
    let (p_first, p_end) = (first / NR_QUADS, n.div_ceil(NR_QUADS));
    let _tiles = Tiles::configure();
    for p0 in (p_first..p_end).step_by(per_block) {
        for m0 in (0..m).step_by(BLOCK_ROWS) {
            let rows = (m - m0).min(BLOCK_ROWS);
            let in_place = rows == TILE_ROWS || rows == BLOCK_ROWS;
            let from = if in_place { full } else { 0 };
            let width = pack_a(bytes, (lda, k), (m0, rows), from, &mut apack);
            // The chunks from A itself, then those from `apack`.
            let (a_main, a_tail) = match in_place {
                true => (
                    (
                        bytes.get(m0 * lda..).map_or(std::ptr::null(), <[u8]>::as_ptr),
                        lda,
                        full,
                    ),
                    (apack.as_ptr(), width, chunks - full),
                ),
                false => ((apack.as_ptr(), width, chunks), (apack.as_ptr(), width, 0)),
            };
            for p in p0..(p0 + per_block).min(p_end) {
                let j0 = p * NR_QUADS;
                let cols = (n - j0).min(NR_QUADS);
                let (Some(panel), Some(start)) = (
                    data.get(p * stride..p * stride + chunks * B_CHUNK),
                    init.get(j0..j0 + NR_QUADS),
                ) else {
                    continue;
                };
                let at = m0 * ldc + j0 - first;
                // Whole tiles go straight to C; a block of other rows, or the span's last
                // panel when partial, through a scratch tile.
                let direct = (rows == TILE_ROWS || rows == BLOCK_ROWS)
                    && cols == NR_QUADS
                    && at + (rows - 1) * ldc + NR_QUADS <= c.len();
                let two = rows > TILE_ROWS;
                let via = (!direct).then(|| {
                    slot ^= 1;
                    slot
                });
                let dst = match via {
                    None => c.get_mut(at..).map(|d| (d.as_mut_ptr(), 4 * ldc)),
                    Some(s) => scratch.get_mut(s).map(|t| (t.as_mut_ptr(), 4 * NR_QUADS)),
                };
                let Some((dst, ld_bytes)) = dst else { continue };
                // SAFETY: in place (16 or 32 rows), A holds the block's rows (`lda` apart,
                // `rows > 16` exactly when `two`) to depth `k >= 64 * full`; `apack` holds
                // BLOCK_ROWS rows of `width = 64 * (chunks - from)` bytes (the kernel reads
                // rows 0-15, and 16-31 when `two`); `panel` holds `chunks` chunks of 16 quads
                // of 128 bytes; `start` 32 i32; `dst` is a scratch tile
                // (32 rows of 32 i32) or, `direct`, C at the block's first element with `rows`
                // rows of 32 columns `ldc` apart inside `c` (checked). The tiles are
                // configured.
                unsafe {
                    block(
                        (signed, two),
                        [a_main, a_tail],
                        panel.as_ptr().cast::<u8>(),
                        start.as_ptr(),
                        (dst, ld_bytes),
                    )
                };
                let done = Done {
                    m0,
                    j0,
                    rows,
                    cols,
                    via,
                };
                if let Some(prev) = pending.replace(done) {
                    prev.finish(&scratch, (c, ldc), out.as_deref_mut(), first);
                }
            }
        }
    }
    if let Some(prev) = pending {
        prev.finish(&scratch, (c, ldc), out, first);
    }
    true
}

/// A block whose products are done: rows `m0..m0 + rows`, columns `j0..j0 + cols`, its sums
/// in C or in scratch tile `via`.
struct Done {
    m0: usize,
    j0: usize,
    rows: usize,
    cols: usize,
    via: Option<usize>,
}

impl Done {
    /// The block's epilogue: its sums copied from its scratch tile into C, then with `out`
    /// requantized into Y.
    fn finish(
        &self,
        scratch: &[[i32; BLOCK_ROWS * NR_QUADS]; 2],
        (c, ldc): (&mut [i32], usize),
        out: Option<&mut Output<'_, '_>>,
        first: usize,
    ) {
        let Done {
            m0,
            j0,
            rows,
            cols,
            via,
        } = *self;
        let at = m0 * ldc + j0 - first;
        if let Some(tile) = via.and_then(|s| scratch.get(s)) {
            for (r, sums) in tile.chunks_exact(NR_QUADS).take(rows).enumerate() {
                let (Some(d), Some(s)) = (c.get_mut(at + r * ldc..at + r * ldc + cols), sums.get(..cols)) else {
                    break;
                };
                d.copy_from_slice(s);
            }
        }
        if let Some(f) = out.and_then(|o| o.tile(m0, j0 - first, j0, cols))
            && let Some(sums) = c.get(at..)
        {
            super::vnni::requant_panel(sums, ldc, rows, cols, f);
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

/// One block's tile products: C's 16 rows (32 when `two`) of 32 i32, `ld_bytes` apart at
/// `c`, become `init` (32 i32, every row) plus A's rows times the panel's 32 columns; A's
/// chunks come from two sources in turn, each `(rows, row stride, chunks)` (row `r`'s chunk
/// `i` at `rows + r * stride + 64 i`), B's chunks one after another from `b`; `tdpbssd`
/// (i8 A) when `signed`, else `tdpbusd`.
///
/// # Safety
/// The tiles are configured ([`Tiles`]); each A source holds 16 rows (32 when `two`) of its
/// chunks, `b` the chunks of both sources ([`B_CHUNK`] bytes each), `init` 32 i32, and `c`
/// 16 (32 when `two`) rows of 32 i32, `ld_bytes` apart.
unsafe fn block(
    (signed, two): (bool, bool),
    sources: [(*const u8, usize, usize); 2],
    b: *const u8,
    init: *const i32,
    (c, ld_bytes): (*mut i32, usize),
) {
    let (s0, s128) = (0usize, 128usize);
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
    let mut bp = b;
    for (ch, (base, lda)) in sources
        .iter()
        .flat_map(|&(a, lda, n)| (0..n).map(move |i| (i, (a, lda))))
    {
        // SAFETY: chunk `ch` of the source: its rows' 64 bytes at `base + 64 ch`, `lda`
        // apart; the second tile's rows 16 rows on (read only when `two`). Addresses formed
        // with `wrapping_add`, read within the caller's contract.
        let (ap, ap1) = (base.wrapping_add(64 * ch), base.wrapping_add(64 * ch + TILE_ROWS * lda));
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
