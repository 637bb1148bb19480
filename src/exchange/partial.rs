//! Partial aggregation on the owners of the sources (APT's source-node parallelism, SNP).
//!
//! A rank that must compute the aggregation `out[v] = Σ_{e = (u→v)} w_e · y_u` for the
//! destinations of a block does not fetch the source rows `y_u`. It sends every edge (source id
//! and weight) to the owner of its source. For a destination `v` and a rank `r` owning some of
//! `v`'s sources, the pair `(v, r)` is a *virtual destination*: `r` sums
//! `p(v, r) = Σ_{u→v, owner(u) = r} w_e · y_u` over rows it computes from its own vertices, and
//! sends `p(v, r)` back, where `out[v] = Σ_r p(v, r)`. What travels back is one row of `y`'s
//! width per virtual destination — for a first layer, the hidden width instead of the feature
//! width.
//!
//! Any aggregator that is a weighted sum over edges fits: the requester chooses each edge's
//! weight from what it knows about the destination (mean: `1/deg(v)`, [`mean_weights`]; GCN's
//! `sqrt(D_v)/d̂_v`), and the owner multiplies in a factor that depends on the source only
//! (GCN's `1/sqrt(D_u)`, [`PartialAggregation::scale_sources`]).
//!
//! The owner's sums are an aggregation over a bipartite CSR from its sources to the received
//! virtual destinations, kept as a [`Block`] on the backend with per-edge weights: the rows of
//! `y` never leave the backend they were computed on; only the partial rows travel, through
//! [`alltoallv_rows_on`] (staged through host memory, or device pointers to a CUDA-aware MPI).
//!
//! One plan, two directions (ARCHITECTURE invariant 6): backward sends each virtual
//! destination the gradient of its destination's row, and the owner turns it into the gradient
//! of its rows of `y` (`Wᵀ·d`, the transposed aggregation).

use super::plan::alltoallv_rows_on;
use crate::backend::{Backend, EdgeWeights};
use crate::comm::Group;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::sample::Block;

/// The mean aggregator's edge weights: `1/in_degree(v)` for every edge into `v`, in the
/// block's CSR order.
pub fn mean_weights(block: &Block) -> Vec<f32> {
    let mut w = Vec::with_capacity(block.num_edges());
    for i in 0..block.num_dst {
        let d = block.in_degree(i);
        w.extend(std::iter::repeat_n(1.0 / d as f32, d));
    }
    w
}

/// Edge weights that depend on the destination only: `factors[v]` for every edge into `v`, in
/// the block's CSR order (GCN: the destination factors of [`crate::backend::cpu::aggregate::GcnNorm`]).
pub fn destination_weights(block: &Block, factors: &[f32]) -> Vec<f32> {
    assert_eq!(factors.len(), block.num_dst, "one factor per destination");
    let mut w = Vec::with_capacity(block.num_edges());
    for (i, &f) in factors.iter().enumerate() {
        w.extend(std::iter::repeat_n(f, block.in_degree(i)));
    }
    w
}

/// The host half of a [`PartialAggregation`]: the edges routed to their sources' owners and,
/// as source owner, the bipartite CSR of what the other ranks sent, before a backend holds it.
/// It reads no backend, so a prefetch worker builds it over a communicator of its own; the
/// main thread then puts it on the backend ([`PartialPlan::on`]).
#[derive(Debug)]
pub struct PartialPlan {
    routes: Routes,
    /// Owner: received virtual destinations (destinations, in receive order) × `sources`
    /// (columns), duplicate edges merged. Not a layer's block: its destinations are not among
    /// its sources; only the aggregation and its transpose read it.
    weights: Block,
}

