//! Where the numbers are computed. `cpu` holds the CPU kernels (ndarray + rayon, hand-tuned
//! GEMM, aggregation, dropout, losses).
pub mod cpu;
