//! Benchmarking and profiling runs of a [`Session`] (qaic's `run_benchmark`, `kiln bench`,
//! `kiln profile`). Latencies are summarised as in `monitor.rs`.
//!
//! Definitions used throughout:
//! - **latency**: wall-clock time of one `Session::run` call, inputs already built;
//! - **batch size**: the leading dimension of the model's first input as fed (1 for a scalar
//!   or a non-tensor input);
//! - **random inputs**: generated from each input's static type with a fixed seed: floats
//!   uniform in [-1, 1), integers 0 or 1 (valid as token ids, masks and segment ids), bools
//!   random. Symbolic dims must be bound (`SessionOptions::symbols`).

use crate::monitor::LatencyStats;
use crate::profile::ProfileReport;
use crate::session::{Error, Session};
use kiln_ops::{Dim, TensorType, Value, ValueType};
use kiln_runtime::{Profile, RuntimeError};
use kiln_tensor::{DType, Tensor};
use std::fmt;
use std::time::{Duration, Instant};

/// How long a benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BenchLimit {
    /// This many inferences (at least one).
    Iterations(u64),
    /// Inferences until this much time has passed (at least one inference).
    Time(Duration),
}

/// What `Session::run_benchmark` runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Inputs by name; every model input not given here is generated at random.
    pub inputs: Vec<(String, Value)>,
    pub limit: BenchLimit,
    /// Inferences run first and not measured.
    pub warmup: u64,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Concurrent activations (qaic's `num_activations`): this many threads run inferences on
    /// the one Session at once, each with its own run state; the limit counts all of them, and
    /// inferences/s is the combined throughput.
    pub activations: usize,
}

impl Default for BenchOptions {
    /// Random inputs, 40 inferences (qaic's default), one warm-up run, seed 0, one activation.
    fn default() -> BenchOptions {
        BenchOptions {
            inputs: Vec::new(),
            limit: BenchLimit::Iterations(40),
            warmup: 1,
            seed: 0,
            activations: 1,
        }
    }
}

/// Where a benchmark is, for progress display.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchProgress {
    /// True while running the warm-up inferences.
    pub warmup: bool,
    /// Inferences completed in the current phase.
    pub done: u64,
    /// Time since the current phase started.
    pub elapsed: Duration,
}

/// What `Session::run_benchmark` measured. Serialises to the JSON of `kiln bench --json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BenchReport {
    /// Inferences completed (warm-up excluded).
    pub inferences: u64,
    /// `inferences / total_s`.
    pub inf_per_s: f64,
    /// Wall-clock time of the measured inferences.
    pub total_s: f64,
    /// Leading dim of the first input as fed (see the module docs).
    pub batch_size: usize,
    /// Time to open the session (import and compile, or map the program file).
    pub load_s: f64,
    pub latency_ms: LatencyStats,
    /// On several threads, the cache-line round trip between two compute threads before and
    /// after the measured inferences ([`Session::thread_round_trip_ns`]): where the host put
    /// the cores while the figures above were taken. `null` on one thread.
    pub thread_round_trip_ns: Option<RoundTrip>,
    /// For a model with symbolic input dims, its shape specialisations after the run
    /// ([`Session::shape_cache`]); `null` for a static model.
    pub shape_cache: Option<crate::ShapeCacheInfo>,
    /// True when the session's cancel flag (Ctrl-C in `kiln bench`) ended the measurement
    /// early: the figures are those of the inferences completed until then.
    pub cancelled: bool,
    /// With `gen_crc` on (one activation): the CRCs of the last measured inference's inputs
    /// and outputs; `null` otherwise.
    pub io_crc: Option<crate::IoCrc>,
    /// The kernels the run used and why (`avx512+amx (detected)`, or what `KILN_KERNELS`
    /// asked for).
    pub kernels: String,
}

