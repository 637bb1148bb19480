//! A whole GNN: `layers` layers of one kind over per-layer blocks, with explicit backward.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, ensure, Result};
use ndarray::Array2;
use serde::{Deserialize, Serialize};

use super::gat::GatConv;
use super::gcn::GcnConv;
use super::layer::{Conv, DropoutCtx, Layer, LayerCache};
use super::linear::Linear;
use super::params::ParamStore;
use super::sage::SageConv;
use crate::sample::Block;
use crate::tensor::activation::Activation;
use crate::tensor::aggregate::LazyTranspose;
use crate::tensor::dropout::derive_stream;

/// Which convolution the model stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// GraphSAGE, mean aggregator with root weight.
    Sage,
    /// GCN with symmetric normalisation (self-loops are added by the caller).
    Gcn,
    /// GAT, multi-head.
    Gat,
    /// A graph-free MLP on the destination rows (baseline).
    Mlp,
}

impl FromStr for ModelKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<ModelKind> {
        Ok(match s {
            "sage" => ModelKind::Sage,
            "gcn" => ModelKind::Gcn,
            "gat" => ModelKind::Gat,
            "mlp" => ModelKind::Mlp,
            other => bail!("unknown model '{other}' (expected sage, gcn, gat or mlp)"),
        })
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelKind::Sage => "sage",
            ModelKind::Gcn => "gcn",
            ModelKind::Gat => "gat",
            ModelKind::Mlp => "mlp",
        })
    }
}

/// The model's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub kind: ModelKind,
    /// Input feature columns.
    pub in_dim: usize,
    /// Hidden size (per head for GAT).
    pub hidden: usize,
    /// Output columns (classes, or labels for multi-label tasks).
    pub out_dim: usize,
    /// Number of layers (= number of blocks per mini-batch).
    pub layers: usize,
    /// GAT attention heads (ignored by other kinds).
    pub heads: usize,
    /// Drop probability on every layer's input, in `[0, 1)`.
    pub dropout: f32,
    /// GAT hidden layers: concatenate the heads (`heads·hidden` columns) or average them
    /// (`hidden` columns). The output layer always averages, so it has `out_dim` columns.
    pub gat_concat: bool,
}

impl ModelConfig {
    /// Check the shape; errors name the offending field.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.layers >= 1, "model: layers must be at least 1 (got 0)");
        ensure!(
            self.in_dim >= 1,
            "model: in_dim must be at least 1 (the dataset has no features?)"
        );
        ensure!(
            self.out_dim >= 1,
            "model: out_dim must be at least 1 (no classes?)"
        );
        ensure!(
            self.layers == 1 || self.hidden >= 1,
            "model: hidden must be at least 1 for {} layers",
            self.layers
        );
        ensure!(
            self.kind != ModelKind::Gat || self.heads >= 1,
            "model: heads must be at least 1 for gat"
        );
        ensure!(
            self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout),
            "model: dropout must be in [0, 1), got {}",
            self.dropout
        );
        Ok(())
    }
}

/// Parameters and layers of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub cfg: ModelConfig,
    pub params: ParamStore,
    pub layers: Vec<Layer>,
}

/// What [`Model::forward`] keeps for [`Model::backward`].
#[derive(Debug)]
pub struct ForwardCache {
    layers: Vec<LayerCache>,
}

