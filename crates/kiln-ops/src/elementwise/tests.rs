//! Values worked out by hand or taken from the ONNX operator spec examples.
#![allow(clippy::unwrap_used, clippy::panic)]

use super::*;
use kiln_tensor::{DType, Tensor, f16};

fn t<T: kiln_tensor::Element>(shape: &[usize], v: Vec<T>) -> Tensor {
    Tensor::from_vec(shape, v).unwrap()
}

fn run(op: ElementwiseOp, inputs: &[Tensor]) -> Tensor {
    let vals: Vec<Value> = inputs.iter().cloned().map(Value::Tensor).collect();
    let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
    let mut out = op.eval(&Args::new(&refs)).unwrap();
    match out.remove(0) {
        Value::Tensor(t) => t,
        v => panic!("not a tensor: {v:?}"),
    }
}

fn bin(op: BinaryOp) -> ElementwiseOp {
    ElementwiseOp::Binary(Binary { op, legacy_axis: None })
}

fn close(got: &Tensor, want: &[f32]) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{got:?}");
    for (a, b) in g.iter().zip(want) {
        assert!(
            (a - *b as f64).abs() <= 1e-5 + 1e-5 * (*b as f64).abs(),
            "got {g:?} want {want:?}"
        );
    }
}

#[test]
fn elementwise_add_broadcasts() {
    let a = t(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]);
    let b = t(&[3], vec![10f32, 20., 30.]);
    let r = run(bin(BinaryOp::Add), &[a, b]);
    assert_eq!(r.shape(), &[2, 3]);
    assert_eq!(r.as_slice::<f32>().unwrap(), &[11., 22., 33., 14., 25., 36.]);
    let r = run(bin(BinaryOp::Add), &[t(&[2], vec![250u8, 1]), t(&[], vec![10u8])]);
    assert_eq!(r.as_slice::<u8>().unwrap(), &[4, 11]);
}

#[test]
fn elementwise_div_truncates_integers() {
    let r = run(
        bin(BinaryOp::Div),
        &[t(&[4], vec![7i32, -7, 7, -7]), t(&[4], vec![2i32, 2, -2, -2])],
    );
    assert_eq!(r.as_slice::<i32>().unwrap(), &[3, -3, -3, 3]);
}

#[test]
fn elementwise_mod_both_modes() {
    let x = t(&[6], vec![-4i64, 7, 5, 4, -7, 8]);
    let y = t(&[6], vec![2i64, -3, 8, -2, 3, 5]);
    let r = run(bin(BinaryOp::Mod { fmod: false }), &[x.clone(), y.clone()]);
    assert_eq!(r.as_slice::<i64>().unwrap(), &[0, -2, 5, 0, 2, 3]);
    let r = run(bin(BinaryOp::Mod { fmod: true }), &[x, y]);
    assert_eq!(r.as_slice::<i64>().unwrap(), &[0, 1, 5, 0, -1, 3]);
    let r = run(
        bin(BinaryOp::Mod { fmod: true }),
        &[t(&[2], vec![-4.5f64, 7.5]), t(&[2], vec![2.0f64, -2.0])],
    );
    assert_eq!(r.as_slice::<f64>().unwrap(), &[-0.5, 1.5]);
}

#[test]
fn elementwise_pow_mixed_types() {
    let r = run(
        bin(BinaryOp::Pow),
        &[t(&[3], vec![1f32, 2., 3.]), t(&[3], vec![4i64, 5, 6])],
    );
    assert_eq!(r.as_slice::<f32>().unwrap(), &[1., 32., 729.]);
    let r = run(
        bin(BinaryOp::Pow),
        &[t(&[3], vec![1i32, 2, 3]), t(&[3], vec![4f32, 5., 6.])],
    );
    assert_eq!(r.as_slice::<i32>().unwrap(), &[1, 32, 729]);
    let r = run(bin(BinaryOp::Pow), &[t(&[2], vec![2i64, -3]), t(&[2], vec![10i64, 3])]);
    assert_eq!(r.as_slice::<i64>().unwrap(), &[1024, -27]);
}

#[test]
fn elementwise_bitshift_out_of_range_counts() {
    let left = bin(BinaryOp::BitShift { left: true });
    let right = bin(BinaryOp::BitShift { left: false });
    let x = t(&[3], vec![-8i8, 4, -1]);
    let r = run(right, &[x.clone(), t(&[3], vec![8i8, 9, 127])]);
    assert_eq!(r.as_slice::<i8>().unwrap(), &[-1, 0, -1]);
    let r = run(left.clone(), &[x, t(&[3], vec![-1i8, -8, -16])]);
    assert_eq!(r.as_slice::<i8>().unwrap(), &[0, 0, 0]);
    let r = run(left, &[t(&[3], vec![16u8, 4, 1]), t(&[3], vec![1u8, 2, 3])]);
    assert_eq!(r.as_slice::<u8>().unwrap(), &[32, 16, 8]);
}

