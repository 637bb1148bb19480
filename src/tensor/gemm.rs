//! Matrix products on `f32`, parallel over row blocks of the output.
//!
//! `ndarray`'s `general_mat_mul` (matrixmultiply underneath) runs on one thread. Here the
//! output is cut into blocks of rows (or of columns when it has few rows), and each block is one
//! `general_mat_mul` call on a rayon worker. Block boundaries depend only on the shape, so the
//! result is bitwise the same for any number of threads. Transposed operands are passed as
//! transposed views (`a.t()`): matrixmultiply packs arbitrary strides, so no copy is made.

use ndarray::linalg::general_mat_mul;
use ndarray::parallel::prelude::*;
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};

/// Below this many multiply-adds a product runs on the calling thread.
const SERIAL_FLOPS: usize = 1 << 20;
/// Multiply-adds per parallel task.
const FLOPS_PER_TASK: usize = 1 << 24;
/// Fewest output rows (or columns) per task: every task packs its own copy of the other
/// operand, so thin blocks would spend more time packing than multiplying.
const MIN_BLOCK: usize = 256;
/// Fewest reduction steps per task when the inner dimension is split.
const MIN_INNER_BLOCK: usize = 1024;
/// Most tasks per product (more only adds packing work).
const MAX_TASKS: usize = 16;
/// Block sizes are multiples of this, matching matrixmultiply's micro-kernel tiles.
const TILE: usize = 16;

/// Size of the blocks that split a dimension of length `len` for a product of `flops`
/// multiply-adds, or `None` when it should not be split. A function of the shape only.
fn block_size(len: usize, flops: usize, min_block: usize) -> Option<usize> {
    if len < 2 * min_block {
        return None;
    }
    let tasks = flops.div_ceil(FLOPS_PER_TASK).clamp(2, MAX_TASKS);
    Some(len.div_ceil(tasks).max(min_block).next_multiple_of(TILE))
}

/// `c = alpha · a · b + beta · c`, where `a` is `m×k`, `b` is `k×n` and `c` is `m×n`.
///
/// Any operand may be a transposed or strided view.
///
/// # Panics
/// If the shapes do not agree (a caller bug, not an input error).
pub fn gemm_into(
    alpha: f32,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    beta: f32,
    mut c: ArrayViewMut2<f32>,
) {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert_eq!(k, k2, "gemm: inner dimensions differ ({m}×{k} · {k2}×{n})");
    assert_eq!(
        c.dim(),
        (m, n),
        "gemm: output shape {:?} != {m}×{n}",
        c.dim()
    );
    let flops = m * n * k;
    if flops <= SERIAL_FLOPS || m * n == 0 {
        general_mat_mul(alpha, &a, &b, beta, &mut c);
        return;
    }
    if let Some(rows) = block_size(m, flops, MIN_BLOCK) {
        c.axis_chunks_iter_mut(Axis(0), rows)
            .into_par_iter()
            .zip(a.axis_chunks_iter(Axis(0), rows).into_par_iter())
            .for_each(|(mut c_blk, a_blk)| general_mat_mul(alpha, &a_blk, &b, beta, &mut c_blk));
    } else if let Some(cols) = block_size(n, flops, MIN_BLOCK) {
        c.axis_chunks_iter_mut(Axis(1), cols)
            .into_par_iter()
            .zip(b.axis_chunks_iter(Axis(1), cols).into_par_iter())
            .for_each(|(mut c_blk, b_blk)| general_mat_mul(alpha, &a, &b_blk, beta, &mut c_blk));
    } else if let Some(inner) = block_size(k, flops, MIN_INNER_BLOCK) {
        // A small output with a long reduction (a weight gradient `xᵀ·dy` over many rows):
        // partial products over fixed blocks of the inner dimension, added in block order.
        let partials: Vec<Array2<f32>> = a
            .axis_chunks_iter(Axis(1), inner)
            .into_par_iter()
            .zip(b.axis_chunks_iter(Axis(0), inner).into_par_iter())
            .map(|(a_blk, b_blk)| {
                let mut p = Array2::zeros((m, n));
                general_mat_mul(1.0, &a_blk, &b_blk, 0.0, &mut p);
                p
            })
            .collect();
        let mut sum = partials[0].clone();
        for p in &partials[1..] {
            sum += p;
        }
        c.zip_mut_with(&sum, |ci, &si| *ci = alpha * si + beta * *ci);
    } else {
        general_mat_mul(alpha, &a, &b, beta, &mut c);
    }
}

