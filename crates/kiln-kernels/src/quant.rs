//! Rows between f32 and 8-bit integers, as ONNX `QuantizeLinear` / `DequantizeLinear` define
//! them for one f32 scale and zero point: plain loops compiled per level
//! ([`crate::simd::vectorize`]). The property tests (`tests/quant_props.rs`) hold them against
//! the spec's formula computed with `round_ties_even`.

/// An 8-bit quantized type.
pub trait Q8: Copy + Send + Sync + 'static {
    const LO: f32;
    const HI: f32;
    /// `v`, already clamped to `[LO, HI]` and integral (NaN becomes 0, as `as` does).
    fn from_clamped(v: f32) -> Self;
    /// The value whose two's-complement low byte is `bits`' low byte.
    fn from_low_byte(bits: u32) -> Self;
    fn to_f32(self) -> f32;
}

impl Q8 for u8 {
    const LO: f32 = 0.0;
    const HI: f32 = 255.0;
    #[inline(always)]
    fn from_clamped(v: f32) -> u8 {
        v as u8
    }
    #[inline(always)]
    fn from_low_byte(bits: u32) -> u8 {
        bits as u8
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
}

impl Q8 for i8 {
    const LO: f32 = -128.0;
    const HI: f32 = 127.0;
    #[inline(always)]
    fn from_clamped(v: f32) -> i8 {
        v as i8
    }
    #[inline(always)]
    fn from_low_byte(bits: u32) -> i8 {
        bits as u8 as i8
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
}

/// Past this magnitude every quotient saturates any 8-bit type, so clamping to it first
/// changes no result and keeps the rounding trick below exact.
const BIG: f32 = 4_194_304.0; // 2^22
/// Adding then subtracting 1.5 * 2^23 rounds an f32 of magnitude at most 2^22 to an integer,
/// ties to even (the default rounding mode), in two vectorisable operations.
pub(crate) const ROUND: f32 = 12_582_912.0;

/// `v` clamped to `[lo, hi]`, a NaN to `lo`, as two comparisons: one `vmaxps` / `vminps` each
/// in a vectorised loop, where `f32::max` and `min` take three instructions each (their NaN
/// rule: a compare and a blend besides).
#[inline(always)]
pub(crate) fn clamp_to<F: PartialOrd + Copy>(v: F, lo: F, hi: F) -> F {
    let v = if v > lo { v } else { lo };
    if v < hi { v } else { hi }
}

/// `y[i] = saturate(round_half_even(x[i] / scale) + zero_point)` over `min(len)` elements;
/// NaN gives 0.
pub fn quantize_row<T: Q8>(x: &[f32], y: &mut [T], scale: f32, zero_point: f32) {
    crate::simd::vectorize(|| {
        for (o, &v) in y.iter_mut().zip(x) {
            let t = (v / scale).clamp(-BIG, BIG);
            let r = (t + ROUND) - ROUND;
            let q = (r + zero_point).clamp(T::LO, T::HI);
            // NaN quantizes to 0 (as `as` casts it).
            let q = if q.is_nan() { 0.0 } else { q };
            // q is an integer in [-128, 255]: q + 1.5 * 2^23 holds it exactly in its low
            // mantissa bits, two's complement.
            *o = T::from_low_byte((q + ROUND).to_bits());
        }
    })
}

/// `x[i] = (saturate(round_half_even(x[i] / scale) + zero_point) - zero_point) * scale` in
/// place: a `QuantizeLinear` to the 8-bit type whose range is `[lo, hi]` and the
/// `DequantizeLinear` back, in one pass, with the same bits as [`quantize_row`] then
/// [`dequantize_row`] (the quantized value is an exact integer in f32 either way).
pub fn fake_quantize_row(x: &mut [f32], scale: f32, zero_point: f32, (lo, hi): (f32, f32)) {
    // The parameters by value in the closure: read through references, the compiler gathers
    // them per lane.
    crate::simd::vectorize(move || {
        for v in x.iter_mut() {
            let t = (*v / scale).clamp(-BIG, BIG);
            let r = (t + ROUND) - ROUND;
            let q = r + zero_point;
            // NaN quantizes to 0 (as in `quantize_row`); `max`/`min` alone would give `lo`.
            let c = q.max(lo).min(hi);
            let c = if q.is_nan() { 0.0 } else { c };
            *v = (c - zero_point) * scale;
        }
    })
}

/// `y[j] = clamp(round_half_even((acc[j] + bias[j]) * mult[j] + zero_point), lo, hi)` over
/// `min(len)` elements, in f64 (the arithmetic of ONNX's QLinearConv reference: the int32 sums
/// are exact, the multiplier `mult = sx * sw / sy`), `[lo, hi]` within `T`'s range. For the
/// integer convolutions, one output row of channels at a time.
pub fn requantize_row<A: Sum, T: Q8>(
    acc: &[A],
    bias: &[f64],
    mult: &[f64],
    zero_point: f64,
    range: (f64, f64),
    y: &mut [T],
) {
    // One pixel of all the channels every slice has.
    let c = acc.len().min(bias.len()).min(mult.len()).min(y.len());
    let (bias, mult) = (bias.get(..c).unwrap_or(&[]), mult.get(..c).unwrap_or(&[]));
    requantize_pixels(acc.get(..c).unwrap_or(&[]), bias, mult, zero_point, range, y);
}

/// The f32 stage's start for a column: `bias * mult + zero_point` fused, the zero point
/// alone for a zero bias (so a non-finite multiplier, a zero output scale's, leaves a zero
/// sum NaN and others infinite, as the unfused `(sum + bias) * mult` does).
#[inline(always)]
pub(crate) fn stage_start(bias: f32, mult: f32, zero_point: f32) -> f32 {
    if bias == 0.0 {
        zero_point
    } else {
        bias.mul_add(mult, zero_point)
    }
}

/// [`stage_start`] for 16 columns at once (the same bits): the AVX-512 output stages' start.
///
/// # Safety
/// AVX-512 F is available.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn stage_start_x16(
    bias: std::arch::x86_64::__m512,
    mult: std::arch::x86_64::__m512,
    zero_point: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::{_CMP_NEQ_UQ, _mm512_cmp_ps_mask, _mm512_mask3_fmadd_ps, _mm512_setzero_ps};
    // SAFETY: AVX-512 F (caller). Lanes whose bias is zero keep the zero point.
    unsafe {
        let live = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(bias, _mm512_setzero_ps());
        _mm512_mask3_fmadd_ps(bias, mult, zero_point, live)
    }
}

/// [`requantize_row`] in f32, as a QDQ graph's float convolution and QuantizeLinear compute
/// it: `y[j] = clamp(round_half_even(f32(acc[j]) * mult[j] + (bias[j] * mult[j] +
/// zero_point)), lo, hi)` (the start as [`stage_start`] makes it), the products and sums
/// fused (`f32::mul_add`; `f32(acc)` is exact below 2^24 in magnitude), sixteen lanes a
/// vector instead of eight. Every fused
/// kernel (the integer GEMM's output stages, the 8-bit depthwise bands) computes these same
/// fused steps, so all give the same bytes.
pub fn requantize_row_f32<A: Sum, T: Q8>(
    acc: &[A],
    bias: &[f32],
    mult: &[f32],
    zero_point: f32,
    range: (f32, f32),
    y: &mut [T],
) {
    let c = acc.len().min(bias.len()).min(mult.len()).min(y.len());
    let (bias, mult) = (bias.get(..c).unwrap_or(&[]), mult.get(..c).unwrap_or(&[]));
    requantize_pixels_f32(acc.get(..c).unwrap_or(&[]), bias, mult, zero_point, range, y);
}

/// [`requantize_row_f32`] over a run of pixels: `acc` and `y` hold whole pixels of `c =
/// bias.len()` channels each (as many as both hold), every pixel requantized with the same
/// per-channel `bias` and `mult`, in one call (a per-pixel call costs more than its work at
/// a few dozen channels).
pub fn requantize_pixels_f32<A: Sum, T: Q8>(
    acc: &[A],
    bias: &[f32],
    mult: &[f32],
    zero_point: f32,
    (lo, hi): (f32, f32),
    y: &mut [T],
) {
    // Whole bounds (every caller's are): clamping before rounding then gives the integer
    // rounding before clamping gives.
    let (lo, hi) = (lo.max(T::LO).ceil(), hi.min(T::HI).floor());
    let c = bias.len().min(mult.len());
    if c == 0 {
        return;
    }
    let stage = StageF32::new((bias, mult, zero_point), (lo, hi));
    crate::simd::vectorize_kernel(PixelsF32 { acc, stage, y, c })
}

/// The f32 stage's per-column parameters and bounds (whole numbers).
#[derive(Clone, Copy)]
struct StageF32<'a> {
    bias: &'a [f32],
    mult: &'a [f32],
    zero_point: f32,
    lo: f32,
    hi: f32,
}

