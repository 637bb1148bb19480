//! A product's epilogue (twin: `cpu::gemm::matmul_onto_bias_relu` and friends): after cuBLAS
//! writes `[onto +] a·b`, one pass adds the bias, applies a ReLU recording its signs, and
//! applies the next layer's input dropout recording the kept elements. Given the same product
//! the results are bitwise the CPU's (`v + bias`, `v > 0 ? v : 0`, `kept ? v·scale : 0`); the
//! product itself is cuBLAS's (its own summation order).
//!
//! Layouts: the ReLU's signs are flat over the output's row-major elements (bit `i·n + j`,
//! `Saved::Positive`); the kept bits are bit `i·n + j` too, which is `KeptBits`' padded layout
//! because a fused dropout requires `n % 64 == 0` (as on the CPU).

use anyhow::Result;

use super::dropout::{DevKept, MaskArgs, RowMask};
use super::{launch, same_device, Args};
use crate::backend::cuda::blas;
use crate::backend::cuda::kernels::per_warp;
use crate::backend::cuda::mat::{DevMat, DevVec, DevView, DevViewMut};

/// `c ← drop(relu(c + bias))`, each part optional; returns the ReLU's signs (with `relu`) and
/// the kept bits (with `dropout`, which needs `cols % 64 == 0`).
///
/// # Panics
/// If the bias is not `cols` long, the dropout's rows are not `c`'s, or a dropout is asked
/// for on rows that are not whole 64-bit words.
pub fn apply(
    c: DevViewMut,
    bias: Option<DevView>,
    relu: bool,
    dropout: Option<RowMask>,
) -> Result<(Option<DevVec<u64>>, Option<DevKept>)> {
    let (rows, cols) = c.dim();
    let device = c.device();
    if let Some(b) = &bias {
        assert_eq!(b.rows() * b.cols(), cols, "epilogue: bias length");
        same_device(b.device(), device);
    }
    let n = rows * cols;
    let relu_bits = if relu {
        Some(DevVec::<u64>::uninit(device, n.div_ceil(64))?)
    } else {
        None
    };
    let kept = match &dropout {
        Some(d) => {
            assert_eq!(d.rows(), rows, "epilogue: one dropout seed per row");
            assert!(
                cols.is_multiple_of(64),
                "epilogue: a fused dropout needs whole 64-bit words per row"
            );
            Some(DevKept::from_product(
                rows,
                cols,
                d.scale(),
                DevVec::uninit(device, n / 64)?,
            ))
        }
        None => None,
    };
    if n > 0 && (bias.is_some() || relu || dropout.is_some()) {
        let m = dropout.map(|d| d.args()).unwrap_or(MaskArgs {
            keys: 0,
            seeds: 0,
            stream: 0,
            keep_below: 0,
            keep_all: false,
            scale: 1.0,
        });
        launch(
            device,
            "gnn_epilogue",
            per_warp(n.div_ceil(64)),
            Args::new()
                .ptr(c.ptr())
                .u64(rows)
                .u32(cols)
                .opt(bias.map(|b| b.ptr()))
                .flag(relu)
                .opt(relu_bits.as_ref().map(|b| b.ptr()))
                .mask(&m)
                .opt(kept.as_ref().map(|k| k.bits.ptr())),
        )?;
    }
    Ok((relu_bits, kept))
}

/// `z[i, :] += bias` for every row (`bias` holds `cols` values): the CPU's `add_to_rows`.
pub fn add_bias(z: DevViewMut, bias: DevView) -> Result<()> {
    apply(z, Some(bias), false, None).map(|_| ())
}

/// `[onto +] a·b`, then the bias, the ReLU (recording signs) and the dropout (recording kept
/// bits), each when given: the output, the signs with `relu`, the kept bits with `dropout`.
pub fn matmul_onto_bias_relu(
    onto: Option<DevMat>,
    a: DevView,
    b: DevView,
    bias: Option<DevView>,
    relu: bool,
    dropout: Option<RowMask>,
) -> Result<(DevMat, Option<DevVec<u64>>, Option<DevKept>)> {
    let (m, n) = (a.rows(), b.cols());
    let mut c = match onto {
        Some(mut c) => {
            assert_eq!(
                (c.rows(), c.cols()),
                (m, n),
                "gemm: the output to add onto has the product's shape"
            );
            blas::gemm_into(1.0, a, b, 1.0, c.view_mut())?;
            c
        }
        None => blas::matmul(a, b)?,
    };
    let (bits, kept) = apply(c.view_mut(), bias, relu, dropout)?;
    Ok((c, bits, kept))
}

/// `relu(a·b + bias)` (each part optional), with the ReLU's signs when `relu`.
pub fn matmul_bias_relu(
    a: DevView,
    b: DevView,
    bias: Option<DevView>,
    relu: bool,
) -> Result<(DevMat, Option<DevVec<u64>>)> {
    let (c, bits, _) = matmul_onto_bias_relu(None, a, b, bias, relu, None)?;
    Ok((c, bits))
}

/// [`matmul_bias_relu`], then `dropout` on the result, recording the kept elements.
pub fn matmul_bias_relu_dropout(
    a: DevView,
    b: DevView,
    bias: Option<DevView>,
    relu: bool,
    dropout: RowMask,
) -> Result<(DevMat, Option<DevVec<u64>>, DevKept)> {
    let (c, bits, kept) = matmul_onto_bias_relu(None, a, b, bias, relu, Some(dropout))?;
    Ok((c, bits, kept.expect("a dropout records its kept bits")))
}
