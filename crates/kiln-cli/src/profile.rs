//! `kiln profile`: per-node timings over N runs as a table sorted by time, and optionally a
//! Chrome trace in ONNX Runtime's profiler layout (`--trace`, opens in Perfetto).

use crate::bench::{FeedArgs, Progress};
use crate::emit;
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// The model (.onnx or .kiln).
    pub model: PathBuf,
    /// Number of profiled runs.
    #[arg(short = 'n', long = "runs", value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub runs: u64,
    /// Runs done first and not profiled.
    #[arg(long, value_name = "W", default_value_t = 1)]
    pub warmup: u64,
    /// Show the K slowest nodes (0: all).
    #[arg(long, value_name = "K", default_value_t = 25)]
    pub top: usize,
    /// Write a Chrome trace (JSON, ONNX Runtime's profiler layout): one complete event per
    /// node run, one per model run; open it in https://ui.perfetto.dev or chrome://tracing.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// No progress bar (there is none either when stderr is not a terminal).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    #[command(flatten)]
    pub feed: FeedArgs,
}

pub fn profile(a: ProfileArgs) -> Result<()> {
    let (session, feed, n_given) = a.feed.open(&a.model)?;
    let mut progress = Progress::new(a.quiet, a.warmup, a.runs, false);
    let runs = usize::try_from(a.runs).unwrap_or(usize::MAX);
    let result = (|| -> Result<kiln::ProfileReport, kiln::Error> {
        let warm_start = std::time::Instant::now();
        for done in 1..=a.warmup {
            session.run(feed.clone())?;
            progress.update(kiln::BenchProgress {
                warmup: true,
                done,
                elapsed: warm_start.elapsed(),
            });
        }
        session.profile_with(feed.clone(), runs, &mut |p| progress.update(p))
    })();
    progress.finish();
    let report = result?;
    let mut out = format!("model          {}\n", a.model.display());
    out.push_str(&a.feed.describe(&feed, n_given));
    out.push_str(&format!(
        "runs           {} profiled after {} warm-up; times are per run, nodes sorted by time\n\n",
        report.runs(),
        a.warmup
    ));
    out.push_str(&report.table((a.top > 0).then_some(a.top)));
    if let Some(path) = &a.trace {
        let trace = report.chrome_trace();
        let n = trace.as_array().map_or(0, Vec::len);
        let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut w, &trace).with_context(|| format!("cannot write {}", path.display()))?;
        std::io::Write::flush(&mut w).with_context(|| format!("cannot write {}", path.display()))?;
        out.push_str(&format!(
            "\ntrace          {} ({n} events; open in https://ui.perfetto.dev)\n",
            path.display()
        ));
    }
    emit(&out)
}
