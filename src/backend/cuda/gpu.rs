//! The device as the CUDA backend sees it: memory, copies, kernel launches by name and the one
//! cuBLAS product it needs, behind the [`Gpu`] trait. Two implementations:
//!
//! * [`super::driver::DriverGpu`]: a real GPU through cudarc (driver API), NVRTC and cuBLAS;
//! * [`super::emu::EmuGpu`]: the same `cuda/*.cu` kernels compiled for the CPU with a small
//!   emulation header, "device" memory on the host, and a column-major SGEMM with cuBLAS's
//!   semantics.
//!
//! Everything above this trait (the kernel wrappers, the backend's ops, the model on the device)
//! is written once and runs on both, so the CUDA backend's logic is tested in CI, where there is
//! no GPU; only the thin driver implementation needs a GPU to run.
//!
//! Device memory is addressed by raw device pointers ([`DevPtr`]); [`DevBuf`] owns an allocation
//! and frees it on drop. Operations are ordered on one stream per [`Gpu`]: an upload, a launch
//! and a download issued in that order happen in that order.

use super::calls::{CallCounter, Counted};
use anyhow::Result;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A device address (a `CUdeviceptr` on a GPU, a host address in the emulator).
pub type DevPtr = u64;

/// One kernel parameter, passed by value as `cuLaunchKernel` passes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A pointer into device memory.
    Ptr(DevPtr),
    I32(i32),
    U32(u32),
    U64(u64),
    F32(f32),
}

/// Grid and block shape of a launch, and its dynamic shared memory in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl Launch {
    /// A 1-D launch of `blocks` blocks of `threads` threads.
    pub fn blocks(blocks: u32, threads: u32) -> Launch {
        Launch {
            grid: (blocks.max(1), 1, 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        }
    }

    /// Enough 1-D blocks of `threads` threads to give one thread to each of `n` items.
    pub fn over(n: usize, threads: u32) -> Launch {
        Launch::blocks(n.div_ceil(threads as usize) as u32, threads)
    }

    /// With `bytes` of dynamic shared memory.
    pub fn shared(self, bytes: u32) -> Launch {
        Launch {
            shared_bytes: bytes,
            ..self
        }
    }
}

/// A single-precision product in cuBLAS's terms (`cublasSgemm`, column-major):
/// `C = alpha·op(A)·op(B) + beta·C`, `op(A)` is `m × k`, `op(B)` is `k × n`, `C` is `m × n`.
/// A row-major product `C = A·B` is the column-major `Cᵀ = Bᵀ·Aᵀ`, i.e. this with the operands
/// swapped ([`super::blas`] does that translation once for every caller).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub a: DevPtr,
    pub lda: usize,
    pub b: DevPtr,
    pub ldb: usize,
    pub beta: f32,
    pub c: DevPtr,
    pub ldc: usize,
}

/// A device: memory, ordered copies and launches on one stream, and SGEMM.
pub trait Gpu: Send + Sync + 'static {
    /// What this is, for the log: the GPU's name, compute capability and driver, or the
    /// emulator.
    fn describe(&self) -> String;

    /// `bytes` of uninitialised device memory.
    fn alloc(&self, bytes: usize) -> Result<DevPtr>;

    /// Return memory from [`Gpu::alloc`], after the work queued so far that may use it.
    ///
    /// # Safety
    /// `ptr` came from `alloc` on this device and is not used afterwards.
    unsafe fn free(&self, ptr: DevPtr, bytes: usize);

    /// Copy `src` to `dst` (ordered on the stream; `src` may be reused when this returns).
    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()>;

    /// Copy `dst.len()` bytes from `src` once the work queued before has finished.
    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()>;

    /// Device-to-device copy of `bytes`.
    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()>;

    /// Set `bytes` to zero.
    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()>;

    /// Launch kernel `name` (an `extern "C" __global__` function of `cuda/*.cu`).
    fn launch(&self, name: &str, launch: Launch, args: &[KernelArg]) -> Result<()>;

    /// `C = alpha·op(A)·op(B) + beta·C` with cuBLAS's column-major semantics.
    fn sgemm(&self, g: &Sgemm) -> Result<()>;

    /// Wait until everything queued has finished (and report an asynchronous error).
    fn synchronize(&self) -> Result<()>;

    /// The device's memory in bytes, when it has its own (the emulator's is the host's).
    fn total_memory(&self) -> Option<usize> {
        None
    }

    /// Whether this runs the kernels on the CPU in place of a GPU (the emulator): its timings
    /// describe no GPU.
    fn is_emulated(&self) -> bool {
        false
    }

    /// Seconds the calling threads have spent blocked on the device so far: waiting for a
    /// download, for a staging buffer's copy to finish, or in a synchronize. Host time spent
    /// queueing work is not in it, so a step whose host time is mostly this waits for the GPU
    /// (kernels or copies), and one with little of it keeps the GPU waiting instead. 0 where
    /// work runs as it is queued (the emulator).
    fn blocked_seconds(&self) -> f64 {
        0.0
    }
}

