//! Parallel strategies: how the ranks share the work of one global mini-batch.
//!
//! Every strategy computes, on each rank, the gradient of the summed loss over that rank's
//! share of the global mini-batch; the loop then sums gradients over ranks and divides by the
//! global batch size, so the mean loss over the global mini-batch is what gets minimised
//! whatever the rank count (ARCHITECTURE invariant 4).

use super::data::TrainData;
use super::dump::BlockDump;
use super::metrics::{PassClock, PhaseTimes};
use crate::backend::{Backend, BlockTranspose, CowMat, LossSum};
use crate::comm::Group;
use crate::exchange::inference::HaloPlan;
use crate::exchange::sample_blocks_distributed;
use crate::exchange::store::{InputRows, PlacedRows, StoreStats};
use crate::graph::NodeId;
use crate::nn::transposes::TransposePlan;
use crate::nn::{DropoutCtx, Model};
use crate::sample::rng::hash_key;
use crate::sample::{sample_blocks, BatchKey, Block, LocalGraph};
use anyhow::Result;
use ndarray::{concatenate, Array2, ArrayView2, Axis, CowArray, Ix2};
use std::sync::OnceLock;
use std::time::Instant;

/// What one rank computed for one mini-batch.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// Sum of the per-seed losses over this rank's seeds (on a device, read when the training
    /// loop wants it: reading waits for the device).
    pub loss_sum: LossSum,
    /// Seeds this rank computed.
    pub seeds: u64,
    /// Destination rows computed and edges aggregated, summed over layers.
    pub nodes: u64,
    pub edges: u64,
    /// Input feature rows gathered.
    pub input_rows: u64,
}

/// One mini-batch as the host side of a step samples it: the batch, how to sample it and its
/// key. Unlike [`StepArgs`] it names no communicator, so a prefetch worker can hold it.
#[derive(Clone, Copy, Debug)]
pub struct BatchSpec<'a> {
    /// The global mini-batch (under hybrid, this node's share of it).
    pub batch: &'a [NodeId],
    /// Neighbours per layer, from the seeds outward.
    pub fanouts: &'a [i32],
    pub key: BatchKey,
    /// Add GCN's self-loop to every destination.
    pub self_loops: bool,
}

/// What every mini-batch step needs besides the model and the data: the ranks that share the
/// mini-batch, the mini-batch, and how to sample and scale it.
#[derive(Clone, Copy)]
pub struct StepArgs<'a> {
    /// The ranks sharing this mini-batch (the world; under hybrid, the node).
    pub group: &'a Group,
    /// The global mini-batch (under hybrid, this node's share of it).
    pub batch: &'a [NodeId],
    /// Neighbours per layer, from the seeds outward.
    pub fanouts: &'a [i32],
    pub key: BatchKey,
    /// Add GCN's self-loop to every destination.
    pub self_loops: bool,
    /// 1 / global batch size: each rank returns gradients of the mean loss.
    pub scale: f32,
}

impl<'a> StepArgs<'a> {
    /// The batch these arguments sample, without the communicator.
    pub fn spec(&self) -> BatchSpec<'a> {
        BatchSpec {
            batch: self.batch,
            fanouts: self.fanouts,
            key: self.key,
            self_loops: self.self_loops,
        }
    }
}

/// The dropout stream of one optimizer step (each layer mixes in its index).
pub(crate) fn dropout_stream(key: BatchKey) -> u64 {
    hash_key(&[key.seed, key.epoch, key.batch, 0x64726f70])
}

/// The training context of the optimizer step `key` over `data`: its dropout stream, masks
/// keyed by original vertex ids and GCN's whole-graph degrees. Every strategy's step starts
/// from it, so that each masks a vertex's row as GDP's step does.
pub(crate) fn step_ctx(data: &TrainData, key: BatchKey) -> DropoutCtx<'_> {
    DropoutCtx {
        orig_ids: data.orig_ids.as_deref(),
        gcn_degrees: data.gcn_degrees.as_deref(),
        ..DropoutCtx::training(dropout_stream(key))
    }
}

