//! An MLP head on dense rows: `Linear → ReLU → … → Linear`, dropout on every linear's input.
//! Used as a classifier on top of node representations (e.g. after gathering slice outputs),
//! with dropout keyed by the caller's row keys like the graph layers.

use ndarray::{Array2, ArrayView2};

use super::layer::DropoutCtx;
use super::linear::Linear;
use super::params::ParamStore;
use crate::backend::cpu::activation::Activation;
use crate::backend::cpu::dropout::{derive_stream, DropoutMask};
use crate::backend::cpu::standard;

/// Mixed into the dropout stream so the head's masks differ from the graph layers'.
const MLP_STREAM_TAG: u64 = 0x4d4c_5048_4541_4400;

/// A stack of linear layers with ReLU between them.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    pub layers: Vec<Linear>,
    pub dropout: f32,
}

/// Forward state: each linear's (dropped-out) input, and the hidden activations.
#[derive(Debug)]
pub struct MlpCache {
    inputs: Vec<Array2<f32>>,
    masks: Vec<Option<DropoutMask>>,
    hidden: Vec<Array2<f32>>,
    row_keys: Vec<u64>,
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
        seed: u64,
    ) -> Mlp {
        assert!(dims.len() >= 2, "an MLP needs an input and an output size");
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, d)| Linear::new(params, &format!("{prefix}.{i}"), d[0], d[1], seed))
            .collect();
        Mlp { layers, dropout }
    }

    /// Forward on `x` (one row per key in `row_keys`).
    pub fn forward(
        &self,
        params: &ParamStore,
        x: ArrayView2<f32>,
        row_keys: &[u64],
        ctx: &DropoutCtx,
    ) -> (Array2<f32>, MlpCache) {
        assert_eq!(x.nrows(), row_keys.len(), "mlp: one key per row");
        let mut cache = MlpCache {
            inputs: Vec::with_capacity(self.layers.len()),
            masks: Vec::with_capacity(self.layers.len()),
            hidden: Vec::with_capacity(self.layers.len()),
            row_keys: row_keys.to_vec(),
        };
        let mut h = standard(x).into_owned();
        for (i, lin) in self.layers.iter().enumerate() {
            let mask = (ctx.training && self.dropout > 0.0).then(|| {
                DropoutMask::new(
                    derive_stream(ctx.stream ^ MLP_STREAM_TAG, i as u64),
                    self.dropout,
                )
            });
            if let Some(m) = &mask {
                m.apply_in_place(h.view_mut(), row_keys);
            }
            let mut y = lin.forward(params, h.view());
            cache.inputs.push(h);
            cache.masks.push(mask);
            if i + 1 < self.layers.len() {
                Activation::Relu.forward_in_place(y.view_mut());
                cache.hidden.push(y.clone());
            }
            h = y;
        }
        (h, cache)
    }

    /// Accumulate gradients; return d `x` when asked.
    pub fn backward(
        &self,
        params: &mut ParamStore,
        cache: MlpCache,
        dy: ArrayView2<f32>,
        need_dx: bool,
    ) -> Option<Array2<f32>> {
        let mut d = standard(dy).into_owned();
        for i in (0..self.layers.len()).rev() {
            if i + 1 < self.layers.len() {
                Activation::Relu.backward_in_place(cache.hidden[i].view(), d.view_mut());
            }
            let need = i > 0 || need_dx;
            let dx = self.layers[i].backward(params, cache.inputs[i].view(), d.view(), need);
            let mut dx = dx?;
            if let Some(m) = &cache.masks[i] {
                m.apply_in_place(dx.view_mut(), &cache.row_keys);
            }
            d = dx;
        }
        Some(d)
    }
}
