//! Points of the compute kernels on the backend in use: the dense products in their three
//! forms, aggregation, sparse products, the optimizer, elementwise passes and attention.

use super::KernelTimer;
use crate::backend::{AdamStep, Backend, BlockTranspose, EdgeWeights, GcnNorm};
use crate::graph::NodeId;
use crate::sample::rng::{hash_key, unit_f64};
use crate::sample::Block;
use crate::train::plan::calibration::{Product, GEMM_SHAPES};
use ndarray::Array2;

pub(super) fn gemm_points<B: Backend>(
    be: &B,
    timer: KernelTimer,
    form: Product,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    products_of(be, timer, &GEMM_SHAPES, form)
}

/// The points of the products `shapes` in `form` (`(flops, seconds)`) and the bytes each
/// touches. A shape `(m, k, n)` is a layer's `m` rows of `k` columns into `n`: forward
/// `x·W` (`m×k · k×n`), its weight gradient `xᵀ·dY` added onto a `k×n` gradient, its
/// input gradient `dY·Wᵀ` (`m×n · n×k`) — the same flops and bytes in every form.
pub(super) fn products_of<B: Backend>(
    be: &B,
    timer: KernelTimer,
    shapes: &[(usize, usize, usize)],
    form: Product,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    let mut points = Vec::new();
    let mut bytes = Vec::new();
    for &(m, k, n) in shapes {
        // Small whole numbers, as every point's inputs (the values do not change the timing).
        let matrix = |r: usize, c: usize, modulus: usize| {
            be.upload(Array2::from_shape_fn((r, c), |(i, j)| ((i + j) % modulus) as f32).view())
        };
        let s = match form {
            Product::Forward => {
                let (x, w) = (matrix(m, k, 7), matrix(k, n, 5));
                timer.point(|| {
                    let y = be.matmul(be.view(&x), be.view(&w));
                    let _ = be.download(be.rows(be.view(&y), 0..1));
                })
            }
            Product::WeightGradient => {
                let (x, dy, mut g) = (matrix(m, k, 7), matrix(m, n, 3), matrix(k, n, 1));
                timer.point(|| {
                    be.add_matmul_tn(be.view(&x), be.view(&dy), be.view_mut(&mut g));
                    let _ = be.download(be.rows(be.view(&g), 0..1));
                })
            }
            Product::InputGradient => {
                let (dy, w) = (matrix(m, n, 3), matrix(k, n, 5));
                timer.point(|| {
                    let dx = be.matmul_nt(be.view(&dy), be.view(&w));
                    let _ = be.download(be.rows(be.view(&dx), 0..1));
                })
            }
        };
        points.push([(2 * m * k * n) as f64, s]);
        bytes.push((4 * (m * k + k * n + m * n)) as f64);
    }
    (points, bytes)
}

/// A sampled-looking block: `dst` destinations with [`BLOCK_FANOUT`] pseudo-random sources
/// each among `src`.
fn synthetic_block(dst: usize, src: usize) -> Block {
    let indices: Vec<u32> = (0..dst * BLOCK_FANOUT)
        .map(|i| ((i as u64 * 2_654_435_761) % src as u64) as u32)
        .collect();
    Block {
        num_dst: dst,
        src_nodes: (0..src as NodeId).collect(),
        indptr: (0..=dst).map(|v| v * BLOCK_FANOUT).collect(),
        indices,
    }
}

/// Sources per destination of the synthetic blocks (a sampled block's fanout).
const BLOCK_FANOUT: usize = 10;

/// The block the attention points run on: 4096 destinations among 16384 sources.
fn attention_block() -> Block {
    synthetic_block(4096, 16384)
}

/// Source rows of the aggregation points' blocks (a quarter as many destinations, each of
/// [`BLOCK_FANOUT`] sources), and the widths each is timed at. The sources' bytes, from 128 KiB
/// to 256 MiB, span the core's own caches, the host's last level and memory.
const AGGREGATE_SOURCES: [usize; 3] = [2048, 16384, 65536];
const AGGREGATE_WIDTHS: [usize; 4] = [16, 64, 256, 1024];

