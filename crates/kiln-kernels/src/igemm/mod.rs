//! Integer GEMM: `C[m][n] = sum_k (A[m][k] - za) * (B[k][n] - zb[n])`, exact in i32, for
//! 8-bit activations (u8 or s8, one zero point) and 8-bit weights (s8 or u8, a zero point per
//! column), the product behind QLinearMatMul, MatMulInteger and the integer convolutions.
//!
//! B is packed once (at compile time for constant weights) with its zero points already
//! subtracted, as 16-bit pairs of consecutive depths in panels of [`NR`] columns
//! ([`PackedB`]); with the column sums of the packed values, A's zero point folds into the
//! result as `- za * colsum[n]`, so A is used as it is. Each step multiplies a broadcast pair
//! of A values by a pair row of B and adds both products into an i32 lane: AVX2's
//! `vpmaddwd`, exact for any 16-bit operands (unlike `vpmaddubsw`, whose 16-bit sums saturate
//! for u8 x s8 products: kiln never uses it). The portable twin computes the same sums in
//! plain Rust; the property tests (`tests/igemm_props.rs`) hold both against an i64 oracle.
//!
//! Exactness: every term is at most 255 * 255 in magnitude, so the i32 sum is exact while
//! `K * 65025 < 2^31` ([`MAX_EXACT_DEPTH`]: 33,025 depths); deeper products are summed in
//! blocks of that depth into i64 and then must fit i32 ([`igemm`] reports an overflow).

use crate::isa::{self, Isa};

#[cfg(target_arch = "x86_64")]
mod avx2;

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
    fn widen(self) -> i32;
}

impl Int8 for u8 {
    #[inline(always)]
    fn widen(self) -> i32 {
        i32::from(self)
    }
}

impl Int8 for i8 {
    #[inline(always)]
    fn widen(self) -> i32 {
        i32::from(self)
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
        }
    }
}

impl std::error::Error for IgemmError {}

/// B (K x N, weights) packed for [`igemm`]: zero points subtracted, 16-bit, pairs of depths
/// interleaved per column, panels of [`NR`] columns (the last padded with zero columns), the
/// depth padded to even with a zero row.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedB {
    k: usize,
    n: usize,
    /// Panel `p`, depth pair `q`, column `j` of the panel, depth `d` of the pair:
    /// `data[(p * kpairs + q) * 2 * NR + 2 * j + d]`.
    data: Vec<i16>,
    /// `sum_k (B[k][n] - zb[n])` per column.
    col_sums: Vec<i32>,
}

impl PackedB {
    /// Packs the row-major K x N matrix `b` (`b[k * n + j]`) with the zero point of each
    /// column (`zero_points` of one element applies to all; empty means 0).
    pub fn pack<T: Int8>(b: &[T], k: usize, n: usize, zero_points: &[T]) -> Result<PackedB, IgemmError> {
        let want = k.saturating_mul(n);
        if b.len() < want {
            return Err(IgemmError::Short {
                what: "B",
                got: b.len(),
                want,
            });
        }
        if zero_points.len() > 1 && zero_points.len() < n {
            return Err(IgemmError::Short {
                what: "B's zero points",
                got: zero_points.len(),
                want: n,
            });
        }
        let zb = |j: usize| match zero_points {
            [] => 0,
            [z] => z.widen(),
            zs => zs.get(j).map_or(0, |z| z.widen()),
        };
        let kpairs = k.div_ceil(2);
        let panels = n.div_ceil(NR);
        let mut data = vec![0i16; panels * kpairs * 2 * NR];
        let mut col_sums = vec![0i32; n];
        for (kk, row) in b.chunks_exact(n.max(1)).take(k).enumerate() {
            let (q, d) = (kk / 2, kk % 2);
            for (j, &v) in row.iter().enumerate() {
                let w = v.widen() - zb(j);
                let (p, jj) = (j / NR, j % NR);
                if let Some(slot) = data.get_mut((p * kpairs + q) * 2 * NR + 2 * jj + d) {
                    *slot = w as i16;
                }
                if let Some(s) = col_sums.get_mut(j) {
                    *s += w;
                }
            }
        }
        Ok(PackedB { k, n, data, col_sums })
    }

    pub fn depth(&self) -> usize {
        self.k
    }

    pub fn columns(&self) -> usize {
        self.n
    }

    /// `sum_k (B[k][n] - zb[n])` of column `n`.
    pub fn col_sums(&self) -> &[i32] {
        &self.col_sums
    }

    fn kpairs(&self) -> usize {
        self.k.div_ceil(2)
    }

    /// Panel `p`'s depth pairs `q0..q1`.
    fn panel(&self, p: usize, q0: usize, q1: usize) -> &[i16] {
        let base = p * self.kpairs() * 2 * NR;
        self.data.get(base + q0 * 2 * NR..base + q1 * 2 * NR).unwrap_or(&[])
    }
}

