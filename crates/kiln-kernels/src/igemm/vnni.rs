//! The AVX-512 VNNI micro-tile of the integer GEMM: [`MR_QUADS`] rows by [`NR_QUADS`] columns
//! in sixteen 16-lane i32 accumulators; each step broadcasts four u8 depths of a row of A and
//! multiplies them by two vectors of s8 quads of B with `vpdpbusd`, which adds the four
//! products of each lane into its i32 exactly (wrapping, never saturating: the result is
//! exact whenever the final sum fits, see the module docs).

use super::{AQuads, Final, MR_QUADS, NR_QUADS, Scales, Strip, Tile};
use std::arch::x86_64::*;

/// Writes the tile's sums over `quads` depth quads into `c` (see [`Tile`]), or with `fin`,
/// their requantized bytes into `fin.y` (C is then only read, for earlier blocks' sums).
#[inline(always)]
pub(super) fn micro(a: AQuads<'_>, b: Strip<'_>, quads: usize, c: &mut [i32], tile: Tile<'_>, fin: Option<Final<'_>>) {
    if !a.covers(quads) {
        return;
    }
    let table = [[a.data.as_ptr(); MR_QUADS]];
    // SAFETY: `covers` checked that quad `q < quads` of every row `r` (`r * row + q * quad`)
    // lies within A's slice; `micro_rows` checks B's strip.
    unsafe { micro_rows(&table, (a.row, a.quad), quads, a.flip, b, c, tile, fin) }
}

/// The tile over A's rows as addresses: with `row` 0, `table[t][r]` is row `r`'s first quad
/// of tap `t`; else A is strided and row `r`'s is `table[t][0] + r * row` (the kernel forms
/// the addresses, as the fastest code for it; the other entries are not read). Quad `q` of a
/// tap is `q * quad` past its first; B's panel holds the taps' quads one after another.
///
/// # Safety
/// For every `t < table.len()`, `r < MR_QUADS` and `q < quads_per_tap`, the four bytes at
/// `table[t][r] + q * quad` (strided: `table[t][0] + r * row + q * quad`) are readable (B's
/// strip is checked here).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn micro_rows(
    table: &[[*const u8; MR_QUADS]],
    (row, quad): (usize, usize),
    quads_per_tap: usize,
    flip: bool,
    b: Strip<'_>,
    c: &mut [i32],
    tile: Tile<'_>,
    fin: Option<Final<'_>>,
) {
    let steps = table.len() * quads_per_tap * 4 * NR_QUADS;
    if b.panels == 0 || b.data.len() < (b.panels - 1) * b.stride + steps {
        return;
    }
    let rows = tile.rows.min(MR_QUADS);
    let cols = tile.cols.min(b.panels * NR_QUADS);
    if rows == 0 || cols == 0 {
        return;
    }
    // The tile's last element must be inside `c`, and `init` must cover its columns.
    let need = (rows - 1) * tile.ldc + cols;
    if c.len() < need || tile.init.is_some_and(|i| i.len() < cols) {
        return;
    }
    let init = tile.init.map(|i| i.as_ptr());
    let a = (table.as_ptr(), table.len(), (row, quad), quads_per_tap);
    let out = (c.as_mut_ptr(), tile.ldc, rows, cols);
    let bp = (b.data.as_ptr(), b.panels, b.stride);
    let stage = match fin {
        None => None,
        Some(f) => match Stage::of(f, rows, cols) {
            Some(st) => Some(st),
            None => return,
        },
    };
    // SAFETY: the caller dispatches here only when `Isa::has_int8_dot` found AVX-512 F, VL, BW
    // and VNNI; A's quads are readable (this function's contract), B's panels hold every
    // step (checked above), C every element the masked stores touch (`need` above), `init`
    // at least `cols` values (masked loads); with a stage (C then only read), Y holds every
    // byte its masked stores touch (`y_need`), bias and mult at least `cols` values.
    unsafe {
        match (flip, row != 0) {
            (false, false) => by_stage::<false, false>(a, bp, out, init, stage),
            (false, true) => by_stage::<false, true>(a, bp, out, init, stage),
            (true, false) => by_stage::<true, false>(a, bp, out, init, stage),
            (true, true) => by_stage::<true, true>(a, bp, out, init, stage),
        }
    }
}

/// [`micro_vnni`] for the stage's arithmetic: each kind its own kernel, so that its
/// requantization inlines into the tile's stores (a call there would keep the accumulators
/// in memory through the whole product).
///
/// # Safety
/// As for [`micro_vnni`].
#[inline(always)]
unsafe fn by_stage<const FLIP: bool, const STRIDED: bool>(
    a: (*const [*const u8; MR_QUADS], usize, (usize, usize), usize),
    bp: (*const i8, usize, usize),
    out: (*mut i32, usize, usize, usize),
    init: Option<*const i32>,
    stage: Option<Stage>,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match stage.map(|s| s.params) {
            None => micro_vnni::<FLIP, false, STRIDED, F32Stage>(a, bp, out, init, stage),
            Some(Params::F32 { .. }) => micro_vnni::<FLIP, true, STRIDED, F32Stage>(a, bp, out, init, stage),
            Some(Params::F64 { twin: None, .. }) => {
                micro_vnni::<FLIP, true, STRIDED, F64Stage>(a, bp, out, init, stage)
            }
            Some(Params::F64 { twin: Some(_), .. }) => {
                micro_vnni::<FLIP, true, STRIDED, CheckedStage>(a, bp, out, init, stage)
            }
        }
    }
}

/// [`Final`] as the kernel reads it.
#[derive(Clone, Copy)]
struct Stage {
    y: *mut u8,
    ldy: usize,
    params: Params,
    lo: i32,
    hi: i32,
    /// The residual sum's R (Y's layout) and map ([`super::ResidualSum`]).
    sum: Option<SumStage>,
}

