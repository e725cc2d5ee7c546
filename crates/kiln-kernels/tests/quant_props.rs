//! The quantize / dequantize rows against the ONNX formulas computed directly.

use kiln_kernels::quant::{
    Operand, Q8, SumMap, add_dequantized_in_place, add_dequantized_row, dequantize_row, fake_quantize_row, min_max,
    quantize_row, requantize_pixels, requantize_pixels_f32, requantize_row, requantize_row_f32,
    requantize_summed_row_f32,
};
use proptest::prelude::*;

fn reference<T: Q8>(x: f32, scale: f32, zp: f32) -> T {
    let q = (x / scale).round_ties_even() + zp;
    T::from_clamped(q.clamp(T::LO, T::HI))
}

/// The sum of two codes as the fused adds document it, written out with the standard
/// library's rounding: `x * (sa / sy) + (z * (sb / sy) - za * ra - zb * rb)` half to even,
/// plus `zy`, clamped to `lo..=hi`.
fn ratio_map(
    x: f32,
    z: f32,
    (sa, za): (f32, f32),
    (sb, zb): (f32, f32),
    (sy, zy): (f32, f32),
    (lo, hi): (f32, f32),
) -> f32 {
    let (ra, rb) = (sa / sy, sb / sy);
    let shift = -(za * ra) - zb * rb;
    ((x * ra + (z * rb + shift)).round_ties_even() + zy).clamp(lo, hi)
}

/// Every code equal to the three ops' (DequantizeLinear twice, an f32 Add, QuantizeLinear)
/// except where the exact quotient of the sum by the output scale (`exact(j)`, in f64) lies
/// within 1e-3 of a tie, and there within one.
fn near_the_three_ops<T: Q8 + std::fmt::Debug>(
    got: &[T],
    want: &[T],
    exact: impl Fn(usize) -> f64,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (j, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (g.to_f32() - w.to_f32()).abs();
        if d > 0.0 {
            let t = exact(j);
            prop_assert!(
                d <= 1.0 && (t - t.floor() - 0.5).abs() < 1e-3,
                "element {}: {:?} against {:?} (quotient {})",
                j,
                g,
                w,
                t
            );
        }
    }
    Ok(())
}

fn special() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -300.0f32..300.0,
        1 => prop::sample::select(vec![0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 254.5, 127.5, -128.5, f32::NAN,
            f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 4194305.0, -4194305.0, 0.0, -0.0]),
        1 => any::<f32>(),
    ]
}

