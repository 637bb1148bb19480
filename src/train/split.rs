//! Split parallelism (GSplit): every vertex of a mini-batch is computed, at every layer, by
//! exactly one rank, its owner; hidden rows move between ranks instead of being recomputed.
//!
//! Cooperative sampling builds the per-layer shuffle plans: each rank samples the neighbours
//! of its *local frontier* (owned vertices to compute at that hop; the seeds it owns at hop 0),
//! which gives its *mixed frontier* (the block's sources). Remote vertices of the mixed
//! frontier are sent to their owners and join their next local frontier. Forward moves the
//! previous layer's rows of remote sources along each layer's [`RowExchange`]; backward moves
//! their gradients back along the same plan and sums them at the owner (invariant 6).

use super::data::TrainData;
use super::dump::BlockDump;
use super::metrics::{PassClock, PhaseTimes};
use super::strategy::{
    place_rows, step_ctx, transposes_on, BatchSpec, InputSource, ResidentFeatures, StepArgs,
    StepOutput,
};
use crate::backend::{Backend, BlockTranspose, LossSum};
use crate::comm::Group;
use crate::exchange::store::{InputRows, PlacedRows, StoreStats};
use crate::exchange::RowExchange;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::nn::Model;
use crate::sample::{build_block, sample_neighbors, BatchKey, Block, LocalGraph};
use crate::util::positions::with_positions;
use anyhow::Result;
use serde::Serialize;
use std::time::Instant;

/// One layer of a split mini-batch on one rank.
pub struct SplitLayer {
    /// Destinations = this rank's local frontier (owned); sources = its mixed frontier.
    pub block: Block,
    /// Source positions of owned sources, and their rows in the layer's input matrix.
    own_pos: Vec<u32>,
    own_rows: Vec<u32>,
    /// Source positions of remote sources, in the plan's order.
    remote_pos: Vec<u32>,
    /// Input layer only: source positions of remote sources the feature cache holds (read
    /// here, not fetched), and their cache slots.
    cached_pos: Vec<u32>,
    cached_slots: Vec<u32>,
    /// Input layer only: source positions of remote sources whose owner shares this host's
    /// memory (read there, not fetched: `FeatureStore::share_on_host`), and their ids.
    peer_pos: Vec<u32>,
    peer_ids: Vec<NodeId>,
    /// Brings the remote sources' input rows from their owners.
    plan: RowExchange,
}

/// Edges one rank aggregates at one layer, and how many of them cross to another rank.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct SplitLayerStats {
    pub edges: u64,
    pub cross_edges: u64,
}

/// Add one step's per-layer counts `step` to the epoch's `acc` (empty before the first).
pub fn add_split_stats(acc: &mut Vec<SplitLayerStats>, step: &[SplitLayerStats]) {
    if acc.is_empty() {
        acc.resize(step.len(), SplitLayerStats::default());
    }
    for (a, s) in acc.iter_mut().zip(step) {
        a.edges += s.edges;
        a.cross_edges += s.cross_edges;
    }
}

/// The split plan of one mini-batch on one rank: layers input first.
pub struct SplitBatch {
    pub layers: Vec<SplitLayer>,
    /// This rank's seeds (its local frontier at the output layer).
    pub seeds: Vec<NodeId>,
}

impl SplitBatch {
    /// Per layer (input first), the source rows this rank receives from other ranks: what
    /// the layer's forward shuffle brings in (and, above the input layer, what its
    /// backward sends back).
    pub fn remote_rows(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.remote_pos.len()).collect()
    }

    /// Per-layer edge counts (input layer first).
    pub fn stats(&self) -> Vec<SplitLayerStats> {
        self.layers
            .iter()
            .map(|l| {
                let mut is_remote = vec![false; l.block.num_src()];
                for &p in l.remote_pos.iter().chain(&l.cached_pos).chain(&l.peer_pos) {
                    is_remote[p as usize] = true;
                }
                SplitLayerStats {
                    edges: l.block.num_edges() as u64,
                    cross_edges: l
                        .block
                        .indices
                        .iter()
                        .filter(|&&s| is_remote[s as usize])
                        .count() as u64,
                }
            })
            .collect()
    }
}

