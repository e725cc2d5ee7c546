//! Recycled f32 buffers for kernel outputs and scratch: the run state's arena.
//!
//! The runtime gives back the vectors of the f32 tensors it frees ([`give`]); an op whose
//! kernel writes every element of its output takes one ([`take`]) instead of allocating a
//! zeroed vector. Kernels take their scratch the same way and give it back when done. So a run
//! in steady state neither allocates nor clears its intermediates: the buffers of the previous
//! layers (and of the previous run) are reused while they are still warm in cache.
//!
//! The buffers live in an [`Arena`], current per thread; a Session owns one arena per
//! concurrent run and makes it current for the run ([`Arena::enter`]), so sessions sharing a
//! thread do not evict each other's buffers. At the end of every run the runtime calls
//! [`finish_run`]: the current arena then keeps only its *working set*, the vectors that some
//! [`take`] of this run handed out (hits and fresh ones alike). Vectors given back that no take
//! asked for (the caller's inputs, outputs of ops that allocate their own) are dropped then, so
//! what an arena holds between runs is bounded by what one run takes, and it does not grow run
//! after run.
//!
//! Kernels' scratch (an im2col block, a padded image, a ring of rows) belongs to the run state
//! too: [`lend`] lends the current arena's value of a kind, one per compute thread of
//! the run (the pool hands the caller's arena [`Scratch`] to its workers for each job), kept
//! for the next call and the next run. So scratch lives and dies with a Session's run states,
//! never in a thread of its own.
//!
//! A taken vector holds stale values from its previous use (never uninitialised memory: this
//! is plain safe Rust), so only callers that overwrite all of it may use it. Vectors smaller than [`MIN_LEN`] are not kept (allocating them is
//! cheap), and an arena never keeps more than [`MAX_BYTES`].

use crate::slab::{Region, Slab, SlabElem};
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// Fewest elements a kept vector has (64 bytes of f32: pooled features and logits recycle too).
pub const MIN_LEN: usize = 16;
/// Most bytes an arena keeps at once; the oldest vectors go first.
pub const MAX_BYTES: usize = 1 << 30;

/// Kept vectors of one element type, oldest first.
#[derive(Default)]
pub struct Pool<T> {
    kept: Vec<Vec<T>>,
}

/// Element types whose vectors an [`Arena`] recycles: f32 (activations), the int64 and
/// bool tensors of transformers' attention-mask arithmetic, and quantized u8/i8 activations.
pub trait Recycled: Copy + Default + 'static {
    fn pool(arena: &mut Arena) -> &mut Pool<Self>;
    /// [`take_planned`] for the types a slab region can hold; `None` for the others.
    fn take_planned(_n: usize) -> Option<Region<Self>> {
        None
    }
}

impl Recycled for f32 {
    fn pool(arena: &mut Arena) -> &mut Pool<f32> {
        &mut arena.f32s
    }
    fn take_planned(n: usize) -> Option<Region<f32>> {
        take_planned(n)
    }
}

impl Recycled for i64 {
    fn pool(arena: &mut Arena) -> &mut Pool<i64> {
        &mut arena.i64s
    }
    fn take_planned(n: usize) -> Option<Region<i64>> {
        take_planned(n)
    }
}

impl Recycled for bool {
    fn pool(arena: &mut Arena) -> &mut Pool<bool> {
        &mut arena.bools
    }
}

impl Recycled for u8 {
    fn pool(arena: &mut Arena) -> &mut Pool<u8> {
        &mut arena.u8s
    }
    fn take_planned(n: usize) -> Option<Region<u8>> {
        take_planned(n)
    }
}

impl Recycled for i8 {
    fn pool(arena: &mut Arena) -> &mut Pool<i8> {
        &mut arena.i8s
    }
    fn take_planned(n: usize) -> Option<Region<i8>> {
        take_planned(n)
    }
}

