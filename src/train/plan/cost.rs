//! The cost model: price a [`DryRun`]'s counts with a [`Calibration`], per strategy and phase,
//! and pick the cheapest. Pure arithmetic (no MPI, no clock), so every rank holding the same
//! dry run and calibration computes the same prediction bit for bit.
//!
//! Per mini-batch and rank, `T = T_build + T_load + T_shuffle + T_train + T_sync`:
//! - build: the strategy's sampling (`sample`, edges in its blocks) and its id exchanges
//!   (`alltoallv`, the bytes and calls the dry run counted; NFP's allgather of every rank's
//!   input block, `allgatherv`);
//! - load: input feature rows — the local gather (`gather`, bytes of the rows this rank reads
//!   for itself, from the feature cache, and serves to others), the fetch of remote rows (`alltoallv`, 8-byte ids out
//!   and the rows back, each row exchange priced by its bytes and its rows) and, on a device
//!   backend, the copy of the input rows to it (`h2d`);
//! - shuffle: hidden rows between ranks (`alltoallv`, row exchanges forward and their
//!   gradients back); partial sums sent as ready rows and added on receipt
//!   (`partial_sums`: SNP's and NFP's);
//! - train: per layer the dense products (`gemm` forward, `gemm_tn` the weight gradients,
//!   `gemm_nt` the input gradients; flops and bytes) and the aggregation (`aggregate`,
//!   edges × columns) of forward and backward, in the order the layer itself picks (SNP's input
//!   layer always projects first, on the sources' owners); an input layer on mostly-zero
//!   features multiplies only their non-zeros (`spmm`) after a scan of the dense rows; every
//!   hidden layer's activation forward and backward (`elementwise`, bytes streamed);
//! - sync: the gradient allreduce (`allreduce`, 4 bytes per parameter synced: NFP's ranks
//!   keep their first-layer weight slices' gradients; on a device without
//!   CUDA-aware MPI the gradients also go down and back up, `d2h` and `h2d`) and the step's
//!   small allreduce of counters; and the ranks' waits for each other at the step's
//!   collectives, a calibrated share of the step's work (`drift`);
//! - optimizer: zeroing the gradients and the Adam update (`optimizer`, per parameter a rank
//!   holds: NFP's ranks hold a slice of the first layer's weights).
//!
//! Each phase is bounded by its slowest rank (ranks meet at every exchange), so a strategy's
//! step is the sum over phases of the maximum over ranks. Adding a strategy is one function
//! from the ranks' counts to a [`RankCost`] per rank (see [`nfp`]).

use super::calibration::{Calibration, Product, Products};
use super::dry_run::{Counts, DryRun};
use crate::backend::cpu::sparse::MIN_SPARSE_COLS;
use crate::kinds::{ModelKind, Strategy};
use crate::train::prefetch::prefetches_strategy;
use serde::Serialize;
use std::collections::BTreeMap;

/// The candidates in order of preference on a tie.
pub const CANDIDATES: &[&str] = &["gdp", "split", "dnp", "snp", "nfp"];

/// What the cost model needs of the model and the run.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    pub kind: ModelKind,
    /// Per layer (input first), the convolution's input and output widths; GAT's output width
    /// is that of its product, every head's columns (a last layer averages them afterwards).
    pub in_w: Vec<f64>,
    pub out_w: Vec<f64>,
    /// Parameters (the allreduce moves 4 bytes each).
    pub params: f64,
    /// Whether the model lives on a device (input rows are copied to it).
    pub device: bool,
    /// Whether the gradient allreduce goes through host memory (a device without CUDA-aware
    /// MPI: the gradients are copied down and back up around it).
    pub staged_gradients: bool,
    /// Stored non-zeros per input row when the input layer multiplies the features as sparse
    /// rows (mostly-zero features on a backend with a sparse path), else `None`.
    pub input_nnz: Option<f64>,
    /// Bytes of one fetched feature row on the wire when the store packs rows (features
    /// mostly zeros, `exchange::packed_rows`: a count word, a column and a value per
    /// non-zero), else `None` (the row travels dense).
    pub packed_row_bytes: Option<f64>,
    /// GDP's sparse batches come as CSR (every rank's store keeps a CSR copy of its rows, and
    /// the input layer multiplies sparse rows): its load reads, moves and copies up the
    /// entries, not dense rows, and its input layer scans no dense rows for them.
    pub csr_batches: bool,
    /// The ranks keep their own feature rows (and the cache) on the device
    /// (`train::strategy::ResidentFeatures`; every mini-batch strategy but NFP): their dense
    /// batches gather those there, and only fetched rows are made on the host and copied up.
    pub resident_rows: bool,
    /// Ranks the gradients are summed over when more than those sharing a mini-batch (hybrid
    /// over several nodes: the world, where the dry run saw one node); 1 otherwise.
    pub sync_ranks: usize,
    /// Bytes of the dense feature rows the fullest rank's store gathers from (its own rows
    /// and its cache): what of them the host's cache cannot hold is gathered at the price of
    /// rows from memory ([`Calibration::far_share`]).
    pub store_bytes: f64,
    /// Workers that prepare the batches of every strategy but NFP ahead while the device trains
    /// (`train::prefetch`; `prefetches_strategy` says where),
    /// or `None` where each batch is prepared in its step (the CPU backend, whose cores the
    /// preparation would share, or `--prefetch off`).
    pub prefetch_workers: Option<usize>,
    /// Each rank's input columns under NFP (`columns::planned_bounds`: equal non-zeros on
    /// mostly-zero features, else even widths); empty: even widths.
    pub nfp_columns: Vec<f64>,
}

impl ModelShape {
    /// [`ModelShape::packed_row_bytes`] for rows of `width` columns with `density` of their
    /// values non-zero: `None` unless most values are zero (the store's own test).
    pub fn packed_row_bytes(width: f64, density: f64) -> Option<f64> {
        (density < 0.5).then(|| (4.0 * (1.0 + 2.0 * density * width)).min(4.0 * (1.0 + width)))
    }

    /// Rank `r`'s input columns under NFP over `ranks` ranks.
    fn nfp_width(&self, r: usize, ranks: usize) -> f64 {
        match self.nfp_columns.get(r) {
            Some(&w) if self.nfp_columns.len() == ranks => w,
            _ => self.in_w[0] / ranks as f64,
        }
    }

    /// The widest NFP slice over `ranks` ranks: its rank holds and updates the most of the
    /// sliced weights.
    fn nfp_widest(&self, ranks: usize) -> f64 {
        (0..ranks)
            .map(|r| self.nfp_width(r, ranks))
            .fold(0.0, f64::max)
    }
}

/// The order an input layer computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The layer picks (aggregate first unless projecting first is fewer multiply-adds).
    Cheaper,
    /// Project every source first (SNP's source owners: partial rows are of the output width).
    ProjectFirst,
}

/// Predicted seconds per mini-batch of each phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Phases {
    pub build: f64,
    pub load: f64,
    pub shuffle: f64,
    pub train: f64,
    pub sync: f64,
    pub optimizer: f64,
}

impl Phases {
    pub fn total(&self) -> f64 {
        self.build + self.load + self.shuffle + self.train + self.sync + self.optimizer
    }

    /// `self + k·o`, phase by phase.
    fn plus(&self, o: &Phases, k: f64) -> Phases {
        Phases {
            build: self.build + k * o.build,
            load: self.load + k * o.load,
            shuffle: self.shuffle + k * o.shuffle,
            train: self.train + k * o.train,
            sync: self.sync + k * o.sync,
            optimizer: self.optimizer + k * o.optimizer,
        }
    }

    fn max(&self, o: &Phases) -> Phases {
        Phases {
            build: self.build.max(o.build),
            load: self.load.max(o.load),
            shuffle: self.shuffle.max(o.shuffle),
            train: self.train.max(o.train),
            sync: self.sync.max(o.sync),
            optimizer: self.optimizer.max(o.optimizer),
        }
    }
}

/// One rank's cost of one strategy per mini-batch: phases and the bytes it receives.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankCost {
    pub phases: Phases,
    pub bytes: f64,
    /// The part of `phases.load` that the training thread spends (input rows copied up to
    /// the device); the rest is host work that prefetch workers can do ahead.
    pub upload: f64,
}

/// The prediction for one strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StrategyPrediction {
    /// Seconds per mini-batch of each phase: its slowest rank in each dry-run batch, averaged
    /// over the batches.
    pub phases: Phases,
    pub step_seconds: f64,
    /// `step_seconds` × the epoch's mini-batches.
    pub epoch_seconds: f64,
    /// Bytes moved between ranks per mini-batch, summed over ranks (received).
    pub bytes_per_step: f64,
    /// Destination rows computed more than once (above split's distinct rows), per step.
    pub redundant_rows: f64,
    /// Whether `auto` may pick it (a strategy this build trains, which supports the model).
    pub pickable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Every candidate's prediction and the choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// Dry-run mini-batches sampled, and in the epoch.
    pub batches: usize,
    pub epoch_batches: usize,
    pub ranks: usize,
    pub strategies: BTreeMap<String, StrategyPrediction>,
    pub choice: String,
    /// What the rows stand for when not the whole world sharing each mini-batch (hybrid over
    /// several nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// The work of one layer's forward and backward, in the order the layer picks (aggregate
/// first unless projecting first is fewer multiply-adds): its dense products, and its
/// aggregations. SAGE has two weights (self and neighbour), GCN one. Backward repeats the
/// forward's products as weight gradients and, where a gradient has to reach the layer's
/// input (every layer but the input one), as input gradients: the same flops and bytes in
/// each form, a backward form priced as the forward times its measured ratio to it
/// ([`Calibration::products`]). GAT always projects every source first ([`gat_layer_work`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerWork {
    /// The forward pass's dense products.
    pub forward: Products,
    /// Whether backward computes the input gradient (else the weight gradients only).
    pub input_gradient: bool,
    pub aggregations: Aggregations,
    /// GAT: edges × the product's columns of its attention (logits, softmax, weighted
    /// aggregation, and their backward), priced by the calibrated `attention` operator.
    pub attention_cols: f64,
}

impl LayerWork {
    /// The forms the layer's products run in, forward and backward.
    pub fn forms(&self) -> impl Iterator<Item = Product> + '_ {
        Product::ALL
            .into_iter()
            .filter(|&f| f != Product::InputGradient || self.input_gradient)
    }

    /// Flops of every product, forward and backward.
    #[cfg(test)]
    pub fn flops(&self) -> f64 {
        self.forms().count() as f64 * self.forward.flops
    }

    /// Seconds of every product in every form ([`Calibration::products`]).
    pub fn product_seconds(&self, cal: &Calibration) -> f64 {
        let p = self.forward;
        self.forms().map(|form| cal.products(form, &p)).sum()
    }
}

