//! Matrix products on `f32`: the `gemm` crate's packed kernels, on blocks of the output that
//! gnnpar fixes from the shape and runs in parallel over rayon.
//!
//! gnnpar had its own packed AVX-512 / AVX2 SGEMM here; measured side by side
//! (`benchmarks/gemm.sh`, `benchmarks/results/gemm.md`) it was not faster than the `gemm`
//! crate on a training step's products, and won only through its fused bias / ReLU / dropout
//! epilogue. This module keeps that fusion cheaply: a product with an epilogue is cut into
//! blocks of whole rows, and each block gets the epilogue right after its product, on the same
//! thread, while the block is still in cache ([`matmul_onto_bias_relu`]).
//!
//! How a product is cut ([`Split`]) depends on its shape only, and every block is one call of
//! the crate with its own parallelism off, so each element is computed the same way whatever
//! the number of threads: results are bitwise the same on any thread count. A long reduction
//! into a small output (a weight gradient `xᵀ·dy` over a mini-batch's rows) is cut along the
//! reduction instead, and the partial products are added in block order.
//!
//! Transposed operands are passed as transposed views (`a.t()`): the crate reads any strides.

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

/// Below this many multiply-adds a product is one call on the calling thread.
const SERIAL_FLOPS: usize = 1 << 20;
/// Fewest multiply-adds per block (below, the crate's per-call setup and packing dominate).
const BLOCK_FLOPS: usize = 1 << 22;
/// Row blocks are multiples of this many rows, so that a block of an epilogue's bit sets
/// (one bit per output element) starts and ends on a 64-bit word.
const ROW_UNIT: usize = 64;
/// Fewest and most rows per block. Each block packs its share of `a` and all of `b` again:
/// measured on this project's shapes (`benchmarks/gemm.sh`'s VM, one thread), blocks of 256
/// rows run at 93–98 % of one whole-product call and 64-row blocks at 60–90 %. More than
/// 1024 rows gain nothing.
const MIN_ROWS: usize = 256;
const MAX_ROWS: usize = 1024;
/// Above `MIN_ROWS`, a block's output is kept within this many bytes, so that an epilogue
/// finds it in L2 (a cheap product, few inner steps, would otherwise be split into blocks
/// of a megabyte or more).
const BLOCK_BYTES: usize = 256 << 10;
/// Blocks a row split aims at: enough to balance many threads, as long as blocks keep
/// `MIN_ROWS`.
const BLOCKS: usize = 64;
/// Fewest columns per block when a short, wide output is split by columns.
const MIN_COLS: usize = 256;
/// A reduction at least this many times longer than the output's larger side is split along
/// the reduction.
const LONG_REDUCTION: usize = 4;
/// Fewest reduction steps per block, and most blocks, of a split reduction (each block adds
/// one partial output to sum).
const MIN_INNER: usize = 4096;
const MAX_INNER_BLOCKS: usize = 16;

/// How a product is cut into blocks, each one call of the `gemm` crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// One call.
    Whole,
    /// Blocks of this many rows of `a` and of the output.
    Rows(usize),
    /// Blocks of this many columns of `b` and of the output.
    Cols(usize),
    /// Blocks of this many reduction steps, each a partial product of the whole output.
    Inner(usize),
}

impl Split {
    /// The split of an `m×k` by `k×n` product: a function of the shape only.
    fn of(m: usize, n: usize, k: usize) -> Split {
        let flops = m * n * k;
        if flops <= SERIAL_FLOPS {
            return Split::Whole;
        }
        if k >= LONG_REDUCTION * m.max(n) && k >= 2 * MIN_INNER {
            let blocks = (k / MIN_INNER).min(MAX_INNER_BLOCKS);
            return Split::Inner(k.div_ceil(blocks).next_multiple_of(ROW_UNIT));
        }
        if m >= 2 * MIN_ROWS {
            let most = (BLOCK_BYTES / (n * std::mem::size_of::<f32>())).clamp(MIN_ROWS, MAX_ROWS);
            let rows = m
                .div_ceil(BLOCKS)
                .max(BLOCK_FLOPS.div_ceil(n * k))
                .clamp(MIN_ROWS, most)
                .next_multiple_of(ROW_UNIT);
            return Split::Rows(rows);
        }
        if n >= 2 * MIN_COLS {
            let cols = n
                .div_ceil(BLOCKS)
                .max(BLOCK_FLOPS.div_ceil(m * k))
                .max(MIN_COLS)
                .next_multiple_of(ROW_UNIT);
            return Split::Cols(cols);
        }
        Split::Whole
    }
}

