//! CSR aggregation over a [`Block`] and its transpose.
//!
//! Forward: destination `i` combines the source rows `block.in_edges(i)`, each with an edge
//! weight (1 for sum, `1/deg(i)` for mean, or a per-edge coefficient such as GCN's symmetric
//! normalisation). Backward: every source receives the weighted gradients of the destinations
//! it feeds. That scatter is done without atomics, as a parallel gather over a transposed CSR
//! ([`BlockTranspose`]) built once per block.

use std::sync::OnceLock;

use ndarray::{Array2, ArrayView2, CowArray, Ix2};

use super::dropout::KeptBits;
use super::gather::{add_assign, axpy};
use super::simd::simd_kernel;
use crate::sample::Block;

/// How each edge is weighted in an aggregation.
#[derive(Clone, Copy, Debug)]
pub enum EdgeWeights<'a> {
    /// Weight 1: `out[i] = Σ x[src]`.
    Sum,
    /// Weight `1/in_degree(i)`; destinations without in-edges get zeros.
    Mean,
    /// One weight per edge, in the block's CSR order.
    PerEdge(&'a [f32]),
    /// The weight of edge `u → i` is `dst[i] · src[u]` (GCN's symmetric normalisation, see
    /// [`GcnNorm`]): each destination sums `src[u]·x[u]` over its edges and scales the sum by
    /// `dst[i]` once. No per-edge array is read, so the kernel touches only the sources.
    Factored { src: &'a [f32], dst: &'a [f32] },
}

/// The edges of a block grouped by source: the edges leaving source `u` are positions
/// `indptr[u]..indptr[u + 1]` of `dst` (their destination) and `edge` (their index in the
/// block's CSR order), in increasing edge order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTranspose {
    pub indptr: Vec<usize>,
    pub dst: Vec<u32>,
    pub edge: Vec<u32>,
}

impl BlockTranspose {
    /// Build by a counting sort of the edges by source (O(edges + sources)).
    pub fn new(block: &Block) -> BlockTranspose {
        BlockTranspose::of_csr(block.num_src(), &block.indptr, &block.indices)
    }

    /// The transpose of any CSR (`indptr` over its rows, `indices` its columns, `num_src`
    /// columns): entries grouped by column, those of a column in increasing entry order —
    /// hence increasing row, so the entries of the first `r` rows are a prefix of each group.
    ///
    /// # Panics
    /// If there are `2^32` entries or rows or more.
    pub fn of_csr(num_src: usize, indptr: &[usize], indices: &[u32]) -> BlockTranspose {
        let num_dst = indptr.len().saturating_sub(1);
        assert!(
            indices.len() <= u32::MAX as usize && num_dst <= u32::MAX as usize,
            "block has more than 2^32 edges"
        );
        let ns = num_src;
        let mut indptr_t = vec![0usize; ns + 1];
        for &u in indices {
            indptr_t[u as usize + 1] += 1;
        }
        for u in 0..ns {
            indptr_t[u + 1] += indptr_t[u];
        }
        // One pass over the CSR places every edge and its destination (edges of a source in
        // increasing edge order).
        let mut fill = indptr_t[..ns].to_vec();
        let mut dst = vec![0u32; indices.len()];
        let mut edge = vec![0u32; indices.len()];
        for i in 0..num_dst {
            let span = indptr[i]..indptr[i + 1];
            for (e, &u) in span.clone().zip(&indices[span]) {
                let at = fill[u as usize];
                fill[u as usize] += 1;
                dst[at] = i as u32;
                edge[at] = e as u32;
            }
        }
        BlockTranspose {
            indptr: indptr_t,
            dst,
            edge,
        }
    }

    /// Out-degree of source `u` inside the block.
    #[inline]
    pub fn out_degree(&self, u: usize) -> usize {
        self.indptr[u + 1] - self.indptr[u]
    }
}

/// A transpose built on first use and then kept: full-batch training passes the same block to
/// every layer, and layers whose backward needs no transpose never build one.
#[derive(Debug, Default)]
pub struct LazyTranspose(OnceLock<BlockTranspose>);

impl LazyTranspose {
    /// One built already (of the block every later call passes).
    pub fn built(t: BlockTranspose) -> LazyTranspose {
        LazyTranspose(OnceLock::from(t))
    }

    /// Whether it was built (or given) already.
    pub fn is_built(&self) -> bool {
        self.0.get().is_some()
    }