#[test]
fn elementwise_compare_and_logic() {
    let r = run(
        bin(BinaryOp::Less),
        &[t(&[3], vec![1f32, 2., f32::NAN]), t(&[], vec![2f32])],
    );
    assert_eq!(r.as_slice::<bool>().unwrap(), &[true, false, false]);
    let r = run(
        bin(BinaryOp::Equal),
        &[
            t(&[2], vec!["a".to_string(), "b".into()]),
            t(&[1], vec!["b".to_string()]),
        ],
    );
    assert_eq!(r.as_slice::<bool>().unwrap(), &[false, true]);
    let r = run(
        bin(BinaryOp::Xor),
        &[t(&[2, 2], vec![true, true, false, false]), t(&[2], vec![true, false])],
    );
    assert_eq!(r.as_slice::<bool>().unwrap(), &[false, true, true, false]);
    let r = run(
        bin(BinaryOp::BitwiseAnd),
        &[t(&[2], vec![0b1100u16, 0b1010]), t(&[2], vec![0b1010u16, 0b0110])],
    );
    assert_eq!(r.as_slice::<u16>().unwrap(), &[0b1000, 0b0010]);
}

#[test]
fn elementwise_mismatched_dtypes_are_refused() {
    let op = bin(BinaryOp::Add);
    let vals = [Value::Tensor(t(&[1], vec![1f32])), Value::Tensor(t(&[1], vec![1i32]))];
    let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
    assert!(matches!(op.eval(&Args::new(&refs)), Err(OpError::DTypeMismatch { .. })));
    let vals = [
        Value::Tensor(t(&[2], vec![1f32, 2.])),
        Value::Tensor(t(&[3], vec![1f32, 2., 3.])),
    ];
    let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
    assert!(op.eval(&Args::new(&refs)).is_err());
}

#[test]
fn elementwise_legacy_axis_broadcast() {
    let op = ElementwiseOp::Binary(Binary {
        op: BinaryOp::Add,
        legacy_axis: Some(0),
    });
    let a = t(&[2, 3], vec![0f32; 6]);
    let b = t(&[2], vec![1f32, 2.]);
    assert_eq!(run(op, &[a, b]).as_slice::<f32>().unwrap(), &[1., 1., 1., 2., 2., 2.]);
}

