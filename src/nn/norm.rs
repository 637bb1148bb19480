//! Layer normalisation per row, `y = (x - mean(x)) / sqrt(var(x) + eps) · gain + bias`, with
//! a learned gain and bias in the flat [`ParamStore`] and an explicit backward (the backend's
//! [`Backend::layer_norm`] and [`Backend::layer_norm_backward`]).

use super::params::ParamStore;
use crate::backend::{Backend, Cpu};

pub use crate::kinds::NormKind;

/// Layer normalisation over the columns of each row.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm {
    /// Parameter index of the gain (`dim`, initialised to 1).
    pub gain: usize,
    /// Parameter index of the bias (`dim`, initialised to 0).
    pub bias: usize,
    pub dim: usize,
    /// Added to the variance (PyTorch's default, 1e-5).
    pub eps: f32,
}

/// What the forward keeps for the backward.
#[derive(Debug)]
pub struct NormCache<B: Backend = Cpu> {
    /// The normalised input `(x - mean) / std`, before gain and bias.
    xhat: B::Mat,
    /// `1 / std` per row (`rows × 1`).
    inv_std: B::Mat,
}

impl LayerNorm {
    /// Register `{prefix}.gain` (ones) and `{prefix}.bias` (zeros).
    pub fn new(params: &mut ParamStore<Cpu>, prefix: &str, dim: usize) -> LayerNorm {
        let gain = params.add(format!("{prefix}.gain"), &[dim]);
        params.view_mut(gain).fill(1.0);
        let bias = params.add(format!("{prefix}.bias"), &[dim]);
        LayerNorm {
            gain,
            bias,
            dim,
            eps: 1e-5,
        }
    }

    /// Normalise every row of `x` (`rows × dim`).
    pub fn forward<B: Backend>(
        &self,
        params: &ParamStore<B>,
        x: B::View<'_>,
    ) -> (B::Mat, NormCache<B>) {
        let be = params.backend();
        assert_eq!(be.dim(x).1, self.dim, "layer norm: input columns");
        let (y, xhat, inv_std) =
            be.layer_norm(x, params.view(self.gain), params.view(self.bias), self.eps);
        (y, NormCache { xhat, inv_std })
    }

    /// Accumulate the gain and bias gradients from `dy`; return `dx`.
    pub fn backward<B: Backend>(
        &self,
        params: &mut ParamStore<B>,
        cache: NormCache<B>,
        dy: B::View<'_>,
    ) -> B::Mat {
        let be = params.backend().clone();
        let (dx, d_gain, d_bias) = be.layer_norm_backward(
            be.view(&cache.xhat),
            be.view(&cache.inv_std),
            params.view(self.gain),
            dy,
        );
        be.add_scaled(params.grad_mut(self.gain), 1.0, be.view(&d_gain));
        be.add_scaled(params.grad_mut(self.bias), 1.0, be.view(&d_bias));
        dx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn rows_come_out_with_zero_mean_and_unit_variance() {
        let mut p = ParamStore::new();
        let ln = LayerNorm::new(&mut p, "ln", 5);
        let x = Array2::from_shape_fn((4, 5), |(i, j)| (i * 5 + j * j) as f32 * 0.3 - 1.0);
        let (y, _) = ln.forward(&p, x.view());
        for row in y.rows() {
            let mean = row.sum() / 5.0;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 5.0;
            assert!(mean.abs() < 1e-5, "{mean}");
            assert!((var - 1.0).abs() < 1e-3, "{var}");
        }
    }

    #[test]
    fn norm_kind_parses_and_names_bad_values() {
        assert_eq!("layer".parse::<NormKind>().unwrap(), NormKind::Layer);
        assert_eq!("none".parse::<NormKind>().unwrap(), NormKind::None);
        let err = "batch".parse::<NormKind>().unwrap_err().to_string();
        assert!(err.contains("batch") && err.contains("layer"), "{err}");
    }
}
