//! cuBLAS, loaded with `libloading` from wherever [`super::libs`] finds it: the few entry
//! points the backend needs (a handle on the device's stream, SGEMM, the math mode) and
//! cuBLAS's status strings.
//!
//! `libcublas` links against `libcublasLt`; a toolkit directory that is not on the loader path
//! would leave that dependency unresolved, so the `libcublasLt` of the same directory (and
//! major) is loaded first and kept loaded: the loader then satisfies `libcublas`'s dependency
//! with it, matched by its soname.

use super::libs::{self, Candidate, Lib, Missing, SearchEnv};
use super::nvrtc::symbol;
use anyhow::{bail, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

type Status = c_int;
/// `cublasHandle_t`.
pub type Handle = *mut c_void;

const CUBLAS_STATUS_SUCCESS: Status = 0;
const CUBLAS_OP_N: c_int = 0;
const CUBLAS_OP_T: c_int = 1;
/// `CUBLAS_DEFAULT_MATH`: full fp32.
const CUBLAS_DEFAULT_MATH: c_int = 0;
/// `CUBLAS_TF32_TENSOR_OP_MATH`: fp32 products on TF32 tensor cores.
const CUBLAS_TF32_TENSOR_OP_MATH: c_int = 3;

type CreateFn = unsafe extern "C" fn(*mut Handle) -> Status;
type DestroyFn = unsafe extern "C" fn(Handle) -> Status;
type SetStreamFn = unsafe extern "C" fn(Handle, *mut c_void) -> Status;
type SetMathModeFn = unsafe extern "C" fn(Handle, c_int) -> Status;
type GetVersionFn = unsafe extern "C" fn(Handle, *mut c_int) -> Status;
type GetPropertyFn = unsafe extern "C" fn(c_int, *mut c_int) -> Status;
type StatusStringFn = unsafe extern "C" fn(Status) -> *const c_char;
#[allow(clippy::type_complexity)]
type SgemmFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    *const f32,
    *mut f32,
    c_int,
) -> Status;

/// cuBLAS's version, `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CublasVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl std::fmt::Display for CublasVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Precision of the products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MathMode {
    /// Full fp32 (`CUBLAS_DEFAULT_MATH`): what the CPU backend computes.
    #[default]
    Fp32,
    /// fp32 in and out, TF32 tensor cores inside (`CUBLAS_TF32_TENSOR_OP_MATH`): faster, about
    /// 1e-3 relative.
    Tf32,
}

/// A loaded cuBLAS.
pub struct Cublas {
    path: PathBuf,
    lt_path: Option<PathBuf>,
    version: CublasVersion,
    create: CreateFn,
    destroy: DestroyFn,
    set_stream: SetStreamFn,
    set_math_mode: SetMathModeFn,
    get_version: GetVersionFn,
    sgemm: SgemmFn,
    status_string: Option<StatusStringFn>,
    _lib: libloading::Library,
    /// Loaded before `_lib` and dropped after it.
    _lt: Option<libloading::Library>,
}

impl std::fmt::Debug for Cublas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuBLAS {} ({})", self.version, self.path.display())
    }
}

// SAFETY: cuBLAS's functions may be called from any thread; `Cublas` holds only function
// pointers and library handles (a `Handle` is used under the caller's lock).
unsafe impl Send for Cublas {}
unsafe impl Sync for Cublas {}

/// The `libcublasLt` beside a `libcublas` candidate: the same directory (or the loader path)
/// and the same major.
fn lt_for(c: &Candidate) -> PathBuf {
    let name = c
        .path
        .file_name()
        .map(|n| n.to_string_lossy().replacen("libcublas", "libcublasLt", 1))
        .unwrap_or_default();
    c.path.with_file_name(name)
}

impl Cublas {
    /// Open a `libcublas` candidate (its `libcublasLt` first) and bind the functions.
    fn open(c: &Candidate) -> Result<Cublas, Option<String>> {
        let lt_path = lt_for(c);
        let lt_cand = Candidate {
            path: lt_path.clone(),
            major: c.major,
            origin: c.origin.clone(),
        };
        // A missing Lt is not fatal by itself: libcublas may find it through its RUNPATH.
        let lt = if c.on_loader_path() || lt_path.exists() {
            libs::dlopen(&lt_cand).ok()
        } else {
            None
        };
        let lib = libs::dlopen(c)?;
        Cublas::from_library(lib, lt, &c.path, lt_path).map_err(Some)
    }

