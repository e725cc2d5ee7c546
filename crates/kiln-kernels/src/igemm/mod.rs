//! Integer GEMM: `C[m][n] = sum_k (A[m][k] - za) * (B[k][n] - zb[n])`, exact in i32, for
//! 8-bit activations (u8 or s8, one zero point) and 8-bit weights (s8 or u8, a zero point per
//! column), the product behind QLinearMatMul, MatMulInteger and the integer convolutions.
//!
//! B is packed once (at compile time for constant weights) with its zero points already
//! subtracted, as 16-bit pairs of consecutive depths in panels of [`NR`] columns
//! ([`PackedB`]); with the column sums of the packed values, A's zero point folds into the
//! result as `- za * colsum[n]`, so A's values are used as they are: widened to 16-bit pairs
//! per micro-tile (blocks of 96 rows packed together, each 16 KiB panel of B then run against
//! the block's tiles from L1, Goto's order). Each step multiplies a broadcast pair of A
//! values by a pair row of B and adds both products into an i32 lane: AVX2's `vpmaddwd`,
//! exact for any 16-bit operands (unlike `vpmaddubsw`, whose 16-bit sums saturate for u8 x
//! s8 products: kiln never uses it). On AVX2 this caps the integer GEMM at about 1.5x the
//! f32 GEMM's rate (one `vpmaddwd` and one add per 16 multiply-adds); ONNX Runtime's AVX2
//! path uses `vpmaddubsw` and accepts its saturation. The portable twin computes the same sums in
//! plain Rust; the property tests (`tests/igemm_props.rs`) hold both against an i64 oracle.
//!
//! Exactness: every term is at most 255 * 255 in magnitude, so the i32 sum is exact while
//! `K * 65025 < 2^31` ([`MAX_EXACT_DEPTH`]: 33,025 depths); deeper products are summed in
//! blocks of that depth into i64 and then must fit i32 ([`igemm`] reports an overflow).

use crate::isa::{self, Isa};
use std::ops::Range;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod conv;
#[cfg(target_arch = "x86_64")]
mod vnni;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use amx::request_tile_state;
pub use conv::{ConvScratch, ConvWindow, conv_requant_serial, conv_row_run, conv_rows_requant_serial};

/// Columns per packed panel of B (two 8-lane i32 vectors).
pub const NR: usize = 16;
/// Rows of A per micro-tile.
pub const MR: usize = 6;
/// Depth of one block: a panel of B for it is `NR * KC * 2` bytes (16 KiB), in L1 beside A's.
const KC: usize = 512;
/// Deepest product whose i32 sum is exact for any 8-bit operands and zero points.
pub const MAX_EXACT_DEPTH: usize = 33_024;

/// An 8-bit element type of A or B.
pub trait Int8: Copy + Send + Sync + 'static {
    /// What [`Int8::to_u8`] adds to a value (and so to its zero point).
    const OFFSET: i32;
    fn widen(self) -> i32;
    /// The value plus [`Int8::OFFSET`], as the u8 operand of the VNNI dot products.
    fn to_u8(self) -> u8;
    /// The values' bytes (two's complement for i8).
    fn bytes(v: &[Self]) -> &[u8];
    /// [`Int8::bytes`], writable.
    fn bytes_mut(v: &mut [Self]) -> &mut [u8];
    /// Bytes as values (the inverse of [`Int8::bytes`]).
    fn of_bytes(v: &[u8]) -> &[Self];
    /// [`Int8::of_bytes`], writable.
    fn of_bytes_mut(v: &mut [u8]) -> &mut [Self];
}

impl Int8 for u8 {
    const OFFSET: i32 = 0;
    #[inline(always)]
    fn widen(self) -> i32 {
        i32::from(self)
    }
    #[inline(always)]
    fn to_u8(self) -> u8 {
        self
    }
    fn bytes(v: &[u8]) -> &[u8] {
        v
    }
    fn bytes_mut(v: &mut [u8]) -> &mut [u8] {
        v
    }
    fn of_bytes(v: &[u8]) -> &[u8] {
        v
    }
    fn of_bytes_mut(v: &mut [u8]) -> &mut [u8] {
        v
    }
}

impl Int8 for i8 {
    const OFFSET: i32 = 128;
    #[inline(always)]
    fn widen(self) -> i32 {
        i32::from(self)
    }
    #[inline(always)]
    fn to_u8(self) -> u8 {
        (self as u8) ^ 0x80
    }
    fn bytes(v: &[i8]) -> &[u8] {
        // SAFETY: i8 and u8 have the same size and alignment and every bit pattern is valid
        // for both; the new slice covers exactly the same memory for the same lifetime.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len()) }
    }
    fn bytes_mut(v: &mut [i8]) -> &mut [u8] {
        // SAFETY: as in `bytes`; the new slice borrows `v` mutably for its lifetime, so no
        // other reference to that memory exists meanwhile.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len()) }
    }
    fn of_bytes(v: &[u8]) -> &[i8] {
        // SAFETY: as in `bytes`, the other way round.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<i8>(), v.len()) }
    }
    fn of_bytes_mut(v: &mut [u8]) -> &mut [i8] {
        // SAFETY: as in `bytes_mut`, the other way round.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<i8>(), v.len()) }
    }
}

/// Why an integer GEMM could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IgemmError {
    Short {
        what: &'static str,
        got: usize,
        want: usize,
    },
    Depth {
        m: usize,
        k: usize,
        bk: usize,
        n: usize,
    },
    Overflow {
        m: usize,
        n: usize,
        sum: i64,
    },
    /// A requantizing path was handed a B packed about its type's center
    /// ([`PackedB::pack_for_sums`]), whose sums need a correction only the i32 paths apply.
    Centered,
}

impl std::fmt::Display for IgemmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IgemmError::Short { what, got, want } => {
                write!(f, "integer GEMM: {what} has {got} elements, expected at least {want}")
            }
            IgemmError::Depth { m, k, bk, n } => {
                write!(f, "integer GEMM: A is {m}x{k}, B is {bk}x{n}: the depths differ")
            }
            IgemmError::Overflow { m, n, sum } => {
                write!(
                    f,
                    "integer GEMM: row {m}, column {n}: the exact sum {sum} does not fit in int32"
                )
            }
            IgemmError::Centered => write!(
                f,
                "integer GEMM: B was packed about its type's center, for int32 sums only, not for a requantizing product"
            ),
        }
    }
}

impl std::error::Error for IgemmError {}

/// How [`PackedB`] holds B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// 16-bit, pairs of consecutive depths per column, panels of [`NR`] columns: every level
    /// (`vpmaddwd` on AVX2), any zero point.
    Pairs,
    /// 8-bit signed, quads of consecutive depths per column, panels of [`NR_QUADS`] columns:
    /// AVX-512 VNNI's `vpdpbusd` (u8 x s8, four products per i32 lane). Only when every
    /// `B - zb` fits in i8.
    Quads,
}

/// Columns per panel of the [`Packing::Quads`] format (two 16-lane i32 vectors).
pub const NR_QUADS: usize = 32;
/// Rows of A per micro-tile of the quads kernel.
pub const MR_QUADS: usize = 8;
/// Deepest block of the quads kernel: a panel of B for it is `NR_QUADS * 640` bytes (20 KiB),
/// in L1 beside A's 5 KiB. Deeper products are cut into equal blocks no deeper than this.
const KC_QUADS: usize = 640;
/// Whether a product of `m` rows and depth `k` runs on AMX tiles: where
/// [`Isa::has_int8_tiles`], at least one 16-row tile of rows and 16 depths (a quarter of a
/// tile's 64). Shallower products fill too little of each tile. Once the tiles started from
/// zero and their epilogue narrowed by a byte permute, depths 16-63 ran faster on them than on
/// VNNI, whose epilogue is the larger part of so shallow a product (MobileNet-v2's 24- and
/// 32-deep 1x1 layers 10-20% faster, its 27-deep stem 9%; once, before those, 16 -> 64
/// channels ran at 72 GOP/s on the tiles, 107 on VNNI). ResNet-50's fused 64 -> 256 1x1
/// convolutions, 0.9 ms on the tiles against 0.64 on VNNI while the tiles' rows straddled
/// cache lines and their sums went to a C of megabytes, became faster on the tiles once both were fixed (the three 1x1 layers
/// of its first stage 4.4 ms against 5.1 per run).
/// Whether this convolution's windows are read on the AMX tiles from a padded copy of its
/// input rows ([`conv_requant_serial`] by taps, `row_run` `None`; [`conv_rows_requant_serial`]
/// by kernel rows of `row_run` values): stride 1, few padding columns. No im2col rows and no
/// sums in memory, so callers may hand it many pixels at once (each call copies its rows
/// and streams all of B once).
pub fn conv_reads_flat(isa: Isa, win: &ConvWindow, row_run: Option<usize>) -> bool {
    let depth = row_run.map_or(win.depth(), |kr| win.kernel.0 * kr);
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    return on_tiles(isa, 16, depth) && amx::flat_fits(win, row_run);
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    return {
        let _ = (isa, depth);
        false
    };
}

