//! NVRTC, the CUDA run-time compiler, loaded with `libloading` from wherever [`super::libs`]
//! finds it (no CUDA toolkit is needed to build gnnpar, and no GPU to compile a kernel).
//!
//! A `.cu` file is compiled with its headers (given by name, as `#include "common.cuh"` asks)
//! for one architecture, with `-default-device --std=c++17 -lineinfo`:
//!
//! * to **PTX** for `compute_XY` ([`Target::Ptx`], the default): the driver JIT-compiles it for
//!   the GPU when the module is loaded. PTX made by NVRTC `M.m` needs a driver for CUDA `M.m`
//!   or newer;
//! * to a **CUBIN** for `sm_XY` ([`Target::Cubin`]): machine code, which any driver of the same
//!   major loads. [`Target::for_driver`] picks it when the NVRTC is a newer minor than the
//!   driver (CUDA's minor-version compatibility covers CUBINs, not PTX).
//!
//! An NVRTC of a newer major than the driver is refused by [`Nvrtc::find`] (an older one found
//! elsewhere is taken instead), with a message saying why.
//!
//! Compiled images are cached on disk ([`PtxCache`]): a small kernel takes NVRTC about 0.2 s,
//! and the backend compiles a dozen files at every start of every rank.

use super::libs::{self, CudaVersion, Lib, Missing, SearchEnv, SystemEnv};
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

type NvrtcResult = c_int;
type Program = *mut c_void;

const NVRTC_SUCCESS: NvrtcResult = 0;

type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> NvrtcResult;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult;
type BytesFn = unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> NvrtcResult;
type ErrorStringFn = unsafe extern "C" fn(NvrtcResult) -> *const c_char;
type NumArchsFn = unsafe extern "C" fn(*mut c_int) -> NvrtcResult;
type ArchsFn = unsafe extern "C" fn(*mut c_int) -> NvrtcResult;

/// What NVRTC makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// PTX for `compute_XY`, compiled for the GPU by the driver.
    Ptx,
    /// A CUBIN (machine code) for `sm_XY`.
    Cubin,
}

impl Target {
    /// PTX when the driver is at least as new as the NVRTC, else a CUBIN (same major: the
    /// driver loads it; [`Nvrtc::find`] refuses a newer major).
    pub fn for_driver(nvrtc: CudaVersion, driver: CudaVersion) -> Target {
        if nvrtc <= driver {
            Target::Ptx
        } else {
            Target::Cubin
        }
    }
}

/// A compiled module image, as `cuModuleLoadData` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The `.cu` file it came from.
    pub file_name: String,
    /// `compute_XY` (PTX) or `sm_XY` (CUBIN).
    pub arch: String,
    pub target: Target,
    /// The PTX text with a terminating NUL, or the CUBIN's bytes.
    pub bytes: Vec<u8>,
}

impl Image {
    /// The PTX text (empty for a CUBIN).
    pub fn ptx(&self) -> &str {
        match self.target {
            Target::Ptx => std::str::from_utf8(&self.bytes)
                .unwrap_or("")
                .trim_end_matches('\0'),
            Target::Cubin => "",
        }
    }
}

/// A PTX module (an [`Image`] with [`Target::Ptx`]).
pub type Ptx = Image;

/// A loaded NVRTC.
pub struct Nvrtc {
    path: PathBuf,
    version: CudaVersion,
    /// Architectures it compiles for (`[75, 80, …]`), when it can say.
    archs: Vec<u32>,
    create: CreateFn,
    compile: CompileFn,
    log_size: SizeFn,
    log: BytesFn,
    ptx_size: SizeFn,
    ptx: BytesFn,
    cubin_size: Option<SizeFn>,
    cubin: Option<BytesFn>,
    destroy: DestroyFn,
    error_string: ErrorStringFn,
    /// Keeps the function pointers above valid.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NVRTC {} ({})", self.version, self.path.display())
    }
}

