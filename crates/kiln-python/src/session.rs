//! `kiln.Session` (qaic's `Session`: same constructor, keyword arguments, methods and return
//! shapes) and `kiln.compile`. The GIL is released while compiling, running and benchmarking;
//! one Session serves several Python threads at once.

use crate::convert::{self, ReadOnlyHolds};
use crate::errors::{self, guarded};
use kiln::{BenchLimit, BenchOptions, SessionOptions, ValueType};
use kiln_config::{Config, Section, Source, Status};
use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

/// The options `update_backend_options` can change on a live session (qaic's backend options).
const BACKEND_OPTIONS: &[&str] = &[
    "num_activations",
    "set_size",
    "dev_id",
    "device_ids",
    "num_of_cores",
    "num_inferences",
    "inf_time",
    "enable_metrics",
    "enable_profiling",
    "submit_num_retries",
    "submit_timeout",
    "threads_per_queue",
    "run_time_limit_ms",
    "run_memory_limit_mb",
    "loop_iteration_limit",
];

/// ONNX Runtime's `RunOptions` for `Session.run(..., run_options=...)`: set `terminate` (from
/// any thread) to stop the runs using these options, and `time_limit_ms` to bound them.
#[pyclass(module = "kiln", name = "RunOptions")]
pub(crate) struct RunOptions {
    inner: Mutex<kiln::RunOptions>,
}

#[pymethods]
impl RunOptions {
    #[new]
    #[pyo3(signature = (time_limit_ms=None))]
    fn new(time_limit_ms: Option<f64>) -> PyResult<RunOptions> {
        let mut o = kiln::RunOptions::new();
        o.time_limit = time_limit(time_limit_ms)?;
        Ok(RunOptions { inner: Mutex::new(o) })
    }

    /// True stops every run using these options (now, from any thread, and later ones);
    /// False lets later runs go ahead again.
    #[getter]
    fn get_terminate(&self) -> bool {
        self.get().is_terminated()
    }

    #[setter]
    fn set_terminate(&self, value: bool) {
        let o = self.get();
        if value { o.terminate() } else { o.unset_terminate() }
    }

    /// Milliseconds a run with these options may take (None: the session's
    /// `run_time_limit_ms`).
    #[getter]
    fn get_time_limit_ms(&self) -> Option<f64> {
        self.get().time_limit.map(|d| d.as_secs_f64() * 1e3)
    }

    #[setter]
    fn set_time_limit_ms(&self, value: Option<f64>) -> PyResult<()> {
        let limit = time_limit(value)?;
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .time_limit = limit;
        Ok(())
    }

    fn __repr__(&self) -> String {
        let o = self.get();
        format!(
            "RunOptions(terminate={}, time_limit_ms={})",
            if o.is_terminated() { "True" } else { "False" },
            o.time_limit
                .map_or_else(|| "None".to_string(), |d| format!("{}", d.as_secs_f64() * 1e3))
        )
    }
}

