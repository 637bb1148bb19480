//! Feature rows on the wire without their zeros.
//!
//! Facebook's 4,714 input columns hold about 13 non-zeros a row: a dense row is 18.9 KB, the
//! same row as (column, value) pairs about 110 bytes. Measured on the 16-core GPU host, GDP on
//! 16 ranks moved 826 MB of dense rows per step and its gather was the largest phase.
//!
//! Each row is a run of `u32` words, chosen per row by whoever sends it:
//! - `DENSE`, then `dim` values (their `f32` bits): a row with many non-zeros;
//! - `n < DENSE`, then `n` column indices, then the `n` non-zero values: a row with fewer than
//!   half its columns set.
//!
//! A receiver needs no setting to read either, so ranks decide alone whether to look for zeros
//! at all (a store of dense rows never does, and pays one header word a row). Decoding writes
//! the exact values back (the zeros are `+0.0`; a `-0.0` is kept as a non-zero): the rows
//! received are bitwise the rows sent.

use std::mem::MaybeUninit;

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use crate::backend::cpu::simd::simd_kernel;
use crate::backend::cpu::sparse::CsrMatrix;

/// Header of a row sent with all its values.
const DENSE: u32 = u32::MAX;

/// Rows per rayon task when encoding and decoding.
const ROWS_PER_TASK: usize = 256;

/// Words of `row` on the wire: the smaller of its sparse and dense forms.
fn packed_len(row: &[f32], look_for_zeros: bool) -> usize {
    match sparse_count(row, look_for_zeros) {
        Some(n) => 1 + 2 * n,
        None => 1 + row.len(),
    }
}

/// The number of non-zeros of `row` when it travels sparse (fewer than half its columns set),
/// else `None`.
fn sparse_count(row: &[f32], look_for_zeros: bool) -> Option<usize> {
    if !look_for_zeros {
        return None;
    }
    let mut n = 0;
    count_nonzeros(row, &mut n);
    (2 * n < row.len()).then_some(n)
}

/// Values a scan tests at once (one 512-bit compare).
const SCAN: usize = 16;

simd_kernel! {
    /// `n` ← how many values of `row` are not `+0.0` (bitwise), counted in vector registers.
    fn count_nonzeros(row: &[f32], n: &mut usize) {
        *n = row.iter().filter(|v| v.to_bits() != 0).count();
    }
}

simd_kernel! {
    /// The columns and bits of `row`'s non-zero values, in order, into `cols` and `vals`
    /// (exactly as long as there are non-zeros). Groups of 16 values are tested at once and
    /// only the rare group holding a non-zero is looked into (a Facebook row is 14 non-zeros
    /// in 4,714 columns). Encoding 10,000 such rows on one thread of the 2-core VM took
    /// 53–74 ms testing one value at a time and 44–58 ms this way; reading the rows is most
    /// of what is left.
    fn write_nonzeros(row: &[f32], cols: &mut [u32], vals: &mut [u32]) {
        let mut k = 0;
        for (g, group) in row.chunks(SCAN).enumerate() {
            if group.iter().fold(0u32, |any, v| any | v.to_bits()) == 0 {
                continue;
            }
            for (j, v) in group.iter().enumerate() {
                if v.to_bits() != 0 {
                    cols[k] = (g * SCAN + j) as u32;
                    vals[k] = v.to_bits();
                    k += 1;
                }
            }
        }
        debug_assert_eq!(k, cols.len(), "the count and the row agree");
    }
}

/// The rows a sender encodes.
#[derive(Clone, Copy, Debug)]
pub enum RowSource<'a> {
    /// Dense rows, scanned for zeros when the flag says so (else every row goes dense).
    Dense(ArrayView2<'a, f32>, bool),
    /// The same rows kept as CSR, whose entries are exactly the rows' non-zeros: no scan.
    /// Only for rows without a `-0.0` (a CSR drops it; the wire keeps its bits), which the
    /// caller checks.
    Csr(&'a CsrMatrix),
}

impl RowSource<'_> {
    /// Row width.
    pub fn ncols(&self) -> usize {
        match self {
            RowSource::Dense(x, _) => x.ncols(),
            RowSource::Csr(c) => c.ncols,
        }
    }
}

