//! A fully connected layer `y = x·W + b` (`W` is `in × out`, so the forward needs no
//! transpose), and the helpers other layers share: bias add and bias gradient.

use super::init::{init_weight, InitKind};
use super::params::ParamStore;
use crate::backend::{Backend, Cpu};

/// `z[i, :] += bias` for every row (nothing for a layer without a bias).
pub fn add_bias<B: Backend>(params: &ParamStore<B>, z: B::ViewMut<'_>, bias: Option<usize>) {
    if let Some(bias) = bias {
        params.backend().add_bias(z, params.view(bias));
    }
}

/// `grad(bias) += Σ_rows dz` (nothing for a layer without a bias).
pub fn accumulate_bias_grad<B: Backend>(
    params: &mut ParamStore<B>,
    bias: Option<usize>,
    dz: B::View<'_>,
) {
    if let Some(bias) = bias {
        let be = params.backend().clone();
        be.add_column_sums(params.grad_mut(bias), dz);
    }
}

/// A bias's values as the products' epilogues take them.
pub fn bias_view<B: Backend>(params: &ParamStore<B>, bias: Option<usize>) -> Option<B::View<'_>> {
    bias.map(|b| params.view(b))
}

/// `y = x·W + b`.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    pub weight: usize,
    /// `None`: no bias (NFP's column slices, whose partial rows meet before the bias).
    pub bias: Option<usize>,
    pub in_dim: usize,
    pub out_dim: usize,
}

impl Linear {
    /// Register `{prefix}.weight` (`in × out`) and `{prefix}.bias`, started the `init` way.
    pub fn new(
        params: &mut ParamStore<Cpu>,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        init: InitKind,
        seed: u64,
    ) -> Linear {
        let weight = params.add(format!("{prefix}.weight"), &[in_dim, out_dim]);
        let bias = params.add(format!("{prefix}.bias"), &[out_dim]);
        init_weight(params, init, weight, Some(bias), seed);
        Linear {
            weight,
            bias: Some(bias),
            in_dim,
            out_dim,
        }
    }

    /// `x·W + b`.
    pub fn forward<B: Backend>(&self, params: &ParamStore<B>, x: B::View<'_>) -> B::Mat {
        let be = params.backend();
        let cols = be.dim(x).1;
        assert_eq!(
            cols, self.in_dim,
            "linear: input has {cols} columns, expected {}",
            self.in_dim
        );
        // The product adds the bias as it stores its output.
        let bias = bias_view(params, self.bias);
        be.matmul_epilogue(None, x, params.view(self.weight), bias, false, None)
            .0
    }

    /// `x·W + b` for sparse rows `x`.
    pub fn forward_sparse<B: Backend>(&self, params: &ParamStore<B>, x: &B::Sparse) -> B::Mat {
        let be = params.backend();
        let (rows, cols) = be.sparse_dim(x);
        assert_eq!(cols, self.in_dim, "linear: sparse input columns");
        let mut y = be.spmm(x, rows, params.view(self.weight));
        add_bias(params, be.view_mut(&mut y), self.bias);
        y
    }

    /// [`Linear::backward`] for sparse rows `x`.
    pub fn backward_sparse<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        x: &B::Sparse,
        dy: B::View<'_>,
        need_dx: bool,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        let rows = be.sparse_dim(x).0;
        be.add_spmm_tn(x, rows, dy, params.grad_mut(self.weight));
        accumulate_bias_grad(params, self.bias, dy);
        need_dx.then(|| be.matmul_nt(dy, params.view(self.weight)))
    }

    /// Accumulate `dW += xᵀ·dy`, `db += Σ dy`; return `dx = dy·Wᵀ` when asked.
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        x: B::View<'_>,
        dy: B::View<'_>,
        need_dx: bool,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        be.add_matmul_tn(x, dy, params.grad_mut(self.weight));
        accumulate_bias_grad(params, self.bias, dy);
        need_dx.then(|| be.matmul_nt(dy, params.view(self.weight)))
    }
}