    /// The transpose of `block` (which must be the same block at every call).
    pub fn get(&self, block: &Block) -> &BlockTranspose {
        self.0.get_or_init(|| BlockTranspose::new(block))
    }
}

/// Dispatch a row kernel on narrow rows (up to 16 columns) to its fixed-width version, whose
/// accumulator stays in registers; wider rows fall through to the generic loop. Both do the
/// same operations in the same order, so the results are bitwise equal.
macro_rules! narrow_rows {
    ($cols:expr, $fixed:ident, ($($arg:expr),*)) => {
        match $cols {
            1 => return $fixed::<1>($($arg),*),
            2 => return $fixed::<2>($($arg),*),
            3 => return $fixed::<3>($($arg),*),
            4 => return $fixed::<4>($($arg),*),
            5 => return $fixed::<5>($($arg),*),
            6 => return $fixed::<6>($($arg),*),
            7 => return $fixed::<7>($($arg),*),
            8 => return $fixed::<8>($($arg),*),
            9 => return $fixed::<9>($($arg),*),
            10 => return $fixed::<10>($($arg),*),
            11 => return $fixed::<11>($($arg),*),
            12 => return $fixed::<12>($($arg),*),
            13 => return $fixed::<13>($($arg),*),
            14 => return $fixed::<14>($($arg),*),
            15 => return $fixed::<15>($($arg),*),
            16 => return $fixed::<16>($($arg),*),
            _ => {}
        }
    };
}

/// `Σ_e w_e · x[u_e]` over `(u_e, w_e)`, then the optional factor, into `row` (`C` columns);
/// row `u` of `xs` starts at `u · stride`.
#[inline(always)]
fn sum_rows_fixed<const C: usize>(
    xs: &[f32],
    stride: usize,
    edges: impl Iterator<Item = (usize, f32)>,
    scale: Option<f32>,
    row: &mut [f32],
) {
    let mut acc = [0f32; C];
    for (u, w) in edges {
        let x: &[f32; C] = xs[u * stride..u * stride + C].try_into().expect("C floats");
        for c in 0..C {
            acc[c] += w * x[c];
        }
    }
    if let Some(s) = scale {
        acc.iter_mut().for_each(|a| *a *= s);
    }
    row.copy_from_slice(&acc);
}

/// The weight of edge `e` (source `u`) into a destination whose uniform weight is `row_weight`.
#[inline(always)]
fn edge_weight(weights: EdgeWeights<'_>, e: usize, u: usize, row_weight: f32) -> f32 {
    match weights {
        EdgeWeights::PerEdge(w) => w[e],
        EdgeWeights::Factored { src, .. } => src[u],
        _ => row_weight,
    }
}

/// `1/in_degree` for the mean, 1 otherwise (computed as the generic loop does).
#[inline(always)]
fn uniform_weight(weights: EdgeWeights<'_>, degree: usize) -> f32 {
    match weights {
        EdgeWeights::Mean => 1.0 / degree as f32,
        _ => 1.0,
    }
}

/// [`aggregate_row`] for rows of exactly `C` columns.
#[inline(always)]
fn aggregate_row_fixed<const C: usize>(
    block: &Block,
    xs: &[f32],
    weights: EdgeWeights<'_>,
    i: usize,
    row: &mut [f32],
) {
    let edges = block.indptr[i]..block.indptr[i + 1];
    let row_weight = uniform_weight(weights, edges.len());
    let scale = match weights {
        EdgeWeights::Factored { dst, .. } => Some(dst[i]),
        _ => None,
    };
    let pairs = edges.map(|e| {
        let u = block.indices[e] as usize;
        (u, edge_weight(weights, e, u, row_weight))
    });
    sum_rows_fixed::<C>(xs, C, pairs, scale, row);
}

simd_kernel! {
    /// `row = Σ_{e ∈ in_edges(i)} w_e · x[src_e]` (`row` starts at zero), where `xs` holds
    /// rows of `row.len()` floats.
    fn aggregate_row(block: &Block, xs: &[f32], weights: EdgeWeights<'_>, i: usize, row: &mut [f32]) {
        let cols = row.len();
        narrow_rows!(cols, aggregate_row_fixed, (block, xs, weights, i, row));
        let edges = block.indptr[i]..block.indptr[i + 1];
        // The same weight for every edge of the row unless per-edge (computed as before).
        let row_weight = uniform_weight(weights, edges.len());
        let prefetch = xs.len() > PREFETCH_MIN;
        let ahead = prefetch_edges(cols);
        for e in edges.clone() {
            // A far source row is a cache miss: start loading it a few edges ahead.
            // Past the row's last edge the next row's sources, handled next, are prefetched.
            if prefetch && e + ahead < block.indices.len() {
                prefetch_row(xs, block.indices[e + ahead] as usize * cols, cols);
            }
            let u = block.indices[e] as usize;
            let w = edge_weight(weights, e, u, row_weight);
            axpy(w, &xs[u * cols..(u + 1) * cols], row);
        }
        if let EdgeWeights::Factored { dst, .. } = weights {
            let d = dst[i];
            row.iter_mut().for_each(|r| *r *= d);
        }
    }
}