/// The inference context over `data` (no dropout, nothing kept for a backward pass), with
/// GCN's whole-graph degrees, as the evaluations of full-graph strategies run it.
pub(crate) fn inference_ctx(data: &TrainData) -> DropoutCtx<'_> {
    DropoutCtx {
        gcn_degrees: data.gcn_degrees.as_deref(),
        ..DropoutCtx::inference()
    }
}

/// The host side of one GDP mini-batch, ready for the model: this rank's seeds and their
/// labels, the sampled blocks (self-loops added where the model wants them), and the input
/// rows gathered on the host.
pub struct HostBatch {
    pub seeds: Vec<NodeId>,
    pub labels: Vec<i64>,
    /// Input layer first; the last block's destinations are `seeds`.
    pub blocks: Vec<Block>,
    /// The blocks as sampled, before self-loops were added: kept only for `--dump-blocks`
    /// when self-loops changed them (otherwise `blocks` are the sampled blocks).
    pub sampled: Option<Vec<Block>>,
    /// `blocks[0]`'s source rows.
    pub input: BatchInput,
    /// Per block, its transpose when [`InputSource::transposes`] says the backward reads it.
    pub transposes: Vec<Option<BlockTranspose>>,
    /// The sparse input rows' transpose, where [`InputSource::transposes`] builds it ahead
    /// ([`crate::nn::transposes::TransposePlan::build`]).
    pub input_transpose: Option<BlockTranspose>,
    /// Seconds spent sampling and gathering, and the feature store's counters of the gather.
    pub sample_seconds: f64,
    pub gather_seconds: f64,
    pub store: StoreStats,
}

/// A mini-batch's input rows (`blocks[0]`'s sources) as the host prepared them.
#[derive(Debug)]
pub enum BatchInput {
    /// Rows gathered on the host: dense (the first layer tests them for sparsity itself), or
    /// mostly-zero rows as CSR for a first layer that takes sparse rows (the path its test
    /// would choose on their dense form, decided from the rows' counts, without that form).
    Host(InputRows),
    /// Rows the backend gathers from its resident copy of the features (one rank: every
    /// row is its own). `dense`: the host decided from the rows' counts that the first layer
    /// takes them densely, so the layer skips its own test (on a device a count kernel and a
    /// wait); else the layer tests them.
    Resident { dense: bool },
    /// Several ranks, own rows (and cached ones) resident on the device: where each row is
    /// there, and the rows made on the host (fetched from their owners). The device gathers
    /// and places them.
    Placed(PlacedRows),
}

/// This rank's feature rows kept on the device: its own rows (the whole graph's on one rank),
/// and on several ranks its cache of remote rows when that fits too. The batches' input rows
/// are gathered there instead of on the host and copied up.
pub struct ResidentFeatures<B: Backend> {
    pub own: B::Mat,
    pub cache: Option<B::Mat>,
}

impl<B: Backend> ResidentFeatures<B> {
    /// Whether every rank of `group` would keep its own rows of `data` on its device `be`:
    /// a device backend, rows that do not reach the first layer as CSR (`csr`: they go up as
    /// such), and room for them. Collective over `group`; every rank gets the same answer (the
    /// trainer's evaluation reads the resident rows collectively, the planner's choice must
    /// agree).
    pub fn fit_on_every_rank(be: &B, data: &TrainData, group: &Group, csr: bool) -> bool {
        let fits = !B::IS_HOST && !csr && be.fits(data.store.own_rows().len() * 4);
        group.allreduce_max_f64(f64::from(u8::from(!fits))) == 0.0
    }
}

/// Where a GDP batch's input rows come from.
#[derive(Clone, Copy, Debug)]
pub struct InputSource {
    /// The backend holds this rank's own features (on one rank, the whole graph's) and
    /// gathers rows there.
    pub resident: bool,
    /// It holds the cache of remote rows too.
    pub cache_resident: bool,
    /// The model's first layer multiplies sparse input rows as such
    /// ([`crate::nn::Layer::takes_sparse_input`]).
    pub sparse_first_layer: bool,
    /// The blocks' transposes the host builds with the batch, for a model on a device
    /// ([`Model::transpose_plan`]); none for a host backend, which builds each beside the
    /// product that reads it.
    pub transposes: TransposePlan,
}

