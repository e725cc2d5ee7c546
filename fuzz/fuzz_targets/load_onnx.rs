//! Fuzz target: arbitrary bytes as an ONNX model. Import must return Ok or a typed error (and
//! an imported model must verify and lower), never panic or allocate without bound.
#![no_main]

use kiln::Session;
use kiln::raw::onnx::{ImportOptions, load_model_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(model) = load_model_bytes(bytes::Bytes::copy_from_slice(data), &ImportOptions::default()) else {
        return;
    };
    let _ = Session::from_model(&model, &kiln::SessionOptions::default());
    let _ = model.graph.to_text();
});
