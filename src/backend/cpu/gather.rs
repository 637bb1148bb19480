//! Row gathers, copies between chosen rows, scatter-adds and column sums.

use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use super::simd::simd_kernel;

/// `out[i] = src[idx[i]]`: the rows of `src` listed in `idx`, in that order.
///
/// Rows are copied straight into uninitialised memory, in parallel: no zero-filling pass
/// first (the serial `calloc` memset of a large gathered feature matrix costs as much as the
/// copy).
///
/// # Panics
/// If an index is out of range (indices come from validated blocks).
pub fn gather_rows(src: ArrayView2<f32>, idx: &[u32]) -> Array2<f32> {
    let src = super::standard(src);
    let cols = src.ncols();
    let s = src.as_slice().expect("standard layout");
    if cols == 0 || idx.is_empty() {
        return Array2::zeros((idx.len(), cols));
    }
    let mut out = Array2::<f32>::uninit((idx.len(), cols));
    out.as_slice_mut()
        .expect("fresh array")
        .par_chunks_mut(cols)
        .zip(idx.par_iter())
        .with_min_len(super::rows_per_task(cols))
        .for_each(|(row, &i)| {
            let i = i as usize;
            row.write_copy_of_slice(&s[i * cols..(i + 1) * cols]);
        });
    // SAFETY: every row was written above (one index per row).
    unsafe { out.assume_init() }
}

/// The source row of every row of a `dst_rows`-row destination under `dst[dst_idx[i]] =
/// src[src_idx[i]]` (`u32::MAX`: the row is left alone).
///
/// # Panics
/// If the lists differ in length, an index is out of range, or a destination row is named
/// twice (the copies would race: the lists come from exchange plans, where each row has one
/// source).
pub fn copy_sources(
    dst_rows: usize,
    dst_idx: &[u32],
    src_rows: usize,
    src_idx: &[u32],
) -> Vec<u32> {
    assert_eq!(
        dst_idx.len(),
        src_idx.len(),
        "copy_rows: one source row per destination row"
    );
    let mut from = vec![u32::MAX; dst_rows];
    for (&d, &s) in dst_idx.iter().zip(src_idx) {
        assert!(
            (s as usize) < src_rows,
            "copy_rows: source row {s} out of range 0..{src_rows}"
        );
        assert!(
            (d as usize) < dst_rows,
            "copy_rows: destination row {d} out of range 0..{dst_rows}"
        );
        assert!(
            from[d as usize] == u32::MAX,
            "copy_rows: destination row {d} named twice"
        );
        from[d as usize] = s;
    }
    from
}

/// `dst[dst_idx[i]] = src[src_idx[i]]` for every `i`; the other rows of `dst` keep their
/// values. Rows of one matrix into chosen rows of another in one pass, in parallel over the
/// destination rows: split's layer inputs did it as a gather into a fresh matrix and a serial
/// scatter of that into zeros.
///
/// # Panics
/// As [`copy_sources`], or if the column counts differ or `dst` is not in standard layout.
pub fn copy_rows(
    mut dst: ArrayViewMut2<f32>,
    dst_idx: &[u32],
    src: ArrayView2<f32>,
    src_idx: &[u32],
) {
    let cols = dst.ncols();
    assert_eq!(src.ncols(), cols, "copy_rows: column counts differ");
    let from = copy_sources(dst.nrows(), dst_idx, src.nrows(), src_idx);
    if cols == 0 || dst_idx.is_empty() {
        return;
    }
    let src = super::standard(src);
    let s = src.as_slice().expect("standard layout");
    dst.as_slice_mut()
        .expect("copy_rows: destination in standard layout")
        .par_chunks_mut(cols)
        .zip(from.par_iter())
        .with_min_len(super::rows_per_task(cols))
        .for_each(|(row, &f)| {
            if f != u32::MAX {
                let f = f as usize;
                row.copy_from_slice(&s[f * cols..(f + 1) * cols]);
            }
        });
}

/// `dst[idx[i]] += src[i]` for every row `i` of `src` (the transpose of [`gather_rows`]).
///
/// Repeated indices accumulate. Runs in parallel over destination rows without atomics: the
/// rows of `src` are first grouped by destination with a counting sort (stable, so each
/// destination sums its contributions in the order of `i`, whatever the thread count).
pub fn scatter_add_rows(dst: ArrayViewMut2<f32>, idx: &[u32], src: ArrayView2<f32>) {
    let num_dst = dst.nrows();
    assert_eq!(
        idx.len(),
        src.nrows(),
        "scatter_add_rows: one index per row"
    );
    let (start, order) = group_by_target(idx, num_dst);
    let src = super::standard(src);
    add_grouped_rows(dst, &start, &order, src.view());
}

