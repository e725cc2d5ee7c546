//! Stopping work early: a run's (or a compile's) stop condition, seen by every thread that
//! works for it.
//!
//! A [`Stop`] holds a cancellation flag (shared with whoever may cancel: another thread, a
//! Ctrl-C handler) and an optional deadline. [`install`] makes it the calling thread's
//! current one for the length of a closure; the thread pool hands the caller's current stop
//! to its workers with every job. Long loops ask [`requested`] between work chunks: the
//! pool before each task and each piece of `for_each_chunk_mut`, the interpreter before each
//! step, reference kernels once per outer row. Once it answers true, work is skipped rather
//! than finished: the values being computed are then incomplete, so whoever installed the
//! stop must check [`Stop::reason`] when the work returns and discard its results.
//!
//! Without a current stop, [`requested`] is a thread-local read and a null test.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Why work was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The cancellation flag was set.
    Cancelled,
    /// The deadline passed.
    TimeLimit,
}

/// A stop condition: a shared cancellation flag and an optional deadline.
#[derive(Debug)]
pub struct Stop {
    cancel: Vec<Arc<AtomicBool>>,
    started: Instant,
    limit: Option<Duration>,
    deadline: Option<Instant>,
    /// 0: keep going; else the `StopReason` seen first (1: cancelled, 2: time limit).
    seen: AtomicU8,
}

const GO: u8 = 0;
const CANCELLED: u8 = 1;
const TIMED_OUT: u8 = 2;

impl Stop {
    /// A stop that fires when `cancel` is set or when `limit` has passed from now.
    pub fn new(cancel: Option<Arc<AtomicBool>>, limit: Option<Duration>) -> Stop {
        Stop::with_flags(cancel.into_iter().collect(), limit)
    }

    /// A stop that fires when any of `cancel` is set or when `limit` has passed from now.
    pub fn with_flags(cancel: Vec<Arc<AtomicBool>>, limit: Option<Duration>) -> Stop {
        let started = Instant::now();
        Stop {
            cancel,
            started,
            limit,
            deadline: limit.and_then(|l| started.checked_add(l)),
            seen: AtomicU8::new(GO),
        }
    }

    /// Whether the work should stop now (and from then on: the answer never goes back).
    pub fn check(&self) -> bool {
        if self.seen.load(Ordering::Relaxed) != GO {
            return true;
        }
        let why = if self.cancel.iter().any(|c| c.load(Ordering::Relaxed)) {
            CANCELLED
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            TIMED_OUT
        } else {
            return false;
        };
        // The first reason seen wins.
        let _ = self
            .seen
            .compare_exchange(GO, why, Ordering::Relaxed, Ordering::Relaxed);
        true
    }

    /// Why the work stopped, once [`Stop::check`] has said so (it is asked here too).
    pub fn reason(&self) -> Option<StopReason> {
        self.check();
        match self.seen.load(Ordering::Relaxed) {
            CANCELLED => Some(StopReason::Cancelled),
            TIMED_OUT => Some(StopReason::TimeLimit),
            _ => None,
        }
    }

    /// The time limit this stop was made with.
    pub fn limit(&self) -> Option<Duration> {
        self.limit
    }

    /// Time since the stop was made (the start of the work it guards).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

thread_local! {
    /// The stop the work on this thread answers to (set by `install` and, on pool workers,
    /// for the length of a job).
    static CURRENT: Cell<*const Stop> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with `stop` as this thread's current stop (the previous one is restored after,
/// also when `f` unwinds).
pub fn install<R>(stop: &Stop, f: impl FnOnce() -> R) -> R {
    with_ptr(stop, f)
}

/// The calling thread's current stop, as the pool hands it to its workers.
pub(crate) fn current_ptr() -> *const Stop {
    CURRENT.with(Cell::get)
}

/// Runs `f` with `stop` (null: none) current on this thread. The caller keeps the pointee
/// alive until `f` returns.
pub(crate) fn with_ptr<R>(stop: *const Stop, f: impl FnOnce() -> R) -> R {
    struct Restore(*const Stop);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(stop)));
    f()
}

/// The current stop's state once it has fired: why, its time limit and the time since it
/// was made. `None` without a current stop or while it has not fired.
pub fn current_state() -> Option<(StopReason, Option<Duration>, Duration)> {
    let p = current_ptr();
    if p.is_null() {
        return None;
    }
    // SAFETY: as in `requested`.
    let stop = unsafe { &*p };
    Some((stop.reason()?, stop.limit(), stop.elapsed()))
}

/// Whether the current stop (if any) says to stop. Cheap enough for every work chunk.
pub fn requested() -> bool {
    let p = current_ptr();
    if p.is_null() {
        return false;
    }
    // SAFETY: `with_ptr` sets the pointer from a live `&Stop` (or one the pool's job keeps
    // alive for the length of the job) and restores the previous value before it returns;
    // this runs inside it, on the same thread.
    unsafe { (*p).check() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_stop_never_requests() {
        assert!(!requested());
    }

    #[test]
    fn cancel_flag_and_deadline_are_seen_and_stay() {
        let flag = Arc::new(AtomicBool::new(false));
        let stop = Stop::new(Some(Arc::clone(&flag)), None);
        install(&stop, || {
            assert!(!requested());
            flag.store(true, Ordering::Relaxed);
            assert!(requested());
            // Clearing the flag does not take the answer back.
            flag.store(false, Ordering::Relaxed);
            assert!(requested());
        });
        assert!(!requested(), "the previous (no) stop is restored");
        assert_eq!(stop.reason(), Some(StopReason::Cancelled));

        let stop = Stop::new(None, Some(Duration::ZERO));
        assert!(install(&stop, requested));
        assert_eq!(stop.reason(), Some(StopReason::TimeLimit));
        assert_eq!(stop.limit(), Some(Duration::ZERO));
    }

    #[test]
    fn nested_installs_restore_the_outer_stop() {
        let outer = Stop::new(Some(Arc::new(AtomicBool::new(true))), None);
        let inner = Stop::new(None, None);
        install(&outer, || {
            assert!(requested());
            install(&inner, || assert!(!requested()));
            assert!(requested());
        });
    }
}
