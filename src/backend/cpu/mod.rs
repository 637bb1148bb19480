//! Dense CPU kernels on row-major `ndarray` matrices, parallel over rows with rayon.
//!
//! Every kernel here is deterministic and independent of the number of rayon threads: work is
//! split into chunks whose boundaries depend only on the problem shape, and every reduction
//! combines its partial results in a fixed order.
//!
//! * [`gemm`]: matrix products (`A·B`, `Aᵀ·B`, `A·Bᵀ`) by the `gemm` crate on blocks of the
//!   output fixed by the shape, with a bias / ReLU / dropout epilogue per block;
//! * [`simd`]: runs element-wise loops compiled for AVX2 / AVX-512 when the CPU has them;
//! * [`gather`]: gather rows, scatter-add rows, column sums;
//! * [`aggregate`]: CSR aggregation over a [`crate::sample::Block`] (sum, mean, per-edge
//!   weights such as GCN's symmetric normalisation) and its transpose;
//! * [`sparse`]: CSR rows for mostly-zero input features, with the first layer's products;
//! * [`sparse_rows`]: products whose left operand is mostly zeros (after a ReLU and a
//!   dropout), skipping them;
//! * [`softmax`]: segment softmax per destination (GAT), row log-softmax;
//! * [`attention`]: GAT edge scores and weighted multi-head aggregation, with backward;
//! * [`activation`]: ReLU, ELU, LeakyReLU and their backward;
//! * [`bitmask`]: AVX-512 forms of the kernels that apply or record one bit per element;
//! * [`dropout`]: inverted dropout with counter-based masks keyed by original vertex ids;
//! * [`memory`]: keep freed memory for reuse across mini-batches (no fresh page faults);
//! * [`loss`]: cross-entropy and binary cross-entropy with logits.

pub mod activation;
pub mod adam;
pub mod aggregate;
pub mod attention;
mod backend;
pub mod bitmask;
pub mod dropout;
pub mod gather;
pub mod gemm;
pub mod loss;
pub mod memory;
pub mod norm;
pub mod simd;
pub mod softmax;
pub mod sparse;
pub mod sparse_rows;

pub use backend::Cpu;

use std::mem::MaybeUninit;

use ndarray::{Array2, ArrayView2, CowArray, Ix2};
use rayon::prelude::*;

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

/// A `rows × cols` matrix built in parallel, row by row: each row is zeroed inside its task
/// (while it is in cache, instead of a serial `calloc` memset over the whole matrix before)
/// and then passed to `fill(i, row)`. Tasks take at least `min_rows` rows.
pub(crate) fn par_rows_from_zero(
    rows: usize,
    cols: usize,
    min_rows: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Array2<f32> {
    par_rows_uninit(rows, cols, min_rows, |i, row| fill(i, zeroed(row)))
}

/// Zero `row` and return it initialised.
pub(crate) fn zeroed(row: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    for v in row.iter_mut() {
        v.write(0.0);
    }
    // SAFETY: every element was just initialised.
    unsafe { &mut *(row as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// A `rows × cols` matrix built in parallel, row by row, by `fill(i, row)`, which must write
/// every element of its row. Tasks take at least `min_rows` rows.
pub(crate) fn par_rows_uninit(
    rows: usize,
    cols: usize,
    min_rows: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Array2<f32> {
    if cols == 0 || rows == 0 {
        return Array2::zeros((rows, cols));
    }
    let mut out = Array2::<f32>::uninit((rows, cols));
    out.as_slice_mut()
        .expect("fresh array")
        .par_chunks_mut(cols)
        .enumerate()
        .with_min_len(min_rows)
        .for_each(|(i, row)| fill(i, row));
    // SAFETY: `fill` initialised every row (its contract).
    unsafe { out.assume_init() }
}

/// A reproducible `m × n` test matrix with entries in `[-0.5, 0.5)`, one per `salt` (unit
/// tests of the products).
#[cfg(test)]
pub(crate) fn pseudo_matrix(m: usize, n: usize, salt: u64) -> Array2<f32> {
    Array2::from_shape_fn((m, n), |(i, j)| {
        let h = dropout::mix64(salt ^ ((i as u64) << 32) ^ j as u64);
        (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    })
}

/// The largest absolute element-wise difference of two equally shaped matrices (unit tests).
#[cfg(test)]
pub(crate) fn max_abs_diff(a: ndarray::ArrayView2<f32>, b: ndarray::ArrayView2<f32>) -> f32 {
    assert_eq!(a.dim(), b.dim());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
