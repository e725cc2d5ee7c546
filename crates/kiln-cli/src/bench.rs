//! `kiln bench`: qaic's `run_benchmark` from the command line: warm-up, then timed inferences
//! on given or random inputs; throughput, load time and latency percentiles as text or JSON.

use crate::{emit, read_feed};
use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln::{BenchLimit, BenchOptions, BenchProgress, Session, Value};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The model (.onnx or .kiln).
    pub model: PathBuf,
    /// Number of measured inferences [default: 100].
    #[arg(short = 'n', long = "iterations", value_name = "N", conflicts_with = "time",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// Measure for this many seconds instead of a number of inferences.
    #[arg(long, value_name = "SECONDS")]
    pub time: Option<f64>,
    /// Inferences run first and not measured.
    #[arg(long, value_name = "W", default_value_t = 2)]
    pub warmup: u64,
    /// Concurrent activations (qaic's num_activations): threads running inferences on the one
    /// session at once; inferences/s is their combined throughput [default: 1].
    #[arg(long, visible_alias = "num-activations", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub activations: Option<u32>,
    /// Print one JSON object: inferences, inf_per_s, total_s, batch_size, load_s,
    /// latency_ms {min, max, avg, p25, p50, p75, p90, p99, p999}, thread_round_trip_ns
    /// {before, after} (null on one thread), shape_cache {stored, cached, failed, compiled,
    /// limit, can_compile} (null for a model without symbolic input dims), cancelled, io_crc
    /// and kernels (the instruction set used and why, e.g. "avx512+amx (detected)").
    #[arg(long)]
    pub json: bool,
    /// No progress bar (there is none either when stderr is not a terminal).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    #[command(flatten)]
    pub feed: FeedArgs,
}

/// Inputs shared by `kiln bench` and `kiln profile`: given ones, the rest random.
#[derive(clap::Args)]
pub struct FeedArgs {
    /// An input as NAME=PATH.npy (repeatable); inputs not given are random.
    #[arg(long = "input", short = 'i', value_name = "NAME=PATH")]
    pub inputs: Vec<String>,
    /// Inputs from an .npz archive (array names are input names).
    #[arg(long = "inputs", value_name = "PATH.npz")]
    pub npz: Option<PathBuf>,
    /// How an .onnx model is compiled first (--define-symbol is needed for random inputs with
    /// symbolic dims), and the configuration (--config, -O).
    #[command(flatten)]
    pub flags: crate::compile::CompileFlags,
    /// Seed of the random inputs (floats uniform in [-1, 1), integers 0 or 1, bools random).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl FeedArgs {
    /// Opens the model and builds the complete input feed.
    pub fn open(&self, model: &std::path::Path) -> Result<(Session, Vec<(String, Value)>, usize)> {
        crate::compile::check_flags_for(model, &self.flags)?;
        let options = self.flags.session_options()?;
        let session = crate::loading(Session::new(model, &options), model)?;
        let given = read_feed(self.npz.as_deref(), &self.inputs)?;
        let n_given = given.len();
        let feed = session.with_random_inputs(given, self.seed)?;
        Ok((session, feed, n_given))
    }

    /// One line per input: name, dtype and shape, and where it came from.
    pub fn describe(&self, feed: &[(String, Value)], n_given: usize) -> String {
        let mut out = String::new();
        for (i, (name, v)) in feed.iter().enumerate() {
            let what = match v {
                Value::Tensor(t) => format!("{}{:?}", t.dtype(), t.shape()),
                other => other.kind().to_string(),
            };
            let source = if i < n_given {
                "given".to_string()
            } else {
                format!("random, seed {}", self.seed)
            };
            out.push_str(&format!("input          {name} {what} ({source})\n"));
        }
        out
    }
}

/// Progress bars on stderr for phases that last: nothing is drawn before a phase has run for
/// half a second, nor at all when stderr is not a terminal or with `--quiet`.
pub struct Progress {
    enabled: bool,
    /// Length of the measured phase: inferences, or milliseconds with `--time`.
    measure: (u64, bool),
    warmup_len: u64,
    bar: Option<(bool, ProgressBar)>,
}