/// Mean aggregation over blocks of each [`AGGREGATE_SOURCES`] at each [`AGGREGATE_WIDTHS`]:
/// `x` = edges, and the bytes of the source rows they read (edges × width × 4), so that it is
/// priced through its points by edges and row size as the gathers are
/// ([`Fit::by_grid`](crate::train::plan::calibration::Fit::by_grid)).
/// An edge × column is not one price: its source rows are read at random, so it costs what
/// the cache the sources fit in charges per row. Timed at widths up to 256 over 16384 sources
/// (up to 16 MB) and priced by edges × columns alone, a real batch's input-layer aggregation
/// of the 2,048-feature SBM (26,520 edges) took 22 ms where that priced 10.6 ms, and its
/// 64-column ones 0.6× their price (2-core EPYC VM); the grid's train phase of that SBM went
/// from 1.12-1.23× its prediction to 0.88-1.05× (`auto-replan-2026-12-03c*.md`).
pub(super) fn aggregate_points<B: Backend>(
    be: &B,
    timer: KernelTimer,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    aggregation_grid(
        be,
        |_| (),
        |g, _, (src, _), w| {
            let x =
                be.upload(Array2::from_shape_fn((src, w), |(i, j)| ((i + j) % 3) as f32).view());
            timer.point(|| {
                let out = be.aggregate(g, be.view(&x), EdgeWeights::Mean);
                let _ = be.download(be.rows(be.view(&out), 0..1));
            })
        },
    )
}

/// The points of an aggregation's pass over a block of each [`AGGREGATE_SOURCES`] at each
/// [`AGGREGATE_WIDTHS`]: `time(graph, prepared, (sources, destinations), width)` gives a
/// point's seconds, `prepare` what its block needs before it becomes a graph; `x` = edges,
/// and the bytes of the rows they read (edges × width × 4).
fn aggregation_grid<B: Backend, T>(
    be: &B,
    prepare: impl Fn(&Block) -> T,
    mut time: impl FnMut(&B::Graph, &T, (usize, usize), usize) -> f64,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    let (mut points, mut bytes) = (Vec::new(), Vec::new());
    for &src in &AGGREGATE_SOURCES {
        let block = synthetic_block(src / 4, src);
        let (dst, edges) = (block.num_dst, block.num_edges());
        let prepared = prepare(&block);
        let g = be.graph(block);
        for &w in &AGGREGATE_WIDTHS {
            points.push([edges as f64, time(&g, &prepared, (src, dst), w)]);
            bytes.push((edges * w * 4) as f64);
        }
    }
    (points, bytes)
}

/// The transposed aggregation a backward pass runs (`aggregate_transpose`: each source's sum
/// of its destinations' gradient rows), over the blocks and at the widths of
/// [`aggregate_points`], the same `x` and bytes point by point. On a host backend every run
/// builds the block's transpose first, as a step's backward does on first use; a device's
/// comes built by the prefetch workers, so it is built once, untimed. Priced as another
/// forward pass, it was under-priced where it is wide: at 64 columns a 1-thread pass with
/// its transpose took 1.9-2.6× the forward over the same block (2-core EPYC VM), it writes a
/// row per source where the forward writes one per destination; rows of up to 16 columns are
/// scattered without a transpose, 0.4-1.3× the forward.
pub(super) fn aggregate_transpose_points<B: Backend>(
    be: &B,
    timer: KernelTimer,
) -> (Vec<[f64; 2]>, Vec<f64>) {
    aggregation_grid(
        be,
        |block| (!B::IS_HOST).then(|| be.transpose_of(BlockTranspose::new(block))),
        |g, built, (_, dst), w| {
            let d =
                be.upload(Array2::from_shape_fn((dst, w), |(i, j)| ((i + j) % 3) as f32).view());
            timer.point(|| {
                let fresh = B::Transpose::default();
                let t = built.as_ref().unwrap_or(&fresh);
                let out = be.aggregate_transpose(g, t, be.view(&d), EdgeWeights::Mean);
                let _ = be.download(be.rows(be.view(&out), 0..1));
            })
        },
    )
}