/// Rows `rows` of `local` (in that order) as words, and the words of each consecutive group
/// of `group_rows[g]` of them (the rows bound for each rank): read from `local` directly, with
/// no gathered copy in between. `look_for_zeros` false sends every row dense without scanning.
pub fn encode(
    local: ArrayView2<f32>,
    rows: &[u32],
    group_rows: &[usize],
    look_for_zeros: bool,
) -> (Vec<u32>, Vec<usize>) {
    encode_from(RowSource::Dense(local, look_for_zeros), rows, group_rows)
}

/// [`encode`] from either kind of [`RowSource`]: the same words for the same rows (a row of
/// `n` non-zeros goes sparse when `2n < dim`).
pub fn encode_from(
    source: RowSource,
    rows: &[u32],
    group_rows: &[usize],
) -> (Vec<u32>, Vec<usize>) {
    let n = rows.len();
    assert_eq!(
        group_rows.iter().sum::<usize>(),
        n,
        "group sizes add up to the rows"
    );
    match source {
        RowSource::Dense(local, look_for_zeros) => {
            let local = local.as_standard_layout();
            let dim = local.ncols();
            let all = local.as_slice().expect("standard layout");
            let row = |i: usize| {
                let r = rows[i] as usize;
                &all[r * dim..(r + 1) * dim]
            };
            encode_rows(
                n,
                group_rows,
                |i| packed_len(row(i), look_for_zeros),
                |i, out| write_row(row(i), out),
            )
        }
        RowSource::Csr(csr) => {
            let dim = csr.ncols;
            let len = |i: usize| {
                let k = csr.row_len(rows[i] as usize);
                if 2 * k < dim {
                    1 + 2 * k
                } else {
                    1 + dim
                }
            };
            encode_rows(n, group_rows, len, |i, out| {
                let (cols, vals) = csr.row(rows[i] as usize);
                if 2 * cols.len() >= dim {
                    out[0] = DENSE;
                    out[1..].fill(0);
                    for (&c, v) in cols.iter().zip(vals) {
                        out[1 + c as usize] = v.to_bits();
                    }
                } else {
                    let k = cols.len();
                    out[0] = k as u32;
                    out[1..1 + k].copy_from_slice(cols);
                    for (w, v) in out[1 + k..].iter_mut().zip(vals) {
                        *w = v.to_bits();
                    }
                }
            })
        }
    }
}

/// The words of `n` rows whose row `i` takes `len(i)` words, written by `write(i, words)`, and
/// the words of each group of `group_rows` rows.
fn encode_rows(
    n: usize,
    group_rows: &[usize],
    len: impl Fn(usize) -> usize + Sync,
    write: impl Fn(usize, &mut [u32]) + Sync,
) -> (Vec<u32>, Vec<usize>) {
    let lens: Vec<usize> = (0..n)
        .into_par_iter()
        .with_min_len(ROWS_PER_TASK)
        .map(&len)
        .collect();
    let mut starts = Vec::with_capacity(n + 1);
    starts.push(0usize);
    for &l in &lens {
        starts.push(starts.last().unwrap() + l);
    }
    let mut words = vec![0u32; starts[n]];
    // Each row's words are its own slice of `words`.
    let mut pieces: Vec<&mut [u32]> = Vec::with_capacity(n);
    let mut rest = &mut words[..];
    for &l in &lens {
        let (head, tail) = rest.split_at_mut(l);
        pieces.push(head);
        rest = tail;
    }
    pieces
        .into_par_iter()
        .enumerate()
        .with_min_len(ROWS_PER_TASK)
        .for_each(|(i, out)| write(i, out));
    let mut group_words = Vec::with_capacity(group_rows.len());
    let mut first = 0;
    for &g in group_rows {
        group_words.push(starts[first + g] - starts[first]);
        first += g;
    }
    (words, group_words)
}