/// [`super::ResidualSum`] as the kernel reads it.
#[derive(Clone, Copy)]
struct SumStage {
    r: *const u8,
    signed: bool,
    map: crate::quant::SumMap,
    floor: f32,
}

impl SumStage {
    /// The sum of 16 clamped output codes `x` (integers as f32) with R's 16 codes at `r`
    /// (lanes `mask`), as 32-bit lanes whose low byte is the output byte:
    /// [`crate::quant::SumMap::code_bounded`]'s steps in the same order (no fused
    /// multiply-add), rounded by the add of 1.5 * 2^23 (`quant::ROUND`; the bounded map keeps
    /// every value within its range), the zero point added and the clamp applied past that
    /// offset, all on whole numbers and so exact. Adds and comparisons that either vector
    /// port takes, where `vrndscaleps` and `vcvtps2dq` run on one port of an Intel core.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL are available; the mask's bytes at `r` are readable.
    #[inline(always)]
    unsafe fn add(&self, x: __m512, r: *const u8, mask: __mmask16) -> __m512i {
        let crate::quant::SumMap {
            ra,
            rb,
            shift,
            zero_point,
        } = self.map;
        let hi = if self.signed { 127.0 } else { 255.0 };
        // SAFETY: the caller's features and bytes.
        unsafe {
            let z = self.residual(r, mask);
            let t = _mm512_add_ps(
                _mm512_mul_ps(x, _mm512_set1_ps(ra)),
                _mm512_add_ps(_mm512_mul_ps(z, _mm512_set1_ps(rb)), _mm512_set1_ps(shift)),
            );
            let round = crate::quant::ROUND;
            let w = _mm512_add_ps(_mm512_add_ps(t, _mm512_set1_ps(round)), _mm512_set1_ps(zero_point));
            let (floor, hi) = (_mm512_set1_ps(round + self.floor), _mm512_set1_ps(round + hi));
            _mm512_castps_si512(_mm512_min_ps(_mm512_max_ps(w, floor), hi))
        }
    }
}

impl SumStage {
    /// R's 16 codes at `r` (lanes `mask`) as f32.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL are available; the mask's bytes at `r` are readable.
    #[inline(always)]
    unsafe fn residual(&self, r: *const u8, mask: __mmask16) -> __m512 {
        // SAFETY: the caller's features and bytes.
        unsafe {
            let bytes = _mm_maskz_loadu_epi8(mask, r.cast());
            _mm512_cvtepi32_ps(if self.signed {
                _mm512_cvtepi8_epi32(bytes)
            } else {
                _mm512_cvtepu8_epi32(bytes)
            })
        }
    }

    /// The sum of 16 clamped unrounded output values `x` with R's codes at `r` (lanes
    /// `mask`), [`crate::quant::requantize_summed_row_f32`]'s last steps:
    /// `x * ra + (z * rb + (shift + zero_point))` fused, clamped and rounded half to even; as
    /// 32-bit lanes whose low byte is the output byte.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL are available; the mask's bytes at `r` are readable.
    #[inline(always)]
    unsafe fn add_unrounded(&self, x: __m512, r: *const u8, mask: __mmask16) -> __m512i {
        let map = self.map;
        let hi = if self.signed { 127.0 } else { 255.0 };
        // SAFETY: the caller's features and bytes.
        unsafe {
            let start = _mm512_set1_ps(map.shift + map.zero_point);
            let t = _mm512_fmadd_ps(self.residual(r, mask), _mm512_set1_ps(map.rb), start);
            let t = _mm512_fmadd_ps(x, _mm512_set1_ps(map.ra), t);
            // Clamped to whole bounds, then rounded by the add of 1.5 * 2^23 (half to even,
            // as the scalar twin): the low byte is the code.
            let t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(self.floor)), _mm512_set1_ps(hi));
            _mm512_castps_si512(_mm512_add_ps(t, _mm512_set1_ps(crate::quant::ROUND)))
        }
    }
}

impl Stage {
    /// The stage from column `j` on: Y's, R's and the parameters' (addresses formed with
    /// `wrapping_add`, used only within the caller's columns).
    fn at_column(self, j: usize) -> Stage {
        Stage {
            y: self.y.wrapping_add(j),
            params: self.params.at_column(j),
            sum: self.sum.map(|s| SumStage {
                r: s.r.wrapping_add(j),
                ..s
            }),
            ..self
        }
    }

    /// `fin` as the kernel reads it, for a tile of `rows` rows (>= 1) and `cols` columns;
    /// `None` when its Y or its parameters are too short for them.
    fn of(f: Final<'_>, rows: usize, cols: usize) -> Option<Stage> {
        let y_need = (rows - 1) * f.ldy + cols;
        if f.y.len() < y_need || f.scales.columns() < cols || f.sum.is_some_and(|s| s.values.len() < y_need) {
            return None;
        }
        let sum = f.sum.map(|s| SumStage {
            r: s.values.as_ptr(),
            signed: s.signed,
            map: s.map,
            floor: s.floor,
        });
        let params = match f.scales {
            Scales::F32 { bias, mult, zero_point } => Params::F32 {
                bias: bias.as_ptr(),
                mult: mult.as_ptr(),
                zero_point,
            },
            Scales::F64 {
                bias,
                mult,
                zero_point,
                twin,
            } => Params::F64 {
                bias: bias.as_ptr(),
                mult: mult.as_ptr(),
                zero_point,
                twin: twin.map(|t| (t.bias.as_ptr(), t.mult.as_ptr(), t.margin)),
            },
        };
        Some(Stage {
            y: f.y.as_mut_ptr(),
            ldy: f.ldy,
            params,
            lo: f.lo,
            hi: f.hi,
            sum,
        })
    }
}