/// Entries of the degree table the `gcn_norm` points read (1 MiB of `u32`): a graph of a
/// quarter million vertices, whose table a step leaves in the host's cache as the points'
/// repetitions do.
const GCN_NORM_TABLE: usize = 1 << 18;

/// GCN's normalisation factors of a block ([`GcnNorm::new`] with the graph's degree table),
/// over blocks of each [`AGGREGATE_SOURCES`] whose sources are spread over the table as a
/// sampled block's global ids are: `x` = sources + destinations (each a read of the table).
/// Every GCN layer computes them from its block in every forward, on the host whatever the
/// backend, in time proportional to the block's vertices and not to its width: on the 2-core
/// EPYC VM 2.3 ns a vertex, 15.5 µs a call on the R-MAT graph's blocks. Without a price of
/// their own the 2-rank grid's GCN train phases measured 1.12× their prediction (median) where
/// SAGE's measured 0.96× (`auto-2026-12-06n-epyc-2ranks-epoch-order.md`); with it 1.14×
/// against 0.99× (`auto-2026-12-06q-epyc-2ranks-gcn-norm.md`): a small share of that gap.
pub(super) fn gcn_norm_points(timer: KernelTimer) -> Vec<[f64; 2]> {
    let table: Vec<u32> = (0..GCN_NORM_TABLE).map(|v| (v % 37 + 1) as u32).collect();
    AGGREGATE_SOURCES
        .iter()
        .map(|&src| {
            let mut block = synthetic_block(src / 4, src);
            for (i, v) in block.src_nodes.iter_mut().enumerate() {
                *v = ((i as u64 * 2_654_435_761) % GCN_NORM_TABLE as u64) as NodeId;
            }
            let s = timer.point(|| {
                std::hint::black_box(GcnNorm::new(&block, Some(&table)));
            });
            [(block.num_src() + block.num_dst) as f64, s]
        })
        .collect()
}

/// The output widths the sparse products are timed at.
const SPMM_WIDTHS: [usize; 4] = [16, 64, 256, 1024];

