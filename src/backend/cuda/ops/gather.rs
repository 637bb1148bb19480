//! Rows by index (twins: `cpu::gather::gather_rows`, ndarray's `select` for picked rows, the
//! assignment of picked rows' gradients into zeros, `cpu::gather::copy_rows` and
//! `cpu::gather::scatter_add_rows`).

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cuda::gpu::Device;
use crate::backend::cuda::kernels::per_warp;
use crate::backend::cuda::mat::{DevMat, DevVec, DevView, DevViewMut};

/// `out[i] ← src[idx[i]]` into `out` (`idx.len()` rows).
///
/// # Panics
/// If the shapes disagree. Indices must be below `src.rows()` (they come from validated
/// blocks; the kernel does not check them).
pub fn gather_rows_into(src: DevView, idx: &DevVec<u32>, out: DevViewMut) -> Result<()> {
    assert_eq!(
        out.rows(),
        idx.len(),
        "gather_rows: one index per output row"
    );
    assert_eq!(out.cols(), src.cols(), "gather_rows: column counts differ");
    same_device(src.device(), out.device());
    if idx.is_empty() || src.cols() == 0 {
        return Ok(());
    }
    launch(
        out.device(),
        "gnn_gather_rows",
        per_warp(idx.len()),
        Args::new()
            .ptr(out.ptr())
            .ptr(src.ptr())
            .ptr(idx.ptr())
            .u64(idx.len())
            .u32(src.cols()),
    )
}

/// The rows of `src` listed in `idx`, in that order.
pub fn gather_rows(src: DevView, idx: &DevVec<u32>) -> Result<DevMat> {
    let mut out = DevMat::uninit(src.device(), idx.len(), src.cols())?;
    gather_rows_into(src, idx, out.view_mut())?;
    Ok(out)
}

/// `rows × cols` zeros with row `idx[i]` set to row `i` of `src` (`idx` distinct: the gradient
/// of picked rows, e.g. the loss rows of a full-batch step, spread back over all rows).
pub fn scatter_rows(src: DevView, idx: &DevVec<u32>, rows: usize) -> Result<DevMat> {
    assert_eq!(src.rows(), idx.len(), "scatter_rows: one index per row");
    let mut out = DevMat::zeros(src.device(), rows, src.cols())?;
    if idx.is_empty() || src.cols() == 0 {
        return Ok(out);
    }
    launch(
        src.device(),
        "gnn_scatter_rows",
        per_warp(idx.len()),
        Args::new()
            .ptr(out.view_mut().ptr())
            .ptr(src.ptr())
            .ptr(idx.ptr())
            .u64(idx.len())
            .u32(src.cols()),
    )?;
    Ok(out)
}

/// `dst[dst_idx[i]] ← src[src_idx[i]]` for every `i`; the other rows of `dst` keep their
/// values (twin: `cpu::gather::copy_rows`, bitwise: rows are moved, not computed).
///
/// # Panics
/// As the twin: the index lists are checked on the host before they go up.
pub fn copy_rows(dst: DevViewMut, dst_idx: &[u32], src: DevView, src_idx: &[u32]) -> Result<()> {
    assert_eq!(src.cols(), dst.cols(), "copy_rows: column counts differ");
    crate::backend::cpu::gather::copy_sources(dst.rows(), dst_idx, src.rows(), src_idx);
    same_device(src.device(), dst.device());
    if dst_idx.is_empty() || src.cols() == 0 {
        return Ok(());
    }
    let device = dst.device();
    let dst_idx_d = DevVec::upload(device, dst_idx)?;
    let src_idx_d = DevVec::upload(device, src_idx)?;
    launch(
        device,
        "gnn_copy_rows",
        per_warp(dst_idx.len()),
        Args::new()
            .ptr(dst.ptr())
            .ptr(dst_idx_d.ptr())
            .ptr(src.ptr())
            .ptr(src_idx_d.ptr())
            .u64(dst_idx.len())
            .u32(src.cols()),
    )
}

/// `dst[idx[i]] += src[i]` for every row `i` of `src`, rows with the same target summed in the
/// order of `i` (twin: `cpu::gather::scatter_add_rows`, bitwise). The rows are grouped by
/// target on the host (the CPU's stable counting sort), and one warp per distinct target adds
/// its rows in that order: no atomics, so the sums never depend on scheduling.
///
/// # Panics
/// If the shapes disagree or a target is past `dst`'s rows.
pub fn scatter_add_rows(dst: DevViewMut, idx: &[u32], src: DevView) -> Result<()> {
    assert_eq!(src.rows(), idx.len(), "scatter_add_rows: one index per row");
    assert_eq!(
        src.cols(),
        dst.cols(),
        "scatter_add_rows: column counts differ"
    );
    same_device(src.device(), dst.device());
    if idx.is_empty() || src.cols() == 0 {
        return Ok(());
    }
    let (start, order) = crate::backend::cpu::gather::group_by_target(idx, dst.rows());
    // Only the targets that receive rows: an exchange often lands a few rows in a tall matrix.
    let mut targets = Vec::new();
    let mut seg = vec![0u64];
    for t in 0..dst.rows() {
        if start[t + 1] > start[t] {
            targets.push(t as u32);
            seg.push(start[t + 1] as u64);
        }
    }
    let device = dst.device();
    let targets_d = DevVec::upload(device, &targets)?;
    let seg_d = DevVec::upload(device, &seg)?;
    let order_d = DevVec::upload(device, &order)?;
    launch(
        device,
        "gnn_scatter_add_rows",
        per_warp(targets.len()),
        Args::new()
            .ptr(dst.ptr())
            .ptr(src.ptr())
            .ptr(targets_d.ptr())
            .ptr(seg_d.ptr())
            .ptr(order_d.ptr())
            .u64(targets.len())
            .u32(src.cols()),
    )
}

/// Host row positions as the kernels' `u32` indices, uploaded.
///
/// # Panics
/// If a position does not fit 32 bits.
pub fn upload_indices(device: &Device, idx: &[usize]) -> Result<DevVec<u32>> {
    let v: Vec<u32> = idx
        .iter()
        .map(|&i| u32::try_from(i).expect("row index past 2^32"))
        .collect();
    DevVec::upload(device, &v)
}