impl RunOptions {
    /// A snapshot sharing the terminate flag.
    fn get(&self) -> kiln::RunOptions {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

fn time_limit(ms: Option<f64>) -> PyResult<Option<Duration>> {
    match ms {
        None => Ok(None),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(Some(Duration::from_secs_f64(v / 1e3))),
        Some(v) => Err(errors::config(format!(
            "time_limit_ms: expected a finite number of milliseconds >= 0, got {v}"
        ))),
    }
}

/// The canonical name of an option spelled `key` (any alias), if there is one.
fn canonical(key: &str) -> Option<&'static str> {
    kiln_config::options()
        .iter()
        .find(|s| s.name == key || s.aliases().contains(&key))
        .map(|s| s.name)
}

/// The session options of `options_path` then `kwargs`, with `calibration_data` (a list of
/// `{input: array}` dicts, copied) given to the quantizer.
fn session_options(
    py: Python<'_>,
    options_path: Option<&Path>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Config, SessionOptions)> {
    let samples = match kwargs.map(|kw| kw.get_item("calibration_data")).transpose()?.flatten() {
        Some(v) if !v.is_none() => Some(calibration_samples(py, &v)?),
        _ => None,
    };
    let rest = match (kwargs, &samples) {
        (Some(kw), Some(_)) => {
            let copy = kw.copy()?;
            copy.del_item("calibration_data")?;
            Some(copy)
        }
        (kw, _) => kw.cloned(),
    };
    let config = resolve(py, options_path, rest.as_ref())?;
    let mut options = SessionOptions::from_config(&config);
    match (&mut options.quantize, samples) {
        (Some(q), Some(samples)) => q.samples = std::sync::Arc::new(samples),
        (None, Some(_)) => {
            return Err(errors::config(
                "calibration_data is for quantizing: pass convert_to_quantize=True (or dump_profile=...)",
            ));
        }
        (Some(q), None) if config.compile.calibration_data.is_some() && q.mode != kiln::QuantizeMode::Calibrate => {}
        (Some(_), None) if config.compile.calibration_data.is_some() => {
            return Err(errors::config(
                "calibration_data as a path is read by the kiln command; from Python pass calibration_data=[{input: \
                 array}, ...], one dict per sample",
            ));
        }
        _ => {}
    }
    Ok((config, options))
}

/// `[{name: array}, ...]` as owned samples.
fn calibration_samples(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<Vec<kiln::Sample>> {
    if v.extract::<String>().is_ok() || v.extract::<PathBuf>().is_ok() {
        return Err(errors::config(
            "calibration_data as a path is read by the kiln command; from Python pass calibration_data=[{input: \
             array}, ...], one dict per sample",
        ));
    }
    let mut out = Vec::new();
    for (k, item) in v.try_iter()?.enumerate() {
        let item = item?;
        let dict = item.cast::<PyDict>().map_err(|_| {
            errors::input(format!(
                "calibration_data[{k}]: expected a dict of input name to array, got {}",
                item.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })?;
        let mut holds = ReadOnlyHolds::default();
        let feed = convert::feed(py, dict, &mut holds, &|_| None);
        // Copies, so the arrays are not read in place after this call.
        let owned = feed.and_then(|feed| {
            feed.into_iter()
                .map(|(name, v)| match v {
                    kiln::Value::Tensor(t) => {
                        let all: Vec<usize> = (0..t.len()).collect();
                        let copy = t
                            .gather_flat(t.shape().to_vec(), &all)
                            .map_err(|e| errors::input(format!("calibration_data[{k}]['{name}']: {e}")))?;
                        Ok((name, kiln::Value::Tensor(copy)))
                    }
                    other => Ok((name, other)),
                })
                .collect::<PyResult<kiln::Sample>>()
        });
        holds.release(py);
        out.push(owned?);
    }
    Ok(out)
}

/// The configuration of `options_path` then `kwargs` (keyword arguments win), validated; its
/// warnings (options with no effect here) are issued as `kiln.KilnWarning`.
fn resolve(py: Python<'_>, options_path: Option<&Path>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
    let mut config = match options_path {
        Some(p) => Config::from_file(p).map_err(errors::from_config)?,
        None => Config::default(),
    };
    if let Some(kw) = kwargs {
        for (k, v) in kw.iter() {
            let key: String = k.extract()?;
            let value = convert::to_json(&v, &key)?;
            config
                .set(&key, &value, Source::Keyword { key: key.clone() })
                .map_err(|e| errors::from_keyword(&key, e))?;
        }
    }
    let warnings = config.check().map_err(errors::from_config)?;
    warn_all(py, warnings.iter().map(ToString::to_string))?;
    Ok(config)
}

fn warn_all(py: Python<'_>, messages: impl Iterator<Item = String>) -> PyResult<()> {
    let category = py.get_type::<errors::KilnWarning>();
    for m in messages {
        let text = std::ffi::CString::new(m).unwrap_or_default();
        PyErr::warn(py, &category, &text, 1)?;
    }
    Ok(())
}

/// Refuses, for a compiled program, the options that only compiling applies.
fn check_program_options(path: &Path, config: &Config) -> PyResult<()> {
    let set: Vec<&str> = config
        .changed()
        .into_iter()
        .filter(|(spec, _, _)| spec.section == Section::Compile && matches!(spec.status, Status::Implemented))
        .map(|(spec, _, _)| spec.name)
        .collect();
    if set.is_empty() {
        return Ok(());
    }
    Err(errors::config(format!(
        "{} is a compiled .kiln program: the compile options {} apply when compiling; pass them to \
         kiln.compile (or open the .onnx)",
        path.display(),
        set.join(", ")
    )))
}

/// Where `output_dir` puts the program compiled from `model`.
fn program_path(dir: &Path, model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    dir.join(format!("{stem}.kiln"))
}

/// A compiled model ready to run (qaic's `Session`).
///
/// `Session(model_path, options_path=None, **kwargs)`: `model_path` is an `.onnx` model
/// (compiled now, as qaic does) or a `.kiln` program; `options_path` any configuration file kiln
/// reads (YAML or JSON, qaic/QAIRT/HTP/Axelera option names); `**kwargs` any option of
/// `kiln config list` by name or alias, overriding the file.
#[pyclass(module = "kiln", name = "Session", frozen)]
pub(crate) struct Session {
    /// Runs take it shared; `update_backend_options` exclusively (between runs).
    inner: RwLock<kiln::Session>,
    /// The options in force (backend options change with `update_backend_options`).
    config: Mutex<Config>,
    model_path: PathBuf,
    /// The program file `output_dir` received, if any.
    program_path: Option<PathBuf>,
}

impl Session {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, kiln::Session> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn config(&self) -> std::sync::MutexGuard<'_, Config> {
        self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The model's dtype of input `name`, if it declares one.
    fn declared(&self, name: &str) -> Option<kiln::DType> {
        let s = self.read();
        let input = s.inputs().into_iter().find(|i| i.name == name)?;
        input.ty.tensor()?.dtype
    }

    /// Metrics are recorded (else the error naming the options that turn them on).
    fn need_metrics(&self, what: &str) -> PyResult<()> {
        let c = self.config();
        if c.runtime.enable_metrics || c.runtime.enable_profiling {
            return Ok(());
        }
        Err(errors::config(format!(
            "{what} needs enable_metrics=True (or enable_profiling=True): pass it to kiln.Session(...) or \
             update_backend_options(enable_metrics=True)"
        )))
    }

    fn metrics(&self, py: Python<'_>) -> PyResult<Option<kiln::Metrics>> {
        self.need_metrics("get_metrics")?;
        Ok(py.detach(|| self.read().get_metrics()))
    }
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (model_path, options_path=None, **kwargs))]
    fn new(
        py: Python<'_>,
        model_path: PathBuf,
        options_path: Option<PathBuf>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Session> {
        let (config, options) = session_options(py, options_path.as_deref(), kwargs)?;
        let is_program = kiln::is_program_file(&model_path);
        if is_program {
            check_program_options(&model_path, &config)?;
        } else if !model_path.exists() {
            return Err(errors::ModelError::new_err(format!(
                "{}: no such file",
                model_path.display()
            )));
        }
        let out = match (&config.compile.output_dir, is_program) {
            (Some(dir), false) => Some(program_path(dir, &model_path)),
            _ => None,
        };
        let (session, program_path) = py.detach(|| {
            guarded("opening the model", || {
                let Some(out) = out else {
                    return Ok((
                        kiln::Session::new(&model_path, &options).map_err(errors::from_kiln)?,
                        None,
                    ));
                };
                if let Some(dir) = out.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        errors::ProgramFileError::new_err(format!("cannot create output_dir {}: {e}", dir.display()))
                    })?;
                }
                kiln::compile_file(&model_path, &out, &options).map_err(errors::from_kiln)?;
                let s = kiln::Session::new(&out, &options).map_err(errors::from_kiln)?;
                Ok((s, Some(out)))
            })
        })?;
        Ok(Session {
            inner: RwLock::new(session),
            config: Mutex::new(config),
            model_path,
            program_path,
        })
    }

