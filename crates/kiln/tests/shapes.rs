//! Symbolic input dims: each set of input shapes runs a program compiled for those sizes
//! (compiled on its first run, or ahead of time and stored in the program file); unnamed dims
//! are unknowns of their own.

mod common;

use common::{Dim, F32, I64, import, int, ints, model, node, value_info};
use kiln::raw::onnx::proto::TensorProto;
use kiln::{Session, SessionOptions, Tensor, Value, compile_file};
use prost::Message;

fn weight(name: &str, dims: &[i64], scale: f32) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: Some(name.into()),
        data_type: Some(F32),
        dims: dims.to_vec(),
        float_data: (0..n).map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * scale).collect(),
        ..Default::default()
    }
}

/// x [batch, 4, h, ?] -> 3x3 conv -> Relu -> 1x1 conv -> GlobalAveragePool -> Flatten: y
/// [batch, 8]; and Shape(x): dims, which a specialisation folds to that run's sizes.
fn cnn() -> kiln::raw::onnx::proto::ModelProto {
    let nodes = vec![
        node(
            "Conv",
            "c1",
            &["x", "w1", "b1"],
            &["c1"],
            vec![ints("pads", &[1, 1, 1, 1])],
        ),
        node("Relu", "r1", &["c1"], &["r1"], vec![]),
        node("Conv", "c2", &["r1", "w2"], &["c2"], vec![]),
        node("GlobalAveragePool", "gap", &["c2"], &["gap"], vec![]),
        node("Flatten", "flat", &["gap"], &["y"], vec![int("axis", 1)]),
        node("Shape", "shape", &["x"], &["dims"], vec![]),
    ];
    let inits = vec![
        weight("w1", &[8, 4, 3, 3], 0.4),
        weight("b1", &[8], 0.1),
        weight("w2", &[8, 8, 1, 1], 0.3),
    ];
    let x = value_info("x", F32, &[Dim::S("batch"), Dim::N(4), Dim::S("h"), Dim::S("?")]);
    let y = value_info("y", F32, &[Dim::S("batch"), Dim::N(8)]);
    let dims = value_info("dims", I64, &[Dim::N(4)]);
    model(nodes, vec![x], vec![y, dims], inits)
}

fn input(shape: [usize; 4]) -> Vec<(String, Value)> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) >> 8) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    vec![("x".into(), Value::Tensor(Tensor::from_vec(shape.to_vec(), v).unwrap()))]
}

fn outputs(s: &Session, shape: [usize; 4]) -> (Vec<usize>, Vec<f32>, Vec<i64>) {
    let out = s.run(input(shape)).unwrap();
    let y = out[0].1.as_tensor().unwrap();
    let dims = out[1].1.as_tensor().unwrap().as_slice::<i64>().unwrap().to_vec();
    (y.shape().to_vec(), y.as_slice::<f32>().unwrap().to_vec(), dims)
}

/// The reference: the graph as imported (level 0), shape-generic.
fn reference() -> Session {
    let mut o = SessionOptions::default();
    o.compile.opt_level = 0;
    o.shape_cache_size = 0;
    Session::from_model(&import(&cnn()).unwrap(), &o).unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * scale, "{x} vs {y}");
    }
}

fn sym(bindings: &[(String, usize)], name: &str) -> Option<usize> {
    bindings.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
}