/// Write `row` into `out`, which has exactly its packed length.
fn write_row(row: &[f32], out: &mut [u32]) {
    if out.len() == 1 + row.len() {
        // Dense: a sparse form is always shorter (fewer than half the columns set, so
        // 1 + 2n < 1 + dim).
        out[0] = DENSE;
        for (w, v) in out[1..].iter_mut().zip(row) {
            *w = v.to_bits();
        }
        return;
    }
    let n = (out.len() - 1) / 2;
    out[0] = n as u32;
    let (cols, vals) = out[1..].split_at_mut(n);
    write_nonzeros(row, cols, vals);
}

/// The rows of `words` (as [`encode`] wrote them: `rows` rows of width `dim`), put in the
/// caller's order: output row `i` is the words' row `order[i]` (rows may repeat). Decoding
/// straight into that order saves a dense copy of everything received.
///
/// # Panics
/// When the words are not `rows` rows of width `dim` (a peer running another version, or a
/// bug): a header or column out of range, or words left over or missing.
pub fn decode(words: Vec<u32>, rows: usize, dim: usize, order: &[u32]) -> Array2<f32> {
    let packed = PackedRows::new(words, rows, dim, order.to_vec());
    let len = order.len() * dim;
    let mut out = Vec::with_capacity(len);
    if dim > 0 {
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(dim)
            .with_min_len(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(i, dst)| packed.write_row(i, dst));
    }
    // SAFETY: every row (all `dim` values of each) was written above.
    unsafe { out.set_len(len) };
    Array2::from_shape_vec((order.len(), dim), out).expect("one row per position")
}

/// Received rows still in their words, each written out where its reader wants it
/// ([`PackedRows::write_row`]): a gather decodes fetched rows straight into its batch, with no
/// decoded matrix in between (on Facebook that matrix was hundreds of MB a step, written once
/// and copied once more).
#[derive(Debug, Default)]
pub struct PackedRows {
    words: Vec<u32>,
    /// Where each of the words' rows starts.
    starts: Vec<usize>,
    dim: usize,
    /// Row `i` of these rows is the words' row `order[i]`.
    order: Vec<u32>,
}

impl PackedRows {
    /// `rows` rows of width `dim` in `words`, read in `order`; the headers are checked here.
    ///
    /// # Panics
    /// As [`decode`].
    pub fn new(words: Vec<u32>, rows: usize, dim: usize, order: Vec<u32>) -> PackedRows {
        // Row starts: one serial pass over the headers only.
        let mut starts = Vec::with_capacity(rows);
        let mut at = 0usize;
        for r in 0..rows {
            let header = *words.get(at).unwrap_or_else(|| {
                panic!("packed rows: {rows} rows expected, words end at row {r}")
            });
            starts.push(at);
            at += 1 + if header == DENSE {
                dim
            } else {
                assert!(
                    (header as usize) * 2 < dim,
                    "packed rows: row {r} claims {header} non-zeros of {dim} columns"
                );
                2 * header as usize
            };
        }
        assert_eq!(
            at,
            words.len(),
            "packed rows: {} words for {rows} rows",
            words.len()
        );
        if let Some(&bad) = order.iter().find(|&&r| r as usize >= rows) {
            panic!("packed rows: row {bad} of {rows} requested");
        }
        PackedRows {
            words,
            starts,
            dim,
            order,
        }
    }

    /// Number of rows (in the reader's order).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The words of row `i`: `Ok(values)` of a row sent dense, `Err((columns, values))` of
    /// one sent without its zeros.
    fn row_words(&self, i: usize) -> Result<&[u32], (&[u32], &[u32])> {
        let s = self.starts[self.order[i] as usize];
        let header = self.words[s];
        if header == DENSE {
            Ok(&self.words[s + 1..s + 1 + self.dim])
        } else {
            let n = header as usize;
            Err((
                &self.words[s + 1..s + 1 + n],
                &self.words[s + 1 + n..s + 1 + 2 * n],
            ))
        }
    }

    /// How many of row `i`'s values a CSR stores (`!= 0.0`, as `CsrMatrix::from_dense`
    /// counts them: a `-0.0`, which travels as a non-zero, is a zero here).
    pub fn nonzeros(&self, i: usize) -> usize {
        let stored = |w: &[u32]| w.iter().filter(|&&b| f32::from_bits(b) != 0.0).count();
        match self.row_words(i) {
            Ok(values) => stored(values),
            Err((_, values)) => stored(values),
        }
    }

