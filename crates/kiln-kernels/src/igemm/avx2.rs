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
    unsafe { micro_avx2(apack.as_ptr(), stride, bpanel.as_ptr(), pairs, out) }
}

/// # Safety
/// AVX2 is available; `a` points to `MR` rows of `stride >= pairs` i32 and `b` to
/// `pairs * 2 * NR` i16.
#[target_feature(enable = "avx2")]
unsafe fn micro_avx2(a: *const i32, stride: usize, b: *const i16, pairs: usize, out: PairsOut<'_, '_>) {
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    for q in 0..pairs {
        // SAFETY: step `q < pairs` of B is `2 * NR` i16 (two 256-bit vectors) at `q * 2 * NR`,
        // within the caller's bound; unaligned loads.
        let (b0, b1) = unsafe {
            let p = b.add(q * 2 * NR);
            (
                _mm256_loadu_si256(p.cast::<__m256i>()),
                _mm256_loadu_si256(p.add(NR).cast::<__m256i>()),
            )
        };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < MR`, pair `q < pairs <= stride`: within the caller's bound.
            let w = unsafe { *a.add(r * stride + q) };
            let av = _mm256_set1_epi32(w);
            row[0] = _mm256_add_epi32(row[0], _mm256_madd_epi16(av, b0));
            row[1] = _mm256_add_epi32(row[1], _mm256_madd_epi16(av, b1));
        }
    }
    let full = out.cols == NR && out.init.is_none_or(|i| i.len() >= NR);
    if full {
        // Whole rows of 16 columns: added to C (or to `init`) in registers.
        let init = out.init.map(|i| {
            // SAFETY: `full` checked that `init` holds at least NR = 16 values.
            unsafe {
                (
                    _mm256_loadu_si256(i.as_ptr().cast::<__m256i>()),
                    _mm256_loadu_si256(i.as_ptr().add(8).cast::<__m256i>()),
                )
            }
        });
        for (r, row) in acc.iter().enumerate().take(out.rows) {
            let Some(dst) = out.c.get_mut(r * out.ldc..r * out.ldc + NR) else {
                return;
            };
            let p = dst.as_mut_ptr().cast::<__m256i>();
            // SAFETY: `dst` holds NR = 16 i32 (two 256-bit vectors): unaligned loads and
            // stores inside it.
            unsafe {
                let (c0, c1) = match init {
                    Some(i) => i,
                    None => (_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1))),
                };
                _mm256_storeu_si256(p, _mm256_add_epi32(c0, row[0]));
                _mm256_storeu_si256(p.add(1), _mm256_add_epi32(c1, row[1]));
            }
        }
        return;
    }
    let mut tile = [[0i32; NR]; MR];
    for (row, t) in acc.iter().zip(tile.iter_mut()) {
        // SAFETY: `t` is NR = 16 i32 (two 256-bit vectors), written by unaligned stores.
        unsafe {
            _mm256_storeu_si256(t.as_mut_ptr().cast::<__m256i>(), row[0]);
            _mm256_storeu_si256(t.as_mut_ptr().add(8).cast::<__m256i>(), row[1]);
        }
    }
    out.store(&tile);
}
