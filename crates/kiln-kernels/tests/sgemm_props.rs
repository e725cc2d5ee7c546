//! Property tests of the f32 GEMM and its epilogues: every kernel level the CPU has (the
//! portable one always) against an f64 oracle and the reference `gemm`, over random shapes
//! (edge sizes, non-multiples of every tile, k = 0, transposed A, padded leading dimensions),
//! and the vectorised activations against their scalar references.
//!
//! ## Tolerances (not arbitrary numbers)
//!
//! Any order of summing `k` products in f32, with or without FMA, gives `s_hat` with
//! `|s_hat - s| <= gamma_k * sum_p |a_ip b_pj|`, `gamma_k = k u / (1 - k u)`, `u = 2^-24`
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, 3.1). The bias and residual
//! additions add one rounding each, so the pre-activation value `z` is within
//! `E = gamma_{k+2} (sum |a b| + |bias| + |residual|)` of the exact one (computed in f64).
//! An activation `f` with slope at most `L` moves that by `L E`; the f32 evaluation of `f`
//! itself is accepted within a mixed bound `8 u (|f(z)| + L |z|)` (8 ulp of the value plus
//! 8 ulp of relative perturbation of the input: what exp-based formulas achieve near their
//! ill-conditioned tails), plus `1e-30` absolute for results in the subnormal range.

#![allow(clippy::unwrap_used, clippy::panic)]

use kiln_kernels::gemm::{MatLayout, gemm};
use kiln_kernels::isa::Isa;
use kiln_kernels::sgemm::{
    AMatrix, Act, Affine, BLayout, Bias, Epilogue, PackedB, PackedBRef, Residual, act_slice_with_isa, sgemm_with,
};
use proptest::prelude::*;

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

fn levels() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// Deterministic pseudo-random values in [-1, 1), sometimes of mixed magnitudes.
fn data(len: usize, seed: u64, wide: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            if wide {
                v * [0.01, 1.0, 100.0][(s % 3) as usize]
            } else {
                v
            }
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    transposed: bool,
    lda_pad: usize,
    ldc_pad: usize,
    bias: u8,
    residual: bool,
    act: Option<Act>,
    layout: BLayout,
    seed: u64,
    wide: bool,
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0usize..=40, 2 => 1usize..=300]
}

fn act() -> impl Strategy<Value = Option<Act>> {
    (0..=Act::SAMPLES.len()).prop_map(|i| Act::SAMPLES.get(i).copied())
}

fn problem() -> impl Strategy<Value = Problem> {
    (
        (dim(), dim(), prop_oneof![1 => Just(0usize), 8 => dim()]),
        any::<bool>(),
        (0usize..5, 0usize..5),
        (0u8..3, any::<bool>(), act()),
        prop_oneof![Just(BLayout::NR32), Just(BLayout::NR16)],
        (any::<u64>(), any::<bool>()),
    )
        .prop_map(
            |((m, n, k), transposed, (lda_pad, ldc_pad), (bias, residual, act), layout, (seed, wide))| Problem {
                m,
                n,
                k,
                transposed,
                lda_pad,
                ldc_pad,
                bias,
                residual,
                act,
                layout,
                seed,
                wide,
            },
        )
}