/// A layer's aggregations in a step: `passes` calls (forward, and the transposed one backward
/// where a gradient has to pass it), each over `edges` edges reading rows of `width` columns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Aggregations {
    pub edges: f64,
    pub width: f64,
    pub passes: f64,
}

impl Aggregations {
    pub fn edge_cols(&self) -> f64 {
        self.passes * self.edges * self.width
    }

    /// Seconds through the calibrated `aggregate` operator, priced by edges and the bytes of
    /// the rows they read (`calibrate::aggregate_points`).
    pub fn seconds(&self, cal: &Calibration) -> f64 {
        if self.passes <= 0.0 || self.edges <= 0.0 {
            return 0.0;
        }
        let edges = self.passes * self.edges;
        cal.op("aggregate")
            .seconds_touching(edges, edges * self.width * 4.0, self.passes)
    }
}

pub fn layer_work(
    kind: ModelKind,
    (i, o): (f64, f64),
    (nd, ns, e): (f64, f64, f64),
    need_src: bool,
    order: Order,
) -> LayerWork {
    if kind == ModelKind::Gat {
        return gat_layer_work((i, o), (nd, ns, e), need_src);
    }
    let k = if kind == ModelKind::Sage { 2.0 } else { 1.0 };
    let agg_first = order == Order::Cheaper && e * i + nd * i * o <= ns * i * o + e * o;
    // A product of `m` rows by the `i × o` weight: its flops and the bytes of its three
    // matrices (the weight and input gradients touch as many).
    let product = |m: f64| (2.0 * m * i * o, 4.0 * (m * i + i * o + m * o));
    let ((f_self, b_self), (f_neigh, b_neigh)) = (product(nd), product(ns));
    // Aggregating first, SAGE's two weights stack into one product (`SageConv::forward`);
    // projecting first, each is a product of its own.
    let (flops, bytes, width, calls, inner) = if agg_first {
        (k * f_self, k * b_self, i, 1.0, k * i)
    } else {
        (
            f_neigh + (k - 1.0) * f_self,
            b_neigh + (k - 1.0) * b_self,
            o,
            k,
            i,
        )
    };
    // Backward: the weight gradients, the input gradients when needed, and the transposed
    // aggregation when a gradient has to pass it.
    let backward = if need_src || !agg_first { 1.0 } else { 0.0 };
    LayerWork {
        forward: Products {
            flops,
            bytes,
            calls,
            inner,
            cols: o,
        },
        input_gradient: need_src,
        aggregations: Aggregations {
            edges: e,
            width,
            passes: 1.0 + backward,
        },
        attention_cols: 0.0,
    }
}

/// GAT's layer (`nn::gat`), `o` the product's width (all heads): forward projects every
/// source (`h·W`), then the attention — each node's logits, a softmax per edge and head, the
/// weighted aggregation of `o` columns per edge — and backward the attention's gradients and
/// the projection's weight gradient (and input gradient when needed). The products are priced
/// as GEMM, the attention per edge-column by its own calibrated operator (on the 2-core VM
/// 3.5 ns per edge-column forward and backward, against 0.3 ns for one mean aggregation;
/// priced as aggregations, GAT steps came out 40-60 % under their measured time).
pub fn gat_layer_work(
    (i, o): (f64, f64),
    (_nd, ns, e): (f64, f64, f64),
    need_src: bool,
) -> LayerWork {
    LayerWork {
        forward: Products {
            flops: 2.0 * ns * i * o,
            bytes: 4.0 * (ns * i + i * o + ns * o),
            calls: 1.0,
            inner: i,
            cols: o,
        },
        input_gradient: need_src,
        aggregations: Aggregations::default(),
        attention_cols: e * o,
    }
}

/// Train-phase seconds of `c`'s layers, the input layer computed in `order`; `scanned`: a
/// sparse input layer first finds the non-zeros of dense rows (else its rows came as CSR).
/// Everything is priced layer by layer: the products by their flops and their bytes beyond
/// the core's own caches per call, the backward forms (weight and input gradients) at their
/// measured ratios to the forward ([`LayerWork::product_seconds`]), the aggregations, attention
/// and activations by their calibrated operators.
fn compute(shape: &ModelShape, cal: &Calibration, c: &Counts, order: Order, scanned: bool) -> f64 {
    (0..shape.in_w.len())
        .map(|l| {
            let rows = (c.dst[l], c.src[l], c.edges[l]);
            activation(shape, cal, l, c.dst[l]) + layer(shape, cal, l, rows, order, scanned)
        })
        .sum()
}

/// Every layer but the last activates its `nd` output rows, and backward scales their
/// gradient by what the activation kept: two passes over `dst × out` values each way.
fn activation(shape: &ModelShape, cal: &Calibration, l: usize, nd: f64) -> f64 {
    if l + 1 < shape.in_w.len() {
        cal.op("elementwise")
            .seconds(16.0 * nd * shape.out_w[l], 2.0)
    } else {
        0.0
    }
}

/// Layer `l`'s products and aggregations (or attention) over a block of `nd` destinations,
/// `ns` sources and `e` edges, forward and backward; the input layer in `order`.
fn layer(
    shape: &ModelShape,
    cal: &Calibration,
    l: usize,
    (nd, ns, e): (f64, f64, f64),
    order: Order,
    scanned: bool,
) -> f64 {
    let (i, o) = (shape.in_w[l], shape.out_w[l]);
    if l == 0 {
        if let Some(nnz) = shape.input_nnz {
            return sparse_input_layer(shape.kind, cal, (i, o), (nd, ns, e), nnz, scanned);
        }
    }
    let w = layer_work(
        shape.kind,
        (i, o),
        (nd, ns, e),
        l > 0,
        if l == 0 { order } else { Order::Cheaper },
    );
    // GAT's layers run one attention (forward and backward) each instead of aggregations.
    w.product_seconds(cal)
        + if w.attention_cols > 0.0 {
            cal.op("attention").seconds(w.attention_cols, 1.0)
        } else {
            w.aggregations.seconds(cal)
        }
}

/// An input layer on sparse rows (`nnz` stored per row, `i` columns dense): the scan that
/// finds the non-zeros when they came dense (`scanned`: the dense rows read once, priced as
/// the gather's bytes), the products
/// with the non-zeros only (`spmm`: forward `x·W` of every source, SAGE's root term on the
/// destinations too, and the weight gradients `xᵀ·d` as many; by their non-zeros and the row
/// of `o` columns each reads), and the aggregation at the
/// output width forward and transposed backward (always projected first). No input gradient.
fn sparse_input_layer(
    kind: ModelKind,
    cal: &Calibration,
    (i, o): (f64, f64),
    (nd, ns, e): (f64, f64, f64),
    nnz: f64,
    scanned: bool,
) -> f64 {
    let k = if kind == ModelKind::Sage { 2.0 } else { 1.0 };
    let rows = ns + (k - 1.0) * nd;
    // Both products read each non-zero once, and with it a row of `o` columns.
    let reads = 2.0 * nnz * rows;
    let scan = if scanned {
        cal.op("gather").seconds_touching(ns, ns * i * 4.0, 1.0)
    } else {
        0.0
    };
    let aggregations = Aggregations {
        edges: e,
        width: o,
        passes: 2.0,
    };
    scan + cal.op("spmm").seconds_touching(reads, reads * o * 4.0, k) + aggregations.seconds(cal)
}

/// How a batch's input rows are made ([`load`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rows {
    /// Dense rows gathered on the host (and copied up to a device).
    Dense,
    /// Assembled as CSR (`FeatureStore::gather_input`): own rows' entries copied from the
    /// store's CSR copy, served rows encoded from it, fetched rows' entries written straight
    /// from their packed words, cached rows (dense) scanned, and on a device the CSR goes up,
    /// not dense rows. An entry is a column and a value (8 bytes).
    Csr,
    /// Own and cached rows gathered on the device from its resident copy (a gather there is
    /// not priced: it runs at device bandwidth); only fetched rows are made on the host and
    /// copied up (`FeatureStore::place_input`).
    Resident,
}

impl Rows {
    /// Dense rows, gathered on the device where the ranks keep their own rows there.
    fn dense_or_resident(shape: &ModelShape) -> Rows {
        if shape.resident_rows {
            Rows::Resident
        } else {
            Rows::Dense
        }
    }

    /// How a whole input block's rows are made (GDP's batches, split's input layer, DNP's and
    /// SNP's owners): as CSR
    /// where every rank's store keeps a CSR copy and the input layer takes sparse rows
    /// (`csr_batches`), else dense as [`Rows::dense_or_resident`].
    fn of_input_block(shape: &ModelShape) -> Rows {
        if shape.csr_batches && shape.input_nnz.is_some() {
            Rows::Csr
        } else {
            Rows::dense_or_resident(shape)
        }
    }
}

/// The input feature rows' load phase and bytes: local gather, fetch, device copy, for rows
/// made as `rows` says.
fn load(shape: &ModelShape, cal: &Calibration, c: &Counts, a2a: &str, rows: Rows) -> RankCost {
    let row = shape.in_w[0] * 4.0;
    // A fetched row: its 8-byte id out and the row back, dense or as the store packs it.
    let wire = shape.packed_row_bytes.unwrap_or(row);
    let fetched = c.input_remote * (wire + 8.0);
    // Every row the rank reads (its own, cached, served) or places (fetched) is looked up
    // and written once; `gathered` the bytes those reads and writes touch.
    let every_row = c.input_local + c.input_cached + c.input_served + c.input_remote;
    let (read, gathered, copied_up) = if rows == Rows::Resident {
        // Served rows are still read for the ranks that fetch them.
        (
            c.input_remote + c.input_served,
            (c.input_remote + c.input_served) * row,
            c.input_remote * row,
        )
    } else if rows == Rows::Csr {
        let entries = shape.input_nnz.unwrap_or(shape.in_w[0]) * 8.0;
        (
            every_row,
            (c.input_local + c.input_served + c.input_remote) * entries + c.input_cached * row,
            (c.input_local + c.input_cached + c.input_remote) * (entries + 8.0),
        )
    } else {
        // Rows the feature cache serves are read locally like own rows; a packed row is also
        // written out whole at its receiver, straight into the batch.
        let decoded = if shape.packed_row_bytes.is_some() {
            c.input_remote
        } else {
            0.0
        };
        (
            every_row,
            (c.input_local + c.input_cached + c.input_served + decoded) * row,
            (c.input_local + c.input_cached + c.input_remote) * row,
        )
    };
    // CSR rows are assembled from the store's sparse copy, a path of its own per row.
    let mut s = if rows == Rows::Csr {
        cal.op("gather_sparse")
            .seconds_touching(read, gathered, 2.0)
    } else {
        dense_gather(shape, cal, read, gathered, 2.0)
    };
    if c.input_remote + c.input_served > 0.0 {
        // Two exchanges: the ids out, the rows back.
        let ids = 8.0 * c.input_remote;
        s += cal.op(a2a).seconds(ids, 1.0)
            + cal.op(a2a).seconds_rows(fetched - ids, c.input_remote, 1.0);
    }
    // Nothing goes up where the device holds every row (a call per batch otherwise).
    let upload = if shape.device && copied_up > 0.0 {
        cal.op("h2d").seconds(copied_up, 1.0)
    } else {
        0.0
    };
    RankCost {
        phases: Phases {
            build: build(cal, c, a2a),
            load: s + upload,
            ..Phases::default()
        },
        bytes: fetched,
        upload,
    }
}

