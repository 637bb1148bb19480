//! Element-wise activations and their backward passes.
//!
//! Each backward reads the activation's OUTPUT (not its input), so a layer only keeps the one
//! matrix it returned: ReLU and LeakyReLU preserve the sign, and ELU's derivative for negative
//! inputs is `α·eˣ = y + α`.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::bitmask;
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

simd_kernel! {
    /// `bits` bit `i` ← `y[i] > 0` (64 elements per word; `y.len() ≤ 64·bits.len()`).
    fn pack_positive(y: &[f32], bits: &mut [u64]) {
        for (word, ys) in bits.iter_mut().zip(y.chunks(64)) {
            let mut w = 0u64;
            for (i, &v) in ys.iter().enumerate() {
                w |= ((v > 0.0) as u64) << i;
            }
            *word = w;
        }
    }
}

simd_kernel! {
    /// `g[i] *= 1` where bit `i` is set, `*= other` elsewhere.
    fn scale_by_bits(bits: &[u64], other: f32, g: &mut [f32]) {
        for (gs, &w) in g.chunks_mut(64).zip(bits) {
            for (i, gi) in gs.iter_mut().enumerate() {
                *gi *= if (w >> i) & 1 == 1 { 1.0 } else { other };
            }
        }
    }
}

/// `bits` bit `i` ← `y[i] > 0`, vectorised where the CPU allows.
fn pack_signs(y: &[f32], bits: &mut [u64]) {
    if !bitmask::pack_positive(y, bits) {
        pack_positive(y, bits)
    }
}

/// ReLU on `y` in place and its signs into `bits` (bit `i` ← `y[i] > 0`): the work of
/// [`Activation::forward_save`] on one slice that starts at a word boundary of the bit set (a
/// product's epilogue, [`super::gemm::matmul_bias_relu`], runs it per block of its output).
pub(crate) fn relu_save(y: &mut [f32], bits: &mut [u64]) {
    activate(Activation::Relu, y);
    pack_signs(y, bits)
}

/// Elements per parallel task of the element-wise kernels (a multiple of 64, so that every
/// task owns whole words of a [`Saved::Positive`] bit set).
const CHUNK: usize = 1 << 14;

/// What an activation's backward needs from its forward output.
#[derive(Debug)]
pub enum Saved {
    /// ReLU and LeakyReLU: only whether each output is positive, one bit per element
    /// (32 times smaller than the output, and no copy of it).
    Positive(Vec<u64>),
    /// ELU: the output itself.
    Output(Array2<f32>),
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

    /// Keep what [`Activation::backward_saved`] needs from the output `y`.
    pub fn save(self, y: ArrayView2<f32>) -> Saved {
        match self {
            Activation::Elu { .. } => Saved::Output(y.to_owned()),
            Activation::Relu | Activation::LeakyRelu { .. } => {
                let y = super::standard(y);
                let ys = y.as_slice().expect("standard layout");
                let mut bits = vec![0u64; ys.len().div_ceil(64)];
                bits.par_chunks_mut(CHUNK / 64)
                    .zip(ys.par_chunks(CHUNK))
                    .for_each(|(b, y)| pack_signs(y, b));
                Saved::Positive(bits)
            }
        }
    }

    /// [`Activation::forward_in_place`] then [`Activation::save`], in one pass: each chunk's
    /// signs are packed while it is still in cache.
    pub fn forward_save(self, mut x: ArrayViewMut2<f32>) -> Saved {
        if let Activation::Elu { .. } = self {
            self.forward_in_place(x.view_mut());
            return self.save(x.view());
        }
        let xs = x.as_slice_mut().expect("activation: standard layout");
        let mut bits = vec![0u64; xs.len().div_ceil(64)];
        bits.par_chunks_mut(CHUNK / 64)
            .zip(xs.par_chunks_mut(CHUNK))
            .for_each(|(b, y)| {
                activate(self, y);
                pack_signs(y, b)
            });
        Saved::Positive(bits)
    }

    /// `grad ← grad ⊙ f'(x)` from what [`Activation::save`] kept; the same result as
    /// [`Activation::backward_in_place`] on the output.
    pub fn backward_saved(self, saved: &Saved, mut grad: ArrayViewMut2<f32>) {
        match saved {
            Saved::Output(y) => self.backward_in_place(y.view(), grad),
            Saved::Positive(bits) => {
                let other = match self {
                    Activation::Relu => 0.0,
                    Activation::LeakyRelu { slope } => slope,
                    Activation::Elu { .. } => panic!("ELU needs its output, not its signs"),
                };
                let g = grad.as_slice_mut().expect("activation: standard layout");
                assert!(
                    bits.len() * 64 >= g.len(),
                    "activation backward: shapes differ"
                );
                g.par_chunks_mut(CHUNK)
                    .zip(bits.par_chunks(CHUNK / 64))
                    .for_each(|(g, b)| {
                        if !bitmask::scale_unset(b, other, g) {
                            scale_by_bits(b, other, g)
                        }
                    });
            }
        }
    }

    /// Apply in place.
    pub fn forward_in_place(self, mut x: ArrayViewMut2<f32>) {
        let x = x.as_slice_mut().expect("activation: standard layout");
        x.par_chunks_mut(CHUNK).for_each(|c| activate(self, c));
    }

    /// `grad ← grad ⊙ f'(x)`, given the forward output `y`.
    pub fn backward_in_place(self, y: ArrayView2<f32>, mut grad: ArrayViewMut2<f32>) {
        assert_eq!(y.dim(), grad.dim(), "activation backward: shapes differ");
        let y = y.to_slice().expect("activation: standard layout");
        let g = grad.as_slice_mut().expect("activation: standard layout");
        g.par_chunks_mut(CHUNK)
            .zip(y.par_chunks(CHUNK))
            .for_each(|(g, y)| activate_backward(self, y, g));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_signs_give_the_output_based_backward() {
        let y = Array2::from_shape_fn((70, 33), |(i, j)| {
            let v = ((i * 31 + j * 17) % 13) as f32 - 6.0;
            if v < 0.0 && (i + j) % 3 == 0 {
                -0.0
            } else {
                v
            }
        });
        let g = Array2::from_shape_fn((70, 33), |(i, j)| (i as f32 - j as f32) * 0.1);
        for act in [
            Activation::Relu,
            Activation::LeakyRelu { slope: 0.2 },
            Activation::Elu { alpha: 1.0 },
        ] {
            let y = y.mapv(|v| {
                if act == Activation::Relu {
                    v.max(0.0)
                } else {
                    v
                }
            });
            let mut expect = g.clone();
            act.backward_in_place(y.view(), expect.view_mut());
            let mut got = g.clone();
            act.backward_saved(&act.save(y.view()), got.view_mut());
            assert_eq!(got, expect, "{act:?}");
        }
    }

    /// The portable sign loops (CPUs without AVX-512) match the vector kernels bitwise.
    #[test]
    fn portable_sign_loops_match_the_vector_kernels() {
        let y: Vec<f32> = (0..83).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
        let mut portable = vec![0u64; 2];
        pack_positive(&y, &mut portable);
        let mut vector = vec![u64::MAX; 2];
        if bitmask::pack_positive(&y, &mut vector) {
            assert_eq!(vector, portable);
        }
        let g: Vec<f32> = (0..83).map(|i| (i as f32 * 0.2).sin()).collect();
        let mut p = g.clone();
        scale_by_bits(&portable, 0.3, &mut p);
        let mut v = g.clone();
        if bitmask::scale_unset(&portable, 0.3, &mut v) {
            assert_eq!(v, p);
        }
    }
}
