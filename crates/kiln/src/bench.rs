//! Benchmarking, run metrics and per-node profiling of a [`Session`] (qaic's `run_benchmark`,
//! `get_metrics`/`print_metrics`, `enable_metrics` and `enable_profiling`), and the Chrome
//! trace export in ONNX Runtime's profiler layout.
//!
//! Definitions used throughout:
//! - **latency**: wall-clock time of one `Session::run` call, inputs already built;
//! - **percentiles**: linear interpolation between the two closest ranks of the sorted
//!   latencies (numpy's default `percentile` method): for `n` samples and quantile `q`, the
//!   rank is `h = (n - 1) q` and the value `x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h])`;
//! - **batch size**: the leading dimension of the model's first input as fed (1 for a scalar
//!   or a non-tensor input);
//! - **random inputs**: generated from each input's static type with a fixed seed: floats
//!   uniform in [-1, 1), integers 0 or 1 (valid as token ids, masks and segment ids), bools
//!   random. Symbolic dims must be bound (`SessionOptions::symbols`).

use crate::session::{Error, Session, SessionOptions};
use kiln_ops::{Dim, TensorType, Value, ValueType};
use kiln_runtime::{Profile, RuntimeError, StepSummary, ValueShape};
use kiln_tensor::{DType, Tensor};
use std::fmt;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
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

/// Latency statistics in milliseconds (percentiles by linear interpolation, see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencyStats {
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
}

impl LatencyStats {
    /// Statistics of the given latencies; `None` when there are none.
    pub fn from_durations(samples: &[Duration]) -> Option<LatencyStats> {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        LatencyStats::from_ms(ms)
    }

    fn from_ms(mut ms: Vec<f64>) -> Option<LatencyStats> {
        ms.sort_by(f64::total_cmp);
        let min = *ms.first()?;
        let max = *ms.last()?;
        let avg = ms.iter().sum::<f64>() / ms.len() as f64;
        let p = |q: f64| percentile(&ms, q).unwrap_or(f64::NAN);
        Some(LatencyStats {
            min,
            max,
            avg,
            p25: p(0.25),
            p50: p(0.50),
            p75: p(0.75),
            p90: p(0.90),
            p99: p(0.99),
            p999: p(0.999),
        })
    }
}

/// The `q`-quantile (0..=1) of sorted samples by linear interpolation between the closest
/// ranks (numpy's default); `None` when there are no samples.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let h = last as f64 * q.clamp(0.0, 1.0);
    let lo = (h.floor() as usize).min(last);
    let hi = (lo + 1).min(last);
    let (a, b) = (*sorted.get(lo)?, *sorted.get(hi)?);
    Some(a + (h - lo as f64) * (b - a))
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
        writeln!(f, "inferences     {} (batch size {})", self.inferences, self.batch_size)?;
        writeln!(f, "total time     {:.4} s", self.total_s)?;
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
        Ok(())
    }
}

/// Latencies of the session's runs so far (`SessionOptions::enable_metrics`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Metrics {
    pub inferences: u64,
    /// Sum of the individual latencies, in seconds.
    pub total_s: f64,
    pub latency_ms: LatencyStats,
}

impl fmt::Display for Metrics {
    /// qaic's `print_metrics` wording, times in seconds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |ms: f64| ms / 1e3;
        let l = &self.latency_ms;
        writeln!(
            f,
            "Number of inferences utilized for calculation are {}",
            self.inferences
        )?;
        writeln!(f, "Minimum latency observed {} s", s(l.min))?;
        writeln!(f, "Maximum latency observed {} s", s(l.max))?;
        writeln!(f, "Average latency / inference time observed is {} s", s(l.avg))?;
        for (name, pct, v) in [
            ("P25", "25", l.p25),
            ("P50", "50", l.p50),
            ("P75", "75", l.p75),
            ("P90", "90", l.p90),
            ("P99", "99", l.p99),
            ("P999", "99.9", l.p999),
        ] {
            writeln!(f, "{name} / {pct}% of inferences observed latency less than {} s", s(v))?;
        }
        writeln!(f, "Sum of all the inference times {} s", self.total_s)
    }
}

