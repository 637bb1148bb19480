//! One model layer = [layer norm →] dropout on its input → convolution → activation (hidden
//! layers) [+ residual], with an explicit forward and backward over one [`Block`].
//!
//! The residual adds the destination's own input row (the first `num_dst` source rows of the
//! block) to the layer's output, `out_v = h_v + act(conv(dropout(norm(h))))_v`; it exists only
//! where input and output widths match (hidden → hidden), so a model keeps exactly one layer
//! per block and strategies schedule it unchanged.
//!
//! Strategies that communicate between layers call [`Layer::forward`] / [`Layer::backward`]
//! one layer at a time; [`super::model::Model`] simply chains them.

use super::gat::{GatCache, GatConv};
use super::gcn::{GcnCache, GcnConv};
use super::linear::Linear;
use super::norm::{LayerNorm, NormCache};
use super::params::ParamStore;
use super::sage::{SageCache, SageConv};
use super::transposes::TransposeRule;
use crate::backend::cpu::dropout::derive_stream;
use crate::backend::{Activation, Backend, CowMat, Cpu, DropoutMask, RowDropout};
use crate::sample::Block;

/// How dropout behaves in one forward pass.
#[derive(Clone, Copy, Debug)]
pub struct DropoutCtx<'a> {
    /// Dropout is applied only when training.
    pub training: bool,
    /// Whether a backward pass follows this forward. Where none does (inference), layers keep
    /// nothing for it: a borrowed input is never copied into a cache only to be dropped (a
    /// full-graph evaluation on one rank copied the features or hidden rows it read, 200 MB
    /// a layer on a 200k-vertex graph at width 256, every evaluation).
    pub keep_for_backward: bool,
    /// Key of this step's masks, derived by the caller from (seed, epoch, step); each layer
    /// mixes in its own index.
    pub stream: u64,
    /// Original vertex id of every (relabelled) global id, so masks follow the vertex, not
    /// the partitioning; `None` keys rows by their global id.
    pub orig_ids: Option<&'a [u64]>,
    /// GCN only: the degree `D_u` of every (relabelled) global id in the whole graph (its
    /// neighbour count, +1 with self-loops), so that normalisation does not depend on which
    /// edges a rank's block holds (`TrainData::gcn_degrees`). `None` counts degrees inside the
    /// block (DGL's block convention; unit tests).
    pub gcn_degrees: Option<&'a [u32]>,
}

impl DropoutCtx<'_> {
    /// Evaluation: no dropout, and what a backward pass needs kept (gradient checks run one).
    pub fn eval() -> DropoutCtx<'static> {
        DropoutCtx {
            training: false,
            keep_for_backward: true,
            stream: 0,
            orig_ids: None,
            gcn_degrees: None,
        }
    }

    /// A training step's forward on dropout stream `stream`: masks drawn, and what the
    /// backward pass needs kept.
    pub fn training(stream: u64) -> DropoutCtx<'static> {
        DropoutCtx {
            training: true,
            keep_for_backward: true,
            stream,
            orig_ids: None,
            gcn_degrees: None,
        }
    }

    /// Inference: no dropout and no backward pass, so nothing kept for one.
    pub fn inference() -> DropoutCtx<'static> {
        DropoutCtx {
            keep_for_backward: false,
            ..DropoutCtx::eval()
        }
    }
}

/// The dropout key of each of the first `rows` source rows of `block`.
pub fn row_keys(block: &Block, rows: usize, orig_ids: Option<&[u64]>) -> Vec<u64> {
    let ids = &block.src_nodes[..rows];
    match orig_ids {
        Some(orig) => ids
            .iter()
            .map(|&v| {
                *orig.get(v as usize).unwrap_or_else(|| {
                    panic!("vertex {v} has no original id (table of {})", orig.len())
                })
            })
            .collect(),
        None => ids.iter().map(|&v| v as u64).collect(),
    }
}

/// The convolution of a layer.
#[derive(Clone, Debug, PartialEq)]
pub enum Conv {
    Sage(SageConv),
    Gcn(GcnConv),
    Gat(GatConv),
    /// A graph-free linear layer on the destination rows (the MLP baseline).
    Dense(Linear),
}

