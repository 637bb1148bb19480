//! [`DriverGpu`]: the [`Gpu`] seam on a real NVIDIA GPU, through cudarc's raw driver layer
//! (`cudarc::driver::result`), NVRTC and cuBLAS. Kept thin: every method is a handful of
//! driver calls, so that what cannot be tested without a GPU is small.
//!
//! * **Context.** The device's *primary* context (the one the CUDA runtime inside cuBLAS also
//!   uses) is retained and made current on the constructing thread; every entry point makes it
//!   current again when another thread calls (`cuCtxGetCurrent` is a thread-local read).
//! * **Stream.** One non-blocking stream carries everything: allocations, copies, launches and
//!   cuBLAS, in the order they are issued. Nothing waits except [`Gpu::download`],
//!   [`Gpu::synchronize`] and the reuse of a staging buffer.
//! * **Memory.** Stream-ordered `cuMemAllocAsync` / `cuMemFreeAsync` on the device's default
//!   pool, whose release threshold is raised so that freed memory stays in the pool and is
//!   reused by the next step (as PyTorch's caching allocator does); on out-of-memory the pool
//!   is trimmed after a synchronisation and the allocation retried once.
//! * **Transfers.** Uploads go through a ring of pinned staging buffers (`cuMemHostAlloc`):
//!   bytes are copied into a buffer, an asynchronous copy is queued, and a buffer is reused
//!   only after the event recorded behind its copies has completed; big uploads are chunked so
//!   that filling one buffer overlaps the copy of the previous. Downloads go through two pinned
//!   buffers in the same way, then `memcpy` out.
//! * **Kernels.** The `.cu` sources are compiled once per process by NVRTC for the device
//!   (PTX, or a CUBIN when the NVRTC is a newer minor than the driver; see
//!   [`super::nvrtc::Target`]), through the on-disk [`PtxCache`], and loaded as one module per
//!   file. Functions are looked up by name on first launch and cached.
//! * **Errors.** An asynchronous failure surfaces at the next `synchronize` / `download`,
//!   reported with the name of the last kernel launched; `GNNPAR_CUDA_SYNC=1` synchronises
//!   after every launch so that the failing kernel is named exactly.

use super::cublas::{self, Cublas, MathMode};
use super::gpu::{DevPtr, Gpu, KernelArg, Launch, Sgemm};
use super::libs::CudaVersion;
use super::nvrtc::{Image, Nvrtc, PtxCache, Target};
use super::probe::{self, driver_error, DeviceInfo};
use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// Bytes of one pinned staging buffer.
const SLOT: usize = 8 << 20;
/// Pinned upload buffers in the ring.
const UPLOAD_SLOTS: usize = 4;
/// Alignment of an upload's place in a staging buffer.
const STAGE_ALIGN: usize = 256;

/// Options of a [`DriverGpu`].
#[derive(Clone, Debug, Default)]
pub struct DriverOptions {
    /// cuBLAS products in fp32 (the default, as the CPU) or TF32.
    pub math: MathMode,
    /// Where compiled kernels are cached; `None`: [`PtxCache::default_location`].
    pub ptx_cache: Option<PtxCache>,
    /// Compile without any on-disk cache.
    pub no_ptx_cache: bool,
}

/// A pinned host buffer and the event recorded after the last copy that used it.
struct Slot {
    host: *mut u8,
    event: sys::CUevent,
    /// An event was recorded since the buffer was last known free.
    busy: bool,
}

/// The pinned buffers: an upload ring (filled front to back, then the next buffer) and two
/// download buffers.
struct Staging {
    up: Vec<Slot>,
    cur: usize,
    used: usize,
    down: Vec<Slot>,
}

