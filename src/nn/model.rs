//! A whole GNN: `layers` layers of one kind over per-layer blocks, with explicit backward.

use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};

use super::gat::GatConv;
use super::gcn::GcnConv;
use super::init::InitKind;
use super::layer::{Conv, DropoutCtx, Layer, LayerCache, NextDropout};
use super::linear::Linear;
use super::norm::{LayerNorm, NormKind};
use super::params::ParamStore;
use super::sage::SageConv;
use super::transposes::TransposePlan;
use crate::backend::cpu::dropout::derive_stream;
use crate::backend::{Activation, Backend, Cpu};

pub use crate::kinds::ModelKind;

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
    /// Drop probability on the input of every layer but the first, in `[0, 1)`.
    pub dropout: f32,
    /// Drop probability on the first layer's input (the features, or their projection), in
    /// `[0, 1)`.
    pub input_dropout: f32,
    /// GAT hidden layers: concatenate the heads (`heads·hidden` columns) or average them
    /// (`hidden` columns). The output layer always averages, so it has `out_dim` columns.
    pub gat_concat: bool,
    /// Residual connections on the hidden → hidden layers (every layer but the first and the
    /// last): `out_v = h_v + layer(h)_v`.
    #[serde(default)]
    pub residual: bool,
    /// Normalisation of the input of every layer that reads hidden rows (all but the first,
    /// the output layer included, like the final norm before the output of the published
    /// heterophilous-benchmark models).
    #[serde(default)]
    pub norm: NormKind,
    /// A per-row linear projection of the input features to `hidden` inside the first layer,
    /// whose convolution is then hidden → hidden (with norm and residual as configured).
    #[serde(default)]
    pub input_proj: bool,
    /// The output layer is a per-row linear layer on the destinations' own rows instead of a
    /// convolution (the last block then only supplies its destinations).
    #[serde(default)]
    pub linear_output: bool,
    /// How the weights and biases start.
    #[serde(default)]
    pub init: InitKind,
}

impl ModelConfig {
    /// `layers` layers of `kind` without residuals, norms, input projection or linear output;
    /// one head (GAT's hidden heads concatenated).
    pub fn plain(
        kind: ModelKind,
        in_dim: usize,
        hidden: usize,
        out_dim: usize,
        layers: usize,
        dropout: f32,
    ) -> ModelConfig {
        ModelConfig {
            kind,
            in_dim,
            hidden,
            out_dim,
            layers,
            heads: 1,
            dropout,
            input_dropout: dropout,
            gat_concat: true,
            residual: false,
            norm: NormKind::None,
            input_proj: false,
            linear_output: false,
            init: InitKind::Glorot,
        }
    }

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
            !self.residual || self.layers >= 3 || (self.input_proj && self.layers >= 2),
            "model: residual needs at least 3 layers, or 2 with input_proj (the first layer \
             without a projection and the output layer change the width and have none), got {}",
            self.layers
        );
        ensure!(
            !self.linear_output || self.layers >= 2,
            "model: linear_output needs at least 2 layers (one layer would ignore the graph)"
        );
        ensure!(
            !self.input_proj || self.layers >= 2,
            "model: input_proj needs at least 2 layers (the output layer has no projection)"
        );
        ensure!(
            self.norm == NormKind::None || self.layers >= 2,
            "model: norm {} needs at least 2 layers (the first layer reads the raw features \
             and is not normalised)",
            self.norm
        );
        ensure!(
            self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout),
            "model: dropout must be in [0, 1), got {}",
            self.dropout
        );
        ensure!(
            self.input_dropout.is_finite() && (0.0..1.0).contains(&self.input_dropout),
            "model: input_dropout must be in [0, 1), got {}",
            self.input_dropout
        );
        self.check_fits(crate::util::rss::available_memory_mb())
    }

    /// A lower bound on the parameter count: the convolutions' weight matrices alone (a SAGE
    /// layer has two, biases, norms and attention vectors come on top). Exact arithmetic in
    /// `f64`, so that absurd widths do not overflow.
    pub fn min_parameters(&self) -> f64 {
        let (in_dim, out_dim, hidden) =
            (self.in_dim as f64, self.out_dim as f64, self.hidden as f64);
        let heads = if self.kind == ModelKind::Gat {
            self.heads as f64
        } else {
            1.0
        };
        if self.layers == 1 {
            return in_dim * out_dim * heads;
        }
        // Hidden rows are `heads · hidden` wide under GAT's concatenation.
        let width = if self.kind == ModelKind::Gat && self.gat_concat {
            heads * hidden
        } else {
            hidden
        };
        in_dim * heads * hidden
            + (self.layers - 2) as f64 * width * heads * hidden
            + width * out_dim
    }

    /// Refuse a model whose parameters, gradients and Adam's two moments (4 × 4 bytes a
    /// parameter, at least) cannot fit in `available_mb` (`MemAvailable`, or a cgroup limit's
    /// room; not checked where unknown): the allocation would abort the process with no word of
    /// which setting did it.
    fn check_fits(&self, available_mb: Option<f64>) -> Result<()> {
        let params = self.min_parameters();
        // `as` saturates: an absurd count asks for u64::MAX bytes, still refused.
        crate::util::rss::check_fits((params * 16.0) as u64, available_mb, || {
            format!(
                "model: `hidden` = {}, `layers` = {}{} over {} input features and {} classes \
                 make at least {params:.3e} parameters; with their gradients and Adam's \
                 moments the model",
                self.hidden,
                self.layers,
                if self.kind == ModelKind::Gat {
                    format!(", `heads` = {}", self.heads)
                } else {
                    String::new()
                },
                self.in_dim,
                self.out_dim,
            )
        })
    }
}