/// What a convolution keeps from its forward for its backward.
#[derive(Debug)]
pub enum ConvCache<B: Backend = Cpu> {
    Sage(SageCache<B>),
    Gcn(GcnCache<B>),
    Gat(GatCache<B>),
    /// A dense layer's input (`None` after an inference pass).
    Dense(Option<B::Mat>),
    /// A dense layer's sparse input.
    DenseSparse(B::Sparse),
}

/// A convolution's output, its cache, the activation's saved state when the convolution
/// applied it, and the next layer's kept bits when its product applied that dropout.
pub type ConvForward<B> = (
    <B as Backend>::Mat,
    ConvCache<B>,
    Option<<B as Backend>::Saved>,
    Option<<B as Backend>::Kept>,
);

impl Conv {
    /// Input columns.
    pub fn in_dim(&self) -> usize {
        match self {
            Conv::Sage(c) => c.in_dim,
            Conv::Gcn(c) => c.in_dim,
            Conv::Gat(c) => c.in_dim,
            Conv::Dense(c) => c.in_dim,
        }
    }

    /// Output columns.
    pub fn out_dim(&self) -> usize {
        match self {
            Conv::Sage(c) => c.out_dim,
            Conv::Gcn(c) => c.out_dim,
            Conv::Gat(c) => c.out_dim(),
            Conv::Dense(c) => c.out_dim,
        }
    }

    /// Whether [`Conv::forward_sparse`] accepts sparse input rows.
    pub fn supports_sparse(&self) -> bool {
        !matches!(self, Conv::Gat(_))
    }

