//! f32 matrix transpose: `dst[j * ldd + i] = src[i * lds + j]` for `i < rows`, `j < cols`,
//! the copy behind Transpose's batched-matrix case (NCHW <-> NHWC at a channels-last
//! region's edges, ShuffleNet's channel shuffles, attention's head splits).
//!
//! The x86 path (AVX2, also on AVX-512 machines) moves 8 x 8 blocks through registers: eight
//! row loads, the unpack / shuffle / lane-swap network, eight column stores; the edges (rows
//! or columns past the last whole block) go through the scalar path. The scalar path
//! ([`transpose`], any element type) is the twin the x86 one is tested against (a copy: the
//! results are equal bit for bit); it reads bands of 16 columns, so each input row is read in
//! contiguous runs and the band's output rows stay in L1.

use crate::isa::{self, Isa};

/// Transposes the `rows x cols` matrix at `src` (row stride `lds`) into `dst` (row stride
/// `ldd`, `cols` rows of `rows`). Returns `false`, writing nothing, when a slice is too short
/// for those strides (or a stride is below the row it holds).
pub fn transpose_f32(src: &[f32], lds: usize, rows: usize, cols: usize, dst: &mut [f32], ldd: usize) -> bool {
    transpose_f32_with(isa::active(), src, lds, rows, cols, dst, ldd)
}

/// [`transpose_f32`] on a given level (tests compare the levels).
pub fn transpose_f32_with(
    isa: Isa,
    src: &[f32],
    lds: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    ldd: usize,
) -> bool {
    if !fits(src.len(), lds, rows, cols, dst.len(), ldd) {
        return false;
    }
    if interleaved(src, lds, rows, cols, dst, ldd) {
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if rows > 0 && cols > 0 && isa >= Isa::Avx2Fma && isa.is_supported() {
        // SAFETY: AVX2 is present (checked just above; AVX-512 machines have it too) and the
        // spans were checked: row `i < rows` of `src` holds `cols` floats at `i * lds`, row
        // `j < cols` of `dst` holds `rows` floats at `j * ldd`.
        unsafe { avx2::transpose(src, lds, rows, cols, dst, ldd) };
        return true;
    }
    let _ = isa;
    bands(src, lds, 0..rows, 0..cols, dst, ldd);
    true
}

/// [`transpose_f32`]'s scalar path for any element type (no SIMD): the same contract.
pub fn transpose<T: Copy>(src: &[T], lds: usize, rows: usize, cols: usize, dst: &mut [T], ldd: usize) -> bool {
    if !fits(src.len(), lds, rows, cols, dst.len(), ldd) {
        return false;
    }
    bands(src, lds, 0..rows, 0..cols, dst, ldd);
    true
}

/// [`transpose_f32`] for i32 (the integer convolutions' sums): the same moves of 32-bit
/// words, which the f32 path never does arithmetic on.
pub fn transpose_i32(src: &[i32], lds: usize, rows: usize, cols: usize, dst: &mut [i32], ldd: usize) -> bool {
    // SAFETY: i32 and f32 have the same size and alignment, and every bit pattern is a valid
    // f32; the views cover exactly the slices' memory for their borrows (`dst` mutably, so
    // nothing else reads or writes it meanwhile). The f32 transpose only loads, shuffles and
    // stores the words, so each i32 arrives with its bits unchanged.
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src.as_ptr().cast::<f32>(), src.len()),
            std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<f32>(), dst.len()),
        )
    };
    transpose_f32(s, lds, rows, cols, d, ldd)
}

/// An 8-bit element: [`transpose_bytes`] moves it as its byte.
pub trait Byte: Copy {
    fn to_byte(self) -> u8;
    fn from_byte(b: u8) -> Self;
}

impl Byte for u8 {
    #[inline(always)]
    fn to_byte(self) -> u8 {
        self
    }
    #[inline(always)]
    fn from_byte(b: u8) -> u8 {
        b
    }
}

impl Byte for i8 {
    #[inline(always)]
    fn to_byte(self) -> u8 {
        self as u8
    }
    #[inline(always)]
    fn from_byte(b: u8) -> i8 {
        b as i8
    }
}

