//! Is the MPI library CUDA-aware, i.e. may its collectives be handed device pointers? And
//! what `--cuda-aware-mpi on|off|auto` makes of the answer.
//!
//! The libraries answer at run time through an extension function, looked up by name in the
//! process (`dlsym`), so that gnnpar links against any MPI, whether it has the function or not:
//! * Open MPI (and MVAPICH2): `int MPIX_Query_cuda_support(void)` — 1 when the library was
//!   built with CUDA and its CUDA support is enabled at run time;
//! * MPICH ≥ 4: `int MPIX_GPU_query_support(int gpu_type, int *is_supported)` with
//!   `MPIX_GPU_SUPPORT_CUDA` (0).
//!
//! A library with neither cannot tell, and is taken as not CUDA-aware (handing it a device
//! pointer would crash it). Both must be asked after `MPI_Init`.
//!
//! `GNNPAR_ASSUME_CUDA_AWARE_MPI=1` is a test hook: it claims CUDA-awareness without asking.
//! Under the CUDA emulator (`GNNPAR_CUDA_EMULATOR`) "device" memory is host memory, which any
//! MPI reads, so the device-pointer path then runs for real in CI; on a real GPU with an MPI
//! that is not CUDA-aware it would crash, which is why it is not a user option.

use crate::kinds::CudaAwareMpi;
use anyhow::{bail, Result};
use std::ffi::{c_int, CStr};

/// The test hook that claims a CUDA-aware MPI (see the module doc).
pub const ASSUME_ENV: &str = "GNNPAR_ASSUME_CUDA_AWARE_MPI";

/// What the MPI library says: CUDA-aware or not, and how that was found out (for the log and
/// errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    pub cuda_aware: bool,
    pub how: String,
}

/// A C function of the running process by name, or null.
fn symbol(name: &CStr) -> *mut libc::c_void {
    // SAFETY: `name` is NUL-terminated; RTLD_DEFAULT searches the process's global scope,
    // where the MPI library the binary links against lives.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Ask the MPI library (after `MPI_Init`), or honour the test hook.
pub fn detect() -> Detection {
    if std::env::var_os(ASSUME_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return Detection {
            cuda_aware: true,
            how: format!("{ASSUME_ENV} is set (a test hook: the MPI library was not asked)"),
        };
    }
    let open_mpi = symbol(c"MPIX_Query_cuda_support");
    if !open_mpi.is_null() {
        // SAFETY: Open MPI's (and MVAPICH2's) `int MPIX_Query_cuda_support(void)`, which may be
        // called at any time after MPI_Init.
        let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(open_mpi) };
        let v = f();
        return Detection {
            cuda_aware: v == 1,
            how: format!("MPIX_Query_cuda_support() = {v}"),
        };
    }
    let mpich = symbol(c"MPIX_GPU_query_support");
    if !mpich.is_null() {
        // SAFETY: MPICH's `int MPIX_GPU_query_support(int gpu_type, int *is_supported)`;
        // MPIX_GPU_SUPPORT_CUDA is 0 in its mpi.h.
        let f: extern "C" fn(c_int, *mut c_int) -> c_int = unsafe { std::mem::transmute(mpich) };
        let mut supported: c_int = 0;
        let rc = f(0, &mut supported);
        return Detection {
            cuda_aware: rc == 0 && supported != 0,
            how: format!("MPIX_GPU_query_support(CUDA) = {supported} (return code {rc})"),
        };
    }
    Detection {
        cuda_aware: false,
        how: "the MPI library has neither MPIX_Query_cuda_support (Open MPI) nor \
              MPIX_GPU_query_support (MPICH), so it cannot say; taken as not CUDA-aware"
            .into(),
    }
}

/// Whether collectives take device pointers, and why (one line for the log), from the setting,
/// whether the backend's memory is the host's, the number of ranks, and `detected` (called only
/// when it matters). `on` without a CUDA-aware MPI is an error saying what was found.
pub fn decide(
    setting: CudaAwareMpi,
    host_backend: bool,
    ranks: usize,
    detected: impl FnOnce() -> Detection,
) -> Result<(bool, String)> {
    if host_backend {
        let note = if setting == CudaAwareMpi::On {
            " (--cuda-aware-mpi on has nothing to do)"
        } else {
            ""
        };
        return Ok((
            false,
            format!("host memory: the CPU backend hands MPI its own rows{note}"),
        ));
    }
    if ranks == 1 {
        return Ok((false, "one rank: nothing is exchanged".into()));
    }
    if setting == CudaAwareMpi::Off {
        return Ok((
            false,
            "--cuda-aware-mpi off: device rows staged through host memory".into(),
        ));
    }
    let d = detected();
    match (setting, d.cuda_aware) {
        (_, true) => Ok((
            true,
            format!(
                "CUDA-aware ({}): gradients and row exchanges hand MPI device pointers",
                d.how
            ),
        )),
        (CudaAwareMpi::On, false) => bail!(
            "--cuda-aware-mpi on (config `cuda_aware_mpi`): the MPI library is not CUDA-aware \
             ({}); use --cuda-aware-mpi auto or off to stage device rows through host memory",
            d.how
        ),
        _ => Ok((
            false,
            format!(
                "not CUDA-aware ({}): device rows staged through host memory",
                d.how
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(cuda_aware: bool) -> impl FnOnce() -> Detection {
        move || Detection {
            cuda_aware,
            how: "asked".into(),
        }
    }

    #[test]
    fn on_needs_a_cuda_aware_mpi_and_auto_follows_it() {
        let (on, why) = decide(CudaAwareMpi::Auto, false, 2, found(true)).unwrap();
        assert!(on && why.contains("CUDA-aware (asked)"), "{why}");
        let (on, why) = decide(CudaAwareMpi::Auto, false, 2, found(false)).unwrap();
        assert!(!on && why.contains("not CUDA-aware"), "{why}");
        assert!(decide(CudaAwareMpi::On, false, 2, found(true)).unwrap().0);
        let err = decide(CudaAwareMpi::On, false, 2, found(false)).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("--cuda-aware-mpi on") && msg.contains("asked") && !msg.contains('\n'),
            "{msg}"
        );
        // Off, the host backend and one rank never ask.
        let never = || -> Detection { panic!("asked") };
        assert!(!decide(CudaAwareMpi::Off, false, 2, never).unwrap().0);
        assert!(!decide(CudaAwareMpi::On, true, 2, never).unwrap().0);
        assert!(!decide(CudaAwareMpi::On, false, 1, never).unwrap().0);
    }
}