    /// [`Conv::forward`] on sparse input rows (`input_rows` of them).
    ///
    /// # Panics
    /// For a convolution without sparse support ([`Conv::supports_sparse`]).
    pub fn forward_sparse<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        x: B::Sparse,
        gcn_degrees: Option<&[u32]>,
    ) -> (B::Mat, ConvCache<B>) {
        match self {
            Conv::Sage(c) => {
                let (z, k) = c.forward_sparse(params, g, x);
                (z, ConvCache::Sage(k))
            }
            Conv::Gcn(c) => {
                let (z, k) = c.forward_sparse(params, g, x, gcn_degrees);
                (z, ConvCache::Gcn(k))
            }
            Conv::Dense(c) => (c.forward_sparse(params, &x), ConvCache::DenseSparse(x)),
            Conv::Gat(_) => panic!("GAT has no sparse-input path"),
        }
    }

    /// How many leading source rows the convolution reads.
    fn input_rows(&self, block: &Block) -> usize {
        match self {
            Conv::Dense(_) => block.num_dst,
            _ => block.num_src(),
        }
    }

    /// `h_in` has `input_rows` rows; the result has `block.num_dst` rows. `gcn_degrees`:
    /// see [`DropoutCtx::gcn_degrees`]; `keep`: see [`DropoutCtx::keep_for_backward`].
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        gcn_degrees: Option<&[u32]>,
        keep: bool,
    ) -> (B::Mat, ConvCache<B>) {
        match self {
            Conv::Sage(c) => {
                let (z, k) = c.forward(params, g, h_in, keep);
                (z, ConvCache::Sage(k))
            }
            Conv::Gcn(c) => {
                let (z, k) = c.forward(params, g, h_in, gcn_degrees, keep);
                (z, ConvCache::Gcn(k))
            }
            Conv::Gat(c) => {
                let (z, k) = c.forward(params, g, h_in, keep);
                (z, ConvCache::Gat(k))
            }
            Conv::Dense(c) => {
                let be = params.backend();
                let z = c.forward(params, h_in.view(be));
                (z, ConvCache::Dense(h_in.kept(be, keep)))
            }
        }
    }

    /// Whether [`Conv::forward_activated`] can apply a following dropout in its product (SAGE
    /// with a fused ReLU; on a project-first block it still declines).
    fn may_apply_dropout(&self, activation: Option<Activation>) -> bool {
        matches!(self, Conv::Sage(_)) && activation == Some(Activation::Relu)
    }

    /// [`Conv::forward`] followed by `activation`, fused into the convolution's product where
    /// it can be (SAGE with ReLU); returns the activation's saved state when it was applied.
    ///
    /// With `then` (the next layer's input dropout) and a fused activation, the product may
    /// mask its output too: it did exactly when the kept bits are returned. From `ctx`: the
    /// GCN degrees and whether a backward pass follows.
    pub fn forward_activated<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        ctx: &DropoutCtx,
        activation: Option<Activation>,
        then: Option<(&RowDropout, &DropoutMask)>,
    ) -> ConvForward<B> {
        let (gcn_degrees, keep) = (ctx.gcn_degrees, ctx.keep_for_backward);
        match self {
            Conv::Sage(c) => {
                let relu = activation == Some(Activation::Relu);
                let (z, k, saved, kept) = c.forward_relu(params, g, h_in, relu, then, keep);
                (z, ConvCache::Sage(k), saved, kept)
            }
            _ => {
                let (z, k) = self.forward(params, g, h_in, gcn_degrees, keep);
                (z, k, None, None)
            }
        }
    }

    /// Accumulate parameter gradients; return d `h_in` (`input_rows` rows) when asked, masked
    /// by the input dropout's `kept` bits when given (SAGE does it while each row is in cache).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        cache: ConvCache<B>,
        dz: B::View<'_>,
        need_d_in: bool,
        kept: Option<&B::Kept>,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        let mut d_in = match (self, cache) {
            // SAGE masks each row inside its transposed mean.
            (Conv::Sage(c), ConvCache::Sage(k)) => {
                return c.backward(params, g, transpose, k, dz, need_d_in, kept);
            }
            (Conv::Gcn(c), ConvCache::Gcn(k)) => c.backward(params, g, transpose, k, dz, need_d_in),
            (Conv::Gat(c), ConvCache::Gat(k)) => c.backward(params, g, transpose, k, dz, need_d_in),
            (Conv::Dense(c), ConvCache::Dense(x)) => {
                let x = x.expect(super::NOT_KEPT);
                c.backward(params, be.view(&x), dz, need_d_in)
            }
            (Conv::Dense(c), ConvCache::DenseSparse(x)) => {
                c.backward_sparse(params, &x, dz, need_d_in)
            }
            _ => panic!("layer cache does not belong to this layer"),
        }?;
        if let Some(kept) = kept {
            be.kept_apply(kept, be.view_mut(&mut d_in));
        }
        Some(d_in)
    }
}

/// One layer: [norm(input) →] dropout → conv → activation [+ input row of the destination].
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Position in the model; mixed into the dropout stream.
    pub index: usize,
    pub conv: Conv,
    /// Drop probability on the layer's input.
    pub dropout: f32,
    /// `None` for the output layer (logits).
    pub activation: Option<Activation>,
    /// Per-row input projection before everything else (the first layer of a model with
    /// `input_proj`): the norm, the convolution and the residual then see projected rows.
    pub input: Option<Linear>,
    /// Pre-normalisation of the input rows (before dropout), when configured.
    pub norm: Option<LayerNorm>,
    /// Add the destination's own (un-normalised) input row to the output; needs
    /// `conv.in_dim() == conv.out_dim()`.
    pub residual: bool,
}

/// A layer's input dropout offered to the layer below ([`Layer::dropout_for_below`]).
#[derive(Clone, Debug)]
pub struct NextDropout {
    mask: DropoutMask,
    /// The mask's seed per input row, for the product's epilogue.
    rows: RowDropout,
}

/// How a layer's backward re-applies its input dropout.
#[derive(Debug)]
enum DropoutSaved<B: Backend> {
    /// The kept bits of a dense input (no hashing in the backward).
    Bits(B::Kept),
    /// The mask and row keys of a sparse input (its gradient is dense: hash again).
    Keys(DropoutMask, Vec<u64>),
}

