//! Session: a loaded, compiled model ready to run; immutable and shareable across threads.

use crate::monitor::{Metrics, Monitor};
use crate::profile::ProfileReport;
use kiln_compiler::CompileOptions;
use kiln_onnx::{ImportOptions, Model};
use kiln_ops::{Value, ValueType};
use kiln_runtime::Program;
use std::path::Path;

/// Everything that can go wrong creating or running a session.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Import(#[from] kiln_onnx::ImportError),
    #[error(transparent)]
    Compile(#[from] kiln_compiler::CompileError),
    #[error(transparent)]
    Run(#[from] kiln_runtime::RuntimeError),
    #[error("{path}: {reason}")]
    Unsupported { path: String, reason: String },
    /// The cause is part of the message (not a `source()`), so chain-printing callers show it once.
    #[error("{path}: {cause}")]
    Program {
        path: String,
        cause: kiln_runtime::file::FileError,
    },
    #[error(transparent)]
    Write(#[from] kiln_runtime::file::FileError),
    #[error("could not start {threads} compute threads: {cause}")]
    Threads { threads: usize, cause: std::io::Error },
}

pub use kiln_runtime::file::Meta as ProgramMeta;

/// Options for creating a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Bindings of symbolic input dims (`--define-symbol NAME=VALUE`, qaic's
    /// `onnx_define_symbol`).
    pub symbols: Vec<(String, usize)>,
    /// How an `.onnx` model is compiled (ignored for a `.kiln` program, which is compiled).
    pub compile: CompileOptions,
    /// Record the latency of every `run` for `get_metrics`/`print_metrics` (qaic's
    /// `enable_metrics`).
    pub enable_metrics: bool,
    /// Also time every step of every `run` for `get_profile` (qaic's `enable_profiling`);
    /// implies `enable_metrics`, and the recorded latencies include the profiling overhead.
    pub enable_profiling: bool,
    /// The resolved configuration these options came from (stored in compiled programs).
    pub config: kiln_config::Config,
    /// Compute threads of each run (qaic's `num_of_cores` / `aic_num_cores`): the calling
    /// thread plus `threads - 1` pool workers. 0 and 1 both mean single-threaded.
    pub threads: usize,
}

impl SessionOptions {
    /// The options a resolved configuration asks for (qaic / QAIRT / HTP / Axelera names): symbol
    /// bindings, optimisation level, intermediate outputs, metrics and profiling.
    pub fn from_config(config: &kiln_config::Config) -> SessionOptions {
        let c = &config.compile;
        SessionOptions {
            symbols: c
                .onnx_define_symbol
                .iter()
                .map(|(k, v)| (k.clone(), usize::try_from(*v).unwrap_or(usize::MAX)))
                .collect(),
            compile: CompileOptions {
                opt_level: c.optimization_type,
                output_tensors: c.output_tensors.clone(),
                all_outputs: c.enable_intermediate_outputs,
            },
            enable_metrics: config.runtime.enable_metrics,
            enable_profiling: config.runtime.enable_profiling,
            config: config.clone(),
            threads: usize::try_from(config.runtime.num_of_cores).unwrap_or(1),
        }
    }
}

/// Name and static type of one model input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct IoInfo {
    pub name: String,
    pub ty: ValueType,
}

/// A compiled model. `Session` is `Send + Sync`; `run` takes `&self`.
#[derive(Debug)]
pub struct Session {
    pub(crate) program: Program,
    /// Load time, metrics and profiles (`monitor.rs`).
    pub(crate) monitor: Monitor,
    /// The program file's meta section, when opened from a `.kiln`.
    meta: Option<ProgramMeta>,
    /// The compute threads (`None`: single-threaded).
    pub(crate) pool: Option<kiln_runtime::ThreadPool>,
    /// Run states: the planned block and recycled buffers of each concurrent run (one arena
    /// per run at once).
    pub(crate) arenas: std::sync::Mutex<Vec<kiln_runtime::Arena>>,
}