/// A dense gather from the store of `rows` rows touching `bytes` in `calls` calls: priced
/// through the gathers from a table the host's cache holds (`gather`) and, for the share of
/// the store it cannot ([`Calibration::far_share`]), through those from one far larger
/// (`gather_far`). CSR rows come from the store's sparse copy, a small share of its dense
/// bytes, and are priced by `gather_sparse` alone.
fn dense_gather(shape: &ModelShape, cal: &Calibration, rows: f64, bytes: f64, calls: f64) -> f64 {
    let near = cal.op("gather").seconds_touching(rows, bytes, calls);
    let far_share = cal.far_share(shape.store_bytes);
    if far_share == 0.0 {
        return near;
    }
    let far = cal.op("gather_far").seconds_touching(rows, bytes, calls);
    near + far_share * (far - near).max(0.0)
}

/// The operator of partial sums exchanged among the ranks whose row exchanges are `a2a`:
/// rows sent as they were computed and added into their destinations on receipt, gradients
/// gathered and sent back (SNP's and NFP's partial sums). Priced apart from the row exchange,
/// which packs and places rows by id on both sides: at 4 MiB on the 2-core EPYC VM the ready
/// rows cost 0.35-0.5× a row exchange of the same bytes, and SNP's 4-rank shuffle, priced as
/// row exchanges, came out at 1.6× its measured time (`auto-replan-2026-11-28c.md`).
pub fn partial_sums_op(a2a: &str) -> &'static str {
    match a2a {
        "alltoallv_node" => "partial_sums_node",
        _ => "partial_sums_world",
    }
}

/// The build phase: sampling the blocks' edges and the id exchanges while sampling.
fn build(cal: &Calibration, c: &Counts, a2a: &str) -> f64 {
    cal.op("sample").seconds(c.sampled_edges, 1.0)
        + cal.op(a2a).seconds(c.sample_bytes, c.sample_calls)
}

/// GDP: every rank computes its own seeds' whole tree; remote input rows are fetched (as
/// CSR entries where its batches come as CSR).
pub fn gdp(shape: &ModelShape, cal: &Calibration, c: &Counts, a2a: &str) -> RankCost {
    let rows = Rows::of_input_block(shape);
    let mut r = load(shape, cal, c, a2a, rows);
    r.phases.train = compute(shape, cal, c, Order::Cheaper, rows != Rows::Csr);
    r
}

/// The local side of a shuffle the calibrated row exchange leaves out (it times only rows
/// that cross ranks): `copied` bytes of rows gathered or scattered by index on this rank and
/// `zeroed` bytes of fresh matrices written whole.
fn local_side(cal: &Calibration, copied: f64, zeroed: f64) -> f64 {
    cal.op("gather").seconds_touching(0.0, copied, 0.0) + cal.op("elementwise").seconds(zeroed, 0.0)
}

/// Split: each (layer, vertex) on its owner; cross-rank rows of every layer above the input
/// shuffled forward and their gradients backward. Around each exchange (`layer_input` and
/// its backward) the layer's own source rows are copied in and their gradients out, its
/// remote rows' gradients gathered to be sent, and both results start as zeroed matrices
/// (the layer's sources forward, the previous layer's rows backward).
pub fn split(shape: &ModelShape, cal: &Calibration, c: &Counts, a2a: &str) -> RankCost {
    let rows = Rows::of_input_block(shape);
    let mut r = load(shape, cal, c, a2a, rows);
    let (mut bytes, mut exchanges) = (0.0, 0.0);
    let (mut copied, mut zeroed) = (0.0, 0.0);
    for l in 1..shape.in_w.len() {
        let row = shape.in_w[l] * 4.0;
        // The layer's rows forward and their gradients back: two exchanges of its size.
        bytes += 2.0 * c.rows_in[l] * row;
        exchanges += cal
            .op(a2a)
            .seconds_rows(2.0 * c.rows_in[l] * row, 2.0 * c.rows_in[l], 2.0);
        let own = (c.src[l] - c.rows_in[l]).max(0.0);
        copied += (2.0 * own + c.rows_in[l]) * row;
        zeroed += (c.src[l] + c.dst[l - 1]) * row;
    }
    r.phases.shuffle = exchanges + local_side(cal, copied, zeroed);
    r.phases.train = compute(shape, cal, c, Order::Cheaper, rows != Rows::Csr);
    r.bytes += bytes;
    r
}

/// The local side of DNP's and SNP's exchange of the input layer's rows
/// ([`crate::train::owner_input`]'s plan): a rank's own rows of layer 1's sources (its
/// frontier, `src[1]`, less the `hidden_rows` that cross ranks) travel through the exchange
/// too — packed, copied to itself and placed forward; their gradients scattered, copied and
/// added back — six passes over rows the calibrated exchange does not time.
fn own_hidden_rows(shape: &ModelShape, cal: &Calibration, c: &Counts) -> f64 {
    let frontier = c.src.get(1).copied().unwrap_or(0.0);
    let own = (frontier - c.hidden_rows).max(0.0);
    local_side(cal, 6.0 * own * shape.out_w[0] * 4.0, 0.0)
}

/// DNP: the input layer on the destinations' owners (their remote feature rows fetched, made
/// as GDP's batches are), its hidden rows sent to the requesters and their gradients back;
/// GDP above.
pub fn dnp(shape: &ModelShape, cal: &Calibration, c: &Counts, a2a: &str) -> RankCost {
    let rows = Rows::of_input_block(shape);
    let mut r = load(shape, cal, c, a2a, rows);
    let bytes = 2.0 * c.hidden_rows * shape.out_w[0] * 4.0;
    r.phases.shuffle =
        cal.op(a2a).seconds_rows(bytes, 2.0 * c.hidden_rows, 2.0) + own_hidden_rows(shape, cal, c);
    r.phases.train = compute(shape, cal, c, Order::Cheaper, rows != Rows::Csr);
    r.bytes += bytes;
    r
}

/// SNP: DNP's exchange of hidden rows, no feature fetch, and partial sums of layer-1 width
/// from the sources' owners (gradients back); own rows read as GDP reads them (CSR, dense on
/// the host, or on the device). Building the partial sums' plan (while the batch is
/// prepared) routes every input edge to its source's owner — an id and a weight, 8 bytes an
/// edge, in two exchanges — and de-duplicates the sources per owner, a block build's work per
/// edge: priced as sampling the input block's edges once more (unpriced, SNP's build phase
/// measured 2-4× its prediction on Facebook's 2-rank grid). Each exchange is priced at its
/// own size; the partial sums by [`partial_sums_op`], as they travel.
pub fn snp(shape: &ModelShape, cal: &Calibration, c: &Counts, a2a: &str) -> RankCost {
    // Sparse rows come from the store's CSR copy as GDP's do, never dense.
    let rows = Rows::of_input_block(shape);
    let mut r = load(shape, cal, c, a2a, rows);
    let exchange = cal.op(a2a);
    r.phases.build += cal.op("sample").seconds(c.edges[0], 0.0)
        + 2.0 * exchange.seconds(4.0 * c.remote_edges, 1.0);
    let h = shape.out_w[0] * 4.0;
    let bytes = 2.0 * (c.hidden_rows + c.partial_rows) * h + 8.0 * c.remote_edges;
    // Hidden rows and partial sums forward, and their gradients back. The rank's own
    // partial sums pass through the exchange too: copied to itself and added forward,
    // gathered and copied backward (four passes the calibrated exchange, which times only
    // rows that cross ranks, leaves out), into sums that start as zeros, a row per
    // destination.
    let own_partials = local_side(cal, 4.0 * c.own_partials * h, c.dst[0] * h);
    r.phases.shuffle = 2.0 * exchange.seconds_rows(c.hidden_rows * h, c.hidden_rows, 1.0)
        + 2.0
            * cal
                .op(partial_sums_op(a2a))
                .seconds(c.partial_rows * h, 1.0)
        + own_partials
        + own_hidden_rows(shape, cal, c);
    r.phases.train = compute(shape, cal, c, Order::ProjectFirst, rows != Rows::Csr);
    r.bytes += bytes;
    r
}

/// NFP (node-feature parallel) on rank `r`, from every rank's GDP counts `all`: each rank
/// holds a `1/P` column slice of every feature row and of W1's rows. The layer-1 blocks are
/// allgathered (ids and edges), every rank computes layer 1 for all ranks' destinations at
/// the slice width from its own columns (no feature row moves), the partial rows of hidden
/// width are reduce-scattered to the destinations' owners (and their gradients back), and the
/// layers above are data parallel as in GDP.
pub fn nfp(
    shape: &ModelShape,
    cal: &Calibration,
    all: &[&Counts],
    r: usize,
    a2a: &str,
) -> RankCost {
    let p = all.len() as f64;
    let sum = |f: &dyn Fn(&Counts) -> f64| all.iter().map(|c| f(c)).sum::<f64>();
    let (dst, src, edges) = (sum(&|c| c.dst[0]), sum(&|c| c.src[0]), sum(&|c| c.edges[0]));
    let slice = shape.nfp_width(r, all.len());
    let mine = all[r];
    let hidden = shape.out_w[0] * 4.0;
    let blocks = src * 8.0 + edges * 4.0 + dst * 8.0;
    let recv = (p - 1.0) * mine.dst[0] * hidden;
    let sent = (dst - mine.dst[0]) * hidden;
    let partials = 2.0 * recv.max(sent);
    // Mostly-zero features: the store keeps each slice as CSR too (a slice of at least
    // MIN_SPARSE_COLS columns; the slices are cut to equal non-zeros, `columns::by_nonzeros`)
    // and a step's rows are gathered from it, entries only (`Nfp::slice_rows`); else dense.
    let csr = shape.input_nnz.filter(|_| slice >= MIN_SPARSE_COLS as f64);
    let sliced = ModelShape {
        in_w: std::iter::once(slice)
            .chain(shape.in_w[1..].iter().copied())
            .collect(),
        // A column slice holds about its share of a row's non-zeros (the slices are cut to
        // equal non-zeros); one narrower than the sparse path takes is multiplied dense.
        input_nnz: csr.map(|z| z / p),
        csr_batches: false,
        ..shape.clone()
    };
    // One gather of the stacked block's rows (every rank's input rows).
    let (mut load, bytes) = match csr {
        Some(nnz) => {
            let bytes = src * (nnz / p * 8.0 + 8.0);
            (
                cal.op("gather_sparse").seconds_touching(src, bytes, 1.0),
                bytes,
            )
        }
        None => {
            let bytes = src * slice * 4.0;
            (dense_gather(shape, cal, src, bytes, 1.0), bytes)
        }
    };
    let upload = if shape.device {
        cal.op("h2d").seconds(bytes, 1.0)
    } else {
        0.0
    };
    load += upload;
    // The rows' copies on this rank that the calibrated partial sums leave out (they time
    // the peers' rows only): forward, this rank's own rows passed to itself and added into a
    // zeroed sum; backward, its own gradient rows gathered and passed to itself. (The
    // stacked block's partial rows are the send buffer, and its gradient rows are read where
    // they arrive: neither is copied.)
    let own = mine.dst[0] * hidden;
    let (shuffle, allgather) = if p > 1.0 {
        (
            cal.op(partial_sums_op(a2a)).seconds(partials, 2.0) + local_side(cal, 4.0 * own, own),
            cal.op("allgatherv").seconds(blocks, 1.0),
        )
    } else {
        (0.0, 0.0)
    };
    RankCost {
        phases: Phases {
            // Every rank holds the whole topology and samples its seeds' blocks itself: no
            // ids are routed to owners. The input blocks' allgather (ids and edges, as the
            // other strategies' id exchanges while sampling) is part of building the step,
            // where training times it too (`Nfp`'s sample phase).
            build: cal.op("sample").seconds(mine.sampled_edges, 1.0) + allgather,
            load,
            shuffle,
            train: sliced_train(&sliced, cal, (dst, src, edges), mine, csr.is_none()),
            ..Phases::default()
        },
        bytes: if p > 1.0 { blocks + partials } else { 0.0 },
        upload,
    }
}