impl InputSource {
    /// The source of `model`'s input rows, with `resident` the features the backend holds.
    pub fn of<B: Backend>(model: &Model<B>, resident: Option<&ResidentFeatures<B>>) -> InputSource {
        InputSource {
            resident: resident.is_some(),
            cache_resident: resident.is_some_and(|r| r.cache.is_some()),
            sparse_first_layer: model.layers[0].takes_sparse_input(),
            transposes: if B::IS_HOST {
                TransposePlan::none()
            } else {
                model.transpose_plan()
            },
        }
    }

    /// Whether sparse batches come as CSR from `data`'s store (its sparse copy, for a first
    /// layer that takes sparse rows).
    pub fn csr_rows(&self, data: &TrainData) -> bool {
        self.sparse_first_layer && data.store.has_sparse_copy()
    }

    /// The input rows of `src` (own rows of `data`), and the store's counters for them: as CSR
    /// where the first layer takes them sparse and the store keeps a sparse copy, else from
    /// the resident copy, else gathered densely on the host. The first layer's test is made
    /// here only where it decides something: a CSR gather, or a device's dense path.
    fn rows(&self, data: &TrainData, src: &[NodeId]) -> (BatchInput, StoreStats) {
        let sparse = if !self.sparse_first_layer {
            Some(false)
        } else if self.resident || self.csr_rows(data) {
            data.store.prefers_sparse_rows(src)
        } else {
            None
        };
        if sparse == Some(true) {
            if let Some((csr, stats)) = data.store.gather_local_sparse(src) {
                return (BatchInput::Host(InputRows::Sparse(csr)), stats);
            }
        }
        if self.resident {
            let dense = sparse == Some(false);
            return (BatchInput::Resident { dense }, StoreStats::default());
        }
        let (x, stats) = data.store.gather_local(src);
        (BatchInput::Host(InputRows::Dense(x)), stats)
    }
}

/// The host side of a GDP mini-batch: this rank's seeds, their sampled blocks (self-loops
/// added), the input rows (`input`) and the labels. `group`: the ranks the graph is
/// partitioned over, or `None` where this rank holds the whole graph; then it communicates
/// nothing, else it is collective over `group` (sampling hops routed to owners, missing input
/// rows fetched), and every rank calls it for every batch. It only reads `data` and is a pure
/// function of its arguments, so the trainer's prefetch workers run it ahead of time, on a
/// communicator of their own, with the same result as the step itself (`keep_sampled`: also
/// keep the blocks as sampled, for `--dump-blocks`).
///
/// # Panics
/// If `group` is `None` and `data` does not own every vertex the batch reaches.
pub fn gdp_host_batch(
    data: &TrainData,
    group: Option<&Group>,
    spec: BatchSpec,
    source: InputSource,
    keep_sampled: bool,
    sampled_ahead: Option<Vec<Block>>,
) -> HostBatch {
    let BatchSpec {
        batch,
        fanouts,
        key,
        self_loops,
    } = spec;
    let t = Instant::now();
    let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    let mut blocks = match (sampled_ahead, group) {
        (Some(blocks), _) => blocks,
        (None, None) => sample_blocks(&graph, &seeds, fanouts, key),
        (None, Some(g)) => {
            sample_blocks_distributed(g, &graph, &data.offsets, &seeds, fanouts, key)
        }
    };
    let mut sampled = None;
    if self_loops {
        let looped = blocks.iter().map(Block::with_self_loops).collect();
        let raw = std::mem::replace(&mut blocks, looped);
        sampled = keep_sampled.then_some(raw);
    }
    let sample_seconds = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let src = &blocks[0].src_nodes;
    let (input, store) = match group {
        None => source.rows(data, src),
        Some(g) if source.resident => {
            let (placed, stats) = data.store.place_input(g, src, source.cache_resident);
            (BatchInput::Placed(placed), stats)
        }
        Some(g) => {
            let (rows, stats) = data.store.gather_input(g, src, source.sparse_first_layer);
            (BatchInput::Host(rows), stats)
        }
    };
    let labels = seeds.iter().map(|&s| data.label(s)).collect();
    let gather_seconds = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let sparse_input = match &input {
        BatchInput::Host(InputRows::Sparse(x)) => Some(x),
        _ => None,
    };
    let (transposes, input_transpose) = source.transposes.build(&blocks, sparse_input);
    HostBatch {
        seeds,
        labels,
        blocks,
        sampled,
        input,
        transposes,
        input_transpose,
        sample_seconds: sample_seconds + t.elapsed().as_secs_f64(),
        gather_seconds,
        store,
    }
}