impl<'a> StageF32<'a> {
    fn new((bias, mult, zero_point): (&'a [f32], &'a [f32], f32), (lo, hi): (f32, f32)) -> StageF32<'a> {
        StageF32 {
            bias,
            mult,
            zero_point,
            lo,
            hi,
        }
    }

    /// Sum `a` of a column with bias `b` and multiplier `m` as an output code, clamped and
    /// unrounded: `a * m + stage_start(b, m, zero_point)` fused.
    #[inline(always)]
    fn value(&self, a: f32, b: f32, m: f32) -> f32 {
        self.from_start(a, stage_start(b, m, self.zero_point), m)
    }

    /// [`StageF32::value`] with the column's start already made ([`stage_start`]).
    #[inline(always)]
    fn from_start(&self, a: f32, start: f32, m: f32) -> f32 {
        clamp_to(a.mul_add(m, start), self.lo, self.hi)
    }
}

/// Columns whose starts [`PixelsF32`] makes at a time (on the stack).
const START_BLOCK: usize = 256;

/// [`requantize_pixels_f32`]'s loop as a struct kernel.
struct PixelsF32<'a, A, T> {
    acc: &'a [A],
    stage: StageF32<'a>,
    y: &'a mut [T],
    c: usize,
}

impl<A: Sum, T: Q8> crate::simd::Kernel for PixelsF32<'_, A, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let PixelsF32 { acc, stage, y, c } = self;
        // The columns' starts made once per block of columns, not once per pixel (a few
        // dozen channels a pixel: the start's test and blend were a third of the loop).
        let mut starts = [0f32; START_BLOCK];
        for c0 in (0..c).step_by(START_BLOCK) {
            let c1 = (c0 + START_BLOCK).min(c);
            let (Some(bias), Some(mult)) = (stage.bias.get(c0..c1), stage.mult.get(c0..c1)) else {
                return;
            };
            for ((s, &b), &m) in starts.iter_mut().zip(bias).zip(mult) {
                *s = stage_start(b, m, stage.zero_point);
            }
            for (yp, ap) in y.chunks_exact_mut(c).zip(acc.chunks_exact(c)) {
                let (Some(yp), Some(ap)) = (yp.get_mut(c0..c1), ap.get(c0..c1)) else {
                    return;
                };
                for (((o, &a), &s), &m) in yp.iter_mut().zip(ap).zip(&starts).zip(mult) {
                    // Clamped to the integer bounds, then rounded as the low bits are read:
                    // the integer rounding first and clamping after give.
                    let q = stage.from_start(a.to_f32(), s, m);
                    *o = T::from_low_byte((q + ROUND).to_bits());
                }
            }
        }
    }
}