/// A cache-line round trip between two compute threads, in ns, before and after a
/// measurement (`NaN` for a side that could not be measured).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RoundTrip {
    pub before: f64,
    pub after: f64,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.latency_ms;
        writeln!(
            f,
            "inferences     {} (batch size {}){}",
            self.inferences,
            self.batch_size,
            if self.cancelled {
                "; cancelled: the figures are those of the inferences completed"
            } else {
                ""
            }
        )?;
        writeln!(f, "total time     {:.4} s", self.total_s)?;
        writeln!(f, "kernels        {}", self.kernels)?;
        writeln!(
            f,
            "inferences/s   {:.2} ({:.2} samples/s)",
            self.inf_per_s,
            self.inf_per_s * self.batch_size as f64
        )?;
        writeln!(f, "load time      {:.2} ms", self.load_s * 1e3)?;
        writeln!(f, "latency (ms)   min {:.4}  avg {:.4}  max {:.4}", l.min, l.avg, l.max)?;
        writeln!(
            f,
            "               p25 {:.4}  p50 {:.4}  p75 {:.4}  p90 {:.4}  p99 {:.4}  p99.9 {:.4}",
            l.p25, l.p50, l.p75, l.p90, l.p99, l.p999
        )?;
        writeln!(
            f,
            "               (percentiles: linear interpolation between closest ranks, numpy's default)"
        )?;
        if let Some(rt) = self.thread_round_trip_ns {
            let ns = |v: f64| {
                if v.is_nan() {
                    "n/a".to_string()
                } else {
                    format!("{v:.0} ns")
                }
            };
            writeln!(
                f,
                "thread trip    {} before, {} after (a cache line between two compute threads; \
                 ~70-140 ns on cores that share a cache, ~300+ when the host placed them far apart)",
                ns(rt.before),
                ns(rt.after)
            )?;
        }
        if let Some(c) = &self.shape_cache {
            let sets = |b: &[crate::Bindings]| {
                b.iter()
                    .map(|b| crate::format_bindings(b))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let mut parts = Vec::new();
            if !c.stored.is_empty() {
                parts.push(format!(
                    "{} compiled ahead of time ({})",
                    c.stored.len(),
                    sets(&c.stored)
                ));
            }
            if !c.cached.is_empty() {
                parts.push(format!(
                    "{} compiled on first run ({})",
                    c.cached.len(),
                    sets(&c.cached)
                ));
            }
            for (b, reason) in &c.failed {
                parts.push(format!(
                    "{} runs shape-generic: {reason}",
                    sets(std::slice::from_ref(b))
                ));
            }
            if parts.is_empty() {
                parts.push("none: the runs used the shape-generic program".into());
            }
            writeln!(f, "shapes         {}", parts.join("; "))?;
        }
        Ok(())
    }
}

impl Session {
    /// The given inputs, plus a random value for every model input not among them (see the
    /// module docs for the distributions). The same seed gives the same values.
    pub fn with_random_inputs(&self, given: Vec<(String, Value)>, seed: u64) -> Result<Vec<(String, Value)>, Error> {
        let mut rng = SplitMix64(seed);
        let mut feed = given;
        for spec in &self.program.inputs {
            if feed.iter().any(|(n, _)| *n == spec.name) {
                continue;
            }
            let v = random_value(&spec.name, &spec.ty, &mut rng)?;
            feed.push((spec.name.clone(), v));
        }
        Ok(feed)
    }

    /// qaic's `run_benchmark`: warm-up, then timed inferences on the given (or random) inputs.
    pub fn run_benchmark(&self, options: &BenchOptions) -> Result<BenchReport, Error> {
        self.run_benchmark_with(options, &mut |_| {})
    }