/// Data-parallel step (GDP): this rank takes the seeds of `batch` it owns, samples their
/// blocks with owner-computes sampling, fetches input rows from the feature store (or gathers
/// them on the device from `resident`, this rank's features kept there, fetching only other
/// ranks' rows that it does not hold), and runs forward, loss and backward on the model's backend (gradients
/// accumulate in `model`). Collective: every rank calls it for every mini-batch, also with no
/// seeds of its own.
pub fn gdp_minibatch_step<B: Backend>(
    model: &mut Model<B>,
    data: &mut TrainData,
    resident: Option<&ResidentFeatures<B>>,
    args: &StepArgs,
    sampled_ahead: Option<Vec<Block>>,
    times: &mut PhaseTimes,
    dump: Option<(&mut BlockDump, u64)>,
) -> Result<StepOutput> {
    // Exactly what the prefetch workers would have prepared.
    let input = InputSource::of(model, resident);
    let partitioned = (args.group.size() > 1).then_some(args.group);
    let host = gdp_host_batch(
        data,
        partitioned,
        args.spec(),
        input,
        dump.is_some(),
        sampled_ahead,
    );
    data.store.add_stats(&host.store);
    gdp_train_step(model, data, resident, host, args, times, dump)
}

/// The model's side of a GDP step on a prepared [`HostBatch`]: input rows onto the backend
/// (or gathered there from `resident`), blocks onto the backend, forward, loss and backward.
/// Adds the batch's host seconds to `times` and writes its blocks to `dump`. Local: no
/// communication.
pub fn gdp_train_step<B: Backend>(
    model: &mut Model<B>,
    data: &TrainData,
    resident: Option<&ResidentFeatures<B>>,
    host: HostBatch,
    args: &StepArgs,
    times: &mut PhaseTimes,
    dump: Option<(&mut BlockDump, u64)>,
) -> Result<StepOutput> {
    let be = model.params.backend().clone();
    let HostBatch {
        seeds,
        labels,
        blocks,
        sampled,
        input,
        transposes,
        input_transpose,
        sample_seconds,
        gather_seconds,
        ..
    } = host;
    if let Some((dump, step)) = dump {
        dump.write(step, sampled.as_ref().unwrap_or(&blocks), data)?;
    }
    times.sample += sample_seconds;
    times.gather += gather_seconds;

    let t = Instant::now();
    let src = &blocks[0].src_nodes;
    // On the host backend the gathered rows are the model's input as they are, and go back to
    // the store once the forward pass is done with them; a device backend copies them.
    let x = match (input, resident) {
        (BatchInput::Host(InputRows::Dense(x)), _) if B::IS_HOST => {
            Input::Dense(be.upload_owned(x), false)
        }
        (BatchInput::Host(InputRows::Dense(x)), _) => {
            let up = be.upload(x.view());
            data.store.recycle(x);
            Input::Dense(up, false)
        }
        (BatchInput::Host(InputRows::Sparse(x)), _) => {
            Input::Sparse(be.sparse_from_csr(x, input_transpose))
        }
        (BatchInput::Resident { dense }, Some(features)) => {
            Input::Dense(be.gather_rows(be.view(&features.own), src), dense)
        }
        (BatchInput::Placed(rows), Some(features)) => {
            Input::Dense(place_rows(&be, features, rows, data), false)
        }
        (BatchInput::Resident { .. } | BatchInput::Placed(_), None) => {
            panic!("a host batch without input rows needs resident features")
        }
    };
    let mut out = StepOutput {
        loss_sum: LossSum::default(),
        seeds: seeds.len() as u64,
        nodes: blocks.iter().map(|b| b.num_dst as u64).sum(),
        edges: blocks.iter().map(|b| b.num_edges() as u64).sum(),
        input_rows: blocks[0].num_src() as u64,
    };
    let graphs: Vec<B::Graph> = blocks.into_iter().map(|b| be.graph(b)).collect();
    let transposes = transposes_on(&be, transposes);
    times.gather += t.elapsed().as_secs_f64();
    if seeds.is_empty() {
        x.recycle(&be, data);
        return Ok(out);
    }
    let refs: Vec<&B::Graph> = graphs.iter().collect();
    let t = Instant::now();
    let ctx = step_ctx(data, args.key);
    let (logits, cache) = match &x {
        Input::Dense(x, true) => model.forward_dense(&refs, be.view(x), &ctx),
        Input::Dense(x, false) => model.forward(&refs, be.view(x), &ctx),
        Input::Sparse(x) => model.forward_sparse(&refs, x, &ctx),
    };
    x.recycle(&be, data);
    let (loss_sum, mut d_logits) = be.cross_entropy(be.view(&logits), &labels);
    times.forward += t.elapsed().as_secs_f64();

    let t = Instant::now();
    be.scale(be.view_mut(&mut d_logits), args.scale);
    model.backward_with(&refs, &transposes, cache, d_logits);
    times.backward += t.elapsed().as_secs_f64();
    out.loss_sum = loss_sum;
    Ok(out)
}