/// NFP's model phase on a rank whose own counts are `mine` (`shape` cut to its slice of the
/// input columns): the input layer once over every rank's block stacked into one, as
/// `Nfp::step` runs it (`stacked`: the blocks' destinations, sources and edges summed, as
/// `Block::stacked` makes them), its activation on the rows this rank owns once the partial
/// sums are in, and the layers above on this rank's own blocks.
fn sliced_train(
    shape: &ModelShape,
    cal: &Calibration,
    stacked: (f64, f64, f64),
    mine: &Counts,
    scanned: bool,
) -> f64 {
    let input = if stacked.0 > 0.0 {
        layer(shape, cal, 0, stacked, Order::Cheaper, scanned)
    } else {
        0.0
    };
    let upper: f64 = (1..shape.in_w.len())
        .map(|l| {
            layer(
                shape,
                cal,
                l,
                (mine.dst[l], mine.src[l], mine.edges[l]),
                Order::Cheaper,
                scanned,
            )
        })
        .sum();
    let activations: f64 = (0..shape.in_w.len())
        .map(|l| activation(shape, cal, l, mine.dst[l]))
        .sum();
    input + upper + activations
}

/// The parameters whose gradients `strategy`'s ranks allreduce: all of them, except under NFP,
/// whose ranks keep the gradients of their slices of the first layer's weights
/// (`Nfp::unsynced_ranges`; the matrices lead the buffer, so the rest is one call). Priced as
/// the whole buffer, NFP's sync came out at 2-8× its measured time on the 2-rank grid,
/// where the first layer holds most of the parameters (R-MAT, 64 features × 1024: 131k of
/// 147k).
fn params_synced(shape: &ModelShape, strategy: &str, ranks: usize) -> f64 {
    (shape.params - sliced_weights(shape, strategy, ranks)).max(0.0)
}

/// The parameters the busiest rank of `strategy` holds and updates: all of them, except under
/// NFP, whose ranks hold a row slice of the first layer's weights, the widest slice's rank the
/// most (on Facebook's two ranks, sliced by non-zeros, 87 % of them: 10× the other's Adam).
fn params_held(shape: &ModelShape, strategy: &str, ranks: usize) -> f64 {
    let sliced = sliced_weights(shape, strategy, ranks);
    if sliced == 0.0 {
        return shape.params;
    }
    shape.params - sliced * (1.0 - shape.nfp_widest(ranks) / shape.in_w[0])
}

/// The weights `strategy` slices across its `ranks`: NFP's first-layer matrices (two for
/// SAGE), cut by rows on several ranks; none otherwise.
fn sliced_weights(shape: &ModelShape, strategy: &str, ranks: usize) -> f64 {
    if strategy != "nfp" || ranks < 2 {
        return 0.0;
    }
    let mats = if shape.kind == ModelKind::Sage {
        2.0
    } else {
        1.0
    };
    mats * shape.in_w[0] * shape.out_w[0]
}

/// How much faster `W` prefetch workers prepare batches than one: `√W`. A batch's own
/// sampling already runs on the rank's threads, so whole batches in parallel gain only what
/// one batch leaves idle; fitted to the 16-core GPU host (200k SBM, H100), where 4 workers
/// made the epoch 1.4-1.9× faster than 1.
fn prefetch_speedup(workers: usize) -> f64 {
    (workers.max(1) as f64).sqrt()
}

/// A step when prefetch workers prepare batches while the device trains (GDP; split, DNP and
/// SNP on several ranks): the training thread's work (uploading the rows, the hidden-row
/// shuffles, the model, the allreduce, the optimizer) and the workers' (sampling, gathering
/// and fetching the rows) overlap, so the slower bounds it.
pub fn prefetched_step(phases: &Phases, upload: f64, workers: usize) -> f64 {
    let prepared = phases.build + phases.load - upload;
    let trained = upload + phases.shuffle + phases.train + phases.sync + phases.optimizer;
    trained.max(prepared / prefetch_speedup(workers))
}

