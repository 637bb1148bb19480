//! The CUDA device emulated on the CPU: [`EmuGpu`] runs the very `cuda/*.cu` kernels that a GPU
//! runs, compiled by the system C++ compiler with `cuda/emu/emu.h`, so that the whole CUDA
//! backend (wrappers, memory handling, the cuBLAS translation, training steps) is tested where
//! there is no GPU.
//!
//! * Build: every compilation unit (`.cu`) becomes one shared library: a generated wrapper
//!   `#include`s it and exports, per kernel, `gnnpar_emu_launch_<name>` (unpacks the
//!   `cuLaunchKernel`-style argument array into the kernel's parameter types and runs the grid)
//!   and `gnnpar_emu_signature_<name>` (the parameter types, checked at every launch). One
//!   library per unit mirrors NVRTC, which compiles each file on its own: helpers in a shared
//!   header never collide. Libraries are cached under `cache_dir/<unit>-<hash>/`, the hash over
//!   every input (sources, headers, `emu.h`, the wrapper, flags, compiler version), written to a
//!   temporary directory and renamed into place, so parallel builds never see half a library.
//! * Execution: blocks one after another, the threads of a block as fibers on the calling
//!   thread; `__syncthreads()` and warp collectives switch fibers (`emu.h` explains how). Launch
//!   errors (a divergent barrier, a collective naming an exited lane, `__trap()`) come back as
//!   an `Err` naming the kernel, the block and the thread.
//! * Memory: "device" pointers are host addresses (256-byte aligned), registered, so a copy or
//!   a kernel argument outside every live allocation and a `free` of an unknown pointer are
//!   caught. New allocations are filled with `0xff` bytes (NaN as `f32`), so a kernel that
//!   reads what nobody wrote shows it instead of reading zeros by luck.
//! * SGEMM: cuBLAS's column-major semantics (transposes, leading dimensions, `beta = 0`
//!   ignoring whatever C holds), computed by the `gemm` crate (the CPU backend's kernels).
//!
//! Launches, copies and products are serialised by one mutex, as one stream orders them.
//! `GNNPAR_EMU_REVERSE=1` starts and releases a block's threads in descending order (a missing
//! `__syncthreads()` between a write by a low thread and a read by a high one then shows);
//! `GNNPAR_EMU_CXX` names another compiler and `GNNPAR_EMU_CXXFLAGS` adds flags (e.g. `-g`).

use super::gpu::{DevPtr, Device, Gpu, KernelArg, Launch, Sgemm};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The emulation header, force-included before every unit.
const EMU_H: &str = include_str!("../../../cuda/emu/emu.h");

/// `GNNPAR_EMU_ABI` of `emu.h`: the layout of [`EmuLaunch`].
const ABI: u32 = 1;

/// The most threads in a block, and the most dynamic shared memory of a block (an H100's).
const MAX_THREADS: u64 = 1024;
const MAX_SHARED: u32 = 227 * 1024;

/// Usable stack of one fiber (a guard page lies below each).
const STACK_BYTES: usize = 64 << 10;

/// Alignment of every allocation (cudaMalloc gives at least 256 bytes).
const ALIGN: usize = 256;

/// How every unit is compiled.
///
/// `-ffp-contract=off`: `a*b + c` stays a rounded product and a rounded sum. NVRTC contracts
/// such expressions into FMAs by default, but which ones it fuses is its own choice and cannot
/// be reproduced by g++ (which fuses only when the target has FMA, i.e. differently on every
/// CI machine); the kernels that must match the CPU backend bit for bit spell every rounding
/// step (`gnn_mul` / `gnn_add`, i.e. `__fmul_rn` / `__fadd_rn` on the GPU, which never fuse),
/// and an explicit `fmaf` is a true fused multiply-add here as there. Unfused is thus the
/// deterministic choice that agrees with the GPU wherever the GPU's result is defined, and
/// with the CPU backend (Rust never contracts) everywhere else.
/// `-fno-strict-aliasing`: kernels reinterpret buffers freely, as CUDA code does.
/// `-fvisibility=hidden`: only the launch entry points are exported.
const FLAGS: &[&str] = &[
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fvisibility=hidden",
    "-Wl,--no-undefined",
];

/// A launch as `emu.h` reads it (`struct gnnpar_emu_launch`).
#[repr(C)]
struct EmuLaunch {
    abi: u32,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    nargs: u32,
    reverse: u32,
    shared: *mut u8,
    stack_pool: *mut c_void,
    stack: unsafe extern "C" fn(*mut c_void, u32) -> *mut c_void,
    stack_bytes: u64,
}

type LaunchFn =
    unsafe extern "C" fn(*const EmuLaunch, *mut *mut c_void, *mut c_char, usize) -> c_int;
type SignatureFn = unsafe extern "C" fn() -> *const c_char;

/// One parameter of a kernel: its kind (`p` pointer, `i` 32-bit integer, `l` 64-bit integer,
/// `f` float, `d` double, `?` other) and its C++ type.
#[derive(Clone, Debug)]
struct Param {
    kind: u8,
    ty: String,
}

struct Kernel {
    file: String,
    launch: LaunchFn,
    params: Vec<Param>,
}

/// The CUDA kernels of `cuda/*.cu` compiled for the CPU, behind the [`Gpu`] trait.
pub struct EmuGpu {
    kernels: HashMap<String, Kernel>,
    compiler: String,
    files: usize,
    reverse: bool,
    state: Mutex<State>,
    // Last: the libraries must outlive the function pointers above.
    _libs: Vec<libloading::Library>,
}

/// What launches and copies share, under one lock.
struct State {
    /// Live allocations: address → bytes.
    allocs: BTreeMap<u64, usize>,
    stacks: StackPool,
    shared: SharedMemory,
}

// SAFETY: the raw pointers in `State` (fiber stacks, the shared buffer) are owned by it and
// only used under the mutex that holds it.
unsafe impl Send for State {}

impl std::fmt::Debug for EmuGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.describe())
    }
}

// ---- building -------------------------------------------------------------------------------

/// Builds of one process run one at a time (parallel tests build the same libraries).
static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// One compilation unit to build.
struct Unit<'a> {
    file: &'a str,
    kernels: Vec<String>,
    wrapper: String,
    dir: PathBuf,
}

