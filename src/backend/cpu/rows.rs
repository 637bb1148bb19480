//! Input rows that are dense or sparse, with the three products a layer needs of them: a
//! strategy that runs a layer's pieces itself (SNP) keeps bag-of-words features sparse, as
//! [`crate::nn::Model::forward`] does, and multiplies only their non-zeros.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use super::dropout::DropoutMask;
use super::gemm::{add_matmul_tn, gemm_into, matmul};
use super::sparse::{add_spmm_tn, prefers_sparse, spmm, spmm_into, CsrMatrix, CsrTranspose};

/// Rows of a layer's input.
#[derive(Clone, Debug)]
pub enum InputRows {
    Dense(Array2<f32>),
    Sparse(CsrMatrix),
}

impl InputRows {
    /// `x`, as CSR when it is mostly zeros ([`prefers_sparse`]: a function of the data, so
    /// every run takes the same path), with `mask` applied (row `r` keyed by `keys[r]`).
    pub fn new(x: Array2<f32>, mask: Option<&DropoutMask>, keys: &[u64]) -> InputRows {
        if x.ncols() > 0 && x.nrows() > 0 && prefers_sparse(x.view()) {
            let mut s = CsrMatrix::from_dense(x.view());
            if let Some(m) = mask {
                m.apply_sparse_in_place(&mut s, keys);
            }
            InputRows::Sparse(s)
        } else {
            let mut x = x;
            if let Some(m) = mask {
                m.apply_in_place(x.view_mut(), keys);
            }
            InputRows::Dense(x)
        }
    }

    /// Number of rows.
    pub fn nrows(&self) -> usize {
        match self {
            InputRows::Dense(x) => x.nrows(),
            InputRows::Sparse(x) => x.nrows(),
        }
    }

    /// `x·w`.
    pub fn times(&self, w: ArrayView2<f32>) -> Array2<f32> {
        match self {
            InputRows::Dense(x) => matmul(x.view(), w),
            InputRows::Sparse(x) => spmm(x, x.nrows(), w),
        }
    }

    /// `z += x·w`.
    pub fn add_times(&self, w: ArrayView2<f32>, z: ArrayViewMut2<f32>) {
        match self {
            InputRows::Dense(x) => gemm_into(1.0, x.view(), w, 1.0, z),
            InputRows::Sparse(x) => spmm_into(x, x.nrows(), w, z, true),
        }
    }

    /// `c += xᵀ·d` (`d` has one row per row of `x`).
    pub fn add_transposed_times(&self, d: ArrayView2<f32>, c: ArrayViewMut2<f32>) {
        match self {
            InputRows::Dense(x) => add_matmul_tn(x.view(), d, c),
            InputRows::Sparse(x) => add_spmm_tn(&CsrTranspose::new(x), x.nrows(), d, c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn sparse_and_dense_rows_give_the_same_products() {
        // 4 of 64 columns non-zero: prefers_sparse takes the CSR path.
        let x = Array2::from_shape_fn((5, 64), |(i, j)| {
            if j % 16 == i % 3 {
                (i * 64 + j) as f32 * 0.01
            } else {
                0.0
            }
        });
        let w = Array2::from_shape_fn((64, 3), |(i, j)| ((i * 3 + j) % 7) as f32 - 3.0);
        let d = Array2::from_shape_fn((5, 3), |(i, j)| (i + j) as f32);
        let mask = DropoutMask::new(7, 0.5);
        let keys: Vec<u64> = (10..15).collect();
        let sparse = InputRows::new(x.clone(), Some(&mask), &keys);
        assert!(matches!(sparse, InputRows::Sparse(_)));
        let mut masked = x.clone();
        mask.apply_in_place(masked.view_mut(), &keys);
        let dense = InputRows::Dense(masked);
        let close = |a: &Array2<f32>, b: &Array2<f32>| {
            a.iter()
                .zip(b)
                .all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + q.abs()))
        };
        assert!(close(&sparse.times(w.view()), &dense.times(w.view())));
        let (mut a, mut b) = (Array2::ones((5, 3)), Array2::ones((5, 3)));
        sparse.add_times(w.view(), a.view_mut());
        dense.add_times(w.view(), b.view_mut());
        assert!(close(&a, &b));
        let (mut a, mut b) = (Array2::zeros((64, 3)), Array2::zeros((64, 3)));
        sparse.add_transposed_times(d.view(), a.view_mut());
        dense.add_transposed_times(d.view(), b.view_mut());
        assert!(close(&a, &b));
        assert_eq!(sparse.nrows(), 5);
    }
}
