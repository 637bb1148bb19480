//! GAT convolution (Veličković et al., PyG's `GATConv` without attention dropout):
//! `Wh = h·W` split into `heads` heads of `f` features, attention
//! `α_{uv,h} = softmax_{u ∈ N(v)} LeakyReLU(a_src[h]·Wh_u[h] + a_dst[h]·Wh_v[h])`,
//! `out_v[h] = Σ_u α_{uv,h}·Wh_u[h]`, then heads concatenated (`heads·f` columns) or averaged
//! (`f` columns), plus a bias. Destinations without in-edges get the bias only.

use super::init::{glorot_uniform, init_weight, InitKind};
use super::linear::{accumulate_bias_grad, add_bias};
use super::params::ParamStore;
use crate::backend::{AttentionArgs, Backend, CowMat, Cpu};

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
pub struct GatCache<B: Backend = Cpu> {
    /// `None` after an inference pass.
    h_in: Option<B::Mat>,
    wh: B::Mat,
    el: B::Mat,
    er: B::Mat,
    alpha: B::Mat,
}

impl GatConv {
    /// Register `{prefix}.weight` (`in × heads·f`) and `{prefix}.bias` (`heads·f` or `f`),
    /// started the `init` way, and `{prefix}.att_src` / `att_dst` (`heads × f`, Glorot: they are
    /// not linear layers).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        params: &mut ParamStore<Cpu>,
        prefix: &str,
        in_dim: usize,
        head_dim: usize,
        heads: usize,
        concat: bool,
        init: InitKind,
        seed: u64,
    ) -> GatConv {
        let weight = params.add(format!("{prefix}.weight"), &[in_dim, heads * head_dim]);
        let att_src = params.add(format!("{prefix}.att_src"), &[heads, head_dim]);
        glorot_uniform(params, att_src, seed);
        let att_dst = params.add(format!("{prefix}.att_dst"), &[heads, head_dim]);
        glorot_uniform(params, att_dst, seed);
        let out = if concat { heads * head_dim } else { head_dim };
        let bias = params.add(format!("{prefix}.bias"), &[out]);
        // The bias takes the weight's fan-in, as a linear layer's does.
        init_weight(params, init, weight, Some(bias), seed);
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
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        keep: bool,
    ) -> (B::Mat, GatCache<B>) {
        let be = params.backend();
        let block = be.block(g);
        let wh = be.matmul(h_in.view(be), params.view(self.weight));
        let el = be.node_logits(be.view(&wh), params.view(self.att_src), block.num_src());
        let er = be.node_logits(be.view(&wh), params.view(self.att_dst), block.num_dst);
        let alpha = be.edge_softmax(g, be.view(&el), be.view(&er), ATTENTION_SLOPE);
        let heads_out = be.attention_aggregate(g, be.view(&alpha), be.view(&wh));
        let mut z = if self.concat {
            heads_out
        } else {
            be.mean_heads(be.view(&heads_out), self.heads, self.head_dim)
        };
        add_bias(params, be.view_mut(&mut z), Some(self.bias));
        let cache = GatCache {
            h_in: h_in.kept(be, keep),
            wh,
            el,
            er,
            alpha,
        };
        (z, cache)
    }

    /// Accumulate gradients; return d `h_in` (`num_src` rows) when asked.
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        cache: GatCache<B>,
        dz: B::View<'_>,
        need_d_in: bool,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        accumulate_bias_grad(params, Some(self.bias), dz);
        // Gradient of the per-head outputs: the mean spreads dz/heads over every head.
        let d_heads = if self.concat {
            be.to_owned(dz)
        } else {
            be.spread_heads(dz, self.heads, self.head_dim)
        };
        let grads = be.attention_backward(
            &AttentionArgs {
                graph: g,
                transpose,
                wh: be.view(&cache.wh),
                el: be.view(&cache.el),
                er: be.view(&cache.er),
                alpha: be.view(&cache.alpha),
                att_src: params.view(self.att_src),
                att_dst: params.view(self.att_dst),
                slope: ATTENTION_SLOPE,
            },
            be.view(&d_heads),
        );
        be.add_scaled(
            params.grad_mut(self.att_src),
            1.0,
            be.view(&grads.d_att_src),
        );
        be.add_scaled(
            params.grad_mut(self.att_dst),
            1.0,
            be.view(&grads.d_att_dst),
        );
        be.add_matmul_tn(
            be.view(cache.h_in.as_ref().expect(super::NOT_KEPT)),
            be.view(&grads.d_wh),
            params.grad_mut(self.weight),
        );
        need_d_in.then(|| be.matmul_nt(be.view(&grads.d_wh), params.view(self.weight)))
    }
}
