//! Matrix products on `f32`, parallel over tiles of the output.
//!
//! On CPUs with AVX-512 or AVX2 + FMA the product is cut into tiles (blocks of rows, of
//! columns when the output has few rows, and of the inner dimension when the output is small
//! and the reduction long, as for weight gradients `xᵀ·dy`), and each tile runs the packed
//! kernel of [`super::sgemm`] on a rayon worker. Tile boundaries depend only on the shape,
//! inner-dimension partial products are added in block order, and the kernel computes each
//! element the same way in any tile, so the result is bitwise the same for any number of
//! threads.
//!
//! Elsewhere (or for an output without unit column stride) the same row / column split runs
//! `ndarray`'s `general_mat_mul` (matrixmultiply) per block.
//!
//! Transposed operands are passed as transposed views (`a.t()`): both paths pack arbitrary
//! strides, so no copy is made.

use std::cell::RefCell;

use ndarray::linalg::general_mat_mul;
use ndarray::parallel::prelude::*;
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis};
use rayon::slice::ParallelSliceMut;

/// Below this many multiply-adds a product runs on the calling thread.
const SERIAL_FLOPS: usize = 1 << 20;
/// Multiply-adds per parallel task.
const FLOPS_PER_TASK: usize = 1 << 24;
/// Fewest output rows (or columns) per task: every task packs its own copy of the other
/// operand, so thin blocks would spend more time packing than multiplying.
const MIN_BLOCK: usize = 256;
/// Fewest reduction steps per task when the inner dimension is split.
const MIN_INNER_BLOCK: usize = 1024;
/// Most tasks per product (more only adds packing work).
const MAX_TASKS: usize = 16;
/// Block sizes are multiples of this, matching matrixmultiply's micro-kernel tiles.
const TILE: usize = 16;

/// Size of the blocks that split a dimension of length `len` for a product of `flops`
/// multiply-adds, or `None` when it should not be split. A function of the shape only.
fn block_size(len: usize, flops: usize, min_block: usize) -> Option<usize> {
    if len < 2 * min_block {
        return None;
    }
    let tasks = flops.div_ceil(FLOPS_PER_TASK).clamp(2, MAX_TASKS);
    Some(len.div_ceil(tasks).max(min_block).next_multiple_of(TILE))
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
    if m * n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: `c = beta·c` (zeros for `beta == 0`, whatever `c` held).
        if beta == 0.0 {
            c.fill(0.0);
        } else {
            c.mapv_inplace(|v| v * beta);
        }
        return;
    }
    if super::skinny::try_gemm(alpha, &a, &b, beta, &mut c) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if fast::usable(&a, &b, &c) {
        fast::gemm(alpha, a, b, beta, c);
        return;
    }
    portable_gemm(alpha, a, b, beta, c);
}

/// The matrixmultiply path: blocks of rows, columns or inner steps on rayon workers.
fn portable_gemm(
    alpha: f32,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    beta: f32,
    mut c: ArrayViewMut2<f32>,
) {
    let (m, k) = a.dim();
    let n = b.ncols();
    let flops = m * n * k;
    if flops <= SERIAL_FLOPS {
        general_mat_mul(alpha, &a, &b, beta, &mut c);
        return;
    }
    if let Some(rows) = block_size(m, flops, MIN_BLOCK) {
        c.axis_chunks_iter_mut(Axis(0), rows)
            .into_par_iter()
            .zip(a.axis_chunks_iter(Axis(0), rows).into_par_iter())
            .for_each(|(mut c_blk, a_blk)| general_mat_mul(alpha, &a_blk, &b, beta, &mut c_blk));
    } else if let Some(cols) = block_size(n, flops, MIN_BLOCK) {
        c.axis_chunks_iter_mut(Axis(1), cols)
            .into_par_iter()
            .zip(b.axis_chunks_iter(Axis(1), cols).into_par_iter())
            .for_each(|(mut c_blk, b_blk)| general_mat_mul(alpha, &a, &b_blk, beta, &mut c_blk));
    } else if let Some(inner) = block_size(k, flops, MIN_INNER_BLOCK) {
        // A small output with a long reduction (a weight gradient `xᵀ·dy` over many rows):
        // partial products over fixed blocks of the inner dimension, added in block order.
        let partials: Vec<Array2<f32>> = a
            .axis_chunks_iter(Axis(1), inner)
            .into_par_iter()
            .zip(b.axis_chunks_iter(Axis(0), inner).into_par_iter())
            .map(|(a_blk, b_blk)| {
                let mut p = Array2::zeros((m, n));
                general_mat_mul(1.0, &a_blk, &b_blk, 0.0, &mut p);
                p
            })
            .collect();
        let mut sum = partials[0].clone();
        for p in &partials[1..] {
            sum += p;
        }
        c.zip_mut_with(&sum, |ci, &si| *ci = alpha * si + beta * *ci);
    } else {
        general_mat_mul(alpha, &a, &b, beta, &mut c);
    }
}

