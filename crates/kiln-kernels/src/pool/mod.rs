//! The compute thread pool: fork-join `parallel_for` with sub-microsecond hand-off while a run
//! is active, and sleeping workers between runs.
//!
//! Why our own: a fork-join in rayon costs 2-35 us on this machine, and a model runs a few
//! hundred of them per inference (one per GEMM, pooling, softmax, ...); a spinning hand-off is
//! well under 1.5 us. Spinning costs a core, so workers spin only while a run is active
//! ([`ThreadPool::activate`], held by the runtime for the length of one inference) and block
//! on a condition variable otherwise: an idle session burns no CPU.
//!
//! Use: the runtime makes a pool the calling thread's current one for a run
//! ([`ThreadPool::install`]); kernels call [`parallel_for`], which splits over the current
//! pool's threads, or runs inline when there is none, when the pool is already busy (another
//! thread is using it, or a task is itself calling `parallel_for`) or for a single task.
//!
//! The caller thread takes part in every job, so a pool of `n` threads has `n - 1` workers.

pub mod gate;

use gate::{Cursor, Gate, Tasks};
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

/// A job as the workers see it: the task function with its lifetime erased. Valid while a
/// worker is inside the job (see `Shared::gate`).
#[derive(Clone, Copy)]
struct JobRef {
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

// SAFETY: the pointee is `Sync` and outlives every use (see `ThreadPool::parallel_for`).
unsafe impl Send for JobRef {}

/// A published job: the task function, the caller's scratch and its stop.
type Job = (JobRef, Option<Arc<crate::recycle::Scratch>>, StopRef);

/// The stop a job's caller answers to (null: none), for its workers.
#[derive(Clone, Copy)]
struct StopRef(*const crate::stop::Stop);

// SAFETY: `Stop` is `Sync` (atomics and immutable fields), and the caller keeps it alive for
// the whole job: it is installed on the caller's thread in a frame enclosing the
// `parallel_for` call, which returns only after every worker has left the job.
unsafe impl Send for StopRef {}

struct Shared {
    /// Bumped to publish a job (and at shutdown).
    generation: AtomicU64,
    /// The current job; written only by the thread holding `busy`, before it bumps
    /// `generation`, and read by workers after they see the new generation. With it, the
    /// scratch of the caller's run state, which the workers use for the job, and the
    /// caller's current stop (`crate::stop`), which they answer to during the job.
    job: Mutex<Option<Job>>,
    /// The next task to claim (task 0 is the caller's and never claimed).
    tasks: Tasks,
    /// Who is inside the current job (see [`Gate`]): a worker the OS has descheduled when a
    /// job is published simply misses it.
    gate: Gate,
    /// Held by the one caller using the pool.
    busy: AtomicBool,
    /// Workers spin (rather than sleep) while set.
    active: AtomicUsize,
    sleepers: AtomicUsize,
    /// The payload of a task that panicked on a worker, raised again by the caller.
    panicked: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A fixed set of compute threads (see the module docs).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("threads", &self.threads).finish()
    }
}

thread_local! {
    /// The pool `parallel_for` uses on this thread (set by `install`).
    static CURRENT: Cell<*const ThreadPool> = const { Cell::new(std::ptr::null()) };
}