/// [`requantize_row`] over a run of pixels of `c = bias.len()` channels, as
/// [`requantize_pixels_f32`] is to [`requantize_row_f32`]: one call, the same bits.
pub fn requantize_pixels<A: Sum, T: Q8>(
    acc: &[A],
    bias: &[f64],
    mult: &[f64],
    zero_point: f64,
    (lo, hi): (f64, f64),
    y: &mut [T],
) {
    let c = bias.len().min(mult.len());
    if c == 0 {
        return;
    }
    let (lo, hi) = (lo.max(f64::from(T::LO)).ceil(), hi.min(f64::from(T::HI)).floor());
    crate::simd::vectorize_kernel(PixelsF64 {
        acc,
        bias,
        mult,
        zero_point,
        lo,
        hi,
        y,
        c,
    })
}

/// [`requantize_pixels`]' loop as a struct kernel.
struct PixelsF64<'a, A, T> {
    acc: &'a [A],
    bias: &'a [f64],
    mult: &'a [f64],
    zero_point: f64,
    lo: f64,
    hi: f64,
    y: &'a mut [T],
    c: usize,
}

impl<A: Sum, T: Q8> crate::simd::Kernel for PixelsF64<'_, A, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        /// Adding 1.5 * 2^52 rounds a value of magnitude below 2^51 to an integer, ties to even.
        const ROUND: f64 = 6_755_399_441_055_744.0;
        let PixelsF64 {
            acc,
            bias,
            mult,
            zero_point,
            lo,
            hi,
            y,
            c,
        } = self;
        for (yp, ap) in y.chunks_exact_mut(c).zip(acc.chunks_exact(c)) {
            for (((o, &a), &b), &m) in yp.iter_mut().zip(ap).zip(bias).zip(mult) {
                // q lies in [-128, 255] (integer bounds): q + 1.5 * 2^52 rounds it half to
                // even and holds the integer in its low mantissa bits, two's complement.
                let q = clamp_to((a.to_f64() + b) * m + zero_point, lo, hi);
                *o = T::from_low_byte((q + ROUND).to_bits() as u32);
            }
        }
    }
}

