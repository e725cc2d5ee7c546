//! Test helpers shared by the direct convolution kernels' tests ([`crate::planar`],
//! [`crate::stem`]): inputs, the f64 oracle, the packed weights, and one case run over
//! every level of a kernel.
#![allow(clippy::unwrap_used)]

use crate::conv::Conv2d;
use crate::planar::Source;
use crate::sgemm::{Act, BLayout, Bias, Epilogue, PackedB, PackedBRef, Residual};

/// The levels of a direct kernel module's `rows_with(level, ...)` as [`RowsAt`]s: the scalar
/// twin (`$portable`), and the AVX-512 tiles (`$avx512`) where the machine runs them.
macro_rules! levels {
    ($rows_with:ident, $portable:ident, $avx2:ident, $avx512:ident) => {{
        /// `LEVEL`: 0 the scalar twin, 1 AVX2, 2 AVX-512.
        fn level<const LEVEL: u8>(
            g: &$crate::conv::Conv2d,
            m: usize,
            x: $crate::planar::Source<'_>,
            w: &$crate::sgemm::PackedBRef<'_>,
            oy0: usize,
            y: &mut [f32],
            e: &$crate::sgemm::Epilogue<'_>,
        ) -> bool {
            #[cfg(target_arch = "x86_64")]
            match LEVEL {
                1 => return $rows_with(&$avx2, g, m, x, w, oy0, y, e),
                2 => return $rows_with(&$avx512, g, m, x, w, oy0, y, e),
                _ => {}
            }
            $rows_with(&$portable, g, m, x, w, oy0, y, e)
        }
        let mut levels: Vec<&'static $crate::conv_testkit::RowsAt> = vec![&level::<0>];
        if cfg!(target_arch = "x86_64") && $crate::isa::Isa::Avx2Fma.is_supported() {
            levels.push(&level::<1>);
        }
        if cfg!(target_arch = "x86_64") && $crate::isa::Isa::Avx512.is_supported() {
            levels.push(&level::<2>);
        }
        levels
    }};
}
pub(crate) use levels;

