//! Cache prefetch hints: start loading memory that a loop will read soon, so that several
//! cache misses are in flight at once instead of one at a time.

/// Ask the CPU to load the cache line holding `p` into L1. A hint only: it never faults,
/// whatever the address, and does nothing off x86-64.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, for any address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// [`prefetch`] every 64-byte line of the `len` elements starting at `p`.
#[inline(always)]
pub fn prefetch_span<T>(p: *const T, len: usize) {
    let bytes = len * std::mem::size_of::<T>();
    for off in (0..bytes).step_by(64) {
        prefetch(p.cast::<u8>().wrapping_add(off));
    }
}
