//! Matrix products with one very thin side, as a GCN / SAGE layer with few input or output
//! columns makes them (`h·W` to 2 classes, `dy·Wᵀ` from 2 classes, weight gradients
//! `xᵀ·dy` to 2 output columns). The packed kernel of [`super::sgemm`] computes 12 × 32
//! tiles and packs its operands, which on these shapes mostly multiplies padding and copies
//! memory; these loops stream the long operand once instead.
//!
//! * **row dots** (`n ≤ 4` output columns, long rows): each output element is a dot product
//!   of a row of `a` with a column of `b`, in 16 fixed lanes added in a fixed order;
//! * **row combinations** (`k ≤ 4` inner steps): each output row is `Σ_p a[i,p]·b[p,:]`;
//! * **row reduction** (`aᵀ·b` with a small output and a long reduction, a weight gradient):
//!   partial products over fixed blocks of rows, added in block order.
//!
//! Every path splits work by shape only and fixes each element's summation order, so results
//! do not depend on the number of threads.

use ndarray::parallel::prelude::*;
use ndarray::{ArrayView2, ArrayViewMut2, Axis};
use rayon::slice::ParallelSlice;

use super::gather::axpy;
use super::simd::simd_kernel;

/// Row dots: at most this many output columns.
const DOT_COLS: usize = 4;
/// Row dots: at least this many inner steps (shorter rows suit the packed kernel).
const DOT_MIN_INNER: usize = 32;
/// Row combinations: at most this many inner steps (beyond, each output row is loaded and
/// stored once per step, and the packed kernel, which keeps its tile in registers, wins).
const COMBINE_INNER: usize = 4;
/// Row reduction: at most this many output elements, and a side of at most `REDUCE_SIDE`
/// (the same register argument).
const REDUCE_OUT: usize = 8192;
const REDUCE_SIDE: usize = 4;
/// Row reduction: rows per partial product (a constant, so partials do not depend on threads).
const REDUCE_BLOCK: usize = 512;
/// Fewest output rows (row dots, combinations) or reduction rows for these paths to pay off.
const MIN_ROWS: usize = 1024;

/// The thin-shape loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Dots,
    Combinations,
    Reduction,
}

/// Which loop takes `a·b` (into a standard-layout output), if one applies.
fn path(a: &ArrayView2<f32>, b: &ArrayView2<f32>) -> Option<Path> {
    let ((m, k), n) = (a.dim(), b.ncols());
    if m * n * k == 0 {
        return None;
    }
    let a_rows = a.strides()[1] == 1 || k == 1;
    if n <= DOT_COLS && k >= DOT_MIN_INNER && m >= MIN_ROWS && a_rows {
        return Some(Path::Dots);
    }
    if k <= COMBINE_INNER && m >= MIN_ROWS && n >= 16 {
        return Some(Path::Combinations);
    }
    let x_rows = a.t().is_standard_layout();
    let y_rows = b.is_standard_layout();
    if x_rows && y_rows && k >= 2 * REDUCE_BLOCK && m * n <= REDUCE_OUT && m.min(n) <= REDUCE_SIDE {
        return Some(Path::Reduction);
    }
    None
}

/// True when [`try_gemm`] takes `a·b` (into a standard-layout output).
pub(crate) fn handles(a: &ArrayView2<f32>, b: &ArrayView2<f32>) -> bool {
    path(a, b).is_some()
}

/// `c = alpha·a·b + beta·c` by one of the thin-shape loops, when one applies (returns false
/// otherwise and leaves `c` untouched). `beta == 0` never reads `c`.
pub(crate) fn try_gemm(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) -> bool {
    if !c.is_standard_layout() {
        return false;
    }
    match path(a, b) {
        Some(Path::Dots) => row_dots(alpha, a, b, beta, c),
        Some(Path::Combinations) => row_combinations(alpha, a, b, beta, c),
        Some(Path::Reduction) => row_reduction(alpha, &a.t(), b, beta, c),
        None => return false,
    }
    true
}

/// `Σ x[p]·y[p]` in 16 lanes (lane `p % 16`), the lanes then added in order.
#[inline(always)]
fn dot16(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (xc, yc) = (x.chunks_exact(16), y.chunks_exact(16));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (xs, ys) in xc.zip(yc) {
        for l in 0..16 {
            acc[l] += xs[l] * ys[l];
        }
    }
    for (l, (&xv, &yv)) in xr.iter().zip(yr).enumerate() {
        acc[l] += xv * yv;
    }
    acc.iter().fold(0.0, |s, &v| s + v)
}

/// `alpha·v + beta·old`, never reading `old` when `beta == 0`.
#[inline(always)]
fn blend(alpha: f32, v: f32, beta: f32, old: &mut f32) {
    *old = if beta == 0.0 {
        alpha * v
    } else {
        alpha * v + beta * *old
    };
}

simd_kernel! {
    /// One output row of the row dots: `c[j] = alpha·⟨a, bt[j]⟩ + beta·c[j]`.
    fn dot_row(a: &[f32], bt: &[f32], alpha: f32, beta: f32, c: &mut [f32]) {
        let k = a.len();
        for (j, cj) in c.iter_mut().enumerate() {
            blend(alpha, dot16(a, &bt[j * k..(j + 1) * k]), beta, cj);
        }
    }
}