    /// Runs one inference. `input_dict` maps every input name to a numpy array (or anything
    /// `numpy.asarray` takes); returns `{output_name: ndarray}` in the model's output order.
    /// C-contiguous aligned arrays are read in place (held read-only during the run); others
    /// are copied once.
    /// With `run_options` (a `kiln.RunOptions`), another thread can stop the run by setting
    /// its `terminate`, and its `time_limit_ms` replaces the session's.
    #[pyo3(signature = (input_dict, run_options=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        input_dict: &Bound<'py, PyDict>,
        run_options: Option<PyRef<'py, RunOptions>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut holds = ReadOnlyHolds::default();
        let feed = convert::feed(py, input_dict, &mut holds, &|n| self.declared(n));
        let options = run_options.map(|o| o.get());
        let result = match feed {
            Ok(feed) => py.detach(|| {
                guarded("running", || {
                    let s = self.read();
                    match &options {
                        Some(o) => s.run_with_options(feed, o),
                        None => s.run(feed),
                    }
                    .map_err(errors::from_kiln)
                })
            }),
            Err(e) => Err(e),
        };
        let result = result.and_then(|outputs| {
            let d = PyDict::new(py);
            for (name, v) in outputs {
                let array = convert::value_to_py(py, &name, v)?;
                d.set_item(name, array)?;
            }
            Ok(d)
        });
        holds.release(py);
        result
    }

    /// [`run`], returning also the CRC-32 of every input and output (`gen_crc` / `io_crc`,
    /// sampled with `crc_stride`): `(outputs, {"stride": n, "inputs": {name: crc}, "outputs":
    /// {name: crc}})`. An input changed during the run (through another view of its memory)
    /// raises `InputError`.
    #[pyo3(signature = (input_dict, run_options=None))]
    fn run_with_crc<'py>(
        &self,
        py: Python<'py>,
        input_dict: &Bound<'py, PyDict>,
        run_options: Option<PyRef<'py, RunOptions>>,
    ) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
        let mut holds = ReadOnlyHolds::default();
        let feed = convert::feed(py, input_dict, &mut holds, &|n| self.declared(n));
        let options = run_options.map_or_else(kiln::RunOptions::default, |o| o.get());
        let result = match feed {
            Ok(feed) => py.detach(|| {
                guarded("running", || {
                    self.read().run_with_crc(feed, &options).map_err(errors::from_kiln)
                })
            }),
            Err(e) => Err(e),
        };
        let result = result.and_then(|(outputs, crc)| {
            let d = PyDict::new(py);
            for (name, v) in outputs {
                let array = convert::value_to_py(py, &name, v)?;
                d.set_item(name, array)?;
            }
            let c = PyDict::new(py);
            c.set_item("stride", crc.stride)?;
            let ins = PyDict::new(py);
            for (n, v) in crc.inputs {
                ins.set_item(n, v)?;
            }
            let outs = PyDict::new(py);
            for (n, v) in crc.outputs {
                outs.set_item(n, v)?;
            }
            c.set_item("inputs", ins)?;
            c.set_item("outputs", outs)?;
            Ok((d, c))
        });
        holds.release(py);
        result
    }

    /// qaic's benchmark: runs `num_inferences` inferences (default 40, or the session's
    /// `num_inferences` option) or as many as fit in `inf_time` seconds, after one warm-up run,
    /// on `input_dict` or random inputs, with `num_activations` inferences at once; timed in
    /// Rust, without Python's overhead. Returns `(inf_completed, inf_rate, inf_time,
    /// batch_size)`.
    #[pyo3(signature = (num_inferences=None, inf_time=None, input_dict=None))]
    fn run_benchmark(
        &self,
        py: Python<'_>,
        num_inferences: Option<u64>,
        inf_time: Option<f64>,
        input_dict: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<(u64, f64, f64, usize)> {
        let (limit, activations) = {
            let c = self.config();
            let limit = match (num_inferences, inf_time) {
                (Some(_), Some(_)) => {
                    return Err(errors::config(
                        "run_benchmark: num_inferences and inf_time cannot be used together (a benchmark runs \
                         either a number of inferences or for a time)",
                    ));
                }
                (Some(0), None) => return Err(errors::config("run_benchmark: num_inferences must be at least 1")),
                (Some(n), None) => BenchLimit::Iterations(n),
                (None, Some(t)) => BenchLimit::Time(seconds(t, "inf_time")?),
                (None, None) => match c.runtime.inf_time {
                    Some(t) => BenchLimit::Time(seconds(t, "inf_time")?),
                    None => BenchLimit::Iterations(c.runtime.num_inferences),
                },
            };
            (limit, c.runtime.num_activations.max(1) as usize)
        };
        let mut holds = ReadOnlyHolds::default();
        let inputs = match input_dict {
            Some(d) => convert::feed(py, d, &mut holds, &|n| self.declared(n)),
            None => Ok(Vec::new()),
        };
        let report = inputs.and_then(|inputs| {
            let options = BenchOptions {
                inputs,
                limit,
                activations,
                ..BenchOptions::default()
            };
            py.detach(|| {
                guarded("benchmarking", || {
                    self.read().run_benchmark(&options).map_err(errors::from_kiln)
                })
            })
        });
        holds.release(py);
        let r = report?;
        Ok((r.inferences, r.inf_per_s, r.total_s, r.batch_size))
    }

    /// Latency statistics, in seconds, of every inference since the session was created or
    /// `reset()` (run and run_benchmark): num_of_inferences, min_latency, max_latency, P25, P50,
    /// P75, P90, P99, P999, total_inference_time, avg_latency. Needs enable_metrics or
    /// enable_profiling.
    fn get_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.metrics(py)?;
        let d = PyDict::new(py);
        let (n, total) = m.as_ref().map_or((0, 0.0), |m| (m.inferences, m.total_s));
        let s = |f: fn(&kiln::LatencyStats) -> f64| m.as_ref().map_or(f64::NAN, |m| f(&m.latency_ms) / 1e3);
        d.set_item("num_of_inferences", n)?;
        d.set_item("min_latency", s(|l| l.min))?;
        d.set_item("max_latency", s(|l| l.max))?;
        d.set_item("P25", s(|l| l.p25))?;
        d.set_item("P50", s(|l| l.p50))?;
        d.set_item("P75", s(|l| l.p75))?;
        d.set_item("P90", s(|l| l.p90))?;
        d.set_item("P99", s(|l| l.p99))?;
        d.set_item("P999", s(|l| l.p999))?;
        d.set_item("total_inference_time", total)?;
        d.set_item("avg_latency", s(|l| l.avg))?;
        Ok(d)
    }

    /// Prints the metrics in qaic's wording. Needs enable_metrics or enable_profiling.
    fn print_metrics(&self, py: Python<'_>) -> PyResult<()> {
        let text = match self.metrics(py)? {
            Some(m) => m.to_string(),
            None => "Number of inferences utilized for calculation are 0\n".to_string(),
        };
        print(py, text.trim_end())
    }

    /// Prints the per-node profile of the first `n` profiled runs (all when `n` is None): each
    /// node's mean time, share and shapes, then the same by op type. Needs enable_profiling.
    #[pyo3(signature = (n=None))]
    fn print_profile_data(&self, py: Python<'_>, n: Option<usize>) -> PyResult<()> {
        if !self.config().runtime.enable_profiling {
            return Err(errors::config(
                "print_profile_data needs enable_profiling=True: pass it to kiln.Session(...) or \
                 update_backend_options(enable_profiling=True)",
            ));
        }
        let text = py.detach(|| {
            let s = self.read();
            let report = s.get_profile()?;
            let mut profile = report.profile;
            if let Some(n) = n {
                profile.runs.truncate(n);
            }
            let runs = profile.runs.len();
            let r = kiln::ProfileReport::new(profile, report.load);
            Some(format!("profile of {runs} run(s)\n{}", r.table(None)))
        });
        print(py, text.as_deref().unwrap_or("no profile").trim_end())
    }

    /// `{input_name: (shape, dtype)}`: shape a tuple of ints, a symbolic dim given by its name;
    /// dtype numpy's name ("float32", ...).
    fn model_input_shape_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        io_dict(py, self.read().inputs())
    }

    /// `{output_name: (shape, dtype)}`, as `model_input_shape_dict`.
    fn model_output_shape_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        io_dict(py, self.read().outputs())
    }

    /// The options that can change after creation, with their current values (change them
    /// with `update_backend_options`).
    fn backend_options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.config();
        let d = PyDict::new(py);
        for name in BACKEND_OPTIONS {
            let v = c.get(name).unwrap_or(serde_json::Value::Null);
            d.set_item(*name, convert::from_json(py, &v)?)?;
        }
        Ok(d)
    }

    /// Changes backend options (any of `backend_options()`, by name or alias) for later runs:
    /// `num_of_cores` restarts the compute threads, `enable_metrics`/`enable_profiling` start
    /// recording afresh; waits for runs in progress to finish.
    #[pyo3(signature = (**kwargs))]
    fn update_backend_options(&self, py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let Some(kw) = kwargs else { return Ok(()) };
        let mut next = self.config().clone();
        for (k, v) in kw.iter() {
            let key: String = k.extract()?;
            let value = convert::to_json(&v, &key)?;
            next.set(&key, &value, Source::Keyword { key: key.clone() })
                .map_err(|e| errors::from_keyword(&key, e))?;
            match canonical(&key) {
                Some(name) if BACKEND_OPTIONS.contains(&name) => {}
                Some(name) => {
                    return Err(errors::config(format!(
                        "{name} cannot change after the session is created (backend_options() lists those that \
                         can); pass it to kiln.Session(...)"
                    )));
                }
                None => return Err(errors::config(format!("unknown option '{key}'"))),
            }
        }
        let warnings = next.check().map_err(errors::from_config)?;
        warn_all(py, warnings.iter().map(ToString::to_string))?;
        let (threads, metrics, profiling) = {
            let r = &next.runtime;
            (r.num_of_cores as usize, r.enable_metrics, r.enable_profiling)
        };
        let limits = kiln::RunLimits::from_config(&next.runtime);
        let (old_metrics, old_profiling) = {
            let c = self.config();
            (c.runtime.enable_metrics, c.runtime.enable_profiling)
        };
        py.detach(|| {
            guarded("updating the options", || {
                let mut s = self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                s.set_threads(threads).map_err(errors::from_kiln)?;
                s.set_limits(limits);
                if (metrics, profiling) != (old_metrics, old_profiling) {
                    s.set_monitoring(metrics, profiling);
                }
                Ok(())
            })
        })?;
        *self.config() = next;
        Ok(())
    }

    /// Nothing to do: kiln loads (and compiles) the model when the Session is created, so it
    /// is ready for its first run. Kept for qaic's API.
    fn setup(&self) {}

    /// Forgets the recorded metrics and profile and frees the memory idle run states hold
    /// (qaic: releases the resources the session acquired); the session stays usable.
    fn reset(&self, py: Python<'_>) {
        py.detach(|| self.read().reset());
    }

    /// The model file the session was opened from.
    #[getter]
    fn model_path(&self) -> PathBuf {
        self.model_path.clone()
    }

    /// What quantizing did (convert_to_quantize, dump_profile, load_profile) as a dict: nodes
    /// quantized, the SQNR of each output and of the ten worst tensors against the float model
    /// on the calibration samples; None when the model was not quantized.
    #[getter]
    fn quantization_report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let s = self.read();
        let json = match s.quantization() {
            Some(r) => serde_json::to_value(r).ok(),
            None => s
                .program_meta()
                .and_then(|m| m.options.get("quantization").cloned())
                .filter(|v| !v.is_null()),
        };
        json.map(|v| convert::from_json(py, &v)).transpose()
    }

    /// The program file written to `output_dir`, or None.
    #[getter]
    fn program_path(&self) -> Option<PathBuf> {
        self.program_path.clone()
    }

    /// Compute threads of each run (`num_of_cores`).
    #[getter]
    fn num_of_cores(&self) -> usize {
        self.read().threads()
    }

    fn __repr__(&self) -> String {
        let s = self.read();
        let names = |v: Vec<kiln::IoInfo>| v.into_iter().map(|i| i.name).collect::<Vec<_>>().join(", ");
        format!(
            "kiln.Session('{}', inputs=[{}], outputs=[{}], num_of_cores={})",
            self.model_path.display(),
            names(s.inputs()),
            names(s.outputs()),
            s.threads()
        )
    }
}