/// Counting sort of `0..targets.len()` by `targets[i]`: returns `start` (`n + 1` offsets) and
/// `order` such that the items with target `t` are `order[start[t]..start[t + 1]]`, ascending.
pub fn group_by_target(targets: &[u32], n: usize) -> (Vec<usize>, Vec<u32>) {
    let mut start = vec![0usize; n + 1];
    for &t in targets {
        assert!((t as usize) < n, "target {t} out of range 0..{n}");
        start[t as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut order = vec![0u32; targets.len()];
    for (i, &t) in targets.iter().enumerate() {
        order[fill[t as usize]] = i as u32;
        fill[t as usize] += 1;
    }
    (start, order)
}

/// `dst[t] += Σ src[order[k]]` over `k ∈ start[t]..start[t+1]`, parallel over `t`.
fn add_grouped_rows(
    mut dst: ArrayViewMut2<f32>,
    start: &[usize],
    order: &[u32],
    src: ArrayView2<f32>,
) {
    let cols = dst.ncols();
    assert_eq!(src.ncols(), cols, "scatter_add_rows: column counts differ");
    if cols == 0 {
        return;
    }
    let s = src.as_slice().expect("standard layout");
    let d = dst
        .as_slice_mut()
        .expect("scatter_add_rows: destination must be in standard layout");
    d.par_chunks_mut(cols)
        .enumerate()
        .with_min_len(super::rows_per_task(cols * 2))
        .for_each(|(t, row)| add_rows(s, &order[start[t]..start[t + 1]], row));
}

simd_kernel! {
    /// `acc += Σ_k s[rows[k]]` over rows of `acc.len()` floats of `s`, in order.
    fn add_rows(s: &[f32], rows: &[u32], acc: &mut [f32]) {
        let cols = acc.len();
        for &i in rows {
            let i = i as usize;
            axpy(1.0, &s[i * cols..(i + 1) * cols], acc);
        }
    }
}

simd_kernel! {
    /// `y += x` (vectorised: [`axpy`] outside a kernel compiles for baseline x86-64).
    pub(crate) fn add_assign(x: &[f32], y: &mut [f32]) {
        axpy(1.0, x, y)
    }
}

/// `z[i, :] += b` for every row of a standard-layout matrix (a bias), in parallel over rows.
pub fn add_to_rows(mut z: ArrayViewMut2<f32>, b: &[f32]) {
    let cols = z.ncols();
    assert_eq!(b.len(), cols, "bias length");
    if cols == 0 {
        return;
    }
    z.as_slice_mut()
        .expect("standard layout")
        .par_chunks_mut(cols)
        .with_min_len(super::rows_per_task(cols))
        .for_each(|row| add_assign(b, row));
}

simd_kernel! {
    /// `acc += Σ` every row of `s` (rows of `acc.len()` floats), in order.
    fn add_all_rows(s: &[f32], acc: &mut [f32]) {
        for row in s.chunks_exact(acc.len()) {
            axpy(1.0, row, acc);
        }
    }
}

/// `y += a · x` on slices of equal length (the inner loop of every aggregation; vectorised by
/// the compiler).
#[inline(always)]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// Dot product of two slices of equal length.
#[inline]
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// Sum over rows: `out[j] = Σ_i a[i, j]` (a bias gradient). Partial sums over fixed row
/// chunks are combined in order, so the result does not depend on the thread count.
pub fn column_sums(a: ArrayView2<f32>) -> Array1<f32> {
    let a = super::standard(a);
    let cols = a.ncols();
    let mut out = Array1::zeros(cols);
    if cols == 0 || a.nrows() == 0 {
        return out;
    }
    let chunk_rows = super::rows_per_task(cols).max(64);
    let partials: Vec<Vec<f32>> = a
        .as_slice()
        .expect("standard layout")
        .par_chunks(chunk_rows * cols)
        .map(|blk| {
            let mut acc = vec![0f32; cols];
            add_all_rows(blk, &mut acc);
            acc
        })
        .collect();
    let o = out.as_slice_mut().expect("fresh array");
    for p in &partials {
        axpy(1.0, p, o);
    }
    out
}

/// `grad += Σ_rows dz`, `grad` a row (a bias gradient).
pub fn add_column_sums(mut grad: ArrayViewMut2<f32>, dz: ArrayView2<f32>) {
    let s = column_sums(dz);
    axpy(
        1.0,
        s.as_slice().expect("contiguous"),
        grad.as_slice_mut().expect("contiguous"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn gather_then_scatter_add_round_trips_with_duplicates() {
        let src = array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]];
        let idx = [2u32, 0, 2, 1];
        let g = gather_rows(src.view(), &idx);
        assert_eq!(g, array![[5.0, 6.0], [1.0, 2.0], [5.0, 6.0], [3.0, 4.0]]);
        let mut back = Array2::zeros((4, 2));
        scatter_add_rows(back.view_mut(), &idx, g.view());
        // Row 2 was gathered twice, row 3 never.
        assert_eq!(
            back,
            array![[1.0, 2.0], [3.0, 4.0], [10.0, 12.0], [0.0, 0.0]]
        );
    }

    #[test]
    fn column_sums_add_every_row() {
        let a = Array2::from_shape_fn((1000, 3), |(i, j)| (i % 7) as f32 + j as f32);
        let s = column_sums(a.view());
        for j in 0..3 {
            let expect: f32 = (0..1000).map(|i| (i % 7) as f32 + j as f32).sum();
            assert_eq!(s[j], expect);
        }
    }
}