/// The transposes a host batch brought (built ahead by a prefetch worker) on backend `be`,
/// one per block: those it did not bring are built on first use.
pub(crate) fn transposes_on<B: Backend>(
    be: &B,
    host: Vec<Option<BlockTranspose>>,
) -> Vec<B::Transpose> {
    host.into_iter()
        .map(|t| t.map(|t| be.transpose_of(t)).unwrap_or_default())
        .collect()
}

/// A batch's input rows assembled on the device from `features` and the rows `placed` made
/// on the host: own rows gathered from the resident copy into their positions, cached rows
/// from the resident cache, and the rest copied up and put in place (added to zero rows).
pub(crate) fn place_rows<B: Backend>(
    be: &B,
    features: &ResidentFeatures<B>,
    placed: PlacedRows,
    data: &TrainData,
) -> B::Mat {
    let own = be.gather_rows(be.view(&features.own), &placed.own_rows);
    let own_pos: Vec<usize> = placed.own_pos.iter().map(|&p| p as usize).collect();
    let mut x = be.scatter_rows(be.view(&own), &own_pos, placed.len);
    if !placed.cached_pos.is_empty() {
        let cache = features
            .cache
            .as_ref()
            .expect("rows are placed in the cache only where the device holds it");
        let rows = be.gather_rows(be.view(cache), &placed.cached_slots);
        be.scatter_add_rows(be.view_mut(&mut x), &placed.cached_pos, be.view(&rows));
    }
    if !placed.host_pos.is_empty() {
        let up = be.upload(placed.host_rows.view());
        be.scatter_add_rows(be.view_mut(&mut x), &placed.host_pos, be.view(&up));
    }
    data.store.recycle(placed.host_rows);
    x
}

/// A GDP step's input rows on the backend.
enum Input<B: Backend> {
    /// Dense rows; `true` when the host decided they take the first layer's dense path.
    Dense(B::Mat, bool),
    Sparse(B::Sparse),
}

impl<B: Backend> Input<B> {
    /// Done with: dense rows on the host go back to the store for the next gather.
    fn recycle(self, be: &B, data: &TrainData) {
        if let Input::Dense(x, _) = self {
            recycle_host_rows(be, &data.store, x);
        }
    }
}

/// Dense input rows the host backend trained on, given back to `store`: the next gather
/// writes into their memory instead of a fresh allocation (a device's copy is not the
/// store's buffer, so nothing goes back).
pub(crate) fn recycle_host_rows<B: Backend>(
    be: &B,
    store: &crate::exchange::FeatureStore,
    x: B::Mat,
) {
    if B::IS_HOST {
        store.recycle(be.download_owned(x));
    }
}

/// The source rows of a full-graph layer: owned rows then halo rows, without a copy when
/// there is no halo (one rank).
pub(crate) fn with_halo<'a>(
    own: ArrayView2<'a, f32>,
    halo: &Array2<f32>,
) -> CowArray<'a, f32, Ix2> {
    if halo.nrows() == 0 {
        CowArray::from(own)
    } else {
        CowArray::from(concatenate(Axis(0), &[own, halo.view()]).expect("same width"))
    }
}

