//! A device whose memory is host memory and which runs no kernels: enough for the unit tests
//! of host-side logic (the product translation), without compiling the kernels.

use anyhow::{bail, Result};

use crate::backend::cuda::gpu::{DevPtr, Gpu, KernelArg, Launch, Sgemm};

pub(crate) struct HostGpu;

const ALIGN: usize = 256;

impl Gpu for HostGpu {
    fn describe(&self) -> String {
        "host memory (no kernels)".into()
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), ALIGN)?;
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            bail!("out of host memory");
        }
        Ok(p as DevPtr)
    }

    unsafe fn free(&self, ptr: DevPtr, bytes: usize) {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), ALIGN).expect("layout");
        std::alloc::dealloc(ptr as *mut u8, layout);
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        // SAFETY: `dst` is an allocation of at least `src.len()` bytes (the callers' contract).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        // SAFETY: as for `upload`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        // SAFETY: as for `upload`.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        // SAFETY: as for `upload`.
        unsafe { std::ptr::write_bytes(dst as *mut u8, 0, bytes) };
        Ok(())
    }

    fn launch(&self, name: &str, _: Launch, _: &[KernelArg]) -> Result<()> {
        bail!("no kernels here ({name})")
    }

    fn sgemm(&self, _: &Sgemm) -> Result<()> {
        bail!("no SGEMM here")
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
