//! GraphSAGE convolution with the mean aggregator and a root weight:
//! `h_v = W_self·h_v + W_neigh·mean_{u ∈ N(v)} h_u + b`.
//!
//! Two evaluation orders give the same result; the cheaper one for the block's shape is used:
//! * aggregate-then-project: `E·in + 2·dst·in·out` multiply-adds (sampled blocks, where the
//!   sources outnumber the destinations);
//! * project-then-aggregate: `src·in·out + E·out + dst·in·out` (full-graph blocks with
//!   `out < in`).

use super::init::{init_weight, InitKind};
use super::linear::{accumulate_bias_grad, add_bias, bias_view};
use super::params::ParamStore;
use super::transposes::aggregate_first;
use crate::backend::input_rows::InputRows;
use crate::backend::{Backend, CowMat, Cpu, DropoutMask, EdgeWeights, RowDropout};

/// SAGEConv (mean, root weight).
#[derive(Clone, Debug, PartialEq)]
pub struct SageConv {
    pub w_self: usize,
    pub w_neigh: usize,
    /// `None`: no bias (NFP's column slices, whose partial rows meet before the bias).
    pub bias: Option<usize>,
    pub in_dim: usize,
    pub out_dim: usize,
}

/// Forward state for the backward pass.
#[derive(Debug)]
pub enum SageCache<B: Backend = Cpu> {
    /// Aggregated first: `[h_dst | mean of neighbours]` per destination, the input of one
    /// product with `[W_self; W_neigh]`.
    AggregateFirst { beside: B::Mat },
    /// Projected first: the whole input (`None` after an inference pass, which keeps it for
    /// no backward).
    ProjectFirst { h_in: Option<B::Mat> },
    /// Sparse input rows, always projected first (the products cost only their non-zeros).
    Sparse { x: B::Sparse },
}

/// What [`SageConv::forward_relu`] returns: the output, the cache, the ReLU's saved signs
/// when the product applied it, and the next layer's kept bits when it applied that dropout.
pub type SageForward<B> = (
    <B as Backend>::Mat,
    SageCache<B>,
    Option<<B as Backend>::Saved>,
    Option<<B as Backend>::Kept>,
);

impl SageConv {
    /// Register `{prefix}.w_self`, `{prefix}.w_neigh` (`in × out`) and `{prefix}.bias`,
    /// started the `init` way (the bias, where `init` sets one, with the self weight's fan-in).
    pub fn new(
        params: &mut ParamStore<Cpu>,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        init: InitKind,
        seed: u64,
    ) -> SageConv {
        let w_self = params.add(format!("{prefix}.w_self"), &[in_dim, out_dim]);
        let w_neigh = params.add(format!("{prefix}.w_neigh"), &[in_dim, out_dim]);
        let bias = params.add(format!("{prefix}.bias"), &[out_dim]);
        init_weight(params, init, w_self, Some(bias), seed);
        init_weight(params, init, w_neigh, None, seed);
        SageConv {
            w_self,
            w_neigh,
            bias: Some(bias),
            in_dim,
            out_dim,
        }
    }

