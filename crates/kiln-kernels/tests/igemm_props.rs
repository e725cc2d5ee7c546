//! The integer GEMM on every level against an exact i64 oracle: edge shapes, both 8-bit
//! types on each side, zero points, depths across blocks and past the exact-i32 bound.

use kiln_kernels::igemm::{
    ConvScratch, ConvWindow, F32Twin, Int8, MAX_EXACT_DEPTH, PackedB, Packing, Requantize, ResidualSum, Scales,
    conv_requant_serial, igemm_requant_columns, igemm_requant_serial, igemm_serial, igemm_with, splits_by_columns,
};
use kiln_kernels::isa::Isa;
use kiln_kernels::quant::{
    Operand, Q8, SumMap, add_dequantized_in_place, requantize_row, requantize_row_f32, requantize_summed_row_f32,
};

/// The row stage a fused stage must match: `requantize_row_f32` or `requantize_row`.
fn row_stage<O: Q8>(scales: Scales<'_>, sums: &[i32], (lo, hi): (i32, i32), out: &mut [O]) {
    match scales {
        Scales::F32 { bias, mult, zero_point } => {
            requantize_row_f32(sums, bias, mult, zero_point, (lo as f32, hi as f32), out)
        }
        Scales::F64 {
            bias, mult, zero_point, ..
        } => requantize_row(sums, bias, mult, zero_point, (f64::from(lo), f64::from(hi)), out),
    }
}

/// The residual sum a fused stage must match on one row of exact sums, R's row `r` of scale
/// and zero point `of_r` summed with Y's codes (`own`) into `out`'s: an f32 stage rounds once
/// (`requantize_summed_row_f32`, the QDQ rewrite's arithmetic); an f64 stage's codes
/// (`row_stage`) are summed after (`add_dequantized_in_place`, QLinearAdd's).
fn summed_stage<O: Q8 + Default>(
    scales: Scales<'_>,
    sums: &[i32],
    (lo, hi): (i32, i32),
    r: &[O],
    (own, of_r, out): ((f32, f32), (f32, f32), (f32, f32)),
    floor: Option<f32>,
    y: &mut [O],
) {
    match scales {
        Scales::F32 { bias, mult, zero_point } => {
            let floor = floor.map_or(O::LO, |f| f.clamp(O::LO, O::HI));
            let map = SumMap::of(own, of_r, out);
            requantize_summed_row_f32(sums, (bias, mult, zero_point), (lo as f32, hi as f32), r, map, floor, y);
        }
        Scales::F64 { .. } => {
            row_stage(scales, sums, (lo, hi), y);
            let r = Operand {
                values: r,
                scale: of_r.0,
                zero_point: of_r.1,
            };
            add_dequantized_in_place(y, own, r, out, floor);
        }
    }
}
use proptest::prelude::*;

fn oracle<A: Int8, B: Int8>(m: usize, n: usize, k: usize, a: &[A], za: i32, b: &[B], zb: &[B]) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            let z = match zb {
                [] => 0,
                [z] => z.widen(),
                zs => zs[j].widen(),
            };
            c[i * n + j] = (0..k)
                .map(|kk| i64::from(a[i * k + kk].widen() - za) * i64::from(b[kk * n + j].widen() - z))
                .sum();
        }
    }
    c
}

fn check<A: Int8 + std::fmt::Debug, B: Int8 + std::fmt::Debug>(
    m: usize,
    n: usize,
    k: usize,
    a: &[A],
    za: i32,
    b: &[B],
    zb: &[B],
) -> Result<(), TestCaseError> {
    let want = oracle(m, n, k, a, za, b, zb);
    let fail = |e: kiln_kernels::igemm::IgemmError| TestCaseError::fail(e.to_string());
    let mut formats = vec![PackedB::pack(b, k, n, zb).map_err(fail)?];
    for packing in [Packing::Pairs, Packing::Quads] {
        // Quads exist only when every B - zb fits in i8; both are run on every level (the
        // quads' portable twin where VNNI is missing).
        formats.extend(PackedB::pack_as(packing, b, k, n, zb).map_err(fail)?);
    }
    // For int32 sums alone: quads about B's type's center where `B - zb` does not fit.
    formats.push(PackedB::pack_for_sums(b, k, n, zb).map_err(fail)?);
    let runs = Isa::ALL
        .into_iter()
        .filter(|i| i.is_supported())
        .flat_map(|isa| formats.iter().map(move |p| (isa, p)));
    for (round, (isa, packed)) in runs.enumerate() {
        let ldc = n + 3;
        let mut c = vec![7i32; m * ldc];
        if round % 2 == 0 {
            igemm_with(isa, m, k, a, k, za, packed, &mut c, ldc).map_err(fail)?;
        } else {
            igemm_serial(isa, m, k, a, k, za, packed, &mut c, ldc).map_err(fail)?;
        }
        for i in 0..m {
            for j in 0..n {
                prop_assert_eq!(
                    i64::from(c[i * ldc + j]),
                    want[i * n + j],
                    "{:?} {:?} m={} n={} k={} at ({}, {})",
                    isa,
                    packed.packing(),
                    m,
                    n,
                    k,
                    i,
                    j
                );
            }
            for j in n..ldc {
                prop_assert_eq!(c[i * ldc + j], 7, "{:?} wrote past column {}", isa, n);
            }
        }
    }
    Ok(())
}

