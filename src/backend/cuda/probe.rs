//! Is there a usable GPU here? [`probe`] answers without ever panicking: the driver library,
//! `cuInit`, the devices (name, compute capability, memory), NVRTC and cuBLAS. The trainer
//! calls it for `--device cuda` (an [`Unavailable`] is the one-line error) and
//! `--device auto` (it falls back to the CPU and logs why).
//!
//! cudarc loads `libcuda` on its first call and panics when it is absent, so [`driver`]
//! first opens the same file names in the same order with `libloading`
//! ([`libs::driver_candidates`]); only when one loads does cudarc get called (and then inside
//! `catch_unwind`, so a missing symbol in an odd driver is an error too, not an abort).

use super::cublas::Cublas;
use super::libs::{self, CudaVersion, Missing, SystemEnv};
use super::nvrtc::Nvrtc;
use cudarc::driver::{result, sys};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The oldest driver gnnpar uses: its bindings are CUDA 12.0's.
pub const MIN_DRIVER: CudaVersion = CudaVersion {
    major: 12,
    minor: 0,
};

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its ordinal among the devices this process sees (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    pub name: String,
    /// `(major, minor)`: `(9, 0)` for an H100.
    pub compute_capability: (u32, u32),
    /// Bytes of device memory.
    pub total_memory: usize,
}

impl DeviceInfo {
    /// `sm_90`.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU {}: {} ({}, {:.1} GiB)",
            self.ordinal,
            self.name,
            self.arch(),
            self.total_memory as f64 / (1u64 << 30) as f64
        )
    }
}

/// A library found and loaded: its version and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibInfo {
    pub version: String,
    pub path: PathBuf,
}

/// The driver: which library loaded and the CUDA version it supports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// The file name that loaded (cudarc loads the same).
    pub library: String,
    /// `cuDriverGetVersion`: the newest CUDA this driver runs.
    pub version: CudaVersion,
}

/// Everything needed to run on a GPU here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub driver: DriverInfo,
    /// At least one.
    pub devices: Vec<DeviceInfo>,
    pub nvrtc: LibInfo,
    pub cublas: LibInfo,
}

impl fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let devices: Vec<String> = self.devices.iter().map(|d| d.to_string()).collect();
        write!(
            f,
            "{}; driver for CUDA {}; NVRTC {} ({}); cuBLAS {} ({})",
            devices.join(", "),
            self.driver.version,
            self.nvrtc.version,
            self.nvrtc.path.display(),
            self.cublas.version,
            self.cublas.path.display()
        )
    }
}