/// [`transpose`] of 8-bit elements (the same contract). On x86 with AVX2, 16 x 16 blocks
/// through SSE registers (sixteen row loads, four rounds of byte / word / dword / qword
/// unpacks, sixteen column stores); then, and elsewhere, 8x8 blocks: each block's rows as
/// eight u64s, transposed in registers by three rounds of masked swaps (bytes, then pairs,
/// then quads), instead of 64 byte moves. The edges take the scalar path.
pub fn transpose_bytes<T: Byte>(src: &[T], lds: usize, rows: usize, cols: usize, dst: &mut [T], ldd: usize) -> bool {
    transpose_bytes_with(isa::active(), src, lds, rows, cols, dst, ldd)
}

/// [`transpose_bytes`] on a given level (tests compare the levels).
pub fn transpose_bytes_with<T: Byte>(
    isa: Isa,
    src: &[T],
    lds: usize,
    rows: usize,
    cols: usize,
    dst: &mut [T],
    ldd: usize,
) -> bool {
    if !fits(src.len(), lds, rows, cols, dst.len(), ldd) {
        return false;
    }
    if interleaved(src, lds, rows, cols, dst, ldd) {
        return true;
    }
    let (r16, c16) = (rows / 16 * 16, cols / 16 * 16);
    #[cfg(target_arch = "x86_64")]
    if r16 > 0 && c16 > 0 && std::mem::size_of::<T>() == 1 && isa >= Isa::Avx2Fma && isa.is_supported() {
        // SAFETY: AVX2 is present (checked just above; AVX-512 machines have it too); `T`
        // is one byte (`Byte`: u8 or i8, checked), so the slices are byte arrays of their
        // lengths; the spans were checked: row `i < rows` of `src` holds `cols` bytes at
        // `i * lds`, row `j < cols` of `dst` holds `rows` bytes at `j * ldd`, and the blocks
        // stay below `r16 <= rows`, `c16 <= cols`.
        unsafe {
            avx2::transpose_bytes(
                src.as_ptr().cast::<u8>(),
                lds,
                (r16, c16),
                dst.as_mut_ptr().cast::<u8>(),
                ldd,
            )
        };
        // The rest: the columns past the blocks for their rows, then the rows past them.
        blocks8(src, lds, 0..r16, c16..cols, dst, ldd);
        blocks8(src, lds, r16..rows, 0..cols, dst, ldd);
        return true;
    }
    let _ = (isa, r16, c16);
    blocks8(src, lds, 0..rows, 0..cols, dst, ldd);
    true
}

/// [`transpose_bytes`]' portable path over rows `ri` and columns `cj` (in range: checked by
/// the caller): 8x8 blocks from their starts, the edges by [`bands`].
fn blocks8<T: Byte>(
    src: &[T],
    lds: usize,
    ri: std::ops::Range<usize>,
    cj: std::ops::Range<usize>,
    dst: &mut [T],
    ldd: usize,
) {
    let r8 = ri.start + ri.len() / 8 * 8;
    let c8 = cj.start + cj.len() / 8 * 8;
    for r0 in (ri.start..r8).step_by(8) {
        for c0 in (cj.start..c8).step_by(8) {
            let mut x = [0u64; 8];
            for (i, xi) in x.iter_mut().enumerate() {
                let at = (r0 + i) * lds + c0;
                if let Some(row) = src.get(at..at + 8) {
                    *xi = u64::from_le_bytes(std::array::from_fn(|k| row.get(k).map_or(0, |v| v.to_byte())));
                }
            }
            swap_rows(&mut x, 8, 0x00FF_00FF_00FF_00FF, [(0, 1), (2, 3), (4, 5), (6, 7)]);
            swap_rows(&mut x, 16, 0x0000_FFFF_0000_FFFF, [(0, 2), (1, 3), (4, 6), (5, 7)]);
            swap_rows(&mut x, 32, 0x0000_0000_FFFF_FFFF, [(0, 4), (1, 5), (2, 6), (3, 7)]);
            for (i, xi) in x.iter().enumerate() {
                let at = (c0 + i) * ldd + r0;
                if let Some(out) = dst.get_mut(at..at + 8) {
                    for (o, b) in out.iter_mut().zip(xi.to_le_bytes()) {
                        *o = T::from_byte(b);
                    }
                }
            }
        }
    }
    bands(src, lds, r8..ri.end, cj.clone(), dst, ldd);
    bands(src, lds, ri.start..r8, c8..cj.end, dst, ldd);
}

