//! The 8-bit depthwise pixel kernel on every level against its scalar twin (the portable
//! path), over channel counts that exercise the 16-wide blocks and the masked tail, windows
//! of any shape and offset, pixels one or two pixels apart in runs of 1-9 (the 4-pixel groups
//! and their remainder), u8 and i8 bytes, and taps over i16's whole range.

use kiln_kernels::isa::Isa;
use kiln_kernels::qdwconv::{QPixels, QUAD, QuadBand, QuadRequant, QuadRow, QuadTaps, pack_quad_taps, quad_code};
use proptest::prelude::*;

fn words(n: usize, seed: u64) -> Vec<u64> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
        .collect()
}

proptest! {
    /// A row packed as quads holds, in every quad and byte, the padded row's code written out.
    #[test]
    fn quad_rows_hold_the_padded_codes(
        c in 1usize..=70,
        w in 0usize..=9,
        pad in 0usize..=3,
        extra in 0usize..=6,
        dilation in 1usize..=3,
        signed in any::<bool>(),
        fill in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let x: Vec<u8> = words(w * c, seed).iter().map(|&v| (v >> 40) as u8).collect();
        let row = QuadRow { x: &x, signed, c, pad, fill, dilation };
        let pw = w + pad + extra;
        let mut got = vec![7u32; pw * c];
        prop_assert!(row.pack(&mut got));
        for px in 0..pw {
            for ch in 0..c {
                for j in 0..QUAD {
                    let col = (px + j * dilation).checked_sub(pad).filter(|&i| i < w);
                    let b = col.map_or(fill, |i| x[i * c + ch]);
                    prop_assert_eq!((got[px * c + ch] >> (8 * j)) as u8, quad_code(b, signed));
                }
            }
        }
    }

    /// Rows packed as quads and summed with packed taps: every pixel's every channel is the
    /// depthwise window's sum of `code(x) * w` written out.
    #[test]
    fn quad_taps_give_the_window_sums(
        c in 1usize..=70,
        kh in 1usize..=3,
        kw in 1usize..=9,
        stride in 1usize..=2,
        dilation in 1usize..=2,
        count in 1usize..=19,
        pad in 0usize..=4,
        signed in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let w = count * stride + 3;
        let groups = kw.div_ceil(QUAD);
        let pw = (count - 1) * stride + (groups - 1) * QUAD * dilation + 1;
        let images: Vec<Vec<u8>> = (0..kh as u64)
            .map(|r| words(w * c, seed ^ (r + 1)).iter().map(|&v| (v >> 40) as u8).collect())
            .collect();
        let rows: Vec<Vec<u32>> = images
            .iter()
            .map(|x| {
                let mut q = vec![0u32; pw * c];
                assert!(QuadRow { x, signed, c, pad, fill: 3, dilation }.pack(&mut q));
                q
            })
            .collect();
        let rows: Vec<&[u32]> = rows.iter().map(|r| &r[..]).collect();
        // Taps over i8's whole range, its ends included.
        let taps: Vec<i8> = words(kh * kw * c, seed ^ 5)
            .iter()
            .map(|&v| match v % 8 {
                0 => i8::MIN,
                1 => i8::MAX,
                _ => (v >> 30) as i8,
            })
            .collect();
        let packed = pack_quad_taps(&taps, (kh, kw), c).unwrap();
        let init: Vec<i32> = words(c, seed ^ 9).iter().map(|&v| (v >> 40) as i32 - (1 << 23)).collect();
        let call = QuadTaps { rows: &rows, taps: &packed, init: &init, groups, stride, reach: QUAD * dilation, c };
        let mut got = vec![7i32; count * c];
        prop_assert!(call.run(&mut got));
        for p in 0..count {
            for ch in 0..c {
                let mut sum = init[ch];
                for (r, x) in images.iter().enumerate() {
                    for kx in 0..kw {
                        let col = (p * stride + kx * dilation).checked_sub(pad).filter(|&i| i < w);
                        let b = col.map_or(3, |i| x[i * c + ch]);
                        sum += i32::from(quad_code(b, signed)) * i32::from(taps[(r * kw + kx) * c + ch]);
                    }
                }
                prop_assert_eq!(got[p * c + ch], sum, "pixel {} channel {}", p, ch);
            }
        }
    }

    /// A requantized band of output rows on every level equals the portable twin's bytes,
    /// and the twin's byte at a spot is the window's sum requantized as written out: u8 and
    /// i8 in and out, kernels of one to three quads a row, strides, dilations, pads, bands
    /// starting inside the image, masked channel tails.
    #[test]
    fn quad_bands_match_the_scalar_twin(
        c in 1usize..=40,
        (h, w) in (1usize..=7, 1usize..=21),
        (kh, kw) in (1usize..=3, 1usize..=9),
        (sh, sw) in (1usize..=2, 1usize..=2),
        (dh, dw) in (1usize..=2, 1usize..=2),
        (ph, pw) in (0usize..=2, 0usize..=4),
        signed in any::<bool>(),
        out_signed in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (span_h, span_w) = ((kh - 1) * dh + 1, (kw - 1) * dw + 1);
        prop_assume!(h + 2 * ph >= span_h && w + 2 * pw >= span_w);
        let (oh, ow) = ((h + 2 * ph - span_h) / sh + 1, (w + 2 * pw - span_w) / sw + 1);
        let x: Vec<u8> = words(h * w * c, seed).iter().map(|&v| (v >> 40) as u8).collect();
        let taps: Vec<i8> = words(kh * kw * c, seed ^ 5).iter().map(|&v| (v >> 30) as i8).collect();
        let packed = pack_quad_taps(&taps, (kh, kw), c).unwrap();
        let init: Vec<i32> = words(c, seed ^ 9).iter().map(|&v| (v >> 50) as i32 - (1 << 13)).collect();
        let bias: Vec<f32> = words(c, seed ^ 13).iter().map(|&v| ((v >> 40) % 4001) as f32 - 2000.0).collect();
        let mult: Vec<f32> = words(c, seed ^ 17).iter().map(|&v| 1e-4 + ((v >> 40) % 1000) as f32 * 2e-6).collect();
        let (lo, hi) = if out_signed { (-100.0, 127.0) } else { (7.0, 255.0) };
        let requant = QuadRequant { bias: &bias, mult: &mult, zero_point: 5.0, range: (lo, hi) };
        let fill = (seed >> 8) as u8;
        let band = QuadBand {
            x: &x, signed, fill, input: [h, w], output: [oh, ow], c, kernel: [kh, kw],
            strides: [sh, sw], dilations: [dh, dw], pad: [ph, pw], taps: &packed, init: &init, requant,
        };
        let oy0 = (seed as usize) % oh;
        let rows = oh - oy0;
        let check = |isa: Isa| -> Vec<u8> {
            if out_signed {
                let mut y = vec![9i8; rows * ow * c];
                assert!(band.run_with(isa, oy0, &mut y));
                y.iter().map(|&v| v as u8).collect()
            } else {
                let mut y = vec![9u8; rows * ow * c];
                assert!(band.run_with(isa, oy0, &mut y));
                y
            }
        };
        let want = check(Isa::Portable);
        // The last pixel's last channel, written out.
        let (oy, ox, ch) = (oh - 1, ow - 1, c - 1);
        let mut sum = init[ch];
        for ky in 0..kh {
            for kx in 0..kw {
                let iy = (oy * sh + ky * dh).checked_sub(ph).filter(|&i| i < h);
                let ix = (ox * sw + kx * dw).checked_sub(pw).filter(|&i| i < w);
                let b = match (iy, ix) {
                    (Some(iy), Some(ix)) => x[(iy * w + ix) * c + ch],
                    _ => fill,
                };
                sum += i32::from(quad_code(b, signed)) * i32::from(taps[(ky * kw + kx) * c + ch]);
            }
        }
        // sum * mult + (bias * mult + zero point), each a fused multiply-add.
        let v = (sum as f32).mul_add(mult[ch], bias[ch].mul_add(mult[ch], 5.0)).clamp(lo, hi).round_ties_even();
        prop_assert_eq!(want[((oy - oy0) * ow + ox) * c + ch], v as i32 as u8);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            prop_assert_eq!(&check(isa), &want, "{:?}", isa);
        }
    }

    #[test]
    fn every_level_matches_the_scalar_twin(
        c in 1usize..=150,
        window in prop::collection::vec((0usize..=40, 0usize..=12), 0..=12),
        base in 0usize..=5,
        stride in 1usize..=2,
        count in 1usize..=9,
        signed in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // Offsets in whole pixels (`c` bytes), as the convolution uses them.
        let window: Vec<(usize, usize)> = window.iter().map(|&(x, w)| (x * c, w * c)).collect();
        let x: Vec<u8> = words((base + 2 * 9 + 41) * c, seed).iter().map(|&v| (v >> 32) as u8).collect();
        // Taps over i16's range, its ends included.
        let w: Vec<i16> = words(13 * c, seed ^ 7)
            .iter()
            .map(|&v| match v % 8 {
                0 => i16::MIN,
                1 => i16::MAX,
                _ => (v >> 20) as i16,
            })
            .collect();
        let init: Vec<i32> = words(c, seed ^ 11).iter().map(|&v| (v >> 33) as i32 - (1 << 30)).collect();
        let call = QPixels { x: &x, signed, w: &w, init: &init, window: &window, base: base * c, step: stride * c, c };
        let mut want = vec![0i32; count * c];
        prop_assert!(call.run_with(Isa::Portable, &mut want));
        // The twin is the definition: spot-check it against the sum written out.
        let (p, ch) = (count - 1, c - 1);
        let mut sum = init[ch];
        for &(xo, wo) in &window {
            let b = x[base * c + p * stride * c + xo + ch];
            let v = if signed { i32::from(b as i8) } else { i32::from(b) };
            sum = sum.wrapping_add(v * i32::from(w[wo + ch]));
        }
        prop_assert_eq!(want[p * c + ch], sum);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let mut got = vec![7i32; count * c];
            prop_assert!(call.run_with(isa, &mut got));
            prop_assert_eq!(&got, &want, "{:?}", isa);
        }
    }
}

