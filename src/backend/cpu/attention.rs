//! GAT attention kernels: per-node attention logits, edge scores with LeakyReLU and a softmax
//! over each destination's in-edges, the attention-weighted aggregation, and the backward of
//! all three.
//!
//! Projected features `wh` have `heads·f` columns, head `h` in columns `h·f..(h+1)·f`.
//! Per-edge data (`alpha`) is an `edges × heads` matrix in the block's CSR order.

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::aggregate::BlockTranspose;
use super::gather::{axpy, dot};
use super::softmax::{par_segment_groups, softmax_segment, softmax_segment_backward};
use crate::sample::Block;

/// Per-node attention logits `out[u, h] = wh[u, h, :] · att[h, :]` for the first `rows` rows.
pub fn node_logits(wh: ArrayView2<f32>, att: ArrayView2<f32>, rows: usize) -> Array2<f32> {
    let (heads, f) = att.dim();
    assert_eq!(
        wh.ncols(),
        heads * f,
        "node_logits: wh must have heads·f columns"
    );
    let wh = super::standard(wh);
    let att = super::standard(att);
    let (ws, a) = (wh.as_slice().unwrap(), att.as_slice().unwrap());
    let mut out = Array2::zeros((rows, heads));
    if heads == 0 || f == 0 {
        return out;
    }
    out.as_slice_mut()
        .unwrap()
        .par_chunks_mut(heads)
        .enumerate()
        .with_min_len(super::rows_per_task(heads * f))
        .for_each(|(u, o)| {
            let row = &ws[u * heads * f..(u + 1) * heads * f];
            for h in 0..heads {
                o[h] = dot(&row[h * f..(h + 1) * f], &a[h * f..(h + 1) * f]);
            }
        });
    out
}

/// `alpha[e, h] = softmax over in_edges(v) of LeakyReLU(el[src_e, h] + er[v, h])`.
pub fn edge_softmax(
    block: &Block,
    el: ArrayView2<f32>,
    er: ArrayView2<f32>,
    slope: f32,
) -> Array2<f32> {
    let heads = el.ncols();
    let (el, er) = (super::standard(el), super::standard(er));
    let (els, ers) = (el.as_slice().unwrap(), er.as_slice().unwrap());
    let mut alpha = Array2::zeros((block.num_edges(), heads));
    let data = alpha.as_slice_mut().unwrap();
    par_segment_groups(data, &block.indptr, heads, |segs, data| {
        let base = block.indptr[segs.start];
        for v in segs {
            let seg =
                &mut data[(block.indptr[v] - base) * heads..(block.indptr[v + 1] - base) * heads];
            for (k, &u) in block.in_edges(v).iter().enumerate() {
                let u = u as usize;
                for h in 0..heads {
                    let s = els[u * heads + h] + ers[v * heads + h];
                    seg[k * heads + h] = if s > 0.0 { s } else { slope * s };
                }
            }
            softmax_segment(seg, heads);
        }
    });
    alpha
}

/// `out[v, h, :] = Σ_{e ∈ in_edges(v)} alpha[e, h] · wh[src_e, h, :]` (`num_dst` rows).
pub fn attention_aggregate(
    block: &Block,
    alpha: ArrayView2<f32>,
    wh: ArrayView2<f32>,
) -> Array2<f32> {
    let heads = alpha.ncols();
    let cols = wh.ncols();
    let f = cols / heads.max(1);
    let (alpha, wh) = (super::standard(alpha), super::standard(wh));
    let (al, ws) = (alpha.as_slice().unwrap(), wh.as_slice().unwrap());
    let mut out = Array2::zeros((block.num_dst, cols));
    if cols == 0 {
        return out;
    }
    let deg = block.num_edges() / block.num_dst.max(1) + 1;
    out.as_slice_mut()
        .unwrap()
        .par_chunks_mut(cols)
        .enumerate()
        .with_min_len(super::rows_per_task(cols * deg))
        .for_each(|(v, o)| {
            for e in block.indptr[v]..block.indptr[v + 1] {
                let u = block.indices[e] as usize;
                let src = &ws[u * cols..(u + 1) * cols];
                for h in 0..heads {
                    axpy(
                        al[e * heads + h],
                        &src[h * f..(h + 1) * f],
                        &mut o[h * f..(h + 1) * f],
                    );
                }
            }
        });
    out
}

