//! A global allocator for inference processes that keeps freed large blocks for reuse.
//!
//! Why: an inference allocates and frees the same large activation buffers on every run. The
//! system allocator returns such blocks to the OS (mmap/munmap, or trimming the heap), so the
//! next run page-faults every page again: measured on ResNet-50, about 10% of a run was page
//! faults, zeroing and the syscalls. [`CachingAlloc`] wraps the system allocator and keeps up
//! to [`MAX_BLOCKS`] freed blocks of at least [`MIN_BLOCK`] bytes (at most [`MAX_CACHED`]
//! bytes in all); an allocation of exactly such a size and alignment takes one back. Smaller
//! blocks go straight to the system allocator. When a freed block does not fit, the oldest
//! kept blocks make room (returned to the system): blocks freed once and never asked for
//! again (a compile's temporaries) must not pin the cache, or every run of a model whose
//! output is larger than what is left faults its pages in again (DeepLab-v3's 34 MB output:
//! 8,300 page faults, 15 ms of a 6 ms Resize, every run).
//!
//! Blocks of [`LINE_FROM`] bytes or more start on a 64-byte boundary (a cache line): the
//! system allocator puts a large block 16 bytes past a page, and the AMX tiles' 64-byte rows
//! of a tensor, its im2col copy or its packed weights then straddle two lines each, which
//! halved the integer products' speed (1.2 against 3.1 TOP/s in a C loop of the tiles).
//!
//! The kiln binary and the Python module install it (`#[global_allocator]`); a program
//! embedding the library chooses its own allocator. Peak memory does not grow beyond what a run needs at once plus
//! the cache's bound; blocks in the cache are resident (they were touched by the last run).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;

/// Smallest block kept for reuse (smaller ones are cheap for the system allocator).
pub const MIN_BLOCK: usize = 64 * 1024;
/// Most blocks kept at once.
pub const MAX_BLOCKS: usize = 128;
/// Most bytes kept at once.
pub const MAX_CACHED: usize = 512 * 1024 * 1024;
/// Smallest block aligned to a cache line (64 bytes) whatever its type asks for.
pub const LINE_FROM: usize = 4096;

/// The layout a block is really allocated with: at least 64-byte aligned from [`LINE_FROM`]
/// bytes on. A function of the caller's layout alone, so `alloc`, `realloc` and `dealloc`
/// agree on it.
fn lined(layout: Layout) -> Layout {
    if layout.size() >= LINE_FROM && layout.align() < 64 {
        // A size of at least LINE_FROM rounded up to a multiple of 64 stays far below
        // isize::MAX for any size the caller could have laid out; if it did not, the
        // caller's layout is kept.
        Layout::from_size_align(layout.size(), 64).unwrap_or(layout)
    } else {
        layout
    }
}

struct Cache {
    /// (pointer as address, size, align) of each kept block.
    blocks: [(usize, usize, usize); MAX_BLOCKS],
    len: usize,
    bytes: usize,
}

/// The caching allocator (see the module docs).
pub struct CachingAlloc {
    cache: Mutex<Cache>,
}

impl CachingAlloc {
    pub const fn new() -> CachingAlloc {
        CachingAlloc {
            cache: Mutex::new(Cache {
                blocks: [(0, 0, 0); MAX_BLOCKS],
                len: 0,
                bytes: 0,
            }),
        }
    }

    /// A kept block of exactly this layout, removed from the cache (the others keep their
    /// order, oldest first).
    fn take(&self, layout: Layout) -> Option<*mut u8> {
        if layout.size() < MIN_BLOCK {
            return None;
        }
        // A poisoned lock only means a panic elsewhere while holding it: the data is plain.
        let mut c = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let len = c.len;
        let i = c.blocks[..len]
            .iter()
            .rposition(|&(_, s, a)| s == layout.size() && a == layout.align())?;
        let (p, s, _) = c.blocks[i];
        c.blocks.copy_within(i + 1..len, i);
        c.len -= 1;
        c.bytes -= s;
        Some(p as *mut u8)
    }

    /// Keeps a freed block when it is large, first returning the oldest kept blocks to the
    /// system until it fits; false when the caller must free it (small, or larger than the
    /// whole cache).
    fn keep(&self, ptr: *mut u8, layout: Layout) -> bool {
        if layout.size() < MIN_BLOCK || layout.size() > MAX_CACHED {
            return false;
        }
        let mut evicted = [(0usize, 0usize, 0usize); MAX_BLOCKS];
        let mut n_evicted = 0;
        {
            let mut c = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            while c.len > 0 && (c.len == MAX_BLOCKS || c.bytes + layout.size() > MAX_CACHED) {
                let oldest = c.blocks[0];
                let len = c.len;
                c.blocks.copy_within(1..len, 0);
                c.len -= 1;
                c.bytes -= oldest.1;
                evicted[n_evicted] = oldest;
                n_evicted += 1;
            }
            let len = c.len;
            c.blocks[len] = (ptr as usize, layout.size(), layout.align());
            c.len += 1;
            c.bytes += layout.size();
        }
        // Freed outside the lock (munmap is a system call).
        for &(p, size, align) in &evicted[..n_evicted] {
            // SAFETY: a kept block was allocated by `System` with exactly this size and
            // alignment (a valid layout then), freed by the program, and is now out of the
            // cache: nothing refers to it.
            unsafe { System.dealloc(p as *mut u8, Layout::from_size_align_unchecked(size, align)) };
        }
        true
    }
}