/// The packed path: a fixed tiling of the product into tasks for [`super::sgemm`].
#[cfg(target_arch = "x86_64")]
mod fast {
    use super::*;
    use crate::backend::cpu::gather::add_assign;
    use crate::backend::cpu::sgemm::{
        self, BSource, Epilogue, Isa, MatMut, MatRef, PackedB, Workspace, MR, NR,
    };

    /// Multiply-adds per task: large enough that packing and rayon overheads stay small.
    const TASK_FLOPS: usize = 1 << 22;
    /// Most tasks per product.
    const MAX_TASKS: usize = 64;
    /// Fewest rows per task (every row block packs `B` again).
    const MIN_ROWS: usize = 8 * MR;
    /// Fewest columns per task (every column block packs `A` again).
    const MIN_COLS: usize = 8 * NR;
    /// A reduction at least this many times longer than the output's larger side is split
    /// into inner blocks (a weight gradient `xᵀ·dy` over a mini-batch's rows).
    const LONG_REDUCTION: usize = 4;
    /// Fewest inner steps per block of a split reduction (a multiple of `KC`, where a
    /// shared packed `B` starts its blocks).
    const MIN_K_BLOCK: usize = 2 * sgemm::KC;
    /// Most inner blocks of a split reduction (each adds one partial output to sum).
    const MAX_K_BLOCKS: usize = 16;
    /// Largest `B` (floats) packed once and shared by all tiles.
    const SHARED_B_MAX: usize = 1 << 20;

    thread_local! {
        /// Packing buffers of this thread; taken out while in use so that a nested call
        /// (work stealing) never finds them borrowed.
        static WORKSPACE: RefCell<Workspace> = RefCell::new(Workspace::default());
        /// Partial products of split reductions, kept to avoid fresh pages every step.
        static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
        /// The packed `B` of the product this thread is driving.
        static PACKED: RefCell<PackedB> = RefCell::new(PackedB::default());
    }

    /// Whether the fast path applies: a packed kernel for this CPU, `c` with unit column
    /// stride, and no negative strides anywhere.
    pub(super) fn usable(a: &ArrayView2<f32>, b: &ArrayView2<f32>, c: &ArrayViewMut2<f32>) -> bool {
        let unit_cols = c.ncols() <= 1 || c.strides()[1] == 1;
        unit_cols && c.strides().iter().all(|&x| x >= 0) && usable_inputs(a, b)
    }

    /// Whether the fast path applies to these inputs with a standard-layout output.
    pub(super) fn usable_inputs(a: &ArrayView2<f32>, b: &ArrayView2<f32>) -> bool {
        let non_negative = [a.strides(), b.strides()]
            .iter()
            .all(|s| s.iter().all(|&x| x >= 0));
        non_negative && sgemm::available()
    }

    /// How the product is cut: blocks of `rows`, `cols` and `inner` (each a function of the
    /// shape only).
    #[derive(Debug, PartialEq, Eq)]
    pub(super) struct Plan {
        pub rows: usize,
        pub cols: usize,
        pub inner: usize,
    }