/// How a product of `a` (`m×k`) by `b` (`k×n`) is cut into blocks, in words (for reports such
/// as `benchmarks/gemm.sh`'s).
pub fn describe_split(m: usize, n: usize, k: usize) -> String {
    match Split::of(m, n, k) {
        Split::Whole => "one call".into(),
        Split::Rows(r) => format!("{} blocks of {r} rows", m.div_ceil(r)),
        Split::Cols(c) => format!("{} blocks of {c} columns", n.div_ceil(c)),
        Split::Inner(d) => format!("{} partial products of {d} steps", k.div_ceil(d)),
    }
}

/// A strided matrix read by a product: element `(i, j)` at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy, Debug)]
struct Mat {
    ptr: *const f32,
    rs: isize,
    cs: isize,
}

/// A strided output matrix.
#[derive(Clone, Copy, Debug)]
struct Out {
    ptr: *mut f32,
    rs: isize,
    cs: isize,
}

// SAFETY: plain descriptions of memory; blocks on different threads only read the inputs and
// write disjoint parts of the output.
unsafe impl Send for Mat {}
unsafe impl Sync for Mat {}
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Mat {
    fn of(a: &ArrayView2<f32>) -> Mat {
        Mat {
            ptr: a.as_ptr(),
            rs: a.strides()[0],
            cs: a.strides()[1],
        }
    }

    /// The sub-matrix starting at `(i, j)` (pointer arithmetic only: nothing is read).
    fn at(self, i: usize, j: usize) -> Mat {
        Mat {
            ptr: self
                .ptr
                .wrapping_offset(i as isize * self.rs + j as isize * self.cs),
            ..self
        }
    }
}

impl Out {
    fn of(c: &mut ArrayViewMut2<f32>) -> Out {
        Out {
            ptr: c.as_mut_ptr(),
            rs: c.strides()[0],
            cs: c.strides()[1],
        }
    }

    /// A standard-layout `_ × n` matrix at `ptr`.
    fn rows_of(ptr: *mut f32, n: usize) -> Out {
        Out {
            ptr,
            rs: n as isize,
            cs: 1,
        }
    }

    fn at(self, i: usize, j: usize) -> Out {
        Out {
            ptr: self
                .ptr
                .wrapping_offset(i as isize * self.rs + j as isize * self.cs),
            ..self
        }
    }
}

/// `c = alpha·a·b + beta·c` (`m×k` by `k×n`) by one call of the `gemm` crate, on this thread.
/// `beta == 0` never reads `c`.
///
/// # Safety
/// The three descriptions lie inside valid memory, `c` is writable and overlaps neither input.
#[allow(clippy::too_many_arguments)]
unsafe fn call(m: usize, n: usize, k: usize, alpha: f32, a: Mat, b: Mat, beta: f32, c: Out) {
    // The crate computes dst = alpha·dst + beta·lhs·rhs, dst not read when `read_dst` is false.
    gemm::gemm(
        m,
        n,
        k,
        c.ptr,
        c.cs,
        c.rs,
        beta != 0.0,
        a.ptr,
        a.cs,
        a.rs,
        b.ptr,
        b.cs,
        b.rs,
        beta,
        alpha,
        false,
        false,
        false,
        gemm::Parallelism::None,
    )
}