/// The first layer's input rows of full-batch training, on the model's backend.
#[derive(Debug)]
enum FullInput<B: Backend> {
    Dense(B::Mat),
    /// Mostly-zero rows (bag-of-words features, on a backend with a sparse path): the first
    /// layer multiplies the non-zeros.
    Sparse(B::Sparse),
}

/// This rank's block of the whole graph on the model's backend, for full-batch training and
/// exact evaluation: the halo plan, the block as a backend graph and its transpose (built
/// once), the first layer's input rows of full-batch training (fetched on the first step and
/// kept: input features never change), and the owned features for evaluation.
pub struct FullGraph<B: Backend> {
    pub plan: HaloPlan,
    graph: OnceLock<B::Graph>,
    transpose: B::Transpose,
    input: OnceLock<FullInput<B>>,
    features: OnceLock<B::Mat>,
    /// [`FullGraph::evaluates_from_input`]'s answer, agreed on at the first evaluation.
    evaluates_from_input: OnceLock<bool>,
}

impl<B: Backend> FullGraph<B> {
    /// Over `plan` (nothing is built or moved yet).
    pub fn new(plan: HaloPlan) -> FullGraph<B> {
        FullGraph {
            plan,
            graph: OnceLock::new(),
            transpose: Default::default(),
            input: OnceLock::new(),
            features: OnceLock::new(),
            evaluates_from_input: OnceLock::new(),
        }
    }

    /// The block on backend `be`.
    pub fn graph(&self, be: &B) -> &B::Graph {
        be.graph_of(&self.plan.block, &self.graph)
    }

    /// The first layer's input rows (own, then the halo's) on backend `be`, fetched and made
    /// on first use and kept (input features never change): sparse where every rank's rows
    /// are mostly zeros and the first layer takes sparse rows, else dense. Collective on
    /// first use.
    fn input(&self, group: &Group, be: &B, model: &Model<B>, data: &TrainData) -> &FullInput<B> {
        self.input.get_or_init(|| {
            // The features are on the host: the halo's rows come through the host exchange,
            // and the first layer's input goes to the backend once.
            let own = data.store.own_rows();
            let remote = self.plan.halo.forward(group, "halo_rows", own.view());
            let rows = with_halo(own, &remote);
            // Sparse rows are made on the host: their dense form never reaches the device.
            let sparse = model.layers[0]
                .takes_sparse_input()
                .then(|| be.sparse_from_host(rows.view()))
                .flatten();
            // Sparse only where every rank's rows are: evaluation's first layer then skips
            // the halo exchange on all ranks or on none.
            let everywhere = group
                .allgather_u64(sparse.is_some() as u64)
                .iter()
                .all(|&s| s == 1);
            match sparse.filter(|_| everywhere) {
                Some(sparse) => FullInput::Sparse(sparse),
                None => FullInput::Dense(be.upload_owned(rows.into_owned())),
            }
        })
    }

    /// Whether evaluation without a resident copy should make [`FullGraph::input`] itself
    /// (mini-batch runs never made it): where the first layer takes sparse rows and every
    /// rank's store holds its rows as CSR, the sparse input is a few MB where a dense copy of
    /// the features is hundreds (Facebook: 424 MB of 4,714-wide rows). Dense features keep
    /// the own-rows copy and the per-evaluation halo exchange, as a kept halo would hold most
    /// of the graph on every rank. Collective at the first evaluation (unless full-batch
    /// training made the input already); kept after.
    fn evaluates_from_input(
        &self,
        group: &Group,
        model: &Model<B>,
        data: &TrainData,
        resident: bool,
    ) -> bool {
        if self.input.get().is_some() {
            return true;
        }
        *self.evaluates_from_input.get_or_init(|| {
            !resident
                && model.layers[0].takes_sparse_input()
                && group
                    .allgather_u64(data.store.has_sparse_copy() as u64)
                    .iter()
                    .all(|&s| s == 1)
        })
    }