/// [`transpose_bytes`] of 1-4 rows into a dense destination (`ldd == rows`): column `j` of
/// the rows becomes `dst[j * rows..][..rows]`.
struct Interleave<'a, T> {
    src: &'a [T],
    lds: usize,
    rows: usize,
    cols: usize,
    dst: &'a mut [T],
}

/// A few rows into dense columns (an image's 1-4 channels to channels-last): interleaved row
/// by row in one compiler-vectorised pass, where the 8x8 blocks would leave it all to the
/// scalar edge path. `false`, touching nothing, when the call is not of that kind (the spans
/// already checked by the caller).
fn interleaved<T: Copy>(src: &[T], lds: usize, rows: usize, cols: usize, dst: &mut [T], ldd: usize) -> bool {
    if ldd != rows || !(1..=4).contains(&rows) || cols == 0 {
        return false;
    }
    crate::simd::vectorize_kernel(Interleave {
        src,
        lds,
        rows,
        cols,
        dst,
    });
    true
}

impl<T: Copy> crate::simd::Kernel for Interleave<'_, T> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Interleave {
            src,
            lds,
            rows,
            cols,
            dst,
        } = self;
        let row = |r: usize| src.get(r * lds..r * lds + cols).unwrap_or_default();
        let dst = dst.get_mut(..rows * cols).unwrap_or_default();
        match rows {
            1 => {
                for (o, &a) in dst.iter_mut().zip(row(0)) {
                    *o = a;
                }
            }
            2 => {
                for ((o, &a), &b) in dst.chunks_exact_mut(2).zip(row(0)).zip(row(1)) {
                    o.copy_from_slice(&[a, b]);
                }
            }
            3 => {
                for (((o, &a), &b), &c) in dst.chunks_exact_mut(3).zip(row(0)).zip(row(1)).zip(row(2)) {
                    o.copy_from_slice(&[a, b, c]);
                }
            }
            _ => {
                for ((((o, &a), &b), &c), &d) in dst.chunks_exact_mut(4).zip(row(0)).zip(row(1)).zip(row(2)).zip(row(3))
                {
                    o.copy_from_slice(&[a, b, c, d]);
                }
            }
        }
    }
}

/// One round of [`transpose_bytes`]' block transpose: for each pair `(a, b)` of rows, the
/// units of `shift` bits at odd positions of `a` swap with those at even positions of `b`.
#[inline(always)]
fn swap_rows(x: &mut [u64; 8], shift: u32, mask: u64, pairs: [(usize, usize); 4]) {
    for (a, b) in pairs {
        if let (Some(&va), Some(&vb)) = (x.get(a), x.get(b)) {
            let t = ((va >> shift) ^ vb) & mask;
            if let Some(v) = x.get_mut(a) {
                *v = va ^ (t << shift);
            }
            if let Some(v) = x.get_mut(b) {
                *v = vb ^ t;
            }
        }
    }
}

/// Whether a `rows x cols` matrix with row stride `lds` fits in `src_len` elements and its
/// transpose with row stride `ldd` in `dst_len` (an empty matrix always fits).
fn fits(src_len: usize, lds: usize, rows: usize, cols: usize, dst_len: usize, ldd: usize) -> bool {
    let fit = |len: usize, n: usize, ld: usize, w: usize| {
        ld >= w
            && (n - 1)
                .checked_mul(ld)
                .and_then(|v| v.checked_add(w))
                .is_some_and(|e| e <= len)
    };
    rows == 0 || cols == 0 || (fit(src_len, rows, lds, cols) && fit(dst_len, cols, ldd, rows))
}