/// `c = alpha·a·b + beta·c` cut by [`Split::of`], the blocks on rayon workers. `then(i0,
/// rows)` runs on every block of rows once they are final: with a row split right after the
/// block's product, on its thread, while the block is in cache; otherwise after the whole
/// product, in parallel over blocks of rows (multiples of [`ROW_UNIT`] in every case).
///
/// # Safety
/// As [`call`], for the whole `m×n` output.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    beta: f32,
    c: Out,
    then: Option<&(dyn Fn(usize, usize) + Sync)>,
) {
    if m == 0 || n == 0 {
        return;
    }
    let split = Split::of(m, n, k);
    // Every row block packs `b` again, which for a transposed `b` (an input gradient's `Wᵀ`)
    // is a strided gather: one row-major copy first is cheaper (measured: blocks then run at
    // 96–99 % of a whole-product call instead of 86–92 %).
    let b_rows;
    let b = match split {
        Split::Rows(rows) if rows < m && b.strides()[1] != 1 && k > 1 => {
            b_rows = b.as_standard_layout();
            b_rows.view()
        }
        _ => b,
    };
    let (am, bm) = (Mat::of(&a), Mat::of(&b));
    match split {
        Split::Whole => {
            call(m, n, k, alpha, am, bm, beta, c);
            after_all(m, n, then);
        }
        Split::Rows(rows) => {
            (0..m.div_ceil(rows)).into_par_iter().for_each(|t| {
                let (i0, r) = (t * rows, rows.min(m - t * rows));
                // SAFETY: the blocks partition the output's rows.
                unsafe { call(r, n, k, alpha, am.at(i0, 0), bm, beta, c.at(i0, 0)) };
                if let Some(then) = then {
                    then(i0, r);
                }
            });
        }
        Split::Cols(cols) => {
            (0..n.div_ceil(cols)).into_par_iter().for_each(|t| {
                let (j0, w) = (t * cols, cols.min(n - t * cols));
                // SAFETY: the blocks partition the output's columns.
                unsafe { call(m, w, k, alpha, am, bm.at(0, j0), beta, c.at(0, j0)) };
            });
            after_all(m, n, then);
        }
        Split::Inner(depth) => {
            // Every block writes its own partial product; then `c = alpha·Σ_q partial_q +
            // beta·c`, row by row, the partials added in block order.
            let blocks = k.div_ceil(depth);
            let mut partials = Vec::<f32>::with_capacity(blocks * m * n);
            let parts = Out::rows_of(partials.as_mut_ptr(), n);
            (0..blocks).into_par_iter().for_each(|q| {
                let (p0, d) = (q * depth, depth.min(k - q * depth));
                // SAFETY: partial `q` is rows `q·m..(q+1)·m` of `partials` (allocated above;
                // written whole, beta = 0, before anything reads it).
                unsafe {
                    call(
                        m,
                        n,
                        d,
                        1.0,
                        am.at(0, p0),
                        bm.at(p0, 0),
                        0.0,
                        parts.at(q * m, 0),
                    )
                };
            });
            // SAFETY: every partial was written whole.
            partials.set_len(blocks * m * n);
            sum_partials(&partials, m, n, alpha, beta, c);
            after_all(m, n, then);
        }
    }
}

/// `then` over all `m` rows of an `_ × n` output, in parallel over blocks of whole
/// [`ROW_UNIT`]s of rows.
fn after_all(m: usize, n: usize, then: Option<&(dyn Fn(usize, usize) + Sync)>) {
    let Some(then) = then else { return };
    let unit = ROW_UNIT * super::rows_per_task(n * ROW_UNIT);
    (0..m.div_ceil(unit))
        .into_par_iter()
        .for_each(|t| then(t * unit, unit.min(m - t * unit)));
}

