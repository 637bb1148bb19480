//! Which backend a rank trains on (`--device cpu|cuda|auto`), and why, for the log.
//!
//! A rank takes the GPU of its node-local rank modulo the GPUs it sees (after
//! `CUDA_VISIBLE_DEVICES`), so several ranks of a node spread over its GPUs, and more ranks
//! than GPUs share them. `auto` takes CUDA when a driver and a GPU are present and falls back
//! to the CPU otherwise, saying why; `cuda` without a usable GPU is a one-line error naming
//! what is missing and where it was looked for. A GPU that is present but fails to start is an
//! error under `auto` too: a broken GPU node should not train quietly on its CPU.
//!
//! `GNNPAR_CUDA_EMULATOR=N` makes `--device cuda` (and `auto`) use the CPU emulator of the
//! CUDA device instead (the `cuda/*.cu` kernels compiled for the CPU by the system's C++
//! compiler): a test device, slow, that runs the whole CUDA backend — uploads, kernels, the
//! exchanges around the device — where there is no GPU (CI). It stands for `N` GPUs per host
//! (`1` and any other non-numeric value: one), picked by node-local rank as real GPUs are, so
//! tests see ranks share a device; every rank still runs its own emulator (a process cannot
//! share another's memory), and the log says so on every rank.

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
    if let Some(gpus) = emulated_gpus() {
        let backend = Cuda::emulated()
            .with_context(|| {
                format!("{EMULATOR} is set: cannot build the CPU emulator of the CUDA kernels")
            })?
            .shared_by(sharing(world, gpus));
        return Ok(Chosen::Cuda {
            backend,
            why: format!(
                "{EMULATOR} is set: the CPU emulator of the CUDA device, for tests (slow); {}",
                placement(world, gpus)
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
    let ordinal = world.host_rank() % gpus;
    let gpu = &info.devices[ordinal];
    let backend = Cuda::on_gpu(ordinal, precision == Precision::Tf32)
        .with_context(|| {
            format!(
                "--device {device}: cannot start GPU {ordinal} ({})",
                gpu.name
            )
        })?
        .shared_by(sharing(world, gpus));
    Ok(Chosen::Cuda {
        why: format!("--device {device}: {}", placement(world, gpus)),
        backend,
    })
}

/// The number of GPUs the emulator stands for, when `GNNPAR_CUDA_EMULATOR` is set (not empty,
/// not `0`).
fn emulated_gpus() -> Option<usize> {
    let v = std::env::var(EMULATOR).ok()?;
    if v.is_empty() || v == "0" {
        return None;
    }
    Some(v.parse::<usize>().map_or(1, |n| n.max(1)))
}

/// The most ranks of this host that share one of its `gpus` GPUs.
fn sharing(world: &World, gpus: usize) -> usize {
    world.ranks_on_host().div_ceil(gpus.max(1))
}

/// Which of `gpus` GPUs this rank takes (its node-local rank modulo the count), for the log:
/// "GPU i of the n this rank sees (node-local rank r of k; up to m ranks share a GPU)".
fn placement(world: &World, gpus: usize) -> String {
    let local = world.host_rank();
    let sharing = sharing(world, gpus);
    format!(
        "GPU {} of the {gpus} this rank sees (node-local rank {local} of {}{})",
        local % gpus,
        world.ranks_on_host(),
        if sharing > 1 {
            format!("; up to {sharing} ranks share a GPU")
        } else {
            String::new()
        }
    )
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