    /// [`Session::run_benchmark`], calling `progress` after every inference.
    pub fn run_benchmark_with(
        &self,
        options: &BenchOptions,
        progress: &mut dyn FnMut(BenchProgress),
    ) -> Result<BenchReport, Error> {
        let feed = self.with_random_inputs(options.inputs.clone(), options.seed)?;
        let batch_size = self.batch_size(&feed);
        let warm_start = Instant::now();
        for done in 1..=options.warmup {
            self.run(feed.clone())?;
            if self.cancelled() {
                return Err(Error::Run(RuntimeError::Program(
                    "the benchmark was cancelled during its warm-up".into(),
                )));
            }
            progress(BenchProgress {
                warmup: true,
                done,
                elapsed: warm_start.elapsed(),
            });
        }
        let before = self.thread_round_trip_ns();
        if options.activations > 1 {
            return self.run_concurrent(options, &feed, batch_size, before, progress);
        }
        let mut latencies: Vec<Duration> = Vec::new();
        let mut last_crc = None;
        let started = Instant::now();
        loop {
            let enough = match options.limit {
                BenchLimit::Iterations(n) => latencies.len() as u64 >= n.max(1),
                BenchLimit::Time(t) => !latencies.is_empty() && started.elapsed() >= t,
            };
            if enough || self.cancelled() {
                break;
            }
            let inputs = feed.clone();
            let t0 = Instant::now();
            let r = match self.io_crc() {
                None => self.run(inputs).map(|_| ()),
                Some(_) => self
                    .run_with_crc(inputs, &crate::RunOptions::default())
                    .map(|(_, crc)| last_crc = Some(crc)),
            };
            match r {
                Ok(()) => {}
                // Cancelled while running: that inference does not count.
                Err(Error::Run(RuntimeError::Cancelled { .. })) if self.cancelled() => break,
                Err(e) => return Err(e),
            }
            latencies.push(t0.elapsed());
            progress(BenchProgress {
                warmup: false,
                done: latencies.len() as u64,
                elapsed: started.elapsed(),
            });
        }
        let mut report = self.bench_report(&latencies, started.elapsed(), batch_size, before)?;
        report.io_crc = last_crc;
        Ok(report)
    }

    /// The report of a measured phase: its latencies, wall time and batch size, with the
    /// threads' round trip measured before it and now, after it.
    fn bench_report(
        &self,
        latencies: &[Duration],
        total: Duration,
        batch_size: usize,
        before: Option<f64>,
    ) -> Result<BenchReport, Error> {
        let after = self.thread_round_trip_ns();
        let thread_round_trip_ns = (before.is_some() || after.is_some()).then(|| RoundTrip {
            before: before.unwrap_or(f64::NAN),
            after: after.unwrap_or(f64::NAN),
        });
        let total_s = total.as_secs_f64();
        let inferences = latencies.len() as u64;
        let cancelled = self.cancelled();
        let latency_ms = LatencyStats::from_durations(latencies).ok_or_else(|| {
            Error::Run(RuntimeError::Program(if cancelled {
                "the benchmark was cancelled before an inference completed".into()
            } else {
                "the benchmark completed no inference".into()
            }))
        })?;
        Ok(BenchReport {
            inferences,
            inf_per_s: if total_s > 0.0 {
                inferences as f64 / total_s
            } else {
                0.0
            },
            total_s,
            batch_size,
            load_s: self.monitor.load().as_secs_f64(),
            latency_ms,
            thread_round_trip_ns,
            shape_cache: self.shape_cache(),
            cancelled,
            io_crc: None,
            kernels: kiln_runtime::kernels(),
        })
    }

