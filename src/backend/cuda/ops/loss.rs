//! Losses on logits (twin: `cpu::loss`): the per-row losses, written where the caller says
//! (the training loop's [`crate::backend::cuda::loss_journal`], read a group of steps at a
//! time) or summed here on the host as an `f64` added in row order (as the CPU adds it), and
//! the gradient on the device, optionally scaled (a caller's `1/|batch|`) in the same pass.
//! The per-row values are the CPU's operations in its order; only the device's `exp` / `log`
//! differ.

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cuda::gpu::DevPtr;
use crate::backend::cuda::kernels::{per_thread, per_warp};
use crate::backend::cuda::mat::{DevMat, DevVec, DevView};

/// Softmax cross-entropy against class ids `labels` (one per row, each in `0..classes`,
/// checked on load by `cpu::loss::check_labels`): `(Σ_rows loss, scale · d Σ / d logits)`.
pub fn cross_entropy(logits: DevView, labels: &DevVec<i64>, scale: f32) -> Result<(f64, DevMat)> {
    let losses = DevVec::<f32>::zeros(logits.device(), logits.rows())?;
    let grad = cross_entropy_into(logits, labels, scale, losses.ptr())?;
    let total = losses.download()?.iter().map(|&l| l as f64).sum();
    Ok((total, grad))
}

/// [`cross_entropy`] writing the per-row losses (`f32`) to `losses` (zeroed, one per row)
/// instead of summing them: the gradient alone comes back.
pub fn cross_entropy_into(
    logits: DevView,
    labels: &DevVec<i64>,
    scale: f32,
    losses: DevPtr,
) -> Result<DevMat> {
    let (rows, classes) = logits.dim();
    assert_eq!(labels.len(), rows, "cross_entropy: one label per row");
    same_device(logits.device(), labels.device());
    let device = logits.device();
    // The kernel writes every element of the gradient.
    let grad = DevMat::uninit(device, rows, classes)?;
    if rows == 0 {
        return Ok(grad);
    }
    assert!(classes > 0, "cross_entropy: no classes");
    launch(
        device,
        "gnn_cross_entropy",
        per_warp(rows),
        Args::new()
            .ptr(grad.view().ptr())
            .ptr(losses)
            .ptr(logits.ptr())
            .ptr(labels.ptr())
            .u64(rows)
            .u32(classes)
            .f32(scale),
    )?;
    Ok(grad)
}

/// [`cross_entropy`] with the labels on the host (uploaded for this call).
pub fn cross_entropy_host(logits: DevView, labels: &[i64], scale: f32) -> Result<(f64, DevMat)> {
    let labels = DevVec::upload(logits.device(), labels)?;
    cross_entropy(logits, &labels, scale)
}

/// Binary cross-entropy with logits against 0/1 `targets` (`rows × cols`, row-major; any
/// non-zero counts as 1): `(Σ loss, scale · (σ(x) − t))`.
pub fn bce_with_logits(
    logits: DevView,
    targets: &DevVec<i64>,
    scale: f32,
) -> Result<(f64, DevMat)> {
    // f64 per row, read back as their bits (the device arrays hold plain integers and f32).
    let losses = DevVec::<u64>::zeros(logits.device(), logits.rows())?;
    let grad = bce_with_logits_into(logits, targets, scale, losses.ptr())?;
    let total = losses.download()?.iter().map(|&b| f64::from_bits(b)).sum();
    Ok((total, grad))
}

/// [`bce_with_logits`] writing the per-row losses (`f64`) to `losses` (one per row) instead of
/// summing them: the gradient alone comes back.
pub fn bce_with_logits_into(
    logits: DevView,
    targets: &DevVec<i64>,
    scale: f32,
    losses: DevPtr,
) -> Result<DevMat> {
    let (rows, cols) = logits.dim();
    assert_eq!(targets.len(), rows * cols, "bce_with_logits: shapes differ");
    let device = logits.device();
    // The kernel writes every element of the gradient.
    let grad = DevMat::uninit(device, rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(grad);
    }
    launch(
        device,
        "gnn_bce_with_logits",
        per_thread(rows),
        Args::new()
            .ptr(grad.view().ptr())
            .ptr(losses)
            .ptr(logits.ptr())
            .ptr(targets.ptr())
            .u64(rows)
            .u32(cols)
            .f32(scale),
    )?;
    Ok(grad)
}

/// [`bce_with_logits`] with the targets on the host.
pub fn bce_with_logits_host(
    logits: DevView,
    targets: ndarray::ArrayView2<i64>,
    scale: f32,
) -> Result<(f64, DevMat)> {
    let t = upload_targets(logits, targets)?;
    bce_with_logits(logits, &t, scale)
}

/// `targets` (the shape of `logits`, checked) on the device, row-major as the kernel reads
/// them.
pub fn upload_targets(logits: DevView, targets: ndarray::ArrayView2<i64>) -> Result<DevVec<i64>> {
    assert_eq!(
        targets.dim(),
        logits.dim(),
        "bce_with_logits: shapes differ"
    );
    let t: Vec<i64> = targets.iter().copied().collect();
    DevVec::upload(logits.device(), &t)
}
