//! Fuzz target: arbitrary bytes as the program section of an otherwise valid `.kiln` file
//! (checksums recomputed, so decoding is reached), then a run on small deterministic inputs of
//! the declared fixed input types. Decoding and running must return Ok or a typed error, never
//! panic, overflow the stack or allocate without bound. Seed it with the program sections of
//! compiled node-test models (see fuzz/README.md).
#![no_main]

use kiln::raw::runtime::file::{assemble_sections, from_shared};
use kiln::{DType, Tensor, Value, ValueType};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

/// The meta section, with the current format version (a stale one made every input stop at the
/// version check, before the program was decoded).
fn meta() -> String {
    format!(
        r#"{{"format_version":{},"compiler":"fuzz","content_hash":"","source":"","inputs":[],"outputs":[],"options":null,"weights":{{"count":0,"bytes":4096,"packing":"row-major/v1","alignment":64}},"memory":null}}"#,
        kiln::raw::runtime::file::FORMAT_VERSION
    )
}

fn input(dtype: DType, shape: Vec<usize>) -> Option<Tensor> {
    // The harness's own bound (a declared shape may overflow a plain product).
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if n > 4096 {
        return None;
    }
    let vals: Vec<f64> = (0..n).map(|i| (i % 7) as f64 - 3.0).collect();
    Some(match dtype {
        DType::F32 => Tensor::from_vec(shape, vals.iter().map(|&v| v as f32 * 0.5).collect::<Vec<_>>()).ok()?,
        DType::I64 => Tensor::from_vec(shape, vals.iter().map(|&v| v as i64).collect::<Vec<_>>()).ok()?,
        other => Tensor::zeros(other, shape).ok()?,
    })
}

/// Bytes at a 64-byte aligned address (as a memory map would be).
struct Aligned(Vec<u128>, usize, usize);
impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        let all: &[u8] = bytemuck::cast_slice(&self.0);
        &all[self.1..self.1 + self.2]
    }
}

fuzz_target!(|data: &[u8]| {
    let file = assemble_sections(meta().as_bytes(), data, &[0u8; 4096]);
    let mut words = vec![0u128; file.len() / 16 + 8];
    let shift = (64 - words.as_ptr() as usize % 64) % 64;
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
    bytes[shift..shift + file.len()].copy_from_slice(&file);
    let Ok(f) = from_shared(Arc::new(Aligned(words, shift, file.len()))) else {
        return;
    };
    let mut feed = Vec::new();
    for i in &f.program.inputs {
        let ValueType::Tensor(t) = &i.ty else { return };
        let (Some(dtype), Some(shape)) = (t.dtype, t.fixed_shape()) else {
            return;
        };
        let Some(x) = input(dtype, shape) else { return };
        feed.push((i.name.clone(), Value::Tensor(x)));
    }
    // Legitimately heavy programs (a found convolution whose im2col ran past the fuzzer's
    // timeout) end at the limits a service would set, as in `run_model`.
    let stop = kiln::raw::runtime::Stop::new(None, Some(std::time::Duration::from_secs(2)));
    let limits = kiln::raw::runtime::Limits {
        memory_bytes: Some(2 << 30),
        loop_iterations: Some(100_000),
    };
    let _ = kiln::raw::runtime::install_stop(&stop, || {
        kiln::raw::runtime::run_limited(&f.program, feed, None, &limits)
    });
});