    /// The measured phase with `options.activations` threads sharing the Session: each thread
    /// claims inferences from a shared counter (or runs until the time is up) and records its
    /// own latencies; the caller's thread reports progress every 50 ms.
    fn run_concurrent(
        &self,
        options: &BenchOptions,
        feed: &[(String, Value)],
        batch_size: usize,
        before: Option<f64>,
        progress: &mut dyn FnMut(BenchProgress),
    ) -> Result<BenchReport, Error> {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let claimed = AtomicU64::new(0);
        let done = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let worker = || -> Result<Vec<Duration>, Error> {
            let mut mine = Vec::new();
            loop {
                let go = match options.limit {
                    BenchLimit::Iterations(n) => claimed.fetch_add(1, Ordering::Relaxed) < n.max(1),
                    BenchLimit::Time(t) => started.elapsed() < t || done.load(Ordering::Relaxed) == 0,
                };
                if !go || stop.load(Ordering::Relaxed) || self.cancelled() {
                    return Ok(mine);
                }
                let t0 = Instant::now();
                match self.run(feed.to_vec()) {
                    Ok(_) => {}
                    Err(Error::Run(RuntimeError::Cancelled { .. })) if self.cancelled() => return Ok(mine),
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                mine.push(t0.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            }
        };
        let results: Vec<Result<Vec<Duration>, Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..options.activations).map(|_| scope.spawn(worker)).collect();
            while !handles.iter().all(|h| h.is_finished()) {
                std::thread::sleep(Duration::from_millis(50));
                progress(BenchProgress {
                    warmup: false,
                    done: done.load(Ordering::Relaxed),
                    elapsed: started.elapsed(),
                });
            }
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Run(RuntimeError::Program("a benchmark thread failed".into()))))
                })
                .collect()
        });
        let total = started.elapsed();
        let mut latencies = Vec::new();
        for r in results {
            latencies.extend(r?);
        }
        self.bench_report(&latencies, total, batch_size, before)
    }

    /// Runs the model `runs` times (at least once) timing every step; inputs as in
    /// [`Session::with_random_inputs`] (pass them complete, or let missing ones be random
    /// with seed 0).
    pub fn profile(&self, inputs: Vec<(String, Value)>, runs: usize) -> Result<ProfileReport, Error> {
        self.profile_with(inputs, runs, &mut |_| {})
    }

    /// [`Session::profile`], calling `progress` after every run.
    pub fn profile_with(
        &self,
        inputs: Vec<(String, Value)>,
        runs: usize,
        progress: &mut dyn FnMut(BenchProgress),
    ) -> Result<ProfileReport, Error> {
        let feed = self.with_random_inputs(inputs, 0)?;
        let mut profile = Profile::new();
        let started = Instant::now();
        for done in 1..=runs.max(1) {
            self.run_program(feed.clone(), None, |program, feed, limits| {
                kiln_runtime::run_limited(program, feed, Some(&mut profile), limits)
            })?;
            progress(BenchProgress {
                warmup: false,
                done: done as u64,
                elapsed: started.elapsed(),
            });
        }
        Ok(ProfileReport::new(profile, self.monitor.load()))
    }

    fn batch_size(&self, feed: &[(String, Value)]) -> usize {
        let Some(first) = self.program.inputs.first() else {
            return 1;
        };
        match feed.iter().find(|(n, _)| *n == first.name).map(|(_, v)| v) {
            Some(Value::Tensor(t)) => t.shape().first().copied().unwrap_or(1),
            _ => 1,
        }
    }
}

/// A small, fast, seedable generator (SplitMix64); statistical quality is ample for inputs.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn input_err(name: &str, reason: String) -> Error {
    Error::Run(RuntimeError::Input {
        name: name.to_string(),
        reason,
    })
}

fn random_value(name: &str, ty: &ValueType, rng: &mut SplitMix64) -> Result<Value, Error> {
    match ty {
        ValueType::Tensor(tt) => Ok(Value::Tensor(random_tensor(name, tt, rng)?)),
        ValueType::Optional(inner) => random_value(name, inner, rng),
        other => Err(input_err(
            name,
            format!("cannot make a random {other} value; give this input explicitly"),
        )),
    }
}