/// Products with sparse input rows (bag-of-words features: 41 draws a row over 4096 columns,
/// about 1 % density), the forward `x·w` and the weight gradient `xᵀ·d` together, at the
/// output widths of the layers trained (16 to 1024 columns) and over 1024 and 4096 of the rows:
/// `x` = 2 × stored non-zeros (each read by both products), the bytes the row of `w` (or of the
/// gradient) each non-zero reads, `4 ×` the width. Priced through these points by non-zeros and
/// width ([`Fit::by_grid`](crate::train::plan::calibration::Fit::by_grid)), as the aggregation
/// is by edges and row size: a non-zero's cost per column is not one number (on the Xeon VM
/// 0.12 ns at 64 columns, 0.18 at 256 and 0.26 at 1024, as the weight outgrows the 2 MB L2),
/// and the line through widths up to 256 that priced them left Facebook's 2-rank steps of
/// hidden 1024 at 1.14-1.49× their predicted train phase. A backend without a sparse path (it
/// multiplies such rows densely, priced by `gemm`) has no points: the operator is free and
/// unused.
///
/// The columns are drawn by Zipf's law ([`zipf_columns`]), as words are: a real bag-of-words
/// matrix reads a few hot rows of `w` most of the time, and they stay in the caches. Columns
/// drawn evenly (formats 21-31) read every row of `w` alike; at 1024 columns that is 16 MiB a
/// rank, and two ranks' weights and gradients overflow a shared 32 MiB L3. On the 2-core Zen 3
/// VM, over 16,384 of Facebook's rows (230k non-zeros, 1024 columns, both products), two ranks
/// at once took 115-125 ms a rank on Facebook's own columns, 120-127 on Zipf columns and
/// 200-230 on even ones (one rank of two threads: 63, 62 and 86 ms); the even columns had
/// priced the 2-rank grid's Facebook train phases of hidden 1024 at 1.5-2.0× their measured
/// time for SAGE and 1.0-1.3× for GCN (`auto-2026-12-07s-zen3-2ranks.md`).
pub(super) fn spmm_points<B: Backend>(be: &B, timer: KernelTimer) -> (Vec<[f64; 2]>, Vec<f64>) {
    let (rows, cols, per_row) = (4096usize, 4096usize, 41usize);
    let mut dense = Array2::<f32>::zeros((rows, cols));
    let columns = zipf_columns(rows * per_row, cols);
    for (k, &j) in columns.iter().enumerate() {
        // Repeated draws within a row make one non-zero; the points count the stored ones.
        dense[(k / per_row, j)] = 1.0;
    }
    let dev = be.upload(dense.view());
    let Some(x) = be.sparse_from_dense(be.view(&dev)) else {
        // Every rank takes this branch alike (same backend kind), so no collective is skipped.
        return (vec![], vec![]);
    };
    let (mut points, mut bytes) = (Vec::new(), Vec::new());
    for used in [rows / 4, rows] {
        let nnz = dense
            .slice(ndarray::s![..used, ..])
            .iter()
            .filter(|&&v| v != 0.0)
            .count();
        for n in SPMM_WIDTHS {
            let w =
                be.upload(Array2::from_shape_fn((cols, n), |(i, j)| ((i + j) % 5) as f32).view());
            let d =
                be.upload(Array2::from_shape_fn((used, n), |(i, j)| ((i * j) % 3) as f32).view());
            let mut g = be.upload(Array2::<f32>::zeros((cols, n)).view());
            let s = timer.point(|| {
                let y = be.spmm(&x, used, be.view(&w));
                be.add_spmm_tn(&x, used, be.view(&d), be.view_mut(&mut g));
                let _ = be.download(be.rows(be.view(&y), 0..1));
            });
            points.push([(2 * nnz) as f64, s]);
            bytes.push((2 * nnz * n * 4) as f64);
        }
    }
    (points, bytes)
}

/// `draws` column indices in `0..cols` drawn by Zipf's law with exponent 1 (the column of
/// popularity rank `r` with probability ∝ `1/(r+1)`), deterministically (the sampler's
/// counter-based hash of the draw's index);
/// ranks are scattered over the columns by an odd multiplier (one to one where `cols` is a
/// power of two), so hot rows of `w` are not adjacent in memory. Of Facebook's 4,714 columns
/// the top 5 % hold 73 % of the non-zeros and the top 10 % 86 %; of these 4,096, 66 % and 74 %.
pub(super) fn zipf_columns(draws: usize, cols: usize) -> Vec<usize> {
    let mut cdf: Vec<f64> = (1..=cols).map(|r| 1.0 / r as f64).collect();
    let mut total = 0.0;
    for c in cdf.iter_mut() {
        total += *c;
        *c = total;
    }
    (0..draws as u64)
        .map(|k| {
            let u = unit_f64(hash_key(&[k])) * total;
            let rank = cdf.partition_point(|&c| c < u).min(cols - 1);
            (rank as u64 * 2_654_435_761 % cols as u64) as usize
        })
        .collect()
}