impl EmuGpu {
    /// Compile `sources` — `(file name, text)`: `.cu` units and the `.cuh` / `.h` headers they
    /// include — for the CPU (or reuse an earlier build under `cache_dir`) and load them.
    pub fn build(sources: &[(&str, &str)], cache_dir: &Path) -> Result<EmuGpu> {
        let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let started = std::time::Instant::now();
        let mut seen = std::collections::HashSet::new();
        for (name, _) in sources {
            let plain = !name.is_empty()
                && !name.contains(['/', '\\'])
                && *name != "."
                && *name != ".."
                && *name != "emu.h";
            if !plain {
                bail!("CUDA emulator: a source must be a plain file name other than emu.h, not {name:?}");
            }
            if !seen.insert(*name) {
                bail!("CUDA emulator: source {name} is given twice");
            }
        }
        let cxx = std::env::var("GNNPAR_EMU_CXX").unwrap_or_else(|_| "c++".to_string());
        let extra: Vec<String> = std::env::var("GNNPAR_EMU_CXXFLAGS")
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let version = compiler_version(&cxx)?;
        let is_header = |name: &str| name.ends_with(".cuh") || name.ends_with(".h");
        let mut headers: Vec<(&str, &str)> = sources
            .iter()
            .copied()
            .filter(|(n, _)| is_header(n))
            .collect();
        headers.sort();

        let mut units = Vec::new();
        for &(file, text) in sources.iter().filter(|(n, _)| !is_header(n)) {
            let kernels = kernel_names(text);
            let wrapper = wrapper_source(file, &kernels);
            let mut h = Fnv128::new();
            h.add(&ABI.to_le_bytes());
            h.add(EMU_H.as_bytes());
            for f in FLAGS
                .iter()
                .copied()
                .chain(extra.iter().map(String::as_str))
            {
                h.add(f.as_bytes());
            }
            h.add(cxx.as_bytes());
            h.add(version.as_bytes());
            for (n, t) in &headers {
                h.add(n.as_bytes());
                h.add(t.as_bytes());
            }
            h.add(file.as_bytes());
            h.add(text.as_bytes());
            h.add(wrapper.as_bytes());
            let stem = file.rsplit_once('.').map_or(file, |(s, _)| s);
            let dir = cache_dir.join(format!("{stem}-{:032x}", h.finish()));
            units.push(Unit {
                file,
                kernels,
                wrapper,
                dir,
            });
        }
        let mut owner: HashMap<&str, &str> = HashMap::new();
        for u in &units {
            for k in &u.kernels {
                if let Some(first) = owner.insert(k, u.file) {
                    bail!(
                        "CUDA emulator: kernel `{k}` is defined in both {first} and {}",
                        u.file
                    );
                }
            }
        }

        std::fs::create_dir_all(cache_dir)
            .with_context(|| format!("CUDA emulator: creating {}", cache_dir.display()))?;
        let missing: Vec<&Unit> = units
            .iter()
            .filter(|u| !u.dir.join("lib.so").is_file())
            .collect();
        if !missing.is_empty() {
            let next = AtomicUsize::new(0);
            let workers = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(missing.len());
            let results: Vec<Result<()>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..workers)
                    .map(|_| {
                        s.spawn(|| -> Result<()> {
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let Some(u) = missing.get(i) else {
                                    return Ok(());
                                };
                                compile_unit(u, &headers, sources, cache_dir, &cxx, &extra)?;
                            }
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow!("compiler thread panicked")))
                    })
                    .collect()
            });
            for r in results {
                r?;
            }
            log::info!(
                "CUDA emulator: compiled {} of {} units with {cxx} in {:.1} s",
                missing.len(),
                units.len(),
                started.elapsed().as_secs_f64()
            );
        }

        let mut libs = Vec::new();
        let mut kernels = HashMap::new();
        for u in &units {
            let path = u.dir.join("lib.so");
            // SAFETY: a library this function compiled from the kernel sources; its only
            // initialisers are the emulator's runtime state.
            let lib = unsafe { libloading::Library::new(&path) }
                .with_context(|| format!("CUDA emulator: loading {}", path.display()))?;
            for name in &u.kernels {
                // SAFETY: symbols the generated wrapper defines with exactly these types.
                let (launch, sig) = unsafe {
                    let launch: LaunchFn = *lib
                        .get::<LaunchFn>(format!("gnnpar_emu_launch_{name}\0").as_bytes())
                        .with_context(|| format!("CUDA emulator: kernel {name} of {}", u.file))?;
                    let sig: SignatureFn = *lib
                        .get::<SignatureFn>(format!("gnnpar_emu_signature_{name}\0").as_bytes())
                        .with_context(|| format!("CUDA emulator: kernel {name} of {}", u.file))?;
                    (launch, CStr::from_ptr(sig()).to_string_lossy().into_owned())
                };
                kernels.insert(
                    name.clone(),
                    Kernel {
                        file: u.file.to_string(),
                        launch,
                        params: parse_signature(&sig),
                    },
                );
            }
            libs.push(lib);
        }
        let reverse = std::env::var("GNNPAR_EMU_REVERSE").is_ok_and(|v| !v.is_empty() && v != "0");
        Ok(EmuGpu {
            kernels,
            compiler: if version.starts_with(cxx.as_str()) {
                version
            } else {
                format!("{cxx} ({version})")
            },
            files: units.len(),
            reverse,
            state: Mutex::new(State {
                allocs: BTreeMap::new(),
                stacks: StackPool::default(),
                shared: SharedMemory::new()?,
            }),
            _libs: libs,
        })
    }

    /// Start and release a block's threads in descending order (default: ascending, or
    /// descending when `GNNPAR_EMU_REVERSE` is set). Both orders are deterministic; a kernel
    /// that needs a barrier it lacks usually fails in one of them.
    pub fn with_reverse_order(mut self, reverse: bool) -> EmuGpu {
        self.reverse = reverse;
        self
    }

    /// The kernels it can launch, sorted.
    pub fn kernel_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.kernels.keys().cloned().collect();
        v.sort();
        v
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves no state half-updated that matters here.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The first line of `cxx --version`, or a clear error when there is no compiler.
fn compiler_version(cxx: &str) -> Result<String> {
    let out = Command::new(cxx).arg("--version").output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow!(
                "CUDA emulator: no C++ compiler: `{cxx}` is not on PATH (the emulator compiles \
                 cuda/*.cu for the CPU with it; install g++, e.g. scripts/install-deps.sh, or \
                 name a compiler in GNNPAR_EMU_CXX)"
            )
        } else {
            anyhow!("CUDA emulator: running `{cxx} --version`: {e}")
        }
    })?;
    if !out.status.success() {
        bail!(
            "CUDA emulator: `{cxx} --version` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string())
}

/// Compile one unit into `u.dir/lib.so`: everything is written to a fresh directory beside it,
/// compiled there and renamed into place; a concurrent build of the same unit by another
/// process may win the rename, and then its (identical) library is used.
fn compile_unit(
    u: &Unit,
    headers: &[(&str, &str)],
    sources: &[(&str, &str)],
    cache_dir: &Path,
    cxx: &str,
    extra: &[String],
) -> Result<()> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir_name = u.dir.file_name().and_then(|n| n.to_str()).unwrap_or("unit");
    let tmp = cache_dir.join(format!(
        ".tmp-{dir_name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let result = (|| -> Result<()> {
        let text = sources
            .iter()
            .find(|(n, _)| *n == u.file)
            .map(|(_, t)| *t)
            .unwrap_or_default();
        let write = |name: &str, text: &str| {
            std::fs::write(tmp.join(name), text)
                .with_context(|| format!("writing {}", tmp.join(name).display()))
        };
        write("emu.h", EMU_H)?;
        for (n, t) in headers {
            write(n, t)?;
        }
        write(u.file, text)?;
        let wrapper = format!("{}.emu.cpp", u.file);
        write(&wrapper, &u.wrapper)?;
        let out = Command::new(cxx)
            .args(FLAGS)
            .args(extra)
            .args(["-include", "emu.h", "-o", "lib.so", &wrapper])
            .current_dir(&tmp)
            .output()
            .with_context(|| format!("CUDA emulator: running {cxx}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!(
                "CUDA emulator: compiling {} failed ({cxx} {}):\n{}",
                u.file,
                out.status,
                stderr.trim_end()
            );
        }
        if !stderr.trim().is_empty() {
            log::debug!("CUDA emulator: {cxx} on {}:\n{stderr}", u.file);
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match std::fs::rename(&tmp, &u.dir) {
        Ok(()) => Ok(()),
        Err(_) if u.dir.join("lib.so").is_file() => {
            // Another build got there first with the same inputs.
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(anyhow!(
                "CUDA emulator: renaming {} to {}: {e}",
                tmp.display(),
                u.dir.display()
            ))
        }
    }
}

/// The generated translation unit of `file`: the unit itself, then the entry points of its
/// kernels (`GNNPAR_EMU_EXPORT` of `emu.h`, a template that unpacks the argument array into
/// each kernel's parameter types).
fn wrapper_source(file: &str, kernels: &[String]) -> String {
    let mut s = format!(
        "// Generated by gnnpar (src/backend/cuda/emu.rs): {file} and the CPU emulator's entry\n\
         // points of its kernels.\n#include \"{file}\"\n\n"
    );
    for k in kernels {
        s.push_str(&format!("GNNPAR_EMU_EXPORT({k})\n"));
    }
    s
}

/// The kernels a unit defines: `extern "C" __global__ void name(`, with `__launch_bounds__(…)`
/// allowed among the qualifiers; comments are skipped, a repeated name (a declaration before
/// the definition) counts once.
fn kernel_names(text: &str) -> Vec<String> {
    let code = strip_comments(text);
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names: Vec<String> = Vec::new();
    let mut pos = 0;
    while let Some(at) = code[pos..].find("extern") {
        let start = pos + at;
        pos = start + "extern".len();
        if code[..start].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let Some(mut t) = code[pos..].trim_start().strip_prefix("\"C\"") else {
            continue;
        };
        let (mut global, mut void) = (false, false);
        loop {
            t = t.trim_start();
            let len = t.find(|c: char| !is_ident(c)).unwrap_or(t.len());
            if len == 0 {
                break;
            }
            let (word, rest) = t.split_at(len);
            t = rest;
            match word {
                "__global__" => global = true,
                "void" => void = true,
                "__launch_bounds__" => t = skip_parens(t),
                name => {
                    if global
                        && void
                        && t.trim_start().starts_with('(')
                        && !names.iter().any(|n| n == name)
                    {
                        names.push(name.to_string());
                    }
                    break;
                }
            }
        }
    }
    names
}

/// `t` after a balanced parenthesised group at its start (whitespace first allowed).
fn skip_parens(t: &str) -> &str {
    let t = t.trim_start();
    if !t.starts_with('(') {
        return t;
    }
    let mut depth = 0usize;
    for (i, c) in t.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &t[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// `text` with comments replaced by spaces (string and character literals kept as they are).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                out.push(b' ');
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(b.len());
                out.push(b' ');
            }
            q @ (b'"' | b'\'') => {
                out.push(q);
                i += 1;
                while i < b.len() && b[i] != q {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.push(b[i]);
                        i += 1;
                    }
                    out.push(b[i]);
                    i += 1;
                }
                if i < b.len() {
                    out.push(q);
                    i += 1;
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `"p:const float*;i:int"` → parameters.
fn parse_signature(sig: &str) -> Vec<Param> {
    if sig.is_empty() {
        return Vec::new();
    }
    sig.split(';')
        .map(|p| {
            let (kind, ty) = p.split_once(':').unwrap_or(("?", p));
            Param {
                kind: kind.bytes().next().unwrap_or(b'?'),
                ty: ty.to_string(),
            }
        })
        .collect()
}

/// FNV-1a, 128 bits: the cache key of a unit.
struct Fnv128(u128);

impl Fnv128 {
    fn new() -> Fnv128 {
        Fnv128(0x6c62272e07bb014262b821756295c58d)
    }

    /// Adds `bytes`, length first, so that concatenations differ.
    fn add(&mut self, bytes: &[u8]) {
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= *b as u128;
            self.0 = self.0.wrapping_mul(0x0000000001000000000000000000013B);
        }
    }

    fn finish(&self) -> u128 {
        self.0
    }
}

// ---- fiber stacks and shared memory ---------------------------------------------------------

/// Fiber stacks, mapped on first use and kept for the device's life; each has a guard page
/// below it, so an overflow faults instead of corrupting its neighbour.
#[derive(Default)]
struct StackPool {
    /// Mapping base (the guard page) of each stack.
    maps: Vec<*mut u8>,
}

fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    })
}

impl StackPool {
    /// The lowest usable address of stack `index`, mapping it and those before it if needed.
    fn stack(&mut self, index: usize) -> Option<*mut u8> {
        let page = page_size();
        while self.maps.len() <= index {
            // SAFETY: a fresh private anonymous mapping; the guard page is inside it.
            let base = unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    STACK_BYTES + page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                );
                if p == libc::MAP_FAILED {
                    return None;
                }
                libc::mprotect(p, page, libc::PROT_NONE);
                p.cast::<u8>()
            };
            self.maps.push(base);
        }
        // SAFETY: inside the mapping, past its guard page.
        Some(unsafe { self.maps[index].add(page) })
    }
}