/// The output stage of the VNNI micro-tiles on sums already in C: `rows` rows of up to
/// [`PANELS_PER_CALL`] panels' `cols` columns (`ldc` apart), each row plus `init` (by column), requantized
/// into `fin`'s Y, the same bytes the micro-tiles write for those sums (the AMX tiles'
/// epilogue). Only where `Isa::has_int8_dot`; nothing is written if C, `init`, Y or the
/// parameters are too short.
pub(super) fn requant_panel(c: &[i32], ldc: usize, rows: usize, cols: usize, fin: Final<'_>, init: &[i32]) {
    let cols = cols.min(PANELS_PER_CALL * NR_QUADS);
    if rows == 0 || cols == 0 || c.len() < (rows - 1) * ldc + cols || init.len() < cols {
        return;
    }
    let init = init.as_ptr();
    let Some(st) = Stage::of(fin, rows, cols) else { return };
    let at = (c.as_ptr().cast_mut(), ldc, rows, cols);
    let vbmi = crate::isa::active().has_byte_permute();
    // SAFETY: the callers run this only where `Isa::has_int8_dot` found AVX-512 F, VL, BW and
    // VNNI (and VBMI where `vbmi`); C holds the rows' `cols` columns (checked above; the
    // kernel only reads C when it has a stage), Y and the parameters theirs (`Stage::of`).
    unsafe {
        match (st.params, vbmi) {
            (Params::F32 { .. }, false) => requant_rows::<F32Stage>(at, init, st),
            (Params::F64 { twin: None, .. }, false) => requant_rows::<F64Stage>(at, init, st),
            (Params::F64 { twin: Some(_), .. }, false) => requant_rows::<CheckedStage>(at, init, st),
            (Params::F32 { .. }, true) => requant_rows_vbmi::<F32Stage>(at, init, st),
            (Params::F64 { twin: None, .. }, true) => requant_rows_vbmi::<F64Stage>(at, init, st),
            (Params::F64 { twin: Some(_), .. }, true) => requant_rows_vbmi::<CheckedStage>(at, init, st),
        }
    }
}

/// Panels one [`requant_panel`] call takes: the AMX runner's scratch holds two blocks of
/// adjacent panels, whose epilogue is then one call (the call's setup, about a quarter of a
/// 32 x 32 block's epilogue by `perf`, paid once).
pub(super) const PANELS_PER_CALL: usize = 2;

/// [`requant_panel`] for one kind of stage.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI are available; C holds `(rows - 1) * ldc + cols` i32 (only
/// read), `init` `cols`, the stage's Y `(rows - 1) * ldy + cols` bytes, its bias and
/// mult `cols` values; `cols <= PANELS_PER_CALL * NR_QUADS`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn requant_rows<E: Epilogue>(at: (*mut i32, usize, usize, usize), init: *const i32, st: Stage) {
    // SAFETY: this function's contract and features.
    unsafe { requant_rows_with::<E, false>(at, init, st) }
}

/// [`requant_rows`] narrowing each row's codes to bytes with one byte permute.
///
/// # Safety
/// As [`requant_rows`], and AVX-512 VBMI is available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn requant_rows_vbmi<E: Epilogue>(at: (*mut i32, usize, usize, usize), init: *const i32, st: Stage) {
    // SAFETY: this function's contract and features.
    unsafe { requant_rows_with::<E, true>(at, init, st) }
}

/// The body of [`requant_rows`] and [`requant_rows_vbmi`] (`VBMI` only where it is enabled).
///
/// # Safety
/// As [`requant_rows`] (and [`requant_rows_vbmi`] with `VBMI`).
#[inline(always)]
unsafe fn requant_rows_with<E: Epilogue, const VBMI: bool>(
    (c, ldc, rows, cols): (*mut i32, usize, usize, usize),
    init: *const i32,
    st: Stage,
) {
    // Panel by panel: each one's columns from `j` on.
    let mut j = 0;
    while j < cols {
        // SAFETY: the caller's contract, for the panel's columns `j..` (C, `init`, Y, R and
        // the parameters all hold `cols` columns from their first).
        unsafe {
            requant_one_panel::<E, VBMI>(
                (c.wrapping_add(j), ldc, rows, (cols - j).min(NR_QUADS)),
                init.wrapping_add(j),
                st.at_column(j),
            )
        };
        j += NR_QUADS;
    }
}

/// [`requant_rows_with`] on one panel (`cols <= NR_QUADS`).
///
/// # Safety
/// As [`requant_rows`] (and [`requant_rows_vbmi`] with `VBMI`), `cols <= NR_QUADS`.
#[inline(always)]
unsafe fn requant_one_panel<E: Epilogue, const VBMI: bool>(
    (c, ldc, rows, cols): (*mut i32, usize, usize, usize),
    init: *const i32,
    st: Stage,
) {
    let m0: __mmask16 = if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 };
    let m1: __mmask16 = match cols.saturating_sub(16) {
        0 => 0,
        n if n >= 16 => 0xFFFF,
        n => (1u16 << n) - 1,
    };
    // SAFETY: the caller's features; bias and mult hold `cols` values (the masks).
    let Some(e) = (unsafe { E::load(st.params, st.lo, st.hi, m0, m1) }) else {
        return;
    };
    let store = RowStore {
        c,
        ldc,
        rows,
        add_c: true,
        masks: (m0, m1),
        stage: Some((st, e)),
    };
    // SAFETY: `init` holds `cols` values, the masks' lanes.
    let add = unsafe {
        [
            _mm512_maskz_loadu_epi32(m0, init),
            _mm512_maskz_loadu_epi32(m1, init.wrapping_add(16)),
        ]
    };
    for r in 0..rows {
        // SAFETY: `RowStore::store`'s contract: row `r < rows` of C and Y within the bounds
        // above, C only read (a stage), the masks within `cols`; VBMI as the caller says.
        unsafe { store.store_with::<VBMI>(r, add) };
    }
}

