//! The CUDA driver path: NVRTC compiles every kernel of `cuda/` (CI finds NVRTC through
//! `GNNPAR_NVRTC_DIR`, the pip wheel `scripts/test.sh` installs), a compile error carries
//! NVRTC's log, the probe reports a missing driver without panicking, and — where a GPU exists
//! — a real device uploads, launches, multiplies and downloads. Cases that cannot run here say
//! `SKIPPED` through `gnnpar::util::skip`.

use gnnpar::backend::cuda::libs::{CudaVersion, SystemEnv};
use gnnpar::backend::cuda::nvrtc::{Nvrtc, PtxCache, Target};
use gnnpar::util::skip::{skipped, SkipKind};
use std::path::Path;
use std::time::Instant;

/// A kernel of this test's own, so that the compile test means something even with an empty
/// `cuda/`; it includes a header given by name, as the backend's kernels do.
const OWN_HEADER: (&str, &str) = (
    "driver_test.cuh",
    "#pragma once\nstatic __device__ __forceinline__ float twice(float x) { return 2.0f * x; }\n",
);
const OWN_KERNEL: (&str, &str) = (
    "driver_test.cu",
    r#"#include "driver_test.cuh"
extern "C" __global__ void gnn_test_axpb(float* y, const float* x, float a, unsigned long long n, int b) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = a * twice(x[i]) + (float)b;
}
"#,
);

/// The NVRTC of this environment, or a visible skip. When `GNNPAR_NVRTC_DIR` holds the
/// wheel's `libnvrtc.so.12` (`scripts/test.sh` installs it), not finding it is a failure, not
/// a skip: CI compiles every kernel.
fn nvrtc(test: &str) -> Option<Nvrtc> {
    match Nvrtc::find(&SystemEnv, None) {
        Ok(n) => Some(n),
        Err(m) => {
            if let Some(dir) = std::env::var_os("GNNPAR_NVRTC_DIR") {
                assert!(
                    !Path::new(&dir).join("libnvrtc.so.12").exists(),
                    "GNNPAR_NVRTC_DIR holds libnvrtc.so.12, yet NVRTC was not found: {m}"
                );
            }
            skipped(SkipKind::Gpu, test, &format!("{m}"));
            None
        }
    }
}

/// `(name, text)` of every file in `cuda/`, read now (the directory grows while the backend
/// is written).
fn cuda_dir_sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
    let mut v: Vec<(String, String)> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("cu") | Some("cuh")
                    )
            })
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[test]
fn every_kernel_in_cuda_dir_compiles_for_sm80_and_sm90() {
    let Some(nvrtc) = nvrtc("cuda_driver::every_kernel_in_cuda_dir_compiles_for_sm80_and_sm90")
    else {
        return;
    };
    let mut files = cuda_dir_sources();
    files.push((OWN_HEADER.0.into(), OWN_HEADER.1.into()));
    files.push((OWN_KERNEL.0.into(), OWN_KERNEL.1.into()));
    let sources: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let units = sources.iter().filter(|(n, _)| n.ends_with(".cu")).count();
    for arch in [80, 90] {
        let t = Instant::now();
        let images = nvrtc
            .compile_all(&sources, arch, Target::Ptx, None)
            .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!(
            "{:?}: {units} files for compute_{arch} in {:.2} s",
            nvrtc,
            t.elapsed().as_secs_f64()
        );
        assert_eq!(images.len(), units);
        for img in &images {
            assert_eq!(img.arch, format!("compute_{arch}"));
            let ptx = img.ptx();
            assert!(
                ptx.contains(&format!(".target sm_{arch}")),
                "{}: {}",
                img.file_name,
                &ptx[..ptx.len().min(400)]
            );
            assert!(ptx.contains(".entry"), "{}: no kernel", img.file_name);
        }
        let own = images.iter().find(|i| i.file_name == OWN_KERNEL.0).unwrap();
        assert!(own.ptx().contains(".entry gnn_test_axpb"));
    }
}