fn random_tensor(name: &str, tt: &TensorType, rng: &mut SplitMix64) -> Result<Tensor, Error> {
    let dtype = tt.dtype.ok_or_else(|| {
        input_err(
            name,
            "its element type is unknown, so it cannot be random; give it explicitly".into(),
        )
    })?;
    let Some(dims) = &tt.shape else {
        return Err(input_err(
            name,
            "its rank is unknown, so it cannot be random; give it explicitly".into(),
        ));
    };
    let mut shape = Vec::with_capacity(dims.len());
    for (i, d) in dims.iter().enumerate() {
        match d {
            Dim::Fixed(n) => shape.push(*n),
            Dim::Sym(s) if s.starts_with("unk__") => {
                return Err(input_err(
                    name,
                    format!("dim {i} has no size in the model ({tt}); give this input explicitly"),
                ));
            }
            Dim::Sym(s) => {
                return Err(input_err(
                    name,
                    format!(
                        "dim {i} is the symbol '{s}' ({tt}); bind it with --define-symbol {s}=N (SessionOptions::symbols) or give this input"
                    ),
                ));
            }
        }
    }
    if dtype == DType::String {
        return Err(input_err(
            name,
            "string tensors cannot be random; give this input explicitly".into(),
        ));
    }
    let n = kiln_tensor::numel(&shape).ok_or_else(|| {
        input_err(
            name,
            format!("shape {shape:?} has more than {} elements", kiln_tensor::MAX_ELEMENTS),
        )
    })?;
    let values: Vec<f64> = if dtype.is_float() {
        (0..n).map(|_| rng.unit() * 2.0 - 1.0).collect()
    } else {
        (0..n).map(|_| (rng.next_u64() >> 63) as f64).collect()
    };
    Tensor::from_f64(dtype, shape, &values).map_err(|e| input_err(name, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_report_serialises_to_the_documented_keys() {
        let l = LatencyStats::from_ms(vec![1.0]).unwrap_or_else(|| unreachable!());
        let r = BenchReport {
            inferences: 1,
            inf_per_s: 1000.0,
            total_s: 0.001,
            batch_size: 1,
            load_s: 0.0,
            latency_ms: l,
            thread_round_trip_ns: Some(RoundTrip {
                before: 70.0,
                after: 330.0,
            }),
            shape_cache: None,
            cancelled: false,
            io_crc: None,
            kernels: "avx512 (detected)".into(),
        };
        let v = serde_json::to_value(&r).unwrap_or_default();
        let mut keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "batch_size",
                "cancelled",
                "inf_per_s",
                "inferences",
                "io_crc",
                "kernels",
                "latency_ms",
                "load_s",
                "shape_cache",
                "thread_round_trip_ns",
                "total_s"
            ]
        );
        assert_eq!(v["thread_round_trip_ns"]["before"], 70.0);
        assert_eq!(v["thread_round_trip_ns"]["after"], 330.0);
        let lat: Vec<&str> = v["latency_ms"]
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(lat.len(), 9);
        for k in ["min", "max", "avg", "p25", "p50", "p75", "p90", "p99", "p999"] {
            assert!(lat.contains(&k), "{k}");
        }
    }

    #[test]
    fn random_tensors_follow_the_type_and_the_seed() {
        let tt = TensorType::fixed(DType::F32, &[2, 3]);
        let a = random_tensor("x", &tt, &mut SplitMix64(7)).unwrap_or_else(|e| unreachable!("{e}"));
        let b = random_tensor("x", &tt, &mut SplitMix64(7)).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(a, b);
        assert_eq!(a.shape(), &[2, 3]);
        assert!(a.to_f64_vec().iter().all(|&v| (-1.0..1.0).contains(&v)));
        let ids = random_tensor("ids", &TensorType::fixed(DType::I64, &[64]), &mut SplitMix64(1))
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert!(ids.to_f64_vec().iter().all(|&v| v == 0.0 || v == 1.0));
        let sym = TensorType::new(DType::F32, vec![Dim::Sym("batch".into()), Dim::Fixed(3)]);
        let e = random_tensor("x", &sym, &mut SplitMix64(0))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("'x'") && e.contains("dim 0") && e.contains("batch"), "{e}");
    }
}

#[cfg(test)]
mod session_tests {
    use super::*;
    use crate::session::SessionOptions;
    use std::path::PathBuf;

