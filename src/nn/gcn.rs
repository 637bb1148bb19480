//! GCN convolution: `h_v = (D_v / d̂_v) · Σ_{u → v} h_u·W / sqrt(D_v · D_u) + b`, where `D` is
//! the degree in the whole graph (the caller passes the table, so the result does not depend on
//! how edges are split over ranks) and `d̂_v` is `v`'s in-degree inside the block: with all
//! edges, standard GCN; with `d̂_v` sampled edges, an unbiased estimate of it. Without a table,
//! DGL's in-block convention ([`GcnNorm::new`]). Self-loops are the caller's choice
//! (`Block::with_self_loops`, and +1 in the degree table).
//!
//! Like SAGE, it aggregates first or projects first, whichever costs fewer multiply-adds for
//! the block's shape.

use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis, Zip};

use super::init::glorot_uniform;
use super::linear::{accumulate_bias_grad, add_bias};
use super::params::ParamStore;
use crate::backend::cpu::rows::InputRows;
use crate::backend::{Backend, CowMat, Cpu, GcnNorm};
use crate::sample::Block;

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
pub struct GcnCache<B: Backend = Cpu> {
    /// The normalisation factors (per source and per destination, not per edge).
    norm: GcnNorm,
    order: GcnOrder<B>,
}

#[derive(Debug)]
enum GcnOrder<B: Backend> {
    /// `agg = Â·h_in` was projected: keep `agg`.
    AggregateFirst(B::Mat),
    /// `h_in·W` was aggregated: keep `h_in`.
    ProjectFirst(B::Mat),
    /// Sparse input rows were projected (over their non-zeros) and then aggregated.
    SparseProject(B::Sparse),
}

impl GcnConv {
    /// Register `{prefix}.weight` (`in × out`, Glorot) and `{prefix}.bias`.
    pub fn new(
        params: &mut ParamStore<Cpu>,
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
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        src_degrees: Option<&[u32]>,
    ) -> (B::Mat, GcnCache<B>) {
        let be = params.backend();
        let block = be.block(g);
        let norm = GcnNorm::new(block, src_degrees);
        let w = params.view(self.weight);
        let (z, order) = if self.aggregate_first(block) {
            // The product adds the bias as it stores its output.
            let agg = be.aggregate(g, h_in.view(be), norm.weights());
            let bias = Some(params.view(self.bias));
            let z = be
                .matmul_epilogue(None, be.view(&agg), w, bias, false, None)
                .0;
            (z, GcnOrder::AggregateFirst(agg))
        } else {
            let projected = be.matmul(h_in.view(be), w);
            let mut z = be.aggregate(g, be.view(&projected), norm.weights());
            add_bias(params, be.view_mut(&mut z), self.bias);
            (z, GcnOrder::ProjectFirst(h_in.into_owned(be)))
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

/// Source-node parallelism (SNP) on the CPU: pieces of the layer computed on the sources'
/// owners, which work on [`InputRows`] (`crate::exchange::partial`).
impl GcnConv {
    /// The projected source rows `y_u = src[u]·(x_u·W)` without aggregation, `src` the
    /// per-source factors (`1/sqrt(D_u)`, [`GcnNorm::source_factors`]): SNP projects each source
    /// once on its owner, which sums the rows weighted by the destination factors there.
    pub(crate) fn project_sources(
        &self,
        params: &ParamStore<Cpu>,
        x: &InputRows,
        src: &[f32],
    ) -> Array2<f32> {
        let mut y = x.times(params.view(self.weight));
        scale_rows(y.view_mut(), src);
        y
    }

    /// The backward of [`GcnConv::project_sources`] for the weight: from `d_y` (one gradient
    /// row per source), `dW += xᵀ·(src ⊙ d_y)`.
    pub(crate) fn accumulate_source_grad(
        &self,
        params: &mut ParamStore<Cpu>,
        x: &InputRows,
        src: &[f32],
        mut d_y: Array2<f32>,
    ) {
        scale_rows(d_y.view_mut(), src);
        x.add_transposed_times(d_y.view(), params.grad_mut(self.weight));
    }

    /// `z += b` on the aggregated rows (SNP adds it where the destination's partial rows meet).
    pub(crate) fn add_bias(&self, params: &ParamStore<Cpu>, z: ArrayViewMut2<f32>) {
        add_bias(params, z, self.bias);
    }

    /// The backward of [`GcnConv::add_bias`]: `db += Σ dz`.
    pub(crate) fn accumulate_bias_grad(&self, params: &mut ParamStore<Cpu>, dz: ArrayView2<f32>) {
        accumulate_bias_grad(params, self.bias, dz);
    }
}

/// `y[r] *= f[r]` for every row (rows in parallel: one multiply per element).
fn scale_rows(mut y: ArrayViewMut2<f32>, f: &[f32]) {
    assert_eq!(y.nrows(), f.len(), "gcn: one factor per row");
    Zip::from(y.axis_iter_mut(Axis(0)))
        .and(f)
        .par_for_each(|mut row, &c| row *= c);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::aggregate::{aggregate, LazyTranspose};
    use crate::backend::cpu::aggregate::{aggregate_transpose, BlockTranspose, EdgeWeights};
    use crate::exchange::partial::destination_weights;

    /// SNP's pieces — scaled projection, destination weights per edge, bias — are the layer's
    /// forward and weight/bias gradients, with a self-loop and both destination-factor cases
    /// (all of `v`'s edges sampled, and some).
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
        let conv = GcnConv::new(&mut params, "g", 3, 2, 7);
        params.view_mut(conv.bias).fill(0.25);
        let x = Array2::from_shape_fn((4, 3), |(i, j)| (i as f32 - 1.5) * 0.3 + j as f32 * 0.1);
        let (z, cache) = conv.forward(&params, &block, CowMat::Borrowed(x.view()), Some(&table));

        let norm = GcnNorm::new(&block, Some(&table));
        let src = GcnNorm::source_factors(&block.src_nodes, &table);
        assert_eq!(src, norm.src);
        let w = destination_weights(&block, &norm.dst);
        let rows = InputRows::Dense(x.clone());
        let y = conv.project_sources(&params, &rows, &src);
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
            params.grad(conv.bias).to_owned(),
        );
        params.zero_grads();
        conv.accumulate_bias_grad(&mut params, dz.view());
        let t = BlockTranspose::new(&block);
        let d_y = aggregate_transpose(&block, &t, dz.view(), EdgeWeights::PerEdge(&w));
        conv.accumulate_source_grad(&mut params, &rows, &src, d_y);
        assert!(crate::backend::cpu::max_abs_diff(params.grad(conv.weight), dw.view()) < 1e-6);
        assert!(crate::backend::cpu::max_abs_diff(params.grad(conv.bias), db.view()) < 1e-6);
        assert!(dw.iter().any(|&g| g != 0.0), "a gradient that can differ");
    }
}