fn row_dots(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let (k, n) = b.dim();
    // `b`'s columns as contiguous rows (n·k floats, small).
    let bt: Vec<f32> = b.t().iter().copied().collect();
    c.axis_iter_mut(Axis(0))
        .into_par_iter()
        .zip(a.axis_iter(Axis(0)).into_par_iter())
        .with_min_len(super::rows_per_task(n * k))
        .for_each(|(mut c_row, a_row)| {
            let a_row = a_row.to_slice().expect("unit column stride");
            dot_row(
                a_row,
                &bt,
                alpha,
                beta,
                c_row.as_slice_mut().expect("standard"),
            )
        });
}

simd_kernel! {
    /// One output row of the row combinations: `c = alpha·Σ_p a[p]·b[p] + beta·c`.
    fn combine_row(a: &[f32], b: &[f32], alpha: f32, beta: f32, c: &mut [f32]) {
        let n = c.len();
        if beta == 0.0 {
            c.fill(0.0);
        } else {
            c.iter_mut().for_each(|v| *v *= beta);
        }
        for (p, &ap) in a.iter().enumerate() {
            axpy(alpha * ap, &b[p * n..(p + 1) * n], c);
        }
    }
}

fn row_combinations(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let (k, n) = b.dim();
    let b = super::standard(b.view());
    let bs = b.as_slice().expect("standard layout");
    c.axis_iter_mut(Axis(0))
        .into_par_iter()
        .zip(a.axis_iter(Axis(0)).into_par_iter())
        .with_min_len(super::rows_per_task(n * k))
        .for_each(|(mut c_row, a_row)| {
            let mut av = [0f32; COMBINE_INNER];
            for (dst, &v) in av.iter_mut().zip(a_row.iter()) {
                *dst = v;
            }
            combine_row(
                &av[..k],
                bs,
                alpha,
                beta,
                c_row.as_slice_mut().expect("standard"),
            )
        });
}

simd_kernel! {
    /// The partial `xᵀ·y` of one block of rows (`x` rows of `m`, `y` rows of `n` floats),
    /// accumulated along the longer output side: `out` is `m × n` when `n ≥ m`, else `n × m`.
    fn reduce_block(x: &[f32], m: usize, y: &[f32], n: usize, out: &mut [f32]) {
        for (xr, yr) in x.chunks_exact(m).zip(y.chunks_exact(n)) {
            if n >= m {
                for (p, &xp) in xr.iter().enumerate() {
                    axpy(xp, yr, &mut out[p * n..(p + 1) * n]);
                }
            } else {
                for (j, &yj) in yr.iter().enumerate() {
                    axpy(yj, xr, &mut out[j * m..(j + 1) * m]);
                }
            }
        }
    }
}

fn row_reduction(
    alpha: f32,
    x: &ArrayView2<f32>,
    y: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let (m, n) = (x.ncols(), y.ncols());
    let xs = x.as_slice().expect("standard layout");
    let ys = y.as_slice().expect("standard layout");
    let partials: Vec<Vec<f32>> = xs
        .par_chunks(REDUCE_BLOCK * m)
        .zip(ys.par_chunks(REDUCE_BLOCK * n))
        .map(|(xb, yb)| {
            let mut out = vec![0f32; m * n];
            reduce_block(xb, m, yb, n, &mut out);
            out
        })
        .collect();
    let mut sum = vec![0f32; m * n];
    for p in &partials {
        sum.iter_mut().zip(p).for_each(|(s, &v)| *s += v);
    }
    let cs = c.as_slice_mut().expect("standard layout");
    for i in 0..m {
        for j in 0..n {
            let v = if n >= m {
                sum[i * n + j]
            } else {
                sum[j * m + i]
            };
            blend(alpha, v, beta, &mut cs[i * n + j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    use crate::backend::cpu::pseudo_matrix as pseudo;

    fn reference(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f64> {
        let a = a.mapv(f64::from);
        let b = b.mapv(f64::from);
        a.dot(&b)
    }

    fn close(c: &Array2<f32>, r: &Array2<f64>) {
        let err = c
            .iter()
            .zip(r)
            .map(|(&x, &y)| (x as f64 - y).abs())
            .fold(0.0, f64::max);
        let scale = r.iter().fold(1.0f64, |m, &v| m.max(v.abs()));
        assert!(
            err < 1e-5 * scale,
            "max error {err} (largest value {scale})"
        );
    }

    /// Each path applies to its shape, matches a float64 product, honours alpha and beta,
    /// and gives the same bits on 1 and 3 threads.
    #[test]
    fn thin_products_are_right_and_thread_independent() {
        let h = pseudo(3000, 256, 2);
        let w2 = pseudo(256, 2, 3);
        let d2 = pseudo(3000, 2, 4);
        let cases: Vec<(ArrayView2<f32>, ArrayView2<f32>)> = vec![
            (h.view(), w2.view()), // row dots
            (d2.view(), w2.t()),   // row combinations, transposed b
            (h.t(), d2.view()),    // row reduction, n < m
            (d2.t(), h.view()),    // row reduction, n ≥ m
        ];
        for (a, b) in cases {
            let r = reference(a, b);
            let run = |threads: usize, beta: f32| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut c = Array2::<f32>::from_elem(r.dim(), 1.0);
                assert!(pool.install(|| try_gemm(2.0, &a, &b, beta, &mut c.view_mut())));
                c
            };
            let c = run(1, 0.0);
            close(&c, &(&r * 2.0));
            assert_eq!(c, run(3, 0.0));
            close(&run(2, 0.5), &(&r * 2.0 + 0.5));
        }
        // A square product is left to the packed kernel.
        let mut c = Array2::<f32>::zeros((256, 256));
        assert!(!try_gemm(1.0, &h.t(), &h.view(), 0.0, &mut c.view_mut()));
    }
}
