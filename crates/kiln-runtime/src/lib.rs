//! kiln-runtime: runs a [`Program`], the lowered, self-contained form of a model.
//!
//! A Program is a flat list of steps over numbered value slots, with its constants, I/O
//! signature and control-flow sub-programs. The runtime checks inputs against the signature,
//! executes steps in order, frees each slot after its last use, and returns the outputs. It
//! does no graph rewriting and knows no ONNX names.

mod error;
mod exec;
pub mod file;
mod profile;
mod program;
mod stack;

pub use error::RuntimeError;
pub use exec::{Limits, run, run_limited, run_with};
/// The allocator that keeps freed activation buffers for the next run (see its docs).
pub use kiln_kernels::alloc::{AllocCounts, CachingAlloc, CountingAlloc};
/// Denormals flushed to zero on the calling thread while the guard lives (a Session's runs).
pub use kiln_kernels::fp::FlushDenormals;

/// The kernels this process runs and why, e.g. `avx512+amx (detected)` (see
/// `kiln_kernels::isa`).
pub fn kernels() -> String {
    kiln_kernels::isa::dispatch().describe()
}
/// The compute thread pool a Session runs its programs on (kernels split over the pool
/// installed on the running thread).
pub use kiln_kernels::pool::ThreadPool;
pub use kiln_kernels::recycle::Arena;
/// A run's stop condition (time limit, cancellation), installed on the running thread.
pub use kiln_kernels::stop::{Stop, StopReason, install as install_stop};
pub use profile::{Profile, RunRecord, StepRecord, StepSummary, ValueShape};
pub use program::{ArenaPlan, IoSpec, LoopStep, Program, ScanStep, Step, StepKind};