/// Cooperative sampling of one global mini-batch. Collective: two exchanges per hop (the
/// owners' next frontier, then the hop's row plan), the last hop's plan only.
///
/// Each hop's plan is built as soon as the owners' next frontier is final, so one position
/// table per thread serves every hop ([`with_positions`]).
pub fn sample_split(
    group: &Group,
    data: &TrainData,
    batch: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
) -> SplitBatch {
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    let ranks = group.size();
    let first = data.part.first_node;
    let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
    let mut frontier = seeds.clone();
    // Layers seeds outward; reversed (input first) at the end.
    let mut layers = Vec::with_capacity(fanouts.len());
    with_positions(first, data.part.local_nodes(), |positions| {
        for (hop, &fanout) in fanouts.iter().enumerate() {
            let sampled = sample_neighbors(&graph, &frontier, fanout, key.layer(hop as u32));
            let block = build_block(&frontier, &sampled);
            let mut remote_pos = Vec::new();
            let mut counts = vec![0usize; ranks];
            let mut next: Vec<NodeId> = Vec::with_capacity(block.num_src());
            for (p, &v) in block.src_nodes.iter().enumerate() {
                if data.owns(v) {
                    next.push(v);
                } else {
                    remote_pos.push(p as u32);
                    counts[owner_of(&data.offsets, v as u64)] += 1;
                }
            }
            let input_is_features = hop + 1 == fanouts.len();
            // The owners' next frontier: own sources, then the remote sources other ranks
            // send (each once). None after the last hop, whose sources are feature rows.
            if !input_is_features {
                // Remote sources grouped by owner (stable).
                let mut by_owner: Vec<(usize, NodeId)> = remote_pos
                    .iter()
                    .map(|&p| {
                        let v = block.src_nodes[p as usize];
                        (owner_of(&data.offsets, v as u64), v)
                    })
                    .collect();
                by_owner.sort_by_key(|&(o, _)| o);
                let send: Vec<NodeId> = by_owner.iter().map(|&(_, v)| v).collect();
                positions.place(&next);
                let (received, _) = group.alltoallv("split_frontier_ids", &send, &counts);
                for v in received {
                    positions.get_or_push(v, &mut next);
                }
            }
            // This hop's sources are rows of the next local frontier on their owners (the
            // input layer's: feature rows, indexed by local id).
            let row_of = |v: NodeId| -> u32 {
                if input_is_features {
                    (v as u64 - first) as u32
                } else {
                    positions
                        .get(v)
                        .expect("an asked-for source is in its owner's next frontier")
                }
            };
            layers.push(split_layer(
                group,
                data,
                (block, remote_pos),
                input_is_features,
                row_of,
            ));
            if !input_is_features {
                positions.clear(&next);
            }
            frontier = next;
        }
    });
    layers.reverse();
    SplitBatch { layers, seeds }
}

/// One hop's layer from its block and remote source positions: own sources' rows
/// (`row_of`, this rank's row of a vertex it owns), remote ones the feature cache holds or a
/// rank of this host shares (the input layer's, `input_is_features`), and the plan that
/// brings the rest. Collective.
fn split_layer(
    group: &Group,
    data: &TrainData,
    (block, remote_pos): (Block, Vec<u32>),
    input_is_features: bool,
    row_of: impl Fn(NodeId) -> u32,
) -> SplitLayer {
    let mut own_pos = Vec::with_capacity(block.num_src() - remote_pos.len());
    let mut own_rows = Vec::with_capacity(own_pos.capacity());
    let mut r = 0;
    for (p, &v) in block.src_nodes.iter().enumerate() {
        if r < remote_pos.len() && remote_pos[r] as usize == p {
            r += 1;
            continue;
        }
        own_pos.push(p as u32);
        own_rows.push(row_of(v));
    }
    // Remote feature rows a rank of this host shares or the cache holds are read here; the
    // rest are fetched.
    let (mut cached_pos, mut cached_slots) = (Vec::new(), Vec::new());
    let (mut peer_pos, mut peer_ids) = (Vec::new(), Vec::new());
    let remote_pos: Vec<u32> = if input_is_features {
        remote_pos
            .into_iter()
            .filter(|&p| {
                let v = block.src_nodes[p as usize];
                if data.store.reads_directly(v) {
                    peer_pos.push(p);
                    peer_ids.push(v);
                } else if let Some(slot) = data.store.cache_slot(v) {
                    cached_pos.push(p);
                    cached_slots.push(slot);
                } else {
                    return true;
                }
                false
            })
            .collect()
    } else {
        remote_pos
    };
    let remote_ids: Vec<NodeId> = remote_pos
        .iter()
        .map(|&p| block.src_nodes[p as usize])
        .collect();
    let plan = RowExchange::with_rows(group, &data.offsets, &remote_ids, row_of);
    SplitLayer {
        block,
        own_pos,
        own_rows,
        remote_pos,
        cached_pos,
        cached_slots,
        peer_pos,
        peer_ids,
        plan,
    }
}