/// Whether [`igemm_requant_serial`] multiplies a product of depth `k` (and at least 16 rows)
/// on the AMX tiles, whose fused epilogue keeps no sums in memory: its callers may then hand
/// it many rows at once (each call streams all of B once).
pub fn requant_on_tiles(isa: Isa, k: usize) -> bool {
    on_tiles(isa, 16, k)
}

fn on_tiles(isa: Isa, m: usize, k: usize) -> bool {
    m >= 16 && k >= 16 && k <= MAX_EXACT_DEPTH && isa.has_int8_tiles()
}
/// Zero bytes after the last panel of the quads format: the AMX tiles read a panel's depth in
/// whole chunks of 16 quads, so up to 15 quads (of 128 bytes) past its end.
const QUADS_TAIL: usize = 15 * 4 * NR_QUADS;
/// Bytes of packed B one column block of [`serial_quads`] holds per depth block.
const B_BLOCK_BYTES: usize = 512 * 1024;

#[derive(Debug, Clone, PartialEq)]
enum Data {
    /// Panel `p`, depth pair `q`, column `j` of the panel, depth `d` of the pair:
    /// `[(p * kpairs + q) * 2 * NR + 2 * j + d]`.
    Pairs(Vec<i16>),
    /// Panel `p`, depth quad `q`, column `j`, depth `d` of the quad:
    /// `[(p * kquads + q) * 4 * NR_QUADS + 4 * j + d]`.
    Quads(Lines),
}

/// Bytes that start on a 64-byte boundary (a cache line), wherever the allocator puts them:
/// every 128-byte row of a panel of quads then lies on whole lines, as the AMX tiles and the
/// VNNI loads read them (a row across two lines halved the tiles' speed).
#[derive(Clone, PartialEq, Default)]
pub(crate) struct Lines {
    lines: Vec<Line>,
    len: usize,
}

#[derive(Clone, Copy, PartialEq)]
#[repr(C, align(64))]
struct Line([i8; 64]);

impl Lines {
    /// `len` zero bytes.
    fn zeroed(len: usize) -> Lines {
        Lines {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lines({} bytes)", self.len)
    }
}

impl std::ops::Deref for Lines {
    type Target = [i8];
    fn deref(&self) -> &[i8] {
        // SAFETY: `lines` holds `len.div_ceil(64)` lines of 64 initialised i8, contiguous
        // (`Line` is `repr(C)` of one `[i8; 64]`, size 64), so its first `len` bytes are
        // initialised i8 borrowed with `self`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<i8>(), self.len.min(64 * self.lines.len())) }
    }
}

impl std::ops::DerefMut for Lines {
    fn deref_mut(&mut self) -> &mut [i8] {
        let len = self.len.min(64 * self.lines.len());
        // SAFETY: as in `deref`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<i8>(), len) }
    }
}

/// B (K x N, weights) packed for [`igemm`]: zero points subtracted, pairs (16-bit) or quads
/// (8-bit) of depths interleaved per column in panels (the last padded with zero columns),
/// the depth padded with zero rows.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedB {
    k: usize,
    n: usize,
    data: Data,
    /// `sum_k (B[k][n] - zb[n])` per column.
    col_sums: Vec<i32>,
    /// Set when B is held about its type's center `c` rather than its zero points
    /// ([`PackedB::pack_for_sums`]).
    centered: Option<Centered>,
}

/// B held as `B - c` (`c` 128 for u8, 0 for i8: always an i8, so always in quads) where some
/// `B - zb` does not fit in i8: `(A - za)(B - zb) = (A - za)(B - c) + (c - zb[n]) S[m]`, with
/// `S[m] = sum_k (A[m][k] - za)` the row sums of A, added after the product.
#[derive(Debug, Clone, PartialEq)]
struct Centered {
    /// `c - zb[n]` per column.
    shift: Vec<i32>,
    /// `sum_k (B[k][n] - c)` per column: what A's zero point folds in with.
    sums: Vec<i32>,
}

impl PackedB {
    /// Packs the row-major K x N matrix `b` (`b[k * n + j]`) with the zero point of each
    /// column (`zero_points` of one element applies to all; empty means 0), in the format the
    /// active level runs fastest.
    pub fn pack<T: Int8>(b: &[T], k: usize, n: usize, zero_points: &[T]) -> Result<PackedB, IgemmError> {
        let packing = if isa::active().has_int8_dot() {
            Packing::Quads
        } else {
            Packing::Pairs
        };
        match PackedB::pack_as(packing, b, k, n, zero_points)? {
            Some(p) => Ok(p),
            None => PackedB::pack_as(Packing::Pairs, b, k, n, zero_points)?.ok_or(IgemmError::Short {
                what: "B",
                got: b.len(),
                want: k.saturating_mul(n),
            }),
        }
    }

    /// [`PackedB::pack`] for the products whose exact sums go to C ([`igemm`],
    /// [`igemm_with`], [`igemm_serial`]; the requantizing paths refuse it): where the level
    /// has quads but some `B - zb` does not fit in i8 (u8 weights, a zero point far from the
    /// values), B is held about its type's center instead of falling back to pairs, and the
    /// product adds `(c - zb[n])` times A's row sums after the quads (see [`Centered`]).
    pub fn pack_for_sums<T: Int8>(b: &[T], k: usize, n: usize, zero_points: &[T]) -> Result<PackedB, IgemmError> {
        if isa::active().has_int8_dot()
            && let Some(p) = PackedB::pack_as(Packing::Quads, b, k, n, zero_points)?
        {
            return Ok(p);
        }
        if !isa::active().has_int8_dot() || k > MAX_EXACT_DEPTH {
            return PackedB::pack(b, k, n, zero_points);
        }
        // The type's center: `T::to_u8` maps it to 128.
        let center = 128 - T::OFFSET;
        let mut p = PackedB::pack_with(Packing::Quads, b, k, n, &|_| center)?.ok_or(IgemmError::Short {
            what: "B",
            got: b.len(),
            want: k.saturating_mul(n),
        })?;
        let zbs = column_zero_points(zero_points, n)?;
        let shift: Vec<i32> = zbs.iter().map(|&z| center - z).collect();
        let k32 = i32::try_from(k).unwrap_or(i32::MAX);
        // True sums: sum (B - zb) = sum (B - c) + k (c - zb).
        let sums = std::mem::take(&mut p.col_sums);
        p.col_sums = sums
            .iter()
            .zip(&shift)
            .map(|(&s, &d)| s.wrapping_add(k32.wrapping_mul(d)))
            .collect();
        p.centered = Some(Centered { shift, sums });
        Ok(p)
    }

    /// Packs in the given format; `None` for [`Packing::Quads`] when some `B - zb` does not
    /// fit in i8 (u8 weights, or a zero point far from the values).
    pub fn pack_as<T: Int8>(
        packing: Packing,
        b: &[T],
        k: usize,
        n: usize,
        zero_points: &[T],
    ) -> Result<Option<PackedB>, IgemmError> {
        let want = k.saturating_mul(n);
        if b.len() < want {
            return Err(IgemmError::Short {
                what: "B",
                got: b.len(),
                want,
            });
        }
        let zbs = column_zero_points(zero_points, n)?;
        PackedB::pack_with(packing, b, k, n, &|j| zbs.get(j).copied().unwrap_or(0))
    }

    /// [`PackedB::pack_as`] with the value `zb(j)` subtracted from column `j`.
    fn pack_with<T: Int8>(
        packing: Packing,
        b: &[T],
        k: usize,
        n: usize,
        zb: &dyn Fn(usize) -> i32,
    ) -> Result<Option<PackedB>, IgemmError> {
        let want = k.saturating_mul(n);
        if b.len() < want {
            return Err(IgemmError::Short {
                what: "B",
                got: b.len(),
                want,
            });
        }
        let (group, nr) = match packing {
            Packing::Pairs => (2, NR),
            Packing::Quads => (4, NR_QUADS),
        };
        let groups = k.div_ceil(group);
        let panels = n.div_ceil(nr);
        let len = panels * groups * group * nr;
        // The zero points per column, once.
        let zbs: Vec<i32> = (0..n).map(zb).collect();
        let mut col_sums = vec![0i32; n];
        // Writes each `B - zb` through `put(index, value)`; false when `put` refuses one.
        let mut fill = |put: &mut dyn FnMut(usize, i32) -> bool| -> bool {
            for (kk, row) in b.chunks_exact(n.max(1)).take(k).enumerate() {
                let (q, d) = (kk / group, kk % group);
                for (j, ((&v, &z), s)) in row.iter().zip(&zbs).zip(col_sums.iter_mut()).enumerate() {
                    let w = v.widen() - z;
                    *s += w;
                    if !put(((j / nr) * groups + q) * group * nr + group * (j % nr) + d, w) {
                        return false;
                    }
                }
            }
            true
        };
        let data = match packing {
            Packing::Pairs => {
                let mut v = vec![0i16; len];
                fill(&mut |at, w| {
                    if let Some(slot) = v.get_mut(at) {
                        *slot = w as i16;
                    }
                    true
                });
                Data::Pairs(v)
            }
            Packing::Quads => {
                let mut v = Lines::zeroed(len + QUADS_TAIL);
                let fits = fill(&mut |at, w| match (v.get_mut(at), i8::try_from(w)) {
                    (Some(slot), Ok(x)) => {
                        *slot = x;
                        true
                    }
                    (None, Ok(_)) => true,
                    (_, Err(_)) => false,
                });
                if !fits {
                    return Ok(None);
                }
                Data::Quads(v)
            }
        };
        Ok(Some(PackedB {
            k,
            n,
            data,
            col_sums,
            centered: None,
        }))
    }

