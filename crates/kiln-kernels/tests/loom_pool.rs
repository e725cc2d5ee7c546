//! Model checks (loom) of the thread pool's hand-off protocol, `kiln_kernels::pool::gate`:
//! every interleaving of a caller and its workers is explored. Run with
//!
//!     RUSTFLAGS="--cfg loom" cargo test -p kiln-kernels --test loom_pool --release
//!
//! (`scripts/test.sh` does, in a target directory of its own). Without `--cfg loom` this file
//! is empty.
#![cfg(loom)]

use kiln_kernels::pool::gate::{Cursor, Gate, Tasks};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// One job of `TASKS` tasks: the caller opens the gate, a worker may enter (or miss the job),
/// both claim tasks, each task writes its own plain (non-atomic) cell; when the caller's
/// `close_and_wait` returns, every task has run exactly once, its write is visible to the
/// caller (no data race: loom checks the cells), and no worker is inside.
#[test]
fn a_job_runs_every_task_once_and_its_writes_are_seen_when_the_caller_closes() {
    const TASKS: usize = 3;
    loom::model(|| {
        let gate = Arc::new(Gate::new());
        let tasks = Arc::new(Tasks::default());
        let cells: Arc<Vec<UnsafeCell<usize>>> = Arc::new((0..TASKS).map(|_| UnsafeCell::new(0)).collect());
        let inside = Arc::new(AtomicUsize::new(0));
        let run = |cells: &Vec<UnsafeCell<usize>>, i: usize| {
            // SAFETY: each task index is handed out once, so one thread writes it.
            cells[i].with_mut(|c| unsafe { *c += 1 });
        };
        tasks.reset();
        gate.open();
        let worker = {
            let (gate, tasks, cells, inside) = (gate.clone(), tasks.clone(), cells.clone(), inside.clone());
            thread::spawn(move || {
                if gate.enter() {
                    inside.fetch_add(1, Ordering::Relaxed);
                    while let Some(i) = tasks.claim(TASKS) {
                        run(&cells, i);
                    }
                    inside.fetch_sub(1, Ordering::Relaxed);
                    gate.leave();
                }
            })
        };
        run(&cells, 0);
        while let Some(i) = tasks.claim(TASKS) {
            run(&cells, i);
        }
        gate.close_and_wait(|_| thread::yield_now());
        assert_eq!(inside.load(Ordering::Relaxed), 0, "a worker is still inside");
        for (i, c) in cells.iter().enumerate() {
            // SAFETY: read after the close; loom reports a race if it is not ordered.
            assert_eq!(c.with(|v| unsafe { *v }), 1, "task {i}");
        }
        // A worker arriving now finds the gate closed.
        assert!(!gate.enter());
        worker.join().unwrap();
    });
}

/// Two jobs back to back on one gate with a worker that may be slow to arrive: it never
/// runs a task of the first job after that job closed, and the second job's tasks all run.
#[test]
fn a_late_worker_never_enters_a_closed_job() {
    loom::model(|| {
        let gate = Arc::new(Gate::new());
        let tasks = Arc::new(Tasks::default());
        let after_close = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        tasks.reset();
        gate.open();
        let worker = {
            let (gate, tasks, after_close, closed) = (gate.clone(), tasks.clone(), after_close.clone(), closed.clone());
            thread::spawn(move || {
                if gate.enter() {
                    while tasks.claim(2).is_some() {
                        if closed.load(Ordering::Acquire) == 1 {
                            after_close.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    gate.leave();
                }
            })
        };
        while tasks.claim(2).is_some() {}
        gate.close_and_wait(|_| thread::yield_now());
        closed.store(1, Ordering::Release);
        worker.join().unwrap();
        assert_eq!(after_close.load(Ordering::Relaxed), 0);
    });
}

/// A range's owner claims from the front while another thread claims from the back: every
/// piece is taken exactly once.
#[test]
fn front_and_back_claims_take_every_piece_once() {
    loom::model(|| {
        let cursor = Arc::new(Cursor::new(0, 3));
        let taken: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
        let thief = {
            let (cursor, taken) = (cursor.clone(), taken.clone());
            thread::spawn(move || {
                while let Some(i) = cursor.claim(false) {
                    taken[i].fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        while let Some(i) = cursor.claim(true) {
            taken[i].fetch_add(1, Ordering::Relaxed);
        }
        thief.join().unwrap();
        for t in taken.iter() {
            assert_eq!(t.load(Ordering::Relaxed), 1);
        }
    });
}