/// Kept vectors plus the identities of those handed out in the current run.
#[derive(Default)]
pub struct Arena {
    f32s: Pool<f32>,
    i64s: Pool<i64>,
    bools: Pool<bool>,
    u8s: Pool<u8>,
    i8s: Pool<i8>,
    /// Capacity bytes of the kept vectors.
    bytes: usize,
    /// Addresses of the vectors [`take`] handed out since the last [`finish_run`].
    taken: HashSet<usize>,
    /// The block of the memory plan's tensors, once a run asked for one ([`use_slab`]).
    slab: Option<Slab>,
    /// Byte offset and size the compiler planned for the running step's output.
    planned: Option<(usize, usize)>,
    /// Outputs placed at their planned ranges in this run, and in the last finished one.
    placed: usize,
    placed_last_run: usize,
    /// The kernels' scratch, per compute thread ([`lend`]); made by the first loan, so the
    /// placeholder arenas that `enter` swaps in allocate nothing.
    scratch: Option<Arc<Scratch>>,
}

/// Scratch values of one run state, per compute thread of its runs (slot 0 the caller's,
/// slot `i` the pool's worker `i`; threads beyond [`SCRATCH_SLOTS`] share slots, safely), at
/// most one value of each kind per slot. A value is lent out whole ([`lend`]), so a nested
/// request for the same kind gets a fresh one, never a second borrow. Each slot's lock sits
/// on cache lines of its own, so a thread's loans never touch a line another thread writes.
#[derive(Default)]
pub struct Scratch {
    slots: [Slot; SCRATCH_SLOTS],
}

/// Distinct scratch slots (compute threads) of a run state.
pub const SCRATCH_SLOTS: usize = 8;

#[derive(Default)]
#[repr(align(128))]
struct Slot(Mutex<Vec<(TypeId, Box<dyn Any + Send>)>>);

impl Scratch {
    fn slot(&self, slot: usize) -> Option<&Slot> {
        self.slots.get(slot % SCRATCH_SLOTS)
    }

    fn take<K: ScratchKey>(&self, slot: usize) -> Box<K::Value> {
        let kept = self.slot(slot).and_then(|s| {
            let mut values = s.0.lock().unwrap_or_else(PoisonError::into_inner);
            let at = values.iter().position(|(id, _)| *id == TypeId::of::<K>())?;
            Some(values.swap_remove(at).1)
        });
        kept.and_then(|b| b.downcast::<K::Value>().ok()).unwrap_or_default()
    }

    fn put<K: ScratchKey>(&self, slot: usize, value: Box<K::Value>) {
        let Some(s) = self.slot(slot) else { return };
        let mut values = s.0.lock().unwrap_or_else(PoisonError::into_inner);
        // One value per kind: a nested loan's value, given back first, yields to the outer
        // one (the last given back).
        match values.iter_mut().find(|(id, _)| *id == TypeId::of::<K>()) {
            Some(kept) => kept.1 = value,
            None => values.push((TypeId::of::<K>(), value)),
        }
    }
}

thread_local! {
    /// On a pool worker inside a job: the scratch of the run that posted it, and this
    /// worker's slot (see [`with_job_scratch`]).
    static JOB_SCRATCH: std::cell::Cell<Option<(*const Scratch, usize)>> = const { std::cell::Cell::new(None) };
}

/// The current arena's scratch, for the pool to hand to its workers with a job.
pub(crate) fn current_scratch() -> Option<Arc<Scratch>> {
    CURRENT.with(|c| {
        let mut a = c.try_borrow_mut().ok()?;
        Some(Arc::clone(a.scratch.get_or_insert_with(Arc::default)))
    })
}

/// Runs `f` (a worker's share of a job) with `scratch`'s slot `slot` as this thread's. The
/// caller keeps `scratch` alive until `f` has returned (the pool's job holds it until every
/// worker has left).
pub(crate) fn with_job_scratch<R>(scratch: Option<&Scratch>, slot: usize, f: impl FnOnce() -> R) -> R {
    let previous = JOB_SCRATCH.with(|c| c.replace(scratch.map(|s| (s as *const Scratch, slot))));
    let r = f();
    JOB_SCRATCH.with(|c| c.set(previous));
    r
}