    /// Row `i`'s CSR entries ([`PackedRows::nonzeros`] of them, in column order) into `idx`
    /// and `val`, which are exactly that long: the entries `CsrMatrix::from_dense` keeps of
    /// the decoded row.
    ///
    /// # Panics
    /// If the slices' length is not the row's count, or a column is out of range.
    pub fn write_row_entries(&self, i: usize, idx: &mut [u32], val: &mut [f32]) {
        let mut k = 0;
        let mut put = |c: u32, bits: u32| {
            let v = f32::from_bits(bits);
            if v != 0.0 {
                idx[k] = c;
                val[k] = v;
                k += 1;
            }
        };
        match self.row_words(i) {
            Ok(values) => {
                for (c, &b) in values.iter().enumerate() {
                    put(c as u32, b);
                }
            }
            Err((cols, values)) => {
                for (&c, &b) in cols.iter().zip(values) {
                    assert!(
                        (c as usize) < self.dim,
                        "packed rows: column {c} of a {}-column row",
                        self.dim
                    );
                    put(c, b);
                }
            }
        }
        assert_eq!(
            k,
            idx.len(),
            "packed rows: a row's entries and its count agree"
        );
    }

    /// Write row `i` into `dst`: all `dim` values, the zeros too (so `dst` may be
    /// uninitialised memory, as a gather's fresh batch is).
    ///
    /// # Panics
    /// If `dst` is not `dim` long, or a column is out of range.
    pub fn write_row(&self, i: usize, dst: &mut [MaybeUninit<f32>]) {
        assert_eq!(
            dst.len(),
            self.dim,
            "packed rows: a row is {} values",
            self.dim
        );
        let s = self.starts[self.order[i] as usize];
        let header = self.words[s];
        if header == DENSE {
            for (d, w) in dst.iter_mut().zip(&self.words[s + 1..s + 1 + self.dim]) {
                d.write(f32::from_bits(*w));
            }
        } else {
            dst.fill(MaybeUninit::new(0.0));
            let n = header as usize;
            let cols = &self.words[s + 1..s + 1 + n];
            let vals = &self.words[s + 1 + n..s + 1 + 2 * n];
            for (&c, &v) in cols.iter().zip(vals) {
                let c = c as usize;
                assert!(
                    c < self.dim,
                    "packed rows: column {c} of a {}-column row",
                    self.dim
                );
                dst[c].write(f32::from_bits(v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn bits(m: &Array2<f32>) -> Vec<u32> {
        m.iter().map(|v| v.to_bits()).collect()
    }

    /// Rows `0..n` in order.
    fn all(n: usize) -> Vec<u32> {
        (0..n as u32).collect()
    }

    #[test]
    fn sparse_and_dense_rows_come_back_bitwise() {
        // Row 0 sparse (1 of 6 set), row 1 dense, row 2 empty, row 3 with a -0.0 and a NaN,
        // row 4 exactly half set (dense: the sparse form would be no shorter).
        let nan = f32::from_bits(0x7fc0_0123);
        let rows = array![
            [0.0, 0.0, 2.5, 0.0, 0.0, 0.0],
            [1.0, 2.0, 3.0, 4.0, 5.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [-0.0, 0.0, 0.0, nan, 0.0, 0.0],
            [1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
        ];
        for look in [true, false] {
            let (words, groups) = encode(rows.view(), &all(5), &[2, 0, 3], look);
            assert_eq!(groups.iter().sum::<usize>(), words.len());
            let back = decode(words.clone(), 5, 6, &all(5));
            assert_eq!(bits(&back), bits(&rows), "look_for_zeros {look}");
        }
        let (words, groups) = encode(rows.view(), &all(5), &[2, 0, 3], true);
        // 1+2 (sparse) + 1+6 (dense) | nothing | 1 (empty) + 1+4 (two set) + 1+6 (dense).
        assert_eq!(groups, vec![10, 0, 13]);
        assert_eq!(words[0], 1);
        assert_eq!(&words[1..3], &[2, 2.5f32.to_bits()]);
        assert_eq!(words[3], DENSE);
        let (dense, groups) = encode(rows.view(), &all(5), &[5], false);
        assert_eq!(groups, vec![5 * 7]);
        assert_eq!(dense.len(), 35);
    }

    #[test]
    fn rows_sent_from_a_csr_copy_are_the_words_of_the_dense_rows() {
        // Sparse, dense, empty, NaN-holding and exactly-half-set rows (no -0.0: a CSR copy is
        // used only without one), sent in another order and grouped.
        let nan = f32::from_bits(0x7fc0_0123);
        let rows = array![
            [0.0, 0.0, 2.5, 0.0, 0.0, 0.0],
            [1.0, 2.0, 3.0, 4.0, 5.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, nan, 0.0, 7.0],
            [1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
        ];
        let csr = CsrMatrix::from_dense(rows.view());
        let order = [4, 0, 3, 3, 1, 2];
        let want = encode(rows.view(), &order, &[2, 0, 4], true);
        let got = encode_from(RowSource::Csr(&csr), &order, &[2, 0, 4]);
        assert_eq!(got, want);
        // Received, their counts and entries are the CSR's rows.
        let packed = PackedRows::new(want.0, 6, 6, (0..6).collect());
        for (i, &r) in order.iter().enumerate() {
            let (c, v) = csr.row(r as usize);
            assert_eq!(packed.nonzeros(i), c.len(), "row {i}");
            let (mut ci, mut vi) = (vec![0; c.len()], vec![0.0; c.len()]);
            packed.write_row_entries(i, &mut ci, &mut vi);
            assert_eq!(ci, c);
            assert_eq!(
                bits(&Array2::from_shape_vec((1, vi.len()), vi).unwrap()),
                v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_wide_sparse_row_shrinks_by_its_zeros() {
        // Non-zeros at both edges of a 16-value group, in the short last group, and a -0.0
        // (a non-zero bit pattern) alone in its group.
        let mut rows = Array2::<f32>::zeros((3, 4714));
        for (i, c) in [(0, 7), (0, 4000), (1, 13), (1, 15), (1, 16), (2, 4713)] {
            rows[[i, c]] = 1.0 + c as f32;
        }
        rows[[2, 31]] = -0.0;
        let (words, groups) = encode(rows.view(), &all(3), &[3], true);
        assert_eq!(words.len(), (1 + 4) + (1 + 6) + (1 + 4));
        assert_eq!(groups, vec![words.len()]);
        assert_eq!(bits(&decode(words.clone(), 3, 4714, &all(3))), bits(&rows));
    }

    #[test]
    fn rows_are_written_whole_wherever_the_reader_wants_them() {
        let rows = array![
            [0.0f32, 0.0, 3.0, 0.0],
            [1.0, 2.0, 3.0, 4.0],
            [0.0, 0.0, 0.0, 0.0]
        ];
        let (words, _) = encode(rows.view(), &all(3), &[3], true);
        let packed = PackedRows::new(words, 3, 4, vec![2, 0, 1, 0]);
        assert_eq!(packed.len(), 4);
        for (i, expect) in [2usize, 0, 1, 0].into_iter().enumerate() {
            // Every value of the destination is overwritten, zeros included.
            let mut dst = [MaybeUninit::new(f32::NAN); 4];
            packed.write_row(i, &mut dst);
            // SAFETY: initialised above (and overwritten by `write_row`).
            let got = dst.map(|v| unsafe { v.assume_init() }.to_bits());
            let want: Vec<u32> = rows.row(expect).iter().map(|v| v.to_bits()).collect();
            assert_eq!(got.to_vec(), want, "row {i}");
        }
    }

    #[test]
    #[should_panic(expected = "packed rows")]
    fn words_of_another_shape_are_refused() {
        let rows = array![[0.0f32, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]];
        let (words, _) = encode(rows.view(), &all(2), &[2], true);
        decode(words.clone(), 3, 4, &all(3));
    }
}