/// Columns per band of [`bands`].
const BAND: usize = 16;

/// The element-by-element copy of rows `ri` and columns `cj` (in range: checked by the
/// caller), `BAND` columns at a time: each input row gives a contiguous run, the band's
/// `BAND` output rows are written across.
fn bands<T: Copy>(
    src: &[T],
    lds: usize,
    ri: std::ops::Range<usize>,
    cj: std::ops::Range<usize>,
    dst: &mut [T],
    ldd: usize,
) {
    for j0 in cj.clone().step_by(BAND) {
        let j1 = (j0 + BAND).min(cj.end);
        for i in ri.clone() {
            let Some(run) = src.get(i * lds + j0..i * lds + j1) else {
                continue;
            };
            // Column `j`'s element at `j * ldd + i`, as far as `dst` reaches: an iterator, not
            // a checked store per element, which the compiler vectorised into masked stores.
            for (d, &v) in dst.iter_mut().skip(j0 * ldd + i).step_by(ldd.max(1)).zip(run) {
                *d = v;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 is present; `(rows - 1) * lds + cols <= src.len()`, `(cols - 1) * ldd + rows <=
    /// dst.len()`, `lds >= cols`, `ldd >= rows`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose(src: &[f32], lds: usize, rows: usize, cols: usize, dst: &mut [f32], ldd: usize) {
        let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        for i0 in (0..r8).step_by(8) {
            for j0 in (0..c8).step_by(8) {
                // SAFETY: rows `i0 .. i0 + 8 <= rows`, columns `j0 .. j0 + 8 <= cols` of src;
                // rows `j0 ..+8` and columns `i0 ..+8` of dst: inside the checked spans.
                unsafe {
                    let r: [__m256; 8] = std::array::from_fn(|k| _mm256_loadu_ps(s.add((i0 + k) * lds + j0)));
                    let t = [
                        _mm256_unpacklo_ps(r[0], r[1]),
                        _mm256_unpackhi_ps(r[0], r[1]),
                        _mm256_unpacklo_ps(r[2], r[3]),
                        _mm256_unpackhi_ps(r[2], r[3]),
                        _mm256_unpacklo_ps(r[4], r[5]),
                        _mm256_unpackhi_ps(r[4], r[5]),
                        _mm256_unpacklo_ps(r[6], r[7]),
                        _mm256_unpackhi_ps(r[6], r[7]),
                    ];
                    let u = [
                        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                        _mm256_shuffle_ps::<0xee>(t[0], t[2]),
                        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                        _mm256_shuffle_ps::<0xee>(t[1], t[3]),
                        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                        _mm256_shuffle_ps::<0xee>(t[4], t[6]),
                        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                        _mm256_shuffle_ps::<0xee>(t[5], t[7]),
                    ];
                    // Column k of the block: the low 128-bit halves give columns 0-3, the
                    // high ones 4-7.
                    let cols8 = [
                        _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
                        _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
                        _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
                        _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
                        _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
                        _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
                        _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
                        _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
                    ];
                    for (k, &v) in cols8.iter().enumerate() {
                        _mm256_storeu_ps(d.add((j0 + k) * ldd + i0), v);
                    }
                }
            }
        }
        // The edges: columns past the last whole block for the block rows, then every
        // column of the rows past them.
        super::bands(src, lds, 0..r8, c8..cols, dst, ldd);
        super::bands(src, lds, r8..rows, 0..cols, dst, ldd);
    }

    /// `[lo(v[x0], v[y0]), hi(v[x0], v[y0]), lo(v[x1], v[y1]), ...]`: one round of a
    /// register transpose, written out so that it stays in registers.
    macro_rules! unpack_pairs {
        ($lo:ident, $hi:ident, $v:ident; $(($x:literal, $y:literal)),*) => {
            [$($lo($v[$x], $v[$y]), $hi($v[$x], $v[$y])),*]
        };
    }

    /// The whole 16 x 16 blocks of a byte transpose: rows `0..r16`, columns `0..c16` (both
    /// multiples of 16) of the matrix at `src` (row stride `lds`) into `dst` (row stride
    /// `ldd`). Round by round, the units of each pair of neighbouring rows (bytes, then the
    /// 2-byte units that made, then 4-byte, then 8-byte) interleave, so that after four rounds
    /// each register holds one column of the block.
    ///
    /// # Safety
    /// AVX2 is present; row `i < r16` of `src` holds `c16` bytes at `i * lds`, row `j < c16`
    /// of `dst` holds `r16` bytes at `j * ldd`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose_bytes(
        src: *const u8,
        lds: usize,
        (r16, c16): (usize, usize),
        dst: *mut u8,
        ldd: usize,
    ) {
        for i0 in (0..r16).step_by(16) {
            for j0 in (0..c16).step_by(16) {
                // SAFETY: rows `i0 ..+16 <= r16`, columns `j0 ..+16 <= c16` of src; rows
                // `j0 ..+16` and columns `i0 ..+16` of dst: inside the caller's spans.
                unsafe {
                    let a: [__m128i; 16] =
                        std::array::from_fn(|k| _mm_loadu_si128(src.add((i0 + k) * lds + j0).cast::<__m128i>()));
                    // Byte pairs of rows 2i, 2i+1: columns 0-7 (b[2i]), 8-15 (b[2i+1]).
                    let b = unpack_pairs!(_mm_unpacklo_epi8, _mm_unpackhi_epi8, a;
                        (0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15));
                    // Rows 4i..4i+3 per 4-byte unit: c[4i + m] holds columns 4m..4m+3.
                    let c = unpack_pairs!(_mm_unpacklo_epi16, _mm_unpackhi_epi16, b;
                        (0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15));
                    // Rows 8h..8h+7 per 8-byte unit: d[8h + e] holds columns 2e, 2e+1.
                    let d = unpack_pairs!(_mm_unpacklo_epi32, _mm_unpackhi_epi32, c;
                        (0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15));
                    // All sixteen rows: f[k] is column k.
                    let f = unpack_pairs!(_mm_unpacklo_epi64, _mm_unpackhi_epi64, d;
                        (0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15));
                    for (k, &v) in f.iter().enumerate() {
                        _mm_storeu_si128(dst.add((j0 + k) * ldd + i0).cast::<__m128i>(), v);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The 8x8-block byte transpose against the definition, edges and strides included.
        #[test]
        fn byte_transposes_match_the_definition(
            rows in 1usize..70,
            cols in 1usize..70,
            pad_s in 0usize..5,
            pad_d in 0usize..5,
        ) {
            let (lds, ldd) = (cols + pad_s, rows + pad_d);
            let src: Vec<u8> = (0..rows * lds).map(|v| (v * 31 % 251) as u8).collect();
            let mut dst = vec![0xEEu8; cols * ldd];
            prop_assert!(transpose_bytes(&src, lds, rows, cols, &mut dst, ldd));
            for j in 0..cols {
                for i in 0..ldd {
                    let got = dst[j * ldd + i];
                    if i < rows {
                        prop_assert_eq!(got, src[i * lds + j], "({}, {})", i, j);
                    } else {
                        prop_assert_eq!(got, 0xEE, "wrote the padding at ({}, {})", j, i);
                    }
                }
            }
            // The portable level (8x8 blocks only) writes the same.
            let mut port = vec![0xEEu8; cols * ldd];
            prop_assert!(transpose_bytes_with(Isa::Portable, &src, lds, rows, cols, &mut port, ldd));
            prop_assert_eq!(&port, &dst);
            let signed: Vec<i8> = src.iter().map(|&b| b as i8).collect();
            let mut dsts = vec![0i8; cols * ldd];
            prop_assert!(transpose_bytes(&signed, lds, rows, cols, &mut dsts, ldd));
            for j in 0..cols {
                for i in 0..rows {
                    prop_assert_eq!(dsts[j * ldd + i], signed[i * lds + j]);
                }
            }
        }

        /// 1-4 rows into a dense destination (an image's channels to channels-last, the
        /// interleaving path) against the definition, long rows included.
        #[test]
        fn few_rows_interleave_as_defined(rows in 1usize..=4, cols in 1usize..300, pad_s in 0usize..3) {
            let lds = cols + pad_s;
            let src: Vec<u8> = (0..rows * lds).map(|v| (v * 37 % 253) as u8).collect();
            let mut dst = vec![0xEEu8; cols * rows];
            prop_assert!(transpose_bytes(&src, lds, rows, cols, &mut dst, rows));
            for j in 0..cols {
                for i in 0..rows {
                    prop_assert_eq!(dst[j * rows + i], src[i * lds + j], "({}, {})", i, j);
                }
            }
            let floats: Vec<f32> = src.iter().map(|&b| f32::from(b) - 0.5).collect();
            let mut dstf = vec![-1.0f32; cols * rows];
            prop_assert!(transpose_f32(&floats, lds, rows, cols, &mut dstf, rows));
            for j in 0..cols {
                for i in 0..rows {
                    prop_assert_eq!(dstf[j * rows + i], floats[i * lds + j], "f32 ({}, {})", i, j);
                }
            }
        }

        /// i32 words through the f32 path keep their bits: NaN and subnormal patterns too.
        #[test]
        fn i32_transposes_keep_every_bit(rows in 1usize..30, cols in 1usize..30, pad in 0usize..4) {
            let (lds, ldd) = (cols + pad, rows + pad);
            let src: Vec<i32> = (0..rows * lds)
                .map(|v| [i32::MIN, -1, 0x7FC0_0001, 1, 0x7F80_0001][v % 5].wrapping_add(v as i32 * 7919))
                .collect();
            let mut dst = vec![3i32; cols * ldd];
            prop_assert!(transpose_i32(&src, lds, rows, cols, &mut dst, ldd));
            for j in 0..cols {
                for i in 0..rows {
                    prop_assert_eq!(dst[j * ldd + i], src[i * lds + j]);
                }
            }
        }

        #[test]
        fn every_level_matches_the_definition(
            rows in 1usize..40,
            cols in 1usize..40,
            pad_s in 0usize..5,
            pad_d in 0usize..5,
        ) {
            let (lds, ldd) = (cols + pad_s, rows + pad_d);
            let src: Vec<f32> = (0..rows * lds).map(|v| v as f32 * 0.5 - 3.0).collect();
            // Each level's f32 path, then the generic path (`None`).
            for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()).map(Some).chain([None]) {
                let mut dst = vec![f32::NAN; cols * ldd];
                let ok = match isa {
                    Some(isa) => transpose_f32_with(isa, &src, lds, rows, cols, &mut dst, ldd),
                    None => transpose(&src, lds, rows, cols, &mut dst, ldd),
                };
                prop_assert!(ok);
                for j in 0..cols {
                    for i in 0..ldd {
                        let got = dst[j * ldd + i];
                        if i < rows {
                            prop_assert_eq!(got, src[i * lds + j], "{:?} ({}, {})", isa, i, j);
                        } else {
                            prop_assert!(got.is_nan(), "{:?} wrote the padding at ({}, {})", isa, j, i);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn short_slices_and_strides_are_refused() {
        let src = vec![1.0f32; 12];
        let mut dst = vec![0.0f32; 12];
        assert!(transpose_f32(&src, 4, 3, 4, &mut dst, 3));
        assert!(!transpose_f32(&src, 4, 4, 4, &mut dst, 4));
        assert!(!transpose_f32(&src, 3, 3, 4, &mut dst, 3));
        assert!(!transpose_f32(&src, 4, 3, 4, &mut dst, 2));
        assert!(!transpose_f32(&src, 4, 3, 4, &mut dst[..8], 3));
        assert!(transpose_f32(&src, 4, 0, 4, &mut dst, 0));
        assert!(!transpose(&src, 4, 4, 4, &mut dst, 4));
        assert!(!transpose(&src, 4, 3, 4, &mut dst, 2));
    }
}
