//! Deterministic parameter initialisation from a seed (counter-based: element `i` of parameter
//! `p` depends only on `(seed, p, i)`, so it is the same on every rank).

use super::params::ParamStore;
use crate::backend::cpu::dropout::mix64;
pub use crate::kinds::InitKind;

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

/// `U(−a, a)` with `a = 1/√fan_in` (the rows of the parameter's matrix shape; a bias takes its
/// weight's fan-in): PyTorch's `nn.Linear` default for weights (Kaiming-uniform, `a = √5`) and
/// biases alike.
fn fan_in_uniform(params: &mut ParamStore, idx: usize, fan_in: usize, seed: u64) {
    let limit = (1.0 / fan_in.max(1) as f64).sqrt() as f32;
    for (i, v) in params.view_mut(idx).iter_mut().enumerate() {
        *v = limit * symmetric_uniform(seed, idx, i);
    }
}

/// Start a weight (`fan_in × fan_out`) and, where the layer has one, its bias the `kind` way.
/// Glorot leaves the bias at zero.
pub fn init_weight(
    params: &mut ParamStore,
    kind: InitKind,
    weight: usize,
    bias: Option<usize>,
    seed: u64,
) {
    match kind {
        InitKind::Glorot => glorot_uniform(params, weight, seed),
        InitKind::FanIn => {
            let fan_in = params.entries[weight].dims().0;
            fan_in_uniform(params, weight, fan_in, seed);
            if let Some(b) = bias {
                fan_in_uniform(params, b, fan_in, seed);
            }
        }
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

    #[test]
    fn fan_in_values_are_bounded_by_the_fan_in_and_reach_the_bias() {
        let mut p = ParamStore::new();
        let w = p.add("w", &[64, 32]);
        let b = p.add("b", &[32]);
        init_weight(&mut p, InitKind::FanIn, w, Some(b), 3);
        let limit = 1.0 / 8.0;
        for idx in [w, b] {
            let v = p.view(idx);
            assert!(v.iter().all(|x| x.abs() <= limit), "{idx}");
            assert!(
                v.iter().any(|x| x.abs() > 0.8 * limit),
                "{idx} uses the range"
            );
        }
        // Not Glorot's bound (√(6/96) = 0.25), and the bias is not left at zero.
        let first = p.values.clone();
        let mut q = ParamStore::new();
        let (w2, b2) = (q.add("w", &[64, 32]), q.add("b", &[32]));
        init_weight(&mut q, InitKind::Glorot, w2, Some(b2), 3);
        assert!(q.view(w2).iter().any(|x| x.abs() > limit));
        assert!(q.view(b2).iter().all(|&x| x == 0.0));
        init_weight(&mut p, InitKind::FanIn, w, Some(b), 3);
        assert_eq!(first, p.values, "seeded");
    }
}