proptest! {
    #[test]
    fn quantize_u8_matches_the_formula(x in prop::collection::vec(special(), 0..80), scale in prop::sample::select(vec![1.0f32, 0.5, 0.0173, 3.0, 1e-6, 250.0]), zp in 0u8..=255) {
        let mut y = vec![0u8; x.len()];
        quantize_row(&x, &mut y, scale, f32::from(zp));
        for (i, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
            prop_assert_eq!(yi, reference::<u8>(xi, scale, f32::from(zp)), "element {} ({})", i, xi);
        }
    }

    #[test]
    fn quantize_i8_matches_the_formula(x in prop::collection::vec(special(), 0..80), scale in prop::sample::select(vec![1.0f32, 0.5, 0.0173, 3.0, 1e-6]), zp in -128i8..=127) {
        let mut y = vec![0i8; x.len()];
        quantize_row(&x, &mut y, scale, f32::from(zp));
        for (i, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
            prop_assert_eq!(yi, reference::<i8>(xi, scale, f32::from(zp)), "element {} ({})", i, xi);
        }
    }

    /// The one-pass round trip gives the bits of quantize then dequantize, both types.
    #[test]
    fn fake_quantize_is_quantize_then_dequantize(x in prop::collection::vec(special(), 0..80), scale in prop::sample::select(vec![1.0f32, 0.5, 0.0173, 3.0, 1e-6, 250.0]), zu in 0u8..=255, zi in -128i8..=127) {
        let mut qu = vec![0u8; x.len()];
        let mut want = vec![0f32; x.len()];
        quantize_row(&x, &mut qu, scale, f32::from(zu));
        dequantize_row(&qu, &mut want, scale, zu);
        let mut got = x.clone();
        fake_quantize_row(&mut got, scale, f32::from(zu), (u8::LO, u8::HI));
        prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        let mut qi = vec![0i8; x.len()];
        quantize_row(&x, &mut qi, scale, f32::from(zi));
        dequantize_row(&qi, &mut want, scale, zi);
        let mut got = x.clone();
        fake_quantize_row(&mut got, scale, f32::from(zi), (i8::LO, i8::HI));
        prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }

    /// QLinearConv's requantization of exact sums, per column bias and multiplier, against
    /// the formula in f64 with `round_ties_even`, both output types, with a narrower clamp.
    #[test]
    fn requantize_matches_the_formula(
        acc in prop::collection::vec(prop_oneof![4 => -100_000i32..100_000, 1 => any::<i32>()], 0..70),
        seed in any::<u64>(),
        zy in -128i32..=255,
        clamp in prop::sample::select(vec![(-1e9f64, 1e9f64), (3.0, 200.0), (-5.0, 5.0)]),
    ) {
        let n = acc.len();
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 11) as f64 / (1u64 << 53) as f64 };
        let bias: Vec<f64> = (0..n).map(|_| (next() * 2000.0 - 1000.0).round()).collect();
        // Multipliers as the op makes them (f32 values), some giving exact halves.
        let mult: Vec<f64> = (0..n).map(|j| if j % 5 == 0 { 0.5 } else { f64::from((next() * 0.01) as f32) }).collect();
        fn want(a: i32, b: f64, m: f64, zy: f64, lo: f64, hi: f64) -> f64 {
            ((f64::from(a) + b) * m + zy).round_ties_even().max(lo).min(hi)
        }
        let zyf = f64::from(zy);
        let mut yu = vec![0u8; n];
        requantize_row(&acc, &bias, &mult, zyf, clamp, &mut yu);
        let mut yi = vec![0i8; n];
        requantize_row(&acc, &bias, &mult, zyf - 128.0, clamp, &mut yi);
        for j in 0..n {
            let wu = want(acc[j], bias[j], mult[j], zyf, clamp.0.max(0.0), clamp.1.min(255.0));
            prop_assert_eq!(f64::from(yu[j]), wu, "u8 element {}", j);
            let wi = want(acc[j], bias[j], mult[j], zyf - 128.0, clamp.0.max(-128.0), clamp.1.min(127.0));
            prop_assert_eq!(f64::from(yi[j]), wi, "i8 element {}", j);
        }
    }

    /// A run of pixels requantized in one call gives each pixel's row requantization, f32 and
    /// f64, for channel counts below, at and past a vector.
    #[test]
    fn requantizing_pixels_is_requantizing_each_pixel(
        c in 1usize..40,
        pixels in 0usize..6,
        seed in any::<u64>(),
        zy in -128i32..=127,
    ) {
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 11) as f64 / (1u64 << 53) as f64 };
        let acc: Vec<i32> = (0..c * pixels).map(|_| (next() * 200_000.0 - 100_000.0) as i32).collect();
        let bias: Vec<f32> = (0..c).map(|_| (next() * 2000.0 - 1000.0).round() as f32).collect();
        let mult: Vec<f32> = (0..c).map(|_| (next() * 0.005) as f32).collect();
        let range = (-100.0f32, 120.0f32);
        let mut got = vec![0i8; c * pixels];
        requantize_pixels_f32(&acc, &bias, &mult, zy as f32, range, &mut got);
        let mut want = vec![0i8; c * pixels];
        for (w, a) in want.chunks_exact_mut(c).zip(acc.chunks_exact(c)) {
            requantize_row_f32(a, &bias, &mult, zy as f32, range, w);
        }
        prop_assert_eq!(&got, &want);
        let (b64, m64): (Vec<f64>, Vec<f64>) = (bias.iter().map(|&v| f64::from(v)).collect(), mult.iter().map(|&v| f64::from(v)).collect());
        let mut got = vec![0u8; c * pixels];
        requantize_pixels(&acc, &b64, &m64, f64::from(zy + 128), (0.0, 255.0), &mut got);
        let mut want = vec![0u8; c * pixels];
        for (w, a) in want.chunks_exact_mut(c).zip(acc.chunks_exact(c)) {
            requantize_row(a, &b64, &m64, f64::from(zy + 128), (0.0, 255.0), w);
        }
        prop_assert_eq!(&got, &want);
    }

    /// The f32 requantization against its formula in f32 with `round_ties_even`.
    #[test]
    fn requantize_f32_matches_the_formula(
        acc in prop::collection::vec(-1_000_000i32..1_000_000, 0..70),
        seed in any::<u64>(),
        zy in 0i32..=255,
        clamp in prop::sample::select(vec![(-1e9f32, 1e9f32), (3.0, 200.0)]),
    ) {
        let n = acc.len();
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 40) as f32 / (1u64 << 24) as f32 };
        let bias: Vec<f32> = (0..n).map(|_| (next() * 2000.0 - 1000.0).round()).collect();
        let mult: Vec<f32> = (0..n).map(|j| if j % 5 == 0 { 0.5 } else { next() * 0.01 }).collect();
        let mut y = vec![0u8; n];
        requantize_row_f32(&acc, &bias, &mult, zy as f32, clamp, &mut y);
        for j in 0..n {
            let want = ((acc[j] as f32 + bias[j]) * mult[j] + zy as f32).round_ties_even().max(clamp.0.max(0.0)).min(clamp.1.min(255.0));
            prop_assert_eq!(f32::from(y[j]), want, "element {}", j);
        }
    }

    /// The fused add of two dequantized operands: the documented map `a * ra + (b * rb +
    /// shift)` rounded half to even, and within one code of the three ops run apart.
    #[test]
    fn add_dequantized_matches_the_three_ops(
        a in prop::collection::vec(any::<u8>(), 0..70),
        seed in any::<u64>(),
        sa in prop::sample::select(vec![0.02f32, 0.5, 1.0, 0.0173]),
        sb in prop::sample::select(vec![0.03f32, 0.25, 1.0, 0.0091]),
        sy in prop::sample::select(vec![0.05f32, 0.5, 1.0, 0.0231]),
        za in any::<u8>(), zb in any::<i8>(), zy in any::<u8>(),
    ) {
        let n = a.len();
        let mut s = seed;
        let b: Vec<i8> = (0..n).map(|_| { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 40) as i8 }).collect();
        let (mut fa, mut fb) = (vec![0f32; n], vec![0f32; n]);
        dequantize_row(&a, &mut fa, sa, za);
        dequantize_row(&b, &mut fb, sb, zb);
        let sum: Vec<f32> = fa.iter().zip(&fb).map(|(x, y)| x + y).collect();
        let mut want = vec![0u8; n];
        quantize_row(&sum, &mut want, sy, f32::from(zy));
        let mut got = vec![0u8; n];
        add_dequantized_row(
            Operand { values: &a, scale: sa, zero_point: f32::from(za) },
            Operand { values: &b, scale: sb, zero_point: f32::from(zb) },
            &mut got, sy, f32::from(zy),
        );
        let exact = |j: usize| ((f64::from(a[j]) - f64::from(za)) * f64::from(sa) + (f64::from(b[j]) - f64::from(zb)) * f64::from(sb)) / f64::from(sy);
        near_the_three_ops(&got, &want, exact)?;
        let map = |x: f32, z: f32| ratio_map(x, z, (sa, f32::from(za)), (sb, f32::from(zb)), (sy, f32::from(zy)), (0.0, 255.0));
        for (j, (&g, (&x, &z))) in got.iter().zip(a.iter().zip(&b)).enumerate() {
            prop_assert_eq!(f32::from(g), map(f32::from(x), f32::from(z)), "element {}", j);
        }
    }

    /// In place (a convolution's output plus its residual): within one code of the three ops
    /// run apart, then the Relu's `max(q, zy)` when it has a floor, and the documented map's
    /// code; u8 and i8 outputs.
    #[test]
    fn add_in_place_matches_the_three_ops(
        y0 in prop::collection::vec(any::<u8>(), 0..70),
        seed in any::<u64>(),
        sa in prop::sample::select(vec![0.02f32, 0.5, 1.0, 0.0173]),
        sb in prop::sample::select(vec![0.03f32, 0.25, 1.0, 0.0091]),
        sy in prop::sample::select(vec![0.05f32, 0.5, 1.0, 0.0231]),
        za in any::<u8>(), zb in any::<u8>(), zy in any::<u8>(), relu in any::<bool>(),
    ) {
        let n = y0.len();
        let mut s = seed;
        let b: Vec<u8> = (0..n).map(|_| { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 40) as u8 }).collect();
        let (mut fa, mut fb) = (vec![0f32; n], vec![0f32; n]);
        dequantize_row(&y0, &mut fa, sa, za);
        dequantize_row(&b, &mut fb, sb, zb);
        let sum: Vec<f32> = fa.iter().zip(&fb).map(|(x, y)| x + y).collect();
        let bop = Operand { values: &b, scale: sb, zero_point: f32::from(zb) };
        // u8 out
        let mut want = vec![0u8; n];
        quantize_row(&sum, &mut want, sy, f32::from(zy));
        if relu {
            want.iter_mut().for_each(|q| *q = (*q).max(zy));
        }
        let mut got = y0.clone();
        add_dequantized_in_place(&mut got, (sa, f32::from(za)), bop, (sy, f32::from(zy)), relu.then_some(f32::from(zy)));
        let exact = |j: usize| ((f64::from(y0[j]) - f64::from(za)) * f64::from(sa) + (f64::from(b[j]) - f64::from(zb)) * f64::from(sb)) / f64::from(sy);
        near_the_three_ops(&got, &want, exact)?;
        let lo = if relu { f32::from(zy) } else { 0.0 };
        for (j, (&g, (&x, &z))) in got.iter().zip(y0.iter().zip(&b)).enumerate() {
            let code = ratio_map(f32::from(x), f32::from(z), (sa, f32::from(za)), (sb, f32::from(zb)), (sy, f32::from(zy)), (lo, 255.0));
            prop_assert_eq!(f32::from(g), code, "element {}", j);
        }
        // i8 out (y's values reinterpreted, its zero point shifted into i8's range)
        let yi: Vec<i8> = y0.iter().map(|&v| (v ^ 0x80) as i8).collect();
        let (zai, zyi) = ((za ^ 0x80) as i8, (zy ^ 0x80) as i8);
        dequantize_row(&yi, &mut fa, sa, zai);
        let sum: Vec<f32> = fa.iter().zip(&fb).map(|(x, y)| x + y).collect();
        let mut want = vec![0i8; n];
        quantize_row(&sum, &mut want, sy, f32::from(zyi));
        if relu {
            want.iter_mut().for_each(|q| *q = (*q).max(zyi));
        }
        let mut got = yi.clone();
        add_dequantized_in_place(&mut got, (sa, f32::from(zai)), bop, (sy, f32::from(zyi)), relu.then_some(f32::from(zyi)));
        let exact = |j: usize| ((f64::from(yi[j]) - f64::from(zai)) * f64::from(sa) + (f64::from(b[j]) - f64::from(zb)) * f64::from(sb)) / f64::from(sy);
        near_the_three_ops(&got, &want, exact)?;
        let lo = if relu { f32::from(zyi) } else { -128.0 };
        for (j, (&g, (&x, &z))) in got.iter().zip(yi.iter().zip(&b)).enumerate() {
            let code = ratio_map(f32::from(x), f32::from(z), (sa, f32::from(zai)), (sb, f32::from(zb)), (sy, f32::from(zyi)), (lo, 127.0));
            prop_assert_eq!(f32::from(g), code, "element {}", j);
        }
    }

    #[test]
    fn dequantize_matches_the_formula(x in prop::collection::vec(any::<i8>(), 0..80), scale in -10.0f32..10.0, zp in any::<i8>()) {
        let mut y = vec![0f32; x.len()];
        dequantize_row(&x, &mut y, scale, zp);
        for (&xi, &yi) in x.iter().zip(&y) {
            prop_assert_eq!(yi.to_bits(), ((f32::from(xi) - f32::from(zp)) * scale).to_bits());
        }
        let u: Vec<u8> = x.iter().map(|&v| v as u8).collect();
        dequantize_row(&u, &mut y, scale, zp as u8);
        for (&ui, &yi) in u.iter().zip(&y) {
            prop_assert_eq!(yi.to_bits(), ((f32::from(ui) - f32::from(zp as u8)) * scale).to_bits());
        }
    }

    #[test]
    fn min_max_matches_a_fold(x in prop::collection::vec(special(), 0..70)) {
        let got = min_max(&x);
        if x.iter().any(|v| v.is_nan()) {
            prop_assert_eq!(got, None);
        } else {
            let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            prop_assert_eq!(got, Some((lo, hi)));
        }
    }
}