#[test]
fn elementwise_unary_math() {
    let u = |op| ElementwiseOp::Unary(op);
    let x = t(&[5], vec![-2.5f32, -0.5, 0.5, 1.5, 2.5]);
    assert_eq!(
        run(u(UnaryOp::Round), std::slice::from_ref(&x))
            .as_slice::<f32>()
            .unwrap(),
        &[-2., -0., 0., 2., 2.]
    );
    assert_eq!(
        run(u(UnaryOp::Floor), std::slice::from_ref(&x))
            .as_slice::<f32>()
            .unwrap(),
        &[-3., -1., 0., 1., 2.]
    );
    assert_eq!(
        run(u(UnaryOp::Sign), std::slice::from_ref(&x))
            .as_slice::<f32>()
            .unwrap(),
        &[-1., -1., 1., 1., 1.]
    );
    assert_eq!(
        run(u(UnaryOp::Relu), std::slice::from_ref(&x))
            .as_slice::<f32>()
            .unwrap(),
        &[0., 0., 0.5, 1.5, 2.5]
    );
    assert_eq!(
        run(u(UnaryOp::Abs), &[t(&[2], vec![-3i16, 4])])
            .as_slice::<i16>()
            .unwrap(),
        &[3, 4]
    );
    assert_eq!(
        run(u(UnaryOp::Neg), &[t(&[2], vec![-3i8, 4])])
            .as_slice::<i8>()
            .unwrap(),
        &[3, -4]
    );
    // sigmoid(0) = 0.5, erf(1) = 0.8427007929497149
    close(&run(u(UnaryOp::Sigmoid), &[t(&[1], vec![0f32])]), &[0.5]);
    close(&run(u(UnaryOp::Erf), &[t(&[1], vec![1f32])]), &[0.842_700_8]);
    // Spec examples: LeakyRelu alpha 0.1 on [-1, 0, 1]; Elu alpha 2 on -1: 2 * (e^-1 - 1).
    close(
        &run(u(UnaryOp::LeakyRelu { alpha: 0.1 }), &[t(&[3], vec![-1f32, 0., 1.])]),
        &[-0.1, 0., 1.],
    );
    close(
        &run(u(UnaryOp::Elu { alpha: 2.0 }), &[t(&[2], vec![-1f32, 3.])]),
        &[-1.264_241_1, 3.],
    );
    // HardSigmoid alpha 0.5 beta 0.6 on [-1, 0, 1] -> [0.1, 0.6, 1].
    close(
        &run(
            u(UnaryOp::HardSigmoid { alpha: 0.5, beta: 0.6 }),
            &[t(&[3], vec![-1f32, 0., 1.])],
        ),
        &[0.1, 0.6, 1.],
    );
    // Shrink lambd 1.5 bias 1.5 on [-2, -1, 0, 1, 2] -> [-0.5, 0, 0, 0, 0.5].
    close(
        &run(
            u(UnaryOp::Shrink { bias: 1.5, lambd: 1.5 }),
            &[t(&[5], vec![-2f32, -1., 0., 1., 2.])],
        ),
        &[-0.5, 0., 0., 0., 0.5],
    );
    // Gelu(1) = 0.5 * (1 + erf(1/sqrt 2)) = 0.8413447; tanh form 0.8411920.
    close(
        &run(u(UnaryOp::Gelu { tanh: false }), &[t(&[1], vec![1f32])]),
        &[0.841_344_7],
    );
    close(
        &run(u(UnaryOp::Gelu { tanh: true }), &[t(&[1], vec![1f32])]),
        &[0.841_192],
    );
    // Softplus(0) = ln 2, HardSwish(1) = 1 * (1/6 + 1/2).
    close(
        &run(u(UnaryOp::Softplus), &[t(&[1], vec![0f32])]),
        &[std::f32::consts::LN_2],
    );
    close(&run(u(UnaryOp::HardSwish), &[t(&[1], vec![1f32])]), &[2.0 / 3.0]);
    let h = run(u(UnaryOp::Sqrt), &[t(&[1], vec![f16::from_f32(4.0)])]);
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(h.as_slice::<f16>().unwrap(), &[f16::from_f32(2.0)]);
}

#[test]
fn elementwise_unary_predicates_and_types() {
    let x = t(&[4], vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0]);
    let r = run(ElementwiseOp::Unary(UnaryOp::IsNaN), std::slice::from_ref(&x));
    assert_eq!(r.as_slice::<bool>().unwrap(), &[true, false, false, false]);
    let r = run(
        ElementwiseOp::Unary(UnaryOp::IsInf {
            negative: false,
            positive: true,
        }),
        &[x],
    );
    assert_eq!(r.as_slice::<bool>().unwrap(), &[false, true, false, false]);
    let r = run(ElementwiseOp::Unary(UnaryOp::BitwiseNot), &[t(&[2], vec![0u8, 0xF0])]);
    assert_eq!(r.as_slice::<u8>().unwrap(), &[0xFF, 0x0F]);
    let vals = [Value::Tensor(t(&[1], vec![1i32]))];
    let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
    assert!(ElementwiseOp::Unary(UnaryOp::Exp).eval(&Args::new(&refs)).is_err());
}

#[test]
fn elementwise_variadic() {
    let a = t(&[3], vec![3f32, 2., 1.]);
    let b = t(&[3], vec![1f32, 4., 4.]);
    let c = t(&[3], vec![2f32, 5., 0.]);
    let ins = [a.clone(), b.clone(), c.clone()];
    assert_eq!(
        run(ElementwiseOp::Variadic(VariadicOp::Max), &ins)
            .as_slice::<f32>()
            .unwrap(),
        &[3., 5., 4.]
    );
    assert_eq!(
        run(ElementwiseOp::Variadic(VariadicOp::Min), &ins)
            .as_slice::<f32>()
            .unwrap(),
        &[1., 2., 0.]
    );
    assert_eq!(
        run(ElementwiseOp::Variadic(VariadicOp::Sum), &ins)
            .as_slice::<f32>()
            .unwrap(),
        &[6., 11., 5.]
    );
    assert_eq!(
        run(ElementwiseOp::Variadic(VariadicOp::Mean), &ins)
            .as_slice::<f32>()
            .unwrap(),
        &[2., 11. / 3., 5. / 3.]
    );
    let r = run(
        ElementwiseOp::Variadic(VariadicOp::Max),
        &[t(&[2], vec![1f32, f32::NAN]), t(&[1], vec![2f32])],
    );
    let v = r.as_slice::<f32>().unwrap();
    assert_eq!(v[0], 2.0);
    assert!(v[1].is_nan());
}