/// Imports an ONNX model (with symbol bindings applied) without compiling it.
pub fn load_onnx(path: impl AsRef<Path>, options: &SessionOptions) -> Result<Model, Error> {
    Ok(kiln_onnx::load_model(
        path.as_ref(),
        &ImportOptions {
            symbols: options.symbols.clone(),
        },
    )?)
}

/// What `compile_file` did.
#[derive(Debug, Clone)]
pub struct CompileSummary {
    /// The meta section written (versions, hash, I/O, options, weights).
    pub meta: ProgramMeta,
    /// The optimisation pipeline's report.
    pub report: kiln_compiler::PipelineReport,
    /// The memory plan.
    pub memory: kiln_compiler::plan::MemoryPlan,
    /// Size of the written file in bytes.
    pub file_bytes: u64,
}

/// Compiles an `.onnx` model into a `.kiln` program file.
pub fn compile_file(model: &Path, out: &Path, options: &SessionOptions) -> Result<CompileSummary, Error> {
    let imported = load_onnx(model, options)?;
    let compiled = kiln_compiler::compile(imported.graph, &options.compile)?;
    let resolved = serde_json::json!({
        "effective": {
            "compile": &options.compile,
            "onnx_define_symbol": options.symbols.iter().cloned().collect::<std::collections::BTreeMap<String, usize>>(),
        },
        "config": serde_json::to_value(&options.config).unwrap_or(serde_json::Value::Null),
    });
    let input = kiln_runtime::file::MetaInput {
        source: model
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        options: resolved,
        memory: Some(serde_json::json!({
            "arena_bytes": compiled.memory.arena_bytes,
            "naive_bytes": compiled.memory.naive_bytes,
            "planned_tensors": compiled.memory.planned,
            "in_place": compiled.memory.in_place,
            "dynamic_tensors": compiled.memory.dynamic,
            "summary": compiled.memory.summary(),
        })),
        packing: (compiled.prepacked + compiled.winograd > 0).then(|| {
            format!(
                "{}; {} MatMul/Gemm/channels-last Conv weights packed {} for the GEMM kernels; {} 3x3 Conv weights \
                 Winograd F(4x4,3x3)-transformed and packed {}",
                kiln_runtime::file::WEIGHT_PACKING,
                compiled.prepacked,
                kiln_compiler::prepack::LAYOUT.tag(),
                compiled.winograd,
                kiln_compiler::prepack::LAYOUT.tag()
            )
        }),
    };
    let meta = kiln_runtime::file::write(out, &compiled.program, input)?;
    let file_bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(CompileSummary {
        meta,
        report: compiled.report,
        memory: compiled.memory,
        file_bytes,
    })
}

/// Whether `path` starts with the program-file magic (else it is taken for ONNX).
pub fn is_program_file(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == kiln_runtime::file::MAGIC)
}

impl Session {
    /// Opens a `.kiln` program file (memory-mapped, weights used in place) or an `.onnx` model
    /// (imported and compiled in memory with `options.compile`). The kind is told by the file's
    /// first bytes, not its name.
    pub fn new(path: impl AsRef<Path>, options: &SessionOptions) -> Result<Session, Error> {
        let started = std::time::Instant::now();
        let path = path.as_ref();
        if is_program_file(path) {
            let file = kiln_runtime::file::read(path).map_err(|cause| Error::Program {
                path: path.display().to_string(),
                cause,
            })?;
            return Session::with_program(file.program, Some(file.meta)).observed(options, started);
        }
        let model = load_onnx(path, options)?;
        Session::compiled(&model, options, started)
    }

    /// The meta section of the program file this session was opened from, if any.
    pub fn program_meta(&self) -> Option<&ProgramMeta> {
        self.meta.as_ref()
    }

    /// Compiles an already imported model.
    pub fn from_model(model: &Model, options: &SessionOptions) -> Result<Session, Error> {
        Session::compiled(model, options, std::time::Instant::now())
    }