/// Who sends what to whom, both as requester (the destinations of the block are this rank's)
/// and as source owner (for the virtual destinations other ranks, and this one, sent here).
#[derive(Debug)]
struct Routes {
    /// Requester: destinations of the block (rows of [`PartialAggregation::forward`]'s result).
    num_dst: usize,
    /// Requester: the destination row of every virtual destination sent, in send order
    /// (grouped by source owner in rank order, then by destination).
    vdst_row: Vec<u32>,
    /// Requester: virtual destinations sent to each rank.
    sent: Vec<usize>,
    /// Owner: the distinct own vertices that some received edge names as source, increasing;
    /// the rows of `y` this rank provides.
    sources: Vec<NodeId>,
    /// Owner: one weight per edge of the weights matrix, in its CSR order (duplicate edges
    /// summed).
    values: Vec<f32>,
    /// Owner: virtual destinations received from each rank.
    received: Vec<usize>,
}

/// The plan of one block's partial aggregation ([`PartialPlan`]), its owner-side sums on
/// backend `B`.
#[derive(Debug)]
pub struct PartialAggregation<B: Backend> {
    routes: Routes,
    /// [`PartialPlan`]'s weights matrix, on the backend.
    weights: B::Graph,
    /// Built on first use by the backward.
    transpose: B::Transpose,
}

impl PartialPlan {
    /// Route the edges of `block` (this rank's destinations; sources with any owner), with
    /// one weight per edge in CSR order, to the owners of their sources. Collective over
    /// `group` (any thread's): every rank calls it, possibly with an empty block.
    pub fn new(group: &Group, offsets: &[u64], block: &Block, edge_weights: &[f32]) -> PartialPlan {
        assert_eq!(edge_weights.len(), block.num_edges(), "one weight per edge");
        let ranks = group.size();
        let src_owner: Vec<u32> = block
            .src_nodes
            .iter()
            .map(|&u| owner_of(offsets, u as u64) as u32)
            .collect();
        // Counting sort of the edges by source owner; within an owner the edges stay in CSR
        // order, so the edges of one destination are contiguous (one virtual destination).
        let mut edges_to = vec![0usize; ranks];
        for &s in &block.indices {
            edges_to[src_owner[s as usize] as usize] += 1;
        }
        let mut fill: Vec<usize> = edges_to
            .iter()
            .scan(0, |acc, &c| {
                let s = *acc;
                *acc += c;
                Some(s)
            })
            .collect();
        let e = block.num_edges();
        let (mut ids, mut weights, mut dst) = (vec![0 as NodeId; e], vec![0f32; e], vec![0u32; e]);
        for i in 0..block.num_dst {
            let span = block.indptr[i]..block.indptr[i + 1];
            for (&s, &w) in block.indices[span.clone()].iter().zip(&edge_weights[span]) {
                let o = src_owner[s as usize] as usize;
                let p = fill[o];
                fill[o] += 1;
                ids[p] = block.src_nodes[s as usize];
                weights[p] = w;
                dst[p] = i as u32;
            }
        }
        let mut vdst_row = Vec::new();
        let mut degrees: Vec<u32> = Vec::new();
        let mut sent = vec![0usize; ranks];
        let mut start = 0;
        for (o, &count) in edges_to.iter().enumerate() {
            let end = start + count;
            let mut k = start;
            while k < end {
                let run = dst[k..end].iter().take_while(|&&d| d == dst[k]).count();
                vdst_row.push(dst[k]);
                degrees.push(run as u32);
                sent[o] += 1;
                k += run;
            }
            start = end;
        }
        let (in_degrees, received) = group.alltoallv("snp_vdsts", &degrees, &sent);
        // The edges from each rank are the sum of its destinations' degrees.
        let mut edges_from = Vec::with_capacity(ranks);
        let mut at = 0;
        for &n in &received {
            edges_from.push(in_degrees[at..at + n].iter().map(|&d| d as usize).sum());
            at += n;
        }
        let in_ids = group.alltoallv_known("snp_edge_ids", &ids, &edges_to, &edges_from);
        let in_weights =
            group.alltoallv_known("snp_edge_weights", &weights, &edges_to, &edges_from);
        let first = offsets[group.rank()];
        let local = (offsets[group.rank() + 1] - first) as usize;
        let sources = OwnSources::of(first, local, &in_ids);
        let (weights, values) = weights_matrix(&in_degrees, &in_ids, &in_weights, &sources);
        PartialPlan {
            routes: Routes {
                num_dst: block.num_dst,
                vdst_row,
                sent,
                sources: sources.ids,
                values,
                received,
            },
            weights,
        }
    }