/// Parameters and layers of a model, the parameters on backend `B`.
#[derive(Debug)]
pub struct Model<B: Backend = Cpu> {
    pub cfg: ModelConfig,
    pub params: ParamStore<B>,
    pub layers: Vec<Layer>,
}

impl Clone for Model<Cpu> {
    fn clone(&self) -> Self {
        Model {
            cfg: self.cfg.clone(),
            params: self.params.clone(),
            layers: self.layers.clone(),
        }
    }
}

impl PartialEq for Model<Cpu> {
    fn eq(&self, other: &Self) -> bool {
        self.cfg == other.cfg && self.params == other.params && self.layers == other.layers
    }
}

/// What [`Model::forward`] keeps for [`Model::backward`].
#[derive(Debug)]
pub struct ForwardCache<B: Backend = Cpu> {
    layers: Vec<LayerCache<B>>,
}

impl Model<Cpu> {
    /// Build the layers and initialise the parameters from `seed` (Glorot weights, zero biases).
    ///
    /// Also tunes the allocator once per process to reuse freed memory across steps
    /// ([`crate::backend::cpu::memory::keep_freed_memory`]): training re-allocates the same large
    /// matrices every mini-batch, and fresh pages are slow to fault in.
    pub fn new(cfg: ModelConfig, seed: u64) -> Result<Model> {
        cfg.validate()?;
        crate::backend::cpu::memory::keep_freed_memory();
        let mut params = ParamStore::new();
        let mut layers = Vec::with_capacity(cfg.layers);
        let mut in_dim = cfg.in_dim;
        // Width of the hidden rows between layers.
        let hidden_width = match cfg.kind {
            ModelKind::Gat if cfg.gat_concat => cfg.heads * cfg.hidden,
            _ => cfg.hidden,
        };
        for l in 0..cfg.layers {
            let last = l + 1 == cfg.layers;
            let out = if last { cfg.out_dim } else { cfg.hidden };
            let prefix = format!("layers.{l}");
            let seed = derive_stream(seed, l as u64);
            // With an input projection the first layer's convolution reads hidden rows.
            let input = (l == 0 && cfg.input_proj).then(|| {
                let seed = derive_stream(seed, 0x0069_6e70_7574);
                Linear::new(
                    &mut params,
                    &format!("{prefix}.input"),
                    in_dim,
                    hidden_width,
                    cfg.init,
                    seed,
                )
            });
            let conv_in = match &input {
                Some(p) => p.out_dim,
                None => in_dim,
            };
            in_dim = conv_in;
            debug_assert!(input.is_none() || in_dim == hidden_width);
            let dense = |params: &mut ParamStore| {
                Conv::Dense(Linear::new(params, &prefix, in_dim, out, cfg.init, seed))
            };
            let conv = match cfg.kind {
                // A per-row output layer: the logits read only the destination's own row.
                _ if last && cfg.linear_output => dense(&mut params),
                ModelKind::Sage => Conv::Sage(SageConv::new(
                    &mut params,
                    &prefix,
                    in_dim,
                    out,
                    cfg.init,
                    seed,
                )),
                ModelKind::Gcn => Conv::Gcn(GcnConv::new(
                    &mut params,
                    &prefix,
                    in_dim,
                    out,
                    cfg.init,
                    seed,
                )),
                ModelKind::Mlp => dense(&mut params),
                ModelKind::Gat => {
                    let concat = !last && cfg.gat_concat;
                    Conv::Gat(GatConv::new(
                        &mut params,
                        &prefix,
                        in_dim,
                        out,
                        cfg.heads,
                        concat,
                        cfg.init,
                        seed,
                    ))
                }
            };
            let activation = (!last).then_some(match cfg.kind {
                ModelKind::Gat => Activation::Elu { alpha: 1.0 },
                _ => Activation::Relu,
            });
            // The first layer reads the input features: no norm (they are the data), and no
            // residual (features → hidden changes the width) unless it projects them to
            // hidden rows first; the output layer changes the width too.
            let reads_hidden = l > 0 || input.is_some();
            let norm = (reads_hidden && cfg.norm == NormKind::Layer)
                .then(|| LayerNorm::new(&mut params, &format!("{prefix}.norm"), in_dim));
            let residual = cfg.residual && reads_hidden && !last;
            debug_assert!(!residual || conv.in_dim() == conv.out_dim());
            in_dim = conv.out_dim();
            layers.push(Layer {
                index: l,
                conv,
                dropout: if l == 0 {
                    cfg.input_dropout
                } else {
                    cfg.dropout
                },
                activation,
                input,
                norm,
                residual,
            });
        }
        Ok(Model {
            cfg,
            params,
            layers,
        })
    }