/// Assemble a layer's source rows on backend `be`: owned ones from `input` (this rank's rows
/// of the previous layer), remote ones through the plan. `kind` names the exchange in the
/// byte counts (input features and hidden rows apart).
fn layer_input<B: Backend>(
    group: &Group,
    be: &B,
    layer: &SplitLayer,
    num_src: usize,
    input: B::View<'_>,
    kind: &'static str,
) -> B::Mat {
    // Owned rows go straight from `input` to their positions and fetched rows straight from
    // the receive buffer to theirs: one pass each (gathers into matrices, a serial scatter
    // and a scatter-add of them were a third of a 2-rank SBM step at hidden 1024).
    let mut h = be.zeros(num_src, be.dim(input).1);
    be.copy_rows(be.view_mut(&mut h), &layer.own_pos, input, &layer.own_rows);
    let fetched = be.view_mut(&mut h);
    layer
        .plan
        .forward_into_on(group, be, kind, input, fetched, &layer.remote_pos);
    h
}

/// The reverse of [`layer_input`]: from the gradient of a layer's source rows, the gradient of
/// this rank's rows of the previous layer (`prev_rows` of them): owned sources' rows are added
/// here, remote sources' rows go back to their owners along the plan and are added there.
fn layer_input_backward<B: Backend>(
    group: &Group,
    be: &B,
    layer: &SplitLayer,
    d_src: B::View<'_>,
    prev_rows: usize,
) -> B::Mat {
    let mut d_prev = be.zeros(prev_rows, be.dim(d_src).1);
    be.copy_rows(
        be.view_mut(&mut d_prev),
        &layer.own_rows,
        d_src,
        &layer.own_pos,
    );
    let remote = be.gather_rows(d_src, &layer.remote_pos);
    layer.plan.backward_on(
        group,
        be,
        "split_grads",
        be.view(&remote),
        be.view_mut(&mut d_prev),
    );
    d_prev
}

/// The host side of a split mini-batch ([`split_host_batch`]): the sampled plan, the input
/// layer's rows as the host makes them, and what the step reports of them.
pub struct SplitHostBatch {
    sb: SplitBatch,
    /// The blocks as sampled, before self-loops, where the step dumps them.
    sampled: Option<Vec<Block>>,
    input: SplitInput,
    stats: Vec<SplitLayerStats>,
    /// Per layer, its block's transpose when [`InputSource::transposes`] says the backward
    /// reads it.
    transposes: Vec<Option<BlockTranspose>>,
    /// The sparse input rows' transpose, where [`InputSource::transposes`] builds it ahead
    /// ([`crate::nn::transposes::TransposePlan::build`]).
    input_transpose: Option<BlockTranspose>,
    /// The feature store's counters for the input rows, for the thread that owns the store.
    pub store: StoreStats,
    sample_seconds: f64,
    gather_seconds: f64,
}

/// The input layer's rows of a split batch as the host made them.
enum SplitInput {
    /// Every source row, in the block's order: as CSR under GDP's rule for its batches, else
    /// dense.
    All(InputRows),
    /// Where each row is on a device that keeps this rank's own rows (and maybe its cache),
    /// with the rows it lacks.
    Placed(PlacedRows),
}