/// Runs the problem on every level and checks each result element against the f64 oracle.
fn check(p: &Problem) -> Result<(), TestCaseError> {
    let (m, n, k) = (p.m, p.n, p.k);
    let (a_rows, a_cols) = if p.transposed { (k, m) } else { (m, k) };
    let lda = a_cols + p.lda_pad;
    let a = data(a_rows * lda, p.seed, p.wide);
    let b = data(k * n, p.seed ^ 1, p.wide);
    let ldc = n + p.ldc_pad;
    let bias_v = data(if p.bias == 1 { m } else { n }, p.seed ^ 2, false);
    let resid = data(m * ldc, p.seed ^ 3, false);
    let bias = match p.bias {
        1 => Bias::Row(&bias_v),
        2 => Bias::Col(&bias_v),
        _ => Bias::None,
    };
    let epi = Epilogue {
        bias,
        residual: p.residual.then_some(Residual { data: &resid, ld: ldc }),
        act: p.act,
        post: None,
        prelu: kiln_kernels::sgemm::Bias::None,
    };
    let a_at = |i: usize, q: usize| if p.transposed { a[q * lda + i] } else { a[i * lda + q] };
    let pb =
        PackedB::pack(p.layout, k, n, &b, MatLayout::row_major(n)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    // The reference GEMM (f32) on the same operands, for the no-epilogue comparison.
    let mut c_ref = vec![0.0f32; m * n];
    let la = if p.transposed {
        MatLayout::transposed(lda)
    } else {
        MatLayout::row_major(lda)
    };
    prop_assert!(gemm(m, n, k, &a, la, &b, MatLayout::row_major(n), &mut c_ref));

    for isa in levels() {
        let sentinel = -7.25f32;
        let mut c = vec![sentinel; m * ldc];
        let amat = AMatrix {
            data: &a,
            ld: lda,
            transposed: p.transposed,
            windows: false,
        };
        sgemm_with(isa, m, amat, pb.view(), &mut c, ldc, &epi).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for i in 0..m {
            for j in n..ldc {
                prop_assert_eq!(
                    c[i * ldc + j].to_bits(),
                    sentinel.to_bits(),
                    "{:?}: padding written",
                    isa
                );
            }
            for j in 0..n {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for q in 0..k {
                    let t = f64::from(a_at(i, q)) * f64::from(b[q * n + j]);
                    s += t;
                    abs += t.abs();
                }
                let product_err = gamma(k) * abs;
                let cr = f64::from(c_ref[i * n + j]);
                prop_assert!((cr - s).abs() <= product_err, "reference gemm outside its own bound");
                let mut z = s;
                let mut mag = abs;
                match bias {
                    Bias::Row(v) => {
                        z += f64::from(v[i]);
                        mag += f64::from(v[i]).abs();
                    }
                    Bias::Col(v) => {
                        z += f64::from(v[j]);
                        mag += f64::from(v[j]).abs();
                    }
                    Bias::None => {}
                }
                if p.residual {
                    z += f64::from(resid[i * ldc + j]);
                    mag += f64::from(resid[i * ldc + j]).abs();
                }
                let e = gamma(k + 2) * mag;
                let got = f64::from(c[i * ldc + j]);
                let (want, tol) = match p.act {
                    None => (z, e),
                    Some(act) => {
                        let l = f64::from(act.lipschitz());
                        let fz = f64::from(act.apply_scalar(z as f32));
                        // z as f32 moves z by u|z|, which f turns into at most L u |z|.
                        (fz, l * (e + U * z.abs()) + 4.0 * U * (fz.abs() + l * z.abs()) + 1e-30)
                    }
                };
                prop_assert!(
                    (got - want).abs() <= tol,
                    "{:?} ({},{}) of {}x{}x{}: got {} want {} tol {:e}",
                    isa,
                    i,
                    j,
                    m,
                    n,
                    k,
                    got,
                    want,
                    tol
                );
            }
        }
        // A scale and shift after the activation: exactly the same epilogue's values, then
        // the multiply and the add (each rounded), whichever parts are given.
        let post = Affine {
            scale: (p.seed % 3 != 0).then_some(-1.375f32 + (p.seed % 7) as f32 * 0.5),
            shift: (p.seed % 3 != 1).then_some(0.3125f32 * (p.seed % 5) as f32 - 0.5),
        };
        let mut c_post = vec![sentinel; m * ldc];
        let with_post = Epilogue {
            post: Some(post),
            ..epi
        };
        sgemm_with(isa, m, amat, pb.view(), &mut c_post, ldc, &with_post)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (idx, (&g, &c0)) in c_post.iter().zip(&c).enumerate() {
            let want = if idx % ldc < n { post.apply(c0) } else { sentinel };
            prop_assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "{:?} post {:?} at {} of {}x{}x{} ({:?}): got {} want {}",
                isa,
                post,
                idx,
                m,
                n,
                k,
                p.act,
                g,
                want
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sgemm_matches_oracle_on_every_level(p in problem()) {
        check(&p)?;
    }

    #[test]
    fn gathered_rows_of_b_match_oracle(
        m in prop_oneof![1usize..8, 8usize..70],
        n in prop_oneof![1usize..5, 5usize..80],
        k in 1usize..700,
        cuts in prop::collection::vec((0.0f64..1.0, 0.0f64..1.0), 1..5),
        nr32 in any::<bool>(),
        with_act in any::<bool>(),
        seed in any::<u64>(),
    ) {
        check_gathered(m, n, k, &cuts, nr32, with_act, seed)?;
    }

    #[test]
    fn activations_match_scalar_reference(
        xs in prop::collection::vec(
            prop_oneof![
                4 => -10.0f32..10.0,
                2 => -100.0f32..100.0,
                1 => -1e-3f32..1e-3,
                1 => prop::num::f32::ANY,
            ],
            0..70,
        ),
        which in 0..Act::SAMPLES.len(),
    ) {
        let act = Act::SAMPLES[which];
        check_act(act, &xs)?;
    }
}

fn check_act(act: Act, xs: &[f32]) -> Result<(), TestCaseError> {
    for isa in levels() {
        let mut v = xs.to_vec();
        act_slice_with_isa(isa, act, &mut v);
        for (&x, &y) in xs.iter().zip(&v) {
            let want = act.apply_scalar(x);
            if want.is_nan() || y.is_nan() {
                prop_assert!(
                    want.is_nan() && y.is_nan(),
                    "{:?} {:?}({}) = {} want {}",
                    isa,
                    act,
                    x,
                    y,
                    want
                );
                continue;
            }
            let exact = matches!(act, Act::Relu | Act::Clip { .. } | Act::LeakyRelu { .. }) || isa == Isa::Portable;
            if exact || want.is_infinite() {
                prop_assert_eq!(y.to_bits(), want.to_bits(), "{:?} {:?}({})", isa, act, x);
                continue;
            }
            let l = f64::from(act.lipschitz());
            let (yd, wd, xd) = (f64::from(y), f64::from(want), f64::from(x));
            let tol = 4.0 * U * (wd.abs() + l * xd.abs()) + 1e-30;
            prop_assert!(
                (yd - wd).abs() <= tol,
                "{:?} {:?}({}) = {} want {} tol {:e}",
                isa,
                act,
                x,
                y,
                want,
                tol
            );
        }
    }
    Ok(())
}

#[test]
fn activation_special_values() {
    let xs = [
        0.0f32,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-40,
        87.0,
        88.7,
        89.0,
        -87.0,
        -87.4,
        -88.8,
        -104.0,
        0.624,
        0.626,
        -0.625,
        9.0,
        -9.0,
        12.7,
        -12.7,
        -3.0,
        3.0,
        1.0,
        -1.0,
    ];
    for act in Act::SAMPLES {
        // All tail lengths from 0 to a few vectors long.
        for len in 0..=xs.len() {
            if let Err(e) = check_act(act, &xs[..len]) {
                panic!("{act:?} len {len}: {e}");
            }
        }
    }
}

/// Fixed edge shapes on every level: tile edges around MR in {4, 6, 8} and NR in {16, 32}
/// (edge panels of up to 16 columns for the half tiles, 17 to 24 for AVX-512's narrow ones),
/// depths around 256, past the longest block of both x86 levels (769 = two blocks of 385
/// and 384), M = 1 (GEMV), k = 0, rows over one row block
/// (197 against 192).
#[test]
fn edge_shapes() {
    let ms = [1, 3, 4, 5, 6, 7, 8, 9, 13, 17, 97, 197];
    let ns = [1, 5, 8, 15, 16, 17, 24, 31, 32, 33, 40, 49, 56];
    let ks = [0, 1, 255, 256, 257, 513, 769];
    for &m in &ms {
        for &n in &ns {
            for &k in &ks {
                for (transposed, layout) in [
                    (false, BLayout::NR32),
                    (true, BLayout::NR32),
                    (false, BLayout::NR16),
                    (true, BLayout::NR16),
                ] {
                    let p = Problem {
                        m,
                        n,
                        k,
                        transposed,
                        lda_pad: 1,
                        ldc_pad: 2,
                        bias: ((m + n) % 3) as u8,
                        residual: k % 2 == 1,
                        act: Act::SAMPLES.get((m * 7 + n + k) % 14).copied(),
                        layout,
                        seed: (m * 1000 + n * 10 + k) as u64,
                        wide: false,
                    };
                    if let Err(e) = check(&p) {
                        panic!("{p:?}: {e}");
                    }
                }
            }
        }
    }
}

/// Few rows against many columns (a transformer's projections over 32-64 tokens): every
/// tile height and its split remainders, one depth block and several, A with a padded
/// leading dimension, each with an epilogue.
#[test]
fn small_m_wide_products() {
    for &m in &[1, 5, 6, 7, 13, 32, 48, 64, 65] {
        for &n in &[256, 300] {
            for &k in &[1, 255, 257, 769] {
                for layout in [BLayout::NR32, BLayout::NR16] {
                    let p = Problem {
                        m,
                        n,
                        k,
                        transposed: false,
                        lda_pad: 3,
                        ldc_pad: 1,
                        bias: ((m + k) % 3) as u8,
                        residual: m % 2 == 1,
                        act: Act::SAMPLES.get((m * 5 + k) % 14).copied(),
                        layout,
                        seed: (m * 1000 + n * 10 + k) as u64,
                        wide: false,
                    };
                    if let Err(e) = check(&p) {
                        panic!("{p:?}: {e}");
                    }
                }
            }
        }
    }
}

/// Packed weights over the driver's 1 MiB threshold (600 x 513 floats, 1.2 MB), which take
/// row blocks of twice the usual height: rows over two such blocks and a remainder, depth in
/// one block and in two, A read in place and transposed, with an epilogue.
#[test]
fn streamed_weights_in_double_row_blocks() {
    for (k, transposed, layout) in [(513, false, BLayout::NR32), (769, true, BLayout::NR16)] {
        let p = Problem {
            m: 417,
            n: 600,
            k,
            transposed,
            lda_pad: 1,
            ldc_pad: 3,
            bias: 1,
            residual: true,
            act: Some(Act::Relu),
            layout,
            seed: k as u64,
            wide: false,
        };
        if let Err(e) = check(&p) {
            panic!("{p:?}: {e}");
        }
    }
}

#[test]
fn packed_bytes_round_trip_into_sgemm() {
    let (m, n, k) = (5, 37, 19);
    let a = data(m * k, 1, false);
    let b = data(k * n, 2, false);
    for layout in [BLayout::NR32, BLayout::NR16] {
        let pb = PackedB::pack(layout, k, n, &b, MatLayout::row_major(n)).unwrap();
        let tag = pb.format_tag();
        let back = BLayout::from_tag(tag).unwrap();
        let view = PackedBRef::from_bytes(back, k, n, pb.as_bytes()).unwrap();
        for isa in levels() {
            let mut c1 = vec![0.0f32; m * n];
            let mut c2 = vec![0.0f32; m * n];
            let am = AMatrix::row_major(&a, k);
            sgemm_with(isa, m, am, pb.view(), &mut c1, n, &Epilogue::NONE).unwrap();
            sgemm_with(isa, m, am, view, &mut c2, n, &Epilogue::NONE).unwrap();
            assert_eq!(c1, c2);
        }
    }
}

/// Problems big enough to be split over threads (by rows, blocks not rounded to whole tiles
/// (49 rows: 25 + 24 on 2 threads, 17 + 16 + 16 on 3), with the row bias
/// and residual following their rows; or, for few rows, by whole B panels, with the column
/// bias and residual following their columns), run under 2- and 3-thread pools. Every bias
/// kind meets both splits (`i % 3`).
#[test]
fn split_over_threads_matches_oracle() {
    for threads in [2, 3] {
        let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap();
        pool.install(|| {
            for (i, &(m, n, k)) in [
                (17, 300, 200),
                (64, 100, 120),
                (97, 77, 513),
                (16, 1024, 40),
                (5, 700, 160),
                (3, 1000, 200),
                (9, 650, 100),
                (49, 160, 240),
            ]
            .iter()
            .enumerate()
            {
                for transposed in [false, true] {
                    let p = Problem {
                        m,
                        n,
                        k,
                        transposed,
                        lda_pad: 3,
                        ldc_pad: 1,
                        bias: (i % 3) as u8,
                        residual: i % 2 == 0,
                        act: Act::SAMPLES.get(i * 3).copied(),
                        layout: BLayout::NR32,
                        seed: (threads * 100 + i) as u64,
                        wide: i == 1,
                    };
                    assert!(m * n * k >= 1 << 19, "{p:?} would not be split");
                    if let Err(e) = check(&p) {
                        panic!("{threads} threads, {p:?}: {e}");
                    }
                }
            }
        });
    }
}

/// Packed im2col panels against the reference im2col followed by packing, over strides,
/// dilations, pads and grids whose rows split panels anywhere.
#[test]
fn im2col_panels_match_reference_im2col_then_pack() {
    use kiln_kernels::conv::{
        Conv2d, ConvGeometry, im2col, im2col_panel_2d, im2col_panel_2d_phased, phase_len, split_phases,
    };
    use kiln_kernels::gemm::MatLayout;
    let mut cases = 0;
    for (c, ih, iw) in [(1, 5, 5), (3, 7, 9), (2, 1, 12)] {
        for (kh, kw) in [(1, 1), (3, 3), (2, 5)] {
            for (s, d, p) in [(1, 1, 0), (1, 1, 1), (2, 1, 1), (1, 2, 2), (3, 1, 2)] {
                let span = |k: usize| (k - 1) * d + 1;
                if ih + 2 * p < span(kh) || iw + 2 * p < span(kw) {
                    continue;
                }
                let (oh, ow) = ((ih + 2 * p - span(kh)) / s + 1, (iw + 2 * p - span(kw)) / s + 1);
                let g = Conv2d {
                    c,
                    ih,
                    iw,
                    kh,
                    kw,
                    sh: s,
                    sw: s,
                    dh: d,
                    dw: d,
                    ph: p,
                    pw: p,
                    oh,
                    ow,
                };
                let x = data(c * ih * iw, (c * 100 + kh * 10 + s) as u64, false);
                let geom = ConvGeometry {
                    image: &[ih, iw],
                    kernel: &[kh, kw],
                    grid: &[oh, ow],
                    strides: &[s, s],
                    dilations: &[d, d],
                    pad_begin: &[p, p],
                };
                let mut col = vec![0.0f32; g.k() * g.n()];
                assert!(im2col(&geom, c, &x, &mut col));
                for layout in [BLayout::NR16, BLayout::NR32] {
                    let want = PackedB::pack(layout, g.k(), g.n(), &col, MatLayout::row_major(g.n())).unwrap();
                    let nr = layout.nr();
                    let mut got = vec![f32::NAN; layout.packed_len(g.k(), g.n()).unwrap()];
                    for (q, panel) in got.chunks_exact_mut(g.k() * nr).enumerate() {
                        assert!(im2col_panel_2d(&g, &x, nr, q, panel));
                    }
                    assert_eq!(got, want.view().data(), "{g:?} nr {nr}");
                    // The phase-split variant gives the same panels.
                    let mut xph = vec![f32::NAN; c * ih * s * phase_len(&g)];
                    assert!(split_phases(&g, &x, &mut xph));
                    let mut got = vec![f32::NAN; layout.packed_len(g.k(), g.n()).unwrap()];
                    for (q, panel) in got.chunks_exact_mut(g.k() * nr).enumerate() {
                        assert!(im2col_panel_2d_phased(&g, &xph, nr, q, panel));
                    }
                    assert_eq!(got, want.view().data(), "phased {g:?} nr {nr}");
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 50, "{cases}");
}

/// Winograd F(4x4, 3x3) against the direct convolution (im2col + reference GEMM in f64) over
/// channel counts, odd sizes (partial edge tiles), pads 0-2, under 1 and 2 threads, with and
/// without a residual and ReLU after the bias. Bound: 1e-4 of the output's largest magnitude (measured: < 1e-5).
/// On 2 threads channels-last, (3, 5, ..), (8, 40, ..) (9 tiles: 4 + 5, splitting a tile row)
/// and (33, 17, ..) split by tiles, (16, 8, ..) by phases (`Winograd::split_by_tiles`).
/// Dilated (channels-last only): each class of outputs its own pass, with pads under, equal
/// to and over the dilation, (8, 40, ..) split by tiles and (32, 48, ..) by phases. The 64 ->
/// 64 layers run their tiles in two chunks on one thread (`chunk_tiles`).
#[test]
fn winograd_matches_direct_convolution() {
    use kiln_kernels::conv::{ConvGeometry, im2col};
    use kiln_kernels::winograd::{Winograd, pack_weights};
    let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
    let mut cases = 0;
    for (c, m, ih, iw, p, [dh, dw]) in [
        (1, 1, 4, 4, 1, [1, 1]),
        (3, 5, 7, 9, 1, [1, 1]),
        (16, 8, 13, 6, 0, [1, 1]),
        (8, 40, 10, 10, 2, [1, 1]),
        (33, 17, 5, 11, 1, [1, 1]),
        (8, 40, 13, 10, 2, [2, 1]),
        (32, 48, 12, 9, 1, [2, 1]),
        (3, 5, 9, 11, 1, [1, 2]),
        (16, 8, 15, 12, 2, [3, 2]),
        (4, 16, 14, 14, 0, [2, 2]),
        // 81 tiles of 64 + 64 channels (a class of 81 dilated): on one thread, two chunks.
        (64, 64, 34, 34, 1, [1, 1]),
        (64, 64, 70, 34, 2, [2, 1]),
    ] {
        let (oh, ow) = (ih + 2 * p - 2 * dh, iw + 2 * p - 2 * dw);
        let x = data(c * ih * iw, (c * 7 + m) as u64, false);
        let w = data(m * c * 9, (m * 3 + ih) as u64, false);
        let bias = data(m, 99, false);
        // Direct, in f64.
        let geom = ConvGeometry {
            image: &[ih, iw],
            kernel: &[3, 3],
            grid: &[oh, ow],
            strides: &[1, 1],
            dilations: &[dh, dw],
            pad_begin: &[p, p],
        };
        let mut col = vec![0.0f32; c * 9 * oh * ow];
        assert!(im2col(&geom, c, &x, &mut col));
        let mut want = vec![0.0f64; m * oh * ow];
        for mi in 0..m {
            for j in 0..oh * ow {
                want[mi * oh * ow + j] = f64::from(bias[mi])
                    + (0..c * 9)
                        .map(|k| f64::from(w[mi * c * 9 + k]) * f64::from(col[k * oh * ow + j]))
                        .sum::<f64>();
            }
        }
        let scale = want.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        for layout in [BLayout::NR32, BLayout::NR16] {
            let u = pack_weights(&w, m, c, layout).unwrap();
            // The residual and ReLU applied by the output-transform tasks.
            let residual = data(m * oh * ow, (m + c) as u64, false);
            let with_post: Vec<f64> = want
                .iter()
                .zip(&residual)
                .map(|(&v, &r)| (v + f64::from(r)).max(0.0))
                .collect();
            // PRelu slopes per output channel (the third epilogue form).
            let slopes = data(m, (3 * m + c) as u64, false);
            let with_prelu: Vec<f64> = want
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let s = f64::from(slopes[i / (oh * ow)]);
                    if v < 0.0 { v * s } else { v }
                })
                .collect();
            for (threads, channels_last, post) in [
                (1, false, 0),
                (2, false, 0),
                (1, true, 0),
                (2, true, 0),
                (2, false, 1),
                (2, true, 1),
                (1, false, 2),
                (1, true, 2),
                (2, true, 2),
            ] {
                let g = Winograd {
                    c,
                    m,
                    ih,
                    iw,
                    oh,
                    ow,
                    ph: p,
                    pw: p,
                    channels_last,
                    dilation: [dh, dw],
                };
                // Channels-last X is `ih x iw x c`; its Y comes back to `m x oh x ow` to compare.
                let xin: Vec<f32> = if channels_last {
                    (0..ih * iw * c).map(|i| x[(i % c) * ih * iw + i / c]).collect()
                } else {
                    x.clone()
                };
                let rin: Vec<f32> = if channels_last {
                    (0..m * oh * ow).map(|i| residual[(i % m) * oh * ow + i / m]).collect()
                } else {
                    residual.clone()
                };
                let (r, act, prelu, want) = match post {
                    1 => (Some(rin.as_slice()), Some(Act::Relu), None, &with_post),
                    2 => (None, None, Some(slopes.as_slice()), &with_prelu),
                    _ => (None, None, None, &want),
                };
                let mut y = vec![f32::NAN; m * oh * ow];
                if [dh, dw] != [1, 1] && !channels_last {
                    // Dilation runs channels-last only: refused, not computed wrong.
                    let mut scratch = Vec::new();
                    assert!(!g.run(&xin, &u, layout, Some(&bias), r, act, prelu, &mut y, &mut scratch));
                    continue;
                }
                // A scratch left by a larger layer (longer, and NaN wherever the run would
                // read an element it did not write first): kept as it is, never re-zeroed.
                let mut scratch = vec![f32::NAN; g.scratch_len().unwrap() + 1000];
                let ok = if threads == 1 {
                    g.run(&xin, &u, layout, Some(&bias), r, act, prelu, &mut y, &mut scratch)
                } else {
                    pool.install(|| g.run(&xin, &u, layout, Some(&bias), r, act, prelu, &mut y, &mut scratch))
                };
                assert!(ok, "{g:?}");
                if channels_last {
                    y = (0..m * oh * ow)
                        .map(|i| y[(i % (oh * ow)) * m + i / (oh * ow)])
                        .collect();
                }
                for (i, (&got, &wv)) in y.iter().zip(want).enumerate() {
                    assert!(
                        (f64::from(got) - wv).abs() <= 1e-4 * scale,
                        "{g:?} [{i}]: {got} vs {wv}"
                    );
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 6 * 2 * 9 + 6 * 2 * 5);
}

/// A product over chosen row ranges of a packed B ([`PackedBRef::gather`]: ranges anywhere in
/// `0..k`, overlapping or out of order, one or several depth blocks each) against the f64
/// oracle on the rows it names, with a column bias and an activation, on every level.
fn check_gathered(
    m: usize,
    n: usize,
    k: usize,
    cuts: &[(f64, f64)],
    nr32: bool,
    with_act: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let ranges: Vec<std::ops::Range<usize>> = cuts
        .iter()
        .map(|&(x, y)| {
            let (a, b) = ((x * k as f64) as usize, (y * k as f64) as usize);
            let (lo, hi) = (a.min(b).min(k - 1), a.max(b).min(k - 1));
            lo..hi + 1
        })
        .collect();
    let rows: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
    let kg = rows.len();
    let layout = if nr32 { BLayout::NR32 } else { BLayout::NR16 };
    let a = data(m * kg, seed, false);
    let b = data(k * n, seed ^ 1, false);
    let bias_v = data(n, seed ^ 2, false);
    let act = with_act.then_some(Act::Relu);
    let epi = Epilogue {
        bias: Bias::Col(&bias_v),
        residual: None,
        act,
        post: None,
        prelu: kiln_kernels::sgemm::Bias::None,
    };
    let pb =
        PackedB::pack(layout, k, n, &b, MatLayout::row_major(n)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let view = pb
        .view()
        .gather(&ranges)
        .ok_or_else(|| TestCaseError::fail("gather refused"))?;
    prop_assert_eq!(view.k(), kg);
    for isa in levels() {
        let mut c = vec![f32::NAN; m * n];
        sgemm_with(isa, m, AMatrix::row_major(&a, kg), view, &mut c, n, &epi)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut mag) = (f64::from(bias_v[j]), f64::from(bias_v[j]).abs());
                for (q, &r) in rows.iter().enumerate() {
                    let t = f64::from(a[i * kg + q]) * f64::from(b[r * n + j]);
                    s += t;
                    mag += t.abs();
                }
                let want = if act.is_some() { s.max(0.0) } else { s };
                let got = f64::from(c[i * n + j]);
                prop_assert!(
                    (got - want).abs() <= gamma(kg + 1) * mag,
                    "{:?} ({},{}) of {}x{}x{} over {:?}: got {} want {}",
                    isa,
                    i,
                    j,
                    m,
                    n,
                    k,
                    ranges,
                    got,
                    want
                );
            }
        }
    }
    Ok(())
}

#[test]
fn gather_refuses_ranges_outside_b() {
    let pb = PackedB::pack(BLayout::NR16, 10, 3, &[0.0; 30], MatLayout::row_major(3)).unwrap();
    let v = pb.view();
    assert!(v.gather(&[0..11]).is_none());
    assert!(v.gather(&[4..4]).is_none());
    assert!(v.gather(&[]).is_none());
    let g = v.gather(&[2..5, 0..1]).unwrap();
    assert_eq!(g.k(), 4);
    assert!(g.gather(&[0..1]).is_none());
    assert!(g.rows(0, 1).is_none());
}

/// PRelu slopes in the epilogue (one per row or per column of C): every level, both panel
/// widths, the tiles' edges, `k = 0`, the few-column dot products, transposed A, and
/// products split over threads by rows and by columns, bit for bit the same as the product
/// with the bias alone followed by `v < 0 ? v * s : v` over C. The slope pair with an
/// activation or an affine is refused.
#[test]
fn prelu_slopes_match_the_product_then_the_slopes() {
    let shapes = [
        (1, 1, 1),
        (3, 5, 0),
        (7, 3, 40),
        (8, 16, 9),
        (13, 17, 33),
        (40, 32, 64),
        (9, 70, 5),
        (200, 48, 300),
        (64, 650, 100),
    ];
    for threads in [1, 2] {
        let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap();
        pool.install(|| {
            for isa in levels() {
                for layout in [BLayout::NR16, BLayout::NR32] {
                    for (i, &(m, n, k)) in shapes.iter().enumerate() {
                        for (transposed, per_row) in [(false, false), (false, true), (true, false)] {
                            let seed = (i * 7 + usize::from(per_row)) as u64;
                            let (a, b) = (data(m * k, seed, false), data(k * n, seed + 1, false));
                            let lda = if transposed { m } else { k };
                            let am = if transposed {
                                AMatrix::transposed(&a, lda)
                            } else {
                                AMatrix::row_major(&a, lda)
                            };
                            let pb = PackedB::pack(layout, k, n, &b, MatLayout::row_major(n)).unwrap();
                            let bias = data(n, seed + 2, false);
                            let slopes = data(if per_row { m } else { n }, seed + 3, true);
                            let plain = Epilogue {
                                bias: Bias::Col(&bias),
                                ..Epilogue::NONE
                            };
                            let mut want = vec![f32::NAN; m * n];
                            sgemm_with(isa, m, am, pb.view(), &mut want, n, &plain).unwrap();
                            for (r, row) in want.chunks_mut(n.max(1)).enumerate() {
                                for (j, v) in row.iter_mut().enumerate() {
                                    let s = if per_row { slopes[r] } else { slopes[j] };
                                    *v = if *v < 0.0 { *v * s } else { *v };
                                }
                            }
                            let epi = Epilogue {
                                prelu: if per_row { Bias::Row(&slopes) } else { Bias::Col(&slopes) },
                                ..plain
                            };
                            let mut got = vec![f32::NAN; m * n];
                            sgemm_with(isa, m, am, pb.view(), &mut got, n, &epi).unwrap();
                            let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(
                                same,
                                "{isa:?} {layout:?} {threads} threads, {m}x{n}x{k} transposed {transposed} per row {per_row}"
                            );
                            let refused = Epilogue {
                                act: Some(Act::Relu),
                                ..epi
                            };
                            assert!(sgemm_with(isa, m, am, pb.view(), &mut got, n, &refused).is_err());
                        }
                    }
                }
            }
        });
    }
}

/// Every tile of one product sums in the same order, whatever its height or width: a B whose
/// columns are all equal gives columns of C that are bit for bit equal, and an A whose rows
/// are all equal rows of C that are, on every level and layout, for few rows (the two-set
/// tiles of 1-3 rows and their 8-column edges), remainder tiles and edge panels. (A light
/// ONNX test model with constant weights multiplies 1e10-sized values; a different order for
/// the last 8 columns made their logits differ and its softmax no longer uniform.)
#[test]
fn equal_columns_and_rows_give_equal_bits() {
    for isa in levels() {
        for layout in [BLayout::for_isa(isa), BLayout::NR32] {
            for &(m, n, k) in &[
                (1, 40, 300),
                (2, 24, 257),
                (3, 1000, 64),
                (4, 40, 33),
                (9, 56, 300),
                (13, 24, 129),
            ] {
                let col = data(k, 3, true);
                let b: Vec<f32> = (0..k * n).map(|i| col[i / n]).collect();
                let row = data(k, 5, true);
                let a: Vec<f32> = (0..m * k).map(|i| row[i % k]).collect();
                let pb = PackedB::pack(layout, k, n, &b, MatLayout::row_major(n)).unwrap();
                let mut c = vec![f32::NAN; m * n];
                sgemm_with(isa, m, AMatrix::row_major(&a, k), pb.view(), &mut c, n, &Epilogue::NONE).unwrap();
                let first = c[0].to_bits();
                assert!(
                    c.iter().all(|v| v.to_bits() == first),
                    "{isa:?} {layout:?} {m}x{n}x{k}: {:?}",
                    c.iter().filter(|v| v.to_bits() != first).take(3).collect::<Vec<_>>()
                );
            }
        }
    }
}
