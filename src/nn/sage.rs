//! GraphSAGE convolution with the mean aggregator and a root weight:
//! `h_v = W_self·h_v + W_neigh·mean_{u ∈ N(v)} h_u + b`.
//!
//! Two evaluation orders give the same result; the cheaper one for the block's shape is used:
//! * aggregate-then-project: `E·in + 2·dst·in·out` multiply-adds (sampled blocks, where the
//!   sources outnumber the destinations);
//! * project-then-aggregate: `src·in·out + E·out + dst·in·out` (full-graph blocks with
//!   `out < in`).

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, CowArray, Ix2};

use super::init::glorot_uniform;
use super::linear::{accumulate_bias_grad, add_bias};
use super::params::ParamStore;
use crate::backend::cpu::aggregate::{
    aggregate, aggregate_beside, aggregate_transpose_beside, aggregate_transpose_lazy, EdgeWeights,
    LazyTranspose,
};
use crate::backend::cpu::dropout::KeptBits;
use crate::backend::cpu::gemm::{
    add_matmul_nt_rows, add_matmul_tn, gemm_into, matmul, matmul_nt, matmul_onto_bias_relu,
    RowDropout,
};
use crate::backend::cpu::rows::InputRows;
use crate::backend::cpu::sparse::{add_spmm_tn, spmm, spmm_into, CsrMatrix, CsrTranspose};
use crate::backend::cpu::sparse_rows::{matmul_mostly_zero_rows, splits_exactly_after};
use crate::sample::Block;

/// SAGEConv (mean, root weight).
#[derive(Clone, Debug, PartialEq)]
pub struct SageConv {
    pub w_self: usize,
    pub w_neigh: usize,
    pub bias: usize,
    pub in_dim: usize,
    pub out_dim: usize,
}

/// One bit per output element, when a fused product recorded them (ReLU signs, kept
/// dropout elements).
pub type MaybeBits = Option<Vec<u64>>;

/// Forward state for the backward pass.
#[derive(Debug)]
pub enum SageCache {
    /// Aggregated first: `[h_dst | mean of neighbours]` per destination, the input of one
    /// product with `[W_self; W_neigh]`.
    AggregateFirst { beside: Array2<f32> },
    /// Projected first: the whole input.
    ProjectFirst { h_in: Array2<f32> },
    /// Sparse input rows, always projected first (the products cost only their non-zeros).
    Sparse { x: CsrMatrix },
}

impl SageConv {
    /// Register `{prefix}.w_self`, `{prefix}.w_neigh` (`in × out`, Glorot) and `{prefix}.bias`.
    pub fn new(
        params: &mut ParamStore,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        seed: u64,
    ) -> SageConv {
        let w_self = params.add(format!("{prefix}.w_self"), &[in_dim, out_dim]);
        glorot_uniform(params, w_self, seed);
        let w_neigh = params.add(format!("{prefix}.w_neigh"), &[in_dim, out_dim]);
        glorot_uniform(params, w_neigh, seed);
        let bias = params.add(format!("{prefix}.bias"), &[out_dim]);
        SageConv {
            w_self,
            w_neigh,
            bias,
            in_dim,
            out_dim,
        }
    }

    /// True when aggregating before projecting costs fewer multiply-adds.
    fn aggregate_first(&self, block: &Block) -> bool {
        let (e, ns, nd) = (block.num_edges(), block.num_src(), block.num_dst);
        let (i, o) = (self.in_dim, self.out_dim);
        e * i + nd * i * o <= ns * i * o + e * o
    }

    /// `h_in` has `block.num_src()` rows.
    pub fn forward(
        &self,
        params: &ParamStore,
        block: &Block,
        h_in: CowArray<f32, Ix2>,
    ) -> (Array2<f32>, SageCache) {
        let (z, cache, _, _) = self.forward_relu(params, block, h_in, false, None);
        (z, cache)
    }