impl Drop for StackPool {
    fn drop(&mut self) {
        let len = STACK_BYTES + page_size();
        for &p in &self.maps {
            // SAFETY: mappings made by `stack`, no fiber runs once the device is dropped.
            unsafe { libc::munmap(p.cast(), len) };
        }
    }
}

/// What `emu.h` calls for fiber stack `index`.
unsafe extern "C" fn stack_at(pool: *mut c_void, index: u32) -> *mut c_void {
    // SAFETY: `pool` is the `StackPool` of the launch in progress, borrowed by it alone.
    let pool = unsafe { &mut *pool.cast::<StackPool>() };
    pool.stack(index as usize)
        .map_or(std::ptr::null_mut(), |p| p.cast())
}

/// The block's dynamic shared memory: the most a block may ask for, 256-byte aligned.
struct SharedMemory(*mut u8);

impl SharedMemory {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(MAX_SHARED as usize, ALIGN).expect("layout")
    }

    fn new() -> Result<SharedMemory> {
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc(Self::layout()) };
        if p.is_null() {
            bail!("CUDA emulator: out of memory for shared memory");
        }
        Ok(SharedMemory(p))
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.0, Self::layout()) };
    }
}

// ---- memory checks --------------------------------------------------------------------------

impl State {
    /// The allocation `[base, base + size)` that holds `ptr`, if any (`ptr == base + size`
    /// counts: a pointer one past the end, as an empty view at the end has).
    fn holder(&self, ptr: u64) -> Option<(u64, usize)> {
        self.allocs
            .range(..=ptr)
            .next_back()
            .map(|(&b, &s)| (b, s))
            .filter(|&(b, s)| ptr <= b + s as u64)
    }

    /// `[ptr, ptr + bytes)` lies inside one live allocation.
    fn check(&self, ptr: u64, bytes: usize, what: &str) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        match self.holder(ptr) {
            Some((b, s)) if ptr + bytes as u64 <= b + s as u64 => Ok(()),
            Some((b, s)) => bail!(
                "emulated device: {what} of {bytes} B at {ptr:#x} runs past the end of the \
                 allocation {b:#x} of {s} B (by {} B)",
                ptr + bytes as u64 - (b + s as u64)
            ),
            None => bail!(
                "emulated device: {what} of {bytes} B at {ptr:#x} is outside every live \
                 allocation"
            ),
        }
    }
}

fn layout(bytes: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(bytes.max(1), ALIGN).expect("allocation layout")
}

// ---- the device -----------------------------------------------------------------------------

impl Gpu for EmuGpu {
    fn describe(&self) -> String {
        format!(
            "CUDA emulator on the CPU ({} kernels from {} files, built by {})",
            self.kernels.len(),
            self.files,
            self.compiler
        )
    }