/// The weight of the `k`-th transposed edge (to destination `v`).
#[inline(always)]
fn source_weight(bt: &BlockTranspose, weights: SourceWeights<'_>, k: usize, v: usize) -> f32 {
    match weights {
        SourceWeights::One => 1.0,
        SourceWeights::PerDst(w) | SourceWeights::Factored { dst: w, .. } => w[v],
        SourceWeights::PerEdge(w) => w[bt.edge[k] as usize],
    }
}

/// [`aggregate_transpose_row`] for rows of exactly `C` columns.
#[inline(always)]
fn aggregate_transpose_row_fixed<const C: usize>(
    bt: &BlockTranspose,
    ds: &[f32],
    stride: usize,
    weights: SourceWeights<'_>,
    u: usize,
    row: &mut [f32],
) {
    let scale = match weights {
        SourceWeights::Factored { src, .. } => Some(src[u]),
        _ => None,
    };
    let pairs = (bt.indptr[u]..bt.indptr[u + 1]).map(|k| {
        let v = bt.dst[k] as usize;
        (v, source_weight(bt, weights, k, v))
    });
    sum_rows_fixed::<C>(ds, stride, pairs, scale, row);
}

simd_kernel! {
    /// `row = Σ_{e: src_e = u} w_e · dy[dst_e]` (`row` starts at zero), where row `v` of `dy`
    /// is `ds[v·stride..]`.
    fn aggregate_transpose_row(
        bt: &BlockTranspose,
        ds: &[f32],
        stride: usize,
        weights: SourceWeights<'_>,
        u: usize,
        row: &mut [f32],
    ) {
        let cols = row.len();
        narrow_rows!(cols, aggregate_transpose_row_fixed, (bt, ds, stride, weights, u, row));
        let span = bt.indptr[u]..bt.indptr[u + 1];
        let prefetch = ds.len() > PREFETCH_MIN;
        let ahead = prefetch_edges(cols);
        for k in span.clone() {
            if prefetch && k + ahead < bt.dst.len() {
                prefetch_row(ds, bt.dst[k + ahead] as usize * stride, cols);
            }
            let v = bt.dst[k] as usize;
            let start = v * stride;
            axpy(source_weight(bt, weights, k, v), &ds[start..start + cols], row);
        }
        if let SourceWeights::Factored { src, .. } = weights {
            let s = src[u];
            row.iter_mut().for_each(|r| *r *= s);
        }
    }
}

/// [`EdgeWeights`] as the transposed aggregation reads them.
#[derive(Clone, Copy)]
enum SourceWeights<'a> {
    One,
    /// `1/in_degree` of each destination, computed once per call (the same value
    /// [`EdgeWeights::Mean`] gives).
    PerDst(&'a [f32]),
    PerEdge(&'a [f32]),
    /// `Σ_v dst[v]·dy[v]` over the source's edges, scaled by `src[u]` once.
    Factored {
        src: &'a [f32],
        dst: &'a [f32],
    },
}

/// Matrices smaller than this (floats) stay in cache: no prefetching.
const PREFETCH_MIN: usize = 1 << 18;

/// How many cache lines of source rows are kept in flight ahead of the edge being added: the
/// prefetch distance in edges is this over the row's lines, within
/// [`PREFETCH_EDGES_MIN`]..=[`PREFETCH_EDGES_MAX`]. A random row read waits on memory, so
/// narrow rows need more edges ahead to keep as many lines coming: on a 1M-row table at 64
/// columns, 16 edges ahead instead of 4 took the forward aggregation from 41 to 34 ns an edge
/// on one core of the EPYC VM (4 KiB pages; 31 to 25 on huge pages), at 128 columns 8 edges
/// ahead 63 to 59.
const PREFETCH_LINES: usize = 64;
const PREFETCH_EDGES_MIN: usize = 4;
const PREFETCH_EDGES_MAX: usize = 16;

/// How many edges ahead a source row of `cols` floats is prefetched.
#[inline(always)]
fn prefetch_edges(cols: usize) -> usize {
    let lines = cols.div_ceil(16).max(1);
    (PREFETCH_LINES / lines).clamp(PREFETCH_EDGES_MIN, PREFETCH_EDGES_MAX)
}

/// Hint the CPU to load `len` floats of `xs` from `start` (every 64-byte line).
#[inline(always)]
fn prefetch_row(xs: &[f32], start: usize, len: usize) {
    if start + len <= xs.len() {
        crate::util::prefetch::prefetch_span(xs[start..].as_ptr(), len);
    }
}

/// The source rows of a forward aggregation in standard layout (checked to be one per
/// source), and the block's average in-degree (+1), which sizes the parallel tasks.
fn source_rows<'a>(block: &Block, x: ArrayView2<'a, f32>) -> (CowArray<'a, f32, Ix2>, usize) {
    assert_eq!(
        x.nrows(),
        block.num_src(),
        "aggregate: x must have num_src rows"
    );
    let avg_degree = block.num_edges() / block.num_dst.max(1) + 1;
    (super::standard(x), avg_degree)
}

