//! Layer normalisation per row, `y = (x - mean(x)) / sqrt(var(x) + eps) · gain + bias`, with
//! a learned gain and bias in the flat [`ParamStore`] and an explicit backward.
//!
//! Rows are independent, so forward and backward run in parallel over rows; the gain / bias
//! gradients are column sums with a fixed chunking ([`column_sums`]), so they do not depend
//! on the thread count.

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::params::ParamStore;
use crate::backend::cpu::gather::{axpy, column_sums};
use crate::backend::cpu::rows_per_task;

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
pub struct NormCache {
    /// The normalised input `(x - mean) / std`, before gain and bias.
    xhat: Array2<f32>,
    /// `1 / std` per row.
    inv_std: Vec<f32>,
}

impl LayerNorm {
    /// Register `{prefix}.gain` (ones) and `{prefix}.bias` (zeros).
    pub fn new(params: &mut ParamStore, prefix: &str, dim: usize) -> LayerNorm {
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
    pub fn forward(&self, params: &ParamStore, x: ArrayView2<f32>) -> (Array2<f32>, NormCache) {
        assert_eq!(x.ncols(), self.dim, "layer norm: input columns");
        let (rows, dim) = x.dim();
        let x = crate::backend::cpu::standard(x);
        let xs = x.as_slice().expect("standard layout");
        let gain = params.view(self.gain);
        let gain = gain.to_slice().expect("contiguous");
        let bias = params.view(self.bias);
        let bias = bias.to_slice().expect("contiguous");
        let mut y = Array2::<f32>::zeros((rows, dim));
        let mut xhat = Array2::<f32>::zeros((rows, dim));
        let mut inv_std = vec![0f32; rows];
        if rows == 0 || dim == 0 {
            return (y, NormCache { xhat, inv_std });
        }
        let chunk = rows_per_task(4 * dim);
        y.as_slice_mut()
            .expect("fresh array")
            .par_chunks_mut(dim)
            .zip(
                xhat.as_slice_mut()
                    .expect("fresh array")
                    .par_chunks_mut(dim),
            )
            .zip(inv_std.par_iter_mut())
            .zip(xs.par_chunks(dim))
            .with_min_len(chunk)
            .for_each(|(((y, xh), is), x)| {
                let n = dim as f32;
                let mean = x.iter().sum::<f32>() / n;
                let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n;
                let inv = 1.0 / (var + self.eps).sqrt();
                *is = inv;
                for j in 0..dim {
                    let h = (x[j] - mean) * inv;
                    xh[j] = h;
                    y[j] = h * gain[j] + bias[j];
                }
            });
        (y, NormCache { xhat, inv_std })
    }

    /// Accumulate the gain and bias gradients from `dy`; return `dx`.
    ///
    /// With `g = dy · gain`: `dx = inv_std · (g - mean(g) - xhat · mean(g · xhat))`.
    pub fn backward(
        &self,
        params: &mut ParamStore,
        cache: NormCache,
        dy: ArrayView2<f32>,
    ) -> Array2<f32> {
        let NormCache { xhat, inv_std } = cache;
        assert_eq!(dy.dim(), xhat.dim(), "layer norm: gradient shape");
        let (rows, dim) = xhat.dim();
        let dy = crate::backend::cpu::standard(dy);
        let dys = dy.as_slice().expect("standard layout");
        // d gain = Σ_rows dy · xhat (the product first, then the fixed-order column sums).
        let mut prod = Array2::<f32>::zeros((rows, dim));
        let mut dx = Array2::<f32>::zeros((rows, dim));
        if rows == 0 || dim == 0 {
            return dx;
        }
        let gain = params.view(self.gain).to_owned();
        let gain = gain.as_slice().expect("contiguous");
        let chunk = rows_per_task(6 * dim);
        dx.as_slice_mut()
            .expect("fresh array")
            .par_chunks_mut(dim)
            .zip(
                prod.as_slice_mut()
                    .expect("fresh array")
                    .par_chunks_mut(dim),
            )
            .zip(xhat.as_slice().expect("standard").par_chunks(dim))
            .zip(dys.par_chunks(dim))
            .zip(inv_std.par_iter())
            .with_min_len(chunk)
            .for_each(|((((dx, p), xh), dy), &inv)| {
                let n = dim as f32;
                let (mut mean_g, mut mean_gx) = (0f32, 0f32);
                for j in 0..dim {
                    let g = dy[j] * gain[j];
                    mean_g += g;
                    mean_gx += g * xh[j];
                    p[j] = dy[j] * xh[j];
                }
                mean_g /= n;
                mean_gx /= n;
                for j in 0..dim {
                    let g = dy[j] * gain[j];
                    dx[j] = inv * (g - mean_g - xh[j] * mean_gx);
                }
            });
        let d_gain = column_sums(prod.view());
        let d_bias = column_sums(dy.view());
        let mut g = params.grad_mut(self.gain);
        axpy(
            1.0,
            d_gain.as_slice().expect("contiguous"),
            g.as_slice_mut().expect("contiguous"),
        );
        let mut g = params.grad_mut(self.bias);
        axpy(
            1.0,
            d_bias.as_slice().expect("contiguous"),
            g.as_slice_mut().expect("contiguous"),
        );
        dx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