/// `C = (A - za) B` (see the module docs) for the row-major M x K matrix `a` (`lda` apart)
/// into the row-major M x N matrix `c` (`ldc` apart), overwritten; on the active level.
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
    let n = b.n;
    if k != b.k {
        return Err(IgemmError::Depth { m, k, bk: b.k, n });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let a_need = (m - 1).saturating_mul(lda).saturating_add(k);
    if a.len() < a_need || lda < k {
        return Err(IgemmError::Short {
            what: "A",
            got: a.len(),
            want: a_need,
        });
    }
    let c_need = (m - 1).saturating_mul(ldc).saturating_add(n);
    if c.len() < c_need || ldc < n {
        return Err(IgemmError::Short {
            what: "C",
            got: c.len(),
            want: c_need,
        });
    }
    if k > MAX_EXACT_DEPTH {
        return igemm_deep(m, k, a, lda, a_zero, b, c, ldc);
    }
    // On the current pool: blocks of whole micro-tile rows, about two per thread.
    let threads = crate::pool::current_threads();
    if threads > 1 && m >= 2 * MR {
        let rows = m.div_ceil(2 * threads).div_ceil(MR) * MR;
        let c = c.get_mut(..c_need).unwrap_or_default();
        crate::pool::for_each_chunk_mut(c, rows * ldc, &|i, chunk| {
            let r0 = i * rows;
            let r = m.saturating_sub(r0).min(rows);
            if let Some(a) = a.get(r0 * lda..) {
                serial(isa, r, k, a, lda, a_zero, b, chunk, ldc);
            }
        });
        return Ok(());
    }
    serial(isa, m, k, a, lda, a_zero, b, c, ldc);
    Ok(())
}

/// [`igemm_with`] on the calling thread, arguments already checked.
#[allow(clippy::too_many_arguments)]
fn serial<T: Int8>(
    isa: Isa,
    m: usize,
    k: usize,
    a: &[T],
    lda: usize,
    a_zero: i32,
    b: &PackedB,
    c: &mut [i32],
    ldc: usize,
) {
    let n = b.n;
    let kpairs = b.kpairs();
    let mut apack: Vec<i32> = vec![0; MR * KC / 2];
    for (kb, q0) in (0..kpairs).step_by(KC / 2).enumerate() {
        let q1 = (q0 + KC / 2).min(kpairs);
        for m0 in (0..m).step_by(MR) {
            let rows = (m - m0).min(MR);
            pack_a(a, lda, k, m0, rows, q0, q1, &mut apack);
            for p in 0..n.div_ceil(NR) {
                let cols = (n - p * NR).min(NR);
                let mut tile = [[0i32; NR]; MR];
                micro(isa, &apack, b.panel(p, q0, q1), q1 - q0, &mut tile);
                for (r, row) in tile.iter().enumerate().take(rows) {
                    let at = (m0 + r) * ldc + p * NR;
                    let Some(dst) = c.get_mut(at..at + cols) else { continue };
                    let sums = b.col_sums.get(p * NR..p * NR + cols).unwrap_or(&[]);
                    if kb == 0 {
                        for ((d, &t), &s) in dst.iter_mut().zip(row.iter()).zip(sums) {
                            *d = t.wrapping_sub(a_zero.wrapping_mul(s));
                        }
                    } else {
                        for (d, &t) in dst.iter_mut().zip(row.iter()) {
                            *d = d.wrapping_add(t);
                        }
                    }
                }
            }
        }
    }
}

/// Packs rows `m0..m0 + rows` of A, depth pairs `q0..q1`, as `[pair][row]` i32 words holding
/// two i16 (low: the even depth), rows past `rows` and depths past `k` zero.
#[allow(clippy::too_many_arguments)]
fn pack_a<T: Int8>(a: &[T], lda: usize, k: usize, m0: usize, rows: usize, q0: usize, q1: usize, out: &mut [i32]) {
    out.iter_mut().for_each(|v| *v = 0);
    for r in 0..rows {
        let Some(row) = a.get((m0 + r) * lda..(m0 + r) * lda + k) else {
            continue;
        };
        for q in q0..q1 {
            let lo = row.get(2 * q).map_or(0, |v| v.widen());
            let hi = row.get(2 * q + 1).map_or(0, |v| v.widen());
            if let Some(slot) = out.get_mut((q - q0) * MR + r) {
                *slot = (lo & 0xFFFF) | (hi << 16);
            }
        }
    }
}

/// One MR x NR tile over `pairs` depth pairs: `tile[r][j] = sum_q a_pair[q][r] . b_pair[q][j]`.
fn micro(isa: Isa, apack: &[i32], bpanel: &[i16], pairs: usize, tile: &mut [[i32; NR]; MR]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma | Isa::Avx512 if isa.is_supported() => avx2::micro(apack, bpanel, pairs, tile),
        _ => micro_portable(apack, bpanel, pairs, tile),
    }
}

/// The portable twin of the SIMD micro-tiles.
fn micro_portable(apack: &[i32], bpanel: &[i16], pairs: usize, tile: &mut [[i32; NR]; MR]) {
    for q in 0..pairs {
        let (Some(ap), Some(bp)) = (apack.get(q * MR..q * MR + MR), bpanel.get(q * 2 * NR..(q + 1) * 2 * NR)) else {
            return;
        };
        for (r, &w) in ap.iter().enumerate() {
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
#[allow(clippy::too_many_arguments)]
fn igemm_deep<T: Int8>(
    m: usize,
    k: usize,
    a: &[T],
    lda: usize,
    a_zero: i32,
    b: &PackedB,
    c: &mut [i32],
    ldc: usize,
) -> Result<(), IgemmError> {
    let n = b.n;
    let kpairs = b.kpairs();
    for i in 0..m {
        for j in 0..n {
            let (p, jj) = (j / NR, j % NR);
            let mut sum: i64 = 0;
            for q in 0..kpairs {
                let panel = b.panel(p, q, q + 1);
                for d in 0..2 {
                    let kk = 2 * q + d;
                    let Some(av) = a.get(i * lda + kk).filter(|_| kk < k) else {
                        continue;
                    };
                    let bv = panel.get(2 * jj + d).copied().map_or(0, i64::from);
                    sum += i64::from(av.widen() - a_zero) * bv;
                }
            }
            let v = i32::try_from(sum).map_err(|_| IgemmError::Overflow { m: i, n: j, sum })?;
            if let Some(d) = c.get_mut(i * ldc + j) {
                *d = v;
            }
        }
    }
    Ok(())
}