/// Keeps the workers spinning while alive (see [`ThreadPool::activate`]).
pub struct Active<'a> {
    pool: &'a ThreadPool,
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.pool.shared.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ThreadPool {
    /// A pool of `threads` compute threads (the caller counts as one; 0 is taken as 1).
    /// Fails only when the OS refuses to start a thread.
    pub fn new(threads: usize) -> std::io::Result<ThreadPool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            tasks: Tasks::default(),
            gate: Gate::new(),
            busy: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for i in 1..threads {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(format!("kiln-worker-{i}"))
                .spawn(move || worker(&s, i));
            match h {
                Ok(h) => workers.push(h),
                Err(e) => {
                    let pool = ThreadPool {
                        shared,
                        workers,
                        threads,
                    };
                    drop(pool);
                    return Err(e);
                }
            }
        }
        Ok(ThreadPool {
            shared,
            workers,
            threads,
        })
    }

    /// Compute threads, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The round trip of a cache line between the calling thread and a worker, in ns (the
    /// least of three series of 1000 bounces of one atomic): how far apart the host placed the
    /// two cores. On this 2-vCPU VM it is ~30 ns for SMT siblings, ~70-140 ns for cores
    /// sharing a cache, and ~320-390 ns when they are far apart, where every line one thread
    /// reads from the other's writes costs that much. A series gives up when a side waits
    /// 20 ms (the other thread descheduled: a loaded machine, or a worker slow to wake); up to
    /// ten are tried. `None` on one thread, when the pool is busy, or when no series completed.
    pub fn round_trip_ns(&self) -> Option<f64> {
        if self.workers.is_empty() {
            return None;
        }
        let _active = self.activate();
        let (mut best, mut done) = (None::<f64>, 0);
        for _ in 0..10 {
            if let Some(ns) = self.bounce(1000) {
                best = Some(best.map_or(ns, |b| b.min(ns)));
                done += 1;
                if done == 3 {
                    break;
                }
            } else if self.shared.busy.load(Ordering::Relaxed) {
                // Called from inside a job: every series would run inline and time out.
                break;
            }
        }
        best
    }

    /// One series of [`Self::round_trip_ns`]: the caller (task 0) and a worker (task 1) take
    /// turns incrementing one atomic `rounds` times each. Either side gives up after 20 ms.
    fn bounce(&self, rounds: u64) -> Option<f64> {
        let line = AtomicU64::new(0);
        let gave_up = AtomicBool::new(false);
        let elapsed = Mutex::new(None);
        let limit = std::time::Duration::from_millis(20);
        // Waits until `line` holds `want`; false when the other side gave up or time ran out.
        let wait = |want: u64, since: std::time::Instant| -> bool {
            let mut spins = 0u32;
            while line.load(Ordering::Acquire) != want {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1 << 10) && (gave_up.load(Ordering::Relaxed) || since.elapsed() > limit) {
                    gave_up.store(true, Ordering::Relaxed);
                    return false;
                }
                std::hint::spin_loop();
            }
            true
        };
        self.parallel_for(2, &|task| {
            let since = std::time::Instant::now();
            if task == 0 {
                // The worker's first increment says it has joined: time from there.
                if !wait(1, since) {
                    return;
                }
                let start = std::time::Instant::now();
                for r in 0..rounds {
                    line.store(2 * r + 2, Ordering::Release);
                    if !wait(2 * r + 3, since) {
                        return;
                    }
                }
                *elapsed.lock().unwrap_or_else(PoisonError::into_inner) = Some(start.elapsed());
            } else {
                line.store(1, Ordering::Release);
                for r in 0..rounds {
                    if !wait(2 * r + 2, since) {
                        return;
                    }
                    line.store(2 * r + 3, Ordering::Release);
                }
            }
        });
        let t = elapsed.into_inner().unwrap_or_else(PoisonError::into_inner)?;
        Some(t.as_nanos() as f64 / rounds.max(1) as f64)
    }

    /// Workers spin for jobs until the returned guard is dropped (one inference), instead of
    /// sleeping between jobs. Guards nest and may be held by several threads.
    pub fn activate(&self) -> Active<'_> {
        self.shared.active.fetch_add(1, Ordering::SeqCst);
        self.wake_sleepers();
        Active { pool: self }
    }

    /// Runs `f` with this pool as the calling thread's current pool (restored afterwards).
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        with_current(self, f)
    }

    fn wake_sleepers(&self) {
        if self.shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.shared.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
    }

    /// Calls `f(i)` for every `i < tasks`, spread over the pool's threads; returns when all
    /// have returned. Runs inline when the pool has one thread, is busy, or `tasks < 2`.
    /// A panic in a task is raised again here, after every thread has stopped using `f`.
    pub fn parallel_for(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        if self.workers.is_empty()
            || tasks < 2
            || s.busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            run_inline(tasks, f);
            return;
        }
        // SAFETY (lifetime erasure): the pointer is published below and workers use it only
        // between entering the job (`Gate::enter`) and leaving it; this function
        // does not return (nor unwind: the caller's own tasks run under catch_unwind) before
        // it has closed the job and seen every entered worker leave, so `f` outlives every use.
        let erased: *const (dyn Fn(usize) + Sync + '_) = f;
        #[allow(clippy::missing_transmute_annotations)]
        let erased: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(erased) };
        let scratch = crate::recycle::current_scratch();
        let stop = StopRef(crate::stop::current_ptr());
        *s.job.lock().unwrap_or_else(PoisonError::into_inner) = Some((JobRef { f: erased, tasks }, scratch, stop));
        // Task 0 is the caller's (below); the others are claimed from 1 on.
        s.tasks.reset();
        s.gate.open();
        s.generation.fetch_add(1, Ordering::SeqCst);
        self.wake_sleepers();
        // The caller's own tasks see no current pool, as the workers' do: a nested kernel
        // runs its single-thread path on either side (rather than planning a split for this
        // pool that would then run inline, the pool being busy).
        // The caller always runs task 0 itself, so a split of one task per thread puts the
        // first part on the calling thread every time: consecutive ops that split their data
        // alike then find their part in their own core's cache. Claimed through the counter,
        // task 0 went to the worker in ~3% of two-task calls (about one op per ResNet-18
        // inference), which then read all its data from the other core.
        let mine = catch_unwind(AssertUnwindSafe(|| {
            without_pool(|| {
                if !crate::stop::requested() {
                    f(0);
                }
                run_tasks(s, f, tasks);
            })
        }));
        // Every task has been claimed: admit no more workers, and wait for those that took one.
        s.gate.close_and_wait(|spins| {
            if spins.is_multiple_of(1 << 12) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        });
        *s.job.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let worker_panic = s.panicked.lock().unwrap_or_else(PoisonError::into_inner).take();
        s.busy.store(false, Ordering::Release);
        // A task's panic continues in the caller, as if the task had run inline.
        if let Some(p) = mine.err().or(worker_panic) {
            std::panic::resume_unwind(p);
        }
    }
}

