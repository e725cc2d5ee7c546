//! Unit tests: expected values worked out by hand or taken from the ONNX operator spec.

use super::*;

fn f32t(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}
fn i64t(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

/// Evaluates `op` on tensor inputs (`None` = absent).
fn run(op: MovementOp, inputs: Vec<Option<Tensor>>) -> Vec<Tensor> {
    let vals: Vec<Option<Value>> = inputs.into_iter().map(|t| t.map(Value::Tensor)).collect();
    let refs: Vec<Option<&Value>> = vals.iter().map(Option::as_ref).collect();
    op.eval(&Args::new(&refs))
        .unwrap()
        .into_iter()
        .map(|v| v.as_tensor().unwrap().clone())
        .collect()
}
fn run1(op: MovementOp, inputs: Vec<Option<Tensor>>) -> Tensor {
    run(op, inputs).remove(0)
}
fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

#[test]
fn reshape_copies_zero_and_infers_minus_one() {
    let x = f32t(&[2, 3, 4], &[0.0; 24]);
    let y = run1(
        MovementOp::Reshape(Reshape {
            shape: None,
            allowzero: false,
        }),
        vec![Some(x.clone()), Some(i64t(&[2], &[0, -1]))],
    );
    assert_eq!(y.shape(), &[2, 12]);
    let y = run1(
        MovementOp::Reshape(Reshape {
            shape: Some(vec![-1, 4, 1]),
            allowzero: false,
        }),
        vec![Some(x)],
    );
    assert_eq!(y.shape(), &[6, 4, 1]);
    // Symbolic inference: [N, 3, 4] -> [0, -1] is [N, 12].
    let ty = ValueType::Tensor(TensorType {
        dtype: Some(DType::F32),
        shape: Some(vec![Dim::Sym("N".into()), Dim::Fixed(3), Dim::Fixed(4)]),
    });
    let spec = Value::Tensor(i64t(&[2], &[0, -1]));
    let shape_ty = ValueType::Tensor(TensorType::fixed(DType::I64, &[2]));
    let inputs = [
        InferInput {
            ty: &ty,
            konst: None,
            present: true,
        },
        InferInput {
            ty: &shape_ty,
            konst: Some(&spec),
            present: true,
        },
    ];
    let out = MovementOp::Reshape(Reshape {
        shape: None,
        allowzero: false,
    })
    .infer(&inputs)
    .unwrap();
    assert_eq!(
        out[0].tensor().unwrap().shape,
        Some(vec![Dim::Sym("N".into()), Dim::Fixed(12)])
    );
}

#[test]
fn shape_clamps_start_and_end() {
    let x = f32t(&[2, 3, 4], &[0.0; 24]);
    let y = run1(
        MovementOp::Shape(Shape {
            start: -2,
            end: Some(10),
        }),
        vec![Some(x.clone())],
    );
    assert_eq!(y.as_slice::<i64>().unwrap(), &[3, 4]);
    let y = run1(MovementOp::Shape(Shape { start: 2, end: Some(1) }), vec![Some(x)]);
    assert_eq!(y.shape(), &[0]);
}

#[test]
fn transpose_2x3() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = run1(MovementOp::Transpose(Transpose { perm: None }), vec![Some(x)]);
    assert_eq!(y.shape(), &[3, 2]);
    assert_eq!(vals(&y), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn concat_axis1_strings() {
    let a = Tensor::from_vec(vec![2, 1], vec!["a".to_string(), "b".into()]).unwrap();
    let b = Tensor::from_vec(vec![2, 2], vec!["c".to_string(), "d".into(), "e".into(), "f".into()]).unwrap();
    let y = run1(MovementOp::Concat(Concat { axis: -1 }), vec![Some(a), Some(b)]);
    assert_eq!(y.shape(), &[2, 3]);
    assert_eq!(y.as_slice::<String>().unwrap(), &["a", "c", "d", "b", "e", "f"]);
}

#[test]
fn split_uneven_num_outputs() {
    let x = f32t(&[7], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let ys = run(
        MovementOp::Split(Split {
            axis: 0,
            split: None,
            num_outputs: Some(4),
            outputs: 4,
        }),
        vec![Some(x)],
    );
    let lens: Vec<usize> = ys.iter().map(|t| t.len()).collect();
    assert_eq!(lens, vec![2, 2, 2, 1]);
    assert_eq!(vals(&ys[3]), vec![7.0]);
}

/// Fuzz finding: a `num_outputs` of 2^60 on a one-output node sized a vector of output types
/// by it; it must equal the node's outputs and is refused, naming the attribute, otherwise.
#[test]
fn split_num_outputs_other_than_the_outputs_is_refused() {
    let op = Split {
        axis: 0,
        split: None,
        num_outputs: Some(1 << 60),
        outputs: 1,
    };
    let x = Value::Tensor(f32t(&[4], &[1.0, 2.0, 3.0, 4.0]));
    let err = op.eval(&Args::new(&[Some(&x)])).unwrap_err().to_string();
    assert!(
        err.contains("num_outputs") && err.contains("1152921504606846976"),
        "{err}"
    );
    let err = op.infer(&[]).unwrap_err().to_string();
    assert!(err.contains("num_outputs"), "{err}");
}

#[test]
fn slice_negative_step_and_clamping() {
    let x = f32t(&[5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
    let y = run1(
        MovementOp::Slice(Slice { attrs: None }),
        vec![
            Some(x.clone()),
            Some(i64t(&[1], &[-1])),
            Some(i64t(&[1], &[i64::MIN])),
            None,
            Some(i64t(&[1], &[-2])),
        ],
    );
    assert_eq!(vals(&y), vec![4.0, 2.0, 0.0]);
    let y = run1(
        MovementOp::Slice(Slice { attrs: None }),
        vec![Some(x), Some(i64t(&[1], &[1])), Some(i64t(&[1], &[1000])), None, None],
    );
    assert_eq!(vals(&y), vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn pad_modes() {
    let x = f32t(&[3], &[1.0, 2.0, 3.0]);
    let pad = |mode| {
        run1(
            MovementOp::Pad(Pad {
                mode,
                pads: None,
                value: 0.0,
            }),
            vec![Some(x.clone()), Some(i64t(&[2], &[2, 2]))],
        )
    };
    assert_eq!(vals(&pad(PadMode::Reflect)), vec![3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0]);
    assert_eq!(vals(&pad(PadMode::Edge)), vec![1.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0]);
    assert_eq!(vals(&pad(PadMode::Wrap)), vec![2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0]);
    let y = run1(
        MovementOp::Pad(Pad {
            mode: PadMode::Constant,
            pads: None,
            value: 0.0,
        }),
        vec![Some(x.clone()), Some(i64t(&[2], &[1, -1])), Some(f32t(&[], &[9.0]))],
    );
    assert_eq!(vals(&y), vec![9.0, 1.0, 2.0]);
}

#[test]
fn reflect_pads_every_axis_in_every_copied_type() {
    // [2, 3] padded by (1, 0) rows and (2, 1) columns: rows [1, 0, 1], columns reflected
    // [2, 1, 0, 1, 2, 1] of each row.
    let v = [1i64, 2, 3, 4, 5, 6];
    let want = [6i64, 5, 4, 5, 6, 5, 3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5];
    let inputs = [
        Tensor::from_vec(vec![2, 3], v.to_vec()).unwrap(),
        Tensor::from_vec(vec![2, 3], v.iter().map(|&a| a as u8).collect::<Vec<u8>>()).unwrap(),
        Tensor::from_vec(vec![2, 3], v.iter().map(|&a| -a as i8).collect::<Vec<i8>>()).unwrap(),
        Tensor::from_vec(vec![2, 3], v.iter().map(|&a| a as f32).collect::<Vec<f32>>()).unwrap(),
    ];
    for x in inputs {
        let sign = if x.dtype() == kiln_tensor::DType::I8 { -1.0 } else { 1.0 };
        let y = run1(
            MovementOp::Pad(Pad {
                mode: PadMode::Reflect,
                pads: None,
                value: 0.0,
            }),
            vec![Some(x), Some(i64t(&[4], &[1, 2, 0, 1]))],
        );
        assert_eq!(y.shape(), &[3, 6]);
        let want: Vec<f64> = want.iter().map(|&a| sign * a as f64).collect();
        assert_eq!(y.to_f64_vec(), want, "{:?}", y.dtype());
    }
}

#[test]
fn gather_and_gather_elements() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = run1(
        MovementOp::Gather(Gather { axis: 1 }),
        vec![Some(x.clone()), Some(i64t(&[2], &[-1, 0]))],
    );
    assert_eq!(y.shape(), &[2, 2]);
    assert_eq!(vals(&y), vec![3.0, 1.0, 6.0, 4.0]);
    // A scalar index picks a column (one element per row).
    let y = run1(
        MovementOp::Gather(Gather { axis: 1 }),
        vec![Some(x.clone()), Some(i64t(&[], &[1]))],
    );
    assert_eq!(y.shape(), &[2]);
    assert_eq!(vals(&y), vec![2.0, 5.0]);
    // An index out of range is an error, not a value.
    let bad = [Some(Value::Tensor(x.clone())), Some(Value::Tensor(i64t(&[1], &[3])))];
    let refs: Vec<Option<&Value>> = bad.iter().map(Option::as_ref).collect();
    assert!(MovementOp::Gather(Gather { axis: 1 }).eval(&Args::new(&refs)).is_err());
    let y = run1(
        MovementOp::GatherElements(GatherElements { axis: 0 }),
        vec![Some(x), Some(i64t(&[1, 3], &[1, 0, 1]))],
    );
    assert_eq!(vals(&y), vec![4.0, 2.0, 6.0]);
}

#[test]
fn gathernd_batch_dims() {
    // Spec example 5: batch_dims = 1.
    let x = i64t(&[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
    let y = run1(
        MovementOp::GatherND(GatherND { batch_dims: 1 }),
        vec![Some(x), Some(i64t(&[2, 1], &[1, 0]))],
    );
    assert_eq!(y.shape(), &[2, 2]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[2, 3, 4, 5]);
}

/// GatherND picking single elements of an f32 vector (`x[indices]`), negative indices
/// counting from the end; an index out of range is an error.
#[test]
fn gathernd_picks_vector_elements() {
    let x = f32t(&[5], &[10.0, 11.0, 12.0, 13.0, 14.0]);
    let y = run1(
        MovementOp::GatherND(GatherND { batch_dims: 0 }),
        vec![Some(x.clone()), Some(i64t(&[3, 1], &[3, -1, 0]))],
    );
    assert_eq!(y.shape(), &[3]);
    assert_eq!(vals(&y), vec![13.0, 14.0, 10.0]);
    let bad = [Some(Value::Tensor(x)), Some(Value::Tensor(i64t(&[1, 1], &[5])))];
    let refs: Vec<Option<&Value>> = bad.iter().map(Option::as_ref).collect();
    assert!(
        MovementOp::GatherND(GatherND { batch_dims: 0 })
            .eval(&Args::new(&refs))
            .is_err()
    );
}

#[test]
fn scatter_reductions() {
    let x = f32t(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let y = run1(
        MovementOp::ScatterND(ScatterND {
            reduction: Reduction::Add,
        }),
        vec![
            Some(x.clone()),
            Some(i64t(&[2, 1], &[1, 1])),
            Some(f32t(&[2], &[10.0, 20.0])),
        ],
    );
    assert_eq!(vals(&y), vec![1.0, 32.0, 3.0, 4.0]);
    let y = run1(
        MovementOp::ScatterElements(ScatterElements {
            axis: 0,
            reduction: Reduction::None,
        }),
        vec![
            Some(x.clone()),
            Some(i64t(&[2], &[-1, 0])),
            Some(f32t(&[2], &[7.0, 8.0])),
        ],
    );
    assert_eq!(vals(&y), vec![8.0, 2.0, 3.0, 7.0]);
    let y = run1(
        MovementOp::ScatterElements(ScatterElements {
            axis: 0,
            reduction: Reduction::Min,
        }),
        vec![Some(x), Some(i64t(&[2], &[3, 3])), Some(f32t(&[2], &[7.0, 0.5]))],
    );
    assert_eq!(vals(&y), vec![1.0, 2.0, 3.0, 0.5]);
}

#[test]
fn scatter_and_gather_elements_of_smaller_indices_on_every_axis() {
    // Data [3, 4, 5]; indices [2, 3, 4] (smaller off the axis too), against nested loops.
    let ds = [3usize, 4, 5];
    let is = [2usize, 3, 4];
    let data: Vec<f32> = (0..60).map(|v| v as f32).collect();
    let x = f32t(&ds, &data);
    for axis in 0..3 {
        let idx: Vec<i64> = (0..24)
            .map(|f| ((f * 7 + axis * 3) % ds[axis]) as i64 - (f % 2) as i64 * ds[axis] as i64)
            .collect();
        let upd: Vec<f32> = (0..24).map(|f| 100.0 + f as f32).collect();
        let mut want = data.clone();
        let mut gathered = Vec::new();
        let mut f = 0;
        for a in 0..is[0] {
            for b in 0..is[1] {
                for c in 0..is[2] {
                    let mut p = [a, b, c];
                    p[axis] = idx[f].rem_euclid(ds[axis] as i64) as usize;
                    let at = (p[0] * ds[1] + p[1]) * ds[2] + p[2];
                    want[at] = upd[f];
                    gathered.push(data[at] as f64);
                    f += 1;
                }
            }
        }
        let y = run1(
            MovementOp::ScatterElements(ScatterElements {
                axis: axis as i64,
                reduction: Reduction::None,
            }),
            vec![Some(x.clone()), Some(i64t(&is, &idx)), Some(f32t(&is, &upd))],
        );
        assert_eq!(y.as_slice::<f32>().unwrap(), want.as_slice(), "scatter, axis {axis}");
        let y = run1(
            MovementOp::GatherElements(GatherElements { axis: axis as i64 }),
            vec![Some(x.clone()), Some(i64t(&is, &idx))],
        );
        assert_eq!(vals(&y), gathered, "gather, axis {axis}");
    }
}

#[test]
fn transposes_of_index_tensors_and_unit_dims() {
    // i64 on the loop nest: [2, 3, 4] by (2, 0, 1), against the definition.
    let v: Vec<i64> = (0..24).map(|i| i * 3 - 7).collect();
    let y = run1(
        MovementOp::Transpose(Transpose {
            perm: Some(vec![2, 0, 1]),
        }),
        vec![Some(i64t(&[2, 3, 4], &v))],
    );
    assert_eq!(y.shape(), &[4, 2, 3]);
    let want: Vec<i64> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (i * 12 + j * 4 + k) as i64 * 3 - 7)))
        .collect();
    assert_eq!(y.as_slice::<i64>().unwrap(), want.as_slice());
    // Only a unit dim moves: the same elements in the same order, under the new shape.
    let y = run1(
        MovementOp::Transpose(Transpose { perm: Some(vec![1, 0]) }),
        vec![Some(i64t(&[1, 5], &[4, 1, 3, 0, 2]))],
    );
    assert_eq!(y.shape(), &[5, 1]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[4, 1, 3, 0, 2]);
    let y = run1(
        MovementOp::Transpose(Transpose {
            perm: Some(vec![0, 2, 3, 1]),
        }),
        vec![Some(f32t(&[2, 1, 1, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))],
    );
    assert_eq!(y.shape(), &[2, 1, 3, 1]);
    assert_eq!(vals(&y), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn nonzero_of_bools_and_matrices() {
    let b = Tensor::from_vec(vec![5], vec![false, true, true, false, true]).unwrap();
    let y = run1(MovementOp::NonZero(NonZero), vec![Some(b)]);
    assert_eq!(y.shape(), &[1, 3]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[1, 2, 4]);
    let y = run1(
        MovementOp::NonZero(NonZero),
        vec![Some(i64t(&[2, 3], &[0, 7, 0, -1, 0, 2]))],
    );
    assert_eq!(y.shape(), &[2, 3]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[0, 1, 1, 1, 0, 2]);
}

#[test]
fn topk_ties_prefer_lower_index() {
    let x = f32t(&[5], &[1.0, 3.0, 3.0, 2.0, 3.0]);
    let ys = run(
        MovementOp::TopK(TopK {
            axis: -1,
            largest: true,
            sorted: true,
            k: None,
        }),
        vec![Some(x.clone()), Some(i64t(&[1], &[2]))],
    );
    assert_eq!(vals(&ys[0]), vec![3.0, 3.0]);
    assert_eq!(ys[1].as_slice::<i64>().unwrap(), &[1, 2]);
    let ys = run(
        MovementOp::TopK(TopK {
            axis: 0,
            largest: false,
            sorted: true,
            k: Some(2),
        }),
        vec![Some(x)],
    );
    assert_eq!(vals(&ys[0]), vec![1.0, 2.0]);
    assert_eq!(ys[1].as_slice::<i64>().unwrap(), &[0, 3]);
}

#[test]
fn unique_spec_examples() {
    // Example 1: unsorted.
    let x = f32t(&[6], &[2.0, 1.0, 1.0, 3.0, 4.0, 3.0]);
    let ys = run(
        MovementOp::Unique(Unique {
            axis: None,
            sorted: false,
        }),
        vec![Some(x)],
    );
    assert_eq!(vals(&ys[0]), vec![2.0, 1.0, 3.0, 4.0]);
    assert_eq!(ys[1].as_slice::<i64>().unwrap(), &[0, 1, 3, 4]);
    assert_eq!(ys[2].as_slice::<i64>().unwrap(), &[0, 1, 1, 2, 3, 2]);
    assert_eq!(ys[3].as_slice::<i64>().unwrap(), &[1, 2, 2, 1]);
    // Example 3: sorted along axis 0.
    let x = i64t(&[3, 3], &[1, 0, 0, 1, 0, 0, 2, 3, 4]);
    let ys = run(
        MovementOp::Unique(Unique {
            axis: Some(0),
            sorted: true,
        }),
        vec![Some(x)],
    );
    assert_eq!(ys[0].shape(), &[2, 3]);
    assert_eq!(ys[0].as_slice::<i64>().unwrap(), &[1, 0, 0, 2, 3, 4]);
    assert_eq!(ys[1].as_slice::<i64>().unwrap(), &[0, 2]);
    assert_eq!(ys[2].as_slice::<i64>().unwrap(), &[0, 0, 1]);
    assert_eq!(ys[3].as_slice::<i64>().unwrap(), &[2, 1]);
}

#[test]
fn cumsum_exclusive_reverse() {
    let x = f32t(&[3], &[1.0, 2.0, 3.0]);
    let y = run1(
        MovementOp::CumSum(CumSum {
            exclusive: true,
            reverse: true,
        }),
        vec![Some(x.clone()), Some(i64t(&[], &[0]))],
    );
    assert_eq!(vals(&y), vec![5.0, 3.0, 0.0]);
    let y = run1(
        MovementOp::CumProd(CumProd {
            exclusive: false,
            reverse: false,
        }),
        vec![Some(x), Some(i64t(&[], &[0]))],
    );
    assert_eq!(vals(&y), vec![1.0, 2.0, 6.0]);
}

#[test]
fn depth_space_round_trip() {
    // 1x4x1x1 -> DCR depth-to-space 2 gives a 1x1x2x2 with channels laid out row-major.
    let x = f32t(&[1, 4, 1, 1], &[0.0, 1.0, 2.0, 3.0]);
    let y = run1(
        MovementOp::DepthToSpace(DepthToSpace {
            blocksize: 2,
            crd: false,
        }),
        vec![Some(x.clone())],
    );
    assert_eq!(y.shape(), &[1, 1, 2, 2]);
    assert_eq!(vals(&y), vec![0.0, 1.0, 2.0, 3.0]);
    // 1x8x1x1 DCR: channel = (bh * 2 + bw) * C + c with C = 2.
    let x = f32t(&[1, 8, 1, 1], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let y = run1(
        MovementOp::DepthToSpace(DepthToSpace {
            blocksize: 2,
            crd: false,
        }),
        vec![Some(x.clone())],
    );
    assert_eq!(vals(&y), vec![0.0, 2.0, 4.0, 6.0, 1.0, 3.0, 5.0, 7.0]);
    let z = run1(
        MovementOp::SpaceToDepth(SpaceToDepth {
            blocksize: 2,
            crd: false,
        }),
        vec![Some(y)],
    );
    assert_eq!(z, x);
}

#[test]
fn onehot_negative_index_and_range() {
    let y = run1(
        MovementOp::OneHot(OneHot { axis: -1 }),
        vec![
            Some(i64t(&[2], &[-1, 5])),
            Some(i64t(&[], &[3])),
            Some(f32t(&[2], &[0.0, 1.0])),
        ],
    );
    assert_eq!(y.shape(), &[2, 3]);
    assert_eq!(vals(&y), vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    let y = run1(
        MovementOp::Range(Range),
        vec![Some(i64t(&[], &[10])), Some(i64t(&[], &[4])), Some(i64t(&[], &[-2]))],
    );
    assert_eq!(y.as_slice::<i64>().unwrap(), &[10, 8, 6]);
    let y = run1(
        MovementOp::Range(Range),
        vec![
            Some(f32t(&[], &[1.0])),
            Some(f32t(&[], &[2.0])),
            Some(f32t(&[], &[0.3])),
        ],
    );
    assert_eq!(y.len(), 4);
}

#[test]
fn trilu_and_eyelike() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = run1(
        MovementOp::Trilu(Trilu { upper: true }),
        vec![Some(x.clone()), Some(i64t(&[], &[1]))],
    );
    assert_eq!(vals(&y), vec![0.0, 2.0, 3.0, 0.0, 0.0, 6.0]);
    let y = run1(MovementOp::Trilu(Trilu { upper: false }), vec![Some(x.clone())]);
    assert_eq!(vals(&y), vec![1.0, 0.0, 0.0, 4.0, 5.0, 0.0]);
    let y = run1(
        MovementOp::EyeLike(EyeLike {
            dtype: Some(DType::I32),
            k: -1,
        }),
        vec![Some(x)],
    );
    assert_eq!(y.as_slice::<i32>().unwrap(), &[0, 0, 0, 1, 0, 0]);
}

#[test]
fn col2im_overlapping_blocks_sum() {
    // One channel, 1-D-like image 1x3, block 1x2, stride 1: columns [a0 a1] and [b0 b1]
    // land on pixels (0,1) and (1,2).
    let x = f32t(&[1, 2, 2], &[1.0, 10.0, 2.0, 20.0]);
    let y = run1(
        MovementOp::Col2Im(Col2Im {
            dilations: None,
            pads: None,
            strides: None,
        }),
        vec![Some(x), Some(i64t(&[2], &[1, 3])), Some(i64t(&[2], &[1, 2]))],
    );
    assert_eq!(y.shape(), &[1, 1, 1, 3]);
    assert_eq!(vals(&y), vec![1.0, 12.0, 20.0]);
}

#[test]
fn compress_nonzero_reverse_sequence() {
    let x = f32t(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cond = Tensor::from_vec(vec![3], vec![false, true, true]).unwrap();
    let y = run1(
        MovementOp::Compress(Compress { axis: Some(0) }),
        vec![Some(x), Some(cond)],
    );
    assert_eq!(vals(&y), vec![3.0, 4.0, 5.0, 6.0]);
    let y = run1(
        MovementOp::NonZero(NonZero),
        vec![Some(f32t(&[2, 2], &[1.0, 0.0, 0.0, 2.0]))],
    );
    assert_eq!(y.shape(), &[2, 2]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[0, 1, 0, 1]);
    // Spec example 2 (time_axis 1, batch_axis 0), first two rows.
    let x = f32t(&[2, 4], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let y = run1(
        MovementOp::ReverseSequence(ReverseSequence {
            batch_axis: 0,
            time_axis: 1,
        }),
        vec![Some(x), Some(i64t(&[2], &[1, 2]))],
    );
    assert_eq!(vals(&y), vec![0.0, 1.0, 2.0, 3.0, 5.0, 4.0, 6.0, 7.0]);
}

#[test]
fn byte_coded_and_size_bounds() {
    let x = Tensor::from_codes(DType::F8E4M3FN, vec![2], vec![0x38, 0x40]).unwrap();
    let y = run1(MovementOp::Tile(Tile), vec![Some(x), Some(i64t(&[1], &[2]))]);
    assert_eq!(y.codes().unwrap(), &[0x38, 0x40, 0x38, 0x40]);
    let vals: Vec<Option<Value>> = vec![Some(Value::Tensor(i64t(&[2], &[1 << 40, 1 << 40])))];
    let refs: Vec<Option<&Value>> = vals.iter().map(Option::as_ref).collect();
    assert!(
        MovementOp::ConstantOfShape(ConstantOfShape { value: None })
            .eval(&Args::new(&refs))
            .is_err()
    );
}

#[test]
fn tensor_scatter_circular() {
    let past = f32t(&[1, 3, 1], &[0.0, 0.0, 0.0]);
    let upd = f32t(&[1, 2, 1], &[1.0, 2.0]);
    let y = run1(
        MovementOp::TensorScatter(TensorScatter {
            axis: -2,
            circular: true,
        }),
        vec![Some(past), Some(upd), Some(i64t(&[1], &[2]))],
    );
    assert_eq!(vals(&y), vec![2.0, 0.0, 1.0]);
}

#[test]
fn gathernd_empty_tuples_copy_everything() {
    let x = i64t(&[2, 2], &[1, 2, 3, 4]);
    let y = run1(
        MovementOp::GatherND(GatherND { batch_dims: 0 }),
        vec![Some(x), Some(i64t(&[3, 0], &[]))],
    );
    assert_eq!(y.shape(), &[3, 2, 2]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]);
}

#[test]
fn pad_wrap_after_crop_reads_cropped_data() {
    // onnxruntime crops first: [1,2,3,4] with pads (-1, 2) -> [2,3,4] then wraps -> [2,3,4,2,3].
    let x = f32t(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let y = run1(
        MovementOp::Pad(Pad {
            mode: PadMode::Wrap,
            pads: None,
            value: 0.0,
        }),
        vec![Some(x), Some(i64t(&[2], &[-1, 2]))],
    );
    assert_eq!(vals(&y), vec![2.0, 3.0, 4.0, 2.0, 3.0]);
}

mod permute_plan {
    //! The merged-loop permutation against the per-element index map of `transpose_map`.
    use super::super::layout::{permute, permute_f32};
    use super::super::transpose_map;

    /// The f32 path (SIMD block transposes) on the same values, compared exactly.
    fn f32_matches(x: &[u32], shape: &[usize], perm: &[usize], want: &[u32]) -> bool {
        let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let wf: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        permute_f32(&xf, shape, perm) == wf
    }
    use proptest::prelude::*;

    fn case() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
        prop::collection::vec(0usize..=4, 0..=5).prop_flat_map(|shape| {
            let n = shape.len();
            (Just(shape), Just((0..n).collect::<Vec<usize>>()).prop_shuffle())
        })
    }

    proptest! {
        #[test]
        fn permute_matches_the_index_map((shape, perm) in case()) {
            let n: usize = shape.iter().product();
            let x: Vec<u32> = (0..n as u32).collect();
            let (_, idx) = transpose_map(&shape, &perm).unwrap();
            let want: Vec<u32> = idx.iter().map(|&i| x[i]).collect();
            prop_assert_eq!(permute(&x, &shape, &perm), want);
        }

        /// Larger matrices for the banded 2-D transposes (bands of 16 rows, a partial last
        /// band): NCHW <-> NHWC and other perms swapping the last merged dims.
        #[test]
        fn banded_transposes_match_the_index_map(
            (n, c, h, w) in (1usize..=3, 1usize..=40, 1usize..=20, 1usize..=20),
            perm in prop::sample::select(vec![[0, 2, 3, 1], [0, 3, 1, 2], [1, 0, 2, 3], [0, 1, 3, 2], [2, 3, 0, 1]]),
        ) {
            let shape = [n, c, h, w];
            let x: Vec<u32> = (0..(n * c * h * w) as u32).collect();
            let (_, idx) = transpose_map(&shape, &perm).unwrap();
            let want: Vec<u32> = idx.iter().map(|&i| x[i]).collect();
            prop_assert!(f32_matches(&x, &shape, &perm, &want));
            prop_assert_eq!(permute(&x, &shape, &perm), want);
        }
    }

    /// Matrices of at least 128 Ki elements split over 2 and 3 threads (whole tasks of
    /// bands plus a partial last one): the same result as the index map.
    #[test]
    fn large_transposes_split_over_threads_match_the_index_map() {
        for (shape, perm) in [
            ([1, 3, 224, 224], [0, 2, 3, 1]),
            ([1, 224, 224, 3], [0, 3, 1, 2]),
            ([2, 37, 61, 67], [0, 2, 3, 1]),
            ([1, 1000, 7, 19], [0, 2, 3, 1]),
        ] {
            let x: Vec<u32> = (0..shape.iter().product::<usize>() as u32).collect();
            let (_, idx) = transpose_map(&shape, &perm).unwrap();
            let want: Vec<u32> = idx.iter().map(|&i| x[i]).collect();
            for threads in [2, 3] {
                let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap();
                let got = pool.install(|| permute(&x, &shape, &perm));
                assert_eq!(got, want, "{shape:?} {perm:?} on {threads} threads");
                let ok = pool.install(|| f32_matches(&x, &shape, &perm, &want));
                assert!(ok, "f32 {shape:?} {perm:?} on {threads} threads");
            }
        }
    }
}

/// 8-bit slices and splits (a quantized channel shuffle's) copy runs of bytes: the elements
/// the indices name, strided slices and the last axis included.
#[test]
fn eight_bit_slices_and_splits_take_the_named_elements() {
    let shape = [2usize, 6, 5];
    let at = |b: usize, c: usize, w: usize| ((b * 6 + c) * 5 + w) as u32 * 7 % 256;
    let v: Vec<u8> = (0..60u32).map(|i| (i * 7 % 256) as u8).collect();
    let x = Tensor::from_vec(shape.to_vec(), v.clone()).unwrap();
    // Channels 1, 3 of the last three columns.
    let y = run1(
        MovementOp::Slice(Slice { attrs: None }),
        vec![
            Some(x.clone()),
            Some(i64t(&[2], &[1, 2])),
            Some(i64t(&[2], &[5, 5])),
            Some(i64t(&[2], &[1, 2])),
            Some(i64t(&[2], &[2, 1])),
        ],
    );
    let mut want = vec![];
    for b in 0..2 {
        for c in [1, 3] {
            for w in 2..5 {
                want.push(at(b, c, w) as u8);
            }
        }
    }
    assert_eq!(y.shape(), [2, 2, 3]);
    assert_eq!(y.as_slice::<u8>().unwrap(), want.as_slice());
    let xi = Tensor::from_vec(shape.to_vec(), v.iter().map(|&b| b as i8).collect::<Vec<i8>>()).unwrap();
    let ys = run(
        MovementOp::Split(Split {
            axis: 1,
            split: None,
            num_outputs: Some(2),
            outputs: 2,
        }),
        vec![Some(xi)],
    );
    for (part, y) in ys.iter().enumerate() {
        let mut want = vec![];
        for b in 0..2 {
            for c in 3 * part..3 * part + 3 {
                for w in 0..5 {
                    want.push(at(b, c, w) as u8 as i8);
                }
            }
        }
        assert_eq!(y.as_slice::<i8>().unwrap(), want.as_slice());
    }
}

/// Concatenations are written in blocks of rows over the pool, short runs (channels-last
/// concatenations of few-channel values, a `stack` of single values) element by element,
/// long ones copied: every element where the definition puts it, for f32 and u8, runs of 1
/// to 33 elements mixed, long runs (a fire module's 64 + 64 channels, runs of 40 to 630
/// mixed with short ones), output sizes across several blocks, on 1 and 2 threads.
#[test]
fn concatenations_of_short_runs_put_every_element_in_place() {
    // (the shape off the axis, the axis, each input's size along it)
    let cases: [(&[usize], usize, &[usize]); 8] = [
        (&[1, 55, 55, 0], 3, &[64, 64]),
        (&[2, 0, 7, 9], 1, &[40, 3, 70]),
        (&[1, 172, 309, 0], 3, &[1, 1, 1, 1, 1, 1, 1, 1]),
        (&[1, 172, 36, 0], 3, &[1, 1]),
        (&[2, 0, 5, 3], 1, &[1, 3, 2]),
        (&[40, 51, 0], 2, &[33, 1]),
        (&[7, 0], 1, &[32, 16, 5]),
        (&[0, 4], 0, &[3, 2]),
    ];
    for (shape, axis, sizes) in cases {
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let inputs: Vec<Vec<f32>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &a)| (0..outer * a * inner).map(|e| (i * 100_000 + e) as f32).collect())
            .collect();
        let total: usize = sizes.iter().sum();
        let mut want = Vec::with_capacity(outer * total * inner);
        for o in 0..outer {
            for (x, &a) in inputs.iter().zip(sizes) {
                want.extend_from_slice(&x[o * a * inner..(o + 1) * a * inner]);
            }
        }
        let shape_of = |a: usize| {
            let mut s = shape.to_vec();
            s[axis] = a;
            s
        };
        for threads in [1, 2] {
            let pool = kiln_kernels::pool::ThreadPool::new(threads).unwrap();
            let f32s: Vec<Option<Tensor>> = inputs
                .iter()
                .zip(sizes)
                .map(|(x, &a)| Some(Tensor::from_vec(shape_of(a), x.clone()).unwrap()))
                .collect();
            let y = pool.install(|| run1(MovementOp::Concat(Concat { axis: axis as i64 }), f32s));
            assert_eq!(y.shape(), shape_of(total).as_slice());
            assert_eq!(
                y.as_slice::<f32>().unwrap(),
                want.as_slice(),
                "{shape:?} {axis} {sizes:?}"
            );
            let bytes: Vec<Option<Tensor>> = inputs
                .iter()
                .zip(sizes)
                .map(|(x, &a)| {
                    Some(
                        Tensor::from_vec(
                            shape_of(a),
                            x.iter().map(|&v| (v as usize % 251) as u8).collect::<Vec<u8>>(),
                        )
                        .unwrap(),
                    )
                })
                .collect();
            let y = pool.install(|| run1(MovementOp::Concat(Concat { axis: axis as i64 }), bytes));
            let want8: Vec<u8> = want.iter().map(|&v| (v as usize % 251) as u8).collect();
            assert_eq!(
                y.as_slice::<u8>().unwrap(),
                want8.as_slice(),
                "u8 {shape:?} {axis} {sizes:?}"
            );
        }
    }
}
