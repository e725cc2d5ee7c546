//! Vectorised activation math shared by the AVX-512 and AVX2 epilogues, written once over a
//! small set of primitives (`V`, `splat`, `fmadd`, `blend`, ...) that each level's module
//! defines with its own intrinsics, then instantiated there with `simd_math!("features")`.
//!
//! Accuracy (checked against the f64 references in `act.rs` by the tests): exp within ~1 ulp
//! (Cephes `expf` polynomial after Cody-Waite reduction), sigmoid and Silu within a few ulp,
//! tanh within a few ulp (Cephes `tanhf`: an odd polynomial below 0.625, `1 - 2/(e^2x + 1)`
//! above), erf-Gelu through a rational erf (absolute error; see `gelu_erf`), and tanh-Gelu as
//! `x * sigmoid(2y)`, the same function without the cancellation of `1 + tanh(y)`. NaN inputs
//! give NaN.

macro_rules! simd_math {
    ($feat:literal) => {
        /// `e^r - 1 - r` over `r^2`'s polynomial, for the reduced `|r| <= ln2 / 2`: the Cephes
        /// `expf` coefficients by Estrin's scheme (three levels of FMAs where Horner's rule
        /// chains six: the exponential sits on the latency path of every sigmoid, and a
        /// row of them runs as fast as the out-of-order window overlaps its chains), then
        /// `1 + r + r^2 p(r)`.
        #[target_feature(enable = $feat)]
        #[inline]
        fn exp_poly(r: V) -> V {
            let r2 = mul(r, r);
            let r4 = mul(r2, r2);
            let p45 = fmadd(splat(1.666_666_5e-1), r, splat(5.000_000_1e-1));
            let p23 = fmadd(splat(8.333_452e-3), r, splat(4.166_579_6e-2));
            let p01 = fmadd(splat(1.987_569_2e-4), r, splat(1.398_199_9e-3));
            let p = fmadd(r4, p01, fmadd(r2, p23, p45));
            fmadd(p, r2, add(r, splat(1.0)))
        }

        /// `e^x` for `x` already within [-87.34, 88.72] (or NaN): Cody-Waite reduction by
        /// `ln 2`, the Cephes `expf` polynomial, and the power of two applied in two factors.
        #[target_feature(enable = $feat)]
        fn exp_in_range(xc: V) -> V {
            let n = round(mul(xc, splat(std::f32::consts::LOG2_E)));
            // x - n ln2 in two steps (ln2 = 0.693359375 - 2.12194440e-4).
            let r = fnmadd(n, splat(0.693_359_375), xc);
            let r = fnmadd(n, splat(-2.121_944_4e-4), r);
            scale_pow2(exp_poly(r), n)
        }

        /// `e^x`: 0 below the normal range (x < -87.34), +inf above 88.72, NaN kept: the
        /// clamps take `x` as their second operand, which x86's min and max return when
        /// either is NaN, so a NaN runs through the polynomial (a NaN at every step) with no
        /// compare and blend of its own.
        #[target_feature(enable = $feat)]
        fn exp(x: V) -> V {
            let lo = splat(-87.336_55);
            let hi = splat(88.722_83);
            let y = exp_in_range(min(hi, max(lo, x)));
            let y = blend(lt(x, lo), zero(), y);
            blend(gt(x, hi), splat(f32::INFINITY), y)
        }

        /// `1 / (1 + e^-x)`, with `e^-x` taken on `-x` clamped to [-87, 87] (one blend where
        /// the exponential had two): above 87 the sigmoid is within 1e-38 of 1; below -87 it
        /// is set to 0 (so `-inf` gives 0, and Silu `-inf * 0 = NaN`, as the reference). NaN
        /// runs through the clamps, whose second operand it is.
        #[target_feature(enable = $feat)]
        fn sigmoid(x: V) -> V {
            let [s] = sigmoid_n([x]);
            s
        }

        /// [`sigmoid`] on `N` vectors, each step taken on all of them before the next.
        ///
        /// `e^-x` as in [`exp_in_range`], with a shorter chain around the polynomial: `n`
        /// rounded by adding `1.5 * 2^23` in the FMA that scales by `log2 e` (the sum's low
        /// mantissa bits then hold `n`), and `2^n` (normal: `|n| <= 126` for the clamped
        /// argument) made from those bits by two integer operations and applied as one
        /// factor, where a round, a conversion and two multiplies were.
        ///
        /// A sigmoid is a chain of some twenty dependent operations (a division among
        /// them); one vector at a time the out-of-order window holds little more than two
        /// chains, and SiLU over a GEMM tile ran at about one vector per 20 cycles (Zen 3)
        /// where the ports allow one per 8. `N` chains side by side overlap; each vector
        /// takes the same operations in the same order, so the bits are [`sigmoid`]'s
        /// (which is this function on one vector). Zen 3, the activation bench (which
        /// includes a copy of the input): sigmoid 1.31 -> 1.76 Gelem/s, SiLU 1.20 -> 1.47.
        #[target_feature(enable = $feat)]
        #[inline]
        fn sigmoid_n<const N: usize>(x: [V; N]) -> [V; N] {
            const MAGIC: f32 = 12_582_912.0;
            let nx: [V; N] = std::array::from_fn(|i| sub(zero(), x[i]));
            let xc: [V; N] = std::array::from_fn(|i| min(splat(87.0), max(splat(-87.0), nx[i])));
            let t: [V; N] = std::array::from_fn(|i| fmadd(xc[i], splat(std::f32::consts::LOG2_E), splat(MAGIC)));
            let n: [V; N] = std::array::from_fn(|i| sub(t[i], splat(MAGIC)));
            let r: [V; N] = std::array::from_fn(|i| fnmadd(n[i], splat(0.693_359_375), xc[i]));
            let r: [V; N] = std::array::from_fn(|i| fnmadd(n[i], splat(-2.121_944_4e-4), r[i]));
            let y: [V; N] = std::array::from_fn(|i| exp_poly(r[i]));
            let e: [V; N] = std::array::from_fn(|i| mul(y[i], pow2_of_magic(t[i])));
            let s: [V; N] = std::array::from_fn(|i| div(splat(1.0), add(splat(1.0), e[i])));
            std::array::from_fn(|i| blend(gt(nx[i], splat(87.0)), zero(), s[i]))
        }

        #[target_feature(enable = $feat)]
        fn tanh(x: V) -> V {
            let ax = abs(x);
            let s = mul(x, x);
            let mut p = splat(-5.704_988_7e-3);
            p = fmadd(p, s, splat(2.063_908_9e-2));
            p = fmadd(p, s, splat(-5.373_971_6e-2));
            p = fmadd(p, s, splat(1.333_144_2e-1));
            p = fmadd(p, s, splat(-3.333_328_2e-1));
            let small = fmadd(mul(p, s), x, x);
            let e = exp(add(ax, ax));
            let large = sub(splat(1.0), div(splat(2.0), add(e, splat(1.0))));
            blend(lt(ax, splat(0.625)), small, copy_sign(large, x))
        }

        /// `0.5 x (1 + erf(x / sqrt 2))` with `erf(u) = u P(u^2) / Q(u^2)` on `u` clamped to
        /// [-4, 4] (beyond, erf is 1 to f32 precision): degrees 6 and 4 in `u^2`, our own fit
        /// (linearised least squares on [0, 4], reweighted towards minimax), |error| 5.8e-8
        /// in exact arithmetic and 3.7e-7 evaluated in f32. That is absolute: for large
        /// negative x, `1 + erf` cancels and the result keeps an absolute error of about
        /// `|x| 2e-7` (the property tests' bound is `4u (|y| + 1.13 |x|)`; the worst case
        /// measured at 0.69 of it). Eleven FMAs, a reciprocal and clamps instead of an erfc
        /// polynomial, a divide and an exp: half the work in the epilogue of a GELU MLP.
        #[target_feature(enable = $feat)]
        fn gelu_erf(x: V) -> V {
            let (num, den) = erf_ratio(mul(x, splat(std::f32::consts::FRAC_1_SQRT_2)));
            let e = max(splat(-1.0), min(splat(1.0), mul(num, recip(den))));
            let h = mul(x, splat(0.5));
            fmadd(h, e, h)
        }

        /// `erf(u)` by the rational fit above, within 3.7e-7 (absolute) in f32, clamped to
        /// [-1, 1] (at |u| = 4 the fit can exceed 1 by an ulp or two, which would overflow
        /// `x/2 + x/2` at the top of Gelu's range). The clamps take the constant first, so a
        /// NaN input stays NaN (`min`/`max` return their second operand for a NaN).
        ///
        /// Below |u| = 1 the standalone Erf, judged relative to its result, takes an odd
        /// polynomial instead (`u P(u^2)`, degree 6 in `u^2`, our own relative-error fit on
        /// [0, 1]: 1.2e-9 in exact arithmetic, about 3 ulp evaluated in f32), since the
        /// rational fit is tuned for absolute error and its constant term is 4e-7 off
        /// `2/sqrt(pi)`.
        #[target_feature(enable = $feat)]
        fn erf(u: V) -> V {
            let (num, den) = erf_ratio(u);
            let far = max(splat(-1.0), min(splat(1.0), div(num, den)));
            let t = mul(u, u);
            let mut p = splat(7.847_033_7e-5);
            p = fmadd(p, t, splat(-8.008_216_4e-4));
            p = fmadd(p, t, splat(5.188_113_5e-3));
            p = fmadd(p, t, splat(-2.685_370_5e-2));
            p = fmadd(p, t, splat(1.128_358_2e-1));
            p = fmadd(p, t, splat(-3.761_262_6e-1));
            p = fmadd(p, t, splat(1.128_379_1));
            blend(lt(t, splat(1.0)), mul(u, p), far)
        }

        /// `erf(u)` as `num / den` (`u P(u^2)` and `Q(u^2)`, `u` clamped to [-4, 4]).
        #[target_feature(enable = $feat)]
        fn erf_ratio(u: V) -> (V, V) {
            let u = max(splat(-4.0), min(splat(4.0), u));
            let u2 = mul(u, u);
            let mut p = splat(1.915_661_2e-8);
            p = fmadd(p, u2, splat(-1.986_199_8e-6));
            p = fmadd(p, u2, splat(1.553_888_9e-4));
            p = fmadd(p, u2, splat(4.294_286_5e-3));
            p = fmadd(p, u2, splat(5.244_456_2e-2));
            p = fmadd(p, u2, splat(2.140_252e-1));
            p = fmadd(p, u2, splat(1.128_378_7));
            let mut q = splat(1.097_707_3e-3);
            q = fmadd(q, u2, splat(1.555_675_9e-2));
            q = fmadd(q, u2, splat(1.208_327_5e-1));
            q = fmadd(q, u2, splat(5.230_027_4e-1));
            q = fmadd(q, u2, splat(1.0));
            (mul(u, p), q)
        }

        /// `x / (1 + e^(-2y))`, `y = sqrt(2/pi) (x + 0.044715 x^3)`: equal to
        /// `0.5 x (1 + tanh y)`.
        #[target_feature(enable = $feat)]
        fn gelu_tanh(x: V) -> V {
            const K: f32 = 0.797_884_6; // sqrt(2/pi)
            let inner = fmadd(mul(x, x), splat(0.044_715), splat(1.0));
            let m2y = mul(mul(x, splat(-2.0 * K)), inner);
            div(x, add(splat(1.0), exp(m2y)))
        }

        /// `v < 0 ? 0 : v`, then `v > 1 ? 1 : v`, as `max(0, v)` and `min(1, v)`: x86's
        /// rule (the second operand when the compare fails or is unordered) gives the same
        /// lanes, NaN and -0 included, in two instructions where compares and blends took five
        /// (HardSwish and HardSigmoid epilogues).
        #[target_feature(enable = $feat)]
        #[inline]
        fn clamp01(v: V) -> V {
            min(splat(1.0), max(zero(), v))
        }

        /// The activation on one vector.
        #[target_feature(enable = $feat)]
        fn act(a: Act, x: V) -> V {
            match a {
                Act::Relu | Act::Clip { .. } => act_cheap(a, x),
                Act::LeakyRelu { alpha } => blend(lt(x, zero()), mul(x, splat(alpha)), x),
                Act::Sigmoid => sigmoid(x),
                Act::Tanh => tanh(x),
                Act::Gelu { tanh: false } => gelu_erf(x),
                Act::Gelu { tanh: true } => gelu_tanh(x),
                Act::HardSigmoid { alpha, beta } => clamp01(fmadd(splat(alpha), x, splat(beta))),
                Act::HardSwish => mul(x, clamp01(fmadd(splat(1.0 / 6.0), x, splat(0.5)))),
                Act::Silu => mul(x, sigmoid(x)),
                Act::Erf => erf(x),
            }
        }

        /// `row[i] = e^(scale row[i] - shift)` for every element (one rounding before the
        /// exponential: with `scale` 1 that is `row[i] - shift`); returns their sum (in
        /// `LANES` partial sums, then added pairwise). The tail is a masked load
        /// padded with -inf, whose exponentials are 0 (for `scale > 0`), and a masked store
        /// (through a local array it had cost two `memcpy` calls per row: a third of a 197-wide
        /// attention row's time).
        #[target_feature(enable = $feat)]
        fn exp_shift_sum_impl(row: &mut [f32], scale: f32, shift: f32) -> f32 {
            let (k, s) = (splat(scale), splat(-shift));
            let mut acc = zero();
            let mut chunks = row.chunks_exact_mut(LANES);
            for c in &mut chunks {
                if let Ok(a) = <&mut [f32; LANES]>::try_from(c) {
                    let e = exp(fmadd(load_arr(a), k, s));
                    store_arr(a, e);
                    acc = add(acc, e);
                }
            }
            let rem = chunks.into_remainder();
            if !rem.is_empty() {
                let e = exp(fmadd(load_part(rem, f32::NEG_INFINITY), k, s));
                store_part(rem, e);
                acc = add(acc, e);
            }
            let mut lanes = [0.0f32; LANES];
            store_arr(&mut lanes, acc);
            crate::vector::tree_sum(lanes)
        }

        /// The cheap activations ([`Act::is_cheap`]) on one vector, as the tiles apply them
        /// ([`apply_cheap`]); the others are calls.
        #[target_feature(enable = $feat)]
        #[inline]
        fn act_cheap(a: Act, x: V) -> V {
            match a {
                Act::Relu
                | Act::Clip { .. }
                | Act::HardSigmoid { .. }
                | Act::HardSwish
                | Act::LeakyRelu { .. } => apply_cheap(cheap_of(Some(a), None), x),
                _ => act_call(a, x),
            }
        }

        /// `act` over a whole row, the activation chosen once: the costly activations' code
        /// runs in one loop per row instead of one out-of-line call per vector.
        #[target_feature(enable = $feat)]
        fn act_row(a: Act, row: &mut [f32]) {
            // SAFETY: one row of `row.len()` floats, borrowed exclusively.
            unsafe { act_rows(a, row.as_mut_ptr(), 0, 1, row.len()) }
        }

        /// `post` over `rows` stored rows of `width` floats, `ld` apart (after a costly
        /// activation, which runs over the stored rows too).
        ///
        /// # Safety
        /// `c + i*ld` has `width` writable, initialised floats for `i < rows`, used by no
        /// one else during the call.
        #[inline]
        unsafe fn post_rows(post: Option<Affine>, c: *mut f32, ld: usize, rows: usize, width: usize) {
            let Some(post) = post else { return };
            for i in 0..rows {
                // SAFETY: the caller's contract for row `i`.
                let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ld), width) };
                for v in row.iter_mut() {
                    *v = post.apply(*v);
                }
            }
        }

        /// `act` over `rows` rows of `width` floats, `ld` apart (a GEMM tile of C), in one
        /// call: the activation is chosen and its constants set up once per tile, not per
        /// row (with 32-float rows that setup and the call cost about as much as the math).
        ///
        /// # Safety
        /// For every `i < rows`, `c + i*ld` points to `width` initialised floats that nothing
        /// else reads or writes during the call.
        #[target_feature(enable = $feat)]
        #[inline(never)]
        unsafe fn act_rows(a: Act, c: *mut f32, ld: usize, rows: usize, width: usize) {
            macro_rules! each {
                ($x:ident => $e:expr) => {{
                    for i in 0..rows {
                        // SAFETY: the caller's contract for row `i`.
                        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ld), width) };
                        let mut chunks = row.chunks_exact_mut(LANES);
                        for c in &mut chunks {
                            if let Ok(c) = <&mut [f32; LANES]>::try_from(c) {
                                let $x = load_arr(c);
                                store_arr(c, $e);
                            }
                        }
                        let rem = chunks.into_remainder();
                        if !rem.is_empty() {
                            let $x = load_part(rem, 0.0);
                            store_part(rem, $e);
                        }
                    }
                }};
            }
            // `ILP` vectors at a time through a function of `N` vectors (`sigmoid_n`), taken
            // across rows as well (a tile's rows are two vectors wide), then the vectors left
            // over and the rows' partial tails one at a time.
            macro_rules! each_n {
                ($x:ident => $e:expr, $one:ident => $e1:expr) => {{
                    let full = width / LANES;
                    let mut group = [std::ptr::null_mut::<[f32; LANES]>(); ILP];
                    let mut held = 0;
                    for i in 0..rows {
                        // SAFETY (every access below): the caller's contract gives `width`
                        // floats at `c + i*ld`, read and written by this call alone; vector
                        // `v < full` is the `LANES` of them from `v * LANES`, the tail the
                        // `width % LANES` after the last full vector.
                        let row = unsafe { c.add(i * ld) };
                        for v in 0..full {
                            if let Some(slot) = group.get_mut(held) {
                                // SAFETY: vector `v < full` of row `i` (see above).
                                *slot = unsafe { row.add(v * LANES) }.cast::<[f32; LANES]>();
                                held += 1;
                            }
                            if held == ILP {
                                // SAFETY: each pointer is a distinct full vector of a row
                                // (see above), held by no reference.
                                let $x: [V; ILP] = group.map(|p| unsafe { load_arr(&*p) });
                                let y: [V; ILP] = $e;
                                for (&p, y) in group.iter().zip(y) {
                                    // SAFETY: as for the loads; one write per vector.
                                    unsafe { store_arr(&mut *p, y) };
                                }
                                held = 0;
                            }
                        }
                        let tail = width % LANES;
                        if tail > 0 {
                            // SAFETY: the row's `tail` floats after its last full vector.
                            let rem = unsafe { std::slice::from_raw_parts_mut(row.add(full * LANES), tail) };
                            let $one = load_part(rem, 0.0);
                            store_part(rem, $e1);
                        }
                    }
                    for &p in group.iter().take(held) {
                        // SAFETY: as above: a full vector of a row, not yet written.
                        let c = unsafe { &mut *p };
                        let $one = load_arr(c);
                        store_arr(c, $e1);
                    }
                }};
            }
            match a {
                Act::Sigmoid => each_n!(x => sigmoid_n(x), x => sigmoid(x)),
                Act::Silu => each_n!(x => {
                    let s = sigmoid_n(x);
                    std::array::from_fn(|v| mul(x[v], s[v]))
                }, x => mul(x, sigmoid(x))),
                Act::Gelu { tanh: false } => each!(x => gelu_erf(x)),
                Act::Gelu { tanh: true } => each!(x => gelu_tanh(x)),
                Act::Tanh => each!(x => tanh(x)),
                Act::Erf => each!(x => erf(x)),
                _ => each!(x => act(a, x)),
            }
        }

        /// [`act`] kept out of line, so its exp and erf code does not crowd the tiles.
        #[target_feature(enable = $feat)]
        #[inline(never)]
        fn act_call(a: Act, x: V) -> V {
            act(a, x)
        }

        /// A tile's cheap activation with its decisions taken once per tile: Relu, a clamp
        /// (Clip, an absent bound at infinity: `max(-inf, x)` and `min(inf, x)` are `x`, NaN
        /// and signed zeros included), a line clamped to [0, 1] (HardSigmoid; HardSwish then
        /// multiplies by `x`), LeakyRelu, or nothing (no activation, or a costly one, which
        /// the caller applies itself). Matching `Act` per vector instead had the compiler
        /// branch on its discriminant and spill it for every row of every tile (K = 16: the
        /// epilogue was a fifth of the tile). The hard and leaky kinds had gone through the
        /// costly activations' pass over the stored tile: 12% of PP-LCNet's time, HardSwish.
        #[derive(Clone, Copy)]
        struct Cheap {
            relu: bool,
            clamp: bool,
            /// `clamp01(p x + q)`, times `x` with `swish`.
            line: bool,
            swish: bool,
            /// `x < 0 ? p x : x`.
            leaky: bool,
            /// Then `x * s` and `+ b` (the epilogue's `post`, each rounded on its own).
            scale: bool,
            shift: bool,
            lo: V,
            hi: V,
            p: V,
            q: V,
            s: V,
            b: V,
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn cheap_of(a: Option<Act>, post: Option<Affine>) -> Cheap {
            let mut c = Cheap {
                relu: false,
                clamp: false,
                line: false,
                swish: false,
                leaky: false,
                scale: false,
                shift: false,
                lo: zero(),
                hi: zero(),
                p: zero(),
                q: zero(),
                s: zero(),
                b: zero(),
            };
            // After a costly activation the caller applies `post` itself, over the stored rows.
            if let Some(Affine { scale, shift }) = post.filter(|_| a.is_none_or(Act::is_cheap)) {
                if let Some(s) = scale {
                    (c.scale, c.s) = (true, splat(s));
                }
                if let Some(b) = shift {
                    (c.shift, c.b) = (true, splat(b));
                }
            }
            match a {
                Some(Act::Relu) => c.relu = true,
                Some(Act::Clip { min: lo, max: hi }) => {
                    c.clamp = true;
                    c.lo = splat(lo.unwrap_or(f32::NEG_INFINITY));
                    c.hi = splat(hi.unwrap_or(f32::INFINITY));
                }
                Some(Act::HardSigmoid { alpha, beta }) => {
                    c.line = true;
                    (c.p, c.q) = (splat(alpha), splat(beta));
                }
                Some(Act::HardSwish) => {
                    (c.line, c.swish) = (true, true);
                    (c.p, c.q) = (splat(1.0 / 6.0), splat(0.5));
                }
                Some(Act::LeakyRelu { alpha }) => {
                    c.leaky = true;
                    c.p = splat(alpha);
                }
                _ => {}
            }
            c
        }

        /// [`Cheap`] on one vector. `max(lo, v)` is `lo > v ? lo : v` and `min(hi, v)` is
        /// `hi < v ? hi : v` (x86's rule: the second operand when unordered), so a NaN stays
        /// and signed zeros pass as with a compare and blend, in one instruction each. The
        /// line and the leaky slope are [`act`]'s expressions, so the bits are its bits.
        #[target_feature(enable = $feat)]
        #[inline]
        fn apply_cheap(c: Cheap, v: V) -> V {
            let mut v = v;
            if c.relu {
                v = blend(gt_or_nan(v, zero()), v, zero());
            }
            if c.clamp {
                v = min(c.hi, max(c.lo, v));
            }
            if c.line {
                let s = clamp01(fmadd(c.p, v, c.q));
                v = if c.swish { mul(v, s) } else { s };
            }
            if c.leaky {
                v = blend(lt(v, zero()), mul(v, c.p), v);
            }
            if c.scale {
                v = mul(v, c.s);
            }
            if c.shift {
                v = add(v, c.b);
            }
            v
        }

        /// [`apply_cheap`] on a whole tile of accumulators, each decision taken once for the
        /// tile rather than per vector: inlined into a tile of constant size the loops unroll
        /// and the accumulators stay in registers, where a per-vector call kept them in a
        /// stack array and tested every flag twelve times (a 6 x 16 GEMM tile of depth 16
        /// spent longer in its epilogue than in its products). Arrays, never a slice: a
        /// flattened slice of the accumulators kept them in memory through the depth loop.
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(dead_code)]
        fn apply_cheap_all<const A: usize, const B: usize, const C: usize>(c: Cheap, acc: &mut [[[V; C]; B]; A]) {
            macro_rules! each {
                ($v:ident => $e:expr) => {
                    for plane in acc.iter_mut() {
                        for row in plane.iter_mut() {
                            for x in row.iter_mut() {
                                let $v = *x;
                                *x = $e;
                            }
                        }
                    }
                };
            }
            if c.relu {
                each!(v => blend(gt_or_nan(v, zero()), v, zero()));
            }
            if c.clamp {
                each!(v => min(c.hi, max(c.lo, v)));
            }
            if c.line {
                if c.swish {
                    each!(v => mul(v, clamp01(fmadd(c.p, v, c.q))));
                } else {
                    each!(v => clamp01(fmadd(c.p, v, c.q)));
                }
            }
            if c.leaky {
                each!(v => blend(lt(v, zero()), mul(v, c.p), v));
            }
            if c.scale {
                each!(v => mul(v, c.s));
            }
            if c.shift {
                each!(v => add(v, c.b));
            }
        }

        /// The GEMM epilogue's cheap activation and affine (see `Cheap`) for kernels outside
        /// the GEMM that keep their results in registers ([`crate::planar`], [`crate::stem`]).
        #[derive(Clone, Copy)]
        pub(crate) struct VecEpi(Cheap);

        impl VecEpi {
            /// `a` must be cheap ([`Act::is_cheap`]) or absent: a costly one is left out.
            #[target_feature(enable = $feat)]
            pub(crate) fn new(a: Option<Act>, post: Option<Affine>) -> VecEpi {
                VecEpi(cheap_of(a, post))
            }

            /// The activation, then the affine, on one vector.
            #[target_feature(enable = $feat)]
            #[inline]
            pub(crate) fn apply(self, v: V) -> V {
                apply_cheap(self.0, v)
            }

            /// [`VecEpi::apply`] on every vector of a tile, each decision once (see
            /// `apply_cheap_all`).
            #[target_feature(enable = $feat)]
            #[inline]
            #[allow(dead_code)]
            pub(crate) fn apply_all<const A: usize, const B: usize, const C: usize>(self, v: &mut [[[V; C]; B]; A]) {
                apply_cheap_all(self.0, v)
            }
        }

        /// `acc + row_bias + col_bias + resid`, then the cheap activation and affine, on one
        /// vector (inlined into the tiles: no spill of the accumulators around a call for
        /// bias, residual, Relu or Clip). The activation comes set up (`cheap_of`, once per
        /// row or tile): set up per vector, a HardSwish pass over a depthwise layer's rows
        /// took 40 cycles a vector.
        #[target_feature(enable = $feat)]
        #[inline]
        fn epi_vec(mut v: V, rb: Option<V>, cb: Option<V>, r: Option<V>, a: Cheap) -> V {
            if let Some(b) = rb {
                v = add(v, b);
            }
            if let Some(b) = cb {
                v = add(v, b);
            }
            if let Some(r) = r {
                v = add(v, r);
            }
            apply_cheap(a, v)
        }
    };
}