    fn is_emulated(&self) -> bool {
        true
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        let size = bytes.max(1);
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc(layout(size)) };
        if p.is_null() {
            bail!("emulated device: out of memory allocating {bytes} B");
        }
        // Fresh device memory holds garbage: NaN as f32, -1 as integers, never zeros by luck.
        // SAFETY: `size` bytes were just allocated.
        unsafe { p.write_bytes(0xff, size) };
        self.lock().allocs.insert(p as u64, size);
        Ok(p as u64)
    }

    unsafe fn free(&self, ptr: DevPtr, bytes: usize) {
        let mut st = self.lock();
        match st.allocs.get(&ptr).copied() {
            Some(size) if size == bytes.max(1) => {
                st.allocs.remove(&ptr);
                // SAFETY: allocated by `alloc` with this size.
                unsafe { std::alloc::dealloc(ptr as *mut u8, layout(size)) };
            }
            found => {
                let msg = match found {
                    Some(size) => format!(
                        "emulated device: free of {ptr:#x} with {bytes} B, but it holds {size} B"
                    ),
                    None => format!(
                        "emulated device: free of {ptr:#x} ({bytes} B), which is not a live \
                         allocation (freed twice, or never allocated here)"
                    ),
                };
                drop(st);
                if std::thread::panicking() {
                    log::error!("{msg}");
                } else {
                    panic!("{msg}");
                }
            }
        }
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        let st = self.lock();
        st.check(dst, src.len(), "upload")?;
        // SAFETY: checked to lie inside a live allocation; host memory does not overlap it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        let st = self.lock();
        st.check(src, dst.len(), "download")?;
        // SAFETY: as in `upload`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        let st = self.lock();
        st.check(src, bytes, "copy source")?;
        st.check(dst, bytes, "copy destination")?;
        // SAFETY: both ranges checked; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        let st = self.lock();
        st.check(dst, bytes, "zero")?;
        // SAFETY: checked.
        unsafe { std::ptr::write_bytes(dst as *mut u8, 0, bytes) };
        Ok(())
    }

    fn launch(&self, name: &str, launch: Launch, args: &[KernelArg]) -> Result<()> {
        let kernel = self.kernels.get(name).ok_or_else(|| {
            anyhow!(
                "CUDA emulator: no kernel `{name}`; the emulator has {}",
                if self.kernels.is_empty() {
                    "none".to_string()
                } else {
                    self.kernel_names().join(", ")
                }
            )
        })?;
        check_shape(name, &launch)?;
        if args.len() != kernel.params.len() {
            bail!(
                "kernel `{name}` ({}) takes {} arguments ({}), got {}",
                kernel.file,
                kernel.params.len(),
                kernel
                    .params
                    .iter()
                    .map(|p| p.ty.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                args.len()
            );
        }
        for (i, (a, p)) in args.iter().zip(&kernel.params).enumerate() {
            let fits = matches!(
                (a, p.kind),
                (KernelArg::Ptr(_), b'p')
                    | (KernelArg::I32(_) | KernelArg::U32(_), b'i')
                    | (KernelArg::U64(_), b'l')
                    | (KernelArg::F32(_), b'f')
            );
            if !fits {
                bail!(
                    "kernel `{name}` ({}): argument {i} is `{}`, got {a:?}",
                    kernel.file,
                    p.ty
                );
            }
        }
        let mut st = self.lock();
        for (i, a) in args.iter().enumerate() {
            if let KernelArg::Ptr(p) = *a {
                if p != 0 && st.holder(p).is_none() {
                    bail!(
                        "kernel `{name}`: argument {i} ({:#x}) points outside every live \
                         allocation",
                        p
                    );
                }
            }
        }
        // One 8-byte slot per argument holding its value, and the array of pointers to them
        // that cuLaunchKernel's `kernelParams` is.
        let mut slots = vec![0u64; args.len()];
        for (slot, a) in slots.iter_mut().zip(args) {
            let s: *mut u64 = slot;
            // SAFETY: each slot is 8 aligned bytes; every value fits.
            unsafe {
                match *a {
                    KernelArg::Ptr(p) => s.write(p),
                    KernelArg::U64(v) => s.write(v),
                    KernelArg::I32(v) => s.cast::<i32>().write(v),
                    KernelArg::U32(v) => s.cast::<u32>().write(v),
                    KernelArg::F32(v) => s.cast::<f32>().write(v),
                }
            }
        }
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect();
        let st = &mut *st;
        let desc = EmuLaunch {
            abi: ABI,
            grid: [launch.grid.0, launch.grid.1, launch.grid.2],
            block: [launch.block.0, launch.block.1, launch.block.2],
            shared_bytes: launch.shared_bytes,
            nargs: args.len() as u32,
            reverse: self.reverse as u32,
            shared: st.shared.0,
            stack_pool: (&mut st.stacks as *mut StackPool).cast(),
            stack: stack_at,
            stack_bytes: STACK_BYTES as u64,
        };
        let mut err = vec![0u8; 4096];
        // SAFETY: the entry point of a library we built from this ABI; `params` points at
        // values of the kernel's parameter types (checked above); the pool and the shared
        // buffer are ours while the lock is held.
        let rc = unsafe {
            (kernel.launch)(
                &desc,
                params.as_mut_ptr(),
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if rc != 0 {
            let msg = CStr::from_bytes_until_nul(&err)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown error".into());
            bail!(
                "CUDA emulator: launch of {name} ({}, grid {:?}, block {:?}) failed: {msg}",
                kernel.file,
                launch.grid,
                launch.block
            );
        }
        Ok(())
    }

    fn sgemm(&self, g: &Sgemm) -> Result<()> {
        let st = self.lock();
        sgemm(&st, g)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

impl Drop for EmuGpu {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (&p, &size) in &st.allocs {
            // SAFETY: still-live allocations of `alloc` (nothing can use them any more).
            unsafe { std::alloc::dealloc(p as *mut u8, layout(size)) };
        }
        st.allocs.clear();
    }
}

/// A launch shape an H100 accepts.
fn check_shape(name: &str, l: &Launch) -> Result<()> {
    let (bx, by, bz) = l.block;
    let (gx, gy, gz) = l.grid;
    let threads = bx as u64 * by as u64 * bz as u64;
    if threads == 0 || gx == 0 || gy == 0 || gz == 0 {
        bail!(
            "kernel `{name}`: empty launch (grid {:?}, block {:?})",
            l.grid,
            l.block
        );
    }
    if threads > MAX_THREADS || bx > 1024 || by > 1024 || bz > 64 {
        bail!(
            "kernel `{name}`: block {:?} ({threads} threads; at most {MAX_THREADS}, and 1024 × \
             1024 × 64 per dimension)",
            l.block
        );
    }
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
        bail!(
            "kernel `{name}`: grid {:?} exceeds 2³¹-1 × 65535 × 65535",
            l.grid
        );
    }
    if l.shared_bytes > MAX_SHARED {
        bail!(
            "kernel `{name}`: {} B of dynamic shared memory (at most {MAX_SHARED} B per block)",
            l.shared_bytes
        );
    }
    Ok(())
}

/// `cublasSgemm` on host memory: column-major, `C = alpha·op(A)·op(B) + beta·C`.
fn sgemm(st: &State, g: &Sgemm) -> Result<()> {
    let (m, n, k) = (g.m, g.n, g.k);
    let (a_rows, a_cols) = if g.trans_a { (k, m) } else { (m, k) };
    let (b_rows, b_cols) = if g.trans_b { (n, k) } else { (k, n) };
    if g.lda < a_rows.max(1) || g.ldb < b_rows.max(1) || g.ldc < m.max(1) {
        bail!(
            "sgemm: leading dimensions lda {} (≥ {}), ldb {} (≥ {}), ldc {} (≥ {}) are invalid \
             (CUBLAS_STATUS_INVALID_VALUE)",
            g.lda,
            a_rows.max(1),
            g.ldb,
            b_rows.max(1),
            g.ldc,
            m.max(1)
        );
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    const F: usize = std::mem::size_of::<f32>();
    // The bytes a column-major rows × cols matrix with leading dimension ld spans.
    let span = |rows: usize, cols: usize, ld: usize| ((cols - 1) * ld + rows) * F;
    st.check(g.c, span(m, n, g.ldc), "sgemm C")?;
    let c = g.c as *mut f32;
    if k == 0 || g.alpha == 0.0 {
        // C = beta·C, A and B not read; beta = 0 writes zeros whatever C held.
        for j in 0..n {
            for i in 0..m {
                // SAFETY: inside C, checked above.
                unsafe {
                    let p = c.add(i + j * g.ldc);
                    *p = if g.beta == 0.0 { 0.0 } else { g.beta * *p };
                }
            }
        }
        return Ok(());
    }
    st.check(g.a, span(a_rows, a_cols, g.lda), "sgemm A")?;
    st.check(g.b, span(b_rows, b_cols, g.ldb), "sgemm B")?;
    // op(A)[i, p] and op(B)[p, j] as (row stride, column stride) in elements.
    let (rsa, csa) = if g.trans_a { (g.lda, 1) } else { (1, g.lda) };
    let (rsb, csb) = if g.trans_b { (g.ldb, 1) } else { (1, g.ldb) };
    // SAFETY: every element addressed lies in the checked spans; with `read_dst` false (beta
    // = 0) the crate reads no C, so NaNs there are ignored, as cuBLAS ignores them. The crate
    // computes dst = alpha'·dst + beta'·lhs·rhs: cuBLAS's beta and alpha, in that order.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            g.ldc as isize,
            1,
            g.beta != 0.0,
            g.a as *const f32,
            csa as isize,
            rsa as isize,
            g.b as *const f32,
            csb as isize,
            rsb as isize,
            g.beta,
            g.alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    Ok(())
}

// ---- for tests ------------------------------------------------------------------------------

/// Where test builds keep their libraries: `<target dir>/gnnpar-emu-cache` (the directory
/// holding cargo's `CACHEDIR.TAG` above the running test binary), else the system's temporary
/// directory.
pub fn test_cache_dir() -> PathBuf {
    if let Some(dir) = option_env!("CARGO_TARGET_TMPDIR") {
        return Path::new(dir).join("gnnpar-emu-cache");
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(target) = exe
            .ancestors()
            .skip(1)
            .find(|d| d.join("CACHEDIR.TAG").is_file())
        {
            return target.join("gnnpar-emu-cache");
        }
    }
    std::env::temp_dir().join("gnnpar-emu-cache")
}

/// An emulated device running `sources` (see [`EmuGpu::build`]), built under
/// [`test_cache_dir`].
pub fn emu_device_for_tests(sources: &[(&str, &str)]) -> Result<Device> {
    let emu = EmuGpu::build(sources, &test_cache_dir())?;
    Ok(Device::new(Arc::new(emu)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::gpu::{as_bytes, DevBuf};
    use crate::backend::cuda::mat::DevVec;

    fn device(sources: &[(&str, &str)]) -> Device {
        match emu_device_for_tests(sources) {
            Ok(d) => d,
            Err(e) => panic!("{e:#}"),
        }
    }

    fn reversed(sources: &[(&str, &str)]) -> Device {
        let emu = EmuGpu::build(sources, &test_cache_dir()).expect("build");
        Device::new(Arc::new(emu.with_reverse_order(true)))
    }

    fn download_f32(b: &DevBuf) -> Vec<f32> {
        b.download::<f32>().unwrap()
    }

    const BLOCK_SUM: &str = r#"
#include "helpers.cuh"
// out[b] = sum of x over block b's 256 elements, a tree in shared memory.
extern "C" __global__ void __launch_bounds__(256) block_sum(float* out, const float* x, int n) {
    __shared__ float s[256];
    unsigned t = threadIdx.x;
    unsigned i = blockIdx.x * blockDim.x + t;
    s[t] = i < (unsigned)n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) s[t] = add(s[t], s[t + half]);
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
"#;
    const HELPERS: &str = "static inline float add(float a, float b) { return a + b; }\n";

    #[test]
    fn block_sum_with_shared_memory_and_barriers() {
        let src = [("helpers.cuh", HELPERS), ("block_sum.cu", BLOCK_SUM)];
        let n = 3 * 256 - 17;
        let x: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
        let mut want = vec![0f32; 3];
        for (i, v) in x.iter().enumerate() {
            want[i / 256] += v;
        }
        for dev in [device(&src), reversed(&src)] {
            let xs = dev.upload(&x).unwrap();
            let out = dev.alloc(3 * 4).unwrap();
            dev.gpu
                .launch(
                    "block_sum",
                    Launch::blocks(3, 256),
                    &[
                        KernelArg::Ptr(out.ptr()),
                        KernelArg::Ptr(xs.ptr()),
                        KernelArg::I32(n),
                    ],
                )
                .unwrap();
            assert_eq!(download_f32(&out), want, "{}", dev.gpu.describe());
        }
    }

    const WARP: &str = r#"
// Per lane: the warp's total by xor butterfly (every lane), by shfl_down (lane 0), the
// inclusive prefix by shfl_up, lane 0's value broadcast, the ballot of x > 10, and the sum
// of each 8-lane segment (width 8).
extern "C" __global__ void warp_ops(float* xor_sum, float* down_sum, float* prefix,
                                    float* bcast, unsigned* ballot, float* seg, const float* x) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned lane = threadIdx.x % 32;
    float v = x[i];
    float a = v;
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    xor_sum[i] = a;
    float d = v;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
    down_sum[i] = lane == 0 ? d : -1.0f;
    float p = v;
    for (int o = 1; o < 32; o <<= 1) {
        float up = __shfl_up_sync(0xffffffffu, p, o);
        if (lane >= (unsigned)o) p += up;
    }
    prefix[i] = p;
    bcast[i] = __shfl_sync(0xffffffffu, v, 0);
    ballot[i] = __ballot_sync(0xffffffffu, v > 10.0f);
    float s = v;
    for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o, 8);
    seg[i] = s;
    __syncwarp();
}
"#;

    #[test]
    fn warp_shuffles_and_ballot() {
        let dev = device(&[("warp.cu", WARP)]);
        let n = 2 * 64;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7) % 23) as f32).collect();
        let xs = dev.upload(&x).unwrap();
        let outs: Vec<DevBuf> = (0..6).map(|_| dev.alloc(n * 4).unwrap()).collect();
        let mut args: Vec<KernelArg> = outs.iter().map(|b| KernelArg::Ptr(b.ptr())).collect();
        args.push(KernelArg::Ptr(xs.ptr()));
        dev.gpu
            .launch("warp_ops", Launch::blocks(2, 64), &args)
            .unwrap();
        let xor_sum = download_f32(&outs[0]);
        let down_sum = download_f32(&outs[1]);
        let prefix = download_f32(&outs[2]);
        let bcast = download_f32(&outs[3]);
        let ballot = outs[4].download::<u32>().unwrap();
        let seg = download_f32(&outs[5]);
        for w in 0..n / 32 {
            let lanes = &x[w * 32..w * 32 + 32];
            let total: f32 = lanes.iter().sum();
            let bits = lanes
                .iter()
                .enumerate()
                .filter(|(_, &v)| v > 10.0)
                .fold(0u32, |b, (l, _)| b | 1 << l);
            let mut run = 0f32;
            for l in 0..32 {
                let i = w * 32 + l;
                run += lanes[l];
                assert_eq!(xor_sum[i], total, "xor sum, lane {i}");
                assert_eq!(
                    down_sum[i],
                    if l == 0 { total } else { -1.0 },
                    "down sum {i}"
                );
                assert_eq!(prefix[i], run, "prefix {i}");
                assert_eq!(bcast[i], lanes[0], "broadcast {i}");
                assert_eq!(ballot[i], bits, "ballot {i}");
                let s0 = l / 8 * 8;
                assert_eq!(seg[i], lanes[s0..s0 + 8].iter().sum::<f32>(), "segment {i}");
            }
        }
    }

    const VOTES: &str = r#"
// A block of 48 threads: warp 1 has 16 lanes. Per thread, 10 ints of results.
extern "C" __global__ void votes(int* out, const int* x) {
    unsigned t = threadIdx.x;
    int v = x[t];
    int cnt = __syncthreads_count(v > 0);
    int any = __syncthreads_or(v > 6);
    int all = __syncthreads_and(v > -1000);
    unsigned mask = t < 32 ? 0xffffffffu : 0x0000ffffu;
    int sum = (int)__reduce_add_sync(mask, (unsigned)v);
    int mx = __reduce_max_sync(mask, v);
    unsigned same = __match_any_sync(mask, v % 3);
    int anyneg = __any_sync(mask, v < 0);
    int allpos = __all_sync(mask, v > 0);
    unsigned active = __activemask();
    float down = __shfl_down_sync(mask, (float)v, 8);
    int* o = out + t * 10;
    o[0] = cnt; o[1] = any; o[2] = all; o[3] = sum; o[4] = mx; o[5] = (int)same;
    o[6] = anyneg; o[7] = allpos; o[8] = (int)active;
    o[9] = down != down ? 1000 : (int)down;
}
"#;

    #[test]
    fn block_and_warp_votes_and_reductions() {
        let dev = device(&[("votes.cu", VOTES)]);
        let x: Vec<i32> = (0..48).map(|t| (t * 37 % 11) - 3).collect();
        let xs = DevVec::upload(&dev, &x).unwrap();
        let out = DevVec::<i32>::zeros(&dev, 48 * 10).unwrap();
        dev.gpu
            .launch(
                "votes",
                Launch::blocks(1, 48),
                &[KernelArg::Ptr(out.ptr()), KernelArg::Ptr(xs.ptr())],
            )
            .unwrap();
        let got = out.download().unwrap();
        let cnt = x.iter().filter(|&&v| v > 0).count() as i32;
        let any = x.iter().any(|&v| v > 6) as i32;
        for t in 0..48usize {
            let (lo, hi) = if t < 32 { (0, 32) } else { (32, 48) };
            let w = &x[lo..hi];
            let lane = t - lo;
            let same = w
                .iter()
                .enumerate()
                .filter(|(_, &v)| v % 3 == x[t] % 3)
                .fold(0u32, |m, (l, _)| m | 1 << l);
            // shfl_down by 8: lanes past the warp's end keep their value; warp 1 reads lanes
            // 16..23, outside its mask: the poison NaN.
            let down = if lane + 8 < 32 {
                w.get(lane + 8).copied().unwrap_or(1000)
            } else {
                x[t]
            };
            let want = [
                cnt,
                any,
                1,
                w.iter().sum::<i32>(),
                *w.iter().max().unwrap(),
                same as i32,
                w.iter().any(|&v| v < 0) as i32,
                w.iter().all(|&v| v > 0) as i32,
                if t < 32 { -1 } else { 0xffff },
                down,
            ];
            assert_eq!(&got[t * 10..t * 10 + 10], &want, "thread {t}");
        }
    }

    const ATOMICS: &str = r#"
// hist[x[i] % bins] += 1 (float atomics); bits |= 1 << (x[i] % 64) in word x[i] / 64 % words.
extern "C" __global__ void histogram(float* hist, unsigned long long* bits, const unsigned* x,
                                     unsigned n, unsigned bins, unsigned words) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        atomicAdd(&hist[x[i] % bins], 1.0f);
        atomicOr(&bits[(x[i] / 64) % words], 1ull << (x[i] % 64));
    }
}
"#;

    #[test]
    fn float_and_u64_atomics() {
        let dev = device(&[("atomics.cu", ATOMICS)]);
        let n = 10_000u32;
        let (bins, words) = (37u32, 5u32);
        let x: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2654435761) >> 7).collect();
        let xs = DevVec::upload(&dev, &x).unwrap();
        let hist = DevVec::<f32>::zeros(&dev, bins as usize).unwrap();
        let bits = DevVec::<u64>::zeros(&dev, words as usize).unwrap();
        dev.gpu
            .launch(
                "histogram",
                Launch::blocks(8, 256),
                &[
                    KernelArg::Ptr(hist.ptr()),
                    KernelArg::Ptr(bits.ptr()),
                    KernelArg::Ptr(xs.ptr()),
                    KernelArg::U32(n),
                    KernelArg::U32(bins),
                    KernelArg::U32(words),
                ],
            )
            .unwrap();
        let mut want_h = vec![0f32; bins as usize];
        let mut want_b = vec![0u64; words as usize];
        for &v in &x {
            want_h[(v % bins) as usize] += 1.0;
            want_b[((v / 64) % words) as usize] |= 1 << (v % 64);
        }
        assert_eq!(hist.download().unwrap(), want_h);
        assert_eq!(bits.download().unwrap(), want_b);
    }

    const TILE: &str = r#"