/// `c = alpha·Σ_q partials[q] + beta·c` (`partials`: the `m×n` partial products one after
/// the other), in parallel over rows, each element's partials added in block order.
///
/// # Safety
/// `c` describes a writable `m×n` matrix that overlaps nothing else in use.
unsafe fn sum_partials(partials: &[f32], m: usize, n: usize, alpha: f32, beta: f32, c: Out) {
    let blocks = partials.len() / (m * n);
    (0..m)
        .into_par_iter()
        .with_min_len(super::rows_per_task(n * blocks))
        .for_each_init(Vec::new, |acc, i| {
            acc.clear();
            acc.extend_from_slice(&partials[i * n..(i + 1) * n]);
            for q in 1..blocks {
                super::gather::add_assign(&partials[(q * m + i) * n..(q * m + i + 1) * n], acc);
            }
            let row = c.at(i, 0);
            for (j, &v) in acc.iter().enumerate() {
                // SAFETY: element (i, j) of `c`; row `i` is this task's alone.
                unsafe {
                    let ci = row.ptr.offset(j as isize * row.cs);
                    *ci = if beta == 0.0 {
                        alpha * v
                    } else {
                        alpha * v + beta * *ci
                    };
                }
            }
        });
}

/// The kernels the `gemm` crate picks on this CPU (what it checks, at run time).
pub fn kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "AVX2+FMA";
        }
    }
    "portable"
}

/// `c = alpha · a · b + beta · c`, where `a` is `m×k`, `b` is `k×n` and `c` is `m×n`.
///
/// Any operand may be a transposed or strided view. `beta == 0` overwrites `c` (its old
/// contents are not read).
///
/// # Panics
/// If the shapes do not agree (a caller bug, not an input error).
pub fn gemm_into(
    alpha: f32,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    beta: f32,
    mut c: ArrayViewMut2<f32>,
) {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert_eq!(k, k2, "gemm: inner dimensions differ ({m}×{k} · {k2}×{n})");
    assert_eq!(
        c.dim(),
        (m, n),
        "gemm: output shape {:?} != {m}×{n}",
        c.dim()
    );
    let out = Out::of(&mut c);
    // SAFETY: the views describe valid memory of the checked shapes; `c` is borrowed mutably,
    // so it overlaps neither input.
    unsafe { product(m, n, k, alpha, a, b, beta, out, None) }
}

/// `a · b`.
pub fn matmul(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    let (c, _, _) = matmul_onto_bias_relu(None, a, b, None, false, None);
    c
}

/// `aᵀ · b` (e.g. a weight gradient `xᵀ·dy`).
pub fn matmul_tn(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    matmul(a.t(), b)
}

/// `a · bᵀ` (e.g. an input gradient `dy·Wᵀ`).
pub fn matmul_nt(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    matmul(a, b.t())
}

/// `c += aᵀ · b`: accumulate a weight gradient in place.
pub fn add_matmul_tn(a: ArrayView2<f32>, b: ArrayView2<f32>, c: ArrayViewMut2<f32>) {
    gemm_into(1.0, a.t(), b, 1.0, c);
}

/// `c += a · bᵀ` on the first `a.nrows()` rows of `c`.
pub fn add_matmul_nt_rows(a: ArrayView2<f32>, b: ArrayView2<f32>, mut c: ArrayViewMut2<f32>) {
    let m = a.nrows();
    gemm_into(1.0, a, b.t(), 1.0, c.slice_mut(s![..m, ..]));
}

/// The input dropout of the layer that reads a product's output, applied by the product's
/// epilogue ([`matmul_bias_relu_dropout`]): row `i` is masked with seed `seeds[i]` (see
/// [`super::dropout::DropoutMask::fused`]).
#[derive(Clone, Debug)]
pub struct RowDropout {
    pub seeds: Vec<u32>,
    pub keep_below: u32,
    pub scale: f32,
}

impl RowDropout {
    /// Row `i` in the form the row kernels take.
    fn row_hash(&self, i: usize) -> super::bitmask::RowHash {
        super::bitmask::RowHash {
            seed: self.seeds[i],
            keep_below: self.keep_below,
            keep_all: false,
            scale: self.scale,
        }
    }
}