/// What a layer keeps from its forward for its backward.
#[derive(Debug)]
pub struct LayerCache<B: Backend = Cpu> {
    /// The input rows of the projection, when there is one.
    input: Option<B::Mat>,
    /// What the input normalisation kept, when there is one.
    norm: Option<NormCache<B>>,
    /// How to mask the input gradient, when dropout was applied.
    dropout: Option<DropoutSaved<B>>,
    conv: ConvCache<B>,
    /// What the activation's backward needs, when there is an activation.
    activated: Option<B::Saved>,
    /// `activated` is one sign bit per element (ReLU), which the layer above may apply.
    activated_bits: bool,
}

impl<B: Backend> LayerCache<B> {
    /// What the convolution kept.
    pub fn conv_cache(&self) -> &ConvCache<B> {
        &self.conv
    }

    /// Forget the activation: its backward was applied by the layer above
    /// ([`Layer::backward_fused`]).
    pub fn clear_activation(&mut self) {
        self.activated = None;
        self.activated_bits = false;
    }
}

/// What [`Layer::forward_then`] returns: the output, the cache, and the layer above's kept
/// bits when this layer's product applied its dropout.
pub type LayerForward<B> = (
    <B as Backend>::Mat,
    LayerCache<B>,
    Option<<B as Backend>::Kept>,
);

impl Layer {
    /// A layer without normalisation or residual.
    pub fn plain(index: usize, conv: Conv, dropout: f32, activation: Option<Activation>) -> Layer {
        Layer {
            index,
            conv,
            dropout,
            activation,
            input: None,
            norm: None,
            residual: false,
        }
    }

    /// No input projection, norm or residual: nothing but the convolution reads the input
    /// rows, and nothing is added to the output after the activation.
    fn is_plain(&self) -> bool {
        self.input.is_none() && self.norm.is_none() && !self.residual
    }

    /// This layer's input dropout in training step `ctx` (its stream mixes in the layer's
    /// index).
    pub fn input_dropout(&self, ctx: &DropoutCtx) -> DropoutMask {
        DropoutMask::new(derive_stream(ctx.stream, self.index as u64), self.dropout)
    }

    /// Whether this layer's product may apply the input dropout of the layer above
    /// ([`Layer::forward_then`]): not when a residual is added after the activation.
    pub fn may_apply_dropout_above(&self) -> bool {
        !self.residual && self.conv.may_apply_dropout(self.activation)
    }

    /// Input columns: the projection's when there is one, else the convolution's.
    pub fn in_dim(&self) -> usize {
        self.input.as_ref().map_or(self.conv.in_dim(), |p| p.in_dim)
    }

