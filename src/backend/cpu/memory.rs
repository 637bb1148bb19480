//! Keep freed memory in the process instead of returning it to the kernel.
//!
//! Training allocates the same large matrices at every mini-batch (gathered features, layer
//! outputs, gradients). glibc serves blocks above 128 KiB–32 MiB with a fresh `mmap` and
//! unmaps them on `free`, and trims the heap top; the next step then faults every page in
//! again. On the VMs we measured, filling new pages runs at 1–4 GB/s and page faults took a
//! third of a Tolokers epoch. With mmap disabled for allocations and heap trimming off, freed
//! blocks are reused by the next step's allocations of the same sizes.
//!
//! The cost is that the resident set stays at its high-water mark (it does not shrink after
//! a peak), which is what a training process wants anyway.

use std::sync::Once;

static TUNED: Once = Once::new();

/// Configure the allocator as described above (once per process; later calls do nothing).
/// Only glibc is tuned; other C libraries are left alone.
pub fn keep_freed_memory() {
    TUNED.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes allocator parameters; both are valid settings.
        unsafe {
            // Serve every allocation from the heaps, never from a private mmap.
            libc::mallopt(libc::M_MMAP_MAX, 0);
            // Never give the top of the heap back (the largest value mallopt accepts).
            libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
        }
    });
}
