//! The AVX2 micro-tile of the integer GEMM: [`super::MR`] rows by [`super::NR`] columns in
//! twelve i32 accumulators, each step a broadcast pair of A times two vectors of B pairs with
//! `vpmaddwd` (16-bit products summed pairwise into exact i32 lanes).

use super::{MR, NR, PairsOut};
use std::arch::x86_64::*;

/// `out += sum_q a[q][r] . b[q][j]` over `pairs` depth pairs (or `out = init + ...`; see
/// [`PairsOut`] and `micro_portable`).
pub(super) fn micro(apack: &[i32], bpanel: &[i16], pairs: usize, out: PairsOut<'_, '_>) {
    // A is `MR` rows of `stride` words (`[row][pair]`, see `pack_a`).
    let stride = apack.len() / MR;
    let pairs = pairs.min(stride).min(bpanel.len() / (2 * NR));
    // SAFETY: the dispatcher calls this only when `Isa` detection found AVX2 (and FMA); the
    // slices hold at least `pairs` steps (clamped just above), which is all the kernel reads.
    unsafe {
        if out.cols <= NR / 2 {
            // A panel's last 8 or fewer columns (a 24-channel layer's second panel): the
            // first vector of B only, half the products.
            micro_avx2::<1>(apack.as_ptr(), stride, bpanel.as_ptr(), pairs, out)
        } else {
            micro_avx2::<2>(apack.as_ptr(), stride, bpanel.as_ptr(), pairs, out)
        }
    }
}

/// The tile over the first `NV` (1 or 2) vectors of 8 columns of each B step.
///
/// # Safety
/// AVX2 is available; `a` points to `MR` rows of `stride >= pairs` i32 and `b` to
/// `pairs * 2 * NR` i16.
#[target_feature(enable = "avx2")]
unsafe fn micro_avx2<const NV: usize>(
    a: *const i32,
    stride: usize,
    b: *const i16,
    pairs: usize,
    out: PairsOut<'_, '_>,
) {
    let mut acc = [[_mm256_setzero_si256(); NV]; MR];
    for q in 0..pairs {
        // SAFETY: step `q < pairs` of B is `2 * NR` i16 (two 256-bit vectors) at `q * 2 * NR`,
        // within the caller's bound; unaligned loads of the first `NV`.
        let bv: [__m256i; NV] = std::array::from_fn(|v| unsafe {
            _mm256_loadu_si256(b.add(q * 2 * NR + v * (NR / 2) * 2).cast::<__m256i>())
        });
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < MR`, pair `q < pairs <= stride`: within the caller's bound.
            let w = unsafe { *a.add(r * stride + q) };
            let av = _mm256_set1_epi32(w);
            for (x, &bq) in row.iter_mut().zip(&bv) {
                *x = _mm256_add_epi32(*x, _mm256_madd_epi16(av, bq));
            }
        }
    }
    const LANES: usize = 8;
    let width = NV * LANES;
    let full = out.cols == width && out.init.is_none_or(|i| i.len() >= width);
    if full {
        // Whole rows of the tile's columns: added to C (or to `init`) in registers.
        let init: Option<[__m256i; NV]> = out.init.map(|i| {
            // SAFETY: `full` checked that `init` holds at least `width` values.
            std::array::from_fn(|v| unsafe { _mm256_loadu_si256(i.as_ptr().add(v * LANES).cast::<__m256i>()) })
        });
        for (r, row) in acc.iter().enumerate().take(out.rows) {
            let Some(dst) = out.c.get_mut(r * out.ldc..r * out.ldc + width) else {
                return;
            };
            let p = dst.as_mut_ptr().cast::<__m256i>();
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: `dst` holds `width` = 8 NV i32 (NV 256-bit vectors): unaligned
                // loads and stores inside it.
                unsafe {
                    let c0 = match init {
                        Some(i) => i[v],
                        None => _mm256_loadu_si256(p.add(v)),
                    };
                    _mm256_storeu_si256(p.add(v), _mm256_add_epi32(c0, x));
                }
            }
        }
        return;
    }
    let mut tile = [[0i32; NR]; MR];
    for (row, t) in acc.iter().zip(tile.iter_mut()) {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: `t` is NR = 16 i32 and `v < NV <= 2`: 8 i32 at `8 v` inside it,
            // written by an unaligned store.
            unsafe { _mm256_storeu_si256(t.as_mut_ptr().add(v * LANES).cast::<__m256i>(), x) };
        }
    }
    out.store(&tile);
}