/// Price every candidate in `allowed` (others are priced too where the counts allow, but not
/// pickable) and choose the cheapest pickable one; ties go to the earlier candidate. `a2a` is
/// the alltoallv operator of the ranks sharing a mini-batch.
pub fn predict(
    dry: &DryRun,
    shape: &ModelShape,
    cal: &Calibration,
    allowed: &[&str],
    a2a: &str,
) -> Prediction {
    let ranks = dry.ranks.len();
    let gradient_bytes = shape.params * 4.0;
    let sync_ranks = shape.sync_ranks.max(ranks);
    // The gradient allreduce of `synced` parameters and the loss's; a device's gradients go
    // through the host whole (the buffer is copied down and up, synced or not).
    let sync_of = |synced: f64| {
        if sync_ranks < 2 {
            return 0.0;
        }
        let staging = if shape.staged_gradients {
            cal.op("d2h").seconds(gradient_bytes, 1.0) + cal.op("h2d").seconds(gradient_bytes, 1.0)
        } else {
            0.0
        };
        cal.op("allreduce").seconds(synced * 4.0, 1.0)
            + cal.op("allreduce").seconds(32.0, 1.0)
            + staging
    };
    let distinct: Vec<f64> = (0..shape.in_w.len())
        .map(|l| dry.of("split").iter().map(|c| c.dst[l]).sum())
        .collect();
    let mut strategies = BTreeMap::new();
    for &name in CANDIDATES {
        let sampled = if name == "nfp" { "gdp" } else { name };
        let counts = dry.of(sampled);
        // Each dry-run batch priced on its own, the slowest rank bounding each phase, and the
        // batches' phases averaged: a step waits for whichever rank is slowest in that batch.
        let each = dry.of_each_batch(sampled);
        let share = 1.0 / each.len().max(1) as f64;
        let (mut phases, mut upload, mut bytes) = (Phases::default(), 0.0, 0.0);
        for counts in &each {
            let per_rank: Vec<RankCost> = (0..ranks)
                .map(|r| match name {
                    "gdp" => gdp(shape, cal, counts[r], a2a),
                    "split" => split(shape, cal, counts[r], a2a),
                    "dnp" => dnp(shape, cal, counts[r], a2a),
                    "snp" => snp(shape, cal, counts[r], a2a),
                    "nfp" => nfp(shape, cal, counts, r, a2a),
                    _ => unreachable!("every candidate is priced"),
                })
                .collect();
            let slowest = per_rank
                .iter()
                .fold(Phases::default(), |m, c| m.max(&c.phases));
            phases = phases.plus(&slowest, share);
            upload += share * per_rank.iter().map(|c| c.upload).fold(0.0, f64::max);
            bytes += share * per_rank.iter().map(|c| c.bytes).sum::<f64>();
        }
        phases.sync = sync_of(params_synced(shape, name, ranks));
        phases.optimizer = cal
            .op("optimizer")
            .seconds(params_held(shape, name, ranks), 1.0);
        // The ranks drift apart over the step's work and wait for each other at its
        // collectives (`drift`, a share of the work; 0 on one rank). The waits fall in every
        // phase that ends in a collective; they are charged to sync, where the last falls.
        phases.sync += cal.op("drift").seconds(phases.total() - phases.sync, 0.0);
        let computed: Vec<f64> = (0..shape.in_w.len())
            .map(|l| counts.iter().map(|c| c.dst[l]).sum())
            .collect();
        let redundant_rows = if name == "nfp" {
            0.0
        } else {
            computed
                .iter()
                .zip(&distinct)
                .map(|(c, d)| (c - d).max(0.0))
                .sum()
        };
        let buildable = name.parse::<Strategy>().is_ok();
        let note = if !buildable {
            Some(format!(
                "predicted only: this build has no `--strategy {name}`"
            ))
        } else if !allowed.contains(&name) {
            Some("not for this configuration".into())
        } else {
            None
        };
        let pickable = note.is_none();
        let prefetched = name
            .parse::<Strategy>()
            .is_ok_and(|s| prefetches_strategy(s, ranks));
        let (step, note) = match shape.prefetch_workers {
            Some(workers) if prefetched => (
                prefetched_step(&phases, upload, workers),
                note.or_else(|| {
                    Some(format!(
                        "{workers} prefetch worker(s) build and load while the device trains: \
                         the step is the slower side, not the phases' sum"
                    ))
                }),
            ),
            _ => (phases.total(), note),
        };
        strategies.insert(
            name.to_string(),
            StrategyPrediction {
                phases,
                step_seconds: step,
                epoch_seconds: step * dry.epoch_batches as f64,
                bytes_per_step: bytes
                    + if sync_ranks > 1 {
                        sync_ranks as f64 * shape.params * 4.0
                    } else {
                        0.0
                    },
                redundant_rows,
                pickable,
                note,
            },
        );
    }
    let choice = CANDIDATES
        .iter()
        .filter(|n| strategies[**n].pickable)
        .fold(None::<&str>, |best, &n| match best {
            Some(b) if strategies[b].step_seconds <= strategies[n].step_seconds => Some(b),
            _ => Some(n),
        })
        .unwrap_or("gdp")
        .to_string();
    Prediction {
        batches: dry.batches,
        epoch_batches: dry.epoch_batches,
        ranks,
        strategies,
        choice,
        scope: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::calibration::{Calibration, CalibrationKey, Fit, FORMAT, OPERATORS};
    use super::*;

    /// A synthetic machine: 1 GB/s alltoallv with 1 ms latency, 10 ns a row and 10 GB/s
    /// gather (30 ns a row as CSR), 2 GB/s allreduce, 1 GFLOP/s, 1e8 edge-columns per second, free kernel
    /// launches, 10 ns per parameter of the optimizer (10 µs a call), 10 GB/s device copies
    /// (10 µs a call), 10 GB/s activation passes.
    fn machine() -> Calibration {
        let line = |op: &str| match op {
            "alltoallv_world" | "alltoallv_node" => (1e-3, 1e-9),
            "partial_sums_world" | "partial_sums_node" => (1e-3, 5e-10),
            "gather" => (0.0, 1e-8),
            "gather_sparse" => (0.0, 3e-8),
            "allreduce" => (0.0, 5e-10),
            "allgatherv" => (1e-3, 1e-9),
            "gemm" => (0.0, 1e-9),
            "aggregate" => (0.0, 1e-8),
            "sample" => (1e-4, 1e-6),
            "optimizer" => (1e-5, 1e-8),
            "h2d" | "d2h" => (1e-5, 1e-10),
            "elementwise" => (0.0, 1e-10),
            _ => (0.0, 0.0),
        };
        Calibration {
            format: FORMAT,
            key: CalibrationKey {
                host: "test".into(),
                ranks: 2,
                nodes: 1,
                ranks_per_node: 2,
                threads_per_rank: 1,
                device: "CPU".into(),
                version: "0".into(),
            },
            seconds_to_calibrate: 0.0,
            operators: OPERATORS
                .iter()
                .map(|(op, unit)| {
                    let (a, b) = line(op);
                    let mut f = Fit::free(unit);
                    f.latency_s = a;
                    f.per_unit_s = b;
                    if *op == "gather" || *op == "gather_sparse" {
                        f.per_byte_s = 1e-10;
                    }
                    // 1e8 edge-columns (non-zero-columns) per second: a 4-byte column of a
                    // row read per edge (per non-zero).
                    if *op == "aggregate" || *op == "spmm" {
                        (f.per_unit_s, f.per_byte_s) = (0.0, 1e-8 / 4.0);
                    }
                    (op.to_string(), f)
                })
                .collect(),
            shared_cores: None,
            cache_bytes: 32.0 * 1024.0 * 1024.0,
            private_cache_bytes: 0.0,
            far_shares: vec![],
        }
    }

    fn shape() -> ModelShape {
        ModelShape {
            kind: ModelKind::Gcn,
            in_w: vec![100.0, 10.0],
            out_w: vec![10.0, 2.0],
            params: 1000.0,
            device: false,
            staged_gradients: false,
            input_nnz: None,
            packed_row_bytes: None,
            csr_batches: false,
            prefetch_workers: None,
            resident_rows: false,
            sync_ranks: 1,
            store_bytes: 0.0,
            nfp_columns: vec![],
        }
    }

    fn counts(remote: f64) -> Counts {
        Counts {
            sampled_edges: 2200.0,
            sample_bytes: 8000.0,
            sample_calls: 6.0,
            input_local: 1000.0,
            input_remote: remote,
            requests_to: vec![0.0, remote],
            input_served: remote,
            input_cached: 0.0,
            rows_in: vec![remote, 50.0],
            hidden_rows: 20.0,
            partial_rows: 30.0,
            remote_edges: 40.0,
            own_partials: 120.0,
            dst: vec![200.0, 10.0],
            src: vec![1000.0 + remote, 200.0],
            edges: vec![2000.0, 200.0],
        }
    }

    #[test]
    fn row_exchanges_of_narrow_rows_pay_per_row() {
        let mut cal = machine();
        let c = counts(500.0);
        let before = split(&shape(), &cal, &c, "alltoallv_world").phases.shuffle;
        cal.operators.get_mut("alltoallv_world").unwrap().per_row_s = 1e-7;
        let after = split(&shape(), &cal, &c, "alltoallv_world").phases.shuffle;
        // Layer 2's 50 rows of 10 columns each way: 100 rows of 4000 bytes, where rows of the
        // calibrated 64 columns would be 15.625.
        let extra = (100.0 - 4000.0 / 256.0) * 1e-7;
        assert!((after - before - extra).abs() < 1e-15, "{before} {after}");
    }

    #[test]
    fn known_bandwidths_give_known_phases() {
        let cal = machine();
        let c = counts(500.0);
        let r = gdp(&shape(), &cal, &c, "alltoallv_world");
        // Gather: (1000 + 500 served) rows × 400 B at 10 GB/s = 60 µs, and 10 ns for each of
        // those and the 500 fetched rows placed; fetch: 2 ms latency + 500 × 408 B at 1 GB/s.
        let load = 1500.0 * 400.0 * 1e-10 + 2000.0 * 1e-8 + 2e-3 + 500.0 * 408.0 * 1e-9;
        assert!((r.phases.load - load).abs() < 1e-12, "{:?}", r.phases);
        // Build: 2200 sampled edges (0.1 ms a call + 1 µs an edge) and 6 id exchanges moving
        // 8000 bytes.
        let build = 1e-4 + 2200.0 * 1e-6 + 6.0 * 1e-3 + 8000.0 * 1e-9;
        assert!((r.phases.build - build).abs() < 1e-15, "{:?}", r.phases);
        assert_eq!(r.phases.shuffle, 0.0);
        // GCN layer 1 (100 → 10; 200 dst, 1500 src, 2000 edges): aggregating first costs
        // 2000·100 + 200·100·10 = 400k ≤ 1500·100·10 + 2000·10: gemm 2·200·100·10 = 400k
        // flops forward, as many backward (no input gradient); aggregation 200k forward.
        // Layer 2 (10 → 2; 10 dst, 200 src, 200 edges): aggregate first (2000+200 ≤
        // 4000+400): gemm 400 flops, ×3 with the input gradient; aggregation 2000 ×2.
        // Layer 1's 200 × 10 outputs are activated: 16 bytes a value at 10 GB/s.
        let train =
            (800_000.0 + 1200.0) * 1e-9 + (200_000.0 + 4000.0) * 1e-8 + 16.0 * 200.0 * 10.0 * 1e-10;
        assert!((r.phases.train - train).abs() < 1e-12, "{:?}", r.phases);
        assert_eq!(r.bytes, 500.0 * 408.0);

        // Split shuffles layer 2's 50 remote rows of width 10 (40 B) each way; around the
        // exchange its 150 own source rows are copied in and their gradients out, the 50
        // remote gradients gathered (gather, 10 GB/s), and the 200 source rows and layer 1's
        // 200 rows start zeroed (elementwise, 10 GB/s).
        let s = split(&shape(), &cal, &c, "alltoallv_world");
        let local = (2.0 * 150.0 + 50.0) * 40.0 * 1e-10 + 400.0 * 40.0 * 1e-10;
        let shuffle = 2e-3 + 2.0 * 50.0 * 40.0 * 1e-9 + local;
        assert!((s.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", s.phases);
        // DNP: the 20 remote rows of layer 1's width each way, and the rank's 180 own rows of
        // its 200-row frontier six times through the exchange locally.
        let own = 6.0 * 180.0 * 40.0 * 1e-10;
        let d = dnp(&shape(), &cal, &c, "alltoallv_world");
        let shuffle = 2e-3 + 2.0 * 20.0 * 40.0 * 1e-9 + own;
        assert!((d.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", d.phases);
        // SNP: the 20 hidden rows each way as row exchanges (1 GB/s) and the 30 partial
        // sums each way as ready rows (2 GB/s), four calls; its 120 own partial sums four
        // times through the exchange locally (10 GB/s) into 200 zeroed rows (10 GB/s); own
        // hidden rows as DNP; routing its 40 remote edges to their sources' owners (an id
        // and a weight each, two exchanges) and building the plan are the batch's
        // preparation.
        let s = snp(&shape(), &cal, &c, "alltoallv_world");
        let exchanges = 4e-3 + 2.0 * 20.0 * 40.0 * 1e-9 + 2.0 * 30.0 * 40.0 * 5e-10;
        let own_partials = 4.0 * 120.0 * 40.0 * 1e-10 + 200.0 * 40.0 * 1e-10;
        let shuffle = exchanges + own_partials + own;
        assert!((s.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", s.phases);
        let routing = 2.0 * (1e-3 + 40.0 * 4.0 * 1e-9);
        let plan = cal.op("sample").seconds(c.edges[0], 0.0);
        assert!((s.phases.build - r.phases.build - plan - routing).abs() < 1e-15);
    }

    #[test]
    fn the_slowest_rank_bounds_each_phase_and_the_cheapest_is_picked() {
        let cal = machine();
        let mk = |remote: f64| -> [Counts; 4] { std::array::from_fn(|_| counts(remote)) };
        let mut ranks = vec![mk(100.0), mk(900.0)];
        // Rank 0 samples slower, rank 1 fetches more: the step pays both.
        ranks[0][0].sampled_edges = 500_000.0;
        let dry = DryRun::uniform(2, 10, ranks);
        let p = predict(
            &dry,
            &shape(),
            &cal,
            &["gdp", "split", "dnp", "snp"],
            "alltoallv_world",
        );
        let g = &p.strategies["gdp"];
        let slow_load = gdp(&shape(), &cal, &dry.ranks[1][0], "alltoallv_world")
            .phases
            .load;
        let slow_build = 1e-4 + 500_000.0 * 1e-6 + 6.0 * 1e-3 + 8000.0 * 1e-9;
        assert!(
            (g.phases.build - slow_build).abs() < 1e-15,
            "{:?}",
            g.phases
        );
        assert_eq!(g.phases.load, slow_load);
        assert!((g.phases.sync - 4000.0 * 5e-10 - 32.0 * 5e-10).abs() < 1e-18);
        // Every rank updates its 1000 parameters: 10 µs + 1000 × 10 ns.
        assert!((g.phases.optimizer - (1e-5 + 1000.0 * 1e-8)).abs() < 1e-18);
        assert!((g.step_seconds - g.phases.total()).abs() < 1e-18);
        assert!((g.epoch_seconds - 10.0 * g.step_seconds).abs() < 1e-12);
        // GDP samples slowest here (0.5 s on rank 0), so another strategy wins; NFP is priced but
        // not pickable where it is not allowed.
        assert_ne!(p.choice, "gdp");
        let best = p
            .strategies
            .iter()
            .filter(|(_, s)| s.pickable)
            .map(|(_, s)| s.step_seconds)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(p.strategies[&p.choice].step_seconds, best);
        assert!(!p.strategies["nfp"].pickable);
        assert!(p.strategies["nfp"].step_seconds > 0.0);
        // Not allowed: priced, never picked.
        let p2 = predict(&dry, &shape(), &cal, &["gdp"], "alltoallv_world");
        assert_eq!(p2.choice, "gdp");
    }

    #[test]
    fn each_batch_waits_for_its_own_slowest_rank() {
        let cal = machine();
        let mk = |remote: f64| -> [Counts; 4] { std::array::from_fn(|_| counts(remote)) };
        // Rank 0 fetches 900 rows in batch 0 and 100 in batch 1, rank 1 the other way round:
        // their means are even, yet every step waits for a rank fetching 900.
        let (heavy, light) = (mk(900.0), mk(100.0));
        let even = DryRun::uniform(2, 2, vec![mk(500.0), mk(500.0)]);
        let alternating = DryRun {
            per_batch: vec![
                vec![heavy.clone(), light.clone()],
                vec![light.clone(), heavy.clone()],
            ],
            ..even.clone()
        };
        let all = ["gdp", "split", "dnp", "snp"];
        let p_even = predict(&even, &shape(), &cal, &all, "alltoallv_world");
        let p_alt = predict(&alternating, &shape(), &cal, &all, "alltoallv_world");
        let load = |c: &Counts| gdp(&shape(), &cal, c, "alltoallv_world").phases.load;
        assert_eq!(
            p_even.strategies["gdp"].phases.load,
            load(&even.ranks[0][0])
        );
        assert!((p_alt.strategies["gdp"].phases.load - load(&heavy[0])).abs() < 1e-15);
        assert!(
            p_alt.strategies["gdp"].step_seconds > p_even.strategies["gdp"].step_seconds,
            "{:?} against {:?}",
            p_alt.strategies["gdp"],
            p_even.strategies["gdp"]
        );
        // Bytes add up over ranks whichever way the batches fall.
        let bytes = |p: &Prediction| p.strategies["gdp"].bytes_per_step;
        assert!((bytes(&p_alt) - bytes(&p_even)).abs() < 1e-9 * bytes(&p_even));
    }

    /// A dry run of one batch on two ranks with the same counts.
    fn two_even_ranks() -> DryRun {
        DryRun::uniform(1, 1, vec![std::array::from_fn(|_| counts(500.0)); 2])
    }

    #[test]
    fn nfp_allreduces_all_but_its_sliced_first_layer() {
        let dry = two_even_ranks();
        // 100 × 10 first-layer weights, 32 parameters more (biases, the second layer).
        let shape = ModelShape {
            params: 1032.0,
            ..shape()
        };
        let p = predict(&dry, &shape, &machine(), &["gdp", "nfp"], "alltoallv_world");
        let loss = 32.0 * 5e-10;
        let gdp = &p.strategies["gdp"].phases;
        let nfp = &p.strategies["nfp"].phases;
        assert!(
            (gdp.sync - 1032.0 * 4.0 * 5e-10 - loss).abs() < 1e-18,
            "{gdp:?}"
        );
        assert!(
            (nfp.sync - 32.0 * 4.0 * 5e-10 - loss).abs() < 1e-18,
            "{nfp:?}"
        );
    }

    #[test]
    fn the_ranks_drift_is_a_share_of_the_steps_work_charged_to_sync() {
        let dry = two_even_ranks();
        let all = ["gdp", "split", "dnp", "snp"];
        let still = predict(&dry, &shape(), &machine(), &all, "alltoallv_world");
        let mut drifting = machine();
        drifting.operators.get_mut("drift").unwrap().per_unit_s = 0.1;
        let p = predict(&dry, &shape(), &drifting, &all, "alltoallv_world");
        for s in all {
            let (a, b) = (&still.strategies[s].phases, &p.strategies[s].phases);
            let work = a.total() - a.sync;
            assert!(
                (b.sync - a.sync - 0.1 * work).abs() < 1e-15,
                "{s}: {a:?} {b:?}"
            );
            assert_eq!(b.train, a.train);
        }
    }

    #[test]
    fn snp_projects_every_source_of_its_input_layer_first() {
        let cal = machine();
        let c = counts(500.0);
        // Layer 1 (100 → 10; 200 dst, 1500 src, 2000 edges) projected first on the owners:
        // 2·1500·100·10 = 3M flops forward, as many backward; aggregation at width 10,
        // 20k forward and 20k transposed. Layer 2 and the activation as GDP prices them.
        let activation = 16.0 * 200.0 * 10.0 * 1e-10;
        let train = (6_000_000.0 + 1200.0) * 1e-9 + (40_000.0 + 4000.0) * 1e-8 + activation;
        let s = snp(&shape(), &cal, &c, "alltoallv_world");
        assert!((s.phases.train - train).abs() < 1e-12, "{:?}", s.phases);
        // Its partial sums' plan costs the input block's 2000 edges at the sampler's 1 µs, and
        // routing the 40 remote edges two exchanges.
        let g = gdp(&shape(), &cal, &c, "alltoallv_world");
        let routing = 2.0 * cal.op("alltoallv_world").seconds(40.0 * 4.0, 1.0);
        assert!((s.phases.build - g.phases.build - 2000.0 * 1e-6 - routing).abs() < 1e-15);
        // GDP aggregates first there, which is cheaper on these counts.
        assert!(gdp(&shape(), &cal, &c, "alltoallv_world").phases.train < s.phases.train);
    }

    #[test]
    fn rows_of_mostly_zero_features_are_priced_as_the_store_sends_them() {
        // Facebook: 4,714 columns, 0.3 % non-zero: a count word and 14 (column, value) pairs.
        let facebook = ModelShape::packed_row_bytes(4714.0, 0.003).expect("packed");
        assert!((facebook - 4.0 * (1.0 + 2.0 * 0.003 * 4714.0)).abs() < 1e-9);
        // Mostly non-zero features travel dense; a packed row is never longer than dense.
        assert_eq!(ModelShape::packed_row_bytes(100.0, 0.9), None);
        assert!(ModelShape::packed_row_bytes(100.0, 0.499).unwrap() <= 404.0);
        let cal = machine();
        let c = counts(500.0);
        let packed = ModelShape {
            packed_row_bytes: Some(40.0),
            ..shape()
        };
        let (dense, sparse) = (
            load(&shape(), &cal, &c, "alltoallv_world", Rows::Dense),
            load(&packed, &cal, &c, "alltoallv_world", Rows::Dense),
        );
        // 360 bytes less per fetched row on the wire, and each one decoded at the receiver
        // (a gather's bytes of a dense row).
        assert_eq!(dense.bytes - sparse.bytes, 500.0 * 360.0);
        let wire = cal.op("alltoallv_world");
        let gather = cal.op("gather");
        let expect = dense.phases.load - wire.seconds(500.0 * 408.0, 2.0)
            + wire.seconds(500.0 * 48.0, 2.0)
            + gather.seconds_touching(
                2000.0,
                (c.input_local + c.input_cached + c.input_served + 500.0) * 400.0,
                2.0,
            )
            - gather.seconds_touching(
                2000.0,
                (c.input_local + c.input_cached + c.input_served) * 400.0,
                2.0,
            );
        assert!(
            (sparse.phases.load - expect).abs() < 1e-12,
            "{:?}",
            sparse.phases
        );
    }

    #[test]
    fn sparse_input_rows_cost_their_non_zeros() {
        let cal = machine();
        let c = counts(500.0);
        let sparse = ModelShape {
            input_nnz: Some(3.0),
            ..shape()
        };
        let r = gdp(&sparse, &cal, &c, "alltoallv_world");
        // Layer 1: scan 1500 dense rows of 400 B (gather), 3 non-zeros × 1500 sources forward
        // and as many for the weight gradient, each reading a row of 10 columns (spmm, by
        // the bytes of those rows), aggregation at width 10
        // forward and transposed, its activation; layer 2 as before.
        let layer1 = 1500.0 * 400.0 * 1e-10
            + 1500.0 * 1e-8
            + 2.0 * 3.0 * 10.0 * 1500.0 * 1e-8
            + 40_000.0 * 1e-8
            + 16.0 * 200.0 * 10.0 * 1e-10;
        let layer2 = 1200.0 * 1e-9 + 4000.0 * 1e-8;
        assert!(
            (r.phases.train - (layer1 + layer2)).abs() < 1e-12,
            "{:?}",
            r.phases
        );
        // Dense rows of 100 columns would cost more.
        assert!(gdp(&shape(), &cal, &c, "alltoallv_world").phases.train > r.phases.train);
    }

    #[test]
    fn gdp_batches_that_come_as_csr_cost_their_entries_and_no_scan() {
        let cal = machine();
        let c = counts(500.0);
        let sparse = ModelShape {
            input_nnz: Some(3.0),
            packed_row_bytes: Some(28.0),
            device: true,
            ..shape()
        };
        let csr = ModelShape {
            csr_batches: true,
            ..sparse.clone()
        };
        let (dense, r) = (
            gdp(&sparse, &cal, &c, "alltoallv_world"),
            gdp(&csr, &cal, &c, "alltoallv_world"),
        );
        // The same words on the wire; 24-byte entries (3 columns and values) gathered for
        // the 1000 own, 500 served and 500 fetched rows instead of 400-byte rows, and 32 bytes
        // a row to the device (entries and an offset).
        assert_eq!(r.bytes, dense.bytes);
        let (gather, sparse_gather) = (cal.op("gather"), cal.op("gather_sparse"));
        let (wire, h2d) = (cal.op("alltoallv_world"), cal.op("h2d"));
        let load = sparse_gather.seconds_touching(2000.0, 2000.0 * 24.0, 2.0)
            + wire.seconds(500.0 * 36.0, 2.0)
            + h2d.seconds(1500.0 * 32.0, 1.0);
        assert!((r.phases.load - load).abs() < 1e-12, "{:?}", r.phases);
        // The input layer no longer scans 1500 dense rows of 400 B.
        let scan = gather.seconds_touching(1500.0, 1500.0 * 400.0, 1.0);
        assert!((dense.phases.train - r.phases.train - scan).abs() < 1e-12);
        // Split's input layer and DNP's owners make their rows the same way.
        for cost in [
            split as fn(&ModelShape, &Calibration, &Counts, &str) -> RankCost,
            dnp,
        ] {
            let (s, d) = (
                cost(&csr, &cal, &c, "alltoallv_world"),
                cost(&sparse, &cal, &c, "alltoallv_world"),
            );
            assert_eq!(s.phases.load, r.phases.load);
            assert!((d.phases.train - s.phases.train - scan).abs() < 1e-12);
        }
    }

    #[test]
    fn products_are_priced_by_their_bytes_too() {
        let mut cal = machine();
        cal.operators.get_mut("gemm").unwrap().per_byte_s = 1e-9;
        let c = counts(500.0);
        let with_bytes = gdp(&shape(), &cal, &c, "alltoallv_world").phases.train;
        let flops_only = gdp(&shape(), &machine(), &c, "alltoallv_world")
            .phases
            .train;
        // Layer 1 aggregates first (200 rows × 100 → 10): 4·(200·100 + 100·10 + 200·10) B per
        // product, forward and weight gradient; layer 2 (10 rows × 10 → 2), three products.
        let bytes = 2.0 * 4.0 * (20_000.0 + 1000.0 + 2000.0) + 3.0 * 4.0 * (100.0 + 20.0 + 20.0);
        assert!((with_bytes - flops_only - bytes * 1e-9).abs() < 1e-12);
        let w = layer_work(
            ModelKind::Sage,
            (100.0, 10.0),
            (200.0, 1500.0, 2000.0),
            true,
            Order::ProjectFirst,
        );
        // SAGE projected first: the neighbour product on 1500 rows, the root one on 200.
        let per = |m: f64| 4.0 * (m * 100.0 + 1000.0 + m * 10.0);
        assert_eq!(w.forward.bytes, per(1500.0) + per(200.0));
        assert_eq!(w.flops(), 3.0 * 2.0 * (1500.0 + 200.0) * 1000.0);
        assert_eq!(w.forward.calls, 2.0, "two products a pass");
        assert_eq!(
            w.forms().collect::<Vec<_>>(),
            Product::ALL,
            "forward, weight and input gradients"
        );
        // Aggregating first, the two weights stack into one product a pass.
        let stacked = layer_work(
            ModelKind::Sage,
            (100.0, 10.0),
            (200.0, 1500.0, 2000.0),
            false,
            Order::Cheaper,
        );
        assert_eq!(stacked.forward.calls, 1.0);
        assert_eq!(stacked.forms().count(), 2, "no input gradient");
    }

    #[test]
    fn aggregations_are_priced_by_edges_and_the_width_of_their_rows() {
        // The input layer aggregates first at its 100 columns, forward only (no gradient
        // passes it); projecting first, at its 10 output columns, forward and transposed.
        let first = layer_work(
            ModelKind::Gcn,
            (100.0, 10.0),
            (200.0, 1500.0, 2000.0),
            false,
            Order::Cheaper,
        );
        let agg = |edges, width, passes| Aggregations {
            edges,
            width,
            passes,
        };
        assert_eq!(first.aggregations, agg(2000.0, 100.0, 1.0));
        let projected = layer_work(
            ModelKind::Gcn,
            (100.0, 10.0),
            (200.0, 1500.0, 2000.0),
            false,
            Order::ProjectFirst,
        );
        assert_eq!(projected.aggregations, agg(2000.0, 10.0, 2.0));
        // Through measured points: 1000 and 10,000 edges each at 16 and 1024 columns, wide
        // rows dearer per column once they outgrow a cache (the largest point).
        let mut cal = machine();
        cal.operators.insert(
            "aggregate".into(),
            Fit {
                by_points: true,
                ..Fit::least_squares_relative_with_bytes(
                    "edge",
                    vec![[1e3, 4e-6], [1e4, 4e-5], [1e3, 1e-4], [1e4, 4e-3]],
                    vec![64e3, 64e4, 4096e3, 4096e4],
                )
            },
        );
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b;
        // A measured point costs what it measured; two passes twice one.
        assert!(close(agg(1e4, 1024.0, 1.0).seconds(&cal), 4e-3));
        assert!(close(agg(1e3, 16.0, 2.0).seconds(&cal), 8e-6));
        // The same edge-columns at 1024 columns cost what their edges do at that width, not
        // what as many edge-columns of narrow rows do.
        let narrow = agg(64e4, 16.0, 1.0).seconds(&cal);
        let wide = agg(1e4, 1024.0, 1.0).seconds(&cal);
        assert!(wide > 1.1 * narrow, "wide {wide} narrow {narrow}");
        assert_eq!(Aggregations::default().seconds(&cal), 0.0);
    }

    #[test]
    fn cached_rows_are_read_locally_not_fetched() {
        let cal = machine();
        let mut c = counts(500.0);
        (c.input_remote, c.input_cached) = (300.0, 200.0);
        let r = gdp(&shape(), &cal, &c, "alltoallv_world");
        // 1000 own, 200 cached and 500 served rows read, those and 300 fetched rows placed.
        let load =
            (1000.0 + 200.0 + 500.0) * 400.0 * 1e-10 + 2000.0 * 1e-8 + 2e-3 + 300.0 * 408.0 * 1e-9;
        assert!((r.phases.load - load).abs() < 1e-15, "{:?}", r.phases);
        assert_eq!(r.bytes, 300.0 * 408.0);
    }

    #[test]
    fn resident_rows_leave_only_fetched_rows_to_the_host_and_the_copy_up() {
        let cal = machine();
        let mut c = counts(500.0);
        (c.input_remote, c.input_cached) = (300.0, 200.0);
        let device = ModelShape {
            device: true,
            ..shape()
        };
        let resident = ModelShape {
            resident_rows: true,
            ..device.clone()
        };
        let fetch = 2e-3 + 300.0 * 408.0 * 1e-9;
        // On the host: the 300 fetched rows decoded and the 500 served rows read (400 B
        // each); up: the 300 fetched rows. Own and cached rows are gathered on the device.
        let r = gdp(&resident, &cal, &c, "alltoallv_world");
        let up = 1e-5 + 300.0 * 400.0 * 1e-10;
        let load = 800.0 * (400.0 * 1e-10 + 1e-8) + fetch + up;
        assert!((r.phases.load - load).abs() < 1e-15, "{:?}", r.phases);
        assert!((r.upload - up).abs() < 1e-18);
        // Without: own, cached and served rows read, and every batch row copied up.
        let d = gdp(&device, &cal, &c, "alltoallv_world");
        let up = 1e-5 + 1500.0 * 400.0 * 1e-10;
        let load = 1700.0 * 400.0 * 1e-10 + 2000.0 * 1e-8 + fetch + up;
        assert!((d.phases.load - load).abs() < 1e-15, "{:?}", d.phases);
        assert_eq!(r.bytes, d.bytes, "the same rows cross ranks");
        // DNP's owners and split's input layer place their rows the same way.
        assert_eq!(
            dnp(&resident, &cal, &c, "alltoallv_world").phases.load,
            r.phases.load
        );
        assert_eq!(
            split(&resident, &cal, &c, "alltoallv_world").phases.load,
            r.phases.load
        );
        // SNP's sources are all own rows: none is read on the host or copied up.
        let own = counts(0.0);
        let s = snp(&resident, &cal, &own, "alltoallv_world");
        assert_eq!((s.phases.load, s.upload), (0.0, 0.0), "{:?}", s.phases);
        assert!(snp(&device, &cal, &own, "alltoallv_world").upload > 0.0);
    }

    #[test]
    fn every_strategy_reads_sparse_rows_as_csr_and_scans_no_dense_rows() {
        let cal = machine();
        let own = counts(0.0);
        let sparse = ModelShape {
            input_nnz: Some(5.0),
            csr_batches: true,
            ..shape()
        };
        let dense = ModelShape {
            csr_batches: false,
            ..sparse.clone()
        };
        let (c, d) = (
            snp(&sparse, &cal, &own, "alltoallv_world"),
            snp(&dense, &cal, &own, "alltoallv_world"),
        );
        // 1000 own rows × 5 entries of 8 B, against 1000 dense rows of 400 B.
        let gather = cal.op("gather");
        assert_eq!(
            c.phases.load,
            cal.op("gather_sparse")
                .seconds_touching(1000.0, 1000.0 * 5.0 * 8.0, 2.0)
        );
        assert_eq!(
            d.phases.load,
            gather.seconds_touching(1000.0, 1000.0 * 400.0, 2.0)
        );
        assert!(
            c.phases.train < d.phases.train,
            "no dense rows scanned for their zeros"
        );
        // DNP's owners and split's input layer make their rows as GDP makes its batches.
        let remote = counts(500.0);
        let g = gdp(&sparse, &cal, &remote, "alltoallv_world").phases.load;
        assert_eq!(
            dnp(&sparse, &cal, &remote, "alltoallv_world").phases.load,
            g
        );
        assert_eq!(
            split(&sparse, &cal, &remote, "alltoallv_world").phases.load,
            g
        );
    }

    #[test]
    fn nfp_prices_each_rank_by_its_own_slice_and_the_widest_updates_the_most() {
        let cal = machine();
        let (a, b) = (counts(500.0), counts(500.0));
        // 100 columns cut 80 / 20 (equal non-zeros on skewed features), 100 × 10 weights.
        let shape = ModelShape {
            params: 1032.0,
            nfp_columns: vec![80.0, 20.0],
            ..shape()
        };
        // Each rank gathers both ranks' 1500 source rows at its own width.
        let load = |r| {
            nfp(&shape, &cal, &[&a, &b], r, "alltoallv_world")
                .phases
                .load
        };
        assert!((load(0) - 3000.0 * (80.0 * 4.0 * 1e-10 + 1e-8)).abs() < 1e-15);
        assert!((load(1) - 3000.0 * (20.0 * 4.0 * 1e-10 + 1e-8)).abs() < 1e-15);
        // The widest slice's rank holds 80 of the weights' 100 rows besides the 32 whole
        // parameters, and bounds the optimizer; even slices hold 50 each.
        assert_eq!(params_held(&shape, "nfp", 2), 32.0 + 800.0);
        let even = ModelShape {
            nfp_columns: vec![],
            ..shape.clone()
        };
        assert_eq!(params_held(&even, "nfp", 2), 32.0 + 500.0);
        assert_eq!(params_held(&shape, "gdp", 2), 1032.0);
        // Widths of another rank count than the plan's are not used.
        assert_eq!(params_held(&shape, "nfp", 4), 32.0 + 250.0);
        let p = predict(&two_even_ranks(), &shape, &cal, &["nfp"], "alltoallv_world");
        let optimizer = cal.op("optimizer").seconds(832.0, 1.0);
        assert!((p.strategies["nfp"].phases.optimizer - optimizer).abs() < 1e-18);
    }

    #[test]
    fn nfp_moves_no_feature_rows_and_slices_the_first_layer() {
        let cal = machine();
        let (a, b) = (counts(500.0), counts(500.0));
        let r = nfp(&shape(), &cal, &[&a, &b], 0, "alltoallv_world");
        // Gather: both ranks' 1500 source rows at 50 columns.
        assert!((r.phases.load - 3000.0 * (50.0 * 4.0 * 1e-10 + 1e-8)).abs() < 1e-15);
        // Blocks: 3000 src ids, 4000 edges, 400 dst; partials 200 rows × 40 B each way, as
        // ready rows (2 GB/s).
        let blocks = 3000.0 * 8.0 + 4000.0 * 4.0 + 400.0 * 8.0;
        // This rank's own 200 rows of 40 B pass through its copies (into a zeroed sum,
        // forward; gathered and passed to itself, backward).
        let own = 200.0 * 40.0;
        let shuffle = 2e-3 + 2.0 * 200.0 * 40.0 * 5e-10 + local_side(&cal, 4.0 * own, own);
        assert!((r.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", r.phases);
        // The model phase runs the sliced input layer once over both ranks' blocks stacked
        // into one (their 400 destinations, 3000 sources and 4000 edges), then activates and
        // runs the layers above on this rank's own rows only; nothing is stacked or copied
        // out around it.
        let sliced = ModelShape {
            in_w: vec![50.0, shape().in_w[1]],
            csr_batches: false,
            ..shape()
        };
        let input = |c: &Counts| (c.dst[0], c.src[0], c.edges[0]);
        let on = |rows| layer(&sliced, &cal, 0, rows, Order::Cheaper, true);
        let stacked = (
            a.dst[0] + b.dst[0],
            a.src[0] + b.src[0],
            a.edges[0] + b.edges[0],
        );
        assert!(on(stacked) > on(input(&a)));
        let train = compute(&sliced, &cal, &a, Order::Cheaper, true) - on(input(&a)) + on(stacked);
        assert!((r.phases.train - train).abs() < 1e-15, "{:?}", r.phases);
        // A rank whose block is empty (no seeds this step) adds nothing to the stacked block.
        let mut none = b.clone();
        (none.dst[0], none.src[0], none.edges[0]) = (0.0, 0.0, 0.0);
        let alone = nfp(&shape(), &cal, &[&a, &none], 0, "alltoallv_world");
        let train = compute(&sliced, &cal, &a, Order::Cheaper, true);
        assert!(
            (alone.phases.train - train).abs() < 1e-15,
            "{:?}",
            alone.phases
        );
        // Sampling is local (every rank holds the topology): the sampler's time for the
        // rank's 2200 edges, without GDP's routing of ids to owners; then every rank's input
        // block is allgathered (1 ms + 1 ns a byte), as training times it in its sample phase.
        let sampled = cal.op("sample").seconds(2200.0, 1.0);
        assert!((r.phases.build - sampled - (1e-3 + blocks * 1e-9)).abs() < 1e-15);
        assert!(gdp(&shape(), &cal, &a, "alltoallv_world").phases.build > sampled);
    }

    #[test]
    fn nfp_on_mostly_zero_features_gathers_and_multiplies_csr_slices() {
        let cal = machine();
        let (a, b) = (counts(500.0), counts(500.0));
        // 400 columns, 8 set per row: slices of 200 columns, 4 entries per row each.
        let sparse = ModelShape {
            in_w: vec![400.0, 10.0],
            input_nnz: Some(8.0),
            ..shape()
        };
        let r = nfp(&sparse, &cal, &[&a, &b], 0, "alltoallv_world");
        // Both ranks' 1500 source rows from the CSR copy: 4 entries of 8 bytes and a row
        // pointer each.
        let load = 3000.0 * (3e-8 + (4.0 * 8.0 + 8.0) * 1e-10);
        assert!((r.phases.load - load).abs() < 1e-15, "{:?}", r.phases);
        // The input layer multiplies the entries it was given, once over the ranks' blocks
        // stacked: no dense rows scanned.
        let sliced = ModelShape {
            in_w: vec![200.0, 10.0],
            input_nnz: Some(4.0),
            ..sparse.clone()
        };
        let on = |rows| layer(&sliced, &cal, 0, rows, Order::Cheaper, false);
        let stacked = (
            a.dst[0] + b.dst[0],
            a.src[0] + b.src[0],
            a.edges[0] + b.edges[0],
        );
        let train = compute(&sliced, &cal, &a, Order::Cheaper, false)
            - on((a.dst[0], a.src[0], a.edges[0]))
            + on(stacked);
        assert!((r.phases.train - train).abs() < 1e-15, "{:?}", r.phases);
        // Slices narrower than the sparse path takes are gathered and multiplied dense.
        let narrow = ModelShape {
            in_w: vec![100.0, 10.0],
            input_nnz: Some(2.0),
            ..shape()
        };
        let r = nfp(&narrow, &cal, &[&a, &b], 0, "alltoallv_world");
        assert!((r.phases.load - 3000.0 * (1e-8 + 50.0 * 4.0 * 1e-10)).abs() < 1e-15);
    }

    #[test]
    fn prefetch_hides_the_host_preparation_of_every_strategy_but_nfp_behind_the_device() {
        // Phases 1 + 2 (0.5 of it the upload) + 0 + 3 + 0.25 + 0.25: the training thread
        // has 0.5 + 3 + 0.5 = 4, the workers 2.5; with 4 workers (√4 = 2× one) 1.25.
        let phases = Phases {
            build: 1.0,
            load: 2.0,
            shuffle: 0.0,
            train: 3.0,
            sync: 0.25,
            optimizer: 0.25,
        };
        assert_eq!(prefetched_step(&phases, 0.5, 4), 4.0);
        // A host-bound step: the preparation, sped up √W, bounds it.
        let slow = Phases {
            build: 9.0,
            ..phases
        };
        assert_eq!(prefetched_step(&slow, 0.5, 4), 10.5 / 2.0);
        assert_eq!(prefetched_step(&slow, 0.5, 1), 10.5);

        let cal = machine();
        let ranks = vec![std::array::from_fn(|_| counts(100.0)); 2];
        let dry = DryRun::uniform(1, 1, ranks);
        let all = ["gdp", "split", "dnp", "snp", "nfp"];
        let device = ModelShape {
            device: true,
            ..shape()
        };
        let plain = predict(&dry, &device, &cal, &all, "alltoallv_world");
        let prefetched = ModelShape {
            prefetch_workers: Some(1),
            ..device
        };
        let p = predict(&dry, &prefetched, &cal, &all, "alltoallv_world");
        // NFP prepares in its steps.
        assert_eq!(p.strategies["nfp"], plain.strategies["nfp"]);
        type CostFn = fn(&ModelShape, &Calibration, &Counts, &str) -> RankCost;
        let costs = [
            ("gdp", gdp as CostFn),
            ("split", split),
            ("dnp", dnp),
            ("snp", snp),
        ];
        for (name, cost) in costs {
            let (g, g0) = (&p.strategies[name], &plain.strategies[name]);
            assert_eq!(
                g.phases, g0.phases,
                "{name}: the phases stay what each costs"
            );
            assert!(
                g.step_seconds < g0.step_seconds,
                "{name}: {g:?} against {g0:?}"
            );
            let upload = cost(&prefetched, &cal, &counts(100.0), "alltoallv_world").upload;
            assert!(upload > 0.0, "{name}: a device copies the rows up");
            assert_eq!(g.step_seconds, prefetched_step(&g.phases, upload, 1));
            assert_eq!(g.epoch_seconds, g.step_seconds);
        }
        // On one rank split, DNP and SNP prepare in their steps (no communicator for workers).
        let one = DryRun::uniform(
            dry.batches,
            dry.epoch_batches,
            vec![std::array::from_fn(|_| counts(0.0))],
        );
        let p1 = predict(&one, &prefetched, &cal, &all, "alltoallv_world");
        for name in ["split", "dnp", "snp"] {
            let s1 = &p1.strategies[name];
            assert_eq!(s1.step_seconds, s1.phases.total(), "{name}");
        }
    }

    #[test]
    fn the_optimizer_prices_the_parameters_a_rank_holds_and_staging_the_gradients_twice() {
        let cal = machine();
        let ranks = vec![std::array::from_fn(|_| counts(100.0)); 4];
        let dry = DryRun::uniform(1, 1, ranks);
        let mut sage = ModelShape {
            kind: ModelKind::Sage,
            params: 3000.0,
            ..shape()
        };
        let all = ["gdp", "split", "dnp", "snp", "nfp"];
        let p = predict(&dry, &sage, &cal, &all, "alltoallv_world");
        // GDP's ranks all update 3000 parameters; NFP's hold a quarter of SAGE's two first-
        // layer matrices (2 × 100 × 10 rows): 3000 − 2000 · 3/4 = 1500.
        let per_param = |n: f64| 1e-5 + n * 1e-8;
        assert!((p.strategies["gdp"].phases.optimizer - per_param(3000.0)).abs() < 1e-18);
        assert!((p.strategies["nfp"].phases.optimizer - per_param(1500.0)).abs() < 1e-18);
        let host_sync = p.strategies["gdp"].phases.sync;

        // On a device without CUDA-aware MPI the 12 kB of gradients go down and back up.
        sage.device = true;
        sage.staged_gradients = true;
        let p = predict(&dry, &sage, &cal, &all, "alltoallv_world");
        let staging = 2.0 * (1e-5 + 12_000.0 * 1e-10);
        assert!((p.strategies["gdp"].phases.sync - host_sync - staging).abs() < 1e-15);
        sage.staged_gradients = false;
        let p = predict(&dry, &sage, &cal, &all, "alltoallv_world");
        assert_eq!(p.strategies["gdp"].phases.sync, host_sync);
    }

    #[test]
    fn gat_projects_every_source_and_pays_its_attention_per_edge() {
        // 4 heads of 8: a product 16 → 32 over 100 sources; 20 destinations, 300 edges.
        let w = layer_work(
            ModelKind::Gat,
            (16.0, 32.0),
            (20.0, 100.0, 300.0),
            true,
            Order::Cheaper,
        );
        // Projection, its weight gradient and its input gradient: 3 × 2·100·16·32 flops.
        assert_eq!(w.flops(), 3.0 * 2.0 * 100.0 * 16.0 * 32.0);
        assert_eq!(
            w.forward.bytes,
            4.0 * (100.0 * 16.0 + 16.0 * 32.0 + 100.0 * 32.0)
        );
        // The attention (forward and backward) over 300 edges × 32 columns, nothing as a
        // mean aggregation.
        assert_eq!(
            (w.attention_cols, w.aggregations.edge_cols()),
            (300.0 * 32.0, 0.0)
        );
        // The input layer has no input gradient; the order asked for does not matter.
        let first = layer_work(
            ModelKind::Gat,
            (16.0, 32.0),
            (20.0, 100.0, 300.0),
            false,
            Order::ProjectFirst,
        );
        assert_eq!(first.flops(), 2.0 * 2.0 * 100.0 * 16.0 * 32.0);
        assert_eq!(first.attention_cols, w.attention_cols);
    }
}
