//! An MLP on dense rows: `Linear → ReLU → … → Linear`, dropout on every linear's input, on any
//! backend. Used as a classifier on top of node representations (SliceGCN's head over the
//! gathered slice outputs) and as SliceGCN's feature fusion, with dropout keyed by the
//! caller's row keys like the graph layers (so a row's mask does not depend on which rank or
//! which subset of rows computes it).

use super::init::InitKind;
use super::layer::DropoutCtx;
use super::linear::Linear;
use super::params::ParamStore;
use crate::backend::cpu::activation::Activation;
use crate::backend::cpu::dropout::{derive_stream, DropoutMask};
use crate::backend::{Backend, CowMat, Cpu};

/// Mixed into the dropout stream so the head's masks differ from the graph layers'.
const MLP_STREAM_TAG: u64 = 0x4d4c_5048_4541_4400;

/// A stack of linear layers with ReLU between them.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    pub layers: Vec<Linear>,
    pub dropout: f32,
    /// Mixed into the dropout stream: two MLPs of one model draw different masks.
    pub tag: u64,
}

/// Forward state: each linear's (dropped-out) input, its kept elements, and the ReLU signs.
#[derive(Debug)]
pub struct MlpCache<B: Backend = Cpu> {
    inputs: Vec<B::Mat>,
    kept: Vec<Option<B::Kept>>,
    relu: Vec<B::Saved>,
}

impl Mlp {
    /// Layers `dims[0] → dims[1] → … → dims[n]`, registered as `{prefix}.{i}.weight/bias`.
    ///
    /// # Panics
    /// If fewer than two dims are given.
    pub fn new(
        params: &mut ParamStore,
        prefix: &str,
        dims: &[usize],
        dropout: f32,
        init: InitKind,
        seed: u64,
    ) -> Mlp {
        assert!(dims.len() >= 2, "an MLP needs an input and an output size");
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, d)| {
                let seed = derive_stream(seed, i as u64);
                Linear::new(params, &format!("{prefix}.{i}"), d[0], d[1], init, seed)
            })
            .collect();
        Mlp {
            layers,
            dropout,
            tag: MLP_STREAM_TAG,
        }
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.in_dim * l.out_dim + l.out_dim)
            .sum()
    }

    /// Forward on `x` (one row per key in `row_keys`); dropout only when `ctx.training`.
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        x: B::View<'_>,
        row_keys: &[u64],
        ctx: &DropoutCtx,
    ) -> (B::Mat, MlpCache<B>) {
        let be = params.backend();
        assert_eq!(be.dim(x).0, row_keys.len(), "mlp: one key per row");
        let mut cache = MlpCache {
            inputs: Vec::with_capacity(self.layers.len()),
            kept: Vec::with_capacity(self.layers.len()),
            relu: Vec::with_capacity(self.layers.len()),
        };
        let mut h: Option<B::Mat> = None;
        for (i, lin) in self.layers.iter().enumerate() {
            // A hidden layer's input is the layer below's output, which nothing else reads:
            // the cache takes it as it is.
            let input = match h.take() {
                Some(m) => CowMat::Owned(m),
                None => CowMat::Borrowed(be.shorten(x)),
            };
            let (input, kept) = if ctx.training && self.dropout > 0.0 {
                let mask =
                    DropoutMask::new(derive_stream(ctx.stream ^ self.tag, i as u64), self.dropout);
                let (m, k) = be.dropout_recorded(&mask, input.view(be), row_keys);
                (CowMat::Owned(m), Some(k))
            } else {
                (input, None)
            };
            let mut y = lin.forward(params, input.view(be));
            // (An inference pass keeps no input, and copies none.)
            cache.inputs.extend(input.kept(be, ctx.keep_for_backward));
            cache.kept.push(kept);
            if i + 1 < self.layers.len() {
                cache
                    .relu
                    .push(be.activation_forward(Activation::Relu, be.view_mut(&mut y)));
            }
            h = Some(y);
        }
        (h.expect("at least one layer"), cache)
    }

    /// Accumulate gradients; return d `x` when asked.
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        cache: MlpCache<B>,
        dy: B::Mat,
        need_dx: bool,
    ) -> Option<B::Mat> {
        let be = params.backend().clone();
        assert_eq!(
            cache.inputs.len(),
            self.layers.len(),
            "mlp: {}",
            super::NOT_KEPT
        );
        let mut d = dy;
        for i in (0..self.layers.len()).rev() {
            if i + 1 < self.layers.len() {
                be.activation_backward(Activation::Relu, &cache.relu[i], be.view_mut(&mut d));
            }
            let need = i > 0 || need_dx;
            let dx = self.layers[i].backward(params, be.view(&cache.inputs[i]), be.view(&d), need);
            let mut dx = dx?;
            if let Some(k) = &cache.kept[i] {
                be.kept_apply(k, be.view_mut(&mut dx));
            }
            d = dx;
        }
        Some(d)
    }
}
