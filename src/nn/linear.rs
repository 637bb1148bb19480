//! A fully connected layer `y = x·W + b` (`W` is `in × out`, so the forward needs no
//! transpose), and the helpers other layers share: bias add and bias gradient.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use super::init::glorot_uniform;
use super::params::ParamStore;
use crate::backend::cpu::gather::{add_to_rows, axpy, column_sums};
use crate::backend::cpu::gemm::{add_matmul_tn, matmul_bias_relu, matmul_nt};
use crate::backend::cpu::sparse::{add_spmm_tn, spmm, CsrMatrix, CsrTranspose};

/// `z[i, :] += bias` for every row.
pub fn add_bias(z: ArrayViewMut2<f32>, bias: ArrayView2<f32>) {
    add_to_rows(z, bias.to_slice().expect("bias is contiguous"));
}

/// `grad(bias) += Σ_rows dz`.
pub fn accumulate_bias_grad(params: &mut ParamStore, bias: usize, dz: ArrayView2<f32>) {
    let s = column_sums(dz);
    let mut g = params.grad_mut(bias);
    let g = g.as_slice_mut().expect("contiguous");
    axpy(1.0, s.as_slice().expect("contiguous"), g);
}

/// `y = x·W + b`.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    pub weight: usize,
    pub bias: usize,
    pub in_dim: usize,
    pub out_dim: usize,
}

impl Linear {
    /// Register `{prefix}.weight` (`in × out`, Glorot) and `{prefix}.bias` (zeros).
    pub fn new(
        params: &mut ParamStore,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        seed: u64,
    ) -> Linear {
        let weight = params.add(format!("{prefix}.weight"), &[in_dim, out_dim]);
        glorot_uniform(params, weight, seed);
        let bias = params.add(format!("{prefix}.bias"), &[out_dim]);
        Linear {
            weight,
            bias,
            in_dim,
            out_dim,
        }
    }

    /// `x·W + b`.
    pub fn forward(&self, params: &ParamStore, x: ArrayView2<f32>) -> Array2<f32> {
        assert_eq!(
            x.ncols(),
            self.in_dim,
            "linear: input has {} columns, expected {}",
            x.ncols(),
            self.in_dim
        );
        let bias = params.view(self.bias);
        let bias = bias.to_slice().expect("bias is contiguous");
        // The product's tiles add the bias as they are stored.
        matmul_bias_relu(x, params.view(self.weight), Some(bias), false).0
    }

    /// `x·W + b` for sparse rows `x`.
    pub fn forward_sparse(&self, params: &ParamStore, x: &CsrMatrix) -> Array2<f32> {
        assert_eq!(x.ncols, self.in_dim, "linear: sparse input columns");
        let mut y = spmm(x, x.nrows(), params.view(self.weight));
        add_bias(y.view_mut(), params.view(self.bias));
        y
    }

    /// [`Linear::backward`] for sparse rows `x`.
    pub fn backward_sparse(
        &self,
        params: &mut ParamStore,
        x: &CsrMatrix,
        dy: ArrayView2<f32>,
        need_dx: bool,
    ) -> Option<Array2<f32>> {
        add_spmm_tn(
            &CsrTranspose::new(x),
            x.nrows(),
            dy,
            params.grad_mut(self.weight),
        );
        accumulate_bias_grad(params, self.bias, dy);
        need_dx.then(|| matmul_nt(dy, params.view(self.weight)))
    }

    /// Accumulate `dW += xᵀ·dy`, `db += Σ dy`; return `dx = dy·Wᵀ` when asked.
    pub fn backward(
        &self,
        params: &mut ParamStore,
        x: ArrayView2<f32>,
        dy: ArrayView2<f32>,
        need_dx: bool,
    ) -> Option<Array2<f32>> {
        add_matmul_tn(x, dy, params.grad_mut(self.weight));
        accumulate_bias_grad(params, self.bias, dy);
        need_dx.then(|| matmul_nt(dy, params.view(self.weight)))
    }
}