    /// This rank's own features on backend `be`, without a second copy where one is already
    /// there: the first rows of full-batch training's dense input (own rows, then the halo's),
    /// else `resident` (a device's copy of the whole graph's features, one rank), else a copy
    /// made once. On Facebook (424 MB of features) the second copy was a quarter of a
    /// full-batch GCN's device memory.
    pub fn own_features<'a>(
        &'a self,
        be: &B,
        data: &TrainData,
        resident: Option<&'a B::Mat>,
    ) -> B::View<'a> {
        let own = data.store.own_rows().nrows();
        if let Some(FullInput::Dense(x)) = self.input.get() {
            return be.rows(be.view(x), 0..own);
        }
        if let Some(r) = resident {
            return be.view(r);
        }
        let copy = self
            .features
            .get_or_init(|| be.upload(data.store.own_rows().view()));
        be.view(copy)
    }

    /// Logits of the owned vertices by exact full-graph inference (`resident`: see
    /// [`FullGraph::own_features`]). Collective.
    pub fn infer(
        &self,
        group: &Group,
        model: &Model<B>,
        data: &TrainData,
        resident: Option<&B::Mat>,
    ) -> B::Mat {
        let be = model.params.backend();
        let input = self
            .evaluates_from_input(group, model, data, resident.is_some())
            .then(|| self.input(group, be, model, data));
        if let Some(FullInput::Sparse(x)) = input {
            // The training input (own rows, then the halo's) is the first layer's input here
            // too: no dense copy of the features, no halo exchange for it.
            let ctx = inference_ctx(data);
            let g = self.graph(be);
            let (h, _) = model.layers[0].forward_sparse(&model.params, g, x, &ctx);
            return self.plan.infer_from(
                group,
                model,
                g,
                1,
                be.view(&h),
                data.gcn_degrees.as_deref(),
            );
        }
        let features = self.own_features(be, data, resident);
        self.plan.infer(
            group,
            model,
            self.graph(be),
            features,
            data.gcn_degrees.as_deref(),
        )
    }
}

/// Full-batch step over a partitioned graph: each rank computes every layer for the vertices
/// it owns, after fetching its halo's previous-layer rows; backward sends the halo gradients
/// back along the same plan. The loss covers the rank's own training vertices. Collective.
pub fn full_batch_step<B: Backend>(
    model: &mut Model<B>,
    data: &TrainData,
    group: &Group,
    full: &FullGraph<B>,
    key: BatchKey,
    scale: f32,
    times: &mut PhaseTimes,
) -> Result<StepOutput> {
    let be = model.params.backend().clone();
    let plan = &full.plan;
    let g = full.graph(&be);
    let own = data.part.local_nodes();
    let ctx = step_ctx(data, key);
    let forward = PassClock::start(times);
    let mut caches = Vec::with_capacity(model.layers.len());
    // Every rank reaches the first step together, so the collective fetch inside runs on all.
    let input = full.input(group, &be, model, data);
    let (mut h, first) = match input {
        FullInput::Dense(x) => model.layers[0].forward(&model.params, g, be.view(x), &ctx),
        FullInput::Sparse(x) => model.layers[0].forward_sparse(&model.params, g, x, &ctx),
    };
    caches.push(first);
    for layer in &model.layers[1..] {
        // The layer takes its input by value: the rows with their halo, or, where there is no
        // halo, the layer below's output itself (read by nothing else), so that neither its
        // dropout nor its cache copies them.
        let with_halo =
            times.time_shuffle(
                || match plan.with_halo(group, &be, be.view(&h), "halo_rows") {
                    CowMat::Owned(rows) => Some(rows),
                    CowMat::Borrowed(_) => None,
                },
            );
        let (out, cache) = layer.forward_owned(&model.params, g, with_halo.unwrap_or(h), &ctx);
        caches.push(cache);
        h = out;
    }
    let first = data.part.first_node;
    let rows: Vec<usize> = data
        .splits()
        .train
        .iter()
        .map(|&v| (v as u64 - first) as usize)
        .collect();
    let labels: Vec<i64> = rows.iter().map(|&r| data.labels[r]).collect();
    let picked = be.select_rows(be.view(&h), &rows);
    let (loss_sum, mut d_picked) = be.cross_entropy(be.view(&picked), &labels);
    times.forward += forward.seconds(times);

    let backward = PassClock::start(times);
    be.scale(be.view_mut(&mut d_picked), scale);
    let mut d_h = be.scatter_rows(be.view(&d_picked), &rows, be.mat_dim(&h).0);
    drop((h, picked, d_picked));
    for (l, (layer, cache)) in model.layers.iter().zip(caches).enumerate().rev() {
        let need_src = l > 0;
        let d_src =
            layer.backward_owned(&mut model.params, g, &full.transpose, cache, d_h, need_src);
        let Some(d_src) = d_src else { break };
        d_h = times.time_shuffle(|| halo_backward(group, &be, plan, d_src, own));
    }
    times.backward += backward.seconds(times);
    Ok(StepOutput {
        loss_sum,
        seeds: rows.len() as u64,
        nodes: (own * model.layers.len()) as u64,
        edges: (plan.block.num_edges() * model.layers.len()) as u64,
        input_rows: plan.block.num_src() as u64,
    })
}