    /// The same model with its parameters on `backend`.
    pub fn to_backend<B: Backend>(&self, backend: B) -> Model<B> {
        Model {
            cfg: self.cfg.clone(),
            params: self.params.to_backend(backend),
            layers: self.layers.clone(),
        }
    }
}

impl<B: Backend> Model<B> {
    /// Logits for the destinations of the last block (see [`Model::forward`]) from sparse
    /// input rows `x` (`blocks[0].num_src()` rows): the first layer multiplies only the
    /// non-zeros. A caller that keeps its features as CSR
    /// ([`CsrMatrix::from_dense`] once, [`CsrMatrix::gather_rows`] per mini-batch) skips the
    /// dense gather and the conversion that [`Model::forward`] does on sparse data.
    pub fn forward_sparse(
        &self,
        blocks: &[&B::Graph],
        x: &B::Sparse,
        ctx: &DropoutCtx,
    ) -> (B::Mat, ForwardCache<B>) {
        self.check_blocks(blocks);
        if !self.layers[0].conv.supports_sparse() {
            let be = self.params.backend();
            let dense = be.sparse_to_dense(x);
            return self.forward(blocks, be.view(&dense), ctx);
        }
        let (first, cache) = self.layers[0].forward_sparse(&self.params, blocks[0], x, ctx);
        self.forward_rest(blocks, first, cache, None, ctx)
    }

    /// One block per layer (a caller bug otherwise).
    fn check_blocks(&self, blocks: &[&B::Graph]) {
        assert_eq!(
            blocks.len(),
            self.layers.len(),
            "model has {} layers but got {} blocks",
            self.layers.len(),
            blocks.len()
        );
    }

    /// Layers `1..` after the first layer gave `h` (and its cache, and `kept` when it applied
    /// layer 1's input dropout).
    fn forward_rest(
        &self,
        blocks: &[&B::Graph],
        mut h: B::Mat,
        first: LayerCache<B>,
        mut kept: Option<B::Kept>,
        ctx: &DropoutCtx,
    ) -> (B::Mat, ForwardCache<B>) {
        let mut caches = Vec::with_capacity(self.layers.len());
        caches.push(first);
        for (l, (layer, block)) in self.layers.iter().zip(blocks).enumerate().skip(1) {
            let then = self.dropout_above(l, blocks, ctx);
            let (out, cache, above) =
                layer.forward_owned_then(&self.params, block, h, kept, ctx, then.as_ref());
            caches.push(cache);
            h = out;
            kept = above;
        }
        (h, ForwardCache { layers: caches })
    }

    /// The input dropout of layer `l + 1`, offered to layer `l`'s product so that the output
    /// is masked as it is stored instead of in another pass.
    /// (Not built for a layer whose product cannot take it: the seeds would go unused.)
    fn dropout_above(
        &self,
        l: usize,
        blocks: &[&B::Graph],
        ctx: &DropoutCtx,
    ) -> Option<NextDropout> {
        if !self.layers[l].may_apply_dropout_above() {
            return None;
        }
        let (above, g) = (self.layers.get(l + 1)?, blocks.get(l + 1)?);
        above.dropout_for_below(self.params.backend().block(g), ctx)
    }

    /// Logits for the destinations of the last block (`blocks[L-1].num_dst × out_dim`), from
    /// `x` (`blocks[0].num_src() × in_dim`). Full-batch training passes the same block L times.
    ///
    /// Mostly-zero input (bag-of-words features, on a backend with a sparse path) is converted
    /// to sparse rows and takes [`Model::forward_sparse`]'s path.
    ///
    /// # Panics
    /// If the blocks do not chain (`blocks[l].num_src() != blocks[l-1].num_dst`) or the
    /// shapes do not match the model (caller bugs).
    pub fn forward(
        &self,
        blocks: &[&B::Graph],
        x: B::View<'_>,
        ctx: &DropoutCtx,
    ) -> (B::Mat, ForwardCache<B>) {
        self.forward_from(blocks, x, ctx, true)
    }