/// Rows past 96 reach a second row block of the pairs path; depths past 512 a second depth block.
fn dims() -> impl Strategy<Value = (usize, usize, usize)> {
    (
        prop_oneof![3 => 1usize..20, 1 => 90usize..210],
        1usize..40,
        prop_oneof![1usize..40, 500usize..1100],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn u8_by_s8_per_column_zero_points((m, n, k) in dims(), seed in any::<u64>(), za in 0i32..=255) {
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let a: Vec<u8> = (0..m * k).map(|_| next() as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|_| next() as i8).collect();
        let zb: Vec<i8> = (0..n).map(|_| next() as i8).collect();
        check(m, n, k, &a, za, &b, &zb)?;
        check(m, n, k, &a, za, &b, &[])?;
    }

    #[test]
    fn s8_by_u8_one_zero_point((m, n, k) in dims(), seed in any::<u64>(), za in -128i32..=127, zb in any::<u8>()) {
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let a: Vec<i8> = (0..m * k).map(|_| next() as i8).collect();
        let b: Vec<u8> = (0..k * n).map(|_| next() as u8).collect();
        check(m, n, k, &a, za, &b, &[zb])?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Zero points near the weights, so that `B - zb` fits in i8 and the quads format (VNNI)
    /// runs with per-column zero points, s8 and u8 activations and u8 weights.
    #[test]
    fn quads_with_zero_points((m, n, k) in dims(), seed in any::<u64>(), za in -128i32..=127) {
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let a: Vec<i8> = (0..m * k).map(|_| next() as i8).collect();
        let au: Vec<u8> = a.iter().map(|&v| v as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|_| (next() % 128) as i8 - 64).collect();
        let zb: Vec<i8> = (0..n).map(|_| (next() % 128) as i8 - 64).collect();
        check(m, n, k, &a, za, &b, &zb)?;
        check(m, n, k, &au, za + 128, &b, &zb)?;
        let bu: Vec<u8> = (0..k * n).map(|_| next() as u8).collect();
        check(m, n, k, &au, za + 128, &bu, &[128])?;
    }
}

/// The fused product's bytes against the row stage (`requantize_row_f32`, or
/// `requantize_row` for an f64 stage) on the oracle's sums, on every level and format, for u8
/// and i8 outputs, with and without a clamp inside the type's range.
#[allow(clippy::too_many_arguments)]
fn check_fused<
    A: Int8 + std::fmt::Debug,
    B: Int8 + std::fmt::Debug,
    O: Int8 + Q8 + Default + PartialEq + std::fmt::Debug,
>(
    (m, n, k): (usize, usize, usize),
    a: &[A],
    za: i32,
    b: &[B],
    zb: &[B],
    scales: Scales<'_>,
    range: (i32, i32),
) -> Result<(), TestCaseError> {
    let sums: Vec<i32> = oracle(m, n, k, a, za, b, zb).into_iter().map(|v| v as i32).collect();
    let mut want = vec![O::default(); m * n];
    for (row, out) in sums.chunks(n).zip(want.chunks_mut(n)) {
        row_stage(scales, row, range, out);
    }
    let fail = |e: kiln_kernels::igemm::IgemmError| TestCaseError::fail(e.to_string());
    let mut formats = vec![];
    for packing in [Packing::Pairs, Packing::Quads] {
        formats.extend(PackedB::pack_as(packing, b, k, n, zb).map_err(fail)?);
    }
    let stage = Requantize {
        scales,
        range,
        sum: None,
    };
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        for packed in &formats {
            let ldy = n + 2;
            let mut y = vec![O::default(); m * ldy];
            let mut c = vec![-1i32; m * n];
            igemm_requant_serial(isa, (m, k), a, k, za, packed, &mut c, stage, &mut y, ldy).map_err(fail)?;
            for i in 0..m {
                prop_assert_eq!(
                    &y[i * ldy..i * ldy + n],
                    &want[i * n..(i + 1) * n],
                    "{:?} {:?} m={} n={} k={} row {}",
                    isa,
                    packed.packing(),
                    m,
                    n,
                    k,
                    i
                );
                prop_assert_eq!(
                    &y[i * ldy + n..(i + 1) * ldy],
                    &[O::default(); 2][..],
                    "{:?} wrote past column {}",
                    isa,
                    n
                );
            }
            // With a residual sum in the stage (R in Y's layout; a floor on every other
            // size): byte for byte as `summed_stage` on the oracle's sums.
            let resid: Vec<O> = (0..m * ldy).map(|i| O::from_low_byte((i * 37 + k) as u32)).collect();
            let (own, of_r, out) = ((0.05, 3.0), (0.021 + (n % 5) as f32 * 0.013, -7.0), (0.07, 2.0));
            let floor = (m % 2 == 0).then_some(5.0);
            let sum = ResidualSum::new(&resid, SumMap::of(own, of_r, out), floor)
                .ok_or_else(|| TestCaseError::fail("unbounded map"))?;
            let mut summed = vec![O::default(); m * ldy];
            let with_sum = Requantize {
                sum: Some(sum),
                ..stage
            };
            igemm_requant_serial(isa, (m, k), a, k, za, packed, &mut c, with_sum, &mut summed, ldy).map_err(fail)?;
            for i in 0..m {
                let mut after = vec![O::default(); n];
                let (row, r) = (&sums[i * n..(i + 1) * n], &resid[i * ldy..i * ldy + n]);
                summed_stage(scales, row, range, r, (own, of_r, out), floor, &mut after);
                prop_assert_eq!(
                    &summed[i * ldy..i * ldy + n],
                    &after[..],
                    "sum {:?} {:?} m={} n={} k={} row {}",
                    isa,
                    packed.packing(),
                    m,
                    n,
                    k,
                    i
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Depths past one block of the quads kernel (2 560) too, where the last block adds the
    /// earlier blocks' sums from C before requantizing.
    #[test]
    fn fused_requantization_matches_the_row_stage(
        (m, n) in (1usize..20, 1usize..70),
        k in prop_oneof![1usize..40, 60usize..300, 2561usize..2700],
        seed in any::<u64>(),
        za in -128i32..=127,
        zy in -20i32..=20,
        clamp in any::<bool>(),
    ) {
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let a: Vec<i8> = (0..m * k).map(|_| next() as i8).collect();
        let au: Vec<u8> = a.iter().map(|&v| v as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|_| (next() % 128) as i8 - 64).collect();
        let zb: Vec<i8> = (0..n).map(|_| (next() % 16) as i8 - 8).collect();
        // Multipliers that spread the sums (about sqrt(k) * 64 * 128 in size) over the byte.
        let typical = (k as f32).sqrt() * 64.0 * 100.0;
        let mult: Vec<f32> = (0..n).map(|_| (0.5 + (next() % 1000) as f32 / 500.0) * 60.0 / typical).collect();
        let bias: Vec<f32> = (0..n).map(|_| (next() % 20_001) as f32 - 10_000.0 + 0.25).collect();
        let (ru, ri) = if clamp { ((3, 200), (-100, 90)) } else { ((0, 255), (-128, 127)) };
        let f32s = |zero_point: f32| Scales::F32 { bias: &bias, mult: &mult, zero_point };
        check_fused::<i8, i8, u8>((m, n, k), &a, za, &b, &zb, f32s(zy as f32 + 128.0), ru)?;
        check_fused::<u8, i8, i8>((m, n, k), &au, za + 128, &b, &zb, f32s(zy as f32), ri)?;
        check_fused::<u8, i8, u8>((m, n, k), &au, za + 128, &b, &[], f32s(zy as f32 + 100.0), ru)?;
        // The f64 stage (QLinearConv's arithmetic), with multipliers of a few bits too, whose
        // products land on halves: the ties round to even.
        // (Integer biases in those columns: with the +0.25 no product would be a half.)
        let bias64: Vec<f64> = bias.iter().enumerate().map(|(j, &v)| if j % 3 == 0 { f64::from(v).floor() } else { f64::from(v) }).collect();
        let mult64: Vec<f64> = mult.iter().enumerate().map(|(j, &v)| if j % 3 == 0 { 0.5f64.powi(6 + (j % 5) as i32) } else { f64::from(v) / 3.0 }).collect();
        let f64s = |zero_point: f64| Scales::F64 { bias: &bias64, mult: &mult64, zero_point, twin: None };
        check_fused::<i8, i8, u8>((m, n, k), &a, za, &b, &zb, f64s(f64::from(zy) + 128.0), ru)?;
        check_fused::<u8, i8, i8>((m, n, k), &au, za + 128, &b, &zb, f64s(f64::from(zy)), ri)?;
        // And with its f32 twin (the VNNI tile's f32 arithmetic, f64 near the halves): the
        // same bits, ties and near-ties included.
        let (bias32, mult32): (Vec<f32>, Vec<f32>) = (bias64.iter().map(|&v| v as f32).collect(), mult64.iter().map(|&v| v as f32).collect());
        for zero_point in [f64::from(zy) + 128.0, f64::from(zy)] {
            let margin = F32Twin::margin(&bias64, &mult64, zero_point).ok_or_else(|| TestCaseError::fail("no twin"))?;
            let twin = F32Twin { bias: &bias32, mult: &mult32, margin };
            let scales = Scales::F64 { bias: &bias64, mult: &mult64, zero_point, twin: Some(twin) };
            if zero_point > 100.0 {
                check_fused::<i8, i8, u8>((m, n, k), &a, za, &b, &zb, scales, ru)?;
            } else {
                check_fused::<u8, i8, i8>((m, n, k), &au, za + 128, &b, &zb, scales, ri)?;
            }
        }
    }
}

/// The body of [`convolution_matches_naive_windows`] for one case.
#[allow(clippy::too_many_arguments)]
fn check_conv(
    c: usize,
    m: usize,
    (kh, kw): (usize, usize),
    (h, w): (usize, usize),
    (sh, sw, dh, dw): (usize, usize, usize, usize),
    (ph, pw): (usize, usize),
    seed: u64,
    zx: u8,
    cut: usize,
    extra: usize,
) -> Result<(), TestCaseError> {
    let (eh, ew) = ((kh - 1) * dh + 1, (kw - 1) * dw + 1);
    prop_assume!(h + 2 * ph >= eh && w + 2 * pw >= ew);
    let (oh, ow) = ((h + 2 * ph - eh) / sh + 1, (w + 2 * pw - ew) / sw + 1);
    let batch = 2;
    // The window reads channels `off..off + c` of pixels `ps` apart.
    let (ps, off) = (c + extra, extra / 2);
    let win = ConvWindow {
        batch,
        input: (h, w),
        channels: c,
        pixel_stride: ps,
        kernel: (kh, kw),
        output: (oh, ow),
        stride: (sh, sw),
        dilation: (dh, dw),
        pad: (ph, pw),
    };
    let k = win.depth();
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let x: Vec<u8> = (0..batch * h * w * ps).map(|_| next() as u8).collect();
    let b: Vec<i8> = (0..k * m).map(|_| (next() % 128) as i8 - 64).collect();
    let typical = (k as f32).sqrt() * 64.0 * 100.0;
    let mult: Vec<f32> = (0..m)
        .map(|_| (0.5 + (next() % 1000) as f32 / 500.0) * 60.0 / typical)
        .collect();
    let bias: Vec<f32> = (0..m).map(|_| (next() % 2001) as f32 - 1000.0).collect();
    // Exact sums, window by window.
    let pixels = win.pixels();
    let mut want = vec![0u8; pixels * m];
    let mut want64 = vec![0u8; pixels * m];
    let mut all_sums = Vec::with_capacity(pixels * m);
    let (bias64, mult64): (Vec<f64>, Vec<f64>) = (
        bias.iter().map(|&v| f64::from(v)).collect(),
        mult.iter().map(|&v| f64::from(v) * 0.7).collect(),
    );
    for p in 0..pixels {
        let (bb, oy, ox) = (p / (oh * ow), (p / ow) % oh, p % ow);
        let sums: Vec<i32> = (0..m)
            .map(|j| {
                let mut acc = 0i32;
                for ky in 0..kh {
                    for kx in 0..kw {
                        for ch in 0..c {
                            let (iy, ix) = (
                                (oy * sh + ky * dh) as isize - ph as isize,
                                (ox * sw + kx * dw) as isize - pw as isize,
                            );
                            let v = if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                i32::from(zx)
                            } else {
                                i32::from(x[((bb * h + iy as usize) * w + ix as usize) * ps + off + ch])
                            };
                            acc += (v - i32::from(zx)) * i32::from(b[((ky * kw + kx) * c + ch) * m + j]);
                        }
                    }
                }
                acc
            })
            .collect();
        requantize_row_f32(&sums, &bias, &mult, 3.0, (0.0, 255.0), &mut want[p * m..(p + 1) * m]);
        all_sums.extend_from_slice(&sums);
        requantize_row(
            &sums,
            &bias64,
            &mult64,
            3.0,
            (0.0, 255.0),
            &mut want64[p * m..(p + 1) * m],
        );
    }
    let fail = |e: kiln_kernels::igemm::IgemmError| TestCaseError::fail(e.to_string());
    let stage = Requantize {
        scales: Scales::F32 {
            bias: &bias,
            mult: &mult,
            zero_point: 3.0,
        },
        range: (0, 255),
        sum: None,
    };
    let stage64 = Requantize {
        scales: Scales::F64 {
            bias: &bias64,
            mult: &mult64,
            zero_point: 3.0,
            twin: None,
        },
        range: (0, 255),
        sum: None,
    };
    let p0 = (cut * pixels / 7).min(pixels);
    let resid: Vec<u8> = (0..pixels * (m + extra)).map(|_| next() as u8).collect();
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        for packing in [Packing::Pairs, Packing::Quads] {
            let Some(packed) = PackedB::pack_as(packing, &b, k, m, &[]).map_err(fail)? else {
                continue;
            };
            let mut scratch = ConvScratch::default();
            // Y's rows `ldy` apart; the columns past `m` keep their 7s.
            let ldy = m + extra;
            let rows = pixels - p0;
            let xs = &x[off..];
            for (st, want, what) in [(stage, &want, "f32"), (stage64, &want64, "f64")] {
                let mut y = vec![7u8; rows * ldy];
                conv_requant_serial(isa, &win, xs, p0..pixels, zx, &packed, &mut scratch, st, &mut y, ldy)
                    .map_err(fail)?;
                for r in 0..rows {
                    prop_assert_eq!(
                        &y[r * ldy..r * ldy + m],
                        &want[(p0 + r) * m..(p0 + r + 1) * m],
                        "{} {:?} {:?} c={} k={}x{} row {}",
                        what,
                        isa,
                        packing,
                        c,
                        kh,
                        kw,
                        r
                    );
                    prop_assert!(
                        y[r * ldy + m..(r + 1) * ldy].iter().all(|&v| v == 7),
                        "wrote past column {}",
                        m
                    );
                }
                // A residual sum in the stage: the same bytes as `summed_stage`.
                let map = SumMap::of((0.05, 3.0), (0.03 + (seed % 7) as f32 * 0.01, 128.0), (0.07, 9.0));
                let floor = (seed % 3 == 0).then_some(9.0);
                let sum = ResidualSum::new(&resid[..rows * ldy], map, floor)
                    .ok_or_else(|| TestCaseError::fail("unbounded map"))?;
                let mut summed = vec![7u8; rows * ldy];
                let st_sum = Requantize { sum: Some(sum), ..st };
                conv_requant_serial(
                    isa,
                    &win,
                    xs,
                    p0..pixels,
                    zx,
                    &packed,
                    &mut scratch,
                    st_sum,
                    &mut summed,
                    ldy,
                )
                .map_err(fail)?;
                for r in 0..rows {
                    let mut after = vec![0u8; m];
                    let maps = ((0.05, 3.0), (0.03 + (seed % 7) as f32 * 0.01, 128.0), (0.07, 9.0));
                    let (row, res) = (&all_sums[(p0 + r) * m..(p0 + r + 1) * m], &resid[r * ldy..r * ldy + m]);
                    summed_stage(st.scales, row, st.range, res, maps, floor, &mut after);
                    prop_assert_eq!(
                        &summed[r * ldy..r * ldy + m],
                        &after[..],
                        "sum {} {:?} {:?} c={} k={}x{} row {}",
                        what,
                        isa,
                        packing,
                        c,
                        kh,
                        kw,
                        r
                    );
                    prop_assert!(
                        summed[r * ldy + m..(r + 1) * ldy].iter().all(|&v| v == 7),
                        "sum wrote past column {}",
                        m
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// The channels-last convolution (VNNI: window rows read in place through the tap table;
    /// else copied) against exact sums from a naive window loop, requantized by the row
    /// stage: padding, strides, dilation, a range of the output pixels, C not a multiple of
    /// four, windows deeper than one block, rows wide enough for whole tiles of windows
    /// inside X (their addresses formed by the kernel), whole 64-channel taps (read in place
    /// by the AMX tiles, 16 or 32 pixels of a row at a time); one group's channels of a wider X (`extra`
    /// channels around them per pixel) into one group's columns of a wider Y.
    #[test]
    fn convolution_matches_naive_windows(
        c in prop_oneof![Just(3usize), Just(4), Just(8), Just(12), Just(96), Just(64), Just(128)],
        m in 1usize..40,
        (kh, kw) in (1usize..4, 1usize..4),
        (h, w) in (1usize..9, 1usize..40),
        (sh, sw, dh, dw) in (1usize..3, 1usize..3, 1usize..3, 1usize..3),
        (ph, pw) in (0usize..3, 0usize..3),
        seed in any::<u64>(),
        zx in any::<u8>(),
        cut in 0usize..5,
        extra in prop_oneof![Just(0usize), Just(4), Just(5)],
    ) {
        check_conv(c, m, (kh, kw), (h, w), (sh, sw, dh, dw), (ph, pw), seed, zx, cut, extra)?;
    }

    /// Stride-1 convolutions of whole 64-channel taps, which the AMX tiles read from a padded
    /// copy of the input rows (flat rows of `ow + (kw - 1) * dw` pixels, the padding columns'
    /// sums dropped): every padding, dilation, narrow and wide rows, a range of pixels that
    /// starts and ends inside an image's row, on every level.
    #[test]
    fn stride_one_convolutions_of_whole_chunks(
        c in prop_oneof![Just(64usize), Just(128)],
        m in 1usize..40,
        (kh, kw) in (1usize..4, 1usize..6),
        (h, w) in (1usize..12, 1usize..24),
        (dh, dw) in (1usize..3, 1usize..3),
        (ph, pw) in (0usize..3, 0usize..3),
        seed in any::<u64>(),
        zx in any::<u8>(),
        cut in 0usize..5,
        extra in prop_oneof![Just(0usize), Just(4)],
    ) {
        check_conv(c, m, (kh, kw), (h, w), (1, 1, dh, dw), (ph, pw), seed, zx, cut, extra)?;

    }
}

/// A product of depth 0 is all zeros (whatever C held), on every level and format.
/// A B held about its type's center (u8 weights whose zero point leaves `B - zb` outside i8)
/// serves int32 sums only: the requantizing paths refuse it rather than drop its correction.
#[test]
fn requantizing_paths_refuse_a_centered_b() {
    let (m, k, n) = (20, 70, 40);
    let a: Vec<u8> = (0..m * k).map(|i| (i * 7 % 256) as u8).collect();
    let b: Vec<u8> = (0..k * n).map(|i| (i * 13 % 256) as u8).collect();
    let packed = PackedB::pack_for_sums(&b, k, n, &[3]).unwrap();
    let mut c = vec![0i32; m * n];
    igemm_serial(Isa::Portable, m, k, &a, k, 5, &packed, &mut c, n).unwrap();
    let want = oracle(m, n, k, &a, 5, &b, &[3u8]);
    assert!(c.iter().zip(&want).all(|(&x, &y)| i64::from(x) == y));
    if !kiln_kernels::isa::active().has_int8_dot() {
        // Without quads B falls back to pairs, which every path takes.
        assert_eq!(packed.packing(), Packing::Pairs);
        return;
    }
    let (bias, mult) = (vec![0.0f32; n], vec![0.01f32; n]);
    let stage = Requantize {
        scales: Scales::F32 {
            bias: &bias,
            mult: &mult,
            zero_point: 0.0,
        },
        range: (0, 255),
        sum: None,
    };
    let mut y = vec![0u8; m * n];
    let isa = kiln_kernels::isa::active();
    let got = igemm_requant_serial(isa, (m, k), &a, k, 5, &packed, &mut c, stage, &mut y, n);
    assert_eq!(got, Err(kiln_kernels::igemm::IgemmError::Centered));
    let got = igemm_requant_columns(isa, (m, k), &a, k, 5, &packed, stage, &mut y, n);
    assert_eq!(got, Err(kiln_kernels::igemm::IgemmError::Centered));
}

#[test]
fn depth_zero_writes_zeros() {
    let (m, n) = (3, 5);
    let b: Vec<i8> = vec![];
    for packing in [Packing::Pairs, Packing::Quads] {
        let packed = PackedB::pack_as(packing, &b, 0, n, &[])
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("empty B packs"));
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let mut c = vec![7i32; m * n];
            igemm_with(isa, m, 0, &[] as &[u8], 0, 3, &packed, &mut c, n).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c, vec![0; m * n], "{isa:?} {packing:?}");
        }
    }
}

/// The largest terms at the deepest exact depth, and past it (summed in i64 blocks).
#[test]
fn extreme_values_at_and_past_the_exact_depth() {
    for k in [MAX_EXACT_DEPTH, MAX_EXACT_DEPTH + 3] {
        let (m, n) = (2, 3);
        let a = vec![255u8; m * k];
        // B - zb = -255 in every term: (255 - 0) * (0 - 255).
        let b = vec![0u8; k * n];
        let zb = vec![255u8];
        let want = oracle(m, n, k, &a, 0, &b, &zb);
        let packed = PackedB::pack(&b, k, n, &zb).unwrap_or_else(|e| panic!("{e}"));
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let mut c = vec![0i32; m * n];
            let r = igemm_with(isa, m, k, &a, k, 0, &packed, &mut c, n);
            if want.iter().all(|&w| i32::try_from(w).is_ok()) {
                assert!(r.is_ok(), "{isa:?} k={k}: {r:?}");
                assert_eq!(
                    c.iter().map(|&v| i64::from(v)).collect::<Vec<_>>(),
                    want,
                    "{isa:?} k={k}"
                );
            } else {
                assert!(r.is_err(), "{isa:?} k={k}: an overflowing sum must be reported");
            }
        }
    }
}

/// Split over a pool's threads by blocks of rows: the same exact sums.
#[test]
fn split_over_threads_matches_the_oracle() {
    for threads in [2usize, 3] {
        let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap_or_else(|e| panic!("{e}"));
        for (m, n, k) in [(12, 17, 33), (50, 40, 700), (7, 5, 9), (128, 48, 96)] {
            let a: Vec<u8> = (0..m * k).map(|i| (i * 31 % 256) as u8).collect();
            let b: Vec<i8> = (0..k * n).map(|i| (i * 17 % 256) as u8 as i8).collect();
            let zb: Vec<i8> = (0..n).map(|j| (j as i8).wrapping_mul(3)).collect();
            for zb in [zb, vec![]] {
                let want = oracle(m, n, k, &a, 9, &b, &zb);
                let packed = PackedB::pack(&b, k, n, &zb).unwrap_or_else(|e| panic!("{e}"));
                for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
                    let mut c = vec![0i32; m * n];
                    pool.install(|| igemm_with(isa, m, k, &a, k, 9, &packed, &mut c, n))
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(
                        c.iter().map(|&v| i64::from(v)).collect::<Vec<_>>(),
                        want,
                        "{isa:?} {:?} {threads} threads {m}x{n}x{k}",
                        packed.packing()
                    );
                }
            }
        }
    }
}

/// Products of few rows split over a pool's threads by whole panels (in place for one row,
/// through scratch for several): the exact sums, and the fused stage's bytes, with nothing
/// written past the last column.
#[test]
fn few_rows_split_by_columns_match_the_oracle() {
    let mut s = 11u64;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    for threads in [2usize, 3] {
        let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap_or_else(|e| panic!("{e}"));
        for (m, n, k) in [
            (1, 1000, 300),
            (1, 200, 2700),
            (5, 330, 200),
            (15, 2 * threads * 32 + 1, 2600),
        ] {
            assert!(
                pool.install(|| splits_by_columns(m, k, n)),
                "{m}x{n}x{k} must split by columns"
            );
            let a: Vec<u8> = (0..m * k).map(|_| next() as u8).collect();
            let b: Vec<i8> = (0..k * n).map(|_| (next() % 128) as i8 - 64).collect();
            let zb: Vec<i8> = (0..n).map(|j| (j % 7) as i8 - 3).collect();
            let want = oracle(m, n, k, &a, 9, &b, &zb);
            let typical = (k as f32).sqrt() * 64.0 * 100.0;
            let mult: Vec<f32> = (0..n)
                .map(|_| (0.5 + (next() % 1000) as f32 / 500.0) * 60.0 / typical)
                .collect();
            let bias: Vec<f32> = (0..n).map(|_| (next() % 2001) as f32 - 1000.0 + 0.25).collect();
            let scales = Scales::F32 {
                bias: &bias,
                mult: &mult,
                zero_point: 3.0,
            };
            let mut want_y = vec![0u8; m * n];
            for (row, out) in want.chunks(n).zip(want_y.chunks_mut(n)) {
                let sums: Vec<i32> = row.iter().map(|&v| v as i32).collect();
                row_stage(scales, &sums, (0, 255), out);
            }
            let packed = PackedB::pack_as(Packing::Quads, &b, k, n, &zb)
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("quads"));
            for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
                let ld = n + 3;
                let mut c = vec![-5i32; m * ld];
                pool.install(|| igemm_with(isa, m, k, &a, k, 9, &packed, &mut c, ld))
                    .unwrap_or_else(|e| panic!("{e}"));
                let mut y = vec![7u8; m * ld];
                let stage = Requantize {
                    scales,
                    range: (0, 255),
                    sum: None,
                };
                pool.install(|| igemm_requant_columns(isa, (m, k), &a, k, 9, &packed, stage, &mut y, ld))
                    .unwrap_or_else(|e| panic!("{e}"));
                for i in 0..m {
                    let got: Vec<i64> = c[i * ld..i * ld + n].iter().map(|&v| i64::from(v)).collect();
                    assert_eq!(
                        got,
                        want[i * n..(i + 1) * n],
                        "{isa:?} {threads} threads {m}x{n}x{k} row {i}"
                    );
                    assert_eq!(
                        &y[i * ld..i * ld + n],
                        &want_y[i * n..(i + 1) * n],
                        "{isa:?} {m}x{n}x{k} row {i}"
                    );
                    assert_eq!(c[i * ld + n..(i + 1) * ld], [-5; 3], "{isa:?} wrote past column {n}");
                    assert_eq!(y[i * ld + n..(i + 1) * ld], [7; 3], "{isa:?} wrote past column {n}");
                }
            }
        }
    }
}

/// The f64 stage with its f32 twin where f32 and f64 round apart: products a hair above or
/// below a half (`(k + 0.5) / t`, nudged by one part in 10^9, times a sum of exactly `t`),
/// which f32 cannot tell from the half itself. Every such value must take the tile's f64
/// path and round as the row stage does (up or down, not to even).
#[test]
fn near_halves_take_the_f64_path() {
    // Sums 1..=64 (one depth, weight 1); 32 columns, each aiming one row at a near-half.
    let (m, n, k) = (64usize, 32usize, 1usize);
    let a: Vec<u8> = (1..=m as u8).collect();
    let b = vec![1i8; n];
    let mult64: Vec<f64> = (0..n)
        .map(|j| {
            let (t, half) = ((j % 16 + 3) as f64 * 3.0, (j % 7) as f64 * 2.0 + 0.5);
            let nudge = if j % 2 == 0 { 1.0 + 1e-9 } else { 1.0 - 1e-9 };
            half / t * nudge
        })
        .collect();
    let bias64 = vec![0.0f64; n];
    let (bias32, mult32): (Vec<f32>, Vec<f32>) = (vec![0.0; n], mult64.iter().map(|&v| v as f32).collect());
    for zero_point in [0.0, 1.0] {
        let margin = F32Twin::margin(&bias64, &mult64, zero_point).unwrap_or_else(|| panic!("a twin"));
        let twin = F32Twin {
            bias: &bias32,
            mult: &mult32,
            margin,
        };
        let scales = Scales::F64 {
            bias: &bias64,
            mult: &mult64,
            zero_point,
            twin: Some(twin),
        };
        check_fused::<u8, i8, u8>((m, n, k), &a, 0, &b, &[], scales, (0, 255)).unwrap_or_else(|e| panic!("{e}"));
    }
    // The case is real: f32 alone rounds some of these values otherwise.
    let mut apart = 0;
    for (j, (&m64, &m32)) in mult64.iter().zip(&mult32).enumerate() {
        let t = (j % 16 + 3) * 3;
        let (v64, v32) = (t as f64 * m64, t as f32 * m32);
        apart += usize::from(v64.round_ties_even() != f64::from(v32.round_ties_even()));
    }
    assert!(apart >= 4, "{apart}");
}

/// A B wider than one column block of the quads kernel (its packed depth block past
/// `B_BLOCK_BYTES`), deep enough for several depth blocks: the sums and the fused stage
/// against the oracle, on every level.
#[test]
fn wide_products_in_column_blocks() {
    // 11 rows (VNNI) and 50 (on AMX: a whole block of 32 and an edge block of 18, whose
    // partial sums wait in scratch between depth blocks).
    for m in [11usize, 50] {
        wide_product(m);
    }
}

fn wide_product(m: usize) {
    let (n, k) = (1100usize, 2600usize);
    let mut s = 7u64;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let a: Vec<u8> = (0..m * k).map(|_| next() as u8).collect();
    let b: Vec<i8> = (0..k * n).map(|_| (next() % 128) as i8 - 64).collect();
    let zb: Vec<i8> = (0..n).map(|j| (j % 11) as i8 - 5).collect();
    let want = oracle(m, n, k, &a, 9, &b, &zb);
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        for packing in [Packing::Pairs, Packing::Quads] {
            let Some(packed) = PackedB::pack_as(packing, &b, k, n, &zb).unwrap_or_else(|e| panic!("{e}")) else {
                continue;
            };
            let mut c = vec![0i32; m * n];
            igemm_with(isa, m, k, &a, k, 9, &packed, &mut c, n).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                c.iter().zip(&want).all(|(&g, &w)| i64::from(g) == w),
                "{isa:?} {packing:?}"
            );
        }
    }
    let typical = (k as f32).sqrt() * 64.0 * 100.0;
    let mult: Vec<f32> = (0..n)
        .map(|j| (0.5 + (j % 13) as f32 / 10.0) * 60.0 / typical)
        .collect();
    let bias: Vec<f32> = (0..n).map(|j| (j % 101) as f32 * 20.0 - 1000.0).collect();
    let scales = Scales::F32 {
        bias: &bias,
        mult: &mult,
        zero_point: 128.0,
    };
    check_fused::<u8, i8, u8>((m, n, k), &a, 9, &b, &zb, scales, (0, 255)).unwrap_or_else(|e| panic!("{e}"));
}