/// `out[i] = Σ_{e ∈ in_edges(i)} w_e · x[src_e]`: `x` has `block.num_src()` rows, the result
/// `block.num_dst`.
pub fn aggregate(block: &Block, x: ArrayView2<f32>, weights: EdgeWeights) -> Array2<f32> {
    let (x, avg_degree) = source_rows(block, x);
    let cols = x.ncols();
    let xs = x.as_slice().expect("standard layout");
    super::par_rows_from_zero(
        block.num_dst,
        cols,
        super::rows_per_task(cols * avg_degree),
        |i, row| aggregate_row(block, xs, weights, i, row),
    )
}

/// [`aggregate`] beside the destinations' own rows: row `i` of the result is
/// `[x[i] | Σ_{e ∈ in_edges(i)} w_e · x[src_e]]` (twice `x`'s columns). A layer that multiplies
/// both halves by weights stacked by rows (SAGE's `[W_self; W_neigh]`) then needs one product
/// instead of two, and its output is written once.
pub fn aggregate_beside(block: &Block, x: ArrayView2<f32>, weights: EdgeWeights) -> Array2<f32> {
    let (x, avg_degree) = source_rows(block, x);
    let cols = x.ncols();
    let xs = x.as_slice().expect("standard layout");
    super::par_rows_uninit(
        block.num_dst,
        2 * cols,
        super::rows_per_task(cols * avg_degree),
        |i, row| {
            let (own, agg) = row.split_at_mut(cols);
            own.write_copy_of_slice(&xs[i * cols..(i + 1) * cols]);
            let agg = super::zeroed(agg);
            aggregate_row(block, xs, weights, i, agg)
        },
    )
}

/// The transpose of [`aggregate`]: `dx[u] = Σ_{e: src_e = u} w_e · dy[dst_e]`, with
/// `block.num_src()` rows.
pub fn aggregate_transpose(
    block: &Block,
    bt: &BlockTranspose,
    dy: ArrayView2<f32>,
    weights: EdgeWeights,
) -> Array2<f32> {
    let dy = destination_rows(block, dy);
    let cols = dy.ncols();
    let ds = dy.as_slice().expect("standard layout");
    transpose_rows(block, bt, ds, cols, cols, weights, false, None)
}

/// The gradient rows of a transposed aggregation in standard layout (checked to be one per
/// destination).
fn destination_rows<'a>(block: &Block, dy: ArrayView2<'a, f32>) -> CowArray<'a, f32, Ix2> {
    assert_eq!(
        dy.nrows(),
        block.num_dst,
        "aggregate_transpose: dy must have num_dst rows"
    );
    super::standard(dy)
}

/// Rows at most this wide are scattered serially by [`aggregate_transpose_lazy`] when the
/// block's transpose is not built yet: one pass over the edges, each adding at most a cache
/// line to its source's row, costs less than building the transpose (a counting sort of the
/// edges) to gather over it. An output layer's few classes are the usual case.
const SCATTER_MAX_COLS: usize = 16;