impl Progress {
    pub fn new(quiet: bool, warmup_len: u64, measure_len: u64, by_time: bool) -> Progress {
        Progress {
            enabled: !quiet && std::io::stderr().is_terminal(),
            measure: (measure_len, by_time),
            warmup_len,
            bar: None,
        }
    }

    pub fn update(&mut self, p: BenchProgress) {
        if !self.enabled || p.elapsed < Duration::from_millis(500) {
            return;
        }
        let (len, by_time) = if p.warmup {
            (self.warmup_len, false)
        } else {
            self.measure
        };
        let secs = p.elapsed.as_secs_f64();
        let rate = p.done as f64 / secs.max(1e-9);
        let (position, message) = if by_time && !p.warmup {
            (
                u64::try_from(p.elapsed.as_millis()).unwrap_or(u64::MAX).min(len),
                format!("{secs:.1}/{:.1} s, {} inf, {rate:.1} inf/s", len as f64 / 1e3, p.done),
            )
        } else {
            let eta = len.saturating_sub(p.done) as f64 / rate.max(1e-9);
            (p.done, format!("{}/{len}, {rate:.1} inf/s, eta {eta:.0} s", p.done))
        };
        match &self.bar {
            Some((w, b)) if *w == p.warmup => {
                b.set_message(message);
                b.set_position(position);
            }
            _ => {
                if let Some((_, old)) = self.bar.take() {
                    old.finish_and_clear();
                }
                let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
                b.set_style(
                    ProgressStyle::with_template("{prefix:>8} [{bar:30}] {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                );
                b.set_prefix(if p.warmup { "warm-up" } else { "measure" });
                b.set_message(message);
                b.set_position(position);
                b.set_draw_target(ProgressDrawTarget::stderr());
                self.bar = Some((p.warmup, b));
            }
        }
    }

    pub fn finish(&mut self) {
        if let Some((_, b)) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

pub fn bench(a: BenchArgs) -> Result<()> {
    // -n / --time win; else the configuration's inf_time / num_inferences (qaic's run_benchmark
    // arguments) when set; else 100 inferences.
    let config = kiln_config::Config::resolve(&a.feed.flags.config.files, &a.feed.flags.config.overrides)?;
    let configured = |key: &str| config.sources.contains_key(key);
    let time = a.time.or(config.runtime.inf_time.filter(|_| a.iterations.is_none()));
    let iterations = a
        .iterations
        .or_else(|| configured("num_inferences").then_some(config.runtime.num_inferences));
    let limit = match time {
        Some(t) if t.is_finite() && t > 0.0 => BenchLimit::Time(Duration::from_secs_f64(t)),
        Some(t) => anyhow::bail!("--time {t}: expected a positive number of seconds"),
        None => BenchLimit::Iterations(iterations.unwrap_or(100)),
    };
    let (session, feed, n_given) = a.feed.open(&a.model)?;
    let (measure_len, by_time) = match limit {
        BenchLimit::Iterations(n) => (n, false),
        BenchLimit::Time(t) => (u64::try_from(t.as_millis()).unwrap_or(u64::MAX), true),
    };
    let mut progress = Progress::new(a.quiet, a.warmup, measure_len, by_time);
    let activations = a
        .activations
        .map_or_else(|| config.runtime.num_activations as usize, |n| n as usize)
        .max(1);
    let options = BenchOptions {
        inputs: feed.clone(),
        limit,
        warmup: a.warmup,
        seed: a.feed.seed,
        activations,
    };
    let report = session.run_benchmark_with(&options, &mut |p| progress.update(p));
    progress.finish();
    let report = report?;
    // enable_profiling (from --config or -O): the per-step table of the benchmark's runs.
    if let Some(p) = session.get_profile() {
        eprint!("{}", p.table(Some(25)));
    }
    if a.json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&report)?));
    }
    let mut out = format!("model          {}\n", a.model.display());
    out.push_str(&a.feed.describe(&feed, n_given));
    out.push_str(&format!("warm-up        {} inferences (not measured)\n", a.warmup));
    if activations > 1 {
        out.push_str(&format!(
            "activations    {activations} (concurrent runs on one session)\n"
        ));
    }
    out.push_str(&report.to_string());
    if let Some(m) = session.memory_placement() {
        out.push_str(&format!("memory plan    {m}\n"));
    }
    emit(&out)
}