/// The optimizer's share of a step: zeroing the gradients and one Adam update, over flat
/// buffers of growing parameter counts (`x` = parameters). Every strategy pays it once per
/// step on every rank, and at a hidden width of 1024 it is a tenth of a CPU step (Facebook's
/// SAGE has 12M parameters: 28 bytes of moments, values and gradients read or written each).
pub(super) fn optimizer_points<B: Backend>(be: &B, timer: KernelTimer) -> Vec<[f64; 2]> {
    let step = AdamStep {
        beta1: 0.9,
        beta2: 0.999,
        lr: 1e-3,
        weight_decay: 0.0,
        eps: 1e-8,
        decoupled: false,
        step_size: 1e-2,
        bc2_sqrt: 0.05,
    };
    [1usize << 16, 1 << 18, 1 << 20, 1 << 22]
        .iter()
        .map(|&n| {
            let start: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut values = be.buffer_from_host(&start);
            let mut grads = be.buffer_from_host(&start);
            let mut m = be.buffer_from_host(&start);
            let mut v = be.buffer_from_host(&start);
            let s = timer.point(|| {
                be.buffer_zero(&mut grads);
                be.adam_step(&mut values, &grads, &mut m, &mut v, step);
                // One value back: the host waits for the device's queue.
                let _ = be.download(be.buffer_view(&values, 0, 1, 1));
            });
            [n as f64, s]
        })
        .collect()
}

/// A hidden layer's activation, forward (ReLU in place, its signs kept) and backward (the
/// gradient scaled by them in place), over hidden rows of 256 columns: `x` = the bytes the
/// two passes read and write (16 per value). At a wide hidden layer these passes stream more
/// bytes than the layer's products touch.
pub(super) fn elementwise_points<B: Backend>(be: &B, timer: KernelTimer) -> Vec<[f64; 2]> {
    let act = crate::backend::Activation::Relu;
    [1024usize, 4096, 16384, 65536]
        .iter()
        .map(|&rows| {
            let cols = 256usize;
            let values = || Array2::from_shape_fn((rows, cols), |(i, j)| (i as f32) - (j as f32));
            let mut h = be.upload(values().view());
            let mut g = be.upload(values().view());
            let s = timer.point(|| {
                let saved = be.activation_forward(act, be.view_mut(&mut h));
                be.activation_backward(act, &saved, be.view_mut(&mut g));
                let _ = be.download(be.rows(be.view(&g), 0..1));
            });
            [(16 * rows * cols) as f64, s]
        })
        .collect()
}

/// GAT's attention, forward and backward as a layer runs it (node logits of sources and
/// destinations, edge softmax, weighted aggregation, then `attention_backward`), on the
/// synthetic block with 4 heads: `x` = edges × all heads' columns.
pub(super) fn attention_points<B: Backend>(be: &B, timer: KernelTimer) -> Vec<[f64; 2]> {
    let block = attention_block();
    let (dst, src, edges) = (block.num_dst, block.num_src(), block.num_edges());
    let heads = 4usize;
    let g = be.graph(block);
    let transpose = B::Transpose::default();
    [16usize, 64, 128, 256]
        .iter()
        .map(|&w| {
            let f = w / heads;
            let wh = be.upload(
                Array2::from_shape_fn((src, w), |(i, j)| ((i + j) % 5) as f32 * 0.1).view(),
            );
            let att = be.upload(
                Array2::from_shape_fn((heads, f), |(i, j)| ((i * j) % 3) as f32 * 0.1).view(),
            );
            let d_out = be.upload(
                Array2::from_shape_fn((dst, w), |(i, j)| ((i * j) % 7) as f32 * 0.1).view(),
            );
            let s = timer.point(|| {
                let el = be.node_logits(be.view(&wh), be.view(&att), src);
                let er = be.node_logits(be.view(&wh), be.view(&att), dst);
                let alpha = be.edge_softmax(&g, be.view(&el), be.view(&er), 0.2);
                let out = be.attention_aggregate(&g, be.view(&alpha), be.view(&wh));
                let grads = be.attention_backward(
                    &crate::backend::AttentionArgs {
                        graph: &g,
                        transpose: &transpose,
                        wh: be.view(&wh),
                        el: be.view(&el),
                        er: be.view(&er),
                        alpha: be.view(&alpha),
                        att_src: be.view(&att),
                        att_dst: be.view(&att),
                        slope: 0.2,
                    },
                    be.view(&d_out),
                );
                let _ = be.download(be.rows(be.view(&out), 0..1));
                let _ = be.download(be.rows(be.view(&grads.d_wh), 0..1));
            });
            [(edges * w) as f64, s]
        })
        .collect()
}