/// Everything the backward of a GAT attention step needs from its forward.
pub struct AttentionInputs<'a> {
    pub block: &'a Block,
    pub transpose: &'a BlockTranspose,
    /// Projected source features, `num_src × heads·f`.
    pub wh: ArrayView2<'a, f32>,
    /// Source logits `num_src × heads` and destination logits `num_dst × heads`.
    pub el: ArrayView2<'a, f32>,
    pub er: ArrayView2<'a, f32>,
    /// Attention weights, `edges × heads`.
    pub alpha: ArrayView2<'a, f32>,
    /// Attention vectors, `heads × f`.
    pub att_src: ArrayView2<'a, f32>,
    pub att_dst: ArrayView2<'a, f32>,
    pub slope: f32,
}

/// Gradients of a GAT attention step.
pub struct AttentionGrads {
    /// d loss / d wh, `num_src × heads·f` (through the aggregation and both logits).
    pub d_wh: Array2<f32>,
    /// d loss / d att_src and d att_dst, `heads × f`.
    pub d_att_src: Array2<f32>,
    pub d_att_dst: Array2<f32>,
}

/// Backward of `node_logits` + `edge_softmax` + `attention_aggregate`, given `d_out`
/// (`num_dst × heads·f`).
pub fn attention_backward(inp: &AttentionInputs, d_out: ArrayView2<f32>) -> AttentionGrads {
    let block = inp.block;
    let bt = inp.transpose;
    let (heads, f) = inp.att_src.dim();
    let cols = heads * f;
    let (ns, nd) = (block.num_src(), block.num_dst);
    let wh = super::standard(inp.wh.view());
    let el = super::standard(inp.el.view());
    let er = super::standard(inp.er.view());
    let alpha = super::standard(inp.alpha.view());
    let d_out = super::standard(d_out);
    let att_src = super::standard(inp.att_src.view());
    let att_dst = super::standard(inp.att_dst.view());
    let (ws, els, ers, al, dos) = (
        wh.as_slice().unwrap(),
        el.as_slice().unwrap(),
        er.as_slice().unwrap(),
        alpha.as_slice().unwrap(),
        d_out.as_slice().unwrap(),
    );
    let (a_src, a_dst) = (att_src.as_slice().unwrap(), att_dst.as_slice().unwrap());

    // 1. Per destination: d alpha, through the softmax and the LeakyReLU to d score ("d_pre").
    let mut d_pre = vec![0f32; block.num_edges() * heads];
    par_segment_groups(&mut d_pre, &block.indptr, heads, |segs, data| {
        let base = block.indptr[segs.start];
        for v in segs {
            let (lo, hi) = (block.indptr[v], block.indptr[v + 1]);
            let seg = &mut data[(lo - base) * heads..(hi - base) * heads];
            let dv = &dos[v * cols..(v + 1) * cols];
            for (k, &u) in block.in_edges(v).iter().enumerate() {
                let src = &ws[u as usize * cols..(u as usize + 1) * cols];
                for h in 0..heads {
                    seg[k * heads + h] = dot(&dv[h * f..(h + 1) * f], &src[h * f..(h + 1) * f]);
                }
            }
            softmax_segment_backward(&al[lo * heads..hi * heads], seg, heads);
            for (k, &u) in block.in_edges(v).iter().enumerate() {
                for h in 0..heads {
                    let s = els[u as usize * heads + h] + ers[v * heads + h];
                    if s <= 0.0 {
                        seg[k * heads + h] *= inp.slope;
                    }
                }
            }
        }
    });

    // 2. d er[v, h] = Σ over in-edges of d_pre.
    let mut d_er = Array2::<f32>::zeros((nd, heads));
    d_er.as_slice_mut()
        .unwrap()
        .par_chunks_mut(heads.max(1))
        .enumerate()
        .for_each(|(v, o)| {
            for e in block.indptr[v]..block.indptr[v + 1] {
                axpy(1.0, &d_pre[e * heads..(e + 1) * heads], o);
            }
        });
    let d_er_s = d_er.as_slice().unwrap();

    // 3. Per source (transposed CSR, no atomics): d wh through the aggregation, d el, and the
    //    logit terms d el·att_src (and d er·att_dst for sources that are destinations).
    let mut d_wh = Array2::<f32>::zeros((ns, cols));
    let mut d_el = Array2::<f32>::zeros((ns, heads));
    if cols > 0 {
        let deg = block.num_edges() / ns.max(1) + 1;
        d_wh.as_slice_mut()
            .unwrap()
            .par_chunks_mut(cols)
            .zip(d_el.as_slice_mut().unwrap().par_chunks_mut(heads))
            .enumerate()
            .with_min_len(super::rows_per_task(cols * deg))
            .for_each(|(u, (g, del))| {
                for k in bt.indptr[u]..bt.indptr[u + 1] {
                    let (v, e) = (bt.dst[k] as usize, bt.edge[k] as usize);
                    let dv = &dos[v * cols..(v + 1) * cols];
                    for h in 0..heads {
                        axpy(
                            al[e * heads + h],
                            &dv[h * f..(h + 1) * f],
                            &mut g[h * f..(h + 1) * f],
                        );
                        del[h] += d_pre[e * heads + h];
                    }
                }
                for h in 0..heads {
                    axpy(
                        del[h],
                        &a_src[h * f..(h + 1) * f],
                        &mut g[h * f..(h + 1) * f],
                    );
                    if u < nd {
                        let d = d_er_s[u * heads + h];
                        axpy(d, &a_dst[h * f..(h + 1) * f], &mut g[h * f..(h + 1) * f]);
                    }
                }
            });
    }

    // 4. Attention-vector gradients: Σ_u d el[u, h]·wh[u, h, :] (and d er over destinations),
    //    as partial sums over fixed row chunks combined in order.
    let d_att_src = weighted_head_sum(d_el.view(), ws, heads, f, ns);
    let d_att_dst = weighted_head_sum(d_er.view(), ws, heads, f, nd);
    AttentionGrads {
        d_wh,
        d_att_src,
        d_att_dst,
    }
}

