//! Sparse rows (CSR) for input features that are mostly zeros, and the products a first
//! layer needs with them.
//!
//! Bag-of-words features are typical: Facebook's 4,714 binary columns have about 13 non-zeros
//! per row (0.3 %). As a dense matrix every mini-batch gathers, masks and multiplies 4,714
//! floats per row; as CSR only the non-zeros, which makes the first layer's projection
//! `X·W` about 300 times cheaper.
//!
//! Every kernel is deterministic and independent of the thread count: rows are split into
//! chunks of a fixed size, and [`add_spmm_tn`] sums each output row over the non-zeros of one
//! column in increasing row order, however its rows are shared among the threads.

use std::ops::Range;

use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use super::gather::axpy;
use super::simd::simd_kernel;

/// Rows per parallel task when building or transforming a CSR matrix.
const CHUNK_ROWS: usize = 1024;

/// A row-major sparse matrix: the non-zeros of row `i` are at columns
/// `indices[indptr[i]..indptr[i + 1]]` (increasing) with values `values[same range]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CsrMatrix {
    pub ncols: usize,
    pub indptr: Vec<usize>,
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

impl CsrMatrix {
    /// Number of rows.
    pub fn nrows(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// The number of stored entries of row `i`.
    #[inline]
    pub fn row_len(&self, i: usize) -> usize {
        self.indptr[i + 1] - self.indptr[i]
    }

    /// The stored entries of row `i`: (columns, values).
    #[inline]
    pub fn row(&self, i: usize) -> (&[u32], &[f32]) {
        let r = self.indptr[i]..self.indptr[i + 1];
        (&self.indices[r.clone()], &self.values[r])
    }

    /// The non-zeros of `x` (exact zeros are dropped; NaN and infinities are kept).
    ///
    /// # Panics
    /// If `x` has more than `u32::MAX` columns.
    pub fn from_dense(x: ArrayView2<f32>) -> CsrMatrix {
        assert!(x.ncols() <= u32::MAX as usize, "too many columns for CSR");
        let x = super::standard(x);
        let cols = x.ncols();
        let rows = x.nrows();
        let mut indptr = Vec::with_capacity(rows + 1);
        indptr.push(0);
        if cols == 0 {
            indptr.resize(rows + 1, 0);
            return CsrMatrix {
                ncols: 0,
                indptr,
                ..Default::default()
            };
        }
        let xs = x.as_slice().expect("standard layout");
        // Each chunk of rows collects its own entries; chunks are joined in row order.
        let chunks: Vec<(Vec<usize>, Vec<u32>, Vec<f32>)> = xs
            .par_chunks(CHUNK_ROWS * cols)
            .map(|blk| {
                let mut counts = Vec::with_capacity(blk.len() / cols);
                let (mut idx, mut val) = (Vec::new(), Vec::new());
                for row in blk.chunks_exact(cols) {
                    let before = idx.len();
                    push_nonzeros(row, &mut idx, &mut val);
                    counts.push(idx.len() - before);
                }
                (counts, idx, val)
            })
            .collect();
        let nnz = chunks.iter().map(|c| c.1.len()).sum();
        let (mut indices, mut values) = (Vec::with_capacity(nnz), Vec::with_capacity(nnz));
        for (counts, idx, val) in chunks {
            for c in counts {
                indptr.push(indptr.last().expect("starts with 0") + c);
            }
            indices.extend_from_slice(&idx);
            values.extend_from_slice(&val);
        }
        CsrMatrix {
            ncols: cols,
            indptr,
            indices,
            values,
        }
    }

    /// The dense matrix.
    pub fn to_dense(&self) -> Array2<f32> {
        let mut out = Array2::zeros((self.nrows(), self.ncols));
        for (i, mut row) in out.rows_mut().into_iter().enumerate() {
            let (idx, val) = self.row(i);
            for (&j, &v) in idx.iter().zip(val) {
                row[j as usize] = v;
            }
        }
        out
    }

    /// Rows `ids` of this matrix, in that order (a mini-batch's input rows).
    ///
    /// # Panics
    /// If an id is out of range.
    pub fn gather_rows(&self, ids: &[u32]) -> CsrMatrix {
        let mut indptr = Vec::with_capacity(ids.len() + 1);
        indptr.push(0);
        for &v in ids {
            let v = v as usize;
            indptr
                .push(indptr.last().expect("starts with 0") + self.indptr[v + 1] - self.indptr[v]);
        }
        let nnz = *indptr.last().expect("starts with 0");
        let mut indices = vec![0u32; nnz];
        let mut values = vec![0f32; nnz];
        let parts = split_by_rows(&indptr, &mut indices, &mut values, ids.len());
        parts.into_par_iter().for_each(|(rows, idx, val)| {
            let mut at = 0;
            for &v in &ids[rows] {
                let (si, sv) = self.row(v as usize);
                idx[at..at + si.len()].copy_from_slice(si);
                val[at..at + sv.len()].copy_from_slice(sv);
                at += si.len();
            }
        });
        CsrMatrix {
            ncols: self.ncols,
            indptr,
            indices,
            values,
        }
    }

    /// A `counts.len() × ncols` matrix whose row `i` holds `counts[i]` entries, written by
    /// `fill(i, columns, values)` into slices exactly that long (increasing columns), rows in
    /// parallel: rows assembled from several sources (own, cached, fetched) without a dense
    /// form.
    pub fn from_row_fill(
        ncols: usize,
        counts: &[usize],
        fill: impl Fn(usize, &mut [u32], &mut [f32]) + Sync,
    ) -> CsrMatrix {
        let rows = counts.len();
        let mut indptr = Vec::with_capacity(rows + 1);
        indptr.push(0);
        for &c in counts {
            indptr.push(indptr.last().expect("starts with 0") + c);
        }
        let nnz = indptr[rows];
        let mut indices = vec![0u32; nnz];
        let mut values = vec![0f32; nnz];
        let parts = split_by_rows(&indptr, &mut indices, &mut values, rows);
        parts.into_par_iter().for_each(|(range, idx, val)| {
            let mut at = 0;
            for i in range {
                let n = counts[i];
                fill(i, &mut idx[at..at + n], &mut val[at..at + n]);
                at += n;
            }
        });
        CsrMatrix {
            ncols,
            indptr,
            indices,
            values,
        }
    }

    /// The first `rows` rows (a copy).
    pub fn first_rows(&self, rows: usize) -> CsrMatrix {
        let end = self.indptr[rows];
        CsrMatrix {
            ncols: self.ncols,
            indptr: self.indptr[..=rows].to_vec(),
            indices: self.indices[..end].to_vec(),
            values: self.values[..end].to_vec(),
        }
    }

    /// `f(first_row, columns, values)` on fixed chunks of rows in parallel, with the chunk's
    /// values mutable (used by dropout).
    pub fn par_for_each_row_chunk_mut(
        &mut self,
        f: impl Fn(usize, &[usize], &[u32], &mut [f32]) + Sync,
    ) {
        let rows = self.nrows();
        let indptr = &self.indptr;
        let indices = &self.indices;
        let mut parts = Vec::with_capacity(rows.div_ceil(CHUNK_ROWS));
        let mut rest: &mut [f32] = &mut self.values;
        for r0 in (0..rows).step_by(CHUNK_ROWS) {
            let r1 = (r0 + CHUNK_ROWS).min(rows);
            let (head, tail) = rest.split_at_mut(indptr[r1] - indptr[r0]);
            parts.push((r0, r1, head));
            rest = tail;
        }
        parts.into_par_iter().for_each(|(r0, r1, vals)| {
            let base = indptr[r0];
            f(r0, &indptr[r0..=r1], &indices[base..indptr[r1]], vals)
        });
    }
}

/// Split the entry buffers of a CSR with offsets `indptr` into fixed chunks of rows.
type RowPart<'a> = (Range<usize>, &'a mut [u32], &'a mut [f32]);

fn split_by_rows<'a>(
    indptr: &[usize],
    mut idx: &'a mut [u32],
    mut val: &'a mut [f32],
    rows: usize,
) -> Vec<RowPart<'a>> {
    let mut parts = Vec::with_capacity(rows.div_ceil(CHUNK_ROWS));
    for r0 in (0..rows).step_by(CHUNK_ROWS) {
        let r1 = (r0 + CHUNK_ROWS).min(rows);
        let len = indptr[r1] - indptr[r0];
        let (ih, it) = idx.split_at_mut(len);
        let (vh, vt) = val.split_at_mut(len);
        parts.push((r0..r1, ih, vh));
        idx = it;
        val = vt;
    }
    parts
}

