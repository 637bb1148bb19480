//! The global allocator: the system's, with transparent huge pages asked for on large buffers
//! that their owner is about to write in full.
//!
//! Glibc serves every allocation of 32 MiB or more with a mapping of its own and unmaps it on
//! free, so a full-batch epoch that allocates its layer matrices (hundreds of MB each) faults
//! every 4 KiB page of them in again, and the kernel zeroes each: on a 1M-vertex graph about
//! a fifth of the epoch (`benchmarks/results/allocator-2026-12-06.md`). Asking for huge pages
//! (`madvise(MADV_HUGEPAGE)`) makes that one fault per 2 MiB.
//!
//! Two rules choose the blocks:
//! - Only uninitialised allocations (`alloc`). Their owner writes every element before
//!   reading one (reading an unwritten one would be undefined behaviour), so every huge page
//!   a fault zeroes is used. A zeroed allocation (`alloc_zeroed`) may be written sparsely (a
//!   table of zeros with a few rows scattered in), and a huge page zeroes 2 MiB for each
//!   touched byte; such blocks, and grown ones (`realloc`), keep the system's pages.
//! - Only sizes freed before (the last [`RECENT`] large frees are remembered). A size that
//!   comes back is a per-step buffer, faulted in again every step: that is where 4 KiB
//!   faults cost. A block allocated once is left alone, because the first touch of a huge
//!   page can cost more than the small pages it replaces: on a virtual machine whose host
//!   backs the guest's memory lazily (the 2-core Firecracker VM of
//!   `allocator-2026-12-06.md`), a 424 MB table gathered once took 3× as long on huge pages.
//!
//! `GNNPAR_HUGE_PAGES=off` turns it off; the kernel's own setting
//! (`/sys/kernel/mm/transparent_hugepage/enabled`: `never`) also does.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// Allocations of at least this many bytes are advised: glibc's largest `mmap` threshold, so
/// each such block is a mapping of its own that no other block shares.
pub const HUGE_MIN_BYTES: usize = 32 << 20;

const UNKNOWN: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

/// Set by a binary that installs [`HugePageAlloc`] as its global allocator (the library
/// cannot tell which allocator its host program installed).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether advising is on: read from the environment at the first large allocation.
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// How many recent large frees are remembered: more than the distinct large buffers of one
/// training step.
pub const RECENT: usize = 64;

/// The sizes of the last [`RECENT`] freed large blocks (0: none yet), written round-robin.
/// Races only lose or duplicate an entry, which costs at most one unadvised block.
static FREED: [AtomicUsize; RECENT] = [const { AtomicUsize::new(0) }; RECENT];
static NEXT_FREED: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, advising huge pages for large uninitialised blocks.
pub struct HugePageAlloc;

// SAFETY: every call is forwarded to `System` with the same arguments; `madvise` only changes
// how the kernel backs pages inside a block `System` just returned.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if layout.size() >= HUGE_MIN_BYTES
            && !ptr.is_null()
            && freed_before(layout.size())
            && enabled()
        {
            advise(ptr, layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= HUGE_MIN_BYTES {
            let slot = NEXT_FREED.fetch_add(1, Ordering::Relaxed) % RECENT;
            FREED[slot].store(layout.size(), Ordering::Relaxed);
        }
        System.dealloc(ptr, layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        System.realloc(ptr, layout, new_size)
    }
}

/// Whether a block of `size` bytes was among the last [`RECENT`] large ones freed.
fn freed_before(size: usize) -> bool {
    FREED.iter().any(|s| s.load(Ordering::Relaxed) == size)
}

/// Whether large blocks are advised (`GNNPAR_HUGE_PAGES` is not `off`, `0`, `false` or `no`).
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = read_setting();
            STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
            on
        }
    }
}

/// `GNNPAR_HUGE_PAGES`, read without allocating (this runs inside the allocator).
fn read_setting() -> bool {
    // SAFETY: a NUL-terminated name; the value, if any, is a C string owned by the environment.
    let value = unsafe { libc::getenv(c"GNNPAR_HUGE_PAGES".as_ptr()) };
    if value.is_null() {
        return true;
    }
    // SAFETY: `getenv` returned a valid C string.
    let value = unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes();
    !matches!(value, b"off" | b"0" | b"false" | b"no")
}