/// [`aggregate_transpose`] over a transpose built only when needed: narrow rows
/// ([`SCATTER_MAX_COLS`]) are scattered over the block's own CSR unless the transpose already
/// exists. Both ways add every source's terms in the same order, so the results are bitwise
/// equal.
pub fn aggregate_transpose_lazy(
    block: &Block,
    transpose: &LazyTranspose,
    dy: ArrayView2<f32>,
    weights: EdgeWeights,
) -> Array2<f32> {
    match transpose.0.get() {
        None if dy.ncols() <= SCATTER_MAX_COLS => scatter_transpose(block, dy, weights),
        _ => aggregate_transpose(block, transpose.get(block), dy, weights),
    }
}

/// [`aggregate_transpose`] as one serial scatter over the block's edges, destinations in
/// order: source `u` receives its terms in increasing edge order, as the transposed gather
/// adds them, with the same weights.
fn scatter_transpose(block: &Block, dy: ArrayView2<f32>, weights: EdgeWeights) -> Array2<f32> {
    let dy = destination_rows(block, dy);
    let cols = dy.ncols();
    let ds = dy.as_slice().expect("standard layout");
    let mut out = Array2::zeros((block.num_src(), cols));
    let dx = out.as_slice_mut().expect("fresh array");
    for v in 0..block.num_dst {
        let y = &ds[v * cols..(v + 1) * cols];
        // The weights of the transposed gather (`SourceWeights`), computed the same way.
        let dst_weight = match weights {
            EdgeWeights::Mean => 1.0 / block.in_degree(v) as f32,
            EdgeWeights::Factored { dst, .. } => dst[v],
            _ => 1.0,
        };
        for e in block.indptr[v]..block.indptr[v + 1] {
            let u = block.indices[e] as usize;
            let w = match weights {
                EdgeWeights::PerEdge(w) => w[e],
                _ => dst_weight,
            };
            axpy(w, y, &mut dx[u * cols..(u + 1) * cols]);
        }
    }
    if let EdgeWeights::Factored { src, .. } = weights {
        for (row, &s) in dx.chunks_exact_mut(cols.max(1)).zip(src) {
            row.iter_mut().for_each(|r| *r *= s);
        }
    }
    out
}

/// The transpose of [`aggregate_beside`]: `d` has `num_dst` rows `[d_own | d_agg]`, and
/// `dx[u] = Σ_{e: src_e = u} w_e · d_agg[dst_e] (+ d_own[u] when `u` is a destination)`, with
/// `block.num_src()` rows of half `d`'s columns.
///
/// With `kept`, each row is then masked by a dropout's recorded bits (the backward of the
/// dropout that made the layer's input), while it is still in cache.
pub fn aggregate_transpose_beside(
    block: &Block,
    bt: &BlockTranspose,
    d: ArrayView2<f32>,
    weights: EdgeWeights,
    kept: Option<&KeptBits>,
) -> Array2<f32> {
    assert_eq!(
        d.nrows(),
        block.num_dst,
        "aggregate_transpose: d must have num_dst rows"
    );
    assert!(
        d.ncols().is_multiple_of(2),
        "aggregate_transpose_beside: d has an odd number of columns"
    );
    let d = super::standard(d);
    let cols = d.ncols() / 2;
    let ds = d.as_slice().expect("standard layout");
    transpose_rows(block, bt, ds, 2 * cols, cols, weights, true, kept)
}

/// Rows `dx[u] = Σ_{e: src_e = u} w_e · dy[dst_e]`, where row `v` of `dy` is the `cols` floats
/// at `ds[v·stride + offset..]` with `offset = stride − cols`; with `add_own`, a destination's
/// row then adds the `cols` floats at `ds[u·stride..]` (the other half of a
/// [`aggregate_transpose_beside`] input); with `kept`, the row is finally masked.
#[allow(clippy::too_many_arguments)]
fn transpose_rows(
    block: &Block,
    bt: &BlockTranspose,
    ds: &[f32],
    stride: usize,
    cols: usize,
    weights: EdgeWeights,
    add_own: bool,
    kept: Option<&KeptBits>,
) -> Array2<f32> {
    if let Some(k) = kept {
        k.check_shape(block.num_src(), cols);
    }
    // Without destinations there are no rows (and no edges) to read: every source gets zeros.
    let agg = ds.get(stride - cols..).unwrap_or(&[]);
    let avg_degree = block.num_edges() / block.num_src().max(1) + 1;
    let inv_degree: Vec<f32>;
    let weights = match weights {
        EdgeWeights::Sum => SourceWeights::One,
        EdgeWeights::Mean => {
            inv_degree = (0..block.num_dst)
                .map(|v| 1.0 / block.in_degree(v) as f32)
                .collect();
            SourceWeights::PerDst(&inv_degree)
        }
        EdgeWeights::PerEdge(w) => SourceWeights::PerEdge(w),
        EdgeWeights::Factored { src, dst } => SourceWeights::Factored { src, dst },
    };
    let nd = block.num_dst;
    super::par_rows_from_zero(
        block.num_src(),
        cols,
        super::rows_per_task(cols * avg_degree),
        |u, row| {
            aggregate_transpose_row(bt, agg, stride, weights, u, row);
            if add_own && u < nd {
                add_assign(&ds[u * stride..u * stride + cols], row);
            }
            if let Some(k) = kept {
                k.apply_row(u, row);
            }
        },
    )
}

