//! The GEMM loop nest over a per-level kernel table: cache blocking, the tile calls (A read
//! in place, B from its packed panels) and the epilogue after each finished tile.

#[cfg(doc)]
use super::KC_AVX2;
use super::pack::{AMatrix, BLayout, PackedBRef};
use super::{Act, Bias, Epilogue, KC, MC, NC, portable};
use crate::isa::Isa;

/// A microkernel for a tile of `R` rows (the table holds one per `R` in `1..=MR`).
///
/// `tile(kc, a, ars, acs, b, bs, c, ldc, nr, first, epi)` computes, for `i < R`, `j < nr`:
/// `C[i][j] (= if first, else +=) sum_p a[i*ars + p*acs] * b[p*bs + j]`, so A is read
/// in place (row-major: `ars = lda, acs = 1`; transposed: `ars = 1, acs = lda`) or from a
/// packed panel (`ars = 1, acs = MR`). Kernels with `fused` set then apply `epi` (given only
/// on the last depth block) to the tile in registers before storing it; the others ignore it.
///
/// # Safety
/// `a + i*ars + p*acs` is readable for `i < R`, `p < kc`; for every `p < kc`, `b + p*bs`
/// points to `NR` readable floats (the kernel's width); for every `i < R`, `c + i*ldc` points
/// to `nr <= NR` writable (and, unless `first`, initialised) floats; `epi`'s pointers satisfy
/// [`TileEpi`]'s contract; the CPU supports the kernel's level.
pub(crate) type TileFn = unsafe fn(
    usize,
    *const f32,
    usize,
    usize,
    *const f32,
    usize,
    *mut f32,
    usize,
    usize,
    bool,
    Option<&TileEpi>,
    Ahead,
);

/// Consecutive full-height tiles down one micro-panel in one call: `column(count, kc, a, ars,
/// acs, b, bs, c, ldc, nr, first, epi, ahead)` is the [`TileFn`] of `mr` rows applied to the
/// tiles `t < count` at rows `t * mr` (A at `a + t*mr*ars`, C at `c + t*mr*ldc`, the epilogue's
/// row bias and residual moved down as well), each tile fetching C's (and the residual's)
/// rows two tiles ahead when `ahead.c_ahead` is set, and a `count`-th of `ahead`'s lines
/// of B. A depth-16 tile is ~100 cycles of products; the loop nest's per-tile bookkeeping and
/// call had been as long again (a 12544 x 64 x 16 product: 0.55 -> 0.44 ms). The argument
/// list is [`TileFn`]'s with the count in front (the same call, repeated).
///
/// # Safety
/// [`TileFn`]'s contract for each of the `count` tiles (rows `t*mr .. (t+1)*mr`).
pub(crate) type ColumnFn = unsafe fn(
    usize,
    usize,
    *const f32,
    usize,
    usize,
    *const f32,
    usize,
    *mut f32,
    usize,
    usize,
    bool,
    Option<&TileEpi>,
    ColumnAhead,
);

/// What a [`ColumnFn`] prefetches: `lines` rows of the next micro-panel (one line each,
/// `stride` floats apart from `ptr`; hints only) spread over its tiles, and, with `c_ahead`,
/// the rows of C (and of the residual) two tiles down, within the call's rows.
#[derive(Clone, Copy)]
pub(crate) struct ColumnAhead {
    pub ptr: *const f32,
    pub lines: usize,
    pub stride: usize,
    pub c_ahead: bool,
}

/// Lines of B a tile asks to have fetched into L2 while its depth loop runs (a slice of the
/// micro-panel the loop nest reads next), a line or two per turn of the loop rather than all
/// at once: a burst of hints takes every fill buffer and stalls the tile behind them.
/// `lines` 64-byte lines from `ptr`; hints only, which never fault. Tiles of kernels without
/// [`Kernels::stream_b`] ignore it.
#[derive(Clone, Copy)]
pub(crate) struct Ahead {
    pub ptr: *const f32,
    pub lines: usize,
}

impl Ahead {
    pub(crate) const NONE: Ahead = Ahead {
        ptr: std::ptr::null(),
        lines: 0,
    };
}

/// The epilogue of one tile, for kernels that fuse it: each pointer null or valid for the
/// tile (`row_bias`: `R` floats, one per row; `col_bias`: `nr` floats; `resid`: `nr` floats
/// at `resid + i*resid_ld` for each `i < R`).
pub(crate) struct TileEpi {
    pub row_bias: *const f32,
    pub col_bias: *const f32,
    pub resid: *const f32,
    pub resid_ld: usize,
    pub act: Option<Act>,
    /// Applied after the activation (see [`super::Affine`]).
    pub post: Option<super::Affine>,
    /// PRelu slopes (see [`Epilogue::prelu`]), each null or valid for the tile: `R` floats,
    /// one per row, or `nr` floats, one per column. Applied by kernels with
    /// [`Kernels::prelu`] set; the driver applies them after the others' tiles.
    pub prelu_row: *const f32,
    pub prelu_col: *const f32,
}