    pub fn depth(&self) -> usize {
        self.k
    }

    pub fn columns(&self) -> usize {
        self.n
    }

    /// The format B is held in.
    pub fn packing(&self) -> Packing {
        match self.data {
            Data::Pairs(_) => Packing::Pairs,
            Data::Quads(_) => Packing::Quads,
        }
    }

    /// `sum_k (B[k][n] - zb[n])` of column `n`.
    pub fn col_sums(&self) -> &[i32] {
        &self.col_sums
    }

    /// The sums of the packed values per column, which A's zero point folds in with.
    fn fold_sums(&self) -> &[i32] {
        self.centered.as_ref().map_or(&self.col_sums, |c| &c.sums)
    }

    /// Refuses a centered B (see [`Centered`]) on the requantizing paths.
    fn uncentered(&self) -> Result<(), IgemmError> {
        match self.centered {
            Some(_) => Err(IgemmError::Centered),
            None => Ok(()),
        }
    }

    /// Adds the centered B's correction `(c - zb[n]) S[m]` to the `m` rows of C (`ldc`
    /// apart), `S[m]` the sum of row `m` of `A - za`; rows over the current pool when `split`.
    fn add_centering<T: Int8>(&self, p: Product<'_, T>, c: &mut [i32], ldc: usize, split: bool) {
        let Some(centered) = &self.centered else { return };
        let (k, lda, za) = (p.k, p.lda, p.a_zero);
        let k32 = i32::try_from(k).unwrap_or(i32::MAX);
        let fix = |i: usize, row: &mut [i32]| {
            let Some(a) = p.a.get(i * lda..i * lda + k) else { return };
            let sum = a.iter().fold(0i32, |acc, v| acc.wrapping_add(v.widen()));
            let s = sum.wrapping_sub(za.wrapping_mul(k32));
            // `zip` stops at B's columns: C's rows may be longer (`ldc`).
            for (o, &d) in row.iter_mut().zip(&centered.shift) {
                *o = o.wrapping_add(s.wrapping_mul(d));
            }
        };
        let c = match c.get_mut(..(p.m.saturating_sub(1)) * ldc + self.n) {
            Some(c) => c,
            None => return,
        };
        if split && p.m * self.n >= 1 << 15 {
            crate::pool::for_each_chunk_mut(c, ldc, &fix);
        } else {
            for (i, row) in c.chunks_mut(ldc).enumerate() {
                fix(i, row);
            }
        }
    }

    fn kpairs(&self) -> usize {
        self.k.div_ceil(2)
    }

    /// Panel `p`'s depth pairs `q0..q1` (pairs format; empty otherwise).
    fn panel(&self, p: usize, q0: usize, q1: usize) -> &[i16] {
        let Data::Pairs(data) = &self.data else { return &[] };
        let base = p * self.kpairs() * 2 * NR;
        data.get(base + q0 * 2 * NR..base + q1 * 2 * NR).unwrap_or(&[])
    }

    /// Depth quads `q0..q1` of every panel (quads format; empty otherwise): panel `p`'s at
    /// `p * stride` of the strip.
    fn quad_strip(&self, q0: usize, q1: usize) -> Strip<'_> {
        let empty = Strip {
            data: &[],
            panels: 0,
            stride: 0,
        };
        let Data::Quads(data) = &self.data else { return empty };
        let stride = self.k.div_ceil(4) * 4 * NR_QUADS;
        let panels = self.n.div_ceil(NR_QUADS);
        let end = panels.saturating_sub(1) * stride + q1 * 4 * NR_QUADS;
        match data.get(q0 * 4 * NR_QUADS..end) {
            Some(d) if panels > 0 && q1 >= q0 => Strip {
                data: d,
                panels,
                stride,
            },
            _ => empty,
        }
    }

    /// What the quads kernel's first depth block adds to its sums for an A whose zero point
    /// (offset to u8) is `za`: `-za * colsum[j]`, padded with zeros to whole panels, into
    /// `out` (its allocation reused).
    fn quads_init(&self, za: i32, out: &mut Vec<i32>) {
        out.clear();
        out.extend(self.fold_sums().iter().map(|&s| za.wrapping_mul(s).wrapping_neg()));
        out.resize(self.n.div_ceil(NR_QUADS) * NR_QUADS, 0);
    }

    /// `B[k][j] - zb[j]` as packed (the deep path reads it one value at a time).
    fn value(&self, kk: usize, j: usize) -> i64 {
        let shift = self
            .centered
            .as_ref()
            .and_then(|c| c.shift.get(j))
            .map_or(0, |&d| i64::from(d));
        shift
            + match &self.data {
                Data::Pairs(data) => {
                    let (p, jj, q, d) = (j / NR, j % NR, kk / 2, kk % 2);
                    let at = (p * self.kpairs() + q) * 2 * NR + 2 * jj + d;
                    data.get(at).copied().map_or(0, i64::from)
                }
                Data::Quads(data) => {
                    let (p, jj, q, d) = (j / NR_QUADS, j % NR_QUADS, kk / 4, kk % 4);
                    let at = (p * self.k.div_ceil(4) + q) * 4 * NR_QUADS + 4 * jj + d;
                    data.get(at).copied().map_or(0, i64::from)
                }
            }
    }
}

/// One zero point per column of `n` from none (0), one, or `n` of them.
fn column_zero_points<T: Int8>(zero_points: &[T], n: usize) -> Result<Vec<i32>, IgemmError> {
    match zero_points {
        [] => Ok(vec![0; n]),
        [z] => Ok(vec![z.widen(); n]),
        zs if zs.len() >= n => Ok(zs.iter().take(n).map(|z| z.widen()).collect()),
        zs => Err(IgemmError::Short {
            what: "B's zero points",
            got: zs.len(),
            want: n,
        }),
    }
}

/// `C = (A - za) B` (see the module docs) for the row-major M x K matrix `a` (`lda` apart)
/// into the row-major M x N matrix `c` (`ldc` apart), overwritten; on the active level, rows
/// split over the current pool.
#[allow(clippy::too_many_arguments)]
pub fn igemm<T: Int8>(
    m: usize,
    k: usize,
    a: &[T],
    lda: usize,
    a_zero: i32,
    b: &PackedB,
    c: &mut [i32],
    ldc: usize,
) -> Result<(), IgemmError> {
    igemm_with(isa::active(), m, k, a, lda, a_zero, b, c, ldc)
}

/// The operands of one product `(A - za) B`: A's `m` rows of depth `k`, `lda` apart.
#[derive(Clone, Copy)]
struct Product<'a, T> {
    m: usize,
    k: usize,
    a: &'a [T],
    lda: usize,
    a_zero: i32,
    b: &'a PackedB,
}

/// Checks the operands of a product; `Ok(false)` when nothing is left to compute: an empty C,
/// or a depth of 0 (then C is all zeros, written here).
#[allow(clippy::too_many_arguments)]
fn check<T: Int8>(
    m: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &PackedB,
    c: &mut [i32],
    ldc: usize,
) -> Result<bool, IgemmError> {
    let n = b.n;
    if m == 0 || n == 0 {
        return if k == b.k {
            Ok(false)
        } else {
            Err(IgemmError::Depth { m, k, bk: b.k, n })
        };
    }
    check_a(m, k, a, lda, b)?;
    let c_need = (m - 1).saturating_mul(ldc).saturating_add(n);
    if c.len() < c_need || ldc < n {
        return Err(IgemmError::Short {
            what: "C",
            got: c.len(),
            want: c_need,
        });
    }
    if k == 0 {
        for row in c.chunks_mut(ldc).take(m) {
            row.iter_mut().take(n).for_each(|v| *v = 0);
        }
        return Ok(false);
    }
    Ok(true)
}

