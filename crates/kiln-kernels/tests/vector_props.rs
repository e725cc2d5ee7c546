//! Property tests of the row kernels: every level the CPU has (the portable one always)
//! against f64 oracles.
//!
//! Tolerances: the exponential is accepted within 4 ulp of the f64 value (the polynomial is
//! within ~1; the input `x - shift` is rounded once more). A softmax element `e_i / S` with
//! `S` summed in f32 over `n` terms is within `(4 + gamma_n / u + 2) ulp` relative of
//! the exact ratio, so the test allows `(n + 8) u` relative plus `1e-30` absolute for results
//! in the subnormal range. Layer normalisation computes statistics in f64 and rounds the
//! mean and inverse deviation to f32 before three f32 operations: within `8 u (|y| + |z
//! scale|)`, `z` the normalised value, whose cancellation `x - mean` the rounding of the
//! mean can perturb.

#![allow(clippy::unwrap_used, clippy::panic)]

use kiln_kernels::isa::Isa;
use kiln_kernels::vector::{
    STATE_MAX, copy_run, dot_rows_i8, dot_rows_i8_state_with, exp_shift_sum_with, extreme, layer_norm_row,
    log_softmax_row_with, max, max_into_with, nan_into_with, quantize_state, softmax_row_with,
    softmax_unnormalized_row_with,
};
use proptest::prelude::*;

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn levels() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

fn row() -> impl Strategy<Value = Vec<f32>> {
    (0usize..70, any::<u64>(), 0.1f32..30.0).prop_map(|(n, seed, mag)| {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * mag
            })
            .collect()
    })
}