/// Most step records a session keeps with `enable_profiling` (ONNX Runtime's default cap on
/// profiler events); later runs still count in the metrics but their steps are not kept.
pub const MAX_PROFILE_RECORDS: usize = 1_000_000;

/// The per-session recording state behind `enable_metrics` / `enable_profiling`.
#[derive(Debug, Default)]
pub(crate) struct Monitor {
    /// Latency of every successful run, in nanoseconds.
    latencies: Option<Mutex<Vec<u64>>>,
    profile: Option<Mutex<Profile>>,
    /// Time to open the session.
    load: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Monitor {
    fn new(options: &SessionOptions, load: Duration) -> Monitor {
        let metrics = options.enable_metrics || options.enable_profiling;
        Monitor {
            latencies: metrics.then(|| Mutex::new(Vec::new())),
            profile: options.enable_profiling.then(|| Mutex::new(Profile::new())),
            load,
        }
    }

    /// Runs the program, recording what the options ask for.
    pub(crate) fn run(
        &self,
        program: &kiln_runtime::Program,
        inputs: Vec<(String, Value)>,
    ) -> Result<Vec<(String, Value)>, Error> {
        let Some(latencies) = &self.latencies else {
            return Ok(kiln_runtime::run(program, inputs)?);
        };
        let started = Instant::now();
        let outputs = match &self.profile {
            None => kiln_runtime::run(program, inputs)?,
            Some(shared) => {
                let mut local = Profile::with_origin(lock(shared).origin);
                let outputs = kiln_runtime::run_with(program, inputs, Some(&mut local))?;
                let mut profile = lock(shared);
                if profile.num_records() + local.num_records() <= MAX_PROFILE_RECORDS {
                    profile.runs.append(&mut local.runs);
                }
                outputs
            }
        };
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        lock(latencies).push(nanos);
        Ok(outputs)
    }
}

impl Session {
    /// Finishes a constructor: sets up metrics/profiling from the options and records the
    /// load time (from `started`).
    /// Also starts the compute threads the options ask for.
    pub(crate) fn observed(mut self, options: &SessionOptions, started: Instant) -> Result<Session, Error> {
        if options.threads > 1 {
            let pool = kiln_runtime::ThreadPool::new(options.threads).map_err(|cause| Error::Threads {
                threads: options.threads,
                cause,
            })?;
            self.pool = Some(pool);
        }
        self.monitor = Monitor::new(options, started.elapsed());
        Ok(self)
    }

    /// How long opening the session took (import and compile, or mapping a program file).
    pub fn load_time(&self) -> Duration {
        self.monitor.load
    }

    /// Latency statistics of every successful `run` so far; `None` unless
    /// `enable_metrics` (or `enable_profiling`) was set, or before the first run.
    pub fn get_metrics(&self) -> Option<Metrics> {
        let nanos = lock(self.monitor.latencies.as_ref()?).clone();
        let total_s = nanos.iter().map(|&n| n as f64 / 1e9).sum();
        let latency_ms = LatencyStats::from_ms(nanos.iter().map(|&n| n as f64 / 1e6).collect())?;
        Some(Metrics {
            inferences: nanos.len() as u64,
            total_s,
            latency_ms,
        })
    }

    /// Prints [`Session::get_metrics`] to stdout in qaic's wording.
    pub fn print_metrics(&self) {
        match self.get_metrics() {
            Some(m) => print!("{m}"),
            None if self.monitor.latencies.is_none() => {
                println!("no metrics: the session was opened without enable_metrics or enable_profiling")
            }
            None => println!("no metrics: no inference has run yet"),
        }
    }

    /// Forgets the recorded latencies and step timings.
    pub fn reset_metrics(&self) {
        if let Some(l) = &self.monitor.latencies {
            lock(l).clear();
        }
        if let Some(p) = &self.monitor.profile {
            lock(p).runs.clear();
        }
    }