/// `out[h, :] = Σ_{u < rows} coef[u, h] · wh[u, h, :]`.
fn weighted_head_sum(
    coef: ArrayView2<f32>,
    ws: &[f32],
    heads: usize,
    f: usize,
    rows: usize,
) -> Array2<f32> {
    let cols = heads * f;
    let mut out = Array2::zeros((heads, f));
    if cols == 0 || rows == 0 {
        return out;
    }
    let cs = coef.as_slice().unwrap();
    let chunk = super::rows_per_task(cols).max(64);
    let partials: Vec<Vec<f32>> = (0..rows.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let mut acc = vec![0f32; cols];
            for u in c * chunk..((c + 1) * chunk).min(rows) {
                let row = &ws[u * cols..(u + 1) * cols];
                for h in 0..heads {
                    axpy(
                        cs[u * heads + h],
                        &row[h * f..(h + 1) * f],
                        &mut acc[h * f..(h + 1) * f],
                    );
                }
            }
            acc
        })
        .collect();
    let o = out.as_slice_mut().unwrap();
    for p in &partials {
        axpy(1.0, p, o);
    }
    out
}

/// `out[v, :] = mean_h x[v, h, :]` over `heads` heads of `f` columns.
pub fn mean_heads(x: ArrayView2<f32>, heads: usize, f: usize) -> Array2<f32> {
    let x = super::standard(x);
    let xs = x.as_slice().expect("standard layout");
    let mut out = Array2::zeros((x.nrows(), f));
    if f == 0 {
        return out;
    }
    let inv = 1.0 / heads as f32;
    out.as_slice_mut()
        .unwrap()
        .par_chunks_mut(f)
        .enumerate()
        .for_each(|(v, o)| {
            for k in 0..heads {
                super::gather::axpy(inv, &xs[(v * heads + k) * f..(v * heads + k + 1) * f], o);
            }
        });
    out
}

/// The backward of [`mean_heads`]: `out[v, h, :] = d[v, :] / heads`.
pub fn spread_heads(d: ArrayView2<f32>, heads: usize, f: usize) -> Array2<f32> {
    let d = super::standard(d);
    let ds = d.as_slice().expect("standard layout");
    let mut out = Array2::zeros((d.nrows(), heads * f));
    if f == 0 {
        return out;
    }
    let inv = 1.0 / heads as f32;
    out.as_slice_mut()
        .unwrap()
        .par_chunks_mut(heads * f)
        .zip(ds.par_chunks(f))
        .for_each(|(o, d)| {
            for head in o.chunks_exact_mut(f) {
                head.iter_mut().zip(d).for_each(|(x, &y)| *x = y * inv);
            }
        });
    out
}
