//! GAT attention (twins: `cpu::attention`, `cpu::softmax`, `GatConv`'s mean over heads).
//! Projected rows `wh` have `heads·f` columns, head `h` in columns `h·f..(h+1)·f`; per-edge
//! data (the attention `alpha`) is `edges × heads` in the block's CSR order. Every sum runs in
//! the CPU's order with rounded steps: the results are the CPU's up to the device's `expf`
//! (the softmax), bitwise otherwise.

use anyhow::Result;

use super::graph::{DevBlockTranspose, DevGraph};
use super::reduce::{column_sums_into, Terms};
use super::{launch, same_device, Args};
use crate::backend::cuda::kernels::{per_thread, per_warp};
use crate::backend::cuda::mat::{DevMat, DevView};

/// `out[u, h] = wh[u, h, :] · att[h, :]` for the first `rows` rows (`att` is `heads × f`).
pub fn node_logits(wh: DevView, att: DevView, rows: usize) -> Result<DevMat> {
    let (heads, f) = att.dim();
    assert_eq!(
        wh.cols(),
        heads * f,
        "node_logits: wh must have heads·f columns"
    );
    assert!(
        rows <= wh.rows(),
        "node_logits: {rows} rows of {}",
        wh.rows()
    );
    let out = DevMat::zeros(wh.device(), rows, heads)?;
    if rows == 0 || heads == 0 || f == 0 {
        return Ok(out);
    }
    launch(
        wh.device(),
        "gnn_gat_logits",
        per_thread(rows * heads),
        Args::new()
            .ptr(out.view().ptr())
            .ptr(wh.ptr())
            .ptr(att.ptr())
            .u64(rows)
            .u32(heads)
            .u32(f),
    )?;
    Ok(out)
}

/// `alpha[e, h]` = softmax over `e ∈ in_edges(v)` of `LeakyReLU(el[src_e, h] + er[v, h])`
/// (`edges × heads`).
pub fn edge_softmax(g: &DevGraph, el: DevView, er: DevView, slope: f32) -> Result<DevMat> {
    let heads = el.cols();
    assert_eq!(
        el.rows(),
        g.num_src(),
        "edge_softmax: el has one row per source"
    );
    assert_eq!(
        er.dim(),
        (g.num_dst(), heads),
        "edge_softmax: er has one row per destination"
    );
    same_device(el.device(), g.device());
    let alpha = DevMat::zeros(el.device(), g.num_edges(), heads)?;
    if g.num_edges() == 0 || heads == 0 {
        return Ok(alpha);
    }
    launch(
        el.device(),
        "gnn_gat_softmax",
        per_thread(g.num_dst() * heads),
        Args::new()
            .ptr(alpha.view().ptr())
            .ptr(el.ptr())
            .ptr(er.ptr())
            .ptr(g.indptr.ptr())
            .ptr(g.indices.ptr())
            .u64(g.num_dst())
            .u32(heads)
            .f32(slope),
    )?;
    Ok(alpha)
}

/// `out[v, h, :] = Σ_{e ∈ in_edges(v)} alpha[e, h] · wh[src_e, h, :]` (`num_dst` rows).
pub fn attention_aggregate(g: &DevGraph, alpha: DevView, wh: DevView) -> Result<DevMat> {
    let heads = alpha.cols();
    let cols = wh.cols();
    assert_eq!(
        alpha.rows(),
        g.num_edges(),
        "attention_aggregate: one alpha row per edge"
    );
    assert_eq!(
        wh.rows(),
        g.num_src(),
        "attention_aggregate: wh has one row per source"
    );
    let out = DevMat::zeros(wh.device(), g.num_dst(), cols)?;
    if cols == 0 || g.num_dst() == 0 {
        return Ok(out);
    }
    assert!(
        heads > 0 && cols.is_multiple_of(heads),
        "attention_aggregate: heads"
    );
    launch(
        wh.device(),
        "gnn_gat_aggregate",
        per_warp(g.num_dst()),
        Args::new()
            .ptr(out.view().ptr())
            .ptr(alpha.ptr())
            .ptr(wh.ptr())
            .ptr(g.indptr.ptr())
            .ptr(g.indices.ptr())
            .u64(g.num_dst())
            .u32(heads)
            .u32(cols / heads),
    )?;
    Ok(out)
}

/// What the attention's backward needs from its forward (`AttentionInputs` on the device).
#[derive(Clone, Copy, Debug)]
pub struct AttentionInputs<'a> {
    pub graph: &'a DevGraph,
    pub transpose: &'a DevBlockTranspose,
    /// `num_src × heads·f`.
    pub wh: DevView<'a>,
    /// `num_src × heads` and `num_dst × heads`.
    pub el: DevView<'a>,
    pub er: DevView<'a>,
    /// `edges × heads`.
    pub alpha: DevView<'a>,
    /// `heads × f` each.
    pub att_src: DevView<'a>,
    pub att_dst: DevView<'a>,
    pub slope: f32,
}

/// Gradients of the attention step.
#[derive(Debug)]
pub struct AttentionGrads {
    /// `num_src × heads·f`: through the aggregation and both logits.
    pub d_wh: DevMat,
    /// `heads × f` each.
    pub d_att_src: DevMat,
    pub d_att_dst: DevMat,
}