#[test]
fn elementwise_clip_where_prelu() {
    let x = t(&[4], vec![-2f32, 0., 2., f32::NAN]);
    let clip = ElementwiseOp::Clip(Clip { min: None, max: None });
    let r = run(clip.clone(), &[x.clone(), t(&[], vec![-1f32]), t(&[], vec![1f32])]);
    let v = r.as_slice::<f32>().unwrap();
    assert_eq!(&v[..3], &[-1., 0., 1.]);
    assert!(v[3].is_nan());
    // min > max: every element becomes max.
    let r = run(clip, &[x.clone(), t(&[], vec![2f32]), t(&[], vec![1f32])]);
    assert_eq!(&r.as_slice::<f32>().unwrap()[..3], &[1., 1., 1.]);
    let r = run(
        ElementwiseOp::Clip(Clip {
            min: Some(0.0),
            max: None,
        }),
        &[t(&[2], vec![-3i8, 3])],
    );
    assert_eq!(r.as_slice::<i8>().unwrap(), &[0, 3]);

    let c = t(&[2, 2], vec![true, false, true, true]);
    let r = run(
        ElementwiseOp::Where(Where),
        &[c, t(&[2, 2], vec![1i64, 2, 3, 4]), t(&[2], vec![9i64, 8])],
    );
    assert_eq!(r.as_slice::<i64>().unwrap(), &[1, 8, 3, 4]);

    let r = run(
        ElementwiseOp::PRelu(PRelu),
        &[t(&[2, 2], vec![-1f32, 2., -3., 4.]), t(&[2], vec![0.5f32, 0.25])],
    );
    assert_eq!(r.as_slice::<f32>().unwrap(), &[-0.5, 2., -1.5, 4.]);
    // A 1-D slope matching a non-trailing axis (the reference's fallback).
    let r = run(
        ElementwiseOp::PRelu(PRelu),
        &[
            t(&[2, 3], vec![-1f32, -1., -1., -2., -2., -2.]),
            t(&[2], vec![0.5f32, 2.]),
        ],
    );
    assert_eq!(r.as_slice::<f32>().unwrap(), &[-0.5, -0.5, -0.5, -4., -4., -4.]);
}

#[test]
fn elementwise_infer_types() {
    use crate::value::Dim;
    let a = ValueType::Tensor(TensorType::new(DType::F32, vec![Dim::Sym("N".into()), Dim::Fixed(3)]));
    let b = ValueType::Tensor(TensorType::fixed(DType::F32, &[3]));
    let ins = [
        InferInput {
            ty: &a,
            konst: None,
            present: true,
        },
        InferInput {
            ty: &b,
            konst: None,
            present: true,
        },
    ];
    let out = bin(BinaryOp::Less).infer(&ins).unwrap();
    assert_eq!(
        out,
        vec![ValueType::Tensor(TensorType::new(
            DType::Bool,
            vec![Dim::Sym("N".into()), Dim::Fixed(3)]
        ))]
    );
    let out = ElementwiseOp::Unary(UnaryOp::IsNaN).infer(&ins[..1]).unwrap();
    assert_eq!(out[0].tensor().unwrap().dtype, Some(DType::Bool));
    let c = ValueType::Tensor(TensorType::fixed(DType::I32, &[3]));
    let bad = [
        InferInput {
            ty: &a,
            konst: None,
            present: true,
        },
        InferInput {
            ty: &c,
            konst: None,
            present: true,
        },
    ];
    assert!(bin(BinaryOp::Add).infer(&bad).is_err());
    // Pow takes another exponent type and keeps the base's.
    let out = bin(BinaryOp::Pow).infer(&bad).unwrap();
    assert_eq!(out[0].tensor().unwrap().dtype, Some(DType::F32));
}

mod bcast_plan {
    //! The merged-loop broadcast plan against the per-element index map it replaced.
    use super::super::binary::Bcast;
    use crate::util::broadcast_map;
    use proptest::prelude::*;

