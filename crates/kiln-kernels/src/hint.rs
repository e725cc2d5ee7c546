//! Cache hints: ask for the line holding an address to be fetched. Only hints: nothing is
//! read or written, any address is allowed (form it with wrapping arithmetic), none faults.
//! A no-op off x86-64.

/// Asks for the line at `p` in L1.
#[inline]
pub(crate) fn to_l1<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for the line at `p` in L2.
#[inline]
pub(crate) fn to_l2<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
