//! Element-wise passes and row copies (twins: `cpu::gather::{axpy, add_assign}`, ndarray's
//! `fill`, `*=`, `+=`, concatenation and padding).

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cuda::kernels::per_thread;
use crate::backend::cuda::mat::{DevMat, DevView, DevViewMut};

const F32: usize = std::mem::size_of::<f32>();

fn len(dim: (usize, usize)) -> usize {
    dim.0 * dim.1
}

/// `x ← value` everywhere.
pub fn fill(x: DevViewMut, value: f32) -> Result<()> {
    let n = len(x.dim());
    if n == 0 {
        return Ok(());
    }
    if value.to_bits() == 0 {
        return x.device().gpu.zero(x.ptr(), n * F32);
    }
    launch(
        x.device(),
        "gnn_fill",
        per_thread(n),
        Args::new().ptr(x.ptr()).u64(n).f32(value),
    )
}

/// `x ← a·x`.
pub fn scale(x: DevViewMut, a: f32) -> Result<()> {
    let n = len(x.dim());
    if n == 0 {
        return Ok(());
    }
    launch(
        x.device(),
        "gnn_scale",
        per_thread(n),
        Args::new().ptr(x.ptr()).u64(n).f32(a),
    )
}

/// `y ← y + a·x` (the product rounded, then the sum; the CPU's `axpy`).
pub fn axpy(a: f32, x: DevView, y: DevViewMut) -> Result<()> {
    assert_eq!(x.dim(), y.dim(), "axpy: shapes differ");
    same_device(x.device(), y.device());
    let n = len(x.dim());
    if n == 0 {
        return Ok(());
    }
    launch(
        y.device(),
        "gnn_axpy",
        per_thread(n),
        Args::new().ptr(y.ptr()).ptr(x.ptr()).u64(n).f32(a),
    )
}

/// `y ← y + x` (a residual: pass the destination rows, `view.row_range(0..num_dst)`).
pub fn add_assign(y: DevViewMut, x: DevView) -> Result<()> {
    axpy(1.0, x, y)
}

/// `out ← a·x + b·y` (each product rounded, then the sum).
pub fn lincomb(out: DevViewMut, a: f32, x: DevView, b: f32, y: DevView) -> Result<()> {
    assert_eq!(x.dim(), out.dim(), "lincomb: shapes differ");
    assert_eq!(y.dim(), out.dim(), "lincomb: shapes differ");
    let n = len(out.dim());
    if n == 0 {
        return Ok(());
    }
    launch(
        out.device(),
        "gnn_lincomb",
        per_thread(n),
        Args::new()
            .ptr(out.ptr())
            .ptr(x.ptr())
            .ptr(y.ptr())
            .u64(n)
            .f32(a)
            .f32(b),
    )
}

/// Copy `src` into `dst` (same shape).
pub fn copy(dst: DevViewMut, src: DevView) -> Result<()> {
    assert_eq!(dst.dim(), src.dim(), "copy: shapes differ");
    let n = len(src.dim());
    if n == 0 {
        return Ok(());
    }
    dst.device().gpu.copy(dst.ptr(), src.ptr(), n * F32)
}

/// `[a; b]`: the rows of `a`, then those of `b`.
pub fn concat_rows(a: DevView, b: DevView) -> Result<DevMat> {
    assert_eq!(a.cols(), b.cols(), "concat_rows: column counts differ");
    let mut out = DevMat::uninit(a.device(), a.rows() + b.rows(), a.cols())?;
    let (ra, rb) = (a.rows(), b.rows());
    copy(out.view_mut().row_range(0..ra), a)?;
    copy(out.view_mut().row_range(ra..ra + rb), b)?;
    Ok(out)
}

/// `x` followed by zero rows up to `rows` rows.
pub fn pad_rows(x: DevView, rows: usize) -> Result<DevMat> {
    assert!(rows >= x.rows(), "pad_rows: {rows} < {} rows", x.rows());
    let mut out = DevMat::uninit(x.device(), rows, x.cols())?;
    let r = x.rows();
    copy(out.view_mut().row_range(0..r), x)?;
    fill(out.view_mut().row_range(r..rows), 0.0)?;
    Ok(out)
}