/// An exact integer sum as [`requantize_row`] and [`requantize_row_f32`] read it: i32, or an f32 holding an integer
/// (the f32 depthwise kernel's sums of 8-bit products).
pub trait Sum: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Exact: every i32 and f32 is an f64.
    fn to_f64(self) -> f64;
}

impl Sum for i32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Sum for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

/// One 8-bit operand of [`add_dequantized_row`]: values, scale and zero point.
#[derive(Clone, Copy)]
pub struct Operand<'a, T> {
    pub values: &'a [T],
    pub scale: f32,
    pub zero_point: f32,
}

/// `y[i] = quantize(dequantize(a[i]) + dequantize(b[i]))` over `min(len)` elements: ONNX's
/// `QuantizeLinear(DequantizeLinear(a) + DequantizeLinear(b))` as one affine map of the two
/// codes ([`SumMap`]: `a * ra + (b * rb + shift)`, the scale ratios `ra = sa / scale`,
/// `rb = sb / scale` and the operands' zero points folded into `shift`), rounded half to even,
/// plus the output's zero point, saturated. ONNX Runtime's `QLinearAdd` computes such a map;
/// against the three ops run apart (a division per element, which costs 16 cycles a vector
/// on AVX-512) a code may differ by one where the sum lies within an f32 rounding of a tie.
pub fn add_dequantized_row<A: Q8, B: Q8, T: Q8>(
    a: Operand<'_, A>,
    b: Operand<'_, B>,
    y: &mut [T],
    scale: f32,
    zero_point: f32,
) {
    let map = SumMap::of((a.scale, a.zero_point), (b.scale, b.zero_point), (scale, zero_point));
    crate::simd::vectorize_kernel(AddDequantized {
        a: a.values,
        b: b.values,
        y,
        map,
        lo: T::LO,
    })
}

/// The sum of two dequantized codes as a code of the output: `round(x * ra + (z * rb +
/// shift)) + zero_point` (two products and two sums in that order on every ISA: no fused
/// multiply-add, so the portable path gives the same bits; the zero point added after the
/// rounding, as QuantizeLinear adds it, so exact ties round to even as there).
#[derive(Clone, Copy, Debug)]
pub struct SumMap {
    pub ra: f32,
    pub rb: f32,
    pub shift: f32,
    pub zero_point: f32,
}

impl SumMap {
    /// The map for operands of scales and zero points `(sa, za)` and `(sb, zb)` summed into
    /// an output of `(scale, zero_point)`.
    pub fn of((sa, za): (f32, f32), (sb, zb): (f32, f32), (scale, zero_point): (f32, f32)) -> SumMap {
        let (ra, rb) = (sa / scale, sb / scale);
        SumMap {
            ra,
            rb,
            shift: -(za * ra) - zb * rb,
            zero_point,
        }
    }