/// Checks A (`m >= 1` rows of depth `k`, `lda` apart) against B's depth.
fn check_a<T: Int8>(m: usize, k: usize, a: &[T], lda: usize, b: &PackedB) -> Result<(), IgemmError> {
    if k != b.k {
        return Err(IgemmError::Depth { m, k, bk: b.k, n: b.n });
    }
    let a_need = m.saturating_sub(1).saturating_mul(lda).saturating_add(k);
    if a.len() < a_need || lda < k {
        return Err(IgemmError::Short {
            what: "A",
            got: a.len(),
            want: a_need,
        });
    }
    Ok(())
}

/// [`igemm`] on a given level (tests and benchmarks compare levels).
#[allow(clippy::too_many_arguments)]
pub fn igemm_with<T: Int8>(
    isa: Isa,
    m: usize,
    k: usize,
    a: &[T],
    lda: usize,
    a_zero: i32,
    b: &PackedB,
    c: &mut [i32],
    ldc: usize,
) -> Result<(), IgemmError> {
    let p = Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    };
    checked(isa, p, c, ldc, true)
}

/// [`igemm_with`] on the calling thread alone: for callers that split the work themselves
/// (the integer convolutions run it on blocks of output pixels).
#[allow(clippy::too_many_arguments)]
pub fn igemm_serial<T: Int8>(
    isa: Isa,
    m: usize,
    k: usize,
    a: &[T],
    lda: usize,
    a_zero: i32,
    b: &PackedB,
    c: &mut [i32],
    ldc: usize,
) -> Result<(), IgemmError> {
    let p = Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    };
    checked(isa, p, c, ldc, false)
}

/// `Y = requantize((A - za) B)` on the calling thread: [`igemm_serial`] fused with the
/// output stage `stage` (see [`Requantize`]) into the 8-bit row-major M x N matrix `y`
/// (`ldy` apart). `c` is scratch of at least `m` rows of N sums (`n` apart), written or not.
/// On AVX-512 VNNI with B in quads the micro-tiles requantize their sums in registers;
/// elsewhere the sums go to `c` first. Either way Y's bytes are those of
/// [`crate::quant::requantize_row_f32`] (or [`crate::quant::requantize_row`], as the stage's
/// [`Scales`] say) on the exact sums.
#[allow(clippy::too_many_arguments)]
pub fn igemm_requant_serial<T: Int8, O: Int8 + crate::quant::Q8>(
    isa: Isa,
    (m, k): (usize, usize),
    a: &[T],
    lda: usize,
    a_zero: i32,
    b: &PackedB,
    c: &mut [i32],
    stage: Requantize<'_>,
    y: &mut [O],
    ldy: usize,
) -> Result<(), IgemmError> {
    let n = b.n;
    if m == 0 || n == 0 {
        return Ok(());
    }
    b.uncentered()?;
    let stage = check_y::<O>(m, n, ldy, y.len(), stage)?;
    let (lo, hi) = stage.range;
    let p = Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    };
    let fused = matches!(b.data, Data::Quads(_)) && k <= MAX_EXACT_DEPTH && k > 0;
    if fused {
        if !check(m, k, a, lda, b, c, n)? {
            return Ok(());
        }
        let out = Output {
            y: O::bytes_mut(y),
            ldy,
            stage,
        };
        serial_quads(isa, p, c, n, Some(out), 0..b.n);
        return Ok(());
    }
    checked(isa, p, c, n, false)?;
    // Contiguous rows without a residual: one call for all (a call per row of a few dozen
    // columns cost more than its work).
    if stage.sum.is_none() && ldy == n {
        if let (Some(sums), Some(y)) = (c.get(..m * n), y.get_mut(..m * n)) {
            stage.scales.requantize_rows(n, sums, (lo, hi), y);
        }
        return Ok(());
    }
    for (i, (sums, row)) in c.chunks(n).zip(y.chunks_mut(ldy)).take(m).enumerate() {
        let row = row.get_mut(..n).unwrap_or_default();
        let r = stage
            .sum
            .as_ref()
            .and_then(|sum| Some((sum, sum.values.get(i * ldy..i * ldy + n)?)));
        stage.scales.requantize_row_summed(sums, (lo, hi), r, row);
    }
    Ok(())
}

/// Checks the operands, then computes the product: deep products in i64 blocks, else on
/// the micro-tiles, split by blocks of rows over the current pool when `split`.
fn checked<T: Int8>(isa: Isa, p: Product<'_, T>, c: &mut [i32], ldc: usize, split: bool) -> Result<(), IgemmError> {
    let Product { m, k, a, lda, b, .. } = p;
    if !check(m, k, a, lda, b, c, ldc)? {
        return Ok(());
    }
    if k > MAX_EXACT_DEPTH {
        return igemm_deep(p, c, ldc);
    }
    product(isa, p, c, ldc, split);
    b.add_centering(p, c, ldc, split);
    Ok(())
}

/// [`checked`]'s product of checked operands, before any centering.
fn product<T: Int8>(isa: Isa, p: Product<'_, T>, c: &mut [i32], ldc: usize, split: bool) {
    let Product { m, lda, a, b, .. } = p;
    // On the current pool: blocks of whole micro-tile rows, about two per thread; for few
    // rows, blocks of whole panels.
    let threads = crate::pool::current_threads();
    if split && matches!(b.data, Data::Quads(_)) && splits_by_columns(m, p.k, b.n) {
        split_columns(isa, p, c, ldc, threads);
        return;
    }
    if split && threads > 1 && m >= 2 * MR_QUADS {
        let mr = match b.data {
            Data::Pairs(_) => MR,
            Data::Quads(_) => MR_QUADS,
        };
        let rows = m.div_ceil(2 * threads).div_ceil(mr) * mr;
        let c_need = (m - 1) * ldc + b.n;
        let c = c.get_mut(..c_need).unwrap_or_default();
        crate::pool::for_each_chunk_mut(c, rows * ldc, &|i, chunk| {
            let r0 = i * rows;
            let r = m.saturating_sub(r0).min(rows);
            if let Some(a) = a.get(r0 * lda..) {
                serial(isa, Product { m: r, a, ..p }, chunk, ldc);
            }
        });
        return;
    }
    serial(isa, p, c, ldc);
}

/// Multiply-adds below which a product of few rows runs on one thread: ~20 us of one core's
/// work at the rate a row or two reach (B streamed from memory), against a fork-join's
/// microsecond or two.
const PAR_MIN_MACS: usize = 1 << 18;

/// Whether a product of `m` rows, depth `k` and `n` columns is split by columns over the
/// current pool (by [`igemm`] and [`igemm_requant_columns`]): at least two panels per thread,
/// enough work to pay for the fork-join, and either fewer rows than two row blocks of
/// micro-tiles (a decoder's one token, a batch of a few: a split by rows would leave all but
/// one thread idle) or a B wider than the rows and too big for the cache, against blocks of
/// rows too short to hide streaming it (a language model's head, a short sequence's
/// projections: split by rows, each of the `2 * threads` blocks streams all of B, while by
/// columns each thread streams its own part once). Measured on 2 threads: GPT-2's 32-row
/// head 9.5 -> 5.4 ms, RoBERTa's 48-row projections 0.51 -> 0.36 ms; ViT-S's 197 rows
/// (blocks of 56) were 3% slower by columns.
pub fn splits_by_columns(m: usize, k: usize, n: usize) -> bool {
    let threads = crate::pool::current_threads();
    let short_blocks = m < 2 * threads * 4 * MR_QUADS;
    let wide_b = n > 2 * m && k.saturating_mul(n) > B_BLOCK_BYTES && short_blocks;
    threads > 1
        && n >= 2 * threads * NR_QUADS
        && m.saturating_mul(n).saturating_mul(k) >= PAR_MIN_MACS
        && (m < 2 * MR_QUADS || wide_b)
}

/// Columns per piece of a column split: whole panels, about two pieces per thread (a thread
/// the host slows down leaves its last piece to the other).
fn piece_width(n: usize, threads: usize) -> usize {
    n.div_ceil(NR_QUADS).div_ceil(2 * threads.max(1)).max(1) * NR_QUADS
}

/// [`checked`]'s split by columns (quads format, arguments checked).
fn split_columns<T: Int8>(isa: Isa, p: Product<'_, T>, c: &mut [i32], ldc: usize, threads: usize) {
    let (m, n) = (p.m, p.b.n);
    let width = piece_width(n, threads);
    over_pieces(c, (m, n, ldc), width, &|i, part, ld| {
        let j0 = i * width;
        serial_quads(isa, p, part, ld, None, j0..(j0 + width).min(n));
    });
}

