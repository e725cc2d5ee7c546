//! The per-session recording behind qaic's `enable_metrics` and `enable_profiling`: the latency
//! of every run and, when profiling, every step's timing. A [`crate::Session`] owns one
//! [`Monitor`]; benchmarking (`bench.rs`) reads it but the monitor knows nothing of benchmarks.
//!
//! Percentiles are linear interpolation between the two closest ranks of the sorted latencies
//! (numpy's default `percentile` method): for `n` samples and quantile `q`, the rank is
//! `h = (n - 1) q` and the value `x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h])`.

use crate::profile::ProfileReport;
use kiln_ops::Value;
use kiln_runtime::Profile;
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

    pub(crate) fn from_ms(mut ms: Vec<f64>) -> Option<LatencyStats> {
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
    /// Records latencies when `metrics` (or `profiling`), step timings when `profiling`;
    /// `load` is the time the session took to open.
    pub(crate) fn new(metrics: bool, profiling: bool, load: Duration) -> Monitor {
        Monitor {
            latencies: (metrics || profiling).then(|| Mutex::new(Vec::new())),
            profile: profiling.then(|| Mutex::new(Profile::new())),
            load,
        }
    }

    /// Runs the program, recording what the options ask for.
    pub(crate) fn run(
        &self,
        program: &kiln_runtime::Program,
        inputs: Vec<(String, Value)>,
        limits: &kiln_runtime::Limits,
    ) -> Result<Vec<(String, Value)>, kiln_runtime::RuntimeError> {
        let Some(latencies) = &self.latencies else {
            return kiln_runtime::run_limited(program, inputs, None, limits);
        };
        let started = Instant::now();
        let outputs = match &self.profile {
            None => kiln_runtime::run_limited(program, inputs, None, limits)?,
            Some(shared) => {
                let mut local = Profile::with_origin(lock(shared).origin);
                let outputs = kiln_runtime::run_limited(program, inputs, Some(&mut local), limits)?;
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

    /// How long opening the session took.
    pub(crate) fn load(&self) -> Duration {
        self.load
    }

    /// Latency statistics of every successful run so far; `None` unless metrics are recorded,
    /// or before the first run.
    pub(crate) fn metrics(&self) -> Option<Metrics> {
        let nanos = lock(self.latencies.as_ref()?).clone();
        let total_s = nanos.iter().map(|&n| n as f64 / 1e9).sum();
        let latency_ms = LatencyStats::from_ms(nanos.iter().map(|&n| n as f64 / 1e6).collect())?;
        Some(Metrics {
            inferences: nanos.len() as u64,
            total_s,
            latency_ms,
        })
    }

    /// [`Monitor::metrics`] as qaic's `print_metrics` prints them, or why there are none.
    pub(crate) fn metrics_text(&self) -> String {
        match self.metrics() {
            Some(m) => m.to_string(),
            None if self.latencies.is_none() => {
                "no metrics: the session was opened without enable_metrics or enable_profiling\n".to_string()
            }
            None => "no metrics: no inference has run yet\n".to_string(),
        }
    }

    /// Forgets the recorded latencies and step timings.
    pub(crate) fn reset(&self) {
        if let Some(l) = &self.latencies {
            lock(l).clear();
        }
        if let Some(p) = &self.profile {
            lock(p).runs.clear();
        }
    }

    /// Per-step timings of the runs so far; `None` unless profiling.
    pub(crate) fn profile(&self) -> Option<ProfileReport> {
        let profile = lock(self.profile.as_ref()?).clone();
        Some(ProfileReport::new(profile, self.load))
    }
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
}
