//! How many times the host called the device, by kind: [`Counted`] wraps any [`Gpu`] and counts
//! every call on its way through.
//!
//! A mini-batch step on a GPU is often bound by the host, not by the kernels: each launch,
//! allocation or copy costs microseconds of driver time on the host thread, and every download
//! or synchronize makes the host wait until the device has drained its queue, so the next
//! step's work cannot be queued behind the current one. Counted per step, these calls say what
//! a step costs the host without timing it: the emulator (tests, CI) counts the very calls a
//! GPU would receive, so a change that adds a launch or a blocking download to every step
//! shows in a test where there is no GPU.

use super::gpu::{DevPtr, Gpu, KernelArg, Launch, Sgemm};
use anyhow::Result;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Defines [`DeviceCalls`] and its live counterpart [`CallCounter`] over one list of kinds, so
/// that a kind is named once and every method covers it.
macro_rules! call_kinds {
    ($($(#[$doc:meta])* $kind:ident),* $(,)?) => {
        /// Calls of each kind made so far (or between two snapshots, [`DeviceCalls::since`]).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct DeviceCalls {
            $($(#[$doc])* pub $kind: u64,)*
        }

        impl DeviceCalls {
            /// The calls made after `before` (a snapshot of the same counter) until `self`.
            pub fn since(&self, before: &DeviceCalls) -> DeviceCalls {
                DeviceCalls { $($kind: self.$kind - before.$kind,)* }
            }

            /// Add `other`'s counts.
            pub fn add(&mut self, other: &DeviceCalls) {
                $(self.$kind += other.$kind;)*
            }

            /// Each kind's count divided by `steps` (at least 1), by name.
            pub fn per_step(&self, steps: u64) -> std::collections::BTreeMap<&'static str, f64> {
                let per = |n: u64| n as f64 / steps.max(1) as f64;
                [$((stringify!($kind), self.$kind)),*]
                    .into_iter()
                    .map(|(k, n)| (k, per(n)))
                    .collect()
            }
        }

        /// The live counters behind [`DeviceCalls`], shared by a device's clones.
        #[derive(Debug, Default)]
        pub struct CallCounter {
            $($kind: AtomicU64,)*
        }

        impl CallCounter {
            /// The counts so far.
            pub fn snapshot(&self) -> DeviceCalls {
                DeviceCalls { $($kind: self.$kind.load(Ordering::Relaxed),)* }
            }
        }
    };
}

call_kinds! {
    /// Kernels launched.
    launches,
    /// cuBLAS products.
    gemms,
    /// Host → device copies.
    uploads,
    /// Device → host copies: each waits for the work queued before it (a synchronisation).
    downloads,
    /// Explicit synchronisations of the stream.
    synchronizes,
    /// Device allocations (stream-ordered from a pool where the device has one).
    allocs,
    /// Device frees.
    frees,
    /// Memsets to zero.
    fills,
    /// Device-to-device copies.
    copies,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A [`Gpu`] that counts every call into `calls` and passes it on to `inner`.
pub struct Counted {
    inner: Arc<dyn Gpu>,
    calls: Arc<CallCounter>,
}

impl Counted {
    pub fn new(inner: Arc<dyn Gpu>, calls: Arc<CallCounter>) -> Counted {
        Counted { inner, calls }
    }
}

impl Gpu for Counted {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        bump(&self.calls.allocs);
        self.inner.alloc(bytes)
    }

    unsafe fn free(&self, ptr: DevPtr, bytes: usize) {
        bump(&self.calls.frees);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.inner.free(ptr, bytes) }
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        if !src.is_empty() {
            bump(&self.calls.uploads);
        }
        self.inner.upload(dst, src)
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        if !dst.is_empty() {
            bump(&self.calls.downloads);
        }
        self.inner.download(src, dst)
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        bump(&self.calls.copies);
        self.inner.copy(dst, src, bytes)
    }

    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        bump(&self.calls.fills);
        self.inner.zero(dst, bytes)
    }

    fn launch(&self, name: &str, launch: Launch, args: &[KernelArg]) -> Result<()> {
        bump(&self.calls.launches);
        self.inner.launch(name, launch, args)
    }

    fn sgemm(&self, g: &Sgemm) -> Result<()> {
        bump(&self.calls.gemms);
        self.inner.sgemm(g)
    }

    fn synchronize(&self) -> Result<()> {
        bump(&self.calls.synchronizes);
        self.inner.synchronize()
    }

    fn total_memory(&self) -> Option<usize> {
        self.inner.total_memory()
    }

    fn is_emulated(&self) -> bool {
        self.inner.is_emulated()
    }

    fn blocked_seconds(&self) -> f64 {
        self.inner.blocked_seconds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::emu::emu_device_for_tests;
    use crate::backend::cuda::kernels::SOURCES;

    #[test]
    fn every_call_through_a_device_is_counted_by_kind() {
        let device = emu_device_for_tests(SOURCES).expect("the emulator builds");
        let before = device.calls.snapshot();
        let buf = device.upload(&[1.0f32, 2.0, 3.0]).unwrap();
        let _: Vec<f32> = buf.download().unwrap();
        device.gpu.zero(buf.ptr(), 4).unwrap();
        device.gpu.synchronize().unwrap();
        drop(buf);
        let calls = device.calls.snapshot().since(&before);
        let want = DeviceCalls {
            uploads: 1,
            downloads: 1,
            synchronizes: 1,
            allocs: 1,
            frees: 1,
            fills: 1,
            ..DeviceCalls::default()
        };
        assert_eq!(calls, want);
        let mut twice = calls;
        twice.add(&calls);
        assert_eq!(twice.per_step(2)["uploads"], 1.0);
        assert_eq!(twice.per_step(0)["frees"], 2.0, "no steps counts as one");
    }
}