/// Why no GPU can be used. `Display` is one line naming what is missing and where it was
/// looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// No `libcuda` loads: not a GPU node, or the driver is not installed.
    NoDriver {
        /// The file names tried, in order.
        tried: Vec<String>,
    },
    /// The `libcuda` that loaded is the toolkit's stub (a link-time library).
    StubDriver { library: String },
    /// `cuInit` failed.
    InitFailed { library: String, error: String },
    /// The driver is older than [`MIN_DRIVER`].
    DriverTooOld { version: CudaVersion },
    /// The driver runs but sees no GPU.
    NoDevice { visible_devices: Option<String> },
    /// NVRTC or cuBLAS is missing (or only too new a version was found).
    Library(Missing),
    /// A query failed.
    Query(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("--device cuda: ")?;
        match self {
            Unavailable::NoDriver { .. } => f.write_str(
                "no CUDA driver: libcuda.so.1 not found on the loader path (is this a GPU node? \
                 nvidia-smi)",
            ),
            Unavailable::StubDriver { library } => write!(
                f,
                "no CUDA driver: the {library} that loaded is the CUDA toolkit's stub, not the \
                 driver (remove the toolkit's lib64/stubs from LD_LIBRARY_PATH; is this a GPU \
                 node? nvidia-smi)"
            ),
            Unavailable::InitFailed { library, error } => {
                write!(f, "the CUDA driver ({library}) failed to start: {error}")
            }
            Unavailable::DriverTooOld { version } => write!(
                f,
                "the CUDA driver supports CUDA {version}, and gnnpar needs CUDA {MIN_DRIVER} or \
                 newer (a newer NVIDIA driver)"
            ),
            Unavailable::NoDevice { visible_devices } => match visible_devices {
                Some(v) => write!(f, "no GPU visible (CUDA_VISIBLE_DEVICES={v})"),
                None => f.write_str("the CUDA driver sees no GPU (nvidia-smi)"),
            },
            Unavailable::Library(m) => write!(f, "{m}"),
            Unavailable::Query(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Unavailable {}

/// A driver error as `CUDA_ERROR_NAME: description`.
pub(crate) fn driver_error(e: result::DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as u32));
    match e.error_string() {
        Ok(s) => format!("{name}: {}", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// Run cudarc code, turning a panic (a symbol missing from an odd driver) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("{what}: the CUDA bindings panicked: {msg}"))
    })
}

/// The driver, loaded and initialised (once per process; later calls return the first
/// answer).
pub fn driver() -> Result<DriverInfo, Unavailable> {
    static DRIVER: Mutex<Option<Result<DriverInfo, Unavailable>>> = Mutex::new(None);
    let mut d = DRIVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = d.as_ref() {
        return r.clone();
    }
    let r = load_driver();
    *d = Some(r.clone());
    r
}

fn load_driver() -> Result<DriverInfo, Unavailable> {
    let tried = libs::driver_candidates();
    // SAFETY: loading the driver library runs its initialisers, which have no preconditions.
    let library = tried
        .iter()
        .find(|name| unsafe { libloading::Library::new(name.as_str()) }.is_ok())
        .cloned()
        .ok_or_else(|| Unavailable::NoDriver {
            tried: tried.clone(),
        })?;
    let init = guarded("cuInit", || result::init().map_err(driver_error));
    if let Err(error) = init {
        if error.starts_with("CUDA_ERROR_STUB_LIBRARY") {
            return Err(Unavailable::StubDriver { library });
        }
        if error.starts_with("CUDA_ERROR_NO_DEVICE") {
            return Err(Unavailable::NoDevice {
                visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            });
        }
        return Err(Unavailable::InitFailed { library, error });
    }
    let version = guarded("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: `v` is written.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(driver_error)?;
        Ok(CudaVersion::from_encoded(v))
    })
    .map_err(Unavailable::Query)?;
    if version < MIN_DRIVER {
        return Err(Unavailable::DriverTooOld { version });
    }
    Ok(DriverInfo { library, version })
}

/// The devices the (initialised) driver sees.
pub fn devices() -> Result<Vec<DeviceInfo>, Unavailable> {
    driver()?;
    guarded("listing the GPUs", || {
        let count = result::device::get_count().map_err(driver_error)?;
        (0..count)
            .map(|i| device_info(i as usize).map_err(driver_error))
            .collect()
    })
    .map_err(Unavailable::Query)
}

/// One device's description.
pub(crate) fn device_info(ordinal: usize) -> Result<DeviceInfo, result::DriverError> {
    let dev = result::device::get(ordinal as i32)?;
    let attr = |a| {
        // SAFETY: `dev` came from `device::get`.
        unsafe { result::device::get_attribute(dev, a) }
    };
    use sys::CUdevice_attribute::*;
    Ok(DeviceInfo {
        ordinal,
        name: result::device::get_name(dev)?,
        compute_capability: (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
        ),
        // SAFETY: `dev` came from `device::get`.
        total_memory: unsafe { result::device::total_mem(dev) }?,
    })
}

/// NVRTC for this driver, found once per process.
pub fn nvrtc(driver: CudaVersion) -> Result<Arc<Nvrtc>, Unavailable> {
    Nvrtc::shared(Some(driver)).map_err(Unavailable::Library)
}