fn softmax_f64(x: &[f32]) -> Vec<f64> {
    let m = x.iter().map(|&v| f64::from(v)).fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|&v| (f64::from(v) - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

proptest! {
    #[test]
    fn max_matches_fold(x in row()) {
        let want = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        prop_assert_eq!(max(&x), want);
    }

    #[test]
    fn extremes_match_folds(mut x in row(), nans in proptest::collection::vec(0usize..70, 0..3)) {
        for &i in &nans {
            if let Some(v) = x.get_mut(i) {
                *v = f32::NAN;
            }
        }
        let numbers = x.iter().copied().filter(|v| !v.is_nan());
        let has_nan = x.iter().any(|v| v.is_nan());
        prop_assert_eq!(extreme(&x, true), (numbers.clone().fold(f32::NEG_INFINITY, f32::max), has_nan));
        prop_assert_eq!(extreme(&x, false), (numbers.fold(f32::INFINITY, f32::min), has_nan));
    }

    #[test]
    fn exp_sum_every_level(x in row(), shift in -5.0f32..5.0) {
        for isa in levels() {
            let mut r = x.clone();
            let sum = exp_shift_sum_with(isa, &mut r, shift);
            let mut want_sum = 0.0f64;
            for (&got, &v) in r.iter().zip(&x) {
                let want = (f64::from(v) - f64::from(shift)).exp();
                want_sum += want;
                let tol = 4.0 * U * want * (1.0 + (f64::from(v) - f64::from(shift)).abs()) + 1e-30;
                prop_assert!((f64::from(got) - want).abs() <= tol, "{isa:?}: e^({v} - {shift}) = {got}, want {want}");
            }
            let tol = (x.len() as f64 + 8.0) * U * want_sum * 4.0 + 1e-30;
            prop_assert!((f64::from(sum) - want_sum).abs() <= tol, "{isa:?}: sum {sum}, want {want_sum}");
        }
    }

    #[test]
    fn softmax_every_level(x in row()) {
        let want = softmax_f64(&x);
        for isa in levels() {
            let mut r = x.clone();
            softmax_row_with(isa, &mut r);
            let n = x.len() as f64;
            // `x - max` rounds by up to U |x - max| before the exp amplifies it: the bound
            // grows with |x| + |max|, not |x| alone.
            let m = x.iter().fold(0.0f64, |a, &v| a.max(f64::from(v).abs()));
            for (i, (&got, &w)) in r.iter().zip(&want).enumerate() {
                let tol = (n + 8.0) * U * w * (1.0 + f64::from(x[i].abs()) + m) + 1e-30;
                prop_assert!((f64::from(got) - w).abs() <= tol, "{isa:?} [{i}]: {got} vs {w}");
            }
            let mut l = x.clone();
            let mut scratch = Vec::new();
            log_softmax_row_with(isa, &mut l, &mut scratch);
            for (i, (&got, &w)) in l.iter().zip(&want).enumerate() {
                let w = w.ln();
                let tol = (n + 8.0) * U * (1.0 + w.abs() + f64::from(x[i].abs()));
                prop_assert!((f64::from(got) - w).abs() <= tol, "{isa:?} log [{i}]: {got} vs {w}");
            }
        }
    }

    /// The attention softmax left unnormalised, times the `1 / sum` it returns, against the
    /// f64 softmax of `scale x + mask`: positive scales (folded into the exponential),
    /// non-positive ones (a scaling pass first), with and without an additive mask (some
    /// entries -inf, or a mask shorter than the row). The same bound as `softmax_every_level`
    /// on the values `z = scale x + mask`, plus the rounding of the product by `1 / sum`.
    #[test]
    fn unnormalized_softmax_every_level(
        x in row(),
        scale in prop_oneof![0.01f32..2.0, -1.0f32..=0.0],
        mask_kind in 0u8..3,
        seed in any::<u32>(),
    ) {
        let mask: Option<Vec<f32>> = match mask_kind {
            0 => None,
            1 => Some((0..x.len()).map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761) ^ seed;
                if h.is_multiple_of(5) { f32::NEG_INFINITY } else { (h % 7) as f32 - 3.0 }
            }).collect()),
            _ => Some((0..x.len() / 2).map(|i| ((i as u32 ^ seed) % 3) as f32).collect()),
        };
        // z = scale x + mask, rounded as the kernel's masked pass rounds it (it is the input
        // of the softmax, not part of its error).
        let z: Vec<f32> = x.iter().enumerate().map(|(i, &v)| {
            let s = v * scale;
            match mask.as_ref().and_then(|m| m.get(i)) {
                Some(&b) => s + b,
                None => s,
            }
        }).collect();
        let all_masked = mask_kind == 1 && !z.is_empty() && z.iter().all(|&v| v == f32::NEG_INFINITY);
        let want = softmax_f64(&z);
        for isa in levels() {
            let mut r = x.clone();
            let inv = softmax_unnormalized_row_with(isa, &mut r, scale, mask.as_deref());
            if all_masked {
                prop_assert_eq!(inv, 0.0);
                prop_assert!(r.iter().all(|&v| v == 0.0), "{:?}: {:?}", isa, r);
                continue;
            }
            let n = x.len() as f64;
            let m = z.iter().filter(|v| v.is_finite()).fold(0.0f64, |a, &v| a.max(f64::from(v).abs()));
            for (i, (&got, &w)) in r.iter().zip(&want).enumerate() {
                let got = f64::from(got * inv);
                let zi = if z[i].is_finite() { f64::from(z[i].abs()) } else { 0.0 };
                let tol = (n + 10.0) * U * w * (1.0 + zi + m) + 1e-30;
                prop_assert!((got - w).abs() <= tol, "{isa:?} [{i}]: {got} vs {w} (scale {scale})");
            }
        }
    }

    #[test]
    fn layer_norm_matches_f64(x in row(), seed in any::<u32>(), with_bias in any::<bool>()) {
        let n = x.len();
        let scale: Vec<f32> = (0..n).map(|i| 0.5 + ((i as u32 ^ seed) % 7) as f32 / 4.0).collect();
        let bias: Vec<f32> = (0..n).map(|i| ((i as u32).wrapping_mul(seed) % 5) as f32 - 2.0).collect();
        let mut y = vec![0.0f32; n];
        let eps = 1e-5;
        let (mean, inv) = layer_norm_row(&x, &mut y, &scale, with_bias.then_some(&bias[..]), eps);
        if n == 0 {
            return Ok(());
        }
        let m = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = x.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / n as f64;
        let k = 1.0 / (var + eps).sqrt();
        prop_assert!((mean - m).abs() <= 1e-12 * (1.0 + m.abs()));
        prop_assert!((inv - k).abs() <= 1e-12 * k);
        for i in 0..n {
            let z = (f64::from(x[i]) - m) * k;
            let b = if with_bias { f64::from(bias[i]) } else { 0.0 };
            let want = z * f64::from(scale[i]) + b;
            let tol = 8.0 * U * (want.abs() + (z * f64::from(scale[i])).abs() + k * f64::from(x[i].abs()) * f64::from(scale[i]));
            prop_assert!((f64::from(y[i]) - want).abs() <= tol + 1e-30, "[{i}]: {} vs {want}", y[i]);
        }
    }
}