/// [`matmul_bias_relu`], then `dropout` on the result: the third value holds which outputs
/// were kept, bit `i·n + j` (the layout of [`super::dropout::KeptBits`] when `n` is a
/// multiple of 64, which is required). Bitwise what masking the output afterwards gives.
pub fn matmul_bias_relu_dropout(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    bias: Option<&[f32]>,
    relu: bool,
    dropout: &RowDropout,
) -> (Array2<f32>, Option<Vec<u64>>, Vec<u64>) {
    let (c, bits, kept) = matmul_onto_bias_relu(None, a, b, bias, relu, Some(dropout));
    (c, bits, kept.expect("a dropout records its kept bits"))
}

/// `relu(a · b + bias)` (each part optional), and with `relu` the signs of the outputs, bit
/// `i·n + j` of the returned words set where `out[i, j] > 0` (the layout of
/// [`super::activation::Saved::Positive`]). Bitwise the product followed by the separate
/// passes; each block of rows gets them right after its product, while it is in cache.
pub fn matmul_bias_relu(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    bias: Option<&[f32]>,
    relu: bool,
) -> (Array2<f32>, Option<Vec<u64>>) {
    let (c, bits, _) = matmul_onto_bias_relu(None, a, b, bias, relu, None);
    (c, bits)
}

/// What a product does to each block of its output after the block's product: add a bias
/// row, then ReLU recording the signs, then the next layer's input dropout recording the kept
/// elements. The output is standard layout (`n` columns), and the pointers cover it whole.
struct Epilogue<'a> {
    c: *mut f32,
    n: usize,
    bias: Option<&'a [f32]>,
    /// Bit `i·n + j` ← `out[i, j] > 0` (null: no ReLU).
    relu_bits: *mut u64,
    dropout: Option<&'a RowDropout>,
    /// Bit `i·n + j` ← kept (`n` a multiple of 64; null without a dropout).
    kept: *mut u64,
}

// SAFETY: blocks on different threads touch disjoint rows of the output and disjoint words of
// the bit sets (blocks are whole multiples of 64 rows, so `rows·n` bits are whole words).
unsafe impl Send for Epilogue<'_> {}
unsafe impl Sync for Epilogue<'_> {}

impl Epilogue<'_> {
    fn is_none(&self) -> bool {
        self.bias.is_none() && self.relu_bits.is_null() && self.dropout.is_none()
    }

    /// Rows `i0..i0 + rows` of the output.
    ///
    /// # Safety
    /// The rows are final and no other thread touches them; `i0` is a multiple of
    /// [`ROW_UNIT`].
    unsafe fn rows(&self, i0: usize, rows: usize) {
        let n = self.n;
        if self.is_none() || n == 0 {
            return;
        }
        let block = std::slice::from_raw_parts_mut(self.c.add(i0 * n), rows * n);
        if let Some(bias) = self.bias {
            for row in block.chunks_exact_mut(n) {
                super::gather::add_assign(bias, row);
            }
        }
        if !self.relu_bits.is_null() {
            // Bits `i0·n..` start on a word (`i0` is a multiple of 64).
            let bits = std::slice::from_raw_parts_mut(
                self.relu_bits.add(i0 * n / 64),
                (rows * n).div_ceil(64),
            );
            super::activation::relu_save(block, bits);
        }
        if let Some(d) = self.dropout {
            let words = n / 64;
            let kept = std::slice::from_raw_parts_mut(self.kept.add(i0 * words), rows * words);
            for (r, (row, bits)) in block
                .chunks_exact_mut(n)
                .zip(kept.chunks_exact_mut(words))
                .enumerate()
            {
                super::dropout::mask_row_recorded(d.row_hash(i0 + r), row, bits);
            }
        }
    }
}