/// Runs `piece(i, part, ld)` over the current pool for each column piece `i` of the `m x n`
/// output `dst` (`ld` apart), `width` columns each: `part` is the piece's own rows, `ld`
/// apart, its first column the piece's first. In place when `dst` is one row; else each
/// piece writes its own block of a scratch matrix, copied to `dst` afterwards (`m * n`
/// values, small beside the `m * n * k` products).
fn over_pieces<T: Copy + Default + Send>(
    dst: &mut [T],
    (m, n, ld): (usize, usize, usize),
    width: usize,
    piece: &(dyn Fn(usize, &mut [T], usize) + Sync),
) {
    if m == 1 {
        let row = dst.get_mut(..n).unwrap_or_default();
        crate::pool::for_each_chunk_mut(row, width, &|i, part| piece(i, part, width));
        return;
    }
    let pieces = n.div_ceil(width);
    let mut scratch = vec![T::default(); pieces * m * width];
    crate::pool::for_each_chunk_mut(&mut scratch, m * width, &|i, part| piece(i, part, width));
    for (i, part) in scratch.chunks(m * width).enumerate() {
        let j0 = i * width;
        let cols = width.min(n.saturating_sub(j0));
        for (r, src) in part.chunks(width).enumerate() {
            let at = r * ld + j0;
            if let (Some(d), Some(src)) = (dst.get_mut(at..at + cols), src.get(..cols)) {
                d.copy_from_slice(src);
            }
        }
    }
}

/// Checks Y (`m` rows of `n` 8-bit values, `ldy` apart, in `y_len` elements) and the stage's
/// columns; returns the stage with its range clamped to O's.
fn check_y<O: crate::quant::Q8>(
    m: usize,
    n: usize,
    ldy: usize,
    y_len: usize,
    stage: Requantize<'_>,
) -> Result<Requantize<'_>, IgemmError> {
    if ldy < n {
        return Err(IgemmError::Short {
            what: "Y's row stride",
            got: ldy,
            want: n,
        });
    }
    let y_need = m.saturating_sub(1).saturating_mul(ldy).saturating_add(n);
    stage.checked::<O>(y_len, y_need, n)
}

/// [`igemm_requant_serial`] split by columns over the current pool when
/// [`splits_by_columns`] says so (and B is in quads, of an exact depth), each piece
/// requantizing all rows of its columns; otherwise on the calling thread. Y's bytes are
/// those [`igemm_requant_serial`] writes.
#[allow(clippy::too_many_arguments)]
pub fn igemm_requant_columns<T: Int8, O: Int8 + crate::quant::Q8 + Default + Send>(
    isa: Isa,
    (m, k): (usize, usize),
    a: &[T],
    lda: usize,
    a_zero: i32,
    b: &PackedB,
    stage: Requantize<'_>,
    y: &mut [O],
    ldy: usize,
) -> Result<(), IgemmError> {
    let n = b.n;
    let threads = crate::pool::current_threads();
    let fused = matches!(b.data, Data::Quads(_)) && k <= MAX_EXACT_DEPTH && k > 0;
    // A residual sum reads R in Y's layout; the pieces write their own buffers: serial.
    if !fused || !splits_by_columns(m, k, n) || stage.sum.is_some() {
        let mut c = vec![0i32; m.saturating_mul(n)];
        return igemm_requant_serial(isa, (m, k), a, lda, a_zero, b, &mut c, stage, y, ldy);
    }
    b.uncentered()?;
    let stage = check_y::<O>(m, n, ldy, y.len(), stage)?;
    check_a(m, k, a, lda, b)?;
    let p = Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    };
    let width = piece_width(n, threads);
    // One piece's columns `j0..` of all rows, requantized into `part` (`ld` apart).
    over_pieces(y, (m, n, ldy), width, &|i, part, ld| {
        let j0 = i * width;
        let mut sums = vec![0i32; m * width];
        let out = Output {
            y: O::bytes_mut(part),
            ldy: ld,
            stage,
        };
        serial_quads(isa, p, &mut sums, width, Some(out), j0..(j0 + width).min(n));
    });
    Ok(())
}

/// [`igemm_with`] on the calling thread, arguments already checked.
fn serial<T: Int8>(isa: Isa, p: Product<'_, T>, c: &mut [i32], ldc: usize) {
    match p.b.data {
        Data::Pairs(_) => serial_pairs(isa, p, c, ldc),
        Data::Quads(_) => serial_quads(isa, p, c, ldc, None, 0..p.b.n),
    }
}

fn serial_pairs<T: Int8>(isa: Isa, p: Product<'_, T>, c: &mut [i32], ldc: usize) {
    let Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    } = p;
    let n = b.n;
    let kpairs = b.kpairs();
    // Goto's order: a block of up to MC_PAIRS rows of A packed for the depth block (in L2),
    // then per panel of B (16 KiB, in L1 across the block's tiles) every tile of the block.
    // Tile by tile over all of B instead, B was streamed from memory once per six rows
    // (BERT's 768 x 3072 FFN: 4.7 MB per tile row).
    // Sized to this product (a convolution calls this per block of pixels: 96 KiB zeroed
    // each time for a 16-deep 1x1 was a memset as long as its products).
    let tiles = m.min(MC_PAIRS).div_ceil(MR);
    let mut apack: Vec<i32> = vec![0; tiles * MR * kpairs.min(KC / 2)];
    // The first depth block starts each column's sums at `-za * colsum`.
    let init: Vec<i32> = b
        .fold_sums()
        .iter()
        .map(|&s| a_zero.wrapping_mul(s).wrapping_neg())
        .collect();
    for (kb, q0) in (0..kpairs).step_by(KC / 2).enumerate() {
        let q1 = (q0 + KC / 2).min(kpairs);
        let step = MR * (q1 - q0);
        for ic in (0..m).step_by(MC_PAIRS) {
            let mc = (m - ic).min(MC_PAIRS);
            for (t, pack) in apack.chunks_exact_mut(step).take(mc.div_ceil(MR)).enumerate() {
                let m0 = ic + t * MR;
                pack_a(a, lda, k, m0, (m - m0).min(MR), q0, q1, pack);
            }
            for p in 0..n.div_ceil(NR) {
                let cols = (n - p * NR).min(NR);
                let panel = b.panel(p, q0, q1);
                let first = (kb == 0).then(|| init.get(p * NR..p * NR + cols).unwrap_or(&[]));
                for (t, pack) in apack.chunks_exact(step).take(mc.div_ceil(MR)).enumerate() {
                    let m0 = ic + t * MR;
                    let rows = (m - m0).min(MR);
                    let Some(cc) = c.get_mut(m0 * ldc + p * NR..) else {
                        continue;
                    };
                    micro(
                        isa,
                        pack,
                        panel,
                        q1 - q0,
                        PairsOut {
                            c: cc,
                            ldc,
                            rows,
                            cols,
                            init: first,
                        },
                    );
                }
            }
        }
    }
}

/// Rows of A one block of [`serial_pairs`] packs (whole micro-tiles): 96 rows of a 256-pair
/// depth block, 96 KiB, in L2.
const MC_PAIRS: usize = 16 * MR;

/// Where a pairs micro-tile puts its sums: `rows` rows of `cols` columns of C (`ldc` apart,
/// the tile's first at `c[0]`), added to C's values, or with `init` (the tile's columns'
/// starting values) written as `init + sum`.
struct PairsOut<'c, 'i> {
    c: &'c mut [i32],
    ldc: usize,
    rows: usize,
    cols: usize,
    init: Option<&'i [i32]>,
}

impl PairsOut<'_, '_> {
    /// Stores the tile (`tile[r][j]` for `r < rows`, `j < cols`; a short C or `init` stores
    /// only what it holds).
    fn store(self, tile: &[[i32; NR]; MR]) {
        let PairsOut {
            c,
            ldc,
            rows,
            cols,
            init,
        } = self;
        for (r, row) in tile.iter().enumerate().take(rows) {
            let Some(dst) = c.get_mut(r * ldc..r * ldc + cols) else {
                return;
            };
            match init {
                Some(init) => dst
                    .iter_mut()
                    .zip(row)
                    .zip(init)
                    .for_each(|((d, &t), &i)| *d = i.wrapping_add(t)),
                None => dst.iter_mut().zip(row).for_each(|(d, &t)| *d = d.wrapping_add(t)),
            }
        }
    }
}