    /// Map `h_src` (`block.num_src()` rows) to `block.num_dst` rows.
    ///
    /// # Panics
    /// If the shapes do not match the block and the layer (a caller bug).
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_src: B::View<'_>,
        ctx: &DropoutCtx,
    ) -> (B::Mat, LayerCache<B>) {
        let (out, cache, _) = self.forward_then(params, g, h_src, ctx, None);
        (out, cache)
    }

    /// [`Layer::forward`], offering the layer above's input dropout (`then`) to this layer's
    /// product: the output comes back masked exactly when its kept bits come back too (see
    /// [`Model`](super::model::Model)'s forward). A residual, added after the activation, keeps
    /// the dropout out of the product.
    pub fn forward_then<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_src: B::View<'_>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> LayerForward<B> {
        let be = params.backend();
        let block = be.block(g);
        let (in_rows, in_cols) = be.dim(h_src);
        assert_eq!(
            in_rows,
            block.num_src(),
            "layer {}: input has {in_rows} rows but the block has {} sources",
            self.index,
            block.num_src()
        );
        assert_eq!(
            in_cols,
            self.in_dim(),
            "layer {}: input has {in_cols} columns, expected {}",
            self.index,
            self.in_dim()
        );
        if self.residual {
            assert_eq!(
                self.conv.in_dim(),
                self.conv.out_dim(),
                "layer {}: a residual needs equal input and output widths",
                self.index
            );
        }
        let rows = self.conv.input_rows(block);
        let (projected, input) = match &self.input {
            // The projection's backward reads its input rows: a copy of them, unless none follows.
            Some(lin) if ctx.keep_for_backward => {
                let x = be.to_owned(be.rows(h_src, 0..rows));
                (Some(lin.forward(params, be.view(&x))), Some(x))
            }
            Some(lin) => (Some(lin.forward(params, be.rows(h_src, 0..rows))), None),
            None => (None, None),
        };
        // The rows the layer works on: projected, or as given.
        let base = match &projected {
            Some(p) => be.view(p),
            None => be.shorten(be.rows(h_src, 0..rows)),
        };
        let (h, norm) = match &self.norm {
            Some(ln) => {
                let (y, cache) = ln.forward(params, base);
                (CowMat::Owned(y), Some(cache))
            }
            None => (CowMat::Borrowed(base), None),
        };
        let (h_in, dropout) = if ctx.training && self.dropout > 0.0 {
            let mask = self.input_dropout(ctx);
            let keys = row_keys(block, rows, ctx.orig_ids);
            let (h, kept) = be.dropout_recorded(&mask, h.view(be), &keys);
            (CowMat::Owned(h), Some(DropoutSaved::Bits(kept)))
        } else {
            (h, None)
        };
        let then = then.filter(|_| self.may_apply_dropout_above());
        let (z, conv, activated, kept) = self.convolve(params, g, h_in, ctx, then);
        let (mut out, mut cache) = self.finish_forward(be, z, conv, dropout, activated);
        cache.norm = norm;
        cache.input = input;
        if self.residual {
            // The destinations are the first `num_dst` sources: their own input rows.
            be.add_assign(be.view_mut(&mut out), be.rows(base, 0..block.num_dst));
        }
        (out, cache, kept)
    }

    /// [`Layer::forward`] taking the input by value: a plain layer (no input projection,
    /// norm or residual, so nothing else reads the unmasked rows) applies its dropout in place
    /// instead of writing a masked copy, and a convolution that keeps its input for the
    /// backward pass keeps these rows instead of a copy. Bitwise the same result.
    pub fn forward_owned<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_src: B::Mat,
        ctx: &DropoutCtx,
    ) -> (B::Mat, LayerCache<B>) {
        let (out, cache, _) = self.forward_owned_then(params, g, h_src, None, ctx, None);
        (out, cache)
    }

    /// The input dropout of this layer, when the layer below may apply it in its product
    /// ([`Layer::forward_then`]): a plain layer (nothing else reads the unmasked rows) whose
    /// input rows are the block's sources in whole 64-bit words of bits.
    pub fn dropout_for_below(&self, block: &Block, ctx: &DropoutCtx) -> Option<NextDropout> {
        let plain = self.is_plain();
        let rows = self.conv.input_rows(block);
        let fits = rows == block.num_src() && self.in_dim().is_multiple_of(64);
        if !(plain && fits && ctx.training && self.dropout > 0.0) {
            return None;
        }
        let mask = self.input_dropout(ctx);
        let rows = mask.fused(&row_keys(block, rows, ctx.orig_ids))?;
        Some(NextDropout { mask, rows })
    }

    /// [`Layer::forward_owned`] whose input the layer below may already have masked (`kept`:
    /// the bits [`Layer::forward_then`] returned for this layer's [`Layer::dropout_for_below`]),
    /// offering `then` to this layer's own product.
    pub fn forward_owned_then<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        mut h_src: B::Mat,
        kept: Option<B::Kept>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> LayerForward<B> {
        let be = params.backend();
        let block = be.block(g);
        let plain = self.is_plain();
        let (rows, cols) = be.mat_dim(&h_src);
        let whole =
            rows == self.conv.input_rows(block) && rows == block.num_src() && cols == self.in_dim();
        let kept = match kept {
            Some(kept) => {
                assert!(plain && whole, "layer {}: input masked below", self.index);
                Some(kept)
            }
            None if plain && whole && ctx.training && self.dropout > 0.0 => {
                let mask = self.input_dropout(ctx);
                let keys = row_keys(block, rows, ctx.orig_ids);
                Some(be.dropout_recorded_in_place(&mask, be.view_mut(&mut h_src), &keys))
            }
            // No dropout: the convolution takes the rows as they are, and a cache that keeps
            // its input keeps them without a copy.
            None if plain && whole => None,
            None => return self.forward_then(params, g, be.view(&h_src), ctx, then),
        };
        let h_in = CowMat::Owned(h_src);
        let (z, conv, activated, kept_above) = self.convolve(params, g, h_in, ctx, then);
        let (out, cache) =
            self.finish_forward(be, z, conv, kept.map(DropoutSaved::Bits), activated);
        (out, cache, kept_above)
    }

    /// The convolution with this layer's activation, offering `then` to its product; the kept
    /// bits come back when the product applied it.
    fn convolve<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        h_in: CowMat<'_, B>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> ConvForward<B> {
        self.conv.forward_activated(
            params,
            g,
            h_in,
            ctx,
            self.activation,
            then.map(|t| (&t.rows, &t.mask)),
        )
    }

    /// Whether this layer's backward reads its block's transpose; `need_d_src`: the caller
    /// wants the gradient of the layer's input rows (every layer but the first). Mirrors
    /// [`Layer::backward_fused`] and the convolutions' backward passes.
    pub fn transpose_rule(&self, need_d_src: bool) -> TransposeRule {
        // A projection or a norm needs the convolution's input gradient (`backward_fused`).
        let need_d_in = need_d_src || self.input.is_some() || self.norm.is_some();
        let (in_dim, out_dim) = (self.conv.in_dim(), self.conv.out_dim());
        match &self.conv {
            Conv::Dense(_) => TransposeRule::Never,
            Conv::Gat(_) => TransposeRule::Always,
            Conv::Sage(_) | Conv::Gcn(_) if need_d_in => TransposeRule::Always,
            Conv::Sage(_) | Conv::Gcn(_) => TransposeRule::UnlessAggregateFirst { in_dim, out_dim },
        }
    }

    /// Whether this layer multiplies sparse input rows as such: a convolution with a sparse
    /// path, and no normalisation, residual or input projection (those work on dense rows).
    /// The planner prices the input layer by the same test.
    pub fn takes_sparse_input(&self) -> bool {
        self.conv.supports_sparse() && self.norm.is_none() && !self.residual && self.input.is_none()
    }

    /// [`Layer::forward`] on a model's input features: mostly-zero rows (bag-of-words, on a
    /// backend with a sparse path: a function of the data only) take
    /// [`Layer::forward_sparse`]'s path, whose products skip the zeros; other input, or a
    /// convolution without a sparse path, takes the dense one. Every strategy's input layer
    /// calls this, so all take the same path.
    pub fn forward_input<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        x: B::View<'_>,
        ctx: &DropoutCtx,
    ) -> (B::Mat, LayerCache<B>) {
        let (out, cache, _) = self.forward_input_then(params, g, x, ctx, None);
        (out, cache)
    }

    /// [`Layer::forward_input`] offering `then` as [`Layer::forward_then`] does (the sparse
    /// path never takes it).
    pub fn forward_input_then<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        x: B::View<'_>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> LayerForward<B> {
        let be = params.backend();
        if self.takes_sparse_input() {
            if let Some(sparse) = be.sparse_from_dense(x) {
                let (out, cache) = self.forward_sparse(params, g, &sparse, ctx);
                return (out, cache, None);
            }
        }
        self.forward_then(params, g, x, ctx, then)
    }

    /// [`Layer::forward`] on sparse input rows (`block.num_src()` of them, e.g. bag-of-words
    /// features): dropout masks only the stored entries, and the convolution multiplies only
    /// the non-zeros. Same result as the dense path up to rounding.
    ///
    /// A layer that does not [`Layer::takes_sparse_input`] (a normalisation, a residual, an
    /// input projection, or a convolution without a sparse path) takes the dense path.
    ///
    /// # Panics
    /// If the shapes do not match.
    pub fn forward_sparse<B: Backend>(
        &self,
        params: &ParamStore<B>,
        g: &B::Graph,
        x: &B::Sparse,
        ctx: &DropoutCtx,
    ) -> (B::Mat, LayerCache<B>) {
        let be = params.backend();
        if !self.takes_sparse_input() {
            let dense = be.sparse_to_dense(x);
            return self.forward(params, g, be.view(&dense), ctx);
        }
        let block = be.block(g);
        let (x_rows, x_cols) = be.sparse_dim(x);
        assert_eq!(
            x_rows,
            block.num_src(),
            "layer {}: input has {x_rows} rows but the block has {} sources",
            self.index,
            block.num_src()
        );
        assert_eq!(
            x_cols,
            self.conv.in_dim(),
            "layer {}: input has {x_cols} columns, expected {}",
            self.index,
            self.conv.in_dim()
        );
        let rows = self.conv.input_rows(block);
        let mut h = be.sparse_first_rows(x, rows);
        let dropout = (ctx.training && self.dropout > 0.0).then(|| {
            let mask = self.input_dropout(ctx);
            let keys = row_keys(block, rows, ctx.orig_ids);
            be.sparse_dropout_in_place(&mask, &mut h, &keys);
            DropoutSaved::Keys(mask, keys)
        });
        let (z, conv) = self.conv.forward_sparse(params, g, h, ctx.gcn_degrees);
        self.finish_forward(be, z, conv, dropout, None)
    }

    /// The activation after the convolution (unless the convolution applied it: `activated`),
    /// and the cache.
    fn finish_forward<B: Backend>(
        &self,
        be: &B,
        mut z: B::Mat,
        conv: ConvCache<B>,
        dropout: Option<DropoutSaved<B>>,
        activated: Option<B::Saved>,
    ) -> (B::Mat, LayerCache<B>) {
        let activated = activated.or_else(|| {
            self.activation
                .map(|act| be.activation_forward(act, be.view_mut(&mut z)))
        });
        let activated_bits = activated.as_ref().is_some_and(|s| be.saved_is_bits(s));
        (
            z,
            LayerCache {
                input: None,
                norm: None,
                dropout,
                conv,
                activated,
                activated_bits,
            },
        )
    }

    /// Accumulate parameter gradients into `params.grads` from `d_h_dst` (gradient of the
    /// layer's output); return the gradient of `h_src` (`block.num_src()` rows) when
    /// `need_d_src` (the input layer of a model does not need it, which saves a GEMM).
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        cache: LayerCache<B>,
        d_h_dst: B::View<'_>,
        need_d_src: bool,
    ) -> Option<B::Mat> {
        if self.activation.is_none() && !self.residual {
            // Nothing overwrites the gradient before the convolution reads it: no copy.
            return self
                .convolution_backward(params, g, transpose, cache, d_h_dst, need_d_src, None);
        }
        let dz = params.backend().to_owned(d_h_dst);
        self.backward_owned(params, g, transpose, cache, dz, need_d_src)
    }

    /// [`Layer::backward`] taking the output gradient by value: it is overwritten in place
    /// (activation backward) instead of copied first.
    pub fn backward_owned<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        cache: LayerCache<B>,
        d_h_dst: B::Mat,
        need_d_src: bool,
    ) -> Option<B::Mat> {
        self.backward_fused(params, g, transpose, cache, d_h_dst, need_d_src, None)
    }

    /// The sign bits of this layer's ReLU output when the layer above may apply the ReLU's
    /// backward for it ([`Layer::fuses_relu_below`]): nothing is added to the output after
    /// the ReLU (no residual), so its gradient goes straight into the ReLU's backward.
    pub fn relu_bits<'c, B: Backend>(&self, cache: &'c LayerCache<B>) -> Option<&'c B::Saved> {
        match (&self.activation, &cache.activated) {
            (Some(Activation::Relu), Some(saved)) if !self.residual && cache.activated_bits => {
                Some(saved)
            }
            _ => None,
        }
    }

    /// Whether the gradient this layer returns for its input can carry the ReLU backward of
    /// the layer below: the input dropout's mask is the last thing applied to it (no norm,
    /// residual or input projection after it in the backward), with recorded bits whose rows
    /// are whole words.
    pub fn fuses_relu_below<B: Backend>(&self, cache: &LayerCache<B>) -> bool {
        let plain = self.is_plain();
        let bits = matches!(cache.dropout, Some(DropoutSaved::Bits(_)));
        plain && bits && self.conv.in_dim().is_multiple_of(64)
    }

    /// [`Layer::backward_owned`], and with `below_relu` (the layer below's
    /// [`Layer::relu_bits`], when [`Layer::fuses_relu_below`]) the ReLU backward of the layer
    /// below applied to the returned gradient in the same pass as the dropout's; the layer
    /// below then skips its own.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_fused<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        mut cache: LayerCache<B>,
        d_h_dst: B::Mat,
        need_d_src: bool,
        below_relu: Option<&B::Saved>,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        if let (Some(positive), Some(DropoutSaved::Bits(kept))) = (below_relu, &cache.dropout) {
            assert!(
                self.fuses_relu_below(&cache),
                "layer {}: no ReLU fusion here",
                self.index
            );
            let both = be
                .kept_and_positive(kept, self.conv.in_dim(), positive)
                .expect("whole-word rows");
            cache.dropout = Some(DropoutSaved::Bits(both));
        }
        let mut dz = d_h_dst;
        // The residual passes the output gradient straight to the destinations' input rows;
        // keep it before the activation's backward overwrites `dz`.
        let need_d_base = need_d_src || self.input.is_some();
        let d_residual = (self.residual && need_d_base).then(|| be.to_owned(be.view(&dz)));
        if let (Some(act), Some(saved)) = (self.activation, &cache.activated) {
            be.activation_backward(act, saved, be.view_mut(&mut dz));
        }
        self.convolution_backward(
            params,
            g,
            transpose,
            cache,
            be.view(&dz),
            need_d_src,
            d_residual,
        )
    }

    /// The backward from the gradient `dz` of the convolution's output (the activation's
    /// backward applied): the convolution, the input dropout, norm, residual (`d_residual`,
    /// the output gradient the destinations' rows add) and projection.
    #[allow(clippy::too_many_arguments)]
    fn convolution_backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        g: &B::Graph,
        transpose: &B::Transpose,
        cache: LayerCache<B>,
        dz: B::View<'_>,
        need_d_src: bool,
        d_residual: Option<B::Mat>,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        let block = be.block(g);
        assert_eq!(
            be.dim(dz).0,
            block.num_dst,
            "layer {}: gradient rows",
            self.index
        );
        let need_d_base = need_d_src || self.input.is_some();
        // A norm's gain and bias (and a projection's weights) learn from the gradient of the
        // convolution's input, so it is needed even when the caller does not want d `h_src`.
        let need_d_in = need_d_base || self.norm.is_some();
        let kept = match &cache.dropout {
            Some(DropoutSaved::Bits(kept)) => Some(kept),
            _ => None,
        };
        let mut d_in = self
            .conv
            .backward(params, g, transpose, cache.conv, dz, need_d_in, kept)?;
        if let Some(DropoutSaved::Keys(mask, keys)) = &cache.dropout {
            be.dropout_in_place(mask, be.view_mut(&mut d_in), keys);
        }
        if let (Some(ln), Some(nc)) = (&self.norm, cache.norm) {
            d_in = ln.backward(params, nc, be.view(&d_in));
        }
        if let Some(d_res) = d_residual {
            let dst = be.rows_mut(be.view_mut(&mut d_in), 0..block.num_dst);
            be.add_assign(dst, be.view(&d_res));
        }
        if let Some(lin) = &self.input {
            let x = cache.input.expect(super::NOT_KEPT);
            d_in = lin.backward(params, be.view(&x), be.view(&d_in), need_d_src)?;
        }
        if !need_d_src {
            return None;
        }
        Some(be.pad_rows(d_in, block.num_src()))
    }
}