    /// Whether every sum of two 8-bit codes lies well within the rounding trick's range (the
    /// map finite, `255 * (|ra| + |rb|) + |shift|` below 2^21): [`SumMap::code_bounded`] then
    /// gives [`SumMap::code`]'s bits without its clamp and NaN test.
    pub fn bounded(&self) -> bool {
        let span = 255.0 * (self.ra.abs() + self.rb.abs()) + self.shift.abs();
        span.is_finite() && span < BIG / 2.0 && self.zero_point.is_finite()
    }

    /// [`SumMap::code`] for a [`SumMap::bounded`] map: no value to clamp, no NaN (half the
    /// instructions of the residual sums' loop).
    #[inline(always)]
    pub fn code_bounded<T: Q8>(self, x: f32, z: f32, lo: f32) -> T {
        let t = x * self.ra + (z * self.rb + self.shift);
        let r = (t + ROUND) - ROUND;
        let q = clamp_to(r + self.zero_point, lo, T::HI);
        T::from_low_byte((q + ROUND).to_bits())
    }

    /// The code of `x + z` (both codes as f32), at least `lo` and at most `T::HI`; a NaN
    /// (a zero or non-finite scale) gives 0 raised to `lo`.
    #[inline(always)]
    pub fn code<T: Q8>(self, x: f32, z: f32, lo: f32) -> T {
        let t = (x * self.ra + (z * self.rb + self.shift)).clamp(-BIG, BIG);
        let r = (t + ROUND) - ROUND;
        let q = if r.is_nan() {
            lo.max(0.0)
        } else {
            (r + self.zero_point).max(lo).min(T::HI)
        };
        T::from_low_byte((q + ROUND).to_bits())
    }
}

/// A fused convolution's f32 output stage with a residual sum, rounded once: each exact
/// sum `a` of column `j` is scaled to the convolution's output codes unrounded, `v = a *
/// mult[j] + (bias[j] * mult[j] + zero_point)` (two fused multiply-adds), clamped to `[lo,
/// hi]` as that output's quantization clamps it, and summed with R's code `z` by `map`: `t =
/// v * ra + (z * rb + (shift + map.zero_point))` (two more), rounded half to even and clamped
/// to `[floor, T::HI]`. The QDQ graph's `Q -> DQ` between the convolution and the sum rounds
/// `v` first; skipping that rounding halves the stage's instructions and moves a result by
/// at most `1 + ra / 2` codes (within one where the sum's scale is at least the
/// convolution's), toward the float graph's value. Every ISA computes these same fused
/// steps (`f32::mul_add` here), so all give the same bits. The map is
/// [`SumMap::bounded`], `lo` and `hi` whole numbers.
pub fn requantize_summed_row_f32<T: Q8>(
    acc: &[i32],
    (bias, mult, zero_point): (&[f32], &[f32], f32),
    (lo, hi): (f32, f32),
    r: &[T],
    map: SumMap,
    floor: f32,
    y: &mut [T],
) {
    let stage = StageF32::new((bias, mult, zero_point), (lo, hi));
    crate::simd::vectorize_kernel(SummedF32 {
        acc,
        stage,
        r,
        map,
        floor,
        y,
    })
}

/// [`requantize_summed_row_f32`]'s loop as a struct kernel.
struct SummedF32<'a, T> {
    acc: &'a [i32],
    stage: StageF32<'a>,
    r: &'a [T],
    map: SumMap,
    floor: f32,
    y: &'a mut [T],
}

impl<T: Q8> crate::simd::Kernel for SummedF32<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let SummedF32 {
            acc,
            stage,
            r,
            map,
            floor,
            y,
        } = self;
        let start = map.shift + map.zero_point;
        let out = y
            .iter_mut()
            .zip(r)
            .zip(acc.iter().zip(stage.bias.iter().zip(stage.mult)));
        for ((o, &z), (&a, (&b, &m))) in out {
            let v = stage.value(a as f32, b, m);
            let t = v.mul_add(map.ra, z.to_f32().mul_add(map.rb, start));
            let q = clamp_to((t + ROUND) - ROUND, floor, T::HI);
            *o = T::from_low_byte((q + ROUND).to_bits());
        }
    }
}