    /// Compiles `model`, counting the load time from `started`.
    fn compiled(model: &Model, options: &SessionOptions, started: std::time::Instant) -> Result<Session, Error> {
        let compiled = kiln_compiler::compile(model.graph.clone(), &options.compile)?;
        Session::with_program(compiled.program, None).observed(options, started)
    }

    /// The one constructor every way of opening a session ends in.
    fn with_program(program: Program, meta: Option<ProgramMeta>) -> Session {
        Session {
            program,
            meta,
            monitor: Monitor::default(),
            pool: None,
            arenas: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Finishes a constructor: starts the compute threads the options ask for and sets up
    /// metrics/profiling, recording the load time (from `started`).
    fn observed(mut self, options: &SessionOptions, started: std::time::Instant) -> Result<Session, Error> {
        if options.threads > 1 {
            let pool = kiln_runtime::ThreadPool::new(options.threads).map_err(|cause| Error::Threads {
                threads: options.threads,
                cause,
            })?;
            self.pool = Some(pool);
        }
        self.monitor = Monitor::new(options.enable_metrics, options.enable_profiling, started.elapsed());
        Ok(self)
    }

    /// How long opening the session took (import and compile, or mapping a program file).
    pub fn load_time(&self) -> std::time::Duration {
        self.monitor.load()
    }

    /// Latency statistics of every successful `run` so far; `None` unless
    /// `enable_metrics` (or `enable_profiling`) was set, or before the first run.
    pub fn get_metrics(&self) -> Option<Metrics> {
        self.monitor.metrics()
    }

    /// Prints [`Session::get_metrics`] to stdout in qaic's wording (or why there are none).
    pub fn print_metrics(&self) {
        print!("{}", self.monitor.metrics_text());
    }

    /// Forgets the recorded latencies and step timings.
    pub fn reset_metrics(&self) {
        self.monitor.reset();
    }

    /// Per-step timings of the runs so far; `None` unless `enable_profiling` was set.
    pub fn get_profile(&self) -> Option<ProfileReport> {
        self.monitor.profile()
    }

    pub fn inputs(&self) -> Vec<IoInfo> {
        self.program
            .inputs
            .iter()
            .map(|s| IoInfo {
                name: s.name.clone(),
                ty: s.ty.clone(),
            })
            .collect()
    }

    pub fn outputs(&self) -> Vec<IoInfo> {
        self.program
            .outputs
            .iter()
            .map(|s| IoInfo {
                name: s.name.clone(),
                ty: s.ty.clone(),
            })
            .collect()
    }

    /// Runs the model on named inputs; returns `(name, value)` for every output, in order.
    pub fn run(&self, inputs: Vec<(String, Value)>) -> Result<Vec<(String, Value)>, Error> {
        Ok(self.on_pool(|| self.monitor.run(&self.program, inputs))?)
    }

    /// Runs `f` (one inference) on this session's compute threads: the pool is the current
    /// one and its workers spin for jobs until `f` returns, then go back to sleep.
    /// The run uses one of the session's arenas, so its intermediates reuse the buffers of
    /// earlier runs (`kiln_kernels::recycle`); runs at once each have their own.
    pub(crate) fn on_pool<R>(&self, f: impl FnOnce() -> R) -> R {
        let lock = || self.arenas.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut arena = lock().pop().unwrap_or_default();
        let r = {
            let _entered = arena.enter();
            match &self.pool {
                None => f(),
                Some(pool) => {
                    let _active = pool.activate();
                    pool.install(f)
                }
            }
        };
        lock().push(arena);
        r
    }

    /// Compute threads of each run (`num_of_cores`).
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or(1, kiln_runtime::ThreadPool::threads)
    }

    /// The round trip of a cache line between two of this session's compute threads, in ns:
    /// how far apart the host placed their cores (see `ThreadPool::round_trip_ns`). `None` on
    /// one thread or when it could not be measured.
    pub fn thread_round_trip_ns(&self) -> Option<f64> {
        self.pool.as_ref()?.round_trip_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Session>();
    }
}