impl Model {
    /// Build the layers and initialise the parameters from `seed` (Glorot weights, zero biases).
    ///
    /// Also tunes the allocator once per process to reuse freed memory across steps
    /// ([`crate::tensor::memory::keep_freed_memory`]): training re-allocates the same large
    /// matrices every mini-batch, and fresh pages are slow to fault in.
    pub fn new(cfg: ModelConfig, seed: u64) -> Result<Model> {
        cfg.validate()?;
        crate::tensor::memory::keep_freed_memory();
        let mut params = ParamStore::new();
        let mut layers = Vec::with_capacity(cfg.layers);
        let mut in_dim = cfg.in_dim;
        for l in 0..cfg.layers {
            let last = l + 1 == cfg.layers;
            let out = if last { cfg.out_dim } else { cfg.hidden };
            let prefix = format!("layers.{l}");
            let seed = derive_stream(seed, l as u64);
            let conv = match cfg.kind {
                ModelKind::Sage => {
                    Conv::Sage(SageConv::new(&mut params, &prefix, in_dim, out, seed))
                }
                ModelKind::Gcn => Conv::Gcn(GcnConv::new(&mut params, &prefix, in_dim, out, seed)),
                ModelKind::Mlp => Conv::Dense(Linear::new(&mut params, &prefix, in_dim, out, seed)),
                ModelKind::Gat => {
                    let concat = !last && cfg.gat_concat;
                    Conv::Gat(GatConv::new(
                        &mut params,
                        &prefix,
                        in_dim,
                        out,
                        cfg.heads,
                        concat,
                        seed,
                    ))
                }
            };
            let activation = (!last).then_some(match cfg.kind {
                ModelKind::Gat => Activation::Elu { alpha: 1.0 },
                _ => Activation::Relu,
            });
            in_dim = conv.out_dim();
            layers.push(Layer {
                index: l,
                conv,
                dropout: cfg.dropout,
                activation,
            });
        }
        Ok(Model {
            cfg,
            params,
            layers,
        })
    }

    /// Logits for the destinations of the last block (`blocks[L-1].num_dst × out_dim`), from
    /// `x` (`blocks[0].num_src() × in_dim`). Full-batch training passes the same block L times.
    ///
    /// # Panics
    /// If the blocks do not chain (`blocks[l].num_src() != blocks[l-1].num_dst`) or the
    /// shapes do not match the model (caller bugs).
    pub fn forward(
        &self,
        blocks: &[&Block],
        x: &Array2<f32>,
        ctx: &DropoutCtx,
    ) -> (Array2<f32>, ForwardCache) {
        assert_eq!(
            blocks.len(),
            self.layers.len(),
            "model has {} layers but got {} blocks",
            self.layers.len(),
            blocks.len()
        );
        let mut caches = Vec::with_capacity(self.layers.len());
        let mut h: Option<Array2<f32>> = None;
        for (layer, block) in self.layers.iter().zip(blocks) {
            let input = h.as_ref().unwrap_or(x);
            let (out, cache) = layer.forward(&self.params, block, input.view(), ctx);
            caches.push(cache);
            h = Some(out);
        }
        (
            h.expect("at least one layer"),
            ForwardCache { layers: caches },
        )
    }

    /// Accumulate the gradient of the loss into `params.grads`, given `d_out` = d loss / d
    /// logits. Transposed CSRs are built once per distinct block.
    pub fn backward(&mut self, blocks: &[&Block], cache: ForwardCache, d_out: &Array2<f32>) {
        assert_eq!(
            blocks.len(),
            self.layers.len(),
            "model has {} layers but got {} blocks",
            self.layers.len(),
            blocks.len()
        );
        // Full-batch training passes one block to every layer: share its transpose.
        let transposes: Vec<LazyTranspose> =
            blocks.iter().map(|_| LazyTranspose::default()).collect();
        let owner: Vec<usize> = (0..blocks.len())
            .map(|l| {
                (0..l)
                    .find(|&k| std::ptr::eq(blocks[k], blocks[l]))
                    .unwrap_or(l)
            })
            .collect();
        let mut d = d_out.clone();
        for (l, layer_cache) in cache.layers.into_iter().enumerate().rev() {
            let layer = &self.layers[l];
            let t = &transposes[owner[l]];
            match layer.backward(&mut self.params, blocks[l], t, layer_cache, d.view(), l > 0) {
                Some(next) => d = next,
                None => break,
            }
        }
    }
}
