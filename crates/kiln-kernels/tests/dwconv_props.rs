//! The depthwise pixel kernel on every level against its scalar twin (the portable path),
//! over channel counts that exercise the 64-wide blocks and the masked tail, windows of
//! any shape and offset (9 taps often: the register path), runs of 1-9 pixels (the 4-pixel
//! groups and their remainder), with and without a bias and bounds; and windows of rows of
//! three adjacent taps, pixels one or two columns apart (the 8-pixel register path).

use kiln_kernels::dwconv::{Clamp, Pixels};
use kiln_kernels::isa::Isa;
use proptest::prelude::*;

type Case = (usize, Vec<(usize, usize)>, usize, bool, u64, usize, Option<(f32, f32)>);

fn case() -> impl Strategy<Value = Case> {
    let taps = prop_oneof![Just(9usize), Just(16usize), 0usize..=12];
    let clamp = prop_oneof![
        Just(None),
        Just(Some((0.0, f32::INFINITY))),
        Just(Some((-0.25, 0.5))),
        Just(Some((0.5, -0.5)))
    ];
    (
        1usize..=150,
        taps,
        0usize..=5,
        any::<bool>(),
        any::<u64>(),
        1usize..=9,
        clamp,
    )
        .prop_flat_map(|(c, taps, base, bias, seed, count, clamp)| {
            let window = prop::collection::vec((0usize..=40, 0usize..=12), taps);
            (
                Just(c),
                window,
                Just(base),
                Just(bias),
                Just(seed),
                Just(count),
                Just(clamp),
            )
        })
}

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

proptest! {
    #[test]
    fn every_level_matches_the_scalar_twin((c, window, base, with_bias, seed, count, bounds) in case()) {
        // Offsets are in units of whole pixels (`c` floats), as the convolution uses them.
        let window: Vec<(usize, usize)> = window.iter().map(|&(x, w)| (x * c, w * c)).collect();
        let x = data((base + 50) * c + 3, seed);
        let w = data(13 * c, seed ^ 7);
        let bias = data(c, seed ^ 11);
        let b = with_bias.then_some(bias.as_slice());
        let clamp = bounds.map_or(Clamp::NONE, |(lo, hi)| Clamp { lo, hi });
        // `count` pixels one input pixel apart.
        let mut want = vec![f32::NAN; count * c];
        let call = Pixels { x: &x, w: &w, bias: b, window: &window, base: base * c, step: c, c, clamp };
        prop_assert!(call.run_with(Isa::Portable, &mut want));
        if let Some((lo, hi)) = bounds {
            prop_assert!(want.iter().all(|&v| v <= hi && (v >= lo || lo > hi)));
        }
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let mut got = vec![f32::NAN; count * c];
            prop_assert!(call.run_with(isa, &mut got));
            for (i, (g, t)) in got.iter().zip(&want).enumerate() {
                // The FMA rounds once where the twin rounds twice: a few ulp of the terms.
                let (p, ch) = (i / c, i % c);
                let scale: f32 = window.iter().map(|&(xo, wo)| (x[(base + p) * c + xo + ch] * w[wo + ch]).abs()).sum::<f32>() + 1.0;
                prop_assert!((g - t).abs() <= 1e-6 * scale, "{isa:?} [{i}]: {g} vs {t}");
            }
        }
    }
}

/// Windows of `rows` kernel rows of `taps` (3, 5 or 7) taps `dil` input columns apart (each row
/// at a random input pixel and tap row), pixels `stride` apart: the shape of 3x3, 5x5 and 7x7
/// interiors and their edge rows (dilated too), which the SIMD paths run with each input
/// column loaded once for all the pixels that use it.
#[allow(clippy::type_complexity)]
fn rows_case() -> impl Strategy<Value = (usize, usize, usize, Vec<(usize, usize)>, usize, usize, u64, usize, bool)> {
    (
        1usize..=70,
        prop_oneof![Just(3usize), Just(5usize), Just(7usize)],
        1usize..=2,
        1usize..=7,
        1usize..=2,
        any::<u64>(),
        1usize..=20,
        any::<bool>(),
    )
        .prop_flat_map(|(c, taps, dil, rows, stride, seed, count, bias)| {
            let row = (0usize..=30, 0usize..taps);
            (
                Just(c),
                Just(taps),
                Just(dil),
                prop::collection::vec(row, rows),
                Just(stride),
                0usize..=3,
                Just(seed),
                Just(count),
                Just(bias),
            )
        })
}

proptest! {
    #[test]
    fn rows_of_spaced_taps_match_the_scalar_twin(
        (c, taps, dil, rows, stride, base, seed, count, with_bias) in rows_case()
    ) {
        let window: Vec<(usize, usize)> = rows
            .iter()
            .flat_map(|&(xr, wr)| (0..taps).map(move |k| ((xr + k * dil) * c, (taps * wr + k) * c)))
            .collect();
        let x = data((base + (count - 1) * stride + 31 + (taps - 1) * dil) * c, seed);
        let w = data(taps * taps * c, seed ^ 5);
        let bias = data(c, seed ^ 3);
        let b = with_bias.then_some(bias.as_slice());
        let clamp = Clamp { lo: -0.5, hi: 0.75 };
        let call = Pixels { x: &x, w: &w, bias: b, window: &window, base: base * c, step: stride * c, c, clamp };
        let mut want = vec![f32::NAN; count * c];
        prop_assert!(call.run_with(Isa::Portable, &mut want));
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let mut got = vec![f32::NAN; count * c];
            prop_assert!(call.run_with(isa, &mut got));
            for (i, (g, t)) in got.iter().zip(&want).enumerate() {
                let (p, ch) = (i / c, i % c);
                let at = (base + p * stride) * c;
                let scale: f32 = window.iter().map(|&(xo, wo)| (x[at + xo + ch] * w[wo + ch]).abs()).sum::<f32>() + 1.0;
                prop_assert!((g - t).abs() <= 1e-6 * scale, "{isa:?} [{i}]: {g} vs {t}");
            }
        }
    }
}