    impl Plan {
        /// The plan of an `m×k` by `k×n` product.
        pub(super) fn new(m: usize, n: usize, k: usize) -> Plan {
            let tiles_for = |flops: usize| flops.div_ceil(TASK_FLOPS).clamp(1, MAX_TASKS);
            let split = |len: usize, parts: usize, min: usize, unit: usize| {
                if len < 2 * min || parts < 2 {
                    len
                } else {
                    len.div_ceil(parts).next_multiple_of(unit).max(min)
                }
            };
            let plan_tiles = |kk: usize| {
                let want = tiles_for(m * n * kk);
                let rows = split(m, want, MIN_ROWS, MR);
                let row_tiles = m.div_ceil(rows);
                let cols = split(n, want / row_tiles, MIN_COLS, NR);
                (rows, cols)
            };
            // A long reduction into a small output: tiles of the output would each pack the
            // whole of one operand again, so split the reduction instead, into blocks of whole
            // `KC` steps (a short last step would cost a pass over the output for little work)
            // that each compute the whole output from their rows of both operands, read and
            // packed once. The partial outputs are summed in block order.
            if k >= LONG_REDUCTION * m.max(n) && k >= 2 * MIN_K_BLOCK {
                let inner = k
                    .div_ceil(MAX_K_BLOCKS)
                    .next_multiple_of(sgemm::KC)
                    .max(MIN_K_BLOCK);
                return Plan {
                    rows: m,
                    cols: n,
                    inner,
                };
            }
            let (rows, cols) = plan_tiles(k);
            Plan {
                rows,
                cols,
                inner: k,
            }
        }
    }

    /// Run one tile on this thread's workspace.
    #[allow(clippy::too_many_arguments)]
    fn run_tile(isa: Isa, alpha: f32, a: MatRef, b: BSource, beta: f32, c: MatMut, epi: Epilogue) {
        let mut ws = WORKSPACE.with(|w| std::mem::take(&mut *w.borrow_mut()));
        // SAFETY: `isa` is this CPU's; the driver passes in-bounds, disjoint tiles whose
        // columns start at multiples of NR and inner ranges at multiples of KC.
        unsafe { sgemm::gemm_tile(isa, alpha, a, b, beta, c, &mut ws, epi) };
        WORKSPACE.with(|w| *w.borrow_mut() = ws);
    }

    pub(super) fn gemm(
        alpha: f32,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        beta: f32,
        c: ArrayViewMut2<f32>,
    ) {
        gemm_with(alpha, a, b, beta, c, Epilogue::NONE)
    }