    /// Multiply every received edge's weight by `factors[c]`, `c` its source's row in
    /// [`PartialPlan::sources`] (GCN's `1/sqrt(D_u)`: the owner knows `D_u`), so the partial
    /// sums are `Σ w·f(u)·y_u` without scaling the rows of `y`.
    pub fn scale_sources(&mut self, factors: &[f32]) {
        assert_eq!(
            factors.len(),
            self.routes.sources.len(),
            "one factor per source"
        );
        for (w, &c) in self.routes.values.iter_mut().zip(&self.weights.indices) {
            *w *= factors[c as usize];
        }
    }

    /// The own vertices whose rows of `y` the aggregation needs, in row order.
    pub fn sources(&self) -> &[NodeId] {
        &self.routes.sources
    }

    /// The plan with its weights matrix on backend `be`.
    pub fn on<B: Backend>(self, be: &B) -> PartialAggregation<B> {
        PartialAggregation {
            routes: self.routes,
            weights: be.graph(self.weights),
            transpose: B::Transpose::default(),
        }
    }
}

impl<B: Backend> PartialAggregation<B> {
    /// The own vertices whose rows of `y` [`PartialAggregation::forward`] needs, in row order.
    pub fn sources(&self) -> &[NodeId] {
        &self.routes.sources
    }

    /// Virtual destinations this rank sends (as requester) and receives (as source owner).
    pub fn volume(&self, be: &B) -> (usize, usize) {
        (self.routes.vdst_row.len(), be.block(&self.weights).num_dst)
    }

    /// `y` holds one row per [`PartialAggregation::sources`]; returns the aggregation for the
    /// block's destinations (`num_dst` rows): each owner sums its weighted partial rows, the
    /// partial rows travel back and add up per destination (in rank order: a fixed summation
    /// order). Destinations without edges get zeros. Collective.
    pub fn forward(&self, group: &Group, be: &B, y: B::View<'_>) -> B::Mat {
        let partial = self.partial_sums(be, y);
        self.gather_sums(group, be, partial)
    }

    /// The compute of [`PartialAggregation::forward`]: this rank's weighted partial sums, one
    /// row per virtual destination it serves as a source owner. Local.
    pub fn partial_sums(&self, be: &B, y: B::View<'_>) -> B::Mat {
        let rows = be.dim(y).0;
        assert_eq!(rows, self.routes.sources.len(), "one row per source");
        be.aggregate(&self.weights, y, EdgeWeights::PerEdge(&self.routes.values))
    }

    /// The exchange of [`PartialAggregation::forward`]: the partial sums to their requesters,
    /// added up per destination there. Collective.
    pub fn gather_sums(&self, group: &Group, be: &B, partial: B::Mat) -> B::Mat {
        let r = &self.routes;
        let cols = be.mat_dim(&partial).1;
        let back = alltoallv_rows_on(group, be, "snp_partials", partial, &r.received, &r.sent);
        let mut out = be.zeros(r.num_dst, cols);
        be.scatter_add_rows(be.view_mut(&mut out), &r.vdst_row, be.view(&back));
        out
    }

    /// The reverse of [`PartialAggregation::forward`]: from the gradient of its result
    /// (`num_dst` rows), the gradient of `y` (one row per source). Collective.
    pub fn backward(&self, group: &Group, be: &B, d_out: B::View<'_>) -> B::Mat {
        let d_partial = self.scatter_grads(group, be, d_out);
        self.partial_sums_backward(be, d_partial)
    }