    fn from_library(
        lib: libloading::Library,
        lt: Option<libloading::Library>,
        path: &Path,
        lt_path: PathBuf,
    ) -> Result<Cublas, String> {
        // SAFETY: each type is the function's signature in cublas_api.h.
        unsafe {
            let get_property: GetPropertyFn = symbol(&lib, "cublasGetProperty")?;
            let mut v = [0 as c_int; 3];
            for (i, slot) in v.iter_mut().enumerate() {
                // libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
                if get_property(i as c_int, slot) != CUBLAS_STATUS_SUCCESS {
                    return Err("cublasGetProperty failed".into());
                }
            }
            Ok(Cublas {
                path: path.to_path_buf(),
                lt_path: lt.as_ref().map(|_| lt_path),
                version: CublasVersion {
                    major: v[0].max(0) as u32,
                    minor: v[1].max(0) as u32,
                    patch: v[2].max(0) as u32,
                },
                create: symbol(&lib, "cublasCreate_v2")?,
                destroy: symbol(&lib, "cublasDestroy_v2")?,
                set_stream: symbol(&lib, "cublasSetStream_v2")?,
                set_math_mode: symbol(&lib, "cublasSetMathMode")?,
                get_version: symbol(&lib, "cublasGetVersion_v2")?,
                sgemm: symbol(&lib, "cublasSgemm_v2")?,
                status_string: symbol(&lib, "cublasGetStatusString").ok(),
                _lib: lib,
                _lt: lt,
            })
        }
    }

    /// The first cuBLAS found in [`libs`]' order that loads and whose major is not newer than
    /// `max_major` (the driver's CUDA major: cuBLAS 13 needs a CUDA 13 driver).
    pub fn find(env: &dyn SearchEnv, max_major: Option<u32>) -> Result<Cublas, Missing> {
        let (_, c) = libs::load(Lib::Cublas, env, |c| {
            let b = Cublas::open(c)?;
            match max_major {
                Some(m) if b.version.major > m => Err(Some(format!(
                    "cuBLAS {} needs a CUDA {} driver, and this driver is CUDA {m}",
                    b.version, b.version.major
                ))),
                _ => Ok(b),
            }
        })?;
        Ok(c)
    }