simd_kernel! {
    /// Append the non-zeros of `row` (column, value) to `idx` and `val`. Tests 16 columns at
    /// a time (one vector compare) and looks inside only the rare groups with a non-zero.
    fn push_nonzeros(row: &[f32], idx: &mut Vec<u32>, val: &mut Vec<f32>) {
        for (g, group) in row.chunks(16).enumerate() {
            if group.iter().fold(false, |any, &v| any | (v != 0.0)) {
                for (j, &v) in group.iter().enumerate() {
                    if v != 0.0 {
                        idx.push((g * 16 + j) as u32);
                        val.push(v);
                    }
                }
            }
        }
    }
}

simd_kernel! {
    /// `out += Σ_k coef[k] · s[rows[k]]` over rows of `out.len()` floats of `s`, in order.
    fn add_scaled_rows(s: &[f32], rows: &[u32], coef: &[f32], out: &mut [f32]) {
        let n = out.len();
        for (&r, &c) in rows.iter().zip(coef) {
            let r = r as usize;
            axpy(c, &s[r * n..(r + 1) * n], out);
        }
    }
}

/// How many values of `row` a CSR stores: those `!= 0.0` (`-0.0` is a zero, NaN is not).
pub fn row_nonzeros(row: &[f32]) -> usize {
    row.iter().filter(|&&v| v != 0.0).count()
}