/// Bytes in use and the most ever in use through [`DevBuf`]s of one device.
#[derive(Debug, Default)]
pub struct MemoryCounter {
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl MemoryCounter {
    fn add(&self, bytes: usize) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, bytes: usize) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Bytes allocated now.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// The largest [`MemoryCounter::current`] so far.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// Bytes copied between the host and one device, each way: what the staging costs, for the
/// run's summary (a mini-batch on a GPU is often bound by these copies, not by kernels).
#[derive(Debug, Default)]
pub struct TransferCounter {
    to_device: AtomicU64,
    to_host: AtomicU64,
}

impl TransferCounter {
    /// Bytes uploaded so far.
    pub fn to_device(&self) -> u64 {
        self.to_device.load(Ordering::Relaxed)
    }

    /// Bytes downloaded so far.
    pub fn to_host(&self) -> u64 {
        self.to_host.load(Ordering::Relaxed)
    }
}

/// A device and its memory accounting, shared by every buffer allocated on it.
#[derive(Clone)]
pub struct Device {
    /// The device, behind a [`Counted`] that counts every call into `calls`.
    pub gpu: Arc<dyn Gpu>,
    pub memory: Arc<MemoryCounter>,
    pub transfers: Arc<TransferCounter>,
    pub calls: Arc<CallCounter>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.gpu.describe())
    }
}

impl Device {
    /// A device over `gpu`, its calls counted.
    pub fn new(gpu: Arc<dyn Gpu>) -> Device {
        let calls = Arc::new(CallCounter::default());
        Device {
            gpu: Arc::new(Counted::new(gpu, calls.clone())),
            memory: Arc::new(MemoryCounter::default()),
            transfers: Arc::new(TransferCounter::default()),
            calls,
        }
    }

    /// `bytes` of uninitialised memory (at least one byte is allocated, so the pointer is
    /// valid to pass to a kernel that reads nothing).
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        let size = bytes.max(1);
        let ptr = self.gpu.alloc(size)?;
        self.memory.add(size);
        Ok(DevBuf {
            ptr,
            bytes,
            size,
            device: self.clone(),
        })
    }

    /// `bytes` of zeros.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DevBuf> {
        let buf = self.alloc(bytes)?;
        self.gpu.zero(buf.ptr, bytes)?;
        Ok(buf)
    }

    /// A buffer holding `values`.
    pub fn upload<T: Pod>(&self, values: &[T]) -> Result<DevBuf> {
        let bytes = as_bytes(values);
        let buf = self.alloc(bytes.len())?;
        self.copy_to_device(buf.ptr, bytes)?;
        Ok(buf)
    }

    /// [`Gpu::upload`], counted.
    pub fn copy_to_device(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.transfers
            .to_device
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        self.gpu.upload(dst, src)
    }

    /// [`Gpu::download`], counted.
    pub fn copy_to_host(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        self.transfers
            .to_host
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        self.gpu.download(src, dst)
    }
}

/// Plain data that may be copied to and from the device as bytes.
///
/// # Safety
/// Every bit pattern of `size_of::<T>()` bytes is a valid `T`, and `T` has no padding.
pub unsafe trait Pod: Copy + 'static {}
// SAFETY: primitive numbers: no padding, every bit pattern valid.
unsafe impl Pod for f32 {}
unsafe impl Pod for u32 {}
unsafe impl Pod for i32 {}
unsafe impl Pod for u64 {}
unsafe impl Pod for i64 {}
unsafe impl Pod for u8 {}

/// The bytes of a slice of plain data.
pub fn as_bytes<T: Pod>(values: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so every byte is initialised.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// The bytes of a mutable slice of plain data.
pub fn as_bytes_mut<T: Pod>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: `T: Pod`: any bytes written are a valid `T`.
    unsafe {
        std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), std::mem::size_of_val(values))
    }
}

/// An owned allocation of device memory, freed on drop.
pub struct DevBuf {
    ptr: DevPtr,
    /// Bytes asked for.
    bytes: usize,
    /// Bytes allocated (at least one).
    size: usize,
    device: Device,
}

impl std::fmt::Debug for DevBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevBuf({:#x}, {} B)", self.ptr, self.bytes)
    }
}

impl DevBuf {
    /// The device address of the first byte.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> DevPtr {
        debug_assert!(
            offset <= self.bytes,
            "offset {offset} past {} B",
            self.bytes
        );
        self.ptr + offset as u64
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True when it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Copy the whole buffer to the host as `T`s.
    pub fn download<T: Pod + Default>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.bytes / std::mem::size_of::<T>()];
        self.device.copy_to_host(self.ptr, as_bytes_mut(&mut out))?;
        Ok(out)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: the pointer came from this device's `alloc` and dies with this buffer.
        unsafe { self.device.gpu.free(self.ptr, self.size) };
        self.device.memory.sub(self.size);
    }
}