/// An epilogue on one row segment of C: `row += row_bias; row += col_bias; row += resid;
/// row = act(row)`, each part optional; slices have `row`'s length.
pub(crate) type EpiFn = fn(&mut [f32], Option<f32>, Option<&[f32]>, Option<&[f32]>, Option<Act>);

/// The kernels one call runs: tile kernels of one width, and the matching epilogue.
pub(crate) struct Kernels {
    /// Rows of the largest tile (A panel height).
    pub mr: usize,
    /// Columns of a tile; divides the packed panel width.
    pub nr: usize,
    /// Longest depth block: a depth is cut into `ceil(k / kc)` blocks of equal length
    /// (within one), so no block is a short remainder whose pass reads and writes all of C
    /// again. [`super::KC_MAX`] for AVX-512; [`KC`] or [`super::KC_AVX2`] for the others,
    /// whose block keeps the B micro-panel where the tiles want it.
    pub kc: usize,
    /// `tiles[r - 1]` computes `r` rows.
    pub tiles: &'static [TileFn],
    /// Full-height tiles of `tiles`' width down a micro-panel in one call, or none.
    pub column: Option<ColumnFn>,
    /// Tiles of half the width for edge columns (`nr <= NR / 2`), or empty.
    pub half: &'static [TileFn],
    /// Tiles for edge columns `nr <= NR / 4` multiplying in vectors of that width, or empty.
    pub quarter: &'static [TileFn],
    /// Tiles for edge columns `NR / 2 < nr <= 3 NR / 4` that spend no multiplies on the
    /// panel's last quarter, or empty.
    pub narrow: &'static [TileFn],
    /// Whether the tiles apply the epilogue themselves (else `epi` runs after each tile).
    pub fused: bool,
    /// Whether fused tiles apply the PRelu slopes in registers too (else the driver applies
    /// them over each stored tile).
    pub prelu: bool,
    /// Whether the loop nest issues its software prefetches: the next B micro-panel into L2,
    /// a slice per tile, while the current one's tiles run, and C's (and the residual's) rows
    /// `AHEAD` tiles down the column. Measured per microarchitecture, each on the kernels it
    /// runs. On Zen 3 (AVX2 tiles, 512 KiB L2) they took cold-weight products from 40 to 54
    /// GFLOP/s (MiniLM 0.74x the time) and a 3136x256x64 product from 26 to 58. On Zen 4
    /// (AVX-512 tiles, 1 MiB L2) the hardware prefetchers keep up and the extra requests
    /// cost time: 7 alternating `kiln bench` rounds, p50 without / with the panel prefetch:
    /// BERT-base 218 / 224 ms, ResNet-50 70.7 / 73.1, MiniLM 28.7 / 29.1; then without / with
    /// the rows ahead: MobileNet-v2 7.04 / 7.23, ResNet-50 70.5 / 70.9, MiniLM 28.7 / 28.9.
    pub prefetch: bool,
    /// Whether the tiles take an [`Ahead`] slice of the next micro-panel (B over 128 KiB, two
    /// or more row tiles per panel) and fetch it two lines per turn of their depth loop: the
    /// panel the next tiles read arrives while this one's tiles compute, where otherwise the
    /// first tile of every panel waited on memory and the others left it idle. AVX-512 only.
    /// On the Intel Xeon (2 MiB L2; cold-B sgemm bench, one thread): 32 x 3072 x 768 (a
    /// decoder's projection) 1.81 -> 1.08 ms, 48 x 3072 x 768 2.27 -> 1.50, 49 x 2048 x 512
    /// 0.98 -> 0.76; in cache within noise. Whole models (`kiln profile`, one thread):
    /// RoBERTa 0.74x the time, GPT-2 0.70x, BERT-small 0.78x, ResNet-50 0.89x, EfficientNet-B0
    /// 0.90x. The same hints issued by the driver a slice per tile (`prefetch`) measured no
    /// gain there: a burst of a few hundred hints holds the fill buffers.
    pub stream_b: bool,
    pub epi: EpiFn,
}

impl Kernels {
    /// The tiles for a panel of `nr <= self.nr` columns: the narrowest table that covers
    /// them (quarter, half, three-quarter width), else the full-width tiles.
    fn table_for(&self, nr: usize) -> &'static [TileFn] {
        let kn = self.nr;
        if nr <= kn / 4 && !self.quarter.is_empty() {
            self.quarter
        } else if nr <= kn / 2 && !self.half.is_empty() {
            self.half
        } else if nr <= kn / 4 * 3 && !self.narrow.is_empty() {
            self.narrow
        } else {
            self.tiles
        }
    }

    /// The fastest kernels of `isa` (which the caller has checked the CPU supports) that read
    /// panels of `layout`, for `m` rows of A.
    pub(crate) fn select(isa: Isa, layout: BLayout, m: usize) -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            use super::x86::{avx2, avx512};
            match isa {
                Isa::Avx512 if m == 1 && layout.nr().is_multiple_of(avx512::NR) => return avx512::gemv_kernels(),
                Isa::Avx512 if m <= 4 && layout.nr().is_multiple_of(avx512::NR) => return avx512::few_kernels(),
                Isa::Avx512 if layout.nr().is_multiple_of(avx512::NR) => return avx512::kernels(),
                // AVX-512 machines have AVX2+FMA (detection checks both): 16-wide tiles for
                // 16-column panels (and their depth block), with the AVX-512 epilogue.
                Isa::Avx512 => {
                    let wide = avx512::kernels();
                    return Kernels {
                        epi: wide.epi,
                        prefetch: wide.prefetch,
                        ..avx2::kernels()
                    };
                }
                Isa::Avx2Fma if m == 1 && layout.nr() == 32 => return avx2::gemv_kernels(),
                Isa::Avx2Fma if (1..=avx2::FEW).contains(&m) => return avx2::few_kernels(),
                Isa::Avx2Fma => return avx2::kernels(),
                Isa::Portable => {}
            }
        }
        let _ = (isa, layout, m);
        portable::kernels()
    }
}

