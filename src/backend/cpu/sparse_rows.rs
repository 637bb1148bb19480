//! `a · b` for an `a` whose rows are mostly zeros, skipping the zeros.
//!
//! The input gradient of a hidden layer, `dz · Wᵀ`, has such an `a`: `dz` is zero wherever
//! the layer's ReLU was off or the next layer's dropout dropped the output, three quarters of
//! it at dropout 0.5. Rows of `a` are taken in chunks; each chunk lists its rows' non-zeros
//! and, when they are few enough, multiplies only those with a packed `b` (an AVX2 kernel
//! over three rows and one 32-column panel of `b` at a time, the panel's 32 KiB read from L1
//! and L2, each listed term feeding four FMAs); a denser chunk runs the dense product
//! ([`super::gemm`]) instead.
//!
//! Measured against the dense product (the `gemm` crate's AVX-512 kernels) on the input
//! gradients of the hidden layers of `benchmarks/gemm.sh`'s steps (a quarter non-zero):
//! 0.53–0.70 of its time, on an AVX-512 CPU too, 13–25 % of a Tolokers or Facebook step's
//! GEMM time (`benchmarks/results/gemm.md`). The forward's `h_dst · W_self` below another
//! layer has as many zeros, but skipping them there gained 3–13 % on the product (it must add
//! the other half onto the listed one), under the 15 % that would be worth the split.
//!
//! Each output element is the fused multiply-add chain over its row's non-zero terms in
//! increasing `k`: the dense product within rounding (it adds the same terms, and exact
//! zeros, in its own order; for finite `b`: a dense product turns `0·∞` into NaN where this
//! one skips the term), and a function of the data only, never of the thread count.

use ndarray::{s, Array2, ArrayView2};

use super::gemm::matmul;

/// Longest reduction the listed kernel takes: a panel of `b` is `k × 32` floats, 32 KiB at
/// 256 (hidden 256, where it was measured), read once per group of three rows from L1.
pub const MAX_INNER: usize = 256;

/// `a · b`, skipping the zeros of `a` where its rows are mostly zeros; [`matmul`]`(a, b)`
/// within rounding.
pub fn matmul_mostly_zero_rows(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    product(a, b, true).0
}