/// Scale ratios too large for the rounding trick without its clamp (the unbounded map):
/// sums saturate, a zero sum lands on the zero point, a NaN scale gives 0, as the three ops.
#[test]
fn extreme_scale_ratios_saturate_as_the_three_ops() {
    let a: Vec<u8> = vec![0, 10, 255, 9, 11];
    let b: Vec<u8> = vec![0, 0, 0, 0, 0];
    let bop = Operand {
        values: &b[..],
        scale: 1.0,
        zero_point: 0.0,
    };
    let a_with = |scale: f32| Operand {
        values: &a[..],
        scale,
        zero_point: 10.0,
    };
    for (sa, sy) in [(1.0f32, 1e-6f32), (3e5, 1.0), (1.0, 1e-30)] {
        let (mut fa, mut fb) = (vec![0f32; a.len()], vec![0f32; b.len()]);
        dequantize_row(&a, &mut fa, sa, 10);
        dequantize_row(&b, &mut fb, 1.0, 0);
        let sum: Vec<f32> = fa.iter().zip(&fb).map(|(x, y)| x + y).collect();
        let mut want = vec![0u8; a.len()];
        quantize_row(&sum, &mut want, sy, 5.0);
        let mut got = vec![0u8; a.len()];
        add_dequantized_row(a_with(sa), bop, &mut got, sy, 5.0);
        assert_eq!(got, want, "sa {sa} sy {sy}");
        assert_eq!(&got[..3], &[0, 5, 255], "saturated both ways, zero at the zero point");
        let mut inplace = a.clone();
        add_dequantized_in_place(&mut inplace, (sa, 10.0), bop, (sy, 5.0), None);
        assert_eq!(inplace, want, "in place, sa {sa} sy {sy}");
    }
    // A NaN scale: every sum NaN, quantized to 0 by the three ops and by the map.
    let mut got = vec![7u8; a.len()];
    add_dequantized_row(a_with(f32::NAN), bop, &mut got, 0.5, 5.0);
    let mut want = vec![0u8; a.len()];
    quantize_row(&vec![f32::NAN; a.len()], &mut want, 0.5, 5.0);
    assert_eq!(got, want);
}