/// Calls `f` with this thread's scratch home: the job's on a pool worker inside a job, else
/// the current arena's slot 0.
fn with_home<R>(f: impl FnOnce(Option<(&Scratch, usize)>) -> R) -> R {
    if let Some((ptr, slot)) = JOB_SCRATCH.with(std::cell::Cell::get) {
        // SAFETY: `with_job_scratch` set the pointer from a live `&Scratch` and clears it
        // before returning; its caller keeps that scratch alive until then, and this runs
        // inside it (on the same thread).
        return f(Some((unsafe { &*ptr }, slot)));
    }
    // `f` only takes or gives back a value under the slot's lock; it never reaches `CURRENT`
    // again, so the arena stays borrowed while it runs (no count traffic on the `Arc`).
    CURRENT.with(|c| match c.try_borrow_mut() {
        Ok(mut a) => f(Some((a.scratch.get_or_insert_with(Arc::default), 0))),
        Err(_) => f(None),
    })
}

/// Declares kinds of kernel scratch, each a doc comment, a name and the value it keeps:
/// `scratch_kinds! { /// The Winograd transforms. WinogradScratch: Vec<f32>; }` makes an
/// uninhabited marker type per kind and its [`ScratchKey`], for [`lend`].
#[macro_export]
macro_rules! scratch_kinds {
    ($( $(#[$meta:meta])* $name:ident: $value:ty; )*) => {
        $(
            $(#[$meta])*
            enum $name {}
            impl $crate::recycle::ScratchKey for $name {
                type Value = $value;
            }
        )*
    };
}

/// A kind of kernel scratch: a marker type naming one use (the Winograd transforms, a
/// depthwise ring of rows), and the value it keeps.
pub trait ScratchKey: 'static {
    type Value: Default + Send + 'static;
}

/// This thread's scratch value of kind `K` in the current run state, lent until the guard
/// drops (then kept for the next call on this thread of the run): the value the last call
/// left, else the default (see the module docs). The caller must not rely on its contents
/// (size it, overwrite what it reads). Outside a Session's run (a kernel called on its own,
/// compile-time folding) the thread's own arena keeps it, as it keeps recycled vectors.
pub fn lend<K: ScratchKey>() -> Lent<K> {
    let value = with_home(|home| match home {
        Some((scratch, slot)) => scratch.take::<K>(slot),
        None => Box::default(),
    });
    Lent {
        value: Some(value),
        _same_thread: std::marker::PhantomData,
    }
}

/// A scratch value lent by [`lend`]; given back when dropped, on the thread that borrowed
/// it (to the same home: a guard never outlives the job or run it was lent in).
pub struct Lent<K: ScratchKey> {
    value: Option<Box<K::Value>>,
    /// Not `Send`: the value goes back to this thread's home.
    _same_thread: std::marker::PhantomData<*const ()>,
}

impl<K: ScratchKey> std::ops::Deref for Lent<K> {
    type Target = K::Value;
    fn deref(&self) -> &K::Value {
        // Always `Some` until dropped.
        self.value
            .as_deref()
            .unwrap_or_else(|| unreachable!("a lent scratch value is present until dropped"))
    }
}

impl<K: ScratchKey> std::ops::DerefMut for Lent<K> {
    fn deref_mut(&mut self) -> &mut K::Value {
        self.value
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("a lent scratch value is present until dropped"))
    }
}

impl<K: ScratchKey> Drop for Lent<K> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            with_home(|home| {
                if let Some((scratch, slot)) = home {
                    scratch.put::<K>(slot, value);
                }
            });
        }
    }
}

/// Most addresses remembered between two [`finish_run`] calls (takes outside any run, such as
/// compile-time folding, never finish one); past it the record starts again.
const MAX_TAKEN: usize = 1 << 16;

thread_local! {
    static CURRENT: RefCell<Arena> = RefCell::new(Arena::default());
}

fn bytes_of<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field(
                "kept",
                &(self.f32s.kept.len()
                    + self.i64s.kept.len()
                    + self.bools.kept.len()
                    + self.u8s.kept.len()
                    + self.i8s.kept.len()),
            )
            .field("bytes", &self.bytes)
            .field("slab", &self.slab)
            .finish()
    }
}

impl Arena {
    pub fn new() -> Arena {
        Arena::default()
    }

    /// Bytes of the vectors kept now.
    pub fn kept_bytes(&self) -> usize {
        self.bytes
    }

    /// How many step outputs the last finished run placed at their planned ranges.
    pub fn placed_last_run(&self) -> usize {
        self.placed_last_run
    }

