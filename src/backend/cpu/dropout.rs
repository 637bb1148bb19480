//! Inverted dropout with counter-based masks.
//!
//! The mask bit of element `(row, col)` is a pure function of `(stream, row_key, col)`:
//! `keep ⇔ hash32(row_seed(stream, row_key), col) < (1 − p)·2³²`. The row seed is a full
//! 64-bit hash, computed once per row; the element hash is murmur3's 32-bit finaliser over
//! `row_seed + col·φ` ([`super::bitmask::element_hash`]), which AVX-512 computes 16 columns at
//! a time without 64-bit multiplies: dropout was the costliest element-wise kernel of training. The caller passes the row's ORIGINAL
//! vertex id as `row_key` and derives `stream` from (seed, epoch, step, layer), so a vertex gets
//! the same mask whichever rank computes it and wherever its row sits in a block
//! (ARCHITECTURE invariant 3). Kept elements are scaled by `1/(1−p)` so the expectation is
//! unchanged and evaluation needs no rescaling.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use std::mem::MaybeUninit;

use super::bitmask::{self, element_hash, RowHash};
use super::simd::simd_kernel;

/// The murmur3 / SplitMix64 64-bit finaliser: a bijective mixer with full avalanche.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Combine a stream key with a further counter (e.g. a layer index) into a new stream key.
#[inline]
pub fn derive_stream(stream: u64, counter: u64) -> u64 {
    mix64(stream ^ mix64(counter.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

simd_kernel! {
    /// `row ← mask(row)` for the row whose seed is `seed`.
    fn mask_row(mask: &DropoutMask, seed: u64, row: &mut [f32]) {
        for (c, v) in row.iter_mut().enumerate() {
            *v = if mask.keep_row(seed, c) { *v * mask.scale } else { 0.0 };
        }
    }
}

simd_kernel! {
    /// `dst ← mask(src)` for the row whose seed is `seed`.
    fn mask_row_copy(mask: &DropoutMask, seed: u64, src: &[f32], dst: &mut [f32]) {
        for (c, (d, &v)) in dst.iter_mut().zip(src).enumerate() {
            *d = if mask.keep_row(seed, c) { v * mask.scale } else { 0.0 };
        }
    }
}

simd_kernel! {
    /// [`mask_row_copy`] into uninitialised memory that also records the kept elements, bit
    /// `c % 64` of `bits[c / 64]` (the portable form of [`bitmask::dropout_row`]).
    fn mask_row_copy_bits(
        hash: RowHash,
        src: &[f32],
        dst: &mut [MaybeUninit<f32>],
        bits: &mut [u64],
    ) {
        for (w, (word, (ds, ss))) in bits
            .iter_mut()
            .zip(dst.chunks_mut(64).zip(src.chunks(64)))
            .enumerate()
        {
            let mut kept = 0u64;
            for (i, (d, &v)) in ds.iter_mut().zip(ss).enumerate() {
                let keep = hash.keep(w * 64 + i);
                kept |= (keep as u64) << i;
                d.write(if keep { v * hash.scale } else { 0.0 });
            }
            *word = kept;
        }
    }
}

simd_kernel! {
    /// [`mask_row`] that also records the kept elements (the portable form of
    /// [`bitmask::dropout_row_in_place`]).
    fn mask_row_bits(hash: RowHash, row: &mut [f32], bits: &mut [u64]) {
        for (w, (word, vs)) in bits.iter_mut().zip(row.chunks_mut(64)).enumerate() {
            let mut kept = 0u64;
            for (i, v) in vs.iter_mut().enumerate() {
                let keep = hash.keep(w * 64 + i);
                kept |= (keep as u64) << i;
                *v = if keep { *v * hash.scale } else { 0.0 };
            }
            *word = kept;
        }
    }
}

/// One dropout row in place, recording the kept elements (bit `c % 64` of `bits[c / 64]`):
/// the AVX-512 kernel where the CPU has it, the portable loop (bitwise the same) elsewhere.
/// Every masking of recorded rows goes through here: a layer's input dropout, and the one a
/// product applies to its output ([`super::gemm::matmul_bias_relu_dropout`]).
pub fn mask_row_recorded(hash: RowHash, row: &mut [f32], bits: &mut [u64]) {
    if !bitmask::dropout_row_in_place(hash, row, bits) {
        mask_row_bits(hash, row, bits)
    }
}

simd_kernel! {
    /// `row ← mask(row)` from recorded bits (what [`mask_row`] computes, without hashing).
    fn mask_row_from_bits(bits: &[u64], scale: f32, row: &mut [f32]) {
        for (vs, &word) in row.chunks_mut(64).zip(bits) {
            for (i, v) in vs.iter_mut().enumerate() {
                *v = if (word >> i) & 1 == 1 { *v * scale } else { 0.0 };
            }
        }
    }
}

/// Which elements a forward dropout kept (one bit per element, rows padded to whole words),
/// so that the backward applies the same mask without hashing every element again.
#[derive(Clone, Debug)]
pub struct KeptBits {
    words_per_row: usize,
    bits: Vec<u64>,
    scale: f32,
}

impl KeptBits {
    /// All bits clear for a `rows × cols` matrix (rows padded to whole words).
    fn none_kept(rows: usize, cols: usize, scale: f32) -> KeptBits {
        let words = cols.div_ceil(64);
        KeptBits {
            words_per_row: words,
            bits: vec![0u64; rows * words],
            scale,
        }
    }

    /// The kept bits a fused product recorded for a `rows × cols` output (bit `i·cols + j`,
    /// `cols` a multiple of 64) under `mask`.
    pub fn from_product(rows: usize, cols: usize, mask: &DropoutMask, bits: Vec<u64>) -> KeptBits {
        assert!(cols.is_multiple_of(64), "dropout bits: whole words per row");
        assert_eq!(bits.len(), rows * cols / 64, "dropout bits: shape");
        KeptBits {
            words_per_row: cols / 64,
            bits,
            scale: mask.scale,
        }
    }

    /// Panic unless these bits belong to a `rows × cols` matrix.
    pub fn check_shape(&self, rows: usize, cols: usize) {
        assert_eq!(
            (rows * self.words_per_row, self.words_per_row),
            (self.bits.len(), cols.div_ceil(64)),
            "dropout bits: shape"
        );
    }

    /// These bits and'ed with `positive`, the sign bits of a ReLU's output over the same
    /// matrix (bit `r·cols + c`, [`super::activation::Saved::Positive`]'s layout), when the
    /// rows are whole words (`cols` a multiple of 64) so that both layouts agree; `None`
    /// otherwise. Masking a gradient with the result is the dropout's backward and then the
    /// ReLU's, in one pass: up to the sign of zeros, the same values as the two passes.
    pub fn and_positive(&self, cols: usize, positive: &[u64]) -> Option<KeptBits> {
        let whole_words = cols.is_multiple_of(64) && self.words_per_row == cols / 64;
        if !whole_words || positive.len() < self.bits.len() {
            return None;
        }
        let bits = self.bits.iter().zip(positive).map(|(k, p)| k & p).collect();
        Some(KeptBits { bits, ..*self })
    }

    /// [`KeptBits::apply_in_place`] on row `r` alone.
    #[inline]
    pub fn apply_row(&self, r: usize, row: &mut [f32]) {
        let bits = &self.bits[r * self.words_per_row..(r + 1) * self.words_per_row];
        if !bitmask::scale_set_or_zero(bits, self.scale, row) {
            mask_row_from_bits(bits, self.scale, row)
        }
    }

    /// The gradient's backward through the dropout: `g ← mask(g)`, bitwise what
    /// [`DropoutMask::apply_in_place`] gives with the forward's keys.
    ///
    /// # Panics
    /// If `g` is not the forward's shape in standard layout.
    pub fn apply_in_place(&self, mut g: ArrayViewMut2<f32>) {
        let cols = g.ncols();
        assert_eq!(
            g.nrows() * self.words_per_row,
            self.bits.len(),
            "dropout bits: shape"
        );
        assert_eq!(
            self.words_per_row,
            cols.div_ceil(64),
            "dropout bits: columns"
        );
        if cols == 0 {
            return;
        }
        let g = g.as_slice_mut().expect("dropout: standard layout");
        g.par_chunks_mut(cols)
            .enumerate()
            .with_min_len(super::rows_per_task(cols))
            .for_each(|(r, row)| self.apply_row(r, row));
    }
}

/// A dropout mask generator for one stream and drop probability.
#[derive(Clone, Copy, Debug)]
pub struct DropoutMask {
    stream: u64,
    /// Elements whose 32-bit hash is below this are kept (every element with `keep_all`).
    keep_below: u32,
    /// `p == 0`: `(1 − p)·2³²` does not fit 32 bits.
    keep_all: bool,
    /// `1/(1−p)`.
    scale: f32,
}

impl DropoutMask {
    /// A mask dropping each element with probability `p` (`0 ≤ p < 1`).
    ///
    /// # Panics
    /// If `p` is outside `[0, 1)`; configurations are validated before they get here.
    pub fn new(stream: u64, p: f32) -> DropoutMask {
        assert!(
            (0.0..1.0).contains(&p),
            "dropout probability {p} not in [0, 1)"
        );
        let keep = 1.0 - p as f64;
        let threshold = (keep * 4_294_967_296.0).round();
        DropoutMask {
            stream,
            keep_below: threshold.min(u32::MAX as f64) as u32,
            keep_all: threshold > u32::MAX as f64,
            scale: (1.0 / keep) as f32,
        }
    }

    /// The per-row key from which the element hashes of that row are derived.
    #[inline]
    fn row_seed(&self, row_key: u64) -> u64 {
        mix64(self.stream ^ mix64(row_key ^ 0x5851_f42d_4c95_7f2d))
    }

    /// The row keyed by `row_key` in the form the row kernels take.
    #[inline]
    fn row_hash(&self, row_key: u64) -> RowHash {
        RowHash {
            seed: self.row_seed(row_key) as u32,
            keep_below: self.keep_below,
            keep_all: self.keep_all,
            scale: self.scale,
        }
    }

    /// True when element `(row_key, col)` is kept.
    #[inline]
    pub fn keep(&self, row_key: u64, col: usize) -> bool {
        self.keep_row(self.row_seed(row_key), col)
    }

    #[inline(always)]
    fn keep_row(&self, row_seed: u64, col: usize) -> bool {
        self.keep_all || element_hash(row_seed as u32, col as u32) < self.keep_below
    }

    /// The scale `1/(1−p)` applied to kept elements.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// This mask over rows keyed by `row_keys`, in the form a product applies as it stores
    /// its output ([`super::gemm::matmul_bias_relu_dropout`]); `None` when nothing is dropped
    /// (`p == 0`), which needs no pass at all.
    pub fn fused(&self, row_keys: &[u64]) -> Option<super::gemm::RowDropout> {
        (!self.keep_all).then(|| super::gemm::RowDropout {
            seeds: row_keys.iter().map(|&k| self.row_seed(k) as u32).collect(),
            keep_below: self.keep_below,
            scale: self.scale,
        })
    }

    /// Multiply `x` in place by the mask (kept: `·1/(1−p)`, dropped: `0`); row `r` uses key
    /// `row_keys[r]`. The same call on a gradient is the backward pass.
    pub fn apply_in_place(&self, mut x: ArrayViewMut2<f32>, row_keys: &[u64]) {
        assert_eq!(x.nrows(), row_keys.len(), "dropout: one key per row");
        let cols = x.ncols();
        let x = x
            .as_slice_mut()
            .expect("dropout: the matrix must be in standard layout");
        if cols == 0 {
            return;
        }
        x.par_chunks_mut(cols)
            .zip(row_keys.par_iter())
            .with_min_len(super::rows_per_task(cols * 4))
            .for_each(|(row, &key)| mask_row(self, self.row_seed(key), row));
    }

    /// [`DropoutMask::apply_in_place`] on the stored entries of a sparse matrix: the same
    /// mask as on its dense form, whose zeros stay zero whatever the mask says.
    pub fn apply_sparse_in_place(&self, x: &mut super::sparse::CsrMatrix, row_keys: &[u64]) {
        self.apply_sparse_in_place_from(x, row_keys, 0)
    }

    /// [`DropoutMask::apply_sparse_in_place`] on columns `first..` of the rows the mask is
    /// drawn for: stored column `c` takes the bit of column `first + c` (a feature-sliced
    /// rank's slice gets exactly the whole row's bits there).
    pub fn apply_sparse_in_place_from(
        &self,
        x: &mut super::sparse::CsrMatrix,
        row_keys: &[u64],
        first: usize,
    ) {
        assert_eq!(x.nrows(), row_keys.len(), "dropout: one key per row");
        x.par_for_each_row_chunk_mut(|r0, indptr, cols, vals| {
            let base = indptr[0];
            for (k, w) in indptr.windows(2).enumerate() {
                let seed = self.row_seed(row_keys[r0 + k]);
                let span = w[0] - base..w[1] - base;
                for (&c, v) in cols[span.clone()].iter().zip(&mut vals[span]) {
                    *v = if self.keep_row(seed, first + c as usize) {
                        *v * self.scale
                    } else {
                        0.0
                    };
                }
            }
        });
    }

    /// A masked copy of `x` (see [`DropoutMask::apply_in_place`]), written in one pass.
    pub fn apply(&self, x: ArrayView2<f32>, row_keys: &[u64]) -> Array2<f32> {
        assert_eq!(x.nrows(), row_keys.len(), "dropout: one key per row");
        let x = super::standard(x);
        let cols = x.ncols();
        let xs = x.as_slice().expect("standard layout");
        super::par_rows_from_zero(x.nrows(), cols, super::rows_per_task(cols * 4), |i, dst| {
            let src = &xs[i * cols..(i + 1) * cols];
            mask_row_copy(self, self.row_seed(row_keys[i]), src, dst)
        })
    }

    /// [`DropoutMask::apply_recorded`] in place: `x ← mask(x)` (standard layout), returning
    /// which elements were kept. Bitwise the same as the copying form.
    pub fn apply_recorded_in_place(&self, mut x: ArrayViewMut2<f32>, row_keys: &[u64]) -> KeptBits {
        assert_eq!(x.nrows(), row_keys.len(), "dropout: one key per row");
        let (rows, cols) = x.dim();
        let mut kept = KeptBits::none_kept(rows, cols, self.scale);
        let words = kept.words_per_row;
        if cols == 0 || rows == 0 {
            return kept;
        }
        let xs = x.as_slice_mut().expect("dropout: standard layout");
        xs.par_chunks_mut(cols)
            .zip(kept.bits.par_chunks_mut(words))
            .zip(row_keys.par_iter())
            .with_min_len(super::rows_per_task(cols * 4))
            .for_each(|((row, bits), &key)| mask_row_recorded(self.row_hash(key), row, bits));
        kept
    }

    /// [`DropoutMask::apply`] that also returns which elements were kept, for the backward.
    pub fn apply_recorded(&self, x: ArrayView2<f32>, row_keys: &[u64]) -> (Array2<f32>, KeptBits) {
        assert_eq!(x.nrows(), row_keys.len(), "dropout: one key per row");
        let x = super::standard(x);
        let (rows, cols) = x.dim();
        let mut kept = KeptBits::none_kept(rows, cols, self.scale);
        let words = kept.words_per_row;
        if cols == 0 || rows == 0 {
            return (Array2::zeros((rows, cols)), kept);
        }
        // Rows are written straight into uninitialised memory (no serial zero-fill pass).
        let mut out = Array2::<f32>::uninit((rows, cols));
        let xs = x.as_slice().expect("standard layout");
        out.as_slice_mut()
            .expect("fresh array")
            .par_chunks_mut(cols)
            .zip(xs.par_chunks(cols))
            .zip(kept.bits.par_chunks_mut(words))
            .zip(row_keys.par_iter())
            .with_min_len(super::rows_per_task(cols * 4))
            .for_each(|(((dst, src), bits), &key)| {
                let hash = self.row_hash(key);
                if !bitmask::dropout_row(hash, src, dst, bits) {
                    mask_row_copy_bits(hash, src, dst, bits)
                }
            });
        // SAFETY: every row was initialised above.
        (unsafe { out.assume_init() }, kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_rate_is_close_to_p_and_scale_is_inverse_keep() {
        let mask = DropoutMask::new(42, 0.3);
        let x = Array2::<f32>::ones((500, 200));
        let keys: Vec<u64> = (0..500).map(|i| 1000 + i as u64).collect();
        let y = mask.apply(x.view(), &keys);
        let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64 / y.len() as f64;
        assert!((dropped - 0.3).abs() < 0.01, "drop rate {dropped}");
        let kept = y.iter().find(|&&v| v != 0.0).copied().unwrap();
        assert!((kept - 1.0 / 0.7).abs() < 1e-6);
        assert!((y.sum() as f64 / y.len() as f64 - 1.0).abs() < 0.02);
    }

    #[test]
    fn mask_follows_the_row_key_not_the_row_position() {
        let mask = DropoutMask::new(7, 0.5);
        let x = Array2::from_shape_fn((4, 64), |(i, j)| (i * 64 + j) as f32 + 1.0);
        let keys = [10u64, 20, 30, 40];
        let y = mask.apply(x.view(), &keys);
        // The same rows in another order (as in another block) get the same masks.
        let perm = [2usize, 0, 3, 1];
        let xp = Array2::from_shape_fn((4, 64), |(i, j)| x[[perm[i], j]]);
        let kp: Vec<u64> = perm.iter().map(|&p| keys[p]).collect();
        let yp = mask.apply(xp.view(), &kp);
        for (i, &p) in perm.iter().enumerate() {
            assert_eq!(yp.row(i), y.row(p));
        }
        // Another stream gives another mask.
        let other = DropoutMask::new(8, 0.5).apply(x.view(), &keys);
        assert_ne!(other, y);
    }

    #[test]
    fn sparse_masking_matches_dense_masking() {
        let x = Array2::from_shape_fn((1500, 50), |(i, j)| {
            if (i * 7 + j * 3) % 11 == 0 {
                (i + j) as f32
            } else {
                0.0
            }
        });
        let keys: Vec<u64> = (0..1500).map(|i| 3 * i as u64 + 1).collect();
        let mask = DropoutMask::new(99, 0.4);
        let mut s = crate::backend::cpu::sparse::CsrMatrix::from_dense(x.view());
        mask.apply_sparse_in_place(&mut s, &keys);
        assert_eq!(s.to_dense(), mask.apply(x.view(), &keys));
    }

    #[test]
    fn recorded_bits_reproduce_the_mask_bitwise() {
        let mask = DropoutMask::new(5, 0.4);
        // 70 columns: a full word and a partial one per row.
        let x = Array2::from_shape_fn((9, 70), |(i, j)| (i as f32 - 4.0) * 0.5 + j as f32);
        let keys: Vec<u64> = (0..9).map(|i| 11 * i as u64).collect();
        let (y, kept) = mask.apply_recorded(x.view(), &keys);
        assert_eq!(y, mask.apply(x.view(), &keys));
        let mut in_place = x.clone();
        let kept_in_place = mask.apply_recorded_in_place(in_place.view_mut(), &keys);
        assert_eq!(in_place, y);
        assert_eq!(kept_in_place.bits, kept.bits);
        let g = Array2::from_shape_fn((9, 70), |(i, j)| ((i * 70 + j) as f32).sin());
        let mut by_keys = g.clone();
        mask.apply_in_place(by_keys.view_mut(), &keys);
        let mut by_bits = g.clone();
        kept.apply_in_place(by_bits.view_mut());
        assert_eq!(by_bits, by_keys);
    }

    #[test]
    fn zero_probability_keeps_everything() {
        let mask = DropoutMask::new(1, 0.0);
        let x = Array2::from_elem((3, 5), 2.5f32);
        assert_eq!(mask.apply(x.view(), &[1, 2, 3]), x);
    }

    /// The portable loops (what CPUs without AVX-512 run) give bitwise what the AVX-512
    /// kernels give: hashing, masking, recording and applying recorded bits.
    #[test]
    fn portable_loops_match_the_vector_kernels() {
        let mask = DropoutMask::new(21, 0.35);
        let n = 83;
        let src: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).cos()).collect();
        for key in [3u64, 99, 12345] {
            let hash = mask.row_hash(key);
            let (mut dst_v, mut bits_v) = (vec![MaybeUninit::new(0f32); n], vec![0u64; 2]);
            let (mut dst_p, mut bits_p) = (vec![MaybeUninit::new(0f32); n], vec![0u64; 2]);
            let vector = bitmask::dropout_row(hash, &src, &mut dst_v, &mut bits_v);
            mask_row_copy_bits(hash, &src, &mut dst_p, &mut bits_p);
            // SAFETY: both rows were fully written.
            let (v, p): (Vec<f32>, Vec<f32>) = unsafe {
                (
                    dst_v.iter().map(|x| x.assume_init()).collect(),
                    dst_p.iter().map(|x| x.assume_init()).collect(),
                )
            };
            let mut in_place = src.clone();
            let mut bits_i = vec![0u64; 2];
            mask_row_bits(hash, &mut in_place, &mut bits_i);
            assert_eq!(in_place, p, "portable in place vs copy");
            assert_eq!(bits_i, bits_p);
            let mut from_bits = src.clone();
            mask_row_from_bits(&bits_p, mask.scale, &mut from_bits);
            assert_eq!(from_bits, p, "recorded bits");
            if vector {
                assert_eq!(v, p, "vector vs portable");
                assert_eq!(bits_v, bits_p);
                let mut g = src.clone();
                assert!(bitmask::scale_set_or_zero(&bits_p, mask.scale, &mut g));
                assert_eq!(g, p);
            }
        }
    }
}