/// [`add_dequantized_row`]'s loop as a struct kernel (inlined into each level's copy).
struct AddDequantized<'a, A, B, T> {
    a: &'a [A],
    b: &'a [B],
    y: &'a mut [T],
    map: SumMap,
    lo: f32,
}

impl<A: Q8, B: Q8, T: Q8> crate::simd::Kernel for AddDequantized<'_, A, B, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let AddDequantized { a, b, y, map, lo } = self;
        if map.bounded() {
            for ((o, &x), &z) in y.iter_mut().zip(a).zip(b) {
                *o = map.code_bounded(x.to_f32(), z.to_f32(), lo);
            }
        } else {
            for ((o, &x), &z) in y.iter_mut().zip(a).zip(b) {
                *o = map.code(x.to_f32(), z.to_f32(), lo);
            }
        }
    }
}

/// [`add_dequantized_row`] with `y` as its first operand, in place: `y[i] =
/// max(quantize(dequantize(y[i]) + dequantize(b[i])), floor)` (the same map and rounding),
/// `own` being y's scale and zero point before the sum. With `floor` the output's zero point,
/// this is a QDQ residual block's `Q(Relu(DQ(y) + DQ(b)))`; `None` clamps to `T`'s range alone.
pub fn add_dequantized_in_place<B: Q8, T: Q8>(
    y: &mut [T],
    own: (f32, f32),
    b: Operand<'_, B>,
    out: (f32, f32),
    floor: Option<f32>,
) {
    let map = SumMap::of(own, (b.scale, b.zero_point), out);
    let lo = floor.filter(|f| !f.is_nan()).map_or(T::LO, |f| f.clamp(T::LO, T::HI));
    add_by_map_in_place(y, b.values, map, lo);
}

/// [`add_dequantized_in_place`] with its map made and its floor `lo` clamped to `T`'s range.
pub fn add_by_map_in_place<B: Q8, T: Q8>(y: &mut [T], b: &[B], map: SumMap, lo: f32) {
    crate::simd::vectorize_kernel(AddInPlace { y, b, map, lo })
}

/// [`add_dequantized_in_place`]'s loop as a struct kernel.
struct AddInPlace<'a, B, T> {
    y: &'a mut [T],
    b: &'a [B],
    map: SumMap,
    lo: f32,
}

impl<B: Q8, T: Q8> crate::simd::Kernel for AddInPlace<'_, B, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let AddInPlace { y, b, map, lo } = self;
        if map.bounded() {
            for (o, &z) in y.iter_mut().zip(b) {
                *o = map.code_bounded(o.to_f32(), z.to_f32(), lo);
            }
        } else {
            for (o, &z) in y.iter_mut().zip(b) {
                *o = map.code(o.to_f32(), z.to_f32(), lo);
            }
        }
    }
}

/// `y[i] = (x[i] - zero_point) * scale` over `min(len)` elements.
pub fn dequantize_row<T: Q8>(x: &[T], y: &mut [f32], scale: f32, zero_point: T) {
    let z = zero_point.to_f32();
    crate::simd::vectorize(|| {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = (v.to_f32() - z) * scale;
        }
    })
}

/// The smallest and largest elements of `v` (`(+inf, -inf)` for an empty slice), or `None` when
/// it holds a NaN.
pub fn min_max(v: &[f32]) -> Option<(f32, f32)> {
    const W: usize = 16;
    crate::simd::vectorize(|| {
        let mut lo = [f32::INFINITY; W];
        let mut hi = [f32::NEG_INFINITY; W];
        let mut nan = [false; W];
        let mut chunks = v.chunks_exact(W);
        for c in &mut chunks {
            for i in 0..W {
                let x = c.get(i).copied().unwrap_or(0.0);
                lo[i] = if x < lo[i] { x } else { lo[i] };
                hi[i] = if x > hi[i] { x } else { hi[i] };
                nan[i] |= x.is_nan();
            }
        }
        let mut l = lo.iter().copied().fold(f32::INFINITY, f32::min);
        let mut h = hi.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut any_nan = nan.iter().any(|&b| b);
        for &x in chunks.remainder() {
            l = l.min(x);
            h = h.max(x);
            any_nan |= x.is_nan();
        }
        (!any_nan).then_some((l, h))
    })
}