/// The stored entries of dense `row` ([`row_nonzeros`] of them) into `idx` and `val`, which are
/// exactly that long, in column order.
pub fn write_row_nonzeros(row: &[f32], idx: &mut [u32], val: &mut [f32]) {
    let mut k = 0;
    for (j, &v) in row.iter().enumerate() {
        if v != 0.0 {
            idx[k] = j as u32;
            val[k] = v;
            k += 1;
        }
    }
    assert_eq!(k, idx.len(), "a row's entries and its count agree");
}

/// Fewest columns for which sparse rows are worth it.
pub const MIN_SPARSE_COLS: usize = 64;
/// Most non-zeros (a fraction) for which sparse rows are worth it.
pub const MAX_SPARSE_DENSITY: f64 = 0.1;
/// Rows sampled by the density estimate.
const DENSITY_SAMPLES: usize = 64;

/// Up to `samples` evenly spaced rows of `rows`.
fn sampled_rows(rows: usize, samples: usize) -> impl Iterator<Item = usize> {
    let picks = rows.min(samples);
    (0..picks).map(move |t| t * rows / picks)
}

/// Fraction of non-zeros in up to 64 evenly spaced rows of `x`: a cheap test of whether
/// [`CsrMatrix::from_dense`] is worth it.
pub fn sampled_density(x: ArrayView2<f32>) -> f64 {
    density_of_rows(x, DENSITY_SAMPLES)
}

/// Fraction of non-zeros in up to `samples` evenly spaced rows of `x` (1 when `x` is empty).
pub fn density_of_rows(x: ArrayView2<f32>, samples: usize) -> f64 {
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return 1.0;
    }
    let nz: usize = sampled_rows(rows, samples)
        .map(|r| x.row(r).iter().filter(|&&v| v != 0.0).count())
        .sum();
    nz as f64 / (rows.min(samples) * cols) as f64
}