/// Half `j` of row `r`'s sums `s` requantized by `e` into codes (i32 lanes within the
/// output's range), with the stage's residual sum when it has one (R's lanes `mask`). A
/// function that always inlines rather than a closure, which the compiler kept out of line
/// without the caller's vector features.
///
/// # Safety
/// AVX-512 F, BW and VL are available; with a sum, R's row `r` holds the mask's bytes from
/// column `16 j`.
#[inline(always)]
unsafe fn codes<E: Epilogue>(st: &Stage, e: &E, (r, j): (usize, usize), s: __m512i, mask: __mmask16) -> __m512i {
    // SAFETY: the caller's features and R's bytes.
    unsafe {
        match &st.sum {
            Some(sum) => e.summed(s, j, sum, sum.r.wrapping_add(r * st.ldy + 16 * j), mask),
            None => e.low_bytes(s, j),
        }
    }
}

/// The byte permute's indices that pick each i32 lane's low byte, of the first source's 16
/// lanes and then the second's.
#[repr(C, align(64))]
struct LowBytes([u8; 64]);

const LOW_BYTES: LowBytes = {
    let mut idx = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        // Lane `i % 16` of source `i / 16` (bit 6 selects the second).
        idx[i] = ((i / 16) * 64 + (i % 16) * 4) as u8;
        i += 1;
    }
    LowBytes(idx)
};

/// A stage's bias and multipliers (one per column) and zero point, as [`Scales`].
#[derive(Clone, Copy)]
enum Params {
    F32 {
        bias: *const f32,
        mult: *const f32,
        zero_point: f32,
    },
    F64 {
        bias: *const f64,
        mult: *const f64,
        zero_point: f64,
        /// The f32 twin's bias, mult and margin ([`super::F32Twin`]).
        twin: Option<(*const f32, *const f32, f32)>,
    },
}

impl Params {
    /// The parameters from column `j` on (addresses formed with `wrapping_add`).
    fn at_column(self, j: usize) -> Params {
        match self {
            Params::F32 { bias, mult, zero_point } => Params::F32 {
                bias: bias.wrapping_add(j),
                mult: mult.wrapping_add(j),
                zero_point,
            },
            Params::F64 {
                bias,
                mult,
                zero_point,
                twin,
            } => Params::F64 {
                bias: bias.wrapping_add(j),
                mult: mult.wrapping_add(j),
                zero_point,
                twin: twin.map(|(b, m, margin)| (b.wrapping_add(j), m.wrapping_add(j), margin)),
            },
        }
    }
}

/// A panel's stage in registers: its 32 columns' parameters, loaded once per tile, and the
/// requantization of a vector of 16 sums with them.
trait Epilogue: Copy {
    /// The stage's parameters for the panel's columns (masks `m0`, `m1` of its two halves);
    /// `None` for parameters of the other kind (`by_stage` never asks for them).
    ///
    /// # Safety
    /// AVX-512 F and BW are available; the stage's bias and mult hold the masks' columns.
    unsafe fn load(params: Params, lo: i32, hi: i32, m0: __mmask16, m1: __mmask16) -> Option<Self>;
    /// The 16 sums of half `j` (columns `16 j..`) as the 32-bit lanes of the output bytes.
    ///
    /// # Safety
    /// AVX-512 F is available.
    unsafe fn requant(&self, s: __m512i, j: usize) -> __m512i;

    /// [`Epilogue::requant`]'s codes as 32-bit lanes whose low byte is the output byte (all
    /// the stores keep): the codes themselves unless a stage has a cheaper form.
    ///
    /// # Safety
    /// AVX-512 F is available.
    #[inline(always)]
    unsafe fn low_bytes(&self, s: __m512i, j: usize) -> __m512i {
        // SAFETY: AVX-512 F (caller).
        unsafe { self.requant(s, j) }
    }

    /// Half `j`'s sums `s` with the residual sum `sum` (R's 16 codes at `r`, lanes `mask`)
    /// as 32-bit lanes whose low byte is the output byte: the stage's codes, then the sum
    /// ([`SumStage::add`], the exact arithmetic of the two ops).
    ///
    /// # Safety
    /// AVX-512 F, BW and VL are available; the mask's bytes at `r` are readable.
    #[inline(always)]
    unsafe fn summed(&self, s: __m512i, j: usize, sum: &SumStage, r: *const u8, mask: __mmask16) -> __m512i {
        // SAFETY: the caller's features and bytes.
        unsafe { sum.add(_mm512_cvtepi32_ps(self.requant(s, j)), r, mask) }
    }
}

/// `quant::requantize_row_f32`'s steps: the f32 sum times mult plus `bias * mult +
/// zero_point`, both fused; then (see [`F32Stage::finish`]) clamped to the output's bounds and
/// rounded half to even (`vcvtps2dq` under the default MXCSR).
#[derive(Clone, Copy)]
struct F32Stage {
    mult: [__m512; 2],
    /// `bias * mult + zero_point` (fused).
    start: [__m512; 2],
    lo: __m512,
    hi: __m512,
}

impl Epilogue for F32Stage {
    #[inline(always)]
    unsafe fn load(params: Params, lo: i32, hi: i32, m0: __mmask16, m1: __mmask16) -> Option<Self> {
        let Params::F32 { bias, mult, zero_point } = params else {
            return None;
        };
        // SAFETY: the masked loads read the columns the caller vouches for.
        unsafe {
            let load = |p: *const f32| {
                [
                    _mm512_maskz_loadu_ps(m0, p),
                    _mm512_maskz_loadu_ps(m1, p.wrapping_add(16)),
                ]
            };
            let (bias, mult, zero_point) = (load(bias), load(mult), _mm512_set1_ps(zero_point));
            let start = |h: usize| crate::quant::stage_start_x16(bias[h], mult[h], zero_point);
            Some(F32Stage {
                start: [start(0), start(1)],
                mult,
                lo: _mm512_set1_ps(lo as f32),
                hi: _mm512_set1_ps(hi as f32),
            })
        }
    }