    /// The exchange of [`PartialAggregation::backward`]: each destination's gradient to the
    /// owners that sent it partial sums, one row per virtual destination they serve.
    /// Collective.
    pub fn scatter_grads(&self, group: &Group, be: &B, d_out: B::View<'_>) -> B::Mat {
        let r = &self.routes;
        assert_eq!(
            be.dim(d_out).0,
            r.num_dst,
            "one gradient row per destination"
        );
        let send = be.gather_rows(d_out, &r.vdst_row);
        alltoallv_rows_on(group, be, "snp_partial_grads", send, &r.sent, &r.received)
    }

    /// The compute of [`PartialAggregation::backward`]: the gradient of `y` from that of the
    /// partial sums. Local.
    pub fn partial_sums_backward(&self, be: &B, d_partial: B::Mat) -> B::Mat {
        be.aggregate_transpose(
            &self.weights,
            &self.transpose,
            be.view(&d_partial),
            EdgeWeights::PerEdge(&self.routes.values),
        )
    }
}

/// The distinct own vertices some received edge names, increasing, and each one's column:
/// a bit per own vertex and a count of the set bits before every 64-vertex word. Sorting the
/// received ids and a binary search per edge took most of SNP's plan (its build phase ran
/// 2-4× GDP's on the 2-core VM); this is one pass over the edges and one over the words.
struct OwnSources {
    first: u64,
    bits: Vec<u64>,
    before: Vec<u32>,
    ids: Vec<NodeId>,
}

impl OwnSources {
    /// The sources among `ids`, all owned: `first..first + local`.
    fn of(first: u64, local: usize, ids: &[NodeId]) -> OwnSources {
        let mut bits = vec![0u64; local.div_ceil(64)];
        for &u in ids {
            let i = (u as u64 - first) as usize;
            bits[i / 64] |= 1 << (i % 64);
        }
        let mut before = Vec::with_capacity(bits.len());
        let mut sources = Vec::new();
        for (w, &word) in bits.iter().enumerate() {
            before.push(sources.len() as u32);
            let mut rest = word;
            while rest != 0 {
                let b = rest.trailing_zeros() as u64;
                sources.push((first + 64 * w as u64 + b) as NodeId);
                rest &= rest - 1;
            }
        }
        OwnSources {
            first,
            bits,
            before,
            ids: sources,
        }
    }

    /// The column of source `u` (one of the ids it was built from).
    fn column(&self, u: NodeId) -> u32 {
        let i = (u as u64 - self.first) as usize;
        let (w, b) = (i / 64, i % 64);
        debug_assert!(self.bits[w] >> b & 1 == 1, "every id is a source");
        self.before[w] + (self.bits[w] & ((1u64 << b) - 1)).count_ones()
    }
}