/// Whether a first layer should take `x` as sparse rows: wide enough that the dense product
/// matters, and at most 10 % non-zeros (estimated on a sample of rows). A function of the
/// data only, so every run on the same data takes the same path.
pub fn prefers_sparse(x: ArrayView2<f32>) -> bool {
    x.ncols() >= MIN_SPARSE_COLS && sampled_density(x) <= MAX_SPARSE_DENSITY
}

/// [`prefers_sparse`] from each row's non-zero count (`counts`, one per row, of `cols`
/// columns): the same rows sampled, the same answer (a device counts, the host decides).
pub fn prefers_sparse_counts(counts: &[u32], cols: usize) -> bool {
    prefers_sparse_by(counts.len(), cols, |r| counts[r] as usize)
}

/// [`prefers_sparse`] of `rows × cols` rows whose row `r` has `nonzeros(r)` non-zeros: asks
/// only for the rows the test samples (a host that knows every row's count decides for rows
/// it never gathers densely).
pub fn prefers_sparse_by(rows: usize, cols: usize, nonzeros: impl FnMut(usize) -> usize) -> bool {
    if rows == 0 || cols < MIN_SPARSE_COLS {
        return false;
    }
    let nz: usize = sampled_rows(rows, DENSITY_SAMPLES).map(nonzeros).sum();
    nz as f64 / (rows.min(DENSITY_SAMPLES) * cols) as f64 <= MAX_SPARSE_DENSITY
}

/// `out[i] (+)= Σ_j x[i, j]·w[j]` for the first `rows` rows of `x` (`out` has `rows` rows);
/// `accumulate` adds to `out` instead of overwriting it.
///
/// # Panics
/// If the shapes disagree.
pub fn spmm_into(
    x: &CsrMatrix,
    rows: usize,
    w: ArrayView2<f32>,
    mut out: ArrayViewMut2<f32>,
    accumulate: bool,
) {
    check_spmm(x, rows, w);
    assert_eq!(out.dim(), (rows, w.ncols()), "spmm: output shape");
    let w = super::standard(w);
    let n = w.ncols();
    if n == 0 || rows == 0 {
        return;
    }
    let ws = w.as_slice().expect("standard layout");
    let avg = x.indptr[rows] / rows + 1;
    out.as_slice_mut()
        .expect("spmm: output must be in standard layout")
        .par_chunks_mut(n)
        .enumerate()
        .with_min_len(super::rows_per_task(n * avg))
        .for_each(|(i, o)| {
            if !accumulate {
                o.fill(0.0);
            }
            let (idx, val) = x.row(i);
            add_scaled_rows(ws, idx, val, o)
        });
}

/// The shapes `x[..rows] · w` needs (caller bugs otherwise).
fn check_spmm(x: &CsrMatrix, rows: usize, w: ArrayView2<f32>) {
    assert_eq!(
        x.ncols,
        w.nrows(),
        "spmm: x has {} columns, w {} rows",
        x.ncols,
        w.nrows()
    );
    assert!(rows <= x.nrows(), "spmm: {rows} rows of {}", x.nrows());
}

/// `x[..rows] · w` as a new matrix.
pub fn spmm(x: &CsrMatrix, rows: usize, w: ArrayView2<f32>) -> Array2<f32> {
    check_spmm(x, rows, w);
    let w = super::standard(w);
    let n = w.ncols();
    let ws = w.as_slice().expect("standard layout");
    let avg = x.indptr[rows] / rows.max(1) + 1;
    super::par_rows_from_zero(rows, n, super::rows_per_task(n * avg), |i, o| {
        let (idx, val) = x.row(i);
        add_scaled_rows(ws, idx, val, o)
    })
}