    /// [`gemm`] whose tiles apply `epi` (origin `(0, 0)`, `ld` = the output's columns) before
    /// storing; a split reduction applies it when it sums the partial outputs.
    pub(super) fn gemm_with(
        alpha: f32,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        beta: f32,
        mut c: ArrayViewMut2<f32>,
        epi: Epilogue,
    ) {
        let (m, k) = a.dim();
        let n = b.ncols();
        let (ar, br) = (MatRef::of(&a), MatRef::of(&b));
        let isa = sgemm::isa().expect("`usable` checked for a kernel");
        let cm = MatMut {
            ptr: c.as_mut_ptr(),
            rows: m,
            cols: n,
            rs: if m > 1 { c.strides()[0] } else { n as isize },
        };
        // Pack B once for all tiles when it is small (weights) or transposed (its packing is
        // a scalar transpose); a large row-major B (a weight gradient's `dy`) is packed by
        // each tile, block by block, while hot in cache.
        let share = k * n <= SHARED_B_MAX || br.cs != 1;
        let plan = if m * n * k <= SERIAL_FLOPS {
            Plan {
                rows: m,
                cols: n,
                inner: k,
            }
        } else {
            Plan::new(m, n, k)
        };
        let mut packed = PACKED.with(|p| std::mem::take(&mut *p.borrow_mut()));
        if share {
            // SAFETY: `br` describes `b`.
            unsafe { packed.pack(br, isa) };
        }
        let packed_ref = &packed;
        let source = move |p: usize, j: usize, depth: usize, cols: usize| {
            if share {
                BSource::Shared {
                    packed: packed_ref,
                    p0: p,
                    j0: j,
                }
            } else {
                // SAFETY: the block lies inside `b`.
                BSource::Own(unsafe { br.sub(p, j, depth, cols) })
            }
        };
        let (row_tiles, col_tiles) = (m.div_ceil(plan.rows), n.div_ceil(plan.cols));
        let k_blocks = k.div_ceil(plan.inner).max(1);
        let tiles = row_tiles * col_tiles;
        // Tile `t` of inner block `q`: its rows, columns and reduction range.
        let bounds = move |t: usize, q: usize| {
            let (i, j) = (t / col_tiles * plan.rows, t % col_tiles * plan.cols);
            let p = q * plan.inner;
            (
                i,
                j,
                p,
                plan.rows.min(m - i),
                plan.cols.min(n - j),
                plan.inner.min(k - p.min(k)),
            )
        };
        if k_blocks == 1 {
            let task = |t: usize| {
                let (i, j, _, rows, cols, _) = bounds(t, 0);
                // SAFETY: the tiles partition the output and lie inside every operand.
                unsafe {
                    run_tile(
                        isa,
                        alpha,
                        ar.sub(i, 0, rows, k),
                        source(0, j, k, cols),
                        beta,
                        cm.sub(i, j, rows, cols),
                        epi.at(i, j),
                    )
                }
            };
            if tiles == 1 {
                task(0);
            } else {
                (0..tiles).into_par_iter().with_max_len(1).for_each(task);
            }
            PACKED.with(|p| *p.borrow_mut() = packed);
            return;
        }
        // Split reduction: every inner block writes its own partial product, then
        // `c = alpha·Σ_q partial_q + beta·c`, summed in block order.
        let mut partials = PARTIALS.with(|p| std::mem::take(&mut *p.borrow_mut()));
        if partials.len() < k_blocks * m * n {
            partials.resize(k_blocks * m * n, 0.0);
        }
        let parts = MatMut {
            ptr: partials.as_mut_ptr(),
            rows: k_blocks * m,
            cols: n,
            rs: n as isize,
        };
        (0..tiles * k_blocks)
            .into_par_iter()
            .with_max_len(1)
            .for_each(|task| {
                let (i, j, p, rows, cols, depth) = bounds(task % tiles, task / tiles);
                let q = task / tiles;
                // SAFETY: as above; partial `q` occupies rows `q·m..(q+1)·m` of `parts`.
                unsafe {
                    run_tile(
                        isa,
                        1.0,
                        ar.sub(i, p, rows, depth),
                        source(p, j, depth, cols),
                        0.0,
                        parts.sub(q * m + i, j, rows, cols),
                        Epilogue::NONE,
                    )
                }
            });
        // Row by row, partial 0 plus the others in block order (vector adds over whole
        // rows; every element sums its partials in the same order as before).
        let sums = &partials[..k_blocks * m * n];
        c.axis_iter_mut(Axis(0))
            .into_par_iter()
            .enumerate()
            .with_min_len(crate::backend::cpu::rows_per_task(n * k_blocks))
            .for_each_init(Vec::new, |acc, (i, mut row)| {
                acc.clear();
                acc.extend_from_slice(&sums[i * n..(i + 1) * n]);
                for q in 1..k_blocks {
                    add_assign(&sums[(q * m + i) * n..(q * m + i + 1) * n], acc);
                }
                for (ci, &s) in row.iter_mut().zip(acc.iter()) {
                    *ci = if beta == 0.0 {
                        alpha * s
                    } else {
                        alpha * s + beta * *ci
                    };
                }
                if !epi.is_none() {
                    // SAFETY: the caller's epilogue covers the whole output; row `i` owns
                    // its bit words (`n` is a multiple of 32 when bits are asked for).
                    unsafe { apply_epilogue(epi, i, row.as_slice_mut().expect("unit stride")) };
                }
            });
        PARTIALS.with(|p| *p.borrow_mut() = partials);
        PACKED.with(|p| *p.borrow_mut() = packed);
    }
}

