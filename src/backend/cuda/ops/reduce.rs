//! Column sums in a fixed order (twin: `cpu::gather::column_sums`, and GAT's per-head weighted
//! sums): rows cut into the CPU's chunks, each chunk summed in row order, the chunks' partial
//! rows added in order. No float atomics, so results are the same from run to run, and bitwise
//! the CPU's.

use anyhow::Result;

use super::{launch, same_device, Args};
use crate::backend::cuda::kernels::per_thread;
use crate::backend::cuda::mat::{DevMat, DevVec, DevView, DevViewMut};

/// Rows per chunk of the sums over `cols` columns: the CPU's choice
/// (`rows_per_task(cols).max(64)`), which makes the sums bitwise equal.
pub fn chunk_rows(cols: usize) -> usize {
    crate::backend::cpu::rows_per_task(cols).max(64)
}

/// What each row contributes to the sums.
#[derive(Clone, Copy, Debug)]
pub enum Terms<'a> {
    /// `x[r, c]`.
    Plain,
    /// `x[r, c]·y[r, c]` (the product rounded first).
    Times(DevView<'a>),
    /// `coef[r, c / f]·x[r, c]`: `coef` has `cols / f` columns (one per head).
    PerHead { coef: DevView<'a>, f: usize },
}

/// `out (+)= Σ_r term(r, ·)` over the rows of `x` (`out` is `1 × cols`; with `accumulate` the
/// sums are added to it, else they replace it).
pub fn column_sums_into(x: DevView, terms: Terms, out: DevViewMut, accumulate: bool) -> Result<()> {
    let (rows, cols) = x.dim();
    assert_eq!(
        out.rows() * out.cols(),
        cols,
        "column sums: the output holds one value per column"
    );
    same_device(x.device(), out.device());
    if cols == 0 {
        return Ok(());
    }
    let device = x.device();
    let chunk = chunk_rows(cols);
    let chunks = rows.div_ceil(chunk);
    if chunks == 0 {
        return if accumulate {
            Ok(())
        } else {
            super::elementwise::fill(out, 0.0)
        };
    }
    let (y, coef, heads, f) = match terms {
        Terms::Plain => (None, None, 1, 1),
        Terms::Times(y) => {
            assert_eq!(y.dim(), x.dim(), "column sums: factor shape");
            (Some(y.ptr()), None, 1, 1)
        }
        Terms::PerHead { coef, f } => {
            assert!(
                f > 0 && cols.is_multiple_of(f),
                "column sums: {cols} columns in heads of {f}"
            );
            assert_eq!(
                coef.dim(),
                (rows, cols / f),
                "column sums: one coefficient per row and head"
            );
            (None, Some(coef.ptr()), cols / f, f)
        }
    };
    let partials = DevVec::<f32>::uninit(device, chunks * cols)?;
    launch(
        device,
        "gnn_colsum_partial",
        per_thread(chunks * cols),
        Args::new()
            .ptr(partials.ptr())
            .ptr(x.ptr())
            .opt(y)
            .opt(coef)
            .u64(rows)
            .u32(cols)
            .u32(heads)
            .u32(f)
            .u64(chunk)
            .u64(chunks),
    )?;
    launch(
        device,
        "gnn_colsum_finish",
        per_thread(cols),
        Args::new()
            .ptr(out.ptr())
            .ptr(partials.ptr())
            .u64(chunks)
            .u32(cols)
            .flag(accumulate),
    )
}

/// `Σ_rows x` as a `1 × cols` matrix.
pub fn column_sums(x: DevView) -> Result<DevMat> {
    let mut out = DevMat::uninit(x.device(), 1, x.cols())?;
    column_sums_into(x, Terms::Plain, out.view_mut(), false)?;
    Ok(out)
}

/// `grad += Σ_rows dz` (`grad` is `1 × cols`): a bias gradient.
pub fn add_column_sums(grad: DevViewMut, dz: DevView) -> Result<()> {
    column_sums_into(dz, Terms::Plain, grad, true)
}