/// Non-finite requantized values: a NaN (a zero sum times an infinite multiplier) gives the
/// lower bound, an infinity the bound on its side, in f32 and f64, for a vector's worth of
/// channels and its tail; finite values still round half to even inside the bounds.
#[test]
fn requantizing_non_finite_values_gives_the_bounds() {
    let c = 19;
    let acc: Vec<i32> = (0..c as i32).map(|j| [0, 7, -7][j as usize % 3]).collect();
    let bias = vec![0.0f32; c];
    let mult: Vec<f32> = (0..c).map(|j| if j < 16 { f32::INFINITY } else { 0.5 }).collect();
    let want: Vec<u8> = acc
        .iter()
        .zip(&mult)
        .map(|(&a, &m)| match (a, m.is_finite()) {
            (0, false) => 10,
            (a, false) if a > 0 => 200,
            (_, false) => 10,
            // 7 * 0.5 + 3 = 6.5 rounds to 6; -3.5 + 3 = -0.5 to 0, then up to the bound.
            (a, true) => ((a as f32 * 0.5 + 3.0).round_ties_even()).clamp(10.0, 200.0) as u8,
        })
        .collect();
    let mut got = vec![0u8; c];
    requantize_pixels_f32(&acc, &bias, &mult, 3.0, (10.0, 200.0), &mut got);
    assert_eq!(got, want);
    let (b64, m64): (Vec<f64>, Vec<f64>) = (vec![0.0; c], mult.iter().map(|&m| f64::from(m)).collect());
    let mut got = vec![0u8; c];
    requantize_pixels(&acc, &b64, &m64, 3.0, (10.0, 200.0), &mut got);
    assert_eq!(got, want);
    // Finite values inside the bounds: ties to even.
    let (acc, mult) = ([5i32, 3, -5, -3], [0.5f32; 4]);
    let mut got = [0i8; 4];
    requantize_row_f32(&acc, &[0.0; 4], &mult, 0.0, (-128.0, 127.0), &mut got);
    assert_eq!(got, [2, 2, -2, -2]);
}

