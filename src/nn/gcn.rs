//! GCN convolution: `h_v = (D_v / d̂_v) · Σ_{u → v} h_u·W / sqrt(D_v · D_u) + b`, where `D` is
//! the degree in the whole graph (the caller passes the table, so the result does not depend on
//! how edges are split over ranks) and `d̂_v` is `v`'s in-degree inside the block: with all
//! edges, standard GCN; with `d̂_v` sampled edges, an unbiased estimate of it. Without a table,
//! DGL's in-block convention ([`GcnNorm::new`]). Self-loops are the caller's choice
//! (`Block::with_self_loops`, and +1 in the degree table).
//!
//! Like SAGE, it aggregates first or projects first, whichever costs fewer multiply-adds for
//! the block's shape.

use super::init::{init_weight, InitKind};
use super::linear::{accumulate_bias_grad, add_bias, bias_view};
use super::params::ParamStore;
use super::transposes::aggregate_first;
use crate::backend::input_rows::InputRows;
use crate::backend::{Backend, CowMat, Cpu, GcnNorm};

/// GCNConv (symmetric normalisation, bias).
#[derive(Clone, Debug, PartialEq)]
pub struct GcnConv {
    pub weight: usize,
    /// `None`: no bias (NFP's column slices, whose partial rows meet before the bias).
    pub bias: Option<usize>,
    pub in_dim: usize,
    pub out_dim: usize,
}

/// Forward state for the backward pass.
#[derive(Debug)]
pub struct GcnCache<B: Backend = Cpu> {
    /// The normalisation factors (per source and per destination, not per edge).
    norm: GcnNorm,
    order: GcnOrder<B>,
}

#[derive(Debug)]
enum GcnOrder<B: Backend> {
    /// `agg = Â·h_in` was projected: keep `agg`.
    AggregateFirst(B::Mat),
    /// `h_in·W` was aggregated: keep `h_in` (`None` after an inference pass).
    ProjectFirst(Option<B::Mat>),
    /// Sparse input rows were projected (over their non-zeros) and then aggregated.
    SparseProject(B::Sparse),
}

impl GcnConv {
    /// Register `{prefix}.weight` (`in × out`) and `{prefix}.bias`, started the `init` way.
    pub fn new(
        params: &mut ParamStore<Cpu>,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        init: InitKind,
        seed: u64,
    ) -> GcnConv {
        let weight = params.add(format!("{prefix}.weight"), &[in_dim, out_dim]);
        let bias = params.add(format!("{prefix}.bias"), &[out_dim]);
        init_weight(params, init, weight, Some(bias), seed);
        GcnConv {
            weight,
            bias: Some(bias),
            in_dim,
            out_dim,
        }
    }

    /// `h_in` has `block.num_src()` rows; `src_degrees` is the graph's degree table by global
    /// id (see [`GcnNorm::new`]).
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        src_degrees: Option<&[u32]>,
        keep: bool,
    ) -> (B::Mat, GcnCache<B>) {
        let be = params.backend();
        let block = be.block(g);
        let norm = GcnNorm::new(block, src_degrees);
        let w = params.view(self.weight);
        let (z, order) = if aggregate_first(block, self.in_dim, self.out_dim) {
            // The product adds the bias as it stores its output.
            let agg = be.aggregate(g, h_in.view(be), norm.weights());
            let bias = bias_view(params, self.bias);
            let z = be
                .matmul_epilogue(None, be.view(&agg), w, bias, false, None)
                .0;
            (z, GcnOrder::AggregateFirst(agg))
        } else {
            let projected = be.matmul(h_in.view(be), w);
            let mut z = be.aggregate(g, be.view(&projected), norm.weights());
            add_bias(params, be.view_mut(&mut z), self.bias);
            (z, GcnOrder::ProjectFirst(h_in.kept(be, keep)))
        };
        (z, GcnCache { norm, order })
    }

    /// [`GcnConv::forward`] on sparse input rows (`block.num_src()` of them): `X·W` over the
    /// non-zeros, then aggregation.
    pub fn forward_sparse<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        x: B::Sparse,
        src_degrees: Option<&[u32]>,
    ) -> (B::Mat, GcnCache<B>) {
        let be = params.backend();
        let block = be.block(g);
        let rows = be.sparse_dim(&x).0;
        assert_eq!(rows, block.num_src(), "gcn: sparse input rows");
        let norm = GcnNorm::new(block, src_degrees);
        let projected = be.spmm(&x, rows, params.view(self.weight));
        let mut z = be.aggregate(g, be.view(&projected), norm.weights());
        add_bias(params, be.view_mut(&mut z), self.bias);
        let order = GcnOrder::SparseProject(x);
        (z, GcnCache { norm, order })
    }

    /// Accumulate gradients; return d `h_in` (`num_src` rows) when asked.
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        cache: GcnCache<B>,
        dz: B::View<'_>,
        need_d_in: bool,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        accumulate_bias_grad(params, self.bias, dz);
        let weights = cache.norm.weights();
        match cache.order {
            GcnOrder::AggregateFirst(agg) => {
                be.add_matmul_tn(be.view(&agg), dz, params.grad_mut(self.weight));
                if !need_d_in {
                    return None;
                }
                let d_agg = be.matmul_nt(dz, params.view(self.weight));
                Some(be.aggregate_transpose(g, transpose, be.view(&d_agg), weights))
            }
            GcnOrder::SparseProject(x) => {
                let d_proj = be.aggregate_transpose(g, transpose, dz, weights);
                let rows = be.sparse_dim(&x).0;
                be.add_spmm_tn(&x, rows, be.view(&d_proj), params.grad_mut(self.weight));
                need_d_in.then(|| be.matmul_nt(be.view(&d_proj), params.view(self.weight)))
            }
            GcnOrder::ProjectFirst(h_in) => {
                let h_in = h_in.expect(super::NOT_KEPT);
                let d_proj = be.aggregate_transpose(g, transpose, dz, weights);
                be.add_matmul_tn(
                    be.view(&h_in),
                    be.view(&d_proj),
                    params.grad_mut(self.weight),
                );
                need_d_in.then(|| be.matmul_nt(be.view(&d_proj), params.view(self.weight)))
            }
        }
    }
}