    #[inline(always)]
    unsafe fn requant(&self, s: __m512i, j: usize) -> __m512i {
        // SAFETY: AVX-512 F (caller).
        unsafe { self.finish(self.value(s, j)) }
    }

    /// Clamped, then rounded half to even by adding 1.5 * 2^23 (`quant::ROUND`): the
    /// float's low byte is then the code's (two's complement below zero), as `vcvtps2dq`
    /// rounds it, with an add that either vector port takes instead of a conversion that
    /// only one does.
    #[inline(always)]
    unsafe fn low_bytes(&self, s: __m512i, j: usize) -> __m512i {
        // SAFETY: AVX-512 F (caller).
        unsafe {
            let v = _mm512_min_ps(_mm512_max_ps(self.value(s, j), self.lo), self.hi);
            _mm512_castps_si512(_mm512_add_ps(v, _mm512_set1_ps(crate::quant::ROUND)))
        }
    }

    /// The fused one-rounding stage of [`crate::quant::requantize_summed_row_f32`]: the
    /// values unrounded, clamped, and summed with R's codes by two fused multiply-adds.
    #[inline(always)]
    unsafe fn summed(&self, s: __m512i, j: usize, sum: &SumStage, r: *const u8, mask: __mmask16) -> __m512i {
        let j = j & 1;
        // SAFETY: the caller's features and bytes.
        unsafe {
            let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), self.mult[j], self.start[j]);
            sum.add_unrounded(_mm512_min_ps(_mm512_max_ps(v, self.lo), self.hi), r, mask)
        }
    }
}

impl F32Stage {
    /// The unrounded values of half `j`'s sums `s`.
    ///
    /// # Safety
    /// AVX-512 F is available.
    #[inline(always)]
    unsafe fn value(&self, s: __m512i, j: usize) -> __m512 {
        let j = j & 1;
        // SAFETY: AVX-512 F (caller).
        unsafe { _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), self.mult[j], self.start[j]) }
    }

    /// Values `v` clamped and rounded: the row stage's clamp to +-2^22, rounding, and clamp
    /// to `[lo, hi]` in fewer steps. Clamping to the integer bounds first gives the same
    /// integers (and a NaN still becomes `lo`: `vmaxps` returns its second operand).
    ///
    /// # Safety
    /// AVX-512 F is available.
    #[inline(always)]
    unsafe fn finish(&self, v: __m512) -> __m512i {
        // SAFETY: AVX-512 F (caller).
        unsafe { _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, self.lo), self.hi)) }
    }
}

/// `quant::requantize_row`'s steps in f64 (every i32 is exact), eight lanes a vector:
/// clamped to `[lo, hi]` before rounding, which gives the same integer as rounding first
/// since both bounds are integers (and a NaN becomes `lo`, as there: `vmaxpd` returns its
/// second operand); rounded half to even by `vcvtpd2dq`.
#[derive(Clone, Copy)]
struct F64Stage {
    bias: [__m512d; 4],
    mult: [__m512d; 4],
    zero_point: __m512d,
    lo: __m512d,
    hi: __m512d,
}

impl Epilogue for F64Stage {
    #[inline(always)]
    unsafe fn load(params: Params, lo: i32, hi: i32, m0: __mmask16, m1: __mmask16) -> Option<Self> {
        let Params::F64 {
            bias, mult, zero_point, ..
        } = params
        else {
            return None;
        };
        // An f64 vector's mask is its half of the 16-lane mask.
        let masks = [m0 as u8, (m0 >> 8) as u8, m1 as u8, (m1 >> 8) as u8];
        // SAFETY: the masked loads read the columns the caller vouches for.
        unsafe {
            let load = |p: *const f64| [0, 1, 2, 3].map(|i| _mm512_maskz_loadu_pd(masks[i], p.wrapping_add(8 * i)));
            Some(F64Stage {
                bias: load(bias),
                mult: load(mult),
                zero_point: _mm512_set1_pd(zero_point),
                lo: _mm512_set1_pd(f64::from(lo)),
                hi: _mm512_set1_pd(f64::from(hi)),
            })
        }
    }

    #[inline(always)]
    unsafe fn requant(&self, s: __m512i, j: usize) -> __m512i {
        let j = j & 1;
        let q = 2 * j;
        // SAFETY: AVX-512 F (caller).
        unsafe {
            requant_f64(
                s,
                [self.bias[q], self.bias[q + 1]],
                [self.mult[q], self.mult[q + 1]],
                (self.zero_point, self.lo, self.hi),
            )
        }
    }
}

/// Sixteen sums `s` requantized in f64 (see [`F64Stage`]) with the bias and mult of their
/// low and high eight lanes, and the zero point and bounds.
///
/// # Safety
/// AVX-512 F is available.
#[inline(always)]
unsafe fn requant_f64(
    s: __m512i,
    bias: [__m512d; 2],
    mult: [__m512d; 2],
    (zero_point, lo, hi): (__m512d, __m512d, __m512d),
) -> __m512i {
    // SAFETY: AVX-512 F (caller).
    unsafe {
        let half = |v: __m256i, q: usize| {
            let v = _mm512_add_pd(_mm512_cvtepi32_pd(v), bias[q & 1]);
            let v = _mm512_add_pd(_mm512_mul_pd(v, mult[q & 1]), zero_point);
            _mm512_cvtpd_epi32(_mm512_min_pd(_mm512_max_pd(v, lo), hi))
        };
        let low = half(_mm512_castsi512_si256(s), 0);
        let high = half(_mm512_extracti64x4_epi64::<1>(s), 1);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high)
    }
}