    /// `h_in` has `block.num_src()` rows.
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        keep: bool,
    ) -> (B::Mat, SageCache<B>) {
        let (z, cache, _, _) = self.forward_relu(params, g, h_in, false, None, keep);
        (z, cache)
    }

    /// [`SageConv::forward`], then with `relu` the ReLU too when the product can apply it
    /// (with the bias) as it stores its output: the output is activated exactly when the ReLU's
    /// saved signs are returned. With `relu` and `then` (the next layer's input dropout, one
    /// seed per destination, and the mask it came from), the product masks the activated
    /// output as well, exactly when the kept bits are returned. `keep`: a backward pass
    /// follows ([`DropoutCtx::keep_for_backward`](super::DropoutCtx::keep_for_backward)).
    pub fn forward_relu<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        relu: bool,
        then: Option<(&RowDropout, &DropoutMask)>,
        keep: bool,
    ) -> SageForward<B> {
        let be = params.backend();
        let block = be.block(g);
        let nd = block.num_dst;
        let w_self = params.view(self.w_self);
        let w_neigh = params.view(self.w_neigh);
        if aggregate_first(block, self.in_dim, self.out_dim) {
            // One product `[h_dst | agg]·[W_self; W_neigh]` writes the output once; the two
            // weights are registered one after the other, so they stack without a copy.
            // The bias (and ReLU) are applied by the product as it stores its output.
            let beside = be.aggregate_beside(g, h_in.view(be), EdgeWeights::Mean);
            let bias = bias_view(params, self.bias);
            let w = params.stacked(self.w_self, self.w_neigh);
            let then = then.filter(|_| relu);
            // `h_dst` below another layer is mostly zeros (its ReLU and this layer's dropout):
            // the backend may skip them in its half of the product.
            let (z, bits, kept) =
                be.matmul_epilogue_stacked(be.view(&beside), w_self, w_neigh, w, bias, relu, then);
            (z, SageCache::AggregateFirst { beside }, bits, kept)
        } else {
            let hv = h_in.view(be);
            let projected = be.matmul(hv, w_neigh);
            let mut z = be.aggregate(g, be.view(&projected), EdgeWeights::Mean);
            be.gemm_into(1.0, be.rows(hv, 0..nd), w_self, 1.0, be.view_mut(&mut z));
            add_bias(params, be.view_mut(&mut z), self.bias);
            let h_in = h_in.kept(be, keep);
            (z, SageCache::ProjectFirst { h_in }, None, None)
        }
    }

    /// [`SageConv::forward`] on sparse input rows (`block.num_src()` of them): project first,
    /// `X·W_neigh` and `X_dst·W_self` over the non-zeros only.
    pub fn forward_sparse<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        x: B::Sparse,
    ) -> (B::Mat, SageCache<B>) {
        let be = params.backend();
        let block = be.block(g);
        assert_eq!(
            be.sparse_dim(&x).0,
            block.num_src(),
            "sage: sparse input rows"
        );
        let projected = be.spmm(&x, block.num_src(), params.view(self.w_neigh));
        let mut z = be.aggregate(g, be.view(&projected), EdgeWeights::Mean);
        be.spmm_into(
            &x,
            block.num_dst,
            params.view(self.w_self),
            be.view_mut(&mut z),
            true,
        );
        add_bias(params, be.view_mut(&mut z), self.bias);
        (z, SageCache::Sparse { x })
    }

    /// The input gradient of the project-first orders: `d_proj·W_neighᵀ` for every source,
    /// plus `dz·W_selfᵀ` on the destinations' rows, masked by `kept` when given.
    fn input_grad<B: Backend>(
        &self,
        params: &ParamStore<B>,
        d_proj: B::View<'_>,
        dz: B::View<'_>,
        kept: Option<&B::Kept>,
    ) -> B::Mat {
        let be = params.backend();
        let mut d_in = be.matmul_nt(d_proj, params.view(self.w_neigh));
        be.add_matmul_nt_rows(dz, params.view(self.w_self), be.view_mut(&mut d_in));
        if let Some(kept) = kept {
            be.kept_apply(kept, be.view_mut(&mut d_in));
        }
        d_in
    }

    /// Accumulate gradients; return d `h_in` (`num_src` rows) when asked, masked by the input
    /// dropout's `kept` bits when given.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        cache: SageCache<B>,
        dz: B::View<'_>,
        need_d_in: bool,
        kept: Option<&B::Kept>,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        let nd = be.block(g).num_dst;
        accumulate_bias_grad(params, self.bias, dz);
        match cache {
            SageCache::AggregateFirst { beside } => {
                let grad = params.stacked_grad_mut(self.w_self, self.w_neigh);
                if !need_d_in {
                    be.add_matmul_tn(be.view(&beside), dz, grad);
                    return None;
                }
                be.add_matmul_tn_building_transpose(be.view(&beside), dz, grad, g, transpose);
                // `[d h_dst | d agg]`, then the transposed mean adds the destinations' own part.
                // Below another layer `dz` is mostly zeros (this layer's ReLU, the next
                // layer's dropout): the product may skip them.
                let w = params.stacked(self.w_self, self.w_neigh);
                let d_beside = be.matmul_nt_sparse_left(dz, w);
                // The dropout mask is applied to each row as it is produced.
                Some(be.aggregate_transpose_beside(
                    g,
                    transpose,
                    be.view(&d_beside),
                    EdgeWeights::Mean,
                    kept,
                ))
            }
            SageCache::Sparse { x } => {
                let d_proj = be.aggregate_transpose(g, transpose, dz, EdgeWeights::Mean);
                be.add_spmm_tn(&x, nd, dz, params.grad_mut(self.w_self));
                let rows = be.sparse_dim(&x).0;
                be.add_spmm_tn(&x, rows, be.view(&d_proj), params.grad_mut(self.w_neigh));
                if !need_d_in {
                    return None;
                }
                Some(self.input_grad(params, be.view(&d_proj), dz, kept))
            }
            SageCache::ProjectFirst { h_in } => {
                let h_in = h_in.expect(super::NOT_KEPT);
                let d_proj = be.aggregate_transpose(g, transpose, dz, EdgeWeights::Mean);
                let hv = be.view(&h_in);
                be.add_matmul_tn(be.rows(hv, 0..nd), dz, params.grad_mut(self.w_self));
                be.add_matmul_tn(hv, be.view(&d_proj), params.grad_mut(self.w_neigh));
                if !need_d_in {
                    return None;
                }
                Some(self.input_grad(params, be.view(&d_proj), dz, kept))
            }
        }
    }
}

