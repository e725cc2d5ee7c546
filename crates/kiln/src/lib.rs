//! kiln: compile and run ONNX models.
//!
//! ```no_run
//! use kiln::{Session, SessionOptions, Tensor, Value};
//! let session = Session::new("model.onnx", &SessionOptions::default())?;
//! let x = Tensor::from_vec(vec![1, 3], vec![1.0f32, 2.0, 3.0])?;
//! let outputs = session.run(vec![("x".to_string(), Value::Tensor(x))])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod artifact;
mod bench;
mod crc;
mod custom_io;
mod limits;
mod monitor;
pub mod npy;
mod profile;
mod profile_file;
mod quantize;
mod session;
mod shapes;
mod specialize;
mod trace;

pub use artifact::ArtifactOptions;
pub use bench::{BenchLimit, BenchOptions, BenchProgress, BenchReport, RoundTrip};
pub use crc::{CrcMismatch, IoCrc, SAMPLE as CRC_SAMPLE, tensor_crc};
pub use kiln_compiler::CompileOptions;
pub use kiln_ir::Graph;
pub use kiln_onnx::{ImportError, Model, UnsupportedOp};
pub use kiln_ops::{Dim, Sequence, TensorType, Value, ValueType};
pub use kiln_runtime::RuntimeError;
pub use kiln_runtime::StopReason;
pub use kiln_runtime::{AllocCounts, CachingAlloc, CountingAlloc, ThreadPool};
pub use kiln_runtime::{Profile, RunRecord, StepRecord, StepSummary, ValueShape};
pub use kiln_tensor::{DType, Data, Mismatch, SharedBytes, Tensor, TensorError, bf16, compare, f16};
pub use limits::{DEFAULT_LOOP_ITERATIONS, RunLimits, RunOptions, auto_memory_limit};
pub use monitor::{LatencyStats, MAX_PROFILE_RECORDS, Metrics, percentile};
pub use profile::{ProfileReport, precision as step_precision};
pub use quantize::{ProgressFn, QuantizeMode, QuantizeOptions, QuantizeProgress, QuantizeReport, Sample, TensorSqnr};
pub use session::{
    CompileSummary, Error, IoInfo, ProgramMeta, Session, SessionOptions, compile_file, is_program_file, load_onnx,
};
pub use shapes::{MemoryPlacement, ShapeInfo};
pub use specialize::{Bindings, DEFAULT_SHAPE_CACHE, ShapeCacheInfo, format_bindings};

/// Lower-level crates, for tools (CLI, conformance, benchmarks) that need them.
pub mod raw {
    pub use kiln_compiler as compiler;
    pub use kiln_ir as ir;
    pub use kiln_onnx as onnx;
    pub use kiln_ops as ops;
    pub use kiln_runtime as runtime;
}