/// The quads format: the micro-tiles read A's rows in place (four depths per broadcast,
/// an i8 A flipped to u8 on the fly with its zero point offset, `T::OFFSET`), except a
/// block whose last quad would read past A (a partial tile, or a depth not a multiple of 4
/// at A's end), which is packed `[quad][row]` first; they write C themselves, the first
/// depth block adding `-za * colsum`.
/// With `out`, the last depth block writes each tile's requantized bytes to Y instead of C.
/// Only the columns `span` are computed (its start a multiple of [`NR_QUADS`]); C's (and
/// Y's) first column is the span's first.
fn serial_quads<T: Int8>(
    isa: Isa,
    p: Product<'_, T>,
    c: &mut [i32],
    ldc: usize,
    mut out: Option<Output<'_, '_>>,
    span: Range<usize>,
) {
    let Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    } = p;
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if on_tiles(isa, m, k) && amx::serial(p, c, ldc, out.as_mut(), span.clone()) {
        return;
    }
    let (first, n) = (span.start, span.end.min(b.n));
    let kquads = k.div_ceil(4);
    let blocks = kquads.div_ceil(KC_QUADS / 4).max(1);
    let step = kquads.div_ceil(blocks);
    let za = a_zero.wrapping_add(T::OFFSET);
    let mut init = Vec::new();
    b.quads_init(za, &mut init);
    let bytes = T::bytes(a);
    let flip = T::OFFSET != 0;
    let vnni = isa.has_int8_dot();
    let mut apack: Vec<u8> = vec![0; 4 * MR_QUADS * step];
    // Columns in blocks whose B of one depth block stays in L2 while every row tile reads
    // it: a wide B (a language model's head) would otherwise stream from memory once per
    // row tile.
    let nc = (B_BLOCK_BYTES / (4 * step).max(1)).max(NR_QUADS) / NR_QUADS * NR_QUADS;
    for q0 in (0..kquads).step_by(step.max(1)) {
        let q1 = (q0 + step).min(kquads);
        let strip = b.quad_strip(q0, q1);
        for j0 in (first..n).step_by(nc) {
            let cols = (n - j0).min(nc);
            let panels = strip.columns(j0, cols);
            for m0 in (0..m).step_by(MR_QUADS) {
                let rows = (m - m0).min(MR_QUADS);
                // In place when all MR_QUADS rows' quads `q0..q1` lie within A.
                let base = m0 * lda + 4 * q0;
                let end = base + (MR_QUADS - 1) * lda + 4 * (q1 - q0);
                let src = match bytes.get(base..end) {
                    Some(block) => AQuads {
                        data: block,
                        row: lda,
                        quad: 4,
                        flip,
                    },
                    None => {
                        pack_a_quads(a, lda, k, m0, rows, q0, q1, &mut apack);
                        AQuads {
                            data: &apack,
                            row: 4,
                            quad: 4 * MR_QUADS,
                            flip: false,
                        }
                    }
                };
                let Some(cpart) = c.get_mut(m0 * ldc + j0 - first..) else {
                    continue;
                };
                let tile = Tile {
                    rows,
                    cols,
                    ldc,
                    init: (q0 == 0).then(|| init.get(j0..).unwrap_or_default()),
                };
                let fin = match out.as_mut() {
                    Some(o) if q1 == kquads => o.tile(m0, j0 - first, j0, cols),
                    _ => None,
                };
                micro_quads(vnni, src, panels, q1 - q0, cpart, tile, fin);
            }
        }
    }
}

/// The quads of B one strip of micro-tiles reads: `panels` panels, panel `p`'s steps from
/// `p * stride` of `data` on.
#[derive(Clone, Copy)]
struct Strip<'a> {
    data: &'a [i8],
    panels: usize,
    stride: usize,
}

impl<'a> Strip<'a> {
    /// The panels of columns `j0..j0 + cols` (`j0` a multiple of [`NR_QUADS`]).
    fn columns(&self, j0: usize, cols: usize) -> Strip<'a> {
        let (p0, count) = (j0 / NR_QUADS, cols.div_ceil(NR_QUADS));
        Strip {
            data: self.data.get(p0 * self.stride..).unwrap_or(&[]),
            panels: count.min(self.panels.saturating_sub(p0)),
            stride: self.stride,
        }
    }

    /// Panel `p`'s `steps` steps.
    fn panel(&self, p: usize, steps: usize) -> &'a [i8] {
        self.data
            .get(p * self.stride..p * self.stride + steps * 4 * NR_QUADS)
            .unwrap_or(&[])
    }
}

/// Where a quads micro-tile reads A: row `r`'s quad `q` is the four bytes at
/// `r * row + q * quad` of `data`, XORed with 0x80 each when `flip` (an i8 A as u8).
#[derive(Clone, Copy)]
struct AQuads<'a> {
    data: &'a [u8],
    row: usize,
    quad: usize,
    flip: bool,
}

impl AQuads<'_> {
    /// Whether `quads` quads of all [`MR_QUADS`] rows lie within `data`.
    fn covers(&self, quads: usize) -> bool {
        quads == 0 || (MR_QUADS - 1) * self.row + (quads - 1) * self.quad + 4 <= self.data.len()
    }
}

/// Where a quads micro-tile writes: `rows x cols` of C, `ldc` apart; with `init`, C is
/// overwritten by the sums plus `init[j]`, else the sums are added to C.
#[derive(Clone, Copy)]
struct Tile<'a> {
    rows: usize,
    cols: usize,
    ldc: usize,
    init: Option<&'a [i32]>,
}

/// The output stage of a fused product ([`igemm_requant_serial`]): each exact sum `s` of
/// column `j` becomes the 8-bit `clamp(round_half_even((s + bias[j]) * mult[j] +
/// zero_point), lo, hi)`, in the float type of its [`Scales`].
#[derive(Debug, Clone, Copy)]
pub struct Requantize<'a> {
    pub scales: Scales<'a>,
    /// The clamp, already within the output type's range.
    pub range: (i32, i32),
    /// A residual sum after the clamp (a fused `QLinearAdd`), or none.
    pub sum: Option<ResidualSum<'a>>,
}

/// A residual sum in the output stage: each clamped output code `q` becomes
/// `map.code_bounded(q, r, floor)` ([`crate::quant::SumMap`]) with R's code `r` at the same
/// row and column; R has Y's type and layout (rows `ldy` apart). The same bits as
/// [`crate::quant::add_dequantized_in_place`] run on Y afterwards, without the second pass
/// over Y.
#[derive(Debug, Clone, Copy)]
pub struct ResidualSum<'a> {
    /// R's bytes (two's complement when `signed`).
    values: &'a [u8],
    signed: bool,
    map: crate::quant::SumMap,
    /// The sum's lowest code: its type's, or a fused Relu's floor.
    floor: f32,
}

impl<'a> ResidualSum<'a> {
    /// The sum with R `values` of the output's type `O`, for a map `bounded` (see
    /// [`crate::quant::SumMap::bounded`]; `None` otherwise: the caller then adds afterwards)
    /// and an optional floor (as [`crate::quant::add_dequantized_in_place`] takes it).
    pub fn new<O: Int8 + crate::quant::Q8>(
        values: &'a [O],
        map: crate::quant::SumMap,
        floor: Option<f32>,
    ) -> Option<ResidualSum<'a>> {
        map.bounded().then(|| ResidualSum {
            values: O::bytes(values),
            signed: O::OFFSET != 0,
            map,
            floor: floor.filter(|f| !f.is_nan()).map_or(O::LO, |f| f.clamp(O::LO, O::HI)),
        })
    }

    /// R from element `at` on.
    fn from(self, at: usize) -> Option<ResidualSum<'a>> {
        Some(ResidualSum {
            values: self.values.get(at..)?,
            ..self
        })
    }

    /// The sum on one row of output bytes `y` (R's row `r`), by the residual sums' own loop.
    fn row(&self, y: &mut [u8], r: &[u8]) {
        if self.signed {
            crate::quant::add_by_map_in_place(i8::of_bytes_mut(y), i8::of_bytes(r), self.map, self.floor);
        } else {
            crate::quant::add_by_map_in_place(y, r, self.map, self.floor);
        }
    }
}

/// The per-column bias and multiplier of a [`Requantize`] stage and the output zero point,
/// in the float type its arithmetic runs in.
#[derive(Debug, Clone, Copy)]
pub enum Scales<'a> {
    /// In f32 as [`crate::quant::requantize_row_f32`] computes it (its fused steps, the same
    /// bits): the arithmetic of the QDQ graph a fused convolution replaced.
    F32 {
        bias: &'a [f32],
        mult: &'a [f32],
        zero_point: f32,
    },
    /// In f64 as [`crate::quant::requantize_row`] computes it (the same bits): the arithmetic
    /// of ONNX's QLinearConv reference. With a `twin`, the VNNI tile computes in f32 and
    /// redoes in f64 only the vectors with a value near a rounding boundary (the same bits).
    F64 {
        bias: &'a [f64],
        mult: &'a [f64],
        zero_point: f64,
        twin: Option<F32Twin<'a>>,
    },
}

/// An f64 stage's parameters rounded to f32, and how far the f32 arithmetic can be from the
/// f64 one for a value that can matter: a value whose f32 result lies more than `margin`
/// from every half-integer (or beyond +-1024, where the clamp decides) rounds to the same
/// integer in both. Held by a [`TwinParams`].
#[derive(Debug, Clone, Copy)]
pub struct F32Twin<'a> {
    pub bias: &'a [f32],
    pub mult: &'a [f32],
    pub margin: f32,
}

