//! Concurrency by stress: 4 threads x 200 runs on one Session give outputs bit-identical to
//! the same calls made one after another, on one and two compute threads, with a static
//! model (the shipped example CNN) and one with symbolic dims whose threads use different
//! shapes (specialisations compiled and shared while other runs go on).

mod common;

use common::{Dim, F32, import, ints, model, node, value_info};
use kiln::{Session, SessionOptions, Tensor, Value};
use std::path::Path;

const THREADS: usize = 4;
const RUNS: usize = 200;

fn example() -> kiln::Model {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tiny_cnn.onnx");
    kiln::load_onnx(path, &SessionOptions::default()).unwrap()
}

/// x [batch, 3, h, w] -> 3x3 Conv(8) -> Relu -> GlobalAveragePool: y [batch, 8, 1, 1].
fn symbolic() -> kiln::Model {
    let n = 8 * 3 * 3 * 3;
    let w = kiln::raw::onnx::proto::TensorProto {
        name: Some("w".into()),
        data_type: Some(F32),
        dims: vec![8, 3, 3, 3],
        float_data: (0..n).map(|i| ((i * 29 % 61) as f32 / 61.0 - 0.5) * 0.4).collect(),
        ..Default::default()
    };
    let m = model(
        vec![
            node("Conv", "conv", &["x", "w"], &["c"], vec![ints("pads", &[1, 1, 1, 1])]),
            node("Relu", "relu", &["c"], &["r"], vec![]),
            node("GlobalAveragePool", "gap", &["r"], &["y"], vec![]),
        ],
        vec![value_info(
            "x",
            F32,
            &[Dim::S("batch"), Dim::N(3), Dim::S("h"), Dim::S("w")],
        )],
        vec![value_info(
            "y",
            F32,
            &[Dim::S("batch"), Dim::N(8), Dim::N(1), Dim::N(1)],
        )],
        vec![w],
    );
    import(&m).unwrap()
}

/// Run `k`'s input: a shape from `shapes` and values from `k`.
fn input(name: &str, shapes: &[[usize; 4]], k: usize) -> Vec<(String, Value)> {
    let shape = shapes[k % shapes.len()];
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((((i + 7919 * k) as u32).wrapping_mul(2654435761) >> 9) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    vec![(name.into(), Value::Tensor(Tensor::from_vec(shape.to_vec(), v).unwrap()))]
}

fn bits(out: &[(String, Value)]) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    out.iter()
        .map(|(n, v)| {
            let t = v.as_tensor().unwrap();
            (
                n.clone(),
                t.shape().to_vec(),
                t.as_slice::<f32>().unwrap().iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect()
}

fn stress(m: &kiln::Model, name: &str, shapes: &[[usize; 4]], threads: usize) {
    let options = SessionOptions {
        threads,
        ..SessionOptions::default()
    };
    let s = Session::from_model(m, &options).unwrap();
    // The same calls one after another: call `t * RUNS + r`.
    let expected: Vec<_> = (0..THREADS * RUNS)
        .map(|k| bits(&s.run(input(name, shapes, k)).unwrap()))
        .collect();
    let got: Vec<Vec<_>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let s = &s;
                scope.spawn(move || {
                    (0..RUNS)
                        .map(|r| bits(&s.run(input(name, shapes, t * RUNS + r)).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (t, runs) in got.iter().enumerate() {
        for (r, out) in runs.iter().enumerate() {
            assert!(
                *out == expected[t * RUNS + r],
                "{threads} compute thread(s): thread {t}, run {r} differs from the same call made alone"
            );
        }
    }
}

#[test]
fn four_threads_sharing_a_session_get_the_results_of_sequential_calls() {
    let cnn = example();
    let x = cnn
        .graph
        .inputs
        .first()
        .map(|v| cnn.graph.values[v.index()].name.clone())
        .unwrap();
    let shape: Vec<usize> = match &cnn.graph.values[cnn.graph.inputs[0].index()].ty {
        kiln::ValueType::Tensor(t) => t.fixed_shape().unwrap(),
        other => panic!("{other:?}"),
    };
    let shape: [usize; 4] = shape.try_into().unwrap();
    for threads in [1, 2] {
        stress(&cnn, &x, &[shape], threads);
    }
    let sym = symbolic();
    let shapes = [[1, 3, 16, 16], [2, 3, 8, 12], [1, 3, 20, 9]];
    for threads in [1, 2] {
        stress(&sym, "x", &shapes, threads);
    }
}
