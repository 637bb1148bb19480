//! GAT convolution (Veličković et al., PyG's `GATConv` without attention dropout):
//! `Wh = h·W` split into `heads` heads of `f` features, attention
//! `α_{uv,h} = softmax_{u ∈ N(v)} LeakyReLU(a_src[h]·Wh_u[h] + a_dst[h]·Wh_v[h])`,
//! `out_v[h] = Σ_u α_{uv,h}·Wh_u[h]`, then heads concatenated (`heads·f` columns) or averaged
//! (`f` columns), plus a bias. Destinations without in-edges get the bias only.

use ndarray::{Array2, ArrayView2, CowArray, Ix2};
use rayon::prelude::*;

use super::init::glorot_uniform;
use super::linear::{accumulate_bias_grad, add_bias};
use super::params::ParamStore;
use crate::backend::cpu::aggregate::LazyTranspose;
use crate::backend::cpu::attention::{
    attention_aggregate, attention_backward, edge_softmax, node_logits, AttentionInputs,
};
use crate::backend::cpu::gemm::{add_matmul_tn, matmul, matmul_nt};
use crate::sample::Block;

/// Negative slope of the attention LeakyReLU (the GAT paper's and PyG's 0.2).
pub const ATTENTION_SLOPE: f32 = 0.2;

/// GATConv.
#[derive(Clone, Debug, PartialEq)]
pub struct GatConv {
    pub weight: usize,
    pub att_src: usize,
    pub att_dst: usize,
    pub bias: usize,
    pub in_dim: usize,
    pub heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Concatenate the heads (else average them).
    pub concat: bool,
}

/// Forward state for the backward pass.
#[derive(Debug)]
pub struct GatCache {
    h_in: Array2<f32>,
    wh: Array2<f32>,
    el: Array2<f32>,
    er: Array2<f32>,
    alpha: Array2<f32>,
}

impl GatConv {
    /// Register `{prefix}.weight` (`in × heads·f`), `{prefix}.att_src` / `att_dst`
    /// (`heads × f`, Glorot) and `{prefix}.bias` (`heads·f` or `f`).
    pub fn new(
        params: &mut ParamStore,
        prefix: &str,
        in_dim: usize,
        head_dim: usize,
        heads: usize,
        concat: bool,
        seed: u64,
    ) -> GatConv {
        let weight = params.add(format!("{prefix}.weight"), &[in_dim, heads * head_dim]);
        glorot_uniform(params, weight, seed);
        let att_src = params.add(format!("{prefix}.att_src"), &[heads, head_dim]);
        glorot_uniform(params, att_src, seed);
        let att_dst = params.add(format!("{prefix}.att_dst"), &[heads, head_dim]);
        glorot_uniform(params, att_dst, seed);
        let out = if concat { heads * head_dim } else { head_dim };
        let bias = params.add(format!("{prefix}.bias"), &[out]);
        GatConv {
            weight,
            att_src,
            att_dst,
            bias,
            in_dim,
            heads,
            head_dim,
            concat,
        }
    }

    /// Output columns.
    pub fn out_dim(&self) -> usize {
        if self.concat {
            self.heads * self.head_dim
        } else {
            self.head_dim
        }
    }

    /// `h_in` has `block.num_src()` rows.
    pub fn forward(
        &self,
        params: &ParamStore,
        block: &Block,
        h_in: CowArray<f32, Ix2>,
    ) -> (Array2<f32>, GatCache) {
        let wh = matmul(h_in.view(), params.view(self.weight));
        let el = node_logits(wh.view(), params.view(self.att_src), block.num_src());
        let er = node_logits(wh.view(), params.view(self.att_dst), block.num_dst);
        let alpha = edge_softmax(block, el.view(), er.view(), ATTENTION_SLOPE);
        let heads_out = attention_aggregate(block, alpha.view(), wh.view());
        let mut z = if self.concat {
            heads_out
        } else {
            self.mean_heads(heads_out.view())
        };
        add_bias(z.view_mut(), params.view(self.bias));
        let cache = GatCache {
            h_in: h_in.into_owned(),
            wh,
            el,
            er,
            alpha,
        };
        (z, cache)
    }

    /// `out[v, :] = mean_h x[v, h, :]`.
    fn mean_heads(&self, x: ArrayView2<f32>) -> Array2<f32> {
        let (h, f) = (self.heads, self.head_dim);
        let xs = x.to_slice().expect("standard layout");
        let mut out = Array2::zeros((x.nrows(), f));
        if f == 0 {
            return out;
        }
        let inv = 1.0 / h as f32;
        out.as_slice_mut()
            .unwrap()
            .par_chunks_mut(f)
            .enumerate()
            .for_each(|(v, o)| {
                for k in 0..h {
                    crate::backend::cpu::gather::axpy(
                        inv,
                        &xs[(v * h + k) * f..(v * h + k + 1) * f],
                        o,
                    );
                }
            });
        out
    }

    /// Backward of [`GatConv::mean_heads`]: `out[v, h, :] = dz[v, :] / heads`.
    fn spread_heads(&self, dz: ArrayView2<f32>) -> Array2<f32> {
        let (h, f) = (self.heads, self.head_dim);
        let dz = crate::backend::cpu::standard(dz);
        let ds = dz.as_slice().expect("standard layout");
        let mut out = Array2::zeros((dz.nrows(), h * f));
        if f == 0 {
            return out;
        }
        let inv = 1.0 / h as f32;
        out.as_slice_mut()
            .unwrap()
            .par_chunks_mut(h * f)
            .zip(ds.par_chunks(f))
            .for_each(|(o, d)| {
                for head in o.chunks_exact_mut(f) {
                    head.iter_mut().zip(d).for_each(|(x, &y)| *x = y * inv);
                }
            });
        out
    }

    /// Accumulate gradients; return d `h_in` (`num_src` rows) when asked.
    pub fn backward(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        cache: GatCache,
        dz: ArrayView2<f32>,
        need_d_in: bool,
    ) -> Option<Array2<f32>> {
        accumulate_bias_grad(params, self.bias, dz);
        // Gradient of the per-head outputs: the mean spreads dz/heads over every head.
        let d_heads = if self.concat {
            dz.to_owned()
        } else {
            self.spread_heads(dz)
        };
        let grads = attention_backward(
            &AttentionInputs {
                block,
                transpose: transpose.get(block),
                wh: cache.wh.view(),
                el: cache.el.view(),
                er: cache.er.view(),
                alpha: cache.alpha.view(),
                att_src: params.view(self.att_src),
                att_dst: params.view(self.att_dst),
                slope: ATTENTION_SLOPE,
            },
            d_heads.view(),
        );
        params
            .grad_mut(self.att_src)
            .scaled_add(1.0, &grads.d_att_src);
        params
            .grad_mut(self.att_dst)
            .scaled_add(1.0, &grads.d_att_dst);
        add_matmul_tn(
            cache.h_in.view(),
            grads.d_wh.view(),
            params.grad_mut(self.weight),
        );
        need_d_in.then(|| matmul_nt(grads.d_wh.view(), params.view(self.weight)))
    }
}
