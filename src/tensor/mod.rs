//! Dense CPU kernels on row-major `ndarray` matrices, parallel over rows with rayon.
//!
//! Every kernel here is deterministic and independent of the number of rayon threads: work is
//! split into chunks whose boundaries depend only on the problem shape, and every reduction
//! combines its partial results in a fixed order.
//!
//! * [`gemm`]: matrix products (`A·B`, `Aᵀ·B`, `A·Bᵀ`) split over tiles of the output;
//! * [`sgemm`]: the packed AVX-512 kernel those tiles run;
//! * [`simd`]: runs element-wise loops compiled for AVX2 / AVX-512 when the CPU has them;
//! * [`gather`]: gather rows, scatter-add rows, column sums;
//! * [`aggregate`]: CSR aggregation over a [`crate::sample::Block`] (sum, mean, per-edge
//!   weights such as GCN's symmetric normalisation) and its transpose;
//! * [`sparse`]: CSR rows for mostly-zero input features, with the first layer's products;
//! * [`softmax`]: segment softmax per destination (GAT), row log-softmax;
//! * [`attention`]: GAT edge scores and weighted multi-head aggregation, with backward;
//! * [`activation`]: ReLU, ELU, LeakyReLU and their backward;
//! * [`dropout`]: inverted dropout with counter-based masks keyed by original vertex ids;
//! * [`memory`]: keep freed memory for reuse across mini-batches (no fresh page faults);
//! * [`loss`]: cross-entropy and binary cross-entropy with logits.

pub mod activation;
pub mod aggregate;
pub mod attention;
pub mod dropout;
pub mod gather;
pub mod gemm;
pub mod loss;
pub mod memory;
pub mod sgemm;
pub mod simd;
pub mod softmax;
pub mod sparse;

use ndarray::{ArrayView2, CowArray, Ix2};

/// A row-major (standard layout) view of `a`, copying only when `a` is not already one.
///
/// Kernels work on plain slices, so they need contiguous rows.
pub fn standard<'a>(a: ArrayView2<'a, f32>) -> CowArray<'a, f32, Ix2> {
    if a.is_standard_layout() {
        CowArray::from(a)
    } else {
        CowArray::from(a.as_standard_layout().into_owned())
    }
}

/// Rows per parallel task for a row-wise kernel whose rows cost about `row_cost` operations:
/// large enough that rayon's task overhead stays negligible, and a function of the shape only
/// (never of the thread count) so that results do not depend on it.
pub(crate) fn rows_per_task(row_cost: usize) -> usize {
    const TARGET_OPS_PER_TASK: usize = 1 << 15;
    (TARGET_OPS_PER_TASK / row_cost.max(1)).clamp(1, 4096)
}
