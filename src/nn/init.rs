//! Deterministic parameter initialisation from a seed (counter-based: element `i` of parameter
//! `p` depends only on `(seed, p, i)`, so it is the same on every rank).

use super::params::ParamStore;
use crate::backend::cpu::dropout::mix64;

/// A uniform number in `[-1, 1)` from `(seed, param, element)`.
#[inline]
fn symmetric_uniform(seed: u64, param: usize, element: usize) -> f32 {
    let h = mix64(seed ^ mix64((param as u64) << 40 ^ element as u64 ^ 0xa076_1d64_78bd_642f));
    // 24 high bits → [0, 1) exactly representable in f32.
    ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Glorot (Xavier) uniform: `U(−a, a)` with `a = sqrt(6 / (fan_in + fan_out))`, taking the
/// parameter's matrix shape `rows × cols` as `fan_in × fan_out` (PyG's `glorot`).
pub fn glorot_uniform(params: &mut ParamStore, idx: usize, seed: u64) {
    let (rows, cols) = params.entries[idx].dims();
    let limit = (6.0 / (rows + cols).max(1) as f64).sqrt() as f32;
    for (i, v) in params.view_mut(idx).iter_mut().enumerate() {
        *v = limit * symmetric_uniform(seed, idx, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glorot_values_are_bounded_spread_and_seeded() {
        let mut p = ParamStore::new();
        let w = p.add("w", &[64, 32]);
        glorot_uniform(&mut p, w, 1);
        let limit = (6.0f32 / 96.0).sqrt();
        assert!(p.values.iter().all(|v| v.abs() <= limit));
        let mean: f32 = p.values.iter().sum::<f32>() / p.len() as f32;
        assert!(mean.abs() < 0.02);
        assert!(p.values.iter().any(|v| v.abs() > 0.8 * limit));
        let first = p.values.clone();
        glorot_uniform(&mut p, w, 1);
        assert_eq!(first, p.values);
        glorot_uniform(&mut p, w, 2);
        assert_ne!(first, p.values);
    }
}