/// A real GPU. See the module documentation.
pub struct DriverGpu {
    ordinal: usize,
    info: DeviceInfo,
    driver_version: CudaVersion,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    /// The default memory pool; `None` where the device has no pools (then `cuMemAlloc`).
    pool: Option<sys::CUmemoryPool>,
    modules: Vec<(String, sys::CUmodule)>,
    /// Name → (function, id in `names`).
    functions: RwLock<HashMap<String, (sys::CUfunction, usize)>>,
    /// Names of what was launched, by id: 0 nothing, 1 cuBLAS, then kernels.
    names: RwLock<Vec<String>>,
    /// Id of the last thing queued that runs on the GPU.
    last: AtomicUsize,
    sync_each_launch: bool,
    staging: Mutex<Option<Staging>>,
    blas: Option<Arc<Cublas>>,
    blas_handle: Mutex<cublas::Handle>,
    nvrtc: Arc<Nvrtc>,
    image_kind: String,
    /// Nanoseconds threads spent blocked on the device ([`Gpu::blocked_seconds`]).
    blocked_ns: AtomicU64,
}

// SAFETY: the driver's handles (context, stream, modules, functions, events, pinned memory)
// may be used from any thread once the context is current there, which every entry point
// ensures; the mutable state (staging buffers, cuBLAS handle, function cache) is behind locks.
unsafe impl Send for DriverGpu {}
unsafe impl Sync for DriverGpu {}

/// A driver call's error as a message naming the call.
fn cu(what: impl std::fmt::Display) -> impl FnOnce(result::DriverError) -> anyhow::Error {
    move |e| anyhow!("CUDA {what}: {}", driver_error(e))
}

/// Images compiled in this process, by (sources, architecture, target, NVRTC).
type Compiled = Mutex<Vec<(String, Arc<Vec<Image>>)>>;

impl DriverGpu {
    /// The GPU of ordinal `ordinal` (among those `CUDA_VISIBLE_DEVICES` leaves, as the driver
    /// counts them), with the kernels of `sources` (`.cu` files and the `.cuh` headers they
    /// include, as [`super::kernels::SOURCES`] lists them) compiled for it.
    pub fn new(ordinal: usize, sources: &[(&str, &str)]) -> Result<DriverGpu> {
        DriverGpu::with_options(ordinal, sources, &DriverOptions::default())
    }

