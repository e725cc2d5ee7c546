//! The run arena of the memory plan: one 64-byte aligned block per run state, in which each
//! planned tensor of a run takes the byte range the compiler assigned it.
//!
//! A [`Region`] is a claimed range of a [`Slab`], typed as elements of a plain numeric type.
//! It behaves like an owned vector of fixed length: `&[T]` and `&mut [T]` through it, its
//! claim released when it drops. The slab keeps the list of live claims and refuses a claim
//! that overlaps one of them, is out of bounds or misaligned, so two regions never alias
//! whatever plan the caller follows: a wrong plan costs a fallback to an ordinary vector,
//! never a wrong result.
//!
//! The block is allocated zeroed, so a region's contents are always initialised (stale values
//! of an earlier tensor, like the recycled vectors of [`crate::recycle`]).

use std::alloc::Layout;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

/// Alignment of the block, and so of every planned offset (the compiler plans at 64 bytes).
pub const SLAB_ALIGN: usize = 64;

/// Largest block a slab allocates (the bound on a program's planned arena).
pub const MAX_SLAB_BYTES: usize = 1 << 33;

/// Element types a region may hold: plain numbers, for which every bit pattern (zero
/// included) is a valid value.
pub trait SlabElem: Copy + Send + Sync + 'static {}
impl SlabElem for f32 {}
impl SlabElem for i64 {}
impl SlabElem for u8 {}
impl SlabElem for i8 {}

struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Live claims as byte ranges `[start, end)`.
    claims: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: the block is plain memory owned by this struct; all access to its bytes goes through
// regions, whose byte ranges the claim list (behind a mutex) keeps disjoint, so a region's
// `&mut [T]` never aliases another's, on any thread.
unsafe impl Send for Block {}
// SAFETY: as for `Send`: shared references to a block only read `ptr`/`layout` and lock
// `claims`.
unsafe impl Sync for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with `layout` and is freed once, here; every
        // region holds an `Arc` of the block, so none outlives it.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One run state's block of planned tensor memory (cheap to clone: shared).
#[derive(Clone)]
pub struct Slab {
    block: Arc<Block>,
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slab")
            .field("bytes", &self.bytes())
            .field("claims", &self.live_claims())
            .finish()
    }
}

