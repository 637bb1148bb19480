//! Which backend a rank trains on (`--device cpu|cuda|auto`), and why, for the log.
//!
//! A rank takes the GPU of its node-local rank modulo the GPUs it sees (after
//! `CUDA_VISIBLE_DEVICES`), so several ranks of a node spread over its GPUs, and more ranks
//! than GPUs share them. `auto` takes CUDA when a driver and a GPU are present and falls back
//! to the CPU otherwise, saying why; `cuda` without a usable GPU is a one-line error naming
//! what is missing and where it was looked for. A GPU that is present but fails to start is an
//! error under `auto` too: a broken GPU node should not train quietly on its CPU.
//!
//! `GNNPAR_CUDA_EMULATOR=1` makes `--device cuda` (and `auto`) use the CPU emulator of the
//! CUDA device instead (the `cuda/*.cu` kernels compiled for the CPU by the system's C++
//! compiler): a test device, slow, that runs the whole CUDA backend — uploads, kernels, the
//! exchanges around the device — where there is no GPU (CI). The log says so on every rank.

use crate::backend::cuda::probe;
use crate::backend::Cuda;
use crate::comm::World;
use crate::kinds::{Device, Precision};
use anyhow::{bail, Context, Result};

/// The environment variable that swaps the GPU for the CPU emulator of the CUDA device.
pub const EMULATOR: &str = "GNNPAR_CUDA_EMULATOR";

/// The backend this rank trains on.
pub enum Chosen {
    Cpu {
        /// Why the CPU (for the log).
        why: String,
    },
    Cuda {
        backend: Cuda,
        /// Which GPU and why (for the log).
        why: String,
    },
}

/// Resolve `device` for this rank.
pub fn choose(device: Device, precision: Precision, world: &World) -> Result<Chosen> {
    if device == Device::Cpu {
        return Ok(Chosen::Cpu {
            why: "--device cpu".into(),
        });
    }
    if std::env::var_os(EMULATOR).is_some_and(|v| !v.is_empty() && v != "0") {
        let backend = Cuda::emulated().with_context(|| {
            format!("{EMULATOR} is set: cannot build the CPU emulator of the CUDA kernels")
        })?;
        return Ok(Chosen::Cuda {
            backend,
            why: format!(
                "{EMULATOR} is set: the CPU emulator of the CUDA device, for tests (slow)"
            ),
        });
    }
    let info = match probe::probe() {
        Ok(info) => info,
        Err(missing) if device == Device::Auto => {
            return Ok(Chosen::Cpu {
                why: format!("--device auto found no usable GPU: {missing}"),
            })
        }
        Err(missing) => bail!("{missing}"),
    };
    let gpus = info.devices.len();
    let local = world.host_rank();
    let ordinal = local % gpus;
    let gpu = &info.devices[ordinal];
    let backend = Cuda::on_gpu(ordinal, precision == Precision::Tf32).with_context(|| {
        format!(
            "--device {device}: cannot start GPU {ordinal} ({})",
            gpu.name
        )
    })?;
    let sharing = world.ranks_on_host().div_ceil(gpus);
    Ok(Chosen::Cuda {
        why: format!(
            "--device {device}: GPU {ordinal} of the {gpus} this rank sees (node-local rank \
             {local} of {}{})",
            world.ranks_on_host(),
            if sharing > 1 {
                format!("; up to {sharing} ranks share a GPU")
            } else {
                String::new()
            }
        ),
        backend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a CUDA driver (CI, this one), `auto` falls back to the CPU saying
    /// why and `cuda` is a one-line error naming the driver library; on a GPU machine both
    /// pick a GPU.
    #[test]
    fn auto_falls_back_and_cuda_says_what_is_missing() {
        let world = World::solo();
        let gpu_here = probe::probe().is_ok();
        match choose(Device::Auto, Precision::Fp32, &world).unwrap() {
            Chosen::Cpu { why } => {
                assert!(!gpu_here);
                assert!(
                    why.contains("no usable GPU") && why.contains("--device cuda"),
                    "{why}"
                );
            }
            Chosen::Cuda { why, .. } => assert!(gpu_here && why.contains("GPU 0"), "{why}"),
        }
        match choose(Device::Cuda, Precision::Fp32, &world) {
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(!gpu_here);
                assert!(
                    !msg.contains('\n') && msg.contains("--device cuda"),
                    "{msg}"
                );
            }
            Ok(chosen) => assert!(gpu_here && matches!(chosen, Chosen::Cuda { .. })),
        }
        assert!(matches!(
            choose(Device::Cpu, Precision::Tf32, &world).unwrap(),
            Chosen::Cpu { .. }
        ));
    }
}