    /// [`DriverGpu::new`] with options.
    pub fn with_options(
        ordinal: usize,
        sources: &[(&str, &str)],
        opts: &DriverOptions,
    ) -> Result<DriverGpu> {
        let driver = probe::driver().map_err(|u| anyhow!("{u}"))?;
        let count = result::device::get_count().map_err(cu("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            bail!(
                "CUDA device {ordinal} asked for, and {count} visible{}",
                std::env::var("CUDA_VISIBLE_DEVICES")
                    .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v})"))
                    .unwrap_or_default()
            );
        }
        let info = probe::device_info(ordinal).map_err(cu("querying the device"))?;
        let dev = result::device::get(ordinal as i32).map_err(cu("cuDeviceGet"))?;
        let nvrtc = probe::nvrtc(driver.version).map_err(|u| anyhow!("{u}"))?;
        let blas = probe::cublas(driver.version).map_err(|u| anyhow!("{u}"))?;

        // SAFETY: `dev` came from `device::get`.
        let ctx =
            unsafe { result::primary_ctx::retain(dev) }.map_err(cu("retaining the context"))?;
        // From here on, `Drop` releases what was made.
        let mut gpu = DriverGpu {
            ordinal,
            info,
            driver_version: driver.version,
            ctx,
            stream: std::ptr::null_mut(),
            pool: None,
            modules: Vec::new(),
            functions: RwLock::new(HashMap::new()),
            names: RwLock::new(vec!["nothing".into(), "cuBLAS SGEMM".into()]),
            last: AtomicUsize::new(0),
            sync_each_launch: std::env::var_os("GNNPAR_CUDA_SYNC")
                .is_some_and(|v| !v.is_empty() && v != "0"),
            staging: Mutex::new(None),
            blas: None,
            blas_handle: Mutex::new(std::ptr::null_mut()),
            nvrtc,
            image_kind: String::new(),
            blocked_ns: AtomicU64::new(0),
        };
        gpu.bind()?;
        gpu.stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(cu("creating a stream"))?;

        use sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
        // SAFETY: `dev` came from `device::get`.
        let pools = unsafe {
            result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        }
        .unwrap_or(0);
        if pools != 0 {
            // SAFETY: `dev` came from `device::get`.
            let pool = unsafe { result::device::get_default_mem_pool(dev) }
                .map_err(cu("cuDeviceGetDefaultMemPool"))?;
            let mut threshold: u64 = u64::MAX;
            // SAFETY: the release threshold is a cuuint64_t.
            unsafe {
                result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
            }
            .map_err(cu("raising the memory pool's release threshold"))?;
            gpu.pool = Some(pool);
        } else {
            log::warn!(
                "GPU {ordinal} has no stream-ordered memory pools: cuMemAlloc / cuMemFree, \
                 which synchronise"
            );
        }

        // Kernels.
        let (cc_major, cc_minor) = gpu.info.compute_capability;
        let cc = cc_major * 10 + cc_minor;
        let target = Target::for_driver(gpu.nvrtc.version(), driver.version);
        let arch = gpu.nvrtc.arch_for(cc, target)?;
        let cache = if opts.no_ptx_cache {
            None
        } else {
            opts.ptx_cache.clone().or_else(PtxCache::default_location)
        };
        let images = compiled(&gpu.nvrtc, sources, arch, target, cache.as_ref())?;
        gpu.image_kind = match target {
            Target::Ptx => format!("PTX compute_{arch}"),
            Target::Cubin => format!("CUBIN sm_{arch}"),
        };
        for img in images.iter() {
            let m = gpu.load_module(img)?;
            gpu.modules.push((img.file_name.clone(), m));
        }

        // cuBLAS on the same stream.
        // SAFETY: the context is current and the stream is ours.
        let h = unsafe { blas.create_handle(gpu.stream.cast(), opts.math) }?;
        *gpu.blas_handle.get_mut().unwrap_or_else(|e| e.into_inner()) = h;
        gpu.blas = Some(blas);
        log::debug!("{}", gpu.describe());
        Ok(gpu)
    }

    /// The device's description.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Its ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Make this device's context current on the calling thread (cheap when it is).
    fn bind(&self) -> Result<()> {
        match result::ctx::get_current() {
            Ok(Some(c)) if c == self.ctx => Ok(()),
            // SAFETY: a retained primary context, alive as long as `self`.
            _ => unsafe { result::ctx::set_current(self.ctx) }
                .map_err(cu("making the context current")),
        }
    }

    /// Load an image, with the JIT's error log when the driver refuses it.
    fn load_module(&self, img: &Image) -> Result<sys::CUmodule> {
        let mut log = vec![0u8; 16 << 10];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a PTX image is NUL-terminated (Image guarantees it) and a CUBIN is a whole
        // ELF file; the options point at a live buffer of the stated size.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                img.bytes.as_ptr().cast(),
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if let Err(e) = r.result() {
            let end = log.iter().position(|&b| b == 0).unwrap_or(0);
            let jit = String::from_utf8_lossy(&log[..end]);
            let hint = if e.0 == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                format!(
                    " (PTX of NVRTC {} needs a driver for CUDA {} or newer; this one is CUDA {})",
                    self.nvrtc.version(),
                    self.nvrtc.version(),
                    self.driver_version
                )
            } else {
                String::new()
            };
            bail!(
                "CUDA loading {} ({}) on {}: {}{hint}{}{}",
                img.file_name,
                img.arch,
                self.info.arch(),
                driver_error(e),
                if jit.trim().is_empty() { "" } else { "\n" },
                jit.trim_end()
            );
        }
        Ok(module)
    }

    /// The function `name` and its id, looked up in the modules on first use.
    fn function(&self, name: &str) -> Result<(sys::CUfunction, usize)> {
        if let Some(&f) = self
            .functions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(f);
        }
        let mut map = self.functions.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&f) = map.get(name) {
            return Ok(f);
        }
        let cname = CString::new(name).map_err(|_| anyhow!("kernel name {name:?} holds a NUL"))?;
        for (file, m) in &self.modules {
            // SAFETY: a loaded module.
            match unsafe { result::module::get_function(*m, cname.clone()) } {
                Ok(f) => {
                    let mut names = self.names.write().unwrap_or_else(|e| e.into_inner());
                    names.push(name.to_string());
                    let entry = (f, names.len() - 1);
                    map.insert(name.to_string(), entry);
                    return Ok(entry);
                }
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND => {}
                Err(e) => return Err(cu(format!("looking up {name} in {file}"))(e)),
            }
        }
        bail!(
            "CUDA: no kernel {name} in the {} modules compiled ({})",
            self.modules.len(),
            self.modules
                .iter()
                .map(|(f, _)| f.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The name of what was queued last, for an asynchronous error.
    fn last_name(&self) -> String {
        let id = self.last.load(Ordering::Relaxed);
        self.names
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    /// An asynchronous error, with what ran last.
    fn async_error(&self, what: &str, e: result::DriverError) -> anyhow::Error {
        if self.sync_each_launch {
            anyhow!("CUDA {what}: {}", driver_error(e))
        } else {
            anyhow!(
                "CUDA {what}: {} (an asynchronous error; the last work queued was {}: set \
                 GNNPAR_CUDA_SYNC=1 to check every launch)",
                driver_error(e),
                self.last_name()
            )
        }
    }

    /// The staging buffers, allocated on first use.
    fn staging(&self) -> Result<std::sync::MutexGuard<'_, Option<Staging>>> {
        let mut st = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if st.is_none() {
            let slot = || -> Result<Slot> {
                // SAFETY: a context is current; the size is non-zero.
                let host = unsafe { result::malloc_host(SLOT, 0) }
                    .map_err(cu(format!("cuMemHostAlloc({SLOT} B)")))?;
                let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(cu("cuEventCreate"))
                    .inspect_err(|_| {
                        // SAFETY: allocated just above.
                        let _ = unsafe { result::free_host(host) };
                    })?;
                Ok(Slot {
                    host: host.cast(),
                    event,
                    busy: false,
                })
            };
            let mut s = Staging {
                up: Vec::new(),
                cur: 0,
                used: 0,
                down: Vec::new(),
            };
            let made = (|| -> Result<()> {
                for _ in 0..UPLOAD_SLOTS {
                    s.up.push(slot()?);
                }
                for _ in 0..2 {
                    s.down.push(slot()?);
                }
                Ok(())
            })();
            if let Err(e) = made {
                free_staging(s);
                return Err(e);
            }
            *st = Some(s);
        }
        Ok(st)
    }

    /// Wait until `slot`'s copies are done.
    fn wait_slot(&self, slot: &mut Slot) -> Result<()> {
        if slot.busy {
            let t = Instant::now();
            // SAFETY: a live event.
            let waited = unsafe { result::event::synchronize(slot.event) };
            self.count_blocked(t);
            waited.map_err(|e| self.async_error("waiting for a staging buffer", e))?;
            slot.busy = false;
        }
        Ok(())
    }

    /// Add the time since `t` to [`Gpu::blocked_seconds`].
    fn count_blocked(&self, t: Instant) {
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.blocked_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Free the staging buffers (their copies must have finished).
fn free_staging(s: Staging) {
    for slot in s.up.into_iter().chain(s.down) {
        // SAFETY: made by `staging`, used no more.
        unsafe {
            let _ = result::event::destroy(slot.event);
            let _ = result::free_host(slot.host.cast());
        }
    }
}

/// The images of `sources` for `arch` / `target`, compiled once per process.
fn compiled(
    nvrtc: &Nvrtc,
    sources: &[(&str, &str)],
    arch: u32,
    target: Target,
    cache: Option<&PtxCache>,
) -> Result<Arc<Vec<Image>>> {
    static COMPILED: Compiled = Mutex::new(Vec::new());
    let mut key = format!(
        "{} {} {arch} {target:?}",
        nvrtc.path().display(),
        nvrtc.version()
    );
    for (n, t) in sources {
        key.push_str(&format!("\0{n}\0{}\0", t.len()));
        key.push_str(t);
    }
    if let Some((_, imgs)) = COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(k, _)| *k == key)
    {
        return Ok(imgs.clone());
    }
    let t = std::time::Instant::now();
    let imgs = Arc::new(
        nvrtc
            .compile_all(sources, arch, target, cache)
            .context("compiling the CUDA kernels")?,
    );
    log::debug!(
        "{} kernel files for {arch} ({target:?}) in {:.2} s",
        imgs.len(),
        t.elapsed().as_secs_f64()
    );
    COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((key, imgs.clone()));
    Ok(imgs)
}

/// A kernel argument's bytes in an 8-byte, 8-aligned cell (what `cuLaunchKernel` reads through
/// the pointer to it: as many bytes as the parameter has).
fn arg_cell(a: &KernelArg) -> u64 {
    let mut b = [0u8; 8];
    match *a {
        KernelArg::Ptr(p) => b = p.to_ne_bytes(),
        KernelArg::U64(v) => b = v.to_ne_bytes(),
        KernelArg::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        KernelArg::U32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        KernelArg::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
    }
    u64::from_ne_bytes(b)
}

impl Gpu for DriverGpu {
    fn total_memory(&self) -> Option<usize> {
        Some(self.info.total_memory)
    }

    fn blocked_seconds(&self) -> f64 {
        self.blocked_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    fn describe(&self) -> String {
        let blas = self
            .blas
            .as_ref()
            .map(|b| format!("cuBLAS {} ({})", b.version(), b.path().display()))
            .unwrap_or_default();
        format!(
            "{} (sm_{}{}, {:.1} GiB) on GPU {}; driver for CUDA {}; NVRTC {} ({}) → {}; {blas}",
            self.info.name,
            self.info.compute_capability.0,
            self.info.compute_capability.1,
            self.info.total_memory as f64 / (1u64 << 30) as f64,
            self.ordinal,
            self.driver_version,
            self.nvrtc.version(),
            self.nvrtc.path().display(),
            self.image_kind,
        )
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        self.bind()?;
        let bytes = bytes.max(1);
        let Some(pool) = self.pool else {
            // SAFETY: a context is current.
            return unsafe { result::malloc_sync(bytes) }
                .map_err(cu(format!("cuMemAlloc({bytes} B)")));
        };
        // SAFETY: our stream; the memory is used on it only.
        match unsafe { result::malloc_async(self.stream, bytes) } {
            Ok(p) => Ok(p),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                // Give the pool's cached memory back and try once more.
                // SAFETY: our stream and pool.
                unsafe {
                    result::stream::synchronize(self.stream)
                        .map_err(|e| self.async_error("synchronizing", e))?;
                    let _ = result::mem_pool::trim_to(pool, 0);
                    result::malloc_async(self.stream, bytes)
                }
                .map_err(|e| {
                    let (free, total) = result::mem_get_info().unwrap_or((0, 0));
                    anyhow!(
                        "CUDA out of memory on GPU {} allocating {bytes} B ({} of {} B free): {}",
                        self.ordinal,
                        free,
                        total,
                        driver_error(e)
                    )
                })
            }
            Err(e) => Err(cu(format!("cuMemAllocAsync({bytes} B)"))(e)),
        }
    }

    unsafe fn free(&self, ptr: DevPtr, _bytes: usize) {
        if let Err(e) = self.bind() {
            log::error!("{e:#}");
            return;
        }
        let r = match self.pool {
            // SAFETY: the caller's contract: from `alloc`, not used afterwards; ordered on
            // our stream after the work that uses it.
            Some(_) => unsafe { result::free_async(ptr, self.stream) },
            // SAFETY: as above; `cuMemFree` is not stream-ordered, so wait first.
            None => unsafe {
                result::stream::synchronize(self.stream).and_then(|_| result::free_sync(ptr))
            },
        };
        if let Err(e) = r {
            log::error!("CUDA freeing {ptr:#x}: {}", driver_error(e));
        }
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut guard = self.staging()?;
        let st = guard.as_mut().expect("made by staging()");
        let mut done = 0usize;
        while done < src.len() {
            let len = (src.len() - done).min(SLOT);
            let mut off = st.used.next_multiple_of(STAGE_ALIGN);
            if off + len > SLOT {
                // Move to the next buffer: mark this one, wait for the next one's copies.
                let cur = st.cur;
                // SAFETY: live event, our stream.
                unsafe { result::event::record(st.up[cur].event, self.stream) }
                    .map_err(cu("cuEventRecord"))?;
                st.up[cur].busy = true;
                st.cur = (cur + 1) % st.up.len();
                let next = st.cur;
                self.wait_slot(&mut st.up[next])?;
                st.used = 0;
                off = 0;
            }
            let slot = &st.up[st.cur];
            // SAFETY: `off + len <= SLOT` bytes of a pinned buffer no queued copy reads (its
            // earlier copies finished, or read bytes before `off`).
            let staged = unsafe {
                let p = slot.host.add(off);
                std::ptr::copy_nonoverlapping(src.as_ptr().add(done), p, len);
                std::slice::from_raw_parts(p, len)
            };
            // SAFETY: `dst + done` has `len` bytes (the caller's buffer); the staged bytes stay
            // untouched until the event behind this copy completes.
            unsafe { result::memcpy_htod_async(dst + done as u64, staged, self.stream) }
                .map_err(cu(format!("copying {len} B to the device")))?;
            st.used = off + len;
            done += len;
        }
        Ok(())
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut guard = self.staging()?;
        let st = guard.as_mut().expect("made by staging()");
        let total = dst.len();
        let chunks = total.div_ceil(SLOT);
        let queue = |st: &mut Staging, i: usize| -> Result<()> {
            let off = i * SLOT;
            let len = (total - off).min(SLOT);
            let slot = &mut st.down[i % 2];
            // SAFETY: a pinned buffer of SLOT ≥ len bytes that no queued copy uses (its
            // previous chunk was waited for and copied out).
            let buf = unsafe { std::slice::from_raw_parts_mut(slot.host, len) };
            // SAFETY: `src + off` has `len` bytes; the buffer lives until the event is waited.
            unsafe {
                result::memcpy_dtoh_async(buf, src + off as u64, self.stream)
                    .map_err(cu(format!("copying {len} B from the device")))?;
                result::event::record(slot.event, self.stream).map_err(cu("cuEventRecord"))?;
            }
            slot.busy = true;
            Ok(())
        };
        for i in 0..chunks.min(2) {
            queue(st, i)?;
        }
        for i in 0..chunks {
            let off = i * SLOT;
            let len = (total - off).min(SLOT);
            self.wait_slot(&mut st.down[i % 2])?;
            // SAFETY: the copy into this buffer has completed.
            unsafe {
                std::ptr::copy_nonoverlapping(st.down[i % 2].host, dst[off..].as_mut_ptr(), len)
            };
            if i + 2 < chunks {
                queue(st, i + 2)?;
            }
        }
        Ok(())
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller's buffers hold `bytes`; ordered on our stream.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }
            .map_err(cu(format!("device copy of {bytes} B")))
    }

    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller's buffer holds `bytes`; ordered on our stream.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream) }
            .map_err(cu(format!("zeroing {bytes} B")))
    }

    fn launch(&self, name: &str, launch: Launch, args: &[KernelArg]) -> Result<()> {
        self.bind()?;
        let (f, id) = self.function(name)?;
        if launch.shared_bytes > 48 << 10 {
            // Above 48 KiB of dynamic shared memory a kernel must opt in.
            // SAFETY: a live function.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    launch.shared_bytes as i32,
                )
            }
            .map_err(cu(format!(
                "{name}: {} B of shared memory",
                launch.shared_bytes
            )))?;
        }
        let mut cells: Vec<u64> = args.iter().map(arg_cell).collect();
        let mut params: Vec<*mut c_void> = cells
            .iter_mut()
            .map(|c| (c as *mut u64).cast::<c_void>())
            .collect();
        // SAFETY: `params` points at one cell per kernel parameter, in order, alive across the
        // call (the driver copies the values); the pointers among them are the caller's.
        unsafe {
            result::launch_kernel(
                f,
                launch.grid,
                launch.block,
                launch.shared_bytes,
                self.stream,
                &mut params,
            )
        }
        .map_err(cu(format!(
            "launching {name} (grid {:?}, block {:?}, {} B shared, {} arguments)",
            launch.grid,
            launch.block,
            launch.shared_bytes,
            args.len()
        )))?;
        self.last.store(id, Ordering::Relaxed);
        if self.sync_each_launch {
            // SAFETY: our stream.
            unsafe { result::stream::synchronize(self.stream) }
                .map_err(cu(format!("running {name}")))?;
        }
        Ok(())
    }

    fn sgemm(&self, g: &Sgemm) -> Result<()> {
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        self.bind()?;
        let blas = self
            .blas
            .as_ref()
            .expect("cuBLAS is loaded by the constructor");
        let h = self.blas_handle.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: a live handle on our stream, the context current; the caller's matrices.
        unsafe {
            blas.sgemm(
                *h, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta,
                g.c, g.ldc,
            )
        }?;
        self.last.store(1, Ordering::Relaxed);
        if self.sync_each_launch {
            // SAFETY: our stream.
            unsafe { result::stream::synchronize(self.stream) }
                .map_err(cu("running cuBLAS SGEMM"))?;
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        let t = Instant::now();
        // SAFETY: our stream.
        let waited = unsafe { result::stream::synchronize(self.stream) };
        self.count_blocked(t);
        waited.map_err(|e| self.async_error("synchronizing", e))?;
        // Every staged copy has finished.
        if let Some(st) = self
            .staging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            for s in st.up.iter_mut().chain(st.down.iter_mut()) {
                s.busy = false;
            }
        }
        Ok(())
    }
}