/// [`F64Stage`]'s bits at about [`F32Stage`]'s cost: the values in f32 from the twin's
/// parameters ([`super::F32Twin`]); a vector with a value within the margin of a
/// half-integer is redone in f64 from the parameters in memory. Holds as few registers as the f32 stage, so the tile's
/// accumulators stay in registers.
#[derive(Clone, Copy)]
struct CheckedStage {
    fast: F32Stage,
    /// 0.5 minus the twin's margin.
    edge: f32,
    bias: *const f64,
    mult: *const f64,
    zero_point: f64,
    masks: [__mmask16; 2],
    bounds: (f64, f64),
}

impl Epilogue for CheckedStage {
    #[inline(always)]
    unsafe fn load(params: Params, lo: i32, hi: i32, m0: __mmask16, m1: __mmask16) -> Option<Self> {
        let Params::F64 {
            bias,
            mult,
            zero_point,
            twin: Some((bias32, mult32, margin)),
        } = params
        else {
            return None;
        };
        let twin = Params::F32 {
            bias: bias32,
            mult: mult32,
            zero_point: zero_point as f32,
        };
        // SAFETY: the twin's columns are the stage's (the caller's contract).
        let fast = unsafe { F32Stage::load(twin, lo, hi, m0, m1) }?;
        Some(CheckedStage {
            fast,
            edge: 0.5 - margin,
            bias,
            mult,
            zero_point,
            masks: [m0, m1],
            bounds: (f64::from(lo), f64::from(hi)),
        })
    }

    #[inline(always)]
    unsafe fn requant(&self, s: __m512i, j: usize) -> __m512i {
        // SAFETY: AVX-512 F (caller); the f64 path reads this half's columns (`load`).
        unsafe {
            let (_, rounded, near) = self.twin(s, j);
            if near == 0 {
                return _mm512_cvtps_epi32(rounded);
            }
            self.exact(s, j)
        }
    }

    /// The twin's codes offset by 1.5 * 2^23, whose low bytes are the output bytes (see
    /// [`F32Stage::low_bytes`]), or the f64 path's codes near a half.
    #[inline(always)]
    unsafe fn low_bytes(&self, s: __m512i, j: usize) -> __m512i {
        // SAFETY: AVX-512 F (caller); the f64 path reads this half's columns (`load`).
        unsafe {
            let (offset, _, near) = self.twin(s, j);
            if near == 0 {
                return _mm512_castps_si512(offset);
            }
            self.exact(s, j)
        }
    }

    /// The codes as f32 straight from the twin's rounding, without the conversions to i32
    /// and back that [`Epilogue::requant`]'s codes would take on their way into the sum (a
    /// QLinearConv whose QLinearAdd is fused: ResNet's residual layers).
    #[inline(always)]
    unsafe fn summed(&self, s: __m512i, j: usize, sum: &SumStage, r: *const u8, mask: __mmask16) -> __m512i {
        // SAFETY: the caller's features and bytes; the f64 path reads this half's columns.
        unsafe {
            let (_, rounded, near) = self.twin(s, j);
            let x = if near == 0 {
                rounded
            } else {
                _mm512_cvtepi32_ps(self.exact(s, j))
            };
            sum.add(x, r, mask)
        }
    }
}

impl CheckedStage {
    /// Half `j`'s f32 values from the twin's parameters, clamped to the output's bounds and
    /// rounded half to even by the add of 1.5 * 2^23: that sum (whose low byte is the code),
    /// the rounded value, and the lanes within the twin's margin of a half-integer (those the
    /// f32 rounding may get wrong, redone in f64). Clamping first gives the f64 path's
    /// integers: the bounds are whole, and where the twin and the f64 value fall on two sides
    /// of a bound, both are within the margin of it and round to it. All adds, subtractions
    /// and comparisons, which either vector port takes (`vrndscaleps` is two operations on
    /// one port of an Intel core).
    ///
    /// # Safety
    /// AVX-512 F is available.
    #[inline(always)]
    unsafe fn twin(&self, s: __m512i, j: usize) -> (__m512, __m512, __mmask16) {
        // SAFETY: AVX-512 F (caller).
        unsafe {
            let f = self.fast;
            let v = _mm512_min_ps(_mm512_max_ps(f.value(s, j & 1), f.lo), f.hi);
            let round = _mm512_set1_ps(crate::quant::ROUND);
            let offset = _mm512_add_ps(v, round);
            let r = _mm512_sub_ps(offset, round);
            let d = _mm512_abs_ps(_mm512_sub_ps(v, r));
            (
                offset,
                r,
                _mm512_cmp_ps_mask::<_CMP_GT_OQ>(d, _mm512_set1_ps(self.edge)),
            )
        }
    }

    /// Half `j`'s codes in f64 from the parameters in memory ([`F64Stage`]'s arithmetic).
    ///
    /// # Safety
    /// AVX-512 F is available; the stage's f64 bias and mult hold the masks' columns of
    /// this half (`load`'s contract).
    #[inline(always)]
    unsafe fn exact(&self, s: __m512i, j: usize) -> __m512i {
        let j = j & 1;
        // SAFETY: the caller's features and columns.
        unsafe {
            let m = self.masks[j];
            let load =
                |p: *const f64, q: usize| _mm512_maskz_loadu_pd((m >> (8 * q)) as u8, p.wrapping_add(16 * j + 8 * q));
            requant_f64(
                s,
                [load(self.bias, 0), load(self.bias, 1)],
                [load(self.mult, 0), load(self.mult, 1)],
                (
                    _mm512_set1_pd(self.zero_point),
                    _mm512_set1_pd(self.bounds.0),
                    _mm512_set1_pd(self.bounds.1),
                ),
            )
        }
    }
}

