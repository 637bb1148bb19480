//! Adam over a flat parameter buffer, with PyTorch's semantics (see `nn::adam`): element-wise,
//! so any split of the buffer gives the same bits.

use rayon::prelude::*;

use super::simd::simd_kernel;
use crate::backend::AdamStep;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

simd_kernel! {
    /// One Adam update of a chunk of parameters `p` with gradients `g` and moments `m`, `v`.
    fn adam_chunk(c: AdamStep, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        let n = p.len();
        let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
        for i in 0..n {
            let mut grad = g[i];
            if c.weight_decay != 0.0 {
                if c.decoupled {
                    p[i] *= 1.0 - c.lr * c.weight_decay;
                } else {
                    grad += c.weight_decay * p[i];
                }
            }
            // PyTorch: exp_avg.lerp_(grad, 1 − β1); exp_avg_sq.mul_(β2).addcmul_(…).
            m[i] += (1.0 - c.beta1) * (grad - m[i]);
            v[i] = v[i] * c.beta2 + (1.0 - c.beta2) * grad * grad;
            let denom = v[i].sqrt() / c.bc2_sqrt + c.eps;
            p[i] -= c.step_size * m[i] / denom;
        }
    }
}

/// One Adam update of `values` from `grads` with moments `m` and `v` (equal lengths).
pub fn adam_step(values: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], c: AdamStep) {
    assert_eq!(values.len(), grads.len(), "adam: gradient count differs");
    assert_eq!(values.len(), m.len(), "adam: moment count differs");
    assert_eq!(values.len(), v.len(), "adam: moment count differs");
    values
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m), v)| adam_chunk(c, p, g, m, v));
}