#[test]
fn each_input_shape_compiles_once_and_matches_the_reference() {
    let reference = reference();
    let s = Session::from_model(&import(&cnn()).unwrap(), &SessionOptions::default()).unwrap();
    // The unnamed dim is an unknown of its own: 12 high and 20 wide is fine.
    for shape in [[1, 4, 12, 20], [2, 4, 9, 7], [1, 4, 12, 20], [2, 4, 9, 7]] {
        let (ys, y, dims) = outputs(&s, shape);
        let (rs, r, rdims) = outputs(&reference, shape);
        assert_eq!((ys.clone(), dims.clone()), (rs, rdims));
        assert_eq!(ys, vec![shape[0], 8]);
        assert_eq!(dims, shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
        close(&y, &r);
    }
    let c = s.shape_cache().unwrap();
    assert_eq!((c.compiled, c.cached.len(), c.stored.len()), (2, 2, 0));
    assert!(c.failed.is_empty());
    let first = &c.cached[0];
    assert_eq!(sym(first, "batch"), Some(1));
    assert_eq!(sym(first, "h"), Some(12));
    // The unnamed dim has the name its place gives it.
    assert_eq!(sym(first, "unk__0_3"), Some(20));
    // The shape-generic program has no cache at all.
    assert_eq!(reference.shape_cache().map(|c| c.compiled), Some(0));
}

#[test]
fn the_cache_keeps_the_most_recently_used_shapes() {
    let mut o = SessionOptions::default();
    o.shape_cache_size = 1;
    let s = Session::from_model(&import(&cnn()).unwrap(), &o).unwrap();
    for shape in [[1, 4, 8, 8], [1, 4, 6, 6], [1, 4, 6, 6], [1, 4, 8, 8]] {
        s.run(input(shape)).unwrap();
    }
    let c = s.shape_cache().unwrap();
    // 8x8 was dropped for 6x6 and compiled again.
    assert_eq!((c.compiled, c.cached.len()), (3, 1));
    assert_eq!(sym(&c.cached[0], "h"), Some(8));
    // After 4 compiles per slot, new shapes run on the generic program (still correct).
    s.run(input([1, 4, 5, 5])).unwrap();
    let (_, y, dims) = outputs(&s, [1, 4, 7, 9]);
    let c = s.shape_cache().unwrap();
    assert_eq!((c.compiled, c.can_compile), (4, false));
    close(&y, &outputs(&reference(), [1, 4, 7, 9]).1);
    assert_eq!(dims, vec![1, 4, 7, 9]);
    // Inputs that do not fit the signature run the generic program and get its error.
    let bad = vec![(
        "x".to_string(),
        Value::Tensor(Tensor::zeros(kiln::DType::F32, vec![1, 3, 8, 8]).unwrap()),
    )];
    let e = s.run(bad).unwrap_err().to_string();
    assert!(e.contains("input 'x'") && e.contains("expected 4, got 3"), "{e}");
}

#[test]
fn program_files_store_shape_sets_and_compile_others_from_the_embedded_model() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = dir.path().join("cnn.onnx");
    std::fs::write(&onnx, cnn().encode_to_vec()).unwrap();
    let file = dir.path().join("cnn.kiln");
    let mut o = SessionOptions::default();
    o.shape_specializations = vec![vec![("batch".into(), 1), ("h".into(), 12), ("unk__0_3".into(), 20)]];
    let summary = compile_file(&onnx, &file, &o).unwrap();
    assert_eq!(summary.meta.shape_sets.len(), 1);
    assert!(summary.meta.specialize.is_some());

    let reference = reference();
    let s = Session::new(&file, &SessionOptions::default()).unwrap();
    let (_, y, dims) = outputs(&s, [1, 4, 12, 20]);
    close(&y, &outputs(&reference, [1, 4, 12, 20]).1);
    assert_eq!(dims, vec![1, 4, 12, 20]);
    let c = s.shape_cache().unwrap();
    assert_eq!((c.compiled, c.stored.len()), (0, 1), "the stored program ran");
    let (_, y, dims) = outputs(&s, [3, 4, 5, 11]);
    close(&y, &outputs(&reference, [3, 4, 5, 11]).1);
    assert_eq!(dims, vec![3, 4, 5, 11]);
    let c = s.shape_cache().unwrap();
    assert_eq!((c.compiled, c.cached.len()), (1, 1), "compiled from the embedded model");

    // A session that may not compile new shapes runs them on the generic program.
    let mut none = SessionOptions::default();
    none.shape_cache_size = 0;
    let s = Session::new(&file, &none).unwrap();
    let (_, y, _) = outputs(&s, [3, 4, 5, 11]);
    close(&y, &outputs(&reference, [3, 4, 5, 11]).1);
    assert_eq!(s.shape_cache().map(|c| (c.compiled, c.can_compile)), Some((0, false)));
}

#[test]
fn a_shape_set_must_bind_exactly_the_input_symbols() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = dir.path().join("cnn.onnx");
    std::fs::write(&onnx, cnn().encode_to_vec()).unwrap();
    let file = dir.path().join("cnn.kiln");
    let mut o = SessionOptions::default();
    o.shape_specializations = vec![vec![("batch".into(), 1), ("seq".into(), 12)]];
    let e = compile_file(&onnx, &file, &o).unwrap_err().to_string();
    assert!(
        e.contains("batch=1,seq=12") && e.contains("'seq' is not a symbol") && e.contains("h, unk__0_3"),
        "{e}"
    );
    o.shape_specializations = vec![vec![("batch".into(), 1), ("h".into(), 12)]];
    let e = compile_file(&onnx, &file, &o).unwrap_err().to_string();
    assert!(e.contains("does not bind the input symbol 'unk__0_3'"), "{e}");
}
