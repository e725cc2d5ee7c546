//! Session: a loaded, compiled model ready to run; immutable and shareable across threads.

use crate::limits::{RunLimits, RunOptions};
use crate::monitor::{Metrics, Monitor};
use crate::profile::ProfileReport;
use crate::specialize::{ShapeCacheInfo, Specializer};
use kiln_compiler::CompileOptions;
use kiln_onnx::{ImportOptions, Model};
use kiln_ops::{Value, ValueType};
use kiln_runtime::Program;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

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
    #[error("shape specialization {set}: {reason}")]
    ShapeSet { set: String, reason: String },
    #[error(transparent)]
    Crc(#[from] crate::crc::CrcMismatch),
    /// Quantizing the model failed (no calibration data, a sample that does not fit, ...).
    #[error("quantization: {0}")]
    Quantize(String),
    /// A quantization profile that cannot be read, written or used.
    #[error("quantization profile {path}: {reason}")]
    Profile { path: String, reason: String },
    /// A failure with the error artifact written for it (`save_error_artifact`).
    #[error("{error}{}", match .bundle {
        Ok(dir) => format!("\nerror artifact written to {} (replay it with `kiln repro {}`)", dir.display(), dir.display()),
        Err(why) => format!("\n(the error artifact could not be written: {why})"),
    })]
    Artifact {
        error: Box<Error>,
        bundle: Result<std::path::PathBuf, String>,
    },
}

impl Error {
    /// The error itself, under an [`Error::Artifact`] wrapper if there is one.
    pub fn root(&self) -> &Error {
        match self {
            Error::Artifact { error, .. } => error.root(),
            other => other,
        }
    }
}

fn to_usize(bindings: &[(String, u64)]) -> Vec<(String, usize)> {
    bindings
        .iter()
        .map(|(k, v)| (k.clone(), usize::try_from(*v).unwrap_or(usize::MAX)))
        .collect()
}

pub use kiln_runtime::file::Meta as ProgramMeta;

/// Options for creating a session.
#[derive(Debug, Clone)]
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
    /// Shape sets (bindings of the model's input symbols) compiled ahead of time beside the
    /// generic program (`shape_specializations`; see `specialize.rs`).
    pub shape_specializations: Vec<Vec<(String, usize)>>,
    /// Most run-time shape specialisations kept (`shape_cache_size`; 0: none).
    pub shape_cache_size: usize,
    /// Bounds on every run (`run_time_limit_ms`, `run_memory_limit_mb`,
    /// `loop_iteration_limit`).
    pub limits: RunLimits,
    /// Most time a compile may take (`compile_time_limit_s`; `None`: no limit).
    pub compile_time_limit: Option<std::time::Duration>,
    /// While set, compiles and runs of this session stop with an error (a Ctrl-C handler sets
    /// it; runs end as with [`RunOptions::terminate`]).
    pub cancel: Option<Arc<AtomicBool>>,
    /// CRCs of every run's inputs and outputs, sampled with this stride (`gen_crc` /
    /// `io_crc` with `crc_stride`; see `crc.rs`); `None`: off. A program file compiled with
    /// them on keeps them on.
    pub io_crc: Option<u32>,
    /// Write an error artifact when a compile or run fails (`save_error_artifact`, see
    /// `artifact.rs`); `None`: off.
    pub artifacts: Option<crate::ArtifactOptions>,
    /// Quantize the model as it is compiled (`convert_to_quantize`, `dump_profile`,
    /// `load_profile`; see `quantize.rs`); `None`: compile it in its own precision.
    pub quantize: Option<crate::QuantizeOptions>,
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            symbols: Vec::new(),
            compile: CompileOptions::default(),
            enable_metrics: false,
            enable_profiling: false,
            config: kiln_config::Config::default(),
            threads: 0,
            shape_specializations: Vec::new(),
            shape_cache_size: crate::specialize::DEFAULT_SHAPE_CACHE,
            limits: RunLimits::default(),
            compile_time_limit: None,
            cancel: None,
            io_crc: None,
            artifacts: None,
            quantize: None,
        }
    }
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
            shape_specializations: c
                .shape_specializations
                .iter()
                .map(|set| {
                    set.iter()
                        .map(|(k, v)| (k.clone(), usize::try_from(*v).unwrap_or(usize::MAX)))
                        .collect()
                })
                .collect(),
            shape_cache_size: usize::try_from(config.runtime.shape_cache_size).unwrap_or(usize::MAX),
            limits: RunLimits::from_config(&config.runtime),
            compile_time_limit: (c.compile_time_limit_s > 0)
                .then(|| std::time::Duration::from_secs(c.compile_time_limit_s)),
            cancel: None,
            io_crc: c.gen_crc.then_some(c.crc_stride),
            artifacts: c.save_error_artifact.then(|| crate::ArtifactOptions {
                dir: c.output_dir.clone(),
                randomize_weights: c.randomize_onnx_model,
            }),
            quantize: crate::quantize::from_config(c),
        }
    }

    /// Runs `f` (a compile) under these options' compile time limit and cancel flag.
    fn compiling<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::limits::with_stop(None, self.cancel.as_ref(), self.compile_time_limit, f)
    }

    /// `r`, its error wrapped with the artifact of a failed compile of `model` when artifacts
    /// are on.
    fn compile_artifact<R>(&self, model: &Path, r: Result<R, Error>) -> Result<R, Error> {
        match (&self.artifacts, r) {
            (Some(a), Err(e)) => Err(crate::artifact::attach(
                a,
                crate::artifact::Failure {
                    stage: crate::artifact::Stage::Compile,
                    model: Some(model),
                    options: self,
                    inputs: None,
                },
                e,
            )),
            (_, r) => r,
        }
    }
}

