//! CSR aggregation over a block and its transpose (twin: `cpu::aggregate`), bitwise the CPU's:
//! each output column adds its edges' terms in the block's order (the transpose: in the
//! transposed CSR's order, increasing edge order per source), as rounded products and sums.
//! One warp per output row, lanes over columns.

use anyhow::Result;

use super::dropout::DevKept;
use super::graph::{DevBlockTranspose, DevGraph, DevWeights};
use super::{launch, same_device, Args};
use crate::backend::cuda::kernels::per_warp;
use crate::backend::cuda::mat::{DevMat, DevView};

/// The weight arrays as kernel arguments: `mode, edge_w, src_w, dst_w`.
fn weight_args(args: Args, w: &DevWeights) -> Args {
    let (e, s, d) = match w {
        DevWeights::PerEdge(e) => (Some(e.ptr()), None, None),
        DevWeights::Factored { src, dst } => (None, Some(src.ptr()), Some(dst.ptr())),
        _ => (None, None, None),
    };
    args.u32(w.mode()).opt(e).opt(s).opt(d)
}

/// `out[i] = Σ_{e ∈ in_edges(i)} w_e · x[src_e]` (`x` has `num_src` rows, the result
/// `num_dst`); with `beside`, `[x[i] | …]` (twice the columns: `aggregate_beside`).
fn aggregate_rows(g: &DevGraph, x: DevView, w: &DevWeights, beside: bool) -> Result<DevMat> {
    assert_eq!(x.rows(), g.num_src(), "aggregate: x must have num_src rows");
    same_device(x.device(), g.device());
    w.check(g);
    let cols = x.cols();
    let width = if beside { 2 * cols } else { cols };
    let out = DevMat::uninit(x.device(), g.num_dst(), width)?;
    if g.num_dst() == 0 || cols == 0 {
        return Ok(out);
    }
    let args = Args::new()
        .ptr(out.view().ptr())
        .u64(width)
        .u64(if beside { cols } else { 0 })
        .flag(beside)
        .ptr(x.ptr())
        .u32(cols)
        .ptr(g.indptr.ptr())
        .ptr(g.indices.ptr())
        .u64(g.num_dst());
    launch(
        x.device(),
        "gnn_aggregate",
        per_warp(g.num_dst()),
        weight_args(args, w),
    )?;
    Ok(out)
}

/// `out[i] = Σ_{e ∈ in_edges(i)} w_e · x[src_e]`.
pub fn aggregate(g: &DevGraph, x: DevView, w: &DevWeights) -> Result<DevMat> {
    aggregate_rows(g, x, w, false)
}

/// `[x[i] | aggregate(x)[i]]` per destination (twice `x`'s columns): SAGE's
/// `[h_dst | mean]`, multiplied by `[W_self; W_neigh]` in one product.
pub fn aggregate_beside(g: &DevGraph, x: DevView, w: &DevWeights) -> Result<DevMat> {
    aggregate_rows(g, x, w, true)
}

/// The transpose of [`aggregate`]: `dx[u] = Σ_{e: src_e = u} w_e · dy[dst_e]`, `num_src` rows.
pub fn aggregate_transpose(
    g: &DevGraph,
    t: &DevBlockTranspose,
    dy: DevView,
    w: &DevWeights,
) -> Result<DevMat> {
    assert_eq!(
        dy.rows(),
        g.num_dst(),
        "aggregate_transpose: dy must have num_dst rows"
    );
    transpose_rows(g, t, dy, dy.cols(), w, false, None)
}

/// The transpose of [`aggregate_beside`] from `d = [d_own | d_agg]` (`num_dst` rows):
/// `dx[u] = Σ_{e: src_e = u} w_e · d_agg[dst_e] (+ d_own[u] when u is a destination)`, each row
/// then masked by `kept` (the input dropout's bits, `num_src × cols`) when given.
pub fn aggregate_transpose_beside(
    g: &DevGraph,
    t: &DevBlockTranspose,
    d: DevView,
    w: &DevWeights,
    kept: Option<&DevKept>,
) -> Result<DevMat> {
    assert_eq!(
        d.rows(),
        g.num_dst(),
        "aggregate_transpose: d must have num_dst rows"
    );
    assert!(
        d.cols().is_multiple_of(2),
        "aggregate_transpose_beside: d has an odd number of columns"
    );
    transpose_rows(g, t, d, d.cols() / 2, w, true, kept)
}

/// Rows `dx[u]` over the transposed CSR; row `v` of the gradient is the `cols` floats ending
/// row `v` of `d` (`d` has `cols` or `2·cols` columns), `beside` adds the own half.
fn transpose_rows(
    g: &DevGraph,
    t: &DevBlockTranspose,
    d: DevView,
    cols: usize,
    w: &DevWeights,
    beside: bool,
    kept: Option<&DevKept>,
) -> Result<DevMat> {
    same_device(d.device(), g.device());
    w.check(g);
    assert_eq!(
        t.indptr.len(),
        g.num_src() + 1,
        "aggregate_transpose: transpose of another block"
    );
    if let Some(k) = kept {
        k.check_shape(g.num_src(), cols);
    }
    let out = DevMat::uninit(d.device(), g.num_src(), cols)?;
    if g.num_src() == 0 || cols == 0 {
        return Ok(out);
    }
    let stride = d.cols();
    let args = Args::new()
        .ptr(out.view().ptr())
        .ptr(d.ptr())
        .u64(stride)
        .u64(stride - cols)
        .u32(cols)
        .ptr(t.indptr.ptr())
        .ptr(t.dst.ptr())
        .ptr(t.edge.ptr())
        .u64(g.num_src())
        .ptr(g.indptr.ptr())
        .u64(g.num_dst());
    let args = weight_args(args, w)
        .flag(beside)
        .opt(kept.map(|k| k.bits.ptr()))
        .u32(kept.map_or(0, |k| k.words_per_row))
        .f32(kept.map_or(1.0, |k| k.scale));
    launch(
        d.device(),
        "gnn_aggregate_transpose",
        per_warp(g.num_src()),
        args,
    )?;
    Ok(out)
}
