//! Recycled f32 buffers for kernel outputs. The runtime gives back the vectors of the f32
//! tensors it frees ([`give`]); an op whose kernel writes every element of its output takes
//! one ([`take`]) instead of allocating a zeroed vector, so a run in steady state neither
//! allocates nor clears its large intermediates: the buffers of the previous layers are reused
//! while they are still warm in cache.
//!
//! A taken vector holds stale values from its previous use (never uninitialised memory: this
//! is plain safe Rust), so only callers that overwrite all of it may use it. The pool is per
//! thread (a run frees and allocates on its own thread) and bounded in count; vectors smaller
//! than [`MIN_FLOATS`] are not kept (zeroing them is cheap).

use std::cell::RefCell;

/// Smallest vector kept: 16 KiB.
pub const MIN_FLOATS: usize = 4096;
/// Vectors kept per thread; the oldest go first.
const MAX_KEPT: usize = 32;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Keeps `v` for a later [`take`] on this thread (or drops it when too small or the pool is
/// full).
pub fn give(v: Vec<f32>) {
    if v.len() < MIN_FLOATS {
        return;
    }
    FREE.with(|f| {
        if let Ok(mut f) = f.try_borrow_mut() {
            if f.len() >= MAX_KEPT {
                f.remove(0);
            }
            f.push(v);
        }
    });
}

/// A vector of `n` floats with unspecified (stale, but initialised) contents: the smallest
/// kept vector of at least `n` and at most `2n` floats, cut to `n`, else a new zeroed one.
pub fn take(n: usize) -> Vec<f32> {
    if n >= MIN_FLOATS {
        let found = FREE.with(|f| {
            let mut f = f.try_borrow_mut().ok()?;
            let best = f
                .iter()
                .enumerate()
                .filter(|(_, v)| v.len() >= n && v.len() / 2 <= n)
                .min_by_key(|(_, v)| v.len())
                .map(|(i, _)| i)?;
            Some(f.swap_remove(best))
        });
        if let Some(mut v) = found {
            v.truncate(n);
            return v;
        }
    }
    vec![0.0; n]
}

/// Drops every kept vector of this thread.
pub fn clear() {
    FREE.with(|f| {
        if let Ok(mut f) = f.try_borrow_mut() {
            f.clear();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_back_best_fit_and_small_ones_are_not_kept() {
        clear();
        give(vec![1.0; 10_000]);
        give(vec![2.0; 5_000]);
        give(vec![3.0; 100]);
        // 4 500 fits both kept vectors; the smaller one is chosen, cut to length.
        let a = take(4_500);
        assert_eq!((a.len(), a[0]), (4_500, 2.0));
        // 6 000 fits only the 10 000 one (within 2x).
        let b = take(6_000);
        assert_eq!((b.len(), b[0]), (6_000, 1.0));
        // Nothing left: a fresh zeroed vector; small requests always are.
        assert_eq!(take(4_200), vec![0.0; 4_200]);
        assert_eq!(take(100), vec![0.0; 100]);
        // A vector more than twice the request is not handed out.
        give(vec![4.0; 20_000]);
        assert_eq!(take(5_000), vec![0.0; 5_000]);
        clear();
    }

    #[test]
    fn the_pool_is_bounded() {
        clear();
        for i in 0..(MAX_KEPT + 5) {
            give(vec![i as f32; MIN_FLOATS]);
        }
        let mut seen = Vec::new();
        for _ in 0..(MAX_KEPT + 5) {
            let v = take(MIN_FLOATS);
            seen.push(v[0]);
        }
        // The oldest five were dropped; the rest come back, then zeroed ones.
        let kept: Vec<f32> = seen.iter().copied().filter(|&v| v >= 5.0).collect();
        assert_eq!(kept.len(), MAX_KEPT);
        assert_eq!(seen.iter().filter(|&&v| v == 0.0).count(), 5);
        clear();
    }
}