#[test]
fn softmax_special_rows() {
    for isa in levels() {
        let mut r = vec![f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        softmax_row_with(isa, &mut r);
        assert_eq!(r, vec![0.0, 1.0, 0.0], "{isa:?}");
        let mut r = vec![1.0, f32::NAN, 2.0];
        softmax_row_with(isa, &mut r);
        assert!(r.iter().all(|v| v.is_nan()), "{isa:?}: {r:?}");
        let mut r: Vec<f32> = vec![];
        softmax_row_with(isa, &mut r);
        // A row of 40 equal values: exactly 1/40 each.
        let mut r = vec![3.5f32; 40];
        softmax_row_with(isa, &mut r);
        assert!(
            r.iter().all(|&v| (v - 0.025).abs() <= 0.025 * 4.0 * U as f32),
            "{isa:?}: {r:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Products of a vector by int8 rows with a scale per row, against the f64 sums: any
    /// depth (the sixteen-lane body and its tail), any row count (groups of four and the
    /// rest), within the f32 rounding of a sum of `k` terms (`(k + 2) u` of the sum of the
    /// terms' magnitudes); rows past `out` untouched.
    #[test]
    fn int8_rows_match_f64_sums(k in 0usize..90, n in 0usize..11, seed in any::<u64>()) {
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let a: Vec<f32> = (0..k).map(|_| next() as f32 / 2_147_483_648.0 - 1.0).collect();
        let q: Vec<i8> = (0..n * k).map(|_| next() as i8).collect();
        let scale: Vec<f32> = (0..n).map(|_| (next() % 1000) as f32 * 1e-4).collect();
        let mut out = vec![7f32; n + 1];
        dot_rows_i8(&a, &q, &scale, &mut out[..n]);
        for j in 0..n {
            let row = &q[j * k..(j + 1) * k];
            let exact: f64 = row.iter().zip(&a).map(|(&c, &x)| f64::from(c) * f64::from(x)).sum::<f64>() * f64::from(scale[j]);
            let mag: f64 = row.iter().zip(&a).map(|(&c, &x)| (f64::from(c) * f64::from(x)).abs()).sum::<f64>() * f64::from(scale[j]);
            let tol = (k as f64 + 2.0) * f64::from(f32::EPSILON) * mag + 1e-30;
            prop_assert!((f64::from(out[j]) - exact).abs() <= tol, "row {} of {}: {} vs {}", j, n, out[j], exact);
        }
        prop_assert_eq!(out[n], 7.0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A state quantized to i16 codes times int8 rows: at every level exactly the i64 sum of
    /// the codes' products scaled in f64 and rounded once (depths past one 1024-deep block
    /// and any tail, row counts past groups of four), so within the state's rounding
    /// (`s / 2` per element) of the f32 state's product; rows past `out` untouched.
    #[test]
    fn quantized_state_rows_are_exact(
        k in prop_oneof![0usize..70, 1000usize..2100],
        n in 0usize..11,
        seed in any::<u64>(),
        mag in 1e-3f32..50.0,
    ) {
        let mut s = seed;
        let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u32 };
        let a: Vec<f32> = (0..k).map(|_| (next() as f32 / 2_147_483_648.0 - 1.0) * mag).collect();
        // Extreme codes too: -128 and 127.
        let q: Vec<i8> = (0..n * k).map(|_| next() as i8).collect();
        let scale: Vec<f32> = (0..n).map(|_| (next() % 1000) as f32 * 1e-4).collect();
        let mut codes = Vec::new();
        let step = quantize_state(&a, &mut codes).unwrap();
        prop_assert_eq!(codes.len(), k);
        let largest = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (&x, &c) in a.iter().zip(&codes) {
            prop_assert!(i32::from(c).abs() <= STATE_MAX);
            prop_assert!((f64::from(x) - f64::from(step) * f64::from(c)).abs() <= f64::from(step) * 0.5 + f64::from(largest) * 1e-6);
        }
        for isa in levels() {
            let mut out = vec![7f32; n + 1];
            dot_rows_i8_state_with(isa, &codes, step, &q, &scale, &mut out[..n]);
            for j in 0..n {
                let row = &q[j * k..(j + 1) * k];
                let exact: i64 = row.iter().zip(&codes).map(|(&w, &c)| i64::from(w) * i64::from(c)).sum();
                let want = (exact as f64 * (f64::from(scale[j]) * f64::from(step))) as f32;
                prop_assert_eq!(out[j].to_bits(), want.to_bits(), "{:?} row {} of {}", isa, j, n);
                let float: f64 = row.iter().zip(&a).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum::<f64>() * f64::from(scale[j]);
                let bound = row.iter().map(|&w| f64::from(w).abs()).sum::<f64>() * f64::from(scale[j]) * (f64::from(step) * 0.5 + f64::from(largest) * 1e-6);
                prop_assert!((f64::from(out[j]) - float).abs() <= bound + float.abs() * 1e-6 + 1e-30);
            }
            prop_assert_eq!(out[n], 7.0);
        }
    }
}

/// A state with a NaN or an infinity has no codes; an all-zero one has step 0.
#[test]
fn quantized_states_refuse_non_finite_values() {
    let mut codes = vec![5i16; 3];
    assert_eq!(quantize_state(&[1.0, f32::NAN], &mut codes), None);
    assert_eq!(quantize_state(&[f32::INFINITY, 1.0], &mut codes), None);
    assert_eq!(quantize_state(&[0.0, -0.0, 0.0], &mut codes), Some(0.0));
    assert_eq!(codes, vec![0, 0, 0]);
    assert_eq!(quantize_state(&[-2.0, 1.0, 0.5], &mut codes), Some(2.0 / 32767.0));
    assert_eq!(codes, vec![-32767, 16384, 8192]);
}

/// Runs of every length from 0 to 69 (the fixed-size moves below 8, the 8-float chunks and
/// their 4/2/1 tails, the library copy from 64): a copy, bit for bit, and nothing past it.
#[test]
fn copy_run_copies_every_length() {
    for n in 0..70usize {
        let src: Vec<f32> = (0..n).map(|i| i as f32 * 1.5 - 7.0).collect();
        let mut dst = vec![f32::NAN; n + 3];
        copy_run(&mut dst[..n], &src);
        assert_eq!(&dst[..n], &src[..], "length {n}");
        assert!(dst[n..].iter().all(|v| v.is_nan()), "length {n}: wrote past the run");
    }
}

/// A row with NaNs and infinities sprinkled in (every `k`-th element, by `seed`).
fn with_specials(mut v: Vec<f32>, seed: u64) -> Vec<f32> {
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];
    let k = 3 + (seed % 5) as usize;
    for (i, x) in v.iter_mut().enumerate() {
        if (i + seed as usize) % k == 0 {
            *x = specials[(i / k + seed as usize) % specials.len()];
        }
    }
    v
}

proptest! {
    /// The max pool's steps on every level, bit for bit against the scalar rule (`src > dst`
    /// keeps `src`, so NaNs in `src` are skipped and those in `dst` kept; a NaN in `src`
    /// replaces for `nan_into`), over rows of any length (whole vectors and tails), with
    /// NaNs and infinities on both sides; past the shorter operand nothing changes.
    #[test]
    fn max_and_nan_steps_match_the_scalar_rule(a in row(), b in row(), seed in any::<u64>()) {
        let (a, b) = (with_specials(a, seed), with_specials(b, seed / 7));
        for isa in levels() {
            let mut m = a.clone();
            max_into_with(isa, &mut m, &b);
            let mut n = a.clone();
            nan_into_with(isa, &mut n, &b);
            for i in 0..a.len() {
                let (d, s) = (a[i], b.get(i).copied());
                let (want_m, want_n) = match s {
                    Some(s) => (if s > d { s } else { d }, if s.is_nan() { s } else { d }),
                    None => (d, d),
                };
                prop_assert_eq!(m[i].to_bits(), want_m.to_bits(), "{:?} max [{}]: {} vs {:?}", isa, i, d, s);
                prop_assert_eq!(n[i].to_bits(), want_n.to_bits(), "{:?} nan [{}]: {} vs {:?}", isa, i, d, s);
            }
        }
    }
}
