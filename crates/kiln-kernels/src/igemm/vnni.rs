//! The AVX-512 VNNI micro-tile of the integer GEMM: [`MR_QUADS`] rows by [`NR_QUADS`] columns
//! in sixteen 16-lane i32 accumulators; each step broadcasts four u8 depths of a row of A and
//! multiplies them by two vectors of s8 quads of B with `vpdpbusd`, which adds the four
//! products of each lane into its i32 exactly (wrapping, never saturating: the result is
//! exact whenever the final sum fits, see the module docs).

use super::{AQuads, Final, MR_QUADS, NR_QUADS, Tile};
use std::arch::x86_64::*;

/// `quant::requantize_row_f32`'s bound on a value before rounding (2^22).
const BIG: f32 = 4_194_304.0;

/// Writes the tile's sums over `quads` depth quads into `c` (see [`Tile`]), or with `fin`,
/// their requantized bytes into `fin.y` (C is then only read, for earlier blocks' sums).
pub(super) fn micro(a: AQuads<'_>, bpanel: &[i8], quads: usize, c: &mut [i32], tile: Tile<'_>, fin: Option<Final<'_>>) {
    let quads = quads.min(bpanel.len() / (4 * NR_QUADS));
    if !a.covers(quads) {
        return;
    }
    let rows = tile.rows.min(MR_QUADS);
    let cols = tile.cols.min(NR_QUADS);
    if rows == 0 || cols == 0 {
        return;
    }
    // The tile's last element must be inside `c`, and `init` must cover its columns.
    let need = (rows - 1) * tile.ldc + cols;
    if c.len() < need || tile.init.is_some_and(|i| i.len() < cols) {
        return;
    }
    let init = tile.init.map(|i| i.as_ptr());
    let geometry = (a.row, a.quad);
    let out = (c.as_mut_ptr(), tile.ldc, rows, cols);
    let (ap, bp) = (a.data.as_ptr(), bpanel.as_ptr());
    match fin {
        None => {
            // SAFETY: the caller dispatches here only when `Isa::has_int8_dot` found AVX-512
            // F, BW and VNNI; `quads` is clamped to what B's panel holds and A covers it
            // (`covers`), C holds every element the masked stores touch (`need` above), and
            // `init` at least `cols` values (masked loads).
            unsafe {
                if a.flip {
                    micro_vnni::<true, false>(ap, geometry, bp, quads, out, init, None)
                } else {
                    micro_vnni::<false, false>(ap, geometry, bp, quads, out, init, None)
                }
            }
        }
        Some(f) => {
            let y_need = (rows - 1) * f.ldy + cols;
            if f.y.len() < y_need || f.bias.len() < cols || f.mult.len() < cols {
                return;
            }
            let stage = Stage {
                y: f.y.as_mut_ptr(),
                ldy: f.ldy,
                bias: f.bias.as_ptr(),
                mult: f.mult.as_ptr(),
                zero_point: f.zero_point,
                lo: f.lo,
                hi: f.hi,
            };
            // SAFETY: as above for A, B, C and `init` (C is only read here); Y holds every
            // byte the masked stores touch (`y_need`), bias and mult at least `cols` values.
            unsafe {
                if a.flip {
                    micro_vnni::<true, true>(ap, geometry, bp, quads, out, init, Some(stage))
                } else {
                    micro_vnni::<false, true>(ap, geometry, bp, quads, out, init, Some(stage))
                }
            }
        }
    }
}

/// [`Final`] as the kernel reads it.
struct Stage {
    y: *mut u8,
    ldy: usize,
    bias: *const f32,
    mult: *const f32,
    zero_point: f32,
    lo: i32,
    hi: i32,
}