/// Source-node parallelism (SNP): pieces of the layer computed on the sources' owners, which
/// work on [`InputRows`] (`crate::exchange::partial`), on any backend. The normalisation is
/// all in the partial aggregation's edge weights (`dst[v]·src[u]`, the source factor folded in
/// by the source's owner, [`crate::exchange::partial::PartialAggregation::scale_sources`]), so
/// the pieces are the plain projection and the bias.
impl GcnConv {
    /// The projected source rows `x_u·W` without aggregation: SNP projects each source once on
    /// its owner, which sums them weighted there.
    pub(crate) fn project<B: Backend>(&self, params: &ParamStore<B>, x: &InputRows<B>) -> B::Mat {
        x.times(params.backend(), params.view(self.weight))
    }

    /// The backward of [`GcnConv::project`] for the weight: from `d_y` (one gradient row per
    /// source), `dW += xᵀ·d_y`.
    pub(crate) fn accumulate_weight_grad<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        x: &InputRows<B>,
        d_y: B::View<'_>,
    ) {
        let be = params.backend().clone();
        x.add_transposed_times(&be, d_y, params.grad_mut(self.weight));
    }

    /// `z += b` on the aggregated rows (SNP adds it where the destination's partial rows meet).
    pub(crate) fn add_bias<B: Backend>(&self, params: &ParamStore<B>, z: B::ViewMut<'_>) {
        add_bias(params, z, self.bias);
    }

    /// The backward of [`GcnConv::add_bias`]: `db += Σ dz`.
    pub(crate) fn accumulate_bias_grad<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        dz: B::View<'_>,
    ) {
        accumulate_bias_grad(params, self.bias, dz);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::aggregate::{aggregate, LazyTranspose};
    use crate::backend::cpu::aggregate::{aggregate_transpose, BlockTranspose, EdgeWeights};
    use crate::exchange::partial::destination_weights;
    use crate::sample::Block;
    use ndarray::Array2;

    /// SNP's pieces — projection, edge weights `dst[v]·src[u]` (the source factor folded into
    /// the weights as the owner does), bias — are the layer's forward and weight/bias
    /// gradients, with a self-loop and both destination-factor cases (all of `v`'s edges
    /// sampled, and some).
    #[test]
    fn snp_pieces_match_forward_and_backward() {
        // dst 0 (id 10) <- {11, 12}; dst 1 (id 11) <- {13}; then self-loops.
        let block = Block {
            num_dst: 2,
            src_nodes: vec![10, 11, 12, 13],
            indptr: vec![0, 2, 3],
            indices: vec![2, 3, 1],
        }
        .with_self_loops();
        let mut table = vec![1u32; 14];
        table[10] = 3; // both neighbours and the self-loop: standard GCN
        table[11] = 4; // 2 of 4 edges: scaled by D/d̂
        table[12] = 2;
        table[13] = 5;
        let mut params = ParamStore::new();
        let conv = GcnConv::new(&mut params, "g", 3, 2, InitKind::Glorot, 7);
        let bias = conv.bias.expect("GcnConv::new registers a bias");
        params.view_mut(bias).fill(0.25);
        let x = Array2::from_shape_fn((4, 3), |(i, j)| (i as f32 - 1.5) * 0.3 + j as f32 * 0.1);
        let (z, cache) = conv.forward(
            &params,
            &block,
            CowMat::Borrowed(x.view()),
            Some(&table),
            true,
        );

        let norm = GcnNorm::new(&block, Some(&table));
        let src = GcnNorm::source_factors(&block.src_nodes, &table);
        assert_eq!(src, norm.src);
        let mut w = destination_weights(&block, &norm.dst);
        for (w, &u) in w.iter_mut().zip(&block.indices) {
            *w *= src[u as usize];
        }
        let rows = InputRows::<Cpu>::Dense(x.clone());
        let y = conv.project(&params, &rows);
        let mut got = aggregate(&block, y.view(), EdgeWeights::PerEdge(&w));
        conv.add_bias(&params, got.view_mut());
        assert!(
            crate::backend::cpu::max_abs_diff(got.view(), z.view()) < 1e-6,
            "{got} vs {z}"
        );

        let dz = Array2::from_shape_fn((2, 2), |(i, j)| 1.0 - i as f32 + 0.5 * j as f32);
        let transpose = LazyTranspose::default();
        conv.backward(&mut params, &block, &transpose, cache, dz.view(), false);
        let (dw, db) = (
            params.grad(conv.weight).to_owned(),
            params.grad(bias).to_owned(),
        );
        params.zero_grads();
        conv.accumulate_bias_grad(&mut params, dz.view());
        let t = BlockTranspose::new(&block);
        let d_y = aggregate_transpose(&block, &t, dz.view(), EdgeWeights::PerEdge(&w));
        conv.accumulate_weight_grad(&mut params, &rows, d_y.view());
        assert!(crate::backend::cpu::max_abs_diff(params.grad(conv.weight), dw.view()) < 1e-6);
        assert!(crate::backend::cpu::max_abs_diff(params.grad(bias), db.view()) < 1e-6);
        assert!(dw.iter().any(|&g| g != 0.0), "a gradient that can differ");
    }
}