impl Drop for DriverGpu {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: everything below was made by this device and is used no more (buffers on
        // it hold an `Arc` to it, so they are gone).
        unsafe {
            if !self.stream.is_null() {
                if let Err(e) = result::stream::synchronize(self.stream) {
                    log::error!("CUDA at shutdown: {}", driver_error(e));
                }
            }
            let h = *self
                .blas_handle
                .get_mut()
                .unwrap_or_else(|e| e.into_inner());
            if let (Some(b), false) = (&self.blas, h.is_null()) {
                let _ = b.destroy_handle(h);
            }
            for (_, m) in self.modules.drain(..) {
                let _ = result::module::unload(m);
            }
            if let Some(s) = self
                .staging
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                free_staging(s);
            }
            if !self.stream.is_null() {
                let _ = result::stream::destroy(self.stream);
            }
            if let Ok(dev) = result::device::get(self.ordinal as i32) {
                let _ = result::primary_ctx::release(dev);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_arguments_sit_in_the_first_bytes_of_their_cell() {
        let bytes = |a: KernelArg| arg_cell(&a).to_ne_bytes();
        assert_eq!(bytes(KernelArg::I32(-2))[..4], (-2i32).to_ne_bytes());
        assert_eq!(bytes(KernelArg::I32(-2))[4..], [0; 4]);
        assert_eq!(bytes(KernelArg::F32(1.5))[..4], 1.5f32.to_ne_bytes());
        assert_eq!(bytes(KernelArg::U32(7))[..4], 7u32.to_ne_bytes());
        assert_eq!(
            bytes(KernelArg::U64(u64::MAX - 1)),
            (u64::MAX - 1).to_ne_bytes()
        );
        assert_eq!(
            bytes(KernelArg::Ptr(0x00de_adbe_ef00)),
            0x00de_adbe_ef00_u64.to_ne_bytes()
        );
    }

    #[test]
    fn without_a_driver_the_constructor_errs_and_does_not_panic() {
        if probe::driver().is_ok() {
            return; // a GPU machine: tests/cuda_driver.rs runs the device
        }
        let err = DriverGpu::new(0, &[]).err().expect("no driver here");
        assert!(err.to_string().contains("libcuda.so.1"), "{err}");
    }
}
