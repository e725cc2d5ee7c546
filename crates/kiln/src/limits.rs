//! Bounds on runs and compiles, and stopping them from outside.
//!
//! A session's [`RunLimits`] come from its options (`run_time_limit_ms`,
//! `run_memory_limit_mb`, `loop_iteration_limit`); a [`RunOptions`] passed to
//! [`crate::Session::run_with_options`] can stop one call from another thread (ONNX Runtime's
//! `RunOptions.terminate`) and give it its own time limit. `SessionOptions::cancel` is a flag
//! that stops every compile and run of the session while set (the CLI's Ctrl-C).
//!
//! How a stop reaches the work: the run installs a `kiln_kernels::stop::Stop` on its thread;
//! the interpreter checks it before the first step and after every step, the thread pool
//! before every task and piece of work it hands out, the compiler after every pass and
//! between folded nodes. A stopped run returns an error and nothing else; its run state
//! goes back to the session as after any run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Bounds on every run of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// Wall-clock time of one run (`run_time_limit_ms`; `None`: no limit).
    pub time: Option<Duration>,
    /// Bytes the run's own tensors may hold at once (`run_memory_limit_mb`; see
    /// [`kiln_runtime::Limits::memory_bytes`]).
    pub memory_bytes: Option<u64>,
    /// Iterations of one execution of a Loop node (`loop_iteration_limit`).
    pub loop_iterations: Option<u64>,
}

/// `loop_iteration_limit`'s default.
pub const DEFAULT_LOOP_ITERATIONS: u64 = 10_000_000;

impl Default for RunLimits {
    /// The options' defaults: no time limit, three quarters of physical memory, 10 million
    /// iterations per Loop.
    fn default() -> RunLimits {
        RunLimits {
            time: None,
            memory_bytes: auto_memory_limit(),
            loop_iterations: Some(DEFAULT_LOOP_ITERATIONS),
        }
    }
}

impl RunLimits {
    /// No bound at all.
    pub const NONE: RunLimits = RunLimits {
        time: None,
        memory_bytes: None,
        loop_iterations: None,
    };

    /// The limits a runtime configuration asks for (0 ms: no time limit; 0 MiB: three
    /// quarters of physical memory).
    pub fn from_config(c: &kiln_config::RuntimeConfig) -> RunLimits {
        RunLimits {
            time: (c.run_time_limit_ms > 0).then(|| Duration::from_millis(c.run_time_limit_ms)),
            memory_bytes: if c.run_memory_limit_mb == 0 {
                auto_memory_limit()
            } else {
                Some(c.run_memory_limit_mb.saturating_mul(1 << 20))
            },
            loop_iterations: Some(c.loop_iteration_limit),
        }
    }

    pub(crate) fn runtime(&self) -> kiln_runtime::Limits {
        kiln_runtime::Limits {
            memory_bytes: self.memory_bytes,
            loop_iterations: self.loop_iterations,
        }
    }
}

/// Three quarters of the machine's physical memory (`MemTotal` of `/proc/meminfo`); `None`
/// where it cannot be read.
pub fn auto_memory_limit() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024) / 4 * 3)
}

/// Per-call control of a run (ONNX Runtime's `RunOptions`): a terminate flag another thread
/// may set while the run is in progress, and an optional time limit for this call.
///
/// Clones share the flag. Once set, every run using these options ends with
/// `RuntimeError::Cancelled` until [`RunOptions::unset_terminate`].
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    terminate: Arc<AtomicBool>,
    /// Overrides the session's `run_time_limit_ms` for this call (`Some(Duration::MAX)`: none).
    pub time_limit: Option<Duration>,
}

impl RunOptions {
    pub fn new() -> RunOptions {
        RunOptions::default()
    }

    /// These options with a time limit of their own.
    pub fn with_time_limit(mut self, limit: Duration) -> RunOptions {
        self.time_limit = Some(limit);
        self
    }

    /// Stops the runs using these options (now, from any thread, and later ones).
    pub fn terminate(&self) {
        self.terminate.store(true, Ordering::Relaxed);
    }

    /// Lets later runs with these options go ahead again.
    pub fn unset_terminate(&self) {
        self.terminate.store(false, Ordering::Relaxed);
    }

    pub fn is_terminated(&self) -> bool {
        self.terminate.load(Ordering::Relaxed)
    }

    /// The flag itself, for a handler (a signal, a watchdog) that only sets it.
    pub fn terminate_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.terminate)
    }

    pub(crate) fn flag(&self) -> &Arc<AtomicBool> {
        &self.terminate
    }
}

/// Runs `f` with a stop of `cancel` (either flag) and `time` installed on this thread.
pub(crate) fn with_stop<R>(
    cancel: Option<&Arc<AtomicBool>>,
    session_cancel: Option<&Arc<AtomicBool>>,
    time: Option<Duration>,
    f: impl FnOnce() -> R,
) -> R {
    let stop = kiln_runtime::Stop::with_flags(
        cancel.into_iter().chain(session_cancel).map(Arc::clone).collect(),
        time.filter(|t| *t != Duration::MAX),
    );
    kiln_runtime::install_stop(&stop, f)
}