/// The f32 twin of an f64 stage's parameters, owned: made once per stage, lent per range
/// of columns.
#[derive(Debug, Clone)]
pub struct TwinParams {
    bias: Vec<f32>,
    mult: Vec<f32>,
    margin: f32,
}

impl TwinParams {
    /// The twin of f64 `bias`, `mult` and `zero_point`, or `None` where f32 cannot stand in
    /// for them (see [`F32Twin::margin`]).
    pub fn of(bias: &[f64], mult: &[f64], zero_point: f64) -> Option<TwinParams> {
        Some(TwinParams {
            margin: F32Twin::margin(bias, mult, zero_point)?,
            bias: bias.iter().map(|&v| v as f32).collect(),
            mult: mult.iter().map(|&v| v as f32).collect(),
        })
    }

    /// The twin of columns `cols` (empty parameters for columns out of range, which the
    /// kernels refuse).
    pub fn columns(&self, cols: std::ops::Range<usize>) -> F32Twin<'_> {
        F32Twin {
            bias: self.bias.get(cols.clone()).unwrap_or_default(),
            mult: self.mult.get(cols).unwrap_or_default(),
            margin: self.margin,
        }
    }
}

impl<'a> F32Twin<'a> {
    /// The bound `margin` for f64 `bias`, `mult` and `zero_point`, or `None` when f32 cannot
    /// stand in for them (a value not finite or beyond 2^40, or a bound too wide to help).
    ///
    /// The bound: with `a` the exact sum and `X = (a + b) m + z`, each f32 step (rounding
    /// `a`, `b` and `m` to f32, the sum, the product, the addition of `z`) errs by at most
    /// 2^-24 of its operands' magnitude, so `|u - X| <= 2^-24 (4 |m| (|a| + |b|) + |u|)`;
    /// and `|m a| <= |X| + |z| + |m b|`. For a value that can matter (`|u| < 1024`, so
    /// `|X| < 1025`) that is at most `2^-24 (5 * 1025 + 4 |z| + 8 max |m b|)`; twice it
    /// covers the f64 reference's own rounding with room to spare.
    pub fn margin(bias: &[f64], mult: &[f64], zero_point: f64) -> Option<f32> {
        const LIMIT: f64 = 1_099_511_627_776.0; // 2^40
        let fine = |v: f64| v.is_finite() && v.abs() < LIMIT;
        if !(fine(zero_point) && bias.iter().chain(mult).all(|&v| fine(v))) {
            return None;
        }
        let mb = bias.iter().zip(mult).map(|(b, m)| (b * m).abs()).fold(0.0f64, f64::max);
        let bound = 2.0 * (5.0 * 1025.0 + 4.0 * zero_point.abs() + 8.0 * mb) / 16_777_216.0 + 1e-12;
        (bound < 0.125).then_some(bound as f32)
    }
}

impl<'a> Scales<'a> {
    /// Columns with both a bias and a multiplier.
    fn columns(&self) -> usize {
        match self {
            Scales::F32 { bias, mult, .. } => bias.len().min(mult.len()),
            Scales::F64 { bias, mult, twin, .. } => {
                let n = bias.len().min(mult.len());
                twin.map_or(n, |t| n.min(t.bias.len()).min(t.mult.len()))
            }
        }
    }

    /// The parameters of columns `j0..j0 + cols`.
    fn columns_at(&self, j0: usize, cols: usize) -> Option<Scales<'a>> {
        let r = j0..j0.checked_add(cols)?;
        Some(match *self {
            Scales::F32 { bias, mult, zero_point } => Scales::F32 {
                bias: bias.get(r.clone())?,
                mult: mult.get(r)?,
                zero_point,
            },
            Scales::F64 {
                bias,
                mult,
                zero_point,
                twin,
            } => Scales::F64 {
                bias: bias.get(r.clone())?,
                mult: mult.get(r.clone())?,
                zero_point,
                twin: match twin {
                    Some(t) => Some(F32Twin {
                        bias: t.bias.get(r.clone())?,
                        mult: t.mult.get(r)?,
                        margin: t.margin,
                    }),
                    None => None,
                },
            },
        })
    }

    /// [`Scales::requantize_row`], then with `sum` (and R's row of it) the residual sum:
    /// an f32 stage's fused one-rounding arithmetic
    /// ([`crate::quant::requantize_summed_row_f32`]), an f64 stage's codes summed after.
    fn requantize_row_summed<O: Int8 + crate::quant::Q8>(
        &self,
        sums: &[i32],
        (lo, hi): (i32, i32),
        sum: Option<(&ResidualSum<'_>, &[u8])>,
        y: &mut [O],
    ) {
        match (sum, *self) {
            (Some((sum, r)), Scales::F32 { bias, mult, zero_point }) => {
                let scales = (bias, mult, zero_point);
                let range = (lo as f32, hi as f32);
                let y = O::bytes_mut(y);
                if sum.signed {
                    let (r, y) = (i8::of_bytes(r), i8::of_bytes_mut(y));
                    crate::quant::requantize_summed_row_f32(sums, scales, range, r, sum.map, sum.floor, y);
                } else {
                    crate::quant::requantize_summed_row_f32(sums, scales, range, r, sum.map, sum.floor, y);
                }
            }
            (sum, _) => {
                self.requantize_row(sums, (lo, hi), y);
                if let Some((sum, r)) = sum {
                    sum.row(O::bytes_mut(y), r);
                }
            }
        }
    }

    /// One row of sums requantized into `y` (`min` of the lengths), clamped to `range`.
    fn requantize_row<O: crate::quant::Q8>(&self, sums: &[i32], range: (i32, i32), y: &mut [O]) {
        self.requantize_rows(sums.len().min(y.len()), sums, range, y);
    }

    /// Contiguous rows of `n` sums (as many whole rows as `sums` and `y` hold) requantized
    /// into `y` in one call, clamped to `range`; nothing when the stage has fewer than `n`
    /// columns.
    fn requantize_rows<O: crate::quant::Q8>(&self, n: usize, sums: &[i32], (lo, hi): (i32, i32), y: &mut [O]) {
        match self.columns_at(0, n) {
            Some(Scales::F32 { bias, mult, zero_point }) => {
                crate::quant::requantize_pixels_f32(sums, bias, mult, zero_point, (lo as f32, hi as f32), y);
            }
            Some(Scales::F64 {
                bias, mult, zero_point, ..
            }) => {
                crate::quant::requantize_pixels(sums, bias, mult, zero_point, (f64::from(lo), f64::from(hi)), y);
            }
            None => {}
        }
    }
}

impl Requantize<'_> {
    /// Checks a Y of `y_len` values against the `y_need` its product writes and the stage's
    /// bias and multipliers against `n` columns; the stage with its clamp cut to `O`'s range.
    fn checked<O: crate::quant::Q8>(self, y_len: usize, y_need: usize, n: usize) -> Result<Self, IgemmError> {
        if y_len < y_need {
            return Err(IgemmError::Short {
                what: "Y",
                got: y_len,
                want: y_need,
            });
        }
        if let Some(sum) = self.sum
            && sum.values.len() < y_need
        {
            return Err(IgemmError::Short {
                what: "the residual sum's R",
                got: sum.values.len(),
                want: y_need,
            });
        }
        if self.scales.columns() < n {
            return Err(IgemmError::Short {
                what: "the bias and multipliers",
                got: self.scales.columns(),
                want: n,
            });
        }
        Ok(Requantize {
            range: (self.range.0.max(O::LO as i32), self.range.1.min(O::HI as i32)),
            ..self
        })
    }
}

/// Where a fused product writes: Y's bytes, `ldy` apart, and the stage.
struct Output<'y, 'r> {
    y: &'y mut [u8],
    ldy: usize,
    stage: Requantize<'r>,
}

impl Output<'_, '_> {
    /// The tile at row `m0`, column `j0` of the product, `cols` wide, stored from column `at`
    /// of Y.
    fn tile(&mut self, m0: usize, at: usize, j0: usize, cols: usize) -> Option<Final<'_>> {
        let s = &self.stage;
        let first = m0 * self.ldy + at;
        let sum = match s.sum {
            Some(sum) => Some(sum.from(first)?),
            None => None,
        };
        Some(Final {
            y: self.y.get_mut(first..)?,
            ldy: self.ldy,
            scales: s.scales.columns_at(j0, cols)?,
            lo: s.range.0,
            hi: s.range.1,
            sum,
        })
    }
}

/// One tile's output stage: its bytes go to `y` (`ldy` apart), its columns' parameters, and
/// the residual sum's R from the tile's first element (Y's layout).
struct Final<'a> {
    y: &'a mut [u8],
    ldy: usize,
    scales: Scales<'a>,
    lo: i32,
    hi: i32,
    sum: Option<ResidualSum<'a>>,
}