    /// A shape of rank <= 4 with dims in 1..=4, and a second one broadcasting with it: each
    /// dim kept, set to 1, and leading dims dropped.
    fn pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        (
            prop::collection::vec(1usize..=4, 0..=4),
            prop::collection::vec(0u8..3, 4),
            0usize..=4,
            any::<bool>(),
        )
            .prop_map(|(full, picks, drop, swap)| {
                let b: Vec<usize> = full
                    .iter()
                    .zip(&picks)
                    .map(|(&d, &p)| if p == 0 { 1 } else { d })
                    .skip(drop.min(full.len()))
                    .collect();
                if swap { (b, full) } else { (full, b) }
            })
    }

    proptest! {
        #[test]
        fn zip_reads_what_numpy_broadcasting_reads((a, b) in pair()) {
            let m = Bcast::new(&a, &b).unwrap();
            let na: usize = a.iter().product();
            let nb: usize = b.iter().product();
            let xs: Vec<usize> = (0..na).collect();
            let ys: Vec<usize> = (0..nb).collect();
            let got = m.zip(&xs, &ys, |p, q| (p, q));
            let got_ref = m.zip_ref(&xs, &ys, |p, q| (*p, *q));
            let ia = broadcast_map(&a, &m.shape, 0).unwrap();
            let ib = broadcast_map(&b, &m.shape, 1).unwrap();
            let want: Vec<(usize, usize)> = ia.into_iter().zip(ib).collect();
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(&got_ref, &want);
        }
    }

    /// Large outputs split over a 2-thread pool read what the sequential plan reads: same
    /// shapes (one merged dim, blocks with a short last one), row and column broadcasts, a
    /// scalar, and broadcasts in the middle.
    #[test]
    fn parallel_zip_matches_the_sequential_plan() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (a, b) in [
            (vec![3, 40_001], vec![3, 40_001]),
            (vec![1, 197, 768], vec![768]),
            (vec![300, 1], vec![300, 700]),
            (vec![70_000], vec![]),
            (vec![5, 1, 130, 200], vec![5, 7, 1, 200]),
        ] {
            let m = Bcast::new(&a, &b).unwrap();
            let na: usize = a.iter().product();
            let nb: usize = b.iter().product();
            let xs: Vec<u32> = (0..na as u32).collect();
            let ys: Vec<u32> = (0..nb as u32).map(|v| v * 3 + 1).collect();
            let want = m.zip(&xs, &ys, |p, q| p.wrapping_mul(7) ^ q);
            let got = pool.install(|| m.zip_parallel(&xs, &ys, |p, q| p.wrapping_mul(7) ^ q));
            let got = got.expect("large enough to split");
            assert_eq!(got, want, "{a:?} with {b:?}");
            // One thread: not split.
            assert!(m.zip_parallel(&xs, &ys, |p: u32, q: u32| p ^ q).is_none());
        }
    }

    /// A short operand repeated along a long one (a per-channel parameter of a channels-last
    /// tensor, either side of a non-commutative op) takes the periodic path, on one thread
    /// and split over two, and gives what the plan's runs give; a period too long for it
    /// still gives the same values.
    #[test]
    fn periodic_arith_matches_the_plan() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        for (a, b, period) in [
            (vec![1, 306, 306, 10], vec![1, 1, 1, 10], Some((10, true))),
            (vec![7, 3], vec![3], Some((3, true))),
            (vec![3], vec![5, 3], Some((3, false))),
            (vec![1, 1, 32], vec![2, 149, 149, 32], Some((32, false))),
            (vec![2, 255], vec![255], Some((255, true))),
            (vec![4, 300], vec![300], None),
        ] {
            let m = Bcast::new(&a, &b).unwrap();
            assert_eq!(m.period(), period, "{a:?} with {b:?}");
            let na: usize = a.iter().product();
            let nb: usize = b.iter().product();
            let xs: Vec<f32> = (0..na).map(|v| (v % 1009) as f32 * 0.5).collect();
            let ys: Vec<f32> = (0..nb).map(|v| (v % 997) as f32 * 3.0 + 1.0).collect();
            let want = m.zip(&xs, &ys, |p, q| p - q);
            let got = m.arith(&xs, &ys, |p: f32, q: f32| p - q);
            assert_eq!(got.as_slice(), want.as_slice(), "{a:?} with {b:?}");
            let got = pool.install(|| m.arith(&xs, &ys, |p: f32, q: f32| p - q));
            assert_eq!(got.as_slice(), want.as_slice(), "{a:?} with {b:?} on 2 threads");
        }
    }

    #[test]
    fn empty_and_scalar_outputs() {
        let m = Bcast::new(&[2, 0, 3], &[3]).unwrap();
        assert!(m.zip(&[0f32; 0], &[1f32, 2., 3.], |p, q| p + q).is_empty());
        let m = Bcast::new(&[], &[1, 1]).unwrap();
        assert_eq!(m.zip(&[5f32], &[2f32], |p, q| p * q), vec![10.0]);
        // A slice shorter than the shape gives a short result instead of a panic.
        let m = Bcast::new(&[4], &[4]).unwrap();
        assert_eq!(m.zip(&[1f32, 2.], &[1f32, 2., 3., 4.], |p, q| p + q).len(), 0);
    }
}