/// Row `i` of a product after a split reduction: [`super::sgemm::Epilogue`]'s bias and ReLU, with the
/// same operations the kernel's epilogue does.
///
/// # Safety
/// `epi`'s pointers cover row `i` (bias: `row.len()` floats; bits: the row's 32-bit words).
#[cfg(target_arch = "x86_64")]
unsafe fn apply_epilogue(epi: super::sgemm::Epilogue, i: usize, row: &mut [f32]) {
    if !epi.bias.is_null() {
        let bias = std::slice::from_raw_parts(epi.bias, row.len());
        super::gather::add_assign(bias, row);
    }
    if !epi.relu_bits.is_null() {
        for (w, vs) in row.chunks_mut(32).enumerate() {
            let mut positive = 0u32;
            for (b, v) in vs.iter_mut().enumerate() {
                positive |= ((*v > 0.0) as u32) << b;
                *v = v.max(0.0);
            }
            *epi.relu_bits.add((i * epi.ld) / 32 + w) = positive;
        }
    }
    if !epi.drop_seeds.is_null() {
        let hash = super::bitmask::RowHash {
            seed: *epi.drop_seeds.add(i),
            keep_below: epi.keep_below,
            keep_all: false,
            scale: epi.drop_scale,
        };
        // A fused dropout's rows are whole 64-bit words (`ld` a multiple of 64).
        let words = std::slice::from_raw_parts_mut(
            epi.drop_bits.add(i * epi.ld / 32).cast::<u64>(),
            epi.ld / 64,
        );
        super::dropout::mask_row_recorded(hash, row, words);
    }
}

/// The input dropout of the layer that reads a product's output, applied by the product as it
/// stores its tiles ([`matmul_bias_relu_dropout`]): row `i` is masked with seed `seeds[i]`
/// (see [`super::dropout::DropoutMask::fused`]).
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
/// [`super::activation::Saved::Positive`]). On the packed path the product's tiles apply both
/// before they are stored, instead of two more passes over the output.
pub fn matmul_bias_relu(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    bias: Option<&[f32]>,
    relu: bool,
) -> (Array2<f32>, Option<Vec<u64>>) {
    let (c, bits, _) = matmul_onto_bias_relu(None, a, b, bias, relu, None);
    (c, bits)
}