    /// Per-step timings of the runs so far; `None` unless `enable_profiling` was set.
    pub fn get_profile(&self) -> Option<ProfileReport> {
        let profile = lock(self.monitor.profile.as_ref()?).clone();
        Some(ProfileReport::new(profile, self.monitor.load))
    }

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
        let started = Instant::now();
        loop {
            let enough = match options.limit {
                BenchLimit::Iterations(n) => latencies.len() as u64 >= n.max(1),
                BenchLimit::Time(t) => !latencies.is_empty() && started.elapsed() >= t,
            };
            if enough {
                break;
            }
            let inputs = feed.clone();
            let t0 = Instant::now();
            self.run(inputs)?;
            latencies.push(t0.elapsed());
            progress(BenchProgress {
                warmup: false,
                done: latencies.len() as u64,
                elapsed: started.elapsed(),
            });
        }
        self.bench_report(&latencies, started.elapsed(), batch_size, before)
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
        let latency_ms = LatencyStats::from_durations(latencies)
            .ok_or_else(|| Error::Run(RuntimeError::Program("the benchmark completed no inference".into())))?;
        Ok(BenchReport {
            inferences,
            inf_per_s: if total_s > 0.0 {
                inferences as f64 / total_s
            } else {
                0.0
            },
            total_s,
            batch_size,
            load_s: self.monitor.load.as_secs_f64(),
            latency_ms,
            thread_round_trip_ns,
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
                if !go || stop.load(Ordering::Relaxed) {
                    return Ok(mine);
                }
                let t0 = Instant::now();
                let r = self.run(feed.to_vec());
                if r.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                r?;
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
            self.on_pool(|| kiln_runtime::run_with(&self.program, feed.clone(), Some(&mut profile)))?;
            progress(BenchProgress {
                warmup: false,
                done: done as u64,
                elapsed: started.elapsed(),
            });
        }
        Ok(ProfileReport::new(profile, self.monitor.load))
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

/// The timings of profiled runs, with each step's summary sorted by time.
#[derive(Debug, Clone)]
pub struct ProfileReport {
    pub profile: Profile,
    /// One entry per step, longest total time first.
    pub steps: Vec<StepSummary>,
    /// Time to open the session (the trace's `session_initialization`).
    pub load: Duration,
}

impl ProfileReport {
    pub fn new(profile: Profile, load: Duration) -> ProfileReport {
        let steps = profile.summarize();
        ProfileReport { profile, steps, load }
    }

    pub fn runs(&self) -> usize {
        self.profile.runs.len()
    }

    /// Sum of all step times over all runs.
    pub fn step_total(&self) -> Duration {
        self.steps.iter().map(|s| s.total).sum()
    }

    /// The table `kiln profile` prints: the `top` slowest steps (all when `None`) with mean
    /// time per run, share of all step time, cumulative share, GFLOP/s, op, name and shapes;
    /// then the same by op type.
    pub fn table(&self, top: Option<usize>) -> String {
        let runs = self.runs().max(1) as f64;
        let total = self.step_total().as_secs_f64();
        let share = |d: Duration| {
            if total > 0.0 {
                100.0 * d.as_secs_f64() / total
            } else {
                0.0
            }
        };
        let gflops = |g: Option<f64>| g.map_or_else(|| "-".to_string(), |g| format!("{g:.2}"));
        let mut out = String::new();
        let shown = top.unwrap_or(self.steps.len()).min(self.steps.len());
        let name_width = self
            .steps
            .iter()
            .take(shown)
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(4, 64);
        let op_width = self.steps.iter().map(|s| s.op.len()).max().unwrap_or(0).max(2);
        let _ = writeln!(
            out,
            "{:>4}  {:>11}  {:>6}  {:>6}  {:>8}  {:<op_width$}  {:<name_width$}  shapes (inputs -> outputs)",
            "#", "ms/run", "share", "cum", "GFLOP/s", "op", "node"
        );
        let mut cum = 0.0;
        for (rank, s) in self.steps.iter().take(shown).enumerate() {
            let sh = share(s.total);
            cum += sh;
            let ins: Vec<String> = s.inputs.iter().map(ValueShape::to_string).collect();
            let outs: Vec<String> = s.outputs.iter().map(ValueShape::to_string).collect();
            let _ = writeln!(
                out,
                "{:>4}  {:>11.4}  {:>5.1}%  {:>5.1}%  {:>8}  {:<op_width$}  {:<name_width$}  {} -> {}",
                rank + 1,
                s.total.as_secs_f64() * 1e3 / runs,
                sh,
                cum,
                gflops(s.gflops()),
                s.op,
                s.name,
                ins.join(" "),
                outs.join(" ")
            );
        }
        if shown < self.steps.len() {
            let _ = writeln!(out, "      ... {} more steps", self.steps.len() - shown);
        }
        // By op type.
        let mut ops: Vec<(&'static str, usize, Duration, u64)> = Vec::new();
        for s in &self.steps {
            let flops_calls = s.macs.saturating_mul(s.calls as u64);
            match ops.iter_mut().find(|o| o.0 == s.op) {
                Some(o) => {
                    o.1 += 1;
                    o.2 += s.total;
                    o.3 = o.3.saturating_add(flops_calls);
                }
                None => ops.push((s.op, 1, s.total, flops_calls)),
            }
        }
        ops.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
        let _ = writeln!(
            out,
            "\n{:<op_width$}  {:>5}  {:>11}  {:>6}  {:>8}",
            "op", "nodes", "ms/run", "share", "GFLOP/s"
        );
        for (op, n, t, macs) in &ops {
            let secs = t.as_secs_f64();
            let g = (*macs > 0 && secs > 0.0).then(|| 2.0 * *macs as f64 / secs / 1e9);
            let _ = writeln!(
                out,
                "{:<op_width$}  {:>5}  {:>11.4}  {:>5.1}%  {:>8}",
                op,
                n,
                secs * 1e3 / runs,
                share(*t),
                gflops(g)
            );
        }
        let run_total: Duration = self.profile.runs.iter().map(|r| r.duration).sum();
        let _ = writeln!(
            out,
            "\n{} runs; steps {:.4} ms/run, whole run {:.4} ms/run (steps plus input checks and freeing); \
             control-flow steps include their sub-programs",
            self.runs(),
            total * 1e3 / runs,
            run_total.as_secs_f64() * 1e3 / runs
        );
        out
    }

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
    fn percentiles_interpolate_like_numpy() {
        // numpy.percentile([1, 2, 3, 4], [25, 50, 75, 90]) = [1.75, 2.5, 3.25, 3.7]
        let x = [1.0, 2.0, 3.0, 4.0];
        let p = |q| percentile(&x, q).unwrap_or(f64::NAN);
        assert!((p(0.25) - 1.75).abs() < 1e-12);
        assert!((p(0.50) - 2.5).abs() < 1e-12);
        assert!((p(0.75) - 3.25).abs() < 1e-12);
        assert!((p(0.90) - 3.7).abs() < 1e-12);
        assert_eq!(p(0.0), 1.0);
        assert_eq!(p(1.0), 4.0);
        // numpy.percentile(range(1, 11), 99.9) = 9.991 (rank 8.991 between 9 and 10)
        let y: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((percentile(&y, 0.999).unwrap_or(f64::NAN) - 9.991).abs() < 1e-9);
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
    }

    #[test]
    fn latency_stats_sort_their_samples() {
        let d: Vec<Duration> = [4u64, 1, 3, 2].iter().map(|&m| Duration::from_millis(m)).collect();
        let s = LatencyStats::from_durations(&d).unwrap_or_else(|| unreachable!());
        assert_eq!((s.min, s.max), (1.0, 4.0));
        assert!((s.avg - 2.5).abs() < 1e-12);
        assert!((s.p25 - 1.75).abs() < 1e-12);
        assert!((s.p50 - 2.5).abs() < 1e-12);
        assert!(s.p90 <= s.p99 && s.p99 <= s.p999 && s.p999 <= s.max);
        assert_eq!(LatencyStats::from_durations(&[]), None);
    }

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
                "inf_per_s",
                "inferences",
                "latency_ms",
                "load_s",
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