proptest! {
    /// A fused stage with a residual sum rounds once: against the float graph in f64 (the
    /// convolution's value clamped to its output's range, unrounded, plus R dequantized,
    /// quantized), equal wherever that value is not within f32's error of a rounding
    /// boundary; and within `1 + ra / 2` codes of the two-op path (the convolution's codes,
    /// then `add_dequantized_in_place`).
    #[test]
    fn summed_stage_rounds_the_float_graph_once(
        acc in prop::collection::vec(-200_000i32..200_000, 1..70),
        seed in any::<u64>(),
        mult in prop::sample::select(vec![0.0007f32, 0.0013, 0.0021]),
        (sc, sr, so) in (0.01f32..0.2, 0.01f32..0.2, 0.02f32..0.3),
        (zc, zr, zo) in (0u8..=255, 0u8..=255, 0u8..=255),
        (lo, relu) in (prop::sample::select(vec![0i32, 17]), any::<bool>()),
    ) {
        let n = acc.len();
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 40) as u32 };
        let r: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        let bias: Vec<f32> = (0..n).map(|_| (next() % 4001) as f32 - 2000.0).collect();
        let mults: Vec<f32> = (0..n).map(|j| mult * (1.0 + (j % 5) as f32 * 0.1)).collect();
        let (zc, zr, zo) = (f32::from(zc), f32::from(zr), f32::from(zo));
        let map = SumMap::of((sc, zc), (sr, zr), (so, zo));
        prop_assume!(map.bounded());
        let floor = if relu { zo } else { 0.0 };
        let mut got = vec![0u8; n];
        requantize_summed_row_f32(&acc, (&bias, &mults, zc), (lo as f32, 255.0), &r, map, floor, &mut got);
        for j in 0..n {
            let v = ((f64::from(acc[j]) + f64::from(bias[j])) * f64::from(mults[j]) + f64::from(zc)).clamp(f64::from(lo), 255.0);
            let t = ((v - f64::from(zc)) * f64::from(sc) + (f64::from(r[j]) - f64::from(zr)) * f64::from(sr)) / f64::from(so) + f64::from(zo);
            let frac = t - t.floor();
            if (frac - 0.5).abs() > 1e-3 {
                let want = t.round_ties_even().clamp(f64::from(floor), 255.0);
                prop_assert_eq!(f64::from(got[j]), want, "element {} (t = {})", j, t);
            }
        }
        let mut two = vec![0u8; n];
        requantize_row_f32(&acc, &bias, &mults, zc, (lo as f32, 255.0), &mut two);
        let rop = Operand { values: &r, scale: sr, zero_point: zr };
        add_dequantized_in_place(&mut two, (sc, zc), rop, (so, zo), relu.then_some(zo));
        // The two ops' rounding of the convolution's codes moves a sum by up to half of `ra`.
        let near = 1.0 + 0.5 * map.ra.abs();
        for (j, (&g, &w)) in got.iter().zip(&two).enumerate() {
            prop_assert!(f32::from(g.abs_diff(w)) <= near, "element {}: {} against the two ops' {}", j, g, w);
        }
    }
}