/// Claims and runs tasks of the current job until none is left or the current stop says to
/// stop (the tasks not yet claimed are then never run).
fn run_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize) {
    loop {
        if crate::stop::requested() {
            return;
        }
        let Some(i) = s.tasks.claim(tasks) else { return };
        f(i);
    }
}

/// Runs `f(i)` for `i < tasks` on the calling thread, until the current stop says to stop.
fn run_inline(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    for i in 0..tasks {
        if crate::stop::requested() {
            return;
        }
        f(i);
    }
}

/// Worker `slot` (1-based: the caller is slot 0 of the run's scratch).
fn worker(s: &Shared, slot: usize) {
    // Runs are computed with denormals flushed (see `crate::fp`); a worker runs nothing else.
    crate::fp::flush_denormals_here();
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin while a run is active, else sleep.
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = s.generation.load(Ordering::SeqCst);
            if g != seen {
                seen = g;
                break;
            }
            if s.active.load(Ordering::Relaxed) > 0 {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1 << 14) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            // Re-checked under the lock after announcing ourselves: a publisher bumps the
            // generation before reading `sleepers`, and notifies under the lock.
            let ready = s.generation.load(Ordering::SeqCst) != seen
                || s.shutdown.load(Ordering::SeqCst)
                || s.active.load(Ordering::SeqCst) > 0;
            let guard = if ready {
                guard
            } else {
                s.wake.wait(guard).unwrap_or_else(PoisonError::into_inner)
            };
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
        }
        if !s.gate.enter() {
            continue;
        }
        // The job's scratch as a pointer, not a clone of its `Arc`: the count's cache line
        // then stays with the caller instead of crossing cores twice per job.
        let job = s
            .job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(j, scratch, stop)| (*j, scratch.as_deref().map(std::ptr::from_ref), *stop));
        if let Some((job, scratch, stop)) = job {
            // SAFETY: see `JobRef`: the publisher keeps the function alive until every worker
            // that entered the job has left it, which happens only after this use.
            let f = unsafe { &*job.f };
            // SAFETY: the publisher keeps the `Arc` holding this scratch in `job` until every
            // worker that entered the job has left it (it clears `job` only after that).
            let scratch = scratch.map(|p| unsafe { &*p });
            let run = || {
                crate::recycle::with_job_scratch(scratch, slot, || {
                    crate::stop::with_ptr(stop.0, || run_tasks(s, f, job.tasks))
                })
            };
            if let Err(p) = catch_unwind(AssertUnwindSafe(run)) {
                *s.panicked.lock().unwrap_or_else(PoisonError::into_inner) = Some(p);
            }
        }
        s.gate.leave();
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Runs `f` with `pool` (null: none) as this thread's current pool, restoring the previous
/// one afterwards, also when `f` unwinds.
fn with_current<R>(pool: *const ThreadPool, f: impl FnOnce() -> R) -> R {
    struct Restore(*const ThreadPool);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(pool)));
    f()
}