/// GCN's symmetric normalisation, factored: edge `u → v` has weight `dst[v] · src[u]` with
/// `src[u] = 1/sqrt(D_u)` and `dst[v] = 1/sqrt(D_v) · D_v/d̂_v`, where `D` is the degree in the
/// whole graph and `d̂_v` is `v`'s in-degree inside the block (its sampled edges): the sampled
/// sum, scaled by `D_v/d̂_v`, estimates the full neighbourhood's without bias, and with all
/// edges present it is exactly `1/sqrt(D_u·D_v)` (see [`GcnNorm::new`]). Vertices with degree 0 get factor 0,
/// so their edges contribute nothing (as PyG's `gcn_norm` does), never `inf`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GcnNorm {
    /// `1/sqrt(D_u)` per source row.
    pub src: Vec<f32>,
    /// `1/sqrt(d̂_v)` per destination row.
    pub dst: Vec<f32>,
}

/// `1/sqrt(d)`, and 0 for degree 0.
#[inline]
fn inv_sqrt(d: usize) -> f32 {
    if d == 0 {
        0.0
    } else {
        1.0 / (d as f32).sqrt()
    }
}

impl GcnNorm {
    /// The factors of `block`.
    ///
    /// * `src_degrees = Some(table)`: `D_u = table[global id of u]`, a degree of the whole graph
    ///   (the number of neighbours `u` itself aggregates, +1 with self-loops). It does not depend
    ///   on which edges a block holds, and all of a destination's sampled edges are in one block
    ///   whatever the strategy, so every rank count normalises an edge the same way; with all
    ///   edges (full batch) this is exactly standard GCN (`D^-1/2 (A+I) D^-1/2`).
    /// * `None`: `D_u` is `u`'s out-degree inside the block (DGL's convention for blocks); a
    ///   block holding only some ranks' edges then normalises differently, so the trainer
    ///   always passes the table.
    ///
    /// # Panics
    /// If a source's global id is outside `table` (a caller bug).
    pub fn new(block: &Block, src_degrees: Option<&[u32]>) -> GcnNorm {
        let Some(table) = src_degrees else {
            return GcnNorm::in_block(block);
        };
        let degree = |v: u32| {
            *table
                .get(v as usize)
                .unwrap_or_else(|| panic!("vertex {v} has no degree (table of {})", table.len()))
                as usize
        };
        let src = GcnNorm::source_factors(&block.src_nodes, table);
        // Destinations are the first sources, so `src[i]` is `1/sqrt(D_v)` of destination i.
        let dst = (0..block.num_dst)
            .map(|i| {
                let sampled = block.in_degree(i);
                let full = degree(block.src_nodes[i]);
                if sampled == full || sampled == 0 {
                    // All of v's edges (full batch, or fanout ≥ degree): standard GCN.
                    src[i]
                } else {
                    // k of D_v edges sampled: scale the sum by D_v / k so it estimates the
                    // full-graph sum without bias (as VR-GCN does), 1/sqrt(D_v) · D_v / k.
                    (full as f32).sqrt() / sampled as f32
                }
            })
            .collect();
        GcnNorm { src, dst }
    }

    /// `1/sqrt(D_u)` for the vertices `ids` (global ids): the source factors of [`GcnNorm::new`]
    /// with a table, for a caller that scales its own rows of the sources (SNP's source
    /// owners), so the numbers are the same as on the block's path.
    ///
    /// # Panics
    /// If an id is outside `table` (a caller bug).
    pub fn source_factors(ids: &[u32], table: &[u32]) -> Vec<f32> {
        ids.iter()
            .map(|&v| {
                let d = table.get(v as usize).unwrap_or_else(|| {
                    panic!("vertex {v} has no degree (table of {})", table.len())
                });
                inv_sqrt(*d as usize)
            })
            .collect()
    }