    fn tiny_cnn() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/tiny_cnn.onnx")
    }

    fn open(options: &SessionOptions) -> Session {
        Session::new(tiny_cnn(), options).unwrap_or_else(|e| unreachable!("{e}"))
    }

    #[test]
    fn metrics_count_every_run_when_enabled() {
        let plain = open(&SessionOptions::default());
        let feed = plain
            .with_random_inputs(Vec::new(), 3)
            .unwrap_or_else(|e| unreachable!("{e}"));
        plain.run(feed.clone()).unwrap_or_else(|e| unreachable!("{e}"));
        assert!(plain.get_metrics().is_none());
        assert!(plain.get_profile().is_none());

        let s = open(&SessionOptions {
            enable_metrics: true,
            ..SessionOptions::default()
        });
        assert!(s.get_metrics().is_none(), "no run yet");
        for _ in 0..3 {
            s.run(feed.clone()).unwrap_or_else(|e| unreachable!("{e}"));
        }
        let m = s.get_metrics().unwrap_or_else(|| unreachable!());
        assert_eq!(m.inferences, 3);
        let l = m.latency_ms;
        assert!(l.min <= l.p50 && l.p50 <= l.max && l.min <= l.avg && l.avg <= l.max);
        assert!((m.total_s - l.avg * 3.0 / 1e3).abs() < 1e-9);
        assert!(
            m.to_string()
                .starts_with("Number of inferences utilized for calculation are 3\n")
        );
        assert!(s.get_profile().is_none(), "metrics alone do not profile");
        s.reset_metrics();
        assert!(s.get_metrics().is_none());
    }

    #[test]
    fn profiling_records_every_step_of_every_run() {
        let s = open(&SessionOptions {
            enable_profiling: true,
            ..SessionOptions::default()
        });
        let feed = s
            .with_random_inputs(Vec::new(), 0)
            .unwrap_or_else(|e| unreachable!("{e}"));
        s.run(feed.clone()).unwrap_or_else(|e| unreachable!("{e}"));
        s.run(feed.clone()).unwrap_or_else(|e| unreachable!("{e}"));
        let p = s.get_profile().unwrap_or_else(|| unreachable!());
        assert_eq!(p.runs(), 2);
        assert_eq!(s.get_metrics().map(|m| m.inferences), Some(2));
        let steps = s.program.steps.len();
        assert_eq!(p.steps.len(), steps);
        assert!(p.steps.iter().all(|x| x.calls == 2));
        assert!(p.steps.windows(2).all(|w| w[0].total >= w[1].total), "sorted by time");
        assert!(p.steps.iter().any(|x| x.op == "Conv" && x.gflops().is_some()));
        let trace = p.chrome_trace();
        let events = trace.as_array().cloned().unwrap_or_default();
        let nodes = events.iter().filter(|e| e["cat"] == "Node").count();
        let runs = events.iter().filter(|e| e["name"] == "model_run").count();
        assert_eq!((nodes, runs), (2 * steps, 2));
        assert!(events.iter().all(|e| e["ph"] == "X"));
        let table = p.table(Some(3));
        assert!(
            table.contains("GFLOP/s") && table.contains(&format!("{} more steps", steps - 3)),
            "{table}"
        );
        // Every step of this f32 CNN computes in f32, and the precision summary says so.
        assert!(p.steps.iter().all(|s| crate::profile::precision(s) == "f32"), "{table}");
        assert!(table.contains("\nprecision ") && table.contains("\nf32  "), "{table}");
    }

    #[test]
    fn benchmark_runs_the_requested_inferences() {
        let s = open(&SessionOptions::default());
        let r = s
            .run_benchmark(&BenchOptions {
                limit: BenchLimit::Iterations(7),
                warmup: 2,
                ..BenchOptions::default()
            })
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(r.inferences, 7);
        assert_eq!(r.batch_size, 1);
        let l = r.latency_ms;
        assert!(l.min <= l.p25 && l.p25 <= l.p50 && l.p50 <= l.p75 && l.p75 <= l.p90);
        assert!(l.p90 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max);
        assert!(r.total_s > 0.0 && r.inf_per_s > 0.0 && r.load_s > 0.0);
        let mut seen = Vec::new();
        let r = s
            .run_benchmark_with(
                &BenchOptions {
                    limit: BenchLimit::Time(Duration::ZERO),
                    warmup: 1,
                    ..BenchOptions::default()
                },
                &mut |p| seen.push((p.warmup, p.done)),
            )
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(r.inferences, 1, "a time limit still runs one inference");
        assert_eq!(seen, [(true, 1), (false, 1)]);
    }

    #[test]
    fn unknown_given_inputs_fail_by_name() {
        let s = open(&SessionOptions::default());
        let t = Tensor::zeros(DType::F32, vec![1]).unwrap_or_else(|e| unreachable!("{e}"));
        let e = s
            .run_benchmark(&BenchOptions {
                inputs: vec![("nope".into(), Value::Tensor(t))],
                ..BenchOptions::default()
            })
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("nope"), "{e}");
    }
}
