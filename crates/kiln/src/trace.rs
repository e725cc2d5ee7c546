//! The Chrome trace of profiled runs, in ONNX Runtime's profiler layout (opens in Perfetto and
//! `chrome://tracing`).

use crate::profile::ProfileReport;
use kiln_runtime::ValueShape;
use kiln_tensor::DType;
use std::time::Duration;

impl ProfileReport {
    /// The profile as a Chrome trace in ONNX Runtime's profiler layout: a JSON array of
    /// complete (`"ph": "X"`) events with microsecond `ts`/`dur`: one `Session` event
    /// `session_initialization` for loading, one `model_run` per run and one `Node` event
    /// `<node>_kernel_time` per step run, whose `args` carry `op_name`, `provider` (`kiln`),
    /// `node_index`, byte sizes and `input_type_shape`/`output_type_shape`. Opens in
    /// Perfetto and `chrome://tracing`. Runs are placed after loading on the time line.
    pub fn chrome_trace(&self) -> serde_json::Value {
        use serde_json::json;
        let pid = std::process::id();
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let base = us(self.load);
        let mut events = vec![json!({
            "cat": "Session", "pid": pid, "tid": pid, "dur": base, "ts": 0, "ph": "X",
            "name": "session_initialization", "args": {}
        })];
        let first = self.profile.runs.first().map_or(Duration::ZERO, |r| r.start);
        let at = |d: Duration| base.saturating_add(us(d.saturating_sub(first)));
        for run in &self.profile.runs {
            events.push(json!({
                "cat": "Session", "pid": pid, "tid": pid, "dur": us(run.duration), "ts": at(run.start),
                "ph": "X", "name": "model_run", "args": {}
            }));
            for s in &run.steps {
                let output_bytes: u64 = s.outputs.iter().map(ValueShape::bytes).sum();
                events.push(json!({
                    "cat": "Node", "pid": pid, "tid": pid, "dur": us(s.duration), "ts": at(s.start),
                    "ph": "X", "name": format!("{}_kernel_time", s.name),
                    "args": {
                        "op_name": s.op,
                        "provider": "kiln",
                        "node_index": s.index.to_string(),
                        "activation_size": s.activation_bytes.to_string(),
                        "parameter_size": s.param_bytes.to_string(),
                        "output_size": output_bytes.to_string(),
                        "input_type_shape": type_shapes(&s.inputs),
                        "output_type_shape": type_shapes(&s.outputs),
                    }
                }));
            }
        }
        serde_json::Value::Array(events)
    }
}

/// `[{"float": [1, 3, 224, 224]}, ...]` for the tensors among `shapes` (ONNX Runtime skips
/// absent and non-tensor values too).
fn type_shapes(shapes: &[ValueShape]) -> serde_json::Value {
    shapes
        .iter()
        .filter_map(|s| match s {
            ValueShape::Tensor { dtype, shape } => {
                let mut m = serde_json::Map::new();
                m.insert(onnx_type_name(*dtype).to_string(), serde_json::json!(shape));
                Some(serde_json::Value::Object(m))
            }
            _ => None,
        })
        .collect()
}

/// ONNX's element type names (lower case), as ONNX Runtime's traces spell them.
fn onnx_type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::String => "string",
        DType::F8E4M3FN => "float8e4m3fn",
        DType::F8E4M3FNUZ => "float8e4m3fnuz",
        DType::F8E5M2 => "float8e5m2",
        DType::F8E5M2FNUZ => "float8e5m2fnuz",
        DType::U4 => "uint4",
        DType::I4 => "int4",
        DType::F4E2M1 => "float4e2m1",
        DType::F8E8M0 => "float8e8m0",
        DType::U2 => "uint2",
        DType::I2 => "int2",
    }
}
