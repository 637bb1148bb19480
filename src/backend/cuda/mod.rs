//! The CUDA backend: parameters, optimizer state and every layer's work on an NVIDIA GPU, with
//! GEMMs by cuBLAS and the other kernels in `cuda/*.cu`, compiled at start by NVRTC.
//!
//! Modules (one concern each):
//! * [`backend`]: [`Cuda`], the [`crate::backend::Backend`] on a device, over [`ops`];
//! * [`calls`]: every call into the device counted by kind (launches, copies, waits), per step;
//! * [`gpu`]: the device seam — memory, copies, launches by name, SGEMM — and owned buffers;
//! * [`mat`]: typed device arrays — row-major matrices, their views, typed vectors;
//! * [`kernels`]: the `cuda/*.cu` sources, embedded, and the launch shapes;
//! * [`blas`]: row-major products on the device's column-major SGEMM;
//! * [`emu`]: the device emulated on the CPU — the same kernels compiled by g++, run as fibers —
//!   so that everything above [`gpu::Gpu`] is tested without a GPU;
//! * [`ops`]: every operation the model needs, one module per concern, each with a CPU twin;
//! * [`loss_journal`]: the steps' per-row losses in one device buffer, read a group at a time;
//! * [`libs`]: finding the CUDA libraries where clusters keep them (never panics);
//! * [`nvrtc`]: the run-time compiler, loaded by gnnpar: kernels to PTX or CUBIN, cached on disk;
//! * [`cublas`]: cuBLAS, loaded by gnnpar: a handle on the device's stream, SGEMM;
//! * [`probe`]: is a GPU usable here, and if not, why, in one line;
//! * [`driver`]: [`driver::DriverGpu`], the [`gpu::Gpu`] seam on a real GPU (cudarc's driver API).

pub mod backend;
pub mod blas;
pub mod calls;
pub mod cublas;
pub mod driver;
pub mod emu;
pub mod gpu;
pub mod kernels;
pub mod libs;
pub mod loss_journal;
pub mod mat;
pub mod nvrtc;
pub mod ops;
pub mod probe;

pub use backend::Cuda;
