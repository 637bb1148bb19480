//! Layer normalisation per row and its backward (twin: `LayerNorm` in `nn::norm`, whose
//! kernels the CPU backend keeps in `cpu::norm`): `y = (x − mean)/sqrt(var + eps)·gain + bias`,
//! keeping `xhat` and `1/std` per row. The row sums are warp reductions (within 1e-5 of the
//! CPU's sequential sums, not bitwise); the gain and bias gradients are the fixed-order column
//! sums of [`super::reduce`], bitwise the CPU's given the same `dy` and `xhat`.

use anyhow::Result;

use super::reduce::{column_sums_into, Terms};
use super::{launch, same_device, Args};
use crate::backend::cuda::kernels::per_warp;
use crate::backend::cuda::mat::{DevMat, DevView, DevViewMut};

/// Normalise each row of `x` (`gain`, `bias`: `cols` values each): `(y, xhat, inv_std)` with
/// `inv_std` a `rows × 1` matrix.
pub fn layer_norm(
    x: DevView,
    gain: DevView,
    bias: DevView,
    eps: f32,
) -> Result<(DevMat, DevMat, DevMat)> {
    let (rows, dim) = x.dim();
    assert_eq!(gain.rows() * gain.cols(), dim, "layer norm: gain length");
    assert_eq!(bias.rows() * bias.cols(), dim, "layer norm: bias length");
    same_device(x.device(), gain.device());
    let device = x.device();
    let y = DevMat::zeros(device, rows, dim)?;
    let xhat = DevMat::zeros(device, rows, dim)?;
    let inv_std = DevMat::zeros(device, rows, 1)?;
    if rows > 0 && dim > 0 {
        launch(
            device,
            "gnn_layernorm_forward",
            per_warp(rows),
            Args::new()
                .ptr(y.view().ptr())
                .ptr(xhat.view().ptr())
                .ptr(inv_std.view().ptr())
                .ptr(x.ptr())
                .ptr(gain.ptr())
                .ptr(bias.ptr())
                .u64(rows)
                .u32(dim)
                .f32(eps),
        )?;
    }
    Ok((y, xhat, inv_std))
}

/// The backward: `d_gain += Σ_rows dy·xhat`, `d_bias += Σ_rows dy`, and `dx` returned.
pub fn layer_norm_backward(
    xhat: DevView,
    inv_std: DevView,
    gain: DevView,
    dy: DevView,
    d_gain: DevViewMut,
    d_bias: DevViewMut,
) -> Result<DevMat> {
    let (rows, dim) = xhat.dim();
    assert_eq!(dy.dim(), (rows, dim), "layer norm: gradient shape");
    assert_eq!(
        inv_std.rows() * inv_std.cols(),
        rows,
        "layer norm: one 1/std per row"
    );
    assert_eq!(gain.rows() * gain.cols(), dim, "layer norm: gain length");
    let device = dy.device();
    let dx = DevMat::zeros(device, rows, dim)?;
    if rows == 0 || dim == 0 {
        return Ok(dx);
    }
    launch(
        device,
        "gnn_layernorm_backward",
        per_warp(rows),
        Args::new()
            .ptr(dx.view().ptr())
            .ptr(dy.ptr())
            .ptr(xhat.ptr())
            .ptr(inv_std.ptr())
            .ptr(gain.ptr())
            .u64(rows)
            .u32(dim),
    )?;
    column_sums_into(dy, Terms::Times(xhat), d_gain, true)?;
    column_sums_into(dy, Terms::Plain, d_bias, true)?;
    Ok(dx)
}