/// An offset past X or the taps, or an `init` of the wrong length: refused, nothing
/// written.
#[test]
fn refuses_what_does_not_fit() {
    let (x, c) = (vec![1u8; 32], 4);
    let w = vec![1i16; 4 * c];
    let init = vec![0i32; c];
    let window = [(0usize, 0usize), (4, 4)];
    let ok = QPixels {
        x: &x,
        signed: false,
        w: &w,
        init: &init,
        window: &window,
        base: 0,
        step: c,
        c,
    };
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        let mut out = vec![0i32; 2 * c];
        assert!(ok.run_with(isa, &mut out));
        assert_eq!(out, vec![2; 2 * c], "{isa:?}");
        for call in [
            QPixels { w: &w[..6], ..ok },
            QPixels { base: 24, ..ok },
            QPixels { init: &init[..3], ..ok },
        ] {
            let mut out = vec![9i32; 2 * c];
            assert!(!call.run_with(isa, &mut out), "{isa:?} {call:?}");
            assert!(out.iter().all(|&v| v == 9));
        }
    }
}

/// Quad rows or taps too short for the pixels asked, or taps of the wrong length: refused,
/// nothing written.
#[test]
fn quad_taps_refuse_what_does_not_fit() {
    let c = 2;
    let row = vec![0x0101_0101u32; 4 * c];
    let rows = [&row[..]];
    let taps = pack_quad_taps(&[1i8; 3 * 2], (1, 3), c).unwrap();
    let init = vec![5i32; c];
    let call = QuadTaps {
        rows: &rows,
        taps: &taps,
        init: &init,
        groups: 1,
        stride: 1,
        reach: QUAD,
        c,
    };
    let mut out = vec![9i32; 4 * c];
    assert!(call.run(&mut out));
    // Each quad's codes are 1, 1, 1, 1 against taps 1, 1, 1, 0.
    assert_eq!(out, vec![8; 4 * c]);
    let mut out = vec![9i32; 5 * c];
    assert!(!call.run(&mut out));
    assert_eq!(out, vec![9; 5 * c]);
    let short = QuadTaps {
        taps: &taps[1..],
        ..call
    };
    let mut out = vec![9i32; c];
    assert!(!short.run(&mut out));
    assert!(pack_quad_taps(&[1i8; 5], (1, 3), c).is_none());
    let bad = QuadRow {
        x: &[1, 2, 3],
        signed: false,
        c,
        pad: 0,
        fill: 0,
        dilation: 1,
    };
    assert!(!bad.pack(&mut [0u32; 4]));
}
