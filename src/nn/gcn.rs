//! GCN convolution: `h_v = (D_v / d̂_v) · Σ_{u → v} h_u·W / sqrt(D_v · D_u) + b`, where `D` is
//! the degree in the whole graph (the caller passes the table, so the result does not depend on
//! how edges are split over ranks) and `d̂_v` is `v`'s in-degree inside the block: with all
//! edges, standard GCN; with `d̂_v` sampled edges, an unbiased estimate of it. Without a table,
//! DGL's in-block convention ([`GcnNorm::new`]). Self-loops are the caller's choice
//! (`Block::with_self_loops`, and +1 in the degree table).
//!
//! Like SAGE, it aggregates first or projects first, whichever costs fewer multiply-adds for
//! the block's shape.

use ndarray::{Array2, ArrayView2, CowArray, Ix2};

use super::init::glorot_uniform;
use super::linear::{accumulate_bias_grad, add_bias};
use super::params::ParamStore;
use crate::sample::Block;
use crate::tensor::aggregate::{aggregate, aggregate_transpose, GcnNorm, LazyTranspose};
use crate::tensor::gemm::{add_matmul_tn, matmul, matmul_nt};
use crate::tensor::sparse::{add_spmm_tn, spmm, CsrMatrix, CsrTranspose};

/// GCNConv (symmetric normalisation, bias).
#[derive(Clone, Debug, PartialEq)]
pub struct GcnConv {
    pub weight: usize,
    pub bias: usize,
    pub in_dim: usize,
    pub out_dim: usize,
}

/// Forward state for the backward pass.
#[derive(Debug)]
pub struct GcnCache {
    /// The normalisation factors (per source and per destination, not per edge).
    norm: GcnNorm,
    order: GcnOrder,
}

#[derive(Debug)]
enum GcnOrder {
    /// `agg = Â·h_in` was projected: keep `agg`.
    AggregateFirst(Array2<f32>),
    /// `h_in·W` was aggregated: keep `h_in`.
    ProjectFirst(Array2<f32>),
    /// Sparse input rows were projected (over their non-zeros) and then aggregated.
    SparseProject(CsrMatrix),
}

impl GcnConv {
    /// Register `{prefix}.weight` (`in × out`, Glorot) and `{prefix}.bias`.
    pub fn new(
        params: &mut ParamStore,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        seed: u64,
    ) -> GcnConv {
        let weight = params.add(format!("{prefix}.weight"), &[in_dim, out_dim]);
        glorot_uniform(params, weight, seed);
        let bias = params.add(format!("{prefix}.bias"), &[out_dim]);
        GcnConv {
            weight,
            bias,
            in_dim,
            out_dim,
        }
    }

    fn aggregate_first(&self, block: &Block) -> bool {
        let (e, ns, nd) = (block.num_edges(), block.num_src(), block.num_dst);
        let (i, o) = (self.in_dim, self.out_dim);
        e * i + nd * i * o <= ns * i * o + e * o
    }

    /// `h_in` has `block.num_src()` rows; `src_degrees` is the graph's degree table by global
    /// id (see [`GcnNorm::new`]).
    pub fn forward(
        &self,
        params: &ParamStore,
        block: &Block,
        h_in: CowArray<f32, Ix2>,
        src_degrees: Option<&[u32]>,
    ) -> (Array2<f32>, GcnCache) {
        let norm = GcnNorm::new(block, src_degrees);
        let w = params.view(self.weight);
        let (mut z, order) = if self.aggregate_first(block) {
            let agg = aggregate(block, h_in.view(), norm.weights());
            (matmul(agg.view(), w), GcnOrder::AggregateFirst(agg))
        } else {
            let projected = matmul(h_in.view(), w);
            let z = aggregate(block, projected.view(), norm.weights());
            (z, GcnOrder::ProjectFirst(h_in.into_owned()))
        };
        add_bias(z.view_mut(), params.view(self.bias));
        (z, GcnCache { norm, order })
    }

    /// [`GcnConv::forward`] on sparse input rows (`block.num_src()` of them): `X·W` over the
    /// non-zeros, then aggregation.
    pub fn forward_sparse(
        &self,
        params: &ParamStore,
        block: &Block,
        x: CsrMatrix,
        src_degrees: Option<&[u32]>,
    ) -> (Array2<f32>, GcnCache) {
        assert_eq!(x.nrows(), block.num_src(), "gcn: sparse input rows");
        let norm = GcnNorm::new(block, src_degrees);
        let projected = spmm(&x, x.nrows(), params.view(self.weight));
        let mut z = aggregate(block, projected.view(), norm.weights());
        add_bias(z.view_mut(), params.view(self.bias));
        let order = GcnOrder::SparseProject(x);
        (z, GcnCache { norm, order })
    }

    /// Accumulate gradients; return d `h_in` (`num_src` rows) when asked.
    pub fn backward(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        cache: GcnCache,
        dz: ArrayView2<f32>,
        need_d_in: bool,
    ) -> Option<Array2<f32>> {
        accumulate_bias_grad(params, self.bias, dz);
        let weights = cache.norm.weights();
        match cache.order {
            GcnOrder::AggregateFirst(agg) => {
                add_matmul_tn(agg.view(), dz, params.grad_mut(self.weight));
                if !need_d_in {
                    return None;
                }
                let d_agg = matmul_nt(dz, params.view(self.weight));
                Some(aggregate_transpose(
                    block,
                    transpose.get(block),
                    d_agg.view(),
                    weights,
                ))
            }
            GcnOrder::SparseProject(x) => {
                let d_proj = aggregate_transpose(block, transpose.get(block), dz, weights);
                let xt = CsrTranspose::new(&x);
                add_spmm_tn(&xt, x.nrows(), d_proj.view(), params.grad_mut(self.weight));
                need_d_in.then(|| matmul_nt(d_proj.view(), params.view(self.weight)))
            }
            GcnOrder::ProjectFirst(h_in) => {
                let d_proj = aggregate_transpose(block, transpose.get(block), dz, weights);
                add_matmul_tn(h_in.view(), d_proj.view(), params.grad_mut(self.weight));
                need_d_in.then(|| matmul_nt(d_proj.view(), params.view(self.weight)))
            }
        }
    }
}