    /// [`Model::forward`] on input rows that the caller knows take the dense path (it made
    /// [`Backend::sparse_from_dense`]'s test from the rows' non-zero counts, without the rows):
    /// the same result, without the test, which on a device is a count kernel and a wait.
    pub fn forward_dense(
        &self,
        blocks: &[&B::Graph],
        x: B::View<'_>,
        ctx: &DropoutCtx,
    ) -> (B::Mat, ForwardCache<B>) {
        self.forward_from(blocks, x, ctx, false)
    }

    /// [`Model::forward`]; `test_sparse`: the first layer tests `x` for its sparse path.
    fn forward_from(
        &self,
        blocks: &[&B::Graph],
        x: B::View<'_>,
        ctx: &DropoutCtx,
        test_sparse: bool,
    ) -> (B::Mat, ForwardCache<B>) {
        self.check_blocks(blocks);
        let then = self.dropout_above(0, blocks, ctx);
        let (params, g, first) = (&self.params, blocks[0], &self.layers[0]);
        let (h, cache, kept) = if test_sparse {
            first.forward_input_then(params, g, x, ctx, then.as_ref())
        } else {
            first.forward_then(params, g, x, ctx, then.as_ref())
        };
        self.forward_rest(blocks, h, cache, kept, ctx)
    }

    /// Which blocks this model's backward reads transposed ([`TransposePlan`]).
    pub fn transpose_plan(&self) -> TransposePlan {
        TransposePlan::of(self.layers.iter().map(|l| l.transpose_rule(l.index > 0)))
    }

    /// Accumulate the gradient of the loss into `params.grads`, given `d_out` = d loss / d
    /// logits. Transposed CSRs are built once per distinct block.
    pub fn backward(&mut self, blocks: &[&B::Graph], cache: ForwardCache<B>, d_out: B::Mat) {
        let transposes: Vec<B::Transpose> = blocks.iter().map(|_| Default::default()).collect();
        self.backward_with(blocks, &transposes, cache, d_out);
    }