/// Ask for huge pages on the whole pages inside `[ptr, ptr + len)`.
fn advise(ptr: *mut u8, len: usize) {
    const PAGE: usize = 4096;
    let start = (ptr as usize).next_multiple_of(PAGE);
    let end = (ptr as usize + len) / PAGE * PAGE;
    if end > start {
        // SAFETY: the range lies inside a block just allocated; a failure (a kernel without
        // transparent huge pages) leaves the block on ordinary pages, which is what it asks.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// Record that this process allocates through [`HugePageAlloc`] (called by `main`).
pub fn mark_installed() {
    INSTALLED.store(true, Ordering::Relaxed);
}

/// One line for the log: which pages large per-step buffers get, and why.
pub fn describe() -> String {
    if !INSTALLED.load(Ordering::Relaxed) {
        return "the host program's allocator (no huge-page advice)".to_string();
    }
    if !enabled() {
        return "4 KiB pages (GNNPAR_HUGE_PAGES turns huge pages off)".to_string();
    }
    match kernel_mode().as_deref() {
        None => "4 KiB pages (this kernel has no transparent huge pages)".to_string(),
        Some("never") => {
            "4 KiB pages (the kernel's transparent huge pages are set to `never`)".to_string()
        }
        Some("always") => "transparent huge pages for every large region (the kernel's mode is \
                           `always`, so the advice on per-step buffers changes nothing)"
            .to_string(),
        Some(mode) => format!(
            "transparent huge pages for per-step buffers of {} MiB or more (kernel mode `{mode}`; \
             GNNPAR_HUGE_PAGES=off turns it off)",
            HUGE_MIN_BYTES >> 20
        ),
    }
}

/// The kernel's transparent-huge-page mode (`always`, `madvise` or `never`), or `None` where
/// the kernel has none; for the log.
pub fn kernel_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `VmFlags` of the mapping of `/proc/self/smaps` that holds `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.trim().to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    fn advised(ptr: *mut u8) -> bool {
        // A page inside the block: the block's first bytes may share a page with its header.
        vm_flags(ptr as usize + 8192)
            .split_whitespace()
            .any(|f| f == "hg")
    }

    /// Whether this kernel accepts `MADV_HUGEPAGE` on an anonymous mapping of this process (a
    /// kernel without THP, or a process with THP disabled by `prctl`, refuses it).
    fn kernel_takes_the_advice() -> bool {
        const LEN: usize = 4 << 20;
        // SAFETY: a private anonymous mapping, advised and unmapped here.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return false;
            }
            let ok = libc::madvise(p, LEN, libc::MADV_HUGEPAGE) == 0;
            libc::munmap(p, LEN);
            ok
        }
    }

    #[test]
    fn a_large_block_gets_huge_pages_when_its_size_comes_back_uninitialised() {
        if kernel_mode().is_none() || !enabled() || !kernel_takes_the_advice() {
            crate::util::skip::skipped(
                crate::util::skip::SkipKind::Other,
                "huge_pages",
                "no transparent huge pages here (kernel, prctl or GNNPAR_HUGE_PAGES)",
            );
            return;
        }
        // A size no other test allocates, so that only this test's frees count.
        let layout = Layout::from_size_align(HUGE_MIN_BYTES + 3 * 4096 + 40, 64).unwrap();
        let small = Layout::from_size_align(HUGE_MIN_BYTES - 4096, 64).unwrap();
        // SAFETY: each block is freed with the layout it was allocated with.
        unsafe {
            // The blocks that must not be advised come first. Once a block has been advised
            // and freed, a later block may land on the same pages with the advice still on
            // them, where the allocator kept them mapped: a zeroed block allocated right
            // after an advised one was freed carried its `hg` once in the suite.
            let first = HugePageAlloc.alloc(layout);
            assert!(!first.is_null());
            assert!(
                !advised(first),
                "a size seen for the first time keeps 4 KiB pages"
            );
            HugePageAlloc.dealloc(first, layout);

            let zeroed = HugePageAlloc.alloc_zeroed(layout);
            assert!(
                !advised(zeroed),
                "a zeroed block may be written sparsely: 4 KiB pages"
            );
            assert_eq!(*zeroed.add(layout.size() - 1), 0);
            HugePageAlloc.dealloc(zeroed, layout);

            let below = HugePageAlloc.alloc(small);
            HugePageAlloc.dealloc(below, small);
            let below = HugePageAlloc.alloc(small);
            assert!(
                !advised(below),
                "below the threshold, glibc's heap: not advised"
            );
            HugePageAlloc.dealloc(below, small);

            let again = HugePageAlloc.alloc(layout);
            assert!(
                advised(again),
                "a size freed before is a per-step buffer: huge pages"
            );
            HugePageAlloc.dealloc(again, layout);
        }
    }
}
