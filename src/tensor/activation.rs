//! Element-wise activations and their backward passes.
//!
//! Each backward reads the activation's OUTPUT (not its input), so a layer only keeps the one
//! matrix it returned: ReLU and LeakyReLU preserve the sign, and ELU's derivative for negative
//! inputs is `α·eˣ = y + α`.

use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::simd::simd_kernel;

simd_kernel! {
    /// `x ← act(x)`.
    fn activate(act: Activation, x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = act.value(*v);
        }
    }
}

simd_kernel! {
    /// `g ← g ⊙ act'(·)` given the outputs `y`.
    fn activate_backward(act: Activation, y: &[f32], g: &mut [f32]) {
        for (gi, &yi) in g.iter_mut().zip(y) {
            *gi *= act.derivative_from_output(yi);
        }
    }
}

/// An element-wise activation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// `x` for `x > 0`, `α(eˣ − 1)` otherwise.
    Elu { alpha: f32 },
    /// `x` for `x > 0`, `slope·x` otherwise (`slope > 0`).
    LeakyRelu { slope: f32 },
}

impl Activation {
    /// The value at `x`.
    #[inline]
    pub fn value(self, x: f32) -> f32 {
        match self {
            Activation::Relu => x.max(0.0),
            Activation::Elu { alpha } => {
                if x > 0.0 {
                    x
                } else {
                    alpha * x.exp_m1()
                }
            }
            Activation::LeakyRelu { slope } => {
                if x > 0.0 {
                    x
                } else {
                    slope * x
                }
            }
        }
    }

    /// The derivative, given the OUTPUT `y = value(x)`.
    #[inline]
    pub fn derivative_from_output(self, y: f32) -> f32 {
        match self {
            Activation::Relu => {
                if y > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Activation::Elu { alpha } => {
                if y > 0.0 {
                    1.0
                } else {
                    y + alpha
                }
            }
            Activation::LeakyRelu { slope } => {
                if y > 0.0 {
                    1.0
                } else {
                    slope
                }
            }
        }
    }

    /// Apply in place.
    pub fn forward_in_place(self, mut x: ArrayViewMut2<f32>) {
        let x = x.as_slice_mut().expect("activation: standard layout");
        x.par_chunks_mut(1 << 14).for_each(|c| activate(self, c));
    }

    /// `grad ← grad ⊙ f'(x)`, given the forward output `y`.
    pub fn backward_in_place(self, y: ArrayView2<f32>, mut grad: ArrayViewMut2<f32>) {
        assert_eq!(y.dim(), grad.dim(), "activation backward: shapes differ");
        let y = y.to_slice().expect("activation: standard layout");
        let g = grad.as_slice_mut().expect("activation: standard layout");
        g.par_chunks_mut(1 << 14)
            .zip(y.par_chunks(1 << 14))
            .for_each(|(g, y)| activate_backward(self, y, g));
    }
}