/// `c += x[..rows]ᵀ · d`, where `d` has `rows` rows and `c` is `x.ncols × d.ncols`: row `i` of
/// `d`, scaled, is added to the rows of `c` its entries name, every row of `c` adding its
/// terms in increasing `i`.
///
/// `c`'s rows are cut into one range per thread holding about as many entries each (columns
/// are far from equally common); a task reads all of `x`'s entries in order, skips those
/// outside its range, and adds whole rows of `d` into its own rows of `c`, which stay in its
/// core's cache (Facebook at 256 columns: 4.8 MB of `c` in all). No transpose is built, and
/// `d` is read in order. Where the cuts fall changes no bit of `c`, so the result does not
/// depend on the thread count. Against the transpose this replaced (a serial counting sort of
/// the entries by column, then each row of `c` gathering its rows of `d` at random), on
/// Facebook-shaped batches (18k rows, 230k entries) on the 2-core EPYC VM: 5.1 against 8.2 ms
/// at 256 columns on one thread, 3.0-3.4 against 5.3 on two; 1.5 against 3.6 and 1.2-1.4
/// against 3.0 at 64 columns.
///
/// # Panics
/// If the shapes disagree or `c` is not in standard layout.
pub fn add_spmm_tn(x: &CsrMatrix, rows: usize, d: ArrayView2<f32>, mut c: ArrayViewMut2<f32>) {
    assert_eq!(c.nrows(), x.ncols, "spmm_tn: output rows");
    assert_eq!(c.ncols(), d.ncols(), "spmm_tn: output columns");
    assert_eq!(d.nrows(), rows, "spmm_tn: d must have `rows` rows");
    assert!(rows <= x.nrows(), "spmm_tn: {rows} rows of {}", x.nrows());
    let d = super::standard(d);
    let n = d.ncols();
    if n == 0 || rows == 0 {
        return;
    }
    let ds = d.as_slice().expect("standard layout");
    let mut rest = c
        .as_slice_mut()
        .expect("spmm_tn: output must be in standard layout");
    let cuts = balanced_cuts(
        &x.indices[..x.indptr[rows]],
        x.ncols,
        rayon::current_num_threads(),
    );
    let mut ranges = Vec::with_capacity(cuts.len());
    for w in cuts.windows(2) {
        let (head, tail) = rest.split_at_mut((w[1] - w[0]) * n);
        ranges.push((w[0], head));
        rest = tail;
    }
    ranges
        .into_par_iter()
        .for_each(|(first, out)| add_entries_in_range(x, rows, ds, first, out));
}

/// Cuts of `0..ncols` into at most `parts` ranges holding about equally many of `columns`
/// (the entries' columns): `0`, the inner cuts ascending, `ncols`. Where the cuts fall
/// changes no result, only the balance, so past `BALANCE_SAMPLE` entries they are counted
/// from an evenly strided sample (this runs serially, before the product's threads start).
fn balanced_cuts(columns: &[u32], ncols: usize, parts: usize) -> Vec<usize> {
    const BALANCE_SAMPLE: usize = 1 << 16;
    if parts <= 1 {
        return vec![0, ncols];
    }
    let stride = columns.len().div_ceil(BALANCE_SAMPLE).max(1);
    let mut upto = vec![0usize; ncols + 1];
    for &j in columns.iter().step_by(stride) {
        upto[j as usize + 1] += 1;
    }
    for j in 0..ncols {
        upto[j + 1] += upto[j];
    }
    let counted = upto[ncols];
    let mut cuts = vec![0];
    for k in 1..parts {
        let cut = upto.partition_point(|&u| u < counted * k / parts);
        if cut > *cuts.last().expect("starts with 0") && cut < ncols {
            cuts.push(cut);
        }
    }
    cuts.push(ncols);
    cuts
}