/// The backward of [`node_logits`] + [`edge_softmax`] + [`attention_aggregate`] given `d_out`
/// (`num_dst × heads·f`), in the CPU's four steps: per destination the score gradients and
/// `d er`; per source `d el` and `d wh` over the transposed CSR (no atomics); the
/// attention-vector gradients as fixed-order column sums.
pub fn attention_backward(inp: &AttentionInputs, d_out: DevView) -> Result<AttentionGrads> {
    let g = inp.graph;
    let t = inp.transpose;
    let (heads, f) = inp.att_src.dim();
    let cols = heads * f;
    let (ns, nd, ne) = (g.num_src(), g.num_dst(), g.num_edges());
    let device = d_out.device();
    same_device(device, g.device());
    assert_eq!(inp.wh.dim(), (ns, cols), "attention_backward: wh shape");
    assert_eq!(inp.el.dim(), (ns, heads), "attention_backward: el shape");
    assert_eq!(inp.er.dim(), (nd, heads), "attention_backward: er shape");
    assert_eq!(
        inp.alpha.dim(),
        (ne, heads),
        "attention_backward: alpha shape"
    );
    assert_eq!(
        inp.att_dst.dim(),
        (heads, f),
        "attention_backward: att_dst shape"
    );
    assert_eq!(d_out.dim(), (nd, cols), "attention_backward: d_out shape");
    let mut d_att_src = DevMat::zeros(device, heads, f)?;
    let mut d_att_dst = DevMat::zeros(device, heads, f)?;
    let d_wh = DevMat::zeros(device, ns, cols)?;
    if cols == 0 {
        return Ok(AttentionGrads {
            d_wh,
            d_att_src,
            d_att_dst,
        });
    }
    let d_pre = DevMat::zeros(device, ne, heads)?;
    let d_er = DevMat::zeros(device, nd, heads)?;
    let d_el = DevMat::zeros(device, ns, heads)?;
    if nd > 0 {
        launch(
            device,
            "gnn_gat_backward_dst",
            per_thread(nd * heads),
            Args::new()
                .ptr(d_pre.view().ptr())
                .ptr(d_er.view().ptr())
                .ptr(d_out.ptr())
                .ptr(inp.wh.ptr())
                .ptr(inp.el.ptr())
                .ptr(inp.er.ptr())
                .ptr(inp.alpha.ptr())
                .ptr(g.indptr.ptr())
                .ptr(g.indices.ptr())
                .u64(nd)
                .u32(heads)
                .u32(f)
                .f32(inp.slope),
        )?;
    }
    if ns > 0 {
        launch(
            device,
            "gnn_gat_backward_src_logits",
            per_thread(ns * heads),
            Args::new()
                .ptr(d_el.view().ptr())
                .ptr(d_pre.view().ptr())
                .ptr(t.indptr.ptr())
                .ptr(t.edge.ptr())
                .u64(ns)
                .u32(heads),
        )?;
        launch(
            device,
            "gnn_gat_backward_src",
            per_warp(ns),
            Args::new()
                .ptr(d_wh.view().ptr())
                .ptr(d_out.ptr())
                .ptr(inp.alpha.ptr())
                .ptr(d_el.view().ptr())
                .ptr(d_er.view().ptr())
                .ptr(inp.att_src.ptr())
                .ptr(inp.att_dst.ptr())
                .ptr(t.indptr.ptr())
                .ptr(t.dst.ptr())
                .ptr(t.edge.ptr())
                .u64(ns)
                .u64(nd)
                .u32(heads)
                .u32(f),
        )?;
    }
    column_sums_into(
        inp.wh,
        Terms::PerHead {
            coef: d_el.view(),
            f,
        },
        d_att_src.view_mut(),
        false,
    )?;
    column_sums_into(
        inp.wh.row_range(0..nd),
        Terms::PerHead {
            coef: d_er.view(),
            f,
        },
        d_att_dst.view_mut(),
        false,
    )?;
    Ok(AttentionGrads {
        d_wh,
        d_att_src,
        d_att_dst,
    })
}

/// `out[v, :] = mean_h x[v, h, :]` (`x` has `heads·f` columns; the sum over heads in order of
/// `x·(1/heads)`, as the CPU's).
pub fn mean_heads(x: DevView, heads: usize, f: usize) -> Result<DevMat> {
    assert_eq!(x.cols(), heads * f, "mean_heads: heads·f columns");
    let out = DevMat::zeros(x.device(), x.rows(), f)?;
    if x.rows() == 0 || f == 0 {
        return Ok(out);
    }
    launch(
        x.device(),
        "gnn_mean_heads",
        per_thread(x.rows() * f),
        Args::new()
            .ptr(out.view().ptr())
            .ptr(x.ptr())
            .u64(x.rows())
            .u32(heads)
            .u32(f)
            .f32(1.0 / heads as f32),
    )?;
    Ok(out)
}

/// The backward of [`mean_heads`]: `out[v, h, :] = d[v, :] · (1/heads)`.
pub fn spread_heads(d: DevView, heads: usize, f: usize) -> Result<DevMat> {
    assert_eq!(d.cols(), f, "spread_heads: f columns");
    let out = DevMat::zeros(d.device(), d.rows(), heads * f)?;
    if d.rows() == 0 || f == 0 || heads == 0 {
        return Ok(out);
    }
    launch(
        d.device(),
        "gnn_spread_heads",
        per_thread(d.rows() * heads * f),
        Args::new()
            .ptr(out.view().ptr())
            .ptr(d.ptr())
            .u64(d.rows())
            .u32(heads)
            .u32(f)
            .f32(1.0 / heads as f32),
    )?;
    Ok(out)
}