#include "tile.cuh"
// A 2-D grid of 16 × 8 blocks over a rows × cols matrix: each block stages its tile in
// dynamic shared memory, then every thread writes the element its mirror thread loaded.
extern "C" __global__ void mirror_tiles(float* out, const float* in, int rows, int cols) {
    GNNPAR_DYNAMIC_SHARED(float, tile);
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    int n = blockDim.x * blockDim.y;
    tile[t] = (r < rows && c < cols) ? in[r * cols + c] : -1.0f;
    __syncthreads();
    if (r < rows && c < cols) out[r * cols + c] = tile[n - 1 - t] + (float)(blockIdx.y * 100 + blockIdx.x);
}
"#;
    const TILE_H: &str = "#ifndef GNNPAR_EMU\n#define GNNPAR_DYNAMIC_SHARED(T, name) extern __shared__ T name[]\n#endif\n";

    #[test]
    fn dynamic_shared_memory_and_a_2d_grid() {
        let dev = device(&[("tile.cuh", TILE_H), ("tile.cu", TILE)]);
        let (rows, cols) = (16usize, 48usize);
        let x: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let xs = dev.upload(&x).unwrap();
        let out = dev.alloc(rows * cols * 4).unwrap();
        let launch = Launch {
            grid: (3, 2, 1),
            block: (16, 8, 1),
            shared_bytes: 16 * 8 * 4,
        };
        let args = [
            KernelArg::Ptr(out.ptr()),
            KernelArg::Ptr(xs.ptr()),
            KernelArg::I32(rows as i32),
            KernelArg::I32(cols as i32),
        ];
        dev.gpu.launch("mirror_tiles", launch, &args).unwrap();
        let got = download_f32(&out);
        for r in 0..rows {
            for c in 0..cols {
                let (by, bx) = (r / 8, c / 16);
                let t = (r % 8) * 16 + c % 16;
                let m = 127 - t;
                let (mr, mc) = (by * 8 + m / 16, bx * 16 + m % 16);
                let want = x[mr * cols + mc] + (by * 100 + bx) as f32;
                assert_eq!(got[r * cols + c], want, "({r}, {c})");
            }
        }
    }

    const BAD_SYNC: &str = r#"
