//! Layer normalisation per row, `y = (x − mean(x)) / sqrt(var(x) + eps) · gain + bias`, and its
//! backward. Rows are independent, so both run in parallel over rows; the gain / bias gradients
//! are column sums with a fixed chunking ([`column_sums`]), so they do not depend on the
//! thread count.

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::gather::column_sums;
use super::rows_per_task;

/// Normalise every row of `x` with `gain` and `bias` (`cols` each): returns `y`, the
/// normalised input `xhat = (x − mean)/std`, and `1/std` per row.
pub fn layer_norm(
    x: ArrayView2<f32>,
    gain: &[f32],
    bias: &[f32],
    eps: f32,
) -> (Array2<f32>, Array2<f32>, Vec<f32>) {
    let (rows, dim) = x.dim();
    assert_eq!(gain.len(), dim, "layer norm: gain length");
    assert_eq!(bias.len(), dim, "layer norm: bias length");
    let x = super::standard(x);
    let xs = x.as_slice().expect("standard layout");
    let mut y = Array2::<f32>::zeros((rows, dim));
    let mut xhat = Array2::<f32>::zeros((rows, dim));
    let mut inv_std = vec![0f32; rows];
    if rows == 0 || dim == 0 {
        return (y, xhat, inv_std);
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
            let inv = 1.0 / (var + eps).sqrt();
            *is = inv;
            for j in 0..dim {
                let h = (x[j] - mean) * inv;
                xh[j] = h;
                y[j] = h * gain[j] + bias[j];
            }
        });
    (y, xhat, inv_std)
}

/// The backward of [`layer_norm`]: `dx`, and the gain and bias gradients `Σ_rows dy·xhat` and
/// `Σ_rows dy` (`1 × cols` each, fixed-order column sums). With `g = dy · gain`:
/// `dx = inv_std · (g − mean(g) − xhat · mean(g · xhat))`.
pub fn layer_norm_backward(
    xhat: ArrayView2<f32>,
    inv_std: &[f32],
    gain: &[f32],
    dy: ArrayView2<f32>,
) -> (Array2<f32>, Array2<f32>, Array2<f32>) {
    assert_eq!(dy.dim(), xhat.dim(), "layer norm: gradient shape");
    let (rows, dim) = xhat.dim();
    assert_eq!(inv_std.len(), rows, "layer norm: one 1/std per row");
    let dy = super::standard(dy);
    let dys = dy.as_slice().expect("standard layout");
    let xhat = super::standard(xhat);
    // d gain = Σ_rows dy · xhat (the product first, then the fixed-order column sums).
    let mut prod = Array2::<f32>::zeros((rows, dim));
    let mut dx = Array2::<f32>::zeros((rows, dim));
    if rows == 0 || dim == 0 {
        return (dx, Array2::zeros((1, dim)), Array2::zeros((1, dim)));
    }
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
    let row = |v: ndarray::Array1<f32>| v.insert_axis(ndarray::Axis(0));
    (
        dx,
        row(column_sums(prod.view())),
        row(column_sums(dy.view())),
    )
}