/// Runs `f` with no current pool on this thread (restored afterwards).
fn without_pool<R>(f: impl FnOnce() -> R) -> R {
    with_current(std::ptr::null(), f)
}

/// Threads of the calling thread's current pool (1 when none is installed).
pub fn current_threads() -> usize {
    CURRENT.with(|c| {
        let p = c.get();
        // SAFETY: `install` sets the pointer for the length of a borrow of the pool and
        // restores the previous value before that borrow ends.
        if p.is_null() { 1 } else { unsafe { (*p).threads } }
    })
}

/// [`ThreadPool::parallel_for`] on the calling thread's current pool, or inline without one.
/// Tasks run on other threads do not see a current pool, so nested calls run inline.
pub fn parallel_for(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let p = CURRENT.with(Cell::get);
    if p.is_null() {
        run_inline(tasks, f);
    } else {
        // SAFETY: as in `current_threads`.
        unsafe { (*p).parallel_for(tasks, f) }
    }
}

/// How many pieces each thread's own contiguous range holds when [`for_each_chunk_mut`] on
/// the current pool splits `pieces` pieces (all of them without a pool): the thread owning
/// piece `i` owns `i / per * per .. (i / per + 1) * per`. Read on the calling thread (tasks
/// see no pool), for work that looks ahead within its own range.
pub fn own_range(pieces: usize) -> usize {
    pieces.div_ceil(current_threads().min(pieces).max(1))
}

/// Calls `f(i, chunk)` for every `chunk`-long piece of `data` (the last may be shorter), `i`
/// its index, spread over the current pool: thread `t` (the caller is thread 0) owns the
/// `t`-th contiguous range of `ceil(pieces / threads)` pieces and runs them front to back,
/// then takes the pieces left in the other ranges from their back ends. Balanced threads each
/// run exactly their own range (the same rows every op that splits alike, so data stays in
/// the core that wrote it); a thread the host slows down (a busy sibling, a far placement:
/// on this VM one vCPU alone sometimes ran 20-40% slower) leaves its last pieces to the
/// others instead of holding up the join. Inline without a pool, for one piece, or with
/// `chunk == 0` (then nothing runs).
pub fn for_each_chunk_mut<T: Send>(data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    if chunk == 0 {
        return;
    }
    let pieces = data.len().div_ceil(chunk);
    let threads = current_threads().min(pieces);
    // (Range bounds are packed in 32 bits: more pieces than that go in fixed groups.)
    if u32::try_from(pieces).is_err() {
        return chunks_in_groups(data, chunk, 1, f);
    }
    if threads < 2 {
        chunks_inline(data, chunk, 0, f);
        return;
    }
    let per = own_range(pieces);
    let ranges = pieces.div_ceil(per);
    // Per range: its unclaimed pieces `front .. back`, packed as `back << 32 | front`, each
    // on its own cache lines: the owner claims every piece with a compare-exchange, and with
    // the cursors side by side each claim took the line from the other thread (on ViT-tiny's
    // LayerNorm rows, ~0.1 us each, a round trip per row: ~70 ns near, ~330 ns far).
    let cursors: smallvec::SmallVec<[Padded<Cursor>; 8]> = (0..ranges)
        .map(|r| {
            let (lo, hi) = ((r * per) as u64, ((r + 1) * per).min(pieces) as u64);
            Padded(Cursor::new(lo, hi))
        })
        .collect();
    let raw = RawChunks {
        ptr: data.as_mut_ptr(),
        len: data.len(),
        chunk,
    };
    let run = |i: usize| {
        // SAFETY: every piece index is claimed exactly once (`claim` moves a range's front
        // or back past it with a compare-exchange), so no two calls get the same piece, and
        // the pieces are disjoint parts of `data`, which this function borrows mutably
        // throughout.
        if let Some(c) = unsafe { raw.piece(i) } {
            f(i, c);
        }
    };
    parallel_for(ranges, &|t| {
        while let Some(i) = claim(cursors.get(t).map(|c| &c.0), true) {
            run(i);
        }
        for k in 1..ranges {
            while let Some(i) = claim(cursors.get((t + k) % ranges).map(|c| &c.0), false) {
                run(i);
            }
        }
    });
}