    /// [`SageConv::forward`], then with `relu` the ReLU too when the product can apply it
    /// (with the bias) as it stores its tiles: the output is activated exactly when the sign
    /// bits (bit `i·out + j` = output `(i, j)` > 0) are returned. With `relu` and `then` (the
    /// next layer's input dropout, one seed per destination), the product masks the
    /// activated output as well, exactly when the kept bits are returned.
    pub fn forward_relu(
        &self,
        params: &ParamStore,
        block: &Block,
        h_in: CowArray<f32, Ix2>,
        relu: bool,
        then: Option<&RowDropout>,
    ) -> (Array2<f32>, SageCache, MaybeBits, MaybeBits) {
        let nd = block.num_dst;
        let h_dst = h_in.slice(s![..nd, ..]);
        let w_self = params.view(self.w_self);
        let w_neigh = params.view(self.w_neigh);
        if self.aggregate_first(block) {
            // One product `[h_dst | agg]·[W_self; W_neigh]` writes the output once; the two
            // weights are registered one after the other, so they stack without a copy.
            // The bias (and ReLU) are applied by the product's tiles as they are stored.
            let beside = aggregate_beside(block, h_in.view(), EdgeWeights::Mean);
            let bias = params.view(self.bias);
            let bias = Some(bias.as_slice().expect("contiguous bias"));
            let w = params.stacked(self.w_self, self.w_neigh);
            let then = then.filter(|_| relu);
            let in_dim = w_self.nrows();
            // `h_dst` below another layer is mostly zeros (its ReLU and this layer's dropout):
            // where that pays, its half of the product skips them, and the aggregated half is
            // added on by the dense product, with the same bits as the single product.
            let (onto, a, b) = if splits_exactly_after(in_dim) {
                let z_self = matmul_mostly_zero_rows(beside.slice(s![.., ..in_dim]), w_self);
                (Some(z_self), beside.slice(s![.., in_dim..]), w_neigh)
            } else {
                (None, beside.view(), w)
            };
            let (z, bits, kept) = matmul_onto_bias_relu(onto, a, b, bias, relu, then);
            (z, SageCache::AggregateFirst { beside }, bits, kept)
        } else {
            let projected = matmul(h_in.view(), w_neigh);
            let mut z = aggregate(block, projected.view(), EdgeWeights::Mean);
            gemm_into(1.0, h_dst, w_self, 1.0, z.view_mut());
            add_bias(z.view_mut(), params.view(self.bias));
            (
                z,
                SageCache::ProjectFirst {
                    h_in: h_in.into_owned(),
                },
                None,
                None,
            )
        }
    }

    /// [`SageConv::forward`] on sparse input rows (`block.num_src()` of them): project first,
    /// `X·W_neigh` and `X_dst·W_self` over the non-zeros only.
    pub fn forward_sparse(
        &self,
        params: &ParamStore,
        block: &Block,
        x: CsrMatrix,
    ) -> (Array2<f32>, SageCache) {
        assert_eq!(x.nrows(), block.num_src(), "sage: sparse input rows");
        let projected = spmm(&x, block.num_src(), params.view(self.w_neigh));
        let mut z = aggregate(block, projected.view(), EdgeWeights::Mean);
        spmm_into(
            &x,
            block.num_dst,
            params.view(self.w_self),
            z.view_mut(),
            true,
        );
        add_bias(z.view_mut(), params.view(self.bias));
        (z, SageCache::Sparse { x })
    }

    /// The neighbour projection `x·W_neigh` of source rows, without aggregation: source-node
    /// parallelism (SNP) projects each source once on its owner and sums weighted partial rows
    /// there ([`crate::exchange::partial`]).
    pub(crate) fn project_neighbours(&self, params: &ParamStore, x: &InputRows) -> Array2<f32> {
        x.times(params.view(self.w_neigh))
    }

    /// The backward of [`SageConv::project_neighbours`] for the weights: `dW_neigh += xᵀ·d_proj`.
    pub(crate) fn accumulate_neighbour_grad(
        &self,
        params: &mut ParamStore,
        x: &InputRows,
        d_proj: ArrayView2<f32>,
    ) {
        x.add_transposed_times(d_proj, params.grad_mut(self.w_neigh));
    }

    /// The root term on the destination rows: `z += x_dst·W_self + b` (`z` already holds the
    /// aggregated neighbour term).
    pub(crate) fn add_root(
        &self,
        params: &ParamStore,
        x_dst: &InputRows,
        mut z: ArrayViewMut2<f32>,
    ) {
        x_dst.add_times(params.view(self.w_self), z.view_mut());
        add_bias(z, params.view(self.bias));
    }

    /// The backward of [`SageConv::add_root`] for the weights: `dW_self += x_dstᵀ·dz`,
    /// `db += Σ dz`.
    pub(crate) fn accumulate_root_grad(
        &self,
        params: &mut ParamStore,
        x_dst: &InputRows,
        dz: ArrayView2<f32>,
    ) {
        x_dst.add_transposed_times(dz, params.grad_mut(self.w_self));
        accumulate_bias_grad(params, self.bias, dz);
    }

