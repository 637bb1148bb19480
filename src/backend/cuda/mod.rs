//! The CUDA backend: parameters, optimizer state and every layer's work on an NVIDIA GPU, with
//! GEMMs by cuBLAS and the other kernels in `cuda/*.cu`, compiled at start by NVRTC.
//!
//! Modules (one concern each):
//! * [`gpu`]: the device seam — memory, copies, launches by name, SGEMM — and owned buffers;
//! * [`mat`]: typed device arrays — row-major matrices, their views, typed vectors.

pub mod gpu;
pub mod mat;