    /// Its version (`cublasGetProperty`).
    pub fn version(&self) -> CublasVersion {
        self.version
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where its `libcublasLt` was loaded from (when gnnpar loaded it).
    pub fn lt_path(&self) -> Option<&Path> {
        self.lt_path.as_deref()
    }

    /// cuBLAS's name and description of a status.
    pub fn status(&self, s: Status) -> String {
        let name = match s {
            0 => "CUBLAS_STATUS_SUCCESS",
            1 => "CUBLAS_STATUS_NOT_INITIALIZED",
            3 => "CUBLAS_STATUS_ALLOC_FAILED",
            7 => "CUBLAS_STATUS_INVALID_VALUE",
            8 => "CUBLAS_STATUS_ARCH_MISMATCH",
            11 => "CUBLAS_STATUS_MAPPING_ERROR",
            13 => "CUBLAS_STATUS_EXECUTION_FAILED",
            14 => "CUBLAS_STATUS_INTERNAL_ERROR",
            15 => "CUBLAS_STATUS_NOT_SUPPORTED",
            16 => "CUBLAS_STATUS_LICENSE_ERROR",
            _ => "CUBLAS_STATUS_UNKNOWN",
        };
        let text = self.status_string.and_then(|f| {
            // SAFETY: returns a static string for any status.
            let p = unsafe { f(s) };
            // SAFETY: a NUL-terminated static string when not null.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        });
        match text {
            Some(t) if t != name => format!("{name} ({s}): {t}"),
            _ => format!("{name} ({s})"),
        }
    }

    fn check(&self, s: Status, what: &str) -> Result<()> {
        if s == CUBLAS_STATUS_SUCCESS {
            Ok(())
        } else {
            bail!("cuBLAS {what}: {}", self.status(s))
        }
    }

    /// A handle on the current context's device, its work queued on `stream`.
    ///
    /// # Safety
    /// A context is current on this thread and `stream` belongs to it.
    pub unsafe fn create_handle(&self, stream: *mut c_void, math: MathMode) -> Result<Handle> {
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: `h` is written on success.
        self.check(unsafe { (self.create)(&mut h) }, "cublasCreate")?;
        let setup = || -> Result<()> {
            // SAFETY: a live handle; the caller vouches for the stream.
            self.check(unsafe { (self.set_stream)(h, stream) }, "cublasSetStream")?;
            let mode = match math {
                MathMode::Fp32 => CUBLAS_DEFAULT_MATH,
                MathMode::Tf32 => CUBLAS_TF32_TENSOR_OP_MATH,
            };
            // SAFETY: a live handle.
            self.check(
                unsafe { (self.set_math_mode)(h, mode) },
                "cublasSetMathMode",
            )
        };
        if let Err(e) = setup() {
            // SAFETY: created above, not used again.
            unsafe { (self.destroy)(h) };
            return Err(e);
        }
        Ok(h)
    }

    /// Destroy a handle.
    ///
    /// # Safety
    /// `h` came from [`Cublas::create_handle`], its context is current, and it is not used
    /// again.
    pub unsafe fn destroy_handle(&self, h: Handle) -> Result<()> {
        // SAFETY: as the caller promises.
        self.check(unsafe { (self.destroy)(h) }, "cublasDestroy")
    }

    /// `cublasGetVersion` through a handle (`major · 10000 + minor · 100 + patch`).
    ///
    /// # Safety
    /// `h` is a live handle.
    pub unsafe fn handle_version(&self, h: Handle) -> Result<i32> {
        let mut v = 0;
        // SAFETY: a live handle; `v` is written.
        self.check(unsafe { (self.get_version)(h, &mut v) }, "cublasGetVersion")?;
        Ok(v)
    }

    /// `C = alpha·op(A)·op(B) + beta·C`, column-major, `op(A)` `m × k`, `op(B)` `k × n`,
    /// alpha and beta on the host.
    ///
    /// # Safety
    /// `h` is a live handle whose context is current; `a`, `b` and `c` are device pointers to
    /// matrices of the shapes and leading dimensions given, alive until the product has run.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sgemm(
        &self,
        h: Handle,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        beta: f32,
        c: u64,
        ldc: usize,
    ) -> Result<()> {
        let int = |v: usize, what: &str| -> Result<c_int> {
            c_int::try_from(v).map_err(|_| {
                anyhow::anyhow!("cuBLAS SGEMM: {what} = {v} does not fit a 32-bit int")
            })
        };
        let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let s = unsafe {
            (self.sgemm)(
                h,
                op(trans_a),
                op(trans_b),
                int(m, "m")?,
                int(n, "n")?,
                int(k, "k")?,
                &alpha,
                a as usize as *const f32,
                int(lda, "lda")?,
                b as usize as *const f32,
                int(ldb, "ldb")?,
                &beta,
                c as usize as *mut f32,
                int(ldc, "ldc")?,
            )
        };
        self.check(
            s,
            &format!(
                "SGEMM (m {m}, n {n}, k {k}, {}{}, lda {lda}, ldb {ldb}, ldc {ldc})",
                if trans_a { "Aᵀ" } else { "A" },
                if trans_b { "Bᵀ" } else { "B" }
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cublas_lt_is_looked_for_beside_cublas_with_the_same_major() {
        let c = Candidate {
            path: "/usr/local/cuda-13.0/lib64/libcublas.so.13".into(),
            major: Some(13),
            origin: String::new(),
        };
        assert_eq!(
            lt_for(&c),
            Path::new("/usr/local/cuda-13.0/lib64/libcublasLt.so.13")
        );
        let c = Candidate {
            path: "libcublas.so.12".into(),
            major: Some(12),
            origin: String::new(),
        };
        assert_eq!(lt_for(&c), Path::new("libcublasLt.so.12"));
    }
}
