//! Fuzz target: arbitrary bytes as an ONNX model, then a run on small deterministic inputs of
//! the declared (fixed) input types. Loading and running must return Ok or a typed error,
//! never panic; runs are bounded by the run limits (2 s, 2 GiB, 100,000 Loop iterations). Seed it
//! with the ONNX backend node-test models.
#![no_main]

use kiln::raw::onnx::{ImportOptions, load_model_bytes};
use kiln::{DType, Session, Tensor, Value, ValueType};
use libfuzzer_sys::fuzz_target;

fn input(dtype: DType, shape: Vec<usize>) -> Option<Tensor> {
    let n: usize = shape.iter().product();
    if n > 4096 {
        return None;
    }
    let vals: Vec<f64> = (0..n).map(|i| (i % 7) as f64 - 3.0).collect();
    Some(match dtype {
        DType::F32 => Tensor::from_vec(shape, vals.iter().map(|&v| v as f32 * 0.5).collect::<Vec<_>>()).ok()?,
        DType::F64 => Tensor::from_vec(shape, vals).ok()?,
        DType::I64 => Tensor::from_vec(shape, vals.iter().map(|&v| v as i64).collect::<Vec<_>>()).ok()?,
        DType::I32 => Tensor::from_vec(shape, vals.iter().map(|&v| v as i32).collect::<Vec<_>>()).ok()?,
        DType::Bool => Tensor::from_vec(shape, vals.iter().map(|&v| v > 0.0).collect::<Vec<_>>()).ok()?,
        other => Tensor::zeros(other, shape).ok()?,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(model) = load_model_bytes(bytes::Bytes::copy_from_slice(data), &ImportOptions::default()) else {
        return;
    };
    // Legitimately heavy models (a found AlexNet-like graph of 44 GMACs) end at the limits,
    // as a service would set them, instead of timing the fuzzer out.
    let options = kiln::SessionOptions {
        limits: kiln::RunLimits {
            time: Some(std::time::Duration::from_secs(2)),
            memory_bytes: Some(2 << 30),
            loop_iterations: Some(100_000),
        },
        compile_time_limit: Some(std::time::Duration::from_secs(5)),
        ..kiln::SessionOptions::default()
    };
    let Ok(session) = Session::from_model(&model, &options) else {
        return;
    };
    let mut feed = Vec::new();
    for i in session.inputs() {
        let ValueType::Tensor(t) = &i.ty else { return };
        let (Some(dtype), Some(shape)) = (t.dtype, t.fixed_shape()) else {
            return;
        };
        let Some(x) = input(dtype, shape) else { return };
        feed.push((i.name.clone(), Value::Tensor(x)));
    }
    let _ = session.run(feed);
});
