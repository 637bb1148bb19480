//! Losses on logits (twin: `cpu::loss`): the SUM of the per-row losses, returned on the host
//! as an `f64` added in row order (as the CPU adds it), and its gradient on the device,
//! optionally scaled (a caller's `1/|batch|`) in the same pass. The per-row values are the
//! CPU's operations in its order; only the device's `exp` / `log` differ.

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cuda::kernels::{per_thread, per_warp};
use crate::backend::cuda::mat::{DevMat, DevVec, DevView};

/// Softmax cross-entropy against class ids `labels` (one per row, each in `0..classes`,
/// checked on load by `cpu::loss::check_labels`): `(Σ_rows loss, scale · d Σ / d logits)`.
pub fn cross_entropy(logits: DevView, labels: &DevVec<i64>, scale: f32) -> Result<(f64, DevMat)> {
    let (rows, classes) = logits.dim();
    assert_eq!(labels.len(), rows, "cross_entropy: one label per row");
    same_device(logits.device(), labels.device());
    let device = logits.device();
    let grad = DevMat::zeros(device, rows, classes)?;
    if rows == 0 {
        return Ok((0.0, grad));
    }
    assert!(classes > 0, "cross_entropy: no classes");
    let losses = DevVec::<f32>::zeros(device, rows)?;
    launch(
        device,
        "gnn_cross_entropy",
        per_warp(rows),
        Args::new()
            .ptr(grad.view().ptr())
            .ptr(losses.ptr())
            .ptr(logits.ptr())
            .ptr(labels.ptr())
            .u64(rows)
            .u32(classes)
            .f32(scale),
    )?;
    let total = losses.download()?.iter().map(|&l| l as f64).sum();
    Ok((total, grad))
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
    let (rows, cols) = logits.dim();
    assert_eq!(targets.len(), rows * cols, "bce_with_logits: shapes differ");
    let device = logits.device();
    let grad = DevMat::zeros(device, rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok((0.0, grad));
    }
    // f64 per row, read back as their bits (the device arrays hold plain integers and f32).
    let losses = DevVec::<u64>::zeros(device, rows)?;
    launch(
        device,
        "gnn_bce_with_logits",
        per_thread(rows),
        Args::new()
            .ptr(grad.view().ptr())
            .ptr(losses.ptr())
            .ptr(logits.ptr())
            .ptr(targets.ptr())
            .u64(rows)
            .u32(cols)
            .f32(scale),
    )?;
    let total = losses.download()?.iter().map(|&b| f64::from_bits(b)).sum();
    Ok((total, grad))
}

/// [`bce_with_logits`] with the targets on the host.
pub fn bce_with_logits_host(
    logits: DevView,
    targets: ndarray::ArrayView2<i64>,
    scale: f32,
) -> Result<(f64, DevMat)> {
    assert_eq!(
        targets.dim(),
        logits.dim(),
        "bce_with_logits: shapes differ"
    );
    let t: Vec<i64> = targets.iter().copied().collect();
    let t = DevVec::upload(logits.device(), &t)?;
    bce_with_logits(logits, &t, scale)
}
