//! Runs flush denormal floats to zero (MXCSR FTZ/DAZ on x86-64, as OpenVINO does), and the
//! calling thread gets its own setting back afterwards.

mod common;

use common::{Dim, F32, import, model, node, value_info};
use kiln::{Session, SessionOptions, Tensor, Value};

#[test]
fn a_run_flushes_denormals_and_restores_the_callers_setting() {
    // y = x * s, both inputs (nothing folds).
    let m = model(
        vec![node("Mul", "mul", &["x", "s"], &["y"], vec![])],
        vec![value_info("x", F32, &[Dim::N(4)]), value_info("s", F32, &[Dim::N(4)])],
        vec![value_info("y", F32, &[Dim::N(4)])],
        vec![],
    );
    let model = import(&m).unwrap();
    let tiny = f32::MIN_POSITIVE;
    let denormal = std::hint::black_box(tiny) * std::hint::black_box(0.5f32);
    assert!(
        denormal > 0.0 && !denormal.is_normal(),
        "this thread does not flush to begin with"
    );
    for threads in [1, 2] {
        let s = Session::from_model(
            &model,
            &SessionOptions {
                threads,
                ..SessionOptions::default()
            },
        )
        .unwrap();
        let x = Tensor::from_vec(vec![4], vec![tiny, 1.0, denormal, -tiny]).unwrap();
        let k = Tensor::from_vec(vec![4], vec![0.5f32, 0.5, 4.0, 0.25]).unwrap();
        let out = s
            .run(vec![("x".into(), Value::Tensor(x)), ("s".into(), Value::Tensor(k))])
            .unwrap();
        let y = out[0].1.as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec();
        if cfg!(target_arch = "x86_64") {
            // A denormal result, and a denormal operand, are zeros.
            assert_eq!(y, [0.0, 0.5, 0.0, -0.0], "{threads} threads");
        } else {
            assert_eq!(y[1], 0.5);
        }
        // The caller's thread computes denormals again.
        assert_eq!(std::hint::black_box(tiny) * std::hint::black_box(0.5f32), denormal);
    }
}