/// [`matmul_bias_relu`], with [`matmul_bias_relu_dropout`]'s dropout when given, of
/// `onto + a·b` when `onto` is given: the product adds onto it before its tiles apply the
/// epilogue. Bitwise the product of `[x | a]·[y; b]` when `onto` is `x·y` over a whole number
/// of `KC` inner steps (the packed kernel adds its `KC` blocks to the output one after the
/// other, the same way).
pub fn matmul_onto_bias_relu(
    onto: Option<Array2<f32>>,
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    bias: Option<&[f32]>,
    relu: bool,
    dropout: Option<&RowDropout>,
) -> (Array2<f32>, Option<Vec<u64>>, Option<Vec<u64>>) {
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
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
    let dropout = dropout.zip(kept.as_mut());
    #[cfg(target_arch = "x86_64")]
    if k == b.nrows()
        && k > 0
        && m * n > 0
        && (!relu || n.is_multiple_of(32))
        && !super::skinny::handles(&a, &b)
        && fast::usable_inputs(&a, &b)
    {
        let mut bits = relu.then(|| vec![0u64; (m * n).div_ceil(64)]);
        let (drop_seeds, drop_bits, keep_below, drop_scale) = match dropout {
            Some((d, kept)) => (
                d.seeds.as_ptr(),
                kept.as_mut_ptr().cast::<u32>(),
                d.keep_below,
                d.scale,
            ),
            None => (std::ptr::null(), std::ptr::null_mut(), 0, 1.0),
        };
        let epi = super::sgemm::Epilogue {
            bias: bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            relu_bits: bits
                .as_mut()
                .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr().cast::<u32>()),
            ld: n,
            origin: (0, 0),
            drop_seeds,
            drop_bits,
            keep_below,
            drop_scale,
        };
        if let Some(mut c) = onto {
            if !c.is_standard_layout() {
                c = c.as_standard_layout().into_owned();
            }
            fast::gemm_with(1.0, a, b, 1.0, c.view_mut(), epi);
            return (c, bits, kept);
        }
        let mut c = Array2::<f32>::uninit((m, n));
        // SAFETY: a fresh standard-layout m×n allocation, every element of which the packed
        // kernel writes (beta = 0) before anything reads it; the bit words (little-endian
        // halves of the u64 words) are written once each.
        unsafe {
            let view = ArrayViewMut2::from_shape_ptr((m, n), c.as_mut_ptr().cast::<f32>());
            fast::gemm_with(1.0, a, b, 0.0, view, epi);
            return (c.assume_init(), bits, kept);
        }
    }
    let mut c = match onto {
        Some(mut c) => {
            gemm_into(1.0, a, b, 1.0, c.view_mut());
            c
        }
        None => matmul(a, b),
    };
    if let Some(bias) = bias {
        super::gather::add_to_rows(c.view_mut(), bias);
    }
    let bits = relu.then(
        || match super::activation::Activation::Relu.forward_save(c.view_mut()) {
            super::activation::Saved::Positive(bits) => bits,
            super::activation::Saved::Output(_) => unreachable!("ReLU keeps signs"),
        },
    );
    if let Some((d, kept)) = dropout {
        drop_rows(c.view_mut(), d, kept);
    }
    (c, bits, kept)
}

/// The portable form of the epilogue's dropout: mask each row of `c` with its seed and
/// record the kept elements (bit `i·n + j` of `kept`).
fn drop_rows(mut c: ArrayViewMut2<f32>, d: &RowDropout, kept: &mut [u64]) {
    let n = c.ncols();
    let words = n / 64;
    let cs = c.as_slice_mut().expect("fresh product");
    cs.par_chunks_mut(n.max(1))
        .zip(kept.par_chunks_mut(words.max(1)))
        .enumerate()
        .for_each(|(i, (row, bits))| super::dropout::mask_row_recorded(d.row_hash(i), row, bits));
}