/// # Safety
/// AVX-512 F, BW and VNNI are available; A's quad `q` of row `r < MR_QUADS` is the four bytes
/// at `a + r * row + q * quad` for `q < quads`; `b` points to `quads * 4 * NR_QUADS` i8; C
/// (`c`, `ldc` apart) holds `(rows - 1) * ldc + cols` i32; `init`, if any, `cols`; with
/// `REQ`, `stage` is `Some`, its Y (`ldy` apart) holds `(rows - 1) * ldy + cols` bytes and its
/// bias and mult `cols` values each.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn micro_vnni<const FLIP: bool, const REQ: bool>(
    a: *const u8,
    (row_step, quad_step): (usize, usize),
    b: *const i8,
    quads: usize,
    (c, ldc, rows, cols): (*mut i32, usize, usize, usize),
    init: Option<*const i32>,
    stage: Option<Stage>,
) {
    let mut acc = [[_mm512_setzero_si512(); 2]; MR_QUADS];
    let flip = _mm512_set1_epi32(0x8080_8080_u32 as i32);
    for q in 0..quads {
        // SAFETY: step `q < quads` of B is `4 * NR_QUADS` bytes (two 512-bit vectors) at
        // `q * 4 * NR_QUADS`, within the caller's bound; unaligned loads.
        let (b0, b1) = unsafe {
            let p = b.add(q * 4 * NR_QUADS);
            (_mm512_loadu_si512(p.cast()), _mm512_loadu_si512(p.add(64).cast()))
        };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: row `r`'s quad `q` is four bytes at `r * row + q * quad`, within the
            // caller's bound; an unaligned read.
            let w = unsafe { a.add(r * row_step + q * quad_step).cast::<i32>().read_unaligned() };
            let mut av = _mm512_set1_epi32(w);
            if FLIP {
                av = _mm512_xor_si512(av, flip);
            }
            row[0] = _mm512_dpbusd_epi32(row[0], av, b0);
            row[1] = _mm512_dpbusd_epi32(row[1], av, b1);
        }
    }
    let m0: __mmask16 = if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 };
    let m1: __mmask16 = match cols.saturating_sub(16) {
        0 => 0,
        n if n >= 16 => 0xFFFF,
        n => (1u16 << n) - 1,
    };
    if REQ && let Some(st) = stage {
        // SAFETY: bias and mult hold `cols` values (caller); the masked loads read no more.
        let (bias, mult) = unsafe {
            (
                [
                    _mm512_maskz_loadu_ps(m0, st.bias),
                    _mm512_maskz_loadu_ps(m1, st.bias.wrapping_add(16)),
                ],
                [
                    _mm512_maskz_loadu_ps(m0, st.mult),
                    _mm512_maskz_loadu_ps(m1, st.mult.wrapping_add(16)),
                ],
            )
        };
        let (zp, big, nbig) = (_mm512_set1_ps(st.zero_point), _mm512_set1_ps(BIG), _mm512_set1_ps(-BIG));
        let (lo, hi) = (_mm512_set1_epi32(st.lo), _mm512_set1_epi32(st.hi));
        // `quant::requantize_row_f32`'s steps: f32 sum plus bias, times mult, plus the zero
        // point, each rounded to f32 (no FMA); kept within +-BIG (NaN becomes -BIG, as
        // `f32::max` makes it: `vmaxps` returns its second operand for a NaN); rounded half
        // to even (`vcvtps2dq` under the default MXCSR); clamped; the low byte stored.
        let requant = |s: __m512i, j: usize| -> __m512i {
            let v = _mm512_add_ps(_mm512_cvtepi32_ps(s), bias[j]);
            let v = _mm512_add_ps(_mm512_mul_ps(v, mult[j]), zp);
            let v = _mm512_min_ps(_mm512_max_ps(v, nbig), big);
            _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), lo), hi)
        };
        for (r, row) in acc.iter().enumerate().take(rows) {
            // SAFETY: as in the store loop below for C's (or `init`'s) reads; Y's row `r`
            // starts at `r * ldy` and the masks limit its stores to `cols` bytes, within the
            // caller's bound (the second half's address is formed with `wrapping_add`, never
            // touched when its mask is empty).
            unsafe {
                let p = c.add(r * ldc);
                let (base0, base1) = match init {
                    Some(i) => (
                        _mm512_maskz_loadu_epi32(m0, i),
                        _mm512_maskz_loadu_epi32(m1, i.wrapping_add(16)),
                    ),
                    None => (
                        _mm512_maskz_loadu_epi32(m0, p),
                        _mm512_maskz_loadu_epi32(m1, p.wrapping_add(16)),
                    ),
                };
                let y = st.y.add(r * st.ldy);
                let q0 = requant(_mm512_add_epi32(base0, row[0]), 0);
                let q1 = requant(_mm512_add_epi32(base1, row[1]), 1);
                _mm512_mask_cvtepi32_storeu_epi8(y.cast(), m0, q0);
                _mm512_mask_cvtepi32_storeu_epi8(y.wrapping_add(16).cast(), m1, q1);
            }
        }
        return;
    }
    for (r, row) in acc.iter().enumerate().take(rows) {
        // SAFETY: row `r < rows` of the tile starts at `r * ldc`; the masks limit both halves
        // to the first `cols` columns, all within `need` (checked by the caller), and `init`
        // holds `cols` values. The second half's address is formed with `wrapping_add`: it
        // may lie past C when its mask is empty, and is then never touched.
        unsafe {
            let p = c.add(r * ldc);
            let (base0, base1) = match init {
                Some(i) => (
                    _mm512_maskz_loadu_epi32(m0, i),
                    _mm512_maskz_loadu_epi32(m1, i.wrapping_add(16)),
                ),
                None => (
                    _mm512_maskz_loadu_epi32(m0, p),
                    _mm512_maskz_loadu_epi32(m1, p.wrapping_add(16)),
                ),
            };
            _mm512_mask_storeu_epi32(p, m0, _mm512_add_epi32(base0, row[0]));
            _mm512_mask_storeu_epi32(p.wrapping_add(16), m1, _mm512_add_epi32(base1, row[1]));
        }
    }
}