/// What a failed run's artifact is made of.
#[derive(Debug)]
struct RunArtifact {
    options: crate::ArtifactOptions,
    model: Option<std::path::PathBuf>,
    session: SessionOptions,
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
    /// Programs specialised for input shapes, for a model with symbolic input dims.
    specializer: Option<Specializer>,
    /// Run states: the planned block and recycled buffers of each concurrent run (one arena
    /// per run at once).
    pub(crate) arenas: std::sync::Mutex<Vec<kiln_runtime::Arena>>,
    /// The stride of the run CRCs when on.
    io_crc: Option<u32>,
    /// What a failed run's error artifact needs (`save_error_artifact`).
    artifact: Option<Arc<RunArtifact>>,
    /// Bounds on every run.
    limits: RunLimits,
    /// The options' cancel flag (stops every run while set).
    cancel: Option<Arc<AtomicBool>>,
    /// What quantizing the model did, when the options asked for it.
    quantization: Option<crate::QuantizeReport>,
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
    /// What quantizing did, when the options asked for it.
    pub quantization: Option<crate::QuantizeReport>,
}

/// Compiles an `.onnx` model into a `.kiln` program file.
pub fn compile_file(model: &Path, out: &Path, options: &SessionOptions) -> Result<CompileSummary, Error> {
    options.compile_artifact(model, options.compiling(|| compile_file_now(model, out, options)))
}