/// C as the loop nest writes it: a pointer to element (0, 0) and the leading dimension. Each
/// call writes exactly its `m x n` elements `(i, j)` at `ptr + i*ldc + j` and nothing else, so
/// calls on disjoint column ranges of one matrix may run at once.
#[derive(Clone, Copy)]
pub(crate) struct CMut {
    pub ptr: *mut f32,
    pub ldc: usize,
}

// SAFETY: a CMut is only handed to tasks writing disjoint elements (see `run_raw`'s callers).
unsafe impl Send for CMut {}
// SAFETY: as above; the pointer itself is never used to read another task's elements.
unsafe impl Sync for CMut {}

impl CMut {
    /// The same matrix from column `j` on (no access is made: the pointer is only offset).
    pub fn at_column(self, j: usize) -> CMut {
        CMut {
            ptr: self.ptr.wrapping_add(j),
            ldc: self.ldc,
        }
    }

    /// Row `i`, columns `j .. j + w`, as a slice.
    ///
    /// # Safety
    /// The elements exist and are written by no one else while the slice lives.
    unsafe fn row<'a>(self, i: usize, j: usize, w: usize) -> &'a mut [f32] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.ldc + j), w) }
    }
}

/// Runs the loop nest. The caller has validated every shape against the slices (`validate`),
/// and chosen `kernels` for `b`'s layout.
pub(crate) fn run(
    kernels: &Kernels,
    m: usize,
    a: &AMatrix<'_>,
    b: &PackedBRef<'_>,
    c: &mut [f32],
    ldc: usize,
    epi: &Epilogue<'_>,
) {
    // SAFETY: `validate` checked that `c` holds the `m x n` elements with `ldc`, and the
    // exclusive borrow means no one else writes them.
    unsafe {
        run_raw(
            kernels,
            m,
            a,
            b,
            CMut {
                ptr: c.as_mut_ptr(),
                ldc,
            },
            epi,
        )
    }
}

/// Bytes of packed B up to which [`run_raw`] does not prefetch its micro-panels: the whole of
/// B stays in L2 (Zen 3's 512 KiB) after the first row block reads it.
const B_CACHED_BYTES: usize = 128 * 1024;

/// Bytes of packed B above which [`run_raw`] sweeps `2 * MC` rows of A per block (an A block
/// of 384 KiB): B is read once per row block, from L3 or memory once it outgrows L2. On an
/// Intel Xeon (2 MiB L2), interleaved `kiln profile` rounds, one thread: DistilBERT 0.89x the
/// time, ResNet-50 0.94x, BERT-small 0.96x (their 1.2-2.4 MB projections and late-stage
/// weights; ViT's 197 rows in one block instead of two). Twice the rows for every product
/// made SqueezeNet's small-weight convolutions 1.07x slower, hence the threshold.
const B_STREAMED_BYTES: usize = 1 << 20;

/// Rows per block of A for `m` rows, about `target` (a multiple of `mr`): the blocks come out
/// equal, and a remainder of up to a quarter block joins the others instead of making a block
/// of its own, since every block streams all of B once more (ResNet's 14 x 14 layers: 196
/// rows were 192 + 4, reading B's megabyte twice for four more rows).
pub(super) fn row_block(m: usize, target: usize, mr: usize) -> usize {
    let target = (target / mr).max(1) * mr;
    let blocks = m.saturating_sub(target / 4).div_ceil(target).max(1);
    m.div_ceil(blocks).div_ceil(mr) * mr
}