/// The host side of split's mini-batch `batch`: cooperative sampling (self-loops added) and
/// the input layer's rows — all of them gathered, or only those a device that keeps this
/// rank's own rows lacks, as `source` says (GDP's rule for its batches). Collective over `group`,
/// which may be a prefetch worker's communicator: it only reads `data` and is a pure function
/// of its arguments, so a worker prepares what the step would (`keep_sampled`: also keep the
/// blocks as sampled, for `--dump-blocks`).
pub fn split_host_batch(
    data: &TrainData,
    group: &Group,
    spec: BatchSpec,
    source: InputSource,
    keep_sampled: bool,
) -> SplitHostBatch {
    let t = Instant::now();
    let mut sb = sample_split(group, data, spec.batch, spec.fanouts, spec.key);
    let sampled = keep_sampled.then(|| sb.layers.iter().map(|l| l.block.clone()).collect());
    if spec.self_loops {
        for l in &mut sb.layers {
            l.block = l.block.with_self_loops();
        }
    }
    let stats = sb.stats();
    let sample_seconds = t.elapsed().as_secs_f64();

    // Input features are read only by their owners (on the host, where the feature store
    // keeps them), then shuffled: own and cached rows copied and fetched rows (packed when
    // mostly zeros) decoded straight into place, in a recycled buffer. The input layer's
    // positions are read here only (its backward returns no gradient).
    let t = Instant::now();
    let first = &mut sb.layers[0];
    let n = first.block.num_src();
    let (input, store) = match source.resident.then_some(source.cache_resident) {
        // Own (and cached) rows are on the device already: only the rest come up.
        Some(on_device) => {
            let (missing, store) = data.store.gather_planned_missing(
                group,
                "split_features",
                &first.plan,
                (
                    first.own_rows.len(),
                    &first.cached_slots,
                    &first.peer_ids,
                    first.remote_pos.len(),
                ),
                on_device,
            );
            let take = std::mem::take::<Vec<u32>>;
            // The host's rows in the order they were made: cached (unless on the device),
            // shared by a rank of this host, fetched.
            let (cached_slots, cached_pos, host_pos) = if on_device {
                let host_pos = first.peer_pos.iter().chain(&first.remote_pos).copied();
                let host_pos = host_pos.collect();
                (
                    take(&mut first.cached_slots),
                    take(&mut first.cached_pos),
                    host_pos,
                )
            } else {
                let pos = first.cached_pos.iter().chain(&first.peer_pos);
                let pos = pos.chain(&first.remote_pos).copied();
                (Vec::new(), Vec::new(), pos.collect())
            };
            let placed = PlacedRows {
                len: n,
                own_pos: take(&mut first.own_pos),
                own_rows: take(&mut first.own_rows),
                cached_pos,
                cached_slots,
                host_pos,
                host_rows: missing,
            };
            (SplitInput::Placed(placed), store)
        }
        None => {
            let (x, store) = data.store.gather_planned(
                group,
                "split_features",
                &first.plan,
                [
                    (&first.own_rows, &first.own_pos),
                    (&first.cached_slots, &first.cached_pos),
                    (&first.peer_ids, &first.peer_pos),
                ],
                &first.remote_pos,
                n,
                source.sparse_first_layer,
            );
            (SplitInput::All(x), store)
        }
    };
    let gather_seconds = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let sparse_input = match &input {
        SplitInput::All(InputRows::Sparse(x)) => Some(x),
        _ => None,
    };
    let blocks = sb.layers.iter().map(|l| &l.block);
    let (transposes, input_transpose) = source.transposes.build(blocks, sparse_input);
    SplitHostBatch {
        sb,
        sampled,
        input,
        stats,
        transposes,
        input_transpose,
        store,
        sample_seconds: sample_seconds + t.elapsed().as_secs_f64(),
        gather_seconds,
    }
}

/// One split-parallel step on the model's backend: cooperative sampling, then forward and
/// backward layer by layer with the row shuffles in between (hidden rows stay on the backend;
/// only those that cross ranks are staged, [`RowExchange::forward_on`]). Gradients accumulate
/// in `model`. Collective.
pub fn split_step<B: Backend>(
    model: &mut Model<B>,
    data: &mut TrainData,
    resident: Option<&ResidentFeatures<B>>,
    args: &StepArgs,
    times: &mut PhaseTimes,
    dump: Option<(&mut BlockDump, u64)>,
) -> Result<(StepOutput, Vec<SplitLayerStats>)> {
    let host = split_host_batch(
        data,
        args.group,
        args.spec(),
        InputSource::of(model, resident),
        dump.is_some(),
    );
    data.store.add_stats(&host.store);
    split_train_step(model, data, resident, host, args, times, dump)
}