    /// [`Model::backward`] with a transpose per block, some built ahead
    /// ([`Backend::transpose_of`]); the others are built on first use.
    pub fn backward_with(
        &mut self,
        blocks: &[&B::Graph],
        transposes: &[B::Transpose],
        cache: ForwardCache<B>,
        d_out: B::Mat,
    ) {
        self.check_blocks(blocks);
        assert_eq!(transposes.len(), blocks.len(), "one transpose per block");
        // Full-batch training passes one block to every layer: share its transpose.
        let owner: Vec<usize> = (0..blocks.len())
            .map(|l| {
                (0..l)
                    .find(|&k| std::ptr::eq(blocks[k], blocks[l]))
                    .unwrap_or(l)
            })
            .collect();
        let mut d = d_out;
        let mut caches = cache.layers;
        for l in (0..blocks.len()).rev() {
            let layer_cache = caches.pop().expect("one cache per layer");
            let layer = &self.layers[l];
            let t = &transposes[owner[l]];
            // The ReLU backward of the layer below rides on this layer's input-dropout pass
            // (one pass over the gradient instead of two) when both sides allow it.
            let below_relu = match (l.checked_sub(1), caches.last()) {
                (Some(b), Some(below)) if layer.fuses_relu_below(&layer_cache) => {
                    self.layers[b].relu_bits(below)
                }
                _ => None,
            };
            let fused = below_relu.is_some();
            let next = layer.backward_fused(
                &mut self.params,
                blocks[l],
                t,
                layer_cache,
                d,
                l > 0,
                below_relu,
            );
            if fused {
                caches.last_mut().expect("layer below").clear_activation();
            }
            match next {
                Some(next) => d = next,
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::aggregate::LazyTranspose;
    use crate::backend::cpu::dropout::mix64;
    use crate::backend::cpu::sparse::prefers_sparse;
    use crate::nn::cross_entropy;
    use crate::nn::layer::ConvCache;
    use crate::nn::sage::SageCache;
    use crate::sample::Block;
    use ndarray::Array2;

    /// `min_parameters` never exceeds the parameters a model really has, for every kind and
    /// option, so the memory check refuses no model that fits; and it refuses absurd widths.
    #[test]
    fn the_parameter_bound_is_a_lower_bound_and_refuses_absurd_widths() {
        for kind in [
            ModelKind::Sage,
            ModelKind::Gcn,
            ModelKind::Gat,
            ModelKind::Mlp,
        ] {
            for layers in 1..=4 {
                for (input_proj, linear_output, concat, heads) in [
                    (false, false, true, 1),
                    (false, false, true, 3),
                    (false, false, false, 3),
                    (true, true, true, 2),
                ] {
                    let cfg = ModelConfig {
                        input_proj: input_proj && layers >= 2,
                        linear_output: linear_output && layers >= 2,
                        gat_concat: concat,
                        heads,
                        ..ModelConfig::plain(kind, 9, 6, 4, layers, 0.0)
                    };
                    let real = Model::new(cfg.clone(), 1).unwrap().params.values.len() as f64;
                    assert!(
                        cfg.min_parameters() <= real,
                        "{cfg:?}: {} > {real}",
                        cfg.min_parameters()
                    );
                    assert!(cfg.min_parameters() > 0.0);
                }
            }
        }
        let huge = ModelConfig::plain(ModelKind::Sage, 16, 100_000_000_000, 4, 3, 0.0);
        let e = huge.check_fits(Some(24_000.0)).unwrap_err().to_string();
        assert!(
            e.contains("`hidden` = 100000000000") && e.contains("MiB"),
            "{e}"
        );
        assert!(
            huge.check_fits(None).is_ok(),
            "unknown memory is not checked"
        );
        let fine = ModelConfig::plain(ModelKind::Sage, 4714, 1024, 4, 3, 0.0);
        assert!(fine.check_fits(Some(1_000.0)).is_ok());
    }

    /// `init` reaches every layer's weights and biases (the input projection and a linear
    /// output layer included): fan-in starts every bias off zero and keeps weights within
    /// `1/√fan_in`; Glorot leaves the biases at zero. Norm gains and biases start at 1 and 0
    /// either way.
    #[test]
    fn the_init_kind_reaches_every_layer() {
        for kind in [
            ModelKind::Sage,
            ModelKind::Gcn,
            ModelKind::Gat,
            ModelKind::Mlp,
        ] {
            let cfg = ModelConfig {
                input_proj: true,
                linear_output: kind != ModelKind::Mlp,
                residual: true,
                norm: NormKind::Layer,
                init: InitKind::FanIn,
                ..ModelConfig::plain(kind, 9, 16, 3, 3, 0.5)
            };
            let fan_in = Model::new(cfg.clone(), 4).unwrap();
            let glorot = Model::new(
                ModelConfig {
                    init: InitKind::Glorot,
                    ..cfg
                },
                4,
            )
            .unwrap();
            let p = &fan_in.params;
            let mut biases = 0;
            for (i, e) in p.entries.iter().enumerate() {
                let values = p.view(i);
                if e.name.contains(".norm.") || e.name.contains(".att_") {
                    assert_eq!(values, glorot.params.view(i), "{kind} {}", e.name);
                } else if e.name.ends_with(".bias") {
                    biases += 1;
                    assert!(values.iter().all(|&v| v != 0.0), "{kind} {}", e.name);
                    assert!(glorot.params.view(i).iter().all(|&v| v == 0.0));
                } else {
                    let limit = 1.0 / (e.shape[0] as f32).sqrt();
                    assert!(values.iter().all(|v| v.abs() <= limit), "{kind} {}", e.name);
                    assert_ne!(values, glorot.params.view(i), "{kind} {}", e.name);
                }
            }
            // Input projection and three layers.
            assert_eq!(biases, 4, "{kind}");
        }
    }

    fn hash(salt: u64, i: usize) -> u64 {
        mix64(salt ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// A training step's dropout context on stream `stream`, ids as given.
    fn training(stream: u64) -> DropoutCtx<'static> {
        DropoutCtx::training(stream)
    }

    /// `nd` destinations among `ns` sources, 0–4 random in-edges each.
    fn block(nd: usize, ns: usize, salt: u64) -> Block {
        let (mut indptr, mut indices) = (vec![0], Vec::new());
        for i in 0..nd {
            for e in 0..hash(salt, i) % 5 {
                indices.push((hash(salt + 1, i * 8 + e as usize) % ns as u64) as u32);
            }
            indptr.push(indices.len());
        }
        Block {
            num_dst: nd,
            src_nodes: (0..ns as u32).map(|v| 3 * v + 1).collect(),
            indptr,
            indices,
        }
    }

    /// A model's plan ([`Model::transpose_plan`]) names exactly the transposes its backward
    /// reads, so a prefetch worker builds those ahead and no others: every model, with and
    /// without an input projection, norm and residual, dense and sparse input rows, on blocks
    /// where SAGE and GCN take each of their forms (aggregate or project first). Every
    /// gradient is wider than the CPU's scatter limit, so the CPU reads a transpose wherever a
    /// device would.
    #[test]
    fn the_transpose_plan_names_the_transposes_a_backward_reads() {
        let (features, hidden, classes) = (12, 32, 20);
        // Many edges per destination over few more sources make the output layer (hidden →
        // classes, narrowing) project first; the other layers widen or keep the width and
        // aggregate first.
        let mut dense_top = block(6, 8, 36);
        dense_top.indptr = (0..=6).map(|v| v * 60).collect();
        dense_top.indices = (0..360).map(|e| (hash(37, e) % 8) as u32).collect();
        let shapes = [
            [block(40, 90, 31), block(16, 40, 32), block(6, 16, 33)],
            [block(40, 90, 34), block(8, 40, 35), dense_top],
        ];
        let mut forms = [0usize; 2];
        for blocks in &shapes {
            let refs: Vec<&Block> = blocks.iter().collect();
            let x = Array2::from_shape_fn((blocks[0].num_src(), features), |(i, j)| {
                // Mostly zeros, so the sparse path takes them as they are.
                let h = hash(5, i * features + j);
                if h.is_multiple_of(4) {
                    (h >> 40) as f32 / (1u64 << 24) as f32
                } else {
                    0.0
                }
            });
            let sparse = crate::backend::CsrMatrix::from_dense(x.view());
            let labels: Vec<i64> = (0..blocks[2].num_dst as i64).map(|i| i % 3).collect();
            for kind in [
                ModelKind::Sage,
                ModelKind::Gcn,
                ModelKind::Gat,
                ModelKind::Mlp,
            ] {
                for (input_proj, norm, residual) in [
                    (false, NormKind::None, false),
                    (true, NormKind::None, false),
                    (false, NormKind::Layer, true),
                ] {
                    let cfg = ModelConfig {
                        input_proj,
                        norm,
                        residual,
                        ..ModelConfig::plain(kind, features, hidden, classes, 3, 0.3)
                    };
                    let mut model = Model::new(cfg, 4).unwrap();
                    let plan = model.transpose_plan();
                    for sparse_input in [false, true] {
                        let takes_sparse = sparse_input && model.layers[0].takes_sparse_input();
                        let (y, cache) = if takes_sparse {
                            model.forward_sparse(&refs, &sparse, &training(2))
                        } else {
                            model.forward(&refs, x.view(), &training(2))
                        };
                        let (_, d) = cross_entropy(&y, &labels);
                        let transposes: Vec<LazyTranspose> =
                            refs.iter().map(|_| LazyTranspose::default()).collect();
                        model.backward_with(&refs, &transposes, cache, d);
                        for (l, t) in transposes.iter().enumerate() {
                            assert_eq!(
                                t.is_built(),
                                plan.reads(l, &blocks[l], takes_sparse),
                                "{kind} proj {input_proj} norm {norm:?} sparse {takes_sparse} \
                                 layer {l}"
                            );
                        }
                    }
                }
            }
            let widths = [(features, hidden), (hidden, hidden), (hidden, classes)];
            for (b, (i, o)) in blocks.iter().zip(widths) {
                forms[crate::nn::transposes::aggregate_first(b, i, o) as usize] += 1;
            }
        }
        assert!(forms[0] > 0 && forms[1] > 0, "both forms occur: {forms:?}");
    }

    /// A model's forward lets a hidden layer's product apply the input dropout of the layer
    /// above, and its backward applies a hidden layer's ReLU backward inside the input-dropout
    /// pass of the layer above, when the widths are whole words: logits and gradients equal
    /// those of the layers' own passes, chained without fusion.
    #[test]
    fn fused_model_passes_match_the_layer_by_layer_chain() {
        let blocks = [block(40, 90, 21), block(16, 40, 22), block(6, 16, 23)];
        let refs: Vec<&Block> = blocks.iter().collect();
        for kind in [
            ModelKind::Sage,
            ModelKind::Gcn,
            ModelKind::Gat,
            ModelKind::Mlp,
        ] {
            let cfg = ModelConfig::plain(kind, 12, 64, 3, 3, 0.4);
            let ctx = training(8);
            let x = Array2::from_shape_fn((90, 12), |(i, j)| {
                (hash(3, i * 12 + j) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            });
            let labels: Vec<i64> = (0..6).map(|i| i % 3).collect();
            let mut fused = Model::new(cfg, 4).unwrap();
            let mut chained = fused.clone();
            let (y, cache) = fused.forward(&refs, x.view(), &ctx);
            let (_, d) = cross_entropy(&y, &labels);
            if matches!(kind, ModelKind::Sage | ModelKind::Gcn) {
                // Their hidden layers qualify (GAT's ELU does not), so the fused path is the
                // one under test.
                assert!(fused.layers[1].fuses_relu_below(&cache.layers[1]), "{kind}");
                assert!(
                    fused.layers[0].relu_bits(&cache.layers[0]).is_some(),
                    "{kind}"
                );
            }
            if kind == ModelKind::Sage {
                // SAGE's products take the next layer's dropout.
                let then = fused.layers[1]
                    .dropout_for_below(refs[1], &ctx)
                    .expect("plain");
                let (_, _, kept) = fused.layers[0].forward_then(
                    &fused.params,
                    refs[0],
                    x.view(),
                    &ctx,
                    Some(&then),
                );
                assert!(kept.is_some());
            }
            fused.backward(&refs, cache, d.clone());
            let mut h = x.clone();
            let mut caches = Vec::new();
            for (l, layer) in chained.layers.iter().enumerate() {
                let (out, c) = layer.forward(&chained.params, refs[l], h.view(), &ctx);
                caches.push(c);
                h = out;
            }
            assert_eq!(h, y, "{kind}: logits");
            let cache = ForwardCache { layers: caches };
            let mut g = d.clone();
            for (l, c) in cache.layers.into_iter().enumerate().rev() {
                let layer = &chained.layers[l];
                let t = LazyTranspose::default();
                match layer.backward_owned(&mut chained.params, refs[l], &t, c, g, l > 0) {
                    Some(next) => g = next,
                    None => break,
                }
            }
            assert!(fused.params.grads.iter().any(|&g| g != 0.0));
            assert_eq!(fused.params.grads, chained.params.grads, "{kind}");
        }
    }

    /// `input_dropout` governs the first layer's input only: with it at 0 a training step of
    /// a 1-layer model sees its features unmasked (the evaluation logits), while `dropout`
    /// still masks the input of a second layer.
    #[test]
    fn input_dropout_applies_to_the_first_layer_only() {
        let x = Array2::from_shape_fn((20, 8), |(i, j)| {
            hash(3, i * 8 + j) as f32 / u64::MAX as f32
        });
        let b0 = block(6, 20, 21);
        let eval = DropoutCtx {
            training: false,
            ..training(1)
        };
        for kind in [
            ModelKind::Sage,
            ModelKind::Gcn,
            ModelKind::Gat,
            ModelKind::Mlp,
        ] {
            let mut cfg = ModelConfig::plain(kind, 8, 16, 3, 1, 0.5);
            cfg.input_dropout = 0.0;
            let model = Model::new(cfg.clone(), 2).unwrap();
            let (trained, _) = model.forward(&[&b0], x.view(), &training(7));
            let (evaluated, _) = model.forward(&[&b0], x.view(), &eval);
            assert_eq!(trained, evaluated, "{kind}: first layer's input was masked");
            cfg.input_dropout = 0.5;
            let model = Model::new(cfg, 2).unwrap();
            let (trained, _) = model.forward(&[&b0], x.view(), &training(7));
            assert_ne!(trained, evaluated, "{kind}: input dropout 0.5 did nothing");
            let cfg = ModelConfig {
                input_dropout: 0.0,
                ..ModelConfig::plain(kind, 8, 16, 3, 2, 0.5)
            };
            let model = Model::new(cfg, 2).unwrap();
            let dropouts: Vec<f32> = model.layers.iter().map(|l| l.dropout).collect();
            assert_eq!(dropouts, [0.0, 0.5], "{kind}");
        }
    }

    /// An inference pass (`DropoutCtx::inference`) gives the evaluation's logits bit for bit
    /// and keeps no copy of its input for a backward pass; a backward pass after one fails
    /// loudly instead of computing gradients from nothing.
    #[test]
    fn inference_gives_the_eval_logits_and_keeps_no_input() {
        let x = Array2::from_shape_fn((24, 64), |(i, j)| {
            hash(5, i * 64 + j) as f32 / u64::MAX as f32
        });
        // Many edges into few sources: every convolution projects first (and so would copy
        // its input into the cache).
        let b0 = block(20, 24, 31);
        assert!(!crate::nn::transposes::aggregate_first(&b0, 64, 3));
        for kind in [
            ModelKind::Sage,
            ModelKind::Gcn,
            ModelKind::Gat,
            ModelKind::Mlp,
        ] {
            for input_proj in [false, true] {
                let layers = if input_proj { 2 } else { 1 };
                let b1 = block(20, 20, 32);
                let blocks: Vec<&Block> = [&b0, &b1][..layers].to_vec();
                let cfg = ModelConfig {
                    input_proj,
                    ..ModelConfig::plain(kind, 64, 3, 3, layers, 0.5)
                };
                let model = Model::new(cfg, 4).unwrap();
                let (evaluated, _) = model.forward(&blocks, x.view(), &DropoutCtx::eval());
                let (inferred, cache) = model.forward(&blocks, x.view(), &DropoutCtx::inference());
                assert_eq!(evaluated, inferred, "{kind}, input_proj {input_proj}");
                let kept_input = match cache.layers[0].conv_cache() {
                    ConvCache::Sage(SageCache::ProjectFirst { h_in }) => Some(h_in.is_some()),
                    ConvCache::Dense(x) => Some(x.is_some()),
                    _ => None,
                };
                if matches!(kind, ModelKind::Sage | ModelKind::Mlp) && !input_proj {
                    assert_eq!(kept_input, Some(false), "{kind}: the input was kept");
                }
                let mut model = model;
                let d = Array2::<f32>::ones((blocks[layers - 1].num_dst, 3));
                let backward = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    model.backward(&blocks, cache, d)
                }));
                let message = backward.expect_err("a backward after inference ran");
                let text = message
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| message.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                assert!(text.contains("inference"), "{kind}: {text}");
            }
        }
    }

    /// Without dropout, a layer given its input by value (every layer above the first in a
    /// model's forward) keeps those rows for its backward pass instead of a copy: outputs and
    /// gradients are bit for bit those of the layers given views.
    #[test]
    fn layers_given_their_input_by_value_without_dropout_train_as_given_views() {
        let x = Array2::from_shape_fn((24, 64), |(i, j)| {
            hash(9, i * 64 + j) as f32 / u64::MAX as f32
        });
        let (b0, b1) = (block(20, 24, 41), block(18, 20, 42));
        // The second layer projects first, so its cache keeps its input.
        assert!(!crate::nn::transposes::aggregate_first(&b1, 16, 3));
        let blocks = [&b0, &b1];
        let d = Array2::from_shape_fn((18, 3), |(i, j)| (i * 3 + j) as f32 / 50.0 - 0.5);
        for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
            let model = Model::new(ModelConfig::plain(kind, 64, 16, 3, 2, 0.0), 6).unwrap();
            let ctx = training(3);
            let (y_owned, owned) = model.forward(&blocks, x.view(), &ctx);
            if kind == ModelKind::Sage {
                assert!(matches!(
                    owned.layers[1].conv_cache(),
                    ConvCache::Sage(SageCache::ProjectFirst { h_in: Some(_) })
                ));
            }
            let (h, c0) = model.layers[0].forward(&model.params, &b0, x.view(), &ctx);
            let (y_view, c1) = model.layers[1].forward(&model.params, &b1, h.view(), &ctx);
            assert_eq!(y_owned, y_view, "{kind}: outputs");
            let (mut a, mut b) = (model.clone(), model);
            a.backward(&blocks, owned, d.clone());
            let viewed = ForwardCache {
                layers: vec![c0, c1],
            };
            b.backward(&blocks, viewed, d.clone());
            assert_eq!(
                a.params.grads_on_host(),
                b.params.grads_on_host(),
                "{kind}: gradients"
            );
        }
    }

    /// The sparse first-layer path (taken automatically for mostly-zero input) gives the
    /// dense path's logits and gradients, with dropout on.
    #[test]
    fn sparse_input_path_matches_dense_path() {
        let x = Array2::from_shape_fn((50, 80), |(i, j)| {
            let h = hash(7, i * 80 + j);
            if h.is_multiple_of(20) {
                (h >> 40) as f32 / (1u64 << 24) as f32 + 0.5
            } else {
                0.0
            }
        });
        assert!(prefers_sparse(x.view()));
        for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Mlp] {
            let (mut b0, mut b1) = (block(20, 50, 11), block(6, 20, 12));
            if kind == ModelKind::Gcn {
                b0 = b0.with_self_loops();
                b1 = b1.with_self_loops();
            }
            let blocks = [&b0, &b1];
            let cfg = ModelConfig::plain(kind, 80, 16, 3, 2, 0.3);
            let ctx = training(5);
            let labels: Vec<i64> = (0..6).map(|i| i % 3).collect();
            let mut sparse = Model::new(cfg, 9).unwrap();
            let mut dense = sparse.clone();
            let (ys, cache) = sparse.forward(&blocks, x.view(), &ctx);
            // (GCN's cache does not show its evaluation order.)
            if kind != ModelKind::Gcn {
                assert!(matches!(
                    cache.layers[0].conv_cache(),
                    crate::nn::layer::ConvCache::DenseSparse(_)
                        | crate::nn::layer::ConvCache::Sage(
                            crate::nn::sage::SageCache::Sparse { .. }
                        )
                ));
            }
            let (_, d) = cross_entropy(&ys, &labels);
            sparse.backward(&blocks, cache, d.clone());
            // The dense path, layer by layer.
            let (h, c0) = dense.layers[0].forward(&dense.params, &b0, x.view(), &ctx);
            let (yd, cache) = dense.forward_rest(&blocks, h, c0, None, &ctx);
            for (a, b) in ys.iter().zip(&yd) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{kind}: {a} vs {b}"
                );
            }
            dense.backward(&blocks, cache, d.clone());
            for (a, b) in sparse.params.grads.iter().zip(&dense.params.grads) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{kind}: {a} vs {b}"
                );
            }
            assert!(sparse.params.grads.iter().any(|&g| g != 0.0));
        }
    }
}