/// `a · b`.
pub fn matmul(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
    assert_eq!(
        k,
        b.nrows(),
        "gemm: inner dimensions differ ({m}×{k} · {}×{n})",
        b.nrows()
    );
    if k > 0 && m * n > 0 {
        // The thin-shape loops and the packed kernel with beta = 0 write every output element
        // before they read any, so the output needs no zero-filling pass (a serial memset of
        // fresh memory).
        let mut c = Array2::<f32>::uninit((m, n));
        // SAFETY: `c` is a fresh standard-layout m×n allocation; the view is only written by
        // `skinny::try_gemm` or `fast::gemm` (beta = 0) before being read, and then every
        // element is initialised. `try_gemm` returning false has not touched it.
        unsafe {
            let mut view = ArrayViewMut2::from_shape_ptr((m, n), c.as_mut_ptr().cast::<f32>());
            if super::skinny::try_gemm(1.0, &a, &b, 0.0, &mut view) {
                return c.assume_init();
            }
            #[cfg(target_arch = "x86_64")]
            if fast::usable_inputs(&a, &b) {
                fast::gemm(1.0, a, b, 0.0, view);
                return c.assume_init();
            }
        }
    }
    let mut c = Array2::zeros((m, n));
    gemm_into(1.0, a, b, 0.0, c.view_mut());
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

    #[test]
    fn products_match_naive_on_parallel_shapes() {
        // Shapes large enough to be split into row blocks, and a wide one split by columns.
        for &(m, k, n) in &[
            (600, 70, 90),
            (33, 200, 700),
            (20, 3000, 30),
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
        // Tile tails (not multiples of 12 × 32), row / column / inner splits, transposed
        // operands, and a general beta.
        for &(m, k, n) in &[
            (1, 1, 1),
            (13, 7, 33),
            (25, 300, 65),
            (300, 5000, 40),
            (5, 9000, 3),
            (1100, 256, 256),
            (40, 256, 3000),
            // A `B` too large to share, packed by each tile: whole panels and a ragged one.
            (50, 4100, 288),
            (30, 3600, 300),
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
    /// The fused bias and ReLU give what a product followed by the separate passes gives,
    /// on the tiled path (one and two inner blocks), a split reduction, a width the fused
    /// bits do not cover (fallback), and a thin product (the thin-shape loops).
    /// The next layer's dropout applied by the product as it stores (kernel tiles, a split
    /// reduction, and the portable path of a reversed view) gives bitwise the masked output
    /// and the same kept bits as masking afterwards with the same row keys.
    #[test]
    fn fused_dropout_matches_masking_afterwards() {
        use crate::backend::cpu::dropout::DropoutMask;
        let mask = DropoutMask::new(17, 0.4);
        for &(m, k, n) in &[(50, 40, 64), (300, 70, 128), (30, 5000, 64), (7, 3, 192)] {
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

    #[test]
    fn fused_bias_relu_matches_separate_passes() {
        for (m, k, n) in [
            (500, 300, 64),
            (200, 40, 96),
            (32, 5000, 64),
            (300, 50, 40),
            (2000, 3, 64),
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

/// Throughput of both paths on GNN shapes (`cargo test --release --lib gemm_throughput --
/// --ignored --nocapture`); prints GFLOP/s, asserts nothing about time.
#[cfg(test)]
mod throughput {
    use super::*;
    use std::time::Instant;

    /// The best of several timed repetitions: on a shared machine the fastest run is the one
    /// least disturbed by other tenants, so it is the figure that compares kernels.
    fn rate(label: &str, m: usize, k: usize, n: usize, mut f: impl FnMut()) {
        f();
        let reps = (4_000_000_000 / (m * n * k).max(1)).clamp(3, 100);
        let best = (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        let gf = 2.0 * (m * n * k) as f64 / 1e9;
        eprintln!(
            "{label:>9} {m:>6}×{k:>5}×{n:>5}: {:7.1} GFLOP/s (best of {reps}: {:.3} ms)",
            gf / best,
            best * 1e3
        );
    }

    #[test]
    #[ignore]
    fn gemm_throughput() {
        // (m, k, n, a transposed, b transposed): forward, weight gradient, input gradient.
        for &(m, k, n, ta, tb) in &[
            // Tolokers SAGE's middle layer: forward, weight gradient, input gradient.
            (5200, 512, 256, false, false),
            (512, 5200, 256, true, false),
            (5200, 256, 512, false, true),
            (10000, 256, 256, false, false),
            (1000, 4714, 256, false, false),
            (256, 10000, 256, true, false),
            (10000, 256, 256, false, true),
            (10, 10000, 256, true, false),
            (20000, 10, 256, false, false),
            (1024, 256, 2, false, false),
        ] {
            let a = Array2::from_elem(if ta { (k, m) } else { (m, k) }, 0.5f32);
            let b = Array2::from_elem(if tb { (n, k) } else { (k, n) }, 0.25f32);
            let av = if ta { a.t() } else { a.view() };
            let bv = if tb { b.t() } else { b.view() };
            let mut c = Array2::zeros((m, n));
            let mut c2 = Array2::zeros((m, n));
            let label = format!(
                "{}{}",
                if ta { "T" } else { "N" },
                if tb { "T" } else { "N" }
            );
            rate(&format!("new {label}"), m, k, n, || {
                gemm_into(1.0, av, bv, 0.0, c.view_mut())
            });
            rate(&format!("old {label}"), m, k, n, || {
                portable_gemm(1.0, av, bv, 0.0, c2.view_mut())
            });
        }
    }
}