/// [`matmul_bias_relu`], with [`matmul_bias_relu_dropout`]'s dropout when given, of
/// `onto + a·b` when `onto` is given (the product adds onto it before the epilogue).
pub fn matmul_onto_bias_relu(
    onto: Option<Array2<f32>>,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    bias: Option<&[f32]>,
    relu: bool,
    dropout: Option<&RowDropout>,
) -> (Array2<f32>, Option<Vec<u64>>, Option<Vec<u64>>) {
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
    assert_eq!(
        k,
        b.nrows(),
        "gemm: inner dimensions differ ({m}×{k} · {}×{n})",
        b.nrows()
    );
    if let Some(bias) = bias {
        assert_eq!(bias.len(), n, "gemm: bias length");
    }
    if let Some(c) = &onto {
        assert_eq!(
            c.dim(),
            (m, n),
            "gemm: the output to add onto has the product's shape"
        );
    }
    let mut kept = dropout.map(|d| {
        assert_eq!(d.seeds.len(), m, "gemm: one dropout seed per row");
        assert!(
            n.is_multiple_of(64),
            "gemm: fused dropout needs whole 64-bit words per row"
        );
        vec![0u64; m * n / 64]
    });
    let mut bits = relu.then(|| vec![0u64; (m * n).div_ceil(64)]);
    let relu_bits = bits
        .as_mut()
        .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr());
    let kept_bits = kept
        .as_mut()
        .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr());
    // The product into `c` (adding onto it with beta = 1), each block of rows then getting the
    // epilogue.
    let run = |c: *mut f32, beta: f32| {
        let epi = Epilogue {
            c,
            n,
            bias,
            relu_bits,
            dropout,
            kept: kept_bits,
        };
        let then = |i0: usize, rows: usize| {
            // SAFETY: rows `i0..i0 + rows` are final and this block's alone.
            unsafe { epi.rows(i0, rows) }
        };
        let then: Option<&(dyn Fn(usize, usize) + Sync)> = (!epi.is_none()).then_some(&then);
        // SAFETY: `c` is a standard-layout m×n matrix owned by the caller, overlapping
        // neither input; the epilogue's pointers cover it and its bit sets whole.
        unsafe { product(m, n, k, 1.0, a, b, beta, Out::rows_of(c, n), then) }
    };
    let c = match onto {
        Some(c) => {
            let mut c = if c.is_standard_layout() {
                c
            } else {
                c.as_standard_layout().into_owned()
            };
            run(c.as_mut_ptr(), 1.0);
            c
        }
        None => {
            // The product writes every element before anything reads it (beta = 0), so a
            // fresh output needs no zero-filling pass.
            let mut c = Array2::<f32>::uninit((m, n));
            run(c.as_mut_ptr().cast::<f32>(), 0.0);
            // SAFETY: every element was written (beta = 0 writes the whole output).
            unsafe { c.assume_init() }
        }
    };
    (c, bits, kept)
}