/// The received virtual destinations as a bipartite CSR over `sources` (increasing,
/// distinct) and its weights: destination `i` has the `degrees[i]` next edges, sources
/// increasing, duplicate edges summed.
fn weights_matrix(
    degrees: &[u32],
    ids: &[NodeId],
    weights: &[f32],
    sources: &OwnSources,
) -> (Block, Vec<f32>) {
    let mut indptr = Vec::with_capacity(degrees.len() + 1);
    let mut indices = Vec::with_capacity(ids.len());
    let mut values = Vec::with_capacity(ids.len());
    indptr.push(0);
    let mut row: Vec<(u32, f32)> = Vec::new();
    let mut e = 0;
    for &d in degrees {
        let span = e..e + d as usize;
        e = span.end;
        row.clear();
        row.extend(
            ids[span.clone()]
                .iter()
                .zip(&weights[span])
                .map(|(&u, &w)| (sources.column(u), w)),
        );
        row.sort_unstable_by_key(|&(c, _)| c);
        let first = indices.len();
        for &(c, w) in &row {
            if indices.len() > first && indices.last() == Some(&c) {
                *values.last_mut().expect("same length as indices") += w;
            } else {
                indices.push(c);
                values.push(w);
            }
        }
        indptr.push(indices.len());
    }
    let block = Block {
        num_dst: degrees.len(),
        src_nodes: sources.ids.clone(),
        indptr,
        indices,
    };
    (block, values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::aggregate::{aggregate, aggregate_transpose, BlockTranspose};
    use crate::backend::Cpu;
    use crate::comm::World;
    use ndarray::array;

    fn block() -> Block {
        Block::small_example()
    }

    #[test]
    fn mean_weights_are_inverse_in_degrees() {
        assert_eq!(
            mean_weights(&block()),
            vec![1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.5, 0.5]
        );
    }

    #[test]
    fn destination_weights_repeat_per_edge() {
        assert_eq!(
            destination_weights(&block(), &[2.0, 3.0, 5.0]),
            vec![2.0, 2.0, 2.0, 5.0, 5.0]
        );
    }

    #[test]
    fn duplicate_edges_merge_and_columns_increase() {
        let (m, values) = weights_matrix(
            &[3, 0, 2],
            &[11, 11, 10, 12, 10],
            &[1., 2., 4., 8., 16.],
            &OwnSources::of(0, 100, &[11, 11, 10, 12, 10]),
        );
        assert_eq!(m.num_dst, 3);
        assert_eq!(m.src_nodes, vec![10, 11, 12]);
        assert_eq!(m.indptr, vec![0, 2, 2, 4]);
        assert_eq!(m.indices, vec![0, 1, 0, 2]);
        assert_eq!(values, vec![4., 3., 16., 8.]);
    }

    #[test]
    fn own_sources_are_distinct_increasing_and_columns_count_those_before() {
        // Ids of the vertices 1000.. owned here, across word boundaries, repeated.
        let ids = [1130, 1064, 1000, 1063, 1064, 1199, 1000];
        let s = OwnSources::of(1000, 200, &ids);
        assert_eq!(s.ids, vec![1000, 1063, 1064, 1130, 1199]);
        for (c, &u) in s.ids.iter().enumerate() {
            assert_eq!(s.column(u), c as u32, "column of {u}");
        }
        assert!(OwnSources::of(1000, 200, &[]).ids.is_empty());
    }

    /// On one rank the plan is the block's own weighted aggregation and its transpose; source
    /// factors multiply the terms of their sources.
    #[test]
    fn one_rank_matches_the_block_aggregation() {
        let world = World::solo();
        let be = Cpu;
        let b = block();
        let w = mean_weights(&b);
        let plan = PartialPlan::new(&world, &[0, 100], &b, &w).on(&be);
        assert_eq!(plan.sources(), &[10, 11, 12]);
        assert_eq!(plan.volume(&be), (2, 2));
        let x = array![[1.0f32, 2.0], [4.0, 8.0], [16.0, 32.0], [64.0, 128.0]];
        // Rows of the sources the plan asks for (ids 10..=12 are rows 0..=2 of x).
        let y = x.slice(ndarray::s![..3, ..]);
        let got = plan.forward(&world, &be, y);
        let want = aggregate(&b, x.view(), EdgeWeights::Mean);
        assert!(
            crate::backend::cpu::max_abs_diff(got.view(), want.view()) < 1e-6,
            "{got} vs {want}"
        );
        let d = array![[1.0f32, -1.0], [5.0, 5.0], [2.0, 0.5]];
        let got = plan.backward(&world, &be, d.view());
        let want = aggregate_transpose(&b, &BlockTranspose::new(&b), d.view(), EdgeWeights::Mean);
        assert!(
            crate::backend::cpu::max_abs_diff(got.view(), want.slice(ndarray::s![..3, ..])) < 1e-6
        );
        assert_eq!(want.row(3), array![0.0f32, 0.0]);
        // Halving source 11 (row 1) halves its terms: dst 0 = (2·x11/2 + x12)/3.
        let mut scaled = PartialPlan::new(&world, &[0, 100], &b, &w);
        scaled.scale_sources(&[1.0, 0.5, 1.0]);
        let got = scaled.on(&be).forward(&world, &be, y);
        let expect = (&x.row(1) + &x.row(2)) / 3.0;
        assert!(
            got.row(0)
                .iter()
                .zip(&expect)
                .all(|(a, b)| (a - b).abs() < 1e-6),
            "{got}"
        );
    }
}