/// The gradient of a full-graph layer's source rows (owned rows then halo rows) reduced to the
/// owned rows: the halo rows' gradients travel back to their owners, which add them in.
/// Without a halo (one rank) the rows are the owned rows already. Collective.
fn halo_backward<B: Backend>(
    group: &Group,
    be: &B,
    plan: &HaloPlan,
    d_src: B::Mat,
    own: usize,
) -> B::Mat {
    if group.size() == 1 {
        return d_src;
    }
    // Only the (small) halo rows are copied out; the owned rows of `d_src` become the next
    // `d_h` in place, and the halo gradients are added into them where they live.
    let rows = be.mat_dim(&d_src).0;
    let d_halo = be.to_owned(be.rows(be.view(&d_src), own..rows));
    let mut d_own = be.truncate_rows(d_src, own);
    plan.halo.backward_on(
        group,
        be,
        "halo_grads",
        be.view(&d_halo),
        be.view_mut(&mut d_own),
    );
    d_own
}

/// The upper layers of this rank's seeds, data parallel as GDP: forward from `h` (the input
/// layer's rows of `upper[0]`'s sources), loss over the seeds, backward; returns the loss sum
/// and the gradient of `h`. Shared by the strategies whose input layer is computed apart
/// (NFP's column slices; DNP and SNP through [`super::owner_input`]). `transposes[i]` is
/// `upper[i]`'s transpose where the batch came with it (a prefetch worker's, for a device);
/// a layer without one builds its own when its backward reads it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn upper_layers_data_parallel<B: Backend>(
    model: &mut Model<B>,
    upper: &[B::Graph],
    transposes: &[B::Transpose],
    h: B::Mat,
    labels: &[i64],
    ctx: &DropoutCtx,
    scale: f32,
    times: &mut PhaseTimes,
) -> (LossSum, B::Mat) {
    let be = model.params.backend().clone();
    let t = Instant::now();
    let mut h = h;
    let mut caches = Vec::with_capacity(upper.len());
    for (layer, g) in model.layers[1..].iter().zip(upper) {
        let (out, cache) = layer.forward_owned(&model.params, g, h, ctx);
        caches.push(cache);
        h = out;
    }
    let (loss_sum, mut d_h) = be.cross_entropy(be.view(&h), labels);
    drop(h);
    times.forward += t.elapsed().as_secs_f64();

    let t = Instant::now();
    be.scale(be.view_mut(&mut d_h), scale);
    for (i, ((layer, g), cache)) in model.layers[1..]
        .iter()
        .zip(upper)
        .zip(caches)
        .enumerate()
        .rev()
    {
        // A transpose caches one block's: a fresh one per layer without one built ahead.
        let fresh;
        let transpose = match transposes.get(i) {
            Some(t) => t,
            None => {
                fresh = B::Transpose::default();
                &fresh
            }
        };
        d_h = layer
            .backward_owned(&mut model.params, g, transpose, cache, d_h, true)
            .expect("asked for the input gradient");
    }
    times.backward += t.elapsed().as_secs_f64();
    (loss_sum, d_h)
}
