//! The pool's hand-off protocol, apart so it can be model-checked: the gate a job's workers
//! pass (`Gate`), the counter its tasks are claimed from (`Tasks`), and the two-ended cursor of
//! `for_each_chunk_mut`'s ranges (`claim`). Built on `std`'s atomics, or on loom's under
//! `--cfg loom` (`tests/loom_pool.rs` explores their interleavings).

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The bit of the gate's count that says the current job admits no more workers.
pub const CLOSED: usize = 1 << (usize::BITS - 1);

/// The workers inside the current job, plus [`CLOSED`] once its caller stops admitting them.
/// A worker enters only while the bit is clear and leaves after its last task, so the caller
/// waits for workers that took tasks, never for one that is not running.
pub struct Gate {
    inside: AtomicUsize,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

impl Gate {
    /// A closed gate (no job).
    pub fn new() -> Gate {
        Gate {
            inside: AtomicUsize::new(CLOSED),
        }
    }

    /// Admits workers to a new job (the caller publishes the job before, bumps the
    /// generation after).
    pub fn open(&self) {
        self.inside.store(0, Ordering::SeqCst);
    }

    /// Joins the current job unless its caller has closed it.
    pub fn enter(&self) -> bool {
        let mut cur = self.inside.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return false;
            }
            match self
                .inside
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Leaves the job entered with [`Gate::enter`]: its writes happen before the caller's
    /// [`Gate::close_and_wait`] returns.
    pub fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::AcqRel);
    }

    /// Admits no more workers and waits until those inside have left, calling `idle(spins)`
    /// while it waits (a spin hint, a yield).
    pub fn close_and_wait(&self, mut idle: impl FnMut(u32)) {
        self.inside.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while self.inside.load(Ordering::Acquire) != CLOSED {
            spins = spins.wrapping_add(1);
            idle(spins);
        }
    }
}

/// The next task of a job to claim (task 0 is the caller's and never claimed).
pub struct Tasks {
    next: AtomicUsize,
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks {
            next: AtomicUsize::new(0),
        }
    }
}

impl Tasks {
    /// Starts a job: tasks are claimed from 1 on.
    pub fn reset(&self) {
        self.next.store(1, Ordering::SeqCst);
    }

    /// The next unclaimed task below `tasks`, each handed out once.
    pub fn claim(&self, tasks: usize) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < tasks).then_some(i)
    }
}

/// A range of pieces `front .. back`, packed as `back << 32 | front`, claimed from its front
/// (the owner) or its back (another thread).
pub struct Cursor(pub AtomicU64);

impl Cursor {
    pub fn new(front: u64, back: u64) -> Cursor {
        Cursor(AtomicU64::new(back << 32 | front))
    }

    /// Takes the next piece from the front or the back; `None` when the range is empty.
    pub fn claim(&self, front: bool) -> Option<usize> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (lo, hi) = (cur & 0xFFFF_FFFF, cur >> 32);
            if lo >= hi {
                return None;
            }
            let (next, got) = if front {
                (hi << 32 | (lo + 1), lo)
            } else {
                ((hi - 1) << 32 | lo, hi - 1)
            };
            match self
                .0
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return usize::try_from(got).ok(),
                Err(now) => cur = now,
            }
        }
    }
}