simd_kernel! {
    /// `out[j - first] += v · d[i]` for every entry `(j, v)` of rows `0..rows` of `x` with `j`
    /// among `out`'s rows (`first..`), in increasing `i`.
    fn add_entries_in_range(x: &CsrMatrix, rows: usize, ds: &[f32], first: usize, out: &mut [f32]) {
        let n = ds.len() / rows;
        let end = first + out.len() / n;
        for i in 0..rows {
            let (idx, val) = x.row(i);
            // Every entry is looked at (a dozen a row on bag-of-words): nothing here relies on
            // a row's columns being sorted.
            for (&j, &v) in idx.iter().zip(val) {
                let j = j as usize;
                if (first..end).contains(&j) {
                    let o = (j - first) * n;
                    axpy(v, &ds[i * n..(i + 1) * n], &mut out[o..o + n]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::gemm::matmul;

    fn sparse_dense(rows: usize, cols: usize, salt: u64) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |(i, j)| {
            let h = crate::backend::cpu::dropout::mix64(salt ^ ((i as u64) << 32) ^ j as u64);
            if h.is_multiple_of(10) {
                (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            } else {
                0.0
            }
        })
    }

    /// A device decides from per-row counts: the same answer as the host's test, either way.
    #[test]
    fn deciding_from_row_counts_agrees_with_the_rows() {
        let half = |mut x: Array2<f32>| {
            let half = x.ncols() / 2;
            x.slice_mut(ndarray::s![.., ..half]).fill(0.0);
            x
        };
        let mut dense_rows = half(sparse_dense(200, 100, 5));
        dense_rows.row_mut(0).fill(1.0);
        let cases = [
            half(sparse_dense(200, 100, 1)),   // 5 %: sparse
            half(sparse_dense(1000, 80, 2)),   // more rows than the sample
            sparse_dense(200, 100, 4),         // about 10 %: either side of the limit
            sparse_dense(30, 63, 3),           // too narrow
            Array2::from_elem((40, 100), 1.0), // dense
            Array2::zeros((0, 100)),           // empty
            dense_rows,                        // a sampled row is dense
        ];
        let mut seen = [false; 2];
        for x in &cases {
            let counts: Vec<u32> = x
                .rows()
                .into_iter()
                .map(|r| r.iter().filter(|&&v| v != 0.0).count() as u32)
                .collect();
            let host = prefers_sparse(x.view());
            assert_eq!(
                prefers_sparse_counts(&counts, x.ncols()),
                host,
                "{:?}",
                x.dim()
            );
            seen[host as usize] = true;
        }
        assert_eq!(seen, [true, true], "both answers covered");
    }

    fn close(a: &Array2<f32>, b: &Array2<f32>) {
        assert_eq!(a.dim(), b.dim());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    #[test]
    fn dense_round_trip_gather_and_first_rows() {
        let x = sparse_dense(2500, 37, 1);
        let s = CsrMatrix::from_dense(x.view());
        assert_eq!(s.nrows(), 2500);
        assert_eq!(s.nnz(), x.iter().filter(|&&v| v != 0.0).count());
        assert_eq!(s.to_dense(), x);
        let ids = [7u32, 2499, 7, 0, 1200];
        let g = s.gather_rows(&ids);
        for (k, &i) in ids.iter().enumerate() {
            assert_eq!(g.to_dense().row(k), x.row(i as usize));
        }
        assert_eq!(s.first_rows(3).to_dense(), x.slice(ndarray::s![..3, ..]));
        let d = sampled_density(x.view());
        assert!(d > 0.05 && d < 0.15, "density {d}");
    }

    #[test]
    fn products_match_dense_gemm() {
        let x = sparse_dense(3000, 300, 2);
        let w = sparse_dense(300, 40, 3).mapv(|v| v + 0.25);
        let s = CsrMatrix::from_dense(x.view());
        close(&spmm(&s, 3000, w.view()), &matmul(x.view(), w.view()));
        let head = x.slice(ndarray::s![..1000, ..]);
        close(&spmm(&s, 1000, w.view()), &matmul(head, w.view()));
        let d = sparse_dense(1000, 40, 4).mapv(|v| v - 0.1);
        let mut c = Array2::from_elem((300, 40), 1.0f32);
        add_spmm_tn(&s, 1000, d.view(), c.view_mut());
        close(&c, &(matmul(head.t(), d.view()) + 1.0));
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let x = sparse_dense(5000, 200, 5);
        let w = sparse_dense(200, 64, 6).mapv(|v| v + 0.5);
        let d = sparse_dense(5000, 64, 7).mapv(|v| v + 0.5);
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let s = CsrMatrix::from_dense(x.view());
                let mut c = Array2::zeros((200, 64));
                add_spmm_tn(&s, 5000, d.view(), c.view_mut());
                (spmm(&s, 5000, w.view()), c, s)
            })
        };
        assert_eq!(run(1), run(3));
    }

    /// `xᵀ·d` as the definition reads, in the order `add_spmm_tn` promises: each row of `c`
    /// adds its terms in increasing row of `x`.
    fn spmm_tn_by_definition(x: &CsrMatrix, rows: usize, d: &Array2<f32>, c: &mut Array2<f32>) {
        for i in 0..rows {
            let (idx, val) = x.row(i);
            for (&j, &v) in idx.iter().zip(val) {
                for k in 0..d.ncols() {
                    c[[j as usize, k]] += v * d[[i, k]];
                }
            }
        }
    }

    #[test]
    fn transposed_product_is_the_definition_bitwise_for_any_threads_and_skew() {
        // Columns far from equally common (most entries in the first few), a prefix of the
        // rows, columns no entry names, rows whose columns descend, and more threads than
        // columns: the ranges the threads take change, the bits must not.
        let (nrows, ncols, n) = (700, 37, 21);
        let mut indptr = vec![0];
        let (mut indices, mut values) = (vec![], vec![]);
        for i in 0..nrows {
            let mut cols: Vec<u32> = (0..1 + i % 5)
                .map(|k| (((i * 7 + k * 13) % 97) * ((i + k) % 11) / 30) as u32 % 30)
                .collect();
            cols.sort_unstable();
            cols.dedup();
            if i % 7 == 0 {
                // Nothing may rely on a row's columns being sorted.
                cols.reverse();
            }
            for &j in &cols {
                indices.push(j);
                values.push(((i + j as usize) % 9) as f32 * 0.37 - 1.1);
            }
            indptr.push(indices.len());
        }
        let x = CsrMatrix {
            ncols,
            indptr,
            indices,
            values,
        };
        let rows = 650;
        let d = sparse_dense(rows, n, 8).mapv(|v| v * 3.3 - 0.7);
        let start = Array2::from_shape_fn((ncols, n), |(j, k)| (j * n + k) as f32 * 0.01);
        let mut expected = start.clone();
        spmm_tn_by_definition(&x, rows, &d, &mut expected);
        for threads in [1, 2, 3, 5, 64] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut c = start.clone();
            pool.install(|| add_spmm_tn(&x, rows, d.view(), c.view_mut()));
            assert!(
                c.iter()
                    .zip(&expected)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{threads} threads"
            );
        }
    }

    #[test]
    fn cuts_share_entries_evenly_and_cover_every_column_once() {
        // 90 entries in column 0, one in each of 1..=10.
        let mut columns = vec![0u32; 90];
        columns.extend(1..=10);
        assert_eq!(balanced_cuts(&columns, 12, 1), vec![0, 12]);
        // Column 0 alone holds most: the cut falls just after it.
        assert_eq!(balanced_cuts(&columns, 12, 2), vec![0, 1, 12]);
        let even: Vec<u32> = (0..12).flat_map(|j| [j, j]).collect();
        assert_eq!(balanced_cuts(&even, 12, 3), vec![0, 4, 8, 12]);
        // More parts than columns: no empty range, the cuts still ascend.
        let cuts = balanced_cuts(&[0, 1, 2, 2, 1, 0], 3, 8);
        assert_eq!(cuts, vec![0, 1, 2, 3]);
        assert_eq!(balanced_cuts(&[], 5, 4), vec![0, 5]);
        // Past the sample's size the cuts come from a strided sample: 300k entries, half in
        // column 0 and the rest spread over 1..100, still cut right after column 0.
        let many: Vec<u32> = (0..300_000u32)
            .map(|e| if e % 2 == 0 { 0 } else { 1 + e % 99 })
            .collect();
        assert_eq!(balanced_cuts(&many, 100, 2), vec![0, 1, 100]);
    }
}
