//! Where the numbers are computed. `cpu` holds the CPU kernels (ndarray + rayon, hand-tuned
//! GEMM, aggregation, dropout, losses); `cuda` the CUDA backend.
pub mod cpu;
pub mod cuda;