/// A symbol of `lib` as a function pointer of type `F`.
///
/// # Safety
/// `F` is the symbol's C signature.
pub(crate) unsafe fn symbol<F: Copy>(lib: &libloading::Library, name: &str) -> Result<F, String> {
    let with_nul = format!("{name}\0");
    // SAFETY: the caller names the signature.
    unsafe { lib.get::<F>(with_nul.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("no symbol {name}: {}", libs::one_line(&e.to_string())))
}

impl Nvrtc {
    /// Bind the functions of an opened NVRTC.
    pub fn from_library(lib: libloading::Library, path: &Path) -> Result<Nvrtc, String> {
        // SAFETY: each type is the function's signature in nvrtc.h.
        unsafe {
            let version: VersionFn = symbol(&lib, "nvrtcVersion")?;
            let (mut major, mut minor) = (0, 0);
            if version(&mut major, &mut minor) != NVRTC_SUCCESS {
                return Err("nvrtcVersion failed".into());
            }
            let mut archs = Vec::new();
            if let (Ok(num), Ok(get)) = (
                symbol::<NumArchsFn>(&lib, "nvrtcGetNumSupportedArchs"),
                symbol::<ArchsFn>(&lib, "nvrtcGetSupportedArchs"),
            ) {
                let mut n = 0;
                if num(&mut n) == NVRTC_SUCCESS && n > 0 {
                    let mut v = vec![0 as c_int; n as usize];
                    if get(v.as_mut_ptr()) == NVRTC_SUCCESS {
                        archs = v.into_iter().map(|a| a.max(0) as u32).collect();
                        archs.sort_unstable();
                    }
                }
            }
            Ok(Nvrtc {
                path: path.to_path_buf(),
                version: CudaVersion {
                    major: major.max(0) as u32,
                    minor: minor.max(0) as u32,
                },
                archs,
                create: symbol(&lib, "nvrtcCreateProgram")?,
                compile: symbol(&lib, "nvrtcCompileProgram")?,
                log_size: symbol(&lib, "nvrtcGetProgramLogSize")?,
                log: symbol(&lib, "nvrtcGetProgramLog")?,
                ptx_size: symbol(&lib, "nvrtcGetPTXSize")?,
                ptx: symbol(&lib, "nvrtcGetPTX")?,
                cubin_size: symbol(&lib, "nvrtcGetCUBINSize").ok(),
                cubin: symbol(&lib, "nvrtcGetCUBIN").ok(),
                destroy: symbol(&lib, "nvrtcDestroyProgram")?,
                error_string: symbol(&lib, "nvrtcGetErrorString")?,
                _lib: lib,
            })
        }
    }

    /// Open the NVRTC at `path` (a file, or a bare name for the loader's search).
    pub fn open(path: &Path) -> Result<Nvrtc> {
        // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }
            .with_context(|| format!("loading {}", path.display()))?;
        Nvrtc::from_library(lib, path).map_err(|e| anyhow!("{}: {e}", path.display()))
    }

    /// The first NVRTC found in [`libs`]' order that loads and, when the driver's CUDA version
    /// is given, whose major is not newer than the driver's (PTX of NVRTC 13 needs a CUDA 13
    /// driver): an older NVRTC found later is preferred to a refusal.
    pub fn find(env: &dyn SearchEnv, driver: Option<CudaVersion>) -> Result<Nvrtc, Missing> {
        let (_, n) = libs::load(Lib::Nvrtc, env, |c| {
            let n = Nvrtc::from_library(libs::dlopen(c)?, &c.path).map_err(Some)?;
            match driver {
                Some(d) if n.version.major > d.major => Err(Some(format!(
                    "NVRTC {} makes code that needs a CUDA {} driver, and this driver is \
                     CUDA {d} (install an NVRTC {}.x, or a newer driver)",
                    n.version, n.version.major, d.major
                ))),
                _ => Ok(n),
            }
        })?;
        Ok(n)
    }

    /// [`Nvrtc::find`] in the real environment, once per process and driver version.
    pub fn shared(driver: Option<CudaVersion>) -> Result<Arc<Nvrtc>, Missing> {
        type Cache = Vec<(Option<CudaVersion>, Result<Arc<Nvrtc>, Missing>)>;
        static CACHE: Mutex<Cache> = Mutex::new(Vec::new());
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, r)) = cache.iter().find(|(d, _)| *d == driver) {
            return r.clone();
        }
        let r = Nvrtc::find(&SystemEnv, driver).map(Arc::new);
        cache.push((driver, r.clone()));
        r
    }

    /// Its version (`nvrtcVersion`).
    pub fn version(&self) -> CudaVersion {
        self.version
    }

    /// Where it was loaded from (a bare name when the loader found it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The architectures it compiles for (`[75, 80, 86, 89, 90, …]`; empty when it cannot
    /// say).
    pub fn supported_archs(&self) -> &[u32] {
        &self.archs
    }

    /// The architecture to compile for on a device of compute capability `cc` (`90` for
    /// sm_90): `cc` itself when supported, else for PTX the newest supported one below it
    /// (the driver JIT-compiles older PTX for a newer GPU).
    pub fn arch_for(&self, cc: u32, target: Target) -> Result<u32> {
        if self.archs.is_empty() || self.archs.contains(&cc) {
            return Ok(cc);
        }
        let lower = self.archs.iter().copied().filter(|&a| a <= cc).max();
        match (lower, target) {
            (Some(a), Target::Ptx) => Ok(a),
            _ => bail!(
                "NVRTC {} ({}) cannot compile for sm_{cc} (it supports {})",
                self.version,
                self.path.display(),
                self.archs
                    .iter()
                    .map(|a| format!("sm_{a}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// NVRTC's message for a status.
    fn error(&self, r: NvrtcResult) -> String {
        // SAFETY: nvrtcGetErrorString returns a static string for any value.
        let p = unsafe { (self.error_string)(r) };
        if p.is_null() {
            format!("NVRTC error {r}")
        } else {
            // SAFETY: a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    /// Compile `source` (named `file_name` in messages and `#line`s) to PTX for `arch`
    /// (`sm_90`, `compute_90` or `90`), with `headers` (`(name, text)`) available to its
    /// `#include "name"`s.
    pub fn compile_ptx(
        &self,
        file_name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: &str,
    ) -> Result<Ptx> {
        self.compile(file_name, source, headers, parse_arch(arch)?, Target::Ptx)
    }

    /// Compile `source` for compute capability `arch` (`90`) to `target`. A compile error
    /// returns NVRTC's log, which names the file and line.
    pub fn compile(
        &self,
        file_name: &str,
        source: &str,
        headers: &[(&str, &str)],
        arch: u32,
        target: Target,
    ) -> Result<Image> {
        let arch_name = match target {
            Target::Ptx => format!("compute_{arch}"),
            Target::Cubin => format!("sm_{arch}"),
        };
        let cstr = |s: &str, what: &str| {
            CString::new(s).map_err(|_| anyhow!("{file_name}: {what} holds a NUL byte"))
        };
        let src = cstr(source, "the source")?;
        let name = cstr(file_name, "the file name")?;
        let header_texts = headers
            .iter()
            .map(|(n, t)| cstr(t, &format!("header {n}")))
            .collect::<Result<Vec<_>>>()?;
        let header_names = headers
            .iter()
            .map(|(n, _)| cstr(n, "a header name"))
            .collect::<Result<Vec<_>>>()?;
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
        let options: Vec<CString> = [
            format!("--gpu-architecture={arch_name}"),
            "-default-device".into(),
            "--std=c++17".into(),
            "-lineinfo".into(),
        ]
        .into_iter()
        .map(|o| CString::new(o).expect("no NUL in options"))
        .collect();
        let option_ptrs: Vec<*const c_char> = options.iter().map(|s| s.as_ptr()).collect();
        let what = || {
            format!(
                "NVRTC {} compiling {file_name} for {arch_name}",
                self.version
            )
        };

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is to a live NUL-terminated string; the arrays have
        // `headers.len()` entries.
        let r = unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                headers.len() as c_int,
                if headers.is_empty() {
                    std::ptr::null()
                } else {
                    text_ptrs.as_ptr()
                },
                if headers.is_empty() {
                    std::ptr::null()
                } else {
                    name_ptrs.as_ptr()
                },
            )
        };
        if r != NVRTC_SUCCESS {
            bail!("{}: nvrtcCreateProgram: {}", what(), self.error(r));
        }
        let prog = ProgramGuard { nvrtc: self, prog };
        // SAFETY: a live program; the options outlive the call.
        let r =
            unsafe { (self.compile)(prog.prog, option_ptrs.len() as c_int, option_ptrs.as_ptr()) };
        if r != NVRTC_SUCCESS {
            let log = self.program_log(prog.prog).unwrap_or_default();
            bail!(
                "{} failed ({}):\n{}",
                what(),
                self.error(r),
                if log.trim().is_empty() {
                    "(no log)"
                } else {
                    log.trim_end()
                }
            );
        }
        let (size_fn, get_fn) = match target {
            Target::Ptx => (self.ptx_size, self.ptx),
            Target::Cubin => match (self.cubin_size, self.cubin) {
                (Some(s), Some(g)) => (s, g),
                _ => bail!("{}: this NVRTC cannot make CUBINs", what()),
            },
        };
        let mut size = 0usize;
        // SAFETY: a compiled program; `size` is written.
        let r = unsafe { size_fn(prog.prog, &mut size) };
        if r != NVRTC_SUCCESS {
            bail!("{}: getting the output size: {}", what(), self.error(r));
        }
        let mut bytes = vec![0u8; size];
        // SAFETY: `bytes` holds `size` bytes, as asked.
        let r = unsafe { get_fn(prog.prog, bytes.as_mut_ptr().cast()) };
        if r != NVRTC_SUCCESS {
            bail!("{}: getting the output: {}", what(), self.error(r));
        }
        if target == Target::Ptx && bytes.last() != Some(&0) {
            bytes.push(0);
        }
        Ok(Image {
            file_name: file_name.to_string(),
            arch: arch_name,
            target,
            bytes,
        })
    }

    fn program_log(&self, prog: Program) -> Option<String> {
        let mut size = 0usize;
        // SAFETY: a live program.
        if unsafe { (self.log_size)(prog, &mut size) } != NVRTC_SUCCESS || size == 0 {
            return None;
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the size NVRTC asked for.
        if unsafe { (self.log)(prog, buf.as_mut_ptr().cast()) } != NVRTC_SUCCESS {
            return None;
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Some(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// Compile every `.cu` of `sources` (the `.cuh` among them are the headers), in parallel,
    /// through `cache` when given. Images come back in the order of `sources`.
    pub fn compile_all(
        &self,
        sources: &[(&str, &str)],
        arch: u32,
        target: Target,
        cache: Option<&PtxCache>,
    ) -> Result<Vec<Image>> {
        let headers: Vec<(&str, &str)> = sources
            .iter()
            .copied()
            .filter(|(n, _)| !n.ends_with(".cu"))
            .collect();
        let units: Vec<(&str, &str)> = sources
            .iter()
            .copied()
            .filter(|(n, _)| n.ends_with(".cu"))
            .collect();
        let one = |(name, text): (&str, &str)| -> Result<Image> {
            let key = cache.map(|_| cache_key(self.version, name, text, &headers, arch, target));
            if let (Some(c), Some(k)) = (cache, &key) {
                if let Some(img) = c.get(k, name, arch, target) {
                    return Ok(img);
                }
            }
            let img = self.compile(name, text, &headers, arch, target)?;
            if let (Some(c), Some(k)) = (cache, &key) {
                c.put(k, &img);
            }
            Ok(img)
        };
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 8);
        if threads == 1 || units.len() < 2 {
            return units.into_iter().map(one).collect();
        }
        // NVRTC compiles different programs from several threads at once.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Mutex<Option<Result<Image>>>> =
            units.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..threads.min(units.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= units.len() {
                        break;
                    }
                    let r = one(units[i]);
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                });
            }
        });
        results
            .into_iter()
            .map(|m| {
                m.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every unit compiled")
            })
            .collect()
    }
}

/// Destroys the program on every path out of [`Nvrtc::compile`].
struct ProgramGuard<'a> {
    nvrtc: &'a Nvrtc,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once.
        unsafe { (self.nvrtc.destroy)(&mut self.prog) };
    }
}

// SAFETY: NVRTC's functions may be called from any thread, concurrently for different
// programs; `Nvrtc` holds only function pointers and the library handle.
unsafe impl Send for Nvrtc {}
unsafe impl Sync for Nvrtc {}

/// `sm_90`, `compute_90` or `90` → 90.
pub fn parse_arch(arch: &str) -> Result<u32> {
    let digits = arch
        .strip_prefix("sm_")
        .or_else(|| arch.strip_prefix("compute_"))
        .unwrap_or(arch);
    digits
        .parse()
        .map_err(|_| anyhow!("architecture {arch:?}: expected sm_XY, compute_XY or XY"))
}

/// Compile `source` to PTX for `arch` with the NVRTC found in this environment (see
/// [`Nvrtc::find`]).
pub fn compile_ptx(
    file_name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
) -> Result<Ptx> {
    let nvrtc = Nvrtc::shared(None).map_err(|m| anyhow!("{m}"))?;
    nvrtc.compile_ptx(file_name, source, headers, arch)
}

// ---- the on-disk cache ----------------------------------------------------------------------

/// FNV-1a over length-prefixed parts, 64 bits, two different offset bases: 128 bits of key.
fn cache_key(
    nvrtc: CudaVersion,
    name: &str,
    text: &str,
    headers: &[(&str, &str)],
    arch: u32,
    target: Target,
) -> String {
    let mut parts: Vec<Vec<u8>> = vec![
        b"gnnpar-nvrtc-1 -default-device --std=c++17 -lineinfo".to_vec(),
        format!("{nvrtc} {arch} {target:?}").into_bytes(),
        name.as_bytes().to_vec(),
        text.as_bytes().to_vec(),
    ];
    for (n, t) in headers {
        parts.push(n.as_bytes().to_vec());
        parts.push(t.as_bytes().to_vec());
    }
    let fnv = |basis: u64| {
        let mut h = basis;
        let mut eat = |b: u8| {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        };
        for p in &parts {
            for b in (p.len() as u64).to_le_bytes() {
                eat(b);
            }
            for &b in p {
                eat(b);
            }
        }
        h
    };
    format!(
        "{:016x}{:016x}",
        fnv(0xcbf2_9ce4_8422_2325),
        fnv(0x6c62_272e_07bb_0142)
    )
}

/// Compiled images on disk, one file per (sources, architecture, target, NVRTC version),
/// written atomically (a temporary file, then a rename); an entry that cannot be read is
/// compiled again, a cache that cannot be written is only logged.
#[derive(Clone, Debug)]
pub struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    /// A cache in `dir` (created on the first write).
    pub fn at(dir: impl Into<PathBuf>) -> PtxCache {
        PtxCache { dir: dir.into() }
    }

    /// `$GNNPAR_PTX_CACHE` (`off` disables it), else `$XDG_CACHE_HOME/gnnpar/ptx`, else
    /// `~/.cache/gnnpar/ptx`; `None` when disabled or no home is known.
    pub fn default_location() -> Option<PtxCache> {
        let var = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty());
        if let Some(d) = var("GNNPAR_PTX_CACHE") {
            return (d != "off" && d != "0").then(|| PtxCache::at(d));
        }
        if let Some(x) = var("XDG_CACHE_HOME") {
            return Some(PtxCache::at(Path::new(&x).join("gnnpar/ptx")));
        }
        var("HOME").map(|h| PtxCache::at(Path::new(&h).join(".cache/gnnpar/ptx")))
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str, name: &str, target: Target) -> PathBuf {
        let stem = name.trim_end_matches(".cu");
        let ext = match target {
            Target::Ptx => "ptx",
            Target::Cubin => "cubin",
        };
        self.dir.join(format!("{stem}-{key}.{ext}"))
    }

    fn get(&self, key: &str, name: &str, arch: u32, target: Target) -> Option<Image> {
        let mut bytes = std::fs::read(self.path(key, name, target)).ok()?;
        if bytes.is_empty() {
            return None;
        }
        if target == Target::Ptx {
            // A PTX file must be text that declares a target; anything else is compiled again.
            let text = std::str::from_utf8(&bytes).ok()?;
            if !text.contains(".target") {
                return None;
            }
            if bytes.last() != Some(&0) {
                bytes.push(0);
            }
        } else if !bytes.starts_with(b"\x7fELF") {
            return None;
        }
        Some(Image {
            file_name: name.to_string(),
            arch: match target {
                Target::Ptx => format!("compute_{arch}"),
                Target::Cubin => format!("sm_{arch}"),
            },
            target,
            bytes,
        })
    }

    fn put(&self, key: &str, img: &Image) {
        let path = self.path(key, &img.file_name, img.target);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let tmp = self.dir.join(format!(
                ".{}.{}.tmp",
                path.file_name().unwrap_or_default().to_string_lossy(),
                std::process::id()
            ));
            let body = match img.target {
                Target::Ptx => &img.bytes[..img.bytes.len().saturating_sub(1)],
                Target::Cubin => &img.bytes[..],
            };
            std::fs::write(&tmp, body)?;
            std::fs::rename(&tmp, &path).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        };
        if let Err(e) = write() {
            log::debug!("PTX cache: cannot write {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_parse_in_every_spelling() {
        assert_eq!(parse_arch("sm_90").unwrap(), 90);
        assert_eq!(parse_arch("compute_80").unwrap(), 80);
        assert_eq!(parse_arch("120").unwrap(), 120);
        assert!(parse_arch("hopper").is_err());
    }

    #[test]
    fn ptx_needs_a_driver_as_new_as_the_nvrtc_else_a_cubin() {
        let v = |major, minor| CudaVersion { major, minor };
        assert_eq!(Target::for_driver(v(12, 9), v(13, 0)), Target::Ptx);
        assert_eq!(Target::for_driver(v(12, 4), v(12, 4)), Target::Ptx);
        assert_eq!(Target::for_driver(v(12, 9), v(12, 2)), Target::Cubin);
        assert_eq!(CudaVersion::from_encoded(12040), v(12, 4));
        assert_eq!(CudaVersion::from_encoded(13000).to_string(), "13.0");
    }

    #[test]
    fn cache_keys_change_with_every_input() {
        let v = CudaVersion {
            major: 12,
            minor: 9,
        };
        let base = cache_key(v, "a.cu", "x", &[("h.cuh", "y")], 90, Target::Ptx);
        assert_eq!(base.len(), 32);
        for other in [
            cache_key(v, "a.cu", "x", &[("h.cuh", "z")], 90, Target::Ptx),
            cache_key(v, "a.cu", "x", &[("h.cuh", "y")], 80, Target::Ptx),
            cache_key(v, "a.cu", "x", &[("h.cuh", "y")], 90, Target::Cubin),
            cache_key(v, "b.cu", "x", &[("h.cuh", "y")], 90, Target::Ptx),
            cache_key(
                CudaVersion {
                    major: 13,
                    minor: 0,
                },
                "a.cu",
                "x",
                &[("h.cuh", "y")],
                90,
                Target::Ptx,
            ),
            // Moving a byte between parts changes the key (parts are length-prefixed).
            cache_key(v, "a.cu", "xh", &[(".cuh", "y")], 90, Target::Ptx),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(
            base,
            cache_key(v, "a.cu", "x", &[("h.cuh", "y")], 90, Target::Ptx)
        );
    }

    #[test]
    fn the_cache_round_trips_and_ignores_what_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::at(dir.path().join("ptx"));
        let img = Image {
            file_name: "k.cu".into(),
            arch: "compute_90".into(),
            target: Target::Ptx,
            bytes: b"// ptx\n.version 8.8\n.target sm_90\n\0".to_vec(),
        };
        assert!(cache.get("key", "k.cu", 90, Target::Ptx).is_none());
        cache.put("key", &img);
        assert_eq!(cache.get("key", "k.cu", 90, Target::Ptx).unwrap(), img);
        // A truncated or foreign file is a miss, not an error.
        let path = cache.path("key", "k.cu", Target::Ptx);
        std::fs::write(&path, b"\xff\xfe garbage").unwrap();
        assert!(cache.get("key", "k.cu", 90, Target::Ptx).is_none());
        std::fs::write(cache.path("c", "k.cu", Target::Cubin), b"not elf").unwrap();
        assert!(cache.get("c", "k.cu", 90, Target::Cubin).is_none());
        // No temporary files are left behind.
        let left: Vec<_> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // An unwritable cache is only logged.
        let blocked = PtxCache::at(dir.path().join("file").join("ptx"));
        std::fs::write(dir.path().join("file"), b"").unwrap();
        blocked.put("key", &img);
        assert!(blocked.get("key", "k.cu", 90, Target::Ptx).is_none());
    }
}