#[test]
fn a_compile_error_returns_nvrtcs_log_and_the_file_name() {
    let Some(nvrtc) = nvrtc("cuda_driver::a_compile_error_returns_nvrtcs_log_and_the_file_name")
    else {
        return;
    };
    let broken = "extern \"C\" __global__ void gnn_broken(float* y) {\n    y[0] = 1.0f\n}\n";
    let err = nvrtc
        .compile_ptx("broken_kernel.cu", broken, &[], "sm_90")
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("broken_kernel.cu"), "{msg}");
    assert!(msg.contains("compute_90"), "{msg}");
    // NVRTC's own log: the file, the line, and what is wrong.
    assert!(msg.contains("broken_kernel.cu(3)"), "{msg}");
    assert!(msg.contains("error"), "{msg}");
    assert!(msg.contains("NVRTC_ERROR_COMPILATION"), "{msg}");

    // A missing header is reported the same way.
    let err = nvrtc
        .compile_ptx(
            "needs_header.cu",
            "#include \"absent.cuh\"\n",
            &[OWN_HEADER],
            "sm_80",
        )
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("needs_header.cu") && msg.contains("absent.cuh"),
        "{msg}"
    );
}

#[test]
fn cubins_compile_too_and_the_disk_cache_returns_the_same_images() {
    let Some(nvrtc) =
        nvrtc("cuda_driver::cubins_compile_too_and_the_disk_cache_returns_the_same_images")
    else {
        return;
    };
    let sources = [OWN_HEADER, OWN_KERNEL];
    let cubin = nvrtc
        .compile_all(&sources, 90, Target::Cubin, None)
        .unwrap();
    assert_eq!(cubin.len(), 1);
    assert_eq!(cubin[0].arch, "sm_90");
    assert!(cubin[0].bytes.starts_with(b"\x7fELF"));

    let dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::at(dir.path().join("ptx"));
    let t = Instant::now();
    let first = nvrtc
        .compile_all(&sources, 80, Target::Ptx, Some(&cache))
        .unwrap();
    let compile_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let again = nvrtc
        .compile_all(&sources, 80, Target::Ptx, Some(&cache))
        .unwrap();
    let cached_s = t.elapsed().as_secs_f64();
    eprintln!("one kernel: compiled in {compile_s:.3} s, from the cache in {cached_s:.4} s");
    assert_eq!(first, again);
    assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 1);
    // A changed header is a different entry.
    let changed = [
        (
            OWN_HEADER.0,
            "#pragma once\nstatic __device__ float twice(float x) { return x + x; }\n",
        ),
        OWN_KERNEL,
    ];
    nvrtc
        .compile_all(&changed, 80, Target::Ptx, Some(&cache))
        .unwrap();
    assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 2);
}

/// The environment of this process with the search confined to one directory.
struct OnlyDir(std::path::PathBuf);