/// `f(first + i, piece)` for the `chunk`-long pieces of `data` in order, on the calling
/// thread, until the current stop says to stop.
fn chunks_inline<T>(data: &mut [T], chunk: usize, first: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    for (i, c) in data.chunks_mut(chunk).enumerate() {
        if crate::stop::requested() {
            return;
        }
        f(first + i, c);
    }
}

/// A value alone on its cache lines (two: the adjacent-line prefetcher pairs them), so
/// threads writing neighbouring values do not take one line from each other.
#[repr(align(128))]
struct Padded<T>(T);

/// Takes the next piece of a range of [`for_each_chunk_mut`]: its front (the owner) or its
/// back (another thread). `None` when the range is empty (or absent), or when the current
/// stop says to stop.
fn claim(cursor: Option<&Cursor>, front: bool) -> Option<usize> {
    let cursor = cursor?;
    if crate::stop::requested() {
        return None;
    }
    cursor.claim(front)
}

/// `data` of [`for_each_chunk_mut`] cut into pieces handed out by index.
struct RawChunks<T> {
    ptr: *mut T,
    len: usize,
    chunk: usize,
}

// SAFETY: the pieces go to different threads, each piece to one (see `piece`); `T: Send`.
unsafe impl<T: Send> Sync for RawChunks<T> {}

impl<T> RawChunks<T> {
    /// Piece `i`: elements `i * chunk .. min((i + 1) * chunk, len)`; `None` past the end.
    ///
    /// # Safety
    /// No other reference to piece `i` exists while the returned one lives.
    unsafe fn piece<'a>(&self, i: usize) -> Option<&'a mut [T]> {
        let start = i.checked_mul(self.chunk).filter(|&s| s < self.len)?;
        let n = self.chunk.min(self.len - start);
        // SAFETY: `start + n <= len` elements of the borrowed slice; exclusive by the caller.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), n) })
    }
}

/// Groups per thread of [`for_each_chunk_balanced`].
const BALANCED_GROUPS: usize = 8;

/// [`for_each_chunk_mut`] in up to [`BALANCED_GROUPS`] groups per thread, which the threads
/// claim as they go: for big independent pieces (Winograd's 36 products), so a thread that
/// the host slows down (a shared machine) does fewer of them instead of holding up the rest.
pub fn for_each_chunk_balanced<T: Send>(data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    chunks_in_groups(data, chunk, BALANCED_GROUPS, f);
}