/// `a·b` into `out`, a standard-layout `a.nrows() × b.ncols()` block, by one call on this
/// thread: for callers that split the work among threads themselves
/// ([`super::sparse_rows`]'s dense chunks).
///
/// # Panics
/// If the shapes do not agree.
pub(crate) fn product_on_this_thread(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    out: &mut [std::mem::MaybeUninit<f32>],
) {
    let ((m, k), n) = (a.dim(), b.ncols());
    assert_eq!(k, b.nrows(), "gemm: inner dimensions differ");
    assert_eq!(out.len(), m * n, "gemm: output block size");
    if m == 0 || n == 0 {
        return;
    }
    let c = Out::rows_of(out.as_mut_ptr().cast::<f32>(), n);
    // SAFETY: `out` is exactly the m×n block (checked), borrowed mutably, so it overlaps
    // neither input; beta = 0 writes every element without reading any.
    unsafe { call(m, n, k, 1.0, Mat::of(&a), Mat::of(&b), 0.0, c) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    use crate::backend::cpu::pseudo_matrix as pseudo;

    fn naive(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
        let mut c = Array2::zeros((a.nrows(), b.ncols()));
        for i in 0..a.nrows() {
            for j in 0..b.ncols() {
                let mut s = 0f64;
                for k in 0..a.ncols() {
                    s += a[[i, k]] as f64 * b[[k, j]] as f64;
                }
                c[[i, j]] = s as f32;
            }
        }
        c
    }

    fn assert_close(x: &Array2<f32>, y: &Array2<f32>) {
        assert_eq!(x.dim(), y.dim());
        for (a, b) in x.iter().zip(y.iter()) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    /// The shapes below cover every split.
    #[test]
    fn splits_depend_on_the_shape() {
        assert_eq!(Split::of(5, 3, 4), Split::Whole);
        assert_eq!(Split::of(1300, 90, 70), Split::Rows(704));
        assert_eq!(Split::of(5197, 256, 512), Split::Rows(256));
        assert_eq!(Split::of(112_777, 256, 256), Split::Rows(256));
        assert_eq!(Split::of(112_777, 16, 256), Split::Rows(1024));
        assert_eq!(Split::of(40, 3000, 256), Split::Cols(448));
        assert_eq!(Split::of(256, 256, 9000), Split::Inner(4544));
        assert_eq!(Split::of(256, 256, 112_777), Split::Inner(7104));
    }

    #[test]
    fn products_match_naive_on_parallel_shapes() {
        // Shapes split into row blocks, column blocks, reduction blocks, and not split.
        for &(m, k, n) in &[
            (1300, 70, 90),
            (33, 200, 700),
            (20, 9000, 30),
            (5, 3, 4),
            (0, 4, 3),
        ] {
            let a = pseudo(m, k, 1);
            let b = pseudo(k, n, 2);
            assert_close(&matmul(a.view(), b.view()), &naive(a.view(), b.view()));
            let at = a.t().to_owned();
            assert_close(&matmul_tn(at.view(), b.view()), &naive(a.view(), b.view()));
            let bt = b.t().to_owned();
            assert_close(&matmul_nt(a.view(), bt.view()), &naive(a.view(), b.view()));
        }
    }

    #[test]
    fn tails_splits_and_beta_match_naive() {
        // Row / column / inner splits with ragged last blocks, transposed operands, and a
        // general beta.
        for &(m, k, n) in &[
            (1, 1, 1),
            (13, 7, 33),
            (25, 300, 65),
            (300, 5000, 40),
            (5, 9000, 3),
            (1100, 256, 256),
            (40, 256, 3000),
            (30, 9000, 300),
            (7, 0, 9),
        ] {
            let a = pseudo(m, k, 11);
            let b = pseudo(k, n, 12);
            let c0 = pseudo(m, n, 13);
            let mut c = c0.clone();
            gemm_into(0.5, a.view(), b.view(), -2.0, c.view_mut());
            let expect = naive(a.view(), b.view()) * 0.5 - &c0 * 2.0;
            assert_close(&c, &expect);
            let at = a.t().to_owned();
            let bt = b.t().to_owned();
            let mut c = Array2::from_elem((m, n), f32::NAN);
            gemm_into(1.0, at.t(), bt.t(), 0.0, c.view_mut());
            assert_close(&c, &naive(a.view(), b.view()));
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let shapes = [
            (1100, 256, 256),
            (256, 9000, 256),
            (40, 256, 3000),
            (10, 5000, 256),
        ];
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                shapes
                    .iter()
                    .map(|&(m, k, n)| {
                        let a = pseudo(m, k, 21);
                        let b = pseudo(k, n, 22);
                        let mut c = pseudo(m, n, 23);
                        gemm_into(1.0, a.view(), b.view(), 1.0, c.view_mut());
                        c
                    })
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(run(1), run(3));
    }

    #[test]
    fn accumulating_forms_add_to_the_output() {
        let a = pseudo(200, 50, 3);
        let b = pseudo(200, 40, 4);
        let mut c = Array2::from_elem((50, 40), 1.0f32);
        add_matmul_tn(a.view(), b.view(), c.view_mut());
        let expect = naive(a.t(), b.view()) + 1.0;
        assert_close(&c, &expect);
        let w = pseudo(60, 40, 5);
        let mut d = Array2::from_elem((250, 60), 2.0f32);
        add_matmul_nt_rows(b.view(), w.view(), d.view_mut());
        let prod = naive(b.view(), w.t());
        for i in 0..250 {
            for j in 0..60 {
                let e = if i < 200 { prod[[i, j]] + 2.0 } else { 2.0 };
                assert!((d[[i, j]] - e).abs() <= 1e-4 * (1.0 + e.abs()));
            }
        }
    }
    /// The next layer's dropout applied by the product's epilogue (row blocks, a split
    /// reduction, column blocks, one call, and a reversed view) gives bitwise the masked
    /// output and the same kept bits as masking afterwards with the same row keys.
    #[test]
    fn fused_dropout_matches_masking_afterwards() {
        use crate::backend::cpu::dropout::DropoutMask;
        let mask = DropoutMask::new(17, 0.4);
        for &(m, k, n) in &[
            (50, 40, 64),
            (1300, 70, 128),
            (30, 9000, 64),
            (40, 300, 640),
            (7, 3, 192),
        ] {
            let a = pseudo(m, k, 21) - 0.5;
            let b = pseudo(k, n, 22) - 0.5;
            let bias: Vec<f32> = (0..n).map(|j| (j as f32 * 0.37).sin() * 0.1).collect();
            let keys: Vec<u64> = (0..m as u64).map(|i| i * 31 + 5).collect();
            let d = mask.fused(&keys).expect("p > 0");
            let reversed = a.slice(s![..;-1, ..]).to_owned();
            for (case, a) in [
                ("forward", a.view()),
                ("reversed", reversed.slice(s![..;-1, ..])),
            ] {
                let (z, bits, kept) = matmul_bias_relu_dropout(a, b.view(), Some(&bias), true, &d);
                let (mut want, want_bits) = matmul_bias_relu(a, b.view(), Some(&bias), true);
                let want_kept = mask.apply_recorded_in_place(want.view_mut(), &keys);
                assert_eq!(bits, want_bits, "{case} {m}x{k}x{n}: relu bits");
                assert_eq!(z, want, "{case} {m}x{k}x{n}: values");
                let got = crate::backend::cpu::dropout::KeptBits::from_product(m, n, &mask, kept);
                let mut g1 = pseudo(m, n, 23);
                let mut g2 = g1.clone();
                got.apply_in_place(g1.view_mut());
                want_kept.apply_in_place(g2.view_mut());
                assert_eq!(g1, g2, "{case} {m}x{k}x{n}: kept bits");
            }
        }
    }

    /// The bias and ReLU of the epilogue give what a product followed by the separate passes
    /// gives: row blocks (with widths that are and are not whole bit words), a split
    /// reduction, column blocks, and one call.
    #[test]
    fn fused_bias_relu_matches_separate_passes() {
        for (m, k, n) in [
            (1500, 300, 64),
            (1400, 40, 96),
            (32, 9000, 64),
            (300, 50, 40),
            (2000, 3, 64),
            (100, 300, 700),
            (5000, 300, 2),
        ] {
            let a = pseudo(m, k, 1);
            let b = pseudo(k, n, 2);
            let bias: Vec<f32> = (0..n).map(|j| (j as f32 * 0.37).sin() * 0.1).collect();
            let mut expect = matmul(a.view(), b.view());
            for mut row in expect.rows_mut() {
                for (v, &bj) in row.iter_mut().zip(&bias) {
                    *v += bj;
                }
            }
            let (only_bias, none) = matmul_bias_relu(a.view(), b.view(), Some(&bias), false);
            assert!(none.is_none());
            assert_eq!(only_bias, expect, "{m}x{k}x{n} bias");
            let (out, bits) = matmul_bias_relu(a.view(), b.view(), Some(&bias), true);
            let bits = bits.expect("ReLU bits");
            for i in 0..m {
                for j in 0..n {
                    let e = expect[[i, j]];
                    assert_eq!(out[[i, j]], e.max(0.0), "{m}x{k}x{n} at ({i}, {j})");
                    let bit = (bits[(i * n + j) / 64] >> ((i * n + j) % 64)) & 1 == 1;
                    assert_eq!(bit, e > 0.0, "{m}x{k}x{n} bit ({i}, {j})");
                }
            }
        }
    }
}