impl Slab {
    /// A zeroed block of `bytes` bytes, or `None` when `bytes` is 0, above
    /// [`MAX_SLAB_BYTES`] or the allocation fails.
    pub fn new(bytes: usize) -> Option<Slab> {
        if bytes == 0 || bytes > MAX_SLAB_BYTES {
            return None;
        }
        let layout = Layout::from_size_align(bytes, SLAB_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(Slab {
            block: Arc::new(Block {
                ptr,
                layout,
                claims: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Size of the block in bytes.
    pub fn bytes(&self) -> usize {
        self.block.layout.size()
    }

    /// Regions of this slab alive now.
    pub fn live_claims(&self) -> usize {
        self.block.claims.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The `len` elements at byte `offset`, claimed until the region drops; `None` when the
    /// range is empty, out of the block, misaligned for `T` or overlaps a live region.
    pub fn claim<T: SlabElem>(&self, offset: usize, len: usize) -> Option<Region<T>> {
        let size = len.checked_mul(std::mem::size_of::<T>())?;
        let end = offset.checked_add(size)?;
        if size == 0 || end > self.bytes() || !offset.is_multiple_of(std::mem::align_of::<T>()) {
            return None;
        }
        let mut claims = self.block.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if claims.iter().any(|&(s, e)| offset < e && s < end) {
            return None;
        }
        claims.push((offset, end));
        Some(Region {
            block: Arc::clone(&self.block),
            start: offset,
            len,
            _elem: PhantomData,
        })
    }

    /// Whether `region` lies in this slab.
    pub fn holds<T>(&self, region: &Region<T>) -> bool {
        Arc::ptr_eq(&self.block, &region.block)
    }
}

/// A claimed range of a [`Slab`] holding `len` elements of `T`; the claim ends when it drops.
/// Only [`Slab::claim`] makes one, for `T: SlabElem`.
pub struct Region<T> {
    block: Arc<Block>,
    /// Byte offset in the block.
    start: usize,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T> Region<T> {
    /// Byte offset of the region in its slab.
    pub fn offset(&self) -> usize {
        self.start
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `claim` (the only constructor, which requires `T: SlabElem`) checked that
        // `len` elements from `start` lie in the block and are aligned for `T`; the block is
        // initialised (zeroed at allocation, written only as `T`s since) and every bit pattern
        // is a valid `T`; the claim keeps other regions off these bytes while this one lives,
        // and `&self` excludes writes through this one.
        unsafe { std::slice::from_raw_parts(self.block.ptr.as_ptr().add(self.start).cast::<T>(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only access to the range.
        unsafe { std::slice::from_raw_parts_mut(self.block.ptr.as_ptr().add(self.start).cast::<T>(), self.len) }
    }
}

impl<T> Drop for Region<T> {
    fn drop(&mut self) {
        let mut claims = self.block.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = claims.iter().position(|&(s, _)| s == self.start) {
            claims.swap_remove(i);
        }
    }
}

// SAFETY: a region is an exclusive handle on its bytes (like a `Vec<T>`): moving it to another
// thread moves that exclusivity, and `T: Send` for every type `claim` accepts.
unsafe impl<T: Send> Send for Region<T> {}
// SAFETY: `&Region` only gives `&[T]`, which is `Sync` for `T: Sync`.
unsafe impl<T: Sync> Sync for Region<T> {}

impl<T> std::fmt::Debug for Region<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("offset", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn claims_never_overlap_and_end_when_regions_drop() {
        let slab = Slab::new(1024).unwrap();
        let mut a = slab.claim::<f32>(0, 64).unwrap();
        assert!(slab.claim::<f32>(128, 64).is_none(), "overlaps a's last bytes");
        assert!(slab.claim::<f32>(0, 1).is_none(), "same start");
        let mut b = slab.claim::<f32>(256, 64).unwrap();
        a.as_mut_slice().fill(1.5);
        b.as_mut_slice().fill(-2.0);
        assert!(
            a.iter_eq(1.5) && b.iter_eq(-2.0),
            "disjoint ranges keep their own values"
        );
        assert_eq!(slab.live_claims(), 2);
        drop(a);
        assert_eq!(slab.live_claims(), 1);
        let c = slab.claim::<f32>(128, 32).unwrap();
        assert_eq!(
            c.as_slice(),
            &[1.5; 32][..],
            "stale values of the earlier region, initialised"
        );
        assert_eq!(c.offset(), 128);
        assert!(slab.holds(&c));
    }

    #[test]
    fn out_of_bounds_misaligned_and_empty_claims_are_refused() {
        let slab = Slab::new(256).unwrap();
        assert!(slab.claim::<f32>(0, 65).is_none(), "257 bytes");
        assert!(slab.claim::<f32>(usize::MAX - 2, 1).is_none(), "offset overflow");
        assert!(slab.claim::<f32>(0, usize::MAX).is_none(), "size overflow");
        assert!(slab.claim::<i64>(4, 2).is_none(), "4 is not 8-aligned");
        assert!(slab.claim::<f32>(0, 0).is_none(), "empty");
        let fresh = slab.claim::<i64>(192, 8).unwrap();
        assert_eq!(fresh.as_slice(), &[0i64; 8][..], "a new block is zeroed");
        assert!(Slab::new(0).is_none());
        assert!(Slab::new(MAX_SLAB_BYTES + 1).is_none());
    }

    #[test]
    fn regions_outlive_their_slab_handle_and_cross_threads() {
        let slab = Slab::new(4096).unwrap();
        let mut r = slab.claim::<f32>(64, 100).unwrap();
        drop(slab);
        r.as_mut_slice()[99] = 7.0;
        let sum = std::thread::spawn(move || r.as_slice().iter().sum::<f32>())
            .join()
            .unwrap();
        assert_eq!(sum, 7.0);
    }

    impl Region<f32> {
        fn iter_eq(&self, v: f32) -> bool {
            self.as_slice().iter().all(|&x| x == v)
        }
    }
}