impl Final<'_> {
    /// The stage on sums already in C (the portable twin's), rows `rows`, `cols` wide.
    fn requantize_sums(self, c: &[i32], ldc: usize, rows: usize, cols: usize) {
        let range = (self.lo, self.hi);
        for r in 0..rows {
            let (Some(sums), Some(dst)) = (
                c.get(r * ldc..r * ldc + cols),
                self.y.get_mut(r * self.ldy..r * self.ldy + cols),
            ) else {
                continue;
            };
            let sum = self.sum.as_ref().and_then(|sum| {
                let res = sum.values.get(r * self.ldy..r * self.ldy + cols)?;
                Some((sum, res))
            });
            if self.lo < 0 {
                // An i8 output (its range reaches below 0): the stage in i8 (the residual
                // sum of an i8 output is signed).
                self.scales
                    .requantize_row_summed(sums, range, sum, i8::of_bytes_mut(dst));
            } else {
                self.scales.requantize_row_summed(sums, range, sum, dst);
            }
        }
    }
}

/// Packs rows `m0..m0 + rows` of A, depth quads `q0..q1`, as `[quad][row]` groups of four
/// offset u8 values, rows past `rows` and depths past `k` zero.
#[allow(clippy::too_many_arguments)]
fn pack_a_quads<T: Int8>(a: &[T], lda: usize, k: usize, m0: usize, rows: usize, q0: usize, q1: usize, out: &mut [u8]) {
    out.iter_mut().for_each(|v| *v = 0);
    for r in 0..rows {
        let Some(row) = a.get((m0 + r) * lda + 4 * q0..(m0 + r) * lda + k) else {
            continue;
        };
        for (d, v) in row.iter().enumerate().take(4 * (q1 - q0)) {
            if let Some(slot) = out.get_mut(((d / 4) * MR_QUADS + r) * 4 + d % 4) {
                *slot = v.to_u8();
            }
        }
    }
}

/// One quads micro-tile over `quads` depth quads, written to C as [`Tile`] says, or with
/// `fin` requantized into its Y; on the VNNI kernel when `vnni` (`Isa::has_int8_dot`, which
/// the caller asks once), else on the portable twin.
fn micro_quads(
    vnni: bool,
    a: AQuads<'_>,
    b: Strip<'_>,
    quads: usize,
    c: &mut [i32],
    tile: Tile<'_>,
    fin: Option<Final<'_>>,
) {
    if !a.covers(quads) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vnni {
        vnni::micro(a, b, quads, c, tile, fin);
        return;
    }
    let _ = vnni;
    for p in 0..b.panels {
        let j0 = p * NR_QUADS;
        let cols = tile.cols.saturating_sub(j0).min(NR_QUADS);
        let Some(cpart) = c.get_mut(j0..) else { break };
        if cols == 0 {
            break;
        }
        let panel = Tile {
            cols,
            init: tile.init.and_then(|i| i.get(j0..)),
            ..tile
        };
        micro_quads_portable(a, b.panel(p, quads), quads, cpart, panel);
    }
    if let Some(f) = fin {
        f.requantize_sums(c, tile.ldc, tile.rows.min(MR_QUADS), tile.cols);
    }
}

/// The portable twin of the VNNI micro-tile.
fn micro_quads_portable(a: AQuads<'_>, bpanel: &[i8], quads: usize, c: &mut [i32], tile: Tile<'_>) {
    let mut acc = [[0i32; NR_QUADS]; MR_QUADS];
    let flip = if a.flip { 0x80 } else { 0 };
    for q in 0..quads {
        let Some(bp) = bpanel.get(q * 4 * NR_QUADS..(q + 1) * 4 * NR_QUADS) else {
            break;
        };
        for (r, row) in acc.iter_mut().enumerate() {
            let at = r * a.row + q * a.quad;
            let Some(av) = a.data.get(at..at + 4) else { break };
            for (j, t) in row.iter_mut().enumerate() {
                let Some(bq) = bp.get(4 * j..4 * j + 4) else { break };
                let dot: i32 = av
                    .iter()
                    .zip(bq)
                    .map(|(&x, &y)| i32::from(x ^ flip) * i32::from(y))
                    .sum();
                *t = t.wrapping_add(dot);
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(tile.rows) {
        let Some(dst) = c.get_mut(r * tile.ldc..r * tile.ldc + tile.cols) else {
            continue;
        };
        match tile.init {
            Some(init) => {
                for ((d, &t), &i) in dst.iter_mut().zip(row).zip(init) {
                    *d = t.wrapping_add(i);
                }
            }
            None => {
                for (d, &t) in dst.iter_mut().zip(row) {
                    *d = d.wrapping_add(t);
                }
            }
        }
    }
}

/// Packs rows `m0..m0 + rows` of A, depth pairs `q0..q1`, into `out` (`MR` rows of
/// `q1 - q0` words, `[row][pair]`): each i32 word holds two i16 (low: the even depth), rows
/// past `rows` and depths past `k` zero. A row is a contiguous run (the compiler vectorises
/// it); the `[pair][row]` order before took a bounds-checked store per pair, as long as the
/// products themselves for a 64-column B.
#[allow(clippy::too_many_arguments)]
fn pack_a<T: Int8>(a: &[T], lda: usize, k: usize, m0: usize, rows: usize, q0: usize, q1: usize, out: &mut [i32]) {
    let np = q1.saturating_sub(q0);
    if np == 0 {
        return;
    }
    let (d0, d1) = ((2 * q0).min(k), (2 * q1).min(k));
    for (r, dst) in out.chunks_exact_mut(np).take(MR).enumerate() {
        let start = (m0 + r) * lda + d0;
        let src = if r < rows {
            a.get(start..start + (d1 - d0))
        } else {
            None
        };
        let Some(src) = src else {
            dst.fill(0);
            continue;
        };
        let (pairs, rest) = src.as_chunks::<2>();
        let odd = rest.first().map(|v| v.widen() & 0xFFFF);
        let mut filled = pairs.len().min(dst.len());
        // Each byte widened to 16 bits (a `vpmovzxbw` / `vpmovsxbw` when vectorised: the
        // scalar loop was a tenth of MobileNet-v2's int8 run on AVX2).
        crate::simd::vectorize(|| {
            for (d, &[lo, hi]) in dst.iter_mut().zip(pairs) {
                *d = (lo.widen() & 0xFFFF) | (hi.widen() << 16);
            }
        });
        if let (Some(w), Some(d)) = (odd, dst.get_mut(filled)) {
            *d = w;
            filled += 1;
        }
        if let Some(rest) = dst.get_mut(filled..) {
            rest.fill(0);
        }
    }
}

/// One MR x NR tile over `pairs` depth pairs, `sum_q a_pair[q][r] . b_pair[q][j]`, into `out`.
fn micro(isa: Isa, apack: &[i32], bpanel: &[i16], pairs: usize, out: PairsOut<'_, '_>) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma | Isa::Avx512 if isa.is_supported() => avx2::micro(apack, bpanel, pairs, out),
        _ => {
            let mut tile = [[0i32; NR]; MR];
            micro_portable(apack, bpanel, pairs, &mut tile);
            out.store(&tile);
        }
    }
}

fn micro_portable(apack: &[i32], bpanel: &[i16], pairs: usize, tile: &mut [[i32; NR]; MR]) {
    let stride = apack.len() / MR;
    for q in 0..pairs.min(stride) {
        let Some(bp) = bpanel.get(q * 2 * NR..(q + 1) * 2 * NR) else {
            return;
        };
        for (r, &w) in apack.iter().skip(q).step_by(stride.max(1)).take(MR).enumerate() {
            let (lo, hi) = (i32::from(w as i16), w >> 16);
            if let Some(row) = tile.get_mut(r) {
                for (j, t) in row.iter_mut().enumerate() {
                    let b0 = bp.get(2 * j).copied().map_or(0, i32::from);
                    let b1 = bp.get(2 * j + 1).copied().map_or(0, i32::from);
                    *t = t.wrapping_add(lo * b0 + hi * b1);
                }
            }
        }
    }
}

/// Products deeper than [`MAX_EXACT_DEPTH`]: blocks of that depth summed in i64.
fn igemm_deep<T: Int8>(p: Product<'_, T>, c: &mut [i32], ldc: usize) -> Result<(), IgemmError> {
    let Product {
        m,
        k,
        a,
        lda,
        a_zero,
        b,
    } = p;
    let n = b.n;
    for i in 0..m {
        for j in 0..n {
            let mut sum: i64 = 0;
            for kk in 0..k {
                let Some(av) = a.get(i * lda + kk) else { continue };
                sum += i64::from(av.widen() - a_zero) * b.value(kk, j);
            }
            let v = i32::try_from(sum).map_err(|_| IgemmError::Overflow { m: i, n: j, sum })?;
            if let Some(d) = c.get_mut(i * ldc + j) {
                *d = v;
            }
        }
    }
    Ok(())
}