/// The model's side of a split step on a prepared [`SplitHostBatch`]: the input rows onto the
/// backend (or placed there beside `resident`), then forward and backward layer by layer with
/// the hidden rows' shuffles over `args.group`. Collective.
pub fn split_train_step<B: Backend>(
    model: &mut Model<B>,
    data: &TrainData,
    resident: Option<&ResidentFeatures<B>>,
    host: SplitHostBatch,
    args: &StepArgs,
    times: &mut PhaseTimes,
    dump: Option<(&mut BlockDump, u64)>,
) -> Result<(StepOutput, Vec<SplitLayerStats>)> {
    let StepArgs {
        group, key, scale, ..
    } = *args;
    let SplitHostBatch {
        mut sb,
        sampled,
        input,
        stats,
        transposes,
        input_transpose,
        sample_seconds,
        gather_seconds,
        ..
    } = host;
    if let Some((dump, step)) = dump {
        let blocks = sampled.expect("a dumped batch keeps its blocks as sampled");
        dump.write(step, &blocks, data)?;
    }
    times.sample += sample_seconds;
    times.gather += gather_seconds;
    let out = StepOutput {
        loss_sum: LossSum::default(),
        seeds: sb.seeds.len() as u64,
        nodes: sb.layers.iter().map(|l| l.block.num_dst as u64).sum(),
        edges: sb.layers.iter().map(|l| l.block.num_edges() as u64).sum(),
        input_rows: match &input {
            SplitInput::All(_) => sb.layers[0].own_pos.len(),
            SplitInput::Placed(p) => p.own_pos.len(),
        } as u64,
    };

    let be = model.params.backend().clone();
    let ctx = step_ctx(data, key);
    let t = Instant::now();
    // Each layer's block moves to the backend (the CPU keeps the block itself).
    let graphs: Vec<B::Graph> = sb
        .layers
        .iter_mut()
        .map(|l| be.graph(std::mem::take(&mut l.block)))
        .collect();
    let transposes = transposes_on(&be, transposes);
    let num_src = |l: usize| be.block(&graphs[l]).num_src();
    // The input layer's source rows go to the backend once: dense, or as CSR (then the
    // dense slot stays empty until the next layer's rows).
    let (mut h_src, mut sparse_src) = match (input, resident) {
        (SplitInput::Placed(placed), Some(features)) => {
            (place_rows(&be, features, placed, data), None)
        }
        (SplitInput::All(InputRows::Dense(x)), _) => (be.upload_owned(x), None),
        (SplitInput::All(InputRows::Sparse(x)), _) => {
            (be.zeros(0, 0), Some(be.sparse_from_csr(x, input_transpose)))
        }
        (SplitInput::Placed(_), None) => {
            panic!("split rows placed for a device that keeps no features")
        }
    };
    times.gather += t.elapsed().as_secs_f64();
    // Rows of each layer's input matrix (the owner-side rows the plans index).
    let mut input_rows: Vec<usize> = vec![data.store.own_rows().nrows()];
    let mut caches = Vec::with_capacity(sb.layers.len());
    let forward = PassClock::start(times);
    let last = model.layers.len() - 1;
    let mut h = None;
    for (l, (layer, g)) in model.layers.iter().zip(&graphs).enumerate() {
        let (out, cache) = if l == 0 {
            // Bag-of-words features stay sparse, as on GDP's path.
            match sparse_src.take() {
                Some(x) => layer.forward_sparse(&model.params, g, &x, &ctx),
                None => {
                    let forward = layer.forward_input(&model.params, g, be.view(&h_src), &ctx);
                    // The input rows go back to the store for the next gather (the layer kept
                    // what its backward needs).
                    if B::IS_HOST {
                        let x = std::mem::replace(&mut h_src, be.zeros(0, 0));
                        data.store.recycle(be.download_owned(x));
                    }
                    forward
                }
            }
        } else {
            layer.forward_owned(&model.params, g, h_src, &ctx)
        };
        caches.push(cache);
        if l == last {
            h = Some(out);
            break;
        }
        input_rows.push(be.mat_dim(&out).0);
        h_src = times.time_shuffle(|| {
            layer_input(
                group,
                &be,
                &sb.layers[l + 1],
                num_src(l + 1),
                be.view(&out),
                "split_rows",
            )
        });
    }
    let h = h.expect("at least one layer");
    let labels: Vec<i64> = sb.seeds.iter().map(|&s| data.label(s)).collect();
    let (loss_sum, mut d_h) = be.cross_entropy(be.view(&h), &labels);
    drop(h);
    times.forward += forward.seconds(times);

    let backward = PassClock::start(times);
    be.scale(be.view_mut(&mut d_h), scale);
    for (l, ((layer, g), cache)) in model
        .layers
        .iter()
        .zip(&graphs)
        .zip(caches)
        .enumerate()
        .rev()
    {
        let need_src = l > 0;
        let d_src =
            layer.backward_owned(&mut model.params, g, &transposes[l], cache, d_h, need_src);
        let Some(d_src) = d_src else { break };
        d_h = times.time_shuffle(|| {
            layer_input_backward(group, &be, &sb.layers[l], be.view(&d_src), input_rows[l])
        });
    }
    times.backward += backward.seconds(times);
    Ok((StepOutput { loss_sum, ..out }, stats))
}