fn chunks_in_groups<T: Send>(data: &mut [T], chunk: usize, per_thread: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    if chunk == 0 {
        return;
    }
    let pieces = data.len().div_ceil(chunk);
    let threads = current_threads().min(pieces);
    if threads < 2 {
        chunks_inline(data, chunk, 0, f);
        return;
    }
    let per = pieces.div_ceil(threads.saturating_mul(per_thread).min(pieces));
    // Inline for the usual few threads, so a call allocates nothing.
    let groups: smallvec::SmallVec<[Mutex<&mut [T]>; 16]> =
        data.chunks_mut(per.saturating_mul(chunk)).map(Mutex::new).collect();
    parallel_for(groups.len(), &|g| {
        if let Some(group) = groups.get(g) {
            let mut group = group.lock().unwrap_or_else(PoisonError::into_inner);
            chunks_inline(&mut group, chunk, g * per, f);
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            for tasks in [0, 1, 2, 7, 100] {
                let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                pool.parallel_for(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{threads} threads, {tasks} tasks"
                );
            }
        }
    }

    #[test]
    fn back_to_back_jobs_never_lose_or_repeat_a_task() {
        // Many short jobs: workers often arrive after the caller has taken every task and
        // closed the job, or enter the next job with a stale generation.
        let pool = ThreadPool::new(3).unwrap();
        let _active = pool.activate();
        let hits: Vec<AtomicU32> = (0..3).map(|_| AtomicU32::new(0)).collect();
        let jobs = 20_000u32;
        for _ in 0..jobs {
            pool.parallel_for(3, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == jobs));
    }

    #[test]
    fn active_and_sleeping_workers_both_take_jobs() {
        let pool = ThreadPool::new(2).unwrap();
        let sum = AtomicUsize::new(0);
        for round in 0..50 {
            let _active = (round % 2 == 0).then(|| pool.activate());
            pool.parallel_for(10, &|i| {
                sum.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(sum.load(Ordering::Relaxed), 50 * 45);
    }

    /// `own_range` is the range length `for_each_chunk_mut` deals out: with every thread
    /// running at the same pace, a piece's thread is the one owning `i / per`, and without a
    /// pool one range holds everything.
    #[test]
    fn own_range_matches_the_ranges_of_for_each_chunk_mut() {
        assert_eq!(own_range(7), 7);
        assert_eq!(own_range(0), 0);
        let pool = ThreadPool::new(3).unwrap();
        pool.install(|| {
            for (pieces, per) in [(10, 4), (9, 3), (2, 1), (1, 1), (0, 0)] {
                assert_eq!(own_range(pieces), per, "{pieces} pieces");
                // Every piece lies in exactly one range of `per` pieces, and the ranges
                // number at most the threads.
                let ranges = if per == 0 { 0 } else { pieces.div_ceil(per) };
                assert!(ranges <= 3, "{pieces} pieces: {ranges} ranges");
            }
        });
    }

    #[test]
    fn install_scopes_the_current_pool_and_nested_calls_run_inline() {
        assert_eq!(current_threads(), 1);
        let pool = ThreadPool::new(2).unwrap();
        let total = AtomicUsize::new(0);
        pool.install(|| {
            assert_eq!(current_threads(), 2);
            parallel_for(4, &|_| {
                // Nested: inline on whichever thread runs this task.
                parallel_for(3, &|_| {
                    total.fetch_add(1, Ordering::Relaxed);
                });
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
        assert_eq!(current_threads(), 1);
    }

    /// The round trip needs a second thread: `None` on one, or from inside a job (the pool is
    /// busy, the two sides would run one after the other: each gives up after 20 ms instead
    /// of waiting for the other forever); a positive time under a millisecond otherwise.
    #[test]
    fn round_trip_is_measured_between_two_threads_only() {
        assert_eq!(ThreadPool::new(1).unwrap().round_trip_ns(), None);
        let pool = ThreadPool::new(2).unwrap();
        // A worker the host deschedules for 20 ms gives `None`: a few tries.
        let got = (0..5).find_map(|_| pool.round_trip_ns());
        assert!(got.is_some_and(|ns| ns > 0.0 && ns < 1e6), "{got:?}");
        let inside = Mutex::new(Vec::new());
        pool.parallel_for(2, &|_| {
            let r = pool.round_trip_ns();
            inside.lock().unwrap().push(r);
        });
        assert_eq!(inside.into_inner().unwrap(), [None, None]);
    }

    /// Task 0 runs on the calling thread every time (ops splitting their data alike keep
    /// their parts on the same cores), and every task, the caller's included, sees one
    /// thread (nested kernels plan no split).
    #[test]
    fn task_zero_is_the_callers_and_tasks_see_no_pool() {
        let pool = ThreadPool::new(2).unwrap();
        let _active = pool.activate();
        let caller = std::thread::current().id();
        let elsewhere = AtomicUsize::new(0);
        let nested_threads = AtomicUsize::new(0);
        pool.install(|| {
            for _ in 0..2000 {
                parallel_for(2, &|i| {
                    if i == 0 && std::thread::current().id() != caller {
                        elsewhere.fetch_add(1, Ordering::Relaxed);
                    }
                    nested_threads.fetch_max(current_threads(), Ordering::Relaxed);
                });
            }
        });
        assert_eq!(elsewhere.load(Ordering::Relaxed), 0);
        assert_eq!(nested_threads.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_panicking_task_is_raised_in_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(64, &|i| {
                if i == 63 {
                    panic!("task {i}");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.parallel_for(8, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn chunks_are_visited_once_with_their_index() {
        let pool = ThreadPool::new(3).unwrap();
        // 36 x 5: Winograd's positions, more pieces than balanced groups.
        for (len, chunk) in [(0, 4), (10, 3), (64, 8), (5, 10), (180, 5), (1000, 7)] {
            for balanced in [false, true] {
                let mut v = vec![0usize; len];
                let f = |i: usize, c: &mut [usize]| {
                    for (j, x) in c.iter_mut().enumerate() {
                        *x += i * chunk + j + 1;
                    }
                };
                pool.install(|| {
                    if balanced {
                        for_each_chunk_balanced(&mut v, chunk, &f)
                    } else {
                        for_each_chunk_mut(&mut v, chunk, &f)
                    }
                });
                let want: Vec<usize> = (1..=len).collect();
                assert_eq!(v, want, "{len} / {chunk}, balanced {balanced}");
            }
        }
    }

    /// A thread held up in its own range leaves the rest of that range to the others, who
    /// take it from the back; balanced threads run exactly their own ranges.
    #[test]
    fn a_held_up_threads_pieces_are_taken_from_the_back() {
        let pool = ThreadPool::new(2).unwrap();
        let _active = pool.activate();
        let caller = std::thread::current().id();
        // 8 pieces: the caller owns 0..4, the worker 4..8. The caller's first piece waits
        // until pieces 1, 2 and 3 have run (at most 5 s, so a failure ends).
        let mut v = vec![0u8; 8];
        let ran_elsewhere = Mutex::new(Vec::new());
        let done = AtomicUsize::new(0);
        pool.install(|| {
            for_each_chunk_mut(&mut v, 1, &|i, c| {
                c[0] += 1;
                if i == 0 {
                    let t = std::time::Instant::now();
                    while done.load(Ordering::Acquire) < 3 && t.elapsed() < std::time::Duration::from_secs(5) {
                        std::hint::spin_loop();
                    }
                } else if i < 4 {
                    if std::thread::current().id() != caller {
                        ran_elsewhere.lock().unwrap().push(i);
                    }
                    done.fetch_add(1, Ordering::Release);
                }
            });
        });
        assert_eq!(v, [1; 8]);
        let mut stolen = ran_elsewhere.into_inner().unwrap();
        stolen.sort_unstable();
        assert_eq!(stolen, [1, 2, 3]);
    }

    #[test]
    fn concurrent_callers_share_one_pool() {
        let pool = ThreadPool::new(2).unwrap();
        let n = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for _ in 0..100 {
                        pool.parallel_for(5, &|_| {
                            n.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(n.load(Ordering::Relaxed), 4 * 100 * 5);
    }

    /// Runs `work` under a stop whose flag the 10th task to run sets; returns how many ran.
    fn stopped_after_ten(work: impl FnOnce(&(dyn Fn() + Sync))) -> usize {
        let flag = Arc::new(AtomicBool::new(false));
        let stop = crate::stop::Stop::new(Some(Arc::clone(&flag)), None);
        let ran = AtomicUsize::new(0);
        crate::stop::install(&stop, || {
            work(&|| {
                if ran.fetch_add(1, Ordering::SeqCst) + 1 == 10 {
                    flag.store(true, Ordering::SeqCst);
                }
            })
        });
        ran.load(Ordering::SeqCst)
    }

    #[test]
    fn a_stop_skips_the_tasks_and_pieces_not_yet_started() {
        // Inline (no pool): exactly the ten before the flag.
        assert_eq!(stopped_after_ten(|task| parallel_for(1000, &|_| task())), 10);
        let mut v = vec![0u8; 1000];
        assert_eq!(
            stopped_after_ten(|task| for_each_chunk_mut(&mut v, 1, &|_, _| task())),
            10
        );
        // On a pool of two: the caller's stop reaches the worker; at most one task per
        // thread is under way when the flag is set.
        let pool = ThreadPool::new(2).unwrap();
        for _ in 0..20 {
            let n = stopped_after_ten(|task| pool.install(|| parallel_for(1000, &|_| task())));
            assert!((10..=11).contains(&n), "{n} tasks ran");
            let mut v = vec![0u8; 1000];
            let n = stopped_after_ten(|task| pool.install(|| for_each_chunk_mut(&mut v, 1, &|_, _| task())));
            assert!((10..=11).contains(&n), "{n} pieces ran");
            let mut v = vec![0u8; 1000];
            let n = stopped_after_ten(|task| pool.install(|| for_each_chunk_balanced(&mut v, 1, &|_, _| task())));
            assert!((10..=11).contains(&n), "{n} balanced pieces ran");
        }
        // Without a stop, the pool runs every task again.
        let n = AtomicUsize::new(0);
        pool.install(|| {
            parallel_for(1000, &|_| {
                n.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(n.load(Ordering::Relaxed), 1000);
    }
}
