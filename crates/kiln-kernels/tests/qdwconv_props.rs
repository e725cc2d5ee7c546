//! The 8-bit depthwise pixel kernel on every level against its scalar twin (the portable
//! path), over channel counts that exercise the 16-wide blocks and the masked tail, windows
//! of any shape and offset, pixels one or two pixels apart in runs of 1-9 (the 4-pixel groups
//! and their remainder), u8 and i8 bytes, and taps over i16's whole range.

use kiln_kernels::isa::Isa;
use kiln_kernels::qdwconv::QPixels;
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