    /// The input gradient of the project-first orders: `d_proj·W_neighᵀ` for every source,
    /// plus `dz·W_selfᵀ` on the destinations' rows, masked by `kept` when given.
    fn input_grad(
        &self,
        params: &ParamStore,
        d_proj: ArrayView2<f32>,
        dz: ArrayView2<f32>,
        kept: Option<&KeptBits>,
    ) -> Array2<f32> {
        let mut d_in = matmul_nt(d_proj, params.view(self.w_neigh));
        add_matmul_nt_rows(dz, params.view(self.w_self), d_in.view_mut());
        if let Some(kept) = kept {
            kept.apply_in_place(d_in.view_mut());
        }
        d_in
    }

    /// Accumulate gradients; return d `h_in` (`num_src` rows) when asked, masked by the input
    /// dropout's `kept` bits when given.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        cache: SageCache,
        dz: ArrayView2<f32>,
        need_d_in: bool,
        kept: Option<&KeptBits>,
    ) -> Option<Array2<f32>> {
        let nd = block.num_dst;
        accumulate_bias_grad(params, self.bias, dz);
        match cache {
            SageCache::AggregateFirst { beside } => {
                let grad = params.stacked_grad_mut(self.w_self, self.w_neigh);
                if !need_d_in {
                    add_matmul_tn(beside.view(), dz, grad);
                    return None;
                }
                // Building the transpose is serial: do it while the other thread starts on the
                // weight gradient.
                rayon::join(
                    || transpose.get(block),
                    || add_matmul_tn(beside.view(), dz, grad),
                );
                // `[d h_dst | d agg]`, then the transposed mean adds the destinations' own part.
                // Below another layer `dz` is mostly zeros (this layer's ReLU, the next
                // layer's dropout): the product skips them, with the dense product's bits.
                let d_beside =
                    matmul_mostly_zero_rows(dz, params.stacked(self.w_self, self.w_neigh).t());
                // The dropout mask is applied to each row as it is produced.
                Some(aggregate_transpose_beside(
                    block,
                    transpose.get(block),
                    d_beside.view(),
                    EdgeWeights::Mean,
                    kept,
                ))
            }
            SageCache::Sparse { x } => {
                let d_proj = aggregate_transpose_lazy(block, transpose, dz, EdgeWeights::Mean);
                let xt = CsrTranspose::new(&x);
                add_spmm_tn(&xt, nd, dz, params.grad_mut(self.w_self));
                add_spmm_tn(&xt, x.nrows(), d_proj.view(), params.grad_mut(self.w_neigh));
                if !need_d_in {
                    return None;
                }
                Some(self.input_grad(params, d_proj.view(), dz, kept))
            }
            SageCache::ProjectFirst { h_in } => {
                let d_proj = aggregate_transpose_lazy(block, transpose, dz, EdgeWeights::Mean);
                add_matmul_tn(h_in.slice(s![..nd, ..]), dz, params.grad_mut(self.w_self));
                add_matmul_tn(h_in.view(), d_proj.view(), params.grad_mut(self.w_neigh));
                if !need_d_in {
                    return None;
                }
                Some(self.input_grad(params, d_proj.view(), dz, kept))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::dropout::DropoutMask;
    use ndarray::Array2;

    /// The dropout mask applied inside the transposed mean (each row as it is produced) gives
    /// bitwise what masking the whole input gradient afterwards gives, for rows wide enough
    /// for the vector kernels and with a partial last vector.
    #[test]
    fn fused_input_dropout_backward_matches_masking_afterwards() {
        let block = Block::small_example();
        let (din, dout) = (41, 37);
        let mut params = ParamStore::new();
        let conv = SageConv::new(&mut params, "s", din, dout, 3);
        let h = Array2::from_shape_fn((block.num_src(), din), |(i, j)| {
            ((i * 31 + j * 7) % 17) as f32 * 0.1 - 0.8
        });
        let keys: Vec<u64> = block.src_nodes.iter().map(|&v| v as u64).collect();
        let (h_in, kept) = DropoutMask::new(9, 0.4).apply_recorded(h.view(), &keys);
        let (z, cache) = conv.forward(&params, &block, CowArray::from(h_in.view()));
        assert!(matches!(cache, SageCache::AggregateFirst { .. }));
        let dz = z.mapv(|v| v.sin());
        let t = LazyTranspose::default();
        let fused = conv
            .backward(&mut params, &block, &t, cache, dz.view(), true, Some(&kept))
            .unwrap();
        let (_, cache) = conv.forward(&params, &block, CowArray::from(h_in.view()));
        let mut after = conv
            .backward(&mut params, &block, &t, cache, dz.view(), true, None)
            .unwrap();
        kept.apply_in_place(after.view_mut());
        assert_eq!(fused, after);
        assert!(fused.iter().any(|&v| v == 0.0) && fused.iter().any(|&v| v != 0.0));
    }
}