/// `a · b`.
pub fn matmul(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    let mut c = Array2::zeros((a.nrows(), b.ncols()));
    gemm_into(1.0, a, b, 0.0, c.view_mut());
    c
}

/// `aᵀ · b` (e.g. a weight gradient `xᵀ·dy`).
pub fn matmul_tn(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    matmul(a.t(), b)
}

/// `a · bᵀ` (e.g. an input gradient `dy·Wᵀ`).
pub fn matmul_nt(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    matmul(a, b.t())
}

/// `c += aᵀ · b`: accumulate a weight gradient in place.
pub fn add_matmul_tn(a: ArrayView2<f32>, b: ArrayView2<f32>, c: ArrayViewMut2<f32>) {
    gemm_into(1.0, a.t(), b, 1.0, c);
}

/// `c += a · bᵀ` on the first `a.nrows()` rows of `c`.
pub fn add_matmul_nt_rows(a: ArrayView2<f32>, b: ArrayView2<f32>, mut c: ArrayViewMut2<f32>) {
    let m = a.nrows();
    gemm_into(1.0, a, b.t(), 1.0, c.slice_mut(s![..m, ..]));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    fn pseudo(m: usize, n: usize, salt: u64) -> Array2<f32> {
        Array2::from_shape_fn((m, n), |(i, j)| {
            let h = crate::tensor::dropout::mix64(salt ^ ((i as u64) << 32) ^ j as u64);
            (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
    }

    fn naive(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
        let mut c = Array2::zeros((a.nrows(), b.ncols()));
        for i in 0..a.nrows() {
            for j in 0..b.ncols() {
                let mut s = 0f64;
                for k in 0..a.ncols() {
                    s += a[[i, k]] as f64 * b[[k, j]] as f64;
                }
                c[[i, j]] = s as f32;
            }
        }
        c
    }

    fn assert_close(x: &Array2<f32>, y: &Array2<f32>) {
        assert_eq!(x.dim(), y.dim());
        for (a, b) in x.iter().zip(y.iter()) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    #[test]
    fn products_match_naive_on_parallel_shapes() {
        // Shapes large enough to be split into row blocks, and a wide one split by columns.
        for &(m, k, n) in &[
            (600, 70, 90),
            (33, 200, 700),
            (20, 3000, 30),
            (5, 3, 4),
            (0, 4, 3),
        ] {
            let a = pseudo(m, k, 1);
            let b = pseudo(k, n, 2);
            assert_close(&matmul(a.view(), b.view()), &naive(a.view(), b.view()));
            let at = a.t().to_owned();
            assert_close(&matmul_tn(at.view(), b.view()), &naive(a.view(), b.view()));
            let bt = b.t().to_owned();
            assert_close(&matmul_nt(a.view(), bt.view()), &naive(a.view(), b.view()));
        }
    }

    #[test]
    fn accumulating_forms_add_to_the_output() {
        let a = pseudo(200, 50, 3);
        let b = pseudo(200, 40, 4);
        let mut c = Array2::from_elem((50, 40), 1.0f32);
        add_matmul_tn(a.view(), b.view(), c.view_mut());
        let expect = naive(a.t(), b.view()) + 1.0;
        assert_close(&c, &expect);
        let w = pseudo(60, 40, 5);
        let mut d = Array2::from_elem((250, 60), 2.0f32);
        add_matmul_nt_rows(b.view(), w.view(), d.view_mut());
        let prod = naive(b.view(), w.t());
        for i in 0..250 {
            for j in 0..60 {
                let e = if i < 200 { prod[[i, j]] + 2.0 } else { 2.0 };
                assert!((d[[i, j]] - e).abs() <= 1e-4 * (1.0 + e.abs()));
            }
        }
    }
}