    /// Gives this arena a [`Slab`] of `bytes` bytes, keeping the one it has when its size
    /// matches; false when the block cannot be allocated. Its pages stay untouched (the
    /// system zeroes them on first write), so a block larger than any run needs costs address
    /// space only.
    pub fn prepare_slab(&mut self, bytes: usize) -> bool {
        if self.slab.as_ref().is_none_or(|s| s.bytes() != bytes) {
            self.slab = Slab::new(bytes);
        }
        self.slab.is_some()
    }

    /// The arena's block of planned tensors, if a run has made one.
    pub fn slab(&self) -> Option<&Slab> {
        self.slab.as_ref()
    }

    /// Makes this arena the thread's current one until the guard drops, then restores the
    /// previous one.
    pub fn enter(&mut self) -> Entered<'_> {
        let previous = CURRENT.with(|c| c.replace(std::mem::take(self)));
        Entered { home: self, previous }
    }

    fn put<T: Recycled>(&mut self, v: Vec<T>) {
        let b = bytes_of(&v);
        if v.capacity() < MIN_LEN || b > MAX_BYTES {
            return;
        }
        let mut bytes = self.bytes;
        let pool = T::pool(self);
        while bytes + b > MAX_BYTES && !pool.kept.is_empty() {
            let old = pool.kept.remove(0);
            bytes -= bytes_of(&old);
        }
        pool.kept.push(v);
        self.bytes = bytes + b;
    }

    /// The most recently kept vector with room for `n` elements but not more than twice that:
    /// the one likeliest still in cache, so the kernel writing it does not first fetch its lines
    /// from memory (measured: MobileNet-v2 9.6 -> 8.9 ms against smallest-first).
    fn best_fit<T: Recycled>(&mut self, n: usize) -> Option<Vec<T>> {
        let pool = T::pool(self);
        let best = pool
            .kept
            .iter()
            .enumerate()
            .rev()
            .find(|(_, v)| v.capacity() >= n && v.capacity() / 2 <= n.max(MIN_LEN))
            .map(|(i, _)| i)?;
        let v = pool.kept.remove(best);
        self.bytes -= bytes_of(&v);
        Some(v)
    }

    fn note_taken<T>(&mut self, v: &Vec<T>) {
        if v.capacity() >= MIN_LEN {
            if self.taken.len() >= MAX_TAKEN {
                self.taken.clear();
            }
            self.taken.insert(v.as_ptr() as usize);
        }
    }

    /// Drops every kept vector no take of this run handed out.
    fn keep_working_set(&mut self) {
        fn retain<T>(pool: &mut Pool<T>, taken: &HashSet<usize>) -> usize {
            pool.kept.retain(|v| taken.contains(&(v.as_ptr() as usize)));
            pool.kept.iter().map(bytes_of).sum()
        }
        let taken = &self.taken;
        self.bytes = retain(&mut self.f32s, taken)
            + retain(&mut self.i64s, taken)
            + retain(&mut self.bools, taken)
            + retain(&mut self.u8s, taken)
            + retain(&mut self.i8s, taken);
        // Cleared, not dropped: the set's storage serves the next run.
        self.taken.clear();
    }
}

/// The guard of [`Arena::enter`].
pub struct Entered<'a> {
    home: &'a mut Arena,
    previous: Arena,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        *self.home = CURRENT.with(|c| c.replace(std::mem::take(&mut self.previous)));
    }
}

/// Keeps `v` in the current arena for a later [`take`] (or drops it when too small).
pub fn give(v: Vec<f32>) {
    give_of(v)
}

/// [`give`] for any recycled element type.
pub fn give_of<T: Recycled>(v: Vec<T>) {
    CURRENT.with(|c| {
        if let Ok(mut a) = c.try_borrow_mut() {
            a.put(v);
        }
    });
}

/// A vector of `n` floats with unspecified (stale, but initialised) contents: the smallest
/// most recently kept vector with room for `n` and at most twice that, else a new zeroed one.
pub fn take(n: usize) -> Vec<f32> {
    take_of(n)
}

/// The first `len` elements of a scratch vector whose contents the caller overwrites before
/// reading: the vector only ever grows (zero-filling just the new tail). A thread-local
/// scratch shared by layers of different sizes is then not truncated by a small layer and
/// zero-filled again by the next large one: ResNet-50's first 56x56 Winograd layer re-zeroed
/// its 4 MiB of transforms every run that way (2.9 ms against 1.9 for its two twins).
pub fn scratch<T: Clone + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    v.get_mut(..len).unwrap_or_default()
}

