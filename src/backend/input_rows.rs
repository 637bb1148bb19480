//! Input rows on a backend, dense or sparse, with the three products a layer needs of them: a
//! strategy that runs a layer's pieces itself (SNP) keeps bag-of-words features sparse where
//! the backend has a sparse path, as [`crate::nn::Layer::forward_input`] does, and multiplies
//! only their non-zeros.

use ndarray::Array2;

use super::{Backend, DropoutMask};

/// Rows of a layer's input on backend `B`.
pub enum InputRows<B: Backend> {
    Dense(B::Mat),
    Sparse(B::Sparse),
}

impl<B: Backend> InputRows<B> {
    /// `x` on `be`, sparse when the backend prefers it for these values
    /// ([`Backend::sparse_from_dense`]: a function of the data, so every run and rank takes the
    /// same path), with `mask` applied (row `r` keyed by `keys[r]`; the same bits either way).
    pub fn new(be: &B, x: Array2<f32>, mask: Option<&DropoutMask>, keys: &[u64]) -> InputRows<B> {
        let (rows, cols) = x.dim();
        // Decided on the host, so sparse rows never take their dense form on a device.
        let sparse = (rows > 0 && cols > 0)
            .then(|| be.sparse_from_host(x.view()))
            .flatten();
        match sparse {
            Some(mut s) => {
                if let Some(m) = mask {
                    be.sparse_dropout_in_place(m, &mut s, keys);
                }
                InputRows::Sparse(s)
            }
            None => {
                let mut dense = be.upload_owned(x);
                if let Some(m) = mask {
                    be.dropout_in_place(m, be.view_mut(&mut dense), keys);
                }
                InputRows::Dense(dense)
            }
        }
    }

    /// Number of rows.
    pub fn nrows(&self, be: &B) -> usize {
        match self {
            InputRows::Dense(x) => be.mat_dim(x).0,
            InputRows::Sparse(x) => be.sparse_dim(x).0,
        }
    }

    /// `x·w`.
    pub fn times(&self, be: &B, w: B::View<'_>) -> B::Mat {
        match self {
            InputRows::Dense(x) => be.matmul(be.view(x), w),
            InputRows::Sparse(x) => be.spmm(x, be.sparse_dim(x).0, w),
        }
    }

    /// `z += x·w`.
    pub fn add_times(&self, be: &B, w: B::View<'_>, z: B::ViewMut<'_>) {
        match self {
            InputRows::Dense(x) => be.gemm_into(1.0, be.view(x), w, 1.0, z),
            InputRows::Sparse(x) => be.spmm_into(x, be.sparse_dim(x).0, w, z, true),
        }
    }

    /// `c += xᵀ·d` (`d` has one row per row of `x`).
    pub fn add_transposed_times(&self, be: &B, d: B::View<'_>, c: B::ViewMut<'_>) {
        match self {
            InputRows::Dense(x) => be.add_matmul_tn(be.view(x), d, c),
            InputRows::Sparse(x) => be.add_spmm_tn(x, be.sparse_dim(x).0, d, c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;

    #[test]
    fn sparse_and_dense_rows_give_the_same_products() {
        // 4 of 64 columns non-zero: the CPU takes the CSR path.
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
        let be = Cpu;
        let sparse = InputRows::new(&be, x.clone(), Some(&mask), &keys);
        assert!(matches!(sparse, InputRows::Sparse(_)));
        let mut masked = x.clone();
        mask.apply_in_place(masked.view_mut(), &keys);
        let dense = InputRows::<Cpu>::Dense(masked);
        let close = |a: &Array2<f32>, b: &Array2<f32>| {
            a.iter()
                .zip(b)
                .all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + q.abs()))
        };
        assert!(close(
            &sparse.times(&be, w.view()),
            &dense.times(&be, w.view())
        ));
        let (mut a, mut b) = (Array2::ones((5, 3)), Array2::ones((5, 3)));
        sparse.add_times(&be, w.view(), a.view_mut());
        dense.add_times(&be, w.view(), b.view_mut());
        assert!(close(&a, &b));
        let (mut a, mut b) = (Array2::zeros((64, 3)), Array2::zeros((64, 3)));
        sparse.add_transposed_times(&be, d.view(), a.view_mut());
        dense.add_transposed_times(&be, d.view(), b.view_mut());
        assert!(close(&a, &b));
        assert_eq!(sparse.nrows(&be), 5);
        // Dense input stays dense, masked in place with the same bits.
        let dense_x = Array2::from_shape_fn((5, 64), |(i, j)| 1.0 + (i + j) as f32);
        let got = InputRows::new(&be, dense_x.clone(), Some(&mask), &keys);
        let mut want = dense_x;
        mask.apply_in_place(want.view_mut(), &keys);
        match got {
            InputRows::Dense(m) => assert_eq!(m, want),
            InputRows::Sparse(_) => panic!("dense rows became sparse"),
        }
    }
}