    /// DGL's convention for blocks: `1/sqrt(d̂_v)` and `u`'s out-degree inside the block.
    fn in_block(block: &Block) -> GcnNorm {
        let dst = (0..block.num_dst)
            .map(|i| inv_sqrt(block.in_degree(i)))
            .collect();
        let mut out_deg = vec![0u32; block.num_src()];
        for &u in &block.indices {
            out_deg[u as usize] += 1;
        }
        let src = out_deg.iter().map(|&d| inv_sqrt(d as usize)).collect();
        GcnNorm { src, dst }
    }

    /// The aggregation weights.
    pub fn weights(&self) -> EdgeWeights<'_> {
        EdgeWeights::Factored {
            src: &self.src,
            dst: &self.dst,
        }
    }

    /// Each edge's coefficient, in the block's CSR order (tests and inspection).
    pub fn per_edge(&self, block: &Block) -> Vec<f32> {
        (0..block.num_dst)
            .flat_map(|i| {
                block
                    .in_edges(i)
                    .iter()
                    .map(move |&u| self.dst[i] * self.src[u as usize])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {

    /// A block without destinations (a rank with no seeds in a split step): the transposed
    /// aggregations give zeros for every source instead of panicking.
    #[test]
    fn transposes_of_a_block_without_destinations_are_zeros() {
        let block = Block {
            num_dst: 0,
            src_nodes: vec![4, 5, 6],
            indptr: vec![0],
            indices: vec![],
        };
        let t = BlockTranspose::new(&block);
        let d = Array2::<f32>::zeros((0, 6));
        let out = aggregate_transpose_beside(&block, &t, d.view(), EdgeWeights::Mean, None);
        assert_eq!(out, Array2::<f32>::zeros((3, 3)));
        let out = aggregate_transpose(
            &block,
            &t,
            Array2::<f32>::zeros((0, 3)).view(),
            EdgeWeights::Sum,
        );
        assert_eq!(out, Array2::<f32>::zeros((3, 3)));
    }
    use super::*;
    use ndarray::array;

    fn block() -> Block {
        Block::small_example()
    }

    /// Per-edge weights of the example block's five edges.
    const PER_EDGE: [f32; 5] = [0.3, 1.7, -0.2, 0.9, 1.1];

    /// Every kind of edge weighting on the example block (`norm`: its GCN normalisation).
    fn every_weighting(norm: &GcnNorm) -> [EdgeWeights<'_>; 4] {
        [
            EdgeWeights::Sum,
            EdgeWeights::Mean,
            EdgeWeights::PerEdge(&PER_EDGE),
            norm.weights(),
        ]
    }

    /// The fixed-width kernels (up to 16 columns) give bitwise what the generic loop gives:
    /// compare the first `c` columns of a 17-column aggregation with a `c`-column one.
    #[test]
    fn narrow_rows_match_the_generic_loop_bitwise() {
        let b = block();
        let bt = BlockTranspose::new(&b);
        let wide = Array2::from_shape_fn((4, 17), |(i, j)| ((i * 17 + j) as f32 * 0.37).sin());
        let dy = Array2::from_shape_fn((3, 17), |(i, j)| ((i * 17 + j) as f32 * 0.73).cos());
        let norm = GcnNorm::new(&b, None);
        for w in every_weighting(&norm) {
            let full = aggregate(&b, wide.view(), w);
            let full_t = aggregate_transpose(&b, &bt, dy.view(), w);
            for c in [1, 2, 5, 10, 16] {
                let narrow = aggregate(&b, wide.slice(ndarray::s![.., ..c]), w);
                assert_eq!(
                    narrow,
                    full.slice(ndarray::s![.., ..c]),
                    "{w:?}, {c} columns"
                );
                let narrow_t = aggregate_transpose(&b, &bt, dy.slice(ndarray::s![.., ..c]), w);
                assert_eq!(
                    narrow_t,
                    full_t.slice(ndarray::s![.., ..c]),
                    "{w:?}, {c} columns"
                );
            }
        }
    }

    /// Narrow rows are scattered while no transpose exists, gathered once one does: both give
    /// bitwise the same rows, and the scatter builds no transpose.
    #[test]
    fn lazy_transpose_scatters_narrow_rows_bitwise_like_the_gather() {
        let b = block();
        let bt = BlockTranspose::new(&b);
        let norm = GcnNorm::new(&b, None);
        for w in every_weighting(&norm) {
            for c in [1, 2, 7, 16, 17] {
                let dy = Array2::from_shape_fn((3, c), |(i, j)| ((i * c + j) as f32 * 0.73).cos());
                let gathered = aggregate_transpose(&b, &bt, dy.view(), w);
                let lazy = LazyTranspose::default();
                assert_eq!(
                    aggregate_transpose_lazy(&b, &lazy, dy.view(), w),
                    gathered,
                    "{w:?}, {c} columns"
                );
                assert_eq!(lazy.0.get().is_some(), c > SCATTER_MAX_COLS, "{c} columns");
                lazy.get(&b);
                assert_eq!(aggregate_transpose_lazy(&b, &lazy, dy.view(), w), gathered);
            }
        }
    }

    #[test]
    fn mean_sum_and_weighted_aggregation() {
        let b = block();
        let x = array![[1.0f32], [2.0], [4.0], [8.0]];
        assert_eq!(
            aggregate(&b, x.view(), EdgeWeights::Sum),
            array![[8.0], [0.0], [5.0]]
        );
        assert_eq!(
            aggregate(&b, x.view(), EdgeWeights::Mean),
            array![[8.0 / 3.0], [0.0], [2.5]]
        );
        let w = [1.0, 0.0, 2.0, 0.5, 1.0];
        assert_eq!(
            aggregate(&b, x.view(), EdgeWeights::PerEdge(&w)),
            array![[10.0], [0.0], [3.0]]
        );
    }

    #[test]
    fn transpose_groups_edges_by_source() {
        let bt = BlockTranspose::new(&block());
        assert_eq!(bt.indptr, vec![0, 1, 3, 5, 5]);
        assert_eq!(bt.edge, vec![4, 0, 1, 2, 3]);
        assert_eq!(bt.dst, vec![2, 0, 0, 0, 2]);
        assert_eq!(bt.out_degree(3), 0);
    }

    #[test]
    fn gcn_norm_counts_degrees_inside_the_block() {
        let b = block();
        let c = GcnNorm::new(&b, None).per_edge(&b);
        // Edge 0: dst 0 (in 3), src 1 (out 2).
        assert!((c[0] - 1.0 / 6f32.sqrt()).abs() < 1e-7);
        // Edge 4: dst 2 (in 2), src 0 (out 1).
        assert!((c[4] - 1.0 / 2f32.sqrt()).abs() < 1e-7);
    }

    #[test]
    fn gcn_norm_with_global_degrees() {
        let b = block();
        // Global ids 10..14. Destination 10 has degree 4 but 3 sampled edges: its factor is
        // sqrt(4)/3, not 1/sqrt(3). Destination 12 has all its 2 edges: standard 1/sqrt(2).
        let mut table = vec![0u32; 14];
        table[10] = 4;
        table[11] = 8;
        table[12] = 2;
        let norm = GcnNorm::new(&b, Some(&table));
        let c = norm.per_edge(&b);
        assert!((c[0] - (2.0 / 3.0) / 8f32.sqrt()).abs() < 1e-7, "{c:?}");
        assert!((c[2] - (2.0 / 3.0) / 2f32.sqrt()).abs() < 1e-7, "{c:?}");
        assert!((c[4] - 1.0 / 8f32.sqrt()).abs() < 1e-7, "{c:?}");
        // A source of degree 0 (no self-loop, directed graph) contributes nothing, never inf.
        let mut zero = table.clone();
        zero[12] = 0;
        let z = GcnNorm::new(&b, Some(&zero)).per_edge(&b);
        assert_eq!((z[2], z[3]), (0.0, 0.0));
        assert!(z.iter().all(|w| w.is_finite()));
        // The factored aggregation equals the per-edge one.
        let x = array![[1.0f32, -1.0], [2.0, 0.5], [4.0, 3.0], [8.0, 1.0]];
        let a = aggregate(&b, x.view(), norm.weights());
        let p = aggregate(&b, x.view(), EdgeWeights::PerEdge(&c));
        assert!((&a - &p).iter().all(|d| d.abs() < 1e-6));
        let bt = BlockTranspose::new(&b);
        let dy = array![[1.0f32, 2.0], [5.0, 5.0], [-1.0, 0.5]];
        let a = aggregate_transpose(&b, &bt, dy.view(), norm.weights());
        let p = aggregate_transpose(&b, &bt, dy.view(), EdgeWeights::PerEdge(&c));
        assert!((&a - &p).iter().all(|d| d.abs() < 1e-6));
    }
}