/// # Safety
/// AVX-512 F, BW, VL and VNNI are available; `a` is `(table, taps, (row, quad), quads_per_tap)`:
/// for `t < taps`, `r < MR_QUADS`, `q < quads_per_tap`, the four bytes at `table[t][r] + q *
/// quad` (`STRIDED`: `table[t][0] + r * row + q * quad`) are readable; B is
/// `(b, panels, pstride)`: panel `p < panels` holds `taps * quads_per_tap * 4 * NR_QUADS` i8
/// at `b + p * pstride`, and `cols <= panels * NR_QUADS` columns; C (`c`, `ldc` apart) holds
/// `(rows - 1) * ldc + cols` i32; `init`, if any, `cols`; with `REQ`, `stage` is `Some`, its Y
/// (`ldy` apart) holds `(rows - 1) * ldy + cols` bytes and its bias and mult `cols` values
/// each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn micro_vnni<const FLIP: bool, const REQ: bool, const STRIDED: bool, E: Epilogue>(
    a: (*const [*const u8; MR_QUADS], usize, (usize, usize), usize),
    (b, panels, pstride): (*const i8, usize, usize),
    (c, ldc, rows, cols): (*mut i32, usize, usize, usize),
    init: Option<*const i32>,
    stage: Option<Stage>,
) {
    for p in 0..panels {
        let cols = cols.saturating_sub(p * NR_QUADS).min(NR_QUADS);
        if cols == 0 {
            break;
        }
        // Panel `p`: its B `p * pstride` on, its columns `p * NR_QUADS` on in C, `init`, Y,
        // bias and mult (addresses formed with `wrapping_add`, read within the contract).
        let b = b.wrapping_add(p * pstride);
        let c = c.wrapping_add(p * NR_QUADS);
        let init = init.map(|i| i.wrapping_add(p * NR_QUADS));
        let stage = stage.map(|s| Stage {
            y: s.y.wrapping_add(p * NR_QUADS),
            params: s.params.at_column(p * NR_QUADS),
            sum: s.sum.map(|sum| SumStage {
                r: sum.r.wrapping_add(p * NR_QUADS),
                ..sum
            }),
            ..s
        });
        // SAFETY: the caller's contract for this panel. A panel of at most 16 columns (a
        // narrow output's only one, or the last) multiplies only the first vector of B's
        // step: the second's products would all be masked off.
        unsafe {
            match (cols > 16, rows == 1) {
                (true, false) => {
                    panel_vnni::<FLIP, REQ, STRIDED, true, false, E>(a, b, (c, ldc, rows, cols), init, stage)
                }
                (false, false) => {
                    panel_vnni::<FLIP, REQ, STRIDED, false, false, E>(a, b, (c, ldc, rows, cols), init, stage)
                }
                (true, true) => {
                    panel_vnni::<FLIP, REQ, STRIDED, true, true, E>(a, b, (c, ldc, rows, cols), init, stage)
                }
                (false, true) => {
                    panel_vnni::<FLIP, REQ, STRIDED, false, true, E>(a, b, (c, ldc, rows, cols), init, stage)
                }
            }
        };
    }
}

/// One panel of [`micro_vnni`].
///
/// # Safety
/// As for [`micro_vnni`], for one panel: `b` its steps, `cols <= NR_QUADS` (`cols <= 16`
/// unless `WIDE`) and C, `init` and the stage from its first column.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn panel_vnni<
    const FLIP: bool,
    const REQ: bool,
    const STRIDED: bool,
    const WIDE: bool,
    const ONE: bool,
    E: Epilogue,
>(
    (table, taps, (row_step, quad_step), quads): (*const [*const u8; MR_QUADS], usize, (usize, usize), usize),
    b: *const i8,
    (c, ldc, rows, cols): (*mut i32, usize, usize, usize),
    init: Option<*const i32>,
    stage: Option<Stage>,
) {
    let m0: __mmask16 = if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 };
    let m1: __mmask16 = match cols.saturating_sub(16) {
        0 => 0,
        n if n >= 16 => 0xFFFF,
        n => (1u16 << n) - 1,
    };
    // The sums start from `init` (the same for every row): the stores then add nothing, where
    // adding it there cost every row two loads and two adds, as much as a quarter of the
    // tile's vector work past the products at a depth of 64 (ResNet's 1x1 layers). Integer
    // sums: the same bits in either order.
    let start = match init {
        // SAFETY: `init` holds `cols` values (caller), the masks' lanes.
        Some(i) => unsafe {
            [
                _mm512_maskz_loadu_epi32(m0, i),
                _mm512_maskz_loadu_epi32(m1, i.wrapping_add(16)),
            ]
        },
        None => [_mm512_setzero_si512(); 2],
    };
    let mut acc = [start; MR_QUADS];
    let flip = _mm512_set1_epi32(0x8080_8080_u32 as i32);
    let mut bq = b;
    for t in 0..taps {
        // SAFETY: `t < taps` entries of the table (caller).
        let rows = unsafe { *table.add(t) };
        for q in 0..quads {
            // SAFETY: each step of B is `4 * NR_QUADS` bytes (two 512-bit vectors); `bq`
            // advances one step per quad of every tap, within the caller's bound.
            let (b0, b1) = unsafe {
                let p = bq;
                bq = bq.add(4 * NR_QUADS);
                let b1 = if WIDE {
                    _mm512_loadu_si512(p.add(64).cast())
                } else {
                    _mm512_setzero_si512()
                };
                (_mm512_loadu_si512(p.cast()), b1)
            };
            for (r, (row, &base)) in acc.iter_mut().zip(rows.iter()).enumerate() {
                // One row (a decoder's token): its products only, the other seven rows'
                // would only be dropped (eight times the multiplies on a stream of B).
                if ONE && r > 0 {
                    break;
                }
                // SAFETY: row `r`'s quad `q` of tap `t` is four readable bytes at
                // `base + q * quad` (`STRIDED`: `rows[0] + r * row + q * quad`), caller's
                // contract; an unaligned read.
                let w = unsafe {
                    let at = if STRIDED {
                        rows[0].add(r * row_step + q * quad_step)
                    } else {
                        base.add(q * quad_step)
                    };
                    at.cast::<i32>().read_unaligned()
                };
                let mut av = _mm512_set1_epi32(w);
                if FLIP {
                    av = _mm512_xor_si512(av, flip);
                }
                row[0] = _mm512_dpbusd_epi32(row[0], av, b0);
                if WIDE {
                    row[1] = _mm512_dpbusd_epi32(row[1], av, b1);
                }
            }
        }
    }
    // SAFETY: AVX-512 F and BW (this function's features); bias and mult hold `cols` values
    // (caller), the masks limit the loads to them.
    let stage = if REQ
        && let Some(st) = stage
        && let Some(e) = unsafe { E::load(st.params, st.lo, st.hi, m0, m1) }
    {
        Some((st, e))
    } else {
        None
    };
    // Each row stored by a call with a constant index: a loop over the run-time row count
    // that the compiler does not unroll (a long stage) would index the accumulators, keeping
    // them in memory through the whole product. A function that always inlines, not a
    // closure: the compiler kept a closure with a long stage out of line, the tile's rows
    // then passing through memory.
    let tile = RowStore {
        c,
        ldc,
        rows,
        add_c: init.is_none(),
        masks: (m0, m1),
        stage,
    };
    // SAFETY: the contract `RowStore::store` states is this function's.
    let store = |r: usize, row: [__m512i; 2]| unsafe { tile.store(r, row) };
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    store(0, a0);
    store(1, a1);
    store(2, a2);
    store(3, a3);
    store(4, a4);
    store(5, a5);
    store(6, a6);
    store(7, a7);
}