impl Default for CachingAlloc {
    fn default() -> Self {
        CachingAlloc::new()
    }
}

// SAFETY: every block handed out is either fresh from `System` for the caller's layout as
// [`lined`] widens it (at least as aligned as asked) or a block `System` allocated for exactly
// that size and alignment earlier and that the program freed (so nothing else refers to it);
// every block returned to `System` was allocated by it with the layout passed back, since
// `lined` is a function of the caller's layout, which `dealloc` and `realloc` receive as
// `alloc` did. The cache's lock never allocates (a futex on Linux).
unsafe impl GlobalAlloc for CachingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let layout = lined(layout);
        match self.take(layout) {
            Some(p) => p,
            // SAFETY: the caller's contract (non-zero size) carries over.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let layout = lined(layout);
        match self.take(layout) {
            Some(p) => {
                // SAFETY: `p` is a block of `layout.size()` writable bytes (see above).
                unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
                p
            }
            // SAFETY: the caller's contract carries over.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let layout = lined(layout);
        if !self.keep(ptr, layout) {
            // SAFETY: `ptr` came from `System` with this layout (blocks are only ever created
            // by `System` and kept with their layout).
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.size() < LINE_FROM && new_size < LINE_FROM {
            // SAFETY: the caller's contract carries over; small blocks are always `System`'s,
            // with the caller's layout.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the caller guarantees `new_size` and the alignment form a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: `new_layout` has a non-zero size (the caller's contract).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks hold at least the smaller size; they are distinct blocks.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

/// A global allocator that forwards to the system allocator and counts what it hands out:
/// for tests and tools that check how much a piece of work allocates (a steady-state run
/// should take nothing but its outputs). Install with `#[global_allocator]`, read with
/// [`CountingAlloc::counts`].
pub struct CountingAlloc {
    calls: std::sync::atomic::AtomicUsize,
    bytes: std::sync::atomic::AtomicUsize,
    largest: std::sync::atomic::AtomicUsize,
}

/// Allocation calls, bytes requested and the largest single request, since some start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocCounts {
    pub calls: usize,
    pub bytes: usize,
    pub largest: usize,
}

impl CountingAlloc {
    pub const fn new() -> CountingAlloc {
        CountingAlloc {
            calls: std::sync::atomic::AtomicUsize::new(0),
            bytes: std::sync::atomic::AtomicUsize::new(0),
            largest: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The totals so far (`largest` since the last [`CountingAlloc::reset_largest`]).
    pub fn counts(&self) -> AllocCounts {
        use std::sync::atomic::Ordering::Relaxed;
        AllocCounts {
            calls: self.calls.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            largest: self.largest.load(Relaxed),
        }
    }

    pub fn reset_largest(&self) {
        self.largest.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// What `f` allocated on any thread meanwhile (the counters are global).
    pub fn measure<R>(&self, f: impl FnOnce() -> R) -> (R, AllocCounts) {
        let before = self.counts();
        self.reset_largest();
        let r = f();
        let after = self.counts();
        let taken = AllocCounts {
            calls: after.calls - before.calls,
            bytes: after.bytes - before.bytes,
            largest: after.largest,
        };
        (r, taken)
    }

    fn note(&self, size: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.calls.fetch_add(1, Relaxed);
        self.bytes.fetch_add(size, Relaxed);
        self.largest.fetch_max(size, Relaxed);
    }
}

impl Default for CountingAlloc {
    fn default() -> Self {
        CountingAlloc::new()
    }
}

// SAFETY: every call is forwarded unchanged to `System`; the counters are atomics and never
// allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note(layout.size());
        // SAFETY: the caller's contract carries over.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note(layout.size());
        // SAFETY: the caller's contract carries over.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` (through this wrapper) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note(new_size);
        // SAFETY: the caller's contract carries over.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks from LINE_FROM bytes on start on a 64-byte boundary whatever their type asks,
    /// fresh, reused or grown into (the system allocator puts large blocks 16 bytes past a
    /// page); contents survive growing across the threshold.
    #[test]
    fn large_blocks_start_on_cache_lines() {
        let a = CachingAlloc::new();
        let lay = |size: usize| Layout::from_size_align(size, 1).unwrap_or(Layout::new::<u8>());
        // SAFETY: non-zero layouts; every block is freed with its layout exactly once.
        unsafe {
            for size in [LINE_FROM, LINE_FROM + 5, 3 * MIN_BLOCK + 16, 1 << 22] {
                for _ in 0..2 {
                    let p = a.alloc(lay(size));
                    assert!(!p.is_null());
                    assert_eq!(p as usize % 64, 0, "{size} bytes at {p:?}");
                    a.dealloc(p, lay(size));
                }
                let z = a.alloc_zeroed(lay(size));
                assert_eq!(z as usize % 64, 0, "{size} bytes zeroed at {z:?}");
                a.dealloc(z, lay(size));
            }
            let s = a.alloc(lay(100));
            std::ptr::write_bytes(s, 5, 100);
            let g = a.realloc(s, lay(100), LINE_FROM * 3);
            assert_eq!(g as usize % 64, 0);
            assert!((0..100).all(|i| *g.add(i) == 5));
            let h = a.realloc(g, lay(LINE_FROM * 3), 50);
            assert!((0..50).all(|i| *h.add(i) == 5));
            a.dealloc(h, lay(50));
        }
    }

    #[test]
    fn large_blocks_are_reused_and_zeroed_small_ones_are_not_kept() {
        let a = CachingAlloc::new();
        let big = Layout::from_size_align(MIN_BLOCK * 2, 64).unwrap_or(Layout::new::<u8>());
        // SAFETY: non-zero layouts; every block is freed with its layout exactly once.
        unsafe {
            let p = a.alloc(big);
            assert!(!p.is_null());
            std::ptr::write_bytes(p, 7, big.size());
            a.dealloc(p, big);
            let q = a.alloc_zeroed(big);
            assert_eq!(p, q, "the kept block comes back");
            assert!((0..big.size()).all(|i| *q.add(i) == 0));
            // A different size is not served from it.
            let other = Layout::from_size_align(MIN_BLOCK * 3, 64).unwrap_or(big);
            a.dealloc(q, big);
            let r = a.alloc(other);
            assert_ne!(r, q);
            a.dealloc(r, other);
            let small = Layout::from_size_align(64, 8).unwrap_or(big);
            let s = a.alloc(small);
            a.dealloc(s, small);
            assert_eq!(a.cache.lock().map(|c| c.len).unwrap_or(0), 2);
            // Grow a small block into a large one: contents kept.
            let s = a.alloc(small);
            std::ptr::write_bytes(s, 3, 64);
            let g = a.realloc(s, small, MIN_BLOCK * 3);
            assert!((0..64).all(|i| *g.add(i) == 3));
            a.dealloc(g, other);
        }
    }

    /// A full cache makes room for a freed block by returning its oldest blocks, so blocks
    /// freed once cannot keep a block freed every run out.
    #[test]
    fn a_full_cache_evicts_its_oldest_blocks() {
        let a = CachingAlloc::new();
        let size = |i: usize| MIN_BLOCK + 64 * i;
        let layout = |i: usize| Layout::from_size_align(size(i), 64).unwrap_or(Layout::new::<u8>());
        // SAFETY: non-zero layouts; every block is freed with its layout exactly once (the
        // cache returns evicted ones to the system itself).
        unsafe {
            let blocks: Vec<*mut u8> = (0..MAX_BLOCKS).map(|i| a.alloc(layout(i))).collect();
            for (i, &p) in blocks.iter().enumerate() {
                a.dealloc(p, layout(i));
            }
            assert_eq!(a.cache.lock().map(|c| c.len).unwrap_or(0), MAX_BLOCKS);
            // One more freed block: the oldest (size 0) leaves, the newcomer stays.
            let late = layout(MAX_BLOCKS);
            let p = System.alloc(late);
            a.dealloc(p, late);
            let c = a
                .cache
                .lock()
                .map(|c| (c.len, c.blocks[0].1, c.blocks[MAX_BLOCKS - 1].1));
            assert_eq!(c.unwrap_or_default(), (MAX_BLOCKS, size(1), size(MAX_BLOCKS)));
            assert_eq!(a.alloc(late), p, "the newest block is served");
            a.dealloc(p, late);
            // A block larger than the whole cache is never kept.
            let huge = Layout::from_size_align(MAX_CACHED + 64, 64).unwrap_or(late);
            assert!(!a.keep(std::ptr::null_mut(), huge));
            // Drain: everything kept goes back to the system.
            for i in 1..=MAX_BLOCKS {
                let q = a.alloc(layout(i));
                System.dealloc(q, layout(i));
            }
        }
    }

    #[test]
    fn counting_counts_every_request() {
        let a = CountingAlloc::new();
        let l = Layout::from_size_align(1000, 8).unwrap_or(Layout::new::<u8>());
        // SAFETY: a non-zero layout, freed once with the layout it was made with.
        let ((), c) = a.measure(|| unsafe {
            let p = a.alloc(l);
            let q = a.realloc(p, l, 3000);
            a.dealloc(q, Layout::from_size_align(3000, 8).unwrap_or(l));
        });
        assert_eq!(
            c,
            AllocCounts {
                calls: 2,
                bytes: 4000,
                largest: 3000
            }
        );
    }
}
