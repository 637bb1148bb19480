//! Row-major matrix products on [`Gpu::sgemm`](super::gpu::Gpu::sgemm) (cuBLAS's column-major
//! `C = alpha·op(A)·op(B) + beta·C`), the translation written once here.
//!
//! A row-major `r × c` matrix is, read column-major, its transpose (`c × r`, leading dimension
//! `c`). So the row-major `C = op(A)·op(B)` is the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`: cuBLAS's
//! first operand is our `B` and its second our `A`, each with our own transpose flag, and
//! cuBLAS's `m, n` are our `n, m`.
//!
//! Products are not bitwise the CPU's (cuBLAS sums in its own order, with FMAs); the
//! conformance suite compares them with a tolerance.

use anyhow::Result;

use super::gpu::Sgemm;
use super::mat::{DevMat, DevView, DevViewMut};

/// A row-major operand, transposed or not.
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    pub view: DevView<'a>,
    pub transposed: bool,
}

impl<'a> Operand<'a> {
    /// `x` as it is.
    pub fn n(view: DevView<'a>) -> Operand<'a> {
        Operand {
            view,
            transposed: false,
        }
    }

    /// `xᵀ`.
    pub fn t(view: DevView<'a>) -> Operand<'a> {
        Operand {
            view,
            transposed: true,
        }
    }

    /// Rows and columns of `op(x)`.
    pub fn dim(&self) -> (usize, usize) {
        let (r, c) = self.view.dim();
        if self.transposed {
            (c, r)
        } else {
            (r, c)
        }
    }
}

/// The cuBLAS call computing the row-major `c = alpha·op(a)·op(b) + beta·c`.
///
/// # Panics
/// If the shapes do not agree.
pub fn sgemm_of(alpha: f32, a: Operand, b: Operand, beta: f32, c: &DevViewMut) -> Sgemm {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert_eq!(k, k2, "gemm: inner dimensions differ ({m}×{k} · {k2}×{n})");
    assert_eq!(c.dim(), (m, n), "gemm: output {:?} is not {m}×{n}", c.dim());
    Sgemm {
        trans_a: b.transposed,
        trans_b: a.transposed,
        m: n,
        n: m,
        k,
        alpha,
        a: b.view.ptr(),
        lda: b.view.cols().max(1),
        b: a.view.ptr(),
        ldb: a.view.cols().max(1),
        beta,
        c: c.ptr(),
        ldc: n.max(1),
    }
}

/// `c = alpha·op(a)·op(b) + beta·c`; `beta == 0` overwrites `c` without reading it (an empty
/// inner dimension gives `beta·c`, zeros for `beta == 0`).
pub fn gemm_op(alpha: f32, a: Operand, b: Operand, beta: f32, c: DevViewMut) -> Result<()> {
    let g = sgemm_of(alpha, a, b, beta, &c);
    if g.m == 0 || g.n == 0 {
        return Ok(());
    }
    if g.k == 0 {
        return if beta == 0.0 {
            super::ops::elementwise::fill(c, 0.0)
        } else {
            super::ops::elementwise::scale(c, beta)
        };
    }
    c.device().gpu.sgemm(&g)
}

/// `c = alpha·a·b + beta·c`.
pub fn gemm_into(alpha: f32, a: DevView, b: DevView, beta: f32, c: DevViewMut) -> Result<()> {
    gemm_op(alpha, Operand::n(a), Operand::n(b), beta, c)
}

/// `a·b`, a new matrix.
pub fn matmul(a: DevView, b: DevView) -> Result<DevMat> {
    product(Operand::n(a), Operand::n(b))
}

/// `a·bᵀ` (an input gradient `dy·Wᵀ`).
pub fn matmul_nt(a: DevView, b: DevView) -> Result<DevMat> {
    product(Operand::n(a), Operand::t(b))
}

/// `aᵀ·b` (a weight gradient `xᵀ·dy`).
pub fn matmul_tn(a: DevView, b: DevView) -> Result<DevMat> {
    product(Operand::t(a), Operand::n(b))
}

/// `c += aᵀ·b`: accumulate a weight gradient in place.
pub fn add_matmul_tn(a: DevView, b: DevView, c: DevViewMut) -> Result<()> {
    gemm_op(1.0, Operand::t(a), Operand::n(b), 1.0, c)
}

/// `c[..a.rows] += a·bᵀ`.
pub fn add_matmul_nt_rows(a: DevView, b: DevView, c: DevViewMut) -> Result<()> {
    let rows = a.rows();
    gemm_op(1.0, Operand::n(a), Operand::t(b), 1.0, c.row_range(0..rows))
}

/// `op(a)·op(b)` into a new matrix.
fn product(a: Operand, b: Operand) -> Result<DevMat> {
    let (m, n) = (a.dim().0, b.dim().1);
    let mut c = DevMat::uninit(a.view.device(), m, n)?;
    gemm_op(1.0, a, b, 0.0, c.view_mut())?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::gpu::{DevPtr, Device};

    /// The translation itself, checked against a column-major reference SGEMM on host memory
    /// (pointers are host addresses here): every transpose combination and rectangular shape.
    #[test]
    fn row_major_products_map_to_column_major_sgemm() {
        fn reference(g: &Sgemm) {
            // SAFETY: the test's pointers are live host vectors of the sizes the call implies.
            unsafe {
                let at = |p: DevPtr, ld: usize, i: usize, j: usize| -> f32 {
                    *(p as *const f32).add(i + j * ld)
                };
                for i in 0..g.m {
                    for j in 0..g.n {
                        let mut s = 0f32;
                        for p in 0..g.k {
                            let x = if g.trans_a {
                                at(g.a, g.lda, p, i)
                            } else {
                                at(g.a, g.lda, i, p)
                            };
                            let y = if g.trans_b {
                                at(g.b, g.ldb, j, p)
                            } else {
                                at(g.b, g.ldb, p, j)
                            };
                            s += x * y;
                        }
                        let c = (g.c as *mut f32).add(i + j * g.ldc);
                        *c = g.alpha * s + g.beta * *c;
                    }
                }
            }
        }
        let device = Device::new(std::sync::Arc::new(
            crate::backend::cuda::ops::testing::HostGpu,
        ));
        let (m, k, n) = (5usize, 3usize, 4usize);
        let val = |r: usize, c: usize, s: usize| ((r * 7 + c * 3 + s) % 11) as f32 - 5.0;
        for ta in [false, true] {
            for tb in [false, true] {
                let (ar, ac) = if ta { (k, m) } else { (m, k) };
                let (br, bc) = if tb { (n, k) } else { (k, n) };
                let a: Vec<f32> = (0..ar * ac).map(|i| val(i / ac, i % ac, 1)).collect();
                let b: Vec<f32> = (0..br * bc).map(|i| val(i / bc, i % bc, 2)).collect();
                let da = DevMat::upload(&device, ar, ac, &a).unwrap();
                let db = DevMat::upload(&device, br, bc, &b).unwrap();
                let mut dc = DevMat::upload(&device, m, n, &vec![1.0; m * n]).unwrap();
                let (oa, ob) = (
                    Operand {
                        view: da.view(),
                        transposed: ta,
                    },
                    Operand {
                        view: db.view(),
                        transposed: tb,
                    },
                );
                let g = sgemm_of(2.0, oa, ob, 0.5, &dc.view_mut());
                reference(&g);
                let got = dc.download().unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0f32;
                        for p in 0..k {
                            let x = if ta { a[p * ac + i] } else { a[i * ac + p] };
                            let y = if tb { b[j * bc + p] } else { b[p * bc + j] };
                            s += x * y;
                        }
                        let expect = 2.0 * s + 0.5;
                        assert_eq!(got[i * n + j], expect, "ta {ta} tb {tb} at ({i}, {j})");
                    }
                }
            }
        }
    }
}
