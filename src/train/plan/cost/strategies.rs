//! Each strategy's cost on one rank: its build, load and shuffle phases from the dry run's
//! counts, and its train phase through [`super::compute`].

use super::compute::{activation, compute, layer};
use super::{ModelShape, Order, Phases, RankCost};
use crate::backend::cpu::sparse::MIN_SPARSE_COLS;
use crate::train::plan::calibration::Calibration;
use crate::train::plan::dry_run::Counts;

/// How a batch's input rows are made ([`load`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rows {
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
pub(super) fn load(
    shape: &ModelShape,
    cal: &Calibration,
    c: &Counts,
    a2a: &str,
    rows: Rows,
) -> RankCost {
    let row = shape.in_w[0] * 4.0;
    // A fetched row: its 8-byte id out and the row back, dense or as the store packs it.
    let wire = shape.packed_row_bytes.unwrap_or(row);
    let fetched = c.input_remote * (wire + 8.0);
    // Every row the rank reads (its own, a host peer's, cached, served) or places (fetched)
    // is looked up and written once; `gathered` the bytes those reads and writes touch. A
    // peer's row, read in the host's shared memory, costs what a cached row costs: a dense
    // row read here (the device holds neither).
    let near = c.input_cached + c.input_peer;
    let every_row = c.input_local + near + c.input_served + c.input_remote;
    let (read, gathered, copied_up) = if rows == Rows::Resident {
        // Served rows are still read for the ranks that fetch them; peers' rows are read
        // here and go up with the fetched ones.
        (
            c.input_remote + c.input_served + c.input_peer,
            (c.input_remote + c.input_served + c.input_peer) * row,
            (c.input_remote + c.input_peer) * row,
        )
    } else if rows == Rows::Csr {
        let entries = shape.input_nnz.unwrap_or(shape.in_w[0]) * 8.0;
        (
            every_row,
            (c.input_local + c.input_served + c.input_remote) * entries + near * row,
            (c.input_local + near + c.input_remote) * (entries + 8.0),
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
            (c.input_local + near + c.input_served + decoded) * row,
            (c.input_local + near + c.input_remote) * row,
        )
    };
    // CSR rows are assembled from the store's sparse copy, a path of its own per row.
    let mut s = if rows == Rows::Csr {
        cal.op("gather_sparse")
            .seconds_touching(read, gathered, 2.0)
    } else {
        let besides = besides_the_store(shape, c, shape.graph_bytes);
        dense_gather(shape, cal, read, gathered, 2.0, besides)
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
            build: build(shape, cal, c, a2a),
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
///
/// The cache holds the store beside `besides` bytes of the rest of the step
/// ([`besides_the_store`]): the calibration's gathers ran back to back, each finding the
/// table where the last left it, where a step's sampling and model run between two batches'
/// gathers. Priced by the store's bytes alone, R-MAT's 2-rank gathers (a 17 MB store a rank,
/// 256-byte rows) came out at the near tables' 30 ns a row where they measured 55, about the
/// far tables' (2-core EPYC VM, grid k).
fn dense_gather(
    shape: &ModelShape,
    cal: &Calibration,
    rows: f64,
    bytes: f64,
    calls: f64,
    besides: f64,
) -> f64 {
    let near = cal.op("gather").seconds_touching(rows, bytes, calls);
    let far_share = cal.far_share(shape.store_bytes + besides);
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
fn build(shape: &ModelShape, cal: &Calibration, c: &Counts, a2a: &str) -> f64 {
    let warm = sampler_warm_share(shape, cal, c, shape.graph_bytes);
    cal.sampling(c.sampled_edges, c.sampled_vertices, warm)
        + cal.op(a2a).seconds(c.sample_bytes, c.sample_calls)
}

/// How much of an adjacency of `graph_bytes` the host's cache still holds when the rank
/// samples its next batch ([`Calibration::sampling`]): the rank's share of the host's largest
/// cache (its ranks share it), less what the rest of its step touches on the host
/// ([`step_host_bytes`]), over the adjacency's bytes; 1 where all of it stays (a small graph
/// beside a small model), 0 where none does.
pub(super) fn sampler_warm_share(
    shape: &ModelShape,
    cal: &Calibration,
    c: &Counts,
    graph_bytes: f64,
) -> f64 {
    if graph_bytes <= 0.0 {
        return 1.0;
    }
    ((rank_cache_bytes(cal) - step_host_bytes(shape, c)) / graph_bytes).clamp(0.0, 1.0)
}

/// A rank's share of its host's largest cache: the host's ranks share it.
fn rank_cache_bytes(cal: &Calibration) -> f64 {
    cal.cache_bytes / cal.key.ranks_per_node.max(1) as f64
}

/// Bytes a rank's step touches on the host besides its feature store: what
/// [`step_host_bytes`] counts, and the `graph_bytes` of adjacency its sampler reads.
fn besides_the_store(shape: &ModelShape, c: &Counts, graph_bytes: f64) -> f64 {
    step_host_bytes(shape, c) + graph_bytes
}

/// How much of its data a rank's step finds in the host's cache when its kernels read it
/// ([`Calibration::with_warm_kernels`]): 1 less the bytes the step touches on the host
/// ([`step_host_bytes`]) over the rank's share of the host's largest cache, 0 to 1; 0 on a
/// device (its kernels read the device's memory).
pub(super) fn kernel_warm_share(shape: &ModelShape, cal: &Calibration, c: &Counts) -> f64 {
    let cache = rank_cache_bytes(cal);
    if shape.device || cache <= 0.0 {
        return 0.0;
    }
    (1.0 - step_host_bytes(shape, c) / cache).clamp(0.0, 1.0)
}

/// Bytes a rank's step reads or writes on the host between two batches' sampling: the input
/// rows it gathers (their entries where they come sparse), and where the model runs on the
/// host, every layer's output and its gradient, and the parameters with their gradients and
/// Adam's two moments.
fn step_host_bytes(shape: &ModelShape, c: &Counts) -> f64 {
    let row = shape.input_nnz.map_or(4.0 * shape.in_w[0], |nnz| 8.0 * nnz);
    let input = c.src.first().copied().unwrap_or(0.0) * row;
    if shape.device {
        return input;
    }
    let outputs: f64 = c
        .dst
        .iter()
        .zip(&shape.out_w)
        .map(|(rows, width)| 2.0 * 4.0 * rows * width)
        .sum();
    input + outputs + 16.0 * shape.params
}

/// GDP: every rank computes its own seeds' whole tree; remote input rows are fetched (as
/// CSR entries where its batches come as CSR).
pub fn gdp(shape: &ModelShape, cal: &Calibration, c: &Counts, a2a: &str) -> RankCost {
    let rows = Rows::of_input_block(shape);
    let mut r = load(shape, cal, c, a2a, rows);
    let window = shape.gdp_sample_window;
    let warm = sampler_warm_share(shape, cal, c, shape.graph_bytes);
    if window > 1 && c.sample_calls > 0.0 {
        // Several ranks sampling their windows together: the owner-routed sampler's windows,
        // each id exchange shared by a window's batches.
        r.phases.build = cal.routed_sampling(c.sampled_edges, c.sampled_vertices, window, warm)
            + cal
                .op(a2a)
                .seconds(c.sample_bytes, c.sample_calls / window as f64);
    } else if window > 1 {
        // One rank sampling in windows: no id exchange, the local sampler side by side.
        r.phases.build = cal.local_sampling(c.sampled_edges, c.sampled_vertices, window, warm);
    }
    r.phases.train = compute(shape, cal, c, Order::Cheaper, rows != Rows::Csr);
    r
}

/// The local side of a shuffle the calibrated row exchange leaves out (it times only rows
/// that cross ranks): `copied` bytes of rows gathered or scattered by index on this rank and
/// `zeroed` bytes of fresh matrices written whole.
pub(super) fn local_side(cal: &Calibration, copied: f64, zeroed: f64) -> f64 {
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
            let besides = besides_the_store(shape, mine, shape.whole_graph_bytes);
            (dense_gather(shape, cal, src, bytes, 1.0, besides), bytes)
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
            build: cal.local_sampling(
                mine.sampled_edges,
                mine.sampled_vertices,
                shape.nfp_sample_window,
                sampler_warm_share(shape, cal, mine, shape.whole_graph_bytes),
            ) + allgather,
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