/// [`scratch`] starting on a 64-byte boundary (a cache line), whatever `v`'s allocation
/// gives: `len` elements from the first such boundary of `v`, grown by up to a line.
pub fn scratch_lined<T: Clone + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    let extra = 64 / std::mem::size_of::<T>().clamp(1, 64);
    if v.len() < len + extra {
        v.resize(len + extra, T::default());
    }
    let off = v.as_ptr().align_offset(64).min(extra);
    v.get_mut(off..off + len).unwrap_or_default()
}

/// [`take`] for any recycled element type (new or grown elements are `T::default()`).
pub fn take_of<T: Recycled>(n: usize) -> Vec<T> {
    CURRENT.with(|c| {
        let Ok(mut a) = c.try_borrow_mut() else {
            return vec![T::default(); n];
        };
        let v = match a.best_fit::<T>(n) {
            Some(mut v) => {
                // Within capacity: never reallocates; only a tail beyond the old length is
                // written (with zeros).
                v.resize(n, T::default());
                v
            }
            None => vec![T::default(); n],
        };
        a.note_taken(&v);
        v
    })
}

/// [`Arena::prepare_slab`] on the current arena; false also when there is none, and then
/// [`take_planned`] finds nothing.
pub fn use_slab(bytes: usize) -> bool {
    CURRENT.with(|c| c.try_borrow_mut().is_ok_and(|mut a| a.prepare_slab(bytes)))
}

/// Sets (`Some((offset, bytes))`) or clears the planned place of the next step's output.
pub fn plan_output(planned: Option<(usize, usize)>) {
    CURRENT.with(|c| {
        if let Ok(mut a) = c.try_borrow_mut() {
            a.planned = planned;
        }
    });
}

/// The planned place of the running step's output as a region of `n` elements, when a
/// place of exactly that size is planned and free (it is then used up); else `None`, and
/// the caller takes an ordinary vector.
pub fn take_planned<T: SlabElem>(n: usize) -> Option<Region<T>> {
    CURRENT.with(|c| {
        let mut a = c.try_borrow_mut().ok()?;
        let (offset, bytes) = a.planned?;
        if n.checked_mul(std::mem::size_of::<T>()) != Some(bytes) {
            return None;
        }
        a.planned = None;
        let r = a.slab.as_ref()?.claim(offset, n)?;
        a.placed += 1;
        Some(r)
    })
}

/// Ends a run: the current arena keeps only the vectors taken since the last call.
pub fn finish_run() {
    CURRENT.with(|c| {
        if let Ok(mut a) = c.try_borrow_mut() {
            a.keep_working_set();
            a.planned = None;
            a.placed_last_run = std::mem::take(&mut a.placed);
        }
    });
}