/// One level's row kernel (`rows_with` bound to the level).
pub(crate) type RowsAt = dyn Fn(&Conv2d, usize, Source<'_>, &PackedBRef<'_>, usize, &mut [f32], &Epilogue<'_>) -> bool;

pub(crate) fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// The f64 oracle: channels-last `[OH, OW, M]` of one image, `w` as `[M][C][KH][KW]`.
pub(crate) fn oracle(g: &Conv2d, m: usize, x: &[f32], first: bool, w: &[f32]) -> Vec<f64> {
    let mut y = vec![0f64; g.oh * g.ow * m];
    for oy in 0..g.oh {
        for ox in 0..g.ow {
            for j in 0..m {
                let mut s = 0f64;
                for ci in 0..g.c {
                    for ky in 0..g.kh {
                        for kx in 0..g.kw {
                            let iy = (oy * g.sh + ky * g.dh) as isize - g.ph as isize;
                            let ix = (ox * g.sw + kx * g.dw) as isize - g.pw as isize;
                            if iy < 0 || ix < 0 || iy as usize >= g.ih || ix as usize >= g.iw {
                                continue;
                            }
                            let (iy, ix) = (iy as usize, ix as usize);
                            let xv = if first {
                                x[(ci * g.ih + iy) * g.iw + ix]
                            } else {
                                x[(iy * g.iw + ix) * g.c + ci]
                            };
                            s += xv as f64 * w[((j * g.c + ci) * g.kh + ky) * g.kw + kx] as f64;
                        }
                    }
                }
                y[(oy * g.ow + ox) * m + j] = s;
            }
        }
    }
    y
}

/// W `[M][C][KH][KW]` as the channels-last GEMM's packed B: depth `(ky, kx, c)`.
pub(crate) fn packed(w: &[f32], m: usize, g: &Conv2d, layout: BLayout) -> PackedB {
    let k = g.k();
    let mut b = vec![0f32; k * m];
    for j in 0..m {
        for ci in 0..g.c {
            for ky in 0..g.kh {
                for kx in 0..g.kw {
                    b[((ky * g.kw + kx) * g.c + ci) * m + j] = w[((j * g.c + ci) * g.kh + ky) * g.kw + kx];
                }
            }
        }
    }
    PackedB::pack(layout, k, m, &b, crate::gemm::MatLayout::row_major(m)).unwrap()
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn case(
    levels: &[&RowsAt],
    exact: bool,
    c: usize,
    m: usize,
    [ih, iw]: [usize; 2],
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    [dh, dw]: [usize; 2],
    [ph, pw]: [usize; 2],
    first: bool,
    seed: u64,
) {
    let oh = (ih + 2 * ph).saturating_sub((kh - 1) * dh + 1) / sh + 1;
    let ow = (iw + 2 * pw).saturating_sub((kw - 1) * dw + 1) / sw + 1;
    let g = Conv2d {
        c,
        ih,
        iw,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        ph,
        pw,
        oh,
        ow,
    };
    let x = noise(c * ih * iw, seed);
    let w = noise(m * c * kh * kw, seed + 1);
    let bias = noise(m, seed + 2);
    let want = oracle(&g, m, &x, first, &w);
    let src = if first { Source::First(&x) } else { Source::Last(&x) };
    let slopes = noise(m, seed + 3);
    let resid = noise(oh * ow * m, seed + 4);
    // (activation, PRelu slopes, residual): in registers, then the planes' paths.
    let kinds: [(Option<Act>, bool, bool); 5] = [
        (Some(Act::Relu), false, false),
        (Some(Act::HardSwish), false, false),
        (None, true, false),
        (Some(Act::Sigmoid), false, false),
        (Some(Act::Relu), false, true),
    ];
    let kind = kinds[seed as usize % kinds.len()];
    let finish = |i: usize, v: f64| {
        let j = i % m;
        let mut v = v + bias[j] as f64;
        if kind.2 {
            v += resid[i] as f64;
        }
        match kind.0 {
            Some(act) => act.apply_scalar(v as f32) as f64,
            None if kind.1 && v < 0.0 => v * slopes[j] as f64,
            None => v,
        }
    };
    for layout in [BLayout::NR32, BLayout::NR16] {
        let pb = packed(&w, m, &g, layout);
        let wref = pb.view();
        let epi = Epilogue {
            bias: Bias::Col(&bias),
            act: kind.0,
            prelu: if kind.1 { Bias::Col(&slopes) } else { Bias::None },
            ..Epilogue::NONE
        };
        let mut outs = Vec::new();
        for level in levels {
            let mut y = vec![f32::NAN; oh * ow * m];
            // Two blocks of rows, the second from row 1 (or all of them in one).
            let split = oh.min(1) * ow * m;
            let (a, b) = y.split_at_mut(split);
            fn with<'e>(epi: &Epilogue<'e>, r: Option<&'e [f32]>, m: usize) -> Epilogue<'e> {
                Epilogue {
                    residual: r.map(|data| Residual { data, ld: m }),
                    ..*epi
                }
            }
            let resid = kind.2.then_some(resid.as_slice());
            assert!(level(&g, m, src, &wref, 0, a, &with(&epi, resid, m)));
            assert!(level(
                &g,
                m,
                src,
                &wref,
                oh.min(1),
                b,
                &with(&epi, resid.map(|r| &r[split..]), m)
            ));
            outs.push(y);
        }
        for y in &outs {
            for (i, (&got, &s)) in y.iter().zip(&want).enumerate() {
                let s = finish(i, s);
                assert!(
                    (got as f64 - s).abs() <= 1e-4 * (1.0 + s.abs()),
                    "c {c} m {m} {ih}x{iw} k {kh}x{kw} s {sh},{sw} d {dh},{dw} p {ph},{pw} first {first} {kind:?}: [{i}] {got} vs {s}"
                );
            }
        }
        // The levels agree to rounding (the scalar twin fuses each multiply-add too), with
        // `exact` bit for bit where no vector activation rounds differently.
        if let [a, b] = &outs[..] {
            for (p, q) in a.iter().zip(b) {
                if exact && kind.0.is_none_or(|a| a == Act::Relu) {
                    assert_eq!(p.to_bits(), q.to_bits());
                } else {
                    assert!((p - q).abs() <= 1e-5 * (1.0 + p.abs()));
                }
            }
        }
    }
}

/// Random geometries (both sources, strides, dilations, padding wider than the edge
/// windows, rows of 1 to 40 pixels) with `cs` input and `ms` output channels, each run by
/// [`case`] over `levels`: `cases` of them (a proptest runner, which shrinks a failure).
pub(crate) fn random_cases(
    levels: &[&RowsAt],
    exact: bool,
    cs: std::ops::RangeInclusive<usize>,
    ms: std::ops::RangeInclusive<usize>,
    cases: u32,
) {
    use proptest::prelude::*;
    let geometry = (
        (cs, ms, 1usize..=12, 1usize..=40),
        (1usize..=4, 1usize..=4, 1usize..=3, 1usize..=3),
        (1usize..=2, 1usize..=2, 0usize..=3, 0usize..=3),
        (any::<bool>(), 0u64..1000),
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases));
    let result = runner.run(
        &geometry,
        |((c, m, ih, iw), (kh, kw, sh, sw), (dh, dw, ph, pw), (first, seed))| {
            if ih + 2 * ph > (kh - 1) * dh && iw + 2 * pw > (kw - 1) * dw {
                case(
                    levels,
                    exact,
                    c,
                    m,
                    [ih, iw],
                    [kh, kw],
                    [sh, sw],
                    [dh, dw],
                    [ph, pw],
                    first,
                    seed,
                );
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