impl gnnpar::backend::cuda::libs::SearchEnv for OnlyDir {
    fn var(&self, name: &str) -> Option<String> {
        (name == "GNNPAR_CUDA_LIB_DIR").then(|| self.0.display().to_string())
    }
    fn list(&self, _: &Path) -> Vec<String> {
        Vec::new()
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

#[test]
fn the_wheels_nvrtc_loads_from_an_override_and_a_too_old_driver_refuses_it() {
    let test =
        "cuda_driver::the_wheels_nvrtc_loads_from_an_override_and_a_too_old_driver_refuses_it";
    let Some(found) = nvrtc(test) else {
        return;
    };
    let Some(dir) = found.path().parent().filter(|d| !d.as_os_str().is_empty()) else {
        skipped(
            SkipKind::Gpu,
            test,
            "NVRTC was found on the loader path, not in a directory",
        );
        return;
    };
    let env = OnlyDir(dir.to_path_buf());
    let n = Nvrtc::find(&env, None).unwrap();
    assert_eq!(n.path().parent(), Some(dir));
    assert_eq!(n.version(), found.version());
    // Same major as the driver: accepted (a newer minor compiles to CUBINs).
    let same = CudaVersion {
        major: n.version().major,
        minor: 0,
    };
    assert!(Nvrtc::find(&env, Some(same)).is_ok());
    assert_eq!(
        Target::for_driver(n.version(), same),
        if n.version().minor == 0 {
            Target::Ptx
        } else {
            Target::Cubin
        }
    );
    // An older driver: refused, and the message says why and where it looked.
    let old = CudaVersion {
        major: n.version().major - 1,
        minor: 8,
    };
    let msg = Nvrtc::find(&env, Some(old)).unwrap_err().to_string();
    assert!(msg.starts_with("no usable NVRTC ("), "{msg}");
    assert!(
        msg.contains(&format!(
            "NVRTC {} makes code that needs a CUDA {} driver, and this driver is CUDA {old}",
            n.version(),
            n.version().major
        )),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("$GNNPAR_CUDA_LIB_DIR = {}", dir.display())),
        "{msg}"
    );
}

#[test]
fn the_probe_without_a_driver_names_libcuda_and_does_not_panic() {
    use gnnpar::backend::cuda::probe::{probe, Unavailable};
    match probe() {
        Ok(info) => eprintln!("GPU here: {info}"),
        Err(u) => {
            let msg = u.to_string();
            eprintln!("{msg}");
            assert!(msg.starts_with("--device cuda: "), "{msg}");
            assert!(!msg.contains('\n'));
            if matches!(u, Unavailable::NoDriver { .. }) {
                assert_eq!(
                    msg,
                    "--device cuda: no CUDA driver: libcuda.so.1 not found on the loader path \
                     (is this a GPU node? nvidia-smi)"
                );
            }
        }
    }
}

#[test]
fn on_a_gpu_upload_launch_sgemm_and_download_agree_with_the_cpu() {
    use gnnpar::backend::cuda::driver::DriverGpu;
    use gnnpar::backend::cuda::gpu::{Device, Gpu, KernelArg, Launch, Sgemm};
    use gnnpar::backend::cuda::probe::probe;
    let test = "cuda_driver::on_a_gpu_upload_launch_sgemm_and_download_agree_with_the_cpu";
    let info = match probe() {
        Ok(info) => info,
        Err(u) => {
            skipped(SkipKind::Gpu, test, &u.to_string());
            return;
        }
    };
    eprintln!("{info}");
    // Every kernel of cuda/ must load on this GPU, with this test's own.
    let mut files = cuda_dir_sources();
    files.push((OWN_HEADER.0.into(), OWN_HEADER.1.into()));
    files.push((OWN_KERNEL.0.into(), OWN_KERNEL.1.into()));
    let sources: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let gpu = DriverGpu::new(0, &sources).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("{}", gpu.describe());
    let dev = Device::new(std::sync::Arc::new(gpu));

    // A kernel: y = 3·(2x) + 1 over more items than one grid-stride pass, plus odd sizes.
    for n in [1usize, 1000, 3 << 20] {
        let x: Vec<f32> = (0..n).map(|i| (i % 1013) as f32 * 0.5 - 7.0).collect();
        let xb = dev.upload(&x).unwrap();
        let yb = dev.alloc(n * 4).unwrap();
        dev.gpu
            .launch(
                "gnn_test_axpb",
                Launch::blocks(1024, 256),
                &[
                    KernelArg::Ptr(yb.ptr()),
                    KernelArg::Ptr(xb.ptr()),
                    KernelArg::F32(3.0),
                    KernelArg::U64(n as u64),
                    KernelArg::I32(1),
                ],
            )
            .unwrap();
        let y: Vec<f32> = yb.download().unwrap();
        for i in 0..n {
            assert_eq!(y[i], 3.0 * (2.0 * x[i]) + 1.0, "n {n}, item {i}");
        }
    }

    // Uploads bigger than a staging buffer, many small ones in a row, copy and zero.
    let big: Vec<u32> = (0..(5 << 20) as u32)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    let bb = dev.upload(&big).unwrap();
    let small: Vec<_> = (0..2000u32)
        .map(|i| dev.upload(&[i, i + 1, i + 2]).unwrap())
        .collect();
    let copy = dev.alloc(big.len() * 4).unwrap();
    dev.gpu.copy(copy.ptr(), bb.ptr(), big.len() * 4).unwrap();
    assert_eq!(copy.download::<u32>().unwrap(), big);
    for (i, s) in small.iter().enumerate() {
        let i = i as u32;
        assert_eq!(s.download::<u32>().unwrap(), vec![i, i + 1, i + 2]);
    }
    let z = dev.alloc_zeroed(4096).unwrap();
    assert!(z.download::<u32>().unwrap().iter().all(|&v| v == 0));

    // SGEMM, column-major with transposes, against a CPU product in f64.
    let (m, n, k) = (67usize, 45usize, 129usize);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7) % 23) as f32 / 23.0 - 0.5)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 19) as f32 / 19.0 - 0.5)
        .collect();
    let c0: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        // op(A) is m × k: stored k × m (column-major, lda = k) when transposed.
        let lda = if ta { k } else { m };
        let ldb = if tb { n } else { k };
        let at = |i: usize, p: usize| if ta { a[i * k + p] } else { a[p * m + i] };
        let bt = |p: usize, j: usize| if tb { b[p * n + j] } else { b[j * k + p] };
        let (ab, bbuf, cb) = (
            dev.upload(&a).unwrap(),
            dev.upload(&b).unwrap(),
            dev.upload(&c0).unwrap(),
        );
        dev.gpu
            .sgemm(&Sgemm {
                trans_a: ta,
                trans_b: tb,
                m,
                n,
                k,
                alpha: 0.75,
                a: ab.ptr(),
                lda,
                b: bbuf.ptr(),
                ldb,
                beta: 0.5,
                c: cb.ptr(),
                ldc: m,
            })
            .unwrap();
        let c: Vec<f32> = cb.download().unwrap();
        for j in 0..n {
            for i in 0..m {
                let want: f64 = (0..k)
                    .map(|p| at(i, p) as f64 * bt(p, j) as f64)
                    .sum::<f64>()
                    * 0.75
                    + 0.5 * c0[j * m + i] as f64;
                let got = c[j * m + i] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()) * k as f64,
                    "({ta}, {tb}) C[{i}, {j}] = {got}, want {want}"
                );
            }
        }
    }
    dev.gpu.synchronize().unwrap();

    // An unknown kernel is an error naming it, not a crash.
    let err = dev
        .gpu
        .launch("gnn_no_such_kernel", Launch::blocks(1, 32), &[])
        .unwrap_err();
    assert!(err.to_string().contains("gnn_no_such_kernel"), "{err}");
}

#[test]
fn cublas_loads_with_its_lt_or_is_reported_missing_with_every_place_looked() {
    use gnnpar::backend::cuda::cublas::Cublas;
    match Cublas::find(&SystemEnv, None) {
        Ok(b) => {
            eprintln!("{b:?}, cuBLASLt {:?}", b.lt_path());
            assert!(b.version().major >= 11, "{b:?}");
            if b.path().parent().is_some_and(|d| !d.as_os_str().is_empty()) {
                let lt = b
                    .lt_path()
                    .expect("cuBLASLt loaded from the same directory");
                assert_eq!(lt.parent(), b.path().parent());
            }
            // Status strings name the status.
            assert!(b.status(7).starts_with("CUBLAS_STATUS_INVALID_VALUE (7)"));
        }
        Err(m) => {
            let msg = m.to_string();
            assert!(
                msg.starts_with("cuBLAS not found (looked in ")
                    || msg.starts_with("no usable cuBLAS ("),
                "{msg}"
            );
            assert!(msg.contains("/usr/local/cuda/lib64"), "{msg}");
            assert!(msg.contains("libcublas.so.13, libcublas.so.12"), "{msg}");
        }
    }
}