/// Drops every vector kept by the current arena.
pub fn clear() {
    CURRENT.with(|c| {
        if let Ok(mut a) = c.try_borrow_mut() {
            a.f32s.kept.clear();
            a.i64s.kept.clear();
            a.bools.kept.clear();
            a.u8s.kept.clear();
            a.i8s.kept.clear();
            a.bytes = 0;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_back_best_fit_and_tiny_ones_are_not_kept() {
        clear();
        give(vec![1.0; 10_000]);
        give(vec![2.0; 5_000]);
        give(vec![3.0; 8]);
        give(vec![6.0; 100]);
        // 4 500 fits both large kept vectors; the smaller one is chosen, cut to length.
        let a = take(4_500);
        assert_eq!((a.len(), a[0]), (4_500, 2.0));
        // 6 000 fits only the 10 000 one (within 2x).
        let b = take(6_000);
        assert_eq!((b.len(), b[0]), (6_000, 1.0));
        // Nothing left: a fresh zeroed vector. A small vector (pooled features) is kept too,
        // but not one under MIN_LEN.
        assert_eq!(take(4_200), vec![0.0; 4_200]);
        assert_eq!(take(100), vec![6.0; 100]);
        assert_eq!(take(8), vec![0.0; 8]);
        // A vector more than twice the request is not handed out.
        give(vec![4.0; 20_000]);
        assert_eq!(take(5_000), vec![0.0; 5_000]);
        // A vector cut short earlier grows back within its capacity, the tail zeroed.
        let mut c = vec![5.0f32; 8_000];
        c.truncate(6_000);
        let cap = c.capacity();
        give(c);
        let d = take(7_000);
        assert_eq!(d.capacity(), cap, "the kept vector, not a new one");
        assert_eq!((d[5_999], d[6_000]), (5.0, 0.0));
        clear();
    }

    #[test]
    fn an_arena_keeps_only_the_working_set_of_its_last_run() {
        let mut arena = Arena::new();
        {
            let _run = arena.enter();
            let a = take(5_000); // fresh: part of the working set
            give(vec![7.0; 6_000]); // never taken: an input, say
            give(a);
            finish_run();
        }
        assert_eq!(arena.kept_bytes(), 5_000 * 4, "only the taken vector is kept");
        {
            let _run = arena.enter();
            let b = take(5_000);
            assert_eq!(b.capacity(), 5_000, "the kept vector comes back");
            let c = take(5_000); // a miss: a new vector
            give(b);
            give(c);
            finish_run();
        }
        assert_eq!(arena.kept_bytes(), 2 * 5_000 * 4);
        {
            let _run = arena.enter();
            let b = take(5_000);
            give(b);
            finish_run();
        }
        assert_eq!(arena.kept_bytes(), 5_000 * 4, "the vector no take asked for is dropped");
        // Outside a run, the thread's own arena is untouched by the session's.
        clear();
        give(vec![1.0; 4_096]);
        {
            let _run = arena.enter();
            assert_eq!(take(4_096), vec![0.0; 4_096], "the thread's vector is not visible");
        }
        assert_eq!(take(4_096), vec![1.0; 4_096], "and it is there again afterwards");
        clear();
    }

    enum Probe {}
    impl ScratchKey for Probe {
        type Value = Vec<u32>;
    }

    #[test]
    fn scratch_belongs_to_the_run_state_and_each_compute_thread() {
        // Outside a Session's run state, the thread's own arena keeps the value.
        lend::<Probe>().clear();
        lend::<Probe>().push(1);
        assert_eq!(*lend::<Probe>(), [1]);
        let mut arena = Arena::new();
        {
            let _run = arena.enter();
            assert!(
                lend::<Probe>().is_empty(),
                "a run state does not see the thread's value"
            );
            lend::<Probe>().push(7);
            // Kept for the next call; a nested request for the same kind gets its own value.
            let mut outer = lend::<Probe>();
            assert_eq!(*outer, [7]);
            assert!(lend::<Probe>().is_empty());
            outer.push(8);
        }
        {
            let _run = arena.enter();
            assert_eq!(*lend::<Probe>(), [7, 8], "kept by the arena between runs");
            // Pool workers use the run's scratch too, each its own slot: every task of a
            // two-thread job sees its thread's value, never the other's mid-use.
            let pool = crate::pool::ThreadPool::new(2).unwrap_or_else(|e| unreachable!("{e}"));
            let seen = std::sync::Mutex::new(Vec::new());
            pool.install(|| {
                crate::pool::parallel_for(2, &|t| {
                    let mut v = lend::<Probe>();
                    v.push(100 + t as u32);
                    seen.lock().unwrap_or_else(PoisonError::into_inner).push(v.len());
                })
            });
            let seen = seen.into_inner().unwrap_or_else(PoisonError::into_inner);
            assert_eq!(seen.len(), 2);
            // A task on the worker starts from its own empty slot (length 1 after its push); a
            // task on the caller from slot 0's [7, 8] (a descheduled worker may miss the job,
            // and the caller then runs both).
            let on_caller = seen.iter().filter(|&&n| n >= 3).count();
            assert!(seen.iter().all(|&n| n == 1 || n >= 3), "{seen:?}");
            assert_eq!(lend::<Probe>().len(), 2 + on_caller);
        }
        // Another arena (another run state) has its own values; the thread's is there again
        // once no run state is entered.
        let mut other = Arena::new();
        {
            let _run = other.enter();
            assert!(lend::<Probe>().is_empty());
        }
        assert_eq!(*lend::<Probe>(), [1]);
    }
}