/// cuBLAS for this driver, found once per process.
pub fn cublas(driver: CudaVersion) -> Result<Arc<Cublas>, Unavailable> {
    static CUBLAS: Mutex<Option<Result<Arc<Cublas>, Missing>>> = Mutex::new(None);
    let mut c = CUBLAS.lock().unwrap_or_else(|e| e.into_inner());
    if c.is_none() {
        *c = Some(Cublas::find(&SystemEnv, Some(driver.major)).map(Arc::new));
    }
    c.as_ref()
        .expect("set above")
        .clone()
        .map_err(Unavailable::Library)
}

/// Everything needed to train on a GPU here, or why not. Never panics.
pub fn probe() -> Result<GpuInfo, Unavailable> {
    let driver = driver()?;
    let devices = devices()?;
    if devices.is_empty() {
        return Err(Unavailable::NoDevice {
            visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        });
    }
    let nvrtc = nvrtc(driver.version)?;
    let cublas = cublas(driver.version)?;
    Ok(GpuInfo {
        driver,
        devices,
        nvrtc: LibInfo {
            version: nvrtc.version().to_string(),
            path: nvrtc.path().to_path_buf(),
        },
        cublas: LibInfo {
            version: cublas.version().to_string(),
            path: cublas.path().to_path_buf(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::libs::Lib;

    #[test]
    fn every_reason_reads_as_one_line_naming_what_is_missing() {
        let cases = [
            (
                Unavailable::NoDriver {
                    tried: vec!["libcuda.so".into(), "libcuda.so.1".into()],
                },
                "--device cuda: no CUDA driver: libcuda.so.1 not found on the loader path (is \
                 this a GPU node? nvidia-smi)",
            ),
            (
                Unavailable::StubDriver {
                    library: "libcuda.so".into(),
                },
                "the libcuda.so that loaded is the CUDA toolkit's stub",
            ),
            (
                Unavailable::DriverTooOld {
                    version: CudaVersion {
                        major: 11,
                        minor: 4,
                    },
                },
                "supports CUDA 11.4, and gnnpar needs CUDA 12.0 or newer",
            ),
            (
                Unavailable::NoDevice {
                    visible_devices: Some("".into()),
                },
                "no GPU visible (CUDA_VISIBLE_DEVICES=)",
            ),
            (
                Unavailable::Library(Missing {
                    library: Lib::Nvrtc,
                    looked_in: vec![
                        "$CUDA_HOME/lib64 = /apps/cuda/lib64".into(),
                        "/usr/local/cuda/lib64".into(),
                    ],
                    rejected: vec![],
                }),
                "--device cuda: NVRTC not found (looked in $CUDA_HOME/lib64 = \
                 /apps/cuda/lib64, /usr/local/cuda/lib64; module load cuda, or set \
                 GNNPAR_CUDA_LIB_DIR)",
            ),
        ];
        for (u, want) in cases {
            let s = u.to_string();
            assert!(s.starts_with("--device cuda: "), "{s}");
            assert!(s.contains(want), "{s:?} lacks {want:?}");
            assert!(!s.contains('\n'), "{s}");
        }
    }

    #[test]
    fn the_probe_never_panics_and_without_a_driver_names_libcuda() {
        let first = probe();
        assert_eq!(first, probe(), "the probe answers the same twice");
        match first {
            Ok(info) => {
                // A GPU machine: the probe describes it.
                assert!(!info.devices.is_empty());
                eprintln!("probe: {info}");
            }
            Err(u) => {
                let s = u.to_string();
                assert!(s.starts_with("--device cuda: "), "{s}");
                if let Unavailable::NoDriver { tried } = &u {
                    assert!(tried.iter().any(|t| t == "libcuda.so.1"));
                    assert!(s.contains("libcuda.so.1"), "{s}");
                }
            }
        }
    }
}