/// The product and how many row chunks skipped zeros; `list` false is the dense product.
fn product(a: ArrayView2<f32>, b: ArrayView2<f32>, list: bool) -> (Array2<f32>, usize) {
    #[cfg(target_arch = "x86_64")]
    if list {
        if let Some(done) = kernel::product(a, b) {
            return done;
        }
    }
    (matmul(a, b), 0)
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rayon::prelude::*;

    use super::*;

    /// Rows per task: one list-building pass and one sweep over `b` each.
    const CHUNK: usize = 64;
    /// Rows the kernel interleaves: three rows × four accumulators (32 columns) keep twelve
    /// FMA chains going, and each listed term feeds four FMAs.
    const GROUP: usize = 3;
    /// Columns of a slice of the packed `b` (a panel is two slices).
    const SLICE: usize = 16;
    /// Columns of a panel of the packed `b`: the kernel's four 8-float accumulators per row.
    const PANEL: usize = 2 * SLICE;
    /// A chunk denser than this runs the dense kernel (a listed term costs about twice a
    /// dense one).
    const MAX_DENSITY: f64 = 0.5;
    /// Below this many multiply-adds the dense product is used (lists would not pay).
    const MIN_FLOPS: usize = 1 << 20;

    /// The non-zeros of one chunk of rows: row `r`'s list at `r·stride` of `offsets` (where
    /// each term's row of `b` starts in a packed slice) and `values`, padded with zero terms
    /// `(0, 0.0)` to the longest list of its group of [`GROUP`] rows, which the kernel walks
    /// in step.
    #[derive(Default)]
    struct ChunkLists {
        offsets: Vec<u32>,
        values: Vec<f32>,
        stride: usize,
        /// Steps of each group (its longest list).
        steps: Vec<usize>,
    }

    impl ChunkLists {
        /// List the non-zeros of `a` (row-major rows); returns the fraction of non-zeros.
        ///
        /// # Safety
        /// AVX2.
        #[target_feature(enable = "avx2,popcnt")]
        unsafe fn build(&mut self, a: ArrayView2<f32>) -> f64 {
            let (rows, k) = a.dim();
            // Room for a whole vector written past the last term.
            self.stride = k + 8;
            let groups = rows.div_ceil(GROUP);
            self.offsets.resize(groups * GROUP * self.stride, 0);
            self.values.resize(groups * GROUP * self.stride, 0.0);
            self.steps.clear();
            let mut nonzeros = 0;
            for g in 0..groups {
                let mut lens = [0usize; GROUP];
                for (r, len) in lens.iter_mut().enumerate() {
                    let at = (g * GROUP + r) * self.stride;
                    if g * GROUP + r < rows {
                        let row = a.row(g * GROUP + r);
                        let row = row.as_slice().expect("row-major rows");
                        *len = compress(row, &mut self.offsets[at..], &mut self.values[at..]);
                    }
                }
                nonzeros += lens.iter().sum::<usize>();
                let steps = lens.iter().copied().max().unwrap_or(0);
                for (r, &len) in lens.iter().enumerate() {
                    let at = (g * GROUP + r) * self.stride;
                    self.offsets[at + len..at + steps].fill(0);
                    self.values[at + len..at + steps].fill(0.0);
                }
                self.steps.push(steps);
            }
            nonzeros as f64 / (rows * k).max(1) as f64
        }
    }

    /// Lane indices that move the lanes set in an 8-bit mask to the front, in order.
    static COMPRESS: [[u32; 8]; 256] = compress_table();

    const fn compress_table() -> [[u32; 8]; 256] {
        let mut table = [[0u32; 8]; 256];
        let mut mask = 0;
        while mask < 256 {
            let (mut n, mut lane) = (0, 0);
            while lane < 8 {
                if mask & (1 << lane) != 0 {
                    table[mask][n] = lane as u32;
                    n += 1;
                }
                lane += 1;
            }
            mask += 1;
        }
        table
    }

    /// Write the non-zeros of `row` (NaN counts as non-zero) to the front of `offsets` (as
    /// offsets `SLICE·j` into a packed slice) and `values`, which have room for `row.len() + 8`;
    /// returns how many.
    #[inline(always)]
    unsafe fn compress(row: &[f32], offsets: &mut [u32], values: &mut [f32]) -> usize {
        debug_assert!(offsets.len() >= row.len() + 8 && values.len() >= row.len() + 8);
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let step = _mm256_set1_epi32(SLICE as i32);
        let mut len = 0;
        let body = row.len() / 8 * 8;
        for j in (0..body).step_by(8) {
            let v = _mm256_loadu_ps(row.as_ptr().add(j));
            let mask = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(v, _mm256_setzero_ps()));
            let perm = _mm256_loadu_si256(COMPRESS[mask as usize].as_ptr().cast());
            let cols = _mm256_add_epi32(_mm256_set1_epi32(j as i32), lanes);
            let offs = _mm256_mullo_epi32(cols, step);
            _mm256_storeu_ps(
                values.as_mut_ptr().add(len),
                _mm256_permutevar8x32_ps(v, perm),
            );
            _mm256_storeu_si256(
                offsets.as_mut_ptr().add(len).cast(),
                _mm256_permutevar8x32_epi32(offs, perm),
            );
            len += mask.count_ones() as usize;
        }
        for (j, &v) in row.iter().enumerate().skip(body) {
            offsets[len] = (j * SLICE) as u32;
            values[len] = v;
            len += (v != 0.0 || v.is_nan()) as usize;
        }
        len
    }

    /// Whether the listed kernel applies to an `m × k` by `k × n` product: AVX2 and FMA, a
    /// reduction within [`MAX_INNER`], at least a slice of columns, a chunk of rows, and enough
    /// work.
    pub(super) fn applies(m: usize, k: usize, n: usize) -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && (1..=MAX_INNER).contains(&k)
            && n >= SLICE
            && m >= CHUNK
            && m * n * k >= MIN_FLOPS
    }

    /// [`applies`] to `a` times a `_ × n` matrix, for row-major rows of `a`, a sample of which
    /// is mostly zeros.
    fn lists(a: &ArrayView2<f32>, n: usize) -> bool {
        let (m, k) = a.dim();
        applies(m, k, n) && (a.strides()[1] == 1 || k == 1) && sample_is_sparse(a)
    }

    /// Whether at most [`MAX_DENSITY`] of a sample of `a`'s rows is non-zero (NaN counts as
    /// non-zero): every `step`-th row, `step` fixed by the shape so that at most about 256
    /// rows are read. A dense `a` (an output layer's gradient) then goes to the dense product
    /// at once instead of listing every chunk first.
    fn sample_is_sparse(a: &ArrayView2<f32>) -> bool {
        let m = a.nrows();
        let (mut nonzero, mut all) = (0usize, 0usize);
        for i in (0..m).step_by((m / 256).max(1)) {
            let row = a.row(i);
            nonzero += row.iter().filter(|&&v| v != 0.0).count();
            all += row.len();
        }
        nonzero as f64 <= MAX_DENSITY * all as f64
    }

    /// `b` (`k × n`, any strides) in [`PANEL`]-column panels of `k` rows: panel `p` holds the
    /// slice of columns `32p..32p + 16` (`k` rows of 16 contiguous floats), then the slice
    /// `32p + 16..32p + 32`, columns past `n` zero. Slices are 64-byte aligned, so the kernel's
    /// aligned loads never straddle a cache line.
    struct Panels {
        buf: Vec<f32>,
        skip: usize,
        k: usize,
    }

    impl Panels {
        fn pack(b: ArrayView2<f32>) -> Panels {
            let (k, n) = b.dim();
            let panels = n.div_ceil(PANEL);
            let len = panels * PANEL * k;
            let mut buf = vec![0f32; len + 16];
            let skip = buf.as_ptr().align_offset(64).min(15);
            buf[skip..skip + len]
                .par_chunks_mut(PANEL * k)
                .enumerate()
                .for_each(|(p, panel)| {
                    for (h, slice) in panel.chunks_exact_mut(SLICE * k).enumerate() {
                        let j0 = p * PANEL + h * SLICE;
                        let cols = SLICE.min(n.saturating_sub(j0));
                        for (row, out) in slice.chunks_exact_mut(SLICE).enumerate() {
                            for (c, v) in out.iter_mut().enumerate().take(cols) {
                                *v = b[[row, j0 + c]];
                            }
                        }
                    }
                });
            Panels { buf, skip, k }
        }

        /// The start of panel `p` (its first slice; the second follows at `SLICE·k`).
        fn panel(&self, p: usize) -> *const f32 {
            self.buf[self.skip + p * PANEL * self.k..].as_ptr()
        }
    }

    /// Rows `rows` × `cols` of the output at `ptr`, row stride `rs` (unit column stride).
    #[derive(Clone, Copy)]
    struct Tile {
        ptr: *mut f32,
        rows: usize,
        cols: usize,
        rs: isize,
    }

    /// A pointer that may cross to rayon workers (each writes its own rows).
    #[derive(Clone, Copy)]
    struct Out(*mut f32);
    // SAFETY: tasks write disjoint row ranges of the output.
    unsafe impl Send for Out {}
    unsafe impl Sync for Out {}

    impl Out {
        /// Element `i` (a method, so that closures capture the `Send` wrapper, not the
        /// pointer).
        ///
        /// # Safety
        /// In bounds of the output.
        unsafe fn at(self, i: usize) -> *mut f32 {
            self.0.add(i)
        }
    }

    pub(super) fn product(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Option<(Array2<f32>, usize)> {
        if !lists(&a, b.ncols()) {
            return None;
        }
        let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
        let packed = Panels::pack(b);
        // Dense chunks each pack `b` again: row-major, that is a copy rather than a strided
        // gather (an input gradient's `b` is a transposed `W`).
        let b = b.as_standard_layout();
        let b = b.view();
        let mut c = Array2::<f32>::uninit((m, n));
        let out = Out(c.as_mut_ptr().cast::<f32>());
        let sparse_chunks = AtomicUsize::new(0);
        let packed = &packed;
        (0..m.div_ceil(CHUNK))
            .into_par_iter()
            .for_each_init(ChunkLists::default, |lists, t| {
                let i0 = t * CHUNK;
                let rows = CHUNK.min(m - i0);
                let chunk = a.slice(s![i0..i0 + rows, ..]);
                // SAFETY: rows i0..i0 + rows of the m×n output, this task's alone.
                let tile_ptr = unsafe { out.at(i0 * n) };
                // SAFETY: AVX2 is present (`lists`).
                if unsafe { lists.build(chunk) } <= MAX_DENSITY {
                    sparse_chunks.fetch_add(1, Ordering::Relaxed);
                    let tile = Tile {
                        ptr: tile_ptr,
                        rows,
                        cols: n,
                        rs: n as isize,
                    };
                    // SAFETY: AVX2 and FMA are present (`lists`); `packed` holds `b` and
                    // `tile` the chunk's rows.
                    unsafe { listed_chunk(lists, packed, k, tile) };
                } else {
                    // SAFETY: the chunk's rows of the output, written whole here.
                    let rows_out = unsafe {
                        std::slice::from_raw_parts_mut(
                            tile_ptr.cast::<MaybeUninit<f32>>(),
                            rows * n,
                        )
                    };
                    super::super::gemm::product_on_this_thread(chunk, b, rows_out);
                }
            });
        // SAFETY: every row chunk was written whole, by one kernel or the other.
        let c = unsafe { c.assume_init() };
        Some((c, sparse_chunks.into_inner()))
    }

    /// The chunk's rows of the product, from its lists, one 16-column slice of `b` at a time.
    ///
    /// # Safety
    /// AVX2 and FMA; `packed` holds the `k × tile.cols` matrix `b`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn listed_chunk(lists: &ChunkLists, packed: &Panels, k: usize, tile: Tile) {
        for j0 in (0..tile.cols).step_by(PANEL) {
            // Panel j0/32: two slices of `k` rows of 16 floats, one after the other (the
            // padding columns of a partial panel are zeros).
            let slices = packed.panel(j0 / PANEL);
            let cols = PANEL.min(tile.cols - j0);
            for (g, &steps) in lists.steps.iter().enumerate() {
                let at = g * GROUP * lists.stride;
                let acc = group(
                    steps,
                    lists.offsets.as_ptr().add(at),
                    lists.values.as_ptr().add(at),
                    lists.stride,
                    [slices, slices.add(SLICE * k)],
                );
                let rows = GROUP.min(tile.rows - g * GROUP);
                store(
                    &acc,
                    tile.ptr.add(g * GROUP * tile.rs as usize + j0),
                    tile.rs,
                    rows,
                    cols,
                );
            }
        }
    }

    /// Three rows' sums over `steps` listed terms against the two slices of a panel of `b`
    /// (row `r`'s terms at `r·stride` of `offsets` and `values`).
    #[inline(always)]
    unsafe fn group(
        steps: usize,
        offsets: *const u32,
        values: *const f32,
        stride: usize,
        slices: [*const f32; 2],
    ) -> [[__m256; 4]; GROUP] {
        let mut acc = [[_mm256_setzero_ps(); 4]; GROUP];
        for t in 0..steps {
            for (r, row) in acc.iter_mut().enumerate() {
                let off = *offsets.add(r * stride + t) as usize;
                let v = _mm256_broadcast_ss(&*values.add(r * stride + t));
                let (b0, b1) = (slices[0].add(off), slices[1].add(off));
                row[0] = _mm256_fmadd_ps(v, _mm256_load_ps(b0), row[0]);
                row[1] = _mm256_fmadd_ps(v, _mm256_load_ps(b0.add(8)), row[1]);
                row[2] = _mm256_fmadd_ps(v, _mm256_load_ps(b1), row[2]);
                row[3] = _mm256_fmadd_ps(v, _mm256_load_ps(b1.add(8)), row[3]);
            }
        }
        acc
    }

    /// Store `rows` rows of `cols` (≤ 32) columns of the group's sums at `out`.
    #[inline(always)]
    unsafe fn store(
        acc: &[[__m256; 4]; GROUP],
        out: *mut f32,
        rs: isize,
        rows: usize,
        cols: usize,
    ) {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (r, row) in acc.iter().enumerate().take(rows) {
            let dst = out.offset(r as isize * rs);
            for (h, &v) in row.iter().enumerate() {
                let n = cols.saturating_sub(8 * h).min(8);
                if n == 8 {
                    _mm256_storeu_ps(dst.add(8 * h), v);
                } else if n > 0 {
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
                    _mm256_maskstore_ps(dst.add(8 * h), mask, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::pseudo_matrix as pseudo;

    /// `a` with about `keep` of its entries non-zero (exact zeros elsewhere, as a ReLU and a
    /// dropout leave them).
    fn mostly_zero(m: usize, k: usize, keep: f32, salt: u64) -> Array2<f32> {
        let mut a = pseudo(m, k, salt);
        let pick = pseudo(m, k, salt + 1);
        a.zip_mut_with(&pick, |v, &p| {
            if p + 0.5 >= keep {
                *v = 0.0;
            }
        });
        a
    }

    /// `a·b` in f64.
    fn reference(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f64> {
        a.mapv(f64::from).dot(&b.mapv(f64::from))
    }

    /// Every element within float rounding of the f64 product.
    fn assert_close(c: &Array2<f32>, r: &Array2<f64>, what: &str) {
        assert_eq!(c.dim(), r.dim(), "{what}");
        for (&x, &y) in c.iter().zip(r) {
            assert!(
                (x as f64 - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{what}: {x} vs {y}"
            );
        }
    }

    fn listing_here() -> bool {
        #[cfg(target_arch = "x86_64")]
        let here = kernel::applies(1024, 256, 256);
        #[cfg(not(target_arch = "x86_64"))]
        let here = false;
        if !here {
            crate::util::skip::skipped(
                crate::util::skip::SkipKind::Other,
                "sparse_rows listing",
                "no AVX2 + FMA on this CPU",
            );
        }
        here
    }

    /// Sparse chunks, dense chunks and both in one product, tails of rows and columns, a
    /// transposed `b` (an input gradient's `Wᵀ`): the product within rounding, the chunks
    /// listed where they are sparse, and the same bits on 1 and 3 threads.
    #[test]
    fn listed_products_are_the_product() {
        if !listing_here() {
            return;
        }
        for &(m, k, n, keep) in &[
            (5200, 256, 512, 0.25),
            (130, 256, 40, 0.25),
            (257, 200, 33, 0.1),
            (200, 64, 512, 0.9),
            (64, 256, 256, 0.0),
        ] {
            let a = mostly_zero(m, k, keep, 3);
            let w = pseudo(n, k, 4);
            let what = format!("{m}×{k}×{n} at {keep}");
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| product(a.view(), w.t(), true))
            };
            let (listed, sparse_chunks) = run(1);
            assert_close(&listed, &reference(a.view(), w.t()), &what);
            let expect = if keep <= 0.25 { m.div_ceil(64) } else { 0 };
            assert_eq!(sparse_chunks, expect, "{what}");
            assert_eq!(listed, run(3).0, "{what}: thread count");
        }
        // A quarter of the rows dense: both kernels in one product.
        let mut a = mostly_zero(512, 256, 0.2, 5);
        a.slice_mut(s![384.., ..]).assign(&pseudo(128, 256, 6));
        let w = pseudo(300, 256, 7);
        let (listed, sparse_chunks) = product(a.view(), w.t(), true);
        assert_close(&listed, &reference(a.view(), w.t()), "a quarter dense");
        assert_eq!(sparse_chunks, 6);
        // A dense `a` is not listed at all.
        let a = pseudo(512, 256, 8);
        let (dense, sparse_chunks) = product(a.view(), w.t(), true);
        assert_eq!(sparse_chunks, 0);
        assert_close(&dense, &reference(a.view(), w.t()), "dense");
    }
}