/// Where the integer GEMM runs on AMX tiles, products of 16 rows or more never reach the VNNI
/// micro-tiles in this process: the whole file again in a child process capped at VNNI
/// (`KILN_KERNELS=vnni`), so both paths are held against the oracle on such a CPU.
#[test]
fn vnni_micro_tiles_where_amx_runs() {
    if !Isa::Avx512.has_int8_tiles() || std::env::var_os("KILN_KERNELS").is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(exe)
        .env("KILN_KERNELS", "vnni")
        .args(["--skip", "vnni_micro_tiles_where_amx_runs"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    // The child ran the tests (not zero of them) on VNNI.
    assert!(
        text.contains("test result: ok.") && !text.contains("ok. 0 passed"),
        "{text}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Stride-1 convolutions whose taps are not whole 64-channel chunks, on the AMX tiles by
    /// kernel rows (B `[ky][kx * c + ch]`, each row padded with zero weights to
    /// `conv_row_run`'s run): the padded copy's runs read past each kernel row's taps, times
    /// zero. Against exact sums of a naive window loop, requantized by the row stage; where
    /// `conv_reads_flat` says the tiles take it, they must.
    #[test]
    fn convolutions_by_kernel_rows_match_naive_windows(
        c in prop_oneof![Just(1usize), Just(3), Just(16), Just(32), Just(48), Just(60)],
        m in 1usize..40,
        (kh, kw) in (1usize..4, 2usize..4),
        (h, w) in (1usize..10, 4usize..24),
        dh in 1usize..3,
        (ph, pw) in (0usize..3, 0usize..3),
        seed in any::<u64>(),
        zx in any::<u8>(),
        cut in 0usize..5,
        extra in prop_oneof![Just(0usize), Just(8)],
    ) {
        let eh = (kh - 1) * dh + 1;
        prop_assume!(h + 2 * ph >= eh && w + 2 * pw >= kw);
        let (oh, ow) = (h + 2 * ph - eh + 1, w + 2 * pw - kw + 1);
        let batch = 2;
        let ps = c + extra;
        let win = ConvWindow { batch, input: (h, w), channels: c, pixel_stride: ps, kernel: (kh, kw), output: (oh, ow), stride: (1, 1), dilation: (dh, 1), pad: (ph, pw) };
        let isa = Isa::Avx512;
        let Some(kr) = kiln_kernels::igemm::conv_row_run(isa, &win) else { return Ok(()) };
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let x: Vec<u8> = (0..batch * h * w * ps).map(|_| next() as u8).collect();
        // Weights [ky][kx][ch][j], and B by kernel rows with zero weights past each row's taps.
        let wt: Vec<i8> = (0..kh * kw * c * m).map(|_| (next() % 128) as i8 - 64).collect();
        let mut b = vec![0i8; kh * kr * m];
        for ky in 0..kh { for t in 0..kw * c { for j in 0..m {
            b[(ky * kr + t) * m + j] = wt[(ky * kw * c + t) * m + j];
        }}}
        let typical = ((kh * kw * c) as f32).sqrt() * 64.0 * 100.0;
        let mult: Vec<f32> = (0..m).map(|_| (0.5 + (next() % 1000) as f32 / 500.0) * 60.0 / typical).collect();
        let bias: Vec<f32> = (0..m).map(|_| (next() % 2001) as f32 - 1000.0).collect();
        let pixels = win.pixels();
        let mut want = vec![0u8; pixels * m];
        for p in 0..pixels {
            let (bb, oy, ox) = (p / (oh * ow), (p / ow) % oh, p % ow);
            let sums: Vec<i32> = (0..m).map(|j| {
                let mut acc = 0i32;
                for ky in 0..kh { for kx in 0..kw { for ch in 0..c {
                    let (iy, ix) = ((oy + ky * dh) as isize - ph as isize, (ox + kx) as isize - pw as isize);
                    let v = if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize { i32::from(zx) } else { i32::from(x[((bb * h + iy as usize) * w + ix as usize) * ps + ch]) };
                    acc += (v - i32::from(zx)) * i32::from(wt[((ky * kw + kx) * c + ch) * m + j]);
                }}}
                acc
            }).collect();
            requantize_row_f32(&sums, &bias, &mult, 3.0, (0.0, 255.0), &mut want[p * m..(p + 1) * m]);
        }
        let fail = |e: kiln_kernels::igemm::IgemmError| TestCaseError::fail(e.to_string());
        let stage = Requantize { scales: Scales::F32 { bias: &bias, mult: &mult, zero_point: 3.0 }, range: (0, 255), sum: None };
        let packed = PackedB::pack_as(Packing::Quads, &b, kh * kr, m, &[]).map_err(fail)?.ok_or_else(|| TestCaseError::fail("no quads"))?;
        let p0 = (cut * pixels / 7).min(pixels);
        let rows = pixels - p0;
        let ldy = m + 3;
        let mut y = vec![7u8; rows * ldy];
        let mut scratch = ConvScratch::default();
        let ran = kiln_kernels::igemm::conv_rows_requant_serial(isa, &win, kr, &x, p0..pixels, zx, &packed, &mut scratch, stage, &mut y, ldy).map_err(fail)?;
        prop_assert_eq!(ran, kiln_kernels::igemm::conv_reads_flat(isa, &win, Some(kr)) || rows == 0, "ran on the tiles where they fit");
        if ran {
            for r in 0..rows {
                prop_assert_eq!(&y[r * ldy..r * ldy + m], &want[(p0 + r) * m..(p0 + r + 1) * m], "c={} k={}x{} dh={} row {}", c, kh, kw, dh, r);
                prop_assert!(y[r * ldy + m..(r + 1) * ldy].iter().all(|&v| v == 7), "wrote past column {}", m);
            }
        }
    }
}

/// One-row products (a decoder's token: the VNNI tile multiplies that row only) on every
/// level against the oracle: u8 and s8 A, per-column zero points, narrow and wide panels,
/// depths within and across blocks; and fused into requantized bytes.
#[test]
fn one_row_products_match_the_oracle() {
    let mut s = 77u64;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    for (n, k) in [(1usize, 4usize), (16, 63), (33, 130), (70, 777), (100, 2100)] {
        let a: Vec<i8> = (0..k).map(|_| next() as i8).collect();
        let au: Vec<u8> = a.iter().map(|&v| v as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|_| (next() % 128) as i8 - 64).collect();
        let zb: Vec<i8> = (0..n).map(|_| (next() % 16) as i8 - 8).collect();
        check(1, n, k, &a, -5, &b, &zb).unwrap_or_else(|e| panic!("s8 n={n} k={k}: {e}"));
        check(1, n, k, &au, 131, &b, &zb).unwrap_or_else(|e| panic!("u8 n={n} k={k}: {e}"));
        let mult: Vec<f32> = (0..n).map(|j| 0.0004 + 0.00001 * j as f32).collect();
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 3.0 - 50.0).collect();
        let scales = Scales::F32 {
            bias: &bias,
            mult: &mult,
            zero_point: 100.0,
        };
        check_fused::<u8, i8, u8>((1, n, k), &au, 131, &b, &zb, scales, (0, 255))
            .unwrap_or_else(|e| panic!("fused n={n} k={k}: {e}"));
    }
}