/// Where [`panel_vnni`] stores its rows: C (`ldc` apart, `rows` rows, C itself added when
/// `add_c`), or with a stage, the requantized bytes of Y; the masks select the panel's columns.
struct RowStore<E> {
    c: *mut i32,
    ldc: usize,
    rows: usize,
    /// The sums are added to C's row (a later depth block; requantizing C); else they are
    /// whole (they started from `init`, or from zero).
    add_c: bool,
    masks: (__mmask16, __mmask16),
    stage: Option<(Stage, E)>,
}

impl<E: Epilogue> RowStore<E> {
    /// Stores row `r` (nothing for `r >= rows`).
    ///
    /// # Safety
    /// AVX-512 F, BW and VL are available; [`panel_vnni`]'s contract for its C, `init` and
    /// stage.
    #[inline(always)]
    unsafe fn store(&self, r: usize, row: [__m512i; 2]) {
        // SAFETY: this function's contract.
        unsafe { self.store_with::<false>(r, row) }
    }

    /// [`RowStore::store`], its codes narrowed to bytes by one byte permute when `VBMI` (only
    /// where the caller enables AVX-512 VBMI).
    ///
    /// # Safety
    /// As [`RowStore::store`].
    #[inline(always)]
    unsafe fn store_with<const VBMI: bool>(&self, r: usize, row: [__m512i; 2]) {
        let RowStore {
            c,
            ldc,
            rows,
            add_c,
            masks: (m0, m1),
            ref stage,
        } = *self;
        if r >= rows {
            return;
        }
        // SAFETY: row `r < rows` of the tile starts at `r * ldc`; the masks limit both halves
        // to the first `cols` columns, all within `need` (checked by the caller). The second
        // half's address is formed with `wrapping_add`: it may lie past C when its mask is
        // empty, and is then never touched. With a stage, C is only read, and Y's row `r`
        // starts at `r * ldy`, its stores masked the same way to `cols` bytes within the
        // caller's bound, and R's row read the same way (R has Y's layout and length,
        // `Stage::of`).
        unsafe {
            let p = c.add(r * ldc);
            let (s0, s1) = if add_c {
                (
                    _mm512_add_epi32(_mm512_maskz_loadu_epi32(m0, p), row[0]),
                    _mm512_add_epi32(_mm512_maskz_loadu_epi32(m1, p.wrapping_add(16)), row[1]),
                )
            } else {
                (row[0], row[1])
            };
            match &stage {
                Some((st, e)) => {
                    // Both halves narrowed in registers and stored as one masked 32-byte
                    // write (the memory forms of `vpmovdb` are slow on Zen 4).
                    let y = st.y.add(r * st.ldy);
                    // With a residual sum, R's row `r` (Y's layout) read under the same masks.
                    let low = codes(st, e, (r, 0), s0, m0);
                    // A narrow panel's second half is all masked off: not requantized.
                    let high = if m1 == 0 {
                        _mm512_setzero_si512()
                    } else {
                        codes(st, e, (r, 1), s1, m1)
                    };
                    // Each lane's code is within the output's range: its low byte is the
                    // output byte.
                    let both = if VBMI {
                        // One byte permute picks the 32 low bytes of both halves.
                        _mm512_castsi512_si256(_mm512_permutex2var_epi8(
                            low,
                            _mm512_loadu_si512(LOW_BYTES.0.as_ptr().cast()),
                            high,
                        ))
                    } else {
                        _mm256_inserti128_si256::<1>(
                            _mm256_castsi128_si256(_mm512_cvtepi32_epi8(low)),
                            _mm512_cvtepi32_epi8(high),
                        )
                    };
                    _mm256_mask_storeu_epi8(y.cast(), u32::from(m0) | (u32::from(m1) << 16), both);
                }
                None => {
                    _mm512_mask_storeu_epi32(p, m0, s0);
                    _mm512_mask_storeu_epi32(p.wrapping_add(16), m1, s1);
                }
            }
        }
    }
}