/// [`run`] on a raw C.
///
/// # Safety
/// Elements `(i, j)`, `i < m`, `j < b.n()`, at `c.ptr + i*c.ldc + j` are valid for writes and
/// nobody else reads or writes them during the call; the other operands passed `validate`
/// for this `m`, `b` and `c.ldc`.
pub(crate) unsafe fn run_raw(
    kernels: &Kernels,
    m: usize,
    a: &AMatrix<'_>,
    b: &PackedBRef<'_>,
    c: CMut,
    epi: &Epilogue<'_>,
) {
    let ldc = c.ldc;
    let (k, n) = (b.k(), b.n());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            // SAFETY: row `i < m`, columns `0..n`: this call's elements (the contract).
            let row = unsafe { c.row(i, 0, n) };
            row.fill(0.0);
            finish_row(kernels, epi, i, 0, row);
        }
        return;
    }
    if n <= SMALL_N && k >= SMALL_N_MIN_K && !a.transposed {
        // SAFETY: the caller's contract (rows `< m`, columns `< n` of C) is passed on whole.
        unsafe { small_n(kernels, m, a, b, c, epi) };
        return;
    }
    let (mr, kn) = (kernels.mr, kernels.nr);
    let pnr = b.layout().nr();
    let bdata = b.data();
    if m <= mr && matches!(b.runs().as_slice(), [(0, 0, d)] if *d == k) {
        // SAFETY: the caller's contract, passed on whole.
        unsafe { one_tile_row(kernels, m, a, b, c, epi) };
        return;
    }
    // Depth blocks `(A's first column, B's first packed row, depth)`: each of B's runs (one
    // unless gathered) cut into equal blocks. Few rows: one block a run (the A panel, `m x
    // k`, is small and C is stored once).
    // A plain loop: the iterator adapters it replaced were an eighth of a small recurrent
    // step's time (a GRU's 1 x 64 x 32 product).
    let mut blocks: smallvec::SmallVec<[(usize, usize, usize); 16]> = smallvec::SmallVec::new();
    for (pa, pb, len) in b.runs() {
        let step = if m <= mr {
            len
        } else {
            len.div_ceil(len.div_ceil(kernels.kc.max(1)))
        }
        .max(1);
        let mut q = 0;
        while q < len {
            blocks.push((pa + q, pb + q, step.min(len - q)));
            q += step;
        }
    }
    let kc_max = blocks.iter().map(|blk| blk.2).max().unwrap_or(k);
    // Rows per block: MC x KC floats of A (192 KiB) in L2, more rows when the depth block is
    // shorter (a transformer's 197 x 192 A in one block: B is then streamed once instead of
    // once per 96 rows), and twice as many when B is too large to stay in L2 between blocks
    // (`B_STREAMED_BYTES`): each block reads it from L3 or memory.
    let b_bytes = bdata.len().saturating_mul(4);
    let mc = if b_bytes > B_STREAMED_BYTES { 2 * MC } else { MC };
    let mc_max = if m <= mr {
        mr
    } else {
        row_block(m, (mc * KC / kc_max.max(1)).max(mc), mr)
    };
    let stride = b.stride();
    let b_cached = b_bytes <= B_CACHED_BYTES;
    let panel_at = |jr: usize, pc: usize| (jr / pnr) * stride + pc * pnr + jr % pnr;
    let resid = epi.residual.map(|r| (r.data.as_ptr(), r.ld));
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for (bi, &(pc, pb, kc)) in blocks.iter().enumerate() {
            let (first, last) = (bi == 0, bi + 1 == blocks.len());
            let fuse = kernels.fused && last && !epi.is_empty();
            let unfused = last && !epi.is_empty() && !kernels.fused;
            for ic in (0..m).step_by(mc_max) {
                // Stopped (`crate::stop`): the rest of C is left as it is.
                if crate::stop::requested() {
                    return;
                }
                let mc = mc_max.min(m - ic);
                let tiles_per_panel = mc.div_ceil(mr);
                for jr in (jc..jc + nc).step_by(kn) {
                    // Everything below that does not change down the panel is settled here:
                    // on a short depth (a 1x1 convolution's 16-64 channels) a tile is ~100-400
                    // cycles, and per-tile bookkeeping showed (114x96, k = 16: 28 GFLOP/s
                    // with it, 37 without, 40 for a bare loop of tile calls; Zen 3).
                    let nr = kn.min(n - jr);
                    let table = kernels.table_for(nr);
                    let boff = panel_at(jr, pb);
                    // The micro-panel the loop reads next, fetched into L2 a slice per tile
                    // while this one's tiles run (weights stream from memory: the hardware
                    // prefetchers restart on every micro-panel and the first tile stalls).
                    let next = if jr + kn < jc + nc {
                        Some((panel_at(jr + kn, pb), kc))
                    } else if ic + mc < m {
                        Some((panel_at(jc, pb), kc))
                    } else if let Some(&(_, pb1, kc1)) = blocks.get(bi + 1) {
                        Some((panel_at(jc, pb1), kc1))
                    } else if let (true, Some(&(_, pb0, kc0))) = (jc + nc < n, blocks.first()) {
                        Some((panel_at(jc + nc, pb0), kc0))
                    } else {
                        None
                    };
                    // One tile per panel (a GEMV): B is read once, front to back, which the
                    // hardware prefetchers follow; the whole next panel at once would only
                    // flood the miss queues.
                    // A B that the caches hold whole (a 1x1 convolution's 16-112 input
                    // channels) is in L2 after its first use: prefetching it again was a
                    // loop of hints per tile, 13% of MobileNetV3 on AVX2 in the driver.
                    // Each tile's share of the next panel's rows: fetched by the driver before
                    // the tile (`Kernels::prefetch`) or by the tile inside its depth loop
                    // (`Kernels::stream_b`).
                    let (next_off, next_rows) = next
                        .filter(|_| (kernels.prefetch || kernels.stream_b) && tiles_per_panel > 1 && !b_cached)
                        .unwrap_or((0, 0));
                    let chunk = next_rows.div_ceil(tiles_per_panel);
                    // The leading full-height tiles in one call when the kernels have one
                    // (and nothing runs between tiles: no unfused epilogue, PRelu after),
                    // the rest (a short last pair, see `tile_rows`) one by one below.
                    let mut skip = 0;
                    if let (Some(column), true, false) = (kernels.column, nr == kn, unfused) {
                        let count = tile_rows(mc, mr).take_while(|&(_, rows)| rows == mr).count();
                        let share = next_rows.min(count * chunk);
                        let ahead = ColumnAhead {
                            ptr: bdata.as_ptr().wrapping_add(next_off),
                            lines: if kernels.prefetch { share } else { 0 },
                            stride: pnr,
                            c_ahead: kernels.prefetch,
                        };
                        let (aoff, ars, acs) = if a.transposed {
                            (pc * a.ld + ic, 1, a.ld)
                        } else {
                            (ic * a.ld + pc, a.ld, 1)
                        };
                        let tile_epi = fuse.then(|| tile_epi(epi, ic, jr));
                        if count > 0 {
                            // SAFETY: as for the tile calls below, for the `count` tiles of
                            // `mr` rows from row `ic` (each a tile `tile_rows` yields).
                            unsafe {
                                column(
                                    count,
                                    kc,
                                    a.data.as_ptr().add(aoff),
                                    ars,
                                    acs,
                                    bdata.as_ptr().add(boff),
                                    pnr,
                                    c.ptr.add(ic * ldc + jr),
                                    ldc,
                                    nr,
                                    first,
                                    tile_epi.as_ref(),
                                    ahead,
                                );
                            }
                            if fuse && !kernels.prelu && !matches!(epi.prelu, Bias::None) {
                                // SAFETY: rows `ic .. ic + count*mr <= m`, columns `jr .. jr+nr`:
                                // this call's elements, which the tiles have just stored.
                                unsafe { prelu_tile(epi.prelu, c, ic..ic + count * mr, jr, nr) };
                            }
                        }
                        skip = count;
                    }
                    for (t, (ir, rows)) in tile_rows(mc, mr).enumerate().skip(skip) {
                        let row = ic + ir;
                        let share = (t * chunk).min(next_rows)..((t + 1) * chunk).min(next_rows);
                        let mut stream = Ahead::NONE;
                        if kernels.stream_b {
                            // Whole rows of `pnr` floats: contiguous in the packed layout.
                            let from = next_off + share.start * pnr;
                            if let Some(s) = bdata.get(from..from + share.len() * pnr) {
                                stream = Ahead {
                                    ptr: s.as_ptr(),
                                    lines: s.len().div_ceil(16),
                                };
                            }
                        } else if kernels.prefetch {
                            prefetch_rows(bdata, next_off, share, pnr, kn);
                        }
                        // The rows of C (and, on the last depth block, of the residual) that
                        // the tile AHEAD tiles down reads and writes: the tiles walk down C a
                        // line per row, which the hardware prefetchers follow poorly, and a
                        // short tile (k = 64: a 1x1 convolution's) is over before memory
                        // answers the epilogue's loads.
                        let ahead = row + AHEAD * mr;
                        if kernels.prefetch && ahead < ic + mc {
                            let till = (ahead + mr).min(ic + mc);
                            prefetch_lines(c.ptr, c.ldc, ahead..till, jr, nr);
                            if let (true, Some((r, ld))) = (last, resid) {
                                prefetch_lines(r, ld, ahead..till, jr, nr);
                            }
                        }
                        let Some(&tile) = table.get(rows - 1) else {
                            return;
                        };
                        let (aoff, ars, acs) = if a.transposed {
                            (pc * a.ld + row, 1, a.ld)
                        } else {
                            (row * a.ld + pc, a.ld, 1)
                        };
                        let tile_epi = fuse.then(|| tile_epi(epi, row, jr));
                        // SAFETY: the kernel table was chosen for a level the CPU supports
                        // (`sgemm_with` checked `is_supported`, `select` only returns its
                        // kernels). Here `row + rows <= m`, `jr < n` is a multiple of `kn`,
                        // `pc + kc <= k`. A: validate checked the span of the `m x k` matrix
                        // (row-major or transposed with `ld`); the tile reads rows `row ..
                        // row+rows`, depths `pc .. pc+kc`, each at `aoff + i*ars + p*acs`. B:
                        // panel `jr / pnr` starts `stride` floats after the one before and
                        // has the packed matrix's rows of `pnr` floats (the last one ends the
                        // data); packed rows `pb..pb+kc` lie in one of the view's runs, which
                        // `PackedBRef::gather` (or the whole `0..k`) keeps inside those rows,
                        // and `jr % pnr + kn <= pnr` as `kn` divides `pnr`; the last
                        // panel is zero-padded, so all `kn` columns are readable. C: validate
                        // checked `(m-1)*ldc + n` elements from `c.ptr` (run_raw's contract);
                        // rows `row .. row+rows`, columns `jr .. jr+nr <= n`, and `first` is
                        // false only after the previous depth block stored these elements.
                        // Epilogue: `tile_epi` points into operands whose lengths validate
                        // checked (see there).
                        unsafe {
                            tile(
                                kc,
                                a.data.as_ptr().add(aoff),
                                ars,
                                acs,
                                bdata.as_ptr().add(boff),
                                pnr,
                                c.ptr.add(row * ldc + jr),
                                ldc,
                                nr,
                                first,
                                tile_epi.as_ref(),
                                stream,
                            );
                        }
                        if fuse && !kernels.prelu && !matches!(epi.prelu, Bias::None) {
                            // SAFETY: rows `row .. row+rows < m`, columns `jr .. jr+nr <= n`:
                            // this call's elements, which the tile has just stored.
                            unsafe { prelu_tile(epi.prelu, c, row..row + rows, jr, nr) };
                        }
                        if unfused {
                            for i in row..row + rows {
                                // SAFETY: row `i < m`, columns `jr .. jr+nr <= n`: this call's.
                                let r = unsafe { c.row(i, jr, nr) };
                                finish_row(kernels, epi, i, jr, r);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// [`run_raw`] for at most `kernels.mr` rows and B whole: one tile per panel over the whole
/// depth, none of the loop nest's blocking, prefetching or per-block bookkeeping, which cost a
/// small recurrent step (a GRU's 1 x 64 x 32 product) a quarter of its time.
///
/// # Safety
/// [`run_raw`]'s contract, with `m <= kernels.mr` and `b` not gathered.
unsafe fn one_tile_row(kernels: &Kernels, m: usize, a: &AMatrix<'_>, b: &PackedBRef<'_>, c: CMut, epi: &Epilogue<'_>) {
    let (k, n, kn) = (b.k(), b.n(), kernels.nr);
    let (pnr, stride, bdata) = (b.layout().nr(), b.stride(), b.data());
    let Some(&tile) = kernels.tiles.get(m.wrapping_sub(1)) else {
        return;
    };
    let fuse = kernels.fused && !epi.is_empty();
    let (ars, acs) = if a.transposed { (1, a.ld) } else { (a.ld, 1) };
    for jr in (0..n).step_by(kn) {
        let nr = kn.min(n - jr);
        let tile = kernels.table_for(nr).get(m - 1).copied().unwrap_or(tile);
        let tile_epi = fuse.then(|| tile_epi(epi, 0, jr));
        // SAFETY: as in `run_raw`'s loop nest with one row tile (rows `0 .. m`) and one depth
        // block (`0 .. k`): A's `m x k` span was validated; panel `jr / pnr` starts `stride`
        // floats after the one before, `jr % pnr + kn <= pnr` and the last panel is
        // zero-padded; C's rows `0 .. m`, columns `jr .. jr + nr <= n` are this call's.
        unsafe {
            tile(
                k,
                a.data.as_ptr(),
                ars,
                acs,
                bdata.as_ptr().add((jr / pnr) * stride + jr % pnr),
                pnr,
                c.ptr.add(jr),
                c.ldc,
                nr,
                true,
                tile_epi.as_ref(),
                Ahead::NONE,
            );
        }
        if fuse && !kernels.prelu && !matches!(epi.prelu, Bias::None) {
            // SAFETY: rows `0 .. m`, columns `jr .. jr + nr <= n`: this call's elements.
            unsafe { prelu_tile(epi.prelu, c, 0..m, jr, nr) };
        }
        if !epi.is_empty() && !kernels.fused {
            for i in 0..m {
                // SAFETY: row `i < m`, columns `jr .. jr + nr <= n`: this call's.
                let r = unsafe { c.row(i, jr, nr) };
                finish_row(kernels, epi, i, jr, r);
            }
        }
    }
}

/// The row tiles of a block of `mc` rows: `(first row, rows)`, `mr` rows each, except that
/// a remainder of at most a third of a tile shares the last full tile's rows half and half
/// (32 rows: 6+6+6+6+4+4 rather than 6+6+6+6+6+2). A tile of one or two rows keeps too few
/// accumulators to hide the FMA latency: it took two-thirds of a full tile's time for a
/// third of its work.
fn tile_rows(mc: usize, mr: usize) -> impl Iterator<Item = (usize, usize)> {
    let rem = mc % mr.max(1);
    let split = mc > mr && rem > 0 && rem * 3 <= mr;
    // Rows before the last two tiles when they are split, else all of them.
    let even = if split { mc - mr - rem } else { mc };
    let last = mr + rem;
    let tail = split
        .then(|| [(even, last / 2), (even + last / 2, last - last / 2)])
        .into_iter()
        .flatten();
    (0..even)
        .step_by(mr.max(1))
        .map(move |ir| (ir, mr.min(even - ir)))
        .chain(tail)
}

/// Widest B run as dot products ([`small_n`]) instead of tiles.
const SMALL_N: usize = 4;
/// Shallowest depth [`small_n`] takes (below it the tiles' overhead is small anyway).
const SMALL_N_MIN_K: usize = 8;

/// A product with at most [`SMALL_N`] columns (a detection or segmentation head's 1x1
/// convolution to 1-4 channels over every pixel): each element of C is a dot product of A's row
/// with one column of B, eight lanes wide, where the tiles would spend 15 of every 16 lanes on
/// padding and store through their edge path (Zen 3, 22201 x 32 x 2: 1.3 GFLOP/s tiled). The
/// lanes sum in a fixed order, so every level gives the same bits; then the epilogue per row.
///
/// # Safety
/// As [`run_raw`]: `c` points at `m` rows of `b.n()` writable elements (leading dimension
/// `c.ldc`) that no one else touches during the call, and `a` is row-major (validated).
unsafe fn small_n(kernels: &Kernels, m: usize, a: &AMatrix<'_>, b: &PackedBRef<'_>, c: CMut, epi: &Epilogue<'_>) {
    let (k, n, pnr) = (b.k(), b.n(), b.layout().nr());
    // B's columns, each contiguous over the depth (all in the first panel: n <= SMALL_N < nr).
    let mut cols = [0f32; SMALL_N * 4096];
    let mut heap: Vec<f32> = Vec::new();
    let bt: &mut [f32] = if n * k <= cols.len() {
        &mut cols[..n * k]
    } else {
        heap.resize(n * k, 0.0);
        &mut heap
    };
    let bdata = b.data();
    let runs = b.runs();
    for (j, col) in bt.chunks_mut(k).enumerate() {
        for &(pa, pb, len) in &runs {
            for (q, v) in col.iter_mut().skip(pa).take(len).enumerate() {
                *v = bdata.get((pb + q) * pnr + j).copied().unwrap_or(0.0);
            }
        }
    }
    let bt: &[f32] = bt;
    // A column bias alone is added here (the same f32 addition the epilogue makes); a row
    // bias, a residual or an activation goes through the epilogue row by row.
    let col_bias = match epi.bias {
        _ if epi.residual.is_some() || epi.act.is_some() || epi.post.is_some() => None,
        _ if !matches!(epi.prelu, Bias::None) => None,
        Bias::Col(v) => Some(v),
        Bias::None => Some(&[][..]),
        _ => None,
    };
    const BLOCK: usize = 256;
    for i0 in (0..m).step_by(BLOCK) {
        if crate::stop::requested() {
            return;
        }
        let rows = i0..(i0 + BLOCK).min(m);
        crate::simd::vectorize(|| {
            for i in rows.clone() {
                let arow = a.data.get(i * a.ld..i * a.ld + k).unwrap_or(&[]);
                // SAFETY: row `i < m`, columns `0..n`: this call's elements (the contract).
                let row = unsafe { c.row(i, 0, n) };
                for (j, (o, col)) in row.iter_mut().zip(bt.chunks(k)).enumerate() {
                    let d = dot8(arow, col);
                    *o = match col_bias.and_then(|b| b.get(j)) {
                        Some(&bj) => d + bj,
                        None => d,
                    };
                }
            }
        });
        if col_bias.is_none() {
            for i in rows {
                // SAFETY: as above.
                let row = unsafe { c.row(i, 0, n) };
                finish_row(kernels, epi, i, 0, row);
            }
        }
    }
}

/// `sum a[p] * b[p]` in eight interleaved partial sums (lane `p % 8`), then the lanes pairwise
/// and the tail in order: the same bits at every SIMD level.
#[inline(always)]
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ac = a.chunks_exact(8);
    let mut bc = b.chunks_exact(8);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        tail += x * y;
    }
    let s4 = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3]) + tail
}

/// How many tiles ahead of the running one C's and the residual's rows are fetched.
const AHEAD: usize = 2;

/// Asks for rows `rows`, columns `j .. j + width` (at most 16 floats: one or two lines) of
/// the matrix at `base` with leading dimension `ld` to be fetched into L1. Only a hint: the
/// addresses are formed with wrapping arithmetic and nothing is read or written.
#[inline]
fn prefetch_lines(base: *const f32, ld: usize, rows: std::ops::Range<usize>, j: usize, width: usize) {
    for i in rows {
        let row = base.wrapping_add(i * ld + j);
        crate::hint::to_l1(row);
        crate::hint::to_l1(row.wrapping_add(width.saturating_sub(1)));
    }
}

/// Asks for rows `rows` of a micro-panel (`width` floats from `data[off + p*stride]`) to be
/// fetched into L2. Only a hint: addresses outside `data` are skipped, and nothing is read.
#[inline]
fn prefetch_rows(data: &[f32], off: usize, rows: std::ops::Range<usize>, stride: usize, width: usize) {
    const LINE: usize = 16;
    for p in rows {
        let start = off + p * stride;
        for o in (start..start + width).step_by(LINE) {
            if let Some(x) = data.get(o) {
                crate::hint::to_l2(x);
            }
        }
    }
}

/// Pointers into the epilogue's operands at row `i0`, column `j0` of C. The caller has
/// validated their lengths (row bias `m`, column bias `n`, residual span `m x n` with its ld),
/// so every tile inside C finds its rows and columns there.
fn tile_epi(epi: &Epilogue<'_>, i0: usize, j0: usize) -> TileEpi {
    let null = std::ptr::null::<f32>();
    let at = |s: &[f32], o: usize| s.get(o..).map_or(null, <[f32]>::as_ptr);
    let (row_bias, col_bias) = match epi.bias {
        Bias::None => (null, null),
        Bias::Row(v) => (at(v, i0), null),
        Bias::Col(v) => (null, at(v, j0)),
    };
    let (resid, resid_ld) = match epi.residual {
        Some(r) => (at(r.data, i0 * r.ld + j0), r.ld),
        None => (null, 0),
    };
    let (prelu_row, prelu_col) = match epi.prelu {
        Bias::None => (null, null),
        Bias::Row(v) => (at(v, i0), null),
        Bias::Col(v) => (null, at(v, j0)),
    };
    TileEpi {
        row_bias,
        col_bias,
        resid,
        resid_ld,
        act: epi.act,
        post: epi.post,
        prelu_row,
        prelu_col,
    }
}

/// `v < 0 ? v * slope : v` over row `i`, columns `j0 .. j0 + row.len()` of C, the slope of
/// the row or of each column (nothing for `Bias::None` or slopes shorter than C).
fn prelu_row(slopes: Bias<'_>, i: usize, j0: usize, row: &mut [f32]) {
    match slopes {
        Bias::None => {}
        Bias::Row(v) => {
            if let Some(&s) = v.get(i) {
                crate::vector::prelu_one(row, s);
            }
        }
        Bias::Col(v) => {
            if let Some(s) = v.get(j0..j0 + row.len()) {
                crate::vector::prelu_channels(row, s);
            }
        }
    }
}

/// [`prelu_row`] over the rows `rows`, columns `j0 .. j0 + w` of a stored tile (for kernels
/// whose tiles do not apply the slopes).
///
/// # Safety
/// The elements exist and no one else reads or writes them during the call.
unsafe fn prelu_tile(slopes: Bias<'_>, c: CMut, rows: std::ops::Range<usize>, j0: usize, w: usize) {
    for i in rows {
        // SAFETY: the caller's contract.
        let row = unsafe { c.row(i, j0, w) };
        prelu_row(slopes, i, j0, row);
    }
}

/// The epilogue on row `i`, columns `j0 .. j0 + row.len()` of C.
pub(super) fn finish_row(kernels: &Kernels, epi: &Epilogue<'_>, i: usize, j0: usize, row: &mut [f32]) {
    let w = row.len();
    let (row_bias, col_bias) = match epi.bias {
        Bias::None => (None, None),
        Bias::Row(v) => (v.get(i).copied(), None),
        Bias::Col(v) => (None, v.get(j0..j0 + w)),
    };
    let resid = epi.residual.and_then(|r| r.data.get(i * r.ld + j0..i * r.ld + j0 + w));
    (kernels.epi)(row, row_bias, col_bias, resid, epi.act);
    prelu_row(epi.prelu, i, j0, row);
    if let Some(post) = epi.post {
        post.apply_slice(row);
    }
}

#[cfg(test)]
mod tests {
    use super::tile_rows;

    /// Every row in exactly one tile, in order, no tile above `mr`, as many tiles as whole
    /// `mr`-row steps need; a short remainder shares the last full tile.
    #[test]
    fn tile_rows_cover_each_row_once() {
        for mr in [1, 4, 6, 8] {
            for mc in 0..60 {
                let tiles: Vec<(usize, usize)> = tile_rows(mc, mr).collect();
                let mut next = 0;
                for &(ir, rows) in &tiles {
                    assert_eq!(ir, next, "mc {mc} mr {mr}: {tiles:?}");
                    assert!(rows >= 1 && rows <= mr, "mc {mc} mr {mr}: {tiles:?}");
                    next += rows;
                }
                assert_eq!(next, mc, "mc {mc} mr {mr}: {tiles:?}");
                assert_eq!(tiles.len(), mc.div_ceil(mr), "mc {mc} mr {mr}: {tiles:?}");
            }
        }
        let t: Vec<usize> = tile_rows(32, 6).map(|(_, r)| r).collect();
        assert_eq!(t, [6, 6, 6, 6, 4, 4]);
        let t: Vec<usize> = tile_rows(49, 6).map(|(_, r)| r).collect();
        assert_eq!(t, [6, 6, 6, 6, 6, 6, 6, 3, 4]);
        let t: Vec<usize> = tile_rows(5, 6).map(|(_, r)| r).collect();
        assert_eq!(t, [5]);
    }
}