extern "C" __global__ void early_exit(float* out) {
    if (threadIdx.x >= 100) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
extern "C" __global__ void two_barriers(float* out) {
    if (threadIdx.x < 64) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}
extern "C" __global__ void shfl_after_exit(float* out) {
    if (threadIdx.x % 32 == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
extern "C" __global__ void lonely_shfl(float* out) {
    float v = 1.0f;
    if (threadIdx.x == 3) v = __shfl_sync(0xffffffffu, v, 0);
    __syncthreads();
    out[threadIdx.x] = v;
}
extern "C" __global__ void traps(float* out) {
    if (blockIdx.x == 1 && threadIdx.x == 7) __trap();
    out[threadIdx.x] = 0.0f;
}
extern "C" __global__ void mixed_ops(float* out) {
    float v = 1.0f;
    if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else v = (float)__ballot_sync(0xffffffffu, 1);
    out[threadIdx.x] = v;
}
"#;

    #[test]
    fn barrier_and_warp_misuse_fails_the_launch() {
        let dev = device(&[("bad_sync.cu", BAD_SYNC)]);
        let out = dev.alloc(256 * 4).unwrap();
        let run = |name: &str| -> String {
            let err = dev
                .gpu
                .launch(name, Launch::blocks(2, 256), &[KernelArg::Ptr(out.ptr())])
                .expect_err(name);
            let msg = format!("{err:#}");
            assert!(msg.contains(name) && msg.contains("block (0,0,0)"), "{msg}");
            msg
        };
        let m = run("early_exit");
        assert!(
            m.contains("divergent __syncthreads()") && m.contains("bad_sync.cu:4"),
            "{m}"
        );
        let m = run("two_barriers");
        assert!(
            m.contains("divergent barrier")
                && m.contains("bad_sync.cu:9")
                && m.contains("bad_sync.cu:11"),
            "{m}"
        );
        let m = run("shfl_after_exit");
        assert!(m.contains("exited") && m.contains("__shfl_xor_sync"), "{m}");
        let m = run("lonely_shfl");
        assert!(
            m.contains("deadlock") && m.contains("thread (3,0,0) waits in __shfl_sync"),
            "{m}"
        );
        let m = run("mixed_ops");
        assert!(
            m.contains("different collectives") && m.contains("__ballot_sync"),
            "{m}"
        );
        let err = dev
            .gpu
            .launch(
                "traps",
                Launch::blocks(2, 256),
                &[KernelArg::Ptr(out.ptr())],
            )
            .unwrap_err();
        let m = format!("{err:#}");
        assert!(
            m.contains("block (1,0,0)") && m.contains("thread (7,0,0) called __trap()"),
            "{m}"
        );
        // The device still works after failed launches.
        dev.gpu
            .launch(
                "early_exit",
                Launch::blocks(1, 100),
                &[KernelArg::Ptr(out.ptr())],
            )
            .unwrap();
    }

    #[test]
    fn a_compile_error_names_the_file_and_the_message() {
        let broken =
            "extern \"C\" __global__ void broken(float* out) {\n    out[0] = undefined_thing;\n}\n";
        let err = EmuGpu::build(&[("broken.cu", broken)], &test_cache_dir()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("broken.cu"), "{msg}");
        assert!(
            msg.contains("undefined_thing") && msg.contains("error"),
            "{msg}"
        );
    }

    #[test]
    fn kernels_are_found_as_declared() {
        let text = r#"
// extern "C" __global__ void commented_out(int* p) {}
/* extern "C" __global__ void also_commented(int* p) {} */
extern "C" __global__ void plain(int* p);
extern "C" __global__ void plain(int* p) {}
extern "C" __global__ void __launch_bounds__(256, 2) bounded(float* x) {}
extern "C" __global__ __launch_bounds__(128) void bounded_first(float* x) {}
extern "C" void host_side(int x);
static const char* s = "extern \"C\" __global__ void in_a_string(";
"#;
        assert_eq!(kernel_names(text), ["plain", "bounded", "bounded_first"]);
    }

    #[test]
    fn unknown_kernels_bad_shapes_and_bad_arguments_are_refused() {
        let dev = device(&[("block_sum.cu", BLOCK_SUM), ("helpers.cuh", HELPERS)]);
        let out = dev.alloc(1024).unwrap();
        let args = [
            KernelArg::Ptr(out.ptr()),
            KernelArg::Ptr(out.ptr()),
            KernelArg::I32(0),
        ];
        let err = |name: &str, l: Launch, a: &[KernelArg]| {
            format!("{:#}", dev.gpu.launch(name, l, a).unwrap_err())
        };
        let m = err("nope", Launch::blocks(1, 32), &args);
        assert!(
            m.contains("no kernel `nope`") && m.contains("block_sum"),
            "{m}"
        );
        assert!(err("block_sum", Launch::blocks(1, 0), &args).contains("empty launch"));
        assert!(err("block_sum", Launch::blocks(1, 1025), &args).contains("1025 threads"));
        let tall = Launch {
            grid: (1, 1, 1),
            block: (1, 1, 65),
            shared_bytes: 0,
        };
        assert!(err("block_sum", tall, &args).contains("per dimension"));
        let m = err(
            "block_sum",
            Launch::blocks(1, 256).shared(228 * 1024),
            &args,
        );
        assert!(m.contains("shared memory"), "{m}");
        let m = err("block_sum", Launch::blocks(1, 256), &args[..2]);
        assert!(m.contains("takes 3 arguments"), "{m}");
        let m = err(
            "block_sum",
            Launch::blocks(1, 256),
            &[args[0], args[1], KernelArg::F32(1.0)],
        );
        assert!(m.contains("argument 2 is `int`"), "{m}");
        let m = err(
            "block_sum",
            Launch::blocks(1, 256),
            &[args[0], KernelArg::Ptr(8), args[2]],
        );
        assert!(m.contains("outside every live allocation"), "{m}");
        // Copies outside an allocation are refused too.
        let m = format!(
            "{:#}",
            dev.gpu.upload(out.at(1000), &[0u8; 100]).unwrap_err()
        );
        assert!(m.contains("runs past the end"), "{m}");
    }

    #[test]
    #[should_panic(expected = "not a live allocation")]
    fn freeing_an_unknown_pointer_panics() {
        let emu = EmuGpu::build(&[], &test_cache_dir()).unwrap();
        // SAFETY: deliberately wrong: the emulator must catch it.
        unsafe { emu.free(0x1000, 16) };
    }

    /// `C = alpha·op(A)·op(B) + beta·C`, column-major, the plain way.
    #[allow(clippy::too_many_arguments)]
    fn naive(g: &Sgemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        for j in 0..g.n {
            for i in 0..g.m {
                let mut s = 0f64;
                for p in 0..g.k {
                    let av = if g.trans_a {
                        a[p + i * g.lda]
                    } else {
                        a[i + p * g.lda]
                    };
                    let bv = if g.trans_b {
                        b[j + p * g.ldb]
                    } else {
                        b[p + j * g.ldb]
                    };
                    s += av as f64 * bv as f64;
                }
                let old = c[i + j * g.ldc];
                c[i + j * g.ldc] =
                    g.alpha * s as f32 + if g.beta == 0.0 { 0.0 } else { g.beta * old };
            }
        }
    }

    #[test]
    fn sgemm_has_cublas_semantics() {
        let dev = device(&[]);
        let (m, n, k) = (13usize, 7usize, 9usize);
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                for beta in [0.0f32, 1.0] {
                    let (ar, ac) = if trans_a { (k, m) } else { (m, k) };
                    let (br, bc) = if trans_b { (n, k) } else { (k, n) };
                    let (lda, ldb, ldc) = (ar + 3, br + 5, m + 2);
                    let a: Vec<f32> = (0..lda * ac)
                        .map(|i| ((i * 37) % 19) as f32 / 7.0 - 1.0)
                        .collect();
                    let b: Vec<f32> = (0..ldb * bc)
                        .map(|i| ((i * 11) % 13) as f32 / 5.0 - 1.0)
                        .collect();
                    // NaN in C outside op's reach and, with beta = 0, inside it too.
                    let c0: Vec<f32> = (0..ldc * n)
                        .map(|i| {
                            if beta == 0.0 || i % ldc >= m {
                                f32::NAN
                            } else {
                                i as f32 / 3.0
                            }
                        })
                        .collect();
                    let (da, db, dc) = (
                        dev.upload(&a).unwrap(),
                        dev.upload(&b).unwrap(),
                        dev.upload(&c0).unwrap(),
                    );
                    let g = Sgemm {
                        trans_a,
                        trans_b,
                        m,
                        n,
                        k,
                        alpha: 0.75,
                        a: da.ptr(),
                        lda,
                        b: db.ptr(),
                        ldb,
                        beta,
                        c: dc.ptr(),
                        ldc,
                    };
                    dev.gpu.sgemm(&g).unwrap();
                    let got = download_f32(&dc);
                    let mut want = c0.clone();
                    naive(&g, &a, &b, &mut want);
                    for j in 0..n {
                        for i in 0..ldc {
                            let (x, y) = (got[i + j * ldc], want[i + j * ldc]);
                            if i >= m {
                                assert!(x.is_nan(), "padding of C changed at ({i}, {j})");
                            } else {
                                assert!(
                                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                                    "ta {trans_a} tb {trans_b} beta {beta} ({i},{j}): {x} vs {y}"
                                );
                            }
                        }
                    }
                }
            }
        }
        // alpha = 0, beta = 0: zeros whatever C held; a bad leading dimension is refused.
        let c = dev.upload(&[f32::NAN; 4]).unwrap();
        let g = Sgemm {
            trans_a: false,
            trans_b: false,
            m: 2,
            n: 2,
            k: 0,
            alpha: 0.0,
            a: c.ptr(),
            lda: 2,
            b: c.ptr(),
            ldb: 1,
            beta: 0.0,
            c: c.ptr(),
            ldc: 2,
        };
        dev.gpu.sgemm(&g).unwrap();
        assert_eq!(download_f32(&c), [0.0; 4]);
        assert!(dev.gpu.sgemm(&Sgemm { lda: 1, k: 1, ..g }).is_err());
    }

    #[test]
    fn sgemm_is_fast_enough() {
        let dev = device(&[]);
        let (m, n, k) = (256usize, 1000usize, 256usize);
        let a = dev.upload(&vec![0.5f32; m * k]).unwrap();
        let b = dev.upload(&vec![0.25f32; k * n]).unwrap();
        let c = dev.alloc(m * n * 4).unwrap();
        let g = Sgemm {
            trans_a: false,
            trans_b: false,
            m,
            n,
            k,
            alpha: 1.0,
            a: a.ptr(),
            lda: m,
            b: b.ptr(),
            ldb: k,
            beta: 0.0,
            c: c.ptr(),
            ldc: m,
        };
        dev.gpu.sgemm(&g).unwrap();
        let t = std::time::Instant::now();
        dev.gpu.sgemm(&g).unwrap();
        eprintln!(
            "emulated sgemm 1000×256×256: {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        assert!(download_f32(&c).iter().all(|&v| v == 32.0));
    }

    const TIMING: &str = r#"
extern "C" __global__ void scale_synced(float* x, float a) {
    __shared__ float s[256];
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = x[i];
    __syncthreads();
    x[i] = a * s[blockDim.x - 1 - threadIdx.x];
}
extern "C" __global__ void scale_plain(float* x, float a) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = a * x[i];
}
extern "C" __global__ void scale_warp_sum(float* x, float a) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    x[i] = a * v / 32.0f;
}
"#;

    #[test]
    fn launch_cost() {
        let dev = device(&[("timing.cu", TIMING)]);
        let n = 64 * 256;
        let x = dev.upload(&vec![1.0f32; n]).unwrap();
        // CPU time of this thread: the cost without the noise of other processes.
        let cpu = || {
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid clock id and a valid out-pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
            t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
        };
        for name in ["scale_synced", "scale_warp_sum", "scale_plain"] {
            let args = [KernelArg::Ptr(x.ptr()), KernelArg::F32(1.0)];
            dev.gpu
                .launch(name, Launch::blocks(64, 256), &args)
                .unwrap();
            let (t, c) = (std::time::Instant::now(), cpu());
            for _ in 0..1000 {
                dev.gpu
                    .launch(name, Launch::blocks(64, 256), &args)
                    .unwrap();
            }
            let (s, c) = (t.elapsed().as_secs_f64(), cpu() - c);
            eprintln!(
                "emulator: 1000 launches of {name} (64 blocks × 256 threads): {s:.2} s wall, \
                 {c:.2} s CPU; per launch {:.0} µs CPU, per thread {:.1} ns",
                c * 1e3,
                c * 1e9 / (1000.0 * n as f64)
            );
        }
        assert_eq!(x.download::<f32>().unwrap(), vec![1.0; n]);
    }

    #[test]
    fn every_kernel_in_cuda_compiles_with_supported_parameters() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
            .expect("cuda/")
            .filter_map(|e| {
                let p = e.ok()?.path();
                let name = p.file_name()?.to_str()?.to_string();
                (name.ends_with(".cu") || name.ends_with(".cuh"))
                    .then(|| (name, std::fs::read_to_string(&p).unwrap()))
            })
            .collect();
        files.sort();
        if !files.iter().any(|(n, _)| n.ends_with(".cu")) {
            eprintln!("SKIPPED: no kernels in cuda/ yet");
            return;
        }
        let sources: Vec<(&str, &str)> = files
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        let emu = match EmuGpu::build(&sources, &test_cache_dir()) {
            Ok(e) => e,
            Err(e) => panic!("{e:#}"),
        };
        assert!(!emu.kernels.is_empty());
        for (name, k) in &emu.kernels {
            for p in &k.params {
                assert!(
                    b"pilf".contains(&p.kind),
                    "kernel {name} ({}): parameter `{}` has no KernelArg",
                    k.file,
                    p.ty
                );
            }
        }
        eprintln!("{}", emu.describe());
    }

    #[test]
    fn copies_and_zero() {
        let dev = device(&[]);
        let a = dev.upload(&[1u32, 2, 3, 4]).unwrap();
        let b = dev.alloc(16).unwrap();
        // Fresh memory is poisoned, not zero.
        assert_eq!(b.download::<u32>().unwrap(), [u32::MAX; 4]);
        dev.gpu.copy(b.ptr(), a.ptr(), 16).unwrap();
        dev.gpu.zero(b.at(4), 8).unwrap();
        assert_eq!(b.download::<u32>().unwrap(), [1, 0, 0, 4]);
        dev.gpu.upload(b.at(12), as_bytes(&[9u32])).unwrap();
        assert_eq!(b.download::<u32>().unwrap(), [1, 0, 0, 9]);
        assert_eq!(dev.memory.current(), 32);
    }
}
