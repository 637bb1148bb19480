//! One model layer = dropout on its input → convolution → activation (hidden layers), with an
//! explicit forward and backward over one [`Block`].
//!
//! Strategies that communicate between layers call [`Layer::forward`] / [`Layer::backward`]
//! one layer at a time; [`super::model::Model`] simply chains them.

use ndarray::{s, Array2, ArrayView2, CowArray, Ix2};

use super::gat::{GatCache, GatConv};
use super::gcn::{GcnCache, GcnConv};
use super::linear::Linear;
use super::params::ParamStore;
use super::sage::{SageCache, SageConv};
use crate::sample::Block;
use crate::tensor::activation::{Activation, Saved};
use crate::tensor::aggregate::LazyTranspose;
use crate::tensor::dropout::{derive_stream, DropoutMask, KeptBits};
use crate::tensor::sparse::CsrMatrix;
use crate::tensor::standard;

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

    /// Accumulate parameter gradients; return d `h_in` (`input_rows` rows) when asked.
    pub fn backward(
        &self,
        params: &mut ParamStore,
        block: &Block,
        transpose: &LazyTranspose,
        cache: ConvCache,
        dz: ArrayView2<f32>,
        need_d_in: bool,
    ) -> Option<Array2<f32>> {
        match (self, cache) {
            (Conv::Sage(c), ConvCache::Sage(k)) => {
                c.backward(params, block, transpose, k, dz, need_d_in)
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
        }
    }
}

/// One layer: dropout(input) → conv → activation.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Position in the model; mixed into the dropout stream.
    pub index: usize,
    pub conv: Conv,
    /// Drop probability on the layer's input.
    pub dropout: f32,
    /// `None` for the output layer (logits).
    pub activation: Option<Activation>,
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
}

impl Layer {
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
            self.conv.in_dim(),
            "layer {}: input has {} columns, expected {}",
            self.index,
            h_src.ncols(),
            self.conv.in_dim()
        );
        let rows = self.conv.input_rows(block);
        let h = h_src.slice_move(s![..rows, ..]);
        let (h_in, dropout) = if ctx.training && self.dropout > 0.0 {
            let mask = DropoutMask::new(derive_stream(ctx.stream, self.index as u64), self.dropout);
            let (h, kept) = mask.apply_recorded(h, &row_keys(block, rows, ctx.orig_ids));
            (CowArray::from(h), Some(DropoutSaved::Bits(kept)))
        } else {
            (standard(h), None)
        };
        let (z, conv) = self.conv.forward(params, block, h_in, ctx.gcn_degrees);
        self.finish_forward(z, conv, dropout)
    }

    /// [`Layer::forward`] on sparse input rows (`block.num_src()` of them, e.g. bag-of-words
    /// features): dropout masks only the stored entries, and the convolution multiplies only
    /// the non-zeros. Same result as the dense path up to rounding.
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
            let mask = DropoutMask::new(derive_stream(ctx.stream, self.index as u64), self.dropout);
            let keys = row_keys(block, rows, ctx.orig_ids);
            mask.apply_sparse_in_place(&mut h, &keys);
            DropoutSaved::Keys(mask, keys)
        });
        let (z, conv) = self.conv.forward_sparse(params, block, h, ctx.gcn_degrees);
        self.finish_forward(z, conv, dropout)
    }

    /// The activation after the convolution, and the cache.
    fn finish_forward(
        &self,
        mut z: Array2<f32>,
        conv: ConvCache,
        dropout: Option<DropoutSaved>,
    ) -> (Array2<f32>, LayerCache) {
        let activated = self.activation.map(|act| {
            act.forward_in_place(z.view_mut());
            act.save(z.view())
        });
        (
            z,
            LayerCache {
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
        if let (Some(act), Some(saved)) = (self.activation, &cache.activated) {
            act.backward_saved(saved, dz.view_mut());
        }
        let d_in =
            self.conv
                .backward(params, block, transpose, cache.conv, dz.view(), need_d_src)?;
        let rows = d_in.nrows();
        let mut d_src = if rows == block.num_src() {
            d_in
        } else {
            let mut full = Array2::zeros((block.num_src(), d_in.ncols()));
            full.slice_mut(s![..rows, ..]).assign(&d_in);
            full
        };
        match &cache.dropout {
            Some(DropoutSaved::Bits(kept)) => kept.apply_in_place(d_src.slice_mut(s![..rows, ..])),
            Some(DropoutSaved::Keys(mask, keys)) => {
                mask.apply_in_place(d_src.slice_mut(s![..rows, ..]), keys)
            }
            None => {}
        }
        Some(d_src)
    }
}