/// Source-node parallelism (SNP): pieces of the layer computed on the sources' owners, which
/// work on [`InputRows`] (`crate::exchange::partial`), on any backend.
impl SageConv {
    /// The neighbour projection `x·W_neigh` of source rows, without aggregation: SNP projects
    /// each source once on its owner and sums weighted partial rows there.
    pub(crate) fn project_neighbours<B: Backend>(
        &self,
        params: &ParamStore<B>,
        x: &InputRows<B>,
    ) -> B::Mat {
        x.times(params.backend(), params.view(self.w_neigh))
    }

    /// The backward of [`SageConv::project_neighbours`] for the weights: `dW_neigh += xᵀ·d_proj`.
    pub(crate) fn accumulate_neighbour_grad<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        x: &InputRows<B>,
        d_proj: B::View<'_>,
    ) {
        let be = params.backend().clone();
        x.add_transposed_times(&be, d_proj, params.grad_mut(self.w_neigh));
    }

    /// The root term on the destination rows: `z += x_dst·W_self + b` (`z` already holds the
    /// aggregated neighbour term).
    pub(crate) fn add_root<B: Backend>(
        &self,
        params: &ParamStore<B>,
        x_dst: &InputRows<B>,
        mut z: B::ViewMut<'_>,
    ) {
        let be = params.backend();
        x_dst.add_times(be, params.view(self.w_self), be.reborrow(&mut z));
        add_bias(params, z, self.bias);
    }

    /// The backward of [`SageConv::add_root`] for the weights: `dW_self += x_dstᵀ·dz`,
    /// `db += Σ dz`.
    pub(crate) fn accumulate_root_grad<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        x_dst: &InputRows<B>,
        dz: B::View<'_>,
    ) {
        let be = params.backend().clone();
        x_dst.add_transposed_times(&be, dz, params.grad_mut(self.w_self));
        accumulate_bias_grad(params, self.bias, dz);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::aggregate::LazyTranspose;
    use crate::sample::Block;
    use ndarray::Array2;

    /// The dropout mask applied inside the transposed mean (each row as it is produced) gives
    /// bitwise what masking the whole input gradient afterwards gives, for rows wide enough
    /// for the vector kernels and with a partial last vector.
    #[test]
    fn fused_input_dropout_backward_matches_masking_afterwards() {
        let block = Block::small_example();
        let (din, dout) = (41, 37);
        let mut params = ParamStore::new();
        let conv = SageConv::new(&mut params, "s", din, dout, InitKind::Glorot, 3);
        let h = Array2::from_shape_fn((block.num_src(), din), |(i, j)| {
            ((i * 31 + j * 7) % 17) as f32 * 0.1 - 0.8
        });
        let keys: Vec<u64> = block.src_nodes.iter().map(|&v| v as u64).collect();
        let (h_in, kept) = DropoutMask::new(9, 0.4).apply_recorded(h.view(), &keys);
        let (z, cache) = conv.forward(&params, &block, CowMat::Borrowed(h_in.view()), true);
        assert!(matches!(cache, SageCache::AggregateFirst { .. }));
        let dz = z.mapv(|v| v.sin());
        let t = LazyTranspose::default();
        let fused = conv
            .backward(&mut params, &block, &t, cache, dz.view(), true, Some(&kept))
            .unwrap();
        let (_, cache) = conv.forward(&params, &block, CowMat::Borrowed(h_in.view()), true);
        let mut after = conv
            .backward(&mut params, &block, &t, cache, dz.view(), true, None)
            .unwrap();
        kept.apply_in_place(after.view_mut());
        assert_eq!(fused, after);
        assert!(fused.iter().any(|&v| v == 0.0) && fused.iter().any(|&v| v != 0.0));
    }
}