fn seconds(t: f64, what: &str) -> PyResult<Duration> {
    if !(t.is_finite() && t > 0.0) {
        return Err(errors::config(format!(
            "{what}: expected a positive number of seconds, got {t}"
        )));
    }
    Duration::try_from_secs_f64(t).map_err(|e| errors::config(format!("{what}: {e}")))
}

/// Prints through Python's `print`, so `sys.stdout` redirection and notebooks see it.
fn print(py: Python<'_>, text: &str) -> PyResult<()> {
    py.import("builtins")?.getattr("print")?.call1((text,))?;
    Ok(())
}

fn io_dict<'py>(py: Python<'py>, io: Vec<kiln::IoInfo>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for info in io {
        let (shape, dtype): (Option<Bound<'py, PyTuple>>, String) = match &info.ty {
            ValueType::Tensor(t) => {
                let shape = match &t.shape {
                    Some(dims) => {
                        let items: Vec<Bound<'py, PyAny>> = dims
                            .iter()
                            .map(|d| match d {
                                kiln::Dim::Fixed(n) => n.into_bound_py_any(py),
                                kiln::Dim::Sym(s) => s.into_bound_py_any(py),
                            })
                            .collect::<PyResult<_>>()?;
                        Some(PyTuple::new(py, items)?)
                    }
                    None => None,
                };
                (
                    shape,
                    t.dtype
                        .map_or_else(|| "unknown".into(), |d| convert::numpy_name(d).into()),
                )
            }
            other => (None, other.to_string()),
        };
        d.set_item(info.name, (shape, dtype))?;
    }
    Ok(d)
}

/// Compiles `model` (.onnx) into the program file `output` (or `output_dir/<model>.kiln` when
/// `output` is None and the option is set), with options as `Session` takes them; returns the
/// program's path.
#[pyfunction]
#[pyo3(signature = (model, output=None, options_path=None, **kwargs))]
pub(crate) fn compile(
    py: Python<'_>,
    model: PathBuf,
    output: Option<PathBuf>,
    options_path: Option<PathBuf>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<PathBuf> {
    let (config, options) = session_options(py, options_path.as_deref(), kwargs)?;
    let out = match (output, &config.compile.output_dir) {
        (Some(o), _) => o,
        (None, Some(dir)) => program_path(dir, &model),
        (None, None) => {
            return Err(errors::config(
                "no output file: pass output='model.kiln' (or output_dir='dir')",
            ));
        }
    };
    py.detach(|| {
        guarded("compiling", || {
            if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| errors::ProgramFileError::new_err(format!("cannot create {}: {e}", dir.display())))?;
            }
            kiln::compile_file(&model, &out, &options).map_err(errors::from_kiln)?;
            Ok(())
        })
    })?;
    Ok(out)
}
