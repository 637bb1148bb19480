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

use ndarray::{s, Array2, ArrayView2, CowArray, Ix2};

use super::gat::{GatCache, GatConv};
use super::gcn::{GcnCache, GcnConv};
use super::linear::Linear;
use super::norm::{LayerNorm, NormCache};
use super::params::ParamStore;
use super::sage::{SageCache, SageConv};
use crate::backend::cpu::activation::{Activation, Saved};
use crate::backend::cpu::aggregate::LazyTranspose;
use crate::backend::cpu::dropout::{derive_stream, DropoutMask, KeptBits};
use crate::backend::cpu::gemm::RowDropout;
use crate::backend::cpu::sparse::{prefers_sparse, CsrMatrix};
use crate::backend::cpu::standard;
use crate::sample::Block;

/// How dropout behaves in one forward pass.
#[derive(Clone, Copy, Debug)]
pub struct DropoutCtx<'a> {
    /// Dropout is applied only when training.
    pub training: bool,
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
    /// Evaluation: no dropout.
    pub fn eval() -> DropoutCtx<'static> {
        DropoutCtx {
            training: false,
            stream: 0,
            orig_ids: None,
            gcn_degrees: None,
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
pub enum ConvCache {
    Sage(SageCache),
    Gcn(GcnCache),
    Gat(GatCache),
    Dense(Array2<f32>),
    /// A dense layer's sparse input.
    DenseSparse(CsrMatrix),
}

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
    pub fn forward_sparse(
        &self,
        params: &ParamStore,
        block: &Block,
        x: CsrMatrix,
        gcn_degrees: Option<&[u32]>,
    ) -> (Array2<f32>, ConvCache) {
        match self {
            Conv::Sage(c) => {
                let (z, k) = c.forward_sparse(params, block, x);
                (z, ConvCache::Sage(k))
            }
            Conv::Gcn(c) => {
                let (z, k) = c.forward_sparse(params, block, x, gcn_degrees);
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
    /// see [`DropoutCtx::gcn_degrees`].
    pub fn forward(
        &self,
        params: &ParamStore,
        block: &Block,
        h_in: CowArray<f32, Ix2>,
        gcn_degrees: Option<&[u32]>,
    ) -> (Array2<f32>, ConvCache) {
        match self {
            Conv::Sage(c) => {
                let (z, k) = c.forward(params, block, h_in);
                (z, ConvCache::Sage(k))
            }
            Conv::Gcn(c) => {
                let (z, k) = c.forward(params, block, h_in, gcn_degrees);
                (z, ConvCache::Gcn(k))
            }
            Conv::Gat(c) => {
                let (z, k) = c.forward(params, block, h_in);
                (z, ConvCache::Gat(k))
            }
            Conv::Dense(c) => {
                let z = c.forward(params, h_in.view());
                (z, ConvCache::Dense(h_in.into_owned()))
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
    /// mask its output too: it did exactly when the kept bits are returned.
    pub fn forward_activated(
        &self,
        params: &ParamStore,
        block: &Block,
        h_in: CowArray<f32, Ix2>,
        gcn_degrees: Option<&[u32]>,
        activation: Option<Activation>,
        then: Option<&RowDropout>,
    ) -> (Array2<f32>, ConvCache, Option<Saved>, Option<Vec<u64>>) {
        match self {
            Conv::Sage(c) => {
                let relu = activation == Some(Activation::Relu);
                let (z, k, bits, kept) = c.forward_relu(params, block, h_in, relu, then);
                (z, ConvCache::Sage(k), bits.map(Saved::Positive), kept)
            }
            _ => {
                let (z, k) = self.forward(params, block, h_in, gcn_degrees);
                (z, k, None, None)
            }
        }
    }

    /// Accumulate parameter gradients; return d `h_in` (`input_rows` rows) when asked, masked
    /// by the input dropout's `kept` bits when given (SAGE does it while each row is in cache).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        cache: ConvCache,
        dz: ArrayView2<f32>,
        need_d_in: bool,
        kept: Option<&KeptBits>,
    ) -> Option<Array2<f32>> {
        let mut d_in = match (self, cache) {
            // SAGE masks each row inside its transposed mean.
            (Conv::Sage(c), ConvCache::Sage(k)) => {
                return c.backward(params, block, transpose, k, dz, need_d_in, kept);
            }
            (Conv::Gcn(c), ConvCache::Gcn(k)) => {
                c.backward(params, block, transpose, k, dz, need_d_in)
            }
            (Conv::Gat(c), ConvCache::Gat(k)) => {
                c.backward(params, block, transpose, k, dz, need_d_in)
            }
            (Conv::Dense(c), ConvCache::Dense(x)) => c.backward(params, x.view(), dz, need_d_in),
            (Conv::Dense(c), ConvCache::DenseSparse(x)) => {
                c.backward_sparse(params, &x, dz, need_d_in)
            }
            _ => panic!("layer cache does not belong to this layer"),
        }?;
        if let Some(kept) = kept {
            kept.apply_in_place(d_in.view_mut());
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
enum DropoutSaved {
    /// The kept bits of a dense input (no hashing in the backward).
    Bits(KeptBits),
    /// The mask and row keys of a sparse input (its gradient is dense: hash again).
    Keys(DropoutMask, Vec<u64>),
}

/// What a layer keeps from its forward for its backward.
#[derive(Debug)]
pub struct LayerCache {
    /// The input rows of the projection, when there is one.
    input: Option<Array2<f32>>,
    /// What the input normalisation kept, when there is one.
    norm: Option<NormCache>,
    /// How to mask the input gradient, when dropout was applied.
    dropout: Option<DropoutSaved>,
    conv: ConvCache,
    /// What the activation's backward needs, when there is an activation.
    activated: Option<Saved>,
}

impl LayerCache {
    /// What the convolution kept.
    pub fn conv_cache(&self) -> &ConvCache {
        &self.conv
    }

    /// Forget the activation: its backward was applied by the layer above
    /// ([`Layer::backward_fused`]).
    pub fn clear_activation(&mut self) {
        self.activated = None;
    }
}

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
    pub fn forward(
        &self,
        params: &ParamStore,
        block: &Block,
        h_src: ArrayView2<f32>,
        ctx: &DropoutCtx,
    ) -> (Array2<f32>, LayerCache) {
        let (out, cache, _) = self.forward_then(params, block, h_src, ctx, None);
        (out, cache)
    }

    /// [`Layer::forward`], offering the layer above's input dropout (`then`) to this layer's
    /// product: the output comes back masked exactly when its kept bits come back too (see
    /// [`Model`](super::model::Model)'s forward). A residual, added after the activation, keeps
    /// the dropout out of the product.
    pub fn forward_then(
        &self,
        params: &ParamStore,
        block: &Block,
        h_src: ArrayView2<f32>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> (Array2<f32>, LayerCache, Option<KeptBits>) {
        assert_eq!(
            h_src.nrows(),
            block.num_src(),
            "layer {}: input has {} rows but the block has {} sources",
            self.index,
            h_src.nrows(),
            block.num_src()
        );
        assert_eq!(
            h_src.ncols(),
            self.in_dim(),
            "layer {}: input has {} columns, expected {}",
            self.index,
            h_src.ncols(),
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
            Some(lin) => {
                let x = h_src.slice(s![..rows, ..]).to_owned();
                (Some(lin.forward(params, x.view())), Some(x))
            }
            None => (None, None),
        };
        // The rows the layer works on: projected, or as given.
        let base = match &projected {
            Some(p) => p.view(),
            None => h_src.slice(s![..rows, ..]),
        };
        let h = base;
        let (h, norm) = match &self.norm {
            Some(ln) => {
                let (y, cache) = ln.forward(params, h);
                (CowArray::from(y), Some(cache))
            }
            None => (standard(h), None),
        };
        let (h_in, dropout) = if ctx.training && self.dropout > 0.0 {
            let mask = self.input_dropout(ctx);
            let keys = row_keys(block, rows, ctx.orig_ids);
            let (h, kept) = mask.apply_recorded(h.view(), &keys);
            (CowArray::from(h), Some(DropoutSaved::Bits(kept)))
        } else {
            (h, None)
        };
        let then = then.filter(|_| self.may_apply_dropout_above());
        let (z, conv, activated, kept) = self.convolve(params, block, h_in, ctx, then);
        let (mut out, mut cache) = self.finish_forward(z, conv, dropout, activated);
        cache.norm = norm;
        cache.input = input;
        if self.residual {
            // The destinations are the first `num_dst` sources: their own input rows.
            out += &base.slice(s![..block.num_dst, ..]);
        }
        (out, cache, kept)
    }

    /// [`Layer::forward`] taking the input by value: a plain layer (no input projection,
    /// norm or residual, so nothing else reads the unmasked rows) applies its dropout in place
    /// instead of writing a masked copy. Bitwise the same result.
    pub fn forward_owned(
        &self,
        params: &ParamStore,
        block: &Block,
        h_src: Array2<f32>,
        ctx: &DropoutCtx,
    ) -> (Array2<f32>, LayerCache) {
        let (out, cache, _) = self.forward_owned_then(params, block, h_src, None, ctx, None);
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
    pub fn forward_owned_then(
        &self,
        params: &ParamStore,
        block: &Block,
        mut h_src: Array2<f32>,
        kept: Option<KeptBits>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> (Array2<f32>, LayerCache, Option<KeptBits>) {
        let plain = self.is_plain();
        let whole = h_src.nrows() == self.conv.input_rows(block)
            && h_src.nrows() == block.num_src()
            && h_src.ncols() == self.in_dim()
            && h_src.is_standard_layout();
        let kept = match kept {
            Some(kept) => {
                assert!(plain && whole, "layer {}: input masked below", self.index);
                kept
            }
            None if plain && whole && ctx.training && self.dropout > 0.0 => {
                let mask = self.input_dropout(ctx);
                let keys = row_keys(block, h_src.nrows(), ctx.orig_ids);
                mask.apply_recorded_in_place(h_src.view_mut(), &keys)
            }
            None => return self.forward_then(params, block, h_src.view(), ctx, then),
        };
        let h_in = CowArray::from(h_src);
        let (z, conv, activated, kept_above) = self.convolve(params, block, h_in, ctx, then);
        let (out, cache) = self.finish_forward(z, conv, Some(DropoutSaved::Bits(kept)), activated);
        (out, cache, kept_above)
    }

    /// The convolution with this layer's activation, offering `then` to its product; the kept
    /// bits come back when the product applied it.
    fn convolve(
        &self,
        params: &ParamStore,
        block: &Block,
        h_in: CowArray<f32, Ix2>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> (Array2<f32>, ConvCache, Option<Saved>, Option<KeptBits>) {
        let (z, conv, activated, words) = self.conv.forward_activated(
            params,
            block,
            h_in,
            ctx.gcn_degrees,
            self.activation,
            then.map(|t| &t.rows),
        );
        let kept = then
            .zip(words)
            .map(|(t, w)| KeptBits::from_product(z.nrows(), z.ncols(), &t.mask, w));
        (z, conv, activated, kept)
    }

    /// [`Layer::forward`] on a model's input features: mostly-zero rows (bag-of-words,
    /// [`prefers_sparse`], a function of the data only) take [`Layer::forward_sparse`]'s path,
    /// whose products skip the zeros; other input, or a convolution without a sparse path,
    /// takes the dense one. Every strategy's input layer calls this, so all take the same path.
    pub fn forward_input(
        &self,
        params: &ParamStore,
        block: &Block,
        x: ArrayView2<f32>,
        ctx: &DropoutCtx,
    ) -> (Array2<f32>, LayerCache) {
        let (out, cache, _) = self.forward_input_then(params, block, x, ctx, None);
        (out, cache)
    }

    /// [`Layer::forward_input`] offering `then` as [`Layer::forward_then`] does (the sparse
    /// path never takes it).
    pub fn forward_input_then(
        &self,
        params: &ParamStore,
        block: &Block,
        x: ArrayView2<f32>,
        ctx: &DropoutCtx,
        then: Option<&NextDropout>,
    ) -> (Array2<f32>, LayerCache, Option<KeptBits>) {
        if self.conv.supports_sparse() && prefers_sparse(x) {
            let (out, cache) = self.forward_sparse(params, block, &CsrMatrix::from_dense(x), ctx);
            (out, cache, None)
        } else {
            self.forward_then(params, block, x, ctx, then)
        }
    }

    /// [`Layer::forward`] on sparse input rows (`block.num_src()` of them, e.g. bag-of-words
    /// features): dropout masks only the stored entries, and the convolution multiplies only
    /// the non-zeros. Same result as the dense path up to rounding.
    ///
    /// A layer with a normalisation or a residual works on dense rows: it takes the dense
    /// path (such layers read hidden rows, never the sparse input features of a model).
    ///
    /// # Panics
    /// If the shapes do not match, or the convolution has no sparse path
    /// ([`Conv::supports_sparse`]).
    pub fn forward_sparse(
        &self,
        params: &ParamStore,
        block: &Block,
        x: &CsrMatrix,
        ctx: &DropoutCtx,
    ) -> (Array2<f32>, LayerCache) {
        if self.norm.is_some() || self.residual || self.input.is_some() {
            return self.forward(params, block, x.to_dense().view(), ctx);
        }
        assert_eq!(
            x.nrows(),
            block.num_src(),
            "layer {}: input has {} rows but the block has {} sources",
            self.index,
            x.nrows(),
            block.num_src()
        );
        assert_eq!(
            x.ncols,
            self.conv.in_dim(),
            "layer {}: input has {} columns, expected {}",
            self.index,
            x.ncols,
            self.conv.in_dim()
        );
        let rows = self.conv.input_rows(block);
        let mut h = if rows == x.nrows() {
            x.clone()
        } else {
            x.first_rows(rows)
        };
        let dropout = (ctx.training && self.dropout > 0.0).then(|| {
            let mask = self.input_dropout(ctx);
            let keys = row_keys(block, rows, ctx.orig_ids);
            mask.apply_sparse_in_place(&mut h, &keys);
            DropoutSaved::Keys(mask, keys)
        });
        let (z, conv) = self.conv.forward_sparse(params, block, h, ctx.gcn_degrees);
        self.finish_forward(z, conv, dropout, None)
    }

    /// The activation after the convolution (unless the convolution applied it: `activated`),
    /// and the cache.
    fn finish_forward(
        &self,
        mut z: Array2<f32>,
        conv: ConvCache,
        dropout: Option<DropoutSaved>,
        activated: Option<Saved>,
    ) -> (Array2<f32>, LayerCache) {
        let activated =
            activated.or_else(|| self.activation.map(|act| act.forward_save(z.view_mut())));
        (
            z,
            LayerCache {
                input: None,
                norm: None,
                dropout,
                conv,
                activated,
            },
        )
    }

    /// Accumulate parameter gradients into `params.grads` from `d_h_dst` (gradient of the
    /// layer's output); return the gradient of `h_src` (`block.num_src()` rows) when
    /// `need_d_src` (the input layer of a model does not need it, which saves a GEMM).
    pub fn backward(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        cache: LayerCache,
        d_h_dst: ArrayView2<f32>,
        need_d_src: bool,
    ) -> Option<Array2<f32>> {
        let dz = standard(d_h_dst).into_owned();
        self.backward_owned(params, block, transpose, cache, dz, need_d_src)
    }

    /// [`Layer::backward`] taking the output gradient by value: it is overwritten in place
    /// (activation backward) instead of copied first.
    pub fn backward_owned(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        cache: LayerCache,
        d_h_dst: Array2<f32>,
        need_d_src: bool,
    ) -> Option<Array2<f32>> {
        self.backward_fused(params, block, transpose, cache, d_h_dst, need_d_src, None)
    }

    /// The sign bits of this layer's ReLU output when the layer above may apply the ReLU's
    /// backward for it ([`Layer::fuses_relu_below`]): nothing is added to the output after
    /// the ReLU (no residual), so its gradient goes straight into the ReLU's backward.
    pub fn relu_bits<'c>(&self, cache: &'c LayerCache) -> Option<&'c [u64]> {
        match (&self.activation, &cache.activated) {
            (Some(Activation::Relu), Some(Saved::Positive(bits))) if !self.residual => Some(bits),
            _ => None,
        }
    }

    /// Whether the gradient this layer returns for its input can carry the ReLU backward of
    /// the layer below: the input dropout's mask is the last thing applied to it (no norm,
    /// residual or input projection after it in the backward), with recorded bits whose rows
    /// are whole words.
    pub fn fuses_relu_below(&self, cache: &LayerCache) -> bool {
        let plain = self.is_plain();
        let bits = matches!(cache.dropout, Some(DropoutSaved::Bits(_)));
        plain && bits && self.conv.in_dim().is_multiple_of(64)
    }

    /// [`Layer::backward_owned`], and with `below_relu` (the layer below's
    /// [`Layer::relu_bits`], when [`Layer::fuses_relu_below`]) the ReLU backward of the layer
    /// below applied to the returned gradient in the same pass as the dropout's; the layer
    /// below then skips its own.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_fused(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        mut cache: LayerCache,
        d_h_dst: Array2<f32>,
        need_d_src: bool,
        below_relu: Option<&[u64]>,
    ) -> Option<Array2<f32>> {
        if let (Some(positive), Some(DropoutSaved::Bits(kept))) = (below_relu, &cache.dropout) {
            assert!(
                self.fuses_relu_below(&cache),
                "layer {}: no ReLU fusion here",
                self.index
            );
            let both = kept
                .and_positive(self.conv.in_dim(), positive)
                .expect("whole-word rows");
            cache.dropout = Some(DropoutSaved::Bits(both));
        }
        assert_eq!(
            d_h_dst.nrows(),
            block.num_dst,
            "layer {}: gradient rows",
            self.index
        );
        let mut dz = if d_h_dst.is_standard_layout() {
            d_h_dst
        } else {
            d_h_dst.as_standard_layout().into_owned()
        };
        // The residual passes the output gradient straight to the destinations' input rows;
        // keep it before the activation's backward overwrites `dz`.
        let need_d_base = need_d_src || self.input.is_some();
        let d_residual = (self.residual && need_d_base).then(|| dz.clone());
        if let (Some(act), Some(saved)) = (self.activation, &cache.activated) {
            act.backward_saved(saved, dz.view_mut());
        }
        // A norm's gain and bias (and a projection's weights) learn from the gradient of the
        // convolution's input, so it is needed even when the caller does not want d `h_src`.
        let need_d_in = need_d_base || self.norm.is_some();
        let kept = match &cache.dropout {
            Some(DropoutSaved::Bits(kept)) => Some(kept),
            _ => None,
        };
        let mut d_in = self.conv.backward(
            params,
            block,
            transpose,
            cache.conv,
            dz.view(),
            need_d_in,
            kept,
        )?;
        if let Some(DropoutSaved::Keys(mask, keys)) = &cache.dropout {
            mask.apply_in_place(d_in.view_mut(), keys);
        }
        if let (Some(ln), Some(nc)) = (&self.norm, cache.norm) {
            d_in = ln.backward(params, nc, d_in.view());
        }
        if let Some(d_res) = d_residual {
            let mut dst = d_in.slice_mut(s![..block.num_dst, ..]);
            dst += &d_res;
        }
        if let (Some(lin), Some(x)) = (&self.input, cache.input) {
            d_in = lin.backward(params, x.view(), d_in.view(), need_d_src)?;
        }
        if !need_d_src {
            return None;
        }
        let rows = d_in.nrows();
        let d_src = if rows == block.num_src() {
            d_in
        } else {
            let mut full = Array2::zeros((block.num_src(), d_in.ncols()));
            full.slice_mut(s![..rows, ..]).assign(&d_in);
            full
        };
        Some(d_src)
    }
}