fn compile_file_now(model: &Path, out: &Path, options: &SessionOptions) -> Result<CompileSummary, Error> {
    let imported = load_onnx(model, options)?;
    let (imported, quantization) = crate::quantize::apply(&imported, options)?;
    let imported = crate::custom_io::apply(imported, options)?;
    // A program whose I/O the options changed keeps no source to recompile other shapes from
    // (as a quantized one: its source is the float model as exported).
    let quantized = quantization.as_ref().is_some_and(|r| r.mode != "dump_profile")
        || options.config.compile.custom_io_list_file.is_some();
    let symbols = kiln_ir::input_symbols(&imported.graph);
    let shapes = shape_programs(&imported.graph, &symbols, options)?;
    // A model with symbolic input dims carries its source, so a session can compile other shapes
    // (not a quantized one: its source is the float model; other shapes run the generic program).
    let source = if symbols.is_empty() || quantized {
        None
    } else {
        embeddable_source(model, options)
    };
    let compiled = kiln_compiler::compile(imported.graph, &options.compile)?;
    let resolved = serde_json::json!({
        "effective": {
            "compile": &options.compile,
            "onnx_define_symbol": options.symbols.iter().cloned().collect::<std::collections::BTreeMap<String, usize>>(),
        },
        "config": serde_json::to_value(&options.config).unwrap_or(serde_json::Value::Null),
        "quantization": serde_json::to_value(&quantization).unwrap_or(serde_json::Value::Null),
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
        shapes,
        model: source,
    };
    let meta = kiln_runtime::file::write(out, &compiled.program, input)?;
    let file_bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(CompileSummary {
        meta,
        report: compiled.report,
        memory: compiled.memory,
        file_bytes,
        quantization,
    })
}

/// The programs of the shape sets `options.shape_specializations` lists, each compiled from
/// `graph` with those symbols bound; every set must bind every input symbol of the model.
fn shape_programs(
    graph: &kiln_ir::Graph,
    symbols: &[String],
    options: &SessionOptions,
) -> Result<Vec<kiln_runtime::file::ShapeProgram>, Error> {
    let mut out: Vec<kiln_runtime::file::ShapeProgram> = Vec::new();
    for set in &options.shape_specializations {
        let bad = |reason: String| Error::ShapeSet {
            set: crate::format_bindings(set),
            reason,
        };
        if let Some((name, _)) = set.iter().find(|(n, _)| !symbols.contains(n)) {
            return Err(bad(format!(
                "'{name}' is not a symbol of the model's inputs (symbols: {})",
                if symbols.is_empty() {
                    "none".to_string()
                } else {
                    symbols.join(", ")
                }
            )));
        }
        if let Some(missing) = symbols.iter().find(|s| !set.iter().any(|(n, _)| n == *s)) {
            return Err(bad(format!("it does not bind the input symbol '{missing}'")));
        }
        let mut bindings: Vec<(String, usize)> = set.clone();
        bindings.sort();
        let bindings_u64: Vec<(String, u64)> = bindings.iter().map(|(k, v)| (k.clone(), *v as u64)).collect();
        if out.iter().any(|p| p.bindings == bindings_u64) {
            continue;
        }
        let mut g = graph.clone();
        kiln_ir::bind_symbols(&mut g, &bindings).map_err(|e| bad(e.to_string()))?;
        let program = kiln_compiler::compile(g, &options.compile).map_err(|e| bad(e.to_string()))?;
        out.push(kiln_runtime::file::ShapeProgram {
            bindings: bindings_u64,
            program: program.program,
        });
    }
    Ok(out)
}

/// The model's bytes and how to compile them again, when they can be imported on their own
/// (a model with external data cannot: its tensors live in other files).
fn embeddable_source(model: &Path, options: &SessionOptions) -> Option<(Vec<u8>, kiln_runtime::file::SourceMeta)> {
    let bytes = bytes::Bytes::from(std::fs::read(model).ok()?);
    let import = kiln_onnx::ImportOptions {
        symbols: options.symbols.clone(),
    };
    // The trial import's tensors view `bytes`; once it is dropped the buffer is unshared and
    // becomes the Vec without a copy.
    drop(kiln_onnx::load_model_bytes(bytes.clone(), &import).ok()?);
    let bytes = Vec::from(bytes);
    let meta = kiln_runtime::file::SourceMeta {
        bytes: bytes.len() as u64,
        symbols: options.symbols.iter().map(|(k, v)| (k.clone(), *v as u64)).collect(),
        compile: serde_json::to_value(&options.compile).ok()?,
    };
    Some((bytes, meta))
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
            let kiln_runtime::file::ProgramFile {
                program,
                shapes,
                source,
                meta,
                ..
            } = file;
            let specializer = Session::file_specializer(shapes, source, &meta, options);
            // The CRCs the program was compiled with (gen_crc is a compile option).
            let stored_crc = meta
                .options
                .get("config")
                .and_then(|c| serde_json::from_value::<kiln_config::Config>(c.clone()).ok())
                .and_then(|c| c.compile.gen_crc.then_some(c.compile.crc_stride));
            let mut session = Session::with_program(program, Some(meta));
            session.specializer = specializer;
            let mut session = session.observed(options, started)?;
            session.io_crc = options.io_crc.or(stored_crc);
            return Ok(session.with_artifacts(options, Some(path)));
        }
        let session = options.compile_artifact(
            path,
            load_onnx(path, options).and_then(|model| Session::compiled(&model, options, started)),
        )?;
        Ok(session.with_artifacts(options, Some(path)))
    }

    /// Keeps what a run failure's artifact needs (when artifacts are on).
    fn with_artifacts(mut self, options: &SessionOptions, model: Option<&Path>) -> Session {
        self.artifact = options.artifacts.as_ref().map(|a| {
            Arc::new(RunArtifact {
                options: a.clone(),
                model: model.map(Path::to_path_buf),
                session: SessionOptions {
                    artifacts: None,
                    ..options.clone()
                },
            })
        });
        self
    }

    /// What quantizing the model did (`convert_to_quantize`, `dump_profile`, `load_profile`):
    /// nodes quantized and the accuracy against the float model on the calibration samples.
    pub fn quantization(&self) -> Option<&crate::QuantizeReport> {
        self.quantization.as_ref()
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
        let (model, quantization) = options.compiling(|| crate::quantize::apply(model, options))?;
        let model = crate::custom_io::apply(model, options)?;
        let model = &model;
        let symbols = kiln_ir::input_symbols(&model.graph);
        let (stored, compiled) = options.compiling(|| -> Result<_, Error> {
            let stored = shape_programs(&model.graph, &symbols, options)?;
            Ok((stored, kiln_compiler::compile(model.graph.clone(), &options.compile)?))
        })?;
        let mut session = Session::with_program(compiled.program, None);
        session.quantization = quantization;
        if !symbols.is_empty() {
            let s = Specializer::from_graph(model.graph.clone(), options.compile.clone(), options.shape_cache_size);
            s.store(stored.into_iter().map(|p| (to_usize(&p.bindings), p.program)).collect());
            session.specializer = Some(s);
        }
        session.observed(options, started)
    }

    /// The specialisations of a program file: its stored shape programs, and its embedded
    /// source compiled with the options it was compiled with.
    fn file_specializer(
        shapes: Vec<kiln_runtime::file::ShapeProgram>,
        source: Option<kiln_runtime::file::SourceBytes>,
        meta: &ProgramMeta,
        options: &SessionOptions,
    ) -> Option<Specializer> {
        if shapes.is_empty() && source.is_none() {
            return None;
        }
        let spec = meta.specialize.as_ref();
        let compile = spec
            .and_then(|m| serde_json::from_value::<CompileOptions>(m.compile.clone()).ok())
            .unwrap_or_default();
        let source = source.zip(spec).map(|(bytes, m)| (bytes, to_usize(&m.symbols)));
        let stored = shapes.into_iter().map(|p| (to_usize(&p.bindings), p.program)).collect();
        Some(Specializer::from_file(
            source,
            stored,
            compile,
            options.shape_cache_size,
        ))
    }

    /// What this session's shape specialisations are (`None` for a model without symbolic
    /// input dims).
    pub fn shape_cache(&self) -> Option<ShapeCacheInfo> {
        self.specializer.as_ref().map(Specializer::info)
    }

    /// The one constructor every way of opening a session ends in.
    fn with_program(program: Program, meta: Option<ProgramMeta>) -> Session {
        Session {
            program,
            meta,
            monitor: Monitor::default(),
            pool: None,
            arenas: std::sync::Mutex::new(Vec::new()),
            specializer: None,
            limits: RunLimits::default(),
            cancel: None,
            io_crc: None,
            artifact: None,
            quantization: None,
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
        self.limits = options.limits;
        self.cancel = options.cancel.clone();
        self.io_crc = options.io_crc;
        Ok(self)
    }

    /// The stride of the run CRCs when they are on (`gen_crc`).
    pub fn io_crc(&self) -> Option<u32> {
        self.io_crc
    }

    /// Whether the options' cancel flag is set.
    pub fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The bounds on every run of this session.
    pub fn limits(&self) -> RunLimits {
        self.limits
    }

    /// Turns the run CRCs on (with this stride) or off.
    pub fn set_io_crc(&mut self, stride: Option<u32>) {
        self.io_crc = stride;
    }

    /// Changes the bounds of later runs.
    pub fn set_limits(&mut self, limits: RunLimits) {
        self.limits = limits;
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

    /// Changes the compute threads of later runs (`num_of_cores` after creation; qaic's
    /// `update_backend_options`). Runs in progress must have finished (`&mut self`).
    pub fn set_threads(&mut self, threads: usize) -> Result<(), Error> {
        if threads == self.threads() {
            return Ok(());
        }
        self.pool = if threads > 1 {
            Some(kiln_runtime::ThreadPool::new(threads).map_err(|cause| Error::Threads { threads, cause })?)
        } else {
            None
        };
        Ok(())
    }

    /// Switches latency metrics and step profiling on or off for later runs, forgetting what
    /// was recorded (`enable_metrics` / `enable_profiling` after creation).
    pub fn set_monitoring(&mut self, enable_metrics: bool, enable_profiling: bool) {
        self.monitor = Monitor::new(enable_metrics, enable_profiling, self.monitor.load());
    }

    /// qaic's `reset`: forgets the recorded metrics and profile and frees the run states
    /// (planned blocks and recycled buffers) that no run is using; the next run allocates
    /// them again.
    pub fn reset(&self) {
        self.monitor.reset();
        self.arenas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        if let Some(s) = &self.specializer {
            s.release_run_states();
        }
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
    /// With `gen_crc` on, an input changed while the run read it fails the run
    /// ([`Error::Crc`]); [`Session::run_with_crc`] also returns the CRCs.
    pub fn run(&self, inputs: Vec<(String, Value)>) -> Result<Vec<(String, Value)>, Error> {
        self.reporting(inputs, |inputs| match self.io_crc {
            None => self.run_plain(inputs, None),
            Some(stride) => self.run_crc_with(inputs, None, stride).map(|(o, _)| o),
        })
    }

    /// `f(inputs)`, its error wrapped with an artifact of the failed run when artifacts are on.
    fn reporting<R>(
        &self,
        inputs: Vec<(String, Value)>,
        f: impl FnOnce(Vec<(String, Value)>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let Some(a) = &self.artifact else {
            return f(inputs);
        };
        let kept = inputs.clone();
        f(inputs).map_err(|e| {
            crate::artifact::attach(
                &a.options,
                crate::artifact::Failure {
                    stage: crate::artifact::Stage::Run,
                    model: a.model.as_deref(),
                    options: &a.session,
                    inputs: Some(&kept),
                },
                e,
            )
        })
    }

    /// [`Session::run`] under `options`: another thread may stop it with
    /// [`RunOptions::terminate`], and its time limit replaces the session's.
    pub fn run_with_options(
        &self,
        inputs: Vec<(String, Value)>,
        options: &RunOptions,
    ) -> Result<Vec<(String, Value)>, Error> {
        self.reporting(inputs, |inputs| match self.io_crc {
            None => self.run_plain(inputs, Some(options)),
            Some(stride) => self.run_crc_with(inputs, Some(options), stride).map(|(o, _)| o),
        })
    }

    /// [`Session::run_with_options`] returning the CRCs of the inputs and outputs too (see
    /// `crc.rs`: sampled with the session's `crc_stride`, 256 when `gen_crc` is off).
    pub fn run_with_crc(
        &self,
        inputs: Vec<(String, Value)>,
        options: &RunOptions,
    ) -> Result<(Vec<(String, Value)>, crate::IoCrc), Error> {
        let stride = self.io_crc.unwrap_or(crate::crc::DEFAULT_STRIDE);
        self.reporting(inputs, |inputs| self.run_crc_with(inputs, Some(options), stride))
    }

    fn run_plain(
        &self,
        inputs: Vec<(String, Value)>,
        options: Option<&RunOptions>,
    ) -> Result<Vec<(String, Value)>, Error> {
        self.run_program(inputs, options, |program, inputs, limits| {
            self.monitor.run(program, inputs, limits)
        })
    }

    fn run_crc_with(
        &self,
        inputs: Vec<(String, Value)>,
        options: Option<&RunOptions>,
        stride: u32,
    ) -> Result<(Vec<(String, Value)>, crate::IoCrc), Error> {
        let input_crcs = crate::crc::crcs(&inputs, stride);
        let watched = crate::crc::watch(&inputs, stride);
        let outputs = self.run_plain(inputs, options)?;
        crate::crc::recheck(&watched, stride)?;
        let crc = crate::IoCrc {
            stride,
            inputs: input_crcs,
            outputs: crate::crc::crcs(&outputs, stride),
        };
        Ok((outputs, crc))
    }

    /// Runs `f` on the program for these inputs (the shape specialisation when there is one,
    /// else the generic program), on this session's threads, with one of that program's run
    /// states and under this session's limits and `options`' stop.
    pub(crate) fn run_program<R>(
        &self,
        inputs: Vec<(String, Value)>,
        options: Option<&RunOptions>,
        f: impl FnOnce(&Program, Vec<(String, Value)>, &kiln_runtime::Limits) -> Result<R, kiln_runtime::RuntimeError>,
    ) -> Result<R, Error> {
        let variant = self
            .specializer
            .as_ref()
            .and_then(|s| s.variant(&self.program, &inputs));
        let limits = self.limits.runtime();
        let time = options.and_then(|o| o.time_limit).or(self.limits.time);
        let guarded = |program: &Program| {
            crate::limits::with_stop(options.map(RunOptions::flag), self.cancel.as_ref(), time, || {
                f(program, inputs, &limits)
            })
        };
        match variant.as_ref().and_then(|v| Some((v, v.program()?))) {
            Some((v, program)) => Ok(self.on_pool_in(&v.arenas, || guarded(program))?),
            None => Ok(self.on_pool(|| guarded(&self.program))?),
        }
    }

    /// Runs `f` (one inference) on this session's compute threads: the pool is the current
    /// one and its workers spin for jobs until `f` returns, then go back to sleep.
    /// The run uses one of the session's arenas, so its intermediates reuse the buffers of
    /// earlier runs (`kiln_kernels::recycle`); runs at once each have their own.
    pub(crate) fn on_pool<R>(&self, f: impl FnOnce() -> R) -> R {
        self.on_pool_in(&self.arenas, f)
    }

    /// [`Session::on_pool`] with a run state from `arenas` (a specialised program's own).
    fn on_pool_in<R>(&self, arenas: &std::sync::Mutex<Vec<kiln_runtime::Arena>>, f: impl FnOnce() -> R) -> R {
        let lock = || arenas.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut arena = lock().pop().unwrap_or_default();
        let r = {
            let _entered = arena.enter();
            // Denormals flushed for the run (`kiln_kernels::fp`), the caller's setting after.
            let _flush = kiln_runtime::FlushDenormals::enter();
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
